//! Stream-ordered reuse of freed memory: the one implementation that the pooling strategies
//! (`bfc`, `vmm`) share, so that the stream-ordering contract of [`Device`] is kept in one
//! place.
//!
//! # What it does
//!
//! * **One stream**: while every request has come on one stream, a free goes straight back to
//!   the strategy's free lists, as in XLA, and no event is made. The single-stream path costs
//!   one comparison ([`StreamOrder::is_first`]).
//! * **The switch**: at the first request on a second stream (or the first on
//!   [`Stream::PER_THREAD`], which names another stream on each thread), the first stream is
//!   synchronised once if anything was freed on it, since those frees carried no event.
//! * **Several streams**: a chunk freed on stream `S` is kept **pending** — still in use for
//!   the strategy, so it coalesces with nothing and nobody else is handed it — with an event
//!   recorded on `S` at the free. Events come from a small pool ([`EVENT_POOL`]).
//!   [`StreamOrder::take`] lets a request on `S` reuse one of `S`'s own pending chunks at once
//!   (never on [`Stream::PER_THREAD`]); [`StreamOrder::poll`] returns the pending chunks whose
//!   event completed; [`StreamOrder::sync_all`] waits for all of them (before a strategy grows,
//!   fails, or trims).
//! * **A refusal is never "idle"**: when no event can be recorded on `S` (a stream the driver
//!   rejects, a failing driver), `S` is synchronised and the chunk is free at once; when `S`
//!   cannot be synchronised either, the device is; and when that fails too the chunk stays
//!   pending *without* an event: it is returned only once a later event on `S` completes
//!   (events on one stream complete in order) or a later synchronisation succeeds.
//!
//! # Invariants (checked by [`StreamOrder::check`])
//!
//! * `bytes` and `count` are the sum of the sizes and the number of pending chunks.
//! * Pieces of one free (a strategy may carve a request out of a pending chunk and keep the
//!   rest pending) share its event and its `free` number and sit next to each other in their
//!   stream's queue; no event is used by two frees; no idle event is pending.
//! * At most [`EVENT_POOL`] idle events.
//! * `multi` is true once two streams were seen, or [`Stream::PER_THREAD`] was.
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

/// Stream-ordered reuse (see the module docs).
#[derive(Debug)]
pub(crate) struct StreamOrder<C> {
    /// The stream of the first request.
    first: Option<Stream>,
    /// True once a request came on a second stream (or on [`Stream::PER_THREAD`]): frees are
    /// then kept pending.
    multi: bool,
    /// Something was freed straight back, without an event, before the switch.
    freed_while_single: bool,
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
            freed_while_single: false,
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

    /// Notes a free that went straight back (single-stream mode).
    #[inline]
    pub fn freed_at_once(&mut self) {
        self.freed_while_single = true;
    }

    /// Notes the stream of a request (called when [`StreamOrder::is_first`] is false); at the
    /// first request on a second stream, switches to stream-ordered frees.
    ///
    /// # Errors
    /// The device's error when the first stream had frees without events and neither it nor
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
            Some(first) => {
                if self.freed_while_single {
                    // Frees on `first` went back without an event: wait for its work once
                    // before another stream may be handed that memory.
                    wait_for(device, first)?;
                }
                self.multi = true;
            }
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
                             reserved for its stream until one succeeds");
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

    /// Returns the pending chunks that are safe now through `release`. On an ordinary stream,
    /// everything up to the newest completed event (events on one stream complete in order;
    /// frees without an event before it are safe too); on [`Stream::PER_THREAD`] (another
    /// stream on each thread) each free whose own event completed. A query that fails counts
    /// as not complete.
    ///
    /// # Time complexity
    /// One event query per stream with pending frees, plus one per free returned.
    pub fn poll<D: Device + ?Sized>(&mut self, device: &D, mut release: impl FnMut(C)) {
        let mut qi = 0;
        while qi < self.queues.len() {
            let (stream, ref queue) = self.queues[qi];
            let complete = |e: Event| matches!(device.event_complete(e), Ok(true));
            if stream.is_per_thread() {
                let mut i = 0;
                while i < self.queues[qi].1.len() {
                    let n = pieces_of(&self.queues[qi].1, i);
                    if self.queues[qi].1[i].event.is_some_and(complete) {
                        self.remove(device, qi, i..i + n, &mut release);
                    } else {
                        i += n;
                    }
                }
            } else {
                let mut done = 0;
                let mut i = 0;
                while i < queue.len() {
                    let n = pieces_of(queue, i);
                    match queue[i].event {
                        None => i += n,
                        Some(e) if complete(e) => {
                            i += n;
                            done = i;
                        }
                        Some(_) => break,
                    }
                }
                self.remove(device, qi, 0..done, &mut release);
            }
            if self.queues[qi].1.is_empty() {
                self.queues.swap_remove(qi);
            } else {
                qi += 1;
            }
        }
    }

    /// Waits for every pending free and returns the chunks through `release`: on an ordinary
    /// stream one wait for its newest event (or the stream, or the device, when that fails or
    /// frees without an event come after it); on [`Stream::PER_THREAD`] the device.
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
            let newest = queue.iter().rposition(|p| p.event.is_some());
            let after = newest.map_or(0, |i| i + 1);
            let unevented_after = queue.iter().skip(after).any(|p| p.event.is_none());
            let waited = match newest.and_then(|i| queue[i].event) {
                Some(e) if !unevented_after && !stream.is_per_thread() => device
                    .synchronize_event(e)
                    .or_else(|_| wait_for(device, stream)),
                _ => wait_for(device, stream),
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

    /// Waits for everything freed so far, pending or not (single-stream frees carry no
    /// event), then returns the pending chunks: what a strategy does before it gives memory
    /// back to the device, whose plain free requires the work using it to be complete.
    ///
    /// # Errors
    /// The device's error when a pending free or the first stream cannot be waited for.
    pub fn settle<D: Device + ?Sized>(&mut self, device: &D, release: impl FnMut(C)) -> Result<()> {
        if self.freed_while_single && !self.multi {
            if let Some(first) = self.first {
                wait_for(device, first)?;
                self.freed_while_single = false;
            }
        }
        self.sync_all(device, release)
    }

    /// Serves a request on `stream` from one of its own pending frees, at once: `pick` rates
    /// each candidate (`None`: it does not fit; the smallest key wins) and `carve` cuts the
    /// request out of the winner, giving the grant and the pieces left, which stay pending
    /// under the same event. Never on [`Stream::PER_THREAD`]. `None` when nothing fits (or
    /// `carve` declines).
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
        let queue = &self.queues[qi].1;
        let (i, _, x) = queue
            .iter()
            .enumerate()
            .filter_map(|(i, p)| pick(&p.chunk).map(|(k, x)| (i, k, x)))
            .min_by(|a, b| a.1.cmp(&b.1))?;
        let p = queue[i];
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

    /// Every event held (pending and idle), each once: for the strategy's drop.
    pub fn events(&self) -> Vec<Event> {
        let mut out: Vec<Event> = self
            .queues
            .iter()
            .flat_map(|(_, q)| q.iter().filter_map(|p| p.event))
            .chain(self.idle.iter().copied())
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
        if count > 0 && !self.multi {
            return Err("pending frees in single-stream mode".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
