//! The controls every driver exports beside the vendor's API: [`Controls`], what they answer
//! ([`Census`], [`Kernel`]) and what they take ([`Code`], [`Call`]).

use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::profiles::{names, Profile};

/// The version of the control API this crate speaks; a driver of another (one built from
/// other sources, found through [`DIR_VARIABLE`](crate::DIR_VARIABLE)) is refused.
pub const KIT_VERSION: i32 = 4;

/// A kernel held in flight ([`Controls::launch`]), or launched by the code under test
/// (`cuLaunchKernel`, `hipModuleLaunchKernel`: [`Controls::last_kernel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kernel(u64);

impl Kernel {
    /// The driver's number for it (hazard texts name kernels by it).
    pub fn id(self) -> u64 {
        self.0
    }
}

/// The live objects a driver holds for its callers ([`Controls::census`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Plain and managed device allocations.
    pub allocations: i64,
    /// Live allocations from stream-ordered pools.
    pub pool_allocations: i64,
    /// Bytes the pools hold.
    pub pool_reserved: i64,
    /// Created pools (the devices' default pools are not counted).
    pub pools: i64,
    /// Physical memory handles.
    pub handles: i64,
    /// Mappings of handles into reserved ranges.
    pub mappings: i64,
    /// Reserved virtual address ranges.
    pub reservations: i64,
    /// Created streams.
    pub streams: i64,
    /// Created events.
    pub events: i64,
    /// Device memory charged, in bytes.
    pub bytes: i64,
    /// Pinned host memory not freed, and host memory still registered.
    pub host_allocations: i64,
    /// Loaded modules.
    pub modules: i64,
    /// Kernels, host functions, copies and memsets not complete.
    pub in_flight: i64,
    /// CUDA: primary-context retains and created contexts; HIP, which has no context a caller
    /// retains: -1.
    pub contexts: i64,
}

impl Census {
    /// True when no memory, address space or pinned memory is held: everything was given
    /// back.
    pub fn holds_no_memory(&self) -> bool {
        [
            self.allocations,
            self.pool_allocations,
            self.pool_reserved,
            self.handles,
            self.mappings,
            self.reservations,
            self.bytes,
            self.host_allocations,
        ]
        .iter()
        .all(|&n| n == 0)
    }
}

/// A status to inject ([`Controls::fail`]), by what it means: each driver answers it with its
/// vendor's number (`OutOfMemory` is `CUDA_ERROR_OUT_OF_MEMORY` and `hipErrorOutOfMemory`,
/// both 2), or a vendor's raw number.
///
/// ```
/// use portalloc_fakes::Code;
///
/// assert_eq!(Code::from(999), Code::Raw(999));
/// assert_eq!(Code::OutOfMemory.name(), Some("out_of_memory"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// Invalid argument.
    InvalidValue,
    /// Out of (device) memory.
    OutOfMemory,
    /// The driver was not initialised.
    NotInitialized,
    /// No device.
    NoDevice,
    /// An invalid device ordinal.
    InvalidDevice,
    /// An invalid resource handle (stream, event, module).
    InvalidHandle,
    /// A named symbol not found.
    NotFound,
    /// Work not complete.
    NotReady,
    /// An illegal address in a kernel: the context is lost.
    IllegalAddress,
    /// An unspecified launch failure.
    LaunchFailed,
    /// The operation is not supported.
    NotSupported,
    /// An unknown error.
    Unknown,
    /// The vendor's number as it is.
    Raw(i32),
}

impl Code {
    /// The driver's name for it (what `fake_code` takes); `None` for [`Code::Raw`].
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Code::InvalidValue => "invalid_value",
            Code::OutOfMemory => "out_of_memory",
            Code::NotInitialized => "not_initialized",
            Code::NoDevice => "no_device",
            Code::InvalidDevice => "invalid_device",
            Code::InvalidHandle => "invalid_handle",
            Code::NotFound => "not_found",
            Code::NotReady => "not_ready",
            Code::IllegalAddress => "illegal_address",
            Code::LaunchFailed => "launch_failed",
            Code::NotSupported => "not_supported",
            Code::Unknown => "unknown",
            Code::Raw(_) => return None,
        })
    }
}

impl From<i32> for Code {
    fn from(code: i32) -> Code {
        Code::Raw(code)
    }
}

/// A kind of call, whichever of its vendor's calls makes it: what a vendor-neutral fault
/// fails ([`Controls::fail_next`]). Each is a group of the driver's calls (`@alloc`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Call {
    /// Device memory of every kind: plain, stream-ordered, managed, physical handles.
    Allocation,
    /// Device memory given back: frees, stream-ordered frees, releases.
    Free,
    /// Pinned host memory: allocation and registration.
    HostAllocation,
    /// Pinned host memory given back.
    HostFree,
    /// Virtual address ranges.
    Reservation,
    /// Mapping physical memory, and granting access to it.
    Map,
    /// Unmapping.
    Unmap,
    /// Copies, synchronous or not.
    Copy,
    /// Memsets.
    Memset,
    /// Kernel launches and host functions.
    Launch,
    /// CPU waits: stream, event, context and device synchronisation.
    Synchronize,
    /// Stream creation.
    StreamCreation,
    /// Event creation and record.
    Event,
    /// GPU-side waits.
    Wait,
    /// Stream and event queries.
    Query,
    /// Pool management.
    Pool,
    /// Module load and function lookup.
    Module,
}

impl Call {
    /// The driver's name for the group (`@alloc`, ...).
    pub fn group(self) -> &'static str {
        match self {
            Call::Allocation => "@alloc",
            Call::Free => "@free",
            Call::HostAllocation => "@host_alloc",
            Call::HostFree => "@host_free",
            Call::Reservation => "@reserve",
            Call::Map => "@map",
            Call::Unmap => "@unmap",
            Call::Copy => "@copy",
            Call::Memset => "@memset",
            Call::Launch => "@launch",
            Call::Synchronize => "@sync",
            Call::StreamCreation => "@stream",
            Call::Event => "@event",
            Call::Wait => "@wait",
            Call::Query => "@query",
            Call::Pool => "@pool",
            Call::Module => "@module",
        }
    }
}

/// Why [`Controls`] could not be opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum ControlsError {
    /// The library does not load.
    Load {
        /// Its path.
        path: PathBuf,
        /// What the loader said.
        error: libloading::Error,
    },
    /// It loads, and is not one of these drivers: a control is missing.
    NotADriver {
        /// Its path.
        path: PathBuf,
        /// The control it lacks.
        missing: &'static str,
    },
    /// A driver of another version of the kit (built from other sources).
    Version {
        /// Its path.
        path: PathBuf,
        /// The version it speaks.
        found: i32,
    },
    /// No profile names the driver to open ([`Controls::current`] outside a profile).
    NoProfile,
}

impl fmt::Display for ControlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlsError::Load { path, error } => {
                write!(f, "cannot load the fake driver {}: {error}", path.display())
            }
            ControlsError::NotADriver { path, missing } => write!(
                f,
                "{} is not one of the fake drivers: it exports no {missing}",
                path.display()
            ),
            ControlsError::Version { path, found } => write!(
                f,
                "{} speaks version {found} of the kit's controls, this crate version \
                 {KIT_VERSION}: it was built from other sources (PORTALLOC_FAKES_DIR names \
                 another build?)",
                path.display()
            ),
            ControlsError::NoProfile => write!(
                f,
                "this process runs under no profile (PORTALLOC_FAKES_PROFILE is unset): open \
                 the driver by path, or run under each_profile / Profile::apply ({})",
                names()
            ),
        }
    }
}

impl std::error::Error for ControlsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControlsError::Load { error, .. } => Some(error),
            _ => None,
        }
    }
}

/// A kernel model the driver could not read ([`Controls::kernel_model`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    /// The model as given.
    pub model: String,
    /// The 1-based position of the first character that could not be read (0: the name was
    /// refused, or the driver holds too many models).
    pub position: usize,
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.position == 0 {
            return write!(
                f,
                "the kernel model was refused: a name of 1 to 63 bytes, at most 256 models"
            );
        }
        write!(
            f,
            "kernel model {:?}: cannot read from character {} on (accesses are \
             MODE:aN[+OFFSET]:SIZE, MODE r, w or rw, SIZE a product of numbers, iN (an int \
             parameter) and zN (a 64-bit one), e.g. \"r:a0:4*i2 w:a1:4*i2\")",
            self.model, self.position
        )
    }
}

impl std::error::Error for ModelError {}

/// The controls every driver exports beside the vendor's API (`drivers/fake_core.h` and its
/// concerns; `docs/fakes.md` says what each answers): faults, call counts, live objects,
/// kernels in flight and the hazards the race detector logs.
///
/// Open them on the same path the code under test loaded (a profile's
/// [`Profile::library`], or [`Controls::current`]): the same path in one process is the same
/// loaded library, hence the same driver state. The checks that could pass vacuously —
/// [`Controls::census`], [`Controls::hazards`] — refuse a driver the code under test never
/// initialised in this process: it watches another copy.
///
/// ```
/// use portalloc_fakes::{Call, Code, Controls, Driver};
///
/// let driver = Controls::open(Driver::FAKEHIP.path()).unwrap();
/// // The second and third hipMalloc calls from now on fail with hipErrorOutOfMemory.
/// driver.fail("hipMalloc", 2, 2, Code::OutOfMemory);
/// // The next allocation, whichever call makes it, fails.
/// driver.fail_next(Call::Allocation, Code::OutOfMemory);
/// driver.clear_faults();
/// ```
pub struct Controls {
    /// The controls, resolved once at [`Controls::open`]; valid while `_library` is loaded.
    fns: Fns,
    path: PathBuf,
    _library: libloading::Library,
}

/// The control functions, with the C signatures the drivers give them.
#[derive(Clone, Copy)]
struct Fns {
    fail: unsafe extern "C" fn(*const c_char, c_long, c_long, c_int),
    fail_target: unsafe extern "C" fn(*const c_char) -> c_int,
    code: unsafe extern "C" fn(*const c_char) -> c_int,
    export: unsafe extern "C" fn(c_int) -> *const c_char,
    clear_faults: unsafe extern "C" fn(),
    calls: unsafe extern "C" fn(*const c_char) -> i64,
    live: unsafe extern "C" fn(*const c_char) -> i64,
    initialised: unsafe extern "C" fn() -> c_int,
    launch: unsafe extern "C" fn(*mut c_void, u64, u64, c_int) -> u64,
    finish: unsafe extern "C" fn(u64),
    finish_all: unsafe extern "C" fn(),
    last_kernel: unsafe extern "C" fn() -> u64,
    kernel_done: unsafe extern "C" fn(u64) -> c_int,
    ordered: unsafe extern "C" fn(u64, *mut c_void) -> c_int,
    streams_ordered: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    in_flight: unsafe extern "C" fn() -> i64,
    hold: unsafe extern "C" fn(c_int),
    query_patience: unsafe extern "C" fn(c_int) -> c_int,
    kernel_model: unsafe extern "C" fn(*const c_char, *const c_char) -> c_int,
    hazards: unsafe extern "C" fn() -> i64,
    hazard: unsafe extern "C" fn(i64) -> *const c_char,
    cpu_waits: unsafe extern "C" fn() -> i64,
    gpu_waits: unsafe extern "C" fn() -> i64,
    capture_invalidations: unsafe extern "C" fn(*mut c_char, u64) -> i64,
    graph_launches: unsafe extern "C" fn(u64) -> i64,
}

impl fmt::Debug for Controls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controls")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A C string of `text`.
#[track_caller]
fn c_name(what: &str, text: &str) -> CString {
    CString::new(text).unwrap_or_else(|_| panic!("{what}: a name without NUL, not {text:.64?}"))
}

impl Controls {
    /// The controls of the driver at `path` (loaded, or already loaded in this process).
    ///
    /// # Errors
    /// When the library does not load, lacks one of the controls (not one of these drivers:
    /// the error names the missing symbol), or speaks another version of them.
    pub fn open(path: impl AsRef<Path>) -> Result<Controls, ControlsError> {
        let path = path.as_ref().to_path_buf();
        // SAFETY: loading one of this crate's drivers runs no initialiser of consequence
        // (their state starts zeroed and is set up on first call).
        let library =
            unsafe { libloading::Library::new(&path) }.map_err(|error| ControlsError::Load {
                path: path.clone(),
                error,
            })?;
        macro_rules! get {
            ($name:literal) => {
                // SAFETY: each symbol is given the signature the drivers declare for it; the
                // pointers are used only while `library` (kept in the Controls) stays loaded.
                *unsafe { library.get(concat!($name, "\0").as_bytes()) }.map_err(|_| {
                    ControlsError::NotADriver {
                        path: path.clone(),
                        missing: $name,
                    }
                })?
            };
        }
        let version: unsafe extern "C" fn() -> c_int = get!("fake_kit_version");
        // SAFETY: the drivers' signature, no argument.
        let found = unsafe { version() };
        if found != KIT_VERSION {
            return Err(ControlsError::Version { path, found });
        }
        let fns = Fns {
            fail: get!("fake_fail"),
            fail_target: get!("fake_fail_target"),
            code: get!("fake_code"),
            export: get!("fake_export"),
            clear_faults: get!("fake_clear_faults"),
            calls: get!("fake_calls"),
            live: get!("fake_live"),
            initialised: get!("fake_initialised"),
            launch: get!("fake_launch_mode"),
            finish: get!("fake_finish"),
            finish_all: get!("fake_finish_all"),
            last_kernel: get!("fake_last_kernel"),
            kernel_done: get!("fake_kernel_done"),
            ordered: get!("fake_ordered"),
            streams_ordered: get!("fake_streams_ordered"),
            in_flight: get!("fake_in_flight"),
            hold: get!("fake_hold"),
            query_patience: get!("fake_query_patience"),
            kernel_model: get!("fake_kernel_model"),
            hazards: get!("fake_hazards"),
            hazard: get!("fake_hazard"),
            cpu_waits: get!("fake_cpu_waits"),
            gpu_waits: get!("fake_gpu_waits"),
            capture_invalidations: get!("fake_capture_invalidations"),
            graph_launches: get!("fake_graph_launches"),
        };
        Ok(Controls {
            fns,
            path,
            _library: library,
        })
    }

    /// The controls of the driver of the profile this process runs under
    /// ([`Profile::current`]): the library the profile's environment names, so the one the
    /// code under test loads.
    ///
    /// # Errors
    /// [`ControlsError::NoProfile`] outside a profile; else as [`Controls::open`].
    pub fn current() -> Result<Controls, ControlsError> {
        let profile = Profile::current().ok_or(ControlsError::NoProfile)?;
        Controls::open(profile.library())
    }

    /// The library these controls belong to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every call the driver exports (what [`Controls::fail`] takes, with the groups of
    /// [`Call`]).
    pub fn exports(&self) -> Vec<String> {
        (0..)
            .map_while(|i| {
                // SAFETY: the drivers' signature; a static string or NULL past the last.
                let p = unsafe { (self.fns.export)(i) };
                // SAFETY: a NUL-terminated static string of the driver's.
                (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            })
            .collect()
    }

    /// The driver's number for `code`.
    ///
    /// # Panics
    /// When the driver has no such code (a code of the other vendor's only).
    #[track_caller]
    pub fn code(&self, code: impl Into<Code>) -> i32 {
        let code = code.into();
        let Some(name) = code.name() else {
            let Code::Raw(n) = code else { unreachable!() };
            return n;
        };
        let name = c_name("code", name);
        // SAFETY: the drivers' signature; the name outlives the call.
        let n = unsafe { (self.fns.code)(name.as_ptr()) };
        assert!(n >= 0, "{} has no code for {code:?}", self.path.display());
        n
    }

    /// Calls `nth .. nth + count - 1` of `function` (1-based, counted from now) fail with
    /// `code`, doing nothing; `count < 0`: every call from the nth on, until
    /// [`Controls::clear_faults`]. `function` is a call the driver exports
    /// ([`Controls::exports`]) or a group of them (`@alloc`, ... as [`Call::group`] names
    /// them), counted across its calls. At most 32 faults are armed at once (a fault's slot
    /// is free again after its last failing call); the driver aborts the process, saying why,
    /// when one more is armed.
    ///
    /// # Panics
    /// When `function` is neither an exported call nor a group (a fault on it would never
    /// fire: the message lists the calls of that name's family), or holds a NUL byte; when
    /// `code` is a name the driver has no number for.
    #[track_caller]
    pub fn fail(&self, function: &str, nth: i64, count: i64, code: impl Into<Code>) {
        assert!(
            (1..64).contains(&function.len()),
            "fail: a function name of 1 to 63 bytes, not {}",
            function.len()
        );
        let name = c_name("fail", function);
        // SAFETY: the drivers' signature; the name outlives the call.
        if unsafe { (self.fns.fail_target)(name.as_ptr()) } == 0 {
            let stem: String = function.chars().take(5).collect();
            let like: Vec<String> = self
                .exports()
                .into_iter()
                .filter(|e| e.starts_with(&stem))
                .take(12)
                .collect();
            panic!(
                "fail: {} exports no call {function:.64} and it is no group (@alloc, @free, \
                 @copy, ...), so the fault would never fire; calls of its family: {}",
                self.path.display(),
                if like.is_empty() {
                    "none".to_string()
                } else {
                    like.join(", ")
                }
            );
        }
        let code = self.code(code);
        // SAFETY: the drivers' signature; the name outlives the call (the driver copies it).
        unsafe { (self.fns.fail)(name.as_ptr(), nth as c_long, count as c_long, code) }
    }

    /// The next call of kind `call`, whichever vendor call makes it, fails with `code`.
    ///
    /// # Panics
    /// As [`Controls::fail`].
    #[track_caller]
    pub fn fail_next(&self, call: Call, code: impl Into<Code>) {
        self.fail(call.group(), 1, 1, code);
    }

    /// Disarms every fault.
    pub fn clear_faults(&self) {
        // SAFETY: the drivers' signature.
        unsafe { (self.fns.clear_faults)() }
    }

    /// How many times the vendor function `function` was called (failed calls included);
    /// 0 for one the driver does not export.
    ///
    /// # Panics
    /// When `function` holds a NUL byte.
    #[track_caller]
    pub fn calls(&self, function: &str) -> i64 {
        let name = c_name("calls", function);
        // SAFETY: the drivers' signature; the name outlives the call.
        unsafe { (self.fns.calls)(name.as_ptr()) }
    }

    /// Whether the code under test initialised this driver in this process (`cuInit`, or any
    /// HIP call): false means it loaded another copy, and whatever this driver counts says
    /// nothing about it.
    pub fn initialised(&self) -> bool {
        // SAFETY: the drivers' signature.
        unsafe { (self.fns.initialised)() != 0 }
    }

    #[track_caller]
    fn require_initialised(&self, what: &str) {
        assert!(
            self.initialised(),
            "{what}: the driver at {} was never initialised in this process, so it is not the \
             one the code under test loaded (another copy, or another path to it?); open the \
             profile's library (Profile::library, Controls::current)",
            self.path.display()
        );
    }

    /// The live count `what` of the driver's vocabulary (`allocations`, `handles`, …, see
    /// [`Census`]); `None` for a name it does not know. Raw: it does not ask whether the
    /// driver was initialised.
    ///
    /// # Panics
    /// When `what` holds a NUL byte.
    #[track_caller]
    pub fn live(&self, what: &str) -> Option<i64> {
        let name = c_name("live", what);
        // SAFETY: the drivers' signature; the name outlives the call.
        let n = unsafe { (self.fns.live)(name.as_ptr()) };
        (n >= 0).then_some(n)
    }

    /// Every live count that is memory or an object held for a caller.
    ///
    /// ```
    /// use portalloc_fakes::{Controls, Driver};
    ///
    /// let driver = Controls::open(Driver::FAKEHIP.path()).unwrap();
    /// // What the code under test does first (HIP initialises on its first call).
    /// # unsafe {
    /// #     let lib = libloading::Library::new(Driver::FAKEHIP.path()).unwrap();
    /// #     let count: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> i32> =
    /// #         lib.get(b"hipGetDeviceCount\0").unwrap();
    /// #     let mut n = 0;
    /// #     assert_eq!(count(&mut n), 0);
    /// # }
    /// let census = driver.census();
    /// assert_eq!(census.allocations, 0);
    /// assert!(census.holds_no_memory());
    /// ```
    ///
    /// # Panics
    /// When the driver was never initialised in this process ([`Controls::initialised`]).
    #[track_caller]
    pub fn census(&self) -> Census {
        self.require_initialised("census");
        let n = |what: &str| self.live(what).unwrap_or(0);
        Census {
            allocations: n("allocations"),
            pool_allocations: n("pool_allocations"),
            pool_reserved: n("pool_reserved"),
            pools: n("pools"),
            handles: n("handles"),
            mappings: n("mappings"),
            reservations: n("reservations"),
            streams: n("streams"),
            events: n("events"),
            bytes: n("bytes"),
            host_allocations: n("host_allocations"),
            modules: n("modules"),
            in_flight: n("in_flight"),
            contexts: self.live("contexts").unwrap_or(-1),
        }
    }

    /// A kernel on `stream` (the vendor's stream handle as an integer; 0 is the null stream)
    /// that reads `[va, va + size)`: in flight, holding back the work queued after it on its
    /// stream, until [`Controls::finish`] or a CPU wait that covers it. `None` for an unknown
    /// stream. A write into the range from another stream, not ordered after the kernel, is a
    /// race the driver logs.
    ///
    /// ```
    /// use portalloc_fakes::{Controls, Driver};
    ///
    /// let driver = Controls::open(Driver::FAKEHIP.path()).unwrap();
    /// // A kernel on the null stream over a range; nothing is written under it here.
    /// let kernel = driver.launch(0, 0x7000_0000, 4096).unwrap();
    /// assert!(!driver.done(kernel));
    /// driver.finish(kernel);
    /// assert!(driver.done(kernel));
    /// ```
    pub fn launch(&self, stream: u64, va: u64, size: u64) -> Option<Kernel> {
        self.launch_with(stream, va, size, false)
    }

    /// As [`Controls::launch`], a kernel that also writes the range (a read of it from
    /// another stream is a race too).
    pub fn launch_writing(&self, stream: u64, va: u64, size: u64) -> Option<Kernel> {
        self.launch_with(stream, va, size, true)
    }

    fn launch_with(&self, stream: u64, va: u64, size: u64, writes: bool) -> Option<Kernel> {
        let mode = if writes { 3 } else { 1 };
        // SAFETY: the drivers' signature; the stream is passed as the handle value it is.
        let id = unsafe { (self.fns.launch)(stream as usize as *mut c_void, va, size, mode) };
        (id != 0).then_some(Kernel(id))
    }

    /// Says what kernel `name` reads and writes, once for every launch of a function of that
    /// name (`cuLaunchKernel`, `hipModuleLaunchKernel`, `hipLaunchKernel`): the driver cannot
    /// know. A model is accesses separated by spaces, each `MODE:aN[+OFFSET]:SIZE` — `MODE`
    /// `r`, `w` or `rw`; `aN` parameter N, a device pointer; `SIZE` a product of numbers, `iN`
    /// (parameter N as an int) and `zN` (as a 64-bit size). A function without a model uses no
    /// memory the driver knows of.
    ///
    /// ```
    /// use portalloc_fakes::{Controls, Driver};
    ///
    /// let driver = Controls::open(Driver::FAKECUDA.path()).unwrap();
    /// // scale(const float *x, float *y, int n)
    /// driver.kernel_model("scale", "r:a0:4*i2 w:a1:4*i2").unwrap();
    /// assert!(driver.kernel_model("scale", "r:x0:4").is_err());
    /// ```
    ///
    /// # Errors
    /// A model it cannot read (the position of the first character it could not), a name
    /// of no or 64+ bytes, or more than 256 models.
    ///
    /// # Panics
    /// When `name` or `model` holds a NUL byte.
    #[track_caller]
    pub fn kernel_model(&self, name: &str, model: &str) -> Result<(), ModelError> {
        let (n, m) = (c_name("kernel_model", name), c_name("kernel_model", model));
        // SAFETY: the drivers' signature; both strings outlive the call.
        let rc = unsafe { (self.fns.kernel_model)(n.as_ptr(), m.as_ptr()) };
        match rc {
            0 => Ok(()),
            p if p > 0 => Err(ModelError {
                model: model.to_string(),
                position: p as usize,
            }),
            _ => Err(ModelError {
                model: model.to_string(),
                position: 0,
            }),
        }
    }

    /// The kernel completes.
    pub fn finish(&self, kernel: Kernel) {
        // SAFETY: the drivers' signature.
        unsafe { (self.fns.finish)(kernel.0) }
    }

    /// Every kernel in flight completes and every host function runs: the GPU catches up
    /// (no CPU wait is counted).
    pub fn finish_all(&self) {
        // SAFETY: the drivers' signature.
        unsafe { (self.fns.finish_all)() }
    }

    /// The last kernel the calling thread launched, through the vendor's calls or
    /// [`Controls::launch`].
    pub fn last_kernel(&self) -> Option<Kernel> {
        // SAFETY: the drivers' signature.
        let id = unsafe { (self.fns.last_kernel)() };
        (id != 0).then_some(Kernel(id))
    }

    /// Whether the kernel completed ([`Controls::finish`], or a CPU wait that covered it).
    ///
    /// # Panics
    /// When this driver knows no such kernel (one another driver launched).
    #[track_caller]
    pub fn done(&self, kernel: Kernel) -> bool {
        // SAFETY: the drivers' signature.
        let done = unsafe { (self.fns.kernel_done)(kernel.0) };
        assert!(
            done >= 0,
            "kernel {} is not one this driver launched",
            kernel.0
        );
        done == 1
    }

    /// Whether work queued on `stream` from now on runs after `kernel`: it completed, it is on
    /// that stream, or the stream waits for it on the GPU (an event recorded after it and a
    /// stream-wait on it, directly or through other streams, the legacy default stream's
    /// implicit waits included).
    ///
    /// # Panics
    /// When the driver knows no such kernel or stream.
    #[track_caller]
    pub fn ordered(&self, kernel: Kernel, stream: u64) -> bool {
        // SAFETY: the drivers' signature; the stream is passed as the handle value it is.
        let ordered = unsafe { (self.fns.ordered)(kernel.0, stream as usize as *mut c_void) };
        assert!(
            ordered >= 0,
            "ordered: the driver knows no kernel {} or stream {stream:#x}",
            kernel.0
        );
        ordered == 1
    }

    /// Whether everything queued so far on `first` runs before what is queued next on `then`.
    ///
    /// # Panics
    /// When the driver knows either stream not.
    #[track_caller]
    pub fn streams_ordered(&self, first: u64, then: u64) -> bool {
        // SAFETY: the drivers' signature; the streams are passed as the handle values they
        // are.
        let ordered = unsafe {
            (self.fns.streams_ordered)(first as usize as *mut c_void, then as usize as *mut c_void)
        };
        assert!(
            ordered >= 0,
            "streams_ordered: the driver knows no stream {first:#x} or {then:#x}"
        );
        ordered == 1
    }

    /// Kernels, host functions, copies and memsets not complete.
    pub fn in_flight(&self) -> i64 {
        // SAFETY: the drivers' signature.
        unsafe { (self.fns.in_flight)() }
    }

    /// While held (`true`), nothing completes that a CPU wait does not force: every copy,
    /// memset and kernel stays in flight until the code under test synchronises. Without it,
    /// work completes as soon as nothing queued before it holds it back, so a wait missing
    /// after a copy is seen only when a kernel held in flight comes first; held, such a race is
    /// seen whatever came first (an upload not waited for before the kernel that reads it).
    /// Releasing (`false`) completes everything, in stream order.
    ///
    /// ```
    /// use portalloc_fakes::{Controls, Driver};
    ///
    /// let driver = Controls::open(Driver::FAKECUDA.path()).unwrap();
    /// driver.hold(true);
    /// // ... the code under test: its copies stay in flight until it synchronises
    /// driver.hold(false);
    /// ```
    pub fn hold(&self, held: bool) {
        // SAFETY: the drivers' signature.
        unsafe { (self.fns.hold)(c_int::from(held)) }
    }

    /// How many times in a row a stream or event may be queried "not ready" before the query
    /// completes what it waits for, as a CPU wait would (no time passes on the fakes, so a
    /// polling loop behind a kernel the test holds would spin for ever); `0`: never. Answers
    /// the previous value (the drivers start at 1000).
    pub fn query_patience(&self, queries: u32) -> u32 {
        let n = c_int::try_from(queries).unwrap_or(c_int::MAX);
        // SAFETY: the drivers' signature.
        let old = unsafe { (self.fns.query_patience)(n) };
        u32::try_from(old).unwrap_or(0)
    }

    /// How many hazards the driver logged: memory freed, unmapped or given back while an
    /// operation in flight used it, an operation queued over memory another stream's work in
    /// flight writes (or reads, when it writes) with nothing ordering them, memory handed out
    /// under such work, a CPU access to pinned memory a copy had yet to write. Undefined
    /// behaviour on a GPU, each.
    ///
    /// # Panics
    /// When the driver was never initialised in this process ([`Controls::initialised`]).
    #[track_caller]
    pub fn hazards(&self) -> i64 {
        self.require_initialised("hazards");
        // SAFETY: the drivers' signature.
        unsafe { (self.fns.hazards)() }
    }

    /// What the first hazard was (empty when there was none).
    pub fn first_hazard(&self) -> String {
        self.hazard_log().into_iter().next().unwrap_or_default()
    }

    /// The hazards' texts, each naming the operations, their streams and ranges (the first 64
    /// are kept).
    pub fn hazard_log(&self) -> Vec<String> {
        (0..)
            .map_while(|i| {
                // SAFETY: the drivers' signature; a NUL-terminated buffer of the driver's, or
                // NULL past the last.
                let p = unsafe { (self.fns.hazard)(i) };
                // SAFETY: as above.
                (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            })
            .collect()
    }

    /// CPU waits so far: stream, event, context and device synchronisations, and the calls
    /// the vendors document as synchronising (`cuMemFree`, `hipFree`, synchronous copies).
    pub fn cpu_waits(&self) -> i64 {
        // SAFETY: the drivers' signature.
        unsafe { (self.fns.cpu_waits)() }
    }

    /// GPU-side waits the caller asked for (`cuStreamWaitEvent`, `hipStreamWaitEvent`).
    pub fn gpu_waits(&self) -> i64 {
        // SAFETY: the drivers' signature.
        unsafe { (self.fns.gpu_waits)() }
    }

    /// Stream captures invalidated since the driver's last reset — by a call the capture
    /// forbids, a query of an event recorded in it, an operation the fake does not capture, or
    /// a fork not joined back — and why the last one was (empty when none was).
    pub fn capture_invalidations(&self) -> (i64, String) {
        let mut why = [0 as c_char; 256];
        // SAFETY: the drivers' signature; at most `why.len()` bytes written, NUL-terminated.
        let n = unsafe { (self.fns.capture_invalidations)(why.as_mut_ptr(), why.len() as u64) };
        // SAFETY: NUL-terminated within the buffer (the driver's snprintf).
        let text = unsafe { CStr::from_ptr(why.as_ptr()) };
        (n, text.to_string_lossy().into_owned())
    }

    /// How many times the executable graph `exec` (`cuGraphLaunch` / `hipGraphLaunch`'s
    /// handle) was launched; `None` for a handle that names none.
    pub fn graph_launches(&self, exec: u64) -> Option<i64> {
        // SAFETY: the drivers' signature; any value is a valid argument.
        let n = unsafe { (self.fns.graph_launches)(exec) };
        (n >= 0).then_some(n)
    }
}
