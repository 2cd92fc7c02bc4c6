//! The GPU layer: what the CUDA and HIP shims share, written once. A vendor implements
//! [`VendorApi`] — its checked calls, with vendor-neutral signatures — and
//! [`GpuDevice<V>`](GpuDevice) is the [`Device`], [`VirtualMemory`] and [`StreamOrderedPool`]
//! over it: the books, the checks, the lock discipline, the census and what a dropped device
//! gives back. `CudaDevice` is `GpuDevice<Cuda>` and `HipDevice` is `GpuDevice<Hip>`; `cuda/`
//! and `hip/` keep loading, symbols, error names, capability gates and opening.
//!
//! # What is `unsafe`
//!
//! One rule for both result layers (`cuda::Driver`, `hip::Runtime`) and for [`VendorApi`]:
//! a call that passes a handle or pointer the driver dereferences or frees — a stream, event,
//! pool, physical handle, device pointer or mapped address — is an `unsafe fn`, crate-private,
//! with a `# Safety` section saying which handle must be live. Calls that only create
//! something, or take integers the driver looks up itself (ordinals, attribute numbers), are
//! safe. A public safe function can never break a device's invariants: only [`GpuDevice`]
//! passes handles, after checking them against its books.
//!
//! # Locks
//!
//! A device has four locks, taken in this order if a call ever holds more than one:
//! **pool → peers → handles → books**. Today no call holds two at once (the census reads the
//! handles, lets go, then reads the books), so the order is the rule for the next one.
//!
//! * `books` (a mutex) is never held across a driver call: a call *claims* what it gives back
//!   (takes it out of the books, checked), drops the lock, calls the driver, and puts it back
//!   if the driver refuses; a call that makes something books it after the driver answered.
//!   So `free`, `unmap` and the like, which can wait for the whole device, block no one.
//! * `handles` (streams and events, a mutex) is not held across a driver call either: a call
//!   that passes one of the device's events to the driver (record, query, synchronize) takes
//!   a *use* of it first, and an event destroyed meanwhile goes when its last use ends, so
//!   `synchronize_event` blocks no one. A caller's own streams are passed on as they are.
//! * `peers` is held while peer access is enabled (so two threads do not enable it twice).
//! * `pool` is held while the pool is made at first use.
//!
//! # What differs between the vendors, on purpose
//!
//! | | CUDA (`cuda/`) | HIP (`hip/`) |
//! |---|---|---|
//! | making the device current for a call ("enter", then "leave") | the primary context, retained at open, made current (`cuCtxSetCurrent`) when another (or none) was, and the caller's made current again after | `hipSetDevice(ordinal)` when another device was current (`hipGetDevice`), and the caller's again after |
//! | a GPU-side wait | `cuStreamWaitEvent` | `hipStreamWaitEvent` |
//! | peer access | per context: the peer's primary context is retained until the device goes (`cuCtxEnablePeerAccess`) | per device: `hipDeviceEnablePeerAccess(ordinal)`, nothing to release |
//! | virtual memory | CUDA ≥ 10.2, the calls exported, attribute 102 set; the minimum granularity | ROCm ≥ 7 and attribute 89 (`hipDeviceAttributeVirtualMemoryManagementSupported`) set; the recommended granularity raised to 2 MiB (`hip/tuning.rs`) |
//! | pool | made at open (`cuMemPoolCreate`) | made at first use, own (`hipMemPoolCreate`) or the default pool (builder), release threshold always set to 0 |
//! | dropping the pool | destroyed | destroyed; the shared default pool is trimmed instead |
//! | plain allocations | `cuMemAlloc_v2` | `hipMalloc` or `hipExtMallocWithFlags` with the [`crate::backends::hip::MemoryKind`] chosen at open |
//! | version numbers | `cuDriverGetVersion` (12020) | `hipRuntimeGetVersion` (60241133) |
//! | initialising | `cuInit(0)` at open | none: `hipGetDeviceCount` initialises (HIP 5.2's `hipInit` answers a less telling error) |
//! | out of memory | `CUDA_ERROR_OUT_OF_MEMORY` | `hipErrorOutOfMemory`, or a null pointer from `hipMalloc` |
//! | symbols | `cuDevicePrimaryCtxRelease_v2` falls back to the CUDA 7 name | the device-properties call by ROCm release (`R0600` on ROCm ≥ 6) |
//! | opening | `CudaDevice::open(driver, ordinal)` | `HipDevice::builder()` with options (memory kind, required capabilities, default pool) |
//! | copies, pinned host memory | `cuMemcpyDtoHAsync_v2` / `cuMemcpyHtoDAsync_v2` (required, CUDA 3.2); `cuMemHostAlloc` / `cuMemFreeHost` (optional group: without it, no pinned memory) | `hipMemcpyDtoHAsync` / `hipMemcpyHtoDAsync` (required, HIP ≤ 4.2); `hipHostMalloc` / `hipHostFree` (optional group) |

mod books;
mod probe;

/// The key of the note ([`DeviceInfo::notes`]) that says whether the driver spends a file
/// descriptor per physical handle, and the process's limit.
/// [`GpuDevice`]'s `exportable`: not found out (the probe had no memory to try with).
pub(crate) const EXPORTABLE_UNKNOWN: u8 = 0;
/// The driver made a handle exportable as a POSIX descriptor.
pub(crate) const EXPORTABLE_YES: u8 = 1;
/// The driver refused the request for an exportable handle, or has no virtual memory.
pub(crate) const EXPORTABLE_NO: u8 = 2;

pub(crate) const DESCRIPTORS_NOTE: &str = "descriptors per handle";

/// The note under [`DESCRIPTORS_NOTE`]: what the probe found and the process's descriptors.
fn descriptors_note(per_handle: Option<bool>) -> String {
    let now = descriptors::Descriptors::now().summary();
    match per_handle {
        Some(true) => format!(
            "one file descriptor per physical handle (probed: a descriptor opened at the create \
             and closed at the release; ROCm 7.14, ROCm/rocm-systems#10604); the process has \
             {now} — the vmm strategy makes handles large enough to stay well under the limit"
        ),
        Some(false) => {
            format!("none (probed: creating and releasing a handle opened no descriptor); {now}")
        }
        None => format!("not known (the process's descriptors could not be listed); {now}"),
    }
}

use std::fmt;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};

pub use books::VendorCensus;
use books::{check_granular, unknown, Books, EventUse, Handles};

use crate::backends::{descriptors, request_size, Request};
use crate::device::{
    CaptureMode, CaptureStatus, Device, DeviceInfo, Event, MemInfo, PhysicalHandle, PoolUsage,
    Stream, StreamOrderedPool, Vendor, VirtualMemory,
};
use crate::error::{Error, Result};

/// A pool attribute portalloc reads (all are 64-bit values on both vendors), numbered as
/// `CUmemPool_attribute` and `hipMemPoolAttr` both number it (HIP copies CUDA's enum; checked
/// below at compile time), so a vendor passes it on as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum PoolAttribute {
    /// The release threshold (bytes kept at a synchronisation).
    ReleaseThreshold = 4,
    /// Memory the pool holds from the device now.
    ReservedCurrent = 5,
    /// The high-water mark of `ReservedCurrent`.
    ReservedHigh = 6,
    /// Memory handed out now.
    UsedCurrent = 7,
    /// The high-water mark of `UsedCurrent`.
    UsedHigh = 8,
}

#[cfg(feature = "cuda")]
const _: () = {
    use portalloc_sys::cuda as sys;
    assert!(sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD == PoolAttribute::ReleaseThreshold as u32);
    assert!(sys::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT == PoolAttribute::ReservedCurrent as u32);
    assert!(sys::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH == PoolAttribute::ReservedHigh as u32);
    assert!(sys::CU_MEMPOOL_ATTR_USED_MEM_CURRENT == PoolAttribute::UsedCurrent as u32);
    assert!(sys::CU_MEMPOOL_ATTR_USED_MEM_HIGH == PoolAttribute::UsedHigh as u32);
};

#[cfg(feature = "hip")]
const _: () = {
    use portalloc_sys::hip as sys;
    let attributes = [
        (
            sys::hipMemPoolAttrReleaseThreshold,
            PoolAttribute::ReleaseThreshold,
        ),
        (
            sys::hipMemPoolAttrReservedMemCurrent,
            PoolAttribute::ReservedCurrent,
        ),
        (
            sys::hipMemPoolAttrReservedMemHigh,
            PoolAttribute::ReservedHigh,
        ),
        (
            sys::hipMemPoolAttrUsedMemCurrent,
            PoolAttribute::UsedCurrent,
        ),
        (sys::hipMemPoolAttrUsedMemHigh, PoolAttribute::UsedHigh),
    ];
    let mut i = 0;
    while i < attributes.len() {
        assert!(attributes[i].0 == attributes[i].1 as u32);
        i += 1;
    }
};

/// The checked calls of one vendor, for one device, with vendor-neutral signatures: handles
/// and pointers are `u64`, every call answers a [`Result`] with the vendor's own error names.
/// Calls that depend on the current device are made after [`VendorApi::enter`].
///
/// The trait is public only so that `CudaDevice` / `HipDevice` can name it as a bound; it
/// lives in a private module, so no one outside portalloc can name or call it.
pub trait VendorApi: fmt::Debug + Send + Sync + Sized + 'static {
    /// The backend's name in errors (`"cuda"`, `"hip"`).
    const BACKEND: &'static str;
    /// The vendor of the devices.
    const VENDOR: Vendor;
    /// The vendor's out-of-memory code, which allocations turn into
    /// [`Error::DeviceOutOfMemory`].
    const OUT_OF_MEMORY: i64;
    /// The peer-access calls (query, enable), named in refusals.
    const PEER_CALLS: [&'static str; 2];
    /// What enabled peer access keeps about the peer (passed back to
    /// [`VendorApi::set_access`] and [`VendorApi::release_peer`]).
    type Peer: Copy + Send + Sync + fmt::Debug + 'static;

    /// What [`VendorApi::enter`] found current on the calling thread and replaced, to be
    /// made current again by [`VendorApi::leave`].
    type Saved: Copy + fmt::Debug;
    /// Makes the device current on the calling thread and says what it replaced (`None`
    /// when the device was current already).
    fn enter(&self) -> Result<Option<Self::Saved>>;
    /// Makes `saved` (what [`VendorApi::enter`] replaced) current again on the calling
    /// thread. Never fails: a refusal is logged.
    fn leave(&self, saved: Self::Saved);
    /// (free, total) bytes of the current device.
    fn mem_info(&self) -> Result<(u64, u64)>;
    /// How many devices the driver reports.
    fn device_count(&self) -> Result<u32>;
    /// A plain allocation of `size` bytes (`size` > 0).
    fn alloc(&self, size: u64) -> Result<u64>;
    /// Frees a plain allocation.
    ///
    /// # Safety
    /// `ptr` must be a live allocation from [`VendorApi::alloc`], not used afterwards.
    unsafe fn free(&self, ptr: u64) -> Result<()>;
    /// A new blocking stream.
    fn stream_create(&self) -> Result<u64>;
    /// Keeps what the streams made by [`VendorApi::stream_create`] need alive past this
    /// value's drop (CUDA: one more retain of the primary context, never released; HIP:
    /// nothing, a stream lives with the process). For the streams a device leaves live.
    fn outlive_streams(&self);
    /// # Safety
    /// `stream` must be a live stream from [`VendorApi::stream_create`], not used afterwards.
    unsafe fn stream_destroy(&self, stream: u64) -> Result<()>;
    /// # Safety
    /// `stream` must be a live stream of the current device, 0 or a special handle.
    unsafe fn stream_synchronize(&self, stream: u64) -> Result<()>;
    /// Waits for all work of the current device.
    fn device_synchronize(&self) -> Result<()>;
    /// A new event, timing disabled.
    fn event_create(&self) -> Result<u64>;
    /// # Safety
    /// `event` must be a live event, `stream` as for [`VendorApi::stream_synchronize`].
    unsafe fn event_record(&self, event: u64, stream: u64) -> Result<()>;
    /// True when complete, false while in flight.
    ///
    /// # Safety
    /// `event` must be a live event.
    unsafe fn event_query(&self, event: u64) -> Result<bool>;
    /// # Safety
    /// `event` must be a live event.
    unsafe fn event_synchronize(&self, event: u64) -> Result<()>;
    /// # Safety
    /// `event` must be a live event, not used afterwards.
    unsafe fn event_destroy(&self, event: u64) -> Result<()>;
    /// Work queued on `stream` from now on waits, on the device, for `event`'s last record.
    ///
    /// # Safety
    /// `event` must be a live event, `stream` as for [`VendorApi::stream_synchronize`].
    unsafe fn stream_wait_event(&self, stream: u64, event: u64) -> Result<()>;
    /// Physical memory of `size` bytes on this device.
    /// `cuMemCreate` / `hipMemCreate`; `exportable` asks for handles exportable as POSIX
    /// descriptors (`requestedHandleTypes`).
    fn create_physical(&self, size: u64, exportable: bool) -> Result<u64>;
    /// # Safety
    /// `handle` must be a live handle from [`VendorApi::create_physical`], not used afterwards.
    unsafe fn release_physical(&self, handle: u64) -> Result<()>;
    /// A new descriptor for a live handle made exportable
    /// (`cuMemExportToShareableHandle` / `hipMemExportToShareableHandle`).
    ///
    /// # Safety
    /// `handle` is a live handle of this device.
    unsafe fn export_physical(&self, handle: u64) -> Result<std::os::fd::OwnedFd>;
    /// A handle over the memory behind `fd` (`cuMemImportFromShareableHandle` /
    /// `hipMemImportFromShareableHandle`); the descriptor stays the caller's.
    fn import_physical(&self, fd: std::os::fd::BorrowedFd<'_>) -> Result<u64>;
    /// The legacy IPC handle of the plain allocation at `ptr` (`cuIpcGetMemHandle`).
    ///
    /// # Safety
    /// `ptr` starts a live plain allocation of this device.
    unsafe fn ipc_get(&self, ptr: u64) -> Result<[u8; 64]>;
    /// Opens another process's legacy IPC handle (`cuIpcOpenMemHandle_v2`, lazy peer access).
    fn ipc_open(&self, handle: &[u8; 64]) -> Result<u64>;
    /// Closes what [`VendorApi::ipc_open`] opened (`cuIpcCloseMemHandle`).
    ///
    /// # Safety
    /// `ptr` was opened here and no work uses it.
    unsafe fn ipc_close(&self, ptr: u64) -> Result<()>;
    /// An address range of `size` bytes aligned to `alignment`, at `addr` when the driver
    /// gives that address (0: anywhere); the driver's answer may be another address.
    fn reserve(&self, size: u64, alignment: u64, addr: u64) -> Result<u64>;
    /// # Safety
    /// `[va, va + size)` must be a whole live reservation with nothing mapped in it.
    unsafe fn free_reservation(&self, va: u64, size: u64) -> Result<()>;
    /// # Safety
    /// `handle` must be live and `[va, va + size)` inside a live reservation, unmapped.
    unsafe fn map(&self, va: u64, size: u64, offset: u64, handle: u64) -> Result<()>;
    /// # Safety
    /// `[va, va + size)` must be whole live mappings no one uses any more.
    unsafe fn unmap(&self, va: u64, size: u64) -> Result<()>;
    /// Read-write access to `[va, va + size)` for this device and each of `peers`.
    ///
    /// # Safety
    /// `[va, va + size)` must be mapped by this device.
    unsafe fn set_access(&self, va: u64, size: u64, peers: &[Self::Peer]) -> Result<()>;
    /// The device's stream-ordered pool, made (or fetched) and set up.
    fn pool_open(&self) -> Result<u64>;
    /// Gives back a pool from [`VendorApi::pool_open`].
    ///
    /// # Safety
    /// `pool` must come from [`VendorApi::pool_open`], not used afterwards.
    unsafe fn pool_close(&self, pool: u64) -> Result<()>;
    /// # Safety
    /// `pool` must be live, `stream` as for [`VendorApi::stream_synchronize`].
    unsafe fn pool_alloc(&self, pool: u64, size: u64, stream: u64) -> Result<u64>;
    /// # Safety
    /// `ptr` must be a live pool allocation, `stream` as for [`VendorApi::stream_synchronize`].
    unsafe fn pool_free(&self, ptr: u64, stream: u64) -> Result<()>;
    /// # Safety
    /// `pool` must be live.
    unsafe fn pool_attribute(&self, pool: u64, attribute: PoolAttribute) -> Result<u64>;
    /// # Safety
    /// `pool` must be live.
    unsafe fn pool_set_release_threshold(&self, pool: u64, bytes: u64) -> Result<()>;
    /// # Safety
    /// `pool` must be live.
    unsafe fn pool_trim(&self, pool: u64, keep: u64) -> Result<()>;
    /// True when the driver exports the peer-access calls.
    /// `cuStreamGetCaptureInfo` / `hipStreamGetCaptureInfo`: the stream's capture status (the
    /// vendors' 0 none, 1 active, 2 invalidated) and the capture's id; `None` when the driver
    /// lacks the call.
    ///
    /// # Safety
    /// `stream` is a live stream, null, or a special handle.
    unsafe fn stream_capture_info(&self, stream: u64) -> Result<Option<(u32, u64)>>;
    /// `cuThreadExchangeStreamCaptureMode` / `hipThreadExchangeStreamCaptureMode`: sets the
    /// calling thread's mode and answers the one it replaces; `None` when the driver lacks it.
    fn exchange_capture_mode(&self, mode: u32) -> Result<Option<u32>>;
    fn has_peer_calls(&self) -> bool;
    /// Whether this device can access memory of device `peer` (another ordinal).
    fn can_access_peer(&self, peer: u32) -> Result<bool>;
    /// Enables access to device `peer`'s memory from this (current) device.
    fn enable_peer(&self, peer: u32) -> Result<Self::Peer>;
    /// Undoes what [`VendorApi::enable_peer`] holds, as the device goes.
    ///
    /// # Safety
    /// `peer` came from [`VendorApi::enable_peer`] and is released once.
    unsafe fn release_peer(&self, peer: Self::Peer) -> Result<()>;
    /// Queues a copy of `size` bytes (> 0) from device memory at `src` to host memory at `dst`
    /// on `stream` (`cuMemcpyDtoHAsync_v2`, `hipMemcpyDtoHAsync`).
    ///
    /// # Safety
    /// `dst` is valid for `size` bytes of writes until the copy completes; `[src, src +
    /// size)` is memory of this device the current device may access; `stream` as for
    /// [`VendorApi::stream_synchronize`].
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, size: usize, stream: u64) -> Result<()>;
    /// Queues a copy of `size` bytes (> 0) from host memory at `src` to device memory at `dst`
    /// on `stream` (`cuMemcpyHtoDAsync_v2`, `hipMemcpyHtoDAsync`).
    ///
    /// # Safety
    /// `src` is valid for `size` bytes of reads until the copy completes; the rest as for
    /// [`VendorApi::copy_to_host`].
    unsafe fn copy_from_host(
        &self,
        dst: u64,
        src: *const u8,
        size: usize,
        stream: u64,
    ) -> Result<()>;
    /// `size` bytes (> 0) of page-locked host memory for the current device (`cuMemHostAlloc`,
    /// `hipHostMalloc`, flags 0); `None` when the driver does not export the pinned-host calls.
    fn host_alloc(&self, size: usize) -> Result<Option<u64>>;
    /// Frees memory from [`VendorApi::host_alloc`] (`cuMemFreeHost`, `hipHostFree`).
    ///
    /// # Safety
    /// `ptr` is live memory from [`VendorApi::host_alloc`], no copy uses it any more, and it
    /// is not used afterwards.
    unsafe fn host_free(&self, ptr: u64) -> Result<()>;
    /// Page-locks `size` bytes (> 0) of host memory at `ptr` for the current device
    /// (`cuMemHostRegister_v2` / `hipHostRegister`, flags 0); `Ok(false)` when the driver does
    /// not export the registration calls.
    ///
    /// # Safety
    /// `[ptr, ptr + size)` is host memory the caller owns, live until
    /// [`VendorApi::host_unregister`].
    unsafe fn host_register(&self, ptr: u64, size: usize) -> Result<bool>;
    /// True when the driver exports the registration calls (no call made).
    fn registers_host(&self) -> bool;
    /// Undoes [`VendorApi::host_register`] (`cuMemHostUnregister` / `hipHostUnregister`).
    ///
    /// # Safety
    /// `ptr` was registered with [`VendorApi::host_register`] and no copy uses it any more.
    unsafe fn host_unregister(&self, ptr: u64) -> Result<()>;
}

/// A handle the vendor API takes as a pointer (a stream, event or pool; on HIP also a device
/// pointer or physical handle) from the `u64` the GPU layer keeps it as.
pub(crate) fn handle<T>(value: u64) -> *mut T {
    value as usize as *mut T
}

/// What a GPU device is made of at open: the vendor's calls for it, its facts, and the
/// capabilities the vendor's gates turned on.
pub(crate) struct Opened<V> {
    pub(crate) vendor: V,
    pub(crate) info: DeviceInfo,
    /// The granularity sizes and addresses are checked against.
    pub(crate) granularity: u64,
    /// A pool made at open already (CUDA), or none (made at first use).
    pub(crate) pool: Option<u64>,
    /// [`VirtualMemory::map_visible_after`]: the vendor's tuning for the architecture.
    pub(crate) map_visible_after: std::time::Duration,
}

/// One GPU behind the [`Device`] trait, over a vendor's checked calls (`VendorApi`): `CudaDevice` and
/// `HipDevice`.
///
/// * Every call makes the device current on the calling thread for its length and then makes
///   current again what the caller had (a scope, `Current`), so the device may be used from
///   any thread and never changes the caller's current context or device.
/// * Pointers, handles, streams (to destroy) and events it did not hand out are
///   [`Error::UnknownPointer`], a size that is not the allocation's or not a multiple of the
///   granularity is [`Error::InvalidArgument`] — checked before the driver sees them; the
///   driver's refusals are [`Error::Driver`] with its own names, out-of-memory
///   [`Error::DeviceOutOfMemory`].
/// * Any stream the caller passes (its own, one from [`Device::create_stream`], or a special
///   handle) is used as it is.
/// * With virtual memory, opening the device probes once what releasing physical memory gives
///   back (one granule reserved, made, mapped, unmapped and released, the driver's free memory
///   read around the release — see the `probe` module): [`VirtualMemory::holds_released_memory`]
///   answers it, and the note `released memory` says what was found, how, and what vmm does
///   about it. [`VirtualMemory::reserve_at`] passes its address hint to the driver.
/// * Dropping the device gives back whatever it still holds — pool allocations (then a
///   synchronisation), allocations, mappings, physical handles, reservations, pinned host
///   memory, events, streams, the pool, peers — and warns about it.
pub struct GpuDevice<V: VendorApi> {
    vendor: V,
    info: DeviceInfo,
    granularity: u64,
    /// What [`probe::probe_release`] found at open: a released handle's memory stays in use
    /// until its reservation is freed. False without virtual memory.
    holds_released_memory: bool,
    /// What [`probe::probe_release`] found at open: the driver opens a file descriptor of
    /// the process for each physical handle. False without virtual memory.
    descriptor_per_handle: bool,
    /// How long a new mapping may stay invisible to GPU work ([`Opened::map_visible_after`]).
    map_visible_after: std::time::Duration,
    /// Whether the driver makes physical handles exportable as POSIX descriptors, found by the
    /// release probe at open ([`EXPORTABLE_UNKNOWN`], `_YES`, `_NO`).
    exportable: u8,
    pool: Mutex<Option<u64>>,
    peers: Mutex<Vec<(u32, V::Peer)>>,
    handles: Mutex<Handles>,
    books: Mutex<Books>,
}

impl<V: VendorApi> fmt::Debug for GpuDevice<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuDevice")
            .field("ordinal", &self.info.ordinal)
            .field("name", &self.info.name)
            .field("arch", &self.info.arch)
            .field("capabilities", &self.info.capabilities)
            .field("vendor", &self.vendor)
            .finish_non_exhaustive()
    }
}

/// The scope of a driver call: the device current on the calling thread, and what the
/// caller had current before, made current again when the scope ends (CUDA's context, HIP's
/// device), so that a call of portalloc never changes the caller's current device.
struct Current<'a, V: VendorApi> {
    vendor: &'a V,
    saved: Option<V::Saved>,
}

impl<V: VendorApi> Drop for Current<'_, V> {
    fn drop(&mut self) {
        if let Some(saved) = self.saved.take() {
            self.vendor.leave(saved);
        }
    }
}

/// Locks a mutex; every update of the guarded state is one step after the driver answered,
/// so the state is consistent even if a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<V: VendorApi> GpuDevice<V> {
    /// The device over what was opened; with virtual memory, first probes what releasing
    /// physical memory gives back ([`probe::probe_release`]) and says so in the notes, after
    /// the note on virtual memory.
    pub(crate) fn new(opened: Opened<V>) -> Self {
        let mut info = opened.info;
        let mut holds_released_memory = false;
        let mut descriptor_per_handle = false;
        let mut exportable = EXPORTABLE_NO;
        let mut books = Books::default();
        if info.capabilities.virtual_memory {
            let found = probe::probe_release(&opened.vendor, opened.granularity);
            holds_released_memory = found.holds;
            descriptor_per_handle = found.descriptor_per_handle == Some(true);
            let at = info
                .notes
                .iter()
                .position(|(k, _)| k == "virtual memory")
                .map_or(info.notes.len(), |i| i + 1);
            info.notes.insert(at, (probe::NOTE.into(), found.note));
            info.notes.insert(
                at + 1,
                (
                    DESCRIPTORS_NOTE.into(),
                    descriptors_note(found.descriptor_per_handle),
                ),
            );
            exportable = found.exportable;
            info.notes.insert(
                at + 2,
                (
                    probe::EXPORT_NOTE.into(),
                    match exportable {
                        EXPORTABLE_YES => "POSIX descriptors (shareable handles)".into(),
                        EXPORTABLE_NO => "none: the driver refused exportable handles".into(),
                        _ => "not probed (no memory to try)".into(),
                    },
                ),
            );
            let kept = found.kept;
            if let Some((va, size)) = kept.reservation {
                books.reservations.insert(va, size);
            }
            if let Some(h) = kept.handle {
                books.handles.insert(h);
            }
            if let (true, Some((va, size))) = (kept.mapped, kept.reservation) {
                books.mappings.insert(va, size);
            }
        }
        GpuDevice {
            vendor: opened.vendor,
            info,
            granularity: opened.granularity,
            holds_released_memory,
            descriptor_per_handle,
            map_visible_after: opened.map_visible_after,
            exportable,
            pool: Mutex::new(opened.pool),
            peers: Mutex::new(Vec::new()),
            handles: Mutex::new(Handles::default()),
            books: Mutex::new(books),
        }
    }

    /// The vendor's calls for this device.
    pub(crate) fn vendor(&self) -> &V {
        &self.vendor
    }

    /// What the device holds now, from its books. Takes one lock at a time (see the lock
    /// order in the module docs).
    pub fn census(&self) -> VendorCensus {
        let counts = self.handles().count();
        self.books().census(counts)
    }

    /// Makes the device current on the calling thread, and leaves it current: for a caller
    /// that wants this device's context (CUDA) or device (HIP) for calls of its own. No call
    /// of portalloc does this: each makes current again what the caller had.
    ///
    /// # Errors
    /// [`Error::Driver`] when the vendor's call fails.
    pub fn make_current(&self) -> Result<()> {
        self.vendor.enter().map(|_| ())
    }

    /// Makes the device current on the calling thread until the returned scope ends, which
    /// makes current again what the caller had: every driver call of the device runs in one.
    fn current(&self) -> Result<Current<'_, V>> {
        Ok(Current {
            vendor: &self.vendor,
            saved: self.vendor.enter()?,
        })
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        lock(&self.books)
    }

    fn handles(&self) -> MutexGuard<'_, Handles> {
        lock(&self.handles)
    }

    /// Runs `call` on an event of this device, made current, holding a use of the event (no
    /// lock); destroys the event after the call when it was destroyed meanwhile.
    fn with_event<T>(&self, event: Event, call: impl FnOnce(u64) -> Result<T>) -> Result<T> {
        let e = self.handles().borrow_event(V::BACKEND, event)?;
        let result = self.current().and_then(|_current| call(e));
        if self.handles().return_event(e) {
            // SAFETY: destroyed by the device's user while this call used it; this was its
            // last use, and it is out of the set, so nothing passes it to the driver again.
            if let Err(err) = unsafe { self.vendor.event_destroy(e) } {
                tracing::warn!(backend = V::BACKEND, event = e, error = %err,
                    "could not destroy an event after its last use");
            }
        }
        result
    }

    fn granular(&self, call: &'static str, what: &str, value: u64, zero_ok: bool) -> Result<()> {
        check_granular(self.granularity, call, what, value, zero_ok)
    }

    /// The vendor's out-of-memory code becomes [`Error::DeviceOutOfMemory`] with the free
    /// figure (0 when that cannot be read either); other errors pass through.
    /// [`Error::DescriptorLimit`] for the driver's out-of-memory answer to a handle of
    /// `requested` bytes when the process cannot open another descriptor: the driver needs one
    /// per handle (probed at open), or — not probed, or another driver — it may have needed one
    /// for anything. `None` when descriptors are left: the device's own refusal.
    fn descriptor_refusal(&self, e: &Error, requested: u64) -> Option<Error> {
        match e {
            Error::Driver { code, .. } if *code == V::OUT_OF_MEMORY => {}
            _ => return None,
        }
        let at_limit = match descriptors::headroom() {
            Some(left) if self.descriptor_per_handle => left == 0,
            _ => descriptors::exhausted(),
        };
        if !at_limit {
            return None;
        }
        let now = descriptors::Descriptors::now();
        Some(Error::DescriptorLimit {
            backend: V::BACKEND,
            requested,
            // Exhausted, the listing itself may be refused: then it holds all it may.
            open: now.open.or(now.soft).unwrap_or(0),
            limit: now.soft.unwrap_or(0),
            hard: now.hard,
        })
    }

    fn oom(&self, e: Error, requested: u64) -> Error {
        match e {
            Error::Driver { code, .. } if code == V::OUT_OF_MEMORY => self.out_of_memory(requested),
            other => other,
        }
    }

    fn out_of_memory(&self, requested: u64) -> Error {
        Error::DeviceOutOfMemory {
            backend: V::BACKEND,
            requested,
            free: self.vendor.mem_info().map(|(free, _)| free).unwrap_or(0),
        }
    }

    /// The pool, made at first use where the vendor did not make it at open.
    fn pool(&self) -> Result<u64> {
        self.has_pool()?;
        let mut pool = lock(&self.pool);
        if let Some(p) = *pool {
            return Ok(p);
        }
        let _current = self.current()?;
        let p = self.vendor.pool_open()?;
        *pool = Some(p);
        Ok(p)
    }

    /// [`Error::Unsupported`] when the device has no stream-ordered pool.
    fn has_pool(&self) -> Result<()> {
        if !self.info.capabilities.stream_ordered_pool {
            return Err(Error::Unsupported {
                what: "stream-ordered pool".into(),
                backend: V::BACKEND,
                reason: format!(
                    "device {} ({}) has no memory pools",
                    self.info.ordinal, self.info.name
                ),
            });
        }
        Ok(())
    }

    /// Runs `call` with the device current and `claimed` out of the books; puts it back with
    /// `restore` when the driver refuses. The books lock is not held during the call.
    fn give_back<T>(
        &self,
        claimed: T,
        call: impl FnOnce() -> Result<()>,
        restore: impl FnOnce(&mut Books, T),
    ) -> Result<()> {
        let result = self.current().and_then(|_current| call());
        if result.is_err() {
            restore(&mut self.books(), claimed);
        }
        result
    }

    /// The device handle, when `peer` is another device of this vendor's driver.
    fn peer_ordinal(&self, peer: &dyn Device) -> Result<Option<u32>> {
        let info = peer.info();
        if info.vendor != V::VENDOR
            || info.ordinal == self.info.ordinal
            || info.ordinal >= self.vendor.device_count()?
        {
            return Ok(None);
        }
        Ok(Some(info.ordinal))
    }
}

impl<V: VendorApi> Device for GpuDevice<V> {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<MemInfo> {
        let _current = self.current()?;
        let (free, total) = self.vendor.mem_info()?;
        Ok(MemInfo { free, total })
    }

    /// # Errors
    /// [`Error::InvalidSize`] for zero; [`Error::DeviceOutOfMemory`] for the vendor's
    /// out-of-memory (or a null pointer); [`Error::Driver`] otherwise.
    fn alloc(&self, size: u64) -> Result<u64> {
        request_size(size, 1, Request::Allocation)?;
        let _current = self.current()?;
        let ptr = self.vendor.alloc(size).map_err(|e| self.oom(e, size))?;
        if ptr == 0 {
            return Err(self.out_of_memory(size));
        }
        self.books().allocations.insert(ptr, size);
        Ok(ptr)
    }

    /// # Errors
    /// [`Error::UnknownPointer`] for a pointer not from [`Device::alloc`] (or freed already);
    /// [`Error::InvalidArgument`] for a `size` that is not the allocation's; [`Error::Driver`]
    /// when the driver refuses (the allocation is then still held).
    fn free(&self, ptr: u64, size: u64) -> Result<()> {
        self.books().claim_allocation(V::BACKEND, ptr, size)?;
        self.give_back(
            (ptr, size),
            // SAFETY: a live allocation of this device, taken out of the books above, so no
            // other call frees it meanwhile.
            || unsafe { self.vendor.free(ptr) },
            |b, (ptr, size)| {
                b.allocations.insert(ptr, size);
            },
        )
    }

    fn interprocess(&self) -> Option<&dyn crate::device::Interprocess> {
        Some(self)
    }

    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        self.info
            .capabilities
            .virtual_memory
            .then_some(self as &dyn VirtualMemory)
    }

    fn stream_ordered_pool(&self) -> Option<&dyn StreamOrderedPool> {
        self.info
            .capabilities
            .stream_ordered_pool
            .then_some(self as &dyn StreamOrderedPool)
    }

    fn create_stream(&self) -> Result<Stream> {
        let _current = self.current()?;
        let s = self.vendor.stream_create()?;
        self.handles().streams.insert(s);
        Ok(Stream(s))
    }

    unsafe fn destroy_stream(&self, stream: Stream) -> Result<()> {
        if stream == Stream::DEFAULT {
            return Err(Error::InvalidArgument {
                call: "destroy_stream",
                reason: "the default stream cannot be destroyed; accepted are streams from \
                         create_stream"
                    .into(),
            });
        }
        let s = self.handles().claim_stream(V::BACKEND, stream)?;
        let result = self.current().and_then(|_current| {
            // SAFETY: a live stream this device made (checked), out of the set, so no other
            // call of this device destroys it meanwhile.
            unsafe { self.vendor.stream_destroy(s) }
        });
        if result.is_err() {
            self.handles().streams.insert(s);
        }
        result
    }

    fn synchronize_stream(&self, stream: Stream) -> Result<()> {
        let _current = self.current()?;
        // SAFETY: by the contract of `Stream`, a live stream of this device or a special
        // handle; the driver answers an invalid-handle error for the bad ones it detects.
        unsafe { self.vendor.stream_synchronize(stream.0) }
    }

    fn synchronize_device(&self) -> Result<()> {
        let _current = self.current()?;
        self.vendor.device_synchronize()
    }

    fn create_event(&self) -> Result<Event> {
        let _current = self.current()?;
        let e = self.vendor.event_create()?;
        self.handles().events.insert(e, EventUse::default());
        Ok(Event(e))
    }

    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        // SAFETY: a live event of this device (checked; the use keeps it live) and, by the
        // contract of `Stream`, a live stream or a special handle.
        self.with_event(event, |e| unsafe { self.vendor.event_record(e, stream.0) })
    }

    fn event_complete(&self, event: Event) -> Result<bool> {
        // SAFETY: a live event of this device (checked; the use keeps it live).
        self.with_event(event, |e| unsafe { self.vendor.event_query(e) })
    }

    fn synchronize_event(&self, event: Event) -> Result<()> {
        // SAFETY: a live event of this device (checked; the use keeps it live).
        self.with_event(event, |e| unsafe { self.vendor.event_synchronize(e) })
    }

    fn capture_status(&self, stream: Stream) -> Result<CaptureStatus> {
        let _current = self.current()?;
        // SAFETY: by the contract of `Stream`, a live stream or a special handle; the driver
        // answers an invalid-handle error for the bad ones it detects.
        let info = unsafe { self.vendor.stream_capture_info(stream.0) }?;
        Ok(match info {
            None | Some((0, _)) => CaptureStatus::None,
            Some((1, id)) => CaptureStatus::Active { id },
            // 2, and any status a later driver adds: capturing, and nothing may be assumed.
            Some((_, id)) => CaptureStatus::Invalidated { id },
        })
    }

    fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode> {
        match self.vendor.exchange_capture_mode(mode.as_raw())? {
            None => Ok(mode),
            Some(previous) => CaptureMode::from_raw(previous).ok_or_else(|| Error::Driver {
                backend: V::BACKEND,
                call: "the thread's capture mode",
                code: i64::from(previous),
                name: format!("capture mode {previous}"),
                message: "the driver answered a capture mode it does not document (0, 1, 2)".into(),
            }),
        }
    }

    /// `cuStreamWaitEvent` / `hipStreamWaitEvent`: no CPU wait.
    fn wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        // SAFETY: a live event of this device (checked; the use keeps it live) and, by the
        // contract of `Stream`, a live stream or a special handle.
        self.with_event(event, |e| unsafe {
            self.vendor.stream_wait_event(stream.0, e)
        })
    }

    /// Destroys the event now, or, while another call uses it, when that call is done; it is
    /// unknown to every later call either way.
    fn destroy_event(&self, event: Event) -> Result<()> {
        if !self.handles().claim_event(V::BACKEND, event)? {
            return Ok(());
        }
        let result = self.current().and_then(|_current| {
            // SAFETY: a live event of this device that no call uses, out of the set.
            unsafe { self.vendor.event_destroy(event.0) }
        });
        if result.is_err() {
            self.handles().events.insert(event.0, EventUse::default());
        }
        result
    }

    /// For another device of this driver; false for anything else, and when the driver lacks
    /// the peer calls.
    fn can_access_peer(&self, peer: &dyn Device) -> Result<bool> {
        if !self.vendor.has_peer_calls() {
            return Ok(false);
        }
        match self.peer_ordinal(peer)? {
            Some(ordinal) => self.vendor.can_access_peer(ordinal),
            None => Ok(false),
        }
    }

    fn enable_peer_access(&self, peer: &dyn Device) -> Result<()> {
        let ordinal = match self.peer_ordinal(peer)? {
            Some(o) if self.can_access_peer(peer)? => o,
            _ => return Err(self.peer_access_refusal(peer)),
        };
        let mut peers = lock(&self.peers);
        if peers.iter().any(|&(o, _)| o == ordinal) {
            return Ok(());
        }
        let _current = self.current()?;
        let kept = self.vendor.enable_peer(ordinal)?;
        peers.push((ordinal, kept));
        peers.sort_unstable_by_key(|&(o, _)| o);
        Ok(())
    }

    /// Names the cause: a driver without the peer calls, or the driver's answer.
    fn peer_access_refusal(&self, peer: &dyn Device) -> Error {
        let target = peer.info();
        Error::Unsupported {
            what: "peer access".into(),
            backend: V::BACKEND,
            reason: format!(
                "device {} ({}) cannot access device {} of {}{}",
                self.info.ordinal,
                self.info.name,
                target.ordinal,
                target.vendor,
                if self.vendor.has_peer_calls() {
                    format!(" ({} says no)", V::PEER_CALLS[0])
                } else {
                    format!(": the driver does not export {}", V::PEER_CALLS.join(" / "))
                }
            ),
        }
    }

    fn peer_access(&self) -> Vec<u32> {
        lock(&self.peers).iter().map(|&(o, _)| o).collect()
    }
    /// Checks the device range against the books (inside one allocation of this device, or
    /// mapped by it with access granted) and the host pointer, then queues
    /// `cuMemcpyDtoHAsync_v2` / `hipMemcpyDtoHAsync` with the device current.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] for a range in no memory of this device;
    /// [`Error::InvalidArgument`] for one past its allocation or mappings, without access, or
    /// a null `dst`; [`Error::Driver`] when the driver refuses.
    ///
    /// # Safety
    /// As [`Device::copy_to_host`].
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, size: u64, stream: Stream) -> Result<()> {
        if size == 0 {
            return Ok(());
        }
        let n = super::host_range("copy_to_host", "dst", dst as usize, size)?;
        self.books()
            .check_copy(V::BACKEND, "copy_to_host", src, size)?;
        let _current = self.current()?;
        // SAFETY: the device range is memory of this device with access (checked against the
        // books); the caller guarantees `dst` for `n` bytes until the copy completes and,
        // by the contract of `Stream`, a live stream or a special handle.
        unsafe { self.vendor.copy_to_host(dst, src, n, stream.0) }
    }

    /// As [`GpuDevice::copy_to_host`](Device::copy_to_host), with `cuMemcpyHtoDAsync_v2` /
    /// `hipMemcpyHtoDAsync`.
    ///
    /// # Errors
    /// As `copy_to_host`, for a null `src`.
    ///
    /// # Safety
    /// As [`Device::copy_from_host`].
    unsafe fn copy_from_host(
        &self,
        dst: u64,
        src: *const u8,
        size: u64,
        stream: Stream,
    ) -> Result<()> {
        if size == 0 {
            return Ok(());
        }
        let n = super::host_range("copy_from_host", "src", src as usize, size)?;
        self.books()
            .check_copy(V::BACKEND, "copy_from_host", dst, size)?;
        let _current = self.current()?;
        // SAFETY: as in `copy_to_host`, with `src` valid for reads.
        unsafe { self.vendor.copy_from_host(dst, src, n, stream.0) }
    }

    /// `cuMemHostAlloc` / `hipHostMalloc` (flags 0) with the device current, counted in the
    /// census; `Ok(None)` when the driver does not export the pinned-host calls.
    ///
    /// # Errors
    /// [`Error::InvalidSize`] for zero or a size past `size_t`; [`Error::Driver`] when the
    /// driver refuses (its out-of-memory code included).
    fn alloc_pinned_host(&self, size: u64) -> Result<Option<NonNull<u8>>> {
        request_size(size, 1, Request::PinnedHost)?;
        let bytes = usize::try_from(size).map_err(|_| Error::InvalidSize {
            size,
            reason: "larger than this platform's size_t",
        })?;
        let _current = self.current()?;
        let Some(ptr) = self.vendor.host_alloc(bytes)? else {
            return Ok(None);
        };
        let Some(made) = NonNull::new(ptr as usize as *mut u8) else {
            return Err(Error::Driver {
                backend: V::BACKEND,
                call: "alloc_pinned_host",
                code: V::OUT_OF_MEMORY,
                name: "null pointer".into(),
                message: format!(
                    "the driver answered success with a null pointer for {size} bytes"
                ),
            });
        };
        self.books().pinned_host.insert(ptr, size);
        Ok(Some(made))
    }

    /// `cuMemFreeHost` / `hipHostFree` of memory from [`Device::alloc_pinned_host`].
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] for memory this device did not hand out (or freed already);
    /// [`Error::InvalidArgument`] for the wrong size; [`Error::Driver`] when the driver
    /// refuses (the memory is then still held).
    ///
    /// # Safety
    /// As [`Device::free_pinned_host`].
    unsafe fn free_pinned_host(&self, ptr: NonNull<u8>, size: u64) -> Result<()> {
        let addr = ptr.as_ptr() as usize as u64;
        self.books().claim_pinned_host(V::BACKEND, addr, size)?;
        self.give_back(
            (addr, size),
            // SAFETY: live pinned memory of this device (checked, out of the books); the
            // caller guarantees no copy uses it any more.
            || unsafe { self.vendor.host_free(addr) },
            |b, (addr, size)| {
                b.pinned_host.insert(addr, size);
            },
        )
    }

    /// Touches the pages from several threads, then `cuMemHostRegister_v2` /
    /// `hipHostRegister` (flags 0) with the device current, counted in the census;
    /// `Ok(false)` when the driver does not export the registration calls.
    ///
    /// # Errors
    /// [`Error::InvalidSize`] for zero or a size past `size_t`; [`Error::InvalidArgument`]
    /// for a range registered already (here); [`Error::Driver`] when the driver refuses.
    ///
    /// # Safety
    /// As [`Device::register_host`].
    unsafe fn register_host(&self, ptr: NonNull<u8>, size: u64) -> Result<bool> {
        request_size(size, 1, Request::PinnedHost)?;
        let bytes = usize::try_from(size).map_err(|_| Error::InvalidSize {
            size,
            reason: "larger than this platform's size_t",
        })?;
        let addr = ptr.as_ptr() as usize as u64;
        if !self.vendor.registers_host() {
            return Ok(false);
        }
        {
            let books = self.books();
            let overlaps = books
                .registered_host
                .iter()
                .any(|(&a, &n)| a < addr + size && addr < a + n);
            if overlaps {
                return Err(Error::InvalidArgument {
                    call: "register_host",
                    reason: format!(
                        "host memory {addr:#x}+{size} overlaps memory registered already; \
                         accepted is memory not registered"
                    ),
                });
            }
        }
        // SAFETY: the caller's memory, writable, its bytes no one's yet (the contract).
        unsafe { touch_pages(addr, size) };
        let _current = self.current()?;
        // SAFETY: the caller's live memory, until `unregister_host` (the contract).
        if !unsafe { self.vendor.host_register(addr, bytes) }? {
            return Ok(false);
        }
        self.books().registered_host.insert(addr, size);
        Ok(true)
    }

    /// `cuMemHostUnregister` / `hipHostUnregister` of memory from
    /// [`Device::register_host`].
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] for memory this device did not register (or unregistered
    /// already); [`Error::InvalidArgument`] for the wrong size; [`Error::Driver`] when the
    /// driver refuses (the memory then stays registered).
    ///
    /// # Safety
    /// As [`Device::unregister_host`].
    unsafe fn unregister_host(&self, ptr: NonNull<u8>, size: u64) -> Result<()> {
        let addr = ptr.as_ptr() as usize as u64;
        self.books().claim_registered_host(V::BACKEND, addr, size)?;
        self.give_back(
            (addr, size),
            // SAFETY: registered memory of this device (checked, out of the books); the
            // caller guarantees no copy uses it any more.
            || unsafe { self.vendor.host_unregister(addr) },
            |b, (addr, size)| {
                b.registered_host.insert(addr, size);
            },
        )
    }
}

/// Faults in every page of `[ptr, ptr + len)` by writing a zero to its first byte, from up
/// to 16 threads (one per 64 MiB): registering memory the kernel has not made present yet
/// would fault it in one page at a time, on one thread (rapidsai/cudf PR #23457: touched by
/// 16 threads then registered ≈ 0.10 s per GiB, against ≈ 0.49 s for `cudaHostAlloc`).
///
/// # Safety
/// `[ptr, ptr + len)` is writable host memory that holds zeros (or whose bytes no one
/// needs), used by nothing else meanwhile.
#[allow(unsafe_code)]
unsafe fn touch_pages(ptr: u64, len: u64) {
    const PAGE: u64 = 4096;
    const PER_THREAD: u64 = 64 << 20;
    let threads = len.div_ceil(PER_THREAD).clamp(1, 16);
    let touch = |lo: u64, hi: u64| {
        let mut p = lo;
        while p < hi {
            // SAFETY: within `[ptr, ptr + len)`, writable and unused by anyone else (the
            // caller's promise); the byte held a zero or nothing anyone needs.
            unsafe { std::ptr::write_volatile(p as usize as *mut u8, 0) };
            p += PAGE;
        }
    };
    if threads == 1 {
        touch(ptr, ptr + len);
        return;
    }
    // Each thread its own whole pages: no two write the same byte.
    let share = len.div_ceil(threads).div_ceil(PAGE) * PAGE;
    std::thread::scope(|scope| {
        for t in 0..threads {
            let lo = ptr + t * share;
            let hi = (lo + share).min(ptr + len);
            if lo < hi {
                scope.spawn(move || touch(lo, hi));
            }
        }
    });
}

impl<V: VendorApi> VirtualMemory for GpuDevice<V> {
    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn reserve(&self, size: u64, alignment: u64) -> Result<u64> {
        self.reserve_at(size, alignment, 0)
    }

    /// `cuMemAddressReserve` / `hipMemAddressReserve` with `addr` as the hint (0: none). The
    /// driver's answer is booked whatever address it is, unless it overlaps a reservation
    /// booked already (then it is freed again and refused).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size that is not a non-zero multiple of the
    /// granularity, an address that is not a multiple of it, or an alignment that is not 0 or
    /// a power of two; [`Error::Driver`] when the driver refuses, or answers a range that
    /// overlaps a live reservation of this device.
    fn reserve_at(&self, size: u64, alignment: u64, addr: u64) -> Result<u64> {
        self.granular("reserve", "size", size, false)?;
        self.granular("reserve_at", "address", addr, true)?;
        if alignment != 0 && !alignment.is_power_of_two() {
            return Err(Error::InvalidArgument {
                call: "reserve",
                reason: format!(
                    "alignment {alignment} is not accepted: 0 (the granularity) or a power of two"
                ),
            });
        }
        let _current = self.current()?;
        let va = self
            .vendor
            .reserve(size, alignment.max(self.granularity), addr)?;
        let Some((start, len)) = self.books().book_reservation(va, size) else {
            return Ok(va);
        };
        // SAFETY: the range the driver just answered, booked nowhere, so nothing of this
        // device maps into it or frees it meanwhile.
        if let Err(e) = unsafe { self.vendor.free_reservation(va, size) } {
            tracing::warn!(backend = V::BACKEND, va, size, error = %e,
                "could not free a reservation that overlaps a live one");
        }
        Err(Error::Driver {
            backend: V::BACKEND,
            call: "reserve",
            code: 0,
            name: "overlapping reservation".into(),
            message: format!(
                "the driver answered [{va:#x}, {:#x}) for a reservation of {size} bytes, which \
                 overlaps the live reservation [{start:#x}, {:#x}) of this device",
                va.saturating_add(size),
                start.saturating_add(len)
            ),
        })
    }

    fn holds_released_memory(&self) -> bool {
        self.holds_released_memory
    }

    fn map_visible_after(&self) -> std::time::Duration {
        self.map_visible_after
    }

    fn free_reservation(&self, va: u64, size: u64) -> Result<()> {
        self.books().claim_reservation(V::BACKEND, va, size)?;
        self.give_back(
            (va, size),
            // SAFETY: a whole live reservation of this device with nothing mapped (checked),
            // out of the books, so no other call maps into it or frees it meanwhile.
            || unsafe { self.vendor.free_reservation(va, size) },
            |b, (va, size)| {
                b.reservations.insert(va, size);
            },
        )
    }

    fn create_physical(&self, size: u64) -> Result<PhysicalHandle> {
        self.granular("create_physical", "size", size, false)?;
        let _current = self.current()?;
        // Every handle asks to be exportable as a POSIX descriptor where the driver took the
        // request when the device was opened (`probe::probe_exportable`; PyTorch's
        // expandable segments ask too), so that any allocation can be handed to another
        // process later.
        let ask = self.exportable != EXPORTABLE_NO;
        let made = self.vendor.create_physical(size, ask);
        let handle = made.map_err(|e| {
            self.descriptor_refusal(&e, size)
                .unwrap_or_else(|| self.oom(e, size))
        })?;
        self.books().handles.insert(handle);
        Ok(PhysicalHandle(handle))
    }

    /// The process's descriptors left for handles, where the driver spends one per handle
    /// (probed at open): the soft `RLIMIT_NOFILE` less the descriptors open now.
    fn handle_budget(&self) -> Option<u64> {
        if !self.descriptor_per_handle {
            return None;
        }
        descriptors::headroom()
    }

    /// The memory goes once its last mapping does.
    fn release_physical(&self, handle: PhysicalHandle) -> Result<()> {
        self.books().claim_handle(V::BACKEND, handle.0)?;
        self.give_back(
            handle.0,
            // SAFETY: a live handle of this device (checked), out of the books.
            || unsafe { self.vendor.release_physical(handle.0) },
            |b, h| {
                b.handles.insert(h);
            },
        )
    }

    fn map(&self, va: u64, size: u64, handle: PhysicalHandle, offset: u64) -> Result<()> {
        self.granular("map", "address", va, false)?;
        self.granular("map", "size", size, false)?;
        self.granular("map", "offset", offset, true)?;
        self.books().claim_mapping(V::BACKEND, va, size, handle.0)?;
        self.give_back(
            va,
            // SAFETY: a live handle and a free range inside a live reservation (checked, and
            // booked so no other map takes it); the driver checks the handle's size.
            || unsafe { self.vendor.map(va, size, offset, handle.0) },
            |b, va| {
                b.mappings.remove(&va);
            },
        )
    }

    fn set_access(&self, va: u64, size: u64) -> Result<()> {
        self.set_access_with_peers(va, size, &[])
    }

    fn set_access_with_peers(&self, va: u64, size: u64, peers: &[u32]) -> Result<()> {
        self.granular("set_access", "address", va, false)?;
        self.granular("set_access", "size", size, false)?;
        self.books().check_mapped(va, size)?;
        let kept: Vec<V::Peer> = {
            let enabled = lock(&self.peers);
            peers
                .iter()
                .map(|p| {
                    enabled
                        .iter()
                        .find(|(o, _)| o == p)
                        .map(|&(_, kept)| kept)
                        .ok_or_else(|| Error::InvalidArgument {
                            call: "set_access_with_peers",
                            reason: format!(
                                "peer access to device {p} is not enabled on device {}; \
                                 accepted are the devices enable_peer_access was called with \
                                 ({:?})",
                                self.info.ordinal,
                                enabled.iter().map(|&(o, _)| o).collect::<Vec<_>>()
                            ),
                        })
                })
                .collect::<Result<_>>()?
        };
        let _current = self.current()?;
        // SAFETY: the range is mapped by this device (checked).
        unsafe { self.vendor.set_access(va, size, &kept) }?;
        self.books().access.insert(va, va + size);
        Ok(())
    }

    fn unmap(&self, va: u64, size: u64) -> Result<()> {
        self.granular("unmap", "address", va, false)?;
        self.granular("unmap", "size", size, false)?;
        let claimed = self.books().claim_unmap(va, size)?;
        self.give_back(
            claimed,
            // SAFETY: the range is exactly this device's live mappings (checked), out of the
            // books.
            || unsafe { self.vendor.unmap(va, size) },
            Books::restore_mappings,
        )
    }
}

impl<V: VendorApi> StreamOrderedPool for GpuDevice<V> {
    fn alloc_async(&self, size: u64, stream: Stream) -> Result<u64> {
        request_size(size, 1, Request::PoolAllocation)?;
        let pool = self.pool()?;
        let _current = self.current()?;
        // SAFETY: the pool lives as long as `self`; by the contract of `Stream`, the stream is
        // a live stream of this device or a special handle.
        let ptr = unsafe { self.vendor.pool_alloc(pool, size, stream.0) }
            .map_err(|e| self.oom(e, size))?;
        self.books().pool_allocations.insert(ptr, size);
        Ok(ptr)
    }

    /// # Errors
    /// [`Error::UnknownPointer`] for a pointer not from [`StreamOrderedPool::alloc_async`]
    /// (checked without making the pool); [`Error::Driver`] when the driver refuses (the
    /// allocation is then still held).
    fn free_async(&self, ptr: u64, stream: Stream) -> Result<()> {
        self.has_pool()?;
        let size = self
            .books()
            .pool_allocations
            .remove(&ptr)
            .ok_or_else(|| unknown(V::BACKEND, "pool allocation", ptr))?;
        self.give_back(
            (ptr, size),
            // SAFETY: a live pool allocation (checked, out of the books) and, by the contract
            // of `Stream`, a live stream or a special handle.
            || unsafe { self.vendor.pool_free(ptr, stream.0) },
            |b, (ptr, size)| {
                b.pool_allocations.insert(ptr, size);
            },
        )
    }

    fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        let pool = self.pool()?;
        let _current = self.current()?;
        // SAFETY: the pool lives as long as `self`.
        unsafe { self.vendor.pool_set_release_threshold(pool, bytes) }
    }

    fn release_threshold(&self) -> Result<u64> {
        let pool = self.pool()?;
        let _current = self.current()?;
        // SAFETY: the pool lives as long as `self`.
        unsafe {
            self.vendor
                .pool_attribute(pool, PoolAttribute::ReleaseThreshold)
        }
    }

    fn trim_to(&self, keep: u64) -> Result<()> {
        let pool = self.pool()?;
        let _current = self.current()?;
        // SAFETY: the pool lives as long as `self`.
        unsafe { self.vendor.pool_trim(pool, keep) }
    }

    fn usage(&self) -> Result<PoolUsage> {
        let pool = self.pool()?;
        let _current = self.current()?;
        // SAFETY: the pool lives as long as `self`.
        let get = |attribute| unsafe { self.vendor.pool_attribute(pool, attribute) };
        Ok(PoolUsage {
            reserved_current: get(PoolAttribute::ReservedCurrent)?,
            reserved_high: get(PoolAttribute::ReservedHigh)?,
            used_current: get(PoolAttribute::UsedCurrent)?,
            used_high: get(PoolAttribute::UsedHigh)?,
        })
    }
}

impl<V: VendorApi> Drop for GpuDevice<V> {
    /// Gives back what the device still holds, in an order the drivers accept: pool
    /// allocations (then a synchronisation, so the pool really has them back), allocations,
    /// mappings, physical handles (after their mappings), reservations (after what was mapped
    /// in them), pinned host memory, events, streams, the pool, the peers. The vendor's own
    /// state (CUDA's primary context) goes last, when the vendor value drops.
    fn drop(&mut self) {
        let census = self.census();
        let ordinal = self.info.ordinal;
        let vendor = &self.vendor;
        let warn = |what: &str, e: Error| {
            tracing::warn!(backend = V::BACKEND, device = ordinal, error = %e,
                "dropping a {} device: {what}", V::BACKEND);
        };
        // What the caller had current is made current again when `_current` goes, at the
        // end of this body: before the vendor's own state (CUDA's primary context) goes.
        let _current = match vendor.enter() {
            Ok(saved) => Some(Current { vendor, saved }),
            Err(e) => {
                warn("could not make it current", e);
                None
            }
        };
        let books = std::mem::take(self.books.get_mut().unwrap_or_else(PoisonError::into_inner));
        let handles = std::mem::take(
            self.handles
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let pool = self
            .pool
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let peers = std::mem::take(self.peers.get_mut().unwrap_or_else(PoisonError::into_inner));
        // SAFETY: every call below gives back a handle this device made and still holds, per
        // its books, used by no one else now that the device goes, and given back once.
        unsafe {
            if !books.pool_allocations.is_empty() {
                for &ptr in books.pool_allocations.keys() {
                    if let Err(e) = vendor.pool_free(ptr, Stream::DEFAULT.0) {
                        warn("could not free a pool allocation", e);
                    }
                }
                if let Err(e) = vendor.stream_synchronize(Stream::DEFAULT.0) {
                    warn("could not synchronise", e);
                }
            }
            for &ptr in books.allocations.keys() {
                if let Err(e) = vendor.free(ptr) {
                    warn("could not free an allocation", e);
                }
            }
            for (&va, &size) in &books.mappings {
                if let Err(e) = vendor.unmap(va, size) {
                    warn("could not unmap", e);
                }
            }
            for &handle in &books.handles {
                if let Err(e) = vendor.release_physical(handle) {
                    warn("could not release a physical handle", e);
                }
            }
            for (&va, &size) in &books.reservations {
                if let Err(e) = vendor.free_reservation(va, size) {
                    warn("could not free a reservation", e);
                }
            }
            for &ptr in books.pinned_host.keys() {
                if let Err(e) = vendor.host_free(ptr) {
                    warn("could not free pinned host memory", e);
                }
            }
            for &ptr in books.registered_host.keys() {
                if let Err(e) = vendor.host_unregister(ptr) {
                    warn("could not unregister host memory", e);
                }
            }
            for &e in handles.events.keys() {
                if let Err(err) = vendor.event_destroy(e) {
                    warn("could not destroy an event", err);
                }
            }
            // Streams the caller made and never destroyed are theirs: their handles may
            // still be in use (a `Stream` is a copy of one), so they stay live, with what they
            // need (CUDA's primary context) kept for them.
            if !handles.streams.is_empty() {
                vendor.outlive_streams();
                tracing::warn!(
                    backend = V::BACKEND,
                    device = ordinal,
                    streams = handles.streams.len(),
                    "dropping a {} device: streams made with create_stream were never \
                     destroyed; they stay live for the process",
                    V::BACKEND
                );
            }
            if let Some(pool) = pool {
                if let Err(e) = vendor.pool_close(pool) {
                    warn("could not give back its pool", e);
                }
            }
            for (_, kept) in peers {
                if let Err(e) = vendor.release_peer(kept) {
                    warn("could not release a peer", e);
                }
            }
        }
        if !census.is_empty() {
            tracing::warn!(
                backend = V::BACKEND,
                device = ordinal,
                name = %self.info.name,
                ?census,
                "device dropped while still holding these; returned them"
            );
        }
    }
}

impl<V: VendorApi> crate::device::Interprocess for GpuDevice<V> {
    fn exportable_physical(&self) -> bool {
        self.info.capabilities.virtual_memory && self.exportable != EXPORTABLE_NO
    }

    fn export_physical(&self, handle: PhysicalHandle) -> Result<std::os::fd::OwnedFd> {
        if !self.books().handles.contains(&handle.0) {
            return Err(books::unknown(V::BACKEND, "physical handle", handle.0));
        }
        if self.exportable == EXPORTABLE_NO {
            return Err(Error::Unsupported {
                what: "export of physical memory".into(),
                backend: V::BACKEND,
                reason: format!(
                    "the driver of device {} refused handles exportable as POSIX descriptors \
                     when they were made",
                    self.info.ordinal
                ),
            });
        }
        let _current = self.current()?;
        // SAFETY: a live handle of this device (checked just above; a release racing this call
        // is the caller's own misuse, and the driver answers it with an error).
        unsafe { self.vendor.export_physical(handle.0) }
    }

    fn import_physical(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        size: u64,
    ) -> Result<PhysicalHandle> {
        self.granular("import_physical", "size", size, false)?;
        let _current = self.current()?;
        let handle = self.vendor.import_physical(fd)?;
        self.books().handles.insert(handle);
        Ok(PhysicalHandle(handle))
    }

    fn ipc_handle(&self, base: u64) -> Result<crate::device::IpcMemHandle> {
        if !self.books().allocations.contains_key(&base) {
            return Err(books::unknown(V::BACKEND, "allocation", base));
        }
        let _current = self.current()?;
        // SAFETY: a live plain allocation of this device (checked).
        unsafe { self.vendor.ipc_get(base) }.map(crate::device::IpcMemHandle)
    }

    fn open_ipc_handle(&self, handle: &crate::device::IpcMemHandle, size: u64) -> Result<u64> {
        let _current = self.current()?;
        let ptr = self.vendor.ipc_open(&handle.0)?;
        let mut books = self.books();
        let entry = books.opened_ipc.entry(ptr).or_insert((size, 0));
        entry.1 += 1;
        Ok(ptr)
    }

    fn close_ipc_handle(&self, ptr: u64) -> Result<()> {
        {
            let mut books = self.books();
            let Some(entry) = books.opened_ipc.get_mut(&ptr) else {
                return Err(books::unknown(V::BACKEND, "opened IPC memory", ptr));
            };
            entry.1 -= 1;
            if entry.1 == 0 {
                books.opened_ipc.remove(&ptr);
            }
        }
        let _current = self.current()?;
        // SAFETY: opened here (checked); the driver counts opens of one handle as we do.
        unsafe { self.vendor.ipc_close(ptr) }
    }
}

/// A descriptor a driver call returned, owned from now on; a negative one is the call's
/// failure.
pub(crate) fn owned_descriptor(
    call: &'static str,
    fd: std::ffi::c_int,
) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if fd < 0 {
        return Err(Error::InvalidArgument {
            call,
            reason: format!("the driver answered success with descriptor {fd}"),
        });
    }
    // SAFETY: the driver made this descriptor for the caller, who owns and closes it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}
