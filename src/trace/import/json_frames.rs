//! Reads a JSON stream one value at a time, each parsed (or scanned) from a slice.
//!
//! `serde_json` reads a stream (`from_reader`) a byte at a time and copies every string it
//! meets, which made it the larger part of reading a Kineto trace; from a slice it skips
//! strings and whitespace in bulk. [`Frames`] parses (or scans) the next value in place in
//! the input's own buffer — the 256 KiB buffers the inflating thread hands over, or a
//! `BufReader`'s — and moves past the bytes used, without copying them. Only a value cut by
//! the end of an input buffer is copied: its start, and then the next buffer's bytes in steps
//! that at least double ([`CARRY_BYTES`] more the first), into a carry-over buffer where it is
//! parsed again (so a value is parsed O(1) times on average); the walk goes back to the
//! input's buffer as soon as the value has been read. One longer than [`MAX_VALUE_BYTES`] is
//! refused, so the carry-over never holds more than about that. The punctuation between the
//! values (`[`, `,`, `:`, `}`…) is read with [`Frames::peek`] and [`Frames::take`].
//!
//! Positions are reported as `serde_json` reports them: line from 1, column = bytes read on
//! that line.

use std::io::BufRead;
use std::sync::Arc;

use serde::Deserialize;

use super::json_ahead::{Ahead, Chain};
use super::json_skip::{skip_ws, Scan};

/// The most bytes one value may have: one trace event, or one member of the top-level
/// object other than `traceEvents` (real ones: hundreds of bytes, a few kilobytes).
pub(crate) const MAX_VALUE_BYTES: usize = 16 << 20;

/// The least a carry-over grows by: a value cut by the end of an input buffer is read again
/// once this many more bytes (or twice what is held) are in. Small, as the bytes copied past
/// the value's end are copied for nothing (real events are hundreds of bytes).
pub(crate) const CARRY_BYTES: usize = 1 << 10;

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

/// The values of a JSON stream, one at a time; see the module.
///
/// The *window* is the input's current buffer (as `fill_buf` gives it, nothing of it
/// consumed until it is wholly used), or, while a value cut by the end of an input buffer is
/// read, `carry`.
pub(crate) struct Frames<R> {
    input: R,
    /// The carry-over: a cut value's bytes, from its start, copied out of the input.
    /// Invariant: empty unless `in_carry`; at most about [`MAX_VALUE_BYTES`] + 1 bytes.
    carry: Vec<u8>,
    /// The window is `carry`.
    in_carry: bool,
    /// Bytes at the end of `carry` that are also the start of the input's current buffer,
    /// still unconsumed there (the walk goes back to that buffer at `pos - owned`, `owned`
    /// being the carry's other bytes). Invariant: `borrowed <= carry.len()`, 0 unless
    /// `in_carry`; less than the input buffer's length (a buffer copied whole is consumed).
    borrowed: usize,
    /// Bytes of the window used. Invariant: `pos <=` the window's length; in the carry,
    /// `pos <` its owned bytes (at that point the walk goes back to the input's buffer).
    pos: usize,
    /// The input has ended: it gave an empty buffer.
    done: bool,
    /// The least the carry-over grows by (a parameter for the tests' small steps).
    step: usize,
    /// Line of the window's first byte, from 1.
    base_line: u64,
    /// Bytes of that line before the window's first byte.
    base_column: u64,
    /// Bytes of the stream before the window's first byte.
    base_offset: u64,
    /// Elements scanned ahead on another thread ([`Frames::with_ahead`]).
    ahead: Option<Arc<Ahead>>,
    /// The next chain of elements scanned ahead, taken from `ahead`: used when the walk
    /// reaches its start, dropped when the walk passes it.
    chain: Option<Chain>,
}

impl<R: BufRead> Frames<R> {
    pub(crate) fn new(input: R) -> Self {
        Self::with_step(input, CARRY_BYTES)
    }

    fn with_step(input: R, step: usize) -> Self {
        Frames {
            input,
            carry: Vec::new(),
            in_carry: false,
            borrowed: 0,
            pos: 0,
            done: false,
            step: step.max(1),
            base_line: 1,
            base_column: 0,
            base_offset: 0,
            ahead: None,
            chain: None,
        }
    }

    /// Reads `input`, using the elements another thread scans ahead into `ahead` (see
    /// [`Frames::scan_elements`]).
    pub(crate) fn with_ahead(input: R, ahead: Arc<Ahead>) -> Self {
        let mut f = Self::new(input);
        f.ahead = Some(ahead);
        f
    }

    /// The window (whole, from its first byte); an input that fails gives an empty one here
    /// (the failure is met again, and reported, where more of the input is read: the
    /// callers slice it with `get`, so that an empty window where bytes were used reads as
    /// a value cut short).
    fn window(&mut self) -> &[u8] {
        if self.in_carry {
            &self.carry
        } else {
            self.input.fill_buf().unwrap_or_default()
        }
    }

    /// Line and bytes on that line before byte `at` of the window.
    fn position_at(&mut self, at: usize) -> (u64, u64) {
        let (line, column) = (self.base_line, self.base_column);
        position_in(self.window(), at, line, column)
    }

    /// Makes byte `at` of the window the first of a new window (the stream's position kept).
    fn rebase(&mut self, at: usize) {
        let (line, column) = self.position_at(at);
        self.base_line = line;
        self.base_column = column;
        self.base_offset += at as u64;
    }

    /// An error at the current position.
    pub(crate) fn error(&mut self, eof: bool, message: impl Into<String>) -> FrameError {
        let (line, column) = self.position_at(self.pos);
        FrameError {
            eof,
            message: message.into(),
            line,
            column,
        }
    }

    /// Back from the carry-over to the input's buffer once `pos` has passed the carry's
    /// owned bytes.
    fn leave_carry(&mut self) {
        let owned = self.carry.len() - self.borrowed;
        if self.in_carry && self.pos >= owned {
            self.rebase(owned);
            self.pos -= owned;
            self.carry.clear();
            self.in_carry = false;
            self.borrowed = 0;
        }
    }

    /// Uses `n` more bytes of the window.
    fn advance(&mut self, n: usize) {
        self.pos += n;
        self.leave_carry();
    }

    /// The window wholly used: on to the input's next buffer. `false` at the end of the input.
    ///
    /// # Errors
    /// The input fails.
    fn next_window(&mut self) -> Result<bool, FrameError> {
        if self.in_carry {
            // Wholly used, so past the owned bytes too.
            self.leave_carry();
            return Ok(true);
        }
        let len = self.window().len();
        if len > 0 {
            self.rebase(len);
            self.input.consume(len);
            self.pos = 0;
        }
        match self.input.fill_buf() {
            Ok([]) => {
                self.done = true;
                Ok(false)
            }
            Ok(_) => Ok(true),
            Err(e) => Err(self.error(false, e.to_string())),
        }
    }

    /// Makes the window hold at least `want` bytes from `pos` (fewer at the end of the input),
    /// in the carry-over: what is left of the window first, then the input's next bytes.
    ///
    /// # Errors
    /// The input fails.
    fn grow(&mut self, want: usize) -> Result<(), FrameError> {
        if !self.in_carry {
            let pos = self.pos;
            self.rebase(pos);
            let rest = self.window().get(pos..).unwrap_or_default().to_vec();
            let len = rest.len() + pos;
            self.carry = rest;
            self.input.consume(len);
            self.in_carry = true;
            self.borrowed = 0;
            self.pos = 0;
        } else if self.pos > 0 {
            let pos = self.pos;
            self.rebase(pos);
            self.carry.drain(..pos);
            self.pos = 0;
        }
        while self.carry.len() < want && !self.done {
            let bytes = match self.input.fill_buf() {
                Ok(b) => b,
                Err(e) => return Err(self.error(false, e.to_string())),
            };
            if bytes.is_empty() {
                self.done = true;
                break;
            }
            let avail = &bytes[self.borrowed..];
            let n = avail.len().min(want - self.carry.len());
            self.carry.extend_from_slice(&avail[..n]);
            self.borrowed += n;
            if self.borrowed == bytes.len() {
                // Copied whole: the carry owns it now.
                let len = bytes.len();
                self.input.consume(len);
                self.borrowed = 0;
            }
        }
        Ok(())
    }

    /// The next byte after whitespace, not consumed; `None` at the end of the stream.
    ///
    /// # Errors
    /// The stream fails.
    pub(crate) fn peek(&mut self) -> Result<Option<u8>, FrameError> {
        loop {
            let pos = self.pos;
            let window = self.window();
            let found = window[pos.min(window.len())..]
                .iter()
                .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
                .map(|i| (i, window[pos + i]));
            match found {
                Some((i, byte)) => {
                    self.advance(i);
                    return Ok(Some(byte));
                }
                None => {
                    if self.done && !self.in_carry {
                        return Ok(None);
                    }
                    let len = self.window().len();
                    self.pos = len;
                    if !self.next_window()? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Consumes the byte [`Frames::peek`] returned.
    pub(crate) fn take(&mut self) {
        let len = self.window().len();
        debug_assert!(self.pos < len, "take without peek");
        self.advance(usize::from(self.pos < len));
    }

    /// The most the window should hold to read a value cut with `held` bytes of it held.
    fn want(&self, held: usize) -> usize {
        held.saturating_mul(2)
            .max(held + self.step)
            .min(MAX_VALUE_BYTES + 1)
    }

    /// Parses the next value (after whitespace) as a `T`.
    ///
    /// # Errors
    /// Not JSON or not a `T` (the error placed in the stream); the value is longer than
    /// [`MAX_VALUE_BYTES`]; the stream fails.
    pub(crate) fn parse<T: for<'de> Deserialize<'de>>(&mut self) -> Result<T, FrameError> {
        self.peek()?;
        loop {
            let pos = self.pos;
            let rest = self.window().get(pos..).unwrap_or_default();
            let held = rest.len();
            let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<T>();
            let result = values.next();
            let used = values.byte_offset();
            // A value that ends where the window does may go on in the stream (a number cut
            // in two), and one cut short by the window is an EOF error: read more, parse
            // again. Otherwise the result is final.
            let cut = match &result {
                Some(Ok(_)) => used == held,
                Some(Err(e)) => e.is_eof(),
                None => true,
            };
            if !cut || (self.done && self.in_carry) {
                return match result {
                    Some(Ok(value)) => {
                        self.advance(used);
                        Ok(value)
                    }
                    Some(Err(e)) => Err(self.place(&e)),
                    None => Err(self.error(true, "EOF while parsing a value")),
                };
            }
            if held >= MAX_VALUE_BYTES {
                let at = self.base_offset + self.pos as u64;
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
            self.grow(self.want(held))?;
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
            let pos = self.pos;
            let rest = self.window().get(pos..).unwrap_or_default();
            let held = rest.len();
            let decided = scan(rest);
            match decided {
                Scan::Drop(used) | Scan::Memory(used, _) => {
                    self.advance(used.min(held));
                    return Ok(decided);
                }
                Scan::Parse => return Ok(Scan::Parse),
                Scan::Incomplete if (self.done && self.in_carry) || held >= MAX_VALUE_BYTES => {
                    return Ok(Scan::Parse)
                }
                Scan::Incomplete => self.grow(self.want(held))?,
            }
        }
    }

    /// Scans array elements at once, in the window: from an element's start (whitespace
    /// before it skipped), each element `scan` decides ([`Scan::Drop`], [`Scan::Memory`]) is
    /// given to `each` and consumed, and so is the `,` after it when another element follows
    /// it in the window. Stops at an element `scan` does not decide there (cut by the window's
    /// end, to be parsed, or none: `Ok(false)`, at its start), or after an element that is not
    /// followed so (`Ok(true)`, before what follows it): [`Frames::scan`], [`Frames::peek`]
    /// and [`Frames::parse`] then read what is there, as they would have without this. The
    /// same decisions as those calls, one event at a time, with one look at the input's
    /// buffer for all.
    ///
    /// Where the walk reaches the start of a chain of elements scanned ahead (with the same
    /// `scan`, [`element_step`] by [`element_step`]) in a buffer that ends where the window
    /// does, the chain's decisions are taken instead of scanning again: they were made from
    /// the same bytes, so they are the ones this walk would make.
    ///
    /// # Errors
    /// The stream fails.
    pub(crate) fn scan_elements(
        &mut self,
        scan: impl Fn(&[u8]) -> Scan,
        mut each: impl FnMut(Scan),
    ) -> Result<bool, FrameError> {
        self.peek()?;
        if self.in_carry {
            return Ok(false);
        }
        let start = self.pos;
        let base = self.base_offset;
        let mut chain = self.chain.take();
        if chain
            .as_ref()
            .map_or(true, |c| c.start < base + start as u64)
        {
            chain = self
                .ahead
                .as_ref()
                .and_then(|a| a.take(base + start as u64));
        }
        let window = self.window();
        let end = base + window.len() as u64;
        let mut at = start;
        let mut after = false;
        loop {
            let here = base + at as u64;
            if let Some(c) = chain.take_if(|c| c.start == here && c.end == end) {
                for (decided, _) in c.decisions() {
                    each(decided);
                }
                // A chain has a step at least.
                let Some(last) = c.steps.last() else { break };
                at += last.to;
                after = !last.followed;
                if after {
                    break;
                }
                continue;
            }
            match element_step(window, at, &scan) {
                Some((decided, to, followed)) => {
                    each(decided);
                    at = to;
                    after = !followed;
                    if after {
                        break;
                    }
                }
                None => break,
            }
        }
        // A chain not reached yet is kept for a later call.
        self.chain = chain.filter(|c| c.start > base + at as u64);
        self.advance(at - start);
        Ok(after)
    }

    /// `e`, an error of `serde_json` parsing from the current position, placed in the stream.
    fn place(&mut self, e: &serde_json::Error) -> FrameError {
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

/// The element at `window[at]` (its start: whitespace before it skipped), when `scan`
/// decides it there ([`Scan::Drop`], [`Scan::Memory`]): the decision, where the walk goes on,
/// and whether another element follows it in the window — then the walk goes on at that
/// element's start (past the `,` and whitespace), else just after this one. `None` where
/// `scan` does not decide it. A trailing comma (`,` then `]`) or a window that ends after
/// the `,` is left to the walk: not followed.
///
/// Depends on `window[at..]` alone: the same bytes to the window's end give the same step.
///
/// # Time complexity
/// That of `scan` on the element, and O(whitespace) after it.
pub(crate) fn element_step(
    window: &[u8],
    at: usize,
    scan: &impl Fn(&[u8]) -> Scan,
) -> Option<(Scan, usize, bool)> {
    let decided = scan(window.get(at..).unwrap_or_default());
    let (Scan::Drop(used) | Scan::Memory(used, _)) = decided else {
        return None;
    };
    let after = at + used;
    let comma = skip_ws(window, after);
    if window.get(comma) != Some(&b',') {
        return Some((decided, after, false));
    }
    let next = skip_ws(window, comma + 1);
    match window.get(next) {
        Some(b']') | None => Some((decided, after, false)),
        Some(_) => Some((decided, next, true)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::import::json_skip::scan_event;
    use proptest::prelude::*;
    use serde_json::Value;
    use std::io::BufReader;

    /// Input buffer sizes and carry-over steps the tests read with: every value cut at every
    /// place, carried in steps of a byte and more.
    const SIZES: [(usize, usize); 7] = [
        (1, 1),
        (2, 1),
        (3, 2),
        (7, 3),
        (64, 1),
        (64, CARRY_BYTES),
        (1 << 20, CARRY_BYTES),
    ];

    /// `text` in input buffers of `buffer` bytes, carried in steps of `step`.
    fn frames(text: &[u8], buffer: usize, step: usize) -> Frames<BufReader<&[u8]>> {
        Frames::with_step(BufReader::with_capacity(buffer, text), step)
    }

    /// The values of `text` (after `[`, separated by commas) as `Frames` parses them.
    fn values(text: &str, buffer: usize, step: usize) -> Vec<Value> {
        let mut f = frames(text.as_bytes(), buffer, step);
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
        assert_eq!(f.peek().unwrap(), Some(b']'));
        f.take();
        assert_eq!(f.peek().unwrap(), None);
        out
    }

    #[test]
    fn values_are_parsed_whole_at_any_window() {
        let text = "[ {\"a\": \"x]}\\\"y\", \"b\": [1, {\"c\": []}]}, 12.5e3 ,\"s,\\\\\", true, \
                    null,[[]],\n123456789,{}]";
        let want: Vec<Value> = serde_json::from_str::<Vec<Value>>(text).unwrap();
        for (buffer, step) in SIZES {
            assert_eq!(
                values(text, buffer, step),
                want,
                "buffers of {buffer}, steps of {step}"
            );
        }
    }

    /// What the walk of an array of events makes of it, event by event: each scanned (and
    /// dropped or read), or parsed by serde_json as a value; or the error, placed.
    /// With `batched`, as the Kineto import walks them: many at once
    /// ([`Frames::scan_elements`]), then one at a time where that stops.
    fn walk(
        text: &[u8],
        buffer: usize,
        step: usize,
        batched: bool,
    ) -> (Vec<String>, Option<String>) {
        walk_with(frames(text, buffer, step), batched)
    }

    /// [`walk`] over the stream `f` reads.
    fn walk_with<R: BufRead>(mut f: Frames<R>, batched: bool) -> (Vec<String>, Option<String>) {
        let mut out = Vec::new();
        let mut go = || -> Result<(), FrameError> {
            if f.peek()? != Some(b'[') {
                return Err(f.error(false, "not an array"));
            }
            f.take();
            loop {
                let after = batched
                    && f.scan_elements(scan_event, |decided| out.push(format!("{decided:?}")))?;
                if !after {
                    match f.scan(scan_event)? {
                        Scan::Parse | Scan::Incomplete => {
                            out.push(format!("parsed {}", f.parse::<Value>()?))
                        }
                        decided => out.push(format!("{decided:?}")),
                    }
                }
                match f.peek()? {
                    Some(b',') => f.take(),
                    Some(b']') => {
                        f.take();
                        return Ok(());
                    }
                    _ => return Err(f.error(false, "expected `,` or `]`")),
                }
                // As the Kineto import does.
                if f.peek()? == Some(b']') {
                    return Err(f.error(false, "trailing comma"));
                }
            }
        };
        let result = go();
        let error = result
            .err()
            .map(|e| format!("{}:{} {} {}", e.line, e.column, e.eof, e.message));
        (out, error)
    }

    /// `text` in buffers of `buffer` bytes, each scanned ahead (as the inflating thread does)
    /// before it is handed over: from the guess the reader makes (`None`), or from the byte
    /// the next of `guesses` (modulo the buffer's length: an element's start, or not), one
    /// guess per buffer.
    struct AheadInput<'a> {
        text: &'a [u8],
        pos: usize,
        filled: usize,
        buffer: usize,
        ahead: Arc<Ahead>,
        guesses: Vec<Option<usize>>,
        buffers: usize,
    }

    impl std::io::Read for AheadInput<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = self.fill_buf()?.len().min(out.len());
            out[..n].copy_from_slice(&self.text[self.pos..self.pos + n]);
            self.consume(n);
            Ok(n)
        }
    }

    impl BufRead for AheadInput<'_> {
        fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
            if self.pos == self.filled && self.filled < self.text.len() {
                self.filled = (self.pos + self.buffer).min(self.text.len());
                let buf = &self.text[self.pos..self.filled];
                let guess = self.guesses[self.buffers % self.guesses.len()];
                self.buffers += 1;
                match guess {
                    Some(at) => self.ahead.scan_from(buf, self.pos as u64, at % buf.len()),
                    None => self.ahead.scan(buf, self.pos as u64, 1),
                }
            }
            Ok(&self.text[self.pos..self.filled])
        }

        fn consume(&mut self, n: usize) {
            self.pos = (self.pos + n).min(self.filled);
        }
    }

    /// [`walk`], many at once, with elements scanned ahead in each buffer.
    fn walk_ahead(
        text: &[u8],
        buffer: usize,
        step: usize,
        guesses: &[Option<usize>],
    ) -> (Vec<String>, Option<String>) {
        let ahead = Arc::new(Ahead::default());
        let input = AheadInput {
            text,
            pos: 0,
            filled: 0,
            buffer,
            ahead: Arc::clone(&ahead),
            guesses: guesses.to_vec(),
            buffers: 0,
        };
        let mut f = Frames::with_step(input, step);
        f.ahead = Some(ahead);
        walk_with(f, true)
    }

    /// An event of the kinds a Kineto trace holds (operators, `[memory]` events), or hostile
    /// bytes: escapes (`\"`, `\\`) that a buffer's edge may cut, deep nesting, long strings,
    /// damage.
    fn event() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r#"{"ph": "X", "name": "aten::mm", "ts": 1669783687464181, "args": {"Ev Idx": 7}}"#.to_string()),
            Just("{\n    \"ph\": \"i\", \"name\": \"[memory]\",\n    \"ts\": 16, \"tid\": 3,\n    \"args\": {\n      \"Addr\": 139926520725504, \"Bytes\": -5242880, \"Device Type\": 1\n    }\n  }".to_string()),
            Just(r#"{"name": "a\"b\\", "x": "\\\\\"", "y": "\u00e9\\"}"#.to_string()),
            Just(r#"{"name": "[memory]", "ts": 1.5, "args": {"Bytes": 1e3}}"#.to_string()),
            Just(format!(r#"{{"name": "deep", "a": {}1{}}}"#, "[".repeat(70), "]".repeat(70))),
            Just(format!(r#"{{"name": "{}"}}"#, "k".repeat(300))),
            Just(r#"[1, 2]"#.to_string()),
            "[a-z\\[\\]{}\":, \\\\0-9.\n]{0,24}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// A walk over events gives the same decisions, values and error (message and
        /// position) at every buffer size and carry-over step, one at a time or many at once,
        /// as one at a time over one buffer holding the whole text.
        #[test]
        fn the_walk_is_the_same_at_any_buffer_size(
            events in prop::collection::vec(event(), 0..8),
            spaces in prop::collection::vec("[ \n]{0,3}", 8),
            truncate in prop::option::of(any::<prop::sample::Index>()),
            guesses in prop::collection::vec(prop::option::of(0usize..1 << 20), 1..5),
        ) {
            let mut text = String::from("[");
            for (i, e) in events.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                text.push_str(&spaces[i % spaces.len()]);
                text.push_str(e);
            }
            text.push_str("]\n");
            let mut bytes = text.into_bytes();
            if let Some(at) = truncate {
                bytes.truncate(at.index(bytes.len() + 1));
            }
            let whole = walk(&bytes, bytes.len().max(1), CARRY_BYTES, false);
            for (buffer, step) in SIZES {
                for batched in [false, true] {
                    prop_assert_eq!(
                        &walk(&bytes, buffer, step, batched),
                        &whole,
                        "buffers of {}, steps of {}, batched {}", buffer, step, batched
                    );
                }
                prop_assert_eq!(
                    &walk_ahead(&bytes, buffer, step, &guesses),
                    &whole,
                    "buffers of {}, steps of {}, scanned ahead from {:?}", buffer, step, guesses
                );
            }
        }
    }

    /// Where many at once stops and one at a time takes over: the same walk.
    #[test]
    fn the_walk_is_the_same_where_many_at_once_stops() {
        let e = r#"{"name": "a", "ts": 1}"#;
        let m = r#"{"name": "[memory]", "ts": 2, "args": {"Bytes": 3}}"#;
        let cases = [
            ("trailing comma", format!("[{e}, {e},\n ]")),
            ("missing comma", format!("[{e} {e}]")),
            (
                "a value to parse",
                format!("[{e}, {{\"name\": \"\\u0041\"}}, {m}, {e}]"),
            ),
            ("not an object", format!("[{e}, 7, {e}]")),
            ("truncated", format!("[{e}, {m}, {e}")),
            ("truncated after a comma", format!("[{e}, {m},")),
            ("a memory event last", format!("[{e},{m}]")),
            ("empty", "[]".to_string()),
        ];
        for (name, text) in cases {
            let whole = walk(text.as_bytes(), text.len(), CARRY_BYTES, false);
            for (buffer, step) in SIZES {
                let got = walk(text.as_bytes(), buffer, step, true);
                assert_eq!(got, whole, "{name}: buffers of {buffer}, steps of {step}");
            }
        }
    }

    /// Elements scanned ahead from every byte of every buffer (an element's start or not,
    /// in events to drop, `[memory]` events, values left to serde_json, damage, a cut), at
    /// every buffer size: the same walk as without.
    #[test]
    fn the_walk_is_the_same_whatever_was_scanned_ahead() {
        let e = r#"{"name": "a", "ts": 1}"#;
        let m = r#"{"name": "[memory]", "ts": 2, "args": {"Bytes": 3}}"#;
        let s = r#"{"name": "},{", "args": {"x": [{}, {"y": "}, {"}]}}"#;
        let texts = [
            format!("[{e},\n {m}, {s}, {e}, {m},{e}]"),
            format!("[{e}, {{\"name\": \"\\u0041\"}}, {m}, 7, {e},\n {e},]"),
            format!("[{e}, {m}, {e} {e}, {m}]"),
            format!("[{s}, {e}, {m}, {e}, {m}"),
        ];
        for text in &texts {
            let whole = walk(text.as_bytes(), text.len(), CARRY_BYTES, false);
            for (buffer, step) in SIZES {
                let buffer = buffer.min(text.len());
                for at in 0..buffer {
                    let got = walk_ahead(text.as_bytes(), buffer, step, &[Some(at)]);
                    assert_eq!(
                        got, whole,
                        "{text}: buffers of {buffer}, steps of {step}, ahead from {at}"
                    );
                }
                let got = walk_ahead(text.as_bytes(), buffer, step, &[None]);
                assert_eq!(got, whole, "{text}: buffers of {buffer}, guessed");
            }
        }
    }

    /// A full chain is taken, and the walk goes on after it by itself.
    #[test]
    fn the_walk_goes_on_after_a_full_chain() {
        use crate::trace::import::json_ahead::MAX_STEPS;
        let text = format!("[{}, 7, {{}}]", vec!["{}"; MAX_STEPS + 100].join(", "));
        let whole = walk(text.as_bytes(), text.len(), CARRY_BYTES, false);
        assert_eq!(whole.0.len(), MAX_STEPS + 102);
        for guess in [Some(1), None] {
            let got = walk_ahead(text.as_bytes(), text.len(), CARRY_BYTES, &[guess]);
            assert_eq!(got, whole, "{guess:?}");
        }
    }

    #[test]
    fn errors_are_placed_as_serde_json_places_them() {
        let text = "[1,\n   {\"a\" 1}]";
        let whole = serde_json::from_str::<Value>(text).unwrap_err();
        for (buffer, step) in SIZES {
            let mut f = frames(text.as_bytes(), buffer, step);
            f.peek().unwrap();
            f.take();
            f.parse::<Value>().unwrap();
            f.peek().unwrap();
            f.take();
            let e = f.parse::<Value>().unwrap_err();
            assert_eq!(
                (e.line, e.column, e.message.as_str()),
                (whole.line() as u64, whole.column() as u64, "expected `:`"),
                "buffers of {buffer}, steps of {step}"
            );
        }
    }

    #[test]
    fn a_value_cut_by_the_end_of_the_stream_is_an_eof_error() {
        for (buffer, step) in SIZES {
            let mut f = frames(b"[{\"a\": [1, 2", buffer, step);
            f.peek().unwrap();
            f.take();
            let e = f.parse::<Value>().unwrap_err();
            assert!(e.eof, "{e:?}");
        }
    }

    #[test]
    fn a_value_past_the_limit_is_refused_before_it_is_held_whole() {
        let text = format!("[\"{}\"]", "x".repeat(MAX_VALUE_BYTES));
        for buffer in [1 << 16, 1 << 20] {
            let mut f = frames(text.as_bytes(), buffer, CARRY_BYTES);
            f.peek().unwrap();
            f.take();
            assert_eq!(f.scan(scan_event).unwrap(), Scan::Parse);
            let e = f.parse::<Value>().unwrap_err();
            assert!(e.message.contains("longer than 16 MiB"), "{}", e.message);
            assert!(f.carry.len() <= MAX_VALUE_BYTES + 1, "{}", f.carry.len());
        }
    }

    /// An input that fails after any number of bytes, in buffers of any size, stops the walk
    /// with its error (once what came before has been walked), whatever is cut there.
    #[test]
    fn a_failing_input_is_an_error_wherever_it_fails() {
        struct Failing<'a>(&'a [u8]);
        impl std::io::Read for Failing<'_> {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                if self.0.is_empty() {
                    return Err(std::io::Error::other("the disk is gone"));
                }
                let n = out.len().min(self.0.len());
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let e = r#"{"name": "a", "ts": 1}"#;
        let m = r#"{"name": "[memory]", "ts": 2, "args": {"Bytes": 3}}"#;
        let text = format!("[{e}, {m},\n {{\"name\": \"\\u0041\"}}, {e}]");
        for cut in 0..text.len() {
            for buffer in [1, 5, 64] {
                let input = BufReader::with_capacity(buffer, Failing(&text.as_bytes()[..cut]));
                let mut f = Frames::with_step(input, 3);
                let mut go = || -> Result<(), FrameError> {
                    f.peek()?;
                    f.take();
                    loop {
                        if !f.scan_elements(scan_event, |_| {})? {
                            if let Scan::Parse = f.scan(scan_event)? {
                                f.parse::<Value>()?;
                            }
                        }
                        match f.peek()? {
                            Some(b',') => f.take(),
                            _ => return Ok(()),
                        }
                    }
                };
                let error = go().expect_err("the input failed");
                assert!(
                    error.message.contains("the disk is gone"),
                    "cut at {cut}, buffers of {buffer}: {error:?}"
                );
            }
        }
    }

    #[test]
    fn no_value_where_punctuation_stands_is_an_error() {
        let mut f = Frames::new(&b"[,1]"[..]);
        f.peek().unwrap();
        f.take();
        let e = f.parse::<Value>().unwrap_err();
        assert!(e.message.contains("expected value"), "{}", e.message);
    }

    /// A value cut by a buffer's edge is copied, and the walk is back in the input's own
    /// buffer once the value is read: the carry-over holds no more than the cut value and a
    /// step.
    #[test]
    fn the_carry_over_ends_with_the_cut_value() {
        let event = r#"{"name": "aten::mm", "ts": 1}"#;
        let text = format!("[{}]", vec![event; 64].join(","));
        let mut f = frames(text.as_bytes(), 100, 8);
        f.peek().unwrap();
        f.take();
        let mut carried = Vec::new();
        loop {
            assert!(matches!(f.scan(scan_event).unwrap(), Scan::Drop(n) if n == event.len()));
            carried.push(f.in_carry);
            assert!(f.carry.len() <= 2 * event.len() + 8, "{}", f.carry.len());
            if f.peek().unwrap() == Some(b']') {
                break;
            }
            f.take();
        }
        assert_eq!(carried.len(), 64);
        // Back in the input's buffer after each cut event; but the last buffer, shorter than
        // a step, may have been copied whole (and the walk ends in the carry-over).
        assert!(!carried[..63].contains(&true), "{carried:?}");
    }
}
