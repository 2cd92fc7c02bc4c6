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
use portalloc::{Allocator, Config, StrategyKind};

const MIB: u64 = 1 << 20;

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
    pub fn version(self) -> i32 {
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

/// The targets on which two devices offer each other peer access. The conformance drivers
/// join this list once they export `cuDeviceCanAccessPeer` / `hipDeviceCanAccessPeer` (and
/// the enable calls); until then the suite asserts they offer none, with a typed error.
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
        let (opened, fake) = match self {
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
                let fake = Fake::copy(name, Vendor::Cuda)?;
                fake.configure(devices, capacity, None);
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
                let fake = Fake::copy("fakehip", Vendor::Hip)?;
                fake.configure(devices, capacity, Some(rocm.version()));
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
            assert_eq!(
                (caps.virtual_memory, device.virtual_memory().is_some()),
                (
                    self.target.has_virtual_memory(),
                    self.target.has_virtual_memory()
                ),
                "{:?}: virtual memory",
                self.target
            );
            assert_eq!(
                (
                    caps.stream_ordered_pool,
                    device.stream_ordered_pool().is_some()
                ),
                (self.target.has_pool(), self.target.has_pool()),
                "{:?}: stream-ordered pool",
                self.target
            );
        }
    }

    /// Everything the devices and the driver hold now, to compare before and after an
    /// operation that must not reach the device.
    pub fn snapshot(&self) -> String {
        let mut text: Vec<String> = self.devices.iter().map(|d| d.census().1).collect();
        if let Some(fake) = &self.fake {
            text.push(format!("{:?}", fake.live_counts()));
        }
        text.join("; ")
    }

    /// Bytes of device memory held now (all devices): the host's books, or the driver's
    /// own count.
    pub fn device_bytes(&self) -> u64 {
        match &self.fake {
            Some(fake) => fake.live("bytes") as u64,
            None => self
                .devices
                .iter()
                .map(|d| match d {
                    Opened::Host(h) => h.census().bytes_in_use,
                    #[allow(unreachable_patterns)]
                    _ => unreachable!("a vendor device without its driver"),
                })
                .sum(),
        }
    }

    /// The peers granted access at `va` of device 0, where the target can tell (the host
    /// records them per mapping; the conformance drivers do not say).
    pub fn peer_access_at(&self, va: u64) -> Option<Vec<u32>> {
        match &self.devices[0] {
            Opened::Host(h) => Some(h.peer_access_at(va)),
            #[allow(unreachable_patterns)]
            _ => None,
        }
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
        if let Some(fake) = fake {
            fake.assert_empty();
        }
    }

    // ---- a caller's own driver calls (foreign streams) ------------------------------------

    /// A stream made with the driver's own call, not through portalloc (on the host, which
    /// has no driver, a handle the device never made).
    pub fn foreign_stream(&self) -> Stream {
        match &self.fake {
            Some(fake) => fake.create_stream(),
            None => Stream::from_raw(
                0x7f3a_0000_0000 + 0x100 * self.next_stream.fetch_add(1, Ordering::Relaxed),
            ),
        }
    }

    /// Holds (or, with false, completes) the work recorded on streams.
    pub fn hold(&self, on: bool) {
        match &self.fake {
            Some(fake) => fake.hold_events(on),
            None => self.host(0).set_events_held(on),
        }
    }

    /// Records an event of the caller's own on `stream`: the caller's kernel.
    pub fn record_work(&self, stream: Stream) -> u64 {
        match &self.fake {
            Some(fake) => fake.record_event(stream),
            None => {
                let host = self.host(0);
                let e = host.create_event().unwrap();
                host.record_event(e, stream).unwrap();
                e.0
            }
        }
    }

    /// The driver's own answer: has the work recorded as `work` completed?
    pub fn work_done(&self, work: u64) -> bool {
        match &self.fake {
            Some(fake) => fake.event_done(work),
            None => self.host(0).event_complete(Event(work)).unwrap(),
        }
    }

    /// Gives back the caller's own streams and events.
    pub fn destroy_foreign(&self, streams: &[Stream], works: &[u64]) {
        match &self.fake {
            Some(fake) => fake.destroy(streams, works),
            None => {
                for &w in works {
                    self.host(0).destroy_event(Event(w)).unwrap();
                }
            }
        }
    }

    fn host(&self, ordinal: usize) -> &HostDevice {
        match &self.devices[ordinal] {
            Opened::Host(h) => h,
            #[allow(unreachable_patterns)]
            _ => unreachable!("host-only call on a vendor target"),
        }
    }
}

/// A strategy of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    BfcPreallocated,
    BfcGrowing,
    Platform,
    /// The device's stream-ordered pool, preallocated.
    Async,
    Vmm,
}

impl Strategy {
    /// Whether `target` can serve the strategy; where it cannot, building it must fail with
    /// `Error::Unsupported`.
    pub fn served_by(self, target: Target) -> bool {
        match self {
            Strategy::Vmm => target.has_virtual_memory(),
            Strategy::Async => target.has_pool(),
            Strategy::BfcPreallocated | Strategy::BfcGrowing | Strategy::Platform => true,
        }
    }

    /// The configuration that names the strategy: 3/4 of the device's memory.
    pub fn config(self) -> Config {
        let (kind, preallocate) = match self {
            Strategy::BfcPreallocated => (StrategyKind::Bfc, true),
            Strategy::BfcGrowing => (StrategyKind::Bfc, false),
            Strategy::Platform => (StrategyKind::Platform, false),
            Strategy::Async => (StrategyKind::Async, true),
            Strategy::Vmm => (StrategyKind::Vmm, false),
        };
        Config::builder()
            .ignore_env()
            .strategy(kind)
            .preallocate(preallocate)
            .mem_fraction(0.75)
            .build()
            .expect("a valid configuration")
    }

    /// The strategy over `device`, through `strategy::build` as users build it.
    ///
    /// # Errors
    /// What `strategy::build` answers (`Error::Unsupported` for a capability the device lacks).
    pub fn build(self, device: Arc<dyn Device>) -> portalloc::Result<Box<dyn Allocator>> {
        portalloc::strategy::build(&self.config(), device)
    }
}

// ---- the conformance drivers' control functions -------------------------------------------

/// Which conformance driver a [`Fake`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    Cuda,
    Hip,
}

/// A private copy of a conformance driver, and the one adapter to its control functions and
/// to the calls a caller makes on the driver directly. Removed from disk on drop.
pub struct Fake {
    /// `libloading` is a dependency only with a vendor feature; without one no `Fake` is
    /// ever made.
    #[cfg(any(feature = "cuda", feature = "hip"))]
    lib: libloading::Library,
    path: std::path::PathBuf,
    pub vendor: Vendor,
}

/// What must be back to zero in each driver when portalloc has given everything back.
const CUDA_COUNTED: &[&str] = &[
    "allocations",
    "handles",
    "mappings",
    "reservations",
    "pools",
    "pool_blocks",
    "pool_reserved",
    "streams",
    "events",
    "contexts",
    "bytes",
];
const HIP_COUNTED: &[&str] = &[
    "allocations",
    "pool_allocations",
    "reservations",
    "handles",
    "mappings",
    "streams",
    "events",
    "pools",
    "bytes",
];

/// Both drivers' "not ready" code (`CUDA_ERROR_NOT_READY`, `hipErrorNotReady`).
const NOT_READY: i32 = 600;
/// The events' flags: timing disabled (2 in both APIs).
const DISABLE_TIMING: u32 = 2;

#[cfg(any(feature = "cuda", feature = "hip"))]
impl Fake {
    /// A private copy of the conformance driver `name` (`support::driver`), loaded. `None`
    /// (after [`super::skip`]) when it could not be built.
    pub fn copy(name: &str, vendor: Vendor) -> Option<Fake> {
        static COPIES: AtomicU64 = AtomicU64::new(0);
        let Some(built) = super::driver(name) else {
            super::skip(&format!(
                "the conformance driver {name} was not built (no C compiler)"
            ));
            return None;
        };
        let n = COPIES.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "portalloc-conformance-{}-{n}-lib{name}.so",
            std::process::id()
        ));
        std::fs::copy(built, &path).expect("copy the conformance driver");
        // SAFETY: our own test library; its initialisers do nothing.
        let lib = unsafe { libloading::Library::new(&path) }.expect("load the driver");
        Some(Fake { lib, path, vendor })
    }

    /// The copy's path, for `Driver::load` / `Runtime::load`.
    pub fn path(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    /// The symbol `name`, with the signature `T` the driver's C file gives it.
    pub fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: every caller names a function with the signature the C file defines.
        *unsafe { self.lib.get::<T>(name.as_bytes()) }.expect(name)
    }

    fn cuda_or_hip<T>(&self, cuda: T, hip: T) -> T {
        match self.vendor {
            Vendor::Cuda => cuda,
            Vendor::Hip => hip,
        }
    }

    /// Starts the driver afresh with `devices` devices of `capacity` bytes (and, for HIP,
    /// the runtime version `version`). Before any device is opened.
    pub fn configure(&self, devices: u32, capacity: u64, version: Option<i32>) {
        use std::ffi::c_int;
        match self.vendor {
            Vendor::Cuda => {
                let f: unsafe extern "C" fn(c_int, u64, u64, c_int) -> c_int =
                    self.sym("fakecuda_configure");
                // SAFETY: plain values, before cuInit.
                let rc = unsafe { f(devices as c_int, capacity, 0, version.unwrap_or(0)) };
                assert_eq!(rc, 0, "fakecuda_configure after cuInit");
            }
            Vendor::Hip => {
                self.reset();
                let set_version: unsafe extern "C" fn(c_int) = self.sym("fakehip_set_version");
                let set_devices: unsafe extern "C" fn(c_int, u64) = self.sym("fakehip_set_devices");
                // SAFETY: control functions taking plain values.
                unsafe {
                    if let Some(v) = version {
                        set_version(v);
                    }
                    set_devices(devices as c_int, capacity);
                }
            }
        }
    }

    /// Forgets injected faults (and, for HIP, every setting and object: a fresh runtime).
    pub fn reset(&self) {
        let f: unsafe extern "C" fn() =
            self.sym(self.cuda_or_hip("fakecuda_clear_failures", "fakehip_reset"));
        // SAFETY: a control function without arguments.
        unsafe { f() }
    }

    /// The driver's live count of `what` (see [`CUDA_COUNTED`], [`HIP_COUNTED`]).
    ///
    /// # Panics
    /// When the driver does not know `what`.
    pub fn live(&self, what: &str) -> i64 {
        let f: unsafe extern "C" fn(*const std::ffi::c_char) -> i64 =
            self.sym(self.cuda_or_hip("fakecuda_live", "fakehip_count"));
        let name = std::ffi::CString::new(what).unwrap();
        // SAFETY: a NUL-terminated name, read only.
        let n = unsafe { f(name.as_ptr()) };
        assert!(n >= 0, "the conformance driver does not count {what}");
        n
    }

    fn counted(&self) -> &'static [&'static str] {
        self.cuda_or_hip(CUDA_COUNTED, HIP_COUNTED)
    }

    /// Every live count, by name.
    pub fn live_counts(&self) -> Vec<(&'static str, i64)> {
        self.counted().iter().map(|&w| (w, self.live(w))).collect()
    }

    /// Asserts that the driver holds nothing for anyone any more.
    pub fn assert_empty(&self) {
        for (what, n) in self.live_counts() {
            assert_eq!(n, 0, "the {:?} driver still holds {what}", self.vendor);
        }
    }

    /// The next call of `function` answers `code`, once.
    pub fn fail_next(&self, function: &str, code: i32) {
        use std::ffi::{c_char, c_int, c_long};
        let name = std::ffi::CString::new(function).unwrap();
        match self.vendor {
            Vendor::Cuda => {
                let f: unsafe extern "C" fn(*const c_char, c_int, c_int) =
                    self.sym("fakecuda_fail_call");
                // SAFETY: a NUL-terminated name the driver copies.
                unsafe { f(name.as_ptr(), 1, code) }
            }
            Vendor::Hip => {
                let f: unsafe extern "C" fn(*const c_char, c_long, c_long, c_int) =
                    self.sym("fakehip_fail");
                // SAFETY: a NUL-terminated name the driver copies.
                unsafe { f(name.as_ptr(), 1, 1, code) }
            }
        }
    }

    /// While held, work recorded on streams stays in flight until synchronised; releasing
    /// completes it all.
    pub fn hold_events(&self, held: bool) {
        let f: unsafe extern "C" fn(std::ffi::c_int) =
            self.sym(self.cuda_or_hip("fakecuda_hold_events", "fakehip_hold_events"));
        // SAFETY: a plain value.
        unsafe { f(held.into()) }
    }

    /// A stream made with the driver's own call (`cuStreamCreate`, `hipStreamCreateWithFlags`).
    pub fn create_stream(&self) -> Stream {
        let create: Create =
            self.sym(self.cuda_or_hip("cuStreamCreate", "hipStreamCreateWithFlags"));
        let mut s = std::ptr::null_mut();
        // SAFETY: one handle written; flags 0 = a blocking stream.
        assert_eq!(unsafe { create(&mut s, 0) }, 0, "stream create");
        Stream::from_raw(s as u64)
    }

    /// An event of the caller's own, made and recorded on `stream` with the driver's calls.
    pub fn record_event(&self, stream: Stream) -> u64 {
        let create: Create = self.sym(self.cuda_or_hip("cuEventCreate", "hipEventCreateWithFlags"));
        let record: Record = self.sym(self.cuda_or_hip("cuEventRecord", "hipEventRecord"));
        let mut e = std::ptr::null_mut();
        // SAFETY: one handle written; then a live event on a live stream.
        unsafe {
            assert_eq!(create(&mut e, DISABLE_TIMING), 0, "event create");
            assert_eq!(
                record(e, stream.as_raw() as *mut std::ffi::c_void),
                0,
                "event record"
            );
        }
        e as u64
    }

    /// The driver's own query of the caller's event.
    pub fn event_done(&self, event: u64) -> bool {
        let query: OnHandle = self.sym(self.cuda_or_hip("cuEventQuery", "hipEventQuery"));
        // SAFETY: a live event of the caller's.
        match unsafe { query(event as *mut std::ffi::c_void) } {
            0 => true,
            NOT_READY => false,
            other => panic!("event query: {other}"),
        }
    }

    /// Destroys the caller's own events and streams with the driver's calls.
    pub fn destroy(&self, streams: &[Stream], events: &[u64]) {
        let destroy_event: OnHandle =
            self.sym(self.cuda_or_hip("cuEventDestroy_v2", "hipEventDestroy"));
        let destroy_stream: OnHandle =
            self.sym(self.cuda_or_hip("cuStreamDestroy_v2", "hipStreamDestroy"));
        // SAFETY: the caller's own live handles, each destroyed once.
        unsafe {
            for &e in events {
                assert_eq!(destroy_event(e as *mut std::ffi::c_void), 0);
            }
            for s in streams {
                assert_eq!(destroy_stream(s.as_raw() as *mut std::ffi::c_void), 0);
            }
        }
    }
}

/// Without a vendor feature no `Fake` exists; these keep the rig's code one shape.
#[cfg(not(any(feature = "cuda", feature = "hip")))]
impl Fake {
    fn unreachable(&self) -> ! {
        unreachable!("no conformance driver is loaded without a vendor feature")
    }
    pub fn live(&self, _: &str) -> i64 {
        self.unreachable()
    }
    pub fn live_counts(&self) -> Vec<(&'static str, i64)> {
        self.unreachable()
    }
    pub fn assert_empty(&self) {
        self.unreachable()
    }
    pub fn hold_events(&self, _: bool) {
        self.unreachable()
    }
    pub fn create_stream(&self) -> Stream {
        self.unreachable()
    }
    pub fn record_event(&self, _: Stream) -> u64 {
        self.unreachable()
    }
    pub fn event_done(&self, _: u64) -> bool {
        self.unreachable()
    }
    pub fn destroy(&self, _: &[Stream], _: &[u64]) {
        self.unreachable()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `cuXxxCreate(&handle, flags)` / `hipXxxCreateWithFlags(&handle, flags)`.
type Create = unsafe extern "C" fn(*mut *mut std::ffi::c_void, std::ffi::c_uint) -> std::ffi::c_int;
/// A call on one handle.
type OnHandle = unsafe extern "C" fn(*mut std::ffi::c_void) -> std::ffi::c_int;
/// `cuEventRecord(event, stream)` / `hipEventRecord(event, stream)`.
type Record = unsafe extern "C" fn(*mut std::ffi::c_void, *mut std::ffi::c_void) -> std::ffi::c_int;
