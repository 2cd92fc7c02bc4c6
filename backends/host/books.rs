//! The books of a host device: what it has handed out, and every validation rule.
//!
//! Both modes (real memory and simulated) keep exactly these books and run exactly these
//! checks; only the step between "checked" and "recorded" differs (system calls, or
//! nothing). Every operation is split into a `check_*` that refuses bad input without
//! changing anything and an `insert_*` / `remove_*` that records the result, so an OS failure
//! in between leaves the books untouched.

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

/// Granules per page of a reservation's slot table (`2^PAGE_SHIFT`).
const PAGE_SHIFT: u32 = 9;
/// Granules per page.
const PAGE: usize = 1 << PAGE_SHIFT;
/// Pages with an index below this live in a vector (at most 512 KiB of pointers); the pages
/// of a reservation larger than `DENSE_PAGES * PAGE` granules beyond that go to a hash map,
/// so no reservation, however large, costs more than the pages it has mapped.
const DENSE_PAGES: u64 = 1 << 16;

/// What the books know about one granule of a reservation.
///
/// Invariant (kept by `Books::insert_mapping` / `Books::remove_mappings`, checked by
/// `Books::check_invariants`): a granule is mapped exactly when `handle != 0`; then `link`
/// is non-zero, and the granules of one mapping are `n` consecutive slots of one reservation
/// with the same `handle`, the first holding `link = n` and the `k`-th after it
/// `link = -k`. An unmapped granule is `Slot::default()` (so it has no access either).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    /// The handle mapped here; 0 when nothing is (handle ids start at 1).
    handle: u64,
    /// At a mapping's first granule: its length in granules (> 0). At its other granules:
    /// minus their distance in granules from the first (< 0). 0 when unmapped.
    link: i64,
    /// Read-write access was granted to this granule (`set_access`) since it was mapped: what
    /// a copy needs (the real mode's `mprotect` made its pages readable and writable).
    access: bool,
}

/// A reservation's granule slots, indexed by granule number from its base, in pages made
/// on first use (a reservation of terabytes that maps a few granules costs a few pages).
#[derive(Debug, Default)]
struct Slots {
    /// Page `p < DENSE_PAGES` (grown on demand to the highest page written).
    near: Vec<Option<Box<[Slot]>>>,
    /// Page `p >= DENSE_PAGES`.
    far: FxHashMap<u64, Box<[Slot]>>,
}

impl Slots {
    /// The slot of granule `i` (unmapped if its page was never made).
    #[inline]
    fn get(&self, i: u64) -> Slot {
        let (p, o) = (i >> PAGE_SHIFT, i as usize & (PAGE - 1));
        let page = if p < DENSE_PAGES {
            self.near.get(p as usize).and_then(Option::as_deref)
        } else {
            self.far.get(&p).map(|b| &**b)
        };
        page.map_or(Slot::default(), |page| page[o])
    }

    /// Writes the slot of granule `i`, making its page if needed.
    #[inline]
    fn set(&mut self, i: u64, slot: Slot) {
        let (p, o) = (i >> PAGE_SHIFT, i as usize & (PAGE - 1));
        let fresh = || vec![Slot::default(); PAGE].into_boxed_slice();
        let page = if p < DENSE_PAGES {
            let p = p as usize;
            if p >= self.near.len() {
                self.near.resize_with(p + 1, || None);
            }
            self.near[p].get_or_insert_with(fresh)
        } else {
            self.far.entry(p).or_insert_with(fresh)
        };
        page[o] = slot;
    }

    /// Every page made, with the number of its first granule.
    #[cfg(test)]
    fn pages(&self) -> impl Iterator<Item = (u64, &[Slot])> {
        let near = self
            .near
            .iter()
            .enumerate()
            .filter_map(|(p, page)| Some(((p as u64) << PAGE_SHIFT, page.as_deref()?)));
        let far = self.far.iter().map(|(&p, page)| (p << PAGE_SHIFT, &**page));
        near.chain(far)
    }
}

/// A live reservation.
#[derive(Debug)]
struct Reservation {
    base: u64,
    size: u64,
    /// Invariant: the number of mappings in it (slots with `link > 0`); each mapping lies in
    /// one reservation, so this is what `free_reservation` must find zero.
    mappings: usize,
    /// Its granules, numbered from `base`.
    slots: Slots,
}

impl Reservation {
    fn end(&self) -> u64 {
        self.base + self.size
    }
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

/// The live physical handles, in a slab: a handle's id names its slot, so finding its record
/// is one indexed read (a hash map's probe was the costliest read of an unmap, the call a
/// stitching allocator makes most).
///
/// An id's low 32 bits are its slot + 1 (never 0: a granule slot's `handle == 0` means
/// unmapped), its high 32 bits the slot's generation, raised each time the slot is reused,
/// so that a released handle's id stays unknown after its slot holds another (until the
/// generation wraps, after 2^32 reuses of one slot). The first handles made get ids 1, 2, 3…
#[derive(Debug, Default)]
struct HandleSlab {
    /// Invariant: `entries[i].0 & 0xffff_ffff == i + 1`; the record is `None` exactly for the
    /// slots listed in `vacant`, and then `.0` is the id it last held.
    entries: Vec<(u64, Option<HandleRecord>)>,
    /// Vacant slots, reused last in, first out.
    vacant: Vec<u32>,
}

impl HandleSlab {
    /// Stores `record` and returns its new id.
    ///
    /// # Time complexity
    /// `O(1)` amortised.
    fn insert(&mut self, record: HandleRecord) -> u64 {
        if let Some(slot) = self.vacant.pop() {
            let entry = &mut self.entries[slot as usize];
            entry.0 = entry.0.wrapping_add(1 << 32);
            entry.1 = Some(record);
            return entry.0;
        }
        let id = self.entries.len() as u64 + 1;
        self.entries.push((id, Some(record)));
        id
    }

    /// The slot an id names.
    #[inline]
    fn slot(id: u64) -> usize {
        (id as u32).wrapping_sub(1) as usize
    }

    /// The record of a live handle.
    ///
    /// # Time complexity
    /// `O(1)`.
    fn get(&self, id: u64) -> Option<&HandleRecord> {
        match self.entries.get(Self::slot(id)) {
            Some((held, record)) if *held == id => record.as_ref(),
            _ => None,
        }
    }

    /// [`HandleSlab::get`], mutable.
    #[inline]
    fn get_mut(&mut self, id: u64) -> Option<&mut HandleRecord> {
        match self.entries.get_mut(Self::slot(id)) {
            Some((held, record)) if *held == id => record.as_mut(),
            _ => None,
        }
    }

    /// Forgets a live handle; its slot is reused next.
    ///
    /// # Time complexity
    /// `O(1)`.
    fn remove(&mut self, id: u64) {
        let slot = Self::slot(id);
        if let Some((held, record)) = self.entries.get_mut(slot) {
            if *held == id && record.take().is_some() {
                self.vacant.push(slot as u32);
            }
        }
    }

    /// The live handles' number: every slot but the vacant ones.
    fn len(&self) -> usize {
        self.entries.len() - self.vacant.len()
    }

    /// The live handles, as `(id, record)`.
    fn iter(&self) -> impl Iterator<Item = (u64, &HandleRecord)> {
        self.entries
            .iter()
            .filter_map(|(id, record)| Some((*id, record.as_ref()?)))
    }

    /// Checks the invariants stated on the fields.
    #[cfg(test)]
    fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut vacant = vec![false; self.entries.len()];
        for &v in &self.vacant {
            match vacant.get_mut(v as usize) {
                Some(seen) if !*seen => *seen = true,
                _ => {
                    return Err(format!(
                        "handle slot {v} listed vacant twice or out of range"
                    ))
                }
            }
        }
        for (i, (id, record)) in self.entries.iter().enumerate() {
            if *id & 0xffff_ffff != i as u64 + 1 || record.is_none() != vacant[i] {
                return Err(format!("handle slot {i}: id {id:#x}, vacant {}", vacant[i]));
            }
        }
        Ok(())
    }
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
    /// `log2(granularity)` (the granularity is a power of two).
    shift: u32,
    /// The live reservations. Invariant: sorted by base, none overlapping another. Each
    /// holds the slots of its granules, so every question about a range is answered by one
    /// binary search over the (few) reservations and then array reads: one per granule, or
    /// one per mapping when walking a run of mappings. Mappings never overlap, as each
    /// granule has one slot.
    reservations: Vec<Reservation>,
    /// Invariant: the sum of the reservations' `mappings`.
    mappings: usize,
    /// Invariant: each record's `mappings` is the number of mappings of that handle, and a
    /// released handle is kept only while that is non-zero.
    handles: HandleSlab,
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
            shift: granularity.trailing_zeros(),
            reservations: Vec::new(),
            mappings: 0,
            handles: HandleSlab::default(),
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

    /// What the device holds now, except streams, events and pinned host memory.
    pub(crate) fn census(&self) -> HostCensus {
        HostCensus {
            allocations: self.allocations.len() as u64,
            bytes_in_use: self.charged,
            physical_handles: self.handles.len() as u64,
            mappings: self.mappings as u64,
            reservations: self.reservations.len() as u64,
            ..HostCensus::default()
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

    /// Where the device memory of a copy (`call`) lies among the plain allocations (the
    /// stream-ordered pool's segments among them): `None` when none holds `va`; else whether
    /// `[va, va + size)` stays inside it.
    ///
    /// # Errors
    /// `InvalidArgument` naming the range and the allocation it runs past.
    ///
    /// # Time complexity
    /// `O(1)` for a range from an allocation's start, `O(allocations)` for one inside.
    pub(crate) fn check_copy_allocated(
        &self,
        call: &'static str,
        va: u64,
        size: u64,
    ) -> Option<Result<()>> {
        let (start, record) = match self.allocations.get(&va) {
            Some(record) => (va, record),
            None => self
                .allocations
                .iter()
                .find(|(&start, a)| start <= va && va - start < a.size)
                .map(|(&start, a)| (start, a))?,
        };
        let end = start + record.size;
        if va.checked_add(size).is_some_and(|e| e <= end) {
            return Some(Ok(()));
        }
        Some(Err(Error::InvalidArgument {
            call,
            reason: format!(
                "device memory [{va:#x}, +{}) runs past the end of the allocation [{start:#x}, \
                 {end:#x}); accepted is a range inside one allocation",
                show(size)
            ),
        }))
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

    /// Checks the address hint of `reserve_at(size, _, addr)` (`align` from
    /// [`Books::check_reserve`]); returns it when a reservation may be tried there: non-zero,
    /// a multiple of `align`, and clear of every live reservation. `None`: reserve anywhere.
    ///
    /// # Errors
    /// `InvalidArgument` for an address that is not a multiple of the granularity.
    ///
    /// # Time complexity
    /// `O(log reservations)`.
    pub(crate) fn check_reserve_hint(
        &self,
        size: u64,
        align: u64,
        addr: u64,
    ) -> Result<Option<u64>> {
        self.granular("reserve_at", "address", addr, false)?;
        if addr == 0 || addr % align != 0 {
            return Ok(None);
        }
        let Some(end) = addr.checked_add(size) else {
            return Ok(None);
        };
        let i = self.reservations.partition_point(|r| r.base < end);
        let clear = i == 0 || self.reservations[i - 1].end() <= addr;
        Ok(clear.then_some(addr))
    }

    /// Records a reservation checked by [`Books::check_reserve`] (the address space gives
    /// none that overlaps a live one).
    ///
    /// # Time complexity
    /// `O(reservations)` (an insertion into a sorted vector).
    pub(crate) fn insert_reservation(&mut self, va: u64, size: u64) {
        let i = self.reservations.partition_point(|r| r.base < va);
        debug_assert!(
            self.reservations
                .get(i)
                .map_or(true, |r| va + size <= r.base)
                && (i == 0 || self.reservations[i - 1].end() <= va),
            "reservations overlap"
        );
        self.reservations.insert(
            i,
            Reservation {
                base: va,
                size,
                mappings: 0,
                slots: Slots::default(),
            },
        );
    }

    /// The index of the reservation holding the address `va`.
    ///
    /// # Time complexity
    /// `O(log reservations)`.
    #[inline]
    fn reservation_at(&self, va: u64) -> Option<usize> {
        let i = self.reservations.partition_point(|r| r.base <= va);
        let r = i.checked_sub(1)?;
        (va < self.reservations[r].end()).then_some(r)
    }

    /// The index of the reservation starting at `va`.
    fn reservation_starting(&self, va: u64) -> Option<usize> {
        self.reservations.binary_search_by_key(&va, |r| r.base).ok()
    }

    /// Checks `free_reservation(va, size)`.
    ///
    /// # Errors
    /// `UnknownPointer` when no reservation starts at `va`; `InvalidArgument` when `size` is
    /// not the reserved size or something is still mapped in it.
    pub(crate) fn check_free_reservation(&self, va: u64, size: u64) -> Result<()> {
        let r = self.reservation_starting(va).ok_or(Error::UnknownPointer {
            what: "reservation",
            ptr: va,
            backend: BACKEND,
        })?;
        let reserved = self.reservations[r].size;
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
        let inside = self.reservations[r].mappings;
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

    /// Forgets a reservation checked by [`Books::check_free_reservation`] (and its slots).
    ///
    /// # Time complexity
    /// `O(reservations)` plus its pages.
    pub(crate) fn remove_reservation(&mut self, va: u64) {
        if let Some(r) = self.reservation_starting(va) {
            self.reservations.remove(r);
        }
    }

    /// The index of the reservation that holds all of `[va, va + size)`.
    fn reservation_holding(&self, va: u64, size: u64) -> Option<usize> {
        let r = self.reservation_at(va)?;
        let end = va.checked_add(size)?;
        (end <= self.reservations[r].end()).then_some(r)
    }

    /// The slot of the granule at `at` in reservation `r` (which holds `at`).
    #[inline]
    fn slot(&self, r: usize, at: u64) -> Slot {
        let res = &self.reservations[r];
        res.slots.get((at - res.base) >> self.shift)
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
        self.charged += size;
        PhysicalHandle(self.handles.insert(HandleRecord {
            size,
            released: false,
            mappings: 0,
            fd,
        }))
    }

    /// The memory file of a live handle (real mode), for export.
    ///
    /// # Errors
    /// `UnknownPointer` for a handle not made here or released already.
    pub(crate) fn handle_file(&self, handle: PhysicalHandle) -> Result<Option<&OwnedFd>> {
        self.handles
            .get(handle.0)
            .filter(|h| !h.released)
            .map(|h| h.fd.as_ref())
            .ok_or_else(|| Self::unknown_handle(handle.0))
    }

    /// The size a live plain allocation at `ptr` was made with.
    pub(crate) fn allocation_size(&self, ptr: u64) -> Option<u64> {
        self.allocations.get(&ptr).map(|r| r.size)
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
            .get_mut(handle.0)
            .filter(|h| !h.released)
            .ok_or_else(|| Self::unknown_handle(handle.0))?;
        record.released = true;
        record.fd = None;
        if record.mappings == 0 {
            self.charged -= record.size;
            self.handles.remove(handle.0);
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
    #[cfg(test)]
    pub(crate) fn check_map(
        &self,
        va: u64,
        size: u64,
        handle: PhysicalHandle,
        offset: u64,
    ) -> Result<Option<&OwnedFd>> {
        let place = self.map_place(va, size, offset)?;
        let record = self.handles.get(handle.0);
        Self::map_within(record, handle, offset, size)?;
        place?;
        Ok(record.and_then(|h| h.fd.as_ref()))
    }

    /// Checks and records `map(va, size, handle, offset)`: `os` (real mode's `mmap` of the
    /// handle's memory file) runs between the check and the record, and its error leaves the
    /// books untouched. One search of the reservations and one lookup of the handle serve
    /// both.
    ///
    /// # Errors
    /// Those of [`Books::check_map`], in the same order; then `os`'s.
    ///
    /// # Time complexity
    /// `O(log reservations + granules)` of the mapping.
    pub(crate) fn map(
        &mut self,
        va: u64,
        size: u64,
        handle: PhysicalHandle,
        offset: u64,
        os: impl FnOnce(Option<&OwnedFd>) -> Result<()>,
    ) -> Result<()> {
        let place = self.map_place(va, size, offset)?;
        let record = self.handles.get_mut(handle.0);
        Self::map_within(record.as_deref(), handle, offset, size)?;
        let r = place?;
        // `map_within` refused a missing or released handle.
        let Some(record) = record else {
            return Err(Self::unknown_handle(handle.0));
        };
        os(record.fd.as_ref())?;
        record.mappings += 1;
        self.insert_slots(r, va, size, handle);
        Ok(())
    }

    /// The checks of `map` on the arguments' granularity (returned at once: they come first)
    /// and on the range: the reservation holding it and not mapped there, or the error saying
    /// why not, returned inside for the caller to report after the handle's.
    fn map_place(&self, va: u64, size: u64, offset: u64) -> Result<Result<usize>> {
        self.granular("map", "address", va, false)?;
        self.granular("map", "size", size, true)?;
        self.granular("map", "offset", offset, false)?;
        let Some(r) = self.reservation_holding(va, size) else {
            return Ok(Err(Error::InvalidArgument {
                call: "map",
                reason: format!(
                    "[{va:#x}, +{}) is not inside one reservation; accepted is a range within \
                     a single range returned by reserve",
                    show(size)
                ),
            }));
        };
        let end = va + size;
        // The overlapping mapping named is the one over the highest mapped granule of the
        // range (the last mapping starting below its end).
        let g = self.granularity;
        let mut at = end;
        while at > va {
            at -= g;
            if let Some((start, m_size)) = self.mapping_over(r, at) {
                return Ok(Err(Error::InvalidArgument {
                    call: "map",
                    reason: format!(
                        "[{va:#x}, {end:#x}) overlaps the mapping at [{start:#x}, {:#x}); unmap \
                         it first",
                        start + m_size
                    ),
                }));
            }
        }
        Ok(Ok(r))
    }

    /// The checks of `map` on the handle: live, and `[offset, offset + size)` within it.
    fn map_within(
        record: Option<&HandleRecord>,
        handle: PhysicalHandle,
        offset: u64,
        size: u64,
    ) -> Result<()> {
        let record = record
            .filter(|h| !h.released)
            .ok_or_else(|| Self::unknown_handle(handle.0))?;
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
        Ok(())
    }

    /// The mapping covering the granule at `at` of reservation `r`, as `(start, size)`.
    ///
    /// # Time complexity
    /// `O(1)`: at most two slot reads.
    #[inline]
    fn mapping_over(&self, r: usize, at: u64) -> Option<(u64, u64)> {
        let s = self.slot(r, at);
        match s.link {
            0 => None,
            n if n > 0 => Some((at, (n as u64) << self.shift)),
            back => {
                let start = at - ((back.unsigned_abs()) << self.shift);
                let n = self.slot(r, start).link;
                debug_assert!(n > 0, "an inner granule names no first granule");
                Some((start, (n as u64) << self.shift))
            }
        }
    }

    /// Records a mapping checked by [`Books::check_map`].
    ///
    /// # Time complexity
    /// `O(log reservations + granules)` of the mapping.
    #[cfg(test)]
    pub(crate) fn insert_mapping(&mut self, va: u64, size: u64, handle: PhysicalHandle) {
        let Some(r) = self.reservation_holding(va, size) else {
            debug_assert!(false, "map outside a reservation not checked");
            return;
        };
        if let Some(record) = self.handles.get_mut(handle.0) {
            record.mappings += 1;
        }
        self.insert_slots(r, va, size, handle);
    }

    /// Records the slots of a mapping of `handle` at `[va, va + size)`, which lies in
    /// reservation `r`, and counts it (the handle's own count is the caller's).
    ///
    /// # Time complexity
    /// `O(granules)` of the mapping.
    fn insert_slots(&mut self, r: usize, va: u64, size: u64, handle: PhysicalHandle) {
        debug_assert!(
            self.reservation_holding(va, size) == Some(r),
            "map outside the reservation checked"
        );
        let shift = self.shift;
        let res = &mut self.reservations[r];
        let first = (va - res.base) >> shift;
        let n = size >> shift;
        res.slots.set(
            first,
            Slot {
                handle: handle.0,
                link: n as i64,
                access: false,
            },
        );
        for k in 1..n {
            res.slots.set(
                first + k,
                Slot {
                    handle: handle.0,
                    link: -(k as i64),
                    access: false,
                },
            );
        }
        res.mappings += 1;
        self.mappings += 1;
    }

    /// Walks the mappings that cover `[va, va + size)` (`va` granule-aligned), in address
    /// order, as long as they follow each other without a gap (into an adjacent reservation
    /// too). Returns the run: the start of the first and of the last mapping touched (`None`
    /// when nothing covers `va`), and where the covered run ends (which may be short of, or
    /// past, `va + size`).
    ///
    /// # Time complexity
    /// `O(log reservations)` plus one slot read per mapping walked.
    fn covering_run(&self, va: u64, size: u64) -> Run {
        let end = va.saturating_add(size);
        let none = Run {
            first: None,
            last: va,
            reached: va,
        };
        let Some(mut r) = self.reservation_at(va) else {
            return none;
        };
        let Some((first, m_size)) = self.mapping_over(r, va) else {
            return none;
        };
        let mut last = first;
        let mut reached = first + m_size;
        // The reservation walked, held across the loop (the walk reads one slot per mapping).
        let mut res = &self.reservations[r];
        while reached < end {
            if reached >= res.end() {
                // Mappings end inside their reservation: the run goes on only into one that
                // starts right here.
                match self.reservations.get(r + 1) {
                    Some(next) if next.base == reached => {
                        r += 1;
                        res = next;
                    }
                    _ => break,
                }
            }
            match res.slots.get((reached - res.base) >> self.shift).link {
                n if n > 0 => {
                    last = reached;
                    reached += (n as u64) << self.shift;
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

    /// Records that `set_access(va, size)`, checked by [`Books::check_set_access`], granted
    /// access: every granule of the range is accessible until it is unmapped.
    ///
    /// # Time complexity
    /// `O(log reservations + granules)` of the range.
    pub(crate) fn grant_access(&mut self, va: u64, size: u64) {
        let (g, shift) = (self.granularity, self.shift);
        let end = va.saturating_add(size);
        let mut at = va;
        while at < end {
            let Some(r) = self.reservation_at(at) else {
                debug_assert!(false, "set_access of a range not checked");
                return;
            };
            let res = &mut self.reservations[r];
            let stop = end.min(res.end());
            while at < stop {
                let i = (at - res.base) >> shift;
                let slot = res.slots.get(i);
                debug_assert!(slot.handle != 0, "set_access of a granule not mapped");
                if !slot.access {
                    res.slots.set(
                        i,
                        Slot {
                            access: true,
                            ..slot
                        },
                    );
                }
                at += g;
            }
        }
    }

    /// Where the device memory of a copy (`call`) lies: `None` when no reservation holds
    /// `va`; else whether every byte of `[va, va + size)` (`size` > 0, any alignment) is
    /// mapped with access granted — through adjacent reservations too, as a run of mappings
    /// may be.
    ///
    /// # Errors
    /// `InvalidArgument` naming the range and the first address not mapped, or mapped without
    /// access, or past the reservations.
    ///
    /// # Time complexity
    /// `O(log reservations + granules)` of the range.
    pub(crate) fn check_copy_mapped(
        &self,
        call: &'static str,
        va: u64,
        size: u64,
    ) -> Option<Result<()>> {
        let g = self.granularity;
        let mut r = self.reservation_at(va)?;
        let end = va.saturating_add(size);
        let refuse = |at: u64, why: &str| {
            Err(Error::InvalidArgument {
                call,
                reason: format!(
                    "device memory [{va:#x}, {end:#x}) {why} at {at:#x}; accepted is memory of \
                     this device mapped with access granted (set_access) or a live allocation"
                ),
            })
        };
        if size == 0 || end - va != size {
            return Some(refuse(va, "runs past the end of the address space"));
        }
        let mut at = va & !(g - 1);
        while at < end {
            if at >= self.reservations[r].end() {
                match self.reservations.get(r + 1) {
                    Some(next) if next.base == at => r += 1,
                    _ => return Some(refuse(at.max(va), "runs past its reservation")),
                }
            }
            let slot = self.slot(r, at);
            if slot.handle == 0 {
                return Some(refuse(at.max(va), "is not mapped"));
            }
            if !slot.access {
                return Some(refuse(at.max(va), "is mapped without access"));
            }
            at += g;
        }
        Some(Ok(()))
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
    ///
    /// # Time complexity
    /// `O(log reservations + granules)` of the run.
    pub(crate) fn remove_mappings(&mut self, va: u64, size: u64) {
        let shift = self.shift;
        let end = va.saturating_add(size);
        let Some(mut r) = self.reservation_at(va) else {
            debug_assert!(false, "unmap of a run not checked");
            return;
        };
        let mut at = va;
        while at < end {
            if at >= self.reservations[r].end() {
                r += 1;
                if self.reservations.get(r).map_or(true, |res| res.base != at) {
                    debug_assert!(false, "unmap of a run not checked");
                    return;
                }
            }
            let res = &mut self.reservations[r];
            let first = (at - res.base) >> shift;
            let Slot { handle, link, .. } = res.slots.get(first);
            if link <= 0 {
                debug_assert!(false, "unmap of a run not checked");
                return;
            }
            let n = link as u64;
            for k in 0..n {
                res.slots.set(first + k, Slot::default());
            }
            res.mappings -= 1;
            self.mappings -= 1;
            at += n << shift;
            let Some(record) = self.handles.get_mut(handle) else {
                continue;
            };
            record.mappings -= 1;
            if record.released && record.mappings == 0 {
                self.charged -= record.size;
                self.handles.remove(handle);
            }
        }
    }

    // ---- invariants -------------------------------------------------------------------

    /// Checks every invariant stated on the fields, exactly: the reservations sorted and
    /// apart, each slot's encoding, the mapping counts (per reservation, in all, per handle),
    /// released handles kept only while mapped, and the bytes charged.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) -> std::result::Result<(), String> {
        let g = self.granularity;
        if self.shift != g.trailing_zeros() || !g.is_power_of_two() {
            return Err(format!("shift {} for granularity {g}", self.shift));
        }
        let mut per_handle: FxHashMap<u64, u64> = FxHashMap::default();
        let mut total = 0;
        for (i, res) in self.reservations.iter().enumerate() {
            if res.size == 0 || res.base % g != 0 || res.size % g != 0 {
                return Err(format!(
                    "reservation {:#x}+{} not granular",
                    res.base, res.size
                ));
            }
            if i > 0 && self.reservations[i - 1].end() > res.base {
                return Err(format!(
                    "reservation {:#x} out of order or overlapping",
                    res.base
                ));
            }
            let granules = res.size >> self.shift;
            if res.slots.near.len() as u64 > DENSE_PAGES
                || res.slots.far.keys().any(|&p| p < DENSE_PAGES)
            {
                return Err(format!(
                    "reservation {:#x}: a page in the wrong table",
                    res.base
                ));
            }
            let mut starts = 0;
            for (first, page) in res.slots.pages() {
                for (o, &slot) in page.iter().enumerate() {
                    let at = first + o as u64;
                    let bad = |why: &str| {
                        Err(format!(
                            "reservation {:#x}, granule {at}: {why} ({slot:?})",
                            res.base
                        ))
                    };
                    if slot == Slot::default() {
                        continue;
                    }
                    if slot.handle == 0 || slot.link == 0 || at >= granules {
                        return bad("neither unmapped nor mapped");
                    }
                    if slot.link > 0 {
                        let n = slot.link as u64;
                        if at + n > granules {
                            return bad("mapping runs past the reservation");
                        }
                        let tail = (1..n).all(|k| {
                            let inner = res.slots.get(at + k);
                            (inner.handle, inner.link) == (slot.handle, -(k as i64))
                        });
                        if !tail {
                            return bad("a mapping's inner granules do not name it");
                        }
                        starts += 1;
                        *per_handle.entry(slot.handle).or_insert(0) += 1;
                    } else {
                        let back = slot.link.unsigned_abs();
                        let Some(start) = at.checked_sub(back) else {
                            return bad("points before the reservation");
                        };
                        let head = res.slots.get(start);
                        if head.link <= back as i64 || head.handle != slot.handle {
                            return bad("inner granule of no mapping");
                        }
                    }
                }
            }
            if starts != res.mappings {
                return Err(format!(
                    "reservation {:#x}: {starts} mappings, counted {}",
                    res.base, res.mappings
                ));
            }
            total += starts;
        }
        if total != self.mappings {
            return Err(format!("{total} mappings, counted {}", self.mappings));
        }
        let mut charged = self.allocations.values().map(|a| a.charged).sum::<u64>();
        self.handles.check_invariants()?;
        for (id, h) in self.handles.iter() {
            let mapped = per_handle.remove(&id).unwrap_or(0);
            if mapped != h.mappings || (h.released && mapped == 0) {
                return Err(format!(
                    "handle {id}: {mapped} mappings, counted {} (released {})",
                    h.mappings, h.released
                ));
            }
            charged += h.size;
        }
        if let Some((id, _)) = per_handle.into_iter().next() {
            return Err(format!(
                "mappings of handle {id}, which the books do not hold"
            ));
        }
        if charged != self.charged {
            return Err(format!("{charged} bytes held, charged {}", self.charged));
        }
        Ok(())
    }

    // ---- teardown ---------------------------------------------------------------------

    /// Empties the books, returning what was still held (memory files are closed).
    pub(crate) fn take_all(&mut self) -> Leftovers {
        let handles = self.handles.iter().filter(|(_, h)| !h.released).count();
        let left = Leftovers {
            allocations: self
                .allocations
                .drain()
                .map(|(ptr, r)| (ptr, r.size))
                .collect(),
            reservations: std::mem::take(&mut self.reservations)
                .into_iter()
                .map(|r| (r.base, r.size))
                .collect(),
            mappings: self.mappings,
            handles,
            released_mapped: self.handles.len() - handles,
            bytes: self.charged,
        };
        self.mappings = 0;
        self.handles = HandleSlab::default();
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
        b.check_invariants().unwrap();
        b.remove_mappings(base, 6 * G);
        b.check_invariants().unwrap();
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
    fn a_map_the_os_refuses_leaves_the_books_untouched() {
        let mut b = books();
        b.insert_reservation(1 << 40, 4 * G);
        let h = b.insert_handle(2 * G, None);
        let before = b.census();
        let refused = b.map(1 << 40, 2 * G, h, 0, |fd| {
            assert!(fd.is_none(), "no memory file was given");
            Err(Error::Os {
                call: "mmap",
                source: std::io::Error::from_raw_os_error(libc::ENOMEM),
            })
        });
        assert!(matches!(refused, Err(Error::Os { call: "mmap", .. })));
        assert_eq!(b.census(), before);
        b.check_invariants().unwrap();
        // Nothing is mapped there: the same map goes through, and then overlaps.
        b.map(1 << 40, 2 * G, h, 0, |_| Ok(())).unwrap();
        assert_eq!(b.census().mappings, 1);
        let err = b.map(1 << 40, 2 * G, h, 0, |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("overlaps the mapping"), "{err}");
        b.check_invariants().unwrap();
    }

    #[test]
    fn a_released_handle_stays_unknown_when_its_slot_is_reused() {
        let mut b = books();
        b.insert_reservation(1 << 40, 4 * G);
        let first = b.insert_handle(G, None);
        assert_eq!(
            first,
            PhysicalHandle(1),
            "the first handles are numbered 1, 2, 3…"
        );
        b.release(first).unwrap();
        let second = b.insert_handle(2 * G, None);
        assert_ne!(second, first, "the reused slot gets a new generation");
        assert!(matches!(
            b.release(first),
            Err(Error::UnknownPointer { .. })
        ));
        assert!(matches!(
            b.check_map(1 << 40, G, first, 0),
            Err(Error::UnknownPointer { .. })
        ));
        // The new handle is whole: it maps over all of its 2 granules.
        b.insert_mapping(1 << 40, 2 * G, second);
        b.check_invariants().unwrap();
        // Ids that name no slot, or slot 0's wrap-around, are unknown too.
        for forged in [0, u64::MAX, 1 << 32, 77] {
            assert!(b.release(PhysicalHandle(forged)).is_err(), "{forged:#x}");
        }
        assert_eq!(b.census().physical_handles, 1);
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
        b.check_invariants().unwrap();
        b.remove_mappings(1 << 40, 2 * G);
        b.check_invariants().unwrap();
        assert_eq!(b.free_bytes(), 64 * G);
        assert_eq!(b.census().physical_handles, 0);
    }

    #[test]
    fn runs_continue_into_an_adjacent_reservation_only() {
        let mut b = books();
        let (first, second) = (1 << 40, (1 << 40) + 2 * G);
        b.insert_reservation(first, 2 * G);
        b.insert_reservation(second, 2 * G);
        b.insert_reservation(second + 4 * G, 2 * G);
        let h = b.insert_handle(6 * G, None);
        for (k, va) in [first, second, second + 4 * G].into_iter().enumerate() {
            b.check_map(va, 2 * G, h, 2 * k as u64 * G).unwrap();
            b.insert_mapping(va, 2 * G, h);
        }
        // A mapping may not span two reservations, but a run of mappings may.
        assert!(b.check_map(first + G, 2 * G, h, 0).is_err());
        b.check_set_access(first + G, 2 * G).unwrap();
        b.check_unmap(first, 4 * G).unwrap();
        // The third reservation is not adjacent: the run stops at the gap.
        let err = b.check_set_access(first, 8 * G).unwrap_err().to_string();
        assert!(
            err.contains(&format!("nothing is mapped at {:#x}", second + 2 * G)),
            "{err}"
        );
        b.remove_mappings(first, 4 * G);
        b.check_invariants().unwrap();
        assert_eq!(b.census().mappings, 1);
        b.check_free_reservation(first, 2 * G).unwrap();
        assert!(b.check_free_reservation(second + 4 * G, 2 * G).is_err());
    }

    #[test]
    fn copies_need_every_byte_mapped_with_access() {
        let mut b = books();
        let (first, second) = (1 << 40, (1 << 40) + 4 * G);
        b.insert_reservation(first, 4 * G);
        b.insert_reservation(second, 2 * G);
        let h = b.insert_handle(6 * G, None);
        for (va, offset) in [(first, 0), (first + G, G), (second, 2 * G)] {
            b.map(va, G, h, offset, |_| Ok(())).unwrap();
        }
        // Outside every reservation: not the reservations' to answer.
        assert!(b.check_copy_mapped("c", 1 << 39, 10).is_none());
        // Mapped, but no access yet.
        let err = b
            .check_copy_mapped("c", first + 5, 10)
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("mapped without access"), "{err}");
        b.check_set_access(first, 2 * G).unwrap();
        b.grant_access(first, 2 * G);
        b.check_invariants().unwrap();
        // Any alignment, across two mappings of one reservation.
        b.check_copy_mapped("c", first + 7, G + 100)
            .unwrap()
            .unwrap();
        // Into the unmapped rest of the reservation.
        let err = b
            .check_copy_mapped("c", first + G, 2 * G)
            .unwrap()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("is not mapped at {:#x}", first + 2 * G)),
            "{err}"
        );
        // Across into an adjacent reservation: the run goes on there, with access granted.
        b.map(first + 2 * G, 2 * G, h, 3 * G, |_| Ok(())).unwrap();
        b.map(second + G, G, h, 0, |_| Ok(())).unwrap();
        for (va, size) in [(first + 2 * G, 2 * G), (second, 2 * G)] {
            b.check_set_access(va, size).unwrap();
            b.grant_access(va, size);
        }
        b.check_invariants().unwrap();
        b.check_copy_mapped("c", first + 3 * G, 2 * G)
            .unwrap()
            .unwrap();
        b.check_copy_mapped("c", first, 6 * G).unwrap().unwrap();
        // Past the last reservation's end, where nothing is reserved.
        let err = b
            .check_copy_mapped("c", second + 2 * G - 1, 2)
            .unwrap()
            .unwrap_err();
        assert!(
            err.to_string().contains("runs past its reservation"),
            "{err}"
        );
        // Unmapping takes the access away; mapping again starts without it.
        b.check_unmap(first + G, G).unwrap();
        b.remove_mappings(first + G, G);
        b.map(first + G, G, h, G, |_| Ok(())).unwrap();
        b.check_invariants().unwrap();
        b.check_copy_mapped("c", first, G).unwrap().unwrap();
        let err = b.check_copy_mapped("c", first, G + 1).unwrap().unwrap_err();
        assert!(err.to_string().contains("mapped without access"), "{err}");
    }

    #[test]
    fn copies_stay_inside_one_allocation() {
        let mut b = books();
        b.insert_alloc(0x1000_0000, 5000, 5120);
        b.insert_alloc(0x2000_0000, 100, 256);
        b.check_copy_allocated("c", 0x1000_0000, 5000)
            .unwrap()
            .unwrap();
        b.check_copy_allocated("c", 0x1000_0000 + 4999, 1)
            .unwrap()
            .unwrap();
        let err = b
            .check_copy_allocated("c", 0x1000_0000 + 4999, 2)
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("runs past the end"), "{err}");
        assert!(b.check_copy_allocated("c", 0x1000_0000 + 5000, 1).is_none());
        assert!(b.check_copy_allocated("c", 0x3000_0000, 1).is_none());
    }

    #[test]
    fn huge_reservations_keep_far_granules_in_the_hash_pages() {
        // 4 KiB granules: a 1 TiB reservation has 2^28 granules, past the dense pages.
        let g = 4096;
        let mut b = Books::new(1 << 30, g);
        let base = 1 << 44;
        let size = 1 << 40;
        b.insert_reservation(base, size);
        let h = b.insert_handle(4 * g, None);
        for va in [base, base + size / 2, base + size - 2 * g] {
            b.check_map(va, 2 * g, h, 0).unwrap();
            b.insert_mapping(va, 2 * g, h);
            b.check_set_access(va, 2 * g).unwrap();
            assert!(b.check_map(va + g, g, h, 0).is_err());
        }
        b.check_invariants().unwrap();
        let res = &b.reservations[0];
        assert_eq!(res.slots.far.len(), 2);
        assert_eq!(res.slots.near.iter().flatten().count(), 1);
        for va in [base, base + size / 2, base + size - 2 * g] {
            b.check_unmap(va, 2 * g).unwrap();
            b.remove_mappings(va, 2 * g);
        }
        b.check_invariants().unwrap();
        b.check_free_reservation(base, size).unwrap();
    }

    /// The simple model: mappings as a list, every question answered by scanning it.
    #[derive(Debug, Default)]
    struct Model {
        reservations: Vec<(u64, u64)>,
        /// `(va, size, handle)`.
        mappings: Vec<(u64, u64, u64)>,
        /// `(handle, size, released)`.
        handles: Vec<(u64, u64, bool)>,
        /// Granules granted access since they were mapped.
        access: std::collections::BTreeSet<u64>,
    }

    impl Model {
        fn mapping_at(&self, at: u64) -> Option<(u64, u64, u64)> {
            self.mappings
                .iter()
                .copied()
                .find(|&(va, size, _)| va <= at && at < va + size)
        }

        fn map_ok(&self, va: u64, size: u64, handle: u64, offset: u64) -> bool {
            let live = self
                .handles
                .iter()
                .any(|&(h, hs, released)| h == handle && !released && offset + size <= hs);
            let inside = self
                .reservations
                .iter()
                .any(|&(b, s)| b <= va && va + size <= b + s);
            let free = (va..va + size)
                .step_by(G as usize)
                .all(|at| self.mapping_at(at).is_none());
            live && inside && free
        }

        fn covered(&self, va: u64, size: u64) -> bool {
            (va..va + size)
                .step_by(G as usize)
                .all(|at| self.mapping_at(at).is_some())
        }

        fn unmap_ok(&self, va: u64, size: u64) -> bool {
            self.covered(va, size)
                && self.mappings.iter().all(|&(m, ms, _)| {
                    m + ms <= va || va + size <= m || (va <= m && m + ms <= va + size)
                })
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Reserve(u64),
        FreeReservation(usize),
        Create(u64),
        Release(usize),
        Map(u64, u64, usize, u64),
        SetAccess(u64, u64),
        Unmap(u64, u64),
        /// A copy from granule `.0`, `.1` bytes in, of `.2` quarter granules and a byte.
        Copy(u64, u64, u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            2 => (1..6u64).prop_map(Op::Reserve),
            1 => (0..4usize).prop_map(Op::FreeReservation),
            2 => (2..6u64).prop_map(Op::Create),
            1 => (0..6usize).prop_map(Op::Release),
            6 => (0..24u64, 1..4u64, 0..4usize, 0..2u64)
                .prop_map(|(a, s, h, o)| Op::Map(a, s, h, o)),
            2 => (0..24u64, 1..6u64).prop_map(|(a, s)| Op::SetAccess(a, s)),
            3 => (0..24u64, 1..6u64).prop_map(|(a, s)| Op::Unmap(a, s)),
            3 => (0..26u64, 0..G, 0..12u64).prop_map(|(a, o, n)| Op::Copy(a, o, n)),
        ]
    }

    proptest::proptest! {
        /// Every check accepts exactly what the list model accepts, mappings of several
        /// granules and runs across adjacent reservations included; the invariants hold after
        /// every step, and the census agrees with the model.
        #[test]
        fn books_agree_with_a_list_model(ops in proptest::collection::vec(op(), 1..120)) {
            let mut b = Books::new(64 * G, G);
            let mut m = Model::default();
            // Reservations are handed out back to back, so runs can cross from one into
            // the next; addresses are granules from `base`.
            let base = 1u64 << 40;
            let mut cursor = base;
            let mut ids = Vec::new();
            for op in ops {
                match op {
                    Op::Reserve(n) => {
                        if cursor + n * G <= base + 24 * G {
                            b.check_reserve(n * G, 0).unwrap();
                            b.insert_reservation(cursor, n * G);
                            m.reservations.push((cursor, n * G));
                            cursor += n * G;
                        }
                    }
                    Op::FreeReservation(i) => {
                        if let Some(&(va, size)) = m.reservations.get(i) {
                            let ok = !m.mappings.iter().any(|&(a, _, _)| va <= a && a < va + size);
                            proptest::prop_assert_eq!(b.check_free_reservation(va, size).is_ok(), ok);
                            if ok {
                                b.remove_reservation(va);
                                m.reservations.remove(i);
                            }
                        }
                    }
                    Op::Create(n) => {
                        let h = b.insert_handle(n * G, None);
                        m.handles.push((h.0, n * G, false));
                        ids.push(h.0);
                    }
                    Op::Release(i) => {
                        if let Some(&id) = ids.get(i) {
                            let live = m.handles.iter().any(|&(h, _, r)| h == id && !r);
                            proptest::prop_assert_eq!(b.release(PhysicalHandle(id)).is_ok(), live);
                            if let Some(e) = m.handles.iter_mut().find(|e| e.0 == id) {
                                e.2 = true;
                            }
                            let mapped = m.mappings.iter().any(|&(_, _, h)| h == id);
                            m.handles.retain(|&(h, _, r)| h != id || !r || mapped);
                        }
                    }
                    Op::Map(a, n, i, o) => {
                        let id = ids.get(i).copied().unwrap_or(999);
                        let (va, size, offset) = (base + a * G, n * G, o * G);
                        let ok = m.map_ok(va, size, id, offset);
                        let checked = b
                            .check_map(va, size, PhysicalHandle(id), offset)
                            .map(|_| ())
                            .map_err(|e| e.to_string());
                        proptest::prop_assert_eq!(checked.is_ok(), ok, "map {:#x}+{}", va, size);
                        // The device's path (check and record in one) refuses with the same
                        // error, and records what check_map accepts (alternately through
                        // insert_mapping, which the other tests use).
                        if !ok || a % 2 == 0 {
                            let got = b
                                .map(va, size, PhysicalHandle(id), offset, |_| Ok(()))
                                .map_err(|e| e.to_string());
                            proptest::prop_assert_eq!(got, checked);
                        } else {
                            b.insert_mapping(va, size, PhysicalHandle(id));
                        }
                        if ok {
                            m.mappings.push((va, size, id));
                        }
                    }
                    Op::SetAccess(a, n) => {
                        let (va, size) = (base + a * G, n * G);
                        let ok = m.covered(va, size);
                        proptest::prop_assert_eq!(b.check_set_access(va, size).is_ok(), ok);
                        if ok {
                            b.grant_access(va, size);
                            m.access.extend((va..va + size).step_by(G as usize));
                        }
                    }
                    Op::Copy(a, o, n) => {
                        let (va, size) = (base + a * G + o, n * G / 4 + 1);
                        let reserved = m.reservations.iter().any(|&(r, rs)| r <= va && va < r + rs);
                        let first = va - va % G;
                        let accessible = (first..va + size)
                            .step_by(G as usize)
                            .all(|g| m.access.contains(&g));
                        let got = b.check_copy_mapped("copy", va, size).map(|r| r.is_ok());
                        proptest::prop_assert_eq!(
                            got,
                            reserved.then_some(accessible),
                            "copy {:#x}+{}", va, size
                        );
                    }
                    Op::Unmap(a, n) => {
                        let (va, size) = (base + a * G, n * G);
                        let ok = m.unmap_ok(va, size);
                        proptest::prop_assert_eq!(b.check_unmap(va, size).is_ok(), ok);
                        if ok {
                            b.remove_mappings(va, size);
                            m.access.retain(|&g| g < va || g >= va + size);
                            m.mappings.retain(|&(v, _, _)| v < va || v >= va + size);
                            m.handles.retain(|&(h, _, r)| {
                                !r || m.mappings.iter().any(|&(_, _, mh)| mh == h)
                            });
                        }
                    }
                }
                proptest::prop_assert_eq!(b.check_invariants(), Ok(()));
                let census = b.census();
                proptest::prop_assert_eq!(census.mappings, m.mappings.len() as u64);
                proptest::prop_assert_eq!(census.reservations, m.reservations.len() as u64);
                proptest::prop_assert_eq!(census.physical_handles, m.handles.len() as u64);
                let held: u64 = m.handles.iter().map(|&(_, s, _)| s).sum();
                proptest::prop_assert_eq!(census.bytes_in_use, held);
            }
        }
    }
}
