//! The address-space side of [`super::VmmAllocator`]: a pure chunk manager over reserved
//! virtual-address ranges, with no device and no I/O.
//!
//! * Each reservation is a **region**, tiled exactly by **chunks** (free or in use). Free
//!   chunks coalesce at once with free neighbours of the same region — across granule
//!   boundaries, whatever is mapped beneath them: the physical side is the allocator's
//!   business, not this one's.
//! * Free chunks are indexed by `(size, address)`. **Best fit**: the smallest free chunk that
//!   fits. Two ends: a *low* request takes the lowest address among the equals and sits at
//!   the chunk's start; a *high* request takes the highest address among them and sits at the
//!   chunk's end. Small and large allocations thus grow towards each other from the two ends
//!   of a reservation, and the small ones cannot pin granules between the large ones.
//! * Every chunk handed out is split to the request exactly (256-byte units): the remainder
//!   stays free. This departs from bfc's split rule on purpose — an unsplit remainder would
//!   hold physical memory nobody can use.
//!
//! Every operation is `O(log n)` in the number of chunks, except an aligned request, which
//! may try several candidates.
#![deny(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};

use crate::report::{BinSummary, RegionMap};
use crate::strategy::occupancy::{self, check_new_region, ChunkUse, RegionCheck, Tally};

/// Every request is rounded up to a multiple of this, and every chunk starts on it.
pub const MIN_ALLOCATION: u64 = 256;
/// Classes of regions: each region serves one class of requests (small or large), and
/// each class has its own free index.
pub const CLASSES: usize = 2;

/// One chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Chunk {
    /// Bytes; a non-zero multiple of 256.
    size: u64,
    /// Bytes the user asked for (in use only; 0 when free).
    requested: u64,
    /// 0 when free; otherwise the token of the allocation holding it.
    token: u64,
    /// Index of the region (reservation) it lies in.
    region: u32,
}

impl Chunk {
    fn is_free(&self) -> bool {
        self.token == 0
    }

    /// The chunk at `addr` as an out-of-memory report sees it.
    fn usage((&addr, c): (&u64, &Chunk)) -> ChunkUse {
        ChunkUse {
            addr,
            size: c.size,
            requested: (!c.is_free()).then_some(c.requested),
        }
    }
}

/// Where a request would go: found by [`Space::find`] or [`Space::candidates`], taken by
/// [`Space::commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The free chunk it comes out of.
    pub chunk: u64,
    /// Size of that chunk.
    pub chunk_size: u64,
    /// First byte of the allocation.
    pub addr: u64,
}

/// An allocation made by [`Space::commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// First byte.
    pub addr: u64,
    /// Bytes of the chunk (the rounded request).
    pub size: u64,
    /// What [`Space::free`] needs.
    pub token: u64,
}

/// The chunk manager. See the module docs.
#[derive(Debug, Default)]
pub struct Space {
    /// Invariant: the chunks tile every region exactly, in address order, no two adjacent
    /// free chunks of one region.
    chunks: BTreeMap<u64, Chunk>,
    /// Invariant: exactly the free chunks of the regions of class `k`, as `(size, addr)`,
    /// in `free[k]`.
    free: [BTreeSet<(u64, u64)>; CLASSES],
    /// Reservations `(base, size)`, in the order they were added; index = `Chunk::region`.
    regions: Vec<(u64, u64)>,
    /// The class of each region.
    class_of: Vec<usize>,
    /// Invariant: sum of the sizes of the chunks in use.
    bytes_in_use: u64,
    /// Invariant: number of chunks in use.
    live: usize,
    /// The last token handed out (tokens are never reused).
    last_token: u64,
}

fn align_up(addr: u64, alignment: u64) -> Option<u64> {
    addr.checked_add(alignment - 1)
        .map(|a| a & !(alignment - 1))
}

impl Space {
    /// An empty space.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the region `[base, base + size)` as one free chunk.
    ///
    /// # Errors
    /// A message for a range that is empty, not in 256-byte units, overflows, or overlaps
    /// a region already added.
    pub fn add_region(&mut self, base: u64, size: u64, class: usize) -> Result<(), String> {
        if class >= CLASSES {
            return Err(format!("class {class} is not below {CLASSES}"));
        }
        check_new_region(base, size, self.regions.iter().copied())?;
        let region = u32::try_from(self.regions.len()).map_err(|_| "too many regions")?;
        self.regions.push((base, size));
        self.class_of.push(class);
        self.chunks.insert(
            base,
            Chunk {
                size,
                requested: 0,
                token: 0,
                region,
            },
        );
        self.free[class].insert((size, base));
        Ok(())
    }

    /// The regions `(base, size)`, in the order they were added.
    pub fn regions(&self) -> &[(u64, u64)] {
        &self.regions
    }

    /// Bytes of the chunks in use.
    pub fn bytes_in_use(&self) -> u64 {
        self.bytes_in_use
    }

    /// Number of chunks in use.
    pub fn live_count(&self) -> usize {
        self.live
    }

    /// The largest free chunk (0 when none).
    pub fn largest_free(&self) -> u64 {
        self.free
            .iter()
            .filter_map(|f| f.last().map(|&(s, _)| s))
            .max()
            .unwrap_or(0)
    }

    /// Free chunks `(size, addr)` of every class, from the largest down.
    pub fn free_chunks_descending(&self) -> Vec<(u64, u64)> {
        let mut all: Vec<(u64, u64)> = self.free.iter().flatten().copied().collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        all
    }

    /// True when some region of `class` exists.
    pub fn has_class(&self, class: usize) -> bool {
        self.class_of.contains(&class)
    }

    /// Where `rounded` bytes aligned to `alignment` would go in `(size, addr)`-ordered chunk
    /// `(size, addr)`: at its start (`high == false`) or its end; `None` if it does not fit.
    pub fn fit(size: u64, addr: u64, rounded: u64, alignment: u64, high: bool) -> Option<u64> {
        let end = addr + size;
        if high {
            let start = end.checked_sub(rounded)? & !(alignment - 1);
            (start >= addr).then_some(start)
        } else {
            let start = align_up(addr, alignment)?;
            (start.checked_add(rounded)? <= end).then_some(start)
        }
    }

    /// The best fit for the request (see the module docs), or `None` when no free chunk fits.
    ///
    /// # Time complexity
    /// `O(log n)` for 256-byte alignment; otherwise linear in the candidates tried.
    pub fn find(
        &self,
        class: usize,
        rounded: u64,
        alignment: u64,
        high: bool,
    ) -> Option<Placement> {
        let free = self.free.get(class)?;
        let mut from = rounded;
        loop {
            let &(size, _) = free.range((from, 0)..).next()?;
            let same = free.range((size, 0)..=(size, u64::MAX));
            let hit = if high {
                same.rev()
                    .find_map(|&(s, a)| Some((a, Self::fit(s, a, rounded, alignment, true)?)))
            } else {
                same.into_iter()
                    .find_map(|&(s, a)| Some((a, Self::fit(s, a, rounded, alignment, false)?)))
            };
            if let Some((chunk, addr)) = hit {
                return Some(Placement {
                    chunk,
                    chunk_size: size,
                    addr,
                });
            }
            from = size.checked_add(1)?;
        }
    }

    /// Every place the request could go: the start and the end of each free chunk that fits
    /// (with the alignment honoured), in best-fit order. For the search under memory
    /// pressure.
    ///
    /// # Time complexity
    /// `O(free chunks)`.
    pub fn candidates(
        &self,
        class: usize,
        rounded: u64,
        alignment: u64,
    ) -> impl Iterator<Item = Placement> + '_ {
        self.free[class.min(CLASSES - 1)]
            .range((rounded, 0)..)
            .flat_map(move |&(size, chunk)| {
                let low = Self::fit(size, chunk, rounded, alignment, false);
                let high =
                    Self::fit(size, chunk, rounded, alignment, true).filter(|&h| Some(h) != low);
                low.into_iter().chain(high).map(move |addr| Placement {
                    chunk,
                    chunk_size: size,
                    addr,
                })
            })
    }

    /// Hands out `rounded` bytes at `p.addr` from the free chunk `p.chunk` (a placement found
    /// by [`Space::find`] or [`Space::candidates`] with no change since); `None` when the
    /// placement is stale.
    ///
    /// # Time complexity
    /// `O(log n)`.
    pub fn commit(&mut self, p: Placement, rounded: u64, requested: u64) -> Option<Grant> {
        let c = *self.chunks.get(&p.chunk)?;
        let end = p.chunk + c.size;
        if !c.is_free() || p.addr < p.chunk || p.addr.checked_add(rounded)? > end {
            return None;
        }
        let class = self.class_of[c.region as usize];
        self.free[class].remove(&(c.size, p.chunk));
        self.chunks.remove(&p.chunk);
        if p.addr > p.chunk {
            self.insert_free(p.chunk, p.addr - p.chunk, c.region);
        }
        if p.addr + rounded < end {
            self.insert_free(p.addr + rounded, end - p.addr - rounded, c.region);
        }
        self.last_token += 1;
        let token = self.last_token;
        self.chunks.insert(
            p.addr,
            Chunk {
                size: rounded,
                requested,
                token,
                region: c.region,
            },
        );
        self.bytes_in_use += rounded;
        self.live += 1;
        Some(Grant {
            addr: p.addr,
            size: rounded,
            token,
        })
    }

    /// Frees the chunk at `addr` handed out with `token`, coalescing it with its free
    /// neighbours. Returns `(chunk size, requested)`; `None` for a stale or forged token.
    ///
    /// # Time complexity
    /// `O(log n)`.
    pub fn free(&mut self, addr: u64, token: u64) -> Option<(u64, u64)> {
        let c = *self.chunks.get(&addr)?;
        if c.is_free() || c.token != token {
            return None;
        }
        self.chunks.remove(&addr);
        self.bytes_in_use -= c.size;
        self.live -= 1;
        let class = self.class_of[c.region as usize];
        let mut start = addr;
        let mut end = addr + c.size;
        if let Some((&pa, &pc)) = self.chunks.range(..addr).next_back() {
            if pc.is_free() && pc.region == c.region && pa + pc.size == addr {
                self.free[class].remove(&(pc.size, pa));
                self.chunks.remove(&pa);
                start = pa;
            }
        }
        if let Some(&nc) = self.chunks.get(&end) {
            if nc.is_free() && nc.region == c.region {
                self.free[class].remove(&(nc.size, end));
                self.chunks.remove(&end);
                end += nc.size;
            }
        }
        self.insert_free(start, end - start, c.region);
        Some((c.size, c.requested))
    }

    /// Size of the chunk in use at `addr` handed out with `token`; `None` when there is none
    /// (free, stale or forged).
    ///
    /// # Time complexity
    /// `O(log n)`.
    pub fn in_use_size(&self, addr: u64, token: u64) -> Option<u64> {
        self.chunks
            .get(&addr)
            .filter(|c| !c.is_free() && c.token == token)
            .map(|c| c.size)
    }

    /// Gives the chunk in use at `addr` (handed out with `token`) a fresh token, so that the
    /// old one is refused from now on. `None` (nothing changed) when there is no such chunk.
    ///
    /// # Time complexity
    /// `O(log n)`.
    pub fn retoken(&mut self, addr: u64, token: u64) -> Option<Grant> {
        let c = self.chunks.get_mut(&addr)?;
        if c.is_free() || c.token != token {
            return None;
        }
        self.last_token += 1;
        c.token = self.last_token;
        Some(Grant {
            addr,
            size: c.size,
            token: c.token,
        })
    }

    /// Hands a chunk in use out again (a stream-ordered free reused by its own stream):
    /// `[at, at + rounded)` of the chunk at `addr` with `token` becomes a chunk of its own for
    /// `requested` bytes under a fresh token, and the bytes before and after it stay in use
    /// as chunks of their own (fresh tokens too), returned as [`Grant`]s. `None` (nothing
    /// changed) when the chunk is not in use with that token or does not hold the range.
    ///
    /// # Time complexity
    /// `O(log n)`.
    pub fn carve(
        &mut self,
        addr: u64,
        token: u64,
        at: u64,
        rounded: u64,
        requested: u64,
    ) -> Option<(Grant, Vec<Grant>)> {
        let c = *self.chunks.get(&addr)?;
        let end = addr + c.size;
        if c.is_free()
            || c.token != token
            || at < addr
            || at % MIN_ALLOCATION != 0
            || rounded == 0
            || rounded % MIN_ALLOCATION != 0
            || at.checked_add(rounded)? > end
        {
            return None;
        }
        let mut rest = Vec::new();
        for (start, size) in [(addr, at - addr), (at + rounded, end - at - rounded)] {
            if size == 0 {
                continue;
            }
            self.last_token += 1;
            let token = self.last_token;
            self.chunks.insert(
                start,
                Chunk {
                    size,
                    requested: size,
                    token,
                    region: c.region,
                },
            );
            self.live += 1;
            rest.push(Grant {
                addr: start,
                size,
                token,
            });
        }
        self.last_token += 1;
        let token = self.last_token;
        self.chunks.insert(
            at,
            Chunk {
                size: rounded,
                requested,
                token,
                region: c.region,
            },
        );
        Some((
            Grant {
                addr: at,
                size: rounded,
                token,
            },
            rest,
        ))
    }

    /// The chunks in use that overlap `[start, end)`, as `(addr, size)`.
    pub fn in_use_overlapping(
        &self,
        start: u64,
        end: u64,
    ) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self
            .chunks
            .range(..=start)
            .next_back()
            .map_or(start, |(&a, _)| a);
        self.chunks
            .range(first..end)
            .filter(move |(&a, c)| !c.is_free() && a + c.size > start)
            .map(|(&a, c)| (a, c.size))
    }

    /// Every chunk in use as `(addr, size)`, in address order.
    pub fn in_use(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.chunks
            .iter()
            .filter(|(_, c)| !c.is_free())
            .map(|(&a, c)| (a, c.size))
    }

    fn insert_free(&mut self, addr: u64, size: u64, region: u32) {
        let class = self.class_of[region as usize];
        self.chunks.insert(
            addr,
            Chunk {
                size,
                requested: 0,
                token: 0,
                region,
            },
        );
        self.free[class].insert((size, addr));
    }

    /// XLA's per-bin summary of every chunk (free and in use), non-empty bins only.
    pub fn bin_summaries(&self) -> Vec<BinSummary> {
        occupancy::bin_summaries(self.chunks.iter().map(Chunk::usage))
    }

    /// A [`MAP_CELLS`](crate::strategy::bfc::arena::MAP_CELLS)-character occupancy map of
    /// each region (`*` requested, `x` slack, `_` free), as bfc draws them.
    pub fn region_maps(&self) -> Vec<RegionMap> {
        self.regions
            .iter()
            .map(|&(base, size)| {
                let chunks = self.chunks.range(base..base.saturating_add(size));
                occupancy::region_map(base, size, chunks.map(Chunk::usage))
            })
            .collect()
    }

    /// Checks the invariants stated on the fields.
    ///
    /// # Errors
    /// A description of the first one broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut tally = Tally::default();
        let mut covered = 0u64;
        for (ri, &(base, size)) in self.regions.iter().enumerate() {
            let mut region = RegionCheck::new(base, size);
            for chunk in self.chunks.range(base..base + size) {
                let (&addr, c) = chunk;
                let at = format!("region {base:#x}, chunk at {addr:#x}+{}", c.size);
                region.chunk(&at, Chunk::usage(chunk), &mut tally)?;
                if c.region as usize != ri {
                    return Err(format!("{at}: records region {}", c.region));
                }
                if c.is_free() && !self.free[self.class_of[ri]].contains(&(c.size, addr)) {
                    return Err(format!("{at}: free chunk missing from the free index"));
                }
                covered += c.size;
            }
            region.finish()?;
        }
        let Tally {
            in_use, live, free, ..
        } = tally;
        let total: u64 = self.chunks.values().map(|c| c.size).sum();
        if total != covered {
            return Err("a chunk lies outside every region".into());
        }
        let indexed: usize = self.free.iter().map(BTreeSet::len).sum();
        if free != indexed {
            return Err(format!(
                "the free index holds {indexed} chunks, the regions {free} free ones"
            ));
        }
        if in_use != self.bytes_in_use || live != self.live {
            return Err(format!(
                "chunks in use: {live} of {in_use} B, books say {} of {} B",
                self.live, self.bytes_in_use
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_ends_best_fit_and_coalescing() {
        let mut s = Space::new();
        s.add_region(0, 1 << 20, 0).unwrap();
        let p = s.find(0, 4096, 256, false).unwrap();
        assert_eq!(p.addr, 0);
        let a = s.commit(p, 4096, 4000).unwrap();
        let p = s.find(0, 8192, 256, true).unwrap();
        assert_eq!(p.addr, (1 << 20) - 8192);
        let b = s.commit(p, 8192, 8192).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.free(a.addr, a.token), Some((4096, 4000)));
        assert_eq!(s.free(a.addr, a.token), None);
        assert_eq!(s.free(b.addr, b.token), Some((8192, 8192)));
        s.check_invariants().unwrap();
        assert_eq!(s.largest_free(), 1 << 20);
        // Aligned, from the top.
        let p = s.find(0, 256, 1 << 16, true).unwrap();
        assert_eq!(p.addr, (1 << 20) - (1 << 16));
        let g = s.commit(p, 256, 1).unwrap();
        s.check_invariants().unwrap();
        assert_eq!(s.in_use_overlapping(0, 1 << 20).count(), 1);
        s.free(g.addr, g.token).unwrap();
        assert!(s.find(0, 2 << 20, 256, false).is_none());
        assert!(s.add_region(4096, 256, 0).is_err());
    }
}
