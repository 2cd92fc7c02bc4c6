//! Streams that callers bring (issue #11), tested from the caller's side.
//!
//! PyTorch, cudarc, CuPy and C programs make their own streams with the driver's own call and
//! pass raw handles. Here, for every backend — the host device (real and simulated memory),
//! the CUDA shim over the conformance driver `fakecuda`, the HIP shim over `fakehip` as ROCm
//! 5, 6 and 7 — and every strategy the backend serves (bfc preallocated and growing, vmm where
//! the device has virtual memory, async where it has pools, platform):
//!
//! 1. two streams `S` and `T` (and a third, `U`) are made **with the driver's own
//!    stream-create call** (`cuStreamCreate`, `hipStreamCreateWithFlags`, loaded from the
//!    driver library beside portalloc; on the host, handles the device never made);
//! 2. the driver holds work in flight (its event controls), and the caller records an event
//!    of its own — with the driver's own event calls — on `S` after using a buffer there:
//!    the caller's kernel, still running;
//! 3. the buffer is freed on `S`, and buffers are asked for on `T`, `U` and the default
//!    stream: **no address freed on `S` may be handed to another stream while the caller's
//!    event on `S` has not completed** (asked of the driver, not of portalloc). Waiting for
//!    it (synchronising `S`) is allowed: the oracle is the driver's own event query after the
//!    hand-out.
//!
//! Then `S` reuses its own free at once (the pooling strategies), and everything is given
//! back: the driver's own counts return to zero.

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use portalloc::backends::host::HostDevice;
use portalloc::device::{Device, Event, Stream};
use portalloc::strategy::async_pool::{AsyncOptions, AsyncPoolAllocator};
use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
use portalloc::strategy::platform::PlatformAllocator;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator};
use test_case::test_case;

const MIB: u64 = 1 << 20;
/// The buffer the caller's kernel uses on `S`.
const SIZE: u64 = MIB;

/// A caller's view of one backend: its device through portalloc, and the driver's own calls.
trait Caller {
    fn device(&self) -> Arc<dyn Device>;
    /// A stream made with the driver's own call (not through portalloc).
    fn stream(&self) -> Stream;
    /// Holds (or releases) the work recorded on streams in flight.
    fn hold(&self, on: bool);
    /// Records an event of the caller's own, with the driver's calls, on `s`.
    fn record_work(&self, s: Stream) -> u64;
    /// The driver's own answer: has the work recorded as `work` completed?
    fn work_done(&self, work: u64) -> bool;
    /// Gives back what the caller made and checks the driver holds nothing more.
    fn finish(&self, streams: &[Stream], works: &[u64]);
}

// ---- the host device --------------------------------------------------------------------

struct HostCaller {
    device: Arc<HostDevice>,
    next: AtomicU64,
}

impl HostCaller {
    fn new(simulated: bool) -> HostCaller {
        let device = HostDevice::builder()
            .capacity(64 * MIB)
            .simulated(simulated)
            .build()
            .unwrap();
        HostCaller {
            device: Arc::new(device),
            next: AtomicU64::new(0),
        }
    }
}

impl Caller for HostCaller {
    fn device(&self) -> Arc<dyn Device> {
        Arc::clone(&self.device) as Arc<dyn Device>
    }
    fn stream(&self) -> Stream {
        // The host has no driver of its own: a caller's stream is a handle it never made.
        Stream::from_raw(0x7f3a_0000_0000 + 0x100 * self.next.fetch_add(1, Ordering::Relaxed))
    }
    fn hold(&self, on: bool) {
        self.device.set_events_held(on);
    }
    fn record_work(&self, s: Stream) -> u64 {
        let e = self.device.create_event().unwrap();
        self.device.record_event(e, s).unwrap();
        e.0
    }
    fn work_done(&self, work: u64) -> bool {
        self.device.event_complete(Event(work)).unwrap()
    }
    fn finish(&self, _streams: &[Stream], works: &[u64]) {
        for &w in works {
            self.device.destroy_event(Event(w)).unwrap();
        }
        let census = self.device.census();
        assert!(census.is_empty(), "the host still holds {census:?}");
    }
}

// ---- the scenario -----------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Strategy {
    Bfc,
    BfcGrow,
    Vmm,
    Async,
    Platform,
}

/// The strategy over `device`, or `None` when the device cannot serve it (no VMM, no pools).
fn build(strategy: Strategy, device: Arc<dyn Device>) -> Option<Box<dyn Allocator>> {
    let limit = 48 * MIB;
    Some(match strategy {
        Strategy::Bfc | Strategy::BfcGrow => Box::new(
            BfcAllocator::new(
                device,
                BfcOptions {
                    limit,
                    preallocate: strategy == Strategy::Bfc,
                },
            )
            .unwrap(),
        ),
        Strategy::Vmm => {
            device.virtual_memory()?;
            Box::new(VmmAllocator::new(device, VmmOptions::new(limit)).unwrap())
        }
        Strategy::Async => {
            device.stream_ordered_pool()?;
            Box::new(AsyncPoolAllocator::new(device, AsyncOptions::new(limit)).unwrap())
        }
        Strategy::Platform => Box::new(PlatformAllocator::new(device, Some(limit))),
    })
}

fn overlaps(a: &Allocation, range: (u64, u64)) -> bool {
    a.size() > 0 && a.ptr() < range.1 && range.0 < a.ptr() + a.size()
}

/// The scenario of the module docs. Returns how many requests on other streams were handed
/// the freed memory (after the caller's work completed, necessarily).
fn no_early_reuse(caller: &dyn Caller, strategy: Strategy) {
    let Some(a) = build(strategy, caller.device()) else {
        eprintln!("{strategy:?}: not served by this device");
        return;
    };
    let (s, t, u) = (caller.stream(), caller.stream(), caller.stream());
    let mut works = Vec::new();
    let mut keep: Vec<Allocation> = Vec::new();
    caller.hold(true);

    // T is in use too (several streams: frees become stream-ordered), then the caller's
    // kernel uses a buffer on S and is still running when the buffer is freed on S.
    keep.push(a.allocate(4096, 0, t, "t").unwrap());
    let x = a.allocate(SIZE, 0, s, "x").unwrap();
    let freed = (x.ptr(), x.ptr() + SIZE);
    let work = caller.record_work(s);
    works.push(work);
    a.deallocate(x).unwrap();

    let mut reused_elsewhere = 0;
    for other in [t, u, Stream::DEFAULT] {
        for size in [SIZE, SIZE / 2, 256] {
            let y = a.allocate(size, 0, other, "other").unwrap();
            if overlaps(&y, freed) {
                assert!(
                    caller.work_done(work),
                    "{strategy:?}: {:#x}+{size} handed to {other:?} while the caller's work on \
                     {s:?} before the free of {:#x}+{SIZE} is in flight",
                    y.ptr(),
                    freed.0
                );
                reused_elsewhere += 1;
            }
            keep.push(y);
        }
    }

    // S's own later work is ordered after the free: the pooling strategies reuse at once.
    let again = a.allocate(SIZE, 0, s, "again").unwrap();
    if matches!(strategy, Strategy::Bfc | Strategy::BfcGrow | Strategy::Vmm)
        && reused_elsewhere == 0
    {
        assert!(
            overlaps(&again, freed),
            "{strategy:?}: S did not reuse its own pending free"
        );
        assert!(!caller.work_done(work), "S reused without waiting");
    }
    keep.push(again);

    caller.hold(false);
    for y in keep {
        a.deallocate(y).unwrap();
    }
    a.check_invariants().unwrap();
    a.trim().unwrap();
    drop(a);
    caller.finish(&[s, t, u], &works);
}

const ALL: [Strategy; 5] = [
    Strategy::Bfc,
    Strategy::BfcGrow,
    Strategy::Vmm,
    Strategy::Async,
    Strategy::Platform,
];

#[test_case(false ; "real memory")]
#[test_case(true ; "simulated")]
fn host_foreign_streams(simulated: bool) {
    for strategy in ALL {
        no_early_reuse(&HostCaller::new(simulated), strategy);
    }
}

/// The per-thread default stream names another stream on each thread: memory freed on it is
/// not handed to the same handle at once, and never to another stream before its work.
#[test]
fn per_thread_handle_is_not_reused_at_once() {
    let caller = HostCaller::new(true);
    for strategy in [Strategy::Bfc, Strategy::BfcGrow, Strategy::Vmm] {
        let a = build(strategy, caller.device()).unwrap();
        caller.hold(true);
        let x = a.allocate(SIZE, 0, Stream::PER_THREAD, "x").unwrap();
        let freed = (x.ptr(), x.ptr() + SIZE);
        let work = caller.record_work(Stream::PER_THREAD);
        a.deallocate(x).unwrap();
        let y = a.allocate(SIZE, 0, Stream::PER_THREAD, "y").unwrap();
        assert!(
            !overlaps(&y, freed) || caller.work_done(work),
            "{strategy:?}: reused on the per-thread handle while its work is in flight"
        );
        caller.hold(false);
        a.deallocate(y).unwrap();
        a.trim().unwrap();
        drop(a);
        caller.finish(&[], &[work]);
    }
}

// ---- the CUDA and HIP shims over their conformance drivers ------------------------------

#[cfg(any(feature = "cuda", feature = "hip"))]
mod drivers {
    use std::ffi::{c_int, c_long, c_uint, c_void, CString};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;
    use test_case::test_case;

    /// The path of a conformance driver the tests compiled; `None` (with a message) when none —
    /// an error under `CI=true`, where every driver must run.
    fn built(path: Option<&'static str>, name: &str) -> Option<&'static str> {
        if path.is_none() {
            support::skip(&format!(
                "the conformance driver {name} was not built (no C compiler)"
            ));
        }
        path
    }

    /// A private copy of a conformance driver (its own state), removed on drop.
    struct Library {
        lib: libloading::Library,
        path: PathBuf,
    }

    impl Library {
        fn copy_of(built: &str) -> Library {
            static COPIES: AtomicU64 = AtomicU64::new(0);
            let n = COPIES.fetch_add(1, Ordering::Relaxed);
            let name = PathBuf::from(built);
            let path = std::env::temp_dir().join(format!(
                "portalloc-foreign-{}-{n}-{}",
                std::process::id(),
                name.file_name().unwrap().to_string_lossy()
            ));
            std::fs::copy(built, &path).expect("copy the conformance driver");
            // SAFETY: our own test library; its initialisers do nothing.
            let lib = unsafe { libloading::Library::new(&path) }.expect("load the driver");
            Library { lib, path }
        }

        fn path(&self) -> String {
            self.path.to_string_lossy().into_owned()
        }

        /// The symbol `name` with the signature `T` its C file gives it.
        fn sym<T: Copy>(&self, name: &str) -> T {
            // SAFETY: every caller names a function with the signature the C file defines.
            *unsafe { self.lib.get::<T>(name.as_bytes()) }.expect(name)
        }
    }

    impl Drop for Library {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// The driver calls a caller makes itself, by vendor: the names, and what the driver's
    /// inspection functions are called.
    struct Api {
        stream_create: &'static str,
        stream_destroy: &'static str,
        event_create: &'static str,
        event_record: &'static str,
        event_query: &'static str,
        event_destroy: &'static str,
        hold: &'static str,
        /// The conformance driver's count of live objects by name.
        count: &'static str,
        /// What must be back to zero at the end.
        counted: &'static [&'static str],
    }

    const CUDA: Api = Api {
        stream_create: "cuStreamCreate",
        stream_destroy: "cuStreamDestroy_v2",
        event_create: "cuEventCreate",
        event_record: "cuEventRecord",
        event_query: "cuEventQuery",
        event_destroy: "cuEventDestroy_v2",
        hold: "fakecuda_hold_events",
        count: "fake_live",
        counted: &[
            "allocations",
            "handles",
            "mappings",
            "reservations",
            "pool_allocations",
            "events",
            "streams",
        ],
    };

    const HIP: Api = Api {
        stream_create: "hipStreamCreateWithFlags",
        stream_destroy: "hipStreamDestroy",
        event_create: "hipEventCreateWithFlags",
        event_record: "hipEventRecord",
        event_query: "hipEventQuery",
        event_destroy: "hipEventDestroy",
        hold: "fakehip_hold_events",
        count: "fake_live",
        counted: &[
            "allocations",
            "pool_allocations",
            "handles",
            "mappings",
            "reservations",
            "events",
            "streams",
        ],
    };

    /// `cuXxxCreate(&handle, flags)` / `hipXxxCreateWithFlags(&handle, flags)`.
    type Create = unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int;
    /// A call on one handle.
    type OnHandle = unsafe extern "C" fn(*mut c_void) -> c_int;
    /// `cuEventRecord(event, stream)` / `hipEventRecord(event, stream)`.
    type Record = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
    /// Both drivers' "not ready" code (`CUDA_ERROR_NOT_READY`, `hipErrorNotReady`).
    const NOT_READY: c_int = 600;
    /// The events' flags: timing disabled (2 in both APIs).
    const DISABLE_TIMING: c_uint = 2;

    struct DriverCaller {
        lib: Library,
        device: Arc<dyn Device>,
        api: &'static Api,
    }

    impl DriverCaller {
        /// The CUDA shim over a private copy of fakecuda (256 MiB).
        fn cuda() -> Option<DriverCaller> {
            #[cfg(feature = "cuda")]
            {
                use portalloc::backends::cuda::{CudaDevice, Driver};
                let built = built(support::driver("fakecuda"), "fakecuda")?;
                let lib = Library::copy_of(built);
                let configure: unsafe extern "C" fn(c_int, u64, u64, c_int) -> c_int =
                    lib.sym("fakecuda_configure");
                // SAFETY: plain values, before cuInit.
                unsafe { configure(1, 256 * MIB, 0, 0) };
                let driver = Arc::new(Driver::load(&[lib.path()]).expect("fakecuda loads"));
                let device = CudaDevice::open(driver, 0).expect("open the fake device");
                // Any call makes the device's primary context current on this thread, as the
                // runtime API does for PyTorch: the caller's own driver calls below use it.
                device.mem_info().unwrap();
                Some(DriverCaller {
                    lib,
                    device: Arc::new(device),
                    api: &CUDA,
                })
            }
            #[cfg(not(feature = "cuda"))]
            {
                eprintln!("skipping: built without the cuda feature");
                None
            }
        }

        /// The HIP shim over a private copy of fakehip (256 MiB) as ROCm `version`.
        fn hip(version: i32) -> Option<DriverCaller> {
            #[cfg(feature = "hip")]
            {
                use portalloc::backends::hip::{HipDevice, Runtime};
                let built = built(support::driver("fakehip"), "fakehip")?;
                let lib = Library::copy_of(built);
                let reset: unsafe extern "C" fn() = lib.sym("fakehip_reset");
                let set_version: unsafe extern "C" fn(c_int) = lib.sym("fakehip_set_version");
                let set_devices: unsafe extern "C" fn(c_int, u64) = lib.sym("fakehip_set_devices");
                // SAFETY: control functions with plain values.
                unsafe {
                    reset();
                    set_version(version);
                    set_devices(1, 256 * MIB);
                }
                let runtime = Arc::new(Runtime::load(&[lib.path()]).expect("fakehip loads"));
                let device = HipDevice::open(runtime, 0).expect("open the fake device");
                Some(DriverCaller {
                    lib,
                    device: Arc::new(device),
                    api: &HIP,
                })
            }
            #[cfg(not(feature = "hip"))]
            {
                let _ = version;
                eprintln!("skipping: built without the hip feature");
                None
            }
        }

        fn count(&self, what: &str) -> i64 {
            let f: unsafe extern "C" fn(*const std::ffi::c_char) -> i64 =
                self.lib.sym(self.api.count);
            let name = CString::new(what).unwrap();
            // SAFETY: a valid C string.
            unsafe { f(name.as_ptr()) }
        }
    }

    impl Caller for DriverCaller {
        fn device(&self) -> Arc<dyn Device> {
            Arc::clone(&self.device)
        }
        fn stream(&self) -> Stream {
            let create: Create = self.lib.sym(self.api.stream_create);
            let mut s = std::ptr::null_mut();
            // SAFETY: one handle written; flags 0 = a blocking stream.
            assert_eq!(
                unsafe { create(&mut s, 0) },
                0,
                "{}",
                self.api.stream_create
            );
            Stream::from_raw(s as u64)
        }
        fn hold(&self, on: bool) {
            let f: unsafe extern "C" fn(c_int) = self.lib.sym(self.api.hold);
            // SAFETY: a plain value.
            unsafe { f(c_int::from(on)) };
        }
        fn record_work(&self, s: Stream) -> u64 {
            let create: Create = self.lib.sym(self.api.event_create);
            let record: Record = self.lib.sym(self.api.event_record);
            let mut e = std::ptr::null_mut();
            // SAFETY: one handle written; then a live event on a live stream.
            unsafe {
                assert_eq!(
                    create(&mut e, DISABLE_TIMING),
                    0,
                    "{}",
                    self.api.event_create
                );
                assert_eq!(
                    record(e, s.as_raw() as *mut c_void),
                    0,
                    "{}",
                    self.api.event_record
                );
            }
            e as u64
        }
        fn work_done(&self, work: u64) -> bool {
            let query: OnHandle = self.lib.sym(self.api.event_query);
            // SAFETY: a live event of the caller's.
            match unsafe { query(work as *mut c_void) } {
                0 => true,
                NOT_READY => false,
                other => panic!("{}: {other}", self.api.event_query),
            }
        }
        fn finish(&self, streams: &[Stream], works: &[u64]) {
            let destroy_stream: OnHandle = self.lib.sym(self.api.stream_destroy);
            let destroy_event: OnHandle = self.lib.sym(self.api.event_destroy);
            // SAFETY: the caller's own live handles, each destroyed once.
            unsafe {
                for &w in works {
                    assert_eq!(destroy_event(w as *mut c_void), 0);
                }
                for s in streams {
                    assert_eq!(destroy_stream(s.as_raw() as *mut c_void), 0);
                }
            }
            for what in self.api.counted {
                assert_eq!(self.count(what), 0, "the driver still holds {what}");
            }
        }
    }

    #[test]
    fn cuda_foreign_streams() {
        for strategy in ALL {
            let Some(caller) = DriverCaller::cuda() else {
                return;
            };
            no_early_reuse(&caller, strategy);
        }
    }

    #[test_case(50_221_153 ; "rocm 5")]
    #[test_case(60_241_133 ; "rocm 6")]
    #[test_case(70_051_831 ; "rocm 7")]
    fn hip_foreign_streams(version: i32) {
        for strategy in ALL {
            let Some(caller) = DriverCaller::hip(version) else {
                return;
            };
            no_early_reuse(&caller, strategy);
        }
    }

    /// The device refuses to record an event on the caller's stream and to synchronise it (a
    /// stream the caller destroyed, say): the memory is not handed out early — the device is
    /// synchronised instead.
    #[test]
    fn refusals_are_not_idle() {
        let Some(caller) = DriverCaller::cuda() else {
            return;
        };
        for strategy in [Strategy::Bfc, Strategy::Vmm] {
            let a = build(strategy, caller.device()).unwrap();
            let (s, t) = (caller.stream(), caller.stream());
            caller.hold(true);
            let keep = a.allocate(4096, 0, t, "t").unwrap();
            let x = a.allocate(SIZE, 0, s, "x").unwrap();
            let freed = (x.ptr(), x.ptr() + SIZE);
            let work = caller.record_work(s);
            let fail: unsafe extern "C" fn(*const std::ffi::c_char, c_long, c_long, c_int) =
                caller.lib.sym("fake_fail");
            let (record, sync) = (c"cuEventRecord", c"cuStreamSynchronize");
            // SAFETY: valid names; fail the next call of each with CUDA_ERROR_INVALID_HANDLE.
            unsafe {
                fail(record.as_ptr(), 1, 1, 400);
                fail(sync.as_ptr(), 1, 1, 400);
            }
            a.deallocate(x).unwrap();
            assert!(
                caller.work_done(work),
                "{strategy:?}: neither an event nor the stream: the device was synchronised"
            );
            let y = a.allocate(SIZE, 0, t, "t").unwrap();
            assert!(!overlaps(&y, freed) || caller.work_done(work));
            caller.hold(false);
            for z in [keep, y] {
                a.deallocate(z).unwrap();
            }
            a.trim().unwrap();
            drop(a);
            caller.finish(&[s, t], &[work]);
        }
    }

    /// The special handles CUDA and HIP both define — the null stream, the legacy default
    /// stream (0x1) and the per-thread default stream (0x2) — are streams like any other:
    /// events are recorded on them, they are synchronised, pools serve them.
    #[test]
    fn special_handles_are_streams() {
        let callers = [DriverCaller::cuda(), DriverCaller::hip(60_241_133)];
        for caller in callers.into_iter().flatten() {
            let d = caller.device();
            let e = d.create_event().unwrap();
            for s in [Stream::DEFAULT, Stream::LEGACY, Stream::PER_THREAD] {
                caller.hold(true);
                d.record_event(e, s).unwrap();
                assert!(!d.event_complete(e).unwrap(), "{s:?}: held in flight");
                d.synchronize_stream(s).unwrap();
                assert!(d.event_complete(e).unwrap(), "{s:?}: synchronised");
                caller.hold(false);
                if let Some(pool) = d.stream_ordered_pool() {
                    let p = pool.alloc_async(MIB, s).unwrap();
                    pool.free_async(p, s).unwrap();
                }
            }
            d.synchronize_device().unwrap();
            d.destroy_event(e).unwrap();
            caller.finish(&[], &[]);
        }
    }

    /// The CUDA and HIP shims agree with the host device on a free of the wrong size: it is
    /// refused, nothing is freed, and the right size then frees it (#14: CUDA ignored it).
    #[test]
    fn a_free_of_the_wrong_size_is_refused_on_both_shims() {
        let callers = [DriverCaller::cuda(), DriverCaller::hip(60_241_133)];
        for caller in callers.into_iter().flatten() {
            let d = caller.device();
            let p = d.alloc(MIB).unwrap();
            assert!(
                matches!(
                    d.free(p, 2 * MIB),
                    Err(portalloc::Error::InvalidArgument { .. })
                ),
                "{}",
                caller.api.count
            );
            assert_eq!(caller.count("allocations"), 1, "nothing was freed");
            d.free(p, MIB).unwrap();
            caller.finish(&[], &[]);
        }
    }
}
