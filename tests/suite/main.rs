//! The integration tests: one binary, a module per subject (`cargo test --test suite bfc::`
//! runs one module's; a test's name is `module::name`).
//!
//! One binary rather than one per file: each test binary links portalloc and its dependencies
//! again, and compiled the shared support (`tests/support`) again, so three dozen of them made
//! most of a cold `scripts/test` and of `target/`. The tests here share a process, so none of
//! them may change what the others see of it: none sets an environment variable, installs a
//! global subscriber or hook, or relies on a process-global allocator. Those that must are
//! binaries of their own:
//!
//! * `tests/hermetic.rs` sets every variable portalloc reads to garbage, in the process
//!   environment (which the tests here read: `Config::from_env`, the CLI children inherit it);
//! * `tests/capi.rs` loads the cdylib as C does: its process-global allocator is made from the
//!   environment at first use and never destroyed, and it runs tests of its own binary as
//!   child processes;
//! * `tests/host_device.rs`, the host backend's own tests, which `scripts/reliability` runs
//!   alone under valgrind and the sanitizers.
//!
//! A test here that runs its own binary again (`cuda::cudarc_interop`) names its child with
//! `module_path!()`, so the name stays right wherever the module sits.

// Each subject uses some of the support; with fewer features, fewer subjects are compiled
// and more of it is unused. With every feature, unused support is an error (clippy
// `-D warnings --all-features`).
#[cfg_attr(
    not(all(
        feature = "cuda",
        feature = "hip",
        feature = "cli",
        feature = "c-api",
        feature = "cudarc"
    )),
    allow(dead_code)
)]
#[path = "../support/mod.rs"]
mod support;

mod async_pool;
mod bad_input;
mod bfc;
mod bfc_grow_limit;
mod bfc_model;
mod bounds;
mod budget;
mod buffer;
mod cli;
mod config;
mod conformance;
mod cuda;
mod descriptors;
mod device_costs;
mod diagnose;
mod fault_injection;
mod foreign_streams;
mod graph_pools;
mod hip;
mod kineto_devices;
mod layout;
mod ledger;
mod not_a_trace;
mod peer;
mod pre_window;
mod quiet_steps;
mod read_kinds;
mod replay;
mod replay_figures;
mod review45_probes;
mod review46_probes;
mod review_fold;

mod rocm_profiles;
mod selection;
mod share;
mod sleep;
mod sleep_concurrency;
mod sleep_hold;
mod sleep_world;
mod snapshot_state;
mod stream_order;
mod stress;
mod trace_import;
mod trace_units;
mod vendor_fakes;
mod vendor_layer;
mod vendor_runtimes;
mod vmm;
mod vmm_space_model;
mod vmm_tenant;
mod workload;
mod xla_dump;
