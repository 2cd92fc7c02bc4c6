//! The host backend as an executable specification: plain allocation, the GPU drivers'
//! virtual-memory rules, capacity accounting, simulated mode, streams and events.
//!
//! Every behaviour that applies to both modes runs in both: `real` touches memory through
//! the pointers, `simulated` only checks the books.

use portalloc::backends::host::{HostCensus, HostDevice};
use portalloc::device::{Device, Event, PhysicalHandle, Stream, VirtualMemory};
use portalloc::Error;
use test_case::test_case;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The default granularity.
const G: u64 = 2 * MIB;

const REAL: bool = false;
const SIMULATED: bool = true;

fn device(simulated: bool, capacity: u64) -> HostDevice {
    HostDevice::builder()
        .capacity(capacity)
        .simulated(simulated)
        .build()
        .expect("a host device builds")
}

fn vm(device: &HostDevice) -> &dyn VirtualMemory {
    device
        .virtual_memory()
        .expect("the host device has virtual memory")
}

/// The byte written at offset `i` by [`fill`] with `seed`.
fn pattern(i: usize, seed: u8) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed)
}

/// Writes a pattern over `[ptr, ptr + len)`.
fn fill(ptr: u64, len: u64, seed: u8) {
    // SAFETY: callers pass memory the real host device handed out (an allocation, or a mapped
    // range with read-write access) of at least `len` bytes, which nothing else references.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len as usize) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = pattern(i, seed);
    }
}

/// True when `[ptr, ptr + len)` holds the pattern [`fill`] wrote with `seed`.
fn holds(ptr: u64, len: u64, seed: u8) -> bool {
    // SAFETY: callers pass readable memory the real host device handed out, of at least
    // `len` bytes, with no writer while the slice lives.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) };
    bytes
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern(i, seed))
}

/// The reason of an `InvalidArgument` from `call`; panics on anything else.
#[track_caller]
fn invalid_argument<T: std::fmt::Debug>(result: portalloc::Result<T>, call: &str) -> String {
    match result {
        Err(Error::InvalidArgument { call: c, reason }) if c == call => reason,
        other => panic!("expected InvalidArgument from {call}, got {other:?}"),
    }
}

/// Asserts an `UnknownPointer` naming `what`.
#[track_caller]
fn assert_unknown<T: std::fmt::Debug>(result: portalloc::Result<T>, what: &str, ptr: u64) {
    match result {
        Err(Error::UnknownPointer {
            what: w,
            ptr: p,
            backend: "host",
        }) if w == what && p == ptr => {}
        other => panic!("expected UnknownPointer for {what} {ptr:#x}, got {other:?}"),
    }
}

// ---- plain allocations ----------------------------------------------------------------

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn alloc_free_round_trip(simulated: bool) {
    let d = device(simulated, 256 * MIB);
    let sizes = [1, 255, 256, 4097, 3 * MIB, 64 * MIB];
    let mut live = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let ptr = d.alloc(size).unwrap();
        assert_eq!(
            ptr % 256,
            0,
            "allocation of {size} B at {ptr:#x} is not 256-aligned"
        );
        assert_ne!(ptr, 0);
        if !simulated {
            fill(ptr, size, i as u8);
        }
        live.push((ptr, size, i as u8));
    }
    // No two allocations overlap, and (real) none overwrote another.
    let mut ranges: Vec<_> = live.iter().map(|&(p, s, _)| (p, p + s)).collect();
    ranges.sort();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0));
    if !simulated {
        for &(ptr, size, seed) in &live {
            assert!(
                holds(ptr, size, seed),
                "allocation at {ptr:#x} lost its bytes"
            );
        }
    }
    let charged: u64 = sizes.iter().map(|s| s.next_multiple_of(256)).sum();
    assert_eq!(
        d.census(),
        HostCensus {
            allocations: sizes.len() as u64,
            bytes_in_use: charged,
            ..HostCensus::default()
        }
    );
    for (ptr, size, _) in live {
        d.free(ptr, size).unwrap();
    }
    assert!(d.census().is_empty(), "{:?}", d.census());
    assert_eq!(d.mem_info().unwrap().free, 256 * MIB);
}

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn zero_size_alloc_is_refused(simulated: bool) {
    let d = device(simulated, 64 * MIB);
    assert!(matches!(
        d.alloc(0),
        Err(Error::InvalidSize { size: 0, .. })
    ));
    assert!(matches!(
        d.alloc(u64::MAX),
        Err(Error::InvalidSize { .. } | Error::DeviceOutOfMemory { .. })
    ));
    assert!(d.census().is_empty());
}

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn capacity_refusal_reports_requested_and_free(simulated: bool) {
    let d = device(simulated, 10 * MIB);
    let a = d.alloc(6 * MIB).unwrap();
    let before = d.census();
    let err = d.alloc(5 * MIB).unwrap_err();
    assert!(err.is_out_of_memory());
    assert!(
        matches!(
            err,
            Error::DeviceOutOfMemory {
                backend: "host",
                requested,
                free
            } if requested == 5 * MIB && free == 4 * MIB
        ),
        "{err:?}"
    );
    // Physical memory for virtual mapping draws on the same capacity.
    match vm(&d).create_physical(3 * G) {
        Err(Error::DeviceOutOfMemory {
            backend: "host",
            requested,
            free,
        }) => assert_eq!((requested, free), (3 * G, 4 * MIB)),
        other => panic!("expected DeviceOutOfMemory, got {other:?}"),
    }
    assert_eq!(d.census(), before, "a refusal changed the books");
    // What is left can still be had, to the byte.
    let b = d.alloc(4 * MIB).unwrap();
    assert_eq!(d.mem_info().unwrap().free, 0);
    assert!(d.alloc(1).unwrap_err().is_out_of_memory());
    d.free(a, 6 * MIB).unwrap();
    d.free(b, 4 * MIB).unwrap();
    assert!(d.census().is_empty());
}

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn foreign_and_double_free_are_unknown_pointers(simulated: bool) {
    let d = device(simulated, 64 * MIB);
    assert_unknown(d.free(0x1234_5600, 256), "allocation", 0x1234_5600);
    let p = d.alloc(1000).unwrap();
    // Wrong size: refused, and the allocation stays.
    let reason = invalid_argument(d.free(p, 999), "free");
    assert!(reason.contains("1000 B"), "{reason}");
    assert_eq!(d.census().allocations, 1);
    // An address inside the allocation is not the allocation.
    assert_unknown(d.free(p + 256, 1000), "allocation", p + 256);
    d.free(p, 1000).unwrap();
    assert_unknown(d.free(p, 1000), "allocation", p);
    assert!(d.census().is_empty());
}

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn mem_info_tracks_allocations_and_physical_memory(simulated: bool) {
    let cap = 100 * MIB;
    let d = device(simulated, cap);
    let info = d.mem_info().unwrap();
    assert_eq!((info.free, info.total), (cap, cap));
    assert_eq!(d.info().total_bytes, cap);
    let p = d.alloc(1000).unwrap();
    assert_eq!(d.mem_info().unwrap().free, cap - 1024);
    let h = vm(&d).create_physical(2 * G).unwrap();
    assert_eq!(d.mem_info().unwrap().free, cap - 1024 - 2 * G);
    assert_eq!(d.census().bytes_in_use, 1024 + 2 * G);
    d.free(p, 1000).unwrap();
    assert_eq!(d.mem_info().unwrap().free, cap - 2 * G);
    vm(&d).release_physical(h).unwrap();
    let info = d.mem_info().unwrap();
    assert_eq!((info.free, info.total), (cap, cap));
}

// ---- virtual memory -------------------------------------------------------------------

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn full_vmm_cycle(simulated: bool) {
    let cap = 64 * MIB;
    let d = device(simulated, cap);
    let v = vm(&d);
    assert_eq!(v.granularity(), G);
    let va = v.reserve(8 * G, 0).unwrap();
    assert_eq!(va % G, 0);
    let h = v.create_physical(2 * G).unwrap();
    // One handle at two addresses of the reservation.
    v.map(va, 2 * G, h, 0).unwrap();
    v.map(va + 4 * G, 2 * G, h, 0).unwrap();
    v.set_access(va, 2 * G).unwrap();
    v.set_access(va + 4 * G, 2 * G).unwrap();
    assert_eq!(
        d.census(),
        HostCensus {
            bytes_in_use: 2 * G,
            physical_handles: 1,
            mappings: 2,
            reservations: 1,
            ..HostCensus::default()
        }
    );
    if !simulated {
        fill(va, 2 * G, 7);
        assert!(
            holds(va + 4 * G, 2 * G, 7),
            "the second mapping does not see the bytes"
        );
        fill(va + 4 * G + G, G, 99);
        assert!(
            holds(va + G, G, 99),
            "the first mapping does not see the second's write"
        );
    }
    v.unmap(va, 2 * G).unwrap();
    v.unmap(va + 4 * G, 2 * G).unwrap();
    // The range stays reserved: it can be mapped again.
    v.map(va + 2 * G, 2 * G, h, 0).unwrap();
    v.set_access(va + 2 * G, 2 * G).unwrap();
    if !simulated {
        assert!(
            holds(va + 2 * G, G, 7),
            "the handle lost its bytes across unmap"
        );
    }
    v.unmap(va + 2 * G, 2 * G).unwrap();
    v.release_physical(h).unwrap();
    v.free_reservation(va, 8 * G).unwrap();
    assert!(d.census().is_empty(), "{:?}", d.census());
    assert_eq!(d.mem_info().unwrap().free, cap);
}

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn offsets_map_different_parts_of_a_handle(simulated: bool) {
    let d = device(simulated, 64 * MIB);
    let v = vm(&d);
    let va = v.reserve(4 * G, 0).unwrap();
    let h = v.create_physical(2 * G).unwrap();
    // The handle's two halves, swapped.
    v.map(va, G, h, G).unwrap();
    v.map(va + G, G, h, 0).unwrap();
    // Access may span several mappings at once.
    v.set_access(va, 2 * G).unwrap();
    if !simulated {
        fill(va, G, 1);
        fill(va + G, G, 2);
    }
    // One unmap may cover a run of whole mappings.
    v.unmap(va, 2 * G).unwrap();
    v.map(va + 2 * G, 2 * G, h, 0).unwrap();
    v.set_access(va + 2 * G, 2 * G).unwrap();
    if !simulated {
        assert!(holds(va + 2 * G, G, 2));
        assert!(holds(va + 3 * G, G, 1));
    }
    v.unmap(va + 2 * G, 2 * G).unwrap();
    v.release_physical(h).unwrap();
    v.free_reservation(va, 4 * G).unwrap();
    assert!(d.census().is_empty());
}

#[test_case(REAL, 0 ; "real, alignment 0 means the granularity")]
#[test_case(REAL, 64 * MIB ; "real, 64 MiB alignment")]
#[test_case(REAL, 4 * KIB ; "real, alignment below the granularity")]
#[test_case(SIMULATED, 0 ; "simulated, alignment 0 means the granularity")]
#[test_case(SIMULATED, 64 * MIB ; "simulated, 64 MiB alignment")]
#[test_case(SIMULATED, 4 * KIB ; "simulated, alignment below the granularity")]
fn reservations_are_aligned(simulated: bool, alignment: u64) {
    let d = device(simulated, 64 * MIB);
    let v = vm(&d);
    let want = alignment.max(G);
    let vas: Vec<u64> = (0..4)
        .map(|_| v.reserve(3 * G, alignment).unwrap())
        .collect();
    for &va in &vas {
        assert_eq!(va % want, 0, "{va:#x} is not aligned to {want}");
    }
    for va in vas {
        v.free_reservation(va, 3 * G).unwrap();
    }
    assert!(d.census().is_empty());
}

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn release_while_mapped_keeps_memory_until_unmap(simulated: bool) {
    let cap = 16 * MIB;
    let d = device(simulated, cap);
    let v = vm(&d);
    let va = v.reserve(2 * G, 0).unwrap();
    let h = v.create_physical(2 * G).unwrap();
    v.map(va, 2 * G, h, 0).unwrap();
    v.set_access(va, 2 * G).unwrap();
    if !simulated {
        fill(va, 2 * G, 42);
    }
    v.release_physical(h).unwrap();
    // Still charged, still readable, but no longer usable as a handle.
    assert_eq!(d.mem_info().unwrap().free, cap - 2 * G);
    assert_eq!(d.census().physical_handles, 1);
    assert_eq!(d.census().bytes_in_use, 2 * G);
    if !simulated {
        assert!(holds(va, 2 * G, 42), "released memory changed while mapped");
    }
    assert_unknown(v.release_physical(h), "physical handle", h.0);
    assert_unknown(v.map(va, 2 * G, h, 0), "physical handle", h.0);
    v.unmap(va, 2 * G).unwrap();
    assert_eq!(d.mem_info().unwrap().free, cap);
    assert_eq!(
        d.census(),
        HostCensus {
            reservations: 1,
            ..HostCensus::default()
        }
    );
    v.free_reservation(va, 2 * G).unwrap();
    assert!(d.census().is_empty());
}

#[test_case(3 * MIB ; "size not a multiple of the granularity")]
#[test_case(0 ; "zero size")]
#[test_case(G + 4 * KIB ; "size one page past a granule")]
#[test_case(256 ; "size below the granularity")]
fn misaligned_sizes_are_refused(size: u64) {
    for simulated in [REAL, SIMULATED] {
        let d = device(simulated, 64 * MIB);
        let v = vm(&d);
        let reason = invalid_argument(v.reserve(size, 0), "reserve");
        assert!(reason.contains("granularity"), "{reason}");
        let reason = invalid_argument(v.create_physical(size), "create_physical");
        assert!(reason.contains("granularity"), "{reason}");
        let va = v.reserve(4 * G, 0).unwrap();
        let h = v.create_physical(4 * G).unwrap();
        invalid_argument(v.map(va, size, h, 0), "map");
        v.map(va, 4 * G, h, 0).unwrap();
        invalid_argument(v.set_access(va, size), "set_access");
        invalid_argument(v.unmap(va, size), "unmap");
        v.unmap(va, 4 * G).unwrap();
        v.release_physical(h).unwrap();
        invalid_argument(v.free_reservation(va, size), "free_reservation");
        v.free_reservation(va, 4 * G).unwrap();
        assert!(d.census().is_empty());
    }
}

/// A reservation of 8 granules at `va` with a 4-granule handle `h`, whose first two granules
/// are mapped at `va + 2G` (with access), and a second handle `h2` not mapped.
struct Fixture<'a> {
    v: &'a dyn VirtualMemory,
    va: u64,
    h: PhysicalHandle,
    h2: PhysicalHandle,
}

/// What a validation case must produce.
#[derive(Debug)]
enum Expect {
    /// `InvalidArgument` from this call, with this text in the reason.
    Invalid(&'static str, &'static str),
    /// `UnknownPointer` naming this kind of thing.
    Unknown(&'static str),
}

type Case = fn(&Fixture) -> portalloc::Result<()>;

#[test_case(|f| f.v.reserve(4 * G, 3 * MIB).map(drop), Expect::Invalid("reserve", "power of two") ; "alignment not a power of two")]
#[test_case(|f| f.v.map(f.va + G / 2, G, f.h2, 0), Expect::Invalid("map", "address") ; "misaligned va")]
#[test_case(|f| f.v.map(f.va, G, f.h2, 4 * KIB), Expect::Invalid("map", "offset") ; "misaligned offset")]
#[test_case(|f| f.v.map(f.va, 2 * G, f.h2, 3 * G), Expect::Invalid("map", "past the end") ; "offset and size past the end of the handle")]
#[test_case(|f| f.v.map(f.va, 5 * G, f.h2, 0), Expect::Invalid("map", "past the end") ; "size larger than the handle")]
#[test_case(|f| f.v.map(f.va + 7 * G, 2 * G, f.h2, 0), Expect::Invalid("map", "reservation") ; "map straddling the end of the reservation")]
#[test_case(|f| f.v.map(f.va + 64 * G, G, f.h2, 0), Expect::Invalid("map", "reservation") ; "map outside any reservation")]
#[test_case(|f| f.v.map(f.va + 2 * G, 2 * G, f.h2, 0), Expect::Invalid("map", "overlaps") ; "double map")]
#[test_case(|f| f.v.map(f.va + G, 2 * G, f.h2, 0), Expect::Invalid("map", "overlaps") ; "map overlapping the start of a mapping")]
#[test_case(|f| f.v.map(f.va + 3 * G, 2 * G, f.h2, 0), Expect::Invalid("map", "overlaps") ; "map overlapping the end of a mapping")]
#[test_case(|f| f.v.map(f.va, G, PhysicalHandle(999), 0), Expect::Unknown("physical handle") ; "map an unknown handle")]
#[test_case(|f| f.v.release_physical(PhysicalHandle(f.h.0 + 100)), Expect::Unknown("physical handle") ; "release an unknown handle")]
#[test_case(|f| f.v.set_access(f.va, G), Expect::Invalid("set_access", "not entirely mapped") ; "set access on unmapped granules")]
#[test_case(|f| f.v.set_access(f.va + 2 * G, 3 * G), Expect::Invalid("set_access", "not entirely mapped") ; "set access past a mapping")]
#[test_case(|f| f.v.unmap(f.va + 2 * G, G), Expect::Invalid("unmap", "split") ; "unmap part of a mapping")]
#[test_case(|f| f.v.unmap(f.va + 3 * G, G), Expect::Invalid("unmap", "split") ; "unmap starting inside a mapping")]
#[test_case(|f| f.v.unmap(f.va + 2 * G, 4 * G), Expect::Invalid("unmap", "not mapped") ; "unmap past a mapping")]
#[test_case(|f| f.v.unmap(f.va, 2 * G), Expect::Invalid("unmap", "not mapped") ; "unmap unmapped granules")]
#[test_case(|f| f.v.free_reservation(f.va, 8 * G), Expect::Invalid("free_reservation", "mapping") ; "free a reservation with mappings")]
#[test_case(|f| f.v.free_reservation(f.va, 4 * G), Expect::Invalid("free_reservation", "reserved size") ; "free part of a reservation")]
#[test_case(|f| f.v.free_reservation(f.va + 2 * G, 2 * G), Expect::Unknown("reservation") ; "free inside a reservation")]
#[test_case(|f| f.v.free_reservation(0x7000_0000_0000, 2 * G), Expect::Unknown("reservation") ; "free an unknown reservation")]
fn validation(case: Case, expect: Expect) {
    for simulated in [REAL, SIMULATED] {
        let d = device(simulated, 64 * MIB);
        let v = vm(&d);
        let va = v.reserve(8 * G, 0).unwrap();
        let h = v.create_physical(4 * G).unwrap();
        let h2 = v.create_physical(4 * G).unwrap();
        v.map(va + 2 * G, 2 * G, h, 0).unwrap();
        v.set_access(va + 2 * G, 2 * G).unwrap();
        let fixture = Fixture { v, va, h, h2 };
        let before = d.census();
        let result = case(&fixture);
        match (&expect, result) {
            (Expect::Invalid(call, needle), Err(Error::InvalidArgument { call: c, reason })) => {
                assert_eq!(*call, c, "{reason}");
                assert!(reason.contains(needle), "{reason:?} lacks {needle:?}");
                // Errors read as a whole sentence: what was wrong and what is accepted.
                let text = Error::InvalidArgument { call: c, reason }.to_string();
                assert!(
                    text.contains("accepted") || text.contains("first"),
                    "{text}"
                );
            }
            (Expect::Unknown(what), Err(Error::UnknownPointer { what: w, .. })) => {
                assert_eq!(*what, w)
            }
            (expect, result) => {
                panic!("simulated={simulated}: expected {expect:?}, got {result:?}")
            }
        }
        assert_eq!(d.census(), before, "a refused call changed the books");
        // The fixture is still intact and comes apart cleanly.
        v.unmap(va + 2 * G, 2 * G).unwrap();
        v.release_physical(h).unwrap();
        v.release_physical(h2).unwrap();
        v.free_reservation(va, 8 * G).unwrap();
        assert!(d.census().is_empty(), "{:?}", d.census());
    }
}

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn adjacent_reservations_do_not_merge(simulated: bool) {
    let d = device(simulated, 64 * MIB);
    let v = vm(&d);
    let a = v.reserve(2 * G, 0).unwrap();
    let b = v.reserve(2 * G, 0).unwrap();
    let h = v.create_physical(4 * G).unwrap();
    // Whatever the addresses, a mapping may not run from one reservation into the next.
    let (lo, hi) = (a.min(b), a.max(b));
    invalid_argument(v.map(lo, 4 * G, h, 0), "map");
    if hi == lo + 2 * G {
        invalid_argument(v.map(lo + G, 2 * G, h, 0), "map");
    }
    v.release_physical(h).unwrap();
    v.free_reservation(a, 2 * G).unwrap();
    v.free_reservation(b, 2 * G).unwrap();
    assert_unknown(v.free_reservation(a, 2 * G), "reservation", a);
    assert!(d.census().is_empty());
}

/// `reserve_at`: a range freed is reserved again at its address, and maps; a hint over a live
/// reservation, over memory of another kind (a plain allocation: never replaced, its bytes
/// intact) or not a multiple of the alignment asked is relocated to a range of its own; a
/// hint off the granularity is refused. The host keeps released memory for no reservation.
#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn reserve_at_an_address(simulated: bool) {
    let d = device(simulated, 256 * MIB);
    let v = vm(&d);
    assert!(!v.holds_released_memory());
    let apart = |x: u64, xs: u64, y: u64, ys: u64| x + xs <= y || y + ys <= x;
    // Real mode: another thread of this test process may map into the freed range between
    // the free and the reserve (the kernel gives it to whoever asks first), so a few tries;
    // simulated, the first one.
    let va = (0..4)
        .find_map(|_| {
            let va = v.reserve(4 * G, 0).unwrap();
            v.free_reservation(va, 4 * G).unwrap();
            let again = v.reserve_at(4 * G, 0, va).unwrap();
            if again == va {
                return Some(va);
            }
            assert!(simulated, "simulated: the books give the free range");
            v.free_reservation(again, 4 * G).unwrap();
            None
        })
        .expect("a range freed is had again at its address");
    assert_eq!(d.census().reservations, 1);
    let h = v.create_physical(2 * G).unwrap();
    v.map(va + G, 2 * G, h, 0).unwrap();
    v.set_access(va + G, 2 * G).unwrap();
    if !simulated {
        fill(va + G, 2 * G, 3);
        assert!(holds(va + G, 2 * G, 3));
    }

    // Over the live reservation: elsewhere.
    let inside = v.reserve_at(2 * G, 0, va + 2 * G).unwrap();
    assert!(apart(inside, 2 * G, va, 4 * G), "{inside:#x}");
    // Over a plain allocation: elsewhere, the allocation untouched.
    let p = d.alloc(8 * G).unwrap();
    if !simulated {
        fill(p, 8 * G, 9);
    }
    let hint = p.next_multiple_of(G) + G;
    let beside = v.reserve_at(G, 0, hint).unwrap();
    assert!(
        apart(beside, G, p, 8 * G),
        "{beside:#x} lies in the allocation"
    );
    if !simulated {
        assert!(holds(p, 8 * G, 9), "the allocation was replaced");
        assert!(holds(va + G, 2 * G, 3), "the mapping was replaced");
    }
    // Not a multiple of the alignment asked: elsewhere, aligned as asked.
    let wide = v.reserve(32 * G, 0).unwrap();
    v.free_reservation(wide, 32 * G).unwrap();
    let odd = wide.next_multiple_of(16 * G) + G;
    let aligned = v.reserve_at(G, 16 * G, odd).unwrap();
    assert!(aligned != odd && aligned % (16 * G) == 0, "{aligned:#x}");
    // Off the granularity: refused.
    let reason = invalid_argument(v.reserve_at(G, 0, va + G / 2), "reserve_at");
    assert!(reason.contains("granularity"), "{reason}");
    // No hint is reserve.
    let anywhere = v.reserve_at(G, 0, 0).unwrap();

    v.unmap(va + G, 2 * G).unwrap();
    v.release_physical(h).unwrap();
    for (at, size) in [
        (va, 4 * G),
        (inside, 2 * G),
        (beside, G),
        (aligned, G),
        (anywhere, G),
    ] {
        v.free_reservation(at, size).unwrap();
    }
    d.free(p, 8 * G).unwrap();
    assert!(d.census().is_empty(), "{:?}", d.census());
}

// ---- construction ---------------------------------------------------------------------

#[test_case(0 ; "zero")]
#[test_case(3 * MIB ; "not a power of two")]
#[test_case(1000 ; "neither a power of two nor a page multiple")]
#[test_case(2 * KIB ; "power of two below the page size")]
fn granularity_is_validated(granularity: u64) {
    for simulated in [REAL, SIMULATED] {
        let result = HostDevice::builder()
            .granularity(granularity)
            .simulated(simulated)
            .capacity(GIB)
            .build();
        let reason = invalid_argument(result, "HostDeviceBuilder::granularity");
        assert!(
            reason.contains("power of two") && reason.contains("page size"),
            "{reason}"
        );
    }
}

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn other_granularities_apply_to_every_check(simulated: bool) {
    let g = 64 * KIB;
    let d = HostDevice::builder()
        .granularity(g)
        .simulated(simulated)
        .capacity(4 * MIB)
        .build()
        .unwrap();
    let v = vm(&d);
    assert_eq!(v.granularity(), g);
    assert_eq!(d.info().min_granularity, g);
    assert_eq!(d.info().recommended_granularity, g);
    let va = v.reserve(4 * g, 0).unwrap();
    assert_eq!(va % g, 0);
    let h = v.create_physical(g).unwrap();
    invalid_argument(v.map(va + g / 2, g, h, 0), "map");
    v.map(va + g, g, h, 0).unwrap();
    v.set_access(va + g, g).unwrap();
    if !simulated {
        fill(va + g, g, 3);
        assert!(holds(va + g, g, 3));
    }
    v.unmap(va + g, g).unwrap();
    v.release_physical(h).unwrap();
    v.free_reservation(va, 4 * g).unwrap();
    assert!(d.census().is_empty());
}

#[test]
fn defaults_and_info() {
    let real = HostDevice::builder().build().unwrap();
    let info = real.info();
    assert_eq!(info.name, "host");
    assert_eq!(info.arch, "host");
    assert_eq!(info.ordinal, 0);
    assert_eq!(info.vendor, portalloc::Vendor::Host);
    assert!(info.total_bytes > 0, "capacity defaults to physical memory");
    assert_eq!(real.mem_info().unwrap().total, info.total_bytes);
    assert_eq!(info.min_granularity, G);
    assert!(info.capabilities.virtual_memory);
    assert!(info.capabilities.stream_ordered_pool);
    assert!(real.virtual_memory().is_some());
    assert!(real.stream_ordered_pool().is_some());
    let note = |info: &portalloc::DeviceInfo, key: &str| {
        info.notes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(note(info, "mode").as_deref(), Some("real"));
    assert_eq!(note(info, "granularity").as_deref(), Some("2.00 MiB"));
    assert!(!real.is_simulated());

    let sim = HostDevice::builder()
        .simulated(true)
        .ordinal(3)
        .build()
        .unwrap();
    assert_eq!(sim.info().name, "host (simulated)");
    assert_eq!(sim.info().ordinal, 3);
    assert_eq!(note(sim.info(), "mode").as_deref(), Some("simulated"));
    assert!(sim.is_simulated());

    let named = HostDevice::builder()
        .name("H200 stand-in")
        .capacity(141 * GIB)
        .simulated(true)
        .build()
        .unwrap();
    assert_eq!(named.info().name, "H200 stand-in");
    assert_eq!(named.capacity(), 141 * GIB);
    assert!(format!("{named:?}").contains("H200 stand-in"));
}

#[test]
fn host_device_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<HostDevice>();
}

// ---- simulated mode -------------------------------------------------------------------

#[test]
fn simulated_141_gib_device_allocates_100_gib() {
    let cap = 141 * GIB;
    let d = device(SIMULATED, cap);
    let big = d.alloc(100 * GIB).unwrap();
    assert_eq!(d.mem_info().unwrap().free, 41 * GIB);
    match d.alloc(41 * GIB + 1) {
        Err(Error::DeviceOutOfMemory {
            requested, free, ..
        }) => assert_eq!((requested, free), (41 * GIB + 1, 41 * GIB)),
        other => panic!("expected DeviceOutOfMemory, got {other:?}"),
    }
    // The rest as VMM: reserve the whole device, map 40 GiB of it in 2 MiB chunks.
    let v = vm(&d);
    let va = v.reserve(cap, 0).unwrap();
    let chunks = (40 * GIB / G) as usize;
    let mut handles = Vec::with_capacity(chunks);
    for i in 0..chunks as u64 {
        let h = v.create_physical(G).unwrap();
        v.map(va + i * G, G, h, 0).unwrap();
        handles.push(h);
    }
    v.set_access(va, 40 * GIB).unwrap();
    assert_eq!(d.mem_info().unwrap().free, GIB);
    assert_eq!(d.census().mappings, chunks as u64);
    assert!(v.create_physical(GIB + G).unwrap_err().is_out_of_memory());
    for (i, h) in handles.into_iter().enumerate() {
        v.release_physical(h).unwrap();
        v.unmap(va + i as u64 * G, G).unwrap();
    }
    v.free_reservation(va, cap).unwrap();
    d.free(big, 100 * GIB).unwrap();
    assert!(d.census().is_empty());
    assert_eq!(d.mem_info().unwrap().free, cap);
}

#[test]
fn simulated_replay_of_many_huge_allocations_never_runs_out_of_addresses() {
    let cap = 141 * GIB;
    let d = device(SIMULATED, cap);
    let mut seen_max = 0;
    for _ in 0..20_000 {
        let p = d.alloc(cap).unwrap();
        assert!(p >= 1 << 40);
        seen_max = seen_max.max(p);
        d.free(p, cap).unwrap();
    }
    assert!(seen_max < 1 << 63);
    assert!(d.census().is_empty());
}

#[test]
fn concurrent_use_from_threads() {
    let d = device(SIMULATED, 64 * GIB);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let d = &d;
            s.spawn(move || {
                let v = vm(d);
                for i in 0..500u64 {
                    let size = 1 + (i * 7919 + t) % (8 * MIB);
                    let p = d.alloc(size).unwrap();
                    let va = v.reserve(2 * G, 0).unwrap();
                    let h = v.create_physical(G).unwrap();
                    v.map(va + G, G, h, 0).unwrap();
                    v.unmap(va + G, G).unwrap();
                    v.release_physical(h).unwrap();
                    v.free_reservation(va, 2 * G).unwrap();
                    d.free(p, size).unwrap();
                }
            });
        }
    });
    assert!(d.census().is_empty());
}

// ---- drop ---------------------------------------------------------------------------

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn dropping_a_device_returns_what_it_still_holds(simulated: bool) {
    let d = device(simulated, 64 * MIB);
    let v = vm(&d);
    d.alloc(5000).unwrap();
    let va = v.reserve(4 * G, 0).unwrap();
    let h = v.create_physical(2 * G).unwrap();
    v.map(va, 2 * G, h, 0).unwrap();
    v.set_access(va, 2 * G).unwrap();
    let h2 = v.create_physical(2 * G).unwrap();
    v.map(va + 2 * G, 2 * G, h2, 0).unwrap();
    v.release_physical(h2).unwrap();
    d.create_stream().unwrap();
    d.create_event().unwrap();
    // Pinned host memory in real mode (simulated mode maps none): not charged, counted.
    let pinned = d.alloc_pinned_host(3000).unwrap();
    assert_eq!(pinned.is_some(), !simulated);
    assert_eq!(
        d.census(),
        HostCensus {
            allocations: 1,
            bytes_in_use: 5120 + 4 * G,
            physical_handles: 2,
            mappings: 2,
            reservations: 1,
            streams: 1,
            events: 1,
            pinned_host: u64::from(!simulated),
            pinned_host_bytes: if simulated { 0 } else { 3000 },
        }
    );
    drop(d);
}

// ---- streams and events -------------------------------------------------------------

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn streams_have_fresh_ids(simulated: bool) {
    let d = device(simulated, 64 * MIB);
    let a = d.create_stream().unwrap();
    let b = d.create_stream().unwrap();
    assert!(a != Stream::DEFAULT && b != Stream::DEFAULT && a != b);
    assert_eq!(d.census().streams, 2);
    d.synchronize_stream(Stream::DEFAULT).unwrap();
    d.synchronize_stream(a).unwrap();
    // SAFETY: the host device only compares stream handles; the test uses none after.
    unsafe { d.destroy_stream(a) }.unwrap();
    // SAFETY: the host device only compares stream handles; the test uses none after.
    assert_unknown(unsafe { d.destroy_stream(a) }, "stream", a.as_raw());
    // Synchronising is a caller's right on any stream, a destroyed one's handle included.
    d.synchronize_stream(a).unwrap();
    // SAFETY: the host device only compares stream handles; the test uses none after.
    invalid_argument(
        unsafe { d.destroy_stream(Stream::DEFAULT) },
        "destroy_stream",
    );
    let c = d.create_stream().unwrap();
    assert!(c != a && c != b, "stream ids are not reused");
    // SAFETY: the host device only compares stream handles; the test uses none after.
    unsafe { d.destroy_stream(b) }.unwrap();
    // SAFETY: the host device only compares stream handles; the test uses none after.
    unsafe { d.destroy_stream(c) }.unwrap();
    assert!(d.census().is_empty());
}

#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn events_complete_at_once_unless_held(simulated: bool) {
    let d = device(simulated, 64 * MIB);
    let s = d.create_stream().unwrap();
    let e1 = d.create_event().unwrap();
    let e2 = d.create_event().unwrap();
    assert_ne!(e1, e2);
    assert_eq!(d.census().events, 2);
    // Never recorded: complete, as with the drivers.
    assert!(d.event_complete(e1).unwrap());
    d.record_event(e1, s).unwrap();
    assert!(d.event_complete(e1).unwrap());

    d.set_events_held(true);
    d.record_event(e1, s).unwrap();
    d.record_event(e2, Stream::DEFAULT).unwrap();
    assert!(!d.event_complete(e1).unwrap());
    assert!(!d.event_complete(e2).unwrap());
    assert_eq!(d.complete_held_events(), 2);
    assert!(d.event_complete(e1).unwrap() && d.event_complete(e2).unwrap());
    assert_eq!(d.complete_held_events(), 0);

    // Still held: a new record is pending again; synchronize_event completes it.
    d.record_event(e1, s).unwrap();
    assert!(!d.event_complete(e1).unwrap());
    d.synchronize_event(e1).unwrap();
    assert!(d.event_complete(e1).unwrap());

    // synchronize_stream completes the events recorded on that stream only.
    d.record_event(e1, s).unwrap();
    d.record_event(e2, Stream::DEFAULT).unwrap();
    d.synchronize_stream(s).unwrap();
    assert!(d.event_complete(e1).unwrap());
    assert!(!d.event_complete(e2).unwrap());

    // Releasing the hold completes everything pending.
    d.set_events_held(false);
    assert!(d.event_complete(e2).unwrap());
    d.record_event(e2, s).unwrap();
    assert!(d.event_complete(e2).unwrap());

    let gone = Event(e2.0 + 1000);
    assert_unknown(d.record_event(gone, s), "event", gone.0);
    assert_unknown(d.event_complete(gone), "event", gone.0);
    assert_unknown(d.synchronize_event(gone), "event", gone.0);
    // A stream the device never made (the caller's own) is accepted, and is a clock of its
    // own: its events complete in order, a wait for one completes the earlier ones.
    // SAFETY: the host device only compares stream handles.
    let theirs = unsafe { Stream::from_raw(s.as_raw() + 1000) };
    // SAFETY: the host device only compares stream handles; the test uses none after.
    assert_unknown(
        unsafe { d.destroy_stream(theirs) },
        "stream",
        theirs.as_raw(),
    );
    d.set_events_held(true);
    d.record_event(e1, theirs).unwrap();
    d.record_event(e2, theirs).unwrap();
    assert!(!d.event_complete(e1).unwrap() && !d.event_complete(e2).unwrap());
    d.synchronize_stream(s).unwrap();
    assert!(!d.event_complete(e1).unwrap(), "another stream's wait");
    d.synchronize_event(e2).unwrap();
    assert!(
        d.event_complete(e1).unwrap(),
        "waiting for e2 waited for the e1 before it"
    );
    d.record_event(e1, theirs).unwrap();
    d.record_event(e2, Stream::PER_THREAD).unwrap();
    d.synchronize_device().unwrap();
    assert!(d.event_complete(e1).unwrap() && d.event_complete(e2).unwrap());
    d.set_events_held(false);
    d.destroy_event(e1).unwrap();
    assert_unknown(d.destroy_event(e1), "event", e1.0);
    d.destroy_event(e2).unwrap();
    // SAFETY: the host device only compares stream handles; the test uses none after.
    unsafe { d.destroy_stream(s) }.unwrap();
    assert!(d.census().is_empty());
}

// ---- real mode, as the kernel sees it -------------------------------------------------

/// The permissions (`rw-s`, `---p`, …) of every mapping overlapping `[lo, hi)` in this
/// process, in address order, as `(start, end, perms, path)`.
fn kernel_view(lo: u64, hi: u64) -> Vec<(u64, u64, String, String)> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps is readable");
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            let perms = fields.next()?.to_string();
            let path = fields.nth(3).unwrap_or("").to_string();
            (start < hi && end > lo).then_some((start, end, perms, path))
        })
        .collect()
}

#[test]
#[cfg(target_os = "linux")]
fn real_mode_reserves_maps_and_protects_as_the_model_says() {
    let d = device(REAL, 64 * MIB);
    let v = vm(&d);
    let va = v.reserve(4 * G, 0).unwrap();
    let end = va + 4 * G;
    let view = kernel_view(va, end);
    assert!(
        view.first().is_some_and(|m| m.0 <= va)
            && view.last().is_some_and(|m| m.1 >= end)
            && view.iter().all(|(_, _, p, _)| p == "---p"),
        "a reservation is private and inaccessible: {view:x?}"
    );
    let h = v.create_physical(2 * G).unwrap();
    v.map(va + G, 2 * G, h, 0).unwrap();
    let mapped = kernel_view(va + G, va + 3 * G);
    assert!(
        !mapped.is_empty()
            && mapped
                .iter()
                .all(|(_, _, p, path)| p == "---s" && path.contains("portalloc-host-physical")),
        "a mapping is shared memory of the handle, still inaccessible: {mapped:x?}"
    );
    v.set_access(va + G, 2 * G).unwrap();
    let accessible = kernel_view(va + G, va + 3 * G);
    assert!(
        !accessible.is_empty() && accessible.iter().all(|(_, _, p, _)| p == "rw-s"),
        "set_access makes it readable and writable: {accessible:x?}"
    );
    // Outside the mapping, the reservation stays inaccessible.
    let outside = kernel_view(va, va + G);
    assert!(
        outside.iter().all(|(_, _, p, _)| p == "---p"),
        "{outside:x?}"
    );
    v.unmap(va + G, 2 * G).unwrap();
    let unmapped = kernel_view(va, end);
    assert!(
        !unmapped.is_empty() && unmapped.iter().all(|(_, _, p, _)| p == "---p"),
        "unmap keeps the range reserved: {unmapped:x?}"
    );
    v.release_physical(h).unwrap();
    // (That the range is gone afterwards cannot be checked here: tests running in parallel
    // may map it again at once.)
    v.free_reservation(va, 4 * G).unwrap();
}

// ---- copies between device and host memory, pinned host memory ----------------------

/// Device memory for copies: a reservation of 4 granules with two adjacent mappings of one
/// granule each at its start, read-write; returns the reservation and the handles.
fn mapped_with_access(d: &HostDevice) -> (u64, [PhysicalHandle; 2]) {
    let v = vm(d);
    let va = v.reserve(4 * G, 0).unwrap();
    let handles = [v.create_physical(G).unwrap(), v.create_physical(G).unwrap()];
    v.map(va, G, handles[0], 0).unwrap();
    v.map(va + G, G, handles[1], 0).unwrap();
    v.set_access(va, 2 * G).unwrap();
    (va, handles)
}

/// Gives back what [`mapped_with_access`] made.
fn unmap_all(d: &HostDevice, va: u64, handles: [PhysicalHandle; 2]) {
    let v = vm(d);
    v.unmap(va, 2 * G).unwrap();
    for h in handles {
        v.release_physical(h).unwrap();
    }
    v.free_reservation(va, 4 * G).unwrap();
}

/// Bytes written into a mapped range come back through `copy_to_host` into pinned memory —
/// across the boundary of two mappings, at an odd offset — and return through
/// `copy_from_host` into another mapped range and into a plain allocation, byte for byte.
#[test]
fn copies_round_trip_through_pinned_memory() {
    let d = device(REAL, 256 * MIB);
    let (a, ha) = mapped_with_access(&d);
    let (b, hb) = mapped_with_access(&d);
    let plain = d.alloc(3 * MIB).unwrap();
    let (from, len) = (a + G - 12_345, MIB + 777);
    fill(a, 2 * G, 7);
    let s = d.create_stream().unwrap();
    let pinned = d
        .alloc_pinned_host(len)
        .unwrap()
        .expect("real mode has pinned memory");
    assert_eq!(pinned.as_ptr() as u64 % 4096, 0, "page-aligned");
    assert_eq!(
        (d.census().pinned_host, d.census().pinned_host_bytes),
        (1, len)
    );
    let e = d.create_event().unwrap();
    // SAFETY: `pinned` holds `len` bytes until freed below, after the stream is synchronised;
    // the device ranges are checked by the device.
    unsafe {
        d.copy_to_host(pinned.as_ptr(), from, len, s).unwrap();
        d.record_event(e, s).unwrap();
        d.synchronize_event(e).unwrap();
        let host = std::slice::from_raw_parts(pinned.as_ptr(), len as usize);
        let offset = (from - a) as usize;
        assert!(host
            .iter()
            .enumerate()
            .all(|(i, &x)| x == pattern(offset + i, 7)));
        d.copy_from_host(b + 5, pinned.as_ptr(), len, s).unwrap();
        d.copy_from_host(plain + 1, pinned.as_ptr(), len, Stream::PER_THREAD)
            .unwrap();
    }
    d.synchronize_stream(s).unwrap();
    d.synchronize_stream(Stream::PER_THREAD).unwrap();
    // SAFETY: mapped read-write and allocated by this device, `len` bytes from each start.
    let (into_b, into_plain) = unsafe {
        (
            std::slice::from_raw_parts((b + 5) as *const u8, len as usize),
            std::slice::from_raw_parts((plain + 1) as *const u8, len as usize),
        )
    };
    // SAFETY: as above, from the source range.
    let source = unsafe { std::slice::from_raw_parts(from as *const u8, len as usize) };
    assert!(into_b == source && into_plain == source, "byte-identical");
    // SAFETY: from this device, no copy in flight (both streams synchronised).
    unsafe { d.free_pinned_host(pinned, len) }.unwrap();
    assert_eq!(d.hazards().0, 0);
    d.destroy_event(e).unwrap();
    // SAFETY: this test's stream, idle, not used again.
    unsafe { d.destroy_stream(s) }.unwrap();
    d.free(plain, 3 * MIB).unwrap();
    unmap_all(&d, a, ha);
    unmap_all(&d, b, hb);
    assert!(d.census().is_empty(), "{:?}", d.census());
}

/// A copy queued behind a kernel in flight on its stream — or behind a GPU-side wait for an
/// event after one on another stream — completes only after the kernel (an event recorded
/// after the copy says so); unmapping the copy's range before then is a hazard naming the
/// copy, though no kernel uses the range.
#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn a_copy_behind_a_kernel_completes_after_it(simulated: bool) {
    let d = device(simulated, 256 * MIB);
    let v = vm(&d);
    let (va, handles) = mapped_with_access(&d);
    let (s, t) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    let (after_copy, on_s) = (d.create_event().unwrap(), d.create_event().unwrap());
    let mut host = vec![0u8; 4096];

    // On the kernel's own stream: a kernel over the first mapping, the copy reads the second.
    let kernel = d.launch(s, va, G);
    // SAFETY: `host` outlives the copy (its completion is waited for below); the device range
    // is checked by the device.
    unsafe { d.copy_to_host(host.as_mut_ptr(), va + G, 4096, s) }.unwrap();
    d.record_event(after_copy, s).unwrap();
    assert!(!d.event_complete(after_copy).unwrap(), "behind the kernel");
    v.unmap(va + G, G).unwrap();
    let (count, texts) = d.hazards();
    assert_eq!(count, 1, "{texts:?}");
    assert!(
        texts[0].starts_with(&format!("unmap of [{:#x}", va + G))
            && texts[0].contains("a copy queued on a stream"),
        "{texts:?}"
    );
    d.finish(kernel);
    assert!(
        d.event_complete(after_copy).unwrap(),
        "done with the kernel"
    );

    // On another stream, behind a GPU-side wait for an event after a kernel on `s`.
    let kernel = d.launch(s, va + 3 * G, G);
    d.record_event(on_s, s).unwrap();
    d.wait_event(t, on_s).unwrap();
    // SAFETY: as above.
    unsafe { d.copy_from_host(va + 100, host.as_ptr(), 4096, t) }.unwrap();
    d.record_event(after_copy, t).unwrap();
    assert!(
        !d.event_complete(after_copy).unwrap(),
        "t waits for the kernel on s"
    );
    assert_eq!(d.kernel_done(kernel), Some(false));
    d.finish(kernel);
    assert!(d.event_complete(after_copy).unwrap());
    assert_eq!(d.hazards().0, 1, "no other hazard");

    v.unmap(va, G).unwrap();
    for h in handles {
        v.release_physical(h).unwrap();
    }
    v.free_reservation(va, 4 * G).unwrap();
    for e in [after_copy, on_s] {
        d.destroy_event(e).unwrap();
    }
    // SAFETY: this test's streams, idle, not used again.
    unsafe {
        d.destroy_stream(s).unwrap();
        d.destroy_stream(t).unwrap();
    }
    assert!(d.census().is_empty(), "{:?}", d.census());
}

/// A copy still in flight holds its memory like a kernel: freeing the device allocation or the
/// pinned host memory before the copy completed is a hazard, and names the copy.
#[test]
fn freeing_memory_of_a_copy_in_flight_is_a_hazard() {
    let d = device(REAL, 256 * MIB);
    let s = d.create_stream().unwrap();
    let plain = d.alloc(MIB).unwrap();
    let other = d.alloc(MIB).unwrap();
    let pinned = d.alloc_pinned_host(MIB).unwrap().unwrap();
    let kernel = d.launch(s, other, MIB);
    // SAFETY: `pinned` and `plain` are this device's, `MIB` bytes each.
    unsafe { d.copy_to_host(pinned.as_ptr(), plain, MIB, s) }.unwrap();
    // SAFETY: a hazard on purpose: the copy on `s` is still behind the kernel.
    unsafe { d.free_pinned_host(pinned, MIB) }.unwrap();
    d.free(plain, MIB).unwrap();
    let (count, texts) = d.hazards();
    assert_eq!(count, 2, "{texts:?}");
    assert!(
        texts
            .iter()
            .all(|t| t.contains("a copy queued on a stream")),
        "{texts:?}"
    );
    assert!(
        texts[0].starts_with("a free of pinned host memory"),
        "{texts:?}"
    );
    d.finish(kernel);
    d.free(other, MIB).unwrap();
    // SAFETY: this test's stream, idle now, not used again.
    unsafe { d.destroy_stream(s) }.unwrap();
    assert!(d.census().is_empty(), "{:?}", d.census());
}

/// Copies of ranges that are not device memory with access are refused — typed, naming the
/// range — before a byte is touched (in real mode, reading them would fault the process): a
/// reserved range with nothing mapped, a mapping without access, an address of no
/// reservation or allocation, a range past an allocation, a null or overlapping host pointer.
#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn copies_of_memory_not_mapped_with_access_are_refused(simulated: bool) {
    let d = device(simulated, 256 * MIB);
    let v = vm(&d);
    let va = v.reserve(4 * G, 0).unwrap();
    let h = v.create_physical(G).unwrap();
    let mut host = vec![0u8; 64];
    let buf = host.as_mut_ptr();
    // SAFETY: every call below is refused before anything is read or written.
    let to_host = |src: u64, size: u64| unsafe { d.copy_to_host(buf, src, size, Stream::DEFAULT) };
    let reason = invalid_argument(to_host(va + 8, 16), "copy_to_host");
    assert!(
        reason.contains("is not mapped") && reason.contains(&format!("{:#x}", va + 8)),
        "{reason}"
    );
    v.map(va, G, h, 0).unwrap();
    let reason = invalid_argument(to_host(va + 8, 16), "copy_to_host");
    assert!(reason.contains("mapped without access"), "{reason}");
    v.set_access(va, G).unwrap();
    to_host(va + 8, 16).unwrap();
    let reason = invalid_argument(to_host(va + G - 8, 16), "copy_to_host");
    assert!(
        reason.contains(&format!("is not mapped at {:#x}", va + G)),
        "{reason}"
    );
    assert_unknown(to_host(0x10, 16), "device memory", 0x10);
    let plain = d.alloc(100).unwrap();
    to_host(plain, 64).unwrap();
    let reason = invalid_argument(to_host(plain + 50, 64), "copy_to_host");
    assert!(
        reason.contains("runs past the end of the allocation"),
        "{reason}"
    );
    // The host side: null, and (real mode, where device memory is host memory) overlapping.
    // SAFETY: refused before anything is read.
    let null = unsafe { d.copy_from_host(va, std::ptr::null(), 16, Stream::DEFAULT) };
    let reason = invalid_argument(null, "copy_from_host");
    assert!(
        reason.contains("src") && reason.contains("null"),
        "{reason}"
    );
    if !simulated {
        // SAFETY: refused before anything is read or written.
        let overlap = unsafe { d.copy_to_host((va + 4) as *mut u8, va, 16, Stream::DEFAULT) };
        assert!(invalid_argument(overlap, "copy_to_host").contains("overlaps"));
    } else {
        // Simulated: checked and queued, but no bytes move.
        host.fill(0xAB);
        // SAFETY: `host` holds 64 bytes; nothing is written in simulated mode.
        unsafe { d.copy_to_host(host.as_mut_ptr(), va, 64, Stream::DEFAULT) }.unwrap();
        assert!(host.iter().all(|&x| x == 0xAB));
    }
    d.free(plain, 100).unwrap();
    v.unmap(va, G).unwrap();
    v.release_physical(h).unwrap();
    v.free_reservation(va, 4 * G).unwrap();
    assert!(d.census().is_empty(), "{:?}", d.census());
}

/// A copy of zero bytes is success and queues nothing: no check, no operation a kernel holds
/// back, nothing in flight when its memory goes.
#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn zero_size_copies_are_ok_and_queue_nothing(simulated: bool) {
    let d = device(simulated, 256 * MIB);
    let s = d.create_stream().unwrap();
    let plain = d.alloc(MIB).unwrap();
    let kernel = d.launch(s, 0, 1);
    // SAFETY: zero bytes: nothing is read or written, whatever the pointers.
    unsafe {
        d.copy_to_host(std::ptr::null_mut(), 0xdead_0000, 0, s)
            .unwrap();
        d.copy_from_host(plain, std::ptr::null(), 0, s).unwrap();
    }
    d.free(plain, MIB).unwrap();
    assert_eq!(
        d.hazards().0,
        0,
        "nothing was in flight over the allocation"
    );
    d.finish(kernel);
    // SAFETY: this test's stream, idle, not used again.
    unsafe { d.destroy_stream(s) }.unwrap();
    assert!(d.census().is_empty());
}

/// Pinned host memory: real mode maps it, readable and writable, counted until freed (the
/// wrong size, a second free and a foreign pointer refused); zero bytes is an invalid size;
/// simulated mode has none.
#[test_case(REAL ; "real")]
#[test_case(SIMULATED ; "simulated")]
fn pinned_memory_is_counted_until_freed(simulated: bool) {
    let d = device(simulated, 64 * MIB);
    assert!(matches!(
        d.alloc_pinned_host(0),
        Err(Error::InvalidSize { size: 0, .. })
    ));
    let Some(p) = d.alloc_pinned_host(10_000).unwrap() else {
        assert!(simulated, "real mode has pinned memory");
        assert!(d.census().is_empty());
        return;
    };
    fill(p.as_ptr() as u64, 10_000, 3);
    assert!(holds(p.as_ptr() as u64, 10_000, 3));
    assert_eq!(d.census().pinned_host, 1);
    assert_eq!(d.census().bytes_in_use, 0, "host memory: not charged");
    // SAFETY: refused before anything is freed: the wrong size.
    let wrong = unsafe { d.free_pinned_host(p, 4096) };
    assert!(invalid_argument(wrong, "free_pinned_host").contains("10000"));
    // SAFETY: this device's, no copy used it.
    unsafe { d.free_pinned_host(p, 10_000) }.unwrap();
    assert!(d.census().is_empty(), "{:?}", d.census());
    // SAFETY: refused before anything is freed: freed already.
    let again = unsafe { d.free_pinned_host(p, 10_000) };
    assert_unknown(again, "pinned host memory", p.as_ptr() as u64);
}
