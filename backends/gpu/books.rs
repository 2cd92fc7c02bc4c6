//! What a GPU device keeps about the memory and handles portalloc took from its driver:
//! the driver keeps the truth, these books say what portalloc asked for and has not given
//! back, so a pointer or handle it never handed out (or a wrong size) is refused before the
//! driver sees it, and leak checks can count what is live. The rules are the host backend's
//! (`backends/host/books.rs`): sizes and addresses are non-zero multiples of the
//! granularity, a mapping lies inside one reservation, an unmap covers whole mappings, a
//! reservation is freed whole with nothing mapped in it.
//!
//! Every `claim_*` checks and changes the books in one step (under the books lock), so two
//! threads cannot both pass a check for the same pointer; the caller then makes the driver
//! call without the lock and `restore_*`s what it claimed when the driver refuses.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::device::{Event, Stream};
use crate::error::{Error, Result};
use crate::units::Bytes;

/// What a GPU device holds now, from its own books.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VendorCensus {
    /// Live plain allocations (`cuMemAlloc`, `hipMalloc` / `hipExtMallocWithFlags`).
    pub allocations: u64,
    /// Live allocations from the device's stream-ordered pool.
    pub pool_allocations: u64,
    /// Physical handles not released.
    pub physical_handles: u64,
    /// Address reservations not freed.
    pub reservations: u64,
    /// Live mappings.
    pub mappings: u64,
    /// Live streams (the default stream not counted).
    pub streams: u64,
    /// Live events.
    pub events: u64,
    /// Live pinned host memory allocations (`cuMemHostAlloc`, `hipHostMalloc`) and host
    /// memory registered (`cuMemHostRegister_v2`, `hipHostRegister`).
    pub pinned_host: u64,
}

impl VendorCensus {
    /// True when the device holds nothing.
    pub fn is_empty(&self) -> bool {
        *self == VendorCensus::default()
    }
}

/// Memory portalloc holds from the driver.
#[derive(Debug, Default)]
pub(crate) struct Books {
    /// Plain allocation pointer → size.
    pub(crate) allocations: HashMap<u64, u64>,
    /// Pool pointer → size.
    pub(crate) pool_allocations: HashMap<u64, u64>,
    /// Physical handles not released.
    pub(crate) handles: HashSet<u64>,
    /// Reservation start → size.
    pub(crate) reservations: BTreeMap<u64, u64>,
    /// Mapping start → size.
    pub(crate) mappings: BTreeMap<u64, u64>,
    /// The mapped ranges this device was granted read-write access to (`set_access`), merged;
    /// cut back when they are unmapped.
    pub(crate) access: Ranges,
    /// Pinned host memory address → size asked for.
    pub(crate) pinned_host: HashMap<u64, u64>,
    /// Host memory registered (page-locked in place) address → size.
    pub(crate) registered_host: HashMap<u64, u64>,
    /// Other processes' allocations opened here (legacy IPC): address → (size, opens).
    pub(crate) opened_ipc: HashMap<u64, (u64, u32)>,
}

/// Disjoint, non-adjacent ranges of addresses: start → end (exclusive), merged on insert.
#[derive(Debug, Default)]
pub(crate) struct Ranges(BTreeMap<u64, u64>);

impl Ranges {
    /// Adds `[start, end)`, merged with the ranges it overlaps or touches.
    pub(crate) fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&s, &e)) = self.0.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
            }
        }
        let touched: Vec<u64> = self.0.range(start..=end).map(|(&s, _)| s).collect();
        for s in touched {
            if let Some(e) = self.0.remove(&s) {
                end = end.max(e);
            }
        }
        self.0.insert(start, end);
    }

    /// Takes `[start, end)` out; returns the pieces that were in, for [`Ranges::insert`] to put
    /// back.
    pub(crate) fn remove(&mut self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut taken = Vec::new();
        if start >= end {
            return taken;
        }
        let first = self
            .0
            .range(..start)
            .next_back()
            .filter(|&(_, &e)| e > start)
            .map(|(&s, _)| s);
        let overlapping: Vec<u64> = first
            .into_iter()
            .chain(self.0.range(start..end).map(|(&s, _)| s))
            .collect();
        for s in overlapping {
            let Some(e) = self.0.remove(&s) else { continue };
            if s < start {
                self.0.insert(s, start);
            }
            if e > end {
                self.0.insert(end, e);
            }
            taken.push((s.max(start), e.min(end)));
        }
        taken
    }

    /// The first address of `[start, end)` not in a range; `None` when all of it is.
    pub(crate) fn first_gap(&self, start: u64, end: u64) -> Option<u64> {
        match self.0.range(..=start).next_back() {
            Some((_, &e)) if e >= end => None,
            Some((_, &e)) if e > start => Some(e),
            _ => Some(start),
        }
    }
}

/// What [`Books::claim_unmap`] took out of the books: the mappings and the access granted
/// over them.
#[derive(Debug)]
pub(crate) struct Unmapped {
    pub(crate) mappings: Vec<(u64, u64)>,
    pub(crate) access: Vec<(u64, u64)>,
}

/// Streams and events handed out: the driver dereferences these handles, so only ones in
/// these sets are passed to it.
#[derive(Debug, Default)]
pub(crate) struct Handles {
    pub(crate) streams: HashSet<u64>,
    /// Event → the calls using it now. An event is passed to the driver only while a call
    /// holds a use of it, so one destroyed meanwhile is *doomed* and goes with its last user.
    pub(crate) events: HashMap<u64, EventUse>,
}

/// The calls using one event now, and whether it was destroyed meanwhile.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct EventUse {
    users: u32,
    doomed: bool,
}

/// A pointer or handle the device did not hand out (or gave back already).
pub(crate) fn unknown(backend: &'static str, what: &'static str, ptr: u64) -> Error {
    Error::UnknownPointer { what, ptr, backend }
}

fn invalid(call: &'static str, reason: String) -> Error {
    Error::InvalidArgument { call, reason }
}

/// Checks that `value` is a multiple of `granularity`, and not zero unless `zero_ok`.
pub(crate) fn check_granular(
    granularity: u64,
    call: &'static str,
    what: &str,
    value: u64,
    zero_ok: bool,
) -> Result<()> {
    if (value == 0 && !zero_ok) || value % granularity != 0 {
        return Err(invalid(
            call,
            format!(
                "{what} {value:#x} is not accepted: it must be a {}multiple of the device's \
                 granularity ({}, {granularity} bytes)",
                if zero_ok { "" } else { "non-zero " },
                Bytes(granularity),
            ),
        ));
    }
    Ok(())
}

/// Takes `ptr` out of `books` (pointer → size), refusing an unknown pointer or a size that is
/// not the one booked. `(call, what, verb)` name the call, the thing and how it was made, for
/// the messages.
fn claim_sized(
    books: &mut HashMap<u64, u64>,
    backend: &'static str,
    (call, what, verb): (&'static str, &'static str, &str),
    ptr: u64,
    size: u64,
) -> Result<()> {
    let held = *books.get(&ptr).ok_or_else(|| unknown(backend, what, ptr))?;
    if held != size {
        return Err(invalid(
            call,
            format!(
                "{what} {ptr:#x} was {verb} with {held} bytes, not {size}; accepted is the size \
                 it was allocated with"
            ),
        ));
    }
    books.remove(&ptr);
    Ok(())
}

impl Books {
    /// Takes a plain allocation out of the books, refusing an unknown pointer or a size that
    /// is not the allocation's.
    pub(crate) fn claim_allocation(
        &mut self,
        backend: &'static str,
        ptr: u64,
        size: u64,
    ) -> Result<()> {
        claim_sized(
            &mut self.allocations,
            backend,
            ("free", "allocation", "made"),
            ptr,
            size,
        )
    }

    /// Books a reservation the driver just made at `va` (wherever it is: an address hint
    /// honoured, or one freed before and made again); `Some((start, size))` of the live
    /// reservation it overlaps instead, booking nothing.
    pub(crate) fn book_reservation(&mut self, va: u64, size: u64) -> Option<(u64, u64)> {
        let end = va.saturating_add(size);
        if let Some((&start, &len)) = self
            .reservations
            .range(..end)
            .next_back()
            .filter(|(&start, &len)| start.saturating_add(len) > va)
        {
            return Some((start, len));
        }
        self.reservations.insert(va, size);
        None
    }

    /// Takes a whole reservation with nothing mapped in it out of the books.
    pub(crate) fn claim_reservation(
        &mut self,
        backend: &'static str,
        va: u64,
        size: u64,
    ) -> Result<()> {
        match self.reservations.get(&va) {
            None => return Err(unknown(backend, "reservation", va)),
            Some(&held) if held != size => {
                return Err(invalid(
                    "free_reservation",
                    format!(
                        "the reservation at {va:#x} is {held} bytes, not {size}: it is freed whole"
                    ),
                ))
            }
            Some(_) => {}
        }
        if self
            .mappings
            .range(va..va.saturating_add(size))
            .next()
            .is_some()
        {
            return Err(invalid(
                "free_reservation",
                format!("the reservation at {va:#x} still has mappings; unmap them first"),
            ));
        }
        self.reservations.remove(&va);
        Ok(())
    }

    /// Takes pinned host memory out of the books, refusing an unknown pointer or a size that
    /// is not the allocation's.
    pub(crate) fn claim_pinned_host(
        &mut self,
        backend: &'static str,
        ptr: u64,
        size: u64,
    ) -> Result<()> {
        let what = ("free_pinned_host", "pinned host memory", "allocated");
        claim_sized(&mut self.pinned_host, backend, what, ptr, size)
    }

    /// Takes registered host memory out of the books, refusing an unknown pointer or a size
    /// that is not the one registered.
    pub(crate) fn claim_registered_host(
        &mut self,
        backend: &'static str,
        ptr: u64,
        size: u64,
    ) -> Result<()> {
        let what = ("unregister_host", "registered host memory", "registered");
        claim_sized(&mut self.registered_host, backend, what, ptr, size)
    }

    /// Takes a physical handle out of the books.
    pub(crate) fn claim_handle(&mut self, backend: &'static str, handle: u64) -> Result<()> {
        if self.handles.remove(&handle) {
            Ok(())
        } else {
            Err(unknown(backend, "physical handle", handle))
        }
    }

    /// Books a mapping of `[va, va + size)` onto a known handle: the range must lie inside one
    /// reservation of this device and overlap no mapping.
    pub(crate) fn claim_mapping(
        &mut self,
        backend: &'static str,
        va: u64,
        size: u64,
        handle: u64,
    ) -> Result<()> {
        if !self.handles.contains(&handle) {
            return Err(unknown(backend, "physical handle", handle));
        }
        let end = va.saturating_add(size);
        let inside = self
            .reservations
            .range(..=va)
            .next_back()
            .is_some_and(|(&start, &len)| end <= start.saturating_add(len));
        let overlaps = self
            .mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&start, &len)| start.saturating_add(len) > va);
        if !inside || overlaps {
            return Err(invalid(
                "map",
                format!(
                    "[{va:#x}, {end:#x}) is not accepted: {}",
                    if inside {
                        "it overlaps a mapping of this device"
                    } else {
                        "it is not inside one reservation of this device"
                    }
                ),
            ));
        }
        self.mappings.insert(va, size);
        Ok(())
    }

    /// The starts of the mappings that cover `[va, va + size)` without a gap, from `va`'s own
    /// mapping on, and the address the run reaches.
    fn covering_run(&self, va: u64, size: u64) -> (Vec<u64>, u64) {
        let end = va.saturating_add(size);
        let mut starts = Vec::new();
        let mut reached = va;
        if let Some((&start, &len)) = self.mappings.range(..=va).next_back() {
            if start.saturating_add(len) > va {
                starts.push(start);
                reached = start.saturating_add(len);
            }
        }
        if starts.is_empty() {
            return (starts, reached);
        }
        for (&start, &len) in self.mappings.range(va.saturating_add(1)..end) {
            if start != reached {
                break;
            }
            starts.push(start);
            reached = start.saturating_add(len);
        }
        (starts, reached)
    }

    /// Checks that every byte of `[va, va + size)` is mapped by this device.
    pub(crate) fn check_mapped(&self, va: u64, size: u64) -> Result<()> {
        let end = va.saturating_add(size);
        let (_, reached) = self.covering_run(va, size);
        if reached < end {
            return Err(invalid(
                "set_access",
                format!(
                    "[{va:#x}, {end:#x}) is not entirely mapped: nothing is mapped at {reached:#x}; \
                     accepted is a range covered by this device's mappings"
                ),
            ));
        }
        Ok(())
    }

    /// Takes the mappings that make up exactly `[va, va + size)` out of the books (and the
    /// access granted over them), refusing a range that is not a run of whole mappings.
    /// Returns them, for [`Books::restore_mappings`].
    pub(crate) fn claim_unmap(&mut self, va: u64, size: u64) -> Result<Unmapped> {
        let end = va.saturating_add(size);
        let (starts, reached) = self.covering_run(va, size);
        if starts.first() != Some(&va) || reached != end {
            return Err(invalid(
                "unmap",
                format!(
                    "[{va:#x}, {end:#x}) is not exactly a run of whole mappings of this device"
                ),
            ));
        }
        let mappings = starts
            .into_iter()
            .filter_map(|start| self.mappings.remove_entry(&start))
            .collect();
        let access = self.access.remove(va, end);
        Ok(Unmapped { mappings, access })
    }

    /// Puts back what [`Books::claim_unmap`] took, after the driver refused the unmap.
    pub(crate) fn restore_mappings(&mut self, unmapped: Unmapped) {
        self.mappings.extend(unmapped.mappings);
        for (start, end) in unmapped.access {
            self.access.insert(start, end);
        }
    }

    /// Where the device memory of a copy (`call`, `size` > 0) lies: inside one live plain or
    /// pool allocation, or in mapped memory this device was granted access to. Checked before
    /// the driver sees the range.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] (`what = "device memory"`) for a range that starts in no
    /// memory of this device; [`Error::InvalidArgument`] for one that runs past its
    /// allocation, past its mappings, or into a part without access.
    ///
    /// # Time complexity
    /// `O(1)` for a range from an allocation's start, `O(allocations)` for one inside, else
    /// `O(log mappings)` plus the mappings it covers.
    pub(crate) fn check_copy(
        &self,
        backend: &'static str,
        call: &'static str,
        va: u64,
        size: u64,
    ) -> Result<()> {
        let end = va.saturating_add(size);
        let refuse = |why: String| {
            invalid(
                call,
                format!(
                    "device memory [{va:#x}, {end:#x}) {why}; accepted is a range inside one \
                     allocation of this device, or mapped by it with access granted"
                ),
            )
        };
        if end - va != size {
            return Err(refuse("runs past the end of the address space".into()));
        }
        let holding = |map: &HashMap<u64, u64>| {
            map.get_key_value(&va)
                .or_else(|| map.iter().find(|(&p, &n)| p <= va && va - p < n))
                .map(|(&p, &n)| (p, p + n))
        };
        let opened = || {
            self.opened_ipc
                .iter()
                .find(|(&p, &(n, _))| p <= va && va - p < n)
                .map(|(&p, &(n, _))| (p, p + n))
        };
        if let Some((start, stop)) = holding(&self.allocations)
            .or_else(|| holding(&self.pool_allocations))
            .or_else(opened)
        {
            if end > stop {
                return Err(refuse(format!(
                    "runs past the end of the allocation [{start:#x}, {stop:#x})"
                )));
            }
            return Ok(());
        }
        let (starts, reached) = self.covering_run(va, size);
        if starts.is_empty() {
            return Err(unknown(backend, "device memory", va));
        }
        if reached < end {
            return Err(refuse(format!("is not mapped at {reached:#x}")));
        }
        if let Some(gap) = self.access.first_gap(va, end) {
            return Err(refuse(format!(
                "is mapped without access at {gap:#x} (set_access grants it)"
            )));
        }
        Ok(())
    }
}

impl Handles {
    /// Takes a stream this device made (the only ones [`crate::Device::destroy_stream`]
    /// takes) out of the set.
    pub(crate) fn claim_stream(&mut self, backend: &'static str, stream: Stream) -> Result<u64> {
        if self.streams.remove(&stream.0) {
            Ok(stream.0)
        } else {
            Err(unknown(backend, "stream", stream.0))
        }
    }

    /// Takes one use of an event this device made and did not destroy.
    pub(crate) fn borrow_event(&mut self, backend: &'static str, event: Event) -> Result<u64> {
        match self.events.get_mut(&event.0) {
            Some(u) if !u.doomed => {
                u.users += 1;
                Ok(event.0)
            }
            _ => Err(unknown(backend, "event", event.0)),
        }
    }

    /// Gives back a use [`Handles::borrow_event`] took. True when the event was destroyed
    /// meanwhile and this was its last user: it is out of the set, for the caller to destroy.
    pub(crate) fn return_event(&mut self, event: u64) -> bool {
        let Some(u) = self.events.get_mut(&event) else {
            return false;
        };
        u.users -= 1;
        let last = u.doomed && u.users == 0;
        if last {
            self.events.remove(&event);
        }
        last
    }

    /// A request to destroy an event this device made: true when no call uses it (it is out
    /// of the set, for the caller to destroy now), false when it is doomed and goes with its
    /// last user.
    pub(crate) fn claim_event(&mut self, backend: &'static str, event: Event) -> Result<bool> {
        match self.events.get_mut(&event.0) {
            Some(u) if !u.doomed && u.users > 0 => {
                u.doomed = true;
                Ok(false)
            }
            Some(u) if !u.doomed => {
                self.events.remove(&event.0);
                Ok(true)
            }
            _ => Err(unknown(backend, "event", event.0)),
        }
    }

    /// What the device's stream and event sets hold, for the census.
    pub(crate) fn count(&self) -> (u64, u64) {
        (self.streams.len() as u64, self.events.len() as u64)
    }
}

impl Books {
    /// The census of these books, with the stream and event counts of [`Handles::count`].
    pub(crate) fn census(&self, (streams, events): (u64, u64)) -> VendorCensus {
        VendorCensus {
            allocations: self.allocations.len() as u64,
            pool_allocations: self.pool_allocations.len() as u64,
            physical_handles: self.handles.len() as u64,
            reservations: self.reservations.len() as u64,
            mappings: self.mappings.len() as u64,
            streams,
            events,
            pinned_host: (self.pinned_host.len() + self.registered_host.len()) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handles_with_event(e: u64) -> Handles {
        let mut h = Handles::default();
        h.events.insert(e, EventUse::default());
        h
    }

    #[test]
    fn an_event_destroyed_while_in_use_goes_with_its_last_use() {
        let mut h = handles_with_event(7);
        assert_eq!(h.borrow_event("t", Event(7)).unwrap(), 7);
        assert_eq!(h.borrow_event("t", Event(7)).unwrap(), 7);
        // Destroyed while two calls use it: doomed, unknown to every later call.
        assert!(!h.claim_event("t", Event(7)).unwrap());
        assert!(h.borrow_event("t", Event(7)).is_err());
        assert!(h.claim_event("t", Event(7)).is_err());
        assert_eq!(h.count(), (0, 1), "still live until its last use ends");
        assert!(!h.return_event(7), "one use is left");
        assert!(h.return_event(7), "the last use destroys it");
        assert_eq!(h.count(), (0, 0));
    }

    #[test]
    fn an_event_nobody_uses_is_destroyed_at_once_and_only_once() {
        let mut h = handles_with_event(9);
        assert!(h.borrow_event("t", Event(9)).is_ok());
        assert!(!h.return_event(9), "not destroyed: nobody asked");
        assert!(h.claim_event("t", Event(9)).unwrap());
        assert!(matches!(
            h.claim_event("t", Event(9)),
            Err(Error::UnknownPointer { what: "event", .. })
        ));
    }

    #[test]
    fn ranges_merge_split_and_find_gaps() {
        let mut r = Ranges::default();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(20, 25); // touches the first: merged
        assert_eq!(
            r.0.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(),
            [(10, 25), (30, 40)]
        );
        assert_eq!(r.first_gap(12, 25), None);
        assert_eq!(r.first_gap(12, 26), Some(25));
        assert_eq!(r.first_gap(5, 12), Some(5));
        assert_eq!(r.first_gap(26, 28), Some(26));
        r.insert(5, 35); // swallows both
        assert_eq!(
            r.0.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(),
            [(5, 40)]
        );
        let taken = r.remove(10, 20);
        assert_eq!(taken, [(10, 20)]);
        assert_eq!(
            r.0.iter().map(|(&s, &e)| (s, e)).collect::<Vec<_>>(),
            [(5, 10), (20, 40)]
        );
        assert_eq!(r.remove(0, 100), [(5, 10), (20, 40)]);
        assert!(r.0.is_empty());
        for (s, e) in taken {
            r.insert(s, e);
        }
        assert_eq!(r.first_gap(10, 20), None);
    }

    #[test]
    fn copies_need_memory_of_the_device_with_access() {
        const G: u64 = 2 << 20;
        let mut b = Books::default();
        b.allocations.insert(0x1000, 5000);
        b.pool_allocations.insert(0x10_0000, 512);
        b.reservations.insert(1 << 40, 8 * G);
        b.handles.insert(1);
        b.claim_mapping("t", 1 << 40, G, 1).unwrap();
        b.claim_mapping("t", (1 << 40) + G, G, 1).unwrap();
        b.check_copy("t", "c", 0x1000 + 10, 4990).unwrap();
        b.check_copy("t", "c", 0x10_0000, 512).unwrap();
        let past = b.check_copy("t", "c", 0x1000 + 10, 4991).unwrap_err();
        assert!(
            past.to_string()
                .contains("runs past the end of the allocation"),
            "{past}"
        );
        assert!(matches!(
            b.check_copy("t", "c", 0x9000, 1),
            Err(Error::UnknownPointer {
                what: "device memory",
                ptr: 0x9000,
                ..
            })
        ));
        // Mapped, no access yet: refused; then granted over both mappings.
        let va = (1 << 40) + 3;
        let no_access = b.check_copy("t", "c", va, G).unwrap_err();
        assert!(
            no_access.to_string().contains("without access"),
            "{no_access}"
        );
        b.access.insert(1 << 40, (1 << 40) + 2 * G);
        b.check_copy("t", "c", va, G).unwrap();
        let unmapped = b.check_copy("t", "c", va, 2 * G).unwrap_err();
        assert!(
            unmapped.to_string().contains("is not mapped at"),
            "{unmapped}"
        );
        // Unmapping takes the access with it; a refused unmap puts it back.
        let claimed = b.claim_unmap((1 << 40) + G, G).unwrap();
        assert_eq!(claimed.access, [((1 << 40) + G, (1 << 40) + 2 * G)]);
        b.restore_mappings(claimed);
        b.check_copy("t", "c", va, G).unwrap();
        b.claim_unmap((1 << 40) + G, G).unwrap();
        b.claim_mapping("t", (1 << 40) + G, G, 1).unwrap();
        assert!(
            b.check_copy("t", "c", va, G).is_err(),
            "mapped again: no access"
        );
    }

    #[test]
    fn a_reservation_freed_is_booked_again_at_its_address_and_overlaps_are_refused() {
        const G: u64 = 2 << 20;
        let mut b = Books::default();
        assert_eq!(b.book_reservation(1 << 40, 4 * G), None);
        assert_eq!(b.book_reservation((1 << 40) + 4 * G, G), None, "adjacent");
        assert_eq!(
            b.book_reservation((1 << 40) + 2 * G, G),
            Some((1 << 40, 4 * G)),
            "inside the first"
        );
        assert_eq!(
            b.book_reservation((1 << 40) + 3 * G, 2 * G),
            Some(((1 << 40) + 4 * G, G)),
            "over both: the last one it overlaps"
        );
        assert_eq!(
            b.book_reservation((1 << 40) - G, 2 * G),
            Some((1 << 40, 4 * G)),
            "overlaps its start"
        );
        assert_eq!(b.reservations.len(), 2, "nothing booked for a refusal");
        b.claim_reservation("t", 1 << 40, 4 * G).unwrap();
        assert_eq!(b.book_reservation(1 << 40, 4 * G), None, "made again");
        assert_eq!(b.reservations.get(&(1 << 40)), Some(&(4 * G)));
    }

    #[test]
    fn unmap_claims_exactly_whole_runs_and_restores_them() {
        let mut b = Books::default();
        b.reservations.insert(0, 8 << 20);
        b.handles.insert(1);
        b.claim_mapping("t", 0, 2 << 20, 1).unwrap();
        b.claim_mapping("t", 2 << 20, 2 << 20, 1).unwrap();
        assert!(
            b.claim_mapping("t", 1 << 20, 2 << 20, 1).is_err(),
            "overlap"
        );
        assert!(
            b.claim_mapping("t", 6 << 20, 4 << 20, 1).is_err(),
            "past the reservation"
        );
        assert!(b.claim_unmap(0, 1 << 20).is_err(), "splits a mapping");
        assert!(
            b.claim_unmap(1 << 20, 3 << 20).is_err(),
            "starts inside a mapping"
        );
        assert!(b.check_mapped(0, 4 << 20).is_ok());
        assert!(b.check_mapped(0, 5 << 20).is_err());
        let claimed = b.claim_unmap(0, 4 << 20).unwrap();
        assert_eq!(claimed.mappings.len(), 2);
        assert!(b.mappings.is_empty());
        b.restore_mappings(claimed);
        assert_eq!(b.mappings.len(), 2);
        assert!(
            b.claim_reservation("t", 0, 8 << 20).is_err(),
            "still mapped"
        );
    }
}
