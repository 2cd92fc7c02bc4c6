//! Reads a JSON stream one value at a time, each parsed by `serde_json` from a slice.
//!
//! `serde_json` reads a stream (`from_reader`) a byte at a time and copies every string it
//! meets, which made it the larger part of reading a Kineto trace; from a slice it skips
//! strings and whitespace in bulk. [`Frames`] holds a window of the stream (read in chunks of
//! [`CHUNK_BYTES`]), parses the next value from it in place, and moves past the bytes the
//! parser used. A value cut by the window's end is parsed again once more of the stream is
//! in (the window at least doubles each time, so a value is parsed O(1) times on average);
//! one longer than [`MAX_VALUE_BYTES`] is refused, so the window never holds more than about
//! that. The punctuation between the values (`[`, `,`, `:`, `}`…) is read with
//! [`Frames::peek`] and [`Frames::take`].
//!
//! Positions are reported as `serde_json` reports them: line from 1, column = bytes read on
//! that line.

use std::io::BufRead;

use serde::Deserialize;

use super::json_skip::Scan;

/// The most bytes one value may have: one trace event, or one member of the top-level
/// object other than `traceEvents` (real ones: hundreds of bytes, a few kilobytes).
pub(crate) const MAX_VALUE_BYTES: usize = 16 << 20;

/// Bytes read from the stream at a time.
pub(crate) const CHUNK_BYTES: usize = 1 << 20;

/// What stopped the walk: bad JSON (`eof`: the input ended inside it), a value past
/// [`MAX_VALUE_BYTES`], or the input failing.
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
}

/// The values of a JSON stream, one at a time; see the module.
pub(crate) struct Frames<R> {
    input: R,
    /// The window: bytes read from the stream and not yet dropped.
    buf: Vec<u8>,
    /// Bytes of `buf` already used. Invariant: `pos <= buf.len()`.
    pos: usize,
    /// The stream has ended: `buf` holds all that is left.
    done: bool,
    /// Bytes read at a time (a parameter for the tests' small windows).
    chunk: usize,
    /// Line of `buf[0]`, from 1.
    base_line: u64,
    /// Bytes of that line before `buf[0]`.
    base_column: u64,
    /// Bytes of the stream before `buf[0]`.
    base_offset: u64,
}

impl<R: BufRead> Frames<R> {
    pub(crate) fn new(input: R) -> Self {
        Self::with_chunk(input, CHUNK_BYTES)
    }

    fn with_chunk(input: R, chunk: usize) -> Self {
        Frames {
            input,
            buf: Vec::new(),
            pos: 0,
            done: false,
            chunk: chunk.max(1),
            base_line: 1,
            base_column: 0,
            base_offset: 0,
        }
    }

    /// Line and bytes on that line before `buf[at]`.
    fn position_at(&self, at: usize) -> (u64, u64) {
        let before = &self.buf[..at];
        match memchr::memrchr(b'\n', before) {
            Some(last) => (
                self.base_line + memchr::memchr_iter(b'\n', before).count() as u64,
                (at - last - 1) as u64,
            ),
            None => (self.base_line, self.base_column + at as u64),
        }
    }

    /// An error at the current position.
    pub(crate) fn error(&self, eof: bool, message: impl Into<String>) -> FrameError {
        let (line, column) = self.position_at(self.pos);
        FrameError {
            eof,
            message: message.into(),
            line,
            column,
        }
    }

    /// Drops the used bytes, then reads until `want` bytes are held or the stream ends.
    ///
    /// # Errors
    /// The stream fails.
    fn refill(&mut self, want: usize) -> Result<(), FrameError> {
        if self.pos > 0 {
            let (line, column) = self.position_at(self.pos);
            self.base_line = line;
            self.base_column = column;
            self.base_offset += self.pos as u64;
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        while self.buf.len() < want && !self.done {
            let bytes = match self.input.fill_buf() {
                Ok(b) => b,
                Err(e) => return Err(self.error(false, e.to_string())),
            };
            if bytes.is_empty() {
                self.done = true;
                break;
            }
            let n = bytes.len().min(want - self.buf.len());
            self.buf.extend_from_slice(&bytes[..n]);
            self.input.consume(n);
        }
        Ok(())
    }

    /// The next byte after whitespace, not consumed; `None` at the end of the stream.
    ///
    /// # Errors
    /// The stream fails.
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
                None => {
                    self.pos = self.buf.len();
                    if self.done {
                        return Ok(None);
                    }
                    self.refill(self.chunk)?;
                }
            }
        }
    }

    /// Consumes the byte [`Frames::peek`] returned.
    pub(crate) fn take(&mut self) {
        debug_assert!(self.pos < self.buf.len(), "take without peek");
        self.pos = (self.pos + 1).min(self.buf.len());
    }

    /// Parses the next value (after whitespace) as a `T`.
    ///
    /// # Errors
    /// Not JSON or not a `T` (the error placed in the stream); the value is longer than
    /// [`MAX_VALUE_BYTES`]; the stream fails.
    pub(crate) fn parse<T: for<'de> Deserialize<'de>>(&mut self) -> Result<T, FrameError> {
        self.peek()?;
        loop {
            let rest = &self.buf[self.pos..];
            let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<T>();
            let result = values.next();
            let used = values.byte_offset();
            // A value that ends where the window does may go on in the stream (a number cut
            // in two), and one cut short by the window is an EOF error: read more, parse
            // again. Otherwise the result is final.
            let cut = match &result {
                Some(Ok(_)) => used == rest.len(),
                Some(Err(e)) => e.is_eof(),
                None => true,
            };
            if !cut || self.done {
                return match result {
                    Some(Ok(value)) => {
                        self.pos += used;
                        Ok(value)
                    }
                    Some(Err(e)) => Err(self.place(&e)),
                    None => Err(self.error(true, "EOF while parsing a value")),
                };
            }
            let held = rest.len();
            if held >= MAX_VALUE_BYTES {
                return Err(self.error(
                    false,
                    format!(
                        "refused: a JSON value longer than {} MiB (one trace event, or a \
                         top-level member other than traceEvents), the most one may have \
                         (docs/trace-format.md), starting at byte {}",
                        MAX_VALUE_BYTES >> 20,
                        self.base_offset + self.pos as u64
                    ),
                ));
            }
            let want = held
                .saturating_mul(2)
                .max(self.chunk)
                .min(MAX_VALUE_BYTES + 1);
            self.refill(want)?;
        }
    }

    /// Scans the next value (after whitespace) with `scan`, and consumes it when `scan`
    /// decided it ([`Scan::Drop`], [`Scan::Memory`]); [`Scan::Parse`], with nothing consumed,
    /// when it is to be parsed ([`Frames::parse`] then reads it, or reports what is wrong
    /// with it). A value cut by the window's end is scanned again once more of the stream is
    /// in, as [`Frames::parse`] parses it again; one that the stream ends inside, or longer
    /// than [`MAX_VALUE_BYTES`], is left to [`Frames::parse`] to report (never
    /// [`Scan::Incomplete`]).
    ///
    /// # Errors
    /// The stream fails.
    pub(crate) fn scan(&mut self, scan: impl Fn(&[u8]) -> Scan) -> Result<Scan, FrameError> {
        self.peek()?;
        loop {
            let rest = &self.buf[self.pos..];
            let decided = scan(rest);
            match decided {
                Scan::Drop(used) | Scan::Memory(used, _) => {
                    self.pos += used.min(rest.len());
                    return Ok(decided);
                }
                Scan::Parse => return Ok(Scan::Parse),
                Scan::Incomplete if self.done || rest.len() >= MAX_VALUE_BYTES => {
                    return Ok(Scan::Parse)
                }
                Scan::Incomplete => {
                    let want = rest
                        .len()
                        .saturating_mul(2)
                        .max(self.chunk)
                        .min(MAX_VALUE_BYTES + 1);
                    self.refill(want)?;
                }
            }
        }
    }

    /// `e`, an error of `serde_json` parsing from the current position, placed in the stream.
    fn place(&self, e: &serde_json::Error) -> FrameError {
        let text = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let message = text.strip_suffix(&suffix).unwrap_or(&text).to_string();
        let start = self.position_at(self.pos);
        let (line, column) = if e.line() <= 1 {
            (start.0, start.1 + e.column() as u64)
        } else {
            (start.0 + e.line() as u64 - 1, e.column() as u64)
        };
        FrameError {
            eof: e.is_eof(),
            message,
            line,
            column,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The values of `text` (after `[`, separated by commas) as `Frames` parses them, read
    /// `chunk` bytes at a time.
    fn values(text: &str, chunk: usize) -> Vec<Value> {
        let mut f = Frames::with_chunk(text.as_bytes(), chunk);
        let mut out = Vec::new();
        assert_eq!(f.peek().unwrap(), Some(b'['));
        f.take();
        loop {
            out.push(f.parse::<Value>().unwrap());
            match f.peek().unwrap() {
                Some(b',') => f.take(),
                _ => break,
            }
        }
        out
    }

    #[test]
    fn values_are_parsed_whole_at_any_window() {
        let text = "[ {\"a\": \"x]}\\\"y\", \"b\": [1, {\"c\": []}]}, 12.5e3 ,\"s,\\\\\", true, \
                    null,[[]],\n123456789,{}]";
        let want: Vec<Value> = serde_json::from_str::<Vec<Value>>(text).unwrap();
        for chunk in [1, 2, 3, 7, 64, 1 << 20] {
            assert_eq!(values(text, chunk), want, "chunks of {chunk}");
        }
    }

    #[test]
    fn errors_are_placed_as_serde_json_places_them() {
        let text = "[1,\n   {\"a\" 1}]";
        let whole = serde_json::from_str::<Value>(text).unwrap_err();
        for chunk in [1, 4, 64] {
            let mut f = Frames::with_chunk(text.as_bytes(), chunk);
            f.peek().unwrap();
            f.take();
            f.parse::<Value>().unwrap();
            f.peek().unwrap();
            f.take();
            let e = f.parse::<Value>().unwrap_err();
            assert_eq!(
                (e.line, e.column, e.message.as_str()),
                (whole.line() as u64, whole.column() as u64, "expected `:`"),
                "chunks of {chunk}"
            );
        }
    }

    #[test]
    fn a_value_cut_by_the_end_of_the_stream_is_an_eof_error() {
        let mut f = Frames::with_chunk(&b"[{\"a\": [1, 2"[..], 4);
        f.peek().unwrap();
        f.take();
        let e = f.parse::<Value>().unwrap_err();
        assert!(e.eof, "{e:?}");
    }

    #[test]
    fn a_value_past_the_limit_is_refused_before_it_is_held_whole() {
        let text = format!("[\"{}\"]", "x".repeat(MAX_VALUE_BYTES));
        let mut f = Frames::new(text.as_bytes());
        f.peek().unwrap();
        f.take();
        let e = f.parse::<Value>().unwrap_err();
        assert!(e.message.contains("longer than 16 MiB"), "{}", e.message);
        assert!(f.buf.len() <= MAX_VALUE_BYTES + 1, "{}", f.buf.len());
    }

    #[test]
    fn no_value_where_punctuation_stands_is_an_error() {
        let mut f = Frames::new(&b"[,1]"[..]);
        f.peek().unwrap();
        f.take();
        let e = f.parse::<Value>().unwrap_err();
        assert!(e.message.contains("expected value"), "{}", e.message);
    }
}
