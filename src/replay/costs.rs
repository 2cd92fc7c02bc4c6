//! What device calls cost on a GPU: a **model**, not a measurement of this machine. Replay
//! counts every call a strategy makes of the simulated device, by name and with the bytes it
//! acted on ([`CallTally`]); a [`DeviceCosts`] table prices each call as a fixed time plus a
//! time per MiB, and the copies by their bandwidth, so that a replay can say what the device
//! would have spent — where portalloc's own CPU time is not what a GPU user waits on: a
//! `cuMemCreate` of a 2 MiB handle takes about 193 µs, the whole CPU path of a vmm request a
//! fraction of one.
//!
//! Every figure of the built-in tables ([`DeviceCosts::for_vendor`]) says where it came from
//! and on which GPU it was measured ([`PricedCall::source`], [`PricedCall::measured_on`]); a
//! call nobody has published a figure for is left **unknown**, never guessed, and a replay
//! that makes it gets no modelled time (the calls it lacks are named).
//!
//! **Low and high.** Where the sources only bound a figure (`cuMemCreate`'s split between a
//! fixed and a per-MiB cost, unmap + release per GiB), a cost has a high end besides its low
//! one (`us_high`, `us_per_mib_high`; a bandwidth a low end, `to_host_low`, `to_device_low`),
//! and a [`ModelledTime`] gives both: `seconds` / `priced_seconds` with every figure at its
//! low end (the fastest the sources allow), `seconds_high` / `priced_seconds_high` at its high
//! end. A figure without a range is the same in both. The derivations are in the comments of
//! the tables below and in `docs/benchmarks.md` ("Device cost model").
//!
//! A table of one's own — measured by `scripts/gpu-check` on the GPU it runs on, or written by
//! hand — is read from JSON ([`DeviceCosts::from_json`]):
//!
//! ```json
//! {"calls": {"create_physical": {"us": 167.56, "us_per_mib": 12.88,
//!                                "us_high": 128.78, "us_per_mib_high": 32.27},
//!            "map": {"us": 1.45}},
//!  "copy_gib_s": {"to_host": 24.4, "to_device": 23.5},
//!  "unmap_waits_for_device": false}
//! ```
//!
//! Names are [`Call::NAMES`] (what `portalloc replay --json` counts in
//! `device_calls_by_name`); `copy_to_host` and `copy_from_host` are priced by `copy_gib_s`
//! (plus a fixed `us` where the table gives one). Every field but `calls` may be left out, as
//! may the high ends (then the same as the low ones): the JSON of earlier releases is read
//! as it was.
#![deny(unsafe_code)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::adaptor::Call;
use crate::adaptor::{CallTally, LoggedCall};
use crate::device::Vendor;
use crate::error::{Error, Result};

const MIB: f64 = (1u64 << 20) as f64;
const GIB: f64 = (1u64 << 30) as f64;

/// What one call costs: `us` per call plus `us_per_mib` per MiB it acts on
/// ([`Call::bytes`]) — at the low end; `us_high` and `us_per_mib_high` where the sources only
/// bound the figure (absent: the same as the low end).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallCost {
    /// Microseconds per call (the low end).
    #[serde(default)]
    pub us: f64,
    /// Microseconds per MiB the call acts on (the low end).
    #[serde(default)]
    pub us_per_mib: f64,
    /// Microseconds per call at the high end; `None`: `us`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub us_high: Option<f64>,
    /// Microseconds per MiB at the high end; `None`: `us_per_mib`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub us_per_mib_high: Option<f64>,
}

impl CallCost {
    /// A cost of `us` per call plus `us_per_mib` per MiB, with no range.
    pub const fn new(us: f64, us_per_mib: f64) -> CallCost {
        CallCost {
            us,
            us_per_mib,
            us_high: None,
            us_per_mib_high: None,
        }
    }

    /// A cost between a low end (`us`, `us_per_mib`) and a high one.
    pub const fn between(low: (f64, f64), high: (f64, f64)) -> CallCost {
        CallCost {
            us: low.0,
            us_per_mib: low.1,
            us_high: Some(high.0),
            us_per_mib_high: Some(high.1),
        }
    }

    /// Microseconds of `count` calls acting on `bytes` in all, at the low end.
    pub fn us_of(&self, count: u64, bytes: u64) -> f64 {
        count as f64 * self.us + bytes as f64 / MIB * self.us_per_mib
    }

    /// Microseconds of `count` calls acting on `bytes` in all, at the high end.
    pub fn us_of_high(&self, count: u64, bytes: u64) -> f64 {
        count as f64 * self.us_high.unwrap_or(self.us)
            + bytes as f64 / MIB * self.us_per_mib_high.unwrap_or(self.us_per_mib)
    }

    /// [`CallCost::us_of`] or [`CallCost::us_of_high`].
    fn us_at(&self, count: u64, bytes: u64, high: bool) -> f64 {
        if high {
            self.us_of_high(count, bytes)
        } else {
            self.us_of(count, bytes)
        }
    }
}

/// Copy bandwidths between device and pinned host memory, GiB/s; the low ends where the
/// sources give a range (the high time's; absent: the same).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyBandwidth {
    /// Device to host (`copy_to_host`), GiB/s.
    pub to_host: f64,
    /// Host to device (`copy_from_host`), GiB/s.
    pub to_device: f64,
    /// Device to host at the low end of its range, GiB/s; `None`: `to_host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_host_low: Option<f64>,
    /// Host to device at the low end of its range, GiB/s; `None`: `to_device`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_device_low: Option<f64>,
}

impl CopyBandwidth {
    /// Bandwidths with no range, GiB/s.
    pub const fn new(to_host: f64, to_device: f64) -> CopyBandwidth {
        CopyBandwidth {
            to_host,
            to_device,
            to_host_low: None,
            to_device_low: None,
        }
    }

    /// The bandwidth of a copy to the host (`to_device == false`) or to the device, GiB/s: the
    /// high end for the low time, the low end for the high time.
    fn of(&self, to_device: bool, high_time: bool) -> f64 {
        match (to_device, high_time) {
            (false, false) => self.to_host,
            (false, true) => self.to_host_low.unwrap_or(self.to_host),
            (true, false) => self.to_device,
            (true, true) => self.to_device_low.unwrap_or(self.to_device),
        }
    }
}

/// A call's price in a built-in table, and where the figure came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PricedCall {
    /// A name of [`Call::NAMES`].
    pub name: &'static str,
    /// The cost, `None` where no published figure was found (unknown).
    pub cost: Option<CallCost>,
    /// Where the figure came from, or why it is unknown.
    pub source: &'static str,
    /// The GPU (or machine) the figure was measured on — compare it with the preset's: an
    /// A100's or a GB10's figure stands in for an H100's, an NVIDIA GPU's for an MI300X's.
    /// Empty for a figure that is no measurement (a query priced 0, an unknown call).
    pub measured_on: &'static str,
}

/// A table of call costs and copy bandwidths (see the module's documentation).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceCosts {
    /// Cost by call name ([`Call::NAMES`]); a call absent is unpriced.
    #[serde(default)]
    pub calls: BTreeMap<String, CallCost>,
    /// The copies' bandwidths; absent, copies are unpriced.
    #[serde(default)]
    pub copy_gib_s: Option<CopyBandwidth>,
    /// An `unmap` first waits for all the device's work in flight, as a device
    /// synchronisation does ([`DeviceCosts::timeline_of`]): HIP's `hipMemUnmap` does
    /// (ROCm/rocm-systems#6982), CUDA's `cuMemUnmap` does not. Absent: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unmap_waits_for_device: bool,
}

/// The modelled time of some calls, low and high: seconds, or the calls a table does not
/// price.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelledTime {
    /// Seconds the priced calls take, summed, every figure at its low end; `None` when any
    /// call made is unpriced (a sum without them would understate the time by an unknown
    /// amount).
    pub seconds: Option<f64>,
    /// The same with every figure at its high end (equal to `seconds` where no figure used
    /// has a range).
    pub seconds_high: Option<f64>,
    /// Seconds the priced calls take at the low end, whether or not others are unpriced: a
    /// lower bound of the time where some are (equal to `seconds` where none is).
    pub priced_seconds: f64,
    /// The same at the high end.
    pub priced_seconds_high: f64,
    /// The names of the calls made that the table does not price.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unpriced: Vec<&'static str>,
}

/// Calls that stay on the CPU of a real driver as much as portalloc's own books do (queries
/// of state the driver keeps): priced 0 in the built-in tables, so that they never make a
/// modelled time unknown.
const QUERIES: &[&str] = &[
    "mem_info",
    "event_complete",
    "release_threshold",
    "usage",
    "can_access_peer",
];

// The derivations of the built-in figures (written out again, with the sources' links, in
// docs/benchmarks.md, "Device cost model"; `tests` below check the arithmetic).
//
// map + set_access (GB10, ovg-project/kvcached benchmarks/bench_layout/README.md): 33 µs for a
// 2 MiB mapping, 325 µs for a 64 MiB one. A line through the two points:
//   per MiB (325 − 33) / (64 − 2) = 4.7097 µs; per call 33 − 2 × 4.7097 = 23.58 µs.
// `map` keeps its own per-call figure (1.45 µs, A100, kvcached bench_vmm), so `set_access`
// is the rest: 23.58 − 1.45 = 22.13 µs per call plus 4.71 µs per MiB.
//
// cuMemCreate (`create_physical`): no source times it alone at two sizes; three points bound
// a fixed cost F per call plus p per MiB:
//   (a) 193.32 µs per 2 MiB handle (A100, one thread, average: kvcached bench_vmm):
//       F + 2p = 193.32 µs.
//   (b) one pool growth of 85.5 GiB (`cuMemAllocFromPoolAsync`: create + map + access) in
//       ≈ 1.54 s on an H20 (the timestamps of openxla/xla#19431's log): 1.54 s ÷ 87,552 MiB =
//       17.59 µs per MiB, of which map + access is 4.71 (above): p ≈ 12.88 µs per MiB.
//   (c) vLLM's level-1 wake of 32.13 GiB on an A100 (Qwen3-0.6B + LoRA: create + map +
//       access, and 0.08 GiB of weights copied back, 3.4 ms at 25 GB/s) in 1.22 s
//       (vllm-project/vllm#48337): (1.22 − 0.0034) s ÷ 32,901 MiB = 36.98 µs per MiB, less
//       map + access: p ≤ 32.27 µs per MiB.
//   The low end takes (b), the high end (c), each with F from (a): low F = 193.32 − 2 ×
//   12.88 = 167.56 µs, high F = 193.32 − 2 × 32.27 = 128.78 µs. (a) alone read as all per MiB
//   (96.66 µs per MiB) would make (b)'s growth 8.5 s, not 1.54 s: the fixed cost dominates a
//   2 MiB handle.
//
// unmap + release (vLLM's level-2 sleep, vllm#48337, A100): 32.13 GiB in 0.12 s (3.73 ms per
// GiB) and 47.40 GiB in 0.31 s (6.54 ms per GiB) — bounds of both calls together, per GiB
// only. Put on `unmap` per MiB (3.65 and 6.39 µs), with its fixed cost from kvcached's 25.63
// µs per 2 MiB unmap (A100): low F = 25.63 − 2 × 3.65 = 18.34 µs, high F = 25.63 − 2 × 6.39 =
// 12.86 µs. `release_physical` is in that figure: priced 0 on its own.
//
// Pinning (rapidsai/cudf PR #23457): `cudaHostAlloc` ≈ 0.49 s per GiB, linear to 16 GiB =
// 478.5 µs per MiB (`alloc_pinned_host`, which is `cuMemHostAlloc` / `hipHostMalloc`);
// touching the pages from 16 threads, then `cudaHostRegister`, ≈ 0.10 s per GiB = 97.7 µs per
// MiB ([`PIN_BY_REGISTER`]: `register_host`, `cuMemHostRegister_v2` / `hipHostRegister` after
// the backend's touch from up to 16 threads).

/// The GPU of kvcached's bench_vmm figures.
const A100_KVCACHED: &str = "A100 (ovg-project/kvcached benchmarks/bench_vmm)";

/// `cuMemCreate` (see the derivation above).
const CREATE: CallCost = CallCost::between((167.56, 12.88), (128.78, 32.27));
const CREATE_SOURCE: &str = "cuMemCreate, fixed + per MiB fitted by hand: 193.32 µs per 2 MiB \
     handle (A100: ovg-project/kvcached benchmarks/bench_vmm/README.md); low: an 85.5 GiB pool \
     growth in ≈1.54 s (H20: openxla/xla#19431's log), 17.59 µs/MiB less map + access's 4.71 \
     → 12.88 µs/MiB + 167.56 µs per call; high: vLLM's level-1 wake of 32.13 GiB in 1.22 s (A100: \
     vllm-project/vllm#48337), 36.98 µs/MiB less 4.71 → 32.27 µs/MiB + 128.78 µs per call";
const CREATE_ON: &str = "A100 and H20 (not the preset's GPU)";

/// `cuMemUnmap`, with `cuMemRelease`'s time (see the derivation above).
const UNMAP: CallCost = CallCost::between((18.34, 3.65), (12.86, 6.39));
const UNMAP_SOURCE: &str = "cuMemUnmap + cuMemRelease ≤ 3.73–6.54 ms per GiB (vLLM's level-2 \
     sleep of 32.13 GiB in 0.12 s and of 47.40 GiB in 0.31 s, A100: vllm-project/vllm#48337) as \
     3.65–6.39 µs/MiB, the fixed cost the rest of 25.63 µs per 2 MiB unmap (A100: \
     ovg-project/kvcached benchmarks/bench_vmm/README.md): 18.34–12.86 µs per call";

/// `cudaHostRegister` after touching the pages from 16 threads, per MiB: 0.10 s per GiB
/// (rapidsai/cudf PR #23457) — the faster way to pin host memory than `cudaHostAlloc`'s 0.49
/// s per GiB: the built-in tables' price of `register_host` ([`crate::Device::register_host`],
/// which touches the pages from up to 16 threads, then registers them).
pub const PIN_BY_REGISTER: (CallCost, &str) = (
    CallCost::new(0.0, 0.10e6 / 1024.0),
    "touching pages from 16 threads then cudaHostRegister ≈ 0.10 s per GiB \
     (rapidsai/cudf PR #23457)",
);

/// The built-in table of the CUDA presets (h100-80g, h200): each figure with its source and
/// the GPU it was measured on — none on an H100 or H200 (scripts/gpu-check measures the GPU
/// it runs on); the rest unknown.
const CUDA: &[PricedCall] = &[
    PricedCall {
        name: "reserve",
        cost: Some(CallCost::new(19.0, 0.0)),
        source: "cuMemAddressReserve of 8 GB: 19 µs (ovg-project/kvcached \
                 benchmarks/bench_vmm/README.md); modelled as per call",
        measured_on: A100_KVCACHED,
    },
    PricedCall {
        name: "create_physical",
        cost: Some(CREATE),
        source: CREATE_SOURCE,
        measured_on: CREATE_ON,
    },
    PricedCall {
        name: "map",
        cost: Some(CallCost::new(1.45, 0.0)),
        source: "cuMemMap of a 2 MiB handle: 1.45 µs (one thread, average: ovg-project/kvcached \
                 benchmarks/bench_vmm/README.md)",
        measured_on: A100_KVCACHED,
    },
    PricedCall {
        name: "set_access",
        cost: Some(CallCost::new(22.13, 4.71)),
        source: "cuMemMap + cuMemSetAccess: 33 µs at 2 MiB, 325 µs at 64 MiB \
                 (ovg-project/kvcached benchmarks/bench_layout/README.md): 23.58 µs per call + \
                 4.71 µs/MiB, less map's 1.45 µs",
        measured_on: "GB10 (not the preset's GPU)",
    },
    PricedCall {
        name: "unmap",
        cost: Some(UNMAP),
        source: UNMAP_SOURCE,
        measured_on: "A100 (not the preset's GPU)",
    },
    PricedCall {
        name: "release_physical",
        cost: Some(CallCost::new(0.0, 0.0)),
        source: "cuMemRelease: in unmap's figure (vLLM's level-2 sleep times unmap + release \
                 together: vllm-project/vllm#48337)",
        measured_on: "A100 (not the preset's GPU)",
    },
    PricedCall {
        name: "alloc_pinned_host",
        cost: Some(CallCost::new(0.0, 0.49e6 / 1024.0)),
        source: "cudaHostAlloc ≈ 0.49 s per GiB, linear to 16 GiB (rapidsai/cudf PR #23457); \
                 kept pinned copies cut a resume from 4.8 s to 0.6 s (torch_memory_saver PR #86)",
        measured_on: "another machine than the preset's (the host's page locking)",
    },
    PricedCall {
        name: "register_host",
        cost: Some(PIN_BY_REGISTER.0),
        source: PIN_BY_REGISTER.1,
        measured_on: "another machine than the preset's (the host's page locking)",
    },
];

/// What the HIP table says of a figure measured on NVIDIA GPUs.
const ON_NVIDIA: &str = "NVIDIA GPUs (no ROCm figure published): stands in for an MI300X";

/// The built-in table of HIP (mi300x): CUDA's figures where the call is the same (HIP's VMM
/// and pinned-memory calls mirror the driver API's), marked as measured on NVIDIA GPUs — no
/// ROCm figure was found published. HIP's unmap also waits for the device
/// ([`DeviceCosts::unmap_waits_for_device`]).
fn hip_table() -> Vec<PricedCall> {
    CUDA.iter()
        .map(|p| PricedCall {
            measured_on: ON_NVIDIA,
            ..*p
        })
        .collect()
}

/// Copy bandwidths between a preset's device and pinned host memory, with their source:
/// `None` where no published figure was found.
///
/// * h100-80g: 52 GB/s device→host, 51 GB/s host→device (nvbandwidth on an Azure ND H100 v5:
///   Azure/AI-benchmarking-guide, Azure_Results/ND_H100_v5).
/// * h200: 52 / 52 GB/s (the same guide, Azure_Results/ND_H200_v5).
/// * mi300x: 56 GB/s device→host, 55 GB/s host→device (TransferBench on an Azure ND MI300X
///   v5: samuel-bohman/AI-benchmarking-guide, Azure_Results/ND_MI300X_v5_results.md).
///
/// (An A100's, for comparison, is 25 GB/s falling to 16.5 GB/s for a 20 GiB copy:
/// NVIDIA/nvbandwidth#42 — not a preset; the derivation of `cuMemCreate`'s high end uses it.)
pub fn copy_for_preset(preset: &str) -> Option<(CopyBandwidth, &'static str)> {
    let gib_s = |gb_s: f64| gb_s * 1e9 / GIB;
    match preset {
        "h100-80g" => Some((
            CopyBandwidth::new(gib_s(52.0), gib_s(51.0)),
            "H100: 52 GB/s device→host, 51 GB/s host→device (nvbandwidth, Azure ND H100 v5: \
             Azure/AI-benchmarking-guide, Azure_Results/ND_H100_v5)",
        )),
        "h200" => Some((
            CopyBandwidth::new(gib_s(52.0), gib_s(52.0)),
            "H200: 52 GB/s each way (nvbandwidth, Azure ND H200 v5: \
             Azure/AI-benchmarking-guide, Azure_Results/ND_H200_v5)",
        )),
        "mi300x" => Some((
            CopyBandwidth::new(gib_s(56.0), gib_s(55.0)),
            "MI300X: 56 GB/s device→host, 55 GB/s host→device (TransferBench, Azure ND MI300X \
             v5: samuel-bohman/AI-benchmarking-guide, Azure_Results/ND_MI300X_v5_results.md)",
        )),
        _ => None,
    }
}

/// Why a call of the CUDA or HIP tables is unknown.
const UNKNOWN: &str = "unknown: no published per-call figure found (scripts/gpu-check \
                       measures it on the GPU it runs on)";

impl DeviceCosts {
    /// The built-in table of a vendor's driver (CUDA for h100-80g and h200, HIP for mi300x):
    /// each priced call with its source ([`DeviceCosts::sources_for`]), the others unknown.
    /// HIP's prices CUDA's figures (measured on NVIDIA GPUs, none of ROCm published) and has
    /// its unmap wait for the device ([`DeviceCosts::unmap_waits_for_device`]). (The host
    /// backend's is CUDA's: a replay models a GPU.)
    pub fn for_vendor(vendor: Vendor) -> DeviceCosts {
        let calls = Self::sources_for(vendor)
            .into_iter()
            .filter_map(|p| p.cost.map(|c| (p.name.to_string(), c)))
            .collect();
        DeviceCosts {
            calls,
            copy_gib_s: None,
            unmap_waits_for_device: vendor == Vendor::Hip,
        }
    }

    /// The built-in table of a preset of [`crate::replay::preset::PRESETS`]: its vendor's
    /// calls ([`DeviceCosts::for_vendor`]; HIP for mi300x, CUDA for the others) and its copy
    /// bandwidths ([`copy_for_preset`]).
    ///
    /// ```
    /// use portalloc::replay::costs::DeviceCosts;
    ///
    /// let h100 = DeviceCosts::for_preset("h100-80g");
    /// assert!(h100.copy_gib_s.is_some() && h100.calls.contains_key("create_physical"));
    /// // The MI300X's copies are published (TransferBench); ROCm's VMM calls are priced by
    /// // the NVIDIA figures, and its unmap waits for the device.
    /// let mi300x = DeviceCosts::for_preset("mi300x");
    /// assert!(mi300x.copy_gib_s.is_some() && mi300x.calls.contains_key("create_physical"));
    /// assert!(mi300x.unmap_waits_for_device && !h100.unmap_waits_for_device);
    /// ```
    pub fn for_preset(preset: &str) -> DeviceCosts {
        let vendor = if preset == "mi300x" {
            Vendor::Hip
        } else {
            Vendor::Cuda
        };
        DeviceCosts {
            copy_gib_s: copy_for_preset(preset).map(|(b, _)| b),
            ..Self::for_vendor(vendor)
        }
    }

    /// Every call of [`Call::NAMES`] with its price in the built-in table of `vendor`, where
    /// the figure came from (`unknown: …` where none was found) and the GPU it was measured
    /// on.
    pub fn sources_for(vendor: Vendor) -> Vec<PricedCall> {
        let known: Vec<PricedCall> = match vendor {
            Vendor::Hip => hip_table(),
            _ => CUDA.to_vec(),
        };
        Call::NAMES
            .iter()
            .map(|&name| {
                if let Some(p) = known.iter().find(|p| p.name == name) {
                    *p
                } else if QUERIES.contains(&name) {
                    PricedCall {
                        name,
                        cost: Some(CallCost::default()),
                        source: "a query of state the driver keeps: priced 0 (no device work)",
                        measured_on: "",
                    }
                } else {
                    PricedCall {
                        name,
                        cost: None,
                        source: UNKNOWN,
                        measured_on: "",
                    }
                }
            })
            .collect()
    }

    /// A table from its JSON (see the module's documentation).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `--device-costs` for JSON that is not such a table: a
    /// field of another name, a call name not in [`Call::NAMES`], a cost that is negative or
    /// not finite, a bandwidth that is not positive, a high end below its low end (a cost) or
    /// a low end above its high end (a bandwidth).
    pub fn from_json(text: &str) -> Result<DeviceCosts> {
        let refused = |reason: String| Error::InvalidArgument {
            call: "--device-costs",
            reason,
        };
        let costs: DeviceCosts = serde_json::from_str(text).map_err(|e| {
            refused(format!(
                "not a cost table ({}): expected {{\"calls\": {{\"<call>\": {{\"us\": …, \
                 \"us_per_mib\": …}}, …}}, \"copy_gib_s\": {{\"to_host\": …, \"to_device\": \
                 …}}}}",
                crate::text::cut_escaped(&e.to_string(), 200)
            ))
        })?;
        for (name, cost) in &costs.calls {
            if !Call::NAMES.contains(&name.as_str()) {
                return Err(refused(format!(
                    "no call is named {}; the calls are {}",
                    crate::text::shown(name),
                    Call::NAMES.join(", ")
                )));
            }
            let fields = [
                ("us", Some(cost.us)),
                ("us_per_mib", Some(cost.us_per_mib)),
                ("us_high", cost.us_high),
                ("us_per_mib_high", cost.us_per_mib_high),
            ];
            for (field, v) in fields {
                let Some(v) = v else { continue };
                if !(v.is_finite() && v >= 0.0) {
                    return Err(refused(format!(
                        "{name}.{field} is {v}: a cost is a finite number of microseconds, 0 \
                         or more"
                    )));
                }
            }
            // A range whose high end is below its low end at every size is a mistake; one
            // that trades a fixed cost for a per-MiB one (as cuMemCreate's does) is not.
            if cost.us_of_high(1, 1 << 20) < cost.us_of(1, 1 << 20)
                && cost.us_of_high(1, 1 << 40) < cost.us_of(1, 1 << 40)
            {
                return Err(refused(format!(
                    "{name}'s high end (us_high, us_per_mib_high) is below its low end at \
                     every size"
                )));
            }
        }
        if let Some(b) = costs.copy_gib_s {
            let fields = [
                ("to_host", Some(b.to_host)),
                ("to_device", Some(b.to_device)),
                ("to_host_low", b.to_host_low),
                ("to_device_low", b.to_device_low),
            ];
            for (field, v) in fields {
                let Some(v) = v else { continue };
                if !(v.is_finite() && v > 0.0) {
                    return Err(refused(format!(
                        "copy_gib_s.{field} is {v}: a bandwidth is a finite number of GiB/s \
                         above 0"
                    )));
                }
            }
            for (field, low, high) in [
                ("to_host_low", b.to_host_low, b.to_host),
                ("to_device_low", b.to_device_low, b.to_device),
            ] {
                if low.is_some_and(|low| low > high) {
                    return Err(refused(format!(
                        "copy_gib_s.{field} is above the bandwidth it is the low end of"
                    )));
                }
            }
        }
        Ok(costs)
    }

    /// The modelled time of `calls` made in this order by one thread, where copies overlap:
    /// each call costs its price on the CPU, in turn, except what the device does on its own
    /// after being asked — a copy runs on its direction's copy engine (one to the host, one
    /// to the device), starting when it is queued, its stream's earlier work is done and the
    /// engine is free, for its bytes over its bandwidth. A wait (`synchronize_stream`, `_event`,
    /// `_device`) holds the CPU until what it waits for is done, plus its own price; an event
    /// records when its stream's work queued so far is done, and `wait_event` holds a stream
    /// until then. Where the table says so ([`DeviceCosts::unmap_waits_for_device`]: HIP), an
    /// `unmap` waits for all the work in flight first, as `synchronize_device` does. The time
    /// is when the CPU is done and nothing is in flight — at the figures' low ends and at
    /// their high ends.
    ///
    /// [`DeviceCosts::time_of`] is the same calls with no overlap: their sum, at least this.
    ///
    /// ```
    /// use portalloc::adaptor::LoggedCall;
    /// use portalloc::replay::costs::DeviceCosts;
    ///
    /// let mut costs = DeviceCosts::from_json(
    ///     r#"{"calls": {"unmap": {"us": 25}, "synchronize_stream": {"us": 0}},
    ///         "copy_gib_s": {"to_host": 1, "to_device": 1}}"#,
    /// )?;
    /// let call = |name, bytes, stream| LoggedCall { name, bytes, stream, event: None };
    /// // A copy of 1 MiB (976.5625 µs at 1 GiB/s) queued, then 10 unmaps (250 µs) while it
    /// // runs, then a wait for it: the copy's time; the unmaps are hidden.
    /// let mut calls = vec![call("copy_to_host", 1 << 20, Some(1))];
    /// calls.extend((0..10).map(|_| call("unmap", 2 << 20, None)));
    /// calls.push(call("synchronize_stream", 0, Some(1)));
    /// let t = costs.timeline_of(&calls);
    /// assert!((t.seconds.unwrap() - 976.5625e-6).abs() < 1e-12);
    /// // Where an unmap waits for the device (HIP), the first waits for the copy: the sum.
    /// costs.unmap_waits_for_device = true;
    /// let t = costs.timeline_of(&calls);
    /// assert!((t.seconds.unwrap() - 1226.5625e-6).abs() < 1e-12);
    /// // Waiting first, then unmapping: the sum too.
    /// costs.unmap_waits_for_device = false;
    /// calls.rotate_right(1);
    /// calls.swap(0, 1);
    /// let t = costs.timeline_of(&calls);
    /// assert!((t.seconds.unwrap() - 1226.5625e-6).abs() < 1e-12);
    /// # Ok::<(), portalloc::Error>(())
    /// ```
    pub fn timeline_of(&self, calls: &[LoggedCall]) -> ModelledTime {
        let (low, unpriced) = self.timeline_us(calls, false);
        let (high, _) = self.timeline_us(calls, true);
        ModelledTime {
            seconds: unpriced.is_empty().then_some(low / 1e6),
            seconds_high: unpriced.is_empty().then_some(high / 1e6),
            priced_seconds: low / 1e6,
            priced_seconds_high: high / 1e6,
            unpriced,
        }
    }

    /// [`DeviceCosts::timeline_of`] at the low or the high ends: microseconds, and the calls
    /// unpriced.
    fn timeline_us(&self, calls: &[LoggedCall], high: bool) -> (f64, Vec<&'static str>) {
        use std::collections::HashMap;
        let mut cpu = 0.0f64;
        let mut engine = [0.0f64; 2];
        let mut stream_done: HashMap<u64, f64> = HashMap::new();
        let mut event_done: HashMap<u64, f64> = HashMap::new();
        let mut unpriced: Vec<&'static str> = Vec::new();
        let mut all_done = 0.0f64;
        for c in calls {
            let own = match self.calls.get(c.name) {
                Some(cost) => cost.us_at(1, c.bytes, high),
                None => 0.0,
            };
            let copy = match c.name {
                "copy_to_host" => Some((0, self.copy_gib_s.map(|b| b.of(false, high)))),
                "copy_from_host" => Some((1, self.copy_gib_s.map(|b| b.of(true, high)))),
                _ => None,
            };
            let known = match copy {
                Some((_, bandwidth)) => bandwidth.is_some(),
                None => self.calls.contains_key(c.name),
            };
            if !known && !unpriced.contains(&c.name) {
                unpriced.push(c.name);
            }
            let stream = c.stream.unwrap_or(0);
            match (copy, c.name) {
                (Some((direction, bandwidth)), _) => {
                    cpu += own;
                    let ready = stream_done.get(&stream).copied().unwrap_or(0.0);
                    let start = cpu.max(ready).max(engine[direction]);
                    let end =
                        start + bandwidth.map_or(0.0, |gib_s| c.bytes as f64 / (gib_s * GIB) * 1e6);
                    engine[direction] = end;
                    stream_done.insert(stream, end);
                    all_done = all_done.max(end);
                }
                (None, "synchronize_stream") => {
                    cpu = cpu.max(stream_done.get(&stream).copied().unwrap_or(0.0)) + own;
                }
                (None, "synchronize_device") => cpu = cpu.max(all_done) + own,
                // hipMemUnmap synchronises the device (ROCm/rocm-systems#6982): it returns
                // only after every copy in flight, so an unmap cannot hide behind one.
                (None, "unmap") if self.unmap_waits_for_device => cpu = cpu.max(all_done) + own,
                (None, "synchronize_event") => {
                    let at = c.event.and_then(|e| event_done.get(&e).copied());
                    cpu = cpu.max(at.unwrap_or(0.0)) + own;
                }
                (None, "record_event") => {
                    cpu += own;
                    let at = stream_done.get(&stream).copied().unwrap_or(0.0).max(cpu);
                    if let Some(e) = c.event {
                        event_done.insert(e, at);
                    }
                }
                (None, "wait_event") => {
                    cpu += own;
                    let at = c.event.and_then(|e| event_done.get(&e).copied());
                    let ready = stream_done.entry(stream).or_insert(0.0);
                    *ready = ready.max(at.unwrap_or(0.0));
                }
                _ => cpu += own,
            }
        }
        (cpu.max(all_done), unpriced)
    }

    /// The modelled time of `tally`: Σ count × `us` + MiB × `us_per_mib` over its calls, and
    /// each copy's bytes over its bandwidth — at the low ends and at the high ends.
    ///
    /// ```
    /// use portalloc::replay::costs::{CallCost, DeviceCosts};
    /// use portalloc::adaptor::CallTally;
    ///
    /// let costs = DeviceCosts::from_json(
    ///     r#"{"calls": {"map": {"us": 2},
    ///                   "create_physical": {"us": 10, "us_per_mib": 50, "us_per_mib_high": 60}}}"#,
    /// )?;
    /// let mut tally = CallTally::default();
    /// tally.by_name.insert("map", (3, 6 << 20));
    /// tally.by_name.insert("create_physical", (3, 6 << 20));
    /// // 3 × 2 µs + 3 × 10 µs + 6 MiB × 50 µs = 336 µs; at the high end 6 MiB × 60 µs: 396 µs
    /// let t = costs.time_of(&tally);
    /// assert!((t.seconds.unwrap() - 336e-6).abs() < 1e-12);
    /// assert!((t.seconds_high.unwrap() - 396e-6).abs() < 1e-12);
    /// tally.by_name.insert("unmap", (1, 2 << 20));
    /// assert_eq!(costs.time_of(&tally).unpriced, vec!["unmap"]);
    /// # Ok::<(), portalloc::Error>(())
    /// ```
    pub fn time_of(&self, tally: &CallTally) -> ModelledTime {
        let mut us = [0.0f64; 2];
        let mut unpriced = Vec::new();
        for (&name, &(count, bytes)) in &tally.by_name {
            let to_device = match name {
                "copy_to_host" => Some(false),
                "copy_from_host" => Some(true),
                _ => None,
            };
            let call = self.calls.get(name);
            match (to_device, self.copy_gib_s) {
                (Some(to_device), Some(b)) => {
                    for (i, high) in [(0, false), (1, true)] {
                        us[i] += bytes as f64 / (b.of(to_device, high) * GIB) * 1e6;
                        us[i] += call.map_or(0.0, |c| c.us_at(count, bytes, high));
                    }
                }
                (Some(_), None) => unpriced.push(name),
                (None, _) => match call {
                    Some(c) => {
                        us[0] += c.us_of(count, bytes);
                        us[1] += c.us_of_high(count, bytes);
                    }
                    None => unpriced.push(name),
                },
            }
        }
        ModelledTime {
            seconds: unpriced.is_empty().then_some(us[0] / 1e6),
            seconds_high: unpriced.is_empty().then_some(us[1] / 1e6),
            priced_seconds: us[0] / 1e6,
            priced_seconds_high: us[1] / 1e6,
            unpriced,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance
    }

    /// One low/high pair by hand: a wake that makes 10 handles of 20 MiB on h100-80g.
    /// Low: 10 × 167.56 µs + 200 MiB × 12.88 µs = 1,675.6 + 2,576.0 = 4,251.6 µs.
    /// High: 10 × 128.78 µs + 200 MiB × 32.27 µs = 1,287.8 + 6,454.0 = 7,741.8 µs.
    #[test]
    fn a_low_high_pair_is_the_hand_computation() {
        let costs = DeviceCosts::for_preset("h100-80g");
        let mut tally = CallTally::default();
        tally.by_name.insert("create_physical", (10, 200 << 20));
        let t = costs.time_of(&tally);
        assert!(close(t.seconds.unwrap(), 4251.6e-6, 1e-12), "{t:?}");
        assert!(close(t.seconds_high.unwrap(), 7741.8e-6, 1e-12), "{t:?}");
        // The same calls on a timeline: nothing overlaps them, the same pair.
        let log: Vec<LoggedCall> = (0..10)
            .map(|_| LoggedCall {
                name: "create_physical",
                bytes: 20 << 20,
                stream: None,
                event: None,
            })
            .collect();
        let t = costs.timeline_of(&log);
        assert!(close(t.seconds.unwrap(), 4251.6e-6, 1e-12), "{t:?}");
        assert!(close(t.seconds_high.unwrap(), 7741.8e-6, 1e-12), "{t:?}");
    }

    /// The fitted figures reproduce the published points they were fitted to (the
    /// derivations in the comment above the tables).
    #[test]
    fn the_fits_pass_through_the_published_points() {
        // cuMemCreate: both ends cost 193.32 µs for one 2 MiB handle (kvcached, A100).
        for high in [false, true] {
            assert!(close(CREATE.us_at(1, 2 << 20, high), 193.32, 0.01));
        }
        // Low end: the H20's 1.54 s for 85.5 GiB, less map + access's 4.71 µs per MiB.
        assert!(close(
            CREATE.us_per_mib,
            1.54e6 / (85.5 * 1024.0) - 4.71,
            0.01
        ));
        // High end: the A100's 1.22 s for 32.13 GiB less a 0.08 GiB copy at 25 GB/s.
        let copy_s = 0.08 * GIB / 25e9;
        assert!(close(
            CREATE.us_per_mib_high.unwrap(),
            (1.22 - copy_s) * 1e6 / (32.13 * 1024.0) - 4.71,
            0.01
        ));
        // map + set_access at 2 and 64 MiB (GB10): 33 and 325 µs.
        let table = DeviceCosts::for_vendor(Vendor::Cuda);
        let (map, access) = (table.calls["map"], table.calls["set_access"]);
        for (mib, us) in [(2u64, 33.0), (64, 325.0)] {
            let both = map.us_of(1, mib << 20) + access.us_of(1, mib << 20);
            assert!(close(both, us, 0.1), "{mib} MiB: {both} µs");
        }
        // unmap: 25.63 µs per 2 MiB at both ends; per GiB 3.73 and 6.54 ms less the fixed
        // costs of vLLM's few calls.
        for high in [false, true] {
            // (18.34 + 2 × 3.65 and 12.86 + 2 × 6.39 are 25.64: the figures' rounding.)
            assert!(close(UNMAP.us_at(1, 2 << 20, high), 25.63, 0.02));
        }
        assert!(close(UNMAP.us_per_mib * 1024.0, 0.12e6 / 32.13, 5.0));
        assert!(close(
            UNMAP.us_per_mib_high.unwrap() * 1024.0,
            0.31e6 / 47.40,
            5.0
        ));
    }

    /// mi300x is priced now (its copies by TransferBench, its calls by the NVIDIA figures,
    /// marked so), and a HIP unmap waits for the copy in flight where a CUDA one overlaps it.
    #[test]
    fn hip_prices_the_nvidia_figures_and_its_unmap_waits_for_the_device() {
        let hip = DeviceCosts::sources_for(Vendor::Hip);
        let create = hip.iter().find(|p| p.name == "create_physical").unwrap();
        assert!(create.cost.is_some() && create.measured_on.contains("NVIDIA"));
        let call = |name, bytes, stream| LoggedCall {
            name,
            bytes,
            stream,
            event: None,
        };
        // 1 GiB to the host (at 56 GB/s: 19.17 ms), then 64 unmaps of 2 MiB, then the wait.
        let mut log = vec![call("copy_to_host", 1 << 30, Some(1))];
        log.extend((0..64).map(|_| call("unmap", 2 << 20, None)));
        log.push(call("synchronize_stream", 0, Some(1)));
        let mut costs = DeviceCosts::for_preset("mi300x");
        costs
            .calls
            .insert("synchronize_stream".into(), CallCost::default());
        let copy_us = GIB / 56e9 * 1e6;
        let unmaps_us = 64.0 * UNMAP.us_of(1, 2 << 20);
        let waited = costs.timeline_of(&log);
        assert!(close(
            waited.seconds.unwrap() * 1e6,
            copy_us + unmaps_us,
            1e-6
        ));
        costs.unmap_waits_for_device = false;
        let overlapped = costs.timeline_of(&log);
        assert!(close(overlapped.seconds.unwrap() * 1e6, copy_us, 1e-6));
    }

    /// The JSON of earlier releases is read as it was; a range upside down is refused.
    #[test]
    fn old_json_is_read_and_a_reversed_range_refused() {
        let old = DeviceCosts::from_json(
            r#"{"calls": {"map": {"us": 1.45}}, "copy_gib_s": {"to_host": 24.4, "to_device": 23.5}}"#,
        )
        .unwrap();
        assert!(!old.unmap_waits_for_device && old.calls["map"].us_high.is_none());
        let round = serde_json::to_string(&old).unwrap();
        assert_eq!(DeviceCosts::from_json(&round).unwrap(), old, "{round}");
        let e = DeviceCosts::from_json(r#"{"calls": {"map": {"us": 2, "us_high": 1}}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("below its low end"), "{e}");
        let e = DeviceCosts::from_json(
            r#"{"copy_gib_s": {"to_host": 2, "to_device": 2, "to_host_low": 3}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("to_host_low is above"), "{e}");
    }
}
