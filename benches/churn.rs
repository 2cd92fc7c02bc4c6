//! RMM's "random allocations" churn: a seeded sequence where each step allocates (probability
//! 0.73, size uniform in `[1, N]`) or frees a random live allocation; whatever is live at the
//! end is freed, so every iteration leaves each allocator empty. The *same* pre-generated
//! sequence runs through:
//!
//! * `bfc` — [`BfcAllocator`] (the public `Allocator` API, mutex included) preallocating one
//!   region over a simulated [`HostDevice`];
//! * `bfc_arena` — the same algorithm without the device wrapper and lock ([`Arena`]);
//! * `offset_allocator` — `offset_allocator::Allocator` 0.2 (Sebastian Aaltonen's two-level
//!   O(1) allocator), which counts in `u32` units: it manages the range in **256-byte
//!   units** and each request is `ceil(size / 256)` units — the same 256-byte rounding as BFC;
//! * `offset_allocator_mutex` — the same behind a `std::sync::Mutex` locked per call, as
//!   `bfc` is (a shared allocator must lock; this isolates the algorithms' difference);
//! * `range_alloc` — `range_alloc::RangeAllocator<u64>` 0.1 over `0..range` in bytes, each
//!   request rounded up to 256 bytes as well.
//!
//! Every allocator manages an equal range (8 GiB for N = 1 MiB, 512 GiB for N = 64 MiB).
//! Criterion reports time per whole sequence and, with `Throughput::Elements(pairs)`,
//! allocate+free pairs per second. Each allocator's footprint (the highest end offset it
//! used in the range; for bfc also the peak pool it would take growing from 2 MiB) is printed
//! once.
//!
//! Run: `cargo bench --bench churn -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use portalloc::backends::host::HostDevice;
use portalloc::replay::preset;
use portalloc::strategy::bfc::arena::Arena;
use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
use portalloc::{Allocation, Allocator, Stream};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const OPS: usize = 10_000;
const UNIT: u64 = 256;

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Allocate `size` bytes as allocation number `id`.
    Alloc { id: u32, size: u64 },
    /// Free allocation number `id`.
    Free { id: u32 },
}

struct Workload {
    ops: Vec<Op>,
    allocs: usize,
}

/// RMM's random-allocations sequence, followed by frees of whatever is still live.
fn workload(seed: u64, max_size: u64) -> Workload {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut ops = Vec::with_capacity(OPS * 2);
    let mut live: Vec<u32> = Vec::new();
    let mut next = 0u32;
    for _ in 0..OPS {
        if live.is_empty() || rng.gen_bool(0.73) {
            ops.push(Op::Alloc {
                id: next,
                size: rng.gen_range(1..=max_size),
            });
            live.push(next);
            next += 1;
        } else {
            let id = live.swap_remove(rng.gen_range(0..live.len()));
            ops.push(Op::Free { id });
        }
    }
    ops.extend(live.into_iter().map(|id| Op::Free { id }));
    Workload {
        ops,
        allocs: next as usize,
    }
}

fn units(size: u64) -> u32 {
    u32::try_from(size.div_ceil(UNIT)).expect("request fits the u32 unit range")
}

fn run_bfc(
    a: &BfcAllocator<HostDevice>,
    w: &Workload,
    slots: &mut [Option<Allocation>],
    base: u64,
) -> u64 {
    let mut high = 0;
    for op in &w.ops {
        match *op {
            Op::Alloc { id, size } => {
                let x = a
                    .allocate(size, 0, Stream::DEFAULT, "churn")
                    .expect("bfc allocation");
                high = high.max(x.ptr() + size.div_ceil(UNIT) * UNIT - base);
                slots[id as usize] = Some(x);
            }
            Op::Free { id } => {
                let x = slots[id as usize].take().expect("live");
                a.deallocate(black_box(x)).expect("bfc free");
            }
        }
    }
    high
}

fn run_arena(a: &mut Arena, w: &Workload, slots: &mut [(u64, u64)]) -> u64 {
    let mut high = 0;
    for op in &w.ops {
        match *op {
            Op::Alloc { id, size } => {
                let rounded = size.div_ceil(UNIT) * UNIT;
                let g = a.allocate(rounded, UNIT, size).expect("arena allocation");
                high = high.max(g.addr + rounded);
                slots[id as usize] = (g.token, g.addr);
            }
            Op::Free { id } => {
                let (token, addr) = slots[id as usize];
                black_box(a.free(token, addr).expect("arena free"));
            }
        }
    }
    high
}

/// offset-allocator as the benchmark drives it: alone, or behind the mutex a shared
/// allocator needs.
trait OffsetHeap {
    fn allocate(&mut self, units: u32) -> offset_allocator::Allocation;
    fn free(&mut self, allocation: offset_allocator::Allocation);
}

impl OffsetHeap for offset_allocator::Allocator {
    fn allocate(&mut self, units: u32) -> offset_allocator::Allocation {
        offset_allocator::Allocator::allocate(self, units).expect("offset-allocator allocation")
    }
    fn free(&mut self, allocation: offset_allocator::Allocation) {
        offset_allocator::Allocator::free(self, allocation);
    }
}

/// Locks around each call, as a shared allocator must.
impl OffsetHeap for &std::sync::Mutex<offset_allocator::Allocator> {
    fn allocate(&mut self, units: u32) -> offset_allocator::Allocation {
        OffsetHeap::allocate(&mut *self.lock().unwrap(), units)
    }
    fn free(&mut self, allocation: offset_allocator::Allocation) {
        OffsetHeap::free(&mut *self.lock().unwrap(), allocation);
    }
}

fn run_offset(
    a: &mut impl OffsetHeap,
    w: &Workload,
    slots: &mut [Option<offset_allocator::Allocation>],
) -> u64 {
    let mut high = 0;
    for op in &w.ops {
        match *op {
            Op::Alloc { id, size } => {
                let n = units(size);
                let x = a.allocate(n);
                high = high.max((u64::from(x.offset) + u64::from(n)) * UNIT);
                slots[id as usize] = Some(x);
            }
            Op::Free { id } => a.free(black_box(slots[id as usize].take().expect("live"))),
        }
    }
    high
}

fn run_range(
    a: &mut range_alloc::RangeAllocator<u64>,
    w: &Workload,
    slots: &mut [std::ops::Range<u64>],
) -> u64 {
    let mut high = 0;
    for op in &w.ops {
        match *op {
            Op::Alloc { id, size } => {
                let r = a
                    .allocate_range(size.div_ceil(UNIT) * UNIT)
                    .expect("range-alloc allocation");
                high = high.max(r.end);
                slots[id as usize] = r;
            }
            Op::Free { id } => a.free_range(black_box(slots[id as usize].clone())),
        }
    }
    high
}

fn churn(c: &mut Criterion, label: &str, max_size: u64, range: u64) {
    let w = workload(0x5eed, max_size);
    let pairs = w.allocs as u64;
    let device = Arc::new(
        preset::custom(2 * range)
            .host_device()
            .expect("simulated host device"),
    );
    let bfc = BfcAllocator::new(
        device.clone(),
        BfcOptions {
            limit: range,
            preallocate: true,
        },
    )
    .expect("bfc");
    let mut bfc_slots: Vec<Option<Allocation>> = (0..w.allocs).map(|_| None).collect();
    // The first run takes the preallocated region; the base is known from then on.
    let bfc_high = {
        let first = bfc.allocate(1, 0, Stream::DEFAULT, "probe").expect("probe");
        let base = bfc.regions()[0].0;
        bfc.deallocate(first).expect("probe free");
        (run_bfc(&bfc, &w, &mut bfc_slots, base), base)
    };
    let mut arena = Arena::new();
    arena.add_region(0, range).expect("arena region");
    let mut arena_slots = vec![(0u64, 0u64); w.allocs];
    let mut offset = offset_allocator::Allocator::new(units(range));
    let mut offset_slots: Vec<Option<offset_allocator::Allocation>> = vec![None; w.allocs];
    let mut ranges = range_alloc::RangeAllocator::new(0..range);
    let mut range_slots = vec![0..0; w.allocs];

    // Footprints, once.
    let growth = {
        let dev = Arc::new(preset::custom(2 * range).host_device().expect("device"));
        let g = BfcAllocator::new(
            dev,
            BfcOptions {
                limit: range,
                preallocate: false,
            },
        )
        .expect("bfc");
        let mut slots: Vec<Option<Allocation>> = (0..w.allocs).map(|_| None).collect();
        run_bfc(&g, &w, &mut slots, 0);
        g.stats().peak_pool_bytes
    };
    let peak_live = {
        let (mut live, mut peak, mut sizes) = (0u64, 0u64, vec![0u64; w.allocs]);
        for op in &w.ops {
            match *op {
                Op::Alloc { id, size } => {
                    sizes[id as usize] = size.div_ceil(UNIT) * UNIT;
                    live += sizes[id as usize];
                    peak = peak.max(live);
                }
                Op::Free { id } => live -= sizes[id as usize],
            }
        }
        peak
    };
    let mib = |b: u64| b as f64 / MIB as f64;
    eprintln!(
        "churn/{label}: {} ops, {pairs} allocate+free pairs, peak live {:.1} MiB (256-rounded)",
        w.ops.len(),
        mib(peak_live)
    );
    eprintln!(
        "  footprint (highest end offset used): bfc {:.1} MiB, bfc_arena {:.1} MiB, offset_allocator {:.1} MiB, range_alloc {:.1} MiB; bfc growing from 2 MiB: peak pool {:.1} MiB",
        mib(bfc_high.0),
        mib(run_arena(&mut arena, &w, &mut arena_slots)),
        mib(run_offset(&mut offset, &w, &mut offset_slots)),
        mib(run_range(&mut ranges, &w, &mut range_slots)),
        mib(growth),
    );
    let base = bfc_high.1;

    let mut g = c.benchmark_group(format!("churn/{label}"));
    g.throughput(Throughput::Elements(pairs));
    g.bench_function("bfc", |b| {
        b.iter(|| run_bfc(&bfc, &w, &mut bfc_slots, base))
    });
    g.bench_function("bfc_arena", |b| {
        b.iter(|| run_arena(&mut arena, &w, &mut arena_slots))
    });
    g.bench_function("offset_allocator", |b| {
        b.iter(|| run_offset(&mut offset, &w, &mut offset_slots))
    });
    let locked = std::sync::Mutex::new(offset_allocator::Allocator::new(units(range)));
    g.bench_function("offset_allocator_mutex", |b| {
        b.iter(|| run_offset(&mut &locked, &w, &mut offset_slots))
    });
    g.bench_function("range_alloc", |b| {
        b.iter(|| run_range(&mut ranges, &w, &mut range_slots))
    });
    g.finish();
    assert_eq!(bfc.live_count(), 0);
    assert_eq!(bfc.stats().bytes_in_use, 0);
}

fn benches(c: &mut Criterion) {
    churn(c, "1MiB", MIB, 8 * GIB);
    churn(c, "64MiB", 64 * MIB, 512 * GIB);
}

criterion_group!(churn_group, benches);
criterion_main!(churn_group);
