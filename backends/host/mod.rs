//! The host backend: ordinary memory behind the [`Device`] trait, with virtual memory that
//! behaves like the GPU drivers'.
//!
//! # Why
//!
//! Every strategy is generic over [`Device`], and most machines that build and test
//! portalloc have no GPU. The host backend is where the strategies are tested, so it follows
//! the GPU drivers' rules *strictly* — a strategy that passes here makes only calls that
//! `cuMemMap` & co. would accept — and it can pretend to be a device of any size.
//!
//! # The model
//!
//! * **Plain allocations** ([`Device::alloc`] / [`Device::free`], like `cuMemAlloc` /
//!   `cuMemFree`) are anonymous `mmap`s, page-aligned (so at least 256-aligned). Each is
//!   charged against the capacity rounded up to 256 bytes, whatever the page size, so
//!   accounting is the same on every machine and in both modes. `free` must be given the
//!   pointer and the size the allocation was made with.
//! * **Virtual memory** ([`VirtualMemory`]) is the CUDA driver's model, one system call per
//!   driver call:
//!
//!   | driver | host |
//!   |---|---|
//!   | `cuMemAddressReserve` | `mmap(PROT_NONE, MAP_NORESERVE)`, aligned to `max(alignment, granularity)` |
//!   | `cuMemCreate` | `memfd_create` + `ftruncate` (charged against the capacity) |
//!   | `cuMemMap` | `mmap(MAP_SHARED \| MAP_FIXED, PROT_NONE)` of the memory file at an offset |
//!   | `cuMemSetAccess` | `mprotect(PROT_READ \| PROT_WRITE)` |
//!   | `cuMemUnmap` | `mmap(PROT_NONE, MAP_NORESERVE \| MAP_FIXED)` back over the range (still reserved) |
//!   | `cuMemRelease` | close the memory file |
//!   | `cuMemAddressFree` | `munmap` |
//!
//!   Sizes, addresses and offsets must be multiples of the granularity (2 MiB by default);
//!   a mapping must lie inside one reservation on granules not mapped already and within its
//!   handle; `set_access` needs every granule of its range mapped; `unmap` must cover whole
//!   earlier mappings exactly; a reservation is freed whole and only with nothing mapped in
//!   it. Releasing a handle that is still mapped is allowed, as with the drivers: its memory,
//!   and its charge against the capacity, go when its last mapping is unmapped. Two mappings
//!   of one handle see the same bytes.
//! * **Simulated mode** ([`HostDeviceBuilder::simulated`]) keeps the same books and applies
//!   the same checks and errors, but makes no system call and touches no memory: addresses
//!   come from a fake address space starting at 1 TiB that is not reused until 2^63 bytes
//!   have gone by. A 141 GiB device can be replayed on a laptop.
//! * **Streams and events**: any stream handle is accepted, as on the GPU backends (a
//!   caller's streams belong to the caller); [`Device::create_stream`] hands out ids from
//!   `0x100` up, clear of the special handles 0, 1 and 2, and [`Stream::PER_THREAD`] names
//!   another stream on each thread. The host does all work synchronously, so a recorded
//!   event is complete at once — unless something holds it back: a test's kernel in flight
//!   ([`HostDevice::launch`]), a GPU-side wait ([`Device::wait_event`]) for an event not
//!   complete, or the test's hold ([`HostDevice::set_events_held`]). Each stream is a clock:
//!   work on it completes in order, and waiting for an event completes the work before it,
//!   as on a GPU. Freeing or unmapping memory a kernel still uses is recorded as a hazard
//!   ([`HostDevice::hazards`]), and CPU waits are counted ([`HostDevice::cpu_waits`]): the
//!   conformance suite's test world (see the `timeline` module).
//! * **Stream-ordered pool** ([`StreamOrderedPool`], like `cuMemAllocFromPoolAsync`): segments
//!   of plain allocations (so the census counts them), sub-allocated best fit, with CUDA's
//!   release threshold and stream ordering — see the `pool` module.
//! * **Copies** between device and host memory ([`Device::copy_to_host`],
//!   [`Device::copy_from_host`], like `cuMemcpyDtoHAsync` / `cuMemcpyHtoDAsync`): the device
//!   range must lie in memory mapped with access granted (`set_access`; through adjacent
//!   mappings and reservations too) or inside one live plain allocation (the pool's segments
//!   among them) — anything else is refused before a byte is touched, so a bad range is an
//!   error, never a fault of the process. Each copy is an operation on its stream's clock
//!   (ordered after what is queued there: a kernel in flight, a GPU-side wait) that completes
//!   in stream order; an event recorded after it says when. **The bytes move when the copy
//!   is queued**, under the device's lock (so no unmap can pull the memory away meanwhile),
//!   not when the clock reaches it: the test's kernels are simulated and write nothing, and
//!   every order between streams goes through an event recorded after queued work, so a
//!   copy queued later in stream order is also queued later in time, and what a caller can
//!   observe through the contract (bytes read only once the copy completed) is the same.
//!   Freeing or unmapping the device range, or freeing the pinned host memory, of a copy not
//!   yet complete is a hazard ([`HostDevice::hazards`]). In simulated mode a copy is checked
//!   and queued the same way but moves no bytes (there are none).
//! * **Pinned host memory** ([`Device::alloc_pinned_host`]): an anonymous private mapping
//!   (page-aligned, not locked: the host needs no DMA), counted in the census
//!   ([`HostCensus::pinned_host`]) until [`Device::free_pinned_host`]. `Ok(None)` in
//!   simulated mode, which maps nothing. Host memory registered ([`Device::register_host`]) is
//!   recorded, neither locked nor touched, in both modes, and counted there too until
//!   [`Device::unregister_host`].
//!
//! Errors: bad arguments are [`Error::InvalidArgument`] (what was wrong and what is
//! accepted), pointers and handles the device does not know are [`Error::UnknownPointer`],
//! going past the capacity is [`Error::DeviceOutOfMemory`], and a failing system call is
//! [`Error::Os`]. [`HostDevice::census`] counts what is held, for leak checks; dropping the
//! device returns everything and warns about what was still held.

mod books;
mod interprocess;
mod os;
mod pool;
mod sim;
mod timeline;

#[cfg(feature = "replay")]
pub(crate) use os::keep_freed_heap;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::device::{
    Capabilities, CaptureStatus, Device, DeviceInfo, Event, MemInfo, PhysicalHandle, Stream,
    StreamOrderedPool, VirtualMemory,
};
use crate::error::{Error, Result};
use crate::units::Bytes;

use books::{Books, BACKEND};
use pool::PoolState;
use sim::SimSpace;
use timeline::Timeline;

/// The first id [`Device::create_stream`] hands out: clear of the special handles
/// ([`Stream::DEFAULT`], [`Stream::LEGACY`], [`Stream::PER_THREAD`]).
const FIRST_STREAM_ID: u64 = 0x100;

/// The default virtual-memory granularity: 2 MiB, as on current NVIDIA and AMD GPUs.
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// Facts about what a host device holds now, for leak checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCensus {
    /// Live allocations from [`Device::alloc`].
    pub allocations: u64,
    /// Bytes counted against the capacity (allocations + physical handles).
    pub bytes_in_use: u64,
    /// Physical handles whose memory is held: not released yet, or released but still
    /// mapped.
    pub physical_handles: u64,
    /// Live mappings.
    pub mappings: u64,
    /// Live address reservations.
    pub reservations: u64,
    /// Live streams (the default stream not counted).
    pub streams: u64,
    /// Live events.
    pub events: u64,
    /// Live pinned host memory allocations ([`Device::alloc_pinned_host`]) and host memory
    /// registered ([`Device::register_host`]).
    pub pinned_host: u64,
    /// Their bytes (as asked for), not counted against the capacity: host memory.
    pub pinned_host_bytes: u64,
}

impl HostCensus {
    /// True when the device holds nothing at all: no memory, streams or events.
    pub fn is_empty(&self) -> bool {
        *self == HostCensus::default()
    }
}

/// Builder for [`HostDevice`].
#[derive(Debug, Clone)]
pub struct HostDeviceBuilder {
    capacity: Option<u64>,
    simulated: bool,
    granularity: u64,
    name: Option<String>,
    ordinal: u32,
}

impl HostDeviceBuilder {
    /// Total memory of the device (default: the machine's physical memory). Any size is
    /// accepted: in real mode memory is only used when touched.
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = Some(bytes);
        self
    }

    /// A name for reports (default `host`, or `host (simulated)`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    crate::backends::setters! {
        /// Track addresses only, touching no memory and making no system calls (default:
        /// false).
        simulated: bool;
        /// Virtual-memory granularity (a power of two, a multiple of the page size; default
        /// 2 MiB).
        granularity: u64;
        /// The ordinal reported in [`DeviceInfo`] (default 0).
        ordinal: u32;
    }

    /// Builds the device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a granularity that is not a power of two or not a
    /// multiple of the page size; [`Error::Os`] when no capacity was given and the machine's
    /// physical memory cannot be read.
    pub fn build(self) -> Result<HostDevice> {
        let page = os::page_size();
        let g = self.granularity;
        if !g.is_power_of_two() || g % page != 0 {
            return Err(Error::InvalidArgument {
                call: "HostDeviceBuilder::granularity",
                reason: format!(
                    "{g} bytes is not accepted: the granularity must be a power of two and a \
                     multiple of the page size ({page} bytes), such as {} (the default)",
                    DEFAULT_GRANULARITY.max(page)
                ),
            });
        }
        let capacity = match self.capacity {
            Some(bytes) => bytes,
            None => os::physical_memory().ok_or_else(|| Error::Os {
                call: "sysconf(_SC_PHYS_PAGES)",
                source: std::io::Error::last_os_error(),
            })?,
        };
        let mode = if self.simulated { "simulated" } else { "real" };
        let name = self.name.unwrap_or_else(|| {
            if self.simulated {
                "host (simulated)".into()
            } else {
                "host".into()
            }
        });
        let capacity_source = if self.capacity.is_some() {
            "set"
        } else {
            "physical memory"
        };
        let info = DeviceInfo {
            vendor: crate::Vendor::Host,
            ordinal: self.ordinal,
            name,
            arch: "host".into(),
            total_bytes: capacity,
            min_granularity: g,
            recommended_granularity: g,
            capabilities: Capabilities {
                virtual_memory: true,
                stream_ordered_pool: true,
            },
            notes: vec![
                ("mode".into(), mode.into()),
                ("granularity".into(), Bytes(g).to_string()),
                ("page size".into(), Bytes(page).to_string()),
                (
                    "capacity".into(),
                    format!("{} ({capacity_source})", Bytes(capacity)),
                ),
            ],
        };
        Ok(HostDevice {
            info,
            simulated: self.simulated,
            page,
            granularity: g,
            state: Mutex::new(State {
                books: Books::new(capacity, g),
                sim: self.simulated.then(SimSpace::new),
                streams: Streams::default(),
                timeline: Timeline::default(),
                pool: PoolState::default(),
                peers: BTreeSet::new(),
                peer_grants: BTreeMap::new(),
                pinned: BTreeMap::new(),
                registered: BTreeMap::new(),
                exported_plain: BTreeMap::new(),
                opened_ipc: BTreeMap::new(),
            }),
        })
    }
}

/// The streams the device made (the only ones `destroy_stream` accepts).
#[derive(Debug, Default)]
struct Streams {
    last: u64,
    live: BTreeSet<u64>,
    /// Streams marked as captured ([`HostDevice::begin_capture`]) → their capture's id.
    captured: BTreeMap<u64, u64>,
    /// The last capture id given.
    last_capture: u64,
}

/// Everything behind the device's lock.
#[derive(Debug)]
struct State {
    books: Books,
    /// The fake address space; `Some` exactly in simulated mode.
    sim: Option<SimSpace>,
    streams: Streams,
    timeline: Timeline,
    /// The stream-ordered pool's books.
    pool: PoolState,
    /// Ordinals of the host devices peer access was enabled to.
    peers: BTreeSet<u32>,
    /// Granule → the peers granted access to it by `set_access_with_peers` (recorded only:
    /// host devices share one address space). Forgotten when the granule is unmapped.
    peer_grants: BTreeMap<u64, BTreeSet<u32>>,
    /// Pinned host memory handed out: address → size asked for (mapped: whole pages).
    pinned: BTreeMap<u64, u64>,
    /// Host memory registered ([`Device::register_host`]): address → size.
    registered: BTreeMap<u64, u64>,
    /// Plain allocations exported through legacy IPC handles: address → the memory file now
    /// behind them, closed at their free.
    exported_plain: BTreeMap<u64, interprocess::ExportedPlain>,
    /// Other processes' allocations opened here: address → the opening.
    opened_ipc: BTreeMap<u64, interprocess::OpenedIpc>,
}

/// Host memory as a device. See the [module docs](self).
///
/// `Send + Sync`: all state is behind one mutex.
pub struct HostDevice {
    info: DeviceInfo,
    simulated: bool,
    page: u64,
    granularity: u64,
    state: Mutex<State>,
}

impl fmt::Debug for HostDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostDevice")
            .field("name", &self.info.name)
            .field("simulated", &self.is_simulated())
            .field("capacity", &self.info.total_bytes)
            .field("granularity", &self.granularity)
            .field("census", &self.census())
            .finish()
    }
}

/// The record of an event of this device, or [`Error::UnknownPointer`].
fn event_record(st: &State, event: Event) -> Result<timeline::EventRecord> {
    st.timeline.event(event).ok_or(Error::UnknownPointer {
        what: "event",
        ptr: event.0,
        backend: BACKEND,
    })
}

/// The out-of-address-space error of a simulated `call`, worded like the real one.
fn no_address_space(call: &'static str) -> Error {
    Error::Os {
        call,
        source: std::io::Error::from_raw_os_error(libc::ENOMEM),
    }
}

impl HostDevice {
    /// A builder with the defaults: real memory, capacity = physical memory, 2 MiB
    /// granularity, name `host`, ordinal 0.
    pub fn builder() -> HostDeviceBuilder {
        HostDeviceBuilder {
            capacity: None,
            simulated: false,
            granularity: DEFAULT_GRANULARITY,
            name: None,
            ordinal: 0,
        }
    }

    /// What the device holds now.
    pub fn census(&self) -> HostCensus {
        let st = self.lock();
        HostCensus {
            streams: st.streams.live.len() as u64,
            events: st.timeline.event_count() as u64,
            pinned_host: (st.pinned.len() + st.registered.len()) as u64,
            pinned_host_bytes: st.pinned.values().sum::<u64>()
                + st.registered.values().sum::<u64>(),
            ..st.books.census()
        }
    }

    /// True when the device only tracks addresses ([`HostDeviceBuilder::simulated`]).
    pub fn is_simulated(&self) -> bool {
        self.simulated
    }

    /// The capacity in bytes (also [`DeviceInfo::total_bytes`]).
    pub fn capacity(&self) -> u64 {
        self.info.total_bytes
    }

    /// A test hook for stream ordering. While held, events recorded from now on stay
    /// incomplete ([`Device::event_complete`] is false) until [`HostDevice::complete_held_events`]
    /// is called, events are released with `set_events_held(false)` (which completes every
    /// pending event), or [`Device::synchronize_event`] / [`Device::synchronize_stream`]
    /// waits on them. Frees into the stream-ordered pool made while held are pending the
    /// same way (reusable only on their own stream until completed).
    pub fn set_events_held(&self, held: bool) {
        self.lock().timeline.set_held(held);
    }

    /// Completes every event held by [`HostDevice::set_events_held`] (and every pending
    /// pool free, and every kernel in flight); returns how many events were pending. Events
    /// recorded later are still held while the hold is on.
    pub fn complete_held_events(&self) -> usize {
        self.lock().timeline.release_all()
    }

    /// A test hook: a kernel on `stream` that uses `[va, va + size)`, in flight — holding
    /// back the work queued after it on its stream — until [`HostDevice::finish`] or a CPU
    /// wait that covers it. Returns its id (never 0).
    pub fn launch(&self, stream: Stream, va: u64, size: u64) -> u64 {
        self.lock().timeline.launch(stream, va, size)
    }

    /// A test hook: marks `stream` (any handle) as being captured into a graph, under a new
    /// capture id, until [`HostDevice::end_capture`]; [`Device::capture_status`] answers
    /// [`CaptureStatus::Active`] for it meanwhile. The host runs nothing on any stream, so
    /// this models which streams capture — what graph pools route by — not what a capture
    /// forbids or how a graph replays (the conformance drivers model those). Returns the id.
    pub fn begin_capture(&self, stream: Stream) -> u64 {
        let mut st = self.lock();
        st.streams.last_capture += 1;
        let id = st.streams.last_capture;
        st.streams.captured.insert(stream.0, id);
        id
    }

    /// A test hook: ends the capture [`HostDevice::begin_capture`] began on `stream`; false
    /// when it was not captured.
    pub fn end_capture(&self, stream: Stream) -> bool {
        self.lock().streams.captured.remove(&stream.0).is_some()
    }

    /// A test hook: kernel `work` ([`HostDevice::launch`]) completes.
    pub fn finish(&self, work: u64) {
        self.lock().timeline.finish(work);
    }

    /// A test hook: whether kernel `work` completed (`None` for an unknown id).
    pub fn kernel_done(&self, work: u64) -> Option<bool> {
        self.lock().timeline.kernel_done(work)
    }

    /// A test hook: whether work queued on `stream` (on the calling thread) from now on
    /// runs after kernel `work`: the kernel completed, `stream` is its own stream, or
    /// `stream` waits — through [`Device::wait_event`], directly or through other streams'
    /// waits — for an event recorded after it on its stream. `None` for an unknown id.
    pub fn ordered(&self, work: u64, stream: Stream) -> Option<bool> {
        self.lock().timeline.ordered(work, stream)
    }

    /// A test hook: how many times memory was freed or unmapped while a kernel in flight
    /// used it (undefined behaviour on a GPU), and the first few as text.
    pub fn hazards(&self) -> (u64, Vec<String>) {
        self.lock().timeline.hazards()
    }

    /// A test hook: CPU waits so far (stream, event and device synchronisations, each call)
    /// and GPU-side waits ([`Device::wait_event`] calls).
    pub fn cpu_waits(&self) -> (u64, u64) {
        self.lock().timeline.waits_counted()
    }

    /// The peers granted access to the granule holding `va` by
    /// [`VirtualMemory::set_access_with_peers`] (and not unmapped since), ascending.
    pub fn peer_access_at(&self, va: u64) -> Vec<u32> {
        let granule = va & !(self.granularity - 1);
        self.lock()
            .peer_grants
            .get(&granule)
            .map(|p| p.iter().copied().collect())
            .unwrap_or_default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every operation checks before it changes anything, so the books are consistent
        // even if a holder panicked.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Device::alloc`] under the lock (also how the pool takes its segments).
    fn alloc_in(&self, books: &mut Books, sim: &mut Option<SimSpace>, size: u64) -> Result<u64> {
        let charge = books.check_alloc(size)?;
        let len = self.mapped_len(size)?;
        let oom = |free| Error::DeviceOutOfMemory {
            backend: BACKEND,
            requested: size,
            free,
        };
        let ptr = match sim {
            Some(space) => space
                .take(len, self.page)
                .ok_or_else(|| oom(books.free_bytes()))?,
            None => os::map_anonymous(len).map_err(|e| match e {
                Error::Os { ref source, .. } if source.raw_os_error() == Some(libc::ENOMEM) => {
                    oom(books.free_bytes())
                }
                other => other,
            })?,
        };
        books.insert_alloc(ptr, size, charge);
        Ok(ptr)
    }

    /// [`Device::free`] under the lock.
    fn free_in(
        &self,
        books: &mut Books,
        sim: &mut Option<SimSpace>,
        timeline: &mut Timeline,
        (ptr, size): (u64, u64),
        what: &str,
    ) -> Result<()> {
        books.check_free(ptr, size)?;
        timeline.check_unused(ptr, size, what);
        match sim {
            Some(space) => {
                space.give(ptr);
            }
            None => os::unmap(ptr, self.mapped_len(size)?)?,
        }
        books.remove_alloc(ptr);
        Ok(())
    }

    /// The length mapped for an allocation of `size` bytes: whole pages.
    fn mapped_len(&self, size: u64) -> Result<u64> {
        size.checked_next_multiple_of(self.page)
            .ok_or(Error::InvalidSize {
                size,
                reason: "too large: rounding it up to whole pages overflows",
            })
    }

    /// The checks of a copy (`call`, `size` > 0) between device memory `[va, va + size)` and
    /// host memory at `host` (`what` names it: `dst`, `src`): the host side non-null, the
    /// device side mapped with access or inside one allocation, and — in real mode, where
    /// device memory is host memory — the two apart. Returns the size as a `usize` and the
    /// device address as a pointer value.
    fn check_copy(
        &self,
        books: &Books,
        call: &'static str,
        (va, host, what): (u64, usize, &str),
        size: u64,
    ) -> Result<(usize, usize)> {
        let n = super::host_range(call, what, host, size)?;
        books
            .check_copy_mapped(call, va, size)
            .or_else(|| books.check_copy_allocated(call, va, size))
            .unwrap_or(Err(Error::UnknownPointer {
                what: "device memory",
                ptr: va,
                backend: BACKEND,
            }))?;
        // Inside a mapping or an allocation of this process's address space: it fits a usize.
        let device = usize::try_from(va).map_err(|_| Error::InvalidArgument {
            call,
            reason: format!("device address {va:#x} does not fit this machine's address width"),
        })?;
        if !self.simulated && host < device + n && device < host + n {
            return Err(Error::InvalidArgument {
                call,
                reason: format!(
                    "host memory {what} = {host:#x} overlaps the device memory [{va:#x}, \
                     +{size}) it is copied with; accepted are two apart"
                ),
            });
        }
        Ok((n, device))
    }
}

impl Device for HostDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Free = capacity − bytes charged; total = capacity. Never fails.
    fn mem_info(&self) -> Result<MemInfo> {
        let st = self.lock();
        Ok(MemInfo {
            free: st.books.free_bytes(),
            total: st.books.capacity(),
        })
    }

    /// Allocates `size` bytes, page-aligned, charging `size` rounded up to 256 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidSize`] for zero (or a size too large to round);
    /// [`Error::DeviceOutOfMemory`] past the capacity, or when the system refuses the memory
    /// (`ENOMEM`); [`Error::Os`] for another system failure.
    fn alloc(&self, size: u64) -> Result<u64> {
        let mut guard = self.lock();
        let st = &mut *guard;
        self.alloc_in(&mut st.books, &mut st.sim, size)
    }

    /// Frees an allocation; `size` must be the size it was made with.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "allocation"`) for a pointer not allocated here,
    /// freed already, or backing the stream-ordered pool; [`Error::InvalidArgument`] for the
    /// wrong size; [`Error::Os`] when `munmap` fails.
    fn free(&self, ptr: u64, size: u64) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.pool.is_segment(ptr) || st.opened_ipc.contains_key(&ptr) {
            // Pool memory goes back through the pool (free_async, trim_to), as with cuMemFree;
            // another process's memory opened here through close_ipc_handle.
            return Err(Error::UnknownPointer {
                what: "allocation",
                ptr,
                backend: BACKEND,
            });
        }
        self.free_in(
            &mut st.books,
            &mut st.sim,
            &mut st.timeline,
            (ptr, size),
            "a device free",
        )?;
        // The memory file an export put behind it goes with it (an importer's mapping keeps
        // the file's pages, as the kernel keeps them).
        st.exported_plain.remove(&ptr);
        Ok(())
    }

    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }

    fn stream_ordered_pool(&self) -> Option<&dyn StreamOrderedPool> {
        Some(self)
    }

    fn interprocess(&self) -> Option<&dyn crate::device::Interprocess> {
        Some(self)
    }

    /// A fresh stream id (from `0x100` up, never reused).
    ///
    /// # Errors
    /// None in practice.
    fn create_stream(&self) -> Result<Stream> {
        let mut st = self.lock();
        st.streams.last += 1;
        let id = FIRST_STREAM_ID + st.streams.last;
        st.streams.live.insert(id);
        Ok(Stream(id))
    }

    /// Forgets a stream. Events recorded on it keep their state, and the work queued on it
    /// still completes.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "stream"`) for a stream not created here (or
    /// destroyed already); [`Error::InvalidArgument`] for [`Stream::DEFAULT`].
    ///
    /// # Safety
    /// None needed here (streams are numbers this device only compares); the trait's
    /// contract is for the drivers.
    #[allow(unsafe_code)]
    unsafe fn destroy_stream(&self, stream: Stream) -> Result<()> {
        if stream == Stream::DEFAULT {
            return Err(Error::InvalidArgument {
                call: "destroy_stream",
                reason: "the default stream cannot be destroyed; accepted are streams from \
                         create_stream"
                    .into(),
            });
        }
        let mut st = self.lock();
        if !st.streams.live.remove(&stream.0) {
            return Err(Error::UnknownPointer {
                what: "stream",
                ptr: stream.0,
                backend: BACKEND,
            });
        }
        Ok(())
    }

    /// A CPU wait: completes the work queued on `stream` (on the legacy default stream, on
    /// every stream) and the pool frees pending on it; then the pool returns idle memory
    /// beyond its release threshold to the device. Any stream handle is accepted.
    ///
    /// # Errors
    /// [`Error::Os`] when returning pool memory fails.
    fn synchronize_stream(&self, stream: Stream) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.timeline.synchronize_stream(stream);
        let keep = st.pool.threshold();
        self.pool_release(st, keep)
    }

    /// A CPU wait for every stream (pool frees included); then the pool returns idle memory
    /// beyond its release threshold.
    ///
    /// # Errors
    /// [`Error::Os`] when returning pool memory fails.
    fn synchronize_device(&self) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.timeline.synchronize_device();
        let keep = st.pool.threshold();
        self.pool_release(st, keep)
    }

    /// A fresh event id (never 0, never reused); complete until recorded.
    ///
    /// # Errors
    /// None in practice.
    fn create_event(&self) -> Result<Event> {
        Ok(self.lock().timeline.create_event())
    }

    /// Records `event` on `stream` (any stream handle): complete once the work queued on
    /// `stream` before it is (at once, unless something holds it back). Events on one stream
    /// complete in order.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "event"`) for an unknown event.
    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        let mut st = self.lock();
        event_record(&st, event)?;
        st.timeline.record(event, stream);
        Ok(())
    }

    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "event"`) for an unknown event.
    fn event_complete(&self, event: Event) -> Result<bool> {
        let st = self.lock();
        let record = event_record(&st, event)?;
        Ok(st.timeline.is_complete(record))
    }

    /// A CPU wait: completes the event (a held one too) and the work queued before it on its
    /// stream, kernels included.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "event"`) for an unknown event.
    fn synchronize_event(&self, event: Event) -> Result<()> {
        let mut st = self.lock();
        let record = event_record(&st, event)?;
        st.timeline.synchronize_event(record);
        Ok(())
    }

    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "event"`) for an unknown event.
    fn destroy_event(&self, event: Event) -> Result<()> {
        let mut st = self.lock();
        event_record(&st, event)?;
        st.timeline.destroy_event(event);
        Ok(())
    }

    /// Work queued on `stream` from now on completes only after the work before the event's
    /// last record: a GPU-side wait, as `cuStreamWaitEvent`.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "event"`) for an unknown event.
    /// Active for a stream [`HostDevice::begin_capture`] marked, else none.
    fn capture_status(&self, stream: Stream) -> Result<CaptureStatus> {
        Ok(match self.lock().streams.captured.get(&stream.0) {
            Some(&id) => CaptureStatus::Active { id },
            None => CaptureStatus::None,
        })
    }

    fn wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        let mut st = self.lock();
        let record = event_record(&st, event)?;
        st.timeline.wait(stream, record);
        Ok(())
    }

    /// Host devices share one address space: every host device can access every other one
    /// (of another ordinal); none is its own peer.
    fn can_access_peer(&self, peer: &dyn Device) -> Result<bool> {
        let same = std::ptr::addr_eq(self as *const Self, peer as *const dyn Device);
        Ok(!same
            && peer.info().vendor == crate::Vendor::Host
            && peer.info().ordinal != self.info.ordinal)
    }

    /// Records `peer` (nothing else to do: one address space).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a device that is not another host device.
    fn enable_peer_access(&self, peer: &dyn Device) -> Result<()> {
        if !self.can_access_peer(peer)? {
            return Err(self.peer_access_refusal(peer));
        }
        self.lock().peers.insert(peer.info().ordinal);
        Ok(())
    }

    fn peer_access_refusal(&self, peer: &dyn Device) -> Error {
        Error::Unsupported {
            what: "peer access".into(),
            backend: BACKEND,
            reason: format!(
                "host device {} can access other host devices only, not device {} of {} \
                 (nor itself)",
                self.info.ordinal,
                peer.info().ordinal,
                peer.info().vendor
            ),
        }
    }

    fn peer_access(&self) -> Vec<u32> {
        self.lock().peers.iter().copied().collect()
    }
    /// Checks the ranges (see the module docs), copies the bytes at once under the device's
    /// lock (simulated mode: none) and queues the copy on `stream`'s clock, where it completes
    /// in stream order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a null or wrapping `dst`, a device range that is not
    /// mapped with access, runs past its allocation or reservation, or overlaps `dst`;
    /// [`Error::UnknownPointer`] (`what = "device memory"`) for a range in no reservation or
    /// allocation of this device.
    ///
    /// # Safety
    /// As [`Device::copy_to_host`]; the device side is checked here (a bad range is refused,
    /// never touched).
    #[allow(unsafe_code)]
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, size: u64, stream: Stream) -> Result<()> {
        if size == 0 {
            return Ok(());
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        let host = dst as usize;
        let (n, device) = self.check_copy(&st.books, "copy_to_host", (src, host, "dst"), size)?;
        if st.sim.is_none() {
            // SAFETY: `[device, device + n)` is this device's memory, mapped readable (access
            // granted) or a live allocation, checked just above, and stays so while the lock is
            // held (unmap and free take it); the caller guarantees `dst` is valid for `n`
            // bytes of writes, and the two ranges are apart (checked).
            unsafe { std::ptr::copy_nonoverlapping(device as *const u8, dst, n) };
        }
        st.timeline.copy_on(stream, src, host as u64, size);
        Ok(())
    }

    /// As [`HostDevice::copy_to_host`](Device::copy_to_host), from `src` to device memory.
    ///
    /// # Errors
    /// As `copy_to_host`, for a null `src`.
    ///
    /// # Safety
    /// As [`Device::copy_from_host`]; the device side is checked here.
    #[allow(unsafe_code)]
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
        let mut guard = self.lock();
        let st = &mut *guard;
        let host = src as usize;
        let (n, device) = self.check_copy(&st.books, "copy_from_host", (dst, host, "src"), size)?;
        if st.sim.is_none() {
            // SAFETY: `[device, device + n)` is this device's memory, mapped writable (access
            // granted) or a live allocation, checked just above, and stays so while the lock is
            // held; the caller guarantees `src` is valid for `n` bytes of reads, and the two
            // ranges are apart (checked).
            unsafe { std::ptr::copy_nonoverlapping(src, device as *mut u8, n) };
        }
        st.timeline.copy_on(stream, dst, host as u64, size);
        Ok(())
    }

    /// An anonymous private mapping of whole pages (not locked: the host needs no DMA),
    /// counted in [`HostCensus::pinned_host`]; `Ok(None)` in simulated mode.
    ///
    /// # Errors
    /// [`Error::InvalidSize`] for zero (or a size too large to round to pages);
    /// [`Error::Os`] when `mmap` fails.
    fn alloc_pinned_host(&self, size: u64) -> Result<Option<std::ptr::NonNull<u8>>> {
        super::request_size(size, 1, super::Request::PinnedHost)?;
        if self.simulated {
            return Ok(None);
        }
        let len = self.mapped_len(size)?;
        // Made present outside the lock: populating gigabytes takes a while.
        let ptr = os::map_anonymous_populated(len)?;
        self.lock().pinned.insert(ptr, size);
        Ok(std::ptr::NonNull::new(ptr as usize as *mut u8))
    }

    /// Unmaps memory from [`Device::alloc_pinned_host`]. Freeing it while a copy using it is
    /// still in flight is recorded as a hazard ([`HostDevice::hazards`]).
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "pinned host memory"`) for memory not from this
    /// device (or freed already); [`Error::InvalidArgument`] for the wrong size;
    /// [`Error::Os`] when `munmap` fails.
    ///
    /// # Safety
    /// As [`Device::free_pinned_host`].
    #[allow(unsafe_code)]
    unsafe fn free_pinned_host(&self, ptr: std::ptr::NonNull<u8>, size: u64) -> Result<()> {
        let addr = ptr.as_ptr() as usize as u64;
        let mut guard = self.lock();
        let st = &mut *guard;
        match st.pinned.get(&addr) {
            None => {
                return Err(Error::UnknownPointer {
                    what: "pinned host memory",
                    ptr: addr,
                    backend: BACKEND,
                })
            }
            Some(&held) if held != size => {
                return Err(Error::InvalidArgument {
                    call: "free_pinned_host",
                    reason: format!(
                        "pinned host memory {addr:#x} was allocated with {held} bytes, not \
                         {size}; accepted is the size it was allocated with"
                    ),
                })
            }
            Some(_) => {}
        }
        st.timeline
            .check_unused(addr, size, "a free of pinned host memory");
        os::unmap(addr, self.mapped_len(size)?)?;
        st.pinned.remove(&addr);
        Ok(())
    }

    /// Records the range as registered, in real and simulated mode alike, and returns
    /// `Ok(true)`: the host needs no DMA, so nothing is locked or touched (as its pinned
    /// memory is not locked). Counted in [`HostCensus::pinned_host`] until
    /// [`Device::unregister_host`].
    ///
    /// # Errors
    /// [`Error::InvalidSize`] for zero; [`Error::InvalidArgument`] for a range that overlaps
    /// one registered already (as `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`).
    ///
    /// # Safety
    /// As [`Device::register_host`].
    #[allow(unsafe_code)]
    unsafe fn register_host(&self, ptr: std::ptr::NonNull<u8>, size: u64) -> Result<bool> {
        super::request_size(size, 1, super::Request::PinnedHost)?;
        let addr = ptr.as_ptr() as usize as u64;
        let mut st = self.lock();
        let overlaps = st
            .registered
            .range(..addr.saturating_add(size))
            .next_back()
            .is_some_and(|(&a, &n)| addr < a + n);
        if overlaps {
            return Err(Error::InvalidArgument {
                call: "register_host",
                reason: format!(
                    "host memory {addr:#x}+{size} overlaps memory registered already; accepted \
                     is memory not registered"
                ),
            });
        }
        st.registered.insert(addr, size);
        Ok(true)
    }

    /// Forgets a registration. Unregistering memory a copy not yet complete uses is recorded
    /// as a hazard ([`HostDevice::hazards`]).
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "registered host memory"`) for memory not
    /// registered here; [`Error::InvalidArgument`] for the wrong size.
    ///
    /// # Safety
    /// As [`Device::unregister_host`].
    #[allow(unsafe_code)]
    unsafe fn unregister_host(&self, ptr: std::ptr::NonNull<u8>, size: u64) -> Result<()> {
        let addr = ptr.as_ptr() as usize as u64;
        let mut guard = self.lock();
        let st = &mut *guard;
        match st.registered.get(&addr) {
            None => {
                return Err(Error::UnknownPointer {
                    what: "registered host memory",
                    ptr: addr,
                    backend: BACKEND,
                })
            }
            Some(&held) if held != size => {
                return Err(Error::InvalidArgument {
                    call: "unregister_host",
                    reason: format!(
                        "host memory {addr:#x} was registered with {held} bytes, not {size}; \
                         accepted is the size it was registered with"
                    ),
                })
            }
            Some(_) => {}
        }
        st.timeline
            .check_unused(addr, size, "an unregistration of host memory");
        st.registered.remove(&addr);
        Ok(())
    }
}

impl VirtualMemory for HostDevice {
    fn granularity(&self) -> u64 {
        self.granularity
    }

    /// Reserves inaccessible address space, committing no memory.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size that is not a non-zero multiple of the
    /// granularity or an alignment that is not 0 or a power of two; [`Error::Os`] when the
    /// address space is exhausted (`ENOMEM`) or `mmap` fails.
    fn reserve(&self, size: u64, alignment: u64) -> Result<u64> {
        self.reserve_at(size, alignment, 0)
    }

    /// As [`VirtualMemory::reserve`], at `addr` when that range is free (0: anywhere): in
    /// real mode `mmap` with `MAP_FIXED_NOREPLACE` (a plain hint on a kernel without it),
    /// which never replaces a mapping; simulated, the books give the range when it is free.
    /// Otherwise — the range overlaps a reservation or other memory, or `addr` is not a
    /// multiple of the alignment — the reservation is made elsewhere, as `reserve` makes it:
    /// the caller compares the address returned with its hint.
    ///
    /// # Errors
    /// As `reserve`; [`Error::InvalidArgument`] for an address that is not a multiple of the
    /// granularity.
    fn reserve_at(&self, size: u64, alignment: u64, addr: u64) -> Result<u64> {
        let mut guard = self.lock();
        let st = &mut *guard;
        let align = st.books.check_reserve(size, alignment)?;
        let hint = st.books.check_reserve_hint(size, align, addr)?;
        let va = match (&mut st.sim, hint) {
            (Some(space), hint) => hint
                .filter(|&at| space.take_at(at, size))
                .or_else(|| space.take(size, align))
                .ok_or_else(|| no_address_space("mmap"))?,
            (None, Some(at)) => os::reserve_at(size, align, self.page, at)?,
            (None, None) => os::reserve(size, align, self.page)?,
        };
        st.books.insert_reservation(va, size);
        Ok(va)
    }

    /// Frees a whole reservation with nothing mapped in it.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "reservation"`) when no reservation starts at `va`;
    /// [`Error::InvalidArgument`] when `size` is not its size or something is mapped in it;
    /// [`Error::Os`] when `munmap` fails.
    fn free_reservation(&self, va: u64, size: u64) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.books.check_free_reservation(va, size)?;
        match &mut st.sim {
            Some(space) => {
                space.give(va);
            }
            None => os::unmap(va, size)?,
        }
        st.books.remove_reservation(va);
        Ok(())
    }

    /// Creates physical memory (a memory file; pages are used when first touched) and
    /// charges `size` against the capacity.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size that is not a non-zero multiple of the
    /// granularity; [`Error::DeviceOutOfMemory`] past the capacity; [`Error::Os`] when
    /// `memfd_create` or `ftruncate` fails.
    fn create_physical(&self, size: u64) -> Result<PhysicalHandle> {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.books.check_create(size)?;
        let fd = match st.sim {
            Some(_) => None,
            None => Some(os::create_memory_file(size)?),
        };
        Ok(st.books.insert_handle(size, fd))
    }

    /// Releases a handle. If it is still mapped, its memory and capacity come back when the
    /// last mapping is unmapped.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "physical handle"`) for a handle not made here or
    /// released already.
    fn release_physical(&self, handle: PhysicalHandle) -> Result<()> {
        self.lock().books.release(handle)
    }

    /// Maps `[offset, offset + size)` of `handle` at `va`, without access.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a misaligned or zero argument, a range past the end of
    /// the handle, not inside one reservation, or overlapping a mapping;
    /// [`Error::UnknownPointer`] (`what = "physical handle"`) for an unknown or released
    /// handle; [`Error::Os`] when `mmap` fails.
    fn map(&self, va: u64, size: u64, handle: PhysicalHandle, offset: u64) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        let real = st.sim.is_none();
        st.books
            .map(va, size, handle, offset, |fd| match (real, fd) {
                (false, _) => Ok(()),
                (true, Some(fd)) => os::map_file_fixed(va, size, fd, offset),
                (true, None) => Err(Error::Os {
                    call: "mmap",
                    source: std::io::Error::from_raw_os_error(libc::EBADF),
                }),
            })
    }

    /// Grants read-write access to `[va, va + size)`, which must be entirely mapped (it may
    /// span several mappings, or part of one).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a misaligned or zero argument or a range not entirely
    /// mapped; [`Error::Os`] when `mprotect` fails.
    fn set_access(&self, va: u64, size: u64) -> Result<()> {
        let mut st = self.lock();
        st.books.check_set_access(va, size)?;
        if st.sim.is_none() {
            os::protect_rw(va, size)?;
        }
        st.books.grant_access(va, size);
        Ok(())
    }

    /// As [`VirtualMemory::set_access`], and records that `peers` were granted access too
    /// ([`HostDevice::peer_access_at`]).
    ///
    /// # Errors
    /// As `set_access`; [`Error::InvalidArgument`] for a peer peer access was not enabled to.
    fn set_access_with_peers(&self, va: u64, size: u64, peers: &[u32]) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(p) = peers.iter().find(|p| !st.peers.contains(p)) {
            return Err(Error::InvalidArgument {
                call: "set_access_with_peers",
                reason: format!(
                    "peer access to host device {p} is not enabled on device {}; accepted are \
                     the devices enable_peer_access was called with ({:?})",
                    self.info.ordinal, st.peers
                ),
            });
        }
        st.books.check_set_access(va, size)?;
        if st.sim.is_none() {
            os::protect_rw(va, size)?;
        }
        st.books.grant_access(va, size);
        if !peers.is_empty() {
            for g in (va..va + size).step_by(self.granularity as usize) {
                st.peer_grants.entry(g).or_default().extend(peers);
            }
        }
        Ok(())
    }

    /// Unmaps `[va, va + size)`, which must be exactly a run of whole mappings; the range
    /// stays reserved. A released handle whose last mapping goes is freed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a misaligned or zero argument, a range not mapped, or
    /// one that would split a mapping; [`Error::Os`] when `mmap` fails.
    fn unmap(&self, va: u64, size: u64) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        st.books.check_unmap(va, size)?;
        st.timeline.check_unused(va, size, "unmap");
        if st.sim.is_none() {
            os::rereserve(va, size)?;
        }
        st.books.remove_mappings(va, size);
        if !st.peer_grants.is_empty() {
            let gone: Vec<u64> = st
                .peer_grants
                .range(va..va + size)
                .map(|(&g, _)| g)
                .collect();
            for g in gone {
                st.peer_grants.remove(&g);
            }
        }
        Ok(())
    }
}

impl Drop for HostDevice {
    fn drop(&mut self) {
        let page = self.page;
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        let real = st.sim.is_none();
        let streams = st.streams.live.len();
        let events = st.timeline.event_count();
        let left = st.books.take_all();
        let pinned = std::mem::take(&mut st.pinned);
        // Registered memory is its owner's: only forgotten.
        let registered = std::mem::take(&mut st.registered).len();
        if real {
            for (&ptr, &size) in &pinned {
                let Some(len) = size.checked_next_multiple_of(page) else {
                    continue;
                };
                if let Err(e) = os::unmap(ptr, len) {
                    tracing::warn!(ptr, size, error = %e, "could not unmap leaked pinned host memory");
                }
            }
            for &(ptr, size) in &left.allocations {
                let Some(len) = size.checked_next_multiple_of(page) else {
                    continue;
                };
                if let Err(e) = os::unmap(ptr, len) {
                    tracing::warn!(ptr, size, error = %e, "could not unmap a leaked allocation");
                }
            }
            // Unmapping a whole reservation also removes every mapping inside it.
            for &(va, size) in &left.reservations {
                if let Err(e) = os::unmap(va, size) {
                    tracing::warn!(va, size, error = %e, "could not free a leaked reservation");
                }
            }
        }
        let leaked = !left.allocations.is_empty()
            || !left.reservations.is_empty()
            || !pinned.is_empty()
            || registered > 0
            || left.mappings + left.handles + left.released_mapped + streams + events > 0;
        if leaked {
            tracing::warn!(
                device = %self.info.name,
                allocations = left.allocations.len(),
                reservations = left.reservations.len(),
                mappings = left.mappings,
                physical_handles = left.handles,
                released_but_mapped = left.released_mapped,
                bytes = left.bytes,
                streams,
                events,
                pinned_host = pinned.len(),
                registered_host = registered,
                "host device dropped while still holding these; returned them"
            );
        }
    }
}
