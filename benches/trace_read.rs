//! Reading a PyTorch trace against the replay it feeds.
//!
//! For every PyTorch trace shared with the project (`pytorch-*` in `../shared/traces/` and
//! `../shared/traces-edge/`, or the directories `PORTALLOC_TRACES` / `PORTALLOC_TRACES_EDGE`
//! name), three phases are timed as `portalloc replay FILE` runs them:
//!
//! * `read` — [`trace::open`] and collecting its events, as the CLI's `load()` does for the
//!   formats read whole (Kineto JSON, snapshot pickles);
//! * `replay` — the default replay: the five strategies (bfc, bfc-grow, vmm, async, platform)
//!   on an `h100-80g` at memory fraction 0.75, [`Baseline::scan`] included;
//! * `replay --min-capacity` — the same plus, per strategy, the bisection for the smallest
//!   device (not timed by criterion: tens of replays per sample).
//!
//! Before criterion runs (not under `--test` or `--list`), a **table** is printed: per trace,
//! [`PASSES`] passes each timing the three phases once (in rotated order); milliseconds
//! min / median / max, and the ratio read ÷ replay taken within a pass (min / median / max).
//! For a gzip'd
//! trace the table also times **inflating alone** (the file's bytes, in memory, through the
//! same zlib-rs decoder into a buffer) and **parsing alone** (the inflated JSON, held in
//! memory, read on one thread): the reader inflates on a second thread while it parses, so
//! with two cores its floor is the longer of the two. `scripts/json-floor` times simdjson on the same
//! inflated bytes: what validating them costs on this machine without portalloc's code.
//!
//! Run: `cargo bench --bench trace_read` (one trace: `cargo bench --bench trace_read -- ddp`;
//! to profile reading one: `-- --profile-time 10 trace_read/pytorch-kineto-ddp-v100.json.gz/read`).
//! Without the shared traces it prints why and measures nothing.

use std::hint::black_box;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use portalloc::replay::{
    min_capacity, preset, replay, Baseline, ReplayOptions, ReplayStrategy, TraceInput,
};
use portalloc::trace::{self, Event, Options};
use portalloc::Error;

/// Passes of the table.
const PASSES: usize = 5;

/// The CLI's default strategies (`portalloc replay --strategies`).
const STRATEGIES: [ReplayStrategy; 5] = [
    ReplayStrategy::Bfc,
    ReplayStrategy::BfcGrow,
    ReplayStrategy::Vmm,
    ReplayStrategy::Async,
    ReplayStrategy::Platform,
];

/// The shared PyTorch traces present, sorted by name; a message for each directory absent.
fn traces() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared");
    for (variable, name) in [
        ("PORTALLOC_TRACES", "traces"),
        ("PORTALLOC_TRACES_EDGE", "traces-edge"),
    ] {
        let dir = std::env::var_os(variable).map_or_else(|| shared.join(name), PathBuf::from);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            eprintln!(
                "trace_read: skipping {}: absent (set {variable} to a copy of shared/{name})",
                dir.display()
            );
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("pytorch-"))
            })
            .collect();
        files.sort();
        found.extend(files);
    }
    found
}

/// The file read into memory as `portalloc replay` reads it (`load()` in
/// `src/bin/portalloc/replay.rs`).
fn read(path: &Path) -> TraceInput {
    collect(
        trace::open(path, &Options::default()),
        &path.display().to_string(),
    )
}

/// A trace's JSON held in memory, read as [`read`] reads a file (the JSON is not gzip'd, so
/// the reader parses on the calling thread alone).
fn read_json(json: &Arc<[u8]>, label: &str) -> TraceInput {
    let input = std::io::Cursor::new(Arc::clone(json));
    collect(trace::open_reader(input, label, &Options::default()), label)
}

/// Every event of an opened trace, with its header; panics naming `label` on an error.
fn collect(opened: trace::Result<trace::Trace>, label: &str) -> TraceInput {
    let mut t = opened.unwrap_or_else(|e| panic!("{label}: {e}"));
    let events: Vec<Event> = t
        .by_ref()
        .collect::<portalloc::trace::Result<_>>()
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    TraceInput::Events {
        header: t.header().clone(),
        events: Arc::new(events),
    }
}

/// Inflates `gz` (a gzip file's bytes) to its end; the bytes it makes.
fn inflate(gz: &[u8]) -> usize {
    let mut decoder = flate2::read::MultiGzDecoder::new(gz);
    let mut buf = vec![0u8; 1 << 18];
    let mut total = 0;
    loop {
        match decoder.read(&mut buf) {
            Ok(0) => return total,
            Ok(n) => total += n,
            Err(e) => panic!("inflating: {e}"),
        }
    }
}

/// The default replay of the CLI, and with `min_capacity` its bisection too; returns the
/// number of replays run.
fn replay_all(input: &TraceInput, with_min_capacity: bool) -> u64 {
    let baseline = Baseline::scan(input).expect("scan");
    let device = preset("h100-80g").expect("preset");
    let options = ReplayOptions {
        device,
        fraction: 0.75,
        samples: 0,
        sleep_tags: 0,
    };
    let mut replays = 0;
    for strategy in STRATEGIES {
        let peak_live = match replay(input, &baseline, strategy, &options, None) {
            Ok(result) => result.peak_live,
            // As the CLI: a strategy the device cannot run is reported, not timed.
            Err(Error::Unsupported { .. }) => continue,
            Err(e) => panic!("{}: {e}", strategy.name()),
        };
        replays += 1;
        if with_min_capacity {
            let step = 2 << 20;
            let m = min_capacity(input, &baseline, strategy, device, peak_live, step)
                .unwrap_or_else(|e| panic!("{}: {e}", strategy.name()));
            replays += u64::from(m.replays);
        }
    }
    replays
}

/// `min / median / max` of `v`, formatted.
fn spread(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let [min, median, max] = [0, v.len() / 2, v.len() - 1].map(|i| v[i]);
    format!("{min:.2} / {median:.2} / {max:.2}")
}

/// Prints one trace's row of the table.
fn report(path: &Path, label: &str) {
    // Read once untimed: the replays need the events, and the file is then in the page
    // cache for every timed read.
    let input = read(path);
    let events = match &input {
        TraceInput::Events { events, .. } => events.len(),
        TraceInput::File { .. } => 0,
    };
    // ms per phase per pass: read, replay, replay --min-capacity.
    let mut ms = [[0f64; 3]; PASSES];
    let mut replays = 0;
    for (pass, row) in ms.iter_mut().enumerate() {
        // Rotated, so that no phase always runs first (cold) or last.
        for k in 0..3 {
            let phase = (k + pass) % 3;
            let t = Instant::now();
            match phase {
                0 => {
                    black_box(read(path));
                }
                1 => {
                    black_box(replay_all(&input, false));
                }
                _ => replays = replay_all(&input, true),
            }
            row[phase] = t.elapsed().as_secs_f64() * 1e3;
        }
    }
    let col = |i: usize| ms.iter().map(|r| r[i]).collect::<Vec<_>>();
    eprintln!("trace_read/{label}: {events} events");
    if label.ends_with(".gz") {
        let gz = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut inflating = Vec::with_capacity(PASSES);
        let mut bytes = 0;
        for _ in 0..PASSES {
            let t = Instant::now();
            bytes = black_box(inflate(&gz));
            inflating.push(t.elapsed().as_secs_f64() * 1e3);
        }
        eprintln!(
            "  inflating alone ms {} ({} MB)",
            spread(inflating),
            bytes / 1_000_000
        );
        // The other half of the reader's work: the same JSON, inflated beforehand and held in
        // memory, read on this thread alone (no gzip, so no second thread).
        let mut json = Vec::with_capacity(bytes);
        flate2::read::MultiGzDecoder::new(&gz[..])
            .read_to_end(&mut json)
            .unwrap_or_else(|e| panic!("inflating {}: {e}", path.display()));
        let json: Arc<[u8]> = json.into();
        let mut parsing = Vec::with_capacity(PASSES);
        for _ in 0..PASSES {
            let t = Instant::now();
            black_box(read_json(&json, label));
            parsing.push(t.elapsed().as_secs_f64() * 1e3);
        }
        eprintln!(
            "  parsing alone ms {} (the inflated JSON from memory, one thread; `scripts/json-floor` times simdjson on the same bytes)",
            spread(parsing)
        );
    }
    eprintln!("  read ms {}", spread(col(0)));
    eprintln!("  replay ms {}", spread(col(1)));
    eprintln!(
        "  replay --min-capacity ms {} ({replays} replays)",
        spread(col(2))
    );
    let ratio = |i: usize| ms.iter().map(|r| r[0] / r[i]).collect::<Vec<_>>();
    eprintln!(
        "  read ÷ replay {}; read ÷ replay --min-capacity {}  (min / median / max over {PASSES} passes)",
        spread(ratio(1)),
        spread(ratio(2))
    );
}

/// Whether the table covers `label`: every trace, or those whose name contains a free
/// argument (criterion's filter) that is not a number (the value of `--measurement-time` and
/// the like).
fn wanted(label: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-') && a.parse::<f64>().is_err())
        .collect();
    filters.is_empty()
        || filters
            .iter()
            .any(|f| label.contains(f.as_str()) || f.contains(label))
}

fn benches(c: &mut Criterion) {
    // `--test` (one iteration each), `--list` and `--profile-time` (a profiler watches one
    // benchmark) want no table.
    let measuring =
        !std::env::args().any(|a| a == "--test" || a == "--list" || a == "--profile-time");
    // The process as the CLI sets it up: freed memory kept for the next read or replay.
    portalloc::replay::keep_freed_memory();
    for path in traces() {
        let label = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if measuring && wanted(&label) {
            report(&path, &label);
        }
        let input = read(&path);
        let mut g = c.benchmark_group(format!("trace_read/{label}"));
        g.sampling_mode(SamplingMode::Flat).sample_size(10);
        g.bench_function("read", |b| b.iter(|| read(&path)));
        g.bench_function("replay", |b| b.iter(|| replay_all(&input, false)));
        g.finish();
    }
}

criterion_group!(trace_read, benches);
criterion_main!(trace_read);
