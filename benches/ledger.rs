//! The ledger's cost on bfc: allocate+free pairs with and without it, in one run.
//!
//! `cargo bench --bench ledger -- --warm-up-time 1 --measurement-time 3`
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use portalloc::adaptor::{LedgerAllocator, LedgerOptions};
use portalloc::backends::host::HostDevice;
use portalloc::replay::preset;
use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
use portalloc::{Allocator, Stream};
use std::sync::Arc;

fn bfc() -> BfcAllocator<HostDevice> {
    let dev = Arc::new(preset::custom(1 << 30).host_device().unwrap());
    BfcAllocator::new(
        dev,
        BfcOptions {
            limit: 512 << 20,
            preallocate: true,
        },
    )
    .unwrap()
}

fn pairs<A: Allocator>(c: &mut Criterion, name: &str, a: &A) {
    // A steady working set of 256 live buffers, so the free index is not empty.
    let live: Vec<_> = (0..256u64)
        .map(|i| {
            a.allocate(4096 + i * 256, 0, Stream::DEFAULT, "buffer")
                .unwrap()
        })
        .collect();
    let mut i = 0u64;
    c.bench_function(name, |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let x = a
                .allocate(
                    black_box(1024 + (i & 63) * 256),
                    0,
                    Stream::DEFAULT,
                    "workspace",
                )
                .unwrap();
            a.deallocate(x).unwrap();
        })
    });
    for x in live {
        a.deallocate(x).unwrap();
    }
}

fn bench(c: &mut Criterion) {
    pairs(c, "bfc alloc+free", &bfc());
    pairs(c, "ledger(bfc) alloc+free", &LedgerAllocator::new(bfc()));
    pairs(
        c,
        "ledger(bfc, unmeasured rounding) alloc+free",
        &LedgerAllocator::with_options(
            bfc(),
            LedgerOptions {
                measure_rounding: false,
                ..LedgerOptions::default()
            },
        ),
    );
}
criterion_group!(benches, bench);
criterion_main!(benches, benches2);

struct Nop;
impl Allocator for Nop {
    fn name(&self) -> &str {
        "nop"
    }
    fn id(&self) -> u64 {
        999_999
    }
    fn allocate(
        &self,
        size: u64,
        _: u64,
        s: Stream,
        _: &str,
    ) -> portalloc::Result<portalloc::Allocation> {
        Ok(portalloc::Allocation::new(4096, size, s, 999_999, 0))
    }
    fn deallocate(&self, _a: portalloc::Allocation) -> portalloc::Result<()> {
        Ok(())
    }
    fn stats(&self) -> portalloc::Stats {
        portalloc::Stats::default()
    }
    fn trim(&self) -> portalloc::Result<u64> {
        Ok(0)
    }
}
fn bench2(c: &mut Criterion) {
    let m = std::sync::Mutex::new(0u64);
    c.bench_function("mutex lock+unlock x2", |b| {
        b.iter(|| {
            *m.lock().unwrap() += 1;
            *m.lock().unwrap() += 1;
        })
    });
    pairs(c, "nop", &Nop);
    pairs(
        c,
        "ledger(nop) unmeasured",
        &LedgerAllocator::with_options(
            Nop,
            LedgerOptions {
                measure_rounding: false,
                ..LedgerOptions::default()
            },
        ),
    );
}
criterion_group!(benches2, bench2);
