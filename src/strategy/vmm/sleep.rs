//! Sleep and wake: the device memory of a tag's live allocations handed back and taken again
//! at the same addresses (see [`VmmAllocator::sleep`]).
//!
//! A sleeping allocation stays in use in the address space — no other allocation is placed
//! over its range — but no longer touches its granules: those no awake chunk touches are
//! unmapped, and handles none of whose granules is mapped go back to the device. Its bytes,
//! where kept, are in a [`HostCopy`]. A wake backs its span again (idle memory, stitching,
//! new handles within the budget, as an allocation is backed), touches it, and copies the
//! bytes back.
//!
//! **Books.** A tagged allocation that is awake has no record of its own: its tag's
//! interned id is the label of its chunk in the address space ([`Space::set_label`]), the
//! record allocate and free touch anyway, so tagging costs a comparison or two of the tag
//! name on allocate (a hash only for a name not among the last few used) and a count on
//! free — no per-allocation map, which at hundreds of thousands of live allocations missed
//! the cache on every call. A sleep finds its tag's allocations by a pass over the chunks
//! (sleep is rare); only the chunks that sleep get a [`Tagged`] record (their tag, token and
//! host copy), and their label is [`ASLEEP`].
//!
//! Invariants (checked by [`Tags::check`] and the allocator's `check`):
//! * a chunk's label is 0 (untagged, free or a pending free), [`ASLEEP`], or the id of an
//!   interned name; each name's count is the number of chunks labelled with its id, never
//!   0, and the names and ids agree;
//! * the chunks labelled [`ASLEEP`] are exactly those of the `asleep` records, each in use
//!   under the record's token and of its size (so never a pending free);
//! * `asleep_bytes` and `host_bytes` are the sums over the sleeping records;
//! * a sleeping chunk touches no granule (the awake ones' touches are the physical counts).
#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::space::Space;
use super::VmmAllocator;
use crate::allocator::{Keep, SleepReport, SleepingTag};
use crate::backends::own_stream::OwnedStream;
use crate::backends::staging::HostCopy;
use crate::device::{Device, Stream};
use crate::error::{Error, Result};
use crate::units::Bytes;

/// A live allocation that sleeps.
#[derive(Debug)]
pub(super) struct Tagged {
    pub(super) tag: Arc<str>,
    /// The chunk's size (rounded).
    pub(super) size: u64,
    /// The chunk's token in the space.
    pub(super) token: u64,
    /// Its contents, where kept.
    pub(super) copy: Option<HostCopy>,
    /// Bytes of `copy`, from its start, that hold the contents: all of it once the sleep's
    /// copies are done; while they are under way (and when a sleep that failed part way is
    /// undone), what was copied so far — a wake fills no more than that, the rest of the
    /// allocation's bytes having stayed in its memory.
    pub(super) valid: u64,
}

/// The label of a sleeping chunk (no name has this id).
pub(super) const ASLEEP: u32 = u32::MAX;

/// Interned names tried before the hash map: a program tags most allocations with a few
/// names.
const RECENT: usize = 4;

/// An interned tag name and the chunks labelled with its id.
#[derive(Debug)]
struct Name {
    name: Arc<str>,
    /// Invariant: the chunks labelled with this name's id; never 0 (the name goes then).
    count: u64,
}

/// The tag books. See the module.
#[derive(Debug, Default)]
pub(super) struct Tags {
    /// The interned names, name `id` at index `id - 1` (id 0 is "no tag"); `None` where an
    /// id is vacant.
    names: Vec<Option<Name>>,
    /// Invariant: the id of every name in `names`, and nothing else.
    ids: FxHashMap<Arc<str>, u32>,
    /// The vacant ids.
    vacant: Vec<u32>,
    /// Ids of the names used last (0: none), tried before `ids`: each is checked against
    /// its name's bytes, so a stale one is only a miss.
    recent: [u32; RECENT],
    /// The entry of `recent` the next name found by hashing replaces.
    recent_next: usize,
    /// Invariant: the chunks labelled with a name (the awake tagged allocations).
    awake: u64,
    /// The sleeping allocations, by address.
    pub(super) asleep: FxHashMap<u64, Tagged>,
    /// Invariant: the sum of the sizes of the sleeping records.
    asleep_bytes: u64,
    /// Invariant: the sum of the lengths of the sleeping records' host copies.
    host_bytes: u64,
    /// Host copies of allocations woken, kept for the next sleep of allocations of the same
    /// sizes (pinned memory is slow to make: PyTorch's caching host allocator keeps its
    /// blocks too); freed by `trim` and the allocator's drop. None of them has a copy in
    /// flight (each was settled before it was kept).
    spare: Vec<HostCopy>,
    /// The address-space class of each tag that can sleep
    /// ([`crate::sleep_tags::declare_sleepable`]): its allocations get regions of their own,
    /// so they share no granule with another tag's. Kept for the allocator's life (the
    /// regions stay the tag's). Invariant: classes from [`FIRST_TAG_CLASS`], distinct.
    classes: FxHashMap<Arc<str>, usize>,
    /// Tags found not declared, while [`crate::sleep_tags::generation`] is `plain_generation`;
    /// at most [`PLAIN_CACHE`] of them.
    plain: FxHashSet<Arc<str>>,
    /// The declarations' generation `plain` was filled under.
    plain_generation: u64,
}

/// The first address-space class of a tag that can sleep: below it, the shared classes
/// (small and large requests, [`super::space::CLASSES`]) and [`RETIRED_CLASS`].
pub(super) const FIRST_TAG_CLASS: usize = super::space::CLASSES + 1;

/// The class of regions whose addresses could not be had again: never asked for.
pub(super) const RETIRED_CLASS: usize = super::space::CLASSES;

/// Most undeclared tag names remembered as such (a name per tensor must not grow the
/// books without bound; past it, the declarations are asked again).
const PLAIN_CACHE: usize = 4096;

impl Tags {
    /// The address-space class of `tag`'s allocations when it can sleep (its own, made at
    /// its first allocation), `None` for a tag kept only for the books (and the empty tag).
    ///
    /// # Time complexity
    /// One hash lookup for a tag seen before; nothing while no tag is declared.
    #[inline]
    pub(super) fn class_of(&mut self, tag: &str) -> Option<usize> {
        let generation = crate::sleep_tags::generation();
        if generation == 0 || tag.is_empty() {
            return None;
        }
        if let Some(&class) = self.classes.get(tag) {
            return Some(class);
        }
        if self.plain_generation == generation && self.plain.contains(tag) {
            return None;
        }
        self.class_of_new(tag, generation)
    }

    #[cold]
    fn class_of_new(&mut self, tag: &str, generation: u64) -> Option<usize> {
        if self.plain_generation != generation {
            self.plain.clear();
            self.plain_generation = generation;
        }
        if crate::sleep_tags::is_sleepable(tag) {
            let class = FIRST_TAG_CLASS + self.classes.len();
            self.classes.insert(Arc::from(tag), class);
            return Some(class);
        }
        if self.plain.len() >= PLAIN_CACHE {
            self.plain.clear();
        }
        self.plain.insert(Arc::from(tag));
        None
    }

    /// How many tags that can sleep have classes of their own here.
    pub(super) fn class_count(&self) -> usize {
        self.classes.len()
    }

    /// True when some chunk is tagged (awake or asleep): while none is, a free has no
    /// books to keep.
    #[inline]
    pub(super) fn any(&self) -> bool {
        self.awake != 0 || !self.asleep.is_empty()
    }

    /// The label of a chunk of `tag` (0 for the empty tag), counted: the caller labels a
    /// chunk with it.
    ///
    /// # Time complexity
    /// A comparison of `tag` with each of the last few names used (no hash); one hash
    /// lookup otherwise (and an allocation for a name not interned).
    #[inline]
    pub(super) fn acquire(&mut self, tag: &str) -> u32 {
        if tag.is_empty() {
            return 0;
        }
        for i in 0..RECENT {
            let id = self.recent[i];
            if id == 0 {
                continue;
            }
            if let Some(Some(n)) = self.names.get_mut(id as usize - 1) {
                if *n.name == *tag {
                    n.count += 1;
                    self.awake += 1;
                    return id;
                }
            }
        }
        self.acquire_hashed(tag)
    }

    /// [`Tags::acquire`] for a name not among the recent ones.
    #[inline(never)]
    fn acquire_hashed(&mut self, tag: &str) -> u32 {
        let id = match self.ids.get(tag) {
            Some(&id) => id,
            None => {
                let name: Arc<str> = Arc::from(tag);
                let id = match self.vacant.pop() {
                    Some(id) => id,
                    None => {
                        self.names.push(None);
                        // Fewer names than chunks, and fewer chunks than `u32::MAX`.
                        u32::try_from(self.names.len())
                            .ok()
                            .filter(|&id| id != ASLEEP)
                            .expect("fewer tag names than chunks")
                    }
                };
                self.names[id as usize - 1] = Some(Name {
                    name: Arc::clone(&name),
                    count: 0,
                });
                self.ids.insert(name, id);
                id
            }
        };
        if let Some(Some(n)) = self.names.get_mut(id as usize - 1) {
            n.count += 1;
        }
        self.awake += 1;
        self.recent[self.recent_next] = id;
        self.recent_next = (self.recent_next + 1) % RECENT;
        id
    }

    /// Uncounts a chunk labelled `id` (a name's id, not 0 or [`ASLEEP`]); the name goes with
    /// its last chunk (a name per tensor does not grow the books).
    ///
    /// # Time complexity
    /// `O(1)`; a hash removal for the name's last chunk.
    #[inline]
    pub(super) fn release(&mut self, id: u32) {
        let Some(Some(n)) = self.names.get_mut(id as usize - 1) else {
            debug_assert!(false, "label {id} names no tag");
            return;
        };
        n.count -= 1;
        self.awake -= 1;
        if n.count == 0 {
            self.forget(id);
        }
    }

    #[cold]
    fn forget(&mut self, id: u32) {
        if let Some(n) = self.names[id as usize - 1].take() {
            self.ids.remove(&*n.name);
            self.vacant.push(id);
        }
    }

    /// The shared name `tag`: the interned one, or a new one.
    fn shared(&self, tag: &str) -> Arc<str> {
        match self.ids.get(tag) {
            Some(&id) => match &self.names[id as usize - 1] {
                Some(n) => Arc::clone(&n.name),
                None => Arc::from(tag),
            },
            None => Arc::from(tag),
        }
    }

    /// The name of label `id` (a name's id).
    fn name(&self, id: u32) -> Option<&Arc<str>> {
        match self.names.get((id as usize).wrapping_sub(1)) {
            Some(Some(n)) => Some(&n.name),
            _ => None,
        }
    }

    /// Moves the live chunk `(addr, token)` to `tag` (a donation): an empty tag forgets an
    /// awake one's tag, as an untagged allocation carries none (a sleeping one keeps sleeping
    /// under its old tag, for its wake); an untagged one is labelled with `tag`. A sleeping
    /// chunk keeps sleeping, under its new tag. Nothing for a chunk not in use under `token`
    /// (or a pending free, which carries no tag).
    ///
    /// # Time complexity
    /// `O(1)` (a hash lookup for a sleeping chunk or a name not used lately).
    pub(super) fn retag(&mut self, space: &mut Space, addr: u64, token: u64, tag: &str) {
        let Some(label) = space.label(addr, token) else {
            return;
        };
        if label == ASLEEP {
            if tag.is_empty() {
                return;
            }
            let shared = self.shared(tag);
            if let Some(t) = self.asleep.get_mut(&addr).filter(|t| t.token == token) {
                if *t.tag != *tag {
                    t.tag = shared;
                }
            }
            return;
        }
        let new = self.acquire(tag);
        if label != 0 {
            self.release(label);
        }
        space.set_label(addr, token, new);
    }

    /// Takes the record of the sleeping chunk `(addr, token)` out, as it is freed.
    pub(super) fn remove_asleep(&mut self, addr: u64, token: u64) -> Option<Tagged> {
        if self.asleep.get(&addr)?.token != token {
            return None;
        }
        let t = self.asleep.remove(&addr)?;
        self.asleep_bytes -= t.size;
        self.host_bytes -= t.copy.as_ref().map_or(0, HostCopy::len);
        Some(t)
    }

    /// Puts the awake tagged chunk `(addr, token)` of `size` bytes to sleep in the books,
    /// with its host copy: labelled [`ASLEEP`], a record made. The copy back (nothing
    /// changed) when it is not an awake tagged chunk in use.
    fn put_to_sleep(
        &mut self,
        space: &mut Space,
        addr: u64,
        size: u64,
        token: u64,
        copy: Option<HostCopy>,
    ) -> std::result::Result<(), Option<HostCopy>> {
        let tag = match space.label(addr, token) {
            Some(label) if label != 0 && label != ASLEEP => match self.name(label) {
                Some(name) => (Arc::clone(name), label),
                None => return Err(copy),
            },
            _ => return Err(copy),
        };
        space.set_label(addr, token, ASLEEP);
        self.release(tag.1);
        self.asleep_bytes += size;
        let valid = copy.as_ref().map_or(0, HostCopy::len);
        self.host_bytes += valid;
        self.asleep.insert(
            addr,
            Tagged {
                tag: tag.0,
                size,
                token,
                copy,
                valid,
            },
        );
        Ok(())
    }

    /// Wakes the sleeping chunk at `addr` in the books: its record taken out, its chunk
    /// labelled with its tag again. Returns the record (its host copy).
    fn wake_one(&mut self, space: &mut Space, addr: u64) -> Option<Tagged> {
        let t = self.asleep.remove(&addr)?;
        self.asleep_bytes -= t.size;
        self.host_bytes -= t.copy.as_ref().map_or(0, HostCopy::len);
        let id = self.acquire(&t.tag);
        if space.set_label(addr, t.token, id).is_none() {
            debug_assert!(false, "a sleeping chunk is not in use");
            self.release(id);
        }
        Some(t)
    }

    /// The name of tag id `id`; `None` for 0 (no tag) or a vacant id.
    pub(super) fn name_of(&self, id: u32) -> Option<Arc<str>> {
        let i = (id as usize).checked_sub(1)?;
        self.names.get(i)?.as_ref().map(|n| Arc::clone(&n.name))
    }

    /// True when the chunk at `addr` sleeps.
    pub(super) fn is_asleep(&self, addr: u64) -> bool {
        !self.asleep.is_empty() && self.asleep.contains_key(&addr)
    }

    /// Bytes of the sleeping chunks.
    pub(super) fn asleep_bytes(&self) -> u64 {
        self.asleep_bytes
    }

    /// Bytes of their host copies.
    pub(super) fn host_bytes(&self) -> u64 {
        self.host_bytes
    }

    /// The awake chunks of `tag` as `(addr, size, token)`, ascending.
    ///
    /// # Time complexity
    /// `O(slots)` of the space (one pass over its chunk records) plus `O(k log k)` for the
    /// `k` found: a sleep is rare, and no allocate or free keeps a per-allocation record
    /// for it.
    fn awake_of(&self, space: &Space, tag: &str) -> Vec<(u64, u64, u64)> {
        let Some(&id) = self.ids.get(tag) else {
            return Vec::new();
        };
        let mut out: Vec<(u64, u64, u64)> = space
            .labelled()
            .filter(|&(.., label)| label == id)
            .map(|(addr, size, token, _)| (addr, size, token))
            .collect();
        out.sort_unstable();
        out
    }

    /// The addresses of the sleeping chunks of `tag`, ascending.
    ///
    /// # Time complexity
    /// `O(sleeping chunks)`.
    fn asleep_of(&self, tag: &str) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .asleep
            .iter()
            .filter(|(_, t)| &*t.tag == tag)
            .map(|(&a, _)| a)
            .collect();
        out.sort_unstable();
        out
    }

    /// Per tag with chunks asleep: their count, bytes and host bytes.
    pub(super) fn sleeping(&self) -> Vec<SleepingTag> {
        let mut by: BTreeMap<&str, SleepingTag> = BTreeMap::new();
        for t in self.asleep.values() {
            let e = by.entry(&t.tag).or_insert_with(|| SleepingTag {
                tag: t.tag.to_string(),
                allocations: 0,
                bytes_asleep: 0,
                host_bytes: 0,
            });
            e.allocations += 1;
            e.bytes_asleep += t.size;
            e.host_bytes += t.copy.as_ref().map_or(0, HostCopy::len);
        }
        by.into_values().collect()
    }

    /// A spare host copy of exactly `len` bytes, if one is kept.
    #[inline]
    pub(super) fn take_spare(&mut self, len: u64) -> Option<HostCopy> {
        if self.spare.is_empty() {
            return None;
        }
        let i = self.spare.iter().position(|c| c.len() == len)?;
        Some(self.spare.swap_remove(i))
    }

    /// The spare host copies no tagged allocation could take at a next sleep (at most one
    /// per live tagged allocation of its size, awake or asleep), taken out to be freed: kept
    /// copies never outnumber what could sleep again.
    ///
    /// # Time complexity
    /// `O(slots)` of the space (a pass over its chunk records) when a copy is kept: after a
    /// wake only.
    pub(super) fn prune_spare(&mut self, space: &Space) -> Vec<HostCopy> {
        if self.spare.is_empty() {
            return Vec::new();
        }
        let mut room: FxHashMap<u64, usize> = FxHashMap::default();
        for (_, size, _, _) in space.labelled() {
            *room.entry(size).or_insert(0) += 1;
        }
        let (keep, drop): (Vec<HostCopy>, Vec<HostCopy>) = std::mem::take(&mut self.spare)
            .into_iter()
            .partition(|c| match room.get_mut(&c.len()) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            });
        self.spare = keep;
        drop
    }

    /// Bytes of the spare host copies.
    pub(super) fn spare_bytes(&self) -> u64 {
        self.spare.iter().map(HostCopy::len).sum()
    }

    /// The spare host copies, emptied: for `trim` and the drop.
    pub(super) fn drain_spare(&mut self) -> Vec<HostCopy> {
        std::mem::take(&mut self.spare)
    }

    /// Every sleeping record, emptied: for the allocator's drop (the space's labels are
    /// left as they are: the space goes with it).
    pub(super) fn drain(&mut self) -> impl Iterator<Item = Tagged> + '_ {
        self.asleep_bytes = 0;
        self.host_bytes = 0;
        self.awake = 0;
        self.names.clear();
        self.ids.clear();
        self.vacant.clear();
        self.recent = [0; RECENT];
        self.asleep.drain().map(|(_, t)| t)
    }

    /// Checks the invariants (see the module) against the chunks of `space`.
    ///
    /// # Time complexity
    /// `O(slots + names + sleeping chunks)`.
    pub(super) fn check(&self, space: &Space) -> std::result::Result<(), String> {
        let mut counts = vec![0u64; self.names.len()];
        let mut sleeping = 0;
        for (addr, size, token, label) in space.labelled() {
            if label == ASLEEP {
                sleeping += 1;
                match self.asleep.get(&addr) {
                    Some(t) if t.token == token && t.size == size => {}
                    _ => {
                        return Err(format!(
                            "chunk {addr:#x}+{size} is labelled asleep but has no sleeping \
                             record of its token and size"
                        ))
                    }
                }
            } else {
                match self.names.get(label as usize - 1) {
                    Some(Some(_)) => counts[label as usize - 1] += 1,
                    _ => {
                        return Err(format!(
                            "chunk {addr:#x}+{size} is labelled {label}, which names no tag"
                        ))
                    }
                }
            }
        }
        if sleeping != self.asleep.len() {
            return Err(format!(
                "{} sleeping records, {sleeping} chunks in use labelled asleep",
                self.asleep.len()
            ));
        }
        let mut awake = 0;
        let mut interned = 0;
        for (i, n) in self.names.iter().enumerate() {
            let id = i as u32 + 1;
            match n {
                Some(n) => {
                    interned += 1;
                    if n.count != counts[i] || n.count == 0 {
                        return Err(format!(
                            "tag {:?} counts {} chunks, {} are labelled with it",
                            n.name, n.count, counts[i]
                        ));
                    }
                    if self.ids.get(&*n.name) != Some(&id) {
                        return Err(format!("tag {:?} is not found by its name", n.name));
                    }
                    awake += n.count;
                }
                None if !self.vacant.contains(&id) => {
                    return Err(format!("tag id {id} is neither a name's nor vacant"));
                }
                None => {}
            }
        }
        if interned != self.ids.len() || awake != self.awake {
            return Err(format!(
                "{} names by id, {interned} interned; {} awake tagged chunks counted, {awake} \
                 labelled",
                self.ids.len(),
                self.awake
            ));
        }
        let (mut asleep, mut host) = (0, 0);
        for t in self.asleep.values() {
            asleep += t.size;
            host += t.copy.as_ref().map_or(0, HostCopy::len);
        }
        if (asleep, host) != (self.asleep_bytes, self.host_bytes) {
            return Err(format!(
                "sleeping bytes counted {} (host {}), the records hold {asleep} (host {host})",
                self.asleep_bytes, self.host_bytes
            ));
        }
        Ok(())
    }
}

/// Frees host copies.
pub(super) fn free_all<D: Device + ?Sized>(device: &D, copies: Vec<HostCopy>) {
    for copy in copies {
        if let Err(e) = copy.free(device) {
            tracing::warn!(error = %e, "vmm: a host copy could not be freed (leaked)");
        }
    }
}

/// The refusal of host memory for the copy of an allocation of `tag` (`size` bytes) put
/// to sleep.
fn host_refused(e: Error, tag: &str, size: u64) -> Error {
    match e {
        Error::HostOutOfMemory { bytes, .. } => Error::HostOutOfMemory {
            bytes,
            what: format!(
                "the contents of an allocation of {} tagged {} put to sleep (the sleep is \
                 given up: everything stays awake with its bytes)",
                Bytes(size),
                crate::error::shown(tag)
            ),
        },
        other => other,
    }
}

impl<D: Device + ?Sized> VmmAllocator<D> {
    /// Hands back the device memory of the live allocations tagged `tag` that are awake,
    /// keeping their addresses: with [`Keep::Contents`] their bytes are copied to host memory
    /// first (pinned where the device offers it), with [`Keep::Nothing`] they are discarded.
    /// [`VmmAllocator::wake`] maps memory at the same addresses again. Pointers never change:
    /// CUDA graphs captured over them, and every pointer the caller holds, stay valid.
    ///
    /// The device is waited for first — work on any stream may use the memory: the
    /// allocation's own, a stream the caller recorded a use on, another thread's per-thread
    /// stream — then the copies are queued on a stream portalloc owns and waited for. The
    /// granules no awake allocation touches are unmapped, and every handle none of whose
    /// granules is mapped is released — idle memory too: a sleep hands back what it can.
    /// Granules shared with awake allocations stay mapped (their memory stays counted in
    /// [`crate::Stats::pool_bytes`]); a tag declared sleepable
    /// ([`crate::sleep_tags::declare_sleepable`]) shares none. Where the driver holds released
    /// memory until its reservation is freed, whole segments nothing awake uses are freed
    /// instead (see the module docs of [`crate::strategy::vmm`] and `docs/architecture.md`).
    ///
    /// Sleeping allocations are not in [`crate::Stats::bytes_in_use`]; they are in
    /// [`crate::Stats::bytes_asleep`] and [`VmmAllocator::sleeping`]. Freeing one is allowed:
    /// it releases its range and its host copy. An allocation made with a sleeping tag is
    /// awake. A tag with no awake allocation: nothing to do (an empty report). The
    /// allocator's lock is held throughout: other calls on it wait for the sleep.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use portalloc::backends::host::HostDevice;
    /// use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
    /// use portalloc::{Allocator, Keep, Stream};
    ///
    /// let device = Arc::new(HostDevice::builder().capacity(256 << 20).build()?);
    /// let vmm = VmmAllocator::new(device, VmmOptions::new(128 << 20))?;
    /// let weights = vmm.allocate(64 << 20, 0, Stream::DEFAULT, "weights")?;
    /// let held = vmm.stats().pool_bytes;
    /// vmm.sleep("weights", Keep::Contents)?;
    /// assert!(vmm.stats().pool_bytes <= held - (64 << 20));
    /// vmm.wake("weights")?; // the same address, the same bytes
    /// vmm.deallocate(weights)?;
    /// # Ok::<(), portalloc::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`] (naming the tag and the bytes) when host memory for the
    /// copies cannot be had: then nothing sleeps and nothing is lost. The device's error for
    /// a copy, a wait, an unmap or a release: the copies not made yet are made (the memory
    /// is still mapped), the allocations are woken again with their bytes, and the error is
    /// returned; should the undo fail too, they stay asleep with their contents, for a later
    /// [`VmmAllocator::wake`] — unless the copies themselves kept failing, when what they
    /// could not copy stays only in memory that the failed undo may have left unguarded.
    /// With [`Keep::Nothing`] an undone sleep wakes the allocations without their bytes, as
    /// a wake does: they were to be discarded.
    pub fn sleep(&self, tag: &str, keep: Keep) -> Result<SleepReport> {
        let device = &*self.device;
        let mut guard = self.inner();
        let inner = &mut *guard;
        // A pass over the chunks: the awake ones carry their tag in their record.
        let targets = inner.tags.awake_of(&inner.space, tag);
        if targets.is_empty() {
            return Ok(SleepReport::default());
        }
        let vm = self.vm()?;
        // After all work on the memory, whatever stream it was queued on: the allocations'
        // own, streams recorded with `record_stream`, another thread's per-thread stream.
        // Only the whole device covers them all (vLLM and torch_memory_saver leave this wait
        // to their callers; doing it here cannot be forgotten, and a sleep is rare).
        device.synchronize_device()?;
        // Everything freed before is complete now: pending frees go back to the free space
        // and memory freed at once is settled, so granules the tag took over from them can go.
        inner.phys.settle_all();
        self.poll_pending(inner);
        let copy_stream = match keep {
            Keep::Contents => Some(self.copy_stream(inner)?),
            Keep::Nothing => None,
        };
        // Host memory for every copy first: refused, nothing has changed.
        let mut copies: Vec<Option<HostCopy>> = Vec::with_capacity(targets.len());
        for &(_, size, _) in &targets {
            if copy_stream.is_none() {
                copies.push(None);
                continue;
            }
            // Exactly `size` bytes, kept or made: a copy rounded up (sglang's powers of two
            // turned 20.4 GiB into 32 GiB per rank, sgl-project/sglang#36562) holds host
            // memory no sleep uses.
            let copy = match inner.tags.take_spare(size) {
                Some(copy) => Ok(copy),
                None => match HostCopy::new(device, size) {
                    // Under host memory pressure the copies kept for other allocations go
                    // back first (they are only a saving of time), then the copy is asked
                    // for once more.
                    Err(e) if e.is_out_of_memory() && inner.tags.spare_bytes() > 0 => {
                        self.free_spare(inner);
                        HostCopy::new(device, size)
                    }
                    made => made,
                }
                .map_err(|e| host_refused(e, tag, size)),
            };
            match copy {
                Ok(copy) => copies.push(Some(copy)),
                Err(e) => {
                    free_all(device, copies.into_iter().flatten().collect());
                    return Err(e);
                }
            }
        }
        let pool_before = inner.phys.pool_bytes();
        let mut report = SleepReport {
            allocations: targets.len() as u64,
            ..SleepReport::default()
        };
        // Asleep in the books: each labelled so and given a record with its host copy, none
        // of whose bytes is valid yet (the targets are awake tagged chunks in use, nothing
        // having run since they were found).
        let mut slept = Vec::with_capacity(targets.len());
        for (&(addr, size, token), copy) in targets.iter().zip(copies) {
            let len = copy.as_ref().map_or(0, HostCopy::len);
            if let Err(copy) = inner
                .tags
                .put_to_sleep(&mut inner.space, addr, size, token, copy)
            {
                debug_assert!(false, "a sleep's target is not an awake tagged chunk");
                free_all(device, copy.into_iter().collect());
                continue;
            }
            if let Some(t) = inner.tags.asleep.get_mut(&addr) {
                t.valid = 0;
            }
            report.copied_bytes += len;
            report.bytes += size;
            let (start, end) = self.span(addr, size);
            inner.phys.untouch(start, end);
            slept.push((addr, size));
        }
        // What no awake chunk touches under them is unmapped, then what nothing holds is
        // given back: handles with nothing mapped — or, where the driver holds released
        // memory until the reservation goes, whole regions nothing awake uses.
        let g = self.granularity;
        let mut granules = Vec::new();
        for &(addr, size) in &slept {
            let (start, end) = self.span(addr, size);
            inner.phys.settled_free_in(start, end, &mut granules);
        }
        granules.sort_unstable();
        granules.dedup();
        // The copies go in pieces, in address order, on portalloc's own stream; a granule
        // is unmapped once every piece over it is copied, while the next piece's copy runs
        // (on a GPU the driver's unmaps then overlap the copy instead of following it).
        let piece = self.options.copy_piece.max(1).div_ceil(g).saturating_mul(g);
        let mut pieces = Vec::new();
        if copy_stream.is_some() {
            for &(addr, size) in &slept {
                let mut lo = addr;
                while lo < addr + size {
                    let hi = ((lo / piece + 1).saturating_mul(piece)).min(addr + size);
                    pieces.push((addr, lo, hi));
                    lo = hi;
                }
            }
        }
        let mut next = 0;
        let mut unmap_below = |inner: &mut super::Inner, bound: u64| -> Result<()> {
            while next < granules.len() && granules[next].saturating_add(g) <= bound {
                let v = granules[next];
                vm.unmap(v, g)?;
                inner.counters.unmaps += 1;
                if let Some(piece) = inner.phys.unmap(v) {
                    inner.phys.make_idle(piece);
                }
                next += 1;
            }
            Ok(())
        };
        let issue = |inner: &mut super::Inner, (addr, lo, hi): (u64, u64, u64)| -> Result<()> {
            let (Some(stream), Some(t)) = (copy_stream, inner.tags.asleep.get_mut(&addr)) else {
                return Ok(());
            };
            match &mut t.copy {
                Some(copy) => copy.download_part(device, lo, lo - addr, hi - lo, stream),
                None => Ok(()),
            }
        };
        // Waits for the copy of `piece` (the stream's work so far), then counts its bytes
        // valid.
        let settle = |inner: &mut super::Inner, (addr, _, hi): (u64, u64, u64)| -> Result<()> {
            match inner.tags.asleep.get_mut(&addr) {
                Some(t) => match &mut t.copy {
                    Some(copy) => copy.settle(device).map(|()| t.valid = hi - addr),
                    None => Ok(()),
                },
                None => Ok(()),
            }
        };
        let mut handed_back = match pieces.first() {
            Some(&first) => issue(inner, first),
            None => Ok(()),
        };
        // Pieces copied: their bytes are valid in the host copies.
        let mut copied = 0;
        for k in 0..pieces.len() {
            if handed_back.is_err() {
                break;
            }
            let (_, _, hi) = pieces[k];
            handed_back = settle(inner, pieces[k]);
            if handed_back.is_err() {
                break;
            }
            copied = k + 1;
            if let Some(&after) = pieces.get(k + 1) {
                handed_back = issue(inner, after);
                if handed_back.is_err() {
                    break;
                }
            }
            handed_back = unmap_below(inner, hi);
        }
        let handed_back = handed_back.and_then(|()| unmap_below(inner, u64::MAX));
        let handed_back = handed_back.and_then(|()| self.release_idle_handles(vm, inner));
        report.device_bytes = pool_before.saturating_sub(inner.phys.pool_bytes());
        if let Err(e) = handed_back {
            // What is not copied yet sits in memory no chunk touches (the books put them to
            // sleep first): copied now, while it is still mapped, so that should the undo
            // below fail the tag sleeps with all its contents, not with memory anyone could
            // take or a trim hand back.
            for &piece in &pieces[copied..] {
                if let Err(f) = issue(inner, piece).and_then(|()| settle(inner, piece)) {
                    tracing::warn!(error = %f, tag,
                        "vmm: a failed sleep's copies could not be finished; the undo fills back \
                         what was copied, the rest never having left the memory");
                    break;
                }
            }
            // Woken again, so that a failed sleep leaves them as they were.
            let slept: Vec<u64> = slept.into_iter().map(|(addr, _)| addr).collect();
            return match self.wake_chunks(inner, tag, &slept) {
                Ok(_) => Err(e),
                Err(w) => {
                    tracing::warn!(error = %w, tag,
                        "vmm: a sleep that failed could not be undone; the tag stays asleep");
                    Err(e)
                }
            };
        }
        Ok(report)
    }

    /// The stream sleep and wake copy on, made at the first use.
    ///
    /// # Errors
    /// The device's error when no stream can be made.
    fn copy_stream(&self, inner: &mut super::Inner) -> Result<Stream> {
        if let Some(s) = &inner.copy_stream {
            return Ok(s.stream());
        }
        let s = OwnedStream::new(&*self.device)?;
        let stream = s.stream();
        inner.copy_stream = Some(s);
        Ok(stream)
    }

    /// Maps device memory again under the allocations tagged `tag` that sleep — at their
    /// addresses — and copies their contents back (on each one's stream, waited for). The
    /// host copies are kept for the next sleep of the same allocations (at most one per live
    /// tagged allocation of its size; [`VmmAllocator::spare_host_bytes`] counts them,
    /// [`Allocator::trim`](crate::Allocator::trim) frees them), as PyTorch's caching host
    /// allocator keeps pinned blocks. Allocations put to sleep with [`Keep::Nothing`] hold
    /// whatever the new memory holds. A tag with none asleep: nothing to do (an empty
    /// report).
    ///
    /// # Errors
    /// [`Error::CannotWake`] when the memory they need cannot be had (within the budget or
    /// from the device): the tag stays asleep, its contents kept, and a later wake can
    /// succeed. The device's error for a copy or a map: the same.
    pub fn wake(&self, tag: &str) -> Result<SleepReport> {
        let mut guard = self.inner();
        let inner = &mut *guard;
        let targets = inner.tags.asleep_of(tag);
        if targets.is_empty() {
            return Ok(SleepReport::default());
        }
        match self.wake_chunks(inner, tag, &targets) {
            Err(e)
                if e.is_out_of_memory()
                    && (inner.phys.any_unsettled() || inner.order.count() > 0) =>
            {
                // Memory that only waits for work in flight (freed at once under a kernel,
                // or pending on a stream) is waited for on the CPU and the wake tried once
                // more, as an allocation waits just before it would refuse.
                if let Err(w) = self.device.synchronize_device() {
                    tracing::debug!(error = %w, "vmm: could not wait for the work in flight");
                    return Err(e);
                }
                inner.phys.settle_all();
                self.poll_pending(inner);
                self.wake_chunks(inner, tag, &targets)
            }
            woken => woken,
        }
    }

    /// Wakes the sleeping chunks `targets` (of `tag`): all of them, or none.
    fn wake_chunks(
        &self,
        inner: &mut super::Inner,
        tag: &str,
        targets: &[u64],
    ) -> Result<SleepReport> {
        let device = &*self.device;
        let g = self.granularity;
        let shift = g.trailing_zeros();
        // What they need, all together, against what can be had: refused before anything
        // is touched when it cannot.
        let mut needed: FxHashSet<u64> = FxHashSet::default();
        let mut spans = Vec::with_capacity(targets.len());
        for &addr in targets {
            let size = inner.tags.asleep[&addr].size;
            let (start, end) = self.span(addr, size);
            let mut missing = Vec::new();
            inner.phys.unmapped_in(start, end, &mut missing);
            needed.extend(missing);
            spans.push((addr, size, start, end));
        }
        let need = needed.len() as u64;
        // Memory freed at once can be had once a fence covers it: fenced on the device; and
        // when only that memory is missing, waited for on the CPU, as an allocation waits just
        // before it would refuse.
        self.settle_granules(inner);
        self.poll_pending(inner);
        // What can be had: idle memory, free mapped granules elsewhere (those under the
        // sleepers are in place already, not a supply), and what the budget still allows.
        let supply_now = |inner: &super::Inner| {
            let mut inside = Vec::new();
            for &(_, _, start, end) in &spans {
                inner.phys.settled_free_in(start, end, &mut inside);
            }
            inside.sort_unstable();
            inside.dedup();
            let stitchable =
                inner.phys.free_mapped_count() - inner.phys.unsettled_free() - inside.len() as u64;
            // New memory as the device has it free, not only as the budget allows it: with
            // another tenant on the device the budget's room is not what can be had.
            inner.phys.idle_count() + stitchable + self.creatable_on_device(&inner.phys)
        };
        if need > supply_now(inner) && (inner.phys.any_unsettled() || inner.order.count() > 0) {
            // Memory that only waits for work in flight (frees pending on their streams,
            // memory freed at once before its fence): waited for on the CPU, as an
            // allocation waits just before it would refuse.
            match device.synchronize_device() {
                Ok(()) => {
                    inner.phys.settle_all();
                    self.poll_pending(inner);
                }
                Err(e) => tracing::debug!(error = %e, "vmm: could not wait for the work in flight"),
            }
        }
        let supply = supply_now(inner);
        let refusal = |cause: String| Error::CannotWake {
            tag: tag.to_string(),
            needed: need << shift,
            available: supply << shift,
            cause,
        };
        if need > supply {
            return Err(refusal(format!(
                "the physical budget of {} or the device is short: {} held, {} of it by awake \
                 allocations; {}",
                Bytes(self.options.limit),
                Bytes(inner.phys.pool_bytes()),
                Bytes(inner.bytes_in_use()),
                self.device_free_text()
            )));
        }
        let pool_before = inner.phys.pool_bytes();
        // The contents go back on portalloc's own stream (the allocations' streams may be
        // gone by now), waited for below: the bytes are in place when the wake returns,
        // before any work the caller queues next on any stream.
        let kept = spans
            .iter()
            .any(|&(addr, ..)| inner.tags.asleep[&addr].copy.is_some());
        let stream = if kept {
            Some(self.copy_stream(inner)?)
        } else {
            None
        };
        // Back, touch and fill each in turn, piece by piece: a piece's copy runs while the
        // next piece's memory is made and mapped (on a GPU the driver's calls and the copy
        // overlap instead of following each other), and a touched piece's granules are no
        // one's to stitch. The pieces split the allocation's granules exactly, so each is
        // touched once.
        let mut woken = 0;
        let mut touched_end = 0;
        let mut failed = None;
        let mut copy_failed = None;
        // Boundaries at multiples of the piece (`VmmOptions::copy_piece`, at least a granule).
        let piece = self.options.copy_piece.max(1).div_ceil(g).saturating_mul(g);
        'spans: for &(addr, size, start, end) in &spans {
            let small = size < self.options.small_threshold;
            let mut p0 = start;
            touched_end = start;
            while p0 < end {
                let p1 = (p0 / piece + 1).saturating_mul(piece).min(end);
                let (lo, hi) = (addr.max(p0), (addr + size).min(p1));
                // Counted afresh for each piece: backing and touching the pieces before it
                // changed the free and unsettled granules.
                let unsettled = inner.phys.unsettled_free();
                let (n, s) = self.need_and_supply(&inner.phys, lo, hi - lo, unsettled);
                inner.waking = true;
                let backed = self.back(inner, lo, n, s, hi - lo, small);
                inner.waking = false;
                if let Err(shortfall) = backed {
                    failed = Some(shortfall);
                    break 'spans;
                }
                inner.phys.touch(p0, p1);
                touched_end = p1;
                if let Some(stream) = stream {
                    let t = inner.tags.asleep.get_mut(&addr).expect("a target sleeps");
                    // Only what the sleep copied (all of it, but for a sleep undone part way:
                    // the rest stayed in the memory, never unmapped).
                    let until = hi.min(addr + t.valid);
                    if let (Some(copy), true) = (&mut t.copy, until > lo) {
                        let part = copy.upload_part(device, lo, lo - addr, until - lo, stream);
                        if let Err(e) = part {
                            copy_failed = Some(e);
                            break 'spans;
                        }
                    }
                }
                p0 = p1;
            }
            woken += 1;
        }
        let mut result = match failed {
            None => Ok(()),
            Some(super::Shortfall::Budget(n, s)) => Err(refusal(format!(
                "{n} granules were needed for one allocation and {s} could be found"
            ))),
            Some(super::Shortfall::Device(e)) if e.is_out_of_memory() => Err(refusal(format!(
                "the device refused memory after this allocator's own free memory was \
                     used: {e}; {}",
                self.device_free_text()
            ))),
            Some(super::Shortfall::Device(Error::ExceedsLimit { requested, limit })) => {
                Err(refusal(format!(
                    "the physical budget of {} is reached: {} more could not be had",
                    Bytes(limit),
                    Bytes(requested)
                )))
            }
            Some(super::Shortfall::Device(e)) => Err(e),
            Some(super::Shortfall::Relocated(why)) => Err(refusal(why)),
        };
        if let Some(e) = copy_failed {
            result = Err(e);
        }
        // Waited for, so that the host copies can go (and, on failure, before the memory is
        // untouched again).
        for &(addr, ..) in &spans {
            if let Some(copy) = &mut inner.tags.asleep.get_mut(&addr).expect("asleep").copy {
                if let Err(e) = copy.settle(device) {
                    result = result.and(Err(e));
                }
            }
        }
        if let Err(e) = result {
            // Asleep again, as they were: what was mapped for them stays, free — except where
            // the driver holds released memory until the reservation goes: there the regions
            // this wake reserved and mapped for nothing go back at once.
            for &(_, _, start, end) in &spans[..woken] {
                inner.phys.untouch(start, end);
            }
            if let Some(&(_, _, start, _)) = spans.get(woken) {
                // The pieces of the one that failed part way.
                inner.phys.untouch(start, touched_end);
            }
            if inner.hold {
                if let Err(f) = self
                    .vm()
                    .and_then(|vm| self.release_idle_handles(vm, inner))
                {
                    tracing::debug!(error = %f, "vmm: memory a failed wake mapped stays held");
                }
            }
            return Err(e);
        }
        let mut report = SleepReport {
            allocations: targets.len() as u64,
            ..SleepReport::default()
        };
        for &(addr, size, ..) in &spans {
            // Awake in the books: the record goes, the chunk is labelled with its tag again.
            let t = inner.tags.wake_one(&mut inner.space, addr);
            debug_assert!(t.is_some(), "a target sleeps");
            report.bytes += size;
            if let Some(copy) = t.and_then(|t| t.copy) {
                report.copied_bytes += copy.len();
                // Settled above: kept for the next sleep (a copy still in flight is freed,
                // which waits for it).
                if copy.bytes().is_some() {
                    inner.tags.spare.push(copy);
                } else if let Err(e) = copy.free(device) {
                    tracing::warn!(error = %e, "vmm: a host copy could not be freed (leaked)");
                }
            }
        }
        report.device_bytes = inner.phys.pool_bytes().saturating_sub(pool_before);
        inner.peak_bytes_in_use = inner.peak_bytes_in_use.max(inner.bytes_in_use());
        free_all(device, inner.tags.prune_spare(&inner.space));
        Ok(report)
    }

    /// The tags with allocations asleep, by name: their count, bytes, and host bytes.
    pub fn sleeping(&self) -> Vec<SleepingTag> {
        self.inner().tags.sleeping()
    }

    /// Bytes of host memory kept from earlier wakes for the next sleep (freed by
    /// [`Allocator::trim`](crate::Allocator::trim)).
    pub fn spare_host_bytes(&self) -> u64 {
        self.inner().tags.spare_bytes()
    }

    /// Frees the spare host copies. Returns their bytes.
    pub(super) fn free_spare(&self, inner: &mut super::Inner) -> u64 {
        let mut freed = 0;
        for copy in inner.tags.drain_spare() {
            let len = copy.len();
            match copy.free(&*self.device) {
                Ok(()) => freed += len,
                Err(e) => tracing::warn!(error = %e, "vmm: a host copy could not be freed"),
            }
        }
        freed
    }
}
