//! Fake CUDA drivers and HIP runtimes, for testing the CUDA and ROCm paths of GPU code on a
//! machine without a GPU.
//!
//! Each driver ([`Driver`]) is a small C library built by this crate's build script: it
//! exports the common surface of the CUDA driver API (`libcuda.so.1`'s symbols) or of the HIP
//! runtime API (`libamdhip64.so`'s) — memory, copies, memsets, streams, events, contexts,
//! pointer attributes, virtual memory, pools, modules and launches, `cuGetProcAddress` /
//! `hipGetProcAddress` — with the vendors' signatures, error codes and documented rules, over
//! host memory. A **profile** ([`Profile`]) is a driver and the environment that selects one
//! of its personalities: a CUDA or ROCm version on the device of its day, a driver without
//! virtual memory, two devices without a peer link, host memory that cannot be page-locked, or
//! a behaviour ROCm was reported to have (each named after its public bug report). [`MATRIX`]
//! is every profile to iterate over; [`EXTRA`] holds those only a test written for them can
//! see (a descriptor per ROCm handle), run where named.
//!
//! What they model:
//!
//! * **memory that is memory**: every address is real host memory, so copies and memsets move
//!   bytes — when their stream reaches them, as on a GPU;
//! * **streams as the vendors define them**: work completes in stream order; the legacy
//!   default stream orders itself with blocking streams and not with non-blocking ones; each
//!   thread has its own per-thread default stream (and the `_ptsz`/`_ptds` calls); a
//!   destroyed stream's handle comes back for the next one; the calls the vendors document
//!   as synchronising (`cuMemFree`, `hipFree`, synchronous copies) wait, and are counted;
//! * **a race detector**: a kernel (held in flight by the test, or launched by the code under
//!   test with a [kernel model](Controls::kernel_model) saying what it touches), a copy or a
//!   memset that conflicts with work in flight on another stream, with nothing ordering it
//!   after, is a hazard naming both, their streams and ranges; so is memory given back or
//!   handed out under such work, and a CPU access to pinned memory a copy has yet to write.
//!
//! No kernel runs and there is no timing: a launched kernel stays in flight until the test
//! finishes it or a CPU wait covers it. `docs/fakes.md` lists every call and what is
//! modelled, with each device value's source.
//!
//! The code under test is pointed at a driver through the environment ([`Profile::env`]): the
//! vendor's library variable portalloc reads (`PORTALLOC_CUDA_LIBRARY`,
//! `PORTALLOC_HIP_LIBRARY`), and the loader's path, on which the driver carries the vendor's
//! library names ([`Driver::soname_dir`]) for code that loads `libcuda.so.1` or
//! `libamdhip64.so` itself. A driver keeps its state per loaded library, so a test that wants
//! a fresh driver runs in a fresh process ([`each_profile()`], [`each_profile!`]).
//!
//! Each process has a device of its own unless [`SHARED_VARIABLE`] (`FAKE_SHARED_DEVICE`)
//! names a segment: then the processes that name it share one device, as on a real machine
//! ([`SharedDevice`]).
//!
//! ```
//! use portalloc_fakes::{Driver, MATRIX};
//!
//! // Every driver is built, and each profile names one.
//! assert!(Driver::FAKEHIP.path().exists());
//! assert!(MATRIX.iter().any(|p| p.name == "rocm5"));
//! ```

mod controls;
mod profiles;
mod runner;
mod shared;

pub use controls::{Call, Census, Code, Controls, ControlsError, Kernel, ModelError, KIT_VERSION};
pub use profiles::{
    profile, Driver, Profile, Vendor, DIR_VARIABLE, EXTRA, MATRIX, PROFILE_VARIABLE,
};
#[doc(hidden)]
pub use runner::test_name_from as __test_name_from;
pub use runner::{each_profile, Runner, SHOW_VARIABLE, TIMEOUT_VARIABLE};
pub use shared::{
    Holder, Segment, SharedDevice, SharedObject, SHARED_LAYOUT_VERSION, SHARED_VARIABLE,
};
