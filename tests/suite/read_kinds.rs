//! Traces as people hand them over, each read or refused for what it is (issue "read kinds"):
//! a CSV cut short in its last row is counted, naming the line and the file (an error in
//! strict mode); a trace gzip'd twice is read, three times refused saying so; an XLA dump
//! whose files are gzip'd is read as the plain one; a number past a 64-bit float in a memory
//! field names the field and the event; `--trace-device` on an RMM log, which names no
//! device, is refused.
//!
//! The files under `tests/data/read-kinds/` were written by Python's own `csv` and `gzip`
//! modules (`tests/data/read-kinds/make.py`): what each holds is what Python put in it.
#![cfg(feature = "trace")]

use std::io::Cursor;
use std::path::{Path, PathBuf};

use portalloc::trace::import::xla_dump::{self, XlaModule, XlaOptions};
use portalloc::trace::{self, Anomalies, AnomalyKind, Event, Loc, Options, TraceErrorKind};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/read-kinds")
        .join(name)
}

/// The plain dump `tests/data/read-kinds/xla-gz` is mlp_train's, gzip'd.
fn plain_dump() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/xla/mlp_train")
}

/// The events and anomalies of the file `name`, read to its end.
fn read(name: &str, options: &Options) -> portalloc::trace::Result<(Vec<Event>, Anomalies)> {
    let mut t = trace::open(data(name), options)?;
    let events = t
        .by_ref()
        .collect::<portalloc::trace::Result<Vec<Event>>>()?;
    Ok((events, t.anomalies().clone()))
}

/// The kind and message of `result`'s error, which must be an `Error::Trace` whose message
/// is bounded and free of control characters.
fn refusal<T: std::fmt::Debug>(result: portalloc::trace::Result<T>) -> (TraceErrorKind, String) {
    match result {
        Err(e) => {
            let message = e.message().to_string();
            assert!(message.len() <= 1100, "{message:.300}");
            assert!(!message.chars().any(char::is_control), "{message:?}");
            (e.kind(), message)
        }
        other => panic!("not a trace error: {other:?}"),
    }
}

mod cut_short {
    use super::*;
    use test_case::test_case;

    /// A last row without a line end is read, and counted with its line, naming the file:
    /// the file may have been cut inside it (a lifetime CSV's 12582912 read as 125 bytes),
    /// or may lack only its final newline, which reads the same. Before, read silently.
    #[test_case("lifetimes-cut.csv", 4, Some(125) ; "a lifetime CSV's size cut")]
    #[test_case("rmm-cut.csv", 5, None ; "an RMM log's stream handle cut")]
    #[test_case("rmm-cut.csv.gz", 5, None ; "an RMM log cut, then gzip'd")]
    #[test_case("lifetimes-crlf-cut.csv", 4, Some(125) ; "a CRLF lifetime CSV's size cut")]
    #[test_case("rmm-crlf-cut.csv", 5, None ; "a CRLF RMM log cut")]
    fn a_last_row_without_a_line_end_is_counted_with_its_line(
        file: &str,
        line: u64,
        last_size: Option<u64>,
    ) {
        let (events, anomalies) = read(file, &Options::new()).expect("read, counted");
        assert_eq!(anomalies.count(AnomalyKind::NoLineEnd), 1, "{anomalies}");
        let example = anomalies.examples(AnomalyKind::NoLineEnd).next().unwrap();
        assert_eq!(example.loc, Loc::Line(line));
        assert!(
            example
                .message
                .contains(&format!("no line end: {file} may be cut short")),
            "{example}"
        );
        assert!(
            anomalies
                .to_string()
                .contains("1 × last row has no line end (cut short?)"),
            "{anomalies}"
        );
        if let Some(size) = last_size {
            assert!(events.iter().any(|e| e.size == size), "{events:?}");
        }
    }

    /// In strict mode the same row is an error of kind Malformed naming the file and the
    /// line, saying why it cannot tell a cut from a missing newline.
    #[test_case("lifetimes-cut.csv", 4 ; "a lifetime CSV")]
    #[test_case("rmm-cut.csv", 5 ; "an RMM log")]
    #[test_case("rmm-cut.csv.gz", 5 ; "an RMM log gzip'd")]
    #[test_case("lifetimes-crlf-cut.csv", 4 ; "a CRLF lifetime CSV")]
    fn in_strict_mode_it_is_malformed(file: &str, line: u64) {
        let (kind, message) = refusal(read(file, &Options::new().with_strict(true)));
        assert_eq!(kind, TraceErrorKind::Malformed, "{message}");
        assert!(
            message.contains(&format!(
                "{file}: line {line} has no line end: the file may be cut short"
            )),
            "{message}"
        );
        assert!(
            message.contains("a last row that is whole but lacks its final newline reads the same"),
            "{message}"
        );
    }

    /// In a CRLF file every line is numbered as an editor shows it: the free of an address
    /// never allocated on line 3 is counted at line 3 (the `csv` crate alone says 2,
    /// BurntSushi/rust-csv#395), and the cut last row at line 5.
    #[test]
    fn a_crlf_files_lines_are_an_editors() {
        let (_, anomalies) = read("rmm-crlf-cut.csv", &Options::new()).expect("read");
        let never = anomalies
            .examples(AnomalyKind::UnknownFree)
            .next()
            .expect("the free of 0x50000");
        assert_eq!(never.loc, Loc::Line(3), "{anomalies}");
        let cut = anomalies.examples(AnomalyKind::NoLineEnd).next().unwrap();
        assert_eq!(cut.loc, Loc::Line(5), "{anomalies}");
    }

    /// The same rows with their line ends: nothing counted, strict or not.
    #[test_case("lifetimes-whole.csv" ; "a lifetime CSV")]
    #[test_case("rmm-whole.csv" ; "an RMM log")]
    fn whole_rows_are_nothing_to_count(file: &str) {
        let (_, anomalies) = read(file, &Options::new().with_strict(true)).expect("whole");
        assert!(anomalies.is_empty(), "{anomalies}");
    }

    /// A header alone without a line end has no row to be cut: nothing counted.
    #[test_case("id,lower,upper,size" ; "a lifetime CSV")]
    #[test_case("Thread,Time,Action,Pointer,Size,Stream" ; "an RMM log")]
    fn a_header_alone_is_no_row_cut(text: &str) {
        let mut t = trace::open_reader(
            Cursor::new(text.as_bytes().to_vec()),
            "h.csv",
            &Options::new().with_strict(true),
        )
        .expect("a header");
        assert_eq!(t.by_ref().count(), 0);
        assert!(t.anomalies().is_empty(), "{}", t.anomalies());
    }
}

mod gzip_twice {
    use super::*;
    use test_case::test_case;

    /// A trace gzip'd twice (`gzip.compress(gzip.compress(...))`) reads as the trace; before,
    /// "unknown trace format (starts with bytes 1f 8b …)".
    #[test_case("rmm-whole.csv.gz.gz", "rmm-whole.csv" ; "an RMM log")]
    #[test_case("lifetimes-whole.csv.gz.gz", "lifetimes-whole.csv" ; "a lifetime CSV")]
    fn is_read_as_the_trace(twice: &str, plain: &str) {
        let (got, _) = read(twice, &Options::new()).expect("gzip'd twice");
        let (want, _) = read(plain, &Options::new()).expect("plain");
        assert!(!want.is_empty());
        assert_eq!(got, want);
    }

    /// Each layer is inflated within the input limit, as one is: a limit below what the
    /// trace inflates to refuses it as a limit.
    #[test]
    fn each_layer_is_bounded() {
        let (kind, message) = refusal(read(
            "rmm-whole.csv.gz.gz",
            &Options::new().with_max_input_bytes(100),
        ));
        assert_eq!(kind, TraceErrorKind::Limit, "{message}");
        assert!(message.contains("inflated stream exceeds"), "{message}");
    }

    /// A third layer is refused, saying so and what to do.
    #[test]
    fn three_times_is_refused_saying_so() {
        let (kind, message) = refusal(read("rmm-whole.csv.gz.gz.gz", &Options::new()));
        assert_eq!(kind, TraceErrorKind::NotATrace, "{message}");
        assert!(
            message.contains("rmm-whole.csv.gz.gz.gz: gzip-compressed three times or more"),
            "{message}"
        );
        assert!(!message.contains("unknown trace format"), "{message}");
    }
}

mod xla_gzipped {
    use super::*;
    use test_case::test_case;

    const MODULE: &str = "module_0030.jit_train_step.cpu_after_optimizations";

    fn options(per_buffer: bool) -> XlaOptions {
        XlaOptions {
            module: None,
            steps: 1,
            per_buffer,
        }
    }

    fn same(got: &XlaModule, want: &XlaModule) {
        assert_eq!(got.name, want.name);
        assert_eq!(got.stats, want.stats);
        assert_eq!(got.events, want.events);
        assert!(!got.events.is_empty());
    }

    /// A dump directory whose files are gzip'd (`gzip -r DIR`) reads as the plain one, its
    /// live ranges (`--per-buffer`) too; before, "no *-buffer-assignment.txt file".
    #[test_case(false ; "as the runtime allocates")]
    #[test_case(true ; "per buffer, from the gzip'd live ranges")]
    fn a_gzipped_dump_reads_as_the_plain_one(per_buffer: bool) {
        let got = xla_dump::read_dir(&data("xla-gz"), &options(per_buffer)).expect("gzip'd");
        let want = xla_dump::read_dir(&plain_dump(), &options(per_buffer)).expect("plain");
        same(&got, &want);
    }

    /// A lone gzip'd buffer-assignment file is its module, as the plain file is.
    #[test]
    fn a_lone_gzipped_file_reads_as_its_module() {
        let file = data("xla-gz").join(format!("{MODULE}-buffer-assignment.txt.gz"));
        assert!(xla_dump::is_buffer_assignment_file(&file));
        let got = xla_dump::read_path(&file, &options(false)).expect("the file");
        let want = xla_dump::read_dir(&plain_dump(), &options(false)).expect("plain");
        same(&got, &want);
    }

    /// A gzip'd module is among those the largest is chosen from: here it is the largest,
    /// beside a small plain one; before, it was skipped and the small one replayed.
    #[test]
    fn a_gzipped_module_is_chosen_among_the_plain_ones() {
        let m = xla_dump::read_dir(&data("xla-mixed"), &options(false)).expect("a dump");
        assert_eq!(m.name, "jit_train_step");
        assert!(
            m.header
                .notes
                .iter()
                .any(|n| n == "module jit_train_step: the largest of 2 in the dump"),
            "{:?}",
            m.header.notes
        );
    }
}

mod numbers_past_f64 {
    use super::*;
    use test_case::test_case;

    /// A number no 64-bit float holds (`1e999`: JSON's grammar allows it) in a field read
    /// is refused naming the field and the event; before, "corrupt JSON at line 1 column …:
    /// number out of range", no field or event named.
    #[test_case(r#""ts": 2, "args": {"Addr": 1, "Bytes": 1e999, "Device Type": 1}"#, "Bytes 1e999" ; "Kineto Bytes")]
    #[test_case(r#""ts": 2, "args": {"Addr": 1, "Bytes": 8, "Total Allocated": 1e999, "Device Type": 1}"#, "Total Allocated 1e999" ; "Kineto Total Allocated")]
    #[test_case(r#""ts": -1e999, "args": {"Addr": 1, "Bytes": 8, "Device Type": 1}"#, "ts -1e999" ; "Kineto ts, negative")]
    fn in_a_kineto_memory_event_the_field_and_event_are_named(fields: &str, named: &str) {
        let text = format!(
            r#"{{"traceEvents": [{{"name": "aten::mm", "ts": 1}}, {{"name": "[memory]", {fields}}}]}}"#
        );
        let (kind, message) = refusal(
            trace::open_reader(Cursor::new(text), "k.json", &Options::new())
                .and_then(|t| t.collect::<portalloc::trace::Result<Vec<_>>>()),
        );
        assert_eq!(kind, TraceErrorKind::Malformed, "{message}");
        assert!(
            message.starts_with("k.json: event 2 ([memory], line 1 column "),
            "{message}"
        );
        assert!(
            message.contains(&format!("{named} is a number out of range")),
            "{message}"
        );
    }

    /// In an event that is no `[memory]` one (read in full only because it holds an escape,
    /// which could spell the name) such a number is dropped with the event, as any is.
    #[test]
    fn in_another_event_it_is_dropped_with_it() {
        let memory =
            r#"{"name": "[memory]", "ts": 3, "args": {"Addr": 1, "Bytes": 8, "Device Type": 1}}"#;
        let text = format!(
            r#"{{"traceEvents": [{{"name": "aten::mm\u0021", "ts": 1e999, "args": {{"Bytes": 1e999}}}}, {memory}]}}"#
        );
        let events = trace::open_reader(Cursor::new(text), "k.json", &Options::new())
            .and_then(|t| t.collect::<portalloc::trace::Result<Vec<_>>>())
            .expect("the [memory] event");
        assert_eq!(events.len(), 1);
    }

    /// A portalloc JSON-lines event's `size` names the field and the line.
    #[test]
    fn in_a_portalloc_event_the_field_and_line_are_named() {
        let text = "{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n\
                    [0,0,0,0,\"a\",1,1e999]\n{\"end\":{\"events\":1}}\n";
        let (kind, message) = refusal(
            trace::open_reader(Cursor::new(text), "t.jsonl", &Options::new())
                .and_then(|t| t.collect::<portalloc::trace::Result<Vec<_>>>()),
        );
        assert_eq!(kind, TraceErrorKind::Malformed, "{message}");
        assert!(message.starts_with("t.jsonl: line 2: "), "{message}");
        assert!(message.contains("size"), "{message}");
        assert!(message.contains("1e999"), "{message}");
    }
}

mod rmm_device {
    use super::*;
    use test_case::test_case;

    /// An RMM log holds one memory resource's events and names no device: a device asked
    /// of it is refused as a selection, naming the option; before, ignored.
    #[test_case(Options::new().with_device(1) ; "an ordinal")]
    #[test_case(Options::new().with_device_spec("cuda:0").unwrap() ; "a device type and ordinal")]
    #[test_case(Options::new().with_device_spec("hip").unwrap() ; "a device type")]
    #[test_case(Options::new().with_cpu(true) ; "the CPU")]
    fn a_device_asked_of_an_rmm_log_is_refused(options: Options) {
        let (kind, message) = refusal(read("rmm-whole.csv", &options));
        assert_eq!(kind, TraceErrorKind::Selection, "{message}");
        assert!(
            message
                .starts_with("rmm-whole.csv: --trace-device does not apply to an RMM log: it holds one memory resource's events"),
            "{message}"
        );
        // A buffer-lifetime CSV names no device either: refused alike.
        let (kind, message) = refusal(read("lifetimes-whole.csv", &options));
        assert_eq!(kind, TraceErrorKind::Selection, "{message}");
        assert!(
            message.starts_with(
                "lifetimes-whole.csv: --trace-device does not apply to a buffer-lifetime CSV"
            ),
            "{message}"
        );
    }

    /// Without a device asked, both read.
    #[test]
    fn without_a_device_both_read() {
        for file in ["rmm-whole.csv", "lifetimes-whole.csv"] {
            let (events, _) = read(file, &Options::new()).unwrap();
            assert!(!events.is_empty(), "{file}");
        }
    }
}

/// A trace in portalloc's own format holds one device's events, named in its header: a
/// `--trace-device` it matches reads it, another is refused naming the device it holds, and
/// any is refused when the header names none; before, ignored whatever it asked.
mod own_format_device {
    use super::*;
    use portalloc::trace::{jsonl, Op, TraceHeader};
    use test_case::test_case;

    /// A trace of one allocation and its free, its header naming `device`.
    fn own(device: Option<&str>) -> Vec<u8> {
        let mut header = TraceHeader::new("test:own");
        header.device = device.map(str::to_string);
        let mut w = jsonl::Writer::new(Vec::new(), &header).unwrap();
        for (seq, op) in [(0, Op::Alloc), (1, Op::Free)] {
            w.write(&crate::support::event(seq, op, 1, 4096)).unwrap();
        }
        w.finish().unwrap()
    }

    fn open(device: Option<&str>, options: &Options) -> portalloc::trace::Result<trace::Trace> {
        trace::open_reader(Cursor::new(own(device)), "own.jsonl", options)
    }

    #[test_case("cuda:1" ; "its device")]
    #[test_case("cuda" ; "its device type")]
    #[test_case("1" ; "its ordinal")]
    fn a_device_it_was_recorded_on_reads_it(spec: &str) {
        let options = Options::new().with_device_spec(spec).unwrap();
        let t = open(Some("cuda:1 NVIDIA H200"), &options).expect("its own device");
        assert_eq!(t.count(), 2);
    }

    #[test_case("cuda:0", "no cuda:0 in this trace: it holds the events of cuda:1 NVIDIA H200 only" ; "another ordinal")]
    #[test_case("hip", "no hip in this trace" ; "another type")]
    #[test_case("cpu", "no cpu in this trace" ; "the cpu")]
    fn another_device_is_refused_naming_its_own(spec: &str, said: &str) {
        let options = Options::new().with_device_spec(spec).unwrap();
        let (kind, message) = refusal(open(Some("cuda:1 NVIDIA H200"), &options));
        assert_eq!(kind, TraceErrorKind::Selection, "{message}");
        assert!(
            message.starts_with(&format!("own.jsonl: {said}")),
            "{message}"
        );
    }

    #[test]
    fn any_device_is_refused_when_the_header_names_none() {
        let options = Options::new().with_device(0);
        let (kind, message) = refusal(open(None, &options));
        assert_eq!(kind, TraceErrorKind::Selection, "{message}");
        assert!(message.contains("its header names no device"), "{message}");
        // Asked for nothing, it reads.
        assert_eq!(open(None, &Options::new()).unwrap().count(), 2);
    }
}

/// The same, through `portalloc replay` as a user runs it.
#[cfg(feature = "cli")]
mod command_line {
    use super::*;
    use crate::support::cli::portalloc;
    use test_case::test_case;

    fn path(name: &str) -> String {
        data(name).to_string_lossy().into_owned()
    }

    /// `portalloc replay --json` of `args`: the first trace's report.
    fn replayed(args: &[&str]) -> serde_json::Value {
        let mut all = vec!["replay", "--json", "--strategies", "bfc"];
        all.extend_from_slice(args);
        let (ok, out, err) = portalloc(&all, &[]);
        assert!(ok, "{args:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        v["traces"][0].clone()
    }

    /// `portalloc replay` of `args`, which must fail: its standard error.
    fn refused(args: &[&str]) -> String {
        let mut all = vec!["replay", "--strategies", "bfc"];
        all.extend_from_slice(args);
        let (ok, out, err) = portalloc(&all, &[]);
        assert!(!ok, "{args:?} succeeded: {out}");
        assert!(err.len() < 1000, "{err}");
        err
    }

    /// The report's anomalies say it (streaming from the file, and from the spool a gzip'd
    /// log is inflated into); `--strict` refuses it.
    #[test_case("lifetimes-cut.csv", 4 ; "a lifetime CSV")]
    #[test_case("rmm-cut.csv", 5 ; "an RMM log")]
    #[test_case("rmm-cut.csv.gz", 5 ; "an RMM log gzip'd")]
    fn a_cut_csv_is_said_and_refused_in_strict_mode(file: &str, line: u64) {
        let report = replayed(&[&path(file)]);
        let anomalies = report["anomalies"].as_str().unwrap_or_default();
        assert!(
            anomalies.contains("last row has no line end (cut short?)")
                && anomalies.contains(&format!(
                    "line {line}: no line end: {file} may be cut short"
                )),
            "{report}"
        );
        let err = refused(&["--strict", &path(file)]);
        assert!(
            err.contains(&format!(
                "{file}: line {line} has no line end: the file may be cut short"
            )),
            "{err}"
        );
    }

    /// A trace gzip'd twice replays as the trace.
    /// `--baseline` on a trace that records its own (a segment list's live blocks) is said
    /// to replace it, naming both figures; on one that records none (a lifetime CSV), not.
    #[test]
    fn a_baseline_given_over_a_known_one_is_said() {
        let list = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/not-a-trace/segment-list-protocol4.pickle");
        let list = list.to_str().unwrap();
        let (ok, _, err) = portalloc(
            &["replay", "--strategies", "bfc", "--baseline", "1GiB", list],
            &[],
        );
        assert!(ok, "{err}");
        assert!(
            err.contains("--baseline 1.00 GiB replaces the 11.63 MiB the trace records"),
            "{err}"
        );
        let csv = path("lifetimes-whole.csv");
        let (ok, _, err) = portalloc(
            &["replay", "--strategies", "bfc", "--baseline", "1GiB", &csv],
            &[],
        );
        assert!(ok && !err.contains("replaces"), "{err}");
    }

    #[test]
    fn a_trace_gzipped_twice_replays() {
        let twice = replayed(&[&path("rmm-whole.csv.gz.gz")]);
        let plain = replayed(&[&path("rmm-whole.csv")]);
        assert_eq!(twice["events"], plain["events"]);
        assert_eq!(
            twice["results"][0]["peak_live"],
            plain["results"][0]["peak_live"]
        );
    }

    /// A lone gzip'd buffer-assignment file replays as its module, as the plain file does;
    /// before, `portalloc replay` called it "not a trace" and said `portalloc replay` reads it.
    #[test]
    fn a_gzipped_buffer_assignment_file_replays() {
        let name = "module_0030.jit_train_step.cpu_after_optimizations-buffer-assignment.txt";
        let gz = data("xla-gz").join(format!("{name}.gz"));
        let plain = plain_dump().join(name);
        let got = replayed(&[&gz.to_string_lossy()]);
        let want = replayed(&[&plain.to_string_lossy()]);
        assert_eq!(got["events"], want["events"]);
        assert_eq!(
            got["results"][0]["peak_live"],
            want["results"][0]["peak_live"]
        );
    }

    /// `--trace-device` on an RMM log is refused, naming the option.
    #[test]
    fn trace_device_on_an_rmm_log_is_refused() {
        let err = refused(&["--trace-device", "cuda:1", &path("rmm-whole.csv")]);
        assert!(
            err.contains("--trace-device does not apply to an RMM log"),
            "{err}"
        );
    }
}
