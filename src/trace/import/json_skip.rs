//! A validating skipper for the trace events a Kineto import drops.
//!
//! Nearly all of a Kineto trace's events are not `[memory]` instants: parsing each of them
//! with `serde_json` (into typed fields, no value built) was most of the time a Kineto trace
//! took to read. [`scan_event`] walks the bytes of one event instead, checking what makes it
//! JSON — structure (brackets balanced, `:` and `,` where they belong), strings (closed, no
//! control characters, UTF-8), numbers (the JSON grammar), literals — and decides whether it
//! can be dropped without `serde_json`: an **object** whose `name` is not the string
//! `[memory]`, in which `serde_json` would find nothing wrong either.
//!
//! It only ever *drops* what `serde_json` would have read and dropped; whatever it cannot
//! decide as cheaply is handed to `serde_json` ([`Scan::Parse`]), which reads it as before
//! (and reports it, if it is not JSON, with the message and position it always gave). So
//! the events imported, and the errors, are those of the `serde_json` reader. Handed over:
//! anything that is not an object (serde reads a struct from an array too); a `[memory]`
//! event; a string with an escape (an escaped `name` might spell `[memory]`, and serde checks
//! surrogates in the strings it reads); a number with an exponent or more than
//! [`MAX_DIGITS`] digits (serde refuses one out of `f64`'s range in the fields it reads);
//! nesting deeper than [`MAX_DEPTH`] (serde's recursion limit is 128); a second `name`,
//! `ts`, `tid` or `args` at the top (serde refuses a duplicate field); anything malformed.
//!
//! # Time complexity
//! O(n) for an event of n bytes; no allocation.
#![deny(unsafe_code)]

/// Containers open at once that the skipper follows (the event itself is the first); deeper
/// is handed to `serde_json`, whose recursion limit (128) then decides.
pub(crate) const MAX_DEPTH: u32 = 64;

/// Digits a number may have (integer and fraction together) to be skipped.
pub(crate) const MAX_DIGITS: usize = 64;

/// What [`scan_event`] decided about the value at the start of its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// An object of this many bytes that `serde_json` would read as an event not named
    /// `[memory]`: drop it.
    Drop(usize),
    /// Read it with `serde_json`: see the module for when.
    Parse,
    /// The input ends inside the value: scan again with more of it.
    Incomplete,
}

/// The top-level keys `serde_json` reads into fields (`name`, `ts`, `tid`, `args`): a second
/// one is an error there.
const FIELDS: usize = 4;

/// The index of `key` among the [`FIELDS`], matched in line (`==` on slices calls `memcmp`).
#[inline]
fn field_of(key: &[u8]) -> Option<usize> {
    match key {
        [b'n', b'a', b'm', b'e'] => Some(0),
        [b't', b's'] => Some(1),
        [b't', b'i', b'd'] => Some(2),
        [b'a', b'r', b'g', b's'] => Some(3),
        _ => None,
    }
}

/// Why a scan stopped early: the caller's answer.
enum Stop {
    Parse,
    Incomplete,
}

impl From<Stop> for Scan {
    fn from(s: Stop) -> Scan {
        match s {
            Stop::Parse => Scan::Parse,
            Stop::Incomplete => Scan::Incomplete,
        }
    }
}

/// The position of the first byte at or after `i` that is not JSON whitespace.
#[inline]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(c) = b.get(i) {
        if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            break;
        }
        i += 1;
    }
    i
}

/// What a byte is inside a JSON string: 0 an ordinary (ASCII, printable) byte, else one of
/// the classes below.
const STRING_CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = match c as u8 {
            b'"' => QUOTE,
            b'\\' => ESCAPE,
            0..=0x1f => CONTROL,
            0x80..=0xff => NON_ASCII,
            _ => 0,
        };
        c += 1;
    }
    t
};
const QUOTE: u8 = 1;
const ESCAPE: u8 = 2;
const CONTROL: u8 = 3;
const NON_ASCII: u8 = 4;

/// A byte 0x01 in each lane of a word.
const LANES: u64 = u64::MAX / 255;

/// The high bit of each byte of `x` that is zero, and perhaps of bytes above one that is.
#[inline(always)]
fn zero_bytes(x: u64) -> u64 {
    x.wrapping_sub(LANES) & !x & (LANES << 7)
}

/// The high bit of each byte of `x` that is special in a string (a quote, a backslash, a
/// control character below 0x20, a byte that is not ASCII), and perhaps of bytes above one
/// that is: the lowest flagged byte is the first special one.
#[inline(always)]
fn special(x: u64) -> u64 {
    let quote = zero_bytes(x ^ (LANES * u64::from(b'"')));
    let backslash = zero_bytes(x ^ (LANES * u64::from(b'\\')));
    // Below 0x20: subtracting 0x20 borrows from bit 7 only there (in an ASCII byte).
    let control = x.wrapping_sub(LANES * 0x20) & !x & (LANES << 7);
    quote | backslash | control | (x & (LANES << 7))
}

/// The string at `b[i] == b'"'`: the position after its closing quote, and its body. One
/// pass over its bytes (real strings are short: a call to `memchr` cost more than it saved).
#[inline(always)]
fn string(b: &[u8], i: usize) -> Result<(usize, &[u8]), Stop> {
    let start = i + 1;
    let rest = b.get(start..).unwrap_or_default();
    // Eight bytes at a time, as one word: the lowest byte flagged by `special` is the first
    // special one (the tests for a zero byte may also flag a byte above a true one, never
    // below). A byte at a time only in the last few bytes held, or after a byte that is not
    // ASCII.
    let mut from = 0;
    while let Some(word) = rest.get(from..).and_then(<[u8]>::first_chunk::<8>) {
        let flags = special(u64::from_le_bytes(*word));
        if flags == 0 {
            from += 8;
            continue;
        }
        let at = from + flags.trailing_zeros() as usize / 8;
        match STRING_CLASS[usize::from(rest[at])] {
            // All ASCII before it: no UTF-8 to check.
            QUOTE => return Ok((start + at + 1, &rest[..at])),
            NON_ASCII => {
                from = at;
                break;
            }
            _ => return Err(Stop::Parse),
        }
    }
    let mut ascii = true;
    for (len, &c) in rest.iter().enumerate().skip(from) {
        match STRING_CLASS[usize::from(c)] {
            0 => {}
            QUOTE => {
                let body = &rest[..len];
                // Text that is not UTF-8 is not JSON.
                if !ascii && std::str::from_utf8(body).is_err() {
                    return Err(Stop::Parse);
                }
                return Ok((start + len + 1, body));
            }
            NON_ASCII => ascii = false,
            // An escape is left to serde_json; a control character is not allowed.
            _ => return Err(Stop::Parse),
        }
    }
    Err(Stop::Incomplete)
}

/// The digits at `b[i..]`: how many.
#[inline(always)]
fn digits(b: &[u8], i: usize) -> usize {
    b.get(i..)
        .unwrap_or_default()
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(b.len().saturating_sub(i))
}

/// The number at `b[i]` (a `-` or a digit): the position after it. The JSON grammar:
/// `-? (0 | [1-9][0-9]*) (. [0-9]+)?`; an exponent is handed over.
#[inline(always)]
fn number(b: &[u8], mut i: usize) -> Result<usize, Stop> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    let int = digits(b, i);
    match (int, b.get(i)) {
        (0, None) => return Err(Stop::Incomplete),
        (0, _) => return Err(Stop::Parse),
        // A leading zero stands alone.
        (n, Some(b'0')) if n > 1 => return Err(Stop::Parse),
        _ => {}
    }
    i += int;
    let mut total = int;
    if b.get(i) == Some(&b'.') {
        let frac = digits(b, i + 1);
        if frac == 0 {
            return Err(if i + 1 >= b.len() {
                Stop::Incomplete
            } else {
                Stop::Parse
            });
        }
        i += 1 + frac;
        total += frac;
    }
    match b.get(i) {
        // The number may go on past the end of what is held.
        None => Err(Stop::Incomplete),
        Some(b'e' | b'E') => Err(Stop::Parse),
        Some(_) if total > MAX_DIGITS => Err(Stop::Parse),
        Some(_) => Ok(i),
    }
}

/// The literal `word` at `b[i]`: the position after it.
#[inline]
fn literal(b: &[u8], i: usize, word: &[u8]) -> Result<usize, Stop> {
    let rest = b.get(i..).unwrap_or_default();
    if rest.len() < word.len() {
        return if word.starts_with(rest) {
            Err(Stop::Incomplete)
        } else {
            Err(Stop::Parse)
        };
    }
    if &rest[..word.len()] == word {
        Ok(i + word.len())
    } else {
        Err(Stop::Parse)
    }
}

/// Decides about the value at the start of `b` (whitespace before it already skipped); see
/// the module.
///
/// # Time complexity
/// O(n) in the bytes of the value (or of `b`, when it is incomplete).
pub(crate) fn scan_event(b: &[u8]) -> Scan {
    match scan(b) {
        Ok(scan) => scan,
        Err(stop) => stop.into(),
    }
}

fn scan(b: &[u8]) -> Result<Scan, Stop> {
    match b.first() {
        Some(b'{') => {}
        Some(_) => return Ok(Scan::Parse),
        None => return Ok(Scan::Incomplete),
    }
    // Bit d of `objects` is set when the container at depth d + 1 is an object.
    let mut objects: u64 = 1;
    let mut depth: u32 = 1;
    let mut seen = [false; FIELDS];
    let mut memory = false;
    let mut i = 1;
    // Where the walk is: expecting a key (or, `first`, the end of the object); a value (or,
    // `first`, the end of the array); or what follows a value.
    #[derive(Clone, Copy, PartialEq)]
    enum At {
        Key { first: bool },
        Value { first: bool },
        After,
    }
    let mut at = At::Key { first: true };
    // The top-level key whose value comes next, as an index of FIELDS.
    let mut field: Option<usize> = None;
    loop {
        i = skip_ws(b, i);
        let Some(&c) = b.get(i) else {
            return Ok(Scan::Incomplete);
        };
        let in_object = objects >> (depth - 1) & 1 == 1;
        match at {
            At::Key { first } => match c {
                b'"' => {
                    let (end, key) = string(b, i)?;
                    if depth == 1 {
                        field = field_of(key);
                        if let Some(k) = field {
                            if std::mem::replace(&mut seen[k], true) {
                                return Ok(Scan::Parse);
                            }
                        }
                    }
                    i = skip_ws(b, end);
                    match b.get(i) {
                        Some(b':') => i += 1,
                        Some(_) => return Ok(Scan::Parse),
                        None => return Ok(Scan::Incomplete),
                    }
                    at = At::Value { first: false };
                }
                b'}' if first => {
                    i += 1;
                    depth -= 1;
                    at = At::After;
                }
                _ => return Ok(Scan::Parse),
            },
            At::Value { first } => {
                // The value of a top-level key is the `name` when `field` says so.
                let is_name = depth == 1 && field == Some(0);
                field = None;
                match c {
                    b'"' => {
                        let (end, text) = string(b, i)?;
                        if is_name && text == b"[memory]" {
                            memory = true;
                        }
                        i = end;
                        at = At::After;
                    }
                    b'{' | b'[' => {
                        if depth >= MAX_DEPTH {
                            return Ok(Scan::Parse);
                        }
                        let object = c == b'{';
                        objects = (objects & !(1 << depth)) | (u64::from(object) << depth);
                        depth += 1;
                        i += 1;
                        at = if object {
                            At::Key { first: true }
                        } else {
                            At::Value { first: true }
                        };
                    }
                    b']' if first => {
                        i += 1;
                        depth -= 1;
                        at = At::After;
                    }
                    b'-' | b'0'..=b'9' => {
                        i = number(b, i)?;
                        at = At::After;
                    }
                    b't' => {
                        i = literal(b, i, b"true")?;
                        at = At::After;
                    }
                    b'f' => {
                        i = literal(b, i, b"false")?;
                        at = At::After;
                    }
                    b'n' => {
                        i = literal(b, i, b"null")?;
                        at = At::After;
                    }
                    _ => return Ok(Scan::Parse),
                }
            }
            At::After => match (c, in_object) {
                (b',', true) => {
                    i += 1;
                    at = At::Key { first: false };
                }
                (b',', false) => {
                    i += 1;
                    at = At::Value { first: false };
                }
                (b'}', true) | (b']', false) => {
                    i += 1;
                    depth -= 1;
                    at = At::After;
                }
                _ => return Ok(Scan::Parse),
            },
        }
        // The event has ended (at `i`; whitespace after it is not counted).
        if depth == 0 {
            return Ok(if memory { Scan::Parse } else { Scan::Drop(i) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_case::test_case;

    #[test_case(br#"{"name": "aten::empty", "ph": "X", "ts": 12.5, "args": {"a": [1, -2, 0.25, true, false, null, {}, []]}}"#, Scan::Drop(103) ; "an operator event")]
    #[test_case(br#"{}"#, Scan::Drop(2) ; "an empty object")]
    #[test_case(b"{ \"name\" :\n\"x\" }  ,", Scan::Drop(16) ; "whitespace inside counts, after does not")]
    #[test_case(br#"{"name": null}"#, Scan::Drop(14) ; "a name that is not a string")]
    #[test_case(br#"{"args": {"name": "[memory]"}}"#, Scan::Drop(30) ; "a nested name is not the event's")]
    #[test_case("{\"name\": \"caf\u{e9}\"}".as_bytes(), Scan::Drop(17) ; "UTF-8 text")]
    #[test_case(br#"{"name": "[memory]", "ts": 1}"#, Scan::Parse ; "a memory event")]
    #[test_case(br#"[1, 2]"#, Scan::Parse ; "an array")]
    #[test_case(br#""[memory]""#, Scan::Parse ; "a string")]
    #[test_case(br#"{"name": "[memory\u005d"}"#, Scan::Parse ; "an escape")]
    #[test_case(br#"{"a": "x\y"}"#, Scan::Parse ; "a bad escape")]
    #[test_case(b"{\"a\": \"x\ty\"}", Scan::Parse ; "a control character in a string")]
    #[test_case(b"{\"a\": \"\xff\"}", Scan::Parse ; "a string that is not UTF-8")]
    #[test_case(br#"{"ts": 1, "ts": 2}"#, Scan::Parse ; "a duplicate field")]
    #[test_case(br#"{"x": 1, "x": 2}"#, Scan::Drop(16) ; "a duplicate key serde ignores")]
    #[test_case(br#"{"a": 1e400}"#, Scan::Parse ; "an exponent")]
    #[test_case(br#"{"a": 012}"#, Scan::Parse ; "a leading zero")]
    #[test_case(br#"{"a": 1.}"#, Scan::Parse ; "a fraction without digits")]
    #[test_case(br#"{"a": -}"#, Scan::Parse ; "a sign alone")]
    #[test_case(br#"{"a": +1}"#, Scan::Parse ; "a plus sign")]
    #[test_case(br#"{"a": tru}"#, Scan::Parse ; "a bad literal")]
    #[test_case(br#"{"a" 1}"#, Scan::Parse ; "a missing colon")]
    #[test_case(br#"{"a": 1,}"#, Scan::Parse ; "a trailing comma")]
    #[test_case(br#"{"a": [1,]}"#, Scan::Parse ; "a trailing comma in an array")]
    #[test_case(br#"{"a": [1}"#, Scan::Parse ; "unbalanced brackets")]
    #[test_case(br#"{"a": {"b": 1]}"#, Scan::Parse ; "crossed brackets")]
    #[test_case(br#"{1: 2}"#, Scan::Parse ; "a key that is not a string")]
    #[test_case(br#"{"a": 1 "b": 2}"#, Scan::Parse ; "a missing comma")]
    #[test_case(br#"{"name": "aten::add", "ts": 1"#, Scan::Incomplete ; "cut after a number")]
    #[test_case(br#"{"name": "aten::ad"#, Scan::Incomplete ; "a truncated string")]
    #[test_case(br#"{"a": 12"#, Scan::Incomplete ; "a number that may go on")]
    #[test_case(br#"{"a": 1."#, Scan::Incomplete ; "a fraction that may go on")]
    #[test_case(br#"{"a": nu"#, Scan::Incomplete ; "a literal cut")]
    #[test_case(br#"{"a": [[{"#, Scan::Incomplete ; "open containers")]
    #[test_case(b"", Scan::Incomplete ; "nothing")]
    fn each_case_is_decided(bytes: &[u8], want: Scan) {
        assert_eq!(scan_event(bytes), want);
    }

    /// Nesting up to `MAX_DEPTH` containers (the event included) is skipped; one more is
    /// handed to serde_json, whose recursion limit then decides.
    #[test]
    fn nesting_past_the_depth_is_handed_over() {
        for (depth, want_drop) in [(MAX_DEPTH, true), (MAX_DEPTH + 1, false), (10_000, false)] {
            let inner = depth as usize - 1;
            let text = format!("{{\"a\": {}{}}}", "[".repeat(inner), "]".repeat(inner));
            let got = scan_event(text.as_bytes());
            assert_eq!(
                got == Scan::Drop(text.len()),
                want_drop,
                "depth {depth}: {got:?}"
            );
            if !want_drop {
                assert_eq!(got, Scan::Parse, "depth {depth}");
            }
        }
    }

    /// Every prefix of a complete event is incomplete: the scan never decides on bytes the
    /// window has not reached.
    #[test]
    fn every_prefix_of_an_event_is_incomplete() {
        let event = br#"{"ph": "X", "name": "aten::mm", "ts": 1669783687464181.5, "tid": 7, "args": {"Ev Idx": 0, "x": [true, null, -0.5]}}"#;
        for cut in 0..event.len() {
            assert_eq!(scan_event(&event[..cut]), Scan::Incomplete, "cut at {cut}");
        }
        assert_eq!(scan_event(event), Scan::Drop(event.len()));
    }

    /// The word-at-a-time test finds the first special byte of a string wherever it stands
    /// in the word and whatever precedes it, as a byte-at-a-time loop would.
    #[test]
    fn the_first_special_byte_is_found_in_every_lane() {
        let specials = [b'"', b'\\', 0x00, 0x1f, 0x80, 0xc3, 0xff];
        let ordinary = [b' ', b'a', b'~', 0x7f, b'!', b'#', b'[', b']'];
        for at in 0..8 {
            for &s in &specials {
                for &o in &ordinary {
                    // Specials (or ordinary bytes) above it must not hide it.
                    for &above in specials.iter().chain(&ordinary) {
                        let mut word = [o; 8];
                        word[at] = s;
                        for b in word.iter_mut().skip(at + 1) {
                            *b = above;
                        }
                        let flags = special(u64::from_le_bytes(word));
                        assert_eq!(
                            flags.trailing_zeros() as usize / 8,
                            at,
                            "{word:02x?}: flags {flags:#x}"
                        );
                    }
                }
            }
            let clean = special(u64::from_le_bytes([b'a'; 8]));
            assert_eq!(clean, 0);
        }
        for o in ordinary {
            assert_eq!(special(u64::from_le_bytes([o; 8])), 0, "{o:#x}");
        }
    }

    /// Digits up to `MAX_DIGITS` are skipped; more are handed over.
    #[test]
    fn long_numbers_are_handed_over() {
        for (digits, want) in [(MAX_DIGITS, true), (MAX_DIGITS + 1, false)] {
            let text = format!("{{\"a\": {}}}", "7".repeat(digits));
            assert_eq!(
                scan_event(text.as_bytes()) == Scan::Drop(text.len()),
                want,
                "{digits} digits"
            );
        }
    }
}
