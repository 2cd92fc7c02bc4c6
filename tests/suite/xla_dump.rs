//! XLA dumps (`XLA_FLAGS=--xla_dump_to=DIR`) replayed as XLA's runtime allocates for them.
//!
//! The dumps under `tests/data/xla/` were made by `scripts/make-xla-dumps` (JAX 0.10.2 on
//! CPU); the figures below are what that script printed of `compiled.memory_analysis()`
//! (also in `tests/data/xla/README.md`).
#![cfg(feature = "trace")]

use std::path::{Path, PathBuf};

use portalloc::trace::import::xla_dump::{read_dir, XlaModule, XlaOptions};
use portalloc::trace::{summarize_events, Event, Op};

/// `compiled.memory_analysis()` of one case, as `scripts/make-xla-dumps` printed it.
struct Analysis {
    argument: u64,
    output: u64,
    alias: u64,
    temp: u64,
}

impl Analysis {
    fn peak(&self) -> u64 {
        self.argument + self.output + self.temp - self.alias
    }
}

// mlp_train: argument_size_in_bytes=117824 output_size_in_bytes=107644
// alias_size_in_bytes=0 temp_size_in_bytes=51200
const PLAIN: Analysis = Analysis {
    argument: 117_824,
    output: 107_644,
    alias: 0,
    temp: 51_200,
};
// mlp_train_donated (donate_argnums=(0,)): argument_size_in_bytes=117824
// output_size_in_bytes=107644 alias_size_in_bytes=107584 temp_size_in_bytes=141312
const DONATED: Analysis = Analysis {
    argument: 117_824,
    output: 107_644,
    alias: 107_584,
    temp: 141_312,
};

fn case(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/xla")
        .join(name)
}

fn read(name: &str, steps: u32) -> XlaModule {
    let options = XlaOptions {
        module: Some("jit_train_step".into()),
        steps,
        per_buffer: false,
    };
    read_dir(&case(name), &options).expect("dump reads")
}

fn peak(events: &[Event]) -> u64 {
    summarize_events(0, events.iter().copied().map(Ok))
        .expect("summary")
        .peak_live_bytes
}

/// Peak live bytes within each execution (time_ns = execution number), and live at the end.
fn per_step(events: &[Event], steps: u64) -> (Vec<u64>, u64) {
    let mut live = 0u64;
    let mut peaks = vec![0u64; steps as usize + 1];
    for e in events {
        match e.op {
            Op::Alloc => live += e.size,
            Op::Free => live -= e.size,
        }
        let p = &mut peaks[e.time_ns as usize];
        *p = (*p).max(live);
    }
    (peaks, live)
}

#[test]
fn one_step_peaks_at_memory_analysis_plain_and_donated() {
    for (name, want) in [("mlp_train", &PLAIN), ("mlp_train_donated", &DONATED)] {
        let m = read(name, 1);
        assert_eq!(m.name, "jit_train_step");
        assert_eq!(m.stats.argument_bytes, want.argument, "{name}");
        assert_eq!(m.stats.output_bytes, want.output, "{name}");
        assert_eq!(m.stats.alias_bytes, want.alias, "{name}");
        assert_eq!(m.stats.temp_bytes, want.temp, "{name}");
        assert_eq!(peak(&m.events), want.peak(), "{name}");
        assert_eq!(m.header.tags, ["argument", "output", "temp", "constant"]);
        // Every event carries a tag; exactly one temp arena, allocated and freed.
        assert!(m.events.iter().all(|e| e.tag != 0));
        let temps: Vec<_> = m
            .events
            .iter()
            .filter(|e| m.header.tag_name(e.tag) == Some("temp"))
            .collect();
        assert_eq!(temps.len(), 2, "{name}");
        assert!(temps.iter().all(|e| e.size == want.temp));
    }
    // Donation saves the aliased outputs, less the larger temp arena XLA then needs.
    assert_eq!(PLAIN.peak(), 276_668);
    assert_eq!(DONATED.peak(), 259_196);
}

#[test]
fn default_module_is_the_largest_and_named() {
    let m = read_dir(&case("mlp_train"), &XlaOptions::default()).unwrap();
    assert_eq!(m.name, "jit_train_step");
    assert!(m.header.notes.iter().any(|n| n.contains("jit_train_step")));
    assert!(m.header.source.starts_with("xla-dump:"));
}

#[test]
fn three_steps_feed_outputs_to_the_next_step() {
    for (name, want) in [("mlp_train", &PLAIN), ("mlp_train_donated", &DONATED)] {
        let m = read(name, 3);
        let (peaks, end) = per_step(&m.events, 3);
        // Arguments alone before the first execution.
        assert_eq!(peaks[0], want.argument, "{name}");
        // The first execution peaks as memory_analysis says.
        assert_eq!(peaks[1], want.peak(), "{name}");
        // Later ones: the previous outputs are the arguments (aliased ones reused in
        // place), the other arguments of the first step gone.
        let later = want.output + (want.output - want.alias) + want.temp;
        assert_eq!(peaks[2], later, "{name}");
        assert_eq!(peaks[3], later, "{name}");
        // The last outputs stay live, nothing else.
        assert_eq!(end, want.output, "{name}");
        assert_eq!(peak(&m.events), want.peak().max(later));
        let arenas = m
            .events
            .iter()
            .filter(|e| e.op == Op::Alloc && m.header.tag_name(e.tag) == Some("temp"))
            .count();
        assert_eq!(arenas, 3, "{name}");
        // Ids are unique per allocation, and every free matches an allocation.
        let mut live = std::collections::HashMap::new();
        for e in &m.events {
            match e.op {
                Op::Alloc => assert!(live.insert(e.id, e.size).is_none()),
                Op::Free => assert_eq!(live.remove(&e.id), Some(e.size)),
            }
        }
    }
    // mlp_train: 276 668 then 266 488; donated: 259 196 then 249 016.
    let donated = read("mlp_train_donated", 3);
    assert_eq!(per_step(&donated.events, 3).0[2], 249_016);
}

#[test]
fn per_buffer_peaks_where_xla_live_ranges_say() {
    // The figures of each case's *-live-range.txt: "Stack trace breakdown for peak usage:
    // 274 056 bytes" (plain, at instruction 25) and "265 800 bytes" (donated, at 28).
    for (name, want, at) in [
        ("mlp_train", 274_056, 25),
        ("mlp_train_donated", 265_800, 28),
    ] {
        let m = read_dir(
            &case(name),
            &XlaOptions {
                module: None,
                steps: 1,
                per_buffer: true,
            },
        )
        .unwrap();
        let s = summarize_events(0, m.events.iter().copied().map(Ok)).unwrap();
        assert_eq!(s.peak_live_bytes, want, "{name}");
        let seq = s.peak_seq.unwrap() as usize;
        assert_eq!(m.events[seq].time_ns, at, "{name}");
        assert!(m.events.iter().all(|e| e.tag != 0));
        assert!(m.header.notes.iter().any(|n| n.contains("--per-buffer")));
    }
}

#[test]
fn per_buffer_refuses_steps_and_missing_or_bad_live_ranges() {
    let per = |steps| XlaOptions {
        module: None,
        steps,
        per_buffer: true,
    };
    let text = error_of(&case("mlp_train"), &per(2));
    assert!(text.contains("one execution"), "{text}");
    let s = Scratch::with("nolive", b"BufferAssignment:\nallocation 0: size 4:\n");
    let text = error_of(&s.0, &per(1));
    assert!(
        text.contains("cannot open") && text.contains("-live-range.txt"),
        "{text}"
    );
    std::fs::write(
        s.0.join("module_0001.jit_f.cpu_after_optimizations-live-range.txt"),
        b"HloLiveRange (max 3):\n  BufferLiveRange:\n    a{}:0-2\n    b{}:5-1\n",
    )
    .unwrap();
    let text = error_of(&s.0, &per(1));
    assert!(
        text.contains("live-range.txt: line 4: live range \"5-1\""),
        "{text}"
    );
    // Without --per-buffer the live ranges are not read.
    assert!(read_dir(&s.0, &XlaOptions::default()).is_ok());
}

/// A fresh directory under the system's temp dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("portalloc-xla-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn with(tag: &str, content: &[u8]) -> Self {
        let s = Self::new(tag);
        std::fs::write(
            s.0.join("module_0001.jit_f.cpu_after_optimizations-buffer-assignment.txt"),
            content,
        )
        .unwrap();
        s
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn error_of(dir: &Path, options: &XlaOptions) -> String {
    match read_dir(dir, options) {
        Err(e) => e.message().to_string(),
        Ok(_) => panic!("read a hostile dump"),
    }
}

#[test]
fn malformed_dumps_give_errors_naming_file_and_line() {
    let opts = XlaOptions::default();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", b"".to_vec(), "not an XLA buffer assignment"),
        (
            "notba",
            b"HloModule f\n".to_vec(),
            "line 1: not an XLA buffer assignment",
        ),
        (
            "badsize",
            b"BufferAssignment:\nallocation 0: size 12x, maybe-live-out:\n".to_vec(),
            "line 2: size \"12x\"",
        ),
        (
            "nosize",
            b"BufferAssignment:\nallocation 0: parameter 0, shape |f32[]| at ShapeIndex {}:\n"
                .to_vec(),
            "line 2: allocation 0 has no `size`",
        ),
        (
            "dup",
            b"BufferAssignment:\nallocation 0: size 4:\nallocation 0: size 8:\n".to_vec(),
            "line 3: allocation 0 appears twice",
        ),
        (
            "unbalanced",
            b"BufferAssignment:\nallocation 0: size 4, output shape is |(f32[]:\n".to_vec(),
            "line 2: unbalanced",
        ),
        (
            "nocolon",
            b"BufferAssignment:\nallocation 0: size 4\n".to_vec(),
            "line 2: an allocation line should end with `:`",
        ),
        (
            "badindex",
            b"BufferAssignment:\nallocation -1: size 4:\n".to_vec(),
            "line 2: allocation number",
        ),
        (
            "orphanvalue",
            b"BufferAssignment:\n value: <1 p @0> (size=4,offset=0): f32[]\n".to_vec(),
            "line 2: a value before any allocation",
        ),
        (
            "badvalue",
            b"BufferAssignment:\nallocation 0: size 4:\n value: <1 p @0> (size=x,offset=0): f32[]\n"
                .to_vec(),
            "line 3: expected `value: <ID NAME @P> (size=S",
        ),
        (
            "utf8",
            b"BufferAssignment:\nallocation 0: size \xff\xfe:\n".to_vec(),
            "line 2: not UTF-8",
        ),
        (
            "long",
            {
                let mut v = b"BufferAssignment:\nallocation 0: size 4, ".to_vec();
                v.extend(std::iter::repeat(b'a').take(2 << 20));
                v.extend(b":\n");
                v
            },
            "line 2: longer than",
        ),
    ];
    for (tag, content, want) in cases {
        let s = Scratch::with(tag, &content);
        let text = error_of(&s.0, &opts);
        assert!(text.contains(want), "{tag}: `{want}` missing from: {text}");
        assert!(
            text.contains("jit_f.cpu_after_optimizations-buffer-assignment.txt"),
            "{tag}: file not named: {text}"
        );
        assert!(text.len() < 2000, "{tag}: message too long: {}", text.len());
    }
}

#[test]
fn directories_and_options_that_do_not_fit_are_refused() {
    let empty = Scratch::new("nofiles");
    let text = error_of(&empty.0, &XlaOptions::default());
    assert!(text.contains("not an XLA dump"), "{text}");
    let text = error_of(
        &case("mlp_train"),
        &XlaOptions {
            module: Some("jit_nothing".into()),
            steps: 1,
            per_buffer: false,
        },
    );
    assert!(text.contains("no module matches --module"), "{text}");
    let text = error_of(
        &case("mlp_train"),
        &XlaOptions {
            module: None,
            steps: 0,
            per_buffer: false,
        },
    );
    assert!(text.contains("--steps 0"), "{text}");
}

#[test]
fn huge_sizes_saturate_without_panicking() {
    let s = Scratch::with(
        "huge",
        b"BufferAssignment:\n\
          allocation 0: size 18446744073709551615, parameter 0, shape |f32[]| at ShapeIndex {}, maybe-live-out:\n\
          allocation 1: size 18446744073709551615, maybe-live-out:\n\
          allocation 2: size 18446744073709551615, preallocated-temp:\n",
    );
    let m = read_dir(
        &s.0,
        &XlaOptions {
            module: None,
            steps: 2,
            per_buffer: false,
        },
    )
    .unwrap();
    assert_eq!(m.stats.peak_bytes(), u64::MAX);
    let _ = summarize_events(0, m.events.iter().copied().map(Ok)).unwrap();
}

#[cfg(feature = "cli")]
#[test]
fn cli_replays_a_dump_directory_for_two_steps() {
    use std::process::Command;

    use crate::support::common::assert_mentions_all;
    let dir = case("mlp_train_donated");
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_portalloc"))
            .args(["replay"])
            .arg(&dir)
            .args([
                "--module",
                "train_step",
                "--steps",
                "2",
                "--strategies",
                "bfc",
            ])
            .args(extra)
            .output()
            .expect("run portalloc");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = run(&[]);
    assert_mentions_all(
        &text,
        &[
            "module jit_train_step",
            "arguments 117824 + outputs 107644 + temp 141312 - aliased 107584 = 259196",
            "2 executions",
        ],
    );
    let json: serde_json::Value = serde_json::from_str(&run(&["--json"])).expect("JSON");
    let t = &json["traces"][0];
    assert_eq!(t["results"][0]["peak_live"], DONATED.peak());
    assert_eq!(t["header"]["tags"][2], "temp");
    // 8 arguments, then per step: arena in and out, 2 outputs, 2 arguments freed.
    assert_eq!(t["events"], 8 + 2 * 6);

    let out = Command::new(env!("CARGO_BIN_EXE_portalloc"))
        .args(["replay"])
        .arg(&dir)
        .args(["--module", "nope"])
        .output()
        .expect("run portalloc");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no module matches --module"), "{err}");
}
