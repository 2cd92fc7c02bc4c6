//! [`RecorderAllocator`]: records the allocation trace of any live allocator, for
//! `portalloc replay` to answer "which strategy, how much memory" about a real program.
#![deny(unsafe_code)]

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::allocator::{Allocation, Allocator, Stats};
use crate::device::Stream;
use crate::error::Result;
use crate::trace::{export, Event, Op, TagId, TraceHeader};

#[derive(Debug)]
struct Log {
    /// Events in call order. Invariant: `events[i].seq == i`.
    events: Vec<Event>,
    /// Tag table; an event's tag `k ≥ 1` is `tags[k - 1]`.
    tags: Vec<String>,
    /// Address of each live allocation → its trace id and tag. Invariant: one entry per
    /// live, non-empty allocation made through this recorder.
    live: HashMap<u64, (u64, TagId)>,
    next_id: u64,
}

/// Wraps an allocator and records every allocation and free it serves (successful ones;
/// refused requests are not events, as in RMM's log), with time, thread, stream and tag.
///
/// Events are kept in memory (48 bytes each) until [`RecorderAllocator::trace`] or a
/// `write_*` call, because the own format puts the tag table first and tags are only
/// known as they arrive. Zero-byte allocations own no memory and are not recorded.
#[derive(Debug)]
pub struct RecorderAllocator<A: Allocator> {
    inner: A,
    started: Instant,
    source: String,
    log: Mutex<Log>,
}

impl<A: Allocator> RecorderAllocator<A> {
    /// Records what `inner` serves; `source` names the program in the trace header.
    pub fn new(inner: A, source: impl Into<String>) -> Self {
        RecorderAllocator {
            inner,
            started: Instant::now(),
            source: source.into(),
            log: Mutex::new(Log {
                events: Vec::new(),
                tags: Vec::new(),
                live: HashMap::new(),
                next_id: 0,
            }),
        }
    }

    /// The allocator beneath.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        // Every update is a few pushes after the inner call; a panic elsewhere cannot leave
        // the log half-written, so a poisoned lock is still usable.
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The trace so far: a header (source, tag table, what was live before recording
    /// started = nothing) and the events.
    pub fn trace(&self) -> (TraceHeader, Vec<Event>) {
        let log = self.log();
        let mut header = TraceHeader::new(format!("recorder:{}", self.source));
        header.tags = log.tags.clone();
        header.notes.push(format!(
            "recorded through portalloc's {} allocator",
            self.inner.name()
        ));
        (header, log.events.clone())
    }

    /// Writes the trace so far in portalloc's own format. Returns the events written.
    ///
    /// # Errors
    /// I/O errors as [`crate::Error::Trace`].
    pub fn write_portalloc<W: Write>(&self, out: W) -> Result<u64> {
        let (header, events) = self.trace();
        Ok(export::write_portalloc(
            out,
            &header,
            events.into_iter().map(Ok),
        )?)
    }

    /// Writes the trace so far as RMM's logging CSV. Returns the rows written.
    ///
    /// # Errors
    /// I/O errors as [`crate::Error::Trace`].
    pub fn write_rmm_csv<W: Write>(&self, out: W) -> Result<u64> {
        let (_, events) = self.trace();
        Ok(export::write_rmm_csv(out, events.into_iter().map(Ok))?)
    }

    fn push(
        log: &mut Log,
        started: Instant,
        op: Op,
        id: u64,
        size: u64,
        stream: Stream,
        tag: TagId,
    ) {
        let seq = log.events.len() as u64;
        log.events.push(Event {
            seq,
            time_ns: started.elapsed().as_nanos() as u64,
            thread: thread_number(),
            stream: stream.0,
            op,
            id,
            size,
            tag,
        });
    }
}

/// A small number for the calling thread, stable for its life.
fn thread_number() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    thread_local!(static ID: u32 = NEXT.fetch_add(1, Ordering::Relaxed));
    ID.with(|id| *id)
}

impl<A: Allocator> Allocator for RecorderAllocator<A> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn id(&self) -> u64 {
        self.inner.id()
    }

    fn allocate(&self, size: u64, alignment: u64, stream: Stream, tag: &str) -> Result<Allocation> {
        let allocation = self.inner.allocate(size, alignment, stream, tag)?;
        if allocation.is_empty() {
            return Ok(allocation);
        }
        let mut log = self.log();
        let tag_id = if tag.is_empty() {
            0
        } else if let Some(i) = log.tags.iter().position(|t| t == tag) {
            (i + 1) as TagId
        } else if log.tags.len() < usize::from(TagId::MAX) {
            log.tags.push(tag.to_string());
            log.tags.len() as TagId
        } else {
            0
        };
        let id = log.next_id;
        log.next_id += 1;
        log.live.insert(allocation.ptr(), (id, tag_id));
        Self::push(&mut log, self.started, Op::Alloc, id, size, stream, tag_id);
        Ok(allocation)
    }

    fn deallocate(&self, allocation: Allocation) -> Result<()> {
        let (ptr, size, stream, empty) = (
            allocation.ptr(),
            allocation.size(),
            allocation.stream(),
            allocation.is_empty(),
        );
        // Out of the books before the inner free: once it returns, another thread may be
        // handed the same address, and its allocation must not be taken for this one.
        let entry = if empty {
            None
        } else {
            self.log().live.remove(&ptr)
        };
        if let Err(e) = self.inner.deallocate(allocation) {
            if let Some(entry) = entry {
                // Refused: still live, so no other allocation holds the address.
                self.log().live.insert(ptr, entry);
            }
            return Err(e);
        }
        if let Some((id, tag)) = entry {
            Self::push(
                &mut self.log(),
                self.started,
                Op::Free,
                id,
                size,
                stream,
                tag,
            );
        }
        Ok(())
    }

    fn stats(&self) -> Stats {
        self.inner.stats()
    }

    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        self.inner.charged(allocation)
    }

    fn pool_bytes(&self) -> u64 {
        self.inner.pool_bytes()
    }

    fn trim(&self) -> Result<u64> {
        self.inner.trim()
    }

    fn sleep(
        &self,
        tag: &str,
        keep: crate::allocator::Keep,
    ) -> Result<crate::allocator::SleepReport> {
        self.inner.sleep(tag, keep)
    }

    fn wake(&self, tag: &str) -> Result<crate::allocator::SleepReport> {
        self.inner.wake(tag)
    }

    fn sleeping(&self) -> Vec<crate::allocator::SleepingTag> {
        self.inner.sleeping()
    }

    fn is_asleep(&self, allocation: &Allocation) -> bool {
        self.inner.is_asleep(allocation)
    }

    fn backing(&self, allocation: &Allocation) -> Result<crate::allocator::Backing> {
        self.inner.backing(allocation)
    }

    fn tag_of(&self, allocation: &Allocation) -> Option<String> {
        self.inner.tag_of(allocation)
    }

    fn retag(&self, allocation: &Allocation, tag: &str) {
        self.inner.retag(allocation, tag);
    }

    fn freeing(&self, allocation: &Allocation) {
        self.inner.freeing(allocation);
    }

    fn queues_on_stream(&self) -> bool {
        self.inner.queues_on_stream()
    }

    fn graph_pools(&self) -> Vec<crate::adaptor::GraphPoolStats> {
        self.inner.graph_pools()
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.inner.check_invariants()
    }
}
