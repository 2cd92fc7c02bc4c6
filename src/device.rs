//! The `Device` trait: what a vendor shim (or the host backend) offers to the strategies.
//!
//! Addresses are plain `u64` device addresses: the algorithms never dereference them, and
//! GPU memory could not hold allocator metadata anyway.

use std::fmt;

use serde::Serialize;

use crate::error::Result;

/// Which kind of backend a device belongs to.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// Ordinary host memory with GPU-like virtual memory; always compiled.
    Host,
    /// NVIDIA, through libcuda's driver API.
    Cuda,
    /// AMD, through libamdhip64.
    Hip,
}

impl Vendor {
    /// The backend's short name, as `PORTALLOC_BACKEND` accepts it.
    pub fn name(self) -> &'static str {
        match self {
            Vendor::Host => "host",
            Vendor::Cuda => "cuda",
            Vendor::Hip => "hip",
        }
    }
}

display_as_name!(Vendor);

/// What optional features a device has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// Reserve address space and map physical chunks into it ([`VirtualMemory`]).
    pub virtual_memory: bool,
    /// Stream-ordered memory pools ([`StreamOrderedPool`]).
    pub stream_ordered_pool: bool,
}

/// Static facts about a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// Which backend.
    pub vendor: Vendor,
    /// Device ordinal within its backend.
    pub ordinal: u32,
    /// Marketing or descriptive name.
    pub name: String,
    /// Architecture, such as `sm_90` or `gfx942`; `host` for the host backend.
    pub arch: String,
    /// Total device memory in bytes.
    pub total_bytes: u64,
    /// Minimum physical allocation granularity for virtual memory, in bytes.
    pub min_granularity: u64,
    /// Recommended physical allocation granularity, in bytes.
    pub recommended_granularity: u64,
    /// Optional features.
    pub capabilities: Capabilities,
    /// Backend-specific facts worth showing (`simulated`, driver versions, tuning choices).
    pub notes: Vec<(String, String)>,
}

pub use crate::stats::MemInfo;

/// A stream (a queue of device work): the vendor's own handle as a number.
///
/// Streams belong to the caller. A `Stream` is whatever handle the caller's library made —
/// PyTorch's `cudaStream_t`, cudarc's `CUstream`, a `hipStream_t`, the C ABI's `uint64_t` —
/// or one of the special handles below, which CUDA and HIP define with the same values.
/// Every [`Device`] accepts any of them; nothing needs registering (see the stream-ordering
/// contract on [`Device`]). The handle reaches the driver, which dereferences it, so making
/// a `Stream` from a raw handle is `unsafe` ([`Stream::from_raw`]): it must name a live
/// stream of the device's context, as in the driver API.
///
/// ```
/// use portalloc::Stream;
/// // A raw handle from another library (here a cudaStream_t the caller made; on the host
/// // device, which dereferences nothing, any value is a stream).
/// // SAFETY: the host device's streams are numbers it never dereferences.
/// let theirs = unsafe { Stream::from_raw(0x5555_0000_1000) };
/// assert_eq!(theirs.as_raw(), 0x5555_0000_1000);
/// assert!(Stream::PER_THREAD.is_per_thread() && !theirs.is_per_thread());
/// ```
///
/// Safe code cannot make one from a number: the constructor is `unsafe`, and the field is
/// private.
///
/// ```compile_fail
/// let made_up = portalloc::Stream::from_raw(0x5555_0000_1000); // needs `unsafe`
/// ```
///
/// ```compile_fail
/// let made_up = portalloc::Stream(0x5555_0000_1000); // the field is private
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize)]
pub struct Stream(pub(crate) u64);

impl Stream {
    /// The default (null) stream: the legacy default stream, which synchronises with every
    /// blocking stream of the context.
    pub const DEFAULT: Stream = Stream(0);
    /// The legacy default stream named explicitly (`CU_STREAM_LEGACY`, `hipStreamLegacy`:
    /// both `0x1`).
    pub const LEGACY: Stream = Stream(1);
    /// The calling thread's default stream (`CU_STREAM_PER_THREAD`, `hipStreamPerThread`:
    /// both `0x2`). The same handle names a different stream on each thread, so an allocator
    /// never treats two requests on it as ordered with each other.
    pub const PER_THREAD: Stream = Stream(2);

    /// A stream from a raw handle (`cudaStream_t` / `CUstream` / `hipStream_t` as an integer).
    ///
    /// # Safety
    /// `handle` is 0, one of the special handles ([`Stream::LEGACY`], [`Stream::PER_THREAD`])
    /// or a stream that is live in the context of every device it is used with, for as long
    /// as it is used — and, as with RMM, not destroyed before the work queued on it before
    /// a free of memory from portalloc has completed (see the stream-ordering contract on
    /// [`Device`]). The CUDA and HIP drivers dereference the handle; a dangling or made-up
    /// one is undefined behaviour there. (The host device only compares handles: any value
    /// is sound with it.)
    // The declaration states the contract; nothing unsafe is done here.
    #[allow(unsafe_code)]
    pub const unsafe fn from_raw(handle: u64) -> Stream {
        Stream(handle)
    }

    /// The raw handle, to pass to the vendor's API.
    pub const fn as_raw(self) -> u64 {
        self.0
    }

    /// True for [`Stream::PER_THREAD`], whose meaning depends on the calling thread.
    pub const fn is_per_thread(self) -> bool {
        self.0 == Stream::PER_THREAD.0
    }
}

/// A number for the calling thread, unique in the process and never 0 (0 while the thread is
/// being torn down): what tells one thread's [`Stream::PER_THREAD`] from another's.
pub fn thread_number() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.try_with(|n| *n).unwrap_or(0)
}

/// An event recorded on a stream; complete once the work before it on that stream is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Event(pub u64);

/// Whether a stream is being captured into a graph (`cuStreamGetCaptureInfo` /
/// `hipStreamGetCaptureInfo`). While it is, the work queued on it runs nothing: it becomes
/// nodes of a graph that is replayed later, at the same addresses (see
/// [`crate::GraphPools`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[non_exhaustive]
pub enum CaptureStatus {
    /// Not capturing (or a device that cannot capture).
    None,
    /// Capturing; `id` names the capture, unique in the process.
    Active {
        /// The capture's id (`cuStreamGetCaptureInfo`'s).
        id: u64,
    },
    /// Capturing, but an error invalidated the capture: ending it gives no graph.
    Invalidated {
        /// The capture's id.
        id: u64,
    },
}

impl CaptureStatus {
    /// The capture's id while the stream is capturing (active or invalidated).
    pub const fn capture_id(self) -> Option<u64> {
        match self {
            CaptureStatus::None => None,
            CaptureStatus::Active { id } | CaptureStatus::Invalidated { id } => Some(id),
        }
    }
}

/// A thread's stream-capture interaction mode (`CUstreamCaptureMode` /
/// `hipStreamCaptureMode`): which calls a capture under way forbids the thread. Every thread
/// starts in [`CaptureMode::Global`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum CaptureMode {
    /// Forbidden potentially unsafe calls (plain allocation and free, …) while it captures
    /// in another mode than relaxed, or while another thread captures in the global mode.
    Global,
    /// Forbidden them only while it captures in another mode than relaxed.
    ThreadLocal,
    /// Never forbidden them (PyTorch wraps `cudaMalloc` during capture in this mode).
    Relaxed,
}

impl CaptureMode {
    /// The vendors' number (both use 0, 1, 2).
    pub const fn as_raw(self) -> u32 {
        match self {
            CaptureMode::Global => 0,
            CaptureMode::ThreadLocal => 1,
            CaptureMode::Relaxed => 2,
        }
    }

    /// The mode of a vendor's number; `None` for another.
    pub const fn from_raw(raw: u32) -> Option<CaptureMode> {
        match raw {
            0 => Some(CaptureMode::Global),
            1 => Some(CaptureMode::ThreadLocal),
            2 => Some(CaptureMode::Relaxed),
            _ => None,
        }
    }
}

/// A legacy IPC handle of a plain allocation (`CUipcMemHandle` / `hipIpcMemHandle_t`): 64
/// bytes the driver gives the exporting process and another process opens
/// ([`Interprocess::open_ipc_handle`]). Opaque: only the driver that made it reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcMemHandle(pub [u8; 64]);

/// A handle to physical memory created for virtual-memory mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PhysicalHandle(pub u64);

/// A device: plain allocation, streams and events, and optional capabilities.
///
/// Implementations are `Send + Sync` and safe to call from any thread. Every call returns an
/// error value, never panics; a pointer the device did not hand out is refused with
/// [`crate::Error::UnknownPointer`] where the backend can tell.
///
/// # The stream-ordering contract
///
/// This is the one place it is written; every strategy and adaptor follows it.
///
/// * An allocation made on stream `S` may be used by work enqueued on `S` at once. Memory is
///   handed out only when no work still in flight on any stream can touch it.
/// * Freeing an allocation on stream `S` means: *the memory may be reused by any work enqueued
///   on `S` after the free*, without waiting. The caller promises that work on other streams
///   that used the memory has been ordered before the free (by events or synchronisation).
/// * Memory freed on `S` is handed to a request on another stream `T` only after an event
///   recorded on `S` at the free has completed (or `S`, or the whole device, was
///   synchronised); until then it is reserved for `S`.
/// * Memory pending on stream `S` may also go to a request on `T` *without a CPU wait*: after
///   [`Device::wait_event`] enqueued on `T` a wait for an event recorded on `S` at the free
///   (`cuStreamWaitEvent` / `hipStreamWaitEvent`, as RMM's stream-ordered pools do). The
///   order a request on `T` is served in is RMM's: `T`'s own free memory; memory pending on
///   another stream, behind such a GPU-side wait; growth within the limit; and a CPU wait
///   only when nothing else can serve, just before refusing — never with an allocator's
///   lock held.
/// * [`Stream::PER_THREAD`] names another stream on each thread: memory freed on it is never
///   reused at once, not even by a request on the same handle (only behind a GPU-side wait).
///   An allocation made on it on one thread and freed on another (a buffer dropped on
///   another thread) is freed after synchronising the device, since no event on the
///   allocating thread's stream can be recorded from the freeing thread.
/// * Memory is unmapped or returned to the device (stitching, trim, an allocator's drop) only
///   once the work on it is known complete: an event recorded after the free has completed,
///   or the stream (or device) was synchronised.
/// * **The caller destroys a stream only after the work queued on it before a free has
///   completed** (as with RMM): the handle value of a destroyed stream may name the next
///   stream the driver makes, which then reuses that memory at once.
/// * Plain [`Device::alloc`] / [`Device::free`] are synchronous, like `cuMemAlloc` /
///   `cuMemFree`: `free` requires all work using the memory to be complete, so a strategy
///   that returns memory to the device synchronises the freeing stream first.
///
/// # Streams belong to the caller
///
/// Every stream method and every stream-ordered pool call accepts **any** stream handle the
/// caller passes — one from [`Device::create_stream`], one its own library made with the
/// driver's own call (`cuStreamCreate`, `cudaStreamCreate`, `hipStreamCreate`, PyTorch's and
/// cudarc's streams), or one of [`Stream::DEFAULT`], [`Stream::LEGACY`],
/// [`Stream::PER_THREAD`]. There is nothing to register or adopt: a device validates only the
/// objects it made itself (events, pools, physical handles, allocations) and the streams it is
/// asked to destroy, and passes every other stream straight to the driver, whose error (for a
/// handle that is not a live stream) comes back as [`crate::Error::Driver`].
///
/// A refusal is never read as "nothing is running there". When a strategy cannot record an
/// event on `S` it synchronises `S`; when it cannot synchronise `S` (the caller destroyed it,
/// say) it synchronises the device ([`Device::synchronize_device`]); when even that fails, the
/// memory stays reserved for `S` until a later event on `S` completes or a later
/// synchronisation succeeds.
pub trait Device: Send + Sync + fmt::Debug {
    /// Static facts about the device.
    fn info(&self) -> &DeviceInfo;

    /// Free and total memory now.
    fn mem_info(&self) -> Result<MemInfo>;

    /// Allocates `size` bytes of device memory (synchronously, like `cuMemAlloc`). The
    /// result is aligned to at least 256 bytes.
    ///
    /// # Errors
    /// [`crate::Error::DeviceOutOfMemory`] when the device refuses for lack of memory;
    /// [`crate::Error::InvalidSize`] for a zero size.
    fn alloc(&self, size: u64) -> Result<u64>;

    /// Returns memory from [`Device::alloc`]. `size` is the size it was allocated with.
    ///
    /// # Errors
    /// [`crate::Error::UnknownPointer`] for a pointer this device did not hand out (or that
    /// was freed already), where the backend can tell.
    fn free(&self, ptr: u64, size: u64) -> Result<()>;

    /// The virtual-memory capability, when the device has it.
    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        None
    }

    /// The stream-ordered pool capability, when the device has it.
    fn stream_ordered_pool(&self) -> Option<&dyn StreamOrderedPool> {
        None
    }

    /// The capability to hand memory to other processes ([`Interprocess`]): shareable handles
    /// of physical memory and legacy IPC handles of plain allocations, where the device has
    /// them. Linux only. Default: none.
    fn interprocess(&self) -> Option<&dyn Interprocess> {
        None
    }

    /// Creates a stream. It stays live until [`Device::destroy_stream`] — also past the
    /// device's drop: a stream never destroyed is left to the process, since its handle may
    /// still be in use (a CUDA device keeps its primary context retained for it).
    fn create_stream(&self) -> Result<Stream>;

    /// Destroys a stream made by [`Device::create_stream`].
    ///
    /// # Safety
    /// `stream` is not used afterwards: no call of any device or allocator is passed it
    /// again — the driver may give its handle value to the next stream it makes, and a
    /// destroyed handle is a dangling pointer in the driver — and, as the stream-ordering
    /// contract says, the work queued on it before a free of memory from portalloc has
    /// completed. (On the host device, which only compares handles, any use is sound.)
    ///
    /// Safe code cannot end a stream that a copy of its handle still names:
    ///
    /// ```compile_fail
    /// use portalloc::{backends::host::HostDevice, Device};
    /// let device = HostDevice::builder().build().unwrap();
    /// let s = device.create_stream().unwrap();
    /// device.destroy_stream(s).unwrap(); // needs `unsafe`
    /// ```
    // The declaration states the contract; implementations check the handle is theirs.
    #[allow(unsafe_code)]
    unsafe fn destroy_stream(&self, stream: Stream) -> Result<()>;

    /// Blocks until all work on `stream` is complete. Any stream the caller passes (see
    /// *Streams belong to the caller*).
    fn synchronize_stream(&self, stream: Stream) -> Result<()>;

    /// Blocks until all work on every stream of the device is complete (`cuCtxSynchronize`,
    /// `hipDeviceSynchronize`): the fallback when a stream cannot be synchronised. Default:
    /// unsupported, for devices that cannot.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] by default; the backend's error when it fails.
    fn synchronize_device(&self) -> Result<()> {
        Err(unsupported_by(
            self,
            "synchronizing the whole device",
            format_args!("does not implement synchronize_device"),
        ))
    }

    /// Whether `stream` (any stream the caller passes) is being captured into a graph: one
    /// CPU-side driver call (`cuStreamGetCaptureInfo`, `hipStreamGetCaptureInfo`), no wait.
    /// Default: [`CaptureStatus::None`], for devices that cannot capture (the host device, a
    /// driver without the call).
    ///
    /// # Errors
    /// The backend's error: for the legacy stream while a blocking stream of its context is
    /// captured, the driver's `STREAM_CAPTURE_IMPLICIT`.
    fn capture_status(&self, stream: Stream) -> Result<CaptureStatus> {
        let _ = stream;
        Ok(CaptureStatus::None)
    }

    /// Sets the calling thread's capture interaction mode and returns the one it replaces
    /// (`cuThreadExchangeStreamCaptureMode`, `hipThreadExchangeStreamCaptureMode`); see
    /// [`with_capture_mode`] for a scoped change. Default, for devices that cannot capture:
    /// nothing changes, and the answer is `mode` itself.
    ///
    /// # Errors
    /// The backend's error.
    fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode> {
        Ok(mode)
    }

    /// Creates an event.
    fn create_event(&self) -> Result<Event>;

    /// Makes the work enqueued on `stream` (any stream the caller passes) from now on wait,
    /// on the device, for the work before `event`'s last record (`cuStreamWaitEvent` /
    /// `hipStreamWaitEvent`): no CPU wait. The wait captures the record as it is now; a later
    /// record of the event does not change it. An event never recorded is complete: nothing
    /// to wait for. Default: unsupported (a strategy then waits on the CPU instead).
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] by default; [`crate::Error::UnknownPointer`] for an event
    /// this device did not make; the backend's error when it fails.
    fn wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        let _ = (stream, event);
        Err(unsupported_by(
            self,
            "waiting for an event on the device",
            format_args!("does not implement wait_event"),
        ))
    }

    /// Records `event` (one this device made) on `stream` (any stream the caller passes): it
    /// completes when the work enqueued on `stream` before it does. Events on one stream
    /// complete in the order they were recorded.
    fn record_event(&self, event: Event, stream: Stream) -> Result<()>;

    /// True when the work before the event's last record has completed.
    fn event_complete(&self, event: Event) -> Result<bool>;

    /// Blocks until the event completes.
    fn synchronize_event(&self, event: Event) -> Result<()>;

    /// Destroys an event.
    fn destroy_event(&self, event: Event) -> Result<()>;

    /// True when work on this device can access memory of `peer` directly (peer access, as
    /// `cuDeviceCanAccessPeer` / `hipDeviceCanAccessPeer` report it). A device is never its
    /// own peer; devices of another backend never are. Default: false.
    ///
    /// # Errors
    /// The backend's error when it cannot tell.
    fn can_access_peer(&self, peer: &dyn Device) -> Result<bool> {
        let _ = peer;
        Ok(false)
    }

    /// Lets work on this device access the memory of `peer` (`cuCtxEnablePeerAccess`,
    /// `hipDeviceEnablePeerAccess`: one direction only) and records it in
    /// [`Device::peer_access`]. Enabling it again is not an error. Default: unsupported.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] when the device cannot access `peer`; the backend's
    /// error when enabling fails.
    fn enable_peer_access(&self, peer: &dyn Device) -> Result<()> {
        Err(self.peer_access_refusal(peer))
    }

    /// Why work on this device cannot access the memory of `peer`, for a pair
    /// [`Device::can_access_peer`] answers false for: the [`crate::Error::Unsupported`] that
    /// [`Device::enable_peer_access`] refuses it with, and what reports show per pair (a
    /// driver that lacks the peer calls, say, rather than one that says no). Calls nothing
    /// on the device. Default: the device offers no peer access.
    fn peer_access_refusal(&self, peer: &dyn Device) -> crate::Error {
        peer_access_unsupported(self, peer)
    }

    /// The ordinals of the devices (of the same backend) this device has enabled peer access
    /// to with [`Device::enable_peer_access`], ascending. Default: none.
    fn peer_access(&self) -> Vec<u32> {
        Vec::new()
    }

    /// Queues a copy of `size` bytes from device address `src` to host memory at `dst` on
    /// `stream`, after the work already queued there (`cuMemcpyDtoHAsync_v2` /
    /// `hipMemcpyDtoHAsync`). Returns once queued; the bytes are at `dst` once the stream's
    /// work up to the copy has completed ([`Device::synchronize_stream`], or an event recorded
    /// on `stream` after it). Any stream the caller passes (see *Streams belong to the
    /// caller*). A zero `size` is success and queues nothing. `dst` may be ordinary host
    /// memory or memory from [`Device::alloc_pinned_host`] (which copies reach at full
    /// bandwidth). Default: unsupported.
    ///
    /// # Safety
    /// * `dst` is valid for writes of `size` bytes, and nothing else reads or writes them,
    ///   until the copy completes;
    /// * `[src, src + size)` lies in memory of this device that stays usable until the copy
    ///   completes: a range mapped with access granted ([`VirtualMemory::set_access`]), a
    ///   plain allocation ([`Device::alloc`]) or a pool allocation (devices check what they
    ///   can, see *Errors*);
    /// * `stream` is one of the special handles or a live stream of this device's context, as
    ///   [`Stream::from_raw`] says.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] by default; [`crate::Error::UnknownPointer`] for a device
    /// range in no memory this device handed out, [`crate::Error::InvalidArgument`] for one
    /// that runs past it, is not mapped or has no access, or for a null `dst` — where the
    /// backend can tell; the backend's error when the driver refuses.
    // The declaration states the contract; implementations check what they can.
    #[allow(unsafe_code)]
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, size: u64, stream: Stream) -> Result<()> {
        let _ = (dst, src, size, stream);
        Err(unsupported_by(
            self,
            "copies from device to host memory",
            format_args!("does not implement copy_to_host"),
        ))
    }

    /// The reverse of [`Device::copy_to_host`]: queues a copy of `size` bytes from host memory
    /// at `src` to device address `dst` on `stream`, after the work already queued there
    /// (`cuMemcpyHtoDAsync_v2` / `hipMemcpyHtoDAsync`). Returns once queued; the bytes are at
    /// `dst` for the work queued on `stream` after it, and for everyone once the stream's work
    /// up to the copy has completed. A zero `size` is success and queues nothing. Default:
    /// unsupported.
    ///
    /// # Safety
    /// * `src` is valid for reads of `size` bytes, and nothing writes them, until the copy
    ///   completes;
    /// * `[dst, dst + size)` lies in memory of this device, as for `src` of
    ///   [`Device::copy_to_host`];
    /// * `stream` as for [`Device::copy_to_host`].
    ///
    /// # Errors
    /// As [`Device::copy_to_host`] (a null `src`).
    // The declaration states the contract; implementations check what they can.
    #[allow(unsafe_code)]
    unsafe fn copy_from_host(
        &self,
        dst: u64,
        src: *const u8,
        size: u64,
        stream: Stream,
    ) -> Result<()> {
        let _ = (dst, src, size, stream);
        Err(unsupported_by(
            self,
            "copies from host to device memory",
            format_args!("does not implement copy_from_host"),
        ))
    }

    /// `size` bytes of page-locked host memory (`cuMemHostAlloc` / `hipHostMalloc`), which the
    /// copies of [`Device::copy_to_host`] and [`Device::copy_from_host`] reach at full
    /// bandwidth; readable and writable by the caller, page-aligned, not zeroed. `Ok(None)`
    /// where the device offers none: the caller then uses ordinary host memory, which copies
    /// work with too. Counted in the device's census until [`Device::free_pinned_host`].
    /// Default: unsupported.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] by default; [`crate::Error::InvalidSize`] for zero; the
    /// backend's error when the memory cannot be had ([`crate::Error::Driver`] with the
    /// vendor's out-of-memory code, [`crate::Error::Os`]).
    fn alloc_pinned_host(&self, size: u64) -> Result<Option<std::ptr::NonNull<u8>>> {
        let _ = size;
        Err(unsupported_by(
            self,
            "pinned host memory",
            format_args!("does not implement alloc_pinned_host"),
        ))
    }

    /// Frees memory from [`Device::alloc_pinned_host`] (`cuMemFreeHost` / `hipHostFree`);
    /// `size` is the size it was allocated with. Default: unsupported.
    ///
    /// # Safety
    /// `ptr` came from this device's [`Device::alloc_pinned_host`] with `size`, no copy using
    /// it is still in flight (its stream was synchronised, or an event recorded after it
    /// completed), and it is not used again.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] by default; [`crate::Error::UnknownPointer`] for memory
    /// this device did not hand out (or freed already); [`crate::Error::InvalidArgument`] for
    /// a `size` that is not the allocation's; the backend's error when it refuses (the memory
    /// is then still held).
    // The declaration states the contract; implementations check the pointer is theirs.
    #[allow(unsafe_code)]
    unsafe fn free_pinned_host(&self, ptr: std::ptr::NonNull<u8>, size: u64) -> Result<()> {
        let _ = (ptr, size);
        Err(unsupported_by(
            self,
            "pinned host memory",
            format_args!("does not implement free_pinned_host"),
        ))
    }

    /// Page-locks `size` bytes of host memory the caller allocated, at `ptr`, so that the
    /// copies of [`Device::copy_to_host`] and [`Device::copy_from_host`] reach it at full
    /// bandwidth (`cuMemHostRegister_v2` / `hipHostRegister`, flags 0), its pages first
    /// touched from several threads: about 0.10 s per GiB against
    /// [`Device::alloc_pinned_host`]'s 0.49 (rapidsai/cudf PR #23457). `Ok(true)` once
    /// registered, counted in the device's census until [`Device::unregister_host`];
    /// `Ok(false)` where the device offers no registration (nothing registered — the pages
    /// may have been touched, zeroed, first: the caller pins another way or keeps ordinary
    /// memory). Default: `Ok(false)`.
    ///
    /// # Safety
    /// `[ptr, ptr + size)` is host memory the caller owns, writable, whose bytes it does not
    /// need (the touch writes zeros), live until [`Device::unregister_host`], and registered
    /// with no device already.
    ///
    /// # Errors
    /// [`crate::Error::InvalidSize`] for zero where the device registers (the default answers
    /// `Ok(false)` to anything); [`crate::Error::InvalidArgument`] for memory registered
    /// already; the backend's error when the driver refuses (nothing is registered then).
    // The declaration states the contract; implementations check what they can.
    #[allow(unsafe_code)]
    unsafe fn register_host(&self, ptr: std::ptr::NonNull<u8>, size: u64) -> Result<bool> {
        let _ = (ptr, size);
        Ok(false)
    }

    /// Undoes [`Device::register_host`] (`cuMemHostUnregister` / `hipHostUnregister`); `size`
    /// is the size registered. The memory stays the caller's. Default: unsupported.
    ///
    /// # Safety
    /// `ptr` was registered with this device's [`Device::register_host`] with `size`, and no
    /// copy using it is still in flight.
    ///
    /// # Errors
    /// [`crate::Error::Unsupported`] by default; [`crate::Error::UnknownPointer`] for memory
    /// this device did not register (or unregistered already);
    /// [`crate::Error::InvalidArgument`] for a `size` that is not the one registered; the
    /// backend's error when it refuses (the memory then stays registered).
    // The declaration states the contract; implementations check the pointer is theirs.
    #[allow(unsafe_code)]
    unsafe fn unregister_host(&self, ptr: std::ptr::NonNull<u8>, size: u64) -> Result<()> {
        let _ = (ptr, size);
        Err(unsupported_by(
            self,
            "host memory registration",
            format_args!("does not implement unregister_host"),
        ))
    }
}

/// [`crate::Error::Unsupported`] for `what` on `device`; the reason names the device and
/// says what it `lacks`.
/// Runs `f` with the calling thread's capture interaction mode set to `mode` on `device`,
/// then sets back the mode it had (also when `f` panics): how a strategy makes a potentially
/// unsafe call (a plain allocation, say) while a stream is captured, as PyTorch does around
/// `cudaMalloc` during capture.
///
/// # Errors
/// The device's error when the mode cannot be set; `f` does not run then.
pub fn with_capture_mode<T>(
    device: &(impl Device + ?Sized),
    mode: CaptureMode,
    f: impl FnOnce() -> T,
) -> Result<T> {
    struct Restore<'a, D: Device + ?Sized> {
        device: &'a D,
        mode: CaptureMode,
    }
    impl<D: Device + ?Sized> Drop for Restore<'_, D> {
        fn drop(&mut self) {
            // Setting back a mode that was set a moment ago: nothing to report if the driver
            // refuses now, and a panic here would abort an unwinding thread.
            let _ = self.device.exchange_capture_mode(self.mode);
        }
    }
    let previous = device.exchange_capture_mode(mode)?;
    let _restore = Restore {
        device,
        mode: previous,
    };
    Ok(f())
}

fn unsupported_by<D: Device + ?Sized>(
    device: &D,
    what: &str,
    lacks: fmt::Arguments<'_>,
) -> crate::Error {
    let info = device.info();
    crate::Error::Unsupported {
        what: what.into(),
        backend: info.vendor.name(),
        reason: format!("device {} ({}) {lacks}", info.ordinal, info.name),
    }
}

/// The refusal of [`Device::enable_peer_access`] by a device without peer access (the
/// trait's default, and a wrapper that hides it).
pub(crate) fn peer_access_unsupported<D: Device + ?Sized>(
    device: &D,
    peer: &dyn Device,
) -> crate::Error {
    let peer = peer.info();
    unsupported_by(
        device,
        "peer access",
        format_args!(
            "does not offer peer access (to device {} of {})",
            peer.ordinal, peer.vendor
        ),
    )
}

/// Virtual memory as the GPU drivers offer it (cuMemAddressReserve / cuMemCreate /
/// cuMemMap / cuMemSetAccess, and HIP's equivalents).
///
/// Sizes and addresses passed to `reserve`, `create_physical`, `map` and `unmap` must be
/// multiples of [`VirtualMemory::granularity`]; anything else is
/// [`crate::Error::InvalidArgument`]. A mapping grants no access until
/// [`VirtualMemory::set_access`] is called. Releasing a physical handle that is still mapped
/// is allowed; its memory goes back once the last mapping is gone.
pub trait VirtualMemory: Send + Sync {
    /// The minimum granularity for sizes and addresses, in bytes.
    fn granularity(&self) -> u64;

    /// Reserves `size` bytes of address space aligned to `alignment` (0 = granularity).
    fn reserve(&self, size: u64, alignment: u64) -> Result<u64>;

    /// Reserves `size` bytes of address space at `addr` when the driver gives that address
    /// (the `addr` hint of `cuMemAddressReserve` / `hipMemAddressReserve`); returns the address
    /// given, which may be another one: the caller checks, and frees a reservation it cannot
    /// use. The default ignores the hint.
    fn reserve_at(&self, size: u64, alignment: u64, addr: u64) -> Result<u64> {
        let _ = addr;
        self.reserve(size, alignment)
    }

    /// Frees a reservation made by [`VirtualMemory::reserve`]; nothing may be mapped in it.
    fn free_reservation(&self, va: u64, size: u64) -> Result<()>;

    /// True when the driver keeps a released handle's physical memory for as long as a
    /// reservation it was mapped into stays reserved: only freeing that reservation gives the
    /// memory back (ROCm 7.x on Linux, ROCm/legacy-rocm-build#6021). Found by probing the
    /// driver when the device is opened, never from a version number. Default false: the
    /// documented behaviour, where the memory goes back once the handle is released and
    /// unmapped.
    fn holds_released_memory(&self) -> bool {
        false
    }

    /// How long after a `map` returns the new mapping may still be invisible to GPU work
    /// queued afterwards (reads see zeros, writes are lost): on gfx12 (RDNA 4) the map
    /// returns before the page tables are updated, and no submission orders later work after
    /// it — only wall-clock time does, about 2 ms (ROCm/rocm-systems#11693, ROCm/clr#288).
    /// A strategy waits this long after mapping before it hands the memory out or copies
    /// into it. Default zero: the documented behaviour, where a mapping is visible once the
    /// call returns.
    fn map_visible_after(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// How many more physical handles the process can hold now, where the driver spends a
    /// file descriptor on each (ROCm 7.14's `hipMemCreate`, ROCm/rocm-systems#10604: about
    /// 1015 handles at the stock `ulimit -n 1024`): the process's soft `RLIMIT_NOFILE` less
    /// the descriptors it holds. A strategy sizes its handles so that their count stays well
    /// under it. Whether the driver does is probed when the device is opened, never read from
    /// a version number. `None` (the default) where handles cost no descriptor, or the
    /// limit is unlimited or cannot be read: handles are not limited by count.
    fn handle_budget(&self) -> Option<u64> {
        None
    }

    /// Creates `size` bytes of physical memory. Counts against the device's memory.
    fn create_physical(&self, size: u64) -> Result<PhysicalHandle>;

    /// Releases a physical handle.
    fn release_physical(&self, handle: PhysicalHandle) -> Result<()>;

    /// Maps `size` bytes of `handle`, starting `offset` bytes in, at `va` (inside a
    /// reservation, not mapped already).
    fn map(&self, va: u64, size: u64, handle: PhysicalHandle, offset: u64) -> Result<()>;

    /// Grants this device read-write access to the mapped range `[va, va + size)`.
    fn set_access(&self, va: u64, size: u64) -> Result<()>;

    /// As [`VirtualMemory::set_access`], and grants the same access to the devices of the
    /// same backend whose ordinals are `peers` (each one this device has enabled peer access
    /// with, [`Device::peer_access`]), in one call where the driver allows it
    /// (`cuMemSetAccess` with one descriptor per device). With no peers it is `set_access`;
    /// the default refuses peers.
    ///
    /// # Errors
    /// As `set_access`; [`crate::Error::Unsupported`] for peers when the device cannot grant
    /// them access; [`crate::Error::InvalidArgument`] for a peer without peer access enabled.
    fn set_access_with_peers(&self, va: u64, size: u64, peers: &[u32]) -> Result<()> {
        if peers.is_empty() {
            return self.set_access(va, size);
        }
        Err(crate::Error::Unsupported {
            what: "access for peer devices to mapped memory".into(),
            backend: "device",
            reason: format!(
                "this virtual-memory implementation cannot grant devices {peers:?} access"
            ),
        })
    }

    /// Unmaps `[va, va + size)`, which must be exactly covered by earlier mappings.
    fn unmap(&self, va: u64, size: u64) -> Result<()>;
}

/// Counters of a stream-ordered pool, as `cuMemPoolGetAttribute` reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PoolUsage {
    /// Bytes of backing memory the pool holds now.
    pub reserved_current: u64,
    /// High-water mark of `reserved_current`.
    pub reserved_high: u64,
    /// Bytes handed out and not yet freed.
    pub used_current: u64,
    /// High-water mark of `used_current`.
    pub used_high: u64,
}

/// A stream-ordered memory pool (cuMemAllocFromPoolAsync / hipMallocFromPoolAsync).
///
/// Follows the stream-ordering contract of [`Device`]. Memory the pool holds beyond the
/// release threshold is returned to the device at the next synchronisation.
pub trait StreamOrderedPool: Send + Sync {
    /// Allocates `size` bytes usable by work on `stream`.
    fn alloc_async(&self, size: u64, stream: Stream) -> Result<u64>;

    /// Frees `ptr` in stream order on `stream`.
    fn free_async(&self, ptr: u64, stream: Stream) -> Result<()>;

    /// Sets how many bytes the pool may keep when idle.
    fn set_release_threshold(&self, bytes: u64) -> Result<()>;

    /// The current release threshold.
    fn release_threshold(&self) -> Result<u64>;

    /// Releases backing memory until the pool holds at most `keep` bytes (unused ones).
    fn trim_to(&self, keep: u64) -> Result<()>;

    /// The pool's counters.
    fn usage(&self) -> Result<PoolUsage>;
}

/// Memory another process can map, as the drivers offer it: physical memory exported as a
/// POSIX file descriptor (`cuMemExportToShareableHandle` / `hipMemExportToShareableHandle`)
/// and imported by another process (`cuMemImportFromShareableHandle`), and plain allocations
/// through the legacy IPC handles (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle_v2`,
/// `cuIpcCloseMemHandle`, and HIP's). [`crate::share`] builds export and import of
/// allocations on it; strategies never call it.
///
/// The drivers' lifetime rules, which [`crate::share`] keeps: a shareable handle keeps its
/// physical memory alive while any process holds a handle to it or a mapping of it (the
/// exporter's release does not take it from an importer); a legacy IPC handle's memory
/// belongs to the exporter, whose free while another process has it open is undefined
/// behaviour, so the exporter must hold it until every importer closed it.
pub trait Interprocess: Send + Sync {
    /// True when physical handles made by [`VirtualMemory::create_physical`] can be exported:
    /// the driver accepted the request for a POSIX descriptor handle type when they were
    /// created (probed at the first creation, never read from a version).
    fn exportable_physical(&self) -> bool;

    /// A new descriptor for the physical memory of `handle`, which the caller owns; another
    /// process imports it with [`Interprocess::import_physical`].
    ///
    /// # Errors
    /// [`crate::Error::UnknownPointer`] for a handle this device did not make (or released);
    /// [`crate::Error::Unsupported`] when the driver cannot export it (made without the
    /// descriptor handle type, or no export call); the driver's error.
    fn export_physical(&self, handle: PhysicalHandle) -> Result<std::os::fd::OwnedFd>;

    /// A physical handle of this device for the memory behind `fd` (a descriptor another
    /// process exported), of `size` bytes as the exporter said: it maps as one made by
    /// [`VirtualMemory::create_physical`], and its memory lives until it is released and
    /// unmapped here, whatever the exporter does. The descriptor stays the caller's; the
    /// caller keeps it open until the imported memory is mapped and its access set (ROCm 7.14
    /// needs that, ROCm/rocm-systems PR #8440).
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] for a size that is not a non-zero multiple of the
    /// granularity; the driver's error for a descriptor it cannot import.
    fn import_physical(&self, fd: std::os::fd::BorrowedFd<'_>, size: u64)
        -> Result<PhysicalHandle>;

    /// The legacy IPC handle of the plain allocation starting at `base` (a pointer
    /// [`Device::alloc`] returned).
    ///
    /// # Errors
    /// [`crate::Error::UnknownPointer`] for a pointer that does not start an allocation of
    /// this device; the driver's error.
    fn ipc_handle(&self, base: u64) -> Result<IpcMemHandle>;

    /// Opens another process's legacy IPC handle of an allocation of `size` bytes (as the
    /// exporter said; copies are checked against it): the address where the allocation is
    /// mapped here, until [`Interprocess::close_ipc_handle`]. Opening one handle again gives
    /// the same address, counted: each open is closed once.
    ///
    /// # Errors
    /// The driver's error (a handle of this very process, of a freed allocation, of a process
    /// that exited).
    fn open_ipc_handle(&self, handle: &IpcMemHandle, size: u64) -> Result<u64>;

    /// Closes what [`Interprocess::open_ipc_handle`] opened at `ptr`.
    ///
    /// # Errors
    /// [`crate::Error::UnknownPointer`] for an address not opened here; the driver's error.
    fn close_ipc_handle(&self, ptr: u64) -> Result<()>;
}
