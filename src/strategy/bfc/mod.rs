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
//! * The back-off factor is computed in integers (`bytes × 9 / 10`, rounded up to 256 B,
//!   and at least 256 B less than the size refused, as in XLA's strict-progress rule) where
//!   XLA multiplies by the `float` 0.9f; and like XLA, it backs off during one growth
//!   attempt only, ever (XLA's `started_backpedal_`): later refusals fail at once.
//! * `bytes_reserved` is always 0: XLA uses it for memory reserved beyond the pool, and BFC
//!   reserves none.
//! * **Streams** (XLA's BFC serves one stream): the stream-ordering contract of [`Device`] is
//!   kept, as below.
//!
//! # Stream-ordered reuse
//!
//! As the shared `stream_order` module does it for bfc and vmm: while every request has come
//! on one stream a free goes straight back to the bins, as in XLA, and no event is made (the
//! single-stream path costs one comparison and keeps no per-chunk books beside the arena's).
//! From the first request on a second stream on, a chunk freed on stream `S` is kept **pending**:
//! still in use in the arena (so it coalesces with nothing and no other stream is handed it),
//! with an event recorded on `S`. A request on `S` may reuse one of the chunks pending on
//! `S`'s handle without a CPU wait — the best fit among them (smallest, then lowest address)
//! that the split rule would hand out whole — behind a GPU-side wait for its event, since the
//! handle may name a stream made after the old one was destroyed; one the rule would split
//! waits for its event, since its remainder would be free for everyone. Every allocation
//! first polls the pending frees and returns completed ones to the bins, coalescing them;
//! before growing the pool or reporting out-of-memory every pending free is waited for, and
//! [`Allocator::trim`] waits for all work on the freed memory before it gives regions back.
//! Streams are the caller's: any handle is accepted, and a stream on which no event can be
//! recorded is synchronised (or the device is), never taken for idle — see the
//! stream-ordering contract on [`Device`].
//!
//! Pending chunks are not counted in `bytes_in_use` or [`BfcAllocator::live_count`]; the
//! per-bin summaries and region maps show them as in use (with the request they were last
//! handed out for).
#![deny(unsafe_code)]

pub mod arena;

use std::sync::{Arc, Mutex, MutexGuard};

use crate::allocator::{next_allocator_id, round_up, Allocation, Allocator, Stats};
use crate::device::{Device, Stream};
use crate::error::{Error, Result};
use crate::report::{BinSummary, OomReport};
use crate::units::Bytes;

use arena::{Arena, Grant, MAX_INTERNAL_FRAGMENTATION};

/// The largest alignment accepted: 1 GiB. Larger ones would rarely fit any region.
pub const MAX_ALIGNMENT: u64 = 1 << 30;
/// A preallocated region is the limit rounded up to this (2 MiB).
pub const PREALLOCATION_GRANULE: u64 = 2 << 20;
/// Under growth, the first region is `min(limit, 2 MiB)`.
pub const INITIAL_REGION: u64 = 2 << 20;
use super::bins::MIN_ALLOCATION;
use super::common::{admit, holds_memory, synchronized, Admitted, FailedRequest};
pub use super::stream_order::EVENT_POOL;
use super::stream_order::{wait_outside, StreamOrder, TokenChunk};

/// Sizes `1..=ROUNDS_UP` round up to 256 B without overflow: `size − 1 < ROUNDS_UP` is the
/// hot path's one check that a request is neither empty nor too large to round.
const ROUNDS_UP: u64 = u64::MAX - (MIN_ALLOCATION - 1);

/// How many times [`Allocator::trim`] waits, with the lock released, for the work on freed
/// memory before it waits with the lock held (frees that keep arriving meanwhile).
const TRIM_WAITS: usize = 3;

/// Options of [`BfcAllocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfcOptions {
    /// The most memory the allocator may take from the device (`fraction × total`).
    pub limit: u64,
    /// One region of `limit` at the first allocation (true) or growth by doubling (false).
    pub preallocate: bool,
}

/// A chunk handed out, by arena slot (the token's low 32 bits); also what a pending
/// stream-ordered free keeps. `size` is 0 when the slot holds nothing handed out.
type Handed = TokenChunk;

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
    /// check of tokens while a pending chunk stays in use in the arena). Kept only from the
    /// switch to multi-stream mode on: on the single-stream path a free goes straight to the
    /// arena, which checks the token itself, so a store per operation into this vector (one
    /// entry per slot, far out of cache with hundreds of thousands of chunks) bought nothing.
    /// At the switch it is filled from the arena's chunks in use ([`Inner::start_handed`]).
    ///
    /// Invariant: empty while `!order.is_multi()`; once multi, `handed[slot]` has a non-zero
    /// `size` exactly for the arena's chunks in use that are not pending, with their token,
    /// address and chunk size.
    handed: Vec<Handed>,
    /// Stream-ordered reuse. Invariant: each pending chunk is in use in the arena and not
    /// in `handed`.
    order: StreamOrder<Handed>,
}

impl Inner {
    /// Bytes handed out: the arena's in-use bytes less the pending frees.
    #[inline]
    fn bytes_in_use(&self) -> u64 {
        self.arena.bytes_in_use() - self.order.bytes()
    }

    /// Counts an allocation of a chunk of `chunk_size` bytes, now in the arena's books.
    #[inline(always)]
    fn note_allocated(&mut self, chunk_size: u64) {
        self.num_allocs += 1;
        self.peak_bytes_in_use = self.peak_bytes_in_use.max(self.bytes_in_use());
        self.largest_alloc_size = self.largest_alloc_size.max(chunk_size);
    }

    /// Starts `handed` at the switch to multi-stream mode: every chunk in use then is live
    /// (nothing is pending before the switch).
    ///
    /// # Time complexity
    /// `O(slots)`, once.
    #[cold]
    #[inline(never)]
    fn start_handed(&mut self) {
        debug_assert_eq!(self.order.count(), 0, "pending frees before the switch");
        self.handed.clear();
        let live: Vec<Grant> = self.arena.in_use().collect();
        for grant in &live {
            self.record_handed(grant);
        }
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
}

/// A request as admitted: what [`BfcAllocator::serve`] and its steps are asked to serve.
#[derive(Debug, Clone, Copy)]
struct Request {
    stream: Stream,
    /// Bytes asked for.
    size: u64,
    /// Rounded up to the 256-byte unit.
    rounded: u64,
    /// A power of two, at least 256.
    alignment: u64,
}

/// Notes the stream of a request that is not on the first stream; at the switch to
/// multi-stream mode, starts the books of chunks handed out, which the single-stream path
/// does not keep.
///
/// # Errors
/// As [`StreamOrder::see_stream`].
#[cold]
#[inline(never)]
fn see_stream<D: Device + ?Sized>(device: &D, inner: &mut Inner, stream: Stream) -> Result<()> {
    let was_multi = inner.order.is_multi();
    inner.order.see_stream(device, stream)?;
    if !was_multi && inner.order.is_multi() {
        inner.start_handed();
    }
    Ok(())
}

/// Returns a pending chunk to the bins (its stream's work on it is done).
fn release_pending(arena: &mut Arena, p: Handed) {
    let freed = arena.free(p.token, p.addr);
    debug_assert!(freed.is_some(), "a pending chunk was not in use");
}

/// Whether pending chunk `p` is one the split rule hands out whole for `rounded` bytes at
/// `alignment`, keyed by (size, address) for the best fit. One the rule would split waits
/// for its event instead, since its remainder would be free for everyone.
fn whole(p: &Handed, rounded: u64, alignment: u64) -> Option<((u64, u64), ())> {
    (p.size >= rounded
        && p.addr % alignment == 0
        && rounded.checked_mul(2).map_or(true, |twice| p.size < twice)
        && p.size - rounded < MAX_INTERNAL_FRAGMENTATION)
        .then_some(((p.size, p.addr), ()))
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
    /// ```
    /// use std::sync::Arc;
    ///
    /// use portalloc::backends::host::HostDevice;
    /// use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
    /// use portalloc::{Allocator, Stream};
    ///
    /// // A simulated 1 GiB device: it tracks addresses and touches no memory.
    /// let device = Arc::new(HostDevice::builder().capacity(1 << 30).simulated(true).build()?);
    ///
    /// // Preallocating, XLA's default: the first allocation takes one region of the whole
    /// // limit, and every later one is served from it.
    /// let options = BfcOptions { limit: 256 << 20, preallocate: true };
    /// let preallocated = BfcAllocator::new(Arc::clone(&device), options)?;
    /// assert!(preallocated.region_sizes().is_empty());
    /// let weights = preallocated.allocate(1 << 20, 0, Stream::DEFAULT, "weights")?;
    /// assert_eq!(preallocated.region_sizes(), [256 << 20]);
    /// preallocated.deallocate(weights)?;
    /// // Freed memory stays in the pool until trimmed.
    /// assert_eq!(preallocated.stats().pool_bytes, 256 << 20);
    /// assert_eq!(preallocated.trim()?, 256 << 20);
    ///
    /// // Growing (`XLA_PYTHON_CLIENT_PREALLOCATE=false`): a first region of 2 MiB, and each
    /// // region taken doubles the next one.
    /// let options = BfcOptions { limit: 256 << 20, preallocate: false };
    /// let growing = BfcAllocator::new(device, options)?;
    /// let small = growing.allocate(1 << 20, 0, Stream::DEFAULT, "weights")?;
    /// let large = growing.allocate(3 << 20, 0, Stream::DEFAULT, "activations")?;
    /// assert_eq!(growing.region_sizes(), [2 << 20, 4 << 20]);
    /// // XLA's split rule: a chunk is split only when it is at least twice the request (or
    /// // the rest is 128 MiB or more), so the 3 MiB request holds the whole 4 MiB region.
    /// assert_eq!(growing.stats().bytes_in_use, (1 << 20) + (4 << 20));
    /// growing.deallocate(small)?;
    /// growing.deallocate(large)?;
    /// # Ok::<(), portalloc::Error>(())
    /// ```
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
        inner.arena.live_count() - inner.order.count()
    }

    /// Chunks freed on one stream and not yet safe for the others (see the module docs), and
    /// their bytes.
    pub fn pending_frees(&self) -> (usize, u64) {
        let inner = self.inner();
        (inner.order.count(), inner.order.bytes())
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
                // Say where the pool's free bytes are: a request larger than what the limit
                // leaves is refused even when the free and the unused bytes together would
                // hold it, since a region never grows or merges with another (as in XLA).
                format!(
                    "the limit of {} is reached: the pool holds {} ({} of it free, the largest \
                     free chunk {}; regions never merge) and {} is left, {} needed",
                    Bytes(limit),
                    Bytes(pool),
                    Bytes(pool.saturating_sub(inner.arena.bytes_in_use())),
                    Bytes(inner.arena.largest_free()),
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
                    let smaller = round_up(smaller, MIN_ALLOCATION).unwrap_or(smaller);
                    // Up to 10 × 256 B, rounding ×0.9 up gives `bytes` back: step down by
                    // 256 B instead (as XLA now does), or a device that keeps refusing
                    // would be asked for the same size for ever.
                    bytes = if smaller < bytes {
                        smaller
                    } else {
                        bytes.saturating_sub(MIN_ALLOCATION)
                    };
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

    /// A zero-byte request: counted, served with an [`Allocation::empty`].
    #[cold]
    #[inline(never)]
    fn allocate_empty(&self, stream: Stream) -> Allocation {
        self.inner().num_allocs += 1;
        Allocation::empty(stream, self.id)
    }

    /// [`Allocator::allocate`] off its hot path: the first request, a request on a stream
    /// other than the first, any request once frees are stream-ordered, and one the bins
    /// cannot serve (`bins_tried`: the hot path found no chunk, nothing changed since) —
    /// pending frees, growth, and the CPU wait before refusing.
    ///
    /// # Errors
    /// As [`Allocator::allocate`].
    #[inline(never)]
    fn allocate_other<'a>(
        &'a self,
        mut guard: MutexGuard<'a, Inner>,
        request: &Request,
        bins_tried: bool,
    ) -> Result<Allocation> {
        let mut inner = &mut *guard;
        if !inner.order.is_first(request.stream) {
            see_stream(&*self.device, inner, request.stream)?;
        }
        let served = if bins_tried {
            self.allocate_slow(inner, request)
        } else {
            self.serve(inner, request)
        };
        let grant = match served {
            Ok(g) => g,
            Err(refused) => {
                // Nothing serves it without a CPU wait: wait, with the lock released, for
                // the frees still in flight, then try once more — the CPU waits only here,
                // just before refusing.
                let waits = inner.order.cpu_waits_pending();
                if waits.is_empty() {
                    return Err(refused);
                }
                drop(guard);
                wait_outside(&*self.device, &waits);
                guard = self.inner();
                inner = &mut *guard;
                self.serve(inner, request)?
            }
        };
        if inner.order.is_multi() {
            inner.record_handed(&grant);
        }
        inner.note_allocated(grant.chunk_size);
        drop(guard);
        Ok(Allocation::new(
            grant.addr,
            request.size,
            request.stream,
            self.id,
            grant.token,
        ))
    }

    /// The error for a free of `ptr` that names no live chunk.
    #[cold]
    #[inline(never)]
    fn unknown(&self, ptr: u64) -> Error {
        Error::UnknownPointer {
            what: "allocation",
            ptr,
            backend: self.device.info().vendor.name(),
        }
    }

    /// [`Allocator::deallocate`] once frees are stream-ordered: the chunk is kept pending
    /// (or, `settled`, returned to the bins at once).
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] when it names no live chunk.
    #[inline(never)]
    fn deallocate_ordered(
        &self,
        mut guard: MutexGuard<'_, Inner>,
        allocation: Allocation,
        settled: bool,
    ) -> Result<()> {
        let inner = &mut *guard;
        let (token, ptr) = (allocation.token(), allocation.ptr());
        let idx = token as u32 as usize;
        // The chunk stays in use in the arena while pending: `handed` tells a live chunk from
        // a pending (or stale, or forged) one.
        let Some(h) = inner
            .handed
            .get(idx)
            .copied()
            .filter(|h| h.size != 0 && h.token == token && h.addr == ptr)
        else {
            drop(guard);
            return Err(self.unknown(ptr));
        };
        inner.handed[idx].size = 0;
        if settled {
            release_pending(&mut inner.arena, h);
        } else if let Some(now) = inner.order.free(&*self.device, allocation.stream(), h) {
            release_pending(&mut inner.arena, now);
        }
        Ok(())
    }

    /// Looks for a pending chunk that the split rule would hand out whole for `rounded` bytes
    /// at `alignment` (the smallest, then the lowest address), handed out again under a new
    /// generation, behind a GPU-side wait on `stream` for its free's event (no CPU wait): one
    /// made on `stream`'s handle, after returning completed pending frees to the bins (and
    /// forgetting a completed fence); with `elsewhere`, one of another stream's.
    #[cold]
    #[inline(never)]
    fn take_pending(&self, inner: &mut Inner, r: &Request, elsewhere: bool) -> Option<Grant> {
        let Request {
            stream,
            size,
            rounded,
            alignment,
        } = *r;
        let device = &*self.device;
        if !elsewhere {
            let arena = &mut inner.arena;
            inner.order.poll(device, |p| release_pending(arena, p));
        }
        if inner.order.count() == 0 {
            return None;
        }
        let arena = &mut inner.arena;
        let fit = |p: &Handed| whole(p, rounded, alignment);
        let hand_out =
            |p: Handed, ()| Some((arena.hand_out_again(p.token, p.addr, size)?, Vec::new()));
        if elsewhere {
            inner.order.take_elsewhere(device, stream, fit, hand_out)
        } else {
            inner.order.take(device, stream, fit, hand_out)
        }
    }

    /// Serves a request without waiting on the CPU, in RMM's order: `stream`'s own pending
    /// frees, the bins (after a GPU-side wait for the fence, on another stream), another
    /// stream's pending frees behind a GPU-side wait, growth.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] with the cause when none of them serves it.
    #[inline]
    fn serve(&self, inner: &mut Inner, r: &Request) -> Result<Grant> {
        if inner.order.is_multi() {
            return self.serve_multi(inner, r);
        }
        // One stream: nothing is pending, the bins serve it or the pool grows.
        match inner.arena.allocate(r.rounded, r.alignment, r.size) {
            Some(g) => Ok(g),
            None => self.allocate_slow(inner, r),
        }
    }

    /// [`BfcAllocator::serve`] once a second stream has been seen: pending frees first, the
    /// bins behind the fence.
    #[inline(never)]
    fn serve_multi(&self, inner: &mut Inner, r: &Request) -> Result<Grant> {
        if inner.order.count() > 0 || inner.order.fence_active() {
            if let Some(g) = self.take_pending(inner, r, false) {
                return Ok(g);
            }
        }
        // Memory freed at once before the switch may still be read by the first stream's
        // work: a request takes it from the bins only behind the fence — every request, on
        // any handle, the first stream's included (`order_after_fence`: a handle may name a
        // stream made since).
        let bins = !inner.order.fence_active()
            || inner
                .order
                .order_after_fence(&*self.device, r.stream)
                .is_ok();
        if bins {
            if let Some(g) = inner.arena.allocate(r.rounded, r.alignment, r.size) {
                return Ok(g);
            }
        }
        self.allocate_slow(inner, r)
    }

    /// Nothing in the bins fits: another stream's pending free behind a GPU-side wait, then
    /// growth.
    #[inline(never)]
    fn allocate_slow(&self, inner: &mut Inner, r: &Request) -> Result<Grant> {
        if let Some(g) = self.take_pending(inner, r, true) {
            return Ok(g);
        }
        let Request {
            size,
            rounded,
            alignment,
            ..
        } = *r;
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

    /// Returns every region that is entirely free to the device; the work on the freed
    /// memory must be known complete (the caller checked, or waited).
    fn release_free_regions(&self, inner: &mut Inner) -> Result<u64> {
        let mut released = 0;
        for (base, size) in inner.arena.free_regions() {
            self.device.free(base, size)?;
            inner.arena.remove_free_region(base);
            released += size;
        }
        Ok(released)
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
        let request = FailedRequest {
            allocator: self.name(),
            requested,
            rounded,
            alignment,
            limit: Some(self.options.limit),
        };
        Error::OutOfMemory(Box::new(OomReport {
            bytes_in_use: inner.bytes_in_use(),
            pool_bytes: a.pool_bytes(),
            largest_free_block: largest,
            fragmentation: Stats::compute_fragmentation(a.pool_bytes(), a.bytes_in_use(), largest),
            bins: a.bin_summaries(),
            regions: a.region_maps(),
            ..request.report(&*self.device, cause)
        }))
    }
}

impl<D: Device + ?Sized> Allocator for BfcAllocator<D> {
    crate::allocator::no_sleep!();

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
        // The common request (default alignment, a size that rounds up without overflow)
        // skips `admit`'s general checks.
        let (alignment, rounded) = if alignment == 0 && size.wrapping_sub(1) < ROUNDS_UP {
            (
                MIN_ALLOCATION,
                (size + (MIN_ALLOCATION - 1)) & !(MIN_ALLOCATION - 1),
            )
        } else {
            match admit(size, alignment, MIN_ALLOCATION, MAX_ALIGNMENT)? {
                Some(Admitted { alignment, rounded }) => (alignment, rounded),
                None => return Ok(self.allocate_empty(stream)),
            }
        };
        let mut guard = self.inner();
        let inner = &mut *guard;
        // The hot path: every request so far on one stream (nothing pending, no books of
        // chunks handed out), and the bins serve it. Everything else — the first request, a
        // second stream, growth, waits — is `allocate_other`, out of line.
        let single = inner.order.is_first(stream) && !inner.order.is_multi();
        if single {
            if let Some(grant) = inner.arena.allocate(rounded, alignment, size) {
                // Nothing is pending on one stream: the arena's bytes in use are all handed out.
                debug_assert_eq!(inner.order.bytes(), 0);
                inner.num_allocs += 1;
                inner.peak_bytes_in_use = inner.peak_bytes_in_use.max(inner.arena.bytes_in_use());
                inner.largest_alloc_size = inner.largest_alloc_size.max(grant.chunk_size);
                drop(guard);
                return Ok(Allocation::new(
                    grant.addr,
                    size,
                    stream,
                    self.id,
                    grant.token,
                ));
            }
        }
        let request = Request {
            stream,
            size,
            rounded,
            alignment,
        };
        self.allocate_other(guard, &request, single)
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
        if !holds_memory(&allocation, self.id)? {
            return Ok(());
        }
        // Made on another thread's per-thread stream: no event on this thread's can order the
        // free after that work, so the device is synchronised (without the lock) instead.
        let settled = allocation.freed_off_its_thread() && synchronized(&*self.device);
        let mut guard = self.inner();
        let inner = &mut *guard;
        if inner.order.is_multi() {
            return self.deallocate_ordered(guard, allocation, settled);
        }
        // One stream: straight back to the bins; the arena checks the token.
        if inner
            .arena
            .free(allocation.token(), allocation.ptr())
            .is_none()
        {
            drop(guard);
            return Err(self.unknown(allocation.ptr()));
        }
        inner.order.freed_at_once();
        Ok(())
    }

    /// The chunk it holds (pending frees are not live: `None`).
    /// The region holding it: one device allocation.
    fn backing(&self, allocation: &Allocation) -> Result<crate::allocator::Backing> {
        let live = allocation.allocator_id() == self.id
            && !allocation.is_empty()
            && self.charged(allocation).is_some();
        let region = live
            .then(|| {
                let ptr = allocation.ptr();
                self.inner()
                    .arena
                    .regions()
                    .find(|&(base, size)| base <= ptr && ptr - base < size)
            })
            .flatten();
        match region {
            Some((base, size)) => Ok(crate::allocator::Backing::Plain { base, size }),
            None => Err(crate::Error::InvalidArgument {
                call: "backing",
                reason: format!(
                    "{:#x} is not a live, non-empty allocation of this bfc allocator",
                    allocation.ptr()
                ),
            }),
        }
    }

    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        let inner = self.inner();
        let size = inner
            .arena
            .in_use_size(allocation.token(), allocation.ptr())?;
        if inner.order.is_multi() {
            // A pending chunk is still in use in the arena, but no longer handed out.
            let h = inner.handed.get(allocation.token() as u32 as usize)?;
            (h.size != 0 && h.token == allocation.token()).then_some(size)
        } else {
            Some(size)
        }
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
            ..Stats::default()
        }
    }

    /// Returns every region that is entirely free to the device, after waiting for the work
    /// on freed memory (pending stream-ordered frees, and the stream of single-stream frees).
    /// Under preallocation the region is taken again at the next allocation.
    ///
    /// # Errors
    /// The device's error if it refuses a free, or when the freed memory's streams cannot be
    /// waited for (nothing is released then); regions freed before it stay freed.
    ///
    /// # Time complexity
    /// `O(regions²)` plus a device call per region released.
    fn trim(&self) -> Result<u64> {
        let device = &*self.device;
        for _ in 0..TRIM_WAITS {
            let mut guard = self.inner();
            let inner = &mut *guard;
            // Frees that went back at once are fenced on the device; then everything in
            // flight is waited for with the lock released, and looked at again.
            if inner.order.unfenced() {
                inner.order.fence_now(device)?;
            }
            let arena = &mut inner.arena;
            inner.order.poll(device, |p| release_pending(arena, p));
            if inner.order.is_settled() {
                return self.release_free_regions(inner);
            }
            let waits = inner.order.cpu_waits_pending();
            drop(guard);
            wait_outside(device, &waits);
        }
        // Frees kept arriving while it waited: wait with the lock held.
        let mut guard = self.inner();
        let inner = &mut *guard;
        let arena = &mut inner.arena;
        inner.order.settle(device, |p| release_pending(arena, p))?;
        self.release_free_regions(inner)
    }

    /// Checks the arena's invariants (see [`Arena::check_invariants`]) and the peaks.
    fn check_invariants(&self) -> std::result::Result<(), String> {
        let inner = self.inner();
        inner.arena.check_invariants()?;
        let a = &inner.arena;
        let order = &inner.order;
        order.check(|p| {
            a.is_in_use(p.token, p.addr)
                && inner
                    .handed
                    .get(p.token as u32 as usize)
                    .is_some_and(|h| h.size == 0)
        })?;
        if order.bytes() > a.bytes_in_use() || order.count() > a.live_count() {
            return Err("pending frees exceed the chunks in use".into());
        }
        if !order.is_multi() {
            if !inner.handed.is_empty() {
                return Err("chunks handed out are recorded on the single-stream path".into());
            }
        } else {
            let mut recorded = 0;
            for (slot, h) in inner.handed.iter().enumerate() {
                if h.size == 0 {
                    continue;
                }
                recorded += 1;
                if h.token as u32 as usize != slot || !a.is_in_use(h.token, h.addr) {
                    return Err(format!("handed[{slot}] = {h:?} names no chunk in use"));
                }
            }
            let live: Vec<Grant> = a.in_use().collect();
            for g in &live {
                let h = inner.handed.get(g.token as u32 as usize);
                let unrecorded = h.map_or(true, |h| h.size == 0);
                if !unrecorded
                    && h != Some(&Handed {
                        token: g.token,
                        addr: g.addr,
                        size: g.chunk_size,
                    })
                {
                    return Err(format!("{g:?} is recorded as {h:?}"));
                }
            }
            if recorded + order.count() != a.live_count() {
                return Err(format!(
                    "{recorded} chunks recorded live and {} pending, {} in use",
                    order.count(),
                    a.live_count()
                ));
            }
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
        let live = inner.arena.live_count() - inner.order.count();
        // Work may still use the memory: wait before it goes back to the device — for the
        // frees (or, with allocations still live, on streams the books do not know, for the
        // whole device).
        let arena = &mut inner.arena;
        let waited = if live > 0 {
            self.device.synchronize_device()
        } else {
            inner
                .order
                .settle(&*self.device, |p| release_pending(arena, p))
        };
        if let Err(e) = waited {
            tracing::warn!(allocator = "bfc", error = %e,
                "could not wait for the work on its memory; returning it to the device anyway");
        }
        let order = std::mem::take(&mut inner.order);
        for event in order.events() {
            if let Err(e) = super::release_with_retry(|| self.device.destroy_event(event)) {
                tracing::debug!(event = event.0, error = %e, "could not destroy an event");
            }
        }
        if live > 0 {
            tracing::warn!(
                allocator = "bfc",
                live,
                bytes = inner.arena.bytes_in_use() - order.bytes(),
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
