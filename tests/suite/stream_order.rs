//! The stream-ordering contract of `Device`: memory freed on stream S is reusable at once on
//! S, and on another stream T only after an event recorded at the free has completed. Tested
//! with the host device holding its events in flight (`set_events_held`), for bfc, the
//! host's stream-ordered pool, and the `async` strategy over it.

use std::sync::Arc;

use crate::support::common::{bfc, host_device};
use portalloc::adaptor::{Call, DeviceWrapper};
use portalloc::backends::host::{HostCensus, HostDevice};
use portalloc::strategy::async_pool::{AsyncOptions, AsyncPoolAllocator};
use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
use portalloc::{Allocator, Device, Stream};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use test_case::test_case;

const MIB: u64 = 1 << 20;

/// The device every test here runs on: 64 MiB, real or simulated.
fn device(simulated: bool) -> Arc<HostDevice> {
    host_device(64 * MIB, simulated)
}

/// [`device`] with two streams of its own, S and T.
fn device_with_two_streams(simulated: bool) -> (Arc<HostDevice>, Stream, Stream) {
    let d = device(simulated);
    let (s, t) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    (d, s, t)
}

/// Everything went back to `d`: no memory, no events; only the test's `streams` are left.
fn assert_all_returned(d: &HostDevice, streams: u64) {
    assert_eq!(
        d.census(),
        HostCensus {
            streams,
            ..HostCensus::default()
        }
    );
}

fn check(a: &dyn Allocator) {
    a.check_invariants()
        .unwrap_or_else(|e| panic!("invariant broken: {e}"));
}

/// After a warm-up on S alone (so that T finds free memory without waiting for S), with
/// events held: memory freed on S is S's at once, T's only after the event recorded at the
/// free completed (then T gets it: the smallest fit, at the lowest address); at the end
/// everything, events included, goes back to the device.
fn cross_stream_reuse_waits_for_the_event<A: Allocator>(
    d: &HostDevice,
    (s, t): (portalloc::Stream, portalloc::Stream),
    a: A,
    pending_frees: fn(&A) -> (usize, u64),
) {
    d.set_events_held(true);

    let first = a.allocate(MIB, 0, s, "a").unwrap();
    let keep = a.allocate(MIB, 0, t, "b").unwrap();
    let freed = first.ptr();
    a.deallocate(first).unwrap();
    assert_eq!(pending_frees(&a), (1, MIB), "freed on S while T is in use");
    assert_eq!(a.stats().bytes_in_use, MIB, "a pending free is not in use");
    check(&a);

    let on_t = a.allocate(MIB, 0, t, "t").unwrap();
    assert_ne!(
        on_t.ptr(),
        freed,
        "T may not have it while the event is pending"
    );
    let on_s = a.allocate(MIB, 0, s, "s").unwrap();
    assert_eq!(on_s.ptr(), freed, "S may, at once");
    assert_eq!(pending_frees(&a), (0, 0));
    check(&a);

    a.deallocate(on_s).unwrap();
    let still = a.allocate(MIB, 0, t, "t").unwrap();
    assert_ne!(still.ptr(), freed, "still pending");
    check(&a);

    assert!(d.complete_held_events() >= 1);
    let after = a.allocate(MIB, 0, t, "t").unwrap();
    assert_eq!(after.ptr(), freed, "the event completed: T gets it");
    assert_eq!(pending_frees(&a), (0, 0));
    check(&a);

    for x in [on_t, still, after, keep] {
        a.deallocate(x).unwrap();
    }
    d.set_events_held(false);
    a.trim().unwrap();
    drop(a);
    assert_all_returned(d, 2);
}

#[test_case(true, false ; "bfc preallocated real")]
#[test_case(true, true ; "bfc preallocated simulated")]
#[test_case(false, false ; "bfc growing real")]
#[test_case(false, true ; "bfc growing simulated")]
fn bfc_cross_stream_reuse_waits_for_the_event(preallocate: bool, simulated: bool) {
    let (d, s, t) = device_with_two_streams(simulated);
    let a = bfc(&d, 32 * MIB, preallocate);
    // Warm up on S alone (a growing pool takes an 8 MiB region), so that T below finds free
    // memory without waiting for S.
    let warm = a.allocate(8 * MIB, 0, s, "warm").unwrap();
    a.deallocate(warm).unwrap();
    cross_stream_reuse_waits_for_the_event(&d, (s, t), a, BfcAllocator::pending_frees);
}

#[test_case(false ; "real")]
#[test_case(true ; "simulated")]
fn bfc_synchronizes_pending_frees_rather_than_fail(simulated: bool) {
    let (d, s, t) = device_with_two_streams(simulated);
    // One preallocated region of 4 MiB, filled with four 1 MiB chunks.
    let a = bfc(&d, 4 * MIB, true);
    d.set_events_held(true);
    let on_s = a.allocate(MIB, 0, s, "s").unwrap();
    let mut keep: Vec<_> = (0..3)
        .map(|_| a.allocate(MIB, 0, t, "t").unwrap())
        .collect();
    let freed = on_s.ptr();
    a.deallocate(on_s).unwrap();
    assert_eq!(a.pending_frees(), (1, MIB));
    // Nothing is free for T and the region cannot grow: wait for S's event instead.
    let x = a.allocate(MIB, 0, t, "t").unwrap();
    assert_eq!(x.ptr(), freed);
    assert_eq!(a.pending_frees(), (0, 0));
    check(&a);
    keep.push(x);
    for x in keep {
        a.deallocate(x).unwrap();
    }
    d.set_events_held(false);
    drop(a);
    assert_all_returned(&d, 2);
}

/// The switch to multi-stream mode with live allocations (the single-stream path keeps no
/// per-chunk books beyond the arena, so the switch must start them from the arena): several
/// chunks live on A, some freed on A before the switch; the first request on B switches; then
/// A's chunks freed on A in allocation order stay pending (B is never handed them while
/// their events are held; A reuses its own at once, whole), a forged copy of a pending or
/// freed allocation is refused, and everything goes back once the events complete. The
/// invariants are checked after every step. On real and simulated host memory.
#[test_case(true ; "preallocated")]
#[test_case(false ; "growing")]
fn bfc_switches_to_several_streams_with_live_allocations(preallocate: bool) {
    for simulated in [false, true] {
        switch_with_live_allocations(preallocate, simulated);
    }
}

/// The body of [`bfc_switches_to_several_streams_with_live_allocations`].
fn switch_with_live_allocations(preallocate: bool, simulated: bool) {
    let (d, s, t) = device_with_two_streams(simulated);
    let a = bfc(&d, 32 * MIB, preallocate);
    let sizes = [
        4096,
        64 * 1024,
        256,
        300 * 1024,
        4096,
        1024,
        128 * 1024,
        4096,
    ];
    let mut on_s: Vec<_> = sizes
        .iter()
        .map(|&size| {
            let x = a.allocate(size, 0, s, "a").unwrap();
            check(&a);
            x
        })
        .collect();
    // Holes freed on the single-stream path, straight back to the bins.
    for i in [5, 2] {
        a.deallocate(on_s.remove(i)).unwrap();
        check(&a);
    }
    assert_eq!((a.live_count(), a.pending_frees()), (6, (0, 0)));
    assert_eq!(d.census().events, 0, "no event before the switch");

    d.set_events_held(true);
    let first_on_t = a.allocate(4096, 0, t, "b").unwrap();
    check(&a);
    assert_eq!((a.live_count(), a.pending_frees()), (7, (0, 0)));

    // A's allocations freed on A, in the order they were made: each stays pending.
    let freed: Vec<(u64, u64, u64)> = on_s
        .iter()
        .map(|x| (x.ptr(), x.size(), x.token()))
        .collect();
    let mut pending_bytes = 0;
    for (n, x) in on_s.drain(..).enumerate() {
        pending_bytes += x.size().div_ceil(256) * 256;
        a.deallocate(x).unwrap();
        check(&a);
        assert_eq!(a.pending_frees(), (n + 1, pending_bytes));
        assert_eq!(a.live_count(), 7 - (n + 1));
    }
    // Neither a pending chunk nor a stale copy of one can be freed again.
    for &(ptr, size, token) in &freed {
        let forged = portalloc::Allocation::new(ptr, size, s, a.id(), token);
        assert!(a.deallocate(forged).is_err(), "{ptr:#x} freed twice");
        check(&a);
    }

    // B is not handed memory pending on A while A's events are held.
    let on_t: Vec<_> = freed
        .iter()
        .map(|&(_, size, _)| {
            let y = a.allocate(size, 0, t, "b").unwrap();
            check(&a);
            for &(ptr, size, _) in &freed {
                assert!(
                    y.ptr() + y.size() <= ptr || ptr + size <= y.ptr(),
                    "{:#x} on T overlaps {ptr:#x} pending on S",
                    y.ptr()
                );
            }
            y
        })
        .collect();
    assert_eq!(a.pending_frees().0, freed.len());

    // A reuses its own pending chunk at once: the 4 KiB ones, lowest address first.
    let again = a.allocate(4096, 0, s, "a").unwrap();
    check(&a);
    let lowest_4k = freed
        .iter()
        .filter(|f| f.1 == 4096)
        .map(|f| f.0)
        .min()
        .unwrap();
    assert_eq!(again.ptr(), lowest_4k);
    assert_eq!(a.pending_frees().0, freed.len() - 1);

    // Once the events complete, the next request returns the pending chunks to the bins.
    assert!(d.complete_held_events() > 0);
    let after = a.allocate(256, 0, t, "b").unwrap();
    check(&a);
    assert_eq!(a.pending_frees(), (0, 0));

    d.set_events_held(false);
    for x in on_t.into_iter().chain([first_on_t, again, after]) {
        a.deallocate(x).unwrap();
        check(&a);
    }
    assert_eq!(a.live_count(), 0);
    a.trim().unwrap();
    assert_eq!(a.pending_frees(), (0, 0));
    drop(a);
    assert_all_returned(&d, 2);
}

#[test_case(false ; "real")]
#[test_case(true ; "simulated")]
fn bfc_on_one_stream_makes_no_events(simulated: bool) {
    let d = device(simulated);
    let s = d.create_stream().unwrap();
    let a = bfc(&d, 32 * MIB, false);
    d.set_events_held(true);
    let xs: Vec<_> = (1..=8)
        .map(|i| a.allocate(i * 4096, 0, s, "x").unwrap())
        .collect();
    let first = xs[0].ptr();
    for x in xs {
        a.deallocate(x).unwrap();
    }
    assert_eq!(a.pending_frees(), (0, 0));
    assert_eq!(d.census().events, 0);
    // Reused at once: freed chunks coalesced back into the bins.
    let y = a.allocate(4096, 0, s, "y").unwrap();
    assert_eq!(y.ptr(), first);
    a.deallocate(y).unwrap();
    check(&a);
}

#[test_case(false ; "real")]
#[test_case(true ; "simulated")]
fn bfc_events_come_from_a_small_pool(simulated: bool) {
    let (d, s, t) = device_with_two_streams(simulated);
    let a = bfc(&d, 32 * MIB, true);
    let on_t = a.allocate(256, 0, t, "t").unwrap();
    for _ in 0..1000 {
        let x = a.allocate(4096, 0, s, "x").unwrap();
        a.deallocate(x).unwrap();
    }
    let events = d.census().events;
    assert!(
        (1..=portalloc::strategy::bfc::EVENT_POOL as u64 + 1).contains(&events),
        "{events} events for 1000 frees"
    );
    a.deallocate(on_t).unwrap();
    drop(a);
    assert_eq!(d.census().events, 0, "events destroyed with the allocator");
}

#[test_case(false ; "real")]
#[test_case(true ; "simulated")]
fn host_pool_cross_stream_reuse_waits_for_the_event(simulated: bool) {
    let (d, s, t) = device_with_two_streams(simulated);
    let pool = d.stream_ordered_pool().expect("the host has a pool");
    d.set_events_held(true);

    let p = pool.alloc_async(MIB, s).unwrap();
    pool.free_async(p, s).unwrap();
    let on_t = pool.alloc_async(MIB, t).unwrap();
    assert_ne!(on_t, p, "pending on S: not for T");
    let on_s = pool.alloc_async(MIB, s).unwrap();
    assert_eq!(on_s, p, "S reuses its own free at once");
    pool.free_async(on_s, s).unwrap();
    let still = pool.alloc_async(MIB, t).unwrap();
    assert_ne!(still, p);

    d.complete_held_events();
    let after: Vec<u64> = (0..2).map(|_| pool.alloc_async(MIB, t).unwrap()).collect();
    assert!(after.contains(&p), "{after:x?} does not reuse {p:#x}");
    for x in [on_t, still].into_iter().chain(after) {
        pool.free_async(x, t).unwrap();
    }
    d.set_events_held(false);
    pool.trim_to(0).unwrap();
    assert_eq!(pool.usage().unwrap().reserved_current, 0);
    assert_all_returned(&d, 2);
}

#[test_case(false ; "real")]
#[test_case(true ; "simulated")]
fn host_pool_synchronizing_the_stream_completes_its_frees(simulated: bool) {
    let (d, s, t) = device_with_two_streams(simulated);
    let pool = d.stream_ordered_pool().unwrap();
    pool.set_release_threshold(64 * MIB).unwrap();
    d.set_events_held(true);
    let p = pool.alloc_async(2 * MIB, s).unwrap();
    pool.free_async(p, s).unwrap();
    // Synchronising T does nothing for S's free.
    d.synchronize_stream(t).unwrap();
    let x = pool.alloc_async(2 * MIB, t).unwrap();
    assert_ne!(x, p);
    pool.free_async(x, t).unwrap();
    // Synchronising S completes it: the whole 2 MiB segment is T's now.
    d.synchronize_stream(s).unwrap();
    let y = pool.alloc_async(2 * MIB, t).unwrap();
    let z = pool.alloc_async(2 * MIB, t).unwrap();
    assert!([y, z].contains(&p));
    pool.free_async(y, t).unwrap();
    pool.free_async(z, t).unwrap();
    d.set_events_held(false);
    pool.trim_to(0).unwrap();
    assert_all_returned(&d, 2);
}

#[test_case(false ; "real")]
#[test_case(true ; "simulated")]
fn async_strategy_cross_stream_reuse_waits_for_the_event(simulated: bool) {
    let (d, s, t) = device_with_two_streams(simulated);
    let a = AsyncPoolAllocator::new(Arc::clone(&d), AsyncOptions::new(32 * MIB)).unwrap();
    d.set_events_held(true);

    let x = a.allocate(MIB, 0, s, "x").unwrap();
    let freed = x.ptr();
    a.deallocate(x).unwrap();
    let on_t = a.allocate(MIB, 0, t, "t").unwrap();
    assert_ne!(on_t.ptr(), freed);
    let on_s = a.allocate(MIB, 0, s, "s").unwrap();
    assert_eq!(on_s.ptr(), freed);
    a.deallocate(on_s).unwrap();
    check(&a);

    d.complete_held_events();
    let after: Vec<_> = (0..2)
        .map(|_| a.allocate(MIB, 0, t, "t").unwrap())
        .collect();
    assert!(after.iter().any(|x| x.ptr() == freed));
    check(&a);
    for x in after.into_iter().chain([on_t]) {
        a.deallocate(x).unwrap();
    }
    d.set_events_held(false);
    drop(a);
    assert_all_returned(&d, 2);
}

/// A device that reports which events were recorded and what was waited for, so that a
/// test knows when the allocator may legitimately hand memory to another stream.
#[derive(Debug)]
struct Watch {
    inner: Arc<HostDevice>,
    seen: std::sync::Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    recorded: Vec<(portalloc::device::Event, portalloc::Stream)>,
    /// GPU-side waits: (the stream that waits, the event it waits for).
    waits: Vec<(portalloc::Stream, portalloc::device::Event)>,
    synced_events: Vec<portalloc::device::Event>,
    synced_streams: Vec<portalloc::Stream>,
    synced_device: bool,
}

impl Watch {
    fn seen(&self) -> Seen {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

impl DeviceWrapper for Watch {
    type Inner = HostDevice;
    fn wrapped(&self) -> &HostDevice {
        &self.inner
    }
    fn before(&self, call: &Call<'_>) -> portalloc::Result<()> {
        let mut seen = self.seen.lock().unwrap();
        match *call {
            Call::SynchronizeStream(stream) => seen.synced_streams.push(stream),
            Call::SynchronizeDevice => seen.synced_device = true,
            Call::RecordEvent { event, stream } => seen.recorded.push((event, stream)),
            Call::SynchronizeEvent(event) => seen.synced_events.push(event),
            Call::WaitEvent { stream, event } => seen.waits.push((stream, event)),
            _ => {}
        }
        Ok(())
    }
}

/// A range freed while events were held: `(start, end, stream it was freed on, the number
/// of the first event record that came after the free)`.
type Unsafe = (u64, u64, portalloc::Stream, u64);

/// Every event record the allocator made, in order, numbered: an event recorded on a range's
/// stream after its free (the free's own event, or a fence) covers the work before the free.
#[derive(Default)]
struct Records {
    list: Vec<(portalloc::device::Event, portalloc::Stream)>,
}

impl Records {
    /// The newest record of `e`: its stream and number.
    fn latest(&self, e: portalloc::device::Event) -> Option<(portalloc::Stream, u64)> {
        self.list
            .iter()
            .rposition(|&(x, _)| x == e)
            .map(|i| (self.list[i].1, i as u64))
    }
}

/// Takes what the device saw since the last call: records them, forgets the ranges the
/// allocator waited for on the CPU (or whose covering event completed by itself), and
/// returns the GPU-side waits it enqueued (stream, the record waited for).
fn settle(
    w: &Watch,
    records: &mut Records,
    unsafe_ranges: &mut Vec<Unsafe>,
) -> Vec<(portalloc::Stream, Option<(portalloc::Stream, u64)>)> {
    let seen = w.seen();
    records.list.extend(seen.recorded.iter().copied());
    let covering_done = |r: &Unsafe| {
        records.list.iter().enumerate().any(|(n, &(e, stream))| {
            stream == r.2
                && n as u64 >= r.3
                && records.latest(e) == Some((stream, n as u64))
                && (seen.synced_events.contains(&e)
                    || matches!(w.inner.event_complete(e), Ok(true)))
        })
    };
    unsafe_ranges.retain(|r| {
        !covering_done(r) && !seen.synced_device && !seen.synced_streams.contains(&r.2)
    });
    seen.waits
        .iter()
        .map(|&(s, e)| (s, records.latest(e)))
        .collect()
}

/// Random traffic on three streams of `host`, through `a` over `w`, with events held and
/// completed at random: live allocations never overlap, no stream is handed memory freed on
/// another unless it was told to wait (on the device) for an event recorded on that stream
/// after the free, or the event completed, or the allocator waited for it on the CPU; a
/// stream does reuse its own pending frees, the device never holds more than the
/// allocator's 16 MiB budget, running out of it is a typed out-of-memory error, and at the
/// end everything (memory and events) goes back to the device.
fn random_multi_stream_traffic<A: Allocator>(
    host: &HostDevice,
    w: &Watch,
    a: A,
    pending_frees: fn(&A) -> (usize, u64),
    seed: u64,
    draw_size: fn(&mut SmallRng) -> u64,
) {
    let streams: Vec<_> = (0..3).map(|_| host.create_stream().unwrap()).collect();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut live: Vec<portalloc::Allocation> = Vec::new();
    let mut unsafe_ranges: Vec<Unsafe> = Vec::new();
    let mut records = Records::default();
    let mut reused_pending = 0;
    host.set_events_held(true);
    for step in 0..3000 {
        match rng.gen_range(0..100) {
            0..=54 => {
                let s = streams[rng.gen_range(0..3)];
                let size = draw_size(&mut rng);
                let result = a.allocate(size, 0, s, "x");
                let waits = settle(w, &mut records, &mut unsafe_ranges);
                match result {
                    Ok(x) => {
                        let (start, end) = (x.ptr(), x.ptr() + x.size());
                        for r in &unsafe_ranges {
                            let &(us, ue, owner, after) = r;
                            let overlaps = start < ue && us < end;
                            let behind_a_wait = waits.iter().any(|&(waiter, record)| {
                                waiter == s
                                    && record.is_some_and(|(on, n)| on == owner && n >= after)
                            });
                            assert!(
                                owner == s || behind_a_wait || !overlaps,
                                "step {step}: {start:#x}..{end:#x} on {s:?} overlaps memory \
                                 pending on {owner:?}, and {s:?} was not told to wait for it"
                            );
                            reused_pending += usize::from(overlaps);
                        }
                        // Now this allocation's (checked above): a later free makes a new
                        // entry.
                        unsafe_ranges.retain(|&(us, ue, _, _)| end <= us || ue <= start);
                        for y in &live {
                            assert!(end <= y.ptr() || y.ptr() + y.size() <= start, "overlap");
                        }
                        live.push(x);
                    }
                    Err(e) => assert!(e.is_out_of_memory(), "step {step}: {e}"),
                }
            }
            55..=94 if !live.is_empty() => {
                let x = live.swap_remove(rng.gen_range(0..live.len()));
                let (start, end, s) = (x.ptr(), x.ptr() + x.size(), x.stream());
                settle(w, &mut records, &mut unsafe_ranges);
                let after = records.list.len() as u64;
                a.deallocate(x).unwrap();
                settle(w, &mut records, &mut unsafe_ranges);
                unsafe_ranges.push((start, end, s, after));
            }
            _ => {
                host.complete_held_events();
                unsafe_ranges.clear();
            }
        }
        if step % 50 == 0 {
            check(&a);
        }
        assert!(host.census().bytes_in_use <= 16 * MIB);
    }
    assert!(reused_pending > 0, "no stream reused its own pending free");
    for x in live {
        a.deallocate(x).unwrap();
    }
    check(&a);
    assert_eq!(a.stats().bytes_in_use, 0);
    host.set_events_held(false);
    a.trim().unwrap();
    assert_eq!(pending_frees(&a), (0, 0));
    drop(a);
    assert_all_returned(host, 3);
}

/// Sizes up to 256 KiB.
fn small_size(rng: &mut SmallRng) -> u64 {
    rng.gen_range(1..=256 * 1024)
}

/// Sizes up to 256 KiB, and one in five of 2 to 5 MiB (more than a vmm granule).
fn mostly_small_size(rng: &mut SmallRng) -> u64 {
    if rng.gen_bool(0.8) {
        small_size(rng)
    } else {
        rng.gen_range(2 * MIB..=5 * MIB)
    }
}

/// [`random_multi_stream_traffic`] through bfc.
#[test_case(true, 1 ; "bfc preallocated, seed 1")]
#[test_case(false, 2 ; "bfc growing, seed 2")]
#[test_case(true, 3 ; "bfc preallocated, seed 3")]
#[test_case(false, 4 ; "bfc growing, seed 4")]
fn bfc_random_multi_stream_traffic_keeps_the_contract(preallocate: bool, seed: u64) {
    let host = device(true);
    let w = Arc::new(Watch {
        inner: Arc::clone(&host),
        seen: Default::default(),
    });
    let a = BfcAllocator::new(
        Arc::clone(&w),
        BfcOptions {
            limit: 16 * MIB,
            preallocate,
        },
    )
    .unwrap();
    random_multi_stream_traffic(&host, &w, a, BfcAllocator::pending_frees, seed, small_size);
}

/// Random traffic on the host pool with events held: no stream is handed memory freed on
/// another stream until the held events complete or that stream is synchronised; the
/// counters follow; the release threshold holds at each synchronisation.
#[test_case(1 ; "seed 1")]
#[test_case(2 ; "seed 2")]
#[test_case(3 ; "seed 3")]
fn host_pool_random_traffic_keeps_the_contract(seed: u64) {
    let d = device(true);
    let streams: Vec<_> = (0..3).map(|_| d.create_stream().unwrap()).collect();
    let pool = d.stream_ordered_pool().unwrap();
    pool.set_release_threshold(8 * MIB).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut live: Vec<(u64, u64, portalloc::Stream)> = Vec::new();
    let mut unsafe_ranges: Vec<(u64, u64, portalloc::Stream)> = Vec::new();
    d.set_events_held(true);
    for step in 0..3000 {
        match rng.gen_range(0..100) {
            0..=54 => {
                let s = streams[rng.gen_range(0..3)];
                let size = rng.gen_range(1..=512 * 1024u64);
                let Ok(p) = pool.alloc_async(size, s) else {
                    continue;
                };
                let end = p + size.next_multiple_of(256);
                for &(us, ue, owner) in &unsafe_ranges {
                    assert!(
                        owner == s || end <= us || ue <= p,
                        "step {step}: {p:#x}..{end:#x} on {s:?} overlaps memory pending on \
                         {owner:?}"
                    );
                }
                unsafe_ranges.retain(|&(us, ue, owner)| owner != s || end <= us || ue <= p);
                for &(q, qe, _) in &live {
                    assert!(end <= q || qe <= p, "overlap");
                }
                live.push((p, end, s));
            }
            55..=89 if !live.is_empty() => {
                let (p, end, s) = live.swap_remove(rng.gen_range(0..live.len()));
                pool.free_async(p, s).unwrap();
                unsafe_ranges.push((p, end, s));
            }
            90..=94 => {
                let s = streams[rng.gen_range(0..3)];
                d.synchronize_stream(s).unwrap();
                unsafe_ranges.retain(|&(_, _, owner)| owner != s);
                // The synchronisation released every idle segment above the threshold: a trim
                // to the threshold finds nothing more.
                let before = pool.usage().unwrap().reserved_current;
                pool.trim_to(8 * MIB).unwrap();
                assert_eq!(
                    pool.usage().unwrap().reserved_current,
                    before,
                    "step {step}"
                );
            }
            _ => {
                d.complete_held_events();
                unsafe_ranges.clear();
            }
        }
        let u = pool.usage().unwrap();
        let used: u64 = live.iter().map(|&(p, e, _)| e - p).sum();
        assert_eq!(u.used_current, used);
        assert!(u.reserved_current >= used && u.reserved_high >= u.reserved_current);
        assert_eq!(d.census().bytes_in_use, u.reserved_current);
    }
    for (p, _, s) in live {
        pool.free_async(p, s).unwrap();
    }
    d.set_events_held(false);
    pool.trim_to(0).unwrap();
    assert_eq!(pool.usage().unwrap().reserved_current, 0);
    assert_eq!(d.census().bytes_in_use, 0);
}

#[test]
fn pool_memory_cannot_be_freed_as_a_plain_allocation() {
    let d = device(true);
    let pool = d.stream_ordered_pool().unwrap();
    let p = pool.alloc_async(MIB, portalloc::Stream::DEFAULT).unwrap();
    assert!(matches!(
        d.free(p, 2 * MIB),
        Err(portalloc::Error::UnknownPointer { .. })
    ));
    assert!(matches!(
        pool.free_async(p + 256, portalloc::Stream::DEFAULT),
        Err(portalloc::Error::UnknownPointer { .. })
    ));
    pool.free_async(p, portalloc::Stream::DEFAULT).unwrap();
    assert!(
        pool.free_async(p, portalloc::Stream::DEFAULT).is_err(),
        "double free"
    );
    d.synchronize_stream(portalloc::Stream::DEFAULT).unwrap();
    assert_eq!(
        d.census().bytes_in_use,
        0,
        "threshold 0: returned at the sync"
    );
}

// ---- vmm ----

use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};

#[test_case(false ; "vmm real")]
#[test_case(true ; "vmm simulated")]
fn vmm_cross_stream_reuse_waits_for_the_event(simulated: bool) {
    let (d, s, t) = device_with_two_streams(simulated);
    let a = VmmAllocator::new(Arc::clone(&d), VmmOptions::new(32 * MIB)).unwrap();
    // Warm up on S alone (8 MiB of low granules mapped), so that T below finds mapped free
    // memory without waiting for S: vmm waits for pending frees before mapping more.
    let warm: Vec<_> = (0..8)
        .map(|_| a.allocate(MIB, 0, s, "warm").unwrap())
        .collect();
    for x in warm {
        a.deallocate(x).unwrap();
    }
    cross_stream_reuse_waits_for_the_event(&d, (s, t), a, VmmAllocator::pending_frees);
}

/// [`Watch`] under the name vmm's test builds it by: every call, the virtual memory's
/// included, goes through the [`Watch`] inside.
#[derive(Debug)]
struct WatchVm(Watch);

impl DeviceWrapper for WatchVm {
    type Inner = Watch;
    fn wrapped(&self) -> &Watch {
        &self.0
    }
}

/// [`random_multi_stream_traffic`] through vmm, with sizes beyond a granule too.
#[test_case(1 ; "vmm, seed 1")]
#[test_case(2 ; "vmm, seed 2")]
#[test_case(3 ; "vmm, seed 3")]
fn vmm_random_multi_stream_traffic_keeps_the_contract(seed: u64) {
    let host = device(true);
    let w = Arc::new(WatchVm(Watch {
        inner: Arc::clone(&host),
        seen: Default::default(),
    }));
    let a = VmmAllocator::new(Arc::clone(&w), VmmOptions::new(16 * MIB)).unwrap();
    random_multi_stream_traffic(
        &host,
        &w.0,
        a,
        VmmAllocator::pending_frees,
        seed,
        mostly_small_size,
    );
}

// ---- a stream handle seen again ----

#[cfg(feature = "hip")]
use crate::support::targets::Rocm;
#[cfg(any(feature = "cuda", feature = "hip"))]
use crate::support::targets::{Strategy, SuiteStrategy, Target};

/// What serves the request on T′ in [`a_reused_stream_handle_is_ordered_again`].
#[cfg(any(feature = "cuda", feature = "hip"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    /// The free lists, behind the fence on S (1 MiB: more than T's pending free).
    FreeLists,
    /// The free T made before it was destroyed, pending on the handle T′ now has (256 B).
    PendingOnTheHandle,
}

/// Drivers hand a destroyed stream's handle value to the next stream made (the fakes too):
/// nothing portalloc remembers about a handle orders the stream it names now. X is freed on
/// S alone (at once, no event) while the caller's kernel still reads it; T's first request
/// waits for the fence on S and T frees 256 B on T; T is destroyed with the driver's own call
/// and T′, made with it, gets T's handle value. T′ is then handed memory under X — from the
/// free lists, or T's pending free — only ordered after the kernel by a GPU-side wait of its
/// own (the fake's timeline says), and nothing is freed or unmapped under the kernel.
#[cfg(any(feature = "cuda", feature = "hip"))]
#[test_case(Target::FakeCuda, Strategy::Bfc, Served::FreeLists ; "cuda bfc free lists")]
#[test_case(Target::FakeCuda, Strategy::BfcGrow, Served::FreeLists ; "cuda growing bfc free lists")]
#[test_case(Target::FakeCuda, Strategy::Vmm, Served::FreeLists ; "cuda vmm free lists")]
#[test_case(Target::FakeCuda, Strategy::Bfc, Served::PendingOnTheHandle ; "cuda bfc pending")]
#[test_case(Target::FakeCuda, Strategy::BfcGrow, Served::PendingOnTheHandle ; "cuda growing bfc pending")]
#[test_case(Target::FakeCuda, Strategy::Vmm, Served::PendingOnTheHandle ; "cuda vmm pending")]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7), Strategy::Bfc, Served::FreeLists ; "hip bfc free lists"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7), Strategy::BfcGrow, Served::FreeLists ; "hip growing bfc free lists"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7), Strategy::Vmm, Served::FreeLists ; "hip vmm free lists"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7), Strategy::Bfc, Served::PendingOnTheHandle ; "hip bfc pending"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7), Strategy::BfcGrow, Served::PendingOnTheHandle ; "hip growing bfc pending"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7), Strategy::Vmm, Served::PendingOnTheHandle ; "hip vmm pending"))]
fn a_reused_stream_handle_is_ordered_again(target: Target, strategy: Strategy, served: Served) {
    let Some(rig) = target.open(1, 64 * MIB) else {
        return;
    };
    let a = strategy.build_as_configured(rig.device(0)).unwrap();
    let overlaps =
        |y: &portalloc::Allocation, (lo, hi): (u64, u64)| y.ptr() < hi && lo < y.ptr() + y.size();

    let s = rig.foreign_stream();
    let x = a.allocate(MIB, 0, s, "x").unwrap();
    let under_x = (x.ptr(), x.ptr() + MIB);
    let kernel = rig.launch(s, x.ptr(), MIB);
    a.deallocate(x).unwrap();

    let t = rig.foreign_stream();
    let on_t = a.allocate(256, 0, t, "t").unwrap();
    assert!(
        overlaps(&on_t, under_x) && rig.ordered(kernel, t),
        "{strategy:?}: T is handed memory under X behind the fence"
    );
    a.deallocate(on_t).unwrap();
    rig.destroy_foreign(&[t]);
    let t2 = rig.foreign_stream();
    assert_eq!(t2, t, "the driver hands T's handle value to T′");
    assert!(
        !rig.ordered(kernel, t2),
        "T′ is a new stream: nothing orders it yet"
    );

    let (_, gpu_before) = rig.waits();
    let size = match served {
        Served::FreeLists => MIB,
        Served::PendingOnTheHandle => 256,
    };
    let y = a.allocate(size, 0, t2, "t2").unwrap();
    let (_, gpu_after) = rig.waits();
    assert!(
        overlaps(&y, under_x),
        "{strategy:?}: the case needs T′ handed memory under X ({:#x}+{})",
        y.ptr(),
        y.size()
    );
    assert!(
        rig.ordered(kernel, t2),
        "{strategy:?}: {:#x}+{} handed to T′ (T's old handle) while S's kernel still reads \
         it, and nothing orders T′ after it ({} GPU-side waits)",
        y.ptr(),
        y.size(),
        gpu_after - gpu_before
    );
    assert!(
        gpu_after > gpu_before,
        "{strategy:?}: ordered by a GPU-side wait"
    );
    assert!(!rig.work_done(kernel), "{strategy:?}: not by a CPU wait");
    a.check_invariants().unwrap();

    a.deallocate(y).unwrap();
    rig.finish_work(kernel);
    a.trim().unwrap();
    drop(a);
    rig.destroy_foreign(&[s, t2]);
    // No hazard: nothing freed or unmapped under the kernel.
    rig.finish();
}
