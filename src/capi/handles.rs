//! The handle table of one C-ABI allocator: generation-checked handles over the ledger's
//! [`Allocation`]s, and the address → handle index for freeing by raw pointer.
//!
//! A handle packs `(tag << 48) | (generation << 24) | slot`:
//!
//! * `tag` (16 bits) names the table: unique among the tables alive in the process (taken
//!   from a process-wide registry, never 0), so a handle one allocator issued is refused by
//!   every other live allocator as "not issued by this allocator" — two allocators' first
//!   handles are different numbers;
//! * `generation` (24 bits) grows each time the slot is reused, so a handle kept after its
//!   buffer was freed or donated never names the buffer that reuses the slot (until the slot
//!   has been reused 2^24 times); generation 0 is never issued;
//! * `slot` (24 bits): at most 2^24 buffers live in one allocator at once.
//!
//! Handle 0 is never valid.
use std::sync::Mutex;

use rustc_hash::FxHashMap;

use crate::allocator::Allocation;
use crate::error::{Error, Result};

/// Bits of a handle that number the slot.
const SLOT_BITS: u32 = 24;
/// Bits of a handle that hold the slot's generation.
const GENERATION_BITS: u32 = 24;
/// The most buffers one allocator holds at once.
pub(crate) const MAX_LIVE: usize = 1 << SLOT_BITS;
const GENERATION_MAX: u32 = (1 << GENERATION_BITS) - 1;

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
                "the allocator holds {MAX_LIVE} live buffers, the most one C-ABI allocator \
                 can hand out handles for; free some first"
            ),
        }
    }
}

#[derive(Debug)]
enum State {
    Live(Allocation),
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
    /// This table's tag, unique among live tables (see the module docs).
    tag: u16,
    slots: Vec<Slot>,
    vacant: Vec<u32>,
    by_ptr: FxHashMap<u64, u64>,
}

/// The tags of the live tables: a bit per tag, and where to look for a free one next.
struct Tags {
    taken: Vec<u64>,
    next: u16,
}

static TAGS: Mutex<Tags> = Mutex::new(Tags {
    taken: Vec::new(),
    next: 1,
});

fn tags() -> std::sync::MutexGuard<'static, Tags> {
    TAGS.lock().unwrap_or_else(|p| p.into_inner())
}

fn pack(tag: u16, generation: u32, index: u32) -> u64 {
    (u64::from(tag) << (SLOT_BITS + GENERATION_BITS))
        | (u64::from(generation) << SLOT_BITS)
        | u64::from(index)
}

/// `(tag, generation, slot)`.
fn unpack(handle: u64) -> (u16, u32, u32) {
    (
        (handle >> (SLOT_BITS + GENERATION_BITS)) as u16,
        ((handle >> SLOT_BITS) as u32) & GENERATION_MAX,
        (handle as u32) & (MAX_LIVE as u32 - 1),
    )
}

impl HandleTable {
    /// An empty table with a tag no other live table has.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when 65,535 C-ABI allocators are alive already.
    pub(crate) fn new() -> Result<HandleTable> {
        let mut t = tags();
        if t.taken.is_empty() {
            t.taken = vec![0; 1024];
        }
        // Tags are handed out round-robin, so a destroyed allocator's tag is reused as late
        // as possible.
        let start = t.next;
        let mut tag = start;
        loop {
            let (word, bit) = (usize::from(tag) / 64, tag % 64);
            if tag != 0 && t.taken[word] & (1 << bit) == 0 {
                t.taken[word] |= 1 << bit;
                t.next = tag.wrapping_add(1);
                break;
            }
            tag = tag.wrapping_add(1);
            if tag == start {
                return Err(Error::InvalidArgument {
                    call: "portalloc_create",
                    reason: "65,535 C-ABI allocators are alive already; destroy one first".into(),
                });
            }
        }
        Ok(HandleTable {
            tag,
            slots: Vec::new(),
            vacant: Vec::new(),
            by_ptr: FxHashMap::default(),
        })
    }

    /// Stores a live allocation; returns its handle.
    ///
    /// # Errors
    /// The allocation back when [`MAX_LIVE`] buffers are live ([`Refusal::Full`]).
    pub(crate) fn insert(&mut self, allocation: Allocation) -> Result<u64, Allocation> {
        let ptr = allocation.ptr();
        let handle = match self.vacant.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.generation = if slot.generation >= GENERATION_MAX {
                    1
                } else {
                    slot.generation + 1
                };
                slot.state = State::Live(allocation);
                pack(self.tag, slot.generation, index)
            }
            None if self.slots.len() >= MAX_LIVE => return Err(allocation),
            None => {
                let index = self.slots.len() as u32;
                self.slots.push(Slot {
                    generation: 1,
                    state: State::Live(allocation),
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

    /// The live allocation `handle` names.
    pub(crate) fn get(&self, handle: u64) -> Result<&Allocation, Refusal> {
        let (_, slot) = self.slot(handle)?;
        let (_, generation, _) = unpack(handle);
        match &slot.state {
            State::Live(a) if slot.generation == generation => Ok(a),
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

    /// Takes the live allocation out: the handle is dead from now on (`donated` says how).
    pub(crate) fn take(&mut self, handle: u64, donated: bool) -> Result<Allocation, Refusal> {
        self.get(handle)?;
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
        let State::Live(allocation) = state else {
            // `get` checked it is live; keep the state as it was.
            slot.state = state;
            return Err(Refusal::Gone {
                handle,
                how: "it was freed",
            });
        };
        self.vacant.push(index);
        if allocation.ptr() != 0 && self.by_ptr.get(&allocation.ptr()) == Some(&handle) {
            self.by_ptr.remove(&allocation.ptr());
        }
        Ok(allocation)
    }

    /// The handle of the live buffer starting at `ptr`.
    pub(crate) fn handle_of(&self, ptr: u64) -> Result<u64, Refusal> {
        self.by_ptr
            .get(&ptr)
            .copied()
            .ok_or(Refusal::UnknownPointer { ptr })
    }

    /// Takes every live allocation out (for destroying the allocator).
    pub(crate) fn drain(&mut self) -> Vec<Allocation> {
        self.by_ptr.clear();
        let mut out = Vec::new();
        for (index, slot) in self.slots.iter_mut().enumerate() {
            if matches!(slot.state, State::Live(_)) {
                if let State::Live(a) = std::mem::replace(&mut slot.state, State::Freed) {
                    out.push(a);
                }
                self.vacant.push(index as u32);
            }
        }
        out
    }

    /// Number of live buffers.
    pub(crate) fn live(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s.state, State::Live(_)))
            .count()
    }
}

impl Drop for HandleTable {
    fn drop(&mut self) {
        let mut t = tags();
        let (word, bit) = (usize::from(self.tag) / 64, self.tag % 64);
        if let Some(w) = t.taken.get_mut(word) {
            *w &= !(1 << bit);
        }
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
        assert_eq!(a.ptr(), 0x1000);
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
        assert_eq!(t.live(), 1);
        assert_eq!(t.drain().len(), 1);
        assert_eq!(t.live(), 0);
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
        assert_eq!((a.live(), b.live()), (1, 1));
        // A handle with junk between its fields is not one of ours either.
        assert!(matches!(
            a.get(ha | 1 << 23),
            Err(Refusal::NeverIssued { .. })
        ));
    }

    #[test]
    fn a_destroyed_tables_tag_is_reused_last() {
        let a = HandleTable::new().unwrap();
        let tag = a.tag;
        drop(a);
        let b = HandleTable::new().unwrap();
        assert_ne!(b.tag, tag, "round robin: not the tag just released");
    }
}
