//! Buffer-lifetime CSV: `id,lower,upper,size`, one buffer live over the half-open logical
//! interval `[lower, upper)` (MindSpore SOMAS dumps, as idealloc ships them).
//!
//! Every row becomes an allocation at `lower` and a free at `upper`, sorted by time, frees
//! before allocations at equal times (a buffer ending at `t` and one starting at `t` never
//! overlap), then by row. The CSV `id` is the event `id`; `time_ns` is the logical time
//! (steps, not nanoseconds); thread and stream are 0. Rows are read whole: sorting needs
//! them all; the events are made as they are taken (memory: 40 bytes per row
//! and 16 per event, not the events).
//!
//! Rows with `upper <= lower` (an empty or reversed lifetime) or an `id` seen before are
//! counted as [`AnomalyKind::InvalidRecord`] and dropped; a zero size as
//! [`AnomalyKind::ZeroSize`]; a last row without a line end (the file may be cut short in
//! it) as [`AnomalyKind::NoLineEnd`], and kept. The CSV names no device:
//! [`Options::device`] (`--trace-device`) is refused rather than ignored.
//!
//! [`AnomalyKind::InvalidRecord`]: crate::trace::AnomalyKind::InvalidRecord
//! [`AnomalyKind::ZeroSize`]: crate::trace::AnomalyKind::ZeroSize
//! [`AnomalyKind::NoLineEnd`]: crate::trace::AnomalyKind::NoLineEnd

use crate::trace::{limit_error, malformed_error};
use std::collections::VecDeque;

use super::{csv_column, csv_error, csv_reader, Attrs, Emitter};
use crate::trace::Result;
use crate::trace::{
    Anomalies, AnomalyKind, Event, Format, Input, Keying, LineEnds, Loc, Op, Options, TraceHeader,
    TraceSource,
};

/// One row as read: 40 bytes, all a row costs while the events are streamed.
struct Buffer {
    id: u64,
    lower: u64,
    upper: u64,
    size: u64,
    line: u64,
}

impl Buffer {
    /// An empty or reversed lifetime: counted and dropped.
    fn is_empty(&self) -> bool {
        self.upper <= self.lower
    }
}

/// The most rows a lifetime CSV may hold: an event's place in the sort is a row index of 31
/// bits beside the operation (2³¹ rows is a file of at least 16 GiB).
const MAX_ROWS: usize = (1 << 31) - 1;

/// The sort key of one event: its time, then frees before allocations (the top bit of the
/// second field, set for an allocation), then the row. 16 bytes per event.
type Key = (u64, u32);

const ALLOC_BIT: u32 = 1 << 31;

/// A lifetime CSV's events, made in replay order as they are taken: the rows (40 bytes
/// each) and one sort key per event (16 bytes) are all it holds, not the events.
pub(crate) struct LifetimesSource {
    header: TraceHeader,
    rows: Vec<Buffer>,
    order: std::vec::IntoIter<Key>,
    emitter: Emitter,
    /// Events made by the emitter and not yet taken.
    pending: VecDeque<Event>,
    done: bool,
}

impl LifetimesSource {
    fn next_inner(&mut self) -> Result<Option<Event>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            let Some((time, tagged)) = self.order.next() else {
                return Ok(None);
            };
            let row = &self.rows[(tagged & !ALLOC_BIT) as usize];
            let op = if tagged & ALLOC_BIT != 0 {
                Op::Alloc
            } else {
                Op::Free
            };
            let attrs = Attrs {
                time_ns: time,
                thread: 0,
                stream: 0,
            };
            let (line, id, size) = (row.line, row.id, row.size);
            self.emitter
                .feed(Loc::Line(line), op, id, size, attrs, &mut self.pending)?;
        }
    }
}

streaming_trace_source!(LifetimesSource, anomalies: emitter.tracker.anomalies);

/// Reads a lifetime CSV's rows and returns a source of its events in replay order.
///
/// # Errors
/// A missing column, a field that is not an integer or out of range (with its line), more than
/// 2³¹ − 1 rows, or an anomaly in strict mode (an empty lifetime, a repeated id or a last row
/// without a line end here, a zero size as the events are taken).
pub(crate) fn read(input: Input, origin: &str, options: &Options) -> Result<LifetimesSource> {
    // The `csv` crate reads a last row cut short as a whole one: its bytes are watched.
    let line_ends = LineEnds::new();
    let mut rdr = csv_reader(line_ends.watch(input));
    let csv_err = |e: csv::Error| csv_error(origin, &e);
    let names = rdr.headers().map_err(csv_err)?.clone();
    let find = |want: &str| -> Result<usize> {
        csv_column(&names, want).ok_or_else(|| {
                malformed_error(format!(
                    "{origin}: line 1: lifetime CSV lacks the {want} column; expected header id,lower,upper,size"
                ))
            })
    };
    let (c_id, c_lower, c_upper, c_size) =
        (find("id")?, find("lower")?, find("upper")?, find("size")?);
    super::no_device_choice(
        origin,
        options,
        "a buffer-lifetime CSV: it holds one program's buffers",
    )?;

    let mut emitter = Emitter::new(Keying::Ids, options.strict, origin, 0);
    let mut rows: Vec<Buffer> = Vec::new();
    // One record, reused: a row costs only its `Buffer`.
    let mut rec = csv::StringRecord::new();
    while rdr.read_record(&mut rec).map_err(csv_err)? {
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        let num = |i: usize, name: &str| -> Result<u64> {
            let t = rec.get(i).unwrap_or("");
            crate::trace::u64_field(name, t)
                .map_err(|m| malformed_error(format!("{origin}: line {line}: {m}")))
        };
        let buffer = Buffer {
            id: num(c_id, "id")?,
            lower: num(c_lower, "lower")?,
            upper: num(c_upper, "upper")?,
            size: num(c_size, "size")?,
            line,
        };
        if rows.len() == MAX_ROWS {
            return Err(limit_error(format!(
                "{origin}: line {line}: refused: more than {MAX_ROWS} rows, the most a lifetime CSV may have"
            )));
        }
        rows.push(buffer);
    }
    if let Some(last) = rows.last().filter(|_| !line_ends.ended_line()) {
        emitter.tracker.no_line_end(last.line)?;
    }
    // A repeated id: every row after the first with that id (among rows with a lifetime).
    let mut repeated = vec![false; rows.len()];
    {
        let mut by_id: Vec<u32> = (0..rows.len() as u32)
            .filter(|&i| !rows[i as usize].is_empty())
            .collect();
        by_id.sort_unstable_by_key(|&i| (rows[i as usize].id, i));
        for pair in by_id.windows(2) {
            if rows[pair[0] as usize].id == rows[pair[1] as usize].id {
                repeated[pair[1] as usize] = true;
            }
        }
    }
    // Counted in row order, as they were read.
    let mut order: Vec<Key> = Vec::with_capacity(2 * rows.len());
    for (i, row) in rows.iter().enumerate() {
        let loc = Loc::Line(row.line);
        if row.is_empty() {
            emitter.tracker.anomaly(
                AnomalyKind::InvalidRecord,
                loc,
                format!(
                    "buffer {} has an empty lifetime [{}, {})",
                    row.id, row.lower, row.upper
                ),
            )?;
            continue;
        }
        if repeated[i] {
            emitter.tracker.anomaly(
                AnomalyKind::InvalidRecord,
                loc,
                format!("buffer id {} appears twice", row.id),
            )?;
            continue;
        }
        order.push((row.lower, i as u32 | ALLOC_BIT));
        order.push((row.upper, i as u32));
    }
    drop(repeated);
    // Frees before allocations at equal times, then by row: the keys are unique.
    order.sort_unstable();
    let mut header = TraceHeader::new(format!("{}:{origin}", Format::LifetimesCsv.name()));
    header.notes.push(
        "buffer lifetimes [lower, upper): time_ns is logical time (steps), not nanoseconds"
            .to_string(),
    );
    Ok(LifetimesSource {
        header,
        rows,
        order: order.into_iter(),
        emitter,
        pending: VecDeque::new(),
        done: false,
    })
}
