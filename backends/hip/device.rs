//! [`HipDevice`]: the GPU layer's [`GpuDevice`] over AMD's HIP runtime, one per device
//! ordinal. This file holds what is HIP's own: the checked calls of [`VendorApi`] for HIP,
//! the options, the capability gates and opening (with the AMD tuning of [`super::tuning`]).

use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use portalloc_sys::hip as sys;

pub use super::tuning::MemoryKind;
use super::tuning::{self, attribute, Gate};
use super::{device_prop, location, HipVersion, Runtime, BACKEND};
use crate::backends::gpu::{handle, GpuDevice, Opened, PoolAttribute, VendorApi, VendorCensus};
use crate::backends::loader::Checked;
use crate::config::Config;
use crate::device::{Capabilities, Device, DeviceInfo, Vendor, VirtualMemory};
use crate::error::{Error, Result};

/// The variable that picks the memory kind of plain allocations: `coarse` (default), `fine`
/// or `uncached` (read by [`crate::config`], as [`Config::hip_memory`]).
pub const MEMORY_VARIABLE: &str = crate::config::PORTALLOC_HIP_MEMORY;

/// What a device holds now, from its own books: [`VendorCensus`].
pub type HipCensus = VendorCensus;

/// Options for [`HipDevice`]; [`HipDeviceBuilder::open`] opens it.
#[derive(Debug, Clone, Default)]
pub struct HipDeviceBuilder {
    ordinal: u32,
    memory: MemoryKind,
    require_virtual_memory: bool,
    require_pools: bool,
    default_pool: bool,
    hsa_xnack: Option<bool>,
}

impl HipDeviceBuilder {
    /// The defaults: ordinal 0, coarse-grained memory, capabilities as the gates decide, a
    /// pool of portalloc's own.
    pub fn new() -> Self {
        Self::default()
    }

    /// The defaults, with what `config` gives a HIP device: the memory kind
    /// ([`Config::hip_memory`]) and the XNACK mode for the notes ([`Config::hsa_xnack`]).
    pub fn from_config(config: &Config) -> Self {
        Self::new()
            .memory(config.hip_memory.value)
            .hsa_xnack(config.hsa_xnack.value)
    }

    /// [`HipDeviceBuilder::from_config`] with `PORTALLOC_HIP_MEMORY` and `HSA_XNACK` (and no
    /// other variable) read from the process environment through [`Config::from_env_vars`]:
    /// for callers without a [`Config`].
    ///
    /// # Errors
    /// [`Error::Config`] for a memory kind that is none of `coarse`, `fine`, `uncached`, or
    /// an `HSA_XNACK` that is neither 0 nor 1.
    pub fn from_env() -> Result<Self> {
        let config = Config::from_env_vars(&[MEMORY_VARIABLE, crate::config::HSA_XNACK])?;
        Ok(Self::from_config(&config))
    }

    crate::backends::setters! {
        /// The device ordinal (default 0).
        ordinal: u32;
        /// The memory kind of plain allocations (default [`MemoryKind::Coarse`]).
        memory: MemoryKind;
        /// Fail to open, with the reason, when the gates leave virtual memory off (default:
        /// open without it).
        require_virtual_memory: bool;
        /// Fail to open, with the reason, when the device has no stream-ordered pools.
        require_pools: bool;
        /// Use the device's default pool (`hipDeviceGetDefaultMemPool`, shared with the rest
        /// of the process) instead of one of portalloc's own (`hipMemPoolCreate`, the
        /// default, whose threshold and trimming disturb no one else).
        default_pool: bool;
        /// The XNACK mode the runtime was started with (`HSA_XNACK`: `Some(true)` for 1),
        /// reported in the device's notes; the runtime reads the variable itself, so this
        /// changes no behaviour (default `None`: not set).
        hsa_xnack: Option<bool>;
    }

    /// Opens the device on `runtime`.
    ///
    /// # Errors
    /// [`Error::Driver`] with HIP's name when the runtime fails (`hipErrorNoDevice` where
    /// there is no GPU); [`Error::InvalidArgument`] for an ordinal out of range;
    /// [`Error::Unsupported`] for a capability or memory kind required but not available
    /// (naming what was found and what is needed).
    pub fn open(self, runtime: Arc<Runtime>) -> Result<HipDevice> {
        HipDevice::open_with(runtime, self)
    }
}

/// One AMD GPU behind the [`Device`] trait: the GPU layer's [`GpuDevice`] (books, checks,
/// locks, drop) over HIP's calls.
///
/// * **Device**: HIP's current device is per thread, so every call makes this device's
///   ordinal current for the call's length (`hipGetDevice`; when another device was
///   current, `hipSetDevice` to this one and back to the caller's afterwards): the device
///   may be used from any thread and never changes the caller's current device.
/// * **Memory**: [`Device::alloc`] / [`Device::free`] are `hipMalloc` (coarse-grained, the
///   default) or `hipExtMallocWithFlags` (fine-grained, uncached) and `hipFree`.
/// * **Copies and pinned host memory**: [`Device::copy_to_host`] / [`Device::copy_from_host`]
///   are `hipMemcpyDtoHAsync` / `hipMemcpyHtoDAsync` on the caller's stream, after the books
///   checked the device range; [`Device::alloc_pinned_host`] is
///   `hipHostMalloc(hipHostMallocDefault)`, `Ok(None)` on a runtime without it.
/// * **Virtual memory** ([`VirtualMemory`]) only on ROCm ≥ 7 with attribute 89 set (see
///   [`super::tuning`]), with chunks of the recommended granularity raised to 2 MiB. Opening
///   it probes whether a released handle's memory is held until its reservation is freed
///   (ROCm 7.x on Linux): [`VirtualMemory::holds_released_memory`], and the note `released
///   memory`. It also sees whether each handle holds a file descriptor of the process (ROCm
///   7.14, ROCm/rocm-systems#10604): [`VirtualMemory::handle_budget`] then says how many more
///   handles the process can hold, and the note `descriptors per handle` says so; opening a
///   device with virtual memory raises the soft `RLIMIT_NOFILE` to the hard limit first.
/// * **Stream-ordered pool** ([`crate::device::StreamOrderedPool`]) when attribute 88 is set:
///   a pool of its own (`hipMemPoolCreate`), made at first use with its release threshold
///   set explicitly.
/// * **Streams and events**: [`Device::create_stream`] makes
///   `hipStreamCreateWithFlags(hipStreamDefault)` streams (blocking, so the null stream orders
///   with them) and events are `hipEventCreateWithFlags(hipEventDisableTiming)`.
///   [`Device::synchronize_device`] is `hipDeviceSynchronize`.
pub type HipDevice = GpuDevice<Hip>;

/// HIP's side of a [`HipDevice`]: the runtime, the ordinal, and what was decided at open.
#[derive(Debug)]
pub struct Hip {
    runtime: Arc<Runtime>,
    ordinal: u32,
    version: HipVersion,
    memory: MemoryKind,
    vmm: Gate,
    pools: Gate,
    default_pool: bool,
    /// The shared default pool's release threshold when the device took it (with
    /// `default_pool`): set back when the device gives the pool back, so that other users
    /// of the pool do not inherit portalloc's.
    shared_threshold: AtomicU64,
}

impl Hip {
    fn check(&self, call: &'static str, code: sys::hipError_t) -> Result<()> {
        self.runtime.check(call, code)
    }

    /// Runs a call that writes one pointer-sized handle, checked, as a `u64`.
    fn made<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(*mut *mut T) -> sys::hipError_t,
    ) -> Result<u64> {
        let mut made: *mut T = std::ptr::null_mut();
        self.check(call, f(&mut made))?;
        Ok(made as usize as u64)
    }
}

impl VendorApi for Hip {
    const BACKEND: &'static str = BACKEND;
    const VENDOR: Vendor = Vendor::Hip;
    const OUT_OF_MEMORY: i64 = sys::hipErrorOutOfMemory as i64;
    const PEER_CALLS: [&'static str; 2] = super::PEER_SYMBOLS;
    /// The peer's ordinal: HIP's peer access is per device, with nothing to release.
    type Peer = u32;
    /// The caller's current device.
    type Saved = u32;

    /// `hipGetDevice`, plus `hipSetDevice` when another device was current.
    fn enter(&self) -> Result<Option<u32>> {
        let before = self.runtime.current_device()?;
        if before == self.ordinal {
            return Ok(None);
        }
        self.runtime.set_device(self.ordinal)?;
        Ok(Some(before))
    }

    /// `hipSetDevice` back to the caller's device.
    fn leave(&self, saved: u32) {
        if let Err(e) = self.runtime.set_device(saved) {
            tracing::warn!(error = %e, "could not make the caller's device current again");
        }
    }

    /// `hipMalloc` (coarse-grained) or `hipExtMallocWithFlags` (the kind chosen at open).
    fn alloc(&self, size: u64) -> Result<u64> {
        let bytes = usize::try_from(size).map_err(|_| Error::InvalidSize {
            size,
            reason: "larger than this platform's size_t",
        })?;
        let api = &self.runtime.api;
        match self.memory.flags() {
            // SAFETY: writes one pointer through a valid pointer.
            None => self.made("hipMalloc", |p| unsafe { (api.malloc)(p, bytes) }),
            // SAFETY: as above; the flags are one of the header's hipDeviceMalloc* values.
            Some(flags) => self.made("hipExtMallocWithFlags", |p| unsafe {
                (api.ext_malloc_with_flags)(p, bytes, flags)
            }),
        }
    }

    /// `hipMemGetInfo` of the current device.
    fn mem_info(&self) -> Result<(u64, u64)> {
        self.runtime.mem_get_info()
    }

    unsafe fn free(&self, p: u64) -> Result<()> {
        // SAFETY: the caller guarantees a live allocation.
        self.check("hipFree", unsafe { (self.runtime.api.free)(handle(p)) })
    }

    fn stream_create(&self) -> Result<u64> {
        let f = self.runtime.api.stream_create_with_flags;
        // SAFETY: writes one handle through a valid pointer.
        self.made("hipStreamCreateWithFlags", |s| unsafe {
            f(s, sys::hipStreamDefault)
        })
    }

    fn outlive_streams(&self) {
        // A HIP stream belongs to its device for the process's life: nothing to keep.
    }

    unsafe fn stream_destroy(&self, s: u64) -> Result<()> {
        // SAFETY: the caller guarantees a live stream, not used afterwards.
        self.check("hipStreamDestroy", unsafe {
            (self.runtime.api.stream_destroy)(handle(s))
        })
    }

    unsafe fn stream_synchronize(&self, s: u64) -> Result<()> {
        let f = self.runtime.api.stream_synchronize;
        // SAFETY: the caller guarantees a live stream, null or a special handle.
        self.check("hipStreamSynchronize", unsafe { f(handle(s)) })
    }

    unsafe fn stream_wait_event(&self, s: u64, e: u64) -> Result<()> {
        let f = self.runtime.api.stream_wait_event;
        // SAFETY: the caller guarantees both handles; flags must be 0.
        self.check("hipStreamWaitEvent", unsafe { f(handle(s), handle(e), 0) })
    }

    fn device_synchronize(&self) -> Result<()> {
        // SAFETY: no arguments; the device was made current.
        self.check("hipDeviceSynchronize", unsafe {
            (self.runtime.api.device_synchronize)()
        })
    }

    fn event_create(&self) -> Result<u64> {
        let f = self.runtime.api.event_create_with_flags;
        // SAFETY: writes one handle through a valid pointer.
        self.made("hipEventCreateWithFlags", |e| unsafe {
            f(e, sys::hipEventDisableTiming)
        })
    }

    unsafe fn event_record(&self, e: u64, s: u64) -> Result<()> {
        // SAFETY: the caller guarantees a live event and a valid stream.
        self.check("hipEventRecord", unsafe {
            (self.runtime.api.event_record)(handle(e), handle(s))
        })
    }

    unsafe fn event_query(&self, e: u64) -> Result<bool> {
        // SAFETY: the caller guarantees a live event.
        let code = unsafe { (self.runtime.api.event_query)(handle(e)) };
        if code == sys::hipErrorNotReady {
            return Ok(false);
        }
        self.check("hipEventQuery", code).map(|()| true)
    }

    unsafe fn event_synchronize(&self, e: u64) -> Result<()> {
        let f = self.runtime.api.event_synchronize;
        // SAFETY: the caller guarantees a live event.
        self.check("hipEventSynchronize", unsafe { f(handle(e)) })
    }

    unsafe fn event_destroy(&self, e: u64) -> Result<()> {
        // SAFETY: the caller guarantees a live event, not used afterwards.
        self.check("hipEventDestroy", unsafe {
            (self.runtime.api.event_destroy)(handle(e))
        })
    }

    fn create_physical(&self, size: u64, exportable: bool) -> Result<u64> {
        let vmm = self.runtime.vmm("hipMemCreate")?;
        let prop = if exportable {
            super::exportable_prop(self.ordinal, sys::hipMemHandleTypePosixFileDescriptor)
        } else {
            device_prop(self.ordinal)
        };
        // SAFETY: reads the prop, writes one handle through a valid pointer.
        self.made("hipMemCreate", |h| unsafe {
            (vmm.create)(h, size as usize, &prop, 0)
        })
    }

    unsafe fn export_physical(&self, h: u64) -> Result<std::os::fd::OwnedFd> {
        let api = self.runtime.shareable("hipMemExportToShareableHandle")?;
        let mut fd: c_int = -1;
        // SAFETY: the caller guarantees a live handle; for a POSIX descriptor the runtime
        // writes one `int` through the pointer.
        self.check("hipMemExportToShareableHandle", unsafe {
            (api.export)(
                (&mut fd as *mut c_int).cast(),
                handle(h),
                sys::hipMemHandleTypePosixFileDescriptor,
                0,
            )
        })?;
        crate::backends::gpu::owned_descriptor("hipMemExportToShareableHandle", fd)
    }

    fn import_physical(&self, fd: std::os::fd::BorrowedFd<'_>) -> Result<u64> {
        use std::os::fd::AsRawFd;
        let api = self.runtime.shareable("hipMemImportFromShareableHandle")?;
        // The descriptor's value cast to a pointer, not its address (ROCm/rocm-systems PR
        // #1564 fixed AMD's own test that passed the address).
        let os_handle = fd.as_raw_fd() as usize as *mut std::ffi::c_void;
        // SAFETY: the runtime reads the descriptor (open for the call) and writes one handle.
        self.made("hipMemImportFromShareableHandle", |h| unsafe {
            (api.import)(h, os_handle, sys::hipMemHandleTypePosixFileDescriptor)
        })
    }

    unsafe fn ipc_get(&self, ptr: u64) -> Result<[u8; 64]> {
        let api = self.runtime.ipc("hipIpcGetMemHandle")?;
        // Zeroed first: every byte a caller sends is defined, whatever the runtime writes.
        let mut out = sys::hipIpcMemHandle_t { reserved: [0; 64] };
        // SAFETY: the caller guarantees a live plain allocation; the runtime writes 64 bytes.
        self.check("hipIpcGetMemHandle", unsafe {
            (api.get)(&mut out, handle(ptr))
        })?;
        Ok(out.reserved)
    }

    fn ipc_open(&self, bytes: &[u8; 64]) -> Result<u64> {
        let api = self.runtime.ipc("hipIpcOpenMemHandle")?;
        let h = sys::hipIpcMemHandle_t { reserved: *bytes };
        // SAFETY: the handle by value; the runtime writes one pointer.
        self.made("hipIpcOpenMemHandle", |p| unsafe {
            (api.open)(p, h, sys::hipIpcMemLazyEnablePeerAccess)
        })
    }

    unsafe fn ipc_close(&self, ptr: u64) -> Result<()> {
        let api = self.runtime.ipc("hipIpcCloseMemHandle")?;
        // SAFETY: the caller guarantees memory opened here and unused.
        self.check("hipIpcCloseMemHandle", unsafe { (api.close)(handle(ptr)) })
    }

    unsafe fn release_physical(&self, h: u64) -> Result<()> {
        let vmm = self.runtime.vmm("hipMemRelease")?;
        // SAFETY: the caller guarantees a live handle.
        self.check("hipMemRelease", unsafe { (vmm.release)(handle(h)) })
    }

    /// `hipMemAddressReserve` with `addr` as its hint (0: null, none): the runtime may
    /// answer another address.
    fn reserve(&self, size: u64, alignment: u64, addr: u64) -> Result<u64> {
        let vmm = self.runtime.vmm("hipMemAddressReserve")?;
        let (size, alignment) = (size as usize, alignment as usize);
        // SAFETY: writes one pointer through a valid pointer; the hint is an address the
        // runtime only compares with its free ranges (it dereferences nothing there).
        self.made("hipMemAddressReserve", |va| unsafe {
            (vmm.reserve)(va, size, alignment, handle(addr), 0)
        })
    }

    unsafe fn free_reservation(&self, va: u64, size: u64) -> Result<()> {
        let vmm = self.runtime.vmm("hipMemAddressFree")?;
        // SAFETY: the caller guarantees a whole, unmapped reservation.
        self.check("hipMemAddressFree", unsafe {
            (vmm.address_free)(handle(va), size as usize)
        })
    }

    unsafe fn map(&self, va: u64, size: u64, offset: u64, h: u64) -> Result<()> {
        let vmm = self.runtime.vmm("hipMemMap")?;
        let (size, offset) = (size as usize, offset as usize);
        // SAFETY: the caller guarantees a live handle and a free range of a reservation.
        self.check("hipMemMap", unsafe {
            (vmm.map)(handle(va), size, offset, handle(h), 0)
        })
    }

    unsafe fn unmap(&self, va: u64, size: u64) -> Result<()> {
        let vmm = self.runtime.vmm("hipMemUnmap")?;
        // SAFETY: the caller guarantees whole live mappings, unused now.
        self.check("hipMemUnmap", unsafe {
            (vmm.unmap)(handle(va), size as usize)
        })
    }

    unsafe fn set_access(&self, va: u64, size: u64, peers: &[u32]) -> Result<()> {
        let vmm = self.runtime.vmm("hipMemSetAccess")?;
        let descs: Vec<sys::hipMemAccessDesc> = std::iter::once(self.ordinal)
            .chain(peers.iter().copied())
            .map(|o| sys::hipMemAccessDesc {
                location: location(o),
                flags: sys::hipMemAccessFlagsProtReadWrite,
            })
            .collect();
        let (va, size, count) = (handle(va), size as usize, descs.len());
        // SAFETY: reads `count` descriptors; the caller guarantees the range is mapped.
        self.check("hipMemSetAccess", unsafe {
            (vmm.set_access)(va, size, descs.as_ptr(), count)
        })
    }

    /// The pool of its own (or the default pool), its release threshold set to 0
    /// explicitly: ROCm pools are known to keep freed memory unless told otherwise.
    fn pool_open(&self) -> Result<u64> {
        let api = self.runtime.pools("hipMemPoolCreate")?;
        let p = if self.default_pool {
            let f = api.default_pool;
            // SAFETY: writes one handle through a valid pointer.
            self.made("hipDeviceGetDefaultMemPool", |p| unsafe {
                f(p, self.ordinal as c_int)
            })?
        } else {
            let props = sys::hipMemPoolProps {
                allocType: sys::hipMemAllocationTypePinned,
                handleTypes: sys::hipMemHandleTypeNone,
                location: location(self.ordinal),
                win32SecurityAttributes: std::ptr::null_mut(),
                reserved: [0; 64],
            };
            // SAFETY: reads the props (reserved bytes zero, as the header demands), writes
            // one handle through a valid pointer.
            self.made("hipMemPoolCreate", |p| unsafe { (api.create)(p, &props) })?
        };
        if self.default_pool {
            // SAFETY: the device's default pool is live for the process.
            let found = unsafe { self.pool_attribute(p, PoolAttribute::ReleaseThreshold) }?;
            self.shared_threshold.store(found, Ordering::Relaxed);
        }
        // SAFETY: the pool was just made (or fetched) and is live.
        if let Err(e) = unsafe { self.pool_set_release_threshold(p, 0) } {
            // SAFETY: the pool is given back once, here, used by no one else.
            let _ = unsafe { self.pool_close(p) };
            return Err(e);
        }
        Ok(p)
    }

    /// Destroys the pool of its own; the shared default pool gets its release threshold back
    /// (what it was when the device took it) and is trimmed instead, giving back what
    /// portalloc left in it.
    unsafe fn pool_close(&self, p: u64) -> Result<()> {
        if self.default_pool {
            let threshold = self.shared_threshold.load(Ordering::Relaxed);
            // SAFETY: the device's default pool is live for the process.
            let restored = unsafe { self.pool_set_release_threshold(p, threshold) };
            // SAFETY: as above.
            let trimmed = unsafe { self.pool_trim(p, 0) };
            return restored.and(trimmed);
        }
        let api = self.runtime.pools("hipMemPoolDestroy")?;
        // SAFETY: the caller guarantees a live pool of this device, not used afterwards.
        self.check("hipMemPoolDestroy", unsafe { (api.destroy)(handle(p)) })
    }

    unsafe fn pool_alloc(&self, p: u64, size: u64, s: u64) -> Result<u64> {
        let api = self.runtime.pools("hipMallocFromPoolAsync")?;
        // SAFETY: the caller guarantees pool and stream; writes one pointer.
        self.made("hipMallocFromPoolAsync", |out| unsafe {
            (api.malloc_async)(out, size as usize, handle(p), handle(s))
        })
    }

    unsafe fn pool_free(&self, p: u64, s: u64) -> Result<()> {
        let api = self.runtime.pools("hipFreeAsync")?;
        // SAFETY: the caller guarantees a live pool allocation and stream.
        self.check("hipFreeAsync", unsafe {
            (api.free_async)(handle(p), handle(s))
        })
    }

    unsafe fn pool_attribute(&self, p: u64, attribute: PoolAttribute) -> Result<u64> {
        let api = self.runtime.pools("hipMemPoolGetAttribute")?;
        // SAFETY: the caller guarantees a live pool; every one is a uint64_t attribute.
        let f = |v: &mut u64| unsafe {
            (api.get_attribute)(handle(p), attribute as _, (v as *mut u64).cast())
        };
        self.runtime.out("hipMemPoolGetAttribute", f)
    }

    unsafe fn pool_set_release_threshold(&self, p: u64, bytes: u64) -> Result<()> {
        let api = self.runtime.pools("hipMemPoolSetAttribute")?;
        let (mut v, attr) = (bytes, sys::hipMemPoolAttrReleaseThreshold);
        // SAFETY: the caller guarantees a live pool; the threshold is a uint64_t.
        let code = unsafe { (api.set_attribute)(handle(p), attr, (&mut v as *mut u64).cast()) };
        self.check("hipMemPoolSetAttribute", code)
    }

    unsafe fn pool_trim(&self, p: u64, keep: u64) -> Result<()> {
        let api = self.runtime.pools("hipMemPoolTrimTo")?;
        // SAFETY: the caller guarantees a live pool.
        self.check("hipMemPoolTrimTo", unsafe {
            (api.trim_to)(handle(p), keep as usize)
        })
    }

    unsafe fn stream_capture_info(&self, s: u64) -> Result<Option<(u32, u64)>> {
        let Some(api) = self.runtime.capture else {
            return Ok(None);
        };
        let (mut status, mut id): (sys::hipStreamCaptureStatus, core::ffi::c_ulonglong) = (0, 0);
        // SAFETY: the caller guarantees a live stream, null or a special handle; two values
        // written through valid pointers.
        let code = unsafe { (api.capture_info)(handle(s), &mut status, &mut id) };
        self.check("hipStreamGetCaptureInfo", code)
            .map(|()| Some((status, id)))
    }

    fn exchange_capture_mode(&self, mode: u32) -> Result<Option<u32>> {
        let Some(api) = self.runtime.capture else {
            return Ok(None);
        };
        let mut m: sys::hipStreamCaptureMode = mode;
        // SAFETY: reads and writes one mode through a valid pointer; no handle.
        let code = unsafe { (api.exchange_mode)(&mut m) };
        self.check("hipThreadExchangeStreamCaptureMode", code)
            .map(|()| Some(m))
    }

    fn has_peer_calls(&self) -> bool {
        self.runtime.has_peer_symbols()
    }

    fn device_count(&self) -> Result<u32> {
        self.runtime.device_count()
    }

    fn can_access_peer(&self, peer: u32) -> Result<bool> {
        self.runtime.device_can_access_peer(self.ordinal, peer)
    }

    /// `hipDeviceEnablePeerAccess(peer, 0)` from the current device; already enabled is
    /// success.
    fn enable_peer(&self, peer: u32) -> Result<u32> {
        let Some(api) = self.runtime.peer else {
            return Err(Error::Unsupported {
                what: "`hipDeviceEnablePeerAccess`".into(),
                backend: BACKEND,
                reason: format!("the runtime {} does not export it", self.runtime.path()),
            });
        };
        // SAFETY: integers by value.
        match unsafe { (api.enable)(peer as c_int, 0) } {
            sys::hipErrorPeerAccessAlreadyEnabled => Ok(peer),
            code => self.check("hipDeviceEnablePeerAccess", code).map(|()| peer),
        }
    }

    /// Nothing to give back: HIP's peer access belongs to the device.
    unsafe fn release_peer(&self, _peer: u32) -> Result<()> {
        Ok(())
    }
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, size: usize, s: u64) -> Result<()> {
        let f = self.runtime.api.memcpy_dtoh_async;
        // SAFETY: the caller guarantees the host and device ranges and the stream.
        let code = unsafe { f(dst.cast(), handle(src), size, handle(s)) };
        self.check("hipMemcpyDtoHAsync", code)
    }

    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, size: usize, s: u64) -> Result<()> {
        let f = self.runtime.api.memcpy_htod_async;
        // SAFETY: the caller guarantees the host and device ranges and the stream; HIP
        // declares the source `void *` but only reads it.
        let code = unsafe { f(handle(dst), src.cast_mut().cast(), size, handle(s)) };
        self.check("hipMemcpyHtoDAsync", code)
    }

    /// `hipHostMalloc(hipHostMallocDefault)` on the current device.
    fn host_alloc(&self, size: usize) -> Result<Option<u64>> {
        let Some(api) = self.runtime.pinned_host else {
            return Ok(None);
        };
        // SAFETY: writes one pointer through a valid pointer; the header's default flags.
        self.made("hipHostMalloc", |p| unsafe {
            (api.alloc)(p, size, sys::hipHostMallocDefault)
        })
        .map(Some)
    }

    unsafe fn host_free(&self, ptr: u64) -> Result<()> {
        let Some(api) = self.runtime.pinned_host else {
            return Err(Error::Unsupported {
                what: "`hipHostFree`".into(),
                backend: BACKEND,
                reason: format!("the runtime {} does not export it", self.runtime.path()),
            });
        };
        // SAFETY: the caller guarantees live memory from `host_alloc`, unused now.
        self.check("hipHostFree", unsafe { (api.free)(handle(ptr)) })
    }

    /// `hipHostRegister(hipHostRegisterDefault)` on the current device.
    unsafe fn host_register(&self, ptr: u64, size: usize) -> Result<bool> {
        let Some(api) = self.runtime.host_register else {
            return Ok(false);
        };
        // SAFETY: the caller guarantees `size` bytes of its own live host memory at `ptr`;
        // flags 0 (`hipHostRegisterDefault`).
        let code = unsafe { (api.register)(handle(ptr), size, 0) };
        self.check("hipHostRegister", code).map(|()| true)
    }

    fn registers_host(&self) -> bool {
        self.runtime.host_register.is_some()
    }

    unsafe fn host_unregister(&self, ptr: u64) -> Result<()> {
        let Some(api) = self.runtime.host_register else {
            return Err(Error::Unsupported {
                what: "`hipHostUnregister`".into(),
                backend: BACKEND,
                reason: format!("the runtime {} does not export it", self.runtime.path()),
            });
        };
        // SAFETY: the caller guarantees memory registered by `host_register`, unused now.
        self.check("hipHostUnregister", unsafe {
            (api.unregister)(handle(ptr))
        })
    }
}

impl GpuDevice<Hip> {
    /// A builder with the defaults.
    pub fn builder() -> HipDeviceBuilder {
        HipDeviceBuilder::new()
    }

    /// Opens device `ordinal` with the default options.
    ///
    /// # Errors
    /// As [`HipDeviceBuilder::open`].
    pub fn open(runtime: Arc<Runtime>, ordinal: u32) -> Result<HipDevice> {
        HipDeviceBuilder::new().ordinal(ordinal).open(runtime)
    }

    /// Opens every device of `runtime` with the default options.
    ///
    /// # Errors
    /// As [`HipDeviceBuilder::open`], for the first device that fails.
    pub fn open_all(runtime: Arc<Runtime>) -> Result<Vec<HipDevice>> {
        let count = runtime.device_count()?;
        (0..count)
            .map(|ordinal| HipDevice::open(Arc::clone(&runtime), ordinal))
            .collect()
    }

    fn open_with(runtime: Arc<Runtime>, options: HipDeviceBuilder) -> Result<HipDevice> {
        let ordinal = options.ordinal;
        let count = runtime.device_count()?;
        if ordinal >= count {
            return Err(Error::InvalidArgument {
                call: "HipDevice::open",
                reason: format!(
                    "device ordinal {ordinal} is out of range: {} reports {count} device(s), \
                     accepted are 0..={}",
                    runtime.path(),
                    count.saturating_sub(1)
                ),
            });
        }
        // Every query below names the device: the caller's current device stays as it is.
        let version = runtime.version()?;
        let name = runtime.device_name(ordinal)?;
        let total = runtime.total_mem(ordinal)?;

        // Capabilities from hipDeviceGetAttribute only; an attribute the runtime does not
        // know (89 on HIP 5.x answers hipErrorInvalidValue) counts as "not answered".
        let integrated = runtime
            .device_attribute(ordinal, attribute::INTEGRATED)
            .ok();
        let pools_attr = runtime.device_attribute(ordinal, attribute::POOLS).ok();
        let vmm_attr = runtime.device_attribute(ordinal, attribute::VMM).ok();
        let vmm = tuning::vmm_gate(version, vmm_attr, runtime.has_vmm_symbols());
        let pools = tuning::pool_gate(pools_attr, runtime.has_pool_symbols());
        if options.require_virtual_memory && !vmm.on {
            return Err(Error::Unsupported {
                what: "virtual memory".into(),
                backend: BACKEND,
                reason: format!(
                    "device {ordinal} ({name}): {}; needed: ROCm {} or newer with the attribute \
                     set",
                    vmm.reason,
                    tuning::VMM_MIN_MAJOR
                ),
            });
        }
        if options.require_pools && !pools.on {
            return Err(Error::Unsupported {
                what: "stream-ordered pools".into(),
                backend: BACKEND,
                reason: format!("device {ordinal} ({name}): {}", pools.reason),
            });
        }
        if options.memory == MemoryKind::Uncached && version.major() < 6 {
            return Err(Error::Unsupported {
                what: "uncached memory (hipDeviceMallocUncached)".into(),
                backend: BACKEND,
                reason: format!(
                    "HIP {version} predates hipDeviceMallocUncached; needed: ROCm 6 or newer \
                     (or use fine-grained memory)"
                ),
            });
        }

        let (minimum, recommended) = if vmm.on {
            (
                Some(runtime.allocation_granularity(ordinal, false)?),
                Some(runtime.allocation_granularity(ordinal, true)?),
            )
        } else {
            (None, None)
        };
        let (chunk, chunk_reason) = tuning::chunk_size(minimum, recommended);

        let arch_found = runtime.arch_name(ordinal, version);
        let (arch, arch_note) = match &arch_found {
            Some((full, source)) => (tuning::arch_short(full), format!("{full} (from {source})")),
            None => (
                "unknown".to_string(),
                if version.major() >= 6 && !runtime.has_properties_r0600() {
                    format!("unknown: HIP {version} does not export hipGetDevicePropertiesR0600")
                } else {
                    "unknown: the device properties call failed or named none".to_string()
                },
            ),
        };
        let xnack = tuning::xnack_note(
            options.hsa_xnack,
            arch_found.as_ref().map(|(full, _)| full.as_str()),
        );
        let (_apu, apu_note) = tuning::apu_note(integrated);
        let (map_visible_after, mapping_note) = tuning::map_visible_after(&arch);

        let notes = vec![
            (
                "runtime".to_string(),
                format!("HIP {version} ({})", runtime.path()),
            ),
            ("architecture".to_string(), arch_note),
            ("memory".to_string(), tuning::memory_note(options.memory)),
            ("chunk size and alignment".to_string(), chunk_reason),
            (
                "virtual memory".to_string(),
                format!("{}: {}", on_off(vmm.on), vmm.reason),
            ),
            (
                "stream-ordered pools".to_string(),
                format!(
                    "{}: {}{}",
                    on_off(pools.on),
                    pools.reason,
                    if pools.on && options.default_pool {
                        " (the device's default pool)"
                    } else {
                        ""
                    }
                ),
            ),
            ("apu".to_string(), apu_note),
            ("xnack".to_string(), xnack),
            ("new mappings".to_string(), mapping_note),
        ];
        let mut notes = notes;
        if let Some(uuid) = runtime.device_uuid(ordinal) {
            notes.push(("uuid".to_string(), uuid));
        }
        let info = DeviceInfo {
            vendor: Vendor::Hip,
            ordinal,
            name,
            arch,
            total_bytes: total,
            min_granularity: minimum.unwrap_or(chunk),
            recommended_granularity: chunk,
            capabilities: Capabilities {
                virtual_memory: vmm.on,
                stream_ordered_pool: pools.on,
            },
            notes,
        };
        if vmm.on {
            // ROCm 7.14's hipMemCreate opens a descriptor per handle (ROCm/rocm-systems#10604):
            // at the stock soft limit of 1024 a process stops at ~1015 handles. The soft
            // limit goes up to the hard one, as far as the system lets it (said in the note
            // `descriptors per handle`, which the probe in `GpuDevice::new` writes).
            crate::backends::descriptors::raise_soft_limit();
        }
        Ok(GpuDevice::new(Opened {
            vendor: Hip {
                runtime,
                ordinal,
                version,
                memory: options.memory,
                vmm,
                pools,
                default_pool: options.default_pool,
                shared_threshold: AtomicU64::new(0),
            },
            info,
            granularity: chunk,
            pool: None,
            map_visible_after,
        }))
    }

    /// The runtime the device calls.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.vendor().runtime
    }

    /// The runtime version the gates read.
    pub fn version(&self) -> HipVersion {
        self.vendor().version
    }

    /// The memory kind of plain allocations.
    pub fn memory_kind(&self) -> MemoryKind {
        self.vendor().memory
    }

    /// The virtual-memory decision and its reason.
    pub fn virtual_memory_gate(&self) -> &Gate {
        &self.vendor().vmm
    }

    /// The stream-ordered pool decision and its reason.
    pub fn pool_gate(&self) -> &Gate {
        &self.vendor().pools
    }

    /// The virtual-memory capability, or [`Error::Unsupported`] saying why it is off.
    ///
    /// # Errors
    /// [`Error::Unsupported`] naming the runtime found and what is needed.
    pub fn require_virtual_memory(&self) -> Result<&dyn VirtualMemory> {
        self.virtual_memory().ok_or_else(|| Error::Unsupported {
            what: "virtual memory".into(),
            backend: BACKEND,
            reason: format!(
                "device {} ({}): {}; needed: ROCm {} or newer with the attribute set",
                self.info().ordinal,
                self.info().name,
                self.vendor().vmm.reason,
                tuning::VMM_MIN_MAJOR
            ),
        })
    }
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}
