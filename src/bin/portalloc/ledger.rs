//! `portalloc ledger FILE`: prints a ledger snapshot a program wrote
//! (`LedgerAllocator::write_json`, `portalloc_ledger_write` in C, `Allocator.write_ledger` in
//! Python): the upstream's counters, a table by tag, the oldest live allocations, and the
//! diagnosis of the last out-of-memory error.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use portalloc::adaptor::LedgerSnapshot;
use portalloc::error::shown_path;
use portalloc::units::Bytes;
use portalloc::{Error, Result};
use serde_json::json;
use std::io::Read as _;

#[derive(Args, Debug)]
pub struct LedgerArgs {
    /// The snapshot (JSON) a program wrote.
    pub file: PathBuf,
    /// How many of the oldest live allocations to list.
    #[arg(long, default_value_t = 10)]
    pub oldest: usize,
    /// Also print each listed allocation's backtrace (when the program captured them with
    /// PORTALLOC_BACKTRACE=1).
    #[arg(long)]
    pub backtraces: bool,
    /// Print JSON (tags, oldest live allocations, last diagnosis) instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// The most bytes of a ledger snapshot `portalloc ledger` reads: 1 GiB
/// (`trace::MAX_INPUT_BYTES`, the limit on untrusted input). A snapshot is a few hundred
/// bytes per live allocation (more with backtraces), so this is millions of them; a larger
/// file is refused by its size before it is read, and a pipe or device once past it.
pub const MAX_LEDGER_BYTES: u64 = portalloc::trace::MAX_INPUT_BYTES;

pub fn run(args: LedgerArgs) -> Result<()> {
    let snapshot = read_snapshot(&args.file)?;
    if args.json {
        let oldest: Vec<_> = snapshot.live.iter().take(args.oldest).collect();
        let out = json!({
            "allocator": snapshot.allocator,
            "allocations_made": snapshot.allocations_made,
            "live": snapshot.live.len(),
            "upstream": snapshot.upstream,
            "tags": snapshot.tags,
            "oldest": oldest,
            "last_oom": snapshot.last_oom,
            "graph_pools": snapshot.graph_pools,
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        print!("{}", render(&snapshot, args.oldest, args.backtraces));
    }
    Ok(())
}

/// Reads the snapshot at `path`: a regular file of at most [`MAX_LEDGER_BYTES`] whole, then
/// parsed; anything else as it streams (memory: the snapshot), its first
/// [`MAX_LEDGER_BYTES`] at most, opened without blocking on a FIFO nobody writes to.
fn read_snapshot(path: &std::path::Path) -> Result<LedgerSnapshot> {
    let file = shown_path(path);
    let refused = |reason: String| Error::InvalidArgument {
        call: "portalloc ledger",
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| refused(format!("cannot read {file}: {e}")))?;
    let too_big = || {
        refused(format!(
            "{file}: refused: more than the {} a ledger snapshot may have",
            Bytes(MAX_LEDGER_BYTES)
        ))
    };
    if meta.is_file() && meta.len() > MAX_LEDGER_BYTES {
        return Err(refused(format!(
            "{file}: refused: {} bytes, more than the {} a ledger snapshot may have",
            meta.len(),
            Bytes(MAX_LEDGER_BYTES)
        )));
    }
    let options = portalloc::trace::Options::default().with_max_input_bytes(MAX_LEDGER_BYTES);
    let (bytes, _) = portalloc::trace::open_bytes(path, &options)
        .map_err(|e| refused(e.message().to_string()))?;
    let (parsed, read_all): (std::result::Result<LedgerSnapshot, _>, bool) = if meta.is_file() {
        // A regular file, its size checked above, is read whole and parsed from memory:
        // serde_json's reader takes one byte per call (60 MB/s in a release build, 6 MB/s
        // in a debug one), parsing a slice is many times faster. A file larger than it was
        // a moment ago is cut at the limit too.
        let mut text = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        bytes
            .take(MAX_LEDGER_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|e| refused(format!("cannot read {file}: {e}")))?;
        if text.len() as u64 > MAX_LEDGER_BYTES {
            return Err(too_big());
        }
        (serde_json::from_slice(&text), false)
    } else {
        // Anything else streams (memory: the snapshot), refused at its first wrong byte.
        let mut input = std::io::BufReader::new(bytes);
        let mut limited = (&mut input).take(MAX_LEDGER_BYTES);
        let parsed = serde_json::from_reader(&mut limited);
        (parsed, limited.limit() == 0)
    };
    match parsed {
        Ok(snapshot) => Ok(snapshot),
        Err(e) if e.is_io() => Err(refused(format!("cannot read {file}: {e}"))),
        Err(_) if read_all => Err(too_big()),
        // serde_json quotes whole strings of the file: the message shows a bounded part.
        Err(e) => Err(refused(format!(
            "{file}: not a portalloc ledger snapshot: {}",
            portalloc::error::shown(&e.to_string())
        ))),
    }
}

/// The most characters of a tag the tables show: a tag is the program's text, of any length
/// (a column width past 65,535 would not even format).
pub const TAG_COLUMN: usize = 48;

/// A tag as the tables show it: control characters escaped (a snapshot is a file, and its
/// text must not drive the terminal), at most [`TAG_COLUMN`] characters, with `…` when cut.
fn shown(tag: &str) -> String {
    portalloc::error::cut_escaped(tag, TAG_COLUMN)
}

/// The text report of a snapshot.
pub fn render(s: &LedgerSnapshot, oldest: usize, backtraces: bool) -> String {
    let mut out = String::new();
    let bytes: u64 = s.live.iter().map(|a| a.size).sum();
    let rounded: u64 = s.live.iter().map(|a| a.rounded).sum();
    let _ = writeln!(
        out,
        "ledger of {}: {} live allocations, {} asked ({} charged); {} allocations made, {} donations",
        s.allocator,
        s.live.len(),
        Bytes(bytes),
        Bytes(rounded),
        s.allocations_made,
        s.donations
    );
    let u = &s.upstream;
    let _ = writeln!(
        out,
        "upstream: in use {} (peak {}), pool {} (peak {}), limit {}, largest free block {}, fragmentation {:.1}%",
        Bytes(u.bytes_in_use),
        Bytes(u.peak_bytes_in_use),
        Bytes(u.pool_bytes),
        Bytes(u.peak_pool_bytes),
        u.bytes_limit.map_or("none".to_string(), |l| Bytes(l).to_string()),
        Bytes(u.largest_free_block_bytes),
        u.fragmentation * 100.0
    );
    let asleep: Vec<_> = s.live.iter().filter(|a| a.asleep).collect();
    if !asleep.is_empty() {
        let _ = writeln!(
            out,
            "asleep: {} allocations, {} (device memory handed back, addresses kept), {} of it held on the host",
            asleep.len(),
            Bytes(asleep.iter().map(|a| a.rounded).sum()),
            Bytes(u.host_bytes_asleep)
        );
    }
    for p in &s.graph_pools {
        let _ = writeln!(
            out,
            "{} \"{}\": {} for captured graphs in {} blocks, {} of it free{}",
            p.id,
            shown(&p.tag),
            Bytes(p.held_bytes),
            p.blocks,
            Bytes(p.free_bytes),
            if p.released { " (released)" } else { "" }
        );
    }
    let _ = writeln!(out);
    let width = s
        .tags
        .iter()
        .map(|t| shown(&t.tag).chars().count())
        .max()
        .unwrap_or(3)
        .max(3);
    let _ = writeln!(
        out,
        "{:<width$}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}  {:>8}  {:>7}",
        "tag", "live", "bytes", "charged", "peak", "peak charged", "allocs", "don i/o"
    );
    for t in &s.tags {
        let _ = writeln!(
            out,
            "{:<width$}  {:>6}  {:>12}  {:>12}  {:>12}  {:>12}  {:>8}  {:>7}",
            shown(&t.tag),
            t.live,
            Bytes(t.bytes).to_string(),
            Bytes(t.rounded_bytes).to_string(),
            Bytes(t.peak_bytes).to_string(),
            Bytes(t.peak_rounded_bytes).to_string(),
            t.allocations,
            format!("{}/{}", t.donated_in, t.donated_out)
        );
    }
    if oldest > 0 && !s.live.is_empty() {
        let _ = writeln!(out);
        let n = oldest.min(s.live.len());
        let _ = writeln!(out, "oldest {n} of {} live allocations", s.live.len());
        let _ = writeln!(
            out,
            "  {:>8}  {:<width$}  {:>12}  {:>12}  {:>8}  {:>18}",
            "seq", "tag", "size", "charged", "stream", "ptr"
        );
        for a in s.live.iter().take(n) {
            let mut donated = a.donated_from.as_ref().map_or(String::new(), |d| {
                format!("  (donated from `{}`)", shown(d))
            });
            if a.asleep {
                donated.push_str("  (asleep)");
            }
            let _ = writeln!(
                out,
                "  {:>8}  {:<width$}  {:>12}  {:>12}  {:>8}  {:>#18x}{donated}",
                a.seq,
                shown(&a.tag),
                Bytes(a.size).to_string(),
                Bytes(a.rounded).to_string(),
                a.stream,
                a.ptr
            );
            if backtraces {
                match &a.backtrace {
                    Some(bt) => {
                        for line in bt.lines() {
                            let _ = writeln!(out, "            {line}");
                        }
                    }
                    None => {
                        let _ = writeln!(
                            out,
                            "            (no backtrace: run the program with PORTALLOC_BACKTRACE=1)"
                        );
                    }
                }
            }
        }
    }
    if let Some(d) = &s.last_oom {
        let _ = writeln!(out);
        let _ = writeln!(out, "last out-of-memory error:");
        let _ = write!(out, "{d}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use portalloc::adaptor::{LiveAllocation, PoolStats, TagTotals, SNAPSHOT_VERSION};

    fn snapshot() -> LedgerSnapshot {
        let live = (0..3)
            .map(|i| LiveAllocation {
                seq: i,
                ptr: 0x1000 * (i + 1),
                size: 1000,
                rounded: 1024,
                stream: 0,
                tag: if i == 0 { "buffer" } else { "workspace" }.into(),
                donated_from: (i == 2).then(|| "input".to_string()),
                backtrace: None,
                asleep: i == 1,
            })
            .collect();
        LedgerSnapshot {
            version: SNAPSHOT_VERSION,
            allocator: "bfc".into(),
            allocations_made: 9,
            donations: 1,
            upstream: PoolStats::default(),
            tags: vec![
                TagTotals {
                    tag: "workspace".into(),
                    live: 2,
                    bytes: 2000,
                    rounded_bytes: 2048,
                    peak_bytes: 4000,
                    peak_rounded_bytes: 4096,
                    allocations: 5,
                    donated_in: 1,
                    donated_out: 0,
                },
                TagTotals {
                    tag: "buffer".into(),
                    live: 1,
                    bytes: 1000,
                    rounded_bytes: 1024,
                    peak_bytes: 1000,
                    peak_rounded_bytes: 1024,
                    allocations: 3,
                    donated_in: 0,
                    donated_out: 0,
                },
            ],
            live,
            last_oom: None,
            sleeping: Vec::new(),
            graph_pools: Vec::new(),
        }
    }

    #[test]
    fn renders_tags_and_oldest() {
        let text = render(&snapshot(), 2, true);
        assert!(text.contains("ledger of bfc: 3 live allocations"), "{text}");
        assert!(text.contains("workspace"), "{text}");
        assert!(text.contains("oldest 2 of 3 live allocations"), "{text}");
        assert!(text.contains("PORTALLOC_BACKTRACE=1"), "{text}");
        assert!(!text.contains("donated from"), "only the 2 oldest: {text}");
        let all = render(&snapshot(), 10, false);
        assert!(all.contains("(donated from `input`)"), "{all}");
    }
}
