//! Stream-ordered reuse for [`super::VmmAllocator`], after bfc's: see the parent module's
//! *Streams* section.
//!
//! A chunk freed on stream `S` while several streams are in use stays **pending**: in use in
//! the address space (so it coalesces with nothing and nobody else is handed it) and counted
//! on its granules (so none of them is stitched away or unmapped), with an event recorded on
//! `S` at the free. Part of a pending chunk reused by `S` is carved out of it; the rest stays
//! pending under the same event.
#![deny(unsafe_code)]

use std::collections::VecDeque;

use crate::device::{Device, Event, Stream};

use super::space::{Grant, Space};
use super::{Inner, VmmAllocator};

use crate::strategy::idle_events::IdleEvents;
pub use crate::strategy::idle_events::EVENT_POOL;

/// A chunk freed on a stream while other streams are in use, not yet safe for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pending {
    /// First byte of the chunk.
    pub addr: u64,
    /// The chunk's token in the address space (a fresh one, given at the free).
    pub token: u64,
    /// Bytes of the chunk.
    pub size: u64,
    /// Recorded on the freeing stream at the free. Pieces carved from one free share it;
    /// they are always next to each other in their queue.
    pub event: Event,
}

/// Stream-ordered reuse.
#[derive(Debug, Default)]
pub(super) struct StreamOrder {
    /// The stream of the first request.
    pub first: Option<Stream>,
    /// True once a request came on a second stream: frees are then kept pending.
    pub multi: bool,
    /// Something was freed (straight back to the address space) before the switch.
    pub freed_while_single: bool,
    /// Pending frees by stream, oldest first. Invariant: their sizes sum to `bytes`, their
    /// number is `count`, each is a chunk in use in the address space with its token.
    pub pending: Vec<(Stream, VecDeque<Pending>)>,
    /// Bytes of the pending frees.
    pub bytes: u64,
    /// Number of pending frees.
    pub count: usize,
    /// Events not recorded on anything now, for reuse (at most [`EVENT_POOL`]).
    pub(crate) idle_events: IdleEvents,
}

impl StreamOrder {
    /// Every event held (pending and idle), each once.
    pub fn events(&self) -> Vec<Event> {
        let mut out: Vec<Event> = self
            .pending
            .iter()
            .flat_map(|(_, q)| q.iter().map(|p| p.event))
            .chain(self.idle_events.iter())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Checks the books against the address space.
    pub fn check(&self, space: &Space) -> Result<(), String> {
        let mut count = 0usize;
        let mut bytes = 0u64;
        for (stream, queue) in &self.pending {
            let mut seen: Vec<Event> = Vec::new();
            let mut last: Option<Event> = None;
            for p in queue {
                count += 1;
                bytes += p.size;
                if space.in_use_size(p.addr, p.token) != Some(p.size) {
                    return Err(format!(
                        "pending free at {:#x}+{} on {stream:?} is not a chunk in use",
                        p.addr, p.size
                    ));
                }
                if last != Some(p.event) {
                    if seen.contains(&p.event) {
                        return Err(format!(
                            "pieces of one pending free on {stream:?} are not adjacent"
                        ));
                    }
                    seen.push(p.event);
                    last = Some(p.event);
                }
            }
        }
        if count != self.count || bytes != self.bytes {
            return Err(format!(
                "{count} pending frees of {bytes} B, counted {} of {} B",
                self.count, self.bytes
            ));
        }
        if bytes > space.bytes_in_use() || count > space.live_count() {
            return Err("pending frees exceed the chunks in use".into());
        }
        if self.idle_events.len() > EVENT_POOL {
            return Err("too many idle events".into());
        }
        Ok(())
    }
}

impl<D: Device + ?Sized> VmmAllocator<D> {
    /// Notes the stream of a request; at the first request on a second stream, switches to
    /// stream-ordered frees.
    #[cold]
    #[inline(never)]
    pub(super) fn see_stream(&self, inner: &mut Inner, stream: Stream) {
        let order = &mut inner.order;
        match order.first {
            Some(first) if first == stream || order.multi => {}
            Some(first) => {
                order.multi = true;
                if order.freed_while_single {
                    // Frees on `first` went back without an event: wait for its work once
                    // before another stream may be handed that memory.
                    self.synchronize(first);
                }
            }
            None => order.first = Some(stream),
        }
    }

    /// Waits for `stream`'s work; a device that refuses (a stream it does not know) has no
    /// work there that could still use memory.
    fn synchronize(&self, stream: Stream) {
        if let Err(e) = self.device.synchronize_stream(stream) {
            tracing::debug!(stream = stream.0, error = %e,
                "vmm: could not synchronize the stream: the device has no work on it");
        }
    }

    /// Returns a chunk in use (pending, or freed at once) to the free space.
    fn release_chunk(&self, inner: &mut Inner, addr: u64, token: u64) {
        if let Some((size, _)) = inner.space.free(addr, token) {
            self.untouch(&mut inner.phys, addr, size);
        } else {
            debug_assert!(false, "a pending chunk was not in use");
        }
    }

    /// Frees the chunk at `addr` (handed out with `token`) while several streams are in
    /// use: pending on `stream` with an event, or at once when no event can be recorded
    /// there. `false` when no live chunk has that token.
    pub(super) fn free_on_stream(
        &self,
        inner: &mut Inner,
        stream: Stream,
        addr: u64,
        token: u64,
    ) -> bool {
        // A fresh token: the allocation's own is refused from now on (a second free).
        let Some(chunk) = inner.space.retoken(addr, token) else {
            return false;
        };
        let recorded = inner
            .order
            .idle_events
            .take(&*self.device)
            .and_then(|event| match self.device.record_event(event, stream) {
                Ok(()) => Ok(event),
                Err(e) => {
                    inner.order.idle_events.give(&*self.device, event);
                    Err(e)
                }
            });
        let event = match recorded {
            Ok(event) => event,
            Err(e) => {
                tracing::debug!(stream = stream.0, error = %e, "vmm: could not record an event");
                self.synchronize(stream);
                self.release_chunk(inner, chunk.addr, chunk.token);
                return true;
            }
        };
        let pending = Pending {
            addr: chunk.addr,
            token: chunk.token,
            size: chunk.size,
            event,
        };
        let order = &mut inner.order;
        match order.pending.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, queue)) => queue.push_back(pending),
            None => order.pending.push((stream, VecDeque::from([pending]))),
        }
        order.bytes += chunk.size;
        order.count += 1;
        true
    }

    /// Returns the pending frees whose events have completed: the oldest of each stream
    /// first, stopping at the first that has not (a stream's events complete in order).
    pub(super) fn poll_pending(&self, inner: &mut Inner) {
        let mut done: Vec<(Pending, bool)> = Vec::new();
        for (_, queue) in &mut inner.order.pending {
            while let Some(p) = queue.front().copied() {
                if !matches!(self.device.event_complete(p.event), Ok(true)) {
                    break;
                }
                queue.pop_front();
                let last_of_event = queue.front().map_or(true, |q| q.event != p.event);
                done.push((p, last_of_event));
            }
        }
        inner.order.pending.retain(|(_, q)| !q.is_empty());
        for (p, last) in done {
            self.finish_pending(inner, p, last);
        }
    }

    /// Waits for every pending free and returns them all.
    pub(super) fn sync_pending(&self, inner: &mut Inner) {
        let queues = std::mem::take(&mut inner.order.pending);
        for (stream, queue) in queues {
            let mut waited: Option<Event> = None;
            let mut queue = queue;
            while let Some(p) = queue.pop_front() {
                if waited != Some(p.event) {
                    if let Err(e) = self.device.synchronize_event(p.event) {
                        if let Err(sync) = self.device.synchronize_stream(stream) {
                            tracing::debug!(stream = stream.0, event = %e, synchronize = %sync,
                                "vmm: could not wait for a pending free; returning it anyway");
                        }
                    }
                    waited = Some(p.event);
                }
                let last = queue.front().map_or(true, |q| q.event != p.event);
                self.finish_pending(inner, p, last);
            }
        }
    }

    fn finish_pending(&self, inner: &mut Inner, p: Pending, last_of_event: bool) {
        inner.order.bytes -= p.size;
        inner.order.count -= 1;
        self.release_chunk(inner, p.addr, p.token);
        if last_of_event {
            inner.order.idle_events.give(&*self.device, p.event);
        }
    }

    /// Polls the pending frees, then serves the request from one of `stream`'s own: the
    /// smallest that holds it (then the lowest address), placed at its start (small
    /// requests) or its end (large ones) as free chunks are. What is left of that free stays
    /// pending under its event. `None` when none holds it.
    #[cold]
    #[inline(never)]
    pub(super) fn take_pending(
        &self,
        inner: &mut Inner,
        stream: Stream,
        rounded: u64,
        alignment: u64,
        small: bool,
        requested: u64,
    ) -> Option<Grant> {
        self.poll_pending(inner);
        let qi = inner.order.pending.iter().position(|(s, _)| *s == stream)?;
        let queue = &inner.order.pending[qi].1;
        let (i, at) = queue
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                Space::fit(p.size, p.addr, rounded, alignment, !small).map(|at| (i, at))
            })
            .min_by_key(|&(i, _)| (queue[i].size, queue[i].addr))?;
        let p = queue[i];
        let (grant, rest) = inner.space.carve(p.addr, p.token, at, rounded, requested)?;
        self.untouch(&mut inner.phys, p.addr, p.size);
        self.touch(&mut inner.phys, grant.addr, grant.size);
        for r in &rest {
            self.touch(&mut inner.phys, r.addr, r.size);
        }
        let pieces: Vec<Pending> = rest
            .iter()
            .map(|r| Pending {
                addr: r.addr,
                token: r.token,
                size: r.size,
                event: p.event,
            })
            .collect();
        let order = &mut inner.order;
        let queue = &mut order.pending[qi].1;
        queue.remove(i);
        let shared = (i > 0 && queue[i - 1].event == p.event)
            || queue.get(i).is_some_and(|q| q.event == p.event);
        for (k, piece) in pieces.iter().enumerate() {
            queue.insert(i + k, *piece);
        }
        if queue.is_empty() {
            order.pending.swap_remove(qi);
        }
        order.bytes -= grant.size;
        order.count = order.count - 1 + pieces.len();
        if pieces.is_empty() && !shared {
            order.idle_events.give(&*self.device, p.event);
        }
        Some(grant)
    }
}
