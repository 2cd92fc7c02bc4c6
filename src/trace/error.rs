//! The error of every trace reader: what kind of failure, and a bounded message that names
//! the file, the line or event, and what was wrong.
#![deny(unsafe_code)]

use std::fmt;
use std::io;

/// The most characters of a trace error message: whatever a parser quotes of a file (a JSON
/// library's "invalid type: string …" quotes the whole string) stays bounded.
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// What kind of failure a [`TraceError`] is, for a caller that acts on it: raise a limit
/// (`--trusted-input`), name another file, fix the options, or retry the read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TraceErrorKind {
    /// Not a trace of any format read here, or not of the format named: another kind of file
    /// (a pickle of another object, RMM's debug log, nvidia-smi's CSV, an empty file).
    NotATrace,
    /// Of a known format, but truncated, corrupt, or holding a value its field cannot (a
    /// number out of range where it is read).
    Malformed,
    /// A bound on untrusted input was reached: the bytes read or inflated, one value's or
    /// line's length, a pickle's values, the events a replay holds. `--trusted-input`
    /// (`Options::trusted`) raises them; docs/trace-format.md lists them.
    Limit,
    /// An anomaly (a free of an address never allocated, a double free, …) in strict mode.
    Anomaly,
    /// What the options ask of the file is not in it, or does not apply to it: a device it
    /// has no events of, a module it does not hold, steps it cannot be given.
    Selection,
    /// The file could not be opened, read or written (not its content: the operating
    /// system's error, whose [`io::ErrorKind`] [`TraceError::io_error_kind`] keeps).
    Io,
    /// What a trace writer was given, the format cannot hold (a `seq` not above the one
    /// before, a tag outside the header's table, more tags than it numbers): the caller's.
    Unwritable,
    /// An option's value is none the readers accept (`--format`, `--trace-device`): the
    /// message names the option, the value and what is accepted.
    InvalidOption,
}

/// Why a trace could not be read: its [`TraceErrorKind`], and a message with the source, the
/// line or event, and what was wrong: at most [`MAX_MESSAGE_CHARS`] characters and, where it
/// was cut there, a count of the rest (`… (N more characters)`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TraceError {
    kind: TraceErrorKind,
    message: String,
    /// The operating system's kind of error, for an [`TraceErrorKind::Io`] (and a read error
    /// of another kind that came from an [`io::Error`]): a caller tells a missing file from
    /// one it may not read without parsing the message.
    io: Option<io::ErrorKind>,
}

/// The result of the trace readers and writers.
pub type Result<T, E = TraceError> = std::result::Result<T, E>;

impl TraceError {
    /// An error of `kind`, its message cut to [`MAX_MESSAGE_CHARS`] (for a reader of a
    /// format of the caller's own, or a tool that reports its own trace failures alike).
    pub fn new(kind: TraceErrorKind, message: impl Into<String>) -> TraceError {
        let message = message.into();
        let chars = message.chars().count();
        let message = if chars <= MAX_MESSAGE_CHARS {
            message
        } else {
            let mut cut: String = message.chars().take(MAX_MESSAGE_CHARS).collect();
            cut.push_str(&format!(
                "… ({} more characters)",
                chars - MAX_MESSAGE_CHARS
            ));
            cut
        };
        TraceError {
            kind,
            message,
            io: None,
        }
    }

    /// The error of `e`, an [`io::Error`], with `message` (which names what failed and
    /// quotes `e`): a [`TraceErrorKind::Limit`] for a bound reached, a
    /// [`TraceErrorKind::Malformed`] for bytes that are not what they claim (invalid data, a
    /// stream cut short), else a [`TraceErrorKind::Io`]; keeping its [`io::ErrorKind`].
    pub fn from_io(e: &io::Error, message: impl Into<String>) -> TraceError {
        TraceError {
            io: Some(e.kind()),
            ..TraceError::new(io_kind(e), message)
        }
    }

    /// An [`TraceErrorKind::InvalidOption`]: `option`'s `value` is not accepted, `accepted`
    /// saying what is (both cut and escaped as messages show text they do not control).
    pub fn invalid_option(option: &str, value: &str, accepted: &str) -> TraceError {
        TraceError::new(
            TraceErrorKind::InvalidOption,
            format!(
                "{}={} is not accepted: {accepted}",
                crate::text::shown_name(option),
                crate::text::shown(value)
            ),
        )
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> TraceErrorKind {
        self.kind
    }

    /// The operating system's [`io::ErrorKind`] where the failure was an [`io::Error`]
    /// (`NotFound`, `PermissionDenied`, …); `None` for a failure of the content.
    ///
    /// ```
    /// use portalloc::trace::{open, Options, TraceErrorKind};
    ///
    /// let e = open("/nonexistent/trace.json", &Options::default()).unwrap_err();
    /// assert_eq!(e.kind(), TraceErrorKind::Io);
    /// assert_eq!(e.io_error_kind(), Some(std::io::ErrorKind::NotFound));
    /// ```
    pub fn io_error_kind(&self) -> Option<io::ErrorKind> {
        self.io
    }

    /// The message (without the `trace: ` that [`Error`](crate::Error)'s display puts before it).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error as another kind (an I/O error that is the operating system's, whatever
    /// [`TraceError::from_io`] would call it).
    #[must_use]
    pub(crate) fn with_kind(self, kind: TraceErrorKind) -> TraceError {
        TraceError { kind, ..self }
    }

    /// The same error, its message after `label: ` (the file a command line read, say): the
    /// message is not cut again.
    #[must_use]
    pub fn within(self, label: &str) -> TraceError {
        TraceError {
            message: format!("{label}: {}", self.message),
            ..self
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TraceError {}

/// A bound reached while reading, carried inside an [`io::Error`] through the readers in
/// between (gzip, CSV), so that the error it becomes is a [`TraceErrorKind::Limit`].
#[derive(Debug)]
struct LimitReached(String);

impl fmt::Display for LimitReached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LimitReached {}

/// The [`io::Error`] of a bound reached while reading (`message` says which, and how to
/// raise it).
pub(crate) fn limit_reached(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, LimitReached(message))
}

/// The kind of failure a read error is: a bound ([`limit_reached`]), the bytes not being
/// what they claim (a corrupt gzip stream, invalid UTF-8, a stream cut short), or the
/// operating system's.
pub(crate) fn io_kind(e: &io::Error) -> TraceErrorKind {
    if e.get_ref().is_some_and(|inner| inner.is::<LimitReached>()) {
        TraceErrorKind::Limit
    } else if matches!(
        e.kind(),
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidInput | io::ErrorKind::UnexpectedEof
    ) {
        TraceErrorKind::Malformed
    } else {
        TraceErrorKind::Io
    }
}
