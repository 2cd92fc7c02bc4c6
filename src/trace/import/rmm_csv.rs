//! RMM's logging CSV, as `rmm::mr::logging_resource_adaptor` writes it. Streams.
//!
//! Header `Thread,Time,Action,Pointer,Size,Stream` (any column order, case-insensitive,
//! extra columns ignored). Mapping:
//!
//! | RMM | event |
//! |---|---|
//! | row order | `seq` (0, 1, … over the events emitted) |
//! | `Time`: `HH:MM:SS.ffffff` (time of day; a jump back of more than 12 h is a new day) or decimal seconds `1634567890.123456789` | `time_ns` |
//! | `Thread` (decimal) | `thread` (values above `u32::MAX` are numbered down from `u32::MAX`) |
//! | `Stream` (hex, `0x` optional) | `stream` |
//! | `Action` `allocate` / `free` (or `deallocate`) | `op` |
//! | `Pointer` (hex, `0x` optional) | keys the allocation: a new `id` (1, 2, …) at each allocate; a free takes the id live at that address |
//! | `Size` | `size` |
//!
//! `allocate failure` rows are counted as [`AnomalyKind::AllocFailure`] and are not events.
//! A last row without a line end (the file may be cut short in it) is counted as
//! [`AnomalyKind::NoLineEnd`] and kept. The CSV has no baseline, reference figures or tags,
//! and no device: the log is one memory resource's, of the device it was made on, which it
//! does not name; [`Options::device`] (`--trace-device`) is refused rather than ignored.
//!
//! [`AnomalyKind::AllocFailure`]: crate::trace::AnomalyKind::AllocFailure
//! [`AnomalyKind::NoLineEnd`]: crate::trace::AnomalyKind::NoLineEnd

use crate::trace::{malformed_error, not_a_trace_error};
use std::collections::VecDeque;

use super::{csv_column, csv_error, csv_reader, Attrs, Emitter};
use crate::trace::Result;
use crate::trace::{
    excerpt, Anomalies, AnomalyKind, Event, Format, Input, Keying, LineEnds, Loc, Op, Options,
    ThreadMap, TraceHeader, TraceSource,
};

#[derive(Debug, Clone, Copy)]
struct Cols {
    thread: usize,
    time: usize,
    action: usize,
    pointer: usize,
    size: usize,
    stream: usize,
}

const NS_PER_DAY: u64 = 86_400 * 1_000_000_000;

/// What a file is that holds RMM's debug log rather than its CSV event log, and what to
/// record instead.
pub(crate) const DEBUG_LOG_REFUSAL: &str =
    "RMM's debug log (lines like `[ 1234][12:00:00:123456][info  ] …`, \
     as RMM_DEBUG_LOG_FILE receives them), not its CSV event log: use \
     rmm.mr.LoggingResourceAdaptor(upstream, log_file_name=\"rmm_log.csv\") (C++: \
     rmm::mr::logging_resource_adaptor), whose CSV starts Thread,Time,Action,Pointer,Size,Stream";

/// Whether `first_line` (a file's first line, leading blanks removed) is a line of a log in
/// spdlog's bracketed pattern, as RMM's debug logger writes it: `[%6t][%H:%M:%S:%f][%-6l] %v`
/// (`[ 1234][12:00:00:123456][info  ] …`), or spdlog's default `[%Y-%m-%d %H:%M:%S.%e] [%l] %v`
/// (`[2024-01-01 12:00:00.000] [info] …`): `[`, optional spaces, a digit, and a second
/// bracketed field right after the first.
pub(crate) fn is_debug_log(first_line: &[u8]) -> bool {
    let Some(rest) = first_line.strip_prefix(b"[") else {
        return false;
    };
    if !rest
        .iter()
        .find(|&&b| b != b' ')
        .is_some_and(u8::is_ascii_digit)
    {
        return false;
    }
    let Some(close) = rest.iter().position(|&b| b == b']') else {
        return false;
    };
    let after = &rest[close + 1..];
    after.starts_with(b"[") || after.starts_with(b" [")
}

/// Streaming reader of an RMM log.
pub struct RmmCsvReader {
    records: csv::StringRecordsIntoIter<Input>,
    cols: Cols,
    origin: String,
    header: TraceHeader,
    emitter: Emitter,
    threads: ThreadMap,
    clock: Clock,
    pending: VecDeque<Event>,
    /// The last byte of the input, once read: a last row without a line end may be cut.
    line_ends: LineEnds,
    /// Line of the last row read.
    last_line: Option<u64>,
    done: bool,
}

impl std::fmt::Debug for RmmCsvReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RmmCsvReader")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl RmmCsvReader {
    /// Reads the header row of `input`.
    ///
    /// # Errors
    /// A required column is missing, or the header cannot be read; a device is asked for
    /// ([`Options::device`], [`Options::device_type`] or [`Options::cpu`]: the log names
    /// none).
    pub fn new(input: Input, origin: &str, options: &Options) -> Result<Self> {
        let line_ends = LineEnds::new();
        let mut rdr = csv_reader(line_ends.watch(input));
        let names = rdr.headers().map_err(|e| csv_error(origin, &e))?.clone();
        let joined = names.iter().collect::<Vec<_>>().join(",");
        if is_debug_log(joined.trim_start_matches('\u{feff}').as_bytes()) {
            return Err(not_a_trace_error(format!(
                "{origin}: line 1: not an RMM CSV: {DEBUG_LOG_REFUSAL}"
            )));
        }
        let find = |want: &str| -> Result<usize> {
            csv_column(&names, want).ok_or_else(|| {
                    malformed_error(format!(
                        "{origin}: line 1: RMM log lacks the {want} column; expected header Thread,Time,Action,Pointer,Size,Stream, got {}",
                        excerpt(&names.iter().collect::<Vec<_>>().join(","))
                    ))
                })
        };
        let cols = Cols {
            thread: find("Thread")?,
            time: find("Time")?,
            action: find("Action")?,
            pointer: find("Pointer")?,
            size: find("Size")?,
            stream: find("Stream")?,
        };
        super::no_device_choice(
            origin,
            options,
            "an RMM log: it holds one memory resource's events",
        )?;
        let mut header = TraceHeader::new(format!("{}:{origin}", Format::RmmCsv.name()));
        header.notes.push(
            "RMM log: allocations keyed by Pointer; `allocate failure` rows counted, not replayed"
                .to_string(),
        );
        Ok(RmmCsvReader {
            records: rdr.into_records(),
            cols,
            origin: origin.to_string(),
            header,
            emitter: Emitter::new(Keying::Addresses, options.strict, origin, 0),
            threads: ThreadMap::default(),
            clock: Clock::default(),
            pending: VecDeque::new(),
            line_ends,
            last_line: None,
            done: false,
        })
    }

    fn next_inner(&mut self) -> Result<Option<Event>> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Ok(Some(e));
            }
            let rec = match self.records.next() {
                None => {
                    if let Some(line) = self.last_line.filter(|_| !self.line_ends.ended_line()) {
                        self.emitter.tracker.no_line_end(line)?;
                    }
                    return Ok(None);
                }
                Some(r) => r.map_err(|e| csv_error(&self.origin, &e))?,
            };
            let line = rec.position().map(|p| p.line()).unwrap_or(0);
            self.last_line = Some(line);
            let loc = Loc::Line(line);
            let origin = &self.origin;
            let bad = |m: String| malformed_error(format!("{origin}: line {line}: {m}"));
            let field = |i: usize| rec.get(i).unwrap_or("");
            let action = field(self.cols.action).to_ascii_lowercase();
            let size = crate::trace::u64_field("Size", field(self.cols.size)).map_err(&bad)?;
            let op = match action.as_str() {
                "allocate" => Op::Alloc,
                "free" | "deallocate" => Op::Free,
                "allocate failure" => {
                    self.emitter.tracker.anomaly(
                        AnomalyKind::AllocFailure,
                        loc,
                        format!("allocation of {size} bytes failed"),
                    )?;
                    continue;
                }
                other => {
                    return Err(bad(format!(
                    "unknown Action {}; accepted: allocate, free (or deallocate), allocate failure",
                    excerpt(other)
                )))
                }
            };
            // `column` `text` is not `what`.
            let not = |column: &str, text: &str, what: &str| {
                bad(format!("{column} {} is not {what}", excerpt(text)))
            };
            let text = field(self.cols.pointer);
            let pointer = parse_hex(text).ok_or_else(|| not("Pointer", text, "a hex address"))?;
            let text = field(self.cols.stream);
            let stream = match text {
                "" => 0,
                _ => parse_hex(text).ok_or_else(|| not("Stream", text, "a hex handle"))?,
            };
            let text = field(self.cols.thread);
            let thread_raw =
                parse_thread(text).ok_or_else(|| not("Thread", text, "a thread id"))?;
            let time_ns = self.clock.parse(field(self.cols.time)).map_err(&bad)?;
            let attrs = Attrs {
                time_ns,
                thread: self.threads.map(thread_raw),
                stream,
            };
            self.emitter
                .feed(loc, op, pointer, size, attrs, &mut self.pending)?;
        }
    }
}

/// Turns `Time` fields into nanoseconds; times of day roll over to the next day.
#[derive(Debug, Default)]
struct Clock {
    day: u64,
    last_time_of_day: Option<u64>,
}

impl Clock {
    fn parse(&mut self, text: &str) -> std::result::Result<u64, String> {
        if text.contains(':') {
            let mut parts = text.splitn(3, ':');
            let mut part = || parts.next().unwrap_or("");
            let (h, m, s) = (part(), part(), part());
            let bad = |what: &str| format!("bad {what} in time {}", excerpt(text));
            let h: u64 = h.parse().map_err(|_| bad("hours"))?;
            let m: u64 = m.parse().map_err(|_| bad("minutes"))?;
            if h >= 24 || m >= 60 {
                return Err(format!("time {} is not HH:MM:SS.ffffff", excerpt(text)));
            }
            let secs = parse_seconds(s).ok_or_else(|| bad("seconds"))?;
            let tod = (h * 3600 + m * 60) * 1_000_000_000 + secs;
            if let Some(last) = self.last_time_of_day {
                if tod + NS_PER_DAY / 2 < last {
                    self.day += 1;
                }
            }
            self.last_time_of_day = Some(tod);
            Ok(self.day.saturating_mul(NS_PER_DAY).saturating_add(tod))
        } else {
            parse_seconds(text).ok_or_else(|| {
                format!(
                    "time {} is neither HH:MM:SS.ffffff nor decimal seconds",
                    excerpt(text)
                )
            })
        }
    }
}

/// `S`, `S.f…` (up to 9 fraction digits kept) → nanoseconds.
fn parse_seconds(text: &str) -> Option<u64> {
    let (whole, frac) = match text.split_once('.') {
        Some((w, f)) => (w, f),
        None => (text, ""),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = whole.parse().ok()?;
    let mut ns: u64 = 0;
    for (i, b) in frac.bytes().take(9).enumerate() {
        ns += u64::from(b - b'0') * 10u64.pow(8 - i as u32);
    }
    secs.checked_mul(1_000_000_000)?.checked_add(ns)
}

/// Hex with or without `0x`; `(nil)`, `nil`, `null` and `nullptr` are 0.
pub(crate) fn parse_hex(text: &str) -> Option<u64> {
    let t = text.trim();
    if matches!(
        t.to_ascii_lowercase().as_str(),
        "(nil)" | "nil" | "null" | "nullptr"
    ) {
        return Some(0);
    }
    let digits = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

fn parse_thread(text: &str) -> Option<u64> {
    if let Some(h) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok();
    }
    text.parse().ok()
}

streaming_trace_source!(RmmCsvReader, anomalies: emitter.tracker.anomalies);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_hex() {
        assert_eq!(parse_seconds("1.5"), Some(1_500_000_000));
        assert_eq!(parse_seconds("12"), Some(12_000_000_000));
        assert_eq!(parse_seconds("0.000000001"), Some(1));
        assert_eq!(parse_seconds("0.1234567891"), Some(123_456_789));
        assert_eq!(parse_seconds("x"), None);
        assert_eq!(parse_seconds("-1"), None);
        assert_eq!(parse_hex("0x7f8a40000000"), Some(0x7f8a_4000_0000));
        assert_eq!(parse_hex("7f8a40000000"), Some(0x7f8a_4000_0000));
        assert_eq!(parse_hex("(nil)"), Some(0));
        assert_eq!(parse_hex("0x"), None);
        assert_eq!(parse_hex("zz"), None);
    }
}
