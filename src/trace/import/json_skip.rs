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
//! A `[memory]` event the same scan reads too ([`Scan::Memory`]): the few numbers the import
//! keeps (`ts`, `tid`, seven keys of `args`) are taken where the scan passes them, when each
//! is an integer that `serde_json` would give the same way — parsing these events with
//! `serde_json` was, after the skipping, the larger part of what was left.
//!
//! It only ever *drops* (or reads) what `serde_json` would have read and dropped (or read
//! alike); whatever it cannot decide as cheaply is handed to `serde_json` ([`Scan::Parse`]),
//! which reads it as before (and reports it, if it is not JSON, with the message and
//! position it always gave). So the events imported, and the errors, are those of the
//! `serde_json` reader. Handed over: anything that is not an object (serde reads a struct
//! from an array too); a `[memory]` event with a kept number that is a float, `-0` or longer
//! than 18 digits; a string with an escape (an escaped `name` might spell `[memory]`, and serde checks
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
    /// A `[memory]` event of this many bytes, with the numbers the import reads from it:
    /// all of them integers that `serde_json` would give as such (see [`Memory`]).
    Memory(usize, Memory),
    /// Read it with `serde_json`: see the module for when.
    Parse,
    /// The input ends inside the value: scan again with more of it.
    Incomplete,
}

/// A number as `serde_json` gives it to a visitor (`visit_u64` for a non-negative integer,
/// `visit_i64` for a negative one), or `None` where the value is absent or not a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Int {
    #[default]
    None,
    U(u64),
    I(i64),
}

/// The keys of a `[memory]` event's `args` that are read, in the order of [`Memory::args`].
pub(crate) const ARG_KEYS: [&[u8]; 7] = [
    b"Addr",
    b"Bytes",
    b"Total Allocated",
    b"Total Reserved",
    b"Device Type",
    b"Device Id",
    b"Ev Idx",
];

/// What the import reads from a `[memory]` event: `ts`, `tid`, and the values of
/// [`ARG_KEYS`] in `args` (when `args` is an object; the last value where a key repeats).
/// Returned only when each of them that is a number is an integer `serde_json` reads as
/// such: at most 18 digits, no fraction, not `-0` (a float there); the others are handed
/// over ([`Scan::Parse`]), so these are exactly the values `serde_json` would give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Memory {
    pub(crate) ts: Int,
    pub(crate) tid: Int,
    pub(crate) args: [Int; ARG_KEYS.len()],
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

/// The index of `key` among the [`ARG_KEYS`]. Every event's `args` keys come here (DDP's
/// `External id`, `Ev Idx`, …): the keys differ in length, or in their first byte, so one
/// candidate at most is compared whole.
#[inline(always)]
fn arg_of(key: &[u8]) -> Option<usize> {
    let candidate = match (key.len(), key.first()) {
        (4, Some(b'A')) => 0,
        (5, Some(b'B')) => 1,
        (15, Some(b'T')) => 2,
        (14, Some(b'T')) => 3,
        (11, Some(b'D')) => 4,
        (9, Some(b'D')) => 5,
        (6, Some(b'E')) => 6,
        _ => return None,
    };
    (key == ARG_KEYS[candidate]).then_some(candidate)
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
///
/// Pretty-printed traces indent with runs of spaces: after a whitespace byte, spaces are
/// passed eight at a time (a word equal to eight spaces), and the first byte that is not a
/// space is found from the word's lowest nonzero byte after `^` with spaces.
#[inline(always)]
pub(crate) fn skip_ws(b: &[u8], mut i: usize) -> usize {
    loop {
        match b.get(i) {
            Some(b' ' | b'\t' | b'\n' | b'\r') => i += 1,
            _ => return i,
        }
        while let Some(word) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
            let x = u64::from_le_bytes(*word) ^ (LANES * u64::from(b' '));
            if x != 0 {
                // The lowest set bit lies in the first byte that differs from a space.
                i += x.trailing_zeros() as usize / 8;
                break;
            }
            i += 8;
        }
    }
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
/// that is: the lowest flagged byte is the first special one. Second, the same for quotes
/// alone: its lowest flag is the lowest of the first when the first special byte is a quote
/// (a byte is flagged falsely only above a true one, which a borrow comes from), and above
/// it otherwise.
#[inline(always)]
fn special(x: u64) -> (u64, u64) {
    let quote = zero_bytes(x ^ (LANES * u64::from(b'"')));
    let backslash = zero_bytes(x ^ (LANES * u64::from(b'\\')));
    // Below 0x20: subtracting 0x20 borrows from bit 7 only there (in an ASCII byte).
    let control = x.wrapping_sub(LANES * 0x20) & !x & (LANES << 7);
    (quote | backslash | control | (x & (LANES << 7)), quote)
}

/// Bytes of a string read a word at a time before [`long_string`] is tried: most strings
/// (keys, operator names) end before; call stacks and kernel names go on for hundreds.
const LONG_STRING: usize = 32;

/// The end of a long string whose first `from` bytes are plain (printable ASCII): the
/// position of its closing quote in `rest`, found by `memchr2` (which compares many bytes
/// at once), when every byte before it is plain too — checked a word at a time without a
/// branch per word (a flag for a byte below 0x20 may also flag the byte above it, never
/// miss one: any flag sends the string back to the exact word loop). `None` when the string
/// has an escape, a byte that is not plain, or no end in `rest`: the word loop decides.
///
/// # Time complexity
/// O(n) in the string's bytes.
#[inline(never)]
fn long_string(rest: &[u8], from: usize) -> Option<usize> {
    let tail = rest.get(from..)?;
    let k = memchr::memchr2(b'"', b'\\', tail)?;
    if tail[k] != b'"' {
        return None;
    }
    let body = &tail[..k];
    let words = body.chunks_exact(8);
    let last = words.remainder();
    let mut flags = 0u64;
    for word in words {
        let x = u64::from_le_bytes(word.try_into().unwrap_or_default());
        // Below 0x20 (and perhaps the byte above it), or not ASCII.
        flags |= (x.wrapping_sub(LANES * 0x20) | x) & (LANES << 7);
    }
    let plain = flags == 0 && last.iter().all(|c| (0x20..0x80).contains(c));
    plain.then_some(from + k)
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
        let (flags, quotes) = special(u64::from_le_bytes(*word));
        if flags == 0 {
            from += 8;
            if from == LONG_STRING {
                if let Some(end) = long_string(rest, from) {
                    return Ok((start + end + 1, &rest[..end]));
                }
            }
            continue;
        }
        let at = from + flags.trailing_zeros() as usize / 8;
        // The first special byte is a quote: decided from the words, without reading the
        // byte back (a load that the next token waited for).
        if flags & flags.wrapping_neg() & quotes != 0 {
            // All ASCII before it: no UTF-8 to check.
            return Ok((start + at + 1, &rest[..at]));
        }
        match STRING_CLASS[usize::from(rest[at])] {
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

/// The high bit of each byte of `x` that is not an ASCII digit, exactly (no lane borrows
/// from another: each sum stays below 0x100 in its lane).
#[inline(always)]
fn non_digits(x: u64) -> u64 {
    let high = LANES << 7;
    let low = x & !high;
    // Bit 7 of `low + 0x50` is set when the byte is at least `0`, of `low + 0x46` when it is
    // above `9`.
    let at_least_0 = low.wrapping_add(LANES * 0x50) & high;
    let above_9 = low.wrapping_add(LANES * 0x46) & high;
    let digit = at_least_0 & !above_9 & !(x & high);
    !digit & high
}

/// The digits at `b[i..]`: how many. Eight at a time while a word of them is held (a
/// timestamp has 16).
#[inline(always)]
fn digits(b: &[u8], i: usize) -> usize {
    let mut n = 0;
    while let Some(word) = b.get(i + n..).and_then(<[u8]>::first_chunk::<8>) {
        let flags = non_digits(u64::from_le_bytes(*word));
        if flags != 0 {
            return n + flags.trailing_zeros() as usize / 8;
        }
        n += 8;
    }
    let rest = b.get(i + n..).unwrap_or_default();
    n + rest
        .iter()
        .position(|c| !c.is_ascii_digit())
        .unwrap_or(rest.len())
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
    scan(b)
}

/// The value of `$result`, or, when it stopped early, the decision that says why, returned.
/// (Returning a `Scan` itself, not a `Result` of one: the conversion copied the whole
/// `Scan`, with its `[memory]` fields, on every event.)
macro_rules! decided {
    ($result:expr) => {
        match $result {
            Ok(value) => value,
            Err(stop) => return Scan::from(stop),
        }
    };
}

/// What the value being scanned is to the event.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Nothing read.
    Other,
    /// The event's `name`.
    Name,
    /// The event's `args`: an object of it holds the [`ARG_KEYS`].
    Args,
    /// The value of this slot of [`Slots`].
    Slot(usize),
}

/// Where each number read ([`Memory`]'s `ts`, `tid` and args, in that order) starts in the
/// event, [`NOT_A_NUMBER`] where it is absent or not a number (the last one where a key
/// repeats, as serde_json keeps it).
type Slots = [usize; 2 + ARG_KEYS.len()];

/// A slot whose value is absent, or is not a number.
const NOT_A_NUMBER: usize = usize::MAX;

/// The role of a key at `depth` (`in_args`: inside the `args` object); a duplicate field at
/// the top is handed over (`seen` records them).
#[inline(always)]
fn role_of(key: &[u8], depth: u32, in_args: bool, seen: &mut [bool; FIELDS]) -> Result<Role, Stop> {
    if depth == 1 {
        let Some(k) = field_of(key) else {
            return Ok(Role::Other);
        };
        if std::mem::replace(&mut seen[k], true) {
            return Err(Stop::Parse);
        }
        Ok(match k {
            0 => Role::Name,
            1 => Role::Slot(0),
            2 => Role::Slot(1),
            _ => Role::Args,
        })
    } else if depth == 2 && in_args {
        Ok(arg_of(key).map_or(Role::Other, |a| Role::Slot(2 + a)))
    } else {
        Ok(Role::Other)
    }
}

/// The integer at `b[at]` (a number the scan has checked), as serde_json gives it to a
/// visitor; a number it would give as a float (a fraction, `-0`, or too many digits to be
/// sure of the integer's range) is handed over.
fn integer(b: &[u8], at: usize) -> Result<Int, Stop> {
    let negative = b.get(at) == Some(&b'-');
    let start = at + usize::from(negative);
    let n = digits(b, start);
    if n > 18 || b.get(start + n) == Some(&b'.') {
        return Err(Stop::Parse);
    }
    let value = decimal(&b[start..start + n]);
    match (negative, value) {
        (false, v) => Ok(Int::U(v)),
        // serde_json reads `-0` as the float -0.0.
        (true, 0) => Err(Stop::Parse),
        // 18 digits fit in an i64.
        (true, v) => Ok(Int::I(-(v as i64))),
    }
}

/// The value of at most 18 ASCII digits: the first few one at a time, then eight at a time
/// ([`eight_digits`]), so that a timestamp's 16 digits are two steps of a dependent chain
/// rather than sixteen.
fn decimal(digits: &[u8]) -> u64 {
    let head = digits.len() % 8;
    let mut value = digits[..head]
        .iter()
        .fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
    for chunk in digits[head..].chunks_exact(8) {
        let word: [u8; 8] = chunk.try_into().unwrap_or([b'0'; 8]);
        value = value * 100_000_000 + eight_digits(word);
    }
    value
}

/// The value of eight ASCII digits (the first the most significant), in three steps of
/// multiplications on the word: pairs of digits, then fours, then the eight.
#[inline(always)]
fn eight_digits(word: [u8; 8]) -> u64 {
    // Each byte a digit, the first in the lowest byte.
    let v = u64::from_le_bytes(word) - LANES * u64::from(b'0');
    // Byte 2k: 10 × digit 2k + digit 2k + 1 (the odd bytes hold leftovers, masked below).
    let v = v.wrapping_mul(10).wrapping_add(v >> 8);
    // The four pairs into two fours (bits 0..32 and 32..64), then those into the eight.
    let pairs = 0x0000_00ff_0000_00ff;
    let v = (v & pairs)
        .wrapping_mul(100 + (1_000_000 << 32))
        .wrapping_add(((v >> 16) & pairs).wrapping_mul(1 + (10_000 << 32)));
    v >> 32
}

#[inline(always)]
fn scan(b: &[u8]) -> Scan {
    match b.first() {
        Some(b'{') => {}
        Some(_) => return Scan::Parse,
        None => return Scan::Incomplete,
    }
    // Bit d of `objects` is set when the container at depth d + 1 is an object.
    // Invariant: 1 <= depth <= MAX_DEPTH while the event is open.
    let mut objects: u64 = 1;
    let mut depth: u32 = 1;
    let mut seen = [false; FIELDS];
    let mut memory = false;
    // Inside the object that is the event's `args` (at depth 2).
    let mut in_args = false;
    let mut slots: Slots = [NOT_A_NUMBER; 2 + ARG_KEYS.len()];
    let mut i = skip_ws(b, 1);
    match b.get(i) {
        Some(b'}') => return Scan::Drop(i + 1),
        None => return Scan::Incomplete,
        Some(_) => {}
    }
    // The walk: a key at `i` (whitespace skipped), then its value; a value, then what
    // follows it (`,` to the next key or element, or the end of containers).
    'key: loop {
        match b.get(i) {
            Some(b'"') => {}
            Some(_) => return Scan::Parse,
            None => return Scan::Incomplete,
        }
        let (end, key) = decided!(string(b, i));
        let mut role = decided!(role_of(key, depth, in_args, &mut seen));
        // The printers' `": "` in one test (the next token's position then waits on one load
        // less); whitespace after it is skipped where the value is read.
        if b.get(end..end + 2) == Some(b": ") {
            i = end + 2;
        } else {
            i = skip_ws(b, end);
            match b.get(i) {
                Some(b':') => i = skip_ws(b, i + 1),
                Some(_) => return Scan::Parse,
                None => return Scan::Incomplete,
            }
        }
        'value: loop {
            let Some(&c) = b.get(i) else {
                return Scan::Incomplete;
            };
            if let Role::Slot(s) = role {
                slots[s] = if matches!(c, b'-' | b'0'..=b'9') {
                    i
                } else {
                    NOT_A_NUMBER
                };
            }
            match c {
                b'"' => {
                    let (end, text) = decided!(string(b, i));
                    if role == Role::Name && text == b"[memory]" {
                        memory = true;
                    }
                    i = end;
                }
                b'{' | b'[' => {
                    if depth >= MAX_DEPTH {
                        return Scan::Parse;
                    }
                    let object = c == b'{';
                    if object && role == Role::Args {
                        in_args = true;
                    }
                    objects = (objects & !(1 << depth)) | (u64::from(object) << depth);
                    depth += 1;
                    i = skip_ws(b, i + 1);
                    match (b.get(i), object) {
                        (Some(b'}'), true) | (Some(b']'), false) => {
                            i += 1;
                            depth -= 1;
                            if depth == 1 {
                                in_args = false;
                            }
                        }
                        (None, _) => return Scan::Incomplete,
                        (Some(_), true) => continue 'key,
                        (Some(_), false) => {
                            role = Role::Other;
                            continue 'value;
                        }
                    }
                }
                b'-' | b'0'..=b'9' => i = decided!(number(b, i)),
                b't' => i = decided!(literal(b, i, b"true")),
                b'f' => i = decided!(literal(b, i, b"false")),
                b'n' => i = decided!(literal(b, i, b"null")),
                b' ' | b'\t' | b'\n' | b'\r' => {
                    i = skip_ws(b, i);
                    continue 'value;
                }
                _ => return Scan::Parse,
            }
            // After a value: `,` and the next key or element, or the end of containers.
            loop {
                let in_object = objects >> (depth - 1) & 1 == 1;
                // The printers' `, "` between members, in one test.
                if in_object && b.get(i..i + 3) == Some(b", \"") {
                    i += 2;
                    continue 'key;
                }
                i = skip_ws(b, i);
                let Some(&c) = b.get(i) else {
                    return Scan::Incomplete;
                };
                match (c, in_object) {
                    (b',', true) => {
                        i = skip_ws(b, i + 1);
                        continue 'key;
                    }
                    (b',', false) => {
                        i = skip_ws(b, i + 1);
                        role = Role::Other;
                        continue 'value;
                    }
                    (b'}', true) | (b']', false) => {
                        i += 1;
                        depth -= 1;
                        if depth == 1 {
                            in_args = false;
                        }
                        // The event has ended (at `i`; whitespace after it is not counted).
                        if depth == 0 {
                            return if memory {
                                finish(b, i, &slots)
                            } else {
                                Scan::Drop(i)
                            };
                        }
                    }
                    _ => return Scan::Parse,
                }
            }
        }
    }
}

/// The decision on a `[memory]` event of `used` bytes, scanned whole: its numbers read.
#[inline(never)]
fn finish(b: &[u8], used: usize, slots: &Slots) -> Scan {
    let mut ints = [Int::None; 2 + ARG_KEYS.len()];
    for (int, &at) in ints.iter_mut().zip(slots) {
        if at != NOT_A_NUMBER {
            *int = decided!(integer(b, at));
        }
    }
    let [ts, tid, args @ ..] = ints;
    Scan::Memory(used, Memory { ts, tid, args })
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
    #[test_case(br#"{"name": "[memory]", "ts": 1}"#, Scan::Memory(29, Memory { ts: Int::U(1), ..Memory::default() }) ; "a memory event")]
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
    #[test_case(br#"{"name": "[memory]", "args": {}, "x": {"Bytes": 5}}"#, Scan::Memory(51, Memory::default()) ; "args' keys elsewhere after an empty args")]
    #[test_case(br#"{"name": "[memory]", "x": {"Bytes": 5}, "args": []}"#, Scan::Memory(51, Memory::default()) ; "args' keys elsewhere before")]
    #[test_case(br#"{"args": {"Bytes": 5, "y": {"Addr": 1}, "Bytes": -7, "Ev Idx": 2, "Ev Idx": null}, "tid": "7", "name": "[memory]"}"#, Scan::Memory(114, Memory { args: [Int::None, Int::I(-7), Int::None, Int::None, Int::None, Int::None, Int::None], ..Memory::default() }) ; "the last value of a repeated key")]
    #[test_case(br#"{"name": "[memory]", "ts": 999999999999999999, "tid": -999999999999999999}"#, Scan::Memory(74, Memory { ts: Int::U(999_999_999_999_999_999), tid: Int::I(-999_999_999_999_999_999), ..Memory::default() }) ; "18 digits")]
    #[test_case(br#"{"name": "[memory]", "ts": 1000000000000000000}"#, Scan::Parse ; "19 digits")]
    #[test_case(br#"{"name": "[memory]", "ts": 1.5}"#, Scan::Parse ; "a fraction read")]
    #[test_case(br#"{"name": "[memory]", "args": {"Bytes": -0}}"#, Scan::Parse ; "minus zero read")]
    #[test_case(br#"{"name": "[memory]", "args": {"x": 1.5, "Bytes": 0}}"#, Scan::Memory(52, Memory { args: [Int::None, Int::U(0), Int::None, Int::None, Int::None, Int::None, Int::None], ..Memory::default() }) ; "a fraction not read")]
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
                        let (flags, quotes) = special(u64::from_le_bytes(word));
                        assert_eq!(
                            flags.trailing_zeros() as usize / 8,
                            at,
                            "{word:02x?}: flags {flags:#x}"
                        );
                        // The quotes' word says whether that first byte is a quote.
                        assert_eq!(
                            flags & flags.wrapping_neg() & quotes != 0,
                            s == b'"',
                            "{word:02x?}: flags {flags:#x}, quotes {quotes:#x}"
                        );
                    }
                }
            }
            let clean = special(u64::from_le_bytes([b'a'; 8]));
            assert_eq!(clean, (0, 0));
        }
        for o in ordinary {
            assert_eq!(special(u64::from_le_bytes([o; 8])).0, 0, "{o:#x}");
        }
    }

    /// The word-at-a-time digit test agrees with `is_ascii_digit` on every byte, in every
    /// lane, whatever stands around it.
    #[test]
    fn non_digits_are_flagged_exactly() {
        for at in 0..8 {
            for byte in 0..=255u8 {
                for around in [b'0', b'9', b'a', 0x00, 0x80, 0xff, b'/', b':'] {
                    let mut word = [around; 8];
                    word[at] = byte;
                    let flags = non_digits(u64::from_le_bytes(word));
                    for (lane, b) in word.iter().enumerate() {
                        assert_eq!(
                            flags >> (lane * 8 + 7) & 1 == 1,
                            !b.is_ascii_digit(),
                            "{word:02x?} lane {lane}"
                        );
                    }
                    assert_eq!(flags & !(LANES << 7), 0, "{word:02x?}");
                }
            }
        }
    }

    /// A string read byte by byte, as JSON has it: its end and body; an escape, a control
    /// character or text that is not UTF-8 handed over; no end held, incomplete.
    fn string_model(b: &[u8]) -> Scan {
        for (len, &c) in b.iter().enumerate().skip(1) {
            match c {
                b'"' => {
                    return match std::str::from_utf8(&b[1..len]) {
                        Ok(_) => Scan::Drop(len + 1),
                        Err(_) => Scan::Parse,
                    }
                }
                b'\\' | 0..=0x1f => return Scan::Parse,
                _ => {}
            }
        }
        Scan::Incomplete
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(5000))]

        /// Strings of every length (short ones a word at a time, long ones through
        /// `long_string`) with a special byte anywhere, ended or not: read as the byte model
        /// reads them.
        #[test]
        fn strings_are_read_as_the_model_reads_them(
            body in proptest::collection::vec(
                proptest::prop_oneof![
                    40 => proptest::sample::select(&b"abc:/ ()[]{}0123456789.,~\x7f"[..]),
                    1 => proptest::sample::select(&b"\"\\\x00\x01\x1f\x80\xbf\xc3\xa9\xff"[..]),
                ],
                0..120,
            ),
            ended in proptest::bool::ANY,
        ) {
            let mut text = vec![b'"'];
            text.extend_from_slice(&body);
            if ended {
                text.push(b'"');
            }
            let got = match string(&text, 0) {
                Ok((end, s)) => {
                    proptest::prop_assert_eq!(s, &text[1..end - 1]);
                    Scan::Drop(end)
                }
                Err(stop) => stop.into(),
            };
            proptest::prop_assert_eq!(got, string_model(&text), "{:?}", String::from_utf8_lossy(&text));
        }
    }

    proptest::proptest! {
        /// Digits are read as a fold one digit at a time reads them, at every length a kept
        /// number may have.
        #[test]
        fn decimal_is_the_fold_of_its_digits(text in "[0-9]{0,18}") {
            let want = text.bytes().fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
            proptest::prop_assert_eq!(decimal(text.as_bytes()), want, "{}", text);
        }
    }

    /// Each lane of eight digits weighs as its place says, for every digit.
    #[test]
    fn eight_digits_weigh_each_place() {
        for place in 0..8 {
            for d in b'0'..=b'9' {
                for around in [b'0', b'9'] {
                    let mut word = [around; 8];
                    word[place] = d;
                    let text = std::str::from_utf8(&word).unwrap_or_default();
                    assert_eq!(
                        eight_digits(word),
                        text.parse::<u64>().unwrap_or(0),
                        "{text}"
                    );
                }
            }
        }
    }

    /// `arg_of` matches exactly the keys of `ARG_KEYS`, at their index.
    #[test]
    fn arg_keys_are_matched_at_their_index() {
        for (i, k) in ARG_KEYS.iter().enumerate() {
            assert_eq!(arg_of(k), Some(i), "{}", String::from_utf8_lossy(k));
            assert_eq!(arg_of(&k[1..]), None);
        }
        for other in [
            &b"bytes"[..],
            b"Addx",
            b"External id",
            b"Device Typf",
            b"Ev Idy",
            b"",
            b"T",
        ] {
            assert_eq!(arg_of(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    /// The whitespace skip stops at the first byte that is not whitespace, wherever it stands
    /// after a run of spaces (eight at a time) and whatever follows.
    #[test]
    fn whitespace_is_skipped_to_the_first_other_byte() {
        for run in 0..20 {
            for lead in ["", "\n", "\r\n", "\t"] {
                for next in ["x", "\n ", "\u{1}", "", "é"] {
                    let text = format!("{lead}{}{next}", " ".repeat(run));
                    let want = text
                        .bytes()
                        .position(|c| !matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
                        .unwrap_or(text.len());
                    assert_eq!(skip_ws(text.as_bytes(), 0), want, "{text:?}");
                }
            }
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
