//! portalloc's own trace format, version 1: JSON lines.
//!
//! ```text
//! {"format":"portalloc-trace","version":1,"source":"rmm-csv:log.csv","device":null,"baseline_bytes":0,"reference":null,"tags":[],"notes":[]}
//! [0,1000,0,0,"a",1,4096]
//! [1,2000,0,0,"f",1,4096,2]
//! {"end":{"events":2}}
//! ```
//!
//! Line 1 is the [`TraceHeader`] as a JSON object. Each following line is one event,
//! `[seq, time_ns, thread, stream, "a"|"f", id, size]` with an optional eighth element, the
//! tag (omitted when 0). Numbers are plain non-negative decimal integers. The last line is
//! `{"end":{"events":N}}` with N the number of event lines: a file without it was cut short.
//! Blank lines are ignored. The full description is in `docs/trace-format.md`.
//!
//! [`Reader`] streams (one line in memory at a time, plus the live set) and numbers every
//! error with its line; [`Writer`] writes what [`Reader`] reads back unchanged.

use crate::trace::{limit_error, malformed_error, not_a_trace_error};
use std::io::{BufWriter, Write};

use serde::{Deserialize, Serialize};

use super::{
    excerpt, write_error, Anomalies, Event, Input, Keying, Loc, Op, TraceError, TraceErrorKind,
    TraceHeader, TraceSource, Tracker, FORMAT_NAME, FORMAT_VERSION,
};
use crate::trace::Result;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct End {
    end: EndBody,
}

#[derive(Debug, Serialize, Deserialize)]
struct EndBody {
    events: u64,
}

/// Streaming reader of the own format.
pub struct Reader {
    input: Input,
    origin: String,
    header: TraceHeader,
    tracker: Tracker,
    line_no: u64,
    buf: String,
    last_seq: Option<u64>,
    event_lines: u64,
    ended: bool,
    done: bool,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("origin", &self.origin)
            .field("line", &self.line_no)
            .finish_non_exhaustive()
    }
}

impl Reader {
    /// Reads the header line of `input`; `origin` names the file in messages. With `strict`,
    /// the first anomaly is an error.
    ///
    /// # Errors
    /// The first line is not a portalloc header, or of a version this build does not read.
    pub fn new(mut input: Input, origin: &str, strict: bool) -> Result<Self> {
        let mut buf = String::new();
        let n = input
            .read_line(&mut buf)
            .map_err(|e| cannot_read(origin, 1, e))?;
        if n == 0 {
            return Err(not_a_trace_error(format!(
                "{origin}: line 1: empty file, expected a portalloc-trace header"
            )));
        }
        // A byte-order mark is no part of the header (`open` skips it already).
        let text = buf.trim().trim_start_matches('\u{feff}');
        let header: TraceHeader =
            serde_json::from_str(text).map_err(|e| match number_at(text, e.column()) {
                Some((key, number)) => not_a_trace_error(format!(
                    "{origin}: line 1: {}",
                    crate::trace::u64_field(&format!("header field {}", excerpt(&key)), &number)
                        .err()
                        .unwrap_or_else(|| format!("not a portalloc-trace header: {e}"))
                )),
                // A header cut short is one (it began as one: the format was detected).
                None if e.is_eof() => malformed_error(format!(
                    "{origin}: line 1: a portalloc-trace header cut short: {e}"
                )),
                None => not_a_trace_error(format!(
                    "{origin}: line 1: not a portalloc-trace header: {e}"
                )),
            })?;
        if header.format != FORMAT_NAME {
            return Err(not_a_trace_error(format!(
                "{origin}: line 1: format is {:?}, expected {FORMAT_NAME:?}",
                header.format
            )));
        }
        if header.version != FORMAT_VERSION {
            return Err(not_a_trace_error(format!(
                "{origin}: line 1: portalloc-trace version {} is not supported; this build reads version {FORMAT_VERSION}",
                header.version
            )));
        }
        if header.tags.len() > usize::from(u16::MAX) {
            return Err(limit_error(format!(
                "{origin}: line 1: {} tags, at most {} are allowed",
                header.tags.len(),
                u16::MAX
            )));
        }
        // The blocks known from before the window are part of the baseline: more than it
        // is a header that contradicts itself.
        let known = header
            .pre_window_blocks
            .iter()
            .try_fold(0u64, |sum, &b| sum.checked_add(b));
        if known.map_or(true, |k| k > header.baseline_bytes) {
            return Err(malformed_error(format!(
                "{origin}: line 1: pre_window_blocks ({} sizes) sum to more than baseline_bytes \
                 ({} bytes): they are part of it",
                header.pre_window_blocks.len(),
                header.baseline_bytes
            )));
        }
        if header.step_starts.windows(2).any(|w| w[0] >= w[1]) {
            return Err(malformed_error(format!(
                "{origin}: line 1: step_starts ({} indices) are not strictly ascending: each is \
                 the index of a step's first event, in order",
                header.step_starts.len()
            )));
        }
        let tracker = Tracker::new(Keying::Ids, strict, origin, header.baseline_bytes);
        Ok(Reader {
            input,
            origin: origin.to_string(),
            header,
            tracker,
            line_no: 1,
            buf,
            last_seq: None,
            event_lines: 0,
            ended: false,
            done: false,
        })
    }

    fn err(&self, message: impl std::fmt::Display) -> TraceError {
        malformed_error(format!("{}: line {}: {message}", self.origin, self.line_no))
    }

    /// Skips whole blank lines in bulk, straight from the input's buffer, counting them into
    /// `line_no`: a gzip stream can inflate to gigabytes of them, and one `read_line` each
    /// costs far more than a scan. A blank run ends at its last newline; what follows it (a
    /// line's leading spaces, its text) is left to `read_line`.
    fn skip_blank_lines(&mut self) -> Result<()> {
        loop {
            let bytes = match self.input.fill_buf() {
                Ok(bytes) => bytes,
                Err(e) => return Err(cannot_read(&self.origin, self.line_no + 1, e)),
            };
            let blank = bytes
                .iter()
                .position(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n' | 0x0b | 0x0c))
                .unwrap_or(bytes.len());
            let Some(last) = memchr::memrchr(b'\n', &bytes[..blank]) else {
                return Ok(());
            };
            let lines = memchr::memchr_iter(b'\n', &bytes[..=last]).count() as u64;
            let whole = blank == bytes.len() && last + 1 == bytes.len();
            self.input.consume(last + 1);
            self.line_no += lines;
            if !whole {
                return Ok(());
            }
        }
    }

    fn next_inner(&mut self) -> Result<Option<Event>> {
        loop {
            self.skip_blank_lines()?;
            self.buf.clear();
            let n = self
                .input
                .read_line(&mut self.buf)
                .map_err(|e| self.err(format_args!("cannot read: {e}")))?;
            if n == 0 {
                if self.ended {
                    return Ok(None);
                }
                return Err(malformed_error(format!(
                    "{}: truncated: the file ends after line {} without the end line {{\"end\":{{\"events\":N}}}}",
                    self.origin, self.line_no
                )));
            }
            self.line_no += 1;
            let complete = self.buf.ends_with('\n');
            let text = self.buf.trim();
            if text.is_empty() {
                continue;
            }
            if self.ended {
                return Err(self.err("text after the end line"));
            }
            if text.starts_with('{') && complete && !names_end(text) && is_json_object(text) {
                return Err(self.err(format_args!(
                    "the line holds a JSON object that is not the end line: an event is an array \
                     [seq,time_ns,thread,stream,\"a\"|\"f\",id,size(,tag)] (no object holds an op), \
                     the end line {{\"end\":{{\"events\":N}}}}; got {}",
                    excerpt(text)
                )));
            }
            if text.starts_with('{') {
                let end: End = serde_json::from_str(text).map_err(|e| {
                    if complete {
                        self.err(format_args!("corrupt end line: {e}"))
                    } else {
                        self.err(format_args!(
                            "truncated: the file ends inside this line ({e})"
                        ))
                    }
                })?;
                if end.end.events != self.event_lines {
                    return Err(self.err(format_args!(
                        "the end line says {} events but {} were read (lines lost?)",
                        end.end.events, self.event_lines
                    )));
                }
                self.ended = true;
                continue;
            }
            if !complete {
                return Err(self.err("truncated: the file ends inside this line"));
            }
            let raw =
                parse_event(text).map_err(|m| self.err(format_args!("corrupt event: {m}")))?;
            self.event_lines += 1;
            if let Some(last) = self.last_seq.filter(|&last| raw.seq <= last) {
                return Err(self.err(format_args!(
                    "seq {} is not greater than the previous seq {last}",
                    raw.seq
                )));
            }
            self.last_seq = Some(raw.seq);
            if usize::from(raw.tag) > self.header.tags.len() {
                return Err(self.err(format_args!(
                    "tag {} but the header has {} tags",
                    raw.tag,
                    self.header.tags.len()
                )));
            }
            let loc = Loc::Line(self.line_no);
            let steps = match raw.op {
                Op::Alloc => self.tracker.alloc(loc, raw.id, raw.size)?,
                Op::Free => self.tracker.free(loc, raw.id, raw.size)?,
            };
            // Keyed by id, the tracker lets through at most the event itself.
            if let Some((op, id, size)) = steps.iter().next() {
                return Ok(Some(Event {
                    op,
                    id,
                    size,
                    ..raw
                }));
            }
        }
    }

    /// Frees of allocations made before the window (covered by the baseline) seen so far.
    pub fn baseline_frees(&self) -> u64 {
        self.tracker.baseline_frees
    }
}

streaming_trace_source!(Reader, anomalies: tracker.anomalies);

/// The error of line `line` of `origin` failing to be read with `e`.
fn cannot_read(origin: &str, line: u64, e: std::io::Error) -> TraceError {
    TraceError::from_io(&e, format!("{origin}: line {line}: cannot read: {e}"))
}

/// The error of a call of the writer that it refuses.
fn refused(call: &'static str, reason: String) -> TraceError {
    TraceError::new(TraceErrorKind::Unwritable, format!("{call}: {reason}"))
}

/// Whether `text` is one well-formed JSON object (read without building it).
fn is_json_object(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// Whether the object on `text` starts with the key `"end"`, as the end line does.
fn names_end(text: &str) -> bool {
    text.strip_prefix('{')
        .is_some_and(|t| t.trim_start().starts_with("\"end\""))
}

/// The key and the number of the header `text` where serde_json stopped at (1-based)
/// `column`, when it stopped at a number: a value no `u64` field takes (a fraction, a
/// negative, one past 2^64 − 1), which the message names with its field.
fn number_at(text: &str, column: usize) -> Option<(String, String)> {
    let bytes = text.as_bytes();
    let mut key = String::new();
    let mut last_string = (0, 0);
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                last_string = (start, i.min(bytes.len()));
                i += 1;
            }
            b':' => {
                key = text.get(last_string.0..last_string.1)?.to_string();
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += 1;
                while i < bytes.len()
                    && matches!(bytes[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    i += 1;
                }
                // serde_json reports the column of the number's last byte or the one after.
                if (start + 1..=i + 1).contains(&column) {
                    return Some((key, text.get(start..i)?.to_string()));
                }
            }
            _ => i += 1,
        }
    }
    None
}

fn parse_event(text: &str) -> std::result::Result<Event, String> {
    let inner = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(|| {
            format!(
                "expected [seq,time_ns,thread,stream,\"a\"|\"f\",id,size(,tag)], got {}",
                excerpt(text)
            )
        })?;
    let fields: Vec<&str> = inner.split(',').map(str::trim).collect();
    if fields.len() != 7 && fields.len() != 8 {
        return Err(format!(
            "expected 7 or 8 fields [seq,time_ns,thread,stream,\"a\"|\"f\",id,size(,tag)], got {}",
            fields.len()
        ));
    }
    fn num<T: std::str::FromStr>(f: &str, name: &str) -> std::result::Result<T, String> {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "{name} must be a non-negative integer, got {}",
                excerpt(f)
            ));
        }
        f.parse::<T>()
            .map_err(|_| format!("{name} {} is out of range", excerpt(f)))
    }
    let op = match fields[4] {
        "\"a\"" => Op::Alloc,
        "\"f\"" => Op::Free,
        other => return Err(format!("op must be \"a\" or \"f\", got {}", excerpt(other))),
    };
    Ok(Event {
        seq: num(fields[0], "seq")?,
        time_ns: num(fields[1], "time_ns")?,
        thread: num(fields[2], "thread")?,
        stream: num(fields[3], "stream")?,
        op,
        id: num(fields[5], "id")?,
        size: num(fields[6], "size")?,
        tag: match fields.get(7) {
            Some(t) => num(t, "tag")?,
            None => 0,
        },
    })
}

/// Writes the own format: the header at once, then one line per event, then the end line
/// at [`Writer::finish`].
pub struct Writer<W: Write> {
    out: BufWriter<W>,
    tags: usize,
    last_seq: Option<u64>,
    events: u64,
}

impl<W: Write> std::fmt::Debug for Writer<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl<W: Write> Writer<W> {
    /// Writes `header` (its `format` and `version` set to this build's) as line 1.
    ///
    /// # Errors
    /// More than 65,535 tags; the writer fails.
    pub fn new(out: W, header: &TraceHeader) -> Result<Self> {
        if header.tags.len() > usize::from(u16::MAX) {
            let reason = format!(
                "{} tags, at most {} are allowed",
                header.tags.len(),
                u16::MAX
            );
            return Err(refused("trace::jsonl::Writer::new", reason));
        }
        let mut h = header.clone();
        h.format = FORMAT_NAME.to_string();
        h.version = FORMAT_VERSION;
        let mut out = BufWriter::new(out);
        let line = serde_json::to_string(&h).map_err(|e| {
            refused(
                "trace::jsonl::Writer::new",
                format!("header cannot be written: {e}"),
            )
        })?;
        out.write_all(line.as_bytes()).map_err(write_error)?;
        out.write_all(b"\n").map_err(write_error)?;
        Ok(Writer {
            out,
            tags: h.tags.len(),
            last_seq: None,
            events: 0,
        })
    }

    /// Writes one event.
    ///
    /// # Errors
    /// A `seq` not greater than the previous one, a tag outside the header's table, or the
    /// writer fails.
    pub fn write(&mut self, e: &Event) -> Result<()> {
        let call = "trace::jsonl::Writer::write";
        if let Some(last) = self.last_seq.filter(|&last| e.seq <= last) {
            let reason = format!("seq {} is not greater than the previous seq {last}", e.seq);
            return Err(refused(call, reason));
        }
        if usize::from(e.tag) > self.tags {
            let reason = format!("tag {} but the header has {} tags", e.tag, self.tags);
            return Err(refused(call, reason));
        }
        self.last_seq = Some(e.seq);
        write!(
            self.out,
            "[{},{},{},{},\"{}\",{},{}",
            e.seq,
            e.time_ns,
            e.thread,
            e.stream,
            e.op.code(),
            e.id,
            e.size
        )
        .and_then(|()| match e.tag {
            // Untagged events leave the tag out.
            0 => writeln!(self.out, "]"),
            tag => writeln!(self.out, ",{tag}]"),
        })
        .map_err(write_error)?;
        self.events += 1;
        Ok(())
    }

    /// Events written so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Writes the end line, flushes, and hands back the writer.
    ///
    /// # Errors
    /// The writer fails.
    pub fn finish(mut self) -> Result<W> {
        let end = End {
            end: EndBody {
                events: self.events,
            },
        };
        let line = serde_json::to_string(&end)
            .map_err(|e| refused("trace::jsonl::Writer::finish", e.to_string()))?;
        self.out.write_all(line.as_bytes()).map_err(write_error)?;
        self.out.write_all(b"\n").map_err(write_error)?;
        self.out
            .into_inner()
            .map_err(|e| write_error(e.into_error()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_event_lines() {
        let e = parse_event("[3, 10,1,7,\"f\",9,64,2]").unwrap();
        assert_eq!(
            e,
            Event {
                seq: 3,
                time_ns: 10,
                thread: 1,
                stream: 7,
                op: Op::Free,
                id: 9,
                size: 64,
                tag: 2
            }
        );
        assert_eq!(parse_event("[0,0,0,0,\"a\",1,8]").unwrap().tag, 0);
        for bad in [
            "[0,0,0,0,\"x\",1,8]",
            "[0,0,0,0,\"a\",1]",
            "[0,0,-1,0,\"a\",1,8]",
            "[0,0,5000000000,0,\"a\",1,8]",
            "0,0,0,0,\"a\",1,8",
            "[0,0,0,0,\"a\",1,8,70000]",
        ] {
            assert!(parse_event(bad).is_err(), "{bad}");
        }
    }
}
