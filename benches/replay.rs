//! Replay throughput: events per second through each strategy on the simulated host device,
//! single thread (target: ≥ 5 million events/s for bfc).
//!
//! `cargo bench --bench replay -- --warm-up-time 1 --measurement-time 3`
//!
//! The trace is synthetic and seeded: a training-like mix of many small and few large
//! allocations with short and long lifetimes (200,000 events).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use portalloc::replay::{preset, replay, Baseline, ReplayOptions, ReplayStrategy, TraceInput};
use portalloc::trace::{Event, Op, TraceHeader};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const EVENTS: usize = 200_000;

fn synthetic() -> Vec<Event> {
    let mut rng = SmallRng::seed_from_u64(42);
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut events = Vec::with_capacity(EVENTS);
    let mut next_id = 0u64;
    while events.len() < EVENTS {
        let seq = events.len() as u64;
        let allocate = live.len() < 64 || (live.len() < 4096 && rng.gen_bool(0.5));
        if allocate {
            let size = if rng.gen_bool(0.9) {
                rng.gen_range(256..=256 << 10)
            } else {
                rng.gen_range(1 << 20..=64 << 20)
            };
            live.push((next_id, size));
            events.push(Event {
                seq,
                time_ns: seq,
                thread: 0,
                stream: 0,
                op: Op::Alloc,
                id: next_id,
                size,
                tag: 0,
            });
            next_id += 1;
        } else {
            // Mostly recent allocations die first, as temporaries do.
            let n = live.len();
            let i = if rng.gen_bool(0.8) {
                n - 1 - rng.gen_range(0..n.min(16))
            } else {
                rng.gen_range(0..n)
            };
            let (id, size) = live.swap_remove(i);
            events.push(Event {
                seq,
                time_ns: seq,
                thread: 0,
                stream: 0,
                op: Op::Free,
                id,
                size,
                tag: 0,
            });
        }
    }
    events
}

fn bench(c: &mut Criterion) {
    let input = TraceInput::Events {
        header: TraceHeader::new("synthetic"),
        events: Arc::new(synthetic()),
    };
    let baseline = Baseline::scan(&input).expect("scan");
    let options = ReplayOptions {
        device: preset("h100-80g").expect("preset"),
        fraction: 1.0,
        samples: 0,
        sleep_tags: 0,
    };
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.sample_size(10);
    for strategy in [
        ReplayStrategy::Bfc,
        ReplayStrategy::BfcGrow,
        ReplayStrategy::Vmm,
        ReplayStrategy::Platform,
    ] {
        match replay(&input, &baseline, strategy, &options, None) {
            // Measure the allocator's path, never its out-of-memory path.
            Ok(r) => assert_eq!(r.oom_count, 0, "{}: the trace must fit", strategy.name()),
            Err(e) => {
                eprintln!("{}: {e}; skipped", strategy.name());
                continue;
            }
        }
        group.bench_function(strategy.name(), |b| {
            b.iter(|| replay(&input, &baseline, strategy, &options, None).expect("replay"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
