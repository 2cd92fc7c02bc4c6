//! The pure chunk manager behind [`super::BfcAllocator`]: XLA's best-fit-with-coalescing rules
//! over `u64` addresses, with no device and no I/O.
//!
//! * Memory comes in **regions** (`base`, `size`), each tiled exactly by **chunks**. Chunks
//!   live in a slab (`Vec`) and are linked to their neighbours by slab index (`prev`/`next`),
//!   only within a region, so nothing ever coalesces across regions. The metadata is kept
//!   here, outside the managed memory: GPU memory cannot hold headers.
//! * Free chunks sit in 21 **bins**: bin `b` holds sizes in `[256 << b, 256 << (b + 1))`,
//!   the last bin (20, 256 MiB and up) is open-ended. Each bin is ordered by
//!   `(size, address)`; for speed it is refined into 64 size classes with bitmaps of the
//!   non-empty ones ([`FreeIndex`]), which keeps that order and so XLA's choices exactly.
//! * **Best fit**: the smallest free chunk that fits, the lowest address among equal sizes —
//!   searched from the request's bin upward.
//! * **Split** iff the chunk is at least twice the request, or the leftover is at least
//!   128 MiB ([`MAX_INTERNAL_FRAGMENTATION`], XLA's `kMaxInternalFragmentation`); otherwise the
//!   whole chunk is handed out and its surplus counts as in use.
//! * **Coalesce**: a freed chunk merges at once with its free neighbours on both sides.
//! * **Alignment** above 256 B (XLA only supports 256): the search walks the candidates in
//!   best-fit order and takes the first whose aligned start still leaves room for the
//!   request; the bytes in front of the aligned start are split off as a free chunk.
//!
//! Every operation is `O(log n)` in the number of free chunks (in practice a few
//! instructions on a class of a handful of chunks), except an allocation with an
//! alignment above 256 B, which may scan candidates (`O(n log n)` at worst), and the report
//! and invariant helpers, which are linear.
#![deny(unsafe_code)]

use std::collections::BTreeMap;

use crate::report::{BinSummary, RegionMap};
use crate::strategy::bins::{bin_for_size, MIN_ALLOCATION};
use crate::strategy::free_index::{Entry, FreeIndex};
use crate::strategy::occupancy::{self, check_new_region, ChunkUse, RegionCheck, Tally};

/// A leftover at least this large is always split off (XLA's `kMaxInternalFragmentation`).
pub const MAX_INTERNAL_FRAGMENTATION: u64 = 128 << 20;

/// "No chunk" in a link or list head.
const NONE: u32 = u32::MAX;

/// What a slab slot holds (the low two bits of [`Chunk::tag`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum State {
    /// Unused slot, on the vacant list (linked through `next`).
    Vacant = 0,
    /// A free chunk, in its bin.
    Free = 1,
    /// A chunk handed out.
    InUse = 2,
}

/// Bits of [`Chunk::tag`] below the slack.
const STATE_BITS: u32 = 2;
/// The slack [`Chunk::tag`] records for a chunk in use whose slack does not fit in its 30
/// bits (≥ 1 GiB − 256 B): its request is then kept in [`Arena::spilled`]. Under XLA's split
/// rule a chunk is handed out whole only when the surplus is under 128 MiB
/// ([`MAX_INTERNAL_FRAGMENTATION`]), so with a request rounded up to 256 B the slack stays
/// below 128 MiB + 256 B and this never happens for bfc; it serves a caller of
/// [`Arena::allocate`] that reports a request far below the rounded size.
const SLACK_SPILLED: u32 = u32::MAX >> STATE_BITS;

/// One chunk: a contiguous piece of a region.
///
/// The record is what `free` reads of the chunk and of both its neighbours, at random slab
/// positions — with hundreds of thousands of chunks, a cache miss each. It is kept at 32
/// bytes, aligned to 32, so each read touches exactly one cache line (at 48 bytes, as with
/// a `u64` request and a separate state byte, half the records would straddle two): the
/// request is kept as the slack `size − requested` in 30 bits beside the state.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
struct Chunk {
    /// First byte. Invariant: a multiple of 256 (for a region base that is).
    addr: u64,
    /// Bytes. Invariant: a non-zero multiple of 256.
    size: u64,
    /// The chunk just below, in the same region, or `NONE` at the region's start.
    prev: u32,
    /// The chunk just above, in the same region, or `NONE` at the region's end. For a
    /// `Vacant` slot: the next vacant slot.
    next: u32,
    /// Bumped each time the chunk is handed out, so a stale token is refused.
    generation: u32,
    /// The [`State`] in the low [`STATE_BITS`] bits; above them the **slack** — for an
    /// `InUse` chunk `size − requested` (bytes the user did not ask for), or
    /// [`SLACK_SPILLED`] when that does not fit (the request is then in [`Arena::spilled`]).
    /// Invariant: the slack is 0 unless `InUse`; for an `InUse` chunk `requested <= size`.
    tag: u32,
}

impl Chunk {
    /// A slot holding `state`, with no slack.
    const fn blank(state: State) -> Chunk {
        Chunk {
            addr: 0,
            size: 0,
            prev: NONE,
            next: NONE,
            generation: 0,
            tag: state as u32,
        }
    }

    #[inline(always)]
    fn state(&self) -> State {
        match self.tag & ((1 << STATE_BITS) - 1) {
            0 => State::Vacant,
            1 => State::Free,
            _ => State::InUse,
        }
    }

    #[inline(always)]
    fn is(&self, state: State) -> bool {
        self.tag & ((1 << STATE_BITS) - 1) == state as u32
    }

    /// Sets the state; the slack becomes 0.
    #[inline(always)]
    fn set_state(&mut self, state: State) {
        self.tag = state as u32;
    }

    #[inline(always)]
    fn slack(&self) -> u32 {
        self.tag >> STATE_BITS
    }
}

// A record is 32 bytes, half a cache line, never straddling two: see `Chunk`.
const _: () = assert!(std::mem::size_of::<Chunk>() == 32);

/// A piece of memory the arena manages: `[base, base + size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// First byte.
    pub base: u64,
    /// Bytes.
    pub size: u64,
    /// The chunk at `base`.
    first: u32,
}

/// An allocation made by [`Arena::allocate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Address of the first byte (aligned as asked).
    pub addr: u64,
    /// Bytes of the chunk handed out (the rounded request, or more when not split).
    pub chunk_size: u64,
    /// What [`Arena::free`] needs: the chunk's slab index and generation.
    pub token: u64,
}

/// What [`Arena::free`] gave back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Freed {
    /// Bytes of the chunk (as counted in use).
    pub chunk_size: u64,
    /// Bytes the user had asked for.
    pub requested: u64,
}

/// The chunk manager: regions, chunks, bins. See the module docs for the rules.
///
/// The fields' doc comments state the invariants [`Arena::check_invariants`] verifies.
#[derive(Debug)]
pub struct Arena {
    /// The chunk slab. Invariant: every non-`Vacant` slot is reachable from exactly one
    /// region's `first` by `next` links; within a region the chunks are contiguous, in
    /// address order, their `prev`/`next` links agree, the first starts at the region's base,
    /// the last ends at its end, and no two neighbours are both `Free`.
    chunks: Vec<Chunk>,
    /// Head of the list of `Vacant` slots (linked through `next`), or `NONE`.
    /// Invariant: the list holds exactly the `Vacant` slots.
    vacant: u32,
    /// One bit per slot, set iff the slot's chunk is `InUse`: what [`Arena::free`] asks of
    /// the freed chunk's neighbours. A neighbour is never `Vacant`, so a clear bit means
    /// `Free`. With hundreds of thousands of chunks the neighbours' records are cache
    /// misses, taken after the freed chunk's own (their slots are in it); this map is an
    /// eighth of a byte per slot and stays in cache, so a free whose neighbours are both in
    /// use — nearly every free while the heap is full — reads no record but its own.
    /// Invariant: `in_use.len() == chunks.len().div_ceil(64)`, bit `i % 64` of word
    /// `i / 64` set iff slot `i` is `InUse`.
    in_use: Vec<u64>,
    /// Regions, in the order they were added. Invariant: they do not overlap.
    regions: Vec<Region>,
    /// Free chunks: XLA's bins refined into size classes (see [`FreeIndex`]). Invariant:
    /// holds exactly the `Free` chunks, each under its own size and address — hence each in
    /// its bin `bin_for_size(size)`.
    free: FreeIndex,
    /// Invariant: the sum of the sizes of the `InUse` chunks.
    bytes_in_use: u64,
    /// Invariant: the number of `InUse` chunks.
    live: usize,
    /// Invariant: the sum of the region sizes.
    pool_bytes: u64,
    /// The requests of the chunks in use whose slack does not fit in [`Chunk::tag`], by slab
    /// index (see [`SLACK_SPILLED`]; never used by bfc). Invariant: holds exactly the `InUse`
    /// chunks whose slack is `SLACK_SPILLED`, each with a request `r` such that
    /// `size − r >= SLACK_SPILLED`.
    spilled: BTreeMap<u32, u64>,
}

impl Default for Arena {
    fn default() -> Self {
        Self::new()
    }
}

impl Arena {
    /// An empty arena: no regions.
    pub fn new() -> Self {
        Arena {
            chunks: Vec::new(),
            vacant: NONE,
            in_use: Vec::new(),
            regions: Vec::new(),
            free: FreeIndex::new(),
            bytes_in_use: 0,
            live: 0,
            pool_bytes: 0,
            spilled: BTreeMap::new(),
        }
    }

    /// Adds the region `[base, base + size)` as one free chunk.
    ///
    /// # Errors
    /// A message when `base` or `size` is not a multiple of 256, `size` is 0, the range
    /// overflows or overlaps a region already added, or the slab is full.
    ///
    /// # Time complexity
    /// `O(regions + log n)`.
    pub fn add_region(&mut self, base: u64, size: u64) -> Result<(), String> {
        check_new_region(base, size, self.regions.iter().map(|r| (r.base, r.size)))?;
        let idx = self
            .new_slot(Chunk {
                addr: base,
                size,
                ..Chunk::blank(State::Free)
            })
            .ok_or_else(|| "the chunk table is full".to_string())?;
        self.insert_free(idx);
        self.regions.push(Region {
            base,
            size,
            first: idx,
        });
        self.pool_bytes += size;
        Ok(())
    }

    /// The regions, in the order they were added.
    pub fn regions(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.regions.iter().map(|r| (r.base, r.size))
    }

    /// Number of regions.
    pub fn region_count(&self) -> usize {
        self.regions.len()
    }

    /// The regions that are entirely one free chunk (nothing allocated in them).
    ///
    /// # Time complexity
    /// `O(regions)`.
    pub fn free_regions(&self) -> Vec<(u64, u64)> {
        self.regions
            .iter()
            .filter(|r| {
                let c = &self.chunks[r.first as usize];
                c.is(State::Free) && c.size == r.size
            })
            .map(|r| (r.base, r.size))
            .collect()
    }

    /// Removes the region at `base` if it is entirely one free chunk; true if removed.
    ///
    /// # Time complexity
    /// `O(regions + log n)`.
    pub fn remove_free_region(&mut self, base: u64) -> bool {
        let Some(pos) = self.regions.iter().position(|r| r.base == base) else {
            return false;
        };
        let r = self.regions[pos];
        let c = &self.chunks[r.first as usize];
        if !c.is(State::Free) || c.size != r.size {
            return false;
        }
        self.remove_free(r.first);
        self.release_slot(r.first);
        self.regions.remove(pos);
        self.pool_bytes -= r.size;
        true
    }

    /// Bytes of the chunks handed out.
    pub fn bytes_in_use(&self) -> u64 {
        self.bytes_in_use
    }

    /// Sum of the region sizes.
    pub fn pool_bytes(&self) -> u64 {
        self.pool_bytes
    }

    /// Number of chunks handed out.
    pub fn live_count(&self) -> usize {
        self.live
    }

    /// The largest free chunk (0 when none).
    ///
    /// # Time complexity
    /// `O(1)`.
    pub fn largest_free(&self) -> u64 {
        self.free.largest().map_or(0, |e| e.size)
    }

    /// Hands out a chunk for `rounded` bytes (a non-zero multiple of 256) at an address
    /// aligned to `alignment` (a power of two, at least 256); `requested` is what the user
    /// asked for, kept for reports. `None` when no free chunk fits.
    ///
    /// # Time complexity
    /// `O(log n)` for `alignment == 256`; otherwise `O(k log n)` for `k` candidates tried.
    ///
    /// # Panics
    /// When `requested > rounded`.
    #[inline(always)]
    pub fn allocate(&mut self, rounded: u64, alignment: u64, requested: u64) -> Option<Grant> {
        assert!(requested <= rounded, "{requested} B requested of {rounded}");
        debug_assert!(rounded > 0 && rounded % MIN_ALLOCATION == 0);
        debug_assert!(alignment.is_power_of_two() && alignment >= MIN_ALLOCATION);
        if alignment == MIN_ALLOCATION {
            // Every chunk starts on 256: no padding. The best fit is taken out of the index
            // in the same search that finds it, and only a split's tail goes back in.
            let Entry { size, addr: _, idx } = self.free.take_best_fit(rounded)?;
            // Without a slot for the tail the chunk is handed out whole: still correct.
            if splits(size, rounded) {
                if let Some(tail) = self.new_slot_vacant() {
                    self.split_into(idx, rounded, tail);
                    let t = &self.chunks[tail as usize];
                    self.free.insert(t.size, t.addr, tail);
                }
            }
            return Some(self.hand_out(idx, requested));
        }
        self.allocate_aligned(rounded, alignment, requested)
    }

    /// [`Arena::allocate`] for an alignment above 256 B.
    #[inline(never)]
    fn allocate_aligned(&mut self, rounded: u64, alignment: u64, requested: u64) -> Option<Grant> {
        let Entry {
            size,
            addr,
            mut idx,
        } = self.free.find(rounded, |e| {
            align_up(e.addr, alignment).is_some_and(|a| a - e.addr <= e.size - rounded)
        })?;
        let aligned = align_up(addr, alignment)?;
        let pad = aligned - addr;
        // The front padding stays free; it needs a second slot (taken before any change).
        let rest = if pad > 0 {
            Some(self.new_slot_vacant()?)
        } else {
            None
        };
        let after_pad = size - pad;
        // Without a slot for the tail the chunk is handed out whole: still correct.
        let tail = if splits(after_pad, rounded) {
            self.new_slot_vacant()
        } else {
            None
        };
        // The index entry of the chosen chunk is reused for the first free piece left over
        // (padding, else tail): one index update instead of two in the common cases.
        let mut entry = Some((size, addr));
        if let Some(rest) = rest {
            self.free.replace(size, addr, pad, addr, idx);
            entry = None;
            self.split_into(idx, pad, rest);
            idx = rest;
        }
        if let Some(tail) = tail {
            self.split_into(idx, rounded, tail);
            let t = &self.chunks[tail as usize];
            match entry.take() {
                Some((size, addr)) => {
                    let found = self.free.replace(size, addr, t.size, t.addr, tail);
                    debug_assert!(found);
                }
                None => self.free.insert(t.size, t.addr, tail),
            }
        }
        if let Some((size, addr)) = entry {
            self.free.remove(size, addr);
        }
        Some(self.hand_out(idx, requested))
    }

    /// Marks the unbinned chunk `idx` in use for `requested` bytes and makes its grant.
    #[inline(always)]
    fn hand_out(&mut self, idx: u32, requested: u64) -> Grant {
        let c = &mut self.chunks[idx as usize];
        let slack = c.size - requested;
        c.tag = if slack < u64::from(SLACK_SPILLED) {
            ((slack as u32) << STATE_BITS) | State::InUse as u32
        } else {
            (SLACK_SPILLED << STATE_BITS) | State::InUse as u32
        };
        c.generation = c.generation.wrapping_add(1);
        let grant = Grant {
            addr: c.addr,
            chunk_size: c.size,
            token: (u64::from(c.generation) << 32) | u64::from(idx),
        };
        self.set_in_use(idx, true);
        if slack >= u64::from(SLACK_SPILLED) {
            self.spill(idx, requested);
        }
        self.bytes_in_use += grant.chunk_size;
        self.live += 1;
        grant
    }

    /// Hands the chunk in use `token` at `addr` out again, for `requested` bytes, under a
    /// new generation (a stream-ordered free reused by its stream: the chunk never left the
    /// arena's books, but whoever held the old token must be refused from now on). `None`
    /// when the token does not name a chunk in use at `addr`, or the chunk cannot hold
    /// `requested`.
    ///
    /// # Time complexity
    /// `O(1)` (`O(log n)` when a request's slack is kept aside).
    pub fn hand_out_again(&mut self, token: u64, addr: u64, requested: u64) -> Option<Grant> {
        if !self.is_in_use(token, addr) {
            return None;
        }
        let idx = token as u32;
        if requested > self.chunks[idx as usize].size {
            return None;
        }
        if self.chunks[idx as usize].slack() == SLACK_SPILLED {
            self.unspill(idx);
        }
        let grant = self.hand_out(idx, requested);
        // `hand_out` counts a chunk that was not in use: this one was, and still is.
        self.bytes_in_use -= grant.chunk_size;
        self.live -= 1;
        Some(grant)
    }

    /// Every chunk in use, as the [`Grant`] that handed it out (its token, address and
    /// chunk size), in slot order: what a caller that keeps no per-chunk books of its own
    /// until it needs them (bfc's single-stream mode) reads to start them.
    ///
    /// # Time complexity
    /// `O(slots)`.
    pub fn in_use(&self) -> impl Iterator<Item = Grant> + '_ {
        self.chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is(State::InUse))
            .map(|(idx, c)| Grant {
                addr: c.addr,
                chunk_size: c.size,
                token: (u64::from(c.generation) << 32) | idx as u64,
            })
    }

    /// The size of the chunk in use that `token` names at `addr`.
    ///
    /// # Time complexity
    /// `O(1)`.
    pub fn in_use_size(&self, token: u64, addr: u64) -> Option<u64> {
        self.is_in_use(token, addr)
            .then(|| self.chunks[token as u32 as usize].size)
    }

    /// True when `token` names a chunk in use at `addr`.
    ///
    /// # Time complexity
    /// `O(1)`.
    pub fn is_in_use(&self, token: u64, addr: u64) -> bool {
        self.chunks.get(token as u32 as usize).is_some_and(|c| {
            c.is(State::InUse) && c.generation == (token >> 32) as u32 && c.addr == addr
        })
    }

    /// Frees the chunk `token` (from a [`Grant`]) at `addr`, coalescing it with free
    /// neighbours. `None` when the token does not name a chunk in use at `addr` (stale,
    /// forged, or freed already).
    ///
    /// # Time complexity
    /// `O(log n)`.
    #[inline]
    pub fn free(&mut self, token: u64, addr: u64) -> Option<Freed> {
        let idx = token as u32;
        let generation = (token >> 32) as u32;
        let c = self.chunks.get_mut(idx as usize)?;
        if !c.is(State::InUse) || c.generation != generation || c.addr != addr {
            return None;
        }
        let slack = c.slack();
        let mut freed = Freed {
            chunk_size: c.size,
            requested: c.size - u64::from(slack),
        };
        c.set_state(State::Free);
        let (prev, next) = (c.prev, c.next);
        self.set_in_use(idx, false);
        if slack == SLACK_SPILLED {
            freed.requested = self.unspill(idx);
        }
        self.bytes_in_use -= freed.chunk_size;
        self.live -= 1;
        // From the map, not the records (see `in_use`): a neighbour is `Free` or `InUse`.
        let next_free = next != NONE && !self.is_in_use_slot(next);
        let prev_free = prev != NONE && !self.is_in_use_slot(prev);
        // A free neighbour's index entry is updated in place to the merged chunk.
        match (prev_free, next_free) {
            (false, false) => self.free.insert(freed.chunk_size, addr, idx),
            (false, true) => {
                let n = &self.chunks[next as usize];
                let merged = freed.chunk_size + n.size;
                self.free.replace(n.size, n.addr, merged, addr, next);
                self.merge_into_next(idx, prev, next);
            }
            (true, next_free) => {
                let mut merged = freed.chunk_size;
                if next_free {
                    let n = &self.chunks[next as usize];
                    merged += n.size;
                    self.free.remove(n.size, n.addr);
                    self.merge_next(idx);
                }
                let p = &self.chunks[prev as usize];
                self.free
                    .replace(p.size, p.addr, p.size + merged, p.addr, prev);
                self.merge_next(prev);
            }
        }
        Some(freed)
    }

    /// Per-bin summary of every chunk, free and in use, classed by size as the bins are
    /// (XLA's `Bin (256): Total Chunks: …` lines); non-empty classes only.
    ///
    /// # Time complexity
    /// `O(chunks)`.
    pub fn bin_summaries(&self) -> Vec<BinSummary> {
        occupancy::bin_summaries(
            (0..self.chunks.len() as u32)
                .filter(|&idx| !self.chunks[idx as usize].is(State::Vacant))
                .map(|idx| self.usage(idx)),
        )
    }

    /// A [`MAP_CELLS`](crate::report::MAP_CELLS)-character occupancy map of every region:
    /// cell `i` covers `[base + size·i/100, base + size·(i+1)/100)` and shows the class with
    /// the most bytes in it — `*` requested bytes, `x` slack (bytes of a chunk in use beyond
    /// the request: rounding and unsplit remainders), `_` free — ties going to `*`, then
    /// `x`, then `_`.
    ///
    /// # Time complexity
    /// `O(chunks + 100 · regions)`.
    pub fn region_maps(&self) -> Vec<RegionMap> {
        self.regions
            .iter()
            .map(|r| {
                let chunks = std::iter::successors(Some(r.first), |&idx| {
                    let next = self.chunks[idx as usize].next;
                    (next != NONE).then_some(next)
                });
                occupancy::region_map(r.base, r.size, chunks.map(|idx| self.usage(idx)))
            })
            .collect()
    }

    /// Checks every invariant stated on the fields, describing the first one broken.
    ///
    /// # Errors
    /// A description of the broken invariant.
    ///
    /// # Time complexity
    /// `O(chunks log n + regions²)`.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut reached = 0usize;
        let mut tally = Tally::default();
        let mut pool = 0u64;
        for (ri, r) in self.regions.iter().enumerate() {
            pool += r.size;
            for other in &self.regions[ri + 1..] {
                if r.base < other.base + other.size && other.base < r.base + r.size {
                    return Err(format!(
                        "regions {:#x}+{} and {:#x}+{} overlap",
                        r.base, r.size, other.base, other.size
                    ));
                }
            }
            let mut region = RegionCheck::new(r.base, r.size);
            let mut prev = NONE;
            let mut idx = r.first;
            while idx != NONE {
                let c = self
                    .chunks
                    .get(idx as usize)
                    .ok_or_else(|| format!("region {:#x}: link to missing slot {idx}", r.base))?;
                reached += 1;
                if reached > self.chunks.len() {
                    return Err(format!("region {:#x}: the chunk list has a cycle", r.base));
                }
                let at = format!("region {:#x}, chunk {idx} at {:#x}", r.base, c.addr);
                if c.is(State::Vacant) {
                    return Err(format!("{at}: a vacant slot is linked into the region"));
                }
                if c.prev != prev {
                    return Err(format!("{at}: prev link {} should be {prev}", c.prev));
                }
                if c.is(State::InUse) {
                    let spill = self.spilled.get(&idx);
                    match (c.slack() == SLACK_SPILLED, spill) {
                        (true, Some(&r))
                            if r <= c.size && c.size - r >= u64::from(SLACK_SPILLED) => {}
                        (false, None) if u64::from(c.slack()) <= c.size => {}
                        _ => {
                            return Err(format!(
                                "{at}: slack {} of {} B, spilled request {spill:?}",
                                c.slack(),
                                c.size
                            ))
                        }
                    }
                }
                region.chunk(&at, self.usage(idx), &mut tally)?;
                if c.is(State::Free) {
                    let b = bin_for_size(c.size);
                    if self.free.get(c.size, c.addr) != Some(idx) {
                        return Err(format!(
                            "{at}: free chunk of {} missing from bin {b}",
                            c.size
                        ));
                    }
                }
                prev = idx;
                idx = c.next;
            }
            region.finish()?;
        }
        let Tally {
            in_use,
            live,
            free: free_chunks,
            largest_free: largest,
        } = tally;
        let mut vacant = 0usize;
        let mut v = self.vacant;
        while v != NONE {
            let c = self
                .chunks
                .get(v as usize)
                .ok_or_else(|| format!("vacant list links to missing slot {v}"))?;
            if !c.is(State::Vacant) {
                return Err(format!("slot {v} is on the vacant list but not vacant"));
            }
            vacant += 1;
            if vacant > self.chunks.len() {
                return Err("the vacant list has a cycle".into());
            }
            v = c.next;
        }
        if let Some((idx, c)) = self
            .chunks
            .iter()
            .enumerate()
            .find(|(_, c)| c.slack() != 0 && !c.is(State::InUse))
        {
            return Err(format!(
                "slot {idx} ({:?}) records slack {}",
                c.state(),
                c.slack()
            ));
        }
        let spilled_in_use = self
            .spilled
            .keys()
            .filter(|&&idx| {
                self.chunks
                    .get(idx as usize)
                    .is_some_and(|c| c.is(State::InUse))
            })
            .count();
        if spilled_in_use != self.spilled.len() {
            return Err(format!(
                "{} spilled requests, {spilled_in_use} of them of chunks in use",
                self.spilled.len()
            ));
        }
        if self.in_use.len() != self.chunks.len().div_ceil(64) {
            return Err(format!(
                "the in-use map has {} words for {} slots",
                self.in_use.len(),
                self.chunks.len()
            ));
        }
        if let Some(idx) = (0..self.in_use.len() * 64).find(|&i| {
            let bit = self.in_use[i / 64] & (1 << (i % 64)) != 0;
            bit != self.chunks.get(i).is_some_and(|c| c.is(State::InUse))
        }) {
            return Err(format!("the in-use map disagrees with slot {idx}"));
        }
        if reached + vacant != self.chunks.len() {
            return Err(format!(
                "{} slots, but {reached} reachable from regions and {vacant} vacant",
                self.chunks.len()
            ));
        }
        self.free.check()?;
        if self.free.len() != free_chunks {
            return Err(format!(
                "the bins hold {} chunks, the regions {free_chunks} free ones",
                self.free.len()
            ));
        }
        if in_use != self.bytes_in_use {
            return Err(format!(
                "chunks in use sum to {in_use}, bytes_in_use = {}",
                self.bytes_in_use
            ));
        }
        if live != self.live {
            return Err(format!("{live} chunks in use, live = {}", self.live));
        }
        if pool != self.pool_bytes {
            return Err(format!(
                "regions sum to {pool}, pool_bytes = {}",
                self.pool_bytes
            ));
        }
        if largest != self.largest_free() {
            return Err(format!(
                "largest free chunk is {largest}, reported {}",
                self.largest_free()
            ));
        }
        Ok(())
    }

    // ---- internals ----

    /// The chunk `idx` as an out-of-memory report sees it.
    fn usage(&self, idx: u32) -> ChunkUse {
        let c = &self.chunks[idx as usize];
        let requested = match c.slack() {
            SLACK_SPILLED => self.spilled.get(&idx).copied().unwrap_or(0),
            slack => c.size - u64::from(slack),
        };
        ChunkUse {
            addr: c.addr,
            size: c.size,
            requested: c.is(State::InUse).then_some(requested),
        }
    }

    /// Keeps the request of chunk `idx`, whose slack does not fit its record.
    #[cold]
    #[inline(never)]
    fn spill(&mut self, idx: u32, requested: u64) {
        self.spilled.insert(idx, requested);
    }

    /// Takes back the request [`Arena::spill`] kept (0 if none: a broken invariant that
    /// `check_invariants` reports).
    #[cold]
    #[inline(never)]
    fn unspill(&mut self, idx: u32) -> u64 {
        self.spilled.remove(&idx).unwrap_or(0)
    }

    fn insert_free(&mut self, idx: u32) {
        let c = &mut self.chunks[idx as usize];
        c.set_state(State::Free);
        self.free.insert(c.size, c.addr, idx);
    }

    fn remove_free(&mut self, idx: u32) {
        let c = &self.chunks[idx as usize];
        self.free.remove(c.size, c.addr);
    }

    /// Splits chunk `idx` after `at` bytes; the upper part goes into the vacant slot `new`
    /// (same state as `idx`, not binned).
    #[inline]
    fn split_into(&mut self, idx: u32, at: u64, new: u32) {
        let generation = self.chunks[new as usize].generation;
        let c = &mut self.chunks[idx as usize];
        let upper = Chunk {
            addr: c.addr + at,
            size: c.size - at,
            prev: idx,
            next: c.next,
            generation,
            tag: State::Free as u32,
        };
        c.size = at;
        c.next = new;
        if upper.next != NONE {
            self.chunks[upper.next as usize].prev = new;
        }
        self.chunks[new as usize] = upper;
    }

    /// Merges `idx`'s next neighbour (unbinned) into `idx` and frees its slot.
    #[inline]
    fn merge_next(&mut self, idx: u32) {
        let next = self.chunks[idx as usize].next;
        let (size, after) = {
            let n = &self.chunks[next as usize];
            (n.size, n.next)
        };
        let c = &mut self.chunks[idx as usize];
        c.size += size;
        c.next = after;
        if after != NONE {
            self.chunks[after as usize].prev = idx;
        }
        self.release_slot(next);
    }

    /// Merges chunk `idx` (with neighbours `prev` and `next`) into its next neighbour
    /// `next` (unbinned), which keeps its slot, and frees `idx`'s slot. Where
    /// [`Arena::merge_next`] on `idx` would relink the chunk after `next` (one more record
    /// to load, at random with many chunks), this relinks `prev`, whose record the caller
    /// has just read; when `idx` starts its region, the region's first chunk becomes `next`.
    #[inline]
    fn merge_into_next(&mut self, idx: u32, prev: u32, next: u32) {
        let (addr, size) = {
            let c = &self.chunks[idx as usize];
            (c.addr, c.size)
        };
        let n = &mut self.chunks[next as usize];
        n.addr = addr;
        n.size += size;
        n.prev = prev;
        if prev != NONE {
            self.chunks[prev as usize].next = next;
        } else {
            self.first_moved(idx, next);
        }
        self.release_slot(idx);
    }

    /// The region whose first chunk was `from` starts with chunk `to` now.
    #[cold]
    #[inline(never)]
    fn first_moved(&mut self, from: u32, to: u32) {
        let r = self.regions.iter_mut().find(|r| r.first == from);
        debug_assert!(r.is_some(), "chunk {from} starts no region");
        if let Some(r) = r {
            r.first = to;
        }
    }

    /// Takes a vacant slot (reusing one, or growing the slab), or `None` when the slab is full.
    #[inline]
    fn new_slot_vacant(&mut self) -> Option<u32> {
        if self.vacant != NONE {
            let idx = self.vacant;
            self.vacant = self.chunks[idx as usize].next;
            // Marked Free so the list stays consistent until `split_into` overwrites it.
            self.chunks[idx as usize].set_state(State::Free);
            self.chunks[idx as usize].next = NONE;
            return Some(idx);
        }
        let idx = u32::try_from(self.chunks.len())
            .ok()
            .filter(|&i| i != NONE)?;
        self.chunks.push(Chunk::blank(State::Free));
        if self.in_use.len() * 64 < self.chunks.len() {
            self.in_use.push(0);
        }
        Some(idx)
    }

    /// Bit `idx` of [`Arena::in_use`] (true past its end, which the invariant rules out:
    /// a chunk taken for in use merges with nothing). Read through `get`, as
    /// [`Arena::set_in_use`] writes: an index and its panic path cost the 4 MiB churn, whose
    /// records are in cache anyway, a few percent.
    #[inline(always)]
    fn is_in_use_slot(&self, idx: u32) -> bool {
        self.in_use
            .get(idx as usize / 64)
            .map_or(true, |w| w & (1 << (idx % 64)) != 0)
    }

    /// Sets bit `idx` of [`Arena::in_use`] to `on`.
    #[inline(always)]
    fn set_in_use(&mut self, idx: u32, on: bool) {
        if let Some(w) = self.in_use.get_mut(idx as usize / 64) {
            let bit = 1 << (idx % 64);
            *w = (*w & !bit) | (u64::from(on) << (idx % 64));
        }
    }

    fn new_slot(&mut self, chunk: Chunk) -> Option<u32> {
        let idx = self.new_slot_vacant()?;
        let generation = self.chunks[idx as usize].generation;
        self.chunks[idx as usize] = Chunk {
            generation,
            ..chunk
        };
        Some(idx)
    }

    #[inline]
    fn release_slot(&mut self, idx: u32) {
        let c = &mut self.chunks[idx as usize];
        c.set_state(State::Vacant);
        c.prev = NONE;
        c.next = self.vacant;
        self.vacant = idx;
    }
}

/// XLA's split rule: a free chunk of `size` bytes serving `rounded` is split iff it is at
/// least twice the request, or the leftover is at least [`MAX_INTERNAL_FRAGMENTATION`].
#[inline(always)]
fn splits(size: u64, rounded: u64) -> bool {
    rounded.checked_mul(2).is_some_and(|twice| size >= twice)
        || size - rounded >= MAX_INTERNAL_FRAGMENTATION
}

/// `addr` rounded up to `alignment` (a power of two); `None` on overflow.
fn align_up(addr: u64, alignment: u64) -> Option<u64> {
    addr.checked_add(alignment - 1)
        .map(|a| a & !(alignment - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::MAP_CELLS;

    const MIB: u64 = 1 << 20;

    fn arena(regions: &[(u64, u64)]) -> Arena {
        let mut a = Arena::new();
        for &(base, size) in regions {
            a.add_region(base, size).unwrap();
        }
        a.check_invariants().unwrap();
        a
    }

    #[test]
    fn a_free_merging_into_its_next_neighbour_relinks_and_keeps_the_region_start() {
        let mut a = arena(&[(0, MIB), (4 * MIB, MIB)]);
        let x = a.allocate(256 << 10, 256, 256 << 10).unwrap();
        let y = a.allocate(256 << 10, 256, 1).unwrap();
        assert_eq!((x.addr, y.addr), (0, 256 << 10));
        // `y`'s next neighbour is free, its previous one (`x`) in use.
        a.free(y.token, y.addr).unwrap();
        a.check_invariants().unwrap();
        // `x` starts region 0 and its next neighbour is free: the region starts with that
        // neighbour's slot now.
        a.free(x.token, x.addr).unwrap();
        a.check_invariants().unwrap();
        assert_eq!(a.free_regions(), [(0, MIB), (4 * MIB, MIB)]);
        assert_eq!(a.largest_free(), MIB);
        assert!(a.remove_free_region(0));
        a.check_invariants().unwrap();
        let z = a.allocate(MIB, 256, MIB).unwrap();
        assert_eq!(z.addr, 4 * MIB);
    }

    fn alloc(a: &mut Arena, bytes: u64) -> Grant {
        let g = a.allocate(bytes, 256, bytes).unwrap();
        a.check_invariants().unwrap();
        g
    }

    fn free(a: &mut Arena, g: Grant) {
        a.free(g.token, g.addr).unwrap();
        a.check_invariants().unwrap();
    }

    /// The in-use map is what `free` reads of a neighbour: frees beside free and in-use
    /// neighbours keep it in step with the records, and a bit flipped either way, or a
    /// word missing, is named by the invariant check.
    #[test]
    fn the_in_use_map_follows_the_records_and_is_checked() {
        let mut a = arena(&[(0, 100 * 256)]);
        let g: Vec<Grant> = (0..70).map(|_| alloc(&mut a, 256)).collect();
        // 70 slots and the tail's: a second word of the map.
        assert_eq!(a.in_use.len(), 2);
        for i in [1, 3, 2, 68, 66, 67, 0] {
            free(&mut a, g[i]);
        }
        let intact = a.in_use.clone();
        for (word, bit) in [(0, 0), (0, 5), (1, 3), (1, 63)] {
            a.in_use[word] ^= 1 << bit;
            let err = a.check_invariants().unwrap_err();
            assert!(err.contains("in-use map disagrees"), "{err}");
            a.in_use[word] ^= 1 << bit;
        }
        a.in_use.pop();
        let err = a.check_invariants().unwrap_err();
        assert!(err.contains("in-use map has 1 words"), "{err}");
        a.in_use = intact;
        a.check_invariants().unwrap();
        for i in (4..66).chain([69]) {
            free(&mut a, g[i]);
        }
        assert_eq!(a.in_use, [0, 0]);
    }

    #[test]
    fn split_rules() {
        // 300 MiB chunk, 200 MiB request: leftover 100 MiB < 128 MiB and 300 < 400: whole.
        let mut a = arena(&[(0x1000_0000, 300 * MIB)]);
        let g = alloc(&mut a, 200 * MIB);
        assert_eq!(g.chunk_size, 300 * MIB);
        assert_eq!(a.bytes_in_use(), 300 * MIB);
        // 400 MiB: twice the request, split.
        let mut a = arena(&[(0x1000_0000, 400 * MIB)]);
        assert_eq!(alloc(&mut a, 200 * MIB).chunk_size, 200 * MIB);
        assert_eq!(a.largest_free(), 200 * MIB);
        // 1 GiB for 700 MiB: leftover 324 MiB ≥ 128 MiB, split.
        let mut a = arena(&[(0x1000_0000, 1024 * MIB)]);
        assert_eq!(alloc(&mut a, 700 * MIB).chunk_size, 700 * MIB);
        assert_eq!(a.largest_free(), 324 * MIB);
        // Small: 768 for 512 is kept whole (256 slack), 1024 for 512 split.
        let mut a = arena(&[(0, 768)]);
        assert_eq!(alloc(&mut a, 512).chunk_size, 768);
        let mut a = arena(&[(0, 1024)]);
        assert_eq!(alloc(&mut a, 512).chunk_size, 512);
    }

    #[test]
    fn best_fit_then_lowest_address() {
        // Carve free holes of 1024 @A, 512 @B, 512 @C, 2048 @D separated by live chunks.
        let mut a = arena(&[(0, 64 * 1024)]);
        let sizes = [1024, 256, 512, 256, 512, 256, 2048, 256];
        let grants: Vec<Grant> = sizes.iter().map(|&s| alloc(&mut a, s)).collect();
        for i in [0, 2, 4, 6] {
            free(&mut a, grants[i]);
        }
        // 512 → the lower of the two 512 holes.
        let g = alloc(&mut a, 512);
        assert_eq!(g.addr, grants[2].addr);
        let g2 = alloc(&mut a, 512);
        assert_eq!(g2.addr, grants[4].addr);
        // 768 → the 1024 hole (smallest that fits), kept whole (1024 < 1536).
        let g3 = alloc(&mut a, 768);
        assert_eq!((g3.addr, g3.chunk_size), (grants[0].addr, 1024));
        // 1024 → the 2048 hole, split (2048 ≥ 2 × 1024).
        let g4 = alloc(&mut a, 1024);
        assert_eq!((g4.addr, g4.chunk_size), (grants[6].addr, 1024));
    }

    #[test]
    fn coalesces_both_sides_never_across_regions() {
        let mut a = arena(&[(0, 4096), (4096, 4096)]);
        let x: Vec<Grant> = (0..4).map(|_| alloc(&mut a, 1024)).collect();
        assert!(x.iter().all(|g| g.addr < 4096));
        free(&mut a, x[0]);
        free(&mut a, x[2]);
        assert_eq!(a.largest_free(), 4096);
        free(&mut a, x[1]); // both sides
        assert_eq!(a.largest_free(), 4096);
        free(&mut a, x[3]);
        assert_eq!(a.free_regions(), vec![(0, 4096), (4096, 4096)]);
        assert_eq!(a.largest_free(), 4096);
    }

    #[test]
    fn large_alignment_splits_off_the_front() {
        let mut a = arena(&[(0x1_0100, 64 * 1024)]);
        let g = a.allocate(256, 4096, 100).unwrap();
        a.check_invariants().unwrap();
        assert_eq!(g.addr % 4096, 0);
        assert_eq!(g.addr, 0x1_1000);
        // The front padding is free and reusable.
        let h = a.allocate(256, 256, 256).unwrap();
        assert_eq!(h.addr, 0x1_0100);
        // An alignment no chunk can honour.
        assert!(a.allocate(256, 1 << 40, 1).is_none());
        a.check_invariants().unwrap();
    }

    #[test]
    fn stale_and_forged_tokens_are_refused() {
        let mut a = arena(&[(0, 1024)]);
        let g = alloc(&mut a, 1024);
        free(&mut a, g);
        assert!(a.free(g.token, g.addr).is_none());
        let g2 = alloc(&mut a, 1024);
        assert_eq!(g2.addr, g.addr);
        assert!(a.free(g.token, g.addr).is_none(), "old generation");
        assert!(a.free(g2.token, g2.addr + 256).is_none(), "wrong address");
        assert!(a.free(u64::from(u32::MAX - 1), 0).is_none(), "no such slot");
        free(&mut a, g2);
    }

    #[test]
    fn regions_are_removed_only_when_free() {
        let mut a = arena(&[(0, 1024), (1 << 20, 2048)]);
        let g = alloc(&mut a, 2048);
        assert_eq!(a.free_regions(), vec![(0, 1024)]);
        assert!(!a.remove_free_region(1 << 20));
        assert!(a.remove_free_region(0));
        a.check_invariants().unwrap();
        assert_eq!(a.pool_bytes(), 2048);
        free(&mut a, g);
        assert!(a.remove_free_region(1 << 20));
        assert_eq!((a.pool_bytes(), a.region_count()), (0, 0));
        a.check_invariants().unwrap();
        assert!(a.add_region(100, 256).is_err());
        assert!(a.add_region(0, 0).is_err());
        a.add_region(0, 4096).unwrap();
        assert!(a.add_region(2048, 4096).is_err());
    }

    /// The request is kept exactly whatever its slack: in the record's 30 bits up to
    /// `SLACK_SPILLED − 1` bytes, beside it from there on.
    #[test]
    fn requests_are_kept_exactly_whatever_the_slack() {
        const GIB: u64 = 1 << 30;
        let spilled = u64::from(SLACK_SPILLED);
        // (name, rounded, requested, spilled)
        let cases = [
            ("exact", 2 * GIB, 2 * GIB, false),
            ("rounding slack", 256, 1, false),
            (
                "largest slack in the record",
                2 * GIB,
                2 * GIB - (spilled - 1),
                false,
            ),
            ("smallest spilled slack", 2 * GIB, 2 * GIB - spilled, true),
            ("nothing of 2 GiB requested", 2 * GIB, 0, true),
        ];
        for (name, rounded, requested, spills) in cases {
            let mut a = arena(&[(0, 4 * GIB)]);
            let keep = alloc(&mut a, 256);
            let g = a.allocate(rounded, 256, requested).unwrap();
            a.check_invariants().unwrap();
            assert_eq!(a.spilled.len(), usize::from(spills), "{name}");
            let in_use: u64 = a
                .bin_summaries()
                .iter()
                .map(|b| b.requested_bytes_in_use)
                .sum();
            assert_eq!(in_use, 256 + requested, "{name}: requests in the summaries");
            let freed = a.free(g.token, g.addr).unwrap();
            a.check_invariants().unwrap();
            assert_eq!(
                (freed.chunk_size, freed.requested),
                (rounded, requested),
                "{name}"
            );
            assert!(a.spilled.is_empty(), "{name}: spill left behind");
            free(&mut a, keep);
        }
    }

    #[test]
    fn a_request_above_the_rounded_size_is_refused() {
        let mut a = arena(&[(0, 4096)]);
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.allocate(256, 256, 257)));
        assert!(result.is_err());
    }

    #[test]
    fn maps_and_bins() {
        let mut a = arena(&[(0, 100 * 1024)]);
        // 10 KiB requested exactly, then 10 KiB chunk with 2.5 KiB requested... kept whole:
        let g1 = a.allocate(10 * 1024, 256, 10 * 1024).unwrap();
        let _g2 = a.allocate(10 * 1024, 256, 2560).unwrap();
        let map = &a.region_maps()[0].map;
        assert_eq!(map.chars().count(), MAP_CELLS);
        assert_eq!(&map[..10], "**********");
        assert_eq!(&map[10..20], "***xxxxxxx");
        assert!(map[20..].chars().all(|c| c == '_'));
        let bins = a.bin_summaries();
        // Two 10 KiB chunks (bin 5) and an 80 KiB free chunk (bin 8).
        assert_eq!(bins.len(), 2);
        assert_eq!(
            (bins[0].index, bins[0].total_chunks, bins[0].chunks_in_use),
            (5, 2, 2)
        );
        assert_eq!(bins[0].requested_bytes_in_use, 10 * 1024 + 2560);
        assert_eq!(
            (bins[1].index, bins[1].total_chunks, bins[1].chunks_in_use),
            (8, 1, 0)
        );
        free(&mut a, g1);
        assert!(a.region_maps()[0].map.starts_with("__________***"));
    }
}
