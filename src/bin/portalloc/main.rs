//! The `portalloc` command line.
//!
//! `portalloc info` prints the discovery report (every backend probed, what it found, what
//! was chosen and why), each device's facts, and the effective configuration with where
//! each value came from. `--json` prints the same for machines.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod ledger;
mod plot;
mod replay;
mod top;
mod workload_args;
use portalloc::discover::{discover, Decision, Discovery};
use portalloc::units::Bytes;
use portalloc::Config;
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "portalloc",
    version,
    about = "One GPU memory allocator for NVIDIA and AMD GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show discovery, devices and the effective configuration.
    Info {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Replay traces or a built-in workload through each strategy on a simulated device:
    /// peak live, peak reserved, utilisation, out-of-memory count, and (with
    /// --min-capacity) the smallest device each strategy needs.
    Replay(Box<replay::ReplayArgs>),
    /// Print a ledger snapshot a program wrote: totals by tag, oldest live allocations, last
    /// OOM diagnosis.
    Ledger(ledger::LedgerArgs),
    /// Show the members of each device's shared budget: what each holds, caches, sleeps and
    /// can give back, floors and ceilings, and the last hand-offs.
    Top(top::TopArgs),
}

/// Ends the program quietly, with status 0, when standard output is a pipe its reader has
/// closed (`portalloc info | head -1`): the reader has what it wanted, as `rg` and `grep`
/// treat it (not 141, the status of death by SIGPIPE that `cargo` gives, which `set -o
/// pipefail` scripts would take for a failure of portalloc). `println!` panics with
/// "failed printing to stdout" on the broken pipe; every other panic keeps the default
/// report.
fn end_quietly_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if is_broken_pipe_panic(text) {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// The panic of `print!`/`println!` when standard output is a closed pipe.
fn is_broken_pipe_panic(text: &str) -> bool {
    text.starts_with("failed printing to stdout")
        && text.to_ascii_lowercase().contains("broken pipe")
}

fn main() -> ExitCode {
    end_quietly_on_broken_pipe();
    // The command line says the configuration's warnings itself (`portalloc: warning: …`,
    // `portalloc info`'s list), so the library's tracing copy of them (target
    // portalloc::config) is left out unless PORTALLOC_LOG asks for it; colours only on a
    // terminal, not as escape codes in a pipe or a log file.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PORTALLOC_LOG")
                .unwrap_or_else(|_| "warn,portalloc::config=off".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .without_time()
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            // clap quotes a flag's value whole: a value of 100,000 characters made an error
            // of 100 KB.
            eprint!("{}", bounded_lines(&e.render().to_string()));
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    // A replay follows the reading of its trace: keep what the reader frees for it.
    portalloc::replay::keep_freed_memory();
    let result = match cli.command {
        Command::Info { json } => info(json),
        Command::Replay(args) => replay::run(*args),
        Command::Ledger(args) => ledger::run(args),
        Command::Top(args) => top::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("portalloc: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The most characters of one line of a command-line error: a line longer keeps its first
/// and last [`KEPT_CHARS`] (the start of the value, and what clap says of it), with how many
/// were left out between.
const MAX_ERROR_LINE_CHARS: usize = 1024;

/// Characters kept at each end of a line cut by [`bounded_lines`].
const KEPT_CHARS: usize = 256;

/// `text` with each line of more than [`MAX_ERROR_LINE_CHARS`] characters cut in its middle,
/// and control characters other than tabs escaped (a value must not drive the terminal).
fn bounded_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(8 * MAX_ERROR_LINE_CHARS));
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        let chars: Vec<char> = body.chars().collect();
        let mut push = |part: &[char]| {
            for &c in part {
                if c.is_control() && c != '\t' {
                    out.extend(c.escape_default());
                } else {
                    out.push(c);
                }
            }
        };
        if chars.len() > MAX_ERROR_LINE_CHARS {
            push(&chars[..KEPT_CHARS]);
            let left = chars.len() - 2 * KEPT_CHARS;
            push(
                &format!("… ({left} characters left out) …")
                    .chars()
                    .collect::<Vec<_>>(),
            );
            push(&chars[chars.len() - KEPT_CHARS..]);
        } else {
            push(&chars);
        }
        out.push_str(end);
    }
    out
}

fn backends_compiled() -> Vec<&'static str> {
    let mut v = Vec::new();
    if cfg!(feature = "cuda") {
        v.push("cuda");
    }
    if cfg!(feature = "hip") {
        v.push("hip");
    }
    v.push("host");
    v
}

fn decision_text(d: &Decision) -> (&'static str, String) {
    match d {
        Decision::Chosen => ("chosen", String::new()),
        Decision::Passed(r) => ("passed", r.clone()),
        Decision::Unusable(r) => ("unusable", r.clone()),
        Decision::Skipped(r) => ("skipped", r.clone()),
        Decision::NotCompiled => ("not compiled", "built without this cargo feature".into()),
    }
}

fn info(as_json: bool) -> portalloc::Result<()> {
    let config = Config::from_env()?;
    let discovery = discover(&config)?;
    let peers = portalloc::discover::configure_peer_access(&config, &discovery.devices);
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&info_json(&config, &discovery, &peers)?)
                .unwrap_or_default()
        );
        return Ok(());
    }
    println!(
        "portalloc {} ({}; backends compiled: {})",
        env!("CARGO_PKG_VERSION"),
        env!("PORTALLOC_BUILD_TARGET"),
        backends_compiled().join(", ")
    );
    println!();
    println!("Discovery");
    for c in &discovery.candidates {
        let (word, why) = decision_text(&c.decision);
        println!(
            "{}",
            format!("  {:<5} {:<12} {}", c.backend.name(), word, why).trim_end()
        );
        if let Some(p) = &c.probe {
            let mut facts = Vec::new();
            if let Some(lib) = &p.library {
                facts.push(format!("library {lib}"));
            }
            if let Some(v) = &p.driver_version {
                facts.push(format!("driver {v}"));
            }
            if let Some(v) = &p.runtime_version {
                facts.push(format!("runtime {v}"));
            }
            if !facts.is_empty() {
                println!("  {:<5} {:<12} {}", "", "", facts.join(", "));
            }
            for failure in &p.load_failures {
                println!("  {:<5} {:<12} tried {failure}", "", "");
            }
            for d in &p.devices {
                println!("  {:<5} {:<12} device {d}", "", "");
            }
        }
    }
    println!();
    println!("Devices ({})", discovery.chosen);
    for device in &discovery.devices {
        let i = device.info();
        let mem = device.mem_info()?;
        println!(
            "  {}:{}  {}  arch {}, {} total, {} free, granularity {} (recommended {})",
            i.vendor,
            i.ordinal,
            i.name,
            i.arch,
            Bytes(i.total_bytes),
            Bytes(mem.free),
            Bytes(i.min_granularity),
            Bytes(i.recommended_granularity)
        );
        println!(
            "        virtual memory: {}, stream-ordered pools: {}",
            yes_no(i.capabilities.virtual_memory),
            yes_no(i.capabilities.stream_ordered_pool)
        );
        println!(
            "        peer access: {}",
            portalloc::discover::describe_peer_access(&peers, i.ordinal)
        );
        for (k, v) in &i.notes {
            println!("        {k}: {v}");
        }
        if let Some(budget) = device.virtual_memory().and_then(|vm| vm.handle_budget()) {
            println!(
                "        handle budget: {budget} more physical handles (one file descriptor each)"
            );
        }
        println!(
            "        allocator limit (fraction × total): {}",
            Bytes(config.limit(i.total_bytes))
        );
        let limits = device_limits(&config, device.as_ref(), mem.free);
        println!("        what this process may use:");
        for (n, l) in limits.limiters.iter().enumerate() {
            let mark = if Some(n) == limits.binding {
                "  ← binds"
            } else {
                ""
            };
            println!(
                "          {:<18} {:>11}  {}{mark}",
                l.name,
                l.bytes
                    .map_or_else(|| "no limit".to_string(), |b| Bytes(b).to_string()),
                l.source
            );
        }
    }
    println!();
    println!("Process");
    println!(
        "  file descriptors: {}",
        portalloc::backends::descriptors::Descriptors::now().summary()
    );
    println!();
    println!("Configuration");
    for (setting, value, source) in config.describe() {
        println!("  {setting:<16} {value:<18} from {source}");
    }
    for w in &config.warnings {
        println!("  warning: {w}");
    }
    Ok(())
}

/// Every limiter of `device` for this process ([`portalloc::budget::limits`]): the shared
/// budget's figure is what the other members of its segment hold, read without joining.
fn device_limits(
    config: &Config,
    device: &dyn portalloc::Device,
    free: u64,
) -> portalloc::budget::limits::Limits {
    use portalloc::budget;
    let i = device.info();
    let options = config
        .shared_budget
        .as_ref()
        .filter(|o| i.vendor != portalloc::Vendor::Host || o.include_host);
    let others_hold = options.and_then(|o| {
        let path = budget::segment_path(&o.dir, &budget::device_key(i), budget::current_uid());
        let snapshot = budget::Inspector::open(&path).ok()?.snapshot();
        // Other processes wrote these numbers: added without overflow.
        Some(
            snapshot
                .members
                .iter()
                .fold(0u64, |sum, m| sum.saturating_add(m.reserved)),
        )
    });
    let seen = budget::limits::Seen {
        ordinal: i.ordinal,
        name: i.name.clone(),
        total: i.total_bytes,
        free,
        fraction: (
            config.mem_fraction.value,
            config.mem_fraction.source.to_string(),
        ),
        ceiling: options.and_then(|o| o.ceiling.map(|c| c.of(i.total_bytes))),
        others_hold: others_hold.or(options.map(|_| 0)),
    };
    budget::limits::limits(&seen, &|k| std::env::var(k).ok(), &|f| {
        std::fs::read_to_string(f).ok()
    })
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn info_json(
    config: &Config,
    discovery: &Discovery,
    peers: &[portalloc::discover::PeerLink],
) -> portalloc::Result<serde_json::Value> {
    let devices = discovery
        .devices
        .iter()
        .map(|d| {
            let mem = d.mem_info()?;
            Ok(json!({
                "info": d.info(),
                "mem_info": mem,
                "limit": config.limit(d.info().total_bytes),
                // What the probe at open found (the note "released memory" says how); null
                // without virtual memory.
                "holds_released_memory": d.virtual_memory().map(|vm| vm.holds_released_memory()),
                // How many more handles the process can hold where each costs a file
                // descriptor (the note "descriptors per handle"); null where not limited.
                "handle_budget": d.virtual_memory().and_then(|vm| vm.handle_budget()),
                // Every limiter of what this process may use, and which binds.
                "limits": device_limits(config, d.as_ref(), mem.free),
            }))
        })
        .collect::<portalloc::Result<Vec<_>>>()?;
    Ok(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "target": env!("PORTALLOC_BUILD_TARGET"),
        "backends_compiled": backends_compiled(),
        "discovery": {
            "chosen": discovery.chosen,
            "candidates": discovery.candidates,
        },
        "devices": devices,
        // The process's RLIMIT_NOFILE and open descriptors, and what the HIP backend's raise
        // of the soft limit did.
        "descriptors": portalloc::backends::descriptors::Descriptors::now(),
        "peers": peers,
        "config": config,
        "config_sources": config.describe().into_iter().map(|(s, v, src)| json!({"setting": s, "value": v, "source": src})).collect::<Vec<_>>(),
        "warnings": config.warnings,
    }))
}
