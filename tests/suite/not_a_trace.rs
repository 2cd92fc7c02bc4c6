//! Files that are not a trace portalloc reads, or are one dressed unusually, each said to be
//! what it is (issue 27, "refusals that point the wrong way"): a pickle of another kind of
//! object names the global it is built from; a dict without a snapshot's keys names the keys it
//! has; RMM's debug log and nvidia-smi's CSV are named, with what to record instead; a lone
//! XLA buffer-assignment file is read as its module; a UTF-8 byte-order mark is skipped; an
//! integer past `u64` in a portalloc header and an object on an event line are reported as
//! such; options that do not apply to an input are warned about.
//!
//! The pickles under `tests/data/not-a-trace/` were written by Python's own `pickle` module
//! (`tests/data/not-a-trace/make.py`): what each file is a pickle of is what Python put in it.
#![cfg(feature = "trace")]

use std::io::Cursor;
use std::path::{Path, PathBuf};

use portalloc::trace::import::xla_dump::{self, XlaOptions};
use portalloc::trace::{self, Event, Format, Options};
use test_case::test_case;

/// The message of the error `trace::open_reader` gives for `bytes` (sniffed, or read as
/// `format`), which must be an `Error::Trace`, bounded, and free of control characters.
fn refusal(bytes: &[u8], format: Option<Format>) -> String {
    let mut options = Options::new();
    options.format = format;
    let result = trace::open_reader(Cursor::new(bytes.to_vec()), "input", &options)
        .and_then(|t| t.collect::<portalloc::trace::Result<Vec<Event>>>());
    match result {
        Err(e) => {
            let message = e.message().to_string();
            // Refused for what the file holds: not the options, a limit or the OS.
            assert!(
                matches!(
                    e.kind(),
                    trace::TraceErrorKind::NotATrace | trace::TraceErrorKind::Malformed
                ),
                "{:?}: {message:.300}",
                e.kind()
            );
            assert!(
                message.len() <= 1100,
                "{} bytes: {message:.300}",
                message.len()
            );
            assert!(
                !message.chars().any(char::is_control),
                "a control character in {message:?}"
            );
            message
        }
        Ok(events) => panic!("read as a trace of {} events", events.len()),
    }
}

/// The events `bytes` read as, sniffed.
fn events(bytes: &[u8]) -> Vec<Event> {
    trace::open_reader(Cursor::new(bytes.to_vec()), "input", &Options::new())
        .and_then(|t| t.collect::<portalloc::trace::Result<Vec<Event>>>())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/not-a-trace")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Pickles of other objects name the global (`module.name`) their top-level object is built
/// from, and say what a snapshot is; before, a deque or an `OrderedDict` was "truncated or
/// corrupt?" and the others "a valid pickle, but of None" or "no device_traces list".
#[test_case("deque-protocol4.pickle", "a pickle of collections.deque" ; "deque, protocol 4 (STACK_GLOBAL)")]
#[test_case("deque-protocol2.pickle", "a pickle of collections.deque" ; "deque, protocol 2 (GLOBAL)")]
#[test_case("ordered-dict.pickle", "a pickle of collections.OrderedDict" ; "an OrderedDict")]
#[test_case("numpy-array.pickle", "a pickle of numpy.core.multiarray._reconstruct" ; "a numpy array: REDUCE then BUILD")]
#[test_case("torch-tensor.pickle", "a pickle of torch._utils._rebuild_tensor_v2" ; "a torch tensor")]
#[test_case("class-instance.pickle", "a pickle of mylib.models.Model" ; "an instance whose state has a segments key: NEWOBJ then BUILD")]
#[test_case("class-itself.pickle", "a pickle of collections.deque" ; "the class itself")]
fn a_pickle_of_another_object_names_its_global(file: &str, named: &str) {
    let message = refusal(&fixture(file), None);
    assert!(message.contains(named), "{message}");
    assert!(
        message.contains("not a PyTorch memory snapshot")
            && message.contains("segments and device_traces"),
        "{message}"
    );
    assert!(!message.contains("truncated or corrupt"), "{message}");
}

/// Objects that take items (`APPEND`, `APPENDS`, `SETITEM`, `SETITEMS` on what calling a
/// global made, or `APPENDS` on an instance of a subclass of `list`) read to the end of the
/// pickle, opaque, and a list of them is named by the globals of its items; before, "not a
/// readable snapshot pickle (truncated or corrupt?): opcode APPENDS (0x65) on a stack top that
/// is not a list" (an RL replay memory: a list of deques of numpy arrays, protocol 3).
#[test_case("list-of-deques-protocol3.pickle", "a valid pickle, but of a list of collections.deque," ; "a list of deques of numpy arrays, protocol 3")]
#[test_case("list-of-ordered-dicts.pickle", "a valid pickle, but of a list of collections.OrderedDict," ; "a list of OrderedDicts: SETITEM on each")]
#[test_case("list-mixed.pickle", "a valid pickle, but of a list holding collections.deque among other items," ; "a deque and an int")]
#[test_case("list-subclass.pickle", "a pickle of mylib.models.Memory, not a PyTorch memory snapshot" ; "an instance of a subclass of list: NEWOBJ then APPENDS")]
fn objects_that_take_items_are_read_and_named(file: &str, named: &str) {
    let message = refusal(&fixture(file), None);
    assert!(message.contains(named), "{message}");
    assert!(message.contains("segments and device_traces"), "{message}");
    assert!(!message.contains("truncated or corrupt"), "{message}");
}

/// Two whole pickles one after the other (`pickle.dump` twice to one file) are said to be
/// that, with where the first ends, whether the second starts with PROTO (protocol 2 and
/// later) or is read to a STOP of its own (protocols 0 and 1), and a first that is a snapshot
/// is named as one; before, "not a readable snapshot pickle (truncated or corrupt?): bytes
/// follow the end of the pickle (STOP)". `pickle.dumps([1, 2, 3], protocol=4)` is 22 bytes
/// (its STOP at byte 21), at protocol 0 18 bytes; the snapshot of make.py at protocol 4, 340.
#[test_case("two-pickles-protocol4.pickle", "two or more pickles one after the other: the first ends at byte 21 (its STOP) and another starts at byte 22" ; "protocol 4")]
#[test_case("two-pickles-protocol0.pickle", "two or more pickles one after the other: the first ends at byte 17 (its STOP) and another starts at byte 18" ; "protocol 0: no PROTO")]
#[test_case("two-snapshots.pickle", "two or more pickles one after the other: the first, a PyTorch memory snapshot, ends at byte 339 (its STOP) and another starts at byte 340" ; "two snapshots")]
fn pickles_one_after_the_other_are_named(file: &str, said: &str) {
    let message = refusal(&fixture(file), None);
    assert!(message.contains(said), "{message}");
    assert!(
        message.contains("a snapshot file is one pickle"),
        "{message}"
    );
    assert!(!message.contains("truncated or corrupt"), "{message}");
}

/// The first of two pickles that is not a snapshot is named, in a sentence that reads (before,
/// "…; a snapshot file is one pickle, not a PyTorch memory snapshot (…)"); the first of two
/// segment lists (`pickle.dump(torch.cuda.memory_snapshot(), f)` to a file opened 'ab') is
/// named a segment list, a form portalloc reads, not "not a PyTorch memory snapshot".
#[test_case("two-pickles-protocol4.pickle", "another starts at byte 22 (pickle.dump called more than once on one file?); the first is a list, not a PyTorch memory snapshot (a dict with segments and device_traces, as torch.cuda.memory._dump_snapshot writes it), and a snapshot file is one pickle" ; "a list first")]
#[test_case("two-segment-lists.pickle", "two or more pickles one after the other: the first, a segment list (torch.cuda.memory_snapshot(), pickled), ends at byte 742 (its STOP) and another starts at byte 743; portalloc reads one segment list per file" ; "two segment lists")]
fn the_first_of_two_pickles_is_named(file: &str, said: &str) {
    let message = refusal(&fixture(file), None);
    assert!(message.contains(said), "{message}");
    if file.contains("segment") {
        assert!(
            !message.contains("not a PyTorch memory snapshot"),
            "{message}"
        );
    }
}

/// Bytes after a snapshot that read as no whole pickle (a PROTO then no pickle, a second
/// snapshot cut short) are not called another pickle (before, "two or more pickles … another
/// starts at byte 340", for a PROTO alone): they are bytes after the end, and the pickle
/// before them is said to be a snapshot.
#[test_case("snapshot-then-proto-junk.pickle" ; "PROTO 4 then junk")]
#[test_case("snapshot-then-cut-pickle.pickle" ; "a second snapshot cut short")]
fn bytes_after_a_snapshot_that_are_no_pickle_are_named(file: &str) {
    let message = refusal(&fixture(file), None);
    assert!(
        message.contains(
            "bytes follow the end of the pickle (STOP) at byte 340 that read as no whole pickle"
        ),
        "{message}"
    );
    assert!(
        message.contains(
            "the pickle before them, to its STOP at byte 339, is a PyTorch memory snapshot"
        ),
        "{message}"
    );
    assert!(!message.contains("two or more pickles"), "{message}");
}

/// A snapshot followed by a newline reads as the snapshot (pickle.load ignores what follows
/// its STOP), with a note; before, "truncated or corrupt?".
#[test]
fn a_newline_after_a_snapshot_is_ignored() {
    let mut t = trace::open_reader(
        Cursor::new(fixture("snapshot-then-newline.pickle")),
        "input",
        &Options::new(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        t.header().notes.iter().any(|n| n.contains(
            "1 bytes of whitespace after the pickle's end (its STOP at byte 339) ignored"
        )),
        "{:?}",
        t.header().notes
    );
    let read: Vec<Event> = t.by_ref().collect::<Result<_, _>>().unwrap();
    assert_eq!(read, events(&fixture("snapshot-protocol4.pickle")));
}

/// An empty list says it may be a segment list with no segments.
#[test]
fn an_empty_list_is_named() {
    let message = refusal(&fixture("list-empty.pickle"), None);
    assert!(
        message.contains("a valid pickle, but of an empty list (a segment list with no segments?)"),
        "{message}"
    );
}

/// Bytes after a pickle that start no other pickle (zeros padding a file) are still bytes
/// after its end, not a second pickle.
#[test_case("pickle-then-zeros.pickle" ; "eight zero bytes")]
fn bytes_after_a_pickle_that_start_none_are_not_another(file: &str) {
    let message = refusal(&fixture(file), None);
    assert!(
        message.contains("bytes follow the end of the pickle (STOP) at byte 22"),
        "{message}"
    );
    assert!(!message.contains("two or more pickles"), "{message}");
}

/// A global's name is cut by the excerpt rule and its control characters escaped: a module
/// name of an escape sequence and 200 more characters is not echoed whole, nor raw.
#[test]
fn a_hostile_global_name_is_cut_and_escaped() {
    let message = refusal(&fixture("escape-in-global.pickle"), None);
    assert!(message.contains("a pickle of \\u{1b}[31mxxx"), "{message}");
    assert!(message.contains("… (211 bytes)"), "{message}");
    assert!(!message.contains(&"x".repeat(100)), "{message}");
}

/// A dict without `segments` or `device_traces` is refused naming the keys it has (at most
/// five, each an excerpt) and the keys a snapshot has; before, any dict was taken for a
/// snapshot recorded without history ("was _record_memory_history enabled?").
#[test_case("dict-two-keys.pickle", "a dict with the keys \"foo\", \"bar\"" ; "two keys")]
#[test_case("dict-twelve-keys.pickle", "a dict with 12 keys: \"k0\", \"k1\", \"k2\", \"k3\", \"k4\", …" ; "twelve keys: five shown")]
#[test_case("dict-empty.pickle", "a dict with no keys (an empty dict)" ; "no keys")]
#[test_case("dict-bytes-key.pickle", "a dict with the keys \"\\u{1b}]0;title\\u{7}\"" ; "a bytes key with escapes")]
fn a_dict_without_a_snapshots_keys_names_its_keys(file: &str, keys: &str) {
    let message = refusal(&fixture(file), None);
    assert!(message.contains(keys), "{message}");
    assert!(
        message.contains("its keys are segments, device_traces"),
        "{message}"
    );
    assert!(!message.contains("_record_memory_history"), "{message}");
}

/// A dict with `segments` but no `device_traces` is a snapshot recorded without history: it
/// keeps the advice to record one.
#[test]
fn a_dict_with_segments_only_is_a_snapshot_without_history() {
    // pickle.dumps({'segments': []}, protocol=4)
    let bytes = b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x08segments\x94]\x94s.";
    let message = refusal(bytes, None);
    assert!(message.contains("_record_memory_history"), "{message}");
}

/// RMM's debug log (spdlog lines, RMM's pattern `[%6t][%H:%M:%S:%f][%-6l] %v` or spdlog's
/// default) is named, with the CSV event log to record instead; before, "corrupt JSON"
/// (sniffed) or "lacks the Thread column" (read as RMM CSV).
#[test_case(b"[ 12345][12:00:00:123456][info  ] allocate 0x7f00 1024\n", None ; "RMM's pattern, sniffed")]
#[test_case(b"[2024-01-01 12:00:00.000] [info] RMM logger ready\n", None ; "spdlog's default pattern, sniffed")]
#[test_case(b"\xef\xbb\xbf[ 12345][12:00:00:123456][debug ] x\n", None ; "after a byte-order mark")]
#[test_case(b"[ 12345][12:00:00:123456][info  ] allocate 0x7f00 1024\n", Some(Format::RmmCsv) ; "read as RMM CSV")]
fn rmms_debug_log_is_named(bytes: &[u8], format: Option<Format>) {
    let message = refusal(bytes, format);
    assert!(message.contains("RMM's debug log"), "{message}");
    assert!(
        message.contains("not its CSV event log")
            && message.contains("rmm.mr.LoggingResourceAdaptor(upstream, log_file_name="),
        "{message}"
    );
    assert!(!message.contains("corrupt JSON"), "{message}");
}

/// nvidia-smi's CSV samples totals and has no allocations: named as such; before, "unknown
/// trace format".
#[test_case(b"timestamp, name, memory.used [MiB], memory.total [MiB]\n2024/01/01 12:00:00.000, NVIDIA A100-SXM4-40GB, 1024 MiB, 40960 MiB\n" ; "query-gpu")]
#[test_case(b"pid, process_name, used_gpu_memory [MiB]\n1234, python, 2048 MiB\n" ; "query-compute-apps")]
fn nvidia_smi_csv_is_named(bytes: &[u8]) {
    let message = refusal(bytes, None);
    assert!(message.contains("nvidia-smi's CSV output"), "{message}");
    assert!(message.contains("holds no allocations"), "{message}");
}

/// A bare JSON array of events is still a Kineto trace, whatever the blanks before its first
/// event (the `[` of RMM's debug log no longer is).
#[test_case(b"[{\"ph\":\"i\",\"name\":\"x\",\"ts\":1}]" ; "adjacent")]
#[test_case(b"[\n  {\"ph\":\"i\",\"name\":\"x\",\"ts\":1}\n]" ; "blanks between")]
fn a_bare_event_array_is_still_kineto(bytes: &[u8]) {
    assert_eq!(trace::detect(bytes), Some(Format::Kineto));
}

const PORTALLOC: &[u8] = b"{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n[0,0,0,0,\"a\",1,8]\n[1,5,0,0,\"f\",1,8]\n{\"end\":{\"events\":2}}\n";
const RMM: &[u8] = b"Thread,Time,Action,Pointer,Size,Stream\n1,00:00:01.000000,allocate,0x10,8,0x0\n1,00:00:02.000000,free,0x10,8,0x0\n";
const LIFETIMES: &[u8] = b"id,lower,upper,size\n0,0,1,8\n1,1,3,16\n";
const KINETO: &[u8] = b"{\"traceEvents\":[{\"ph\":\"i\",\"name\":\"[memory]\",\"ts\":1,\"pid\":1,\"tid\":1,\"args\":{\"Device Type\":1,\"Device Id\":0,\"Addr\":16,\"Bytes\":8,\"Total Allocated\":8,\"Total Reserved\":8}},{\"ph\":\"i\",\"name\":\"[memory]\",\"ts\":2,\"pid\":1,\"tid\":1,\"args\":{\"Device Type\":1,\"Device Id\":0,\"Addr\":16,\"Bytes\":-8,\"Total Allocated\":0,\"Total Reserved\":8}}]}";

/// A UTF-8 byte-order mark before any text format is skipped: the file reads as the same
/// events as without it (the portalloc JSON-lines header failed on it before: "expected value
/// at line 1 column 1").
#[test_case(PORTALLOC ; "portalloc JSON lines")]
#[test_case(RMM ; "RMM CSV")]
#[test_case(LIFETIMES ; "buffer-lifetime CSV")]
#[test_case(KINETO ; "Kineto JSON")]
fn a_byte_order_mark_is_skipped(text: &[u8]) {
    let plain = events(text);
    // Two allocations and their frees in the lifetimes CSV, one and its free elsewhere.
    assert_eq!(plain.len(), if text == LIFETIMES { 4 } else { 2 });
    let with_bom = [b"\xef\xbb\xbf", text].concat();
    assert_eq!(events(&with_bom), plain);
}

/// A header number no `u64` field takes is named with its field and said to be out of range
/// or not an integer, in the wording of every reader; before, an integer past 2^64 − 1 was
/// "is \"…\", out of range: at most …" and a fraction or a negative serde_json's "invalid
/// type: floating point `1.5`" / "invalid value: integer `-1`", the field not named.
#[test_case("baseline_bytes", "18446744073709551616", "is out of range (0..=2^64−1)" ; "2^64")]
#[test_case("baseline_bytes", "99999999999999999999999999", "is out of range (0..=2^64−1)" ; "26 digits")]
#[test_case("baseline_bytes", "-1", "is out of range (0..=2^64−1)" ; "a negative")]
#[test_case("baseline_bytes", "1.5", "is not an integer" ; "a fraction")]
#[test_case("baseline_bytes", "1e3", "is not an integer" ; "an exponent")]
#[test_case("version", "1.5", "is not an integer" ; "the version a fraction")]
fn a_header_number_no_u64_holds_is_named_with_its_field(field: &str, number: &str, said: &str) {
    let text = format!(
        "{{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\",\"{field}\":{number}}}\n{{\"end\":{{\"events\":0}}}}\n"
    );
    let text = text.replacen("\"version\":1,", "", usize::from(field == "version"));
    let message = refusal(text.as_bytes(), None);
    assert!(
        message.contains(&format!(
            "line 1: header field \"{field}\" \"{number}\" {said}"
        )),
        "{message}"
    );
    assert!(
        !message.contains("floating point") && !message.contains("invalid value"),
        "{message}"
    );
}

/// A CSV size no `u64` holds, or that is no integer, is named with its column and line in the
/// same wording; before, RMM's "Size \"…\" is not a byte count" and the lifetime CSV's "size
/// \"…\" is not a non-negative integer", for a number too large as for one that is no number.
#[test_case("Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0x1000,{},0x0\n", "Size" ; "RMM CSV")]
#[test_case("id,lower,upper,size\n1,0,2,{}\n", "size" ; "lifetimes CSV")]
fn a_csv_size_no_u64_holds_is_out_of_range(template: &str, column: &str) {
    for (number, said) in [
        ("18446744073709551616", "is out of range (0..=2^64−1)"),
        ("-1", "is out of range (0..=2^64−1)"),
        ("1.5", "is not an integer"),
        ("lots", "is not an integer"),
    ] {
        let message = refusal(template.replace("{}", number).as_bytes(), None);
        assert!(
            message.contains(&format!("line 2: {column} \"{number}\" {said}")),
            "{message}"
        );
    }
}

/// A snapshot pickled at protocol 0 or 1 (text opcodes, no PROTO: `(dp0\n…`, `}q\0(…`) is
/// sniffed as a snapshot and reads as the same snapshot at protocol 4 does; before, "unknown
/// trace format" though `--format pytorch-snapshot` read it.
#[test_case("snapshot-protocol0.pickle" ; "protocol 0")]
#[test_case("snapshot-protocol1.pickle" ; "protocol 1")]
fn a_snapshot_at_protocol_0_or_1_is_sniffed(file: &str) {
    let bytes = fixture(file);
    assert_eq!(trace::detect(&bytes), Some(Format::PytorchSnapshot));
    let read = events(&bytes);
    assert_eq!(read.len(), 3);
    assert_eq!(read, events(&fixture("snapshot-protocol4.pickle")));
}

/// Other pickles at protocols 0 and 1 are sniffed as pickles too and refused as what they
/// are, not "unknown trace format".
#[test_case("deque-protocol0.pickle", "a pickle of collections.deque" ; "a deque, GLOBAL")]
#[test_case("list-protocol0.pickle", "a valid pickle, but of a list" ; "a list, protocol 0")]
#[test_case("list-protocol1.pickle", "a valid pickle, but of a list" ; "a list, protocol 1")]
fn other_pickles_at_protocol_0_or_1_are_named(file: &str, named: &str) {
    let message = refusal(&fixture(file), None);
    assert!(message.contains(named), "{message}");
    assert!(!message.contains("unknown trace format"), "{message}");
}

/// A dict with an empty `device_traces` and no `segments` (`{'device_traces': []}`) is not a
/// snapshot: refused with its keys and a snapshot's; one with both keys whose device_traces is
/// an empty list traced no device and is refused. Before, both replayed as "0 events …
/// recorded on cuda:0", a device invented for an empty list.
#[test_case("device-traces-only-protocol0.pickle", "a dict with the keys \"device_traces\"" ; "traces only, protocol 0")]
#[test_case("device-traces-only-protocol4.pickle", "a dict with the keys \"device_traces\"" ; "traces only, protocol 4")]
#[test_case("no-device-traced.pickle", "device_traces is an empty list: it traced no device" ; "both keys, no device")]
fn a_dict_without_segments_or_devices_is_refused(file: &str, said: &str) {
    let message = refusal(&fixture(file), None);
    assert!(message.contains(said), "{message}");
    assert!(!message.contains("cuda:0"), "{message}");
}

/// An XLA live-range file given alone (`HloLiveRange (max …` its first line) is named as part
/// of a dump, with what to give instead; before, "unknown trace format".
#[test]
fn a_lone_live_range_file_is_named_as_part_of_a_dump() {
    let path =
        xla_module_dir().join("module_0030.jit_train_step.cpu_after_optimizations-live-range.txt");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.starts_with(b"HloLiveRange (max "));
    let message = refusal(&bytes, None);
    assert!(
        message.contains("an XLA live-range file, part of an XLA dump: give its directory or its `*-buffer-assignment.txt`"),
        "{message}"
    );
    assert!(!message.contains("unknown trace format"), "{message}");
}

/// A JSON object on an event line is said to be one (events are arrays, the only object is
/// the end line); before, "corrupt end line: unknown field `seq`, expected `end`". A broken
/// end line is still a corrupt end line.
#[test_case("{\"seq\":0,\"op\":\"a\",\"id\":1,\"size\":8}", "holds a JSON object that is not the end line" ; "an event as an object")]
#[test_case("{}", "holds a JSON object that is not the end line" ; "an empty object")]
#[test_case("{\"end\":{\"events\":\"two\"}}", "corrupt end line" ; "a broken end line")]
fn an_object_on_an_event_line_is_named(line: &str, said: &str) {
    let text = format!(
        "{{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}}\n{line}\n{{\"end\":{{\"events\":0}}}}\n"
    );
    let message = refusal(text.as_bytes(), None);
    assert!(message.contains(said), "{message}");
    assert!(message.contains("line 2"), "{message}");
}

fn xla_module_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/xla/mlp_train")
}

fn buffer_assignment_file(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .expect("read the dump")
        .map(|e| e.expect("entry").path())
        .find(|p| xla_dump::is_buffer_assignment_file(p))
        .expect("a buffer-assignment file")
}

/// A lone buffer-assignment file is its module: the same events and figures as its dump
/// directory (which holds that one module), and `--per-buffer` reads the live-range file
/// beside it; before, only the directory was accepted.
#[test_case(false ; "as the runtime allocates")]
#[test_case(true ; "per buffer, from the live-range file beside it")]
fn a_buffer_assignment_file_reads_as_its_module(per_buffer: bool) {
    let dir = xla_module_dir();
    let file = buffer_assignment_file(&dir);
    let options = XlaOptions {
        per_buffer,
        ..XlaOptions::default()
    };
    let whole = xla_dump::read_dir(&dir, &options).expect("the directory");
    let lone = xla_dump::read_path(&file, &options).expect("the file");
    assert_eq!(lone.events, whole.events);
    assert_eq!(lone.stats, whole.stats);
    assert_eq!(lone.file, whole.file);
    assert!(
        lone.header.notes[0].contains("its buffer-assignment file given"),
        "{:?}",
        lone.header.notes
    );
}

/// `read_path` of a file that is not a buffer-assignment file says what it accepts.
#[test]
fn read_path_refuses_other_files() {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/xla/README.md");
    match xla_dump::read_path(&readme, &XlaOptions::default()) {
        Err(m) => assert!(
            m.message().contains("not an XLA dump")
                && m.message().contains("*-buffer-assignment.txt"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
}

/// `trace::open` of a buffer-assignment file says what it is and who reads it (before:
/// "unknown trace format"), and the list of accepted formats names XLA dumps, directory or
/// buffer-assignment file.
#[test]
fn trace_open_names_a_buffer_assignment_file() {
    let file = buffer_assignment_file(&xla_module_dir());
    match trace::open(&file, &Options::new()) {
        Err(m) => {
            assert!(m.message().contains("an XLA buffer-assignment file"), "{m}");
            assert!(m.message().contains("portalloc replay"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    let accepted = Format::accepted();
    assert!(
        accepted.contains("XLA dump") && accepted.contains("*-buffer-assignment.txt"),
        "{accepted}"
    );
}

/// `portalloc replay` with `args`: whether it succeeded, its standard output and error.
#[cfg(feature = "cli")]
fn replay(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_portalloc"));
    cmd.arg("replay").args(args);
    for var in portalloc::config::VARIABLES {
        cmd.env_remove(var);
    }
    let out = cmd.output().expect("run portalloc");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `portalloc replay` takes a lone buffer-assignment file as its module, and warns on
/// standard error about each option given that does not apply to an XLA dump (before:
/// "unknown trace format", and `--format`, `--strict`, `--trace-device` silently ignored).
#[cfg(feature = "cli")]
#[test_case(&[] ; "no options")]
#[test_case(&["--format", "rmm-csv", "--strict", "--trace-device", "0", "--baseline", "1MiB"] ; "options for trace files")]
fn replay_warns_of_options_an_xla_dump_ignores(options: &[&str]) {
    let dir = xla_module_dir();
    for input in [dir.clone(), buffer_assignment_file(&dir)] {
        let mut args: Vec<&std::ffi::OsStr> = options.iter().map(|o| o.as_ref()).collect();
        args.push(input.as_os_str());
        let (ok, out, err) = replay(&args);
        assert!(ok, "{err}");
        assert!(out.contains("jit_train_step"), "{out}");
        for (option, given) in [
            ("--format", options.contains(&"--format")),
            ("--strict", options.contains(&"--strict")),
            ("--trace-device", options.contains(&"--trace-device")),
            ("--baseline", options.contains(&"--baseline")),
        ] {
            let warned = format!("{option} does not apply to an XLA dump");
            assert_eq!(err.contains(&warned), given, "{option}: {err}");
        }
    }
}

/// `--module` and `--per-buffer` given with a trace file are said not to apply to it.
#[cfg(feature = "cli")]
#[test]
fn replay_warns_of_xla_options_given_with_a_trace_file() {
    let file = std::env::temp_dir().join(format!("not-a-trace-{}.jsonl", std::process::id()));
    std::fs::write(&file, PORTALLOC).expect("write the trace");
    let (ok, _, err) = replay(&[
        "--module".as_ref(),
        "jit_f".as_ref(),
        "--per-buffer".as_ref(),
        file.as_os_str(),
    ]);
    let _ = std::fs::remove_file(&file);
    assert!(ok, "{err}");
    assert!(err.contains("--module applies to XLA dumps only"), "{err}");
    assert!(
        err.contains("--per-buffer applies to XLA dumps only"),
        "{err}"
    );
}

/// The seeds of the `trace_reader` fuzz target (`fuzz/corpus/trace_reader/`, the files above
/// among them), decoded as the target decodes them (first byte: bit 7 strict, bits 0-2 the
/// format: 0-2 sniffed, else `Format::ALL[i - 3]`, bit 6 a device), read on stable Rust
/// with the target's invariants: an `Error::Trace` or events whose `seq` increases.
#[test]
fn the_trace_reader_seeds_keep_the_fuzz_targets_invariants() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/trace_reader");
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .expect("the corpus")
        .map(|e| e.expect("entry").path())
        .collect();
    seeds.sort();
    assert!(seeds.iter().any(|p| p.ends_with("pickle_of_deque")));
    for seed in seeds {
        let data = std::fs::read(&seed).expect("a seed");
        let Some((&mode, bytes)) = data.split_first() else {
            continue;
        };
        let mut options = Options::new().with_strict(mode & 0x80 != 0);
        options.format = match mode & 7 {
            0..=2 => None,
            i => Some(Format::ALL[usize::from(i - 3) % Format::ALL.len()]),
        };
        if mode & 0x40 != 0 {
            options.device = Some(u32::from(mode & 0x3));
        }
        let read = trace::open_reader(Cursor::new(bytes.to_vec()), "fuzz", &options)
            .and_then(|t| t.collect::<portalloc::trace::Result<Vec<Event>>>());
        match read {
            Ok(events) => assert!(
                events.windows(2).all(|w| w[0].seq < w[1].seq),
                "{}: seq does not increase",
                seed.display()
            ),
            Err(m) => assert!(
                m.message().len() <= 1100,
                "{}: {:.200}",
                seed.display(),
                m.message()
            ),
        }
    }
}
