//! Review of vmm's folding of small split remainders into the allocation (a remainder of at
//! most an eighth of the request, inside the granule of the request's nearest byte), probed
//! from the caller's side: alignment, overlap (real host memory, byte patterns), the
//! driver's census, sleep and wake, several streams, refused frees.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::support::common::{host_device, refused_free};
use portalloc::backends::host::HostDevice;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator, Device, Error, Keep, Stream};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn vmm_over(d: &Arc<HostDevice>, limit: u64) -> VmmAllocator<HostDevice> {
    VmmAllocator::new(Arc::clone(d), VmmOptions::new(limit)).unwrap()
}

/// The request as vmm rounds it: 256-byte units.
fn rounded(size: u64) -> u64 {
    size.div_ceil(256).max(1) * 256
}

/// Granules under `[addr, addr + len)`.
fn granules(g: u64, addr: u64, len: u64) -> (u64, u64) {
    (addr / g, (addr + len).div_ceil(g))
}

/// The byte at `i` of pattern `seed`.
fn pattern(seed: u32, i: usize) -> u8 {
    (i as u32)
        .wrapping_mul(2_654_435_761)
        .wrapping_add(seed)
        .rotate_left(7) as u8
        ^ (i >> 9) as u8
}

/// Writes pattern `seed` over `len` bytes at `ptr` (real host memory).
fn write(ptr: u64, len: u64, seed: u32) {
    // SAFETY: `[ptr, ptr + len)` lies in a live allocation's chunk of a real host device,
    // mapped with access (its granules are those of the request), used by this thread only.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len as usize) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = pattern(seed, i);
    }
}

/// The first byte of `[ptr, ptr + len)` not holding pattern `seed`.
fn first_wrong(ptr: u64, len: u64, seed: u32) -> Option<usize> {
    // SAFETY: as in `write`.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) };
    bytes
        .iter()
        .enumerate()
        .position(|(i, &b)| b != pattern(seed, i))
}

/// What the caller can see of one allocation, checked: alignment, the charged size against
/// the request (at most an eighth more, folded only inside a granule the request touches:
/// the granules under the charged range are those under the request at one of its ends).
fn check_one(a: &VmmAllocator<HostDevice>, x: &Allocation, size: u64, alignment: u64) -> u64 {
    let g = a.granularity();
    assert_eq!(
        x.ptr() % alignment.max(256),
        0,
        "{x:?} misaligned for {alignment}"
    );
    let r = rounded(size);
    let charged = a.charged(x).expect("vmm charges its chunks");
    assert!(charged >= r, "charged {charged} below the request {r}");
    let slack = charged - r;
    if slack > 0 {
        assert!(
            slack <= r / 8,
            "folded {slack} of a request of {r}: more than an eighth"
        );
        let here = granules(g, x.ptr(), charged);
        let low = granules(g, x.ptr(), r);
        let high = granules(g, x.ptr() + slack, r);
        assert!(
            here == low || here == high,
            "folding touched another granule: charged {here:?}, request {low:?} / {high:?}"
        );
    }
    charged
}

/// No two live `[ptr, ptr + charged)` overlap.
fn assert_disjoint(live: &BTreeMap<u64, (u64, u64)>) {
    let mut end = 0;
    for (&ptr, &(charged, _)) in live {
        assert!(
            ptr >= end,
            "overlap at {ptr:#x} (previous ends at {end:#x})"
        );
        end = ptr + charged;
    }
}

/// Every granule a live allocation touches is mapped: the allocator's books and the driver's
/// census agree on the physical memory, which stays within the budget.
fn check_physical(d: &HostDevice, a: &VmmAllocator<HostDevice>, limit: u64) {
    let c = d.census();
    let s = a.stats();
    assert_eq!(s.pool_bytes, c.bytes_in_use, "books and driver disagree");
    assert!(
        c.bytes_in_use <= limit,
        "{} held over the budget {limit}",
        c.bytes_in_use
    );
    assert!(a.mapped_bytes() <= c.bytes_in_use);
}

/// Alignments the random sequences ask for.
const ALIGNMENTS: [u64; 10] = [
    0,
    256,
    512,
    4 * KIB,
    64 * KIB,
    256 * KIB,
    MIB,
    2 * MIB,
    4 * MIB,
    GIB,
];

/// A request: mostly small (a sliver of a granule up to 2 MiB), some large (2 to 12 MiB),
/// sizes near the fold's edges (an eighth) often.
fn request(rng: &mut SmallRng) -> u64 {
    match rng.gen_range(0..6) {
        0 => rng.gen_range(1..4 * KIB),
        1 => rng.gen_range(4 * KIB..512 * KIB),
        2 => rng.gen_range(512 * KIB..2 * MIB),
        3 => {
            // Just over 8/9 of a power of two: a remainder of about an eighth.
            let base = 1u64 << rng.gen_range(12..24);
            base * 8 / 9 + rng.gen_range(0..base / 16)
        }
        _ => rng.gen_range(2 * MIB..12 * MIB),
    }
}

/// The end of a two-stream test, everything freed: waits for the device, trims, checks the
/// books are empty, drops the allocator, destroys the test's two streams (made with the
/// driver's own call) and checks the driver holds nothing.
fn close_two_streams(d: &HostDevice, a: VmmAllocator<HostDevice>, s: Stream, t: Stream) {
    d.synchronize_device().unwrap();
    a.trim().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.stats().bytes_in_use, 0);
    assert_eq!(a.pending_frees(), (0, 0));
    drop(a);
    // SAFETY: nothing is queued on either stream and no allocation is made on them.
    unsafe {
        d.destroy_stream(s).unwrap();
        d.destroy_stream(t).unwrap();
    }
    assert!(d.census().is_empty(), "{:?}", d.census());
}

/// Random sequences of mixed sizes and alignments (up to 1 GiB) with interleaved frees, on
/// a simulated device: every pointer aligned, charged sizes within the fold's rule, no two
/// live chunks overlapping, `bytes_in_use` the sum of the charged sizes, the physical books
/// agreeing with the driver; after everything is freed and trimmed nothing is held, after
/// the drop nothing is reserved. Folding happens (the sequence exercises it).
#[test]
fn review_fold_random_alignment_overlap_and_census() {
    let limit = 512 * MIB;
    let mut folded = 0;
    for seed in 0..6u64 {
        let d = host_device(limit + 64 * MIB, true);
        let a = vmm_over(&d, limit);
        let mut rng = SmallRng::seed_from_u64(0xF01D + seed);
        let mut live: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        let mut handles: BTreeMap<u64, Allocation> = BTreeMap::new();
        for step in 0..1500 {
            if !handles.is_empty() && (rng.gen_bool(0.45) || a.stats().bytes_in_use > limit / 2) {
                let keys: Vec<u64> = handles.keys().copied().collect();
                let k = keys[rng.gen_range(0..keys.len())];
                let x = handles.remove(&k).unwrap();
                live.remove(&k);
                a.deallocate(x).unwrap();
            } else {
                let size = request(&mut rng);
                let alignment = if rng.gen_bool(0.05) {
                    GIB
                } else {
                    ALIGNMENTS[rng.gen_range(0..ALIGNMENTS.len() - 1)]
                };
                let x = match a.allocate(size, alignment, Stream::DEFAULT, "review") {
                    Ok(x) => x,
                    Err(e) if e.is_out_of_memory() => continue,
                    Err(e) => panic!("step {step}: {e}"),
                };
                let charged = check_one(&a, &x, size, alignment);
                if charged > rounded(size) {
                    folded += 1;
                }
                live.insert(x.ptr(), (charged, size));
                handles.insert(x.ptr(), x);
            }
            if step % 25 == 0 {
                a.check_invariants().unwrap();
                assert_disjoint(&live);
                let sum: u64 = live.values().map(|&(c, _)| c).sum();
                assert_eq!(a.stats().bytes_in_use, sum, "seed {seed} step {step}");
                check_physical(&d, &a, limit);
            }
            if step % 300 == 299 {
                a.trim().unwrap();
                check_physical(&d, &a, limit);
            }
        }
        assert_disjoint(&live);
        for (_, x) in std::mem::take(&mut handles) {
            a.deallocate(x).unwrap();
        }
        a.check_invariants().unwrap();
        assert_eq!(a.stats().bytes_in_use, 0);
        a.trim().unwrap();
        let c = d.census();
        assert_eq!(
            (c.mappings, c.physical_handles, c.bytes_in_use),
            (0, 0, 0),
            "{c:?}"
        );
        drop(a);
        assert!(d.census().is_empty(), "{:?}", d.census());
    }
    assert!(folded > 50, "only {folded} allocations were folded");
}

/// The same kind of sequence over real host memory: each allocation's whole charged range
/// written with its own pattern (folded slack included: it is the allocation's, and mapped),
/// and every live allocation's bytes checked before it is freed and every 50 steps.
#[test]
fn review_fold_patterns_survive_random_churn_on_real_memory() {
    let limit = 96 * MIB;
    let d = host_device(limit + 32 * MIB, false);
    let a = vmm_over(&d, limit);
    let mut rng = SmallRng::seed_from_u64(0xBEEF_F01D);
    let mut live: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut handles: BTreeMap<u64, (Allocation, u32)> = BTreeMap::new();
    let mut folded = 0;
    for step in 0..1200u32 {
        if !handles.is_empty() && (rng.gen_bool(0.45) || a.stats().bytes_in_use > limit / 2) {
            let keys: Vec<u64> = handles.keys().copied().collect();
            let k = keys[rng.gen_range(0..keys.len())];
            let (x, seed) = handles.remove(&k).unwrap();
            let (charged, _) = live.remove(&k).unwrap();
            assert_eq!(
                first_wrong(x.ptr(), charged, seed),
                None,
                "step {step}: {x:?} corrupted"
            );
            a.deallocate(x).unwrap();
        } else {
            let size = request(&mut rng).min(6 * MIB);
            let alignment = ALIGNMENTS[rng.gen_range(0..ALIGNMENTS.len() - 2)];
            let x = match a.allocate(size, alignment, Stream::DEFAULT, "review") {
                Ok(x) => x,
                Err(e) if e.is_out_of_memory() => continue,
                Err(e) => panic!("step {step}: {e}"),
            };
            let charged = check_one(&a, &x, size, alignment);
            if charged > rounded(size) {
                folded += 1;
            }
            write(x.ptr(), charged, step);
            live.insert(x.ptr(), (charged, size));
            handles.insert(x.ptr(), (x, step));
        }
        if step % 50 == 0 {
            assert_disjoint(&live);
            for (x, seed) in handles.values() {
                let (charged, _) = live[&x.ptr()];
                assert_eq!(
                    first_wrong(x.ptr(), charged, *seed),
                    None,
                    "step {step}: {x:?}"
                );
            }
            a.check_invariants().unwrap();
            check_physical(&d, &a, limit);
        }
    }
    for (_, (x, seed)) in std::mem::take(&mut handles) {
        let (charged, _) = live[&x.ptr()];
        assert_eq!(first_wrong(x.ptr(), charged, seed), None);
        a.deallocate(x).unwrap();
    }
    a.trim().unwrap();
    assert_eq!(d.census().mappings, 0);
    drop(a);
    assert!(d.census().is_empty(), "{:?}", d.census());
    assert!(folded > 10, "only {folded} allocations were folded");
}

/// The layout of `a_sliver_inside_a_touched_granule_goes_with_the_allocation` in vmm.rs, at
/// the high end: a hole of `hole` bytes between two large neighbours (its top granule-aligned,
/// its start an odd MiB or a quarter past), asked for `request` bytes at `alignment`, placed
/// at the hole's top. The remainder below moves the request down onto the hole's start only
/// when it is at most an eighth of the request, in the request's first granule, and the
/// start is aligned at least as the placement; the driver maps nothing either way. Returns
/// the allocation's offset in the hole and its charged size.
#[test_case::test_case(3 * MIB, 2 * MIB + 768 * KIB, 0 => (0, 3 * MIB); "a quarter MiB below, onto an odd MiB: moved")]
#[test_case::test_case(3 * MIB, 2 * MIB + 768 * KIB, 256 * KIB => (0, 3 * MIB); "aligned a quarter MiB: moved")]
#[test_case::test_case(3 * MIB, 2 * MIB + 768 * KIB, MIB => (0, 3 * MIB); "aligned a MiB: placed at the start, nothing left")]
#[test_case::test_case(3 * MIB + 256 * KIB, 3 * MIB, 0 => (256 * KIB, 3 * MIB); "onto a start less aligned than the placement: not moved")]
#[test_case::test_case(3 * MIB, 2 * MIB + 512 * KIB, 0 => (512 * KIB, 2 * MIB + 512 * KIB); "more than an eighth below: not moved")]
fn review_fold_a_large_request_moves_down_only_onto_an_aligned_start(
    hole: u64,
    request: u64,
    alignment: u64,
) -> (u64, u64) {
    let d = host_device(128 * MIB, true);
    let a = vmm_over(&d, 64 * MIB);
    let top = a.allocate(4 * MIB, 0, Stream::DEFAULT, "r").unwrap();
    let gap = a.allocate(hole, 0, Stream::DEFAULT, "r").unwrap();
    let below = a.allocate(2 * MIB, 0, Stream::DEFAULT, "r").unwrap();
    let at = gap.ptr();
    assert_eq!(at + hole, top.ptr());
    a.deallocate(gap).unwrap();
    let before = d.census();
    let x = a
        .allocate(request, alignment, Stream::DEFAULT, "r")
        .unwrap();
    let charged = check_one(&a, &x, request, alignment);
    assert_eq!(
        d.census(),
        before,
        "mapped something for a request in mapped granules"
    );
    assert_eq!(x.ptr() + charged, top.ptr(), "not at the hole's top");
    a.check_invariants().unwrap();
    let got = (x.ptr() - at, charged);
    for y in [x, top, below] {
        a.deallocate(y).unwrap();
    }
    a.trim().unwrap();
    drop(a);
    assert!(d.census().is_empty());
    got
}

/// Sleep and wake of a tag whose allocations were folded: the bytes of every allocation
/// (its charged range) come back at the same addresses, charged the same; a sleeping folded
/// allocation freed goes with its copy; untagged neighbours are untouched; nothing leaks.
#[test]
fn review_fold_folded_allocations_sleep_and_wake_with_their_bytes() {
    let tag = "review_fold::sleepy";
    portalloc::sleep_tags::declare_sleepable(tag);
    let limit = 96 * MIB;
    let d = host_device(limit + 64 * MIB, false);
    let a = vmm_over(&d, limit);
    let mut rng = SmallRng::seed_from_u64(0x51EE9);
    let mut tagged: Vec<(Allocation, u64, u32)> = Vec::new();
    let mut plain: Vec<(Allocation, u64, u32)> = Vec::new();
    // Two folds made on purpose in the tag's reservation: a small one at a hole's low end,
    // a large one moved down onto a hole's start.
    for (sizes, request) in [
        ([MIB, 256 * KIB, 256 * KIB], 240 * KIB),
        ([4 * MIB, 3 * MIB, 2 * MIB], 2 * MIB + 768 * KIB),
    ] {
        let mut made: Vec<Allocation> = sizes
            .iter()
            .map(|&n| a.allocate(n, 0, Stream::DEFAULT, tag).unwrap())
            .collect();
        a.deallocate(made.remove(1)).unwrap();
        let x = a.allocate(request, 0, Stream::DEFAULT, tag).unwrap();
        assert_eq!(
            a.charged(&x),
            Some(sizes[1]),
            "not folded in the tag's reservation"
        );
        made.push(x);
        for x in made {
            let seed = 1000 + tagged.len() as u32;
            let c = a.charged(&x).unwrap();
            write(x.ptr(), c, seed);
            tagged.push((x, c, seed));
        }
    }
    for step in 0..400u32 {
        let size = request(&mut rng).min(4 * MIB);
        let t = rng.gen_bool(0.6);
        let list = if t { &mut tagged } else { &mut plain };
        if list.len() > 6 && (rng.gen_bool(0.4) || a.stats().bytes_in_use > limit / 3) {
            let (x, _, _) = list.swap_remove(rng.gen_range(6..list.len()));
            a.deallocate(x).unwrap();
            continue;
        }
        let x = a
            .allocate(
                size,
                0,
                Stream::DEFAULT,
                if t { tag } else { "review_fold::plain" },
            )
            .unwrap();
        let charged = check_one(&a, &x, size, 0);
        write(x.ptr(), charged, step);
        list.push((x, charged, step));
    }
    let folded = tagged
        .iter()
        .filter(|(x, c, _)| *c > rounded(x.size()))
        .count();
    assert!(folded >= 2, "only {folded} tagged allocations folded");
    let report = a.sleep(tag, Keep::Contents).unwrap();
    assert_eq!(report.allocations as usize, tagged.len());
    let charged_sum: u64 = tagged.iter().map(|(_, c, _)| c).sum();
    assert_eq!(report.bytes, charged_sum, "a sleep takes the charged bytes");
    for (x, c, seed) in &plain {
        assert_eq!(
            first_wrong(x.ptr(), *c, *seed),
            None,
            "an untagged one changed"
        );
    }
    // A folded sleeper freed while asleep.
    let i = tagged
        .iter()
        .position(|(x, c, _)| *c > rounded(x.size()))
        .unwrap();
    let (gone, _, _) = tagged.swap_remove(i);
    assert!(a.is_asleep(&gone));
    a.deallocate(gone).unwrap();
    a.check_invariants().unwrap();
    a.wake(tag).unwrap();
    for (x, c, seed) in &tagged {
        assert_eq!(a.charged(x), Some(*c));
        assert_eq!(
            first_wrong(x.ptr(), *c, *seed),
            None,
            "{x:?} lost bytes over sleep"
        );
    }
    for (x, c, seed) in &plain {
        assert_eq!(first_wrong(x.ptr(), *c, *seed), None);
    }
    // Sleep once more, discarding, then free the sleepers and everything else.
    a.sleep(tag, Keep::Contents).unwrap();
    for (x, _, _) in tagged.drain(..) {
        a.deallocate(x).unwrap();
    }
    for (x, _, _) in plain.drain(..) {
        a.deallocate(x).unwrap();
    }
    a.check_invariants().unwrap();
    assert_eq!(a.stats().bytes_in_use, 0);
    a.trim().unwrap();
    let c = d.census();
    assert_eq!((c.mappings, c.physical_handles), (0, 0), "{c:?}");
    drop(a);
    assert!(d.census().is_empty(), "{:?}", d.census());
}

/// `(low, x, high)` tagged `tag` on the default stream: 1 MiB, then 240 KiB placed in the
/// 256 KiB hole freed between `low` and a 256 KiB `high`, whose 16 KiB remainder is folded.
fn folded_between(a: &impl Allocator, tag: &str) -> (Allocation, Allocation, Allocation) {
    let low = a.allocate(MIB, 0, Stream::DEFAULT, tag).unwrap();
    let hole = a.allocate(256 * KIB, 0, Stream::DEFAULT, tag).unwrap();
    let high = a.allocate(256 * KIB, 0, Stream::DEFAULT, tag).unwrap();
    a.deallocate(hole).unwrap();
    let x = a.allocate(240 * KIB, 0, Stream::DEFAULT, tag).unwrap();
    (low, x, high)
}

/// A folded untagged allocation donated (retagged) to a sleepable tag sleeps and wakes with
/// its bytes, and its neighbours in the same granule keep theirs.
#[test]
fn review_fold_a_folded_allocation_retagged_sleeps_and_wakes() {
    let tag = "review_fold::donated";
    portalloc::sleep_tags::declare_sleepable(tag);
    let d = host_device(64 * MIB, false);
    let a = vmm_over(&d, 32 * MIB);
    let (low, x, high) = folded_between(&a, "p");
    assert_eq!(a.charged(&x), Some(256 * KIB), "folded");
    for (i, y) in [&low, &x, &high].into_iter().enumerate() {
        write(y.ptr(), a.charged(y).unwrap(), i as u32);
    }
    a.retag(&x, tag);
    a.sleep(tag, Keep::Contents).unwrap();
    for (i, y) in [&low, &high].into_iter().enumerate() {
        assert_eq!(
            first_wrong(y.ptr(), a.charged(y).unwrap(), 2 * i as u32),
            None
        );
    }
    a.wake(tag).unwrap();
    for (i, y) in [&low, &x, &high].into_iter().enumerate() {
        assert_eq!(
            first_wrong(y.ptr(), a.charged(y).unwrap(), i as u32),
            None,
            "{i}"
        );
    }
    for y in [low, x, high] {
        a.deallocate(y).unwrap();
    }
    a.trim().unwrap();
    drop(a);
    assert!(d.census().is_empty(), "{:?}", d.census());
}

/// Two streams with events held: memory freed on either (folded chunks among it) stays
/// pending and is carved for reuse; no two live allocations' bytes meet (real memory);
/// `bytes_in_use` counts the live chunks only; once the events complete everything goes back,
/// nothing leaks.
#[test]
fn review_fold_pending_frees_of_folded_chunks_on_two_streams() {
    let limit = 64 * MIB;
    let d = host_device(limit + 64 * MIB, false);
    let (s, t) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    let a = vmm_over(&d, limit);
    d.set_events_held(true);
    let mut rng = SmallRng::seed_from_u64(0x57_2EA);
    // (allocation, charged, seed)
    let mut live: Vec<(Allocation, u64, u32)> = Vec::new();
    let mut folded = 0;
    let mut saw_pending = false;
    for step in 0..600u32 {
        if !live.is_empty() && rng.gen_bool(0.45) {
            let (x, c, seed) = live.swap_remove(rng.gen_range(0..live.len()));
            assert_eq!(first_wrong(x.ptr(), c, seed), None, "step {step}");
            a.deallocate(x).unwrap();
            continue;
        }
        let on = if rng.gen_bool(0.5) { s } else { t };
        let size = request(&mut rng).min(4 * MIB);
        let x = match a.allocate(size, 0, on, "review") {
            Ok(x) => x,
            Err(e) if e.is_out_of_memory() => continue,
            Err(e) => panic!("step {step}: {e}"),
        };
        let c = check_one(&a, &x, size, 0);
        if c > rounded(size) {
            folded += 1;
        }
        // T may be handed memory freed on S (behind a GPU-side wait for its event, or the
        // fence): the contract is kept on the device, not by keeping the ranges apart. What
        // the caller sees: the books count the pending frees apart from the chunks in use.
        let (_, pending) = a.pending_frees();
        let sum: u64 = live.iter().map(|(_, c, _)| c).sum::<u64>() + c;
        assert_eq!(a.stats().bytes_in_use, sum, "step {step}");
        saw_pending |= pending > 0;
        write(x.ptr(), c, step);
        live.push((x, c, step));
        if step % 40 == 0 {
            a.check_invariants().unwrap();
            let ranges = live.iter().map(|(x, c, _)| (x.ptr(), (*c, 0))).collect();
            assert_disjoint(&ranges);
        }
    }
    assert!(folded > 5, "only {folded} folded");
    assert!(saw_pending, "no free was ever pending");
    d.set_events_held(false);
    for (x, c, seed) in live.drain(..) {
        assert_eq!(first_wrong(x.ptr(), c, seed), None);
        a.deallocate(x).unwrap();
    }
    close_two_streams(&d, a, s, t);
}

/// Refused frees, typed, not panics, leaving the books whole: a double free of a folded
/// chunk, a forged allocation at the placement the fold moved it from, at its folded slack,
/// with another allocator's id; tagged and untagged; one free on another thread.
#[test]
fn review_fold_refused_frees_of_folded_chunks_are_typed_errors() {
    let tag = "review_fold::refused";
    portalloc::sleep_tags::declare_sleepable(tag);
    let d = host_device(256 * MIB, true);
    let a = vmm_over(&d, 128 * MIB);
    for t in ["", "review_fold::plain", tag] {
        // High end: moved down onto the hole's start.
        let top = a.allocate(4 * MIB, 0, Stream::DEFAULT, t).unwrap();
        let hole = a.allocate(3 * MIB, 0, Stream::DEFAULT, t).unwrap();
        let below = a.allocate(2 * MIB, 0, Stream::DEFAULT, t).unwrap();
        let at = hole.ptr();
        a.deallocate(hole).unwrap();
        let x = a
            .allocate(2 * MIB + 768 * KIB, 0, Stream::DEFAULT, t)
            .unwrap();
        assert_eq!((x.ptr(), a.charged(&x)), (at, Some(3 * MIB)), "tag {t:?}");
        let (size, stream, token) = (x.size(), x.stream(), x.token());
        let forge = |ptr: u64, id: u64| Allocation::new(ptr, size, stream, id, token);
        for (ptr, id) in [
            (at + 256 * KIB, a.id()),
            (at + 2 * MIB + 768 * KIB, a.id()),
            (at + MIB, a.id()),
        ] {
            let e = refused_free(&a, forge(ptr, id));
            assert!(matches!(e, Error::UnknownPointer { .. }), "{e}");
        }
        let e = a.deallocate(forge(at, a.id() + 1_000_000));
        assert!(e.is_err(), "another allocator's id accepted");
        a.check_invariants().unwrap();
        let again = forge(at, a.id());
        // Freed on another thread.
        std::thread::scope(|sc| {
            sc.spawn(|| a.deallocate(x).unwrap());
        });
        let e = refused_free(&a, again);
        assert!(matches!(e, Error::UnknownPointer { .. }), "{e}");
        assert_eq!(a.stats().bytes_in_use, 6 * MIB);
        for y in [top, below] {
            a.deallocate(y).unwrap();
        }
        assert_eq!(a.stats().bytes_in_use, 0);
    }
    a.trim().unwrap();
    drop(a);
    assert!(d.census().is_empty(), "{:?}", d.census());
}

/// Through the ledger (what the C API and the facade hand out): the rounded bytes it records
/// for folded allocations are vmm's charged sizes, its books agree with vmm's `bytes_in_use`
/// through a donation of a folded allocation to a sleepable tag, its sleep and wake (bytes
/// kept), and the frees.
#[test]
fn review_fold_the_ledger_records_folded_chunks_as_charged() {
    use portalloc::adaptor::LedgerAllocator;
    let tag = "review_fold::ledger_donated";
    portalloc::sleep_tags::declare_sleepable(tag);
    let d = host_device(64 * MIB, false);
    let ledger = LedgerAllocator::new(vmm_over(&d, 32 * MIB));
    let (low, x, high) = folded_between(&ledger, "review_fold::l");
    assert_eq!(ledger.charged(&x), Some(256 * KIB), "folded");
    ledger.check_invariants().unwrap();
    let totals = |name: &str| {
        ledger
            .snapshot()
            .tags
            .into_iter()
            .find(|t| t.tag == name)
            .map(|t| (t.bytes, t.rounded_bytes))
    };
    assert_eq!(
        totals("review_fold::l"),
        Some((MIB + 256 * KIB + 240 * KIB, MIB + 512 * KIB))
    );
    write(x.ptr(), 256 * KIB, 7);
    let x = ledger.donate(x, tag).unwrap();
    assert_eq!(totals(tag), Some((240 * KIB, 256 * KIB)));
    ledger.check_invariants().unwrap();
    ledger.sleep(tag, Keep::Contents).unwrap();
    ledger.check_invariants().unwrap();
    ledger.wake(tag).unwrap();
    assert_eq!(first_wrong(x.ptr(), 256 * KIB, 7), None);
    ledger.check_invariants().unwrap();
    for y in [low, x, high] {
        ledger.deallocate(y).unwrap();
    }
    ledger.check_invariants().unwrap();
    assert_eq!(ledger.stats().bytes_in_use, 0);
    ledger.trim().unwrap();
    drop(ledger);
    assert!(d.census().is_empty(), "{:?}", d.census());
}

/// Several streams in use: a folded tagged allocation freed while asleep goes back with its
/// copy (no granule untouched twice), one freed awake stays pending and is not taken by the
/// next sleep of its tag; the survivors wake with their bytes; nothing leaks.
#[test]
fn review_fold_folded_sleepers_freed_with_several_streams() {
    let tag = "review_fold::multi_sleepy";
    portalloc::sleep_tags::declare_sleepable(tag);
    let d = host_device(128 * MIB, false);
    let (s, t) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    let a = vmm_over(&d, 64 * MIB);
    // The second stream seen: the multi-stream books from now on.
    let other = a.allocate(4 * KIB, 0, t, "review_fold::other").unwrap();
    let mut folds = Vec::new();
    let mut folded = 0;
    for (sizes, request) in [
        ([MIB, 256 * KIB, 256 * KIB], 240 * KIB),
        ([4 * MIB, 3 * MIB, 2 * MIB], 2 * MIB + 768 * KIB),
        ([MIB, 512 * KIB, 256 * KIB], 480 * KIB),
    ] {
        let mut made: Vec<Allocation> = sizes
            .iter()
            .map(|&n| a.allocate(n, 0, s, tag).unwrap())
            .collect();
        // Freed on S with an event: pending, then served to S's next request of its size.
        a.deallocate(made.remove(1)).unwrap();
        let x = a.allocate(request, 0, s, tag).unwrap();
        if check_one(&a, &x, request, 0) > request {
            folded += 1;
        }
        folds.push(x);
        folds.extend(made);
    }
    assert_eq!(folded, 3, "folds made with several streams");
    d.synchronize_device().unwrap();
    let mut live: Vec<(Allocation, u64, u32)> = folds
        .into_iter()
        .enumerate()
        .map(|(i, x)| {
            let c = a.charged(&x).unwrap();
            write(x.ptr(), c, i as u32 + 40);
            (x, c, i as u32 + 40)
        })
        .collect();
    // One freed awake (pending on S), then a sleep: the pending one is no sleeper.
    let (awake_freed, _, _) = live.remove(0);
    a.deallocate(awake_freed).unwrap();
    let report = a.sleep(tag, Keep::Contents).unwrap();
    assert_eq!(report.allocations as usize, live.len());
    // One freed asleep.
    let (asleep_freed, _, _) = live.remove(0);
    assert!(a.is_asleep(&asleep_freed));
    a.deallocate(asleep_freed).unwrap();
    a.check_invariants().unwrap();
    a.wake(tag).unwrap();
    for (x, c, seed) in &live {
        assert_eq!(first_wrong(x.ptr(), *c, *seed), None, "{x:?}");
    }
    for (x, _, _) in live {
        a.deallocate(x).unwrap();
    }
    a.deallocate(other).unwrap();
    close_two_streams(&d, a, s, t);
}

/// Two threads churning one allocator (real memory), each freeing half of what it makes
/// and handing the rest to the other to free: every byte of every charged range keeps its
/// pattern until its free, and the books are whole at the end.
#[test]
fn review_fold_threads_free_each_others_folded_chunks() {
    let limit = 64 * MIB;
    let d = host_device(limit + 32 * MIB, false);
    let a = vmm_over(&d, limit);
    let (tx0, rx1) = std::sync::mpsc::channel::<(Allocation, u64, u32)>();
    let (tx1, rx0) = std::sync::mpsc::channel::<(Allocation, u64, u32)>();
    let folded = std::sync::atomic::AtomicU64::new(0);
    let left: Vec<_> = std::thread::scope(|sc| {
        let threads: Vec<_> = [(0u32, tx0, rx0), (1u32, tx1, rx1)]
            .into_iter()
            .map(|(me, tx, rx)| {
                let (a, folded) = (&a, &folded);
                sc.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(0x7EAD + u64::from(me));
                    let mut mine: Vec<(Allocation, u64, u32)> = Vec::new();
                    for step in 0..400u32 {
                        while let Ok((x, c, seed)) = rx.try_recv() {
                            assert_eq!(
                                first_wrong(x.ptr(), c, seed),
                                None,
                                "handed over corrupted"
                            );
                            a.deallocate(x).unwrap();
                        }
                        if mine.len() > 8 || (!mine.is_empty() && rng.gen_bool(0.4)) {
                            let (x, c, seed) = mine.swap_remove(rng.gen_range(0..mine.len()));
                            assert_eq!(
                                first_wrong(x.ptr(), c, seed),
                                None,
                                "thread {me} step {step}"
                            );
                            if rng.gen_bool(0.5) {
                                a.deallocate(x).unwrap();
                            } else {
                                let _ = tx.send((x, c, seed));
                            }
                            continue;
                        }
                        let size = request(&mut rng).min(3 * MIB);
                        let x = match a.allocate(size, 0, Stream::DEFAULT, "review_fold::threads") {
                            Ok(x) => x,
                            Err(e) if e.is_out_of_memory() => continue,
                            Err(e) => panic!("{e}"),
                        };
                        let c = check_one(a, &x, size, 0);
                        if c > rounded(size) {
                            folded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        let seed = me << 16 | step;
                        write(x.ptr(), c, seed);
                        mine.push((x, c, seed));
                    }
                    for (x, c, seed) in mine {
                        assert_eq!(first_wrong(x.ptr(), c, seed), None);
                        a.deallocate(x).unwrap();
                    }
                    // What the other sends after this one finished is freed below.
                    rx
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for rx in left {
        for (x, c, seed) in rx.try_iter() {
            assert_eq!(first_wrong(x.ptr(), c, seed), None);
            a.deallocate(x).unwrap();
        }
    }
    a.check_invariants().unwrap();
    assert_eq!(a.stats().bytes_in_use, 0);
    assert!(folded.into_inner() > 5);
    a.trim().unwrap();
    drop(a);
    assert!(d.census().is_empty(), "{:?}", d.census());
}
