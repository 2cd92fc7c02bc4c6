//! Configuration from the environment, with JAX/XLA's exact semantics, and a builder.
//!
//! [`Config::from_env`] reads the process environment; [`Config::from_vars`] reads the same
//! variables through any lookup function (tests, embedders); [`Config::builder`] starts from
//! either and lets code override every setting. Every [`Setting`] records its [`Source`].
//!
//! ## Variables
//!
//! | variable | meaning | accepted values | default |
//! |---|---|---|---|
//! | `PORTALLOC_ALLOCATOR` | strategy | `default`, `platform`, `bfc`, `cuda_async`, `vmm`, `address`, `async` (case-insensitive, surrounding blanks ignored) | — |
//! | `XLA_PYTHON_CLIENT_ALLOCATOR` | strategy, as JAX reads it | `default`, `platform`, `bfc`, `cuda_async`, `vmm`, `address` (lowercased first, as JAX does) | `bfc` |
//! | `TF_GPU_ALLOCATOR` | strategy (the name the JAX docs give) | exactly `cuda_malloc_async` (selects `async`) | — |
//! | `PORTALLOC_MEM_FRACTION` | fraction of TOTAL device memory the allocator may use | a number in (0, 1] | — |
//! | `XLA_CLIENT_MEM_FRACTION` | same, as JAX reads it | a number in (0, 1] | `0.75` |
//! | `XLA_PYTHON_CLIENT_MEM_FRACTION` | deprecated spelling of `XLA_CLIENT_MEM_FRACTION` (warns) | a number in (0, 1] | — |
//! | `PORTALLOC_PREALLOCATE` | preallocate (`bfc`: one region of `fraction × total` at the first allocation) or grow | `true`, `false`, `1`, `0`, `yes`, `no`, `on`, `off` (case-insensitive) | — |
//! | `XLA_PYTHON_CLIENT_PREALLOCATE` | same, as JAX reads it | exactly `false`, `False` or `0` turn it off; **any other value is true** | `true` |
//! | `TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC` | bytes the `async` pool preallocates, as XLA reads it | `-1` or a non-negative integer byte count | unset |
//! | `PORTALLOC_BACKEND` | force a backend instead of discovering one | `auto`, `host`, `cuda`, `hip` (case-insensitive) | `auto` |
//! | `PORTALLOC_HOST_CAPACITY` | capacity of the host device, to simulate a GPU | a size > 0: `1024`, `2MiB`, `80GiB`, `141GB` | physical memory |
//! | `PORTALLOC_HOST_SIMULATED` | host device only tracks addresses, touching no memory | as `PORTALLOC_PREALLOCATE` | `false` |
//! | `PORTALLOC_HOST_DEVICES` | how many host devices discovery opens (ordinals 0…N−1), to exercise many-device code without GPUs | an integer from 1 to 64 | `1` |
//! | `PORTALLOC_PEER_ACCESS` | enable peer access between every two devices discovery opens that report it (see below) | as `PORTALLOC_PREALLOCATE` | `false` |
//! | `PORTALLOC_BACKTRACE` | the ledger captures a backtrace at every allocation | as `PORTALLOC_PREALLOCATE` | `false` |
//! | `PORTALLOC_CUDA_LIBRARY` | the CUDA driver library to load, alone, instead of `libcuda.so.1` | a path (UTF-8, no control characters) | `libcuda.so.1` (`nvcuda.dll`) |
//! | `PORTALLOC_HIP_LIBRARY` | the HIP runtime to load, alone, instead of searching | a path | search (below) |
//! | `ROCM_PATH` | ROCm's root: the HIP search looks in its `lib/` first (ROCm's own variable) | a path | unset |
//! | `HIP_PATH` | HIP's root: the HIP search looks in its `lib/` next (ROCm's own variable) | a path | unset |
//! | `PORTALLOC_HIP_MEMORY` | memory kind of plain HIP allocations | `coarse`, `fine`, `uncached` (also `coarse-grained`, `fine-grained`, `default`; case-insensitive) | `coarse` |
//! | `HSA_XNACK` | the ROCm runtime's XNACK mode, read for the HIP devices' notes only (the runtime reads it itself) | `0` or `1`, as the runtime reads it | unset |
//!
//! Without `PORTALLOC_HIP_LIBRARY`, the HIP search tries `libamdhip64.so.7`, `.6`, `.5` under
//! `$ROCM_PATH/lib`, `$HIP_PATH/lib` and `/opt/rocm/lib`, then the loader's search path.
//!
//! The shared budget between processes reads its own variables (`PORTALLOC_SHARED_BUDGET`,
//! `PORTALLOC_SHARED_BUDGET_DIR`, `PORTALLOC_SHARED_BUDGET_GROUP`, `PORTALLOC_FLOOR`,
//! `PORTALLOC_CEILING`, `PORTALLOC_RECLAIM_DEADLINE_MS`, `PORTALLOC_MEMBER_NAME`): see
//! [`crate::budget`] and [`crate::budget::VARIABLES`].
//!
//! Every other variable portalloc reads is here and in [`VARIABLES`]: the backends take these
//! values from the [`Config`] they are given, and read no variable themselves. The
//! constructors that take no `Config` (`backends::cuda::Driver::load_default`,
//! `backends::hip::HipDeviceBuilder::from_env`,
//! [`crate::adaptor::LedgerOptions::from_env`], …) read their few variables through
//! [`Config::from_env_vars`], with the same parsing.
//!
//! ## Peer access
//!
//! Off by default. Enabling it ([`ConfigBuilder::peer_access`], `PORTALLOC_PEER_ACCESS=1`, the
//! C ABI's `PortallocOptions::peer_access`) makes [`crate::Portalloc::from_config`] (and the C
//! ABI's `portalloc_create*`) call `cuCtxEnablePeerAccess` /
//! `hipDeviceEnablePeerAccess` between every two devices that report it, so that the `vmm`
//! strategy grants the peers access to what it maps. That changes the devices' primary
//! contexts, which the whole process shares (PyTorch, cudarc, CuPy see the change), so
//! portalloc does not do it unasked. XLA enables peer access between the devices of a
//! client: a JAX-like multi-GPU job that reads another device's buffers wants it on.
//!
//! The accepted lists are the constants of this module ([`XLA_ALLOCATOR_VALUES`],
//! [`PORTALLOC_ALLOCATOR_VALUES`], [`FRACTION_ACCEPTED`], …); error messages quote them.
//!
//! ## Precedence
//!
//! Highest first: the builder ([`ConfigBuilder`]), then `PORTALLOC_*`, then the XLA/TF
//! variables, then the default.
//!
//! - Strategy: `PORTALLOC_ALLOCATOR` > `XLA_PYTHON_CLIENT_ALLOCATOR` > `TF_GPU_ALLOCATOR`.
//!   XLA's own variable wins over TensorFlow's because it is the one JAX documents as the
//!   allocator switch (`TF_GPU_ALLOCATOR` is a legacy spelling); when both are set and
//!   disagree, a warning says which one was used.
//! - Fraction: `PORTALLOC_MEM_FRACTION` > `XLA_CLIENT_MEM_FRACTION` >
//!   `XLA_PYTHON_CLIENT_MEM_FRACTION`. Setting both XLA spellings is an error, as in JAX.
//! - Preallocate: `PORTALLOC_PREALLOCATE` > `XLA_PYTHON_CLIENT_PREALLOCATE`.
//!
//! ## Rules
//!
//! - **Empty values are unset.** A variable set to the empty string is treated as if it were
//!   not set at all (JAX does the same for the fraction variables).
//! - **Every set variable is validated**, even one overridden by a higher-precedence variable
//!   or by the builder: a value that cannot be used is an [`Error::Config`] naming the
//!   variable, the value and the accepted forms, never silently ignored. Use
//!   [`ConfigBuilder::ignore_env`] to not read the environment at all.
//! - **JAX's preallocate quirk is kept** for `XLA_PYTHON_CLIENT_PREALLOCATE`: JAX compares the
//!   value with `false`, `False` and `0` only, so `FALSE`, `no`, `off`, `n`, `f`, … mean
//!   *true*. portalloc reads them the same way (so a job behaves as it did under JAX) and adds a
//!   warning. portalloc's own `PORTALLOC_PREALLOCATE` and `PORTALLOC_HOST_SIMULATED` do not copy
//!   the quirk: they accept the usual boolean spellings and refuse anything else.
//! - Warnings (deprecated variables, surprising values, disagreeing variables) are collected
//!   in [`Config::warnings`] and also emitted with `tracing::warn!`.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::device::Vendor;
use crate::error::{Error, Result};
use crate::units::{parse_bytes, Bytes, SIZE_ACCEPTED};

/// `PORTALLOC_ALLOCATOR`: portalloc's strategy switch (beats the XLA/TF ones).
pub const PORTALLOC_ALLOCATOR: &str = "PORTALLOC_ALLOCATOR";
/// `XLA_PYTHON_CLIENT_ALLOCATOR`: JAX's strategy switch.
pub const XLA_PYTHON_CLIENT_ALLOCATOR: &str = "XLA_PYTHON_CLIENT_ALLOCATOR";
/// `TF_GPU_ALLOCATOR`: TensorFlow's switch; only `cuda_malloc_async` is accepted.
pub const TF_GPU_ALLOCATOR: &str = "TF_GPU_ALLOCATOR";
/// `PORTALLOC_MEM_FRACTION`: portalloc's memory fraction (beats the XLA ones).
pub const PORTALLOC_MEM_FRACTION: &str = "PORTALLOC_MEM_FRACTION";
/// `XLA_CLIENT_MEM_FRACTION`: JAX's memory fraction.
pub const XLA_CLIENT_MEM_FRACTION: &str = "XLA_CLIENT_MEM_FRACTION";
/// `XLA_PYTHON_CLIENT_MEM_FRACTION`: deprecated spelling of [`XLA_CLIENT_MEM_FRACTION`].
pub const XLA_PYTHON_CLIENT_MEM_FRACTION: &str = "XLA_PYTHON_CLIENT_MEM_FRACTION";
/// `PORTALLOC_PREALLOCATE`: portalloc's preallocate switch (beats the XLA one).
pub const PORTALLOC_PREALLOCATE: &str = "PORTALLOC_PREALLOCATE";
/// `XLA_PYTHON_CLIENT_PREALLOCATE`: JAX's preallocate switch.
pub const XLA_PYTHON_CLIENT_PREALLOCATE: &str = "XLA_PYTHON_CLIENT_PREALLOCATE";
/// `TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC`: bytes the async pool preallocates.
pub const TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC: &str = "TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC";
/// `PORTALLOC_BACKEND`: force a backend.
pub const PORTALLOC_BACKEND: &str = "PORTALLOC_BACKEND";
/// `PORTALLOC_HOST_CAPACITY`: capacity of the host device.
pub const PORTALLOC_HOST_CAPACITY: &str = "PORTALLOC_HOST_CAPACITY";
/// `PORTALLOC_HOST_SIMULATED`: host device tracks addresses only.
pub const PORTALLOC_HOST_SIMULATED: &str = "PORTALLOC_HOST_SIMULATED";
/// `PORTALLOC_HOST_DEVICES`: how many host devices discovery opens.
pub const PORTALLOC_HOST_DEVICES: &str = "PORTALLOC_HOST_DEVICES";
/// `PORTALLOC_PEER_ACCESS`: enable peer access between the devices discovery opens.
pub const PORTALLOC_PEER_ACCESS: &str = "PORTALLOC_PEER_ACCESS";
/// `PORTALLOC_BACKTRACE`: the ledger captures a backtrace at every allocation.
pub const PORTALLOC_BACKTRACE: &str = "PORTALLOC_BACKTRACE";
/// `PORTALLOC_CUDA_LIBRARY`: the CUDA driver library to load instead of `libcuda.so.1`.
pub const PORTALLOC_CUDA_LIBRARY: &str = "PORTALLOC_CUDA_LIBRARY";
/// `PORTALLOC_HIP_LIBRARY`: the HIP runtime library to load instead of searching.
pub const PORTALLOC_HIP_LIBRARY: &str = "PORTALLOC_HIP_LIBRARY";
/// `ROCM_PATH`: ROCm's root, searched for the HIP runtime (ROCm's own variable).
pub const ROCM_PATH: &str = "ROCM_PATH";
/// `HIP_PATH`: HIP's root, searched for the HIP runtime (ROCm's own variable).
pub const HIP_PATH: &str = "HIP_PATH";
/// `PORTALLOC_HIP_MEMORY`: memory kind of plain HIP allocations.
pub const PORTALLOC_HIP_MEMORY: &str = "PORTALLOC_HIP_MEMORY";
/// `HSA_XNACK`: the ROCm runtime's XNACK mode, reported in the HIP devices' notes.
pub const HSA_XNACK: &str = "HSA_XNACK";
/// What `PORTALLOC_HOST_DEVICES` accepts.
pub const HOST_DEVICES_ACCEPTED: &str = "an integer from 1 to 64";

/// Every variable read, in the order of the table in the module documentation.
pub const VARIABLES: &[&str] = &[
    PORTALLOC_ALLOCATOR,
    XLA_PYTHON_CLIENT_ALLOCATOR,
    TF_GPU_ALLOCATOR,
    PORTALLOC_MEM_FRACTION,
    XLA_CLIENT_MEM_FRACTION,
    XLA_PYTHON_CLIENT_MEM_FRACTION,
    PORTALLOC_PREALLOCATE,
    XLA_PYTHON_CLIENT_PREALLOCATE,
    TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC,
    PORTALLOC_BACKEND,
    PORTALLOC_HOST_CAPACITY,
    PORTALLOC_HOST_SIMULATED,
    PORTALLOC_HOST_DEVICES,
    PORTALLOC_PEER_ACCESS,
    PORTALLOC_BACKTRACE,
    PORTALLOC_CUDA_LIBRARY,
    PORTALLOC_HIP_LIBRARY,
    ROCM_PATH,
    HIP_PATH,
    PORTALLOC_HIP_MEMORY,
    HSA_XNACK,
];

/// Values of `XLA_PYTHON_CLIENT_ALLOCATOR` (after lowercasing).
pub const XLA_ALLOCATOR_VALUES: &[&str] =
    &["default", "platform", "bfc", "cuda_async", "vmm", "address"];
/// Values of `PORTALLOC_ALLOCATOR` and [`StrategyKind::parse`] (case-insensitive).
pub const PORTALLOC_ALLOCATOR_VALUES: &[&str] = &[
    "default",
    "platform",
    "bfc",
    "cuda_async",
    "vmm",
    "address",
    "async",
];
/// The one accepted value of `TF_GPU_ALLOCATOR`.
pub const TF_GPU_ALLOCATOR_VALUE: &str = "cuda_malloc_async";
/// Values of `PORTALLOC_BACKEND` (case-insensitive); `auto` discovers.
pub const BACKEND_VALUES: &[&str] = &["auto", "host", "cuda", "hip"];
/// `PORTALLOC_BACKEND`'s values and what each means.
const BACKEND_CHOICES: &[(&str, Option<Vendor>)] = &[
    ("auto", None),
    ("host", Some(Vendor::Host)),
    ("cuda", Some(Vendor::Cuda)),
    ("hip", Some(Vendor::Hip)),
];
/// Values of `PORTALLOC_HIP_MEMORY` (case-insensitive) and what each means; the first of
/// each kind is its [`HipMemoryKind::name`].
pub const HIP_MEMORY_CHOICES: &[(&str, HipMemoryKind)] = &[
    ("coarse", HipMemoryKind::Coarse),
    ("fine", HipMemoryKind::FineGrained),
    ("uncached", HipMemoryKind::Uncached),
    ("coarse-grained", HipMemoryKind::Coarse),
    ("coarsegrained", HipMemoryKind::Coarse),
    ("default", HipMemoryKind::Coarse),
    ("fine-grained", HipMemoryKind::FineGrained),
    ("finegrained", HipMemoryKind::FineGrained),
];
/// Accepted form of `PORTALLOC_HIP_MEMORY`.
pub const HIP_MEMORY_ACCEPTED: &str = "coarse (hipMalloc, the default), fine (fine-grained, \
     host-coherent) or uncached (ROCm 6+)";
/// Values of `HSA_XNACK`, as the ROCm runtime reads it, and what each means.
const XNACK_CHOICES: &[(&str, bool)] = &[("0", false), ("1", true)];
/// Accepted form of `HSA_XNACK`.
pub const XNACK_ACCEPTED: &str = "0 or 1 (the values the ROCm runtime reads)";
/// Accepted form of the path variables (`PORTALLOC_CUDA_LIBRARY`, `ROCM_PATH`, …).
pub const PATH_ACCEPTED: &str =
    "a path: UTF-8 text without control characters (a library file, or a root directory)";
/// Spellings of true for portalloc's own boolean variables (case-insensitive).
pub const BOOL_TRUE_VALUES: &[&str] = &["true", "1", "yes", "on"];
/// Spellings of false for portalloc's own boolean variables (case-insensitive).
pub const BOOL_FALSE_VALUES: &[&str] = &["false", "0", "no", "off"];
/// The exact values with which JAX turns `XLA_PYTHON_CLIENT_PREALLOCATE` off.
pub const JAX_PREALLOCATE_FALSE_VALUES: &[&str] = &["false", "False", "0"];
/// Values (compared case-insensitively) that look like false but JAX reads as true.
pub const JAX_PREALLOCATE_SURPRISING_VALUES: &[&str] = &["false", "no", "off", "0", "n", "f"];

/// Accepted form of a memory fraction.
pub const FRACTION_ACCEPTED: &str = "a number in (0, 1], e.g. 0.75";
/// Accepted form of portalloc's boolean variables.
pub const BOOL_ACCEPTED: &str = "true, false, 1, 0, yes, no, on or off (case-insensitive)";
/// Accepted form of `TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC`.
pub const ASYNC_PREALLOC_ACCEPTED: &str =
    "an integer, as XLA reads it: -1 or a non-negative byte count, e.g. 1073741824";
/// Accepted form of `PORTALLOC_HOST_CAPACITY`.
pub const HOST_CAPACITY_ACCEPTED: &str =
    "a size greater than 0 with an optional unit: 1024, 512KiB, 2MiB, 80GiB, 141GB";

/// The default memory fraction, as in XLA.
pub const DEFAULT_MEM_FRACTION: f64 = 0.75;

fn one_of(values: &[&str]) -> String {
    format!("one of {}", values.join(", "))
}

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

    /// Parses a strategy name: any of [`PORTALLOC_ALLOCATOR_VALUES`], case-insensitive,
    /// surrounding blanks ignored (`default` = `bfc`, `address` = `platform`,
    /// `cuda_async` = `async`).
    pub fn parse(name: &str) -> Option<StrategyKind> {
        match name.trim().to_lowercase().as_str() {
            "async" => Some(StrategyKind::Async),
            other => Self::parse_exact(other),
        }
    }

    /// The XLA names only (already lowercased), as `XLA_PYTHON_CLIENT_ALLOCATOR` takes them.
    fn parse_exact(name: &str) -> Option<StrategyKind> {
        match name {
            "default" | "bfc" => Some(StrategyKind::Bfc),
            "platform" | "address" => Some(StrategyKind::Platform),
            "vmm" => Some(StrategyKind::Vmm),
            "cuda_async" => Some(StrategyKind::Async),
            _ => None,
        }
    }
}

display_as_name!(StrategyKind);

impl FromStr for StrategyKind {
    type Err = Error;

    /// As [`StrategyKind::parse`]; the error names `strategy`, the value and the accepted list.
    fn from_str(s: &str) -> Result<StrategyKind> {
        StrategyKind::parse(s)
            .ok_or_else(|| Error::config("strategy", s, one_of(PORTALLOC_ALLOCATOR_VALUES)))
    }
}

/// Which kind of device memory plain HIP allocations get (`PORTALLOC_HIP_MEMORY`).
///
/// Here, with the configuration, so that every build reads the variable the same way; the
/// HIP backend re-exports it as `backends::hip::MemoryKind` with its allocation flags.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HipMemoryKind {
    /// Coarse-grained (`hipMalloc`): coherent at kernel boundaries, full bandwidth. Default.
    #[default]
    Coarse,
    /// Fine-grained (`hipExtMallocWithFlags(hipDeviceMallocFinegrained)`): coherent with the
    /// host while kernels run, at a bandwidth cost.
    FineGrained,
    /// Uncached (`hipExtMallocWithFlags(hipDeviceMallocUncached)`, ROCm 6+): fine-grained and
    /// bypassing the GPU caches, for memory the host polls.
    Uncached,
}

impl HipMemoryKind {
    /// The name `PORTALLOC_HIP_MEMORY` accepts: `coarse`, `fine` or `uncached`.
    pub fn name(self) -> &'static str {
        match self {
            HipMemoryKind::Coarse => "coarse",
            HipMemoryKind::FineGrained => "fine",
            HipMemoryKind::Uncached => "uncached",
        }
    }

    /// Parses any of [`HIP_MEMORY_CHOICES`] (case-insensitive, surrounding blanks ignored).
    pub fn parse(s: &str) -> Option<HipMemoryKind> {
        choose(HIP_MEMORY_CHOICES, s)
    }
}

display_as_name!(HipMemoryKind);

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

impl fmt::Display for Source {
    /// `default`, the variable's name, or `builder`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::Env(name) => f.write_str(name),
            Source::Builder => f.write_str("builder"),
        }
    }
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
        Setting {
            value,
            source: Source::Default,
        }
    }

    /// A value read from the environment variable `name`.
    pub fn env(value: T, name: &'static str) -> Self {
        Setting {
            value,
            source: Source::Env(name),
        }
    }

    /// A value given through the builder.
    pub fn builder(value: T) -> Self {
        Setting {
            value,
            source: Source::Builder,
        }
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
    /// How many host devices discovery opens (`PORTALLOC_HOST_DEVICES`), 1 to 64.
    pub host_devices: Setting<u32>,
    /// Whether [`crate::Portalloc::from_config`] (and the C ABI) enables peer access between
    /// the devices (`PORTALLOC_PEER_ACCESS`). Default off: see the module documentation.
    pub peer_access: Setting<bool>,
    /// Whether the ledger captures a backtrace at every allocation (`PORTALLOC_BACKTRACE`).
    pub backtrace: Setting<bool>,
    /// The CUDA driver library to load (`PORTALLOC_CUDA_LIBRARY`); `None` = `libcuda.so.1`.
    pub cuda_library: Setting<Option<String>>,
    /// The HIP runtime library to load (`PORTALLOC_HIP_LIBRARY`); `None` = search.
    pub hip_library: Setting<Option<String>>,
    /// ROCm's root (`ROCM_PATH`), searched first for the HIP runtime.
    pub rocm_path: Setting<Option<String>>,
    /// HIP's root (`HIP_PATH`), searched next for the HIP runtime.
    pub hip_path: Setting<Option<String>>,
    /// Memory kind of plain HIP allocations (`PORTALLOC_HIP_MEMORY`).
    pub hip_memory: Setting<HipMemoryKind>,
    /// The ROCm runtime's XNACK mode (`HSA_XNACK`), for the HIP devices' notes only; `None`
    /// when not set (the runtime's default mode).
    pub hsa_xnack: Setting<Option<bool>>,
    /// How this process joins its devices' shared budgets ([`crate::budget`]); `None`: it
    /// runs alone. Read from the environment, it is on unless `PORTALLOC_SHARED_BUDGET=0`
    /// (the host backend's devices join only when it is set to `1`); [`Config::default`] and
    /// [`ConfigBuilder::ignore_env`] leave it off (hermetic).
    pub shared_budget: Option<crate::budget::BudgetOptions>,
    /// Warnings found while reading (deprecated variables, values JAX reads surprisingly).
    pub warnings: Vec<String>,
    /// Whether the environment was consulted ([`Config::from_env`], [`Config::from_vars`], a
    /// builder without [`ConfigBuilder::ignore_env`]); false for [`Config::default`] and
    /// `ignore_env`. A default value then means "no variable set" rather than "no variable
    /// read", and only then may a message (the out-of-memory diagnosis) tell the user to set
    /// one.
    #[serde(skip)]
    pub env_read: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            strategy: Setting::default_value(StrategyKind::Bfc),
            mem_fraction: Setting::default_value(DEFAULT_MEM_FRACTION),
            preallocate: Setting::default_value(true),
            backend: Setting::default_value(None),
            async_prealloc: Setting::default_value(None),
            host_capacity: Setting::default_value(None),
            host_simulated: Setting::default_value(false),
            host_devices: Setting::default_value(1),
            peer_access: Setting::default_value(false),
            backtrace: Setting::default_value(false),
            cuda_library: Setting::default_value(None),
            hip_library: Setting::default_value(None),
            rocm_path: Setting::default_value(None),
            hip_path: Setting::default_value(None),
            hip_memory: Setting::default_value(HipMemoryKind::Coarse),
            hsa_xnack: Setting::default_value(None),
            shared_budget: None,
            warnings: Vec::new(),
            env_read: false,
        }
    }
}

/// Records a warning and emits it through `tracing`.
fn warn(warnings: &mut Vec<String>, message: String) {
    tracing::warn!("{message}");
    warnings.push(message);
}

/// A fraction in (0, 1]: finite, > 0, ≤ 1.
fn valid_fraction(value: f64) -> bool {
    value.is_finite() && value > 0.0 && value <= 1.0
}

fn parse_fraction(variable: &str, text: &str) -> Result<f64> {
    let err = || Error::config(variable, text, FRACTION_ACCEPTED);
    let value: f64 = text.trim().parse().map_err(|_| err())?;
    if valid_fraction(value) {
        Ok(value)
    } else {
        Err(err())
    }
}

/// portalloc's own booleans: [`BOOL_TRUE_VALUES`] / [`BOOL_FALSE_VALUES`], case-insensitive.
fn parse_bool(variable: &str, text: &str) -> Result<bool> {
    let t = text.trim().to_ascii_lowercase();
    if BOOL_TRUE_VALUES.contains(&t.as_str()) {
        Ok(true)
    } else if BOOL_FALSE_VALUES.contains(&t.as_str()) {
        Ok(false)
    } else {
        Err(Error::config(variable, text, BOOL_ACCEPTED))
    }
}

/// The value `choices` pairs with `text`, compared case-insensitively with surrounding blanks
/// ignored: the one reader of every variable that takes one of a fixed list of names.
fn choose<T: Copy>(choices: &[(&str, T)], text: &str) -> Option<T> {
    let folded = text.trim().to_ascii_lowercase();
    choices
        .iter()
        .find(|(name, _)| *name == folded)
        .map(|&(_, value)| value)
}

pub(crate) fn parse_backend(variable: &str, text: &str) -> Result<Option<Vendor>> {
    choose(BACKEND_CHOICES, text)
        .ok_or_else(|| Error::config(variable, text, one_of(BACKEND_VALUES)))
}

fn parse_hip_memory(variable: &str, text: &str) -> Result<HipMemoryKind> {
    HipMemoryKind::parse(text).ok_or_else(|| Error::config(variable, text, HIP_MEMORY_ACCEPTED))
}

fn parse_xnack(variable: &str, text: &str) -> Result<Option<bool>> {
    choose(XNACK_CHOICES, text)
        .map(Some)
        .ok_or_else(|| Error::config(variable, text, XNACK_ACCEPTED))
}

/// The one reader of path variables and options: the text as it is (a path may have
/// blanks), refused when it holds a control character, which no library or directory a user
/// means has.
///
/// # Errors
/// [`Error::Config`] naming `what`, the text and [`PATH_ACCEPTED`].
pub fn parse_path(what: &str, text: &str) -> Result<String> {
    if text.chars().any(char::is_control) {
        Err(Error::config(what, text, PATH_ACCEPTED))
    } else {
        Ok(text.to_string())
    }
}

/// `-1` or a non-negative integer, surrounding blanks allowed (as XLA's `safe_strto64`).
fn parse_async_prealloc(variable: &str, text: &str) -> Result<i64> {
    match text.trim().parse::<i64>() {
        Ok(v) if v >= -1 => Ok(v),
        _ => Err(Error::config(variable, text, ASYNC_PREALLOC_ACCEPTED)),
    }
}

fn parse_host_capacity(variable: &str, text: &str) -> Result<u64> {
    match parse_size(variable, text)? {
        0 => Err(Error::config(variable, text, HOST_CAPACITY_ACCEPTED)),
        n => Ok(n),
    }
}

/// Parses a size such as `80GiB` or `1024` ([`crate::units::parse_bytes`]); `what` names the
/// variable or option.
///
/// # Errors
/// [`Error::Config`] naming `what`, the text and the accepted forms.
pub fn parse_size(what: &str, text: &str) -> Result<u64> {
    parse_bytes(text).ok_or_else(|| Error::config(what, text, SIZE_ACCEPTED))
}

/// Reads an environment variable portalloc uses: `None` when unset, its text when set, and
/// an [`Error::Config`] naming it when the value is not UTF-8 — never ignored as if unset.
///
/// # Errors
/// [`Error::Config`] for a value that is not valid UTF-8 (shown lossily, at most 64
/// characters).
pub fn env_var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(raw)) => {
            let shown: String = raw.to_string_lossy().chars().take(64).collect();
            Err(Error::config(
                name,
                shown,
                "UTF-8 text (this value is not valid UTF-8, so it cannot be read)",
            ))
        }
    }
}

impl Config {
    /// Every variable a configuration reads: [`VARIABLES`].
    pub const VARIABLES: &'static [&'static str] = VARIABLES;

    /// Reads the process environment.
    ///
    /// # Errors
    /// As [`Config::from_vars`]; [`Error::Config`] naming a variable of
    /// [`VARIABLES`] whose value is not UTF-8.
    pub fn from_env() -> Result<Config> {
        let mut config = Config::from_env_vars(VARIABLES)?;
        // The shared budget's own variables ([`crate::budget::VARIABLES`]).
        config.shared_budget = crate::budget::BudgetOptions::from_env(true)?;
        Ok(config)
    }

    /// Reads only the variables `names` from the process environment, every other one being
    /// unset, with the parsing of [`Config::from_env`]: for the constructors that take no
    /// `Config` and read their few variables (`Driver::load_default` reads
    /// `PORTALLOC_CUDA_LIBRARY` this way).
    ///
    /// # Errors
    /// As [`Config::from_env`], for the variables `names` only.
    pub fn from_env_vars(names: &[&str]) -> Result<Config> {
        for name in names {
            env_var(name)?;
        }
        Config::from_vars_only(names, |name| std::env::var(name).ok())
    }

    /// As [`Config::from_vars`], asking `lookup` for the variables `names` only.
    ///
    /// # Errors
    /// As [`Config::from_vars`].
    pub fn from_vars_only(
        names: &[&str],
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Config> {
        Config::from_vars(|name| names.contains(&name).then(|| lookup(name)).flatten())
    }

    /// Reads variables through `lookup` (for tests and embedders).
    ///
    /// See the module documentation for the variables, their precedence and the rules.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        // Empty values are unset.
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let mut config = Config {
            env_read: true,
            ..Config::default()
        };
        let warnings = &mut config.warnings;

        // --- Strategy: PORTALLOC_ALLOCATOR > XLA_PYTHON_CLIENT_ALLOCATOR > TF_GPU_ALLOCATOR.
        let portalloc_strategy = match get(PORTALLOC_ALLOCATOR) {
            Some(v) => Some(StrategyKind::parse(&v).ok_or_else(|| {
                Error::config(PORTALLOC_ALLOCATOR, &v, one_of(PORTALLOC_ALLOCATOR_VALUES))
            })?),
            None => None,
        };
        let xla_strategy = match get(XLA_PYTHON_CLIENT_ALLOCATOR) {
            // JAX lowercases the value and compares it exactly.
            Some(v) => Some((
                StrategyKind::parse_exact(&v.to_lowercase()).ok_or_else(|| {
                    Error::config(
                        XLA_PYTHON_CLIENT_ALLOCATOR,
                        &v,
                        one_of(XLA_ALLOCATOR_VALUES),
                    )
                })?,
                v,
            )),
            None => None,
        };
        let tf_strategy = match get(TF_GPU_ALLOCATOR) {
            Some(v) if v == TF_GPU_ALLOCATOR_VALUE => Some(StrategyKind::Async),
            Some(v) => {
                return Err(Error::config(
                    TF_GPU_ALLOCATOR,
                    v,
                    format!("{TF_GPU_ALLOCATOR_VALUE} (the only value read)"),
                ))
            }
            None => None,
        };
        if let (Some((xla, text)), Some(tf)) = (&xla_strategy, tf_strategy) {
            if *xla != tf {
                warn(
                    warnings,
                    format!(
                        "{XLA_PYTHON_CLIENT_ALLOCATOR}={text} and \
                         {TF_GPU_ALLOCATOR}={TF_GPU_ALLOCATOR_VALUE} disagree; \
                         {XLA_PYTHON_CLIENT_ALLOCATOR} wins (strategy {xla})"
                    ),
                );
            }
        }
        if let Some(s) = portalloc_strategy {
            config.strategy = Setting::env(s, PORTALLOC_ALLOCATOR);
        } else if let Some((s, _)) = xla_strategy {
            config.strategy = Setting::env(s, XLA_PYTHON_CLIENT_ALLOCATOR);
        } else if let Some(s) = tf_strategy {
            config.strategy = Setting::env(s, TF_GPU_ALLOCATOR);
        }

        // --- Fraction: PORTALLOC_MEM_FRACTION > XLA_CLIENT_MEM_FRACTION > deprecated spelling.
        let xla_fraction = get(XLA_CLIENT_MEM_FRACTION);
        let deprecated_fraction = get(XLA_PYTHON_CLIENT_MEM_FRACTION);
        if let (Some(new), Some(old)) = (&xla_fraction, &deprecated_fraction) {
            return Err(Error::ConfigConflict(format!(
                "{XLA_CLIENT_MEM_FRACTION}={new:?} and {XLA_PYTHON_CLIENT_MEM_FRACTION}={old:?} \
                 are both set; remove {XLA_PYTHON_CLIENT_MEM_FRACTION}, the deprecated spelling"
            )));
        }
        if deprecated_fraction.is_some() {
            warn(
                warnings,
                format!(
                    "{XLA_PYTHON_CLIENT_MEM_FRACTION} is deprecated; \
                     use {XLA_CLIENT_MEM_FRACTION} (or {PORTALLOC_MEM_FRACTION}) instead"
                ),
            );
        }
        for variable in [
            XLA_PYTHON_CLIENT_MEM_FRACTION,
            XLA_CLIENT_MEM_FRACTION,
            PORTALLOC_MEM_FRACTION,
        ] {
            read_var(get, &mut config.mem_fraction, variable, parse_fraction)?;
        }

        // --- Preallocate: PORTALLOC_PREALLOCATE > XLA_PYTHON_CLIENT_PREALLOCATE (JAX's quirk).
        if let Some(v) = get(XLA_PYTHON_CLIENT_PREALLOCATE) {
            let value = !JAX_PREALLOCATE_FALSE_VALUES.contains(&v.as_str());
            let folded = v.trim().to_lowercase();
            if value && JAX_PREALLOCATE_SURPRISING_VALUES.contains(&folded.as_str()) {
                warn(
                    warnings,
                    format!(
                        "{XLA_PYTHON_CLIENT_PREALLOCATE}={v:?}: JAX reads this as true, so \
                         preallocation stays on; only `false`, `False` or `0` turn \
                         preallocation off"
                    ),
                );
            }
            config.preallocate = Setting::env(value, XLA_PYTHON_CLIENT_PREALLOCATE);
        }
        read_var(
            get,
            &mut config.preallocate,
            PORTALLOC_PREALLOCATE,
            parse_bool,
        )?;

        // --- The rest.
        let prealloc = |var: &str, v: &str| parse_async_prealloc(var, v).map(Some);
        let async_prealloc = &mut config.async_prealloc;
        read_var(
            get,
            async_prealloc,
            TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC,
            prealloc,
        )?;
        read_var(get, &mut config.backend, PORTALLOC_BACKEND, parse_backend)?;
        let capacity = |var: &str, v: &str| parse_host_capacity(var, v).map(Some);
        read_var(
            get,
            &mut config.host_capacity,
            PORTALLOC_HOST_CAPACITY,
            capacity,
        )?;
        read_var(
            get,
            &mut config.host_simulated,
            PORTALLOC_HOST_SIMULATED,
            parse_bool,
        )?;
        read_var(
            get,
            &mut config.host_devices,
            PORTALLOC_HOST_DEVICES,
            parse_host_devices,
        )?;
        read_var(
            get,
            &mut config.peer_access,
            PORTALLOC_PEER_ACCESS,
            parse_bool,
        )?;
        read_var(get, &mut config.backtrace, PORTALLOC_BACKTRACE, parse_bool)?;
        let path = |var: &str, v: &str| parse_path(var, v).map(Some);
        for (setting, variable) in [
            (&mut config.cuda_library, PORTALLOC_CUDA_LIBRARY),
            (&mut config.hip_library, PORTALLOC_HIP_LIBRARY),
            (&mut config.rocm_path, ROCM_PATH),
            (&mut config.hip_path, HIP_PATH),
        ] {
            read_var(get, setting, variable, path)?;
        }
        read_var(
            get,
            &mut config.hip_memory,
            PORTALLOC_HIP_MEMORY,
            parse_hip_memory,
        )?;
        read_var(get, &mut config.hsa_xnack, HSA_XNACK, parse_xnack)?;
        config.shared_budget = crate::budget::BudgetOptions::from_vars(&get, true)?;

        Ok(config)
    }

    /// A builder: the environment (or [`ConfigBuilder::vars`], or defaults with
    /// [`ConfigBuilder::ignore_env`]) first, then the builder's values over all of it.
    pub fn builder<'a>() -> ConfigBuilder<'a> {
        ConfigBuilder::default()
    }

    /// The allocator's memory limit for a device of `total` bytes: `fraction × total`.
    pub fn limit(&self, total: u64) -> u64 {
        (self.mem_fraction.value * total as f64) as u64
    }

    /// Every setting as `(setting, value, source)` rows, for `portalloc info`; the source is
    /// `default`, the variable's name, or `builder`.
    pub fn describe(&self) -> Vec<(String, String, String)> {
        fn row<T>(
            name: &str,
            setting: &Setting<T>,
            show: impl Fn(&T) -> String,
        ) -> (String, String, String) {
            let value = show(&setting.value);
            (name.to_string(), value, setting.source.to_string())
        }
        vec![
            row("strategy", &self.strategy, ToString::to_string),
            row("mem_fraction", &self.mem_fraction, ToString::to_string),
            row("preallocate", &self.preallocate, ToString::to_string),
            row("backend", &self.backend, |v| {
                v.map_or_else(|| "auto".to_string(), |v| v.to_string())
            }),
            row("async_prealloc", &self.async_prealloc, |v| {
                v.map_or_else(|| "unset".to_string(), |v| v.to_string())
            }),
            row("host_capacity", &self.host_capacity, |v| {
                v.map_or_else(
                    || "physical memory".to_string(),
                    |v| format!("{} ({v} bytes)", Bytes(v)),
                )
            }),
            row("host_simulated", &self.host_simulated, ToString::to_string),
            row("host_devices", &self.host_devices, ToString::to_string),
            row("peer_access", &self.peer_access, ToString::to_string),
            row("backtrace", &self.backtrace, ToString::to_string),
            row("cuda_library", &self.cuda_library, |v| {
                v.clone()
                    .unwrap_or_else(|| "libcuda.so.1 (the loader's search)".into())
            }),
            row("hip_library", &self.hip_library, |v| {
                v.clone()
                    .unwrap_or_else(|| "libamdhip64.so.{7,6,5} (searched)".into())
            }),
            row("rocm_path", &self.rocm_path, |v| {
                v.clone().unwrap_or_else(|| "unset".into())
            }),
            row("hip_path", &self.hip_path, |v| {
                v.clone().unwrap_or_else(|| "unset".into())
            }),
            row("hip_memory", &self.hip_memory, ToString::to_string),
            row("hsa_xnack", &self.hsa_xnack, |v| match v {
                Some(on) => u8::from(*on).to_string(),
                None => "unset".into(),
            }),
        ]
    }
}

/// Sets `setting` from the environment variable `variable` when it is set (as `get` finds
/// it), parsed by `parse`, whose error names the variable.
fn read_var<T>(
    get: impl Fn(&str) -> Option<String>,
    setting: &mut Setting<T>,
    variable: &'static str,
    parse: impl Fn(&str, &str) -> Result<T>,
) -> Result<()> {
    if let Some(v) = get(variable) {
        *setting = Setting::env(parse(variable, &v)?, variable);
    }
    Ok(())
}

/// Sets `setting` to the builder's `value` when it was given one.
fn set_by_builder<T>(setting: &mut Setting<T>, value: Option<T>) {
    if let Some(v) = value {
        *setting = Setting::builder(v);
    }
}

/// Parses `PORTALLOC_HOST_DEVICES`: 1 to 64.
fn parse_host_devices(variable: &str, value: &str) -> Result<u32> {
    match value.trim().parse::<u32>() {
        Ok(n) if (1..=64).contains(&n) => Ok(n),
        _ => Err(Error::config(variable, value, HOST_DEVICES_ACCEPTED)),
    }
}

/// A boxed variable lookup, as [`ConfigBuilder::vars`] takes it.
type Lookup<'a> = Box<dyn Fn(&str) -> Option<String> + 'a>;

/// Builds a [`Config`]: the environment first, then every value given here over it
/// (recorded as [`Source::Builder`]).
///
/// ```
/// use portalloc::config::{Config, Source, StrategyKind};
/// use portalloc::Error;
///
/// // Variables through a lookup, here a fixed table (`Config::builder()` alone reads the
/// // process environment): JAX's allocator switch and memory fraction.
/// let jax_job = |name: &str| match name {
///     "XLA_PYTHON_CLIENT_ALLOCATOR" => Some("platform".to_string()),
///     "XLA_CLIENT_MEM_FRACTION" => Some(".5".to_string()),
///     _ => None,
/// };
/// // The builder's values win over every variable, and each setting says where it came from.
/// let config = Config::builder().vars(jax_job).mem_fraction(0.9).build()?;
/// assert_eq!(config.strategy.value, StrategyKind::Platform);
/// assert_eq!(config.strategy.source, Source::Env("XLA_PYTHON_CLIENT_ALLOCATOR"));
/// assert_eq!(config.mem_fraction.value, 0.9);
/// assert_eq!(config.mem_fraction.source, Source::Builder);
/// assert_eq!(config.limit(1000), 900);
///
/// // `ignore_env`: the defaults, whatever the environment holds.
/// assert_eq!(Config::builder().ignore_env().build()?, Config::default());
///
/// // A value that cannot be used is an error naming the option, never ignored.
/// match Config::builder().ignore_env().mem_fraction(1.5).build() {
///     Err(Error::Config { variable, value, .. }) => {
///         assert_eq!((variable.as_str(), value.as_str()), ("mem_fraction", "1.5"));
///     }
///     other => panic!("expected a configuration error, got {other:?}"),
/// }
/// # Ok::<(), portalloc::Error>(())
/// ```
#[derive(Default)]
#[must_use]
pub struct ConfigBuilder<'a> {
    ignore_env: bool,
    lookup: Option<Lookup<'a>>,
    strategy: Option<StrategyKind>,
    mem_fraction: Option<f64>,
    preallocate: Option<bool>,
    backend: Option<Option<Vendor>>,
    async_prealloc: Option<i64>,
    host_capacity: Option<u64>,
    host_simulated: Option<bool>,
    host_devices: Option<u32>,
    peer_access: Option<bool>,
    backtrace: Option<bool>,
    cuda_library: Option<String>,
    hip_library: Option<String>,
    rocm_path: Option<String>,
    hip_path: Option<String>,
    hip_memory: Option<HipMemoryKind>,
    hsa_xnack: Option<Option<bool>>,
    shared_budget: Option<Option<crate::budget::BudgetOptions>>,
}

impl fmt::Debug for ConfigBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigBuilder")
            .field("ignore_env", &self.ignore_env)
            .field("lookup", &self.lookup.as_ref().map(|_| "<fn>"))
            .field("strategy", &self.strategy)
            .field("mem_fraction", &self.mem_fraction)
            .field("preallocate", &self.preallocate)
            .field("backend", &self.backend)
            .field("async_prealloc", &self.async_prealloc)
            .field("host_capacity", &self.host_capacity)
            .field("host_simulated", &self.host_simulated)
            .field("host_devices", &self.host_devices)
            .field("peer_access", &self.peer_access)
            .field("backtrace", &self.backtrace)
            .field("cuda_library", &self.cuda_library)
            .field("hip_library", &self.hip_library)
            .field("rocm_path", &self.rocm_path)
            .field("hip_path", &self.hip_path)
            .field("hip_memory", &self.hip_memory)
            .field("hsa_xnack", &self.hsa_xnack)
            .field("shared_budget", &self.shared_budget)
            .finish()
    }
}

/// The builder's setters: `name: T;` is `pub fn name(self, value: T) -> Self`, which gives
/// the setting `name` the builder's value.
macro_rules! builder_setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.$name = Some(value);
                self
            }
        )*
    };
}

impl<'a> ConfigBuilder<'a> {
    /// A builder that reads the process environment (same as [`Config::builder`]).
    pub fn new() -> Self {
        Self::default()
    }

    builder_setters! {
        /// The strategy.
        strategy: StrategyKind;
        /// Fraction of TOTAL device memory, in (0, 1]; checked by [`ConfigBuilder::build`].
        mem_fraction: f64;
        /// Preallocate or grow.
        preallocate: bool;
        /// Force a backend, or `None` to discover.
        backend: Option<Vendor>;
        /// Bytes the async pool preallocates: `-1` or ≥ 0, as XLA reads
        /// `TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC`; checked by [`ConfigBuilder::build`].
        async_prealloc: i64;
        /// Capacity of the host device in bytes (> 0; checked by [`ConfigBuilder::build`]).
        host_capacity: u64;
        /// Whether the host device only tracks addresses.
        host_simulated: bool;
        /// How many host devices discovery opens (1 to 64; checked by [`ConfigBuilder::build`]).
        host_devices: u32;
        /// Enable peer access between the devices [`crate::Portalloc::from_config`] opens
        /// (default off: it changes the primary contexts the whole process shares; see the
        /// module documentation).
        peer_access: bool;
        /// Capture a backtrace at every allocation of the ledger.
        backtrace: bool;
        /// The CUDA driver library to load, alone (checked by [`ConfigBuilder::build`]).
        cuda_library: String;
        /// The HIP runtime library to load, alone (checked by [`ConfigBuilder::build`]).
        hip_library: String;
        /// ROCm's root, searched first for the HIP runtime.
        rocm_path: String;
        /// HIP's root, searched next for the HIP runtime.
        hip_path: String;
        /// Memory kind of plain HIP allocations.
        hip_memory: HipMemoryKind;
        /// The ROCm runtime's XNACK mode, for the HIP devices' notes (`None`: not set).
        hsa_xnack: Option<bool>;
    }

    /// Start from the defaults instead of reading the environment: no variable of
    /// [`VARIABLES`] is read, by this build or by anything given the resulting [`Config`]
    /// (discovery, the backends, [`crate::Portalloc::from_config`], the ledger's options).
    pub fn ignore_env(mut self) -> Self {
        self.ignore_env = true;
        self
    }

    /// Join each device's shared budget with these options ([`crate::budget`]), or run alone
    /// (`None`), whatever the environment says.
    pub fn shared_budget(mut self, options: Option<crate::budget::BudgetOptions>) -> Self {
        self.shared_budget = Some(options);
        self
    }

    /// Read variables through `lookup` instead of the process environment (for tests).
    pub fn vars(mut self, lookup: impl Fn(&str) -> Option<String> + 'a) -> Self {
        self.lookup = Some(Box::new(lookup));
        self
    }

    /// The configuration: the environment (unless ignored), then the builder's values.
    ///
    /// # Errors
    /// Any [`Error::Config`] / [`Error::ConfigConflict`] of [`Config::from_vars`];
    /// an out-of-range builder value is an [`Error::Config`] naming the builder option
    /// (`mem_fraction`, `async_prealloc`, `host_capacity`, `host_devices`, a path with a
    /// control character).
    pub fn build(self) -> Result<Config> {
        let mut config = if self.ignore_env {
            Config::default()
        } else if let Some(lookup) = &self.lookup {
            Config::from_vars(lookup)?
        } else {
            Config::from_env()?
        };
        let checked = |name: &str, value: String, ok: bool, accepted: &str| {
            ok.then_some(())
                .ok_or_else(|| Error::config(name, value, accepted))
        };
        if let Some(f) = self.mem_fraction {
            checked(
                "mem_fraction",
                f.to_string(),
                valid_fraction(f),
                FRACTION_ACCEPTED,
            )?;
        }
        if let Some(a) = self.async_prealloc {
            checked(
                "async_prealloc",
                a.to_string(),
                a >= -1,
                ASYNC_PREALLOC_ACCEPTED,
            )?;
        }
        if let Some(c) = self.host_capacity {
            checked(
                "host_capacity",
                c.to_string(),
                c > 0,
                HOST_CAPACITY_ACCEPTED,
            )?;
        }
        if let Some(n) = self.host_devices {
            parse_host_devices("host_devices", &n.to_string())?;
        }
        let paths = [
            ("cuda_library", &self.cuda_library),
            ("hip_library", &self.hip_library),
            ("rocm_path", &self.rocm_path),
            ("hip_path", &self.hip_path),
        ];
        for (name, path) in paths {
            if let Some(path) = path {
                parse_path(name, path)?;
            }
        }
        set_by_builder(&mut config.strategy, self.strategy);
        set_by_builder(&mut config.mem_fraction, self.mem_fraction);
        set_by_builder(&mut config.preallocate, self.preallocate);
        set_by_builder(&mut config.backend, self.backend);
        set_by_builder(&mut config.async_prealloc, self.async_prealloc.map(Some));
        set_by_builder(&mut config.host_capacity, self.host_capacity.map(Some));
        set_by_builder(&mut config.host_simulated, self.host_simulated);
        set_by_builder(&mut config.host_devices, self.host_devices);
        set_by_builder(&mut config.peer_access, self.peer_access);
        set_by_builder(&mut config.backtrace, self.backtrace);
        set_by_builder(&mut config.cuda_library, self.cuda_library.map(Some));
        set_by_builder(&mut config.hip_library, self.hip_library.map(Some));
        set_by_builder(&mut config.rocm_path, self.rocm_path.map(Some));
        set_by_builder(&mut config.hip_path, self.hip_path.map(Some));
        set_by_builder(&mut config.hip_memory, self.hip_memory);
        set_by_builder(&mut config.hsa_xnack, self.hsa_xnack);
        if let Some(budget) = self.shared_budget {
            config.shared_budget = budget;
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_with_no_variables() {
        let c = Config::from_vars(|_| None).unwrap();
        // The defaults, read from an environment that sets nothing.
        assert!(c.env_read);
        // The shared budget is on (its options' defaults) when the environment is read.
        assert_eq!(
            c,
            Config {
                env_read: true,
                shared_budget: crate::budget::BudgetOptions::from_vars(&|_| None, true).unwrap(),
                ..Config::default()
            }
        );
        assert_eq!(c.limit(1000), 750);
    }

    #[test]
    fn strategy_parse_round_trips() {
        for kind in [
            StrategyKind::Bfc,
            StrategyKind::Platform,
            StrategyKind::Vmm,
            StrategyKind::Async,
        ] {
            assert_eq!(StrategyKind::parse(kind.name()), Some(kind));
            assert_eq!(kind.to_string().parse::<StrategyKind>().unwrap(), kind);
        }
        assert_eq!(StrategyKind::parse("nope"), None);
    }
}
