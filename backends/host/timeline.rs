//! The host device's streams and events, and the test world of the conformance suite:
//! kernels that stay in flight over the memory they use, GPU-side waits, the hazards of
//! freeing or unmapping memory still in use, and the CPU waits counted.
//!
//! # The model
//!
//! The conformance drivers keep it too (`fakes/drivers/fake_timeline.h`), and add the legacy
//! stream's implicit ordering, non-blocking streams and a race detector.
//!
//! * Every stream is a **clock** of operations — event records, pool frees, waits, kernels —
//!   that complete in order. The handles 0 and [`Stream::LEGACY`] share one clock (the legacy
//!   default stream); [`Stream::PER_THREAD`] names a clock of the calling thread's own, so two
//!   threads' per-thread streams are two streams, as on a GPU.
//! * The host's own work is synchronous: an operation completes as soon as nothing queued
//!   before it on its stream holds it back. What holds it back is a **kernel** in flight
//!   ([`HostDevice::launch`], until [`HostDevice::finish`]), a **GPU-side wait**
//!   ([`Device::wait_event`]) for an event not complete yet, or the test's hold
//!   ([`HostDevice::set_events_held`]), under which nothing completes but what a CPU wait
//!   forces.
//! * A **CPU wait** (`synchronize_stream`, `synchronize_event`, `synchronize_device`) completes
//!   what it waits for, kernels included, and is counted ([`HostDevice::cpu_waits`]).
//! * Freeing ([`Device::free`], a pool giving back a segment) or unmapping memory that a
//!   kernel in flight uses is a **hazard** — undefined behaviour on a GPU — and is recorded
//!   ([`HostDevice::hazards`]) rather than refused, as a driver would not notice either.
//! * A **copy** between device and host memory ([`Device::copy_to_host`],
//!   [`Device::copy_from_host`]) is an operation on its stream's clock like the others, in
//!   flight over its device range until its clock completes it: freeing or unmapping that
//!   range before is a hazard too. (The bytes move when the copy is queued, see the host
//!   device's docs.)
//!
//! Invariants: `completed <= recorded` on every clock; a kernel is in `active` exactly while
//! it is not finished; every wait's `seq` is an operation of its waiter's clock.
#![deny(unsafe_code)]

use std::collections::HashMap;

use crate::device::{thread_number, Event, Stream};

/// The most hazards whose text is kept (all are counted).
const HAZARD_TEXTS: usize = 16;

/// Which clock a stream handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct ClockKey {
    handle: u64,
    /// The thread, for [`Stream::PER_THREAD`]; 0 otherwise.
    thread: u64,
}

impl ClockKey {
    /// The clock `stream` names on the calling thread.
    pub(super) fn of(stream: Stream) -> ClockKey {
        match stream.as_raw() {
            0 | 1 => ClockKey {
                handle: 0,
                thread: 0,
            },
            2 => ClockKey {
                handle: 2,
                thread: thread_number(),
            },
            handle => ClockKey { handle, thread: 0 },
        }
    }

    /// True for the legacy default stream's clock, which waits for every blocking stream.
    fn is_legacy(self) -> bool {
        self.handle == 0
    }
}

/// One stream's operations: `recorded` counts them, `completed` is the newest that has
/// completed (invariant: `completed <= recorded`).
#[derive(Debug, Clone, Copy, Default)]
struct Clock {
    recorded: u64,
    completed: u64,
}

/// A recorded event: its clock and its number there; `None` (never recorded) is complete.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct EventRecord {
    at: Option<(ClockKey, u64)>,
}

/// A kernel of the test: an operation on `clock` that uses `[va, va + size)`.
#[derive(Debug, Clone, Copy)]
struct Kernel {
    clock: ClockKey,
    seq: u64,
    va: u64,
    size: u64,
    finished: bool,
}

/// A copy in flight: operation `seq` of `clock`, between device memory `[va, va + size)`
/// and host memory `[host, host + size)`.
#[derive(Debug, Clone, Copy)]
struct CopyOp {
    clock: ClockKey,
    seq: u64,
    va: u64,
    host: u64,
    size: u64,
}

/// A GPU-side wait: operation `seq` of `waiter` completes only after `dep` reached `dep_seq`.
#[derive(Debug, Clone, Copy)]
struct Wait {
    waiter: ClockKey,
    seq: u64,
    dep: ClockKey,
    dep_seq: u64,
}

/// Streams and events (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Timeline {
    /// The test's hold: nothing completes but what a CPU wait forces.
    pub(super) held: bool,
    clocks: HashMap<ClockKey, Clock>,
    events: HashMap<u64, EventRecord>,
    last_event: u64,
    /// Every kernel launched, by id − 1.
    kernels: Vec<Kernel>,
    /// Ids of the kernels in flight.
    active: Vec<usize>,
    /// GPU-side waits that may still hold something back.
    waits: Vec<Wait>,
    /// Copies that had not completed when last looked at (completed ones are forgotten
    /// lazily, when a copy is queued or memory goes away).
    copies: Vec<CopyOp>,
    hazard_count: u64,
    hazard_texts: Vec<String>,
    cpu_waits: u64,
    gpu_waits: u64,
}

impl Timeline {
    fn clock(&self, key: ClockKey) -> Clock {
        self.clocks.get(&key).copied().unwrap_or_default()
    }

    fn done(&self, key: ClockKey, seq: u64) -> bool {
        seq == 0 || self.clock(key).completed >= seq
    }

    /// Queues one operation on `key`; returns its number. Completes what it can.
    fn enqueue(&mut self, key: ClockKey) -> u64 {
        let quiet = !self.held && self.active.is_empty() && self.waits.is_empty();
        let clock = self.clocks.entry(key).or_default();
        clock.recorded += 1;
        let seq = clock.recorded;
        if quiet {
            // Nothing holds anything back: done at once (one clock touched, not all).
            clock.completed = seq;
        } else {
            self.progress();
        }
        seq
    }

    /// Completes every clock up to the first operation something holds back.
    fn progress(&mut self) {
        if self.held {
            return;
        }
        if self.active.is_empty() && self.waits.is_empty() {
            // Nothing holds anything back: the host's work is done at once.
            for c in self.clocks.values_mut() {
                c.completed = c.recorded;
            }
            return;
        }
        loop {
            let mut limit: HashMap<ClockKey, u64> =
                self.clocks.iter().map(|(&k, c)| (k, c.recorded)).collect();
            for &i in &self.active {
                let k = &self.kernels[i];
                let l = limit.entry(k.clock).or_default();
                *l = (*l).min(k.seq - 1);
            }
            for w in &self.waits {
                if !self.done(w.dep, w.dep_seq) {
                    let l = limit.entry(w.waiter).or_default();
                    *l = (*l).min(w.seq - 1);
                }
            }
            let mut changed = false;
            for (key, l) in limit {
                let c = self.clocks.entry(key).or_default();
                if l > c.completed {
                    c.completed = l;
                    changed = true;
                }
            }
            // Waits that hold nothing back any more are forgotten: what they ordered has
            // completed.
            let clocks = &self.clocks;
            self.waits
                .retain(|w| clocks.get(&w.waiter).map_or(0, |c| c.completed) < w.seq);
            if !changed {
                return;
            }
        }
    }

    /// A CPU wait for `key` up to `seq`: the events it waits for, then its kernels, then it.
    fn force(&mut self, key: ClockKey, seq: u64, depth: u32) {
        let clock = self.clock(key);
        let seq = seq.min(clock.recorded);
        if clock.completed >= seq || depth > 64 {
            return;
        }
        let deps: Vec<(ClockKey, u64)> = self
            .waits
            .iter()
            .filter(|w| w.waiter == key && w.seq <= seq)
            .map(|w| (w.dep, w.dep_seq))
            .collect();
        for (dep, dep_seq) in deps {
            self.force(dep, dep_seq, depth + 1);
        }
        let kernels = &mut self.kernels;
        self.active.retain(|&i| {
            let k = &mut kernels[i];
            let covered = k.clock == key && k.seq <= seq;
            k.finished |= covered;
            !covered
        });
        self.clocks.entry(key).or_default().completed = seq;
        self.progress();
    }

    /// A CPU wait for every stream.
    fn force_all(&mut self) {
        let keys: Vec<ClockKey> = self.clocks.keys().copied().collect();
        for key in keys {
            self.force(key, u64::MAX, 0);
        }
    }

    // ---- the calls of the device ---------------------------------------------------------

    pub(super) fn create_event(&mut self) -> Event {
        self.last_event += 1;
        self.events.insert(self.last_event, EventRecord::default());
        Event(self.last_event)
    }

    pub(super) fn event(&self, event: Event) -> Option<EventRecord> {
        self.events.get(&event.0).copied()
    }

    pub(super) fn destroy_event(&mut self, event: Event) -> bool {
        self.events.remove(&event.0).is_some()
    }

    pub(super) fn event_count(&self) -> usize {
        self.events.len()
    }

    pub(super) fn record(&mut self, event: Event, stream: Stream) {
        let key = ClockKey::of(stream);
        let seq = self.enqueue(key);
        self.events.insert(
            event.0,
            EventRecord {
                at: Some((key, seq)),
            },
        );
    }

    pub(super) fn is_complete(&self, record: EventRecord) -> bool {
        record.at.map_or(true, |(key, seq)| self.done(key, seq))
    }

    /// `synchronize_event`: a CPU wait for the work before the event's last record.
    pub(super) fn synchronize_event(&mut self, record: EventRecord) {
        self.cpu_waits += 1;
        if let Some((key, seq)) = record.at {
            self.force(key, seq, 0);
        }
    }

    /// `synchronize_stream`: a CPU wait for everything queued on `stream` (on the legacy
    /// default stream: on every stream, which it waits for).
    pub(super) fn synchronize_stream(&mut self, stream: Stream) {
        self.cpu_waits += 1;
        let key = ClockKey::of(stream);
        if key.is_legacy() {
            self.force_all();
        } else {
            self.force(key, u64::MAX, 0);
        }
    }

    /// `synchronize_device`: a CPU wait for every stream.
    pub(super) fn synchronize_device(&mut self) {
        self.cpu_waits += 1;
        self.force_all();
    }

    /// `wait_event`: work queued on `stream` from now on waits for the event's record.
    pub(super) fn wait(&mut self, stream: Stream, record: EventRecord) {
        self.gpu_waits += 1;
        let Some((dep, dep_seq)) = record.at else {
            return;
        };
        if self.done(dep, dep_seq) {
            return;
        }
        let waiter = ClockKey::of(stream);
        let clock = self.clocks.entry(waiter).or_default();
        clock.recorded += 1;
        let seq = clock.recorded;
        self.waits.push(Wait {
            waiter,
            seq,
            dep,
            dep_seq,
        });
        self.progress();
    }

    /// A stream-ordered free on `stream`: its place on the stream's clock.
    pub(super) fn free_on(&mut self, stream: Stream) -> (ClockKey, u64) {
        let key = ClockKey::of(stream);
        (key, self.enqueue(key))
    }

    /// A copy between device memory `[va, va + size)` and host memory `[host, host + size)`
    /// queued on `stream`: its place on the stream's clock, in flight over both ranges until
    /// the clock completes it.
    pub(super) fn copy_on(
        &mut self,
        stream: Stream,
        va: u64,
        host: u64,
        size: u64,
    ) -> (ClockKey, u64) {
        let key = ClockKey::of(stream);
        let seq = self.enqueue(key);
        self.forget_completed_copies();
        if !self.done(key, seq) {
            self.copies.push(CopyOp {
                clock: key,
                seq,
                va,
                host,
                size,
            });
        }
        (key, seq)
    }

    fn forget_completed_copies(&mut self) {
        let clocks = &self.clocks;
        self.copies
            .retain(|c| clocks.get(&c.clock).map_or(0, |k| k.completed) < c.seq);
    }

    pub(super) fn done_at(&self, at: (ClockKey, u64)) -> bool {
        self.done(at.0, at.1)
    }

    /// The test's hold, on or off (off completes everything).
    pub(super) fn set_held(&mut self, held: bool) {
        self.held = held;
        if !held {
            self.release_all();
        }
    }

    /// Completes every operation and kernel; returns how many events were pending.
    pub(super) fn release_all(&mut self) -> usize {
        let pending = self
            .events
            .values()
            .filter(|&&e| !self.is_complete(e))
            .count();
        for &i in &self.active {
            self.kernels[i].finished = true;
        }
        self.active.clear();
        self.waits.clear();
        self.copies.clear();
        for c in self.clocks.values_mut() {
            c.completed = c.recorded;
        }
        pending
    }

    // ---- the test world ------------------------------------------------------------------

    pub(super) fn launch(&mut self, stream: Stream, va: u64, size: u64) -> u64 {
        let clock = ClockKey::of(stream);
        let c = self.clocks.entry(clock).or_default();
        c.recorded += 1;
        let seq = c.recorded;
        self.kernels.push(Kernel {
            clock,
            seq,
            va,
            size,
            finished: false,
        });
        self.active.push(self.kernels.len() - 1);
        self.kernels.len() as u64
    }

    fn kernel(&self, work: u64) -> Option<&Kernel> {
        usize::try_from(work)
            .ok()
            .and_then(|w| w.checked_sub(1))
            .and_then(|i| self.kernels.get(i))
    }

    pub(super) fn finish(&mut self, work: u64) {
        let Some(i) = usize::try_from(work).ok().and_then(|w| w.checked_sub(1)) else {
            return;
        };
        if i >= self.kernels.len() {
            return;
        }
        self.kernels[i].finished = true;
        self.active.retain(|&a| a != i);
        self.progress();
    }

    pub(super) fn kernel_done(&self, work: u64) -> Option<bool> {
        self.kernel(work).map(|k| k.finished)
    }

    /// Whether work queued on `stream` from now on runs after kernel `work`.
    pub(super) fn ordered(&self, work: u64, stream: Stream) -> Option<bool> {
        let k = *self.kernel(work)?;
        Some(self.ordered_before(&k, ClockKey::of(stream), u64::MAX, 0))
    }

    fn ordered_before(&self, k: &Kernel, clock: ClockKey, before: u64, depth: u32) -> bool {
        if k.finished || (clock == k.clock && k.seq < before) {
            return true;
        }
        depth < 16
            && self.waits.iter().any(|w| {
                w.waiter == clock
                    && w.seq < before
                    && self.ordered_before(k, w.dep, w.dep_seq + 1, depth + 1)
            })
    }

    /// Before `[va, va + size)` goes away (`what`: device memory, or pinned host memory): a
    /// kernel or a copy in flight over it (a copy's device or host side) is a hazard.
    pub(super) fn check_unused(&mut self, va: u64, size: u64, what: &str) {
        let end = va.saturating_add(size);
        let overlaps = |at: u64, len: u64| at < end && va < at.saturating_add(len);
        let user = match self.active.iter().find(|&&i| {
            let k = &self.kernels[i];
            overlaps(k.va, k.size)
        }) {
            Some(&i) => {
                let k = self.kernels[i];
                format!("kernel {} uses [{:#x}, {:#x})", i + 1, k.va, k.va + k.size)
            }
            None => {
                self.forget_completed_copies();
                let Some(c) = self
                    .copies
                    .iter()
                    .find(|c| overlaps(c.va, c.size) || overlaps(c.host, c.size))
                else {
                    return;
                };
                format!(
                    "a copy queued on a stream (its operation {}) between device memory \
                     [{:#x}, {:#x}) and host memory [{:#x}, {:#x}) is in flight",
                    c.seq,
                    c.va,
                    c.va + c.size,
                    c.host,
                    c.host + c.size
                )
            }
        };
        self.hazard_count += 1;
        if self.hazard_texts.len() < HAZARD_TEXTS {
            self.hazard_texts
                .push(format!("{what} of [{va:#x}, {end:#x}) while {user}"));
        }
    }

    pub(super) fn hazards(&self) -> (u64, Vec<String>) {
        (self.hazard_count, self.hazard_texts.clone())
    }

    pub(super) fn waits_counted(&self) -> (u64, u64) {
        (self.cpu_waits, self.gpu_waits)
    }
}
