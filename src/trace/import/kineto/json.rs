//! The JSON of a Kineto trace, walked one value at a time, each parsed by `serde_json` from
//! a slice of a bounded buffer.
//!
//! `serde_json` reads a stream (`from_reader`) a byte at a time and copies every string it
//! meets; from a slice it skips strings and whitespace in bulk. [`Cursor`] holds the bytes
//! read from the input and not yet used, parses the next value from them, and drops what it
//! used when it reads more. A value cut by the end of what is held is parsed again once more
//! is in, the buffer at least doubling each time, so a value is parsed O(1) times on average;
//! one longer than [`MAX_VALUE_BYTES`] is refused, so the buffer never holds much more than
//! that. The punctuation between the values (`[`, `,`, `:`, `}`…) is read with
//! [`Cursor::peek`] and [`Cursor::take`].
//!
//! Each trace event is taken as a `&RawValue` — validated, not built — and only one whose
//! text holds `"[memory]"` (or a `\` escape, which could spell it) is parsed into the typed
//! fields [`RawEvent`] reads: most events of a profile are not memory events, and are dropped
//! after the validating parse.
//!
//! Positions are reported as `serde_json` reports them: line from 1, column = bytes read on
//! that line.
#![deny(unsafe_code)]

use std::io::{self, ErrorKind};

use memchr::memmem;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::value::RawValue;
use serde_json::Value;

use super::{Collected, Mem, Raw, RawEvent, Refused, BOM, TOP};
use crate::trace::Input;

/// The most bytes one value may have: one trace event, or one member of the top-level
/// object other than `traceEvents` (real ones: hundreds of bytes, a few kilobytes).
pub(crate) const MAX_VALUE_BYTES: usize = 16 << 20;

/// The least more the buffer takes in when a value is cut by its end: real events are
/// hundreds of bytes, and the bytes past the value's end are parsed again with it.
const STEP_BYTES: usize = 64 << 10;

/// What stopped the walk: bad JSON (`eof`: the input ended inside it), a value past
/// [`MAX_VALUE_BYTES`], or the input failing (`io`).
#[derive(Debug)]
pub(crate) struct FrameError {
    /// The input ended before the document did.
    pub(crate) eof: bool,
    /// What was wrong, without the position.
    pub(crate) message: String,
    /// Line of the error, from 1.
    pub(crate) line: u64,
    /// Bytes read on that line.
    pub(crate) column: u64,
    /// The input's error, where reading it failed.
    pub(crate) io: Option<io::Error>,
    /// `serde_json` refused what was parsed for a reason of ours, not its grammar's (a
    /// `[memory]` event's number no field holds: [`past_f64`]).
    pub(crate) field: bool,
    /// The trace event (its position in `traceEvents`, from 1) the error is in, where it is
    /// one of its fields.
    pub(crate) event: Option<u64>,
}

/// Line and column of byte `at` of `window`, whose first byte is at (`line`, `column`).
fn position_in(window: &[u8], at: usize, line: u64, column: u64) -> (u64, u64) {
    let before = &window[..at.min(window.len())];
    match memchr::memrchr(b'\n', before) {
        Some(last) => (
            line + memchr::memchr_iter(b'\n', before).count() as u64,
            (before.len() - last - 1) as u64,
        ),
        None => (line, column + before.len() as u64),
    }
}

/// The byte of `slice` where `serde_json` placed its error `e` (line and column in
/// `slice`): the byte it stopped at, or the slice's length where it ran out of bytes.
fn error_offset(slice: &[u8], e: &serde_json::Error) -> usize {
    let line_start = match e.line() {
        0 | 1 => 0,
        n => memchr::memchr_iter(b'\n', slice)
            .nth(n - 2)
            .map_or(slice.len(), |i| i + 1),
    };
    line_start.saturating_add(e.column())
}

/// The values of a JSON stream, one at a time; see the module.
pub(crate) struct Cursor {
    input: Input,
    /// Bytes read from the input and not dropped yet. Invariant: at most about
    /// 2 × [`MAX_VALUE_BYTES`] (a value is refused once it has that many held).
    buf: Vec<u8>,
    /// Bytes of `buf` used. Invariant: `pos <= buf.len()`.
    pos: usize,
    /// The input has ended.
    done: bool,
    /// Line of `buf`'s first byte, from 1, and bytes of that line before it.
    line: u64,
    column: u64,
    /// Bytes of the stream before `buf`'s first byte.
    offset: u64,
}

impl Cursor {
    pub(crate) fn new(input: Input) -> Cursor {
        Cursor {
            input,
            buf: Vec::new(),
            pos: 0,
            done: false,
            line: 1,
            column: 0,
            offset: 0,
        }
    }

    /// An error at the current position.
    pub(crate) fn error(&self, eof: bool, message: impl Into<String>) -> FrameError {
        let (line, column) = position_in(&self.buf, self.pos, self.line, self.column);
        FrameError {
            eof,
            message: message.into(),
            line,
            column,
            io: None,
            field: false,
            event: None,
        }
    }

    /// `serde_json`'s error `e` for the value at the current position, placed in the stream.
    fn place(&self, e: &serde_json::Error) -> FrameError {
        let text = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let mut at = self.error(e.is_eof(), text.strip_suffix(&suffix).unwrap_or(&text));
        at.field = e.classify() == serde_json::error::Category::Data;
        let column = e.column() as u64;
        if e.line() <= 1 {
            at.column += column;
        } else {
            at.line += e.line() as u64 - 1;
            at.column = column;
        }
        at
    }

    /// Drops the bytes used and reads until at least `want` unused bytes are held, or the
    /// input ends.
    ///
    /// # Errors
    /// The input fails.
    fn read_more(&mut self, want: usize) -> Result<(), FrameError> {
        if self.pos > 0 {
            (self.line, self.column) = position_in(&self.buf, self.pos, self.line, self.column);
            self.offset += self.pos as u64;
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        while !self.done && self.buf.len() < want.max(1) {
            let bytes = match self.input.fill_buf() {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    let mut at = self.error(false, e.to_string());
                    at.io = Some(e);
                    return Err(at);
                }
            };
            if bytes.is_empty() {
                self.done = true;
            }
            let n = bytes.len();
            self.buf.extend_from_slice(bytes);
            self.input.consume(n);
        }
        Ok(())
    }

    /// The next byte after whitespace, not consumed; `None` at the end of the stream.
    ///
    /// # Errors
    /// The input fails.
    pub(crate) fn peek(&mut self) -> Result<Option<u8>, FrameError> {
        loop {
            let rest = &self.buf[self.pos..];
            match rest
                .iter()
                .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            {
                Some(i) => {
                    self.pos += i;
                    return Ok(Some(self.buf[self.pos]));
                }
                None if self.done => {
                    self.pos = self.buf.len();
                    return Ok(None);
                }
                None => {
                    self.pos = self.buf.len();
                    self.read_more(1)?;
                }
            }
        }
    }

    /// Consumes the byte [`Cursor::peek`] gave.
    pub(crate) fn take(&mut self) {
        debug_assert!(self.pos < self.buf.len(), "take without peek");
        self.pos = (self.pos + 1).min(self.buf.len());
    }

    /// Reads the next value (after whitespace) with `read`, which parses it from the start of
    /// the slice it is given and says how many bytes it used; a value that may go on past
    /// what is held (cut short, or a number ending where the bytes do) is read again once
    /// more is in.
    ///
    /// # Errors
    /// Not JSON or not what `read` reads (the error placed in the stream); the value is
    /// longer than [`MAX_VALUE_BYTES`]; the input fails.
    fn next_with<T>(
        &mut self,
        mut read: impl FnMut(&[u8]) -> (Option<serde_json::Result<T>>, usize),
    ) -> Result<T, FrameError> {
        self.peek()?;
        loop {
            let rest = &self.buf[self.pos..];
            let held = rest.len();
            let (result, used) = read(rest);
            // A value that ends where the bytes held do may go on (a number cut in two); an
            // error at their end may be a value cut there (`-`, `1.`, `tr`): read more,
            // parse again. Otherwise the result is final.
            let cut = match &result {
                Some(Ok(_)) => used == held,
                Some(Err(e)) => e.is_eof() || error_offset(rest, e) >= held,
                None => true,
            };
            let long = match &result {
                Some(Ok(_)) => used > MAX_VALUE_BYTES,
                _ => cut && held >= MAX_VALUE_BYTES,
            };
            if (!cut || self.done) && !long {
                return match result {
                    Some(Ok(value)) => {
                        self.pos += used.min(held);
                        Ok(value)
                    }
                    Some(Err(e)) => {
                        let mut at = self.place(&e);
                        // An error at the end of the input (`-`, `1.`) is the input cut short.
                        at.eof |= cut;
                        Err(at)
                    }
                    None => Err(self.error(true, "EOF while parsing a value")),
                };
            }
            if long {
                let at = self.offset + self.pos as u64;
                return Err(self.error(
                    false,
                    format!(
                        "refused: a JSON value longer than {} MiB (one trace event, or a \
                         top-level member other than traceEvents), the most one may have \
                         (docs/trace-format.md), starting at byte {at}",
                        MAX_VALUE_BYTES >> 20,
                    ),
                ));
            }
            let want = held
                .saturating_mul(2)
                .max(held + STEP_BYTES)
                .min(MAX_VALUE_BYTES + 1);
            self.read_more(want)?;
        }
    }

    /// Parses the next value (after whitespace) as a `T`.
    ///
    /// # Errors
    /// As [`Cursor::next_with`].
    pub(crate) fn parse<T: DeserializeOwned>(&mut self) -> Result<T, FrameError> {
        self.next_with(|rest| {
            let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<T>();
            let result = values.next();
            (result, values.byte_offset())
        })
    }

    /// Reads the next trace event (after whitespace): the fields of a `[memory]` one, `None`
    /// for any other (validated and dropped). `marker` finds `"[memory]"`.
    ///
    /// # Errors
    /// As [`Cursor::next_with`].
    fn event(&mut self, marker: &memmem::Finder<'_>) -> Result<Option<Raw>, FrameError> {
        self.next_with(|rest| {
            let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<&RawValue>();
            let result = values
                .next()
                .map(|raw| raw.and_then(|raw| memory_fields(raw.get(), marker)));
            (result, values.byte_offset())
        })
    }
}

/// The fields of the event whose JSON is `text` when it is a `[memory]` one. Only an event
/// whose text holds `"[memory]"`, or a `\` (an escape could spell its name), is parsed: any
/// other cannot be one.
///
/// # Errors
/// `text` is not an event `RawEvent` reads.
fn memory_fields(text: &str, marker: &memmem::Finder<'_>) -> serde_json::Result<Option<Raw>> {
    let bytes = text.as_bytes();
    if marker.find(bytes).is_none() && memchr::memchr(b'\\', bytes).is_none() {
        return Ok(None);
    }
    let event: RawEvent = match serde_json::from_str(text) {
        Ok(event) => event,
        Err(e) => return past_f64(text).unwrap_or(Err(e)),
    };
    Ok(event
        .name
        .as_ref()
        .is_some_and(|n| n.0)
        .then(|| Raw::from(event)))
}

/// The fields of a trace event read as numbers, by their object (`None`: the event's own,
/// else its `args`), in the order they are looked at.
const NUMBER_FIELDS: [(Option<&str>, &str); 9] = [
    (None, "ts"),
    (None, "tid"),
    (Some("args"), "Bytes"),
    (Some("args"), "Total Allocated"),
    (Some("args"), "Total Reserved"),
    (Some("args"), "Addr"),
    (Some("args"), "Device Type"),
    (Some("args"), "Device Id"),
    (Some("args"), "Ev Idx"),
];

/// Why `serde_json` refused to read the event `text` (JSON: the walk validated it) into a
/// [`RawEvent`], where that is a number no 64-bit float holds in a field read (`1e999`:
/// JSON's grammar allows it, `serde_json` reads it as "number out of range" with no field
/// named): `Some(Ok(None))` where the event is no `[memory]` one (dropped as any other is),
/// `Some(Err(..))` naming the field of a `[memory]` one ([`FrameError::field`] once placed).
/// `None` where that is not why. Only called once the fast read has failed.
fn past_f64(text: &str) -> Option<serde_json::Result<Option<Raw>>> {
    use serde::de::Error as _;
    type Object<'a> = std::collections::BTreeMap<String, &'a RawValue>;
    let event: Object<'_> = serde_json::from_str(text).ok()?;
    let args: Option<Object<'_>> = event
        .get("args")
        .and_then(|a| serde_json::from_str(a.get()).ok());
    let past = NUMBER_FIELDS.iter().find_map(|&(within, key)| {
        let raw = match within {
            None => event.get(key),
            Some(_) => args.as_ref()?.get(key),
        }?;
        let number = raw
            .get()
            .starts_with(|c: char| c == '-' || c.is_ascii_digit());
        (number && serde_json::from_str::<f64>(raw.get()).is_err()).then(|| (key, raw.get()))
    })?;
    let memory = event
        .get("name")
        .and_then(|n| serde_json::from_str::<String>(n.get()).ok())
        .is_some_and(|n| n == "[memory]");
    if !memory {
        return Some(Ok(None));
    }
    let (key, number) = past;
    // Shown as written, as the other numbers of messages are (digits, sign, `.`, `e`: no
    // character to escape); cut and quoted where long.
    let shown = if number.len() <= crate::trace::EXCERPT_CHARS {
        number.to_string()
    } else {
        crate::trace::excerpt(number)
    };
    // `ts` is a time in microseconds, fractional where the profiler records nanoseconds;
    // the other fields read are integers.
    let accepted = if key == "ts" {
        "a time in microseconds"
    } else {
        "an integer"
    };
    Some(Err(serde_json::Error::custom(format!(
        "{key} {shown} is a number out of range: past what a 64-bit float holds (about \
         ±1.8e308); a [memory] event's {key} is {accepted}"
    ))))
}

/// The error for a value that is not `what` (parsed as [`Refused`]).
fn refuse<const TOP_LEVEL: bool>(f: &mut Cursor, what: &str) -> FrameError {
    match f.parse::<Refused<TOP_LEVEL>>() {
        Err(e) => e,
        // `Refused` accepts nothing; kept total all the same.
        Ok(Refused) => f.error(false, format!("expected {what}")),
    }
}

/// Walks the document into `c`: a Chrome-trace object with `traceEvents`, or a bare array
/// of events; each event (and each other member of the object) is cut out and parsed from
/// its bytes.
///
/// # Errors
/// Not JSON, or not such a document; a value too long; the input fails.
pub(crate) fn walk(f: &mut Cursor, c: &mut Collected) -> Result<(), FrameError> {
    // A UTF-8 byte-order mark (what editors on Windows write first) is not JSON: skipped.
    if f.peek()? == Some(BOM[0]) {
        f.take();
        for &b in &BOM[1..] {
            if f.peek()? != Some(b) {
                return Err(f.error(
                    false,
                    "a byte 0xEF that does not begin a UTF-8 byte-order mark (EF BB BF)",
                ));
            }
            f.take();
        }
    }
    match f.peek()? {
        Some(b'[') => events(f, c)?,
        Some(b'{') => {
            f.take();
            if f.peek()? == Some(b'}') {
                f.take();
            } else {
                members(f, c)?;
            }
        }
        _ => return Err(refuse::<true>(f, TOP)),
    }
    match f.peek()? {
        None => Ok(()),
        Some(_) => Err(f.error(false, "trailing characters")),
    }
}

/// The members of the top-level object (after its `{`, up to and with its `}`):
/// `traceEvents` walked, `deviceProperties` read for the devices' names, the rest parsed and
/// dropped.
fn members(f: &mut Cursor, c: &mut Collected) -> Result<(), FrameError> {
    let eof = |f: &Cursor| f.error(true, "EOF while parsing an object");
    loop {
        match f.peek()? {
            Some(b'"') => {}
            Some(_) => return Err(f.error(false, "key must be a string")),
            None => return Err(eof(f)),
        }
        let key: String = f.parse()?;
        match f.peek()? {
            Some(b':') => f.take(),
            Some(_) => return Err(f.error(false, "expected `:`")),
            None => return Err(eof(f)),
        }
        match key.as_str() {
            "traceEvents" if f.peek()? == Some(b'[') => {
                // A key given twice counts with its last value, as in a JSON object.
                c.mem.clear();
                c.events_seen = 0;
                events(f, c)?;
            }
            "traceEvents" => return Err(refuse::<false>(f, "an array of trace events")),
            "deviceProperties" => {
                let v: Value = f.parse()?;
                for d in v.as_array().into_iter().flatten() {
                    if let (Some(id), Some(name)) = (
                        d.get("id").and_then(Value::as_i64),
                        d.get("name").and_then(Value::as_str),
                    ) {
                        c.device_names.insert(id, name.to_string());
                    }
                    if let (Some(id), Some(bytes)) = (
                        d.get("id").and_then(Value::as_i64),
                        d.get("totalGlobalMem")
                            .and_then(Value::as_u64)
                            .filter(|&b| b > 0),
                    ) {
                        c.device_memory.insert(id, bytes);
                    }
                }
            }
            _ => {
                f.parse::<IgnoredAny>()?;
            }
        }
        match f.peek()? {
            Some(b',') => f.take(),
            Some(b'}') => {
                f.take();
                return Ok(());
            }
            Some(_) => return Err(f.error(false, "expected `,` or `}`")),
            None => return Err(eof(f)),
        }
        if f.peek()? == Some(b'}') {
            return Err(f.error(false, "trailing comma"));
        }
    }
}

/// The array of trace events (at its `[`): each event read, the `[memory]` ones kept.
fn events(f: &mut Cursor, c: &mut Collected) -> Result<(), FrameError> {
    c.saw_trace_events = true;
    f.take();
    if f.peek()? == Some(b']') {
        f.take();
        return Ok(());
    }
    let marker = memmem::Finder::new(b"\"[memory]\"");
    loop {
        c.events_seen += 1;
        let read = f.event(&marker).map_err(|mut e| {
            // A field of this event (`past_f64`): the event is named with it.
            if e.field {
                e.event = Some(c.events_seen);
            }
            e
        })?;
        if let Some(raw) = read {
            if c.mem.len() >= c.max_mem {
                return Err(f.error(
                    false,
                    format!(
                        "refused: more than {} [memory] events, the most a trace of an untrusted \
                         file may have (docs/trace-format.md; --trusted-input raises it 16 times)",
                        c.max_mem
                    ),
                ));
            }
            c.mem.push(Mem::new(c.events_seen, raw));
        }
        match f.peek()? {
            Some(b',') => f.take(),
            Some(b']') => {
                f.take();
                return Ok(());
            }
            Some(_) => return Err(f.error(false, "expected `,` or `]`")),
            None => return Err(f.error(true, "EOF while parsing a list")),
        }
        if f.peek()? == Some(b']') {
            return Err(f.error(false, "trailing comma"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, Read};

    use super::*;

    /// A reader that gives at most `n` bytes per read: values cut at every position.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(self.1).min(out.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn cursor(text: &'static str, step: usize) -> Cursor {
        Cursor::new(Box::new(BufReader::with_capacity(
            step,
            Trickle(text.as_bytes(), step),
        )))
    }

    /// Values read from input cut into pieces of every size are the values `serde_json`
    /// reads from the whole text, a number cut in two included.
    #[test]
    fn values_cut_by_the_input_read_whole() {
        let text = "[12345, {\"a\": [1, 2.5e3, \"x\\\"y\"]}, 678]";
        for step in 1..text.len() + 1 {
            let mut f = cursor(text, step);
            assert_eq!(f.peek().unwrap(), Some(b'['));
            f.take();
            let mut got = Vec::new();
            loop {
                got.push(f.parse::<Value>().unwrap());
                match f.peek().unwrap() {
                    Some(b',') => f.take(),
                    Some(b']') => break,
                    other => panic!("{other:?} at step {step}"),
                }
            }
            let whole: Vec<Value> = serde_json::from_str(text).unwrap();
            assert_eq!(got, whole, "step {step}");
        }
    }

    /// An error is placed where `serde_json` places it in the whole text, however the
    /// input is cut.
    #[test]
    fn errors_are_placed_as_serde_json_places_them() {
        let text = "[1,\n   {\"a\" 1}]";
        let whole = serde_json::from_str::<Value>(text).unwrap_err();
        for step in 1..text.len() + 1 {
            let mut f = cursor(text, step);
            f.peek().unwrap();
            f.take();
            f.parse::<Value>().unwrap();
            assert_eq!(f.peek().unwrap(), Some(b','));
            f.take();
            let e = f.parse::<Value>().unwrap_err();
            assert_eq!(
                (e.line, e.column),
                (whole.line() as u64, whole.column() as u64),
                "step {step}: {e:?}"
            );
        }
    }

    /// Only `[memory]` events are parsed into fields, an escaped name among them; an
    /// event that names `[memory]` elsewhere is not one.
    #[test]
    fn memory_events_are_found_by_name_escaped_or_not() {
        let marker = memmem::Finder::new(b"\"[memory]\"");
        let fields = |t: &str| memory_fields(t, &marker).unwrap().map(|r| r.args.bytes);
        assert!(fields(r#"{"name": "[memory]", "args": {"Bytes": 5}}"#).is_some());
        assert!(fields(r#"{"name": "\u005bmemory]", "args": {"Bytes": 5}}"#).is_some());
        assert!(fields(r#"{"name": "x", "args": {"note": "[memory]"}}"#).is_none());
        assert!(fields(r#"{"name": "x\"y", "args": {"Bytes": 5}}"#).is_none());
        assert!(fields(r#"{"name": "aten::add", "ts": 1}"#).is_none());
    }

    /// The `[memory]` events kept are bounded: one past the bound refuses the file, naming
    /// the bound and how to raise it.
    #[test]
    fn memory_events_past_the_bound_are_refused() {
        let event = r#"{"name": "[memory]", "args": {"Bytes": 1}}"#;
        let text: &'static str = Box::leak(format!("[{event}, {event}, {event}]").into_boxed_str());
        let mut c = Collected::new(&crate::trace::Options::default());
        c.max_mem = 2;
        let e = walk(&mut cursor(text, 64), &mut c).unwrap_err();
        assert!(
            e.message
                .starts_with("refused: more than 2 [memory] events"),
            "{e:?}"
        );
        assert_eq!(c.mem.len(), 2);
        c.max_mem = 3;
        c.mem.clear();
        c.events_seen = 0;
        assert!(walk(&mut cursor(text, 64), &mut c).is_ok());
    }

    /// A value longer than the bound is refused by name, without reading the rest.
    #[test]
    fn a_value_past_the_bound_is_refused() {
        let long = format!("[\"{}\"]", "x".repeat(MAX_VALUE_BYTES + 10));
        let text: &'static str = Box::leak(long.into_boxed_str());
        let mut f = cursor(text, 1 << 16);
        f.peek().unwrap();
        f.take();
        let e = f.parse::<IgnoredAny>().unwrap_err();
        assert!(e.message.contains("longer than 16 MiB"), "{e:?}");
        assert!(
            f.buf.len() <= 2 * MAX_VALUE_BYTES + (1 << 16),
            "{}",
            f.buf.len()
        );
    }
}
