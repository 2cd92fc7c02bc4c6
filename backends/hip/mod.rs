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
//! | [`PINNED_HOST_SYMBOLS`] | ≤ 4.2 | whole group or nothing: without it, no pinned host memory |
//! | `hipGetDevicePropertiesR0600` | 6.0 | optional: the architecture name on ROCm ≥ 6 |
//! | `hipGetDeviceProperties` | 4.2 | optional: the architecture name on ROCm 5 (5.x layout) |
//!
//! HIP 5.2.3, the runtime Debian ships, exports every symbol but `hipGetDevicePropertiesR0600`.

use std::ffi::{c_char, c_int};
use std::fmt;

use libloading::Library;
use portalloc_sys::hip as sys;

use super::loader::{self, symbol_table, Checked};
use super::Probe;
use crate::config::Config;
use crate::device::Vendor;
use crate::error::{Error, Result};

mod device;
pub mod tuning;

pub use device::{Hip, HipCensus, HipDevice, HipDeviceBuilder, MemoryKind};

/// The backend's name in errors.
const BACKEND: &str = "hip";

/// The variable that names the HIP library to load instead of searching (read by
/// [`crate::config`], as [`Config::hip_library`]).
pub const LIBRARY_VARIABLE: &str = crate::config::PORTALLOC_HIP_LIBRARY;

/// Library file names, newest ROCm first.
const SONAMES: [&str; 3] = ["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"];

/// Where to look, in order: `config`'s [`hip_library`](Config::hip_library)
/// (`PORTALLOC_HIP_LIBRARY`) alone if set; else each of `libamdhip64.so.7`, `.6`, `.5` under
/// the [`rocm_path`](Config::rocm_path) (`ROCM_PATH`) and [`hip_path`](Config::hip_path)
/// (`HIP_PATH`) roots' `lib/` and `/opt/rocm/lib`; then the same names through the loader's
/// search path. Reads no environment variable.
pub fn library_candidates(config: &Config) -> Vec<String> {
    if let Some(path) = config.hip_library.value.as_ref().filter(|p| !p.is_empty()) {
        return vec![path.clone()];
    }
    let roots = [&config.rocm_path.value, &config.hip_path.value];
    let mut dirs: Vec<String> = roots
        .into_iter()
        .flatten()
        .filter(|root| !root.is_empty())
        .map(|root| format!("{}/lib", root.trim_end_matches('/')))
        .collect();
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
    candidates
}

symbol_table! {
    /// The required entry points (all in HIP ≤ 4.2), resolved at [`Runtime::load`].
    Required, REQUIRED_SYMBOLS {
        init: hipInit, driver_get_version: hipDriverGetVersion,
        runtime_get_version: hipRuntimeGetVersion,
        get_device_count: hipGetDeviceCount, set_device: hipSetDevice, get_device: hipGetDevice,
        device_get_attribute: hipDeviceGetAttribute, device_get_name: hipDeviceGetName,
        device_total_mem: hipDeviceTotalMem, get_error_name: hipGetErrorName,
        get_error_string: hipGetErrorString, mem_get_info: hipMemGetInfo, malloc: hipMalloc,
        free: hipFree, ext_malloc_with_flags: hipExtMallocWithFlags,
        stream_create_with_flags: hipStreamCreateWithFlags,
        stream_destroy: hipStreamDestroy, stream_synchronize: hipStreamSynchronize,
        stream_wait_event: hipStreamWaitEvent,
        device_synchronize: hipDeviceSynchronize,
        event_create_with_flags: hipEventCreateWithFlags, event_record: hipEventRecord,
        event_query: hipEventQuery, event_synchronize: hipEventSynchronize,
        event_destroy: hipEventDestroy, memcpy_dtoh_async: hipMemcpyDtoHAsync,
        memcpy_htod_async: hipMemcpyHtoDAsync,
    }
    /// The virtual-memory entry points (HIP 5.1): all resolved, or none used.
    Vmm, VMM_SYMBOLS {
        granularity: hipMemGetAllocationGranularity,
        create: hipMemCreate, release: hipMemRelease, reserve: hipMemAddressReserve,
        address_free: hipMemAddressFree, map: hipMemMap, unmap: hipMemUnmap, set_access: hipMemSetAccess,
    }
    /// The stream-ordered pool entry points (HIP 5.1): all resolved, or none used.
    Pools, POOL_SYMBOLS {
        default_pool: hipDeviceGetDefaultMemPool,
        create: hipMemPoolCreate, destroy: hipMemPoolDestroy, set_attribute: hipMemPoolSetAttribute,
        get_attribute: hipMemPoolGetAttribute, trim_to: hipMemPoolTrimTo,
        malloc_async: hipMallocFromPoolAsync,
        free_async: hipFreeAsync,
    }
    /// The peer-access entry points: both resolved, or no peers (not in
    /// [`Runtime::symbols`]).
    Peer, PEER_SYMBOLS { can_access: hipDeviceCanAccessPeer, enable: hipDeviceEnablePeerAccess }
    /// The pinned host memory entry points (HIP ≤ 4.2, but optional: a runtime without them
    /// offers no pinned memory, and copies use the caller's ordinary host memory).
    PinnedHost, PINNED_HOST_SYMBOLS { alloc: hipHostMalloc, free: hipHostFree }
    /// Host-memory registration entry points (HIP ≤ 4.2, but optional: a driver without them
    /// pins host copies with the calls above instead): page-locks memory the caller allocated
    /// and touched, about five times faster than allocating it pinned (rapidsai/cudf PR
    /// #23457).
    HostRegister, HOST_REGISTER_SYMBOLS { register: hipHostRegister, unregister: hipHostUnregister }
    /// Stream-capture entry points (HIP 5.0, but optional: a runtime without them captures
    /// nothing portalloc could be asked about, and every stream reads as not capturing).
    Capture, CAPTURE_SYMBOLS { capture_info: hipStreamGetCaptureInfo, exchange_mode: hipThreadExchangeStreamCaptureMode }
    /// The device's identity (HIP 5.2, optional: without it the shared budget keys a device
    /// by its ordinal, name and size).
    Identity, IDENTITY_SYMBOLS { uuid: hipDeviceGetUuid }
    /// Export and import of physical memory as POSIX descriptors (ROCm 6+, optional).
    Shareable, SHAREABLE_SYMBOLS { export: hipMemExportToShareableHandle, import: hipMemImportFromShareableHandle }
    /// Legacy IPC handles of plain allocations (optional).
    Ipc, IPC_SYMBOLS { get: hipIpcGetMemHandle, open: hipIpcOpenMemHandle, close: hipIpcCloseMemHandle }
    /// The single optional entry points: the device properties, each layout on its own.
    Optional, OPTIONAL_SYMBOLS each {
        properties_r0600: hipGetDevicePropertiesR0600, properties_r0000: hipGetDeviceProperties,
    }
}

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

/// The loaded HIP runtime and its entry points: the result layer, where every `hipError_t`
/// becomes a [`Result`].
///
/// The public calls here take no handle the runtime dereferences; those that do (streams,
/// events, pools, device pointers, physical handles) are the GPU layer's `unsafe` calls,
/// made by [`HipDevice`] after it checked the handle against its books and made its device
/// current with `hipSetDevice` (see `backends/gpu` for the rule).
pub struct Runtime {
    path: String,
    pub(crate) api: Required,
    optional: Optional,
    pub(crate) vmm: Option<Vmm>,
    pub(crate) pools: Option<Pools>,
    pub(crate) peer: Option<Peer>,
    pub(crate) pinned_host: Option<PinnedHost>,
    pub(crate) host_register: Option<HostRegister>,
    pub(crate) capture: Option<Capture>,
    pub(crate) identity: Option<Identity>,
    pub(crate) shareable: Option<Shareable>,
    pub(crate) ipc: Option<Ipc>,
    // Keeps the code behind the function pointers above loaded; dropped last.
    library: Library,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("hip::Runtime")
            .field("path", &self.path)
            .field("vmm_symbols", &self.vmm.is_some())
            .field("pool_symbols", &self.pools.is_some())
            .field("r0600", &self.optional.properties_r0600.is_some())
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
        let (library, path) = loader::open_first(candidates)?;
        let api = Required::resolve(&library).map_err(loader::missing(&path))?;
        Ok(Runtime {
            optional: Optional::resolve(&library),
            peer: Peer::resolve(&library).ok(),
            vmm: Vmm::resolve(&library).ok(),
            pools: Pools::resolve(&library).ok(),
            pinned_host: PinnedHost::resolve(&library).ok(),
            host_register: HostRegister::resolve(&library).ok(),
            capture: Capture::resolve(&library).ok(),
            identity: Identity::resolve(&library).ok(),
            shareable: Shareable::resolve(&library).ok(),
            ipc: Ipc::resolve(&library).ok(),
            api,
            library,
            path,
        })
    }

    /// The path the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Loads the library [`library_candidates`] finds for `config`.
    ///
    /// # Errors
    /// As [`Runtime::load`].
    pub fn load_configured(config: &Config) -> Result<Runtime> {
        Runtime::load(&library_candidates(config))
    }

    /// Loads the library [`library_candidates`] finds, reading `PORTALLOC_HIP_LIBRARY`,
    /// `ROCM_PATH` and `HIP_PATH` (and no other variable) from the process environment,
    /// through [`Config::from_env_vars`]: for callers without a [`Config`]; with one, use
    /// [`Runtime::load_configured`].
    ///
    /// # Errors
    /// [`Error::Config`] for one of those variables that is not a path (not UTF-8, a control
    /// character); as [`Runtime::load`].
    pub fn load_default() -> Result<Runtime> {
        use crate::config::{HIP_PATH, ROCM_PATH};
        Runtime::load_configured(&Config::from_env_vars(&[
            LIBRARY_VARIABLE,
            ROCM_PATH,
            HIP_PATH,
        ])?)
    }

    /// True when every virtual-memory symbol (HIP 5.1) was resolved.
    pub fn has_vmm_symbols(&self) -> bool {
        self.vmm.is_some()
    }

    /// True when every stream-ordered pool symbol (HIP 5.1) was resolved.
    pub fn has_pool_symbols(&self) -> bool {
        self.pools.is_some()
    }

    /// True when the pinned host memory symbols (`hipHostMalloc`, `hipHostFree`) were
    /// resolved.
    pub fn has_pinned_host_symbols(&self) -> bool {
        self.pinned_host.is_some()
    }

    /// True when `hipGetDevicePropertiesR0600` (ROCm 6) was resolved.
    pub fn has_properties_r0600(&self) -> bool {
        self.optional.properties_r0600.is_some()
    }

    /// Every symbol portalloc uses, with whether this library exports it — the required ones
    /// looked up in the library now, not assumed from a successful load — then
    /// [`VMM_SYMBOLS`], [`POOL_SYMBOLS`], [`PINNED_HOST_SYMBOLS`] (each group used whole or
    /// not at all) and [`OPTIONAL_SYMBOLS`], each looked up in the library.
    pub fn symbols(&self) -> Vec<(&'static str, bool)> {
        let mut out = Required::exported(&self.library);
        out.extend(Vmm::exported(&self.library));
        out.extend(Pools::exported(&self.library));
        out.extend(PinnedHost::exported(&self.library));
        out.extend(HostRegister::exported(&self.library));
        out.extend(Capture::exported(&self.library));
        out.extend(Identity::exported(&self.library));
        out.extend(self.optional.exported());
        out
    }

    /// HIP's name and text for an error code (`hipErrorNoDevice`, "no ROCm-capable device is
    /// detected"); `hipError<code>` when the runtime gives no name.
    pub fn error_name(&self, code: sys::hipError_t) -> (String, String) {
        // SAFETY: both calls take the code by value and return a static string (or null).
        let (name, text) = unsafe {
            (
                (self.api.get_error_name)(code),
                (self.api.get_error_string)(code),
            )
        };
        (
            loader::c_str(Some(name)).unwrap_or_else(|| format!("hipError{code}")),
            loader::c_str(Some(text)).unwrap_or_else(|| "unknown error".into()),
        )
    }

    /// `hipInit(0)`.
    pub fn init(&self) -> Result<()> {
        // SAFETY: flags by value, must be 0.
        self.check("hipInit", unsafe { (self.api.init)(0) })
    }

    /// `hipDriverGetVersion`.
    pub fn driver_version_code(&self) -> Result<HipVersion> {
        // SAFETY: writes one int through a valid pointer.
        let f = |v: &mut c_int| unsafe { (self.api.driver_get_version)(v) };
        self.out("hipDriverGetVersion", f).map(HipVersion)
    }

    /// `hipRuntimeGetVersion`: what the capability gates read (ROCm ≥ 7 for VMM).
    pub fn version(&self) -> Result<HipVersion> {
        // SAFETY: writes one int through a valid pointer.
        let f = |v: &mut c_int| unsafe { (self.api.runtime_get_version)(v) };
        self.out("hipRuntimeGetVersion", f).map(HipVersion)
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
        // SAFETY: writes one int through a valid pointer.
        let f = |n: &mut c_int| unsafe { (self.api.get_device_count)(n) };
        Ok(self.out("hipGetDeviceCount", f)?.max(0) as u32)
    }

    /// `hipSetDevice`: makes `ordinal` current on the calling thread.
    pub fn set_device(&self, ordinal: u32) -> Result<()> {
        // SAFETY: the ordinal by value; HIP range-checks it.
        self.check("hipSetDevice", unsafe {
            (self.api.set_device)(ordinal as c_int)
        })
    }

    /// `hipGetDevice`: the calling thread's current device (0 until one is set).
    pub fn current_device(&self) -> Result<u32> {
        // SAFETY: writes one int through a valid pointer.
        let f = |d: &mut c_int| unsafe { (self.api.get_device)(d) };
        Ok(self.out("hipGetDevice", f)?.max(0) as u32)
    }

    /// `hipDeviceGetAttribute` (HIP's attribute numbers, not CUDA's).
    pub fn device_attribute(
        &self,
        ordinal: u32,
        attribute: sys::hipDeviceAttribute_t,
    ) -> Result<i32> {
        // SAFETY: writes one int through a valid pointer.
        let f = |v: &mut c_int| unsafe {
            (self.api.device_get_attribute)(v, attribute, ordinal as c_int)
        };
        self.out("hipDeviceGetAttribute", f)
    }

    /// `hipDeviceGetUuid`: the device's UUID as `rocm-smi` writes it (`GPU-…`), or `None`
    /// when the runtime lacks the call or refuses it.
    pub fn device_uuid(&self, ordinal: u32) -> Option<String> {
        let api = self.identity?;
        let mut raw = [0u8; 16];
        // SAFETY: the runtime writes 16 bytes (a hipUUID) into `raw`; the device by value.
        let code = unsafe { (api.uuid)(raw.as_mut_ptr().cast(), ordinal as c_int) };
        self.check("hipDeviceGetUuid", code).ok()?;
        Some(crate::budget::uuid_text("GPU-", &raw))
    }

    /// `hipDeviceGetName`.
    pub fn device_name(&self, ordinal: u32) -> Result<String> {
        let mut buf = [0u8; 256];
        let len = buf.len() as c_int;
        // SAFETY: HIP writes at most `len` bytes, NUL-terminated, into `buf`.
        let code =
            unsafe { (self.api.device_get_name)(buf.as_mut_ptr().cast(), len, ordinal as c_int) };
        self.check("hipDeviceGetName", code)?;
        Ok(loader::c_buf_to_string(&buf))
    }

    /// `hipDeviceTotalMem`.
    pub fn total_mem(&self, ordinal: u32) -> Result<u64> {
        // SAFETY: writes one size_t through a valid pointer.
        let f = |b: &mut usize| unsafe { (self.api.device_total_mem)(b, ordinal as c_int) };
        Ok(self.out("hipDeviceTotalMem", f)? as u64)
    }

    /// The architecture name with its target features (`gfx942:sramecc+:xnack-`) and the call
    /// that gave it: `hipGetDevicePropertiesR0600` on ROCm ≥ 6, the 5.x
    /// `hipGetDeviceProperties` on ROCm 5; only the `gcnArchName` field is read. `None` when
    /// neither applies (or the call fails).
    pub fn arch_name(&self, ordinal: u32, version: HipVersion) -> Option<(String, &'static str)> {
        let (name, call) = if version.major() >= 6 {
            let f = self.optional.properties_r0600?;
            // SAFETY: HIP ≥ 6 fills a `hipDeviceProp_tR0600` (the size of the buffer).
            let name = self.arch_of(|p| unsafe { f(p, ordinal as c_int) })?;
            (name, "hipGetDevicePropertiesR0600")
        } else {
            let f = self.optional.properties_r0000?;
            // SAFETY: HIP 5.x fills its `hipDeviceProp_t` (the size of the buffer).
            let name = self.arch_of(|p| unsafe { f(p, ordinal as c_int) })?;
            (name, "hipGetDeviceProperties (HIP 5.x layout)")
        };
        (!name.is_empty()).then_some((name, call))
    }

    /// The `gcnArchName` a device-properties call writes into a zeroed struct of its layout.
    fn arch_of<const B: usize, const A: usize>(
        &self,
        call: impl FnOnce(*mut sys::DeviceProperties<B, A>) -> sys::hipError_t,
    ) -> Option<String> {
        let mut props = std::mem::MaybeUninit::<sys::DeviceProperties<B, A>>::zeroed();
        self.check("hipGetDeviceProperties", call(props.as_mut_ptr()))
            .ok()?;
        // SAFETY: zero-initialised plain bytes are a valid value of the struct, whatever HIP
        // wrote over them.
        let props = unsafe { props.assume_init() };
        Some(c_chars(&props.gcnArchName))
    }

    /// `hipMemGetInfo` on the current device: (free, total).
    pub(crate) fn mem_get_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t through valid pointers.
        self.check("hipMemGetInfo", unsafe {
            (self.api.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    pub(crate) fn shareable(&self, call: &'static str) -> Result<&Shareable> {
        self.shareable
            .as_ref()
            .ok_or_else(|| missing_group(call, "shareable-handle"))
    }

    pub(crate) fn ipc(&self, call: &'static str) -> Result<&Ipc> {
        self.ipc
            .as_ref()
            .ok_or_else(|| missing_group(call, "IPC-handle"))
    }

    pub(crate) fn vmm(&self, call: &'static str) -> Result<&Vmm> {
        self.vmm
            .as_ref()
            .ok_or_else(|| missing_group(call, "virtual-memory"))
    }

    pub(crate) fn pools(&self, call: &'static str) -> Result<&Pools> {
        self.pools
            .as_ref()
            .ok_or_else(|| missing_group(call, "stream-ordered pool"))
    }

    /// `hipMemGetAllocationGranularity` for pinned device memory on `ordinal`.
    pub(crate) fn allocation_granularity(&self, ordinal: u32, recommended: bool) -> Result<u64> {
        let vmm = self.vmm("hipMemGetAllocationGranularity")?;
        let prop = device_prop(ordinal);
        let option = if recommended {
            sys::hipMemAllocationGranularityRecommended
        } else {
            sys::hipMemAllocationGranularityMinimum
        };
        // SAFETY: reads the ROCm 6+ prop (only called where VMM is gated on) and writes one
        // size_t through a valid pointer.
        let f = |g: &mut usize| unsafe { (vmm.granularity)(g, &prop, option) };
        Ok(self.out("hipMemGetAllocationGranularity", f)? as u64)
    }

    /// True when `hipDeviceCanAccessPeer` and `hipDeviceEnablePeerAccess` were resolved.
    pub fn has_peer_symbols(&self) -> bool {
        self.peer.is_some()
    }

    /// `hipDeviceCanAccessPeer`; false when the runtime lacks the call.
    ///
    /// # Errors
    /// [`Error::Driver`] (`hipErrorInvalidDevice` for an unknown ordinal).
    pub fn device_can_access_peer(&self, ordinal: u32, peer: u32) -> Result<bool> {
        let Some(api) = self.peer else {
            return Ok(false);
        };
        // SAFETY: writes one int through a valid pointer; ordinals by value.
        let f = |c: &mut c_int| unsafe { (api.can_access)(c, ordinal as c_int, peer as c_int) };
        Ok(self.out("hipDeviceCanAccessPeer", f)? != 0)
    }
}

impl Checked for Runtime {
    type Code = sys::hipError_t;
    const SUCCESS: sys::hipError_t = sys::hipSuccess;
    const BACKEND: &'static str = BACKEND;

    fn names(&self, code: sys::hipError_t) -> (String, String) {
        self.error_name(code)
    }
}

/// The ROCm 6+ allocation properties of pinned memory on device `ordinal`.
pub(crate) fn device_prop(ordinal: u32) -> sys::hipMemAllocationProp {
    exportable_prop(ordinal, sys::hipMemHandleTypeNone)
}

/// [`device_prop`] asking for handles exportable as `handle_type`.
pub(crate) fn exportable_prop(
    ordinal: u32,
    handle_type: sys::hipMemAllocationHandleType,
) -> sys::hipMemAllocationProp {
    sys::hipMemAllocationProp {
        type_: sys::hipMemAllocationTypePinned,
        handleType: sys::hipMemAllocationProp_handleType {
            requestedHandleType: handle_type,
        },
        location: location(ordinal),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::hipMemAllocationProp_allocFlags::default(),
    }
}

/// Where device memory of device `ordinal` lives.
pub(crate) fn location(ordinal: u32) -> sys::hipMemLocation {
    sys::hipMemLocation {
        type_: sys::hipMemLocationTypeDevice,
        id: ordinal as c_int,
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

/// Opens every device of the runtime [`library_candidates`] finds for `config`, with the
/// options it gives ([`HipDeviceBuilder::from_config`]: the memory kind, the XNACK mode).
///
/// # Errors
/// As [`Runtime::load`] and [`HipDevice::open_all`].
pub fn open_all(config: &Config) -> Result<Vec<HipDevice>> {
    open_some(config, None)
}

/// Opens the devices `only` names (`None`: every one) of the runtime `config` names, each
/// as [`HipDeviceBuilder::from_config`] says.
///
/// # Errors
/// As [`Runtime::load`] and [`HipDevice::open`]; [`Error::InvalidArgument`] for an ordinal
/// the runtime does not have.
pub fn open_some(config: &Config, only: Option<u32>) -> Result<Vec<HipDevice>> {
    let runtime = std::sync::Arc::new(Runtime::load_configured(config)?);
    let template = HipDeviceBuilder::from_config(config);
    let ordinals = match only {
        Some(ordinal) => ordinal..ordinal + 1,
        None => 0..runtime.device_count()?,
    };
    ordinals
        .map(|ordinal| {
            template
                .clone()
                .ordinal(ordinal)
                .open(std::sync::Arc::clone(&runtime))
        })
        .collect()
}

/// Probes the HIP backend, with the library `config` names. Never fails: what went wrong is
/// in the [`Probe`].
pub fn probe(config: &Config) -> Probe {
    probe_with(&library_candidates(config))
}

/// [`probe`] over explicit library candidates.
pub fn probe_with(candidates: &[String]) -> Probe {
    probe_from(Ok(candidates.to_vec()))
}

fn probe_from(candidates: Result<Vec<String>>) -> Probe {
    let not_found = |_: &[String]| "runtime library libamdhip64 not found".to_string();
    let survey = |runtime: &Runtime, probe: &mut Probe| {
        probe.library = Some(runtime.path().to_string());
        probe.driver_version = runtime.driver_version().ok();
        probe.runtime_version = runtime.runtime_version().ok();
        // hipGetDeviceCount initialises the runtime itself and answers hipErrorNoDevice where
        // there is none; hipInit(0) on HIP 5.2 answers the less telling hipErrorInvalidDevice.
        runtime.device_count()
    };
    let describe = |runtime: &Runtime, ordinal| {
        let (name, total) = (runtime.device_name(ordinal)?, runtime.total_mem(ordinal)?);
        Ok(format!(
            "{ordinal}: {name} ({})",
            crate::units::Bytes(total)
        ))
    };
    Probe::run(
        Vendor::Hip,
        candidates,
        not_found,
        Runtime::load,
        survey,
        describe,
    )
}
