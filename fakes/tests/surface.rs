//! The rest of the vendors' common surface, as a library calls it: context and device state
//! (limits, preferences, flags, reset, ids, PCI bus ids, peer attributes), pitched memory
//! and 2D copies and memsets, peer copies, managed-memory advice and prefetch, module globals
//! (from PTX, an ELF object, a fatbin, an offload bundle), function attributes, occupancy and
//! cooperative launches. Each test runs the same story through CUDA's calls and HIP's where
//! both vendors have it.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use portalloc_fakes::{Driver, Vendor};
use test_case::test_case;

mod gpu;
use gpu::{
    elf, fatbin, offload_bundle, Fake, Gpu, CUDA12, EM_AMDGPU, EM_CUDA, HIP, NON_BLOCKING, R,
    STB_GLOBAL, STB_LOCAL, STT_FUNC, STT_OBJECT,
};

const INVALID_VALUE: R = 1;
const INVALID_DEVICE: R = 101;
const INVALID_HANDLE: R = 400;
const NOT_FOUND: R = 500;
const UNSUPPORTED_LIMIT: R = 215;
const COOPERATIVE_LAUNCH_TOO_LARGE: R = 720;
const CONTEXT_IS_DESTROYED: R = 709;
const NO_BINARY_FOR_GPU: R = 209;
const INVALID_PTX: R = 218;
const INVALID_IMAGE: R = 200;

type Launch = unsafe extern "C" fn(
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
) -> R;

impl Gpu {
    fn vendor(&self) -> Vendor {
        self.fake.vendor
    }

    /// A module from `image` (NUL-terminated text, or binary bytes), or the driver's code.
    fn load(&self, image: &[u8]) -> Result<u64, R> {
        let f = call!(
            self,
            "cuModuleLoadData",
            "hipModuleLoadData",
            unsafe extern "C" fn(*mut u64, *const u8) -> R
        );
        let mut m = 0;
        // SAFETY: the image outlives the call; one handle written.
        match unsafe { f(&mut m, image.as_ptr()) } {
            0 => Ok(m),
            e => Err(e),
        }
    }

    fn function(&self, module: u64, name: &CStr) -> Result<u64, R> {
        let f = call!(
            self,
            "cuModuleGetFunction",
            "hipModuleGetFunction",
            unsafe extern "C" fn(*mut u64, u64, *const c_char) -> R
        );
        let mut h = 0;
        // SAFETY: one handle written; a NUL-terminated name.
        match unsafe { f(&mut h, module, name.as_ptr()) } {
            0 => Ok(h),
            e => Err(e),
        }
    }

    fn global(&self, module: u64, name: &CStr) -> Result<(u64, usize), R> {
        let f = call!(
            self,
            "cuModuleGetGlobal_v2",
            "hipModuleGetGlobal",
            unsafe extern "C" fn(*mut u64, *mut usize, u64, *const c_char) -> R
        );
        let (mut p, mut n) = (0, 0);
        // SAFETY: two values written; a NUL-terminated name.
        match unsafe { f(&mut p, &mut n, module, name.as_ptr()) } {
            0 => Ok((p, n)),
            e => Err(e),
        }
    }

    fn unload(&self, module: u64) -> R {
        let f = call!(
            self,
            "cuModuleUnload",
            "hipModuleUnload",
            unsafe extern "C" fn(u64) -> R
        );
        // SAFETY: the driver checks the handle.
        unsafe { f(module) }
    }

    /// A launch of `f` with no parameters: `grid` blocks of `block` threads, `shared` bytes of
    /// dynamic shared memory; cooperative through the vendor's cooperative call.
    fn launch(&self, f: u64, grid: c_uint, block: c_uint, shared: c_uint, cooperative: bool) -> R {
        if !cooperative {
            let launch: Launch = call!(self, "cuLaunchKernel", "hipModuleLaunchKernel", Launch);
            // SAFETY: a function handle the driver checks; no parameters.
            return unsafe {
                launch(
                    f,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    shared,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
        match self.vendor() {
            Vendor::Cuda => {
                let coop: unsafe extern "C" fn(
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
                ) -> R = self.fake.sym("cuLaunchCooperativeKernel");
                // SAFETY: as above.
                unsafe { coop(f, grid, 1, 1, block, 1, 1, shared, 0, std::ptr::null_mut()) }
            }
            Vendor::Hip => {
                let coop: unsafe extern "C" fn(
                    u64,
                    [c_uint; 3],
                    [c_uint; 3],
                    *mut *mut c_void,
                    c_uint,
                    u64,
                ) -> R = self.fake.sym("hipLaunchCooperativeKernel");
                // SAFETY: as above; dim3 is three unsigned ints.
                unsafe {
                    coop(
                        f,
                        [grid, 1, 1],
                        [block, 1, 1],
                        std::ptr::null_mut(),
                        shared,
                        0,
                    )
                }
            }
        }
    }

    fn function_attribute(&self, f: u64, attribute: c_int) -> Result<c_int, R> {
        let get = call!(
            self,
            "cuFuncGetAttribute",
            "hipFuncGetAttribute",
            unsafe extern "C" fn(*mut c_int, c_int, u64) -> R
        );
        let mut v = -7;
        // SAFETY: one value written.
        match unsafe { get(&mut v, attribute, f) } {
            0 => Ok(v),
            e => Err(e),
        }
    }

    fn set_function_attribute(&self, f: u64, attribute: c_int, value: c_int) -> R {
        let set = call!(
            self,
            "cuFuncSetAttribute",
            "hipFuncSetAttribute",
            unsafe extern "C" fn(u64, c_int, c_int) -> R
        );
        // SAFETY: the driver checks the handle.
        unsafe { set(f, attribute, value) }
    }

    fn htod(&self, dst: u64, src: &[u8]) {
        let f = call!(
            self,
            "cuMemcpyHtoD_v2",
            "hipMemcpyHtoD",
            unsafe extern "C" fn(u64, *const u8, usize) -> R
        );
        // SAFETY: the driver checks the device range; the host one is `src`.
        assert_eq!(unsafe { f(dst, src.as_ptr(), src.len()) }, 0);
    }

    fn read(&self, src: u64, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        assert_eq!(self.dtoh(out.as_mut_ptr(), src, n), 0);
        out
    }

    fn managed(&self, n: usize) -> u64 {
        let f = call!(
            self,
            "cuMemAllocManaged",
            "hipMallocManaged",
            unsafe extern "C" fn(*mut u64, usize, c_uint) -> R
        );
        let mut p = 0;
        // SAFETY: one pointer written; hipMemAttachGlobal / CU_MEM_ATTACH_GLOBAL.
        assert_eq!(unsafe { f(&mut p, n, 1) }, 0);
        p
    }

    /// Makes `device` current on the calling thread (CUDA: its primary context).
    fn select(&self, device: c_int) {
        match self.vendor() {
            Vendor::Cuda => {
                let ctx = self.cuda_context(device);
                let set: unsafe extern "C" fn(u64) -> R = self.fake.sym("cuCtxSetCurrent");
                // SAFETY: a retained context.
                assert_eq!(unsafe { set(ctx) }, 0);
            }
            Vendor::Hip => {
                let set: unsafe extern "C" fn(c_int) -> R = self.fake.sym("hipSetDevice");
                // SAFETY: a device that exists.
                assert_eq!(unsafe { set(device) }, 0);
            }
        }
    }

    fn cuda_context(&self, device: c_int) -> u64 {
        let retain: unsafe extern "C" fn(*mut u64, c_int) -> R =
            self.fake.sym("cuDevicePrimaryCtxRetain");
        let mut ctx = 0;
        // SAFETY: one handle written.
        assert_eq!(unsafe { retain(&mut ctx, device) }, 0);
        ctx
    }
}

/// A driver with `n` devices (set before the first call initialises it).
fn with_devices(driver: Driver, n: c_int) -> Gpu {
    let fake = Fake::new(driver);
    // SAFETY: the controls' signatures; before any vendor call.
    unsafe {
        match fake.vendor {
            Vendor::Cuda => {
                let configure: unsafe extern "C" fn(c_int, u64, u64, c_int) -> c_int =
                    fake.sym("fakecuda_configure");
                assert_eq!(configure(n, 0, 0, 0), 0);
            }
            Vendor::Hip => {
                let set: unsafe extern "C" fn(c_int, u64) = fake.sym("fakehip_set_devices");
                set(n, 192 << 30);
            }
        }
    }
    let gpu = Gpu { fake };
    gpu.current();
    gpu
}

// ---- contexts and devices ------------------------------------------------------------------------

/// cuCtxGetLimit / cuCtxSetLimit keep what is asked within what the device allows; setting
/// the stack size waits for the device (cuda.h: "the device will block until all preceding
/// requested tasks are complete").
#[test]
fn cuda_limits_are_kept_clamped_and_refused_as_documented() {
    let gpu = Gpu::new(CUDA12);
    let get: unsafe extern "C" fn(*mut usize, c_uint) -> R = gpu.fake.sym("cuCtxGetLimit");
    let set: unsafe extern "C" fn(c_uint, usize) -> R = gpu.fake.sym("cuCtxSetLimit");
    let limit = |l: c_uint| {
        let mut v = 0;
        // SAFETY: one value written.
        match unsafe { get(&mut v, l) } {
            0 => Ok(v),
            e => Err(e),
        }
    };
    assert_eq!(
        [0, 1, 2, 3, 4].map(|l| limit(l).unwrap()),
        [1024, 1 << 20, 8 << 20, 2, 2048]
    );
    let p = gpu.malloc(4096);
    let kernel = gpu.c().launch(0, p, 4096).unwrap();
    let waits = gpu.c().cpu_waits();
    // SAFETY: the vendor's signature.
    unsafe {
        assert_eq!(set(0, 4096), 0);
        assert_eq!(set(5, 1000), 0, "the L2 fetch hint");
        assert_eq!(set(3, 4), UNSUPPORTED_LIMIT, "sync depth on compute 9.0");
        assert_eq!(set(10, 1), INVALID_VALUE, "CU_LIMIT_MAX");
    }
    assert!(gpu.c().done(kernel), "the stack size waits for the device");
    assert_eq!(gpu.c().cpu_waits(), waits + 1);
    assert_eq!(
        (limit(0), limit(5), limit(7)),
        (Ok(4096), Ok(128), Err(UNSUPPORTED_LIMIT))
    );

    let old = Gpu::new(Driver::FAKECUDA_OLD);
    let get_old: unsafe extern "C" fn(*mut usize, c_uint) -> R = old.fake.sym("cuCtxGetLimit");
    let mut v = 0;
    // SAFETY: as above.
    assert_eq!(
        unsafe { get_old(&mut v, 6) },
        UNSUPPORTED_LIMIT,
        "persisting L2 came with CUDA 11"
    );
}

/// hipDeviceGetLimit / hipDeviceSetLimit as clr: stack and heap only, the stack rounded up to
/// 16 bytes and at most 128 KiB - 16, the heap below the device's memory; the cache and bank
/// preferences are checked and ignored.
#[test]
fn hip_limits_and_preferences_are_those_of_clr() {
    let gpu = Gpu::new(HIP);
    let get: unsafe extern "C" fn(*mut usize, c_int) -> R = gpu.fake.sym("hipDeviceGetLimit");
    let set: unsafe extern "C" fn(c_int, usize) -> R = gpu.fake.sym("hipDeviceSetLimit");
    let set_cache: unsafe extern "C" fn(c_int) -> R = gpu.fake.sym("hipDeviceSetCacheConfig");
    let get_cache: unsafe extern "C" fn(*mut c_int) -> R = gpu.fake.sym("hipDeviceGetCacheConfig");
    let (mut stack, mut heap, mut cache) = (0usize, 0usize, -1);
    // SAFETY: the vendor's signatures; values written.
    unsafe {
        assert_eq!((get(&mut stack, 0), get(&mut heap, 2)), (0, 0));
        assert_eq!((stack, heap), (1024, 8 << 20));
        assert_eq!(get(&mut stack, 1), UNSUPPORTED_LIMIT, "printf FIFO");
        assert_eq!(set(0, 1000), 0);
        assert_eq!(get(&mut stack, 0), 0);
        assert_eq!(stack, 1008);
        assert_eq!(set(0, 128 << 10), INVALID_VALUE);
        assert_eq!(
            set(2, 300 << 30),
            INVALID_VALUE,
            "more heap than the device has"
        );
        assert_eq!(set_cache(2), 0);
        assert_eq!(set_cache(4), INVALID_VALUE);
        assert_eq!(get_cache(&mut cache), 0);
    }
    assert_eq!(cache, 0, "hipFuncCachePreferNone, whatever was set");
}

/// Cache and bank preferences: CUDA keeps them per context.
#[test]
fn cuda_keeps_cache_and_bank_preferences() {
    let gpu = Gpu::new(CUDA12);
    let set: unsafe extern "C" fn(c_int) -> R = gpu.fake.sym("cuCtxSetCacheConfig");
    let get: unsafe extern "C" fn(*mut c_int) -> R = gpu.fake.sym("cuCtxGetCacheConfig");
    let set_bank: unsafe extern "C" fn(c_int) -> R = gpu.fake.sym("cuCtxSetSharedMemConfig");
    let get_bank: unsafe extern "C" fn(*mut c_int) -> R = gpu.fake.sym("cuCtxGetSharedMemConfig");
    let (mut cache, mut bank) = (-1, -1);
    // SAFETY: the vendor's signatures.
    unsafe {
        assert_eq!(
            (set(2), set(4), set_bank(2), set_bank(3)),
            (0, INVALID_VALUE, 0, INVALID_VALUE)
        );
        assert_eq!((get(&mut cache), get_bank(&mut bank)), (0, 0));
    }
    assert_eq!((cache, bank), (2, 2));
}

/// A reset destroys what the device held — memory, streams, work in flight (completed
/// first) — and starts the state over: CUDA's primary context becomes a new context (a new
/// id) with its retain count kept; HIP's device flags are clr's default again.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_reset_gives_everything_back_and_starts_over(driver: Driver) {
    let gpu = Gpu::new(driver);
    let p = gpu.malloc(1 << 20);
    let s = gpu.stream(NON_BLOCKING);
    let kernel = gpu.c().launch(s, p, 1 << 20).unwrap();
    let before = gpu.c().census();
    assert_eq!((before.allocations, before.streams), (1, 1));
    let id = |gpu: &Gpu| -> u64 {
        let get: unsafe extern "C" fn(u64, *mut u64) -> R = gpu.fake.sym("cuCtxGetId");
        let mut id = 0;
        // SAFETY: NULL: the current context.
        assert_eq!(unsafe { get(0, &mut id) }, 0);
        id
    };
    let mut flags = 0u32;
    match driver.vendor {
        Vendor::Cuda => {
            let first = id(&gpu);
            let set_flags: unsafe extern "C" fn(c_int, c_uint) -> R =
                gpu.fake.sym("cuDevicePrimaryCtxSetFlags");
            let set_flags_v2: unsafe extern "C" fn(c_int, c_uint) -> R =
                gpu.fake.sym("cuDevicePrimaryCtxSetFlags_v2");
            let reset: unsafe extern "C" fn(c_int) -> R =
                gpu.fake.sym("cuDevicePrimaryCtxReset_v2");
            let ctx_flags: unsafe extern "C" fn(*mut c_uint) -> R = gpu.fake.sym("cuCtxGetFlags");
            // SAFETY: the vendor's signatures.
            unsafe {
                assert_eq!(
                    set_flags(0, 4),
                    708,
                    "v1: not while the primary context is active"
                );
                assert_eq!(set_flags_v2(0, 3), INVALID_VALUE, "two scheduling flags");
                assert_eq!(set_flags_v2(0, 4), 0);
                assert_eq!(ctx_flags(&mut flags), 0);
                assert_eq!(flags, 4);
                assert_eq!(reset(0), 0);
                assert_eq!(ctx_flags(&mut flags), 0);
            }
            assert_ne!(id(&gpu), first, "a reset context is a new context");
            assert_eq!(flags, 0);
        }
        Vendor::Hip => {
            let set: unsafe extern "C" fn(c_uint) -> R = gpu.fake.sym("hipSetDeviceFlags");
            let get: unsafe extern "C" fn(*mut c_uint) -> R = gpu.fake.sym("hipGetDeviceFlags");
            let reset: unsafe extern "C" fn() -> R = gpu.fake.sym("hipDeviceReset");
            // SAFETY: the vendor's signatures.
            unsafe {
                assert_eq!(set(3), INVALID_VALUE, "two scheduling flags");
                assert_eq!(set(4 | 8), 0);
                assert_eq!(get(&mut flags), 0);
                assert_eq!(flags, 4, "clr keeps the scheduling flag only");
                assert_eq!(reset(), 0);
                assert_eq!(get(&mut flags), 0);
            }
            assert_eq!(flags, 1, "hipDeviceScheduleSpin");
        }
    }
    assert!(gpu.c().done(kernel), "the work completed first");
    let after = gpu.c().census();
    assert_eq!((after.allocations, after.streams, after.bytes), (0, 0, 0));
    // The stream is gone: CUDA's invalid handle; clr's hipErrorContextIsDestroyed.
    let gone = match gpu.vendor() {
        Vendor::Cuda => INVALID_HANDLE,
        Vendor::Hip => CONTEXT_IS_DESTROYED,
    };
    assert_eq!(gpu.query(s), gone);
    assert_eq!(gpu.c().hazards(), 0, "the reset waited for the kernel");
    // The device works on after it.
    let q = gpu.malloc(4096);
    assert_eq!(gpu.free(q), 0);
}

/// Context and stream ids are unique for the process's life: a destroyed stream's handle
/// value comes back, its id does not.
#[test]
fn cuda_ids_name_one_context_and_one_stream_each() {
    let gpu = Gpu::new(CUDA12);
    let stream_id: unsafe extern "C" fn(u64, *mut u64) -> R = gpu.fake.sym("cuStreamGetId");
    let sid = |s: u64| {
        let mut id = 0;
        // SAFETY: one value written.
        assert_eq!(unsafe { stream_id(s, &mut id) }, 0);
        id
    };
    let a = gpu.stream(0);
    let first = sid(a);
    gpu.destroy_stream(a);
    let b = gpu.stream(0);
    assert_eq!(a, b, "the handle value comes back");
    assert_ne!(sid(b), first, "with a new id");
    assert_ne!(sid(0), sid(b));
    let create: unsafe extern "C" fn(*mut u64, c_uint, c_int) -> R = gpu.fake.sym("cuCtxCreate_v2");
    let ctx_id: unsafe extern "C" fn(u64, *mut u64) -> R = gpu.fake.sym("cuCtxGetId");
    let (mut created, mut one, mut two) = (0, 0, 0);
    let primary = gpu.cuda_context(0);
    // SAFETY: the vendor's signatures.
    unsafe {
        assert_eq!(create(&mut created, 0, 0), 0);
        assert_eq!(
            (ctx_id(created, &mut one), ctx_id(primary, &mut two)),
            (0, 0)
        );
    }
    assert_ne!(one, two);
    let record: unsafe extern "C" fn(u64, u64, c_uint) -> R =
        gpu.fake.sym("cuEventRecordWithFlags");
    let e = gpu.event();
    // SAFETY: live handles.
    unsafe {
        assert_eq!(
            record(e, 0, 1),
            0,
            "CU_EVENT_RECORD_EXTERNAL outside a capture"
        );
        assert_eq!(record(e, 0, 2), INVALID_VALUE);
    }
}

/// A PCI bus id names its device back; an id no device has is an invalid device, text that
/// is no id an invalid value. Peer attributes say what the link allows, and refuse a device
/// paired with itself.
#[test_case(CUDA12, 0 ; "cuda")]
#[test_case(HIP, 0 ; "hip")]
#[test_case(Driver::FAKECUDA_NOPEER, 1 ; "cuda without peer links")]
fn pci_bus_ids_and_peer_attributes(driver: Driver, no_peer: c_int) {
    let gpu = with_devices(driver, 2);
    let id_of = call!(
        gpu,
        "cuDeviceGetPCIBusId",
        "hipDeviceGetPCIBusId",
        unsafe extern "C" fn(*mut c_char, c_int, c_int) -> R
    );
    let by_id = call!(
        gpu,
        "cuDeviceGetByPCIBusId",
        "hipDeviceGetByPCIBusId",
        unsafe extern "C" fn(*mut c_int, *const c_char) -> R
    );
    let p2p = call!(
        gpu,
        "cuDeviceGetP2PAttribute",
        "hipDeviceGetP2PAttribute",
        unsafe extern "C" fn(*mut c_int, c_int, c_int, c_int) -> R
    );
    // CUDA numbers the access attribute 2, HIP 1.
    let access = match gpu.vendor() {
        Vendor::Cuda => 2,
        Vendor::Hip => 1,
    };
    for device in 0..2 {
        let mut text = [0 as c_char; 32];
        let mut back = -1;
        // SAFETY: 32 bytes; one value written.
        unsafe {
            assert_eq!(id_of(text.as_mut_ptr(), 32, device), 0);
            assert_eq!(by_id(&mut back, text.as_ptr()), 0);
        }
        assert_eq!(back, device);
    }
    let (mut back, mut value) = (-1, -1);
    // SAFETY: as above.
    unsafe {
        assert_eq!(by_id(&mut back, c"0000:ff:1f.0".as_ptr()), INVALID_DEVICE);
        assert_eq!(by_id(&mut back, c"not a bus id".as_ptr()), INVALID_VALUE);
        assert_eq!(p2p(&mut value, access, 0, 0), INVALID_DEVICE);
        assert_eq!(p2p(&mut value, access, 0, 1), 0);
        assert_eq!(value, 1 - no_peer);
        assert_eq!(p2p(&mut value, 99, 0, 1), INVALID_VALUE);
    }
}

/// A CUDA 10.1 driver lacks the calls that came later (a library probing for them finds
/// them missing, as on such a driver).
#[test_case("cuCtxGetId")]
#[test_case("cuStreamGetId")]
#[test_case("cuCtxSetFlags")]
#[test_case("cuMemPrefetchAsync_v2")]
#[test_case("cuEventRecordWithFlags")]
#[test_case("cuDevicePrimaryCtxRelease_v2")]
#[test_case("cuFuncGetModule")]
#[test_case("cuGetProcAddress")]
fn an_old_driver_lacks_the_newer_calls(name: &str) {
    let old = Fake::new(Driver::FAKECUDA_OLD);
    // SAFETY: only looked up, never called.
    assert!(unsafe { old.lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err());
    assert!(!old.controls.exports().iter().any(|e| e == name));
    let new = Fake::new(CUDA12);
    assert!(new.controls.exports().iter().any(|e| e == name));
}

// ---- pitched memory, 2D copies and memsets -------------------------------------------------------

/// `CUDA_MEMCPY2D` as cuda.h lays it out.
#[repr(C)]
#[derive(Default)]
struct Memcpy2D {
    src_x: usize,
    src_y: usize,
    src_type: c_uint,
    src_host: usize,
    src_device: u64,
    src_array: usize,
    src_pitch: usize,
    dst_x: usize,
    dst_y: usize,
    dst_type: c_uint,
    dst_host: usize,
    dst_device: u64,
    dst_array: usize,
    dst_pitch: usize,
    width: usize,
    height: usize,
}

/// The rows of a 2D copy: `height` rows of `width` bytes, `spitch` apart from `src`,
/// `dpitch` apart at `dst`.
struct Rows {
    dst: u64,
    dpitch: usize,
    src: u64,
    spitch: usize,
    width: usize,
    height: usize,
}

/// A 2D copy through the vendor's call (`to_device`: host to device, else device to host).
fn copy_2d(gpu: &Gpu, rows: Rows, to_device: bool) -> R {
    let Rows {
        dst,
        dpitch,
        src,
        spitch,
        width,
        height,
    } = rows;
    match gpu.vendor() {
        Vendor::Cuda => {
            let f: unsafe extern "C" fn(*const Memcpy2D) -> R = gpu.fake.sym("cuMemcpy2D_v2");
            let (host, device) = (1, 2);
            let c = Memcpy2D {
                src_type: if to_device { host } else { device },
                src_host: src as usize,
                src_device: src,
                src_pitch: spitch,
                dst_type: if to_device { device } else { host },
                dst_host: dst as usize,
                dst_device: dst,
                dst_pitch: dpitch,
                width,
                height,
                ..Memcpy2D::default()
            };
            // SAFETY: the driver checks both sides.
            unsafe { f(&c) }
        }
        Vendor::Hip => {
            let f: unsafe extern "C" fn(u64, usize, u64, usize, usize, usize, c_int) -> R =
                gpu.fake.sym("hipMemcpy2D");
            // SAFETY: as above; hipMemcpyHostToDevice 1, DeviceToHost 2.
            unsafe {
                f(
                    dst,
                    dpitch,
                    src,
                    spitch,
                    width,
                    height,
                    if to_device { 1 } else { 2 },
                )
            }
        }
    }
}

/// Pitched memory's rows are rounded up to the vendor's alignment (512 bytes CUDA, 256 HIP);
/// a 2D copy moves each row to its pitch, a 2D memset sets each row and not the padding, and a
/// pitch smaller than the width is refused (HIP: hipErrorInvalidPitchValue).
#[test_case(CUDA12, 512, INVALID_VALUE ; "cuda")]
#[test_case(HIP, 256, 12 ; "hip")]
fn pitched_rows_move_and_fill_row_by_row(driver: Driver, align: usize, bad_pitch: R) {
    let gpu = Gpu::new(driver);
    let (width, height) = (100usize, 4usize);
    let (mut p, mut pitch) = (0u64, 0usize);
    // SAFETY: two values written.
    let rc = unsafe {
        match gpu.vendor() {
            Vendor::Cuda => {
                let f: unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> R =
                    gpu.fake.sym("cuMemAllocPitch_v2");
                assert_eq!(
                    f(&mut p, &mut pitch, width, height, 3),
                    INVALID_VALUE,
                    "element size 3"
                );
                f(&mut p, &mut pitch, width, height, 4)
            }
            Vendor::Hip => {
                let f: unsafe extern "C" fn(*mut u64, *mut usize, usize, usize) -> R =
                    gpu.fake.sym("hipMallocPitch");
                f(&mut p, &mut pitch, width, height)
            }
        }
    };
    assert_eq!((rc, pitch), (0, align));
    // Zero the whole allocation, then copy rows in.
    let zero = vec![0u8; pitch * height];
    gpu.htod(p, &zero);
    let rows: Vec<u8> = (0..width * height).map(|i| (i / width + 1) as u8).collect();
    assert_eq!(
        copy_2d(
            &gpu,
            Rows {
                dst: p,
                dpitch: pitch,
                src: rows.as_ptr() as u64,
                spitch: width,
                width,
                height
            },
            true
        ),
        0
    );
    let device = gpu.read(p, pitch * height);
    for r in 0..height {
        assert!(
            device[r * pitch..r * pitch + width]
                .iter()
                .all(|&b| b == r as u8 + 1),
            "row {r}"
        );
        assert!(
            device[r * pitch + width..(r + 1) * pitch]
                .iter()
                .all(|&b| b == 0),
            "padding {r}"
        );
    }
    // A 2D memset of 10 bytes at column 20 of every row.
    let status = match gpu.vendor() {
        Vendor::Cuda => {
            let f: unsafe extern "C" fn(u64, usize, u8, usize, usize) -> R =
                gpu.fake.sym("cuMemsetD2D8_v2");
            // SAFETY: the driver checks the range.
            let rc = unsafe { f(p + 20, pitch, 0xee, 10, height) };
            gpu.sync(0);
            rc
        }
        Vendor::Hip => {
            let f: unsafe extern "C" fn(u64, usize, c_int, usize, usize) -> R =
                gpu.fake.sym("hipMemset2D");
            // SAFETY: as above.
            unsafe { f(p + 20, pitch, 0xee, 10, height) }
        }
    };
    assert_eq!(status, 0);
    let mut back = vec![0u8; width * height];
    assert_eq!(
        copy_2d(
            &gpu,
            Rows {
                dst: back.as_mut_ptr() as u64,
                dpitch: width,
                src: p,
                spitch: pitch,
                width,
                height
            },
            false
        ),
        0
    );
    for r in 0..height {
        let row = &back[r * width..(r + 1) * width];
        assert!(
            row[..20]
                .iter()
                .chain(&row[30..])
                .all(|&b| b == r as u8 + 1),
            "row {r}"
        );
        assert!(row[20..30].iter().all(|&b| b == 0xee), "row {r}");
    }
    assert_eq!(
        copy_2d(
            &gpu,
            Rows {
                dst: p,
                dpitch: width - 1,
                src: rows.as_ptr() as u64,
                spitch: width,
                width,
                height
            },
            true
        ),
        bad_pitch
    );
    assert_eq!(gpu.c().hazards(), 0);
    assert_eq!(gpu.free(p), 0);
}

/// An async 2D copy over rows a kernel writes on another stream is a race; ordered after it
/// by an event, it is not.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn an_async_2d_copy_races_like_any_copy(driver: Driver) {
    let gpu = Gpu::new(driver);
    let (a, b) = (gpu.stream(NON_BLOCKING), gpu.stream(NON_BLOCKING));
    let p = gpu.malloc(1 << 16);
    let host = gpu.host_alloc(4096);
    let copy = |s: u64| -> R {
        match gpu.vendor() {
            Vendor::Cuda => {
                let f: unsafe extern "C" fn(*const Memcpy2D, u64) -> R =
                    gpu.fake.sym("cuMemcpy2DAsync_v2");
                let c = Memcpy2D {
                    src_type: 1,
                    src_host: host as usize,
                    src_pitch: 64,
                    dst_type: 2,
                    dst_device: p,
                    dst_pitch: 1024,
                    width: 64,
                    height: 8,
                    ..Memcpy2D::default()
                };
                // SAFETY: pinned source, device destination.
                unsafe { f(&c, s) }
            }
            Vendor::Hip => {
                let f: unsafe extern "C" fn(u64, usize, u64, usize, usize, usize, c_int, u64) -> R =
                    gpu.fake.sym("hipMemcpy2DAsync");
                // SAFETY: as above.
                unsafe { f(p, 1024, host as u64, 64, 64, 8, 1, s) }
            }
        }
    };
    // The kernel writes row 5 only; the copy's rows span it.
    gpu.c().launch_writing(a, p + 5 * 1024, 16).unwrap();
    assert_eq!(copy(b), 0);
    assert_eq!(gpu.c().hazards(), 1, "{:?}", gpu.c().hazard_log());
    gpu.c().finish_all();
    gpu.c().launch_writing(a, p + 5 * 1024, 16).unwrap();
    let e = gpu.event();
    gpu.record(e, a);
    gpu.wait(b, e);
    assert_eq!(copy(b), 0);
    assert_eq!(gpu.c().hazards(), 1, "ordered by the event: no new hazard");
    gpu.c().finish_all();
    gpu.sync(b);
    assert_eq!(gpu.host_free(host), 0);
    assert_eq!(gpu.free(p), 0);
}

// ---- peer copies -----------------------------------------------------------------------------------

/// A peer copy moves bytes between two devices' memory, each side on the device named; a
/// side on the wrong device is an invalid value. The async form is ordered on its stream
/// only: over memory a kernel on the other device still writes, it races.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn peer_copies_move_between_devices(driver: Driver) {
    let gpu = with_devices(driver, 2);
    let on = |device: c_int, n: usize| -> u64 {
        gpu.select(device);
        gpu.malloc(n)
    };
    let src = on(1, 4096);
    let peer_stream = gpu.stream(NON_BLOCKING);
    let dst = on(0, 4096);
    gpu.htod(dst, &[0u8; 4096]);
    // Fill the source from device 1's side.
    gpu.htod(src, &[7u8; 4096]);
    let (ctx0, ctx1) = match gpu.vendor() {
        Vendor::Cuda => (gpu.cuda_context(0), gpu.cuda_context(1)),
        Vendor::Hip => (0, 1),
    };
    let peer = |d: u64, dd: u64, s: u64, sd: u64, n: usize, stream: Option<u64>| -> R {
        // SAFETY: the driver checks both sides and the stream.
        unsafe {
            match (gpu.vendor(), stream) {
                (Vendor::Cuda, None) => {
                    let f: unsafe extern "C" fn(u64, u64, u64, u64, usize) -> R =
                        gpu.fake.sym("cuMemcpyPeer");
                    f(d, dd, s, sd, n)
                }
                (Vendor::Cuda, Some(st)) => {
                    let f: unsafe extern "C" fn(u64, u64, u64, u64, usize, u64) -> R =
                        gpu.fake.sym("cuMemcpyPeerAsync");
                    f(d, dd, s, sd, n, st)
                }
                (Vendor::Hip, None) => {
                    let f: unsafe extern "C" fn(u64, c_int, u64, c_int, usize) -> R =
                        gpu.fake.sym("hipMemcpyPeer");
                    f(d, dd as c_int, s, sd as c_int, n)
                }
                (Vendor::Hip, Some(st)) => {
                    let f: unsafe extern "C" fn(u64, c_int, u64, c_int, usize, u64) -> R =
                        gpu.fake.sym("hipMemcpyPeerAsync");
                    f(d, dd as c_int, s, sd as c_int, n, st)
                }
            }
        }
    };
    assert_eq!(peer(dst, ctx0, src, ctx1, 4096, None), 0);
    gpu.sync(0);
    assert_eq!(gpu.read(dst, 4096), vec![7u8; 4096]);
    assert_eq!(
        peer(dst, ctx1, src, ctx1, 4096, None),
        INVALID_VALUE,
        "dst is device 0's"
    );
    // A kernel on device 1 writes the source; an async peer copy on a device-0 stream is not
    // ordered after it.
    let kernel = gpu.c().launch_writing(peer_stream, src, 4096).unwrap();
    let s0 = gpu.stream(NON_BLOCKING);
    assert_eq!(peer(dst, ctx0, src, ctx1, 4096, Some(s0)), 0);
    assert_eq!(gpu.c().hazards(), 1, "{:?}", gpu.c().hazard_log());
    gpu.c().finish(kernel);
    gpu.sync(s0);
    assert_eq!(gpu.free(dst), 0);
}

// ---- managed memory ----------------------------------------------------------------------------------

/// Advice and prefetches over managed memory are what the range attributes report: read
/// mostly, the preferred location, who accesses it (the rest of the list "invalid"), the last
/// prefetch location — at once, before the prefetch's stream reaches it.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn managed_memory_advice_is_what_its_range_reports(driver: Driver) {
    let gpu = Gpu::new(driver);
    let p = gpu.managed(1 << 20);
    let advise = call!(
        gpu,
        "cuMemAdvise",
        "hipMemAdvise",
        unsafe extern "C" fn(u64, usize, c_int, c_int) -> R
    );
    let prefetch = call!(
        gpu,
        "cuMemPrefetchAsync",
        "hipMemPrefetchAsync",
        unsafe extern "C" fn(u64, usize, c_int, u64) -> R
    );
    let attribute = call!(
        gpu,
        "cuMemRangeGetAttribute",
        "hipMemRangeGetAttribute",
        unsafe extern "C" fn(*mut c_int, usize, c_int, u64, usize) -> R
    );
    let get = |attr: c_int, n: usize| -> Vec<c_int> {
        let mut out = vec![99; n];
        // SAFETY: `n` ints.
        assert_eq!(
            unsafe { attribute(out.as_mut_ptr(), 4 * n, attr, p, 4096) },
            0
        );
        out
    };
    let (cpu, invalid) = (-1, -2);
    assert_eq!(
        (get(1, 1), get(2, 1), get(4, 1)),
        (vec![0], vec![invalid], vec![invalid])
    );
    let s = gpu.stream(NON_BLOCKING);
    let kernel = gpu.c().launch(s, p, 4096).unwrap();
    // SAFETY: the vendor's signatures.
    unsafe {
        assert_eq!(advise(p, 1 << 20, 1, 0), 0);
        assert_eq!(advise(p, 4096, 3, 0), 0);
        assert_eq!(advise(p, 4096, 5, cpu), 0);
        assert_eq!(advise(p, 4096, 5, 0), 0);
        assert_eq!(
            advise(p, 2 << 20, 1, 0),
            INVALID_VALUE,
            "past the allocation"
        );
        assert_eq!(advise(p, 4096, 9, 0), INVALID_VALUE, "no such advice");
        assert_eq!(advise(p, 4096, 3, 7), INVALID_DEVICE);
        assert_eq!(prefetch(p, 4096, 0, s), 0);
    }
    assert_eq!(get(1, 1), vec![1]);
    assert_eq!(get(2, 1), vec![0]);
    assert_eq!(get(3, 3), vec![0, cpu, invalid]);
    assert_eq!(get(4, 1), vec![0], "the last prefetch, at once");
    assert!(!gpu.c().done(kernel));
    assert!(gpu.c().streams_ordered(s, s));
    gpu.c().finish(kernel);
    gpu.sync(s);
    assert_eq!(gpu.c().hazards(), 0);
    assert_eq!(gpu.free(p), 0);
}

/// CUDA's managed-memory calls refuse plain device memory; stream attachment is of a whole
/// allocation, and never singly to the NULL stream.
#[test]
fn cuda_managed_calls_take_managed_memory_only() {
    let gpu = Gpu::new(CUDA12);
    let plain = gpu.malloc(4096);
    let managed = gpu.managed(8192);
    let advise: unsafe extern "C" fn(u64, usize, c_int, c_int) -> R = gpu.fake.sym("cuMemAdvise");
    let attach: unsafe extern "C" fn(u64, u64, usize, c_uint) -> R =
        gpu.fake.sym("cuStreamAttachMemAsync");
    let s = gpu.stream(0);
    // SAFETY: the vendor's signatures.
    unsafe {
        assert_eq!(advise(plain, 4096, 1, 0), INVALID_VALUE);
        assert_eq!(
            attach(s, managed, 0, 4),
            0,
            "the whole allocation, singly, to a stream"
        );
        assert_eq!(attach(s, managed, 8192, 2), 0);
        assert_eq!(attach(s, managed, 4096, 1), INVALID_VALUE, "part of it");
        assert_eq!(
            attach(0, managed, 0, 4),
            INVALID_VALUE,
            "singly to the NULL stream"
        );
        assert_eq!(attach(s, plain, 0, 1), INVALID_VALUE);
    }
    gpu.sync(s);
}

/// cuPointerSetAttribute(SYNC_MEMOPS) makes the memory's synchronous copies synchronise: a
/// device-to-device cuMemcpy, which otherwise returns at once, waits for its stream.
#[test]
fn sync_memops_makes_a_device_to_device_copy_wait() {
    let gpu = Gpu::new(CUDA12);
    let (a, b) = (gpu.malloc(4096), gpu.malloc(4096));
    let dtod: unsafe extern "C" fn(u64, u64, usize) -> R = gpu.fake.sym("cuMemcpyDtoD_v2");
    let set: unsafe extern "C" fn(*const c_uint, c_int, u64) -> R =
        gpu.fake.sym("cuPointerSetAttribute");
    let get: unsafe extern "C" fn(*mut c_void, c_int, u64) -> R =
        gpu.fake.sym("cuPointerGetAttribute");
    let kernel = gpu.c().launch(0, a, 16).unwrap();
    let waits = gpu.c().cpu_waits();
    // SAFETY: the vendor's signatures.
    assert_eq!(unsafe { dtod(b, a, 4096) }, 0);
    assert_eq!(gpu.c().cpu_waits(), waits, "device to device does not wait");
    assert!(!gpu.c().done(kernel));
    gpu.c().finish(kernel);
    gpu.sync(0);
    let on: c_uint = 1;
    let mut flag: c_int = 0;
    // SAFETY: as above.
    unsafe {
        assert_eq!(set(&on, 6, b), 0);
        assert_eq!(set(&on, 1, b), INVALID_VALUE, "only SYNC_MEMOPS may be set");
        assert_eq!(get((&mut flag as *mut c_int).cast(), 6, b), 0);
    }
    assert_eq!(flag, 1);
    let kernel = gpu.c().launch(0, a, 16).unwrap();
    let waits = gpu.c().cpu_waits();
    // SAFETY: as above.
    assert_eq!(unsafe { dtod(b, a, 4096) }, 0);
    assert_eq!(gpu.c().cpu_waits(), waits + 1);
    assert!(
        gpu.c().done(kernel),
        "the copy waited for what its stream held"
    );
}

/// The flags a pinned allocation was made with; registered memory has none to give.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_pinned_allocation_tells_its_flags(driver: Driver) {
    let gpu = Gpu::new(driver);
    let alloc = call!(
        gpu,
        "cuMemHostAlloc",
        "hipHostMalloc",
        unsafe extern "C" fn(*mut *mut u8, usize, c_uint) -> R
    );
    let flags_of = call!(
        gpu,
        "cuMemHostGetFlags",
        "hipHostGetFlags",
        unsafe extern "C" fn(*mut c_uint, *mut u8) -> R
    );
    let (mut p, mut flags) = (std::ptr::null_mut(), 0);
    let mut mine = vec![0u8; 8192];
    // SAFETY: the vendor's signatures; `mine` outlives its registration.
    unsafe {
        assert_eq!(alloc(&mut p, 4096, 2), 0);
        assert_eq!(flags_of(&mut flags, p.add(100)), 0);
        assert_eq!(flags, 2, "DEVICEMAP / hipHostMallocMapped");
        assert_eq!(gpu.register(mine.as_mut_ptr(), mine.len()), 0);
        assert_eq!(flags_of(&mut flags, mine.as_mut_ptr()), INVALID_VALUE);
        assert_eq!(gpu.unregister(mine.as_mut_ptr()), 0);
    }
    assert_eq!(gpu.host_free(p), 0);
}

// ---- module globals -------------------------------------------------------------------------------

const PTX: &[u8] = b"
.version 7.8
.target sm_90
.address_size 64
.visible .global .align 4 .b8 table[64];
.const .align 4 .f32 factor;
.global .align 16 .v4 .f32 quads[2];
.extern .global .b8 elsewhere[];
.visible .entry scale(.param .u64 x)
{
    .reg .f32 %f<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [x];
    ld.global.f32 %f1, [%rd1];
    st.global.f32 [%rd1], %f1;
    ret;
}
\0";

/// The test module for the vendor: [`PTX`], or a code object with its kernel and globals.
fn kernels(gpu: &Gpu) -> Vec<u8> {
    gpu.image(
        PTX,
        &["scale"],
        &[("table", 64), ("factor", 4), ("quads", 32)],
    )
}

/// Globals are device memory of their declared size, charged while their module is loaded,
/// zeroed at load, gone with it: from PTX declarations (`.global`, `.const`, vectors and
/// arrays; not instructions, not `.extern`), and from the symbol table of an ELF object, a
/// fatbin or an offload bundle, which also names the functions there are.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn module_globals_are_device_memory_of_their_size(driver: Driver) {
    let gpu = Gpu::new(driver);
    let bytes = gpu.c().census().bytes;
    let m = gpu.load(&kernels(&gpu)).unwrap();
    assert_eq!(gpu.global(m, c"table").map(|g| g.1), Ok(64));
    assert_eq!(gpu.global(m, c"factor").map(|g| g.1), Ok(4));
    assert_eq!(gpu.global(m, c"quads").map(|g| g.1), Ok(32));
    for missing in [c"elsewhere", c"scale", c"f32", c"nothing"] {
        assert_eq!(gpu.global(m, missing), Err(NOT_FOUND), "{missing:?}");
    }
    assert_eq!(
        gpu.c().census().bytes,
        bytes + 3 * 256,
        "each charged, rounded to 256"
    );
    let (table, _) = gpu.global(m, c"table").unwrap();
    assert_eq!(gpu.read(table, 64), vec![0u8; 64]);
    gpu.htod(table, &[3u8; 64]);
    assert_eq!(gpu.read(table, 64), vec![3u8; 64]);
    assert_eq!(gpu.unload(m), 0);
    assert_eq!(gpu.c().census().bytes, bytes);
    // An unloaded module: CUDA's invalid handle; clr finds no such global.
    let gone = match gpu.vendor() {
        Vendor::Cuda => INVALID_HANDLE,
        Vendor::Hip => NOT_FOUND,
    };
    assert_eq!(gpu.global(m, c"table"), Err(gone));

    type Wrap = fn(&[u8]) -> Vec<u8>;
    let (machine, container): (u16, Wrap) = match gpu.vendor() {
        Vendor::Cuda => (EM_CUDA, fatbin),
        Vendor::Hip => (EM_AMDGPU, offload_bundle),
    };
    let object = elf(
        machine,
        &[
            ("scale", STT_FUNC, STB_GLOBAL, 128),
            ("counter", STT_OBJECT, STB_GLOBAL, 16),
            ("hidden", STT_OBJECT, STB_LOCAL, 8),
        ],
    );
    for (what, image) in [
        ("an ELF object", object.clone()),
        ("a fatbin or offload bundle", container(&object)),
    ] {
        let m = gpu.load(&image).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(gpu.function(m, c"scale").is_ok(), "{what}");
        assert_eq!(gpu.function(m, c"other"), Err(NOT_FOUND), "{what}");
        assert_eq!(gpu.global(m, c"counter").map(|g| g.1), Ok(16), "{what}");
        assert_eq!(
            gpu.global(m, c"hidden"),
            Err(NOT_FOUND),
            "{what}: a local symbol"
        );
        assert_eq!(gpu.unload(m), 0);
    }
    // A stand-in (the magic bytes and nothing the fake can read) takes any function name.
    let mut stand_in = vec![0u8; 64];
    stand_in[..4].copy_from_slice(b"\x7fELF");
    let m = gpu.load(&stand_in).unwrap();
    assert!(gpu.function(m, c"anything").is_ok());
    assert_eq!(gpu.global(m, c"counter"), Err(NOT_FOUND));
    assert_eq!(gpu.unload(m), 0);
    assert_eq!(gpu.c().census().modules, 0);
}

/// A kernel still writing a global when its module is unloaded is a hazard, as memory freed
/// under a kernel is.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn unloading_a_module_under_a_kernel_is_a_hazard(driver: Driver) {
    let gpu = Gpu::new(driver);
    let m = gpu.load(&kernels(&gpu)).unwrap();
    let (table, n) = gpu.global(m, c"table").unwrap();
    let s = gpu.stream(NON_BLOCKING);
    gpu.c().launch_writing(s, table, n as u64).unwrap();
    assert_eq!(gpu.unload(m), 0);
    assert_eq!(gpu.c().hazards(), 1, "{:?}", gpu.c().hazard_log());
    gpu.c().finish_all();
}

// ---- functions, occupancy, cooperative launches ------------------------------------------------------

/// What a function reports: the device's most threads a block, FK_FN_REGS registers, the
/// device's ISA version; dynamic shared memory up to the device's default per block, raised
/// (CUDA: up to the opt-in limit) or lowered with the attribute, and a launch asking for more
/// than the function allows is refused.
#[test_case(CUDA12, 49152, 232448, 90 ; "cuda")]
#[test_case(HIP, 65536, 65536, 94 ; "hip")]
fn a_functions_shared_memory_limit_is_what_a_launch_gets(
    driver: Driver,
    default: c_int,
    most: c_int,
    version: c_int,
) {
    let gpu = Gpu::new(driver);
    let m = gpu.load(&kernels(&gpu)).unwrap();
    let f = gpu.function(m, c"scale").unwrap();
    assert_eq!(gpu.function_attribute(f, 0), Ok(1024));
    assert_eq!(gpu.function_attribute(f, 4), Ok(32));
    assert_eq!(gpu.function_attribute(f, 5), Ok(version));
    assert_eq!(gpu.function_attribute(f, 8), Ok(default));
    assert_eq!(gpu.function_attribute(f, 99), Err(INVALID_VALUE));
    assert_eq!(
        gpu.launch(f, 1, 64, default as c_uint + 1, false),
        INVALID_VALUE
    );
    assert_eq!(gpu.set_function_attribute(f, 8, most + 1), INVALID_VALUE);
    assert_eq!(gpu.set_function_attribute(f, 8, most), 0);
    assert_eq!(gpu.function_attribute(f, 8), Ok(most));
    if most > default {
        assert_eq!(gpu.launch(f, 1, 64, default as c_uint + 1, false), 0);
    }
    assert_eq!(gpu.set_function_attribute(f, 8, 1024), 0);
    assert_eq!(gpu.launch(f, 1, 64, 1025, false), INVALID_VALUE, "lowered");
    assert_eq!(
        gpu.set_function_attribute(f, 9, 101),
        INVALID_VALUE,
        "a carveout in percent"
    );
    gpu.c().finish_all();
    assert_eq!(gpu.unload(m), 0);
}

/// Occupancy as the multiprocessor's threads, blocks, registers and shared memory allow; the
/// block size that fills a multiprocessor best, and a grid that fills the device; a
/// cooperative launch of more blocks than the device runs at once is refused.
#[test_case(CUDA12, 132, 7 ; "cuda h100")]
#[test_case(HIP, 304, 2 ; "hip mi300x")]
fn occupancy_bounds_a_cooperative_launch(driver: Driver, units: c_int, by_shared: c_int) {
    let gpu = Gpu::new(driver);
    let m = gpu.load(&kernels(&gpu)).unwrap();
    let f = gpu.function(m, c"scale").unwrap();
    let per_sm = call!(
        gpu,
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
        unsafe extern "C" fn(*mut c_int, u64, c_int, usize) -> R
    );
    let blocks = |block: c_int, shared: usize| {
        let mut n = -1;
        // SAFETY: one value written.
        assert_eq!(unsafe { per_sm(&mut n, f, block, shared) }, 0);
        n
    };
    // 2048 threads, 32 blocks, 65536 registers at 32 a thread.
    assert_eq!([blocks(32, 0), blocks(256, 0), blocks(1024, 0)], [32, 8, 2]);
    // 233472 (H100) or 65536 (a CU's LDS) bytes of shared memory, 30000 a block.
    assert_eq!(blocks(256, 30_000), by_shared, "shared memory bounds it");
    assert_eq!(blocks(32, 70_000), 0, "more than the function may have");
    assert_eq!(blocks(1025, 0), 0, "no such block");
    let (mut grid, mut block) = (0, 0);
    // SAFETY: two values written.
    let rc = unsafe {
        match gpu.vendor() {
            Vendor::Cuda => {
                let f2: unsafe extern "C" fn(
                    *mut c_int,
                    *mut c_int,
                    u64,
                    usize,
                    usize,
                    c_int,
                ) -> R = gpu.fake.sym("cuOccupancyMaxPotentialBlockSize");
                f2(&mut grid, &mut block, f, 0, 0, 0)
            }
            Vendor::Hip => {
                let f2: unsafe extern "C" fn(*mut c_int, *mut c_int, u64, usize, c_int) -> R =
                    gpu.fake.sym("hipModuleOccupancyMaxPotentialBlockSize");
                f2(&mut grid, &mut block, f, 0, 0)
            }
        }
    };
    assert_eq!((rc, block, grid), (0, 1024, 2 * units));
    assert_eq!(gpu.launch(f, (2 * units) as c_uint, 1024, 0, true), 0);
    assert_eq!(
        gpu.launch(f, (2 * units + 1) as c_uint, 1024, 0, true),
        COOPERATIVE_LAUNCH_TOO_LARGE
    );
    gpu.c().finish_all();
    assert_eq!(gpu.unload(m), 0);
}

/// cuOccupancyMaxPotentialBlockSize asks the caller's callback for each block size's dynamic
/// shared memory.
#[test]
fn cuda_potential_block_size_asks_the_callback() {
    extern "C" fn quarter_kib_a_thread(block: c_int) -> usize {
        block as usize * 256
    }
    let gpu = Gpu::new(CUDA12);
    let m = gpu.load(&kernels(&gpu)).unwrap();
    let f = gpu.function(m, c"scale").unwrap();
    let potential: unsafe extern "C" fn(
        *mut c_int,
        *mut c_int,
        u64,
        extern "C" fn(c_int) -> usize,
        usize,
        c_int,
    ) -> R = gpu.fake.sym("cuOccupancyMaxPotentialBlockSize");
    let best = || {
        let (mut grid, mut block) = (0, 0);
        // SAFETY: two values written; the callback is a plain function.
        let rc = unsafe { potential(&mut grid, &mut block, f, quarter_kib_a_thread, 0, 0) };
        assert_eq!(rc, 0);
        (block, grid)
    };
    // Within the function's default 48 KiB a block: blocks of at most 192 threads; 128 of
    // them, 7 a multiprocessor, keep 896 threads busy (64 and 32 tie; the larger wins).
    assert_eq!(best(), (128, 7 * 132));
    // Raised to the opt-in limit: 233472 bytes a multiprocessor at 256 a thread fit 912
    // threads, so one block of 896 (28 warps).
    assert_eq!(gpu.set_function_attribute(f, 8, 232_448), 0);
    assert_eq!(best(), (896, 132));
    assert_eq!(gpu.unload(m), 0);
}

// ---- synchronous memsets, peer access from kernels, host functions, the census ---------------

/// CUDA's synchronous memsets are "asynchronous with respect to the host except when the
/// target is pinned host memory or a Unified Memory region, in which case they are fully
/// synchronous"; a memset may target pinned host memory (unified addressing) on both vendors.
#[test]
fn cuda_synchronous_memsets_wait_on_pinned_and_managed_memory_only() {
    let gpu = Gpu::new(CUDA12);
    let memset: unsafe extern "C" fn(u64, u8, usize) -> R = gpu.fake.sym("cuMemsetD8_v2");
    let (plain, managed, pinned) = (gpu.malloc(4096), gpu.managed(4096), gpu.host_alloc(4096));
    for (what, target, waits) in [
        ("plain", plain, 0),
        ("managed", managed, 1),
        ("pinned", pinned as u64, 1),
    ] {
        gpu.c().launch(0, plain + 2048, 16).unwrap();
        let before = gpu.c().cpu_waits();
        // SAFETY: the driver checks the range.
        assert_eq!(unsafe { memset(target, 9, 1024) }, 0, "{what}");
        assert_eq!(gpu.c().cpu_waits(), before + waits, "{what}");
        gpu.c().finish_all();
        gpu.sync(0);
    }
    // SAFETY: pinned memory the driver gave; the memset completed.
    assert_eq!(unsafe { *pinned.add(1023) }, 9);
    assert_eq!(gpu.c().hazards(), 0);
    assert_eq!(gpu.host_free(pinned), 0);
}

/// A kernel on one device that reads another device's memory needs peer access to it: without,
/// an illegal address on a GPU, so a hazard; once enabled, none. Managed memory needs none.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_kernel_reaches_another_devices_memory_only_through_peer_access(driver: Driver) {
    let gpu = with_devices(driver, 2);
    gpu.select(1);
    let theirs = gpu.malloc(4096);
    gpu.select(0);
    let shared = gpu.managed(4096);
    gpu.c().kernel_model("scale", "r:a0:4096").unwrap();
    let m = gpu.load(&kernels(&gpu)).unwrap();
    let f = gpu.function(m, c"scale").unwrap();
    let launch: Launch = call!(gpu, "cuLaunchKernel", "hipModuleLaunchKernel", Launch);
    let run = |p: u64| {
        let mut arg = p;
        let mut params = [(&mut arg as *mut u64).cast::<c_void>()];
        // SAFETY: a live function; the parameter outlives the call.
        let rc = unsafe {
            launch(
                f,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                0,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, 0);
        gpu.c().finish_all();
    };
    run(shared);
    assert_eq!(gpu.c().hazards(), 0, "managed memory is every device's");
    run(theirs);
    assert_eq!(gpu.c().hazards(), 1);
    assert!(
        gpu.c().first_hazard().contains("without peer access"),
        "{}",
        gpu.c().first_hazard()
    );
    let enable = match gpu.vendor() {
        Vendor::Cuda => {
            let f: unsafe extern "C" fn(u64, c_uint) -> R = gpu.fake.sym("cuCtxEnablePeerAccess");
            // SAFETY: a retained context of the other device.
            unsafe { f(gpu.cuda_context(1), 0) }
        }
        Vendor::Hip => {
            let f: unsafe extern "C" fn(c_int, c_uint) -> R =
                gpu.fake.sym("hipDeviceEnablePeerAccess");
            // SAFETY: the other device.
            unsafe { f(1, 0) }
        }
    };
    assert_eq!(enable, 0);
    run(theirs);
    assert_eq!(gpu.c().hazards(), 1, "no new hazard once peer access is on");
    assert_eq!(gpu.unload(m), 0);
}

/// A host function runs under the driver's lock; the calls that only name an error still
/// answer there (before, they waited for the lock for ever).
#[test]
fn a_host_function_may_name_an_error() {
    use std::sync::atomic::{AtomicPtr, AtomicUsize};
    static GET_NAME: AtomicUsize = AtomicUsize::new(0);
    static NAME: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());
    extern "C" fn name_an_error(_: *mut c_void) {
        let get: unsafe extern "C" fn(R, *mut *const c_char) -> R =
            // SAFETY: the address of cuGetErrorName, stored below.
            unsafe { std::mem::transmute(GET_NAME.load(std::sync::atomic::Ordering::SeqCst)) };
        let mut name = std::ptr::null();
        // SAFETY: one pointer written.
        assert_eq!(unsafe { get(2, &mut name) }, 0);
        NAME.store(name.cast_mut(), std::sync::atomic::Ordering::SeqCst);
    }
    let gpu = Gpu::new(CUDA12);
    let get: unsafe extern "C" fn(R, *mut *const c_char) -> R = gpu.fake.sym("cuGetErrorName");
    GET_NAME.store(get as usize, std::sync::atomic::Ordering::SeqCst);
    let host: unsafe extern "C" fn(u64, extern "C" fn(*mut c_void), *mut c_void) -> R =
        gpu.fake.sym("cuLaunchHostFunc");
    // SAFETY: a plain function, no data.
    assert_eq!(unsafe { host(0, name_an_error, std::ptr::null_mut()) }, 0);
    gpu.sync(0);
    let name = NAME.load(std::sync::atomic::Ordering::SeqCst);
    assert!(!name.is_null(), "the host function ran");
    // SAFETY: a static string of the driver.
    assert_eq!(
        unsafe { CStr::from_ptr(name) }.to_str(),
        Ok("CUDA_ERROR_OUT_OF_MEMORY")
    );
}

/// The census counts pools and (CUDA) contexts too.
#[test_case(CUDA12, 1 ; "cuda")]
#[test_case(HIP, -1 ; "hip")]
fn the_census_counts_pools_and_contexts(driver: Driver, contexts: i64) {
    let gpu = Gpu::new(driver);
    let census = gpu.c().census();
    assert_eq!((census.pools, census.contexts), (0, contexts));
}

/// docs/fakes.md names every call each driver exports, so what is modelled of it is written
/// down.
#[test]
fn the_docs_name_every_call() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/fakes.md");
    let docs = std::fs::read_to_string(path).expect("docs/fakes.md");
    let mut missing = Vec::new();
    for driver in Driver::ALL {
        let controls = portalloc_fakes::Controls::open(driver.path()).expect("its controls");
        for name in controls.exports() {
            if !docs.contains(&format!("`{name}`")) {
                missing.push(format!("{} ({})", name, driver.name));
            }
        }
    }
    assert!(missing.is_empty(), "not in {path}: {}", missing.join(", "));
}

// ---- what an outside review found ------------------------------------------------------------------

/// A copy that starts in memory the driver knows and runs past it is refused ("invalid value":
/// clr's ihipMemcpy_validate checks the size against the allocation's), whatever the kind of
/// copy — before, a unified copy took the overrun for host memory and wrote past it.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_copy_past_its_allocation_is_refused(driver: Driver) {
    let gpu = Gpu::new(driver);
    let (a, b) = (gpu.malloc(4096), gpu.malloc(4096));
    let pinned = gpu.host_alloc(4096);
    let big = gpu.malloc(1 << 20);
    let copy = |dst: u64, src: u64, n: usize| -> R {
        match gpu.vendor() {
            Vendor::Cuda => {
                let f: unsafe extern "C" fn(u64, u64, usize) -> R = gpu.fake.sym("cuMemcpy");
                // SAFETY: the driver checks both ranges.
                unsafe { f(dst, src, n) }
            }
            Vendor::Hip => {
                let f: unsafe extern "C" fn(u64, u64, usize, c_int) -> R =
                    gpu.fake.sym("hipMemcpy");
                // SAFETY: as above; hipMemcpyDefault.
                unsafe { f(dst, src, n, 4) }
            }
        }
    };
    assert_eq!(copy(a, b, 4096), 0);
    assert_eq!(copy(a, b, 4097), INVALID_VALUE, "one byte past both");
    assert_eq!(
        copy(pinned as u64, big, 1 << 20),
        INVALID_VALUE,
        "past the pinned buffer"
    );
    assert_eq!(
        copy(big, pinned as u64, 8192),
        INVALID_VALUE,
        "read past the pinned buffer"
    );
    assert_eq!(gpu.c().hazards(), 0);
    assert_eq!(gpu.host_free(pinned), 0);
}

/// "The memory areas may not overlap" (cudaMemcpy, hipMemcpy): an overlapping copy is a
/// hazard saying so, not a race with itself.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn an_overlapping_copy_is_a_hazard_of_its_own(driver: Driver) {
    let gpu = Gpu::new(driver);
    let d = gpu.malloc(4096);
    let dtod = call!(
        gpu,
        "cuMemcpyDtoD_v2",
        "hipMemcpyDtoD",
        unsafe extern "C" fn(u64, u64, usize) -> R
    );
    // SAFETY: the driver checks both ranges.
    assert_eq!(unsafe { dtod(d, d + 100, 1000) }, 0);
    gpu.sync(0);
    let log = gpu.c().hazard_log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0].contains("overlap") && !log[0].contains("race"),
        "{log:?}"
    );
}

/// HIP answers a stream, event or module it does not know as clr does: a destroyed stream is
/// hipErrorContextIsDestroyed (`hip::isValid`), except to a launch (invalid value); an event
/// destroyed twice is hipErrorContextIsDestroyed from ROCm 6; an unloaded module is not found.
#[test]
fn hip_answers_unknown_handles_as_clr_does() {
    let gpu = Gpu::new(HIP);
    let s = gpu.stream(NON_BLOCKING);
    gpu.destroy_stream(s);
    let destroy: unsafe extern "C" fn(u64) -> R = gpu.fake.sym("hipStreamDestroy");
    let sync: unsafe extern "C" fn(u64) -> R = gpu.fake.sym("hipStreamSynchronize");
    let copy: unsafe extern "C" fn(u64, u64, usize, c_int, u64) -> R =
        gpu.fake.sym("hipMemcpyAsync");
    let record: unsafe extern "C" fn(u64, u64) -> R = gpu.fake.sym("hipEventRecord");
    let event_destroy: unsafe extern "C" fn(u64) -> R = gpu.fake.sym("hipEventDestroy");
    let (a, b) = (gpu.malloc(64), gpu.malloc(64));
    let e = gpu.event();
    let m = gpu.load(&kernels(&gpu)).unwrap();
    let f = gpu.function(m, c"scale").unwrap();
    let launch: Launch = gpu.fake.sym("hipModuleLaunchKernel");
    // SAFETY: the vendor's signatures; the driver checks every handle.
    unsafe {
        assert_eq!(destroy(s), CONTEXT_IS_DESTROYED);
        assert_eq!(destroy(0), INVALID_HANDLE, "the null stream");
        assert_eq!(sync(s), CONTEXT_IS_DESTROYED);
        assert_eq!(gpu.query(s), CONTEXT_IS_DESTROYED);
        assert_eq!(copy(a, b, 64, 3, s), CONTEXT_IS_DESTROYED);
        assert_eq!(record(e, s), CONTEXT_IS_DESTROYED);
        let rc = launch(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            s,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        assert_eq!(rc, INVALID_VALUE);
        assert_eq!(event_destroy(e), 0);
        assert_eq!(event_destroy(e), CONTEXT_IS_DESTROYED);
    }
    assert_eq!(gpu.unload(m), 0);
    assert_eq!(gpu.unload(m), NOT_FOUND);
    assert_eq!(gpu.function(m, c"scale"), Err(NOT_FOUND));
}

/// Code for another vendor, PTX under HIP, PTX the driver would not compile, and images whose
/// headers point past their end are refused with the vendors' codes — never read past.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn images_the_vendor_would_refuse_are_refused(driver: Driver) {
    let gpu = Gpu::new(driver);
    let cuda = gpu.vendor() == Vendor::Cuda;
    let theirs = elf(
        if cuda { EM_AMDGPU } else { EM_CUDA },
        &[("scale", STT_FUNC, STB_GLOBAL, 8)],
    );
    assert_eq!(
        gpu.load(&theirs),
        Err(NO_BINARY_FOR_GPU),
        "another vendor's object"
    );
    let other_container = if cuda {
        offload_bundle(&theirs)
    } else {
        fatbin(&theirs)
    };
    assert_eq!(
        gpu.load(&other_container),
        Err(if cuda { INVALID_IMAGE } else { INVALID_PTX }),
        "the other vendor's container"
    );
    let truncated = b".version 7.8\n.target sm_90\n.visible .entry k() {\n  ret;\n\0";
    let commented = b"// .version 7.8\n.target sm_90\n.visible .entry k() { ret; }\n\0";
    for ptx in [&truncated[..], &commented[..]] {
        assert_eq!(gpu.load(ptx), Err(INVALID_PTX), "under {}", driver.name);
    }
    match gpu.load(PTX) {
        Ok(m) => {
            assert!(cuda, "PTX: CUDA's only");
            assert_eq!(gpu.unload(m), 0);
        }
        Err(e) => assert_eq!((cuda, e), (false, INVALID_PTX), "PTX under HIP"),
    }
    // An object whose section headers lie past its end: in memory 1 GiB on, past what the fake
    // reads of an image whose size it is not told; in a file 200 MiB on, past its size.
    let mut lying = elf(
        if cuda { EM_CUDA } else { EM_AMDGPU },
        &[("scale", STT_FUNC, STB_GLOBAL, 8)],
    );
    lying[0x28..0x30].copy_from_slice(&(1u64 << 30).to_le_bytes());
    assert_eq!(gpu.load(&lying), Err(INVALID_IMAGE), "in memory");
    lying[0x28..0x30].copy_from_slice(&(200u64 << 20).to_le_bytes());
    let path = std::env::temp_dir().join(format!(
        "portalloc-fakes-lying-{}-{}.o",
        std::process::id(),
        driver.name
    ));
    std::fs::write(&path, &lying).unwrap();
    let from_file = call!(
        gpu,
        "cuModuleLoad",
        "hipModuleLoad",
        unsafe extern "C" fn(*mut u64, *const c_char) -> R
    );
    let name = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let mut m = 0;
    // SAFETY: a NUL-terminated path; one handle written.
    assert_eq!(
        unsafe { from_file(&mut m, name.as_ptr()) },
        INVALID_IMAGE,
        "from a file"
    );
    let _ = std::fs::remove_file(&path);
    // A container claiming 1 GiB it does not have.
    let mut short = if cuda {
        fatbin(&[0u8; 64])
    } else {
        offload_bundle(&[0u8; 64])
    };
    if cuda {
        short[8..16].copy_from_slice(&(1u64 << 30).to_le_bytes());
    } else {
        let entry = 32 + 24 + 30; // the host entry, then the device entry's offset
        short[entry..entry + 8].copy_from_slice(&(1u64 << 30).to_le_bytes());
    }
    assert_eq!(
        gpu.load(&short),
        Err(INVALID_IMAGE),
        "a container past its end"
    );
    assert_eq!(gpu.c().census().modules, 0);
}

// ---- what a second outside review found ------------------------------------------------------------

/// A fatbin of PTX only (the JIT-portable form, "a collection of different cubin and/or PTX
/// files") or a compressed offload bundle is a module the fake cannot read inside: it loads,
/// taking any function name; a PTX `.file` name holding `/*` is a string, not a comment.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn images_the_fake_cannot_read_inside_still_load(driver: Driver) {
    let gpu = Gpu::new(driver);
    let image = match gpu.vendor() {
        Vendor::Cuda => fatbin(PTX),
        Vendor::Hip => {
            let mut compressed = b"CCOB".to_vec();
            compressed.extend_from_slice(&[0u8; 60]);
            compressed
        }
    };
    let m = gpu.load(&image).unwrap();
    assert!(gpu.function(m, c"anything").is_ok());
    assert_eq!(gpu.unload(m), 0);
    if gpu.vendor() == Vendor::Cuda {
        let named = b".version 7.8\n.target sm_90\n.file 1 \"/tmp/a/*b.cu\"\n.visible .entry k() { ret; }\n\0";
        let m = gpu.load(named).unwrap();
        assert!(gpu.function(m, c"k").is_ok());
        assert_eq!(gpu.unload(m), 0);
    }
}

/// A host buffer partly registered: a copy is judged by where it starts (as clr's
/// ihipMemcpy_validate), so one that starts in the caller's own memory and runs into the
/// registered part is the caller's host memory, and its bytes land.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_partly_registered_buffer_is_the_callers_memory(driver: Driver) {
    let gpu = Gpu::new(driver);
    let page = 4096;
    let mut buffer = vec![1u8; 6 * page];
    let base = buffer.as_mut_ptr().align_offset(page);
    // SAFETY: `base` is inside `buffer`, which has a page to spare.
    let start = unsafe { buffer.as_mut_ptr().add(base) };
    let d = gpu.malloc(4 * page);
    gpu.htod(d, &[9u8; 4 * 4096]);
    // SAFETY: the middle two of four pages (inside `buffer`), which outlive their registration.
    assert_eq!(gpu.register(unsafe { start.add(page) }, 2 * page), 0);
    // Device to host into all four pages, then host to device from them.
    assert_eq!(gpu.dtoh(start, d, 4 * page), 0);
    // SAFETY: the copy completed (a pageable destination).
    let landed = unsafe { std::slice::from_raw_parts(start, 4 * page) };
    assert!(landed.iter().all(|&b| b == 9));
    let htod = call!(
        gpu,
        "cuMemcpyHtoD_v2",
        "hipMemcpyHtoD",
        unsafe extern "C" fn(u64, *const u8, usize) -> R
    );
    // SAFETY: as above.
    assert_eq!(unsafe { htod(d, start, 4 * page) }, 0);
    assert_eq!(gpu.c().hazards(), 0, "{:?}", gpu.c().hazard_log());
    // SAFETY: inside `buffer`; registered above.
    assert_eq!(gpu.unregister(unsafe { start.add(page) }), 0);
    assert_eq!(gpu.free(d), 0);
}

/// clr's hipStreamWaitEvent answers an unknown stream with hipErrorInvalidHandle (not the
/// hipErrorContextIsDestroyed of the other stream calls), and hipStreamGetFlags of the null
/// stream with hipErrorInvalidValue.
#[test]
fn hip_wait_event_and_get_flags_answer_as_clr() {
    let gpu = Gpu::new(HIP);
    let s = gpu.stream(NON_BLOCKING);
    gpu.destroy_stream(s);
    let e = gpu.event();
    gpu.record(e, 0);
    let wait: unsafe extern "C" fn(u64, u64, c_uint) -> R = gpu.fake.sym("hipStreamWaitEvent");
    let flags: unsafe extern "C" fn(u64, *mut c_uint) -> R = gpu.fake.sym("hipStreamGetFlags");
    let mut f = 0;
    // SAFETY: the driver checks the handles.
    unsafe {
        assert_eq!(wait(s, e, 0), INVALID_HANDLE);
        assert_eq!(flags(0, &mut f), INVALID_VALUE);
    }
}
