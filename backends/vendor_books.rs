//! What a vendor device (CUDA, HIP) keeps about the memory and handles portalloc took from
//! its driver, written once for both shims: the driver keeps the truth, these books say what
//! portalloc asked for and has not given back, so a pointer or handle it never handed out is
//! refused before the driver sees it, and leak checks can count what is live.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, PoisonError, RwLock};

/// What a vendor device holds now, from its own books.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VendorCensus {
    /// Live plain allocations (`cuMemAlloc`, `hipMalloc` / `hipExtMallocWithFlags`).
    pub allocations: u64,
    /// Live allocations from the device's stream-ordered pool.
    pub pool_allocations: u64,
    /// Physical handles not released.
    pub physical_handles: u64,
    /// Address reservations not freed.
    pub reservations: u64,
    /// Live mappings.
    pub mappings: u64,
    /// Live streams (the default stream not counted).
    pub streams: u64,
    /// Live events.
    pub events: u64,
}

impl VendorCensus {
    /// True when the device holds nothing.
    pub fn is_empty(&self) -> bool {
        *self == VendorCensus::default()
    }
}

/// Memory portalloc holds from the driver.
#[derive(Debug, Default)]
pub(crate) struct Books {
    /// Plain allocation pointer → size.
    pub(crate) allocations: HashMap<u64, u64>,
    /// Pool pointer → size.
    pub(crate) pool_allocations: HashMap<u64, u64>,
    /// Physical handles not released.
    pub(crate) handles: HashSet<u64>,
    /// Reservation start → size.
    pub(crate) reservations: BTreeMap<u64, u64>,
    /// Mapping start → size.
    pub(crate) mappings: BTreeMap<u64, u64>,
}

/// Streams and events handed out: the driver dereferences these handles, so only ones in
/// these sets are passed to it, under the read lock (destroying takes the write lock).
#[derive(Debug, Default)]
pub(crate) struct Handles {
    pub(crate) streams: HashSet<u64>,
    pub(crate) events: HashSet<u64>,
}

/// Counts what `handles` and `books` hold. Takes one lock at a time: elsewhere the handles
/// lock is taken before the books, so holding the books while waiting for the handles could
/// deadlock against a writer.
pub(crate) fn census(handles: &RwLock<Handles>, books: &Mutex<Books>) -> VendorCensus {
    let (streams, events) = {
        let h = handles.read().unwrap_or_else(PoisonError::into_inner);
        (h.streams.len() as u64, h.events.len() as u64)
    };
    let b = books.lock().unwrap_or_else(PoisonError::into_inner);
    VendorCensus {
        allocations: b.allocations.len() as u64,
        pool_allocations: b.pool_allocations.len() as u64,
        physical_handles: b.handles.len() as u64,
        reservations: b.reservations.len() as u64,
        mappings: b.mappings.len() as u64,
        streams,
        events,
    }
}
