//! Replaying a trace the way the replay tests do: a fresh simulated device of a given
//! capacity, no timeline.

use portalloc::replay::{
    preset, replay, Baseline, DeviceSpec, ReplayOptions, ReplayResult, ReplayStrategy, TraceInput,
};

/// Every strategy replay runs.
pub const STRATEGIES: [ReplayStrategy; 5] = [
    ReplayStrategy::Bfc,
    ReplayStrategy::BfcGrow,
    ReplayStrategy::Vmm,
    ReplayStrategy::Async,
    ReplayStrategy::Platform,
];

/// A simulated device of `capacity` bytes.
pub fn device(capacity: u64) -> DeviceSpec {
    preset::custom(capacity)
}

/// `input` replayed through `strategy` on a [`device`] of `capacity` at `fraction`.
///
/// # Panics
/// When the trace or the replay fails (an out-of-memory is a result, not a failure).
pub fn run(
    input: &TraceInput,
    strategy: ReplayStrategy,
    capacity: u64,
    fraction: f64,
) -> ReplayResult {
    on(input, strategy, device(capacity), fraction)
}

/// `input` replayed through `strategy` on `device` at `fraction`, no timeline.
///
/// # Panics
/// When the trace or the replay fails (an out-of-memory is a result, not a failure).
pub fn on(
    input: &TraceInput,
    strategy: ReplayStrategy,
    device: DeviceSpec,
    fraction: f64,
) -> ReplayResult {
    let baseline = Baseline::scan(input).unwrap();
    let options = ReplayOptions {
        device,
        fraction,
        samples: 0,
        sleep_tags: 0,
    };
    replay(input, &baseline, strategy, &options, None).unwrap()
}
