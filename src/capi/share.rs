//! Buffers shared with other processes ([`crate::share`]) through the C ABI: a live buffer
//! exported as the bytes of a share handle ([`portalloc_export`]), which any channel carries
//! to another process (a pipe, a socket, a pickle, a file), and imported there
//! ([`portalloc_import`]) as an import that maps the same memory until
//! [`portalloc_import_close`].
//!
//! The lifetimes are those of [`crate::share`]: the importer's bytes stay valid while it holds
//! the import; a buffer freed by its exporter while imported is kept (still counted by the
//! exporter) until no importer holds it, and handed back at the exporter's next allocation,
//! trim or [`portalloc_share_settle`]; vmm memory outlives an exporter that exits, bfc and
//! platform memory (legacy IPC handles) dies with it.
//!
//! An import (`PortallocImport*`) is an opaque token, as an allocator pointer is: portalloc
//! looks it up and never dereferences it, so a closed or made-up one is refused, and an
//! import is never closed twice.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::{
    guard, lookup, require_non_null, with_instance, write_opt, write_out, Failure,
    PortallocAllocator, PortallocStatus,
};
use crate::allocator::Allocator;
use crate::share::{handle::MAX_PIECES, ImportedBuffer, ShareHandle};

/// The most bytes a share handle has: a mapped handle of [`MAX_PIECES`] pieces. Longer input
/// is refused before it is read.
const MAX_HANDLE_BYTES: usize = 80 + 8 + MAX_PIECES * 32;

/// An allocation of another process mapped in this one ([`portalloc_import`]). Opaque: the
/// pointer is a token portalloc looks up, never dereferences.
pub struct PortallocImport {
    _opaque: [u8; 0],
}

type Imports = Mutex<HashMap<u64, ImportedBuffer>>;

fn imports() -> MutexGuard<'static, HashMap<u64, ImportedBuffer>> {
    static IMPORTS: OnceLock<Imports> = OnceLock::new();
    // Inserts and removes whole entries: consistent whatever panicked.
    IMPORTS
        .get_or_init(Imports::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The token of a new import. Tokens are never reused, and never an allocator's (odd).
fn register_import(buffer: ImportedBuffer) -> *mut PortallocImport {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let token = (NEXT.fetch_add(1, Ordering::Relaxed) << 4) | 8;
    imports().insert(token, buffer);
    token as usize as *mut PortallocImport
}

fn not_an_import(call: &str, import: *const PortallocImport) -> Failure {
    Failure::new(
        PortallocStatus::InvalidHandle,
        format!(
            "{call}: import {:#x} is not a live import (closed, or never made by \
             portalloc_import)",
            import as usize
        ),
    )
}

/// Runs `read` on the live import `import` names.
fn with_import<T>(
    call: &str,
    import: *const PortallocImport,
    read: impl FnOnce(&ImportedBuffer) -> T,
) -> Result<T, Failure> {
    require_non_null(call, "import", import)?;
    let imports = imports();
    let buffer = imports
        .get(&(import as usize as u64))
        .ok_or_else(|| not_an_import(call, import))?;
    Ok(read(buffer))
}

fn prefixed(call: &str, f: Failure) -> Failure {
    Failure::new(f.status, format!("{call}: {}", f.message))
}

/// Exports the live buffer of `allocator` that starts at `ptr` for another process: writes
/// the share handle's bytes — the same bytes for the same export every time, binary, not
/// NUL-terminated — to `buf` and their count to `*out_len`. Another process maps the buffer
/// with [`portalloc_import`] on the same device, from these bytes alone (the descriptors are
/// fetched from this process with `pidfd_getfd`: Linux 5.6, same user).
///
/// When `capacity` is smaller than the handle (0 with a null `buf` asks for the length),
/// nothing is written to `buf`, `*out_len` is the length needed and the status is
/// `PORTALLOC_STATUS_BUFFER_TOO_SMALL`, as `portalloc_ledger_json` does; the export is made
/// all the same, and asking again gives the same bytes.
///
/// The export lasts until the buffer is freed: freed while another process imports it, its
/// memory is kept for the importers (and still counted here) until they close their imports,
/// then handed back at this allocator's next allocation, trim or [`portalloc_share_settle`].
/// Putting its tag to sleep withdraws the export (the importers keep what they map).
///
/// Refused: a null `ptr` or `out_len` (`PORTALLOC_STATUS_NULL_ARGUMENT`); a pointer that is
/// not the start of a live buffer of `allocator` (`PORTALLOC_STATUS_UNKNOWN_POINTER`); a
/// buffer asleep (`PORTALLOC_STATUS_INVALID_ARGUMENT`); a device or strategy that cannot
/// export — the simulated host device, `cuda_async` pools (`PORTALLOC_STATUS_UNSUPPORTED`);
/// 4096 live exports (`PORTALLOC_STATUS_SHARE`).
///
/// # Safety
/// `buf` null or valid for writing `capacity` bytes; `out_len` null or valid for one
/// `size_t`. `ptr` is only looked up, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn portalloc_export(
    allocator: *mut PortallocAllocator,
    ptr: *mut c_void,
    buf: *mut u8,
    capacity: usize,
    out_len: *mut usize,
) -> PortallocStatus {
    const CALL: &str = "portalloc_export";
    with_instance(CALL, allocator, |instance| {
        require_non_null(CALL, "out_len", out_len)?;
        require_non_null(CALL, "ptr", ptr)?;
        let ptr = ptr as usize as u64;
        let handle = {
            // The table stays locked through the export: the buffer cannot be freed (and its
            // address given to another) between the lookup and the export.
            let table = instance.table();
            let live = table.handle_of(ptr).map_err(|r| prefixed(CALL, r.into()))?;
            let allocation = table.get(live).map_err(|r| prefixed(CALL, r.into()))?;
            let backing = instance
                .ledger
                .backing(allocation)
                .map_err(|e| prefixed(CALL, e.into()))?;
            let tag = instance.ledger.tag_of(allocation);
            instance
                .sharing
                .export_parts(ptr, allocation.size(), backing, tag)
                .map_err(|e| prefixed(CALL, e.into()))?
        };
        let bytes = handle.to_bytes();
        let len = bytes.len();
        // SAFETY: the caller's promise on `out_len`, checked non-null above.
        unsafe { write_out(CALL, "out_len", out_len, len) }?;
        if buf.is_null() || capacity < len {
            return Err(Failure::new(
                PortallocStatus::BufferTooSmall,
                format!(
                    "{CALL}: the share handle needs {len} bytes, the buffer has {capacity}{}",
                    if buf.is_null() { " (buf is null)" } else { "" }
                ),
            ));
        }
        // SAFETY: `buf` is non-null and the caller promises `capacity` writable bytes;
        // `len <= capacity`, and a fresh `Vec` cannot overlap the caller's buffer.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, len) };
        Ok(())
    })
}

/// Maps the buffer another process exported ([`portalloc_export`]) — the `len` bytes of its
/// share handle at `bytes` — on the device of `allocator`, and writes the import to `*out`:
/// its address ([`portalloc_import_ptr`]) holds the exporter's bytes, the same memory, until
/// [`portalloc_import_close`]. Nothing is counted in `allocator`'s books (the exporter's count
/// the memory); the allocator may be destroyed before the import is closed.
///
/// Refused: a null `bytes` or `out` (`PORTALLOC_STATUS_NULL_ARGUMENT`); bytes that are not a
/// share handle — damaged, cut, forged, of another layout version, longer than any handle
/// (`PORTALLOC_STATUS_INVALID_ARGUMENT`, the message says what is wrong); a handle that cannot
/// be imported here — this process's own export (use the buffer itself), an export withdrawn
/// (its buffer freed with no importer, or put to sleep), an exporter that exited, another
/// device, descriptors that cannot be fetched (Yama `ptrace_scope` 2 or 3, another user)
/// (`PORTALLOC_STATUS_SHARE`); the device's failure to map it. Nothing is left mapped on a
/// failure.
///
/// # Safety
/// `bytes` null or valid for reading `len` bytes; `out` null or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn portalloc_import(
    allocator: *mut PortallocAllocator,
    bytes: *const u8,
    len: usize,
    out: *mut *mut PortallocImport,
) -> PortallocStatus {
    const CALL: &str = "portalloc_import";
    guard(CALL, || {
        let instance = lookup(CALL, allocator)?;
        require_non_null(CALL, "out", out)?;
        require_non_null(CALL, "bytes", bytes)?;
        if len > MAX_HANDLE_BYTES {
            return Err(Failure::new(
                PortallocStatus::InvalidArgument,
                format!(
                    "{CALL}: {len} bytes is longer than any share handle (at most \
                     {MAX_HANDLE_BYTES}): not the bytes portalloc_export wrote"
                ),
            ));
        }
        // SAFETY: non-null, at most MAX_HANDLE_BYTES, and the caller promises `len` readable
        // bytes.
        let bytes = unsafe { std::slice::from_raw_parts(bytes, len) };
        let handle = ShareHandle::from_bytes(bytes).map_err(|e| prefixed(CALL, e.into()))?;
        let buffer = crate::share::import(&instance.device, &handle)
            .map_err(|e| prefixed(CALL, e.into()))?;
        let token = register_import(buffer);
        // SAFETY: the caller's promise on `out`, checked non-null above.
        unsafe { write_out(CALL, "out", out, token) }
    })
}

/// Writes the address of the import `import` in this process to `*out_ptr`.
///
/// Refused: a null `import` or `out_ptr` (`PORTALLOC_STATUS_NULL_ARGUMENT`), an import that
/// was closed or never made (`PORTALLOC_STATUS_INVALID_HANDLE`).
///
/// # Safety
/// `out_ptr` null or valid for writing one pointer. `import` is only looked up, never
/// dereferenced.
#[no_mangle]
pub unsafe extern "C" fn portalloc_import_ptr(
    import: *const PortallocImport,
    out_ptr: *mut *mut c_void,
) -> PortallocStatus {
    const CALL: &str = "portalloc_import_ptr";
    guard(CALL, || {
        require_non_null(CALL, "out_ptr", out_ptr)?;
        let ptr = with_import(CALL, import, ImportedBuffer::ptr)?;
        // SAFETY: the caller's promise on `out_ptr`, checked non-null above.
        unsafe { write_out(CALL, "out_ptr", out_ptr, ptr as usize as *mut c_void) }
    })
}

/// Writes the size of the import `import` — the exported buffer's — to `*out_size`, and the
/// exporting process's pid to `*out_exporter_pid` if it is not null.
///
/// Refused as [`portalloc_import_ptr`].
///
/// # Safety
/// `out_size` null or valid for one `uint64_t`; `out_exporter_pid` null or valid for one
/// `uint32_t`. `import` is only looked up, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn portalloc_import_size(
    import: *const PortallocImport,
    out_size: *mut u64,
    out_exporter_pid: *mut u32,
) -> PortallocStatus {
    const CALL: &str = "portalloc_import_size";
    guard(CALL, || {
        require_non_null(CALL, "out_size", out_size)?;
        let (size, pid) = with_import(CALL, import, |b| (b.size(), b.exporter_pid()))?;
        // SAFETY: the caller's promises on the outputs, `out_size` checked non-null above.
        unsafe {
            write_out(CALL, "out_size", out_size, size)?;
            write_opt(out_exporter_pid, pid);
        }
        Ok(())
    })
}

/// Unmaps the import `import` and frees it: its address is no longer this process's, and
/// the exporter may hand the memory back once no other process imports it. The caller's work
/// on it must have finished. A null `import` does nothing (`OK`); one closed already or never
/// made is refused (`PORTALLOC_STATUS_INVALID_HANDLE`), never closed twice. The import is gone
/// even when the device reports a failure to unmap (`PORTALLOC_STATUS_DEVICE`, the first
/// failure; the rest was done).
///
/// # Safety
/// None beyond the ABI: `import` is only looked up, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn portalloc_import_close(import: *mut PortallocImport) -> PortallocStatus {
    const CALL: &str = "portalloc_import_close";
    guard(CALL, || {
        if import.is_null() {
            return Ok(());
        }
        let buffer = imports()
            .remove(&(import as usize as u64))
            .ok_or_else(|| not_an_import(CALL, import))?;
        // Unmapped outside the lock: other imports stay usable meanwhile.
        buffer.close().map_err(|e| prefixed(CALL, e.into()))
    })
}

/// Hands back to the allocator the buffers `allocator` exported, freed while imported, that no
/// process imports any more (an importer that closed its import, or exited); writes how many
/// are still kept for their importers to `*still_parked` if it is not null. The next
/// allocation and trim do the same.
///
/// # Safety
/// `still_parked` null or valid for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_share_settle(
    allocator: *mut PortallocAllocator,
    still_parked: *mut usize,
) -> PortallocStatus {
    const CALL: &str = "portalloc_share_settle";
    with_instance(CALL, allocator, |instance| {
        let parked = instance
            .sharing
            .settle()
            .map_err(|e| prefixed(CALL, e.into()))?;
        // SAFETY: the caller's promise on `still_parked`.
        unsafe { write_opt(still_parked, parked) };
        Ok(())
    })
}
