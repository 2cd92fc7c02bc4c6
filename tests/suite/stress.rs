//! Concurrency: 8 threads doing mixed allocate/free on one allocator of each strategy, for a
//! bounded number of operations; then the invariants and the totals are checked.
//!
//! While the threads run, every allocation handed out is entered into one shared map of
//! live ranges (and taken out *before* it is handed back), so memory handed to two threads at
//! once is caught at the moment it happens. Each thread works on its own stream, so the
//! stream-ordered paths (bfc's pending frees, the async pool) are exercised too.
//!
//! There is no lock-free structure in portalloc to model with loom: every allocator keeps
//! its books behind one `Mutex`, and the only atomics are id counters (`fetch_add`) and
//! statistics counters (`Relaxed` loads and adds). `allocators_are_send_and_sync` asserts at
//! compile time that every allocator, adaptor and device is `Send + Sync`.
#![cfg(feature = "trace")]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;

use crate::support::common::{simulated_host, Rng, Strategy};
use portalloc::adaptor::{CountingDevice, LedgerAllocator, RecorderAllocator};
use portalloc::backends::host::HostDevice;
use portalloc::device::{Device, Stream};
use portalloc::strategy::async_pool::AsyncPoolAllocator;
use portalloc::strategy::bfc::BfcAllocator;
use portalloc::strategy::platform::PlatformAllocator;
use portalloc::strategy::vmm::VmmAllocator;
use portalloc::{Allocation, Allocator, Portalloc};
use test_case::test_case;

const MIB: u64 = 1 << 20;
const THREADS: usize = 8;
const OPS_PER_THREAD: usize = 20_000;
const CAPACITY: u64 = 1 << 30;
const LIMIT: u64 = CAPACITY / 4 * 3;

fn assert_send_sync<T: Send + Sync + ?Sized>() {}

#[test]
fn allocators_are_send_and_sync() {
    assert_send_sync::<BfcAllocator<HostDevice>>();
    assert_send_sync::<BfcAllocator<dyn Device>>();
    assert_send_sync::<PlatformAllocator<HostDevice>>();
    assert_send_sync::<PlatformAllocator<dyn Device>>();
    assert_send_sync::<VmmAllocator<HostDevice>>();
    assert_send_sync::<VmmAllocator<dyn Device>>();
    assert_send_sync::<AsyncPoolAllocator<HostDevice>>();
    assert_send_sync::<AsyncPoolAllocator<dyn Device>>();
    assert_send_sync::<LedgerAllocator<dyn Allocator>>();
    assert_send_sync::<RecorderAllocator<BfcAllocator<HostDevice>>>();
    assert_send_sync::<Box<dyn Allocator>>();
    assert_send_sync::<dyn Allocator>();
    assert_send_sync::<dyn Device>();
    assert_send_sync::<HostDevice>();
    assert_send_sync::<CountingDevice<dyn Device>>();
    assert_send_sync::<Portalloc>();
    assert_send_sync::<Allocation>();
    #[cfg(feature = "cuda")]
    assert_send_sync::<portalloc::backends::cuda::CudaDevice>();
    #[cfg(feature = "hip")]
    assert_send_sync::<portalloc::backends::hip::HipDevice>();
}

impl Strategy {
    /// The largest alignment the strategy accepts that the stress test asks for.
    fn max_alignment(self) -> u64 {
        match self {
            Strategy::Platform | Strategy::Async => 256,
            _ => 64 << 10,
        }
    }
}

/// Live ranges of all threads: start → (end, thread).
type Ranges = Mutex<BTreeMap<u64, (u64, usize)>>;

fn claim(ranges: &Ranges, a: &Allocation, thread: usize) {
    if a.is_empty() {
        return;
    }
    let (start, end) = (a.ptr(), a.ptr() + a.size());
    let mut r = ranges.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((&s, &(e, t))) = r.range(..end).next_back() {
        assert!(
            e <= start,
            "thread {thread} was handed [{start:#x}, {end:#x}), which overlaps \
             [{s:#x}, {e:#x}) live in thread {t}"
        );
    }
    r.insert(start, (end, thread));
}

fn release(ranges: &Ranges, a: &Allocation) {
    if !a.is_empty() {
        let mut r = ranges.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(r.remove(&a.ptr()).is_some(), "{:#x} was not live", a.ptr());
    }
}

/// What one thread did.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    allocated: u64,
    freed: u64,
    refused: u64,
    trims: u64,
}

/// How many threads are inside an allocator call now, and the most there ever were.
#[derive(Default)]
struct Overlap {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Overlap {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn stress(strategy: Strategy) {
    let host = simulated_host(CAPACITY);
    let streams: Vec<Stream> = (0..THREADS)
        .map(|i| {
            if i == 0 {
                Stream::DEFAULT
            } else {
                host.create_stream().unwrap()
            }
        })
        .collect();
    let allocator: Arc<dyn Allocator> = Arc::from(strategy.build(Arc::clone(&host), LIMIT));
    let ranges: Arc<Ranges> = Arc::default();
    // Every thread starts at once, and the most threads inside an allocator call at the same
    // moment is measured: evidence that the threads did overlap.
    let start = Arc::new(std::sync::Barrier::new(THREADS));
    let inside = Arc::new(Overlap::default());
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let allocator = Arc::clone(&allocator);
            let ranges = Arc::clone(&ranges);
            let stream = streams[t];
            let max_align = strategy.max_alignment();
            let start = Arc::clone(&start);
            let inside = Arc::clone(&inside);
            thread::spawn(move || {
                start.wait();
                // One generator per thread, seeded by the thread.
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678_9abc));
                let mut mine: Vec<Allocation> = Vec::new();
                let mut c = Counts::default();
                for _ in 0..OPS_PER_THREAD {
                    let roll = rng.below(100);
                    if roll < 2 {
                        inside.enter();
                        allocator.trim().expect("trim");
                        inside.leave();
                        c.trims += 1;
                    } else if roll < 45 && !mine.is_empty() {
                        let i = rng.below(mine.len() as u64) as usize;
                        let a = mine.swap_remove(i);
                        release(&ranges, &a);
                        inside.enter();
                        allocator.deallocate(a).expect("deallocate");
                        inside.leave();
                        c.freed += 1;
                    } else {
                        // Mostly small, sometimes up to 4 MiB; the limit is never reached
                        // (8 threads × at most ~60 live × 4 MiB < 768 MiB).
                        let bits = if rng.below(10) == 0 { 22 } else { 16 };
                        let size = rng.below(1 << bits);
                        let align = match rng.below(4) {
                            0 => 0,
                            1 => 256,
                            _ => 1 << (8 + rng.below(max_align.trailing_zeros() as u64 - 7)),
                        };
                        inside.enter();
                        let result = allocator.allocate(size, align, stream, "stress");
                        inside.leave();
                        match result {
                            Ok(a) => {
                                assert!(a.is_empty() || a.ptr() % align.max(256) == 0);
                                assert_eq!(a.size(), size);
                                claim(&ranges, &a, t);
                                mine.push(a);
                                c.allocated += 1;
                            }
                            Err(e) if e.is_out_of_memory() => c.refused += 1,
                            Err(e) => panic!("thread {t}: {size} B at {align}: {e}"),
                        }
                    }
                    if mine.len() > 60 {
                        let a = mine.swap_remove(0);
                        release(&ranges, &a);
                        allocator.deallocate(a).expect("deallocate");
                        c.freed += 1;
                    }
                }
                (mine, c)
            })
        })
        .collect();
    let mut total = Counts::default();
    let mut left = Vec::new();
    for w in workers {
        let (mine, c) = w.join().expect("a worker panicked");
        total.allocated += c.allocated;
        total.freed += c.freed;
        total.refused += c.refused;
        total.trims += c.trims;
        left.extend(mine);
    }
    allocator
        .check_invariants()
        .expect("invariants after the threads");
    let stats = allocator.stats();
    let live_sum: u64 = left.iter().map(Allocation::size).sum();
    assert!(stats.bytes_in_use >= live_sum, "{stats:?} < {live_sum}");
    assert_eq!(total.allocated - total.freed, left.len() as u64);
    assert_eq!(stats.num_allocs, total.allocated, "{strategy:?}: {stats:?}");
    assert!(
        stats.peak_pool_bytes <= LIMIT.next_multiple_of(2 * MIB),
        "{stats:?}"
    );
    assert_eq!(total.refused, 0, "{strategy:?}: nothing should run out");
    for a in left {
        release(&ranges, &a);
        allocator.deallocate(a).unwrap();
    }
    allocator.trim().unwrap();
    allocator
        .check_invariants()
        .expect("invariants after freeing");
    let stats = allocator.stats();
    assert_eq!(stats.bytes_in_use, 0, "{strategy:?}: {stats:?}");
    let most = inside.most.load(Ordering::Relaxed);
    assert!(
        most >= 2,
        "{strategy:?}: the threads never were inside the allocator together (at most {most})"
    );
    println!(
        "stress [{strategy:?}]: {THREADS} threads × {OPS_PER_THREAD} operations: {} allocations, \
         {} frees, {} trims; peak in use {} B, peak pool {} B; at most {most} threads inside \
         the allocator at once",
        total.allocated, total.freed, total.trims, stats.peak_bytes_in_use, stats.peak_pool_bytes
    );
    drop(allocator);
    for s in streams.into_iter().skip(1) {
        // SAFETY: the host device only compares stream handles; the test uses none after.
        unsafe { host.destroy_stream(s) }.unwrap();
    }
    assert!(host.census().is_empty(), "{:?}", host.census());
}

/// Every strategy, bfc both preallocated and growing.
#[test_case(Strategy::Bfc ; "bfc_preallocated")]
#[test_case(Strategy::BfcGrow ; "bfc_growing")]
#[test_case(Strategy::Platform ; "platform")]
#[test_case(Strategy::Vmm ; "vmm")]
#[test_case(Strategy::Async ; "async")]
fn under_8_threads(strategy: Strategy) {
    stress(strategy);
}
