//! The framework hooks: the two functions PyTorch's
//! `torch.cuda.memory.CUDAPluggableAllocator(path, "portalloc_torch_alloc",
//! "portalloc_torch_free")` loads, over a process-global allocator per device, made from the
//! environment at first use (with a ledger; buffers tagged with the thread's tag, else the
//! process's, else `torch`). CuPy and other callers
//! reach the same allocators through [`portalloc_global`].
//!
//! PyTorch fixes these signatures, so they cannot return a status. What PyTorch does with a
//! null return matters: `CUDAPluggableAllocator::malloc` stores whatever the hook returns as
//! the tensor's data pointer, without a check — it raises **no** out-of-memory error, and
//! the tensor's first kernel reads address 0 (an illegal-address error at best). So a failed
//! allocation returns null *and* logs its whole message — for an out-of-memory failure the
//! report and its diagnosis — at warn level before returning (a `tracing` event, and on
//! standard error when the program installed no `tracing` subscriber, as a C or Python
//! program has not), and leaves it in [`super::portalloc_last_error`]; check
//! `portalloc.stats()` or standard error when a tensor's pointer is 0. A refused free is
//! ignored, with its message kept and logged the same way.
//!
//! PyTorch's `Tensor.record_stream(side)` does nothing under the pluggable allocator (its
//! Python interface passes no record-stream hook): [`super::portalloc_record_stream`] (and
//! `portalloc.torch.record_stream(tensor, stream)` in Python) takes its place.
//!
//! The allocator of a device opens that device only ([`crate::discover::discover_device`]),
//! and no call changes the caller's current device (`torch.cuda.set_device` stays as it was).

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use rustc_hash::FxHashMap;

use super::api::{allocate, free_ptr, make_instance};
use super::{
    guard, guard_out, lookup, register, Failure, Instance, PortallocAllocator, PortallocStatus,
};
use crate::config::Config;

/// The tag of buffers allocated through the PyTorch hooks.
pub(crate) const TORCH_TAG: &str = "torch";

/// Device ordinal → the global allocator's registered pointer (as an integer).
type Globals = Mutex<FxHashMap<u32, usize>>;

fn globals() -> &'static Globals {
    static GLOBALS: OnceLock<Globals> = OnceLock::new();
    GLOBALS.get_or_init(Globals::default)
}

/// The process-global allocator of `device`, made from the environment at first use.
pub(crate) fn global(
    call: &str,
    device: i64,
) -> Result<(*mut PortallocAllocator, Arc<Instance>), Failure> {
    let ordinal = u32::try_from(device).map_err(|_| {
        Failure::new(
            PortallocStatus::InvalidArgument,
            format!("{call}: device {device} is not accepted: a device ordinal, 0 or more"),
        )
    })?;
    let mut map = globals().lock().unwrap_or_else(|p| p.into_inner());
    let token = match map.get(&ordinal) {
        Some(&t) => t,
        None => {
            let config = Config::from_env().map_err(|e| prefixed(call, e.into()))?;
            let instance = make_instance(&config, ordinal, true).map_err(|f| prefixed(call, f))?;
            let t = register(instance) as usize;
            map.insert(ordinal, t);
            t
        }
    };
    let ptr = token as *mut PortallocAllocator;
    Ok((ptr, lookup(call, ptr)?))
}

/// The process-global allocators made so far, by ordinal; device 0's is made from the
/// environment first when there is none yet.
pub(crate) fn globals_made(call: &str) -> Result<Vec<Arc<Instance>>, Failure> {
    let tokens: Vec<(u32, usize)> = {
        let map = globals().lock().unwrap_or_else(|p| p.into_inner());
        let mut t: Vec<(u32, usize)> = map.iter().map(|(&o, &t)| (o, t)).collect();
        t.sort_unstable();
        t
    };
    if tokens.is_empty() {
        return Ok(vec![global(call, 0)?.1]);
    }
    tokens
        .into_iter()
        .map(|(_, t)| lookup(call, t as *mut PortallocAllocator))
        .collect()
}

fn prefixed(call: &str, f: Failure) -> Failure {
    Failure::new(f.status, format!("{call}: {}", f.message))
}

/// Writes the process-global allocator of `device` to `*out`, making it from the environment
/// at first use. It is the one the PyTorch hooks use; it cannot be destroyed.
///
/// # Safety
/// `out` null or valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn portalloc_global(
    device: i32,
    out: *mut *mut PortallocAllocator,
) -> PortallocStatus {
    const CALL: &str = "portalloc_global";
    // SAFETY: the caller's promise on `out`.
    unsafe { guard_out(CALL, out, || Ok(global(CALL, i64::from(device))?.0)) }
}

/// PyTorch's pluggable allocation hook:
/// `void* alloc(ssize_t size, int device, cudaStream_t stream)`. Returns the device pointer,
/// or null on failure and for `size == 0`. PyTorch keeps a null as the tensor's pointer (it
/// raises nothing), so a failure's message — the OOM report and diagnosis, for out of
/// memory — is logged at warn level before the null is returned (on standard error when the
/// program installed no `tracing` subscriber), and kept in `portalloc_last_error`.
#[no_mangle]
pub extern "C" fn portalloc_torch_alloc(
    size: libc::ssize_t,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    const CALL: &str = "portalloc_torch_alloc";
    let mut out = 0u64;
    let status = guard(CALL, || {
        let size = u64::try_from(size).map_err(|_| {
            Failure::new(
                PortallocStatus::InvalidArgument,
                format!("{CALL}: size {size} is negative"),
            )
        })?;
        if size == 0 {
            return Ok(());
        }
        let (_, instance) = global(CALL, i64::from(device))?;
        // The thread's tag (`portalloc.tag(name)`), else the process's (`portalloc.region`:
        // autograd's threads have no thread tag), else `torch`.
        let tag = super::api::region_tag();
        let tag = tag.as_deref().unwrap_or(TORCH_TAG);
        let (_, ptr) = allocate(&instance, size, 0, stream as usize as u64, Some(tag))?;
        out = ptr;
        Ok(())
    });
    if status != PortallocStatus::Ok {
        let message = super::last_error_text();
        super::warn(&format!(
            "{CALL}(size {size}, device {device}) failed ({}); returning null, which PyTorch \
             keeps as the tensor's pointer: {message}",
            status.name()
        ));
    }
    out as usize as *mut c_void
}

/// PyTorch's pluggable free hook:
/// `void free(void* ptr, ssize_t size, int device, cudaStream_t stream)`. A pointer that is
/// not a live buffer of the device's global allocator is refused (message in
/// `portalloc_last_error`, and a warning), never freed; null is ignored.
#[no_mangle]
pub extern "C" fn portalloc_torch_free(
    ptr: *mut c_void,
    size: libc::ssize_t,
    device: c_int,
    stream: *mut c_void,
) {
    const CALL: &str = "portalloc_torch_free";
    let _ = stream;
    if ptr.is_null() {
        return;
    }
    let status = guard(CALL, || {
        let (_, instance) = global(CALL, i64::from(device))?;
        free_ptr(CALL, &instance, ptr as usize as u64)
    });
    if status != PortallocStatus::Ok {
        let message = super::last_error_text();
        super::warn(&format!(
            "{CALL}(ptr {:#x}, size {size}, device {device}) refused the free ({}): {message}",
            ptr as usize,
            status.name()
        ));
    }
}
