//! The ledger adaptor: live allocations, totals and peaks by tag, JSON round trip, backtraces
//! only when asked, and donation.

use std::sync::Arc;

use crate::support::common::{bfc, refused_free, simulated_host};
use portalloc::adaptor::{LedgerAllocator, LedgerOptions, LedgerSnapshot, BACKTRACE_VARIABLE};
use portalloc::backends::host::HostDevice;
use portalloc::strategy::bfc::BfcAllocator;
use portalloc::strategy::platform::PlatformAllocator;
use portalloc::{Allocator, Error, Stream};

const MIB: u64 = 1 << 20;

fn bfc_ledger(options: LedgerOptions) -> LedgerAllocator<BfcAllocator<HostDevice>> {
    let bfc = bfc(&simulated_host(256 * MIB), 64 * MIB, false);
    LedgerAllocator::with_options(bfc, options)
}

#[test]
fn live_lists_every_allocation_oldest_first() {
    let l = bfc_ledger(LedgerOptions::default());
    let a = l
        .allocate(1000, 0, crate::support::stream(3), "buffer")
        .unwrap();
    let b = l.allocate(MIB, 0, Stream::DEFAULT, "workspace").unwrap();
    let c = l.allocate(0, 0, Stream::DEFAULT, "buffer").unwrap();
    let live = l.live();
    assert_eq!(live.len(), 3);
    assert_eq!(
        live.iter().map(|x| x.seq).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(live[0].ptr, a.ptr());
    assert_eq!(live[0].size, 1000);
    assert_eq!(live[0].rounded, 1024, "bfc rounds to 256 B");
    assert_eq!(live[0].stream, 3);
    assert_eq!(live[0].tag, "buffer");
    assert_eq!(live[1].tag, "workspace");
    // bfc does not split a chunk smaller than twice the request: it charges the whole chunk.
    assert!(live[1].rounded >= MIB);
    assert_eq!(
        live.iter().map(|x| x.rounded).sum::<u64>(),
        l.stats().bytes_in_use
    );
    assert_eq!((live[2].size, live[2].rounded), (0, 0));
    assert!(live.iter().all(|x| x.backtrace.is_none()));
    l.check_invariants().unwrap();
    l.deallocate(b).unwrap();
    assert_eq!(
        l.live().iter().map(|x| x.seq).collect::<Vec<_>>(),
        vec![0, 2]
    );
    l.deallocate(a).unwrap();
    l.deallocate(c).unwrap();
    assert!(l.live().is_empty());
    l.check_invariants().unwrap();
}

#[test]
fn totals_and_peaks_by_tag_on_a_scripted_sequence() {
    let l = bfc_ledger(LedgerOptions::default());
    // buffers: 3 × 1 MiB live at peak, 1 at the end; workspace: 4 MiB then 2 MiB, peak 4.
    let b1 = l.allocate(MIB, 0, Stream::DEFAULT, "buffer").unwrap();
    let b2 = l.allocate(MIB, 0, Stream::DEFAULT, "buffer").unwrap();
    let w1 = l
        .allocate(4 * MIB, 0, Stream::DEFAULT, "workspace")
        .unwrap();
    let b3 = l.allocate(MIB, 0, Stream::DEFAULT, "buffer").unwrap();
    l.deallocate(w1).unwrap();
    let w2 = l
        .allocate(2 * MIB, 0, Stream::DEFAULT, "workspace")
        .unwrap();
    l.deallocate(b1).unwrap();
    l.deallocate(b2).unwrap();

    let buf = l.tag("buffer");
    assert_eq!(
        (buf.live, buf.bytes, buf.peak_bytes, buf.allocations),
        (1, MIB, 3 * MIB, 3)
    );
    let ws = l.tag("workspace");
    assert_eq!(
        (ws.live, ws.bytes, ws.peak_bytes, ws.allocations),
        (1, 2 * MIB, 4 * MIB, 2)
    );
    assert_eq!(ws.rounded_bytes, 2 * MIB);
    let never = l.tag("never");
    assert_eq!((never.live, never.bytes, never.allocations), (0, 0, 0));
    // Largest live first.
    assert_eq!(
        l.tags().iter().map(|t| t.tag.as_str()).collect::<Vec<_>>(),
        vec!["workspace", "buffer"]
    );
    // The rounded totals account for every byte the upstream has in use.
    let rounded: u64 = l.tags().iter().map(|t| t.rounded_bytes).sum();
    assert_eq!(rounded, l.stats().bytes_in_use);
    // The ledger passes the upstream's pool size through, as its stats do.
    assert_eq!(l.pool_bytes(), l.stats().pool_bytes);
    l.check_invariants().unwrap();
    l.deallocate(b3).unwrap();
    l.deallocate(w2).unwrap();
    assert_eq!(l.stats().bytes_in_use, 0);
}

#[test]
fn rounded_size_is_what_the_upstream_charged() {
    // Platform rounds to 256 B; bfc charges whole chunks.
    let p = LedgerAllocator::new(PlatformAllocator::new(simulated_host(256 * MIB), None));
    let a = p.allocate(300, 0, Stream::DEFAULT, "t").unwrap();
    assert_eq!(p.lookup(&a).unwrap().rounded, 512);
    p.deallocate(a).unwrap();
    let unmeasured = LedgerAllocator::with_options(
        PlatformAllocator::new(simulated_host(256 * MIB), None),
        LedgerOptions {
            measure_rounding: false,
            ..LedgerOptions::default()
        },
    );
    let a = unmeasured.allocate(300, 0, Stream::DEFAULT, "t").unwrap();
    assert_eq!(unmeasured.lookup(&a).unwrap().rounded, 300);
    unmeasured.deallocate(a).unwrap();
}

#[test]
fn json_round_trip() {
    let l = bfc_ledger(LedgerOptions::default());
    let a = l
        .allocate(5000, 0, crate::support::stream(7), "kv-cache")
        .unwrap();
    let b = l.allocate(MIB, 0, Stream::DEFAULT, "workspace").unwrap();
    let b = l.donate(b, "output").unwrap();
    let snap = l.snapshot();
    let json = snap.to_json();
    let back = LedgerSnapshot::from_json(&json).unwrap();
    assert_eq!(back, snap);
    assert_eq!(back.allocator, "bfc");
    assert_eq!(back.live.len(), 2);
    assert_eq!(back.live[0].tag, "kv-cache");
    assert_eq!(back.live[1].donated_from.as_deref(), Some("workspace"));
    assert_eq!(back.tag("output").unwrap().donated_in, 1);
    assert_eq!(back.tag("workspace").unwrap().donated_out, 1);
    assert_eq!(back.upstream.bytes_in_use, l.stats().bytes_in_use);
    assert_eq!(back.donations, 1);
    assert!(LedgerSnapshot::from_json("{\"not\": \"a ledger\"}").is_err());
    l.deallocate(a).unwrap();
    l.deallocate(b).unwrap();
}

#[test]
fn backtrace_captured_only_when_asked() {
    let off = bfc_ledger(LedgerOptions::from_vars(|_| None).unwrap());
    let a = off.allocate(256, 0, Stream::DEFAULT, "t").unwrap();
    assert!(off.live()[0].backtrace.is_none());
    off.deallocate(a).unwrap();

    let on = bfc_ledger(
        LedgerOptions::from_vars(|n| (n == BACKTRACE_VARIABLE).then(|| "1".to_string())).unwrap(),
    );
    assert!(on.options().backtrace);
    let a = on.allocate(256, 0, Stream::DEFAULT, "t").unwrap();
    let bt = on.live()[0].backtrace.clone().expect("a backtrace");
    assert!(!bt.is_empty());
    on.deallocate(a).unwrap();

    for off_value in ["0", "false", "OFF", ""] {
        let o = LedgerOptions::from_vars(|_| Some(off_value.to_string())).unwrap();
        assert!(!o.backtrace, "{off_value:?}");
    }
    match LedgerOptions::from_vars(|_| Some("sometimes".to_string())) {
        Err(Error::Config { variable, .. }) => assert_eq!(variable, BACKTRACE_VARIABLE),
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn donation_moves_the_buffer_and_its_bytes() {
    let l = bfc_ledger(LedgerOptions::default());
    let input = l.allocate(2 * MIB, 0, Stream::DEFAULT, "input").unwrap();
    let ptr = input.ptr();
    let in_use = l.stats().bytes_in_use;
    // The move consumes the giver's allocation: using `input` afterwards does not compile.
    let output = l.donate(input, "output").unwrap();
    assert_eq!(output.ptr(), ptr, "the consumer reuses the same memory");
    assert_eq!(output.size(), 2 * MIB);
    assert_eq!(l.stats().bytes_in_use, in_use, "no upstream call");
    let (i, o) = (l.tag("input"), l.tag("output"));
    assert_eq!((i.live, i.bytes, i.donated_out), (0, 0, 1));
    assert_eq!(
        (o.live, o.bytes, o.donated_in, o.allocations),
        (1, 2 * MIB, 1, 0)
    );
    let live = l.live();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].seq, 1, "the consumer's buffer is a new one");
    l.check_invariants().unwrap();

    // An allocation from elsewhere is refused.
    let other = bfc_ledger(LedgerOptions::default());
    let foreign = other.allocate(256, 0, Stream::DEFAULT, "t").unwrap();
    assert!(matches!(
        l.donate(foreign, "x"),
        Err(Error::ForeignAllocation { .. })
    ));
    l.deallocate(output).unwrap();
    assert_eq!(l.stats().bytes_in_use, 0);
}

#[test]
fn foreign_allocations_are_refused() {
    let l = bfc_ledger(LedgerOptions::default());
    let other = bfc_ledger(LedgerOptions::default());
    let a = other.allocate(256, 0, Stream::DEFAULT, "t").unwrap();
    assert!(matches!(
        refused_free(&l, a),
        Error::ForeignAllocation { .. }
    ));
}

#[test]
fn ledger_over_a_boxed_strategy() {
    let config = portalloc::Config::builder()
        .ignore_env()
        .host_capacity(64 * MIB)
        .host_simulated(true)
        .build()
        .unwrap();
    let dev: Arc<dyn portalloc::Device> = simulated_host(256 * MIB);
    let strategy = portalloc::strategy::build(&config, Arc::clone(&dev)).unwrap();
    let l = LedgerAllocator::from_boxed(strategy, LedgerOptions::default().with_config(&config))
        .with_device(dev);
    let a = l.allocate(MIB, 0, Stream::DEFAULT, "t").unwrap();
    assert_eq!(l.live_count(), 1);
    l.deallocate(a).unwrap();
    l.check_invariants().unwrap();
}

#[test]
fn concurrent_use_keeps_the_books() {
    let l = Arc::new(bfc_ledger(LedgerOptions::default()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let tag = format!("thread{t}");
                for i in 0..200u64 {
                    let a = l.allocate(256 + i * 64, 0, Stream::DEFAULT, &tag).unwrap();
                    l.deallocate(a).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    l.check_invariants().unwrap();
    assert_eq!(l.live_count(), 0);
    assert_eq!(l.snapshot().allocations_made, 800);
}
