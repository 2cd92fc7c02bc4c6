//! `portalloc replay`: traces (or a built-in workload) through each strategy on a simulated
//! device, side by side.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use portalloc::config::parse_size;
use portalloc::replay::workload::Workload;
use portalloc::replay::{
    min_capacity, preset, replay, Baseline, DeviceSpec, MinCapacity, ReplayOptions, ReplayResult,
    ReplayStrategy, TraceInput,
};
use portalloc::trace::import::xla_dump::{self, XlaOptions};
use portalloc::trace::{self, Event, Format, TraceHeader};
use portalloc::units::Bytes;
use portalloc::{Error, Result};
use serde::Serialize;
use serde_json::json;

use crate::plot;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace files: portalloc JSON lines, PyTorch snapshot pickles, Kineto JSON (gzip or
    /// not), RMM CSV, buffer-lifetime CSV. The format is detected. A directory is read as
    /// an XLA dump (XLA_FLAGS=--xla_dump_to=DIR): a module's buffer assignment, replayed as
    /// XLA's runtime allocates for it.
    pub traces: Vec<PathBuf>,
    /// Of an XLA dump directory, the module whose file name contains NAME (default: the
    /// one needing the most bytes).
    #[arg(long, value_name = "NAME")]
    pub module: Option<String>,
    /// Of an XLA dump directory, one execution with every HLO value its own allocation over
    /// its live range (read from the module's *-live-range.txt), instead of what XLA's
    /// runtime allocates.
    #[arg(long)]
    pub per_buffer: bool,

    /// A built-in workload instead of (or beside) trace files.
    #[arg(long, value_name = "NAME")]
    pub workload: Option<String>,
    #[command(flatten)]
    pub shape: crate::workload_args::ShapeArgs,
    /// Strategies to compare, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bfc,bfc-grow,vmm,async,platform"
    )]
    pub strategies: Vec<String>,
    /// A device preset: h100-80g, h200, mi300x.
    #[arg(long, conflicts_with = "capacity", default_value = "h100-80g")]
    pub device: String,
    /// A device capacity instead of a preset (80GiB, 141GB, …).
    #[arg(long)]
    pub capacity: Option<String>,
    /// Memory fraction the allocators may use, as XLA_CLIENT_MEM_FRACTION (JAX's default 0.75).
    #[arg(long, default_value_t = 0.75)]
    pub fraction: f64,
    /// Also bisect, per strategy, for the smallest device (at fraction 1.0) that runs the
    /// trace without running out.
    #[arg(long)]
    pub min_capacity: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG of live and reserved bytes over each trace for each strategy.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Read traces as this format instead of detecting it.
    #[arg(long)]
    pub format: Option<String>,
    /// Which device of a multi-device trace to replay: an ordinal, or `cpu` for a profiler
    /// trace's CPU events (default: the GPU with most events; the CPU when there is none).
    #[arg(long)]
    pub trace_device: Option<String>,
    /// Bytes live before the trace's window, for a trace that cannot know them (a CPU
    /// profile's counter starts with the profiler): `2GiB`, `512MiB`, …
    #[arg(long)]
    pub baseline: Option<String>,
    /// Treat trace anomalies (a free of an address never allocated, a double free, …) as errors.
    #[arg(long)]
    pub strict: bool,
    /// The trace files are trusted: read PyTorch snapshots with 16 times the limits on
    /// untrusted files (docs/trace-format.md), for long histories with stack frames.
    #[arg(long)]
    pub trusted_input: bool,
}

/// One trace's figures.
#[derive(Serialize)]
struct TraceReport {
    source: String,
    header: TraceHeader,
    events: u64,
    anomalies: String,
    /// Said when the trace is too short to compare strategies on.
    #[serde(skip_serializing_if = "Option::is_none")]
    warning: Option<String>,
    device: DeviceSpec,
    fraction: f64,
    results: Vec<StrategyReport>,
}

#[derive(Serialize)]
struct StrategyReport {
    strategy: String,
    #[serde(flatten)]
    result: Option<ReplayResult>,
    unsupported: Option<String>,
    min_capacity: Option<MinCapacity>,
}

pub fn run(args: ReplayArgs) -> Result<()> {
    if !(args.fraction > 0.0 && args.fraction <= 1.0) {
        return Err(Error::config(
            "--fraction",
            args.fraction.to_string(),
            "a number in (0, 1]",
        ));
    }
    let strategies = args
        .strategies
        .iter()
        .map(|s| ReplayStrategy::parse(s))
        .collect::<Result<Vec<_>>>()?;
    let device = match &args.capacity {
        Some(c) => portalloc::replay::preset::custom_checked(parse_size("--capacity", c)?)
            .map_err(|_| {
                Error::config(
                    "--capacity",
                    c.as_str(),
                    "a size from 2MiB (one granule) to 1TiB (the largest simulated device), \
                     like 80GiB",
                )
            })?,
        None => preset(&args.device)?,
    };
    let mut options = trace::Options::default()
        .with_strict(args.strict)
        .with_trusted(args.trusted_input);
    if let Some(f) = &args.format {
        options = options.with_format(f.parse::<Format>()?);
    }
    match args.trace_device.as_deref() {
        None => {}
        Some(d) if d.eq_ignore_ascii_case("cpu") => options = options.with_cpu(true),
        Some(d) => {
            let n = d.parse::<u32>().map_err(|_| {
                Error::config("--trace-device", d, "a device ordinal (0, 1, …) or cpu")
            })?;
            options = options.with_device(n);
        }
    }
    let baseline = match &args.baseline {
        Some(b) => Some(parse_size("--baseline", b)?),
        None => None,
    };
    let mut inputs: Vec<(String, TraceInput, String)> = Vec::new();
    if let Some(name) = &args.workload {
        let workload = args.shape.apply(Workload::from_name(name)?)?;
        let (header, events) = workload.events()?;
        let label = match &workload {
            Workload::TransformerTrain(t) => format!(
                "transformer-train (layers {}, hidden {}, batch {}, seq {}, vocab {}, {}-byte elements, {} steps)",
                t.layers, t.hidden, t.batch, t.seq, t.vocab, t.dtype_bytes, t.steps
            ),
        };
        inputs.push((
            label,
            TraceInput::Events {
                header,
                events: Arc::new(events),
            },
            String::new(),
        ));
    }
    // Pipes, FIFOs and terminals can be read once only, and a replay reads a streaming trace
    // once per strategy and bisection step: such inputs are spooled to a file first (in
    // bounded memory), removed when the replay ends.
    let mut spools = Vec::new();
    for given in &args.traces {
        if given.is_dir() {
            let xla = XlaOptions {
                module: args.module.clone(),
                steps: args.shape.steps.unwrap_or(1),
                per_buffer: args.per_buffer,
            };
            let m = xla_dump::read_dir(given, &xla)?;
            inputs.push((
                format!("{} ({})", path_label(given), m.name),
                TraceInput::Events {
                    header: m.header,
                    events: Arc::new(m.events),
                },
                String::new(),
            ));
            continue;
        }
        let spool = Spool::if_needed(given)?;
        let path = spool
            .as_ref()
            .map_or_else(|| given.clone(), |s| s.path.clone());
        let (_, mut input, anomalies) = load(&path, &options).map_err(|e| match (&spool, e) {
            // Messages name the file the user gave, not its spool.
            (Some(_), Error::Trace(text)) => {
                Error::Trace(text.replace(&path_label(&path), &path_label(given)))
            }
            (_, e) => e,
        })?;
        if let Some(b) = baseline {
            input.set_baseline(b);
        }
        inputs.push((path_label(given), input, anomalies));
        spools.extend(spool);
    }
    if inputs.is_empty() {
        return Err(Error::InvalidArgument {
            call: "portalloc replay",
            reason: format!(
                "give trace files or --workload (one of: {})",
                Workload::names().join(", ")
            ),
        });
    }
    let samples = if args.plot.is_some() { 1500 } else { 0 };
    let mut reports = Vec::new();
    for (label, input, anomalies) in &inputs {
        let baseline = Baseline::scan(input)?;
        let bar = progress_bar(baseline.events * strategies.len() as u64, label);
        let mut results = Vec::new();
        for (i, &strategy) in strategies.iter().enumerate() {
            let offset = i as u64 * baseline.events;
            let tick = |done: u64| bar.set_position(offset + done);
            let opts = ReplayOptions {
                device,
                fraction: args.fraction,
                samples,
            };
            match replay(input, &baseline, strategy, &opts, Some(&tick)) {
                Ok(result) => {
                    let min = if args.min_capacity {
                        bar.set_message(format!("{label}: bisecting {}", strategy.name()));
                        Some(
                            min_capacity(
                                input,
                                &baseline,
                                strategy,
                                device,
                                result.peak_live,
                                2 << 20,
                            )
                            .map_err(|e| named(label, e))?,
                        )
                    } else {
                        None
                    };
                    results.push(StrategyReport {
                        strategy: strategy.name().into(),
                        result: Some(result),
                        unsupported: None,
                        min_capacity: min,
                    });
                }
                Err(Error::Unsupported { what, reason, .. }) => results.push(StrategyReport {
                    strategy: strategy.name().into(),
                    result: None,
                    unsupported: Some(format!("{what}: {reason}")),
                    min_capacity: None,
                }),
                Err(e) => return Err(named(label, e)),
            }
        }
        bar.finish_and_clear();
        reports.push(TraceReport {
            source: label.clone(),
            header: input.header().clone(),
            events: baseline.events,
            anomalies: anomalies.clone(),
            warning: sparse_warning(input.header(), baseline.events),
            device,
            fraction: args.fraction,
            results,
        });
    }
    if let Some(path) = &args.plot {
        let panels: Vec<plot::Panel<'_>> = reports
            .iter()
            .map(|r| plot::Panel {
                title: format!(
                    "{} on {} (fraction {})",
                    short(&r.source),
                    r.device.name,
                    r.fraction
                ),
                results: r.results.iter().filter_map(|s| s.result.as_ref()).collect(),
            })
            .collect();
        plot::draw(path, &panels).map_err(|e| Error::InvalidArgument {
            call: "--plot",
            reason: e,
        })?;
    }
    if args.json {
        let value = json!({ "traces": reports });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        for r in &reports {
            print_report(r);
        }
        if let Some(path) = &args.plot {
            println!("plot written to {}", path.display());
        }
    }
    Ok(())
}

/// A copy on disk of a trace that can be read only once (a pipe, a FIFO, `/dev/stdin`),
/// removed when dropped.
struct Spool {
    /// The copy.
    path: PathBuf,
}

impl Spool {
    /// A spool of `path` when it is not a regular file; `None` for a regular file.
    fn if_needed(path: &PathBuf) -> Result<Option<Spool>> {
        let meta = std::fs::metadata(path)
            .map_err(|e| Error::Trace(format!("cannot open {}: {e}", path.display())))?;
        if meta.is_file() {
            return Ok(None);
        }
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "stdin".into());
        let copy =
            std::env::temp_dir().join(format!("portalloc-spool-{}-{n}-{name}", std::process::id()));
        let spool = Spool { path: copy };
        let mut source = std::fs::File::open(path)
            .map_err(|e| Error::Trace(format!("cannot open {}: {e}", path.display())))?;
        let mut sink = std::fs::File::create(&spool.path).map_err(|e| {
            Error::Trace(format!(
                "cannot spool {} to {}: {e}",
                path.display(),
                spool.path.display()
            ))
        })?;
        std::io::copy(&mut source, &mut sink)
            .map_err(|e| Error::Trace(format!("cannot read {}: {e}", path.display())))?;
        Ok(Some(spool))
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn path_label(path: &std::path::Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A replay error with the trace it came from: the file (or workload) first.
fn named(label: &str, e: Error) -> Error {
    match e {
        Error::Trace(text) => Error::Trace(format!("{label}: {text}")),
        other => other,
    }
}

fn load(path: &PathBuf, options: &trace::Options) -> Result<(String, TraceInput, String)> {
    let mut t = trace::open(path, options)?;
    let header = t.header().clone();
    let label = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match t.format() {
        // Streaming formats: read anew for each pass, so any length fits in memory.
        Format::Portalloc | Format::RmmCsv => {
            // One pass now, for the anomalies (and any corruption) to be known up front.
            for event in t.by_ref() {
                event?;
            }
            let anomalies = anomaly_text(&t);
            let path = path.clone();
            let options = options.clone();
            let input = TraceInput::File {
                header,
                open: Box::new(move || trace::open(&path, &options)),
            };
            Ok((label, input, anomalies))
        }
        // Formats read whole anyway: keep the events and replay them many times.
        _ => {
            let events: Vec<Event> = t.by_ref().collect::<Result<_>>()?;
            let anomalies = anomaly_text(&t);
            Ok((
                label,
                TraceInput::Events {
                    header,
                    events: Arc::new(events),
                },
                anomalies,
            ))
        }
    }
}

/// A trace of 0 or 1 events compares the strategies on nothing: say so, and how to record
/// one (a snapshot with recording off, or from PyTorch 2.0, which kept one entry).
fn sparse_warning(header: &TraceHeader, events: u64) -> Option<String> {
    if events > 1 {
        return None;
    }
    let how = if header.source.starts_with(Format::PytorchSnapshot.name()) {
        "the snapshot was dumped with memory history recording off (or by PyTorch 2.0, which \
         kept one entry): call torch.cuda.memory._record_memory_history(max_entries=100000) \
         before the step, then torch.cuda.memory._dump_snapshot(path)"
    } else {
        "record the program's allocations over a whole step"
    };
    Some(format!(
        "the trace holds {events} event{}: the figures compare the strategies on nothing \
         more than the memory live before it; {how}",
        if events == 1 { "" } else { "s" }
    ))
}

fn anomaly_text(t: &trace::Trace) -> String {
    if t.anomalies().is_empty() {
        String::new()
    } else {
        t.anomalies().to_string()
    }
}

fn progress_bar(total: u64, label: &str) -> ProgressBar {
    // indicatif draws only when stderr is a terminal.
    let bar = if total >= 1_000_000 {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} events ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(label.to_string());
    bar
}

fn short(source: &str) -> &str {
    source.rsplit('/').next().unwrap_or(source)
}

/// A size for the tables: in the largest binary unit that keeps it at least 1 (a GPU's
/// gibibytes, a JAX test model's kibibytes).
fn human(bytes: u64) -> String {
    Bytes(bytes).to_string()
}

fn print_report(r: &TraceReport) {
    let h = &r.header;
    println!("== {}", r.source);
    let mut facts = vec![format!("{} events", r.events)];
    facts.push(format!(
        "{} live before the window",
        human(h.baseline_bytes)
    ));
    if let Some(reference) = &h.reference {
        if let Some(reserved) = reference.reserved_bytes {
            let who = reference
                .allocator
                .as_deref()
                .unwrap_or("the recording allocator");
            facts.push(format!("{who} reserved {}", human(reserved)));
        }
    }
    if let Some(d) = &h.device {
        facts.push(format!("recorded on {d}"));
    }
    println!("   {}", facts.join(", "));
    if h.source.starts_with("xla-dump:") {
        for note in &h.notes {
            println!("   {note}");
        }
    }
    println!(
        "   replayed on {} ({}, granularity {}), memory fraction {} → limit {}",
        r.device.name,
        human(r.device.capacity),
        Bytes(r.device.granularity),
        r.fraction,
        human((r.fraction * r.device.capacity as f64) as u64)
    );
    if !r.anomalies.is_empty() {
        println!("   anomalies: {}", r.anomalies.trim());
    }
    if let Some(w) = &r.warning {
        println!("   warning: {w}");
    }
    let with_min = r.results.iter().any(|s| s.min_capacity.is_some());
    print!(
        "   {:<9} {:>11} {:>13} {:>7} {:>6} {:>12} {:>9} {:>9}",
        "strategy",
        "peak live",
        "peak reserved",
        "util.",
        "OOMs",
        "first OOM at",
        "dev calls",
        "ns/event"
    );
    if with_min {
        print!("  {:>12}  {:>9}", "min capacity", "÷ live");
    }
    println!();
    for s in &r.results {
        match (&s.result, &s.unsupported) {
            (Some(x), _) => {
                let first = x
                    .first_failure
                    .as_ref()
                    .map(|f| {
                        f.seq
                            .map_or("baseline".to_string(), |q| format!("event {q}"))
                    })
                    .unwrap_or_else(|| "-".into());
                print!(
                    "   {:<9} {:>11} {:>13} {:>6.1}% {:>6} {:>12} {:>9} {:>9.0}",
                    s.strategy,
                    human(x.peak_live),
                    human(x.peak_reserved),
                    x.utilisation * 100.0,
                    x.oom_count,
                    first,
                    x.device_calls,
                    x.ns_per_event
                );
                if let Some(m) = &s.min_capacity {
                    match m.bytes {
                        Some(b) => print!(
                            "  {:>12}  {:>8.3}×",
                            human(b),
                            b as f64 / x.peak_live.max(1) as f64
                        ),
                        None => print!(
                            "  {:>12}  {:>9}",
                            format!("> {}", human(m.searched_up_to)),
                            "-"
                        ),
                    }
                }
                println!();
            }
            (None, Some(why)) => println!("   {:<9} unsupported: {why}", s.strategy),
            (None, None) => {}
        }
    }
    println!();
}
