//! Backends: one folder per vendor, each implementing [`crate::Device`]. The host backend is
//! always compiled; `cuda` and `hip` come with their cargo features and share one GPU layer
//! (`gpu/`: `GpuDevice`, the books, the checks, the lock order, the rule for what is
//! `unsafe`, and the table of what differs between them on purpose). Unsafe code lives
//! here (and in `sys/`) only; every block says why it is sound in a `// SAFETY:` line.

use serde::Serialize;

use crate::device::Vendor;
use crate::error::{Error, Result};

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod descriptors;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod gpu;
#[cfg(feature = "hip")]
pub mod hip;
pub mod host;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub(crate) mod loader;
pub mod own_stream;
pub mod shared_segment;
pub mod staging;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub use gpu::{GpuDevice, VendorCensus};

/// Builder setters that store their argument as it is: `name: Type;` entries, each with its
/// doc comment, become `pub fn name(mut self, name: Type) -> Self`.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, $name: $ty) -> Self {
                self.$name = $name;
                self
            }
        )*
    };
}
pub(crate) use setters;

/// What a request for memory must be, on every backend: at least one byte (`what` says of
/// which kind, e.g. "a device allocation") and, rounded up to `unit` bytes, still a `u64`.
/// Returns the rounded size.
///
/// # Errors
/// [`Error::InvalidSize`] for zero or a size that overflows once rounded.
pub(crate) fn request_size(size: u64, unit: u64, what: Request) -> Result<u64> {
    if size == 0 {
        return Err(Error::InvalidSize {
            size,
            reason: match what {
                Request::Allocation => "a device allocation must be at least 1 byte",
                Request::PoolAllocation => "a pool allocation must be at least 1 byte",
                Request::PinnedHost => "pinned host memory must be at least 1 byte",
            },
        });
    }
    size.checked_next_multiple_of(unit)
        .ok_or(Error::InvalidSize {
            size,
            reason: "too large: rounding it up to the allocation unit overflows",
        })
}

/// The host side of a copy (`call` names it, `what` the pointer: `dst`, `src`): a non-null
/// pointer, and `[ptr, ptr + size)` inside the address space. `size` > 0. Returns the size as
/// the `usize` the copy takes.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the pointer and the size.
pub(crate) fn host_range(call: &'static str, what: &str, ptr: usize, size: u64) -> Result<usize> {
    let bytes = usize::try_from(size).ok();
    let refuse = |why: &str| Error::InvalidArgument {
        call,
        reason: format!(
            "host memory {what} = {ptr:#x} of {size} bytes {why}; accepted is a non-null pointer \
             to {size} bytes of host memory"
        ),
    };
    if ptr == 0 {
        return Err(refuse("is null"));
    }
    match bytes {
        Some(n) if ptr.checked_add(n).is_some() => Ok(n),
        _ => Err(refuse("runs past the end of the address space")),
    }
}

/// The kind of memory a [`request_size`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// [`crate::Device::alloc`].
    Allocation,
    /// [`crate::device::StreamOrderedPool::alloc_async`].
    PoolAllocation,
    /// [`crate::Device::alloc_pinned_host`].
    PinnedHost,
}

/// What probing one vendor backend found: the library it loaded, versions, devices, or the
/// vendor's own error name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Probe {
    /// The backend probed.
    pub backend: Option<Vendor>,
    /// The library path (or name) that was loaded.
    pub library: Option<String>,
    /// Every library tried and why it failed, when none loaded.
    pub load_failures: Vec<String>,
    /// The driver version, as the vendor writes it (`12.2`, `5.2.21153`).
    pub driver_version: Option<String>,
    /// The runtime version, where the vendor has one.
    pub runtime_version: Option<String>,
    /// Devices found.
    pub device_count: u32,
    /// One line per device (name, memory).
    pub devices: Vec<String>,
    /// The vendor's error, e.g. `CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected`.
    pub error: Option<String>,
}

#[cfg(any(feature = "cuda", feature = "hip"))]
impl Probe {
    /// A vendor's probe: the library loaded by `load` from `candidates` (or why not:
    /// `not_found` and each candidate's reason when none opened), then `survey` (which fills
    /// in the library and versions and counts the devices; its error is the vendor's, as
    /// `NAME (code): text`) and one line per device from `describe`.
    pub(crate) fn run<L>(
        backend: Vendor,
        candidates: Result<Vec<String>>,
        not_found: impl FnOnce(&[String]) -> String,
        load: impl FnOnce(&[String]) -> Result<L>,
        survey: impl FnOnce(&L, &mut Probe) -> Result<u32>,
        describe: impl Fn(&L, u32) -> Result<String>,
    ) -> Probe {
        let mut probe = Probe {
            backend: Some(backend),
            ..Probe::default()
        };
        let loaded = match candidates {
            Err(e) => Err(e.to_string()),
            Ok(candidates) => load(&candidates).map_err(|e| match e {
                Error::LibraryLoad { reason, .. } => {
                    probe.load_failures = reason.split("; ").map(String::from).collect();
                    not_found(&candidates)
                }
                other => other.to_string(),
            }),
        };
        let library = match loaded {
            Ok(library) => library,
            Err(why) => {
                probe.error = Some(why);
                return probe;
            }
        };
        match survey(&library, &mut probe) {
            Ok(count) => {
                probe.device_count = count;
                probe.devices = (0..count)
                    .map(|ordinal| describe(&library, ordinal).unwrap_or_else(|e| e.to_string()))
                    .collect();
            }
            Err(Error::Driver {
                code,
                name,
                message,
                ..
            }) => probe.error = Some(format!("{name} ({code}): {message}")),
            Err(e) => probe.error = Some(e.to_string()),
        }
        probe
    }
}
