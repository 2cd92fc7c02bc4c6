//! The HIP backend without a GPU:
//!
//! * **layouts**: every bound struct's size and field offsets against the header values
//!   (HIP 5.2.3 for what is generated; ROCm 6/7 for what is transcribed by hand);
//! * **AMD's real runtime** (Debian's `libamdhip64.so.5`, HIP 5.2.3, fetched by
//!   `scripts/fetch-vendor-runtimes`; `PORTALLOC_TEST_HIP_LIBRARY`, with its dependencies on
//!   `LD_LIBRARY_PATH`): it loads, every required symbol resolves, and "no device" is a typed
//!   error with HIP's own name;
//! * **the conformance driver** `fakes/drivers/fakehip.c` (built by the test kit
//!   `portalloc-fakes`): the capability gates per ROCm personality, the tuning notes, the
//!   release probe at open under ROCm 7's reservation hold (`FAKEHIP_PROFILE` /
//!   `fakehip_set_profile`), error mapping, fault injection, and the strategies through
//!   `portalloc::strategy::build` over a `HipDevice`, with every handle given back at the end.
//!
//! Tests that load a library (or set environment variables) hold one lock: the fake keeps
//! its state per process.
#![cfg(feature = "hip")]

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::support::common::{assert_chosen, discover_with, driver_failure};
use portalloc::backends::hip::{tuning, HipDevice, HipVersion, MemoryKind, Runtime};
use portalloc::device::{Device, Stream};
use portalloc::sys::hip as sys;
use portalloc::{Config, Error, StrategyKind, Vendor};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

// ----- layouts ---------------------------------------------------------------------------

#[test]
fn struct_layouts_match_the_headers() {
    use std::mem::size_of;
    // HIP 5.2.3 hip_runtime_api.h (generated; bindgen also asserts these at compile time).
    crate::assert_layout!(sys::hipMemLocation, size 8; type_ @ 0, id @ 4);
    crate::assert_layout!(sys::hipMemAccessDesc, size 12; location @ 0, flags @ 8);
    crate::assert_layout!(sys::hipMemPoolProps, size 88, align 8;
        allocType @ 0, handleTypes @ 4, location @ 8, win32SecurityAttributes @ 16, reserved @ 24);
    // ROCm 6/7 hipMemAllocationProp: type, a handle-type union, location, win32 metadata,
    // and a 4-byte allocFlags struct (not CUDA's layout, nor HIP 5.2.3's).
    crate::assert_layout!(sys::hipMemAllocationProp, size 32, align 8;
        type_ @ 0, handleType @ 4, location @ 8, win32HandleMetaData @ 16, allocFlags @ 24);
    crate::assert_layout!(sys::hipMemAllocationProp_handleType, size 4);
    crate::assert_layout!(sys::hipMemAllocationProp_allocFlags, size 4;
        compressionType @ 0, gpuDirectRDMACapable @ 1, usage @ 2);
    // Device properties: only gcnArchName is read, at its verified offset.
    crate::assert_layout!(sys::hipDeviceProp_tR0600, size 1472, align 8; gcnArchName @ 1160);
    crate::assert_layout!(sys::hipDeviceProp_tR0000, size 792; gcnArchName @ 396);
    // Opaque handles are pointers.
    crate::assert_layout!(sys::hipStream_t, size size_of::<usize>());
    crate::assert_layout!(sys::hipMemGenericAllocationHandle_t, size size_of::<usize>());
}

#[test]
fn attribute_and_error_numbers_are_hips() {
    crate::assert_values!(
        sys::hipDeviceAttributeIntegrated = 16,
        sys::hipDeviceAttributeWarpSize = 87,
        sys::hipDeviceAttributeMemoryPoolsSupported = 88,
        sys::hipDeviceAttributeVirtualMemoryManagementSupported = 89,
        sys::hipSuccess = 0,
        sys::hipErrorOutOfMemory = 2,
        sys::hipErrorNoDevice = 100,
        sys::hipErrorInvalidDevice = 101,
        sys::hipErrorNotReady = 600,
        sys::hipErrorNotSupported = 801,
        sys::hipMemPoolAttrReleaseThreshold = 4,
        sys::hipMemPoolAttrUsedMemHigh = 8,
        sys::hipDeviceMallocFinegrained = 1,
        sys::hipDeviceMallocUncached = 3,
    );
    assert_eq!(
        sys::HIP_VERSION,
        50_221_153,
        "bindings generated from HIP 5.2.3"
    );
}

#[test]
fn tuning_decisions() {
    let v = |major, minor| HipVersion(major * 10_000_000 + minor * 100_000);
    assert!(tuning::vmm_gate(v(7, 0), Some(1), true).on);
    assert!(!tuning::vmm_gate(v(7, 0), Some(0), true).on);
    assert!(!tuning::vmm_gate(v(7, 0), Some(1), false).on);
    let six = tuning::vmm_gate(v(6, 4), Some(1), true);
    assert!(!six.on);
    assert!(
        six.reason.contains("6.4.0") && six.reason.contains("ROCm 7"),
        "{}",
        six.reason
    );
    assert!(!tuning::vmm_gate(v(5, 2), None, true).on);
    assert!(tuning::pool_gate(Some(1), true).on);
    assert!(!tuning::pool_gate(Some(0), true).on);
    assert!(!tuning::pool_gate(Some(1), false).on);
    assert_eq!(tuning::chunk_size(Some(4 * KIB), Some(2 * MIB)).0, 2 * MIB);
    assert_eq!(tuning::chunk_size(Some(4 * KIB), Some(64 * KIB)).0, 2 * MIB);
    assert_eq!(tuning::chunk_size(Some(4 * KIB), Some(4 * KIB)).0, 2 * MIB);
    assert_eq!(tuning::chunk_size(Some(2 * MIB), Some(4 * MIB)).0, 4 * MIB);
    assert_eq!(tuning::chunk_size(None, None).0, 2 * MIB);
    assert_eq!(tuning::arch_short("gfx942:sramecc+:xnack-"), "gfx942");
    assert_eq!(tuning::arch_xnack("gfx90a:xnack+"), Some(true));
    assert_eq!(tuning::arch_xnack("gfx1100"), None);
    assert!(tuning::apu_note(Some(1)).0);
    assert!(!tuning::apu_note(Some(0)).0);
    assert_eq!(
        MemoryKind::parse("fine-grained"),
        Some(MemoryKind::FineGrained)
    );
    assert_eq!(MemoryKind::parse("FINE"), Some(MemoryKind::FineGrained));
    assert_eq!(MemoryKind::parse("uncached").unwrap().flags(), Some(3));
    assert_eq!(MemoryKind::Coarse.flags(), None);
    assert_eq!(MemoryKind::parse("bogus"), None);
}

// ----- AMD's real runtime (HIP 5.2.3, no GPU) --------------------------------------------

/// Debian's libamdhip64 (HIP 5.2.3), where `scripts/fetch-vendor-runtimes` fetched it.
fn real_runtime() -> Option<String> {
    crate::support::vendor_runtime("PORTALLOC_TEST_HIP_LIBRARY")
}

#[test]
fn real_runtime_resolves_every_hip_523_symbol() {
    let _guard = lock();
    let Some(path) = real_runtime() else { return };
    let runtime = Runtime::load(std::slice::from_ref(&path)).unwrap_or_else(|e| {
        panic!("{e}\n(its dependencies must be on LD_LIBRARY_PATH: `. .vendor/env; export LD_LIBRARY_PATH=$PORTALLOC_TEST_LIBRARY_PATH`)")
    });
    let absent: Vec<&str> = runtime
        .symbols()
        .into_iter()
        .filter(|&(_, found)| !found)
        .map(|(name, _)| name)
        .collect();
    eprintln!("{path}: absent newer symbols: {absent:?}");
    assert!(runtime.has_vmm_symbols(), "HIP 5.1+ exports the VMM calls");
    assert!(
        runtime.has_pool_symbols(),
        "HIP 5.1+ exports the pool calls"
    );
    assert!(
        runtime.has_pinned_host_symbols(),
        "HIP 4.2+ exports hipHostMalloc / hipHostFree"
    );
    assert_eq!(
        absent,
        ["hipGetDevicePropertiesR0600"],
        "only ROCm 6's R0600 is newer"
    );
    let version = runtime
        .version()
        .expect("hipRuntimeGetVersion answers without a device");
    assert_eq!(
        (version.major(), version.minor()),
        (5, 2),
        "Debian ships HIP 5.2.3"
    );
}

#[test]
fn real_runtime_reports_no_device_with_hips_name() {
    let _guard = lock();
    let Some(path) = real_runtime() else { return };
    let runtime = Arc::new(Runtime::load(&[path]).unwrap());
    let e = match runtime.device_count() {
        Ok(n) => {
            eprintln!("a GPU is present ({n} device(s)): the no-device checks do not apply");
            return;
        }
        failed => driver_failure(failed),
    };
    assert_eq!(
        (e.backend, e.call, e.code, e.name.as_str()),
        ("hip", "hipGetDeviceCount", 100, "hipErrorNoDevice")
    );
    assert!(!e.message.is_empty());
    // Opening a device fails cleanly.
    let e = driver_failure(HipDevice::open(Arc::clone(&runtime), 0));
    assert_eq!((e.name.as_str(), e.code), ("hipErrorNoDevice", 100));
    // Discovery forced to hip says why; unforced it falls back to the host.
    let forced = Config::builder()
        .ignore_env()
        .backend(Some(Vendor::Hip))
        .hip_library(runtime.path().to_string())
        .build()
        .unwrap();
    let err = portalloc::discover(&forced).unwrap_err();
    assert!(
        matches!(err, Error::NoDevice(ref m) if m.contains("hipErrorNoDevice")),
        "{err}"
    );
}

// ----- the conformance driver ------------------------------------------------------------

/// The fake runtime — the shared harness (`crate::support::fakes`: faults, call and live counts,
/// peers, event holding) over the built library every test here loads, and what only fakehip
/// has — with the test lock: the fake keeps its state per process.
struct Fake {
    fake: crate::support::fakes::Fake,
    _guard: MutexGuard<'static, ()>,
}

impl std::ops::Deref for Fake {
    type Target = crate::support::fakes::Fake;

    fn deref(&self) -> &crate::support::fakes::Fake {
        &self.fake
    }
}

impl Fake {
    /// The built fakehip, reset, with the test lock held until dropped.
    fn new() -> Fake {
        let guard = lock();
        let fake = Fake {
            fake: crate::support::fakes::Fake::at(crate::support::driver("fakehip")),
            _guard: guard,
        };
        fake.call0("fakehip_reset");
        fake
    }

    fn call0(&self, name: &str) {
        let f: unsafe extern "C" fn() = self.sym(name);
        // SAFETY: a control function without arguments.
        unsafe { f() }
    }

    fn version(&self, v: i32) -> &Self {
        let f: unsafe extern "C" fn(c_int) = self.sym("fakehip_set_version");
        // SAFETY: by value.
        unsafe { f(v) };
        self
    }

    /// `fakehip_set_profile`: behave as the comma-separated profiles `names` from now on.
    fn profile(&self, names: &str) -> &Self {
        let f: unsafe extern "C" fn(*const std::ffi::c_char) -> c_int =
            self.sym("fakehip_set_profile");
        let c = std::ffi::CString::new(names).unwrap();
        // SAFETY: a NUL-terminated list the fake reads during the call.
        assert_eq!(unsafe { f(c.as_ptr()) }, 0, "fakehip knows {names:?}");
        self
    }

    /// `fakehip_held_bytes`: bytes still charged for released handles no mapping holds.
    fn held(&self) -> u64 {
        let f: unsafe extern "C" fn() -> u64 = self.sym("fakehip_held_bytes");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    fn devices(&self, n: i32, capacity: u64) -> &Self {
        self.set_devices(n, capacity);
        self
    }

    fn attribute(&self, attr: i32, value: i32) -> &Self {
        let f: unsafe extern "C" fn(c_int, c_int) = self.sym("fakehip_set_attribute");
        // SAFETY: by value.
        unsafe { f(attr, value) };
        self
    }

    fn granularity(&self, minimum: u64, recommended: u64) -> &Self {
        let f: unsafe extern "C" fn(u64, u64) = self.sym("fakehip_set_granularity");
        // SAFETY: by value.
        unsafe { f(minimum, recommended) };
        self
    }

    fn device_used(&self, device: i32) -> u64 {
        let f: unsafe extern "C" fn(c_int) -> u64 = self.sym("fakehip_device_used");
        // SAFETY: by value.
        unsafe { f(device) }
    }

    fn last_malloc_flags(&self) -> u32 {
        let f: unsafe extern "C" fn() -> u32 = self.sym("fakehip_last_malloc_flags");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    fn last_device(&self) -> i32 {
        let f: unsafe extern "C" fn() -> c_int = self.sym("fakehip_last_device");
        // SAFETY: no arguments.
        unsafe { f() }
    }

    fn runtime(&self) -> Arc<Runtime> {
        Arc::new(Runtime::load(&[self.path()]).expect("fakehip loads"))
    }

    /// Runs `test` on device 0 of the fake; once it is done and the device dropped, the fake
    /// must hold nothing.
    fn with_device(test: impl FnOnce(&Fake, &HipDevice)) {
        let fake = Fake::new();
        let device = fake.open(0);
        test(&fake, &device);
        drop(device);
        fake.assert_empty();
    }

    fn open(&self, ordinal: u32) -> HipDevice {
        HipDevice::open(self.runtime(), ordinal).expect("open a fake device")
    }
}

fn note<'a>(device: &'a HipDevice, key: &str) -> &'a str {
    device
        .info()
        .notes
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no note {key:?} in {:?}", device.info().notes))
}

const ROCM5: i32 = crate::support::targets::Rocm::V5.version();
const ROCM6: i32 = crate::support::targets::Rocm::V6.version();
const ROCM7: i32 = crate::support::targets::Rocm::V7.version();

#[test]
fn rocm6_pools_on_vmm_off_even_with_the_attribute() {
    let fake = Fake::new();
    fake.version(ROCM6);
    let device = fake.open(0);
    let info = device.info();
    assert_eq!(info.vendor, Vendor::Hip);
    assert_eq!(info.arch, "gfx942", "from hipGetDevicePropertiesR0600");
    assert!(note(&device, "architecture")
        .contains("gfx942:sramecc+:xnack- (from hipGetDevicePropertiesR0600)"));
    assert!(info.capabilities.stream_ordered_pool);
    assert!(!info.capabilities.virtual_memory, "VMM needs ROCm ≥ 7");
    assert!(device.virtual_memory().is_none());
    let vmm = note(&device, "virtual memory");
    assert!(
        vmm.starts_with("off: HIP 6.2.41133") && vmm.contains("ROCm 7") && vmm.contains("(89) = 1"),
        "{vmm}"
    );
    assert_eq!(info.recommended_granularity, 2 * MIB);
    assert!(note(&device, "chunk size and alignment").starts_with("2 MiB"));
    match device.require_virtual_memory() {
        Err(Error::Unsupported {
            what,
            backend,
            reason,
        }) => {
            assert_eq!((what.as_str(), backend), ("virtual memory", "hip"));
            assert!(
                reason.contains("6.2") && reason.contains("ROCm 7"),
                "{reason}"
            );
        }
        Ok(_) => panic!("VMM must be refused on ROCm 6"),
        Err(e) => panic!("unexpected {e}"),
    }
    let refused = HipDevice::builder()
        .require_virtual_memory(true)
        .open(fake.runtime())
        .unwrap_err();
    assert!(matches!(refused, Error::Unsupported { .. }), "{refused}");
    // The vmm strategy is refused with a typed error too.
    let config = Config::builder()
        .ignore_env()
        .strategy(StrategyKind::Vmm)
        .build()
        .unwrap();
    let err = portalloc::strategy::build(&config, Arc::new(device))
        .err()
        .unwrap();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    fake.assert_empty();
}

#[test]
fn rocm7_vmm_on_with_the_attribute_and_2mib_chunks() {
    let fake = Fake::new();
    fake.version(ROCM7).granularity(4 * KIB, 64 * KIB);
    let device = fake.open(0);
    assert!(device.info().capabilities.virtual_memory);
    assert!(note(&device, "virtual memory").starts_with("on: HIP 7.0.51831"));
    assert_eq!(device.info().min_granularity, 4 * KIB);
    assert_eq!(
        device.info().recommended_granularity,
        2 * MIB,
        "64 KiB raised to the fragment"
    );
    assert!(note(&device, "chunk size and alignment").contains("below the 2 MiB fragment"));
    let vm = device.virtual_memory().unwrap();
    assert_eq!(vm.granularity(), 2 * MIB);

    // A full VMM round trip, checked by the driver's rules (which read the ROCm 6+ props).
    let va = vm.reserve(8 * MIB, 0).unwrap();
    assert_eq!(va % (2 * MIB), 0);
    let h = vm.create_physical(4 * MIB).unwrap();
    vm.map(va, 4 * MIB, h, 0).unwrap();
    vm.set_access(va, 4 * MIB).unwrap();
    assert_eq!(fake.live("mappings"), 1);
    assert!(
        matches!(
            vm.map(va + MIB, 2 * MIB, h, 0),
            Err(Error::InvalidArgument { .. })
        ),
        "misaligned to the 2 MiB chunk"
    );
    vm.release_physical(h).unwrap();
    assert_eq!(
        fake.live("handles"),
        1,
        "a released handle lives while mapped"
    );
    assert!(matches!(
        vm.free_reservation(va, 8 * MIB),
        Err(Error::InvalidArgument { .. })
    ));
    vm.unmap(va, 4 * MIB).unwrap();
    assert_eq!(fake.live("handles"), 0);
    vm.free_reservation(va, 8 * MIB).unwrap();
    assert!(matches!(
        vm.release_physical(h),
        Err(Error::UnknownPointer {
            what: "physical handle",
            ..
        })
    ));
    let big = vm.create_physical(1 << 40).unwrap_err();
    assert!(
        matches!(big, Error::DeviceOutOfMemory { backend: "hip", .. }),
        "{big}"
    );

    // The vmm strategy over the HIP device.
    let config = Config::builder()
        .ignore_env()
        .strategy(StrategyKind::Vmm)
        .mem_fraction(0.5)
        .build()
        .unwrap();
    let device = Arc::new(device);
    let alloc = portalloc::strategy::build(&config, device.clone() as Arc<dyn Device>).unwrap();
    let a = alloc.allocate(3 * MIB, 256, Stream::DEFAULT, "a").unwrap();
    let b = alloc
        .allocate(100 * KIB, 256, Stream::DEFAULT, "b")
        .unwrap();
    assert!(fake.live("mappings") >= 1);
    alloc.deallocate(a).unwrap();
    alloc.deallocate(b).unwrap();
    alloc.trim().unwrap();
    drop(alloc);
    drop(device);
    fake.assert_empty();

    // ROCm 7 without the attribute: off, and says why.
    fake.attribute(89, 0);
    let device = fake.open(0);
    assert!(!device.info().capabilities.virtual_memory);
    assert!(note(&device, "virtual memory").contains("(89) = 0"));
}

/// ROCm 7's hold (fakehip's `rocm7-reservation-hold`, ROCm/legacy-rocm-build#6021): the probe
/// at open finds that a released handle's memory comes back only with its reservation — two
/// releases that give back nothing, then the reservation's free that gives back both — so the
/// device answers true and its note says what vmm does about it; under the documented profile
/// one release gives the granule back and the answer is false. Either way the probe leaves
/// nothing held (fakehip_held_bytes is 0) and the caller's current device as it was.
#[test]
fn release_probe_finds_the_reservation_hold() {
    let fake = Fake::new();
    fake.version(ROCM7).devices(2, 4 * GIB);
    let counted = |fake: &Fake| {
        [
            "hipMemCreate",
            "hipMemRelease",
            "hipMemAddressFree",
            "hipMemGetInfo",
        ]
        .map(|f| fake.calls(f))
    };
    for (profile, holds) in [("rocm7-reservation-hold", true), ("documented", false)] {
        fake.profile(profile).set_current(1);
        let before = counted(&fake);
        let device = fake.open(0);
        assert_eq!(fake.current(), 1, "{profile}: the caller's current device");
        let made: Vec<i64> = counted(&fake)
            .iter()
            .zip(before)
            .map(|(after, before)| after - before)
            .collect();
        let vm = device.virtual_memory().expect("ROCm 7: vmm on");
        assert_eq!(vm.holds_released_memory(), holds, "{profile}");
        let found = note(&device, "released memory");
        if holds {
            assert_eq!(
                found,
                "held until its reservation is freed (probed: releasing an unmapped 2.00 MiB \
                 handle gave back 0 B, then 0 B; freeing the reservation, \
                 with the 2 released handles it held, gave back 4.00 MiB) — \
                 the vmm strategy frees whole segments of 256 MiB that \
                 nothing awake uses and reserves them again at the same \
                 address, so its sleep and trim return memory"
            );
            assert_eq!(made, [2, 2, 1, 6], "two tries, then the reservation");
        } else {
            assert_eq!(
                found,
                "returned at release (probed: releasing an unmapped 2.00 MiB handle gave back \
                 2.00 MiB)"
            );
            assert_eq!(made, [1, 1, 1, 2], "one try");
        }
        assert_eq!(fake.held(), 0, "{profile}: the probe holds nothing");
        assert_eq!(fake.nonzero(crate::support::fakes::MEMORY), [], "{profile}");
        // The answer passes through a wrapper (a `DeviceWrapper` such as the counting device).
        let device = Arc::new(device);
        let counting = portalloc::adaptor::CountingDevice::new(Arc::clone(&device));
        assert_eq!(
            counting.virtual_memory().unwrap().holds_released_memory(),
            holds
        );
        drop((counting, device));
        fake.assert_empty();
    }
    // Without virtual memory (ROCm 6) there is no probe, and no note.
    fake.version(ROCM6);
    let creates = fake.calls("hipMemCreate");
    let device = fake.open(0);
    assert!(device.virtual_memory().is_none());
    assert!(device
        .info()
        .notes
        .iter()
        .all(|(k, _)| k != "released memory"));
    assert_eq!(fake.calls("hipMemCreate"), creates);
}

/// `reserve_at` under ROCm 7's hold: a range whose reservation was freed is reserved again at
/// its address, so vmm can hand back held memory and keep its addresses.
#[test]
fn reserve_at_gets_a_freed_range_back_under_the_hold() {
    let fake = Fake::new();
    fake.version(ROCM7).profile("rocm7-reservation-hold");
    let device = fake.open(0);
    let vm = device.virtual_memory().unwrap();
    assert!(vm.holds_released_memory());
    let g = vm.granularity();
    let va = vm.reserve(2 * g, 0).unwrap();
    let h = vm.create_physical(2 * g).unwrap();
    vm.map(va, 2 * g, h, 0).unwrap();
    vm.set_access(va, 2 * g).unwrap();
    vm.unmap(va, 2 * g).unwrap();
    vm.release_physical(h).unwrap();
    assert_eq!(fake.held(), 2 * g, "held while reserved");
    vm.free_reservation(va, 2 * g).unwrap();
    assert_eq!(fake.held(), 0, "given back with the reservation");
    assert_eq!(
        vm.reserve_at(2 * g, 0, va).unwrap(),
        va,
        "the same addresses"
    );
    vm.free_reservation(va, 2 * g).unwrap();
    drop(device);
    fake.assert_empty();
}

#[test]
fn rocm5_no_vmm_arch_from_the_5x_properties_and_no_uncached() {
    let fake = Fake::new();
    fake.version(ROCM5);
    let device = fake.open(0);
    assert!(!device.info().capabilities.virtual_memory);
    assert!(
        note(&device, "virtual memory").contains("not answered"),
        "no attribute 89 in 5.2.3"
    );
    assert_eq!(device.info().arch, "gfx942");
    assert!(note(&device, "architecture").contains("hipGetDeviceProperties (HIP 5.x layout)"));
    assert_eq!(
        fake.calls("hipGetDevicePropertiesR0600"),
        0,
        "never called on 5.x"
    );
    assert_eq!(
        fake.calls("hipMemGetAllocationGranularity"),
        0,
        "VMM off: not queried"
    );
    drop(device);

    // Even a 5.x runtime claiming the attribute gets no VMM.
    fake.attribute(89, 1);
    let device = fake.open(0);
    assert!(!device.info().capabilities.virtual_memory);
    let err = HipDevice::builder()
        .require_virtual_memory(true)
        .open(fake.runtime())
        .unwrap_err();
    match err {
        Error::Unsupported { reason, .. } => {
            assert!(
                reason.contains("5.2.21153") && reason.contains("ROCm 7"),
                "{reason}"
            )
        }
        other => panic!("expected Unsupported, got {other}"),
    }
    let err = HipDevice::builder()
        .memory(MemoryKind::Uncached)
        .open(fake.runtime())
        .unwrap_err();
    assert!(
        matches!(err, Error::Unsupported { ref reason, .. } if reason.contains("ROCm 6")),
        "{err}"
    );

    // Pools only with attribute 88.
    fake.attribute(88, 0);
    let device = fake.open(0);
    assert!(device.stream_ordered_pool().is_none());
    assert!(note(&device, "stream-ordered pools").starts_with("off"));
    let err = HipDevice::builder()
        .require_pools(true)
        .open(fake.runtime())
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
}

#[test]
fn errors_carry_hips_names() {
    Fake::with_device(|fake, device| {
        fake.fail("hipMalloc", 1, 1, sys::hipErrorNotSupported);
        let e = driver_failure(device.alloc(MIB));
        assert_eq!((e.backend, e.call, e.code), ("hip", "hipMalloc", 801));
        assert_eq!(
            (e.name.as_str(), e.message.as_str()),
            ("hipErrorNotSupported", "operation not supported")
        );
        fake.fail("hipMalloc", 1, 1, sys::hipErrorOutOfMemory);
        let err = device.alloc(MIB).unwrap_err();
        assert!(
            matches!(err, Error::DeviceOutOfMemory { backend: "hip", requested, .. } if requested == MIB),
            "{err}"
        );
        assert!(err.is_out_of_memory());
        assert!(matches!(device.alloc(0), Err(Error::InvalidSize { .. })));
        assert!(matches!(
            device.free(0xdead_0000, 16),
            Err(Error::UnknownPointer {
                what: "allocation",
                ..
            })
        ));
        let p = device.alloc(MIB).unwrap();
        assert!(matches!(
            device.free(p, 2 * MIB),
            Err(Error::InvalidArgument { .. })
        ));
        device.free(p, MIB).unwrap();
        assert!(matches!(
            device.free(p, MIB),
            Err(Error::UnknownPointer { .. })
        ));
        // An ordinal out of range names what was found.
        let err = HipDevice::open(fake.runtime(), 3).unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { ref reason, .. } if reason.contains("1 device(s)")),
            "{err}"
        );
        // No device at all: HIP's own error.
        fake.devices(0, GIB);
        let err = HipDevice::open(fake.runtime(), 0).unwrap_err();
        assert!(
            matches!(err, Error::Driver { ref name, code: 100, .. } if name == "hipErrorNoDevice"),
            "{err}"
        );
        // A library that is not HIP.
        match Runtime::load(&["libc.so.6".into()]) {
            Err(Error::MissingSymbol { symbol, .. }) => assert_eq!(symbol, "hipInit"),
            other => panic!("expected MissingSymbol, got {other:?}"),
        }
    });
}

// What every strategy must do on every ROCm personality is the conformance suite's
// (`tests/suite/conformance.rs`, modules `fakehip_rocm5`, `fakehip_rocm6`, `fakehip_rocm7`). Here:
// how the strategies meet HIP's refusals and its pools.

#[test]
fn bfc_backs_off_when_hip_refuses() {
    let fake = Fake::new();
    fake.devices(1, GIB);
    let device = Arc::new(fake.open(0));
    let config = Config::builder()
        .ignore_env()
        .strategy(StrategyKind::Bfc)
        .mem_fraction(0.75)
        .preallocate(false)
        .build()
        .unwrap();
    let alloc = portalloc::strategy::build(&config, device.clone() as Arc<dyn Device>).unwrap();
    // The next two hipMalloc calls answer hipErrorOutOfMemory: bfc backs off and retries.
    let before = fake.calls("hipMalloc");
    fake.fail("hipMalloc", 1, 2, sys::hipErrorOutOfMemory);
    let a = alloc
        .allocate(MIB, 256, Stream::DEFAULT, "after back-off")
        .unwrap();
    assert!(
        fake.calls("hipMalloc") - before >= 3,
        "two refusals, then success"
    );
    fake.clear_faults();
    // The device itself runs out: every hipMalloc refused.
    fake.fail("hipMalloc", 1, -1, sys::hipErrorOutOfMemory);
    let err = alloc
        .allocate(600 * MIB, 256, Stream::DEFAULT, "refused")
        .unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    fake.clear_faults();
    alloc.deallocate(a).unwrap();
    alloc.trim().unwrap();
    drop(alloc);
    drop(device);
    fake.assert_empty();
}

/// With the process's shared default pool, the device sets its own threshold while it lives
/// and gives the pool back as it found it: the next user of the pool (PyTorch, another
/// library) does not inherit portalloc's release threshold.
#[test]
fn the_shared_default_pool_gets_its_threshold_back() {
    let fake = Fake::new();
    let get_default: unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int =
        fake.sym("hipDeviceGetDefaultMemPool");
    let get_attribute: unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int =
        fake.sym("hipMemPoolGetAttribute");
    let threshold_of_default = || {
        let (mut pool, mut bytes) = (ptr::null_mut(), 0u64);
        // SAFETY: valid outputs; attribute 4 (the release threshold) is a uint64_t.
        unsafe {
            assert_eq!(get_default(&mut pool, 0), 0);
            assert_eq!(get_attribute(pool, 4, (&mut bytes as *mut u64).cast()), 0);
        }
        bytes
    };
    let before = threshold_of_default();
    let device = HipDevice::builder()
        .default_pool(true)
        .open(fake.runtime())
        .unwrap();
    let pool = device.stream_ordered_pool().expect("pools on");
    pool.set_release_threshold(48 * MIB).unwrap();
    assert_eq!(
        threshold_of_default(),
        48 * MIB,
        "the device uses the shared pool"
    );
    drop(device);
    assert_eq!(
        threshold_of_default(),
        before,
        "the shared pool's threshold is given back"
    );
}

#[test]
fn pool_threshold_is_set_explicitly_and_memory_comes_back() {
    Fake::with_device(|fake, device| {
        let pool = device.stream_ordered_pool().expect("pools on");
        // The fake's pools start at "never release" (the ROCm quirk); portalloc sets 0.
        assert_eq!(pool.release_threshold().unwrap(), 0);
        assert!(fake.calls("hipMemPoolSetAttribute") >= 1);
        assert_eq!(fake.live("pools"), 1, "a pool of its own");
        let s = device.create_stream().unwrap();
        let a = pool.alloc_async(3 * MIB, s).unwrap();
        let b = pool.alloc_async(MIB, Stream::DEFAULT).unwrap();
        let usage = pool.usage().unwrap();
        assert_eq!(usage.used_current, 4 * MIB);
        pool.free_async(a, s).unwrap();
        pool.set_release_threshold(2 * MIB).unwrap();
        assert_eq!(pool.release_threshold().unwrap(), 2 * MIB);
        device.synchronize_stream(s).unwrap();
        let usage = pool.usage().unwrap();
        // Blocks go back whole, as the drivers' pools give them: the freed 3 MiB block leaves
        // the pool holding less than the threshold, not exactly it.
        assert_eq!(
            (usage.used_current, usage.reserved_current),
            (MIB, MIB),
            "released to at most the threshold"
        );
        pool.trim_to(0).unwrap();
        assert_eq!(
            pool.usage().unwrap().reserved_current,
            MIB,
            "what is in use stays"
        );
        assert!(matches!(
            pool.free_async(0x1234, s),
            Err(Error::UnknownPointer {
                what: "pool allocation",
                ..
            })
        ));
        fake.fail("hipMallocFromPoolAsync", 1, 1, sys::hipErrorOutOfMemory);
        assert!(pool.alloc_async(MIB, s).unwrap_err().is_out_of_memory());
        pool.free_async(b, Stream::DEFAULT).unwrap();
        // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
        unsafe { device.destroy_stream(s) }.unwrap();
        // The async strategy over this pool: the conformance suite, `fakehip_rocm*::async_pool`.
    });
}

#[test]
fn streams_and_events_follow_the_runtime() {
    let fake = Fake::new();
    let device = fake.open(0);
    // hipErrorNotReady is "not yet": an event held in flight is not complete.
    fake.check_streams_and_events(&device, |_, e| {
        // A stream handle is the caller's: portalloc passes it on, and HIP judges it (clr:
        // a stream `hip::isValid` does not know is hipErrorContextIsDestroyed).
        assert!(matches!(
            device.record_event(e, crate::support::stream(0x77)),
            Err(Error::Driver { ref name, .. }) if name == "hipErrorContextIsDestroyed"
        ));
    });
    // Leaks are given back when the device goes — but for a stream made with create_stream
    // and never destroyed: its handle may still be in use (a `Stream` is a copy), so it stays
    // live for the process, and works for the next device.
    let stream = device.create_stream().unwrap();
    let _leaked_event = device.create_event().unwrap();
    let _leaked = device.alloc(MIB).unwrap();
    drop(device);
    assert_eq!(fake.nonzero(crate::support::fakes::LIVE), [("streams", 1)]);
    fake.open(0).synchronize_stream(stream).unwrap();
}

#[test]
fn each_device_is_made_current_on_the_calling_thread() {
    let fake = Fake::new();
    fake.devices(2, 4 * GIB);
    let runtime = fake.runtime();
    let d0 = Arc::new(HipDevice::open(Arc::clone(&runtime), 0).unwrap());
    let d1 = Arc::new(HipDevice::open(Arc::clone(&runtime), 1).unwrap());
    assert_eq!(d1.info().ordinal, 1);
    assert_eq!(d1.info().name, "AMD Instinct MI300X");
    let p1 = {
        let d1 = Arc::clone(&d1);
        std::thread::spawn(move || d1.alloc(8 * MIB).unwrap())
            .join()
            .unwrap()
    };
    assert_eq!(fake.last_device(), 1);
    let p0 = d0.alloc(MIB).unwrap();
    assert_eq!(fake.last_device(), 0);
    assert_eq!((fake.device_used(0), fake.device_used(1)), (MIB, 8 * MIB));
    // A thread whose current device is 0 frees on device 1 correctly.
    runtime.set_device(0).unwrap();
    assert_eq!(d1.mem_info().unwrap().free, 4 * GIB - 8 * MIB);
    d1.free(p1, 8 * MIB).unwrap();
    d0.free(p0, MIB).unwrap();
    drop((d0, d1));
    fake.assert_empty();
}

#[test]
fn tuning_is_visible_in_the_device_info() {
    let fake = Fake::new();
    // Fine-grained memory on request.
    let device = HipDevice::builder()
        .memory(MemoryKind::FineGrained)
        .open(fake.runtime())
        .unwrap();
    let p = device.alloc(MIB).unwrap();
    assert_eq!(fake.last_malloc_flags(), sys::hipDeviceMallocFinegrained);
    device.free(p, MIB).unwrap();
    assert!(note(&device, "memory").starts_with("fine-grained (hipExtMallocWithFlags"));
    drop(device);
    // Coarse by default.
    let device = fake.open(0);
    let p = device.alloc(MIB).unwrap();
    assert_eq!(
        fake.calls("hipExtMallocWithFlags"),
        1,
        "only the fine-grained one above"
    );
    device.free(p, MIB).unwrap();
    assert!(note(&device, "memory").starts_with("coarse-grained (hipMalloc)"));
    assert!(note(&device, "apu").starts_with("no"));
    assert!(note(&device, "stream-ordered pools").contains("release threshold is set explicitly"));
    drop(device);
    // An APU, with XNACK on.
    fake.attribute(16, 1);
    let device = portalloc::backends::hip::HipDeviceBuilder::new()
        .hsa_xnack(Some(true))
        .open(fake.runtime())
        .unwrap();
    assert!(device.info().name.contains("MI300A"));
    assert!(note(&device, "apu").starts_with("yes"));
    let xnack = note(&device, "xnack");
    assert!(
        xnack.contains("HSA_XNACK=1") && xnack.contains("xnack-"),
        "{xnack}"
    );
    // PORTALLOC_HIP_MEMORY picks the kind for discovery; a bad value is a Config error
    // naming it and its value: tests/hermetic.rs (`HipDeviceBuilder::from_env` with
    // PORTALLOC_HIP_MEMORY=fast), the binary whose tests set the process environment.
}

#[test]
fn discovery_chooses_hip_when_it_finds_devices() {
    let fake = Fake::new();
    fake.devices(2, 8 * GIB);
    let p = discover_with(&[
        ("PORTALLOC_HIP_LIBRARY", &fake.path()),
        ("PORTALLOC_CUDA_LIBRARY", "/nonexistent/libcuda.so.1"),
    ]);
    assert_chosen(&p, Vendor::Hip, 2);
    let a = p
        .allocator(1)
        .unwrap()
        .allocate(MIB, 256, Stream::DEFAULT, "x")
        .unwrap();
    assert!(fake.device_used(1) >= MIB);
    p.allocator(1).unwrap().deallocate(a).unwrap();
    drop(p);
    fake.assert_empty();
}

#[test]
fn discovery_with_cuda_and_hip_runtimes_follows_the_documented_order() {
    let fake = Fake::new();
    let cuda = crate::support::driver("fakecuda");
    let both = || {
        Config::builder()
            .ignore_env()
            .hip_library(fake.path())
            .cuda_library(cuda.to_string())
    };
    let found = portalloc::discover(&both().build().unwrap());
    let forced = both().backend(Some(Vendor::Hip)).build().unwrap();
    let chosen_hip = portalloc::discover(&forced);
    let decision = |d: &portalloc::Discovery, v: Vendor| {
        d.candidates
            .iter()
            .find(|c| c.backend == v)
            .map(|c| c.decision.clone())
            .unwrap()
    };
    use portalloc::discover::Decision;
    // Both found; CUDA comes first in the documented order, and HIP says why it was passed.
    let found = found.unwrap();
    assert_eq!(found.chosen, Vendor::Cuda);
    assert_eq!(
        decision(&found, Vendor::Hip),
        Decision::Passed("cuda was chosen first".into())
    );
    assert!(found
        .candidates
        .iter()
        .all(|c| c.backend == Vendor::Host || c.probe.as_ref().unwrap().device_count == 1));
    drop(found);
    // PORTALLOC_BACKEND=hip (here the builder) picks HIP and skips CUDA, saying so.
    let chosen_hip = chosen_hip.unwrap();
    assert_eq!(chosen_hip.chosen, Vendor::Hip);
    assert_eq!(chosen_hip.devices[0].info().vendor, Vendor::Hip);
    assert!(
        matches!(decision(&chosen_hip, Vendor::Cuda), Decision::Skipped(ref why) if why.contains("forces hip"))
    );
    drop(chosen_hip);
    fake.assert_empty();
}
