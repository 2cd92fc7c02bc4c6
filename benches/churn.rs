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

/// An allocator the churn runs through.
trait Contender {
    /// What it frees an allocation by.
    type Slot;
    /// Allocates `size` bytes: the slot, and the end offset the allocation reaches in the
    /// range.
    fn allocate(&mut self, size: u64) -> (Self::Slot, u64);
    fn free(&mut self, slot: Self::Slot);
}

/// Runs `w` through `a`; returns the highest end offset used.
fn run<C: Contender>(a: &mut C, w: &Workload, slots: &mut [Option<C::Slot>]) -> u64 {
    let mut high = 0;
    for op in &w.ops {
        match *op {
            Op::Alloc { id, size } => {
                let (slot, end) = a.allocate(size);
                high = high.max(end);
                slots[id as usize] = Some(slot);
            }
            Op::Free { id } => a.free(black_box(slots[id as usize].take().expect("live"))),
        }
    }
    high
}

/// [`BfcAllocator`], its offsets counted from `base`.
struct Bfc<'a> {
    bfc: &'a BfcAllocator<HostDevice>,
    base: u64,
}

impl Contender for Bfc<'_> {
    type Slot = Allocation;
    fn allocate(&mut self, size: u64) -> (Allocation, u64) {
        let x = self
            .bfc
            .allocate(size, 0, Stream::DEFAULT, "churn")
            .expect("bfc allocation");
        let end = x.ptr() + size.div_ceil(UNIT) * UNIT - self.base;
        (x, end)
    }
    fn free(&mut self, slot: Allocation) {
        self.bfc.deallocate(slot).expect("bfc free");
    }
}

impl Contender for Arena {
    type Slot = (u64, u64);
    fn allocate(&mut self, size: u64) -> ((u64, u64), u64) {
        let rounded = size.div_ceil(UNIT) * UNIT;
        let g = Arena::allocate(self, rounded, UNIT, size).expect("arena allocation");
        ((g.token, g.addr), g.addr + rounded)
    }
    fn free(&mut self, (token, addr): (u64, u64)) {
        black_box(Arena::free(self, token, addr).expect("arena free"));
    }
}

impl Contender for offset_allocator::Allocator {
    type Slot = offset_allocator::Allocation;
    fn allocate(&mut self, size: u64) -> (offset_allocator::Allocation, u64) {
        let n = units(size);
        let x =
            offset_allocator::Allocator::allocate(self, n).expect("offset-allocator allocation");
        let end = (u64::from(x.offset) + u64::from(n)) * UNIT;
        (x, end)
    }
    fn free(&mut self, slot: offset_allocator::Allocation) {
        offset_allocator::Allocator::free(self, slot);
    }
}

/// offset-allocator behind a mutex locked per call, as a shared allocator must be.
impl Contender for &std::sync::Mutex<offset_allocator::Allocator> {
    type Slot = offset_allocator::Allocation;
    fn allocate(&mut self, size: u64) -> (offset_allocator::Allocation, u64) {
        Contender::allocate(&mut *self.lock().unwrap(), size)
    }
    fn free(&mut self, slot: offset_allocator::Allocation) {
        Contender::free(&mut *self.lock().unwrap(), slot);
    }
}

impl Contender for range_alloc::RangeAllocator<u64> {
    type Slot = std::ops::Range<u64>;
    fn allocate(&mut self, size: u64) -> (std::ops::Range<u64>, u64) {
        let r = self
            .allocate_range(size.div_ceil(UNIT) * UNIT)
            .expect("range-alloc allocation");
        let end = r.end;
        (r, end)
    }
    fn free(&mut self, slot: std::ops::Range<u64>) {
        self.free_range(slot);
    }
}

/// Slots for every allocation of `w`, all empty.
fn slots<T>(w: &Workload) -> Vec<Option<T>> {
    (0..w.allocs).map(|_| None).collect()
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
    let mut bfc_slots = slots(&w);
    // The first run takes the preallocated region; the base is known from then on.
    let bfc_high = {
        let first = bfc.allocate(1, 0, Stream::DEFAULT, "probe").expect("probe");
        let base = bfc.regions()[0].0;
        bfc.deallocate(first).expect("probe free");
        (run(&mut Bfc { bfc: &bfc, base }, &w, &mut bfc_slots), base)
    };
    let mut arena = Arena::new();
    arena.add_region(0, range).expect("arena region");
    let mut arena_slots = slots(&w);
    let mut offset = offset_allocator::Allocator::new(units(range));
    let mut offset_slots = slots(&w);
    let mut ranges = range_alloc::RangeAllocator::new(0..range);
    let mut range_slots = slots(&w);

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
        run(&mut Bfc { bfc: &g, base: 0 }, &w, &mut slots(&w));
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
        mib(run(&mut arena, &w, &mut arena_slots)),
        mib(run(&mut offset, &w, &mut offset_slots)),
        mib(run(&mut ranges, &w, &mut range_slots)),
        mib(growth),
    );
    let base = bfc_high.1;

    let mut g = c.benchmark_group(format!("churn/{label}"));
    g.throughput(Throughput::Elements(pairs));
    g.bench_function("bfc", |b| {
        b.iter(|| run(&mut Bfc { bfc: &bfc, base }, &w, &mut bfc_slots))
    });
    g.bench_function("bfc_arena", |b| {
        b.iter(|| run(&mut arena, &w, &mut arena_slots))
    });
    g.bench_function("offset_allocator", |b| {
        b.iter(|| run(&mut offset, &w, &mut offset_slots))
    });
    let locked = std::sync::Mutex::new(offset_allocator::Allocator::new(units(range)));
    g.bench_function("offset_allocator_mutex", |b| {
        b.iter(|| run(&mut &locked, &w, &mut offset_slots))
    });
    g.bench_function("range_alloc", |b| {
        b.iter(|| run(&mut ranges, &w, &mut range_slots))
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
