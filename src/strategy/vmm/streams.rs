//! Stream-ordered reuse for [`super::VmmAllocator`], through the shared
//! [`crate::strategy::stream_order`] module (the same one bfc uses): see the parent module's
//! *Streams* section.
//!
//! A chunk freed on stream `S` while several streams are in use stays **pending**: in use in
//! the address space (so it coalesces with nothing and nobody else is handed it) and counted
//! on its granules (so none of them is stitched away or unmapped), with an event recorded on
//! `S` at the free. What is vmm's own is carving: part of a pending chunk reused by `S` is
//! cut out of it, and the rest stays pending under the same event.
#![deny(unsafe_code)]

use crate::device::{Device, Stream};

use super::space::{Grant, Space};
use super::{Inner, VmmAllocator};
use crate::strategy::stream_order::{self, TokenChunk};

pub use crate::strategy::stream_order::EVENT_POOL;

/// A pending chunk: where it is and the token the address space knows it by (a fresh one,
/// given at the free, so that the allocation's own is refused from then on).
pub(super) type VmmChunk = TokenChunk;

/// Stream-ordered reuse of vmm's chunks.
pub(super) type StreamOrder = stream_order::StreamOrder<VmmChunk>;

/// Checks the pending frees against the address space.
pub(super) fn check(order: &StreamOrder, space: &Space) -> Result<(), String> {
    // A pending free carries no tag (its label was cleared at the free): no sleep takes it.
    order.check(|p| {
        space.in_use_size(p.addr, p.token) == Some(p.size)
            && space.label(p.addr, p.token) == Some(0)
    })?;
    if order.bytes() > space.bytes_in_use() || order.count() > space.live_count() {
        return Err("pending frees exceed the chunks in use".into());
    }
    Ok(())
}

impl<D: Device + ?Sized> VmmAllocator<D> {
    /// Returns a chunk in use (pending, or freed at once) to the free space.
    fn release_chunk(&self, inner: &mut Inner, chunk: VmmChunk) {
        if let Some((size, _)) = inner.space.free(chunk.addr, chunk.token) {
            self.untouch(&mut inner.phys, chunk.addr, size);
        } else {
            debug_assert!(false, "a pending chunk was not in use");
        }
    }

    /// Frees the chunk at `addr` (handed out with `token`) while several streams are in
    /// use: pending on `stream` with an event, or at once when the stream (or device) was
    /// synchronised instead — or already, when `settled` (the caller synchronised the
    /// device). `false` when no live chunk has that token.
    pub(super) fn free_on_stream(
        &self,
        inner: &mut Inner,
        stream: Stream,
        addr: u64,
        token: u64,
        settled: bool,
    ) -> bool {
        let Some(chunk) = inner.space.retoken(addr, token) else {
            return false;
        };
        let chunk = VmmChunk {
            addr: chunk.addr,
            token: chunk.token,
            size: chunk.size,
        };
        if settled {
            self.release_chunk(inner, chunk);
        } else if let Some(now) = inner.order.free(&*self.device, stream, chunk) {
            self.release_chunk(inner, now);
        }
        true
    }

    /// Runs `step` on the stream-order books, then returns the chunks it gave back to the
    /// free space.
    fn give_back<R>(
        &self,
        inner: &mut Inner,
        step: impl FnOnce(&mut StreamOrder, &D, &mut Vec<VmmChunk>) -> R,
    ) -> R {
        let mut done = Vec::new();
        let result = step(&mut inner.order, &*self.device, &mut done);
        for c in done {
            self.release_chunk(inner, c);
        }
        result
    }

    /// Returns the pending frees that are safe now, and settles the granules a completed
    /// fence covers.
    pub(super) fn poll_pending(&self, inner: &mut Inner) {
        self.give_back(inner, |order, device, done| {
            order.poll(device, |c| done.push(c))
        });
        Self::sync_fence(inner);
    }

    /// Serves the request from a pending free behind a GPU-side wait on `stream` for its
    /// event (no CPU wait): one made on `stream`'s handle (which may name a stream made
    /// since the free), or with `elsewhere` one of another stream's. The
    /// smallest that holds it (then the lowest address), placed at its start (small
    /// requests) or its end (large ones) as free chunks are. What is left of that free stays
    /// pending under its event. `None` when none holds it.
    #[cold]
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn take_pending(
        &self,
        inner: &mut Inner,
        stream: Stream,
        rounded: u64,
        alignment: u64,
        small: bool,
        class: usize,
        requested: u64,
        elsewhere: bool,
    ) -> Option<Grant> {
        if inner.order.count() == 0 {
            return None;
        }
        let Inner {
            order, space, phys, ..
        } = inner;
        // A pending chunk serves requests of its own region's class only: a tag that can
        // sleep shares no granule with another. `fit` reads the space and `carve` changes
        // it, one after the other, never at once.
        let space = std::cell::RefCell::new(space);
        let fit = |p: &VmmChunk| {
            if space.borrow().class_of_token(p.token) != Some(class) {
                return None;
            }
            Space::fit(p.size, p.addr, rounded, alignment, !small).map(|at| ((p.size, p.addr), at))
        };
        let carve = |p: VmmChunk, at| {
            let (grant, rest) = space
                .borrow_mut()
                .carve(p.addr, p.token, at, rounded, requested)?;
            self.untouch(phys, p.addr, p.size);
            self.touch(phys, grant.addr, grant.size);
            let pieces = rest
                .iter()
                .map(|r| {
                    self.touch(phys, r.addr, r.size);
                    VmmChunk {
                        addr: r.addr,
                        token: r.token,
                        size: r.size,
                    }
                })
                .collect();
            Some((grant, pieces))
        };
        if elsewhere {
            order.take_elsewhere(&*self.device, stream, fit, carve)
        } else {
            order.take(&*self.device, stream, fit, carve)
        }
    }
}
