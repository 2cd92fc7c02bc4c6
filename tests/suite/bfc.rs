//! Executable specification of the `bfc` strategy (XLA's BFC rules) over a simulated host
//! device.

use std::sync::Arc;

use crate::support::common::{alloc, bfc, free, refused_free, simulated_host};
use portalloc::backends::host::HostDevice;
use portalloc::strategy::bfc::{BfcAllocator, BfcOptions, MAX_ALIGNMENT};
use portalloc::{Allocation, Allocator, Error, Stats, Stream};
use test_case::test_case;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A preallocating allocator over a roomy device.
fn prealloc(limit: u64) -> BfcAllocator<HostDevice> {
    bfc(&simulated_host(limit + GIB), limit, true)
}

/// A growing allocator over a roomy device.
fn growing(limit: u64) -> BfcAllocator<HostDevice> {
    bfc(&simulated_host(limit + GIB), limit, false)
}

/// Keeps an allocation live for the rest of the test (the allocator's drop returns it).
fn hold(x: Allocation) {
    let _live = x;
}

fn oom(result: portalloc::Result<Allocation>) -> portalloc::OomReport {
    match result {
        Err(Error::OutOfMemory(report)) => *report,
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
}

// ---- rounding and alignment ----

#[test_case(1, 256 ; "one byte rounds to 256")]
#[test_case(256, 256 ; "256 stays")]
#[test_case(257, 512 ; "257 rounds to 512")]
#[test_case(MIB + 1, MIB + 256 ; "just over a MiB")]
fn sizes_round_up_to_256(size: u64, rounded: u64) {
    let a = prealloc(64 * MIB);
    let x = alloc(&a, size);
    assert_eq!(x.size(), size);
    assert_eq!(a.stats().bytes_in_use, rounded);
    assert_eq!(x.ptr() % 256, 0);
    free(&a, x);
    assert_eq!(a.stats().bytes_in_use, 0);
}

#[test_case(0 ; "zero means 256")]
#[test_case(1 ; "one")]
#[test_case(512 ; "512")]
#[test_case(4096 ; "4 KiB")]
#[test_case(MIB ; "1 MiB")]
fn alignment_is_honoured(alignment: u64) {
    let a = prealloc(64 * MIB);
    // Put the free space's start off any large boundary first.
    let first = alloc(&a, 256);
    let x = a.allocate(1000, alignment, Stream::DEFAULT, "t").unwrap();
    a.check_invariants().unwrap();
    assert_eq!(x.ptr() % alignment.max(256), 0);
    // Only the chunks count as in use; the front padding went back to the free lists.
    assert_eq!(a.stats().bytes_in_use, 256 + 1024);
    free(&a, x);
    free(&a, first);
    assert_eq!(a.stats().largest_free_block_bytes, 64 * MIB);
}

#[test]
fn large_alignment_grows_with_room_to_align() {
    let a = growing(GIB);
    let _small = alloc(&a, 256);
    let x = a.allocate(3 * MIB, 64 * MIB, Stream::DEFAULT, "t").unwrap();
    a.check_invariants().unwrap();
    assert_eq!(x.ptr() % (64 * MIB), 0);
    // The new region had to hold the request plus the worst-case padding.
    assert!(a.region_sizes()[1] >= 3 * MIB + 64 * MIB - 256);
}

#[test_case(3 ; "three")]
#[test_case(768 ; "not a power of two")]
#[test_case(2 * GIB ; "above the maximum")]
fn bad_alignment_is_refused(alignment: u64) {
    let a = prealloc(64 * MIB);
    match a.allocate(256, alignment, Stream::DEFAULT, "t") {
        Err(Error::InvalidAlignment {
            alignment: got,
            max,
        }) => {
            assert_eq!((got, max), (alignment, MAX_ALIGNMENT));
        }
        other => panic!("expected InvalidAlignment, got {other:?}"),
    }
    assert_eq!(a.stats().num_allocs, 0);
}

#[test]
fn overflowing_size_is_invalid() {
    let a = prealloc(64 * MIB);
    assert!(matches!(
        a.allocate(u64::MAX, 0, Stream::DEFAULT, "t"),
        Err(Error::InvalidSize { size: u64::MAX, .. })
    ));
    assert!(matches!(
        a.allocate(u64::MAX - 100, 0, Stream::DEFAULT, "t"),
        Err(Error::InvalidSize { .. })
    ));
    assert_eq!(a.stats().pool_bytes, 0, "nothing taken from the device");
}

// ---- split rule ----

#[test_case(300, 200, 300 ; "300 for 200 is not split")]
#[test_case(400, 200, 200 ; "twice the request is split")]
#[test_case(398, 200, 200 ; "leftover 198 MiB over 128 MiB is split")]
#[test_case(328, 200, 200 ; "leftover exactly 128 MiB is split")]
#[test_case(326, 200, 326 ; "leftover 126 MiB is not split")]
#[test_case(1024, 700, 700 ; "1 GiB for 700 MiB is split")]
fn split_rule(chunk_mib: u64, request_mib: u64, in_use_mib: u64) {
    let a = prealloc(chunk_mib * MIB);
    let x = alloc(&a, request_mib * MIB);
    let s = a.stats();
    assert_eq!(s.bytes_in_use, in_use_mib * MIB);
    assert_eq!(s.largest_alloc_size, in_use_mib * MIB);
    assert_eq!(s.largest_free_block_bytes, (chunk_mib - in_use_mib) * MIB);
    free(&a, x);
}

// ---- best fit ----

#[test]
fn best_fit_smallest_then_lowest_address() {
    let a = prealloc(64 * MIB);
    // Holes of 1 MiB, 512 KiB, 512 KiB, 2 MiB, kept apart by 256-byte chunks.
    let sizes = [MIB, 256, 512 * KIB, 256, 512 * KIB, 256, 2 * MIB, 256];
    let mut xs: Vec<Option<Allocation>> = sizes.iter().map(|&s| Some(alloc(&a, s))).collect();
    let addr: Vec<u64> = xs.iter().map(|x| x.as_ref().unwrap().ptr()).collect();
    for i in [0, 2, 4, 6] {
        free(&a, xs[i].take().unwrap());
    }
    let y1 = alloc(&a, 512 * KIB);
    assert_eq!(y1.ptr(), addr[2], "equal sizes: the lower address");
    let y2 = alloc(&a, 512 * KIB);
    assert_eq!(y2.ptr(), addr[4]);
    let y3 = alloc(&a, 400 * KIB);
    assert_eq!(
        y3.ptr(),
        addr[0],
        "the smallest hole that fits (1 MiB), not a larger one"
    );
    let y4 = alloc(&a, 2 * MIB);
    assert_eq!(y4.ptr(), addr[6]);
    let y5 = alloc(&a, 256);
    assert_eq!(
        y5.ptr(),
        addr[0] + 400 * KIB,
        "the 624 KiB left of the 1 MiB hole"
    );
}

// ---- coalescing ----

#[test_case(&[0, 1], 2, 3 ; "left")]
#[test_case(&[2, 1], 2, 3 ; "right")]
#[test_case(&[0, 2, 1], 3, 2 ; "both sides")]
#[test_case(&[0, 2], 1, 4 ; "apart, no merge")]
#[test_case(&[3, 1, 0, 2], 4, 1 ; "everything back to one chunk")]
fn coalescing(order: &[usize], largest_mib: u64, chunks: u64) {
    // Exactly 4 × 1 MiB in a 4 MiB region.
    let a = prealloc(4 * MIB);
    let mut xs: Vec<Option<Allocation>> = (0..4).map(|_| Some(alloc(&a, MIB))).collect();
    assert_eq!(a.stats().largest_free_block_bytes, 0);
    for &i in order {
        free(&a, xs[i].take().unwrap());
    }
    assert_eq!(a.stats().largest_free_block_bytes, largest_mib * MIB);
    let report = oom(a.allocate(64 * MIB, 0, Stream::DEFAULT, "t"));
    let total: u64 = report.bins.iter().map(|b| b.total_chunks).sum();
    assert_eq!(total, chunks);
}

#[test]
fn never_coalesces_across_regions() {
    let a = growing(GIB);
    let x = alloc(&a, 2 * MIB); // fills region 1 (2 MiB)
    let y = alloc(&a, 4 * MIB); // fills region 2 (4 MiB)
    assert_eq!(a.region_sizes(), vec![2 * MIB, 4 * MIB]);
    free(&a, x);
    free(&a, y);
    let s = a.stats();
    assert_eq!(s.largest_free_block_bytes, 4 * MIB);
    assert!((s.fragmentation - 2.0 / 6.0).abs() < 1e-12);
}

// ---- growth ----

#[test]
fn growth_doubles_region_sizes() {
    let a = growing(GIB);
    for _ in 0..30 {
        hold(alloc(&a, MIB));
    }
    assert_eq!(a.region_sizes(), vec![2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB]);
    let s = a.stats();
    assert_eq!(
        (s.pool_bytes, s.bytes_in_use, s.largest_free_block_bytes),
        (30 * MIB, 30 * MIB, 0)
    );
    hold(alloc(&a, MIB));
    assert_eq!(a.region_sizes().last(), Some(&(32 * MIB)));
}

#[test]
fn a_large_request_doubles_until_it_fits_and_stays() {
    let a = growing(GIB);
    let _x = alloc(&a, MIB); // region 2 MiB; next 4 MiB
    let _y = alloc(&a, 10 * MIB); // 4 → 8 → 16 MiB (handed out whole); stays 16
    assert_eq!(a.region_sizes(), vec![2 * MIB, 16 * MIB]);
    let _z = alloc(&a, 7 * MIB); // 1 MiB and 6 MiB free: grows by 16, then doubles to 32
    assert_eq!(a.region_sizes(), vec![2 * MIB, 16 * MIB, 16 * MIB]);
    let _w = alloc(&a, 10 * MIB);
    assert_eq!(
        a.region_sizes(),
        vec![2 * MIB, 16 * MIB, 16 * MIB, 32 * MIB]
    );
}

#[test]
fn growth_is_capped_by_the_limit() {
    // Limit 10 MiB: regions 2, 4, then only 4 MiB left of the doubled 8.
    let a = growing(10 * MIB);
    for _ in 0..10 {
        hold(alloc(&a, MIB));
    }
    assert_eq!(a.region_sizes(), vec![2 * MIB, 4 * MIB, 4 * MIB]);
    let report = oom(a.allocate(MIB, 0, Stream::DEFAULT, "t"));
    assert!(report.cause.contains("limit"), "{}", report.cause);
    assert_eq!(report.pool_bytes, 10 * MIB);
}

#[test]
fn limit_below_two_mib_starts_small() {
    let a = growing(MIB + 1000);
    let _x = alloc(&a, 1);
    assert_eq!(
        a.region_sizes(),
        vec![MIB + 768],
        "the limit rounded down to 256"
    );
}

/// The ×0.9 back-off of XLA's `Extend`, computed independently.
fn backed_off(mut bytes: u64, fits: impl Fn(u64) -> bool) -> u64 {
    while !fits(bytes) {
        bytes = (bytes * 9 / 10).div_ceil(256) * 256;
    }
    bytes
}

#[test]
fn growth_backs_off_when_the_device_refuses() {
    let dev = simulated_host(10 * MIB);
    let a = bfc(&dev, 100 * MIB, false);
    let mut served = 0;
    let err = loop {
        match a.allocate(MIB, 0, Stream::DEFAULT, "t") {
            Ok(x) => {
                hold(x);
                served += 1;
            }
            Err(e) => break e,
        }
        a.check_invariants().unwrap();
    };
    // 2 and 4 MiB; then 8 MiB is refused with 4 MiB free, and ×0.9 steps reach 4012800.
    let third = backed_off(8 * MIB, |b| b <= 4 * MIB);
    assert_eq!(third, 4_012_800);
    assert_eq!(a.region_sizes(), vec![2 * MIB, 4 * MIB, third]);
    assert_eq!(served, 2 + 4 + 3);
    let report = err.oom_report().expect("an OOM report");
    assert!(report.cause.contains("device refused"), "{}", report.cause);
    assert!(
        report.cause.contains("host device out of memory"),
        "{}",
        report.cause
    );
    assert_eq!(report.device_free, Some(10 * MIB - 6 * MIB - third));
}

#[test]
fn backs_off_during_one_growth_only_like_xla() {
    // 7 MiB device: 2 + 4 MiB, then 8 MiB refused and the back-off cannot reach 1 MiB free.
    let dev = simulated_host(7 * MIB);
    let a = bfc(&dev, 100 * MIB, false);
    let xs: Vec<Allocation> = (0..6).map(|_| alloc(&a, MIB)).collect();
    assert!(a.allocate(MIB, 0, Stream::DEFAULT, "t").is_err());
    for x in xs {
        free(&a, x);
    }
    assert_eq!(a.trim().unwrap(), 6 * MIB);
    // 7 MiB free now, but the next region (8 MiB) is refused and XLA's allocator never
    // backs off twice (`started_backpedal_`).
    let report = oom(a.allocate(MIB, 0, Stream::DEFAULT, "t"));
    assert_eq!(report.device_free, Some(7 * MIB));
    assert!(report.cause.contains("device refused"), "{}", report.cause);
}

// ---- preallocation ----

#[test]
fn preallocation_is_taken_at_the_first_allocation() {
    let dev = simulated_host(GIB);
    let a = bfc(&dev, 5 * MIB + 1, true);
    assert_eq!(dev.census().allocations, 0, "nothing at construction");
    assert_eq!(a.stats().pool_bytes, 0);
    let x = alloc(&a, 1);
    assert_eq!(dev.census().allocations, 1);
    assert_eq!(
        dev.census().bytes_in_use,
        6 * MIB,
        "the limit rounded up to 2 MiB"
    );
    assert_eq!(a.region_sizes(), vec![6 * MIB]);
    assert_eq!(a.stats().pool_bytes, 6 * MIB);
    // It never grows.
    let y = alloc(&a, 5 * MIB);
    let report = oom(a.allocate(2 * MIB, 0, Stream::DEFAULT, "t"));
    assert!(report.cause.contains("never grows"), "{}", report.cause);
    assert_eq!(dev.census().allocations, 1);
    free(&a, x);
    free(&a, y);
    drop(a);
    assert_eq!(dev.census().allocations, 0, "the region went back at drop");
}

#[test]
fn refused_preallocation_is_an_oom_naming_the_device() {
    let dev = simulated_host(4 * MIB);
    let a = bfc(&dev, 8 * MIB, true);
    let report = oom(a.allocate(256, 0, Stream::DEFAULT, "t"));
    assert!(
        report.cause.contains("refused the preallocation"),
        "{}",
        report.cause
    );
    assert!(
        report.cause.contains("host device out of memory"),
        "{}",
        report.cause
    );
    assert_eq!(report.device_free, Some(4 * MIB));
    assert_eq!((report.pool_bytes, dev.census().allocations), (0, 0));
}

// ---- OOM report ----

#[test]
fn oom_report_says_why() {
    let dev = simulated_host(GIB);
    let a = bfc(&dev, 8 * MIB, true);
    let xs: Vec<Allocation> = (0..8).map(|_| alloc(&a, MIB - 200)).collect();
    let mut xs: Vec<Option<Allocation>> = xs.into_iter().map(Some).collect();
    for i in [1, 3, 4] {
        free(&a, xs[i].take().unwrap());
    }
    // Free: 1 MiB at 1, 2 MiB at 3–4: 3 MiB free, largest 2 MiB.
    let report = oom(a.allocate(3 * MIB + 1, 0, Stream::DEFAULT, "t"));
    assert_eq!(report.allocator, "bfc");
    assert_eq!(report.requested, 3 * MIB + 1);
    assert_eq!(report.rounded, 3 * MIB + 256);
    assert_eq!(report.alignment, 256);
    assert_eq!(report.limit, Some(8 * MIB));
    assert_eq!(report.bytes_in_use, 5 * MIB);
    assert_eq!(report.pool_bytes, 8 * MIB);
    assert_eq!(report.largest_free_block, 2 * MIB);
    assert!((report.fragmentation - 1.0 / 3.0).abs() < 1e-12);
    assert_eq!(report.device_free, Some(GIB - 8 * MIB));
    assert!(
        report.cause.contains("preallocated region"),
        "{}",
        report.cause
    );
    // Bin 12 (1 MiB): 5 chunks in use of 1 MiB, a free 1 MiB one; bin 13: the free 2 MiB.
    let b12 = report.bins.iter().find(|b| b.index == 12).unwrap();
    assert_eq!((b12.total_chunks, b12.chunks_in_use), (6, 5));
    assert_eq!((b12.total_bytes, b12.bytes_in_use), (6 * MIB, 5 * MIB));
    assert_eq!(b12.requested_bytes_in_use, 5 * (MIB - 200));
    let b13 = report.bins.iter().find(|b| b.index == 13).unwrap();
    assert_eq!(
        (b13.total_chunks, b13.chunks_in_use, b13.min_size),
        (1, 0, 2 * MIB)
    );
    assert_eq!(report.bins.len(), 2);
    // Map: 12.5 cells per MiB chunk; 200 B of slack per chunk never dominates a cell. Cells
    // 12, 37 and 62 straddle a used and a free chunk: the free side has ~200 B more.
    assert_eq!(report.regions.len(), 1);
    let map = &report.regions[0].map;
    assert_eq!(map.chars().count(), 100);
    assert!(map.chars().all(|c| matches!(c, '*' | 'x' | '_')));
    let expected = format!(
        "{}{}{}{}{}",
        "*".repeat(12),
        "_".repeat(13),
        "*".repeat(12),
        "_".repeat(26),
        "*".repeat(37)
    );
    assert_eq!(map, &expected);
    let text = Error::OutOfMemory(Box::new(report.clone())).to_string();
    assert!(
        text.starts_with("bfc ran out of memory trying to allocate 3.00 MiB"),
        "{text}"
    );
    assert!(
        text.contains("limit:              8.00 MiB (8388608 B)"),
        "{text}"
    );
    assert!(text.contains("largest free chunk: 2.00 MiB"), "{text}");
    assert!(text.contains("fragmentation:      33.3%"), "{text}");
    assert!(
        text.contains("Bin (1.00 MiB): Total Chunks: 6, Chunks in use: 5."),
        "{text}"
    );
    assert!(text.contains(&format!("): {map}")), "{text}");
    for x in xs.into_iter().flatten() {
        free(&a, x);
    }
}

#[test]
fn slack_shows_as_x() {
    // A 2 MiB region serving 1.5 MiB is handed out whole (2 < 3, 0.5 MiB < 128 MiB).
    let a = prealloc(2 * MIB);
    let x = alloc(&a, 3 * MIB / 2);
    assert_eq!(a.stats().bytes_in_use, 2 * MIB);
    let report = oom(a.allocate(MIB, 0, Stream::DEFAULT, "t"));
    let map = &report.regions[0].map;
    assert_eq!(map, &format!("{}{}", "*".repeat(75), "x".repeat(25)));
    free(&a, x);
}

#[test_case(GIB, true, "exceeds the limit" ; "preallocate, over the limit")]
#[test_case(GIB, false, "exceeds the limit" ; "growth, over the limit")]
#[test_case(7 * MIB, false, "limit of 8.00 MiB is reached" ; "growth, limit reached")]
fn oom_causes(request: u64, preallocate: bool, cause: &str) {
    let a = bfc(&simulated_host(GIB), 8 * MIB, preallocate);
    let _x = alloc(&a, 2 * MIB);
    let report = oom(a.allocate(request, 0, Stream::DEFAULT, "t"));
    assert!(report.cause.contains(cause), "{}", report.cause);
    a.check_invariants().unwrap();
}

// ---- zero bytes, trim, foreign allocations, stats, drop ----

#[test]
fn zero_bytes_make_no_device_call() {
    let dev = simulated_host(GIB);
    let a = bfc(&dev, 8 * MIB, true);
    let x = alloc(&a, 0);
    assert_eq!((x.ptr(), x.size()), (0, 0));
    assert!(x.is_empty());
    assert_eq!(dev.census().allocations, 0);
    assert_eq!(a.stats().num_allocs, 1);
    assert_eq!(a.live_count(), 0);
    free(&a, x);
    assert_eq!(dev.census().allocations, 0);
}

#[test]
fn trim_releases_free_regions() {
    let dev = simulated_host(GIB);
    let a = bfc(&dev, GIB, false);
    let x = alloc(&a, 2 * MIB);
    let y = alloc(&a, 3 * MIB);
    assert_eq!(a.region_sizes(), vec![2 * MIB, 4 * MIB]);
    assert_eq!(a.trim().unwrap(), 0, "both in use");
    free(&a, y);
    assert_eq!(a.trim().unwrap(), 4 * MIB);
    assert_eq!(a.region_sizes(), vec![2 * MIB]);
    assert_eq!(a.stats().pool_bytes, 2 * MIB);
    assert_eq!(a.stats().peak_pool_bytes, 6 * MIB);
    assert_eq!(dev.census().bytes_in_use, 2 * MIB);
    free(&a, x);
    assert_eq!(a.trim().unwrap(), 2 * MIB);
    assert_eq!(dev.census().allocations, 0);
    a.check_invariants().unwrap();
}

#[test]
fn trim_under_preallocation_retakes_the_region_later() {
    let dev = simulated_host(GIB);
    let a = bfc(&dev, 8 * MIB, true);
    let x = alloc(&a, MIB);
    free(&a, x);
    assert_eq!(a.trim().unwrap(), 8 * MIB);
    assert_eq!((a.stats().pool_bytes, dev.census().allocations), (0, 0));
    let _y = alloc(&a, MIB);
    assert_eq!(a.region_sizes(), vec![8 * MIB]);
    assert_eq!(dev.census().allocations, 1);
}

#[test]
fn foreign_and_unknown_allocations_are_refused() {
    let a = prealloc(8 * MIB);
    let b = prealloc(8 * MIB);
    let x = alloc(&a, MIB);
    let (ptr, size, token) = (x.ptr(), x.size(), x.token());
    match b.deallocate(x) {
        Err(Error::ForeignAllocation {
            ptr: p,
            owner,
            this,
        }) => {
            assert_eq!((p, owner, this), (ptr, a.id(), b.id()));
        }
        other => panic!("expected ForeignAllocation, got {other:?}"),
    }
    // The Allocation was consumed by the refused call; a forged copy still frees it.
    let copy = Allocation::new(ptr, size, Stream::DEFAULT, a.id(), token);
    let stale = Allocation::new(ptr, size, Stream::DEFAULT, a.id(), token);
    free(&a, copy);
    assert!(matches!(
        refused_free(&a, stale),
        Error::UnknownPointer {
            what: "allocation",
            ..
        }
    ));
    let bogus = Allocation::new(ptr, size, Stream::DEFAULT, a.id(), 12345 << 32 | 7);
    assert!(matches!(
        refused_free(&a, bogus),
        Error::UnknownPointer { .. }
    ));
}

#[test]
fn stats_follow_xla() {
    let a = growing(64 * MIB);
    assert_eq!(
        a.stats(),
        Stats {
            bytes_limit: Some(64 * MIB),
            ..Stats::default()
        }
    );
    let x = alloc(&a, 1000);
    let y = alloc(&a, MIB / 2);
    let z = alloc(&a, 0);
    let s = a.stats();
    assert_eq!(s.num_allocs, 3);
    assert_eq!(s.bytes_in_use, 1024 + MIB / 2);
    assert_eq!(s.peak_bytes_in_use, s.bytes_in_use);
    assert_eq!(s.largest_alloc_size, MIB / 2);
    assert_eq!(s.bytes_limit, Some(64 * MIB));
    assert_eq!((s.bytes_reserved, s.peak_bytes_reserved), (0, 0));
    assert_eq!(s.pool_bytes, 2 * MIB);
    assert_eq!(s.peak_pool_bytes, 2 * MIB);
    assert_eq!(s.largest_free_block_bytes, 2 * MIB - 1024 - MIB / 2);
    assert_eq!(s.fragmentation, 0.0);
    assert_eq!(a.live_count(), 2);
    free(&a, y);
    free(&a, z);
    let s = a.stats();
    assert_eq!(s.bytes_in_use, 1024);
    assert_eq!(s.peak_bytes_in_use, 1024 + MIB / 2);
    assert_eq!(s.largest_free_block_bytes, 2 * MIB - 1024);
    assert_eq!(
        s.fragmentation,
        Stats::compute_fragmentation(s.pool_bytes, s.bytes_in_use, s.largest_free_block_bytes)
    );
    free(&a, x);
    assert_eq!(a.live_count(), 0);
}

#[test]
fn drop_returns_regions_even_with_leaks() {
    let dev = simulated_host(GIB);
    let a = bfc(&dev, GIB, false);
    let _leak = alloc(&a, 3 * MIB);
    hold(alloc(&a, MIB));
    assert_eq!(a.live_count(), 2);
    assert_eq!(dev.census().allocations, 2);
    assert!(Arc::ptr_eq(a.device(), &dev));
    drop(a);
    assert_eq!(dev.census().allocations, 0);
    assert_eq!(dev.census().bytes_in_use, 0);
}

#[test]
fn shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<BfcAllocator<HostDevice>>();
    assert_send_sync::<BfcAllocator<dyn portalloc::Device>>();
    let a = Arc::new(growing(GIB));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut live = Vec::new();
                for i in 0..500u64 {
                    let size = 1 + (i * 7919 + t * 104_729) % (256 * KIB);
                    live.push(a.allocate(size, 0, Stream::DEFAULT, "t").unwrap());
                    if i % 3 == 0 {
                        let x = live.swap_remove((i as usize * 31) % live.len());
                        a.deallocate(x).unwrap();
                    }
                }
                for x in live {
                    a.deallocate(x).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    a.check_invariants().unwrap();
    assert_eq!((a.stats().bytes_in_use, a.live_count()), (0, 0));
}

#[test]
fn strategy_build_over_a_dyn_device() {
    let dev: Arc<dyn portalloc::Device> = simulated_host(GIB);
    let a = BfcAllocator::new(
        dev,
        BfcOptions {
            limit: 16 * MIB,
            preallocate: false,
        },
    )
    .unwrap();
    let x = alloc(&a, 5 * MIB);
    assert_eq!(a.region_sizes(), vec![8 * MIB]);
    free(&a, x);
}

/// At fraction 1.0 on a device whose total is not a multiple of 2 MiB (an H100 reports
/// 81,559 MiB), the preallocation is the whole device, not the limit rounded up past it.
#[test]
fn preallocation_never_asks_for_more_than_the_device_has() {
    let total = 81_559u64 << 20;
    let bfc = bfc(&simulated_host(total), total, true);
    assert_eq!(bfc.preallocation_size(), total);
    let a = bfc.allocate(1 << 20, 0, Stream::DEFAULT, "t").unwrap();
    assert_eq!(bfc.stats().pool_bytes, total);
    bfc.deallocate(a).unwrap();
}
