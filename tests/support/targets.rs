//! The devices the conformance suite (`tests/conformance.rs`) runs every strategy on, and
//! what a caller of each can do with the driver's own calls (`tests/foreign_streams.rs`).
//!
//! A [`Target`] opens a [`Rig`]: one or more devices of one kind — the host device (real or
//! simulated memory), the CUDA shim over the conformance driver `fakecuda` (or
//! `fakecuda_old`, a CUDA 10.1 driver without virtual memory or pools), the HIP shim over
//! `fakehip` as ROCm 5, 6 or 7 — with the census of everything they hold. The conformance
//! drivers' control functions are reached only through [`Fake`], so a change of their API is
//! made in one place.
//!
//! Each rig over a conformance driver loads a private copy of its library (a separate file,
//! so a separate instance with its own state) and configures it from scratch: tests on one
//! driver run in parallel without sharing allocations, faults or held events, which a lock
//! around one shared instance would only serialise.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use portalloc::backends::host::HostDevice;
use portalloc::device::{Device, Event, Stream};
use portalloc::Allocator;

/// Which ROCm the HIP conformance driver plays: its `hipRuntimeGetVersion`, and with it the
/// capability gates (VMM from ROCm 7; `hipGetDevicePropertiesR0600` from ROCm 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rocm {
    V5,
    V6,
    V7,
}

impl Rocm {
    /// The runtime version code `fakehip` answers.
    pub const fn version(self) -> i32 {
        match self {
            Rocm::V5 => 50_221_153,
            Rocm::V6 => 60_241_133,
            Rocm::V7 => 70_051_831,
        }
    }
}

/// Where a conformance device comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The host device with real memory behind it.
    HostReal,
    /// The host device keeping books only (no memory behind its addresses).
    HostSimulated,
    /// `CudaDevice` over `fakecuda` (CUDA 12.2: virtual memory, pools).
    FakeCuda,
    /// `CudaDevice` over `fakecuda_old` (CUDA 10.1: neither).
    FakeCudaOld,
    /// `HipDevice` over `fakehip` as the given ROCm.
    FakeHip(Rocm),
}

/// The targets on which two devices offer each other peer access; on the others the suite
/// asserts that none is offered, with a typed error. The conformance drivers join this list
/// once they export `cuDeviceCanAccessPeer` / `hipDeviceCanAccessPeer` and the enable calls
/// (then `FakeCuda`, `FakeCudaOld`, `FakeHip(Rocm::V5)`, `FakeHip(Rocm::V6)`,
/// `FakeHip(Rocm::V7)`): the `peer_access` cases fail, naming the target, until they do.
pub const PEER_TARGETS: &[Target] = &[Target::HostReal, Target::HostSimulated];

impl Target {
    /// The backend name errors carry (`Error::Unsupported::backend`).
    pub fn backend(self) -> &'static str {
        match self {
            Target::HostReal | Target::HostSimulated => "host",
            Target::FakeCuda | Target::FakeCudaOld => "cuda",
            Target::FakeHip(_) => "hip",
        }
    }

    /// True when device memory is host memory this process may read and write: the real
    /// host device, and `fakecuda`, whose allocations and mappings are host pages.
    /// (`fakehip` hands out addresses with nothing behind them, like the simulated host.)
    pub fn host_addressable(self) -> bool {
        matches!(
            self,
            Target::HostReal | Target::FakeCuda | Target::FakeCudaOld
        )
    }

    /// True when the target's devices offer virtual memory (reserve / map).
    pub fn has_virtual_memory(self) -> bool {
        matches!(
            self,
            Target::HostReal | Target::HostSimulated | Target::FakeCuda | Target::FakeHip(Rocm::V7)
        )
    }

    /// True when the target's devices offer a stream-ordered pool.
    pub fn has_pool(self) -> bool {
        self != Target::FakeCudaOld
    }

    /// True when two devices of the target offer each other peer access ([`PEER_TARGETS`]).
    pub fn has_peers(self) -> bool {
        PEER_TARGETS.contains(&self)
    }

    /// `devices` devices of `capacity` bytes each. `None` (after [`super::skip`]) when a
    /// conformance driver could not be built.
    ///
    /// # Panics
    /// When a device does not open.
    pub fn open(self, devices: u32, capacity: u64) -> Option<Rig> {
        let (opened, fake): (Vec<Opened>, Option<Fake>) = match self {
            Target::HostReal | Target::HostSimulated => {
                let opened = (0..devices)
                    .map(|ordinal| {
                        let device = HostDevice::builder()
                            .capacity(capacity)
                            .simulated(self == Target::HostSimulated)
                            .ordinal(ordinal)
                            .build()
                            .expect("host device");
                        Opened::Host(Arc::new(device))
                    })
                    .collect();
                (opened, None)
            }
            #[cfg(feature = "cuda")]
            Target::FakeCuda | Target::FakeCudaOld => {
                use portalloc::backends::cuda::{CudaDevice, Driver};
                let name = if self == Target::FakeCuda {
                    "fakecuda"
                } else {
                    "fakecuda_old"
                };
                let fake = Fake::copy(name)?;
                fake.set_devices(devices as i32, capacity);
                let driver = Arc::new(Driver::load(&[fake.path()]).expect("the driver loads"));
                let opened: Vec<Opened> = (0..devices)
                    .rev()
                    .map(|ordinal| {
                        let device = CudaDevice::open(Arc::clone(&driver), ordinal)
                            .expect("open the fake device");
                        // Any call makes the device's primary context current on this thread,
                        // as the runtime API does for PyTorch: a caller's own driver calls
                        // (foreign streams) then find device 0's context, opened last.
                        device.mem_info().expect("mem_info");
                        Opened::Cuda(Arc::new(device))
                    })
                    .collect();
                (opened.into_iter().rev().collect(), Some(fake))
            }
            #[cfg(feature = "hip")]
            Target::FakeHip(rocm) => {
                use portalloc::backends::hip::{HipDevice, Runtime};
                let fake = Fake::copy("fakehip")?;
                let set_version: unsafe extern "C" fn(std::ffi::c_int) =
                    fake.sym("fakehip_set_version");
                // SAFETY: a control function of fakehip, by value, before any device opens.
                unsafe { set_version(rocm.version()) };
                fake.set_devices(devices as i32, capacity);
                let runtime = Arc::new(Runtime::load(&[fake.path()]).expect("the runtime loads"));
                let opened = (0..devices)
                    .map(|ordinal| {
                        let device = HipDevice::open(Arc::clone(&runtime), ordinal)
                            .expect("open the fake device");
                        Opened::Hip(Arc::new(device))
                    })
                    .collect();
                (opened, Some(fake))
            }
            #[allow(unreachable_patterns)]
            other => {
                super::skip(&format!(
                    "{other:?}: this build lacks its backend's feature"
                ));
                return None;
            }
        };
        let rig = Rig {
            target: self,
            devices: opened,
            fake,
            next_stream: AtomicU64::new(0),
        };
        rig.check_capabilities();
        Some(rig)
    }
}

/// One opened device, typed, for its census.
enum Opened {
    Host(Arc<HostDevice>),
    #[cfg(feature = "cuda")]
    Cuda(Arc<portalloc::backends::cuda::CudaDevice>),
    #[cfg(feature = "hip")]
    Hip(Arc<portalloc::backends::hip::HipDevice>),
}

impl Opened {
    fn device(&self) -> Arc<dyn Device> {
        match self {
            Opened::Host(d) => Arc::clone(d) as Arc<dyn Device>,
            #[cfg(feature = "cuda")]
            Opened::Cuda(d) => Arc::clone(d) as Arc<dyn Device>,
            #[cfg(feature = "hip")]
            Opened::Hip(d) => Arc::clone(d) as Arc<dyn Device>,
        }
    }

    /// The device's own census, and whether it is empty.
    fn census(&self) -> (bool, String) {
        match self {
            Opened::Host(d) => (d.census().is_empty(), format!("{:?}", d.census())),
            #[cfg(feature = "cuda")]
            Opened::Cuda(d) => (d.census().is_empty(), format!("{:?}", d.census())),
            #[cfg(feature = "hip")]
            Opened::Hip(d) => (d.census().is_empty(), format!("{:?}", d.census())),
        }
    }

    fn strong_count(&self) -> usize {
        match self {
            Opened::Host(d) => Arc::strong_count(d),
            #[cfg(feature = "cuda")]
            Opened::Cuda(d) => Arc::strong_count(d),
            #[cfg(feature = "hip")]
            Opened::Hip(d) => Arc::strong_count(d),
        }
    }
}

/// The devices of one target, and the conformance driver beneath them (when there is one).
pub struct Rig {
    pub target: Target,
    /// Dropped before `fake`: the devices give back what they hold through its library.
    devices: Vec<Opened>,
    fake: Option<Fake>,
    /// For the host's foreign stream handles.
    next_stream: AtomicU64,
}

impl Rig {
    /// Device `ordinal` of the rig.
    pub fn device(&self, ordinal: usize) -> Arc<dyn Device> {
        self.devices[ordinal].device()
    }

    /// The conformance driver, where the target has one.
    pub fn fake(&self) -> Option<&Fake> {
        self.fake.as_ref()
    }

    /// The devices claim exactly the capabilities the target is known to have.
    fn check_capabilities(&self) {
        for opened in &self.devices {
            let device = opened.device();
            let caps = device.info().capabilities;
            let vmm = self.target.has_virtual_memory();
            let pool = self.target.has_pool();
            assert_eq!(
                (caps.virtual_memory, device.virtual_memory().is_some()),
                (vmm, vmm),
                "{:?}: virtual memory",
                self.target
            );
            assert_eq!(
                (
                    caps.stream_ordered_pool,
                    device.stream_ordered_pool().is_some()
                ),
                (pool, pool),
                "{:?}: stream-ordered pool",
                self.target
            );
        }
    }

    /// Everything the devices and the driver hold now, to compare before and after an
    /// operation that must not reach the device.
    pub fn snapshot(&self) -> String {
        let censuses = self.devices.iter().map(|d| d.census().1);
        #[cfg(any(feature = "cuda", feature = "hip"))]
        let censuses = censuses.chain(self.fake.iter().map(|fake| {
            let counts: Vec<i64> = LIVE.iter().map(|&what| fake.live(what)).collect();
            format!("driver: {counts:?}")
        }));
        censuses.collect::<Vec<String>>().join("; ")
    }

    /// Bytes of device memory held now, all devices together: the driver's own count, or
    /// the host's books.
    pub fn device_bytes(&self) -> u64 {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return fake.live("bytes") as u64;
        }
        (0..self.devices.len())
            .map(|d| self.host(d).census().bytes_in_use)
            .sum()
    }

    /// The peers granted access at `va` of device 0, where the target can tell: the host
    /// records them per mapping; a conformance driver answers where it exports `fake_access`.
    pub fn peer_access_at(&self, va: u64) -> Option<Vec<u32>> {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            let mut peers = Vec::new();
            for peer in 1..self.devices.len() as u32 {
                if fake.access(va, peer as i32)? {
                    peers.push(peer);
                }
            }
            return Some(peers);
        }
        Some(self.host(0).peer_access_at(va))
    }

    /// Drops the devices after checking that nothing else holds them and that their books
    /// are empty; then the driver's own counts must all be zero.
    ///
    /// # Panics
    /// When anything is still held.
    pub fn finish(self) {
        let Rig {
            target,
            devices,
            fake,
            ..
        } = self;
        for (ordinal, opened) in devices.iter().enumerate() {
            assert_eq!(
                opened.strong_count(),
                1,
                "{target:?}: device {ordinal} is still shared"
            );
            let (empty, census) = opened.census();
            assert!(empty, "{target:?}: device {ordinal} still holds {census}");
        }
        drop(devices);
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = fake {
            fake.assert_empty();
        }
        #[cfg(not(any(feature = "cuda", feature = "hip")))]
        drop(fake);
    }

    // ---- a caller's own driver calls (foreign streams) ------------------------------------

    /// A stream made with the driver's own call, not through portalloc (on the host, which
    /// has no driver, a handle the device never made).
    pub fn foreign_stream(&self) -> Stream {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return caller::create_stream(fake);
        }
        Stream::from_raw(
            0x7f3a_0000_0000 + 0x100 * self.next_stream.fetch_add(1, Ordering::Relaxed),
        )
    }

    /// Holds (or, with false, completes) the work recorded on streams.
    pub fn hold(&self, on: bool) {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return fake.hold_events(on);
        }
        self.host(0).set_events_held(on)
    }

    /// Records an event of the caller's own on `stream`: the caller's kernel.
    pub fn record_work(&self, stream: Stream) -> u64 {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return caller::record_event(fake, stream);
        }
        let host = self.host(0);
        let e = host.create_event().unwrap();
        host.record_event(e, stream).unwrap();
        e.0
    }

    /// The driver's own answer: has the work recorded as `work` completed?
    pub fn work_done(&self, work: u64) -> bool {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return caller::event_done(fake, work);
        }
        self.host(0).event_complete(Event(work)).unwrap()
    }

    /// Gives back the caller's own streams and events.
    pub fn destroy_foreign(&self, streams: &[Stream], works: &[u64]) {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return caller::destroy(fake, streams, works);
        }
        // The host's foreign streams are bare handles: nothing to give back.
        let _ = streams;
        for &w in works {
            self.host(0).destroy_event(Event(w)).unwrap();
        }
    }

    fn host(&self, ordinal: usize) -> &HostDevice {
        match &self.devices[ordinal] {
            Opened::Host(h) => h,
            #[allow(unreachable_patterns)]
            _ => unreachable!("a host-only call on a vendor target"),
        }
    }
}

/// The strategies of the suite: replay's list (`bfc` preallocated, `bfc-grow`, `vmm`,
/// `async`, `platform`), so a strategy added there is one the suite can name.
pub use portalloc::replay::ReplayStrategy as Strategy;

/// What the suite asks of a strategy beyond its name.
pub trait SuiteStrategy: Copy {
    /// Whether `target` can serve the strategy; where it cannot, building it must fail with
    /// `Error::Unsupported`.
    fn served_by(self, target: Target) -> bool;

    /// The strategy over `device` with 3/4 of its memory, through `strategy::build` as users
    /// build it; the async pool is preallocated (replay grows it), so that path is covered.
    ///
    /// # Errors
    /// What `strategy::build` answers (`Error::Unsupported` for a capability the device
    /// lacks).
    fn build(self, device: Arc<dyn Device>) -> portalloc::Result<Box<dyn Allocator>>;
}

impl SuiteStrategy for Strategy {
    fn served_by(self, target: Target) -> bool {
        match self {
            Strategy::Vmm => target.has_virtual_memory(),
            Strategy::Async => target.has_pool(),
            Strategy::Bfc | Strategy::BfcGrow | Strategy::Platform => true,
        }
    }

    fn build(self, device: Arc<dyn Device>) -> portalloc::Result<Box<dyn Allocator>> {
        let mut config = self.config(0.75);
        config.preallocate.value |= self == Strategy::Async;
        portalloc::strategy::build(&config, device)
    }
}

// ---- the conformance drivers ----------------------------------------------------------------

/// The live counts of the conformance drivers' common vocabulary: all zero once portalloc
/// (and the caller) gave everything back.
pub const LIVE: &[&str] = &[
    "allocations",
    "pool_allocations",
    "pool_reserved",
    "pools",
    "handles",
    "mappings",
    "reservations",
    "streams",
    "events",
    "bytes",
];

#[cfg(any(feature = "cuda", feature = "hip"))]
pub use adapter::Fake;

/// A private copy of the built library at `built`, in the temporary directory under a name
/// of this process: loaded, it is an instance of its own (a conformance driver keeps its
/// state per loaded library). The caller removes it.
///
/// # Panics
/// When the copy cannot be made.
pub fn private_copy(built: &str) -> std::path::PathBuf {
    static COPIES: AtomicU64 = AtomicU64::new(0);
    let file = std::path::Path::new(built)
        .file_name()
        .expect("a file name");
    let file = file.to_string_lossy();
    let name = file.trim_start_matches("lib").trim_end_matches(".so");
    let copy = std::env::temp_dir().join(format!(
        "portalloc-{name}-{}-{}-{file}",
        std::process::id(),
        COPIES.fetch_add(1, Ordering::Relaxed),
    ));
    std::fs::copy(built, &copy).expect("copy the conformance driver");
    copy
}

/// Without a vendor feature no conformance driver is loaded.
#[cfg(not(any(feature = "cuda", feature = "hip")))]
pub enum Fake {}

/// The one adapter to the conformance drivers' control functions, with the names and
/// signatures of the common control API (`fake_fail`, `fake_live`, …, Rust side
/// `support::fakes::Fake`) that is replacing the drivers' own ones (`fakecuda_fail_call`,
/// `fakehip_count`, …). When that API is in, this module becomes
/// `pub use super::fakes::Fake;` and nothing else here changes.
#[cfg(any(feature = "cuda", feature = "hip"))]
mod adapter {
    use std::ffi::{c_char, c_int, c_long, CString};
    use std::path::PathBuf;

    use portalloc::Vendor;

    /// A private copy of a conformance driver, loaded; removed from disk on drop.
    pub struct Fake {
        library: libloading::Library,
        path: PathBuf,
        vendor: Vendor,
    }

    impl Fake {
        /// A private copy of the driver `name` (`fakecuda`, `fakecuda_old`, `fakehip`),
        /// built on first use; `None` after [`super::super::skip`] when no C compiler works.
        ///
        /// # Panics
        /// When the copy cannot be made or loaded.
        pub fn copy(name: &str) -> Option<Fake> {
            let Some(built) = super::super::driver(name) else {
                super::super::skip(&format!(
                    "the {name} conformance driver was not built (no C compiler)"
                ));
                return None;
            };
            let path = super::private_copy(built);
            // SAFETY: our own test library; its initialisers do nothing.
            let library = unsafe { libloading::Library::new(&path) }.expect("load the fake");
            let vendor = if name.starts_with("fakehip") {
                Vendor::Hip
            } else {
                Vendor::Cuda
            };
            Some(Fake {
                library,
                path,
                vendor,
            })
        }

        /// Which vendor's library this fakes.
        pub fn vendor(&self) -> Vendor {
            self.vendor
        }

        /// The library's path, for `Driver::load` / `Runtime::load`.
        pub fn path(&self) -> String {
            self.path.to_string_lossy().into_owned()
        }

        /// The exported function `name`, as the type the caller names.
        ///
        /// # Panics
        /// When the library does not export it.
        pub fn sym<T: Copy>(&self, name: &str) -> T {
            // SAFETY: each caller names a function with the signature the fake gives it.
            *unsafe { self.library.get::<T>(name.as_bytes()) }.expect(name)
        }

        fn hip(&self) -> bool {
            self.vendor == Vendor::Hip
        }

        /// Calls `nth` .. `nth + count - 1` of `function` (1-based, from now) return `code`.
        ///
        /// # Panics
        /// For fakecuda, whose own call fails one call or every call: when `count` is
        /// neither 1 nor negative from the first call.
        pub fn fail(&self, function: &str, nth: i64, count: i64, code: i32) {
            let name = CString::new(function).expect("no NUL in a function name");
            if self.hip() {
                let f: unsafe extern "C" fn(*const c_char, c_long, c_long, c_int) =
                    self.sym("fakehip_fail");
                // SAFETY: a NUL-terminated name the fake copies; the rest by value.
                return unsafe { f(name.as_ptr(), nth as c_long, count as c_long, code) };
            }
            let nth = match (nth, count) {
                (nth, 1) => nth as c_int,
                (1, count) if count < 0 => 0, // fakecuda: 0 = every call
                _ => panic!("fakecuda fails one call or all: nth {nth}, count {count}"),
            };
            let f: unsafe extern "C" fn(*const c_char, c_int, c_int) =
                self.sym("fakecuda_fail_call");
            // SAFETY: a NUL-terminated name the fake copies; the rest by value.
            unsafe { f(name.as_ptr(), nth, code) }
        }

        /// Disarms every fault.
        pub fn clear_faults(&self) {
            let name = if self.hip() {
                "fakehip_clear_faults"
            } else {
                "fakecuda_clear_failures"
            };
            let f: unsafe extern "C" fn() = self.sym(name);
            // SAFETY: no arguments.
            unsafe { f() }
        }

        /// The fake's live count of `what` (see [`super::LIVE`]).
        ///
        /// # Panics
        /// When this fake does not answer `what`.
        pub fn live(&self, what: &str) -> i64 {
            // The two fakes' own names, until the common vocabulary.
            let (function, what) = match (self.hip(), what) {
                (true, what) => ("fakehip_count", what),
                (false, "pool_allocations") => ("fakecuda_live", "pool_blocks"),
                (false, what) => ("fakecuda_live", what),
            };
            let f: unsafe extern "C" fn(*const c_char) -> i64 = self.sym(function);
            let name = CString::new(what).expect("no NUL in a name");
            // SAFETY: a NUL-terminated name, read only.
            let n = unsafe { f(name.as_ptr()) };
            assert!(n >= 0, "{} does not count {what}", self.path());
            n
        }

        /// Asserts that the fake holds nothing for anyone (and, for CUDA, that no
        /// primary-context reference is left).
        ///
        /// # Panics
        /// When something is still held.
        pub fn assert_empty(&self) {
            let mut names = super::LIVE.to_vec();
            if self.vendor == Vendor::Cuda {
                names.push("contexts");
            }
            let held: Vec<(&str, i64)> = names
                .iter()
                .map(|&w| (w, self.live(w)))
                .filter(|&(_, n)| n != 0)
                .collect();
            assert!(held.is_empty(), "the fake still holds {held:?}");
        }

        /// Whether the mapping holding `va` grants `device` access; `None` when no mapping
        /// holds `va` — or when the fake cannot tell (no `fake_access` export yet).
        pub fn access(&self, va: u64, device: i32) -> Option<bool> {
            // SAFETY: the signature fake_common.h gives fake_access.
            let f = unsafe {
                self.library
                    .get::<unsafe extern "C" fn(u64, c_int) -> c_int>(b"fake_access")
            }
            .ok()?;
            // SAFETY: by value.
            match unsafe { f(va, device) } {
                n if n < 0 => None,
                n => Some(n != 0),
            }
        }

        /// `devices` devices of `capacity` bytes (CUDA: before `cuInit`).
        ///
        /// # Panics
        /// When fakecuda was already initialised.
        pub fn set_devices(&self, devices: i32, capacity: u64) {
            if self.hip() {
                let f: unsafe extern "C" fn(c_int, u64) = self.sym("fakehip_set_devices");
                // SAFETY: by value.
                return unsafe { f(devices, capacity) };
            }
            let f: unsafe extern "C" fn(c_int, u64, u64, c_int) -> c_int =
                self.sym("fakecuda_configure");
            // SAFETY: by value; 0 keeps the granularity and version.
            let rc = unsafe { f(devices, capacity, 0, 0) };
            assert_eq!(rc, 0, "configured before cuInit");
        }

        /// While held, work recorded on streams stays in flight until synchronised or
        /// released; releasing completes it all.
        pub fn hold_events(&self, held: bool) {
            let name = if self.hip() {
                "fakehip_hold_events"
            } else {
                "fakecuda_hold_events"
            };
            let f: unsafe extern "C" fn(c_int) = self.sym(name);
            // SAFETY: by value.
            unsafe { f(c_int::from(held)) }
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What a caller does beside portalloc, with the vendor's own calls from the driver library
/// (as PyTorch or cudarc do): make streams and events, record, query, destroy.
#[cfg(any(feature = "cuda", feature = "hip"))]
mod caller {
    use std::ffi::{c_int, c_uint, c_void};

    use portalloc::{Stream, Vendor};

    use super::Fake;

    /// `cuXxxCreate(&handle, flags)` / `hipXxxCreateWithFlags(&handle, flags)`.
    type Create = unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int;
    /// A call on one handle.
    type OnHandle = unsafe extern "C" fn(*mut c_void) -> c_int;
    /// `cuEventRecord(event, stream)` / `hipEventRecord(event, stream)`.
    type Record = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
    /// Both vendors' "not ready" (`CUDA_ERROR_NOT_READY`, `hipErrorNotReady`).
    const NOT_READY: c_int = 600;
    /// The events' flags: timing disabled (2 in both APIs).
    const DISABLE_TIMING: c_uint = 2;

    /// The vendor's name of a call: CUDA's, or HIP's.
    fn call<T: Copy>(fake: &Fake, cuda: &str, hip: &str) -> T {
        fake.sym(if fake.vendor() == Vendor::Hip {
            hip
        } else {
            cuda
        })
    }

    /// A stream made with `cuStreamCreate` / `hipStreamCreateWithFlags`.
    pub fn create_stream(fake: &Fake) -> Stream {
        let create: Create = call(fake, "cuStreamCreate", "hipStreamCreateWithFlags");
        let mut s = std::ptr::null_mut();
        // SAFETY: one handle written; flags 0 = a blocking stream.
        assert_eq!(unsafe { create(&mut s, 0) }, 0, "stream create");
        Stream::from_raw(s as u64)
    }

    /// An event of the caller's own, made and recorded on `stream`.
    pub fn record_event(fake: &Fake, stream: Stream) -> u64 {
        let create: Create = call(fake, "cuEventCreate", "hipEventCreateWithFlags");
        let record: Record = call(fake, "cuEventRecord", "hipEventRecord");
        let mut e = std::ptr::null_mut();
        // SAFETY: one handle written; then a live event on a live stream.
        unsafe {
            assert_eq!(create(&mut e, DISABLE_TIMING), 0, "event create");
            assert_eq!(record(e, stream.as_raw() as *mut c_void), 0, "event record");
        }
        e as u64
    }

    /// The driver's own query of the caller's event.
    pub fn event_done(fake: &Fake, event: u64) -> bool {
        let query: OnHandle = call(fake, "cuEventQuery", "hipEventQuery");
        // SAFETY: a live event of the caller's.
        match unsafe { query(event as *mut c_void) } {
            0 => true,
            NOT_READY => false,
            other => panic!("event query: {other}"),
        }
    }

    /// Destroys the caller's own events and streams.
    pub fn destroy(fake: &Fake, streams: &[Stream], events: &[u64]) {
        let destroy_event: OnHandle = call(fake, "cuEventDestroy_v2", "hipEventDestroy");
        let destroy_stream: OnHandle = call(fake, "cuStreamDestroy_v2", "hipStreamDestroy");
        // SAFETY: the caller's own live handles, each destroyed once.
        unsafe {
            for &e in events {
                assert_eq!(destroy_event(e as *mut c_void), 0, "event destroy");
            }
            for s in streams {
                assert_eq!(
                    destroy_stream(s.as_raw() as *mut c_void),
                    0,
                    "stream destroy"
                );
            }
        }
    }
}
