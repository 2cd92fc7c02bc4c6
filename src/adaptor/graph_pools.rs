//! [`GraphPools`]: what an allocator must do while streams are captured into graphs (CUDA
//! graphs, HIP graphs: PyTorch's `torch.cuda.graph`, vLLM's and SGLang's decode graphs,
//! cudarc's `CudaGraph`), once, in front of any strategy.
//!
//! While a stream is captured the driver runs nothing: what is queued on it becomes a graph,
//! replayed later — many times — at the same addresses. Three things follow, and this adaptor
//! does each, as PyTorch's caching allocator does with its private pools:
//!
//! * **Memory handed out during a capture belongs to the capture's graph pool** until the
//!   caller releases the pool ([`GraphPools::release_pool`]). A free during or after the
//!   capture returns the block to the pool, where a later request of a capture routed to the
//!   same pool may take it again (in stream order, as the replays run); never to eager
//!   requests, another pool, or the strategy's trim, stitching or shrink, which would let
//!   other work write memory every replay of the graph still reads and writes. Pools may be
//!   shared between captures, as PyTorch's `pool=` shares them.
//! * **A request on a captured stream reaches the strategy on a stream where it does nothing
//!   the capture forbids** (see *The stream the strategy is asked on*), with the calling
//!   thread's capture mode set to relaxed for the call (as PyTorch wraps `cudaMalloc` during
//!   capture): the strategy's growth (`cuMemAlloc`, `cuMemCreate`) is then neither forbidden
//!   nor recorded into the graph. What the strategy cannot give fails with
//!   [`Error::StreamCapturing`], which says what to do.
//! * **A free of eager memory on a captured stream is held** until that stream's capture
//!   ends: handing it to the strategy then would record an event on the captured stream
//!   (which becomes a node, and queried later is `CUDA_ERROR_CAPTURED_EVENT`, invalidating
//!   the capture).
//!
//! # Routing: which requests go to which pool
//!
//! [`GraphPools::begin_allocate_to_pool`] routes the requests of the capture on a stream (on
//! every stream that joins it) to a pool, until [`GraphPools::end_allocate_to_pool`]; call it
//! before the capture begins, as PyTorch calls `beginAllocateToPool` (see *The stream the
//! strategy is asked on* for what routing after costs). With
//! [`Detect::EveryRequest`] a capture nobody routed gets a pool of its own, found by asking
//! the driver about every request's stream: what a caller that cannot say when it captures
//! needs (the PyTorch hook, which PyTorch gives only the stream). The cost of each mode,
//! counted in driver calls (`capture_status`, a CPU-side call that waits for nothing):
//!
//! | mode | outside any capture | while a capture is routed |
//! |---|---|---|
//! | [`Detect::WhileRouted`] | none | one per allocation and free |
//! | [`Detect::EveryRequest`] | one per allocation and free | one per allocation and free |
//!
//! # The stream the strategy is asked on
//!
//! The adaptor tracks the streams it asks the strategy on. A strategy that queues its
//! allocations on the stream ([`Allocator::queues_on_stream`]: the async pool) is asked on the
//! adaptor's own side stream ([`crate::Device::create_stream`], never captured), which is
//! synchronised before the block is handed out. Any other strategy is asked on the one stream
//! it has seen so far, while it has seen one — bfc and vmm then keep no per-stream books, and
//! asking on that stream (even while it is captured) records nothing there — else on the side
//! stream. [`GraphPools::begin_allocate_to_pool`], called before the capture begins, first has
//! the strategy see the side stream (a byte allocated and freed there), so that what bfc and
//! vmm do when a second stream appears — a fence recorded on their first stream — happens
//! outside the capture. Called after, with vmm and memory freed at once on the captured stream
//! just before the capture, vmm records that fence on the captured stream, which invalidates
//! the capture: route before capturing, as PyTorch calls `beginAllocateToPool`.
//!
//! # Releasing and sleeping
//!
//! [`GraphPools::release_pool`] gives the pool's free blocks back to the strategy after
//! synchronising the device: graphs are launched on streams the allocator never sees, so only
//! the whole device says that no replay still runs. Blocks still in use go back when freed.
//! A device synchronisation is forbidden during a capture (the driver invalidates it): release,
//! sleep and wake are refused while a capture the adaptor routes is under way, and a capture
//! it does not know of is the caller's to keep apart from them.
//! [`GraphPools::sleep_pool`] and [`GraphPools::wake_pool`] sleep and wake the pool's memory
//! as a tag (its blocks carry the pool's tag in the strategy: vmm keeps their addresses), so
//! an RL job releases its decode graphs' memory between rollouts and replays them after the
//! wake without capturing again. What the caller must redo after a wake is whatever was bound
//! to the old physical memory rather than to the addresses: NCCL user-buffer registrations
//! (`ncclCommRegister`, behind torch_memory_saver#88's hang after resume) and IPC handles
//! exported from it. [`GraphPoolHooks`] runs the caller's code before the sleep (deregister)
//! and after the wake (register again), with the pool's ranges.
#![deny(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::allocator::{next_allocator_id, Allocation, Allocator, Keep, SleepReport, Stats};
pub use crate::allocator::{GraphPoolId, GraphPoolStats};
use crate::backends::own_stream::OwnedStream;
use crate::device::{with_capture_mode, CaptureMode, Device, Stream};
use crate::error::{Error, Result};
use crate::units::Bytes;

/// When [`GraphPools`] asks the driver whether a request's stream is captured.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Detect {
    /// Only while a capture is routed ([`GraphPools::begin_allocate_to_pool`]) or a free is
    /// held for one: no driver call otherwise. A capture nobody routed reaches the strategy
    /// as any request does. For callers that say when they capture (Rust, C).
    #[default]
    WhileRouted,
    /// For every allocation and free: a capture nobody routed gets a pool of its own. For
    /// callers that cannot say when they capture (the PyTorch hook).
    EveryRequest,
}

/// A caller's code run around a pool's sleep and wake, with the pool and its ranges
/// (`(address, bytes)`): deregister what is bound to the physical memory before the sleep
/// (NCCL user buffers, IPC exports), register it again after the wake.
pub type RangesHook = Box<dyn Fn(GraphPoolId, &[(u64, u64)]) + Send + Sync>;

/// The hooks [`GraphPools::set_hooks`] takes.
#[derive(Default)]
#[non_exhaustive]
pub struct GraphPoolHooks {
    /// Run before a pool's memory sleeps.
    pub before_sleep: Option<RangesHook>,
    /// Run after a pool's memory woke (at the same addresses).
    pub after_wake: Option<RangesHook>,
}

impl GraphPoolHooks {
    /// No hooks.
    pub fn new() -> Self {
        Self::default()
    }

    /// With `hook` run before each sleep.
    pub fn before_sleep(mut self, hook: RangesHook) -> Self {
        self.before_sleep = Some(hook);
        self
    }

    /// With `hook` run after each wake.
    pub fn after_wake(mut self, hook: RangesHook) -> Self {
        self.after_wake = Some(hook);
        self
    }
}

impl fmt::Debug for GraphPoolHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphPoolHooks")
            .field("before_sleep", &self.before_sleep.is_some())
            .field("after_wake", &self.after_wake.is_some())
            .finish()
    }
}

/// A block a pool holds: one allocation of the strategy beneath.
#[derive(Debug)]
struct Block {
    upstream: Allocation,
    in_use: bool,
    /// The stream its last free was made on: a free block serves requests on that stream
    /// only. Two branches of a forked capture run concurrently in a replay, and a block one
    /// branch freed may still be read by the other's work (PyTorch's private pools keep the
    /// same rule).
    freed_on: Stream,
}

#[derive(Debug)]
struct Pool {
    tag: String,
    /// By address. Invariant: exactly the blocks whose address `by_ptr` maps to this pool.
    blocks: BTreeMap<u64, Block>,
    /// `(size, address)` of the blocks not in use. Invariant: exactly those.
    free: BTreeSet<(u64, u64)>,
    released: bool,
    /// Its memory sleeps ([`GraphPools::sleep_pool`]): no block is handed out until the wake.
    asleep: bool,
}

/// Requests of a capture go to `pool`: the capture `capture` once known, else the next one
/// seen on `stream`.
#[derive(Debug, Clone, Copy)]
struct Route {
    pool: u64,
    stream: Stream,
    capture: Option<u64>,
    /// Made for a capture nobody routed ([`Detect::EveryRequest`]): dropped when it ends.
    automatic: bool,
}

/// A free the strategy gets once `stream`'s capture has ended.
#[derive(Debug)]
struct Held {
    upstream: Allocation,
    stream: Stream,
}

#[derive(Debug, Default)]
struct Books {
    next_pool: u64,
    pools: BTreeMap<u64, Pool>,
    routes: Vec<Route>,
    /// Every pool block's address → its pool.
    by_ptr: HashMap<u64, u64>,
    held: Vec<Held>,
}

struct Shared {
    id: u64,
    /// The strategy; `None` only while being dropped (before the side stream goes).
    upstream: Option<Box<dyn Allocator>>,
    device: Arc<dyn Device>,
    detect: Detect,
    side: OnceLock<OwnedStream>,
    /// The first stream the strategy was asked on (its raw handle + 1; 0: none yet), and
    /// whether another has been since: while one, the strategy keeps no per-stream books.
    first_stream: AtomicU64,
    several_streams: AtomicBool,
    /// The strategy has seen the side stream ([`GraphPools::prepare`]).
    prepared: AtomicBool,
    /// Held while the side stream is made, so that it is made once.
    making_side: Mutex<()>,
    /// `routes.len() + held.len()`: nonzero, requests are checked in [`Detect::WhileRouted`].
    watching: AtomicUsize,
    /// Allocations the adaptor made of the strategy for itself (the side stream's byte, pool
    /// blocks) and allocations it served from pools: the strategy's count, less the first,
    /// plus the second, is what the caller was served.
    own_allocs: AtomicU64,
    served_from_pools: AtomicU64,
    books: Mutex<Books>,
    hooks: Mutex<GraphPoolHooks>,
    reuse_bug: AtomicBool,
}

/// The graph-pool adaptor over a strategy (see the module docs). Cheap to clone: clones
/// share one set of pools, so the C ABI keeps one while a ledger owns another.
///
/// ```
/// use std::sync::Arc;
/// use portalloc::adaptor::{Detect, GraphPools};
/// use portalloc::backends::host::HostDevice;
/// use portalloc::strategy::platform::PlatformAllocator;
/// use portalloc::{Allocator, Device, Stream};
///
/// let device: Arc<dyn Device> = Arc::new(HostDevice::builder().build().unwrap());
/// let strategy = PlatformAllocator::new(Arc::clone(&device), None);
/// let pools = GraphPools::new(strategy, device, Detect::WhileRouted);
/// let pool = pools.create_pool(None).unwrap();
/// // Nothing captures on the host device: requests pass through to the strategy.
/// let a = pools.allocate(4096, 0, Stream::DEFAULT, "x").unwrap();
/// pools.deallocate(a).unwrap();
/// assert_eq!(pools.pool_stats(pool).unwrap().blocks, 0);
/// ```
#[derive(Clone)]
pub struct GraphPools {
    shared: Arc<Shared>,
}

impl fmt::Debug for GraphPools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphPools")
            .field("upstream", &self.shared.up().name())
            .field("id", &self.shared.id)
            .field("detect", &self.shared.detect)
            .finish_non_exhaustive()
    }
}

/// A request's blocks may come from a free block at most this much larger (twice the
/// request, or the request and 2 MiB): pool blocks are whole allocations, never split.
fn reusable(request: u64, block: u64) -> bool {
    block >= request
        && block
            <= request
                .saturating_mul(2)
                .max(request.saturating_add(2 << 20))
}

impl GraphPools {
    /// Graph pools over `upstream`, a strategy on `device`.
    pub fn new(
        upstream: impl Allocator + 'static,
        device: Arc<dyn Device>,
        detect: Detect,
    ) -> Self {
        GraphPools::from_boxed(Box::new(upstream), device, detect)
    }

    /// [`GraphPools::new`] over a boxed strategy (what [`crate::strategy::build`] gives).
    pub fn from_boxed(
        upstream: Box<dyn Allocator>,
        device: Arc<dyn Device>,
        detect: Detect,
    ) -> Self {
        GraphPools {
            shared: Arc::new(Shared {
                id: next_allocator_id(),
                upstream: Some(upstream),
                device,
                detect,
                side: OnceLock::new(),
                first_stream: AtomicU64::new(0),
                several_streams: AtomicBool::new(false),
                prepared: AtomicBool::new(false),
                making_side: Mutex::new(()),
                watching: AtomicUsize::new(0),
                own_allocs: AtomicU64::new(0),
                served_from_pools: AtomicU64::new(0),
                books: Mutex::new(Books {
                    next_pool: 1,
                    ..Books::default()
                }),
                hooks: Mutex::new(GraphPoolHooks::default()),
                reuse_bug: AtomicBool::new(false),
            }),
        }
    }

    /// The strategy beneath.
    pub fn upstream(&self) -> &dyn Allocator {
        self.shared.up()
    }

    /// When requests are checked for capture.
    pub fn detect(&self) -> Detect {
        self.shared.detect
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // Every update of the books is complete before anything that can panic.
        self.shared.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rewatch(&self, books: &Books) {
        self.shared
            .watching
            .store(books.routes.len() + books.held.len(), Ordering::Release);
    }

    fn watching(&self) -> bool {
        self.shared.detect == Detect::EveryRequest
            || self.shared.watching.load(Ordering::Acquire) > 0
    }

    /// A new, empty pool; its memory carries `tag` in the strategy (default: `graph pool N`),
    /// which no other live pool may carry (a sleep of one pool's tag would take the other's
    /// memory too).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a tag another live pool carries, or an empty one.
    pub fn create_pool(&self, tag: Option<&str>) -> Result<GraphPoolId> {
        let mut books = self.books();
        if let Some(t) = tag {
            if t.is_empty() || books.pools.values().any(|p| p.tag == t) {
                return Err(Error::InvalidArgument {
                    call: "create_pool",
                    reason: if t.is_empty() {
                        "an empty tag; accepted are a tag no other live pool carries, or none"
                            .into()
                    } else {
                        format!(
                            "another live graph pool carries the tag {t:?}; accepted are a tag no \
                             other live pool carries (a pool sleeps by its tag), or none"
                        )
                    },
                });
            }
        }
        Ok(GraphPoolId(Self::new_pool(&mut books, tag)))
    }

    /// Makes a pool in `books` with `tag`, or `graph pool N` (unique: a suffix where a caller
    /// took the name); its number.
    fn new_pool(books: &mut Books, tag: Option<&str>) -> u64 {
        let n = books.next_pool;
        books.next_pool += 1;
        let tag = match tag {
            Some(t) => t.to_owned(),
            None => {
                let mut t = format!("graph pool {n}");
                while books.pools.values().any(|p| p.tag == t) {
                    t.push('\'');
                }
                t
            }
        };
        // Its memory sleeps on its own: vmm keeps it apart from other tags' (see
        // `declare_sleepable`), so a pool's sleep hands back all of it.
        crate::sleep_tags::declare_sleepable(&tag);
        books.pools.insert(
            n,
            Pool {
                tag,
                blocks: BTreeMap::new(),
                free: BTreeSet::new(),
                released: false,
                asleep: false,
            },
        );
        n
    }

    fn unknown_pool(pool: GraphPoolId) -> Error {
        Error::InvalidArgument {
            call: "a graph pool call",
            reason: format!(
                "{pool} is not a live pool of this allocator (released, or never made)"
            ),
        }
    }

    /// The side stream, made (and handed to the strategy once) at first use.
    fn side_stream(&self) -> Result<Stream> {
        if let Some(s) = self.shared.side.get() {
            return Ok(s.stream());
        }
        let _making = self
            .shared
            .making_side
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(s) = self.shared.side.get() {
            return Ok(s.stream());
        }
        let owned = OwnedStream::new(&*self.shared.device)?;
        let s = owned.stream();
        // Made under `making_side`, after `get` found none: the cell is empty.
        let _ = self.shared.side.set(owned);
        Ok(s)
    }

    /// A request no capture routes: the strategy serves it, and an OOM names the pools.
    #[inline]
    fn allocate_eagerly(
        &self,
        size: u64,
        alignment: u64,
        stream: Stream,
        tag: &str,
    ) -> Result<Allocation> {
        self.note_stream(stream);
        self.shared
            .up()
            .allocate(size, alignment, stream, tag)
            .map_err(|e| self.name_pools_in(e))
    }

    /// Notes that the strategy is asked on `stream`: its first stream, or a second one.
    #[inline]
    fn note_stream(&self, stream: Stream) {
        let raw = stream.as_raw().wrapping_add(1);
        let first = self.shared.first_stream.load(Ordering::Relaxed);
        if first == raw || self.shared.several_streams.load(Ordering::Relaxed) {
            return;
        }
        if first == 0 {
            if let Err(now) = self.shared.first_stream.compare_exchange(
                0,
                raw,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                if now != raw {
                    self.shared.several_streams.store(true, Ordering::Relaxed);
                }
            }
        } else {
            self.shared.several_streams.store(true, Ordering::Relaxed);
        }
    }

    /// The stream a captured request asks the strategy on (see the module docs, "The stream
    /// the strategy is asked on").
    fn anchor(&self) -> Result<Stream> {
        if self.shared.up().queues_on_stream() {
            return self.side_stream();
        }
        let first = self.shared.first_stream.load(Ordering::Relaxed);
        if first != 0 && !self.shared.several_streams.load(Ordering::Relaxed) {
            // The handle the caller passed first, passed back unchanged.
            return Ok(Stream(first.wrapping_sub(1)));
        }
        self.side_stream()
    }

    /// Routes the requests of the capture on `stream` to `pool` (its first, or the one under
    /// way now), on every stream that joins it, until [`GraphPools::end_allocate_to_pool`].
    /// Call it before the capture begins, as PyTorch calls
    /// `beginAllocateToPool`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a pool released or unknown; the device's error when the
    /// stream's status cannot be read or the side stream cannot be made.
    pub fn begin_allocate_to_pool(&self, pool: GraphPoolId, stream: Stream) -> Result<()> {
        let capture = self.shared.device.capture_status(stream)?.capture_id();
        if capture.is_none() {
            // Before the capture: the strategy sees the side stream now (a byte allocated and
            // freed there), so that what it does when a second stream appears — bfc and vmm
            // record a fence on their first stream — happens outside the capture.
            self.prepare()?;
        }
        let mut books = self.books();
        if !books.pools.get(&pool.0).is_some_and(|p| !p.released) {
            return Err(Self::unknown_pool(pool));
        }
        books.routes.push(Route {
            pool: pool.0,
            stream,
            capture,
            automatic: false,
        });
        self.rewatch(&books);
        Ok(())
    }

    /// Makes the side stream and has the strategy see it (one byte allocated and freed
    /// there), once: see [`GraphPools::begin_allocate_to_pool`].
    fn prepare(&self) -> Result<()> {
        if self.shared.prepared.load(Ordering::Acquire) {
            return Ok(());
        }
        let side = self.side_stream()?;
        self.note_stream(side);
        let warm = self
            .shared
            .up()
            .allocate(1, 0, side, "graph pools' side stream")?;
        self.shared.own_allocs.fetch_add(1, Ordering::Relaxed);
        self.shared.up().deallocate(warm)?;
        self.shared.prepared.store(true, Ordering::Release);
        Ok(())
    }

    /// Ends the routes to `pool` ([`GraphPools::begin_allocate_to_pool`]); frees held for
    /// captures that have ended go to the strategy. The pool keeps its memory.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when no capture is routed to the pool.
    pub fn end_allocate_to_pool(&self, pool: GraphPoolId) -> Result<()> {
        {
            let mut books = self.books();
            let before = books.routes.len();
            books.routes.retain(|r| r.pool != pool.0);
            if books.routes.len() == before {
                return Err(Error::InvalidArgument {
                    call: "end_allocate_to_pool",
                    reason: format!("no capture is routed to {pool}"),
                });
            }
            self.rewatch(&books);
        }
        self.settle_held();
        Ok(())
    }

    /// Releases `pool`: its free blocks go back to the strategy now, after a device
    /// synchronisation (a replay may still run on any stream), and the blocks still in use as
    /// they are freed. Call it once no graph captured into the pool will be launched again
    /// (PyTorch: the graph's `reset()`). Returns the bytes given back now.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown pool, or one a capture is still routed to;
    /// the device's error when it cannot be synchronised (the pool is unchanged then).
    pub fn release_pool(&self, pool: GraphPoolId) -> Result<u64> {
        // An automatic route whose capture has ended is not a reason to refuse.
        self.prune_automatic();
        self.no_capture_under_way("release_pool")?;
        {
            let books = self.books();
            if !books.pools.get(&pool.0).is_some_and(|p| !p.released) {
                return Err(Self::unknown_pool(pool));
            }
            if books.routes.iter().any(|r| r.pool == pool.0) {
                return Err(Error::InvalidArgument {
                    call: "release_pool",
                    reason: format!(
                        "a capture is still routed to {pool}: end_allocate_to_pool first"
                    ),
                });
            }
        }
        self.shared.device.synchronize_device()?;
        let freed: Vec<Allocation> = {
            let mut guard = self.books();
            let books = &mut *guard;
            let Some(p) = books.pools.get_mut(&pool.0) else {
                return Err(Self::unknown_pool(pool));
            };
            p.released = true;
            let free: Vec<u64> = p.free.iter().map(|&(_, ptr)| ptr).collect();
            p.free.clear();
            let taken: Vec<Allocation> = free
                .iter()
                .filter_map(|ptr| p.blocks.remove(ptr).map(|b| b.upstream))
                .collect();
            let empty = p.blocks.is_empty();
            for ptr in &free {
                books.by_ptr.remove(ptr);
            }
            if empty {
                books.pools.remove(&pool.0);
            }
            taken
        };
        let mut bytes = 0;
        let mut first_error = None;
        for a in freed {
            bytes += a.size();
            if let Err(e) = self.shared.up().deallocate(a) {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(bytes),
        }
    }

    /// Sleeps the pool's memory: the strategy's sleep of its tag ([`Allocator::sleep`]),
    /// after the `before_sleep` hook.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown pool; the strategy's sleep errors
    /// ([`Error::StrategyUnsupported`] for a strategy without sleep).
    pub fn sleep_pool(&self, pool: GraphPoolId, keep: Keep) -> Result<SleepReport> {
        self.no_capture_under_way("sleep_pool")?;
        let (tag, ranges) = self.tag_and_ranges(pool)?;
        if let Some(hook) = &self.hooks().before_sleep {
            hook(pool, &ranges);
        }
        let report = self.shared.up().sleep(&tag, keep)?;
        if let Some(p) = self.books().pools.get_mut(&pool.0) {
            p.asleep = true;
        }
        Ok(report)
    }

    /// Wakes the pool's memory at its addresses, then runs the `after_wake` hook.
    ///
    /// # Errors
    /// As [`GraphPools::sleep_pool`], with the strategy's wake errors.
    pub fn wake_pool(&self, pool: GraphPoolId) -> Result<SleepReport> {
        self.no_capture_under_way("wake_pool")?;
        let (tag, ranges) = self.tag_and_ranges(pool)?;
        let report = self.shared.up().wake(&tag)?;
        if let Some(p) = self.books().pools.get_mut(&pool.0) {
            p.asleep = false;
        }
        if let Some(hook) = &self.hooks().after_wake {
            hook(pool, &ranges);
        }
        Ok(report)
    }

    /// Sets the hooks run around [`GraphPools::sleep_pool`] and [`GraphPools::wake_pool`].
    pub fn set_hooks(&self, hooks: GraphPoolHooks) {
        *self.hooks() = hooks;
    }

    fn hooks(&self) -> MutexGuard<'_, GraphPoolHooks> {
        self.shared.hooks.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tag_and_ranges(&self, pool: GraphPoolId) -> Result<(String, Vec<(u64, u64)>)> {
        let books = self.books();
        let p = books
            .pools
            .get(&pool.0)
            .ok_or_else(|| Self::unknown_pool(pool))?;
        let ranges = p
            .blocks
            .iter()
            .map(|(&ptr, b)| (ptr, b.upstream.size()))
            .collect();
        Ok((p.tag.clone(), ranges))
    }

    /// Refuses `call` while a capture this adaptor routes is under way: it synchronises the
    /// device, which a capture forbids (the driver would invalidate it). Captures it does not
    /// route are the caller's to keep apart.
    fn no_capture_under_way(&self, call: &'static str) -> Result<()> {
        let streams: Vec<Stream> = self.books().routes.iter().map(|r| r.stream).collect();
        for stream in streams {
            if let Ok(status) = self.shared.device.capture_status(stream) {
                if let Some(id) = status.capture_id() {
                    return Err(Error::InvalidArgument {
                        call,
                        reason: format!(
                            "stream {:#x} is being captured into a graph (capture {id}): {call} \
                             synchronises the device, which the capture forbids (the driver would \
                             invalidate it); call it once the capture has ended",
                            stream.as_raw()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// One pool's counters; `None` for a pool unknown (or released and empty).
    pub fn pool_stats(&self, pool: GraphPoolId) -> Option<GraphPoolStats> {
        let books = self.books();
        let p = books.pools.get(&pool.0)?;
        Some(Self::stats_of(&books, pool.0, p))
    }

    /// Every pool's counters, by id.
    pub fn pools(&self) -> Vec<GraphPoolStats> {
        let books = self.books();
        books
            .pools
            .iter()
            .map(|(&id, p)| Self::stats_of(&books, id, p))
            .collect()
    }

    fn stats_of(books: &Books, id: u64, p: &Pool) -> GraphPoolStats {
        let held_bytes = p.blocks.values().map(|b| b.upstream.size()).sum();
        let free_bytes = p.free.iter().map(|&(size, _)| size).sum();
        GraphPoolStats {
            id: GraphPoolId(id),
            tag: p.tag.clone(),
            blocks: p.blocks.len(),
            held_bytes,
            in_use_bytes: held_bytes - free_bytes,
            free_bytes,
            routed_captures: books.routes.iter().filter(|r| r.pool == id).count(),
            released: p.released,
        }
    }

    /// Hands the frees held for captures that have ended to the strategy.
    pub fn settle_held(&self) {
        let held: Vec<Held> = {
            let mut books = self.books();
            let held = std::mem::take(&mut books.held);
            self.rewatch(&books);
            held
        };
        if held.is_empty() {
            return;
        }
        let mut still = Vec::new();
        for h in held {
            match self.shared.device.capture_status(h.stream) {
                Ok(status) if status.capture_id().is_none() => {
                    // A held free is one the caller made: nothing to report to anyone if the
                    // strategy refuses it now but the log.
                    if let Err(e) = self.shared.up().deallocate(h.upstream) {
                        tracing::warn!(error = %e, "a free held for a capture was refused");
                    }
                }
                _ => still.push(h),
            }
        }
        let mut books = self.books();
        books.held.extend(still);
        self.rewatch(&books);
    }

    /// An eager request's out-of-memory report, with what the graph pools hold named in its
    /// cause: memory the strategy counts in use that no eager request can get.
    #[cold]
    fn name_pools_in(&self, e: Error) -> Error {
        let Error::OutOfMemory(mut report) = e else {
            return e;
        };
        let pools = self.pools();
        let held: u64 = pools.iter().map(|p| p.held_bytes).sum();
        if held > 0 {
            let each: Vec<String> = pools
                .iter()
                .filter(|p| p.blocks > 0)
                .map(|p| {
                    format!(
                        "{} \"{}\": {} in {} blocks, {} of it free",
                        p.id,
                        p.tag,
                        Bytes(p.held_bytes),
                        p.blocks,
                        Bytes(p.free_bytes)
                    )
                })
                .collect();
            report.cause = format!(
                "{}; graph pools hold {} for captured graphs, which eager requests never get ({}) \
                 — release a pool once its graphs are gone",
                report.cause,
                Bytes(held),
                each.join("; ")
            );
        }
        Error::OutOfMemory(report)
    }

    /// **Test-only**: frees of pool blocks go straight back to the strategy, as if the pool
    /// did not exist — the "reuse after capture" bug the hazard log must catch. Never set it
    /// outside a test of that.
    #[doc(hidden)]
    pub fn plant_reuse_after_capture_bug(&self, on: bool) {
        self.shared.reuse_bug.store(on, Ordering::Relaxed);
    }

    /// The pool a request of capture `capture` on `stream` goes to: the capture's route, or
    /// a route waiting on `stream`, bound to it now. `None`: no such route.
    fn route(books: &mut Books, stream: Stream, capture: u64) -> Option<u64> {
        if let Some(r) = books.routes.iter().find(|r| r.capture == Some(capture)) {
            return Some(r.pool);
        }
        Self::bind(books, stream, capture)
    }

    /// Binds the route waiting on `stream` (made before its capture began) to `capture`; its
    /// pool.
    fn bind(books: &mut Books, stream: Stream, capture: u64) -> Option<u64> {
        let r = books
            .routes
            .iter_mut()
            .find(|r| r.capture.is_none() && r.stream == stream)?;
        r.capture = Some(capture);
        Some(r.pool)
    }

    /// The pool of a route waiting on another stream (made before the capture began) whose
    /// capture `capture` turns out to be: a request on a stream that joined it (a fork)
    /// before the origin asked for anything. Asks the driver about each waiting route's
    /// stream, without the lock.
    fn bind_waiting(&self, capture: u64) -> Option<u64> {
        let waiting: Vec<Stream> = self
            .books()
            .routes
            .iter()
            .filter(|r| r.capture.is_none())
            .map(|r| r.stream)
            .collect();
        waiting.into_iter().find_map(|w| {
            let status = self.shared.device.capture_status(w).ok()?;
            (status.capture_id() == Some(capture))
                .then(|| Self::bind(&mut self.books(), w, capture))
                .flatten()
        })
    }

    /// With [`Detect::EveryRequest`], a new pool for capture `capture` that nobody routed
    /// (`stream` is where it was seen: its end is looked for there).
    fn automatic_pool(&self, stream: Stream, capture: u64) -> Option<u64> {
        if self.shared.detect != Detect::EveryRequest {
            return None;
        }
        let mut books = self.books();
        // Another thread may have made it meanwhile.
        if let Some(r) = books.routes.iter().find(|r| r.capture == Some(capture)) {
            return Some(r.pool);
        }
        let n = Self::new_pool(&mut books, None);
        books.routes.push(Route {
            pool: n,
            stream,
            capture: Some(capture),
            automatic: true,
        });
        self.rewatch(&books);
        Some(n)
    }

    /// Drops the automatic routes whose capture has ended (their pools stay: the graphs
    /// still replay over them).
    fn prune_automatic(&self) {
        let automatic: Vec<Route> = self
            .books()
            .routes
            .iter()
            .filter(|r| r.automatic)
            .copied()
            .collect();
        for r in automatic {
            // A stream the driver no longer knows (destroyed) captures nothing.
            let ended = match self.shared.device.capture_status(r.stream) {
                Ok(s) => s.capture_id() != r.capture,
                Err(_) => true,
            };
            if ended {
                let mut books = self.books();
                books
                    .routes
                    .retain(|x| !(x.automatic && x.pool == r.pool && x.capture == r.capture));
                self.rewatch(&books);
            }
        }
    }

    fn capturing_error(
        &self,
        stream: Stream,
        capture: u64,
        requested: u64,
        pool: Option<u64>,
        reason: String,
    ) -> Error {
        let pool = match pool {
            Some(n) => {
                let books = self.books();
                books.pools.get(&n).map_or_else(
                    || format!("graph pool {n}"),
                    |p| {
                        let s = Self::stats_of(&books, n, p);
                        format!(
                            "graph pool {n}, {} held in {} blocks, {} free",
                            Bytes(s.held_bytes),
                            s.blocks,
                            Bytes(s.free_bytes)
                        )
                    },
                )
            }
            None => "none: no graph pool receives this capture — route it with \
                     begin_allocate_to_pool, or detect every request"
                .to_string(),
        };
        Error::StreamCapturing {
            stream: stream.as_raw(),
            capture,
            requested,
            pool,
            reason,
        }
    }

    /// A request of capture `capture` served from `pool`: a free block freed on `stream`,
    /// else a new one of the strategy.
    fn allocate_in_pool(
        &self,
        pool: u64,
        size: u64,
        alignment: u64,
        stream: Stream,
        capture: u64,
    ) -> Result<Allocation> {
        if alignment != 0 && !alignment.is_power_of_two() {
            return Err(Error::InvalidAlignment {
                alignment,
                max: u64::MAX / 2 + 1,
            });
        }
        let align = alignment.max(1);
        let tag = {
            let mut guard = self.books();
            let books = &mut *guard;
            let p = books
                .pools
                .get_mut(&pool)
                .ok_or_else(|| Self::unknown_pool(GraphPoolId(pool)))?;
            if p.asleep {
                let reason = format!(
                    "its graph pool sleeps (\"{}\"): wake it (wake_pool) before capturing into it",
                    p.tag
                );
                drop(guard);
                return Err(self.capturing_error(stream, capture, size, Some(pool), reason));
            }
            let blocks = &p.blocks;
            let found = p
                .free
                .range((size, 0)..)
                .take_while(|&&(s, _)| reusable(size, s))
                .find(|&&(_, ptr)| {
                    ptr % align == 0 && blocks.get(&ptr).is_some_and(|b| b.freed_on == stream)
                })
                .copied();
            if let Some((s, ptr)) = found {
                p.free.remove(&(s, ptr));
                if let Some(b) = p.blocks.get_mut(&ptr) {
                    b.in_use = true;
                }
                self.shared
                    .served_from_pools
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(Allocation::new(ptr, size, stream, self.shared.id, ptr));
            }
            p.tag.clone()
        };
        let anchor = self.anchor().map_err(|e| {
            self.capturing_error(
                stream,
                capture,
                size,
                Some(pool),
                format!("no side stream: {e}"),
            )
        })?;
        self.note_stream(anchor);
        let device = &*self.shared.device;
        let made = with_capture_mode(device, CaptureMode::Relaxed, || {
            self.shared.up().allocate(size, alignment, anchor, &tag)
        })
        .and_then(|r| r);
        let upstream = match made {
            Ok(a) => a,
            // What the strategy refuses whatever the capture (an alignment, a size) is said
            // as it is.
            Err(
                e @ (Error::InvalidAlignment { .. }
                | Error::InvalidSize { .. }
                | Error::InvalidArgument { .. }),
            ) => return Err(e),
            Err(e) => {
                return Err(self.capturing_error(stream, capture, size, Some(pool), e.to_string()))
            }
        };
        self.shared.own_allocs.fetch_add(1, Ordering::Relaxed);
        self.shared
            .served_from_pools
            .fetch_add(1, Ordering::Relaxed);
        // A stream-ordered allocation is ready once its stream reaches it: before any captured
        // work uses it (the side stream: nothing captured there).
        if self.shared.up().queues_on_stream() {
            if let Err(e) = device.synchronize_stream(anchor) {
                let _ = self.shared.up().deallocate(upstream);
                return Err(self.capturing_error(
                    stream,
                    capture,
                    size,
                    Some(pool),
                    format!("the side stream could not be synchronised: {e}"),
                ));
            }
        }
        let ptr = upstream.ptr();
        let mut books = self.books();
        books.by_ptr.insert(ptr, pool);
        if let Some(p) = books.pools.get_mut(&pool) {
            p.blocks.insert(
                ptr,
                Block {
                    upstream,
                    in_use: true,
                    freed_on: stream,
                },
            );
        }
        Ok(Allocation::new(ptr, size, stream, self.shared.id, ptr))
    }

    /// A pool block handed back.
    fn free_block(&self, allocation: &Allocation) -> Result<()> {
        let ptr = allocation.ptr();
        let unknown = || Error::UnknownPointer {
            what: "graph pool block",
            ptr,
            backend: self.shared.device.info().vendor.name(),
        };
        let to_upstream = {
            let mut guard = self.books();
            let books = &mut *guard;
            let &pool = books.by_ptr.get(&ptr).ok_or_else(unknown)?;
            let p = books.pools.get_mut(&pool).ok_or_else(unknown)?;
            let block = p
                .blocks
                .get_mut(&ptr)
                .filter(|b| b.in_use)
                .ok_or_else(unknown)?;
            if p.released || self.shared.reuse_bug.load(Ordering::Relaxed) {
                let b = p.blocks.remove(&ptr).ok_or_else(unknown)?;
                let empty = p.blocks.is_empty() && p.released;
                books.by_ptr.remove(&ptr);
                if empty {
                    books.pools.remove(&pool);
                }
                Some(b.upstream)
            } else {
                block.in_use = false;
                block.freed_on = allocation.stream();
                let size = block.upstream.size();
                p.free.insert((size, ptr));
                None
            }
        };
        if let Some(upstream) = to_upstream {
            // The caller freed it on its stream: what it queued there before may still use it.
            // Wait for that, then the strategy may hand it to any stream (its own stream is
            // the side stream, where nothing ran). A stream that cannot be waited for (being
            // captured) holds the free until its capture ends.
            let stream = allocation.stream();
            // Never a synchronisation of a stream being captured: the driver would refuse it,
            // and may invalidate the capture.
            let capturing = self
                .shared
                .device
                .capture_status(stream)
                .map_or(true, |s| s.capture_id().is_some());
            let waited = !capturing && self.shared.device.synchronize_stream(stream).is_ok();
            if waited {
                self.shared.up().deallocate(upstream)?;
            } else {
                let mut books = self.books();
                books.held.push(Held { upstream, stream });
                self.rewatch(&books);
            }
        }
        Ok(())
    }
}

impl Allocator for GraphPools {
    /// The strategy's name: the adaptor is transparent in reports.
    fn name(&self) -> &str {
        self.shared.up().name()
    }

    fn id(&self) -> u64 {
        self.shared.id
    }

    /// A request on a captured stream from its graph pool; any other from the strategy (the
    /// strategy's own [`Allocation`], with its id).
    ///
    /// # Errors
    /// The strategy's errors; [`Error::StreamCapturing`] for a captured request no pool could
    /// serve; the device's error when the stream's capture status cannot be read.
    fn allocate(&self, size: u64, alignment: u64, stream: Stream, tag: &str) -> Result<Allocation> {
        if size == 0 || !self.watching() {
            return self.allocate_eagerly(size, alignment, stream, tag);
        }
        let status = self.shared.device.capture_status(stream)?;
        let Some(capture) = status.capture_id() else {
            if self.shared.watching.load(Ordering::Acquire) > 0 {
                self.settle_held();
                self.prune_automatic();
            }
            return self.allocate_eagerly(size, alignment, stream, tag);
        };
        let routed = {
            let mut books = self.books();
            Self::route(&mut books, stream, capture)
        };
        let pool = routed
            .or_else(|| self.bind_waiting(capture))
            .or_else(|| self.automatic_pool(stream, capture));
        match pool {
            Some(pool) => self.allocate_in_pool(pool, size, alignment, stream, capture),
            None => Err(self.capturing_error(
                stream,
                capture,
                size,
                None,
                "it came with no graph pool to serve it".into(),
            )),
        }
    }

    /// A pool block back to its pool (or, released, to the strategy); the strategy's own
    /// allocation to the strategy — held until its stream's capture ends when that stream is
    /// captured.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] for a pool block not handed out; the strategy's errors.
    fn deallocate(&self, allocation: Allocation) -> Result<()> {
        if allocation.allocator_id() == self.shared.id && !allocation.is_empty() {
            return self.free_block(&allocation);
        }
        if allocation.is_empty() || !self.watching() {
            return self.shared.up().deallocate(allocation);
        }
        let stream = allocation.stream();
        if self
            .shared
            .device
            .capture_status(stream)?
            .capture_id()
            .is_some()
        {
            let mut books = self.books();
            books.held.push(Held {
                upstream: allocation,
                stream,
            });
            self.rewatch(&books);
            return Ok(());
        }
        self.shared.up().deallocate(allocation)
    }

    /// The strategy's counters, with the allocations counted as the caller was served
    /// (pool hand-outs in, the adaptor's own requests of the strategy out). Pool blocks are
    /// in use in the strategy: a pool's free blocks count as bytes in use.
    fn stats(&self) -> Stats {
        let mut stats = self.shared.up().stats();
        stats.num_allocs = stats
            .num_allocs
            .saturating_sub(self.shared.own_allocs.load(Ordering::Relaxed))
            + self.shared.served_from_pools.load(Ordering::Relaxed);
        stats
    }

    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        if allocation.allocator_id() != self.shared.id {
            return self.shared.up().charged(allocation);
        }
        let books = self.books();
        let pool = books.by_ptr.get(&allocation.ptr())?;
        let block = books.pools.get(pool)?.blocks.get(&allocation.ptr())?;
        self.shared.up().charged(&block.upstream)
    }

    fn pool_bytes(&self) -> u64 {
        self.shared.up().pool_bytes()
    }

    /// The strategy's trim: graph-pool blocks are live in it, so none of them is trimmed.
    fn trim(&self) -> Result<u64> {
        self.shared.up().trim()
    }

    fn sleep(&self, tag: &str, keep: Keep) -> Result<SleepReport> {
        self.shared.up().sleep(tag, keep)
    }

    fn wake(&self, tag: &str) -> Result<SleepReport> {
        self.shared.up().wake(tag)
    }

    fn sleeping(&self) -> Vec<crate::allocator::SleepingTag> {
        self.shared.up().sleeping()
    }

    fn is_asleep(&self, allocation: &Allocation) -> bool {
        if allocation.allocator_id() != self.shared.id {
            return self.shared.up().is_asleep(allocation);
        }
        let books = self.books();
        books
            .by_ptr
            .get(&allocation.ptr())
            .and_then(|pool| books.pools.get(pool))
            .and_then(|p| p.blocks.get(&allocation.ptr()))
            .is_some_and(|b| self.shared.up().is_asleep(&b.upstream))
    }

    fn tag_of(&self, allocation: &Allocation) -> Option<String> {
        if allocation.allocator_id() != self.shared.id {
            return self.shared.up().tag_of(allocation);
        }
        None
    }

    /// A pool block's memory is its upstream allocation's: exported as that one.
    fn backing(&self, allocation: &Allocation) -> Result<crate::allocator::Backing> {
        if allocation.allocator_id() != self.shared.id {
            return self.shared.up().backing(allocation);
        }
        let books = self.books();
        let block = books
            .by_ptr
            .get(&allocation.ptr())
            .and_then(|pool| books.pools.get(pool))
            .and_then(|p| p.blocks.get(&allocation.ptr()));
        match block {
            Some(b) => self.shared.up().backing(&b.upstream),
            None => Err(crate::Error::InvalidArgument {
                call: "backing",
                reason: format!(
                    "{:#x} is not a live block of a graph pool",
                    allocation.ptr()
                ),
            }),
        }
    }

    fn retag(&self, allocation: &Allocation, tag: &str) {
        // A pool block keeps its pool's tag: it sleeps with its pool.
        if allocation.allocator_id() != self.shared.id {
            self.shared.up().retag(allocation, tag);
        }
    }

    fn freeing(&self, allocation: &Allocation) {
        if allocation.allocator_id() != self.shared.id {
            self.shared.up().freeing(allocation);
        }
    }

    fn queues_on_stream(&self) -> bool {
        self.shared.up().queues_on_stream()
    }

    fn graph_pools(&self) -> Vec<GraphPoolStats> {
        self.pools()
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        {
            let books = self.books();
            let mut blocks = 0;
            for (&id, p) in &books.pools {
                for (&ptr, b) in &p.blocks {
                    blocks += 1;
                    if books.by_ptr.get(&ptr) != Some(&id) {
                        return Err(format!("block {ptr:#x} of graph pool {id} is not indexed"));
                    }
                    if b.in_use == p.free.contains(&(b.upstream.size(), ptr)) {
                        return Err(format!(
                            "block {ptr:#x} of graph pool {id}: in use {} but {} the free set",
                            b.in_use,
                            if b.in_use { "in" } else { "not in" }
                        ));
                    }
                }
                if p.free.len() > p.blocks.len() {
                    return Err(format!(
                        "graph pool {id} lists free blocks it does not hold"
                    ));
                }
            }
            if blocks != books.by_ptr.len() {
                return Err(format!(
                    "{} addresses indexed for {blocks} pool blocks",
                    books.by_ptr.len()
                ));
            }
        }
        self.shared.up().check_invariants()
    }
}

impl Shared {
    fn up(&self) -> &dyn Allocator {
        self.upstream
            .as_deref()
            .expect("the strategy lives as long as its graph pools")
    }
}

impl Drop for Shared {
    /// The pools' blocks go back to the strategy (after a device synchronisation: a replay
    /// may still run), and the frees held for captures too; the strategy then goes as it
    /// goes.
    fn drop(&mut self) {
        let books = std::mem::take(self.books.get_mut().unwrap_or_else(|p| p.into_inner()));
        let any = books.pools.values().any(|p| !p.blocks.is_empty()) || !books.held.is_empty();
        if any {
            if let Err(e) = self.device.synchronize_device() {
                tracing::warn!(error = %e, "graph pools dropped without a device synchronisation");
            }
            for p in books.pools.into_values() {
                for b in p.blocks.into_values() {
                    let _ = self.up().deallocate(b.upstream);
                }
            }
            for h in books.held {
                let _ = self.up().deallocate(h.upstream);
            }
        }
        // The strategy goes first (its drop may wait for work on the side stream), then the
        // side stream.
        drop(self.upstream.take());
        if let Some(side) = self.side.take() {
            if let Err(e) = side.destroy(&*self.device) {
                tracing::warn!(error = %e, "the graph pools' side stream is left to the process");
            }
        }
    }
}
