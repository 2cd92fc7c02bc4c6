//! The list of segments `torch.cuda.memory_snapshot()` returns, pickled as users pickle it
//! (`pickle.dump(torch.cuda.memory_snapshot(), f)`): no events, the state of the device at one
//! moment. It reads as a snapshot whose `device_traces` hold nothing: every block live then
//! is memory from before the window, known one by one, which replay holds; so
//! `portalloc replay FILE --min-capacity` says what each strategy needs to hold that state.
//! Before, "a valid pickle, but of a list".
//!
//! The fixtures (`tests/data/not-a-trace/segment-list-protocol{2,4}.pickle`) were written by
//! Python's own `pickle` module (`tests/data/not-a-trace/make.py`), with the keys and value
//! types torch gives its segment and block dicts. What they hold, from make.py:
//!
//! ```text
//! device 0, segment 1 (large, 20 MiB): 8 MiB active_allocated, requested 8,000,000
//!                                      4 MiB active_pending_free, requested 4,194,304
//!                                      8 MiB inactive
//! device 0, segment 2 (small, 2 MiB):  512 B active_allocated, requested 400
//!                                      1 KiB active_allocated, requested 1,000
//!                                      the rest inactive
//! device 1, segment 3 (small, 2 MiB):  512 B active_allocated, requested 100
//!                                      the rest inactive
//! ```
#![cfg(all(feature = "replay", feature = "trace"))]

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use portalloc::replay::{min_capacity, Baseline, TraceInput};
use portalloc::trace::{self, Event, Options, TraceErrorKind};
use test_case::test_case;

use crate::support::replay::{device, run, STRATEGIES};

/// Live on device 0, by hand: the requested sizes of its blocks live at that moment, both
/// states that hold memory (as a snapshot's pre-window blocks are counted): the
/// active_allocated 8,000,000 + 400 + 1,000 = 8,001,400, and the active_pending_free
/// 4,194,304, whose memory waits for its streams: 8,001,400 + 4,194,304 = 12,195,704.
const DEVICE_0_LIVE: u64 = 12_195_704;
/// Device 0's blocks live at that moment, in the segments' order.
const DEVICE_0_BLOCKS: [u64; 4] = [8_000_000, 4_194_304, 400, 1_000];
/// Reserved on device 0: its segments' total_size, 20 MiB + 2 MiB.
const DEVICE_0_RESERVED: u64 = 22 << 20;

fn path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/not-a-trace")
        .join(name)
}

/// The file read with `options`, as replay takes it.
fn load(name: &str, options: &Options) -> TraceInput {
    let mut t = trace::open(path(name), options).unwrap_or_else(|e| panic!("{name}: {e}"));
    let header = t.header().clone();
    let events: Vec<Event> = t.by_ref().collect::<Result<_, _>>().unwrap();
    TraceInput::Events {
        header,
        events: Arc::new(events),
    }
}

fn on_device(d: u32) -> Options {
    let mut options = Options::new();
    options.device = Some(d);
    options
}

/// A segment list reads as the state of one device: no events; the baseline is what was
/// live, each live block with an address known one by one (none of unknown shape); the
/// segments' total_size is the reference's reserved bytes; and the header says it was a
/// segment list. The device: the one with the most live blocks (device 0, four against one),
/// or the one asked for.
#[test_case("segment-list-protocol2.pickle", None, "cuda:0", DEVICE_0_LIVE, &DEVICE_0_BLOCKS, DEVICE_0_RESERVED ; "protocol 2, device 0 chosen")]
#[test_case("segment-list-protocol4.pickle", None, "cuda:0", DEVICE_0_LIVE, &DEVICE_0_BLOCKS, DEVICE_0_RESERVED ; "protocol 4, device 0 chosen")]
#[test_case("segment-list-protocol4.pickle", Some(1), "cuda:1", 100, &[100], 2 << 20 ; "device 1 asked for")]
fn a_segment_list_reads_as_the_state_of_its_device(
    file: &str,
    asked: Option<u32>,
    device_name: &str,
    live: u64,
    blocks: &[u64],
    reserved: u64,
) {
    let options = asked.map_or_else(Options::new, on_device);
    let input = load(file, &options);
    let TraceInput::Events { header, events } = &input else {
        unreachable!()
    };
    assert!(events.is_empty(), "{} events", events.len());
    assert_eq!(header.device.as_deref(), Some(device_name));
    assert_eq!(header.baseline_bytes, live);
    assert_eq!(header.pre_window_blocks, blocks);
    assert_eq!(
        header.reference.as_ref().and_then(|r| r.reserved_bytes),
        Some(reserved)
    );
    assert!(
        header.notes[0].contains("a segment list (torch.cuda.memory_snapshot(), pickled)")
            && header.notes[0].contains("no events"),
        "{:?}",
        header.notes
    );
    assert!(header.source.ends_with(file), "{}", header.source);
}

/// Replayed, every strategy holds the state: peak live is what was live, nothing is refused,
/// and the search for the least capacity that runs it (what `--min-capacity` prints) finds
/// one, no less than what was live.
#[test_case("segment-list-protocol2.pickle" ; "protocol 2")]
#[test_case("segment-list-protocol4.pickle" ; "protocol 4")]
fn a_segment_lists_state_is_held_by_every_strategy(file: &str) {
    let input = load(file, &Options::new());
    let baseline = Baseline::scan(&input).unwrap();
    assert_eq!(baseline.held_blocks, DEVICE_0_BLOCKS);
    assert_eq!(baseline.unknown_shape, 0);
    for strategy in STRATEGIES {
        let r = run(&input, strategy, 1 << 30, 1.0);
        assert_eq!(r.peak_live, DEVICE_0_LIVE, "{strategy:?}");
        assert_eq!(r.oom_count, 0, "{strategy:?}");
        let m = min_capacity(
            &input,
            &baseline,
            strategy,
            device(1 << 30),
            r.peak_live,
            2 << 20,
        )
        .unwrap();
        let bytes = m.bytes.expect("a capacity holds it");
        assert!(bytes >= DEVICE_0_LIVE, "{strategy:?}: {bytes} B");
    }
}

/// A device asked for that has no segment in the list is a selection error naming the
/// devices it has.
#[test]
fn a_device_the_segment_list_lacks_is_named() {
    match trace::open(path("segment-list-protocol4.pickle"), &on_device(3)) {
        Err(e) => {
            assert_eq!(e.kind(), TraceErrorKind::Selection);
            assert!(
                e.message()
                    .contains("no device 3: the segment list (torch.cuda.memory_snapshot()) has segments of devices 0, 1"),
                "{e}"
            );
        }
        Ok(_) => panic!("read"),
    }
}

/// A list whose items are not segment dicts (no `blocks` list, no `total_size`) stays
/// refused as a list.
#[test_case("list-of-dicts.pickle" ; "dicts with a device and an address only")]
#[test_case("list-protocol1.pickle" ; "ints")]
fn a_list_of_other_items_is_still_refused(file: &str) {
    let bytes = std::fs::read(path(file)).unwrap();
    match trace::open_reader(Cursor::new(bytes), "input", &Options::new())
        .and_then(|t| t.collect::<portalloc::trace::Result<Vec<Event>>>())
    {
        Err(e) => {
            assert_eq!(e.kind(), TraceErrorKind::NotATrace);
            assert!(
                e.message().contains("a valid pickle, but of a list,"),
                "{e}"
            );
        }
        Ok(events) => panic!("read as {} events", events.len()),
    }
}

/// `portalloc replay FILE --min-capacity` runs on a segment list and prints each strategy's
/// least capacity, and the note that says what the file was.
#[cfg(feature = "cli")]
#[test]
fn replay_min_capacity_runs_on_a_segment_list() {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_portalloc"));
    cmd.arg("replay")
        .arg(path("segment-list-protocol4.pickle"))
        .arg("--min-capacity");
    for var in portalloc::config::VARIABLES {
        cmd.env_remove(var);
    }
    let out = cmd.output().expect("run portalloc");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("min capacity"), "{stdout}");
    assert!(
        stdout.contains("a segment list (torch.cuda.memory_snapshot(), pickled)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("11.63 MiB"),
        "peak live, 12,195,704 B: {stdout}"
    );
    // The warning for a trace of no events says what a state is, not that history recording
    // was off.
    let warning = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("warning:"))
        .unwrap_or_default();
    assert!(
        warning.contains("one moment's state") && !warning.contains("recording off"),
        "{stdout}"
    );
}
