//! The CUDA backend: NVIDIA's driver API (`libcuda.so.1`), loaded at run time.
//!
//! Three layers, bottom to top:
//!
//! * [`portalloc_sys::cuda`]: the raw types and signatures, written from `cuda.h`.
//! * [`Driver`]: the library, loaded with libloading from `PORTALLOC_CUDA_LIBRARY` or
//!   `libcuda.so.1` (never the bare `libcuda.so`), its symbols resolved (required ones →
//!   [`Error::MissingSymbol`], the CUDA 10.2 virtual-memory and 11.2 pool groups, the
//!   peer-access and the pinned-host calls → `Option`),
//!   and every call checked: a `CUresult` becomes [`Error::Driver`] with the driver's own
//!   name and text. The calls that pass device handles are the GPU layer's
//!   (`backends/gpu`), implemented for CUDA in `device.rs`.
//! * [`CudaDevice`]: the [`crate::Device`] of one device ordinal, on its primary context, with
//!   the [`crate::device::VirtualMemory`] and [`crate::device::StreamOrderedPool`]
//!   capabilities where the driver and the device have them: the GPU layer's
//!   [`GpuDevice`](crate::backends::GpuDevice) over CUDA.
//!
//! [`probe`] is what discovery runs: load, `cuInit`, versions, devices, or the driver's error
//! name (`CUDA_ERROR_NO_DEVICE` on a machine without a GPU).

use std::ffi::c_int;

use libloading::Library;
use portalloc_sys::cuda as sys;

#[cfg(feature = "cudarc")]
pub mod cudarc;
mod device;

pub use device::{open_all, open_some, CallerContext, Cuda, CudaCensus, CudaDevice};

use super::loader::{self, symbol_table, Checked};
use super::Probe;
use crate::config::Config;
use crate::device::Vendor;
use crate::error::{Error, Result};

/// The variable that names the CUDA driver library to load instead of the default (read by
/// [`crate::config`], as [`Config::cuda_library`]).
pub const LIBRARY_VARIABLE: &str = crate::config::PORTALLOC_CUDA_LIBRARY;

/// Where to look for the driver library, in order: `config`'s
/// [`cuda_library`](Config::cuda_library) (`PORTALLOC_CUDA_LIBRARY`) alone if set, else
/// `libcuda.so.1` (never the bare `libcuda.so`, which can be the toolkit's link-time stub
/// that fails every call) or `nvcuda.dll`. Reads no environment variable.
pub fn library_candidates(config: &Config) -> Vec<String> {
    match &config.cuda_library.value {
        Some(path) if !path.is_empty() => vec![path.clone()],
        _ if cfg!(windows) => vec!["nvcuda.dll".into()],
        _ => vec!["libcuda.so.1".into()],
    }
}

symbol_table! {
    /// The required entry points (CUDA ≤ 7.0, and the `_v2` names the header maps to),
    /// resolved at [`Driver::load`]. For `cuDevicePrimaryCtxRelease_v2` the CUDA 7 name
    /// `cuDevicePrimaryCtxRelease` (same signature) is accepted too.
    Required, REQUIRED_SYMBOLS {
        init: cuInit, driver_get_version: cuDriverGetVersion, device_get_count: cuDeviceGetCount,
        device_get: cuDeviceGet, device_get_name: cuDeviceGetName,
        device_get_attribute: cuDeviceGetAttribute, device_total_mem: cuDeviceTotalMem_v2,
        get_error_name: cuGetErrorName, get_error_string: cuGetErrorString,
        primary_ctx_retain: cuDevicePrimaryCtxRetain,
        primary_ctx_release: cuDevicePrimaryCtxRelease_v2 | cuDevicePrimaryCtxRelease,
        ctx_get_current: cuCtxGetCurrent, ctx_set_current: cuCtxSetCurrent,
        ctx_synchronize: cuCtxSynchronize, mem_get_info: cuMemGetInfo_v2, mem_alloc: cuMemAlloc_v2,
        mem_free: cuMemFree_v2, stream_create: cuStreamCreate, stream_destroy: cuStreamDestroy_v2,
        stream_synchronize: cuStreamSynchronize, event_create: cuEventCreate,
        event_record: cuEventRecord, event_query: cuEventQuery,
        event_synchronize: cuEventSynchronize, event_destroy: cuEventDestroy_v2,
        stream_wait_event: cuStreamWaitEvent, memcpy_dtoh_async: cuMemcpyDtoHAsync_v2,
        memcpy_htod_async: cuMemcpyHtoDAsync_v2,
    }
    /// Virtual-memory entry points (CUDA 10.2): all resolved, or none used.
    Vmm, VMM_SYMBOLS {
        granularity: cuMemGetAllocationGranularity, create: cuMemCreate, release: cuMemRelease,
        reserve: cuMemAddressReserve, address_free: cuMemAddressFree, map: cuMemMap, unmap: cuMemUnmap,
        set_access: cuMemSetAccess,
    }
    /// Stream-ordered pool entry points (CUDA 11.2): all resolved, or none used.
    Pools, POOL_SYMBOLS {
        default_pool: cuDeviceGetDefaultMemPool, create: cuMemPoolCreate, destroy: cuMemPoolDestroy,
        set_attribute: cuMemPoolSetAttribute, get_attribute: cuMemPoolGetAttribute,
        trim_to: cuMemPoolTrimTo, alloc_async: cuMemAllocFromPoolAsync, free_async: cuMemFreeAsync,
    }
    /// Peer-access entry points (CUDA 4.0, but optional: a driver without them reports no
    /// peers; not in [`Driver::symbols`]).
    Peer, PEER_SYMBOLS { can_access: cuDeviceCanAccessPeer, enable: cuCtxEnablePeerAccess }
    /// Pinned host memory entry points (CUDA 2.2, but optional: a driver without them offers
    /// no pinned memory, and copies use the caller's ordinary host memory).
    PinnedHost, PINNED_HOST_SYMBOLS { alloc: cuMemHostAlloc, free: cuMemFreeHost }
    /// Host-memory registration entry points (CUDA 6.5, but optional: a driver without them
    /// pins host copies with the calls above instead): page-locks memory the caller allocated
    /// and touched, about five times faster than allocating it pinned (rapidsai/cudf PR
    /// #23457).
    HostRegister, HOST_REGISTER_SYMBOLS { register: cuMemHostRegister_v2, unregister: cuMemHostUnregister }
    /// Stream-capture entry points (CUDA 10.1, but optional: a driver without them captures
    /// nothing portalloc could be asked about, and every stream reads as not capturing).
    Capture, CAPTURE_SYMBOLS { capture_info: cuStreamGetCaptureInfo, exchange_mode: cuThreadExchangeStreamCaptureMode }
    /// The device's identity (CUDA 9.2, optional: without it the shared budget keys a device
    /// by its ordinal, name and size).
    Identity, IDENTITY_SYMBOLS { uuid: cuDeviceGetUuid }
    /// Export and import of physical memory as POSIX descriptors (CUDA 10.2, optional:
    /// without them no memory of the device can be handed to another process as a
    /// shareable handle).
    Shareable, SHAREABLE_SYMBOLS { export: cuMemExportToShareableHandle, import: cuMemImportFromShareableHandle }
    /// Legacy IPC handles of plain allocations (CUDA 4.1, optional; `cuIpcOpenMemHandle_v2`
    /// is CUDA 11's name for CUDA 4.1's `cuIpcOpenMemHandle`, same signature).
    Ipc, IPC_SYMBOLS {
        get: cuIpcGetMemHandle, open: cuIpcOpenMemHandle_v2 | cuIpcOpenMemHandle,
        close: cuIpcCloseMemHandle,
    }
}

/// The loaded driver library and its entry points: the result layer, where every `CUresult`
/// becomes a [`Result`].
///
/// Required symbols ([`REQUIRED_SYMBOLS`]) are resolved at [`Driver::load`], a missing one
/// being [`Error::MissingSymbol`]; the virtual-memory (CUDA 10.2) and memory-pool (CUDA
/// 11.2) groups are resolved when every symbol of the group is there, and calls into a
/// missing group are [`Error::Unsupported`] naming the symbol.
///
/// The public calls here take no handle the driver dereferences; those that do (streams,
/// events, pools, device pointers, physical handles) are the GPU layer's `unsafe` calls,
/// made by [`CudaDevice`] after it checked the handle and made its device's primary context
/// current (see `backends/gpu` for the rule).
pub struct Driver {
    path: String,
    pub(crate) api: Required,
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

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("cuda::Driver")
            .field("path", &self.path)
            .field("vmm_symbols", &self.vmm.is_some())
            .field("pool_symbols", &self.pools.is_some())
            .field("pinned_host_symbols", &self.pinned_host.is_some())
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Loads the first library of `candidates` that opens and resolves the symbols.
    ///
    /// # Errors
    /// [`Error::LibraryLoad`] when none opens (with each candidate's reason);
    /// [`Error::MissingSymbol`] when a required call is missing (too old a driver, or not
    /// libcuda at all).
    pub fn load(candidates: &[String]) -> Result<Driver> {
        let (library, path) = loader::open_first(candidates)?;
        Ok(Driver {
            api: Required::resolve(&library).map_err(loader::missing(&path))?,
            vmm: Vmm::resolve(&library).ok(),
            pools: Pools::resolve(&library).ok(),
            peer: Peer::resolve(&library).ok(),
            pinned_host: PinnedHost::resolve(&library).ok(),
            host_register: HostRegister::resolve(&library).ok(),
            capture: Capture::resolve(&library).ok(),
            identity: Identity::resolve(&library).ok(),
            shareable: Shareable::resolve(&library).ok(),
            ipc: Ipc::resolve(&library).ok(),
            library,
            path,
        })
    }

    /// Loads the library [`library_candidates`] names for `config`.
    ///
    /// # Errors
    /// As [`Driver::load`].
    pub fn load_configured(config: &Config) -> Result<Driver> {
        Driver::load(&library_candidates(config))
    }

    /// Loads the library [`library_candidates`] names, reading `PORTALLOC_CUDA_LIBRARY` (and
    /// no other variable) from the process environment, through [`Config::from_env_vars`]:
    /// for callers without a [`Config`]; with one, use [`Driver::load_configured`].
    ///
    /// # Errors
    /// [`Error::Config`] for a `PORTALLOC_CUDA_LIBRARY` that is not a path (not UTF-8, a
    /// control character); as [`Driver::load`].
    pub fn load_default() -> Result<Driver> {
        Driver::load_configured(&Config::from_env_vars(&[LIBRARY_VARIABLE])?)
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

    /// True when every memory-pool symbol (CUDA 11.2) was resolved.
    pub fn has_pool_symbols(&self) -> bool {
        self.pools.is_some()
    }

    /// True when the pinned host memory symbols (`cuMemHostAlloc`, `cuMemFreeHost`) were
    /// resolved.
    pub fn has_pinned_host_symbols(&self) -> bool {
        self.pinned_host.is_some()
    }

    /// Every symbol portalloc uses, with whether this library exports it — each looked up in
    /// the library now, not assumed from a successful load: [`REQUIRED_SYMBOLS`] (for
    /// `cuDevicePrimaryCtxRelease_v2`, its CUDA 7 name counts too), then [`VMM_SYMBOLS`],
    /// [`POOL_SYMBOLS`] and [`PINNED_HOST_SYMBOLS`] (a group is used whole or not at all).
    pub fn symbols(&self) -> Vec<(&'static str, bool)> {
        let mut out = Required::exported(&self.library);
        out.extend(Vmm::exported(&self.library));
        out.extend(Pools::exported(&self.library));
        out.extend(PinnedHost::exported(&self.library));
        out.extend(HostRegister::exported(&self.library));
        out.extend(Capture::exported(&self.library));
        out.extend(Identity::exported(&self.library));
        out
    }

    /// `cuDeviceGetUuid`: the device's UUID as `nvidia-smi` writes it (`GPU-xxxxxxxx-…`), or
    /// `None` when the driver lacks the call or refuses it.
    pub fn device_uuid(&self, device: sys::CUdevice) -> Option<String> {
        let api = self.identity?;
        let mut raw = [0u8; 16];
        // SAFETY: the driver writes 16 bytes (a CUuuid) into `raw`; the device by value.
        let code = unsafe { (api.uuid)(raw.as_mut_ptr().cast(), device) };
        self.check("cuDeviceGetUuid", code).ok()?;
        Some(crate::budget::uuid_text("GPU-", &raw))
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
        // SAFETY: writes one int through a valid pointer; devices by value.
        let can: c_int = self.out("cuDeviceCanAccessPeer", |c| unsafe {
            (api.can_access)(c, device, peer)
        })?;
        Ok(can != 0)
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
                (self.api.get_error_name)(code, &mut name),
                (self.api.get_error_string)(code, &mut text),
            )
        };
        (
            loader::c_str((rn == sys::CUDA_SUCCESS).then_some(name))
                .unwrap_or_else(|| format!("CUDA_ERROR_{code}")),
            loader::c_str((rt == sys::CUDA_SUCCESS).then_some(text))
                .unwrap_or_else(|| "unknown error".into()),
        )
    }

    pub(crate) fn shareable(&self, call: &'static str) -> Result<&Shareable> {
        self.shareable
            .as_ref()
            .ok_or_else(|| self.lacks(call, "10.2 shareable handles"))
    }

    pub(crate) fn ipc(&self, call: &'static str) -> Result<&Ipc> {
        self.ipc
            .as_ref()
            .ok_or_else(|| self.lacks(call, "4.1 IPC handles"))
    }

    pub(crate) fn vmm(&self, call: &'static str) -> Result<&Vmm> {
        self.vmm
            .as_ref()
            .ok_or_else(|| self.lacks(call, "10.2 virtual memory management"))
    }

    pub(crate) fn pools(&self, call: &'static str) -> Result<&Pools> {
        self.pools
            .as_ref()
            .ok_or_else(|| self.lacks(call, "11.2 memory pools"))
    }

    pub(crate) fn lacks(&self, call: &'static str, feature: &str) -> Error {
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
        self.check("cuInit", unsafe { (self.api.init)(0) })
    }

    /// `cuDriverGetVersion` as the driver writes it: 12020 for CUDA 12.2.
    pub fn version_code(&self) -> Result<i32> {
        // SAFETY: writes one int through a valid pointer.
        self.out("cuDriverGetVersion", |v| unsafe {
            (self.api.driver_get_version)(v)
        })
    }

    /// `cuDriverGetVersion`, as (major, minor): 12020 → (12, 2).
    pub fn driver_version(&self) -> Result<(i32, i32)> {
        let v = self.version_code()?;
        Ok((v / 1000, (v % 1000) / 10))
    }

    /// `cuDeviceGetCount` (after [`Driver::init`]).
    pub fn device_count(&self) -> Result<u32> {
        // SAFETY: writes one int through a valid pointer.
        let n: c_int = self.out("cuDeviceGetCount", |n| unsafe {
            (self.api.device_get_count)(n)
        })?;
        Ok(n.max(0) as u32)
    }

    /// The device handle for an ordinal.
    pub fn device(&self, ordinal: u32) -> Result<sys::CUdevice> {
        let ordinal = c_int::try_from(ordinal).map_err(|_| Error::InvalidArgument {
            call: "cuDeviceGet",
            reason: format!("device ordinal {ordinal} is out of range"),
        })?;
        // SAFETY: writes one int through a valid pointer.
        self.out("cuDeviceGet", |d| unsafe {
            (self.api.device_get)(d, ordinal)
        })
    }

    /// `cuDeviceGetName`.
    pub fn device_name(&self, device: sys::CUdevice) -> Result<String> {
        let mut buf = [0u8; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into `buf`.
        self.check("cuDeviceGetName", unsafe {
            (self.api.device_get_name)(buf.as_mut_ptr().cast(), buf.len() as c_int, device)
        })?;
        Ok(loader::c_buf_to_string(&buf))
    }

    /// `cuDeviceGetAttribute`.
    pub fn device_attribute(&self, device: sys::CUdevice, attribute: c_int) -> Result<i32> {
        // SAFETY: writes one int through a valid pointer.
        self.out("cuDeviceGetAttribute", |v| unsafe {
            (self.api.device_get_attribute)(v, attribute, device)
        })
    }

    /// `cuDeviceTotalMem_v2`.
    pub fn total_mem(&self, device: sys::CUdevice) -> Result<u64> {
        // SAFETY: writes one size_t through a valid pointer.
        let bytes: usize = self.out("cuDeviceTotalMem_v2", |b| unsafe {
            (self.api.device_total_mem)(b, device)
        })?;
        Ok(bytes as u64)
    }

    /// `cuDevicePrimaryCtxRetain`: the device's primary context, retained once more.
    pub fn primary_ctx_retain(&self, device: sys::CUdevice) -> Result<sys::CUcontext> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle through a valid pointer.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.api.primary_ctx_retain)(&mut ctx, device)
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
            (self.api.primary_ctx_release)(device)
        })
    }

    /// `cuCtxGetCurrent`: the calling thread's current context (null for none).
    pub fn current_context(&self) -> Result<sys::CUcontext> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one context handle through a valid pointer.
        self.check("cuCtxGetCurrent", unsafe {
            (self.api.ctx_get_current)(&mut ctx)
        })?;
        Ok(ctx)
    }

    /// `cuCtxSetCurrent`, skipped when `ctx` is current already. Returns the context it
    /// replaced (null when none was current), or `None` when `ctx` was current.
    ///
    /// # Safety
    /// `ctx` must be a live context the caller holds retained (the driver dereferences it).
    pub(crate) unsafe fn make_current(
        &self,
        ctx: sys::CUcontext,
    ) -> Result<Option<sys::CUcontext>> {
        let before = self.current_context()?;
        if before == ctx {
            return Ok(None);
        }
        // SAFETY: the caller guarantees a live, retained context.
        self.check("cuCtxSetCurrent", unsafe {
            (self.api.ctx_set_current)(ctx)
        })?;
        Ok(Some(before))
    }

    /// `cuCtxSetCurrent(ctx)`: makes current again a context [`Driver::make_current`]
    /// replaced (null: none).
    ///
    /// # Safety
    /// `ctx` is null or a context that was current on this thread and is still live: the
    /// caller's, which it owns.
    pub(crate) unsafe fn restore_current(&self, ctx: sys::CUcontext) -> Result<()> {
        // SAFETY: the caller guarantees null or a live context.
        self.check("cuCtxSetCurrent", unsafe {
            (self.api.ctx_set_current)(ctx)
        })
    }

    /// `cuMemGetInfo_v2` of the current context's device: (free, total).
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t through valid pointers.
        self.check("cuMemGetInfo_v2", unsafe {
            (self.api.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// `cuMemGetAllocationGranularity` for pinned device memory on `device`.
    pub(crate) fn allocation_granularity(
        &self,
        device: sys::CUdevice,
        option: sys::CUmemAllocationGranularity_flags,
    ) -> Result<u64> {
        let api = self.vmm("cuMemGetAllocationGranularity")?;
        let prop = allocation_prop(device);
        // SAFETY: `prop` is a fully initialised CUmemAllocationProp; writes one size_t.
        let g: usize = self.out("cuMemGetAllocationGranularity", |g| unsafe {
            (api.granularity)(g, &prop, option)
        })?;
        Ok(g as u64)
    }

    /// `cuDeviceGetDefaultMemPool`: the device's default pool (portalloc uses a pool of its
    /// own; this is for interop and reports).
    pub fn default_mem_pool(&self, device: sys::CUdevice) -> Result<sys::CUmemoryPool> {
        let api = self.pools("cuDeviceGetDefaultMemPool")?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: writes one pool handle through a valid pointer.
        self.check("cuDeviceGetDefaultMemPool", unsafe {
            (api.default_pool)(&mut pool, device)
        })?;
        Ok(pool)
    }
}

impl Checked for Driver {
    type Code = sys::CUresult;
    const SUCCESS: sys::CUresult = sys::CUDA_SUCCESS;
    const BACKEND: &'static str = "cuda";

    fn names(&self, code: sys::CUresult) -> (String, String) {
        self.error_name(code)
    }
}

/// The allocation properties portalloc uses: pinned device memory on `device`, no IPC handle.
pub(crate) fn allocation_prop(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    exportable_prop(device, sys::CU_MEM_HANDLE_TYPE_NONE)
}

/// [`allocation_prop`] asking for handles exportable as `handle_types`.
pub(crate) fn exportable_prop(
    device: sys::CUdevice,
    handle_types: sys::CUmemAllocationHandleType,
) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: handle_types,
        location: device_location(device),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationPropAllocFlags::default(),
    }
}

/// Where device memory of `device` lives.
pub(crate) fn device_location(device: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    }
}

/// A size as the driver's `size_t`.
pub(crate) fn to_usize(call: &'static str, value: u64) -> Result<usize> {
    usize::try_from(value).map_err(|_| Error::InvalidArgument {
        call,
        reason: format!("{value} does not fit this platform's size_t"),
    })
}

/// Probes the CUDA backend, with the library `config` names: load, `cuInit`, versions,
/// devices. Never fails: what went wrong
/// is in [`Probe::error`] / [`Probe::load_failures`].
pub fn probe(config: &Config) -> Probe {
    probe_with(&library_candidates(config))
}

/// [`probe`] over explicit library candidates.
pub fn probe_with(candidates: &[String]) -> Probe {
    probe_from(Ok(candidates.to_vec()))
}

fn probe_from(candidates: Result<Vec<String>>) -> Probe {
    let not_found = |c: &[String]| format!("driver library not found ({})", c.join(", "));
    let survey = |driver: &Driver, probe: &mut Probe| {
        probe.library = Some(driver.path().to_string());
        let version = driver.driver_version().ok();
        probe.driver_version = version.map(|(major, minor)| format!("{major}.{minor}"));
        driver.init().and_then(|()| driver.device_count())
    };
    Probe::run(
        Vendor::Cuda,
        candidates,
        not_found,
        Driver::load,
        survey,
        describe,
    )
}

fn describe(driver: &Driver, ordinal: u32) -> Result<String> {
    let facts = Facts::read(driver, ordinal)?;
    Ok(format!(
        "{ordinal}: {} (sm_{}{}, {})",
        facts.name,
        facts.major,
        facts.minor,
        crate::units::Bytes(facts.total)
    ))
}

/// What a device is, as the driver reports it: for [`probe`] and [`CudaDevice::open`].
pub(crate) struct Facts {
    pub(crate) name: String,
    pub(crate) major: i32,
    pub(crate) minor: i32,
    pub(crate) total: u64,
}

impl Facts {
    pub(crate) fn read(driver: &Driver, ordinal: u32) -> Result<Facts> {
        let device = driver.device(ordinal)?;
        let attribute = |a| driver.device_attribute(device, a);
        Ok(Facts {
            name: driver.device_name(device)?,
            major: attribute(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            minor: attribute(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            total: driver.total_mem(device)?,
        })
    }
}
