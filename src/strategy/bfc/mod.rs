//! The `bfc` strategy: XLA's best-fit-with-coalescing allocator (`BFCAllocator`) over a
//! [`Device`], with XLA's rules — see [`arena`] for the chunk rules (256-byte rounding, 21
//! bins, best fit with lowest-address ties, the split rule, coalescing) and
//! [`BfcAllocator`] for how regions are taken from the device.
//!
//! # Where this differs from XLA, and why
//!
//! * **Alignment above 256 B** is supported (XLA's BFC only gives 256): the best-fit search
//!   takes the first candidate, in best-fit order, whose aligned start leaves room for the
//!   request, and splits the bytes in front of it off as a free chunk. Alignments up to
//!   [`MAX_ALIGNMENT`] (1 GiB) are accepted. When the pool must grow for such a request, the
//!   new region is asked for `alignment − 256` bytes more than the request, since a device
//!   only promises 256-byte-aligned bases.
//! * **Preallocation is exact**: the one region of `limit` (rounded up to 2 MiB) is asked for
//!   once, with no ×0.9 back-off; if the device refuses it the request fails with an
//!   [`Error::OutOfMemory`] whose cause names the refusal (XLA's `Extend` would back off
//!   silently and run with less than configured). The next allocation tries again.
//! * **No garbage collection on OOM**: XLA can free wholly free regions and retry when
//!   growth fails; here that is [`Allocator::trim`], called by the user.
//! * The back-off factor is computed in integers (`bytes × 9 / 10`, rounded up to 256 B)
//!   where XLA multiplies by the `float` 0.9f; and like XLA, it backs off during one growth
//!   attempt only, ever (XLA's `started_backpedal_`): later refusals fail at once.
//! * `bytes_reserved` is always 0: XLA uses it for memory reserved beyond the pool, and BFC
//!   reserves none.
//! * **Streams** (XLA's BFC serves one stream): the stream-ordering contract of [`Device`] is
//!   kept, as below.
//!
//! # Stream-ordered reuse
//!
//! While every request has come on one stream, a free goes straight back to the bins, as in
//! XLA, and no event is made: the single-stream path costs a comparison and the store of the
//! chunk's size by slot. From the first request on a second stream on:
//!
//! * a chunk freed on stream `S` is kept **pending**: still counted in use by the arena (so
//!   it coalesces with nothing and no other stream can be handed it), with an event recorded
//!   on `S` at the free (events come from a small pool and are reused);
//! * a request on `S` may reuse one of `S`'s pending chunks at once: the best fit among them
//!   (smallest, then lowest address) that the split rule would hand out whole — one the
//!   rule would split waits for its event, since its remainder would be free for everyone;
//! * every allocation first polls the oldest pending free of each stream (events on one
//!   stream complete in order) and returns completed ones to the bins, coalescing them;
//! * before growing the pool or reporting out-of-memory, the events of all pending frees are
//!   synchronised and the chunks returned, rather than failing while memory is only waiting;
//!   [`Allocator::trim`] does the same before it looks for free regions;
//! * at the switch, the first stream is synchronised once if anything was freed on it, since
//!   those frees went to the bins without an event;
//! * when the device refuses to record an event on `S` (e.g. a stream it does not know), `S`
//!   is synchronised and the chunk freed at once (if that fails too, the device has no work
//!   on `S` that could still use it).
//!
//! Pending chunks are not counted in `bytes_in_use` or [`BfcAllocator::live_count`]; the
//! per-bin summaries and region maps show them as in use (with the request they were last
//! handed out for).
#![deny(unsafe_code)]

pub mod arena;
pub mod free_index;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::allocator::{
    effective_alignment, next_allocator_id, round_up, Allocation, Allocator, Stats,
};
use crate::device::{Device, Event, Stream};
use crate::error::{Error, Result};
use crate::report::{BinSummary, OomReport};
use crate::units::Bytes;

use arena::{Arena, Grant, MAX_INTERNAL_FRAGMENTATION, MIN_ALLOCATION};

/// The largest alignment accepted: 1 GiB. Larger ones would rarely fit any region.
pub const MAX_ALIGNMENT: u64 = 1 << 30;
/// A preallocated region is the limit rounded up to this (2 MiB).
pub const PREALLOCATION_GRANULE: u64 = 2 << 20;
/// Under growth, the first region is `min(limit, 2 MiB)`.
pub const INITIAL_REGION: u64 = 2 << 20;
use super::idle_events::IdleEvents;
pub use super::idle_events::EVENT_POOL;

/// Options of [`BfcAllocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfcOptions {
    /// The most memory the allocator may take from the device (`fraction × total`).
    pub limit: u64,
    /// One region of `limit` at the first allocation (true) or growth by doubling (false).
    pub preallocate: bool,
}

/// A chunk handed out, by arena slot (the token's low 32 bits).
#[derive(Debug, Clone, Copy, Default)]
struct Handed {
    token: u64,
    addr: u64,
    /// Bytes of the chunk; 0 when the slot holds nothing handed out.
    size: u64,
}

/// A chunk freed on a stream while other streams are in use, not yet safe for them.
#[derive(Debug, Clone, Copy)]
struct Pending {
    token: u64,
    addr: u64,
    size: u64,
    /// Recorded on the freeing stream at the free.
    event: Event,
}

/// Stream-ordered reuse (see the module docs).
#[derive(Debug, Default)]
struct StreamOrder {
    /// The stream of the first request.
    first: Option<Stream>,
    /// True once a request came on a second stream: frees are then kept pending.
    multi: bool,
    /// Something was freed (straight to the bins) before the switch.
    freed_while_single: bool,
    /// Pending frees by stream, oldest first. Invariant: their sizes sum to
    /// `pending_bytes`, their number is `pending_count`, each is in use in the arena and
    /// not in `handed`.
    pending: Vec<(Stream, VecDeque<Pending>)>,
    pending_bytes: u64,
    pending_count: usize,
    /// Events not recorded on anything now, for reuse (at most [`EVENT_POOL`]).
    idle_events: IdleEvents,
}

/// Everything behind the lock.
#[derive(Debug)]
struct Inner {
    /// Regions and chunks.
    arena: Arena,
    /// XLA's `curr_region_allocation_bytes_`: the size of the next region under growth.
    next_region: u64,
    /// XLA's `started_backpedal_`: true once a growth attempt has backed off.
    backed_off: bool,
    /// Successful allocations, zero-byte ones included.
    num_allocs: u64,
    /// Invariant: `>= arena.bytes_in_use()`.
    peak_bytes_in_use: u64,
    /// Largest chunk handed out.
    largest_alloc_size: u64,
    /// Invariant: `>= arena.pool_bytes()`.
    peak_pool_bytes: u64,
    /// What each arena slot holds handed out (the chunk's size, for pending frees, and a
    /// check of tokens while a pending chunk stays in use in the arena): one store per
    /// allocation and free, the only bookkeeping on the single-stream path.
    handed: Vec<Handed>,
    /// Stream-ordered reuse.
    order: StreamOrder,
}

impl Inner {
    /// Bytes handed out: the arena's in-use bytes less the pending frees.
    fn bytes_in_use(&self) -> u64 {
        self.arena.bytes_in_use() - self.order.pending_bytes
    }

    #[inline]
    fn record_handed(&mut self, grant: &Grant) {
        let record = Handed {
            token: grant.token,
            addr: grant.addr,
            size: grant.chunk_size,
        };
        match self.handed.get_mut(grant.token as u32 as usize) {
            Some(slot) => *slot = record,
            None => self.record_handed_grow(record),
        }
    }

    #[cold]
    #[inline(never)]
    fn record_handed_grow(&mut self, record: Handed) {
        let idx = record.token as u32 as usize;
        self.handed.resize(idx + 1, Handed::default());
        self.handed[idx] = record;
    }

    /// Returns a pending chunk to the bins (its event completed).
    fn release_pending(&mut self, p: Pending) {
        let freed = self.arena.free(p.token, p.addr);
        debug_assert!(freed.is_some(), "a pending chunk was not in use");
        self.order.pending_bytes -= p.size;
        self.order.pending_count -= 1;
    }
}

/// XLA's BFC allocator over a device.
///
/// Takes memory from the device in regions, never more than [`BfcOptions::limit`] in all:
///
/// * **Preallocate** (`preallocate: true`, XLA's default): at the first allocation, one
///   region of `limit` rounded up to 2 MiB, and never another (until [`Allocator::trim`]
///   gives it back; the next allocation takes it again).
/// * **Growth** (`preallocate: false`, `XLA_PYTHON_CLIENT_PREALLOCATE=false`), as XLA's
///   `BFCAllocator::Extend`: the first region is `min(limit, 2 MiB)`; a request larger than
///   the next region size doubles it until it fits (and it then stays), otherwise each
///   region taken doubles the next one (2, 4, 8, 16 MiB…). A region never takes the pool
///   past the limit (it shrinks to what is left, rounded down to 256 B, if that still holds
///   the request). When the device refuses, the size backs off by ×0.9 until the device
///   accepts or the size falls below the request.
///
/// Whatever cannot be served is an [`Error::OutOfMemory`] with an [`OomReport`] whose
/// `cause` says why. Thread-safe: one mutex guards the books (device calls made while
/// growing hold it, as in XLA).
#[derive(Debug)]
pub struct BfcAllocator<D: Device + ?Sized> {
    device: Arc<D>,
    options: BfcOptions,
    id: u64,
    inner: Mutex<Inner>,
}

impl<D: Device + ?Sized> BfcAllocator<D> {
    /// Makes the allocator; takes no memory until the first allocation.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for option checks.
    pub fn new(device: Arc<D>, options: BfcOptions) -> Result<Self> {
        let first = options.limit.min(INITIAL_REGION);
        let inner = Inner {
            arena: Arena::new(),
            next_region: round_up(first, MIN_ALLOCATION)?.max(MIN_ALLOCATION),
            backed_off: false,
            num_allocs: 0,
            peak_bytes_in_use: 0,
            largest_alloc_size: 0,
            peak_pool_bytes: 0,
            handed: Vec::new(),
            order: StreamOrder::default(),
        };
        Ok(BfcAllocator {
            device,
            options,
            id: next_allocator_id(),
            inner: Mutex::new(inner),
        })
    }

    /// The device it allocates from.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// The options it was made with.
    pub fn options(&self) -> BfcOptions {
        self.options
    }

    /// The sizes of the regions held now, in the order they were taken.
    ///
    /// # Time complexity
    /// `O(regions)`.
    pub fn region_sizes(&self) -> Vec<u64> {
        self.inner().arena.regions().map(|(_, size)| size).collect()
    }

    /// The regions held now as `(base, size)`, in the order they were taken.
    ///
    /// # Time complexity
    /// `O(regions)`.
    pub fn regions(&self) -> Vec<(u64, u64)> {
        self.inner().arena.regions().collect()
    }

    /// The per-bin summary an OOM report would show now (every chunk, free and in use,
    /// classed by size; non-empty classes only).
    ///
    /// # Time complexity
    /// `O(chunks)`.
    pub fn bin_summaries(&self) -> Vec<BinSummary> {
        self.inner().arena.bin_summaries()
    }

    /// Number of allocations live now (zero-byte ones excluded: they own nothing; pending
    /// stream-ordered frees excluded).
    pub fn live_count(&self) -> usize {
        let inner = self.inner();
        inner.arena.live_count() - inner.order.pending_count
    }

    /// Chunks freed on one stream and not yet safe for the others (see the module docs), and
    /// their bytes.
    pub fn pending_frees(&self) -> (usize, u64) {
        let inner = self.inner();
        (inner.order.pending_count, inner.order.pending_bytes)
    }

    /// The size of the one preallocated region: the limit rounded up to 2 MiB, but never more
    /// than the device's total memory — at fraction 1.0 on a device whose total is not a
    /// multiple of 2 MiB (an H100 reports 81,559 MiB) rounding up would ask for more than
    /// exists, and the device would refuse every allocation.
    pub fn preallocation_size(&self) -> u64 {
        let rounded = round_up(self.options.limit, PREALLOCATION_GRANULE)
            .unwrap_or(self.options.limit & !(PREALLOCATION_GRANULE - 1));
        match self.device.info().total_bytes {
            0 => rounded,
            total => rounded.min(total.max(self.options.limit)),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Every update under the lock leaves the arena consistent before any call that could
        // panic, so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a region able to hold `need` bytes, by the preallocation or growth rule.
    /// `Err` carries the cause for the OOM report.
    fn extend(&self, inner: &mut Inner, need: u64) -> std::result::Result<(), String> {
        let limit = self.options.limit;
        if self.options.preallocate {
            let size = self.preallocation_size();
            if need > size {
                return Err(self.exceeds(need, size));
            }
            if inner.arena.region_count() > 0 {
                return Err(format!(
                    "no free chunk fits in the preallocated region of {} (preallocation never grows)",
                    Bytes(inner.arena.pool_bytes())
                ));
            }
            let base = self.device.alloc(size).map_err(|e| {
                format!(
                    "the device refused the preallocation of {} ({size} B): {e}",
                    Bytes(size)
                )
            })?;
            return self.add_region(inner, base, size);
        }

        // Growth: XLA's BFCAllocator::Extend.
        let pool = inner.arena.pool_bytes();
        let available = limit.saturating_sub(pool) & !(MIN_ALLOCATION - 1);
        if need > available {
            return Err(if need > limit {
                self.exceeds(need, limit)
            } else {
                format!(
                    "the limit of {} is reached: the pool holds {} and {} is left, {} needed",
                    Bytes(limit),
                    Bytes(pool),
                    Bytes(available),
                    Bytes(need)
                )
            });
        }
        let mut increased = false;
        while need > inner.next_region {
            inner.next_region = inner.next_region.saturating_mul(2);
            increased = true;
        }
        let first_try = inner.next_region.min(available);
        let mut bytes = first_try;
        let mut result = self.device.alloc(bytes);
        if let Err(e) = &result {
            if e.is_out_of_memory() && !inner.backed_off {
                inner.backed_off = true;
                loop {
                    let smaller = (u128::from(bytes) * 9 / 10) as u64;
                    bytes = round_up(smaller, MIN_ALLOCATION).unwrap_or(smaller);
                    if bytes < need {
                        break;
                    }
                    result = self.device.alloc(bytes);
                    match &result {
                        Ok(_) => break,
                        Err(e) if e.is_out_of_memory() => {}
                        Err(_) => break,
                    }
                }
            }
        }
        let base = result.map_err(|e| {
            let backoff = if bytes == first_try {
                String::new()
            } else {
                format!(", backing off ×0.9 down to {}", Bytes(bytes.max(need)))
            };
            format!(
                "the device refused to grow the pool by {}{backoff}: {e}",
                Bytes(first_try)
            )
        })?;
        if !increased {
            inner.next_region = inner.next_region.saturating_mul(2);
        }
        self.add_region(inner, base, bytes)
    }

    /// Returns completed pending frees to the bins, then looks for a pending chunk of
    /// `stream` to reuse at once.
    #[cold]
    #[inline(never)]
    fn take_pending(
        &self,
        inner: &mut Inner,
        stream: Stream,
        rounded: u64,
        alignment: u64,
    ) -> Option<Grant> {
        self.poll_pending(inner);
        self.reuse_pending(inner, stream, rounded, alignment)
    }

    /// No free chunk fits: wait for pending frees (memory only waiting for other streams'
    /// events is no reason to grow or fail), then grow the pool.
    #[inline(never)]
    fn allocate_slow(
        &self,
        inner: &mut Inner,
        size: u64,
        rounded: u64,
        alignment: u64,
    ) -> Result<Grant> {
        if inner.order.pending_count > 0 {
            self.sync_pending(inner);
            if let Some(g) = inner.arena.allocate(rounded, alignment, size) {
                return Ok(g);
            }
        }
        // A device base is only 256-aligned: leave room to align within the region.
        let need = rounded.saturating_add(alignment - MIN_ALLOCATION);
        if let Err(cause) = self.extend(inner, need) {
            return Err(self.oom(inner, size, rounded, alignment, cause));
        }
        inner
            .arena
            .allocate(rounded, alignment, size)
            .ok_or_else(|| {
                let cause = "no chunk fits even after growing the pool".to_string();
                self.oom(inner, size, rounded, alignment, cause)
            })
    }

    /// Notes the stream of a request; at the first request on a second stream, switches to
    /// stream-ordered frees.
    #[cold]
    #[inline(never)]
    fn see_stream(&self, inner: &mut Inner, stream: Stream) {
        match inner.order.first {
            Some(first) if first == stream || inner.order.multi => {}
            Some(first) => {
                inner.order.multi = true;
                if inner.order.freed_while_single {
                    // Frees on `first` went to the bins without an event: wait for its work
                    // once before another stream may be handed that memory.
                    if let Err(e) = self.device.synchronize_stream(first) {
                        tracing::debug!(stream = first.0, error = %e, "could not synchronize the first stream");
                    }
                }
            }
            None => inner.order.first = Some(stream),
        }
    }

    /// Waits for `stream`'s work; a device that refuses (a stream it does not know) has no
    /// work there that could still use memory.
    fn synchronize(&self, stream: Stream) {
        if let Err(e) = self.device.synchronize_stream(stream) {
            tracing::debug!(stream = stream.0, error = %e,
                "could not synchronize the stream: the device has no work on it; freeing at once");
        }
    }

    /// Frees a chunk handed out while several streams are in use: pending on `stream` with
    /// an event, or at once when no event can be recorded there.
    fn free_on_stream(&self, inner: &mut Inner, stream: Stream, h: Handed) {
        let recorded = inner
            .order
            .idle_events
            .take(&*self.device)
            .and_then(|event| match self.device.record_event(event, stream) {
                Ok(()) => Ok(event),
                Err(e) => {
                    inner.order.idle_events.give(&*self.device, event);
                    Err(e)
                }
            });
        let event = match recorded {
            Ok(event) => event,
            Err(e) => {
                tracing::debug!(stream = stream.0, error = %e, "could not record an event");
                self.synchronize(stream);
                let freed = inner.arena.free(h.token, h.addr);
                debug_assert!(freed.is_some());
                return;
            }
        };
        let pending = Pending {
            token: h.token,
            addr: h.addr,
            size: h.size,
            event,
        };
        let order = &mut inner.order;
        match order.pending.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, queue)) => queue.push_back(pending),
            None => order.pending.push((stream, VecDeque::from([pending]))),
        }
        order.pending_bytes += h.size;
        order.pending_count += 1;
    }

    /// Returns the pending frees whose events have completed to the bins: the oldest of each
    /// stream first, stopping at the first that has not (a stream's events complete in order).
    fn poll_pending(&self, inner: &mut Inner) {
        let mut done = Vec::new();
        for (_, queue) in &mut inner.order.pending {
            while let Some(p) = queue.front() {
                if !matches!(self.device.event_complete(p.event), Ok(true)) {
                    break;
                }
                done.extend(queue.pop_front());
            }
        }
        for p in done {
            inner.release_pending(p);
            inner.order.idle_events.give(&*self.device, p.event);
        }
    }

    /// Waits for every pending free and returns them all to the bins.
    fn sync_pending(&self, inner: &mut Inner) {
        let queues = std::mem::take(&mut inner.order.pending);
        for (stream, queue) in queues {
            for p in queue {
                if let Err(e) = self.device.synchronize_event(p.event) {
                    if let Err(sync) = self.device.synchronize_stream(stream) {
                        tracing::debug!(stream = stream.0, event = %e, synchronize = %sync,
                            "could not wait for a pending free; returning it anyway");
                    }
                }
                inner.release_pending(p);
                inner.order.idle_events.give(&*self.device, p.event);
            }
        }
    }

    /// A pending chunk of `stream` that the split rule would hand out whole for `rounded`
    /// bytes at `alignment`: the smallest, then the lowest address. Taken out of pending.
    fn reuse_pending(
        &self,
        inner: &mut Inner,
        stream: Stream,
        rounded: u64,
        alignment: u64,
    ) -> Option<Grant> {
        let order = &mut inner.order;
        let (_, queue) = order.pending.iter_mut().find(|(s, _)| *s == stream)?;
        let whole = |p: &Pending| {
            p.size >= rounded
                && p.addr % alignment == 0
                && rounded.checked_mul(2).map_or(true, |twice| p.size < twice)
                && p.size - rounded < MAX_INTERNAL_FRAGMENTATION
        };
        let (i, _) = queue
            .iter()
            .enumerate()
            .filter(|(_, p)| whole(p))
            .min_by_key(|(_, p)| (p.size, p.addr))?;
        let p = queue.remove(i)?;
        order.pending_bytes -= p.size;
        order.pending_count -= 1;
        order.idle_events.give(&*self.device, p.event);
        Some(Grant {
            addr: p.addr,
            chunk_size: p.size,
            token: p.token,
        })
    }

    fn exceeds(&self, need: u64, cap: u64) -> String {
        format!(
            "the request ({} with alignment slack) exceeds the limit of {} ({} B{})",
            Bytes(need),
            Bytes(self.options.limit),
            self.options.limit,
            if cap == self.options.limit {
                String::new()
            } else {
                format!("; preallocated region {} B", cap)
            }
        )
    }

    fn add_region(
        &self,
        inner: &mut Inner,
        base: u64,
        size: u64,
    ) -> std::result::Result<(), String> {
        if let Err(why) = inner.arena.add_region(base, size) {
            let _ = self.device.free(base, size);
            return Err(format!("the device gave an unusable region: {why}"));
        }
        inner.peak_pool_bytes = inner.peak_pool_bytes.max(inner.arena.pool_bytes());
        Ok(())
    }

    fn oom(
        &self,
        inner: &Inner,
        requested: u64,
        rounded: u64,
        alignment: u64,
        cause: String,
    ) -> Error {
        let a = &inner.arena;
        let largest = a.largest_free();
        Error::OutOfMemory(Box::new(OomReport {
            allocator: self.name().to_string(),
            requested,
            rounded,
            alignment,
            limit: Some(self.options.limit),
            bytes_in_use: inner.bytes_in_use(),
            pool_bytes: a.pool_bytes(),
            largest_free_block: largest,
            fragmentation: Stats::compute_fragmentation(a.pool_bytes(), a.bytes_in_use(), largest),
            device_free: self.device.mem_info().ok().map(|m| m.free),
            cause,
            bins: a.bin_summaries(),
            regions: a.region_maps(),
        }))
    }
}

impl<D: Device + ?Sized> Allocator for BfcAllocator<D> {
    fn name(&self) -> &str {
        "bfc"
    }

    fn id(&self) -> u64 {
        self.id
    }

    /// Best fit from the pool, growing it (or taking the preallocation) when nothing fits.
    ///
    /// # Errors
    /// [`Error::InvalidAlignment`] for an alignment that is not a power of two or exceeds
    /// [`MAX_ALIGNMENT`]; [`Error::InvalidSize`] for a size that overflows once rounded up
    /// to 256; [`Error::OutOfMemory`] (with a report) when it cannot be served within the
    /// limit or the device refuses to grow the pool.
    ///
    /// # Time complexity
    /// `O(log n)` in the number of free chunks (256-byte alignment), plus a device call
    /// when the pool grows.
    fn allocate(
        &self,
        size: u64,
        alignment: u64,
        stream: Stream,
        _tag: &str,
    ) -> Result<Allocation> {
        let alignment = effective_alignment(alignment, MIN_ALLOCATION, MAX_ALIGNMENT)?;
        if size == 0 {
            self.inner().num_allocs += 1;
            return Ok(Allocation::new(0, 0, stream, self.id, 0));
        }
        let rounded = round_up(size, MIN_ALLOCATION)?;
        let mut guard = self.inner();
        let inner = &mut *guard;
        if inner.order.first != Some(stream) {
            self.see_stream(inner, stream);
        }
        let mut reused = None;
        if inner.order.pending_count > 0 {
            reused = self.take_pending(inner, stream, rounded, alignment);
        }
        let grant = match reused {
            Some(g) => g,
            None => match inner.arena.allocate(rounded, alignment, size) {
                Some(g) => g,
                None => self.allocate_slow(inner, size, rounded, alignment)?,
            },
        };
        inner.record_handed(&grant);
        inner.num_allocs += 1;
        inner.peak_bytes_in_use = inner.peak_bytes_in_use.max(inner.bytes_in_use());
        inner.largest_alloc_size = inner.largest_alloc_size.max(grant.chunk_size);
        Ok(Allocation::new(
            grant.addr,
            size,
            stream,
            self.id,
            grant.token,
        ))
    }

    /// Frees the chunk and coalesces it with its free neighbours at once.
    ///
    /// # Errors
    /// [`Error::ForeignAllocation`] when another allocator made it;
    /// [`Error::UnknownPointer`] when it names no live chunk of this allocator.
    ///
    /// # Time complexity
    /// `O(log n)` in the number of free chunks.
    fn deallocate(&self, allocation: Allocation) -> Result<()> {
        if allocation.allocator_id() != self.id {
            return Err(Error::ForeignAllocation {
                ptr: allocation.ptr(),
                owner: allocation.allocator_id(),
                this: self.id,
            });
        }
        if allocation.is_empty() {
            return Ok(());
        }
        let unknown = || Error::UnknownPointer {
            what: "allocation",
            ptr: allocation.ptr(),
            backend: self.device.info().vendor.name(),
        };
        let (token, ptr) = (allocation.token(), allocation.ptr());
        let idx = token as u32 as usize;
        let mut guard = self.inner();
        let inner = &mut *guard;
        if !inner.order.multi {
            inner.arena.free(token, ptr).ok_or_else(unknown)?;
            if let Some(h) = inner.handed.get_mut(idx) {
                h.size = 0;
            }
            inner.order.freed_while_single = true;
            return Ok(());
        }
        // The chunk stays in use in the arena while pending: `handed` tells a live chunk from
        // a pending (or stale, or forged) one.
        let h = inner
            .handed
            .get(idx)
            .copied()
            .filter(|h| h.size != 0 && h.token == token && h.addr == ptr)
            .ok_or_else(unknown)?;
        inner.handed[idx].size = 0;
        self.free_on_stream(inner, allocation.stream(), h);
        Ok(())
    }

    /// # Time complexity
    /// `O(log n)`.
    fn stats(&self) -> Stats {
        let inner = self.inner();
        let a = &inner.arena;
        let largest = a.largest_free();
        Stats {
            num_allocs: inner.num_allocs,
            bytes_in_use: inner.bytes_in_use(),
            peak_bytes_in_use: inner.peak_bytes_in_use,
            largest_alloc_size: inner.largest_alloc_size,
            bytes_limit: Some(self.options.limit),
            bytes_reserved: 0,
            peak_bytes_reserved: 0,
            largest_free_block_bytes: largest,
            pool_bytes: a.pool_bytes(),
            peak_pool_bytes: inner.peak_pool_bytes,
            fragmentation: Stats::compute_fragmentation(a.pool_bytes(), a.bytes_in_use(), largest),
        }
    }

    /// Returns every region that is entirely free to the device, after waiting for pending
    /// stream-ordered frees. Under preallocation the region is taken again at the next
    /// allocation.
    ///
    /// # Errors
    /// The device's error if it refuses a free; regions freed before it stay freed.
    ///
    /// # Time complexity
    /// `O(regions²)` plus a device call per region released.
    fn trim(&self) -> Result<u64> {
        let mut inner = self.inner();
        if inner.order.pending_count > 0 {
            self.sync_pending(&mut inner);
        }
        let mut released = 0;
        for (base, size) in inner.arena.free_regions() {
            self.device.free(base, size)?;
            inner.arena.remove_free_region(base);
            released += size;
        }
        Ok(released)
    }

    /// Checks the arena's invariants (see [`Arena::check_invariants`]) and the peaks.
    fn check_invariants(&self) -> std::result::Result<(), String> {
        let inner = self.inner();
        inner.arena.check_invariants()?;
        let a = &inner.arena;
        let order = &inner.order;
        let pending = order.pending.iter().flat_map(|(_, q)| q.iter());
        let (count, bytes) = pending
            .clone()
            .fold((0, 0), |(n, b), p| (n + 1, b + p.size));
        if count != order.pending_count || bytes != order.pending_bytes {
            return Err(format!(
                "{count} pending frees of {bytes} B, counted {} of {} B",
                order.pending_count, order.pending_bytes
            ));
        }
        if bytes > a.bytes_in_use() || count > a.live_count() {
            return Err("pending frees exceed the chunks in use".into());
        }
        if let Some(p) = pending.clone().find(|p| {
            inner
                .handed
                .get(p.token as u32 as usize)
                .map_or(true, |h| h.size != 0)
        }) {
            return Err(format!("pending chunk at {:#x} is also handed out", p.addr));
        }
        if inner.peak_bytes_in_use < inner.bytes_in_use() || inner.peak_pool_bytes < a.pool_bytes()
        {
            return Err("a peak is below its current value".into());
        }
        if !self.options.preallocate && a.pool_bytes() > self.options.limit {
            return Err(format!(
                "pool {} exceeds the limit {}",
                a.pool_bytes(),
                self.options.limit
            ));
        }
        if self.options.preallocate && a.region_count() > 1 {
            return Err("a preallocating allocator holds more than one region".into());
        }
        Ok(())
    }
}

impl<D: Device + ?Sized> Drop for BfcAllocator<D> {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        let order = std::mem::take(&mut inner.order);
        let events = order
            .pending
            .iter()
            .flat_map(|(_, q)| q.iter().map(|p| p.event));
        for event in events.chain(order.idle_events.iter()) {
            if let Err(e) = super::release_with_retry(|| self.device.destroy_event(event)) {
                tracing::debug!(event = event.0, error = %e, "could not destroy an event");
            }
        }
        let live = inner.arena.live_count() - order.pending_count;
        if live > 0 {
            tracing::warn!(
                allocator = "bfc",
                live,
                bytes = inner.arena.bytes_in_use() - order.pending_bytes,
                "allocator dropped with live allocations (leaked); returning its regions to the device"
            );
        }
        for (base, size) in inner.arena.regions() {
            if let Err(e) = super::release_with_retry(|| self.device.free(base, size)) {
                tracing::warn!(base, size, error = %e, "could not return a bfc region to the device");
            }
        }
    }
}
