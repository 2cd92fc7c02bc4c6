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

pub mod engine;
pub mod preset;
pub mod workload;

pub use engine::{
    min_capacity, replay, Baseline, Failure, MinCapacity, ReplayOptions, ReplayResult,
    ReplayStrategy, Sample, TraceInput, STRATEGY_NAMES,
};
pub use preset::{preset, DeviceSpec, PRESETS};
