//! Figures the core vocabulary shares: an allocator's counters ([`Stats`], re-exported by
//! [`crate::allocator`]) and a device's free and total memory ([`MemInfo`], re-exported by
//! [`crate::device`]). Plain data that depends on nothing of the crate, so that errors,
//! reports and diagnoses can carry them without depending on the layers above.
#![deny(unsafe_code)]

use serde::Serialize;

/// Free and total memory as the device reports them now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemInfo {
    /// Bytes free on the device (for every process).
    pub free: u64,
    /// Total bytes on the device.
    pub total: u64,
}

/// Counters with the names and meanings of XLA's `AllocatorStats`, plus fragmentation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Number of allocations served (zero-byte ones included).
    pub num_allocs: u64,
    /// Bytes currently handed out (as rounded by the strategy).
    pub bytes_in_use: u64,
    /// High-water mark of `bytes_in_use`.
    pub peak_bytes_in_use: u64,
    /// Largest single allocation served (as rounded).
    pub largest_alloc_size: u64,
    /// The most memory the allocator may hold (`fraction × total`), when it has a limit.
    pub bytes_limit: Option<u64>,
    /// Bytes reserved for a purpose and not available to allocations (XLA: memory held by
    /// the allocator beyond the pool, e.g. VMM address space is not counted here).
    pub bytes_reserved: u64,
    /// High-water mark of `bytes_reserved`.
    pub peak_bytes_reserved: u64,
    /// Largest free block the allocator could hand out without asking the device.
    pub largest_free_block_bytes: u64,
    /// Bytes the allocator holds from the device (its pool).
    pub pool_bytes: u64,
    /// High-water mark of `pool_bytes`.
    pub peak_pool_bytes: u64,
    /// `(free − largest free block) / free`, with `free = pool_bytes − bytes_in_use`; 0 when
    /// nothing is free.
    pub fragmentation: f64,
    /// Bytes of live allocations asleep (their device memory handed back, their addresses
    /// kept: `vmm`'s sleep): not in `bytes_in_use`. 0 for strategies without sleep.
    pub bytes_asleep: u64,
    /// Bytes of sleeping allocations' contents held in host memory.
    pub host_bytes_asleep: u64,
}

impl Stats {
    /// Computes [`Stats::fragmentation`] from the other fields.
    pub fn compute_fragmentation(pool_bytes: u64, bytes_in_use: u64, largest_free: u64) -> f64 {
        let free = pool_bytes.saturating_sub(bytes_in_use);
        if free == 0 {
            0.0
        } else {
            (free - largest_free.min(free)) as f64 / free as f64
        }
    }
}
