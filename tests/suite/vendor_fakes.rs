//! The conformance fakes' control API and peer access, on both fakes (`fakecuda`, `fakehip`).
//!
//! * **Faults and counts** (`fake_fail`, `fake_clear_faults`, `fake_calls`, `fake_live`; the
//!   spec is the comment of `fakes/drivers/fake_core.h`): the nth..nth+count-1 window
//!   counted from the `fake_fail` call, forever, clearing, faults armed side by side, failed
//!   calls counted, one live-count vocabulary.
//! * **Peer access through the backends**: `can_access_peer` / `enable_peer_access` of
//!   `CudaDevice` and `HipDevice` between two fake devices (the fake records the enable),
//!   `VirtualMemory::set_access_with_peers` granting the peer (the fake records, per mapping,
//!   which devices may access it), the `vmm` strategy doing the same, and the refusals: a pair
//!   declared not capable is a typed error, an enable the driver already has is success.
//! * **The vendor calls' own rules**, called directly: the codes `cuCtxEnablePeerAccess` /
//!   `hipDeviceEnablePeerAccess` and the set-access calls answer.
//! * **Copies and pinned host memory through the backends** (`Device::copy_to_host`,
//!   `copy_from_host`, `alloc_pinned_host`, `free_pinned_host`): each goes through as one
//!   vendor call, in stream order behind a kernel in flight, with the caller's current context
//!   (CUDA) or device (HIP) unchanged after it; ranges the books refuse never reach the
//!   driver; the driver's refusal is its typed error; pinned memory is counted until freed.
//!
//! * **Reserving at an address** (`VirtualMemory::reserve_at`): a range freed is had again
//!   at its address (and maps), a hint over a live reservation or not aligned as asked is
//!   relocated, one off the granularity is refused before the driver sees it.
//! * **The release probe at open** (`VirtualMemory::holds_released_memory`): its calls, one
//!   of each but the free-memory reads; nothing left; the caller's current context or device
//!   unchanged; the documented answer (false), also through a wrapper; a probe call refused
//!   leaves the answer false, the note naming the call, and nothing held once the device goes.
//!   What ROCm 7's hold makes of it: `hip::release_probe_finds_the_reservation_hold`.
//!
//! One test body per behaviour, instantiated for each vendor (`cuda::…`, `hip::…`).
#![cfg(any(feature = "cuda", feature = "hip"))]

use std::ffi::c_int;
use std::sync::Arc;

use crate::support::fakes::{Fake, FakeDevice, LIVE};
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocator, Device, Error, Stream, Vendor};

const MIB: u64 = 1 << 20;

/// The vendor's names for what the bodies call directly.
struct Api {
    /// `(int *version) -> status`, answered before initialisation.
    driver_version: &'static str,
    /// The plain allocation behind `Device::alloc`.
    alloc: &'static str,
    can_access_peer: &'static str,
    enable_peer_access: &'static str,
    set_access: &'static str,
    /// The stream-ordered copies behind `Device::copy_to_host` / `copy_from_host`.
    copy_to_host: &'static str,
    copy_from_host: &'static str,
    /// The calls of the release probe at open, in its order: reserve, create, map, set
    /// access, unmap, free memory, release, free the reservation.
    probe: [&'static str; 8],
}

fn api(vendor: Vendor) -> Api {
    match vendor {
        Vendor::Cuda => Api {
            driver_version: "cuDriverGetVersion",
            alloc: "cuMemAlloc_v2",
            can_access_peer: "cuDeviceCanAccessPeer",
            enable_peer_access: "cuCtxEnablePeerAccess",
            set_access: "cuMemSetAccess",
            copy_to_host: "cuMemcpyDtoHAsync_v2",
            copy_from_host: "cuMemcpyHtoDAsync_v2",
            probe: [
                "cuMemAddressReserve",
                "cuMemCreate",
                "cuMemMap",
                "cuMemSetAccess",
                "cuMemUnmap",
                "cuMemGetInfo_v2",
                "cuMemRelease",
                "cuMemAddressFree",
            ],
        },
        _ => Api {
            driver_version: "hipDriverGetVersion",
            alloc: "hipMalloc",
            can_access_peer: "hipDeviceCanAccessPeer",
            enable_peer_access: "hipDeviceEnablePeerAccess",
            set_access: "hipMemSetAccess",
            copy_to_host: "hipMemcpyDtoHAsync",
            copy_from_host: "hipMemcpyHtoDAsync",
            probe: [
                "hipMemAddressReserve",
                "hipMemCreate",
                "hipMemMap",
                "hipMemSetAccess",
                "hipMemUnmap",
                "hipMemGetInfo",
                "hipMemRelease",
                "hipMemAddressFree",
            ],
        },
    }
}

/// Both vendors' codes (CUDA_ERROR_* and hipError* agree on these).
const INVALID_DEVICE: c_int = 101;
const PEER_ACCESS_UNSUPPORTED: c_int = 217;
const PEER_ACCESS_ALREADY_ENABLED: c_int = 704;
const PEER_ACCESS_NOT_ENABLED: c_int = 705;
/// The code the fault bodies inject (a driver error both vendors name).
const UNKNOWN: c_int = 999;

/// `CUmemAccessDesc` / `hipMemAccessDesc`: `{location {type 1 = device, id}, flags 3 = rw}`.
#[repr(C)]
struct AccessDesc {
    location_type: c_int,
    device: c_int,
    flags: u32,
}

fn read_write(device: c_int) -> AccessDesc {
    AccessDesc {
        location_type: 1,
        device,
        flags: 3,
    }
}

/// A fake with two devices of 256 MiB, every capability on.
fn two_devices<D: FakeDevice>() -> Fake {
    Fake::with_devices(D::VENDOR, 2, 256 * MIB)
}

/// Calls the vendor's driver-version query once; its status.
fn version_call(fake: &Fake) -> c_int {
    let f: unsafe extern "C" fn(*mut c_int) -> c_int = fake.sym(api(fake.vendor()).driver_version);
    let mut v: c_int = 0;
    // SAFETY: writes one int through a valid pointer.
    unsafe { f(&mut v) }
}

// ----- faults and counts ---------------------------------------------------------------------

/// `fake_fail(f, nth, count, code)`: calls nth .. nth+count-1 from now fail, the rest succeed;
/// earlier calls do not count; failed calls are counted.
fn fault_window<D: FakeDevice>() {
    let fake = two_devices::<D>();
    let function = api(D::VENDOR).driver_version;
    let before: Vec<c_int> = (0..3).map(|_| version_call(&fake)).collect();
    assert_eq!(before, [0, 0, 0]);
    assert_eq!(fake.calls(function), 3, "counted from the load");
    fake.fail(function, 2, 3, UNKNOWN);
    let during: Vec<c_int> = (0..6).map(|_| version_call(&fake)).collect();
    assert_eq!(during, [0, UNKNOWN, UNKNOWN, UNKNOWN, 0, 0]);
    assert_eq!(fake.calls(function), 9, "failed calls count too");
    assert_eq!(fake.calls("noSuchFunction"), 0);
}

/// `count < 0`: every call from the nth on fails, until `fake_clear_faults`.
fn fault_forever_until_cleared<D: FakeDevice>() {
    let fake = two_devices::<D>();
    let function = api(D::VENDOR).driver_version;
    fake.fail(function, 1, -1, UNKNOWN);
    for _ in 0..5 {
        assert_eq!(version_call(&fake), UNKNOWN);
    }
    fake.clear_faults();
    assert_eq!(version_call(&fake), 0);
    assert_eq!(fake.calls(function), 6);
}

/// Faults armed side by side count on their own; the first due answers; `nth < 1` is 1.
fn faults_side_by_side<D: FakeDevice>() {
    let fake = two_devices::<D>();
    let function = api(D::VENDOR).driver_version;
    fake.fail(function, 0, 1, 2);
    fake.fail(function, 3, 1, UNKNOWN);
    let got: Vec<c_int> = (0..4).map(|_| version_call(&fake)).collect();
    assert_eq!(got, [2, 0, UNKNOWN, 0]);
}

/// A fault reaches the backend as the vendor's typed error, and is counted like any call;
/// each backend call is one vendor call.
fn fault_through_the_backend<D: FakeDevice>(fake: &Fake, device: &D, _: &D, api: &Api) {
    let before = fake.calls(api.alloc);
    let ptr = device.alloc(MIB).unwrap();
    assert_eq!(fake.calls(api.alloc), before + 1);
    assert_eq!(fake.live("allocations"), 1);
    fake.fail(api.alloc, 1, 1, UNKNOWN);
    match device.alloc(MIB) {
        Err(Error::Driver { name, code, .. }) => {
            assert_eq!(
                (name.as_str(), code),
                (D::error_name(UNKNOWN), i64::from(UNKNOWN))
            )
        }
        other => panic!("expected the injected driver error, got {other:?}"),
    }
    assert_eq!(fake.calls(api.alloc), before + 2);
    assert_eq!(
        fake.live("allocations"),
        1,
        "the failed call allocated nothing"
    );
    device.free(ptr, MIB).unwrap();
}

/// One vocabulary: every name of `LIVE` is answered (zero on a fresh fake), an unknown name
/// is -1, and `contexts` only where there are contexts (CUDA).
fn live_vocabulary<D: FakeDevice>() {
    let fake = two_devices::<D>();
    for what in LIVE {
        assert_eq!(fake.live(what), 0, "{what}");
    }
    let raw: unsafe extern "C" fn(*const std::ffi::c_char) -> i64 = fake.sym("fake_live");
    // SAFETY: NUL-terminated names, read only.
    let (unknown, contexts) = unsafe { (raw(c"pool_blocks".as_ptr()), raw(c"contexts".as_ptr())) };
    assert_eq!(unknown, -1);
    assert_eq!(contexts, if D::VENDOR == Vendor::Cuda { 0 } else { -1 });
    // The counts follow the backend's objects.
    let device = D::open(&fake, 0);
    let s = device.create_stream().unwrap();
    let e = device.create_event().unwrap();
    assert_eq!((fake.live("streams"), fake.live("events")), (1, 1));
    device.destroy_event(e).unwrap();
    // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
    unsafe { device.destroy_stream(s) }.unwrap();
    drop(device);
    fake.assert_empty();
}

// ----- peer access through the backends -------------------------------------------------------

/// Two devices: each can access the other, not itself; enabling is recorded by the fake,
/// once; enabling again is success without a driver call; an enable the driver already has
/// (a second device object for the same ordinal) is success too.
fn peers_enable<D: FakeDevice>(fake: &Fake, a: &D, b: &D, api: &Api) {
    assert!(a.can_access_peer(b).unwrap() && b.can_access_peer(a).unwrap());
    assert!(
        !a.can_access_peer(a).unwrap(),
        "a device is no peer of itself"
    );
    assert!(!fake.peer_enabled(0, 1));
    a.enable_peer_access(b).unwrap();
    assert!(fake.peer_enabled(0, 1) && !fake.peer_enabled(1, 0));
    assert_eq!(a.peer_access(), [1]);
    assert_eq!(fake.calls(api.enable_peer_access), 1);
    a.enable_peer_access(b).unwrap();
    assert_eq!(fake.calls(api.enable_peer_access), 1, "the backend knew");
    // A second object for device 0: the driver answers "already enabled", which is success.
    let again = D::open(fake, 0);
    again.enable_peer_access(b).unwrap();
    assert_eq!(fake.calls(api.enable_peer_access), 2);
    assert_eq!(again.peer_access(), [1]);
}

/// A pair declared not capable: can-access says no, enabling is a typed error naming the
/// vendor's query, and nothing is enabled.
fn peers_not_capable<D: FakeDevice>(fake: &Fake, a: &D, b: &D, api: &Api) {
    fake.set_peer(0, 1, false);
    assert!(!a.can_access_peer(b).unwrap());
    assert!(
        b.can_access_peer(a).unwrap(),
        "the other direction is still capable"
    );
    match a.enable_peer_access(b) {
        Err(Error::Unsupported { reason, .. }) => {
            assert!(reason.contains(api.can_access_peer), "{reason}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert!(a.peer_access().is_empty() && !fake.peer_enabled(0, 1));
    assert_eq!(fake.calls(api.enable_peer_access), 0);
}

/// `set_access_with_peers` grants the peer access to the mapping (the fake's record); plain
/// `set_access` grants only the owner; a peer not enabled is refused before the driver.
fn set_access_with_peers_grants<D: FakeDevice>(fake: &Fake, a: &D, b: &D, api: &Api) {
    let vm = a.virtual_memory().expect("the fake has virtual memory");
    let size = 2 * vm.granularity().max(2 * MIB);
    let va = vm.reserve(size, 0).unwrap();
    let handle = vm.create_physical(size).unwrap();
    vm.map(va, size, handle, 0).unwrap();
    assert_eq!(fake.access(va, 0), Some(false), "mapped without access");
    vm.set_access(va, size).unwrap();
    assert_eq!(
        (fake.access(va, 0), fake.access(va, 1)),
        (Some(true), Some(false))
    );

    let calls = fake.calls(api.set_access);
    match vm.set_access_with_peers(va, size, &[1]) {
        Err(Error::InvalidArgument { call, .. }) => assert_eq!(call, "set_access_with_peers"),
        other => panic!("a peer not enabled must be refused, got {other:?}"),
    }
    assert_eq!(
        fake.calls(api.set_access),
        calls,
        "refused before the driver"
    );
    assert_eq!(fake.access(va, 1), Some(false));

    a.enable_peer_access(b).unwrap();
    vm.set_access_with_peers(va, size, &[1]).unwrap();
    assert_eq!(
        fake.calls(api.set_access),
        calls + 1,
        "one call, two descriptors"
    );
    for at in [va, va + size / 2, va + size - 1] {
        assert_eq!(
            (fake.access(at, 0), fake.access(at, 1)),
            (Some(true), Some(true))
        );
    }
    assert_eq!(fake.access(va + size, 1), None, "outside every mapping");
    vm.unmap(va, size).unwrap();
    vm.release_physical(handle).unwrap();
    vm.free_reservation(va, size).unwrap();
}

/// The `vmm` strategy over a device with an enabled peer grants the peer all it maps.
fn vmm_grants_enabled_peers<D: FakeDevice>() {
    let fake = two_devices::<D>();
    let devices: Vec<Arc<dyn Device>> = D::open_all(&fake)
        .into_iter()
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .collect();
    devices[0].enable_peer_access(devices[1].as_ref()).unwrap();
    let vmm = VmmAllocator::new(Arc::clone(&devices[0]), VmmOptions::new(64 * MIB)).unwrap();
    assert_eq!(vmm.peers(), [1]);
    let held: Vec<_> = [3 * MIB, 5 * MIB, 512]
        .into_iter()
        .map(|size| vmm.allocate(size, 0, Stream::DEFAULT, "x").unwrap())
        .collect();
    for x in &held {
        let last = x.ptr() + x.size() - 1;
        assert_eq!(fake.access(x.ptr(), 1), Some(true), "{x:?}");
        assert_eq!(fake.access(last, 1), Some(true), "{x:?}");
    }
    held.into_iter().for_each(|x| vmm.deallocate(x).unwrap());
    vmm.trim().unwrap();
    drop((vmm, devices));
    fake.assert_empty();
}

// ----- the vendor calls' own rules -------------------------------------------------------------

/// The set-access call checks each descriptor: an unknown device is the vendor's invalid
/// device, a device not linked to the owner by peer access is "peer access not enabled", and
/// a refused call grants nothing.
fn set_access_refusals<D: FakeDevice>(fake: &Fake, a: &D, b: &D, api: &Api) {
    let vm = a.virtual_memory().expect("virtual memory");
    let size = vm.granularity().max(2 * MIB);
    let va = vm.reserve(size, 0).unwrap();
    let handle = vm.create_physical(size).unwrap();
    vm.map(va, size, handle, 0).unwrap();
    // The test's own driver calls below run in device 0's context (CUDA), as the caller's
    // would: portalloc's calls leave none of theirs current.
    a.make_current_for_caller();
    let set_access: unsafe extern "C" fn(u64, usize, *const AccessDesc, usize) -> c_int =
        fake.sym(api.set_access);
    let call = |descs: &[AccessDesc]| {
        // SAFETY: `descs.len()` descriptors of the vendor's layout; a mapped range.
        unsafe { set_access(va, size as usize, descs.as_ptr(), descs.len()) }
    };
    assert_eq!(call(&[read_write(0), read_write(5)]), INVALID_DEVICE);
    assert_eq!(
        call(&[read_write(0), read_write(1)]),
        PEER_ACCESS_NOT_ENABLED
    );
    assert_eq!(
        fake.access(va, 0),
        Some(false),
        "a refused call grants nothing"
    );
    assert_eq!(call(&[read_write(0)]), 0);
    // Linked in either direction: device 1 enabled access to device 0.
    b.enable_peer_access(a).unwrap();
    assert_eq!(call(&[read_write(1)]), 0);
    assert_eq!(
        (fake.access(va, 0), fake.access(va, 1)),
        (Some(true), Some(true))
    );
    vm.unmap(va, size).unwrap();
    vm.release_physical(handle).unwrap();
    vm.free_reservation(va, size).unwrap();
}

/// The can-access query: 1 for distinct devices unless declared otherwise, 0 for a device
/// and itself, the invalid-device error for an unknown one.
fn can_access_peer_call<D: FakeDevice>(fake: &Fake, _: &D, _: &D, api: &Api) {
    let can: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int =
        fake.sym(api.can_access_peer);
    let ask = |d: c_int, p: c_int| {
        let mut answer: c_int = -1;
        // SAFETY: writes one int through a valid pointer.
        let status = unsafe { can(&mut answer, d, p) };
        (status, answer)
    };
    assert_eq!(ask(0, 1), (0, 1));
    assert_eq!(ask(0, 0), (0, 0));
    assert_eq!(ask(0, 2).0, INVALID_DEVICE);
    fake.set_peer(1, 0, false);
    assert_eq!((ask(1, 0), ask(0, 1)), ((0, 0), (0, 1)));
}

// ----- copies and pinned host memory through the backends --------------------------------------

/// Copies between device memory and pinned host memory on device `a` while the caller works
/// on the other device, which must be current after every call: each copy is one vendor call,
/// moves the bytes (both fakes' device memory is host memory), completes behind a kernel in
/// flight on its stream (a copy to pinned memory; one to pageable memory completes before the
/// call returns, as the vendors document), and is refused — without a driver call — for a
/// range mapped without access or in no memory of the device; zero bytes make no call; the
/// driver's refusal is its typed error; pinned memory is counted until freed, once.
fn copies_and_pinned_memory<D: FakeDevice>(fake: &Fake, a: &D, _: &D, api: &Api) {
    let before = fake.current();
    let caller = fake.primary(1);
    fake.set_current(caller);
    let unchanged = |after: &str| {
        assert_eq!(
            fake.current(),
            caller,
            "{after} changed the caller's current {}",
            if D::VENDOR == Vendor::Cuda {
                "context"
            } else {
                "device"
            }
        )
    };
    let calls = || (fake.calls(api.copy_to_host), fake.calls(api.copy_from_host));
    const LEN: usize = 64 << 10;

    let s = a.create_stream().unwrap();
    let pinned = a
        .alloc_pinned_host(LEN as u64)
        .unwrap()
        .expect("the fake exports the pinned-host calls");
    unchanged("alloc_pinned_host");
    assert_eq!(fake.live("host_allocations"), 1);
    assert_eq!(a.vendor_census().pinned_host, 1);
    // SAFETY: `pinned` holds LEN bytes, read and written here only while no copy uses them.
    let host = unsafe { std::slice::from_raw_parts_mut(pinned.as_ptr(), LEN) };
    for (i, b) in host.iter_mut().enumerate() {
        *b = (i as u8) ^ 0x5a;
    }
    let plain = a.alloc(MIB).unwrap();
    let mut back = vec![0u8; LEN];
    let (to_host, from_host) = calls();
    // SAFETY: both host buffers hold LEN bytes until the stream is synchronised below; the
    // device range is checked against the device's books.
    unsafe { a.copy_from_host(plain + 8, pinned.as_ptr(), LEN as u64, s) }.unwrap();
    unchanged("copy_from_host");
    // SAFETY: as above.
    unsafe { a.copy_to_host(back.as_mut_ptr(), plain + 8, LEN as u64, s) }.unwrap();
    unchanged("copy_to_host");
    a.synchronize_stream(s).unwrap();
    assert_eq!(
        calls(),
        (to_host + 1, from_host + 1),
        "one vendor call each"
    );
    assert!(back == *host, "the bytes came back");

    // In stream order: behind a kernel in flight on the stream (into pinned memory, which
    // the copy writes when the stream reaches it; the test reads it only after).
    let kernel = fake.launch(s, plain, MIB);
    let e = a.create_event().unwrap();
    // SAFETY: `pinned` holds LEN bytes and is not touched until the copy completed.
    unsafe { a.copy_to_host(pinned.as_ptr(), plain, LEN as u64, s) }.unwrap();
    a.record_event(e, s).unwrap();
    assert!(!a.event_complete(e).unwrap(), "behind the kernel");
    fake.finish(kernel);
    assert!(a.event_complete(e).unwrap(), "after it");

    // Mapped memory: only with access granted; the books refuse before the driver sees it.
    let vm = a.virtual_memory().expect("every capability on");
    let g = vm.granularity();
    let n = g.min(LEN as u64);
    let va = vm.reserve(2 * g, 0).unwrap();
    let h = vm.create_physical(g).unwrap();
    vm.map(va, g, h, 0).unwrap();
    let counted = calls();
    // SAFETY: refused before anything is read or written.
    let no_access = unsafe { a.copy_to_host(back.as_mut_ptr(), va, n, s) };
    match no_access {
        Err(Error::InvalidArgument { call, reason }) => {
            assert_eq!(call, "copy_to_host");
            assert!(reason.contains("without access"), "{reason}");
        }
        other => panic!("expected the books' refusal, got {other:?}"),
    }
    // SAFETY: refused before anything is read or written.
    let unknown = unsafe { a.copy_from_host(0x10, pinned.as_ptr(), 16, s) };
    assert!(
        matches!(
            unknown,
            Err(Error::UnknownPointer {
                what: "device memory",
                ptr: 0x10,
                ..
            })
        ),
        "{unknown:?}"
    );
    // SAFETY: zero bytes: nothing is read or written, whatever the pointers.
    unsafe { a.copy_to_host(std::ptr::null_mut(), 0x10, 0, s) }.unwrap();
    assert_eq!(calls(), counted, "no driver call for any of them");
    vm.set_access(va, g).unwrap();
    // SAFETY: as for the first copies.
    unsafe { a.copy_to_host(back.as_mut_ptr(), va, n, s) }.unwrap();
    unchanged("copy_to_host of mapped memory");
    // The driver's refusal comes back typed, with its name.
    fake.fail(api.copy_from_host, 1, 1, UNKNOWN);
    // SAFETY: as for the first copies.
    match unsafe { a.copy_from_host(va, pinned.as_ptr(), n, s) } {
        Err(Error::Driver { call, name, .. }) => {
            assert_eq!(
                (call, name.as_str()),
                (api.copy_from_host, D::error_name(UNKNOWN))
            )
        }
        other => panic!("expected the injected driver error, got {other:?}"),
    }
    unchanged("a refused copy_from_host");
    a.synchronize_stream(s).unwrap();
    vm.unmap(va, g).unwrap();
    vm.release_physical(h).unwrap();
    vm.free_reservation(va, 2 * g).unwrap();

    // SAFETY: this device's, no copy in flight (the stream was synchronised), not used again.
    unsafe { a.free_pinned_host(pinned, LEN as u64) }.unwrap();
    unchanged("free_pinned_host");
    assert_eq!(fake.live("host_allocations"), 0);
    // SAFETY: refused before anything is freed: freed already.
    let again = unsafe { a.free_pinned_host(pinned, LEN as u64) };
    assert!(
        matches!(
            again,
            Err(Error::UnknownPointer {
                what: "pinned host memory",
                ..
            })
        ),
        "{again:?}"
    );
    a.free(plain, MIB).unwrap();
    a.destroy_event(e).unwrap();
    // SAFETY: this test's stream, idle, not used again.
    unsafe { a.destroy_stream(s) }.unwrap();
    assert_eq!(fake.hazards().0, 0, "{}", fake.hazards().1);
    fake.set_current(before);
    fake.release_primary(1);
}

// ----- reserving at an address, and what a release gives back --------------------------------

/// `reserve_at`: a range freed is reserved again at its address, and the books take it (it
/// maps); a hint over a live reservation (this device's or the other device's: one address
/// space) or not a multiple of the alignment asked is relocated to a range of its own; a hint
/// off the granularity is refused before the driver sees it. The caller's current context or
/// device is unchanged after each.
fn reserve_at_an_address<D: FakeDevice>(fake: &Fake, a: &D, b: &D, api: &Api) {
    let before = fake.current();
    let caller = fake.primary(1);
    fake.set_current(caller);
    let unchanged = |after: &str| {
        assert_eq!(
            fake.current(),
            caller,
            "{after} changed the caller's current context or device"
        )
    };
    let apart = |x: u64, xs: u64, y: u64, ys: u64| x + xs <= y || y + ys <= x;
    let vm = a.virtual_memory().expect("every capability on");
    let g = vm.granularity();

    let va = vm.reserve(4 * g, 0).unwrap();
    vm.free_reservation(va, 4 * g).unwrap();
    let again = vm.reserve_at(4 * g, 0, va).unwrap();
    unchanged("reserve_at");
    assert_eq!(again, va, "a range freed is had again at its address");
    assert_eq!(
        (a.vendor_census().reservations, fake.live("reservations")),
        (1, 1)
    );
    // The books took it: it maps, and access is granted.
    let h = vm.create_physical(g).unwrap();
    vm.map(va + g, g, h, 0).unwrap();
    vm.set_access(va + g, g).unwrap();

    // Over a live reservation of this device: a range of its own.
    let inside = vm.reserve_at(2 * g, 0, va + 2 * g).unwrap();
    unchanged("a relocated reserve_at");
    assert!(
        apart(inside, 2 * g, va, 4 * g),
        "{inside:#x} overlaps [{va:#x}, +{})",
        4 * g
    );
    // Over the other device's reservation: elsewhere too.
    let vb = b.virtual_memory().unwrap().reserve(g, 0).unwrap();
    let beside = vm.reserve_at(g, 0, vb).unwrap();
    assert!(apart(beside, g, vb, g), "{beside:#x} is the other device's");
    // Not a multiple of the alignment asked: elsewhere, aligned as asked.
    let wide = vm.reserve(16 * g, 0).unwrap();
    vm.free_reservation(wide, 16 * g).unwrap();
    let hint = wide.next_multiple_of(8 * g) + g;
    let aligned = vm.reserve_at(g, 8 * g, hint).unwrap();
    assert!(aligned != hint && aligned % (8 * g) == 0, "{aligned:#x}");
    // Off the granularity: refused by the books, no driver call.
    let calls = fake.calls(api.probe[0]);
    match vm.reserve_at(g, 0, va + g / 2) {
        Err(Error::InvalidArgument { call, reason }) => {
            assert_eq!(call, "reserve_at");
            assert!(reason.contains("granularity"), "{reason}");
        }
        other => panic!("expected the books' refusal, got {other:?}"),
    }
    assert_eq!(fake.calls(api.probe[0]), calls, "never reached the driver");
    unchanged("a refused reserve_at");

    vm.unmap(va + g, g).unwrap();
    vm.release_physical(h).unwrap();
    for (at, size) in [(va, 4 * g), (inside, 2 * g), (beside, g), (aligned, g)] {
        vm.free_reservation(at, size).unwrap();
    }
    b.virtual_memory().unwrap().free_reservation(vb, g).unwrap();
    assert!(a.vendor_census().is_empty(), "{:?}", a.vendor_census());
    fake.set_current(before);
    fake.release_primary(1);
}

/// The note a device's probe left.
fn release_note<D: FakeDevice>(device: &D) -> String {
    device
        .info()
        .notes
        .iter()
        .find(|(k, _)| k == "released memory")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no release note in {:?}", device.info().notes))
}

/// The probe at open, on the documented behaviour: one granule reserved, made, mapped,
/// granted access, unmapped and released — the free memory rose by it — and the reservation
/// freed: one call of each, two free-memory reads. Nothing is left, the caller's current
/// context or device is unchanged, and the answer is false, through a wrapper too.
fn release_probe_documented<D: FakeDevice>() {
    let fake = two_devices::<D>();
    let api = api(D::VENDOR);
    let other = D::open(&fake, 1);
    let before = fake.current();
    let caller = fake.primary(1);
    fake.set_current(caller);
    let counted = |fake: &Fake| api.probe.map(|f| fake.calls(f));
    let calls = counted(&fake);
    let device = Arc::new(D::open(&fake, 0));
    assert_eq!(
        fake.current(),
        caller,
        "the probe changed the caller's current"
    );
    let made: Vec<i64> = counted(&fake)
        .iter()
        .zip(calls)
        .map(|(after, before)| after - before)
        .collect();
    assert_eq!(made, [1, 1, 1, 1, 1, 2, 1, 1], "{:?}", api.probe);
    assert_eq!(fake.nonzero(crate::support::fakes::MEMORY), []);
    assert!(device.vendor_census().is_empty());
    let vm = device.virtual_memory().unwrap();
    let g = vm.granularity();
    assert!(!vm.holds_released_memory());
    let note = release_note(&*device);
    let expected = format!(
        "returned at release (probed: releasing an unmapped {} handle gave back {})",
        portalloc::units::Bytes(g),
        portalloc::units::Bytes(g)
    );
    assert_eq!(note, expected);
    let counting = portalloc::adaptor::CountingDevice::new(Arc::clone(&device));
    assert!(!counting.virtual_memory().unwrap().holds_released_memory());
    drop((counting, device, other));
    fake.set_current(before);
    fake.release_primary(1);
    fake.assert_empty();
}

/// A call of the probe refused: the answer is false and the note names the call, the caller's
/// current is unchanged, and nothing is left once the device goes. A refused free of the
/// scratch reservation after the answer was found keeps the answer; the device books the
/// reservation and gives it back when it goes.
fn release_probe_refused<D: FakeDevice>() {
    let fake = two_devices::<D>();
    let api = api(D::VENDOR);
    let other = D::open(&fake, 1);
    let caller = fake.primary(1);
    let before = fake.current();
    fake.set_current(caller);
    for call in api.probe {
        fake.fail(call, 1, 1, UNKNOWN);
        let device = D::open(&fake, 0);
        fake.clear_faults();
        assert_eq!(
            fake.current(),
            caller,
            "{call} refused: the caller's current"
        );
        assert!(!device.virtual_memory().unwrap().holds_released_memory());
        let note = release_note(&device);
        if call == api.probe[7] {
            assert!(note.starts_with("returned at release"), "{call}: {note}");
            assert_eq!(device.vendor_census().reservations, 1, "kept by the device");
        } else {
            assert!(
                note.starts_with("not known: the probe failed (")
                    && note.contains(call)
                    && note.contains(D::error_name(UNKNOWN))
                    && note.ends_with("taken as returned at release"),
                "{call}: {note}"
            );
            assert!(device.vendor_census().is_empty(), "{call}");
            assert_eq!(fake.nonzero(crate::support::fakes::MEMORY), [], "{call}");
        }
        drop(device);
        assert_eq!(fake.nonzero(crate::support::fakes::MEMORY), [], "{call}");
    }
    drop(other);
    fake.set_current(before);
    fake.release_primary(1);
    fake.assert_empty();
}

/// Runs `body` over both devices of a fresh two-device fake; then, with the devices dropped,
/// the fake must hold nothing.
fn on_two_devices<D: FakeDevice>(body: fn(&Fake, &D, &D, &Api)) {
    let fake = two_devices::<D>();
    let devices = D::open_all(&fake);
    body(&fake, &devices[0], &devices[1], &api(D::VENDOR));
    drop(devices);
    fake.assert_empty();
}

/// One `#[test]` per vendor for each body: `cuda::name`, `hip::name`. Bodies that take the
/// fake and two devices run through [`on_two_devices`].
macro_rules! on_both_vendors {
    ($vendor:ident, $device:ty, $feature:literal) => {
        #[cfg(feature = $feature)]
        mod $vendor {
            type D = $device;

            on_both_vendors!(@plain fault_window, fault_forever_until_cleared,
                faults_side_by_side, live_vocabulary, vmm_grants_enabled_peers,
                release_probe_documented, release_probe_refused);
            on_both_vendors!(@pair fault_through_the_backend, peers_enable, peers_not_capable,
                set_access_with_peers_grants, set_access_refusals, can_access_peer_call,
                copies_and_pinned_memory, reserve_at_an_address);
        }
    };
    (@plain $($body:ident),*) => {
        $(#[test]
        fn $body() {
            super::$body::<D>()
        })*
    };
    (@pair $($body:ident),*) => {
        $(#[test]
        fn $body() {
            super::on_two_devices::<D>(super::$body::<D>)
        })*
    };
}

on_both_vendors!(cuda, portalloc::backends::cuda::CudaDevice, "cuda");
on_both_vendors!(hip, portalloc::backends::hip::HipDevice, "hip");

// ----- what only one vendor has ----------------------------------------------------------------

/// `cuCtxEnablePeerAccess`: no current context, an unknown peer context, the current
/// context's own device, a pair not capable, and a second enable each answer the driver's code.
#[cfg(feature = "cuda")]
#[test]
fn cuda_enable_peer_access_codes() {
    let fake = Fake::with_devices(Vendor::Cuda, 3, 256 * MIB);
    type Ctx = *mut std::ffi::c_void;
    let init: unsafe extern "C" fn(u32) -> c_int = fake.sym("cuInit");
    let retain: unsafe extern "C" fn(*mut Ctx, c_int) -> c_int =
        fake.sym("cuDevicePrimaryCtxRetain");
    let release: unsafe extern "C" fn(c_int) -> c_int = fake.sym("cuDevicePrimaryCtxRelease_v2");
    let set_current: unsafe extern "C" fn(Ctx) -> c_int = fake.sym("cuCtxSetCurrent");
    let enable: unsafe extern "C" fn(Ctx, u32) -> c_int = fake.sym("cuCtxEnablePeerAccess");
    let mut ctx: [Ctx; 3] = [std::ptr::null_mut(); 3];
    // SAFETY: the driver's signatures; handles it gave out; each pointer writes one handle.
    unsafe {
        assert_eq!(init(0), 0);
        for (d, c) in ctx.iter_mut().enumerate() {
            assert_eq!(retain(c, d as c_int), 0);
        }
        // A fresh thread has no current context.
        let peer = ctx[1] as usize;
        let no_current = std::thread::spawn(move || enable(peer as Ctx, 0))
            .join()
            .unwrap();
        assert_eq!(
            no_current, 201,
            "CUDA_ERROR_INVALID_CONTEXT without a current context"
        );
        assert_eq!(set_current(ctx[0]), 0);
        let mut unknown = 0u64;
        assert_eq!(
            enable((&mut unknown as *mut u64).cast(), 0),
            201,
            "unknown peer context"
        );
        assert_eq!(enable(ctx[0], 0), INVALID_DEVICE, "its own device");
        assert_eq!(
            enable(ctx[1], 1),
            1,
            "CUDA_ERROR_INVALID_VALUE: flags must be 0"
        );
        fake.set_peer(0, 2, false);
        assert_eq!(enable(ctx[2], 0), PEER_ACCESS_UNSUPPORTED);
        assert_eq!(enable(ctx[1], 0), 0);
        assert_eq!(enable(ctx[1], 0), PEER_ACCESS_ALREADY_ENABLED);
        assert!(fake.peer_enabled(0, 1) && !fake.peer_enabled(0, 2));
        assert_eq!(set_current(std::ptr::null_mut()), 0);
        for d in 0..3 {
            assert_eq!(release(d), 0);
        }
    }
    fake.assert_empty();
}

/// `hipDeviceEnablePeerAccess` acts from the thread's current device: the current device
/// itself and an ordinal out of range are hipErrorInvalidDevice, a pair not capable
/// hipErrorPeerAccessUnsupported, a second enable hipErrorPeerAccessAlreadyEnabled.
#[cfg(feature = "hip")]
#[test]
fn hip_enable_peer_access_codes() {
    let fake = Fake::with_devices(Vendor::Hip, 3, 256 * MIB);
    let set_device: unsafe extern "C" fn(c_int) -> c_int = fake.sym("hipSetDevice");
    let enable: unsafe extern "C" fn(c_int, u32) -> c_int = fake.sym("hipDeviceEnablePeerAccess");
    // SAFETY: by value.
    unsafe {
        assert_eq!(set_device(1), 0);
        assert_eq!(enable(1, 0), INVALID_DEVICE, "the current device itself");
        assert_eq!(enable(3, 0), INVALID_DEVICE, "out of range");
        assert_eq!(enable(0, 1), 1, "hipErrorInvalidValue: flags must be 0");
        fake.set_peer(1, 2, false);
        assert_eq!(enable(2, 0), PEER_ACCESS_UNSUPPORTED);
        assert_eq!(enable(0, 0), 0);
        assert_eq!(enable(0, 0), PEER_ACCESS_ALREADY_ENABLED);
    }
    assert!(fake.peer_enabled(1, 0) && !fake.peer_enabled(0, 1) && !fake.peer_enabled(1, 2));
}
