//! The handle table of one C-ABI allocator: generation-checked handles over the ledger's
//! [`Allocation`]s, and the address → handle index for freeing by raw pointer.
//!
//! A handle packs `(tag << 44) | (generation << 24) | slot`:
//!
//! * `tag` (20 bits) names the table: taken from a process-wide counter and **never reused
//!   within the process** (never 0), so a handle one allocator issued is refused by every
//!   other allocator, live or made later, as "not issued by this allocator" — however many
//!   allocators came and went. Once 2^20 − 1 tables were made, making another is refused;
//! * `generation` (20 bits) grows each time the slot is reused, so a handle kept after its
//!   buffer was freed or donated never names the buffer that reuses the slot: a slot whose
//!   generation reached the maximum is retired, never reused; generation 0 is never issued;
//! * `slot` (24 bits): at most 2^24 buffers (retired slots included) in one allocator.
//!
//! Handle 0 is never valid. A table is *closed* by the allocator's destroy: from then on
//! nothing is inserted, so an allocation racing the destroy is refused and given back rather
//! than handed out over memory the destroy frees.
use std::sync::atomic::{AtomicU32, Ordering};

use rustc_hash::FxHashMap;

use crate::allocator::Allocation;
use crate::device::Stream;
use crate::error::{Error, Result};

/// Bits of a handle that number the slot.
const SLOT_BITS: u32 = 24;
/// Bits of a handle that hold the slot's generation.
const GENERATION_BITS: u32 = 20;
/// Bits of a handle that hold the table's tag.
const TAG_BITS: u32 = 20;
const _: () = assert!(SLOT_BITS + GENERATION_BITS + TAG_BITS == 64);
/// The most buffers one allocator holds at once.
pub(crate) const MAX_LIVE: usize = 1 << SLOT_BITS;
const GENERATION_MAX: u32 = (1 << GENERATION_BITS) - 1;
/// The most tables one process makes.
const TAG_MAX: u32 = (1 << TAG_BITS) - 1;

/// Why a handle or pointer was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Freed or donated (or its slot reused since).
    Gone { handle: u64, how: &'static str },
    /// Never issued by this allocator.
    NeverIssued { handle: u64 },
    /// A pointer no live buffer of this allocator starts at.
    UnknownPointer { ptr: u64 },
    /// The allocator holds [`MAX_LIVE`] buffers already.
    Full,
    /// The allocator was destroyed while the call ran.
    Closed,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Gone { handle, how } => write!(
                f,
                "handle {handle:#018x}: buffer has been deleted or donated ({how}); \
                 nothing was freed"
            ),
            Refusal::NeverIssued { handle } => write!(
                f,
                "handle {handle:#018x} was not issued by this allocator; nothing was freed"
            ),
            Refusal::UnknownPointer { ptr } => write!(
                f,
                "pointer {ptr:#x} is not the start of a live buffer of this allocator (a \
                 foreign pointer, or its buffer has been deleted or donated); nothing was freed"
            ),
            Refusal::Full => write!(
                f,
                "the allocator holds {MAX_LIVE} buffers, the most one C-ABI allocator can \
                 hand out handles for; free some first"
            ),
            Refusal::Closed => write!(
                f,
                "the allocator was destroyed while this call ran; nothing was allocated"
            ),
        }
    }
}

/// A live buffer: its allocation, and the streams other than its own that it was used on
/// ([`HandleTable::record_use`]), which its free waits for.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) allocation: Allocation,
    pub(crate) uses: Vec<StreamUse>,
}

/// A stream a buffer was used on. [`Stream::PER_THREAD`] names another stream on each
/// thread, so it goes with the thread that recorded it
/// ([`crate::device::thread_number`]; 0 for any other stream): an event recorded on another
/// thread's per-thread stream orders nothing after this one's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamUse {
    pub(crate) stream: Stream,
    pub(crate) thread: u64,
}

impl StreamUse {
    /// `stream` as used by the calling thread.
    pub(crate) fn here(stream: Stream) -> StreamUse {
        let thread = if stream.is_per_thread() {
            crate::device::thread_number()
        } else {
            0
        };
        StreamUse { stream, thread }
    }

    /// True when the calling thread can order work after this use with an event on its
    /// stream: any stream but another thread's per-thread one.
    pub(crate) fn reachable_here(&self) -> bool {
        !self.stream.is_per_thread() || self.thread == crate::device::thread_number()
    }
}

#[derive(Debug)]
enum State {
    Live(Live),
    Freed,
    Donated,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    state: State,
}

/// Live buffers by handle, and by address.
#[derive(Debug)]
pub(crate) struct HandleTable {
    /// This table's tag, unique in the process (see the module docs).
    tag: u32,
    slots: Vec<Slot>,
    /// Slots free for reuse (never a retired one, whose generation is at the maximum).
    vacant: Vec<u32>,
    by_ptr: FxHashMap<u64, u64>,
    /// Set by the allocator's destroy: nothing is inserted afterwards.
    closed: bool,
}

/// The next table's tag; the counter only grows.
static NEXT_TAG: AtomicU32 = AtomicU32::new(1);

fn pack(tag: u32, generation: u32, index: u32) -> u64 {
    (u64::from(tag) << (SLOT_BITS + GENERATION_BITS))
        | (u64::from(generation) << SLOT_BITS)
        | u64::from(index)
}

/// `(tag, generation, slot)`.
fn unpack(handle: u64) -> (u32, u32, u32) {
    (
        (handle >> (SLOT_BITS + GENERATION_BITS)) as u32,
        ((handle >> SLOT_BITS) as u32) & GENERATION_MAX,
        (handle as u32) & (MAX_LIVE as u32 - 1),
    )
}

impl HandleTable {
    /// An empty table with a tag no table of this process had before.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when this process has made 2^20 − 1 C-ABI allocators.
    pub(crate) fn new() -> Result<HandleTable> {
        let tag = NEXT_TAG
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                (t <= TAG_MAX).then_some(t + 1)
            })
            .map_err(|_| Error::InvalidArgument {
                call: "portalloc_create",
                reason: format!(
                    "this process has made {TAG_MAX} C-ABI allocators, the most it can: a \
                     handle's allocator tag is never reused, so that a destroyed allocator's \
                     handles are refused by every later one"
                ),
            })?;
        Ok(HandleTable {
            tag,
            slots: Vec::new(),
            vacant: Vec::new(),
            by_ptr: FxHashMap::default(),
            closed: false,
        })
    }

    /// Stores a live allocation; returns its handle.
    ///
    /// # Errors
    /// The allocation back, with [`Refusal::Full`] when [`MAX_LIVE`] slots are used, or
    /// [`Refusal::Closed`] after [`HandleTable::close`].
    pub(crate) fn insert(&mut self, allocation: Allocation) -> Result<u64, (Refusal, Allocation)> {
        if self.closed {
            return Err((Refusal::Closed, allocation));
        }
        let ptr = allocation.ptr();
        let live = State::Live(Live {
            allocation,
            uses: Vec::new(),
        });
        let handle = match self.vacant.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.generation += 1;
                slot.state = live;
                pack(self.tag, slot.generation, index)
            }
            None if self.slots.len() >= MAX_LIVE => {
                let State::Live(l) = live else { unreachable!() };
                return Err((Refusal::Full, l.allocation));
            }
            None => {
                let index = self.slots.len() as u32;
                self.slots.push(Slot {
                    generation: 1,
                    state: live,
                });
                pack(self.tag, 1, index)
            }
        };
        if ptr != 0 {
            self.by_ptr.insert(ptr, handle);
        }
        Ok(handle)
    }

    fn slot(&self, handle: u64) -> Result<(u32, &Slot), Refusal> {
        let (tag, generation, index) = unpack(handle);
        // A handle of this table has its tag and nothing in the bits between the fields.
        let slot = self
            .slots
            .get(index as usize)
            .filter(|s| tag == self.tag && generation != 0 && generation <= s.generation)
            .filter(|_| pack(tag, generation, index) == handle)
            .ok_or(Refusal::NeverIssued { handle })?;
        Ok((index, slot))
    }

    /// The live buffer `handle` names.
    fn live(&self, handle: u64) -> Result<&Live, Refusal> {
        let (_, slot) = self.slot(handle)?;
        let (_, generation, _) = unpack(handle);
        match &slot.state {
            State::Live(l) if slot.generation == generation => Ok(l),
            State::Donated if slot.generation == generation => Err(Refusal::Gone {
                handle,
                how: "it was donated",
            }),
            State::Freed if slot.generation == generation => Err(Refusal::Gone {
                handle,
                how: "it was freed",
            }),
            _ => Err(Refusal::Gone {
                handle,
                how: "its slot has been reused",
            }),
        }
    }

    /// The live allocation `handle` names.
    pub(crate) fn get(&self, handle: u64) -> Result<&Allocation, Refusal> {
        self.live(handle).map(|l| &l.allocation)
    }

    /// Takes the live buffer out: the handle is dead from now on (`donated` says how). A
    /// slot at the last generation is retired rather than reused.
    pub(crate) fn take(&mut self, handle: u64, donated: bool) -> Result<Live, Refusal> {
        self.live(handle)?;
        let (index, _) = self.slot(handle)?;
        let slot = &mut self.slots[index as usize];
        let state = std::mem::replace(
            &mut slot.state,
            if donated {
                State::Donated
            } else {
                State::Freed
            },
        );
        let State::Live(live) = state else {
            // `live` checked it is live; keep the state as it was.
            slot.state = state;
            return Err(Refusal::Gone {
                handle,
                how: "it was freed",
            });
        };
        if slot.generation < GENERATION_MAX {
            self.vacant.push(index);
        }
        let ptr = live.allocation.ptr();
        if ptr != 0 && self.by_ptr.get(&ptr) == Some(&handle) {
            self.by_ptr.remove(&ptr);
        }
        Ok(live)
    }

    /// The handle of the live buffer starting at `ptr`.
    pub(crate) fn handle_of(&self, ptr: u64) -> Result<u64, Refusal> {
        self.by_ptr
            .get(&ptr)
            .copied()
            .ok_or(Refusal::UnknownPointer { ptr })
    }

    /// Notes that the live buffer starting at `ptr` is used by work on `stream` (one other
    /// than its own): its free waits for the work queued there before it.
    pub(crate) fn record_use(&mut self, ptr: u64, used: StreamUse) -> Result<(), Refusal> {
        let handle = self.handle_of(ptr)?;
        let (index, _) = self.slot(handle)?;
        if let State::Live(live) = &mut self.slots[index as usize].state {
            let a = &live.allocation;
            let own = StreamUse {
                stream: a.stream(),
                thread: a.origin_thread(),
            };
            if used != own && !live.uses.contains(&used) {
                live.uses.push(used);
            }
        }
        Ok(())
    }

    /// Closes the table (the allocator's destroy) and takes every live buffer out.
    pub(crate) fn close(&mut self) -> Vec<Live> {
        self.closed = true;
        self.by_ptr.clear();
        let mut out = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if matches!(slot.state, State::Live(_)) {
                if let State::Live(l) = std::mem::replace(&mut slot.state, State::Freed) {
                    out.push(l);
                }
                if slot.generation < GENERATION_MAX {
                    self.vacant.push(index as u32);
                }
            }
        }
        out
    }

    /// Number of live buffers.
    pub(crate) fn live_count(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s.state, State::Live(_)))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Stream;

    fn alloc(ptr: u64) -> Allocation {
        Allocation::new(ptr, 256, Stream::DEFAULT, 7, ptr)
    }

    #[test]
    fn generations_refuse_stale_handles() {
        let mut t = HandleTable::new().unwrap();
        let h = t.insert(alloc(0x1000)).unwrap();
        assert_eq!(t.handle_of(0x1000), Ok(h));
        let a = t.take(h, false).unwrap();
        assert_eq!(a.allocation.ptr(), 0x1000);
        assert!(matches!(t.take(h, false), Err(Refusal::Gone { .. })));
        let h2 = t.insert(alloc(0x2000)).unwrap();
        assert_ne!(h, h2, "a reused slot gets a new generation");
        assert!(matches!(t.get(h), Err(Refusal::Gone { .. })));
        assert!(matches!(t.get(0), Err(Refusal::NeverIssued { .. })));
        assert!(matches!(t.get(u64::MAX), Err(Refusal::NeverIssued { .. })));
        assert!(matches!(
            t.handle_of(0x1000),
            Err(Refusal::UnknownPointer { .. })
        ));
        assert_eq!(t.live_count(), 1);
        assert_eq!(t.close().len(), 1);
        assert_eq!(t.live_count(), 0);
    }

    #[test]
    fn two_tables_never_accept_each_others_handles() {
        let (mut a, mut b) = (HandleTable::new().unwrap(), HandleTable::new().unwrap());
        let ha = a.insert(alloc(0x1000)).unwrap();
        let hb = b.insert(alloc(0x1000)).unwrap();
        assert_ne!(ha, hb, "the first handle of each table differs");
        assert!(matches!(b.get(ha), Err(Refusal::NeverIssued { .. })));
        assert!(matches!(
            a.take(hb, false),
            Err(Refusal::NeverIssued { .. })
        ));
        assert_eq!((a.live_count(), b.live_count()), (1, 1));
        // A handle with junk between its fields is not one of ours either.
        assert!(matches!(
            a.get(ha | 1 << 23),
            Err(Refusal::NeverIssued { .. })
        ));
    }

    #[test]
    fn tags_are_never_reused() {
        let a = HandleTable::new().unwrap();
        let tag = a.tag;
        drop(a);
        let later: Vec<u32> = (0..1000).map(|_| HandleTable::new().unwrap().tag).collect();
        assert!(
            later.iter().all(|&t| t > tag),
            "a destroyed table's tag came back"
        );
    }

    #[test]
    fn a_slot_at_the_last_generation_is_retired() {
        let mut t = HandleTable::new().unwrap();
        let h = t.insert(alloc(0x1000)).unwrap();
        t.take(h, false).unwrap();
        // As if it had been reused until its last generation.
        t.slots[0].generation = GENERATION_MAX - 1;
        let last = t.insert(alloc(0x2000)).unwrap();
        assert_eq!(unpack(last).1, GENERATION_MAX);
        t.take(last, false).unwrap();
        let next = t.insert(alloc(0x3000)).unwrap();
        assert_eq!(unpack(next).2, 1, "a new slot, not the retired one");
        assert!(matches!(t.get(last), Err(Refusal::Gone { .. })));
        assert!(matches!(t.get(h), Err(Refusal::Gone { .. })));
    }

    #[test]
    fn a_closed_table_takes_nothing_more() {
        let mut t = HandleTable::new().unwrap();
        let h = t.insert(alloc(0x1000)).unwrap();
        assert_eq!(t.close().len(), 1);
        assert!(matches!(t.get(h), Err(Refusal::Gone { .. })));
        let refused = t.insert(alloc(0x2000));
        assert!(matches!(refused, Err((Refusal::Closed, ref a)) if a.ptr() == 0x2000));
    }
}
