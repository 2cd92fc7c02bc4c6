//! Bounds on untrusted input (docs/trace-format.md, "Limits on untrusted files"): files that
//! are not regular files are read without blocking and with a byte cap, gzip streams are
//! inflated to at most a cap, XLA dumps make at most 20 million events, a ledger is read in
//! bounded memory, messages show values bounded and escaped, and a closed pipe ends the
//! command line quietly.
//!
//! A test that could block (a FIFO nobody writes to) runs under a deadline, so that a
//! regression fails instead of hanging the suite.
#![cfg(feature = "cli")]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use crate::support::cli::{portalloc, DEADLINE};
use portalloc::trace::import::xla_dump::{self, BufferAssignment, XlaOptions};
use portalloc::trace::{self, Format, Options};
use portalloc::Error;
use test_case::test_case;

/// A fresh directory under the system's temp dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("portalloc-bounds-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn file(&self, name: &str, content: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    /// A FIFO named `name` that nobody writes to.
    fn fifo(&self, name: &str) -> PathBuf {
        let path = self.0.join(name);
        let status = Command::new("mkfifo").arg(&path).status().expect("mkfifo");
        assert!(status.success(), "mkfifo {}", path.display());
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `f` on a thread of its own and gives its result, or fails once [`DEADLINE`] passes
/// (`what` blocked).
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(DEADLINE)
        .unwrap_or_else(|_| panic!("{what} blocked for {DEADLINE:?}"))
}

fn error_text<T: std::fmt::Debug>(r: portalloc::trace::Result<T>) -> String {
    r.expect_err("must be refused").to_string()
}

/// Every event of the trace at `path`, or its first error.
fn read_all(path: &Path, options: &Options) -> portalloc::trace::Result<usize> {
    let trace = trace::open(path, options)?;
    let mut n = 0;
    for event in trace {
        event?;
        n += 1;
    }
    Ok(n)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

// ------------------------------------------------------------------ files that are not files

/// A FIFO with no writer reads as empty: `open(2)` of a FIFO for reading waits for a writer,
/// which never comes; the trace reader opens it without blocking.
#[test]
fn a_fifo_nobody_writes_to_is_an_empty_trace_not_a_hang() {
    let s = Scratch::new("fifo-open");
    let fifo = s.fifo("trace.jsonl");
    let text = within("trace::open of a FIFO", move || {
        error_text(trace::open(&fifo, &Options::default()))
    });
    assert!(text.contains("the input is empty"), "{text}");
}

/// How many of this process's open files are `path` (`/proc/self/fd`).
fn open_files_of(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|target| target == path)
                .count()
        })
        .unwrap_or(0)
}

/// A FIFO with a writer is read to its end: the reader, opened without blocking, waits for
/// the writer's bytes instead of taking "no bytes yet" for the end. The writer opens it for
/// reading and writing (which never blocks) and writes; once the reader has it open too
/// (seen in `/proc/self/fd`), the writer closes its end, which the reader sees as the end.
#[test]
fn a_fifo_with_a_writer_is_read_to_its_end() {
    if !Path::new("/proc/self/fd").exists() {
        return crate::support::skip("no /proc/self/fd");
    }
    let s = Scratch::new("fifo-writer");
    let fifo = s.fifo("trace.jsonl").canonicalize().unwrap();
    let events = within("trace::open of a FIFO with a writer", move || {
        let mut writer = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)
            .unwrap();
        writer
            .write_all(
                b"{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n\
                  [0,0,0,0,\"a\",1,64]\n[1,1,0,0,\"f\",1,64]\n{\"end\":{\"events\":2}}\n",
            )
            .unwrap();
        let path = fifo.clone();
        let reader = std::thread::spawn(move || {
            trace::open(&path, &Options::default())
                .and_then(|t| t.collect::<portalloc::trace::Result<Vec<_>>>())
        });
        while open_files_of(&fifo) < 2 {
            std::thread::yield_now();
        }
        drop(writer);
        reader.join().unwrap()
    });
    assert_eq!(events.unwrap().len(), 2);
}

/// The command line too: `replay` of a FIFO nobody writes to ends with that error.
#[test]
fn replay_of_a_fifo_nobody_writes_to_ends() {
    let s = Scratch::new("fifo-replay");
    let fifo = s.fifo("trace.jsonl");
    let (ok, _, err) = portalloc(&["replay", fifo.to_str().unwrap()], &[]);
    assert!(!ok && err.contains("the input is empty"), "{err}");
}

/// `/dev/zero` as a trace stops at once: detected as no format from its first 8 KiB, or, read
/// as a text format, at the first line longer than 16 MiB. The spool copies only what the
/// first pass read and is removed: nothing is left in TMPDIR (the spool grew without limit).
#[test_case(&[] , "unknown trace format" ; "detected")]
#[test_case(&["--format", "portalloc"], "longer than 16 MiB" ; "as portalloc json lines")]
#[test_case(&["--format", "rmm-csv"], "longer than 16 MiB" ; "as rmm csv")]
fn replay_of_dev_zero_stops_and_leaves_no_spool(extra: &[&str], want: &str) {
    if !Path::new("/dev/zero").exists() {
        return crate::support::skip("no /dev/zero");
    }
    // One directory per case: two cases with as many arguments shared one, and removed it
    // under each other.
    let tmp = Scratch::new(&format!("zero-{}", extra.join("-")));
    let mut args = vec!["replay"];
    args.extend_from_slice(extra);
    args.push("/dev/zero");
    let (ok, _, err) = portalloc(&args, &[("TMPDIR", tmp.0.to_str().unwrap())]);
    assert!(!ok && err.contains(want), "{err:.400}");
    let left: Vec<_> = std::fs::read_dir(&tmp.0).unwrap().collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}

/// A trace read from a pipe (`/dev/stdin`) is spooled and replayed by every strategy.
#[test]
fn a_trace_on_a_pipe_is_replayed_by_every_strategy() {
    let trace = "{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n\
                 [0,0,0,0,\"a\",1,1048576]\n[1,1,0,0,\"f\",1,1048576]\n{\"end\":{\"events\":2}}\n";
    let (ok, text, err) = crate::support::cli::run(
        &[
            "replay",
            "--json",
            "--strategies",
            "bfc,platform",
            "/dev/stdin",
        ],
        &[],
        Some(trace.as_bytes()),
    );
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let results = json["traces"][0]["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        assert_eq!(r["peak_live"], 1_048_576, "{r}");
    }
}

/// A ledger FIFO nobody writes to and `/dev/zero` are refused at once (the whole file was
/// read first: `/dev/zero` grew to 2 GB of memory, a FIFO blocked), and a file over the
/// ledger's limit by its size, before it is read (a sparse file: no disk used).
#[test]
fn ledger_of_a_fifo_dev_zero_or_a_huge_file_is_refused_at_once() {
    let s = Scratch::new("ledger");
    let fifo = s.fifo("ledger.json");
    let (ok, _, err) = portalloc(&["ledger", fifo.to_str().unwrap()], &[]);
    assert!(
        !ok && err.contains("not a portalloc ledger snapshot"),
        "{err}"
    );
    if Path::new("/dev/zero").exists() {
        let (ok, _, err) = portalloc(&["ledger", "/dev/zero"], &[]);
        assert!(
            !ok && err.contains("not a portalloc ledger snapshot"),
            "{err}"
        );
    }
    let huge = s.0.join("huge.json");
    let f = std::fs::File::create(&huge).unwrap();
    f.set_len((2 << 30) + 1).unwrap();
    drop(f);
    let (ok, _, err) = portalloc(&["ledger", huge.to_str().unwrap()], &[]);
    assert!(
        !ok && err.contains("refused") && err.contains("1.00 GiB"),
        "{err}"
    );
}

/// A FIFO where an XLA dump has a buffer-assignment file is refused before it is opened
/// (opening it waited for a writer for ever), read alone or as part of its directory.
#[test]
fn an_xla_dump_file_that_is_a_fifo_is_refused() {
    let s = Scratch::new("xla-fifo");
    let fifo = s.fifo("module_0001.jit_f.cpu_after_optimizations-buffer-assignment.txt");
    let text = within("BufferAssignment::read of a FIFO", move || {
        error_text(BufferAssignment::read(&fifo))
    });
    assert!(text.contains("not a regular file"), "{text}");
    let dir = s.0.clone();
    let text = within("read_dir of a dump holding a FIFO", move || {
        error_text(xla_dump::read_dir(&dir, &XlaOptions::default()))
    });
    assert!(text.contains("not a regular file"), "{text}");
}

/// A vendor library path that names a FIFO is refused before `dlopen`, whose `open` would
/// wait for a writer for ever: `portalloc info` says why and goes on.
#[test_case("PORTALLOC_CUDA_LIBRARY", "cuda" ; "cuda")]
#[test_case("PORTALLOC_HIP_LIBRARY", "hip" ; "hip")]
fn a_library_path_that_is_a_fifo_is_refused_before_loading(variable: &str, feature: &str) {
    let compiled = match feature {
        "cuda" => cfg!(feature = "cuda"),
        _ => cfg!(feature = "hip"),
    };
    if !compiled {
        return crate::support::skip(&format!("built without the {feature} feature"));
    }
    let s = Scratch::new(&format!("lib-{feature}"));
    let fifo = s.fifo("libvendor.so");
    let (ok, out, err) = portalloc(&["info"], &[(variable, fifo.to_str().unwrap())]);
    assert!(ok, "{err}");
    assert!(out.contains("not a regular file"), "{out}");
}

// ------------------------------------------------------------------ inflated size

/// Each text format, gzip'd, holding more than the inflated-size cap (here 1 MiB, by
/// `Options::max_input_bytes`; 1 GiB by default) is refused at the cap with an error that
/// names it and `--trusted-input` (a 10 MB file of 10 GiB of blank lines was inflated to its
/// end, and again for each strategy).
#[test_case(Format::Portalloc, "{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n" ; "portalloc json lines")]
#[test_case(Format::RmmCsv, "Thread,Time,Action,Pointer,Size,Stream\n" ; "rmm csv")]
#[test_case(Format::LifetimesCsv, "id,lower,upper,size\n" ; "lifetimes csv")]
#[test_case(Format::Kineto, "{\"traceEvents\": [" ; "kineto")]
fn a_gzip_stream_past_the_cap_is_refused(format: Format, head: &str) {
    let s = Scratch::new(&format!("gz-{}", format.name()));
    let mut text = head.as_bytes().to_vec();
    // Blank lines (JSON whitespace): 2 MiB past the head.
    text.resize(text.len() + (2 << 20), b'\n');
    let path = s.file("blank.gz", &gzip(&text));
    let options = Options::default().with_max_input_bytes(1 << 20);
    let text = error_text(read_all(&path, &options));
    assert!(
        text.contains("exceeds the limit of 1.00 MiB") && text.contains("--trusted-input"),
        "{}: {text}",
        format.name()
    );
    // The same stream under the cap reads on (to its own end, or its own error).
    let roomy = Options::default().with_max_input_bytes(4 << 20);
    if let Err(e) = read_all(&path, &roomy) {
        assert!(!e.to_string().contains("exceeds the limit"), "{e}");
    }
}

/// The caps as docs/trace-format.md states them: 1 GiB untrusted, 16 GiB trusted.
#[test]
fn the_input_caps_are_one_gib_and_sixteen_trusted() {
    assert_eq!(Options::default().input_limit(), 1 << 30);
    assert_eq!(
        Options::default().with_trusted(true).input_limit(),
        16 << 30
    );
    assert_eq!(
        Options::default()
            .with_max_input_bytes(5)
            .with_trusted(true)
            .input_limit(),
        5
    );
}

// ------------------------------------------------------------------ XLA events

/// A module with `outputs` outputs (1 KiB each), one argument and a temporary.
fn module_with_outputs(outputs: usize) -> String {
    let mut text = String::from("BufferAssignment:\n");
    text.push_str("allocation 0: size 1024, parameter 0, shape |f32[256]| at ShapeIndex {}:\n");
    text.push_str("allocation 1: size 4096, preallocated-temp:\n");
    for i in 0..outputs {
        text.push_str(&format!(
            "allocation {}: size 1024, maybe-live-out:\n",
            i + 2
        ));
    }
    text
}

/// 1,000 outputs × 100,000 steps is 200 million events: refused with the count before any
/// is made (it aborted allocating 6 GiB); the cap is the workload's 20 million.
#[test]
fn an_xla_dump_past_twenty_million_events_is_refused_before_making_them() {
    assert_eq!(
        xla_dump::MAX_XLA_EVENTS,
        portalloc::replay::workload::MAX_EVENTS
    );
    let s = Scratch::new("xla-steps");
    s.file(
        "module_0001.jit_f.cpu_after_optimizations-buffer-assignment.txt",
        module_with_outputs(1000).as_bytes(),
    );
    let options = XlaOptions {
        steps: 100_000,
        ..XlaOptions::default()
    };
    let text = error_text(xla_dump::read_dir(&s.0, &options));
    assert!(
        text.contains("refused") && text.contains("20000000") && text.contains("--steps 100000"),
        "{text}"
    );
}

/// The count checked is the count made, for modules with and without temporaries and
/// donated arguments (the real dumps and a synthetic one).
#[test_case("mlp_train" ; "plain")]
#[test_case("mlp_train_donated" ; "donated")]
#[test_case("" ; "synthetic")]
fn the_xla_event_count_is_what_the_executions_make(case: &str) {
    let ba = if case.is_empty() {
        BufferAssignment::parse(module_with_outputs(7).as_bytes(), "synthetic").unwrap()
    } else {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/xla")
            .join(case);
        let file = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.to_string_lossy().ends_with("-buffer-assignment.txt"))
            .unwrap();
        BufferAssignment::read(&file).unwrap()
    };
    for steps in [1, 2, 5] {
        assert_eq!(
            ba.event_count(steps),
            ba.events(steps).len() as u64,
            "{case} × {steps}"
        );
    }
}

/// A module whose file name is not UTF-8 is replayed `--per-buffer` (its live-range file was
/// looked for under the lossy name, and not found), and its name is shown escaped.
#[cfg(unix)]
#[test]
fn a_module_name_that_is_not_utf8_replays_per_buffer() {
    use std::os::unix::ffi::OsStrExt;
    let s = Scratch::new("xla-utf8");
    let stem: &[u8] = b"module_0001.jit_\xff\x1b.cpu_after_optimizations";
    let name = |suffix: &str| {
        let mut n = stem.to_vec();
        n.extend_from_slice(suffix.as_bytes());
        s.0.join(std::ffi::OsStr::from_bytes(&n))
    };
    std::fs::write(
        name("-buffer-assignment.txt"),
        "BufferAssignment:\nallocation 0: size 64, maybe-live-out:\n value: <1 a @0> (size=64,offset=0): f32[16]{0}\n",
    )
    .unwrap();
    std::fs::write(
        name("-live-range.txt"),
        "HloLiveRange (max 3):\n  BufferLiveRange:\n    a{}:0-2\n",
    )
    .unwrap();
    let options = XlaOptions {
        per_buffer: true,
        ..XlaOptions::default()
    };
    let m = xla_dump::read_dir(&s.0, &options).expect("per-buffer replay");
    assert_eq!(m.events.len(), 2);
    assert!(
        !m.header.source.chars().any(char::is_control),
        "{:?}",
        m.header.source
    );
    assert!(m.header.source.contains("\\u{1b}"), "{:?}", m.header.source);
}

// ------------------------------------------------------------------ messages

/// A value, flag or path of 100,000 characters is shown cut (at 256 characters, with its
/// length), and its control characters escaped, in the error and on the terminal.
#[test]
fn a_huge_value_is_cut_and_escaped_in_messages() {
    let value = format!("\u{1b}]0;owned\u{7}{}", "v".repeat(100_000));
    let text =
        Error::config("PORTALLOC_FRACTION", value.as_str(), "a number in (0, 1]").to_string();
    assert!(text.len() < 1000, "{} bytes", text.len());
    assert!(
        text.contains(&format!("{} bytes", value.len())) && text.contains("\\u{1b}"),
        "{text:.120}"
    );
    assert!(!text.chars().any(char::is_control), "{text:.120}");

    let (ok, _, err) = portalloc(&["replay", "--format", &value, "x.jsonl"], &[]);
    assert!(
        !ok && err.len() < 1000 && !err.trim_end().contains('\u{1b}'),
        "{} bytes",
        err.len()
    );
    let path = format!("/{}", "p".repeat(100_000));
    let (ok, _, err) = portalloc(&["replay", &path], &[]);
    assert!(!ok && err.len() < 1000, "{} bytes: {err:.200}", err.len());
    let (ok, _, err) = portalloc(&["ledger", &path], &[]);
    assert!(!ok && err.len() < 1000, "{} bytes: {err:.200}", err.len());
}

/// A flag's value clap itself refuses (`--fraction` is not a number) is cut in the middle of
/// its line, which keeps what clap says of it (it was echoed whole: 100 KB); help and
/// usage errors are as clap prints them.
#[test]
fn a_huge_value_clap_refuses_is_cut() {
    let value = format!("\u{1b}[31m{}", "9".repeat(100_000));
    let (ok, _, err) = portalloc(&["replay", "--fraction", &value], &[]);
    assert!(!ok && err.len() < 2000, "{} bytes", err.len());
    assert!(
        err.contains("characters left out") && err.contains("--fraction"),
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "{err}");
    let (ok, out, _) = portalloc(&["--help"], &[]);
    assert!(ok && out.contains("Usage: portalloc"), "{out}");
    let (ok, _, err) = portalloc(&["replay", "--bogus"], &[]);
    assert!(
        !ok && err.contains("unexpected argument '--bogus'"),
        "{err}"
    );
}

/// `portalloc info | head -1`: the reader closes the pipe, and portalloc ends quietly with
/// status 0, as `rg` does (it panicked in `println!`, status 101).
#[test]
fn a_closed_pipe_ends_the_command_line_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_portalloc"))
        .arg("info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before portalloc writes anything.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
}

/// A gzip'd trace of a streaming format replays from a spool of its inflated bytes (inflated
/// once, not once per strategy and bisection step): the figures are those of the same trace
/// uncompressed, for every strategy and the bisection, and the spool is gone at the end.
#[test]
fn a_gzipd_streaming_trace_replays_as_its_plain_self_and_leaves_no_spool() {
    let s = Scratch::new("gz-spool");
    let tmp = Scratch::new("gz-spool-tmp");
    let mut text =
        String::from("{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n");
    // Four blocks of 3 MiB live at once, freed in turn: peak live 12 MiB.
    for i in 0..4u64 {
        text.push_str(&format!("[{i},{i},0,0,\"a\",{i},3145728]\n"));
    }
    for i in 0..4u64 {
        text.push_str(&format!("[{},{},0,0,\"f\",{i},3145728]\n", i + 4, i + 4));
    }
    text.push_str("{\"end\":{\"events\":8}}\n");
    let plain = s.file("t.jsonl", text.as_bytes());
    let packed = s.file("t.jsonl.gz", &gzip(text.as_bytes()));
    let figures = |path: &Path| {
        let (ok, out, err) = portalloc(
            &["replay", "--json", "--min-capacity", path.to_str().unwrap()],
            &[("TMPDIR", tmp.0.to_str().unwrap())],
        );
        assert!(ok, "{err}");
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        json["traces"][0]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["strategy"].clone(),
                    r["peak_live"].clone(),
                    r["peak_reserved"].clone(),
                    r["min_capacity"]["bytes"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    let want = figures(&plain);
    assert!(want.iter().all(|f| f.1 == 12 << 20), "{want:?}");
    assert_eq!(figures(&packed), want);
    let left: Vec<_> = std::fs::read_dir(&tmp.0).unwrap().collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}

/// The spool has no name in TMPDIR even while the replay runs (it was removed only at the
/// end, so a replay killed by SIGTERM or Ctrl-C left up to 1 GiB there): the replay reads a
/// FIFO whose writer stays open, and once it holds the spool open, TMPDIR is empty.
#[cfg(target_os = "linux")]
#[test]
fn the_spool_has_no_name_in_tmpdir_while_the_replay_runs() {
    let s = Scratch::new("spool-unnamed");
    let tmp = Scratch::new("spool-unnamed-tmp");
    let fifo = s.fifo("trace.jsonl").canonicalize().unwrap();
    // Read and write, so that opening it does not wait and the replay never sees its end.
    let mut writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    // More than the 8 KiB the format is told from, so that the spool is made and written.
    let mut text =
        String::from("{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n");
    for i in 0..1000u64 {
        text.push_str(&format!("[{i},{i},0,0,\"a\",{i},64]\n"));
    }
    writer.write_all(text.as_bytes()).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_portalloc"));
    for var in portalloc::config::VARIABLES {
        cmd.env_remove(var);
    }
    let mut child = cmd
        .args(["replay", fifo.to_str().unwrap()])
        .env("TMPDIR", &tmp.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let fds = PathBuf::from(format!("/proc/{}/fd", child.id()));
    let holds_spool = || {
        std::fs::read_dir(&fds)
            .into_iter()
            .flatten()
            .flatten()
            .any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|t| t.to_string_lossy().contains("portalloc-spool"))
            })
    };
    let start = std::time::Instant::now();
    while !holds_spool() && start.elapsed() < DEADLINE {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let held = holds_spool();
    // The spool is made with a name and unlinked at once: between the two the name may still
    // be seen, so TMPDIR is watched (while the replay still holds the spool) until it is empty.
    let names = || -> Vec<_> {
        std::fs::read_dir(&tmp.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect()
    };
    let mut left = names();
    let unlinking = std::time::Instant::now();
    while !left.is_empty() && unlinking.elapsed() < std::time::Duration::from_secs(2) {
        std::thread::sleep(std::time::Duration::from_millis(5));
        left = names();
    }
    let still_held = holds_spool();
    let _ = child.kill();
    let _ = child.wait();
    drop(writer);
    assert!(held, "the replay never opened its spool");
    assert!(
        still_held,
        "the replay let go of its spool before its name went"
    );
    assert!(
        left.is_empty(),
        "named in TMPDIR while the replay runs: {left:?}"
    );
}

/// A FIFO named like the driver in a directory of `LD_LIBRARY_PATH` is refused by name
/// before `dlopen`, which looks the bare name up there and waits on the FIFO for a writer for
/// ever: `portalloc info` says why and goes on.
#[test]
fn a_fifo_named_like_the_driver_on_ld_library_path_is_refused_not_waited_on() {
    if !cfg!(feature = "cuda") {
        return crate::support::skip("built without the cuda feature");
    }
    let s = Scratch::new("ld-library-path");
    let fifo = s.fifo("libcuda.so.1");
    let dirs = format!("/nonexistent:{}", s.0.display());
    let (ok, out, err) = portalloc(&["info"], &[("LD_LIBRARY_PATH", &dirs)]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!(
            "{} (found on LD_LIBRARY_PATH) is not a regular file",
            fifo.display()
        )),
        "{out}"
    );
}

/// A refused library's reason is one clause: the failures are joined with `; ` and shown
/// one a line, and a `;` in the reason made its hint a line of its own ("tried a vendor
/// library is a regular file").
#[test]
fn a_refused_library_reads_as_one_sentence() {
    if !cfg!(feature = "cuda") {
        return crate::support::skip("built without the cuda feature");
    }
    let s = Scratch::new("lib-sentence");
    let fifo = s.fifo("libvendor.so");
    let (ok, out, err) = portalloc(
        &["info"],
        &[("PORTALLOC_CUDA_LIBRARY", fifo.to_str().unwrap())],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "refused without loading: not a regular file (a FIFO, socket or device), where a \
             vendor library is a regular file (a shared object)"
        ),
        "{out}"
    );
    assert!(!out.contains("tried a vendor library"), "{out}");
}

/// An XLA buffer-assignment file given directly that is a FIFO is shown by its whole path
/// (up to the 256 characters of every path in a message), not cut to 40.
#[test]
fn an_xla_dump_fifo_given_directly_is_shown_by_its_whole_path() {
    let s = Scratch::new("xla-fifo-path");
    let fifo = s.fifo(
        "module_0001.jit_a_rather_long_module_name.cpu_after_optimizations-buffer-assignment.txt",
    );
    let shown = fifo.display().to_string();
    assert!(shown.len() > 40 && shown.len() <= 256, "{shown}");
    let text = within("xla_dump::read_path of a FIFO", move || {
        error_text(xla_dump::read_path(&fifo, &XlaOptions::default()))
    });
    assert!(text.contains(&shown), "{text}");
}

/// `--trusted-input` says what it raises: the input and inflate cap, 1 GiB to 16 GiB, not
/// only the snapshot limits.
#[test]
fn trusted_input_help_names_the_input_cap_it_raises() {
    let (ok, out, err) = portalloc(&["replay", "--help"], &[]);
    assert!(ok, "{err}");
    let help = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("to 16 GiB instead of 1 GiB"), "{help}");
}

/// `portalloc ledger` reads a regular file whole and anything else as it streams: both read
/// the same snapshot, and print the same report.
#[test]
fn a_ledger_file_and_the_same_bytes_on_a_pipe_print_the_same_report() {
    use portalloc::adaptor::LedgerAllocator;
    use portalloc::{Allocator, Stream};

    let s = Scratch::new("ledger-pipe");
    let ledger = LedgerAllocator::new(crate::support::common::bfc(
        &crate::support::common::simulated_host(64 << 20),
        32 << 20,
        false,
    ));
    let a = ledger
        .allocate(4096, 0, Stream::DEFAULT, "weights")
        .unwrap();
    let path = s.0.join("ledger.json");
    ledger.write_json(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let (ok, from_file, err) = portalloc(&["ledger", path.to_str().unwrap()], &[]);
    assert!(ok, "{err}");
    let (ok, from_pipe, err) =
        crate::support::cli::run(&["ledger", "/dev/stdin"], &[], Some(&bytes));
    assert!(ok, "{err}");
    assert!(from_file.contains("weights"), "{from_file}");
    assert_eq!(from_file, from_pipe);
    ledger.deallocate(a).unwrap();
}
