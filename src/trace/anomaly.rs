//! What importers tolerate, and the bookkeeping that finds it.

use crate::trace::{anomaly_error, malformed_error, Input};
use std::collections::{hash_map, BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io::{BufRead, Read};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde::Serialize;

use super::Op;
use crate::trace::Result;

/// Where in a source something happened: for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Loc {
    /// Line of a text file, from 1 (the header line included).
    Line(u64),
    /// Position of the record in the source's list of events, from 1 (snapshot: the index in
    /// `device_traces[d]` plus one; Kineto: the index in `traceEvents` plus one).
    Event(u64),
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Line(n) => write!(f, "line {n}"),
            Loc::Event(n) => write!(f, "event {n}"),
        }
    }
}

/// A kind of thing a trace should not contain but an importer can step over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum AnomalyKind {
    /// A free of an address (or id) never allocated in the trace, and not covered by the
    /// baseline. Dropped.
    UnknownFree,
    /// A second free of an address (or id) already freed. Dropped.
    DoubleFree,
    /// An allocation of zero bytes. Dropped, and so is its free.
    ZeroSize,
    /// An allocation at an address still live (its free is missing). Addresses: the old
    /// allocation is freed first (an implicit free is emitted). Ids: the allocation is dropped.
    AllocLive,
    /// A free whose size differs from the allocation's. The allocation's size is kept.
    SizeMismatch,
    /// A record that cannot be used (an empty or reversed lifetime, a duplicate id, a memory
    /// event lacking a field). Dropped.
    InvalidRecord,
    /// A failed allocation the recording allocator logged (RMM `allocate failure`, snapshot
    /// `oom`). Not an event, and not a defect of the trace: [`Options::strict`] ignores it.
    ///
    /// [`Options::strict`]: super::Options::strict
    AllocFailure,
    /// The last row of a CSV ends without a line end: the file may have been cut short
    /// inside it (a size of 12582912 cut to `125` reads as 125 bytes). A file whose last row
    /// is whole but lacks its final newline reads the same, which is why this is counted, not
    /// refused; under [`Options::strict`] it is a [`TraceErrorKind::Malformed`] error.
    ///
    /// [`Options::strict`]: super::Options::strict
    /// [`TraceErrorKind::Malformed`]: super::TraceErrorKind::Malformed
    NoLineEnd,
}

impl AnomalyKind {
    /// Every kind.
    pub const ALL: [AnomalyKind; 8] = [
        AnomalyKind::UnknownFree,
        AnomalyKind::DoubleFree,
        AnomalyKind::ZeroSize,
        AnomalyKind::AllocLive,
        AnomalyKind::SizeMismatch,
        AnomalyKind::InvalidRecord,
        AnomalyKind::AllocFailure,
        AnomalyKind::NoLineEnd,
    ];

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            AnomalyKind::UnknownFree => "free of never-allocated",
            AnomalyKind::DoubleFree => "double free",
            AnomalyKind::ZeroSize => "zero size",
            AnomalyKind::AllocLive => "allocation at a live address",
            AnomalyKind::SizeMismatch => "free size mismatch",
            AnomalyKind::InvalidRecord => "invalid record",
            AnomalyKind::AllocFailure => "allocation failure",
            AnomalyKind::NoLineEnd => "last row has no line end (cut short?)",
        }
    }

    /// True for what makes a trace wrong (all but [`AnomalyKind::AllocFailure`]).
    pub fn is_defect(self) -> bool {
        self != AnomalyKind::AllocFailure
    }
}

/// One anomaly, kept as an example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    /// What kind.
    pub kind: AnomalyKind,
    /// Where.
    pub loc: Loc,
    /// What, in words.
    pub message: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.loc, self.message)
    }
}

/// Counts of each [`AnomalyKind`], with the first few of each as examples.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Anomalies {
    counts: BTreeMap<AnomalyKind, u64>,
    examples: Vec<Anomaly>,
}

impl Anomalies {
    /// Examples kept per kind.
    pub const EXAMPLES_PER_KIND: usize = 3;

    /// No anomalies.
    pub fn new() -> Self {
        Anomalies::default()
    }

    /// How many of `kind`.
    pub fn count(&self, kind: AnomalyKind) -> u64 {
        self.counts.get(&kind).copied().unwrap_or(0)
    }

    /// How many defects (every kind but [`AnomalyKind::AllocFailure`]).
    pub fn defects(&self) -> u64 {
        self.counts
            .iter()
            .filter(|(k, _)| k.is_defect())
            .map(|(_, n)| *n)
            .sum()
    }

    /// True when nothing at all was counted.
    pub fn is_empty(&self) -> bool {
        self.counts.values().all(|&n| n == 0)
    }

    /// The first few of `kind`, in source order.
    pub fn examples(&self, kind: AnomalyKind) -> impl Iterator<Item = &Anomaly> + '_ {
        self.examples.iter().filter(move |a| a.kind == kind)
    }

    /// Every example kept, in the order found.
    pub fn all_examples(&self) -> &[Anomaly] {
        &self.examples
    }

    /// Counts one; keeps it as an example when fewer than [`Self::EXAMPLES_PER_KIND`] are.
    pub fn record(&mut self, kind: AnomalyKind, loc: Loc, message: impl Into<String>) {
        let n = self.counts.entry(kind).or_insert(0);
        *n += 1;
        if *n <= Self::EXAMPLES_PER_KIND as u64 {
            self.examples.push(Anomaly {
                kind,
                loc,
                message: message.into(),
            });
        }
    }

    /// Adds `other`'s counts and examples to these.
    pub fn merge(&mut self, other: &Anomalies) {
        for (k, n) in &other.counts {
            let mine = self.counts.entry(*k).or_insert(0);
            let kept = self.examples.iter().filter(|a| a.kind == *k).count();
            let room = Self::EXAMPLES_PER_KIND.saturating_sub(kept);
            self.examples.extend(other.examples(*k).take(room).cloned());
            *mine += n;
        }
    }
}

impl fmt::Display for Anomalies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no anomalies");
        }
        let mut first = true;
        for (k, n) in &self.counts {
            if *n == 0 {
                continue;
            }
            if !first {
                f.write_str("; ")?;
            }
            first = false;
            write!(f, "{n} × {}", k.name())?;
            let ex: Vec<String> = self.examples(*k).map(|a| a.to_string()).collect();
            if !ex.is_empty() {
                write!(f, " (first: {})", ex.join(", "))?;
            }
        }
        Ok(())
    }
}

/// How a [`Tracker`] keys allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keying {
    /// Keys are allocation ids (own format): the output id is the key.
    Ids,
    /// Keys are addresses (importers): each allocation gets a fresh id from 1 up.
    Addresses,
}

/// An operation the tracker lets through: (op, id, size).
pub(crate) type Step = (Op, u64, u64);

/// Up to two operations out of one input record.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Steps(pub(crate) [Option<Step>; 2]);

impl Steps {
    fn one(s: Step) -> Self {
        Steps([Some(s), None])
    }
    pub(crate) fn iter(self) -> impl Iterator<Item = Step> {
        self.0.into_iter().flatten()
    }
}

/// A set of u64 that is a bitset for small values (ids numbered from 1) and a hash set
/// beyond.
#[derive(Debug, Default)]
struct U64Set {
    bits: Vec<u64>,
    other: HashSet<u64>,
}

const BITSET_LIMIT: u64 = 1 << 27;

impl U64Set {
    fn insert(&mut self, v: u64) {
        if v < BITSET_LIMIT {
            let word = (v / 64) as usize;
            if word >= self.bits.len() {
                self.bits.resize(word + 1, 0);
            }
            self.bits[word] |= 1 << (v % 64);
        } else {
            self.other.insert(v);
        }
    }
    fn contains(&self, v: u64) -> bool {
        if v < BITSET_LIMIT {
            self.bits
                .get((v / 64) as usize)
                .is_some_and(|w| w & (1 << (v % 64)) != 0)
        } else {
            self.other.contains(&v)
        }
    }
    fn remove(&mut self, v: u64) {
        if v < BITSET_LIMIT {
            if let Some(w) = self.bits.get_mut((v / 64) as usize) {
                *w &= !(1 << (v % 64));
            }
        } else {
            self.other.remove(&v);
        }
    }
}

/// Follows allocations and frees, finds anomalies, assigns ids, and decides what passes.
///
/// Memory: O(live allocations + freed keys); freed ids are one bit each.
#[derive(Debug)]
pub(crate) struct Tracker {
    keying: Keying,
    strict: bool,
    origin: String,
    /// key → (id, size)
    live: HashMap<u64, (u64, u64)>,
    zero_live: HashSet<u64>,
    freed: U64Set,
    next_id: u64,
    baseline_left: u64,
    /// The baseline is not known yet ([`Tracker::defer_baseline`]): [`Tracker::try_free`]
    /// answers `None`, changing nothing, for a free that would draw on it.
    baseline_deferred: bool,
    pub(crate) anomalies: Anomalies,
    pub(crate) baseline_frees: u64,
}

impl Tracker {
    pub(crate) fn new(keying: Keying, strict: bool, origin: &str, baseline: u64) -> Self {
        Tracker {
            keying,
            strict,
            origin: origin.to_string(),
            live: HashMap::new(),
            zero_live: HashSet::new(),
            freed: U64Set::default(),
            next_id: 1,
            baseline_left: baseline,
            baseline_deferred: false,
            anomalies: Anomalies::new(),
            baseline_frees: 0,
        }
    }

    /// Counts an anomaly; an error in strict mode when it is a defect.
    pub(crate) fn anomaly(&mut self, kind: AnomalyKind, loc: Loc, message: String) -> Result<()> {
        if self.strict && kind.is_defect() {
            return Err(anomaly_error(format!(
                "{}: {loc}: {message} (strict mode: {} is an error)",
                self.origin,
                kind.name()
            )));
        }
        self.anomalies.record(kind, loc, message);
        Ok(())
    }

    /// Counts the last row, at `line`, ending without a line end
    /// ([`AnomalyKind::NoLineEnd`]); in strict mode a [`TraceErrorKind::Malformed`] error
    /// instead: the row may hold a number cut short, which strict mode does not replay.
    ///
    /// [`TraceErrorKind::Malformed`]: super::TraceErrorKind::Malformed
    pub(crate) fn no_line_end(&mut self, line: u64) -> Result<()> {
        let origin = &self.origin;
        if self.strict {
            return Err(malformed_error(format!(
                "{origin}: line {line} has no line end: the file may be cut short inside this \
                 row (a number cut short reads as a smaller one); a last row that is whole but \
                 lacks its final newline reads the same: end the file with a newline, or read \
                 it without --strict (trace::Options::strict) to count this as an anomaly"
            )));
        }
        let message = format!(
            "no line end: {origin} may be cut short inside this row (a number cut short reads \
             as a smaller one); a last row that is whole but lacks its final newline reads the same"
        );
        self.anomalies
            .record(AnomalyKind::NoLineEnd, Loc::Line(line), message);
        Ok(())
    }

    fn what(&self) -> &'static str {
        match self.keying {
            Keying::Ids => "id",
            Keying::Addresses => "address",
        }
    }

    fn show(&self, key: u64) -> String {
        match self.keying {
            Keying::Ids => key.to_string(),
            Keying::Addresses => format!("{key:#x}"),
        }
    }

    fn fresh_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id = self.next_id.saturating_add(1);
        id
    }

    pub(crate) fn alloc(&mut self, loc: Loc, key: u64, size: u64) -> Result<Steps> {
        if size == 0 {
            let what = self.what();
            let shown = self.show(key);
            self.anomaly(
                AnomalyKind::ZeroSize,
                loc,
                format!("allocation of zero bytes at {what} {shown}"),
            )?;
            self.zero_live.insert(key);
            return Ok(Steps::default());
        }
        if self.keying == Keying::Addresses {
            // The common case, in one lookup of `live` (a hash of the key costs as much as
            // the rest of the step): an address not live gets a fresh id, as below.
            if let hash_map::Entry::Vacant(slot) = self.live.entry(key) {
                if !self.zero_live.is_empty() {
                    self.zero_live.remove(&key);
                }
                self.freed.remove(key);
                let id = self.next_id;
                self.next_id = self.next_id.saturating_add(1);
                slot.insert((id, size));
                return Ok(Steps::one((Op::Alloc, id, size)));
            }
        }
        let mut steps = Steps::default();
        if let Some(&(old_id, old_size)) = self.live.get(&key) {
            let what = self.what();
            let shown = self.show(key);
            match self.keying {
                Keying::Ids => {
                    self.anomaly(
                        AnomalyKind::AllocLive,
                        loc,
                        format!("allocation of id {shown} ({size} bytes), which is already live"),
                    )?;
                    return Ok(Steps::default());
                }
                Keying::Addresses => {
                    self.anomaly(
                        AnomalyKind::AllocLive,
                        loc,
                        format!(
                            "allocation of {size} bytes at {what} {shown}, still live with {old_size} bytes (its free is missing; freed implicitly)"
                        ),
                    )?;
                    self.live.remove(&key);
                    steps.0[0] = Some((Op::Free, old_id, old_size));
                }
            }
        }
        // Hashing a key costs as much as the rest of the step: none for a set that is
        // empty, as it nearly always is.
        if !self.zero_live.is_empty() {
            self.zero_live.remove(&key);
        }
        let id = match self.keying {
            Keying::Ids => {
                if self.freed.contains(key) {
                    let shown = self.show(key);
                    self.anomaly(
                        AnomalyKind::AllocLive,
                        loc,
                        format!("allocation of id {shown}, which was already allocated and freed (ids are never reused)"),
                    )?;
                    return Ok(Steps::default());
                }
                key
            }
            Keying::Addresses => {
                self.freed.remove(key);
                self.fresh_id()
            }
        };
        self.live.insert(key, (id, size));
        let a = (Op::Alloc, id, size);
        if steps.0[0].is_some() {
            steps.0[1] = Some(a);
            Ok(steps)
        } else {
            Ok(Steps::one(a))
        }
    }

    /// From now until [`Tracker::set_baseline`], a free that would draw on the baseline (of
    /// a key neither live nor freed before) is not made: [`Tracker::try_free`] answers `None`.
    /// For an importer that learns the baseline only at the end of its input: what it feeds
    /// before the first such free does not depend on the baseline.
    pub(crate) fn defer_baseline(&mut self) {
        self.baseline_deferred = true;
    }

    /// Sets the baseline (what is left of it to draw on) and ends a deferral.
    pub(crate) fn set_baseline(&mut self, baseline: u64) {
        self.baseline_left = baseline;
        self.baseline_deferred = false;
    }

    pub(crate) fn free(&mut self, loc: Loc, key: u64, size: u64) -> Result<Steps> {
        Ok(self.try_free(loc, key, size)?.unwrap_or_default())
    }

    /// [`Tracker::free`], or `None` while the baseline is deferred and the free would draw on
    /// it; then nothing has changed (the same free made once the baseline is set does what
    /// it would have done).
    ///
    /// # Errors
    /// An anomaly in strict mode.
    pub(crate) fn try_free(&mut self, loc: Loc, key: u64, size: u64) -> Result<Option<Steps>> {
        if let Some((id, live_size)) = self.live.remove(&key) {
            self.freed.insert(key);
            if size != live_size {
                let shown = self.show(key);
                let what = self.what();
                self.anomaly(
                    AnomalyKind::SizeMismatch,
                    loc,
                    format!(
                        "free of {size} bytes at {what} {shown}, allocated with {live_size} bytes (kept {live_size})"
                    ),
                )?;
            }
            return Ok(Some(Steps::one((Op::Free, id, live_size))));
        }
        if self.zero_live.remove(&key) {
            return Ok(Some(Steps::default()));
        }
        let shown = self.show(key);
        let what = self.what();
        if self.freed.contains(key) {
            self.anomaly(
                AnomalyKind::DoubleFree,
                loc,
                format!("double free of {what} {shown} ({size} bytes)"),
            )?;
            return Ok(Some(Steps::default()));
        }
        if self.baseline_deferred {
            return Ok(None);
        }
        if size > 0 && size <= self.baseline_left {
            // Memory allocated before the window: released from the baseline.
            self.baseline_left -= size;
            self.baseline_frees += 1;
            self.freed.insert(key);
            let id = match self.keying {
                Keying::Ids => key,
                Keying::Addresses => self.fresh_id(),
            };
            return Ok(Some(Steps::one((Op::Free, id, size))));
        }
        let why = if size == 0 {
            "zero bytes"
        } else {
            "more than the baseline left"
        };
        let left = self.baseline_left;
        self.anomaly(
            AnomalyKind::UnknownFree,
            loc,
            format!(
                "free of {what} {shown} ({size} bytes), never allocated ({why}: baseline left {left} bytes)"
            ),
        )?;
        Ok(Some(Steps::default()))
    }
}

/// Whether an input ended with a line end, as a CSV importer asks once its rows are read:
/// the `csv` crate reads a last row without one as it reads any other, so the bytes are
/// watched on their way to it ([`LineEnds::watch`]).
#[derive(Debug, Clone)]
pub(crate) struct LineEnds(Arc<AtomicU32>);

impl LineEnds {
    /// Nothing read yet (a byte is 0 to 255).
    const NOTHING: u32 = u32::MAX;

    pub(crate) fn new() -> Self {
        LineEnds(Arc::new(AtomicU32::new(Self::NOTHING)))
    }

    /// `input`, remembering the last byte read from it here.
    pub(crate) fn watch(&self, input: Input) -> Input {
        Box::new(Watched {
            inner: input,
            last: self.clone(),
        })
    }

    /// The last byte read ends a line (`\n`, or a `\r`, which the `csv` crate takes for one
    /// too), or nothing was read.
    pub(crate) fn ended_line(&self) -> bool {
        match self.0.load(Ordering::Relaxed) {
            Self::NOTHING => true,
            b => b == u32::from(b'\n') || b == u32::from(b'\r'),
        }
    }

    fn saw(&self, bytes: &[u8]) {
        if let Some(&b) = bytes.last() {
            self.0.store(u32::from(b), Ordering::Relaxed);
        }
    }
}

/// An input whose last byte read is kept in its [`LineEnds`].
struct Watched {
    inner: Input,
    last: LineEnds,
}

impl Read for Watched {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.last.saw(&buf[..n]);
        Ok(n)
    }
}

impl BufRead for Watched {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amt: usize) {
        // Only the bytes consumed were read; `fill_buf` showed them first.
        if amt > 0 {
            if let Ok(bytes) = self.inner.fill_buf() {
                self.last.saw(&bytes[..amt.min(bytes.len())]);
            }
        }
        self.inner.consume(amt);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last byte read decides, however it was read (`read` or `fill_buf`/`consume`);
    /// nothing read counts as a line ended (an empty input has no row to be cut).
    #[test_case::test_case(b"a,b\n1,2\n", true ; "ends with a newline")]
    #[test_case::test_case(b"a,b\r\n1,2\r\n", true ; "ends with CRLF")]
    #[test_case::test_case(b"a,b\r1,2\r", true ; "ends with a carriage return")]
    #[test_case::test_case(b"a,b\n1,2", false ; "ends inside its last row")]
    #[test_case::test_case(b"", true ; "empty")]
    fn line_ends_are_watched(bytes: &'static [u8], ended: bool) {
        let ends = LineEnds::new();
        let mut r = ends.watch(Box::new(std::io::Cursor::new(bytes)));
        std::io::copy(&mut r, &mut std::io::sink()).unwrap();
        assert_eq!(ends.ended_line(), ended);
        let ends = LineEnds::new();
        let mut r = ends.watch(Box::new(std::io::Cursor::new(bytes)));
        loop {
            let n = r.fill_buf().unwrap().len().min(3);
            if n == 0 {
                break;
            }
            r.consume(n);
        }
        assert_eq!(ends.ended_line(), ended);
    }

    fn ops(s: Steps) -> Vec<Step> {
        s.iter().collect()
    }

    /// One free per case, made by a tracker that defers its baseline and again once it is
    /// set, against a tracker that knew the baseline from the start: deferred exactly when
    /// the free would draw on the baseline, and then with nothing changed.
    #[test_case::test_case(0x10, 8, true ; "drawn from the baseline")]
    #[test_case::test_case(0x99, 500, true ; "more than the baseline left")]
    #[test_case::test_case(0x98, 0, true ; "zero bytes of an unknown address")]
    #[test_case::test_case(0x20, 16, false ; "a live address")]
    #[test_case::test_case(0x30, 4, false ; "a double free")]
    #[test_case::test_case(0x40, 0, false ; "a zero-byte allocation")]
    fn a_deferred_baseline_changes_nothing_it_does_not_defer(key: u64, size: u64, deferred: bool) {
        let setup = |t: &mut Tracker| {
            t.alloc(Loc::Event(1), 0x20, 16).unwrap();
            t.alloc(Loc::Event(2), 0x30, 4).unwrap();
            t.free(Loc::Event(3), 0x30, 4).unwrap();
            t.alloc(Loc::Event(4), 0x40, 0).unwrap();
        };
        let mut known = Tracker::new(Keying::Addresses, false, "t", 100);
        setup(&mut known);
        let want = ops(known.free(Loc::Event(5), key, size).unwrap());

        let mut late = Tracker::new(Keying::Addresses, false, "t", 0);
        late.defer_baseline();
        setup(&mut late);
        let first = late.try_free(Loc::Event(5), key, size).unwrap();
        assert_eq!(first.is_none(), deferred);
        let got = match first {
            Some(steps) => {
                // Set at the end, as an importer does once it knows it.
                late.set_baseline(100);
                ops(steps)
            }
            None => {
                late.set_baseline(100);
                ops(late.try_free(Loc::Event(5), key, size).unwrap().unwrap())
            }
        };
        assert_eq!(got, want);
        assert_eq!(late.anomalies, known.anomalies);
        assert_eq!(late.baseline_frees, known.baseline_frees);
        assert_eq!(late.baseline_left, known.baseline_left);
        // And the next allocation gets the same id.
        assert_eq!(
            ops(late.alloc(Loc::Event(6), 0x50, 1).unwrap()),
            ops(known.alloc(Loc::Event(6), 0x50, 1).unwrap())
        );
    }

    #[test]
    fn addresses_get_fresh_ids_and_anomalies_are_counted() {
        let mut t = Tracker::new(Keying::Addresses, false, "t", 100);
        assert_eq!(
            ops(t.alloc(Loc::Line(2), 0x10, 8).unwrap()),
            [(Op::Alloc, 1, 8)]
        );
        assert_eq!(
            ops(t.free(Loc::Line(3), 0x10, 8).unwrap()),
            [(Op::Free, 1, 8)]
        );
        assert!(ops(t.free(Loc::Line(4), 0x10, 8).unwrap()).is_empty());
        assert_eq!(t.anomalies.count(AnomalyKind::DoubleFree), 1);
        // baseline free
        assert_eq!(
            ops(t.free(Loc::Line(5), 0x20, 60).unwrap()),
            [(Op::Free, 2, 60)]
        );
        assert_eq!(t.baseline_frees, 1);
        // beyond the baseline
        assert!(ops(t.free(Loc::Line(6), 0x30, 60).unwrap()).is_empty());
        assert_eq!(t.anomalies.count(AnomalyKind::UnknownFree), 1);
        // alloc at live address
        t.alloc(Loc::Line(7), 0x40, 8).unwrap();
        assert_eq!(
            ops(t.alloc(Loc::Line(8), 0x40, 16).unwrap()),
            [(Op::Free, 3, 8), (Op::Alloc, 4, 16)]
        );
        // zero size
        assert!(ops(t.alloc(Loc::Line(9), 0x50, 0).unwrap()).is_empty());
        assert!(ops(t.free(Loc::Line(10), 0x50, 0).unwrap()).is_empty());
        assert_eq!(t.anomalies.count(AnomalyKind::ZeroSize), 1);
        assert_eq!(t.anomalies.count(AnomalyKind::UnknownFree), 1);
    }

    #[test]
    fn strict_names_the_line() {
        let mut t = Tracker::new(Keying::Ids, true, "f.jsonl", 0);
        let e = t.free(Loc::Line(42), 7, 8).unwrap_err().to_string();
        assert!(e.contains("line 42"), "{e}");
        assert!(e.contains("f.jsonl"), "{e}");
    }

    #[test]
    fn bitset_and_overflow() {
        let mut s = U64Set::default();
        for v in [0, 63, 64, 1000, BITSET_LIMIT, u64::MAX] {
            assert!(!s.contains(v));
            s.insert(v);
            assert!(s.contains(v));
            s.remove(v);
            assert!(!s.contains(v));
        }
    }
}
