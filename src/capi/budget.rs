//! The shared budget between processes ([`crate::budget`]) through the C ABI: declaring tags
//! reclaimable, marking the sections that use them, and listing the members.
//!
//! Each call acts on the budgets of the process-global allocators (those of
//! [`super::portalloc_global`] and the framework hooks): the budget of each device whose global
//! allocator exists, device 0's being made from the environment first when none exists yet.
//! Every process joins its device's budget as `Portalloc::from_config` does: unless
//! `PORTALLOC_SHARED_BUDGET=0`, and on the host backend only with `PORTALLOC_SHARED_BUDGET=1`.
//! A process that joined none — switched off, the host backend without the variable, or a
//! segment that could not be used (one warning on standard error said why) — *runs alone*:
//! these calls then fail with `PORTALLOC_STATUS_UNSUPPORTED` and a message saying so, the
//! reason being unknown to the call.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int};
use std::sync::{Arc, Mutex, PoisonError};

use super::api::read_sleep_tag;
use super::torch::globals_made;
use super::{guard, require_non_null, write_out, Failure, PortallocStatus};
use crate::allocator::Keep;
use crate::budget::{SharedBudget, UsingGuard};

/// The failure of a call made in a process that joined no budget.
fn runs_alone(call: &str) -> Failure {
    Failure::new(
        PortallocStatus::Unsupported,
        format!(
            "{call}: this process runs alone: its process-global allocator joined no shared \
             budget, so there is no other process to give memory to or to keep it from \
             (why is not known here: PORTALLOC_SHARED_BUDGET=0, the host backend without \
             PORTALLOC_SHARED_BUDGET=1, or a segment that could not be used, which a warning \
             on standard error named)"
        ),
    )
}

/// The budgets of the process-global allocators (one per device, each once), or
/// [`runs_alone`].
fn budgets(call: &str) -> Result<Vec<Arc<SharedBudget>>, Failure> {
    let mut found: Vec<Arc<SharedBudget>> = Vec::new();
    for instance in globals_made(call)? {
        if let Some(b) = &instance.budget {
            if !found.iter().any(|f| Arc::ptr_eq(f, b)) {
                found.push(Arc::clone(b));
            }
        }
    }
    if found.is_empty() {
        return Err(runs_alone(call));
    }
    Ok(found)
}

/// The open [`portalloc_using_begin`] sections of the process: tag → a stack of sections,
/// each holding one guard per budget.
static USING: Mutex<BTreeMap<String, Vec<Vec<UsingGuard>>>> = Mutex::new(BTreeMap::new());

/// Declares `tag` reclaimable in the shared budget: while no section of this process uses it
/// ([`portalloc_using_begin`]), another process of the device that runs out of memory may ask
/// this one to put the buffers tagged `tag` to sleep (`keep_contents` 1: their bytes kept on
/// the host and restored at the same addresses when the tag is used again; 0: discarded).
/// The tag is declared as one that can sleep too (`portalloc_declare_sleep_tag`). Declaring
/// again changes `keep_contents`. A process declares at most 8 tags.
///
/// Refused: a null `tag` (`PORTALLOC_STATUS_NULL_ARGUMENT`); an empty one, one that is not
/// UTF-8, one longer than 24 bytes (the budget's bound), a ninth tag, or a `keep_contents`
/// other than 0 or 1 (`PORTALLOC_STATUS_INVALID_ARGUMENT`).
///
/// On the budgets of the process-global allocators (`portalloc_global`, the framework hooks'):
/// each device's whose global allocator exists, device 0's made from the environment first
/// when none does. A process joins its device's budget unless `PORTALLOC_SHARED_BUDGET=0`,
/// and on the host backend only with `PORTALLOC_SHARED_BUDGET=1`. One that joined none — so
/// configured, or a segment that could not be used (a warning on standard error said why) —
/// runs alone: this call, [`portalloc_using_begin`] and [`portalloc_budget_json`] then return
/// `PORTALLOC_STATUS_UNSUPPORTED`, with a message saying the process runs alone.
///
/// # Safety
/// `tag` null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn portalloc_declare_reclaimable(
    tag: *const c_char,
    keep_contents: c_int,
) -> PortallocStatus {
    const CALL: &str = "portalloc_declare_reclaimable";
    guard(CALL, || {
        // SAFETY: the caller's promise on `tag`.
        let tag = unsafe { read_sleep_tag(CALL, tag, "a non-empty tag of at most 24 bytes") }?;
        let keep = match keep_contents {
            1 => Keep::Contents,
            0 => Keep::Nothing,
            other => {
                return Err(Failure::new(
                    PortallocStatus::InvalidArgument,
                    format!(
                        "{CALL}: keep_contents = {other} is not accepted: 1 (keep the bytes) or \
                         0 (discard them)"
                    ),
                ))
            }
        };
        for budget in budgets(CALL)? {
            budget
                .declare_reclaimable(&tag, keep)
                .map_err(|e| prefixed(CALL, e.into()))?;
        }
        Ok(())
    })
}

/// Begins a section that uses `tag`: until the matching [`portalloc_using_end`], no other
/// process can have the tag's buffers put to sleep; a tag asleep (given to another process)
/// is woken first, at the same addresses. Sections nest and may end on another thread than
/// the one that began them (they are the process's, counted per tag). A tag not declared
/// reclaimable is never asked for: the section pins nothing.
///
/// Refused: a null `tag` (`PORTALLOC_STATUS_NULL_ARGUMENT`), an empty or non-UTF-8 one
/// (`PORTALLOC_STATUS_INVALID_ARGUMENT`); in a process that runs alone,
/// `PORTALLOC_STATUS_UNSUPPORTED`. A wake that finds no memory even after asking the others is
/// `PORTALLOC_STATUS_OUT_OF_MEMORY`, with no section begun and the tag still asleep.
///
/// # Safety
/// `tag` null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn portalloc_using_begin(tag: *const c_char) -> PortallocStatus {
    const CALL: &str = "portalloc_using_begin";
    guard(CALL, || {
        // SAFETY: the caller's promise on `tag`.
        let tag = unsafe { read_sleep_tag(CALL, tag, "a non-empty tag") }?;
        // On a failure the guards taken so far drop: nothing stays pinned.
        let section = budgets(CALL)?
            .iter()
            .map(|b| b.using(&tag))
            .collect::<crate::error::Result<Vec<UsingGuard>>>()
            .map_err(|e| prefixed(CALL, e.into()))?;
        USING
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(tag)
            .or_default()
            .push(section);
        Ok(())
    })
}

/// Ends the latest section [`portalloc_using_begin`] began for `tag`: once every section of
/// the tag ended, other processes may have it put to sleep again. An end without an open
/// section of `tag` is refused (`PORTALLOC_STATUS_INVALID_ARGUMENT`, nothing changed), as the
/// tag is (as `portalloc_using_begin` refuses it).
///
/// # Safety
/// `tag` null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn portalloc_using_end(tag: *const c_char) -> PortallocStatus {
    const CALL: &str = "portalloc_using_end";
    guard(CALL, || {
        // SAFETY: the caller's promise on `tag`.
        let tag = unsafe { read_sleep_tag(CALL, tag, "a non-empty tag") }?;
        let section = {
            let mut open = USING.lock().unwrap_or_else(PoisonError::into_inner);
            let section = open.get_mut(&tag).and_then(Vec::pop);
            if open.get(&tag).is_some_and(Vec::is_empty) {
                open.remove(&tag);
            }
            section
        };
        // Dropped outside the lock: each guard publishes the tag's state.
        match section {
            Some(guards) => {
                drop(guards);
                Ok(())
            }
            None => Err(Failure::new(
                PortallocStatus::InvalidArgument,
                format!(
                    "{CALL}: no section of tag {tag:?} is open: portalloc_using_end without \
                     its portalloc_using_begin (or once more than it)"
                ),
            )),
        }
    })
}

/// Writes the members of the shared budget as JSON — an array with one object per live
/// process (`pid`, `name`, `reserved`, `in_use`, `cached`, `asleep`, `floor`, `ceiling` (null:
/// none), `given`, `refused`, and `tags`: each `name`, `bytes`, `reclaimable`, `keep`,
/// `in_use`, `asleep`), this process included; with several devices, the members of each
/// device's budget one after the other, by ordinal — into `buf`, NUL-terminated, and its
/// length (without the NUL) to `*out_len`, as `portalloc_ledger_json` does: when `capacity`
/// is too small (0 with a null `buf` asks for the length), nothing is written to `buf`,
/// `*out_len` is the length needed and the status is `PORTALLOC_STATUS_BUFFER_TOO_SMALL`. In a
/// process that runs alone, `PORTALLOC_STATUS_UNSUPPORTED`.
///
/// # Safety
/// `buf` null or valid for writing `capacity` bytes; `out_len` null or valid for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_budget_json(
    buf: *mut c_char,
    capacity: usize,
    out_len: *mut usize,
) -> PortallocStatus {
    const CALL: &str = "portalloc_budget_json";
    guard(CALL, || {
        require_non_null(CALL, "out_len", out_len)?;
        let members: Vec<_> = budgets(CALL)?
            .iter()
            .flat_map(|b| b.members())
            .map(|m| m.report())
            .collect();
        let json = serde_json::to_string(&members).map_err(|e| {
            Failure::new(
                PortallocStatus::Internal,
                format!("{CALL}: the members as JSON: {e}"),
            )
        })?;
        let len = json.len();
        // SAFETY: the caller's promise on `out_len`, checked non-null above.
        unsafe { write_out(CALL, "out_len", out_len, len) }?;
        if buf.is_null() || capacity <= len {
            return Err(Failure::new(
                PortallocStatus::BufferTooSmall,
                format!(
                    "{CALL}: the budget JSON needs {} bytes with its NUL, the buffer has {capacity}{}",
                    len + 1,
                    if buf.is_null() { " (buf is null)" } else { "" }
                ),
            ));
        }
        // SAFETY: `buf` is non-null and the caller promises `capacity` writable bytes;
        // `len + 1 <= capacity`, and a fresh `String` cannot overlap the caller's buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), len);
            buf.add(len).write(0);
        }
        Ok(())
    })
}

fn prefixed(call: &str, f: Failure) -> Failure {
    Failure::new(f.status, format!("{call}: {}", f.message))
}
