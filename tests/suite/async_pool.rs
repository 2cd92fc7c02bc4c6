//! The `async` strategy (the device's stream-ordered pool) on the host device, real and
//! simulated: XLA's release threshold and `TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC`
//! semantics, synchronise-and-retry on out-of-memory, requested-byte statistics, the limit,
//! selection from the environment, and a device without a pool.

use std::collections::HashMap;
use std::sync::Arc;

use crate::support::common::host_device;
use portalloc::adaptor::{Capability, DeviceWrapper};
use portalloc::backends::host::HostDevice;
use portalloc::strategy::async_pool::{AsyncOptions, AsyncPoolAllocator};
use portalloc::{Allocator, Config, Device, Error, StrategyKind, Stream, Vendor};
use test_case::test_case;

const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 64 * MIB;

/// The configuration of the async strategy: fraction 0.5 (32 MiB of 64), as given.
fn config(preallocate: bool, async_prealloc: Option<i64>) -> Config {
    let mut b = Config::builder()
        .ignore_env()
        .strategy(StrategyKind::Async)
        .mem_fraction(0.5)
        .preallocate(preallocate);
    if let Some(n) = async_prealloc {
        b = b.async_prealloc(n);
    }
    b.build().unwrap()
}

fn build(config: &Config, d: &Arc<HostDevice>) -> Box<dyn Allocator> {
    let dynamic: Arc<dyn Device> = Arc::clone(d) as Arc<dyn Device>;
    portalloc::strategy::build(config, dynamic).unwrap()
}

fn usage(d: &HostDevice) -> portalloc::device::PoolUsage {
    d.stream_ordered_pool().unwrap().usage().unwrap()
}

#[test_case(true, false, 32 * MIB ; "preallocating real: fraction x total")]
#[test_case(true, true, 32 * MIB ; "preallocating simulated: fraction x total")]
#[test_case(false, false, 0 ; "growing real: zero")]
#[test_case(false, true, 0 ; "growing simulated: zero")]
fn release_threshold_follows_preallocate(preallocate: bool, simulated: bool, expected: u64) {
    let d = host_device(CAPACITY, simulated);
    let a = build(&config(preallocate, None), &d);
    assert_eq!(a.name(), "async");
    assert_eq!(
        d.stream_ordered_pool()
            .unwrap()
            .release_threshold()
            .unwrap(),
        expected
    );
    assert_eq!(a.stats().bytes_limit, Some(32 * MIB));
}

/// `TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC` as XLA reads it: pool reserved after building,
/// and after the default stream is synchronised (idle memory above the threshold goes).
#[test_case(true, None, 32 * MIB, 32 * MIB ; "preallocate alone fills the threshold")]
#[test_case(true, Some(-1), 32 * MIB, 32 * MIB ; "minus one fills the threshold")]
#[test_case(true, Some(4 << 20), 32 * MIB, 32 * MIB ; "n is ignored when preallocating")]
#[test_case(true, Some(0), 32 * MIB, 32 * MIB ; "zero is ignored when preallocating")]
#[test_case(false, None, 0, 0 ; "no preallocation")]
#[test_case(false, Some(-1), 0, 0 ; "minus one with a zero threshold is nothing")]
#[test_case(false, Some(4 << 20), 4 * MIB, 0 ; "n is allocated and released to the pool")]
#[test_case(false, Some(0), 0, 0 ; "zero is nothing")]
fn async_prealloc_semantics(
    preallocate: bool,
    prealloc: Option<i64>,
    reserved: u64,
    after_sync: u64,
) {
    for simulated in [false, true] {
        let d = host_device(CAPACITY, simulated);
        let a = build(&config(preallocate, prealloc), &d);
        let u = usage(&d);
        assert_eq!(u.reserved_current, reserved, "simulated={simulated}");
        assert_eq!(u.used_current, 0, "the preallocation is freed to the pool");
        assert_eq!(
            d.census().bytes_in_use,
            reserved,
            "the census counts pool bytes"
        );
        let s = a.stats();
        assert_eq!(
            (s.num_allocs, s.bytes_in_use, s.peak_bytes_in_use),
            (0, 0, 0)
        );
        assert_eq!(s.pool_bytes, reserved);
        // A request is served from the preallocation without growing the pool.
        if reserved > 0 {
            let x = a.allocate(MIB, 0, Stream::DEFAULT, "x").unwrap();
            assert_eq!(usage(&d).reserved_current, reserved);
            a.deallocate(x).unwrap();
        }
        d.synchronize_stream(Stream::DEFAULT).unwrap();
        assert_eq!(usage(&d).reserved_current, after_sync);
        drop(a);
        assert_eq!(d.census().bytes_in_use, 0);
    }
}

/// Out of memory: synchronise the stream and retry once. Three 2 MiB segments nearly fill a
/// 7 MiB device; two are freed on T (pending there while events are held) but are not
/// contiguous, so 4 MiB cannot be served until synchronising T returns them to the device.
#[test_case(false, false ; "real")]
#[test_case(true, false ; "simulated")]
#[test_case(false, true ; "real, frees pending on the stream")]
#[test_case(true, true ; "simulated, frees pending on the stream")]
fn oom_synchronizes_and_retries_once(simulated: bool, held: bool) {
    let d = host_device(7 * MIB, simulated);
    let t = d.create_stream().unwrap();
    let a = AsyncPoolAllocator::new(Arc::clone(&d), AsyncOptions::new(7 * MIB)).unwrap();
    d.set_events_held(held);
    let mut xs: Vec<_> = (0..3)
        .map(|_| a.allocate(2 * MIB, 0, t, "x").unwrap())
        .collect();
    let middle = xs.remove(1);
    for x in xs {
        a.deallocate(x).unwrap();
    }
    assert_eq!(
        usage(&d).reserved_current,
        6 * MIB,
        "freed memory stays in the pool"
    );
    assert_eq!(a.retries(), 0);
    let big = a.allocate(4 * MIB, 0, t, "big").unwrap();
    assert_eq!(a.retries(), 1, "served by the retry");
    assert_eq!(usage(&d).reserved_current, 6 * MIB);
    a.check_invariants().unwrap();

    // When the retry cannot help either, the report says both attempts failed.
    let e = a.allocate(MIB, 0, t, "more").unwrap_err();
    let report = e.oom_report().expect("an OOM report");
    assert!(report.cause.contains("retrying once"), "{}", report.cause);
    assert_eq!(report.limit, Some(7 * MIB));
    assert_eq!(report.bytes_in_use, 6 * MIB);
    assert_eq!(a.retries(), 2);

    a.deallocate(big).unwrap();
    a.deallocate(middle).unwrap();
    d.set_events_held(false);
    drop(a);
    assert_eq!(d.census().bytes_in_use, 0);
}

#[test_case(false ; "real")]
#[test_case(true ; "simulated")]
fn stats_count_requested_bytes(simulated: bool) {
    let d = host_device(CAPACITY, simulated);
    let a = AsyncPoolAllocator::new(Arc::clone(&d), AsyncOptions::new(32 * MIB)).unwrap();
    let x = a.allocate(1000, 0, Stream::DEFAULT, "x").unwrap();
    let y = a.allocate(3, 0, Stream::DEFAULT, "y").unwrap();
    let z = a.allocate(0, 0, Stream::DEFAULT, "z").unwrap();
    let s = a.stats();
    assert_eq!(s.num_allocs, 3);
    assert_eq!(s.bytes_in_use, 1003);
    assert_eq!(s.largest_alloc_size, 1000);
    assert_eq!(s.peak_bytes_in_use, 1003);
    assert_eq!(s.pool_bytes, 2 * MIB, "one 2 MiB segment");
    assert_eq!(usage(&d).used_current, 1024 + 256, "the pool rounds to 256");
    a.deallocate(x).unwrap();
    a.deallocate(z).unwrap();
    let s = a.stats();
    assert_eq!((s.bytes_in_use, s.peak_bytes_in_use), (3, 1003));
    a.deallocate(y).unwrap();
    a.check_invariants().unwrap();
}

#[test_case(false ; "real")]
#[test_case(true ; "simulated")]
fn the_limit_is_fraction_times_total(simulated: bool) {
    let d = host_device(CAPACITY, simulated);
    let a = build(&config(false, None), &d);
    let e = a
        .allocate(32 * MIB + 1, 0, Stream::DEFAULT, "x")
        .unwrap_err();
    let r = e.oom_report().expect("report");
    assert!(r.cause.contains("exceeds the limit"), "{}", r.cause);
    let x = a.allocate(30 * MIB, 0, Stream::DEFAULT, "x").unwrap();
    let e = a.allocate(3 * MIB, 0, Stream::DEFAULT, "y").unwrap_err();
    let r = e.oom_report().expect("report");
    assert!(r.cause.contains("limit"), "{}", r.cause);
    assert_eq!(r.bytes_in_use, 30 * MIB);
    let y = a.allocate(2 * MIB, 0, Stream::DEFAULT, "y").unwrap();
    assert!(matches!(
        a.allocate(1, 512, Stream::DEFAULT, "z"),
        Err(Error::InvalidAlignment { max: 256, .. })
    ));
    a.deallocate(x).unwrap();
    a.deallocate(y).unwrap();
}

#[test_case(false ; "real")]
#[test_case(true ; "simulated")]
fn census_returns_to_zero(simulated: bool) {
    let d = host_device(CAPACITY, simulated);
    let streams: Vec<Stream> = (0..3).map(|_| d.create_stream().unwrap()).collect();
    let a = build(&config(true, None), &d);
    let mut live = Vec::new();
    for i in 0..60u64 {
        let s = streams[(i % 3) as usize];
        live.push(a.allocate(1 + i * 7919 % (512 * 1024), 0, s, "x").unwrap());
        if i % 4 == 3 {
            a.deallocate(live.swap_remove((i as usize * 31) % live.len()))
                .unwrap();
        }
    }
    a.check_invariants().unwrap();
    let _leaked = live.pop().unwrap();
    for x in live {
        a.deallocate(x).unwrap();
    }
    assert_eq!(a.stats().bytes_in_use, _leaked.size());
    // Dropped with one allocation live: it is freed to the pool, and the pool trimmed.
    drop(a);
    let c = d.census();
    assert_eq!((c.allocations, c.bytes_in_use, c.events), (0, 0, 0));
    for s in streams {
        // SAFETY: the host device only compares stream handles; the test uses none after.
        unsafe { d.destroy_stream(s) }.unwrap();
    }
    assert!(d.census().is_empty());
}

#[test_case(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async")] ; "xla cuda_async")]
#[test_case(&[("TF_GPU_ALLOCATOR", "cuda_malloc_async")] ; "tf cuda_malloc_async")]
#[test_case(&[("PORTALLOC_ALLOCATOR", "async")] ; "portalloc async")]
fn variables_select_async(vars: &[(&str, &str)]) {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let c = Config::builder()
        .vars(move |name: &str| vars.get(name).cloned())
        .build()
        .unwrap();
    assert_eq!(c.strategy.value, StrategyKind::Async);
    let d = host_device(CAPACITY, true);
    assert_eq!(build(&c, &d).name(), "async");
}

/// A host device that hides its stream-ordered pool.
#[derive(Debug)]
struct NoPool(HostDevice);

impl DeviceWrapper for NoPool {
    type Inner = HostDevice;
    fn wrapped(&self) -> &HostDevice {
        &self.0
    }
    /// Virtual memory only: no pool, no peers.
    fn offers(&self, capability: Capability) -> bool {
        capability == Capability::VirtualMemory
    }
}

#[test]
fn a_device_without_a_pool_is_unsupported() {
    let d = NoPool(HostDevice::builder().capacity(CAPACITY).build().unwrap());
    let d = Arc::new(d);
    match AsyncPoolAllocator::new(Arc::clone(&d), AsyncOptions::new(MIB)) {
        Err(Error::Unsupported {
            what,
            backend,
            reason,
        }) => {
            assert!(what.contains("async"), "{what}");
            assert_eq!(backend, Vendor::Host.name());
            assert!(reason.contains("no stream-ordered memory pool"), "{reason}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let dynamic: Arc<dyn Device> = d;
    assert!(matches!(
        portalloc::strategy::build(&config(true, None), dynamic),
        Err(Error::Unsupported { .. })
    ));
}

#[test]
fn bad_prealloc_option_is_a_config_error() {
    let d = host_device(CAPACITY, true);
    let options = AsyncOptions {
        prealloc_bytes: Some(-2),
        ..AsyncOptions::new(MIB)
    };
    assert!(matches!(
        AsyncPoolAllocator::new(d, options),
        Err(Error::Config { .. })
    ));
}
