//! `portalloc replay`: traces (or a built-in workload) through each strategy on a simulated
//! device, side by side.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use portalloc::config::parse_size;
use portalloc::error::shown_path;
use portalloc::replay::workload::Workload;
use portalloc::replay::{
    costs::DeviceCosts, min_capacity_with, preset, replay, Baseline, DeviceSpec, MinCapacity,
    ReplayOptions, ReplayResult, ReplayStrategy, TraceInput,
};
use portalloc::trace::import::xla_dump::{self, XlaOptions};
use portalloc::trace::{self, Event, Format, TraceError, TraceErrorKind, TraceHeader};
use portalloc::units::Bytes;
use portalloc::{Error, Result};
use serde::Serialize;
use serde_json::json;
use std::io::Read as _;

use crate::plot;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace files: portalloc JSON lines, PyTorch snapshot pickles, Kineto JSON (gzip or
    /// not), RMM CSV, buffer-lifetime CSV. The format is detected. A directory is read as
    /// an XLA dump (XLA_FLAGS=--xla_dump_to=DIR): a module's buffer assignment, replayed as
    /// XLA's runtime allocates for it; one of its *-buffer-assignment.txt files, as that
    /// module.
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
    /// Replay each trace file N times in a row, as the steps of a program that repeats it
    /// (what a step leaves live is freed at its end, but the last's): the report gives the
    /// driver calls of each step — what the program pays once warm. The built-in workloads
    /// have steps of their own (--steps).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub repeat: u32,
    #[command(flatten)]
    pub shape: crate::workload_args::ShapeArgs,
    /// Strategies to compare, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bfc,bfc-grow,vmm,async,platform"
    )]
    pub strategies: Vec<String>,
    /// A device preset: h100-80g, h200, mi300x. Default: the preset of the GPU the trace
    /// names as its device (an MI300X trace replays on mi300x), or a device of the memory the
    /// trace says its GPU had where no preset is that GPU (a V100, a MIG slice), else
    /// h100-80g; the report's header says which, and why.
    #[arg(long, conflicts_with = "capacity")]
    pub device: Option<String>,
    /// A device capacity instead of a preset (80GiB, 141GB, …).
    #[arg(long)]
    pub capacity: Option<String>,
    /// Memory fraction the allocators may use, in (0, 1]. Without it, the fraction
    /// variables are read as the allocator reads them (PORTALLOC_MEM_FRACTION, then
    /// XLA_CLIENT_MEM_FRACTION, then XLA_PYTHON_CLIENT_MEM_FRACTION; a bad value is an
    /// error), else JAX's default 0.75. The flag wins over the variables.
    #[arg(long)]
    pub fraction: Option<f64>,
    /// Also bisect, per strategy, for the smallest device (at fraction 1.0) that runs the
    /// trace without running out.
    #[arg(long)]
    pub min_capacity: bool,
    /// Spread the allocations over N tags that can sleep, in turn (every neighbour another
    /// tag's: the worst case for vmm, which gives each such tag granules of its own so that
    /// a sleep hands them all back), instead of the trace's own tags: what that placement
    /// costs, beside a run without it (0, the default).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub sleep_tags: u32,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG of live and reserved bytes over each trace for each strategy.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Read traces as this format instead of detecting it.
    #[arg(long)]
    pub format: Option<String>,
    /// Which device of a multi-device trace to replay: a device type and ordinal as PyTorch
    /// names them (`cuda:1`, `hip:0`, `xpu`), an ordinal of the one GPU type present, or
    /// `cpu` for a profiler trace's CPU events (default: the GPU with most events; the CPU's
    /// are replayed only when asked for).
    #[arg(long)]
    pub trace_device: Option<String>,
    /// Bytes live before the trace's window, for a trace that cannot know them (a CPU
    /// profile's counter starts with the profiler): `2GiB`, `512MiB`, …
    #[arg(long)]
    pub baseline: Option<String>,
    /// Treat trace anomalies (a free of an address never allocated, a double free, …) as errors.
    #[arg(long)]
    pub strict: bool,
    /// Price the device calls with this table (JSON: {"calls": {"<call>": {"us": …,
    /// "us_per_mib": …, "us_high": …, "us_per_mib_high": …}, …}, "copy_gib_s": {"to_host": …,
    /// "to_device": …}, "unmap_waits_for_device": false}; the high ends and the flag optional;
    /// call names as --json's device_calls_by_name gives them) instead of the built-in one: a
    /// model of the time the device spends, reported per strategy, low and high where the
    /// figures only bound it (--json: device_time_model_s and device_time_model_high_s). The
    /// built-in tables (docs/benchmarks.md, "Device cost model", has every derivation):
    /// cuMemCreate 167.56 µs + 12.88 µs/MiB (low) to 128.78 µs + 32.27 µs/MiB (high), fitted
    /// to 193 µs per 2 MiB handle (A100, ovg-project/kvcached bench_vmm), an 85.5 GiB pool
    /// growth in 1.54 s (H20, openxla/xla#19431) and vLLM's wake of 32 GiB in 1.22 s (A100,
    /// vllm-project/vllm#48337); map 1.45 µs (A100, kvcached); set_access 22.13 µs + 4.71
    /// µs/MiB (map + access 33 µs at 2 MiB, 325 µs at 64 MiB on a GB10, kvcached
    /// bench_layout); unmap + release 3.7–6.5 ms per GiB (vLLM's level-2 sleep, same PR);
    /// reserve 19 µs (A100); pinned host memory 0.49 s per GiB (cudaHostAlloc,
    /// rapidsai/cudf#23457); copies host→device / device→host 51 / 52 GB/s on h100-80g, 52 /
    /// 52 on h200 (nvbandwidth, Azure/AI-benchmarking-guide) and 55 / 56 on mi300x
    /// (TransferBench, samuel-bohman/AI-benchmarking-guide). The HIP table (mi300x) prices the
    /// same NVIDIA figures, so marked, and its unmap waits for the device
    /// (ROCm/rocm-systems#6982). The rest is unknown. scripts/gpu-check writes such a file for
    /// the GPU it runs on. A call the replay makes that the file does not price is an error.
    #[arg(long, value_name = "FILE")]
    pub device_costs: Option<PathBuf>,
    /// The trace files are trusted: 16 times the limits on untrusted files
    /// (docs/trace-format.md): a pipe, FIFO or device is read, and a gzip stream inflated,
    /// to 16 GiB instead of 1 GiB; PyTorch snapshots with long histories and stack frames.
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
    /// The assumption replay made about memory live before the window of unknown shape
    /// (`Baseline::assumption`), when there is such memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pre_window: Option<String>,
    /// Bytes of the device that memory takes outside the pool (`Baseline::outside_pool`):
    /// the allocator's limit is the fraction of the rest.
    #[serde(skip)]
    outside_pool: u64,
    device: DeviceSpec,
    /// What chose the device: `--device`, `--capacity`, the trace's recorded device (named),
    /// or the default (and why the trace's device, if it names one, matched no preset).
    device_source: String,
    /// Which table priced the device calls (`device_time_model_s`).
    device_costs: String,
    fraction: f64,
    /// What set the fraction: `--fraction`, a variable's name, or `the default`.
    fraction_source: String,
    results: Vec<StrategyReport>,
}

#[derive(Serialize)]
struct StrategyReport {
    strategy: String,
    #[serde(flatten)]
    result: Option<ReplayResult>,
    unsupported: Option<String>,
    min_capacity: Option<MinCapacity>,
    /// The modelled time of the device calls of the whole replay, seconds (`None` where a call
    /// made is unpriced: `device_time_unpriced` names them).
    device_time_model_s: Option<f64>,
    /// The same over the second half of the events (the steady state).
    device_time_model_steady_s: Option<f64>,
    /// The modelled time of the calls the table prices: a lower bound where some are not.
    device_time_priced_s: f64,
    /// `device_time_model_s` with every figure at the high end of what its sources allow
    /// (the same where no figure used has a range; the `_s` fields are the low ends).
    device_time_model_high_s: Option<f64>,
    /// `device_time_model_steady_s` at the high ends.
    device_time_model_steady_high_s: Option<f64>,
    /// `device_time_priced_s` at the high ends.
    device_time_priced_high_s: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    device_time_unpriced: Vec<&'static str>,
}

impl StrategyReport {
    /// The report of a strategy that ran, its device time modelled by `costs`.
    fn ran(
        strategy: ReplayStrategy,
        result: ReplayResult,
        min_capacity: Option<MinCapacity>,
        costs: &DeviceCosts,
    ) -> StrategyReport {
        let whole = costs.time_of(&result.tally);
        let steady = costs.time_of(&result.steady_tally);
        StrategyReport {
            strategy: strategy.name().into(),
            result: Some(result),
            unsupported: None,
            min_capacity,
            device_time_model_s: whole.seconds,
            device_time_model_steady_s: steady.seconds,
            device_time_priced_s: whole.priced_seconds,
            device_time_model_high_s: whole.seconds_high,
            device_time_model_steady_high_s: steady.seconds_high,
            device_time_priced_high_s: whole.priced_seconds_high,
            device_time_unpriced: whole.unpriced,
        }
    }
}

pub fn run(args: ReplayArgs) -> Result<()> {
    let fraction = Fraction::resolve(args.fraction)?;
    for w in &fraction.warnings {
        eprintln!("portalloc: warning: {w}");
    }
    let strategies = args
        .strategies
        .iter()
        .map(|s| ReplayStrategy::parse(s))
        .collect::<Result<Vec<_>>>()?;
    // Checked before any trace is read; a trace without a given device replays on the device
    // it names (`preset::device_for_recorded`).
    let given_device = match (&args.capacity, &args.device) {
        (Some(c), _) => Some((
            portalloc::replay::preset::custom_checked(parse_size("--capacity", c)?).map_err(
                |_| {
                    Error::config(
                        "--capacity",
                        c.as_str(),
                        "a size from 2MiB (one granule) to 1TiB (the largest simulated device), \
                         like 80GiB",
                    )
                },
            )?,
            "--capacity".to_string(),
        )),
        (None, Some(d)) => Some((preset(d)?, "--device".to_string())),
        (None, None) => None,
    };
    let given_costs = match &args.device_costs {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| Error::InvalidArgument {
                call: "--device-costs",
                reason: format!("cannot read {}: {e}", shown_path(path)),
            })?;
            let table = DeviceCosts::from_json(&text).map_err(|e| match e {
                Error::InvalidArgument { call, reason } => Error::InvalidArgument {
                    call,
                    reason: format!("{}: {reason}", shown_path(path)),
                },
                other => other,
            })?;
            Some((table, shown_path(path)))
        }
        None => None,
    };
    let mut options = trace::Options::default()
        .with_strict(args.strict)
        .with_trusted(args.trusted_input);
    if let Some(f) = &args.format {
        options = options.with_format(f.parse::<Format>()?);
    }
    if let Some(d) = args.trace_device.as_deref() {
        options = options.with_device_spec(d)?;
    }
    let baseline = match &args.baseline {
        Some(b) => Some(parse_size("--baseline", b)?),
        None => None,
    };
    if args.repeat != 1 && args.traces.is_empty() {
        return Err(Error::config(
            "--repeat",
            args.repeat.to_string(),
            "trace files to repeat: a built-in workload has steps of its own (--steps)",
        ));
    }
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
    // A replay reads a streaming trace once per strategy and bisection step: one that is
    // gzip'd is inflated once, into a spool, and one that can be read only once (a pipe, a
    // FIFO, a terminal) is spooled too (in bounded memory, and at most the input limit on
    // disk); the spools are removed when the replay ends. Formats read whole are read once.
    let mut spools = Vec::new();
    for given in &args.traces {
        let is_dump = given.is_dir() || xla_dump::is_buffer_assignment_file(given);
        for option in inapplicable_options(&args, is_dump) {
            eprintln!(
                "portalloc: warning: {}: {option}",
                portalloc::error::shown_path(given)
            );
        }
        if is_dump {
            let xla = XlaOptions {
                module: args.module.clone(),
                steps: args.shape.steps.unwrap_or(1),
                per_buffer: args.per_buffer,
            };
            let m = xla_dump::read_path(given, &xla)?;
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
        let (spool, loaded) = match Spool::prepare(given, &options)? {
            Prepared::Again => (None, load(given, &options)),
            Prepared::Spooled(spool, tee) => {
                let loaded = load_spooled(tee, &path_label(given), &spool.file, &options);
                (Some(spool), loaded)
            }
            Prepared::Once(bytes) => (
                None,
                trace::open_reader(bytes, &path_label(given), &options)
                    .map_err(Error::from)
                    .and_then(load_whole),
            ),
        };
        let (_, mut input, anomalies) = loaded?;
        if args.repeat != 1 {
            let events: Vec<_> = input.events()?.collect::<Result<_>>()?;
            let (header, events) =
                portalloc::replay::repeat::repeat(input.header(), &events, args.repeat)?;
            input = TraceInput::Events {
                header,
                events: Arc::new(events),
            };
        }
        if let Some(b) = baseline {
            let known = input.header().baseline_bytes;
            if known > 0 {
                // The flag is for traces that cannot know it; one that does is overridden,
                // said rather than silently (its notes still give its own figure).
                eprintln!(
                    "portalloc: warning: {}: --baseline {} replaces the {} the trace records \
                     live before its window",
                    shown_path(given),
                    Bytes(b),
                    Bytes(known)
                );
            }
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
        let (device, device_source) = match &given_device {
            Some(given) => given.clone(),
            None => portalloc::replay::preset::device_for_recorded(
                input.header().device.as_deref(),
                input.header().device_memory,
            ),
        };
        // The built-in table of the trace's vendor (a replay models a GPU: CUDA's unless the
        // device is an MI300X or the trace was recorded under HIP), or the one given.
        let hip = device.name == "mi300x"
            || input
                .header()
                .device
                .as_deref()
                .is_some_and(|d| d.starts_with("hip"));
        let preset = portalloc::replay::preset::PRESETS
            .iter()
            .any(|(name, _)| *name == device.name);
        let (costs, costs_source) = match &given_costs {
            Some((table, path)) => (table.clone(), format!("--device-costs {path}")),
            None if preset && (device.name == "mi300x") == hip => (
                DeviceCosts::for_preset(device.name),
                format!(
                    "the built-in {} table of {}{}",
                    if hip { "HIP" } else { "CUDA" },
                    device.name,
                    match device.name {
                        "mi300x" => {
                            " (the calls as measured on NVIDIA GPUs, copies on an MI300X; \
                             an unmap waits for the device)"
                        }
                        "h200" => " (the calls as measured on an A100, a GB10 and an H20, copies on an H200)",
                        _ => " (the calls as measured on an A100, a GB10 and an H20, copies on an H100)",
                    }
                ),
            ),
            None if hip => (
                DeviceCosts::for_vendor(portalloc::Vendor::Hip),
                "the built-in HIP table (the calls as measured on NVIDIA GPUs; an unmap waits for \
                 the device)"
                    .to_string(),
            ),
            None => (
                DeviceCosts::for_vendor(portalloc::Vendor::Cuda),
                "the built-in CUDA table (the calls as measured on an A100, a GB10 and an H20)"
                    .to_string(),
            ),
        };
        let baseline = Baseline::scan(input)?;
        let bar = progress_bar(baseline.events * strategies.len() as u64, label);
        let mut results = Vec::new();
        for (i, &strategy) in strategies.iter().enumerate() {
            let offset = i as u64 * baseline.events;
            let tick = |done: u64| bar.set_position(offset + done);
            let opts = ReplayOptions {
                device,
                fraction: fraction.value,
                samples,
                sleep_tags: args.sleep_tags,
            };
            match replay(input, &baseline, strategy, &opts, Some(&tick)) {
                Ok(result) => {
                    let min = if args.min_capacity {
                        bar.set_message(format!("{label}: bisecting {}", strategy.name()));
                        Some(
                            min_capacity_with(
                                input,
                                &baseline,
                                strategy,
                                device,
                                result.peak_live,
                                // What it reserved as it needed: a likely fit. (bfc's is its
                                // preallocation; growing BFC's success is not monotone in the
                                // capacity, so its search keeps the plain bracket.)
                                matches!(
                                    strategy,
                                    ReplayStrategy::Vmm
                                        | ReplayStrategy::Async
                                        | ReplayStrategy::Platform
                                )
                                .then_some(result.peak_reserved),
                                MIN_CAPACITY_STEP,
                                args.sleep_tags,
                            )
                            .map_err(|e| named(label, e))?,
                        )
                    } else {
                        None
                    };
                    let report = StrategyReport::ran(strategy, result, min, &costs);
                    if given_costs.is_some() {
                        if let Some(name) = report.device_time_unpriced.first() {
                            return Err(Error::InvalidArgument {
                                call: "--device-costs",
                                reason: format!(
                                    "{label}: {} makes the call {name}, which the table does \
                                     not price; add it under \"calls\"{}",
                                    strategy.name(),
                                    if name.starts_with("copy_") {
                                        " or give \"copy_gib_s\""
                                    } else {
                                        ""
                                    }
                                ),
                            });
                        }
                    }
                    results.push(report);
                }
                Err(Error::Unsupported { what, reason, .. }) => results.push(StrategyReport {
                    strategy: strategy.name().into(),
                    result: None,
                    unsupported: Some(format!("{what}: {reason}")),
                    min_capacity: None,
                    device_time_model_s: None,
                    device_time_model_steady_s: None,
                    device_time_priced_s: 0.0,
                    device_time_model_high_s: None,
                    device_time_model_steady_high_s: None,
                    device_time_priced_high_s: 0.0,
                    device_time_unpriced: Vec::new(),
                }),
                Err(e) => return Err(named(label, e)),
            }
        }
        bar.finish_and_clear();
        reports.push(TraceReport {
            source: label.clone(),
            header: input.header().clone(),
            pre_window: baseline.assumption(),
            outside_pool: baseline.outside_pool(device.granularity),
            events: baseline.events,
            anomalies: anomalies.clone(),
            warning: sparse_warning(input.header(), baseline.events),
            device,
            device_source,
            device_costs: costs_source,
            fraction: fraction.value,
            fraction_source: fraction.source.clone(),
            results,
        });
    }
    // The figures first, the plot after: a plot that cannot be written (a bad path, a full
    // disk) is reported once the table or JSON is out, not instead of it.
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
            reason: format!("the figures above were computed, but the plot was not written: {e}"),
        })?;
        if !args.json {
            println!("plot written to {}", shown_path(path));
        }
    }
    Ok(())
}

/// The variables that set the allocators' memory fraction, as [`portalloc::Config`] reads
/// them (precedence, parsing and the deprecated spelling's warning included).
const FRACTION_VARIABLES: &[&str] = &[
    portalloc::config::PORTALLOC_MEM_FRACTION,
    portalloc::config::XLA_CLIENT_MEM_FRACTION,
    portalloc::config::XLA_PYTHON_CLIENT_MEM_FRACTION,
];

/// The preallocation variables, which replay reads only to say they do not apply: its
/// strategies fix preallocation (`bfc` preallocates, `bfc-grow` grows).
const PREALLOCATE_VARIABLES: &[&str] = &[
    portalloc::config::PORTALLOC_PREALLOCATE,
    portalloc::config::XLA_PYTHON_CLIENT_PREALLOCATE,
];

/// The memory fraction a replay uses, and what set it.
#[derive(Debug, Clone, PartialEq)]
struct Fraction {
    /// In (0, 1].
    value: f64,
    /// `--fraction`, the variable's name, or `the default`.
    source: String,
    /// Said on standard error: a deprecated variable, a preallocation variable replay does
    /// not read.
    warnings: Vec<String>,
}

impl Fraction {
    /// `flag` when given, else the fraction variables through
    /// [`portalloc::Config::from_env_vars`] (the parsing `portalloc info` shows); the
    /// variables are validated either way, as [`portalloc::Config::builder`] validates them
    /// under a value given in code.
    ///
    /// # Errors
    /// [`Error::Config`] for a flag outside (0, 1], or a variable `Config` refuses (naming
    /// it, its value and what is accepted); [`Error::ConfigConflict`] for both XLA
    /// spellings set.
    fn resolve(flag: Option<f64>) -> Result<Fraction> {
        let config = portalloc::Config::from_env_vars(FRACTION_VARIABLES)?;
        let mut warnings = config.warnings.clone();
        // Only looked at, not parsed: a value replay does not use is no reason to refuse.
        for name in PREALLOCATE_VARIABLES {
            if std::env::var_os(name).is_some_and(|v| !v.is_empty()) {
                warnings.push(format!(
                    "{name} does not apply to replay: --strategies chooses preallocation (bfc \
                     preallocates fraction × capacity, bfc-grow grows)"
                ));
            }
        }
        let (value, source) = match flag {
            Some(f) => {
                if !(f > 0.0 && f <= 1.0) {
                    return Err(Error::config(
                        "--fraction",
                        f.to_string(),
                        "a number in (0, 1]",
                    ));
                }
                (f, "--fraction".to_string())
            }
            None => (
                config.mem_fraction.value,
                match config.mem_fraction.source {
                    portalloc::config::Source::Env(name) => name.to_string(),
                    _ => "the default".to_string(),
                },
            ),
        };
        Ok(Fraction {
            value,
            source,
            warnings,
        })
    }
}

/// The options given that do not apply to an input (an XLA dump, or a trace file), each with
/// why, ignored: said on standard error rather than silently.
fn inapplicable_options(args: &ReplayArgs, xla_dump: bool) -> Vec<&'static str> {
    let mut ignored = Vec::new();
    if xla_dump {
        if args.format.is_some() {
            ignored.push("--format does not apply to an XLA dump (read as one): ignored");
        }
        if args.strict {
            ignored.push(
                "--strict does not apply to an XLA dump (a buffer assignment has no anomalies \
                 to make errors of; malformed lines are errors already): ignored",
            );
        }
        if args.trace_device.is_some() {
            ignored.push(
                "--trace-device does not apply to an XLA dump (one module's buffers, no devices \
                 to choose among): ignored",
            );
        }
        if args.baseline.is_some() {
            ignored.push(
                "--baseline does not apply to an XLA dump (its arguments are the memory live \
                 before an execution): ignored",
            );
        }
        if args.repeat != 1 {
            ignored.push(
                "--repeat does not apply to an XLA dump (--steps gives its executions): ignored",
            );
        }
    } else {
        if args.module.is_some() {
            ignored.push("--module applies to XLA dumps only: ignored");
        }
        if args.per_buffer {
            ignored.push("--per-buffer applies to XLA dumps only: ignored");
        }
    }
    ignored
}

/// A copy on disk of a trace read again for each pass (own format, RMM CSV, lifetime CSV)
/// that is gzip'd (inflated once, not once per strategy and bisection step) or that can be
/// read only once (a pipe, a FIFO, `/dev/stdin`): its inflated bytes, bounded by the input
/// limit (`trace::Options::input_limit`), written as the first pass reads them. The file is
/// removed as soon as it is created and read through its handle, so that nothing is left in
/// TMPDIR however the process ends (SIGTERM, Ctrl-C, a crash).
struct Spool {
    /// The copy, no longer named in any directory.
    file: Arc<std::fs::File>,
}

/// How a trace file is read for a replay.
enum Prepared {
    /// From the file itself, opened again for each pass when it streams.
    Again,
    /// From its spool, written as the first pass reads these bytes.
    Spooled(Spool, Box<dyn std::io::Read + Send>),
    /// Once, from these bytes (a format read whole, from a file that can be read only once).
    Once(Box<dyn std::io::Read + Send>),
}

impl Spool {
    /// How `path` is read: a regular file that is not gzip'd, or whose format is read whole
    /// anyway, is read from itself; a streaming trace that is gzip'd or not a regular file
    /// is spooled.
    fn prepare(path: &std::path::Path, options: &trace::Options) -> Result<Prepared> {
        let (bytes, regular) = trace::open_bytes(path, options)?;
        let name = path_label(path);
        let mut bytes = bytes;
        if regular {
            let mut magic = [0u8; 2];
            let mut got = 0;
            while got < 2 {
                match bytes.read(&mut magic[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // trace::open reports it.
                    Err(_) => return Ok(Prepared::Again),
                }
            }
            if magic[..got] != [0x1f, 0x8b] {
                return Ok(Prepared::Again);
            }
            let (again, _) = trace::open_bytes(path, options)?;
            bytes = again;
        }
        let (prefix, inflated) = trace::inflated_bytes(bytes, &name, options)?;
        let format = options.format.or_else(|| trace::detect(&prefix));
        if !matches!(
            format,
            Some(Format::Portalloc | Format::RmmCsv | Format::LifetimesCsv)
        ) {
            return Ok(if regular {
                Prepared::Again
            } else {
                Prepared::Once(inflated)
            });
        }
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The file name, kept short and plain: it only helps a person who finds the copy.
        let plain: String = name
            .trim_end_matches(".gz")
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            .take(64)
            .collect();
        let copy = std::env::temp_dir().join(format!(
            "portalloc-spool-{}-{n}-{plain}",
            std::process::id()
        ));
        let cannot = |e: std::io::Error| {
            Error::Trace(TraceError::new(
                TraceErrorKind::Io,
                format!(
                    "cannot spool {} to {}: {e}",
                    shown_path(path),
                    shown_path(&copy)
                ),
            ))
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&copy)
            .map_err(cannot)?;
        // Unnamed at once: the handle keeps the bytes until the last one is closed.
        std::fs::remove_file(&copy).map_err(cannot)?;
        let sink = file.try_clone().map_err(cannot)?;
        let spool = Spool {
            file: Arc::new(file),
        };
        let tee = Tee {
            inner: inflated,
            sink,
        };
        Ok(Prepared::Spooled(spool, Box::new(tee)))
    }
}

/// A reader that writes what it reads to its spool: the first pass over a trace parses it
/// and copies it at once, so that a file that is not a trace stops the copy where it stops
/// the parse (`/dev/zero` as a trace: at its first line, not at the input limit).
struct Tee {
    inner: Box<dyn std::io::Read + Send>,
    sink: std::fs::File,
}

impl std::io::Read for Tee {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::Write as _;
        let n = self.inner.read(buf)?;
        self.sink.write_all(&buf[..n]).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot write the spool in TMPDIR: {e}"))
        })?;
        Ok(n)
    }
}

/// Reads a streaming trace once through its [`Tee`] (for its anomalies and any corruption,
/// up front), then replays it from the spool.
fn load_spooled(
    tee: Box<dyn std::io::Read + Send>,
    name: &str,
    spool: &Arc<std::fs::File>,
    options: &trace::Options,
) -> Result<(String, TraceInput, String)> {
    let mut t = trace::open_reader(tee, name, options)?;
    for event in t.by_ref() {
        event?;
    }
    let anomalies = anomaly_text(&t);
    let header = t.header().clone();
    drop(t);
    let spool = Arc::clone(spool);
    let options = options.clone();
    let label = name.to_string();
    let input = TraceInput::File {
        header,
        open: Box::new(move || {
            let pass = SpoolPass {
                file: Arc::clone(&spool),
                at: 0,
            };
            Ok(trace::open_reader(pass, &label, &options)?)
        }),
    };
    Ok((name.to_string(), input, anomalies))
}

/// One pass over a spool from its start: positioned reads through the shared handle, each
/// pass at its own offset (passes may run at once; a `try_clone` would share one offset).
struct SpoolPass {
    file: Arc<std::fs::File>,
    at: u64,
}

impl std::io::Read for SpoolPass {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        #[cfg(unix)]
        let n = std::os::unix::fs::FileExt::read_at(&*self.file, buf, self.at)?;
        #[cfg(windows)]
        let n = std::os::windows::fs::FileExt::seek_read(&*self.file, buf, self.at)?;
        self.at += n as u64;
        Ok(n)
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
        Error::Trace(e) => Error::Trace(e.within(label)),
        other => other,
    }
}

/// Reads a trace that can be read only once: its events, kept in memory.
fn load_whole(mut t: trace::Trace) -> Result<(String, TraceInput, String)> {
    let header = t.header().clone();
    let events: Vec<Event> = t.by_ref().collect::<trace::Result<_>>()?;
    let anomalies = anomaly_text(&t);
    Ok((
        String::new(),
        TraceInput::Events {
            header,
            events: Arc::new(events),
        },
        anomalies,
    ))
}

/// The most events of a lifetime CSV kept in memory between passes: 2²¹ (96 MiB); a longer
/// one is read again for each pass.
const HELD_EVENTS: usize = 1 << 21;

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
                open: Box::new(move || Ok(trace::open(&path, &options)?)),
            };
            Ok((label, input, anomalies))
        }
        // Made as they are taken from rows read whole: kept in memory up to a budget, else
        // made anew for each pass (memory: the rows, not the events; a 140 MB file of 4.5
        // million rows replays in 440 MB instead of 760).
        Format::LifetimesCsv => {
            let mut events = Vec::new();
            let mut kept = true;
            for event in t.by_ref() {
                let event = event?;
                if kept && events.len() < HELD_EVENTS {
                    events.push(event);
                } else if kept {
                    kept = false;
                    events = Vec::new();
                }
            }
            let anomalies = anomaly_text(&t);
            let input = if kept {
                TraceInput::Events {
                    header,
                    events: Arc::new(events),
                }
            } else {
                let path = path.clone();
                let options = options.clone();
                TraceInput::File {
                    header,
                    open: Box::new(move || Ok(trace::open(&path, &options)?)),
                }
            };
            Ok((label, input, anomalies))
        }
        // Formats read whole anyway: keep the events and replay them many times.
        _ => {
            let events: Vec<Event> = t.by_ref().collect::<trace::Result<_>>()?;
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
/// A modelled time as the table shows it: 3 significant digits, in s, ms or µs.
/// `low` seconds, or `low–high` where the two differ as printed.
fn low_high(low: f64, high: f64) -> String {
    let (l, h) = (seconds(low), seconds(high));
    if l == h {
        l
    } else {
        format!("{l}–{h}")
    }
}

fn seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

fn sparse_warning(header: &TraceHeader, events: u64) -> Option<String> {
    if events > 1 {
        return None;
    }
    let state = header
        .notes
        .iter()
        .any(|n| n.starts_with(portalloc::trace::import::snapshot::SEGMENT_LIST_NOTE));
    if state {
        // A state is what the user saved, not a recording gone wrong: the figures say what
        // each strategy needs to hold it, which is their question.
        return Some(
            "a segment list is one moment's state, no events: the figures say what each \
             strategy needs to hold it, not how the program got there (for that, record a \
             history: torch.cuda.memory._record_memory_history(max_entries=100000) before the \
             step, then torch.cuda.memory._dump_snapshot(path))"
                .to_string(),
        );
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
    if let Some(assumption) = &r.pre_window {
        println!("   {assumption}");
    }
    for line in note_lines(&h.notes) {
        println!("   {line}");
    }
    println!(
        "   replayed on {} ({}, granularity {}; {}), memory fraction {} ({}) → limit {}",
        r.device.name,
        human(r.device.capacity),
        Bytes(r.device.granularity),
        r.device_source,
        r.fraction,
        r.fraction_source,
        {
            // The fraction applies to what the memory held outside the pool leaves.
            let left = r.device.capacity.saturating_sub(r.outside_pool);
            let limit = human((r.fraction * left as f64) as u64);
            if r.outside_pool > 0 {
                format!("{limit} (of the {} left beside it)", human(left))
            } else {
                limit
            }
        }
    );
    if !r.anomalies.is_empty() {
        println!("   anomalies: {}", r.anomalies.trim());
    }
    if let Some(w) = &r.warning {
        println!("   warning: {w}");
    }
    let with_min = r.results.iter().any(|s| s.min_capacity.is_some());
    print!(
        "   {:<9} {:>11} {:>13} {:>7} {:>6} {:>11} {:>12} {:>9} {:>17} {:>9}",
        "strategy",
        "peak live",
        "peak reserved",
        "util.",
        "OOMs",
        "refused",
        "first OOM at",
        "dev calls",
        "dev time",
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
                let refused = if x.oom_count == 0 {
                    "-".to_string()
                } else {
                    human(x.peak_refused)
                };
                print!(
                    "   {:<9} {:>11} {:>13} {:>7} {:>6} {:>11} {:>12} {:>9} {:>17} {:>9.0}",
                    s.strategy,
                    human(x.peak_live),
                    human(x.peak_reserved),
                    utilisation_cell(x),
                    x.oom_count,
                    refused,
                    first,
                    x.device_calls,
                    match s.device_time_model_s {
                        Some(t) => low_high(t, s.device_time_model_high_s.unwrap_or(t)),
                        None if s.device_time_priced_s > 0.0 => {
                            format!(
                                "≥{}",
                                low_high(s.device_time_priced_s, s.device_time_priced_high_s)
                            )
                        }
                        None => "?".to_string(),
                    },
                    x.ns_per_event
                );
                if let Some(m) = &s.min_capacity {
                    match m.bytes {
                        Some(b) => {
                            print!("  {:>12}  {:>9}", human(b), ratio_to_live(b, x.peak_live))
                        }
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
    if r.results
        .iter()
        .any(|s| s.result.as_ref().is_some_and(|x| x.steps.len() > 1))
    {
        println!(
            "   driver calls per step (every call made of the device, events and queries \
             included, unlike dev calls; before: the calls before the first step):"
        );
        for s in &r.results {
            if let Some(x) = s.result.as_ref().filter(|x| x.steps.len() > 1) {
                println!(
                    "   {:<9} before: {} · {}",
                    s.strategy,
                    x.calls_before_steps,
                    per_step_line(&x.steps)
                );
            }
        }
    }
    if r.results
        .iter()
        .any(|s| s.result.as_ref().is_some_and(|x| x.oom_count > 0))
    {
        println!(
            "   util. is peak served ÷ peak reserved; peak live is the demand, the refused \
             requests included; refused: the most bytes refused and still wanted at once"
        );
    }
    if r.results
        .iter()
        .any(|s| s.result.as_ref().is_some_and(|x| x.peak_reserved == 0))
    {
        println!(
            "   util. is — where nothing was reserved (every request refused before the pool \
             held a byte): served ÷ reserved is 0 ÷ 0"
        );
    }
    let ratio_dashed = r.results.iter().any(|s| {
        s.min_capacity.is_some()
            && s.result
                .as_ref()
                .is_some_and(|x| x.peak_live < MIN_CAPACITY_STEP)
    });
    if ratio_dashed {
        println!(
            "   ÷ live is — where peak live is under the {} the capacity is searched in: the \
             ratio would measure that step, not the strategy",
            human(MIN_CAPACITY_STEP)
        );
    }
    let unpriced: std::collections::BTreeSet<&str> = r
        .results
        .iter()
        .flat_map(|s| s.device_time_unpriced.iter().copied())
        .collect();
    println!(
        "   dev time: a model of the device's time in those calls (low–high where the published \
         figures only bound it: cuMemCreate's fixed and per-MiB split, unmap + release per GiB), \
         priced by {}{}",
        r.device_costs,
        if unpriced.is_empty() {
            String::new()
        } else {
            format!(
                "; ≥ and ? where a call has no published cost ({}: ≥ counts the rest): \
                 --device-costs FILE prices them",
                unpriced.into_iter().collect::<Vec<_>>().join(", ")
            )
        }
    );
    println!();
}

/// The "util." cell: served ÷ reserved as a percentage, or "—" where nothing was reserved
/// (0 ÷ 0: a first request refused, which would print 0.0% as though the pool were wasted).
/// The JSON keeps the engine's number, `utilisation` 0 beside `peak_reserved` 0, which tells
/// the case.
fn utilisation_cell(x: &ReplayResult) -> String {
    if x.peak_reserved == 0 {
        "—".to_string()
    } else {
        format!("{:.1}%", x.utilisation * 100.0)
    }
}

/// Header notes shown in the text report: at most this many, the rest counted.
const NOTES_SHOWN: usize = 8;

/// Characters of one header note shown in the text report (the longest an importer writes,
/// the CPU caveat, is about 400).
const NOTE_CHARS: usize = 600;

/// The importer's header notes (devices skipped, the CPU caveat, a snapshot's blocks replayed
/// at their own sizes, an XLA dump's module) as the text report prints them: each cut and
/// escaped ([`portalloc::error::cut_escaped`]), at most [`NOTES_SHOWN`], then how many more
/// (`--json` lists them all).
fn note_lines(notes: &[String]) -> Vec<String> {
    let mut lines: Vec<String> = notes
        .iter()
        .take(NOTES_SHOWN)
        .map(|n| portalloc::error::cut_escaped(n, NOTE_CHARS))
        .collect();
    if notes.len() > NOTES_SHOWN {
        lines.push(format!(
            "… {} more notes (--json lists them all)",
            notes.len() - NOTES_SHOWN
        ));
    }
    lines
}

/// The step `--min-capacity` bisects to: one 2 MiB granule, the smallest device it tries.
const MIN_CAPACITY_STEP: u64 = 2 << 20;

/// The "÷ live" cell: min capacity over peak live, to 3 decimals, or "—" where peak live is
/// under [`MIN_CAPACITY_STEP`] (0 included). The capacity found is a multiple of the step and
/// at least one step, so below it the ratio is the step over a small number (2 MiB ÷ 8 B
/// would print 262,144×): arithmetic on the search grid, not a property of the strategy.
fn ratio_to_live(min_capacity: u64, peak_live: u64) -> String {
    if peak_live < MIN_CAPACITY_STEP {
        "—".to_string()
    } else {
        format!("{:.3}×", min_capacity as f64 / peak_live as f64)
    }
}

/// The calls of each step, `step 1: N · step 2: N · …`: the first three and the last when
/// there are more than five.
fn per_step_line(steps: &[portalloc::replay::StepCalls]) -> String {
    let cell = |k: usize| format!("{}: {}", k + 1, steps[k].calls);
    let shown: Vec<String> = if steps.len() > 5 {
        vec![cell(0), cell(1), cell(2), "…".into(), cell(steps.len() - 1)]
    } else {
        (0..steps.len()).map(cell).collect()
    };
    format!("step {}", shown.join(" · "))
}
