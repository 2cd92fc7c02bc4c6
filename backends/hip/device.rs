//! [`HipDevice`]: the [`Device`] trait over AMD's HIP runtime, one per device ordinal.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use portalloc_sys::hip as sys;

pub use super::tuning::MemoryKind;
use super::tuning::{self, attribute, Gate};
use super::{HipVersion, Runtime, BACKEND};
use crate::backends::vendor_books::{self, Books, Handles, VendorCensus};
use crate::device::{
    Capabilities, Device, DeviceInfo, Event, MemInfo, PhysicalHandle, PoolUsage, Stream,
    StreamOrderedPool, Vendor, VirtualMemory,
};
use crate::error::{Error, Result};
use crate::units::Bytes;

/// The variable that picks the memory kind of plain allocations: `coarse` (default), `fine`
/// or `uncached`.
pub const MEMORY_VARIABLE: &str = "PORTALLOC_HIP_MEMORY";

/// What a device holds now, from its own books: [`VendorCensus`].
pub type HipCensus = VendorCensus;

/// The stream-ordered pool, made at first use.
#[derive(Debug, Default)]
struct PoolState {
    /// The `hipMemPool_t`, as an address.
    pool: Option<u64>,
}

/// Options for [`HipDevice`]; [`HipDeviceBuilder::open`] opens it.
#[derive(Debug, Clone, Default)]
pub struct HipDeviceBuilder {
    ordinal: u32,
    memory: MemoryKind,
    require_virtual_memory: bool,
    require_pools: bool,
    default_pool: bool,
}

impl HipDeviceBuilder {
    /// The defaults: ordinal 0, coarse-grained memory, capabilities as the gates decide, a
    /// pool of portalloc's own.
    pub fn new() -> Self {
        Self::default()
    }

    /// The defaults, with the memory kind `PORTALLOC_HIP_MEMORY` names (`coarse`, `fine`,
    /// `uncached`).
    ///
    /// # Errors
    /// [`Error::Config`] for a value that is none of those.
    pub fn from_env() -> Result<Self> {
        let mut builder = Self::new();
        if let Some(value) = crate::config::env_var(MEMORY_VARIABLE)? {
            if !value.is_empty() {
                builder.memory = MemoryKind::parse(&value).ok_or_else(|| {
                    Error::config(
                        MEMORY_VARIABLE,
                        value.clone(),
                        "coarse (hipMalloc, the default), fine (fine-grained, host-coherent) \
                         or uncached (ROCm 6+)",
                    )
                })?;
            }
        }
        Ok(builder)
    }

    /// The device ordinal (default 0).
    pub fn ordinal(mut self, ordinal: u32) -> Self {
        self.ordinal = ordinal;
        self
    }

    /// The memory kind of plain allocations (default [`MemoryKind::Coarse`]).
    pub fn memory(mut self, kind: MemoryKind) -> Self {
        self.memory = kind;
        self
    }

    /// Fail to open, with the reason, when the gates leave virtual memory off (default:
    /// open without it).
    pub fn require_virtual_memory(mut self, required: bool) -> Self {
        self.require_virtual_memory = required;
        self
    }

    /// Fail to open, with the reason, when the device has no stream-ordered pools.
    pub fn require_pools(mut self, required: bool) -> Self {
        self.require_pools = required;
        self
    }

    /// Use the device's default pool (`hipDeviceGetDefaultMemPool`, shared with the rest of
    /// the process) instead of one of portalloc's own (`hipMemPoolCreate`, the default, whose
    /// threshold and trimming disturb no one else).
    pub fn default_pool(mut self, default_pool: bool) -> Self {
        self.default_pool = default_pool;
        self
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

/// One AMD GPU behind the [`Device`] trait.
///
/// * **Device**: HIP's current device is per thread, so every call first makes this
///   device's ordinal current (`hipSetDevice`); the device may be used from any thread.
/// * **Memory**: [`Device::alloc`] / [`Device::free`] are `hipMalloc` (coarse-grained, the
///   default) or `hipExtMallocWithFlags` (fine-grained, uncached) and `hipFree`.
/// * **Virtual memory** ([`VirtualMemory`]) only on ROCm ≥ 7 with attribute 89 set (see
///   [`super::tuning`]), with chunks of the recommended granularity raised to 2 MiB.
/// * **Stream-ordered pool** ([`StreamOrderedPool`]) when attribute 88 is set: a pool of its
///   own (`hipMemPoolCreate`), made at first use with its release threshold set explicitly.
/// * **Streams and events**: any stream the caller passes is used as it is — PyTorch's, one
///   made with `hipStreamCreate` directly, [`Stream::DEFAULT`] (the null stream),
///   [`Stream::LEGACY`] or [`Stream::PER_THREAD`]; [`Device::create_stream`] makes
///   `hipStreamCreateWithFlags(hipStreamDefault)` streams (blocking, so the null stream orders
///   with them) and events are `hipEventCreateWithFlags(hipEventDisableTiming)`.
///   [`Device::synchronize_device`] is `hipDeviceSynchronize`.
///
/// Errors: every failed call is [`Error::Driver`] with HIP's own name (`hipErrorInvalidValue`),
/// `hipErrorOutOfMemory` is [`Error::DeviceOutOfMemory`], pointers, handles and events the
/// device did not hand out (and streams it is asked to destroy that it did not create) are
/// [`Error::UnknownPointer`] (checked before HIP sees them), and sizes that are not multiples of the granularity are [`Error::InvalidArgument`].
/// Dropping the device gives back whatever it still holds and warns about it.
pub struct HipDevice {
    runtime: Arc<Runtime>,
    ordinal: u32,
    version: HipVersion,
    info: DeviceInfo,
    memory: MemoryKind,
    granularity: u64,
    vmm: Gate,
    pools: Gate,
    default_pool: bool,
    books: Mutex<Books>,
    handles: RwLock<Handles>,
    pool: Mutex<PoolState>,
    /// Ordinals of the devices peer access was enabled to.
    peers: Mutex<Vec<u32>>,
}

impl fmt::Debug for HipDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipDevice")
            .field("ordinal", &self.ordinal)
            .field("name", &self.info.name)
            .field("arch", &self.info.arch)
            .field("version", &self.version.to_string())
            .field("library", &self.runtime.path())
            .field("memory", &self.memory)
            .field("capabilities", &self.info.capabilities)
            .finish_non_exhaustive()
    }
}

fn stream_handle(s: Stream) -> sys::hipStream_t {
    s.0 as usize as sys::hipStream_t
}

fn event_handle(e: Event) -> sys::hipEvent_t {
    e.0 as usize as sys::hipEvent_t
}

fn pool_handle(p: u64) -> sys::hipMemPool_t {
    p as usize as sys::hipMemPool_t
}

impl HipDevice {
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
        runtime.set_device(ordinal)?;
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
            crate::config::env_var("HSA_XNACK")?.as_deref(),
            arch_found.as_ref().map(|(full, _)| full.as_str()),
        );
        let (_apu, apu_note) = tuning::apu_note(integrated);

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
        ];
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
        Ok(HipDevice {
            runtime,
            ordinal,
            version,
            info,
            memory: options.memory,
            granularity: chunk,
            vmm,
            pools,
            default_pool: options.default_pool,
            books: Mutex::new(Books::default()),
            handles: RwLock::new(Handles::default()),
            pool: Mutex::new(PoolState::default()),
            peers: Mutex::new(Vec::new()),
        })
    }

    /// The runtime the device calls.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The runtime version the gates read.
    pub fn version(&self) -> HipVersion {
        self.version
    }

    /// The memory kind of plain allocations.
    pub fn memory_kind(&self) -> MemoryKind {
        self.memory
    }

    /// The virtual-memory decision and its reason.
    pub fn virtual_memory_gate(&self) -> &Gate {
        &self.vmm
    }

    /// The stream-ordered pool decision and its reason.
    pub fn pool_gate(&self) -> &Gate {
        &self.pools
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
                self.ordinal,
                self.info.name,
                self.vmm.reason,
                tuning::VMM_MIN_MAJOR
            ),
        })
    }

    /// What the device holds now.
    pub fn census(&self) -> HipCensus {
        vendor_books::census(&self.handles, &self.books)
    }

    /// Makes this device current on the calling thread.
    ///
    /// # Errors
    /// [`Error::Driver`] when `hipSetDevice` fails.
    pub fn make_current(&self) -> Result<()> {
        self.runtime.set_device(self.ordinal)
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // Every operation checks before it changes the books, so they stay consistent even if
        // a holder panicked.
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn handles_read(&self) -> RwLockReadGuard<'_, Handles> {
        self.handles.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn handles_write(&self) -> RwLockWriteGuard<'_, Handles> {
        self.handles.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// `hipErrorOutOfMemory` becomes [`Error::DeviceOutOfMemory`]; others pass through.
    fn oom(&self, e: Error, requested: u64) -> Error {
        match e {
            Error::Driver { code, .. } if code == i64::from(sys::hipErrorOutOfMemory) => {
                Error::DeviceOutOfMemory {
                    backend: BACKEND,
                    requested,
                    free: self.runtime.mem_get_info().map(|(f, _)| f).unwrap_or(0),
                }
            }
            other => other,
        }
    }

    /// A stream this device made (the only ones [`Device::destroy_stream`] takes).
    fn check_own_stream(handles: &Handles, stream: Stream) -> Result<()> {
        if handles.streams.contains(&stream.0) {
            Ok(())
        } else {
            Err(Error::UnknownPointer {
                what: "stream",
                ptr: stream.0,
                backend: BACKEND,
            })
        }
    }

    fn check_event(handles: &Handles, event: Event) -> Result<()> {
        if handles.events.contains(&event.0) {
            Ok(())
        } else {
            Err(Error::UnknownPointer {
                what: "event",
                ptr: event.0,
                backend: BACKEND,
            })
        }
    }

    fn check_multiple(
        &self,
        call: &'static str,
        what: &str,
        value: u64,
        nonzero: bool,
    ) -> Result<()> {
        if (nonzero && value == 0) || value % self.granularity != 0 {
            return Err(Error::InvalidArgument {
                call,
                reason: format!(
                    "{what} {value:#x} is not {}a multiple of the granularity ({}); accepted \
                     are multiples of {} bytes",
                    if nonzero { "a non-zero " } else { "" },
                    Bytes(self.granularity),
                    self.granularity
                ),
            });
        }
        Ok(())
    }

    /// The pool, made (and its release threshold set to 0 explicitly) at first use.
    fn pool(&self) -> Result<u64> {
        let mut state = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = state.pool {
            return Ok(p);
        }
        self.make_current()?;
        let (pool, own) = if self.default_pool {
            (self.runtime.default_mem_pool(self.ordinal)?, false)
        } else {
            (self.runtime.mem_pool_create(self.ordinal)?, true)
        };
        // ROCm pools are known to keep freed memory unless told otherwise: the threshold is
        // always set, never left to the runtime's default.
        // SAFETY: the pool was just made (or fetched) by the runtime and is live.
        let set = unsafe {
            self.runtime
                .mem_pool_set_u64(pool, sys::hipMemPoolAttrReleaseThreshold, 0)
        };
        if let Err(e) = set {
            if own {
                // SAFETY: the pool was made above and is used by no one else.
                let _ = unsafe { self.runtime.mem_pool_destroy(pool) };
            }
            return Err(e);
        }
        state.pool = Some(pool as u64);
        Ok(pool as u64)
    }
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

impl Device for HipDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_info(&self) -> Result<MemInfo> {
        self.make_current()?;
        let (free, total) = self.runtime.mem_get_info()?;
        Ok(MemInfo { free, total })
    }

    /// `hipMalloc` (coarse-grained) or `hipExtMallocWithFlags` (the kind chosen at open).
    fn alloc(&self, size: u64) -> Result<u64> {
        if size == 0 {
            return Err(Error::InvalidSize {
                size,
                reason: "zero bytes: a device allocation needs at least one byte",
            });
        }
        self.make_current()?;
        let ptr = self
            .runtime
            .malloc(size, self.memory.flags())
            .map_err(|e| self.oom(e, size))?;
        if ptr == 0 {
            return Err(Error::DeviceOutOfMemory {
                backend: BACKEND,
                requested: size,
                free: self.runtime.mem_get_info().map(|(f, _)| f).unwrap_or(0),
            });
        }
        self.books().allocations.insert(ptr, size);
        Ok(ptr)
    }

    fn free(&self, ptr: u64, size: u64) -> Result<()> {
        let mut books = self.books();
        match books.allocations.get(&ptr) {
            None => {
                return Err(Error::UnknownPointer {
                    what: "allocation",
                    ptr,
                    backend: BACKEND,
                })
            }
            Some(&s) if s != size => {
                return Err(Error::InvalidArgument {
                    call: "free",
                    reason: format!(
                        "allocation {ptr:#x} was made with {s} bytes, not {size}; accepted is \
                         the size it was allocated with"
                    ),
                })
            }
            Some(_) => {}
        }
        // Out of the books before the call, and the lock dropped: hipFree can wait for the
        // whole device, and no lock is held across a blocking driver call (as on CUDA).
        books.allocations.remove(&ptr);
        drop(books);
        let result = self.make_current().and_then(|()| {
            // SAFETY: the pointer was a live allocation of this device (checked in the books,
            // and taken out of them, so no other call frees it meanwhile).
            unsafe { self.runtime.free(ptr) }
        });
        if result.is_err() {
            self.books().allocations.insert(ptr, size);
        }
        result
    }

    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        self.vmm.on.then_some(self as &dyn VirtualMemory)
    }

    fn stream_ordered_pool(&self) -> Option<&dyn StreamOrderedPool> {
        self.pools.on.then_some(self as &dyn StreamOrderedPool)
    }

    fn create_stream(&self) -> Result<Stream> {
        self.make_current()?;
        let s = self.runtime.stream_create(sys::hipStreamDefault)?;
        let id = s as u64;
        self.handles_write().streams.insert(id);
        Ok(Stream(id))
    }

    fn destroy_stream(&self, stream: Stream) -> Result<()> {
        if stream == Stream::DEFAULT {
            return Err(Error::InvalidArgument {
                call: "destroy_stream",
                reason: "the default stream cannot be destroyed; accepted are streams from \
                         create_stream"
                    .into(),
            });
        }
        let mut handles = self.handles_write();
        Self::check_own_stream(&handles, stream)?;
        self.make_current()?;
        // SAFETY: a live stream of this device; the write lock keeps others from using it.
        unsafe { self.runtime.stream_destroy(stream_handle(stream)) }?;
        handles.streams.remove(&stream.0);
        Ok(())
    }

    /// `hipStreamSynchronize` on any stream the caller passes.
    fn synchronize_stream(&self, stream: Stream) -> Result<()> {
        self.make_current()?;
        // SAFETY: by the contract of `Stream`, a live stream of this device or a special
        // handle (null, hipStreamLegacy, hipStreamPerThread); HIP answers
        // hipErrorInvalidHandle for the invalid handles it detects.
        unsafe { self.runtime.stream_synchronize(stream_handle(stream)) }
    }

    /// `hipDeviceSynchronize` with this device current.
    fn synchronize_device(&self) -> Result<()> {
        self.make_current()?;
        self.runtime.device_synchronize()
    }

    fn create_event(&self) -> Result<Event> {
        self.make_current()?;
        let e = self.runtime.event_create(sys::hipEventDisableTiming)?;
        let id = e as u64;
        self.handles_write().events.insert(id);
        Ok(Event(id))
    }

    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        let handles = self.handles_read();
        Self::check_event(&handles, event)?;
        self.make_current()?;
        // SAFETY: a live event of this device (checked; the read lock keeps it live) and, by
        // the contract of `Stream`, a live stream or a special handle.
        unsafe {
            self.runtime
                .event_record(event_handle(event), stream_handle(stream))
        }
    }

    fn event_complete(&self, event: Event) -> Result<bool> {
        let handles = self.handles_read();
        Self::check_event(&handles, event)?;
        // SAFETY: a live event of this device (checked).
        unsafe { self.runtime.event_query(event_handle(event)) }
    }

    fn synchronize_event(&self, event: Event) -> Result<()> {
        let handles = self.handles_read();
        Self::check_event(&handles, event)?;
        // SAFETY: a live event of this device (checked).
        unsafe { self.runtime.event_synchronize(event_handle(event)) }
    }

    fn destroy_event(&self, event: Event) -> Result<()> {
        let mut handles = self.handles_write();
        Self::check_event(&handles, event)?;
        // SAFETY: a live event of this device; the write lock keeps others from using it.
        unsafe { self.runtime.event_destroy(event_handle(event)) }?;
        handles.events.remove(&event.0);
        Ok(())
    }

    /// `hipDeviceCanAccessPeer`, for another HIP device; false for anything else and when
    /// the runtime lacks the peer calls.
    fn can_access_peer(&self, peer: &dyn Device) -> Result<bool> {
        let info = peer.info();
        if info.vendor != Vendor::Hip || info.ordinal == self.ordinal {
            return Ok(false);
        }
        if !self.runtime.has_peer_symbols() || info.ordinal >= self.runtime.device_count()? {
            return Ok(false);
        }
        self.runtime
            .device_can_access_peer(self.ordinal, info.ordinal)
    }

    /// `hipDeviceEnablePeerAccess` from this device.
    fn enable_peer_access(&self, peer: &dyn Device) -> Result<()> {
        if !self.can_access_peer(peer)? {
            return Err(Error::Unsupported {
                what: "peer access".into(),
                backend: BACKEND,
                reason: format!(
                    "device {} ({}) cannot access device {} of {}{}",
                    self.ordinal,
                    self.info.name,
                    peer.info().ordinal,
                    peer.info().vendor,
                    if self.runtime.has_peer_symbols() {
                        " (hipDeviceCanAccessPeer says no)"
                    } else {
                        ": the runtime does not export hipDeviceCanAccessPeer / \
                         hipDeviceEnablePeerAccess"
                    }
                ),
            });
        }
        let ordinal = peer.info().ordinal;
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        if peers.contains(&ordinal) {
            return Ok(());
        }
        self.make_current()?;
        self.runtime.device_enable_peer_access(ordinal)?;
        peers.push(ordinal);
        peers.sort_unstable();
        Ok(())
    }

    fn peer_access(&self) -> Vec<u32> {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl VirtualMemory for HipDevice {
    /// The chunk size: the recommended granularity, at least 2 MiB (see [`super::tuning`]).
    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn reserve(&self, size: u64, alignment: u64) -> Result<u64> {
        self.check_multiple("reserve", "size", size, true)?;
        if alignment != 0 && !alignment.is_power_of_two() {
            return Err(Error::InvalidArgument {
                call: "reserve",
                reason: format!("alignment {alignment} is not 0 or a power of two"),
            });
        }
        let align = alignment.max(self.granularity);
        self.make_current()?;
        let va = self.runtime.address_reserve(size, align)?;
        self.books().reservations.insert(va, size);
        Ok(va)
    }

    fn free_reservation(&self, va: u64, size: u64) -> Result<()> {
        let mut books = self.books();
        match books.reservations.get(&va) {
            None => {
                return Err(Error::UnknownPointer {
                    what: "reservation",
                    ptr: va,
                    backend: BACKEND,
                })
            }
            Some(&s) if s != size => {
                return Err(Error::InvalidArgument {
                    call: "free_reservation",
                    reason: format!("reservation {va:#x} has {s} bytes, not {size}"),
                })
            }
            Some(_) => {}
        }
        if books.mappings.range(va..va + size).next().is_some() {
            return Err(Error::InvalidArgument {
                call: "free_reservation",
                reason: format!("reservation {va:#x} still has mappings; unmap them first"),
            });
        }
        // SAFETY: a whole live reservation of this device with nothing mapped (checked).
        unsafe { self.runtime.address_free(va, size) }?;
        books.reservations.remove(&va);
        Ok(())
    }

    fn create_physical(&self, size: u64) -> Result<PhysicalHandle> {
        self.check_multiple("create_physical", "size", size, true)?;
        self.make_current()?;
        let h = self
            .runtime
            .mem_create(self.ordinal, size)
            .map_err(|e| self.oom(e, size))?;
        self.books().handles.insert(h);
        Ok(PhysicalHandle(h))
    }

    fn release_physical(&self, handle: PhysicalHandle) -> Result<()> {
        let mut books = self.books();
        if !books.handles.contains(&handle.0) {
            return Err(Error::UnknownPointer {
                what: "physical handle",
                ptr: handle.0,
                backend: BACKEND,
            });
        }
        // SAFETY: a live handle of this device (checked); HIP keeps mapped memory alive.
        unsafe { self.runtime.mem_release(handle.0) }?;
        books.handles.remove(&handle.0);
        Ok(())
    }

    fn map(&self, va: u64, size: u64, handle: PhysicalHandle, offset: u64) -> Result<()> {
        self.check_multiple("map", "address", va, false)?;
        self.check_multiple("map", "size", size, true)?;
        self.check_multiple("map", "offset", offset, false)?;
        let mut books = self.books();
        if !books.handles.contains(&handle.0) {
            return Err(Error::UnknownPointer {
                what: "physical handle",
                ptr: handle.0,
                backend: BACKEND,
            });
        }
        let inside = books
            .reservations
            .range(..=va)
            .next_back()
            .is_some_and(|(&start, &len)| va + size <= start + len);
        if !inside {
            return Err(Error::InvalidArgument {
                call: "map",
                reason: format!(
                    "[{va:#x}, +{size:#x}) is not inside one reservation of this device"
                ),
            });
        }
        // SAFETY: a live handle and a range inside a live reservation (checked); HIP checks
        // overlap and the handle's size.
        unsafe { self.runtime.mem_map(va, size, offset, handle.0) }?;
        books.mappings.insert(va, size);
        Ok(())
    }

    fn set_access(&self, va: u64, size: u64) -> Result<()> {
        self.check_multiple("set_access", "address", va, false)?;
        self.check_multiple("set_access", "size", size, true)?;
        self.make_current()?;
        self.runtime.mem_set_access(self.ordinal, va, size)
    }

    /// `hipMemSetAccess` with one descriptor for this device and one per peer.
    fn set_access_with_peers(&self, va: u64, size: u64, peers: &[u32]) -> Result<()> {
        if peers.is_empty() {
            return self.set_access(va, size);
        }
        self.check_multiple("set_access", "address", va, false)?;
        self.check_multiple("set_access", "size", size, true)?;
        let enabled = self.peer_access();
        if let Some(p) = peers.iter().find(|p| !enabled.contains(p)) {
            return Err(Error::InvalidArgument {
                call: "set_access_with_peers",
                reason: format!(
                    "peer access to device {p} is not enabled on device {}; accepted are the \
                     devices enable_peer_access was called with ({enabled:?})",
                    self.ordinal
                ),
            });
        }
        let mut ordinals = vec![self.ordinal];
        ordinals.extend_from_slice(peers);
        self.make_current()?;
        self.runtime.mem_set_access_devices(&ordinals, va, size)
    }

    fn unmap(&self, va: u64, size: u64) -> Result<()> {
        self.check_multiple("unmap", "address", va, false)?;
        self.check_multiple("unmap", "size", size, true)?;
        let mut books = self.books();
        // The range must be exactly a run of whole mappings.
        let mut at = va;
        let mut starts = Vec::new();
        for (&start, &len) in books.mappings.range(va..va + size) {
            if start != at {
                break;
            }
            starts.push(start);
            at = start + len;
        }
        let split = books
            .mappings
            .range(..va)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > va);
        if at != va + size || split {
            return Err(Error::InvalidArgument {
                call: "unmap",
                reason: format!(
                    "[{va:#x}, +{size:#x}) is not exactly a run of whole mappings of this device"
                ),
            });
        }
        // SAFETY: the range is exactly covered by this device's live mappings (checked).
        unsafe { self.runtime.mem_unmap(va, size) }?;
        for start in starts {
            books.mappings.remove(&start);
        }
        Ok(())
    }
}

impl StreamOrderedPool for HipDevice {
    fn alloc_async(&self, size: u64, stream: Stream) -> Result<u64> {
        if size == 0 {
            return Err(Error::InvalidSize {
                size,
                reason: "zero bytes: a pool allocation needs at least one byte",
            });
        }
        let pool = self.pool()?;
        let ptr = {
            self.make_current()?;
            // SAFETY: a live pool of this device and, by the contract of `Stream`, a live
            // stream or a special handle.
            unsafe {
                self.runtime
                    .malloc_from_pool_async(size, pool_handle(pool), stream_handle(stream))
            }
        }
        .map_err(|e| self.oom(e, size))?;
        self.books().pool_allocations.insert(ptr, size);
        Ok(ptr)
    }

    fn free_async(&self, ptr: u64, stream: Stream) -> Result<()> {
        let mut books = self.books();
        if !books.pool_allocations.contains_key(&ptr) {
            return Err(Error::UnknownPointer {
                what: "pool allocation",
                ptr,
                backend: BACKEND,
            });
        }
        self.make_current()?;
        // SAFETY: a live pool allocation (checked) and, by the contract of `Stream`, a live
        // stream or a special handle.
        unsafe { self.runtime.free_async(ptr, stream_handle(stream)) }?;
        books.pool_allocations.remove(&ptr);
        Ok(())
    }

    fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        let pool = self.pool()?;
        // SAFETY: a live pool of this device.
        unsafe {
            self.runtime.mem_pool_set_u64(
                pool_handle(pool),
                sys::hipMemPoolAttrReleaseThreshold,
                bytes,
            )
        }
    }

    fn release_threshold(&self) -> Result<u64> {
        let pool = self.pool()?;
        // SAFETY: a live pool of this device.
        unsafe {
            self.runtime
                .mem_pool_get_u64(pool_handle(pool), sys::hipMemPoolAttrReleaseThreshold)
        }
    }

    fn trim_to(&self, keep: u64) -> Result<()> {
        let pool = self.pool()?;
        // SAFETY: a live pool of this device.
        unsafe { self.runtime.mem_pool_trim_to(pool_handle(pool), keep) }
    }

    fn usage(&self) -> Result<PoolUsage> {
        let pool = pool_handle(self.pool()?);
        // SAFETY: a live pool of this device.
        let get = |attr| unsafe { self.runtime.mem_pool_get_u64(pool, attr) };
        Ok(PoolUsage {
            reserved_current: get(sys::hipMemPoolAttrReservedMemCurrent)?,
            reserved_high: get(sys::hipMemPoolAttrReservedMemHigh)?,
            used_current: get(sys::hipMemPoolAttrUsedMemCurrent)?,
            used_high: get(sys::hipMemPoolAttrUsedMemHigh)?,
        })
    }
}

impl Drop for HipDevice {
    fn drop(&mut self) {
        let census = self.census();
        let runtime = Arc::clone(&self.runtime);
        let ordinal = self.ordinal;
        let warn = |what: &str, e: Error| {
            tracing::warn!(device = ordinal, error = %e, "dropping a hip device: {what}");
        };
        if let Err(e) = runtime.set_device(ordinal) {
            warn("could not make it current", e);
        }
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
            .pool
            .take();
        if !books.pool_allocations.is_empty() {
            for &ptr in books.pool_allocations.keys() {
                // SAFETY: a live pool allocation; the null stream is always valid.
                if let Err(e) = unsafe { runtime.free_async(ptr, std::ptr::null_mut()) } {
                    warn("could not free a pool allocation", e);
                }
            }
            // SAFETY: the null stream is always valid.
            if let Err(e) = unsafe { runtime.stream_synchronize(std::ptr::null_mut()) } {
                warn("could not synchronise", e);
            }
        }
        for &ptr in books.allocations.keys() {
            // SAFETY: a live allocation of this device, used by no one else any more.
            if let Err(e) = unsafe { runtime.free(ptr) } {
                warn("could not free an allocation", e);
            }
        }
        for (&va, &size) in &books.mappings {
            // SAFETY: a live mapping of this device, used by no one else any more.
            if let Err(e) = unsafe { runtime.mem_unmap(va, size) } {
                warn("could not unmap", e);
            }
        }
        for &handle in &books.handles {
            // SAFETY: a live handle of this device, released once, here.
            if let Err(e) = unsafe { runtime.mem_release(handle) } {
                warn("could not release a physical handle", e);
            }
        }
        for (&va, &size) in &books.reservations {
            // SAFETY: a live reservation of this device, now with nothing mapped.
            if let Err(e) = unsafe { runtime.address_free(va, size) } {
                warn("could not free a reservation", e);
            }
        }
        for &e in &handles.events {
            // SAFETY: a live event of this device, used by no one else any more.
            if let Err(err) = unsafe { runtime.event_destroy(event_handle(Event(e))) } {
                warn("could not destroy an event", err);
            }
        }
        for &s in &handles.streams {
            // SAFETY: a live stream of this device, used by no one else any more.
            if let Err(err) = unsafe { runtime.stream_destroy(stream_handle(Stream(s))) } {
                warn("could not destroy a stream", err);
            }
        }
        if let Some(pool) = pool {
            if self.default_pool {
                // The default pool is shared: give back what portalloc left in it.
                // SAFETY: the device's default pool is live for the process.
                if let Err(e) = unsafe { runtime.mem_pool_trim_to(pool_handle(pool), 0) } {
                    warn("could not trim the default pool", e);
                }
            } else {
                // SAFETY: the pool was made by this device and is destroyed once, here.
                if let Err(e) = unsafe { runtime.mem_pool_destroy(pool_handle(pool)) } {
                    warn("could not destroy its pool", e);
                }
            }
        }
        if !census.is_empty() {
            tracing::warn!(
                device = ordinal,
                name = %self.info.name,
                ?census,
                "hip device dropped while still holding these; returned them"
            );
        }
    }
}
