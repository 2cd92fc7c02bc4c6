//! The fake address space of a simulated host device: addresses only, no memory.
//!
//! Addresses are handed out by a bump cursor that moves up through `[start, end)` and does
//! not reuse an address while there is fresh space above it, so a stale pointer is never
//! mistaken for a newer allocation in practice. When the cursor reaches the end (after some
//! 2^63 bytes of traffic) it wraps to the start and continues next-fit around the live
//! ranges, so replaying any number of allocations never overflows.

use std::collections::BTreeMap;

/// Where the fake address space starts: 1 TiB, far from null and easy to recognise.
pub(crate) const START: u64 = 1 << 40;
/// Where it ends (exclusive): 2^63, so every address also fits an `i64`.
pub(crate) const END: u64 = 1 << 63;

/// A fake address space: live ranges and a next-fit cursor.
#[derive(Debug)]
pub(crate) struct SimSpace {
    start: u64,
    end: u64,
    cursor: u64,
    /// Live ranges: start → length.
    live: BTreeMap<u64, u64>,
}

impl SimSpace {
    /// The full fake address space `[START, END)`.
    pub(crate) fn new() -> Self {
        Self::with_bounds(START, END)
    }

    /// An address space `[start, end)` (small bounds let tests reach the wrap-around).
    pub(crate) fn with_bounds(start: u64, end: u64) -> Self {
        SimSpace {
            start,
            end,
            cursor: start,
            live: BTreeMap::new(),
        }
    }

    /// Takes `len` (> 0) bytes aligned to `align` (a power of two). `None` when no gap that
    /// large is left anywhere.
    pub(crate) fn take(&mut self, len: u64, align: u64) -> Option<u64> {
        debug_assert!(len > 0 && align.is_power_of_two());
        let mut at = self.cursor;
        let mut wrapped = false;
        loop {
            let candidate = at.checked_next_multiple_of(align)?;
            let fits_end = candidate
                .checked_add(len)
                .is_some_and(|stop| stop <= self.end);
            if !fits_end {
                if wrapped {
                    return None;
                }
                wrapped = true;
                at = self.start;
                continue;
            }
            let stop = candidate + len;
            // The last live range starting before `stop` is the only one that can overlap
            // [candidate, stop), since live ranges never overlap each other.
            match self.live.range(..stop).next_back() {
                Some((&s, &l)) if s + l > candidate => {
                    // Overlap: continue after that range. Passing the cursor again after a
                    // wrap means the whole space has been searched.
                    let next = s + l;
                    if wrapped && next > self.cursor {
                        return None;
                    }
                    at = next;
                }
                _ => {
                    self.live.insert(candidate, len);
                    self.cursor = stop;
                    return Some(candidate);
                }
            }
        }
    }

    /// Takes `[addr, addr + len)` (`len` > 0) exactly, when it lies in the space and
    /// overlaps no live range; false (taking nothing) otherwise. The cursor moves past it, so
    /// fresh addresses are not handed out under it later.
    pub(crate) fn take_at(&mut self, addr: u64, len: u64) -> bool {
        let Some(stop) = addr.checked_add(len) else {
            return false;
        };
        if len == 0 || addr < self.start || stop > self.end {
            return false;
        }
        if let Some((&s, &l)) = self.live.range(..stop).next_back() {
            if s + l > addr {
                return false;
            }
        }
        self.live.insert(addr, len);
        self.cursor = self.cursor.max(stop);
        true
    }

    /// Returns the range starting at `addr`; false when none does.
    pub(crate) fn give(&mut self, addr: u64) -> bool {
        self.live.remove(&addr).is_some()
    }

    /// Number of live ranges.
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bumps_without_reuse_then_wraps_next_fit() {
        let mut s = SimSpace::with_bounds(0x1000, 0x1000 + 10 * 0x100);
        let a = s.take(0x100, 0x100).unwrap();
        let b = s.take(0x300, 0x100).unwrap();
        assert_eq!((a, b), (0x1000, 0x1100));
        assert!(s.give(a));
        // Fresh space above the cursor is used before the freed range.
        let c = s.take(0x100, 0x100).unwrap();
        assert_eq!(c, 0x1400);
        let d = s.take(0x500, 0x100).unwrap();
        assert_eq!(d, 0x1500);
        // Full to the end: the next request wraps and lands in the freed gap.
        let e = s.take(0x100, 0x100).unwrap();
        assert_eq!(e, 0x1000);
        assert_eq!(s.take(0x100, 0x100), None);
        assert!(s.give(b));
        assert_eq!(s.take(0x400, 0x100), None);
        assert_eq!(s.take(0x300, 0x100), Some(0x1100));
        assert_eq!(s.live(), 4);
        assert!(!s.give(0x1234));
    }

    #[test]
    fn a_range_is_taken_at_its_address_when_free() {
        let mut s = SimSpace::with_bounds(0x1000, 0x1000 + 10 * 0x100);
        let a = s.take(0x200, 0x100).unwrap();
        assert!(!s.take_at(a + 0x100, 0x100), "overlaps a live range");
        assert!(!s.take_at(0x800, 0x100), "below the space");
        assert!(!s.take_at(0x1000 + 9 * 0x100, 0x200), "past its end");
        assert!(!s.take_at(u64::MAX - 0x10, 0x100), "wraps");
        assert!(s.give(a));
        assert!(
            s.take_at(a, 0x200),
            "freed, taken again at the same address"
        );
        assert!(s.take_at(0x1600, 0x100));
        // The cursor moved past it: fresh addresses come from above.
        assert_eq!(s.take(0x100, 0x100), Some(0x1700));
        assert_eq!(s.live(), 3);
    }

    #[test]
    fn huge_requests_never_overflow() {
        let big: u64 = 141 << 30;
        // Ten million 141 GiB requests fit the full space before any wrap-around.
        assert!(START + 10_000_000 * (big + (2 << 20)) < END);
        // A space of 1000 such requests, traffic of 200 times that: wraps 200 times.
        let end = START + 1000 * big + 12345;
        let mut s = SimSpace::with_bounds(START, end);
        let mut live = Vec::new();
        for i in 0..200_000u64 {
            let a = s.take(big, 2 << 20).expect("space for one more");
            assert!(a >= START && a + big <= end);
            live.push(a);
            if i % 2 == 1 || live.len() > 4 {
                assert!(s.give(live.remove(0)));
            }
        }
        assert_eq!(s.take(end, 1), None);
        assert_eq!(SimSpace::new().take(END - START + 1, 1), None);
        assert_eq!(SimSpace::new().take(u64::MAX, 1 << 62), None);
    }
}
