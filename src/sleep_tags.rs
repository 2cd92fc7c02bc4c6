//! Which tags can sleep: the tags whose allocations [`crate::strategy::vmm`] keeps on granules
//! of their own, so that a sleep of the tag hands back every granule it holds.
//!
//! A tag passed to an allocate call is a name in the ledger's books and nothing more — a name
//! per call site or per tensor costs nothing. A tag becomes one that can sleep when it is
//! **declared**: opening a region declares it (Python's `portalloc.tag(name)` and
//! `portalloc.region(name)`, C's `portalloc_set_thread_tag` and `portalloc_set_process_tag`),
//! as torch_memory_saver's `region(tag)` and vLLM's `use_memory_pool(tag)` do, and
//! [`declare_sleepable`] (C: `portalloc_declare_sleep_tag`) declares a tag for allocate calls
//! that pass it themselves. Declaring is process-wide and lasts for the process: the
//! allocators made before it see it from their next allocation of the tag on.
//!
//! An undeclared tag can still be put to sleep: its allocations hand back the granules no
//! other allocation touches.
#![deny(unsafe_code)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

/// The declared tags.
static DECLARED: RwLock<Option<HashSet<String>>> = RwLock::new(None);
/// Bumped at each new declaration: allocators that cache what they looked up compare it.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Declares `tag` as one that can sleep (see the module). An empty tag is never one (untagged
/// memory does not sleep): declaring it does nothing. Declaring a tag again does nothing.
///
/// ```
/// portalloc::sleep_tags::declare_sleepable("weights");
/// assert!(portalloc::sleep_tags::is_sleepable("weights"));
/// assert!(!portalloc::sleep_tags::is_sleepable(""));
/// ```
pub fn declare_sleepable(tag: &str) {
    if tag.is_empty() || is_sleepable(tag) {
        return;
    }
    let mut declared = DECLARED.write().unwrap_or_else(PoisonError::into_inner);
    if declared
        .get_or_insert_with(HashSet::new)
        .insert(tag.to_owned())
    {
        GENERATION.fetch_add(1, Ordering::Release);
    }
}

/// True when `tag` was declared with [`declare_sleepable`] (or by opening a region).
pub fn is_sleepable(tag: &str) -> bool {
    if tag.is_empty() || generation() == 0 {
        return false;
    }
    DECLARED
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .is_some_and(|d| d.contains(tag))
}

/// How many tags were declared so far: a cache of [`is_sleepable`]'s answers is current while
/// this stays the same.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}
