//! Sleep and wake as callers live them, measured from the device's side: what the driver
//! itself counts as free memory before and after a sleep (never portalloc's books), tags whose
//! allocations interleave with other tags' at granule scale, work held in flight on the
//! caller's own streams (made with the driver's call) while a sleep and a wake run, a stream
//! destroyed while its allocation sleeps, a donation, and a free deferred by `record_stream`.
//!
//! The tags here are declared sleepable (as opening a region declares them), with names of
//! this module's own: declarations are process-wide, and the suite shares a process.

use std::sync::Arc;

use portalloc::adaptor::LedgerAllocator;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator, Device, Keep, Stream};
use test_case::test_case;

use crate::support::sleep::Workload;
#[cfg(feature = "hip")]
use crate::support::targets::Rocm;
use crate::support::targets::{Rig, Target};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The driver's own count of free memory on device 0.
fn free_bytes(rig: &Rig) -> u64 {
    rig.device(0)
        .mem_info()
        .expect("the driver's free memory")
        .free
}

/// Bytes between the words [`write`] and [`holds`] touch: one per 4 KiB page (and the
/// allocation's last word), so every page's survival is checked without writing the whole
/// half-gibibyte workloads byte by byte.
const STRIDE: usize = 4096;

/// The word at offset `i` of the pattern `seed`.
fn pattern(seed: u64, i: usize) -> u64 {
    (seed << 40) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The offsets of the words written: one per page, and the last word.
fn offsets(a: &Allocation) -> impl Iterator<Item = usize> {
    let size = a.size() as usize;
    (0..size.saturating_sub(8))
        .step_by(STRIDE)
        .chain(size.checked_sub(8))
}

/// Writes the pattern `seed` into `a` (device memory the process can address).
fn write(a: &Allocation, seed: u64) {
    for i in offsets(a) {
        // SAFETY: `a` is a live allocation of a target whose device memory is host memory of
        // this process (`Target::host_addressable`), mapped with access; `i + 8 <= a.size()`.
        unsafe { ((a.ptr() as usize + i) as *mut u64).write_unaligned(pattern(seed, i)) };
    }
}

/// True when `a` holds the pattern `seed`.
fn holds(a: &Allocation, seed: u64) -> bool {
    offsets(a).all(|i| {
        // SAFETY: as in `write`.
        let got = unsafe { ((a.ptr() as usize + i) as *const u64).read_unaligned() };
        got == pattern(seed, i)
    })
}

/// A vmm allocator over the rig's device 0 with budget `limit`.
fn vmm(rig: &Rig, limit: u64) -> VmmAllocator<dyn Device> {
    VmmAllocator::new(rig.device(0), VmmOptions::new(limit)).expect("vmm on the target")
}

/// Declares the module's tags (what opening a region does).
fn declare(tags: &[&str]) {
    for tag in tags {
        portalloc::sleep_tags::declare_sleepable(tag);
    }
}

/// A sleep of a tag gives the device at least 99% of the tag's bytes — the driver's free
/// memory says so — whatever the tags interleaved with it; the wake puts every allocation
/// back at its address with its bytes; free and trim give everything back.
#[test_case(Target::HostReal, Workload::Large ; "host real large")]
#[test_case(Target::HostReal, Workload::Granular ; "host real granular")]
#[test_case(Target::HostReal, Workload::Small ; "host real small")]
#[test_case(Target::HostSimulated, Workload::Granular ; "host simulated granular")]
#[test_case(Target::HostSimulated, Workload::Small ; "host simulated small")]
#[cfg_attr(feature = "cuda", test_case(Target::FakeCuda, Workload::Large ; "fakecuda large"))]
#[cfg_attr(feature = "cuda", test_case(Target::FakeCuda, Workload::Granular ; "fakecuda granular"))]
#[cfg_attr(feature = "cuda", test_case(Target::FakeCuda, Workload::Small ; "fakecuda small"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7), Workload::Large ; "fakehip large"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7), Workload::Granular ; "fakehip granular"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7), Workload::Small ; "fakehip small"))]
fn a_sleep_gives_the_device_the_tags_bytes(target: Target, workload: Workload) {
    let Some(rig) = target.open(1, 4 * GIB) else {
        return;
    };
    let (weights_tag, kv_tag) = ("world-weights", "world-kv");
    declare(&[weights_tag, kv_tag]);
    let vmm = vmm(&rig, 3 * GIB);
    let start = free_bytes(&rig);
    let mut weights = Vec::new();
    let mut kv = Vec::new();
    for (i, (w, k)) in workload.pairs().into_iter().enumerate() {
        weights.push(vmm.allocate(w, 0, Stream::DEFAULT, weights_tag).unwrap());
        kv.push(vmm.allocate(k, 0, Stream::DEFAULT, kv_tag).unwrap());
        if target.host_addressable() {
            write(&weights[i], i as u64);
            write(&kv[i], 1000 + i as u64);
        }
    }
    let weight_bytes: u64 = weights.iter().map(Allocation::size).sum();
    let before = free_bytes(&rig);

    let report = vmm.sleep(weights_tag, Keep::Contents).unwrap();
    assert_eq!(report.allocations, weights.len() as u64);
    let after = free_bytes(&rig);
    let back = after.saturating_sub(before);
    eprintln!(
        "{target:?} {workload:?}: the driver's free memory rose {back} B for {weight_bytes} B \
         of {weights_tag} ({:.2}%)",
        100.0 * back as f64 / weight_bytes as f64
    );
    assert!(
        back as f64 >= 0.99 * weight_bytes as f64,
        "{workload:?} on {target:?}: the device got {back} of the {weight_bytes} bytes of \
         {weights_tag} back (free {before} → {after})"
    );
    vmm.check_invariants().unwrap();
    if target.host_addressable() {
        assert!(kv
            .iter()
            .enumerate()
            .all(|(i, a)| holds(a, 1000 + i as u64)));
    }

    let ptrs: Vec<u64> = weights.iter().map(Allocation::ptr).collect();
    vmm.wake(weights_tag).unwrap();
    assert_eq!(
        weights.iter().map(Allocation::ptr).collect::<Vec<_>>(),
        ptrs
    );
    assert!(weights.iter().all(|a| !vmm.is_asleep(a)));
    if target.host_addressable() {
        for (i, a) in weights.iter().enumerate() {
            assert!(
                holds(a, i as u64),
                "weights {i} lost its bytes in the sleep"
            );
        }
    }
    vmm.check_invariants().unwrap();

    for a in weights.into_iter().chain(kv) {
        vmm.deallocate(a).unwrap();
    }
    vmm.trim().unwrap();
    assert_eq!(
        free_bytes(&rig),
        start,
        "free + trim gives back everything ({workload:?} on {target:?})"
    );
    drop(vmm);
    rig.finish();
}

/// The tag-affine placement costs what it says: allocations of tags that can sleep share no
/// granule with another tag's, while tags only kept for the books (a name per call site)
/// share granules as untagged memory does.
#[test]
fn only_tags_that_can_sleep_get_granules_of_their_own() {
    let Some(rig) = Target::HostSimulated.open(1, 4 * GIB) else {
        return;
    };
    declare(&["world-region"]);
    let vmm = vmm(&rig, GIB);
    // 64 books-only tags of 4 KiB each: one granule for all of them.
    let booked: Vec<Allocation> = (0..64)
        .map(|i| {
            vmm.allocate(4 * KIB, 0, Stream::DEFAULT, &format!("world-site-{i}"))
                .unwrap()
        })
        .collect();
    assert_eq!(vmm.mapped_bytes(), 2 * MIB);
    // A region's 4 KiB: a granule of its own.
    let region = vmm
        .allocate(4 * KIB, 0, Stream::DEFAULT, "world-region")
        .unwrap();
    assert_eq!(vmm.mapped_bytes(), 4 * MIB);
    let g = vmm.granularity();
    assert!(booked.iter().all(|a| a.ptr() / g != region.ptr() / g));
    vmm.deallocate(region).unwrap();
    for a in booked {
        vmm.deallocate(a).unwrap();
    }
    vmm.check_invariants().unwrap();
}

/// A kernel that writes the tag's memory on the caller's own stream (non-blocking, made with
/// the driver's call), still in flight: the sleep's copy out, which reads that memory, is
/// ordered after it — the driver's race detector logs nothing — and waits for it; the wake's
/// copy in writes the memory only once the copy out is done with it.
#[cfg(any(feature = "cuda", feature = "hip"))]
#[cfg_attr(feature = "cuda", test_case(Target::FakeCuda ; "fakecuda"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7) ; "fakehip"))]
fn a_sleeps_copy_is_ordered_after_a_kernel_writing_the_memory(target: Target) {
    let Some(rig) = target.open(1, 2 * GIB) else {
        return;
    };
    declare(&["world-writer"]);
    let vmm = vmm(&rig, GIB);
    let s = rig.foreign_stream();
    let b = vmm.allocate(3 * MIB, 0, s, "world-writer").unwrap();
    let writer = rig.launch_writing(s, b.ptr(), b.size());
    vmm.sleep("world-writer", Keep::Contents).unwrap();
    assert_eq!(rig.hazards(), (0, String::new()), "a sleep under a writer");
    assert!(rig.work_done(writer), "the sleep waited for the writer");
    vmm.wake("world-writer").unwrap();
    let reader = rig.launch_writing(s, b.ptr(), b.size());
    assert_eq!(
        rig.hazards(),
        (0, String::new()),
        "the wake's copy completed first"
    );
    rig.finish_work(reader);
    vmm.deallocate(b).unwrap();
    drop(vmm);
    rig.destroy_foreign(&[s]);
    rig.finish();
}

/// The sleep orders itself after work on every stream — the allocation's, a stream the
/// caller recorded a use on, three of them at once — and copies on a stream of its own: the
/// driver's hazard log stays empty through sleep and wake with kernels in flight.
#[test_case(Target::HostReal ; "host real")]
#[cfg_attr(feature = "cuda", test_case(Target::FakeCuda ; "fakecuda"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7) ; "fakehip"))]
fn no_hazard_with_kernels_in_flight_on_three_streams(target: Target) {
    let Some(rig) = target.open(1, 2 * GIB) else {
        return;
    };
    declare(&["world-three"]);
    let vmm = vmm(&rig, GIB);
    let streams: Vec<Stream> = (0..3).map(|_| rig.foreign_stream()).collect();
    let buffers: Vec<Allocation> = streams
        .iter()
        .map(|&s| vmm.allocate(3 * MIB, 0, s, "world-three").unwrap())
        .collect();
    // Each buffer used by a kernel on its own stream and one on the next stream (a use the
    // caller would record with `record_stream`).
    let mut kernels = Vec::new();
    for (i, b) in buffers.iter().enumerate() {
        kernels.push(rig.launch(streams[i], b.ptr(), b.size()));
        kernels.push(rig.launch(streams[(i + 1) % 3], b.ptr(), b.size()));
    }
    vmm.sleep("world-three", Keep::Contents).unwrap();
    assert_eq!(
        rig.hazards(),
        (0, String::new()),
        "sleep under kernels in flight"
    );
    assert!(
        kernels.iter().all(|&k| rig.work_done(k)),
        "the sleep waited for the work on every stream"
    );
    vmm.wake("world-three").unwrap();
    for (i, b) in buffers.iter().enumerate() {
        rig.launch(streams[(i + 2) % 3], b.ptr(), b.size());
    }
    vmm.sleep("world-three", Keep::Nothing).unwrap();
    vmm.wake("world-three").unwrap();
    assert_eq!(
        rig.hazards(),
        (0, String::new()),
        "the second sleep and wake"
    );
    for b in buffers {
        vmm.deallocate(b).unwrap();
    }
    drop(vmm);
    rig.destroy_foreign(&streams);
    rig.finish();
}

/// A stream destroyed by its owner while its allocation sleeps (CuPy destroys streams when
/// they are garbage-collected): the wake never uses it, and brings the bytes back.
#[test_case(Target::HostReal ; "host real")]
#[cfg_attr(feature = "cuda", test_case(Target::FakeCuda ; "fakecuda"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7) ; "fakehip"))]
fn a_wake_needs_no_stream_of_the_callers(target: Target) {
    let Some(rig) = target.open(1, GIB) else {
        return;
    };
    declare(&["world-orphan"]);
    let vmm = vmm(&rig, 512 * MIB);
    let s = rig.foreign_stream();
    let a = vmm.allocate(5 * MIB, 0, s, "world-orphan").unwrap();
    if target.host_addressable() {
        write(&a, 7);
    }
    vmm.sleep("world-orphan", Keep::Contents).unwrap();
    rig.destroy_foreign(&[s]);
    // The driver may hand the destroyed stream's handle to the next stream it makes.
    let t = rig.foreign_stream();
    vmm.wake("world-orphan").unwrap();
    assert!(!vmm.is_asleep(&a));
    if target.host_addressable() {
        assert!(holds(&a, 7), "the bytes came back");
    }
    assert_eq!(rig.hazards(), (0, String::new()));
    vmm.deallocate(a).unwrap();
    drop(vmm);
    rig.destroy_foreign(&[t]);
    rig.finish();
}

/// A donated buffer sleeps under the consumer's tag, and a sleep of the giver's tag without
/// its contents leaves the consumer's bytes alone.
#[test]
fn a_donation_moves_the_tag_that_sleeps() {
    let Some(rig) = Target::HostReal.open(1, GIB) else {
        return;
    };
    declare(&["world-giver", "world-consumer"]);
    let ledger = LedgerAllocator::new(vmm(&rig, 512 * MIB));
    let given = ledger
        .allocate(4 * MIB, 0, Stream::DEFAULT, "world-giver")
        .unwrap();
    let kept = ledger
        .allocate(4 * MIB, 0, Stream::DEFAULT, "world-giver")
        .unwrap();
    let output = ledger.donate(given, "world-consumer").unwrap();
    write(&output, 42);

    let report = ledger.sleep("world-consumer", Keep::Contents).unwrap();
    assert_eq!((report.allocations, report.bytes), (1, 4 * MIB));
    assert!(ledger.is_asleep(&output) && !ledger.is_asleep(&kept));
    ledger.wake("world-consumer").unwrap();
    assert!(holds(&output, 42));

    let report = ledger.sleep("world-giver", Keep::Nothing).unwrap();
    assert_eq!(report.allocations, 1, "only the buffer the giver kept");
    ledger.wake("world-giver").unwrap();
    assert!(
        holds(&output, 42),
        "the consumer's bytes survive the giver's sleep"
    );
    ledger.deallocate(output).unwrap();
    ledger.deallocate(kept).unwrap();
}

/// A buffer whose free waits for a recorded stream is no sleeper: a sleep of its tag neither
/// copies nor unmaps it.
#[test]
fn a_buffer_being_freed_does_not_sleep() {
    let Some(rig) = Target::HostReal.open(1, GIB) else {
        return;
    };
    declare(&["world-freeing"]);
    let vmm = Arc::new(vmm(&rig, 512 * MIB));
    let live = vmm
        .allocate(2 * MIB, 0, Stream::DEFAULT, "world-freeing")
        .unwrap();
    let freeing = vmm
        .allocate(2 * MIB, 0, Stream::DEFAULT, "world-freeing")
        .unwrap();
    vmm.freeing(&freeing);
    let report = vmm.sleep("world-freeing", Keep::Contents).unwrap();
    assert_eq!((report.allocations, report.bytes), (1, 2 * MIB));
    assert!(vmm.is_asleep(&live) && !vmm.is_asleep(&freeing));
    vmm.deallocate(freeing).unwrap();
    vmm.wake("world-freeing").unwrap();
    vmm.deallocate(live).unwrap();
    vmm.check_invariants().unwrap();
}

/// The first sleep's host copy is host memory registered with the driver (its pages touched
/// from several threads, then `cuMemHostRegister_v2` / `hipHostRegister`: the fastest
/// published way to pin, 0.10 s per GiB against `cuMemHostAlloc`'s 0.49), never pinned
/// memory allocated by the driver; the next sleep reuses it (no registration); `trim`
/// unregisters it; the driver's hazard log stays empty and nothing is left behind.
#[test_case(Target::HostReal ; "host real")]
#[test_case(Target::HostSimulated ; "host simulated")]
#[cfg_attr(feature = "cuda", test_case(Target::FakeCuda ; "fakecuda"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7) ; "fakehip"))]
fn a_sleeps_host_copy_is_registered_kept_and_unregistered_by_trim(target: Target) {
    use portalloc::adaptor::CallLog;
    let Some(rig) = target.open(1, GIB) else {
        return;
    };
    declare(&["world-registered"]);
    let log = Arc::new(CallLog::new(rig.device(0)));
    let vmm = VmmAllocator::new(
        Arc::clone(&log) as Arc<dyn Device>,
        VmmOptions::new(512 * MIB),
    )
    .expect("vmm on the target");
    let a = vmm
        .allocate(40 * MIB + 4 * KIB, 0, Stream::DEFAULT, "world-registered")
        .unwrap();
    if target.host_addressable() {
        write(&a, 11);
    }
    let count = |calls: &[portalloc::adaptor::LoggedCall], name: &str| {
        calls.iter().filter(|c| c.name == name).count()
    };
    log.take();
    vmm.sleep("world-registered", Keep::Contents).unwrap();
    let first = log.take();
    let registered: Vec<u64> = first
        .iter()
        .filter(|c| c.name == "register_host")
        .map(|c| c.bytes)
        .collect();
    assert_eq!(
        registered,
        vec![(40 * MIB + 4 * KIB).next_multiple_of(4 * KIB)],
        "one registration of the copy's whole pages: {first:?}"
    );
    assert_eq!(
        count(&first, "alloc_pinned_host"),
        0,
        "no driver-allocated pinned memory"
    );
    vmm.wake("world-registered").unwrap();
    if target.host_addressable() {
        assert!(
            holds(&a, 11),
            "the bytes came back through the registered copy"
        );
    }
    assert_eq!(
        vmm.spare_host_bytes(),
        40 * MIB + 4 * KIB,
        "kept, sized exactly"
    );
    log.take();
    vmm.sleep("world-registered", Keep::Contents).unwrap();
    vmm.wake("world-registered").unwrap();
    let second = log.take();
    assert_eq!(
        count(&second, "register_host"),
        0,
        "the kept copy is reused"
    );
    vmm.trim().unwrap();
    assert_eq!(vmm.spare_host_bytes(), 0);
    assert_eq!(
        count(&log.take(), "unregister_host"),
        1,
        "trim gives it back"
    );
    assert_eq!(rig.hazards(), (0, String::new()));
    vmm.deallocate(a).unwrap();
    drop(vmm);
    drop(log);
    rig.finish();
}
