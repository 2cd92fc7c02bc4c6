//! Configuration from the environment, with JAX/XLA's exact semantics, and a builder.
//!
//! (Interface fixed here; parsing is being written.)

use serde::Serialize;

use crate::device::Vendor;
use crate::error::Result;

/// Which strategy to build.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StrategyKind {
    /// XLA's BFC (`default`, `bfc`).
    Bfc,
    /// Allocate and free on demand (`platform`, `address`).
    Platform,
    /// Virtual-memory strategy (`vmm`).
    Vmm,
    /// Stream-ordered pool (`cuda_async`, `TF_GPU_ALLOCATOR=cuda_malloc_async`).
    Async,
}

impl StrategyKind {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Bfc => "bfc",
            StrategyKind::Platform => "platform",
            StrategyKind::Vmm => "vmm",
            StrategyKind::Async => "async",
        }
    }
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "lowercase")]
pub enum Source {
    /// The built-in default.
    Default,
    /// An environment variable (its name).
    Env(&'static str),
    /// The builder API.
    Builder,
}

/// A value and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setting<T> {
    /// The effective value.
    pub value: T,
    /// Its origin.
    pub source: Source,
}

impl<T> Setting<T> {
    /// A default value.
    pub fn default_value(value: T) -> Self {
        Setting { value, source: Source::Default }
    }
}

/// The effective configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    /// The strategy.
    pub strategy: Setting<StrategyKind>,
    /// Fraction of TOTAL device memory the allocator may use, in (0, 1]. Default 0.75.
    pub mem_fraction: Setting<f64>,
    /// Preallocate (`bfc`: one region at the first allocation) or grow. Default true.
    pub preallocate: Setting<bool>,
    /// A forced backend (`PORTALLOC_BACKEND`), or `None` to discover.
    pub backend: Setting<Option<Vendor>>,
    /// `TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC`, as XLA reads it.
    pub async_prealloc: Setting<Option<i64>>,
    /// Capacity of the host device (`PORTALLOC_HOST_CAPACITY`); `None` = physical memory.
    pub host_capacity: Setting<Option<u64>>,
    /// Whether the host device only tracks addresses (`PORTALLOC_HOST_SIMULATED`).
    pub host_simulated: Setting<bool>,
    /// Warnings found while reading (deprecated variables, values JAX reads surprisingly).
    pub warnings: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            strategy: Setting::default_value(StrategyKind::Bfc),
            mem_fraction: Setting::default_value(0.75),
            preallocate: Setting::default_value(true),
            backend: Setting::default_value(None),
            async_prealloc: Setting::default_value(None),
            host_capacity: Setting::default_value(None),
            host_simulated: Setting::default_value(false),
            warnings: Vec::new(),
        }
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads variables through `lookup` (for tests and embedders).
    pub fn from_vars(_lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        Ok(Config::default())
    }

    /// The allocator's memory limit for a device of `total` bytes: `fraction × total`.
    pub fn limit(&self, total: u64) -> u64 {
        (self.mem_fraction.value * total as f64) as u64
    }
}
