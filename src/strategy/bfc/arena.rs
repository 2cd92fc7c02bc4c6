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

use crate::report::{BinSummary, RegionMap};

use super::free_index::{Entry, FreeIndex};
use crate::strategy::occupancy::{self, check_new_region, ChunkUse, RegionCheck, Tally};

/// Every request is rounded up to a multiple of this, and every chunk starts on it.
pub const MIN_ALLOCATION: u64 = 256;
/// Number of bins (XLA's `kNumBins`).
pub const NUM_BINS: usize = 21;
/// A leftover at least this large is always split off (XLA's `kMaxInternalFragmentation`).
pub const MAX_INTERNAL_FRAGMENTATION: u64 = 128 << 20;
/// Characters per region in an occupancy map.
pub const MAP_CELLS: usize = 100;

/// "No chunk" in a link or list head.
const NONE: u32 = u32::MAX;

/// The bin that holds free chunks of `size` bytes: `floor(log2(size / 256))`, at most 20.
///
/// # Time complexity
/// `O(1)`.
pub fn bin_for_size(size: u64) -> usize {
    let units = size.max(MIN_ALLOCATION) / MIN_ALLOCATION;
    ((63 - units.leading_zeros()) as usize).min(NUM_BINS - 1)
}

/// The smallest chunk size bin `bin` holds (`256 << bin`).
pub fn bin_min_size(bin: usize) -> u64 {
    MIN_ALLOCATION << bin
}

/// What a slab slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Unused slot, on the vacant list (linked through `next`).
    Vacant,
    /// A free chunk, in its bin.
    Free,
    /// A chunk handed out.
    InUse,
}

/// One chunk: a contiguous piece of a region.
#[derive(Debug, Clone)]
struct Chunk {
    /// First byte. Invariant: a multiple of 256 (for a region base that is).
    addr: u64,
    /// Bytes. Invariant: a non-zero multiple of 256.
    size: u64,
    /// Bytes the user asked for (`InUse` only; 0 otherwise). Invariant: `requested <= size`.
    requested: u64,
    /// The chunk just below, in the same region, or `NONE` at the region's start.
    prev: u32,
    /// The chunk just above, in the same region, or `NONE` at the region's end. For a
    /// `Vacant` slot: the next vacant slot.
    next: u32,
    /// Bumped each time the chunk is handed out, so a stale token is refused.
    generation: u32,
    state: State,
}

impl Chunk {
    /// The chunk as an out-of-memory report sees it.
    fn usage(&self) -> ChunkUse {
        ChunkUse {
            addr: self.addr,
            size: self.size,
            requested: (self.state == State::InUse).then_some(self.requested),
        }
    }
}

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
            regions: Vec::new(),
            free: FreeIndex::new(),
            bytes_in_use: 0,
            live: 0,
            pool_bytes: 0,
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
                requested: 0,
                prev: NONE,
                next: NONE,
                generation: 0,
                state: State::Free,
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
                c.state == State::Free && c.size == r.size
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
        if c.state != State::Free || c.size != r.size {
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
    pub fn allocate(&mut self, rounded: u64, alignment: u64, requested: u64) -> Option<Grant> {
        debug_assert!(rounded > 0 && rounded % MIN_ALLOCATION == 0);
        debug_assert!(alignment.is_power_of_two() && alignment >= MIN_ALLOCATION);
        let Entry {
            size,
            addr,
            mut idx,
        } = self.find(rounded, alignment)?;
        let aligned = align_up(addr, alignment)?;
        let pad = aligned - addr;
        // The front padding stays free; it needs a second slot (taken before any change).
        let rest = if pad > 0 {
            Some(self.new_slot_vacant()?)
        } else {
            None
        };
        let after_pad = size - pad;
        let split = rounded
            .checked_mul(2)
            .is_some_and(|twice| after_pad >= twice)
            || after_pad - rounded >= MAX_INTERNAL_FRAGMENTATION;
        // Without a slot for the tail the chunk is handed out whole: still correct.
        let tail = if split { self.new_slot_vacant() } else { None };
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
        let c = &mut self.chunks[idx as usize];
        c.state = State::InUse;
        c.requested = requested;
        c.generation = c.generation.wrapping_add(1);
        self.bytes_in_use += c.size;
        self.live += 1;
        Some(Grant {
            addr: c.addr,
            chunk_size: c.size,
            token: (u64::from(c.generation) << 32) | u64::from(idx),
        })
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
            .filter(|(_, c)| c.state == State::InUse)
            .map(|(idx, c)| Grant {
                addr: c.addr,
                chunk_size: c.size,
                token: (u64::from(c.generation) << 32) | idx as u64,
            })
    }

    /// True when `token` names a chunk in use at `addr`.
    ///
    /// # Time complexity
    /// `O(1)`.
    pub fn is_in_use(&self, token: u64, addr: u64) -> bool {
        self.chunks.get(token as u32 as usize).is_some_and(|c| {
            c.state == State::InUse && c.generation == (token >> 32) as u32 && c.addr == addr
        })
    }

    /// Frees the chunk `token` (from a [`Grant`]) at `addr`, coalescing it with free
    /// neighbours. `None` when the token does not name a chunk in use at `addr` (stale,
    /// forged, or freed already).
    ///
    /// # Time complexity
    /// `O(log n)`.
    pub fn free(&mut self, token: u64, addr: u64) -> Option<Freed> {
        let idx = token as u32;
        let generation = (token >> 32) as u32;
        let c = self.chunks.get_mut(idx as usize)?;
        if c.state != State::InUse || c.generation != generation || c.addr != addr {
            return None;
        }
        let freed = Freed {
            chunk_size: c.size,
            requested: c.requested,
        };
        c.state = State::Free;
        c.requested = 0;
        let (prev, next) = (c.prev, c.next);
        self.bytes_in_use -= freed.chunk_size;
        self.live -= 1;
        let next_free = next != NONE && self.chunks[next as usize].state == State::Free;
        let prev_free = prev != NONE && self.chunks[prev as usize].state == State::Free;
        // A free neighbour's index entry is updated in place to the merged chunk.
        match (prev_free, next_free) {
            (false, false) => self.free.insert(freed.chunk_size, addr, idx),
            (false, true) => {
                let n = &self.chunks[next as usize];
                let merged = freed.chunk_size + n.size;
                self.free.replace(n.size, n.addr, merged, addr, idx);
                self.merge_next(idx);
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
            self.chunks
                .iter()
                .filter(|c| c.state != State::Vacant)
                .map(Chunk::usage),
        )
    }

    /// A [`MAP_CELLS`]-character occupancy map of every region: cell `i` covers
    /// `[base + size·i/100, base + size·(i+1)/100)` and shows the class with the most bytes
    /// in it — `*` requested bytes, `x` slack (bytes of a chunk in use beyond the request:
    /// rounding and unsplit remainders), `_` free — ties going to `*`, then `x`, then `_`.
    ///
    /// # Time complexity
    /// `O(chunks + 100 · regions)`.
    pub fn region_maps(&self) -> Vec<RegionMap> {
        self.regions
            .iter()
            .map(|r| {
                let chunks = std::iter::successors(Some(&self.chunks[r.first as usize]), |c| {
                    (c.next != NONE).then(|| &self.chunks[c.next as usize])
                });
                occupancy::region_map(r.base, r.size, chunks.map(Chunk::usage))
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
                if c.state == State::Vacant {
                    return Err(format!("{at}: a vacant slot is linked into the region"));
                }
                if c.prev != prev {
                    return Err(format!("{at}: prev link {} should be {prev}", c.prev));
                }
                region.chunk(&at, c.usage(), &mut tally)?;
                if c.state == State::Free {
                    if c.requested != 0 {
                        return Err(format!(
                            "{at}: a free chunk records {} requested",
                            c.requested
                        ));
                    }
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
            if c.state != State::Vacant {
                return Err(format!("slot {v} is on the vacant list but not vacant"));
            }
            vacant += 1;
            if vacant > self.chunks.len() {
                return Err("the vacant list has a cycle".into());
            }
            v = c.next;
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

    /// The best-fit free chunk for the request.
    fn find(&self, rounded: u64, alignment: u64) -> Option<Entry> {
        if alignment == MIN_ALLOCATION {
            self.free.best_fit(rounded)
        } else {
            self.free.find(rounded, |e| {
                align_up(e.addr, alignment).is_some_and(|a| a - e.addr <= e.size - rounded)
            })
        }
    }

    fn insert_free(&mut self, idx: u32) {
        let c = &mut self.chunks[idx as usize];
        c.state = State::Free;
        self.free.insert(c.size, c.addr, idx);
    }

    fn remove_free(&mut self, idx: u32) {
        let c = &self.chunks[idx as usize];
        self.free.remove(c.size, c.addr);
    }

    /// Splits chunk `idx` after `at` bytes; the upper part goes into the vacant slot `new`
    /// (same state as `idx`, not binned).
    fn split_into(&mut self, idx: u32, at: u64, new: u32) {
        let generation = self.chunks[new as usize].generation;
        let c = &mut self.chunks[idx as usize];
        let upper = Chunk {
            addr: c.addr + at,
            size: c.size - at,
            requested: 0,
            prev: idx,
            next: c.next,
            generation,
            state: State::Free,
        };
        c.size = at;
        c.next = new;
        if upper.next != NONE {
            self.chunks[upper.next as usize].prev = new;
        }
        self.chunks[new as usize] = upper;
    }

    /// Merges `idx`'s next neighbour (unbinned) into `idx` and frees its slot.
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

    /// Takes a vacant slot (reusing one, or growing the slab), or `None` when the slab is full.
    fn new_slot_vacant(&mut self) -> Option<u32> {
        if self.vacant != NONE {
            let idx = self.vacant;
            self.vacant = self.chunks[idx as usize].next;
            // Marked Free so the list stays consistent until `split_into` overwrites it.
            self.chunks[idx as usize].state = State::Free;
            self.chunks[idx as usize].next = NONE;
            return Some(idx);
        }
        let idx = u32::try_from(self.chunks.len())
            .ok()
            .filter(|&i| i != NONE)?;
        self.chunks.push(Chunk {
            addr: 0,
            size: 0,
            requested: 0,
            prev: NONE,
            next: NONE,
            generation: 0,
            state: State::Free,
        });
        Some(idx)
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

    fn release_slot(&mut self, idx: u32) {
        let c = &mut self.chunks[idx as usize];
        c.state = State::Vacant;
        c.requested = 0;
        c.prev = NONE;
        c.next = self.vacant;
        self.vacant = idx;
    }
}

/// `addr` rounded up to `alignment` (a power of two); `None` on overflow.
fn align_up(addr: u64, alignment: u64) -> Option<u64> {
    addr.checked_add(alignment - 1)
        .map(|a| a & !(alignment - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn arena(regions: &[(u64, u64)]) -> Arena {
        let mut a = Arena::new();
        for &(base, size) in regions {
            a.add_region(base, size).unwrap();
        }
        a.check_invariants().unwrap();
        a
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

    #[test]
    fn bins_follow_powers_of_two() {
        assert_eq!(bin_for_size(1), 0);
        assert_eq!(bin_for_size(256), 0);
        assert_eq!(bin_for_size(511), 0);
        assert_eq!(bin_for_size(512), 1);
        assert_eq!(bin_for_size(MIB), 12);
        assert_eq!(bin_for_size(256 * MIB - 1), 19);
        assert_eq!(bin_for_size(256 * MIB), 20);
        assert_eq!(bin_for_size(u64::MAX), 20);
        assert_eq!(bin_min_size(20), 256 * MIB);
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
