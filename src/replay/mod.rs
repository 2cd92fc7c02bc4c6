//! Trace replay and the capacity planner: run a trace (or a built-in workload) through each
//! strategy on a simulated device and say how much memory each needs, before a real run
//! finds out.
//!
//! * [`engine::replay`] — one trace × one strategy on a fresh simulated device: peak live,
//!   peak reserved, utilisation, out-of-memory count and the first failing event, device
//!   calls, time per event, a timeline.
//! * [`engine::min_capacity`] — bisection for the smallest device (memory fraction 1.0) that
//!   runs the trace without running out.
//! * [`preset`](mod@preset) — real GPUs' capacities; [`workload`] — built-in workloads.
//!
//! ```
//! use std::sync::Arc;
//!
//! use portalloc::replay::{self, Baseline, ReplayOptions, ReplayStrategy, TraceInput};
//! use portalloc::trace::{Event, Op, TraceHeader};
//!
//! // A trace: 3 MiB of weights held throughout, a 4 MiB temporary, then a 6 MiB one.
//! let steps = [
//!     (Op::Alloc, 1, 3),
//!     (Op::Alloc, 2, 4),
//!     (Op::Free, 2, 4),
//!     (Op::Alloc, 3, 6),
//!     (Op::Free, 3, 6),
//!     (Op::Free, 1, 3),
//! ];
//! let events: Vec<Event> = (0u64..)
//!     .zip(steps)
//!     .map(|(seq, (op, id, mib))| Event {
//!         seq,
//!         time_ns: seq * 1_000,
//!         thread: 0,
//!         stream: 0,
//!         op,
//!         id,
//!         size: mib << 20,
//!         tag: 0,
//!     })
//!     .collect();
//! let input = TraceInput::Events {
//!     header: TraceHeader::new("example"),
//!     events: Arc::new(events),
//! };
//! let baseline = Baseline::scan(&input)?;
//!
//! // Each strategy on a simulated H100 (80 GB), at JAX's default memory fraction.
//! let options = ReplayOptions {
//!     device: replay::preset("h100-80g")?,
//!     fraction: 0.75,
//!     samples: 0,
//!     sleep_tags: 0,
//! };
//! for name in ["bfc", "bfc-grow", "vmm", "platform"] {
//!     let strategy = ReplayStrategy::parse(name)?;
//!     let result = replay::replay(&input, &baseline, strategy, &options, None)?;
//!     assert_eq!((result.strategy, result.events), (name, 6));
//!     // The workload's own demand, the same for every strategy: 3 + 6 MiB.
//!     assert_eq!(result.peak_live, 9 << 20);
//!     assert_eq!(result.oom_count, 0);
//! }
//!
//! // The smallest device on which `platform` runs it, bisected to 2 MiB.
//! let (platform, peak_live, step) = (ReplayStrategy::Platform, 9 << 20, 2 << 20);
//! let min = replay::min_capacity(&input, &baseline, platform, options.device, peak_live, step)?;
//! assert_eq!(min.bytes, Some(10 << 20));
//! # Ok::<(), portalloc::Error>(())
//! ```

pub mod costs;
pub mod engine;
pub mod preset;
pub mod repeat;
pub mod workload;

/// Makes this process's C heap keep the memory it frees for its later allocations rather
/// than hand it back to the kernel at once (glibc: blocks up to 32 MiB come from the heap,
/// and up to 64 MiB free at its top stay there). Returns whether the C library took it;
/// `false` where it is not glibc, which is then left as it was.
///
/// For a program that reads a trace and then replays it, as the `portalloc` command does
/// first thing. Reading frees its buffers just before the replay starts; without this,
/// glibc unmaps them and the replay's own tables fault fresh pages back in. A first touch
/// costs about 3 µs in a virtual machine: on the 3,442 events of the shared GPT-2 eager
/// snapshot that was ~90 faults, a third of vmm's replay time (230 → ~180 ns/event). It is
/// process-wide: a library that embeds portalloc should leave its host's heap alone.
///
/// ```
/// // Safe to call more than once; on glibc both settings are accepted.
/// let kept = portalloc::replay::keep_freed_memory();
/// assert_eq!(kept, cfg!(all(target_os = "linux", target_env = "gnu")));
/// ```
pub fn keep_freed_memory() -> bool {
    crate::backends::host::keep_freed_heap()
}

pub use engine::{
    min_capacity, min_capacity_with, replay, Baseline, Failure, MinCapacity, ReplayOptions,
    ReplayResult, ReplayStrategy, Sample, StepCalls, TraceInput, STRATEGY_NAMES,
};
pub use preset::{preset, DeviceSpec, PRESETS};
