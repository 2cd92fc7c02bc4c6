//! The `Allocator` trait, the owned [`Allocation`] it hands out, and [`Stats`].

use std::sync::atomic::{AtomicU64, Ordering};

use crate::device::Stream;
use crate::error::Result;

/// A block of device memory owned by the caller.
///
/// Move-only: it is not `Clone`, and [`Allocator::deallocate`] consumes it, so freeing it
/// twice does not compile. Dropping it without handing it back leaks the memory until the
/// allocator itself is dropped, which reports it: for memory that frees itself on drop, use
/// a [`crate::DeviceBuffer`].
#[must_use = "an Allocation must be handed back with Allocator::deallocate (or owned by a DeviceBuffer), or it leaks"]
#[derive(Debug, PartialEq, Eq)]
pub struct Allocation {
    ptr: u64,
    size: u64,
    stream: Stream,
    allocator_id: u64,
    token: u64,
    /// The thread that made it ([`crate::device::thread_number`]) when `stream` is
    /// [`Stream::PER_THREAD`], else 0: a free of it on another thread cannot be ordered by an
    /// event on the allocating thread's stream.
    origin: u64,
}

/// The calling thread's number, out of line: the thread-local lookup stays off the path of
/// every allocation on a stream other than [`Stream::PER_THREAD`].
#[inline(never)]
fn per_thread_origin() -> u64 {
    crate::device::thread_number()
}

impl Allocation {
    /// Makes an allocation record. For strategies and adaptors.
    ///
    /// `token` is private to the allocator that makes it (a chunk index, a sequence number).
    #[inline]
    pub fn new(ptr: u64, size: u64, stream: Stream, allocator_id: u64, token: u64) -> Self {
        let origin = if stream.is_per_thread() {
            per_thread_origin()
        } else {
            0
        };
        Allocation {
            ptr,
            size,
            stream,
            allocator_id,
            token,
            origin,
        }
    }

    /// [`Allocation::new`] made on thread `origin` (a number from
    /// [`Allocation::origin_thread`]): for an allocation taken apart and made again, such as
    /// [`crate::DeviceBuffer::from_raw`].
    pub fn with_origin(mut self, origin: u64) -> Self {
        if self.stream.is_per_thread() {
            self.origin = origin;
        }
        self
    }

    /// The number of the thread that made it, for an allocation on [`Stream::PER_THREAD`]
    /// (another stream on each thread); 0 for any other stream.
    pub fn origin_thread(&self) -> u64 {
        self.origin
    }

    /// True for an allocation on [`Stream::PER_THREAD`] made on a thread other than the
    /// calling one: its free cannot be ordered by an event on the calling thread's
    /// per-thread stream, which is another stream. A strategy synchronises the device first.
    #[inline]
    pub fn freed_off_its_thread(&self) -> bool {
        self.stream.is_per_thread() && self.origin != crate::device::thread_number()
    }

    /// The empty allocation every allocator hands out for a zero-byte request: no memory,
    /// no device call.
    pub fn empty(stream: Stream, allocator_id: u64) -> Self {
        Allocation::new(0, 0, stream, allocator_id, 0)
    }

    /// Checks that allocator `allocator_id` made this allocation.
    ///
    /// # Errors
    /// [`crate::Error::ForeignAllocation`] when another allocator made it.
    #[inline]
    pub fn check_owner(&self, allocator_id: u64) -> Result<()> {
        if self.allocator_id == allocator_id {
            return Ok(());
        }
        Err(crate::Error::ForeignAllocation {
            ptr: self.ptr,
            owner: self.allocator_id,
            this: allocator_id,
        })
    }

    /// The device address. 0 for an empty (zero-byte) allocation.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The size requested, in bytes (the strategy may have reserved more).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// True for a zero-byte allocation, which owns no memory.
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The stream the allocation was made for.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// The id of the allocator that made it.
    pub fn allocator_id(&self) -> u64 {
        self.allocator_id
    }

    /// The allocator-private token.
    pub fn token(&self) -> u64 {
        self.token
    }
}

pub use crate::stats::Stats;

/// What [`Allocator::sleep`] keeps of the allocations it puts to sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Keep {
    /// Their bytes are copied to host memory (pinned where the driver offers it) before the
    /// device memory goes, and copied back at the wake: model weights.
    Contents,
    /// Their bytes are discarded: after the wake they hold whatever the new memory holds
    /// (a KV cache, rebuilt anyway).
    Nothing,
}

/// What one [`Allocator::sleep`] or [`Allocator::wake`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SleepReport {
    /// Allocations put to sleep (or woken).
    pub allocations: u64,
    /// Their bytes (as the strategy rounded them).
    pub bytes: u64,
    /// Bytes copied to the host (sleep) or back from it (wake).
    pub copied_bytes: u64,
    /// Physical memory handed back to the device (sleep) or taken from it (wake).
    pub device_bytes: u64,
    /// Sleep: physical memory the device could not take back because another process still
    /// maps it (an import of an export of this tag, [`crate::share`]): the driver keeps it
    /// until that process drops its import. 0 for a wake.
    pub kept_by_importers: u64,
}

/// The sleeping allocations of one tag, as [`Allocator::sleeping`] lists them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SleepingTag {
    /// The tag.
    pub tag: String,
    /// Its allocations asleep.
    pub allocations: u64,
    /// Their bytes, not on the device while they sleep (and not in
    /// [`Stats::bytes_in_use`]).
    pub bytes_asleep: u64,
    /// Bytes of their contents held in host memory.
    pub host_bytes: u64,
}

/// `sleep` and `wake` for a strategy that does not map its memory into reserved ranges:
/// refused, naming the strategy (not the backend, which may well offer them through vmm) and
/// the strategy that offers them.
macro_rules! no_sleep {
    () => {
        /// Unsupported: see [`crate::strategy::vmm::VmmAllocator::sleep`].
        fn sleep(
            &self,
            _tag: &str,
            _keep: crate::allocator::Keep,
        ) -> crate::error::Result<crate::allocator::SleepReport> {
            Err(crate::allocator::sleep_unsupported(self.name()))
        }

        /// Unsupported: see [`crate::strategy::vmm::VmmAllocator::wake`].
        fn wake(&self, _tag: &str) -> crate::error::Result<crate::allocator::SleepReport> {
            Err(crate::allocator::sleep_unsupported(self.name()))
        }
    };
}
pub(crate) use no_sleep;

/// The refusal of sleep and wake by a strategy without virtual memory: the strategy refuses,
/// whatever the backend.
pub(crate) fn sleep_unsupported(strategy: &str) -> crate::Error {
    crate::Error::StrategyUnsupported {
        what: "sleep and wake".into(),
        strategy: strategy.into(),
        reason: format!(
            "{strategy} does not map its memory into reserved address ranges, so it cannot \
             hand memory back and take it again at the same addresses; the vmm strategy \
             (PORTALLOC_ALLOCATOR=vmm) offers sleep and wake"
        ),
    }
}

/// A graph pool: memory kept for the graphs captured into it (see [`crate::GraphPools`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct GraphPoolId(pub(crate) u64);

impl GraphPoolId {
    /// The pool's number, as the C ABI and Python give it.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The pool numbered `n` (a number [`GraphPoolId::get`] gave).
    pub const fn from_raw(n: u64) -> GraphPoolId {
        GraphPoolId(n)
    }
}

impl std::fmt::Display for GraphPoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "graph pool {}", self.0)
    }
}

/// One pool's counters ([`crate::adaptor::GraphPools::pool_stats`]; in a ledger snapshot,
/// [`crate::adaptor::LedgerSnapshot::graph_pools`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct GraphPoolStats {
    /// The pool.
    pub id: GraphPoolId,
    /// The tag its memory carries in the strategy (what [`crate::adaptor::GraphPools::sleep_pool`] sleeps).
    pub tag: String,
    /// Blocks it holds.
    pub blocks: usize,
    /// Bytes of them (as requested when each was made).
    pub held_bytes: u64,
    /// Bytes of the blocks handed out now.
    pub in_use_bytes: u64,
    /// Bytes of the blocks free in the pool (for its captures only).
    pub free_bytes: u64,
    /// Captures routed to it now.
    pub routed_captures: usize,
    /// Released: its blocks go back to the strategy as they are freed.
    pub released: bool,
}

/// What memory lies under a live allocation: what [`crate::share`] exports to another
/// process. Addresses are this process's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backing {
    /// Part of one allocation of the device's plain [`crate::Device::alloc`]: the one that
    /// starts at `base` and is `size` bytes long (bfc's region, platform's own allocation).
    /// Exported through the driver's legacy IPC handle of `base`.
    Plain {
        /// Where the device allocation starts.
        base: u64,
        /// Its size, as allocated.
        size: u64,
    },
    /// Physical memory mapped into reserved address space (vmm): the granule-aligned span
    /// `[start, end)` covering the allocation, piece by piece in address order. Exported as
    /// the handles' POSIX descriptors.
    Mapped {
        /// The first granule under the allocation.
        start: u64,
        /// The end of the last granule under it.
        end: u64,
        /// The pieces, in address order, covering `[start, end)` exactly.
        pieces: Vec<MappedPiece>,
    },
}

/// A run of granules of [`Backing::Mapped`]: `len` bytes at `va`, mapped from `offset` in
/// the physical handle `handle` of `handle_size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedPiece {
    /// Where the run is mapped.
    pub va: u64,
    /// Its length (granules).
    pub len: u64,
    /// The physical handle behind it.
    pub handle: crate::device::PhysicalHandle,
    /// The handle's size.
    pub handle_size: u64,
    /// Where in the handle the run starts.
    pub offset: u64,
}

/// What a user calls: every strategy and adaptor implements it.
///
/// Allocators are `Send + Sync`: one may be shared by many threads. Requests follow the
/// stream-ordering contract written on [`crate::device::Device`].
pub trait Allocator: Send + Sync {
    /// A short name for reports (`bfc`, `platform`, …).
    fn name(&self) -> &str;

    /// This allocator's unique id; every [`Allocation`] it makes carries it.
    fn id(&self) -> u64;

    /// Allocates `size` bytes aligned to `alignment` (a power of two; 0 means the strategy's
    /// default) for use on `stream`. `tag` labels the allocation for ledgers and reports
    /// (`buffer`, `workspace`, …). A zero `size` gives an empty allocation and no device call.
    ///
    /// # Errors
    /// [`crate::Error::InvalidAlignment`], [`crate::Error::InvalidSize`] (overflow once
    /// rounded), [`crate::Error::ExceedsLimit`], [`crate::Error::OutOfMemory`] with a report.
    fn allocate(&self, size: u64, alignment: u64, stream: Stream, tag: &str) -> Result<Allocation>;

    /// Hands an allocation back, in stream order on the stream it was made for.
    ///
    /// # Errors
    /// [`crate::Error::ForeignAllocation`] when another allocator made it.
    fn deallocate(&self, allocation: Allocation) -> Result<()>;

    /// Current counters.
    fn stats(&self) -> Stats;

    /// The bytes this allocator counts in [`Stats::bytes_in_use`] for `allocation`, a live
    /// one of its own: the request as the strategy rounded it (bfc's chunk; vmm's 256-byte
    /// multiple, or its chunk where a sliver was folded into it; the pool's request). For an adaptor that records sizes (the ledger) without
    /// serialising its upstream. `None` when it cannot tell (a foreign or freed allocation;
    /// the default).
    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        let _ = allocation;
        None
    }

    /// The bytes held from the device now: [`Stats::pool_bytes`] without the rest of
    /// [`Allocator::stats`], some of which a strategy may compute by walking its free space
    /// (vmm's largest free block). For callers that sample it often, as a plotted replay
    /// does after every few events. Default: `self.stats().pool_bytes`.
    fn pool_bytes(&self) -> u64 {
        self.stats().pool_bytes
    }

    /// Returns memory the allocator holds but does not use to the device, where the strategy
    /// can. Returns the number of bytes released.
    fn trim(&self) -> Result<u64>;

    /// Hands back the device memory of the live allocations tagged `tag` (see
    /// [`crate::strategy::vmm::VmmAllocator::sleep`]), keeping their addresses. Offered by
    /// strategies that map memory into reserved ranges (vmm).
    ///
    /// # Errors
    /// [`crate::Error::StrategyUnsupported`] by default, naming the strategy and the one that offers
    /// it.
    fn sleep(&self, tag: &str, keep: Keep) -> Result<SleepReport> {
        let _ = (tag, keep);
        Err(sleep_unsupported(self.name()))
    }

    /// Takes device memory again for the allocations of `tag` that sleep, at their
    /// addresses, and copies their contents back.
    ///
    /// # Errors
    /// As [`Allocator::sleep`].
    fn wake(&self, tag: &str) -> Result<SleepReport> {
        let _ = tag;
        Err(sleep_unsupported(self.name()))
    }

    /// The tags with allocations asleep, by name. Default: none.
    fn sleeping(&self) -> Vec<SleepingTag> {
        Vec::new()
    }

    /// True when `allocation`, a live one of this allocator, sleeps. Default: false.
    fn is_asleep(&self, allocation: &Allocation) -> bool {
        let _ = allocation;
        false
    }

    /// Moves `allocation`, a live one of this allocator, to `tag` in the books that decide
    /// what sleeps: a sleep of `tag` takes it from now on, a sleep of its old tag no longer
    /// does (a donation, [`crate::adaptor::LedgerAllocator::donate`]). Where it lies does not
    /// change. Default: nothing (a strategy without sleep keeps no such books).
    fn retag(&self, allocation: &Allocation, tag: &str) {
        let _ = (allocation, tag);
    }

    /// Says that the caller has freed `allocation` and that its free waits for work on other
    /// streams (`record_stream`): from now on it is no sleeper — a sleep of its tag neither
    /// copies nor unmaps it — until [`Allocator::deallocate`] takes it. Default: nothing.
    fn freeing(&self, allocation: &Allocation) {
        let _ = allocation;
    }

    /// Checks the allocator's internal invariants, describing the first one broken. For
    /// tests; may be slow (linear in the number of blocks).
    fn check_invariants(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    /// True when [`Allocator::allocate`] queues an operation on the request's stream (the
    /// driver's stream-ordered pools: `cuMemAllocFromPoolAsync`): on a stream being captured
    /// into a graph it would become a graph memory node, so [`crate::GraphPools`] asks such a
    /// strategy on a stream of its own. Default: false; adaptors answer their upstream's.
    fn queues_on_stream(&self) -> bool {
        false
    }

    /// The tag `allocation`, a live one of this allocator, sleeps with (what a sleep of that
    /// tag takes); `None` for none, or where the strategy keeps no tags (the default).
    /// Adaptors answer their upstream's.
    fn tag_of(&self, allocation: &Allocation) -> Option<String> {
        let _ = allocation;
        None
    }

    /// What memory lies under `allocation`, a live one of this allocator, for export to
    /// another process ([`crate::share`]). vmm answers [`Backing::Mapped`], bfc and platform
    /// [`Backing::Plain`]; adaptors answer their upstream's.
    ///
    /// # Errors
    /// [`crate::Error::ForeignAllocation`] for another allocator's; [`crate::Error::InvalidArgument`]
    /// for an empty, freed or sleeping one; [`crate::Error::StrategyUnsupported`] by default,
    /// naming the strategies that can.
    fn backing(&self, allocation: &Allocation) -> Result<Backing> {
        let _ = allocation;
        Err(crate::Error::StrategyUnsupported {
            what: "export to another process".into(),
            strategy: self.name().to_string(),
            reason: format!(
                "{} cannot say which device memory lies under its allocations; vmm (shareable \
                 handles), bfc and platform (legacy IPC handles) can",
                self.name()
            ),
        })
    }

    /// The graph pools in front of the strategy ([`crate::GraphPools`]), with their
    /// counters: what a ledger snapshot lists. Default: none; adaptors answer their
    /// upstream's.
    fn graph_pools(&self) -> Vec<GraphPoolStats> {
        Vec::new()
    }
}

/// Hands out process-unique allocator ids.
pub fn next_allocator_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Checks an alignment argument: 0 means `default`; otherwise a power of two up to `max`.
/// Returns the effective alignment, at least `minimum`.
pub fn effective_alignment(alignment: u64, minimum: u64, max: u64) -> Result<u64> {
    let a = if alignment == 0 { minimum } else { alignment };
    if !a.is_power_of_two() || a > max {
        return Err(crate::Error::InvalidAlignment { alignment, max });
    }
    Ok(a.max(minimum))
}

/// Rounds `size` up to a multiple of `multiple` (a power of two), refusing overflow.
pub fn round_up(size: u64, multiple: u64) -> Result<u64> {
    debug_assert!(multiple.is_power_of_two());
    size.checked_add(multiple - 1)
        .map(|s| s & !(multiple - 1))
        .ok_or(crate::Error::InvalidSize {
            size,
            reason: "overflows u64 once rounded up to the alignment; accepted: sizes up to the allocator's limit",
        })
}
