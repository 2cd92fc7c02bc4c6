//! The host's stream-ordered memory pool: [`StreamOrderedPool`] with the semantics of a CUDA
//! memory pool (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync` / `cuMemPoolTrimTo`), so that
//! the `async` strategy is tested here.
//!
//! # The model
//!
//! * **Backing memory** comes in *segments*, each one plain device allocation
//!   ([`crate::Device::alloc`]'s path: charged against the capacity, real or simulated, and
//!   counted by [`HostDevice::census`] as an allocation and its bytes). A segment is the
//!   request rounded up to the device's granularity (2 MiB by default), as the drivers grow
//!   their pools.
//! * **Allocations** are carved out of free ranges of the segments, best fit (the smallest
//!   free range that holds the request, the lowest address on ties), each request rounded up
//!   to 256 bytes. A freed range coalesces with free neighbours in the same segment.
//! * **Stream order**: a free on stream `S` is an operation on `S`'s clock (the device's
//!   timeline): memory freed on `S` is reusable at once by requests on `S` (not on
//!   [`Stream::PER_THREAD`], another stream on each thread), and by other streams once the
//!   free has completed — at once on the host, unless something holds `S` back (a kernel in
//!   flight, a wait, the test's hold; then only once it completes or `S` is synchronised).
//!   Pending ranges are never merged with ranges that are not pending at the same place.
//! * **Release threshold** (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, default 0): at
//!   [`crate::Device::synchronize_stream`], whole free segments (none of their bytes in use
//!   or pending) are returned to the device, most recently placed first, until the pool holds
//!   at most the threshold. [`StreamOrderedPool::trim_to`] does the same down to its
//!   argument. The pool never trims itself when it cannot grow: like the drivers, it fails
//!   with [`Error::DeviceOutOfMemory`], and a synchronisation is what gives memory back.
//! * **Counters** follow `cuMemPoolGetAttribute`: reserved (segments) and used (rounded
//!   allocations), current and high-water marks.
//!
//! Streams are ordering keys here: the pool accepts any stream id, as the conformance suite
//! uses ids it never created. The free ranges are indexed by size and the pending ones kept
//! apart, so a request costs `O(log free ranges)` plus the ranges pending on other streams it
//! steps over (a replay's capacity search replays tens of thousands of requests through it,
//! many times: a scan of every free range per request made async's search the slowest).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::backends::{request_size, Request};
use crate::device::{PoolUsage, Stream, StreamOrderedPool};
use crate::error::{Error, Result};

use super::books::BACKEND;
use super::timeline::{ClockKey, Timeline};
use super::{HostDevice, State};

/// Pool allocations are rounded up to this, and start on it.
const POOL_UNIT: u64 = 256;

/// A free range of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FreeRange {
    size: u64,
    /// The free's place on its stream's clock, until it completes: only that stream may
    /// reuse it meanwhile.
    pending: Option<(ClockKey, u64)>,
}

/// The pool's books, kept behind the device's lock (in its `State`).
#[derive(Debug, Default)]
pub(super) struct PoolState {
    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
    threshold: u64,
    /// Segments: base → size. Invariant: each is a live device allocation of that size.
    segments: BTreeMap<u64, u64>,
    /// Free ranges: address → range. Invariant: inside one segment each, not overlapping
    /// each other or `used`; two adjacent ranges of one segment differ in `pending`. Changed
    /// only through [`PoolState::put`] and [`PoolState::pop`], which keep the two indexes
    /// below.
    free: BTreeMap<u64, FreeRange>,
    /// Invariant: `(size, address)` of every range of `free`: best fit in its order.
    by_size: BTreeSet<(u64, u64)>,
    /// Invariant: the addresses of the ranges of `free` whose `pending` is `Some`.
    pending_at: BTreeSet<u64>,
    /// Allocations handed out: address → rounded size.
    used: HashMap<u64, u64>,
    reserved: u64,
    reserved_high: u64,
    used_bytes: u64,
    used_high: u64,
}

impl PoolState {
    /// Records the free range `range` at `addr` (none there before), in `free` and its
    /// indexes.
    ///
    /// # Time complexity
    /// `O(log free ranges)`.
    fn put(&mut self, addr: u64, range: FreeRange) {
        self.free.insert(addr, range);
        self.by_size.insert((range.size, addr));
        if range.pending.is_some() {
            self.pending_at.insert(addr);
        }
    }

    /// Takes the free range at `addr` out of `free` and its indexes.
    ///
    /// # Time complexity
    /// `O(log free ranges)`.
    fn pop(&mut self, addr: u64) -> Option<FreeRange> {
        let range = self.free.remove(&addr)?;
        self.by_size.remove(&(range.size, addr));
        if range.pending.is_some() {
            self.pending_at.remove(&addr);
        }
        Some(range)
    }

    /// The base of the segment that holds `addr`.
    fn segment_of(&self, addr: u64) -> Option<u64> {
        let (&base, &size) = self.segments.range(..=addr).next_back()?;
        (addr < base + size).then_some(base)
    }

    /// Inserts a free range and merges it with neighbours of the same segment and tag.
    fn insert_free(&mut self, addr: u64, range: FreeRange) {
        self.put(addr, range);
        self.coalesce(addr);
    }

    /// Merges the free range at `addr` with its neighbours where they are adjacent, in the
    /// same segment and pending on the same stream (or both ready), as far as they go.
    fn coalesce(&mut self, mut addr: u64) {
        let Some(mut range) = self.free.get(&addr).copied() else {
            return;
        };
        let segment = self.segment_of(addr);
        while let Some((&prev, &p)) = self.free.range(..addr).next_back() {
            if prev + p.size != addr
                || p.pending != range.pending
                || self.segment_of(prev) != segment
            {
                break;
            }
            self.pop(addr);
            self.pop(prev);
            range.size += p.size;
            addr = prev;
            self.put(addr, range);
        }
        loop {
            let end = addr + range.size;
            match self.free.get(&end) {
                Some(&n) if n.pending == range.pending && self.segment_of(end) == segment => {
                    self.pop(end);
                    self.pop(addr);
                    range.size += n.size;
                    self.put(addr, range);
                }
                _ => break,
            }
        }
    }

    /// Completes the pending frees that `which` selects (they become reusable by any stream).
    /// Forgets the pending place of every free that completed, coalescing it.
    fn settle(&mut self, timeline: &Timeline) {
        if self.pending_at.is_empty() {
            return;
        }
        let done: Vec<u64> = self
            .pending_at
            .iter()
            .copied()
            .filter(|a| self.free[a].pending.is_some_and(|at| timeline.done_at(at)))
            .collect();
        for &addr in &done {
            if let Some(r) = self.pop(addr) {
                self.put(addr, FreeRange { pending: None, ..r });
            }
        }
        for addr in done {
            self.coalesce(addr);
        }
    }

    pub(super) fn is_segment(&self, addr: u64) -> bool {
        self.segments.contains_key(&addr)
    }

    /// The release threshold.
    pub(super) fn threshold(&self) -> u64 {
        self.threshold
    }

    /// The best-fit free range for `rounded` bytes usable on `stream`: the smallest, the
    /// lowest address among equals, of those not pending on another stream.
    ///
    /// # Time complexity
    /// `O(log free ranges)`, plus one step per range of the fitting sizes pending on another
    /// stream that it passes over.
    fn best_fit(&self, rounded: u64, stream: Stream) -> Option<(u64, FreeRange)> {
        let own = (!stream.is_per_thread()).then(|| ClockKey::of(stream));
        self.by_size
            .range((rounded, 0)..)
            .map(|&(_, a)| (a, self.free[&a]))
            .find(|(_, r)| r.pending.map_or(true, |(key, _)| Some(key) == own))
    }

    /// Hands out `[addr, addr + rounded)` of the free range at `addr`.
    fn take(&mut self, addr: u64, range: FreeRange, rounded: u64) {
        self.pop(addr);
        if range.size > rounded {
            self.put(
                addr + rounded,
                FreeRange {
                    size: range.size - rounded,
                    pending: range.pending,
                },
            );
        }
        self.used.insert(addr, rounded);
        self.used_bytes += rounded;
        self.used_high = self.used_high.max(self.used_bytes);
    }

    /// Whole segments that are free and not pending, most recently placed (highest) first.
    fn idle_segments(&self) -> Vec<(u64, u64)> {
        self.segments
            .iter()
            .rev()
            .filter(|(base, &size)| {
                self.free
                    .get(base)
                    .is_some_and(|r| r.size == size && r.pending.is_none())
            })
            .map(|(&b, &s)| (b, s))
            .collect()
    }

    fn usage(&self) -> PoolUsage {
        PoolUsage {
            reserved_current: self.reserved,
            reserved_high: self.reserved_high,
            used_current: self.used_bytes,
            used_high: self.used_high,
        }
    }
}

impl HostDevice {
    /// Returns idle segments to the device until the pool holds at most `keep` bytes.
    pub(super) fn pool_release(&self, st: &mut State, keep: u64) -> Result<()> {
        st.pool.settle(&st.timeline);
        for (base, size) in st.pool.idle_segments() {
            if st.pool.reserved <= keep {
                break;
            }
            self.free_in(
                &mut st.books,
                &mut st.sim,
                &mut st.timeline,
                (base, size),
                "a pool giving back a segment",
            )?;
            st.pool.pop(base);
            st.pool.segments.remove(&base);
            st.pool.reserved -= size;
        }
        Ok(())
    }
}

impl StreamOrderedPool for HostDevice {
    /// Best fit from the pool's free memory usable on `stream`, else a new segment of the
    /// request rounded up to the granularity.
    ///
    /// # Errors
    /// [`Error::InvalidSize`] for zero or a size that overflows once rounded;
    /// [`Error::DeviceOutOfMemory`] when the pool cannot grow within the capacity.
    fn alloc_async(&self, size: u64, stream: Stream) -> Result<u64> {
        let rounded = request_size(size, POOL_UNIT, Request::PoolAllocation)?;
        let mut guard = self.lock();
        let st = &mut *guard;
        st.pool.settle(&st.timeline);
        if let Some((addr, range)) = st.pool.best_fit(rounded, stream) {
            st.pool.take(addr, range, rounded);
            return Ok(addr);
        }
        let segment =
            rounded
                .checked_next_multiple_of(self.granularity)
                .ok_or(Error::InvalidSize {
                    size,
                    reason: "too large: rounding it up to the pool's segment size overflows",
                })?;
        let base = self.alloc_in(&mut st.books, &mut st.sim, segment)?;
        let pool = &mut st.pool;
        pool.segments.insert(base, segment);
        pool.reserved += segment;
        pool.reserved_high = pool.reserved_high.max(pool.reserved);
        let range = FreeRange {
            size: segment,
            pending: None,
        };
        pool.put(base, range);
        pool.take(base, range, rounded);
        Ok(base)
    }

    /// Frees in stream order: reusable on `stream` at once, and on other streams once the
    /// free completes on `stream`'s clock (at once, unless something holds it back).
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "pool allocation"`) for a pointer the pool did not
    /// hand out, or freed already.
    fn free_async(&self, ptr: u64, stream: Stream) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        let size = st.pool.used.remove(&ptr).ok_or(Error::UnknownPointer {
            what: "pool allocation",
            ptr,
            backend: BACKEND,
        })?;
        st.pool.used_bytes -= size;
        let at = st.timeline.free_on(stream);
        let pending = (!st.timeline.done_at(at)).then_some(at);
        st.pool.insert_free(ptr, FreeRange { size, pending });
        Ok(())
    }

    /// # Errors
    /// None.
    fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.lock().pool.threshold = bytes;
        Ok(())
    }

    /// # Errors
    /// None.
    fn release_threshold(&self) -> Result<u64> {
        Ok(self.lock().pool.threshold)
    }

    /// Returns idle segments (nothing in use or pending in them) until the pool holds at
    /// most `keep` bytes, or no idle segment is left.
    ///
    /// # Errors
    /// [`Error::Os`] when returning a segment fails; segments returned before stay returned.
    fn trim_to(&self, keep: u64) -> Result<()> {
        let mut guard = self.lock();
        self.pool_release(&mut guard, keep)
    }

    /// # Errors
    /// None.
    fn usage(&self) -> Result<PoolUsage> {
        Ok(self.lock().pool.usage())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The indexes agree with `free` (their invariants), and best fit is what a scan of every
    /// free range finds (the rule before the indexes: smallest, lowest address on ties, not
    /// pending on another stream).
    fn check(pool: &PoolState, rounded: u64, stream: Stream) {
        let by_size: BTreeSet<(u64, u64)> = pool.free.iter().map(|(&a, r)| (r.size, a)).collect();
        assert_eq!(pool.by_size, by_size);
        let pending: BTreeSet<u64> = pool
            .free
            .iter()
            .filter(|(_, r)| r.pending.is_some())
            .map(|(&a, _)| a)
            .collect();
        assert_eq!(pool.pending_at, pending);
        let own = (!stream.is_per_thread()).then(|| ClockKey::of(stream));
        let scanned = pool
            .free
            .iter()
            .filter(|(_, r)| r.size >= rounded && r.pending.map_or(true, |(k, _)| Some(k) == own))
            .min_by_key(|(&a, r)| (r.size, a))
            .map(|(&a, &r)| (a, r));
        assert_eq!(pool.best_fit(rounded, stream), scanned);
    }

    /// Random requests and frees on three streams, two of them held back by kernels in
    /// flight at times (so frees stay pending), checked after every step.
    #[test]
    fn the_size_index_finds_what_a_scan_finds() {
        let d = HostDevice::builder()
            .capacity(1 << 30)
            .simulated(true)
            .build()
            .unwrap();
        let streams = [Stream(11), Stream(12), Stream(13)];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut live: Vec<(u64, Stream)> = Vec::new();
        let mut kernels = Vec::new();
        let mut pending_seen = 0;
        for _ in 0..4000 {
            let stream = streams[(next() % 3) as usize];
            match next() % 10 {
                0 if kernels.len() < 4 => kernels.push(d.launch(stream, 0, 0)),
                1 if !kernels.is_empty() => d.finish(kernels.swap_remove(0)),
                2..=6 => {
                    let size = 1 + next() % (3 << 20);
                    live.push((d.alloc_async(size, stream).unwrap(), stream));
                }
                _ if !live.is_empty() => {
                    let (p, s) = live.swap_remove((next() % live.len() as u64) as usize);
                    d.free_async(p, s).unwrap();
                }
                _ => {}
            }
            let st = d.lock();
            check(&st.pool, 256 * (1 + next() % 8192), stream);
            pending_seen += usize::from(!st.pool.pending_at.is_empty());
        }
        assert!(
            pending_seen > 100,
            "frees held pending in {pending_seen} steps only"
        );
    }
}
