//! Graph pools through the C ABI ([`crate::adaptor::GraphPools`]): every allocator made by
//! `portalloc_create*` keeps the memory handed out while a stream is captured into a graph in
//! that capture's pool. A caller that captures says so
//! ([`portalloc_graph_pool_begin`] / [`portalloc_graph_pool_end`], as PyTorch's
//! `beginAllocateToPool` / `endAllocateToPool`): no driver call is spent on capture outside a
//! routed capture. The process-global allocators ([`super::portalloc_global`], the PyTorch
//! and CuPy hooks) ask the driver about every request's stream instead (one
//! `cuStreamGetCaptureInfo` / `hipStreamGetCaptureInfo` per allocation and free), since
//! PyTorch's Python API gives a pluggable allocator only its alloc and free calls: a capture
//! nobody routed gets a pool of its own, which [`portalloc_graph_pools`] lists.

use std::ffi::{c_char, c_void};

use super::{guard, lookup, read_str, write_opt, Failure, PortallocAllocator, PortallocStatus};
use crate::adaptor::GraphPoolId;
use crate::allocator::Keep;
use crate::device::Stream;

fn pool_failure(call: &str, e: crate::Error) -> Failure {
    let f: Failure = e.into();
    Failure::new(f.status, format!("{call}: {}", f.message))
}

/// Makes a graph pool of the allocator and writes its number to `*out_pool`. Its memory
/// carries `tag` in the strategy (null: `graph pool N`), which `portalloc_graph_pool_sleep`
/// sleeps.
///
/// # Safety
/// `tag` null or NUL-terminated; `out_pool` null (refused) or valid for one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_graph_pool_create(
    allocator: *mut PortallocAllocator,
    tag: *const c_char,
    out_pool: *mut u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_graph_pool_create";
    guard(CALL, || {
        super::require_non_null(CALL, "out_pool", out_pool)?;
        let instance = lookup(CALL, allocator)?;
        // SAFETY: the caller's promise on `tag`.
        let tag = unsafe { read_str(CALL, "tag", tag) }?;
        let pool = instance
            .pools
            .create_pool(tag.as_deref())
            .map_err(|e| pool_failure(CALL, e))?;
        // SAFETY: non-null, and the caller's promise on `out_pool`.
        unsafe { write_opt(out_pool, pool.get()) };
        Ok(())
    })
}

/// Routes the requests of the capture on `stream` (the one under way, or the next one
/// begun there), and of every stream that joins it, to `pool`, until
/// [`portalloc_graph_pool_end`]. Call it before the capture begins.
#[no_mangle]
pub extern "C" fn portalloc_graph_pool_begin(
    allocator: *mut PortallocAllocator,
    pool: u64,
    stream: *mut c_void,
) -> PortallocStatus {
    const CALL: &str = "portalloc_graph_pool_begin";
    guard(CALL, || {
        let instance = lookup(CALL, allocator)?;
        instance
            .pools
            .begin_allocate_to_pool(GraphPoolId::from_raw(pool), Stream(stream as usize as u64))
            .map_err(|e| pool_failure(CALL, e))
    })
}

/// Ends the routes to `pool`; the pool keeps its memory.
#[no_mangle]
pub extern "C" fn portalloc_graph_pool_end(
    allocator: *mut PortallocAllocator,
    pool: u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_graph_pool_end";
    guard(CALL, || {
        let instance = lookup(CALL, allocator)?;
        instance
            .pools
            .end_allocate_to_pool(GraphPoolId::from_raw(pool))
            .map_err(|e| pool_failure(CALL, e))
    })
}

/// Releases `pool` once no graph captured into it will be launched again: its free memory
/// goes back to the strategy after a device synchronisation, the rest as it is freed. Writes
/// the bytes given back now to `*out_released` (if not null).
///
/// # Safety
/// `out_released` null or valid for one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_graph_pool_release(
    allocator: *mut PortallocAllocator,
    pool: u64,
    out_released: *mut u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_graph_pool_release";
    guard(CALL, || {
        let instance = lookup(CALL, allocator)?;
        let bytes = instance
            .pools
            .release_pool(GraphPoolId::from_raw(pool))
            .map_err(|e| pool_failure(CALL, e))?;
        // SAFETY: the caller's promise on `out_released`.
        unsafe { write_opt(out_released, bytes) };
        Ok(())
    })
}

/// Sleeps the pool's memory (`vmm`), keeping its addresses and, with `keep_contents`, its
/// bytes; graphs captured into it are launched again after [`portalloc_graph_pool_wake`]
/// without capturing again. Re-register after the wake what was bound to the old physical
/// memory (NCCL user buffers, IPC handles).
#[no_mangle]
pub extern "C" fn portalloc_graph_pool_sleep(
    allocator: *mut PortallocAllocator,
    pool: u64,
    keep_contents: bool,
) -> PortallocStatus {
    const CALL: &str = "portalloc_graph_pool_sleep";
    guard(CALL, || {
        let instance = lookup(CALL, allocator)?;
        let keep = if keep_contents {
            Keep::Contents
        } else {
            Keep::Nothing
        };
        instance
            .pools
            .sleep_pool(GraphPoolId::from_raw(pool), keep)
            .map(|_| ())
            .map_err(|e| pool_failure(CALL, e))
    })
}

/// Wakes the pool's memory at its addresses.
#[no_mangle]
pub extern "C" fn portalloc_graph_pool_wake(
    allocator: *mut PortallocAllocator,
    pool: u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_graph_pool_wake";
    guard(CALL, || {
        let instance = lookup(CALL, allocator)?;
        instance
            .pools
            .wake_pool(GraphPoolId::from_raw(pool))
            .map(|_| ())
            .map_err(|e| pool_failure(CALL, e))
    })
}

/// Writes the pool's bytes held, in use and free (each output if not null).
///
/// # Safety
/// Each output null or valid for one `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_graph_pool_stats(
    allocator: *mut PortallocAllocator,
    pool: u64,
    out_held: *mut u64,
    out_in_use: *mut u64,
    out_free: *mut u64,
) -> PortallocStatus {
    const CALL: &str = "portalloc_graph_pool_stats";
    guard(CALL, || {
        let instance = lookup(CALL, allocator)?;
        let stats = instance
            .pools
            .pool_stats(GraphPoolId::from_raw(pool))
            .ok_or_else(|| {
                Failure::new(
                    PortallocStatus::InvalidArgument,
                    format!("{CALL}: graph pool {pool} is not a live pool of this allocator"),
                )
            })?;
        // SAFETY: the caller's promise on each output.
        unsafe {
            write_opt(out_held, stats.held_bytes);
            write_opt(out_in_use, stats.in_use_bytes);
            write_opt(out_free, stats.free_bytes);
        }
        Ok(())
    })
}

/// Writes the numbers of the allocator's graph pools, up to `capacity` of them, to `out_pools`
/// (null when `capacity` is 0), and how many there are to `*out_count`.
///
/// # Safety
/// `out_pools` null or valid for `capacity` `uint64_t`s; `out_count` null (refused) or valid
/// for one `size_t`.
#[no_mangle]
pub unsafe extern "C" fn portalloc_graph_pools(
    allocator: *mut PortallocAllocator,
    out_pools: *mut u64,
    capacity: usize,
    out_count: *mut usize,
) -> PortallocStatus {
    const CALL: &str = "portalloc_graph_pools";
    guard(CALL, || {
        super::require_non_null(CALL, "out_count", out_count)?;
        if capacity > 0 {
            super::require_non_null(CALL, "out_pools", out_pools)?;
        }
        let instance = lookup(CALL, allocator)?;
        let pools = instance.pools.pools();
        for (i, p) in pools.iter().take(capacity).enumerate() {
            // SAFETY: i < capacity, and the caller's promise on `out_pools`.
            unsafe { out_pools.add(i).write(p.id.get()) };
        }
        // SAFETY: non-null, and the caller's promise on `out_count`.
        unsafe { write_opt(out_count, pools.len()) };
        Ok(())
    })
}
