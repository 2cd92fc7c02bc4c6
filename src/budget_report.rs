//! What a request that the shared budget ([`crate::budget`]) could not serve says: every
//! member, what it holds, what it was asked, what it gave or why not, and settings that would
//! let the members run together. Beside the error type, which carries it
//! ([`crate::Error::OutOfMemoryShared`]), and depending on nothing of the budget's.
#![deny(unsafe_code)]

use std::fmt;

use crate::units::Bytes;

/// A tag a member declared reclaimable, as its slot says it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TagEntry {
    /// The tag.
    pub name: String,
    /// Bytes it holds (awake) or held (asleep).
    pub bytes: u64,
    /// Declared reclaimable.
    pub reclaimable: bool,
    /// A sleep keeps its contents.
    pub keep: bool,
    /// Inside a `using` section.
    pub in_use: bool,
    /// Asleep now.
    pub asleep: bool,
}

/// A member of a shared budget, as a report shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberReport {
    /// Its pid.
    pub pid: u32,
    /// Its label.
    pub name: String,
    /// Bytes held from the device.
    pub reserved: u64,
    /// Bytes in use.
    pub in_use: u64,
    /// Bytes cached.
    pub cached: u64,
    /// Bytes asleep.
    pub asleep: u64,
    /// Its floor.
    pub floor: u64,
    /// Its ceiling (`None`: none).
    pub ceiling: Option<u64>,
    /// Bytes given to others so far.
    pub given: u64,
    /// Asks refused so far.
    pub refused: u64,
    /// Its reclaimable tags.
    pub tags: Vec<TagEntry>,
}

/// Why a member did not give what it was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// The tag was inside a `using` section.
    InUse,
    /// The member is at its floor.
    AtFloor,
    /// Its strategy could not (nothing to trim, sleep unsupported, the call failed).
    Cannot,
    /// No answer before the deadline.
    NoAnswer,
    /// The member died or left.
    Gone,
}

impl Refusal {
    /// A few words.
    pub fn words(self) -> &'static str {
        match self {
            Refusal::InUse => "refused: the tag is in use",
            Refusal::AtFloor => "refused: at its floor",
            Refusal::Cannot => "could not",
            Refusal::NoAnswer => "no answer before the deadline",
            Refusal::Gone => "gone (died or left)",
        }
    }
}

/// One ask and its answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AskOutcome {
    /// The member asked.
    pub pid: u32,
    /// Its label.
    pub name: String,
    /// `trim` or `sleep`.
    pub kind: &'static str,
    /// The tag asked to sleep (empty for a trim).
    pub tag: String,
    /// Bytes asked.
    pub wanted: u64,
    /// Bytes given.
    pub given: u64,
    /// Why not, when it did not give.
    pub refusal: Option<Refusal>,
}

/// The shared budget's part of an out-of-memory report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BudgetReport {
    /// The device key.
    pub device: String,
    /// The device's total bytes.
    pub total: u64,
    /// The requesting process.
    pub pid: u32,
    /// Bytes requested.
    pub requested: u64,
    /// Every live member, the requester included.
    pub members: Vec<MemberReport>,
    /// The asks made and their answers.
    pub asked: Vec<AskOutcome>,
}

impl BudgetReport {
    /// A report of `requested` bytes that `pid` could not get.
    pub fn new(
        device: &str,
        total: u64,
        pid: u32,
        requested: u64,
        members: Vec<MemberReport>,
        asked: Vec<AskOutcome>,
    ) -> BudgetReport {
        BudgetReport {
            device: device.to_string(),
            total,
            pid,
            requested,
            members,
            asked,
        }
    }

    /// Settings that would let every member run: each member's fraction of the device, so
    /// that the members' reservations fit together (5% of the device left to the driver and
    /// the contexts), or growth instead of preallocation with the budget moving memory.
    pub fn advice(&self) -> Vec<String> {
        let n = self.members.len().max(1) as u64;
        let share = (95 / n) as f64 / 100.0;
        let mut advice = vec![format!(
            "give each of the {n} processes its share: XLA_CLIENT_MEM_FRACTION={share:.2} in \
             every one (or PORTALLOC_CEILING={share:.2})"
        )];
        advice.push(
            "or let them grow instead of preallocating (XLA_PYTHON_CLIENT_PREALLOCATE=false, or \
             PORTALLOC_ALLOCATOR=vmm), declare what can be given back \
             (portalloc.declare_reclaimable), and the budget moves memory between them"
                .to_string(),
        );
        if let Some(big) = self
            .members
            .iter()
            .filter(|m| m.pid != self.pid)
            .max_by_key(|m| m.reserved)
        {
            advice.push(format!(
                "pid {} `{}` holds {} of {}; with that setting it would hold at most {}",
                big.pid,
                big.name,
                Bytes(big.reserved),
                Bytes(self.total),
                Bytes((share * self.total as f64) as u64)
            ));
        }
        advice
    }
}

fn limit(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "none".into(), |b| Bytes(b).to_string())
}

impl fmt::Display for BudgetReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "shared budget of device {} ({}): {} member(s)",
            self.device,
            Bytes(self.total),
            self.members.len()
        )?;
        for m in &self.members {
            let who = if m.pid == self.pid {
                "this process"
            } else {
                "member"
            };
            writeln!(
                f,
                "  pid {} `{}` ({who}): reserved {}, in use {}, cached {}, asleep {}, floor {}, \
                 ceiling {}, gave {} so far",
                m.pid,
                m.name,
                Bytes(m.reserved),
                Bytes(m.in_use),
                Bytes(m.cached),
                Bytes(m.asleep),
                Bytes(m.floor),
                limit(m.ceiling),
                Bytes(m.given)
            )?;
            for t in &m.tags {
                writeln!(
                    f,
                    "    tag `{}`: {}{}{}{}",
                    t.name,
                    Bytes(t.bytes),
                    if t.keep {
                        ", keeps contents"
                    } else {
                        ", discards contents"
                    },
                    if t.in_use { ", in use" } else { "" },
                    if t.asleep { ", asleep" } else { "" }
                )?;
            }
        }
        if self.asked.is_empty() {
            writeln!(
                f,
                "  nothing to ask: no other member caches memory or has a reclaimable tag out of use"
            )?;
        }
        for a in &self.asked {
            let what = if a.tag.is_empty() {
                a.kind.to_string()
            } else {
                format!("{} `{}`", a.kind, a.tag)
            };
            match a.refusal {
                None => writeln!(
                    f,
                    "  asked pid {} `{}` to {what} ({}): gave {}",
                    a.pid,
                    a.name,
                    Bytes(a.wanted),
                    Bytes(a.given)
                )?,
                Some(r) => writeln!(
                    f,
                    "  asked pid {} `{}` to {what} ({}): {}",
                    a.pid,
                    a.name,
                    Bytes(a.wanted),
                    r.words()
                )?,
            }
        }
        writeln!(f, "what would let them run together:")?;
        for a in self.advice() {
            writeln!(f, "  - {a}")?;
        }
        Ok(())
    }
}
