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

    /// An operation the strategy does not offer on any device (sleep and wake with bfc,
    /// platform or async): the strategy refuses it, whatever the backend beneath.
    #[error("{what} is not offered by strategy `{strategy}`: {reason}")]
    StrategyUnsupported {
        /// What was asked for.
        what: String,
        /// The strategy asked (`bfc`, `platform`, `async`).
        strategy: String,
        /// Why not, and which strategy offers it.
        reason: String,
    },

    /// The driver could not make another physical handle because the process has no file
    /// descriptor left: it spends one per handle (ROCm 7.14's `hipMemCreate`,
    /// ROCm/rocm-systems#10604), and the process holds as many as its soft `RLIMIT_NOFILE`
    /// allows. The driver itself answers out of memory with the device nearly empty. Nothing
    /// was changed by the call that needed the handle; closing descriptors, fewer and larger
    /// handles, or a higher limit (`ulimit -n`) let the next one through. Not
    /// [`Error::is_out_of_memory`] (the device has memory, so no strategy frees or moves its
    /// own for it); the C ABI reports it as `PORTALLOC_STATUS_OUT_OF_MEMORY`.
    #[error(
        "{backend} device: no file descriptor left for another physical handle of {} — the \
         driver opens one per handle and the process holds {open} of its limit of {limit} \
         (RLIMIT_NOFILE, soft; hard {}); raise `ulimit -n` or close descriptors",
        crate::units::Bytes(*.requested),
        .hard.map_or_else(|| "unlimited".to_string(), |h| h.to_string())
    )]
    DescriptorLimit {
        /// Which backend refused (`hip`).
        backend: &'static str,
        /// Bytes of the handle asked for.
        requested: u64,
        /// Descriptors the process held when it was refused.
        open: u64,
        /// The soft `RLIMIT_NOFILE`: the most descriptors the process may hold.
        limit: u64,
        /// The hard limit, to which the soft one may be raised (`None`: unlimited).
        hard: Option<u64>,
    },

    /// A request on a stream being captured into a graph that cannot be served without what
    /// the capture forbids or would break: its graph pool had no block for it and the
    /// strategy beneath could not give one (`reason`, its own error), or the request came
    /// with no graph pool to serve it. Nothing was changed, and the capture was not
    /// invalidated by portalloc. Not [`Error::is_out_of_memory`]: the stream's capture, not
    /// the device, decides. The C ABI reports it as `PORTALLOC_STATUS_OUT_OF_MEMORY`.
    #[error(
        "a request of {} on stream {stream:#x}, which is being captured into a graph (capture          {capture}), cannot be served: {reason}. Memory for a captured graph comes from its graph          pool ({pool}); warm up before capturing (run the step once eagerly, so the pool's          strategy holds the memory), or give the pool room (a lower PORTALLOC / XLA memory          fraction for the other users of the device)",
        crate::units::Bytes(*.requested)
    )]
    StreamCapturing {
        /// The stream's raw handle.
        stream: u64,
        /// The capture's id (the driver's).
        capture: u64,
        /// Bytes asked for.
        requested: u64,
        /// The graph pool that would have served it (`graph pool 3, 48 MiB held, 2 MiB
        /// free`), or why none did.
        pool: String,
        /// What refused it (the strategy's error).
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

    /// Out of memory after asking the other processes of the device's shared budget: the
    /// upstream's error, and the budget's report (every member, what it holds, what each ask
    /// got, settings that would let them run together).
    #[error("{error}\n{budget}")]
    OutOfMemoryShared {
        /// The upstream's last error, unchanged.
        error: Box<Error>,
        /// The shared budget's report.
        budget: Box<crate::budget_report::BudgetReport>,
    },

    /// A shared-budget segment that cannot be used: another user's, another layout version,
    /// corrupt, truncated, or full. Whoever met it runs alone.
    #[error("shared budget segment {path} cannot be used: {reason}")]
    SharedSegment {
        /// The segment's file.
        path: String,
        /// What was wrong, and what is accepted.
        reason: String,
    },

    /// Bytes read as a [`crate::share::ShareHandle`] that are not one: damaged, forged, from
    /// another layout version.
    #[error("not a usable share handle: {reason}")]
    ShareHandle {
        /// What was wrong, and what is accepted.
        reason: String,
    },

    /// An export or import of memory between processes that cannot be done: the exporter
    /// withdrew it or exited, the descriptors cannot be fetched, the devices differ.
    #[error("cannot {what}: {reason}")]
    Share {
        /// What was asked (`import an allocation`, `export an allocation`).
        what: &'static str,
        /// Why not, and what would work.
        reason: String,
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
            Error::OutOfMemoryShared { .. } => true,
            _ => false,
        }
    }

    /// The OOM report, when this is an allocator-level out-of-memory error.
    pub fn oom_report(&self) -> Option<&OomReport> {
        match self {
            Error::OutOfMemory(r) => Some(r),
            Error::OutOfMemoryDiagnosed { error, .. } | Error::OutOfMemoryShared { error, .. } => {
                error.oom_report()
            }
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

// How messages show text they do not control lives in `crate::text`, which the trace readers
// use too without importing this module (whose `Error` holds their `TraceError`): re-exported
// here, where callers have found it.
pub use crate::text::{cut_escaped, quoted_excerpt, shown, shown_name, shown_path, VALUE_CHARS};

/// portalloc's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
