//! The conformance fakes' control API (`fakes/drivers/fake_core.h` and the concerns it
//! lists, whose comments are the spec; docs/fakes.md) from Rust: one type, [`Fake`], for the drivers of the test kit `portalloc-fakes`
//! (`fakecuda`, `fakecuda_old`, `fakehip`, …), over the kit's [`Controls`] with portalloc's
//! types (streams, events, errors, vendors) and the controls only one driver has.
//!
//! A fake keeps its state per loaded library, so [`Fake::copy`] loads a private copy of the
//! library the kit built — its own instance: tests in one process do not see each other's objects or
//! faults — and the backend under test is pointed at [`Fake::path`]. [`Fake::at`] wraps a
//! library that is already loaded elsewhere (the same path gives the same instance).

use std::ffi::{c_char, c_int, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use portalloc::device::Event;
use portalloc::{Error, Stream, Vendor};
use portalloc_fakes::Controls;

/// The live counts that are device memory, pinned host memory or address space held for a
/// caller: all zero once everything was given back.
pub const MEMORY: &[&str] = &[
    "allocations",
    "pool_allocations",
    "pool_reserved",
    "handles",
    "mappings",
    "reservations",
    "bytes",
    "host_allocations",
];

/// Every name of `fake_live`'s vocabulary both fakes answer.
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
    "host_allocations",
];

/// ROCm 7.0 (HIP 7.0.51831): the personality with every capability (virtual memory, pools).
pub const ROCM7: i32 = 70_051_831;

/// Every profile of fakehip (`fakes/drivers/fakehip.c`'s header says what each models), the
/// default `documented` first: a test that must hold under ROCm as it behaves iterates over
/// them with [`Fake::set_profile`].
pub const FAKEHIP_PROFILES: &[&str] = &[
    "documented",
    "rocm7-reservation-hold",
    "rocm-systems-2516-setaccess-prefix",
    "rocm-systems-7128-reserve-counted",
    "rocr-285-unmap-many",
    "rocm-systems-10604-descriptor-per-handle",
    "rocm-systems-11185-import-host-access",
    "rocm-systems-8440-import-needs-fd",
    "rocm-7.15",
];

/// One loaded conformance fake and its control functions: the common ones through the test
/// kit's [`Controls`], opened on the same path (so the same instance); fakecuda's and fakehip's
/// own, and the vendor calls a test makes as the caller, through [`Fake::sym`].
pub struct Fake {
    library: libloading::Library,
    controls: Controls,
    path: PathBuf,
    vendor: Vendor,
    /// A private copy, removed on drop.
    owned: bool,
}

static COPIES: AtomicU64 = AtomicU64::new(0);

impl Fake {
    /// A private copy of the fake `name` (`fakecuda`, `fakecuda_old`, `fakehip`, …: the
    /// drivers of `portalloc-fakes`, [`super::driver`]).
    ///
    /// # Panics
    /// When `name` is no driver of the kit, or the copy cannot be made or loaded.
    pub fn copy(name: &str) -> Fake {
        let built = super::driver(name);
        let n = COPIES.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "portalloc-{name}-{}-{n}-lib{name}.so",
            std::process::id()
        ));
        std::fs::copy(built, &path).expect("copy the conformance driver");
        let mut fake = Fake::at(path);
        fake.owned = true;
        fake
    }

    /// A private copy of the vendor's current fake with `devices` devices of `capacity` bytes
    /// each, every capability on (fakehip as ROCm 7).
    ///
    /// # Panics
    /// As [`Fake::copy`], and for a vendor without a fake (the host).
    pub fn with_devices(vendor: Vendor, devices: i32, capacity: u64) -> Fake {
        let fake = Fake::copy(match vendor {
            Vendor::Cuda => "fakecuda",
            Vendor::Hip => "fakehip",
            other => panic!("{other:?} has no conformance fake"),
        });
        if vendor == Vendor::Hip {
            let set_version: unsafe extern "C" fn(c_int) = fake.sym("fakehip_set_version");
            // SAFETY: by value.
            unsafe { set_version(ROCM7) }
        }
        fake.set_devices(devices, capacity);
        fake
    }

    /// The fake already built at `path` (not copied, not removed).
    ///
    /// # Panics
    /// When it does not load.
    pub fn at(path: impl Into<PathBuf>) -> Fake {
        let path = path.into();
        let vendor = if path.to_string_lossy().contains("fakehip") {
            Vendor::Hip
        } else {
            Vendor::Cuda
        };
        // SAFETY: our own test library; its initialisers do nothing.
        let library = unsafe { libloading::Library::new(&path) }.expect("load the fake");
        let controls = Controls::open(&path).expect("the fake's controls");
        Fake {
            library,
            controls,
            path,
            vendor,
            owned: false,
        }
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

    /// Calls `nth` .. `nth + count - 1` of `function` (1-based, counted from now; `count < 0`:
    /// every call from the `nth` on) return `code` (the vendor's status: `CUresult`,
    /// `hipError_t`).
    ///
    /// # Panics
    /// When `code` is no C `int`.
    pub fn fail(&self, function: &str, nth: i64, count: i64, code: impl Into<i64>) {
        let code = c_int::try_from(code.into()).expect("a status code is a C int");
        self.controls.fail(function, nth, count, code);
    }

    /// Disarms every fault.
    pub fn clear_faults(&self) {
        self.controls.clear_faults();
    }

    /// Calls of `function` made so far, failed ones included.
    pub fn calls(&self, function: &str) -> i64 {
        self.controls.calls(function)
    }

    /// The fake's live count of `what` (the vocabulary of `fake_modules.h`'s census).
    ///
    /// # Panics
    /// When this fake does not answer `what`.
    pub fn live(&self, what: &str) -> i64 {
        let n = self.controls.live(what);
        n.unwrap_or_else(|| panic!("{} does not count {what}", self.path()))
    }

    /// The non-zero counts among `names`.
    pub fn nonzero(&self, names: &[&'static str]) -> Vec<(&'static str, i64)> {
        names
            .iter()
            .map(|&w| (w, self.live(w)))
            .filter(|&(_, n)| n != 0)
            .collect()
    }

    /// Asserts that the fake holds nothing for anyone: every count of [`LIVE`] (and, for
    /// CUDA, primary-context references) is zero.
    ///
    /// # Panics
    /// When something is still held.
    pub fn assert_empty(&self) {
        let mut names = LIVE.to_vec();
        if self.vendor == Vendor::Cuda {
            names.push("contexts");
        }
        let held = self.nonzero(&names);
        assert!(held.is_empty(), "the fake still holds {held:?}");
    }

    /// Declares whether `device` can access `peer`'s memory (default: yes, for distinct
    /// devices).
    pub fn set_peer(&self, device: i32, peer: i32, can: bool) {
        let f: unsafe extern "C" fn(c_int, c_int, c_int) = self.sym("fake_set_peer");
        // SAFETY: by value.
        unsafe { f(device, peer, c_int::from(can)) }
    }

    /// Whether peer access from `device` to `peer` was enabled through the vendor call.
    pub fn peer_enabled(&self, device: i32, peer: i32) -> bool {
        let f: unsafe extern "C" fn(c_int, c_int) -> c_int = self.sym("fake_peer_enabled");
        // SAFETY: by value.
        unsafe { f(device, peer) != 0 }
    }

    /// Whether the mapping holding `va` grants `device` access; `None` when no mapping holds
    /// `va`.
    pub fn access(&self, va: u64, device: i32) -> Option<bool> {
        let f: unsafe extern "C" fn(u64, c_int) -> c_int = self.sym("fake_access");
        // SAFETY: by value.
        match unsafe { f(va, device) } {
            n if n < 0 => None,
            n => Some(n != 0),
        }
    }

    /// Makes fakehip behave as the profiles `names` (comma-separated, [`FAKEHIP_PROFILES`])
    /// from now on, until changed or reset.
    ///
    /// # Errors
    /// When a name is unknown (nothing changes then).
    ///
    /// # Panics
    /// On fakecuda, which has no profiles.
    pub fn set_profile(&self, names: &str) -> Result<(), String> {
        assert_eq!(self.vendor, Vendor::Hip, "only fakehip has profiles");
        let f: unsafe extern "C" fn(*const c_char) -> c_int = self.sym("fakehip_set_profile");
        let c = CString::new(names).map_err(|e| e.to_string())?;
        // SAFETY: a NUL-terminated list the fake reads during the call.
        match unsafe { f(c.as_ptr()) } {
            0 => Ok(()),
            rc => Err(format!(
                "fakehip refused the profiles {names:?} (hipError {rc}); it knows {FAKEHIP_PROFILES:?}"
            )),
        }
    }

    /// Bytes fakehip still charges for released handles no mapping holds: what
    /// `rocm7-reservation-hold` keeps until their reservations are freed.
    pub fn held_bytes(&self) -> u64 {
        let f: unsafe extern "C" fn() -> u64 = self.sym("fakehip_held_bytes");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    /// `devices` devices of `capacity` bytes (CUDA: before `cuInit`).
    ///
    /// # Panics
    /// When fakecuda was already initialised.
    pub fn set_devices(&self, devices: i32, capacity: u64) {
        match self.vendor {
            Vendor::Hip => {
                let f: unsafe extern "C" fn(c_int, u64) = self.sym("fakehip_set_devices");
                // SAFETY: by value.
                unsafe { f(devices, capacity) }
            }
            _ => {
                let f: unsafe extern "C" fn(c_int, u64, u64, c_int) -> c_int =
                    self.sym("fakecuda_configure");
                // SAFETY: by value; 0 keeps the granularity and version.
                let rc = unsafe { f(devices, capacity, 0, 0) };
                assert_eq!(rc, 0, "configured before cuInit");
            }
        }
    }

    /// Runs `blocked` on one thread while calls of `function` wait inside the fake
    /// (`fake_pause`: before they touch any state of the fake, so other calls go on), and,
    /// once `blocked` waits there, `meanwhile` on another: `meanwhile` must finish while
    /// `blocked` still waits — a device that holds one of its locks across the driver call
    /// fails this. Then the call goes on; answers what both returned.
    ///
    /// # Panics
    /// When `blocked` does not reach the call, or `meanwhile` does not finish, within 10 s.
    pub fn while_paused<A: Send, B: Send>(
        &self,
        function: &str,
        blocked: impl FnOnce() -> A + Send,
        meanwhile: impl FnOnce() -> B + Send,
    ) -> (A, B) {
        use std::time::{Duration, Instant};

        /// Lets the paused call go on however the test ends, so the threads can be joined.
        struct Resume<'a>(&'a Fake);
        impl Drop for Resume<'_> {
            fn drop(&mut self) {
                let resume: unsafe extern "C" fn() = self.0.sym("fake_resume");
                // SAFETY: no arguments.
                unsafe { resume() }
            }
        }

        let pause: unsafe extern "C" fn(*const c_char) = self.sym("fake_pause");
        let waiting: unsafe extern "C" fn() -> c_int = self.sym("fake_waiting");
        let name = CString::new(function).expect("no NUL in a function name");
        // SAFETY: a NUL-terminated name the fake copies.
        unsafe { pause(name.as_ptr()) };
        std::thread::scope(|scope| {
            let resume = Resume(self);
            let a = scope.spawn(blocked);
            let deadline = Instant::now() + Duration::from_secs(10);
            // SAFETY: no arguments.
            while unsafe { waiting() } == 0 {
                assert!(Instant::now() < deadline, "{function} was never called");
                std::thread::sleep(Duration::from_millis(1));
            }
            let (done, finished) = std::sync::mpsc::channel();
            let b = scope.spawn(move || {
                let b = meanwhile();
                let _ = done.send(());
                b
            });
            assert!(
                finished.recv_timeout(Duration::from_secs(10)).is_ok(),
                "other calls waited for {function}: a lock is held across it"
            );
            // SAFETY: no arguments.
            let still = unsafe { waiting() };
            assert_eq!(still, 1, "{function} is still waiting");
            drop(resume);
            (a.join().unwrap(), b.join().unwrap())
        })
    }

    /// While held, work recorded on streams stays in flight until synchronised or released
    /// ([`Controls::hold`]).
    pub fn hold_events(&self, held: bool) {
        self.controls.hold(held);
    }

    /// Streams and events of `device`, a vendor device over this fake, as the `Device`
    /// contract has them: an event never recorded is complete; one recorded while the fake
    /// holds events is in flight until it, or its stream, is synchronised; the default stream
    /// is not the caller's to destroy; a destroyed event or stream is unknown. `while_live`
    /// runs once the fake stops holding, with the stream and the event still live, for the
    /// vendor's own checks; the stream, destroyed, is returned for its checks of a stale
    /// handle.
    ///
    /// # Panics
    /// When the device does not behave so.
    pub fn check_streams_and_events(
        &self,
        device: &dyn portalloc::Device,
        while_live: impl FnOnce(Stream, Event),
    ) -> Stream {
        let s = device.create_stream().unwrap();
        let e = device.create_event().unwrap();
        assert!(
            device.event_complete(e).unwrap(),
            "never recorded: complete"
        );
        self.hold_events(true);
        device.record_event(e, s).unwrap();
        assert!(!device.event_complete(e).unwrap(), "held in flight");
        device.synchronize_event(e).unwrap();
        assert!(device.event_complete(e).unwrap(), "synchronised itself");
        device.record_event(e, s).unwrap();
        assert!(!device.event_complete(e).unwrap(), "held in flight again");
        device.synchronize_stream(s).unwrap();
        assert!(device.event_complete(e).unwrap(), "its stream synchronised");
        self.hold_events(false);
        while_live(s, e);
        // SAFETY: the default stream is refused before any driver call.
        let default = unsafe { device.destroy_stream(Stream::DEFAULT) };
        assert!(matches!(default, Err(Error::InvalidArgument { .. })));
        device.destroy_event(e).unwrap();
        assert!(matches!(
            device.event_complete(e),
            Err(Error::UnknownPointer { what: "event", .. })
        ));
        // SAFETY: `s` is this device's, with nothing queued on it now (synchronised above).
        unsafe { device.destroy_stream(s) }.unwrap();
        // SAFETY: a stream the device no longer holds is refused before any driver call
        // (what this checks), and no stream was made since that could have its value.
        let again = unsafe { device.destroy_stream(s) };
        assert!(matches!(
            again,
            Err(Error::UnknownPointer { what: "stream", .. })
        ));
        s
    }

    // ---- the timeline: kernels, waits, hazards (fake_timeline.h) ---------------------------

    /// A kernel on `stream` that uses `[va, va + size)`, in flight until [`Fake::finish`] or
    /// a CPU wait that covers it.
    ///
    /// # Panics
    /// When the fake does not know the stream.
    pub fn launch(&self, stream: Stream, va: u64, size: u64) -> u64 {
        let f: unsafe extern "C" fn(*mut std::ffi::c_void, u64, u64) -> u64 =
            self.sym("fake_launch");
        // SAFETY: by value; the fake only looks the handle up.
        let id = unsafe { f(stream.as_raw() as *mut _, va, size) };
        assert_ne!(id, 0, "fake_launch: unknown stream {stream:?}");
        id
    }

    /// A kernel on `stream` that writes (and reads) `[va, va + size)`: work on another
    /// stream that reads or writes it, not ordered after the kernel, is a race the driver
    /// logs.
    ///
    /// # Panics
    /// When the fake does not know the stream.
    pub fn launch_writing(&self, stream: Stream, va: u64, size: u64) -> u64 {
        self.controls
            .launch_writing(stream.as_raw(), va, size)
            .unwrap_or_else(|| panic!("fake_launch_mode: unknown stream {stream:?}"))
            .id()
    }

    /// The kernel completes.
    pub fn finish(&self, kernel: u64) {
        let f: unsafe extern "C" fn(u64) = self.sym("fake_finish");
        // SAFETY: by value.
        unsafe { f(kernel) }
    }

    /// Whether the kernel completed.
    pub fn kernel_done(&self, kernel: u64) -> bool {
        let f: unsafe extern "C" fn(u64) -> c_int = self.sym("fake_kernel_done");
        // SAFETY: by value.
        let done = unsafe { f(kernel) };
        assert!(done >= 0, "unknown kernel {kernel}");
        done == 1
    }

    /// Whether work queued on `stream` from now on runs after the kernel.
    pub fn ordered(&self, kernel: u64, stream: Stream) -> bool {
        let f: unsafe extern "C" fn(u64, *mut std::ffi::c_void) -> c_int = self.sym("fake_ordered");
        // SAFETY: by value; the fake only looks the handle up.
        let ordered = unsafe { f(kernel, stream.as_raw() as *mut _) };
        assert!(ordered >= 0, "unknown kernel {kernel}");
        ordered == 1
    }

    /// How many times memory a kernel still used was freed or unmapped, and the first one.
    pub fn hazards(&self) -> (u64, String) {
        let count = self.controls.hazards() as u64;
        (count, self.controls.first_hazard())
    }

    /// CPU waits (synchronisations) and GPU-side waits (stream-wait-event calls) so far.
    pub fn waits(&self) -> (u64, u64) {
        let gpu: unsafe extern "C" fn() -> i64 = self.sym("fake_gpu_waits");
        // SAFETY: no arguments.
        let gpu = unsafe { gpu() };
        (self.controls.cpu_waits() as u64, gpu as u64)
    }

    // ---- the caller's current context (CUDA) or device (HIP) -------------------------------

    /// The calling thread's current context (CUDA: `cuCtxGetCurrent`, null as 0) or device
    /// (HIP: `hipGetDevice`), as the caller's own driver call answers it.
    #[allow(dead_code)] // tests/capi.rs's
    pub fn current(&self) -> u64 {
        if self.vendor == Vendor::Hip {
            let f: unsafe extern "C" fn(*mut c_int) -> c_int = self.sym("hipGetDevice");
            let mut d: c_int = -1;
            // SAFETY: one int written.
            assert_eq!(unsafe { f(&mut d) }, 0, "hipGetDevice");
            return d as u64;
        }
        let f: unsafe extern "C" fn(*mut *mut std::ffi::c_void) -> c_int =
            self.sym("cuCtxGetCurrent");
        let mut ctx = std::ptr::null_mut();
        // SAFETY: one handle written.
        assert_eq!(unsafe { f(&mut ctx) }, 0, "cuCtxGetCurrent");
        ctx as u64
    }

    /// Makes `current` ([`Fake::current`]'s value) current on the calling thread, with the
    /// caller's own driver call (`cuCtxSetCurrent` / `hipSetDevice`).
    pub fn set_current(&self, current: u64) {
        if self.vendor == Vendor::Hip {
            let f: unsafe extern "C" fn(c_int) -> c_int = self.sym("hipSetDevice");
            // SAFETY: by value.
            assert_eq!(unsafe { f(current as c_int) }, 0, "hipSetDevice");
            return;
        }
        let f: unsafe extern "C" fn(*mut std::ffi::c_void) -> c_int = self.sym("cuCtxSetCurrent");
        // SAFETY: null or a context the caller retained.
        assert_eq!(unsafe { f(current as *mut _) }, 0, "cuCtxSetCurrent");
    }

    /// What a caller (PyTorch's runtime, a C program) makes current to work on `device`: its
    /// primary context, retained (CUDA; release it with [`Fake::release_primary`]), or the
    /// device's ordinal (HIP). CUDA: after `cuInit`.
    pub fn primary(&self, device: i32) -> u64 {
        if self.vendor == Vendor::Hip {
            return device as u64;
        }
        let f: unsafe extern "C" fn(*mut *mut std::ffi::c_void, c_int) -> c_int =
            self.sym("cuDevicePrimaryCtxRetain");
        let mut ctx = std::ptr::null_mut();
        // SAFETY: one handle written; the device by value.
        let rc = unsafe { f(&mut ctx, device) };
        assert_eq!(rc, 0, "cuDevicePrimaryCtxRetain");
        ctx as u64
    }

    /// Undoes one [`Fake::primary`] (CUDA; nothing for HIP).
    pub fn release_primary(&self, device: i32) {
        if self.vendor == Vendor::Hip {
            return;
        }
        // The unsuffixed form: every driver has it (the _v2 one came with CUDA 11).
        let f: unsafe extern "C" fn(c_int) -> c_int = self.sym("cuDevicePrimaryCtxRelease");
        // SAFETY: by value; balances a retain of `primary`.
        assert_eq!(unsafe { f(device) }, 0, "cuDevicePrimaryCtxRelease");
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The vendor error codes the tests inject or expect, with each vendor's name for them.
const ERROR_NAMES: &[(i32, &str, &str)] = &[
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "hipErrorOutOfMemory"),
    (101, "CUDA_ERROR_INVALID_DEVICE", "hipErrorInvalidDevice"),
    (
        217,
        "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        "hipErrorPeerAccessUnsupported",
    ),
    (
        704,
        "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        "hipErrorPeerAccessAlreadyEnabled",
    ),
    (
        705,
        "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        "hipErrorPeerAccessNotEnabled",
    ),
    (801, "CUDA_ERROR_NOT_SUPPORTED", "hipErrorNotSupported"),
    (999, "CUDA_ERROR_UNKNOWN", "hipErrorUnknown"),
];

/// A device type of a vendor backend, opened over a [`Fake`]: what a test body generic over
/// the vendor needs.
pub trait FakeDevice: portalloc::Device + Sized + 'static {
    /// The vendor whose fake serves it.
    const VENDOR: Vendor;

    /// The vendor's name for `code`, one of [`ERROR_NAMES`].
    ///
    /// # Panics
    /// For a code not in the table.
    fn error_name(code: i32) -> &'static str {
        let &(_, cuda, hip) = ERROR_NAMES
            .iter()
            .find(|(c, _, _)| *c == code)
            .unwrap_or_else(|| panic!("no name for error {code}"));
        if Self::VENDOR == Vendor::Cuda {
            cuda
        } else {
            hip
        }
    }

    /// Device `ordinal` of the fake, through the vendor's loader.
    ///
    /// # Panics
    /// When the fake does not load or the device does not open.
    fn open(fake: &Fake, ordinal: u32) -> Self;

    /// Every device of the fake, over one loaded library.
    ///
    /// # Panics
    /// As [`FakeDevice::open`].
    fn open_all(fake: &Fake) -> Vec<Self>;

    /// What the backend still holds in its own books.
    fn vendor_census(&self) -> portalloc::backends::VendorCensus;

    /// Makes the device current on the calling thread and leaves it so, for the test's own
    /// driver calls (portalloc's calls never leave it so).
    fn make_current_for_caller(&self);
}

/// `FakeDevice` for a backend's device type, loading its library type from the fake's path.
macro_rules! fake_device {
    ($feature:literal, $vendor:ident, $device:ty, $library:ty) => {
        #[cfg(feature = $feature)]
        impl FakeDevice for $device {
            const VENDOR: Vendor = Vendor::$vendor;

            fn open(fake: &Fake, ordinal: u32) -> Self {
                let library = <$library>::load(&[fake.path()]).expect("the fake loads");
                Self::open(std::sync::Arc::new(library), ordinal).expect("a fake device opens")
            }

            fn open_all(fake: &Fake) -> Vec<Self> {
                let library = <$library>::load(&[fake.path()]).expect("the fake loads");
                Self::open_all(std::sync::Arc::new(library)).expect("the fake devices open")
            }

            fn vendor_census(&self) -> portalloc::backends::VendorCensus {
                self.census()
            }

            fn make_current_for_caller(&self) {
                self.make_current().expect("the device made current");
            }
        }
    };
}

fake_device!(
    "cuda",
    Cuda,
    portalloc::backends::cuda::CudaDevice,
    portalloc::backends::cuda::Driver
);
fake_device!(
    "hip",
    Hip,
    portalloc::backends::hip::HipDevice,
    portalloc::backends::hip::Runtime
);

/// Writes `byte` at the start, the middle and the end of `a` — memory of a fake driver, which
/// is host memory; the rest stays untouched, so the device's pages are not all made.
pub fn stamp(a: &portalloc::Allocation, byte: u8) {
    for at in [0, a.size() / 2, a.size() - 1] {
        // SAFETY: inside the live allocation, mapped read-write on the fake's host memory.
        unsafe { ((a.ptr() + at) as *mut u8).write_volatile(byte) };
    }
}

/// Whether `a` holds `byte` where [`stamp`] put it.
pub fn stamped(a: &portalloc::Allocation, byte: u8) -> bool {
    [0, a.size() / 2, a.size() - 1].into_iter().all(|at| {
        // SAFETY: as in `stamp`.
        unsafe { ((a.ptr() + at) as *const u8).read_volatile() == byte }
    })
}
