//! # portalloc
//!
//! One GPU memory allocator for NVIDIA (CUDA) and AMD (ROCm/HIP) GPUs. Vendor libraries are
//! loaded at run time, so one build runs on a CUDA box, a ROCm box or a laptop (where the
//! host backend stands in, with the same virtual-memory semantics as the GPU drivers).
//!
//! ```
//! use std::sync::Arc;
//!
//! use portalloc::{Allocator, Config, DeviceBuffer, Portalloc, Stream, Vendor};
//!
//! // The configuration, made in code: `ignore_env()` reads no environment variable, so the
//! // same code behaves the same in every process. The host backend is forced so that this
//! // runs anywhere, as a simulated 16 GiB GPU that tracks addresses and touches no memory;
//! // leave `backend` unset to discover CUDA, then HIP, then the host.
//! let config = Config::builder()
//!     .ignore_env()
//!     .backend(Some(Vendor::Host))
//!     .host_capacity(16 << 30)
//!     .host_simulated(true)
//!     .build()?;
//!
//! // Discovery, then the configured strategy (XLA's preallocating BFC by default) on every
//! // device; `discovery` says what each backend's probe found.
//! let portalloc = Portalloc::from_config(config)?;
//! assert_eq!(portalloc.discovery.chosen, Vendor::Host);
//! let allocator: Arc<dyn Allocator> = portalloc.allocator(0).expect("device 0");
//! assert_eq!(allocator.name(), "bfc");
//! // Its limit: the memory fraction (0.75, as in JAX) of the device's total memory.
//! assert_eq!(allocator.stats().bytes_limit, Some(12 << 30));
//!
//! // A stream is the caller's raw handle (a cudaStream_t, a CUstream, a hipStream_t),
//! // passed as it is; here the calling thread's default stream.
//! // SAFETY: the per-thread stream handle is always valid.
//! let stream = unsafe { Stream::from_raw(Stream::PER_THREAD.as_raw()) };
//!
//! // A buffer owns its memory and a handle to the allocator, and frees itself on drop, in
//! // stream order on its stream.
//! let activations = DeviceBuffer::new(&allocator, 256 << 20, stream)?;
//! assert_eq!(activations.size(), 256 << 20);
//! assert_eq!(allocator.stats().bytes_in_use, 256 << 20);
//! drop(activations);
//! assert_eq!(allocator.stats().bytes_in_use, 0);
//! # Ok::<(), portalloc::Error>(())
//! ```
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
//! Start with [`Portalloc::from_env`] (discovery + configuration + strategy, as JAX's variables
//! say) or [`Portalloc::from_config`] (a [`Config`] made in code, as above) and
//! [`DeviceBuffer`] (memory that frees itself on drop, in stream order), or build the pieces
//! yourself: a [`backends::host::HostDevice`], a [`config::Config`], and
//! [`strategy::build`] — or one strategy's constructor with its options
//! ([`strategy::bfc::BfcAllocator::new`], [`strategy::vmm::VmmAllocator::new`],
//! [`strategy::platform::PlatformAllocator::new`],
//! [`strategy::async_pool::AsyncPoolAllocator::new`]), wrapped in an
//! [`adaptor::LedgerAllocator`] to see what is live. The README's *From Rust* example
//! is compiled as a doctest of this crate. Streams are the caller's own handles, passed as
//! they are: see the stream-ordering contract on [`Device`].
//!
//! ## Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `cuda` | yes | the CUDA backend: libcuda, loaded at run time (no CUDA toolkit to build) |
//! | `hip` | yes | the HIP backend: libamdhip64, loaded at run time (no ROCm to build) |
//! | `cli` | yes | the `portalloc` command (`info`, `replay`, `ledger`); turns on `replay` |
//! | `trace` | through `cli` | allocation traces: format, importers, exporters, recording adaptor |
//! | `replay` | through `cli` | trace replay and the capacity planner; turns on `trace` |
//! | `cudarc` | no | a portalloc allocation lent to cudarc as a `CudaSlice`; turns on `cuda` |
//! | `c-api` | no | the C ABI (`include/portalloc.h`) and the PyTorch/CuPy hooks |
//!
//! A library that only allocates takes `default-features = false, features = ["cuda",
//! "hip"]`: the core (discovery, configuration, strategies, buffers, the ledger, the host
//! backend) and the backends, with no trace, replay or command-line code. Items behind a
//! feature are marked so on docs.rs.

#![deny(unsafe_code)]
#![warn(missing_docs)]
// docs.rs builds with `--cfg docsrs` (Cargo.toml's [package.metadata.docs.rs]) on nightly, where
// `doc_cfg` marks each item behind a feature with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

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
pub mod budget;
pub mod budget_report;
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
pub mod share;
pub mod sleep_tags;
pub mod stats;
pub mod strategy;
pub mod text;
#[cfg(feature = "trace")]
pub mod trace;
pub mod units;

pub use adaptor::GraphPools;
pub use allocator::{Allocation, Allocator, Keep, SleepReport, SleepingTag, Stats};
pub use buffer::{DeviceBuffer, RawBuffer};
pub use config::{Config, ConfigBuilder, Source, StrategyKind};
pub use device::{CaptureMode, CaptureStatus, Device, DeviceInfo, MemInfo, Stream, Vendor};
pub use discover::{discover, Discovery, Portalloc};
pub use error::{Error, Result};
pub use report::OomReport;
