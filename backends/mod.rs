//! Backends: one folder per vendor, each implementing [`crate::Device`]. The host backend is
//! always compiled; `cuda` and `hip` come with their cargo features and share one vendor
//! layer (`vendor/`: [`GpuDevice`], the books, the checks, the lock order, the rule for what
//! is `unsafe`, and the table of what differs between them on purpose). Unsafe code lives
//! here (and in `sys/`) only; every block says why it is sound in a `// SAFETY:` line.

use serde::Serialize;

use crate::device::Vendor;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;
pub mod host;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub(crate) mod loader;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod vendor;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub use vendor::{GpuDevice, VendorCensus};

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
