//! Streams that callers bring (issue #11), tested from the caller's side.
//!
//! PyTorch, cudarc, CuPy and C programs make their own streams with the driver's own call and
//! pass raw handles. The main scenario — streams made with `cuStreamCreate` /
//! `hipStreamCreateWithFlags`, the caller's own event held in flight on `S`, and no address
//! freed on `S` handed to another stream before that event completes — is a case of the
//! conformance suite (`tests/suite/conformance.rs`, `*::*::foreign_streams`), run for every strategy
//! on every target. Here, on the suite's targets (`tests/support/targets.rs`), what is
//! particular to one kind of handle or one driver:
//!
//! * the per-thread default stream is not reused at once on the same handle;
//! * when the driver refuses both an event and a stream synchronisation on the caller's
//!   stream, the strategy synchronises the device rather than read the refusal as "idle";
//! * the special handles (null, legacy, per-thread) are streams to both shims;
//! * both shims refuse a free of the wrong size, as the host does.

use crate::support::targets::{Strategy, SuiteStrategy, Target};
use portalloc::{Allocation, Stream};

const MIB: u64 = 1 << 20;
/// The buffer the caller's kernel uses.
const SIZE: u64 = MIB;
/// Capacity of each device; the strategies get 3/4 of it.
const CAPACITY: u64 = 64 * MIB;

fn overlaps(a: &Allocation, range: (u64, u64)) -> bool {
    a.size() > 0 && a.ptr() < range.1 && range.0 < a.ptr() + a.size()
}

/// The per-thread default stream names another stream on each thread: memory freed on it is
/// not handed to the same handle at once — only behind a GPU-side wait for the kernel's
/// work (the host device's own timeline says whether the request's stream is ordered after
/// it).
#[test]
fn per_thread_handle_is_not_reused_at_once() {
    for strategy in [Strategy::Bfc, Strategy::BfcGrow, Strategy::Vmm] {
        let rig = Target::HostSimulated.open(1, CAPACITY).unwrap();
        let a = strategy.build_as_configured(rig.device(0)).unwrap();
        let x = a.allocate(SIZE, 0, Stream::PER_THREAD, "x").unwrap();
        let freed = (x.ptr(), x.ptr() + SIZE);
        let work = rig.launch(Stream::PER_THREAD, x.ptr(), SIZE);
        a.deallocate(x).unwrap();
        let y = a.allocate(SIZE, 0, Stream::PER_THREAD, "y").unwrap();
        assert!(
            !overlaps(&y, freed) || rig.ordered(work, Stream::PER_THREAD),
            "{strategy:?}: reused on the per-thread handle with nothing ordering it after \
             the kernel"
        );
        rig.finish_work(work);
        a.deallocate(y).unwrap();
        a.trim().unwrap();
        drop(a);
        rig.finish();
    }
}

/// Runs `check` on device 0 of the CUDA shim and of the HIP shim (ROCm 6), each over its
/// conformance driver; then the census.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn on_each_shim(check: impl Fn(&crate::support::targets::Rig, &dyn portalloc::Device)) {
    let mut targets = Vec::new();
    if cfg!(feature = "cuda") {
        targets.push(Target::FakeCuda);
    }
    if cfg!(feature = "hip") {
        targets.push(Target::FakeHip(crate::support::targets::Rocm::V6));
    }
    for rig in targets.into_iter().filter_map(|t| t.open(1, CAPACITY)) {
        let device = rig.device(0);
        check(&rig, device.as_ref());
        drop(device);
        rig.finish();
    }
}

/// The device refuses to record an event on the caller's stream and to synchronise it (a
/// stream the caller destroyed, say): the memory is not handed out early — the device is
/// synchronised instead.
#[cfg(feature = "cuda")]
#[test]
fn refusals_are_not_idle() {
    for strategy in [Strategy::Bfc, Strategy::Vmm] {
        let Some(rig) = Target::FakeCuda.open(1, CAPACITY) else {
            return;
        };
        let fake = rig.fake().expect("a conformance driver");
        let a = strategy.build_as_configured(rig.device(0)).unwrap();
        let (s, t) = (rig.foreign_stream(), rig.foreign_stream());
        let keep = a.allocate(4096, 0, t, "t").unwrap();
        let x = a.allocate(SIZE, 0, s, "x").unwrap();
        let freed = (x.ptr(), x.ptr() + SIZE);
        let work = rig.launch(s, x.ptr(), SIZE);
        // The next call of each fails with CUDA_ERROR_INVALID_HANDLE.
        fake.fail("cuEventRecord", 1, 1, 400);
        fake.fail("cuStreamSynchronize", 1, 1, 400);
        a.deallocate(x).unwrap();
        assert!(
            rig.work_done(work),
            "{strategy:?}: neither an event nor the stream: the device was synchronised"
        );
        let y = a.allocate(SIZE, 0, t, "t").unwrap();
        assert!(!overlaps(&y, freed) || rig.work_done(work));
        for z in [keep, y] {
            a.deallocate(z).unwrap();
        }
        a.trim().unwrap();
        drop(a);
        rig.destroy_foreign(&[s, t]);
        rig.finish();
    }
}

/// The special handles CUDA and HIP both define — the null stream, the legacy default
/// stream (0x1) and the per-thread default stream (0x2) — are streams like any other:
/// events are recorded on them, they are synchronised, pools serve them.
#[cfg(any(feature = "cuda", feature = "hip"))]
#[test]
fn special_handles_are_streams() {
    on_each_shim(|rig, d| {
        let e = d.create_event().unwrap();
        for s in [Stream::DEFAULT, Stream::LEGACY, Stream::PER_THREAD] {
            rig.hold(true);
            d.record_event(e, s).unwrap();
            assert!(!d.event_complete(e).unwrap(), "{s:?}: held in flight");
            d.synchronize_stream(s).unwrap();
            assert!(d.event_complete(e).unwrap(), "{s:?}: synchronised");
            rig.hold(false);
            if let Some(pool) = d.stream_ordered_pool() {
                let p = pool.alloc_async(MIB, s).unwrap();
                pool.free_async(p, s).unwrap();
            }
        }
        d.synchronize_device().unwrap();
        d.destroy_event(e).unwrap();
    });
}

/// The CUDA and HIP shims agree with the host device on a free of the wrong size: it is
/// refused, nothing is freed, and the right size then frees it (#14: CUDA ignored it).
#[cfg(any(feature = "cuda", feature = "hip"))]
#[test]
fn a_free_of_the_wrong_size_is_refused_on_both_shims() {
    on_each_shim(|rig, d| {
        let p = d.alloc(MIB).unwrap();
        assert!(
            matches!(
                d.free(p, 2 * MIB),
                Err(portalloc::Error::InvalidArgument { .. })
            ),
            "{:?}",
            rig.target
        );
        let fake = rig.fake().expect("a conformance driver");
        assert_eq!(fake.live("allocations"), 1, "nothing was freed");
        d.free(p, MIB).unwrap();
    });
}
