//! PyTorch memory snapshots: the pickle `torch.cuda.memory._dump_snapshot` writes (plain
//! dicts and lists; no torch needed).
//!
//! Replayed: the `alloc` and `free_completed` entries of `device_traces[d]` (`d` the device
//! with the most such entries, or [`Options::device`]); `free_requested`, `segment_*` and
//! `snapshot` entries are skipped, `oom` entries counted as
//! [`AnomalyKind::AllocFailure`]. Mapping:
//!
//! | snapshot | event |
//! |---|---|
//! | entry order | `seq` (0, 1, …) |
//! | `time_us` | `time_ns` (0 when absent) |
//! | — | `thread` = 0 |
//! | `stream` | `stream` |
//! | `addr` | keys the allocation: a new `id` (1, 2, …) at each `alloc` |
//! | `size` (after PyTorch's 512 B rounding) | `size` |
//!
//! Baseline = bytes of the blocks in state `active_allocated` in `segments` of device `d`
//! (live at dump time) minus the net of the trace (allocs − frees), floored at 0. A
//! `free_completed` of an address not allocated in the trace frees memory from that baseline.
//! Reference: `reserved_bytes` = sum of the segments' `total_size`. Event numbers in messages
//! are positions in `device_traces[d]`, from 1.
//!
//! [`Options::device`]: crate::trace::Options::device
//! [`AnomalyKind::AllocFailure`]: crate::trace::AnomalyKind::AllocFailure

use serde_pickle::{DeOptions, HashableValue, Value};

use super::{us_to_ns, Attrs, Emitter};
use crate::error::Result;
use crate::trace::{
    trace_error, AnomalyKind, Format, Input, Keying, Loc, Op, Options, Reference, TraceHeader,
    VecSource,
};

fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Dict(d) => d
            .get(&HashableValue::String(key.to_string()))
            .or_else(|| d.get(&HashableValue::Bytes(key.as_bytes().to_vec()))),
        _ => None,
    }
}

fn as_str(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Bytes(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::I64(i) => u64::try_from(*i).ok(),
        Value::Int(b) => b.to_string().parse().ok(),
        Value::Bool(b) => Some(u64::from(*b)),
        _ => None,
    }
}

fn as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::I64(i) => Some(*i as f64),
        Value::F64(f) => Some(*f),
        Value::Int(b) => b.to_string().parse().ok(),
        _ => None,
    }
}

fn as_list(v: &Value) -> Option<&[Value]> {
    match v {
        Value::List(l) | Value::Tuple(l) => Some(l),
        _ => None,
    }
}

fn replayed(entry: &Value) -> bool {
    matches!(
        get(entry, "action").and_then(as_str),
        Some("alloc") | Some("free_completed")
    )
}

/// Reads a snapshot pickle and returns the chosen device's events in replay order.
///
/// # Errors
/// Not a pickle, or one without `device_traces`; a device asked for that is not there; an
/// entry to replay without `addr` or `size`; an anomaly in strict mode.
pub(crate) fn read(input: Input, origin: &str, options: &Options) -> Result<VecSource> {
    let root = serde_pickle::value_from_reader(
        input,
        DeOptions::new()
            .replace_unresolved_globals()
            .replace_recursive_structures(),
    )
    .map_err(|e| {
        trace_error(format!(
            "{origin}: not a readable snapshot pickle (truncated or corrupt?): {e}"
        ))
    })?;
    if !matches!(root, Value::Dict(_)) {
        return Err(trace_error(format!(
            "{origin}: the pickle is not a dict: not a torch.cuda.memory._dump_snapshot file"
        )));
    }
    let traces = get(&root, "device_traces").and_then(as_list).ok_or_else(|| {
        trace_error(format!(
            "{origin}: the snapshot has no device_traces list (was torch.cuda.memory._record_memory_history enabled?)"
        ))
    })?;
    let empty: &[Value] = &[];
    let counts: Vec<usize> = traces
        .iter()
        .map(|t| {
            as_list(t)
                .unwrap_or(empty)
                .iter()
                .filter(|e| replayed(e))
                .count()
        })
        .collect();
    let device = match options.device {
        Some(d) => {
            let d = d as usize;
            if d >= traces.len() {
                return Err(trace_error(format!(
                    "{origin}: no device {d}: the snapshot has device_traces for {} devices",
                    traces.len()
                )));
            }
            d
        }
        None => counts
            .iter()
            .enumerate()
            .max_by_key(|(i, n)| (**n, std::cmp::Reverse(*i)))
            .map(|(i, _)| i)
            .unwrap_or(0),
    };
    let trace = traces.get(device).and_then(as_list).unwrap_or(empty);

    // Live at dump time and reserved, from the segments of this device.
    let mut live_at_dump: u128 = 0;
    let mut reserved: u128 = 0;
    let mut segments = 0u64;
    for seg in get(&root, "segments").and_then(as_list).unwrap_or(empty) {
        let seg_device = get(seg, "device").and_then(as_u64).unwrap_or(0);
        if seg_device != device as u64 {
            continue;
        }
        segments += 1;
        reserved += u128::from(get(seg, "total_size").and_then(as_u64).unwrap_or(0));
        for b in get(seg, "blocks").and_then(as_list).unwrap_or(empty) {
            if get(b, "state").and_then(as_str) == Some("active_allocated") {
                live_at_dump += u128::from(get(b, "size").and_then(as_u64).unwrap_or(0));
            }
        }
    }

    // The net of the trace, as recorded.
    let mut net: i128 = 0;
    for e in trace {
        let size = i128::from(get(e, "size").and_then(as_u64).unwrap_or(0));
        match get(e, "action").and_then(as_str) {
            Some("alloc") => net += size,
            Some("free_completed") => net -= size,
            _ => {}
        }
    }
    let baseline = u64::try_from((live_at_dump as i128 - net).max(0)).unwrap_or(u64::MAX);

    let mut emitter = Emitter::new(Keying::Addresses, options.strict, origin, baseline);
    let mut events = Vec::with_capacity(counts.get(device).copied().unwrap_or(0));
    let mut skipped = 0u64;
    for (i, e) in trace.iter().enumerate() {
        let loc = Loc::Event(i as u64 + 1);
        let action = get(e, "action").and_then(as_str);
        let op = match action {
            Some("alloc") => Op::Alloc,
            Some("free_completed") => Op::Free,
            Some("oom") => {
                let size = get(e, "size").and_then(as_u64).unwrap_or(0);
                emitter.tracker.anomaly(
                    AnomalyKind::AllocFailure,
                    loc,
                    format!("out of memory allocating {size} bytes"),
                )?;
                continue;
            }
            _ => {
                skipped += 1;
                continue;
            }
        };
        let (Some(addr), Some(size)) = (
            get(e, "addr").and_then(as_u64),
            get(e, "size").and_then(as_u64),
        ) else {
            emitter.tracker.anomaly(
                AnomalyKind::InvalidRecord,
                loc,
                format!(
                    "{} entry without a usable addr or size",
                    action.unwrap_or("?")
                ),
            )?;
            continue;
        };
        let attrs = Attrs {
            time_ns: get(e, "time_us")
                .and_then(as_f64)
                .map(us_to_ns)
                .unwrap_or(0),
            thread: 0,
            stream: get(e, "stream").and_then(as_u64).unwrap_or(0),
        };
        emitter.feed(loc, op, addr, size, attrs, &mut events)?;
    }

    let mut header = TraceHeader::new(format!("{}:{origin}", Format::PytorchSnapshot.name()));
    header.device = Some(format!("cuda:{device}"));
    header.baseline_bytes = baseline;
    header.reference = Some(Reference {
        reserved_bytes: (segments > 0).then(|| u64::try_from(reserved).unwrap_or(u64::MAX)),
        peak_live_bytes: None,
        allocator: Some("pytorch-caching".to_string()),
    });
    header.notes.push(format!(
        "alloc and free_completed of device_traces[{device}] ({} devices traced); {skipped} other entries skipped; baseline = active_allocated blocks at dump ({live_at_dump} bytes) - net of the trace ({net} bytes)",
        traces.len()
    ));
    Ok(VecSource {
        header,
        anomalies: emitter.tracker.anomalies,
        events: events.into_iter(),
    })
}
