//! Stream-ordered reuse of freed memory: the one implementation that the pooling strategies
//! (`bfc`, `vmm`) share, so that the stream-ordering contract of [`Device`] is kept in one
//! place.
//!
//! # What it does
//!
//! * **One stream**: while every request has come on one stream, a free goes straight back to
//!   the strategy's free lists, as in XLA, and no event is made. The single-stream path costs
//!   one comparison ([`StreamOrder::is_first`]).
//! * **The fence**: memory freed at once carries no event, so before it may go where work it
//!   was freed after could still be reading it — to another stream, or back to the device —
//!   an event is recorded on the first stream (the *fence*, [`StreamOrder::fence_now`]): it
//!   completes once everything queued there before it has. That is a GPU-side record, not a
//!   CPU wait. At the first request on a second stream (or the first on
//!   [`Stream::PER_THREAD`], which names another stream on each thread) the fence is
//!   recorded if anything was freed at once, and while it is not known complete every
//!   request served from the free lists first enqueues a GPU-side wait for it
//!   ([`StreamOrder::order_after_fence`]) — on every request, the first stream's included
//!   (see *Stream handles* for why not once per stream).
//! * **Several streams**: a chunk freed on stream `S` is kept **pending** — still in use for
//!   the strategy, so it coalesces with nothing and nobody else is handed it without an order
//!   — with an event recorded on `S` at the free. Events come from a small pool
//!   ([`EVENT_POOL`]). A request on `T` is served, in RMM's order: from the pending frees made
//!   on `T`'s handle ([`StreamOrder::take`]; never on [`Stream::PER_THREAD`]); from the free
//!   lists; from another stream's pending frees ([`StreamOrder::take_elsewhere`]); by growth;
//!   and only then by a CPU wait, which the strategy makes **with its lock released**
//!   ([`StreamOrder::cpu_waits_pending`], [`wait_outside`]) just before it would refuse. A
//!   pending free is handed out only behind a GPU-side wait enqueued on `T` for its event
//!   ([`Device::wait_event`]), its own stream's included: no CPU wait.
//!   [`StreamOrder::poll`] returns the pending chunks whose event completed;
//!   [`StreamOrder::sync_all`] and [`StreamOrder::settle`] wait on the CPU (an allocator's
//!   drop, or a last resort).
//! * **A refusal is never "idle"**: when no event can be recorded on `S` (a stream the driver
//!   rejects, a failing driver), `S` is synchronised and the chunk is free at once; when `S`
//!   cannot be synchronised either, the device is; and when that fails too the chunk stays
//!   pending *without* an event: it is returned only after a synchronisation of the whole
//!   device succeeds ([`StreamOrder::sync_all`]). These are the only CPU waits made with the
//!   strategy's lock held: a driver that fails.
//!
//! # Stream handles
//!
//! A stream handle is a value, not an identity: the caller may destroy a stream while work
//! queued on it still runs (the drivers allow it), and the next stream it makes may get the
//! same handle value (the drivers' allocators hand it out again, and so do the conformance
//! fakes). Nothing portalloc sees tells the two apart, so nothing it remembers about a handle
//! may stand in for an order on the device:
//!
//! * the fence keeps no list of the streams that already waited for it: a handle seen again
//!   may name a stream that never did, so every request waits again while the fence is active
//!   (a `cuStreamWaitEvent` is cheap, and on the stream that did wait it orders nothing new);
//! * a request takes a pending free made on its own handle only behind a GPU-side wait for
//!   that free's event, as it would another stream's: on the same stream the wait is
//!   already satisfied by stream order, on a stream that reuses the handle it is the order;
//! * a free pending without an event is never returned because a later event on its handle
//!   completed, nor because its handle was synchronised: only a synchronisation of the whole
//!   device covers the stream it was freed on;
//! * a CPU wait for pending frees waits for each free's own event, not only for the newest
//!   one recorded on the handle, and an event that cannot be waited for is covered by the
//!   device, not by the handle's stream.
//!
//! What stays trusted is what the module exists to make cheap: while only one stream has
//! been seen, a request on the first stream's handle is served from the free lists with no
//! check at all. A caller that frees memory on its only stream while work on it is in
//! flight, destroys that stream, and makes another that gets the same handle value is handed
//! that memory unordered; telling them apart would cost a driver call on every request
//! (`cuStreamGetId`) or an event at every free. Once a second stream has been seen, memory
//! freed at once on the first stream is reused only behind the fence (above), so that
//! window closes at the switch.
//!
//! # Invariants (checked by [`StreamOrder::check`])
//!
//! * `bytes` and `count` are the sum of the sizes and the number of pending chunks.
//! * Pieces of one free (a strategy may carve a request out of a pending chunk and keep the
//!   rest pending) share its event and its `free` number and sit next to each other in their
//!   stream's queue; no event is used by two frees; no idle event is pending; the fence's
//!   event is neither idle nor pending.
//! * At most [`EVENT_POOL`] idle events.
//! * `multi` is true once two streams were seen, or [`Stream::PER_THREAD`] was.
//! * The fence is recorded only once a first stream was seen.
#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;

use crate::device::{Device, Event, Stream};
use crate::error::Result;

/// At most this many idle events are kept for reuse by stream-ordered frees.
pub const EVENT_POOL: usize = 64;

/// What a strategy keeps pending: enough to return the memory later.
pub(crate) trait Chunk: Copy + fmt::Debug {
    /// First byte.
    fn addr(&self) -> u64;
    /// Bytes.
    fn size(&self) -> u64;
}

/// A chunk as bfc and vmm record it while handed out or pending: where it is, how large,
/// and the token their books know it by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TokenChunk {
    /// First byte.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// The allocator's token for it.
    pub token: u64,
}

impl Chunk for TokenChunk {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn size(&self) -> u64 {
        self.size
    }
}

/// A chunk freed on a stream while other streams are in use, not yet safe for them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending<C> {
    /// The strategy's record of the chunk.
    pub chunk: C,
    /// Recorded on the freeing stream at the free; `None` when none could be recorded and
    /// neither the stream nor the device could be synchronised.
    event: Option<Event>,
    /// Which free it came from: pieces of one free share it.
    free: u64,
}

/// One CPU wait a strategy makes with its lock released ([`wait_outside`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CpuWait {
    /// The work before an event's record.
    Event(Event),
    /// Everything queued on a stream (the stream, or the device when that fails).
    Stream(Stream),
}

/// Stream-ordered reuse (see the module docs).
#[derive(Debug)]
pub(crate) struct StreamOrder<C> {
    /// The stream of the first request.
    first: Option<Stream>,
    /// True once a request came on a second stream (or on [`Stream::PER_THREAD`]): frees are
    /// then kept pending.
    multi: bool,
    /// Something was freed straight back, without an event, since the fence was last
    /// recorded.
    unfenced: bool,
    /// The fence: an event recorded on the first stream after memory freed at once, until it
    /// is known complete. No list of the streams that waited for it is kept: a handle seen
    /// again may name another stream (see the module docs).
    fence: Option<Event>,
    /// How many times the fence was recorded: a strategy that tracks what each record covers
    /// (vmm's granules) compares it with what it saw last.
    fence_records: u64,
    /// Pending frees by stream, oldest first.
    queues: Vec<(Stream, VecDeque<Pending<C>>)>,
    /// Bytes of the pending chunks.
    bytes: u64,
    /// Number of pending chunks.
    count: usize,
    /// The next free's number.
    next_free: u64,
    /// Events not recorded on anything now, for reuse. Invariant: at most [`EVENT_POOL`].
    idle: Vec<Event>,
}

impl<C> Default for StreamOrder<C> {
    fn default() -> Self {
        StreamOrder {
            first: None,
            multi: false,
            unfenced: false,
            fence: None,
            fence_records: 0,
            queues: Vec::new(),
            bytes: 0,
            count: 0,
            next_free: 0,
            idle: Vec::new(),
        }
    }
}

/// Waits for the work on `stream`; when the stream cannot be synchronised (or names another
/// stream on each thread), waits for the whole device.
///
/// # Errors
/// The stream's error (the device's when the stream was not tried) when both fail; the
/// device's is logged.
pub(crate) fn wait_for<D: Device + ?Sized>(device: &D, stream: Stream) -> Result<()> {
    if stream.is_per_thread() {
        return device.synchronize_device();
    }
    let Err(e) = device.synchronize_stream(stream) else {
        return Ok(());
    };
    tracing::debug!(stream = stream.0, error = %e,
        "could not synchronize the stream; synchronizing the device instead");
    device.synchronize_device().map_err(|d| {
        tracing::debug!(error = %d, "could not synchronize the device either");
        e
    })
}

/// Makes `waits` (from [`StreamOrder::cpu_waits_pending`]) on the CPU: what a strategy calls
/// with its lock released. A wait that fails is logged and skipped: the strategy finds out
/// what completed when it polls again.
pub(crate) fn wait_outside<D: Device + ?Sized>(device: &D, waits: &[CpuWait]) {
    for &w in waits {
        let result = match w {
            // The event may have been given back and recorded again meanwhile: then this
            // waits for later work, which is still finite.
            CpuWait::Event(e) => device.synchronize_event(e),
            CpuWait::Stream(s) => wait_for(device, s),
        };
        if let Err(e) = result {
            tracing::debug!(wait = ?w, error = %e, "a wait outside the lock failed");
        }
    }
}

/// How many entries from `i` on belong to the free at `i` (its pieces are adjacent).
fn pieces_of<C>(queue: &VecDeque<Pending<C>>, i: usize) -> usize {
    let free = queue[i].free;
    queue.iter().skip(i).take_while(|q| q.free == free).count()
}

impl<C: Chunk> StreamOrder<C> {
    /// True when `stream` is the stream of the first request: the hot path's only check.
    #[inline]
    pub fn is_first(&self, stream: Stream) -> bool {
        self.first == Some(stream)
    }

    /// True once frees are kept pending.
    #[inline]
    pub fn is_multi(&self) -> bool {
        self.multi
    }

    /// Number of pending chunks.
    #[inline]
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes of the pending chunks.
    #[inline]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// True while the fence is recorded and not known complete.
    #[inline]
    pub fn fence_active(&self) -> bool {
        self.fence.is_some()
    }

    /// How many times the fence was recorded so far.
    pub fn fence_records(&self) -> u64 {
        self.fence_records
    }

    /// True when something was freed at once since the fence was last recorded.
    pub fn unfenced(&self) -> bool {
        self.unfenced
    }

    /// Notes a free that went back at once, without an event (single-stream mode, or a
    /// synchronised one with no event recorded).
    #[inline]
    pub fn freed_at_once(&mut self) {
        self.unfenced = true;
    }

    /// Notes the stream of a request (called when [`StreamOrder::is_first`] is false); at the
    /// first request on a second stream, switches to stream-ordered frees, recording the
    /// fence if anything was freed at once (no CPU wait).
    ///
    /// # Errors
    /// The device's error when the fence cannot be recorded and neither the first stream nor
    /// the device can be synchronised: the request must not be served then (it could be
    /// handed that memory), and the switch is tried again at the next request.
    #[cold]
    #[inline(never)]
    pub fn see_stream<D: Device + ?Sized>(&mut self, device: &D, stream: Stream) -> Result<()> {
        match self.first {
            None => {
                self.first = Some(stream);
                self.multi = stream.is_per_thread();
            }
            Some(first) if first == stream && !stream.is_per_thread() => {}
            Some(_) if self.multi => {}
            Some(_) => {
                if self.unfenced {
                    self.fence_now(device)?;
                }
                self.multi = true;
            }
        }
        Ok(())
    }

    /// Records the fence on the first stream now (again, if it was recorded before: the new
    /// record covers the old one's work too, and every stream must wait for it anew). When
    /// no event can be recorded, waits for the first stream on the CPU instead (a driver
    /// that fails: with the lock held).
    ///
    /// # Errors
    /// The device's error when neither works.
    pub fn fence_now<D: Device + ?Sized>(&mut self, device: &D) -> Result<()> {
        let Some(first) = self.first else {
            self.unfenced = false;
            return Ok(());
        };
        let event = match self.fence.take() {
            Some(e) => Ok(e),
            None => self.take_event(device),
        };
        let recorded = event.and_then(|e| match device.record_event(e, first) {
            Ok(()) => Ok(e),
            Err(err) => {
                self.give_event(device, e);
                Err(err)
            }
        });
        match recorded {
            Ok(event) => {
                self.fence = Some(event);
                self.fence_records += 1;
                self.unfenced = false;
                Ok(())
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not record the fence; synchronizing instead");
                wait_for(device, first)?;
                self.unfenced = false;
                Ok(())
            }
        }
    }

    /// Forgets the fence once its event completed. True when it is gone (or never was).
    fn poll_fence<D: Device + ?Sized>(&mut self, device: &D) -> bool {
        let Some(fence) = self.fence else {
            return true;
        };
        if !matches!(device.event_complete(fence), Ok(true)) {
            return false;
        }
        self.fence = None;
        self.give_event(device, fence);
        true
    }

    /// Before a request on `stream` is served from the free lists: while the fence is
    /// active, `stream` gets a GPU-side wait for it — on every request, whatever stream
    /// waited before under this handle, and on the first stream's handle too: the handle
    /// may name a stream made since, which nothing orders after the fence (see the module
    /// docs). On the stream the fence was recorded on, or one that waited already, the wait
    /// orders nothing new and costs one driver call. When the wait cannot be enqueued, the
    /// fence is waited for on the CPU (a driver that fails).
    ///
    /// # Errors
    /// The device's error when neither works: the free lists must not serve `stream` then.
    pub fn order_after_fence<D: Device + ?Sized>(
        &mut self,
        device: &D,
        stream: Stream,
    ) -> Result<()> {
        if self.poll_fence(device) {
            return Ok(());
        }
        let Some(fence) = self.fence else {
            return Ok(());
        };
        if let Err(e) = device.wait_event(stream, fence) {
            tracing::debug!(stream = stream.0, error = %e,
                "could not wait for the fence on the device; waiting on the CPU");
            device.synchronize_event(fence)?;
            self.poll_fence(device);
        }
        Ok(())
    }

    fn take_event<D: Device + ?Sized>(&mut self, device: &D) -> Result<Event> {
        match self.idle.pop() {
            Some(e) => Ok(e),
            None => device.create_event(),
        }
    }

    fn give_event<D: Device + ?Sized>(&mut self, device: &D, event: Event) {
        if self.idle.len() < EVENT_POOL {
            self.idle.push(event);
        } else if let Err(e) = device.destroy_event(event) {
            tracing::debug!(event = event.0, error = %e, "could not destroy an event");
        }
    }

    fn push(&mut self, stream: Stream, chunk: C, event: Option<Event>) {
        let pending = Pending {
            chunk,
            event,
            free: self.next_free,
        };
        self.next_free += 1;
        match self.queues.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, queue)) => queue.push_back(pending),
            None => self.queues.push((stream, VecDeque::from([pending]))),
        }
        self.bytes += chunk.size();
        self.count += 1;
    }

    /// Frees `chunk` on `stream` while several streams are in use. Returns the chunk when it
    /// is safe for every stream at once (no event could be recorded, and `stream` — or the
    /// device — was synchronised instead): the caller returns it to its free lists. `None`:
    /// it is pending.
    pub fn free<D: Device + ?Sized>(&mut self, device: &D, stream: Stream, chunk: C) -> Option<C> {
        let recorded = match self.take_event(device) {
            Ok(event) => match device.record_event(event, stream) {
                Ok(()) => Ok(event),
                Err(e) => {
                    self.give_event(device, event);
                    Err(e)
                }
            },
            Err(e) => Err(e),
        };
        match recorded {
            Ok(event) => {
                self.push(stream, chunk, Some(event));
                None
            }
            Err(e) => {
                tracing::debug!(stream = stream.0, error = %e,
                    "could not record an event at a free; synchronizing instead");
                match wait_for(device, stream) {
                    Ok(()) => Some(chunk),
                    Err(sync) => {
                        tracing::warn!(stream = stream.0, record = %e, synchronize = %sync,
                            "neither an event nor a synchronisation: the freed memory stays \
                             reserved until the device can be synchronised");
                        self.push(stream, chunk, None);
                        None
                    }
                }
            }
        }
    }

    /// Removes the pending entries `range` of queue `qi` — whole frees, all their pieces —
    /// returning their chunks through `release` and each free's event to the pool.
    fn remove<D: Device + ?Sized>(
        &mut self,
        device: &D,
        qi: usize,
        range: std::ops::Range<usize>,
        release: &mut impl FnMut(C),
    ) {
        let removed: Vec<Pending<C>> = self.queues[qi].1.drain(range).collect();
        for (k, p) in removed.iter().enumerate() {
            self.bytes -= p.chunk.size();
            self.count -= 1;
            let last_piece = removed.get(k + 1).map_or(true, |q| q.free != p.free);
            if let (Some(event), true) = (p.event, last_piece) {
                self.give_event(device, event);
            }
            release(p.chunk);
        }
    }

    /// Returns the pending chunks that are safe now through `release`, and forgets the fence
    /// if it completed: each free whose own event completed — on an ordinary stream from the
    /// oldest up to the first whose event is still in flight (events recorded on one stream
    /// complete in order, so later ones are not asked; a handle that named two streams
    /// over time only makes this stop early), on [`Stream::PER_THREAD`] (another stream on
    /// each thread) all of them. A free without an event is kept: a later event on its
    /// handle may have been recorded on a stream made since, which says nothing of the work
    /// before the free ([`StreamOrder::sync_all`] returns it). A query that fails counts as
    /// not complete.
    ///
    /// # Time complexity
    /// One event query per stream with pending frees, plus one per free returned, plus the
    /// frees without an event passed over.
    pub fn poll<D: Device + ?Sized>(&mut self, device: &D, mut release: impl FnMut(C)) {
        self.poll_fence(device);
        let mut qi = 0;
        while qi < self.queues.len() {
            let (stream, ref queue) = self.queues[qi];
            let complete = |e: Event| matches!(device.event_complete(e), Ok(true));
            // The first entry of each free that is safe now, oldest first.
            let mut done: Vec<(usize, usize)> = Vec::new();
            let mut i = 0;
            while i < queue.len() {
                let n = pieces_of(queue, i);
                match queue[i].event {
                    None => {}
                    Some(e) if complete(e) => done.push((i, n)),
                    Some(_) if stream.is_per_thread() => {}
                    Some(_) => break,
                }
                i += n;
            }
            if done.iter().map(|d| d.1).sum::<usize>() == i {
                // The whole prefix scanned (the common case): one drain.
                self.remove(device, qi, 0..i, &mut release);
            } else {
                // Newest first, so that each range still names the entries it did.
                for &(at, n) in done.iter().rev() {
                    self.remove(device, qi, at..at + n, &mut release);
                }
            }
            if self.queues[qi].1.is_empty() {
                self.queues.swap_remove(qi);
            } else {
                qi += 1;
            }
        }
    }

    /// What waiting on the CPU for every pending free and the fence takes: for each ordinary
    /// stream with pending frees each free's event, newest first (on one stream the first
    /// wait covers the rest, which then return at once; a handle may have named several
    /// streams over time, and [`StreamOrder::poll`] returns a free only once its own event
    /// completed); for [`Stream::PER_THREAD`] the device; and the fence's event. Frees
    /// without an event need a wait for the device that [`StreamOrder::poll`] cannot see, so
    /// they add nothing here ([`StreamOrder::sync_all`] returns them). Empty when nothing
    /// is pending. A strategy makes these waits with [`wait_outside`], its lock released,
    /// then polls.
    pub fn cpu_waits_pending(&self) -> Vec<CpuWait> {
        let mut out: Vec<CpuWait> = Vec::new();
        for (stream, queue) in &self.queues {
            if stream.is_per_thread() {
                out.push(CpuWait::Stream(*stream));
                continue;
            }
            let mut last = None;
            for e in queue.iter().rev().filter_map(|p| p.event) {
                // Pieces of one free share its event, and sit next to each other.
                if last != Some(e) {
                    out.push(CpuWait::Event(e));
                    last = Some(e);
                }
            }
        }
        out.extend(self.fence.map(CpuWait::Event));
        out
    }

    /// Waits for every pending free and returns the chunks through `release`: on an ordinary
    /// stream each free's event, newest first (the first wait covers the rest when the handle
    /// named one stream throughout); on [`Stream::PER_THREAD`], on a stream with frees
    /// without an event, or when an event cannot be waited for, the whole device — never the
    /// handle's stream, which may be another than the one the frees were made on. With the
    /// lock held: for an allocator's drop, and the strategies' last resort.
    ///
    /// # Errors
    /// The device's error for a stream whose frees could not be waited for: they stay
    /// pending (the others are returned).
    pub fn sync_all<D: Device + ?Sized>(
        &mut self,
        device: &D,
        mut release: impl FnMut(C),
    ) -> Result<()> {
        let mut failed = None;
        let mut qi = 0;
        while qi < self.queues.len() {
            let (stream, ref queue) = self.queues[qi];
            let whole_device = stream.is_per_thread() || queue.iter().any(|p| p.event.is_none());
            let waited = if whole_device {
                device.synchronize_device()
            } else {
                let mut last = None;
                queue
                    .iter()
                    .rev()
                    .filter_map(|p| p.event)
                    .try_for_each(|e| {
                        if last == Some(e) {
                            return Ok(());
                        }
                        last = Some(e);
                        device.synchronize_event(e)
                    })
                    .or_else(|e| {
                        tracing::debug!(stream = stream.0, error = %e,
                            "could not wait for a pending free's event; synchronizing the device");
                        device.synchronize_device()
                    })
            };
            match waited {
                Ok(()) => {
                    let n = self.queues[qi].1.len();
                    self.remove(device, qi, 0..n, &mut release);
                    self.queues.swap_remove(qi);
                }
                Err(e) => {
                    tracing::warn!(stream = stream.0, error = %e,
                        "could not wait for pending frees; they stay reserved for their stream");
                    failed = Some(e);
                    qi += 1;
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Waits on the CPU for everything freed so far — the pending frees, the fence, and the
    /// first stream when frees went back at once since the fence — then returns the pending
    /// chunks: what a strategy does before it gives memory back to the device, whose plain
    /// free requires the work using it to be complete. With the lock held: for an
    /// allocator's drop, and the strategies' last resort.
    ///
    /// # Errors
    /// The device's error when a pending free, the fence or the first stream cannot be
    /// waited for.
    pub fn settle<D: Device + ?Sized>(&mut self, device: &D, release: impl FnMut(C)) -> Result<()> {
        if self.unfenced {
            if let Some(first) = self.first {
                wait_for(device, first)?;
            }
            self.unfenced = false;
        }
        if let Some(fence) = self.fence {
            device.synchronize_event(fence)?;
            self.fence = None;
            self.give_event(device, fence);
        }
        self.sync_all(device, release)
    }

    /// True when nothing freed so far can still be in use by work in flight, as far as the
    /// books know: no pending free, no fence, nothing freed at once since the last fence.
    pub fn is_settled(&self) -> bool {
        self.count == 0 && self.fence.is_none() && !self.unfenced
    }

    /// Serves a request on `stream` from one of the pending frees made on its handle, behind
    /// a GPU-side wait enqueued on `stream` for that free's event ([`Device::wait_event`]):
    /// no CPU wait. On the stream the free was made on the wait is already satisfied by
    /// stream order; but the handle may name a stream made since (the caller destroyed the
    /// old one with its work still queued), which only the wait orders after that work.
    /// `pick` rates each candidate (`None`: it does not fit; the smallest key wins) and
    /// `carve` cuts the request out of the winner, giving the grant and the pieces left,
    /// which stay pending under the same event. A free without an event is never taken, and
    /// when the wait cannot be enqueued nothing is taken. Never on [`Stream::PER_THREAD`]
    /// ([`StreamOrder::take_elsewhere`] serves it). `None` when nothing fits (or `carve`
    /// declines).
    ///
    /// # Time complexity
    /// Linear in `stream`'s pending frees.
    pub fn take<D, K, X, G>(
        &mut self,
        device: &D,
        stream: Stream,
        mut pick: impl FnMut(&C) -> Option<(K, X)>,
        carve: impl FnOnce(C, X) -> Option<(G, Vec<C>)>,
    ) -> Option<G>
    where
        D: Device + ?Sized,
        K: Ord,
    {
        if stream.is_per_thread() {
            return None;
        }
        let qi = self.queues.iter().position(|(s, _)| *s == stream)?;
        let (i, _, x) = self.queues[qi]
            .1
            .iter()
            .enumerate()
            .filter(|(_, p)| p.event.is_some())
            .filter_map(|(i, p)| pick(&p.chunk).map(|(k, x)| (i, k, x)))
            .min_by(|a, b| a.1.cmp(&b.1))?;
        let event = self.queues[qi].1[i].event?;
        if let Err(e) = device.wait_event(stream, event) {
            tracing::debug!(stream = stream.0, error = %e,
                "could not wait on the device for a free made on the request's handle");
            return None;
        }
        self.carve_out(device, qi, i, x, carve)
    }

    /// Serves a request on `stream` from a pending free of *another* stream (any queue, for
    /// [`Stream::PER_THREAD`]) after enqueuing on `stream` a GPU-side wait for that free's
    /// event ([`Device::wait_event`]): no CPU wait. `pick` and `carve` as for
    /// [`StreamOrder::take`]; a free without an event is never taken, and when the wait
    /// cannot be enqueued nothing is taken. `None` when nothing fits.
    ///
    /// # Time complexity
    /// Linear in the pending frees.
    pub fn take_elsewhere<D, K, X, G>(
        &mut self,
        device: &D,
        stream: Stream,
        mut pick: impl FnMut(&C) -> Option<(K, X)>,
        carve: impl FnOnce(C, X) -> Option<(G, Vec<C>)>,
    ) -> Option<G>
    where
        D: Device + ?Sized,
        K: Ord,
    {
        let own = |s: Stream| !stream.is_per_thread() && s == stream;
        let (qi, i, _, x) = self
            .queues
            .iter()
            .enumerate()
            .filter(|(_, (s, _))| !own(*s))
            .flat_map(|(qi, (_, queue))| {
                queue
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.event.is_some())
                    .map(move |(i, p)| (qi, i, p))
            })
            .filter_map(|(qi, i, p)| pick(&p.chunk).map(|(k, x)| (qi, i, k, x)))
            .min_by(|a, b| a.2.cmp(&b.2))?;
        let event = self.queues[qi].1[i].event?;
        if let Err(e) = device.wait_event(stream, event) {
            tracing::debug!(stream = stream.0, error = %e,
                "could not wait on the device for another stream's free");
            return None;
        }
        self.carve_out(device, qi, i, x, carve)
    }

    /// Cuts a request out of pending entry `i` of queue `qi` (see [`StreamOrder::take`]).
    fn carve_out<D, X, G>(
        &mut self,
        device: &D,
        qi: usize,
        i: usize,
        x: X,
        carve: impl FnOnce(C, X) -> Option<(G, Vec<C>)>,
    ) -> Option<G>
    where
        D: Device + ?Sized,
    {
        let p = self.queues[qi].1[i];
        let (grant, pieces) = carve(p.chunk, x)?;
        let queue = &mut self.queues[qi].1;
        queue.remove(i);
        let shared = (i > 0 && queue[i - 1].free == p.free)
            || queue.get(i).is_some_and(|q| q.free == p.free);
        let mut left = 0;
        for (k, chunk) in pieces.iter().enumerate() {
            left += chunk.size();
            queue.insert(
                i + k,
                Pending {
                    chunk: *chunk,
                    event: p.event,
                    free: p.free,
                },
            );
        }
        if queue.is_empty() {
            self.queues.swap_remove(qi);
        }
        self.bytes = self.bytes - p.chunk.size() + left;
        self.count = self.count - 1 + pieces.len();
        if pieces.is_empty() && !shared {
            if let Some(e) = p.event {
                self.give_event(device, e);
            }
        }
        Some(grant)
    }

    /// Every pending chunk with its stream.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (Stream, &C)> + '_ {
        self.queues
            .iter()
            .flat_map(|(s, q)| q.iter().map(move |p| (*s, &p.chunk)))
    }

    /// Every event held (pending, idle and the fence's), each once: for the strategy's drop.
    pub fn events(&self) -> Vec<Event> {
        let mut out: Vec<Event> = self
            .queues
            .iter()
            .flat_map(|(_, q)| q.iter().filter_map(|p| p.event))
            .chain(self.idle.iter().copied())
            .chain(self.fence)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Checks the invariants of the module docs; `in_use` tells whether the strategy still
    /// holds a chunk as in use (a pending chunk must be).
    pub fn check(&self, in_use: impl Fn(&C) -> bool) -> std::result::Result<(), String> {
        let (mut count, mut bytes) = (0usize, 0u64);
        let mut events: Vec<(Event, u64)> = Vec::new();
        for (stream, queue) in &self.queues {
            if queue.is_empty() {
                return Err(format!("an empty queue for {stream:?}"));
            }
            let mut frees: Vec<u64> = Vec::new();
            for (i, p) in queue.iter().enumerate() {
                count += 1;
                bytes += p.chunk.size();
                if !in_use(&p.chunk) {
                    return Err(format!(
                        "pending free at {:#x}+{} on {stream:?} is not a chunk in use",
                        p.chunk.addr(),
                        p.chunk.size()
                    ));
                }
                if i == 0 || queue[i - 1].free != p.free {
                    if frees.contains(&p.free) {
                        return Err(format!(
                            "pieces of one pending free on {stream:?} are not adjacent"
                        ));
                    }
                    frees.push(p.free);
                    if let Some(e) = p.event {
                        if events.iter().any(|&(f, _)| f == e) {
                            return Err(format!("event {e:?} serves two pending frees"));
                        }
                        events.push((e, p.free));
                    }
                } else if queue[i - 1].event != p.event {
                    return Err(format!("pieces of one free on {stream:?} differ in event"));
                }
            }
        }
        if self
            .queues
            .iter()
            .map(|(s, _)| s)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            != self.queues.len()
        {
            return Err("two queues for one stream".into());
        }
        if count != self.count || bytes != self.bytes {
            return Err(format!(
                "{count} pending frees of {bytes} B, counted {} of {} B",
                self.count, self.bytes
            ));
        }
        if self.idle.len() > EVENT_POOL {
            return Err("too many idle events".into());
        }
        if let Some(e) = self
            .idle
            .iter()
            .find(|e| events.iter().any(|(f, _)| f == *e))
        {
            return Err(format!("idle event {e:?} is pending too"));
        }
        if let Some(fence) = self.fence {
            if self.idle.contains(&fence) || events.iter().any(|&(e, _)| e == fence) {
                return Err(format!("the fence's event {fence:?} is idle or pending"));
            }
            if self.first.is_none() {
                return Err("a fence recorded before any stream was seen".into());
            }
        }
        if count > 0 && !self.multi {
            return Err("pending frees in single-stream mode".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
