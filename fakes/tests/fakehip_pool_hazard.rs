//! A block of a stream-ordered pool freed on one stream while a kernel on another stream still
//! uses it, then trimmed, is a hazard in both fakes ("a pool giving back a block"), as
//! fake_pools.h's spec says. Found by an outside review: fakehip's pools were off the
//! timeline (a free dropped the block at once, a trim checked nothing), so with
//! `PORTALLOC_ALLOCATOR=async` a missing cross-stream wait failed under the CUDA profiles and
//! passed under every ROCm one.
use std::ffi::c_void;

use portalloc_fakes::{Controls, Driver};

type Handle = *mut c_void;

/// The hazards of: alloc from the default pool on `upload`, a kernel on `compute` over it,
/// free on `upload` (no wait), trim the pool to 0.
fn hip_hazards() -> i64 {
    // ROCm 7 (pools supported); read at the driver's first call.
    std::env::set_var("FAKEHIP_VERSION", "70051831");
    let path = Driver::FAKEHIP.path();
    let driver = Controls::open(&path).unwrap();
    // SAFETY: the HIP runtime API's signatures, as fakehip exports them.
    unsafe {
        let lib = libloading::Library::new(&path).unwrap();
        let init: libloading::Symbol<unsafe extern "C" fn(u32) -> i32> =
            lib.get(b"hipInit\0").unwrap();
        let stream_create: libloading::Symbol<unsafe extern "C" fn(*mut Handle) -> i32> =
            lib.get(b"hipStreamCreate\0").unwrap();
        let default_pool: libloading::Symbol<unsafe extern "C" fn(*mut Handle, i32) -> i32> =
            lib.get(b"hipDeviceGetDefaultMemPool\0").unwrap();
        let alloc: libloading::Symbol<
            unsafe extern "C" fn(*mut Handle, usize, Handle, Handle) -> i32,
        > = lib.get(b"hipMallocFromPoolAsync\0").unwrap();
        let free: libloading::Symbol<unsafe extern "C" fn(Handle, Handle) -> i32> =
            lib.get(b"hipFreeAsync\0").unwrap();
        let trim: libloading::Symbol<unsafe extern "C" fn(Handle, usize) -> i32> =
            lib.get(b"hipMemPoolTrimTo\0").unwrap();
        assert_eq!(init(0), 0);
        let (mut upload, mut compute, mut pool, mut ptr) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        assert_eq!(stream_create(&mut upload), 0);
        assert_eq!(stream_create(&mut compute), 0);
        assert_eq!(default_pool(&mut pool, 0), 0);
        assert_eq!(alloc(&mut ptr, 4 << 20, pool, upload), 0);
        let kernel = driver
            .launch(compute as u64, ptr as u64, 4 << 20)
            .expect("a known stream");
        assert_eq!(free(ptr, upload), 0);
        assert_eq!(trim(pool, 0), 0);
        let n = driver.hazards();
        driver.finish(kernel);
        n
    }
}

fn cuda_hazards() -> i64 {
    let path = Driver::FAKECUDA.path();
    let driver = Controls::open(&path).unwrap();
    // SAFETY: the CUDA driver API's signatures, as fakecuda exports them.
    unsafe {
        let lib = libloading::Library::new(&path).unwrap();
        let init: libloading::Symbol<unsafe extern "C" fn(u32) -> i32> =
            lib.get(b"cuInit\0").unwrap();
        let retain: libloading::Symbol<unsafe extern "C" fn(*mut Handle, i32) -> i32> =
            lib.get(b"cuDevicePrimaryCtxRetain\0").unwrap();
        let set_current: libloading::Symbol<unsafe extern "C" fn(Handle) -> i32> =
            lib.get(b"cuCtxSetCurrent\0").unwrap();
        let stream_create: libloading::Symbol<unsafe extern "C" fn(*mut Handle, u32) -> i32> =
            lib.get(b"cuStreamCreate\0").unwrap();
        let default_pool: libloading::Symbol<unsafe extern "C" fn(*mut Handle, i32) -> i32> =
            lib.get(b"cuDeviceGetDefaultMemPool\0").unwrap();
        let alloc: libloading::Symbol<
            unsafe extern "C" fn(*mut u64, usize, Handle, Handle) -> i32,
        > = lib.get(b"cuMemAllocFromPoolAsync\0").unwrap();
        let free: libloading::Symbol<unsafe extern "C" fn(u64, Handle) -> i32> =
            lib.get(b"cuMemFreeAsync\0").unwrap();
        let trim: libloading::Symbol<unsafe extern "C" fn(Handle, usize) -> i32> =
            lib.get(b"cuMemPoolTrimTo\0").unwrap();
        assert_eq!(init(0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        let (mut upload, mut compute, mut pool, mut ptr) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0u64,
        );
        assert_eq!(stream_create(&mut upload, 0), 0);
        assert_eq!(stream_create(&mut compute, 0), 0);
        assert_eq!(default_pool(&mut pool, 0), 0);
        assert_eq!(alloc(&mut ptr, 4 << 20, pool, upload), 0);
        let kernel = driver
            .launch(compute as u64, ptr, 4 << 20)
            .expect("a known stream");
        assert_eq!(free(ptr, upload), 0);
        assert_eq!(trim(pool, 0), 0);
        let n = driver.hazards();
        driver.finish(kernel);
        n
    }
}

#[test]
fn a_pool_trimming_a_block_under_a_kernel_is_a_hazard_in_both_fakes() {
    let (cuda, hip) = (cuda_hazards(), hip_hazards());
    assert_eq!(
        cuda, 1,
        "fakecuda: a pool giving back a block under a kernel"
    );
    assert_eq!(
        hip, 1,
        "fakehip: the same sequence (hipFreeAsync, hipMemPoolTrimTo) under a kernel"
    );
}
