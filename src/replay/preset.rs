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
    ("h100-80g", H100_80G),
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

const H100_80G: DeviceSpec = DeviceSpec {
    name: "h100-80g",
    capacity: 81_559 * MIB,
    granularity: 2 * MIB,
};

/// The preset `portalloc replay` uses when neither the options nor the trace choose one:
/// h100-80g.
pub const DEFAULT_DEVICE: DeviceSpec = H100_80G;

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

/// The preset whose GPU a trace's recorded device names (`TraceHeader::device`, as the
/// importers write it: `hip:0 AMD Instinct MI300X VF`, `cuda:0 NVIDIA H100 80GB HBM3`), or
/// `None` when no preset is that GPU.
///
/// A name matches only where the capacity is certain: `MI300X` is the mi300x (an MI300A or
/// MI325X is not), `H200` the h200, and `H100` the h100-80g only beside `80GB` or `PCIe` (the
/// H100 NVL has 94 GB, and other H100s other sizes). Words are compared whole and without
/// regard to case, so a `Tesla V100-SXM2-32GB` matches nothing.
///
/// ```
/// use portalloc::replay::preset::preset_for_recorded;
///
/// let named = |d: &str| preset_for_recorded(d).map(|p| p.name);
/// assert_eq!(named("hip:0 AMD Instinct MI300X VF"), Some("mi300x"));
/// assert_eq!(named("cuda:0 NVIDIA H100 80GB HBM3"), Some("h100-80g"));
/// assert_eq!(named("cuda:1 NVIDIA H100 NVL"), None); // 94 GB: no preset
/// assert_eq!(named("cuda:1 Tesla V100-SXM2-32GB"), None);
/// ```
///
/// # Time complexity
/// Linear in the length of `device`.
pub fn preset_for_recorded(device: &str) -> Option<DeviceSpec> {
    let words: Vec<String> = device
        .split(|c: char| c.is_whitespace() || c == '-' || c == '_' || c == ',')
        .map(str::to_ascii_uppercase)
        .collect();
    let has = |w: &str| words.iter().any(|x| x == w);
    let name = if has("MI300X") {
        "mi300x"
    } else if has("H200") {
        "h200"
    } else if has("H100") && (has("80GB") || has("PCIE")) {
        "h100-80g"
    } else {
        return None;
    };
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, d)| *d)
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
