//! The trace module's own behaviour as a caller reaches it: format sniffing, the own format's
//! reader over any buffered input, anomaly counts, summaries, XLA buffer assignments, and
//! the snapshot importer's two ways of feeding its entries.
//! (Tests that need the readers' private parts stay beside them in `src/trace`.)
#![cfg(feature = "trace")]

use std::io::{BufRead, Cursor, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use portalloc::trace::import::xla_dump::{BufferAssignment, MemoryStats};
use portalloc::trace::Result;
use portalloc::trace::{
    detect, jsonl::Reader, open, summarize_events, Anomalies, AnomalyKind, Event, Format, Loc, Op,
    Options, Trace,
};

// ---------------------------------------------------------------- sniffing

#[test]
fn detects_each_format() {
    assert_eq!(detect(b"\x80\x04\x95"), Some(Format::PytorchSnapshot));
    assert_eq!(
        detect(b"{\"format\":\"portalloc-trace\",\"version\":1}\n[0,0,0,0,\"a\",1,8]\n"),
        Some(Format::Portalloc)
    );
    assert_eq!(detect(b"{\n \"schemaVersion\": 1"), Some(Format::Kineto));
    assert_eq!(detect(b"[{\"name\":\"x\"}]"), Some(Format::Kineto));
    assert_eq!(
        detect(b"Thread,Time,Action,Pointer,Size,Stream\n"),
        Some(Format::RmmCsv)
    );
    assert_eq!(
        detect(b"id,lower,upper,size\n0,0,1,8\n"),
        Some(Format::LifetimesCsv)
    );
    assert_eq!(detect(b"hello world"), None);
    assert_eq!(detect(b""), None);
}

/// Protocol 0 and 1 pickles (no PROTO opcode) are sniffed from their opcodes; text that
/// starts with the same characters but not with opcodes that can follow them is not.
#[test_case::test_case(b"(dp0\nVsegments\np1\n", Some(Format::PytorchSnapshot) ; "protocol 0 dict")]
#[test_case::test_case(b"(lp0\nI1\na.", Some(Format::PytorchSnapshot) ; "protocol 0 list")]
#[test_case::test_case(b"(dVsegments\n", Some(Format::PytorchSnapshot) ; "protocol 0 dict, memo optimised away")]
#[test_case::test_case(b"}q\x00(X\x08\x00\x00\x00segments", Some(Format::PytorchSnapshot) ; "protocol 1 dict")]
#[test_case::test_case(b"]q\x00(K\x01", Some(Format::PytorchSnapshot) ; "protocol 1 list")]
#[test_case::test_case(b"}.", Some(Format::PytorchSnapshot) ; "protocol 1 empty dict")]
#[test_case::test_case(b"ccollections\ndeque\np0\n(tR", Some(Format::PytorchSnapshot) ; "GLOBAL")]
#[test_case::test_case(b"(draft) notes\n", None ; "text in parentheses")]
#[test_case::test_case(b"(data", None ; "MARK DICT then APPEND is no pickle")]
#[test_case::test_case(b"cat\ndog\nbird\n", None ; "lines of words")]
#[test_case::test_case(b"count\n5\n", None ; "a one-column CSV")]
#[test_case::test_case(b"} end", None ; "a brace then text")]
#[test_case::test_case(b"{\"traceEvents\":[]}", Some(Format::Kineto) ; "JSON still Kineto")]
fn sniffs_protocol_0_and_1_pickles(prefix: &[u8], format: Option<Format>) {
    assert_eq!(detect(prefix), format);
}

#[test]
fn format_names_round_trip() {
    for f in Format::ALL {
        assert_eq!(f.name().parse::<Format>().unwrap(), f);
    }
    assert!("xml".parse::<Format>().is_err());
}

#[test]
fn event_is_small() {
    assert!(std::mem::size_of::<Event>() <= 48);
}

// ---------------------------------------------------------------- the own format's blank lines

const HEADER: &str = "{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\",\"device\":null,\"baseline_bytes\":0,\"reference\":null,\"tags\":[],\"notes\":[]}\n";

/// A buffered reader that counts the `consume` calls made on it.
struct Counting {
    inner: Cursor<Vec<u8>>,
    consumes: Arc<AtomicUsize>,
}

impl Read for Counting {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf)
    }
}

impl BufRead for Counting {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, amt: usize) {
        self.consumes.fetch_add(1, Ordering::Relaxed);
        self.inner.consume(amt);
    }
}

fn read_all(text: String) -> (Result<Vec<Event>>, usize) {
    let consumes = Arc::new(AtomicUsize::new(0));
    let input = Counting {
        inner: Cursor::new(text.into_bytes()),
        consumes: Arc::clone(&consumes),
    };
    let events =
        Reader::new(Box::new(input), "t.jsonl", false).and_then(|r| r.collect::<Result<Vec<_>>>());
    (events, consumes.load(Ordering::Relaxed))
}

#[test]
fn a_run_of_blank_lines_is_skipped_in_bulk_not_line_by_line() {
    let blanks = "\n \r\n\t\n".repeat(100_000);
    let text = format!(
        "{HEADER}{blanks}[0,1,0,0,\"a\",1,8]\n{blanks}[1,2,0,0,\"f\",1,8]\n{blanks}{{\"end\":{{\"events\":2}}}}\n{blanks}"
    );
    let (events, consumes) = read_all(text);
    assert_eq!(events.unwrap().len(), 2);
    // 1.2 million blank lines; a handful of reads (each line read once costs one each).
    assert!(consumes < 100, "{consumes} consume calls");
}

#[test]
fn lines_after_blank_runs_keep_their_numbers_in_messages() {
    // Line 1 the header, 2..=4 blank, 5 an event whose leading spaces stay its own.
    let text = format!("{HEADER}\n  \n\t\n   [0,1,0,0,\"x\",1,8]\n");
    let message = read_all(text).0.unwrap_err().to_string();
    assert!(
        message.contains("t.jsonl: line 5: corrupt event"),
        "{message}"
    );
}

#[test]
fn trailing_spaces_without_a_newline_still_count_as_a_line_in_the_truncation_message() {
    let text = format!("{HEADER}\n\n   ");
    let message = read_all(text).0.unwrap_err().to_string();
    assert!(message.contains("ends after line 4"), "{message}");
}

// ---------------------------------------------------------------- anomalies and summaries

#[test]
fn merge_keeps_examples_bounded() {
    let mut a = Anomalies::new();
    let mut b = Anomalies::new();
    for i in 0..5 {
        a.record(AnomalyKind::ZeroSize, Loc::Line(i), "a");
        b.record(AnomalyKind::ZeroSize, Loc::Line(i), "b");
    }
    a.merge(&b);
    assert_eq!(a.count(AnomalyKind::ZeroSize), 10);
    assert_eq!(a.examples(AnomalyKind::ZeroSize).count(), 3);
    assert!(a.to_string().contains("10 × zero size"));
}

fn ev(seq: u64, op: Op, id: u64, size: u64) -> Result<Event> {
    Ok(Event {
        seq,
        time_ns: seq * 10,
        thread: 0,
        stream: id % 2,
        op,
        id,
        size,
        tag: 0,
    })
}

#[test]
fn peak_includes_baseline_and_pre_window_frees() {
    let events = vec![
        ev(0, Op::Alloc, 1, 100),
        ev(1, Op::Free, 99, 50), // from the baseline
        ev(2, Op::Alloc, 2, 30),
        ev(3, Op::Free, 1, 100),
        ev(4, Op::Free, 1, 100), // double free
    ];
    let s = summarize_events(200, events).unwrap();
    assert_eq!(s.allocs, 2);
    assert_eq!(s.frees, 2);
    assert_eq!(s.baseline_frees, 1);
    assert_eq!(s.peak_live_bytes, 300);
    assert_eq!(s.peak_live_in_window, 100);
    assert_eq!(s.peak_seq, Some(0));
    assert_eq!(s.final_live, 180);
    assert_eq!(s.max_alloc, 100);
    assert_eq!(s.bytes_allocated, 130);
    assert_eq!(s.distinct_streams, 2);
    assert_eq!(s.anomalies.count(AnomalyKind::DoubleFree), 1);
}

// ---------------------------------------------------------------- XLA buffer assignments

#[test]
fn parses_shapes_with_commas() {
    let text = "BufferAssignment:\n\
        allocation 0: size 8, parameter 1, shape |f32[2]| at ShapeIndex {0,1}, maybe-live-out:\n \
        value: <1 p @0> (size=8,offset=0): f32[2]{0}\n\
        allocation 1: size 56, output shape is |(f32[1,2], f32[])|, maybe-live-out:\n\
        allocation 2: size 100, preallocated-temp:\n";
    let ba = BufferAssignment::parse(text.as_bytes(), "t").unwrap();
    assert_eq!(ba.allocations.len(), 3);
    assert_eq!(ba.allocations[0].parameter, Some(1));
    let s = ba.stats();
    assert_eq!(
        s,
        MemoryStats {
            argument_bytes: 8,
            output_bytes: 64,
            alias_bytes: 8,
            temp_bytes: 100
        }
    );
    assert_eq!(s.peak_bytes(), 164);
}

// ---------------------------------------------------------------- real snapshots

/// The real snapshots (`../shared/traces*/`, absent from a fresh clone), sorted.
fn real_snapshots() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for (variable, dir) in [
        ("PORTALLOC_TRACES", "traces"),
        ("PORTALLOC_TRACES_EDGE", "traces-edge"),
    ] {
        let Some(dir) = crate::support::shared_dir(variable, dir) else {
            continue;
        };
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
            .collect();
        paths.sort();
        found.extend(paths);
    }
    found
}

/// `path` opened with `options` and read to its end.
fn read_to_end(path: &Path, options: &Options) -> Result<(Trace, Vec<Event>)> {
    let mut t = open(path, options)?;
    let events = t.by_ref().collect::<Result<Vec<_>>>()?;
    Ok((t, events))
}

/// The real snapshots read in strict mode (every entry kept, then fed once the baseline
/// is known) and not (fed as read until the first free that draws on the baseline; the
/// GPT-2 ones have such frees a quarter of the way in, decomfl none): the same events and
/// anomalies, where strict mode finds no defect.
#[test]
fn feeding_while_reading_matches_feeding_after() {
    let mut compared = 0;
    for path in real_snapshots() {
        let (lax, lax_events) = read_to_end(&path, &Options::default()).unwrap();
        let strict = Options {
            strict: true,
            ..Options::default()
        };
        let Ok((kept, kept_events)) = read_to_end(&path, &strict) else {
            continue;
        };
        let name = path.display();
        assert_eq!(lax_events, kept_events, "{name}");
        assert_eq!(lax.anomalies(), kept.anomalies(), "{name}");
        assert_eq!(lax.header().baseline_bytes, kept.header().baseline_bytes);
        assert_eq!(lax.header().notes, kept.header().notes);
        compared += 1;
    }
    eprintln!("{compared} real snapshots compared");
}
