//! What every strategy's [`Allocator`](crate::Allocator) does the same way: the checks at the
//! top of `allocate` and `deallocate`, and the part of an out-of-memory report that says what
//! was asked and what the device has left.

use crate::allocator::{effective_alignment, round_up, Allocation};
use crate::device::Device;
use crate::error::Result;
use crate::report::OomReport;

/// A request that passed the checks every strategy makes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admitted {
    /// The alignment to honour.
    pub alignment: u64,
    /// The size rounded up to the strategy's unit.
    pub rounded: u64,
}

/// The checks at the top of every strategy's `allocate`: `alignment` must be 0 (meaning
/// `unit`) or a power of two up to `max_alignment`; the size is rounded up to `unit` (the
/// strategy's minimum alignment). `None` for a zero `size`, which a strategy serves with an
/// [`Allocation::empty`] and no device call.
///
/// The checks are written out here, inlined into every strategy's `allocate`, and the errors
/// are built only on failure (by [`effective_alignment`] and [`round_up`], in a cold path):
/// the shared helpers are out-of-line calls, and `round_up` builds its error value on every
/// call, which an allocation's fast path should not pay.
///
/// # Errors
/// [`crate::Error::InvalidAlignment`]; [`crate::Error::InvalidSize`] for a size that
/// overflows once rounded.
///
/// # Time complexity
/// `O(1)`.
#[inline(always)]
pub(crate) fn admit(
    size: u64,
    alignment: u64,
    unit: u64,
    max_alignment: u64,
) -> Result<Option<Admitted>> {
    debug_assert!(unit.is_power_of_two() && unit <= max_alignment);
    let asked = if alignment == 0 { unit } else { alignment };
    if !asked.is_power_of_two() || asked > max_alignment {
        return Err(refused(size, alignment, unit, max_alignment));
    }
    if size == 0 {
        return Ok(None);
    }
    let Some(padded) = size.checked_add(unit - 1) else {
        return Err(refused(size, alignment, unit, max_alignment));
    };
    Ok(Some(Admitted {
        alignment: asked.max(unit),
        rounded: padded & !(unit - 1),
    }))
}

/// The error [`admit`] returns for a request it refuses: the shared helpers' own, so that
/// every strategy reports a bad request the same way.
#[cold]
#[inline(never)]
fn refused(size: u64, alignment: u64, unit: u64, max_alignment: u64) -> crate::Error {
    match effective_alignment(alignment, unit, max_alignment).and_then(|_| round_up(size, unit)) {
        Err(e) => e,
        Ok(_) => unreachable!("admit refused a request the shared checks accept"),
    }
}

/// The check at the top of every strategy's `deallocate`: whether `allocation` holds memory
/// to give back — false for an empty one, which needs nothing.
///
/// # Errors
/// [`crate::Error::ForeignAllocation`] when allocator `allocator_id` did not make it.
#[inline]
pub(crate) fn holds_memory(allocation: &Allocation, allocator_id: u64) -> Result<bool> {
    allocation.check_owner(allocator_id)?;
    Ok(!allocation.is_empty())
}

/// What an out-of-memory report says of the failed request, whichever strategy failed it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FailedRequest<'a> {
    /// The strategy's name.
    pub allocator: &'a str,
    /// Bytes asked for.
    pub requested: u64,
    /// After the strategy's rounding.
    pub rounded: u64,
    /// The effective alignment.
    pub alignment: u64,
    /// The strategy's limit.
    pub limit: Option<u64>,
}

impl FailedRequest<'_> {
    /// A report of this request failing for `cause`, with what `device` says it has free now;
    /// the occupancy (bytes in use, pool, largest free block, bins, regions) is left empty for
    /// the strategy to fill in (`OomReport { bytes_in_use, .., ..request.report(…) }`).
    pub(crate) fn report<D: Device + ?Sized>(self, device: &D, cause: String) -> OomReport {
        OomReport {
            allocator: self.allocator.to_string(),
            requested: self.requested,
            rounded: self.rounded,
            alignment: self.alignment,
            limit: self.limit,
            bytes_in_use: 0,
            pool_bytes: 0,
            largest_free_block: 0,
            fragmentation: 0.0,
            device_free: device.mem_info().ok().map(|m| m.free),
            cause,
            bins: Vec::new(),
            regions: Vec::new(),
        }
    }
}

/// Synchronises the whole device before an allocation made on another thread's per-thread
/// stream is freed ([`Allocation::freed_off_its_thread`]): true when it did (the memory is
/// then idle for every stream), false (logged) when the device refused — the free is then
/// ordered on the calling thread's stream, the best left.
pub(crate) fn synchronized<D: crate::device::Device + ?Sized>(device: &D) -> bool {
    match device.synchronize_device() {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e,
                "a per-thread-stream allocation freed on another thread: could not synchronize \
                 the device; ordering the free on this thread's stream instead");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use test_case::test_case;

    use super::*;
    use crate::device::Stream;
    use crate::Error;

    #[test_case(100, 0, Some((256, 256)) ; "default alignment, rounded to the unit")]
    #[test_case(256, 1024, Some((1024, 256)) ; "a larger alignment keeps the unit rounding")]
    #[test_case(1, 16, Some((256, 256)) ; "a smaller alignment is raised to the unit")]
    #[test_case(0, 0, None ; "zero size")]
    fn admits(size: u64, alignment: u64, expected: Option<(u64, u64)>) {
        let admitted = admit(size, alignment, 256, 4096).unwrap();
        assert_eq!(admitted.map(|a| (a.alignment, a.rounded)), expected);
    }

    #[test_case(100, 3 ; "not a power of two")]
    #[test_case(100, 8192 ; "above the maximum")]
    #[test_case(0, 3 ; "checked even for a zero size")]
    fn refuses_bad_alignments(size: u64, alignment: u64) {
        assert!(matches!(
            admit(size, alignment, 256, 4096),
            Err(Error::InvalidAlignment { max: 4096, .. })
        ));
    }

    #[test]
    fn refuses_sizes_that_overflow_once_rounded() {
        assert!(matches!(
            admit(u64::MAX, 0, 256, 4096),
            Err(Error::InvalidSize { .. })
        ));
    }

    #[test]
    fn only_the_owner_frees_and_an_empty_allocation_holds_nothing() {
        let empty = Allocation::empty(Stream::DEFAULT, 7);
        assert!(!holds_memory(&empty, 7).unwrap());
        let real = Allocation::new(0x1000, 100, Stream::DEFAULT, 7, 1);
        assert!(holds_memory(&real, 7).unwrap());
        assert!(matches!(
            holds_memory(&real, 8),
            Err(Error::ForeignAllocation {
                ptr: 0x1000,
                owner: 7,
                this: 8
            })
        ));
    }
}
