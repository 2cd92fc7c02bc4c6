//! # portalloc
//!
//! One GPU memory allocator for NVIDIA (CUDA) and AMD (ROCm/HIP) GPUs. Vendor libraries are
//! loaded at run time, so one build runs on a CUDA box, a ROCm box or a laptop (where the
//! host backend stands in, with the same virtual-memory semantics as the GPU drivers).
//!
//! ## Layers
//!
//! | layer | where | what | unsafe? |
//! |---|---|---|---|
//! | raw FFI | `sys/` (crate [`sys`]) | types, constants, function-pointer tables for libcuda and libamdhip64; no logic | declarations only |
//! | shims | `backends/` ([`backends`]) | find and load a vendor library, resolve symbols (required → error, newer → `Option`), map error codes, implement [`Device`]; `host/` is always built | yes, each block with a `// SAFETY:` line |
//! | core | `src/` | [`Device`] and [`Allocator`] traits, [`config`], [`discover`](mod@discover), [`strategy`] | no: `#![deny(unsafe_code)]` outside `backends` |
//! | CLI | `src/bin/portalloc/` (feature `cli`) | `portalloc info`, `replay`, `ledger` | no |
//! | C ABI | `src/capi/` (feature `c-api`) | `include/portalloc.h`, PyTorch/CuPy hooks | raw pointers from C only, each block with a `// SAFETY:` line |
//!
//! Arrows point one way: strategies are generic over [`Device`] and know no vendor; backends
//! know the traits and `sys`; discovery and the CLI know the backends.
//!
//! ## Strategies
//!
//! | name | module | what |
//! |---|---|---|
//! | `bfc` | [`strategy::bfc`] | XLA's best-fit-with-coalescing, preallocated (`fraction × total` at the first allocation) or growing |
//! | `platform` | [`strategy::platform`] | every allocation is a device allocation |
//! | `vmm` | [`strategy::vmm`] | one reserved address range, physical granules mapped on demand, stitching |
//! | `async` | [`strategy::async_pool`] | the device's stream-ordered pool (cuMemAllocFromPoolAsync / hipMallocFromPoolAsync) |
//!
//! Around them: [`adaptor`] (ledger, counting device), [`diagnose`] (why memory ran out), and
//! behind features (see the README's *Cargo features*): the modules `trace` (feature `trace`:
//! record, import, export) and `replay` (feature `replay`: replay, plan capacity), and the C
//! ABI with the PyTorch/CuPy hooks (feature `c-api`).
//!
//! Start with [`Portalloc::from_env`] (discovery + configuration + strategy) and
//! [`DeviceBuffer`] (memory that frees itself on drop, in stream order), or build the pieces
//! yourself: a [`backends::host::HostDevice`], a [`config::Config`], and
//! [`strategy::build`]. The README's *From Rust* example is compiled as a doctest of this
//! crate. Streams are the caller's own handles, passed as they are: see the stream-ordering
//! contract on [`Device`].

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub use portalloc_sys as sys;

/// The README's Rust examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Implements [`std::fmt::Display`] for types with a `name()` method (enums of named values:
/// backends, strategies, formats, verdicts, …): each shows as its name.
macro_rules! display_as_name {
    ($($named:ty),+ $(,)?) => {
        $(
            impl std::fmt::Display for $named {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str(self.name())
                }
            }
        )+
    };
}

#[allow(unsafe_code)]
#[path = "../backends/mod.rs"]
pub mod backends;

pub mod adaptor;
pub mod allocator;
pub mod buffer;
#[cfg(feature = "c-api")]
pub mod capi;
pub mod config;
pub mod device;
pub mod diagnose;
pub mod discover;
pub mod error;
#[cfg(feature = "replay")]
pub mod replay;
pub mod report;
pub mod stats;
pub mod strategy;
#[cfg(feature = "trace")]
pub mod trace;
pub mod units;

pub use allocator::{Allocation, Allocator, Stats};
pub use buffer::{DeviceBuffer, RawBuffer};
pub use config::{Config, ConfigBuilder, Source, StrategyKind};
pub use device::{Device, DeviceInfo, MemInfo, Stream, Vendor};
pub use discover::{discover, Discovery, Portalloc};
pub use error::{Error, Result};
pub use report::OomReport;
