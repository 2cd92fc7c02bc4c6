//! Out-of-memory diagnosis: beside the XLA-style [`OomReport`], a verdict on *why* memory ran
//! out, the evidence for it, and what would help.
//!
//! | verdict | when | what helps |
//! |---|---|---|
//! | [`Verdict::Fragmentation`] | the pool's free bytes would hold the request, but no free block is large enough | `XLA_PYTHON_CLIENT_ALLOCATOR=vmm` (free space contiguous across chunks) |
//! | [`Verdict::OtherProcesses`] | the device's used memory (total − free) is well above what this allocator holds, and the device could not give what the allocator may take | make the fractions of every process on the device sum to ≤ 1, or stop preallocating |
//! | [`Verdict::GrowthExhausted`] | the allocator's limit (`fraction × total`) leaves no room for the request | raise `XLA_CLIENT_MEM_FRACTION` / `PORTALLOC_MEM_FRACTION` (the variable that set it is named) to the fraction computed to serve the request; where no fraction can (the device cannot hold it), a smaller request, freed memory or a larger device instead |
//! | [`Verdict::SuspectedLeak`] | one tag holds many live allocations from the first half of the program's allocations, and a large share of the bytes in use | free or donate them; `PORTALLOC_BACKTRACE=1` shows where they were made |
//! | [`Verdict::InUse`] | none of the above: live allocations simply fill what may be used | smaller working set, or a larger fraction |
//!
//! Several verdicts can hold at once; [`Diagnosis::findings`] lists every one that does, the
//! most specific first (in the order of the table). A remedy names an environment variable
//! only where the allocator reads them ([`LimitHint::env_read`]): one built with
//! [`crate::ConfigBuilder::ignore_env`] is told the setting in code instead. The thresholds are
//! [`DiagnoseOptions`]. [`diagnose`] is a pure function of an [`OomContext`]; the
//! [`crate::adaptor::LedgerAllocator`] builds one at every out-of-memory error of its
//! upstream and attaches the result ([`crate::Error::OutOfMemoryDiagnosed`]).
#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::report::OomReport;
use crate::stats::{MemInfo, Stats};
use crate::units::Bytes;

/// One live allocation, as [`crate::adaptor::LedgerAllocator::live`] reports it. Defined
/// here, with the diagnosis that reads it, so that the error vocabulary (which carries a
/// [`Diagnosis`]) depends on nothing above it; re-exported by [`crate::adaptor`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveAllocation {
    /// The allocation sequence number: 0 for the first allocation made through the ledger.
    /// Lower is older.
    pub seq: u64,
    /// The device address (0 for a zero-byte allocation).
    pub ptr: u64,
    /// Bytes asked for.
    pub size: u64,
    /// Bytes the upstream charged (see [`crate::adaptor::LedgerOptions::measure_rounding`]).
    pub rounded: u64,
    /// The stream it was made for.
    pub stream: u64,
    /// Its tag.
    pub tag: String,
    /// The tag it was donated from, if it came by [`crate::adaptor::LedgerAllocator::donate`].
    pub donated_from: Option<String>,
    /// Where it was allocated, when backtraces are on.
    pub backtrace: Option<String>,
    /// It sleeps ([`crate::Allocator::sleep`]): its address is kept, its device memory
    /// handed back, so it is not counted as in use.
    #[serde(default)]
    pub asleep: bool,
}

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Enough free bytes in the pool, but no free block large enough.
    Fragmentation,
    /// Other processes (or other allocators) hold device memory this allocator may use.
    OtherProcesses,
    /// The allocator's limit (the memory fraction) is reached.
    GrowthExhausted,
    /// Many old live allocations of one tag hold much of the memory.
    SuspectedLeak,
    /// Live allocations fill what may be used; nothing more specific applies.
    InUse,
}

impl Verdict {
    /// The verdict's name in reports (`fragmentation`, `other processes`, …).
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Fragmentation => "fragmentation",
            Verdict::OtherProcesses => "other processes",
            Verdict::GrowthExhausted => "growth exhausted",
            Verdict::SuspectedLeak => "suspected leak",
            Verdict::InUse => "in use",
        }
    }
}

display_as_name!(Verdict);

/// One verdict with its evidence and remedy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The verdict.
    pub verdict: Verdict,
    /// The numbers that support it.
    pub evidence: String,
    /// The strategy or variable that would help.
    pub remedy: String,
}

/// A live allocation cited as evidence of a suspected leak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspect {
    /// Its tag.
    pub tag: String,
    /// Its sequence number (age: lower is older).
    pub seq: u64,
    /// Bytes asked for.
    pub size: u64,
    /// Bytes charged.
    pub rounded: u64,
}

/// The verdicts on one out-of-memory error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// The strategy that ran out.
    pub strategy: String,
    /// The tag of the failed request.
    pub tag: String,
    /// Bytes requested.
    pub requested: u64,
    /// Bytes after the strategy's rounding, when it said.
    pub rounded: u64,
    /// Every verdict that holds, most specific first; never empty.
    pub findings: Vec<Finding>,
    /// The oldest live allocations of the suspected tags (empty without a leak verdict).
    pub suspects: Vec<Suspect>,
}

impl Diagnosis {
    /// The first (most specific) verdict.
    pub fn verdict(&self) -> Verdict {
        self.findings.first().map_or(Verdict::InUse, |f| f.verdict)
    }

    /// True when `verdict` is among the findings.
    pub fn has(&self, verdict: Verdict) -> bool {
        self.findings.iter().any(|f| f.verdict == verdict)
    }

    /// The finding for `verdict`, if it holds.
    pub fn finding(&self, verdict: Verdict) -> Option<&Finding> {
        self.findings.iter().find(|f| f.verdict == verdict)
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "diagnosis of the failed {} request (tag `{}`) to {}:",
            Bytes(self.requested),
            self.tag,
            self.strategy
        )?;
        for (i, finding) in self.findings.iter().enumerate() {
            let lead = if i == 0 { "verdict" } else { "also" };
            writeln!(f, "  {lead}: {}", finding.verdict)?;
            writeln!(f, "    evidence:   {}", finding.evidence)?;
            writeln!(f, "    would help: {}", finding.remedy)?;
        }
        Ok(())
    }
}

/// Where the allocator's memory limit came from, so the diagnosis can say which variable
/// raises it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LimitHint {
    /// The fraction of total device memory in use, if known.
    pub fraction: Option<f64>,
    /// What set it: a variable's name, `the builder`, or `the default`.
    pub source: Option<String>,
    /// Whether the allocator's configuration read the environment
    /// ([`crate::Config::env_read`]): `Some(false)` for one built with
    /// [`crate::ConfigBuilder::ignore_env`], whose user no remedy may tell to set a variable;
    /// `None` when unknown (a hint made by hand), where the variables are named.
    #[serde(default)]
    pub env_read: Option<bool>,
}

impl LimitHint {
    /// Whether a remedy may name an environment variable: unless the configuration is known
    /// not to read them.
    fn variables_apply(&self) -> bool {
        self.env_read != Some(false)
    }

    /// Whether the fraction was given in code, which the variables do not override.
    fn set_in_code(&self) -> bool {
        self.source
            .as_deref()
            .is_some_and(|s| s.starts_with("the builder"))
    }
}

/// How a remedy names a setting: `variables` where the allocator reads them, else `in_code`
/// (an allocator built with `ignore_env` reads no variable, so naming one misleads).
fn setting_named(cx: &OomContext<'_>, variables: &str, in_code: &str) -> String {
    if cx.limit_hint.variables_apply() {
        variables.to_string()
    } else {
        format!("{in_code} (this allocator's configuration reads no environment variable)")
    }
}

/// Thresholds of [`diagnose`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiagnoseOptions {
    /// Memory held by others counts when it is at least this share of the device (0.05).
    pub other_min_share: f64,
    /// A leak is considered only after this many allocations were made (64).
    pub leak_min_allocations: u64,
    /// A tag is suspected when at least this many of its allocations are old (8)…
    pub leak_min_count: u64,
    /// …and its old allocations hold at least this share of the bytes in use (0.25).
    pub leak_min_share: f64,
    /// How many of the oldest suspects to cite (5).
    pub suspects_shown: usize,
}

impl Default for DiagnoseOptions {
    fn default() -> Self {
        DiagnoseOptions {
            other_min_share: 0.05,
            leak_min_allocations: 64,
            leak_min_count: 8,
            leak_min_share: 0.25,
            suspects_shown: 5,
        }
    }
}

/// Everything known at an out-of-memory error.
#[derive(Debug, Clone, Copy)]
pub struct OomContext<'a> {
    /// The strategy's name.
    pub strategy: &'a str,
    /// Bytes requested.
    pub requested: u64,
    /// Bytes after the strategy's rounding (the request if unknown).
    pub rounded: u64,
    /// The requested alignment (0 = default).
    pub alignment: u64,
    /// The request's tag.
    pub tag: &'a str,
    /// The allocator's counters after the failure.
    pub stats: Stats,
    /// The allocator's XLA-style report, when it made one.
    pub report: Option<&'a OomReport>,
    /// The free bytes a device refusal reported (`DeviceOutOfMemory`), when that was the error.
    pub device_error: Option<u64>,
    /// The device's free and total memory after the failure, when known.
    pub device: Option<MemInfo>,
    /// Live allocations, oldest first (from the ledger; empty when there is none).
    pub live: &'a [LiveAllocation],
    /// Allocations made so far (the ledger's next sequence number).
    pub allocations_made: u64,
    /// Where the limit came from.
    pub limit_hint: &'a LimitHint,
    /// Thresholds.
    pub options: &'a DiagnoseOptions,
}

/// Why the vmm strategy helps against fragmentation (after the way to choose it).
const VMM_REASON: &str = "its free space is contiguous across physical chunks, so free bytes \
     anywhere in the pool can serve one request";

/// Gives the verdicts on an out-of-memory error. See the [module documentation](self).
pub fn diagnose(cx: &OomContext<'_>) -> Diagnosis {
    let s = &cx.stats;
    let pool = cx.report.map_or(s.pool_bytes, |r| r.pool_bytes);
    let in_use = cx.report.map_or(s.bytes_in_use, |r| r.bytes_in_use);
    let largest = cx
        .report
        .map_or(s.largest_free_block_bytes, |r| r.largest_free_block);
    let limit = cx.report.and_then(|r| r.limit).or(s.bytes_limit);
    let need = cx.rounded.max(cx.requested);
    let pool_free = pool.saturating_sub(in_use);
    let device_free = cx
        .device
        .map(|m| m.free)
        .or(cx.report.and_then(|r| r.device_free))
        .or(cx.device_error);
    let mut findings = Vec::new();

    // Fragmentation: the free bytes would do, no single block does.
    if pool_free >= need && largest < need {
        let regions = cx.report.map_or(String::new(), |r| {
            format!(" across {} region(s)", r.regions.len())
        });
        let remedy = if cx.strategy == "vmm" {
            "allocate large, long-lived buffers first and short-lived ones after; \
             Allocator::trim between phases"
                .to_string()
        } else {
            format!(
                "{}: {VMM_REASON}; or allocate large, long-lived buffers first",
                setting_named(
                    cx,
                    "XLA_PYTHON_CLIENT_ALLOCATOR=vmm (or PORTALLOC_ALLOCATOR=vmm)",
                    "the vmm strategy (Config::builder().strategy(StrategyKind::Vmm))"
                )
            )
        };
        findings.push(Finding {
            verdict: Verdict::Fragmentation,
            evidence: format!(
                "the pool has {} free ({} B), enough for the {} ({} B) needed, but its largest \
                 free block is {} ({} B){regions}: fragmentation {:.1}%",
                Bytes(pool_free),
                pool_free,
                Bytes(need),
                need,
                Bytes(largest),
                largest,
                Stats::compute_fragmentation(pool, in_use, largest) * 100.0
            ),
            remedy,
        });
    }

    // Other processes: the device is used well beyond this allocator's pool, and could not
    // give what the allocator may still take.
    if let Some(m) = cx.device {
        let used = m.total.saturating_sub(m.free);
        let others = used.saturating_sub(pool);
        let threshold = ((m.total as f64 * cx.options.other_min_share) as u64).max(1);
        let may_take = limit.unwrap_or(m.total).saturating_sub(pool);
        if others >= threshold && (m.free < need || m.free < may_take) {
            findings.push(Finding {
                verdict: Verdict::OtherProcesses,
                evidence: format!(
                    "the device has {} free of {}; {} is in use on it but this allocator holds \
                     only {} (pool), so {} ({:.0}% of the device) is held by other processes \
                     or other allocators on this device; this allocator may still take {} \
                     under its limit",
                    Bytes(m.free),
                    Bytes(m.total),
                    Bytes(used),
                    Bytes(pool),
                    Bytes(others),
                    others as f64 * 100.0 / m.total.max(1) as f64,
                    Bytes(may_take)
                ),
                remedy: format!(
                    "find the other users of the device (nvidia-smi, rocm-smi); make the \
                     memory fractions of everything on the device sum to at most 1 ({}), or \
                     {} so each takes only what it uses",
                    setting_named(
                        cx,
                        "XLA_CLIENT_MEM_FRACTION or PORTALLOC_MEM_FRACTION in each",
                        "Config::builder().mem_fraction here"
                    ),
                    setting_named(
                        cx,
                        "set XLA_PYTHON_CLIENT_PREALLOCATE=false",
                        "grow instead of preallocating (Config::builder().preallocate(false))"
                    )
                ),
            });
        }
    }

    // Growth exhausted: the limit leaves no room to grow by what is needed.
    if let Some(limit) = limit {
        let room = limit.saturating_sub(pool);
        if (room < need && pool_free < need) || need > limit {
            findings.push(growth_exhausted(cx, limit, pool, need, room));
        }
    }

    // Suspected leak: many old live allocations of one tag.
    let mut suspects = Vec::new();
    if let Some(f) = suspected_leak(cx, in_use, &mut suspects) {
        // After fragmentation and other processes, before growth: a leak is the likelier
        // root cause of a reached limit.
        let at = findings
            .iter()
            .position(|f| f.verdict == Verdict::GrowthExhausted)
            .unwrap_or(findings.len());
        findings.insert(at, f);
    }

    if findings.is_empty() {
        let mut by_tag: BTreeMap<&str, u64> = BTreeMap::new();
        for a in cx.live {
            *by_tag.entry(a.tag.as_str()).or_default() += a.rounded;
        }
        let mut tags: Vec<(&str, u64)> = by_tag.into_iter().collect();
        tags.sort_by_key(|t| std::cmp::Reverse(t.1));
        let tags = tags
            .iter()
            .take(3)
            .map(|(t, b)| format!("`{t}` {}", Bytes(*b)))
            .collect::<Vec<_>>()
            .join(", ");
        let device = device_free.map_or(String::new(), |f| {
            format!("; the device has {} free", Bytes(f))
        });
        findings.push(Finding {
            verdict: Verdict::InUse,
            evidence: format!(
                "live allocations hold {} of a pool of {}{}{device}{}",
                Bytes(in_use),
                Bytes(pool),
                limit.map_or(String::new(), |l| format!(" (limit {})", Bytes(l))),
                if tags.is_empty() {
                    String::new()
                } else {
                    format!("; largest tags: {tags}")
                }
            ),
            remedy: format!(
                "free buffers that are no longer needed (or donate them to the computation \
                 that consumes them), reduce the working set (batch size), or raise {}",
                setting_named(
                    cx,
                    "XLA_CLIENT_MEM_FRACTION / PORTALLOC_MEM_FRACTION",
                    "the memory fraction (Config::builder().mem_fraction)"
                )
            ),
        });
    }

    Diagnosis {
        strategy: cx.strategy.to_string(),
        tag: cx.tag.to_string(),
        requested: cx.requested,
        rounded: cx.rounded,
        findings,
        suspects,
    }
}

fn growth_exhausted(cx: &OomContext<'_>, limit: u64, pool: u64, need: u64, room: u64) -> Finding {
    let hint = cx.limit_hint;
    let in_use = cx.report.map_or(cx.stats.bytes_in_use, |r| r.bytes_in_use);
    let advice = match cx.device.map(|m| m.total) {
        Some(t) if t > 0 => fraction_advice(t, in_use, pool, need),
        _ => FractionAdvice::Unknown,
    };
    let evidence = if need > limit {
        format!(
            "the request alone ({} B) exceeds the allocator's limit of {} ({} B)",
            need,
            Bytes(limit),
            limit
        )
    } else {
        format!(
            "the pool holds {} of its limit of {} ({} B = fraction × total): {} left to grow, {} \
             needed",
            Bytes(pool),
            Bytes(limit),
            limit,
            Bytes(room),
            Bytes(need)
        )
    };
    let wanted = match advice {
        // No fraction serves it: raising one would change nothing, so say only what does.
        FractionAdvice::NoneServes(remedy) => {
            return Finding {
                verdict: Verdict::GrowthExhausted,
                evidence,
                remedy,
            }
        }
        FractionAdvice::Serves(tail) => tail,
        FractionAdvice::Unknown => String::new(),
    };
    let now = match (hint.fraction, &hint.source) {
        (Some(f), Some(src)) => format!(" (now {f} from {src})"),
        (Some(f), None) => format!(" (now {f})"),
        _ => String::new(),
    };
    let variable = match hint.source.as_deref() {
        Some(
            v @ ("XLA_CLIENT_MEM_FRACTION"
            | "XLA_PYTHON_CLIENT_MEM_FRACTION"
            | "PORTALLOC_MEM_FRACTION"),
        ) => {
            format!("raise {v}{now}")
        }
        // A fraction given in code beats the variables: setting one would change nothing.
        // The source names the builder's setting already; the setting is said once.
        _ if hint.set_in_code() => format!(
            "raise the fraction given in code ({}Config::builder().mem_fraction, or the C \
             ABI's mem_fraction option), which the variables do not override",
            hint.fraction
                .map_or(String::new(), |f| format!("now {f}: "))
        ),
        _ if !hint.variables_apply() => format!(
            "raise the memory fraction{now} where the allocator is configured \
             (Config::builder().mem_fraction, or the C ABI's mem_fraction option); its \
             configuration reads no environment variable"
        ),
        _ => format!(
            "raise the memory fraction{now}: XLA_CLIENT_MEM_FRACTION, or PORTALLOC_MEM_FRACTION \
             which overrides it"
        ),
    };
    Finding {
        verdict: Verdict::GrowthExhausted,
        evidence,
        remedy: format!("{variable}{wanted}"),
    }
}

/// What [`fraction_advice`] found.
enum FractionAdvice {
    /// A fraction serves the request: the remedy's tail (`"; …"`) naming it.
    Serves(String),
    /// No fraction does (the device cannot hold it): the whole remedy, which names no fraction.
    NoneServes(String),
    /// The device's size is unknown.
    Unknown,
}

/// The fractions of a device of `total` bytes that would serve a request of `need` bytes,
/// from two bounds:
///
/// - **necessary**: `in_use + need` — the bytes already in use stay, and the request comes on
///   top; no fraction below this serves it (whatever the strategy).
/// - **sufficient**: `pool + need` — what the pool holds now plus a new region of the
///   request's size (how a growing strategy grows; a preallocated pool's extra bytes join
///   the free chunk at its end, which makes at most as much needed).
///
/// When the necessary bound exceeds the device no fraction serves it, and the remedy is what
/// does (a smaller request or a larger device; freeing what is in use, where that is enough);
/// when the sufficient one fits, that fraction does; in between, the necessary fraction is
/// named with when it serves (the pool's free bytes at its end, as in a preallocated pool
/// used front to back). Fractions are rounded up to 3 decimals, so that the one named is
/// never below the bound.
fn fraction_advice(total: u64, in_use: u64, pool: u64, need: u64) -> FractionAdvice {
    let necessary = in_use.saturating_add(need);
    let sufficient = pool.max(in_use).saturating_add(need);
    let of = |bytes: u64| (bytes as f64 / total as f64 * 1000.0).ceil() / 1000.0;
    if necessary > total {
        let what_helps = if need > total {
            format!(
                "a smaller request (split the buffer, or a smaller batch) or a device of at \
                 least {}",
                Bytes(necessary)
            )
        } else {
            format!(
                "free at least {} of what is in use (or donate it to the computation that \
                 consumes it), reduce the working set (batch size), or use a larger device",
                Bytes(necessary - total)
            )
        };
        let sum = if in_use == 0 {
            format!("the {} requested", Bytes(need))
        } else {
            format!(
                "the {} in use and the {} requested add up to {}",
                Bytes(in_use),
                Bytes(need),
                Bytes(necessary)
            )
        };
        return FractionAdvice::NoneServes(format!(
            "no fraction serves it on this device of {}: {sum}, more than the device has; \
             what helps: {what_helps}",
            Bytes(total)
        ));
    }
    let (low, high) = (of(necessary), of(sufficient));
    FractionAdvice::Serves(if sufficient <= total && high <= low {
        format!(
            "; a fraction of at least {low:.3} of the device's {} would serve it",
            Bytes(total)
        )
    } else if sufficient <= total {
        format!(
            "; a fraction of {high:.3} of the device's {} serves it (the pool's {} and a new \
             region of the {} requested); none below {low:.3} can (the {} in use and the \
             request)",
            Bytes(total),
            Bytes(pool),
            Bytes(need),
            Bytes(in_use)
        )
    } else {
        format!(
            "; a fraction of at least {low:.3} of the device's {} is needed (the {} in use and \
             the {} requested); it serves the request when the pool's free bytes lie at its \
             end (a preallocated pool used front to back), a larger one when they are \
             scattered",
            Bytes(total),
            Bytes(in_use),
            Bytes(need)
        )
    })
}

fn suspected_leak(
    cx: &OomContext<'_>,
    in_use: u64,
    suspects: &mut Vec<Suspect>,
) -> Option<Finding> {
    let o = cx.options;
    if cx.allocations_made < o.leak_min_allocations || cx.live.is_empty() {
        return None;
    }
    let half = cx.allocations_made / 2;
    // Per tag: (count, rounded bytes) of live allocations from the first half.
    let mut old: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for a in cx.live.iter().filter(|a| a.seq < half) {
        let e = old.entry(a.tag.as_str()).or_default();
        e.0 += 1;
        e.1 += a.rounded;
    }
    let total = in_use.max(cx.live.iter().map(|a| a.rounded).sum()).max(1);
    let mut tags: Vec<(&str, u64, u64)> = old
        .into_iter()
        .filter(|(_, (count, bytes))| {
            *count >= o.leak_min_count && *bytes as f64 >= o.leak_min_share * total as f64
        })
        .map(|(t, (c, b))| (t, c, b))
        .collect();
    if tags.is_empty() {
        return None;
    }
    tags.sort_by_key(|t| std::cmp::Reverse(t.2));
    let mut parts = Vec::new();
    for &(tag, count, bytes) in &tags {
        let oldest: Vec<&LiveAllocation> = cx
            .live
            .iter()
            .filter(|a| a.tag == tag)
            .take(o.suspects_shown)
            .collect();
        parts.push(format!(
            "tag `{tag}`: {count} allocations ({}, {:.0}% of the bytes in use) still live from \
             the first half of the {} allocations made; oldest: {}",
            Bytes(bytes),
            bytes as f64 * 100.0 / total as f64,
            cx.allocations_made,
            oldest
                .iter()
                .map(|a| format!("#{} ({})", a.seq, Bytes(a.size)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        suspects.extend(oldest.into_iter().map(|a| Suspect {
            tag: a.tag.clone(),
            seq: a.seq,
            size: a.size,
            rounded: a.rounded,
        }));
    }
    let names = tags
        .iter()
        .map(|t| format!("`{}`", t.0))
        .collect::<Vec<_>>()
        .join(", ");
    Some(Finding {
        verdict: Verdict::SuspectedLeak,
        evidence: parts.join("; "),
        remedy: format!(
            "check that the {names} buffers are freed (or donated to their consumer) once used; \
             run with {} and print the ledger (`portalloc ledger FILE`) to see where each was \
             allocated",
            setting_named(
                cx,
                "PORTALLOC_BACKTRACE=1",
                "backtraces on (Config::builder().backtrace(true))"
            )
        ),
    })
}
