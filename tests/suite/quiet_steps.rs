//! A repeating program pays the driver nothing per step once warm: the built-in GPT-2-small
//! training workload and real traces replayed as repeated steps, on the h100-80g and mi300x
//! presets, counted by the simulated device's call log (every call, not only memory calls):
//! vmm and bfc-grow make no call from the third step on; async makes none but its pool's own
//! `alloc_async` and `free_async`.
#![cfg(feature = "replay")]

use std::sync::Arc;

use portalloc::replay::repeat::repeat;
use portalloc::replay::workload::TransformerTrain;
use portalloc::replay::{
    preset, replay, Baseline, ReplayOptions, ReplayResult, ReplayStrategy, TraceInput,
};
use test_case::test_case;

use crate::support::shared_trace;

fn run(input: &TraceInput, device: &str, strategy: ReplayStrategy) -> ReplayResult {
    let options = ReplayOptions {
        device: preset(device).unwrap(),
        fraction: 0.75,
        samples: 0,
        sleep_tags: 0,
    };
    let baseline = Baseline::scan(input).unwrap();
    replay(input, &baseline, strategy, &options, None).unwrap()
}

/// The calls of steps 3 on that are not the pool's own (async) or any (the others).
fn quiet_breaches(r: &ReplayResult, strategy: ReplayStrategy) -> Vec<String> {
    r.steps
        .iter()
        .enumerate()
        .skip(2)
        .flat_map(|(k, s)| {
            s.by_name
                .by_name
                .iter()
                .filter(move |(&name, _)| {
                    !(strategy == ReplayStrategy::Async
                        && (name == "alloc_async" || name == "free_async"))
                })
                .map(move |(name, (count, _))| format!("step {}: {count} × {name}", k + 1))
        })
        .collect()
}

/// GPT-2 small (12 layers, hidden 768, batch 8, sequence 1024), 5 steps of Adam.
fn gpt2_small_train() -> TraceInput {
    let w = TransformerTrain {
        layers: 12,
        hidden: 768,
        batch: 8,
        seq: 1024,
        steps: 5,
        ..TransformerTrain::default()
    };
    let (header, events) = w.events().unwrap();
    assert_eq!(header.step_starts.len(), 5, "the workload marks its steps");
    TraceInput::Events {
        header,
        events: Arc::new(events),
    }
}

#[test_case("h100-80g", ReplayStrategy::Vmm ; "h100 vmm")]
#[test_case("h100-80g", ReplayStrategy::BfcGrow ; "h100 bfc_grow")]
#[test_case("h100-80g", ReplayStrategy::Async ; "h100 async")]
#[test_case("mi300x", ReplayStrategy::Vmm ; "mi300x vmm")]
#[test_case("mi300x", ReplayStrategy::BfcGrow ; "mi300x bfc_grow")]
#[test_case("mi300x", ReplayStrategy::Async ; "mi300x async")]
fn a_training_loop_makes_no_driver_call_per_step_once_warm(device: &str, s: ReplayStrategy) {
    let r = run(&gpt2_small_train(), device, s);
    let per_step: Vec<u64> = r.steps.iter().map(|s| s.calls).collect();
    eprintln!("{device} {}: driver calls per step {per_step:?}", s.name());
    assert_eq!(r.steps.len(), 5);
    assert_eq!(r.oom_count, 0);
    let breaches = quiet_breaches(&r, s);
    assert!(breaches.is_empty(), "{device} {}: {breaches:?}", s.name());
    if s == ReplayStrategy::Vmm {
        // Quiet for little memory: within the growth slack of the peak live.
        assert!(
            r.peak_reserved as f64 <= r.peak_live as f64 * (1.0 + 1.0 / 16.0) + (64 << 20) as f64,
            "reserved {} for {} live",
            r.peak_reserved,
            r.peak_live
        );
    }
}

/// Real traces, each replayed as four steps of a program that repeats it.
#[test_case("somas-resnet50.csv" ; "resnet50")]
#[test_case("pytorch-snapshot-gpt2-small-compiled.pickle" ; "gpt2 compiled")]
#[test_case("pytorch-kineto-ddp-v100.json.gz" ; "kineto ddp")]
fn a_repeated_real_trace_makes_no_driver_call_per_step_once_warm(file: &str) {
    let Some(path) = shared_trace(false, file) else {
        return;
    };
    let mut t = portalloc::trace::open(&path, &Default::default()).unwrap();
    let header = t.header().clone();
    let events: Vec<_> = t.by_ref().collect::<Result<_, _>>().unwrap();
    let (header, events) = repeat(&header, &events, 4).unwrap();
    let input = TraceInput::Events {
        header,
        events: Arc::new(events),
    };
    for s in [
        ReplayStrategy::Vmm,
        ReplayStrategy::BfcGrow,
        ReplayStrategy::Async,
    ] {
        let r = run(&input, "h100-80g", s);
        let per_step: Vec<u64> = r.steps.iter().map(|s| s.calls).collect();
        eprintln!("{file} {}: driver calls per step {per_step:?}", s.name());
        assert_eq!(r.steps.len(), 4);
        let breaches = quiet_breaches(&r, s);
        assert!(breaches.is_empty(), "{file} {}: {breaches:?}", s.name());
    }
}

/// `driver_calls` is every call; `device_calls` the memory calls only; the calls before the
/// first step and the steps' add up to `driver_calls`.
#[test]
fn the_counts_say_what_they_count() {
    let r = run(&gpt2_small_train(), "h100-80g", ReplayStrategy::Vmm);
    let all: u64 = r.tally.by_name.values().map(|&(c, _)| c).sum();
    assert_eq!(r.driver_calls, all);
    assert!(r.device_calls <= r.driver_calls);
    let in_steps: u64 = r.steps.iter().map(|s| s.calls).sum();
    assert!(in_steps > 0 && r.calls_before_steps > 0);
    assert_eq!(r.calls_before_steps + in_steps, r.driver_calls);
}
