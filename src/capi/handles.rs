//! The handle table of one C-ABI allocator: generation-checked handles over the ledger's
//! [`Allocation`]s, and the address → handle index for freeing by raw pointer.
//!
//! A handle packs `(generation << 32) | slot`. A slot's generation grows each time the slot
//! is reused, so a handle kept after its buffer was freed or donated never names the buffer
//! that reuses the slot; generation 0 is never issued, so handle 0 is never valid.

use rustc_hash::FxHashMap;

use crate::allocator::Allocation;

/// Why a handle or pointer was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Freed or donated (or its slot reused since).
    Gone { handle: u64, how: &'static str },
    /// Never issued by this allocator.
    NeverIssued { handle: u64 },
    /// A pointer no live buffer of this allocator starts at.
    UnknownPointer { ptr: u64 },
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
#[derive(Debug, Default)]
pub(crate) struct HandleTable {
    slots: Vec<Slot>,
    vacant: Vec<u32>,
    by_ptr: FxHashMap<u64, u64>,
}

fn pack(generation: u32, index: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

fn unpack(handle: u64) -> (u32, u32) {
    ((handle >> 32) as u32, handle as u32)
}

impl HandleTable {
    /// Stores a live allocation; returns its handle.
    pub(crate) fn insert(&mut self, allocation: Allocation) -> u64 {
        let ptr = allocation.ptr();
        let handle = match self.vacant.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.generation = slot.generation.checked_add(1).unwrap_or(1);
                slot.state = State::Live(allocation);
                pack(slot.generation, index)
            }
            None => {
                let index = self.slots.len() as u32;
                self.slots.push(Slot {
                    generation: 1,
                    state: State::Live(allocation),
                });
                pack(1, index)
            }
        };
        if ptr != 0 {
            self.by_ptr.insert(ptr, handle);
        }
        handle
    }

    fn slot(&self, handle: u64) -> Result<(u32, &Slot), Refusal> {
        let (generation, index) = unpack(handle);
        let slot = self
            .slots
            .get(index as usize)
            .filter(|s| generation != 0 && generation <= s.generation)
            .ok_or(Refusal::NeverIssued { handle })?;
        Ok((index, slot))
    }

    /// The live allocation `handle` names.
    pub(crate) fn get(&self, handle: u64) -> Result<&Allocation, Refusal> {
        let (_, slot) = self.slot(handle)?;
        let (generation, _) = unpack(handle);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Stream;

    fn alloc(ptr: u64) -> Allocation {
        Allocation::new(ptr, 256, Stream::DEFAULT, 7, ptr)
    }

    #[test]
    fn generations_refuse_stale_handles() {
        let mut t = HandleTable::default();
        let h = t.insert(alloc(0x1000));
        assert_eq!(t.handle_of(0x1000), Ok(h));
        let a = t.take(h, false).unwrap();
        assert_eq!(a.ptr(), 0x1000);
        assert!(matches!(t.take(h, false), Err(Refusal::Gone { .. })));
        let h2 = t.insert(alloc(0x2000));
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
}
