//! ROCm as it behaves: fakehip's profiles (`fakes/drivers/fakehip.c`'s header says what each
//! models, from which report) and the address hint of both fakes' reserve calls, checked at the
//! drivers' own door (their exported vendor calls, raw); then vmm, trim and sleep under every
//! profile, measured by what the driver itself counts free (`hipMemGetInfo`, through
//! `Device::mem_info`), never by portalloc's books: a released handle the driver still holds
//! is memory the caller does not have.
#![cfg(feature = "hip")]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

use portalloc::backends::hip::HipDevice;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator, Device, Keep, Stream, Vendor};
use test_case::test_case;

use crate::support::fakes::{Fake, FakeDevice, FAKEHIP_PROFILES};
use crate::support::sleep::Workload;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// hipError_t values the checks expect.
const HIP_SUCCESS: c_int = 0;
const HIP_INVALID_VALUE: c_int = 1;
const HIP_OUT_OF_MEMORY: c_int = 2;

/// The ROCm 6+ `hipMemAllocationProp`: pinned memory on device 0.
#[repr(C)]
struct Prop {
    kind: c_int,
    handle_type: c_int,
    location_type: c_int,
    location_id: c_int,
    win32: *mut c_void,
    compression: u8,
    rdma: u8,
    usage: u16,
}

/// `hipMemAccessDesc`: read-write for one device.
#[repr(C)]
struct AccessDesc {
    location_type: c_int,
    device: c_int,
    flags: u32,
}

type Reserve = unsafe extern "C" fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> c_int;
type OnRange = unsafe extern "C" fn(*mut c_void, usize) -> c_int;

/// fakehip (ROCm 7, one 4 GiB device) under a profile, driven by its exported HIP calls.
struct Hip {
    fake: Fake,
}

impl Hip {
    fn new(profile: &str) -> Hip {
        let fake = Fake::with_devices(Vendor::Hip, 1, 4 * GIB);
        fake.set_profile(profile).unwrap();
        Hip { fake }
    }

    /// What `hipMemGetInfo` says is free.
    fn free(&self) -> u64 {
        let f: unsafe extern "C" fn(*mut usize, *mut usize) -> c_int =
            self.fake.sym("hipMemGetInfo");
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: two values written.
        assert_eq!(unsafe { f(&mut free, &mut total) }, HIP_SUCCESS);
        free as u64
    }

    /// `hipMemAddressReserve` with the hint `addr` (0: none).
    fn reserve(&self, size: u64, alignment: u64, addr: u64) -> u64 {
        let f: Reserve = self.fake.sym("hipMemAddressReserve");
        let mut va = std::ptr::null_mut();
        // SAFETY: one address written; the rest by value (the hint is only compared).
        let rc = unsafe {
            f(
                &mut va,
                size as usize,
                alignment as usize,
                addr as *mut c_void,
                0,
            )
        };
        assert_eq!(
            rc, HIP_SUCCESS,
            "hipMemAddressReserve({size:#x}, hint {addr:#x})"
        );
        va as u64
    }

    fn address_free(&self, va: u64, size: u64) -> c_int {
        self.on_range("hipMemAddressFree", va, size)
    }

    fn unmap(&self, va: u64, size: u64) -> c_int {
        self.on_range("hipMemUnmap", va, size)
    }

    fn on_range(&self, name: &str, va: u64, size: u64) -> c_int {
        let f: OnRange = self.fake.sym(name);
        // SAFETY: by value; the fake only looks the range up.
        unsafe { f(va as *mut c_void, size as usize) }
    }

    /// A new physical handle of `size` bytes (`hipMemCreate`).
    fn create(&self, size: u64) -> u64 {
        let f: unsafe extern "C" fn(*mut *mut c_void, usize, *const Prop, u64) -> c_int =
            self.fake.sym("hipMemCreate");
        let prop = Prop {
            kind: 1,
            handle_type: 0,
            location_type: 1,
            location_id: 0,
            win32: std::ptr::null_mut(),
            compression: 0,
            rdma: 0,
            usage: 0,
        };
        let mut h = std::ptr::null_mut();
        // SAFETY: one handle written; the properties read during the call.
        let rc = unsafe { f(&mut h, size as usize, &prop, 0) };
        assert_eq!(rc, HIP_SUCCESS, "hipMemCreate");
        h as u64
    }

    fn release(&self, handle: u64) {
        let f: unsafe extern "C" fn(*mut c_void) -> c_int = self.fake.sym("hipMemRelease");
        // SAFETY: by value.
        let rc = unsafe { f(handle as *mut c_void) };
        assert_eq!(rc, HIP_SUCCESS, "hipMemRelease");
    }

    /// `hipMemMap` of `size` bytes of `handle` from `offset` at `va`.
    fn map(&self, va: u64, size: u64, handle: u64, offset: u64) {
        let f: unsafe extern "C" fn(*mut c_void, usize, usize, *mut c_void, u64) -> c_int =
            self.fake.sym("hipMemMap");
        // SAFETY: by value.
        let rc = unsafe {
            f(
                va as *mut c_void,
                size as usize,
                offset as usize,
                handle as *mut c_void,
                0,
            )
        };
        assert_eq!(rc, HIP_SUCCESS, "hipMemMap({va:#x}, {size:#x})");
    }

    /// `hipMemSetAccess` read-write for device 0.
    fn set_access(&self, va: u64, size: u64) -> c_int {
        let f: unsafe extern "C" fn(*mut c_void, usize, *const AccessDesc, usize) -> c_int =
            self.fake.sym("hipMemSetAccess");
        let desc = AccessDesc {
            location_type: 1,
            device: 0,
            flags: 3,
        };
        // SAFETY: one descriptor read during the call.
        unsafe { f(va as *mut c_void, size as usize, &desc, 1) }
    }

    /// `hipMalloc`: its code, and the pointer on success.
    fn malloc(&self, size: u64) -> (c_int, u64) {
        let f: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int = self.fake.sym("hipMalloc");
        let mut p = std::ptr::null_mut();
        // SAFETY: one pointer written.
        let rc = unsafe { f(&mut p, size as usize) };
        (rc, p as u64)
    }

    fn hip_free(&self, ptr: u64) {
        let f: unsafe extern "C" fn(*mut c_void) -> c_int = self.fake.sym("hipFree");
        // SAFETY: a pointer of hipMalloc's.
        assert_eq!(unsafe { f(ptr as *mut c_void) }, HIP_SUCCESS, "hipFree");
    }

    /// One handle of `size` bytes created, mapped at `va` and given access.
    fn map_new(&self, va: u64, size: u64) -> u64 {
        let h = self.create(size);
        self.map(va, size, h, 0);
        assert_eq!(self.set_access(va, size), HIP_SUCCESS, "hipMemSetAccess");
        h
    }
}

// ---- the profiles themselves ----------------------------------------------------------------

/// `FAKEHIP_PROFILES` is the fake's own list, in its order (`documented` first): a profile
/// added to fakehip.c and not here would escape the conformance checks below.
#[test]
fn the_rust_list_of_profiles_is_the_fakes() {
    let hip = Hip::new("documented");
    let name: unsafe extern "C" fn(c_int) -> *const c_char = hip.fake.sym("fakehip_profile_name");
    let mut names = Vec::new();
    for i in 0.. {
        // SAFETY: by value; NULL past the last, else a static NUL-terminated name.
        let p = unsafe { name(i) };
        if p.is_null() {
            break;
        }
        // SAFETY: see above.
        names.push(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
    }
    assert_eq!(names, FAKEHIP_PROFILES);
}

/// Every profile is accepted alone and with every other; an unknown name is refused and
/// changes nothing — the profile in force before still holds memory back.
#[test]
fn profiles_combine_and_an_unknown_name_changes_nothing() {
    let hip = Hip::new("documented");
    for a in FAKEHIP_PROFILES {
        hip.fake.set_profile(a).unwrap();
        for b in FAKEHIP_PROFILES {
            hip.fake.set_profile(&format!("{a}, {b}")).unwrap();
        }
    }
    hip.fake.set_profile("").unwrap();
    hip.fake.set_profile("rocm7-reservation-hold").unwrap();
    let err = hip
        .fake
        .set_profile("documented,rocm7-reservation-holds")
        .unwrap_err();
    assert!(err.contains("rocm7-reservation-holds"), "{err}");
    assert!(
        hip.fake.set_profile("rocm7").is_err(),
        "a prefix of a name is no name"
    );

    let start = hip.free();
    let va = hip.reserve(8 * MIB, 0, 0);
    let h = hip.map_new(va, 2 * MIB);
    hip.release(h);
    assert_eq!(hip.unmap(va, 2 * MIB), HIP_SUCCESS);
    assert_eq!(start - hip.free(), 2 * MIB, "the hold is still in force");
    assert_eq!(hip.address_free(va, 8 * MIB), HIP_SUCCESS);
    assert_eq!(hip.free(), start);
}

/// The report's sequence — create, map, release, unmap — gives back nothing under
/// `rocm7-reservation-hold` until the reservation is freed; as documented, the unmap of the
/// released handle does. The census shows the held memory, and the reset clears it.
#[test_case("documented", false ; "documented")]
#[test_case("rocm7-reservation-hold", true ; "reservation hold")]
#[test_case("rocm7-reservation-hold,rocr-285-unmap-many", true ; "hold with another")]
fn a_released_handle_waits_for_its_reservation(profile: &str, holds: bool) {
    let hip = Hip::new(profile);
    let start = hip.free();
    let va = hip.reserve(64 * MIB, 0, 0);
    let h = hip.map_new(va, 8 * MIB);
    assert_eq!(start - hip.free(), 8 * MIB, "the handle is charged");
    hip.release(h);
    assert_eq!(
        start - hip.free(),
        8 * MIB,
        "still mapped: kept in every profile"
    );
    assert_eq!(hip.unmap(va, 8 * MIB), HIP_SUCCESS);
    let after_unmap = start - hip.free();
    let held = if holds { 8 * MIB } else { 0 };
    assert_eq!(after_unmap, held, "{profile}: used after the unmap");
    assert_eq!(hip.fake.held_bytes(), held);
    assert_eq!(hip.fake.live("bytes") as u64, held, "the census counts it");
    assert_eq!(hip.fake.live("handles"), i64::from(holds));
    assert_eq!(hip.fake.live("mappings"), 0);
    assert_eq!(hip.address_free(va, 64 * MIB), HIP_SUCCESS);
    assert_eq!(
        hip.free(),
        start,
        "{profile}: the reservation freed gives it all back"
    );
    assert_eq!(hip.fake.held_bytes(), 0);
    hip.fake.assert_empty();

    // Held again, then forgotten by the reset.
    let va = hip.reserve(8 * MIB, 0, 0);
    let h = hip.map_new(va, 2 * MIB);
    hip.release(h);
    assert_eq!(hip.unmap(va, 2 * MIB), HIP_SUCCESS);
    let reset: unsafe extern "C" fn() = hip.fake.sym("fakehip_reset");
    // SAFETY: no arguments.
    unsafe { reset() };
    hip.fake.assert_empty();
    assert_eq!(hip.fake.held_bytes(), 0);
}

/// A handle mapped into two reservations is held until both are freed, whichever goes first.
#[test_case(true ; "first reservation freed first")]
#[test_case(false ; "second reservation freed first")]
fn a_handle_is_held_by_every_reservation_it_was_mapped_into(first_goes_first: bool) {
    let hip = Hip::new("rocm7-reservation-hold");
    let start = hip.free();
    let a = hip.reserve(8 * MIB, 0, 0);
    let b = hip.reserve(8 * MIB, 0, 0);
    let h = hip.create(4 * MIB);
    hip.map(a, 2 * MIB, h, 0);
    hip.map(b, 2 * MIB, h, 2 * MIB);
    hip.release(h);
    assert_eq!(hip.unmap(a, 2 * MIB), HIP_SUCCESS);
    assert_eq!(hip.unmap(b, 2 * MIB), HIP_SUCCESS);
    let (one, other) = if first_goes_first { (a, b) } else { (b, a) };
    assert_eq!(hip.address_free(one, 8 * MIB), HIP_SUCCESS);
    assert_eq!(
        start - hip.free(),
        4 * MIB,
        "the other reservation still holds it"
    );
    assert_eq!(hip.address_free(other, 8 * MIB), HIP_SUCCESS);
    assert_eq!(hip.free(), start);
    hip.fake.assert_empty();
}

/// The hint, in every profile: a freed range is reserved again at its address when asked
/// for; a hint that overlaps a live reservation, or is not aligned, gets another address;
/// a reserve without a hint never gets a freed range back.
#[test]
fn the_address_hint_is_honoured_when_it_can_be_in_every_profile() {
    for profile in FAKEHIP_PROFILES {
        let hip = Hip::new(profile);
        let size = 16 * MIB;
        let first = hip.reserve(size, 0, 0);
        assert_eq!(hip.address_free(first, size), HIP_SUCCESS);
        let again = hip.reserve(size, 0, first);
        assert_eq!(
            again, first,
            "{profile}: a freed range at its address again"
        );

        let overlapping = hip.reserve(size, 0, first + 4 * MIB);
        assert!(
            overlapping + size <= first || first + size <= overlapping,
            "{profile}: a hint over a live reservation gave {overlapping:#x}, over {first:#x}"
        );
        let misaligned = hip.reserve(size, 2 * MIB, first + size + 64 * KIB);
        assert_eq!(
            misaligned % (2 * MIB),
            0,
            "{profile}: the alignment still holds"
        );
        assert_ne!(
            misaligned,
            first + size + 64 * KIB,
            "{profile}: a misaligned hint"
        );

        // Far from anything handed out (a tebibyte below: the system hands out addresses
        // downwards from near the top of the process's address space): honoured, and later
        // reserves without a hint do not land on it.
        let far = first - (1 << 40);
        assert_eq!(
            hip.reserve(size, 0, far),
            far,
            "{profile}: a free hint far away"
        );
        let fresh = hip.reserve(size, 0, 0);
        assert!(
            fresh + size <= far || far + size <= fresh,
            "{profile}: {fresh:#x}"
        );

        for va in [again, overlapping, misaligned, far, fresh] {
            assert_eq!(hip.address_free(va, size), HIP_SUCCESS);
        }
        let hintless = hip.reserve(size, 0, 0);
        for used in [first, overlapping, misaligned, far, fresh] {
            assert!(
                hintless + size <= used || used + size <= hintless,
                "{profile}: a reserve without a hint got a freed range back ({hintless:#x})"
            );
        }
        assert_eq!(hip.address_free(hintless, size), HIP_SUCCESS);
        hip.fake.assert_empty();
    }
}

/// fakecuda honours `cuMemAddressReserve`'s hint by the same rules.
#[cfg(feature = "cuda")]
#[test]
fn fakecuda_honours_the_address_hint() {
    let fake = Fake::copy("fakecuda");
    fake.set_devices(1, GIB);
    let init: unsafe extern "C" fn(u32) -> c_int = fake.sym("cuInit");
    // SAFETY: by value.
    assert_eq!(unsafe { init(0) }, 0, "cuInit");
    let ctx = fake.primary(0);
    fake.set_current(ctx);
    let reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> c_int =
        fake.sym("cuMemAddressReserve");
    let address_free: unsafe extern "C" fn(u64, usize) -> c_int = fake.sym("cuMemAddressFree");
    let at = |size: u64, alignment: u64, hint: u64| -> u64 {
        let mut va = 0;
        // SAFETY: one address written; the rest by value.
        let rc = unsafe { reserve(&mut va, size as usize, alignment as usize, hint, 0) };
        assert_eq!(rc, 0, "cuMemAddressReserve({size:#x}, hint {hint:#x})");
        va
    };
    let free = |va: u64, size: u64| {
        // SAFETY: by value: a range this test reserved, nothing mapped in it.
        let rc = unsafe { address_free(va, size as usize) };
        assert_eq!(rc, 0, "cuMemAddressFree({va:#x}, {size:#x})");
    };
    let size = 8 * MIB;
    let first = at(size, 0, 0);
    free(first, size);
    assert_eq!(
        at(size, 0, first),
        first,
        "a freed range at its address again"
    );
    let overlapping = at(size, 0, first + 2 * MIB);
    assert!(overlapping + size <= first || first + size <= overlapping);
    let misaligned = at(size, 0, first + size + 4 * KIB);
    assert_ne!(misaligned, first + size + 4 * KIB);
    assert_eq!(misaligned % (2 * MIB), 0);
    for va in [first, overlapping, misaligned] {
        free(va, size);
    }
    // Halves of a freed range, each at its address: what is left of it stays the fake's.
    assert_eq!(at(size / 2, 0, first + size / 2), first + size / 2);
    assert_eq!(at(size / 2, 0, first), first);
    free(first, size / 2);
    free(first + size / 2, size / 2);
    let hintless = at(size, 0, 0);
    assert!(
        hintless + size <= first || first + size <= hintless,
        "{hintless:#x}"
    );
    free(hintless, size);
    fake.set_current(0);
    fake.release_primary(0);
    fake.assert_empty();
}

/// rocm-systems#2516: handles of different sizes mapped one after another, access set on
/// each — refused from the second under the profile, as in the report; mappings of one
/// granule each (portalloc's vmm) pass over any run.
#[test_case("documented", false ; "documented")]
#[test_case("rocm-systems-2516-setaccess-prefix", true ; "setaccess prefix")]
fn set_access_sums_the_reservations_mappings_from_its_first(profile: &str, buggy: bool) {
    let hip = Hip::new(profile);
    let reservation = 64 * MIB;
    let va = hip.reserve(reservation, 0, 0);
    // The report's sizes (multiples of the 4 KiB minimum granularity).
    let sizes = [2_379_776u64, 7_864_320, 6_533_120];
    let mut at = va;
    let mut answers = Vec::new();
    let mut handles = Vec::new();
    for &size in &sizes {
        let h = hip.create(size);
        hip.map(at, size, h, 0);
        answers.push(hip.set_access(at, size));
        handles.push(h);
        at += size;
    }
    let expected = if buggy {
        vec![HIP_SUCCESS, HIP_INVALID_VALUE, HIP_INVALID_VALUE]
    } else {
        vec![HIP_SUCCESS; 3]
    };
    assert_eq!(answers, expected, "{profile}");
    // The whole run from the first mapping: a sum of the first k, so it passes.
    assert_eq!(hip.set_access(va, sizes.iter().sum()), HIP_SUCCESS);
    for (&size, &h) in sizes.iter().zip(&handles).rev() {
        at -= size;
        assert_eq!(hip.unmap(at, size), HIP_SUCCESS);
        hip.release(h);
    }

    // One granule per mapping: any run of n granules passes while n are mapped.
    let granule = 2 * MIB;
    let handles: Vec<u64> = (0..4)
        .map(|i| hip.map_new(va + i * granule, granule))
        .collect();
    for (start, n) in [(1, 1), (1, 3), (2, 2), (3, 1), (0, 4)] {
        assert_eq!(
            hip.set_access(va + start * granule, n * granule),
            HIP_SUCCESS,
            "{profile}: granules {start}..{}",
            start + n
        );
    }
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(hip.unmap(va + i as u64 * granule, granule), HIP_SUCCESS);
        hip.release(h);
    }
    assert_eq!(hip.address_free(va, reservation), HIP_SUCCESS);
    hip.fake.assert_empty();
}

/// rocm-systems#7128: a reservation larger than the device is counted as used by the
/// runtime's own counter, so a 32 MiB hipMalloc is refused while hipMemGetInfo says
/// everything is free; physical handles are not counted. Freeing the reservation cures it.
#[test_case("documented", false ; "documented")]
#[test_case("rocm-systems-7128-reserve-counted", true ; "reserve counted")]
fn reservations_count_against_plain_allocations(profile: &str, buggy: bool) {
    let hip = Hip::new(profile);
    let start = hip.free();
    let size = 9 * GIB; // 2 × 4 GiB + 1 GiB, as portalloc's vmm reserves for a 4 GiB budget
    let va = hip.reserve(size, 0, 0);
    assert_eq!(
        hip.free(),
        start,
        "{profile}: hipMemGetInfo does not count it"
    );
    let (rc, p) = hip.malloc(32 * MIB);
    let expected = if buggy {
        HIP_OUT_OF_MEMORY
    } else {
        HIP_SUCCESS
    };
    assert_eq!(rc, expected, "{profile}: hipMalloc beside the reservation");
    if rc == HIP_SUCCESS {
        hip.hip_free(p);
    }
    // hipMemCreate is not checked against that counter.
    let h = hip.map_new(va, 64 * MIB);
    assert_eq!(hip.unmap(va, 64 * MIB), HIP_SUCCESS);
    hip.release(h);
    assert_eq!(hip.address_free(va, size), HIP_SUCCESS);
    let (rc, p) = hip.malloc(32 * MIB);
    assert_eq!(rc, HIP_SUCCESS, "{profile}: the reservation freed");
    hip.hip_free(p);

    // A smaller reservation leaves the rest: 3 GiB reserved, 1 GiB allocatable.
    let va = hip.reserve(3 * GIB, 0, 0);
    let (rc, p) = hip.malloc(GIB);
    assert_eq!(rc, HIP_SUCCESS, "{profile}: what the reservation leaves");
    let (rc2, p2) = hip.malloc(MIB);
    assert_eq!(rc2, expected, "{profile}: past it");
    if rc2 == HIP_SUCCESS {
        hip.hip_free(p2);
    }
    hip.hip_free(p);
    assert_eq!(hip.address_free(va, 3 * GIB), HIP_SUCCESS);
    hip.fake.assert_empty();
}

/// ROCR-Runtime#285: one hipMemUnmap over two mappings leaves the reservation "in use" for
/// ever under the profile; unmapping one mapping per call (portalloc's vmm) frees it.
#[test_case("documented", false ; "documented")]
#[test_case("rocr-285-unmap-many", true ; "unmap many")]
fn one_unmap_over_several_mappings_keeps_the_reservation(profile: &str, buggy: bool) {
    let hip = Hip::new(profile);
    let g = 2 * MIB;
    let va = hip.reserve(8 * MIB, 0, 0);
    let a = hip.map_new(va, g);
    let b = hip.map_new(va + g, g);
    assert_eq!(hip.unmap(va, 2 * g), HIP_SUCCESS, "both in one call");
    hip.release(a);
    hip.release(b);
    let rc = hip.address_free(va, 8 * MIB);
    assert_eq!(
        rc,
        if buggy {
            HIP_INVALID_VALUE
        } else {
            HIP_SUCCESS
        },
        "{profile}: hipMemAddressFree after one unmap of two mappings"
    );
    assert_eq!(hip.fake.live("reservations"), i64::from(buggy));

    let va = hip.reserve(8 * MIB, 0, 0);
    let a = hip.map_new(va, g);
    let b = hip.map_new(va + g, g);
    assert_eq!(hip.unmap(va, g), HIP_SUCCESS);
    assert_eq!(hip.unmap(va + g, g), HIP_SUCCESS);
    hip.release(a);
    hip.release(b);
    assert_eq!(
        hip.address_free(va, 8 * MIB),
        HIP_SUCCESS,
        "{profile}: one per call"
    );
}

// ---- vmm under every profile -----------------------------------------------------------------

/// The device: 4 GiB; vmm's budget 3 GiB.
const CAPACITY: u64 = 4 * GIB;
const LIMIT: u64 = 3 * GIB;

/// vmm over the HIP backend over fakehip as ROCm 7 under `profile`, set before the device
/// opens (so any probe at open sees it). Fields drop in order: vmm, device, then the fake.
struct Subject {
    vmm: VmmAllocator<HipDevice>,
    device: Arc<HipDevice>,
    fake: Fake,
    granule: u64,
}

impl Subject {
    fn new(profile: &str) -> Subject {
        let fake = Fake::with_devices(Vendor::Hip, 1, CAPACITY);
        fake.set_profile(profile).unwrap();
        let device = Arc::new(<HipDevice as FakeDevice>::open(&fake, 0));
        let granule = device
            .virtual_memory()
            .expect("ROCm 7 with the VMM attribute: virtual memory")
            .granularity();
        let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(LIMIT)).unwrap();
        Subject {
            vmm,
            device,
            fake,
            granule,
        }
    }

    /// What the driver says is free.
    fn free(&self) -> u64 {
        self.device.mem_info().unwrap().free
    }
}

/// `got` is within one granule of `want`.
fn near(got: u64, want: u64, granule: u64) -> bool {
    got.abs_diff(want) <= granule
}

/// Runs `check` under every profile, prints each outcome (numbers included), and fails
/// naming every profile that failed.
fn under_every_profile(what: &str, check: impl Fn(&Subject) -> Result<String, String>) {
    let mut failed = Vec::new();
    for profile in FAKEHIP_PROFILES {
        let subject = Subject::new(profile);
        let outcome = check(&subject);
        let calls = format!(
            " [driver calls: {} hipMemAddressReserve, {} hipMemAddressFree, {} hipMemRelease]",
            subject.fake.calls("hipMemAddressReserve"),
            subject.fake.calls("hipMemAddressFree"),
            subject.fake.calls("hipMemRelease")
        );
        match outcome.map(|l| l + &calls).map_err(|l| l + &calls) {
            Ok(line) => eprintln!("{what} under {profile}: ok: {line}"),
            Err(line) => {
                eprintln!("{what} under {profile}: FAILED: {line}");
                failed.push(format!("{profile}: {line}"));
            }
        }
    }
    assert!(failed.is_empty(), "{what}:\n{}", failed.join("\n"));
}

/// 8 × 64 MiB allocated, freed and trimmed: the driver's free memory is back where it
/// started; and once the allocator is dropped the driver holds nothing at all.
#[test]
fn vmm_trim_gives_the_memory_back_under_every_profile() {
    under_every_profile("trim", |s| {
        let start = s.free();
        let allocations: Vec<Allocation> = (0..8)
            .map(|_| s.vmm.allocate(64 * MIB, 0, Stream::DEFAULT, "").unwrap())
            .collect();
        let full = s.free();
        for a in allocations {
            s.vmm.deallocate(a).unwrap();
        }
        let trimmed = s.vmm.trim().unwrap();
        let end = s.free();
        let line = format!(
            "free {} MiB at the start, {} MiB with 512 MiB allocated, {} MiB after free + trim \
             (trim said {} MiB)",
            start / MIB,
            full / MIB,
            end / MIB,
            trimmed / MIB
        );
        if !near(end, start, s.granule) {
            return Err(format!(
                "{line}: {} MiB not given back",
                start.saturating_sub(end) / MIB
            ));
        }
        Ok(line)
    });
}

/// Dropping the allocator gives everything back to the driver: no byte, handle, mapping or
/// reservation left.
#[test]
fn vmm_dropped_leaves_the_driver_empty_under_every_profile() {
    let mut failed = Vec::new();
    for profile in FAKEHIP_PROFILES {
        let Subject {
            vmm, device, fake, ..
        } = Subject::new(profile);
        let a: Vec<Allocation> = [64 * MIB, 3 * MIB / 2, 96 * KIB]
            .iter()
            .map(|&size| vmm.allocate(size, 0, Stream::DEFAULT, "").unwrap())
            .collect();
        for a in a {
            vmm.deallocate(a).unwrap();
        }
        drop(vmm);
        drop(device);
        let held = fake.nonzero(crate::support::fakes::MEMORY);
        eprintln!("drop under {profile}: the driver holds {held:?}");
        if !held.is_empty() {
            failed.push(format!("{profile}: {held:?}"));
        }
    }
    assert!(failed.is_empty(), "after drop:\n{}", failed.join("\n"));
}

/// Sleep of the weights with their contents: the driver's free memory rises by at least 99%
/// of their bytes; the wake maps every allocation again at its address (the driver's own
/// mapping there grants access) and nothing stays asleep; freeing all and trimming gives
/// everything back.
#[test_case(Workload::Large ; "8 x 64 MiB each")]
#[test_case(Workload::Granular ; "32 x 1.5 MiB each")]
#[test_case(Workload::Small ; "200 x 96 to 672 KiB each")]
fn vmm_sleep_and_wake_give_back_and_take_again_under_every_profile(workload: Workload) {
    portalloc::sleep_tags::declare_sleepable("rocm-weights");
    portalloc::sleep_tags::declare_sleepable("rocm-kv");
    let requests = workload.requests("rocm-weights", "rocm-kv");
    let weights: u64 = requests
        .iter()
        .filter(|(tag, _)| *tag == "rocm-weights")
        .map(|(_, size)| size)
        .sum();
    under_every_profile(&format!("sleep {workload:?}"), |s| {
        let start = s.free();
        let allocations: Vec<Allocation> = requests
            .iter()
            .map(|&(tag, size)| s.vmm.allocate(size, 0, Stream::DEFAULT, tag).unwrap())
            .collect();
        let awake = s.free();
        let outcome = sleep_and_wake(s, &allocations, weights, awake);
        for a in allocations {
            s.vmm.deallocate(a).unwrap();
        }
        let trimmed = s.vmm.trim().unwrap();
        let end = s.free();
        let mut line = outcome.clone().unwrap_or_else(|e| e);
        line += &format!(
            "; after free + trim {} MiB free of {} MiB at the start (trim said {} KiB)",
            end / MIB,
            start / MIB,
            trimmed / KIB
        );
        if outcome.is_err() {
            return Err(line);
        }
        if !near(end, start, s.granule) {
            return Err(format!(
                "{line}: {} KiB not given back",
                start.saturating_sub(end) / KIB
            ));
        }
        Ok(line)
    });
}

/// The sleep and the wake of one subject, measured; `Err` says what went wrong.
fn sleep_and_wake(
    s: &Subject,
    allocations: &[Allocation],
    weights: u64,
    awake: u64,
) -> Result<String, String> {
    let report = s
        .vmm
        .sleep("rocm-weights", Keep::Contents)
        .map_err(|e| format!("sleep refused: {e}"))?;
    let asleep = s.free();
    let rose = asleep.saturating_sub(awake);
    let line = format!(
        "weights {} KiB; free {} KiB awake, {} KiB asleep: rose {} KiB = {:.2}% (sleep said \
         {} allocations, {} KiB device)",
        weights / KIB,
        awake / KIB,
        asleep / KIB,
        rose / KIB,
        100.0 * rose as f64 / weights as f64,
        report.allocations,
        report.device_bytes / KIB
    );
    let woke = s.vmm.wake("rocm-weights");
    let short = (rose as u128) * 100 < (weights as u128) * 99;
    if let Err(e) = woke {
        return Err(format!("{line}; wake refused: {e}"));
    }
    let back = s.free();
    let mut line = format!("{line}; {} KiB free after the wake", back / KIB);
    let misplaced: Vec<u64> = allocations
        .iter()
        .filter(|a| {
            s.vmm.is_asleep(a)
                || s.fake.access(a.ptr(), 0) != Some(true)
                || s.fake.access(a.ptr() + a.size() - 1, 0) != Some(true)
        })
        .map(Allocation::ptr)
        .collect();
    if !misplaced.is_empty() {
        line += &format!(
            "; {} allocations not mapped at their address after the wake (first {:#x})",
            misplaced.len(),
            misplaced[0]
        );
        return Err(line);
    }
    if short {
        return Err(format!("{line}: under 99% of the weights given back"));
    }
    Ok(line)
}
