//! `ConfigBuilder::ignore_env()` is hermetic: with every variable portalloc reads
//! (`Config::VARIABLES`, the XLA/TF ones included) set to garbage in the process environment,
//! a configuration built with `ignore_env()` is exactly the defaults, and discovery,
//! `Portalloc::from_config` and the ledger's options built from it read none of them. Without
//! `ignore_env()`, each of those values alone is a typed `Error::Config` naming its variable.
//!
//! These tests set process environment variables: every test of this binary holds `ENV`
//! while it does, and puts back what was there before.

// A binary of its own (see tests/suite/main.rs): it uses a part of the support only.
#[allow(dead_code)]
#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Mutex, MutexGuard};

use portalloc::adaptor::LedgerOptions;
use portalloc::config::{self, Config, Source, VARIABLES};
use portalloc::{Error, Portalloc, StrategyKind, Vendor};
use test_case::test_case;

/// One test at a time in the process environment.
static ENV: Mutex<()> = Mutex::new(());

/// The environment variables a test set, put back as they were when dropped (after a panic
/// too), with `ENV` held meanwhile.
struct Environment {
    previous: Vec<(&'static str, Option<OsString>)>,
    _lock: MutexGuard<'static, ()>,
}

impl Environment {
    fn set(vars: &[(&'static str, OsString)]) -> Environment {
        let lock = ENV.lock().unwrap_or_else(|p| p.into_inner());
        let previous = vars
            .iter()
            .map(|(name, _)| (*name, std::env::var_os(name)))
            .collect();
        for (name, value) in vars {
            std::env::set_var(name, value);
        }
        Environment {
            previous,
            _lock: lock,
        }
    }
}

impl Drop for Environment {
    fn drop(&mut self) {
        for (name, value) in &self.previous {
            match value {
                Some(v) => std::env::set_var(name, v),
                None => std::env::remove_var(name),
            }
        }
    }
}

/// Bytes that are not UTF-8.
fn not_utf8() -> OsString {
    OsStr::from_bytes(b"\xff\xfe garbage \xc3").to_os_string()
}

/// A value for each variable that its reader refuses: unknown names, out-of-range numbers,
/// paths with control characters. `XLA_PYTHON_CLIENT_PREALLOCATE` reads every text as true
/// (JAX's rule), so its garbage is bytes that are not UTF-8.
fn refused_text() -> Vec<(&'static str, OsString)> {
    [
        (config::PORTALLOC_ALLOCATOR, "nope"),
        (config::XLA_PYTHON_CLIENT_ALLOCATOR, "cuda_malloc_async"),
        (config::TF_GPU_ALLOCATOR, "bfc"),
        (config::PORTALLOC_MEM_FRACTION, "1.5"),
        (config::XLA_CLIENT_MEM_FRACTION, "0"),
        (config::XLA_PYTHON_CLIENT_MEM_FRACTION, "-0.5"),
        (config::PORTALLOC_PREALLOCATE, "maybe"),
        (config::TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC, "-2"),
        (config::PORTALLOC_BACKEND, "gpu"),
        (config::PORTALLOC_HOST_CAPACITY, "0"),
        (config::PORTALLOC_HOST_SIMULATED, "2"),
        (config::PORTALLOC_HOST_DEVICES, "65"),
        (config::PORTALLOC_PEER_ACCESS, "sometimes"),
        (config::PORTALLOC_BACKTRACE, "-1"),
        (config::PORTALLOC_CUDA_LIBRARY, "/tmp/\nlibcuda.so.1"),
        (config::PORTALLOC_HIP_LIBRARY, "libamdhip64\t.so"),
        (config::ROCM_PATH, "/opt/rocm\n"),
        (config::HIP_PATH, "\u{7f}"),
        (config::PORTALLOC_HIP_MEMORY, "fast"),
        (config::HSA_XNACK, "2"),
    ]
    .into_iter()
    .map(|(name, text)| (name, OsString::from(text)))
    .chain([(config::XLA_PYTHON_CLIENT_PREALLOCATE, not_utf8())])
    .collect()
}

/// Every variable set to bytes that are not UTF-8.
fn not_utf8_everywhere() -> Vec<(&'static str, OsString)> {
    VARIABLES.iter().map(|name| (*name, not_utf8())).collect()
}

#[test]
fn the_garbage_covers_every_variable() {
    let every: BTreeSet<&str> = VARIABLES.iter().copied().collect();
    let covered: BTreeSet<&str> = refused_text().iter().map(|(name, _)| *name).collect();
    assert_eq!(covered, every);
    assert_eq!(refused_text().len(), VARIABLES.len(), "one value each");
}

/// With every variable garbage, `ignore_env()` gives the defaults, and everything built from
/// them reads nothing: the host device, one bfc allocator with 0.75 of its memory, peer
/// access off, the ledger without backtraces.
#[test_case(refused_text() ; "values the readers refuse")]
#[test_case(not_utf8_everywhere() ; "values that are not UTF-8")]
fn ignore_env_reads_no_variable(garbage: Vec<(&'static str, OsString)>) {
    let _env = Environment::set(&garbage);
    let config = Config::builder().ignore_env().build().unwrap();
    assert_eq!(config, Config::default());
    for (setting, _, source) in config.describe() {
        assert_eq!(source, "default", "{setting}");
    }
    // Discovery probes the libraries the defaults name: no probe mentions a variable, or
    // the value of a path variable, or bytes that are not UTF-8.
    let discovery = portalloc::discover(&config).unwrap();
    let paths = [
        config::PORTALLOC_CUDA_LIBRARY,
        config::PORTALLOC_HIP_LIBRARY,
        config::ROCM_PATH,
        config::HIP_PATH,
    ];
    for candidate in &discovery.candidates {
        let probed = format!("{:?}", candidate.probe);
        assert!(!probed.contains('\u{fffd}'), "{probed}");
        for (name, value) in &garbage {
            let value = value.to_string_lossy();
            assert!(!probed.contains(name), "{name} reached discovery: {probed}");
            assert!(
                !(paths.contains(name) && probed.contains(value.as_ref())),
                "{name}={value:?} reached discovery: {probed}"
            );
        }
    }
    drop(discovery);

    let host = Config::builder()
        .ignore_env()
        .backend(Some(Vendor::Host))
        .build()
        .unwrap();
    let p = Portalloc::from_config(host).unwrap();
    assert_eq!(
        p.config,
        Config {
            backend: config::Setting::builder(Some(Vendor::Host)),
            ..Config::default()
        }
    );
    assert_eq!(p.discovery.chosen, Vendor::Host);
    assert_eq!(p.discovery.devices.len(), 1);
    let allocator = p.allocator(0).unwrap();
    assert_eq!(allocator.name(), StrategyKind::Bfc.name());
    let total = p.discovery.devices[0].info().total_bytes;
    assert_eq!(allocator.stats().bytes_limit, Some(total / 4 * 3));
    assert!(p.peers.iter().all(|l| !l.enabled));

    let ledger = LedgerOptions::default().with_config(&p.config);
    assert!(!ledger.backtrace);
    assert_eq!(ledger.limit_hint.source.as_deref(), Some("the default"));
}

/// Discovery from an `ignore_env()` configuration looks for the vendor libraries where the
/// defaults say, never where the (set, well-formed) library variables point; the same
/// discovery from the environment does look there, so the check can fail.
#[test]
fn ignore_env_discovery_never_tries_the_variables_libraries() {
    let nowhere = "/nonexistent/portalloc-hermetic";
    let _env = Environment::set(&[
        (
            config::PORTALLOC_CUDA_LIBRARY,
            format!("{nowhere}/libcuda.so.1").into(),
        ),
        (
            config::PORTALLOC_HIP_LIBRARY,
            format!("{nowhere}/libamdhip64.so.6").into(),
        ),
        (config::ROCM_PATH, nowhere.into()),
        (config::HIP_PATH, nowhere.into()),
    ]);
    let tried = |config: &Config| -> String {
        let discovery = portalloc::discover(config).unwrap();
        discovery
            .candidates
            .iter()
            .filter_map(|c| c.probe.as_ref())
            .map(|p| format!("{:?} {:?}", p.library, p.load_failures))
            .collect()
    };
    let hermetic = tried(&Config::builder().ignore_env().build().unwrap());
    assert!(!hermetic.contains(nowhere), "{hermetic}");
    if cfg!(feature = "cuda") || cfg!(feature = "hip") {
        let from_env = tried(&Config::from_env().unwrap());
        assert!(from_env.contains(nowhere), "{from_env}");
    }
}

/// Without `ignore_env()`, each garbage value alone is an `Error::Config` naming its
/// variable, from `Config::from_env`, the builder, and `Portalloc::from_env`.
#[test_case(refused_text() ; "values the readers refuse")]
#[test_case(not_utf8_everywhere() ; "values that are not UTF-8")]
fn each_garbage_value_is_a_config_error_naming_its_variable(
    garbage: Vec<(&'static str, OsString)>,
) {
    for (name, value) in garbage {
        let _env = Environment::set(&[(name, value.clone())]);
        let named = |result: portalloc::Result<String>, via: &str| match result {
            Err(Error::Config { variable, .. }) => assert_eq!(variable, name, "{via}"),
            other => panic!("{name}={value:?} via {via}: expected Error::Config, got {other:?}"),
        };
        named(
            Config::from_env().map(|c| format!("{c:?}")),
            "Config::from_env",
        );
        named(
            Config::builder()
                .strategy(StrategyKind::Platform)
                .build()
                .map(|c| format!("{c:?}")),
            "the builder",
        );
        named(
            Portalloc::from_env().map(|p| format!("{p:?}")),
            "Portalloc::from_env",
        );
    }
}

/// What a standalone constructor returned, as text for the messages.
type Outcome = portalloc::Result<String>;

fn ledger_from_env() -> Outcome {
    LedgerOptions::from_env().map(|o| format!("{o:?}"))
}

#[cfg(feature = "cuda")]
fn cuda_driver_load_default() -> Outcome {
    portalloc::backends::cuda::Driver::load_default().map(|d| format!("{d:?}"))
}

#[cfg(feature = "hip")]
fn hip_device_builder_from_env() -> Outcome {
    portalloc::backends::hip::HipDeviceBuilder::from_env().map(|b| format!("{b:?}"))
}

#[cfg(feature = "hip")]
fn hip_runtime_load_default() -> Outcome {
    portalloc::backends::hip::Runtime::load_default().map(|_| "loaded".to_string())
}

/// The constructors that take no `Config` read their own variables through `Config`'s
/// parsing: the same typed error, naming the variable.
#[test_case(config::PORTALLOC_BACKTRACE, "sometimes", ledger_from_env ; "ledger backtrace")]
#[cfg_attr(feature = "cuda", test_case(config::PORTALLOC_CUDA_LIBRARY, "/tmp/\nlibcuda.so", cuda_driver_load_default ; "cuda library"))]
#[cfg_attr(feature = "hip", test_case(config::PORTALLOC_HIP_MEMORY, "fast", hip_device_builder_from_env ; "hip memory"))]
#[cfg_attr(feature = "hip", test_case(config::HSA_XNACK, "on", hip_device_builder_from_env ; "hsa xnack"))]
#[cfg_attr(feature = "hip", test_case(config::ROCM_PATH, "/opt/\u{1b}rocm", hip_runtime_load_default ; "rocm path"))]
fn standalone_constructors_read_their_variables_through_config(
    variable: &'static str,
    garbage: &str,
    construct: fn() -> Outcome,
) {
    let _env = Environment::set(&[(variable, garbage.into())]);
    match construct() {
        Err(Error::Config {
            variable: named,
            value,
            ..
        }) => assert_eq!((named.as_str(), value.as_str()), (variable, garbage)),
        other => panic!("{variable}={garbage:?}: expected Error::Config, got {other:?}"),
    }
}

#[test]
fn the_ledger_takes_backtrace_from_the_environment_or_the_config() {
    let _env = Environment::set(&[(config::PORTALLOC_BACKTRACE, "on".into())]);
    assert!(LedgerOptions::from_env().unwrap().backtrace);
    let from_env = Config::from_env().unwrap();
    assert_eq!(
        from_env.backtrace.source,
        Source::Env(config::PORTALLOC_BACKTRACE)
    );
    assert!(LedgerOptions::default().with_config(&from_env).backtrace);
    let hermetic = Config::builder().ignore_env().build().unwrap();
    assert!(!LedgerOptions::default().with_config(&hermetic).backtrace);
}
