//! The bounds a pickle read stays within, what it used of them, and how it fails.
#![deny(unsafe_code)]

use std::fmt;

/// The bounds a read stays within. [`Limits::UNTRUSTED`] is what the snapshot importer uses.
/// [`Default`]: all zero, which is where a read's [`Figures`] start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Bytes of (decompressed) input: bounds the time a read takes.
    pub(crate) input_bytes: u64,
    /// Values pushed on the stack: new objects, memo gets, `DUP`s, items copied by
    /// `set()`/`list()` calls. Each is at most one node, one stack slot and one container slot.
    pub(crate) values: u64,
    /// Containers built (lists, tuples, dicts, sets, instances): each also holds a `Vec`.
    pub(crate) containers: u64,
    /// Distinct memo entries.
    pub(crate) memo_entries: u64,
    /// Bytes of strings, bytes objects, integers wider than 64 bits and protocol 0 text
    /// arguments (one line each), read or made.
    pub(crate) payload_bytes: u64,
    /// Marks open at once.
    pub(crate) open_marks: u64,
    /// Steps of the walk over the result: dict pairs compared, list items visited.
    pub(crate) walk_steps: u64,
}

impl Limits {
    /// The limits on untrusted files (`docs/trace-format.md`, "Limits on untrusted files").
    /// Each is at least 8 times what the largest real snapshot measured needs (the test
    /// `real_snapshots_stay_far_below_the_limits` checks it on the files at hand), and all of
    /// them reached at once keep the reader well under 512 MiB.
    pub(crate) const UNTRUSTED: Limits = Limits {
        input_bytes: 1 << 30,
        values: 8_000_000,
        containers: 640_000,
        memo_entries: 1_000_000,
        payload_bytes: 16 << 20,
        open_marks: 4096,
        walk_steps: 16_000_000,
    };

    pub(super) fn of(&self, limit: Limit) -> u64 {
        match limit {
            Limit::InputBytes => self.input_bytes,
            Limit::Values => self.values,
            Limit::Containers => self.containers,
            Limit::MemoEntries => self.memo_entries,
            Limit::PayloadBytes => self.payload_bytes,
            Limit::OpenMarks => self.open_marks,
            Limit::WalkSteps => self.walk_steps,
        }
    }
}

impl Limits {
    /// The limits for a file its user trusts (`trace::Options::trusted`, `portalloc replay
    /// --trusted-input`): 16 times [`Limits::UNTRUSTED`], for snapshots recorded with long
    /// histories and stack frames (a 100,000-entry history with frames needs millions of
    /// containers). Memory then grows with the file, up to a few GiB.
    pub(crate) const TRUSTED: Limits = Limits {
        input_bytes: 16 << 30,
        values: 16 * Limits::UNTRUSTED.values,
        containers: 16 * Limits::UNTRUSTED.containers,
        memo_entries: 16 * Limits::UNTRUSTED.memo_entries,
        payload_bytes: 16 * Limits::UNTRUSTED.payload_bytes,
        open_marks: 16 * Limits::UNTRUSTED.open_marks,
        walk_steps: 16 * Limits::UNTRUSTED.walk_steps,
    };
}

// Offsets into the payload and indices into the arena are u32: the limits keep them there.
const _: () = assert!(Limits::TRUSTED.payload_bytes < u32::MAX as u64);
const _: () = assert!(Limits::TRUSTED.values < u32::MAX as u64);
const _: () = assert!(Limits::TRUSTED.containers < u32::MAX as u64);
// The arena of container items holds at most four slots per value pushed (see `Seqs`).
const _: () = assert!(Limits::TRUSTED.values < u32::MAX as u64 / 4);

/// Which of the [`Limits`] a file exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// [`Limits::input_bytes`].
    InputBytes,
    /// [`Limits::values`].
    Values,
    /// [`Limits::containers`].
    Containers,
    /// [`Limits::memo_entries`].
    MemoEntries,
    /// [`Limits::payload_bytes`].
    PayloadBytes,
    /// [`Limits::open_marks`].
    OpenMarks,
    /// [`Limits::walk_steps`].
    WalkSteps,
}

impl Limit {
    /// The name used in messages and in `docs/trace-format.md`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Limit::InputBytes => "input bytes",
            Limit::Values => "values pushed",
            Limit::Containers => "containers",
            Limit::MemoEntries => "memo entries",
            Limit::PayloadBytes => "payload bytes",
            Limit::OpenMarks => "open marks",
            Limit::WalkSteps => "walk steps",
        }
    }
}

/// Why a pickle was not read. Messages are bounded: they quote no input but an opcode byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PickleError {
    /// A limit on untrusted files was exceeded.
    Limit {
        /// Which one.
        limit: Limit,
        /// The value it would have reached.
        reached: u64,
        /// The limit's value.
        max: u64,
        /// Offset of the opcode being read (`None` for the walk over the result).
        offset: Option<u64>,
    },
    /// Not a pickle this reader accepts: truncated, corrupt, or holding what snapshots never do.
    Malformed {
        /// What was wrong.
        detail: String,
        /// Offset of the opcode being read.
        offset: u64,
    },
    /// The input could not be read (a corrupt gzip stream, a limit on what it inflates to,
    /// an I/O error): what kind of failure, and the reader's message.
    Io(crate::trace::TraceErrorKind, String),
    /// A pickle of an object of another kind than a snapshot's dict, built from a global
    /// (a class or function: `collections.deque`, `numpy.core.multiarray._reconstruct`), that
    /// this reader could not read to its end: what the snapshot reader has no use for
    /// (appending to a deque, setting an item of an `OrderedDict`) is refused.
    Foreign {
        /// The global, `module.name`, cut and escaped as [`global_name`] gives it.
        global: String,
        /// Why the read stopped.
        detail: String,
        /// Offset of the opcode being read when it stopped.
        offset: u64,
    },
}

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PickleError::Limit {
                limit,
                reached,
                max,
                offset,
            } => {
                write!(
                    f,
                    "exceeds the limit on {} ({reached} > {max}",
                    limit.name()
                )?;
                if let Some(at) = offset {
                    write!(f, ", at byte {at}")?;
                }
                f.write_str(")")
            }
            PickleError::Malformed { detail, offset } => write!(f, "{detail} at byte {offset}"),
            PickleError::Io(_, e) => write!(f, "read failed: {e}"),
            PickleError::Foreign {
                global,
                detail,
                offset,
            } => write!(
                f,
                "a pickle of {global} (read up to byte {offset}, where {detail})"
            ),
        }
    }
}

/// What a read used, against each of the [`Limits`] (for tests and for choosing the limits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    /// The figure of each limit (`walk_steps` stays 0: the walk over the result counts its
    /// own, [`Pickle::walk_steps`]).
    pub(crate) used: Limits,
    /// Nodes in the arena (values pushed that were new objects).
    pub(crate) nodes: u64,
}
