//! Out-of-memory diagnosis: each verdict from a situation built for it, through the ledger
//! adaptor (which attaches the diagnosis to the upstream's error).

use std::sync::Arc;

use crate::support::common::{bfc, simulated_host};
use portalloc::adaptor::{LedgerAllocator, LedgerOptions, LiveAllocation};
use portalloc::backends::host::HostDevice;
use portalloc::diagnose::{diagnose, DiagnoseOptions, Diagnosis, LimitHint, OomContext, Verdict};
use portalloc::strategy::bfc::BfcAllocator;
use portalloc::strategy::platform::PlatformAllocator;
use portalloc::{Allocation, Allocator, Config, Device, Error, MemInfo, Stats, Stream};
use test_case::test_case;

const MIB: u64 = 1 << 20;

fn bfc_ledger(
    device: &Arc<HostDevice>,
    limit: u64,
    preallocate: bool,
    options: LedgerOptions,
) -> LedgerAllocator<BfcAllocator<HostDevice>> {
    let bfc = bfc(device, limit, preallocate);
    let dev: Arc<dyn Device> = Arc::clone(device) as Arc<dyn Device>;
    LedgerAllocator::with_options(bfc, options).with_device(dev)
}

/// The diagnosis of an expected out-of-memory error; checks the wrapper keeps the report.
fn expect_oom(result: portalloc::Result<Allocation>) -> Diagnosis {
    let e = match result {
        Ok(a) => panic!(
            "expected out of memory, got an allocation at {:#x}",
            a.ptr()
        ),
        Err(e) => e,
    };
    assert!(
        matches!(e, Error::OutOfMemoryDiagnosed { .. }),
        "not diagnosed: {e}"
    );
    assert!(e.is_out_of_memory());
    let text = e.to_string();
    assert!(text.contains("diagnosis of the failed"), "{text}");
    assert!(text.contains("evidence:"), "{text}");
    assert!(text.contains("would help:"), "{text}");
    e.diagnosis().expect("a diagnosis").clone()
}

fn free_all<A: Allocator>(a: &A, v: Vec<Allocation>) {
    for x in v {
        a.deallocate(x).unwrap();
    }
}

#[test]
fn fragmentation_from_interleaved_frees() {
    let dev = simulated_host(64 * MIB);
    let l = bfc_ledger(&dev, 16 * MIB, true, LedgerOptions::default());
    let mut all: Vec<Allocation> = (0..16)
        .map(|_| l.allocate(MIB, 0, Stream::DEFAULT, "buffer").unwrap())
        .collect();
    // Free every other one: 8 MiB free, in 1 MiB holes.
    let mut kept = Vec::new();
    for (i, a) in all.drain(..).enumerate() {
        if i % 2 == 0 {
            l.deallocate(a).unwrap();
        } else {
            kept.push(a);
        }
    }
    let e = l.allocate(2 * MIB, 0, Stream::DEFAULT, "buffer");
    let d = expect_oom(e);
    assert_eq!(d.verdict(), Verdict::Fragmentation, "{d}");
    let f = d.finding(Verdict::Fragmentation).unwrap();
    assert!(f.evidence.contains("largest"), "{}", f.evidence);
    assert!(
        f.remedy.contains("XLA_PYTHON_CLIENT_ALLOCATOR=vmm"),
        "{}",
        f.remedy
    );
    assert!(!d.has(Verdict::OtherProcesses), "{d}");
    assert_eq!(l.last_oom().as_ref(), Some(&d));
    assert_eq!(l.snapshot().last_oom.as_ref(), Some(&d));
    free_all(&l, kept);
}

#[test]
fn other_processes_hold_the_device() {
    let dev = simulated_host(64 * MIB);
    // Another allocator on the same device takes 40 MiB of the 64.
    let other = PlatformAllocator::new(Arc::clone(&dev), None);
    let held = other
        .allocate(40 * MIB, 0, Stream::DEFAULT, "other")
        .unwrap();
    // Ours may take half the device (32 MiB), preallocated: the device has only 24 MiB free.
    let l = bfc_ledger(&dev, 32 * MIB, true, LedgerOptions::default());
    let d = expect_oom(l.allocate(MIB, 0, Stream::DEFAULT, "buffer"));
    assert_eq!(d.verdict(), Verdict::OtherProcesses, "{d}");
    let f = d.finding(Verdict::OtherProcesses).unwrap();
    assert!(f.evidence.contains("other processes"), "{}", f.evidence);
    assert!(f.evidence.contains("40.00 MiB"), "{}", f.evidence);
    assert!(f.remedy.contains("XLA_PYTHON_CLIENT_PREALLOCATE=false"));
    assert!(!d.has(Verdict::GrowthExhausted), "{d}");
    other.deallocate(held).unwrap();
    // With the memory back, the same request is served.
    let a = l.allocate(MIB, 0, Stream::DEFAULT, "buffer").unwrap();
    l.deallocate(a).unwrap();
}

#[test]
fn growth_exhausted_names_the_variable_that_raises_the_cap() {
    let dev = simulated_host(64 * MIB);
    let config = Config::builder()
        .vars(|name| (name == "XLA_CLIENT_MEM_FRACTION").then(|| "0.125".to_string()))
        .host_simulated(true)
        .build()
        .unwrap();
    let limit = config.limit(64 * MIB);
    assert_eq!(limit, 8 * MIB);
    let l = bfc_ledger(
        &dev,
        limit,
        false,
        LedgerOptions::default().with_config(&config),
    );
    let kept: Vec<Allocation> = (0..2)
        .map(|_| l.allocate(4 * MIB, 0, Stream::DEFAULT, "buffer").unwrap())
        .collect();
    let d = expect_oom(l.allocate(4 * MIB, 0, Stream::DEFAULT, "buffer"));
    assert_eq!(d.verdict(), Verdict::GrowthExhausted, "{d}");
    let f = d.finding(Verdict::GrowthExhausted).unwrap();
    assert!(f.remedy.contains("XLA_CLIENT_MEM_FRACTION"), "{}", f.remedy);
    assert!(f.remedy.contains("0.125"), "{}", f.remedy);
    assert!(f.remedy.contains("at least 0.188"), "{}", f.remedy);
    assert!(!d.has(Verdict::Fragmentation) && !d.has(Verdict::OtherProcesses));
    free_all(&l, kept);

    // Without a hint, both variables are named.
    let plain = bfc_ledger(&dev, 4 * MIB, false, LedgerOptions::default());
    let d = expect_oom(plain.allocate(5 * MIB, 0, Stream::DEFAULT, "big"));
    let f = d.finding(Verdict::GrowthExhausted).unwrap();
    assert!(f.evidence.contains("request alone"), "{}", f.evidence);
    assert!(f.remedy.contains("XLA_CLIENT_MEM_FRACTION"), "{}", f.remedy);
    assert!(f.remedy.contains("PORTALLOC_MEM_FRACTION"), "{}", f.remedy);
}

#[test]
fn suspected_leak_from_many_old_live_allocations_of_one_tag() {
    let dev = simulated_host(256 * MIB);
    let l = bfc_ledger(&dev, 32 * MIB, true, LedgerOptions::default());
    // A loop that keeps one 1 MiB "activations" buffer per step and frees its workspace.
    let mut kept = Vec::new();
    for _ in 0..24 {
        kept.push(l.allocate(MIB, 0, Stream::DEFAULT, "activations").unwrap());
        let w = l
            .allocate(64 << 10, 0, Stream::DEFAULT, "workspace")
            .unwrap();
        l.deallocate(w).unwrap();
    }
    // Later steps: workspace only.
    for _ in 0..40 {
        let w = l
            .allocate(64 << 10, 0, Stream::DEFAULT, "workspace")
            .unwrap();
        l.deallocate(w).unwrap();
    }
    let d = expect_oom(l.allocate(16 * MIB, 0, Stream::DEFAULT, "workspace"));
    assert!(d.has(Verdict::SuspectedLeak), "{d}");
    let f = d.finding(Verdict::SuspectedLeak).unwrap();
    assert!(f.evidence.contains("`activations`"), "{}", f.evidence);
    assert!(f.evidence.contains("#0"), "{}", f.evidence);
    assert!(f.remedy.contains("PORTALLOC_BACKTRACE=1"), "{}", f.remedy);
    assert!(!d.suspects.is_empty());
    assert!(d.suspects.iter().all(|s| s.tag == "activations"));
    assert_eq!(d.suspects[0].seq, 0, "oldest first");
    assert!(!f.evidence.contains("`workspace`"));
    free_all(&l, kept);
}

#[test]
fn no_leak_verdict_for_young_allocations() {
    let dev = simulated_host(256 * MIB);
    let l = bfc_ledger(&dev, 16 * MIB, true, LedgerOptions::default());
    // Few allocations made: too early to call anything a leak.
    let kept: Vec<Allocation> = (0..15)
        .map(|_| l.allocate(MIB, 0, Stream::DEFAULT, "buffer").unwrap())
        .collect();
    let d = expect_oom(l.allocate(4 * MIB, 0, Stream::DEFAULT, "buffer"));
    assert!(!d.has(Verdict::SuspectedLeak), "{d}");
    free_all(&l, kept);
}

#[test]
fn platform_device_refusal_is_diagnosed() {
    let dev = simulated_host(16 * MIB);
    let l = LedgerAllocator::new(PlatformAllocator::new(Arc::clone(&dev), Some(8 * MIB)));
    let a = l.allocate(6 * MIB, 0, Stream::DEFAULT, "buffer").unwrap();
    let e = l
        .allocate(4 * MIB, 0, Stream::DEFAULT, "buffer")
        .unwrap_err();
    let d = e.diagnosis().expect("diagnosed").clone();
    assert!(e.is_out_of_memory());
    assert!(d.has(Verdict::GrowthExhausted), "{d}");
    // A request over the limit is diagnosed too.
    let e = l
        .allocate(9 * MIB, 0, Stream::DEFAULT, "buffer")
        .unwrap_err();
    assert!(e.diagnosis().unwrap().has(Verdict::GrowthExhausted));
    l.deallocate(a).unwrap();
}

#[test]
fn in_use_when_nothing_more_specific_applies() {
    let live: Vec<LiveAllocation> = (0..3)
        .map(|i| LiveAllocation {
            seq: i,
            ptr: 0x1000 * (i + 1),
            size: MIB,
            rounded: MIB,
            stream: 0,
            tag: "buffer".into(),
            donated_from: None,
            asleep: false,
            backtrace: None,
        })
        .collect();
    let stats = Stats {
        bytes_in_use: 3 * MIB,
        pool_bytes: 3 * MIB,
        ..Stats::default()
    };
    let d = diagnose(&OomContext {
        strategy: "platform",
        requested: MIB,
        rounded: MIB,
        alignment: 0,
        tag: "buffer",
        stats,
        report: None,
        device_error: Some(0),
        device: Some(MemInfo {
            free: 0,
            total: 3 * MIB,
        }),
        live: &live,
        allocations_made: 3,
        limit_hint: &LimitHint::default(),
        options: &DiagnoseOptions::default(),
    });
    assert_eq!(d.verdict(), Verdict::InUse, "{d}");
    assert!(d.findings[0].evidence.contains("`buffer`"));
    let json = serde_json::to_string(&d).unwrap();
    let back: Diagnosis = serde_json::from_str(&json).unwrap();
    assert_eq!(back, d);
}

const GIB: u64 = 1 << 30;

/// The growth-exhausted finding for `requested` bytes, `in_use` live in a pool of the same
/// size, on a device of `total` bytes at `fraction` (limit `fraction × total`), with `hint`.
fn growth_finding(
    total: u64,
    fraction: f64,
    in_use: u64,
    requested: u64,
    hint: &LimitHint,
) -> portalloc::diagnose::Finding {
    let limit = (fraction * total as f64) as u64;
    let stats = Stats {
        bytes_in_use: in_use,
        pool_bytes: in_use,
        bytes_limit: Some(limit),
        ..Stats::default()
    };
    let d = diagnose(&OomContext {
        strategy: "bfc",
        requested,
        rounded: requested,
        alignment: 0,
        tag: "buffer",
        stats,
        report: None,
        device_error: None,
        device: Some(MemInfo {
            free: total - in_use,
            total,
        }),
        live: &[],
        allocations_made: 1,
        limit_hint: hint,
        options: &DiagnoseOptions::default(),
    });
    d.finding(Verdict::GrowthExhausted)
        .unwrap_or_else(|| panic!("{d}"))
        .clone()
}

fn hint(source: &str, env_read: bool) -> LimitHint {
    LimitHint {
        fraction: Some(0.75),
        source: Some(source.to_string()),
        env_read: Some(env_read),
    }
}

/// A request no fraction can serve (11 GiB on a 10 GiB device, nothing in use; or 6 GiB
/// beside 6 GiB in use) is not told to raise the fraction, whichever set it: the remedy says
/// no fraction serves it and only what does.
#[test_case(0, 11 * GIB, hint("the default", true), "a device of at least 11.00 GiB" ; "request larger than the device, default fraction")]
#[test_case(0, 11 * GIB, hint("XLA_CLIENT_MEM_FRACTION", true), "a smaller request" ; "request larger than the device, variable")]
#[test_case(0, 11 * GIB, hint("the builder (Config::builder().mem_fraction)", true), "a device of at least" ; "request larger than the device, builder")]
#[test_case(6 * GIB, 6 * GIB, hint("the default", false), "free at least 2.00 GiB of what is in use" ; "in use and request exceed the device, ignore_env")]
fn no_fraction_serves_it_so_none_is_advised(
    in_use: u64,
    requested: u64,
    hint: LimitHint,
    helps: &str,
) {
    let f = growth_finding(10 * GIB, 0.75, in_use, requested, &hint);
    assert!(f.remedy.contains("no fraction serves it"), "{}", f.remedy);
    assert!(
        f.remedy.contains("more than the device has"),
        "{}",
        f.remedy
    );
    assert!(!f.remedy.contains("the 0 B in use"), "{}", f.remedy);
    assert!(f.remedy.contains(helps), "{helps} in {}", f.remedy);
    for contradiction in [
        "raise",
        "MEM_FRACTION",
        "mem_fraction",
        "fraction of at least",
    ] {
        assert!(
            !f.remedy.contains(contradiction),
            "{contradiction} in {}",
            f.remedy
        );
    }
}

/// A fraction set in code is named once: the source (`the builder
/// (Config::builder().mem_fraction)`) is not repeated beside the setting to raise.
#[test]
fn a_fraction_set_in_code_is_named_once() {
    let f = growth_finding(
        10 * GIB,
        0.5,
        4 * GIB,
        2 * GIB,
        &LimitHint {
            fraction: Some(0.5),
            source: Some("the builder (Config::builder().mem_fraction)".into()),
            env_read: Some(true),
        },
    );
    assert_eq!(
        f.remedy.matches("Config::builder().mem_fraction").count(),
        1,
        "{}",
        f.remedy
    );
    assert!(f.remedy.contains("now 0.5"), "{}", f.remedy);
    assert!(f.remedy.contains("at least 0.6"), "{}", f.remedy);
    assert!(!f.remedy.contains("MEM_FRACTION"), "{}", f.remedy);
}
