//! What device calls cost on a GPU: a **model**, not a measurement of this machine. Replay
//! counts every call a strategy makes of the simulated device, by name and with the bytes it
//! acted on ([`CallTally`]); a [`DeviceCosts`] table prices each call as a fixed time plus a
//! time per MiB, and the copies by their bandwidth, so that a replay can say what the device
//! would have spent — where portalloc's own CPU time is not what a GPU user waits on: a
//! `cuMemCreate` of a 2 MiB handle takes about 193 µs, the whole CPU path of a vmm request a
//! fraction of one.
//!
//! Every figure of the built-in tables ([`DeviceCosts::for_vendor`]) says where it came from
//! ([`PricedCall::source`]); a call nobody has published a figure for is left **unknown**, never
//! guessed, and a replay that makes it gets no modelled time (the calls it lacks are named).
//! A table of one's own — measured by `scripts/gpu-check` on the GPU it runs on, or written by
//! hand — is read from JSON ([`DeviceCosts::from_json`]):
//!
//! ```json
//! {"calls": {"create_physical": {"us": 0, "us_per_mib": 96.7}, "map": {"us": 1.45}},
//!  "copy_gib_s": {"to_host": 24.4, "to_device": 23.5}}
//! ```
//!
//! Names are [`Call::NAMES`] (what `portalloc replay --json` counts in
//! `device_calls_by_name`); `copy_to_host` and `copy_from_host` are priced by `copy_gib_s`
//! (plus a fixed `us` where the table gives one).
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
/// ([`Call::bytes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallCost {
    /// Microseconds per call.
    #[serde(default)]
    pub us: f64,
    /// Microseconds per MiB the call acts on.
    #[serde(default)]
    pub us_per_mib: f64,
}

impl CallCost {
    /// Microseconds of `count` calls acting on `bytes` in all.
    pub fn us_of(&self, count: u64, bytes: u64) -> f64 {
        count as f64 * self.us + bytes as f64 / MIB * self.us_per_mib
    }
}

/// Copy bandwidths between device and pinned host memory, GiB/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyBandwidth {
    /// Device to host (`copy_to_host`), GiB/s.
    pub to_host: f64,
    /// Host to device (`copy_from_host`), GiB/s.
    pub to_device: f64,
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
}

/// The modelled time of some calls: seconds, or the calls a table does not price.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelledTime {
    /// Seconds the priced calls take, summed; `None` when any call made is unpriced (a sum
    /// without them would understate the time by an unknown amount).
    pub seconds: Option<f64>,
    /// Seconds the priced calls take, whether or not others are unpriced: a lower bound of
    /// the time where some are (equal to `seconds` where none is).
    pub priced_seconds: f64,
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

/// The CUDA driver's VMM calls as kvcached measured them: an A100, one thread, 4096 handles
/// of 2 MiB (ovg-project/kvcached, benchmarks/bench_vmm/README.md, averages).
const KVCACHED_A100: &str = "A100, one thread, 2 MiB handles: ovg-project/kvcached \
                             benchmarks/bench_vmm/README.md (average)";

/// The built-in table of the CUDA presets (h100-80g, h200): the VMM calls as measured on an
/// A100 (the only published per-call figures found; scripts/gpu-check measures the GPU it runs
/// on), the rest unknown.
const CUDA: &[PricedCall] = &[
    PricedCall {
        name: "reserve",
        cost: per_call(19.0),
        source: "cuMemAddressReserve of 8 GB: 19 µs (A100: ovg-project/kvcached \
                 benchmarks/bench_vmm/README.md); modelled as per call",
    },
    PricedCall {
        name: "create_physical",
        cost: Some(CallCost {
            us: 0.0,
            us_per_mib: 193.32 / 2.0,
        }),
        source: "cuMemCreate: 193.32 µs per 2 MiB handle (A100, one thread, 2 MiB handles: \
                 ovg-project/kvcached benchmarks/bench_vmm/README.md, average); measured at \
                 2 MiB only, modelled as proportional to the size (an assumption)",
    },
    PricedCall {
        name: "map",
        cost: per_call(1.45),
        source: KVCACHED_A100,
    },
    PricedCall {
        name: "set_access",
        cost: per_call(35.99),
        source: "cuMemSetAccess of one 2 MiB mapping: 35.99 µs (A100, one thread: \
                 ovg-project/kvcached benchmarks/bench_vmm/README.md, average); modelled as \
                 per call, a span's growth with its size not measured",
    },
    PricedCall {
        name: "unmap",
        cost: per_call(25.63),
        source: "cuMemUnmap of one 2 MiB mapping: 25.63 µs (A100, one thread: \
                 ovg-project/kvcached benchmarks/bench_vmm/README.md, average); modelled as \
                 per call",
    },
];

/// Copy bandwidths between a preset's device and pinned host memory, with their source:
/// `None` where no published figure was found.
///
/// * h100-80g: NVIDIA/nvbandwidth issue #24, an H100 cluster, eight GPUs:
///   `host_to_device_memcpy_sm` 35.03–35.39 GB/s, `device_to_host_memcpy_sm` 52.76–52.78 GB/s
///   (the medians 35.25 and 52.77 GB/s, i.e. 32.8 and 49.1 GiB/s). Copies by SM kernels; no
///   copy-engine (`cudaMemcpyAsync`) figure of an H100 was found published.
/// * h200: the same host link (PCIe 5 ×16) as the H100 SXM; the H100's figures stand in.
/// * mi300x: unknown — no published host↔device figure of an MI300X was found.
pub fn copy_for_preset(preset: &str) -> Option<(CopyBandwidth, &'static str)> {
    const H100: CopyBandwidth = CopyBandwidth {
        to_host: 52.77e9 / GIB,
        to_device: 35.25e9 / GIB,
    };
    match preset {
        "h100-80g" => Some((
            H100,
            "H100, nvbandwidth device_to_host_memcpy_sm 52.77 GB/s, \
             host_to_device_memcpy_sm 35.25 GB/s (NVIDIA/nvbandwidth#24, medians of 8 GPUs; \
             SM copies, no copy-engine figure published)",
        )),
        "h200" => Some((
            H100,
            "the H100's figures (NVIDIA/nvbandwidth#24) stand in: the same PCIe 5 ×16 host \
             link; not measured on an H200",
        )),
        _ => None,
    }
}

/// A cost of `us` per call, whatever the bytes.
const fn per_call(us: f64) -> Option<CallCost> {
    Some(CallCost {
        us,
        us_per_mib: 0.0,
    })
}

/// Why a call of the CUDA or HIP tables is unknown.
const UNKNOWN: &str = "unknown: no published per-call figure found (scripts/gpu-check \
                       measures it on the GPU it runs on)";

impl DeviceCosts {
    /// The built-in table of a vendor's driver (CUDA for h100-80g and h200, HIP for mi300x):
    /// each priced call with its source ([`DeviceCosts::sources_for`]), the others unknown.
    /// The HIP table prices nothing but queries yet: no per-call figures of ROCm's VMM or
    /// allocation calls were found published. (The host backend's is CUDA's: a replay models
    /// a GPU.)
    pub fn for_vendor(vendor: Vendor) -> DeviceCosts {
        let calls = Self::sources_for(vendor)
            .into_iter()
            .filter_map(|p| p.cost.map(|c| (p.name.to_string(), c)))
            .collect();
        DeviceCosts {
            calls,
            copy_gib_s: None,
        }
    }

    /// The built-in table of a preset of [`crate::replay::preset::PRESETS`]: its vendor's
    /// calls ([`DeviceCosts::for_vendor`]; HIP for mi300x, CUDA for the others) and its copy
    /// bandwidths where published ([`copy_for_preset`]; unknown otherwise).
    ///
    /// ```
    /// use portalloc::replay::costs::DeviceCosts;
    ///
    /// let h100 = DeviceCosts::for_preset("h100-80g");
    /// assert!(h100.copy_gib_s.is_some() && h100.calls.contains_key("create_physical"));
    /// // No published figure of an MI300X's copies or ROCm's VMM calls: unknown, not guessed.
    /// let mi300x = DeviceCosts::for_preset("mi300x");
    /// assert!(mi300x.copy_gib_s.is_none() && !mi300x.calls.contains_key("create_physical"));
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

    /// Every call of [`Call::NAMES`] with its price in the built-in table of `vendor` and
    /// where the figure came from (`unknown: …` where none was found).
    pub fn sources_for(vendor: Vendor) -> Vec<PricedCall> {
        let known: &[PricedCall] = match vendor {
            Vendor::Hip => &[],
            _ => CUDA,
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
                    }
                } else {
                    PricedCall {
                        name,
                        cost: None,
                        source: UNKNOWN,
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
    /// not finite, a bandwidth that is not positive.
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
            for (field, v) in [("us", cost.us), ("us_per_mib", cost.us_per_mib)] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(refused(format!(
                        "{name}.{field} is {v}: a cost is a finite number of microseconds, 0 \
                         or more"
                    )));
                }
            }
        }
        if let Some(b) = costs.copy_gib_s {
            for (field, v) in [("to_host", b.to_host), ("to_device", b.to_device)] {
                if !(v.is_finite() && v > 0.0) {
                    return Err(refused(format!(
                        "copy_gib_s.{field} is {v}: a bandwidth is a finite number of GiB/s \
                         above 0"
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
    /// until then. The time is when the CPU is done and nothing is in flight.
    ///
    /// [`DeviceCosts::time_of`] is the same calls with no overlap: their sum, at least this.
    ///
    /// ```
    /// use portalloc::adaptor::LoggedCall;
    /// use portalloc::replay::costs::DeviceCosts;
    ///
    /// let costs = DeviceCosts::from_json(
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
    /// // Waiting first, then unmapping: the sum.
    /// calls.rotate_right(1);
    /// calls.swap(0, 1);
    /// let t = costs.timeline_of(&calls);
    /// assert!((t.seconds.unwrap() - 1226.5625e-6).abs() < 1e-12);
    /// # Ok::<(), portalloc::Error>(())
    /// ```
    pub fn timeline_of(&self, calls: &[LoggedCall]) -> ModelledTime {
        use std::collections::HashMap;
        let mut cpu = 0.0f64;
        let mut engine = [0.0f64; 2];
        let mut stream_done: HashMap<u64, f64> = HashMap::new();
        let mut event_done: HashMap<u64, f64> = HashMap::new();
        let mut unpriced: Vec<&'static str> = Vec::new();
        let mut priced = true;
        let mut all_done = 0.0f64;
        for c in calls {
            let own = match self.calls.get(c.name) {
                Some(cost) => cost.us_of(1, c.bytes),
                None => 0.0,
            };
            let copy = match c.name {
                "copy_to_host" => Some((0, self.copy_gib_s.map(|b| b.to_host))),
                "copy_from_host" => Some((1, self.copy_gib_s.map(|b| b.to_device))),
                _ => None,
            };
            let known = match copy {
                Some((_, bandwidth)) => bandwidth.is_some(),
                None => self.calls.contains_key(c.name),
            };
            if !known {
                priced = false;
                if !unpriced.contains(&c.name) {
                    unpriced.push(c.name);
                }
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
        let us = cpu.max(all_done);
        ModelledTime {
            seconds: priced.then_some(us / 1e6),
            priced_seconds: us / 1e6,
            unpriced,
        }
    }

    /// The modelled time of `tally`: Σ count × `us` + MiB × `us_per_mib` over its calls, and
    /// each copy's bytes over its bandwidth.
    ///
    /// ```
    /// use portalloc::replay::costs::{CallCost, DeviceCosts};
    /// use portalloc::adaptor::CallTally;
    ///
    /// let costs = DeviceCosts::from_json(
    ///     r#"{"calls": {"map": {"us": 2}, "create_physical": {"us": 10, "us_per_mib": 50}}}"#,
    /// )?;
    /// let mut tally = CallTally::default();
    /// tally.by_name.insert("map", (3, 6 << 20));
    /// tally.by_name.insert("create_physical", (3, 6 << 20));
    /// // 3 × 2 µs + 3 × 10 µs + 6 MiB × 50 µs = 336 µs
    /// let t = costs.time_of(&tally);
    /// assert!((t.seconds.unwrap() - 336e-6).abs() < 1e-12);
    /// tally.by_name.insert("unmap", (1, 2 << 20));
    /// assert_eq!(costs.time_of(&tally).unpriced, vec!["unmap"]);
    /// # Ok::<(), portalloc::Error>(())
    /// ```
    pub fn time_of(&self, tally: &CallTally) -> ModelledTime {
        let mut us = 0.0;
        let mut unpriced = Vec::new();
        for (&name, &(count, bytes)) in &tally.by_name {
            let copy = match name {
                "copy_to_host" => Some(self.copy_gib_s.map(|b| b.to_host)),
                "copy_from_host" => Some(self.copy_gib_s.map(|b| b.to_device)),
                _ => None,
            };
            let call = self.calls.get(name);
            match copy {
                Some(Some(gib_s)) => {
                    us += bytes as f64 / (gib_s * GIB) * 1e6;
                    us += call.map_or(0.0, |c| c.us_of(count, bytes));
                }
                Some(None) => unpriced.push(name),
                None => match call {
                    Some(c) => us += c.us_of(count, bytes),
                    None => unpriced.push(name),
                },
            }
        }
        ModelledTime {
            seconds: unpriced.is_empty().then_some(us / 1e6),
            priced_seconds: us / 1e6,
            unpriced,
        }
    }
}
