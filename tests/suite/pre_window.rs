//! Memory live before a trace's window, as replay models it: what the file tells one by one
//! becomes blocks at their own sizes; what stays of unknown shape is held outside the pool and
//! counted against the device's capacity, so that it cannot create a pathology the program
//! could not have had (issue 27). Executable specifications.
#![cfg(all(feature = "replay", feature = "trace"))]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use portalloc::replay::{min_capacity, preset, Baseline, ReplayStrategy, TraceInput};
use portalloc::trace::{Event, Op, TraceHeader};
use test_case::test_case;

const MIB: u64 = 1 << 20;
const STEP: u64 = 2 * MIB;

/// `(op, id, size)` rows → a trace in memory with `baseline` bytes live before it, of which
/// `blocks` are known one by one.
fn trace(rows: &[(Op, u64, u64)], baseline: u64, blocks: &[u64]) -> TraceInput {
    let mut header = TraceHeader::new("test");
    header.baseline_bytes = baseline;
    header.pre_window_blocks = blocks.to_vec();
    let events = rows
        .iter()
        .enumerate()
        .map(|(i, &(op, id, size))| crate::support::event(i as u64, op, id, size))
        .collect();
    TraceInput::Events {
        header,
        events: Arc::new(events),
    }
}

use crate::support::replay::{device, run, STRATEGIES};

/// The shape of the BERT-small Kineto step of issue 27: 87 MiB of weights live before the
/// window and never freed in it (a Kineto trace tells only their total), then three steps
/// that each allocate nine 1 MiB activations and free them. Peak live, by hand: 87 + 9 =
/// 96 MiB.
fn bert_small_like() -> TraceInput {
    let mut rows = Vec::new();
    let mut id = 1;
    for _ in 0..3 {
        let first = id;
        for _ in 0..9 {
            rows.push((Op::Alloc, id, MIB));
            id += 1;
        }
        for k in first..id {
            rows.push((Op::Free, k, MIB));
        }
    }
    trace(&rows, 87 * MIB, &[])
}

fn min_capacity_of(input: &TraceInput, strategy: ReplayStrategy, peak_live: u64) -> u64 {
    let baseline = Baseline::scan(input).unwrap();
    min_capacity(input, &baseline, strategy, device(1 << 30), peak_live, STEP)
        .unwrap()
        .bytes
        .expect("a capacity runs it")
}

/// The BERT-small case: the 87 MiB of unknown shape held before the window no longer sits
/// in the pool as one block, where preallocated BFC's no-split rule (a free chunk under twice
/// the request is handed over whole) made every pool under 174 MiB serve nothing else, and
/// the min capacity was 174 MiB = 1.81 × peak live (measured before the change:
/// `portalloc replay bert-like.jsonl --min-capacity` of this trace gave bfc 182,452,224 B
/// on 100,663,296 B of peak live, bfc-grow 1.44 ×). Now it is held outside the pool, 88 MiB
/// of the device (87 rounded up to the 2 MiB granularity), and BFC's pool needs the window's
/// 9 MiB, in 2 MiB granules: 10 MiB. By hand: 88 + 10 = 98 MiB for preallocated BFC, and at
/// most 1.3 × peak live for every strategy.
#[test_case(ReplayStrategy::Bfc ; "bfc")]
#[test_case(ReplayStrategy::BfcGrow ; "bfc growing")]
#[test_case(ReplayStrategy::Vmm ; "vmm")]
#[test_case(ReplayStrategy::Async ; "async")]
#[test_case(ReplayStrategy::Platform ; "platform")]
fn memory_of_unknown_shape_before_the_window_costs_no_more_than_itself(strategy: ReplayStrategy) {
    let input = bert_small_like();
    let r = run(&input, strategy, 1 << 30, 1.0);
    assert_eq!(r.peak_live, 96 * MIB, "87 before + 9");
    assert_eq!(r.oom_count, 0);
    let bytes = min_capacity_of(&input, strategy, r.peak_live);
    let ratio = bytes as f64 / r.peak_live as f64;
    assert!(
        ratio <= 1.3,
        "{strategy:?}: min capacity {bytes} B = {ratio:.3} × peak live"
    );
    if strategy == ReplayStrategy::Bfc {
        assert_eq!(bytes, 98 * MIB, "88 MiB outside the pool + a 10 MiB pool");
    }
}

/// The memory of unknown shape is counted where a process holding it would see it: against
/// the device (the allocator's limit is the fraction of what is left, 0.5 × (1 GiB − 88 MiB)
/// for preallocated BFC), in peak reserved (so utilisation stays ≤ 1) and in peak live; and
/// the replay names the assumption.
#[test]
fn memory_of_unknown_shape_is_counted_against_the_device_and_named() {
    let input = bert_small_like();
    let baseline = Baseline::scan(&input).unwrap();
    assert_eq!(baseline.unknown_shape, 87 * MIB);
    assert_eq!(baseline.outside_pool(STEP), 88 * MIB);
    let text = baseline.assumption().expect("an assumption is made");
    assert!(
        text.contains(&(87 * MIB).to_string())
            && text.contains("unknown shape")
            && text.contains("outside the pool")
            && text.contains("capacity"),
        "{text}"
    );
    let r = run(&input, ReplayStrategy::Bfc, 1 << 30, 0.5);
    assert_eq!(r.outside_pool, 88 * MIB);
    assert_eq!(
        r.peak_reserved,
        88 * MIB + (1024 - 88) * MIB / 2,
        "outside + the pool preallocated at half of what is left"
    );
    assert!(r.utilisation <= 1.0, "{}", r.utilisation);
    // No memory of unknown shape: nothing named, nothing held outside.
    let plain = trace(&[(Op::Alloc, 1, MIB), (Op::Free, 1, MIB)], 0, &[]);
    assert_eq!(Baseline::scan(&plain).unwrap().assumption(), None);
    assert_eq!(
        run(&plain, ReplayStrategy::Bfc, 1 << 30, 1.0).outside_pool,
        0
    );
}

/// Memory of unknown shape that fills the device, or more than fills it: the replay runs
/// (no error, no panic), and counts the shortfall as a refused request made before the
/// window when it does not fit, or the window's requests as refused when no pool is left.
#[test_case(88 * MIB, 0, 9 ; "exactly the device: no pool, every request refused")]
#[test_case(64 * MIB, 1, 9 ; "more than the device: refused before the window, and no pool")]
fn memory_of_unknown_shape_past_the_device_is_refused_not_an_error(
    capacity: u64,
    refused_before: u64,
    refused_in_window_at_least: u64,
) {
    let input = bert_small_like();
    for strategy in STRATEGIES {
        let r = run(&input, strategy, capacity, 1.0);
        assert_eq!(
            r.peak_live,
            96 * MIB,
            "{strategy:?}: the demand, whatever was served"
        );
        assert!(
            r.oom_count >= refused_before + refused_in_window_at_least,
            "{strategy:?}: {} refused",
            r.oom_count
        );
        let first = r.first_failure.expect("a refusal");
        assert_eq!(first.seq.is_none(), refused_before == 1, "{strategy:?}");
    }
}

/// The header's blocks become the baseline's held blocks while they fit in what no free in
/// the window took; the rest is of unknown shape. By hand, for a baseline of 10 MiB whose
/// window frees 4 MiB of it: 6 MiB held.
#[test_case(&[3, 2], &[3, 2], 1 ; "blocks that fit, 1 MiB left unknown")]
#[test_case(&[3, 5, 2], &[3, 2], 1 ; "a block past what is left stays unknown")]
#[test_case(&[6], &[6], 0 ; "the blocks cover it all")]
#[test_case(&[0, 2], &[2], 4 ; "empty blocks dropped")]
#[test_case(&[], &[], 6 ; "no blocks: all of unknown shape")]
fn header_blocks_fill_the_held_baseline_in_order(blocks: &[u64], held: &[u64], unknown: u64) {
    let mib = |v: &[u64]| v.iter().map(|b| b * MIB).collect::<Vec<_>>();
    let input = trace(
        &[
            (Op::Alloc, 1, MIB),
            (Op::Free, 100, 4 * MIB),
            (Op::Free, 1, MIB),
        ],
        10 * MIB,
        &mib(blocks),
    );
    let b = Baseline::scan(&input).unwrap();
    assert_eq!(b.freed_in_window, vec![(100, 4 * MIB)]);
    assert_eq!(b.held, 6 * MIB);
    assert_eq!(b.held_blocks, mib(held));
    assert_eq!(b.unknown_shape, unknown * MIB);
}

/// Blocks known one by one are allocated through the strategy at their own sizes: 87 MiB
/// of weights as 87 blocks of 1 MiB fill the pool as the program's tensors did, and no
/// strategy needs more than 1.3 × peak live; every block is in the pool (nothing outside).
#[test_case(ReplayStrategy::Bfc ; "bfc")]
#[test_case(ReplayStrategy::BfcGrow ; "bfc growing")]
#[test_case(ReplayStrategy::Platform ; "platform")]
fn known_blocks_before_the_window_are_allocated_at_their_own_sizes(strategy: ReplayStrategy) {
    let TraceInput::Events { events, .. } = bert_small_like() else {
        unreachable!()
    };
    let mut header = TraceHeader::new("test");
    header.baseline_bytes = 87 * MIB;
    header.pre_window_blocks = vec![MIB; 87];
    let input = TraceInput::Events { header, events };
    let b = Baseline::scan(&input).unwrap();
    assert_eq!((b.held_blocks.len(), b.unknown_shape), (87, 0));
    let r = run(&input, strategy, 1 << 30, 1.0);
    assert_eq!((r.peak_live, r.outside_pool, r.oom_count), (96 * MIB, 0, 0));
    let bytes = min_capacity_of(&input, strategy, r.peak_live);
    assert!(
        bytes as f64 <= 1.3 * r.peak_live as f64,
        "{strategy:?}: {bytes} B"
    );
}

// ------------------------------------------------------------------ the shared traces

fn load(path: &Path) -> TraceInput {
    let mut t = portalloc::trace::open(path, &Default::default()).unwrap();
    let header = t.header().clone();
    let events: Vec<Event> = t.by_ref().collect::<Result<_, _>>().unwrap();
    TraceInput::Events {
        header,
        events: Arc::new(events),
    }
}

/// The shared snapshots: the blocks live at dump time that the window did not allocate,
/// as the importer carries them, against an independent reader. The oracle is Python's own
/// `pickle` module (globals read as None, no torch, no portalloc code): of the device with
/// the most `alloc` + `free_completed` entries, the addresses an `alloc` left live at the end
/// of `device_traces[d]` (not followed by a `free_completed` of the address); then, in
/// `segments` of that device, the blocks in state `active_allocated` or `active_pending_free`
/// whose `address` is not among them, counted with their `requested_size`:
///
/// ```text
/// gpt2-shape-eager:    227 blocks, 1,046,239,232 B (+ 2 frees of pre-window addresses, 327,680,004 B)
/// gpt2-small-compiled: 225 blocks, 1,540,737,024 B (+ 222 frees, 1,523,681,280 B)
/// decomfl-newest:        0 blocks, 0 B
/// verl-pending-free:   543 blocks, 25,483,614,352 B (no history: the whole baseline)
/// ```
///
/// (`scripts/snapshot-oracle FILE` prints these, "before the window: …"). In each, blocks +
/// frees = the baseline the same script prints: nothing is left of unknown shape.
#[test_case(false, "pytorch-snapshot-gpt2-shape-eager.pickle", 227, 1_046_239_232 ; "gpt2 eager")]
#[test_case(false, "pytorch-snapshot-gpt2-small-compiled.pickle", 225, 1_540_737_024 ; "gpt2 compiled")]
#[test_case(true, "pytorch-snapshot-decomfl-newest.pickle", 0, 0 ; "decomfl")]
#[test_case(true, "pytorch-snapshot-verl-pending-free.pickle", 543, 25_483_614_352 ; "verl pending free")]
fn snapshot_blocks_before_the_window_match_an_independent_reader(
    edge: bool,
    file: &str,
    blocks: usize,
    bytes: u64,
) {
    let Some(path) = crate::support::shared_trace(edge, file) else {
        return;
    };
    let input = load(&path);
    let h = input.header();
    assert_eq!(h.pre_window_blocks.len(), blocks, "{file}");
    assert_eq!(h.pre_window_blocks.iter().sum::<u64>(), bytes, "{file}");
    let b = Baseline::scan(&input).unwrap();
    assert_eq!(
        b.held_blocks, h.pre_window_blocks,
        "{file}: every block fits"
    );
    assert_eq!(b.unknown_shape, 0, "{file}: nothing of unknown shape");
}

/// Every shared trace with memory live before its window, every strategy replay runs by
/// default: the modelling of that memory keeps min capacity within 1.3 × peak live (issue
/// 27; before the change, measured with `portalloc replay --min-capacity`, the largest was
/// 1.107, async on gpt2-small-compiled). A trace with nothing before its window is not
/// modelled and not compared (the SOMAS lifetimes, decomfl); nor one whose peak live is
/// under 64 bisection steps, where the 2 MiB step alone decides the ratio.
#[test]
fn shared_traces_need_at_most_1_3_times_peak_live() {
    let mut files = Vec::new();
    for (variable, dir) in [
        ("PORTALLOC_TRACES", "traces"),
        ("PORTALLOC_TRACES_EDGE", "traces-edge"),
    ] {
        let Some(dir) = crate::support::shared_dir(variable, dir) else {
            continue;
        };
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x != "md"))
            .collect();
        found.sort();
        files.extend(found);
    }
    let h100 = preset("h100-80g").unwrap();
    for path in files {
        let input = load(&path);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if input.header().baseline_bytes == 0 {
            eprintln!("{name}: nothing live before the window: not compared");
            continue;
        }
        let baseline = Baseline::scan(&input).unwrap();
        for strategy in STRATEGIES {
            let r = crate::support::replay::on(&input, strategy, h100, 0.75);
            if r.peak_live < 64 * STEP {
                eprintln!("{name}: peak live {} B: not compared", r.peak_live);
                break;
            }
            let m = min_capacity(&input, &baseline, strategy, h100, r.peak_live, STEP).unwrap();
            let bytes = m.bytes.expect("a capacity runs it");
            let ratio = bytes as f64 / r.peak_live as f64;
            eprintln!("{name} {strategy:?}: {ratio:.3} × peak live");
            assert!(
                ratio <= 1.3,
                "{name} {strategy:?}: min capacity {bytes} B = {ratio:.3} × peak live {} B",
                r.peak_live
            );
        }
    }
}

// ------------------------------------------------------------------ the importers

fn open_bytes(bytes: Vec<u8>, name: &str) -> portalloc::trace::Result<portalloc::trace::Trace> {
    portalloc::trace::open_reader(std::io::Cursor::new(bytes), name, &Default::default())
}

/// A snapshot small enough to derive by hand. At dump time device 0 holds, at their
/// requested sizes: A (0x1000, 1000 B, never in the trace), B (0x2000, 2000 B, allocated by
/// the trace and live at its end), C (0x3000, 3000 B pending free, never in the trace), an
/// inactive block, and A' (0x5000, 0 B). The trace allocates B, allocates and frees D, and
/// frees E (0x4000, 4000 B, allocated before it). So: baseline = live at dump (1000 + 2000 +
/// 3000) − net (2000 + 500 − 500 − 4000) = 8000 B; blocks before the window known one by one:
/// A and C (E is freed in the window and replayed as a free of memory from before it); none
/// of unknown shape.
fn small_snapshot() -> Vec<u8> {
    use serde_pickle::{HashableValue, SerOptions, Value};
    let s = |t: &str| Value::String(t.to_string());
    let dict = |pairs: Vec<(&str, Value)>| {
        Value::Dict(
            pairs
                .into_iter()
                .map(|(k, v)| (HashableValue::String(k.to_string()), v))
                .collect(),
        )
    };
    let block = |address: i64, requested: i64, state: &str| {
        dict(vec![
            ("address", Value::I64(address)),
            ("size", Value::I64((requested + 511) / 512 * 512)),
            ("requested_size", Value::I64(requested)),
            ("state", s(state)),
        ])
    };
    let entry = |action: &str, addr: i64, size: i64| {
        dict(vec![
            ("action", s(action)),
            ("addr", Value::I64(addr)),
            ("size", Value::I64(size)),
            ("stream", Value::I64(0)),
        ])
    };
    let root = dict(vec![
        (
            "segments",
            Value::List(vec![dict(vec![
                ("device", Value::I64(0)),
                ("address", Value::I64(0x1000)),
                ("total_size", Value::I64(2 << 20)),
                (
                    "blocks",
                    Value::List(vec![
                        block(0x1000, 1000, "active_allocated"),
                        block(0x2000, 2000, "active_allocated"),
                        block(0x3000, 3000, "active_pending_free"),
                        block(0x3c00, 512, "inactive"),
                        block(0x5000, 0, "active_allocated"),
                    ]),
                ),
            ])]),
        ),
        (
            "device_traces",
            Value::List(vec![Value::List(vec![
                entry("alloc", 0x2000, 2000),
                entry("alloc", 0x6000, 500),
                entry("free_completed", 0x6000, 500),
                entry("free_completed", 0x4000, 4000),
            ])]),
        ),
    ]);
    serde_pickle::value_to_vec(&root, SerOptions::new()).unwrap()
}

/// The snapshot importer carries the blocks live at dump time that the window did not
/// allocate, at their requested sizes, in the header; replay holds them one by one and
/// leaves nothing of unknown shape (derivation at [`small_snapshot`]).
#[test]
fn a_snapshots_blocks_from_before_the_window_are_carried_one_by_one() {
    let mut t = open_bytes(small_snapshot(), "small.pickle").unwrap();
    let header = t.header().clone();
    assert_eq!(header.baseline_bytes, 8000);
    assert_eq!(header.pre_window_blocks, vec![1000, 3000]);
    assert!(
        header.notes.iter().any(|n| n.contains("2 blocks")),
        "{:?}",
        header.notes
    );
    let events: Vec<Event> = t.by_ref().collect::<Result<_, _>>().unwrap();
    let input = TraceInput::Events {
        header,
        events: Arc::new(events),
    };
    let b = Baseline::scan(&input).unwrap();
    assert_eq!(
        b.freed_in_window.iter().map(|f| f.1).collect::<Vec<_>>(),
        vec![4000]
    );
    assert_eq!((b.held, b.unknown_shape), (4000, 0));
    assert_eq!(b.held_blocks, vec![1000, 3000]);
    assert_eq!(b.assumption(), None);
    // Peak live: 8000 before, + 2000 (B) + 500 (D) = 10,500 B.
    assert_eq!(
        run(&input, ReplayStrategy::Platform, 1 << 30, 1.0).peak_live,
        10_500
    );
}

/// The own format carries the blocks (a field added within version 1: written only when
/// there are some, so other traces are written byte for byte as before), reads them back,
/// and refuses a header whose blocks sum to more than its baseline.
#[test]
fn the_own_format_carries_the_blocks_and_refuses_more_than_the_baseline() {
    let mut header = TraceHeader::new("test");
    header.baseline_bytes = 5000;
    header.pre_window_blocks = vec![1000, 3000];
    let events = [Event {
        seq: 0,
        time_ns: 0,
        thread: 0,
        stream: 0,
        op: Op::Alloc,
        id: 1,
        size: 64,
        tag: 0,
    }];
    let mut out = Vec::new();
    portalloc::trace::export::write_portalloc(&mut out, &header, events.iter().copied().map(Ok))
        .unwrap();
    let text = String::from_utf8(out.clone()).unwrap();
    assert!(
        text.contains(r#""pre_window_blocks":[1000,3000]"#),
        "{text}"
    );
    let back = open_bytes(out, "blocks.jsonl").unwrap();
    assert_eq!(back.header().pre_window_blocks, vec![1000, 3000]);

    let mut plain = Vec::new();
    portalloc::trace::export::write_portalloc(&mut plain, &TraceHeader::new("test"), []).unwrap();
    assert!(!String::from_utf8(plain)
        .unwrap()
        .contains("pre_window_blocks"));

    let over = text.replace("[1000,3000]", "[1000,4001]");
    let e = open_bytes(over.into_bytes(), "over.jsonl")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pre_window_blocks") && e.contains("baseline_bytes") && e.contains("line 1"),
        "{e}"
    );
    let wraps = text.replace("[1000,3000]", &format!("[{},{}]", u64::MAX, u64::MAX));
    let e = open_bytes(wraps.into_bytes(), "wraps.jsonl")
        .unwrap_err()
        .to_string();
    assert!(e.contains("pre_window_blocks"), "{e}");
}
