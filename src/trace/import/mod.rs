//! Importers: each turns one recorded format into a [`TraceHeader`](super::TraceHeader) and
//! a stream of [`Event`]s. They are reached through [`open`](super::open); each module also
//! documents how its source maps into the own format.

use super::{trace_error, Event, Input, Keying, Loc, Op, Tracker};
use crate::trace::Result;
use crate::trace::{TraceError, TraceErrorKind};

pub mod kineto;
pub mod lifetimes_csv;
pub mod rmm_csv;
pub mod snapshot;
pub mod xla_dump;

/// Attributes of a source record other than op, key and size.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Attrs {
    pub(crate) time_ns: u64,
    pub(crate) thread: u32,
    pub(crate) stream: u64,
}

/// A tracker plus the sequence counter: turns source records into numbered events.
#[derive(Debug)]
pub(crate) struct Emitter {
    pub(crate) tracker: Tracker,
    next_seq: u64,
}

impl Emitter {
    pub(crate) fn new(keying: Keying, strict: bool, origin: &str, baseline: u64) -> Self {
        Emitter {
            tracker: Tracker::new(keying, strict, origin, baseline),
            next_seq: 0,
        }
    }

    /// Feeds one record; pushes what passes onto `out`. `false` (nothing fed, nothing
    /// changed) only for a free that draws on a baseline the tracker defers
    /// ([`Tracker::defer_baseline`]); always `true` otherwise.
    ///
    /// # Errors
    /// An anomaly in strict mode.
    pub(crate) fn feed(
        &mut self,
        loc: Loc,
        op: Op,
        key: u64,
        size: u64,
        attrs: Attrs,
        out: &mut impl Extend<Event>,
    ) -> Result<bool> {
        let steps = match op {
            Op::Alloc => self.tracker.alloc(loc, key, size)?,
            Op::Free => match self.tracker.try_free(loc, key, size)? {
                Some(steps) => steps,
                None => return Ok(false),
            },
        };
        for (op, id, size) in steps.iter() {
            let seq = self.next_seq;
            self.next_seq += 1;
            out.extend(std::iter::once(Event {
                seq,
                time_ns: attrs.time_ns,
                thread: attrs.thread,
                stream: attrs.stream,
                op,
                id,
                size,
                tag: 0,
            }));
        }
        Ok(true)
    }
}

/// A CSV reader as the CSV importers read: a header row, fields trimmed, every row as wide
/// as the header.
///
/// Rows end at `\n` where the input has one in its first buffer (a `\r` before it is
/// whitespace, which trimming drops): the `csv` crate's own terminator ends a row at the
/// `\r` of a `\r\n` and counts the `\n` into the next row, so every line number it gives
/// of a CRLF file (Windows, Python's `csv.writer` by default) was one short
/// (BurntSushi/rust-csv#395). A file of lone `\r`s (no `\n` in its first buffer) keeps
/// the crate's terminator, which ends a row at either.
pub(crate) fn csv_reader(mut input: Input) -> csv::Reader<Input> {
    let has_newline = input.fill_buf().is_ok_and(|b| b.contains(&b'\n'));
    let mut builder = csv::ReaderBuilder::new();
    if has_newline {
        builder.terminator(csv::Terminator::Any(b'\n'));
    }
    builder
        .has_headers(true)
        .trim(csv::Trim::All)
        .flexible(false)
        .from_reader(input)
}

/// Refuses a device choice (`--trace-device`: [`Options::device`](super::Options::device),
/// `device_type`, `cpu`) for a format that names no device to choose among (`what` says
/// which, and why), rather than ignoring it: as a snapshot or profile refuses a device it
/// has no events of, instead of replaying another as though it were that one.
pub(crate) fn no_device_choice(origin: &str, options: &super::Options, what: &str) -> Result<()> {
    if options.device.is_some() || options.device_type.is_some() || options.cpu {
        return Err(super::selection_error(format!(
            "{origin}: --trace-device does not apply to {what} and names no device to choose \
             among; replay it without --trace-device (trace::Options device, device_type and \
             cpu unset)"
        )));
    }
    Ok(())
}

/// The error for a CSV that cannot be read, with its line where the reader knows it.
pub(crate) fn csv_error(origin: &str, e: &csv::Error) -> TraceError {
    let message = match e.position() {
        Some(p) => format!("{origin}: line {}: {e}", p.line()),
        None => format!("{origin}: {e}"),
    };
    match e.kind() {
        csv::ErrorKind::Io(io) => TraceError::from_io(io, message),
        _ => trace_error(TraceErrorKind::Malformed, message),
    }
}

/// The position of the column `want` among the header's `names`, matched without regard to
/// case or a leading byte-order mark.
pub(crate) fn csv_column(names: &csv::StringRecord, want: &str) -> Option<usize> {
    names
        .iter()
        .position(|n| n.trim_start_matches('\u{feff}').eq_ignore_ascii_case(want))
}

/// Microseconds (integer or fractional, as JSON or pickle numbers carry them) to
/// nanoseconds, saturating; negative and non-finite values give 0.
pub(crate) fn us_to_ns(us: f64) -> u64 {
    if us.is_finite() && us > 0.0 {
        let ns = (us * 1000.0).round();
        if ns >= u64::MAX as f64 {
            u64::MAX
        } else {
            ns as u64
        }
    } else {
        0
    }
}
