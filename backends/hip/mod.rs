//! The HIP backend: AMD's runtime (`libamdhip64.so.{7,6,5}`), loaded at run time.
//!
//! * [`Runtime`]: find and load the library, resolve the symbols (required ones →
//!   [`Error::MissingSymbol`], newer ones → `None`), and turn every `hipError_t` into a
//!   [`Result`] with HIP's own names (`hipErrorNoDevice`).
//! * [`HipDevice`]: the [`crate::Device`] trait over it, one per device ordinal, with the AMD
//!   tuning described in [`tuning`].
//! * [`probe`]: what discovery reports: library, versions, devices, or HIP's error.
//!
//! # Symbols
//!
//! | group | HIP | resolved |
//! |---|---|---|
//! | [`REQUIRED_SYMBOLS`] | ≤ 4.2 | at load; missing → [`Error::MissingSymbol`] |
//! | [`VMM_SYMBOLS`] | 5.1 | whole group or nothing; VMM is also gated on ROCm ≥ 7 |
//! | [`POOL_SYMBOLS`] | 5.1 | whole group or nothing |
//! | `hipGetDevicePropertiesR0600` | 6.0 | optional: the architecture name on ROCm ≥ 6 |
//! | `hipGetDeviceProperties` | 4.2 | optional: the architecture name on ROCm 5 (5.x layout) |
//!
//! HIP 5.2.3, the runtime Debian ships, exports every symbol but `hipGetDevicePropertiesR0600`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;

use libloading::Library;
use portalloc_sys::hip as sys;

use super::loader;
use super::Probe;
use crate::device::Vendor;
use crate::error::{Error, Result};

mod device;
pub mod tuning;

pub use device::{HipCensus, HipDevice, HipDeviceBuilder, MemoryKind};

/// The backend's name in errors.
const BACKEND: &str = "hip";

/// The variable that names the HIP library to load instead of searching.
pub const LIBRARY_VARIABLE: &str = "PORTALLOC_HIP_LIBRARY";

/// Library file names, newest ROCm first.
const SONAMES: [&str; 3] = ["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"];

/// Where to look, in order: `PORTALLOC_HIP_LIBRARY` alone if set; else each of
/// `libamdhip64.so.7`, `.6`, `.5` under `$ROCM_PATH/lib`, `$HIP_PATH/lib`, `/opt/rocm/lib`;
/// then the same names through the loader's search path.
///
/// # Errors
/// [`Error::Config`] when one of those variables is not UTF-8.
pub fn library_candidates() -> Result<Vec<String>> {
    if let Some(path) = crate::config::env_var(LIBRARY_VARIABLE)? {
        if !path.is_empty() {
            return Ok(vec![path]);
        }
    }
    let mut dirs: Vec<String> = Vec::new();
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Some(root) = crate::config::env_var(var)? {
            if !root.is_empty() {
                dirs.push(format!("{}/lib", root.trim_end_matches('/')));
            }
        }
    }
    dirs.push("/opt/rocm/lib".into());
    let mut candidates = Vec::new();
    for soname in SONAMES {
        for dir in &dirs {
            let path = format!("{dir}/{soname}");
            if std::path::Path::new(&path).exists() {
                candidates.push(path);
            }
        }
    }
    candidates.extend(SONAMES.iter().map(|s| s.to_string()));
    Ok(candidates)
}

/// The required symbols, in the order [`Runtime::load`] resolves them (all in HIP ≤ 4.2).
pub const REQUIRED_SYMBOLS: [&str; 23] = [
    "hipInit",
    "hipDriverGetVersion",
    "hipRuntimeGetVersion",
    "hipGetDeviceCount",
    "hipSetDevice",
    "hipDeviceGetAttribute",
    "hipDeviceGetName",
    "hipDeviceTotalMem",
    "hipGetErrorName",
    "hipGetErrorString",
    "hipMemGetInfo",
    "hipMalloc",
    "hipFree",
    "hipExtMallocWithFlags",
    "hipStreamCreateWithFlags",
    "hipStreamDestroy",
    "hipStreamSynchronize",
    "hipDeviceSynchronize",
    "hipEventCreateWithFlags",
    "hipEventRecord",
    "hipEventQuery",
    "hipEventSynchronize",
    "hipEventDestroy",
];

/// The virtual-memory symbols (HIP 5.1), in [`Runtime::symbols`] order.
pub const VMM_SYMBOLS: [&str; 8] = [
    "hipMemGetAllocationGranularity",
    "hipMemCreate",
    "hipMemRelease",
    "hipMemAddressReserve",
    "hipMemAddressFree",
    "hipMemMap",
    "hipMemUnmap",
    "hipMemSetAccess",
];

/// The stream-ordered pool symbols (HIP 5.1), in [`Runtime::symbols`] order.
pub const POOL_SYMBOLS: [&str; 8] = [
    "hipDeviceGetDefaultMemPool",
    "hipMemPoolCreate",
    "hipMemPoolDestroy",
    "hipMemPoolSetAttribute",
    "hipMemPoolGetAttribute",
    "hipMemPoolTrimTo",
    "hipMallocFromPoolAsync",
    "hipFreeAsync",
];

/// The optional single symbols, in [`Runtime::symbols`] order.
pub const OPTIONAL_SYMBOLS: [&str; 2] = ["hipGetDevicePropertiesR0600", "hipGetDeviceProperties"];

/// A HIP version as `hipRuntimeGetVersion` encodes it: `major * 10_000_000 + minor * 100_000
/// + patch` (6.2.41133 is 60_241_133).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HipVersion(pub i32);

impl HipVersion {
    /// The major release (ROCm 5, 6, 7).
    pub fn major(self) -> i32 {
        self.0 / 10_000_000
    }

    /// The minor release.
    pub fn minor(self) -> i32 {
        (self.0 / 100_000) % 100
    }

    /// The patch (HIP's build number).
    pub fn patch(self) -> i32 {
        self.0 % 100_000
    }
}

impl fmt::Display for HipVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.patch())
    }
}

/// HIP encodes versions as `major * 10_000_000 + minor * 100_000 + patch`.
pub fn decode_version(v: i32) -> String {
    HipVersion(v).to_string()
}

struct Vmm {
    granularity: sys::hipMemGetAllocationGranularity,
    create: sys::hipMemCreate,
    release: sys::hipMemRelease,
    reserve: sys::hipMemAddressReserve,
    address_free: sys::hipMemAddressFree,
    map: sys::hipMemMap,
    unmap: sys::hipMemUnmap,
    set_access: sys::hipMemSetAccess,
}

struct Pools {
    default_pool: sys::hipDeviceGetDefaultMemPool,
    create: sys::hipMemPoolCreate,
    destroy: sys::hipMemPoolDestroy,
    set_attribute: sys::hipMemPoolSetAttribute,
    get_attribute: sys::hipMemPoolGetAttribute,
    trim_to: sys::hipMemPoolTrimTo,
    malloc_async: sys::hipMallocFromPoolAsync,
    free_async: sys::hipFreeAsync,
}

/// The loaded HIP runtime and its entry points: the result layer, where every `hipError_t`
/// becomes a [`Result`].
///
/// Calls that take a stream, event, pool or physical handle are `unsafe` and crate-private:
/// the runtime dereferences those handles, so only [`HipDevice`], which hands them out and
/// checks them against its books, passes them. Calls that depend on the current device are
/// made by [`HipDevice`] after `hipSetDevice` on the calling thread.
pub struct Runtime {
    path: String,
    init: sys::hipInit,
    driver_get_version: sys::hipDriverGetVersion,
    runtime_get_version: sys::hipRuntimeGetVersion,
    get_device_count: sys::hipGetDeviceCount,
    set_device: sys::hipSetDevice,
    device_get_attribute: sys::hipDeviceGetAttribute,
    device_get_name: sys::hipDeviceGetName,
    device_total_mem: sys::hipDeviceTotalMem,
    get_error_name: sys::hipGetErrorName,
    get_error_string: sys::hipGetErrorString,
    mem_get_info: sys::hipMemGetInfo,
    malloc: sys::hipMalloc,
    free: sys::hipFree,
    ext_malloc_with_flags: sys::hipExtMallocWithFlags,
    stream_create_with_flags: sys::hipStreamCreateWithFlags,
    stream_destroy: sys::hipStreamDestroy,
    stream_synchronize: sys::hipStreamSynchronize,
    device_synchronize: sys::hipDeviceSynchronize,
    event_create_with_flags: sys::hipEventCreateWithFlags,
    event_record: sys::hipEventRecord,
    event_query: sys::hipEventQuery,
    event_synchronize: sys::hipEventSynchronize,
    event_destroy: sys::hipEventDestroy,
    vmm: Option<Vmm>,
    pools: Option<Pools>,
    properties_r0600: Option<sys::hipGetDevicePropertiesR0600>,
    properties_r0000: Option<sys::hipGetDeviceProperties>,
    can_access_peer: Option<sys::hipDeviceCanAccessPeer>,
    enable_peer_access: Option<sys::hipDeviceEnablePeerAccess>,
    // Keeps the code behind the function pointers above loaded; dropped last.
    library: Library,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("hip::Runtime")
            .field("path", &self.path)
            .field("vmm_symbols", &self.vmm.is_some())
            .field("pool_symbols", &self.pools.is_some())
            .field("r0600", &self.properties_r0600.is_some())
            .finish_non_exhaustive()
    }
}

/// The error of a call into a symbol group this runtime lacks.
fn missing_group(call: &'static str, group: &str) -> Error {
    Error::Unsupported {
        what: format!("`{call}`"),
        backend: BACKEND,
        reason: format!(
            "this libamdhip64 does not export the {group} calls (HIP 5.1 added them); \
             install ROCm 5.1 or newer"
        ),
    }
}

impl Runtime {
    /// Loads the first library of `candidates` that opens and resolves the symbols.
    ///
    /// # Errors
    /// [`Error::LibraryLoad`] when none opens (with each candidate's reason);
    /// [`Error::MissingSymbol`] when a required call is missing (not a HIP runtime, or one
    /// older than 4.2).
    pub fn load(candidates: &[String]) -> Result<Runtime> {
        let (library, path) =
            loader::open_first(candidates).map_err(|failures| Error::LibraryLoad {
                library: candidates.join(", "),
                reason: failures.join("; "),
            })?;
        let lib = &library;
        // SAFETY (all `required` and `optional` calls below): each type is the signature
        // `hip/hip_runtime_api.h` declares for the symbol of that name, as generated into (or
        // transcribed in) `portalloc_sys::hip`.
        unsafe {
            // Both groups are resolved whole: a partial group is treated as absent.
            let vmm = (|| {
                Some(Vmm {
                    granularity: loader::optional(lib, VMM_SYMBOLS[0])?,
                    create: loader::optional(lib, VMM_SYMBOLS[1])?,
                    release: loader::optional(lib, VMM_SYMBOLS[2])?,
                    reserve: loader::optional(lib, VMM_SYMBOLS[3])?,
                    address_free: loader::optional(lib, VMM_SYMBOLS[4])?,
                    map: loader::optional(lib, VMM_SYMBOLS[5])?,
                    unmap: loader::optional(lib, VMM_SYMBOLS[6])?,
                    set_access: loader::optional(lib, VMM_SYMBOLS[7])?,
                })
            })();
            let pools = (|| {
                Some(Pools {
                    default_pool: loader::optional(lib, POOL_SYMBOLS[0])?,
                    create: loader::optional(lib, POOL_SYMBOLS[1])?,
                    destroy: loader::optional(lib, POOL_SYMBOLS[2])?,
                    set_attribute: loader::optional(lib, POOL_SYMBOLS[3])?,
                    get_attribute: loader::optional(lib, POOL_SYMBOLS[4])?,
                    trim_to: loader::optional(lib, POOL_SYMBOLS[5])?,
                    malloc_async: loader::optional(lib, POOL_SYMBOLS[6])?,
                    free_async: loader::optional(lib, POOL_SYMBOLS[7])?,
                })
            })();
            Ok(Runtime {
                init: loader::required(lib, &path, "hipInit")?,
                driver_get_version: loader::required(lib, &path, "hipDriverGetVersion")?,
                runtime_get_version: loader::required(lib, &path, "hipRuntimeGetVersion")?,
                get_device_count: loader::required(lib, &path, "hipGetDeviceCount")?,
                set_device: loader::required(lib, &path, "hipSetDevice")?,
                device_get_attribute: loader::required(lib, &path, "hipDeviceGetAttribute")?,
                device_get_name: loader::required(lib, &path, "hipDeviceGetName")?,
                device_total_mem: loader::required(lib, &path, "hipDeviceTotalMem")?,
                get_error_name: loader::required(lib, &path, "hipGetErrorName")?,
                get_error_string: loader::required(lib, &path, "hipGetErrorString")?,
                mem_get_info: loader::required(lib, &path, "hipMemGetInfo")?,
                malloc: loader::required(lib, &path, "hipMalloc")?,
                free: loader::required(lib, &path, "hipFree")?,
                ext_malloc_with_flags: loader::required(lib, &path, "hipExtMallocWithFlags")?,
                stream_create_with_flags: loader::required(lib, &path, "hipStreamCreateWithFlags")?,
                stream_destroy: loader::required(lib, &path, "hipStreamDestroy")?,
                stream_synchronize: loader::required(lib, &path, "hipStreamSynchronize")?,
                device_synchronize: loader::required(lib, &path, "hipDeviceSynchronize")?,
                event_create_with_flags: loader::required(lib, &path, "hipEventCreateWithFlags")?,
                event_record: loader::required(lib, &path, "hipEventRecord")?,
                event_query: loader::required(lib, &path, "hipEventQuery")?,
                event_synchronize: loader::required(lib, &path, "hipEventSynchronize")?,
                event_destroy: loader::required(lib, &path, "hipEventDestroy")?,
                vmm,
                pools,
                properties_r0600: loader::optional(lib, OPTIONAL_SYMBOLS[0]),
                properties_r0000: loader::optional(lib, OPTIONAL_SYMBOLS[1]),
                can_access_peer: loader::optional(lib, "hipDeviceCanAccessPeer"),
                enable_peer_access: loader::optional(lib, "hipDeviceEnablePeerAccess"),
                library,
                path,
            })
        }
    }

    /// Loads the library [`library_candidates`] finds.
    ///
    /// # Errors
    /// As [`Runtime::load`].
    pub fn load_default() -> Result<Runtime> {
        Runtime::load(&library_candidates()?)
    }

    /// The path the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// True when every virtual-memory symbol (HIP 5.1) was resolved.
    pub fn has_vmm_symbols(&self) -> bool {
        self.vmm.is_some()
    }

    /// True when every stream-ordered pool symbol (HIP 5.1) was resolved.
    pub fn has_pool_symbols(&self) -> bool {
        self.pools.is_some()
    }

    /// True when `hipGetDevicePropertiesR0600` (ROCm 6) was resolved.
    pub fn has_properties_r0600(&self) -> bool {
        self.properties_r0600.is_some()
    }

    /// Every symbol portalloc uses, with whether this library exports it — the required ones
    /// looked up in the library now, not assumed from a successful load — then
    /// [`VMM_SYMBOLS`], [`POOL_SYMBOLS`] (each group used whole or not at all) and
    /// [`OPTIONAL_SYMBOLS`].
    pub fn symbols(&self) -> Vec<(&'static str, bool)> {
        let mut out: Vec<(&'static str, bool)> = REQUIRED_SYMBOLS
            .iter()
            .map(|&s| (s, loader::exports(&self.library, s)))
            .collect();
        out.extend(VMM_SYMBOLS.iter().map(|&s| (s, self.vmm.is_some())));
        out.extend(POOL_SYMBOLS.iter().map(|&s| (s, self.pools.is_some())));
        out.push((OPTIONAL_SYMBOLS[0], self.properties_r0600.is_some()));
        out.push((OPTIONAL_SYMBOLS[1], self.properties_r0000.is_some()));
        out
    }

    /// HIP's name and text for an error code (`hipErrorNoDevice`, "no ROCm-capable device is
    /// detected"); `hipError<code>` when the runtime gives no name.
    pub fn error_name(&self, code: sys::hipError_t) -> (String, String) {
        let read = |p: *const c_char| {
            // SAFETY: HIP returns pointers to static NUL-terminated strings (or null).
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        // SAFETY: both calls take the code by value and return a static string.
        let (name, text) = unsafe { ((self.get_error_name)(code), (self.get_error_string)(code)) };
        (
            read(name).unwrap_or_else(|| format!("hipError{code}")),
            read(text).unwrap_or_else(|| "unknown error".into()),
        )
    }

    /// `Ok` for `hipSuccess`, else [`Error::Driver`] with HIP's name and text.
    pub fn check(&self, call: &'static str, code: sys::hipError_t) -> Result<()> {
        if code == sys::hipSuccess {
            return Ok(());
        }
        let (name, message) = self.error_name(code);
        Err(Error::Driver {
            backend: BACKEND,
            call,
            code: code.into(),
            name,
            message,
        })
    }

    /// `hipInit(0)`.
    pub fn init(&self) -> Result<()> {
        // SAFETY: flags by value, must be 0.
        self.check("hipInit", unsafe { (self.init)(0) })
    }

    /// `hipDriverGetVersion`.
    pub fn driver_version_code(&self) -> Result<HipVersion> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("hipDriverGetVersion", unsafe {
            (self.driver_get_version)(&mut v)
        })?;
        Ok(HipVersion(v))
    }

    /// `hipRuntimeGetVersion`: what the capability gates read (ROCm ≥ 7 for VMM).
    pub fn version(&self) -> Result<HipVersion> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("hipRuntimeGetVersion", unsafe {
            (self.runtime_get_version)(&mut v)
        })?;
        Ok(HipVersion(v))
    }

    /// `hipDriverGetVersion`, decoded.
    pub fn driver_version(&self) -> Result<String> {
        Ok(self.driver_version_code()?.to_string())
    }

    /// `hipRuntimeGetVersion`, decoded.
    pub fn runtime_version(&self) -> Result<String> {
        Ok(self.version()?.to_string())
    }

    /// `hipGetDeviceCount` (initialises the runtime; `hipErrorNoDevice` where there is none).
    pub fn device_count(&self) -> Result<u32> {
        let mut n: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("hipGetDeviceCount", unsafe {
            (self.get_device_count)(&mut n)
        })?;
        Ok(n.max(0) as u32)
    }

    /// `hipSetDevice`: makes `ordinal` current on the calling thread.
    pub fn set_device(&self, ordinal: u32) -> Result<()> {
        // SAFETY: the ordinal by value; HIP range-checks it.
        self.check("hipSetDevice", unsafe {
            (self.set_device)(ordinal as c_int)
        })
    }

    /// `hipDeviceGetAttribute` (HIP's attribute numbers, not CUDA's).
    pub fn device_attribute(
        &self,
        ordinal: u32,
        attribute: sys::hipDeviceAttribute_t,
    ) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("hipDeviceGetAttribute", unsafe {
            (self.device_get_attribute)(&mut v, attribute, ordinal as c_int)
        })?;
        Ok(v)
    }

    /// `hipDeviceGetName`.
    pub fn device_name(&self, ordinal: u32) -> Result<String> {
        let mut buf = [0u8; 256];
        // SAFETY: HIP writes at most `len` bytes, NUL-terminated, into `buf`.
        self.check("hipDeviceGetName", unsafe {
            (self.device_get_name)(
                buf.as_mut_ptr().cast(),
                buf.len() as c_int,
                ordinal as c_int,
            )
        })?;
        Ok(loader::c_buf_to_string(&buf))
    }

    /// `hipDeviceTotalMem`.
    pub fn total_mem(&self, ordinal: u32) -> Result<u64> {
        let mut bytes: usize = 0;
        // SAFETY: writes one size_t through a valid pointer.
        self.check("hipDeviceTotalMem", unsafe {
            (self.device_total_mem)(&mut bytes, ordinal as c_int)
        })?;
        Ok(bytes as u64)
    }

    /// The architecture name with its target features (`gfx942:sramecc+:xnack-`) and the call
    /// that gave it: `hipGetDevicePropertiesR0600` on ROCm ≥ 6, the 5.x
    /// `hipGetDeviceProperties` on ROCm 5; only the `gcnArchName` field is read. `None` when
    /// neither applies (or the call fails).
    pub fn arch_name(&self, ordinal: u32, version: HipVersion) -> Option<(String, &'static str)> {
        if version.major() >= 6 {
            let f = self.properties_r0600?;
            let mut props = std::mem::MaybeUninit::<sys::hipDeviceProp_tR0600>::zeroed();
            // SAFETY: HIP ≥ 6 fills a `hipDeviceProp_tR0600` (1472 bytes, the size of this
            // zeroed buffer); the struct is plain bytes, valid whatever HIP writes.
            let code = unsafe { f(props.as_mut_ptr(), ordinal as c_int) };
            self.check("hipGetDevicePropertiesR0600", code).ok()?;
            // SAFETY: zero-initialised plain bytes are a valid value of the struct.
            let props = unsafe { props.assume_init() };
            let name = c_chars(&props.gcnArchName);
            (!name.is_empty()).then_some((name, "hipGetDevicePropertiesR0600"))
        } else {
            let f = self.properties_r0000?;
            let mut props = std::mem::MaybeUninit::<sys::hipDeviceProp_tR0000>::zeroed();
            // SAFETY: HIP 5.x fills its `hipDeviceProp_t` (792 bytes, the size of this
            // zeroed buffer); the struct is plain bytes, valid whatever HIP writes.
            let code = unsafe { f(props.as_mut_ptr(), ordinal as c_int) };
            self.check("hipGetDeviceProperties", code).ok()?;
            // SAFETY: zero-initialised plain bytes are a valid value of the struct.
            let props = unsafe { props.assume_init() };
            let name = c_chars(&props.gcnArchName);
            (!name.is_empty()).then_some((name, "hipGetDeviceProperties (HIP 5.x layout)"))
        }
    }

    /// `hipMemGetInfo` on the current device: (free, total).
    pub(crate) fn mem_get_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t through valid pointers.
        self.check("hipMemGetInfo", unsafe {
            (self.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// `hipMalloc` (flags 0) or `hipExtMallocWithFlags` on the current device.
    pub(crate) fn malloc(&self, size: u64, flags: Option<u32>) -> Result<u64> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        let bytes = usize::try_from(size).map_err(|_| Error::InvalidSize {
            size,
            reason: "larger than this platform's size_t",
        })?;
        match flags {
            // SAFETY: writes one pointer through a valid pointer.
            None => self.check("hipMalloc", unsafe { (self.malloc)(&mut ptr, bytes) })?,
            Some(flags) => self.check("hipExtMallocWithFlags", unsafe {
                // SAFETY: as above; the flags are one of the header's hipDeviceMalloc* values.
                (self.ext_malloc_with_flags)(&mut ptr, bytes, flags)
            })?,
        }
        Ok(ptr as u64)
    }

    /// `hipFree`.
    ///
    /// # Safety
    /// `ptr` must be a live allocation from [`Runtime::malloc`].
    pub(crate) unsafe fn free(&self, ptr: u64) -> Result<()> {
        // SAFETY: the caller guarantees the pointer is a live allocation.
        self.check("hipFree", unsafe { (self.free)(ptr as *mut c_void) })
    }

    /// `hipStreamCreateWithFlags` on the current device.
    pub(crate) fn stream_create(&self, flags: u32) -> Result<sys::hipStream_t> {
        let mut s: sys::hipStream_t = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer.
        self.check("hipStreamCreateWithFlags", unsafe {
            (self.stream_create_with_flags)(&mut s, flags)
        })?;
        Ok(s)
    }

    /// `hipStreamDestroy`.
    ///
    /// # Safety
    /// `s` must be a live stream from [`Runtime::stream_create`], not used afterwards.
    pub(crate) unsafe fn stream_destroy(&self, s: sys::hipStream_t) -> Result<()> {
        // SAFETY: the caller guarantees a live stream.
        self.check("hipStreamDestroy", unsafe { (self.stream_destroy)(s) })
    }

    /// `hipDeviceSynchronize`: waits for all work of the current device.
    pub(crate) fn device_synchronize(&self) -> Result<()> {
        // SAFETY: no arguments; the caller made its device current.
        self.check("hipDeviceSynchronize", unsafe {
            (self.device_synchronize)()
        })
    }

    /// `hipStreamSynchronize`.
    ///
    /// # Safety
    /// `s` must be a live stream, null (the default stream) or a special handle
    /// (`hipStreamLegacy`, `hipStreamPerThread`).
    pub(crate) unsafe fn stream_synchronize(&self, s: sys::hipStream_t) -> Result<()> {
        // SAFETY: the caller guarantees a valid stream.
        self.check("hipStreamSynchronize", unsafe {
            (self.stream_synchronize)(s)
        })
    }

    /// `hipEventCreateWithFlags` on the current device.
    pub(crate) fn event_create(&self, flags: u32) -> Result<sys::hipEvent_t> {
        let mut e: sys::hipEvent_t = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer.
        self.check("hipEventCreateWithFlags", unsafe {
            (self.event_create_with_flags)(&mut e, flags)
        })?;
        Ok(e)
    }

    /// `hipEventRecord`.
    ///
    /// # Safety
    /// `e` must be a live event, `s` a live stream, null or a special handle.
    pub(crate) unsafe fn event_record(
        &self,
        e: sys::hipEvent_t,
        s: sys::hipStream_t,
    ) -> Result<()> {
        // SAFETY: the caller guarantees live handles.
        self.check("hipEventRecord", unsafe { (self.event_record)(e, s) })
    }

    /// `hipEventQuery`: `true` when complete, `false` for `hipErrorNotReady`.
    ///
    /// # Safety
    /// `e` must be a live event.
    pub(crate) unsafe fn event_query(&self, e: sys::hipEvent_t) -> Result<bool> {
        // SAFETY: the caller guarantees a live event.
        let code = unsafe { (self.event_query)(e) };
        if code == sys::hipErrorNotReady {
            return Ok(false);
        }
        self.check("hipEventQuery", code).map(|()| true)
    }

    /// `hipEventSynchronize`.
    ///
    /// # Safety
    /// `e` must be a live event.
    pub(crate) unsafe fn event_synchronize(&self, e: sys::hipEvent_t) -> Result<()> {
        // SAFETY: the caller guarantees a live event.
        self.check("hipEventSynchronize", unsafe {
            (self.event_synchronize)(e)
        })
    }

    /// `hipEventDestroy`.
    ///
    /// # Safety
    /// `e` must be a live event, not used afterwards.
    pub(crate) unsafe fn event_destroy(&self, e: sys::hipEvent_t) -> Result<()> {
        // SAFETY: the caller guarantees a live event.
        self.check("hipEventDestroy", unsafe { (self.event_destroy)(e) })
    }

    fn vmm(&self, call: &'static str) -> Result<&Vmm> {
        self.vmm
            .as_ref()
            .ok_or_else(|| missing_group(call, "virtual-memory"))
    }

    fn pools(&self, call: &'static str) -> Result<&Pools> {
        self.pools
            .as_ref()
            .ok_or_else(|| missing_group(call, "stream-ordered pool"))
    }

    /// `hipMemGetAllocationGranularity` for pinned device memory on `ordinal`.
    pub(crate) fn allocation_granularity(&self, ordinal: u32, recommended: bool) -> Result<u64> {
        let vmm = self.vmm("hipMemGetAllocationGranularity")?;
        let prop = device_prop(ordinal);
        let mut g: usize = 0;
        let option = if recommended {
            sys::hipMemAllocationGranularityRecommended
        } else {
            sys::hipMemAllocationGranularityMinimum
        };
        // SAFETY: reads the ROCm 6+ prop (only called where VMM is gated on) and writes one
        // size_t through a valid pointer.
        self.check("hipMemGetAllocationGranularity", unsafe {
            (vmm.granularity)(&mut g, &prop, option)
        })?;
        Ok(g as u64)
    }

    /// `hipMemCreate` of pinned memory on `ordinal`.
    pub(crate) fn mem_create(&self, ordinal: u32, size: u64) -> Result<u64> {
        let vmm = self.vmm("hipMemCreate")?;
        let prop = device_prop(ordinal);
        let mut h: sys::hipMemGenericAllocationHandle_t = std::ptr::null_mut();
        // SAFETY: reads the prop, writes one handle through a valid pointer.
        self.check("hipMemCreate", unsafe {
            (vmm.create)(&mut h, size as usize, &prop, 0)
        })?;
        Ok(h as u64)
    }

    /// `hipMemRelease`.
    ///
    /// # Safety
    /// `handle` must be a live handle from [`Runtime::mem_create`], not used afterwards.
    pub(crate) unsafe fn mem_release(&self, handle: u64) -> Result<()> {
        let vmm = self.vmm("hipMemRelease")?;
        // SAFETY: the caller guarantees a live handle.
        self.check("hipMemRelease", unsafe {
            (vmm.release)(handle as sys::hipMemGenericAllocationHandle_t)
        })
    }

    /// `hipMemAddressReserve`.
    pub(crate) fn address_reserve(&self, size: u64, alignment: u64) -> Result<u64> {
        let vmm = self.vmm("hipMemAddressReserve")?;
        let mut va: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer through a valid pointer; no fixed address is asked for.
        self.check("hipMemAddressReserve", unsafe {
            (vmm.reserve)(
                &mut va,
                size as usize,
                alignment as usize,
                std::ptr::null_mut(),
                0,
            )
        })?;
        Ok(va as u64)
    }

    /// `hipMemAddressFree`.
    ///
    /// # Safety
    /// `[va, va + size)` must be a whole live reservation with nothing mapped in it.
    pub(crate) unsafe fn address_free(&self, va: u64, size: u64) -> Result<()> {
        let vmm = self.vmm("hipMemAddressFree")?;
        // SAFETY: the caller guarantees a whole, unmapped reservation.
        self.check("hipMemAddressFree", unsafe {
            (vmm.address_free)(va as *mut c_void, size as usize)
        })
    }

    /// `hipMemMap`.
    ///
    /// # Safety
    /// `handle` must be a live handle and `va` inside a live reservation.
    pub(crate) unsafe fn mem_map(
        &self,
        va: u64,
        size: u64,
        offset: u64,
        handle: u64,
    ) -> Result<()> {
        let vmm = self.vmm("hipMemMap")?;
        // SAFETY: the caller guarantees a live handle and reservation.
        self.check("hipMemMap", unsafe {
            (vmm.map)(
                va as *mut c_void,
                size as usize,
                offset as usize,
                handle as sys::hipMemGenericAllocationHandle_t,
                0,
            )
        })
    }

    /// `hipMemUnmap`.
    ///
    /// # Safety
    /// `[va, va + size)` must be mapped by earlier [`Runtime::mem_map`] calls, unused now.
    pub(crate) unsafe fn mem_unmap(&self, va: u64, size: u64) -> Result<()> {
        let vmm = self.vmm("hipMemUnmap")?;
        // SAFETY: the caller guarantees a mapped, unused range.
        self.check("hipMemUnmap", unsafe {
            (vmm.unmap)(va as *mut c_void, size as usize)
        })
    }

    /// `hipMemSetAccess`: read-write for `ordinal`.
    pub(crate) fn mem_set_access(&self, ordinal: u32, va: u64, size: u64) -> Result<()> {
        let vmm = self.vmm("hipMemSetAccess")?;
        let desc = sys::hipMemAccessDesc {
            location: sys::hipMemLocation {
                type_: sys::hipMemLocationTypeDevice,
                id: ordinal as c_int,
            },
            flags: sys::hipMemAccessFlagsProtReadWrite,
        };
        // SAFETY: reads one descriptor; HIP checks that the range is mapped.
        self.check("hipMemSetAccess", unsafe {
            (vmm.set_access)(va as *mut c_void, size as usize, &desc, 1)
        })
    }

    /// True when `hipDeviceCanAccessPeer` and `hipDeviceEnablePeerAccess` were resolved.
    pub fn has_peer_symbols(&self) -> bool {
        self.can_access_peer.is_some() && self.enable_peer_access.is_some()
    }

    /// `hipDeviceCanAccessPeer`; false when the runtime lacks the call.
    ///
    /// # Errors
    /// [`Error::Driver`] (`hipErrorInvalidDevice` for an unknown ordinal).
    pub fn device_can_access_peer(&self, ordinal: u32, peer: u32) -> Result<bool> {
        let (Some(f), true) = (self.can_access_peer, self.has_peer_symbols()) else {
            return Ok(false);
        };
        let mut can: c_int = 0;
        // SAFETY: writes one int through a valid pointer; ordinals by value.
        self.check("hipDeviceCanAccessPeer", unsafe {
            f(&mut can, ordinal as c_int, peer as c_int)
        })?;
        Ok(can != 0)
    }

    /// `hipDeviceEnablePeerAccess(peer, 0)` from the current device; already enabled is
    /// success.
    pub(crate) fn device_enable_peer_access(&self, peer: u32) -> Result<()> {
        let Some(f) = self.enable_peer_access else {
            return Err(Error::Unsupported {
                what: "`hipDeviceEnablePeerAccess`".into(),
                backend: BACKEND,
                reason: format!("the runtime {} does not export it", self.path),
            });
        };
        // SAFETY: integers by value.
        let code = unsafe { f(peer as c_int, 0) };
        if code == sys::hipErrorPeerAccessAlreadyEnabled {
            return Ok(());
        }
        self.check("hipDeviceEnablePeerAccess", code)
    }

    /// `hipMemSetAccess`: read-write for each of `ordinals`, one descriptor each, in one call.
    pub(crate) fn mem_set_access_devices(
        &self,
        ordinals: &[u32],
        va: u64,
        size: u64,
    ) -> Result<()> {
        let vmm = self.vmm("hipMemSetAccess")?;
        let descs: Vec<sys::hipMemAccessDesc> = ordinals
            .iter()
            .map(|&o| sys::hipMemAccessDesc {
                location: sys::hipMemLocation {
                    type_: sys::hipMemLocationTypeDevice,
                    id: o as c_int,
                },
                flags: sys::hipMemAccessFlagsProtReadWrite,
            })
            .collect();
        // SAFETY: reads `descs.len()` descriptors; HIP checks that the range is mapped.
        self.check("hipMemSetAccess", unsafe {
            (vmm.set_access)(
                va as *mut c_void,
                size as usize,
                descs.as_ptr(),
                descs.len(),
            )
        })
    }

    /// `hipDeviceGetDefaultMemPool`.
    pub(crate) fn default_mem_pool(&self, ordinal: u32) -> Result<sys::hipMemPool_t> {
        let pools = self.pools("hipDeviceGetDefaultMemPool")?;
        let mut pool: sys::hipMemPool_t = std::ptr::null_mut();
        // SAFETY: writes one handle through a valid pointer.
        self.check("hipDeviceGetDefaultMemPool", unsafe {
            (pools.default_pool)(&mut pool, ordinal as c_int)
        })?;
        Ok(pool)
    }

    /// `hipMemPoolCreate` of a pinned-memory pool on `ordinal`, exportable by no handle.
    pub(crate) fn mem_pool_create(&self, ordinal: u32) -> Result<sys::hipMemPool_t> {
        let pools = self.pools("hipMemPoolCreate")?;
        let props = sys::hipMemPoolProps {
            allocType: sys::hipMemAllocationTypePinned,
            handleTypes: sys::hipMemHandleTypeNone,
            location: sys::hipMemLocation {
                type_: sys::hipMemLocationTypeDevice,
                id: ordinal as c_int,
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            reserved: [0; 64],
        };
        let mut pool: sys::hipMemPool_t = std::ptr::null_mut();
        // SAFETY: reads the props (reserved bytes zero, as the header demands), writes one
        // handle through a valid pointer.
        self.check("hipMemPoolCreate", unsafe {
            (pools.create)(&mut pool, &props)
        })?;
        Ok(pool)
    }

    /// `hipMemPoolDestroy`.
    ///
    /// # Safety
    /// `pool` must be a live pool from [`Runtime::mem_pool_create`], not used afterwards.
    pub(crate) unsafe fn mem_pool_destroy(&self, pool: sys::hipMemPool_t) -> Result<()> {
        let pools = self.pools("hipMemPoolDestroy")?;
        // SAFETY: the caller guarantees a live pool.
        self.check("hipMemPoolDestroy", unsafe { (pools.destroy)(pool) })
    }

    /// `hipMemPoolSetAttribute` of a `uint64_t` attribute.
    ///
    /// # Safety
    /// `pool` must be a live pool.
    pub(crate) unsafe fn mem_pool_set_u64(
        &self,
        pool: sys::hipMemPool_t,
        attr: sys::hipMemPoolAttr,
        value: u64,
    ) -> Result<()> {
        let pools = self.pools("hipMemPoolSetAttribute")?;
        let mut v = value;
        // SAFETY: the caller guarantees a live pool; the attribute's value type is uint64_t.
        self.check("hipMemPoolSetAttribute", unsafe {
            (pools.set_attribute)(pool, attr, (&mut v as *mut u64).cast())
        })
    }

    /// `hipMemPoolGetAttribute` of a `uint64_t` attribute.
    ///
    /// # Safety
    /// `pool` must be a live pool.
    pub(crate) unsafe fn mem_pool_get_u64(
        &self,
        pool: sys::hipMemPool_t,
        attr: sys::hipMemPoolAttr,
    ) -> Result<u64> {
        let pools = self.pools("hipMemPoolGetAttribute")?;
        let mut v: u64 = 0;
        // SAFETY: the caller guarantees a live pool; the attribute's value type is uint64_t.
        self.check("hipMemPoolGetAttribute", unsafe {
            (pools.get_attribute)(pool, attr, (&mut v as *mut u64).cast())
        })?;
        Ok(v)
    }

    /// `hipMemPoolTrimTo`.
    ///
    /// # Safety
    /// `pool` must be a live pool.
    pub(crate) unsafe fn mem_pool_trim_to(&self, pool: sys::hipMemPool_t, keep: u64) -> Result<()> {
        let pools = self.pools("hipMemPoolTrimTo")?;
        // SAFETY: the caller guarantees a live pool.
        self.check("hipMemPoolTrimTo", unsafe {
            (pools.trim_to)(pool, keep as usize)
        })
    }

    /// `hipMallocFromPoolAsync`.
    ///
    /// # Safety
    /// `pool` must be a live pool, `stream` a live stream, null or a special handle.
    pub(crate) unsafe fn malloc_from_pool_async(
        &self,
        size: u64,
        pool: sys::hipMemPool_t,
        stream: sys::hipStream_t,
    ) -> Result<u64> {
        let pools = self.pools("hipMallocFromPoolAsync")?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: the caller guarantees live handles; writes one pointer.
        self.check("hipMallocFromPoolAsync", unsafe {
            (pools.malloc_async)(&mut ptr, size as usize, pool, stream)
        })?;
        Ok(ptr as u64)
    }

    /// `hipFreeAsync`.
    ///
    /// # Safety
    /// `ptr` must be a live pool allocation, `stream` a live stream, null or a special handle.
    pub(crate) unsafe fn free_async(&self, ptr: u64, stream: sys::hipStream_t) -> Result<()> {
        let pools = self.pools("hipFreeAsync")?;
        // SAFETY: the caller guarantees a live allocation and stream.
        self.check("hipFreeAsync", unsafe {
            (pools.free_async)(ptr as *mut c_void, stream)
        })
    }
}

/// The ROCm 6+ allocation properties of pinned memory on device `ordinal`.
fn device_prop(ordinal: u32) -> sys::hipMemAllocationProp {
    sys::hipMemAllocationProp {
        type_: sys::hipMemAllocationTypePinned,
        handleType: sys::hipMemAllocationProp_handleType {
            requestedHandleType: sys::hipMemHandleTypeNone,
        },
        location: sys::hipMemLocation {
            type_: sys::hipMemLocationTypeDevice,
            id: ordinal as c_int,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::hipMemAllocationProp_allocFlags::default(),
    }
}

/// A NUL-terminated C string in a fixed buffer.
fn c_chars(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Opens every device of the runtime [`library_candidates`] finds, with the options
/// `PORTALLOC_HIP_MEMORY` names (see [`HipDeviceBuilder::from_env`]).
///
/// # Errors
/// As [`Runtime::load`], [`HipDeviceBuilder::from_env`] and [`HipDevice::open_all`].
pub fn open_all() -> Result<Vec<HipDevice>> {
    let runtime = std::sync::Arc::new(Runtime::load_default()?);
    let template = HipDeviceBuilder::from_env()?;
    let count = runtime.device_count()?;
    (0..count)
        .map(|ordinal| {
            template
                .clone()
                .ordinal(ordinal)
                .open(std::sync::Arc::clone(&runtime))
        })
        .collect()
}

/// Probes the HIP backend. Never fails: what went wrong is in the [`Probe`].
pub fn probe() -> Probe {
    match library_candidates() {
        Ok(candidates) => probe_with(&candidates),
        Err(e) => Probe {
            backend: Some(Vendor::Hip),
            error: Some(e.to_string()),
            ..Probe::default()
        },
    }
}

/// [`probe`] over explicit library candidates.
pub fn probe_with(candidates: &[String]) -> Probe {
    let mut probe = Probe {
        backend: Some(Vendor::Hip),
        ..Probe::default()
    };
    let runtime = match Runtime::load(candidates) {
        Ok(r) => r,
        Err(Error::LibraryLoad { reason, .. }) => {
            probe.load_failures = reason.split("; ").map(String::from).collect();
            probe.error = Some("runtime library libamdhip64 not found".into());
            return probe;
        }
        Err(e) => {
            probe.error = Some(e.to_string());
            return probe;
        }
    };
    probe.library = Some(runtime.path().to_string());
    probe.driver_version = runtime.driver_version().ok();
    probe.runtime_version = runtime.runtime_version().ok();
    // hipGetDeviceCount initialises the runtime itself and answers hipErrorNoDevice where
    // there is none; hipInit(0) on HIP 5.2 answers the less telling hipErrorInvalidDevice.
    match runtime.device_count() {
        Ok(count) => {
            probe.device_count = count;
            for ordinal in 0..count {
                let line = runtime.device_name(ordinal).and_then(|name| {
                    Ok(format!(
                        "{ordinal}: {name} ({})",
                        crate::units::Bytes(runtime.total_mem(ordinal)?)
                    ))
                });
                probe.devices.push(line.unwrap_or_else(|e| e.to_string()));
            }
        }
        Err(Error::Driver {
            code,
            name,
            message,
            ..
        }) => {
            probe.error = Some(format!("{name} ({code}): {message}"));
        }
        Err(e) => probe.error = Some(e.to_string()),
    }
    probe
}
