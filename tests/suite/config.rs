//! Configuration: every variable, with JAX/XLA's semantics, and the builder.
//!
//! Variables are given through a `HashMap` lookup; the process environment is never touched.

use crate::support::common::assert_mentions_all;
use std::collections::HashMap;

use portalloc::config::{
    Config, HipMemoryKind, Setting, Source, StrategyKind, BOOL_ACCEPTED, FRACTION_ACCEPTED,
    HIP_MEMORY_ACCEPTED, PATH_ACCEPTED, PORTALLOC_ALLOCATOR_VALUES, XLA_ALLOCATOR_VALUES,
    XNACK_ACCEPTED,
};
use portalloc::{Error, Vendor};
use test_case::test_case;

fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn read(pairs: &[(&str, &str)]) -> portalloc::Result<Config> {
    let map = vars(pairs);
    Config::from_vars(move |name| map.get(name).cloned())
}

fn ok(pairs: &[(&str, &str)]) -> Config {
    match read(pairs) {
        Ok(c) => c,
        Err(e) => panic!("{pairs:?} should be accepted, got: {e}"),
    }
}

/// The `Error::Config` fields, or a panic naming what came instead.
fn config_err(result: portalloc::Result<Config>) -> (String, String, String) {
    match result {
        Err(Error::Config {
            variable,
            value,
            accepted,
        }) => (variable, value, accepted),
        Err(other) => panic!("expected Error::Config, got {other:?}"),
        Ok(c) => panic!("expected Error::Config, got Ok({c:?})"),
    }
}

/// `variable` set to `text` alone is refused with an `Error::Config` naming both: what it
/// says is accepted.
fn refused(variable: &str, text: &str) -> String {
    let (var, val, accepted) = config_err(read(&[(variable, text)]));
    assert_eq!(var, variable);
    assert_eq!(val, text);
    accepted
}

/// The setting has the value `expected`, read from `variable`.
fn assert_from_env<T: PartialEq + std::fmt::Debug>(
    setting: &Setting<T>,
    expected: T,
    variable: &'static str,
) {
    assert_eq!(setting.value, expected, "from {variable}");
    assert_eq!(setting.source, Source::Env(variable));
}

/// Every setting `describe` lists comes from `source`.
fn assert_every_source(c: &Config, source: &str) {
    for (setting, _, from) in c.describe() {
        assert_eq!(from, source, "{setting}");
    }
}

// ---------------------------------------------------------------- strategy

/// The allocator variable alone selects the strategy, without a warning.
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "default", StrategyKind::Bfc ; "xla default is bfc")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "bfc", StrategyKind::Bfc ; "xla bfc")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "platform", StrategyKind::Platform ; "xla platform")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "address", StrategyKind::Platform ; "xla address is platform")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "vmm", StrategyKind::Vmm ; "xla vmm")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async", StrategyKind::Async ; "xla cuda_async is async")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "BFC", StrategyKind::Bfc ; "xla uppercase is lowercased as in JAX")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "Cuda_Async", StrategyKind::Async ; "xla mixed case cuda_async")]
#[test_case("PORTALLOC_ALLOCATOR", "default", StrategyKind::Bfc ; "portalloc default")]
#[test_case("PORTALLOC_ALLOCATOR", "bfc", StrategyKind::Bfc ; "portalloc bfc")]
#[test_case("PORTALLOC_ALLOCATOR", "platform", StrategyKind::Platform ; "portalloc platform")]
#[test_case("PORTALLOC_ALLOCATOR", "address", StrategyKind::Platform ; "portalloc address")]
#[test_case("PORTALLOC_ALLOCATOR", "vmm", StrategyKind::Vmm ; "portalloc vmm")]
#[test_case("PORTALLOC_ALLOCATOR", "cuda_async", StrategyKind::Async ; "portalloc cuda_async")]
#[test_case("PORTALLOC_ALLOCATOR", "async", StrategyKind::Async ; "portalloc async")]
#[test_case("PORTALLOC_ALLOCATOR", "ASYNC", StrategyKind::Async ; "portalloc is case insensitive")]
fn allocator_variable(variable: &'static str, value: &str, expected: StrategyKind) {
    let c = ok(&[(variable, value)]);
    assert_from_env(&c.strategy, expected, variable);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_malloc" ; "xla unknown name")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "async" ; "xla does not take portalloc async")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", " bfc" ; "xla does not trim")]
#[test_case("PORTALLOC_ALLOCATOR", "best_fit" ; "portalloc unknown name")]
fn unknown_allocator_is_an_error_naming_everything(variable: &str, value: &str) {
    let accepted = refused(variable, value);
    let list = if variable == "PORTALLOC_ALLOCATOR" {
        PORTALLOC_ALLOCATOR_VALUES
    } else {
        XLA_ALLOCATOR_VALUES
    };
    assert_mentions_all(&accepted, list);
    let message = Error::config(variable, value, accepted).to_string();
    assert!(
        message.contains(variable) && message.contains(value.trim()),
        "{message}"
    );
}

#[test_case(&[("PORTALLOC_ALLOCATOR", "vmm"), ("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")],
            StrategyKind::Vmm, "PORTALLOC_ALLOCATOR" ; "portalloc beats xla")]
#[test_case(&[("PORTALLOC_ALLOCATOR", "platform"), ("TF_GPU_ALLOCATOR", "cuda_malloc_async")],
            StrategyKind::Platform, "PORTALLOC_ALLOCATOR" ; "portalloc beats tf")]
#[test_case(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "bfc"), ("TF_GPU_ALLOCATOR", "cuda_malloc_async")],
            StrategyKind::Bfc, "XLA_PYTHON_CLIENT_ALLOCATOR" ; "xla beats tf")]
#[test_case(&[("TF_GPU_ALLOCATOR", "cuda_malloc_async")],
            StrategyKind::Async, "TF_GPU_ALLOCATOR" ; "tf alone selects async")]
#[test_case(&[("PORTALLOC_ALLOCATOR", ""), ("XLA_PYTHON_CLIENT_ALLOCATOR", "vmm")],
            StrategyKind::Vmm, "XLA_PYTHON_CLIENT_ALLOCATOR" ; "empty portalloc is unset")]
fn strategy_precedence(pairs: &[(&str, &str)], expected: StrategyKind, source: &'static str) {
    let c = ok(pairs);
    assert_from_env(&c.strategy, expected, source);
}

#[test_case("bfc", true ; "disagreeing xla and tf warn")]
#[test_case("cuda_async", false ; "agreeing xla and tf do not warn")]
fn xla_and_tf_disagreement_warns(xla: &str, warns: bool) {
    let c = ok(&[
        ("XLA_PYTHON_CLIENT_ALLOCATOR", xla),
        ("TF_GPU_ALLOCATOR", "cuda_malloc_async"),
    ]);
    assert_eq!(c.warnings.len(), usize::from(warns), "{:?}", c.warnings);
    if warns {
        assert!(c.warnings[0].contains("TF_GPU_ALLOCATOR"));
        assert!(c.warnings[0].contains("XLA_PYTHON_CLIENT_ALLOCATOR"));
    }
}

#[test]
fn tf_gpu_allocator_empty_is_unset() {
    let c = ok(&[("TF_GPU_ALLOCATOR", "")]);
    assert_eq!(c.strategy.value, StrategyKind::Bfc);
    assert_eq!(c.strategy.source, Source::Default);
}

// ---------------------------------------------------------------- fraction

#[test_case("0.9", 0.9 ; "zero point nine")]
#[test_case("1", 1.0 ; "one is allowed")]
#[test_case("0.5", 0.5 ; "half")]
#[test_case(".25", 0.25 ; "leading dot")]
#[test_case("1e-1", 0.1 ; "exponent")]
#[test_case(" 0.6 ", 0.6 ; "blanks around as python float")]
fn fraction_good(text: &str, expected: f64) {
    let c = ok(&[("XLA_CLIENT_MEM_FRACTION", text)]);
    assert_from_env(&c.mem_fraction, expected, "XLA_CLIENT_MEM_FRACTION");
    assert!(c.warnings.is_empty());
}

#[test_case("abc" ; "not a number")]
#[test_case("NaN" ; "nan")]
#[test_case("inf" ; "infinity")]
#[test_case("-inf" ; "negative infinity")]
#[test_case("0" ; "zero")]
#[test_case("-0" ; "negative zero")]
#[test_case("-0.5" ; "negative")]
#[test_case("1.5" ; "above one")]
#[test_case("75%" ; "percent")]
#[test_case("0,5" ; "comma decimal")]
fn fraction_bad(text: &str) {
    for variable in [
        "XLA_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "PORTALLOC_MEM_FRACTION",
    ] {
        assert_eq!(refused(variable, text), FRACTION_ACCEPTED);
    }
}

#[test]
fn fraction_default_is_three_quarters_of_total() {
    let c = ok(&[]);
    assert_eq!(c.mem_fraction.value, 0.75);
    assert_eq!(c.mem_fraction.source, Source::Default);
    assert_eq!(c.limit(80 << 30), 60 << 30);
}

#[test]
fn deprecated_fraction_warns_and_is_used() {
    let c = ok(&[("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")]);
    assert_from_env(&c.mem_fraction, 0.5, "XLA_PYTHON_CLIENT_MEM_FRACTION");
    assert_eq!(c.warnings.len(), 1);
    assert!(c.warnings[0].contains("XLA_PYTHON_CLIENT_MEM_FRACTION"));
    assert!(c.warnings[0].contains("deprecated"));
    assert!(c.warnings[0].contains("XLA_CLIENT_MEM_FRACTION"));
}

#[test_case("0.5", "0.5" ; "same values still conflict")]
#[test_case("0.5", "0.9" ; "different values conflict")]
#[test_case("0.5", "abc" ; "conflict reported before the bad value")]
fn both_fraction_variables_conflict(new: &str, old: &str) {
    let result = read(&[
        ("XLA_CLIENT_MEM_FRACTION", new),
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", old),
    ]);
    match result {
        Err(Error::ConfigConflict(message)) => {
            assert!(message.contains("XLA_CLIENT_MEM_FRACTION"), "{message}");
            assert!(
                message.contains("XLA_PYTHON_CLIENT_MEM_FRACTION"),
                "{message}"
            );
        }
        other => panic!("expected ConfigConflict, got {other:?}"),
    }
}

#[test]
fn empty_deprecated_fraction_is_unset_so_no_conflict() {
    let c = ok(&[
        ("XLA_CLIENT_MEM_FRACTION", "0.4"),
        ("XLA_PYTHON_CLIENT_MEM_FRACTION", ""),
    ]);
    assert_eq!(c.mem_fraction.value, 0.4);
    assert!(c.warnings.is_empty());
}

#[test_case(&[("PORTALLOC_MEM_FRACTION", "0.3"), ("XLA_CLIENT_MEM_FRACTION", "0.9")],
            0.3, "PORTALLOC_MEM_FRACTION" ; "portalloc beats xla fraction")]
#[test_case(&[("PORTALLOC_MEM_FRACTION", "0.3"), ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")],
            0.3, "PORTALLOC_MEM_FRACTION" ; "portalloc beats deprecated fraction")]
#[test_case(&[("XLA_CLIENT_MEM_FRACTION", "0.2")],
            0.2, "XLA_CLIENT_MEM_FRACTION" ; "xla fraction alone")]
fn fraction_precedence(pairs: &[(&str, &str)], expected: f64, source: &'static str) {
    let c = ok(pairs);
    assert_from_env(&c.mem_fraction, expected, source);
}

#[test]
fn overridden_bad_value_is_still_an_error() {
    let (var, _, _) = config_err(read(&[
        ("PORTALLOC_MEM_FRACTION", "0.5"),
        ("XLA_CLIENT_MEM_FRACTION", "2"),
    ]));
    assert_eq!(var, "XLA_CLIENT_MEM_FRACTION");
}

// ---------------------------------------------------------------- preallocate

#[test_case("false", false, false ; "false is false")]
#[test_case("False", false, false ; "False is false")]
#[test_case("0", false, false ; "zero is false")]
#[test_case("true", true, false ; "true is true")]
#[test_case("1", true, false ; "one is true")]
#[test_case("yes", true, false ; "yes is true")]
#[test_case("anything", true, false ; "anything is true without warning")]
#[test_case("FALSE", true, true ; "upper FALSE is true in JAX")]
#[test_case("fAlSe", true, true ; "mixed case false is true in JAX")]
#[test_case("no", true, true ; "no is true in JAX")]
#[test_case("No", true, true ; "No is true in JAX")]
#[test_case("NO", true, true ; "NO is true in JAX")]
#[test_case("off", true, true ; "off is true in JAX")]
#[test_case("Off", true, true ; "Off is true in JAX")]
#[test_case("OFF", true, true ; "OFF is true in JAX")]
#[test_case("n", true, true ; "n is true in JAX")]
#[test_case("N", true, true ; "N is true in JAX")]
#[test_case("f", true, true ; "f is true in JAX")]
#[test_case("F", true, true ; "F is true in JAX")]
#[test_case(" false", true, true ; "blank before false is true in JAX")]
#[test_case("0 ", true, true ; "zero with a blank is true in JAX")]
fn xla_preallocate_as_jax_reads_it(text: &str, expected: bool, warns: bool) {
    let c = ok(&[("XLA_PYTHON_CLIENT_PREALLOCATE", text)]);
    assert_from_env(&c.preallocate, expected, "XLA_PYTHON_CLIENT_PREALLOCATE");
    if warns {
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        let w = &c.warnings[0];
        assert!(w.contains("XLA_PYTHON_CLIENT_PREALLOCATE"), "{w}");
        assert!(w.contains("JAX reads this as true"), "{w}");
        assert!(w.contains("`false`, `False` or `0`"), "{w}");
    } else {
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }
}

#[test]
fn preallocate_default_is_true() {
    let c = ok(&[("XLA_PYTHON_CLIENT_PREALLOCATE", "")]);
    assert!(c.preallocate.value);
    assert_eq!(c.preallocate.source, Source::Default);
}

#[test_case("true", true ; "p true")]
#[test_case("TRUE", true ; "p upper TRUE")]
#[test_case("1", true ; "p one")]
#[test_case("yes", true ; "p yes")]
#[test_case("On", true ; "p On")]
#[test_case("false", false ; "p false")]
#[test_case("FALSE", false ; "p upper FALSE is false for portalloc")]
#[test_case("0", false ; "p zero")]
#[test_case("No", false ; "p No")]
#[test_case("OFF", false ; "p OFF")]
fn portalloc_preallocate(text: &str, expected: bool) {
    let c = ok(&[
        ("PORTALLOC_PREALLOCATE", text),
        ("XLA_PYTHON_CLIENT_PREALLOCATE", "1"),
    ]);
    assert_from_env(&c.preallocate, expected, "PORTALLOC_PREALLOCATE");
    assert!(c.warnings.is_empty());
}

#[test_case("PORTALLOC_PREALLOCATE", "maybe" ; "preallocate maybe")]
#[test_case("PORTALLOC_PREALLOCATE", "2" ; "preallocate two")]
#[test_case("PORTALLOC_PREALLOCATE", "n" ; "preallocate n is not accepted")]
#[test_case("PORTALLOC_HOST_SIMULATED", "y" ; "simulated y is not accepted")]
#[test_case("PORTALLOC_HOST_SIMULATED", "truee" ; "simulated typo")]
fn portalloc_bool_bad(variable: &str, text: &str) {
    let accepted = refused(variable, text);
    assert_mentions_all(
        &accepted,
        &["true", "false", "1", "0", "yes", "no", "on", "off"],
    );
}

// ---------------------------------------------------------------- async prealloc

#[test_case("-1", -1 ; "minus one")]
#[test_case("0", 0 ; "zero bytes")]
#[test_case("1073741824", 1 << 30 ; "one gibibyte")]
#[test_case(" 42 ", 42 ; "blanks around")]
fn async_prealloc_good(text: &str, expected: i64) {
    let c = ok(&[("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", text)]);
    assert_from_env(
        &c.async_prealloc,
        Some(expected),
        "TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC",
    );
}

/// A value the variable does not take is refused, naming what it does take.
#[test_case("TF_GPU_ALLOCATOR", "cuda_malloc", "cuda_malloc_async" ; "tf cuda_malloc")]
#[test_case("TF_GPU_ALLOCATOR", "CUDA_MALLOC_ASYNC", "cuda_malloc_async" ; "tf is case sensitive")]
#[test_case("TF_GPU_ALLOCATOR", "bfc", "cuda_malloc_async" ; "tf bfc")]
#[test_case("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "-2", "-1" ; "async prealloc below minus one")]
#[test_case("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "1GiB", "-1" ; "async prealloc units are not read by XLA")]
#[test_case("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "1.5", "-1" ; "async prealloc fraction")]
#[test_case("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "abc", "-1" ; "async prealloc word")]
#[test_case("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "99999999999999999999", "-1" ; "async prealloc overflow")]
fn a_value_not_taken_is_refused_naming_what_is(variable: &str, text: &str, taken: &str) {
    let accepted = refused(variable, text);
    assert!(accepted.contains(taken), "{accepted}");
}

#[test]
fn async_prealloc_default_is_unset() {
    assert_eq!(ok(&[]).async_prealloc.value, None);
}

// ---------------------------------------------------------------- backend and host

#[test_case("auto", None ; "auto discovers")]
#[test_case("host", Some(Vendor::Host) ; "host")]
#[test_case("cuda", Some(Vendor::Cuda) ; "cuda")]
#[test_case("hip", Some(Vendor::Hip) ; "hip")]
#[test_case("CUDA", Some(Vendor::Cuda) ; "backend is case insensitive")]
fn backend(text: &str, expected: Option<Vendor>) {
    let c = ok(&[("PORTALLOC_BACKEND", text)]);
    assert_from_env(&c.backend, expected, "PORTALLOC_BACKEND");
}

#[test]
fn backend_unknown_is_an_error() {
    let accepted = refused("PORTALLOC_BACKEND", "rocm");
    assert_mentions_all(&accepted, &["auto", "host", "cuda", "hip"]);
}

#[test_case("80GiB", 80 << 30 ; "eighty gibibytes")]
#[test_case("141GB", 141_000_000_000 ; "decimal gigabytes")]
#[test_case("1024", 1024 ; "plain bytes")]
#[test_case("2M", 2 << 20 ; "short unit")]
fn host_capacity_good(text: &str, expected: u64) {
    let c = ok(&[("PORTALLOC_HOST_CAPACITY", text)]);
    assert_from_env(&c.host_capacity, Some(expected), "PORTALLOC_HOST_CAPACITY");
}

#[test_case("0" ; "zero capacity")]
#[test_case("0GiB" ; "zero with unit")]
#[test_case("lots" ; "not a size")]
#[test_case("80XB" ; "unknown unit")]
#[test_case("-1" ; "negative")]
fn host_capacity_bad(text: &str) {
    refused("PORTALLOC_HOST_CAPACITY", text);
}

#[test_case("true", true ; "simulated true")]
#[test_case("0", false ; "simulated zero")]
fn host_simulated(text: &str, expected: bool) {
    let c = ok(&[("PORTALLOC_HOST_SIMULATED", text)]);
    assert_from_env(&c.host_simulated, expected, "PORTALLOC_HOST_SIMULATED");
}

// ---------------------------------------------------------------- sources and describe

#[test]
fn defaults_record_default_source() {
    let c = ok(&[]);
    // The defaults, with the record that the (empty) environment was read, and the shared
    // budget on (its options' defaults: an environment was read).
    assert!(c.env_read);
    assert_eq!(
        c,
        Config {
            env_read: true,
            shared_budget: portalloc::budget::BudgetOptions::from_vars(&|_| None, true).unwrap(),
            ..Config::default()
        }
    );
    assert_every_source(&c, "default");
}

#[test]
fn describe_names_value_and_source() {
    let c = ok(&[
        ("XLA_PYTHON_CLIENT_ALLOCATOR", "default"),
        ("PORTALLOC_HOST_CAPACITY", "80GiB"),
    ]);
    let rows = c.describe();
    assert!(rows.contains(&(
        "strategy".to_string(),
        "bfc".to_string(),
        "XLA_PYTHON_CLIENT_ALLOCATOR".to_string()
    )));
    let capacity = rows.iter().find(|r| r.0 == "host_capacity").unwrap();
    assert!(capacity.1.contains("80.00 GiB"), "{capacity:?}");
    assert_eq!(capacity.2, "PORTALLOC_HOST_CAPACITY");
    let names: Vec<_> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "strategy",
            "mem_fraction",
            "preallocate",
            "backend",
            "async_prealloc",
            "host_capacity",
            "host_simulated",
            "host_devices",
            "peer_access",
            "backtrace",
            "cuda_library",
            "hip_library",
            "rocm_path",
            "hip_path",
            "hip_memory",
            "hsa_xnack",
        ]
    );
}

/// A value each variable accepts, and the setting it gives (`describe`'s row and value).
#[rustfmt::skip]
const ONE_GOOD_VALUE_EACH: &[(&str, &str, &str, &str)] = &[
    ("PORTALLOC_ALLOCATOR", "vmm", "strategy", "vmm"),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "platform", "strategy", "platform"),
    ("TF_GPU_ALLOCATOR", "cuda_malloc_async", "strategy", "async"),
    ("PORTALLOC_MEM_FRACTION", "0.5", "mem_fraction", "0.5"),
    ("XLA_CLIENT_MEM_FRACTION", "0.25", "mem_fraction", "0.25"),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.125", "mem_fraction", "0.125"),
    ("PORTALLOC_PREALLOCATE", "off", "preallocate", "false"),
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "false", "preallocate", "false"),
    ("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "1024", "async_prealloc", "1024"),
    ("PORTALLOC_BACKEND", "host", "backend", "host"),
    ("PORTALLOC_HOST_CAPACITY", "1KiB", "host_capacity", "1.00 KiB (1024 bytes)"),
    ("PORTALLOC_HOST_SIMULATED", "yes", "host_simulated", "true"),
    ("PORTALLOC_HOST_DEVICES", "4", "host_devices", "4"),
    ("PORTALLOC_PEER_ACCESS", "1", "peer_access", "true"),
    ("PORTALLOC_BACKTRACE", "ON", "backtrace", "true"),
    ("PORTALLOC_CUDA_LIBRARY", "/opt/cuda lib/libcuda.so.1", "cuda_library", "/opt/cuda lib/libcuda.so.1"),
    ("PORTALLOC_HIP_LIBRARY", "libamdhip64.so.6", "hip_library", "libamdhip64.so.6"),
    ("ROCM_PATH", "/opt/rocm-6.2", "rocm_path", "/opt/rocm-6.2"),
    ("HIP_PATH", "/opt/hip/", "hip_path", "/opt/hip/"),
    ("PORTALLOC_HIP_MEMORY", " Fine-Grained ", "hip_memory", "fine"),
    ("HSA_XNACK", "1", "hsa_xnack", "1"),
];

/// Every variable of `VARIABLES` is a setting `describe` (and so `portalloc info`) shows,
/// with the variable as its source.
#[test]
fn every_variable_is_a_setting_shown_with_its_source() {
    let listed: Vec<&str> = ONE_GOOD_VALUE_EACH.iter().map(|row| row.0).collect();
    assert_eq!(
        listed,
        portalloc::config::VARIABLES,
        "one row per variable, in order"
    );
    for &(variable, text, setting, shown) in ONE_GOOD_VALUE_EACH {
        let rows = ok(&[(variable, text)]).describe();
        let row = rows.iter().find(|r| r.0 == setting).unwrap();
        assert_eq!(
            (row.1.as_str(), row.2.as_str()),
            (shown, variable),
            "{variable}={text:?}"
        );
        let others_default = rows
            .iter()
            .filter(|r| r.0 != setting)
            .all(|r| r.2 == "default");
        assert!(others_default, "{variable} sets {setting} only: {rows:?}");
    }
}

// ---------------------------------------------------------------- new settings

/// The switches read with the one boolean reader: the same spellings as
/// `PORTALLOC_PREALLOCATE`, and the same refusal.
#[test_case("PORTALLOC_PEER_ACCESS" ; "peer access")]
#[test_case("PORTALLOC_BACKTRACE" ; "backtrace")]
fn switches_share_the_boolean_reader(variable: &'static str) {
    for (text, expected) in [("1", true), ("Yes", true), ("off", false), ("FALSE", false)] {
        let c = ok(&[(variable, text)]);
        let value = match variable {
            "PORTALLOC_PEER_ACCESS" => &c.peer_access,
            _ => &c.backtrace,
        };
        assert_from_env(value, expected, variable);
    }
    assert_eq!(refused(variable, "sometimes"), BOOL_ACCEPTED);
}

#[test]
fn peer_access_is_off_by_default() {
    let c = ok(&[]);
    assert!(!c.peer_access.value);
    assert_eq!(c.peer_access.source, Source::Default);
}

#[test_case("PORTALLOC_CUDA_LIBRARY", "/tmp/\nlibcuda.so" ; "cuda library with a newline")]
#[test_case("PORTALLOC_HIP_LIBRARY", "\u{1b}[31m" ; "hip library with an escape")]
#[test_case("ROCM_PATH", "/opt/rocm\t" ; "rocm path with a tab")]
#[test_case("HIP_PATH", "\u{7f}" ; "hip path delete")]
fn a_path_with_a_control_character_is_refused(variable: &str, text: &str) {
    assert_eq!(refused(variable, text), PATH_ACCEPTED);
}

#[test_case("coarse", HipMemoryKind::Coarse ; "coarse")]
#[test_case("default", HipMemoryKind::Coarse ; "default is coarse")]
#[test_case("FINE", HipMemoryKind::FineGrained ; "fine any case")]
#[test_case("fine-grained", HipMemoryKind::FineGrained ; "fine grained")]
#[test_case(" uncached ", HipMemoryKind::Uncached ; "uncached blanks")]
fn hip_memory_good(text: &str, expected: HipMemoryKind) {
    assert_from_env(
        &ok(&[("PORTALLOC_HIP_MEMORY", text)]).hip_memory,
        expected,
        "PORTALLOC_HIP_MEMORY",
    );
}

#[test_case("PORTALLOC_HIP_MEMORY", "fast", HIP_MEMORY_ACCEPTED ; "hip memory unknown")]
#[test_case("HSA_XNACK", "2", XNACK_ACCEPTED ; "xnack two")]
#[test_case("HSA_XNACK", "true", XNACK_ACCEPTED ; "xnack true is not what the runtime reads")]
fn hip_choice_bad(variable: &str, text: &str, accepted: &str) {
    assert_eq!(refused(variable, text), accepted);
}

#[test_case("0", Some(false) ; "xnack off")]
#[test_case("1", Some(true) ; "xnack on")]
#[test_case("", None ; "xnack empty is unset")]
fn hsa_xnack(text: &str, expected: Option<bool>) {
    let c = ok(&[("HSA_XNACK", text)]);
    assert_eq!(c.hsa_xnack.value, expected);
}

#[test]
fn builder_refuses_a_path_with_a_control_character() {
    let (var, _, accepted) = config_err(
        Config::builder()
            .ignore_env()
            .rocm_path("/opt/\nrocm".into())
            .build(),
    );
    assert_eq!(
        (var.as_str(), accepted.as_str()),
        ("rocm_path", PATH_ACCEPTED)
    );
}

// ---------------------------------------------------------------- builder

#[test]
fn builder_overrides_env() {
    let map = vars(&[
        ("XLA_PYTHON_CLIENT_ALLOCATOR", "platform"),
        ("XLA_CLIENT_MEM_FRACTION", "0.9"),
        ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
        ("PORTALLOC_BACKEND", "cuda"),
        ("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "5"),
        ("PORTALLOC_HOST_CAPACITY", "1GiB"),
        ("PORTALLOC_HOST_SIMULATED", "false"),
        ("PORTALLOC_HOST_DEVICES", "2"),
        ("PORTALLOC_PEER_ACCESS", "1"),
        ("PORTALLOC_BACKTRACE", "1"),
        ("PORTALLOC_CUDA_LIBRARY", "/env/libcuda.so.1"),
        ("PORTALLOC_HIP_LIBRARY", "/env/libamdhip64.so.6"),
        ("ROCM_PATH", "/env/rocm"),
        ("HIP_PATH", "/env/hip"),
        ("PORTALLOC_HIP_MEMORY", "fine"),
        ("HSA_XNACK", "1"),
    ]);
    let c = Config::builder()
        .vars(|name| map.get(name).cloned())
        .peer_access(false)
        .backtrace(false)
        .cuda_library("/builder/libcuda.so.1".into())
        .hip_library("/builder/libamdhip64.so.6".into())
        .rocm_path("/builder/rocm".into())
        .hip_path("/builder/hip".into())
        .hip_memory(HipMemoryKind::Coarse)
        .hsa_xnack(None)
        .strategy(StrategyKind::Vmm)
        .mem_fraction(0.5)
        .preallocate(true)
        .backend(Some(Vendor::Host))
        .async_prealloc(-1)
        .host_capacity(80 << 30)
        .host_simulated(true)
        .host_devices(4)
        .build()
        .unwrap();
    assert_eq!(c.host_devices.value, 4);
    assert_eq!(c.strategy.value, StrategyKind::Vmm);
    assert_eq!(c.mem_fraction.value, 0.5);
    assert!(c.preallocate.value);
    assert_eq!(c.backend.value, Some(Vendor::Host));
    assert_eq!(c.async_prealloc.value, Some(-1));
    assert_eq!(c.host_capacity.value, Some(80 << 30));
    assert!(c.host_simulated.value);
    assert!(!c.peer_access.value && !c.backtrace.value);
    assert_eq!(c.rocm_path.value.as_deref(), Some("/builder/rocm"));
    assert_eq!(
        c.cuda_library.value.as_deref(),
        Some("/builder/libcuda.so.1")
    );
    assert_eq!(c.hip_memory.value, HipMemoryKind::Coarse);
    assert_eq!(c.hsa_xnack.value, None);
    assert_every_source(&c, "builder");
}

#[test]
fn builder_keeps_env_for_what_it_does_not_set() {
    let map = vars(&[
        ("XLA_CLIENT_MEM_FRACTION", "0.9"),
        ("PORTALLOC_BACKEND", "hip"),
    ]);
    let c = Config::builder()
        .vars(|name| map.get(name).cloned())
        .strategy(StrategyKind::Platform)
        .build()
        .unwrap();
    assert_eq!(c.strategy.source, Source::Builder);
    assert_from_env(&c.mem_fraction, 0.9, "XLA_CLIENT_MEM_FRACTION");
    assert_eq!(c.backend.value, Some(Vendor::Hip));
    assert_eq!(c.preallocate.source, Source::Default);
}

#[test]
fn builder_ignore_env_starts_from_defaults() {
    let map = vars(&[("XLA_CLIENT_MEM_FRACTION", "abc")]);
    let c = Config::builder()
        .vars(|name| map.get(name).cloned())
        .ignore_env()
        .preallocate(false)
        .build()
        .unwrap();
    assert_eq!(c.mem_fraction.value, 0.75);
    assert_eq!(c.mem_fraction.source, Source::Default);
    assert_eq!(c.preallocate.source, Source::Builder);
    assert!(!c.preallocate.value);
}

#[test]
fn builder_reports_env_errors() {
    let map = vars(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "nope")]);
    let (var, _, _) = config_err(
        Config::builder()
            .vars(|name| map.get(name).cloned())
            .strategy(StrategyKind::Bfc)
            .build(),
    );
    assert_eq!(var, "XLA_PYTHON_CLIENT_ALLOCATOR");
}

#[test_case(f64::NAN ; "builder nan")]
#[test_case(f64::INFINITY ; "builder infinity")]
#[test_case(0.0 ; "builder zero")]
#[test_case(-0.1 ; "builder negative")]
#[test_case(1.01 ; "builder above one")]
fn builder_bad_fraction(fraction: f64) {
    let (var, _, accepted) = config_err(
        Config::builder()
            .ignore_env()
            .mem_fraction(fraction)
            .build(),
    );
    assert_eq!(var, "mem_fraction");
    assert_eq!(accepted, FRACTION_ACCEPTED);
}

#[test_case(1.0 ; "builder one")]
#[test_case(0.001 ; "builder tiny")]
fn builder_good_fraction(fraction: f64) {
    let c = Config::builder()
        .ignore_env()
        .mem_fraction(fraction)
        .build()
        .unwrap();
    assert_eq!(c.mem_fraction.value, fraction);
    assert_eq!(c.limit(1000), (fraction * 1000.0) as u64);
}

#[test]
fn builder_bad_async_prealloc_and_capacity() {
    let (var, _, _) = config_err(Config::builder().ignore_env().async_prealloc(-5).build());
    assert_eq!(var, "async_prealloc");
    let (var, _, _) = config_err(Config::builder().ignore_env().host_capacity(0).build());
    assert_eq!(var, "host_capacity");
}

// ---------------------------------------------------------------- StrategyKind

#[test_case("bfc", Some(StrategyKind::Bfc) ; "parse bfc")]
#[test_case("default", Some(StrategyKind::Bfc) ; "parse default")]
#[test_case("address", Some(StrategyKind::Platform) ; "parse address")]
#[test_case("Async", Some(StrategyKind::Async) ; "parse Async")]
#[test_case("cuda_async", Some(StrategyKind::Async) ; "parse cuda_async")]
#[test_case("VMM", Some(StrategyKind::Vmm) ; "parse VMM")]
#[test_case("", None ; "parse empty")]
#[test_case("bfcc", None ; "parse typo")]
fn strategy_parse(name: &str, expected: Option<StrategyKind>) {
    assert_eq!(StrategyKind::parse(name), expected);
    assert_eq!(name.parse::<StrategyKind>().ok(), expected);
    if let Some(kind) = expected {
        assert_eq!(kind.to_string().parse::<StrategyKind>().unwrap(), kind);
    }
}

#[test]
fn never_panics_on_odd_input() {
    for text in [
        "\u{0}",
        "é",
        "İ",
        "   ",
        "-",
        ".",
        "1e999",
        "0x10",
        "ﬀ",
        "\u{feff}0.5",
    ] {
        for variable in portalloc::config::VARIABLES {
            let _ = read(&[(variable, text)]);
        }
    }
}
