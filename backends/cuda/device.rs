//! [`CudaDevice`]: the GPU layer's [`GpuDevice`] over NVIDIA's driver API, one per device
//! ordinal, on the device's primary context. This file holds what is CUDA's own: the checked
//! calls of [`VendorApi`] for CUDA, the capability gates and opening.

use std::ffi::c_int;
use std::fmt;
use std::sync::Arc;

use portalloc_sys::cuda as sys;

use super::{device_location, exportable_prop, to_usize, Driver, Facts};
use crate::backends::gpu::{handle, GpuDevice, Opened, PoolAttribute, VendorApi, VendorCensus};
use crate::backends::loader::Checked;
use crate::device::{Capabilities, DeviceInfo, Vendor};
use crate::error::{Error, Result};
use crate::units::Bytes;

/// The granularity reported when the driver has no virtual-memory API to ask: 2 MiB, what
/// every NVIDIA GPU since Pascal answers.
const ASSUMED_GRANULARITY: u64 = 2 << 20;
/// The first driver with the virtual-memory API: CUDA 10.2.
const VMM_MIN_VERSION: i32 = 10_020;
/// The first driver with stream-ordered memory pools: CUDA 11.2.
const POOLS_MIN_VERSION: i32 = 11_020;

/// What a device holds now, from its own books: [`VendorCensus`].
pub type CudaCensus = VendorCensus;

/// One NVIDIA GPU behind the [`crate::Device`] trait: the GPU layer's [`GpuDevice`] (books,
/// checks, locks, drop) over CUDA's calls.
///
/// * **Context**: the device's primary context, retained at [`CudaDevice::open`] and released
///   when the device is dropped; every call makes it current on the calling thread for the
///   call's length (one `cuCtxGetCurrent`; when another context — or none — was current, a
///   `cuCtxSetCurrent` to it and one back to the caller's afterwards), so the device may be
///   used from any thread, never changes the caller's current context, and shares its
///   context with other libraries that use the primary context (the runtime API, cudarc,
///   PyTorch).
/// * **Memory**: [`crate::Device::alloc`] / [`crate::Device::free`] are `cuMemAlloc_v2` /
///   `cuMemFree_v2`.
/// * **Copies and pinned host memory**: [`crate::Device::copy_to_host`] /
///   [`crate::Device::copy_from_host`] are `cuMemcpyDtoHAsync_v2` / `cuMemcpyHtoDAsync_v2` on
///   the caller's stream, after the books checked the device range;
///   [`crate::Device::alloc_pinned_host`] is `cuMemHostAlloc` (flags 0: pinned for the primary
///   context), `Ok(None)` on a driver without it.
/// * **Virtual memory** ([`crate::device::VirtualMemory`]) when the driver is CUDA ≥ 10.2,
///   exports the calls, and the device sets
///   `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
/// * **Stream-ordered pool** ([`crate::device::StreamOrderedPool`]) when the driver is CUDA ≥
///   11.2, exports the calls, and the device sets `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`:
///   a pool of its own made with `cuMemPoolCreate` (so that its release threshold and trimming
///   do not disturb other users of the device's default pool).
/// * **Streams and events**: [`crate::Device::create_stream`] makes blocking streams
///   (`cuStreamCreate`, so the legacy default stream orders with them), events are
///   `cuEventCreate` (timing disabled), [`crate::Device::synchronize_device`] is
///   `cuCtxSynchronize`.
pub type CudaDevice = GpuDevice<Cuda>;

/// The context a caller had current on its thread when a call of a [`CudaDevice`] began
/// (null: none), made current again when the call ends.
#[derive(Debug, Clone, Copy)]
pub struct CallerContext(sys::CUcontext);

// SAFETY: only ever made current again on the thread it was read on, within one call.
unsafe impl Send for CallerContext {}

/// CUDA's side of a [`CudaDevice`]: the driver, the device and its primary context (retained
/// while this lives).
pub struct Cuda {
    driver: Arc<Driver>,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: the primary context is a driver object that the CUDA driver API allows any thread
// to use once it is current there, which every call makes sure of (`enter`).
unsafe impl Send for Cuda {}
// SAFETY: as above: the driver API is thread-safe.
unsafe impl Sync for Cuda {}

impl fmt::Debug for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cuda")
            .field("device", &self.device)
            .field("library", &self.driver.path())
            .finish_non_exhaustive()
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: retained once when this value was made, released once here, as it goes
        // (after the device gave back everything it held, see `GpuDevice`'s drop).
        if let Err(e) = unsafe { self.driver.primary_ctx_release(self.device) } {
            tracing::warn!(error = %e, "dropping a cuda device: could not release its primary context");
        }
    }
}

impl Cuda {
    fn check(&self, call: &'static str, code: sys::CUresult) -> Result<()> {
        self.driver.check(call, code)
    }

    /// One read-write access descriptor for `device`.
    fn access(device: sys::CUdevice) -> sys::CUmemAccessDesc {
        sys::CUmemAccessDesc {
            location: device_location(device),
            flags: sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        }
    }
}

impl VendorApi for Cuda {
    const BACKEND: &'static str = "cuda";
    const VENDOR: Vendor = Vendor::Cuda;
    const OUT_OF_MEMORY: i64 = sys::CUDA_ERROR_OUT_OF_MEMORY as i64;
    const PEER_CALLS: [&'static str; 2] = super::PEER_SYMBOLS;
    /// The peer's device, whose primary context is retained while access is enabled.
    type Peer = sys::CUdevice;
    /// The caller's current context (null: none).
    type Saved = CallerContext;

    /// The primary context made current: one `cuCtxGetCurrent`, plus `cuCtxSetCurrent` when
    /// another context (or none) was current on the calling thread.
    fn enter(&self) -> Result<Option<CallerContext>> {
        // SAFETY: the primary context is retained for as long as `self` lives.
        Ok(unsafe { self.driver.make_current(self.ctx) }?.map(CallerContext))
    }

    /// `cuCtxSetCurrent` back to the caller's context.
    fn leave(&self, saved: CallerContext) {
        // SAFETY: the context that was current on this thread before `enter`: the caller's,
        // live as long as the caller keeps it current (or null).
        if let Err(e) = unsafe { self.driver.restore_current(saved.0) } {
            tracing::warn!(error = %e, "could not make the caller's context current again");
        }
    }

    /// `cuMemGetInfo_v2` of the current context's device.
    fn mem_info(&self) -> Result<(u64, u64)> {
        self.driver.mem_info()
    }

    /// `cuDeviceGetCount`.
    fn device_count(&self) -> Result<u32> {
        self.driver.device_count()
    }

    fn alloc(&self, size: u64) -> Result<u64> {
        let bytes = to_usize("cuMemAlloc_v2", size)?;
        // SAFETY: writes one device pointer through a valid pointer.
        self.driver.out("cuMemAlloc_v2", |p| unsafe {
            (self.driver.api.mem_alloc)(p, bytes)
        })
    }

    unsafe fn free(&self, ptr: u64) -> Result<()> {
        // SAFETY: the caller guarantees a live allocation.
        self.check("cuMemFree_v2", unsafe { (self.driver.api.mem_free)(ptr) })
    }

    fn stream_create(&self) -> Result<u64> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: writes one stream handle through a valid pointer.
        let code = unsafe { (self.driver.api.stream_create)(&mut s, sys::CU_STREAM_DEFAULT) };
        self.check("cuStreamCreate", code)
            .map(|()| s as usize as u64)
    }

    fn outlive_streams(&self) {
        if let Err(e) = self.driver.primary_ctx_retain(self.device) {
            tracing::warn!(error = %e,
                "could not keep the primary context for the streams left live");
        }
    }

    unsafe fn stream_destroy(&self, s: u64) -> Result<()> {
        // SAFETY: the caller guarantees a live stream of this device.
        self.check("cuStreamDestroy_v2", unsafe {
            (self.driver.api.stream_destroy)(handle(s))
        })
    }

    unsafe fn stream_synchronize(&self, s: u64) -> Result<()> {
        // SAFETY: the caller guarantees a live stream, null or a special handle.
        let code = unsafe { (self.driver.api.stream_synchronize)(handle(s)) };
        self.check("cuStreamSynchronize", code)
    }

    fn device_synchronize(&self) -> Result<()> {
        // SAFETY: no arguments; the context was made current.
        self.check("cuCtxSynchronize", unsafe {
            (self.driver.api.ctx_synchronize)()
        })
    }

    fn event_create(&self) -> Result<u64> {
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: writes one event handle through a valid pointer.
        let code = unsafe { (self.driver.api.event_create)(&mut e, sys::CU_EVENT_DISABLE_TIMING) };
        self.check("cuEventCreate", code)
            .map(|()| e as usize as u64)
    }

    unsafe fn event_record(&self, e: u64, s: u64) -> Result<()> {
        // SAFETY: the caller guarantees both handles.
        let code = unsafe { (self.driver.api.event_record)(handle(e), handle(s)) };
        self.check("cuEventRecord", code)
    }

    unsafe fn event_query(&self, e: u64) -> Result<bool> {
        // SAFETY: the caller guarantees a live event.
        match unsafe { (self.driver.api.event_query)(handle(e)) } {
            sys::CUDA_ERROR_NOT_READY => Ok(false),
            code => self.check("cuEventQuery", code).map(|()| true),
        }
    }

    unsafe fn event_synchronize(&self, e: u64) -> Result<()> {
        // SAFETY: the caller guarantees a live event.
        let code = unsafe { (self.driver.api.event_synchronize)(handle(e)) };
        self.check("cuEventSynchronize", code)
    }

    unsafe fn stream_wait_event(&self, s: u64, e: u64) -> Result<()> {
        // SAFETY: the caller guarantees both handles; flags 0 (the default wait).
        let code = unsafe { (self.driver.api.stream_wait_event)(handle(s), handle(e), 0) };
        self.check("cuStreamWaitEvent", code)
    }

    unsafe fn event_destroy(&self, e: u64) -> Result<()> {
        // SAFETY: the caller guarantees a live event, not used afterwards.
        self.check("cuEventDestroy_v2", unsafe {
            (self.driver.api.event_destroy)(handle(e))
        })
    }

    fn create_physical(&self, size: u64, exportable: bool) -> Result<u64> {
        let api = self.driver.vmm("cuMemCreate")?;
        let types = if exportable {
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            sys::CU_MEM_HANDLE_TYPE_NONE
        };
        let (bytes, prop) = (
            to_usize("cuMemCreate", size)?,
            exportable_prop(self.device, types),
        );
        // SAFETY: `prop` is fully initialised; writes one handle through a valid pointer.
        self.driver.out("cuMemCreate", |h| unsafe {
            (api.create)(h, bytes, &prop, 0)
        })
    }

    unsafe fn export_physical(&self, handle: u64) -> Result<std::os::fd::OwnedFd> {
        let api = self.driver.shareable("cuMemExportToShareableHandle")?;
        let mut fd: c_int = -1;
        // SAFETY: the caller guarantees a live handle; for a POSIX descriptor the driver
        // writes one `int` through the pointer.
        self.check("cuMemExportToShareableHandle", unsafe {
            (api.export)(
                (&mut fd as *mut c_int).cast(),
                handle,
                sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        })?;
        crate::backends::gpu::owned_descriptor("cuMemExportToShareableHandle", fd)
    }

    fn import_physical(&self, fd: std::os::fd::BorrowedFd<'_>) -> Result<u64> {
        use std::os::fd::AsRawFd;
        let api = self.driver.shareable("cuMemImportFromShareableHandle")?;
        // The descriptor's value cast to a pointer, as the driver documents it for POSIX
        // descriptors (not its address).
        let os_handle = fd.as_raw_fd() as usize as *mut std::ffi::c_void;
        // SAFETY: the driver reads the descriptor (open for the call: borrowed) and writes one
        // handle through a valid pointer.
        self.driver
            .out("cuMemImportFromShareableHandle", |h| unsafe {
                (api.import)(h, os_handle, sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
            })
    }

    unsafe fn ipc_get(&self, ptr: u64) -> Result<[u8; 64]> {
        let api = self.driver.ipc("cuIpcGetMemHandle")?;
        // Zeroed first: every byte a caller sends is defined, whatever the driver writes.
        let mut handle = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: the caller guarantees a live plain allocation; the driver writes 64 bytes.
        self.check("cuIpcGetMemHandle", unsafe { (api.get)(&mut handle, ptr) })?;
        Ok(handle.reserved)
    }

    fn ipc_open(&self, handle: &[u8; 64]) -> Result<u64> {
        let api = self.driver.ipc("cuIpcOpenMemHandle_v2")?;
        let handle = sys::CUipcMemHandle { reserved: *handle };
        // SAFETY: the handle is 64 bytes by value; the driver writes one pointer.
        self.driver.out("cuIpcOpenMemHandle_v2", |p| unsafe {
            (api.open)(p, handle, sys::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        })
    }

    unsafe fn ipc_close(&self, ptr: u64) -> Result<()> {
        let api = self.driver.ipc("cuIpcCloseMemHandle")?;
        // SAFETY: the caller guarantees memory opened here and unused.
        self.check("cuIpcCloseMemHandle", unsafe { (api.close)(ptr) })
    }

    unsafe fn release_physical(&self, handle: u64) -> Result<()> {
        let api = self.driver.vmm("cuMemRelease")?;
        // SAFETY: the caller guarantees a live handle.
        self.check("cuMemRelease", unsafe { (api.release)(handle) })
    }

    /// `cuMemAddressReserve` with `addr` as its hint (0: none): the driver may answer
    /// another address.
    fn reserve(&self, size: u64, alignment: u64, addr: u64) -> Result<u64> {
        let api = self.driver.vmm("cuMemAddressReserve")?;
        let bytes = to_usize("cuMemAddressReserve", size)?;
        let align = to_usize("cuMemAddressReserve", alignment)?;
        // SAFETY: writes one device pointer through a valid pointer; the hint is a number
        // the driver only compares with its free ranges (it dereferences nothing there).
        self.driver.out("cuMemAddressReserve", |va| unsafe {
            (api.reserve)(va, bytes, align, addr, 0)
        })
    }

    unsafe fn free_reservation(&self, va: u64, size: u64) -> Result<()> {
        let api = self.driver.vmm("cuMemAddressFree")?;
        let bytes = to_usize("cuMemAddressFree", size)?;
        // SAFETY: the caller guarantees a whole, unmapped reservation.
        self.check("cuMemAddressFree", unsafe { (api.address_free)(va, bytes) })
    }

    unsafe fn map(&self, va: u64, size: u64, offset: u64, handle: u64) -> Result<()> {
        let api = self.driver.vmm("cuMemMap")?;
        let (bytes, offset) = (to_usize("cuMemMap", size)?, to_usize("cuMemMap", offset)?);
        // SAFETY: the caller guarantees a live handle and a free range of a reservation.
        self.check("cuMemMap", unsafe {
            (api.map)(va, bytes, offset, handle, 0)
        })
    }

    unsafe fn unmap(&self, va: u64, size: u64) -> Result<()> {
        let api = self.driver.vmm("cuMemUnmap")?;
        let bytes = to_usize("cuMemUnmap", size)?;
        // SAFETY: the caller guarantees whole live mappings, unused now.
        self.check("cuMemUnmap", unsafe { (api.unmap)(va, bytes) })
    }

    unsafe fn set_access(&self, va: u64, size: u64, peers: &[sys::CUdevice]) -> Result<()> {
        let api = self.driver.vmm("cuMemSetAccess")?;
        let bytes = to_usize("cuMemSetAccess", size)?;
        let descs: Vec<_> = std::iter::once(self.device)
            .chain(peers.iter().copied())
            .map(Cuda::access)
            .collect();
        // SAFETY: `descs.len()` initialised descriptors; the caller guarantees the range is
        // mapped.
        self.check("cuMemSetAccess", unsafe {
            (api.set_access)(va, bytes, descs.as_ptr(), descs.len())
        })
    }

    /// `cuMemPoolCreate` of a pinned-memory pool on this device, no IPC handle types.
    fn pool_open(&self) -> Result<u64> {
        let api = self.driver.pools("cuMemPoolCreate")?;
        let props = sys::CUmemPoolProps {
            allocType: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: sys::CU_MEM_HANDLE_TYPE_NONE,
            location: device_location(self.device),
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: 0,
            reserved: [0; 56],
        };
        let mut p: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `props` is fully initialised (zero tail); writes one pool handle.
        let code = unsafe { (api.create)(&mut p, &props) };
        self.check("cuMemPoolCreate", code)
            .map(|()| p as usize as u64)
    }

    unsafe fn pool_close(&self, p: u64) -> Result<()> {
        let api = self.driver.pools("cuMemPoolDestroy")?;
        // SAFETY: the caller guarantees a live pool of this device, not used afterwards.
        self.check("cuMemPoolDestroy", unsafe { (api.destroy)(handle(p)) })
    }

    unsafe fn pool_alloc(&self, p: u64, size: u64, s: u64) -> Result<u64> {
        let api = self.driver.pools("cuMemAllocFromPoolAsync")?;
        let bytes = to_usize("cuMemAllocFromPoolAsync", size)?;
        // SAFETY: the caller guarantees pool and stream; writes one device pointer.
        self.driver.out("cuMemAllocFromPoolAsync", |ptr| unsafe {
            (api.alloc_async)(ptr, bytes, handle(p), handle(s))
        })
    }

    unsafe fn pool_free(&self, ptr: u64, s: u64) -> Result<()> {
        let api = self.driver.pools("cuMemFreeAsync")?;
        // SAFETY: the caller guarantees a live pool allocation and stream.
        self.check("cuMemFreeAsync", unsafe {
            (api.free_async)(ptr, handle(s))
        })
    }

    unsafe fn pool_attribute(&self, p: u64, attribute: PoolAttribute) -> Result<u64> {
        let api = self.driver.pools("cuMemPoolGetAttribute")?;
        // SAFETY: the caller guarantees a live pool; all five are cuuint64_t attributes.
        self.driver
            .out("cuMemPoolGetAttribute", |v: &mut sys::cuuint64_t| unsafe {
                (api.get_attribute)(handle(p), attribute as _, (v as *mut u64).cast())
            })
    }

    unsafe fn pool_set_release_threshold(&self, p: u64, bytes: u64) -> Result<()> {
        let api = self.driver.pools("cuMemPoolSetAttribute")?;
        let mut v: sys::cuuint64_t = bytes;
        let attr = sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        // SAFETY: the caller guarantees a live pool; the threshold is a cuuint64_t.
        self.check("cuMemPoolSetAttribute", unsafe {
            (api.set_attribute)(handle(p), attr, (&mut v as *mut u64).cast())
        })
    }

    unsafe fn pool_trim(&self, p: u64, keep: u64) -> Result<()> {
        let api = self.driver.pools("cuMemPoolTrimTo")?;
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        // SAFETY: the caller guarantees a live pool.
        self.check("cuMemPoolTrimTo", unsafe { (api.trim_to)(handle(p), keep) })
    }

    unsafe fn stream_capture_info(&self, s: u64) -> Result<Option<(u32, u64)>> {
        let Some(api) = self.driver.capture else {
            return Ok(None);
        };
        let (mut status, mut id): (sys::CUstreamCaptureStatus, sys::cuuint64_t) = (0, 0);
        // SAFETY: the caller guarantees a live stream, null or a special handle; two values
        // written through valid pointers.
        let code = unsafe { (api.capture_info)(handle(s), &mut status, &mut id) };
        self.check("cuStreamGetCaptureInfo", code)
            .map(|()| Some((status, id)))
    }

    fn exchange_capture_mode(&self, mode: u32) -> Result<Option<u32>> {
        let Some(api) = self.driver.capture else {
            return Ok(None);
        };
        let mut m: sys::CUstreamCaptureMode = mode;
        // SAFETY: reads and writes one mode through a valid pointer; no handle.
        let code = unsafe { (api.exchange_mode)(&mut m) };
        self.check("cuThreadExchangeStreamCaptureMode", code)
            .map(|()| Some(m))
    }

    fn has_peer_calls(&self) -> bool {
        self.driver.has_peer_symbols()
    }

    fn can_access_peer(&self, peer: u32) -> Result<bool> {
        let peer = self.driver.device(peer)?;
        self.driver.can_access_peer(self.device, peer)
    }

    /// Retains the peer's primary context and enables access to it from this (current)
    /// context; already enabled is success.
    fn enable_peer(&self, peer: u32) -> Result<sys::CUdevice> {
        let api = self
            .driver
            .peer
            .ok_or_else(|| self.driver.lacks("cuCtxEnablePeerAccess", "peer access"))?;
        let peer = self.driver.device(peer)?;
        let peer_ctx = self.driver.primary_ctx_retain(peer)?;
        // SAFETY: the peer's primary context was retained just above; flags must be 0.
        let code = unsafe { (api.enable)(peer_ctx, 0) };
        if code == sys::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(peer);
        }
        match self.check("cuCtxEnablePeerAccess", code) {
            Ok(()) => Ok(peer),
            Err(e) => {
                // SAFETY: undoes the retain of the peer's primary context made above.
                if let Err(r) = unsafe { self.driver.primary_ctx_release(peer) } {
                    tracing::debug!(error = %r, "could not release a peer context");
                }
                Err(e)
            }
        }
    }

    unsafe fn release_peer(&self, peer: sys::CUdevice) -> Result<()> {
        // SAFETY: the caller guarantees one release per retain made by `enable_peer`.
        unsafe { self.driver.primary_ctx_release(peer) }
    }
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, size: usize, s: u64) -> Result<()> {
        // SAFETY: the caller guarantees the host and device ranges and the stream.
        let code = unsafe { (self.driver.api.memcpy_dtoh_async)(dst.cast(), src, size, handle(s)) };
        self.check("cuMemcpyDtoHAsync_v2", code)
    }

    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, size: usize, s: u64) -> Result<()> {
        // SAFETY: the caller guarantees the host and device ranges and the stream.
        let code = unsafe { (self.driver.api.memcpy_htod_async)(dst, src.cast(), size, handle(s)) };
        self.check("cuMemcpyHtoDAsync_v2", code)
    }

    /// `cuMemHostAlloc(flags 0)`: pinned for the current (primary) context.
    fn host_alloc(&self, size: usize) -> Result<Option<u64>> {
        let Some(api) = self.driver.pinned_host else {
            return Ok(None);
        };
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer through a valid pointer; flags 0.
        let code = unsafe { (api.alloc)(&mut p, size, 0) };
        self.check("cuMemHostAlloc", code)?;
        Ok(Some(p as usize as u64))
    }

    unsafe fn host_free(&self, ptr: u64) -> Result<()> {
        let api = self
            .driver
            .pinned_host
            .ok_or_else(|| self.driver.lacks("cuMemFreeHost", "2.2 pinned host memory"))?;
        // SAFETY: the caller guarantees live memory from `host_alloc`, unused now.
        self.check("cuMemFreeHost", unsafe { (api.free)(handle(ptr)) })
    }

    /// `cuMemHostRegister_v2(flags 0)`: page-locked for the current (primary) context.
    unsafe fn host_register(&self, ptr: u64, size: usize) -> Result<bool> {
        let Some(api) = self.driver.host_register else {
            return Ok(false);
        };
        // SAFETY: the caller guarantees `size` bytes of its own live host memory at `ptr`;
        // flags 0.
        let code = unsafe { (api.register)(handle(ptr), size, 0) };
        self.check("cuMemHostRegister_v2", code).map(|()| true)
    }

    fn registers_host(&self) -> bool {
        self.driver.host_register.is_some()
    }

    unsafe fn host_unregister(&self, ptr: u64) -> Result<()> {
        let api = self.driver.host_register.ok_or_else(|| {
            self.driver
                .lacks("cuMemHostUnregister", "4.0 host memory registration")
        })?;
        // SAFETY: the caller guarantees memory registered by `host_register`, unused now.
        self.check("cuMemHostUnregister", unsafe {
            (api.unregister)(handle(ptr))
        })
    }
}

/// Opens every device of the driver [`super::library_candidates`] names for `config`.
///
/// # Errors
/// As [`Driver::load`] and [`CudaDevice::open_all`].
pub fn open_all(config: &crate::config::Config) -> Result<Vec<CudaDevice>> {
    open_some(config, None)
}

/// Opens the devices `only` names (`None`: every one) of the driver
/// [`super::library_candidates`] names for `config`: a caller that wants one device retains
/// no other device's context and makes no other device's pool.
///
/// # Errors
/// As [`Driver::load`] and [`CudaDevice::open`].
pub fn open_some(config: &crate::config::Config, only: Option<u32>) -> Result<Vec<CudaDevice>> {
    let driver = Arc::new(Driver::load_configured(config)?);
    match only {
        Some(ordinal) => Ok(vec![CudaDevice::open(driver, ordinal)?]),
        None => CudaDevice::open_all(driver),
    }
}

impl GpuDevice<Cuda> {
    /// Opens device `ordinal`: `cuInit`, the device's facts and capabilities, its primary
    /// context retained, and its pool created when it has pools.
    ///
    /// # Errors
    /// [`Error::Driver`] from `cuInit` (`CUDA_ERROR_NO_DEVICE` on a machine without a GPU) or
    /// any query; [`Error::InvalidArgument`] naming the ordinal and the library when the
    /// driver has no such device.
    pub fn open(driver: Arc<Driver>, ordinal: u32) -> Result<CudaDevice> {
        driver.init()?;
        let count = driver.device_count()?;
        if ordinal >= count {
            return Err(Error::InvalidArgument {
                call: "CudaDevice::open",
                reason: format!(
                    "device ordinal {ordinal} is out of range: the driver {} reports {count} \
                     device(s){}",
                    driver.path(),
                    match count {
                        0 => String::new(),
                        n => format!(", ordinals 0 to {}", n - 1),
                    }
                ),
            });
        }
        let device = driver.device(ordinal)?;
        let ctx = driver.primary_ctx_retain(device)?;
        // From here on, dropping `cuda` releases the context.
        let cuda = Cuda {
            driver: Arc::clone(&driver),
            device,
            ctx,
        };
        // The pool is made in the device's context; the caller's is current again after.
        let saved = cuda.enter()?;
        let opened = open_in_context(&driver, &cuda, device, ordinal);
        if let Some(saved) = saved {
            cuda.leave(saved);
        }
        let (info, pool) = opened?;
        Ok(GpuDevice::new(Opened {
            vendor: cuda,
            granularity: info.min_granularity,
            info,
            pool,
            // CUDA documents a mapping as visible once cuMemMap returns.
            map_visible_after: std::time::Duration::ZERO,
        }))
    }
}

/// What [`CudaDevice::open`] reads and makes with the device's primary context current: its
/// facts, its gates and its pool.
fn open_in_context(
    driver: &Arc<Driver>,
    cuda: &Cuda,
    device: sys::CUdevice,
    ordinal: u32,
) -> Result<(DeviceInfo, Option<u64>)> {
    let Facts {
        name,
        major,
        minor,
        total,
    } = Facts::read(driver, ordinal)?;
    let version = driver.version_code()?;
    let mut info = DeviceInfo {
        vendor: Vendor::Cuda,
        ordinal,
        name,
        arch: format!("sm_{major}{minor}"),
        total_bytes: total,
        min_granularity: ASSUMED_GRANULARITY,
        recommended_granularity: ASSUMED_GRANULARITY,
        capabilities: Capabilities::default(),
        notes: vec![
            ("library".into(), driver.path().to_string()),
            (
                "driver".into(),
                format!(
                    "CUDA {}.{} ({version})",
                    version / 1000,
                    version % 1000 / 10
                ),
            ),
            ("compute capability".into(), format!("{major}.{minor}")),
            ("context".into(), "primary".into()),
        ],
    };
    if let Some(uuid) = driver.device_uuid(device) {
        info.notes.push(("uuid".into(), uuid));
    }
    let gate = |min_version, symbols, attribute, what| {
        gate(
            driver,
            device,
            version,
            min_version,
            symbols,
            attribute,
            what,
        )
    };
    let vmm_gate = gate(
        VMM_MIN_VERSION,
        driver.has_vmm_symbols(),
        sys::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        "virtual memory management",
    );
    let vmm_note = match vmm_gate {
        Ok(()) => {
            let granularity = |option| driver.allocation_granularity(device, option);
            let granularities =
                granularity(sys::CU_MEM_ALLOC_GRANULARITY_MINIMUM).and_then(|min| {
                    granularity(sys::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED).map(|rec| (min, rec))
                });
            match granularities {
                Ok((min, rec)) if min.is_power_of_two() => {
                    info.capabilities.virtual_memory = true;
                    info.min_granularity = min;
                    info.recommended_granularity = rec.max(min);
                    format!(
                        "yes (granularity {}, recommended {})",
                        Bytes(min),
                        Bytes(rec.max(min))
                    )
                }
                Ok((min, _)) => format!("no: the driver reports a granularity of {min} bytes"),
                Err(e) => format!("no: {e}"),
            }
        }
        Err(why) => format!("no: {why}"),
    };
    let pool_gate = gate(
        POOLS_MIN_VERSION,
        driver.has_pool_symbols(),
        sys::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        "memory pools",
    );
    let mut pool = None;
    let pool_note = match pool_gate.and_then(|()| cuda.pool_open().map_err(|e| e.to_string())) {
        Ok(p) => {
            pool = Some(p);
            info.capabilities.stream_ordered_pool = true;
            "yes (a pool of its own, release threshold 0)".to_string()
        }
        Err(why) => format!("no: {why}"),
    };
    info.notes.push(("virtual memory".into(), vmm_note));
    info.notes.push(("stream-ordered pool".into(), pool_note));
    if !info.capabilities.virtual_memory {
        info.notes.push((
            "granularity".into(),
            format!("{} (assumed)", Bytes(ASSUMED_GRANULARITY)),
        ));
    }
    Ok((info, pool))
}

impl GpuDevice<Cuda> {
    /// Opens every device the driver reports, by ordinal.
    ///
    /// # Errors
    /// As [`CudaDevice::open`]; `cuInit`'s error when there is no device.
    pub fn open_all(driver: Arc<Driver>) -> Result<Vec<CudaDevice>> {
        driver.init()?;
        let count = driver.device_count()?;
        (0..count)
            .map(|ordinal| CudaDevice::open(Arc::clone(&driver), ordinal))
            .collect()
    }

    /// The loaded driver.
    pub fn driver(&self) -> &Arc<Driver> {
        &self.vendor().driver
    }

    /// The device's primary context (`CUcontext`), retained for as long as this device
    /// lives: the context cudarc, PyTorch and the runtime API use too.
    pub fn context(&self) -> sys::CUcontext {
        self.vendor().ctx
    }

    /// The driver's handle for the device (`CUdevice`).
    pub fn cu_device(&self) -> sys::CUdevice {
        self.vendor().device
    }

    /// The device's primary context, retained for as long as this value lives. For interop
    /// with other users of the driver API (they share it).
    pub fn cu_context(&self) -> sys::CUcontext {
        self.vendor().ctx
    }
}

/// Whether a capability is there: the driver version, the symbols, then the device attribute.
fn gate(
    driver: &Driver,
    device: sys::CUdevice,
    version: i32,
    min_version: i32,
    symbols: bool,
    attribute: c_int,
    what: &str,
) -> std::result::Result<(), String> {
    if version < min_version {
        return Err(format!(
            "the driver is CUDA {}.{}; {what} needs CUDA {}.{}",
            version / 1000,
            version % 1000 / 10,
            min_version / 1000,
            min_version % 1000 / 10
        ));
    }
    if !symbols {
        return Err(format!(
            "the driver library {} does not export the {what} calls",
            driver.path()
        ));
    }
    match driver.device_attribute(device, attribute) {
        Ok(0) => Err(format!(
            "the device does not support {what} (attribute {attribute} is 0)"
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("attribute {attribute} could not be read: {e}")),
    }
}
