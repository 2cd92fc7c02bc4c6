//! Decodes bytes into a sequence of allocate / free / trim / stream-switch operations and runs
//! it against every strategy (bfc preallocating and growing, platform, vmm, async) on a
//! simulated host device, checking after each step the allocator's `check_invariants()` and
//! a simple model: live ranges disjoint, aligned and inside what the allocator holds; the
//! statistics cover the live sizes; errors typed. At the end everything is freed, the
//! allocator dropped, and the device must hold nothing.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use portalloc::backends::host::HostDevice;
use portalloc::device::{Device, Stream};
use portalloc::strategy::async_pool::{AsyncOptions, AsyncPoolAllocator};
use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
use portalloc::strategy::platform::PlatformAllocator;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator, Error};

mod support;
use support::Bytes;

const MIB: u64 = 1 << 20;
/// A small device, so that the limit and the device's capacity are reached often.
const CAPACITY: u64 = 64 * MIB;
const STREAMS: usize = 3;
/// At most this many operations per input (keeps each execution short).
const MAX_OPS: usize = 256;

#[derive(Debug, Clone, Copy)]
enum Op {
    Alloc {
        size: u64,
        align: u64,
    },
    Free {
        index: usize,
    },
    Trim,
    Stream {
        index: usize,
    },
    /// Hand one of this allocator's allocations to another allocator (refused, and kept).
    Foreign {
        index: usize,
    },
}

fn decode(data: &[u8]) -> (u8, Vec<Op>) {
    let mut b = Bytes(data);
    let config = b.byte();
    let mut ops = Vec::new();
    while let Some(tag) = b.u8() {
        if ops.len() == MAX_OPS {
            break;
        }
        let op = match tag % 16 {
            0..=5 => {
                // Sizes: small, page-ish, up to tens of MiB, and hostile.
                let class = b.byte();
                let size = match class % 8 {
                    0 => u64::from(b.byte()),
                    1..=3 => u64::from(b.u16()),
                    4 | 5 => u64::from(b.u16()) << 8,
                    6 => u64::from(b.u16()) << 12,
                    _ => b.u64(),
                };
                let a = b.byte();
                let align = match a % 8 {
                    0..=3 => 0,
                    4 | 5 => 1u64 << (a >> 3 & 31),
                    6 => 256,
                    _ => u64::from(a) * 3,
                };
                Op::Alloc { size, align }
            }
            6..=10 => Op::Free {
                index: usize::from(b.u16()),
            },
            11 => Op::Trim,
            12 | 13 => Op::Stream {
                index: usize::from(b.byte()) % STREAMS,
            },
            _ => Op::Foreign {
                index: usize::from(b.u16()),
            },
        };
        ops.push(op);
    }
    (config, ops)
}

/// The strategy under test, concretely, so its pool can be asked for.
enum Subject {
    Bfc(BfcAllocator<HostDevice>),
    Platform(PlatformAllocator<HostDevice>),
    Vmm(VmmAllocator<HostDevice>),
    Async(AsyncPoolAllocator<HostDevice>),
}

impl Subject {
    fn allocator(&self) -> &dyn Allocator {
        match self {
            Subject::Bfc(a) => a,
            Subject::Platform(a) => a,
            Subject::Vmm(a) => a,
            Subject::Async(a) => a,
        }
    }

    /// Address ranges every live allocation must lie in, where the strategy says.
    fn pool(&self) -> Option<Vec<(u64, u64)>> {
        match self {
            Subject::Bfc(a) => Some(a.regions()),
            Subject::Vmm(a) => Some(a.reservations()),
            Subject::Platform(_) | Subject::Async(_) => None,
        }
    }

    /// The largest alignment the strategy accepts.
    fn max_alignment(&self) -> u64 {
        match self {
            Subject::Bfc(_) => portalloc::strategy::bfc::MAX_ALIGNMENT,
            Subject::Vmm(_) => portalloc::strategy::vmm::MAX_ALIGNMENT,
            Subject::Platform(_) | Subject::Async(_) => 256,
        }
    }
}

fn subject(which: u8, device: Arc<HostDevice>, limit: u64) -> Subject {
    match which {
        0 | 1 => Subject::Bfc(
            BfcAllocator::new(
                device,
                BfcOptions {
                    limit,
                    preallocate: which == 0,
                },
            )
            .expect("bfc builds"),
        ),
        2 => Subject::Platform(PlatformAllocator::new(device, Some(limit))),
        3 => Subject::Vmm(VmmAllocator::new(device, VmmOptions::new(limit)).expect("vmm builds")),
        _ => Subject::Async(
            AsyncPoolAllocator::new(device, AsyncOptions::new(limit)).expect("async builds"),
        ),
    }
}

/// Live allocations with the alignment asked for.
type Live = Vec<(Allocation, u64)>;

fn check_model(s: &Subject, live: &Live, successes: u64, which: u8, limit: u64) {
    let a = s.allocator();
    if let Err(e) = a.check_invariants() {
        panic!("{}: invariant broken: {e}", a.name());
    }
    let mut spans: Vec<(u64, u64)> = live
        .iter()
        .filter(|(x, _)| !x.is_empty())
        .map(|(x, _)| (x.ptr(), x.ptr() + x.size()))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "{}: live ranges overlap: {w:x?}",
            a.name()
        );
    }
    for (x, align) in live {
        if !x.is_empty() {
            assert_eq!(x.ptr() % (*align).max(256), 0, "{}: misaligned", a.name());
        }
    }
    if let Some(pool) = s.pool() {
        for &(start, end) in &spans {
            assert!(
                pool.iter().any(|&(b, n)| start >= b && end <= b + n),
                "{}: [{start:#x}, {end:#x}) is outside the pool {pool:x?}",
                a.name()
            );
        }
    }
    let st = a.stats();
    let sum: u64 = live.iter().map(|(x, _)| x.size()).sum();
    assert!(st.bytes_in_use >= sum, "{}: {st:?} < {sum}", a.name());
    if which == 4 {
        assert_eq!(st.bytes_in_use, sum, "async counts requested bytes");
    }
    assert!(st.peak_bytes_in_use >= st.bytes_in_use, "{st:?}");
    assert!(st.bytes_in_use <= limit.next_multiple_of(2 * MIB), "{st:?}");
    // Every strategy counts the allocations it served, refused requests not included.
    assert_eq!(st.num_allocs, successes, "{}: {st:?}", a.name());
}

fn run(which: u8, config: u8, ops: &[Op]) {
    let host = Arc::new(
        HostDevice::builder()
            .capacity(CAPACITY)
            .simulated(true)
            .build()
            .expect("host"),
    );
    let streams = [
        Stream::DEFAULT,
        host.create_stream().expect("stream"),
        host.create_stream().expect("stream"),
    ];
    // The limit: a fraction of the capacity chosen by the input (1/8 .. 8/8).
    let limit = CAPACITY / 8 * (u64::from(config % 8) + 1);
    let s = subject(which, Arc::clone(&host), limit);
    let other = PlatformAllocator::new(Arc::clone(&host), None);
    let a = s.allocator();
    let mut live: Live = Vec::new();
    let mut stream = Stream::DEFAULT;
    let mut successes = 0u64;
    for op in ops {
        match *op {
            Op::Alloc { size, align } => match a.allocate(size, align, stream, "fuzz") {
                Ok(x) => {
                    assert_eq!(x.size(), size);
                    assert_eq!(x.allocator_id(), a.id());
                    successes += 1;
                    live.push((x, align));
                }
                Err(e) => {
                    let bad_align =
                        align != 0 && (!align.is_power_of_two() || align > s.max_alignment());
                    match &e {
                        Error::InvalidAlignment { .. } => assert!(bad_align, "{e}"),
                        Error::InvalidSize { .. } => {
                            assert!(size > u64::MAX - (1 << 30), "{}: {size}: {e}", a.name())
                        }
                        Error::OutOfMemory(_)
                        | Error::DeviceOutOfMemory { .. }
                        | Error::ExceedsLimit { .. } => {
                            assert!(
                                !bad_align,
                                "{}: alignment {align} not refused: {e}",
                                a.name()
                            )
                        }
                        other => panic!(
                            "{}: unexpected error for {size} B at {align}: {other}",
                            a.name()
                        ),
                    }
                }
            },
            Op::Free { index } => {
                if !live.is_empty() {
                    let (x, _) = live.swap_remove(index % live.len());
                    a.deallocate(x).expect("deallocating a live allocation");
                }
            }
            Op::Trim => {
                a.trim().expect("trim");
            }
            Op::Stream { index } => stream = streams[index],
            Op::Foreign { index } => {
                if !live.is_empty() {
                    let i = index % live.len();
                    let (x, align) = live.swap_remove(i);
                    let (ptr, size, st, id, token) =
                        (x.ptr(), x.size(), x.stream(), x.allocator_id(), x.token());
                    match other.deallocate(x) {
                        Err(Error::ForeignAllocation { .. }) => {}
                        r => panic!("another allocator took a foreign allocation: {r:?}"),
                    }
                    // The refused allocation was consumed; its owner frees it by a copy of it.
                    live.push((Allocation::new(ptr, size, st, id, token), align));
                }
            }
        }
        check_model(&s, &live, successes, which, limit);
    }
    for (x, _) in live.drain(..) {
        a.deallocate(x).expect("deallocating at the end");
    }
    a.trim().expect("trim at the end");
    check_model(&s, &live, successes, which, limit);
    assert_eq!(a.stats().bytes_in_use, 0);
    drop(s);
    drop(other);
    for st in &streams[1..] {
        // SAFETY: the host device only compares stream handles; the test uses none after.
        unsafe { host.destroy_stream(*st) }.expect("destroy stream");
    }
    let census = host.census();
    assert!(census.is_empty(), "the device still holds {census:?}");
}

fuzz_target!(|data: &[u8]| {
    let (config, ops) = decode(data);
    for which in 0..5 {
        run(which, config, &ops);
    }
});
