//! Device presets for replay: real capacities and granularities of common GPUs.

use serde::Serialize;

use crate::error::{Error, Result};

/// A simulated device to replay on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceSpec {
    /// Name for reports.
    pub name: &'static str,
    /// Total memory, bytes, as the driver reports it.
    pub capacity: u64,
    /// Virtual-memory granularity, bytes.
    pub granularity: u64,
}

const MIB: u64 = 1 << 20;

/// The presets `--device` accepts. Capacities are what the drivers report as total memory:
/// `nvidia-smi` shows 81559 MiB on an H100 80GB and 143771 MiB on an H200; `rocm-smi`
/// shows 206141652992 B of VRAM on an MI300X. Granularity is 2 MiB on all three (CUDA's
/// VMM granularity; ROCm's recommended granule, its minimum being 4 KiB).
pub const PRESETS: &[(&str, DeviceSpec)] = &[
    (
        "h100-80g",
        DeviceSpec {
            name: "h100-80g",
            capacity: 81_559 * MIB,
            granularity: 2 * MIB,
        },
    ),
    (
        "h200",
        DeviceSpec {
            name: "h200",
            capacity: 143_771 * MIB,
            granularity: 2 * MIB,
        },
    ),
    (
        "mi300x",
        DeviceSpec {
            name: "mi300x",
            capacity: 206_141_652_992,
            granularity: 2 * MIB,
        },
    ),
];

/// The preset of that name.
///
/// ```
/// use portalloc::replay::preset;
///
/// let h100 = preset("h100-80g")?;
/// assert_eq!((h100.capacity, h100.granularity), (81_559 << 20, 2 << 20));
/// // An unknown name is an error that lists the presets.
/// let unknown = preset("h100").unwrap_err().to_string();
/// assert!(unknown.contains("h100-80g") && unknown.contains("mi300x"));
/// # Ok::<(), portalloc::Error>(())
/// ```
///
/// # Errors
/// [`Error::Config`] listing the presets.
pub fn preset(name: &str) -> Result<DeviceSpec> {
    PRESETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, d)| *d)
        .ok_or_else(|| {
            Error::config(
                "--device",
                name,
                PRESETS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
}

/// The smallest simulated device: one 2 MiB granule.
pub const MIN_CAPACITY: u64 = 2 * MIB;

/// The largest simulated device: 1 TiB, over five times the largest GPU (MI300X, 192 GiB).
/// Replay keeps books per 2 MiB granule (vmm maps each), so this bounds its memory; a trace
/// that needs more does not fit one GPU anyway.
pub const MAX_CAPACITY: u64 = 1 << 40;

/// A device of `capacity` bytes (between [`MIN_CAPACITY`] and [`MAX_CAPACITY`]) with 2 MiB
/// granularity, for `--capacity`.
///
/// # Errors
/// [`Error::Config`] naming `--capacity` for a capacity outside that range.
pub fn custom_checked(capacity: u64) -> Result<DeviceSpec> {
    if !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
        return Err(Error::config(
            "--capacity",
            capacity.to_string(),
            "a size from 2 MiB (one granule) to 1 TiB (the largest simulated device), like 80GiB",
        ));
    }
    Ok(custom(capacity))
}

/// A device of `capacity` bytes with 2 MiB granularity, unchecked (see
/// [`custom_checked`]).
pub fn custom(capacity: u64) -> DeviceSpec {
    DeviceSpec {
        name: "custom",
        capacity,
        granularity: 2 * MIB,
    }
}
