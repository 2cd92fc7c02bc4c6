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
//! Invariants (checked by [`Tags::check`] and the allocator's `check`):
//! * every address in `live` is a chunk in use in the space, of the recorded size, that is
//!   not a pending free;
//! * `asleep_bytes` and `host_bytes` are the sums over the sleeping records;
//! * a sleeping chunk touches no granule (the awake ones' touches are the physical counts).
#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::VmmAllocator;
use crate::allocator::{Keep, SleepReport, SleepingTag};
use crate::backends::own_stream::OwnedStream;
use crate::backends::staging::HostCopy;
use crate::device::{Device, Stream};
use crate::error::{Error, Result};
use crate::units::Bytes;

/// A live allocation that carries a tag.
#[derive(Debug)]
pub(super) struct Tagged {
    pub(super) tag: Arc<str>,
    /// The chunk's size (rounded).
    pub(super) size: u64,
    /// The chunk's token in the space.
    pub(super) token: u64,
    /// `Some` while it sleeps: its contents, where kept.
    pub(super) asleep: Option<Option<HostCopy>>,
}

/// The tagged live allocations. See the module.
#[derive(Debug, Default)]
pub(super) struct Tags {
    /// Tag names, shared by the records that carry them (one allocation per name, not per
    /// record).
    names: FxHashSet<Arc<str>>,
    /// By address.
    live: FxHashMap<u64, Tagged>,
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

    /// Moves the record of the live chunk `(addr, token)` of `size` bytes to `tag` (a
    /// donation): an empty tag forgets an awake one, as an untagged allocation is not
    /// recorded (a sleeping one keeps sleeping under its old tag, for its wake); an untagged
    /// one is recorded under `tag`. A sleeping chunk keeps sleeping, under its new tag.
    pub(super) fn retag(&mut self, addr: u64, token: u64, size: u64, tag: &str) {
        if tag.is_empty() {
            if self.live.get(&addr).is_some_and(|t| t.asleep.is_none()) {
                self.remove(addr, token);
            }
            return;
        }
        let Some(t) = self.live.get(&addr).filter(|t| t.token == token) else {
            if !self.live.contains_key(&addr) {
                self.insert(addr, size, token, tag);
            }
            return;
        };
        if &*t.tag == tag {
            return;
        }
        let old = Arc::clone(&t.tag);
        let new = self.intern(tag);
        if let Some(t) = self.live.get_mut(&addr) {
            t.tag = new;
        }
        if Arc::strong_count(&old) == 2 {
            self.names.remove(&*old);
        }
    }

    /// The shared name `tag`.
    fn intern(&mut self, tag: &str) -> Arc<str> {
        match self.names.get(tag) {
            Some(t) => Arc::clone(t),
            None => {
                let t: Arc<str> = Arc::from(tag);
                self.names.insert(Arc::clone(&t));
                t
            }
        }
    }

    /// Records the chunk at `addr` as carrying `tag` (nothing for an empty tag).
    pub(super) fn insert(&mut self, addr: u64, size: u64, token: u64, tag: &str) {
        if tag.is_empty() {
            return;
        }
        let tag = self.intern(tag);
        self.live.insert(
            addr,
            Tagged {
                tag,
                size,
                token,
                asleep: None,
            },
        );
    }

    /// Takes the record of the chunk `(addr, token)` out, as it is freed.
    pub(super) fn remove(&mut self, addr: u64, token: u64) -> Option<Tagged> {
        if self.live.is_empty() || self.live.get(&addr)?.token != token {
            return None;
        }
        let t = self.live.remove(&addr)?;
        if let Some(copy) = &t.asleep {
            self.asleep_bytes -= t.size;
            self.host_bytes -= copy.as_ref().map_or(0, HostCopy::len);
        }
        if Arc::strong_count(&t.tag) == 2 {
            // The last record of the name (the other count is `names`').
            self.names.remove(&*t.tag);
        }
        Some(t)
    }

    /// True when the chunk at `addr` sleeps.
    pub(super) fn is_asleep(&self, addr: u64) -> bool {
        !self.live.is_empty() && self.live.get(&addr).is_some_and(|t| t.asleep.is_some())
    }

    /// Bytes of the sleeping chunks.
    pub(super) fn asleep_bytes(&self) -> u64 {
        self.asleep_bytes
    }

    /// Bytes of their host copies.
    pub(super) fn host_bytes(&self) -> u64 {
        self.host_bytes
    }

    /// The addresses of the chunks of `tag` that sleep (`asleep`) or not, ascending.
    fn with(&self, tag: &str, asleep: bool) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, t)| &*t.tag == tag && t.asleep.is_some() == asleep)
            .map(|(&a, _)| a)
            .collect();
        out.sort_unstable();
        out
    }

    /// Per tag with chunks asleep: their count, bytes and host bytes.
    pub(super) fn sleeping(&self) -> Vec<SleepingTag> {
        let mut by: BTreeMap<&str, SleepingTag> = BTreeMap::new();
        for t in self.live.values() {
            let Some(copy) = &t.asleep else { continue };
            let e = by.entry(&t.tag).or_insert_with(|| SleepingTag {
                tag: t.tag.to_string(),
                allocations: 0,
                bytes_asleep: 0,
                host_bytes: 0,
            });
            e.allocations += 1;
            e.bytes_asleep += t.size;
            e.host_bytes += copy.as_ref().map_or(0, HostCopy::len);
        }
        by.into_values().collect()
    }

    /// A spare host copy of exactly `len` bytes, if one is kept.
    pub(super) fn take_spare(&mut self, len: u64) -> Option<HostCopy> {
        let i = self.spare.iter().position(|c| c.len() == len)?;
        Some(self.spare.swap_remove(i))
    }

    /// The spare host copies no tagged allocation could take at a next sleep (at most one
    /// per live tagged allocation of its size), taken out to be freed: kept copies never
    /// outnumber what could sleep again.
    pub(super) fn prune_spare(&mut self) -> Vec<HostCopy> {
        if self.spare.is_empty() {
            return Vec::new();
        }
        let mut room: FxHashMap<u64, usize> = FxHashMap::default();
        for t in self.live.values() {
            *room.entry(t.size).or_insert(0) += 1;
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

    /// Every record, emptied: for the allocator's drop.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = Tagged> + '_ {
        self.asleep_bytes = 0;
        self.host_bytes = 0;
        self.names.clear();
        self.live.drain().map(|(_, t)| t)
    }

    /// Checks the sums against the records; `in_use(addr, token)` gives the size of the chunk
    /// in use there (not pending).
    pub(super) fn check(
        &self,
        in_use: impl Fn(u64, u64) -> Option<u64>,
    ) -> std::result::Result<(), String> {
        let (mut asleep, mut host) = (0, 0);
        for (&addr, t) in &self.live {
            if in_use(addr, t.token) != Some(t.size) {
                return Err(format!(
                    "tagged chunk {addr:#x}+{} ({:?}) is not a chunk in use of that size",
                    t.size, t.tag
                ));
            }
            if let Some(copy) = &t.asleep {
                asleep += t.size;
                host += copy.as_ref().map_or(0, HostCopy::len);
            }
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

/// Frees host copies made by a sleep that is given up.
fn free_copies<D: Device + ?Sized>(device: &D, copies: Vec<(u64, Option<HostCopy>)>) {
    for (_, copy) in copies {
        if let Some(copy) = copy {
            if let Err(e) = copy.free(device) {
                tracing::warn!(error = %e, "vmm: a host copy could not be freed (leaked)");
            }
        }
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
    /// The device's error for a copy or a wait, or [`Error::HostOutOfMemory`] (naming the tag
    /// and the bytes) when host memory for a copy cannot be had: then nothing sleeps and
    /// nothing is lost. An
    /// unmap or release the device refuses: the allocations are woken again (and the error
    /// returned); should even that fail, they stay asleep with their contents, for a later
    /// [`VmmAllocator::wake`].
    pub fn sleep(&self, tag: &str, keep: Keep) -> Result<SleepReport> {
        let device = &*self.device;
        let mut guard = self.inner();
        let inner = &mut *guard;
        let targets = inner.tags.with(tag, false);
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
        // The copies, on portalloc's own stream.
        let mut copies: Vec<(u64, Option<HostCopy>)> = Vec::with_capacity(targets.len());
        for &addr in &targets {
            let Some(stream) = copy_stream else {
                copies.push((addr, None));
                continue;
            };
            let size = inner.tags.live[&addr].size;
            let copy = match inner.tags.take_spare(size) {
                Some(copy) => Ok(copy),
                None => HostCopy::new(device, size).map_err(|e| host_refused(e, tag, size)),
            };
            let copied = copy.and_then(|mut copy| match copy.download(device, addr, stream) {
                Ok(()) => Ok(copy),
                Err(e) => {
                    if let Err(f) = copy.free(device) {
                        tracing::warn!(error = %f, "vmm: a host copy could not be freed");
                    }
                    Err(e)
                }
            });
            match copied {
                Ok(copy) => copies.push((addr, Some(copy))),
                Err(e) => {
                    free_copies(device, copies);
                    return Err(e);
                }
            }
        }
        // The copies complete before anything is unmapped.
        for (_, copy) in &mut copies {
            if let Some(copy) = copy {
                if let Err(e) = copy.settle(device) {
                    free_copies(device, copies);
                    return Err(e);
                }
            }
        }
        let pool_before = inner.phys.pool_bytes();
        let mut report = SleepReport {
            allocations: targets.len() as u64,
            ..SleepReport::default()
        };
        for (addr, copy) in copies {
            if let Some(c) = &copy {
                report.copied_bytes += c.len();
                inner.tags.host_bytes += c.len();
            }
            let t = inner.tags.live.get_mut(&addr).expect("a target is live");
            report.bytes += t.size;
            t.asleep = Some(copy);
            inner.tags.asleep_bytes += t.size;
            let (start, end) = self.span(addr, t.size);
            inner.phys.untouch(start, end);
        }
        // Unmap what no awake chunk touches under them, then give back what nothing holds:
        // handles with nothing mapped — or, where the driver holds released memory until
        // the reservation goes, whole regions nothing awake uses.
        let g = self.granularity;
        let mut granules = Vec::new();
        for &addr in &targets {
            let (start, end) = self.span(addr, inner.tags.live[&addr].size);
            inner.phys.settled_free_in(start, end, &mut granules);
        }
        granules.sort_unstable();
        granules.dedup();
        let mut handed_back = Ok(());
        for v in granules {
            if let Err(e) = vm.unmap(v, g) {
                handed_back = Err(e);
                break;
            }
            inner.counters.unmaps += 1;
            if let Some(piece) = inner.phys.unmap(v) {
                inner.phys.make_idle(piece);
            }
        }
        let handed_back = handed_back.and_then(|()| self.release_idle_handles(vm, inner));
        report.device_bytes = pool_before.saturating_sub(inner.phys.pool_bytes());
        if let Err(e) = handed_back {
            // Woken again, so that a failed sleep leaves them as they were.
            return match self.wake_chunks(inner, tag, &targets) {
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
        let targets = inner.tags.with(tag, true);
        if targets.is_empty() {
            return Ok(SleepReport::default());
        }
        self.wake_chunks(inner, tag, &targets)
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
            let size = inner.tags.live[&addr].size;
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
            inner.phys.idle_count() + stitchable + self.creatable(&inner.phys)
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
        let unsettled = inner.phys.unsettled_free();
        let supply = supply_now(inner);
        let refusal = |cause: String| Error::CannotWake {
            tag: tag.to_string(),
            needed: need << shift,
            available: supply << shift,
            cause,
        };
        if need > supply {
            return Err(refusal(format!(
                "the physical budget of {} is reached: {} held, {} of it by awake allocations",
                Bytes(self.options.limit),
                Bytes(inner.phys.pool_bytes()),
                Bytes(inner.bytes_in_use())
            )));
        }
        let pool_before = inner.phys.pool_bytes();
        // Back and touch each in turn (a woken one's granules are then no one's to stitch).
        let mut woken = 0;
        let mut failed = None;
        for &(addr, size, start, end) in &spans {
            let (n, s) = self.need_and_supply(&inner.phys, addr, size, unsettled);
            let small = size < self.options.small_threshold;
            match self.back(inner, addr, n, s, size, small) {
                Ok(()) => {
                    inner.phys.touch(start, end);
                    woken += 1;
                }
                Err(shortfall) => {
                    failed = Some(shortfall);
                    break;
                }
            }
        }
        let mut result = match failed {
            None => Ok(()),
            Some(super::Shortfall::Budget(n, s)) => Err(refusal(format!(
                "{n} granules were needed for one allocation and {s} could be found"
            ))),
            Some(super::Shortfall::Device(e)) if e.is_out_of_memory() => {
                Err(refusal(format!("the device refused memory: {e}")))
            }
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
        // The contents back, on portalloc's own stream (the allocations' streams may be gone
        // by now), waited for below: the bytes are in place when the wake returns, before any
        // work the caller queues next on any stream.
        let kept = spans
            .iter()
            .any(|&(addr, ..)| matches!(inner.tags.live[&addr].asleep, Some(Some(_))));
        if result.is_ok() && kept {
            match self.copy_stream(inner) {
                Err(e) => result = Err(e),
                Ok(stream) => {
                    for &(addr, ..) in &spans {
                        let t = inner.tags.live.get_mut(&addr).expect("a target is live");
                        if let Some(Some(copy)) = &mut t.asleep {
                            if let Err(e) = copy.upload(device, addr, stream) {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                }
            }
        }
        // Waited for, so that the host copies can go (and, on failure, before the memory is
        // untouched again).
        for &(addr, ..) in &spans {
            if let Some(Some(copy)) = &mut inner.tags.live.get_mut(&addr).expect("live").asleep {
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
            let t = inner.tags.live.get_mut(&addr).expect("a target is live");
            let copy = t.asleep.take().flatten();
            inner.tags.asleep_bytes -= size;
            report.bytes += size;
            if let Some(copy) = copy {
                inner.tags.host_bytes -= copy.len();
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
        free_all(device, inner.tags.prune_spare());
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
