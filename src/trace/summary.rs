//! A one-pass summary of a trace, in O(live allocations) memory.

use std::collections::BTreeSet;
use std::fmt;

use serde::Serialize;

use super::{Anomalies, Event, Keying, Loc, Op, Trace, Tracker};
use crate::trace::Result;
use crate::units::Bytes;

/// Figures of a whole trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Events seen (after the source dropped what it could not use).
    pub events: u64,
    /// Allocations.
    pub allocs: u64,
    /// Frees (those of memory allocated before the window included).
    pub frees: u64,
    /// Frees of allocations made before the window, released from the baseline.
    pub baseline_frees: u64,
    /// Bytes live before the first event ([`TraceHeader::baseline_bytes`]).
    ///
    /// [`TraceHeader::baseline_bytes`]: super::TraceHeader::baseline_bytes
    pub baseline_bytes: u64,
    /// Highest bytes live at any point, baseline included: a floor for any allocator.
    pub peak_live_bytes: u64,
    /// `peak_live_bytes - baseline_bytes`: the window's own contribution to the peak.
    pub peak_live_in_window: u64,
    /// `seq` of the event at which the peak was first reached (`None`: before any event).
    pub peak_seq: Option<u64>,
    /// Bytes live after the last event, baseline included.
    pub final_live: u64,
    /// Sum of all allocation sizes.
    pub bytes_allocated: u64,
    /// Largest allocation.
    pub max_alloc: u64,
    /// Number of distinct streams allocated on.
    pub distinct_streams: u64,
    /// Number of distinct threads.
    pub distinct_threads: u64,
    /// Time of the first and the last event, in nanoseconds.
    pub time_span_ns: Option<(u64, u64)>,
    /// What the source tolerated, plus what the summary itself found.
    pub anomalies: Anomalies,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} allocs + {} frees ({} of memory from before the window); peak live {} ({} before the window); final live {}; largest allocation {}; {} streams; {}",
            self.allocs,
            self.frees,
            self.baseline_frees,
            Bytes(self.peak_live_bytes),
            Bytes(self.baseline_bytes),
            Bytes(self.final_live),
            Bytes(self.max_alloc),
            self.distinct_streams,
            self.anomalies
        )
    }
}

/// Summarizes `trace`, consuming its events.
///
/// # Errors
/// The first error the trace yields (corrupt input, or an anomaly in strict mode).
pub fn summarize(mut trace: Trace) -> Result<Summary> {
    let baseline = trace.header().baseline_bytes;
    let mut s = summarize_events(baseline, &mut trace)?;
    let mut all = trace.anomalies().clone();
    all.merge(&s.anomalies);
    s.anomalies = all;
    Ok(s)
}

/// Summarizes `events` over `baseline_bytes` already live. Events are checked again (ids
/// freed twice, frees of unknown ids beyond the baseline, …): what fails is counted in
/// [`Summary::anomalies`] and left out of the figures.
///
/// # Errors
/// The first `Err` of `events`.
pub fn summarize_events<I>(baseline_bytes: u64, events: I) -> Result<Summary>
where
    I: IntoIterator<Item = Result<Event>>,
{
    let mut tracker = Tracker::new(Keying::Ids, false, "summary", baseline_bytes);
    let mut streams = BTreeSet::new();
    let mut threads = BTreeSet::new();
    let mut s = Summary {
        baseline_bytes,
        peak_live_bytes: baseline_bytes,
        ..Summary::default()
    };
    let mut live = u128::from(baseline_bytes);
    let mut peak = live;
    for (n, e) in events.into_iter().enumerate() {
        let e = e?;
        s.events += 1;
        s.time_span_ns = Some(match s.time_span_ns {
            None => (e.time_ns, e.time_ns),
            Some((a, b)) => (a.min(e.time_ns), b.max(e.time_ns)),
        });
        threads.insert(e.thread);
        let loc = Loc::Event(n as u64 + 1);
        let steps = match e.op {
            Op::Alloc => tracker.alloc(loc, e.id, e.size)?,
            Op::Free => tracker.free(loc, e.id, e.size)?,
        };
        for (op, _, size) in steps.iter() {
            match op {
                Op::Alloc => {
                    s.allocs += 1;
                    s.bytes_allocated = s.bytes_allocated.saturating_add(size);
                    s.max_alloc = s.max_alloc.max(size);
                    streams.insert(e.stream);
                    live += u128::from(size);
                    if live > peak {
                        peak = live;
                        s.peak_seq = Some(e.seq);
                    }
                }
                Op::Free => {
                    s.frees += 1;
                    live = live.saturating_sub(u128::from(size));
                }
            }
        }
    }
    s.baseline_frees = tracker.baseline_frees;
    s.peak_live_bytes = u64::try_from(peak).unwrap_or(u64::MAX);
    s.peak_live_in_window = s.peak_live_bytes.saturating_sub(baseline_bytes);
    s.final_live = u64::try_from(live).unwrap_or(u64::MAX);
    s.distinct_streams = streams.len() as u64;
    s.distinct_threads = threads.len() as u64;
    s.anomalies = tracker.anomalies;
    Ok(s)
}
