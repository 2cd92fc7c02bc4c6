//! Executable specification of how the growing `bfc` strategy (`bfc-grow`) meets its limit
//! and a refusing device: XLA's `BFCAllocator::Extend` — a new region is the next region
//! size capped at what the limit leaves (rounded down to 256 B), a request larger than what
//! the limit leaves is refused at once, and a region the device refuses is asked again ×0.9
//! smaller, down to the request, each try at least 256 B smaller than the last.

use crate::support::common::{alloc, bfc, simulated_host};
use portalloc::{Allocation, Allocator, Error, Stream};
use test_case::test_case;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The h100-80g preset's capacity (81,559 MiB, as `nvidia-smi` shows it).
const H100: u64 = 81_559 * MIB;
/// Its limit at fraction 0.75, as `portalloc replay` takes it: 59.74 GiB.
const H100_AT_075: u64 = H100 / 4 * 3;

fn oom_cause(result: portalloc::Result<Allocation>) -> String {
    match result {
        Err(Error::OutOfMemory(report)) => report.cause,
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
}

/// The review's trace: 10 GiB and 10 GiB held take regions of 16 GiB each (2 MiB doubled to
/// 16 GiB for the first, then the next region size), 32 GiB of the limit; 27.74 GiB is left.
/// A request that fits in what is left is served by a region capped at it (not the doubled
/// 32 GiB); one that does not is refused, as XLA refuses it, though only 20 GiB is in use:
/// the pool's 12 GiB free lies in two 6 GiB tails, and regions never merge — which the
/// cause says.
#[test_case(30 * GIB, None ; "30 GiB, more than the limit leaves, is refused")]
#[test_case(50 * GIB, None ; "50 GiB is refused")]
#[test_case(H100_AT_075 - 32 * GIB, Some(H100_AT_075 - 32 * GIB) ; "exactly what is left takes it all")]
#[test_case(20 * GIB, Some(H100_AT_075 - 32 * GIB) ; "20 GiB takes what is left, not 32 GiB")]
#[test_case(6 * GIB, None ; "6 GiB fits a free tail without growing")]
fn growth_is_capped_at_what_the_limit_leaves(request: u64, new_region: Option<u64>) {
    let a = bfc(&simulated_host(H100), H100_AT_075, false);
    let _x = alloc(&a, 10 * GIB);
    let _y = alloc(&a, 10 * GIB);
    assert_eq!(a.region_sizes(), vec![16 * GIB, 16 * GIB]);
    let left = H100_AT_075 - 32 * GIB;
    let served = request <= left;
    let result = a.allocate(request, 0, Stream::DEFAULT, "t");
    a.check_invariants().unwrap();
    let mut regions = vec![16 * GIB, 16 * GIB];
    regions.extend(new_region);
    assert_eq!(a.region_sizes(), regions);
    if served {
        let x = result.expect("served");
        assert_eq!(x.size(), request);
        assert_eq!(a.stats().bytes_in_use, 20 * GIB + request);
    } else {
        let cause = oom_cause(result);
        assert!(
            cause.contains("the limit of 59.74 GiB is reached")
                && cause.contains(
                    "the pool holds 32.00 GiB (12.00 GiB of it free, the largest free chunk \
                     6.00 GiB; regions never merge) and 27.74 GiB is left"
                ),
            "{cause}"
        );
    }
}

/// Limit 6 MiB + 2 KiB: six 1 MiB requests take regions of 2 and 4 MiB, filling a device of
/// 6 MiB + `spare`; a 256 B request then asks for the 2 KiB the limit leaves. The device
/// refuses what it has no room for and the size steps down, 256 B at a time at these sizes
/// (×0.9 rounded up to 256 B would give the same size back), until the device has room or
/// the size is below the request.
#[test_case(0, None ; "no room: 2048 down to 256, all refused")]
#[test_case(KIB, Some(KIB) ; "1 KiB free: 2048, 1792, 1536, 1280 refused, 1024 taken")]
#[test_case(2 * KIB, Some(2 * KIB) ; "2 KiB free: taken at the first try")]
fn small_back_off_steps_down_until_the_device_has_room(spare: u64, region: Option<u64>) {
    let dev = simulated_host(6 * MIB + spare);
    let a = bfc(&dev, 6 * MIB + 2 * KIB, false);
    let held: Vec<Allocation> = (0..6).map(|_| alloc(&a, MIB)).collect();
    assert_eq!(a.region_sizes(), vec![2 * MIB, 4 * MIB]);
    let result = a.allocate(256, 0, Stream::DEFAULT, "t");
    a.check_invariants().unwrap();
    let mut regions = vec![2 * MIB, 4 * MIB];
    regions.extend(region);
    assert_eq!(a.region_sizes(), regions);
    match region {
        Some(_) => assert_eq!(result.expect("served").size(), 256),
        None => {
            let cause = oom_cause(result);
            assert!(
                cause.contains("device refused") && cause.contains("backing off"),
                "{cause}"
            );
        }
    }
    drop(held);
}
