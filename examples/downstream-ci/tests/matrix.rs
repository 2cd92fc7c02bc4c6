//! The library's GPU paths under every profile of the fake drivers' matrix: CUDA 12 and 10,
//! CUDA without peer access or pinned memory, ROCm 5, 6 and 7, and ROCm 7 with each behaviour
//! it was reported to have. Each profile runs in a fresh process that loads its driver anew
//! (`portalloc_fakes::each_profile`).
//!
//! `cargo test` passes; `cargo test --features planted-bug` fails under every profile, naming
//! the race the driver logged: the second step's copy into memory the first step's kernel
//! still reads. Both run under any strategy (`PORTALLOC_ALLOCATOR=vmm cargo
//! test`, say): where a profile's driver lacks what the strategy needs, portalloc refuses with
//! a typed error and that profile has nothing to test.

use downstream_ci::Pipeline;
use portalloc_fakes::{Controls, MATRIX};

/// A step's buffer, read by a kernel on the other stream that is still running, is not
/// written by the next step's copy under it, nor given back to the device under it —
/// whatever the strategy does with it (keep it, hand it out again, unmap it, trim it) — and
/// nothing is left on the device at the end.
#[test]
fn a_buffer_read_on_another_stream_is_not_reused_under_the_kernel() {
    portalloc_fakes::each_profile!(MATRIX, |profile| {
        let driver = Controls::open(profile.library()).expect("the profile's driver");
        let pipeline = match Pipeline::new() {
            Ok(pipeline) => pipeline,
            // The strategy the environment names (PORTALLOC_ALLOCATOR=vmm, say) needs what
            // this driver lacks: a typed refusal, which is right; nothing to test here.
            Err(refused @ portalloc::Error::Unsupported { .. }) => {
                println!("{}: {refused}", profile.name);
                return;
            }
            Err(e) => panic!("portalloc on the fake device under {}: {e}", profile.name),
        };
        let mut kernels = Vec::new();
        let data = vec![7u8; 4 << 20];
        for _ in 0..2 {
            pipeline
                .step(&data, |ptr, size, stream| {
                    // The kernel reads the buffer, and runs until the test says it is
                    // done.
                    kernels.extend(driver.launch(stream.as_raw(), ptr, size));
                })
                .expect("the step");
        }
        assert_eq!(kernels.len(), 2, "the kernels were launched");
        pipeline.release().expect("the cache is given back");
        assert_eq!(
            driver.hazards(),
            0,
            "{} under {}: memory reused or given back under a running kernel:\n{}",
            pipeline.strategy(),
            profile.name,
            driver.hazard_log().join("\n")
        );
        driver.finish_all();
        drop(pipeline);
        assert!(
            driver.census().holds_no_memory(),
            "left on the device under {}: {:?}",
            profile.name,
            driver.census()
        );
    });
}
