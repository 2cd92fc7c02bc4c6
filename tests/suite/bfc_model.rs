//! Model-based test of the `bfc` strategy: random allocate / free / trim sequences against a
//! model of the live allocations, with the allocator's invariants checked after every step,
//! in both preallocation and growth modes, over a simulated host device; and the same with a
//! request on a second stream at a random step, which switches bfc to stream-ordered frees
//! with allocations live (frees are then made on each allocation's own stream and may stay
//! pending until a later request).

use crate::support::common::{bfc, simulated_host};

use portalloc::backends::host::HostDevice;
use portalloc::strategy::bfc::BfcAllocator;
use portalloc::{Allocation, Allocator, Device, Error, Stream};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const LIMIT: u64 = 64 * MIB;

#[derive(Debug, Clone)]
enum Op {
    /// Allocate `size` bytes; alignment 0 (default) or `1 << log`.
    Alloc {
        size: u64,
        align_log: Option<u32>,
    },
    /// Free the live allocation at this index (modulo the number live).
    Free(usize),
    Trim,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        1 => Just(0u64),
        6 => 1u64..=4096,
        6 => 1u64..=MIB,
        2 => 1u64..=12 * MIB,
    ];
    let align = prop_oneof![
        6 => Just(None),
        2 => (0u32..=20).prop_map(Some),
    ];
    prop_oneof![
        6 => (size, align).prop_map(|(size, align_log)| Op::Alloc { size, align_log }),
        4 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Trim),
    ]
}

fn round256(x: u64) -> u64 {
    x.div_ceil(256) * 256
}

/// Checks the allocator against the model of live allocations (pending stream-ordered frees
/// are still in use in the bins, and not live).
fn check(a: &BfcAllocator<HostDevice>, live: &[Allocation], alignments: &[u64]) {
    if let Err(why) = a.check_invariants() {
        panic!("invariant broken: {why}");
    }
    let regions = a.regions();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for (x, &alignment) in live.iter().zip(alignments) {
        if x.is_empty() {
            assert_eq!(x.ptr(), 0);
            continue;
        }
        assert_eq!(
            x.ptr() % alignment,
            0,
            "misaligned: {x:?} wanted {alignment}"
        );
        let end = x.ptr() + x.size();
        assert!(
            regions.iter().any(|&(b, s)| b <= x.ptr() && end <= b + s),
            "{x:?} outside every region {regions:x?}"
        );
        ranges.push((x.ptr(), end));
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "overlapping allocations {:x?} and {:x?}",
            w[0],
            w[1]
        );
    }
    let nonempty: Vec<&Allocation> = live.iter().filter(|x| !x.is_empty()).collect();
    let requested: u64 = nonempty.iter().map(|x| x.size()).sum();
    let rounded: u64 = nonempty.iter().map(|x| round256(x.size())).sum();
    let bins = a.bin_summaries();
    let (pending, _) = a.pending_frees();
    let requested_in_bins = bins.iter().map(|b| b.requested_bytes_in_use).sum::<u64>();
    if pending == 0 {
        assert_eq!(requested_in_bins, requested);
    } else {
        assert!(requested_in_bins >= requested);
    }
    assert_eq!(
        bins.iter().map(|b| b.chunks_in_use).sum::<u64>(),
        (nonempty.len() + pending) as u64
    );
    assert_eq!(a.live_count(), nonempty.len());
    let s = a.stats();
    assert!(
        s.bytes_in_use >= rounded,
        "in use {} < rounded requests {rounded}",
        s.bytes_in_use
    );
    assert!(s.bytes_in_use <= s.pool_bytes);
    assert_eq!(s.pool_bytes, regions.iter().map(|r| r.1).sum::<u64>());
}

/// Runs `ops` on the default stream; before step `switch_at` (when given), one 256-byte
/// request on a second stream, kept live like the others (and freed on its stream).
fn run(ops: &[Op], preallocate: bool, switch_at: Option<usize>) {
    let dev = simulated_host(4 * LIMIT);
    let a = bfc(&dev, LIMIT, preallocate);
    let second = dev.create_stream().unwrap();
    let mut live: Vec<Allocation> = Vec::new();
    let mut alignments: Vec<u64> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        if switch_at == Some(step) {
            // The pool may be full: out of memory is a fine answer, and still switches.
            match a.allocate(256, 0, second, "second stream") {
                Ok(x) => {
                    live.push(x);
                    alignments.push(256);
                }
                Err(e) => assert!(e.is_out_of_memory(), "{e}"),
            }
            check(&a, &live, &alignments);
        }
        match *op {
            Op::Alloc { size, align_log } => {
                let alignment = align_log.map_or(0, |l| 1u64 << l);
                let effective = alignment.max(256);
                let before = a.stats();
                match a.allocate(size, alignment, Stream::DEFAULT, "model") {
                    Ok(x) => {
                        assert_eq!(x.size(), size);
                        live.push(x);
                        alignments.push(effective);
                    }
                    Err(Error::OutOfMemory(report)) => {
                        let rounded = round256(size);
                        assert_eq!((report.requested, report.rounded), (size, rounded));
                        // Best fit is complete: nothing free was large enough.
                        if effective == 256 {
                            assert!(report.largest_free_block < rounded, "{report}");
                        }
                        // And the pool could not grow for it.
                        let need = rounded + (effective - 256);
                        if preallocate {
                            assert!(
                                before.pool_bytes > 0 || need > LIMIT,
                                "refused with no preallocation taken: {report}"
                            );
                        } else {
                            let available = (LIMIT - before.pool_bytes) / 256 * 256;
                            assert!(need > available, "growth should have served it: {report}");
                        }
                        assert_eq!(
                            report
                                .regions
                                .iter()
                                .map(|r| r.map.len())
                                .max()
                                .unwrap_or(100),
                            100
                        );
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            Op::Free(i) => {
                if !live.is_empty() {
                    let i = i % live.len();
                    let x = live.swap_remove(i);
                    alignments.swap_remove(i);
                    a.deallocate(x).unwrap();
                }
            }
            Op::Trim => {
                let before = a.stats().pool_bytes;
                let released = a.trim().unwrap();
                assert_eq!(a.stats().pool_bytes, before - released);
            }
        }
        check(&a, &live, &alignments);
    }
    for x in live.drain(..) {
        a.deallocate(x).unwrap();
    }
    alignments.clear();
    check(&a, &live, &alignments);
    assert_eq!(a.stats().bytes_in_use, 0);
    let pool = a.stats().pool_bytes;
    assert_eq!(
        a.trim().unwrap(),
        pool,
        "every region is free once everything is freed"
    );
    assert_eq!(a.pending_frees(), (0, 0));
    assert_eq!(dev.census().allocations, 0);
    drop(a);
    // SAFETY: the host device only compares stream handles; the test uses none after.
    unsafe { dev.destroy_stream(second) }.unwrap();
    assert!(dev.census().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn preallocated_pool_matches_the_model(ops in proptest::collection::vec(op(), 1..200)) {
        run(&ops, true, None);
    }

    #[test]
    fn growing_pool_matches_the_model(ops in proptest::collection::vec(op(), 1..200)) {
        run(&ops, false, None);
    }

    #[test]
    fn switching_to_a_second_stream_midway_matches_the_model(
        ops in proptest::collection::vec(op(), 1..200),
        switch_at in 0usize..200,
        preallocate in any::<bool>(),
    ) {
        run(&ops, preallocate, Some(switch_at % ops.len()));
    }
}
