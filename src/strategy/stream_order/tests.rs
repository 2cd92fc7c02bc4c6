//! The model-based test of [`StreamOrder`]: random frees, takes, polls and waits on three
//! streams (two foreign handles and [`Stream::PER_THREAD`]) over a host device whose events
//! are held in flight and which refuses records and synchronisations at random.
//!
//! The oracle is computed without the module: before every free the test launches a kernel
//! of its own (`work`) on the freeing stream over the chunk — the caller's work on that
//! memory — and a chunk the module returns for everyone must have its `work` complete in the
//! host's own books. A chunk taken by a request at once must have been freed on that
//! request's stream (never on the per-thread handle); one taken from another stream must
//! leave the request's stream ordered after the `work` (a GPU-side wait), as the host's own
//! timeline says. The module's invariants are checked after every step, and its books
//! against the model's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use proptest::prelude::*;

use super::*;
use crate::adaptor::{Call, Capability, DeviceWrapper};
use crate::backends::host::HostDevice;

/// The test's chunks carry no token.
type TestChunk = TokenChunk;

/// The model's fit rule: any pending chunk of at least `size` bytes, the smallest first.
fn fits(size: u64) -> impl FnMut(&TestChunk) -> Option<((u64, u64), ())> {
    move |c| (c.size >= size).then_some(((c.size, c.addr), ()))
}

/// Cuts `size` bytes from the front of the chunk taken; the rest stays pending.
fn carve_front(size: u64) -> impl FnOnce(TestChunk, ()) -> Option<(TestChunk, Vec<TestChunk>)> {
    move |c, ()| {
        let rest = (c.size > size).then_some(TestChunk {
            addr: c.addr + size,
            size: c.size - size,
            token: 0,
        });
        Some((c, rest.into_iter().collect()))
    }
}

/// A host device that refuses what the flags say.
#[derive(Debug)]
struct Flaky {
    host: HostDevice,
    refuse_record: AtomicBool,
    refuse_stream_sync: AtomicBool,
    refuse_event_sync: AtomicBool,
    refuse_device_sync: AtomicBool,
}

fn refused(call: &'static str) -> crate::Error {
    crate::Error::InvalidArgument {
        call,
        reason: "refused by the test".into(),
    }
}

impl DeviceWrapper for Flaky {
    type Inner = HostDevice;
    fn wrapped(&self) -> &HostDevice {
        &self.host
    }
    fn before(&self, call: &Call<'_>) -> Result<()> {
        let refusing = match call {
            Call::RecordEvent { .. } => &self.refuse_record,
            Call::SynchronizeStream(_) => &self.refuse_stream_sync,
            Call::SynchronizeEvent(_) => &self.refuse_event_sync,
            Call::SynchronizeDevice => &self.refuse_device_sync,
            _ => return Ok(()),
        };
        if refusing.load(Ordering::Relaxed) {
            return Err(refused(call.name()));
        }
        Ok(())
    }
    /// Only streams and events, as the module needs.
    fn offers(&self, _: Capability) -> bool {
        false
    }
}

#[derive(Debug, Clone)]
enum Op {
    Free { stream: usize, size: u64 },
    Take { stream: usize, size: u64 },
    TakeElsewhere { stream: usize, size: u64 },
    Poll,
    SyncAll,
    CompleteHeld,
    CallerSyncsStream(usize),
    Refuse { which: usize, on: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 1..8u64).prop_map(|(stream, size)| Op::Free { stream, size: size * 256 }),
        3 => (0..3usize, 1..8u64).prop_map(|(stream, size)| Op::Take { stream, size: size * 256 }),
        2 => (0..3usize, 1..8u64)
            .prop_map(|(stream, size)| Op::TakeElsewhere { stream, size: size * 256 }),
        2 => Just(Op::Poll),
        1 => Just(Op::SyncAll),
        1 => Just(Op::CompleteHeld),
        1 => (0..3usize).prop_map(Op::CallerSyncsStream),
        2 => (0..4usize, any::<bool>()).prop_map(|(which, on)| Op::Refuse { which, on }),
    ]
}

/// What the model knows of a pending chunk: its stream and the caller's work before it.
#[derive(Debug, Clone, Copy)]
struct Freed {
    stream: Stream,
    /// The kernel on `stream` over the chunk, launched before the free.
    work: u64,
    size: u64,
}

struct Harness {
    device: Flaky,
    order: StreamOrder<TestChunk>,
    model: BTreeMap<u64, Freed>,
    streams: [Stream; 3],
    next_addr: u64,
}

impl Harness {
    fn new() -> Harness {
        let device = Flaky {
            host: HostDevice::builder()
                .capacity(1 << 30)
                .simulated(true)
                .build()
                .unwrap(),
            refuse_record: AtomicBool::new(false),
            refuse_stream_sync: AtomicBool::new(false),
            refuse_event_sync: AtomicBool::new(false),
            refuse_device_sync: AtomicBool::new(false),
        };
        device.host.set_events_held(true);
        // Two handles the device never made (a caller's own streams) and the per-thread one.
        let streams = [
            Stream(0x7f00_0000_1000),
            Stream(0x7f00_0000_2000),
            Stream::PER_THREAD,
        ];
        let mut order = StreamOrder::default();
        order.see_stream(&device, streams[0]).unwrap();
        order.see_stream(&device, streams[1]).unwrap();
        assert!(order.is_multi());
        Harness {
            device,
            order,
            model: BTreeMap::new(),
            streams,
            next_addr: 1 << 20,
        }
    }

    /// A chunk the module returned for every stream: the caller's work on it must be done.
    fn released(&mut self, c: TestChunk) {
        let f = self
            .model
            .remove(&c.addr)
            .unwrap_or_else(|| panic!("released {c:?}, which is not pending"));
        assert_eq!(f.size, c.size, "released {c:?} with another size");
        assert_eq!(
            self.device.host.kernel_done(f.work),
            Some(true),
            "{c:?} returned for every stream while the work on {:?} before its free is in flight",
            f.stream
        );
    }

    fn step(&mut self, op: &Op) {
        let dev = &self.device;
        match *op {
            Op::Free { stream, size } => {
                let s = self.streams[stream];
                let c = TestChunk {
                    addr: self.next_addr,
                    size,
                    token: 0,
                };
                let work = dev.host.launch(s, c.addr, size);
                self.next_addr += size;
                self.model.insert(
                    c.addr,
                    Freed {
                        stream: s,
                        work,
                        size,
                    },
                );
                if let Some(now) = self.order.free(dev, s, c) {
                    self.released(now);
                }
            }
            Op::Take { stream, size } => {
                let s = self.streams[stream];
                if let Some(c) = self.order.take(dev, s, fits(size), carve_front(size)) {
                    let f = self.model.remove(&c.addr).expect("taken chunk was pending");
                    assert_eq!(f.stream, s, "{c:?} freed on {:?} handed to {s:?}", f.stream);
                    assert!(
                        !s.is_per_thread(),
                        "reused at once on the per-thread handle"
                    );
                    if c.size > size {
                        let rest = Freed {
                            size: c.size - size,
                            ..f
                        };
                        self.model.insert(c.addr + size, rest);
                    }
                }
            }
            Op::TakeElsewhere { stream, size } => {
                let s = self.streams[stream];
                if let Some(c) = self
                    .order
                    .take_elsewhere(dev, s, fits(size), carve_front(size))
                {
                    let f = self.model.remove(&c.addr).expect("taken chunk was pending");
                    assert!(
                        s.is_per_thread() || f.stream != s,
                        "take_elsewhere took {c:?} from the request's own stream"
                    );
                    assert_eq!(
                        dev.host.ordered(f.work, s),
                        Some(true),
                        "{c:?} freed on {:?} handed to {s:?} with no order after the work on it",
                        f.stream
                    );
                    if c.size > size {
                        let rest = Freed {
                            size: c.size - size,
                            ..f
                        };
                        self.model.insert(c.addr + size, rest);
                    }
                }
            }
            Op::Poll => {
                let mut out = Vec::new();
                self.order.poll(dev, |c| out.push(c));
                out.into_iter().for_each(|c| self.released(c));
            }
            Op::SyncAll => {
                let mut out = Vec::new();
                let waited = self.order.sync_all(dev, |c| out.push(c));
                let can_wait = !dev.refuse_device_sync.load(Ordering::Relaxed);
                out.into_iter().for_each(|c| self.released(c));
                if can_wait {
                    assert!(waited.is_ok(), "{waited:?}");
                    assert_eq!(self.order.count(), 0, "a device that syncs leaves nothing");
                }
            }
            Op::CompleteHeld => {
                dev.host.complete_held_events();
            }
            Op::CallerSyncsStream(i) => {
                dev.host.synchronize_stream(self.streams[i]).unwrap();
            }
            Op::Refuse { which, on } => {
                let flag = [
                    &dev.refuse_record,
                    &dev.refuse_stream_sync,
                    &dev.refuse_event_sync,
                    &dev.refuse_device_sync,
                ][which];
                flag.store(on, Ordering::Relaxed);
            }
        }
        self.check();
    }

    fn check(&self) {
        let model = &self.model;
        self.order
            .check(|c| model.get(&c.addr).is_some_and(|f| f.size == c.size))
            .unwrap_or_else(|e| panic!("invariant broken: {e}"));
        assert_eq!(self.order.count(), model.len(), "pending count");
        let bytes: u64 = model.values().map(|f| f.size).sum();
        assert_eq!(self.order.bytes(), bytes, "pending bytes");
        for (s, c) in self.order.iter() {
            assert_eq!(
                model[&c.addr].stream, s,
                "{c:?} pending on the wrong stream"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Whatever the device refuses, no chunk is returned for everyone before the caller's
    /// work on it is done, and with a device that synchronises again everything comes back.
    #[test]
    fn pending_frees_keep_the_contract(ops in proptest::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        for op in &ops {
            h.step(op);
        }
        for flag in [
            &h.device.refuse_record,
            &h.device.refuse_stream_sync,
            &h.device.refuse_event_sync,
            &h.device.refuse_device_sync,
        ] {
            flag.store(false, Ordering::Relaxed);
        }
        h.step(&Op::SyncAll);
        prop_assert_eq!(h.order.count(), 0);
        prop_assert!(h.model.is_empty());
    }
}

#[test]
fn the_switch_fences_the_first_stream_on_the_device_or_refuses() {
    let h = Harness::new();
    let dev = &h.device;
    let (s, t) = (Stream(0x5000), Stream(0x6000));
    let mut order: StreamOrder<TestChunk> = StreamOrder::default();
    order.see_stream(dev, s).unwrap();
    assert!(order.is_first(s) && !order.is_multi());
    // Memory freed at once on S while S's kernel still reads it.
    order.freed_at_once();
    dev.host.set_events_held(false);
    let kernel = dev.host.launch(s, 0x1000, 256);
    let (cpu_before, gpu_before) = dev.host.cpu_waits();
    // No event can be recorded and neither the stream nor the device can be waited for:
    // the second stream is refused.
    dev.refuse_record.store(true, Ordering::Relaxed);
    dev.refuse_stream_sync.store(true, Ordering::Relaxed);
    dev.refuse_device_sync.store(true, Ordering::Relaxed);
    assert!(order.see_stream(dev, t).is_err());
    assert!(
        !order.is_multi(),
        "not switched: the next request tries again"
    );
    // An event can be recorded: the switch fences S on the device — no CPU wait, the kernel
    // still runs — and T is ordered after the fence by a GPU-side wait before the free
    // lists serve it.
    dev.refuse_record.store(false, Ordering::Relaxed);
    order.see_stream(dev, t).unwrap();
    assert!(order.is_multi() && order.fence_active());
    assert_eq!(dev.host.kernel_done(kernel), Some(false));
    assert_eq!(dev.host.ordered(kernel, t), Some(false));
    order.order_after_fence(dev, t).unwrap();
    assert_eq!(
        dev.host.ordered(kernel, t),
        Some(true),
        "T waits for S's kernel"
    );
    assert_eq!(dev.host.kernel_done(kernel), Some(false));
    let (cpu, gpu) = dev.host.cpu_waits();
    assert_eq!(
        (cpu - cpu_before, gpu - gpu_before),
        (0, 1),
        "one GPU-side wait, no CPU wait"
    );
    // Again at every request while the fence is active, on T's handle and on the first
    // stream's too: a handle seen again may name a stream made since, which never waited.
    order.order_after_fence(dev, t).unwrap();
    order.order_after_fence(dev, s).unwrap();
    assert_eq!(dev.host.cpu_waits().1 - gpu_before, 3);
    // The kernel completes: so does the fence, which is forgotten.
    dev.host.finish(kernel);
    order.poll(dev, |_| {});
    assert!(!order.fence_active());
    order.check(|_| true).unwrap();
}

#[test]
fn the_per_thread_handle_is_never_reused_at_once() {
    let h = Harness::new();
    let dev = &h.device;
    let mut order: StreamOrder<TestChunk> = StreamOrder::default();
    order.see_stream(dev, Stream::PER_THREAD).unwrap();
    assert!(
        order.is_multi(),
        "one handle, many streams: multi from the start"
    );
    let c = TestChunk {
        addr: 4096,
        size: 256,
        token: 0,
    };
    assert!(order.free(dev, Stream::PER_THREAD, c).is_none());
    let fit = |c: &TestChunk| Some(((c.size, c.addr), ()));
    let got = order.take(dev, Stream::PER_THREAD, fit, |c, ()| Some((c, Vec::new())));
    assert_eq!(got, None);
    assert_eq!(order.count(), 1);
}

/// A request takes a free made on its own handle only behind a GPU-side wait for the free's
/// event (the handle may name a stream made since), and never one without an event.
#[test]
fn a_free_on_the_requests_handle_is_taken_behind_a_wait() {
    let h = Harness::new();
    let dev = &h.device;
    let s = h.streams[0];
    let mut order: StreamOrder<TestChunk> = StreamOrder::default();
    order.see_stream(dev, s).unwrap();
    order.see_stream(dev, h.streams[1]).unwrap();
    let chunk = |addr| TestChunk {
        addr,
        size: 256,
        token: 0,
    };
    let fit = |c: &TestChunk| Some(((c.size, c.addr), ()));
    let whole = |c, ()| Some((c, Vec::new()));
    // Neither an event nor any synchronisation: pending without an event.
    dev.refuse_record.store(true, Ordering::Relaxed);
    dev.refuse_stream_sync.store(true, Ordering::Relaxed);
    dev.refuse_device_sync.store(true, Ordering::Relaxed);
    assert!(order.free(dev, s, chunk(0x1000)).is_none());
    dev.refuse_record.store(false, Ordering::Relaxed);
    let gpu_before = dev.host.cpu_waits().1;
    assert_eq!(
        order.take(dev, s, fit, whole),
        None,
        "no event: nothing orders it"
    );
    assert_eq!(dev.host.cpu_waits().1, gpu_before);
    // With an event: taken at once on the CPU, behind one GPU-side wait.
    assert!(order.free(dev, s, chunk(0x2000)).is_none());
    assert_eq!(order.take(dev, s, fit, whole), Some(chunk(0x2000)));
    assert_eq!(dev.host.cpu_waits().1 - gpu_before, 1);
    order.check(|_| true).unwrap();
}

/// A free pending without an event is not returned when a later event on its handle
/// completes, nor when only its handle can be synchronised: the handle may name a stream
/// made since. A synchronisation of the device returns it.
#[test]
fn a_free_without_an_event_waits_for_the_device_not_its_handle() {
    let h = Harness::new();
    let dev = &h.device;
    let s = h.streams[0];
    let mut order: StreamOrder<TestChunk> = StreamOrder::default();
    order.see_stream(dev, s).unwrap();
    order.see_stream(dev, h.streams[1]).unwrap();
    let chunk = |addr| TestChunk {
        addr,
        size: 256,
        token: 0,
    };
    dev.refuse_record.store(true, Ordering::Relaxed);
    dev.refuse_stream_sync.store(true, Ordering::Relaxed);
    dev.refuse_device_sync.store(true, Ordering::Relaxed);
    assert!(order.free(dev, s, chunk(0x1000)).is_none());
    dev.refuse_record.store(false, Ordering::Relaxed);
    dev.refuse_stream_sync.store(false, Ordering::Relaxed);
    // A later free on the same handle, with an event that completes.
    assert!(order.free(dev, s, chunk(0x2000)).is_none());
    dev.host.complete_held_events();
    let mut out = Vec::new();
    order.poll(dev, |c| out.push(c));
    assert_eq!(
        out,
        [chunk(0x2000)],
        "only the free whose own event completed"
    );
    assert!(
        order.cpu_waits_pending().is_empty(),
        "nothing a CPU wait and a poll return"
    );
    // The handle can be synchronised, the device cannot: it stays.
    assert!(order.sync_all(dev, |c| out.push(c)).is_err());
    assert_eq!((out.len(), order.count()), (1, 1));
    order.check(|_| true).unwrap();
    dev.refuse_device_sync.store(false, Ordering::Relaxed);
    order.sync_all(dev, |c| out.push(c)).unwrap();
    assert_eq!(out, [chunk(0x2000), chunk(0x1000)]);
    assert_eq!(order.count(), 0);
    order.check(|_| true).unwrap();
}
