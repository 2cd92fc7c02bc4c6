//! The CUDA backend: NVIDIA's driver API (`libcuda.so.1`), loaded at run time.
//!
//! Three layers, bottom to top:
//!
//! * [`portalloc_sys::cuda`]: the raw types and signatures, written from `cuda.h`.
//! * [`Driver`]: the library, loaded with libloading from `PORTALLOC_CUDA_LIBRARY` or
//!   `libcuda.so.1` (never the bare `libcuda.so`), its symbols resolved (required ones →
//!   [`Error::MissingSymbol`], the CUDA 10.2 virtual-memory and 11.2 pool groups → `Option`),
//!   and every call checked: a `CUresult` becomes [`Error::Driver`] with the driver's own
//!   name and text, and out-of-memory becomes [`Error::DeviceOutOfMemory`].
//! * [`CudaDevice`]: the [`crate::Device`] of one device ordinal, on its primary context, with
//!   the [`crate::device::VirtualMemory`] and [`crate::device::StreamOrderedPool`]
//!   capabilities where the driver and the device have them.
//!
//! [`probe`] is what discovery runs: load, `cuInit`, versions, devices, or the driver's error
//! name (`CUDA_ERROR_NO_DEVICE` on a machine without a GPU).

use std::ffi::c_int;

use libloading::Library;
use portalloc_sys::cuda as sys;

#[cfg(feature = "cudarc")]
pub mod cudarc;
mod device;

pub use device::{open_all, CudaCensus, CudaDevice};

use super::loader;
use super::Probe;
use crate::device::Vendor;
use crate::error::{Error, Result};

/// The variable that names the CUDA driver library to load instead of the default.
pub const LIBRARY_VARIABLE: &str = "PORTALLOC_CUDA_LIBRARY";

/// Where to look for the driver library, in order: `PORTALLOC_CUDA_LIBRARY` alone if set,
/// else `libcuda.so.1` (never the bare `libcuda.so`, which can be the toolkit's link-time
/// stub that fails every call) or `nvcuda.dll`.
///
/// # Errors
/// [`Error::Config`] when `PORTALLOC_CUDA_LIBRARY` is not UTF-8.
pub fn library_candidates() -> Result<Vec<String>> {
    Ok(match crate::config::env_var(LIBRARY_VARIABLE)? {
        Some(path) if !path.is_empty() => vec![path],
        _ if cfg!(windows) => vec!["nvcuda.dll".into()],
        _ => vec!["libcuda.so.1".into()],
    })
}

/// Virtual-memory entry points (CUDA 10.2): all resolved, or none used.
#[derive(Clone, Copy)]
struct VmmApi {
    get_allocation_granularity: sys::cuMemGetAllocationGranularity,
    create: sys::cuMemCreate,
    release: sys::cuMemRelease,
    address_reserve: sys::cuMemAddressReserve,
    address_free: sys::cuMemAddressFree,
    map: sys::cuMemMap,
    unmap: sys::cuMemUnmap,
    set_access: sys::cuMemSetAccess,
}

/// Stream-ordered pool entry points (CUDA 11.2): all resolved, or none used.
#[derive(Clone, Copy)]
struct PoolApi {
    default_mem_pool: sys::cuDeviceGetDefaultMemPool,
    create: sys::cuMemPoolCreate,
    destroy: sys::cuMemPoolDestroy,
    set_attribute: sys::cuMemPoolSetAttribute,
    get_attribute: sys::cuMemPoolGetAttribute,
    trim_to: sys::cuMemPoolTrimTo,
    alloc_async: sys::cuMemAllocFromPoolAsync,
    free_async: sys::cuMemFreeAsync,
}

/// Peer-access entry points (CUDA 4.0, but optional: a driver without them reports no
/// peers).
#[derive(Clone, Copy)]
struct PeerApi {
    can_access: sys::cuDeviceCanAccessPeer,
    enable: sys::cuCtxEnablePeerAccess,
}

/// The names of the virtual-memory symbols (CUDA 10.2), in [`Driver::symbols`] order.
pub const VMM_SYMBOLS: [&str; 8] = [
    "cuMemGetAllocationGranularity",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

/// The names of the memory-pool symbols (CUDA 11.2), in [`Driver::symbols`] order.
pub const POOL_SYMBOLS: [&str; 8] = [
    "cuDeviceGetDefaultMemPool",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
];

/// The names of the required symbols, in the order [`Driver::load`] resolves them. For
/// `cuDevicePrimaryCtxRelease_v2` the CUDA 7 name `cuDevicePrimaryCtxRelease` is accepted too.
pub const REQUIRED_SYMBOLS: [&str; 25] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
];

/// The loaded driver library and its entry points: the result layer, where every `CUresult`
/// becomes a [`Result`].
///
/// Required symbols (CUDA ≤ 7.0, and `_v2` names where the header maps to them) are resolved
/// at [`Driver::load`], a missing one being [`Error::MissingSymbol`]; the virtual-memory
/// (CUDA 10.2) and memory-pool (CUDA 11.2) groups are resolved when every symbol of the group
/// is there, and calls into a missing group are [`Error::Unsupported`] naming the symbol.
///
/// Calls that take a stream, event or pool handle are crate-private: the driver dereferences
/// those handles, so only [`CudaDevice`], which hands them out and checks them, passes them.
/// Calls that need a current context are made by [`CudaDevice`] after it made its device's
/// primary context current.
pub struct Driver {
    path: String,
    init: sys::cuInit,
    driver_get_version: sys::cuDriverGetVersion,
    device_get_count: sys::cuDeviceGetCount,
    device_get: sys::cuDeviceGet,
    device_get_name: sys::cuDeviceGetName,
    device_get_attribute: sys::cuDeviceGetAttribute,
    device_total_mem: sys::cuDeviceTotalMem_v2,
    get_error_name: sys::cuGetErrorName,
    get_error_string: sys::cuGetErrorString,
    primary_ctx_retain: sys::cuDevicePrimaryCtxRetain,
    primary_ctx_release: sys::cuDevicePrimaryCtxRelease_v2,
    ctx_get_current: sys::cuCtxGetCurrent,
    ctx_set_current: sys::cuCtxSetCurrent,
    ctx_synchronize: sys::cuCtxSynchronize,
    mem_get_info: sys::cuMemGetInfo_v2,
    mem_alloc: sys::cuMemAlloc_v2,
    mem_free: sys::cuMemFree_v2,
    stream_create: sys::cuStreamCreate,
    stream_destroy: sys::cuStreamDestroy_v2,
    stream_synchronize: sys::cuStreamSynchronize,
    event_create: sys::cuEventCreate,
    event_record: sys::cuEventRecord,
    event_query: sys::cuEventQuery,
    event_synchronize: sys::cuEventSynchronize,
    event_destroy: sys::cuEventDestroy_v2,
    vmm: Option<VmmApi>,
    pools: Option<PoolApi>,
    peer: Option<PeerApi>,
    // Keeps the code behind the function pointers above loaded; dropped last.
    library: Library,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("cuda::Driver")
            .field("path", &self.path)
            .field("vmm_symbols", &self.vmm.is_some())
            .field("pool_symbols", &self.pools.is_some())
            .finish_non_exhaustive()
    }
}

/// Resolves every symbol of an optional group, or none.
macro_rules! optional_group {
    ($library:expr, $ty:ident { $($field:ident: $name:literal),* $(,)? }) => {{
        // SAFETY: each type is the signature `cuda.h` declares for the symbol of that name,
        // transcribed in `portalloc_sys::cuda`.
        (|| unsafe {
            Some($ty {
                $($field: loader::optional($library, $name)?,)*
            })
        })()
    }};
}

impl Driver {
    /// Loads the first library of `candidates` that opens and resolves the symbols.
    ///
    /// # Errors
    /// [`Error::LibraryLoad`] when none opens (with each candidate's reason);
    /// [`Error::MissingSymbol`] when a required call is missing (too old a driver, or not
    /// libcuda at all).
    pub fn load(candidates: &[String]) -> Result<Driver> {
        let (library, path) =
            loader::open_first(candidates).map_err(|failures| Error::LibraryLoad {
                library: candidates.join(", "),
                reason: failures.join("; "),
            })?;
        let lib = &library;
        let vmm = optional_group!(
            lib,
            VmmApi {
                get_allocation_granularity: "cuMemGetAllocationGranularity",
                create: "cuMemCreate",
                release: "cuMemRelease",
                address_reserve: "cuMemAddressReserve",
                address_free: "cuMemAddressFree",
                map: "cuMemMap",
                unmap: "cuMemUnmap",
                set_access: "cuMemSetAccess",
            }
        );
        let pools = optional_group!(
            lib,
            PoolApi {
                default_mem_pool: "cuDeviceGetDefaultMemPool",
                create: "cuMemPoolCreate",
                destroy: "cuMemPoolDestroy",
                set_attribute: "cuMemPoolSetAttribute",
                get_attribute: "cuMemPoolGetAttribute",
                trim_to: "cuMemPoolTrimTo",
                alloc_async: "cuMemAllocFromPoolAsync",
                free_async: "cuMemFreeAsync",
            }
        );
        let peer = optional_group!(
            lib,
            PeerApi {
                can_access: "cuDeviceCanAccessPeer",
                enable: "cuCtxEnablePeerAccess",
            }
        );
        // SAFETY (all `required` / `optional` calls): each type is the signature `cuda.h`
        // declares for the symbol of that name, transcribed in `portalloc_sys::cuda`.
        unsafe {
            Ok(Driver {
                init: loader::required(lib, &path, "cuInit")?,
                driver_get_version: loader::required(lib, &path, "cuDriverGetVersion")?,
                device_get_count: loader::required(lib, &path, "cuDeviceGetCount")?,
                device_get: loader::required(lib, &path, "cuDeviceGet")?,
                device_get_name: loader::required(lib, &path, "cuDeviceGetName")?,
                device_get_attribute: loader::required(lib, &path, "cuDeviceGetAttribute")?,
                device_total_mem: loader::required(lib, &path, "cuDeviceTotalMem_v2")?,
                get_error_name: loader::required(lib, &path, "cuGetErrorName")?,
                get_error_string: loader::required(lib, &path, "cuGetErrorString")?,
                primary_ctx_retain: loader::required(lib, &path, "cuDevicePrimaryCtxRetain")?,
                // CUDA 11.0 renamed it `_v2`; the CUDA 7 name has the same signature.
                primary_ctx_release: match loader::optional(lib, "cuDevicePrimaryCtxRelease_v2") {
                    Some(f) => f,
                    None => loader::required(lib, &path, "cuDevicePrimaryCtxRelease")?,
                },
                ctx_get_current: loader::required(lib, &path, "cuCtxGetCurrent")?,
                ctx_set_current: loader::required(lib, &path, "cuCtxSetCurrent")?,
                ctx_synchronize: loader::required(lib, &path, "cuCtxSynchronize")?,
                mem_get_info: loader::required(lib, &path, "cuMemGetInfo_v2")?,
                mem_alloc: loader::required(lib, &path, "cuMemAlloc_v2")?,
                mem_free: loader::required(lib, &path, "cuMemFree_v2")?,
                stream_create: loader::required(lib, &path, "cuStreamCreate")?,
                stream_destroy: loader::required(lib, &path, "cuStreamDestroy_v2")?,
                stream_synchronize: loader::required(lib, &path, "cuStreamSynchronize")?,
                event_create: loader::required(lib, &path, "cuEventCreate")?,
                event_record: loader::required(lib, &path, "cuEventRecord")?,
                event_query: loader::required(lib, &path, "cuEventQuery")?,
                event_synchronize: loader::required(lib, &path, "cuEventSynchronize")?,
                event_destroy: loader::required(lib, &path, "cuEventDestroy_v2")?,
                vmm,
                pools,
                peer,
                library,
                path,
            })
        }
    }

    /// Loads the library [`library_candidates`] names.
    ///
    /// # Errors
    /// As [`Driver::load`].
    pub fn load_default() -> Result<Driver> {
        Driver::load(&library_candidates()?)
    }

    /// The path the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// True when every virtual-memory symbol (CUDA 10.2) was resolved.
    pub fn has_vmm_symbols(&self) -> bool {
        self.vmm.is_some()
    }

    /// True when the peer-access symbols (`cuDeviceCanAccessPeer`, `cuCtxEnablePeerAccess`)
    /// were resolved.
    pub fn has_peer_symbols(&self) -> bool {
        self.peer.is_some()
    }

    /// `cuDeviceCanAccessPeer`: whether `device` can access memory of `peer`; false when the
    /// driver lacks the call.
    ///
    /// # Errors
    /// [`Error::Driver`] (`CUDA_ERROR_INVALID_DEVICE` for an unknown device).
    pub fn can_access_peer(&self, device: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
        let Some(api) = self.peer else {
            return Ok(false);
        };
        let mut can: c_int = 0;
        // SAFETY: writes one int through a valid pointer; devices by value.
        self.check("cuDeviceCanAccessPeer", unsafe {
            (api.can_access)(&mut can, device, peer)
        })?;
        Ok(can != 0)
    }

    /// `cuCtxEnablePeerAccess(peer_ctx, 0)` from the current context; already enabled is
    /// success.
    ///
    /// # Safety
    /// `peer_ctx` must be a live context (retained by the caller).
    pub(crate) unsafe fn ctx_enable_peer_access(&self, peer_ctx: sys::CUcontext) -> Result<()> {
        let api = self
            .peer
            .ok_or_else(|| self.lacks("cuCtxEnablePeerAccess", "peer access"))?;
        // SAFETY: the caller keeps the context alive; flags must be 0.
        let code = unsafe { (api.enable)(peer_ctx, 0) };
        if code == sys::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        self.check("cuCtxEnablePeerAccess", code)
    }

    /// True when every memory-pool symbol (CUDA 11.2) was resolved.
    pub fn has_pool_symbols(&self) -> bool {
        self.pools.is_some()
    }

    /// Every symbol portalloc uses, with whether this library exports it — each looked up in
    /// the library now, not assumed from a successful load: the required ones (for
    /// `cuDevicePrimaryCtxRelease_v2`, its CUDA 7 name counts too), then [`VMM_SYMBOLS`] and
    /// [`POOL_SYMBOLS`] (a group is used whole or not at all).
    pub fn symbols(&self) -> Vec<(&'static str, bool)> {
        let mut out: Vec<(&'static str, bool)> = REQUIRED_SYMBOLS
            .iter()
            .map(|&s| {
                let found = loader::exports(&self.library, s)
                    || (s == "cuDevicePrimaryCtxRelease_v2"
                        && loader::exports(&self.library, "cuDevicePrimaryCtxRelease"));
                (s, found)
            })
            .collect();
        out.extend(VMM_SYMBOLS.iter().map(|&s| (s, self.vmm.is_some())));
        out.extend(POOL_SYMBOLS.iter().map(|&s| (s, self.pools.is_some())));
        out
    }

    /// The driver's name and text for a `CUresult` (`CUDA_ERROR_NO_DEVICE`, "no CUDA-capable
    /// device is detected"); `CUDA_ERROR_<code>` when the driver does not know it.
    pub fn error_name(&self, code: sys::CUresult) -> (String, String) {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        let mut text: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: both calls write a pointer to a static NUL-terminated string owned by the
        // driver, or leave it null for an unknown code.
        let (rn, rt) = unsafe {
            (
                (self.get_error_name)(code, &mut name),
                (self.get_error_string)(code, &mut text),
            )
        };
        let read = |ok: bool, p: *const std::ffi::c_char| {
            (ok && !p.is_null()).then(|| {
                // SAFETY: non-null results point to static C strings (see above).
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            })
        };
        (
            read(rn == sys::CUDA_SUCCESS, name).unwrap_or_else(|| format!("CUDA_ERROR_{code}")),
            read(rt == sys::CUDA_SUCCESS, text).unwrap_or_else(|| "unknown error".into()),
        )
    }

    /// `Ok` for `CUDA_SUCCESS`, else [`Error::Driver`] with the driver's name and text.
    pub(crate) fn check(&self, call: &'static str, code: sys::CUresult) -> Result<()> {
        if code == sys::CUDA_SUCCESS {
            return Ok(());
        }
        let (name, message) = self.error_name(code);
        Err(Error::Driver {
            backend: "cuda",
            call,
            code: code.into(),
            name,
            message,
        })
    }

    /// As [`Driver::check`], with `CUDA_ERROR_OUT_OF_MEMORY` as [`Error::DeviceOutOfMemory`]
    /// (the free figure from `cuMemGetInfo_v2`, 0 when that fails too). For calls that take
    /// device memory, with the context of the device current.
    fn check_alloc(&self, call: &'static str, code: sys::CUresult, requested: u64) -> Result<()> {
        if code == sys::CUDA_ERROR_OUT_OF_MEMORY {
            let free = self.mem_info().map(|(free, _)| free).unwrap_or(0);
            return Err(Error::DeviceOutOfMemory {
                backend: "cuda",
                requested,
                free,
            });
        }
        self.check(call, code)
    }

    fn vmm(&self, call: &'static str) -> Result<&VmmApi> {
        self.vmm
            .as_ref()
            .ok_or_else(|| self.lacks(call, "10.2 virtual memory management"))
    }

    fn pools(&self, call: &'static str) -> Result<&PoolApi> {
        self.pools
            .as_ref()
            .ok_or_else(|| self.lacks(call, "11.2 memory pools"))
    }

    fn lacks(&self, call: &'static str, feature: &str) -> Error {
        Error::Unsupported {
            what: call.to_string(),
            backend: "cuda",
            reason: format!(
                "the driver library {} does not export it (CUDA {feature}); a newer NVIDIA \
                 driver is needed",
                self.path
            ),
        }
    }

    /// `cuInit(0)`.
    pub fn init(&self) -> Result<()> {
        // SAFETY: cuInit takes flags by value and must be 0.
        self.check("cuInit", unsafe { (self.init)(0) })
    }

    /// `cuDriverGetVersion` as the driver writes it: 12020 for CUDA 12.2.
    pub fn version_code(&self) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDriverGetVersion", unsafe {
            (self.driver_get_version)(&mut v)
        })?;
        Ok(v)
    }

    /// `cuDriverGetVersion`, as (major, minor): 12020 → (12, 2).
    pub fn driver_version(&self) -> Result<(i32, i32)> {
        let v = self.version_code()?;
        Ok((v / 1000, (v % 1000) / 10))
    }

    /// `cuDeviceGetCount` (after [`Driver::init`]).
    pub fn device_count(&self) -> Result<u32> {
        let mut n: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDeviceGetCount", unsafe {
            (self.device_get_count)(&mut n)
        })?;
        Ok(n.max(0) as u32)
    }

    /// The device handle for an ordinal.
    pub fn device(&self, ordinal: u32) -> Result<sys::CUdevice> {
        let ordinal = c_int::try_from(ordinal).map_err(|_| Error::InvalidArgument {
            call: "cuDeviceGet",
            reason: format!("device ordinal {ordinal} is out of range"),
        })?;
        let mut d: sys::CUdevice = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDeviceGet", unsafe { (self.device_get)(&mut d, ordinal) })?;
        Ok(d)
    }

    /// `cuDeviceGetName`.
    pub fn device_name(&self, device: sys::CUdevice) -> Result<String> {
        let mut buf = [0u8; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into `buf`.
        self.check("cuDeviceGetName", unsafe {
            (self.device_get_name)(buf.as_mut_ptr().cast(), buf.len() as c_int, device)
        })?;
        Ok(loader::c_buf_to_string(&buf))
    }

    /// `cuDeviceGetAttribute`.
    pub fn device_attribute(&self, device: sys::CUdevice, attribute: c_int) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.device_get_attribute)(&mut v, attribute, device)
        })?;
        Ok(v)
    }

    /// `cuDeviceTotalMem_v2`.
    pub fn total_mem(&self, device: sys::CUdevice) -> Result<u64> {
        let mut bytes: usize = 0;
        // SAFETY: writes one size_t through a valid pointer.
        self.check("cuDeviceTotalMem_v2", unsafe {
            (self.device_total_mem)(&mut bytes, device)
        })?;
        Ok(bytes as u64)
    }

    /// `cuDevicePrimaryCtxRetain`: the device's primary context, retained once more.
    pub fn primary_ctx_retain(&self, device: sys::CUdevice) -> Result<sys::CUcontext> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle through a valid pointer.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.primary_ctx_retain)(&mut ctx, device)
        })?;
        Ok(ctx)
    }

    /// `cuDevicePrimaryCtxRelease_v2`: undoes one [`Driver::primary_ctx_retain`].
    ///
    /// # Safety
    /// The caller retained the primary context of `device` with this driver and releases it
    /// once: one release more drops a context other code (a [`CudaDevice`], PyTorch, cudarc)
    /// still relies on, and the device's memory with it.
    pub(crate) unsafe fn primary_ctx_release(&self, device: sys::CUdevice) -> Result<()> {
        // SAFETY: takes the device ordinal by value; the caller balances it with a retain.
        self.check("cuDevicePrimaryCtxRelease_v2", unsafe {
            (self.primary_ctx_release)(device)
        })
    }

    /// `cuCtxGetCurrent`: the calling thread's current context (null for none).
    pub fn current_context(&self) -> Result<sys::CUcontext> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle through a valid pointer.
        self.check("cuCtxGetCurrent", unsafe {
            (self.ctx_get_current)(&mut ctx)
        })?;
        Ok(ctx)
    }

    /// `cuCtxSetCurrent`, skipped when `ctx` is current already.
    pub(crate) fn make_current(&self, ctx: sys::CUcontext) -> Result<()> {
        if self.current_context()? == ctx {
            return Ok(());
        }
        // SAFETY: `ctx` is a primary context the caller holds retained.
        self.check("cuCtxSetCurrent", unsafe { (self.ctx_set_current)(ctx) })
    }

    /// `cuMemGetInfo_v2` of the current context's device: (free, total).
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t through valid pointers.
        self.check("cuMemGetInfo_v2", unsafe {
            (self.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// `cuMemAlloc_v2` in the current context.
    pub(crate) fn mem_alloc(&self, size: u64) -> Result<u64> {
        let bytes = to_usize("cuMemAlloc_v2", size)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer through a valid pointer.
        let code = unsafe { (self.mem_alloc)(&mut ptr, bytes) };
        self.check_alloc("cuMemAlloc_v2", code, size)?;
        Ok(ptr)
    }

    /// `cuMemFree_v2`. The driver checks the pointer (an integer) itself.
    pub(crate) fn mem_free(&self, ptr: u64) -> Result<()> {
        // SAFETY: the device pointer is passed by value; the caller owns the allocation.
        self.check("cuMemFree_v2", unsafe { (self.mem_free)(ptr) })
    }

    /// `cuMemGetAllocationGranularity` for pinned device memory on `device`.
    pub(crate) fn allocation_granularity(
        &self,
        device: sys::CUdevice,
        option: sys::CUmemAllocationGranularity_flags,
    ) -> Result<u64> {
        let api = self.vmm("cuMemGetAllocationGranularity")?;
        let prop = allocation_prop(device);
        let mut g: usize = 0;
        // SAFETY: `prop` is a fully initialised CUmemAllocationProp; writes one size_t.
        self.check("cuMemGetAllocationGranularity", unsafe {
            (api.get_allocation_granularity)(&mut g, &prop, option)
        })?;
        Ok(g as u64)
    }

    /// `cuMemCreate` of pinned memory on `device`.
    pub(crate) fn mem_create(&self, device: sys::CUdevice, size: u64) -> Result<u64> {
        let api = self.vmm("cuMemCreate")?;
        let bytes = to_usize("cuMemCreate", size)?;
        let prop = allocation_prop(device);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is fully initialised; writes one handle through a valid pointer.
        let code = unsafe { (api.create)(&mut handle, bytes, &prop, 0) };
        self.check_alloc("cuMemCreate", code, size)?;
        Ok(handle)
    }

    /// `cuMemRelease`.
    pub(crate) fn mem_release(&self, handle: u64) -> Result<()> {
        let api = self.vmm("cuMemRelease")?;
        // SAFETY: the handle is an integer the driver looks up and checks.
        self.check("cuMemRelease", unsafe { (api.release)(handle) })
    }

    /// `cuMemAddressReserve` anywhere (`addr` 0).
    pub(crate) fn address_reserve(&self, size: u64, alignment: u64) -> Result<u64> {
        let api = self.vmm("cuMemAddressReserve")?;
        let bytes = to_usize("cuMemAddressReserve", size)?;
        let align = to_usize("cuMemAddressReserve", alignment)?;
        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer through a valid pointer.
        let code = unsafe { (api.address_reserve)(&mut va, bytes, align, 0, 0) };
        self.check("cuMemAddressReserve", code)?;
        Ok(va)
    }

    /// `cuMemAddressFree`.
    pub(crate) fn address_free(&self, va: u64, size: u64) -> Result<()> {
        let api = self.vmm("cuMemAddressFree")?;
        let bytes = to_usize("cuMemAddressFree", size)?;
        // SAFETY: integers by value; the driver checks the range.
        self.check("cuMemAddressFree", unsafe { (api.address_free)(va, bytes) })
    }

    /// `cuMemMap`.
    pub(crate) fn mem_map(&self, va: u64, size: u64, offset: u64, handle: u64) -> Result<()> {
        let api = self.vmm("cuMemMap")?;
        let bytes = to_usize("cuMemMap", size)?;
        let offset = to_usize("cuMemMap", offset)?;
        // SAFETY: integers by value; the driver checks the range and handle.
        self.check("cuMemMap", unsafe {
            (api.map)(va, bytes, offset, handle, 0)
        })
    }

    /// `cuMemUnmap`.
    pub(crate) fn mem_unmap(&self, va: u64, size: u64) -> Result<()> {
        let api = self.vmm("cuMemUnmap")?;
        let bytes = to_usize("cuMemUnmap", size)?;
        // SAFETY: integers by value; the driver checks the range.
        self.check("cuMemUnmap", unsafe { (api.unmap)(va, bytes) })
    }

    /// `cuMemSetAccess`: read-write for `device`.
    pub(crate) fn set_access(&self, device: sys::CUdevice, va: u64, size: u64) -> Result<()> {
        let api = self.vmm("cuMemSetAccess")?;
        let bytes = to_usize("cuMemSetAccess", size)?;
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one initialised descriptor, count 1.
        self.check("cuMemSetAccess", unsafe {
            (api.set_access)(va, bytes, &desc, 1)
        })
    }

    /// `cuMemSetAccess`: read-write for each of `devices`, one descriptor each, in one call.
    pub(crate) fn set_access_devices(
        &self,
        devices: &[sys::CUdevice],
        va: u64,
        size: u64,
    ) -> Result<()> {
        let api = self.vmm("cuMemSetAccess")?;
        let bytes = to_usize("cuMemSetAccess", size)?;
        let descs: Vec<sys::CUmemAccessDesc> = devices
            .iter()
            .map(|&id| sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
                    id,
                },
                flags: sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: `descs.len()` initialised descriptors.
        self.check("cuMemSetAccess", unsafe {
            (api.set_access)(va, bytes, descs.as_ptr(), descs.len())
        })
    }

    /// `cuDeviceGetDefaultMemPool`: the device's default pool (portalloc uses a pool of its
    /// own; this is for interop and reports).
    pub fn default_mem_pool(&self, device: sys::CUdevice) -> Result<sys::CUmemoryPool> {
        let api = self.pools("cuDeviceGetDefaultMemPool")?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: writes one pool handle through a valid pointer.
        self.check("cuDeviceGetDefaultMemPool", unsafe {
            (api.default_mem_pool)(&mut pool, device)
        })?;
        Ok(pool)
    }

    /// `cuMemPoolCreate` of a pinned-memory pool on `device`, no IPC handle types.
    pub(crate) fn mem_pool_create(&self, device: sys::CUdevice) -> Result<sys::CUmemoryPool> {
        let api = self.pools("cuMemPoolCreate")?;
        let props = sys::CUmemPoolProps {
            allocType: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: sys::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: 0,
            reserved: [0; 56],
        };
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `props` is fully initialised (zero tail); writes one pool handle.
        self.check("cuMemPoolCreate", unsafe {
            (api.create)(&mut pool, &props)
        })?;
        Ok(pool)
    }

    /// `cuMemPoolDestroy`.
    ///
    /// # Safety
    /// `pool` must come from [`Driver::mem_pool_create`] and not be destroyed already.
    pub(crate) unsafe fn mem_pool_destroy(&self, pool: sys::CUmemoryPool) -> Result<()> {
        let api = self.pools("cuMemPoolDestroy")?;
        // SAFETY: the caller guarantees `pool` is live.
        self.check("cuMemPoolDestroy", unsafe { (api.destroy)(pool) })
    }

    /// `cuMemPoolSetAttribute` of a `cuuint64_t` attribute.
    ///
    /// # Safety
    /// `pool` must be a live pool and `attr` one whose value type is `cuuint64_t`.
    pub(crate) unsafe fn pool_set_u64(
        &self,
        pool: sys::CUmemoryPool,
        attr: sys::CUmemPool_attribute,
        value: u64,
    ) -> Result<()> {
        let api = self.pools("cuMemPoolSetAttribute")?;
        let mut v: sys::cuuint64_t = value;
        // SAFETY: the caller guarantees pool and attribute; `v` is a live cuuint64_t.
        self.check("cuMemPoolSetAttribute", unsafe {
            (api.set_attribute)(pool, attr, (&mut v as *mut u64).cast())
        })
    }

    /// `cuMemPoolGetAttribute` of a `cuuint64_t` attribute.
    ///
    /// # Safety
    /// As [`Driver::pool_set_u64`].
    pub(crate) unsafe fn pool_get_u64(
        &self,
        pool: sys::CUmemoryPool,
        attr: sys::CUmemPool_attribute,
    ) -> Result<u64> {
        let api = self.pools("cuMemPoolGetAttribute")?;
        let mut v: sys::cuuint64_t = 0;
        // SAFETY: the caller guarantees pool and attribute; the driver writes one cuuint64_t.
        self.check("cuMemPoolGetAttribute", unsafe {
            (api.get_attribute)(pool, attr, (&mut v as *mut u64).cast())
        })?;
        Ok(v)
    }

    /// `cuMemPoolTrimTo`.
    ///
    /// # Safety
    /// `pool` must be a live pool.
    pub(crate) unsafe fn pool_trim_to(&self, pool: sys::CUmemoryPool, keep: u64) -> Result<()> {
        let api = self.pools("cuMemPoolTrimTo")?;
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        // SAFETY: the caller guarantees `pool` is live.
        self.check("cuMemPoolTrimTo", unsafe { (api.trim_to)(pool, keep) })
    }

    /// `cuMemAllocFromPoolAsync`.
    ///
    /// # Safety
    /// `pool` must be a live pool and `stream` a live stream of the current context (or a
    /// special handle: null, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`).
    pub(crate) unsafe fn alloc_from_pool_async(
        &self,
        size: u64,
        pool: sys::CUmemoryPool,
        stream: sys::CUstream,
    ) -> Result<u64> {
        let api = self.pools("cuMemAllocFromPoolAsync")?;
        let bytes = to_usize("cuMemAllocFromPoolAsync", size)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the caller guarantees pool and stream; writes one device pointer.
        let code = unsafe { (api.alloc_async)(&mut ptr, bytes, pool, stream) };
        self.check_alloc("cuMemAllocFromPoolAsync", code, size)?;
        Ok(ptr)
    }

    /// `cuMemFreeAsync`.
    ///
    /// # Safety
    /// `stream` must be a live stream of the current context (or a special handle).
    pub(crate) unsafe fn free_async(&self, ptr: u64, stream: sys::CUstream) -> Result<()> {
        let api = self.pools("cuMemFreeAsync")?;
        // SAFETY: the caller guarantees the stream; the pointer is checked by the driver.
        self.check("cuMemFreeAsync", unsafe { (api.free_async)(ptr, stream) })
    }

    /// `cuStreamCreate` in the current context.
    pub(crate) fn stream_create(&self, flags: std::ffi::c_uint) -> Result<sys::CUstream> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: writes one stream handle through a valid pointer.
        self.check("cuStreamCreate", unsafe {
            (self.stream_create)(&mut s, flags)
        })?;
        Ok(s)
    }

    /// `cuStreamDestroy_v2`.
    ///
    /// # Safety
    /// `stream` must be a live stream made by [`Driver::stream_create`].
    pub(crate) unsafe fn stream_destroy(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: the caller guarantees the stream is live.
        self.check("cuStreamDestroy_v2", unsafe {
            (self.stream_destroy)(stream)
        })
    }

    /// `cuStreamSynchronize`.
    ///
    /// # Safety
    /// `stream` must be a live stream of the current context, null, or one of the special
    /// handles `CU_STREAM_LEGACY` / `CU_STREAM_PER_THREAD`.
    pub(crate) unsafe fn stream_synchronize(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: the caller guarantees the stream is live or null.
        self.check("cuStreamSynchronize", unsafe {
            (self.stream_synchronize)(stream)
        })
    }

    /// `cuCtxSynchronize`: waits for all work of the current context.
    pub(crate) fn ctx_synchronize(&self) -> Result<()> {
        // SAFETY: no arguments; the caller made its context current.
        self.check("cuCtxSynchronize", unsafe { (self.ctx_synchronize)() })
    }

    /// `cuEventCreate` in the current context.
    pub(crate) fn event_create(&self, flags: std::ffi::c_uint) -> Result<sys::CUevent> {
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: writes one event handle through a valid pointer.
        self.check("cuEventCreate", unsafe {
            (self.event_create)(&mut e, flags)
        })?;
        Ok(e)
    }

    /// `cuEventRecord`.
    ///
    /// # Safety
    /// `event` must be live, `stream` live (or a special handle), both of the current context.
    pub(crate) unsafe fn event_record(
        &self,
        event: sys::CUevent,
        stream: sys::CUstream,
    ) -> Result<()> {
        // SAFETY: the caller guarantees both handles.
        self.check("cuEventRecord", unsafe {
            (self.event_record)(event, stream)
        })
    }

    /// `cuEventQuery`: true when complete, false for `CUDA_ERROR_NOT_READY`.
    ///
    /// # Safety
    /// `event` must be live.
    pub(crate) unsafe fn event_query(&self, event: sys::CUevent) -> Result<bool> {
        // SAFETY: the caller guarantees the event.
        match unsafe { (self.event_query)(event) } {
            sys::CUDA_ERROR_NOT_READY => Ok(false),
            code => self.check("cuEventQuery", code).map(|()| true),
        }
    }

    /// `cuEventSynchronize`.
    ///
    /// # Safety
    /// `event` must be live.
    pub(crate) unsafe fn event_synchronize(&self, event: sys::CUevent) -> Result<()> {
        // SAFETY: the caller guarantees the event.
        self.check("cuEventSynchronize", unsafe {
            (self.event_synchronize)(event)
        })
    }

    /// `cuEventDestroy_v2`.
    ///
    /// # Safety
    /// `event` must be live and not used again.
    pub(crate) unsafe fn event_destroy(&self, event: sys::CUevent) -> Result<()> {
        // SAFETY: the caller guarantees the event.
        self.check("cuEventDestroy_v2", unsafe { (self.event_destroy)(event) })
    }
}

/// The allocation properties portalloc uses: pinned device memory on `device`, no IPC handle.
fn allocation_prop(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationPropAllocFlags::default(),
    }
}

/// A size as the driver's `size_t`.
fn to_usize(call: &'static str, value: u64) -> Result<usize> {
    usize::try_from(value).map_err(|_| Error::InvalidArgument {
        call,
        reason: format!("{value} does not fit this platform's size_t"),
    })
}

/// Probes the CUDA backend: load, `cuInit`, versions, devices. Never fails: what went wrong
/// is in [`Probe::error`] / [`Probe::load_failures`].
pub fn probe() -> Probe {
    match library_candidates() {
        Ok(candidates) => probe_with(&candidates),
        Err(e) => Probe {
            backend: Some(Vendor::Cuda),
            error: Some(e.to_string()),
            ..Probe::default()
        },
    }
}

/// [`probe`] over explicit library candidates.
pub fn probe_with(candidates: &[String]) -> Probe {
    let mut probe = Probe {
        backend: Some(Vendor::Cuda),
        ..Probe::default()
    };
    let driver = match Driver::load(candidates) {
        Ok(d) => d,
        Err(Error::LibraryLoad { reason, .. }) => {
            probe.load_failures = reason.split("; ").map(String::from).collect();
            probe.error = Some(format!(
                "driver library not found ({})",
                candidates.join(", ")
            ));
            return probe;
        }
        Err(e) => {
            probe.error = Some(e.to_string());
            return probe;
        }
    };
    probe.library = Some(driver.path().to_string());
    if let Ok((major, minor)) = driver.driver_version() {
        probe.driver_version = Some(format!("{major}.{minor}"));
    }
    let found = driver.init().and_then(|()| driver.device_count());
    match found {
        Ok(count) => {
            probe.device_count = count;
            for ordinal in 0..count {
                probe
                    .devices
                    .push(describe(&driver, ordinal).unwrap_or_else(|e| e.to_string()));
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

fn describe(driver: &Driver, ordinal: u32) -> Result<String> {
    let device = driver.device(ordinal)?;
    let name = driver.device_name(device)?;
    let major =
        driver.device_attribute(device, sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor =
        driver.device_attribute(device, sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let total = driver.total_mem(device)?;
    Ok(format!(
        "{ordinal}: {name} (sm_{major}{minor}, {})",
        crate::units::Bytes(total)
    ))
}
