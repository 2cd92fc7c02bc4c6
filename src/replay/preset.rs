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
    if has("MIG") {
        // A MIG slice ("NVIDIA H100 80GB HBM3 MIG 1g.10gb") has a share of the card's memory.
        return None;
    }
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

/// How far a recorded device's total memory may be from its preset's capacity and still be
/// that preset: drivers and frameworks report the total a little differently (an H100 80GB:
/// 81,559 MiB in `nvidia-smi`, 81,089 MiB as `totalGlobalMem`; an MI300X VF 0.3% below
/// `rocm-smi`'s figure), a partitioned GPU by far more.
const SAME_DEVICE_TOLERANCE: f64 = 0.03;

/// The device a trace replays on when the caller gives none, and why: the preset of the GPU
/// the trace names ([`preset_for_recorded`]) where its recorded total memory, if the trace
/// has one, agrees with the preset's (within 3%); else a device of that recorded memory (a MIG
/// slice, a partitioned MI300X, a V100: no preset is that GPU, but the trace says how much
/// memory it had); else [`DEFAULT_DEVICE`]. The reason is what `portalloc replay` prints on
/// its `replayed on` line and in `--json`'s `device_source`.
///
/// ```
/// use portalloc::replay::preset::device_for_recorded;
///
/// let (mi300x, why) = device_for_recorded(Some("hip:0 AMD Instinct MI300X VF"), Some(205_571_227_648));
/// assert_eq!(mi300x.name, "mi300x");
/// assert_eq!(why, "the trace's device, hip:0 AMD Instinct MI300X VF");
/// let (slice, why) =
///     device_for_recorded(Some("cuda:0 NVIDIA H100 80GB HBM3 MIG 1g.10gb"), Some(10 << 30));
/// assert_eq!((slice.name, slice.capacity), ("custom", 10 << 30));
/// assert!(why.starts_with("the memory the trace's device reports"), "{why}");
/// assert_eq!(device_for_recorded(None, None).1, "the default");
/// ```
pub fn device_for_recorded(device: Option<&str>, memory: Option<u64>) -> (DeviceSpec, String) {
    let Some(recorded) = device else {
        return (DEFAULT_DEVICE, "the default".to_string());
    };
    let preset = preset_for_recorded(recorded);
    let agrees = |p: &DeviceSpec, m: u64| {
        (m as f64 - p.capacity as f64).abs() <= SAME_DEVICE_TOLERANCE * p.capacity as f64
    };
    match (preset, memory) {
        (Some(p), None) => (p, format!("the trace's device, {recorded}")),
        (Some(p), Some(m)) if agrees(&p, m) => (p, format!("the trace's device, {recorded}")),
        (_, Some(m)) if (MIN_CAPACITY..=MAX_CAPACITY).contains(&m) => (
            custom(m),
            format!(
                "the memory the trace's device reports, {} ({recorded}){}",
                crate::units::Bytes(m),
                match preset {
                    Some(p) =>
                        format!(", not the {}'s {}", p.name, crate::units::Bytes(p.capacity)),
                    None => String::new(),
                }
            ),
        ),
        _ => (
            DEFAULT_DEVICE,
            format!(
                "the default: the trace's device, {recorded}, names no preset's GPU (--device \
                 or --capacity sets one)"
            ),
        ),
    }
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
