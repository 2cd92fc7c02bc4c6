//! XLA dumps (`XLA_FLAGS=--xla_dump_to=DIR`): a compiled module's buffer assignment, replayed
//! as XLA's runtime asks its allocator, so a JAX program can be planned before it runs.
//!
//! XLA writes, per compiled module, `module_NNNN.<name>.<platform>_after_optimizations-buffer-assignment.txt`:
//! a `BufferAssignment:` line, then one line per allocation,
//! `allocation N: size S[, parameter P, shape |…| at ShapeIndex {…}][, constant][, thread-local][, maybe-live-out][, preallocated-temp]:`
//! (the tuple index table reads `output shape is |…|`), each followed by its ` value: <…>`
//! lines. What `compiled.memory_analysis()` reports is summed from the same allocations:
//!
//! | figure | allocations |
//! |---|---|
//! | `argument_size_in_bytes` | `parameter` |
//! | `output_size_in_bytes` | `maybe-live-out` |
//! | `alias_size_in_bytes` | `parameter` and `maybe-live-out` (a donated argument reused in place) |
//! | `temp_size_in_bytes` | `preallocated-temp` |
//!
//! Constants (loaded with the executable) and thread-local buffers (on a stack) are not
//! allocated by the runtime's device allocator and are left out.
//!
//! The events: every argument is allocated first (tag `argument`, time 0). Each execution
//! `k` (time `k`, from 1) then allocates one temp arena (tag `temp`, the temp allocations
//! together) and one buffer per output that is not aliased to an argument (tag `output`),
//! and frees the arena when it ends. Its arguments that were not donated are then freed:
//! its outputs (the aliased arguments, reused in place, and the new buffers) are the next
//! execution's arguments. One execution so peaks at arguments + outputs + temp − aliased
//! bytes, which is what `memory_analysis()` reports; later ones at outputs + (outputs −
//! aliased) + temp. The last execution's outputs stay live.
//!
//! With [`XlaOptions::per_buffer`], one execution is replayed as the compiler planned it
//! instead: every HLO value (the ` value: <ID NAME @P> (size=S,…` lines) its own allocation
//! over its live range, read from the module's `*-live-range.txt` (`BufferLiveRange:`,
//! `NAME{INDEX}:START-END`, closed), tagged by its allocation's kind.
//!
//! A dump's files may be gzip'd (people gzip dump directories, `gzip -r DIR`):
//! `*-buffer-assignment.txt.gz` and `*-live-range.txt.gz` are read as the files they hold
//! (what a file holds decides, not its name), and a module's plain file is read before its
//! gzip'd copy when both are there.
//!
//! Files are untrusted: lines are bounded ([`MAX_XLA_LINE_BYTES`]), so are files, gzip'd
//! ones as they inflate ([`MAX_XLA_FILE_BYTES`]), allocations ([`MAX_XLA_ALLOCATIONS`]) and steps
//! ([`MAX_XLA_STEPS`]); anything malformed is a [`TraceError`](crate::trace::TraceError) with the
//! file and line.
#![deny(unsafe_code)]

use crate::trace::{limit_error, malformed_error, not_a_trace_error, os_error, selection_error};
use std::collections::HashSet;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::trace::Result;
use crate::trace::{excerpt, io_error, push_generated, Event, Op, TagId, TraceHeader};

/// The longest line of a buffer-assignment file: 1 MiB (a real one is at most a tuple
/// shape of a few thousand elements).
pub const MAX_XLA_LINE_BYTES: usize = 1 << 20;
/// The largest buffer-assignment file read: 256 MiB.
pub const MAX_XLA_FILE_BYTES: u64 = 256 << 20;
/// The most allocations one module may have: 1 million.
pub const MAX_XLA_ALLOCATIONS: usize = 1_000_000;
/// The most executions replayed: 100 000.
pub const MAX_XLA_STEPS: u32 = 100_000;
/// The most buffer-assignment files a dump directory may hold: 100 000.
pub const MAX_XLA_FILES: usize = 100_000;
/// The most events the executions of a module may make: 20 million, as a built-in workload
/// (`replay::workload::MAX_EVENTS`): events are held in memory (48 bytes each, so at most
/// 960 MB), and `--steps` × outputs is checked before any is made.
pub const MAX_XLA_EVENTS: u64 = 20_000_000;

/// The end of the name of a buffer-assignment file.
pub const BUFFER_ASSIGNMENT_SUFFIX: &str = "-buffer-assignment.txt";

/// What a dump file's name ends with once gzip'd: `*-buffer-assignment.txt.gz`.
pub const GZIP_SUFFIX: &str = ".gz";

/// The end of the name of a live-range file (read by `--per-buffer`).
pub const LIVE_RANGE_SUFFIX: &str = "-live-range.txt";

/// Tags of the events, in [`TraceHeader::tags`] order.
pub const TAGS: [&str; 4] = ["argument", "output", "temp", "constant"];
const TAG_ARGUMENT: TagId = 1;
const TAG_OUTPUT: TagId = 2;
const TAG_TEMP: TagId = 3;
const TAG_CONSTANT: TagId = 4;

/// One allocation of a buffer assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// `allocation N`.
    pub index: u64,
    /// Bytes.
    pub size: u64,
    /// Entry parameter number, for an argument.
    pub parameter: Option<u64>,
    /// `maybe-live-out`: part of the output.
    pub live_out: bool,
    /// `preallocated-temp`.
    pub temp: bool,
    /// `constant`.
    pub constant: bool,
    /// `thread-local`.
    pub thread_local: bool,
    /// Line of the file.
    pub line: u64,
}

/// One HLO value of a buffer assignment (a ` value:` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value {
    /// `name{shape index}`, as the live-range file names it (`dot.1{}`).
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// Position of its allocation in [`BufferAssignment::allocations`].
    pub allocation: usize,
}

/// A parsed buffer-assignment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferAssignment {
    /// The allocations, in file order.
    pub allocations: Vec<Allocation>,
    /// The HLO values, in file order.
    pub values: Vec<Value>,
}

/// The four figures of `compiled.memory_analysis()`, summed from a buffer assignment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// `argument_size_in_bytes`.
    pub argument_bytes: u64,
    /// `output_size_in_bytes`.
    pub output_bytes: u64,
    /// `alias_size_in_bytes`.
    pub alias_bytes: u64,
    /// `temp_size_in_bytes`.
    pub temp_bytes: u64,
}

impl MemoryStats {
    /// What one execution needs live at once: arguments + outputs + temp − aliased
    /// (saturating at `u64::MAX`).
    pub fn peak_bytes(&self) -> u64 {
        let sum = u128::from(self.argument_bytes)
            + u128::from(self.output_bytes)
            + u128::from(self.temp_bytes);
        u64::try_from(sum.saturating_sub(u128::from(self.alias_bytes))).unwrap_or(u64::MAX)
    }
}

impl BufferAssignment {
    /// Parses the text of a buffer-assignment file; `origin` names it in errors.
    ///
    /// # Errors
    /// A read failure, a line over [`MAX_XLA_LINE_BYTES`], text that is not UTF-8, a first
    /// line other than `BufferAssignment:`, an `allocation` line that does not parse, an
    /// allocation number seen twice, more than [`MAX_XLA_ALLOCATIONS`] allocations.
    pub fn parse(input: impl BufRead, origin: &str) -> Result<Self> {
        let mut lines = Lines::new(input, origin);
        let mut allocations = Vec::new();
        let mut values = Vec::new();
        let mut seen = HashSet::new();
        let mut started = false;
        while let Some((line_no, text)) = lines.next_line()? {
            if !started {
                if text.trim().is_empty() {
                    continue;
                }
                if text.trim() != "BufferAssignment:" {
                    return Err(not_a_trace_error(format!(
                        "{origin}: line {line_no}: not an XLA buffer assignment: expected \
                         `BufferAssignment:`, found {}",
                        excerpt(text)
                    )));
                }
                started = true;
                continue;
            }
            if let Some(rest) = text.trim_start().strip_prefix("value: ") {
                let Some(allocation) = allocations.len().checked_sub(1) else {
                    return Err(malformed_error(format!(
                        "{origin}: line {line_no}: a value before any allocation"
                    )));
                };
                let (name, size) = parse_value(rest)
                    .map_err(|why| malformed_error(format!("{origin}: line {line_no}: {why}")))?;
                if values.len() >= MAX_XLA_ALLOCATIONS {
                    return Err(limit_error(format!(
                        "{origin}: line {line_no}: more than {MAX_XLA_ALLOCATIONS} values"
                    )));
                }
                values.push(Value {
                    name,
                    size,
                    allocation,
                });
                continue;
            }
            let Some(rest) = text.strip_prefix("allocation ") else {
                // Sections other XLA versions add: not needed.
                continue;
            };
            let a = parse_allocation(rest, line_no)
                .map_err(|why| malformed_error(format!("{origin}: line {line_no}: {why}")))?;
            if !seen.insert(a.index) {
                return Err(malformed_error(format!(
                    "{origin}: line {line_no}: allocation {} appears twice",
                    a.index
                )));
            }
            if allocations.len() >= MAX_XLA_ALLOCATIONS {
                return Err(limit_error(format!(
                    "{origin}: line {line_no}: more than {MAX_XLA_ALLOCATIONS} allocations"
                )));
            }
            allocations.push(a);
        }
        if !started {
            return Err(not_a_trace_error(format!(
                "{origin}: empty: not an XLA buffer assignment"
            )));
        }
        Ok(BufferAssignment {
            allocations,
            values,
        })
    }

    /// Reads and parses `path` (at most [`MAX_XLA_FILE_BYTES`]; a gzip'd file is inflated,
    /// to at most as many).
    ///
    /// # Errors
    /// As [`BufferAssignment::parse`], and a file that cannot be opened or is too large.
    pub fn read(path: &Path) -> Result<Self> {
        let origin = shown_file(path);
        let input = open_text(path, &origin, "a buffer assignment")?;
        Self::parse(input, origin.as_str())
    }

    /// The figures `compiled.memory_analysis()` reports (saturating sums).
    pub fn stats(&self) -> MemoryStats {
        let mut s = MemoryStats::default();
        for a in &self.allocations {
            if a.parameter.is_some() {
                s.argument_bytes = s.argument_bytes.saturating_add(a.size);
                if a.live_out {
                    s.alias_bytes = s.alias_bytes.saturating_add(a.size);
                }
            }
            if a.live_out {
                s.output_bytes = s.output_bytes.saturating_add(a.size);
            }
            if a.temp {
                s.temp_bytes = s.temp_bytes.saturating_add(a.size);
            }
        }
        s
    }

    /// How many events [`BufferAssignment::events`] makes for `steps` executions, counted
    /// without making them (saturating).
    pub fn event_count(&self, steps: u32) -> u64 {
        let mut arguments = 0u64;
        let mut donated = 0u64;
        let mut outputs = 0u64;
        for a in &self.allocations {
            if a.parameter.is_some() {
                arguments += 1;
                donated += u64::from(a.live_out);
            } else if a.live_out {
                outputs += 1;
            }
        }
        let temps = if self.stats().temp_bytes > 0 { 2 } else { 0 };
        let steps = u64::from(steps);
        // The arguments' allocations, the frees of those not donated (after the first
        // execution), per execution the temporaries and the outputs, and the frees of the
        // outputs of every execution but the last (taken as the next one's arguments).
        (arguments + (arguments - donated))
            .saturating_add(steps.saturating_mul(temps + outputs))
            .saturating_add(steps.saturating_sub(1).saturating_mul(outputs))
    }

    /// The events of `steps` executions, as the module's header says (see the module
    /// documentation); ids number the allocations from 0.
    pub fn events(&self, steps: u32) -> Vec<Event> {
        let stats = self.stats();
        let arguments: Vec<&Allocation> = self
            .allocations
            .iter()
            .filter(|a| a.parameter.is_some())
            .collect();
        let outputs: Vec<&Allocation> = self
            .allocations
            .iter()
            .filter(|a| a.live_out && a.parameter.is_none())
            .collect();
        let mut events = Vec::new();
        let mut next_id = 0u64;
        // (id, size, donated): what the next execution takes.
        let mut live_args: Vec<(u64, u64, bool)> = Vec::new();
        for a in &arguments {
            push_generated(&mut events, 0, Op::Alloc, next_id, a.size, TAG_ARGUMENT);
            live_args.push((next_id, a.size, a.live_out));
            next_id += 1;
        }
        for step in 1..=u64::from(steps) {
            let arena = next_id;
            next_id += 1;
            // The temporaries' arena, taken before the outputs and given back after them.
            let temps = |events: &mut Vec<Event>, op| {
                if stats.temp_bytes > 0 {
                    push_generated(events, step, op, arena, stats.temp_bytes, TAG_TEMP);
                }
            };
            temps(&mut events, Op::Alloc);
            let mut produced = Vec::with_capacity(outputs.len());
            for o in &outputs {
                push_generated(&mut events, step, Op::Alloc, next_id, o.size, TAG_OUTPUT);
                produced.push((next_id, o.size, false));
                next_id += 1;
            }
            temps(&mut events, Op::Free);
            // Arguments not donated are released; donated ones now hold outputs.
            let mut next_args: Vec<(u64, u64, bool)> = Vec::new();
            for &(id, size, donated) in &live_args {
                if donated {
                    next_args.push((id, size, true));
                } else {
                    let tag = if step == 1 { TAG_ARGUMENT } else { TAG_OUTPUT };
                    push_generated(&mut events, step, Op::Free, id, size, tag);
                }
            }
            next_args.extend(produced);
            live_args = next_args;
        }
        events
    }
}

impl BufferAssignment {
    /// One execution with every HLO value its own allocation over its live range
    /// (`ranges`, from [`parse_live_ranges`]): allocated at its start, freed after its end
    /// (frees first at equal times); `time_ns` is the instruction position. Values without
    /// a range (those of nested computations, thread-local) and ranges without a value are
    /// left out; returns the events and how many ranges were left out.
    pub fn per_buffer_events(&self, ranges: &[(String, u64, u64)]) -> (Vec<Event>, usize) {
        let mut by_name = std::collections::HashMap::new();
        for v in &self.values {
            by_name.entry(v.name.as_str()).or_insert(v);
        }
        let mut rows = Vec::new();
        let mut missing = 0;
        for (id, (name, start, end)) in ranges.iter().enumerate() {
            let Some(v) = by_name.get(name.as_str()) else {
                missing += 1;
                continue;
            };
            let a = &self.allocations[v.allocation];
            let tag = if a.parameter.is_some() {
                TAG_ARGUMENT
            } else if a.live_out {
                TAG_OUTPUT
            } else if a.constant {
                TAG_CONSTANT
            } else {
                TAG_TEMP
            };
            rows.push((*start, 1u8, id as u64, v.size, tag));
            rows.push((end + 1, 0u8, id as u64, v.size, tag));
        }
        rows.sort_unstable();
        let mut events = Vec::with_capacity(rows.len());
        for (time, free, id, size, tag) in rows {
            let op = if free == 0 { Op::Free } else { Op::Alloc };
            push_generated(&mut events, time, op, id, size, tag);
        }
        (events, missing)
    }
}

/// Parses what follows `value: ` on a line: `<ID NAME @P> (size=S,offset=O): SHAPE`, to
/// the name (with `{}` added when the name has no shape index) and the size.
fn parse_value(rest: &str) -> std::result::Result<(String, u64), String> {
    let bad = || {
        format!(
            "expected `value: <ID NAME @P> (size=S,…`, found {}",
            excerpt(rest)
        )
    };
    let inner = rest.strip_prefix('<').ok_or_else(bad)?;
    let (inner, after) = inner.split_once('>').ok_or_else(bad)?;
    let mut words = inner.split_whitespace();
    let (_, name) = (words.next(), words.next().ok_or_else(bad)?);
    let size = after
        .trim_start()
        .strip_prefix("(size=")
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .ok_or_else(bad)?;
    let size: u64 = size.parse().map_err(|_| bad())?;
    let name = if name.ends_with('}') {
        name.to_string()
    } else {
        format!("{name}{{}}")
    };
    Ok((name, size))
}

/// The lines of a dump file, each read with a bound ([`MAX_XLA_LINE_BYTES`]) and checked as
/// UTF-8, without its line ending: the one reader both dump files go through.
struct Lines<'o, R> {
    input: R,
    origin: &'o str,
    buf: Vec<u8>,
    line_no: u64,
}

impl<'o, R: BufRead> Lines<'o, R> {
    fn new(input: R, origin: &'o str) -> Self {
        Lines {
            input,
            origin,
            buf: Vec::new(),
            line_no: 0,
        }
    }

    /// The next line and its number (from 1), `None` at the end.
    ///
    /// # Errors
    /// A read failure, a line over [`MAX_XLA_LINE_BYTES`], text that is not UTF-8.
    fn next_line(&mut self) -> Result<Option<(u64, &str)>> {
        let origin = self.origin;
        self.buf.clear();
        let n = (&mut self.input)
            .take(MAX_XLA_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| io_error(origin, e))?;
        if n == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        let line_no = self.line_no;
        if self.buf.len() > MAX_XLA_LINE_BYTES {
            return Err(limit_error(format!(
                "{origin}: line {line_no}: longer than {MAX_XLA_LINE_BYTES} bytes, the most a \
                 line of an XLA dump file may have"
            )));
        }
        let text = std::str::from_utf8(&self.buf)
            .map_err(|_| malformed_error(format!("{origin}: line {line_no}: not UTF-8 text")))?;
        Ok(Some((line_no, text.trim_end_matches(['\n', '\r']))))
    }
}

/// The `BufferLiveRange:` section of a `*-live-range.txt` file: `NAME{INDEX}:START-END`,
/// closed intervals of the module's instruction sequence.
///
/// # Errors
/// As [`BufferAssignment::parse`] for lines; a range line that does not parse; no
/// `BufferLiveRange:` section.
pub fn parse_live_ranges(input: impl BufRead, origin: &str) -> Result<Vec<(String, u64, u64)>> {
    let mut lines = Lines::new(input, origin);
    let mut ranges = Vec::new();
    let mut section = false;
    let mut found = false;
    while let Some((line_no, text)) = lines.next_line()? {
        let text = text.trim();
        if text == "BufferLiveRange:" {
            section = true;
            found = true;
            continue;
        }
        if !section {
            continue;
        }
        // The section ends at the first line that is not a range (`Live ranges at …`).
        let Some((name, range)) = text.rsplit_once(':') else {
            section = false;
            continue;
        };
        if !name.ends_with('}') {
            section = false;
            continue;
        }
        let parsed = range
            .split_once('-')
            .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
        let Some((start, end)) = parsed.filter(|(a, b)| a <= b && *b < u64::MAX) else {
            return Err(malformed_error(format!(
                "{origin}: line {line_no}: live range {} is not START-END with START <= END",
                excerpt(range)
            )));
        };
        if ranges.len() >= MAX_XLA_ALLOCATIONS {
            return Err(limit_error(format!(
                "{origin}: line {line_no}: more than {MAX_XLA_ALLOCATIONS} live ranges"
            )));
        }
        ranges.push((name.to_string(), start, end));
    }
    if !found {
        return Err(not_a_trace_error(format!(
            "{origin}: no `BufferLiveRange:` section: not an XLA live-range file"
        )));
    }
    Ok(ranges)
}

/// Parses what follows `allocation ` on a line.
fn parse_allocation(rest: &str, line: u64) -> std::result::Result<Allocation, String> {
    let body = rest.trim_end();
    let body = body
        .strip_suffix(':')
        .ok_or_else(|| format!("an allocation line should end with `:`: {}", excerpt(rest)))?;
    let (index, attrs) = body
        .split_once(": ")
        .ok_or_else(|| format!("expected `allocation N: size S…`, found {}", excerpt(rest)))?;
    let index: u64 = index
        .parse()
        .map_err(|_| format!("allocation number {} is not an integer", excerpt(index)))?;
    // Shapes (`|…|`) and shape indices (`{…}`) hold commas: blank them out first.
    let mut flat = String::with_capacity(attrs.len());
    let mut in_shape = false;
    let mut braces = 0usize;
    for c in attrs.chars() {
        match c {
            '|' if braces == 0 => in_shape = !in_shape,
            '{' if !in_shape => braces += 1,
            '}' if !in_shape && braces > 0 => braces -= 1,
            _ if in_shape || braces > 0 => {}
            _ => flat.push(c),
        }
    }
    if in_shape || braces > 0 {
        return Err(format!(
            "unbalanced `|` or `{{` in allocation {index}: {}",
            excerpt(attrs)
        ));
    }
    let mut a = Allocation {
        index,
        size: 0,
        parameter: None,
        live_out: false,
        temp: false,
        constant: false,
        thread_local: false,
        line,
    };
    let mut size = None;
    // `what` of the allocation, `text`, as a number.
    let number = |what: &str, text: &str| {
        text.trim().parse::<u64>().map_err(|_| {
            let shown = excerpt(text);
            format!("{what} {shown} of allocation {index} is not a non-negative integer")
        })
    };
    for field in flat.split(',').map(str::trim) {
        if let Some(s) = field.strip_prefix("size ") {
            size = Some(number("size", s)?);
        } else if let Some(p) = field.strip_prefix("parameter ") {
            a.parameter = Some(number("parameter number", p)?);
        } else {
            match field {
                "maybe-live-out" => a.live_out = true,
                "preallocated-temp" => a.temp = true,
                "constant" => a.constant = true,
                "thread-local" => a.thread_local = true,
                // `shape … at ShapeIndex`, `output shape is`, `color N`, …: not needed.
                _ => {}
            }
        }
    }
    a.size = size.ok_or_else(|| format!("allocation {index} has no `size`"))?;
    Ok(a)
}

/// What [`read_dir`] does.
#[derive(Debug, Clone)]
pub struct XlaOptions {
    /// Picks the module whose file name contains this (`None`: the one needing most bytes).
    pub module: Option<String>,
    /// Executions to replay, at least 1.
    pub steps: u32,
    /// Every HLO value its own allocation over its live range (one execution; needs the
    /// module's `*-live-range.txt`) instead of what the runtime allocates.
    pub per_buffer: bool,
}

impl Default for XlaOptions {
    fn default() -> Self {
        XlaOptions {
            module: None,
            steps: 1,
            per_buffer: false,
        }
    }
}

/// A module of a dump, read and turned into events.
#[derive(Debug, Clone)]
pub struct XlaModule {
    /// The module's name, as its file names it (`jit_train_step`).
    pub name: String,
    /// Its buffer-assignment file.
    pub file: PathBuf,
    /// What `compiled.memory_analysis()` reports for it.
    pub stats: MemoryStats,
    /// Header: tags `argument`, `output`, `temp`; the figures in its notes.
    pub header: TraceHeader,
    /// The events of the executions asked for.
    pub events: Vec<Event>,
}

/// A path as messages and headers show it: lossy UTF-8, control characters escaped (a file
/// name is anyone's text), not cut (a path the file system accepts is bounded).
fn shown_file(path: &Path) -> String {
    escaped(&path.to_string_lossy())
}

/// `text` with control characters escaped (`\u{1b}`), not cut.
fn escaped(text: &str) -> String {
    crate::text::cut_escaped(text, usize::MAX)
}

/// The text of the dump file `path` (`what` it should be, for messages), at most
/// [`MAX_XLA_FILE_BYTES`]: inflated when it is gzip'd (known by its first bytes, whatever
/// its name), to at most as many.
///
/// # Errors
/// As [`open_regular`]; a plain file larger than the bound (a gzip'd one fails as it is read,
/// where it inflates past it).
fn open_text(path: &Path, origin: &str, what: &str) -> Result<Box<dyn BufRead>> {
    let file = open_regular(path, origin, what)?;
    let len = file
        .metadata()
        .map_err(|e| os_error(&e, format!("cannot open {origin}: {e}")))?
        .len();
    let mut input = BufReader::new(file);
    let gzip = input
        .fill_buf()
        .map_err(|e| io_error(origin, e))?
        .starts_with(&[0x1f, 0x8b]);
    let too_large = |how: String| {
        format!(
            "{how} more than the {} MiB {what} may have",
            MAX_XLA_FILE_BYTES >> 20
        )
    };
    if !gzip {
        if len > MAX_XLA_FILE_BYTES {
            return Err(limit_error(format!(
                "{origin}: {}",
                too_large(format!("{len} bytes,"))
            )));
        }
        return Ok(Box::new(input.take(MAX_XLA_FILE_BYTES)));
    }
    // One layer, as XLA's files are gzip'd by a person; what it inflates to is bounded as a
    // plain file is, and the bound is told where it is reached.
    Ok(Box::new(BufReader::new(crate::trace::capped(
        flate2::read::MultiGzDecoder::new(input),
        MAX_XLA_FILE_BYTES,
        too_large("gzip'd: it inflates to".to_string()),
    ))))
}

/// Opens `path` if it is a regular file: a FIFO is refused before `open`, which would wait
/// for a writer for ever, and so is a device or a directory.
fn open_regular(path: &Path, origin: &str, what: &str) -> Result<File> {
    let cannot_open = |e| os_error(&e, format!("cannot open {origin}: {e}"));
    if !std::fs::metadata(path).map_err(cannot_open)?.is_file() {
        return Err(not_a_trace_error(format!(
            "{origin}: not a regular file (a FIFO, device or directory); {what} is a file XLA wrote"
        )));
    }
    File::open(path).map_err(cannot_open)
}

/// The live-range file beside the buffer-assignment file `file`, from the file's name as
/// the file system spells it (a name that is not UTF-8 included): `*-live-range.txt`, or,
/// where only it is there, `*-live-range.txt.gz` (a gzip'd dump's).
fn live_range_path(file: &Path) -> PathBuf {
    let plain = live_range_named(file, "");
    if plain.exists() {
        return plain;
    }
    let gzipped = live_range_named(file, GZIP_SUFFIX);
    if gzipped.exists() {
        gzipped
    } else {
        // The name the message gives for the file that is missing.
        plain
    }
}

/// `file`'s live-range file's name, `*-live-range.txt` then `extra`.
fn live_range_named(file: &Path, extra: &str) -> PathBuf {
    let Some(name) = file.file_name() else {
        return file.to_path_buf();
    };
    #[cfg(unix)]
    {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        let bytes = name.as_bytes();
        let bytes = bytes.strip_suffix(GZIP_SUFFIX.as_bytes()).unwrap_or(bytes);
        let stem = bytes
            .strip_suffix(BUFFER_ASSIGNMENT_SUFFIX.as_bytes())
            .unwrap_or(bytes);
        let mut live = stem.to_vec();
        live.extend_from_slice(LIVE_RANGE_SUFFIX.as_bytes());
        live.extend_from_slice(extra.as_bytes());
        file.with_file_name(std::ffi::OsString::from_vec(live))
    }
    #[cfg(not(unix))]
    {
        let name = name.to_string_lossy();
        let name = name.strip_suffix(GZIP_SUFFIX).unwrap_or(&name);
        let stem = name.strip_suffix(BUFFER_ASSIGNMENT_SUFFIX).unwrap_or(name);
        file.with_file_name(format!("{stem}{LIVE_RANGE_SUFFIX}{extra}"))
    }
}

/// The module name a buffer-assignment file name carries: `module_0030.jit_f.cpu_…` gives
/// `jit_f`.
fn module_name(file: &str) -> String {
    let file = file.strip_suffix(GZIP_SUFFIX).unwrap_or(file);
    let stem = file.strip_suffix(BUFFER_ASSIGNMENT_SUFFIX).unwrap_or(file);
    let mut parts = stem.splitn(3, '.');
    match (parts.next(), parts.next()) {
        (Some(m), Some(name)) if m.starts_with("module_") => name.to_string(),
        _ => stem.to_string(),
    }
}

/// Reads the XLA dump directory `dir`: picks a module, parses its buffer assignment and
/// returns its executions as events.
///
/// # Errors
/// The directory cannot be read, holds no buffer-assignment file or none matching
/// `--module`, or the chosen files are malformed (see [`BufferAssignment::parse`]); `steps`
/// is 0 or above [`MAX_XLA_STEPS`].
pub fn read_dir(dir: &Path, options: &XlaOptions) -> Result<XlaModule> {
    read_dump(dir, None, options)
}

/// Whether `path` names a buffer-assignment file of an XLA dump (its name ends with
/// [`BUFFER_ASSIGNMENT_SUFFIX`], or that and [`GZIP_SUFFIX`]; whatever it holds).
pub fn is_buffer_assignment_file(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| is_buffer_assignment_name(n.as_encoded_bytes()))
}

/// Whether a file `name` is a buffer-assignment file's, gzip'd or not.
fn is_buffer_assignment_name(name: &[u8]) -> bool {
    let name = name.strip_suffix(GZIP_SUFFIX.as_bytes()).unwrap_or(name);
    name.ends_with(BUFFER_ASSIGNMENT_SUFFIX.as_bytes())
}

/// Reads an XLA dump given as its directory ([`read_dir`]) or as one of its
/// buffer-assignment files: that file's module, with the module's other files beside it
/// (`*-live-range.txt` for [`XlaOptions::per_buffer`]), as [`read_dir`] reads a module it
/// picked.
///
/// # Errors
/// As [`read_dir`]; `path` is neither a directory nor a regular file named
/// `*-buffer-assignment.txt`.
pub fn read_path(path: &Path, options: &XlaOptions) -> Result<XlaModule> {
    let shown = || crate::text::shown_path(path);
    let meta = std::fs::metadata(path)
        .map_err(|e| os_error(&e, format!("cannot open {}: {e}", shown())))?;
    if meta.is_dir() {
        return read_dir(path, options);
    }
    if !meta.is_file() || !is_buffer_assignment_file(path) {
        return Err(not_a_trace_error(format!(
            "{}: not an XLA dump: give its directory (XLA_FLAGS=--xla_dump_to=DIR) or one of its \
             regular files named *{BUFFER_ASSIGNMENT_SUFFIX} (or *{BUFFER_ASSIGNMENT_SUFFIX}{GZIP_SUFFIX})",
            shown()
        )));
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    read_dump(dir, Some(path), options)
}

/// [`read_dir`] of `dir`, or of the one buffer-assignment file `lone` in it.
fn read_dump(dir: &Path, lone: Option<&Path>, options: &XlaOptions) -> Result<XlaModule> {
    let shown = lone.unwrap_or(dir).display().to_string();
    if options.per_buffer && options.steps != 1 {
        return Err(selection_error(format!(
            "--steps {} with --per-buffer: a per-buffer replay is one execution",
            options.steps
        )));
    }
    if options.steps == 0 || options.steps > MAX_XLA_STEPS {
        return Err(selection_error(format!(
            "--steps {}: give 1 to {MAX_XLA_STEPS} executions",
            options.steps
        )));
    }
    // A lone file is its module: the directory is not listed.
    let entries = match lone {
        Some(_) => None,
        None => Some(
            std::fs::read_dir(dir)
                .map_err(|e| os_error(&e, format!("cannot read {shown}: {e}")))?,
        ),
    };
    let mut files: Vec<(String, PathBuf)> = lone
        .map(|file| {
            let name = file.file_name().unwrap_or_default();
            (name.to_string_lossy().into_owned(), file.to_path_buf())
        })
        .into_iter()
        .collect();
    for entry in entries.into_iter().flatten() {
        let entry = entry.map_err(|e| os_error(&e, format!("cannot read {shown}: {e}")))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_buffer_assignment_name(name.as_bytes()) {
            if files.len() >= MAX_XLA_FILES {
                return Err(limit_error(format!(
                    "{shown}: more than {MAX_XLA_FILES} buffer-assignment files"
                )));
            }
            files.push((name, entry.path()));
        }
    }
    files.sort();
    // A module's file and its gzip'd copy are one module: the plain one is read.
    let plain: HashSet<String> = files
        .iter()
        .filter(|(name, _)| !name.ends_with(GZIP_SUFFIX))
        .map(|(name, _)| name.clone())
        .collect();
    files.retain(|(name, _)| {
        name.strip_suffix(GZIP_SUFFIX)
            .map_or(true, |stem| !plain.contains(stem))
    });
    if files.is_empty() {
        return Err(not_a_trace_error(format!(
            "{shown}: no *{BUFFER_ASSIGNMENT_SUFFIX} file (nor a gzip'd *{BUFFER_ASSIGNMENT_SUFFIX}{GZIP_SUFFIX}): \
             not an XLA dump (run the program with XLA_FLAGS=--xla_dump_to={shown})"
        )));
    }
    let total = files.len();
    if let Some(want) = &options.module {
        files.retain(|(name, _)| name.contains(want.as_str()));
        if files.is_empty() {
            return Err(selection_error(format!(
                "{shown}: no module matches --module {}: {total} buffer-assignment files, none \
                 with that in its name",
                excerpt(want)
            )));
        }
    }
    // The module needing the most bytes (the first such, in name order).
    let mut best: Option<(String, PathBuf, BufferAssignment, MemoryStats)> = None;
    for (name, path) in &files {
        let ba = BufferAssignment::read(path)?;
        let stats = ba.stats();
        if best
            .as_ref()
            .map_or(true, |(_, _, _, b)| stats.peak_bytes() > b.peak_bytes())
        {
            best = Some((name.clone(), path.clone(), ba, stats));
        }
    }
    let Some((file_name, file, ba, stats)) = best else {
        return Err(not_a_trace_error(format!("{shown}: no module read")));
    };
    if !options.per_buffer {
        let count = ba.event_count(options.steps);
        if count > MAX_XLA_EVENTS {
            return Err(limit_error(format!(
                "{}: refused: --steps {} makes {count} events, more than the {MAX_XLA_EVENTS} a replay holds; give fewer steps",
                escaped(&file_name),
                options.steps
            )));
        }
    }
    // Shown in the header and the report: escaped (the lossy name of a file name that is not
    // UTF-8 is kept for them; the files are found by their own names).
    let file_name = escaped(&file_name);
    let name = module_name(&file_name);
    let mut header = TraceHeader::new(format!("xla-dump:{file_name}"));
    header.tags = TAGS.iter().map(|t| t.to_string()).collect();
    let chosen = match &options.module {
        Some(want) if files.len() == 1 => format!("module {name} (--module {want})"),
        Some(want) => format!(
            "module {name}: the largest of {} matching --module {want}",
            files.len()
        ),
        None if lone.is_some() => format!("module {name}: its buffer-assignment file given"),
        None => format!("module {name}: the largest of {total} in the dump"),
    };
    header.notes.push(chosen);
    header.notes.push(format!(
        "memory_analysis: arguments {} + outputs {} + temp {} - aliased {} = {} bytes for one \
         execution",
        stats.argument_bytes,
        stats.output_bytes,
        stats.temp_bytes,
        stats.alias_bytes,
        stats.peak_bytes()
    ));
    header.notes.push(format!(
        "{} execution{} as XLA's runtime allocates them: arguments first, then per execution \
         one temp arena and the outputs not aliased to a donated argument; time_ns is the \
         execution number",
        options.steps,
        if options.steps == 1 { "" } else { "s" }
    ));
    let events = if options.per_buffer {
        let live = live_range_path(&file);
        let origin = shown_file(&live);
        let f = open_text(&live, &origin, "a live-range file").map_err(|e| {
            selection_error(format!(
                "--per-buffer needs the module's live ranges: {}",
                e.to_string().trim_start_matches("trace: ")
            ))
        })?;
        let ranges = parse_live_ranges(f, &origin)?;
        let (events, missing) = ba.per_buffer_events(&ranges);
        header.notes.pop();
        header.notes.push(format!(
            "--per-buffer: one execution, every HLO value its own allocation over its live \
             range (time_ns is the instruction position); {missing} live ranges without a \
             value left out"
        ));
        events
    } else {
        ba.events(options.steps)
    };
    Ok(XlaModule {
        name,
        file,
        stats,
        header,
        events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names() {
        assert_eq!(
            module_name("module_0030.jit_f.cpu_after_optimizations-buffer-assignment.txt"),
            "jit_f"
        );
        assert_eq!(module_name("x-buffer-assignment.txt"), "x");
        assert_eq!(
            module_name("module_0030.jit_f.cpu_after_optimizations-buffer-assignment.txt.gz"),
            "jit_f"
        );
    }

    #[test_case::test_case("a-buffer-assignment.txt", true ; "plain")]
    #[test_case::test_case("a-buffer-assignment.txt.gz", true ; "gzip'd")]
    #[test_case::test_case("a-buffer-assignment.txt.gz.gz", false ; "gzip'd twice by name")]
    #[test_case::test_case("a-live-range.txt.gz", false ; "a live-range file")]
    #[test_case::test_case("a-buffer-assignment.txt.bz2", false ; "another compression")]
    fn buffer_assignment_names(name: &str, is: bool) {
        assert_eq!(is_buffer_assignment_file(Path::new(name)), is);
    }

    #[test_case::test_case("m-buffer-assignment.txt" ; "plain")]
    #[test_case::test_case("m-buffer-assignment.txt.gz" ; "gzip'd")]
    fn live_range_names(file: &str) {
        // Neither exists here: the plain name, for the message.
        assert_eq!(
            live_range_path(Path::new(file)),
            Path::new("m-live-range.txt")
        );
        assert_eq!(
            live_range_named(Path::new(file), GZIP_SUFFIX),
            Path::new("m-live-range.txt.gz")
        );
    }
}
