//! `portalloc top`: the members of each device's shared budget — what each holds (reserved,
//! in use, cached, asleep, reclaimable by tag), floors and ceilings — and the last hand-offs,
//! read from the segments as any member would, without joining. Refreshes in place like `top`
//! on a terminal; prints once otherwise, or with `--once`; `--json` for scripts.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use portalloc::budget::{Inspector, Snapshot};
use portalloc::units::Bytes;

#[derive(Args)]
pub struct TopArgs {
    /// Print once and exit (the default when standard output is not a terminal).
    #[arg(long)]
    once: bool,
    /// Print JSON (once).
    #[arg(long)]
    json: bool,
    /// Where the segments are (default: PORTALLOC_SHARED_BUDGET_DIR, else /dev/shm).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
}

pub fn run(args: TopArgs) -> portalloc::Result<()> {
    let dir = args
        .dir
        .clone()
        .or_else(|| {
            std::env::var_os(portalloc::budget::PORTALLOC_SHARED_BUDGET_DIR).map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("/dev/shm"));
    if !(args.interval.is_finite() && (0.05..=3600.0).contains(&args.interval)) {
        return Err(portalloc::Error::config(
            "--interval",
            args.interval.to_string(),
            "seconds from 0.05 to 3600",
        ));
    }
    let refresh = !args.once && !args.json && std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        let (snapshots, problems) = read(&dir);
        if args.json {
            let json = serde_json::json!({
                "dir": dir.display().to_string(),
                "budgets": snapshots,
                "unusable": problems,
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&json).unwrap_or_default()
            );
            return Ok(());
        }
        let mut out = String::new();
        if refresh {
            out.push_str("\x1b[H\x1b[2J");
        }
        out.push_str(&render(&dir, &snapshots, &problems));
        print!("{out}");
        let _ = std::io::stdout().flush();
        if !refresh {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs_f64(args.interval));
    }
}

fn read(dir: &std::path::Path) -> (Vec<Snapshot>, Vec<String>) {
    let mut snapshots = Vec::new();
    let mut problems = Vec::new();
    for path in Inspector::find(dir) {
        match Inspector::open(&path) {
            Ok(i) => snapshots.push(i.snapshot()),
            Err(e) => problems.push(e.to_string()),
        }
    }
    (snapshots, problems)
}

fn render(dir: &std::path::Path, snapshots: &[Snapshot], problems: &[String]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    if snapshots.is_empty() && problems.is_empty() {
        let _ = writeln!(
            o,
            "no shared budget in {} (no portalloc process uses a device, or all run alone)",
            dir.display()
        );
    }
    for s in snapshots {
        // Other processes wrote these numbers: added without overflow.
        let held = s
            .members
            .iter()
            .fold(0u64, |sum, m| sum.saturating_add(m.reserved));
        let _ = writeln!(
            o,
            "device {}  total {}  held by members {}  ({} member{})",
            s.device,
            Bytes(s.total),
            Bytes(held),
            s.members.len(),
            if s.members.len() == 1 { "" } else { "s" }
        );
        let _ = writeln!(
            o,
            "  {:>8}  {:<16} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
            "pid", "name", "reserved", "in use", "cached", "asleep", "floor", "ceiling", "gave"
        );
        for m in &s.members {
            let _ = writeln!(
                o,
                "  {:>8}  {:<16} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
                m.pid,
                portalloc::budget::layout::cut(&m.name, 16),
                Bytes(m.reserved).to_string(),
                Bytes(m.in_use).to_string(),
                Bytes(m.cached).to_string(),
                Bytes(m.asleep).to_string(),
                Bytes(m.floor).to_string(),
                m.ceiling
                    .map_or_else(|| "none".to_string(), |c| Bytes(c).to_string()),
                Bytes(m.given).to_string()
            );
            for t in &m.tags {
                let state = match (t.asleep, t.in_use) {
                    (true, _) => "asleep",
                    (false, true) => "in use",
                    (false, false) => "idle, reclaimable",
                };
                let _ = writeln!(
                    o,
                    "  {:>8}    tag {:<14} {:>11}  {} ({})",
                    "",
                    t.name,
                    Bytes(t.bytes).to_string(),
                    state,
                    if t.keep {
                        "keeps contents"
                    } else {
                        "discards contents"
                    }
                );
            }
        }
        if !s.hand_offs.is_empty() {
            let _ = writeln!(o, "  last hand-offs:");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            for h in s.hand_offs.iter().rev().take(8) {
                let ago = now.saturating_sub(h.time_ns) as f64 / 1e9;
                let what = if h.tag.is_empty() {
                    h.kind.clone()
                } else {
                    format!("{} `{}`", h.kind, h.tag)
                };
                let _ = writeln!(
                    o,
                    "    {ago:>8.1}s ago  pid {} gave pid {} {} by {what}",
                    h.donor,
                    h.requester,
                    Bytes(h.bytes)
                );
            }
        }
        o.push('\n');
    }
    for p in problems {
        let _ = writeln!(o, "unusable: {p}");
    }
    o
}
