//! Regions carved into chunks, as bfc's arena and vmm's space both keep them (a slab of
//! linked chunks, an ordered map) and hand them here as [`ChunkUse`]s: what an out-of-memory
//! report shows of them (XLA's per-bin summary, a [`MAP_CELLS`]-character occupancy map per
//! region), and the invariants every such region keeps ([`RegionCheck`]).

use crate::report::{BinSummary, RegionMap, MAP_CELLS};
use crate::strategy::bins::{bin_for_size, bin_min_size, MIN_ALLOCATION, NUM_BINS};

/// A chunk as the report sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkUse {
    /// Its address.
    pub addr: u64,
    /// Its size.
    pub size: u64,
    /// The bytes requested of it while in use; `None` while free.
    pub requested: Option<u64>,
}

/// Per-bin summary of `chunks` (free and in use), classed by size as bfc's bins are (XLA's
/// `Bin (256): Total Chunks: …` lines); non-empty bins only.
///
/// # Time complexity
/// `O(chunks)`.
pub(crate) fn bin_summaries(chunks: impl IntoIterator<Item = ChunkUse>) -> Vec<BinSummary> {
    let mut bins: Vec<BinSummary> = (0..NUM_BINS)
        .map(|index| BinSummary {
            index,
            min_size: bin_min_size(index),
            total_chunks: 0,
            chunks_in_use: 0,
            total_bytes: 0,
            bytes_in_use: 0,
            requested_bytes_in_use: 0,
        })
        .collect();
    for c in chunks {
        let b = &mut bins[bin_for_size(c.size)];
        b.total_chunks += 1;
        b.total_bytes += c.size;
        if let Some(requested) = c.requested {
            b.chunks_in_use += 1;
            b.bytes_in_use += c.size;
            b.requested_bytes_in_use += requested;
        }
    }
    bins.retain(|b| b.total_chunks > 0);
    bins
}

/// The occupancy map of the region `[base, base + size)`, whose `chunks` come in address
/// order: cell `i` covers `[base + size·i/100, base + size·(i+1)/100)` and shows the class
/// with the most bytes in it — `*` requested bytes, `x` slack (bytes of a chunk in use beyond
/// the request: rounding and unsplit remainders), `_` free — ties going to `*`, then `x`,
/// then `_`.
///
/// # Time complexity
/// `O(chunks + MAP_CELLS)`.
pub(crate) fn region_map(
    base: u64,
    size: u64,
    chunks: impl IntoIterator<Item = ChunkUse>,
) -> RegionMap {
    const CLASSES: [char; 3] = ['*', 'x', '_'];
    let mut weight = [[0u64; 3]; MAP_CELLS];
    let bound = |i: usize| base + ((u128::from(size) * i as u128) / MAP_CELLS as u128) as u64;
    let mut cell = 0;
    for c in chunks {
        let end = c.addr + c.size;
        let segments = match c.requested {
            Some(requested) => [
                (c.addr, c.addr + requested, 0),
                (c.addr + requested, end, 1),
            ],
            None => [(c.addr, end, 2), (end, end, 2)],
        };
        for (start, stop, class) in segments {
            if start == stop {
                continue;
            }
            while cell + 1 < MAP_CELLS && bound(cell + 1) <= start {
                cell += 1;
            }
            let mut i = cell;
            while i < MAP_CELLS && bound(i) < stop {
                let lo = bound(i).max(start);
                let hi = bound(i + 1).min(stop);
                weight[i][class] += hi.saturating_sub(lo);
                i += 1;
            }
        }
    }
    let map = weight
        .iter()
        .map(|w| {
            let mut best = 0;
            for k in 1..3 {
                if w[k] > w[best] {
                    best = k;
                }
            }
            CLASSES[best]
        })
        .collect();
    RegionMap { base, size, map }
}

/// Checks that the region `[base, base + size)` may join `regions` (each `(base, size)`):
/// non-empty, in whole 256-byte units, not overflowing the address space, overlapping none.
///
/// # Errors
/// The reason it may not, described.
pub(crate) fn check_new_region(
    base: u64,
    size: u64,
    regions: impl IntoIterator<Item = (u64, u64)>,
) -> Result<(), String> {
    if size == 0 || base % MIN_ALLOCATION != 0 || size % MIN_ALLOCATION != 0 {
        return Err(format!(
            "region {base:#x}+{size} is not a non-empty range of whole 256-byte units"
        ));
    }
    let end = base
        .checked_add(size)
        .ok_or_else(|| format!("region {base:#x}+{size} overflows the address space"))?;
    match regions.into_iter().find(|&(b, s)| base < b + s && b < end) {
        Some((b, s)) => Err(format!(
            "region {base:#x}+{size} overlaps region {b:#x}+{s}"
        )),
        None => Ok(()),
    }
}

/// What the chunks of the regions checked add up to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Bytes of the chunks in use.
    pub in_use: u64,
    /// Chunks in use.
    pub live: usize,
    /// Free chunks.
    pub free: usize,
    /// The largest free chunk.
    pub largest_free: u64,
}

/// Checks, chunk by chunk in address order, what every region keeps: its chunks tile it
/// (no gap, no overlap, the last ending at its end) in whole 256-byte units, no two free
/// chunks are neighbours (frees coalesce), and no chunk in use records more requested than
/// its size. The store checks its own books (links, free index) beside it.
#[derive(Debug)]
pub(crate) struct RegionCheck {
    base: u64,
    end: u64,
    expected: u64,
    prev_free: bool,
}

impl RegionCheck {
    /// Starts on the region `[base, base + size)`.
    pub(crate) fn new(base: u64, size: u64) -> Self {
        RegionCheck {
            base,
            end: base + size,
            expected: base,
            prev_free: false,
        }
    }

    /// Checks the next chunk, `at` describing it for the message, and counts it in `tally`.
    ///
    /// # Errors
    /// The broken invariant, described.
    pub(crate) fn chunk(&mut self, at: &str, c: ChunkUse, tally: &mut Tally) -> Result<(), String> {
        if c.addr != self.expected {
            let expected = self.expected;
            return Err(format!(
                "{at}: should start at {expected:#x} (gap or overlap)"
            ));
        }
        if c.size == 0 || c.size % MIN_ALLOCATION != 0 || c.addr % MIN_ALLOCATION != 0 {
            return Err(format!(
                "{at}: size {} or address not in whole 256-byte units",
                c.size
            ));
        }
        self.expected = c.addr + c.size;
        if self.expected > self.end {
            return Err(format!("{at}: runs past the region's end"));
        }
        match c.requested {
            None if self.prev_free => {
                return Err(format!("{at}: two adjacent free chunks (not coalesced)"));
            }
            None => {
                tally.free += 1;
                tally.largest_free = tally.largest_free.max(c.size);
            }
            Some(requested) if requested > c.size => {
                return Err(format!("{at}: requested {requested} exceeds the chunk"));
            }
            Some(_) => {
                tally.in_use += c.size;
                tally.live += 1;
            }
        }
        self.prev_free = c.requested.is_none();
        Ok(())
    }

    /// Checks that the chunks reached the region's end.
    ///
    /// # Errors
    /// The broken invariant, described.
    pub(crate) fn finish(self) -> Result<(), String> {
        if self.expected != self.end {
            return Err(format!(
                "region {:#x}+{}: chunks end at {:#x}, not at the region's end",
                self.base,
                self.end - self.base,
                self.expected
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn used(addr: u64, size: u64, requested: u64) -> ChunkUse {
        ChunkUse {
            addr,
            size,
            requested: Some(requested),
        }
    }

    fn free(addr: u64, size: u64) -> ChunkUse {
        ChunkUse {
            addr,
            size,
            requested: None,
        }
    }

    #[test]
    fn the_map_shows_requested_slack_and_free_by_weight() {
        // 100 MiB: one cell a MiB. 30 requested, 10 slack, 60 free.
        let m = region_map(
            0,
            100 * MIB,
            [used(0, 40 * MIB, 30 * MIB), free(40 * MIB, 60 * MIB)],
        );
        assert_eq!((m.base, m.size), (0, 100 * MIB));
        let expected = format!("{}{}{}", "*".repeat(30), "x".repeat(10), "_".repeat(60));
        assert_eq!(m.map, expected);
    }

    #[test]
    fn ties_go_to_requested_then_slack() {
        // Each cell of 2 MiB holds one MiB of each neighbouring class.
        let half = |i: u64| i * MIB;
        let m = region_map(
            0,
            200 * MIB,
            [used(0, half(3), half(1)), free(half(3), 197 * MIB)],
        );
        assert_eq!(&m.map[..2], "*x");
    }

    fn check(base: u64, size: u64, chunks: &[ChunkUse]) -> Result<Tally, String> {
        let mut tally = Tally::default();
        let mut region = RegionCheck::new(base, size);
        for &c in chunks {
            region.chunk(&format!("chunk at {:#x}", c.addr), c, &mut tally)?;
        }
        region.finish()?;
        Ok(tally)
    }

    #[test_case::test_case(0, 0, "256-byte units" ; "empty")]
    #[test_case::test_case(100, 256, "256-byte units" ; "base not in units")]
    #[test_case::test_case(0, 100, "256-byte units" ; "size not in units")]
    #[test_case::test_case(u64::MAX - 255, 512, "overflows" ; "overflowing")]
    #[test_case::test_case(0x1f00, 512, "overlaps region 0x1000+4096" ; "overlapping")]
    fn a_region_that_may_not_join_is_refused(base: u64, size: u64, expected: &str) {
        let e = check_new_region(base, size, [(0x1000, 4096)]).unwrap_err();
        assert!(e.contains(expected), "{e}");
        assert!(
            check_new_region(0x2000, 256, [(0x1000, 4096)]).is_ok(),
            "adjacent is fine"
        );
    }

    #[test]
    fn a_tiled_region_adds_up() {
        let tally = check(
            0x1000,
            4096,
            &[
                used(0x1000, 1024, 1000),
                free(0x1400, 2048),
                used(0x1c00, 1024, 1024),
            ],
        )
        .unwrap();
        assert_eq!(
            tally,
            Tally {
                in_use: 2048,
                live: 2,
                free: 1,
                largest_free: 2048
            }
        );
    }

    #[test_case::test_case(&[used(0, 512, 1), used(768, 256, 1)], "gap or overlap" ; "a gap")]
    #[test_case::test_case(&[used(0, 512, 1), used(256, 768, 1)], "gap or overlap" ; "an overlap")]
    #[test_case::test_case(&[used(0, 100, 1), used(100, 924, 1)], "256-byte units" ; "not in units")]
    #[test_case::test_case(&[free(0, 512), free(512, 512)], "not coalesced" ; "free neighbours")]
    #[test_case::test_case(&[used(0, 512, 513), free(512, 512)], "exceeds the chunk" ; "over-requested")]
    #[test_case::test_case(&[used(0, 512, 1)], "not at the region's end" ; "short")]
    #[test_case::test_case(&[used(0, 2048, 1)], "past the region's end" ; "long")]
    fn a_broken_region_is_described(chunks: &[ChunkUse], expected: &str) {
        let e = check(0, 1024, chunks).unwrap_err();
        assert!(e.contains(expected), "{e}");
    }

    #[test]
    fn bins_count_free_and_used_chunks_by_size() {
        let bins = bin_summaries([used(0, 256, 100), free(256, 256), used(512, MIB, MIB)]);
        assert_eq!(bins.len(), 2, "{bins:?}");
        let b0 = &bins[0];
        assert_eq!(
            (
                b0.index,
                b0.total_chunks,
                b0.chunks_in_use,
                b0.total_bytes,
                b0.bytes_in_use
            ),
            (0, 2, 1, 512, 256)
        );
        assert_eq!(b0.requested_bytes_in_use, 100);
        assert_eq!((bins[1].index, bins[1].min_size), (12, MIB));
    }
}
