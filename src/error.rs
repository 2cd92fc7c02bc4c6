//! The one error type of portalloc.

use crate::report::OomReport;

/// Everything that can go wrong in portalloc, as a value: nothing panics on bad input.
///
/// Messages say what was wrong and what is accepted.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A size that cannot be served: zero where zero is not allowed, or one that overflows
    /// once rounded up.
    #[error("invalid size {size} bytes: {reason}")]
    InvalidSize {
        /// The size as given.
        size: u64,
        /// Why it was refused and what is accepted.
        reason: &'static str,
    },

    /// An alignment that is not a power of two (or is larger than the strategy supports).
    #[error("invalid alignment {alignment}: accepted is a power of two from 1 to {max}")]
    InvalidAlignment {
        /// The alignment as given.
        alignment: u64,
        /// The largest alignment accepted.
        max: u64,
    },

    /// A request larger than the allocator's memory limit can ever serve.
    #[error("request of {requested} bytes exceeds the allocator's limit of {limit} bytes")]
    ExceedsLimit {
        /// Bytes asked for.
        requested: u64,
        /// The limit (`fraction × total` for most strategies).
        limit: u64,
    },

    /// The allocator could not find memory for a request. Carries an XLA-style report.
    #[error("{0}")]
    OutOfMemory(Box<OomReport>),

    /// Out of memory, as the upstream reported it (`error`: an [`Error::OutOfMemory`] with its
    /// XLA-style report, an [`Error::DeviceOutOfMemory`] or an [`Error::ExceedsLimit`]), with
    /// the diagnosis the [`crate::adaptor::LedgerAllocator`] attached: the verdict, its
    /// evidence and what would help ([`crate::diagnose`]).
    #[error("{error}\n{diagnosis}")]
    OutOfMemoryDiagnosed {
        /// The upstream's error, unchanged.
        error: Box<Error>,
        /// Why memory ran out.
        diagnosis: Box<crate::diagnose::Diagnosis>,
    },

    /// The device (driver, or host capacity) refused an allocation.
    #[error("{backend} device out of memory: {requested} bytes requested, {free} bytes free")]
    DeviceOutOfMemory {
        /// Which backend refused (`host`, `cuda`, `hip`).
        backend: &'static str,
        /// Bytes asked of the device.
        requested: u64,
        /// Bytes the device reported free at the time.
        free: u64,
    },

    /// The system refused host memory (ordinary or page-locked) that portalloc needed: a
    /// host copy of device memory for a sleep, say. Nothing was changed by the call that
    /// needed it.
    #[error(
        "out of host memory: {} ({bytes} bytes) for {what} could not be allocated",
        crate::units::Bytes(*.bytes)
    )]
    HostOutOfMemory {
        /// Bytes asked of the system.
        bytes: u64,
        /// What they were for.
        what: String,
    },

    /// An environment variable or builder option with a value that cannot be used.
    /// The variable and the value are shown cut to [`VALUE_CHARS`] characters, control
    /// characters escaped ([`shown`]): a value can be anything the environment holds.
    #[error("{}={} is not accepted: {accepted}", shown_name(.variable), shown(.value))]
    Config {
        /// The variable (or builder option) name.
        variable: String,
        /// The value as given.
        value: String,
        /// What is accepted.
        accepted: String,
    },

    /// Two settings that cannot be combined.
    #[error("conflicting settings: {0}")]
    ConfigConflict(String),

    /// The strategy or operation is not available on this backend or device.
    #[error("{what} is not supported by the {backend} backend: {reason}")]
    Unsupported {
        /// What was asked for.
        what: String,
        /// The backend asked.
        backend: &'static str,
        /// Why not, and what would help.
        reason: String,
    },

    /// An allocation handed back to an allocator that did not make it.
    #[error("allocation at {ptr:#x} belongs to allocator #{owner}, not to allocator #{this}")]
    ForeignAllocation {
        /// Address of the allocation.
        ptr: u64,
        /// Id of the allocator that made it.
        owner: u64,
        /// Id of the allocator it was handed to.
        this: u64,
    },

    /// A pointer or handle that the device (or allocator) does not know: foreign, or already
    /// freed.
    #[error("{what} {ptr:#x} is not known to the {backend} device (foreign, or already freed)")]
    UnknownPointer {
        /// What kind of thing (`allocation`, `physical handle`, `reservation`, …).
        what: &'static str,
        /// The pointer or handle value.
        ptr: u64,
        /// The backend asked.
        backend: &'static str,
    },

    /// A call with an argument outside what the operation accepts.
    #[error("invalid argument to {call}: {reason}")]
    InvalidArgument {
        /// The operation.
        call: &'static str,
        /// What was wrong and what is accepted.
        reason: String,
    },

    /// A vendor library could not be loaded.
    #[error("could not load {library}: {reason}")]
    LibraryLoad {
        /// The file name or path tried.
        library: String,
        /// The loader's message.
        reason: String,
    },

    /// A required symbol is missing from a loaded vendor library (too old a library).
    #[error("{library} lacks required symbol {symbol}: {reason}")]
    MissingSymbol {
        /// The library.
        library: String,
        /// The symbol.
        symbol: &'static str,
        /// The loader's message.
        reason: String,
    },

    /// A vendor call failed; carries the vendor's own error name and text.
    #[error("{call} failed: {name} ({code}): {message}")]
    Driver {
        /// Which backend (`cuda`, `hip`).
        backend: &'static str,
        /// The call that failed.
        call: &'static str,
        /// The numeric code.
        code: i64,
        /// The vendor's name for it (`CUDA_ERROR_OUT_OF_MEMORY`).
        name: String,
        /// The vendor's text for it.
        message: String,
    },

    /// An operating-system call of the host backend failed.
    #[error("{call} failed: {source}")]
    Os {
        /// The call that failed.
        call: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A trace that cannot be read: not a trace, truncated or corrupt, past a limit on
    /// untrusted input, (strict mode) holding an anomaly, or without what the options ask
    /// for ([`TraceError::kind`](crate::trace::TraceError::kind) says which). The message
    /// names the file and the line or event.
    #[error("trace: {0}")]
    #[cfg(feature = "trace")]
    Trace(crate::trace::TraceError),

    /// A wake ([`crate::Allocator::wake`]) that could not take the device memory its tag
    /// needs. Nothing is lost: the tag stays asleep with its contents, and a wake once memory
    /// is free can succeed.
    #[error(
        "cannot wake tag {}: it needs {} of device memory and {} can be had ({cause}); the \
         tag stays asleep with its contents, and a wake once that much is free can succeed",
        shown(.tag),
        crate::units::Bytes(*.needed),
        crate::units::Bytes(*.available)
    )]
    CannotWake {
        /// The tag (shown cut and escaped: it is the caller's text).
        tag: String,
        /// Bytes of device memory its sleeping allocations need mapped.
        needed: u64,
        /// Bytes the allocator could have had: idle, free elsewhere, or within its budget.
        available: u64,
        /// What refused (the budget, or the device's own error).
        cause: String,
    },

    /// No backend could serve the request (see the discovery report).
    #[error("no usable device: {0}")]
    NoDevice(String),
}

#[cfg(feature = "trace")]
impl From<crate::trace::TraceError> for Error {
    /// [`Error::Trace`]: a reader of the caller's own returns its errors with `?`.
    fn from(e: crate::trace::TraceError) -> Error {
        Error::Trace(e)
    }
}

impl Error {
    /// True for every out-of-memory flavour: allocator-level (with a report), device-level
    /// and host memory.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::OutOfMemory(_)
            | Error::DeviceOutOfMemory { .. }
            | Error::CannotWake { .. }
            | Error::HostOutOfMemory { .. } => true,
            Error::OutOfMemoryDiagnosed { error, .. } => error.is_out_of_memory(),
            _ => false,
        }
    }

    /// The OOM report, when this is an allocator-level out-of-memory error.
    pub fn oom_report(&self) -> Option<&OomReport> {
        match self {
            Error::OutOfMemory(r) => Some(r),
            Error::OutOfMemoryDiagnosed { error, .. } => error.oom_report(),
            _ => None,
        }
    }

    /// The ledger's diagnosis, when this is an [`Error::OutOfMemoryDiagnosed`].
    pub fn diagnosis(&self) -> Option<&crate::diagnose::Diagnosis> {
        match self {
            Error::OutOfMemoryDiagnosed { diagnosis, .. } => Some(diagnosis),
            _ => None,
        }
    }

    /// Shorthand for a [`Error::Config`].
    pub fn config(
        variable: impl Into<String>,
        value: impl Into<String>,
        accepted: impl Into<String>,
    ) -> Self {
        Error::Config {
            variable: variable.into(),
            value: value.into(),
            accepted: accepted.into(),
        }
    }
}

/// The most characters of a value, path or name an error message shows: a real path or
/// variable value fits (a long library path is about 100), and a value of any length (an
/// environment variable, a flag, a file name) keeps the message bounded.
pub const VALUE_CHARS: usize = 256;

/// `text` cut to at most `max` characters, quoted, with control characters escaped (the
/// quoting of `{:?}`), and `…` and the full length in bytes when cut: how a message shows
/// text it does not control, so that it is bounded and cannot drive a terminal.
pub fn quoted_excerpt(text: &str, max: usize) -> String {
    let mut out: String = text.chars().take(max).collect();
    if out.len() < text.len() {
        out.push('…');
        return format!("{out:?} ({} bytes)", text.len());
    }
    format!("{out:?}")
}

/// `text` as a table or header shows it, unquoted: at most `max_chars` characters, the last
/// of them `…` when cut, and control characters escaped as Rust escapes them (`\u{1b}`), so
/// that a name a file gives is bounded and cannot drive the terminal it is printed on.
///
/// # Time complexity
/// O(`max_chars`), whatever the length of `text`.
pub fn cut_escaped(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    for n in 0..max_chars {
        let Some(c) = chars.next() else { break };
        if n + 1 == max_chars && chars.clone().next().is_some() {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A value (or path) as a message shows it: [`quoted_excerpt`] to [`VALUE_CHARS`].
pub fn shown(text: &str) -> String {
    quoted_excerpt(text, VALUE_CHARS)
}

/// A path as a message shows it: lossy UTF-8, then [`shown`].
pub fn shown_path(path: &std::path::Path) -> String {
    shown(&path.to_string_lossy())
}

/// A name (a variable, a flag, a library path) as a message shows it: unquoted when it is
/// short and plain (`PORTALLOC_FRACTION`, `--capacity`, `/usr/lib/libcuda.so.1`), else as
/// [`shown`].
pub fn shown_name(name: &str) -> String {
    let plain = name.chars().count() <= VALUE_CHARS && !name.chars().any(char::is_control);
    if plain {
        name.to_string()
    } else {
        shown(name)
    }
}

/// portalloc's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::cut_escaped;
    use test_case::test_case;

    #[test_case("gpu", 4, "gpu" ; "shorter than the limit is whole")]
    #[test_case("abcd", 4, "abcd" ; "exactly the limit is whole")]
    #[test_case("abcde", 4, "abc…" ; "longer is cut with the ellipsis as the last character")]
    #[test_case("a\u{1b}[31mb", 16, "a\\u{1b}[31mb" ; "an escape sequence is escaped")]
    #[test_case("", 4, "" ; "empty")]
    fn cut_escaped_bounds_and_escapes(text: &str, max: usize, want: &str) {
        assert_eq!(cut_escaped(text, max), want);
    }
}
