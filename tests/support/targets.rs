//! The devices the conformance suite (`tests/suite/conformance.rs`) runs every strategy on, and
//! what a caller of each can do with the driver's own calls (`tests/suite/foreign_streams.rs`).
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
//!
//! The rig is a world like a GPU program's: the caller has a current context (CUDA) or
//! device (HIP) of its own on its thread — device 0's at open, as PyTorch's runtime makes it
//! — and the driver has one device more than portalloc opens (the caller's other GPU), whose
//! context [`Rig::caller_probe`] makes current around every call to check that portalloc
//! leaves it as it found it. The caller's kernels ([`Rig::launch`]) stay in flight over the
//! memory they use until it finishes them, and the device counts the hazards (memory freed
//! or unmapped while a kernel used it) and the CPU waits: [`Rig::finish`] requires no
//! hazard.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[cfg(any(feature = "cuda", feature = "hip"))]
use portalloc::Vendor;

use portalloc::backends::host::HostDevice;
use portalloc::device::{Device, Stream};
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

/// The targets on which two devices offer each other peer access: every one — the host
/// backend, and both conformance drivers, which export `cuDeviceCanAccessPeer` /
/// `cuCtxEnablePeerAccess` and `hipDeviceCanAccessPeer` / `hipDeviceEnablePeerAccess`. A
/// target left out of this list must refuse peer access with a typed error (the suite
/// asserts it); a pair declared not capable is `tests/suite/vendor_fakes.rs`' and `tests/suite/peer.rs`'.
pub const PEER_TARGETS: &[Target] = &[
    Target::HostReal,
    Target::HostSimulated,
    #[cfg(feature = "cuda")]
    Target::FakeCuda,
    #[cfg(feature = "cuda")]
    Target::FakeCudaOld,
    #[cfg(feature = "hip")]
    Target::FakeHip(Rocm::V5),
    #[cfg(feature = "hip")]
    Target::FakeHip(Rocm::V6),
    #[cfg(feature = "hip")]
    Target::FakeHip(Rocm::V7),
];

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

    /// `devices` devices of `capacity` bytes each. `None` (after [`super::skip`]) when this
    /// build lacks the target's backend.
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
                let fake = Fake::copy(name);
                // One device more than portalloc opens: the caller's other GPU.
                fake.set_devices(devices as i32 + 1, capacity);
                let driver = Arc::new(Driver::load(&[fake.path()]).expect("the driver loads"));
                let opened: Vec<Opened> = (0..devices)
                    .map(|ordinal| {
                        let device = CudaDevice::open(Arc::clone(&driver), ordinal)
                            .expect("open the fake device");
                        Opened::Cuda(Arc::new(device))
                    })
                    .collect();
                (opened, Some(fake))
            }
            #[cfg(feature = "hip")]
            Target::FakeHip(rocm) => {
                use portalloc::backends::hip::{HipDevice, Runtime};
                let fake = Fake::copy("fakehip");
                let set_version: unsafe extern "C" fn(std::ffi::c_int) =
                    fake.sym("fakehip_set_version");
                // SAFETY: a control function of fakehip, by value, before any device opens.
                unsafe { set_version(rocm.version()) };
                // One device more than portalloc opens: the caller's other GPU.
                fake.set_devices(devices as i32 + 1, capacity);
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
        // The caller's current context or device: device 0's, as PyTorch's runtime makes it
        // current on this thread; and its other device's, for the checks.
        #[cfg(any(feature = "cuda", feature = "hip"))]
        let caller = fake.as_ref().map(|fake| {
            let home = fake.primary(0);
            let other = fake.primary(devices as i32);
            fake.set_current(home);
            Caller {
                other,
                other_ordinal: devices as i32,
            }
        });
        #[cfg(not(any(feature = "cuda", feature = "hip")))]
        let caller = None;
        let rig = Rig {
            target: self,
            devices: opened,
            fake,
            caller,
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

/// The caller's current contexts (CUDA: primary contexts it retained) or devices (HIP).
#[derive(Debug, Clone, Copy)]
struct Caller {
    /// The caller's other device's (one portalloc never opens), for the checks.
    other: u64,
    other_ordinal: i32,
}

/// What [`Rig::caller_probe`] gives: the caller's driver calls that read and set the
/// calling thread's current context (CUDA) or device (HIP), and a value to set that is not
/// any device portalloc opened.
#[derive(Clone)]
pub struct CallerProbe {
    current: Arc<dyn Fn() -> u64 + Send + Sync>,
    set: Arc<dyn Fn(u64) + Send + Sync>,
    /// The caller's other device's context or ordinal.
    pub other: u64,
    /// `context` (CUDA) or `device` (HIP), for messages.
    pub what: &'static str,
}

impl CallerProbe {
    /// Runs `call` with the caller's other device current on this thread, and asserts that
    /// it is still current afterwards; then makes current again what was.
    ///
    /// # Panics
    /// When `call` left another context or device current.
    pub fn around<T>(&self, call: &str, f: impl FnOnce() -> T) -> T {
        let before = (self.current)();
        (self.set)(self.other);
        let result = f();
        let after = (self.current)();
        assert_eq!(
            after, self.other,
            "{call} changed the caller's current {} from {:#x} to {after:#x}",
            self.what, self.other
        );
        (self.set)(before);
        result
    }
}

/// The devices of one target, and the conformance driver beneath them (when there is one).
pub struct Rig {
    pub target: Target,
    /// Dropped before `fake`: the devices give back what they hold through its library.
    devices: Vec<Opened>,
    fake: Option<Fake>,
    /// The caller's contexts or devices, on a vendor target.
    caller: Option<Caller>,
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
        let (hazards, first) = self.hazards();
        assert_eq!(
            hazards, 0,
            "{:?}: memory a kernel still used was freed or unmapped: {first}",
            self.target
        );
        let Rig {
            target,
            devices,
            fake,
            caller,
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
            if let Some(c) = caller {
                fake.set_current(0);
                fake.release_primary(0);
                fake.release_primary(c.other_ordinal);
            }
            fake.assert_empty();
        }
        #[cfg(not(any(feature = "cuda", feature = "hip")))]
        drop((fake, caller));
    }

    /// The caller's driver calls around portalloc's, on a vendor target (`None` on the host,
    /// which has no current device).
    pub fn caller_probe(&self) -> Option<CallerProbe> {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let (Some(fake), Some(c)) = (&self.fake, self.caller) {
            let vendor = fake.vendor();
            // The fake's library stays loaded while the rig lives; the probe is used only
            // by what the rig outlives (its subject).
            let (current, set) = caller::current_calls(fake);
            return Some(CallerProbe {
                current: Arc::new(current),
                set: Arc::new(set),
                other: c.other,
                what: if vendor == Vendor::Cuda {
                    "context"
                } else {
                    "device"
                },
            });
        }
        None
    }

    // ---- the caller's kernels, and what the device saw -----------------------------------

    /// A kernel of the caller's on `stream` over `[va, va + size)`, in flight until
    /// [`Rig::finish_work`] (or a CPU wait of portalloc's that covers it).
    pub fn launch(&self, stream: Stream, va: u64, size: u64) -> u64 {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return fake.launch(stream, va, size);
        }
        self.host(0).launch(stream, va, size)
    }

    /// A kernel on `stream` that writes `[va, va + size)` (a conformance driver's; on the
    /// host, a kernel that uses it).
    #[allow(dead_code)] // not every test file's
    pub fn launch_writing(&self, stream: Stream, va: u64, size: u64) -> u64 {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return fake.launch_writing(stream, va, size);
        }
        self.host(0).launch(stream, va, size)
    }

    /// The kernel completes.
    pub fn finish_work(&self, work: u64) {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return fake.finish(work);
        }
        self.host(0).finish(work)
    }

    /// The device's own answer: has the kernel completed?
    pub fn work_done(&self, work: u64) -> bool {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return fake.kernel_done(work);
        }
        self.host(0)
            .kernel_done(work)
            .expect("a kernel of the rig's")
    }

    /// The device's own answer: does work queued on `stream` from now on run after the
    /// kernel (completed, the same stream, or a GPU-side wait ordering it)?
    pub fn ordered(&self, work: u64, stream: Stream) -> bool {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return fake.ordered(work, stream);
        }
        self.host(0)
            .ordered(work, stream)
            .expect("a kernel of the rig's")
    }

    /// Memory freed or unmapped while a kernel used it: how often, and the first.
    pub fn hazards(&self) -> (u64, String) {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return fake.hazards();
        }
        let mut count = 0;
        let mut first = String::new();
        for d in 0..self.devices.len() {
            let (n, texts) = self.host(d).hazards();
            count += n;
            if first.is_empty() {
                first = texts.into_iter().next().unwrap_or_default();
            }
        }
        (count, first)
    }

    /// CPU waits and GPU-side waits the devices saw so far.
    pub fn waits(&self) -> (u64, u64) {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return fake.waits();
        }
        (0..self.devices.len())
            .map(|d| self.host(d).cpu_waits())
            .fold((0, 0), |(c, g), (a, b)| (c + a, g + b))
    }

    // ---- a caller's own driver calls (foreign streams) ------------------------------------

    /// A stream made with the driver's own call, not through portalloc (on the host, which
    /// has no driver, a handle the device never made).
    pub fn foreign_stream(&self) -> Stream {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return caller::create_stream(fake);
        }
        super::stream(0x7f3a_0000_0000 + 0x100 * self.next_stream.fetch_add(1, Ordering::Relaxed))
    }

    /// Holds (or, with false, completes) the work recorded on streams.
    pub fn hold(&self, on: bool) {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return fake.hold_events(on);
        }
        self.host(0).set_events_held(on)
    }

    /// Gives back the caller's own streams.
    pub fn destroy_foreign(&self, streams: &[Stream]) {
        #[cfg(any(feature = "cuda", feature = "hip"))]
        if let Some(fake) = &self.fake {
            return caller::destroy(fake, streams);
        }
        // The host's foreign streams are bare handles: nothing to give back.
        let _ = streams;
    }

    fn host(&self, ordinal: usize) -> &HostDevice {
        match &self.devices[ordinal] {
            Opened::Host(h) => h,
            #[allow(unreachable_patterns)]
            _ => unreachable!("a host-only call on a vendor target"),
        }
    }
}

/// The strategies of the suite: the tests' one list (`support::common::Strategy`: bfc
/// preallocated, bfc growing, platform, vmm, async).
pub use super::common::Strategy;

/// What the suite asks of a strategy beyond its name.
pub trait SuiteStrategy: Copy {
    /// Whether `target` can serve the strategy; where it cannot, building it must fail with
    /// `Error::Unsupported`.
    fn served_by(self, target: Target) -> bool;

    /// The strategy over `device` with 3/4 of its memory, through `strategy::build` as users
    /// build it (a `Config` made in code); the async pool is preallocated, so that path is
    /// covered.
    ///
    /// # Errors
    /// What `strategy::build` answers (`Error::Unsupported` for a capability the device
    /// lacks).
    fn build_as_configured(self, device: Arc<dyn Device>) -> portalloc::Result<Box<dyn Allocator>>;
}

impl SuiteStrategy for Strategy {
    fn served_by(self, target: Target) -> bool {
        match self {
            Strategy::Vmm => target.has_virtual_memory(),
            Strategy::Async => target.has_pool(),
            Strategy::Bfc | Strategy::BfcGrow | Strategy::Platform => true,
        }
    }

    fn build_as_configured(self, device: Arc<dyn Device>) -> portalloc::Result<Box<dyn Allocator>> {
        use portalloc::StrategyKind;
        let (kind, preallocate) = match self {
            Strategy::Bfc => (StrategyKind::Bfc, true),
            Strategy::BfcGrow => (StrategyKind::Bfc, false),
            Strategy::Platform => (StrategyKind::Platform, false),
            Strategy::Vmm => (StrategyKind::Vmm, false),
            Strategy::Async => (StrategyKind::Async, true),
        };
        let config = portalloc::Config::builder()
            .ignore_env()
            .strategy(kind)
            .mem_fraction(0.75)
            .preallocate(preallocate)
            .build()?;
        portalloc::strategy::build(&config, device)
    }
}

// ---- the conformance drivers ----------------------------------------------------------------

/// The conformance drivers' control API, one type for both vendors.
#[cfg(any(feature = "cuda", feature = "hip"))]
pub use super::fakes::{Fake, LIVE};

/// Without a vendor feature no conformance driver is loaded.
#[cfg(not(any(feature = "cuda", feature = "hip")))]
pub enum Fake {}

/// A stream the caller makes with the driver's own call (`cuStreamCreate`,
/// `hipStreamCreateWithFlags`), in its current context.
#[cfg(any(feature = "cuda", feature = "hip"))]
#[allow(dead_code)] // tests/capi.rs's
pub fn caller_stream(fake: &Fake) -> Stream {
    caller::create_stream(fake)
}

/// Destroys streams of [`caller_stream`].
#[cfg(any(feature = "cuda", feature = "hip"))]
#[allow(dead_code)] // tests/capi.rs's
pub fn destroy_caller_streams(fake: &Fake, streams: &[Stream]) {
    caller::destroy(fake, streams)
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

    /// The vendor's name of a call: CUDA's, or HIP's.
    fn call<T: Copy>(fake: &Fake, cuda: &str, hip: &str) -> T {
        fake.sym(if fake.vendor() == Vendor::Hip {
            hip
        } else {
            cuda
        })
    }

    /// A stream made with `cuStreamCreate` / `hipStreamCreateWithFlags`, non-blocking as
    /// PyTorch's pool makes its side streams (`cudaStreamNonBlocking`) and cudarc its own:
    /// the legacy default stream's implicit order does not hold for it.
    pub fn create_stream(fake: &Fake) -> Stream {
        let create: Create = call(fake, "cuStreamCreate", "hipStreamCreateWithFlags");
        let mut s = std::ptr::null_mut();
        // SAFETY: one handle written; flags 1 = CU_STREAM_NON_BLOCKING, hipStreamNonBlocking.
        assert_eq!(unsafe { create(&mut s, 1) }, 0, "stream create");
        crate::support::stream(s as u64)
    }

    /// The caller's calls that read and set the thread's current context (CUDA) or device
    /// (HIP): `cuCtxGetCurrent` / `cuCtxSetCurrent`, `hipGetDevice` / `hipSetDevice`.
    pub fn current_calls(
        fake: &Fake,
    ) -> (impl Fn() -> u64 + Send + Sync, impl Fn(u64) + Send + Sync) {
        type GetCtx = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
        type SetCtx = unsafe extern "C" fn(*mut c_void) -> c_int;
        type GetDev = unsafe extern "C" fn(*mut c_int) -> c_int;
        type SetDev = unsafe extern "C" fn(c_int) -> c_int;
        let hip = fake.vendor() == Vendor::Hip;
        let (get_ctx, set_ctx, get_dev, set_dev): (
            Option<GetCtx>,
            Option<SetCtx>,
            Option<GetDev>,
            Option<SetDev>,
        ) = if hip {
            (
                None,
                None,
                Some(fake.sym("hipGetDevice")),
                Some(fake.sym("hipSetDevice")),
            )
        } else {
            (
                Some(fake.sym("cuCtxGetCurrent")),
                Some(fake.sym("cuCtxSetCurrent")),
                None,
                None,
            )
        };
        let current = move || -> u64 {
            match (get_ctx, get_dev) {
                (Some(get), _) => {
                    let mut ctx = std::ptr::null_mut();
                    // SAFETY: one value written through a valid pointer.
                    let rc = unsafe { get(&mut ctx) };
                    assert_eq!(rc, 0, "cuCtxGetCurrent");
                    ctx as u64
                }
                (_, Some(get)) => {
                    let mut d: c_int = -1;
                    // SAFETY: one value written through a valid pointer.
                    let rc = unsafe { get(&mut d) };
                    assert_eq!(rc, 0, "hipGetDevice");
                    d as u64
                }
                _ => unreachable!(),
            }
        };
        let set = move |v: u64| {
            match (set_ctx, set_dev) {
                (Some(set), _) => {
                    // SAFETY: null or a context the rig retained.
                    let rc = unsafe { set(v as *mut c_void) };
                    assert_eq!(rc, 0, "cuCtxSetCurrent")
                }
                (_, Some(set)) => {
                    // SAFETY: a device ordinal, by value.
                    let rc = unsafe { set(v as c_int) };
                    assert_eq!(rc, 0, "hipSetDevice")
                }
                _ => unreachable!(),
            }
        };
        (current, set)
    }

    /// Destroys the caller's own streams.
    pub fn destroy(fake: &Fake, streams: &[Stream]) {
        let destroy_stream: OnHandle = call(fake, "cuStreamDestroy_v2", "hipStreamDestroy");
        // SAFETY: the caller's own live handles, each destroyed once.
        unsafe {
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
