//! The size unit and XLA's bins, shared by every chunk manager here: bfc's arena and vmm's
//! space round requests to [`MIN_ALLOCATION`] and tile regions with multiples of it, the
//! free index refines each bin into size classes, and the occupancy report sums chunks per
//! bin (XLA's `Bin (256): Total Chunks: …` lines).
//!
//! Bin `b` holds sizes in `[256 << b, 256 << (b + 1))`; the last bin (20, 256 MiB and up) is
//! open-ended.
#![deny(unsafe_code)]

/// Every request is rounded up to a multiple of this, and every chunk starts on it.
pub const MIN_ALLOCATION: u64 = 256;
/// Number of bins (XLA's `kNumBins`).
pub const NUM_BINS: usize = 21;

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

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

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
}
