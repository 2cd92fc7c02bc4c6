//! Graph pools from the caller's side, over fakecuda and fakehip (which capture streams as the
//! vendors document it, `docs/fakes.md` §2.18): for every strategy, a warm-up, a capture that
//! allocates and frees on a stream made with the driver's own call, eager allocations after it
//! written by kernels held in flight on another stream, and 100 replays of the graph — no
//! hazard in the driver's log and the capture never invalidated; the same run with the
//! pool's frees planted back into the strategy ("reuse after capture") is caught by the log.
//! Then what a capture makes impossible (a typed error), frees of eager memory during a
//! capture (held, no captured event), a pool asleep and awake (the driver's free memory, the
//! bytes, the hooks), and release.
#![cfg(all(feature = "hip", feature = "cuda"))]

use std::sync::{Arc, Mutex};

use portalloc::adaptor::{Detect, GraphPoolHooks, GraphPools};
use portalloc::backends::cuda::CudaDevice;
use portalloc::backends::hip::HipDevice;
use portalloc::{Allocation, Allocator, CaptureStatus, Device, Error, Keep, Vendor};
use test_case::test_case;

use crate::support::capture::{open, pools_over, Raw};
use crate::support::common::Strategy;
use crate::support::fakes::{stamp, stamped, FakeDevice};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn overlaps(a: &Allocation, b: &Allocation) -> bool {
    a.ptr() < b.ptr() + b.size() && b.ptr() < a.ptr() + a.size()
}

/// The whole sequence: warm-up, capture, eager work after it, 100 replays. Returns the
/// hazards the driver logged and whether an eager buffer overlapped a graph buffer.
fn capture_and_replay<D: FakeDevice>(strategy: Strategy, plant_bug: bool) -> (u64, String, bool) {
    let (fake, device) = open::<D>(2 * GIB);
    let raw = Raw { fake: &fake };
    let pools = pools_over(strategy, &device, GIB, Detect::WhileRouted);
    pools.plant_reuse_after_capture_bug(plant_bug);
    let (s, eager_stream) = (raw.stream(), raw.stream());
    // Warm-up: the step once, eagerly.
    let w = pools.allocate(4 * MIB, 0, s, "warm-up").unwrap();
    let k = fake.launch_writing(s, w.ptr(), w.size());
    raw.sync(s);
    assert!(fake.kernel_done(k));
    pools.deallocate(w).unwrap();

    let pool = pools.create_pool(Some("decode graph")).unwrap();
    pools.begin_allocate_to_pool(pool, s).unwrap();
    raw.begin(s);
    assert!(matches!(
        device.capture_status(s).unwrap(),
        CaptureStatus::Active { .. }
    ));
    let a = pools.allocate(4 * MIB, 0, s, "activations").unwrap();
    fake.launch_writing(s, a.ptr(), a.size());
    let b = pools.allocate(2 * MIB, 0, s, "logits").unwrap();
    fake.launch(s, a.ptr(), a.size());
    fake.launch_writing(s, b.ptr(), b.size());
    let a_ptr = a.ptr();
    pools.deallocate(a).unwrap(); // freed inside the capture
    let c = pools.allocate(4 * MIB, 0, s, "activations").unwrap();
    if !plant_bug {
        assert_eq!(
            c.ptr(),
            a_ptr,
            "{}: reused within its capture",
            strategy.name()
        );
    }
    fake.launch_writing(s, c.ptr(), c.size());
    let graph = raw.end(s).unwrap_or_else(|rc| {
        panic!(
            "{}: the capture was invalidated ({rc}): {:?}",
            strategy.name(),
            raw.invalidations()
        )
    });
    pools.end_allocate_to_pool(pool).unwrap();
    assert_eq!(raw.invalidations().0, 0);
    let graph_buffers = [(a_ptr, 4 * MIB), (b.ptr(), b.size()), (c.ptr(), c.size())];
    // The caller drops the graph's buffers (PyTorch frees a graph's outputs when they go).
    pools.deallocate(b).unwrap();
    pools.deallocate(c).unwrap();

    // Eager work after the capture, held in flight on another stream.
    let mut eager = Vec::new();
    let mut kernels = Vec::new();
    let mut overlap = false;
    for i in 0..8u64 {
        let x = pools
            .allocate((2 + i % 3) * MIB, 0, eager_stream, "eager")
            .unwrap();
        overlap |= graph_buffers
            .iter()
            .any(|&(p, n)| x.ptr() < p + n && p < x.ptr() + x.size());
        kernels.push(fake.launch_writing(eager_stream, x.ptr(), x.size()));
        eager.push(x);
    }
    for (i, x) in eager.iter().enumerate() {
        for y in &eager[i + 1..] {
            assert!(!overlaps(x, y), "eager buffers overlap");
        }
    }
    let exec = raw.instantiate(graph);
    for replay in 0..100 {
        raw.launch(exec, s);
        if replay % 10 == 9 {
            raw.sync(s);
        }
    }
    raw.sync(s);
    let hazards = fake.hazards();
    for k in kernels {
        fake.finish(k);
    }
    raw.sync(eager_stream);
    for x in eager {
        pools.deallocate(x).unwrap();
    }
    raw.destroy(graph, exec);
    if !plant_bug {
        let stats = pools.pool_stats(pool).unwrap();
        assert_eq!(
            (stats.blocks, stats.in_use_bytes, stats.free_bytes),
            (2, 0, 6 * MIB),
            "{}: {stats:?}",
            strategy.name()
        );
        pools.check_invariants().unwrap();
        assert_eq!(pools.release_pool(pool).unwrap(), 6 * MIB);
        assert!(pools.pool_stats(pool).is_none(), "released and empty");
    }
    drop(pools);
    (hazards.0, hazards.1, overlap)
}

fn every_strategy<D: FakeDevice>() {
    for strategy in Strategy::ALL {
        let (hazards, first, overlap) = capture_and_replay::<D>(strategy, false);
        assert_eq!(hazards, 0, "{}: {first}", strategy.name());
        assert!(
            !overlap,
            "{}: an eager buffer over a graph's",
            strategy.name()
        );
        let (hazards, first, overlap) = capture_and_replay::<D>(strategy, true);
        assert!(
            hazards > 0,
            "{}: the planted reuse after capture went unseen (eager over graph: {overlap})",
            strategy.name()
        );
        assert!(
            first.starts_with("race") || first.contains("no longer memory"),
            "{}: {first}",
            strategy.name()
        );
    }
}

#[test]
fn every_strategy_replays_a_captured_graph_without_hazards_on_fakecuda() {
    every_strategy::<CudaDevice>();
}

#[test]
fn every_strategy_replays_a_captured_graph_without_hazards_on_fakehip() {
    every_strategy::<HipDevice>();
}

/// A captured request the pool's strategy cannot serve: a typed error that says the stream is
/// captured and what to do, and the capture stays valid (portalloc made no forbidden call).
#[test_case(Vendor::Cuda ; "cuda")]
#[test_case(Vendor::Hip ; "hip")]
fn a_request_the_capture_makes_impossible_is_a_typed_error(vendor: Vendor) {
    fn run<D: FakeDevice>() {
        for strategy in Strategy::ALL {
            let (fake, device) = open::<D>(GIB);
            let raw = Raw { fake: &fake };
            let pools = pools_over(strategy, &device, 64 * MIB, Detect::WhileRouted);
            let s = raw.stream();
            let pool = pools.create_pool(None).unwrap();
            pools.begin_allocate_to_pool(pool, s).unwrap();
            raw.begin(s);
            let e = pools.allocate(256 * MIB, 0, s, "too big").unwrap_err();
            assert!(
                matches!(e, Error::StreamCapturing { .. }),
                "{}: {e}",
                strategy.name()
            );
            let text = e.to_string();
            for needle in [
                "being captured into a graph",
                "graph pool 1",
                "warm up before capturing",
            ] {
                assert!(text.contains(needle), "{}: {text}", strategy.name());
            }
            assert!(
                matches!(
                    device.capture_status(s).unwrap(),
                    CaptureStatus::Active { .. }
                ),
                "{}: the capture stays valid",
                strategy.name()
            );
            let graph = raw.end(s).expect("not invalidated");
            pools.end_allocate_to_pool(pool).unwrap();
            let exec = raw.instantiate(graph);
            raw.destroy(graph, exec);
        }
    }
    match vendor {
        Vendor::Cuda => run::<CudaDevice>(),
        _ => run::<HipDevice>(),
    }
}

/// A capture nobody routed: with `WhileRouted` and another capture routed, refused with the
/// typed error; with `EveryRequest`, served from a pool of its own.
#[test]
fn an_unrouted_capture_is_refused_or_gets_its_own_pool() {
    let (fake, device) = open::<CudaDevice>(GIB);
    let raw = Raw { fake: &fake };
    let routed = pools_over(Strategy::Bfc, &device, 256 * MIB, Detect::WhileRouted);
    let (s1, s2) = (raw.stream(), raw.stream());
    let pool = routed.create_pool(None).unwrap();
    routed.begin_allocate_to_pool(pool, s1).unwrap();
    raw.begin(s2);
    let e = routed.allocate(MIB, 0, s2, "x").unwrap_err();
    assert!(
        e.to_string()
            .contains("no graph pool receives this capture"),
        "{e}"
    );
    raw.end(s2).expect("not invalidated");
    routed.end_allocate_to_pool(pool).unwrap();
    drop(routed);

    let auto = pools_over(Strategy::Bfc, &device, 256 * MIB, Detect::EveryRequest);
    let warm = auto.allocate(MIB, 0, s1, "eager").unwrap();
    auto.deallocate(warm).unwrap();
    raw.begin(s2);
    let x = auto.allocate(MIB, 0, s2, "x").unwrap();
    let graph = raw.end(s2).expect("not invalidated");
    let pools = auto.pools();
    assert_eq!(pools.len(), 1);
    assert_eq!((pools[0].blocks, pools[0].in_use_bytes), (1, MIB));
    auto.deallocate(x).unwrap();
    // After the capture: eager again, and the automatic route is gone.
    let y = auto.allocate(MIB, 0, s2, "eager").unwrap();
    assert_ne!(y.ptr(), pools[0].id.get(), "eager memory");
    assert_eq!(auto.pools()[0].routed_captures, 0);
    auto.deallocate(y).unwrap();
    let exec = raw.instantiate(graph);
    raw.destroy(graph, exec);
    assert_eq!(raw.invalidations().0, 0);
}

/// A buffer allocated eagerly and freed during a capture on its stream: held (the strategy
/// would record an event on the captured stream), handed to the strategy once the capture
/// ends; the capture is never invalidated.
#[test_case(Strategy::Bfc ; "bfc")]
#[test_case(Strategy::Vmm ; "vmm")]
#[test_case(Strategy::Async ; "async")]
fn an_eager_free_during_a_capture_is_held_until_it_ends(strategy: Strategy) {
    let (fake, device) = open::<HipDevice>(GIB);
    let raw = Raw { fake: &fake };
    let pools = pools_over(strategy, &device, 256 * MIB, Detect::WhileRouted);
    let s = raw.stream();
    let other = raw.stream();
    // Two streams seen: the strategies order frees by events.
    let x = pools.allocate(8 * MIB, 0, s, "eager").unwrap();
    let y = pools.allocate(MIB, 0, other, "eager").unwrap();
    pools.deallocate(y).unwrap();
    let pool = pools.create_pool(None).unwrap();
    pools.begin_allocate_to_pool(pool, s).unwrap();
    raw.begin(s);
    let in_use = pools.stats().bytes_in_use;
    pools.deallocate(x).unwrap();
    assert_eq!(pools.stats().bytes_in_use, in_use, "held, not yet freed");
    let graph = raw
        .end(s)
        .unwrap_or_else(|rc| panic!("invalidated ({rc}): {:?}", raw.invalidations()));
    pools.end_allocate_to_pool(pool).unwrap();
    assert!(
        pools.stats().bytes_in_use < in_use,
        "freed once the capture ended"
    );
    let exec = raw.instantiate(graph);
    raw.destroy(graph, exec);
    assert_eq!(raw.invalidations().0, 0);
}

/// A graph pool asleep gives the driver back its memory; awake, every block is at its address
/// with its bytes, the hooks saw the ranges, and replays log no hazard.
#[test_case(Vendor::Cuda ; "cuda")]
#[test_case(Vendor::Hip ; "hip")]
fn a_graph_pool_sleeps_and_wakes_at_its_addresses(vendor: Vendor) {
    fn run<D: FakeDevice>() {
        let (fake, device) = open::<D>(2 * GIB);
        let raw = Raw { fake: &fake };
        let pools = pools_over(Strategy::Vmm, &device, GIB, Detect::WhileRouted);
        let seen: Arc<Mutex<Vec<(&'static str, usize)>>> = Arc::default();
        let (before, after) = (Arc::clone(&seen), Arc::clone(&seen));
        pools.set_hooks(
            GraphPoolHooks::new()
                .before_sleep(Box::new(move |_, r| {
                    before.lock().unwrap().push(("sleep", r.len()))
                }))
                .after_wake(Box::new(move |_, r| {
                    after.lock().unwrap().push(("wake", r.len()))
                })),
        );
        let s = raw.stream();
        let pool = pools.create_pool(Some("decode graphs")).unwrap();
        pools.begin_allocate_to_pool(pool, s).unwrap();
        raw.begin(s);
        let blocks: Vec<Allocation> = (0..4)
            .map(|i| pools.allocate((16 + 8 * i) * MIB, 0, s, "kv").unwrap())
            .collect();
        for b in &blocks {
            fake.launch_writing(s, b.ptr(), b.size());
        }
        let graph = raw.end(s).expect("not invalidated");
        pools.end_allocate_to_pool(pool).unwrap();
        let exec = raw.instantiate(graph);
        raw.launch(exec, s);
        raw.sync(s);
        for (i, b) in blocks.iter().enumerate() {
            stamp(b, 0x40 + i as u8);
        }
        let held = pools.pool_stats(pool).unwrap().held_bytes;
        assert_eq!(held, (16 + 24 + 32 + 40) * MIB);
        let free_before = device.mem_info().unwrap().free;
        pools.sleep_pool(pool, Keep::Contents).unwrap();
        let given = device.mem_info().unwrap().free - free_before;
        assert!(
            given as f64 >= 0.99 * held as f64,
            "the driver got back {given} of {held} bytes"
        );
        let ptrs: Vec<u64> = blocks.iter().map(Allocation::ptr).collect();
        pools.wake_pool(pool).unwrap();
        for (i, b) in blocks.iter().enumerate() {
            assert_eq!(b.ptr(), ptrs[i]);
            assert!(stamped(b, 0x40 + i as u8), "block {i}'s bytes came back");
        }
        assert_eq!(*seen.lock().unwrap(), vec![("sleep", 4), ("wake", 4)]);
        for _ in 0..10 {
            raw.launch(exec, s);
        }
        raw.sync(s);
        assert_eq!(fake.hazards().0, 0, "{}", fake.hazards().1);
        raw.destroy(graph, exec);
        for b in blocks {
            pools.deallocate(b).unwrap();
        }
        assert_eq!(pools.release_pool(pool).unwrap(), held);
    }
    match vendor {
        Vendor::Cuda => run::<CudaDevice>(),
        _ => run::<HipDevice>(),
    }
}

/// The same capture straight into a strategy, without graph pools: every strategy either has
/// the capture invalidated (a forbidden call, an event recorded in it and queried) or hands
/// memory a graph replays over to eager work, which the driver's log shows. What the adaptor
/// is for, measured on the driver's side.
#[test_case(Vendor::Cuda ; "cuda")]
#[test_case(Vendor::Hip ; "hip")]
fn without_graph_pools_every_strategy_breaks_the_capture_or_its_replays(vendor: Vendor) {
    fn run<D: FakeDevice>() -> Vec<String> {
        let mut outcomes = Vec::new();
        for strategy in Strategy::ALL {
            let (fake, device) = open::<D>(2 * GIB);
            let raw = Raw { fake: &fake };
            let bare = strategy.try_build(Arc::clone(&device), GIB).unwrap();
            let (s, eager_stream) = (raw.stream(), raw.stream());
            let w = bare.allocate(4 * MIB, 0, s, "warm-up").unwrap();
            raw.sync(s);
            bare.deallocate(w).unwrap();
            raw.begin(s);
            let mut graph_buffers = Vec::new();
            let mut failed = None;
            for size in [4 * MIB, 2 * MIB, 64 * MIB] {
                match bare.allocate(size, 0, s, "captured") {
                    Ok(a) => {
                        fake.launch_writing(s, a.ptr(), a.size());
                        graph_buffers.push((a.ptr(), a.size()));
                        if let Err(e) = bare.deallocate(a) {
                            failed.get_or_insert(e.to_string());
                        }
                    }
                    Err(e) => {
                        failed.get_or_insert(e.to_string());
                    }
                }
            }
            let ended = raw.end(s);
            let outcome = match ended {
                Err(rc) => format!("invalidated ({rc}): {}", raw.invalidations().1),
                Ok(graph) => {
                    let mut eager = Vec::new();
                    for size in [4 * MIB, 2 * MIB, 64 * MIB] {
                        if let Ok(x) = bare.allocate(size, 0, eager_stream, "eager") {
                            fake.launch_writing(eager_stream, x.ptr(), x.size());
                            eager.push(x);
                        }
                    }
                    let exec = raw.instantiate(graph);
                    raw.launch(exec, s);
                    let (hazards, first) = fake.hazards();
                    let finish_all: unsafe extern "C" fn() = fake.sym("fake_finish_all");
                    // SAFETY: no arguments.
                    unsafe { finish_all() };
                    raw.sync(s);
                    raw.sync(eager_stream);
                    for x in eager {
                        let _ = bare.deallocate(x);
                    }
                    raw.destroy(graph, exec);
                    if hazards > 0 {
                        format!("{hazards} hazard(s): {first}")
                    } else {
                        format!("no hazard, errors: {failed:?}")
                    }
                }
            };
            outcomes.push(format!("{}: {outcome}", strategy.name()));
        }
        outcomes
    }
    let outcomes = match vendor {
        Vendor::Cuda => run::<CudaDevice>(),
        _ => run::<HipDevice>(),
    };
    for o in &outcomes {
        assert!(!o.contains("no hazard"), "{outcomes:#?}");
    }
}

/// An eager request refused while graph pools hold memory: the out-of-memory report names
/// each pool, what it holds and how much of it is free.
#[test]
fn an_out_of_memory_report_names_the_graph_pools() {
    let (fake, device) = open::<CudaDevice>(GIB);
    let raw = Raw { fake: &fake };
    let pools = pools_over(Strategy::Bfc, &device, 64 * MIB, Detect::WhileRouted);
    let s = raw.stream();
    let pool = pools.create_pool(Some("decode graph")).unwrap();
    pools.begin_allocate_to_pool(pool, s).unwrap();
    raw.begin(s);
    let a = pools.allocate(24 * MIB, 0, s, "graph").unwrap();
    let b = pools.allocate(8 * MIB, 0, s, "graph").unwrap();
    let graph = raw.end(s).expect("not invalidated");
    pools.end_allocate_to_pool(pool).unwrap();
    pools.deallocate(b).unwrap(); // free in the pool, still the graph's
    let e = pools.allocate(48 * MIB, 0, s, "eager").unwrap_err();
    let text = e.to_string();
    for needle in [
        "graph pools hold 32.00 MiB for captured graphs",
        "graph pool 1 \"decode graph\": 32.00 MiB in 2 blocks, 8.00 MiB of it free",
    ] {
        assert!(text.contains(needle), "{needle:?} not in: {text}");
    }
    pools.deallocate(a).unwrap();
    let exec = raw.instantiate(graph);
    raw.destroy(graph, exec);
}

/// The host backend marks captured streams (`HostDevice::begin_capture`): a graph pool over vmm
/// on real host memory sleeps and wakes with its bytes, at its addresses, and the host gets its
/// memory back meanwhile.
#[test]
fn a_graph_pool_sleeps_and_wakes_with_its_bytes_on_the_host() {
    use portalloc::backends::host::HostDevice;
    let host = Arc::new(
        HostDevice::builder()
            .capacity(GIB)
            .build()
            .expect("a real host device"),
    );
    let device: Arc<dyn Device> = Arc::clone(&host) as Arc<dyn Device>;
    let upstream = Strategy::Vmm.try_build(Arc::clone(&host), GIB / 2).unwrap();
    let pools = GraphPools::from_boxed(upstream, Arc::clone(&device), Detect::WhileRouted);
    let s = device.create_stream().unwrap();
    let pool = pools.create_pool(Some("host graphs")).unwrap();
    pools.begin_allocate_to_pool(pool, s).unwrap();
    host.begin_capture(s);
    assert!(matches!(
        device.capture_status(s).unwrap(),
        CaptureStatus::Active { .. }
    ));
    let blocks: Vec<Allocation> = [8 * MIB, 6 * MIB, 2 * MIB]
        .into_iter()
        .map(|n| pools.allocate(n, 0, s, "kv").unwrap())
        .collect();
    assert!(host.end_capture(s));
    pools.end_allocate_to_pool(pool).unwrap();
    for (i, b) in blocks.iter().enumerate() {
        stamp(b, 0x70 + i as u8);
    }
    let held = pools.pool_stats(pool).unwrap().held_bytes;
    assert_eq!(held, 16 * MIB);
    let before = device.mem_info().unwrap().free;
    pools.sleep_pool(pool, Keep::Contents).unwrap();
    let given = device.mem_info().unwrap().free - before;
    assert!(
        given as f64 >= 0.99 * held as f64,
        "the host got back {given} of {held} bytes"
    );
    pools.wake_pool(pool).unwrap();
    for (i, b) in blocks.iter().enumerate() {
        assert!(stamped(b, 0x70 + i as u8), "block {i}'s bytes came back");
    }
    for b in blocks {
        pools.deallocate(b).unwrap();
    }
    assert_eq!(pools.release_pool(pool).unwrap(), held);
    drop(pools);
    // SAFETY: made above, nothing queued on it.
    unsafe { device.destroy_stream(s) }.unwrap();
    assert!(host.census().is_empty(), "{:?}", host.census());
}

/// What the capture check costs, counted on the device: `WhileRouted` makes no call outside a
/// routed capture, `EveryRequest` one `capture_status` per allocation and one per free.
#[test]
fn the_capture_check_costs_what_the_docs_say() {
    use portalloc::adaptor::CountingDevice;
    use portalloc::backends::host::HostDevice;
    for (detect, per_pair) in [(Detect::WhileRouted, 0), (Detect::EveryRequest, 2)] {
        let host = Arc::new(
            HostDevice::builder()
                .capacity(GIB)
                .simulated(true)
                .build()
                .unwrap(),
        );
        let counting = Arc::new(CountingDevice::new(Arc::clone(&host)));
        let upstream = Strategy::Bfc
            .try_build(Arc::clone(&counting), GIB / 2)
            .unwrap();
        let pools =
            GraphPools::from_boxed(upstream, Arc::clone(&counting) as Arc<dyn Device>, detect);
        let warm = pools
            .allocate(MIB, 0, portalloc::Stream::DEFAULT, "x")
            .unwrap();
        pools.deallocate(warm).unwrap();
        let calls = |c: &CountingDevice<HostDevice>| {
            c.tally()
                .by_name
                .get("capture_status")
                .map_or(0, |&(n, _)| n)
        };
        let before = calls(&counting);
        for _ in 0..1000 {
            let a = pools
                .allocate(MIB, 0, portalloc::Stream::DEFAULT, "x")
                .unwrap();
            pools.deallocate(a).unwrap();
        }
        let spent = calls(&counting) - before;
        assert_eq!(spent, 1000 * per_pair, "{detect:?}");
    }
}

/// A ledger over graph pools lists them in its snapshot (and its JSON, read back): which pool,
/// its tag, what it holds, how much of it is free.
#[test]
fn a_ledger_snapshot_lists_the_graph_pools() {
    use portalloc::adaptor::{LedgerAllocator, LedgerSnapshot};
    let (fake, device) = open::<HipDevice>(GIB);
    let raw = Raw { fake: &fake };
    let pools = pools_over(Strategy::BfcGrow, &device, 256 * MIB, Detect::WhileRouted);
    let ledger = LedgerAllocator::new(pools.clone());
    let s = raw.stream();
    let pool = pools.create_pool(Some("decode graph")).unwrap();
    pools.begin_allocate_to_pool(pool, s).unwrap();
    raw.begin(s);
    let a = ledger.allocate(4 * MIB, 0, s, "kv").unwrap();
    let b = ledger.allocate(2 * MIB, 0, s, "kv").unwrap();
    let graph = raw.end(s).expect("not invalidated");
    pools.end_allocate_to_pool(pool).unwrap();
    ledger.deallocate(b).unwrap();
    let snapshot = ledger.snapshot();
    assert_eq!(snapshot.graph_pools, pools.pools());
    let listed = &snapshot.graph_pools[0];
    assert_eq!(
        (
            listed.tag.as_str(),
            listed.blocks,
            listed.held_bytes,
            listed.free_bytes
        ),
        ("decode graph", 2, 6 * MIB, 2 * MIB)
    );
    let back = LedgerSnapshot::from_json(&snapshot.to_json()).unwrap();
    assert_eq!(back.graph_pools, snapshot.graph_pools);
    ledger.deallocate(a).unwrap();
    let exec = raw.instantiate(graph);
    raw.destroy(graph, exec);
}
