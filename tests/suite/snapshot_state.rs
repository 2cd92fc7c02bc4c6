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
/// segment list. The device: the one with the most live bytes (device 0, 12,195,704 B
/// against 100), or the one asked for.
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

/// The error `trace::open` gives for fixture `file` read with `options`.
fn error_of(file: &str, options: &Options) -> trace::TraceError {
    match trace::open(path(file), options).and_then(|t| t.collect::<trace::Result<Vec<Event>>>()) {
        Err(e) => e,
        Ok(events) => panic!("{file}: read as {} events", events.len()),
    }
}

/// A segment list with one value torch never writes (make.py: segment 1, or its block 1,
/// from 0) is still known as a segment list, by its shape, and refused as `Malformed`
/// naming the segment, the block, the field, the value and what is accepted; before, any
/// such value made it "a valid pickle, but of a list", and a device, a requested_size or a
/// size that did not read was silently device 0, the block's size, or 0 B.
#[test_case("segment-list-total-size-2-70.pickle", "but segment 1 has total_size = 1180591620717411303424 (more than 64 bits), at segments[1]['total_size']; accepted: an int from 0 to 2^64 - 1 (bytes)" ; "total_size of 2**70")]
#[test_case("segment-list-blocks-sum-past-64-bits.pickle", "but the live blocks of device 0 sum to more than 2^64 - 1 bytes at segment 1, block 1, whose requested_size is 9223372036854775808 (segments[1]['blocks'][1]['requested_size'])" ; "two blocks of 2**63")]
#[test_case("segment-list-total-size-negative.pickle", "but segment 1 has total_size = -1 (a negative int), at segments[1]['total_size']; accepted: an int from 0 to 2^64 - 1 (bytes)" ; "negative total_size")]
#[test_case("segment-list-size-negative.pickle", "but segment 1, block 1 has size = -512 (a negative int), at segments[1]['blocks'][1]['size']; accepted: an int from 0 to 2^64 - 1 (bytes)" ; "negative block size")]
#[test_case("segment-list-total-size-float.pickle", "but segment 1 has total_size = 2097152.0 (a float), at segments[1]['total_size']" ; "float total_size")]
#[test_case("segment-list-size-float.pickle", "but segment 1, block 1 has size = 1024.0 (a float), at segments[1]['blocks'][1]['size']" ; "float block size")]
#[test_case("segment-list-blocks-none.pickle", "but segment 1 has blocks = None, at segments[1]['blocks']; accepted: a list of block dicts (empty for a segment with none)" ; "blocks None")]
#[test_case("segment-list-extra-item.pickle", "but segment 1 is 5, not a segment (segments[1]); accepted: a dict with blocks and total_size" ; "an int among the segments")]
#[test_case("segment-list-device-negative.pickle", "but segment 1 has device = -1 (a negative int), at segments[1]['device']; accepted: absent (device 0), or a device ordinal, an int from 0 to 4294967295" ; "device -1")]
#[test_case("segment-list-device-2-70.pickle", "but segment 1 has device = 1180591620717411303424 (more than 64 bits), at segments[1]['device']" ; "device 2**70")]
#[test_case("segment-list-device-str.pickle", "but segment 1 has device = \"0\" (a str), at segments[1]['device']" ; "device '0'")]
#[test_case("segment-list-requested-size-2-70.pickle", "but segment 1, block 1 has requested_size = 1180591620717411303424 (more than 64 bits), at segments[1]['blocks'][1]['requested_size']; accepted: absent (the block's size is used, as PyTorch before 2.0 writes none), or an int from 0 to 2^64 - 1 (bytes)" ; "requested_size 2**70")]
#[test_case("segment-list-requested-size-negative.pickle", "but segment 1, block 1 has requested_size = -5 (a negative int), at segments[1]['blocks'][1]['requested_size']" ; "requested_size -5")]
#[test_case("segment-list-requested-size-str.pickle", "but segment 1, block 1 has requested_size = \"1000\" (a str), at segments[1]['blocks'][1]['requested_size']" ; "requested_size '1000'")]
#[test_case("segment-list-size-str.pickle", "but segment 1, block 1 has size = \"1024\" (a str), at segments[1]['blocks'][1]['size']" ; "size '1024', no requested_size")]
fn a_segment_list_with_a_bad_value_names_it(file: &str, said: &str) {
    let e = error_of(file, &Options::new());
    assert_eq!(e.kind(), TraceErrorKind::Malformed, "{e}");
    let message = e.message();
    assert!(
        message.contains("a segment list (torch.cuda.memory_snapshot(), pickled), but "),
        "{message}"
    );
    assert!(message.contains(said), "{message}");
    assert!(!message.contains("a valid pickle, but of"), "{message}");
    assert!(message.len() <= 400, "{} bytes: {message}", message.len());
}

/// The dict form reads its segments with the same reader: the same values are refused the
/// same way (before, read silently as 0 B or device 0).
#[test_case("snapshot-segment-requested-size-str.pickle", "but segment 1, block 1 has requested_size = \"1000\" (a str), at snapshot['segments'][1]['blocks'][1]['requested_size']" ; "requested_size '1000'")]
#[test_case("snapshot-segment-device-str.pickle", "but segment 1 has device = \"0\" (a str), at snapshot['segments'][1]['device']" ; "device '0'")]
#[test_case("snapshot-segment-total-size-2-70.pickle", "but segment 1 has total_size = 1180591620717411303424 (more than 64 bits), at snapshot['segments'][1]['total_size']" ; "total_size 2**70")]
fn a_snapshot_with_a_bad_segment_value_names_it(file: &str, said: &str) {
    let e = error_of(file, &Options::new());
    assert_eq!(e.kind(), TraceErrorKind::Malformed, "{e}");
    assert!(
        e.message().contains("a PyTorch memory snapshot, but "),
        "{e}"
    );
    assert!(e.message().contains(said), "{e}");
}

/// A snapshot holds the CUDA caching allocator's memory (HIP's under ROCm): --trace-device
/// cuda and hip, with or without an ordinal, read it; cpu and any other type are a
/// `Selection` error naming what the file holds and what was asked for, in both forms.
/// Before, every type read cuda:0.
#[test_case("segment-list-protocol4.pickle", "cpu", "a segment list (torch.cuda.memory_snapshot(), pickled) holds the GPU memory of devices 0, 1 (cuda, or hip under ROCm); --trace-device cpu asks for the CPU's memory (trace::Options::cpu), which it does not hold" ; "segment list, cpu")]
#[test_case("segment-list-protocol4.pickle", "xpu", "holds the GPU memory of devices 0, 1 (cuda, or hip under ROCm); --trace-device xpu asks for the memory of xpu devices (c10::DeviceType 12, trace::Options::device_type), which it does not hold" ; "segment list, xpu")]
#[test_case("snapshot-protocol4.pickle", "cpu", "a PyTorch memory snapshot holds the GPU memory of device 0 (cuda, or hip under ROCm); --trace-device cpu asks for" ; "snapshot, cpu")]
#[test_case("snapshot-protocol4.pickle", "xpu:0", "a PyTorch memory snapshot holds the GPU memory of device 0 (cuda, or hip under ROCm); --trace-device xpu:0 asks for the memory of xpu devices" ; "snapshot, xpu:0")]
#[test_case("snapshot-protocol4.pickle", "mps", "--trace-device mps asks for the memory of mps devices (c10::DeviceType 13" ; "snapshot, mps")]
fn a_device_type_a_snapshot_does_not_hold_is_refused(file: &str, spec: &str, said: &str) {
    let options = Options::new().with_device_spec(spec).unwrap();
    let e = error_of(file, &options);
    assert_eq!(e.kind(), TraceErrorKind::Selection, "{e}");
    assert!(e.message().contains(said), "{e}");
    assert!(
        e.message()
            .contains("name one of its devices (as 0, cuda:0 or hip:0), or give no --trace-device"),
        "{e}"
    );
}

/// `Options::cpu` set in the library is refused as `--trace-device cpu` is.
#[test]
fn options_cpu_is_refused_on_a_snapshot() {
    let e = error_of("snapshot-protocol4.pickle", &Options::new().with_cpu(true));
    assert_eq!(e.kind(), TraceErrorKind::Selection, "{e}");
}

/// cuda and hip, with or without an ordinal, read the device they name (hip: PyTorch on
/// ROCm, whose torch.cuda is HIP).
#[test_case("segment-list-protocol4.pickle", "cuda", "cuda:0" ; "segment list, cuda")]
#[test_case("segment-list-protocol4.pickle", "hip", "cuda:0" ; "segment list, hip")]
#[test_case("segment-list-protocol4.pickle", "hip:1", "cuda:1" ; "segment list, hip:1")]
#[test_case("segment-list-protocol4.pickle", "cuda:1", "cuda:1" ; "segment list, cuda:1")]
#[test_case("snapshot-protocol4.pickle", "cuda:0", "cuda:0" ; "snapshot, cuda:0")]
#[test_case("snapshot-protocol4.pickle", "hip", "cuda:0" ; "snapshot, hip")]
fn cuda_and_hip_read_a_snapshot(file: &str, spec: &str, device_name: &str) {
    let options = Options::new().with_device_spec(spec).unwrap();
    let t = trace::open(path(file), &options).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.header().device.as_deref(), Some(device_name));
}

/// The device chosen by default is the one with the most live bytes, which a plan must
/// hold: device 1 (4 blocks, 100 MiB) over device 0 (16 blocks, 64 MiB); the header's note
/// says the rule. Asked for, device 0 is read.
#[test]
fn the_device_with_the_most_live_bytes_is_chosen() {
    let input = load("segment-list-bytes-over-blocks.pickle", &Options::new());
    let header = input.header();
    assert_eq!(header.device.as_deref(), Some("cuda:1"));
    assert_eq!(header.baseline_bytes, 100 << 20);
    assert!(
        header.notes[0].contains("1 segment of device 1, the device with the most live bytes"),
        "{:?}",
        header.notes
    );
    assert!(
        header.notes[0].contains("the device with the most live bytes (segments of devices 0, 1)"),
        "{:?}",
        header.notes
    );
    let input = load("segment-list-bytes-over-blocks.pickle", &on_device(0));
    assert_eq!(input.header().device.as_deref(), Some("cuda:0"));
    assert_eq!(input.header().baseline_bytes, 64 << 20);
    assert!(
        input.header().notes[0].contains("the device asked for"),
        "{:?}",
        input.header().notes
    );
}

/// A segment list followed by whitespace (a newline an editor or `echo >>` added) reads as
/// the list alone, with a note saying what was ignored.
#[test]
fn whitespace_after_a_segment_list_is_ignored() {
    let with = load("segment-list-then-whitespace.pickle", &Options::new());
    let without = load("segment-list-protocol4.pickle", &Options::new());
    assert_eq!(
        with.header().baseline_bytes,
        without.header().baseline_bytes
    );
    assert_eq!(
        with.header().pre_window_blocks,
        without.header().pre_window_blocks
    );
    assert!(
        with.header()
            .notes
            .iter()
            .any(|n| n.contains("5 bytes of whitespace after the pickle's end")),
        "{:?}",
        with.header().notes
    );
}
