//! The library's GPU paths under every profile of the fake drivers' matrix — CUDA 12 and 10,
//! two CUDA devices without a peer link, CUDA without pinned memory, ROCm 5, 6 and 7, two ROCm
//! devices, and ROCm 7 with each behaviour it was reported to have — each in a fresh process
//! in which the library loads the driver by its usual name (`each_profile!`).
//!
//! `cargo test` passes with no hazard; each `bug-*` feature makes one test fail under every
//! profile, with the hazard the driver logged naming the streams and the range.

use driver_api_ci::{Scaler, FILL};
use portalloc_fakes::{each_profile, Controls, Profile, MATRIX};

/// What `scale(x, y, w, n)` reads and writes, for the driver's race detector: x and y are n
/// floats, w one.
const SCALE: &str = "r:a0:4*i3 w:a1:4*i3 r:a2:4";

/// The library on the profile's driver, with the driver's controls, or `None` when the
/// strategy the environment names cannot run on this driver (a typed refusal: nothing to
/// test).
fn open(profile: &Profile) -> Option<(Scaler, Controls)> {
    let scaler = match Scaler::new() {
        Ok(s) => s,
        Err(driver_api_ci::Error::Portalloc(refused @ portalloc::Error::Unsupported { .. })) => {
            println!("{}: {refused}", profile.name);
            return None;
        }
        Err(e) => panic!("the library on the fake device under {}: {e}", profile.name),
    };
    let controls = Controls::current().expect("the profile's driver");
    controls
        .kernel_model("scale", SCALE)
        .expect("a model the driver reads");
    Some((scaler, controls))
}

/// No hazard, and what the steps read back is what their copies and fills wrote, in stream
/// order (no kernel runs on the fake drivers: the output keeps its fill).
#[track_caller]
fn check(profile: &Profile, scaler: &Scaler, controls: &Controls, results: &[Vec<f32>]) {
    assert_eq!(
        controls.hazards(),
        0,
        "{} under {} (streams upload, compute, side: {:#x?}):\n{}",
        scaler.describe(),
        profile.name,
        scaler.streams(),
        controls.hazard_log().join("\n")
    );
    for r in results {
        assert!(
            r.iter().all(|&v| v == FILL),
            "under {}: {r:?}",
            profile.name
        );
    }
}

fn input(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| seed + i as f32).collect()
}

/// One step: its result is read after its copy back completed (bug-read-before-sync; where
/// host memory cannot be page-locked, the copy back into ordinary memory completes before it
/// returns, and there is nothing to read too early).
#[test]
fn one_step() {
    each_profile!(MATRIX, |profile| {
        let Some((scaler, controls)) = open(profile) else {
            return;
        };
        let result = scaler.step(&input(4096, 1.0)).unwrap().wait().unwrap();
        check(profile, &scaler, &controls, &[result]);
    });
}

/// Two steps in flight at once: the second's input reuses the first's memory only once the
/// first's kernel is done with it (bug-no-wait, bug-free-on-wrong-stream).
#[test]
fn pipelined_steps() {
    each_profile!(MATRIX, |profile| {
        let Some((scaler, controls)) = open(profile) else {
            return;
        };
        let first = scaler.step(&input(4096, 1.0)).expect("the first step");
        let second = scaler.step(&input(4096, 2.0)).expect("the second step");
        let results = [first.wait().unwrap(), second.wait().unwrap()];
        check(profile, &scaler, &controls, &results);
        drop(scaler);
        assert!(
            controls.census().holds_no_memory(),
            "left on the device under {}: {:?}",
            profile.name,
            controls.census()
        );
    });
}

/// Steps on streams of their own: the second one's stream may get the first one's handle,
/// and must not get its memory before the first step's work completed
/// (bug-destroyed-stream).
#[test]
fn steps_on_streams_of_their_own() {
    each_profile!(MATRIX, |profile| {
        let Some((scaler, controls)) = open(profile) else {
            return;
        };
        let first = scaler
            .step_alone(&input(2048, 1.0))
            .expect("the first step");
        let second = scaler
            .step_alone(&input(2048, 3.0))
            .expect("the second step");
        let results = [first.wait().unwrap(), second.wait().unwrap()];
        check(profile, &scaler, &controls, &results);
    });
}

/// The factor changes between steps: its upload waits for the kernel that reads the old one
/// (bug-copy-under-kernel).
#[test]
fn a_new_factor_between_steps() {
    each_profile!(MATRIX, |profile| {
        let Some((scaler, controls)) = open(profile) else {
            return;
        };
        let first = scaler.step(&input(1024, 1.0)).expect("the first step");
        scaler.set_factor(3.0).expect("a new factor");
        let second = scaler.step(&input(1024, 1.0)).expect("the second step");
        let results = [first.wait().unwrap(), second.wait().unwrap()];
        check(profile, &scaler, &controls, &results);
    });
}
