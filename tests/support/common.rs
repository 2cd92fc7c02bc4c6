//! What several test files build the same way: host devices, the strategies over them, and
//! allocate/free steps that check the allocator's invariants after each.

use std::sync::Arc;

use portalloc::backends::host::HostDevice;
use portalloc::device::Device;
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

    /// The strategy's name in messages: `bfc`, `bfc-grow`, `platform`, `vmm`, `async`.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Bfc => "bfc",
            Strategy::BfcGrow => "bfc-grow",
            Strategy::Platform => "platform",
            Strategy::Vmm => "vmm",
            Strategy::Async => "async",
        }
    }

    /// The strategy over `device`, holding at most `limit` bytes.
    ///
    /// # Panics
    /// When the strategy refuses the device or the limit.
    pub fn build(self, device: Arc<HostDevice>, limit: u64) -> Box<dyn Allocator> {
        self.try_build(device, limit)
            .unwrap_or_else(|e| panic!("{}: {e}", self.name()))
    }

    /// The strategy over any `device`, holding at most `limit` bytes.
    ///
    /// # Errors
    /// What the strategy's constructor returns: the device lacks what it needs, or a device
    /// call made while constructing failed.
    pub fn try_build<D: Device + ?Sized + 'static>(
        self,
        device: Arc<D>,
        limit: u64,
    ) -> Result<Box<dyn Allocator>, Error> {
        Ok(match self {
            Strategy::Bfc | Strategy::BfcGrow => Box::new(BfcAllocator::new(
                device,
                BfcOptions {
                    limit,
                    preallocate: self == Strategy::Bfc,
                },
            )?),
            Strategy::Platform => Box::new(PlatformAllocator::new(device, Some(limit))),
            Strategy::Vmm => Box::new(VmmAllocator::new(device, VmmOptions::new(limit))?),
            Strategy::Async => Box::new(AsyncPoolAllocator::new(device, AsyncOptions::new(limit))?),
        })
    }
}

/// A deterministic pseudo-random generator (xorshift64*): the same seed makes the same
/// sequence, so a run can be repeated call for call.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n`.
    ///
    /// # Panics
    /// When `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Log-uniform in `[lo, hi]` (`0 < lo ≤ hi`): sizes as a churn of many small and few
    /// large requests asks for them.
    pub fn size(&mut self, lo: u64, hi: u64) -> u64 {
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((a + u * (b - a)).exp() as u64).clamp(lo, hi)
    }
}

/// The first two of `allocations` (empty ones left out) whose ranges overlap, as
/// `[start, end)` pairs in address order; `None` when they are disjoint.
pub fn first_overlap<'a>(
    allocations: impl IntoIterator<Item = &'a Allocation>,
) -> Option<((u64, u64), (u64, u64))> {
    let mut spans: Vec<(u64, u64)> = allocations
        .into_iter()
        .filter(|a| !a.is_empty())
        .map(|a| (a.ptr(), a.ptr() + a.size()))
        .collect();
    spans.sort_unstable();
    spans
        .windows(2)
        .find(|w| w[0].1 > w[1].0)
        .map(|w| (w[0], w[1]))
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

/// What an `Error::Driver` says, to compare field by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFailure {
    /// `cuda` or `hip`.
    pub backend: &'static str,
    /// The vendor call that failed.
    pub call: &'static str,
    /// The vendor's code.
    pub code: i64,
    /// The vendor's name for the code.
    pub name: String,
    /// The vendor's text for the code.
    pub message: String,
}

/// The driver error `result` must be.
///
/// # Panics
/// When `result` is a success or another error.
pub fn driver_failure<T: std::fmt::Debug>(result: Result<T, Error>) -> DriverFailure {
    match result {
        Err(Error::Driver {
            backend,
            call,
            code,
            name,
            message,
        }) => DriverFailure {
            backend,
            call,
            code,
            name,
            message,
        },
        other => panic!("expected Error::Driver, got {other:?}"),
    }
}

/// Discovery and a growing bfc allocator on every device it finds, with the configuration
/// variables `vars` (given to the builder as a lookup: the process environment is neither
/// read nor touched).
///
/// # Panics
/// When the configuration, discovery or an allocator fails.
pub fn discover_with(vars: &[(&str, &str)]) -> portalloc::Portalloc {
    let vars: std::collections::HashMap<String, String> = vars
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    let config = portalloc::Config::builder()
        .vars(move |name| vars.get(name).cloned())
        .strategy(portalloc::StrategyKind::Bfc)
        .preallocate(false)
        .build()
        .unwrap();
    portalloc::Portalloc::from_config(config).unwrap()
}

/// Asserts that `p`'s discovery chose `vendor` and found `devices` devices of it, in ordinal
/// order, with an allocator each; the chosen candidate's probe.
///
/// # Panics
/// When any of that is not so.
pub fn assert_chosen(
    p: &portalloc::Portalloc,
    vendor: portalloc::Vendor,
    devices: usize,
) -> &portalloc::backends::Probe {
    assert_eq!(p.discovery.chosen, vendor);
    assert_eq!(p.discovery.devices.len(), devices);
    assert_eq!(p.allocators.len(), devices);
    for (ordinal, device) in p.discovery.devices.iter().enumerate() {
        assert_eq!(device.info().vendor, vendor);
        assert_eq!(device.info().ordinal, ordinal as u32);
    }
    let candidate = p
        .discovery
        .candidates
        .iter()
        .find(|c| c.backend == vendor)
        .unwrap_or_else(|| panic!("{vendor:?} is not a candidate: {:?}", p.discovery));
    assert_eq!(candidate.decision, portalloc::discover::Decision::Chosen);
    let probe = candidate
        .probe
        .as_ref()
        .expect("the chosen backend was probed");
    assert_eq!(probe.device_count as usize, devices);
    probe
}
