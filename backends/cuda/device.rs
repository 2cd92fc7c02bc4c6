//! [`CudaDevice`]: the [`Device`] trait over NVIDIA's driver API, one per device ordinal, on
//! the device's primary context.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use portalloc_sys::cuda as sys;

use super::Driver;
use crate::backends::vendor_books::{self, Books, Handles, VendorCensus};
use crate::device::{
    Capabilities, Device, DeviceInfo, Event, MemInfo, PhysicalHandle, PoolUsage, Stream,
    StreamOrderedPool, Vendor, VirtualMemory,
};
use crate::error::{Error, Result};
use crate::units::Bytes;

const BACKEND: &str = "cuda";

/// The granularity reported when the driver has no virtual-memory API to ask: 2 MiB, what
/// every NVIDIA GPU since Pascal answers.
const ASSUMED_GRANULARITY: u64 = 2 << 20;
/// The first driver with the virtual-memory API: CUDA 10.2.
const VMM_MIN_VERSION: i32 = 10_020;
/// The first driver with stream-ordered memory pools: CUDA 11.2.
const POOLS_MIN_VERSION: i32 = 11_020;

/// What a device holds now, from its own books: [`VendorCensus`].
pub type CudaCensus = VendorCensus;

/// One NVIDIA GPU behind the [`Device`] trait.
///
/// * **Context**: the device's primary context, retained at [`CudaDevice::open`] and released
///   when the device is dropped; every call first makes it current on the calling thread
///   (one `cuCtxGetCurrent`, plus `cuCtxSetCurrent` when another context was current), so the
///   device may be used from any thread and shares its context with other libraries that
///   use the primary context (the runtime API, cudarc, PyTorch).
/// * **Memory**: [`Device::alloc`] / [`Device::free`] are `cuMemAlloc_v2` / `cuMemFree_v2`.
/// * **Virtual memory** ([`VirtualMemory`]) when the driver is CUDA ≥ 10.2, exports the
///   calls, and the device sets `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
/// * **Stream-ordered pool** ([`StreamOrderedPool`]) when the driver is CUDA ≥ 11.2, exports
///   the calls, and the device sets `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED`: a pool of
///   its own made with `cuMemPoolCreate` (so that its release threshold and trimming do not
///   disturb other users of the device's default pool).
/// * **Streams and events**: any stream the caller passes is used as it is — PyTorch's,
///   cudarc's, one made with `cuStreamCreate` directly, [`Stream::DEFAULT`] / [`Stream::LEGACY`]
///   (the legacy default stream) or [`Stream::PER_THREAD`]; [`Device::create_stream`] makes
///   blocking streams (`cuStreamCreate`, so the legacy default stream orders with them), and
///   events are `cuEventCreate` (timing disabled). [`Device::synchronize_device`] is
///   `cuCtxSynchronize`.
///
/// Errors: every failed call is [`Error::Driver`] with the driver's own name
/// (`CUDA_ERROR_INVALID_VALUE`), out-of-memory is [`Error::DeviceOutOfMemory`], pointers,
/// handles and events the device did not hand out (and streams it is asked to destroy that it
/// did not create) are [`Error::UnknownPointer`]
/// (checked before the driver sees them), and sizes that are not multiples of the granularity
/// are [`Error::InvalidArgument`]. Dropping the device gives back whatever it still holds and
/// warns about it.
pub struct CudaDevice {
    driver: Arc<Driver>,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    info: DeviceInfo,
    granularity: u64,
    vmm: bool,
    pool: Option<sys::CUmemoryPool>,
    books: Mutex<Books>,
    handles: RwLock<Handles>,
    /// Peer access enabled: `(ordinal, CUdevice)` of each peer, whose primary context is
    /// retained until this device is dropped (so that the access lasts as long as it).
    peers: Mutex<Vec<(u32, sys::CUdevice)>>,
}

// SAFETY: the raw handles (the primary context and the pool) are driver objects that the CUDA
// driver API allows any thread to use, once the context is current on it, which every call
// makes sure of; all mutable state is behind the mutex and the lock.
unsafe impl Send for CudaDevice {}
// SAFETY: as above: the driver API is thread-safe and the books are locked.
unsafe impl Sync for CudaDevice {}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.info.ordinal)
            .field("name", &self.info.name)
            .field("arch", &self.info.arch)
            .field("library", &self.driver.path())
            .field("capabilities", &self.info.capabilities)
            .finish_non_exhaustive()
    }
}

/// Opens every device of the driver [`super::library_candidates`] names.
///
/// # Errors
/// As [`Driver::load`] and [`CudaDevice::open_all`].
pub fn open_all() -> Result<Vec<CudaDevice>> {
    CudaDevice::open_all(Arc::new(Driver::load_default()?))
}

impl CudaDevice {
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
        let name = driver.device_name(device)?;
        let major =
            driver.device_attribute(device, sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            driver.device_attribute(device, sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let total = driver.total_mem(device)?;
        let version = driver.version_code()?;
        let ctx = driver.primary_ctx_retain(device)?;
        // From here on, dropping `dev` releases the context (and whatever else it holds).
        let mut dev = CudaDevice {
            driver: Arc::clone(&driver),
            device,
            ctx,
            info: DeviceInfo {
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
            },
            granularity: ASSUMED_GRANULARITY,
            vmm: false,
            pool: None,
            books: Mutex::new(Books::default()),
            handles: RwLock::new(Handles::default()),
            peers: Mutex::new(Vec::new()),
        };
        dev.enter()?;

        let vmm_gate = gate(
            &driver,
            device,
            version,
            VMM_MIN_VERSION,
            driver.has_vmm_symbols(),
            sys::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            "virtual memory management",
        );
        let vmm_note = match vmm_gate {
            Ok(()) => {
                let granularities = driver
                    .allocation_granularity(device, sys::CU_MEM_ALLOC_GRANULARITY_MINIMUM)
                    .and_then(|min| {
                        driver
                            .allocation_granularity(
                                device,
                                sys::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
                            )
                            .map(|rec| (min, rec))
                    });
                match granularities {
                    Ok((min, rec)) if min.is_power_of_two() => {
                        dev.vmm = true;
                        dev.granularity = min;
                        dev.info.min_granularity = min;
                        dev.info.recommended_granularity = rec.max(min);
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
            &driver,
            device,
            version,
            POOLS_MIN_VERSION,
            driver.has_pool_symbols(),
            sys::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
            "memory pools",
        );
        let pool_note = match pool_gate {
            Ok(()) => match driver.mem_pool_create(device) {
                Ok(pool) => {
                    dev.pool = Some(pool);
                    "yes (a pool of its own, release threshold 0)".to_string()
                }
                Err(e) => format!("no: {e}"),
            },
            Err(why) => format!("no: {why}"),
        };
        dev.info.capabilities = Capabilities {
            virtual_memory: dev.vmm,
            stream_ordered_pool: dev.pool.is_some(),
        };
        dev.info.notes.push(("virtual memory".into(), vmm_note));
        dev.info
            .notes
            .push(("stream-ordered pool".into(), pool_note));
        if !dev.vmm {
            dev.info.notes.push((
                "granularity".into(),
                format!("{} (assumed)", Bytes(ASSUMED_GRANULARITY)),
            ));
        }
        Ok(dev)
    }

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
        &self.driver
    }

    /// The device's primary context (`CUcontext`), retained for as long as this device
    /// lives: the context cudarc, PyTorch and the runtime API use too.
    pub fn context(&self) -> sys::CUcontext {
        self.ctx
    }

    /// The driver's handle for the device (`CUdevice`).
    pub fn cu_device(&self) -> sys::CUdevice {
        self.device
    }

    /// The device's primary context, retained for as long as this value lives. For interop
    /// with other users of the driver API (they share it).
    pub fn cu_context(&self) -> sys::CUcontext {
        self.ctx
    }

    /// Makes the device's primary context current on the calling thread.
    ///
    /// # Errors
    /// [`Error::Driver`] from `cuCtxGetCurrent` / `cuCtxSetCurrent`.
    pub fn make_current(&self) -> Result<()> {
        self.enter()
    }

    /// What the device holds now, from its books.
    pub fn census(&self) -> CudaCensus {
        vendor_books::census(&self.handles, &self.books)
    }

    fn enter(&self) -> Result<()> {
        self.driver.make_current(self.ctx)
    }

    fn peers(&self) -> MutexGuard<'_, Vec<(u32, sys::CUdevice)>> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The driver's handle of `peer`, when it is another CUDA device of this driver.
    fn peer_device(&self, peer: &dyn Device) -> Result<Option<sys::CUdevice>> {
        let info = peer.info();
        if info.vendor != Vendor::Cuda || info.ordinal == self.info.ordinal {
            return Ok(None);
        }
        if info.ordinal >= self.driver.device_count()? {
            return Ok(None);
        }
        self.driver.device(info.ordinal).map(Some)
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // Every update is a single insert or remove after the driver call, so the books are
        // consistent even if a holder panicked.
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn handles_read(&self) -> RwLockReadGuard<'_, Handles> {
        self.handles.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn handles_write(&self) -> RwLockWriteGuard<'_, Handles> {
        self.handles.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks that `value` is a non-zero multiple of the granularity (`zero_ok` for offsets).
    fn check_granular(
        &self,
        call: &'static str,
        what: &str,
        value: u64,
        zero_ok: bool,
    ) -> Result<()> {
        if (value == 0 && !zero_ok) || value % self.granularity != 0 {
            return Err(Error::InvalidArgument {
                call,
                reason: format!(
                    "{what} {value:#x} is not accepted: it must be a {}multiple of the \
                     device's granularity ({} bytes)",
                    if zero_ok { "" } else { "non-zero " },
                    self.granularity
                ),
            });
        }
        Ok(())
    }

    fn pool_handle(&self) -> Result<sys::CUmemoryPool> {
        self.pool.ok_or_else(|| Error::Unsupported {
            what: "stream-ordered pool".into(),
            backend: BACKEND,
            reason: format!(
                "device {} ({}) has no memory pools",
                self.info.ordinal, self.info.name
            ),
        })
    }
}

/// Whether a capability is there: the driver version, the symbols, then the device attribute.
fn gate(
    driver: &Driver,
    device: sys::CUdevice,
    version: i32,
    min_version: i32,
    symbols: bool,
    attribute: std::ffi::c_int,
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

fn unknown(what: &'static str, ptr: u64) -> Error {
    Error::UnknownPointer {
        what,
        ptr,
        backend: BACKEND,
    }
}

fn stream_handle(stream: Stream) -> sys::CUstream {
    stream.0 as usize as sys::CUstream
}

fn event_handle(event: Event) -> sys::CUevent {
    event.0 as usize as sys::CUevent
}

impl Handles {
    /// A stream this device made (the only ones [`Device::destroy_stream`] takes).
    fn check_own_stream(&self, stream: Stream) -> Result<sys::CUstream> {
        if self.streams.contains(&stream.0) {
            Ok(stream_handle(stream))
        } else {
            Err(unknown("stream", stream.0))
        }
    }

    fn check_event(&self, event: Event) -> Result<sys::CUevent> {
        if self.events.contains(&event.0) {
            Ok(event_handle(event))
        } else {
            Err(unknown("event", event.0))
        }
    }
}

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// `cuMemGetInfo_v2`.
    fn mem_info(&self) -> Result<MemInfo> {
        self.enter()?;
        let (free, total) = self.driver.mem_info()?;
        Ok(MemInfo { free, total })
    }

    /// `cuMemAlloc_v2` (256-byte aligned or better).
    ///
    /// # Errors
    /// [`Error::InvalidSize`] for zero; [`Error::DeviceOutOfMemory`] for
    /// `CUDA_ERROR_OUT_OF_MEMORY`; [`Error::Driver`] otherwise.
    fn alloc(&self, size: u64) -> Result<u64> {
        if size == 0 {
            return Err(Error::InvalidSize {
                size,
                reason: "a device allocation must be at least 1 byte",
            });
        }
        self.enter()?;
        let ptr = self.driver.mem_alloc(size)?;
        self.books().allocations.insert(ptr, size);
        Ok(ptr)
    }

    /// `cuMemFree_v2`.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] for a pointer not from [`Device::alloc`] (or freed already);
    /// [`Error::InvalidArgument`] for a `size` that is not the allocation's (as on the host
    /// and HIP devices); [`Error::Driver`] when the driver refuses (the allocation is then
    /// still held).
    fn free(&self, ptr: u64, size: u64) -> Result<()> {
        {
            let mut books = self.books();
            let held = *books
                .allocations
                .get(&ptr)
                .ok_or_else(|| unknown("allocation", ptr))?;
            // As the host and HIP devices do: a size that is not the allocation's is a bug
            // of the caller's, refused before the driver frees anything.
            if held != size {
                return Err(Error::InvalidArgument {
                    call: "free",
                    reason: format!(
                        "allocation {ptr:#x} was made with {held} bytes, not {size}; accepted \
                         is the size it was allocated with"
                    ),
                });
            }
            books.allocations.remove(&ptr);
        }
        let result = self.enter().and_then(|()| self.driver.mem_free(ptr));
        if result.is_err() {
            self.books().allocations.insert(ptr, size);
        }
        result
    }

    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        self.vmm.then_some(self as &dyn VirtualMemory)
    }

    fn stream_ordered_pool(&self) -> Option<&dyn StreamOrderedPool> {
        self.pool.map(|_| self as &dyn StreamOrderedPool)
    }

    /// `cuStreamCreate(CU_STREAM_DEFAULT)`.
    fn create_stream(&self) -> Result<Stream> {
        self.enter()?;
        let mut h = self.handles_write();
        let s = self.driver.stream_create(sys::CU_STREAM_DEFAULT)? as usize as u64;
        h.streams.insert(s);
        Ok(Stream(s))
    }

    /// `cuStreamDestroy_v2`.
    fn destroy_stream(&self, stream: Stream) -> Result<()> {
        if stream == Stream::DEFAULT {
            return Err(Error::InvalidArgument {
                call: "destroy_stream",
                reason: "the default stream cannot be destroyed; accepted are streams from \
                         create_stream"
                    .into(),
            });
        }
        self.enter()?;
        let mut h = self.handles_write();
        let s = h.check_own_stream(stream)?;
        // SAFETY: `s` is a live stream this device created (checked under the write lock).
        unsafe { self.driver.stream_destroy(s) }?;
        h.streams.remove(&stream.0);
        Ok(())
    }

    /// `cuStreamSynchronize`, on any stream the caller passes (its own, one from
    /// [`Device::create_stream`], or a special handle).
    fn synchronize_stream(&self, stream: Stream) -> Result<()> {
        self.enter()?;
        // SAFETY: by the contract of `Stream`, the handle is a live stream of this context or
        // a special handle (null, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD); the driver answers
        // CUDA_ERROR_INVALID_HANDLE for the invalid handles it detects.
        unsafe { self.driver.stream_synchronize(stream_handle(stream)) }
    }

    /// `cuCtxSynchronize` on the device's primary context.
    fn synchronize_device(&self) -> Result<()> {
        self.enter()?;
        self.driver.ctx_synchronize()
    }

    /// `cuEventCreate(CU_EVENT_DISABLE_TIMING)`.
    fn create_event(&self) -> Result<Event> {
        self.enter()?;
        let mut h = self.handles_write();
        let e = self.driver.event_create(sys::CU_EVENT_DISABLE_TIMING)? as usize as u64;
        h.events.insert(e);
        Ok(Event(e))
    }

    /// `cuEventRecord` of an event this device made, on any stream the caller passes.
    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        self.enter()?;
        let h = self.handles_read();
        let e = h.check_event(event)?;
        // SAFETY: the event is live (checked, kept alive by the read lock); by the contract
        // of `Stream`, the stream is a live stream of this context or a special handle.
        unsafe { self.driver.event_record(e, stream_handle(stream)) }
    }

    /// `cuEventQuery`.
    fn event_complete(&self, event: Event) -> Result<bool> {
        self.enter()?;
        let h = self.handles_read();
        let e = h.check_event(event)?;
        // SAFETY: the event is live (checked, kept alive by the read lock).
        unsafe { self.driver.event_query(e) }
    }

    /// `cuEventSynchronize`.
    fn synchronize_event(&self, event: Event) -> Result<()> {
        self.enter()?;
        let h = self.handles_read();
        let e = h.check_event(event)?;
        // SAFETY: the event is live (checked, kept alive by the read lock).
        unsafe { self.driver.event_synchronize(e) }
    }

    /// `cuEventDestroy_v2`.
    fn destroy_event(&self, event: Event) -> Result<()> {
        self.enter()?;
        let mut h = self.handles_write();
        let e = h.check_event(event)?;
        // SAFETY: the event is live and no other call uses it (write lock).
        unsafe { self.driver.event_destroy(e) }?;
        h.events.remove(&event.0);
        Ok(())
    }

    /// `cuDeviceCanAccessPeer`, for another CUDA device of this driver; false for anything
    /// else, and when the driver lacks the call.
    fn can_access_peer(&self, peer: &dyn Device) -> Result<bool> {
        if !self.driver.has_peer_symbols() {
            return Ok(false);
        }
        match self.peer_device(peer)? {
            Some(p) => self.driver.can_access_peer(self.device, p),
            None => Ok(false),
        }
    }

    /// `cuCtxEnablePeerAccess` from this device's primary context to the peer's (retained
    /// until this device is dropped).
    fn enable_peer_access(&self, peer: &dyn Device) -> Result<()> {
        if !self.can_access_peer(peer)? {
            return Err(Error::Unsupported {
                what: "peer access".into(),
                backend: BACKEND,
                reason: format!(
                    "device {} ({}) cannot access device {} of {}{}",
                    self.info.ordinal,
                    self.info.name,
                    peer.info().ordinal,
                    peer.info().vendor,
                    if self.driver.has_peer_symbols() {
                        " (cuDeviceCanAccessPeer says no)"
                    } else {
                        ": the driver does not export cuDeviceCanAccessPeer / cuCtxEnablePeerAccess"
                    }
                ),
            });
        }
        let ordinal = peer.info().ordinal;
        let mut peers = self.peers();
        if peers.iter().any(|&(o, _)| o == ordinal) {
            return Ok(());
        }
        let Some(peer_dev) = self.peer_device(peer)? else {
            return Ok(());
        };
        let peer_ctx = self.driver.primary_ctx_retain(peer_dev)?;
        let result = self.enter().and_then(|()| {
            // SAFETY: the peer's primary context was retained just above.
            unsafe { self.driver.ctx_enable_peer_access(peer_ctx) }
        });
        match result {
            Ok(()) => {
                peers.push((ordinal, peer_dev));
                peers.sort_unstable();
                Ok(())
            }
            Err(e) => {
                // SAFETY: undoes the retain of the peer's primary context made above.
                if let Err(r) = unsafe { self.driver.primary_ctx_release(peer_dev) } {
                    tracing::debug!(peer = ordinal, error = %r, "could not release a peer context");
                }
                Err(e)
            }
        }
    }

    fn peer_access(&self) -> Vec<u32> {
        self.peers().iter().map(|&(o, _)| o).collect()
    }
}

impl VirtualMemory for CudaDevice {
    /// The minimum granularity `cuMemGetAllocationGranularity` reports.
    fn granularity(&self) -> u64 {
        self.granularity
    }

    /// `cuMemAddressReserve`.
    fn reserve(&self, size: u64, alignment: u64) -> Result<u64> {
        self.check_granular("reserve", "size", size, false)?;
        if alignment != 0 && !alignment.is_power_of_two() {
            return Err(Error::InvalidArgument {
                call: "reserve",
                reason: format!(
                    "alignment {alignment} is not accepted: 0 (the granularity) or a power of two"
                ),
            });
        }
        let alignment = if alignment == 0 {
            0
        } else {
            alignment.max(self.granularity)
        };
        self.enter()?;
        let va = self.driver.address_reserve(size, alignment)?;
        self.books().reservations.insert(va, size);
        Ok(va)
    }

    /// `cuMemAddressFree` of a whole reservation with nothing mapped in it.
    fn free_reservation(&self, va: u64, size: u64) -> Result<()> {
        {
            let b = self.books();
            match b.reservations.get(&va) {
                None => return Err(unknown("reservation", va)),
                Some(&s) if s != size => {
                    return Err(Error::InvalidArgument {
                        call: "free_reservation",
                        reason: format!(
                            "the reservation at {va:#x} is {s} bytes, not {size}: it is freed whole"
                        ),
                    })
                }
                Some(_) => {}
            }
            if b.mappings
                .range(va..va.saturating_add(size))
                .next()
                .is_some()
            {
                return Err(Error::InvalidArgument {
                    call: "free_reservation",
                    reason: format!(
                        "the reservation at {va:#x} still has mappings; unmap them first"
                    ),
                });
            }
        }
        self.enter()?;
        self.driver.address_free(va, size)?;
        self.books().reservations.remove(&va);
        Ok(())
    }

    /// `cuMemCreate` of pinned device memory.
    fn create_physical(&self, size: u64) -> Result<PhysicalHandle> {
        self.check_granular("create_physical", "size", size, false)?;
        self.enter()?;
        let handle = self.driver.mem_create(self.device, size)?;
        self.books().handles.insert(handle);
        Ok(PhysicalHandle(handle))
    }

    /// `cuMemRelease` (the memory goes once its last mapping does).
    fn release_physical(&self, handle: PhysicalHandle) -> Result<()> {
        if !self.books().handles.contains(&handle.0) {
            return Err(unknown("physical handle", handle.0));
        }
        self.enter()?;
        self.driver.mem_release(handle.0)?;
        self.books().handles.remove(&handle.0);
        Ok(())
    }

    /// `cuMemMap`.
    fn map(&self, va: u64, size: u64, handle: PhysicalHandle, offset: u64) -> Result<()> {
        self.check_granular("map", "address", va, false)?;
        self.check_granular("map", "size", size, false)?;
        self.check_granular("map", "offset", offset, true)?;
        if !self.books().handles.contains(&handle.0) {
            return Err(unknown("physical handle", handle.0));
        }
        self.enter()?;
        self.driver.mem_map(va, size, offset, handle.0)?;
        self.books().mappings.insert(va, size);
        Ok(())
    }

    /// `cuMemSetAccess`: read-write for this device.
    fn set_access(&self, va: u64, size: u64) -> Result<()> {
        self.check_granular("set_access", "address", va, false)?;
        self.check_granular("set_access", "size", size, false)?;
        self.enter()?;
        self.driver.set_access(self.device, va, size)
    }

    /// `cuMemSetAccess` with one descriptor for this device and one per peer.
    fn set_access_with_peers(&self, va: u64, size: u64, peers: &[u32]) -> Result<()> {
        if peers.is_empty() {
            return self.set_access(va, size);
        }
        self.check_granular("set_access", "address", va, false)?;
        self.check_granular("set_access", "size", size, false)?;
        let mut devices = vec![self.device];
        {
            let enabled = self.peers();
            for p in peers {
                let Some(&(_, d)) = enabled.iter().find(|(o, _)| o == p) else {
                    return Err(Error::InvalidArgument {
                        call: "set_access_with_peers",
                        reason: format!(
                            "peer access to device {p} is not enabled on device {}; accepted \
                             are the devices enable_peer_access was called with ({:?})",
                            self.info.ordinal,
                            enabled.iter().map(|&(o, _)| o).collect::<Vec<_>>()
                        ),
                    });
                };
                devices.push(d);
            }
        }
        self.enter()?;
        self.driver.set_access_devices(&devices, va, size)
    }

    /// `cuMemUnmap`.
    fn unmap(&self, va: u64, size: u64) -> Result<()> {
        self.check_granular("unmap", "address", va, false)?;
        self.check_granular("unmap", "size", size, false)?;
        self.enter()?;
        self.driver.mem_unmap(va, size)?;
        let mut b = self.books();
        let starts: Vec<u64> = b
            .mappings
            .range(va..va.saturating_add(size))
            .map(|(&s, _)| s)
            .collect();
        for s in starts {
            b.mappings.remove(&s);
        }
        Ok(())
    }
}

impl StreamOrderedPool for CudaDevice {
    /// `cuMemAllocFromPoolAsync` from the device's own pool.
    fn alloc_async(&self, size: u64, stream: Stream) -> Result<u64> {
        if size == 0 {
            return Err(Error::InvalidSize {
                size,
                reason: "a pool allocation must be at least 1 byte",
            });
        }
        let pool = self.pool_handle()?;
        self.enter()?;
        // SAFETY: the pool lives as long as `self`; by the contract of `Stream`, the stream
        // is a live stream of this context or a special handle.
        let ptr = unsafe {
            self.driver
                .alloc_from_pool_async(size, pool, stream_handle(stream))
        }?;
        self.books().pool_allocations.insert(ptr, size);
        Ok(ptr)
    }

    /// `cuMemFreeAsync`.
    fn free_async(&self, ptr: u64, stream: Stream) -> Result<()> {
        self.pool_handle()?;
        self.enter()?;
        let size = self
            .books()
            .pool_allocations
            .remove(&ptr)
            .ok_or_else(|| unknown("pool allocation", ptr))?;
        // SAFETY: by the contract of `Stream`, the stream is a live stream of this context or
        // a special handle; the pointer came from this pool.
        let result = unsafe { self.driver.free_async(ptr, stream_handle(stream)) };
        if result.is_err() {
            self.books().pool_allocations.insert(ptr, size);
        }
        result
    }

    /// `cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)`.
    fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        let pool = self.pool_handle()?;
        self.enter()?;
        // SAFETY: the pool is live; the release threshold is a cuuint64_t attribute.
        unsafe {
            self.driver
                .pool_set_u64(pool, sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, bytes)
        }
    }

    /// `cuMemPoolGetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)`.
    fn release_threshold(&self) -> Result<u64> {
        let pool = self.pool_handle()?;
        self.enter()?;
        // SAFETY: the pool is live; the release threshold is a cuuint64_t attribute.
        unsafe {
            self.driver
                .pool_get_u64(pool, sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        }
    }

    /// `cuMemPoolTrimTo`.
    fn trim_to(&self, keep: u64) -> Result<()> {
        let pool = self.pool_handle()?;
        self.enter()?;
        // SAFETY: the pool lives as long as `self`.
        unsafe { self.driver.pool_trim_to(pool, keep) }
    }

    /// The pool's `RESERVED_MEM_CURRENT/HIGH` and `USED_MEM_CURRENT/HIGH` attributes.
    fn usage(&self) -> Result<PoolUsage> {
        let pool = self.pool_handle()?;
        self.enter()?;
        // SAFETY: the pool is live; all four are cuuint64_t attributes.
        let get = |attr| unsafe { self.driver.pool_get_u64(pool, attr) };
        Ok(PoolUsage {
            reserved_current: get(sys::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: get(sys::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
            used_current: get(sys::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_high: get(sys::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
        })
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let census = self.census();
        let driver = Arc::clone(&self.driver);
        let warn = |what: &str, e: Error| {
            tracing::warn!(device = self.info.ordinal, error = %e, "dropping a cuda device: {what}");
        };
        if let Err(e) = self.enter() {
            warn("could not make its context current", e);
        }
        let books = std::mem::take(self.books.get_mut().unwrap_or_else(PoisonError::into_inner));
        let handles = std::mem::take(
            self.handles
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        if !books.pool_allocations.is_empty() {
            for &ptr in books.pool_allocations.keys() {
                // SAFETY: the null stream is always valid.
                if let Err(e) = unsafe { driver.free_async(ptr, std::ptr::null_mut()) } {
                    warn("could not free a pool allocation", e);
                }
            }
            // SAFETY: the null stream is always valid.
            if let Err(e) = unsafe { driver.stream_synchronize(std::ptr::null_mut()) } {
                warn("could not synchronise", e);
            }
        }
        for &ptr in books.allocations.keys() {
            if let Err(e) = driver.mem_free(ptr) {
                warn("could not free an allocation", e);
            }
        }
        for (&va, &size) in &books.mappings {
            if let Err(e) = driver.mem_unmap(va, size) {
                warn("could not unmap", e);
            }
        }
        for &handle in &books.handles {
            if let Err(e) = driver.mem_release(handle) {
                warn("could not release a physical handle", e);
            }
        }
        for (&va, &size) in &books.reservations {
            if let Err(e) = driver.address_free(va, size) {
                warn("could not free a reservation", e);
            }
        }
        for &e in &handles.events {
            // SAFETY: a live event of this device, used by no one else any more.
            if let Err(err) = unsafe { driver.event_destroy(event_handle(Event(e))) } {
                warn("could not destroy an event", err);
            }
        }
        for &s in &handles.streams {
            // SAFETY: a live stream of this device, used by no one else any more.
            if let Err(err) = unsafe { driver.stream_destroy(stream_handle(Stream(s))) } {
                warn("could not destroy a stream", err);
            }
        }
        if let Some(pool) = self.pool.take() {
            // SAFETY: the pool was made by this device and is destroyed once, here.
            if let Err(e) = unsafe { driver.mem_pool_destroy(pool) } {
                warn("could not destroy its pool", e);
            }
        }
        let peers = std::mem::take(self.peers.get_mut().unwrap_or_else(PoisonError::into_inner));
        for (ordinal, peer) in peers {
            // SAFETY: each peer's primary context was retained once when its access was
            // enabled, and is released once here.
            if let Err(e) = unsafe { driver.primary_ctx_release(peer) } {
                tracing::warn!(device = self.info.ordinal, peer = ordinal, error = %e,
                    "dropping a cuda device: could not release a peer's primary context");
            }
        }
        // SAFETY: retained once at open, released once here, as the device goes.
        if let Err(e) = unsafe { driver.primary_ctx_release(self.device) } {
            warn("could not release its primary context", e);
        }
        if !census.is_empty() {
            tracing::warn!(
                device = self.info.ordinal,
                name = %self.info.name,
                ?census,
                "cuda device dropped while still holding these; returned them"
            );
        }
    }
}
