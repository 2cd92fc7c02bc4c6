//! PyTorch profiler (Kineto) Chrome-trace JSON, gzip-compressed or not.
//!
//! Kept: instant events named `[memory]` whose `args` say `Device Type` 1 (CUDA), of one
//! `Device Id` (the one with the most events, or [`Options::device`]); in a profile with no
//! CUDA events (recorded on a machine without a GPU), the CPU's (`Device Type` 0), with a note.
//! An event without `Addr` (profilers before 2022) gets a synthetic address: a free takes the
//! most recent live allocation of its size, so live bytes stay exact. Mapping:
//!
//! | Kineto | event |
//! |---|---|
//! | order by (`ts`, `Ev Idx`, position in the file) | `seq` (0, 1, …) |
//! | `ts` (µs, integer or fractional) | `time_ns` |
//! | `tid` | `thread` |
//! | — | `stream` = 0 (Kineto does not record it) |
//! | `Bytes` > 0 / < 0 | `op` alloc / free, `size` = \|`Bytes`\| |
//! | `Addr` | keys the allocation: a new `id` (1, 2, …) at each alloc |
//!
//! Baseline = `Total Allocated` of the first kept event minus its `Bytes` (memory live
//! before the window), floored at 0. Reference: `reserved_bytes` = max `Total Reserved`,
//! `peak_live_bytes` = max `Total Allocated`. Event numbers in messages are positions in
//! `traceEvents`, from 1.
//!
//! The JSON is walked once with a streaming visitor that keeps only `[memory]` events; the
//! rest of the file is never held in memory.
//!
//! [`Options::device`]: crate::trace::Options::device

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{
    DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Unexpected, Visitor,
};
use serde::Deserialize;
use serde_json::Value;

use super::{us_to_ns, Attrs, Emitter};
use crate::error::Result;
use crate::trace::{
    trace_error, Anomalies, AnomalyKind, Format, Input, Keying, Loc, Op, Options, Reference,
    ThreadMap, TraceHeader, VecSource,
};

/// `Device Type` of the CPU.
const CPU: i64 = 0;
/// The device chosen when the CPU's events are replayed (no CUDA device has this id).
const CPU_DEVICE: i64 = -1;

/// Addresses for events recorded without one: a fresh one per allocation; a free takes the
/// most recent live allocation of its size (or a fresh one: memory from before the window).
#[derive(Debug, Default)]
struct Synthetic {
    next: u64,
    live: BTreeMap<u64, Vec<u64>>,
    events: u64,
}

impl Synthetic {
    /// Far above any real address, so none is mistaken for one.
    const BASE: u64 = 1 << 62;

    fn address(&mut self, op: Op, size: u64) -> u64 {
        self.events += 1;
        let fresh = |next: &mut u64| {
            *next += 1;
            Self::BASE + *next
        };
        match op {
            Op::Alloc => {
                let a = fresh(&mut self.next);
                self.live.entry(size).or_default().push(a);
                a
            }
            Op::Free => match self.live.get_mut(&size).and_then(Vec::pop) {
                Some(a) => a,
                None => fresh(&mut self.next),
            },
        }
    }
}

/// One `[memory]` event, as much of it as is kept.
#[derive(Debug, Clone)]
struct Mem {
    index: u64,
    ts_ns: u64,
    ev_idx: i64,
    tid: u64,
    device_type: Option<i64>,
    device_id: Option<i64>,
    addr: Option<u64>,
    bytes: Option<i64>,
    total_allocated: Option<i64>,
    total_reserved: Option<i64>,
}

#[derive(Debug, Default)]
struct Collected {
    saw_trace_events: bool,
    events_seen: u64,
    mem: Vec<Mem>,
    device_names: BTreeMap<i64, String>,
}

#[derive(Deserialize)]
struct RawEvent {
    #[serde(default)]
    name: Option<Value>,
    #[serde(default)]
    ts: Option<Value>,
    #[serde(default)]
    tid: Option<Value>,
    #[serde(default)]
    args: Option<Value>,
}

/// Streams the document into a [`Collected`]: at the top (`top`), a Chrome-trace object with
/// `traceEvents` or a bare array of events; below it, the `traceEvents` array.
struct Seed<'a> {
    collected: &'a mut Collected,
    top: bool,
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        if self.top {
            d.deserialize_any(self)
        } else {
            d.deserialize_seq(self)
        }
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.top {
            "a Chrome-trace object with traceEvents, or an array of events"
        } else {
            "an array of trace events"
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        if !self.top {
            return Err(serde::de::Error::invalid_type(Unexpected::Map, &self));
        }
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "traceEvents" => {
                    self.collected.saw_trace_events = true;
                    map.next_value_seed(Seed {
                        collected: &mut *self.collected,
                        top: false,
                    })?;
                }
                "deviceProperties" => {
                    let v: Value = map.next_value()?;
                    if let Some(list) = v.as_array() {
                        for d in list {
                            if let (Some(id), Some(name)) = (
                                d.get("id").and_then(Value::as_i64),
                                d.get("name").and_then(Value::as_str),
                            ) {
                                self.collected.device_names.insert(id, name.to_string());
                            }
                        }
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        let c = self.collected;
        c.saw_trace_events = true;
        while let Some(raw) = seq.next_element::<RawEvent>()? {
            c.events_seen += 1;
            if raw.name.as_ref().and_then(Value::as_str) != Some("[memory]") {
                continue;
            }
            let args = raw.args.unwrap_or(Value::Null);
            let int = |k: &str| args.get(k).and_then(as_i64);
            c.mem.push(Mem {
                index: c.events_seen,
                ts_ns: raw
                    .ts
                    .as_ref()
                    .and_then(Value::as_f64)
                    .map(us_to_ns)
                    .unwrap_or(0),
                ev_idx: int("Ev Idx").unwrap_or(0),
                tid: raw.tid.as_ref().and_then(Value::as_u64).unwrap_or(0),
                device_type: int("Device Type"),
                device_id: int("Device Id"),
                addr: args.get("Addr").and_then(Value::as_u64),
                bytes: int("Bytes"),
                total_allocated: int("Total Allocated"),
                total_reserved: int("Total Reserved"),
            });
        }
        Ok(())
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| {
        v.as_f64()
            .filter(|f| f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e18)
            .map(|f| f as i64)
    })
}

/// Reads a Kineto trace and returns the chosen device's events in replay order.
///
/// # Errors
/// Not JSON, no `traceEvents`, no CUDA `[memory]` events (or none on the device asked
/// for), or an anomaly in strict mode.
pub(crate) fn read(input: Input, origin: &str, options: &Options) -> Result<VecSource> {
    let mut c = Collected::default();
    let mut de = serde_json::Deserializer::from_reader(input);
    Seed {
        collected: &mut c,
        top: true,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end())
    .map_err(|e| {
        let what = if e.is_eof() {
            "truncated JSON"
        } else {
            "corrupt JSON"
        };
        trace_error(format!(
            "{origin}: {what} at line {} column {}: {e}",
            e.line(),
            e.column()
        ))
    })?;
    if !c.saw_trace_events {
        return Err(trace_error(format!(
            "{origin}: a JSON object without traceEvents: not a Chrome trace; {}",
            Format::accepted()
        )));
    }
    let mut anomalies_early = Anomalies::new();
    let mut per_device: BTreeMap<i64, u64> = BTreeMap::new();
    let mut other_types: BTreeMap<i64, u64> = BTreeMap::new();
    for m in &c.mem {
        match m.device_type {
            Some(1) => *per_device.entry(m.device_id.unwrap_or(0)).or_insert(0) += 1,
            Some(t) => *other_types.entry(t).or_insert(0) += 1,
            None => {
                if options.strict {
                    return Err(trace_error(format!(
                        "{origin}: {}: [memory] event without Device Type (strict mode)",
                        Loc::Event(m.index)
                    )));
                }
                anomalies_early.record(
                    AnomalyKind::InvalidRecord,
                    Loc::Event(m.index),
                    "[memory] event without Device Type",
                );
            }
        }
    }
    let device = match options.device {
        _ if options.cpu => {
            if !other_types.contains_key(&CPU) {
                return Err(trace_error(format!(
                    "{origin}: no CPU [memory] events (Device Type 0) to replay; device types \
                     with events: {:?} (1 is CUDA)",
                    other_types
                        .keys()
                        .copied()
                        .chain((!per_device.is_empty()).then_some(1))
                        .collect::<Vec<_>>()
                )));
            }
            CPU_DEVICE
        }
        Some(d) => {
            let d = i64::from(d);
            if !per_device.contains_key(&d) {
                return Err(trace_error(format!(
                    "{origin}: no CUDA [memory] events on device {d}; devices with events: {:?}",
                    per_device.keys().collect::<Vec<_>>()
                )));
            }
            d
        }
        None => {
            // Most events; the lowest id on ties.
            let best = per_device
                .iter()
                .max_by_key(|(id, n)| (**n, std::cmp::Reverse(**id)))
                .map(|(id, _)| *id);
            match best {
                Some(d) => d,
                // A profile recorded on a machine without a GPU: the tensors an eager step
                // allocates come from device-independent code, so the CPU's [memory] events
                // plan the GPU's memory too.
                None if other_types.contains_key(&CPU) => CPU_DEVICE,
                None => {
                    let found = if c.mem.is_empty() {
                        "no [memory] events at all: was the profiler run with \
                         profile_memory=True?"
                            .to_string()
                    } else {
                        format!(
                            "[memory] events only of device types {:?} (1 is CUDA, 0 the CPU)",
                            other_types.keys().collect::<Vec<_>>()
                        )
                    };
                    return Err(trace_error(format!(
                        "{origin}: nothing to replay among {} trace events: {found}",
                        c.events_seen
                    )));
                }
            }
        }
    };
    let on_cpu = device == CPU_DEVICE;
    let mut mem: Vec<Mem> = c
        .mem
        .into_iter()
        .filter(|m| {
            if on_cpu {
                m.device_type == Some(CPU)
            } else {
                m.device_type == Some(1) && m.device_id.unwrap_or(0) == device
            }
        })
        .collect();
    mem.sort_by_key(|m| (m.ts_ns, m.ev_idx, m.index));

    let mut baseline: u64 = 0;
    let mut reserved: Option<u64> = None;
    let mut peak_reported: Option<u64> = None;
    if let Some(first) = mem.first() {
        if let (Some(total), Some(bytes)) = (first.total_allocated, first.bytes) {
            baseline = u64::try_from(i128::from(total) - i128::from(bytes)).unwrap_or(0);
        }
    }
    for m in &mem {
        if let Some(r) = m.total_reserved.and_then(|r| u64::try_from(r).ok()) {
            reserved = Some(reserved.map_or(r, |x| x.max(r)));
        }
        if let Some(a) = m.total_allocated.and_then(|a| u64::try_from(a).ok()) {
            peak_reported = Some(peak_reported.map_or(a, |x| x.max(a)));
        }
    }

    let mut emitter = Emitter::new(Keying::Addresses, options.strict, origin, baseline);
    let mut threads = ThreadMap::default();
    let mut events = Vec::with_capacity(mem.len());
    let mut synthetic = Synthetic::default();
    for m in &mem {
        let loc = Loc::Event(m.index);
        let Some(bytes) = m.bytes else {
            emitter.tracker.anomaly(
                AnomalyKind::InvalidRecord,
                loc,
                "[memory] event without Bytes".to_string(),
            )?;
            continue;
        };
        let (op, size) = if bytes >= 0 {
            (Op::Alloc, bytes.unsigned_abs())
        } else {
            (Op::Free, bytes.unsigned_abs())
        };
        // Older profilers (2021) recorded no Addr: live bytes are still exact (the running
        // sum of Bytes); a free is matched to a live allocation of the same size.
        let addr = match m.addr {
            Some(a) => a,
            None => synthetic.address(op, size),
        };
        let attrs = Attrs {
            time_ns: m.ts_ns,
            thread: threads.map(m.tid),
            stream: 0,
        };
        emitter.feed(loc, op, addr, size, attrs, &mut events)?;
    }

    let mut header = TraceHeader::new(format!("{}:{origin}", Format::Kineto.name()));
    header.device = Some(if on_cpu {
        "cpu".to_string()
    } else {
        match c.device_names.get(&device) {
            Some(name) => format!("cuda:{device} {name}"),
            None => format!("cuda:{device}"),
        }
    });
    if on_cpu {
        header.notes.push(
            "the CPU's [memory] events (Device Type 0) are replayed: an eager step allocates \
             the same tensors on a GPU, so they plan its memory — but CPU-only temporaries \
             (MKL workspaces, scalar tensors) are included, the CUDA caching allocator's \
             rounding and workspaces are not, and memory live before the window is unknown on \
             the CPU (its counter starts with the profiler): pass it with --baseline SIZE"
                .to_string(),
        );
    }
    if synthetic.events > 0 {
        header.notes.push(format!(
            "{} [memory] events had no Addr (a profiler before 2022): addresses are synthetic, \
             each free matched to the most recent live allocation of the same size; live bytes \
             are exact (the running sum of Bytes)",
            synthetic.events
        ));
    }
    header.baseline_bytes = baseline;
    header.reference = Some(Reference {
        reserved_bytes: reserved,
        peak_live_bytes: peak_reported,
        allocator: Some("pytorch-caching".to_string()),
    });
    header.notes.push(format!(
        "[memory] events of {}, ordered by (ts, Ev Idx); baseline = Total Allocated - Bytes of the first",
        if on_cpu { "the CPU".to_string() } else { format!("CUDA device {device}") }
    ));
    let others: Vec<String> = per_device
        .iter()
        .filter(|(d, _)| **d != device)
        .map(|(d, n)| format!("cuda:{d} ({n} events)"))
        .chain(
            other_types
                .iter()
                .map(|(t, n)| format!("device type {t} ({n} events)")),
        )
        .collect();
    if !others.is_empty() {
        header.notes.push(format!("skipped: {}", others.join(", ")));
    }
    let mut anomalies = anomalies_early;
    anomalies.merge(&emitter.tracker.anomalies);
    Ok(VecSource {
        header,
        anomalies,
        events: events.into_iter(),
    })
}
