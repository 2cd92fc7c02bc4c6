//! Buffer-lifetime CSV: `id,lower,upper,size`, one buffer live over the half-open logical
//! interval `[lower, upper)` (MindSpore SOMAS dumps, as idealloc ships them).
//!
//! Every row becomes an allocation at `lower` and a free at `upper`, sorted by time, frees
//! before allocations at equal times (a buffer ending at `t` and one starting at `t` never
//! overlap), then by row. The CSV `id` is the event `id`; `time_ns` is the logical time
//! (steps, not nanoseconds); thread and stream are 0. Rows are read whole: sorting needs
//! them all.
//!
//! Rows with `upper <= lower` (an empty or reversed lifetime) or an `id` seen before are
//! counted as [`AnomalyKind::InvalidRecord`] and dropped; a zero size as
//! [`AnomalyKind::ZeroSize`].
//!
//! [`AnomalyKind::InvalidRecord`]: crate::trace::AnomalyKind::InvalidRecord
//! [`AnomalyKind::ZeroSize`]: crate::trace::AnomalyKind::ZeroSize

use std::collections::HashSet;

use super::{csv_column, csv_error, csv_reader, Attrs, Emitter};
use crate::error::Result;
use crate::trace::{
    excerpt, trace_error, AnomalyKind, Format, Input, Keying, Loc, Op, Options, TraceHeader,
    VecSource,
};

struct Row {
    time: u64,
    op: Op,
    row: usize,
    line: u64,
    id: u64,
    size: u64,
}

/// Reads a lifetime CSV whole and returns its events in replay order.
///
/// # Errors
/// A missing column, a field that is not a non-negative integer (with its line), or an
/// anomaly in strict mode.
pub(crate) fn read(input: Input, origin: &str, options: &Options) -> Result<VecSource> {
    let mut rdr = csv_reader(input);
    let csv_err = |e: csv::Error| csv_error(origin, &e);
    let names = rdr.headers().map_err(csv_err)?.clone();
    let find = |want: &str| -> Result<usize> {
        csv_column(&names, want).ok_or_else(|| {
                trace_error(format!(
                    "{origin}: line 1: lifetime CSV lacks the {want} column; expected header id,lower,upper,size"
                ))
            })
    };
    let (c_id, c_lower, c_upper, c_size) =
        (find("id")?, find("lower")?, find("upper")?, find("size")?);

    let mut emitter = Emitter::new(Keying::Ids, options.strict, origin, 0);
    let mut rows = Vec::new();
    let mut seen = HashSet::new();
    for (row, rec) in rdr.into_records().enumerate() {
        let rec = rec.map_err(csv_err)?;
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        let num = |i: usize, name: &str| -> Result<u64> {
            let t = rec.get(i).unwrap_or("");
            t.parse().map_err(|_| {
                trace_error(format!(
                    "{origin}: line {line}: {name} {} is not a non-negative integer",
                    excerpt(t)
                ))
            })
        };
        let (id, lower, upper, size) = (
            num(c_id, "id")?,
            num(c_lower, "lower")?,
            num(c_upper, "upper")?,
            num(c_size, "size")?,
        );
        let loc = Loc::Line(line);
        if upper <= lower {
            emitter.tracker.anomaly(
                AnomalyKind::InvalidRecord,
                loc,
                format!("buffer {id} has an empty lifetime [{lower}, {upper})"),
            )?;
            continue;
        }
        if !seen.insert(id) {
            emitter.tracker.anomaly(
                AnomalyKind::InvalidRecord,
                loc,
                format!("buffer id {id} appears twice"),
            )?;
            continue;
        }
        rows.push(Row {
            time: lower,
            op: Op::Alloc,
            row,
            line,
            id,
            size,
        });
        rows.push(Row {
            time: upper,
            op: Op::Free,
            row,
            line,
            id,
            size,
        });
    }
    // Frees before allocations at equal times: Op::Free sorts after Op::Alloc, so invert.
    rows.sort_by_key(|r| (r.time, r.op == Op::Alloc, r.row));
    let mut events = Vec::with_capacity(rows.len());
    for r in &rows {
        let attrs = Attrs {
            time_ns: r.time,
            thread: 0,
            stream: 0,
        };
        emitter.feed(Loc::Line(r.line), r.op, r.id, r.size, attrs, &mut events)?;
    }
    let mut header = TraceHeader::new(format!("{}:{origin}", Format::LifetimesCsv.name()));
    header.notes.push(
        "buffer lifetimes [lower, upper): time_ns is logical time (steps), not nanoseconds"
            .to_string(),
    );
    Ok(VecSource {
        header,
        anomalies: emitter.tracker.anomalies,
        events: events.into_iter(),
    })
}
