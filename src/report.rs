//! The out-of-memory report: what XLA's BFC allocator prints when it runs out, as a value.

use std::fmt;

use serde::Serialize;

use crate::units::Bytes;

/// One bin's line in an OOM report (XLA's `Bin (256): Total Chunks: …`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BinSummary {
    /// Bin index.
    pub index: usize,
    /// Smallest chunk size the bin holds (`256 << index`).
    pub min_size: u64,
    /// Chunks of this bin's size class, free and in use.
    pub total_chunks: u64,
    /// Chunks of this size class in use.
    pub chunks_in_use: u64,
    /// Bytes of all chunks of this size class.
    pub total_bytes: u64,
    /// Bytes of chunks of this size class in use.
    pub bytes_in_use: u64,
    /// Bytes requested by the users of those chunks.
    pub requested_bytes_in_use: u64,
}

/// Characters per region in an occupancy map ([`RegionMap::map`]).
pub const MAP_CELLS: usize = 100;

/// One region's occupancy map: [`MAP_CELLS`] characters, `*` requested bytes, `x` slack
/// (rounding and unsplit remainder), `_` free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RegionMap {
    /// Base address of the region.
    pub base: u64,
    /// Size of the region in bytes.
    pub size: u64,
    /// The 100-character map.
    pub map: String,
}

/// Everything known when an allocation failed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OomReport {
    /// The allocator's name.
    pub allocator: String,
    /// Bytes requested.
    pub requested: u64,
    /// Bytes after the strategy's rounding.
    pub rounded: u64,
    /// Effective alignment.
    pub alignment: u64,
    /// The allocator's limit (`fraction × total`), if any.
    pub limit: Option<u64>,
    /// Bytes in use (rounded).
    pub bytes_in_use: u64,
    /// Bytes held from the device.
    pub pool_bytes: u64,
    /// The largest free chunk.
    pub largest_free_block: u64,
    /// `(free − largest free) / free`.
    pub fragmentation: f64,
    /// Free and total memory as the device reported them at the failure, if asked.
    pub device_free: Option<u64>,
    /// Why the allocator could not grow (the device's refusal, the limit reached, …).
    pub cause: String,
    /// Per-bin summary, non-empty bins only.
    pub bins: Vec<BinSummary>,
    /// Occupancy map of every region.
    pub regions: Vec<RegionMap>,
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} ran out of memory trying to allocate {} (rounded to {}, alignment {}): {}",
            self.allocator,
            Bytes(self.requested),
            Bytes(self.rounded),
            self.alignment,
            self.cause
        )?;
        match self.limit {
            Some(limit) => writeln!(f, "  limit:              {} ({} B)", Bytes(limit), limit)?,
            None => writeln!(f, "  limit:              none")?,
        }
        writeln!(
            f,
            "  in use:             {} ({} B)",
            Bytes(self.bytes_in_use),
            self.bytes_in_use
        )?;
        writeln!(
            f,
            "  pool:               {} ({} B)",
            Bytes(self.pool_bytes),
            self.pool_bytes
        )?;
        writeln!(
            f,
            "  largest free chunk: {} ({} B)",
            Bytes(self.largest_free_block),
            self.largest_free_block
        )?;
        writeln!(
            f,
            "  fragmentation:      {:.1}%",
            self.fragmentation * 100.0
        )?;
        if let Some(free) = self.device_free {
            writeln!(f, "  device free:        {} ({} B)", Bytes(free), free)?;
        }
        for b in &self.bins {
            writeln!(
                f,
                "  Bin ({}): Total Chunks: {}, Chunks in use: {}. {} allocated for chunks. {} in use in bin. {} client-requested in use in bin.",
                Bytes(b.min_size),
                b.total_chunks,
                b.chunks_in_use,
                Bytes(b.total_bytes),
                Bytes(b.bytes_in_use),
                Bytes(b.requested_bytes_in_use)
            )?;
        }
        for r in &self.regions {
            writeln!(f, "  region {:#x} ({}): {}", r.base, Bytes(r.size), r.map)?;
        }
        Ok(())
    }
}
