//! The books of a host device: what it has handed out, and every validation rule.
//!
//! Both modes (real memory and simulated) keep exactly these books and run exactly these
//! checks; only the step between "checked" and "recorded" differs (system calls, or
//! nothing). Every operation is split into a `check_*` that refuses bad input without
//! changing anything and an `insert_*` / `remove_*` that records the result, so an OS failure
//! in between leaves the books untouched.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use rustc_hash::FxHashMap;

use crate::backends::{request_size, Request};
use crate::device::PhysicalHandle;
use crate::error::{Error, Result};
use crate::units::Bytes;

use super::HostCensus;

/// The backend name used in errors.
pub(crate) const BACKEND: &str = "host";

/// Allocations from [`crate::Device::alloc`] are charged against the capacity in units of
/// this many bytes (the alignment every allocation gets), whatever the page size.
pub(crate) const ALLOC_UNIT: u64 = 256;

/// A live allocation from `alloc`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AllocRecord {
    /// The size asked for.
    pub(crate) size: u64,
    /// The bytes charged against the capacity.
    pub(crate) charged: u64,
}

/// A live mapping of (part of) a physical handle into a reservation.
#[derive(Debug, Clone, Copy)]
struct Mapping {
    size: u64,
    handle: u64,
}

/// What covers a mapped granule.
#[derive(Debug, Clone, Copy)]
enum Granule {
    /// A mapping starts here.
    Start(Mapping),
    /// Inside the mapping that starts at this address.
    Inside(u64),
}

/// Physical memory made by `create_physical`.
#[derive(Debug)]
struct HandleRecord {
    size: u64,
    /// Released by its owner; it lives on while `mappings > 0`.
    released: bool,
    /// Live mappings of this handle.
    mappings: u64,
    /// The memory file (real mode; closed at release even if still mapped).
    fd: Option<OwnedFd>,
}

/// A run of mappings that follow each other without a gap (see `Books::covering_run`).
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Start of the first mapping; `None` when nothing is mapped at the run's first address.
    first: Option<u64>,
    /// Start of the last mapping.
    last: u64,
    /// Where the run ends.
    reached: u64,
}

/// Everything a device still held when it was dropped.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    /// `(address, size asked for)` of live allocations.
    pub(crate) allocations: Vec<(u64, u64)>,
    /// `(base, size)` of live reservations.
    pub(crate) reservations: Vec<(u64, u64)>,
    /// Live mappings.
    pub(crate) mappings: usize,
    /// Physical handles not yet released.
    pub(crate) handles: usize,
    /// Physical handles released but still mapped.
    pub(crate) released_mapped: usize,
    /// Bytes still charged against the capacity.
    pub(crate) bytes: u64,
}

/// The books. See the module docs.
#[derive(Debug)]
pub(crate) struct Books {
    granularity: u64,
    capacity: u64,
    charged: u64,
    allocations: FxHashMap<u64, AllocRecord>,
    /// base → size.
    reservations: BTreeMap<u64, u64>,
    /// Granule address → what covers it, for every granule mapped (and no other): one
    /// `Start` per mapping, at its first granule, and `Inside` naming that start at each of
    /// its other granules. Mappings therefore never overlap, and each question about a range
    /// costs one lookup per granule (or per mapping, walking a run) instead of an ordered
    /// search.
    granules: FxHashMap<u64, Granule>,
    /// Invariant: the number of `Start` entries of `granules`.
    mappings: usize,
    handles: FxHashMap<u64, HandleRecord>,
    next_handle: u64,
}

fn show(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes} B")
    } else {
        format!("{bytes} B ({})", Bytes(bytes))
    }
}

impl Books {
    /// Empty books for a device of `capacity` bytes with this VMM granularity.
    pub(crate) fn new(capacity: u64, granularity: u64) -> Self {
        Books {
            granularity,
            capacity,
            charged: 0,
            allocations: FxHashMap::default(),
            reservations: BTreeMap::new(),
            granules: FxHashMap::default(),
            mappings: 0,
            handles: FxHashMap::default(),
            next_handle: 1,
        }
    }

    /// Bytes not charged.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.capacity.saturating_sub(self.charged)
    }

    /// The capacity in bytes.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// What the device holds now, except streams and events.
    pub(crate) fn census(&self) -> HostCensus {
        HostCensus {
            allocations: self.allocations.len() as u64,
            bytes_in_use: self.charged,
            physical_handles: self.handles.len() as u64,
            mappings: self.mappings as u64,
            reservations: self.reservations.len() as u64,
            streams: 0,
            events: 0,
        }
    }

    fn charge_check(&self, requested: u64, charge: u64) -> Result<()> {
        if charge > self.free_bytes() {
            return Err(Error::DeviceOutOfMemory {
                backend: BACKEND,
                requested,
                free: self.free_bytes(),
            });
        }
        Ok(())
    }

    /// Refuses `value` unless it is a multiple of the granularity (and non-zero when asked).
    #[inline]
    fn granular(&self, call: &'static str, what: &str, value: u64, nonzero: bool) -> Result<()> {
        // The granularity is a power of two (the builder refuses anything else).
        if value & (self.granularity - 1) != 0 || (nonzero && value == 0) {
            return Err(self.not_granular(call, what, value, nonzero));
        }
        Ok(())
    }

    /// The error of [`Books::granular`], built only on that path.
    #[cold]
    #[inline(never)]
    fn not_granular(&self, call: &'static str, what: &str, value: u64, nonzero: bool) -> Error {
        let accepted = if nonzero {
            "a non-zero multiple"
        } else {
            "a multiple"
        };
        let value_shown = if what.contains("size") || what.contains("offset") {
            show(value)
        } else {
            format!("{value:#x}")
        };
        Error::InvalidArgument {
            call,
            reason: format!(
                "{what} {value_shown} is not accepted: it must be {accepted} of the granularity \
                 {}",
                show(self.granularity)
            ),
        }
    }

    // ---- plain allocations ------------------------------------------------------------

    /// Checks `alloc(size)`; returns the bytes to charge.
    ///
    /// # Errors
    /// `InvalidSize` for zero or an overflowing size; `DeviceOutOfMemory` past the capacity.
    pub(crate) fn check_alloc(&self, size: u64) -> Result<u64> {
        let charge = request_size(size, ALLOC_UNIT, Request::Allocation)?;
        self.charge_check(size, charge)?;
        Ok(charge)
    }

    /// Records an allocation checked by [`Books::check_alloc`].
    pub(crate) fn insert_alloc(&mut self, ptr: u64, size: u64, charged: u64) {
        self.charged += charged;
        self.allocations.insert(ptr, AllocRecord { size, charged });
    }

    /// Checks `free(ptr, size)`.
    ///
    /// # Errors
    /// `UnknownPointer` for a pointer not handed out (or freed already); `InvalidArgument`
    /// when `size` is not the size it was allocated with.
    pub(crate) fn check_free(&self, ptr: u64, size: u64) -> Result<AllocRecord> {
        let record = self
            .allocations
            .get(&ptr)
            .copied()
            .ok_or(Error::UnknownPointer {
                what: "allocation",
                ptr,
                backend: BACKEND,
            })?;
        if record.size != size {
            return Err(Error::InvalidArgument {
                call: "free",
                reason: format!(
                    "allocation {ptr:#x} was made with size {}, but free was given {}; \
                     accepted is the size it was allocated with",
                    show(record.size),
                    show(size)
                ),
            });
        }
        Ok(record)
    }

    /// Forgets an allocation checked by [`Books::check_free`] and credits its bytes.
    pub(crate) fn remove_alloc(&mut self, ptr: u64) {
        if let Some(record) = self.allocations.remove(&ptr) {
            self.charged -= record.charged;
        }
    }

    // ---- reservations -----------------------------------------------------------------

    /// Checks `reserve(size, alignment)`; returns the alignment to use
    /// (`max(alignment, granularity)`; 0 means the granularity).
    ///
    /// # Errors
    /// `InvalidArgument` for a size that is not a non-zero multiple of the granularity, or an
    /// alignment that is not a power of two.
    pub(crate) fn check_reserve(&self, size: u64, alignment: u64) -> Result<u64> {
        self.granular("reserve", "size", size, true)?;
        if alignment != 0 && !alignment.is_power_of_two() {
            return Err(Error::InvalidArgument {
                call: "reserve",
                reason: format!(
                    "alignment {alignment} is not accepted: it must be 0 (the granularity) or a \
                     power of two"
                ),
            });
        }
        Ok(alignment.max(self.granularity))
    }

    /// Records a reservation checked by [`Books::check_reserve`].
    pub(crate) fn insert_reservation(&mut self, va: u64, size: u64) {
        self.reservations.insert(va, size);
    }

    /// Checks `free_reservation(va, size)`.
    ///
    /// # Errors
    /// `UnknownPointer` when no reservation starts at `va`; `InvalidArgument` when `size` is
    /// not the reserved size or something is still mapped in it.
    pub(crate) fn check_free_reservation(&self, va: u64, size: u64) -> Result<()> {
        let &reserved = self.reservations.get(&va).ok_or(Error::UnknownPointer {
            what: "reservation",
            ptr: va,
            backend: BACKEND,
        })?;
        if reserved != size {
            return Err(Error::InvalidArgument {
                call: "free_reservation",
                reason: format!(
                    "reservation {va:#x} is {} long, but {} was given; accepted is exactly the \
                     reserved size",
                    show(reserved),
                    show(size)
                ),
            });
        }
        // Mappings lie inside one reservation each: count those that start in this one (a
        // walk over every mapping, on this rare path only).
        let end = va + reserved;
        let inside = self
            .granules
            .iter()
            .filter(|(&at, u)| matches!(u, Granule::Start(_)) && at >= va && at < end)
            .count();
        if inside > 0 {
            return Err(Error::InvalidArgument {
                call: "free_reservation",
                reason: format!(
                    "reservation {va:#x} still has {inside} mapping(s) in it; unmap them first"
                ),
            });
        }
        Ok(())
    }

    /// Forgets a reservation checked by [`Books::check_free_reservation`].
    pub(crate) fn remove_reservation(&mut self, va: u64) {
        self.reservations.remove(&va);
    }

    /// The reservation that holds all of `[va, va + size)`, as `(base, size)`.
    fn reservation_holding(&self, va: u64, size: u64) -> Option<(u64, u64)> {
        let (&base, &len) = self.reservations.range(..=va).next_back()?;
        let end = va.checked_add(size)?;
        (end <= base + len).then_some((base, len))
    }

    // ---- physical handles -------------------------------------------------------------

    /// Checks `create_physical(size)`.
    ///
    /// # Errors
    /// `InvalidArgument` for a size that is not a non-zero multiple of the granularity;
    /// `DeviceOutOfMemory` past the capacity.
    pub(crate) fn check_create(&self, size: u64) -> Result<()> {
        self.granular("create_physical", "size", size, true)?;
        self.charge_check(size, size)
    }

    /// Records physical memory checked by [`Books::check_create`] and charges it.
    pub(crate) fn insert_handle(&mut self, size: u64, fd: Option<OwnedFd>) -> PhysicalHandle {
        let id = self.next_handle;
        self.next_handle += 1;
        self.charged += size;
        self.handles.insert(
            id,
            HandleRecord {
                size,
                released: false,
                mappings: 0,
                fd,
            },
        );
        PhysicalHandle(id)
    }

    fn unknown_handle(handle: u64) -> Error {
        Error::UnknownPointer {
            what: "physical handle",
            ptr: handle,
            backend: BACKEND,
        }
    }

    /// Releases a handle: its memory (and capacity) comes back now if nothing maps it,
    /// otherwise when the last mapping goes. Closes its memory file either way.
    ///
    /// # Errors
    /// `UnknownPointer` for a handle not made here or released already.
    pub(crate) fn release(&mut self, handle: PhysicalHandle) -> Result<()> {
        let record = self
            .handles
            .get_mut(&handle.0)
            .filter(|h| !h.released)
            .ok_or(Self::unknown_handle(handle.0))?;
        record.released = true;
        record.fd = None;
        if record.mappings == 0 {
            self.charged -= record.size;
            self.handles.remove(&handle.0);
        }
        Ok(())
    }

    // ---- mappings ---------------------------------------------------------------------

    /// Checks `map(va, size, handle, offset)`; returns the handle's memory file (real mode).
    ///
    /// # Errors
    /// `InvalidArgument` for a misaligned or zero argument, a range past the end of the
    /// handle, outside one reservation or overlapping a mapping; `UnknownPointer` for an
    /// unknown or released handle.
    pub(crate) fn check_map(
        &self,
        va: u64,
        size: u64,
        handle: PhysicalHandle,
        offset: u64,
    ) -> Result<Option<&OwnedFd>> {
        self.granular("map", "address", va, false)?;
        self.granular("map", "size", size, true)?;
        self.granular("map", "offset", offset, false)?;
        let record = self
            .handles
            .get(&handle.0)
            .filter(|h| !h.released)
            .ok_or(Self::unknown_handle(handle.0))?;
        let past_end = match offset.checked_add(size) {
            Some(end) => end > record.size,
            None => true,
        };
        if past_end {
            return Err(Error::InvalidArgument {
                call: "map",
                reason: format!(
                    "offset {} + size {} runs past the end of physical handle {} of {}; \
                     accepted is offset + size within the handle",
                    show(offset),
                    show(size),
                    handle.0,
                    show(record.size)
                ),
            });
        }
        if self.reservation_holding(va, size).is_none() {
            return Err(Error::InvalidArgument {
                call: "map",
                reason: format!(
                    "[{va:#x}, +{}) is not inside one reservation; accepted is a range within \
                     a single range returned by reserve",
                    show(size)
                ),
            });
        }
        let end = va + size;
        // The overlapping mapping named is the one over the highest mapped granule of the
        // range (the last mapping starting below its end).
        let g = self.granularity;
        let mut at = end;
        while at > va {
            at -= g;
            if let Some((start, m)) = self.mapping_over(at) {
                return Err(Error::InvalidArgument {
                    call: "map",
                    reason: format!(
                        "[{va:#x}, {end:#x}) overlaps the mapping at [{start:#x}, {:#x}); unmap \
                         it first",
                        start + m.size
                    ),
                });
            }
        }
        Ok(record.fd.as_ref())
    }

    /// The mapping covering the granule at `at`, as `(start, mapping)`.
    fn mapping_over(&self, at: u64) -> Option<(u64, Mapping)> {
        match *self.granules.get(&at)? {
            Granule::Start(m) => Some((at, m)),
            Granule::Inside(start) => match self.granules.get(&start) {
                Some(&Granule::Start(m)) => Some((start, m)),
                _ => None,
            },
        }
    }

    /// Records a mapping checked by [`Books::check_map`].
    pub(crate) fn insert_mapping(&mut self, va: u64, size: u64, handle: PhysicalHandle) {
        if let Some(record) = self.handles.get_mut(&handle.0) {
            record.mappings += 1;
        }
        let mapping = Mapping {
            size,
            handle: handle.0,
        };
        self.granules.insert(va, Granule::Start(mapping));
        let g = self.granularity;
        let mut at = va + g;
        while at < va + size {
            self.granules.insert(at, Granule::Inside(va));
            at += g;
        }
        self.mappings += 1;
    }

    /// Walks the mappings that cover `[va, va + size)` (`va` granule-aligned), in address
    /// order, as long as they follow each other without a gap. Returns the run: the start of
    /// the first and of the last mapping touched (`None` when nothing covers `va`), and where
    /// the covered run ends (which may be short of, or past, `va + size`).
    fn covering_run(&self, va: u64, size: u64) -> Run {
        let end = va.saturating_add(size);
        let Some((first, m)) = self.mapping_over(va) else {
            return Run {
                first: None,
                last: va,
                reached: va,
            };
        };
        let mut last = first;
        let mut reached = first + m.size;
        while reached < end {
            match self.granules.get(&reached) {
                Some(&Granule::Start(m)) => {
                    last = reached;
                    reached += m.size;
                }
                _ => break,
            }
        }
        Run {
            first: Some(first),
            last,
            reached,
        }
    }

    /// Checks `set_access(va, size)`: every granule of the range must be mapped.
    ///
    /// # Errors
    /// `InvalidArgument` for a misaligned or zero argument or a range not entirely mapped.
    pub(crate) fn check_set_access(&self, va: u64, size: u64) -> Result<()> {
        self.granular("set_access", "address", va, false)?;
        self.granular("set_access", "size", size, true)?;
        let end = va.saturating_add(size);
        let run = self.covering_run(va, size);
        let reached = run.reached;
        if reached < end {
            let hole = if run.first.is_none() { va } else { reached };
            return Err(Error::InvalidArgument {
                call: "set_access",
                reason: format!(
                    "[{va:#x}, {end:#x}) is not entirely mapped: nothing is mapped at {hole:#x}; \
                     accepted is a range covered by mappings"
                ),
            });
        }
        Ok(())
    }

    /// Checks `unmap(va, size)`: the range must be exactly a run of whole mappings.
    ///
    /// # Errors
    /// `InvalidArgument` for a misaligned or zero argument, a range that is not mapped, or
    /// one that would split a mapping.
    pub(crate) fn check_unmap(&self, va: u64, size: u64) -> Result<()> {
        self.granular("unmap", "address", va, false)?;
        self.granular("unmap", "size", size, true)?;
        let end = va.saturating_add(size);
        let Run {
            first,
            last,
            reached,
        } = self.covering_run(va, size);
        let refuse = |why: String| Error::InvalidArgument {
            call: "unmap",
            reason: format!(
                "[{va:#x}, {end:#x}) {why}; accepted is a range made of whole earlier mappings"
            ),
        };
        match first {
            None => return Err(refuse(format!("is not mapped at {va:#x}"))),
            Some(first) if first != va => {
                return Err(refuse(format!(
                    "starts inside the mapping at {first:#x} and would split it"
                )))
            }
            _ => {}
        }
        if reached < end {
            return Err(refuse(format!("is not mapped at {reached:#x}")));
        }
        if reached > end {
            return Err(refuse(format!(
                "ends inside the mapping [{last:#x}, {reached:#x}) and would split it"
            )));
        }
        Ok(())
    }

    /// Forgets the mappings of `[va, va + size)`, a run checked by [`Books::check_unmap`]; a
    /// released handle whose last mapping goes is freed and credited.
    pub(crate) fn remove_mappings(&mut self, va: u64, size: u64) {
        let g = self.granularity;
        let end = va.saturating_add(size);
        let mut at = va;
        while at < end {
            let Some(Granule::Start(m)) = self.granules.remove(&at) else {
                debug_assert!(false, "unmap of a run not checked");
                break;
            };
            self.mappings -= 1;
            let mut inside = at + g;
            at += m.size;
            while inside < at {
                self.granules.remove(&inside);
                inside += g;
            }
            let Some(record) = self.handles.get_mut(&m.handle) else {
                continue;
            };
            record.mappings -= 1;
            if record.released && record.mappings == 0 {
                self.charged -= record.size;
                self.handles.remove(&m.handle);
            }
        }
    }

    // ---- teardown ---------------------------------------------------------------------

    /// Empties the books, returning what was still held (memory files are closed).
    pub(crate) fn take_all(&mut self) -> Leftovers {
        let handles = self.handles.values().filter(|h| !h.released).count();
        let left = Leftovers {
            allocations: self
                .allocations
                .drain()
                .map(|(ptr, r)| (ptr, r.size))
                .collect(),
            reservations: std::mem::take(&mut self.reservations).into_iter().collect(),
            mappings: self.mappings,
            handles,
            released_mapped: self.handles.len() - handles,
            bytes: self.charged,
        };
        self.granules.clear();
        self.mappings = 0;
        self.handles.clear();
        self.charged = 0;
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    fn books() -> Books {
        Books::new(64 * G, G)
    }

    #[test]
    fn unmap_runs_must_be_whole_and_contiguous() {
        let mut b = books();
        let base = 1 << 40;
        b.insert_reservation(base, 16 * G);
        let h = b.insert_handle(8 * G, None);
        for i in 0..3 {
            b.check_map(base + 2 * i * G, 2 * G, h, 2 * i * G).unwrap();
            b.insert_mapping(base + 2 * i * G, 2 * G, h);
        }
        // Whole run of three mappings.
        b.check_unmap(base, 6 * G).unwrap();
        // Splits: starting or ending inside a mapping.
        assert!(b.check_unmap(base + G, 2 * G).is_err());
        assert!(b.check_unmap(base, 3 * G).is_err());
        // Past the run.
        assert!(b.check_unmap(base, 8 * G).is_err());
        // set_access may cover parts of mappings but no holes.
        b.check_set_access(base + G, 4 * G).unwrap();
        assert!(b.check_set_access(base + 4 * G, 4 * G).is_err());
        assert!(b.check_set_access(base + 8 * G, G).is_err());
        b.remove_mappings(base, 6 * G);
        assert_eq!(b.census().mappings, 0);
        b.release(h).unwrap();
        assert_eq!(
            b.census(),
            HostCensus {
                reservations: 1,
                ..HostCensus::default()
            }
        );
    }

    #[test]
    fn released_handle_lives_until_unmapped() {
        let mut b = books();
        b.insert_reservation(1 << 40, 4 * G);
        let h = b.insert_handle(2 * G, None);
        b.insert_mapping(1 << 40, 2 * G, h);
        b.release(h).unwrap();
        assert_eq!(b.free_bytes(), 62 * G);
        assert!(b.release(h).is_err());
        assert!(b.check_map(1 << 40, 2 * G, h, 0).is_err());
        b.remove_mappings(1 << 40, 2 * G);
        assert_eq!(b.free_bytes(), 64 * G);
        assert_eq!(b.census().physical_handles, 0);
    }
}
