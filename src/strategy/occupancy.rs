//! What an out-of-memory report shows of an address space carved into chunks: XLA's per-bin
//! summary and a [`MAP_CELLS`]-character occupancy map per region. bfc's arena and vmm's
//! space keep their chunks differently (a slab of linked chunks, an ordered map) and both
//! hand them here as [`ChunkUse`]s.

use crate::report::{BinSummary, RegionMap};
use crate::strategy::bfc::arena::{bin_for_size, bin_min_size, MAP_CELLS, NUM_BINS};

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
