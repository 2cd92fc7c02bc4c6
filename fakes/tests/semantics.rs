//! The vendors' rules as both drivers keep them, through the vendors' own calls: streams (the
//! legacy default stream, non-blocking streams, per-thread default streams), copies that
//! move bytes when their stream reaches them, the synchronisations the vendors document, the
//! race detector, the guard over pinned memory, the symbol tables, the devices, the controls.
//!
//! Each test loads a private copy of a driver (its own state), so the tests run in parallel.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use portalloc_fakes::{Call, Code, Driver, Vendor};
use test_case::test_case;

mod gpu;
use gpu::{Fake, Gpu, CUDA12, HIP, NON_BLOCKING, NOT_READY, R};

/// What the vendors answer for bytes that are no module: CUDA_ERROR_INVALID_IMAGE, and under
/// HIP, which takes code objects only, hipErrorInvalidKernelFile.
fn not_an_image(gpu: &Gpu) -> R {
    match gpu.fake.vendor {
        Vendor::Cuda => 200,
        Vendor::Hip => 218,
    }
}

// ---- streams ---------------------------------------------------------------------------------

/// A NULL-stream synchronisation completes the work of blocking streams before it, not of a
/// non-blocking stream (CUDA "Stream synchronization behavior"; HIP's null stream).
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn the_null_stream_waits_for_blocking_streams_only(driver: Driver) {
    let gpu = Gpu::new(driver);
    let (blocking, free_running) = (gpu.stream(0), gpu.stream(NON_BLOCKING));
    let p = gpu.malloc(1 << 20);
    let on_blocking = gpu.c().launch(blocking, p, 4096).unwrap();
    let on_free = gpu.c().launch(free_running, p, 4096).unwrap();
    let waits = gpu.c().cpu_waits();
    gpu.sync(0);
    assert_eq!(gpu.c().cpu_waits(), waits + 1);
    assert!(
        gpu.c().done(on_blocking),
        "a blocking stream's kernel: waited for"
    );
    assert!(
        !gpu.c().done(on_free),
        "a non-blocking stream's kernel runs on"
    );
    assert_eq!(gpu.query(free_running), NOT_READY);
    // Work queued on the legacy stream from now on is ordered after the blocking stream's
    // work, never after the non-blocking one's.
    assert!(gpu.c().streams_ordered(blocking, 0));
    assert!(!gpu.c().streams_ordered(free_running, 0));
    gpu.sync(free_running);
    assert!(gpu.c().done(on_free));
    assert_eq!(gpu.c().hazards(), 0);
    gpu.destroy_stream(blocking);
    gpu.destroy_stream(free_running);
    assert_eq!(gpu.free(p), 0);
}

/// An operation queued on a blocking stream waits for the legacy stream's work before it: a
/// write there is ordered after a kernel on the NULL stream, and is no race; from a
/// non-blocking stream it is.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn the_legacy_streams_implicit_order_is_what_the_race_detector_sees(driver: Driver) {
    let gpu = Gpu::new(driver);
    let (blocking, free_running) = (gpu.stream(0), gpu.stream(NON_BLOCKING));
    let p = gpu.malloc(1 << 20);
    let kernel = gpu.c().launch(0, p, 1 << 20).unwrap();
    assert!(gpu.c().ordered(kernel, blocking));
    assert!(!gpu.c().ordered(kernel, free_running));
    assert_eq!(gpu.memset_async(p, 1, 4096, blocking), 0);
    assert_eq!(gpu.c().hazards(), 0, "{:?}", gpu.c().hazard_log());
    // From the non-blocking stream: a race with the kernel, and with the blocking stream's
    // memset, which waits behind the kernel.
    assert_eq!(gpu.memset_async(p, 2, 4096, free_running), 0);
    assert_eq!(gpu.c().hazards(), 2, "{:?}", gpu.c().hazard_log());
    let race = gpu.c().first_hazard();
    assert!(
        race.starts_with("race: cu") || race.starts_with("race: hip"),
        "{race}"
    );
    assert!(
        race.contains(&format!("stream {free_running:#x}")),
        "{race}"
    );
    assert!(race.contains("legacy default stream"), "{race}");
    assert!(
        race.contains(&format!("[{p:#x}, {:#x})", p + 4096)),
        "{race}"
    );
    gpu.c().finish(kernel);
    gpu.sync(0);
    gpu.sync(free_running);
    assert_eq!(gpu.free(p), 0);
}

/// Each thread has a per-thread default stream of its own (the handle 0x2): two threads'
/// are two streams, and a write from one under the other's kernel is a race.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn each_thread_has_its_own_per_thread_stream(driver: Driver) {
    let gpu = Gpu::new(driver);
    let p = gpu.malloc(1 << 20);
    let kernel = gpu.c().launch(2, p, 4096).unwrap();
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                gpu.current();
                assert!(!gpu.c().ordered(kernel, 2), "another thread's stream");
                assert_eq!(gpu.memset_async(p, 0, 64, 2), 0);
            })
            .join()
            .unwrap();
    });
    assert_eq!(gpu.c().hazards(), 1, "{:?}", gpu.c().hazard_log());
    assert!(gpu
        .c()
        .first_hazard()
        .contains("per-thread default stream of thread"));
    gpu.c().finish(kernel);
    assert_eq!(gpu.free(p), 0);
}

/// A stream destroyed with work in flight: the work runs on, the handle value comes back for
/// the next stream made, and work on that new stream is not ordered after the old work.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_destroyed_streams_handle_comes_back_without_its_order(driver: Driver) {
    let gpu = Gpu::new(driver);
    let p = gpu.malloc(1 << 20);
    let old = gpu.stream(NON_BLOCKING);
    let kernel = gpu.c().launch(old, p, 4096).unwrap();
    gpu.destroy_stream(old);
    let new = gpu.stream(NON_BLOCKING);
    assert_eq!(
        new, old,
        "the drivers hand a destroyed stream's handle out again"
    );
    assert!(!gpu.c().done(kernel));
    assert!(!gpu.c().ordered(kernel, new));
    assert_eq!(gpu.memset_async(p, 0, 64, new), 0);
    let race = gpu.c().first_hazard();
    assert!(race.contains("(destroyed)"), "{race}");
    gpu.c().finish(kernel);
    gpu.destroy_stream(new);
    assert_eq!(gpu.free(p), 0);
}

// ---- copies ------------------------------------------------------------------------------------

/// A copy to pinned memory lands when its stream reaches it: behind a kernel in flight, the
/// bytes are the old ones, and reading them before a synchronisation is a hazard the guard
/// catches; after it, they are there. Both drivers move bytes.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_copy_to_pinned_memory_lands_when_its_stream_reaches_it(driver: Driver) {
    let gpu = Gpu::new(driver);
    let s = gpu.stream(NON_BLOCKING);
    let (p, n) = (gpu.malloc(1 << 20), 8192usize);
    let data: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
    let host = gpu.host_alloc(n);
    assert_eq!(gpu.htod_async(p, data.as_ptr(), n, s), 0);
    gpu.sync(s);
    let kernel = gpu.c().launch(s, p, n as u64).unwrap();
    assert_eq!(gpu.dtoh_async(host, p, n, s), 0);
    assert_eq!(gpu.c().hazards(), 0);
    // A read before the stream got there: the old bytes, and a hazard naming the copy.
    // SAFETY: pinned memory of `n` bytes.
    let early = unsafe { std::ptr::read_volatile(host.add(100)) };
    assert_eq!(early, 0, "not written yet");
    assert_eq!(gpu.c().hazards(), 1);
    let said = gpu.c().first_hazard();
    assert!(said.starts_with("CPU access of host address"), "{said}");
    assert!(said.contains(&format!("stream {s:#x}")), "{said}");
    gpu.c().finish(kernel);
    gpu.sync(s);
    // SAFETY: as above; the copy completed.
    let back = unsafe { std::slice::from_raw_parts(host, n) };
    assert_eq!(back, &data[..], "the bytes landed");
    assert_eq!(gpu.host_free(host), 0);
    gpu.destroy_stream(s);
    assert_eq!(gpu.free(p), 0);
    assert_eq!(gpu.c().hazards(), 1);
}

/// A copy to pageable memory completes before the call returns — the CPU waits for the
/// stream, its kernels included ("For transfers from device memory to pageable host memory,
/// the function will return only once the copy has completed"; HIP: "If host or dest are not
/// pinned, the memory copy will be performed synchronously").
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_copy_to_pageable_memory_completes_before_it_returns(driver: Driver) {
    let gpu = Gpu::new(driver);
    let s = gpu.stream(NON_BLOCKING);
    let p = gpu.malloc(1 << 20);
    let data = vec![0x5au8; 4096];
    assert_eq!(gpu.htod_async(p, data.as_ptr(), 4096, s), 0);
    let kernel = gpu.c().launch(s, p, 4096).unwrap();
    let mut back = vec![0u8; 4096];
    let waits = gpu.c().cpu_waits();
    assert_eq!(gpu.dtoh_async(back.as_mut_ptr(), p, 4096, s), 0);
    assert!(gpu.c().done(kernel), "the CPU waited for the stream");
    assert!(gpu.c().cpu_waits() > waits);
    assert_eq!(back, data);
    gpu.destroy_stream(s);
    assert_eq!(gpu.free(p), 0);
}

/// The vendors' implicit synchronisations: freeing device memory (cuMemFree, hipFree) and a
/// synchronous copy to the host wait for the device — counted as CPU waits — so nothing is
/// freed under a kernel.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn frees_and_synchronous_copies_wait_and_are_counted(driver: Driver) {
    let gpu = Gpu::new(driver);
    let s = gpu.stream(0);
    let (p, q) = (gpu.malloc(4096), gpu.malloc(4096));
    let kernel = gpu.c().launch(s, p, 4096).unwrap();
    let mut byte = [0u8; 1];
    let waits = gpu.c().cpu_waits();
    assert_eq!(gpu.dtoh(byte.as_mut_ptr(), q, 1), 0);
    assert!(
        gpu.c().cpu_waits() > waits,
        "a synchronous copy is a CPU wait"
    );
    assert!(
        gpu.c().done(kernel),
        "the legacy stream waited for the blocking stream"
    );
    let kernel = gpu.c().launch(gpu.stream(NON_BLOCKING), p, 4096).unwrap();
    let waits = gpu.c().cpu_waits();
    assert_eq!(gpu.free(p), 0);
    assert_eq!(gpu.c().cpu_waits(), waits + 1);
    assert!(gpu.c().done(kernel), "a free waits for the whole device");
    assert_eq!(gpu.c().hazards(), 0);
    assert_eq!(gpu.free(q), 0);
    // Null pointers are no error ("If devPtr is 0, no operation is performed").
    assert_eq!(gpu.free(0), 0);
    assert_eq!(gpu.host_free(std::ptr::null_mut()), 0);
}

// ---- the race detector ------------------------------------------------------------------------

/// A write ordered after the kernel by an event and a GPU-side wait is no race; the same
/// write without the wait is, and the hazard names both operations, streams and ranges.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn an_event_and_a_wait_order_a_write_after_a_kernel(driver: Driver) {
    let gpu = Gpu::new(driver);
    let (a, b) = (gpu.stream(NON_BLOCKING), gpu.stream(NON_BLOCKING));
    let p = gpu.malloc(1 << 20);
    let kernel = gpu.c().launch(a, p, 1 << 20).unwrap();
    let e = gpu.event();
    gpu.record(e, a);
    gpu.wait(b, e);
    assert!(gpu.c().ordered(kernel, b));
    assert_eq!(gpu.memset_async(p, 0, 4096, b), 0);
    assert_eq!(gpu.c().hazards(), 0);
    let c = gpu.stream(NON_BLOCKING);
    assert_eq!(gpu.memset_async(p + 8192, 0, 4096, c), 0);
    let race = gpu.c().first_hazard();
    assert!(
        race.contains(&format!(
            "stream {c:#x} writes [{:#x}, {:#x})",
            p + 8192,
            p + 12288
        )),
        "{race}"
    );
    assert!(
        race.contains(&format!(
            "stream {a:#x} reads [{p:#x}, {:#x})",
            p + (1 << 20)
        )),
        "{race}"
    );
    gpu.c().finish(kernel);
    for s in [a, b, c] {
        gpu.sync(s);
        gpu.destroy_stream(s);
    }
    assert_eq!(gpu.free(p), 0);
}

/// Two reads do not race; a kernel that writes races a read too.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn reads_do_not_race_each_other(driver: Driver) {
    let gpu = Gpu::new(driver);
    let (a, b) = (gpu.stream(NON_BLOCKING), gpu.stream(NON_BLOCKING));
    let p = gpu.malloc(1 << 20);
    let reader = gpu.c().launch(a, p, 4096).unwrap();
    let host = gpu.host_alloc(4096);
    assert_eq!(gpu.dtoh_async(host, p, 4096, b), 0);
    assert_eq!(gpu.c().hazards(), 0, "a copy out reads, as the kernel does");
    let writer = gpu.c().launch_writing(b, p + 4096, 4096).unwrap();
    assert_eq!(gpu.c().hazards(), 0, "another range");
    let _ = gpu.c().launch(a, p + 4096, 16).unwrap();
    assert_eq!(gpu.c().hazards(), 1, "a read under a write");
    gpu.c().finish_all();
    gpu.sync(a);
    gpu.sync(b);
    let _ = (reader, writer);
    assert_eq!(gpu.host_free(host), 0);
    assert_eq!(gpu.free(p), 0);
}

// ---- launches ----------------------------------------------------------------------------------

const PTX: &[u8] = b"
.version 7.0
.target sm_90
.address_size 64
.visible .entry scale(.param .u64 x, .param .u64 y, .param .u32 n) { ret; }
.visible .entry fill(.param .u64 y, .param .u32 n) { ret; }
\0";

/// A module (PTX for CUDA, a code object for HIP) names its functions; a launch is a kernel in
/// flight over what its model says it reads and writes.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_launch_uses_what_its_model_says(driver: Driver) {
    let gpu = Gpu::new(driver);
    let load = call!(
        gpu,
        "cuModuleLoadData",
        "hipModuleLoadData",
        unsafe extern "C" fn(*mut u64, *const c_char) -> R
    );
    let get = call!(
        gpu,
        "cuModuleGetFunction",
        "hipModuleGetFunction",
        unsafe extern "C" fn(*mut u64, u64, *const c_char) -> R
    );
    let launch = call!(
        gpu,
        "cuLaunchKernel",
        "hipModuleLaunchKernel",
        unsafe extern "C" fn(
            u64,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            u64,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> R
    );
    let unload = call!(
        gpu,
        "cuModuleUnload",
        "hipModuleUnload",
        unsafe extern "C" fn(u64) -> R
    );
    gpu.c()
        .kernel_model("scale", "r:a0:4*i2 w:a1:4*i2")
        .unwrap();
    let (mut module, mut scale, mut missing) = (0u64, 0u64, 0u64);
    let image = gpu.image(PTX, &["scale", "fill"], &[]);
    // SAFETY: handles written; a NUL-terminated image and names.
    unsafe {
        assert_eq!(load(&mut module, image.as_ptr().cast()), 0);
        assert_eq!(get(&mut scale, module, c"scale".as_ptr()), 0);
        assert_eq!(
            get(&mut missing, module, c"nope".as_ptr()),
            500,
            "not found"
        );
        assert_eq!(
            load(&mut missing, c"not an image".as_ptr()),
            not_an_image(&gpu),
            "an invalid image"
        );
    }
    let (a, b) = (gpu.stream(NON_BLOCKING), gpu.stream(NON_BLOCKING));
    let (x, y) = (gpu.malloc(4096), gpu.malloc(4096));
    let mut args: (u64, u64, c_int) = (x, y, 256);
    let mut params = [
        (&mut args.0 as *mut u64).cast::<c_void>(),
        (&mut args.1 as *mut u64).cast(),
        (&mut args.2 as *mut c_int).cast(),
    ];
    // SAFETY: a live function and stream; the parameters outlive the call.
    assert_eq!(
        unsafe {
            launch(
                scale,
                1,
                1,
                1,
                256,
                1,
                1,
                0,
                a,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        0
    );
    let kernel = gpu.c().last_kernel().expect("the launch is in flight");
    assert!(!gpu.c().done(kernel));
    // Reading x from another stream: no race. Writing y's first kibibyte: a race with the
    // kernel's write of it; y past 1 KiB (n = 256 floats): untouched.
    let host = gpu.host_alloc(4096);
    assert_eq!(gpu.dtoh_async(host, x, 4096, b), 0);
    assert_eq!(gpu.memset_async(y + 1024, 0, 1024, b), 0);
    assert_eq!(gpu.c().hazards(), 0, "{:?}", gpu.c().hazard_log());
    assert_eq!(gpu.memset_async(y, 0, 4, b), 0);
    let race = gpu.c().first_hazard();
    assert!(
        race.contains("(scale)") && race.contains("writes"),
        "{race}"
    );
    // Too many threads per block.
    // SAFETY: as above.
    assert_eq!(
        unsafe {
            launch(
                scale,
                1,
                1,
                1,
                2048,
                1,
                1,
                0,
                a,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        1
    );
    gpu.c().finish(kernel);
    gpu.sync(a);
    gpu.sync(b);
    // SAFETY: a live module.
    assert_eq!(unsafe { unload(module) }, 0);
    assert_eq!(gpu.host_free(host), 0);
    assert_eq!(gpu.free(x), 0);
    assert_eq!(gpu.free(y), 0);
}

// ---- symbol tables ------------------------------------------------------------------------------

/// cuGetProcAddress resolves a base name for a version to the versioned symbol, the per-thread
/// form when asked, and says why it found none.
#[test]
fn cu_get_proc_address_resolves_by_name_version_and_stream_flag() {
    let fake = Fake::new(CUDA12);
    let get: unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> R =
        fake.sym("cuGetProcAddress_v2");
    let resolve = |name: &CStr, version: c_int, flags: u64| {
        let (mut f, mut status) = (std::ptr::null_mut(), -1);
        // SAFETY: the vendor's signature; out pointers valid.
        assert_eq!(
            unsafe { get(name.as_ptr(), &mut f, version, flags, &mut status) },
            0
        );
        (f as usize, status)
    };
    let addr = |name: &str| fake.sym::<unsafe extern "C" fn()>(name) as usize;
    assert_eq!(resolve(c"cuMemAlloc", 12020, 0), (addr("cuMemAlloc_v2"), 0));
    assert_eq!(
        resolve(c"cuMemcpyAsync", 12020, 2),
        (addr("cuMemcpyAsync_ptsz"), 0)
    );
    assert_eq!(
        resolve(c"cuMemcpyAsync", 12020, 1),
        (addr("cuMemcpyAsync"), 0)
    );
    assert_eq!(
        resolve(c"cuMemAllocAsync", 11000, 0),
        (0, 2),
        "version not sufficient"
    );
    assert_eq!(
        resolve(c"cuNoSuchCall", 12020, 0),
        (0, 1),
        "symbol not found"
    );
    // Every export resolves, through its base name, to itself or a newer version of it.
    for name in fake.controls.exports() {
        let base = name.trim_end_matches("_ptsz").trim_end_matches("_ptds");
        let base = base.strip_suffix("_v2").unwrap_or(base);
        let c = CString::new(base).unwrap();
        let (f, status) = resolve(
            &c,
            12020,
            if name.ends_with("_ptsz") || name.ends_with("_ptds") {
                2
            } else {
                1
            },
        );
        assert_eq!(status, 0, "{name}");
        assert_ne!(f, 0, "{name}");
    }
}

/// hipGetProcAddress (ROCm 6.2) resolves every export by name; an unknown one is
/// hipErrorInvalidValue with SYMBOL_NOT_FOUND.
#[test]
fn hip_get_proc_address_resolves_every_export() {
    let fake = Fake::new(HIP);
    let get: unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> R =
        fake.sym("hipGetProcAddress");
    for name in fake.controls.exports() {
        let c = CString::new(name.as_str()).unwrap();
        let (mut f, mut status) = (std::ptr::null_mut(), -1);
        // SAFETY: as above.
        assert_eq!(
            unsafe { get(c.as_ptr(), &mut f, 602, 0, &mut status) },
            0,
            "{name}"
        );
        assert_eq!((status, f.is_null()), (0, false), "{name}");
    }
    let (mut f, mut status) = (std::ptr::null_mut(), -1);
    // SAFETY: as above.
    assert_eq!(
        unsafe { get(c"hipNoSuchCall".as_ptr(), &mut f, 602, 0, &mut status) },
        1
    );
    assert_eq!(status, 1);
}

// ---- devices ------------------------------------------------------------------------------------

/// The attributes of the impersonated devices (docs/fakes.md names each source).
#[test_case(Driver::FAKECUDA, "NVIDIA H100 80GB HBM3", 132, (9, 0) ; "h100")]
#[test_case(Driver::FAKECUDA_OLD, "Tesla V100-SXM2-16GB", 80, (7, 0) ; "v100")]
fn cuda_devices_look_like_their_devices(
    driver: Driver,
    name: &str,
    sms: c_int,
    cc: (c_int, c_int),
) {
    let gpu = Gpu::new(driver);
    let attr: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> R =
        gpu.fake.sym("cuDeviceGetAttribute");
    let get = |a: c_int| {
        let mut v = -1;
        // SAFETY: one value written.
        assert_eq!(unsafe { attr(&mut v, a, 0) }, 0);
        v
    };
    assert_eq!(
        (get(16), (get(75), get(76)), get(10), get(1), get(41)),
        (sms, cc, 32, 1024, 1)
    );
    let get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> R =
        gpu.fake.sym("cuDeviceGetName");
    let mut buf = [0 as c_char; 64];
    // SAFETY: 64 bytes.
    assert_eq!(unsafe { get_name(buf.as_mut_ptr(), 64, 0) }, 0);
    // SAFETY: NUL-terminated by the driver.
    assert_eq!(
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(),
        name
    );
}

/// hipDeviceProp_t filled at each layout's offsets: the 5.x one (hipGetDeviceProperties) and
/// ROCm 6's R0600.
#[test]
fn hip_properties_fill_both_layouts() {
    let gpu = Gpu::new(HIP);
    let old: unsafe extern "C" fn(*mut u8, c_int) -> R = gpu.fake.sym("hipGetDeviceProperties");
    let new: unsafe extern "C" fn(*mut u8, c_int) -> R =
        gpu.fake.sym("hipGetDevicePropertiesR0600");
    let int_at = |p: &[u8], at: usize| c_int::from_ne_bytes(p[at..at + 4].try_into().unwrap());
    let mut r0000 = vec![0u8; 792];
    let mut r0600 = vec![0u8; 1472];
    // SAFETY: buffers of each layout's size.
    unsafe {
        assert_eq!(old(r0000.as_mut_ptr(), 0), 0);
        assert_eq!(new(r0600.as_mut_ptr(), 0), 0);
    }
    // warpSize, multiProcessorCount, major, minor.
    assert_eq!(
        (
            int_at(&r0000, 276),
            int_at(&r0000, 336),
            int_at(&r0000, 328),
            int_at(&r0000, 332)
        ),
        (64, 304, 9, 4)
    );
    assert_eq!(
        (
            int_at(&r0600, 308),
            int_at(&r0600, 388),
            int_at(&r0600, 360),
            int_at(&r0600, 364)
        ),
        (64, 304, 9, 4)
    );
    let text = |p: &[u8], at: usize| {
        CStr::from_bytes_until_nul(&p[at..])
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(text(&r0000, 0), "AMD Instinct MI300X");
    assert_eq!(text(&r0000, 396), "gfx942:sramecc+:xnack-");
    assert_eq!(text(&r0600, 1160), "gfx942:sramecc+:xnack-");
    let total = u64::from_ne_bytes(r0600[288..296].try_into().unwrap());
    assert_eq!(total, 206_141_652_992, "the MI300X's memory");
}

// ---- the controls -------------------------------------------------------------------------------

/// Faults: a name the driver does not export is refused (it would never fire); groups fail
/// whichever call comes next; codes by meaning take each vendor's number.
#[test_case(CUDA12, "cuMemAlloc_v2", 2 ; "cuda")]
#[test_case(HIP, "hipMalloc", 2 ; "hip")]
fn faults_take_calls_groups_and_named_codes(driver: Driver, alloc: &str, oom: R) {
    let gpu = Gpu::new(driver);
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        gpu.c().fail("cuMemAlloc", 1, 1, Code::OutOfMemory)
    }));
    let said = *refused
        .expect_err("a name no driver exports")
        .downcast::<String>()
        .unwrap();
    assert!(said.contains("exports no call cuMemAlloc"), "{said}");
    assert_eq!(gpu.c().code(Code::OutOfMemory), oom);
    gpu.c().fail_next(Call::Allocation, Code::OutOfMemory);
    let f: unsafe extern "C" fn(*mut u64, usize) -> R = gpu.fake.sym(alloc);
    let mut p = 0;
    // SAFETY: one pointer written.
    unsafe {
        assert_eq!(f(&mut p, 64), oom, "the next allocation fails");
        assert_eq!(f(&mut p, 64), 0, "once");
    }
    assert_eq!(gpu.free(p), 0);
    gpu.c().fail(alloc, 1, 1, Code::Raw(999));
    // SAFETY: as above.
    assert_eq!(unsafe { f(&mut p, 64) }, 999);
}

/// The checks that could pass vacuously refuse a driver nobody initialised in this process.
#[test]
fn a_census_of_a_driver_nobody_initialised_is_refused() {
    let fake = Fake::new(CUDA12);
    assert!(!fake.controls.initialised());
    let said = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fake.controls.census()))
        .expect_err("refused");
    let said = said.downcast::<String>().unwrap();
    assert!(said.contains("never initialised in this process"), "{said}");
    assert!(
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fake.controls.hazards())).is_err()
    );
    // SAFETY: the vendor's signature.
    assert_eq!(
        unsafe { fake.sym::<unsafe extern "C" fn(c_uint) -> R>("cuInit")(0) },
        0
    );
    assert!(fake.controls.census().holds_no_memory());
}

// ---- what an outside review found ------------------------------------------------------------------

/// A host function is "called after currently enqueued work": the bytes of the memset and the
/// copy queued before it on its stream have landed when it runs, behind a kernel held in
/// flight too.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_host_function_sees_the_copies_before_it(driver: Driver) {
    use std::sync::atomic::{AtomicU8, Ordering};
    struct Seen {
        pinned: *const u8,
        byte: AtomicU8,
    }
    extern "C" fn look(data: *mut c_void) {
        // SAFETY: a live `Seen`; its pinned byte was written before this runs.
        let seen = unsafe { &*(data as *const Seen) };
        // SAFETY: pinned memory the driver gave.
        seen.byte.store(unsafe { *seen.pinned }, Ordering::SeqCst);
    }
    let gpu = Gpu::new(driver);
    let s = gpu.stream(NON_BLOCKING);
    let d = gpu.malloc(4096);
    let pinned = gpu.host_alloc(4096);
    let seen = Seen {
        pinned,
        byte: AtomicU8::new(0),
    };
    let kernel = gpu.c().launch(s, d + 2048, 64).unwrap();
    assert_eq!(gpu.memset_async(d, 42, 64, s), 0);
    assert_eq!(gpu.dtoh_async(pinned, d, 64, s), 0);
    let host = call!(
        gpu,
        "cuLaunchHostFunc",
        "hipLaunchHostFunc",
        unsafe extern "C" fn(u64, extern "C" fn(*mut c_void), *mut c_void) -> R
    );
    // SAFETY: `seen` outlives the synchronisation below.
    assert_eq!(
        unsafe { host(s, look, &seen as *const Seen as *mut c_void) },
        0
    );
    assert!(!gpu.c().done(kernel));
    gpu.sync(s);
    assert_eq!(seen.byte.load(Ordering::SeqCst), 42);
    assert_eq!(gpu.c().hazards(), 0, "{:?}", gpu.c().hazard_log());
    assert_eq!(gpu.host_free(pinned), 0);
}

/// Held, nothing completes until a CPU wait forces it — and a CPU wait does move the bytes of
/// what it forced; without the hold an upload completes as soon as it is queued, so a kernel
/// that reads it without waiting is a race only under the hold.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn held_work_lands_when_a_cpu_wait_forces_it(driver: Driver) {
    let gpu = Gpu::new(driver);
    let (up, down) = (gpu.stream(NON_BLOCKING), gpu.stream(NON_BLOCKING));
    let d = gpu.malloc(4096);
    let (src, dst) = (gpu.host_alloc(4096), gpu.host_alloc(4096));
    // SAFETY: pinned memory the driver gave, nothing in flight over it.
    unsafe { src.write_bytes(7, 4096) };
    gpu.c().hold(true);
    assert_eq!(gpu.htod_async(d, src, 4096, up), 0);
    let e = gpu.event();
    gpu.record(e, up);
    gpu.wait(down, e);
    assert_eq!(gpu.dtoh_async(dst, d, 4096, down), 0);
    assert_eq!(gpu.c().in_flight(), 2, "held: both copies in flight");
    gpu.sync(down);
    assert_eq!(gpu.c().in_flight(), 0);
    // SAFETY: the copy completed.
    assert_eq!(
        unsafe { *dst.add(4095) },
        7,
        "the forced copies moved their bytes"
    );
    assert_eq!(gpu.c().hazards(), 0, "{:?}", gpu.c().hazard_log());

    // A kernel reading an upload with no wait: a race only while held.
    for held in [false, true] {
        gpu.c().hold(held);
        let before = gpu.c().hazards();
        assert_eq!(gpu.htod_async(d, src, 4096, up), 0);
        gpu.c().launch(down, d, 4096).unwrap();
        assert_eq!(gpu.c().hazards() - before, i64::from(held), "held: {held}");
        gpu.c().hold(false);
        gpu.c().finish_all();
    }
    assert!(
        gpu.c().first_hazard().contains("race"),
        "{}",
        gpu.c().first_hazard()
    );
    assert_eq!(gpu.host_free(src), 0);
    assert_eq!(gpu.host_free(dst), 0);
}

/// No time passes on the fakes: a loop polling behind a kernel the test holds would spin for
/// ever, so after 1000 "not ready" answers in a row the query waits for the work, counted as a
/// CPU wait. Patience 0 polls for ever.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn polling_ends_after_the_drivers_patience(driver: Driver) {
    let gpu = Gpu::new(driver);
    let s = gpu.stream(NON_BLOCKING);
    let d = gpu.malloc(4096);
    let kernel = gpu.c().launch(s, d, 4096).unwrap();
    let waits = gpu.c().cpu_waits();
    let mut polls = 1;
    while gpu.query(s) == NOT_READY {
        polls += 1;
    }
    assert_eq!(polls, 1000);
    assert!(gpu.c().done(kernel));
    assert_eq!(gpu.c().cpu_waits(), waits + 1);
    assert_eq!(gpu.c().query_patience(0), 1000);
    let kernel = gpu.c().launch(s, d, 4096).unwrap();
    assert!((0..5000).all(|_| gpu.query(s) == NOT_READY), "never, at 0");
    gpu.c().finish(kernel);
    assert_eq!(gpu.query(s), 0);
}

/// A CPU access to pinned memory a copy has yet to write names the copy's stream as it was
/// when the copy was queued, even once the stream is destroyed (its work runs on).
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_guard_hazard_names_the_stream_the_copy_was_on(driver: Driver) {
    let gpu = Gpu::new(driver);
    let s = gpu.stream(NON_BLOCKING);
    let d = gpu.malloc(4096);
    let pinned = gpu.host_alloc(4096);
    gpu.c().launch(s, d, 4096).unwrap();
    assert_eq!(gpu.dtoh_async(pinned, d, 4096, s), 0);
    gpu.destroy_stream(s);
    // SAFETY: pinned memory the driver gave; the guard catches the early read.
    let _ = unsafe { std::ptr::read_volatile(pinned) };
    let log = gpu.c().hazard_log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0].contains(&format!("stream {s:#x}")) && !log[0].contains("destroyed"),
        "{log:?}"
    );
    gpu.c().finish_all();
    assert_eq!(gpu.host_free(pinned), 0);
}

/// The patience counts each stream and event on its own, for the work it waits for: polling
/// two in turn ends, and work completed another way starts the count again.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn polling_counts_each_stream_for_its_own_work(driver: Driver) {
    let gpu = Gpu::new(driver);
    let (a, b) = (gpu.stream(NON_BLOCKING), gpu.stream(NON_BLOCKING));
    let d = gpu.malloc(4096);
    gpu.c().launch(a, d, 16).unwrap();
    gpu.c().launch(b, d, 16).unwrap();
    let mut rounds = 0;
    while gpu.query(a) == NOT_READY || gpu.query(b) == NOT_READY {
        rounds += 1;
        assert!(rounds < 2000, "polling two streams in turn never ends");
    }
    // 999 "not ready", then a synchronisation: new work starts a count of its own.
    gpu.c().launch(a, d, 16).unwrap();
    for _ in 0..999 {
        assert_eq!(gpu.query(a), NOT_READY);
    }
    gpu.c().finish_all();
    let kernel = gpu.c().launch(a, d, 16).unwrap();
    assert_eq!(gpu.query(a), NOT_READY);
    assert!(!gpu.c().done(kernel));
    gpu.c().finish(kernel);
}
