//! What several test files build the same way: host devices, the strategies over them, and
//! allocate/free steps that check the allocator's invariants after each.
//!
//! Each test binary uses some of these, so the ones it does not use are not dead code.
#![allow(dead_code)]

use std::sync::Arc;

use portalloc::backends::host::HostDevice;
use portalloc::strategy::async_pool::{AsyncOptions, AsyncPoolAllocator};
use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
use portalloc::strategy::platform::PlatformAllocator;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator, Error, Stream};

/// A host device of `capacity` bytes: real host memory, or `simulated` (addresses only, no
/// memory behind them).
///
/// # Panics
/// When the host backend refuses the capacity.
pub fn host_device(capacity: u64, simulated: bool) -> Arc<HostDevice> {
    Arc::new(
        HostDevice::builder()
            .capacity(capacity)
            .simulated(simulated)
            .build()
            .unwrap(),
    )
}

/// A simulated host device of `capacity` bytes: room for addresses, no memory behind them.
///
/// # Panics
/// When the host backend refuses the capacity.
pub fn simulated_host(capacity: u64) -> Arc<HostDevice> {
    host_device(capacity, true)
}

/// A bfc allocator over `device` holding at most `limit` bytes, taken at the first
/// allocation (`preallocate`) or grown region by region.
///
/// # Panics
/// When bfc refuses the limit.
pub fn bfc(device: &Arc<HostDevice>, limit: u64, preallocate: bool) -> BfcAllocator<HostDevice> {
    BfcAllocator::new(Arc::clone(device), BfcOptions { limit, preallocate }).unwrap()
}

/// Allocates `size` bytes on the default stream, then checks the invariants.
///
/// # Panics
/// When the allocation fails or an invariant is broken.
pub fn alloc(a: &impl Allocator, size: u64) -> Allocation {
    let x = a.allocate(size, 0, Stream::DEFAULT, "test").unwrap();
    a.check_invariants().unwrap();
    x
}

/// Frees `x`, then checks the invariants.
///
/// # Panics
/// When the free fails or an invariant is broken.
pub fn free(a: &impl Allocator, x: Allocation) {
    a.deallocate(x).unwrap();
    a.check_invariants().unwrap();
}

/// Frees `x`, which `a` must refuse: the error, once the invariants are checked (a refusal
/// changes nothing).
///
/// # Panics
/// When the free succeeds or an invariant is broken.
pub fn refused_free(a: &(impl Allocator + ?Sized), x: Allocation) -> Error {
    let e = a
        .deallocate(x)
        .expect_err("a free that must be refused succeeded");
    a.check_invariants().unwrap();
    e
}

/// The strategies a sweep runs every case on, with bfc both preallocated and growing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    Bfc,
    BfcGrow,
    Platform,
    Vmm,
    Async,
}

impl Strategy {
    /// Every strategy, in the order above.
    pub const ALL: [Strategy; 5] = [
        Strategy::Bfc,
        Strategy::BfcGrow,
        Strategy::Platform,
        Strategy::Vmm,
        Strategy::Async,
    ];

    /// The strategy over `device`, holding at most `limit` bytes.
    ///
    /// # Panics
    /// When the strategy refuses the device or the limit.
    pub fn build(self, device: Arc<HostDevice>, limit: u64) -> Box<dyn Allocator> {
        match self {
            Strategy::Bfc | Strategy::BfcGrow => {
                let preallocate = self == Strategy::Bfc;
                Box::new(bfc(&device, limit, preallocate))
            }
            Strategy::Platform => Box::new(PlatformAllocator::new(device, Some(limit))),
            Strategy::Vmm => Box::new(VmmAllocator::new(device, VmmOptions::new(limit)).unwrap()),
            Strategy::Async => {
                Box::new(AsyncPoolAllocator::new(device, AsyncOptions::new(limit)).unwrap())
            }
        }
    }
}

/// Asserts that `text` contains each of `needles`, naming the first one it lacks.
///
/// # Panics
/// When a needle is missing.
pub fn assert_mentions_all(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }
}
