//! The CUDA backend without a GPU.
//!
//! * **ABI**: the `sys` structs' sizes and field offsets against `cuda.h` (CUDA 12.2).
//! * **NVIDIA's real `libcuda.so.1`** (Debian's driver 535, fetched by `scripts/test` into
//!   `.vendor/` and named by `PORTALLOC_TEST_CUDA_LIBRARY`; skipped with a message when
//!   unset): every symbol portalloc needs resolves, `cuInit` answers `CUDA_ERROR_NO_DEVICE` as
//!   a typed error with the driver's own name, and opening a device fails cleanly with it.
//! * **The conformance driver** (`fakes/drivers/fakecuda.c`, built by the test kit
//!   `portalloc-fakes`): the real shim's code paths over host memory — loading, symbol
//!   resolution, capability gates (with `fakecuda_old.c`, a CUDA 10.1 driver), context
//!   handling, error mapping and fault injection, virtual memory, pools, streams and events,
//!   and the bfc and platform strategies through `strategy::build`, with the driver's own
//!   count of live objects back to zero at the end of every test.
//!
//! Each test loads its own copy of the conformance driver (a separate file, so a separate
//! library instance with its own state): tests run in parallel without seeing each other's
//! allocations or injected faults.
#![cfg(feature = "cuda")]

use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::Arc;

use crate::support::common::{assert_chosen, discover_with, driver_failure};
use portalloc::backends::cuda::{
    CudaDevice, Driver, CAPTURE_SYMBOLS, HOST_REGISTER_SYMBOLS, IDENTITY_SYMBOLS,
    PINNED_HOST_SYMBOLS, POOL_SYMBOLS, REQUIRED_SYMBOLS, VMM_SYMBOLS,
};
use portalloc::device::{Device, PhysicalHandle, Stream};
use portalloc::sys::cuda as sys;
use portalloc::{Config, Error, StrategyKind, Vendor};

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------------
// ABI
// ---------------------------------------------------------------------------------------------

mod abi {
    use super::sys;

    #[test]
    fn struct_layouts_match_cuda_h() {
        crate::assert_layout!(sys::CUmemLocation, size 8; type_ @ 0, id @ 4);
        crate::assert_layout!(sys::CUmemAllocationProp, size 32;
            type_ @ 0, requestedHandleTypes @ 4, location @ 8, win32HandleMetaData @ 16, allocFlags @ 24);
        crate::assert_layout!(sys::CUmemAllocationPropAllocFlags, size 8; usage @ 2, reserved @ 4);
        crate::assert_layout!(sys::CUmemAccessDesc, size 12; location @ 0, flags @ 8);
        crate::assert_layout!(sys::CUmemPoolProps, size 88;
            allocType @ 0, handleTypes @ 4, location @ 8,
            win32SecurityAttributes @ 16, maxSize @ 24, reserved @ 32);
        crate::assert_layout!(sys::CUdeviceptr, size 8);
        crate::assert_layout!(sys::CUmemGenericAllocationHandle, size 8);
        crate::assert_layout!(sys::CUcontext, size std::mem::size_of::<usize>());
    }

    #[test]
    fn constants_match_cuda_h() {
        crate::assert_values!(
            sys::CUDA_ERROR_OUT_OF_MEMORY = 2,
            sys::CUDA_ERROR_NO_DEVICE = 100,
            sys::CUDA_ERROR_NOT_READY = 600,
            sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
            sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
            sys::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
            sys::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
            sys::CU_MEM_ALLOCATION_TYPE_PINNED = 1,
            sys::CU_MEM_LOCATION_TYPE_DEVICE = 1,
            sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
            sys::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
            sys::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
            sys::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
            sys::CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
            sys::CU_EVENT_DISABLE_TIMING = 2,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// NVIDIA's real libcuda.so.1
// ---------------------------------------------------------------------------------------------

mod real_libcuda {
    use super::*;

    /// Debian's libcuda1 (driver 535), where `scripts/test` fetched it.
    fn library() -> Option<String> {
        crate::support::vendor_runtime("PORTALLOC_TEST_CUDA_LIBRARY")
    }

    #[test]
    fn resolves_every_symbol_portalloc_needs() {
        let Some(path) = library() else { return };
        let driver = Driver::load(std::slice::from_ref(&path)).expect("libcuda loads");
        assert_eq!(driver.path(), path);
        let symbols = driver.symbols();
        assert_eq!(
            symbols.len(),
            REQUIRED_SYMBOLS.len()
                + VMM_SYMBOLS.len()
                + POOL_SYMBOLS.len()
                + PINNED_HOST_SYMBOLS.len()
                + HOST_REGISTER_SYMBOLS.len()
                + CAPTURE_SYMBOLS.len()
                + IDENTITY_SYMBOLS.len()
        );
        let missing: Vec<_> = symbols.iter().filter(|(_, ok)| !ok).collect();
        assert!(missing.is_empty(), "driver 535 lacks {missing:?}");
        assert!(driver.has_vmm_symbols() && driver.has_pool_symbols());
        assert!(driver.has_pinned_host_symbols());
        let version = driver
            .version_code()
            .expect("cuDriverGetVersion needs no device");
        assert!(version >= 12_000, "driver 535 is CUDA 12.x, got {version}");
    }

    #[test]
    fn no_device_is_a_typed_error_with_the_drivers_name() {
        let Some(path) = library() else { return };
        let driver = Arc::new(Driver::load(&[path]).unwrap());
        let e = match driver.init() {
            Ok(()) => {
                eprintln!("a GPU is present: cuInit succeeded; checking it opens instead");
                let device = CudaDevice::open(Arc::clone(&driver), 0).unwrap();
                assert!(device.info().arch.starts_with("sm_"));
                return;
            }
            failed => driver_failure(failed),
        };
        assert_eq!(
            (e.backend, e.call, e.code, e.name.as_str()),
            ("cuda", "cuInit", 100, "CUDA_ERROR_NO_DEVICE")
        );
        assert!(e.message.contains("no CUDA-capable device"), "{e:?}");
        let e = driver_failure(CudaDevice::open(Arc::clone(&driver), 0));
        assert_eq!(
            (e.name.as_str(), e.call),
            ("CUDA_ERROR_NO_DEVICE", "cuInit")
        );
        assert!(matches!(
            CudaDevice::open_all(driver),
            Err(Error::Driver { code: 100, .. })
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// The conformance driver
// ---------------------------------------------------------------------------------------------

/// One private instance of a conformance driver: the shared harness (`crate::support::fakes`: faults,
/// call and live counts, peers, event holding) and what only fakecuda has.
struct Fake(crate::support::fakes::Fake);

impl std::ops::Deref for Fake {
    type Target = crate::support::fakes::Fake;

    fn deref(&self) -> &crate::support::fakes::Fake {
        &self.0
    }
}

impl Fake {
    /// A private copy of `libfakecuda.so`.
    fn new() -> Fake {
        Fake(crate::support::fakes::Fake::copy("fakecuda"))
    }

    /// A private copy of `libfakecuda_old.so` (CUDA 10.1: no VMM, no pools).
    fn old() -> Fake {
        Fake(crate::support::fakes::Fake::copy("fakecuda_old"))
    }

    /// The conformance driver at `path` (not copied, not removed).
    #[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
    fn at(path: PathBuf) -> Fake {
        Fake(crate::support::fakes::Fake::at(path))
    }

    fn driver(&self) -> Arc<Driver> {
        Arc::new(Driver::load(&[self.path()]).expect("the conformance driver loads"))
    }

    /// Devices (-1: none), capacity, granularity, version; 0 keeps the default.
    fn configure(&self, devices: i32, capacity: u64, granularity: u64, version: i32) {
        let f: unsafe extern "C" fn(c_int, u64, u64, c_int) -> c_int =
            self.sym("fakecuda_configure");
        // SAFETY: plain values.
        assert_eq!(unsafe { f(devices, capacity, granularity, version) }, 0);
    }

    /// Runs `test` on device 0 (`capacity` bytes) of a private `fakecuda`; once it is done
    /// and the device dropped, the driver must hold nothing.
    fn with_device(capacity: u64, test: impl FnOnce(&Fake, &CudaDevice)) {
        let fake = Fake::new();
        let device = fake.device(capacity);
        test(&fake, &device);
        drop(device);
        fake.assert_empty();
    }

    fn device(&self, capacity: u64) -> CudaDevice {
        self.configure(1, capacity, 0, 0);
        CudaDevice::open(self.driver(), 0).expect("open the fake device")
    }

    fn set_attribute(&self, device: i32, attribute: i32, value: i32) {
        let f: unsafe extern "C" fn(c_int, c_int, c_int) = self.sym("fakecuda_set_attribute");
        // SAFETY: plain values.
        unsafe { f(device, attribute, value) }
    }

    fn device_used(&self, device: i32) -> u64 {
        let f: unsafe extern "C" fn(c_int) -> u64 = self.sym("fakecuda_device_used");
        // SAFETY: a plain value.
        unsafe { f(device) }
    }
}

mod loading {
    use super::*;

    #[test]
    fn resolves_every_symbol_and_opens_a_device() {
        let fake = Fake::new();
        let driver = fake.driver();
        assert!(driver.symbols().iter().all(|(_, ok)| *ok));
        fake.configure(1, 8 << 30, 0, 0);
        let device = CudaDevice::open(Arc::clone(&driver), 0).unwrap();
        let info = device.info();
        assert_eq!(info.vendor, Vendor::Cuda);
        // fakecuda impersonates an H100 SXM5 (its cuDeviceGetName, as a CUDA 12.2 driver says it).
        assert_eq!(info.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(info.arch, "sm_90");
        assert_eq!(info.total_bytes, 8 << 30);
        assert_eq!(info.min_granularity, 2 * MIB);
        assert_eq!(info.recommended_granularity, 2 * MIB);
        assert!(info.capabilities.virtual_memory);
        assert!(info.capabilities.stream_ordered_pool);
        assert!(device.virtual_memory().is_some());
        assert!(device.stream_ordered_pool().is_some());
        let note = |k: &str| {
            info.notes
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert_eq!(note("driver"), "CUDA 12.2 (12020)");
        assert!(note("library").contains("portalloc-fakecuda"));
        let mem = device.mem_info().unwrap();
        assert_eq!((mem.free, mem.total), (8 << 30, 8 << 30));
        assert_eq!(
            fake.live("contexts"),
            1,
            "the primary context is retained once"
        );
        assert_eq!(fake.live("pools"), 1, "the device made a pool of its own");
        drop(device);
        fake.assert_empty();
    }

    #[test]
    fn an_old_driver_has_no_vmm_or_pools_and_nothing_panics() {
        let fake = Fake::old();
        let driver = fake.driver();
        assert!(!driver.has_vmm_symbols());
        assert!(!driver.has_pool_symbols());
        for (symbol, ok) in driver.symbols() {
            let newer = VMM_SYMBOLS.contains(&symbol) || POOL_SYMBOLS.contains(&symbol);
            assert_eq!(ok, !newer, "{symbol}");
        }
        let device = CudaDevice::open(driver, 0).unwrap();
        let info = device.info();
        assert!(!info.capabilities.virtual_memory && !info.capabilities.stream_ordered_pool);
        assert!(device.virtual_memory().is_none());
        assert!(device.stream_ordered_pool().is_none());
        assert_eq!(info.min_granularity, 2 * MIB, "assumed without the VMM API");
        let vmm_note = &info
            .notes
            .iter()
            .find(|(k, _)| k == "virtual memory")
            .unwrap()
            .1;
        assert!(
            vmm_note.contains("CUDA 10.1") && vmm_note.contains("10.2"),
            "{vmm_note}"
        );
        // Plain allocation still works, and strategies needing VMM say why they cannot.
        let p = device.alloc(1000).unwrap();
        device.free(p, 1000).unwrap();
        let device: Arc<dyn Device> = Arc::new(device);
        let config = Config::builder()
            .ignore_env()
            .strategy(StrategyKind::Vmm)
            .build()
            .unwrap();
        match portalloc::strategy::build(&config, Arc::clone(&device)) {
            Err(Error::Unsupported { backend, .. }) => assert_eq!(backend, "cuda"),
            Err(e) => panic!("expected Unsupported, got {e}"),
            Ok(_) => panic!("vmm built without virtual memory"),
        }
        drop(device);
        fake.assert_empty();
    }

    /// A driver that cannot page-lock memory (`fakecuda_nopinned`: every real libcuda
    /// exports `cuMemHostAlloc`, and where page-locking is not to be had it answers
    /// `CUDA_ERROR_OUT_OF_MEMORY`) loads and opens as any: `alloc_pinned_host` is the
    /// driver's refusal, and copies work with the caller's ordinary host memory instead.
    #[test]
    fn a_driver_that_cannot_page_lock_offers_no_pinned_memory_and_copies_still_work() {
        let fake = Fake(crate::support::fakes::Fake::copy("fakecuda_nopinned"));
        let driver = fake.driver();
        assert!(driver.has_pinned_host_symbols());
        assert!(driver.symbols().iter().all(|(_, ok)| *ok));
        let device = CudaDevice::open(driver, 0).unwrap();
        match device.alloc_pinned_host(4096) {
            Err(Error::Driver { code, .. }) => assert_eq!(code, 2, "CUDA_ERROR_OUT_OF_MEMORY"),
            other => panic!("expected the driver's refusal, got {other:?}"),
        }
        let p = device.alloc(4096).unwrap();
        let host: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let mut back = vec![0u8; 4096];
        // SAFETY: both vectors hold 4096 bytes until the stream is synchronised; `p` is a
        // live allocation of 4096 bytes.
        unsafe {
            device
                .copy_from_host(p, host.as_ptr(), 4096, Stream::DEFAULT)
                .unwrap();
            device
                .copy_to_host(back.as_mut_ptr(), p, 4096, Stream::DEFAULT)
                .unwrap();
        }
        device.synchronize_stream(Stream::DEFAULT).unwrap();
        assert_eq!(back, host);
        device.free(p, 4096).unwrap();
        drop(device);
        fake.assert_empty();
    }

    #[test]
    fn capability_gates_follow_version_and_attributes() {
        let fake = Fake::new();
        // CUDA 11.0: VMM yes, pools no (11.2 needed), symbols notwithstanding.
        fake.configure(2, 0, 0, 11_000);
        // Device 1 says it has no virtual memory management.
        fake.set_attribute(1, 102, 0);
        let driver = fake.driver();
        let d0 = CudaDevice::open(Arc::clone(&driver), 0).unwrap();
        let d1 = CudaDevice::open(Arc::clone(&driver), 1).unwrap();
        assert!(d0.info().capabilities.virtual_memory);
        assert!(!d0.info().capabilities.stream_ordered_pool);
        assert!(!d1.info().capabilities.virtual_memory);
        let note = &d1
            .info()
            .notes
            .iter()
            .find(|(k, _)| k == "virtual memory")
            .unwrap()
            .1;
        assert!(note.contains("attribute 102 is 0"), "{note}");
        drop((d0, d1));
        fake.assert_empty();
    }

    #[test]
    fn no_device_and_bad_ordinals_are_typed_errors() {
        let fake = Fake::new();
        fake.configure(-1, 0, 0, 0);
        let driver = fake.driver();
        let e = driver_failure(CudaDevice::open(Arc::clone(&driver), 0));
        assert_eq!((e.name.as_str(), e.code), ("CUDA_ERROR_NO_DEVICE", 100));
        let probe = portalloc::backends::cuda::probe_with(&[fake.path()]);
        assert_eq!(probe.device_count, 0);
        assert!(probe
            .error
            .unwrap()
            .starts_with("CUDA_ERROR_NO_DEVICE (100)"));

        let fake = Fake::new();
        fake.configure(2, 0, 0, 0);
        let driver = fake.driver();
        match CudaDevice::open(Arc::clone(&driver), 7) {
            Err(Error::InvalidArgument { reason, .. }) => {
                assert!(reason.contains("ordinal 7"), "{reason}");
                assert!(reason.contains(&fake.path()), "{reason}");
                assert!(reason.contains("2 device(s)"), "{reason}");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        let all = CudaDevice::open_all(driver).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].info().ordinal, 1);
        drop(all);
        fake.assert_empty();
    }
    // A library without the driver API (no cuInit): tests/suite/vendor_runtimes.rs,
    // `library_without_the_driver_api_is_missing_a_symbol`.
}

mod errors {
    use super::*;

    #[test]
    fn out_of_memory_is_device_out_of_memory() {
        Fake::with_device(64 * MIB, |fake, device| {
            match device.alloc(65 * MIB) {
                Err(Error::DeviceOutOfMemory {
                    backend,
                    requested,
                    free,
                }) => {
                    assert_eq!((backend, requested, free), ("cuda", 65 * MIB, 64 * MIB));
                }
                other => panic!("expected DeviceOutOfMemory, got {other:?}"),
            }
            // An injected OOM from a call that would have succeeded maps the same way.
            fake.fail("cuMemAlloc_v2", 1, 1, 2);
            assert!(matches!(
                device.alloc(MIB),
                Err(Error::DeviceOutOfMemory { .. })
            ));
            let p = device.alloc(MIB).unwrap();
            device.free(p, MIB).unwrap();
        });
    }

    #[test]
    fn other_codes_carry_the_drivers_name_and_text() {
        Fake::with_device(64 * MIB, |fake, device| {
            fake.fail("cuMemAlloc_v2", 1, 1, 999);
            let e = driver_failure(device.alloc(MIB));
            assert_eq!((e.backend, e.call, e.code), ("cuda", "cuMemAlloc_v2", 999));
            assert_eq!(e.name, "CUDA_ERROR_UNKNOWN");
            assert_eq!(e.message, "unknown error");
            // A code the driver has no name for gets a made-up one, no panic.
            fake.fail("cuMemGetInfo_v2", 1, 1, 12_345);
            let e = driver_failure(device.mem_info());
            assert_eq!((e.name.as_str(), e.code), ("CUDA_ERROR_12345", 12_345));
            // A failed free keeps the allocation, and the retry frees it.
            let p = device.alloc(MIB).unwrap();
            fake.fail("cuMemFree_v2", 1, 1, 700);
            assert!(matches!(
                device.free(p, MIB),
                Err(Error::Driver { code: 700, .. })
            ));
            assert_eq!(device.census().allocations, 1);
            device.free(p, MIB).unwrap();
            // Pointers the device never handed out are refused before the driver sees them.
            assert!(matches!(
                device.free(p, MIB),
                Err(Error::UnknownPointer {
                    what: "allocation",
                    ..
                })
            ));
            assert!(matches!(device.alloc(0), Err(Error::InvalidSize { .. })));
        });
    }

    #[test]
    fn a_failed_context_switch_is_an_error_not_a_crash() {
        let fake = Fake::new();
        let device = Arc::new(fake.device(64 * MIB));
        fake.fail("cuCtxSetCurrent", 1, -1, 201);
        // A new thread has no current context: the shim must set it, and that fails.
        let d = Arc::clone(&device);
        let e = driver_failure(std::thread::spawn(move || d.alloc(MIB)).join().unwrap());
        assert_eq!(
            (e.name.as_str(), e.call),
            ("CUDA_ERROR_INVALID_CONTEXT", "cuCtxSetCurrent")
        );
        fake.clear_faults();
        drop(device);
        fake.assert_empty();
    }
}

mod contexts {
    use super::*;

    #[test]
    fn every_thread_gets_the_devices_context() {
        let fake = Fake::new();
        fake.configure(2, 256 * MIB, 0, 0);
        let driver = fake.driver();
        let d0 = Arc::new(CudaDevice::open(Arc::clone(&driver), 0).unwrap());
        let d1 = Arc::new(CudaDevice::open(Arc::clone(&driver), 1).unwrap());
        // Interleave the two devices on fresh threads: each call lands on its own device.
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (d0, d1) = (Arc::clone(&d0), Arc::clone(&d1));
                std::thread::spawn(move || {
                    let a = d1.alloc(MIB * (t + 1)).unwrap();
                    let b = d0.alloc(MIB).unwrap();
                    (a, b, t)
                })
            })
            .collect();
        let got: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(fake.device_used(0), 4 * MIB);
        assert_eq!(fake.device_used(1), 10 * MIB);
        for (a, b, t) in got {
            d1.free(a, MIB * (t + 1)).unwrap();
            d0.free(b, MIB).unwrap();
        }
        assert_eq!(fake.live("contexts"), 2);
        drop((d0, d1));
        fake.assert_empty();
    }
}

mod virtual_memory {
    use super::*;

    #[test]
    fn reserve_create_map_access_unmap_release() {
        Fake::with_device(64 * MIB, |fake, device| {
            let vm = device.virtual_memory().unwrap();
            let g = vm.granularity();
            assert_eq!(g, 2 * MIB);
            let va = vm.reserve(8 * g, 0).unwrap();
            assert_eq!(va % g, 0);
            let h = vm.create_physical(2 * g).unwrap();
            assert_eq!(fake.device_used(0), 2 * g, "physical memory counts");
            vm.map(va, 2 * g, h, 0).unwrap();
            vm.map(va + 4 * g, g, h, g).unwrap();
            vm.set_access(va, 2 * g).unwrap();
            vm.set_access(va + 4 * g, g).unwrap();
            // SAFETY: [va, va + 2g) is mapped read-write host memory in the conformance driver.
            unsafe {
                std::ptr::write_bytes(va as *mut u8, 0xab, (2 * g) as usize);
                // Two mappings of one handle see the same bytes: offset g of the handle.
                assert_eq!(*((va + 4 * g) as *const u8), 0xab);
            }
            assert_eq!(fake.live("mappings"), 2);
            // Releasing a mapped handle defers the free to the last unmap.
            vm.release_physical(h).unwrap();
            assert_eq!(fake.live("handles"), 1);
            vm.unmap(va, 2 * g).unwrap();
            vm.unmap(va + 4 * g, g).unwrap();
            assert_eq!(fake.live("handles"), 0);
            vm.free_reservation(va, 8 * g).unwrap();
            assert!(device.census().is_empty());
        });
    }

    #[test]
    fn bad_arguments_are_typed_errors() {
        Fake::with_device(64 * MIB, |_, device| {
            let vm = device.virtual_memory().unwrap();
            let g = vm.granularity();
            assert!(matches!(
                vm.reserve(g + 1, 0),
                Err(Error::InvalidArgument { .. })
            ));
            assert!(matches!(
                vm.reserve(g, 3),
                Err(Error::InvalidArgument { .. })
            ));
            assert!(matches!(
                vm.create_physical(0),
                Err(Error::InvalidArgument { .. })
            ));
            assert!(matches!(
                vm.release_physical(PhysicalHandle(77)),
                Err(Error::UnknownPointer { .. })
            ));
            let va = vm.reserve(4 * g, 0).unwrap();
            let h = vm.create_physical(g).unwrap();
            // Past the handle's end: the driver refuses, with its own name.
            let e = driver_failure(vm.map(va, 2 * g, h, 0));
            assert_eq!(
                (e.name.as_str(), e.call),
                ("CUDA_ERROR_INVALID_VALUE", "cuMemMap")
            );
            vm.map(va, g, h, 0).unwrap();
            assert!(matches!(
                vm.free_reservation(va, 4 * g),
                Err(Error::InvalidArgument { .. })
            ));
            // Too much physical memory: device OOM.
            assert!(matches!(
                vm.create_physical(64 * MIB),
                Err(Error::DeviceOutOfMemory { .. })
            ));
            vm.unmap(va, g).unwrap();
            vm.release_physical(h).unwrap();
            vm.free_reservation(va, 4 * g).unwrap();
        });
    }

    /// Everything but the caller's streams: a stream made with `create_stream` and never
    /// destroyed stays live past the drop, with the primary context it needs (its handle
    /// may still be in use — a `Stream` is a copy — and destroying it would leave that
    /// dangling), so safe code never passes the driver a destroyed stream.
    #[test]
    fn dropping_the_device_returns_what_it_held() {
        let fake = Fake::new();
        let device = fake.device(64 * MIB);
        let vm = device.virtual_memory().unwrap();
        let g = vm.granularity();
        let va = vm.reserve(4 * g, 0).unwrap();
        let h = vm.create_physical(g).unwrap();
        vm.map(va, g, h, 0).unwrap();
        let _leaked = device.alloc(1234).unwrap();
        let stream = device.create_stream().unwrap();
        let _event = device.create_event().unwrap();
        let pool = device.stream_ordered_pool().unwrap();
        let _p = pool.alloc_async(4096, Stream::DEFAULT).unwrap();
        assert!(fake.live("bytes") > 0);
        drop(device);
        let mut names = crate::support::fakes::LIVE.to_vec();
        names.push("contexts");
        assert_eq!(fake.nonzero(&names), [("streams", 1), ("contexts", 1)]);
        // The stream still works for the next device, in the context kept for it.
        let again = CudaDevice::open(fake.driver(), 0).expect("open the fake device again");
        again.synchronize_stream(stream).unwrap();
        // SAFETY: the stream left live, idle, not used after.
        unsafe { again.destroy_stream(stream) }.unwrap_err();
    }
}

mod pools_streams_events {
    use super::*;

    #[test]
    fn pool_allocates_counts_trims_and_releases_above_threshold() {
        Fake::with_device(64 * MIB, |_, device| {
            let pool = device.stream_ordered_pool().unwrap();
            let s = device.create_stream().unwrap();
            assert_eq!(pool.release_threshold().unwrap(), 0);
            let a = pool.alloc_async(3 * MIB, s).unwrap();
            let b = pool.alloc_async(MIB, Stream::DEFAULT).unwrap();
            let u = pool.usage().unwrap();
            assert_eq!(u.used_current, 4 * MIB);
            assert_eq!(u.reserved_current, 4 * MIB);
            pool.free_async(a, s).unwrap();
            // Freed memory stays in the pool until a synchronisation, then goes (threshold 0).
            assert_eq!(pool.usage().unwrap().used_current, MIB);
            assert_eq!(pool.usage().unwrap().reserved_current, 4 * MIB);
            device.synchronize_stream(s).unwrap();
            assert_eq!(pool.usage().unwrap().reserved_current, MIB);
            // With a threshold the pool keeps memory; trim_to gives it back.
            pool.set_release_threshold(16 * MIB).unwrap();
            assert_eq!(pool.release_threshold().unwrap(), 16 * MIB);
            let c = pool.alloc_async(8 * MIB, s).unwrap();
            pool.free_async(c, s).unwrap();
            device.synchronize_stream(s).unwrap();
            assert_eq!(pool.usage().unwrap().reserved_current, 9 * MIB);
            pool.trim_to(0).unwrap();
            let u = pool.usage().unwrap();
            assert_eq!((u.reserved_current, u.used_current), (MIB, MIB));
            assert_eq!(u.used_high, 9 * MIB);
            assert!(matches!(
                pool.free_async(12345, s),
                Err(Error::UnknownPointer { .. })
            ));
            // A stream handle is the caller's: portalloc passes it on, and the driver judges it.
            assert!(matches!(
                pool.alloc_async(MIB, crate::support::stream(0xdead)),
                Err(Error::Driver { ref name, .. }) if name == "CUDA_ERROR_INVALID_HANDLE"
            ));
            assert!(matches!(
                pool.alloc_async(65 * MIB, s),
                Err(Error::DeviceOutOfMemory { .. })
            ));
            pool.free_async(b, Stream::DEFAULT).unwrap();
            device.synchronize_stream(Stream::DEFAULT).unwrap();
            // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
            unsafe { device.destroy_stream(s) }.unwrap();
        });
    }

    #[test]
    fn events_in_flight_complete_when_synchronised() {
        Fake::with_device(64 * MIB, |fake, device| {
            let s = fake.check_streams_and_events(device, |_, _| {});
            // Synchronising is passed to the driver, which knows the handle is gone.
            assert!(matches!(
                device.synchronize_stream(s),
                Err(Error::Driver { ref name, .. }) if name == "CUDA_ERROR_INVALID_HANDLE"
            ));
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies over the CUDA device on the conformance driver
// ---------------------------------------------------------------------------------------------

/// What every strategy must do on every device — on `fakecuda` and `fakecuda_old` too — is
/// the conformance suite's (`tests/suite/conformance.rs`, modules `fakecuda` and `fakecuda_old`).
/// Here: how the strategies meet this driver's refusals and its virtual-memory calls, named
/// by the suite's list.
mod strategies {
    use super::*;
    use crate::support::targets::{Strategy, SuiteStrategy, Target};
    use portalloc::{Allocation, Allocator};

    /// Runs `test` on `strategy` over a 64 MiB device of a private `fakecuda` (and the fake
    /// itself); once the allocator is dropped, the fake must hold nothing.
    fn with_subject(
        strategy: Strategy,
        test: impl FnOnce(&crate::support::fakes::Fake, &dyn Allocator),
    ) {
        let Some(rig) = Target::FakeCuda.open(1, 64 * MIB) else {
            return;
        };
        let allocator = strategy.build_as_configured(rig.device(0)).unwrap();
        test(rig.fake().unwrap(), allocator.as_ref());
        drop(allocator);
        rig.finish();
    }

    fn invariants(allocator: &dyn Allocator) {
        allocator
            .check_invariants()
            .unwrap_or_else(|e| panic!("{}: invariant broken: {e}", allocator.name()));
    }

    #[test]
    fn bfc_backs_off_when_the_device_refuses() {
        with_subject(Strategy::BfcGrow, |fake, allocator| {
            // Growth asks the device for a region; the first attempt is refused with OOM and
            // bfc retries smaller (×0.9) instead of failing.
            fake.fail("cuMemAlloc_v2", 1, 1, 2);
            let a = allocator.allocate(MIB, 0, Stream::DEFAULT, "t").unwrap();
            invariants(allocator);
            allocator.deallocate(a).unwrap();
            // A non-OOM failure is surfaced as the driver's typed error, not retried.
            let big = allocator.stats().pool_bytes + MIB;
            fake.fail("cuMemAlloc_v2", 1, 1, 999);
            match allocator.allocate(big, 0, Stream::DEFAULT, "t") {
                Err(e) => {
                    let text = e.to_string();
                    assert!(
                        matches!(e, Error::Driver { .. }) || text.contains("CUDA_ERROR_UNKNOWN"),
                        "{text}"
                    );
                }
                Ok(a) => panic!("the injected failure was not seen: {a:?}"),
            }
            invariants(allocator);
        });
    }

    #[test]
    fn platform_reports_device_oom() {
        with_subject(Strategy::Platform, |fake, allocator| {
            fake.fail("cuMemAlloc_v2", 1, 1, 2);
            let e = allocator
                .allocate(MIB, 0, Stream::DEFAULT, "t")
                .unwrap_err();
            assert!(e.is_out_of_memory(), "{e}");
            let a = allocator.allocate(MIB, 0, Stream::DEFAULT, "t").unwrap();
            allocator.deallocate(a).unwrap();
        });
    }

    #[test]
    fn vmm_strategy_runs_on_the_cuda_vmm_api() {
        with_subject(Strategy::Vmm, |fake, allocator| {
            let sizes = [1000u64, 3 * MIB, 5 * MIB + 17, 256];
            let live: Vec<Allocation> = sizes
                .iter()
                .map(|&n| allocator.allocate(n, 0, Stream::DEFAULT, "t").unwrap())
                .collect();
            for a in &live {
                // SAFETY: mapped read-write host memory in the conformance driver, owned here.
                unsafe { std::ptr::write_bytes(a.ptr() as *mut u8, 7, a.size() as usize) };
            }
            assert!(fake.live("mappings") > 0);
            for a in live {
                allocator.deallocate(a).unwrap();
            }
            allocator.trim().unwrap();
            // A failing cuMemCreate surfaces as an error value.
            fake.fail("cuMemCreate", 1, 1, 999);
            assert!(allocator.allocate(MIB, 0, Stream::DEFAULT, "t").is_err());
            invariants(allocator);
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Discovery
// ---------------------------------------------------------------------------------------------

#[test]
fn discovery_chooses_cuda_and_opens_every_device() {
    let fake = Fake::new();
    fake.configure(2, 512 * MIB, 0, 0);
    let p = discover_with(&[("PORTALLOC_CUDA_LIBRARY", &fake.path())]);
    let probe = assert_chosen(&p, Vendor::Cuda, 2);
    assert_eq!(probe.library.as_deref(), Some(fake.path().as_str()));
    assert_eq!(probe.driver_version.as_deref(), Some("12.2"));
    let a = p.allocators[1]
        .allocate(MIB, 0, Stream::DEFAULT, "t")
        .unwrap();
    assert!(fake.device_used(1) >= MIB);
    assert_eq!(fake.device_used(0), 0);
    p.allocators[1].deallocate(a).unwrap();
    drop(p);
    fake.assert_empty();
}

// ---------------------------------------------------------------------------------------------
// cudarc interop (feature `cudarc`)
// ---------------------------------------------------------------------------------------------

/// cudarc loads the driver with its own loader, by name (`libcuda.so`, …), once per process.
/// So the check runs in a child process of this test binary whose `LD_LIBRARY_PATH` leads
/// cudarc to the conformance driver, under the name `libcuda.so`, and `PORTALLOC_CUDA_LIBRARY`
/// leads portalloc to the same file: one driver instance, shared by both, as libcuda is.
#[cfg(feature = "cudarc")]
mod cudarc_interop {
    use portalloc::backends::cuda::cudarc::{stream_of, PortallocSlice};
    use portalloc::Allocator;

    use super::*;

    const CHILD: &str = "PORTALLOC_TEST_CUDARC_CHILD";

    /// bfc over `device`, through `strategy::build` as an application would build it, with
    /// the pool taken at the first allocation (`preallocate`) or grown.
    fn bfc(device: Arc<CudaDevice>, preallocate: bool) -> Box<dyn Allocator> {
        let config = Config::builder()
            .ignore_env()
            .strategy(StrategyKind::Bfc)
            .preallocate(preallocate)
            .build()
            .unwrap();
        portalloc::strategy::build(&config, device as Arc<dyn Device>).unwrap()
    }

    #[test]
    fn a_portalloc_allocation_works_as_a_cudarc_slice_without_double_free() {
        let built = crate::support::driver("fakecuda");
        let dir = std::env::temp_dir().join(format!("portalloc-cudarc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libcuda.so");
        std::fs::copy(built, &lib).unwrap();
        // The child's test name: this module's path without the crate's name (`cuda::` in
        // the suite), then `child`.
        let module = module_path!().split_once("::").map_or("", |(_, m)| m);
        let child = format!("{module}::child");
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &child, "--ignored", "--nocapture"])
            .env(CHILD, "1")
            .env("LD_LIBRARY_PATH", &dir)
            .env("PORTALLOC_CUDA_LIBRARY", &lib)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "the child failed:\n{text}");
        assert!(
            text.contains("cudarc interop: ok"),
            "the child did not run:\n{text}"
        );
    }

    /// A portalloc device made from cudarc's context, used with cudarc's own streams
    /// (`new_stream`: `cuStreamCreate` inside cudarc, never registered with portalloc); a slice
    /// owned by a struct (no borrow of the allocator) and freed by drop on its stream, while
    /// the caller's work on that stream is held in flight: another stream is not handed the
    /// memory before that work completes.
    fn cudarc_streams(fake: &Fake, ctx: &Arc<cudarc::driver::CudaContext>) {
        struct Layer {
            weights: PortallocSlice<f32>,
        }
        let device = Arc::new(CudaDevice::from_cudarc(ctx).expect("the primary context"));
        let allocator: Arc<dyn Allocator> = Arc::from(bfc(device, true));
        let (s, t) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
        let keep = PortallocSlice::<u8>::alloc(&allocator, 4096, &t).unwrap();
        let layer = Layer {
            weights: PortallocSlice::alloc(&allocator, 1 << 18, &s).unwrap(),
        };
        let freed = layer.weights.buffer().ptr();
        fake.hold_events(true);
        // The caller's kernel on S, still running: an event of its own, recorded with the
        // driver's own calls.
        type Create = unsafe extern "C" fn(*mut *mut std::ffi::c_void, u32) -> i32;
        type Record = unsafe extern "C" fn(*mut std::ffi::c_void, *mut std::ffi::c_void) -> i32;
        type One = unsafe extern "C" fn(*mut std::ffi::c_void) -> i32;
        // The signatures fakecuda.c gives these driver calls.
        let (create, record, query, destroy) = (
            fake.sym::<Create>("cuEventCreate"),
            fake.sym::<Record>("cuEventRecord"),
            fake.sym::<One>("cuEventQuery"),
            fake.sym::<One>("cuEventDestroy_v2"),
        );
        let mut work = std::ptr::null_mut();
        // SAFETY: one handle written; a live event on cudarc's live stream.
        unsafe {
            assert_eq!(create(&mut work, 2), 0);
            assert_eq!(record(work, s.cu_stream().cast()), 0);
        }
        drop(layer);
        let other = PortallocSlice::<f32>::alloc(&allocator, 1 << 18, &t).unwrap();
        // SAFETY: the caller's live event.
        let done = unsafe { query(work) } == 0;
        assert!(
            other.buffer().ptr() != freed || done,
            "memory freed on cudarc's stream S was handed to T while S's work is in flight"
        );
        let again = PortallocSlice::<f32>::alloc(&allocator, 1 << 18, &s).unwrap();
        assert_eq!(again.buffer().ptr(), freed, "S reuses its own free at once");
        fake.hold_events(false);
        drop((keep, other, again));
        // SAFETY: the caller's live event, destroyed once.
        assert_eq!(unsafe { destroy(work) }, 0);
        s.synchronize().unwrap();
        t.synchronize().unwrap();
        drop((s, t));
        assert_eq!(allocator.stats().bytes_in_use, 0);
    }

    /// Run by the test above in a child process; does nothing when run directly.
    #[test]
    #[ignore = "the child process of cuda::cudarc_interop::a_portalloc_allocation_works_as_a_cudarc_slice_without_double_free (cargo test --all-features --test suite cuda::cudarc_interop), which runs it with --ignored --exact and PORTALLOC_TEST_CUDARC_CHILD set"]
    fn child() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        let path = PathBuf::from(std::env::var("PORTALLOC_CUDA_LIBRARY").unwrap());
        let fake = Fake::at(path);
        fake.configure(1, 64 * MIB, 0, 0);
        let device =
            Arc::new(CudaDevice::open(Arc::new(Driver::load_default().unwrap()), 0).unwrap());
        let allocator = bfc(device, false);

        let ctx = cudarc::driver::CudaContext::new(0).unwrap();
        assert_eq!(
            fake.live("contexts"),
            2,
            "cudarc and portalloc share the primary context"
        );
        let stream = ctx.default_stream();
        // SAFETY: compared only, while `stream` lives.
        assert_eq!(unsafe { stream_of(&stream) }, Stream::DEFAULT);
        let allocator: Arc<dyn Allocator> = Arc::from(allocator);
        let host: Vec<f32> = (0..4096).map(|i| i as f32 * 0.5).collect();
        let mut buffer = PortallocSlice::<f32>::alloc(&allocator, host.len(), &stream).unwrap();
        assert_eq!(buffer.len(), host.len());
        stream.memcpy_htod(&host, buffer.as_slice_mut()).unwrap();
        assert_eq!(stream.clone_dtoh(buffer.as_slice()).unwrap(), host);
        assert_eq!(stream.clone_dtoh(&buffer.view()).unwrap(), host);
        let allocations_before = fake.live("allocations");
        let (taken, taken_stream) = buffer.into_parts();
        assert_eq!(
            fake.live("allocations"),
            allocations_before,
            "cudarc freed nothing"
        );
        // Too small to lend: refused, and the buffer comes back.
        let refused = PortallocSlice::<f64>::lend(taken, 1 << 20, &stream).unwrap_err();
        let (error, taken) = *refused;
        assert!(matches!(error, Error::InvalidArgument { .. }), "{error}");
        // Lent on another stream than its own: refused too — cudarc orders its work before
        // the slice's stream, and the buffer is freed on its own.
        let other = ctx.new_stream().unwrap();
        let refused = PortallocSlice::<f32>::lend(taken, 16, &other).unwrap_err();
        let (error, taken) = *refused;
        assert!(
            error.to_string().contains("lend it on its own stream"),
            "{error}"
        );
        taken.free().unwrap();
        drop((taken_stream, other));
        // Dropping a slice hands it back to portalloc once.
        let slice = PortallocSlice::<u8>::alloc(&allocator, 1000, &stream).unwrap();
        drop(slice);
        assert_eq!(allocator.stats().bytes_in_use, 0);
        stream.synchronize().unwrap();
        drop(stream);
        drop(allocator);
        cudarc_streams(&fake, &ctx);
        drop(ctx);
        fake.assert_empty();
        println!("cudarc interop: ok");
    }
}
