//! From configuration to allocator: the strategy the variables name is the strategy built,
//! one per device ordinal. (A strategy a device cannot serve is a typed `Unsupported` error,
//! never a silent fallback: tests/suite/vmm.rs and tests/suite/async_pool.rs check it per strategy.)

use crate::support::common::refused_free;
use portalloc::{Config, Error, Portalloc, StrategyKind, Vendor};
use test_case::test_case;

fn config(vars: &[(&str, &str)]) -> portalloc::Result<Config> {
    let vars: std::collections::HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::builder()
        .vars(move |name: &str| vars.get(name).cloned())
        .backend(Some(Vendor::Host))
        .host_simulated(true)
        .host_capacity(16 << 30)
        .build()
}

#[test_case(&[], "bfc" ; "no variables gives bfc")]
#[test_case(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")], "platform" ; "platform")]
#[test_case(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "address")], "platform" ; "address is platform")]
#[test_case(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "default")], "bfc" ; "default is bfc")]
#[test_case(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "vmm")], "vmm" ; "vmm on the host's virtual memory")]
#[test_case(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "cuda_async")], "async" ; "cuda_async on the host's pool")]
#[test_case(&[("TF_GPU_ALLOCATOR", "cuda_malloc_async")], "async" ; "tf cuda_malloc_async")]
#[test_case(&[("PORTALLOC_ALLOCATOR", "platform"), ("XLA_PYTHON_CLIENT_ALLOCATOR", "bfc")], "platform" ; "portalloc variable wins")]
fn variables_select_the_strategy(vars: &[(&str, &str)], name: &str) {
    let p = Portalloc::from_config(config(vars).unwrap()).unwrap();
    assert_eq!(p.discovery.chosen, Vendor::Host);
    assert_eq!(p.allocators.len(), 1);
    assert_eq!(p.allocator(0).unwrap().name(), name);
}

/// The limit is the fraction of total memory (16 GiB here); nothing is taken at
/// construction; the first allocation takes the whole limit when preallocating, a 2 MiB
/// region when growing.
#[test_case(&[("XLA_CLIENT_MEM_FRACTION", "0.5")], 8 << 30, 8 << 30 ; "the whole fraction at the first allocation")]
#[test_case(&[("XLA_PYTHON_CLIENT_PREALLOCATE", "false")], 12 << 30, 2 << 20 ; "growth starts with a 2 MiB region")]
fn bfc_takes_its_pool_at_the_first_allocation(
    vars: &[(&str, &str)],
    limit: u64,
    pool_after_first: u64,
) {
    let c = config(vars).unwrap();
    assert_eq!(c.strategy.value, StrategyKind::Bfc);
    let p = Portalloc::from_config(c).unwrap();
    let a = p.allocator(0).unwrap();
    assert_eq!(a.stats().bytes_limit, Some(limit));
    assert_eq!(a.stats().pool_bytes, 0, "nothing is taken at construction");
    let x = a.allocate(1, 0, portalloc::Stream::DEFAULT, "t").unwrap();
    assert_eq!(a.stats().pool_bytes, pool_after_first);
    a.deallocate(x).unwrap();
}

#[test]
fn one_allocator_per_device_ordinal() {
    let c = config(&[("PORTALLOC_HOST_DEVICES", "3")]).unwrap();
    let p = Portalloc::from_config(c).unwrap();
    assert_eq!(p.discovery.devices.len(), 3);
    assert_eq!(p.allocators.len(), 3);
    for (ordinal, device) in p.discovery.devices.iter().enumerate() {
        assert_eq!(device.info().ordinal, ordinal as u32);
    }
    // Each allocator has its own memory: an allocation on one is foreign to another.
    let a = p.allocator(0).unwrap();
    let b = p.allocator(1).unwrap();
    let x = a
        .allocate(1 << 20, 0, portalloc::Stream::DEFAULT, "t")
        .unwrap();
    assert!(matches!(
        refused_free(b.as_ref(), x),
        Error::ForeignAllocation { .. }
    ));
}

#[test_case("0" ; "zero")]
#[test_case("65" ; "too many")]
#[test_case("two" ; "not a number")]
fn host_device_count_out_of_range_is_an_error(value: &str) {
    let e = config(&[("PORTALLOC_HOST_DEVICES", value)])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("PORTALLOC_HOST_DEVICES") && e.contains("1 to 64"),
        "{e}"
    );
}
