//! Allocation traces: one event format, importers, exporters, and a streaming summary.
//!
//! Every trace, whatever it was recorded with, becomes a [`TraceHeader`] and a stream of
//! [`Event`]s: allocations and frees keyed by a per-trace allocation id, in replay order.
//! [`open`] sniffs the format of a file (or takes [`Options::format`]) and returns a
//! [`Trace`], an iterator of `Result<Event>` that streams where the format allows it:
//!
//! | format | module | streams? |
//! |---|---|---|
//! | portalloc JSON lines (own, versioned; see `docs/trace-format.md`) | [`jsonl`] | yes |
//! | RMM logging CSV (`Thread,Time,Action,Pointer,Size,Stream`) | [`import::rmm_csv`] | yes |
//! | PyTorch memory snapshot (`_dump_snapshot` pickle) | [`import::snapshot`] | no (a pickle is read whole) |
//! | PyTorch profiler / Kineto Chrome-trace JSON | [`import::kineto`] | no (events are sorted) |
//! | buffer-lifetime CSV (`id,lower,upper,size`, SOMAS) | [`import::lifetimes_csv`] | no (events are sorted) |
//!
//! Any of them may be gzip-compressed, even twice (a `.gz` gzip'd again). An XLA dump
//! directory (`--xla_dump_to`) is read by [`import::xla_dump::read_dir`] instead: a module's
//! buffer assignment, as executions.
//! Exporters: [`jsonl::Writer`] and
//! [`export::RmmCsvWriter`].
//!
//! What importers tolerate (a free of an address never allocated, a double free, a zero size,
//! an allocation at an address still live, …) is counted in [`Anomalies`] with the line or
//! event number of the first few; with [`Options::strict`] the first one is an error instead.
//! Nothing panics on any input.
//!
//! [`summarize`] walks a trace in O(live allocations) memory and gives peak live bytes
//! (baseline included), counts and sizes.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Cursor, Read};
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::text::shown_path;

/// Implements [`Iterator`] and [`TraceSource`] for a streaming reader with a `done: bool`
/// field, a `header: TraceHeader` field, a method `next_inner` that gives the next event
/// (`Ok(None)` at the end) and its [`Anomalies`] at the field path given: the reader yields
/// nothing more after its end or its first error, as [`TraceSource`] promises.
macro_rules! streaming_trace_source {
    ($reader:ty, anomalies: $($anomalies:ident).+) => {
        impl Iterator for $reader {
            type Item = Result<Event>;

            fn next(&mut self) -> Option<Result<Event>> {
                if self.done {
                    return None;
                }
                let item = self.next_inner().transpose();
                self.done = !matches!(item, Some(Ok(_)));
                item
            }
        }

        impl TraceSource for $reader {
            fn header(&self) -> &TraceHeader {
                &self.header
            }

            fn anomalies(&self) -> &Anomalies {
                &self.$($anomalies).+
            }
        }
    };
}

/// The error of a trace writer whose output fails: an [`TraceErrorKind::Io`] keeping the
/// operating system's kind.
pub(crate) fn write_error(e: std::io::Error) -> TraceError {
    TraceError::from_io(&e, format!("write trace: {e}"))
}

mod anomaly;
mod error;
pub mod export;
pub mod import;
mod inflate;
pub mod jsonl;
mod summary;

pub use anomaly::{Anomalies, Anomaly, AnomalyKind, Loc};
pub(crate) use error::{io_kind, limit_reached};
pub use error::{Result, TraceError, TraceErrorKind, MAX_MESSAGE_CHARS};
pub use summary::{summarize, summarize_events, Summary};

/// A [`TraceError`] of `kind`.
pub(crate) fn trace_error(kind: TraceErrorKind, message: String) -> TraceError {
    TraceError::new(kind, message)
}

/// A [`TraceError`] of [`TraceErrorKind::Malformed`].
pub(crate) fn malformed_error(message: String) -> TraceError {
    trace_error(TraceErrorKind::Malformed, message)
}

/// A [`TraceError`] of [`TraceErrorKind::NotATrace`].
pub(crate) fn not_a_trace_error(message: String) -> TraceError {
    trace_error(TraceErrorKind::NotATrace, message)
}

/// A [`TraceError`] of [`TraceErrorKind::Limit`].
pub(crate) fn limit_error(message: String) -> TraceError {
    trace_error(TraceErrorKind::Limit, message)
}

/// A [`TraceError`] of [`TraceErrorKind::Anomaly`].
pub(crate) fn anomaly_error(message: String) -> TraceError {
    trace_error(TraceErrorKind::Anomaly, message)
}

/// A [`TraceError`] of [`TraceErrorKind::Selection`].
pub(crate) fn selection_error(message: String) -> TraceError {
    trace_error(TraceErrorKind::Selection, message)
}

/// The error of the operating system's `e` (opening a file, listing a directory, starting a
/// thread), with `message`: an [`TraceErrorKind::Io`] keeping `e`'s kind.
pub(crate) fn os_error(e: &std::io::Error, message: String) -> TraceError {
    TraceError::from_io(e, message).with_kind(TraceErrorKind::Io)
}

/// The error of reading `origin` failing with `e`.
pub(crate) fn io_error(origin: &str, e: std::io::Error) -> TraceError {
    TraceError::from_io(&e, format!("{origin}: read failed: {e}"))
}

pub(crate) use anomaly::{Keying, LineEnds, Tracker};

/// The value of [`TraceHeader::format`].
pub const FORMAT_NAME: &str = "portalloc-trace";

/// The version of the own format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Index into [`TraceHeader::tags`], plus one: 0 means "no tag", `k` means `tags[k - 1]`.
pub type TagId = u16;

/// What an event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// An allocation of `size` bytes, which makes `id` live.
    Alloc,
    /// The free of allocation `id`, which was `size` bytes.
    Free,
}

impl Op {
    /// The one-letter code of the own format: `a` or `f`.
    pub fn code(self) -> &'static str {
        match self {
            Op::Alloc => "a",
            Op::Free => "f",
        }
    }
}

/// One allocation or free. Small and `Copy`: a replay holds none of them for long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    /// Position in the trace, strictly increasing (importers number from 0).
    pub seq: u64,
    /// When it happened, in nanoseconds (the source's clock; logical steps for lifetime CSVs).
    pub time_ns: u64,
    /// Thread that made the call (0 when the source does not say).
    pub thread: u32,
    /// Stream the allocation is ordered on (0 = the default stream or unknown).
    pub stream: u64,
    /// Allocation or free.
    pub op: Op,
    /// Per-trace allocation id: unique to one allocation; its free carries the same id.
    pub id: u64,
    /// Bytes allocated, or bytes freed (the size of what the free releases).
    pub size: u64,
    /// Tag: index into [`TraceHeader::tags`] plus one; 0 = none.
    pub tag: TagId,
}

/// Appends an event of a generated trace (one thread, the default stream) to `events`,
/// numbered by its position.
pub(crate) fn push_generated(
    events: &mut Vec<Event>,
    time_ns: u64,
    op: Op,
    id: u64,
    size: u64,
    tag: TagId,
) {
    let seq = events.len() as u64;
    events.push(Event {
        seq,
        time_ns,
        thread: 0,
        stream: 0,
        op,
        id,
        size,
        tag,
    });
}

/// What the recording allocator itself reported, kept alongside the events for comparison.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reference {
    /// Peak bytes the recording allocator reserved from the device.
    pub reserved_bytes: Option<u64>,
    /// Peak live bytes the recording allocator reported.
    pub peak_live_bytes: Option<u64>,
    /// Which allocator recorded the trace (`pytorch-caching`, `rmm`, …).
    pub allocator: Option<String>,
}

/// Everything about a trace that is not an event. Line 1 of the own format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// Format version, [`FORMAT_VERSION`] for what this build writes.
    pub version: u32,
    /// Where the events came from: `<format>:<file name>` (e.g. `pytorch-snapshot:x.pickle`).
    pub source: String,
    /// The device recorded (e.g. `cuda:1 Tesla V100-SXM2-32GB`), when known.
    #[serde(default)]
    pub device: Option<String>,
    /// The total memory of that device in bytes, as the recorder reported it (a Kineto
    /// trace's `deviceProperties` `totalGlobalMem`), when known: what `portalloc replay`
    /// plans for when no device is given, a partitioned GPU (a MIG slice) included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_memory: Option<u64>,
    /// Bytes already live before the first event (allocated before the recording window).
    /// A free of an id never allocated in the trace releases part of it.
    #[serde(default)]
    pub baseline_bytes: u64,
    /// The sizes of the allocations from before the window known one by one and live to its
    /// end (never freed in it): a snapshot's blocks live at dump time that the window did not
    /// allocate. Part of `baseline_bytes`; replay makes each its own block, and models the
    /// rest of the baseline that no free in the window accounts for as memory of unknown
    /// shape (see `replay::Baseline`). Empty when the source tells no more than a total.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pre_window_blocks: Vec<u64>,
    /// Figures the recording allocator reported, when the source carries them.
    #[serde(default)]
    pub reference: Option<Reference>,
    /// Tag table: tag `k` (`k ≥ 1`) of an event is `tags[k - 1]`.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Free-form remarks of the importer (what was kept, what was skipped).
    #[serde(default)]
    pub notes: Vec<String>,
    /// Where each step of a program that repeats its steps begins: the `seq` of the step's
    /// first event (its index, where events are numbered from 0 as the built-in workloads and
    /// `--repeat` number them), strictly ascending. Replay reports the device calls of each
    /// step that an event reaches (`driver_calls_per_step`). Written only when non-empty;
    /// absent reads as empty (no steps known).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_starts: Vec<u64>,
}

impl TraceHeader {
    /// A header for `source` with nothing else known.
    pub fn new(source: impl Into<String>) -> Self {
        TraceHeader {
            format: FORMAT_NAME.to_string(),
            version: FORMAT_VERSION,
            source: source.into(),
            device: None,
            device_memory: None,
            baseline_bytes: 0,
            pre_window_blocks: Vec::new(),
            reference: None,
            tags: Vec::new(),
            notes: Vec::new(),
            step_starts: Vec::new(),
        }
    }

    /// The text of tag `tag`, `None` for 0 or an index outside the table.
    pub fn tag_name(&self, tag: TagId) -> Option<&str> {
        if tag == 0 {
            return None;
        }
        self.tags.get(usize::from(tag) - 1).map(String::as_str)
    }
}

/// A trace format this module reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Format {
    /// portalloc's own JSON-lines format ([`jsonl`]).
    Portalloc,
    /// PyTorch `torch.cuda.memory._dump_snapshot` pickle.
    PytorchSnapshot,
    /// PyTorch profiler / Kineto Chrome-trace JSON with `[memory]` events.
    Kineto,
    /// RMM `logging_resource_adaptor` CSV.
    RmmCsv,
    /// Buffer-lifetime CSV `id,lower,upper,size` (MindSpore SOMAS, idealloc).
    LifetimesCsv,
}

impl Format {
    /// Every format, in the order [`Format::name`] lists them.
    pub const ALL: [Format; 5] = [
        Format::Portalloc,
        Format::PytorchSnapshot,
        Format::Kineto,
        Format::RmmCsv,
        Format::LifetimesCsv,
    ];

    /// The short name, as [`Format::from_str`] accepts it and [`TraceHeader::source`] starts.
    pub fn name(self) -> &'static str {
        match self {
            Format::Portalloc => "portalloc",
            Format::PytorchSnapshot => "pytorch-snapshot",
            Format::Kineto => "kineto",
            Format::RmmCsv => "rmm-csv",
            Format::LifetimesCsv => "lifetimes-csv",
        }
    }

    /// A line saying what the format is and how it is recognised.
    pub fn describe(self) -> &'static str {
        match self {
            Format::Portalloc => {
                "portalloc: portalloc JSON lines (first line an object with \"format\":\"portalloc-trace\")"
            }
            Format::PytorchSnapshot => {
                "pytorch-snapshot: PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot)"
            }
            Format::Kineto => {
                "kineto: PyTorch profiler / Kineto Chrome-trace JSON with \"[memory]\" events (a JSON object with traceEvents)"
            }
            Format::RmmCsv => "rmm-csv: RMM logging CSV (header Thread,Time,Action,Pointer,Size,Stream)",
            Format::LifetimesCsv => "lifetimes-csv: buffer-lifetime CSV (header id,lower,upper,size)",
        }
    }

    /// The list of accepted formats, for error messages.
    pub fn accepted() -> String {
        let mut s = String::from("accepted formats (each may be gzip-compressed): ");
        for (i, f) in Format::ALL.iter().enumerate() {
            if i > 0 {
                s.push_str("; ");
            }
            s.push_str(f.describe());
        }
        s.push_str(
            "; and, for `portalloc replay`, an XLA dump: its directory (XLA_FLAGS=--xla_dump_to=DIR) \
             or one of its *-buffer-assignment.txt files",
        );
        s
    }
}

display_as_name!(Format);

impl FromStr for Format {
    type Err = TraceError;

    /// # Errors
    /// [`TraceErrorKind::InvalidOption`] naming the formats.
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        let found = match t.as_str() {
            "portalloc" | "portalloc-trace" | "jsonl" => Some(Format::Portalloc),
            "pytorch-snapshot" | "snapshot" | "pickle" => Some(Format::PytorchSnapshot),
            "kineto" | "chrome-trace" | "pytorch-profiler" => Some(Format::Kineto),
            "rmm-csv" | "rmm" => Some(Format::RmmCsv),
            "lifetimes-csv" | "lifetimes" | "somas" => Some(Format::LifetimesCsv),
            _ => None,
        };
        found.ok_or_else(|| TraceError::invalid_option("--format", s, &Format::accepted()))
    }
}

/// How to open a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Read as this format instead of sniffing it.
    pub format: Option<Format>,
    /// Turn the first anomaly into an error (with its line or event number) instead of
    /// counting it.
    pub strict: bool,
    /// Device to keep, for formats that record several (snapshot, Kineto); default: the
    /// device with the most events.
    pub device: Option<u32>,
    /// Read the CPU's events of a profile that records several device types (Kineto's
    /// `Device Type` 0) instead of a GPU's. Default false: a profile's CPU events are never
    /// replayed in place of a GPU's, and a profile with none but the CPU's is refused.
    pub cpu: bool,
    /// The device type to keep, for formats that record several (Kineto): PyTorch's
    /// `c10::DeviceType` number (1 CUDA, 6 HIP, 12 XPU, …), with [`Options::device`] its
    /// ordinal. Default: any accelerator's (every type but the CPU's and its layouts).
    pub device_type: Option<i64>,
    /// The file is trusted: read snapshot pickles with 16 times the limits on untrusted files
    /// (docs/trace-format.md), for long histories recorded with stack frames, and up to 16
    /// times [`MAX_INPUT_BYTES`] from a gzip stream or a file that is not a regular file.
    /// Default false.
    pub trusted: bool,
    /// The most bytes read from a gzip stream (inflated) or from a file that is not a
    /// regular file, instead of [`MAX_INPUT_BYTES`] (× [`TRUSTED_INPUT_FACTOR`] when
    /// trusted). Default `None`.
    pub max_input_bytes: Option<u64>,
}

impl Options {
    /// Sniff the format, count anomalies, pick the busiest device.
    pub fn new() -> Self {
        Options::default()
    }

    /// Sets [`Options::format`].
    pub fn with_format(mut self, format: Format) -> Self {
        self.format = Some(format);
        self
    }

    /// Sets [`Options::cpu`].
    pub fn with_cpu(mut self, cpu: bool) -> Self {
        self.cpu = cpu;
        self
    }

    /// Sets [`Options::trusted`].
    pub fn with_trusted(mut self, trusted: bool) -> Self {
        self.trusted = trusted;
        self
    }

    /// Sets [`Options::max_input_bytes`].
    pub fn with_max_input_bytes(mut self, bytes: u64) -> Self {
        self.max_input_bytes = Some(bytes);
        self
    }

    /// The most bytes read from a gzip stream (inflated) or a file that is not a regular
    /// file: [`Options::max_input_bytes`], else [`MAX_INPUT_BYTES`], times
    /// [`TRUSTED_INPUT_FACTOR`] for a trusted file.
    pub fn input_limit(&self) -> u64 {
        self.max_input_bytes.unwrap_or(if self.trusted {
            MAX_INPUT_BYTES * TRUSTED_INPUT_FACTOR
        } else {
            MAX_INPUT_BYTES
        })
    }

    /// Sets [`Options::strict`].
    pub fn with_strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Sets [`Options::device`].
    pub fn with_device(mut self, device: u32) -> Self {
        self.device = Some(device);
        self
    }

    /// Sets [`Options::device_type`].
    pub fn with_device_type(mut self, device_type: i64) -> Self {
        self.device_type = Some(device_type);
        self
    }

    /// Sets the device to keep as `portalloc replay --trace-device` names it: `cpu` (sets
    /// [`Options::cpu`]), an ordinal (`1`: [`Options::device`]), a device type as
    /// `torch.device` spells it (`hip`: [`Options::device_type`]), or both (`cuda:1`,
    /// `hip:0`).
    ///
    /// # Errors
    /// [`TraceErrorKind::InvalidOption`] for anything else, naming what is accepted.
    pub fn with_device_spec(self, spec: &str) -> Result<Self> {
        import::kineto::device_spec(spec)
            .map(|(cpu, device_type, device)| Options {
                cpu: self.cpu || cpu,
                device_type: device_type.or(self.device_type),
                device: device.or(self.device),
                ..self
            })
            .ok_or_else(|| {
                TraceError::invalid_option(
                    "--trace-device",
                    spec,
                    "cpu, a device ordinal (0, 1, …), or a PyTorch device type with or without \
                     one (cuda:1, hip:0, xpu, …)",
                )
            })
    }
}

/// A source of events: an iterator that also knows its header and what it tolerated so far.
///
/// After it yields an `Err`, it yields nothing more.
pub trait TraceSource: Iterator<Item = Result<Event>> + Send {
    /// The header (known before the first event).
    fn header(&self) -> &TraceHeader;
    /// Anomalies counted so far (complete once the iterator is exhausted).
    fn anomalies(&self) -> &Anomalies;
}

/// An opened trace: header, format, and a stream of events.
pub struct Trace {
    format: Format,
    inner: Box<dyn TraceSource>,
}

impl fmt::Debug for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trace")
            .field("format", &self.format)
            .field("header", self.inner.header())
            .finish_non_exhaustive()
    }
}

impl Trace {
    /// Wraps any source.
    pub fn new(format: Format, source: Box<dyn TraceSource>) -> Self {
        Trace {
            format,
            inner: source,
        }
    }

    /// A trace over events already in memory (a built-in workload, or a trace read once and
    /// replayed many times).
    pub fn from_events(format: Format, header: TraceHeader, events: Vec<Event>) -> Self {
        Trace::new(
            format,
            Box::new(VecSource {
                header,
                anomalies: Anomalies::new(),
                events: events.into_iter(),
            }),
        )
    }

    /// The format it was read as.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The header.
    pub fn header(&self) -> &TraceHeader {
        self.inner.header()
    }

    /// Anomalies counted so far (complete once the trace is exhausted).
    pub fn anomalies(&self) -> &Anomalies {
        self.inner.anomalies()
    }
}

impl Iterator for Trace {
    type Item = Result<Event>;

    fn next(&mut self) -> Option<Result<Event>> {
        self.inner.next()
    }
}

/// A boxed buffered reader, as the importers take it.
pub(crate) type Input = Box<dyn BufRead + Send>;

/// The longest line the text formats (portalloc's own, RMM's CSV, buffer-lifetime CSV)
/// accept: 16 MiB. A real line is tens of bytes (a header with many tags, kilobytes); a
/// longer one is refused as it is read, before it is held whole.
pub const MAX_LINE_BYTES: u64 = 16 << 20;

/// The most characters of a file's text an error message quotes.
pub const EXCERPT_CHARS: usize = 40;

/// `text` quoted for an error message: at most [`EXCERPT_CHARS`] characters, with `…` and
/// the full length when cut.
pub(crate) fn excerpt(text: &str) -> String {
    crate::text::quoted_excerpt(text, EXCERPT_CHARS)
}

/// A reader that fails as soon as a line grows past `max` bytes, so that line-oriented
/// readers (ours, the `csv` crate's) never hold a longer one.
struct BoundedLines<R> {
    inner: R,
    /// Bytes since the last newline.
    run: u64,
    max: u64,
}

/// Counts `bytes` into `run` (bytes since the last newline); an error once past `max`.
fn count_line(run: &mut u64, max: u64, bytes: &[u8]) -> std::io::Result<()> {
    match bytes.iter().rposition(|&b| b == b'\n') {
        Some(i) => *run = (bytes.len() - i - 1) as u64,
        None => *run += bytes.len() as u64,
    }
    if *run > max {
        return Err(too_long(max));
    }
    Ok(())
}

fn too_long(max: u64) -> std::io::Error {
    limit_reached(format!(
        "a line longer than {} MiB, the most a line of a text trace may have",
        max >> 20
    ))
}

impl<R: BufRead> Read for BoundedLines<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        count_line(&mut self.run, self.max, &buf[..n])?;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for BoundedLines<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.run > self.max {
            return Err(too_long(self.max));
        }
        self.inner.fill_buf()
    }

    fn consume(&mut self, amt: usize) {
        // Only the bytes consumed count; `fill_buf` showed them first. Going past the limit
        // is reported by the next `fill_buf`.
        if let Ok(bytes) = self.inner.fill_buf() {
            let _ = count_line(&mut self.run, self.max, &bytes[..amt.min(bytes.len())]);
        }
        self.inner.consume(amt);
    }
}

const SNIFF_BYTES: u64 = 8192;

/// Opens the trace at `path`: gzip is undone, the format sniffed (or taken from
/// `options.format`), and the matching reader returned.
///
/// A file that is not a regular file (a pipe, a FIFO, a device) is opened without waiting
/// for a FIFO's writer (one nobody writes to reads as empty) and read to at most
/// [`Options::input_limit`] bytes; so is what a gzip stream inflates to.
///
/// # Errors
/// The file cannot be read; the format is not recognised (the message lists the accepted
/// formats); the header or the first records are corrupt.
pub fn open(path: impl AsRef<Path>, options: &Options) -> Result<Trace> {
    let path = path.as_ref();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let (input, _, size) = opened(path, options)?;
    open_sized(input, &name, options, size)
}

/// The bytes of the file at `path` as [`open`] reads them, before gzip is undone: opened
/// without blocking on a FIFO, and bounded by [`Options::input_limit`] when the file is not
/// a regular file. The second value: the file is a regular file (it can be read again).
///
/// # Errors
/// The file cannot be opened (the message shows the path bounded and escaped).
pub fn open_bytes(path: &Path, options: &Options) -> Result<(Box<dyn Read + Send>, bool)> {
    opened(path, options).map(|(input, regular, _)| (input, regular))
}

/// [`open_bytes`], and the size of a regular file where it is known.
fn opened(path: &Path, options: &Options) -> Result<(BoxRead, bool, Option<u64>)> {
    let cannot_open =
        |e: std::io::Error| os_error(&e, format!("cannot open {}: {e}", shown_path(path)));
    // The type first (`metadata` never blocks): a FIFO must not be opened so that `open`
    // waits for a writer.
    if std::fs::metadata(path).map_err(cannot_open)?.is_file() {
        let file = File::open(path).map_err(cannot_open)?;
        // The size lets a reader that holds the whole file make its room up front; a size
        // that is wrong (a file still being written) costs a copy, nothing else.
        let size = file
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len());
        return Ok((Box::new(file), true, size));
    }
    let file = open_without_blocking(path).map_err(cannot_open)?;
    let input = Capped::new(Patient(file), options, "input");
    Ok((Box::new(input), false, None))
}

/// `bytes` inflated when they start as a gzip stream (bounded by
/// [`Options::input_limit`]; twice when it holds one too), else as they are; with the first
/// bytes of the result (up to 8 KiB), from which [`detect`] tells the format.
///
/// # Errors
/// The input cannot be read, or its first 8 KiB cannot be inflated.
pub fn inflated_bytes(
    bytes: Box<dyn Read + Send>,
    name: &str,
    options: &Options,
) -> Result<(Vec<u8>, Box<dyn Read + Send>)> {
    let (prefix, rest) = peek(bytes, name)?;
    if prefix.starts_with(GZIP_MAGIC) {
        return gunzip_layers(prefix, rest, name, options);
    }
    Ok((prefix.clone(), Box::new(Cursor::new(prefix).chain(rest))))
}

/// The first bytes of a gzip stream.
const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];

/// The gzip stream that starts with `prefix` (what [`peek`] read of it) and goes on with
/// `rest`, inflated up to [`Options::input_limit`].
fn gunzip(prefix: Vec<u8>, rest: BoxRead, options: &Options) -> impl Read + Send {
    let gz = flate2::read::MultiGzDecoder::new(Cursor::new(prefix).chain(rest));
    Capped::new(gz, options, "inflated stream")
}

/// The gzip stream `prefix` then `rest` inflated, and inflated once more when what it holds
/// is a gzip stream too (a `.gz` gzip'd again, as a tool that compresses whatever it ships
/// does): the first bytes of the result (up to [`SNIFF_BYTES`]) and the whole result.
///
/// Twice, no more: each layer is bounded by [`Options::input_limit`] as one is, so reading
/// the second costs at most another such bound of inflation; a third layer is no file a
/// tool writes by accident, and is refused, saying so.
///
/// # Errors
/// The first bytes cannot be inflated; a gzip stream inside the second layer.
fn gunzip_layers(
    prefix: Vec<u8>,
    rest: BoxRead,
    name: &str,
    options: &Options,
) -> Result<(Vec<u8>, BoxRead)> {
    let (inner, rest) = peek(Box::new(gunzip(prefix, rest, options)), name)?;
    if !inner.starts_with(GZIP_MAGIC) {
        return Ok((inner.clone(), Box::new(Cursor::new(inner).chain(rest))));
    }
    let (prefix, rest) = peek(Box::new(gunzip(inner, rest, options)), name)?;
    if prefix.starts_with(GZIP_MAGIC) {
        return Err(not_a_trace_error(format!(
            "{name}: gzip-compressed three times or more: portalloc inflates a trace at most \
             twice (a .gz gzip'd again); inflate it yourself (gzip -dc, once per layer) and \
             give what comes out"
        )));
    }
    Ok((prefix.clone(), Box::new(Cursor::new(prefix).chain(rest))))
}

/// The most bytes read from an input the file system does not bound, untrusted: a file that
/// is not a regular file (a pipe, a FIFO, a character device such as `/dev/zero`), and what a
/// gzip stream inflates to (a 10 MB gzip file can hold 10 GiB of blank lines). 1 GiB: the
/// snapshot pickle's input limit, for every format; [`Options::trusted`] raises it
/// [`TRUSTED_INPUT_FACTOR`] times.
pub const MAX_INPUT_BYTES: u64 = 1 << 30;

/// How many times [`Options::trusted`] raises the limits on untrusted files.
pub const TRUSTED_INPUT_FACTOR: u64 = 16;

/// Opens `path` for reading without waiting for a FIFO's writer (`O_NONBLOCK`): a FIFO
/// nobody writes to reads as empty instead of blocking `open` for ever.
fn open_without_blocking(path: &Path) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// A reader over a file opened with `O_NONBLOCK` (a pipe or FIFO whose writer is slower
/// than the reader): waits a moment and reads again where a read would block. The flag
/// cannot be cleared without an unsafe `fcntl`, and the crate has no unsafe code here.
struct Patient<R>(R);

impl<R: Read> Read for Patient<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut pause = std::time::Duration::from_micros(100);
        loop {
            match self.0.read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }
}

/// A reader that fails once its source gives more than [`Options::input_limit`] bytes: the
/// bound on input the file system does not bound ([`MAX_INPUT_BYTES`]).
struct Capped<R> {
    inner: R,
    /// Bytes that may still be read.
    left: u64,
    limit: u64,
    trusted: bool,
    /// What is bounded, for the message (`input`, `inflated stream`).
    what: &'static str,
    /// The whole message past the bound, where the caller words it (a bound of its own).
    message: Option<String>,
}

impl<R: Read> Capped<R> {
    fn new(inner: R, options: &Options, what: &'static str) -> Self {
        let limit = options.input_limit();
        let trusted = options.trusted;
        Capped {
            inner,
            left: limit,
            limit,
            trusted,
            what,
            message: None,
        }
    }

    fn over(&self) -> std::io::Error {
        if let Some(message) = &self.message {
            return limit_reached(message.clone());
        }
        let how = if self.trusted {
            "on trusted input".to_string()
        } else {
            format!(
                "on untrusted input; --trusted-input (trace::Options::trusted in the library) \
                 raises it to {}",
                crate::units::Bytes(self.limit.saturating_mul(TRUSTED_INPUT_FACTOR))
            )
        };
        limit_reached(format!(
            "refused: the {} exceeds the limit of {} {how} (the limits on untrusted files are in docs/trace-format.md)",
            self.what,
            crate::units::Bytes(self.limit)
        ))
    }
}

/// `inner` read to at most `limit` bytes: past them, a read fails with a
/// [`TraceErrorKind::Limit`] error saying `message` (an end, not an error, when the source
/// ends there).
pub(crate) fn capped(inner: impl Read, limit: u64, message: String) -> impl Read {
    Capped {
        inner,
        left: limit,
        limit,
        trusted: false,
        what: "input",
        message: Some(message),
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            // At the limit: the end of the input, or one byte too many.
            let mut one = [0u8; 1];
            return match self.inner.read(&mut one)? {
                0 => Ok(0),
                _ => Err(self.over()),
            };
        }
        let room = usize::try_from(self.left)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = self.inner.read(&mut buf[..room])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Like [`open`], over any reader; `name` stands for the file name in the header and in
/// messages.
///
/// # Errors
/// As [`open`].
pub fn open_reader<R: Read + Send + 'static>(
    reader: R,
    name: &str,
    options: &Options,
) -> Result<Trace> {
    open_sized(reader, name, options, None)
}

/// [`open_reader`], given the size of the input when known.
fn open_sized<R: Read + Send + 'static>(
    reader: R,
    name: &str,
    options: &Options,
    size: Option<u64>,
) -> Result<Trace> {
    // Every message and the header carry the name: its control characters escaped, its
    // length cut, so that a file named to drive a terminal cannot.
    let name = &crate::text::shown_name(name);
    let (prefix, rest) = peek(Box::new(reader), name)?;
    let mut size = size;
    let (prefix, input): (Vec<u8>, Input) = if prefix.starts_with(GZIP_MAGIC) {
        // The size of what it inflates to is not known.
        size = None;
        let (p, gz) = gunzip_layers(prefix, rest, name, options)?;
        // Inflated on a thread of its own while the importer parses (see `inflate`).
        let inflated = inflate::Inflated::spawn(gz).map_err(|e| {
            os_error(
                &e,
                format!("{name}: cannot start a thread to inflate the gzip stream: {e}"),
            )
        })?;
        (p, Box::new(inflated))
    } else {
        (
            prefix.clone(),
            Box::new(BufReader::with_capacity(
                1 << 16,
                Cursor::new(prefix).chain(rest),
            )),
        )
    };
    let format = match options.format {
        Some(f) => f,
        None => detect(&prefix).ok_or_else(|| match not_a_trace(&prefix) {
            Some(what) => not_a_trace_error(format!("{name}: not a trace: {what}")),
            None => not_a_trace_error(format!(
                "{name}: unknown trace format (starts with {}); {}; or name the format explicitly",
                show_prefix(&prefix),
                Format::accepted()
            )),
        })?,
    };
    let mut input = input;
    if prefix.starts_with(BOM) && format != Format::PytorchSnapshot {
        // The readers see the text itself; line numbers do not change.
        let mut bom = [0u8; BOM.len()];
        input.read_exact(&mut bom).map_err(|e| io_error(name, e))?;
    }
    let input: Input = match format {
        Format::Portalloc | Format::RmmCsv | Format::LifetimesCsv => Box::new(BoundedLines {
            inner: input,
            run: 0,
            max: MAX_LINE_BYTES,
        }),
        Format::Kineto | Format::PytorchSnapshot => input,
    };
    let source: Box<dyn TraceSource> = match format {
        Format::Portalloc => {
            let reader = jsonl::Reader::new(input, name, options.strict)?;
            recorded_device_is_asked(reader.header(), name, options)?;
            Box::new(reader)
        }
        Format::RmmCsv => Box::new(import::rmm_csv::RmmCsvReader::new(input, name, options)?),
        Format::LifetimesCsv => Box::new(import::lifetimes_csv::read(input, name, options)?),
        Format::Kineto => Box::new(import::kineto::read(input, name, options)?),
        Format::PytorchSnapshot => Box::new(import::snapshot::read(input, name, options, size)?),
    };
    Ok(Trace::new(format, source))
}

/// Refuses a device choice (`--trace-device`) that a trace of one device's events — the own
/// format, whose header names the device recorded — cannot give: a device it was not
/// recorded on, or any when its header names none. A choice it matches is no choice at all.
fn recorded_device_is_asked(header: &TraceHeader, origin: &str, options: &Options) -> Result<()> {
    let (cpu, device_type, device) = (options.cpu, options.device_type, options.device);
    let asked = match (cpu, device_type, device) {
        (false, None, None) => return Ok(()),
        (true, _, _) => "cpu".to_string(),
        (_, Some(t), Some(d)) => format!("{}:{d}", import::kineto::type_name(t)),
        (_, Some(t), None) => import::kineto::type_name(t),
        (_, None, Some(d)) => format!("device {d}"),
    };
    let Some(recorded) = header.device.as_deref() else {
        return Err(selection_error(format!(
            "{origin}: --trace-device {asked} does not apply: the trace holds one device's \
             events and its header names no device; replay it without --trace-device"
        )));
    };
    let matches = recorded
        .split_whitespace()
        .next()
        .and_then(import::kineto::device_spec)
        .is_some_and(|(r_cpu, r_type, r_device)| {
            (!cpu || r_cpu)
                && device_type.map_or(true, |t| r_type == Some(t))
                && device.map_or(true, |d| r_device == Some(d))
        });
    if matches {
        Ok(())
    } else {
        Err(selection_error(format!(
            "{origin}: no {asked} in this trace: it holds the events of {} only (its header's \
             device); replay it without --trace-device",
            crate::text::cut_escaped(recorded, 120)
        )))
    }
}

type BoxRead = Box<dyn Read + Send>;

/// Reads up to [`SNIFF_BYTES`] from `r`; returns them and the rest of the reader.
fn peek(mut r: BoxRead, name: &str) -> Result<(Vec<u8>, BoxRead)> {
    let mut prefix = Vec::new();
    (&mut r)
        .take(SNIFF_BYTES)
        .read_to_end(&mut prefix)
        .map_err(|e| io_error(name, e))?;
    Ok((prefix, r))
}

fn show_prefix(prefix: &[u8]) -> String {
    let head: Vec<u8> = prefix.iter().copied().take(24).collect();
    if head.is_empty() {
        return "nothing: the input is empty".to_string();
    }
    let printable = head
        .iter()
        .all(|b| b.is_ascii_graphic() || *b == b' ' || *b == b'\n' || *b == b'\r' || *b == b'\t');
    if printable {
        format!("{:?}", String::from_utf8_lossy(&head))
    } else {
        let hex: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
        format!("bytes {}", hex.join(" "))
    }
}

/// Recognises a (decompressed) trace from its first bytes; `None` when no format matches.
pub fn detect(prefix: &[u8]) -> Option<Format> {
    if prefix.first() == Some(&0x80) || is_text_pickle(prefix) {
        return Some(Format::PytorchSnapshot);
    }
    let (text, first_line) = text_start(prefix)?;
    match text.first() {
        Some(b'{') => {
            if contains(first_line, b"\"portalloc-trace\"") {
                Some(Format::Portalloc)
            } else {
                Some(Format::Kineto)
            }
        }
        // A bare array of trace events: `[` then an event object (or `]`, an empty one).
        // Other text in brackets (RMM's debug log, `[ 1234][12:00:00:…]`) is not JSON.
        Some(b'[') => match text[1..].iter().find(|b| !b.is_ascii_whitespace()) {
            None | Some(b'{' | b']') => Some(Format::Kineto),
            Some(_) => None,
        },
        _ => {
            let line = String::from_utf8_lossy(first_line);
            let cols: Vec<String> = line
                .split(',')
                .map(|c| c.trim().trim_matches('"').to_ascii_lowercase())
                .collect();
            let has = |names: &[&str]| names.iter().all(|n| cols.iter().any(|c| c == n));
            if has(&["thread", "time", "action", "pointer", "size", "stream"]) {
                Some(Format::RmmCsv)
            } else if has(&["id", "lower", "upper", "size"]) {
                Some(Format::LifetimesCsv)
            } else {
                None
            }
        }
    }
}

/// The start of a pickle of protocol 0 or 1 (no PROTO opcode): `_dump_snapshot` pickles
/// re-pickled at those protocols start `(dp0\n` (MARK, DICT, PUT) or `}q\0` (EMPTY_DICT,
/// BINPUT). Only sequences no JSON or CSV text starts with: a MARK then DICT or LIST then an
/// opcode that can follow them; EMPTY_DICT or EMPTY_LIST (`}`, `]`) then a memo opcode, a MARK
/// or STOP; or a GLOBAL (`c`, a dotted module name, a line, a name, a line) then an opcode.
fn is_text_pickle(prefix: &[u8]) -> bool {
    let ident = |s: &[u8], dotted: bool| {
        s.first()
            .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
            && s.iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || (dotted && *b == b'.'))
    };
    match prefix {
        // PUT takes a decimal index; the others a value, a nested container, or the end.
        [b'(', b'd' | b'l', b'p', b'0'..=b'9', ..] => true,
        [b'(', b'd' | b'l', next, ..] => b"q.(VSXI}]".contains(next),
        [b'}' | b']', next, ..] => b"q(.".contains(next),
        [b'c', rest @ ..] => {
            let mut lines = rest.splitn(3, |&b| b == b'\n');
            match (lines.next(), lines.next(), lines.next()) {
                (Some(module), Some(name), Some(after)) => {
                    ident(module, true)
                        && ident(name, true)
                        && after.first().is_some_and(|b| b"()pqR}]N.".contains(b))
                }
                _ => false,
            }
        }
        _ => false,
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The UTF-8 byte-order mark some editors and Windows tools put before a text file: skipped
/// by [`detect`] and, before the reader starts, by [`open`] for every text format.
const BOM: &[u8] = b"\xef\xbb\xbf";

/// A text prefix from its first byte that is not a BOM or white space, and its first line:
/// what [`detect`] and [`not_a_trace`] sniff. `None` when there is no such byte.
fn text_start(prefix: &[u8]) -> Option<(&[u8], &[u8])> {
    let text = prefix.strip_prefix(BOM).unwrap_or(prefix);
    let start = text.iter().position(|b| !b.is_ascii_whitespace())?;
    let text = &text[start..];
    let first_line = match text.iter().position(|&b| b == b'\n') {
        Some(n) => &text[..n],
        None => text,
    };
    Some((text, first_line))
}

/// `text` as an unsigned 64-bit integer, or the one wording of every reader for a field that
/// is not one: `<field> <value> is not an integer` or `<field> <value> is out of range
/// (0..=2^64−1)`, the value an excerpt.
pub(crate) fn u64_field(field: &str, text: &str) -> std::result::Result<u64, String> {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{field} {} is not an integer", excerpt(text)));
    }
    match text.parse::<u64>() {
        Ok(v) => Ok(v),
        // `-0` is zero.
        Err(_) if text.starts_with('-') && digits.bytes().all(|b| b == b'0') => Ok(0),
        Err(_) => Err(format!(
            "{field} {} is out of range (0..=2^64−1)",
            excerpt(text)
        )),
    }
}

/// What a file that is no trace [`detect`] knows is, from its first bytes, when it is a file
/// people give by mistake: a sentence naming it and saying what to record instead. `None`
/// when it is nothing known.
fn not_a_trace(prefix: &[u8]) -> Option<String> {
    let (_, first_line) = text_start(prefix)?;
    if import::rmm_csv::is_debug_log(first_line) {
        return Some(import::rmm_csv::DEBUG_LOG_REFUSAL.to_string());
    }
    let line = String::from_utf8_lossy(first_line);
    let line = line.trim();
    if line.starts_with("BufferAssignment:") {
        return Some(
            "an XLA buffer-assignment file, part of an XLA dump: `portalloc replay` reads it \
             (and its module's other files beside it) as it reads the dump directory when it \
             is named as XLA names it, *-buffer-assignment.txt (or .txt.gz); trace::open \
             reads trace files only (the library reads dumps with \
             trace::import::xla_dump::read_path)"
                .to_string(),
        );
    }
    // `HloLiveRange (max 32):`, the first line of `*-live-range.txt` (older XLA:
    // `BufferLiveRange:`).
    if line.starts_with("HloLiveRange (") || line.starts_with("BufferLiveRange:") {
        return Some(
            "an XLA live-range file, part of an XLA dump: give its directory or its \
             `*-buffer-assignment.txt` (`portalloc replay` reads the dump directory, or the \
             module's *-buffer-assignment.txt beside this file; --per-buffer reads the live \
             ranges from there)"
                .to_string(),
        );
    }
    // `nvidia-smi --query-gpu=timestamp,name,memory.used --format=csv` (or
    // `--query-compute-apps=pid,used_gpu_memory`): headers such as `memory.used [MiB]`.
    let sampled = line.split(',').any(|c| {
        let c = c.trim().trim_matches('"').to_ascii_lowercase();
        [
            "memory.used",
            "memory.total",
            "memory.free",
            "memory.reserved",
            "utilization.gpu",
            "utilization.memory",
            "used_gpu_memory",
        ]
        .iter()
        .any(|q| c.starts_with(q))
    });
    if sampled {
        return Some(format!(
            "nvidia-smi's CSV output (header {}): it samples the device's memory totals over \
             time and holds no allocations to replay; record the program's allocations instead \
             (PyTorch: torch.cuda.memory._record_memory_history() then _dump_snapshot(path), or \
             the profiler with profile_memory=True; RMM: rmm.mr.LoggingResourceAdaptor)",
            excerpt(line)
        ));
    }
    None
}

/// Maps source thread ids (which may exceed `u32`) to [`Event::thread`]: values that fit
/// are kept; larger ones get dense ids counting down from `u32::MAX` in order of first
/// appearance.
#[derive(Debug, Default)]
pub(crate) struct ThreadMap {
    big: std::collections::HashMap<u64, u32>,
}

impl ThreadMap {
    pub(crate) fn map(&mut self, raw: u64) -> u32 {
        if let Ok(t) = u32::try_from(raw) {
            return t;
        }
        let n = self.big.len() as u64;
        *self
            .big
            .entry(raw)
            .or_insert_with(|| u32::try_from(u64::from(u32::MAX).saturating_sub(n)).unwrap_or(0))
    }
}

/// A source over events already in memory (the importers that must read everything first).
pub(crate) struct VecSource {
    pub(crate) header: TraceHeader,
    pub(crate) anomalies: Anomalies,
    pub(crate) events: std::vec::IntoIter<Event>,
}

impl Iterator for VecSource {
    type Item = Result<Event>;

    fn next(&mut self) -> Option<Result<Event>> {
        self.events.next().map(Ok)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.events.size_hint()
    }
}

impl TraceSource for VecSource {
    fn header(&self) -> &TraceHeader {
        &self.header
    }

    fn anomalies(&self) -> &Anomalies {
        &self.anomalies
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_map_keeps_small_and_densifies_big() {
        let mut m = ThreadMap::default();
        assert_eq!(m.map(7), 7);
        assert_eq!(m.map(140_573_312_345_856), u32::MAX);
        assert_eq!(m.map(140_573_312_345_857), u32::MAX - 1);
        assert_eq!(m.map(140_573_312_345_856), u32::MAX);
    }
}
