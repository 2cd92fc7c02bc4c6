//! One conformance suite, generic over strategy × device: every strategy on every backend it
//! claims must pass it. Instantiated below for bfc (preallocating and growing) and platform
//! on the host device, in real and simulated mode.

use std::sync::Arc;

use portalloc::backends::host::HostDevice;
use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
use portalloc::strategy::platform::PlatformAllocator;
use portalloc::{Allocation, Allocator, Error, Stream};

const MIB: u64 = 1 << 20;
/// Capacity of every device in the suite; the allocators get 3/4 of it.
const CAPACITY: u64 = 64 * MIB;
const LIMIT: u64 = 48 * MIB;

/// A strategy under test, with the device beneath it.
struct Subject {
    allocator: Box<dyn Allocator>,
    device: Arc<HostDevice>,
    real: bool,
}

type Maker = fn(Arc<HostDevice>) -> Box<dyn Allocator>;

fn subject(make: Maker, simulated: bool) -> Subject {
    let device = Arc::new(
        HostDevice::builder()
            .capacity(CAPACITY)
            .simulated(simulated)
            .build()
            .expect("host device"),
    );
    Subject {
        allocator: make(Arc::clone(&device)),
        device,
        real: !simulated,
    }
}

fn bfc_prealloc(d: Arc<HostDevice>) -> Box<dyn Allocator> {
    Box::new(
        BfcAllocator::new(
            d,
            BfcOptions {
                limit: LIMIT,
                preallocate: true,
            },
        )
        .unwrap(),
    )
}
fn bfc_grow(d: Arc<HostDevice>) -> Box<dyn Allocator> {
    Box::new(
        BfcAllocator::new(
            d,
            BfcOptions {
                limit: LIMIT,
                preallocate: false,
            },
        )
        .unwrap(),
    )
}
fn vmm_maker(d: Arc<HostDevice>) -> Box<dyn Allocator> {
    Box::new(
        portalloc::strategy::vmm::VmmAllocator::new(
            d,
            portalloc::strategy::vmm::VmmOptions::new(LIMIT),
        )
        .unwrap(),
    )
}
fn async_pool(d: Arc<HostDevice>) -> Box<dyn Allocator> {
    use portalloc::strategy::async_pool::{AsyncOptions, AsyncPoolAllocator};
    let options = AsyncOptions {
        preallocate: true,
        ..AsyncOptions::new(LIMIT)
    };
    Box::new(AsyncPoolAllocator::new(d, options).unwrap())
}
fn platform(d: Arc<HostDevice>) -> Box<dyn Allocator> {
    Box::new(PlatformAllocator::new(d, Some(LIMIT)))
}

fn invariants(s: &Subject) {
    s.allocator
        .check_invariants()
        .unwrap_or_else(|e| panic!("{}: invariant broken: {e}", s.allocator.name()));
}

fn free_all(s: &Subject, allocations: Vec<Allocation>) {
    for a in allocations {
        s.allocator.deallocate(a).expect("deallocate");
        invariants(s);
    }
}

/// Zero bytes: an empty allocation, and no device call.
fn zero_size_is_empty(s: Subject) {
    let before = s.device.census();
    let a = s.allocator.allocate(0, 0, Stream::DEFAULT, "t").unwrap();
    assert!(a.is_empty());
    assert_eq!(a.ptr(), 0);
    assert_eq!(
        s.device.census(),
        before,
        "a zero-byte allocation made a device call"
    );
    s.allocator.deallocate(a).unwrap();
    assert_eq!(s.allocator.stats().num_allocs, 1);
}

/// Allocations are aligned, disjoint, usable (real memory), and counted.
fn allocations_are_aligned_disjoint_and_usable(s: Subject) {
    let sizes = [1u64, 255, 256, 257, 4096, 100_000, MIB, 3 * MIB + 5];
    let mut live = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let a = s
            .allocator
            .allocate(size, 0, Stream::DEFAULT, "buffer")
            .unwrap();
        assert_eq!(a.size(), size);
        assert_eq!(
            a.ptr() % 256,
            0,
            "{size} B allocation at {:#x} is not 256-aligned",
            a.ptr()
        );
        if s.real {
            // SAFETY: the allocation is `size` bytes of real host memory owned by this test.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(a.ptr() as *mut u8, size as usize) };
            bytes.fill(i as u8 + 1);
        }
        invariants(&s);
        live.push(a);
    }
    let mut ranges: Vec<(u64, u64)> = live.iter().map(|a| (a.ptr(), a.ptr() + a.size())).collect();
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "allocations overlap: {:x?} and {:x?}",
            w[0],
            w[1]
        );
    }
    if s.real {
        for (i, a) in live.iter().enumerate() {
            // SAFETY: as above; nothing else wrote to this allocation.
            let bytes =
                unsafe { std::slice::from_raw_parts(a.ptr() as *const u8, a.size() as usize) };
            assert!(
                bytes.iter().all(|&b| b == i as u8 + 1),
                "allocation {i} was overwritten"
            );
        }
    }
    let stats = s.allocator.stats();
    let requested: u64 = sizes.iter().sum();
    assert!(stats.bytes_in_use >= requested);
    assert!(stats.peak_bytes_in_use >= stats.bytes_in_use);
    assert!(stats.pool_bytes >= stats.bytes_in_use);
    assert_eq!(stats.num_allocs, sizes.len() as u64);
    free_all(&s, live);
    assert_eq!(s.allocator.stats().bytes_in_use, 0);
}

/// Alignments: powers of two honoured, anything else refused with a typed error.
fn alignment_rules(s: Subject) {
    for alignment in [1u64, 2, 256, 512, 4096, 65536] {
        let a = s.allocator.allocate(1000, alignment, Stream::DEFAULT, "t");
        match a {
            Ok(a) => {
                assert_eq!(a.ptr() % alignment.max(256), 0);
                s.allocator.deallocate(a).unwrap();
            }
            Err(Error::InvalidAlignment { max, .. }) => assert!(alignment > max),
            Err(e) => panic!("alignment {alignment}: unexpected error {e}"),
        }
    }
    for alignment in [3u64, 100, 257, u64::MAX] {
        match s.allocator.allocate(1000, alignment, Stream::DEFAULT, "t") {
            Err(Error::InvalidAlignment { alignment: a, .. }) => assert_eq!(a, alignment),
            other => panic!("alignment {alignment}: expected InvalidAlignment, got {other:?}"),
        }
    }
    invariants(&s);
}

/// Sizes beyond what can be served: a typed error, no panic, books intact.
fn impossible_sizes_are_errors(s: Subject) {
    for size in [u64::MAX, u64::MAX - 255, CAPACITY * 2, LIMIT + 1] {
        let e = s
            .allocator
            .allocate(size, 0, Stream::DEFAULT, "t")
            .expect_err("impossible size served");
        assert!(
            matches!(e, Error::InvalidSize { .. } | Error::ExceedsLimit { .. })
                || e.is_out_of_memory(),
            "size {size}: unexpected error {e}"
        );
        assert!(!e.to_string().is_empty());
        invariants(&s);
    }
    // Still works afterwards.
    let a = s.allocator.allocate(MIB, 0, Stream::DEFAULT, "t").unwrap();
    s.allocator.deallocate(a).unwrap();
}

/// Running out: allocate until refused, then free everything and allocate again.
fn exhaustion_and_recovery(s: Subject) {
    let mut live = Vec::new();
    let e = loop {
        match s.allocator.allocate(4 * MIB, 0, Stream::DEFAULT, "t") {
            Ok(a) => live.push(a),
            Err(e) => break e,
        }
        assert!(live.len() < 1000, "never ran out");
    };
    assert!(e.is_out_of_memory(), "expected out of memory, got {e}");
    assert!(live.len() as u64 * 4 * MIB <= LIMIT);
    invariants(&s);
    free_all(&s, live);
    let a = s
        .allocator
        .allocate(4 * MIB, 0, Stream::DEFAULT, "t")
        .unwrap();
    s.allocator.deallocate(a).unwrap();
}

/// An allocation handed to the wrong allocator is refused, not freed.
fn foreign_allocations_are_refused(s: Subject) {
    let other = subject(platform, true);
    let theirs = other
        .allocator
        .allocate(1024, 0, Stream::DEFAULT, "t")
        .unwrap();
    let ptr = theirs.ptr();
    match s.allocator.deallocate(theirs) {
        Err(Error::ForeignAllocation { ptr: p, .. }) => assert_eq!(p, ptr),
        other => panic!("expected ForeignAllocation, got {other:?}"),
    }
    invariants(&s);
}

/// After everything is freed, trim() and drop return every device byte.
fn trim_and_drop_return_everything(s: Subject) {
    let live: Vec<_> = (1..=5)
        .map(|i| {
            s.allocator
                .allocate(i * MIB, 0, Stream::DEFAULT, "t")
                .unwrap()
        })
        .collect();
    free_all(&s, live);
    s.allocator.trim().unwrap();
    assert_eq!(
        s.allocator.stats().pool_bytes,
        0,
        "trim() left pool memory with nothing live"
    );
    assert_eq!(s.device.census().bytes_in_use, 0);
    // Live allocations at drop are reported and returned to the device.
    let _leak = s
        .allocator
        .allocate(MIB, 0, Stream::DEFAULT, "leak")
        .unwrap();
    let device = Arc::clone(&s.device);
    drop(s);
    assert_eq!(
        device.census().allocations,
        0,
        "dropping the allocator leaked device memory"
    );
    assert_eq!(device.census().bytes_in_use, 0);
}

/// Send + Sync: many threads allocating and freeing, books intact at the end.
fn threads_share_one_allocator(s: Subject) {
    let s = Arc::new(s);
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let s = Arc::clone(&s);
            scope.spawn(move || {
                let mut live = Vec::new();
                for i in 0..200u64 {
                    let size = 256 + ((i * 7919 + t * 104_729) % (256 * 1024));
                    if let Ok(a) = s.allocator.allocate(size, 0, Stream(t), "t") {
                        live.push(a);
                    }
                    if i % 3 == 2 {
                        let a = live.swap_remove((i as usize) % live.len());
                        s.allocator.deallocate(a).unwrap();
                    }
                }
                for a in live {
                    s.allocator.deallocate(a).unwrap();
                }
            });
        }
    });
    invariants(&s);
    assert_eq!(s.allocator.stats().bytes_in_use, 0);
}

macro_rules! conformance {
    ($($name:ident => $make:expr),* $(,)?) => {$(
        mod $name {
            use super::*;
            fn real() -> Subject { subject($make, false) }
            fn simulated() -> Subject { subject($make, true) }
            #[test] fn zero_size_is_empty_real() { super::zero_size_is_empty(real()) }
            #[test] fn zero_size_is_empty_simulated() { super::zero_size_is_empty(simulated()) }
            #[test] fn aligned_disjoint_usable_real() { allocations_are_aligned_disjoint_and_usable(real()) }
            #[test] fn aligned_disjoint_usable_simulated() { allocations_are_aligned_disjoint_and_usable(simulated()) }
            #[test] fn alignment_rules_real() { super::alignment_rules(real()) }
            #[test] fn alignment_rules_simulated() { super::alignment_rules(simulated()) }
            #[test] fn impossible_sizes_real() { impossible_sizes_are_errors(real()) }
            #[test] fn impossible_sizes_simulated() { impossible_sizes_are_errors(simulated()) }
            #[test] fn exhaustion_and_recovery_real() { super::exhaustion_and_recovery(real()) }
            #[test] fn exhaustion_and_recovery_simulated() { super::exhaustion_and_recovery(simulated()) }
            #[test] fn foreign_refused_real() { foreign_allocations_are_refused(real()) }
            #[test] fn foreign_refused_simulated() { foreign_allocations_are_refused(simulated()) }
            #[test] fn trim_and_drop_real() { trim_and_drop_return_everything(real()) }
            #[test] fn trim_and_drop_simulated() { trim_and_drop_return_everything(simulated()) }
            #[test] fn threads_real() { threads_share_one_allocator(real()) }
            #[test] fn threads_simulated() { threads_share_one_allocator(simulated()) }
        }
    )*};
}

conformance! {
    bfc_preallocated => bfc_prealloc,
    bfc_growing => bfc_grow,
    platform_on_demand => platform,
    async_preallocated => async_pool,
    vmm => vmm_maker,
}
