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
//!
//! # The steady-state regime (`churn/steady/…`, issue #16)
//!
//! The growing regime above has no cap on live bytes: the live set only grows and the heap
//! stays in cache. The steady regime is RMM's pattern with a cap: allocate with p = 0.73,
//! sizes uniform in `[256 B, max]` for max ∈ {64 KiB, 4 MiB}; when an allocation would take
//! the live (requested) bytes past 8 GiB, a random live block is freed instead; 2 M
//! operations over a 16 GiB range, then whatever is live is freed. The heap fills up with holes
//! (~260k live blocks at 64 KiB). The same seeded sequence runs through every contender:
//!
//! * locked against locked: `bfc` (public API) and `offset_allocator_mutex`;
//! * unlocked against unlocked: `bfc_arena` (bare [`Arena`]) and `offset_allocator`;
//! * `vmm` ([`VmmAllocator`], 16 GiB budget) on the simulated host device behind a
//!   [`CountingDevice`]: its time includes the simulated device's calls (book-keeping only, no
//!   driver), and those calls are counted and printed separately per pair, so the CPU path
//!   can be told from the device traffic a real GPU would add;
//! * bfc and vmm (the public API) get a tag on every allocation, `"activations"` or
//!   `"weights"` by the size's parity (so mixed at random), as the ledger's and the framework
//!   hooks' callers tag theirs — vmm keeps books of tagged allocations for sleep and wake,
//!   which an untagged run would not time; offset-allocator and the bare `Arena` take none;
//! * `range_alloc`: utilisation only (its free list is a sorted `Vec`, O(holes) per call —
//!   minutes per pass at 64 KiB, so it is not timed, and at 64 KiB it runs only with
//!   `CHURN_RANGE_ALLOC=1`);
//! * `harness_*` — three do-nothing contenders, one per slot type (the public API's
//!   [`Allocation`], the arena's `(token, addr)` pair, offset-allocator's 8-byte handle): each
//!   walks the same sequence through the same `run` loop into a slot vector of the same
//!   type, but allocates nothing (it hands out a counter). Their time is the harness's own cost — the
//!   walk, the slot writes and reads, the footprint maximum — so every ratio can be stated with
//!   and without it. Each allocator is charged its own slot type's harness: a 56-byte
//!   `Option<Allocation>` per live block costs more cache traffic than an 8-byte one.
//!
//! **Utilisation** = peak live bytes (the highest sum of live requests, each rounded up to
//! 256 B, over the sequence — the same figure for every contender) ÷ the memory the
//! contender spanned at its peak: for the range allocators (bfc, bfc_arena, offset-allocator,
//! range-alloc) the highest end offset used in the range; for vmm, whose range is virtual,
//! the most physical bytes it held (`peak_pool_bytes`, whole 2 MiB granules). Both are "what
//! a device would have to hold to serve this sequence from this allocator".
//!
//! ## The pass table is the figure
//!
//! Before criterion runs (not under `--test`, `--list` or `--profile-time`) the **pass table**
//! is printed, as markdown: [`PASSES`] passes, each running every contender (the five timed
//! allocators and the three harnesses) over the full 2 M-operation sequence. A pass walks the
//! sequence in [`CHUNKS`] stretches and every contender runs a stretch before any runs the
//! next — each keeping its own heap and live blocks from one stretch to the next, so each
//! still serves the whole sequence in order — with the order rotated by stretch and by pass,
//! so none always runs first (after the previous pass's last) or last. Interleaving this finely
//! is what holds the ratios still: a contender's time is summed over stretches spread across
//! the whole pass, so when a shared machine's load changes, every contender feels it alike; a
//! whole sequence per contender put seconds between contender and baseline, and their ratio
//! swung with the load in between.
//!
//! Each stretch is timed by the thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`; wall time
//! where there is none): the wall clock also counts the time the thread sat preempted on the
//! run queue, which is the load's doing, not the allocator's. Wall time is kept beside it, with
//! the largest share of a pass a contender spent off the CPU, so a loaded run shows itself.
//! Ratios are taken **within a pass** and reported as min / median / max over the passes: the
//! spread is how far the median can be trusted. The machine's load (`/proc/loadavg`) is
//! printed at the start and the end of the passes. CPU time does not make a loaded machine
//! quiet — the other processes still share the caches, and a sibling hyperthread the core — so
//! absolute ns/pair still move with the load more than the ratios do. The harnesses' own
//! ns/pair are the gauge of that: they do nothing but touch memory (the slot vectors, read at
//! random), so when they rise the caches were contended. A memory-bound ratio (the 64 KiB
//! sequence's heaps and slots are far larger than the caches) moves with that contention too,
//! so two runs under different neighbours can differ by more than one run's spread: the spread
//! is the noise within one run's conditions, and a figure worth quoting is a median with its
//! spread, its load and its harness ns/pair, from more than one run.
//!
//! Criterion's figures are **not** the comparison, and its medians must not be divided by one
//! another. Criterion times one contender's samples as a block, then the next contender's: the
//! blocks are a minute apart, and on a shared machine the load changes in between, enough to
//! turn what the passes call a tie into a 1.5× gap between two medians. It also runs one
//! contender back to back, warm-up included, so that contender's heap has the caches to
//! itself, a state the interleaved passes do not share. Making criterion interleave would
//! mean one benchmark timing a whole pass: a pass time, not a ratio. So there is one instrument for
//! the comparison, the pass table, and criterion's `churn/steady/…` benchmarks stay for what it
//! does well on one contender at a time: `--save-baseline` / `--baseline` regression checks on
//! a quiet machine, and `--profile-time` under a profiler (which skips the table). A line above
//! criterion's output says so. Its warm-up is cut to a second: the sequence is the same one
//! the passes already ran, and one iteration takes a good part of a second.
//!
//! `cargo bench --bench churn -- steady` runs only this regime (`steady/64KiB` or `steady/4MiB`
//! one size); the two sizes take about four minutes on two loaded cores, most of it
//! criterion's samples.
//!
//! # Two streams with kernels in flight (`churn/two_streams/…`)
//!
//! A PyTorch-style program: each step allocates a buffer on stream `S`, launches a kernel on
//! `S` over it and frees it on `S` while the kernel runs, then allocates on stream `T` (which
//! keeps up to 64 buffers live and frees its oldest on `T`); the device runs behind the CPU,
//! with the 32 newest kernels in flight (the oldest completes as a new one starts). Sizes are
//! uniform in `[256 B, 256 KiB]`, 20,000 steps, on a simulated 64 GiB host device, 3/4 of it
//! the limit — far from it. The table printed first (not under `--test` or `--list`) gives,
//! per strategy, the **CPU waits and GPU-side waits per 1,000 requests** as the device counts
//! them (its own synchronisation and wait-event calls: an oracle outside the strategies), and
//! the device's hazard count (memory freed or unmapped under a kernel), which must be 0.
//! Criterion then times the sequence. `cargo bench --bench churn -- two_streams` runs only
//! this regime.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use portalloc::adaptor::CountingDevice;
use portalloc::backends::host::HostDevice;
use portalloc::replay::preset;
use portalloc::strategy::bfc::arena::Arena;
use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator, Stream};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const KIB: u64 = 1 << 10;
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
    run_ops(a, &w.ops, slots)
}

/// Runs `ops` (all of a workload's or a stretch of them) through `a`, which holds what the
/// operations before them left live; returns the highest end offset used.
fn run_ops<C: Contender>(a: &mut C, ops: &[Op], slots: &mut [Option<C::Slot>]) -> u64 {
    let mut high = 0;
    for op in ops {
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

/// The tags the public API's allocations carry, as the ledger's and the framework hooks'
/// callers tag theirs: each allocation takes one by its size's parity, so the two are mixed
/// at random (about every other allocation changes tag). offset-allocator and bfc's `Arena`
/// take no tag.
const TAGS: [&str; 2] = ["activations", "weights"];

/// The tag of an allocation of `size` bytes (see [`TAGS`]).
fn tag_of(size: u64) -> &'static str {
    TAGS[(size & 1) as usize]
}

/// An allocator through the public [`Allocator`] API (bfc, vmm), its offsets counted from
/// `base` (vmm's footprint is read from its stats instead: its range is virtual). Every
/// allocation is tagged ([`tag_of`]).
struct Public<'a, A> {
    alloc: &'a A,
    base: u64,
}

impl<A: Allocator> Contender for Public<'_, A> {
    type Slot = Allocation;
    fn allocate(&mut self, size: u64) -> (Allocation, u64) {
        let x = self
            .alloc
            .allocate(size, 0, Stream::DEFAULT, tag_of(size))
            .expect("allocation");
        let end = (x.ptr() + size.div_ceil(UNIT) * UNIT).saturating_sub(self.base);
        (x, end)
    }
    fn free(&mut self, slot: Allocation) {
        self.alloc.deallocate(slot).expect("free");
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

/// A slot a [`Harness`] can make from a counter, shaped like the handle of the allocator it
/// stands beside.
trait Token {
    fn token(n: u64, size: u64) -> Self;
}

impl Token for Allocation {
    fn token(n: u64, size: u64) -> Allocation {
        Allocation::new(n, size, Stream::DEFAULT, 0, n)
    }
}

impl Token for (u64, u64) {
    fn token(n: u64, size: u64) -> (u64, u64) {
        (n, size)
    }
}

/// offset-allocator's handle is two `u32`s with a niche; `NonZeroU64` has its size and its
/// `Option`'s size.
impl Token for std::num::NonZeroU64 {
    fn token(n: u64, _size: u64) -> std::num::NonZeroU64 {
        std::num::NonZeroU64::new(n | 1 << 63).expect("non-zero")
    }
}

/// Allocates nothing: hands out a counter as a slot of type `T`, so that running it measures
/// the harness — the walk over the operations, the slot vector, the footprint maximum — and
/// nothing else. `black_box` keeps the counter and the freed slot opaque, as an allocator's
/// would be.
struct Harness<T> {
    next: u64,
    slot: std::marker::PhantomData<T>,
}

impl<T> Harness<T> {
    fn new() -> Harness<T> {
        Harness {
            next: 0,
            slot: std::marker::PhantomData,
        }
    }
}

impl<T: Token> Contender for Harness<T> {
    type Slot = T;
    fn allocate(&mut self, size: u64) -> (T, u64) {
        self.next += 1;
        (T::token(black_box(self.next), size), size)
    }
    fn free(&mut self, slot: T) {
        black_box(slot);
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
        (
            run(&mut Public { alloc: &bfc, base }, &w, &mut bfc_slots),
            base,
        )
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
        run(&mut Public { alloc: &g, base: 0 }, &w, &mut slots(&w));
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
        b.iter(|| run(&mut Public { alloc: &bfc, base }, &w, &mut bfc_slots))
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

// ---- The steady-state regime (issue #16) ----

/// Operations in the steady sequence (RMM's 2 M).
const STEADY_OPS: usize = 2_000_000;
/// The cap on live requested bytes.
const STEADY_CAP: u64 = 8 * GIB;
/// The range (and vmm's physical budget) every contender manages.
const STEADY_RANGE: u64 = 16 * GIB;
/// Smallest request.
const STEADY_MIN: u64 = 256;
/// Blocks live at once past which range-alloc's one utilisation pass is skipped unless
/// `CHURN_RANGE_ALLOC=1`: its free list is a sorted `Vec`, O(holes) per call, so at the
/// 64 KiB sequence's ~300k blocks its pass alone takes longer than the rest of the regime.
const RANGE_ALLOC_BLOCKS: usize = 100_000;
/// Passes of the pass table: one per contender, so that the rotated order puts every
/// contender in every position once (first, when the caches hold the previous pass's last
/// contender; last, after every other one ran).
const PASSES: usize = CONTENDERS.len();
/// Stretches a pass walks the sequence in, every contender running one before any runs the
/// next: about 125k operations, tens of milliseconds each — long beside the cost of a
/// contender re-warming its share of the caches after the others ran, short beside the
/// seconds over which a shared machine's load changes.
const CHUNKS: usize = 16;

/// RMM's random allocations with a cap: allocate (p = 0.73, size uniform in
/// `[STEADY_MIN, max_size]`) unless that would take the live requested bytes past
/// [`STEADY_CAP`] or nothing is live to free — then free a random live block; after
/// [`STEADY_OPS`] operations free what is live, so each pass leaves every allocator empty.
fn steady_workload(seed: u64, max_size: u64) -> Workload {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut ops = Vec::with_capacity(STEADY_OPS + STEADY_OPS / 4);
    // Live ids and their requested sizes, swap-removed at random.
    let mut live: Vec<(u32, u64)> = Vec::new();
    let (mut live_bytes, mut next) = (0u64, 0u32);
    for _ in 0..STEADY_OPS {
        let want_alloc = live.is_empty() || rng.gen_bool(0.73);
        let size = rng.gen_range(STEADY_MIN..=max_size);
        if want_alloc && live_bytes + size <= STEADY_CAP {
            ops.push(Op::Alloc { id: next, size });
            live.push((next, size));
            live_bytes += size;
            next += 1;
        } else {
            let (id, size) = live.swap_remove(rng.gen_range(0..live.len()));
            live_bytes -= size;
            ops.push(Op::Free { id });
        }
    }
    ops.extend(live.into_iter().map(|(id, _)| Op::Free { id }));
    Workload {
        ops,
        allocs: next as usize,
    }
}

/// The highest sum of live requests (each rounded up to [`UNIT`]) over `w`, and the most
/// blocks live at once.
fn peak_live(w: &Workload) -> (u64, usize) {
    let (mut live, mut peak, mut blocks, mut peak_blocks) = (0u64, 0u64, 0usize, 0usize);
    let mut sizes = vec![0u64; w.allocs];
    for op in &w.ops {
        match *op {
            Op::Alloc { id, size } => {
                sizes[id as usize] = size.div_ceil(UNIT) * UNIT;
                live += sizes[id as usize];
                blocks += 1;
                peak = peak.max(live);
                peak_blocks = peak_blocks.max(blocks);
            }
            Op::Free { id } => {
                live -= sizes[id as usize];
                blocks -= 1;
            }
        }
    }
    (peak, peak_blocks)
}

type SimDevice = CountingDevice<HostDevice>;

/// The steady regime's contenders, each with its slots; every one is empty between passes.
struct Steady {
    bfc: BfcAllocator<HostDevice>,
    /// Start of bfc's preallocated region (its offsets count from there).
    bfc_base: u64,
    arena: Arena,
    offset: offset_allocator::Allocator,
    locked: std::sync::Mutex<offset_allocator::Allocator>,
    vmm: VmmAllocator<SimDevice>,
    device: Arc<SimDevice>,
    /// Slots for every allocation of the sequence, one vector per contender (the passes run
    /// the contenders interleaved, each holding its own live blocks), all empty between
    /// passes: made once, so no pass times their allocation.
    bfc_slots: Vec<Option<Allocation>>,
    vmm_slots: Vec<Option<Allocation>>,
    arena_slots: Vec<Option<(u64, u64)>>,
    offset_slots: Vec<Option<offset_allocator::Allocation>>,
    locked_slots: Vec<Option<offset_allocator::Allocation>>,
    /// The harnesses' own, of the same types as the allocators they stand beside;
    /// offset-allocator's handle cannot be made outside it, so its harness uses a type of the
    /// same layout.
    harness_handle_slots: Vec<Option<Allocation>>,
    harness_pair_slots: Vec<Option<(u64, u64)>>,
    harness_offset_slots: Vec<Option<std::num::NonZeroU64>>,
}

/// The pass table's contenders: the five allocators criterion also times, then the three
/// harnesses (one per slot type).
const CONTENDERS: [&str; 8] = [
    "bfc",
    "offset_allocator_mutex",
    "bfc_arena",
    "offset_allocator",
    "vmm",
    "harness_handle",
    "harness_pair",
    "harness_offset",
];
/// `CONTENDERS[..ALLOCATORS]` allocate.
const ALLOCATORS: usize = 5;

impl Steady {
    fn new(w: &Workload) -> Steady {
        let host = Arc::new(
            preset::custom(2 * STEADY_RANGE)
                .host_device()
                .expect("simulated host device"),
        );
        let bfc = BfcAllocator::new(
            host,
            BfcOptions {
                limit: STEADY_RANGE,
                preallocate: true,
            },
        )
        .expect("bfc");
        let probe = bfc.allocate(1, 0, Stream::DEFAULT, "probe").expect("probe");
        let bfc_base = bfc.regions()[0].0;
        bfc.deallocate(probe).expect("probe free");
        let mut arena = Arena::new();
        arena.add_region(0, STEADY_RANGE).expect("arena region");
        // offset-allocator's default of 128k allocations is below the ~260k live blocks
        // (and as many holes) of the 64 KiB sequence.
        let offset = || offset_allocator::Allocator::with_max_allocs(units(STEADY_RANGE), 1 << 21);
        // vmm's own simulated device: its calls are counted apart from bfc's preallocation.
        let device = Arc::new(CountingDevice::new(Arc::new(
            preset::custom(2 * STEADY_RANGE)
                .host_device()
                .expect("simulated host device"),
        )));
        let vmm = VmmAllocator::new(device.clone(), VmmOptions::new(STEADY_RANGE)).expect("vmm");
        Steady {
            bfc,
            bfc_base,
            arena,
            offset: offset(),
            locked: std::sync::Mutex::new(offset()),
            vmm,
            device,
            bfc_slots: slots(w),
            vmm_slots: slots(w),
            arena_slots: slots(w),
            offset_slots: slots(w),
            locked_slots: slots(w),
            harness_handle_slots: slots(w),
            harness_pair_slots: slots(w),
            harness_offset_slots: slots(w),
        }
    }

    /// Runs `ops` through the contender `name`; over a whole workload, returns its footprint
    /// (see the module docs).
    fn run(&mut self, name: &str, ops: &[Op]) -> u64 {
        match name {
            "bfc" => run_ops(
                &mut Public {
                    alloc: &self.bfc,
                    base: self.bfc_base,
                },
                ops,
                &mut self.bfc_slots,
            ),
            "bfc_arena" => run_ops(&mut self.arena, ops, &mut self.arena_slots),
            "offset_allocator" => run_ops(&mut self.offset, ops, &mut self.offset_slots),
            "offset_allocator_mutex" => run_ops(&mut &self.locked, ops, &mut self.locked_slots),
            "vmm" => {
                run_ops(
                    &mut Public {
                        alloc: &self.vmm,
                        base: 0,
                    },
                    ops,
                    &mut self.vmm_slots,
                );
                self.vmm.stats().peak_pool_bytes
            }
            "harness_handle" => run_ops(
                &mut Harness::<Allocation>::new(),
                ops,
                &mut self.harness_handle_slots,
            ),
            "harness_pair" => run_ops(&mut Harness::new(), ops, &mut self.harness_pair_slots),
            "harness_offset" => run_ops(&mut Harness::new(), ops, &mut self.harness_offset_slots),
            _ => unreachable!("no contender {name}"),
        }
    }
}

/// Whether criterion's filter (the first free argument after `--`) admits benchmark ids
/// under `churn/{prefix}`. A rough reading of criterion's regex: a filter is taken to admit
/// the ids it is a substring of or that it names (it contains the prefix), and a filter
/// naming `steady` admits the whole regime.
fn wanted(prefix: &str) -> bool {
    const VALUED: [&str; 13] = [
        "--warm-up-time",
        "--measurement-time",
        "--sample-size",
        "--save-baseline",
        "--baseline",
        "--load-baseline",
        "--profile-time",
        "--output-format",
        "--color",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--nresamples",
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut filter = None;
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if VALUED.contains(&a.as_str()) {
            i += 1;
        } else if !a.starts_with('-') {
            filter = Some(a.clone());
            break;
        }
        i += 1;
    }
    match filter {
        None => true,
        Some(f) => {
            let id = format!("churn/{prefix}");
            // A filter naming a benchmark under the prefix (`steady/4MiB/vmm`, with or
            // without `churn/`) contains the prefix.
            id.contains(&f)
                || f.contains(prefix)
                || (prefix.starts_with("steady") && (f == "steady" || f == "churn/steady"))
        }
    }
}

/// The thread's CPU time in nanoseconds: time the thread ran, not time it sat preempted.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn thread_cpu_ns() -> Option<u64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` (the C library std links) writes one `struct timespec` — two
    // 64-bit fields on 64-bit Linux, the layout of `Timespec` — through a pointer to a live,
    // writable local, and keeps no reference to it.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// No thread CPU clock here: the pass table falls back to wall time.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

/// The 1-, 5- and 15-minute load averages, as `/proc/loadavg` gives them.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown (no /proc/loadavg)".into())
}

/// One run of a contender in a pass: CPU and wall nanoseconds per allocate+free pair.
#[derive(Clone, Copy, Default)]
struct Timing {
    cpu: f64,
    wall: f64,
}

/// `min / median / max` of `v`, each with `prec` decimals.
fn spread(mut v: Vec<f64>, prec: usize) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "{:.prec$} / {:.prec$} / {:.prec$}",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The pass table's rows: a contender and the baseline it is divided by (`None`: the row
/// only gives its times).
const ROWS: [(&str, Option<&str>); 5] = [
    ("bfc", Some("offset_allocator_mutex")),
    ("vmm", Some("offset_allocator_mutex")),
    ("offset_allocator_mutex", Some("offset_allocator")),
    ("bfc_arena", Some("offset_allocator")),
    ("offset_allocator", None),
];

/// The harness of an allocator's slot type: the cost of its bookkeeping, not of allocating.
fn harness_of(name: &str) -> &'static str {
    match name {
        "bfc" | "vmm" => "harness_handle",
        "bfc_arena" => "harness_pair",
        "offset_allocator" | "offset_allocator_mutex" => "harness_offset",
        _ => unreachable!("no allocator {name}"),
    }
}

/// How the pass table's passes walk the sequence (`CHURN_METHOD`: `interleaved`, `whole` or
/// `both`, the default).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    /// [`CHUNKS`] stretches, every contender running one before any runs the next: each
    /// contender's heap is evicted by the others' between stretches.
    Interleaved,
    /// Each contender runs the whole sequence in turn (the order rotated by pass): its heap
    /// has the caches to itself, as one allocator in a program does.
    Whole,
}

impl Method {
    fn chunks(self) -> usize {
        match self {
            Method::Interleaved => CHUNKS,
            Method::Whole => 1,
        }
    }

    fn describe(self) -> String {
        match self {
            Method::Interleaved => format!("{CHUNKS} interleaved stretches"),
            Method::Whole => "whole sequences in turn (warm)".to_string(),
        }
    }
}

/// The methods `CHURN_METHOD` asks for (both unless it names one).
fn methods() -> Vec<Method> {
    match std::env::var("CHURN_METHOD").as_deref() {
        Ok("interleaved") => vec![Method::Interleaved],
        Ok("whole") => vec![Method::Whole],
        _ => vec![Method::Interleaved, Method::Whole],
    }
}

/// The data and unified caches of CPU 0 (`/sys/devices/system/cpu/cpu0/cache`), e.g.
/// `L1d 48K, L2 1024K, L3 32768K (shared by 0-1)`.
fn cache_sizes() -> String {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |p: std::path::PathBuf| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for i in 0..8 {
        let d = dir.join(format!("index{i}"));
        if !d.exists() {
            break;
        }
        let (level, kind) = (read(d.join("level")), read(d.join("type")));
        if kind == "Instruction" {
            continue;
        }
        let suffix = if kind == "Data" { "d" } else { "" };
        out.push(format!(
            "L{level}{suffix} {} (CPUs {})",
            read(d.join("size")),
            read(d.join("shared_cpu_list"))
        ));
    }
    if out.is_empty() {
        "unknown".to_string()
    } else {
        out.join(", ")
    }
}

/// Runs the [`PASSES`] passes (see the module docs) by `method` and prints the pass table as
/// markdown.
fn pass_table(s: &mut Steady, w: &Workload, label: &str, method: Method) {
    let pairs = w.allocs as f64;
    let clock = if thread_cpu_ns().is_some() {
        "thread CPU time"
    } else {
        "wall time (no thread CPU clock here)"
    };
    let load_start = loadavg();
    // Each pass walks the sequence in CHUNKS stretches; every contender runs a stretch (the
    // order rotated by stretch and by pass) before any runs the next, so all of them are
    // timed across the same seconds of the machine's load.
    let chunks = method.chunks();
    let bounds: Vec<usize> = (0..=chunks).map(|c| c * w.ops.len() / chunks).collect();
    let mut t = [[Timing::default(); CONTENDERS.len()]; PASSES];
    for (pass, row) in t.iter_mut().enumerate() {
        for (chunk, stretch) in bounds.windows(2).enumerate() {
            let ops = &w.ops[stretch[0]..stretch[1]];
            for k in 0..CONTENDERS.len() {
                let i = (k + chunk + pass) % CONTENDERS.len();
                let (wall, cpu) = (std::time::Instant::now(), thread_cpu_ns());
                black_box(s.run(CONTENDERS[i], ops));
                let wall = wall.elapsed().as_nanos() as f64;
                let cpu = match (cpu, thread_cpu_ns()) {
                    (Some(a), Some(b)) => (b - a) as f64,
                    _ => wall,
                };
                row[i].cpu += cpu / pairs;
                row[i].wall += wall / pairs;
            }
        }
    }
    let load_end = loadavg();
    let at = |name: &str| {
        CONTENDERS
            .iter()
            .position(|&c| c == name)
            .expect("a contender")
    };
    let per_pass =
        |f: &dyn Fn(&[Timing; CONTENDERS.len()]) -> f64| -> Vec<f64> { t.iter().map(f).collect() };
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    eprintln!();
    eprintln!(
        "**churn/steady/{label}** — {} allocate+free pairs per run, {PASSES} passes of {}, {clock}; \
         load average (1/5/15 min) {load_start} at the start, {load_end} at the end, {cpus} CPUs; caches {}",
        w.allocs,
        method.describe(),
        cache_sizes()
    );
    eprintln!();
    eprintln!(
        "| contender | ÷ baseline | ns/pair min / median / max | harness ns/pair | ratio min / median / max | ratio less harness min / median / max | wall ns/pair (median) | most off CPU |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|");
    for (name, base) in ROWS {
        let (c, h) = (at(name), at(harness_of(name)));
        let ns = spread(per_pass(&|r| r[c].cpu), 1);
        let h_ns = median(per_pass(&|r| r[h].cpu));
        let wall = median(per_pass(&|r| r[c].wall));
        let off = per_pass(&|r| 1.0 - r[c].cpu / r[c].wall)
            .into_iter()
            .fold(0f64, f64::max);
        let (base_name, ratio, net) = match base {
            None => ("—".to_string(), "—".to_string(), "—".to_string()),
            Some(b) => {
                let (b, bh) = (at(b), at(harness_of(b)));
                (
                    CONTENDERS[b].to_string(),
                    spread(per_pass(&|r| r[c].cpu / r[b].cpu), 2),
                    spread(
                        per_pass(&|r| (r[c].cpu - r[h].cpu) / (r[b].cpu - r[bh].cpu)),
                        2,
                    ),
                )
            }
        };
        eprintln!(
            "| {name} | {base_name} | {ns} | {h_ns:.1} | {ratio} | {net} | {wall:.1} | {:.0}% |",
            off * 100.0
        );
    }
    eprintln!();
    eprintln!(
        "harness (do-nothing contenders) ns/pair min / median / max: {}",
        CONTENDERS[ALLOCATORS..]
            .iter()
            .map(|&h| format!("{h} {}", spread(per_pass(&|r| r[at(h)].cpu), 1)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    eprintln!();
}

/// Prints the steady regime's utilisation (one pass of each allocator, range-alloc's only
/// one), vmm's device calls, then the pass table.
fn report_steady(s: &mut Steady, w: &Workload, (peak, peak_blocks): (u64, usize), label: &str) {
    let pairs = w.allocs as u64;
    let gib = |b: u64| b as f64 / GIB as f64;
    // Utilisation, from the first pass of each (range-alloc's only pass).
    let mut footprint = Vec::new();
    for name in &CONTENDERS[..ALLOCATORS] {
        footprint.push((*name, s.run(name, &w.ops)));
    }
    let vmm_calls = s.device.counts();
    let range_note = if peak_blocks <= RANGE_ALLOC_BLOCKS
        || std::env::var_os("CHURN_RANGE_ALLOC").is_some_and(|v| v == "1")
    {
        let t = std::time::Instant::now();
        let mut ranges = range_alloc::RangeAllocator::new(0..STEADY_RANGE);
        let range_high = run(&mut ranges, w, &mut slots(w));
        footprint.push(("range_alloc", range_high));
        format!("range_alloc's pass: {:.1} s", t.elapsed().as_secs_f64())
    } else {
        format!(
            "range_alloc skipped: {peak_blocks} blocks live at once make its pass minutes long; \
             CHURN_RANGE_ALLOC=1 runs it"
        )
    };
    let util: Vec<String> = footprint
        .iter()
        .map(|&(name, f)| format!("{name} {:.3}", peak as f64 / f as f64))
        .collect();
    eprintln!(
        "  utilisation (peak live ÷ footprint): {}  [{range_note}]",
        util.join(", ")
    );
    eprintln!(
        "  footprint GiB: {}",
        footprint
            .iter()
            .map(|&(name, f)| format!("{name} {:.3}", gib(f)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let per_pair = |n: u64| n as f64 / pairs as f64;
    eprintln!(
        "  vmm device calls in one pass: {} memory calls ({:.4} per pair): map/unmap/set_access {}, create/release {}, reserve {}; counters {:?}",
        vmm_calls.memory_calls(),
        per_pair(vmm_calls.memory_calls()),
        vmm_calls.vm_map,
        vmm_calls.vm_physical,
        vmm_calls.vm_reserve,
        s.vmm.counters(),
    );
    for method in methods() {
        pass_table(s, w, label, method);
    }
}

fn steady(c: &mut Criterion, label: &str, max_size: u64) {
    let w = steady_workload(0x5eed_0016, max_size);
    let pairs = w.allocs as u64;
    let (peak, peak_blocks) = peak_live(&w);
    let mut s = Steady::new(&w);
    let gib = |b: u64| b as f64 / GIB as f64;
    eprintln!(
        "churn/steady/{label}: {} ops, {pairs} allocate+free pairs, peak live {:.3} GiB (256-rounded) in up to {peak_blocks} blocks",
        w.ops.len(),
        gib(peak)
    );

    // `CHURN_PROFILE=<contender>[,runs]`: only that contender over the whole sequence, `runs`
    // times (1 unless given), for `valgrind --tool=cachegrind` / callgrind — no table, no
    // criterion.
    if let Ok(spec) = std::env::var("CHURN_PROFILE") {
        let (name, runs) = spec.split_once(',').unwrap_or((&spec, "1"));
        let runs: usize = runs.parse().expect("CHURN_PROFILE=<contender>[,runs]");
        let name = CONTENDERS
            .iter()
            .find(|&&c| c == name)
            .expect("CHURN_PROFILE names a contender");
        for _ in 0..runs {
            black_box(s.run(name, &w.ops));
        }
        eprintln!("churn/steady/{label}: {name} ran {runs} time(s) (CHURN_PROFILE)");
        return;
    }
    // `--test` (one iteration each, as `cargo test --benches` runs) and `--list` want no
    // measurement, `--profile-time` only criterion's loop under a profiler: skip the
    // utilisation and the passes (a minute or more).
    if !std::env::args().any(|a| a == "--test" || a == "--list" || a == "--profile-time") {
        report_steady(&mut s, &w, (peak, peak_blocks), label);
        eprintln!(
            "churn/steady/{label}: criterion below times each allocator alone, for regression checks \
             (--save-baseline / --baseline) and profiling (--profile-time); the comparison is the \
             pass table above — criterion's medians are taken minutes apart, not to be divided"
        );
    }

    // `CHURN_TABLE_ONLY=1`: the table (and utilisation) without criterion's samples.
    if std::env::var_os("CHURN_TABLE_ONLY").is_some_and(|v| v == "1") {
        return;
    }
    // Criterion: the full sequence per iteration, one iteration per sample.
    let mut g = c.benchmark_group(format!("churn/steady/{label}"));
    g.throughput(Throughput::Elements(pairs))
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(std::time::Duration::from_secs(1));
    for name in &CONTENDERS[..ALLOCATORS] {
        g.bench_function(*name, |b| b.iter(|| s.run(name, &w.ops)));
    }
    g.finish();
    assert_eq!(s.bfc.live_count(), 0);
    assert_eq!(s.vmm.live_count(), 0);
}

/// The strategies of the two-stream regime: name, strategy kind, preallocate.
const TWO_STREAM_STRATEGIES: [(&str, portalloc::StrategyKind, bool); 5] = [
    ("bfc", portalloc::StrategyKind::Bfc, true),
    ("bfc_grow", portalloc::StrategyKind::Bfc, false),
    ("vmm", portalloc::StrategyKind::Vmm, false),
    ("async", portalloc::StrategyKind::Async, true),
    ("platform", portalloc::StrategyKind::Platform, false),
];
const TWO_STREAM_STEPS: usize = 20_000;
const IN_FLIGHT: usize = 32;
const T_LIVE: usize = 64;

/// One two-stream run (see the module docs) on a fresh simulated device: the device's CPU
/// waits, GPU-side waits and hazards, and the requests made.
fn two_streams_run(
    kind: portalloc::StrategyKind,
    preallocate: bool,
    sizes: &[(u64, u64)],
) -> (u64, u64, u64, u64) {
    use std::collections::VecDeque;
    let host = Arc::new(
        HostDevice::builder()
            .capacity(64 * GIB)
            .simulated(true)
            .build()
            .unwrap(),
    );
    let config = portalloc::Config::builder()
        .ignore_env()
        .strategy(kind)
        .mem_fraction(0.75)
        .preallocate(preallocate)
        .build()
        .unwrap();
    let allocator =
        portalloc::strategy::build(&config, Arc::clone(&host) as Arc<dyn portalloc::Device>)
            .unwrap();
    // SAFETY: the host device only compares stream handles.
    let (s, t) = unsafe { (Stream::from_raw(0x5000), Stream::from_raw(0x6000)) };
    let before = host.cpu_waits();
    let mut kernels: VecDeque<u64> = VecDeque::new();
    let mut on_t: VecDeque<Allocation> = VecDeque::new();
    let mut requests = 0u64;
    for &(x_size, y_size) in sizes {
        let x = allocator.allocate(x_size, 0, s, "s").unwrap();
        kernels.push_back(host.launch(s, x.ptr(), x.size()));
        allocator.deallocate(x).unwrap();
        let y = allocator.allocate(y_size, 0, t, "t").unwrap();
        on_t.push_back(y);
        requests += 2;
        if on_t.len() > T_LIVE {
            allocator.deallocate(on_t.pop_front().unwrap()).unwrap();
        }
        if kernels.len() > IN_FLIGHT {
            host.finish(kernels.pop_front().unwrap());
        }
    }
    let after = host.cpu_waits();
    for k in kernels {
        host.finish(k);
    }
    for y in on_t {
        allocator.deallocate(y).unwrap();
    }
    drop(allocator);
    let (hazards, _) = host.hazards();
    (after.0 - before.0, after.1 - before.1, hazards, requests)
}

fn two_streams(c: &mut Criterion) {
    let mut rng = SmallRng::seed_from_u64(0x2_57ea_u64);
    let sizes: Vec<(u64, u64)> = (0..TWO_STREAM_STEPS)
        .map(|_| {
            (
                rng.gen_range(256..=256 * KIB),
                rng.gen_range(256..=256 * KIB),
            )
        })
        .collect();
    if !std::env::args().any(|a| a == "--test" || a == "--list") {
        eprintln!(
            "churn/two_streams: {TWO_STREAM_STEPS} steps (free on S under a kernel, request on T), \
             {IN_FLIGHT} kernels in flight, limit 48 GiB"
        );
        for (name, kind, preallocate) in TWO_STREAM_STRATEGIES {
            let (cpu, gpu, hazards, requests) = two_streams_run(kind, preallocate, &sizes);
            let per = |n: u64| n as f64 * 1000.0 / requests as f64;
            eprintln!(
                "  {name:<9} CPU waits {:>8.2} / 1,000 requests, GPU-side waits {:>8.2} / 1,000, hazards {hazards}",
                per(cpu),
                per(gpu)
            );
        }
    }
    let mut g = c.benchmark_group("churn/two_streams");
    g.throughput(Throughput::Elements(sizes.len() as u64 * 2))
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10);
    for (name, kind, preallocate) in TWO_STREAM_STRATEGIES {
        g.bench_function(name, |b| {
            b.iter(|| black_box(two_streams_run(kind, preallocate, &sizes)))
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    if wanted("two_streams") {
        two_streams(c);
    }
    if !std::env::args().any(|a| a.contains("two_streams")) {
        churn(c, "1MiB", MIB, 8 * GIB);
        churn(c, "64MiB", 64 * MIB, 512 * GIB);
    }
    for (label, max_size) in [("64KiB", 64 * KIB), ("4MiB", 4 * MIB)] {
        // The steady regime's set-up (the sequence, the utilisation and ratio passes) takes
        // a minute or more: skip it when criterion's filter excludes its benchmarks.
        if wanted(&format!("steady/{label}")) {
            steady(c, label, max_size);
        }
    }
}

criterion_group!(churn_group, benches);
criterion_main!(churn_group);
