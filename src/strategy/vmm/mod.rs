//! The `vmm` strategy: one large reserved address range, physical memory mapped into it
//! granule by granule on demand, best-fit sub-allocation inside — and free space that *is*
//! contiguous across granule boundaries, so there is no cross-region fragmentation.
//!
//! # Design
//!
//! **Address space.** At the first allocation the allocator reserves one range of
//! `2 × limit + 1 GiB` (rounded to the granularity; [`VmmOptions::reservation`] overrides
//! it). Reservations cost no memory. When no free range fits a request (the space is
//! fragmented, or the request is larger than what is left) another reservation is made; free
//! chunks never coalesce across reservations.
//!
//! **Placement** ([`space`]). Best fit over the free chunks of the address space, split to the
//! request (256-byte units) — except a remainder of at most an eighth of the request that lies
//! inside a granule the request touches anyway: that one goes with the allocation (see
//! *Where this differs from bfc*). Requests below [`VmmOptions::small_threshold`] (2 MiB by
//! default) are placed at the *low* end of the chosen chunk (lowest address among equal
//! sizes), larger ones at its *high* end (highest address among equal sizes): small and large
//! allocations grow towards each other from the two ends of a reservation, so small
//! long-lived blocks are packed together in few granules instead of pinning granules between
//! large ones. When memory is short, placement looks further: every free chunk (its start and
//! its end) is tried, and the place needing the fewest new granules wins.
//!
//! **Physical memory.** Every granule under a chunk in use is mapped. A granule is mapped by
//! its own mapping (one `map` per granule), so any granule can be unmapped alone; the
//! allocator keeps `granule → (handle, offset)` so it unmaps and remaps exactly. Physical
//! memory comes, in this order (see *Quiet and frugal*), from
//!
//! 1. *idle* granules: pieces of handles held but not mapped (no creation, one `map`);
//! 2. new handles, up to [`GROWTH_SLACK`] (a sixteenth) over the peak of the bytes in use;
//! 3. **stitching**: whole free granules mapped elsewhere (scattered between live
//!    allocations) are unmapped and their physical memory mapped under the request — an
//!    `unmap` and a `map` per granule instead of asking the device for more (GMLake's idea).
//!    [`VmmCounters::stitches`] counts the allocations served so;
//! 4. new handles, within the budget, while the device gives them.
//!
//! Where the driver holds released memory (*Memory the driver holds*) and the best fit needs
//! granules mapped, the first [`MAPPED_SEARCH`] places in best-fit order are looked at first,
//! and a place on mapped granules (or needing the fewest) is taken instead: memory freed in
//! any segment serves before memory is made (pinned by its segment) or borrowed.
//!
//! **Quiet and frugal.** A repeating program (a training step, a decode loop) asks for the
//! same sizes in the same order each step, so best fit puts each request where the same
//! request went the step before. Memory moved there by stitching is moved back and forth
//! every step — an unmap and a map per granule, a device synchronisation per unmap on ROCm
//! (ROCm/rocm-systems#6982) — while memory made there stays: the built-in GPT-2-small
//! training workload made ~476 unmaps and maps a step when stitching came first, and makes
//! none from its third step now, for 2.4% more memory than its peak live. Growth is
//! bounded, though: beyond a sixteenth over the peak live, free memory is moved rather than
//! more made, and more is made beyond it only when nothing free is left to move — granules
//! that live allocations share or fill in part are memory no moving frees (3 MiB buffers with
//! every other one freed and 4 MiB ones put in their place hold 1.17 × their peak live). The
//! smallest device a workload runs on is unchanged (where the budget binds, stitching serves
//! as before). When the **device** refuses new memory (another tenant took it), stitching,
//! borrowing across segments and freeing idle segments come before a refusal, and the wait
//! for memory freed under work in flight after them; a refusal says what the device has free.
//!
//! The books of all this (`physical`) are arrays indexed by granule, one set per
//! reservation, made a page of 1024 granules at a time where granules are used: each
//! granule's backing and the number of chunks in use on it, and bitmaps of the mapped, free
//! and access-less granules with their counts kept, so a request's granules cost a few word
//! operations and stitching finds its victims (the free mapped granules outside the request,
//! in address order) without scanning what is in use.
//!
//! Freeing unmaps nothing: free granules stay mapped (and are reused in place at no cost)
//! until a request needs their memory elsewhere, or [`Allocator::trim`]. The physical
//! memory held therefore never exceeds the most granules that live allocations touched at
//! once (plus what was needed to place them), and the budget is never exceeded.
//!
//! **Chunk-size policy** (handles). Creating a handle costs a driver call and the driver's
//! bookkeeping grows with the number of handles, so a request smaller than the small
//! threshold gets one-granule handles (2 MiB on GPUs, as PyTorch's small pool), and a larger
//! request gets handles of up to [`LARGE_HANDLE_GRANULES`] granules (20 MiB at 2 MiB
//! granularity, as PyTorch's expandable segments); a wake's piece that still lacks a whole
//! copy piece ([`VmmOptions::copy_piece`], 256 MiB) gets a handle of the piece, as vLLM's ROCm
//! sleep allocator makes (8 GiB woken in 32 `cuMemCreate`s rather than 416, at some 130–170 µs
//! each) — a wake's only: a trim after stitching would keep such a handle whole for one
//! granule. Granules are still mapped one by one, so
//! a big handle can be split between places; a handle is released only when none of its
//! granules is mapped ([`Allocator::trim`] and drop).
//!
//! **Peers.** Access to every granule mapped is granted to this device and to the peer
//! devices in [`VmmAllocator::peers`] — those the device reported in
//! [`Device::peer_access`] when the allocator was made (`Portalloc` enables peer access
//! between the devices it found before building the allocators) and those added later with
//! [`VmmAllocator::add_peer`], which grants them what is mapped already — in one
//! [`VirtualMemory::set_access_with_peers`] call per run of granules.
//!
//! **Budget.** Physical bytes held (all handles, mapped or idle) = `pool_bytes` ≤
//! `limit = fraction × total`; `peak_pool_bytes` is their high-water mark. Nothing is
//! preallocated (as XLA's vmm allocator).
//!
//! # Where this differs from bfc
//!
//! * Chunks are split to the request: a remainder handed out with a chunk could hold
//!   physical memory nobody could use. The exception is a remainder that cannot: at most an
//!   eighth of the request ([`space::FOLD_PART`]) and wholly inside the granule of the
//!   request's nearest byte (a remainder below moves the request down onto the chunk's
//!   start, where that start is aligned at least as well). As free chunks such slivers were
//!   most of the free index's work in a steady churn — best fit leaves them at the low
//!   addresses it prefers, each moved through its class and merged again at the next free —
//!   for ranges few requests fit: folding them made the steady churn bench's pairs about a
//!   third cheaper, for about one point of its utilisation and a few thousandths of the
//!   real traces' smallest device. [`Allocator::charged`] and `bytes_in_use` count the
//!   folded bytes, as bfc's count its unsplit chunks; a sleep copies them with the
//!   allocation.
//! * Alignment up to [`MAX_ALIGNMENT`] (1 GiB), as bfc.
//! * `bytes_reserved` is 0: address space is not memory.
//! * Large requests are placed from the *top* of the reservation, not at the lowest free
//!   address; small ones from the bottom (see Placement).
//!
//! # Streams
//!
//! The stream-ordering contract of [`Device`] is kept by the module bfc uses too
//! (`strategy::stream_order`). While every request has come on one stream, a free goes
//! straight back to the address space and no event is made: the single-stream path costs one
//! comparison. From the first request on a second stream on:
//!
//! * a chunk freed on stream `S` is kept **pending**: still in use in the address space (so
//!   it coalesces with nothing and no other stream is handed it) and still counted on its
//!   granules — so a granule under a pending chunk is never stitched away, unmapped or
//!   trimmed — with an event recorded on `S` at the free (events come from a small pool of
//!   [`EVENT_POOL`] and are reused);
//! * a request on `S` may reuse a chunk pending on `S`'s handle behind a GPU-side wait for
//!   its event (on the same stream the wait is already met; on a stream that was given a
//!   destroyed stream's handle value it is the order): the smallest that holds it (then the
//!   lowest address), the request placed at its start (small) or end (large) as in a free
//!   chunk, and only a chunk of the request's own class (a tag that can sleep shares no
//!   granule); what is left of it stays pending under the same event;
//! * every allocation first polls the pending frees (events on one stream complete in order)
//!   and returns completed ones to the free space, coalescing them;
//! * before mapping more granules (idle, stitched or new), reserving more address space or
//!   reporting out-of-memory, all pending frees are waited for and the chunks returned,
//!   rather than taking memory while memory is only waiting; [`Allocator::trim`] waits for
//!   the work on all freed memory before it unmaps anything;
//! * at the switch, if anything was freed on the first stream (without an event), a *fence*
//!   event is recorded there, and every request served from the free space waits for it on
//!   the GPU until it completes; granules under such frees are stitched or unmapped only once
//!   a fence covering them completed;
//! * streams are the caller's: when no event can be recorded on `S`, `S` is synchronised
//!   (then the device) and the chunk freed at once; if nothing can be waited for, the chunk
//!   stays pending until the device can be — a refusal is never taken for "idle". (See
//!   `strategy::stream_order`'s *Stream handles* for what is never trusted about a handle.)
//!
//! Pending chunks are not counted in `bytes_in_use` or [`VmmAllocator::live_count`];
//! [`VmmAllocator::pending_frees`] counts them. The per-bin summaries and region maps of an
//! OOM report show them as in use.
//!
//! # Placement rules kept out
//!
//! Tried and worse on the real traces (utilisation, peak live ÷ peak physical held, and the
//! smallest device that serves them, as the test `real_traces_figures` prints them):
//! separate reservations for small and large requests ([`VmmOptions::segregate`]), always
//! choosing the place that adds the fewest untouched granules, address-ordered first fit,
//! granule-aligning large requests.
#![deny(unsafe_code)]

mod physical;
mod sleep;
pub mod space;
mod streams;

use std::sync::{Arc, Mutex, MutexGuard};

use rustc_hash::FxHashMap;

use crate::allocator::{
    next_allocator_id, round_up, Allocation, Allocator, Keep, SleepReport, SleepingTag, Stats,
};
use crate::device::{Device, PhysicalHandle, Stream, VirtualMemory};
use crate::error::{Error, Result};
use crate::report::OomReport;
use crate::units::Bytes;

use super::bins::MIN_ALLOCATION;
use super::common::{admit, holds_memory, synchronized, Admitted, FailedRequest};
use super::stream_order::wait_outside;
use physical::{Physical, Piece};
use space::{Grant, Placement, Space};
use streams::StreamOrder;
pub use streams::EVENT_POOL;

/// The largest alignment accepted: 1 GiB.
pub const MAX_ALIGNMENT: u64 = 1 << 30;
/// Default [`VmmOptions::small_threshold`]: 2 MiB.
pub const DEFAULT_SMALL_THRESHOLD: u64 = 2 << 20;
/// Largest handle made for a large request, in granules (20 MiB at 2 MiB granularity).
pub const LARGE_HANDLE_GRANULES: u64 = 10;
/// Memory made beyond the peak of the bytes in use, as a part of it, before free memory is
/// moved (stitched) instead (see *Quiet and frugal*): 1/16.
pub const GROWTH_SLACK: f64 = 1.0 / 16.0;
/// Places in best-fit order looked at for the one needing the fewest granules mapped, when
/// the driver holds released memory and the best fit needs some (see *Physical memory* in the
/// module docs): on the churn of `tests/suite/vmm_tenant.rs`, 16, 256 and all gave the same
/// placements; few enough to keep the search off the CPU path's figures.
pub const MAPPED_SEARCH: usize = 16;
/// Address space reserved beyond twice the limit.
const RESERVATION_HEADROOM: u64 = 1 << 30;
/// A reservation of a tag that can sleep: a quarter of the limit, within these bounds (a
/// process may declare many such tags, each with regions of its own; address space is
/// cheap, not free).
const TAG_RESERVATION: (u64, u64) = (1 << 30, 64 << 30);
/// A reservation where the driver holds released memory until its reservation goes (see
/// *Memory the driver holds*): the unit memory goes back in, so a few live allocations pin
/// no more than this each.
const HOLD_SEGMENT: u64 = 256 << 20;

/// Options of [`VmmAllocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmOptions {
    /// Physical budget: the most bytes of physical memory held at once (`fraction × total`).
    pub limit: u64,
    /// Requests (rounded to 256 B) below this are *small*: placed from the low end of the
    /// address space, in one-granule handles. Default [`DEFAULT_SMALL_THRESHOLD`].
    pub small_threshold: u64,
    /// Bytes of address space per reservation; 0 (default) = `2 × limit + 1 GiB`.
    pub reservation: u64,
    /// Keep small and large requests in separate reservations (default false: they share
    /// one, from its two ends). Measured worse on every real trace tried; kept for
    /// experiments.
    pub segregate: bool,
    /// The piece sleep and wake copy an allocation's contents in (rounded up to a granule;
    /// default [`DEFAULT_COPY_PIECE`]; boundaries at its multiples): a sleep unmaps what one
    /// piece copied while the next piece's copy runs, a wake queues a piece's copy as soon
    /// as its memory is mapped and makes the next piece's meanwhile — on a GPU the driver's
    /// calls then overlap the copies instead of following them.
    pub copy_piece: u64,
}

/// Default [`VmmOptions::copy_piece`]: 256 MiB (32 pieces for 8 GiB; the last piece's
/// driver calls are what no copy overlaps).
pub const DEFAULT_COPY_PIECE: u64 = 256 << 20;

impl VmmOptions {
    /// The defaults with this budget.
    pub fn new(limit: u64) -> Self {
        VmmOptions {
            limit,
            small_threshold: DEFAULT_SMALL_THRESHOLD,
            reservation: 0,
            segregate: false,
            copy_piece: DEFAULT_COPY_PIECE,
        }
    }
}

/// What the allocator did to the device, beyond the plain counters of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmmCounters {
    /// Allocations served by stitching: whole free granules unmapped elsewhere and their
    /// memory mapped under the request, instead of new memory from the device.
    pub stitches: u64,
    /// Granules moved by stitching.
    pub stitched_granules: u64,
    /// Successful `create_physical` calls.
    pub creates: u64,
    /// Successful `release_physical` calls.
    pub releases: u64,
    /// Successful `map` calls (one granule each).
    pub maps: u64,
    /// Successful `unmap` calls (one granule each).
    pub unmaps: u64,
    /// Successful `set_access` calls.
    pub set_access: u64,
    /// Address ranges reserved.
    pub reservations: u64,
    /// Allocations placed by the exhaustive search under memory pressure.
    pub pressure_placements: u64,
    /// Waits for new mappings to become visible to GPU work
    /// ([`VirtualMemory::map_visible_after`]), one per request that mapped granules.
    pub map_waits: u64,
}

/// Everything behind the lock.
#[derive(Debug)]
struct Inner {
    space: Space,
    phys: Physical,
    counters: VmmCounters,
    num_allocs: u64,
    peak_bytes_in_use: u64,
    largest_alloc_size: u64,
    peak_pool_bytes: u64,
    /// Stream-ordered reuse (see [`streams`]).
    order: StreamOrder,
    /// Ordinals of the peer devices granted access to every granule mapped.
    peers: Vec<u32>,
    /// Lists [`VmmAllocator::back`] fills and empties on each call, kept for their capacity.
    scratch: Scratch,
    /// The fence records of `order` the physical books have moved their unsettled granules
    /// to fenced for ([`VmmAllocator::sync_fence`]).
    fence_seen: u64,
    /// The live allocations that carry a tag, and which of them sleep ([`sleep`]).
    tags: sleep::Tags,
    /// The driver keeps a released handle's memory while a reservation it was mapped into
    /// stays reserved ([`VirtualMemory::holds_released_memory`], probed when the device was
    /// opened): handles are then mapped only in the region they were made for, and memory
    /// goes back by freeing whole reservations (see *Memory the driver holds*).
    hold: bool,
    /// Per region of `space` (same index): false while its reservation is freed — nothing
    /// mapped in it, its addresses kept in the books (sleepers, free chunks) and reserved
    /// again at the same address before anything is mapped there. Only in `hold` mode.
    unreserved: Vec<bool>,
    /// The stream sleep and wake copy on: portalloc's own, made at the first sleep, so a
    /// copy never waits on (or uses) a caller's stream that may be gone.
    copy_stream: Option<crate::backends::own_stream::OwnedStream>,
    /// In `hold` mode: the reserved regions (by base) each handle (by slot) has been mapped
    /// into since they were reserved. The driver gives a released handle's memory back only
    /// once all of them are freed, so a handle is released only then. Invariant: every slot a
    /// live handle's, every region listed reserved.
    mapped_in: FxHashMap<u32, Vec<u64>>,
    /// Regions in use whose reservation was freed and could not be had again at their
    /// address: no request is placed there until a later try succeeds (a wake's).
    blocked: Vec<usize>,
    /// True while a wake backs its pieces: handles are then made a copy piece at a time
    /// (see [`VmmAllocator::handle_granules`]).
    waking: bool,
}

/// The lists of [`VmmAllocator::back`]. Invariant: all empty between calls.
#[derive(Debug, Default)]
struct Scratch {
    /// Granules under the request not mapped yet.
    missing: Vec<u64>,
    /// The physical memory gathered for them.
    backing: Vec<Piece>,
    /// Granules under the request mapped without access.
    lacking: Vec<u64>,
}

impl Inner {
    /// Bytes handed out: the chunks in use less the pending stream-ordered frees and the
    /// sleeping allocations.
    fn bytes_in_use(&self) -> u64 {
        self.space.bytes_in_use() - self.order.bytes() - self.tags.asleep_bytes()
    }
}

/// A placement chosen by [`VmmAllocator::place`], with the granules it needs mapped and
/// those obtainable for it, computed once: `place` has them in hand, and nothing changes the
/// books between it and [`VmmAllocator::back`].
#[derive(Clone, Copy)]
struct Site {
    at: Placement,
    /// Granules under it not mapped yet.
    need: u64,
    /// Granules obtainable for it (idle + stitchable outside it + creatable).
    supply: u64,
}

/// A request, as [`VmmAllocator::serve`] takes it.
#[derive(Clone, Copy)]
struct Request {
    stream: Stream,
    /// Bytes asked for.
    size: u64,
    /// Rounded to 256 B.
    rounded: u64,
    alignment: u64,
    /// Below the small threshold.
    small: bool,
    /// The address-space class it is placed in: small or large, or its tag's own.
    class: usize,
}

/// Why a region's reservation could not be made again (see
/// [`VmmAllocator::ensure_reserved`]).
enum Relocated {
    /// The device failed a call.
    Device(Error),
    /// The driver gave another address; nothing was in use in the region, which is retired.
    Retired,
    /// The driver gave `got` instead of `base` for a region in use.
    Moved { base: u64, size: u64, got: u64 },
}

impl Relocated {
    fn into_error(self) -> Error {
        match self {
            Relocated::Device(e) => e,
            Relocated::Retired => Error::InvalidArgument {
                call: "VirtualMemory::reserve_at",
                reason: "the driver did not give a freed range back at its address; it is \
                         not used again"
                    .into(),
            },
            Relocated::Moved { base, size, got } => Error::InvalidArgument {
                call: "VirtualMemory::reserve_at",
                reason: format!(
                    "the address range {base:#x}+{size} could not be reserved again at the same \
                     address (the driver gave {got:#x}); what lives there keeps its addresses \
                     in the books and stays unmapped until a later try succeeds"
                ),
            },
        }
    }
}

/// Why physical memory could not be found for a placement.
enum Shortfall {
    /// Not enough memory within the budget: `(needed, obtainable)` granules.
    Budget(u64, u64),
    /// The placement's region could not be reserved again at its address (it is retired or
    /// blocked, and says why): place the request again.
    Relocated(String),
    /// The device failed a call.
    Device(Error),
}

/// The `vmm` strategy over a device with virtual memory. See the [module docs](self).
///
/// Thread-safe: one mutex guards the books; device calls are made under it.
#[derive(Debug)]
pub struct VmmAllocator<D: Device + ?Sized> {
    device: Arc<D>,
    options: VmmOptions,
    granularity: u64,
    id: u64,
    inner: Mutex<Inner>,
}

impl<D: Device + ?Sized> VmmAllocator<D> {
    /// Makes the allocator; reserves and maps nothing until the first allocation.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use portalloc::backends::host::HostDevice;
    /// use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
    /// use portalloc::{Allocator, Stream};
    ///
    /// // A simulated 4 GiB device with the GPU drivers' 2 MiB granularity.
    /// let device = Arc::new(HostDevice::builder().capacity(4 << 30).simulated(true).build()?);
    /// let vmm = VmmAllocator::new(device, VmmOptions::new(1 << 30))?;
    /// assert_eq!((vmm.granularity(), vmm.mapped_bytes()), (2 << 20, 0));
    ///
    /// // A 5 MiB request is mapped in whole granules: three of them.
    /// let activations = vmm.allocate(5 << 20, 0, Stream::DEFAULT, "activations")?;
    /// assert_eq!(vmm.mapped_bytes(), 6 << 20);
    /// assert_eq!(vmm.stats().bytes_in_use, 5 << 20);
    /// vmm.deallocate(activations)?;
    /// assert_eq!(vmm.stats().bytes_in_use, 0);
    /// # Ok::<(), portalloc::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device offers no virtual memory, or a granularity
    /// that is not a power of two.
    pub fn new(device: Arc<D>, options: VmmOptions) -> Result<Self> {
        let backend = device.info().vendor.name();
        let Some(vm) = device.virtual_memory() else {
            return Err(Error::Unsupported {
                what: "strategy `vmm`".into(),
                backend,
                reason: format!(
                    "device {} ({}) offers no virtual memory (address reservation and mapping); \
                     use bfc or platform on it",
                    device.info().ordinal,
                    device.info().name
                ),
            });
        };
        let granularity = vm.granularity();
        if !granularity.is_power_of_two() || granularity < MIN_ALLOCATION {
            return Err(Error::Unsupported {
                what: "strategy `vmm`".into(),
                backend,
                reason: format!(
                    "the device reports a virtual-memory granularity of {granularity} bytes; \
                     vmm needs a power of two of at least {MIN_ALLOCATION}"
                ),
            });
        }
        let mut peers = device.peer_access();
        peers.sort_unstable();
        peers.dedup();
        let hold = vm.holds_released_memory();
        Ok(VmmAllocator {
            device,
            options,
            granularity,
            id: next_allocator_id(),
            inner: Mutex::new(Inner {
                space: {
                    let mut space = Space::new();
                    space.fold_within(granularity);
                    space
                },
                phys: Physical::new(granularity),
                counters: VmmCounters::default(),
                num_allocs: 0,
                peak_bytes_in_use: 0,
                largest_alloc_size: 0,
                peak_pool_bytes: 0,
                order: StreamOrder::default(),
                peers,
                scratch: Scratch::default(),
                fence_seen: 0,
                tags: sleep::Tags::default(),
                hold,
                unreserved: Vec::new(),
                copy_stream: None,
                mapped_in: FxHashMap::default(),
                blocked: Vec::new(),
                waking: false,
            }),
        })
    }

    /// The device it allocates from.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// The options it was made with.
    pub fn options(&self) -> VmmOptions {
        self.options
    }

    /// The device's granularity: the unit of mapping.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// What it did to the device so far (stitches, maps, creates…).
    pub fn counters(&self) -> VmmCounters {
        self.inner().counters
    }

    /// Allocations served by stitching so far.
    pub fn stitch_count(&self) -> u64 {
        self.inner().counters.stitches
    }

    /// Bytes mapped now (granules mapped × granularity).
    pub fn mapped_bytes(&self) -> u64 {
        self.inner().phys.mapped_count() * self.granularity
    }

    /// Physical handles held now.
    pub fn handle_count(&self) -> usize {
        self.inner().phys.handle_count()
    }

    /// The address ranges reserved, as `(base, size)`.
    pub fn reservations(&self) -> Vec<(u64, u64)> {
        self.inner().space.regions().to_vec()
    }

    /// The peer devices (ordinals) granted access to the memory mapped: those the device
    /// reported in [`Device::peer_access`] when the allocator was made, and those added with
    /// [`VmmAllocator::add_peer`].
    pub fn peers(&self) -> Vec<u32> {
        self.inner().peers.clone()
    }

    /// Grants device `peer` (an ordinal of the same backend, which this device has enabled
    /// peer access with, see [`Device::enable_peer_access`]) access to every granule mapped
    /// now and mapped from now on. Adding a peer again does nothing.
    ///
    /// # Errors
    /// The device's error from [`VirtualMemory::set_access_with_peers`]; the peer is then
    /// not added (granules granted before the failure keep the access).
    pub fn add_peer(&self, peer: u32) -> Result<()> {
        let mut guard = self.inner();
        let inner = &mut *guard;
        if inner.peers.contains(&peer) {
            return Ok(());
        }
        let vm = self.vm()?;
        let g = self.granularity;
        let mut peers = inner.peers.clone();
        peers.push(peer);
        peers.sort_unstable();
        let phys = &inner.phys;
        let granted: Vec<u64> = phys
            .mapped_granules()
            .into_iter()
            .filter(|&v| !phys.lacks_access(v))
            .collect();
        let mut i = 0;
        while i < granted.len() {
            let mut j = i + 1;
            while j < granted.len() && granted[j] == granted[j - 1] + g {
                j += 1;
            }
            vm.set_access_with_peers(granted[i], (j - i) as u64 * g, &peers)?;
            inner.counters.set_access += 1;
            i = j;
        }
        inner.peers = peers;
        Ok(())
    }

    /// Number of allocations live now (zero-byte ones and pending stream-ordered frees
    /// excluded).
    pub fn live_count(&self) -> usize {
        let inner = self.inner();
        inner.space.live_count() - inner.order.count()
    }

    /// Chunks freed on one stream and not yet safe for the others (see *Streams* in the
    /// module docs), and their bytes.
    pub fn pending_frees(&self) -> (usize, u64) {
        let inner = self.inner();
        (inner.order.count(), inner.order.bytes())
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Books are consistent between calls; a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn vm(&self) -> Result<&dyn VirtualMemory> {
        self.device
            .virtual_memory()
            .ok_or_else(|| Error::Unsupported {
                what: "strategy `vmm`".into(),
                backend: self.device.info().vendor.name(),
                reason: "the device no longer offers virtual memory".into(),
            })
    }

    /// `[first granule, end of last granule)` under `[addr, addr + size)`.
    fn span(&self, addr: u64, size: u64) -> (u64, u64) {
        let g = self.granularity;
        let start = addr & !(g - 1);
        let end = addr.saturating_add(size).saturating_add(g - 1) & !(g - 1);
        (start, end)
    }

    /// The region class of a request: small and large ones live in separate reservations
    /// when segregated.
    fn class(&self, small: bool) -> usize {
        usize::from(self.options.segregate && small)
    }

    /// Granules the budget still allows to create.
    fn creatable(&self, phys: &Physical) -> u64 {
        // A shift: the granularity is a power of two (checked in `new`), and a division
        // here is the slowest instruction of a steady-state allocation.
        self.options.limit.saturating_sub(phys.pool_bytes()) >> self.granularity.trailing_zeros()
    }

    /// Granules the budget allows to create that the device also has free now
    /// ([`Device::mem_info`]; the budget alone where the device does not say): what a refusal
    /// reports as obtainable from the device, with another tenant on it.
    fn creatable_on_device(&self, phys: &Physical) -> u64 {
        let budget = self.creatable(phys);
        match self.device.mem_info() {
            Ok(m) => budget.min(m.free >> self.granularity.trailing_zeros()),
            Err(_) => budget,
        }
    }

    /// What the device says it has free, for a refusal's message.
    fn device_free_text(&self) -> String {
        match self.device.mem_info() {
            Ok(m) => format!(
                "the device has {} free of {}",
                Bytes(m.free),
                Bytes(m.total)
            ),
            Err(e) => format!("the device's free memory is unknown ({e})"),
        }
    }

    /// Granules a placement at `[addr, addr + size)` needs mapped, and granules obtainable
    /// for it (idle + stitchable outside its span + creatable).
    ///
    /// `unsettled` is [`Physical::unsettled_free`]: free granules that cannot be stitched yet.
    fn need_and_supply(&self, phys: &Physical, addr: u64, size: u64, unsettled: u64) -> (u64, u64) {
        let (start, end) = self.span(addr, size);
        let total = (end - start) >> self.granularity.trailing_zeros();
        // One walk over the span's bitmaps for both counts.
        let (mapped, inside_free) = phys.mapped_and_free_in(start, end);
        let unsettled_outside = if unsettled > 0 {
            unsettled - phys.unsettled_free_in(start, end)
        } else {
            0
        };
        let stitchable = phys.free_mapped_count() - inside_free - unsettled_outside;
        let supply = phys.idle_count() + stitchable + self.creatable(phys);
        (total - mapped, supply)
    }

    /// Whether backing a request may come to stitching: the best fit (the place chosen
    /// unless it cannot be backed) lacks more granules than are idle or may be made before
    /// memory is moved ([`VmmAllocator::growth_room`]), or no address range fits yet. When it
    /// lacks no more, [`VmmAllocator::place`] picks it and backing takes idle and new memory only (a device that refuses new memory
    /// has [`VmmAllocator::gather`] fence what it stitches then).
    fn may_stitch(
        &self,
        inner: &Inner,
        rounded: u64,
        alignment: u64,
        small: bool,
        class: usize,
    ) -> bool {
        let Some(p) = inner.space.find(class, rounded, alignment, !small) else {
            return true;
        };
        let (start, end) = self.span(p.addr, rounded);
        let total = (end - start) >> self.granularity.trailing_zeros();
        let (mapped, _) = inner.phys.mapped_and_free_in(start, end);
        let lacking = total - mapped;
        lacking > inner.phys.idle_count() + self.growth_room(inner, lacking)
    }

    /// Brings the physical books in step with the stream order's fence: granules unsettled
    /// when the fence was recorded wait for it, and are settled once it completed.
    fn sync_fence(inner: &mut Inner) {
        let records = inner.order.fence_records();
        let complete = !inner.order.fence_active();
        if records != inner.fence_seen {
            inner.fence_seen = records;
            if complete {
                // Recorded and complete already (each record is followed by this call under
                // the same lock, so nothing was freed in between): all of it is settled, in
                // one pass.
                inner.phys.settle_all();
                return;
            }
            inner.phys.fence_recorded();
        }
        if complete {
            inner.phys.fence_completed();
        }
    }

    /// Before stitching away or unmapping free granules: when some are unsettled (freed at
    /// once, with work queued before the free maybe still reading them), records the fence
    /// if none is in flight — on the device, no CPU wait — and settles what a completed fence
    /// covers.
    fn settle_granules(&self, inner: &mut Inner) {
        if !inner.phys.any_unsettled() {
            return;
        }
        if inner.order.unfenced() && !inner.order.fence_active() {
            if let Err(e) = inner.order.fence_now(&*self.device) {
                tracing::debug!(error = %e, "vmm: could not fence the memory freed at once");
            }
        }
        self.poll_pending(inner);
    }

    /// Makes another reservation able to hold `rounded` bytes at `alignment`.
    fn reserve(&self, inner: &mut Inner, class: usize, rounded: u64, alignment: u64) -> Result<()> {
        let g = self.granularity;
        let shared = self
            .options
            .limit
            .saturating_mul(2)
            .saturating_add(RESERVATION_HEADROOM);
        let default = if self.options.reservation > 0 {
            self.options.reservation
        } else if inner.hold {
            HOLD_SEGMENT
        } else if class >= sleep::FIRST_TAG_CLASS {
            (self.options.limit / 4)
                .clamp(TAG_RESERVATION.0, TAG_RESERVATION.1)
                .min(shared)
        } else {
            shared
        };
        let want = rounded.saturating_add(alignment.saturating_sub(g));
        let size = round_up(default.max(want), g)?;
        let vm = self.vm()?;
        let align = if alignment > g { alignment } else { 0 };
        let base = vm.reserve(size, align)?;
        inner.counters.reservations += 1;
        if let Err(why) = inner.space.add_region(base, size, class) {
            let _ = vm.free_reservation(base, size);
            return Err(Error::InvalidArgument {
                call: "VirtualMemory::reserve",
                reason: format!("the device gave an unusable reservation: {why}"),
            });
        }
        // The address space accepted it: granule-aligned (the device's alignment) and
        // overlapping no other region.
        inner.phys.add_region(base, size);
        inner.unreserved.push(false);
        Ok(())
    }

    /// Before anything is mapped in `[start, end)`: in `hold` mode, reserves its region
    /// again at the same address if its reservation was freed. A region the driver will not
    /// give back at its address is retired when nothing in it is in use (its class's
    /// requests go elsewhere: [`Relocated::Retired`]); else the caller fails, naming it.
    fn ensure_reserved(&self, inner: &mut Inner, start: u64) -> Result<(), Relocated> {
        if !inner.hold || !inner.unreserved.iter().any(|&u| u) {
            return Ok(());
        }
        let Some(r) = inner.space.region_at(start) else {
            return Ok(());
        };
        if !inner.unreserved[r] {
            return Ok(());
        }
        let (base, size) = inner.space.regions()[r];
        let vm = self.vm().map_err(Relocated::Device)?;
        let got = vm.reserve_at(size, 0, base).map_err(Relocated::Device)?;
        inner.counters.reservations += 1;
        if got == base {
            inner.unreserved[r] = false;
            inner.blocked.retain(|&b| b != r);
            return Ok(());
        }
        if let Err(e) = vm.free_reservation(got, size) {
            tracing::warn!(va = got, size, error = %e, "vmm: could not free a reservation it cannot use");
        }
        if !inner.space.region_in_use(r)
            && inner
                .space
                .reclass_free_region(r, sleep::RETIRED_CLASS)
                .is_ok()
        {
            return Err(Relocated::Retired);
        }
        if !inner.blocked.contains(&r) {
            inner.blocked.push(r);
        }
        Err(Relocated::Moved { base, size, got })
    }

    /// In `hold` mode: frees the reservation of every region that nothing awake uses, after
    /// unmapping its free granules, and releases every handle with nothing mapped all of whose
    /// regions are then freed — the only way such a driver gives memory back. A handle also
    /// mapped in a region that stays reserved is kept, idle (releasing it would give nothing
    /// back). Regions whose free granules still wait for work are left, and so are `except`
    /// and the handles in `keep` (pieces a request holds, not mapped yet). Returns the bytes
    /// released.
    ///
    /// # Errors
    /// The device's error; what was released or freed before it stays so.
    fn free_idle_regions(
        &self,
        vm: &dyn VirtualMemory,
        inner: &mut Inner,
        except: Option<u64>,
        keep: &[Piece],
    ) -> Result<u64> {
        let g = self.granularity;
        let mut freeing: Vec<(usize, u64, u64)> = Vec::new();
        for r in 0..inner.space.regions().len() {
            if inner.unreserved[r] || inner.space.class_of_region(r) == sleep::RETIRED_CLASS {
                continue;
            }
            let (base, size) = inner.space.regions()[r];
            if except == Some(base) {
                continue;
            }
            let (mapped, free, waiting) = inner.phys.region_counts(base);
            if mapped != free || waiting > 0 {
                continue;
            }
            let mut granules = Vec::new();
            inner.phys.settled_free_in(base, base + size, &mut granules);
            for v in granules {
                vm.unmap(v, g)?;
                inner.counters.unmaps += 1;
                if let Some(piece) = inner.phys.unmap(v) {
                    inner.phys.make_idle(piece);
                }
            }
            freeing.push((r, base, size));
        }
        let mut released = 0;
        for (slot, h) in inner.phys.handles_by_id() {
            if h.mapped > 0 || keep.iter().any(|&(_, _, s)| s == slot) {
                continue;
            }
            let gone = inner.mapped_in.get(&slot).map_or(true, |regions| {
                regions
                    .iter()
                    .all(|b| freeing.iter().any(|&(_, base, _)| base == *b))
            });
            if !gone {
                continue;
            }
            vm.release_physical(PhysicalHandle(h.id))?;
            inner.counters.releases += 1;
            released += inner.phys.remove_handle(slot).unwrap_or(0);
            inner.mapped_in.remove(&slot);
        }
        for (r, base, size) in freeing {
            vm.free_reservation(base, size)?;
            inner.unreserved[r] = true;
            for regions in inner.mapped_in.values_mut() {
                regions.retain(|&b| b != base);
            }
        }
        Ok(released)
    }

    /// Maps every granule under `[addr, addr + size)` that is not mapped yet, and grants
    /// access. On failure the books stay consistent (whatever was obtained is kept, idle or
    /// mapped-and-free).
    fn back(
        &self,
        inner: &mut Inner,
        addr: u64,
        need: u64,
        supply: u64,
        size: u64,
        small: bool,
    ) -> Result<(), Shortfall> {
        let g = self.granularity;
        let (start, end) = self.span(addr, size);
        // (Where the driver holds released memory, the supply counts what other regions
        // hold, which only freeing them gives back: `gather` tries that, and refuses.)
        if need > supply && !inner.hold {
            return Err(Shortfall::Budget(need, supply));
        }
        if need == 0 && inner.phys.all_granted(start, end) {
            // Everything under it is mapped with access already: the steady state's case.
            return Ok(());
        }
        match self.ensure_reserved(inner, start) {
            Ok(()) => {}
            Err(Relocated::Device(e)) => return Err(Shortfall::Device(e)),
            Err(moved) => return Err(Shortfall::Relocated(moved.into_error().to_string())),
        }
        let vm = self.vm().map_err(Shortfall::Device)?;
        // The scratch lists, kept between calls so that backing a request allocates nothing
        // in the steady state (a request that fails leaves them empty, not lost).
        let Scratch {
            mut missing,
            mut backing,
            mut lacking,
        } = std::mem::take(&mut inner.scratch);
        if need > 0 {
            inner.phys.unmapped_in(start, end, &mut missing);
        }
        let result = self.gather(
            vm,
            inner,
            &mut backing,
            missing.len() as u64,
            start,
            end,
            small,
        );
        let mut mapped_now = 0;
        let result = result.and_then(|()| {
            let mapping: Result<()> =
                missing
                    .iter()
                    .zip(&backing)
                    .try_for_each(|(&v, &(h, off, _))| {
                        vm.map(v, g, PhysicalHandle(h), off)?;
                        mapped_now += 1;
                        Ok(())
                    });
            // The books record what the device mapped (nothing reads them in between), with
            // one search for the region.
            inner.counters.maps += mapped_now as u64;
            let visible_after = vm.map_visible_after();
            if mapped_now > 0 && !visible_after.is_zero() {
                // Nothing may touch the new mappings before the driver's page tables have
                // them (gfx12): the request waits, holding the lock, rather than hand out
                // memory whose first writes may be lost. Only where memory is mapped.
                std::thread::sleep(visible_after);
                inner.counters.map_waits += 1;
            }
            let phys = &mut inner.phys;
            phys.map_all(&missing[..mapped_now], &backing[..mapped_now]);
            if inner.hold && mapped_now > 0 {
                if let Some(r) = inner.space.region_at(start) {
                    let base = inner.space.regions()[r].0;
                    for &(_, _, slot) in &backing[..mapped_now] {
                        let regions = inner.mapped_in.entry(slot).or_default();
                        if !regions.contains(&base) {
                            regions.push(base);
                        }
                    }
                }
            }
            mapping?;
            // Grant access to every run of granules under the request that lacks it.
            phys.lacking_access(start, end, &mut lacking);
            let mut i = 0;
            while i < lacking.len() {
                let mut j = i + 1;
                while j < lacking.len() && lacking[j] == lacking[j - 1] + g {
                    j += 1;
                }
                let run = (j - i) as u64 * g;
                if inner.peers.is_empty() {
                    vm.set_access(lacking[i], run)?;
                } else {
                    vm.set_access_with_peers(lacking[i], run, &inner.peers)?;
                }
                inner.counters.set_access += 1;
                phys.grant(lacking[i], lacking[i] + run);
                i = j;
            }
            Ok(())
        });
        // Whatever was obtained but not mapped stays held, idle.
        for piece in backing.drain(..).skip(mapped_now) {
            inner.phys.make_idle(piece);
        }
        missing.clear();
        lacking.clear();
        inner.scratch = Scratch {
            missing,
            backing,
            lacking,
        };
        result.map_err(Shortfall::Device)
    }

    /// Collects `n` granules of physical memory into `backing`, in this order (see *Quiet
    /// and frugal* in the module docs):
    ///
    /// 1. idle pieces (of the request's region, where the driver holds released memory);
    /// 2. new handles, while the budget allows them and the device gives them;
    /// 3. stitched granules: free granules mapped outside `[start, end)` (of the request's
    ///    region first, where the driver holds), unmapped and mapped here;
    /// 4. where the driver holds released memory: the regions nothing uses freed (their
    ///    memory back to the device) and creation tried again, then memory of other regions
    ///    borrowed.
    ///
    /// Stitching comes after growth the budget and the device allow: a request's place is
    /// where the same request of the next step of a repeating program lands again, so
    /// memory moved there is moved back and forth every step (an unmap and a map per
    /// granule, a device synchronisation per unmap on ROCm), while memory made there stays.
    ///
    /// # Errors
    /// The device's refusal when it refused and nothing else served; [`Error::ExceedsLimit`]
    /// when the budget is what is short; another device error as it came.
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        vm: &dyn VirtualMemory,
        inner: &mut Inner,
        backing: &mut Vec<Piece>,
        n: u64,
        start: u64,
        end: u64,
        small: bool,
    ) -> Result<()> {
        // Where the driver holds released memory until the reservation goes, a handle serves
        // the region it was made for only (see *Memory the driver holds*).
        let home = if inner.hold {
            inner
                .space
                .region_at(start)
                .map(|r| inner.space.regions()[r].0)
        } else {
            None
        };
        let phys = &mut inner.phys;
        while (backing.len() as u64) < n {
            let piece = match home {
                Some(base) => phys.take_idle_homed(base),
                None => phys.take_idle(),
            };
            let Some(piece) = piece else {
                break;
            };
            backing.push(piece);
        }
        // The device's refusal of new memory, kept for the error if nothing else serves.
        let mut refused: Option<Error> = None;
        let lacks = |backing: &Vec<Piece>| (backing.len() as u64) < n;
        if inner.hold && lacks(backing) {
            // The region's own free granules pin nothing more where they are moved (see
            // *Memory the driver holds*).
            self.settle_granules(inner);
            self.stitch(vm, inner, backing, n, home, start, end, false)?;
        }
        if lacks(backing) {
            let room = self.growth_room(inner, n - backing.len() as u64);
            refused = self.create_within_budget(vm, inner, backing, n, home, small, room)?;
        }
        if lacks(backing) {
            // Free granules freed at once can be moved once a fence covers them: the fence
            // is recorded now (on the device, no CPU wait; the wait before refusing waits
            // for it).
            self.settle_granules(inner);
            if inner.hold {
                // Memory of other regions: idle pieces and free granules anywhere. Their
                // handles are then mapped in two regions, and go back to the driver only
                // once both are freed.
                while lacks(backing) {
                    let Some(piece) = inner.phys.take_idle() else {
                        break;
                    };
                    backing.push(piece);
                }
                self.stitch(vm, inner, backing, n, None, start, end, true)?;
            } else {
                self.stitch(vm, inner, backing, n, None, start, end, false)?;
            }
        }
        if lacks(backing) && refused.is_none() {
            let budget = self.creatable(&inner.phys);
            refused = self.create_within_budget(vm, inner, backing, n, home, small, budget)?;
        }
        if lacks(backing) && inner.hold && self.free_idle_regions(vm, inner, home, backing)? > 0 {
            // Memory held for regions nothing uses went back to the device: made again here.
            let budget = self.creatable(&inner.phys);
            refused = self.create_within_budget(vm, inner, backing, n, home, small, budget)?;
        }
        if lacks(backing) {
            let short = (n - backing.len() as u64) * self.granularity;
            return Err(refused.unwrap_or(Error::ExceedsLimit {
                requested: short,
                limit: self.options.limit,
            }));
        }
        Ok(())
    }

    /// Granules that may be made before memory is moved instead: up to [`GROWTH_SLACK`] over
    /// the peak of the bytes in use (this request's `n` granules counted), within the budget.
    fn growth_room(&self, inner: &Inner, n: u64) -> u64 {
        let shift = self.granularity.trailing_zeros();
        let peak = inner
            .peak_bytes_in_use
            .max(inner.bytes_in_use().saturating_add(n << shift));
        let allowance = peak.saturating_add((peak as f64 * GROWTH_SLACK) as u64);
        (allowance.saturating_sub(inner.phys.pool_bytes()) >> shift)
            .min(self.creatable(&inner.phys))
    }

    /// Makes handles for what `backing` lacks of `n` granules while the budget (and `cap`,
    /// granules) allows them:
    /// one granule each for a small request, up to [`LARGE_HANDLE_GRANULES`] for a large
    /// one. Returns the device's out-of-memory refusal, if it refused.
    ///
    /// # Errors
    /// A device error other than out-of-memory.
    #[allow(clippy::too_many_arguments)]
    fn create_within_budget(
        &self,
        vm: &dyn VirtualMemory,
        inner: &mut Inner,
        backing: &mut Vec<Piece>,
        n: u64,
        home: Option<u64>,
        small: bool,
        cap: u64,
    ) -> Result<Option<Error>> {
        let g = self.granularity;
        let mut made = 0u64;
        // The largest handle still tried: a piece-sized one the device refuses (another
        // tenant left it less) is tried again at the usual size, which may fit.
        let mut largest = u64::MAX;
        while (backing.len() as u64) < n {
            let left = n - backing.len() as u64;
            let granules = self
                .handle_granules(vm, &inner.phys, left, small, inner.waking)
                .min(largest)
                .min(self.creatable(&inner.phys))
                .min(cap - made);
            if granules == 0 {
                return Ok(None);
            }
            made += granules;
            let bytes = granules * g;
            let h = match vm.create_physical(bytes) {
                Ok(h) => h,
                Err(e)
                    if e.is_out_of_memory()
                        && granules > LARGE_HANDLE_GRANULES
                        && vm.handle_budget().is_none() =>
                {
                    made -= granules;
                    largest = LARGE_HANDLE_GRANULES;
                    continue;
                }
                Err(e) if e.is_out_of_memory() => return Ok(Some(e)),
                Err(e) => return Err(e),
            };
            inner.counters.creates += 1;
            let phys = &mut inner.phys;
            let slot = phys.add_handle_for(h.0, bytes, home.unwrap_or(0));
            inner.peak_pool_bytes = inner.peak_pool_bytes.max(phys.pool_bytes());
            for k in 0..granules {
                backing.push((h.0, k * g, slot));
            }
        }
        Ok(None)
    }

    /// Granules of the next handle [`VmmAllocator::create_within_budget`] makes, `left` still
    /// to find: one for a small request, up to [`LARGE_HANDLE_GRANULES`] for a large one, for a
    /// wake ([`Inner::waking`]) a whole copy piece ([`VmmOptions::copy_piece`], 256 MiB) while
    /// at least that much is left — more where the driver spends a file descriptor per handle
    /// ([`VirtualMemory::handle_budget`], ROCm 7.14): then what the budget can still create
    /// is planned in at most a quarter of the descriptors this allocator could ever hold (its
    /// handles and those still free) and at most half of those free, so that the whole budget
    /// fits well under the process's limit (64 GiB in about 250 handles of 262 MiB at `ulimit
    /// -n 1024`; vLLM's ROCm sleep makes 256 MiB ones). Granules past `left` stay idle for
    /// the next request.
    fn handle_granules(
        &self,
        vm: &dyn VirtualMemory,
        phys: &Physical,
        left: u64,
        small: bool,
        waking: bool,
    ) -> u64 {
        // A wake's piece that still lacks a whole copy piece takes it in one handle: at
        // ~130–170 µs a `cuMemCreate` (see `replay::costs`), 8 GiB in 32 handles rather than
        // 416 (vLLM's ROCm sleep allocator makes 256 MiB ones too). Only a wake's: a handle
        // goes back only once none of its granules is mapped, and once stitching has spread
        // a freed allocation's granules under others, a trim could keep a 256 MiB handle for
        // one granule (1 GiB allocated, freed, then 600 MiB of 1 MiB ones: 832 MiB held after
        // a trim against 604 MiB with 20 MiB handles). Allocations keep today's sizes.
        let piece = (self.options.copy_piece / self.granularity).max(LARGE_HANDLE_GRANULES);
        let usual = if small {
            1
        } else if waking && left >= piece {
            piece
        } else {
            left.min(LARGE_HANDLE_GRANULES)
        };
        let Some(free) = vm.handle_budget() else {
            return usual;
        };
        let held = phys.handle_count() as u64;
        let handles = ((free + held) / 4)
            .saturating_sub(held)
            .min(free / 2)
            .max(1);
        usual.max(self.creatable(phys).div_ceil(handles))
    }

    /// Moves settled free granules mapped outside `[start, end)` — of the region based at
    /// `within`, or anywhere — into `backing`, up to `n` in all: unmapped, their memory to be
    /// mapped under the request. `borrowed` counts them as memory borrowed from another
    /// region rather than as a stitch.
    ///
    /// # Errors
    /// The device's error for an unmap; what was moved before it stays in `backing`.
    #[allow(clippy::too_many_arguments)]
    fn stitch(
        &self,
        vm: &dyn VirtualMemory,
        inner: &mut Inner,
        backing: &mut Vec<Piece>,
        n: u64,
        within: Option<u64>,
        start: u64,
        end: u64,
        borrowed: bool,
    ) -> Result<()> {
        let want = n.saturating_sub(backing.len() as u64);
        if want == 0 {
            return Ok(());
        }
        let g = self.granularity;
        let victims = inner.phys.victims_within(within, start, end, want);
        let mut moved = 0u64;
        for v in victims {
            vm.unmap(v, g)?;
            inner.counters.unmaps += 1;
            moved += 1;
            if let Some(piece) = inner.phys.unmap(v) {
                backing.push(piece);
            }
        }
        if moved > 0 {
            inner.counters.stitched_granules += moved;
            if !borrowed {
                inner.counters.stitches += 1;
            }
        }
        Ok(())
    }

    /// Releases every handle none of whose granules is mapped, by handle id. Returns the
    /// bytes released.
    ///
    /// # Errors
    /// The device's error; what was released before it stays so.
    fn release_idle_handles(&self, vm: &dyn VirtualMemory, inner: &mut Inner) -> Result<u64> {
        if inner.hold {
            // Releasing a handle gives nothing back while its region stays reserved: whole
            // regions nothing awake uses go instead, handles and reservation.
            return self.free_idle_regions(vm, inner, None, &[]);
        }
        let idle_handles: Vec<(u32, u64)> = inner
            .phys
            .handles_by_id()
            .into_iter()
            .filter(|(_, r)| r.mapped == 0)
            .map(|(slot, r)| (slot, r.id))
            .collect();
        let mut released = 0;
        for (slot, h) in idle_handles {
            vm.release_physical(PhysicalHandle(h))?;
            inner.counters.releases += 1;
            released += inner.phys.remove_handle(slot).unwrap_or(0);
        }
        Ok(released)
    }

    /// Counts an allocation handed out (its granules already touched) and makes it.
    #[inline(always)]
    fn granted(
        &self,
        inner: &mut Inner,
        grant: &Grant,
        size: u64,
        stream: Stream,
        tag: &str,
    ) -> Allocation {
        inner.num_allocs += 1;
        // The tag goes in the chunk's record, just written (see `sleep`'s *Books*).
        let label = inner.tags.acquire(tag);
        if label != 0 {
            inner.space.label_granted(grant, label);
        }
        inner.peak_bytes_in_use = inner.peak_bytes_in_use.max(inner.bytes_in_use());
        inner.largest_alloc_size = inner.largest_alloc_size.max(grant.size);
        Allocation::new(grant.addr, size, stream, self.id, grant.token)
    }

    /// Forgets the books of `allocation`, a tagged chunk of `size` bytes labelled `label`
    /// (not 0) being freed: its tag's count, or — asleep — its sleeping record and host copy;
    /// and one spare host copy of its size (one fewer allocation of that size can sleep
    /// again). True when it was asleep: it touches no granule, and its contents went with it.
    #[inline]
    fn forget_label(
        &self,
        inner: &mut Inner,
        label: u32,
        allocation: &Allocation,
        size: u64,
    ) -> bool {
        if let Some(copy) = inner.tags.take_spare(size) {
            sleep::free_all(&*self.device, vec![copy]);
        }
        if label != sleep::ASLEEP {
            inner.tags.release(label);
            return false;
        }
        let Some(tagged) = inner
            .tags
            .remove_asleep(allocation.ptr(), allocation.token())
        else {
            debug_assert!(false, "a chunk labelled asleep has no sleeping record");
            return false;
        };
        if let Some(copy) = tagged.copy {
            if let Err(e) = copy.free(&*self.device) {
                tracing::warn!(error = %e, "vmm: a host copy could not be freed (leaked)");
            }
        }
        true
    }

    /// Counts a chunk in use on its granules.
    ///
    /// # Time complexity
    /// `O(granules)` of the chunk.
    fn touch(&self, phys: &mut Physical, addr: u64, size: u64) {
        let (start, end) = self.span(addr, size);
        phys.touch(start, end);
    }

    /// Undoes [`Self::touch`].
    ///
    /// # Time complexity
    /// `O(granules)` of the chunk.
    fn untouch(&self, phys: &mut Physical, addr: u64, size: u64) {
        let (start, end) = self.span(addr, size);
        phys.untouch(start, end);
    }

    /// Granules under `[addr, addr + size)` that no chunk in use touches: what placing a
    /// request there adds to the physical memory the live allocations need.
    fn cost(&self, phys: &Physical, addr: u64, size: u64) -> u64 {
        let (start, end) = self.span(addr, size);
        phys.untouched_in(start, end)
    }

    /// True when `addr` lies in a region whose reservation could not be had again at its
    /// address ([`Inner::blocked`]).
    fn is_blocked(&self, inner: &Inner, addr: u64) -> bool {
        !inner.blocked.is_empty()
            && inner
                .space
                .region_at(addr)
                .is_some_and(|r| inner.blocked.contains(&r))
    }

    /// Where the driver holds released memory (see [`VmmAllocator::place`]): where the request
    /// goes when the best fit needs granules mapped but a place among the first
    /// [`MAPPED_SEARCH`] in best-fit order needs none — that place; `None` otherwise.
    fn mapped_place(
        &self,
        inner: &Inner,
        rounded: u64,
        alignment: u64,
        small: bool,
        class: usize,
    ) -> Option<Site> {
        if !inner.hold {
            return None;
        }
        let p = inner.space.find(class, rounded, alignment, !small)?;
        let phys = &inner.phys;
        let unsettled = phys.unsettled_free();
        let (need, supply) = self.need_and_supply(phys, p.addr, rounded, unsettled);
        if need == 0 {
            return None;
        }
        let first = Site {
            at: p,
            need,
            supply,
        };
        let best = self.fewest_needed(inner, first, rounded, alignment, class, unsettled);
        (best.need == 0).then_some(best)
    }

    /// Of `first` and the first [`MAPPED_SEARCH`] places in best-fit order, the one needing
    /// the fewest granules mapped (the earliest among equals; a place needing none ends the
    /// search).
    fn fewest_needed(
        &self,
        inner: &Inner,
        first: Site,
        rounded: u64,
        alignment: u64,
        class: usize,
        unsettled: u64,
    ) -> Site {
        let mut best = first;
        for at in inner
            .space
            .candidates(class, rounded, alignment)
            .take(MAPPED_SEARCH)
        {
            if best.need == 0 {
                break;
            }
            if self.is_blocked(inner, at.addr) {
                continue;
            }
            let (need, supply) = self.need_and_supply(&inner.phys, at.addr, rounded, unsettled);
            if need < best.need {
                best = Site { at, need, supply };
            }
        }
        best
    }

    /// Chooses where the request goes: the best fit, unless the memory it needs cannot be
    /// found; then every free chunk (its start and its end) is tried and the place that adds
    /// the fewest untouched granules among those that can be backed wins. `None` when
    /// nothing fits in the address space.
    fn place(
        &self,
        inner: &mut Inner,
        rounded: u64,
        alignment: u64,
        small: bool,
        class: usize,
    ) -> Option<Site> {
        let p = match inner.space.find(class, rounded, alignment, !small) {
            Some(p) if !self.is_blocked(inner, p.addr) => p,
            Some(_) => {
                // The best fit lies in a region whose addresses the driver would not give
                // back: the best elsewhere, in best-fit order.
                let inner = &*inner;
                inner
                    .space
                    .candidates(class, rounded, alignment)
                    .find(|c| !self.is_blocked(inner, c.addr))?
            }
            None => return None,
        };
        let phys = &inner.phys;
        let unsettled = phys.unsettled_free();
        let site = |at: Placement| {
            let (need, supply) = self.need_and_supply(phys, at.addr, rounded, unsettled);
            Site { at, need, supply }
        };
        let first = site(p);
        if inner.hold && first.need > 0 && first.need <= first.supply {
            // Where the driver holds released memory, memory made stays pinned by its
            // segment (and memory borrowed by two): memory freed elsewhere comes before it —
            // of the first places in best-fit order, the one needing the fewest granules
            // mapped (a place on mapped granules needs no driver call at all). Elsewhere best
            // fit's packing is worth more: the search made the smallest device of
            // pangu_2.6B 1.012 × its peak live instead of 1.010.
            return Some(self.fewest_needed(inner, first, rounded, alignment, class, unsettled));
        }
        if first.need <= first.supply {
            return Some(first);
        }
        let mut best: Option<(u64, Site)> = None;
        for c in inner.space.candidates(class, rounded, alignment) {
            if self.is_blocked(inner, c.addr) {
                continue;
            }
            let cost = self.cost(phys, c.addr, rounded);
            if best.map_or(true, |(b, _)| cost < b) {
                let s = site(c);
                if s.need <= s.supply {
                    best = Some((cost, s));
                    if cost == 0 {
                        break;
                    }
                }
            }
        }
        match best {
            Some((_, s)) => {
                inner.counters.pressure_placements += 1;
                Some(s)
            }
            None => Some(first),
        }
    }

    /// The general path of an allocation: chooses the place (waiting for other streams'
    /// frees, or reserving more address space, when that is what it takes) and backs it with
    /// physical memory, mapping, stitching or creating what it lacks.
    ///
    /// # Errors
    /// Out of memory, with the cause, when no place fits or cannot be backed; a device error.
    #[inline(never)]
    fn place_and_back(
        &self,
        inner: &mut Inner,
        size: u64,
        rounded: u64,
        alignment: u64,
        small: bool,
        class: usize,
    ) -> Result<Placement> {
        if inner.phys.any_unsettled() && self.may_stitch(inner, rounded, alignment, small, class) {
            // Free granules freed at once may be stitched only once a fence covers them.
            self.settle_granules(inner);
        }
        // A region whose addresses the driver would not give back is retired by `back`: the
        // request is placed again (each retirement removes a region from the search).
        let mut tries = 0;
        let placement = loop {
            let placement = match self.place(inner, rounded, alignment, small, class) {
                Some(p) => p,
                None => {
                    if let Err(e) = self.reserve(inner, class, rounded, alignment) {
                        let cause =
                            format!("no free address range fits and reserving more failed: {e}");
                        return Err(self.oom(inner, size, rounded, alignment, cause));
                    }
                    match self.place(inner, rounded, alignment, small, class) {
                        Some(p) => p,
                        None => {
                            let cause =
                                "no free address range fits even in a fresh reservation".into();
                            return Err(self.oom(inner, size, rounded, alignment, cause));
                        }
                    }
                }
            };
            let Site { at, need, supply } = placement;
            match self.back(inner, at.addr, need, supply, rounded, small) {
                Err(Shortfall::Relocated(_)) if tries < 8 => tries += 1,
                backed => break (placement, backed),
            }
        };
        let (placement, backed) = placement;
        match backed {
            Ok(()) => {}
            Err(Shortfall::Relocated(why)) => {
                let cause = format!(
                    "the driver did not give freed address ranges back at their addresses: {why}"
                );
                return Err(self.oom(inner, size, rounded, alignment, cause));
            }
            Err(Shortfall::Budget(need, supply)) => {
                let cause = format!(
                    "the physical budget of {} is reached: {} held ({} mapped, {} in use), the \
                     request needs {need} more granules of {} and only {supply} can be found \
                     (idle, stitchable or creatable)",
                    Bytes(self.options.limit),
                    Bytes(inner.phys.pool_bytes()),
                    Bytes(inner.phys.mapped_count() * self.granularity),
                    Bytes(inner.bytes_in_use()),
                    Bytes(self.granularity)
                );
                return Err(self.oom(inner, size, rounded, alignment, cause));
            }
            Err(Shortfall::Device(e)) if e.is_out_of_memory() => {
                // What this attempt made and could not use goes back to the device (another
                // tenant may be the one short of it).
                {
                    if let Ok(vm) = self.vm() {
                        if let Err(f) = self.release_idle_handles(vm, inner) {
                            tracing::debug!(error = %f, "vmm: idle memory stays held");
                        }
                    }
                }
                let cause = format!(
                    "the device refused physical memory after this allocator's own free \
                     memory was used (idle, stitched{}): {e}; with what the request made given \
                     back, {} ({} held here, {} of it in use)",
                    if inner.hold {
                        ", borrowed across segments"
                    } else {
                        ""
                    },
                    self.device_free_text(),
                    Bytes(inner.phys.pool_bytes()),
                    Bytes(inner.bytes_in_use())
                );
                return Err(self.oom(inner, size, rounded, alignment, cause));
            }
            Err(Shortfall::Device(e)) if matches!(e, Error::ExceedsLimit { .. }) => {
                let cause = format!("the physical budget refused more memory: {e}");
                return Err(self.oom(inner, size, rounded, alignment, cause));
            }
            Err(Shortfall::Device(e)) => return Err(e),
        }
        Ok(placement.at)
    }

    /// Serves a request without waiting on the CPU, in RMM's order: `stream`'s own pending
    /// frees; the free space (after a GPU-side wait for the fence, on another stream),
    /// mapped already or not; another stream's pending frees behind a GPU-side wait; more
    /// physical memory (idle, stitched, created).
    ///
    /// # Errors
    /// Out of memory, with the cause, when none of them serves it; a device error.
    #[inline(never)]
    fn serve(&self, inner: &mut Inner, r: &Request) -> Result<Grant> {
        if inner.order.is_multi() {
            if let Some(grant) = self.serve_pending_first(inner, r)? {
                return Ok(grant);
            }
        }
        self.serve_free_space(inner, r)
    }

    /// The part of [`VmmAllocator::serve`] after the pending frees of `r.stream`: the free
    /// space, mapped already or not, another stream's pending frees, more physical memory.
    /// All of a single-stream request.
    ///
    /// # Errors
    /// As [`VmmAllocator::serve`].
    #[inline(always)]
    fn serve_free_space(&self, inner: &mut Inner, r: &Request) -> Result<Grant> {
        let Request {
            stream,
            size,
            rounded,
            alignment,
            small,
            class,
        } = *r;
        // The steady state: the best fit lies on granules mapped with access already, and
        // one walk over them checks that and touches them (what `place`, `back` and `touch`
        // would each walk them for). Anything else takes the general path.
        let ready = inner
            .space
            .find(class, rounded, alignment, !small)
            .filter(|p| {
                let (start, end) = self.span(p.addr, rounded);
                inner.phys.touch_if_ready(start, end)
            });
        let (at, touched) = match ready {
            Some(p) => (p, true),
            None => {
                // A place on mapped memory elsewhere in the free space is free space too: it
                // comes before another stream's pending frees (and their GPU-side wait).
                if let Some(site) = self.mapped_place(inner, rounded, alignment, small, class) {
                    let at = site.at;
                    match self.back(inner, at.addr, 0, site.supply, rounded, small) {
                        Ok(()) => {
                            if let Some(grant) = inner.space.commit(at, rounded, size) {
                                self.touch(&mut inner.phys, grant.addr, grant.size);
                                return Ok(grant);
                            }
                        }
                        Err(Shortfall::Device(e)) => return Err(e),
                        Err(_) => {}
                    }
                }
                let elsewhere =
                    self.take_pending(inner, stream, rounded, alignment, small, class, size, true);
                if let Some(grant) = elsewhere {
                    return Ok(grant);
                }
                (
                    self.place_and_back(inner, size, rounded, alignment, small, class)?,
                    false,
                )
            }
        };
        let Some(grant) = inner.space.commit(at, rounded, size) else {
            if touched {
                self.untouch(&mut inner.phys, at.addr, rounded);
            }
            let cause = "internal: the placement went stale".to_string();
            return Err(self.oom(inner, size, rounded, alignment, cause));
        };
        if !touched {
            self.touch(&mut inner.phys, grant.addr, grant.size);
        }
        Ok(grant)
    }

    /// Nothing serves the request without a CPU wait: waits, with the lock released, for the
    /// frees still in flight and the fence, then tries once more — the CPU waits only here,
    /// just before refusing. Out of line: the steady state never comes here.
    ///
    /// # Errors
    /// `refused` when it is not out of memory or nothing is in flight to wait for; else as
    /// [`VmmAllocator::serve`].
    #[cold]
    #[inline(never)]
    fn wait_and_serve(
        &self,
        guard: MutexGuard<'_, Inner>,
        r: &Request,
        refused: Error,
        tag: &str,
    ) -> Result<Allocation> {
        if !refused.is_out_of_memory() {
            return Err(refused);
        }
        let waits = guard.order.cpu_waits_pending();
        if waits.is_empty() {
            return Err(refused);
        }
        drop(guard);
        wait_outside(&*self.device, &waits);
        let mut guard = self.inner();
        let inner = &mut *guard;
        self.poll_pending(inner);
        let grant = self.serve(inner, r)?;
        Ok(self.granted(inner, &grant, r.size, r.stream, tag))
    }

    /// The part of [`VmmAllocator::serve`] once a second stream has been seen: `stream`'s own
    /// pending frees, then the GPU-side wait for the fence before the free space.
    ///
    /// # Errors
    /// The device's error when the wait for the fence cannot be enqueued.
    #[inline(never)]
    fn serve_pending_first(&self, inner: &mut Inner, r: &Request) -> Result<Option<Grant>> {
        let stream = r.stream;
        if inner.order.count() > 0 || inner.order.fence_active() {
            self.poll_pending(inner);
            let (rounded, alignment, small) = (r.rounded, r.alignment, r.small);
            let own = self.take_pending(
                inner, stream, rounded, alignment, small, r.class, r.size, false,
            );
            if own.is_some() {
                return Ok(own);
            }
        }
        if inner.order.fence_active() {
            // Memory freed at once before the switch may still be read by the first stream's
            // work: another stream takes it only behind the fence.
            inner.order.order_after_fence(&*self.device, stream)?;
            Self::sync_fence(inner);
        }
        Ok(None)
    }

    fn largest_free_mapped(&self, inner: &Inner) -> u64 {
        let phys = &inner.phys;
        let mut best = 0u64;
        // Replay samples stats after many events: one allocation-free pass over the slab,
        // skipping chunks that cannot beat the best so far (collecting and sorting every
        // free chunk per sample made a plotted replay 30 times slower).
        for (size, addr) in inner.space.free_chunks() {
            if size <= best {
                continue;
            }
            let end = addr + size;
            // Runs of mapped granules under the chunk are usable at once.
            let (gs, ge) = self.span(addr, size);
            phys.mapped_runs(gs, ge, |from, to| {
                best = best.max(to.min(end).saturating_sub(from.max(addr)));
            });
        }
        best
    }

    fn oom(
        &self,
        inner: &Inner,
        requested: u64,
        rounded: u64,
        alignment: u64,
        cause: String,
    ) -> Error {
        let largest = self.largest_free_mapped(inner);
        let pool = inner.phys.pool_bytes();
        let in_use = inner.bytes_in_use();
        let asleep = inner.tags.asleep_bytes();
        // The bins and the region map show sleeping chunks as in use (they hold their
        // addresses); the cause says how much of that is asleep, holding no memory.
        let cause = if asleep > 0 {
            format!(
                "{cause}; {} of the chunks shown in use are asleep (addresses kept, no memory \
                 held), which their wake will need again",
                Bytes(asleep)
            )
        } else {
            cause
        };
        // Declared tags keep granules of their own: with many of them, their partial granules
        // are memory no other tag can use, which the bins alone do not show.
        let cause = match inner.tags.class_count() {
            0 => cause,
            n => format!(
                "{cause}; {n} tag{} that can sleep keep{} granules of {} own (a declared tag's \
                 allocations share none with another tag's: at least a granule of {} each \
                 while it holds memory)",
                if n == 1 { "" } else { "s" },
                if n == 1 { "s" } else { "" },
                if n == 1 { "its" } else { "their" },
                Bytes(self.granularity)
            ),
        };
        let request = FailedRequest {
            allocator: self.name(),
            requested,
            rounded,
            alignment,
            limit: Some(self.options.limit),
        };
        Error::OutOfMemory(Box::new(OomReport {
            bytes_in_use: in_use,
            pool_bytes: pool,
            largest_free_block: largest,
            fragmentation: Stats::compute_fragmentation(pool, in_use, largest),
            bins: inner.space.bin_summaries(),
            regions: inner.space.region_maps(),
            ..request.report(&*self.device, cause)
        }))
    }

    fn check(&self, inner: &Inner) -> std::result::Result<(), String> {
        let g = self.granularity;
        inner.space.check_invariants()?;
        let Scratch {
            missing,
            backing,
            lacking,
        } = &inner.scratch;
        if !(missing.is_empty() && backing.is_empty() && lacking.is_empty()) {
            return Err("back's scratch lists are not empty between calls".into());
        }
        let phys = &inner.phys;
        // Touch counts from the chunks in use; every in-use byte mapped with access.
        let mut touch: FxHashMap<u64, u32> = FxHashMap::default();
        for (addr, size) in inner.space.in_use() {
            if inner.tags.is_asleep(addr) {
                // Asleep: it touches nothing, and nothing need be mapped under it.
                continue;
            }
            let (s, e) = self.span(addr, size);
            for v in (s..e).step_by(g as usize) {
                *touch.entry(v).or_insert(0) += 1;
                if !phys.is_mapped(v) {
                    return Err(format!(
                        "chunk {addr:#x}+{size} in use on granule {v:#x}, which is not mapped"
                    ));
                }
                if phys.lacks_access(v) {
                    return Err(format!(
                        "chunk {addr:#x}+{size} in use on granule {v:#x}, which has no access"
                    ));
                }
            }
        }
        // Exact: the touch counts, the free-mapped and access bitmaps and their counts, the
        // backing of every mapped granule and the idle pieces tiling the handles.
        phys.check(&touch, inner.space.regions())?;
        let pool = phys.pool_bytes();
        if pool > self.options.limit {
            return Err(format!(
                "physical memory held ({pool}) exceeds the budget ({})",
                self.options.limit
            ));
        }
        if inner.peak_pool_bytes < pool || inner.peak_bytes_in_use < inner.bytes_in_use() {
            return Err("a peak is below its current value".into());
        }
        for (r, &(base, size)) in inner.space.regions().iter().enumerate() {
            if inner.unreserved.get(r).copied().unwrap_or(false) && phys.region_counts(base).0 > 0 {
                return Err(format!(
                    "region {base:#x}+{size} has granules mapped while its reservation is freed"
                ));
            }
        }
        if inner.unreserved.len() != inner.space.regions().len() {
            return Err("a region has no reserved/unreserved mark".into());
        }
        if let Some(&r) = inner.blocked.iter().find(|&&r| !inner.unreserved[r]) {
            return Err(format!("region {r} is blocked while reserved"));
        }
        let handles = phys.handles_by_id();
        for (slot, regions) in &inner.mapped_in {
            if !handles.iter().any(|(s, _)| s == slot) {
                return Err(format!(
                    "handle slot {slot} has mapping records but no handle"
                ));
            }
            for &base in regions {
                let reserved = inner
                    .space
                    .regions()
                    .iter()
                    .position(|&(b, _)| b == base)
                    .is_some_and(|r| !inner.unreserved[r]);
                if !reserved {
                    return Err(format!(
                        "handle slot {slot} is recorded as mapped in {base:#x}, which is not \
                         reserved"
                    ));
                }
            }
        }
        streams::check(&inner.order, &inner.space)?;
        inner.tags.check(&inner.space)?;
        Ok(())
    }
}

impl<D: Device + ?Sized> Allocator for VmmAllocator<D> {
    fn name(&self) -> &str {
        "vmm"
    }

    fn id(&self) -> u64 {
        self.id
    }

    /// Best fit in the reserved address space; maps what is not mapped under it (idle
    /// memory, then stitching, then new handles within the budget).
    ///
    /// # Errors
    /// [`Error::InvalidAlignment`], [`Error::InvalidSize`] (overflow once rounded),
    /// [`Error::OutOfMemory`] with a report when the budget cannot hold it or the device
    /// refuses memory; the device's own error when another call fails (the books stay
    /// consistent and nothing leaks).
    ///
    /// # Time complexity
    /// `O(log n)` plus `O(granules)` of the request; under memory pressure linear in the
    /// free chunks.
    fn allocate(&self, size: u64, alignment: u64, stream: Stream, tag: &str) -> Result<Allocation> {
        let Some(Admitted { alignment, rounded }) =
            admit(size, alignment, MIN_ALLOCATION, MAX_ALIGNMENT)?
        else {
            self.inner().num_allocs += 1;
            return Ok(Allocation::empty(stream, self.id));
        };
        let mut guard = self.inner();
        let inner = &mut *guard;
        if rounded > self.options.limit {
            let cause = format!(
                "the request exceeds the physical budget of {} ({} B)",
                Bytes(self.options.limit),
                self.options.limit
            );
            return Err(self.oom(inner, size, rounded, alignment, cause));
        }
        let small = rounded < self.options.small_threshold;
        let class = match inner.tags.class_of(tag) {
            Some(class) => class,
            None => self.class(small),
        };
        if !inner.order.is_first(stream) {
            inner.order.see_stream(&*self.device, stream)?;
            Self::sync_fence(inner);
        }
        let request = Request {
            stream,
            size,
            rounded,
            alignment,
            small,
            class,
        };
        // One stream (the steady state of most programs): its own copy of the path, inlined.
        let served = if inner.order.is_multi() {
            self.serve(inner, &request)
        } else {
            self.serve_free_space(inner, &request)
        };
        match served {
            Ok(grant) => Ok(self.granted(inner, &grant, size, stream, tag)),
            Err(refused) => self.wait_and_serve(guard, &request, refused, tag),
        }
    }

    /// Frees the chunk and coalesces it with its free neighbours; unmaps nothing.
    ///
    /// # Errors
    /// [`Error::ForeignAllocation`] when another allocator made it;
    /// [`Error::UnknownPointer`] when it names no live chunk of this allocator.
    ///
    /// # Time complexity
    /// `O(log n)` plus `O(granules)` of the chunk.
    fn deallocate(&self, allocation: Allocation) -> Result<()> {
        if !holds_memory(&allocation, self.id)? {
            return Ok(());
        }
        // Made on another thread's per-thread stream: no event on this thread's can order the
        // free after that work, so the device is synchronised (without the lock) instead.
        let settled = allocation.freed_off_its_thread() && synchronized(&*self.device);
        let mut guard = self.inner();
        let inner = &mut *guard;
        let unknown = || Error::UnknownPointer {
            what: "allocation",
            ptr: allocation.ptr(),
            backend: self.device.info().vendor.name(),
        };
        if !inner.order.is_multi() {
            // One stream: the chunk goes back to the free space at once, its label (its
            // tag, `sleep`'s *Books*) read from the record the free loads.
            let Some((size, _, label)) = inner
                .space
                .free_labelled(allocation.ptr(), allocation.token())
            else {
                return Err(unknown());
            };
            if label == 0 || !self.forget_label(inner, label, &allocation, size) {
                let (start, end) = self.span(allocation.ptr(), size);
                // No event: work queued before the free may still read these granules.
                inner.phys.untouch_unsettled(start, end);
                inner.order.freed_at_once();
            }
            return Ok(());
        }
        // A tagged chunk's tag is its label (`sleep`'s *Books*), read and cleared in the
        // record the free loads anyway; while nothing is tagged, not even that.
        let label = if inner.tags.any() {
            inner.space.take_label(allocation.ptr(), allocation.token())
        } else {
            None
        };
        if let Some((label, size)) = label.filter(|&(label, _)| label != 0) {
            if self.forget_label(inner, label, &allocation, size) {
                // Asleep: no work can use it (waited for at the sleep), so no event orders
                // its reuse.
                return match inner.space.free(allocation.ptr(), allocation.token()) {
                    Some(_) => Ok(()),
                    None => Err(unknown()),
                };
            }
        }
        if self.free_on_stream(
            inner,
            allocation.stream(),
            allocation.ptr(),
            allocation.token(),
            settled,
        ) {
            Ok(())
        } else {
            Err(unknown())
        }
    }

    fn tag_of(&self, allocation: &Allocation) -> Option<String> {
        if allocation.allocator_id() != self.id {
            return None;
        }
        let inner = self.inner();
        let label = inner.space.label(allocation.ptr(), allocation.token())?;
        inner.tags.name_of(label).map(|n| n.to_string())
    }

    /// The pieces of the handles mapped under it.
    fn backing(&self, allocation: &Allocation) -> Result<crate::allocator::Backing> {
        let refuse = |why: &str| crate::Error::InvalidArgument {
            call: "backing",
            reason: format!("{:#x} {why}", allocation.ptr()),
        };
        if allocation.allocator_id() != self.id || allocation.is_empty() {
            return Err(refuse(
                "is not a live, non-empty allocation of this vmm allocator",
            ));
        }
        let inner = self.inner();
        if inner
            .space
            .in_use_size(allocation.ptr(), allocation.token())
            .is_none()
        {
            return Err(refuse("is not a live allocation of this vmm allocator"));
        }
        if inner.tags.is_asleep(allocation.ptr()) {
            return Err(refuse(
                "sleeps: its memory is given back; wake its tag before exporting it",
            ));
        }
        let g = self.granularity;
        let start = allocation.ptr() / g * g;
        let end = (allocation.ptr() + allocation.size()).div_ceil(g) * g;
        let runs = inner
            .phys
            .pieces_of(start, end)
            .ok_or_else(|| refuse("lies on granules that are not mapped"))?;
        Ok(crate::allocator::Backing::Mapped {
            start,
            end,
            pieces: runs
                .into_iter()
                .map(
                    |(va, len, id, handle_size, offset)| crate::allocator::MappedPiece {
                        va,
                        len,
                        handle: crate::device::PhysicalHandle(id),
                        handle_size,
                        offset,
                    },
                )
                .collect(),
        })
    }

    /// The chunk it holds, rounded to 256 B (a pending free was given a fresh token: `None`).
    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        self.inner()
            .space
            .in_use_size(allocation.ptr(), allocation.token())
    }

    /// Physical memory held (mapped or idle), as [`Stats::pool_bytes`].
    ///
    /// # Time complexity
    /// `O(1)`: the physical books keep the count (the largest free block `stats` reports is
    /// a walk over the free chunks).
    fn pool_bytes(&self) -> u64 {
        self.inner().phys.pool_bytes()
    }

    /// `pool_bytes` = physical memory held (mapped or idle); `largest_free_block_bytes` = the
    /// largest free range that is mapped already.
    ///
    /// # Time complexity
    /// Linear in the free chunks at worst.
    fn stats(&self) -> Stats {
        let inner = self.inner();
        let largest = self.largest_free_mapped(&inner);
        let pool = inner.phys.pool_bytes();
        let in_use = inner.bytes_in_use();
        Stats {
            num_allocs: inner.num_allocs,
            bytes_in_use: in_use,
            peak_bytes_in_use: inner.peak_bytes_in_use,
            largest_alloc_size: inner.largest_alloc_size,
            bytes_limit: Some(self.options.limit),
            bytes_reserved: 0,
            peak_bytes_reserved: 0,
            largest_free_block_bytes: largest,
            pool_bytes: pool,
            peak_pool_bytes: inner.peak_pool_bytes,
            fragmentation: Stats::compute_fragmentation(pool, in_use, largest),
            bytes_asleep: inner.tags.asleep_bytes(),
            host_bytes_asleep: inner.tags.host_bytes(),
        }
    }

    /// Unmaps every free granule and releases every handle none of whose granules is mapped;
    /// frees the host memory kept from earlier wakes for the next sleep.
    /// Returns the bytes released.
    ///
    /// # Errors
    /// The device's error; what was unmapped or released before it stays so.
    fn trim(&self) -> Result<u64> {
        let device = &*self.device;
        let mut guard = self.inner();
        // Memory freed at once is fenced on the device; then the work on everything freed
        // is waited for with the lock released. What is freed meanwhile stays mapped.
        if guard.order.unfenced() {
            guard.order.fence_now(device)?;
            Self::sync_fence(&mut guard);
        }
        let waits = guard.order.cpu_waits_pending();
        if !waits.is_empty() {
            drop(guard);
            wait_outside(device, &waits);
            guard = self.inner();
        }
        let inner = &mut *guard;
        self.poll_pending(inner);
        // Host memory kept for the next sleep goes too (it is not the device's, and not
        // counted in what is returned).
        self.free_spare(inner);
        let vm = self.vm()?;
        let g = self.granularity;
        // In address order; only what no work in flight may read.
        for v in inner.phys.settled_free_granules() {
            vm.unmap(v, g)?;
            inner.counters.unmaps += 1;
            if let Some(piece) = inner.phys.unmap(v) {
                inner.phys.make_idle(piece);
            }
        }
        self.release_idle_handles(vm, inner)
    }

    /// See [`VmmAllocator::sleep`].
    fn sleep(&self, tag: &str, keep: Keep) -> Result<SleepReport> {
        VmmAllocator::sleep(self, tag, keep)
    }

    /// See [`VmmAllocator::wake`].
    fn wake(&self, tag: &str) -> Result<SleepReport> {
        VmmAllocator::wake(self, tag)
    }

    fn sleeping(&self) -> Vec<SleepingTag> {
        VmmAllocator::sleeping(self)
    }

    fn is_asleep(&self, allocation: &Allocation) -> bool {
        self.inner().tags.is_asleep(allocation.ptr())
    }

    /// Moves the allocation's sleep record to `tag`. Its memory stays where it was placed: a
    /// donated buffer may share granules with its old tag's, so a sleep of either hands
    /// back only the granules nothing awake touches.
    fn retag(&self, allocation: &Allocation, tag: &str) {
        if allocation.is_empty() || allocation.allocator_id() != self.id {
            return;
        }
        let mut guard = self.inner();
        let inner = &mut *guard;
        // Only a chunk in use (not a pending free: its token is a fresh one) carries a tag.
        inner
            .tags
            .retag(&mut inner.space, allocation.ptr(), allocation.token(), tag);
    }

    /// Its sleep record goes (an awake one): the caller has freed it.
    fn freeing(&self, allocation: &Allocation) {
        if allocation.is_empty() || allocation.allocator_id() != self.id {
            return;
        }
        let mut guard = self.inner();
        let inner = &mut *guard;
        inner
            .tags
            .retag(&mut inner.space, allocation.ptr(), allocation.token(), "");
    }

    /// Chunks tile the reservations, the free index holds exactly the free chunks, no two
    /// free neighbours, every byte in use is mapped (with access), mapped and idle granules
    /// tile the handles, mapped bytes = the handles' mapped bytes, physical held ≤ budget.
    fn check_invariants(&self) -> std::result::Result<(), String> {
        let inner = self.inner();
        self.check(&inner)
    }
}

impl<D: Device + ?Sized> Drop for VmmAllocator<D> {
    fn drop(&mut self) {
        let g = self.granularity;
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        // Work may still use the memory: wait before anything is unmapped — for the frees
        // (or, with allocations still live, on streams the books do not know, for the whole
        // device).
        let live = inner.space.live_count() - inner.order.count();
        let waited = if live > 0 {
            self.device.synchronize_device()
        } else {
            let mut done = Vec::new();
            let settled = inner.order.settle(&*self.device, |c| done.push(c));
            for c in done {
                if inner.space.free(c.addr, c.token).is_none() {
                    debug_assert!(false, "a pending chunk was not in use");
                }
            }
            settled
        };
        if let Err(e) = waited {
            tracing::warn!(allocator = "vmm", error = %e,
                "could not wait for the work on its memory; unmapping it anyway");
        }
        for copy in inner.tags.drain_spare() {
            if let Err(e) = copy.free(&*self.device) {
                tracing::warn!(error = %e, "vmm: a host copy could not be freed (leaked)");
            }
        }
        for tagged in inner.tags.drain() {
            if let Some(copy) = tagged.copy {
                if let Err(e) = copy.free(&*self.device) {
                    tracing::warn!(error = %e, "vmm: a host copy could not be freed (leaked)");
                }
            }
        }
        let order = std::mem::take(&mut inner.order);
        for event in order.events() {
            if let Err(e) = super::release_with_retry(|| self.device.destroy_event(event)) {
                tracing::debug!(event = event.0, error = %e, "vmm: could not destroy an event");
            }
        }
        let live = inner.space.live_count() - order.count();
        if live > 0 {
            tracing::warn!(
                allocator = "vmm",
                live,
                bytes = inner.space.bytes_in_use() - order.bytes(),
                "allocator dropped with live allocations (leaked); returning its memory to the device"
            );
        }
        let Some(vm) = self.device.virtual_memory() else {
            return;
        };
        for v in inner.phys.mapped_granules() {
            if let Err(e) = super::release_with_retry(|| vm.unmap(v, g)) {
                tracing::warn!(va = v, error = %e, "vmm: could not unmap a granule");
            }
        }
        for (_, h) in inner.phys.handles_by_id() {
            let h = h.id;
            if let Err(e) = super::release_with_retry(|| vm.release_physical(PhysicalHandle(h))) {
                tracing::warn!(handle = h, error = %e, "vmm: could not release a physical handle");
            }
        }
        inner.phys.clear();
        if let Some(stream) = inner.copy_stream.take() {
            if let Err(e) = stream.destroy(&*self.device) {
                tracing::debug!(error = %e, "vmm: could not destroy its copy stream");
            }
        }
        for (r, &(base, size)) in inner.space.regions().iter().enumerate() {
            if inner.unreserved.get(r).copied().unwrap_or(false) {
                continue;
            }
            if let Err(e) = super::release_with_retry(|| vm.free_reservation(base, size)) {
                tracing::warn!(base, size, error = %e, "vmm: could not free a reservation");
            }
        }
    }
}
