//! PyTorch memory snapshots: the pickle `torch.cuda.memory._dump_snapshot` writes (plain
//! dicts and lists; no torch needed), read with the bounded pickle reader of `machine.rs`: a
//! file past one of its limits is refused with a message naming the limit.
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
//! | `size` (the size the program requested) | `size` |
//!
//! Baseline = the requested bytes (`requested_size`, or `size` in snapshots without it) of the
//! blocks in state `active_allocated` or `active_pending_free` (both hold memory at dump time)
//! in `segments` of device `d`, minus the net of the trace (allocs − frees), floored at 0. A
//! `free_completed` of an address not allocated in the trace frees memory from that baseline.
//! Those blocks at an `address` the trace did not leave allocated are memory from before the
//! window known one by one: [`TraceHeader::pre_window_blocks`], their requested sizes, which
//! replay holds each as its own allocation.
//! Reference: `reserved_bytes` = sum of the segments' `total_size`. Event numbers in messages
//! are positions in `device_traces[d]`, from 1. A value of the segments that cannot be read
//! (a size that is negative, a float, text or past 64 bits, a device that is no ordinal,
//! `blocks` that are no list, live bytes summing past 64 bits) is a `Malformed` error naming
//! its segment, block and field, never read as 0 B or device 0.
//!
//! The list of segments `torch.cuda.memory_snapshot()` returns, pickled as it is (the
//! `segments` of the dict without the dict), is the state of a device at one moment: read as a
//! snapshot whose `device_traces` hold nothing, no events and every live block from before
//! the window (device: [`Options::device`], else the one with the most live bytes). It is
//! known by its shape (most items dicts with `blocks` and `total_size`), so that a bad value
//! in it is an error of that value, not "a list".
//!
//! A snapshot holds the memory of the CUDA caching allocator (HIP's under ROCm):
//! `--trace-device` types other than `cuda` and `hip` ([`Options::cpu`],
//! [`Options::device_type`]) are refused as `Selection` errors.
//!
//! Whitespace after the pickle's STOP is ignored (with a header note), as `pickle.load`
//! ignores what follows; other pickles are refused naming what they are: the global an object
//! is built from, the keys of a dict, the globals of a list's items, two pickles one after the
//! other (the first named), bytes after a pickle that read as no whole pickle.
//!
//! [`Options::device`]: crate::trace::Options::device
//! [`Options::cpu`]: crate::trace::Options::cpu
//! [`Options::device_type`]: crate::trace::Options::device_type
//! [`AnomalyKind::AllocFailure`]: crate::trace::AnomalyKind::AllocFailure

use crate::trace::{limit_error, malformed_error, not_a_trace_error, selection_error};
use rustc_hash::FxHashSet;

mod limits;
mod machine;
mod view;

use super::{us_to_ns, Attrs, Emitter};
use crate::trace::{
    trace_error, AnomalyKind, Event, Format, Input, Keying, Loc, Op, Options, Reference,
    TraceHeader, VecSource,
};
use crate::trace::{Result, TraceError};
use limits::{Limits, PickleError};
use view::{After, KeyMemo, Pickle, Seq, Val};

/// The error for a pickle the reader refused or a walk that ran out of steps.
fn pickle_error(origin: &str, e: PickleError) -> TraceError {
    match e {
        PickleError::Limit { .. } => limit_error(format!(
            "{origin}: refused: the snapshot pickle {e}; the limits on untrusted files are in \
             docs/trace-format.md (a file you trust is read with 16 times larger ones: \
             --trusted-input)"
        )),
        PickleError::Malformed { .. } => malformed_error(format!(
            "{origin}: not a readable snapshot pickle (truncated or corrupt?): {e}"
        )),
        PickleError::Io(kind, _) => trace_error(
            kind,
            format!("{origin}: not a readable snapshot pickle (truncated or corrupt?): {e}"),
        ),
        PickleError::Foreign { .. } => {
            not_a_trace_error(format!("{origin}: {e}, {NOT_A_SNAPSHOT}"))
        }
    }
}

/// What a pickle of something else is not.
/// How the first note of a trace read from a segment list
/// (`pickle.dump(torch.cuda.memory_snapshot(), f)`) begins: a state with no events, which a
/// tool reading the header tells from a snapshot that recorded none.
pub const SEGMENT_LIST_NOTE: &str = "a segment list (torch.cuda.memory_snapshot(), pickled)";

const NOT_A_SNAPSHOT: &str =
    "not a PyTorch memory snapshot (a dict with segments and device_traces, as \
     torch.cuda.memory._dump_snapshot writes it)";

/// The keys of a snapshot's dict, for the message refusing a dict without them.
const SNAPSHOT_KEYS: &str = "segments, device_traces (and allocator_settings, \
     external_annotations in newer PyTorch)";

/// The most keys of a dict a message names.
const KEYS_SHOWN: usize = 5;

/// The most items of a list looked at to say what it holds, and the most globals named.
const ITEMS_LOOKED_AT: usize = 64;
const GLOBALS_SHOWN: usize = 3;

/// What a list that is not a snapshot holds, for a message: "a list of collections.deque"
/// when each of its first [`ITEMS_LOOKED_AT`] items was made by calling a global (the first
/// [`GLOBALS_SHOWN`] distinct ones named), "a list holding collections.deque among other
/// items" when some were, "an empty list (…)" when it has none, else "a list". Counts one
/// walk step per item looked at.
fn list_kind(origin: &str, list: Seq<'_>) -> Result<String> {
    if list.len() == 0 {
        return Ok("an empty list (a segment list with no segments?)".to_string());
    }
    let mut names: Vec<&str> = Vec::new();
    let mut more = false;
    let (mut looked, mut objects) = (0, 0);
    for item in items(origin, list).take(ITEMS_LOOKED_AT) {
        looked += 1;
        let Some(name) = item?.made_by() else {
            continue;
        };
        objects += 1;
        if names.contains(&name) {
            continue;
        }
        if names.len() < GLOBALS_SHOWN {
            names.push(name);
        } else {
            more = true;
        }
    }
    if names.is_empty() {
        return Ok("a list".to_string());
    }
    let shown = format!("{}{}", names.join(", "), if more { ", …" } else { "" });
    Ok(if objects == looked {
        format!("a list of {shown}")
    } else {
        format!("a list holding {shown} among other items")
    })
}

/// The list of segments `torch.cuda.memory_snapshot()` returns, when `root` has its shape:
/// a non-empty list of which at least half the first [`ITEMS_LOOKED_AT`] items (and at least
/// one) are dicts with the keys `blocks` and `total_size`, as each of its segments has (it
/// is the `segments` of a snapshot's dict, without the dict). Their values are not looked
/// at here: one that cannot be read is an error of its segment ([`device_states`]), not "a
/// list". Counts one walk of each item looked at.
fn segment_list<'p>(origin: &str, root: Val<'p>) -> Result<Option<Seq<'p>>> {
    let Some(list) = root.as_list().filter(|l| root.is_list() && l.len() > 0) else {
        return Ok(None);
    };
    let mut memo = KeyMemo::default();
    let (mut looked, mut shaped) = (0usize, 0usize);
    for item in items(origin, list).take(ITEMS_LOOKED_AT) {
        looked += 1;
        let [blocks, total] = get_all(origin, item?, ["blocks", "total_size"], &mut memo)?;
        if blocks.is_some() && total.is_some() {
            shaped += 1;
        }
    }
    Ok((shaped > 0 && 2 * shaped >= looked).then_some(list))
}

/// Which form of snapshot segments are read from, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// The dict `torch.cuda.memory._dump_snapshot` writes: its `segments`.
    Snapshot,
    /// The list `torch.cuda.memory_snapshot()` returns, pickled as it is.
    SegmentList,
}

impl Form {
    /// What the file is, for a message.
    fn what(self) -> &'static str {
        match self {
            Form::Snapshot => "a PyTorch memory snapshot",
            Form::SegmentList => SEGMENT_LIST_NOTE,
        }
    }

    /// The segments as Python reaches them from what was pickled.
    fn segments(self) -> &'static str {
        match self {
            Form::Snapshot => "snapshot['segments']",
            Form::SegmentList => "segments",
        }
    }
}

/// Where a value of the segments is: segment `segment` (its index, from 0), and block
/// `block` of it when given.
#[derive(Debug, Clone, Copy)]
struct At {
    form: Form,
    segment: usize,
    block: Option<usize>,
}

impl At {
    /// "segment 2" or "segment 2, block 1".
    fn name(self) -> String {
        match self.block {
            Some(b) => format!("segment {}, block {b}", self.segment),
            None => format!("segment {}", self.segment),
        }
    }

    /// The path Python reads it at: `segments[2]['blocks'][1]`, then `['field']`.
    fn path(self, field: Option<&str>) -> String {
        let mut path = format!("{}[{}]", self.form.segments(), self.segment);
        if let Some(b) = self.block {
            path.push_str(&format!("['blocks'][{b}]"));
        }
        if let Some(field) = field {
            path.push_str(&format!("['{field}']"));
        }
        path
    }
}

/// What a size in bytes may be.
const SIZE_ACCEPTED: &str = "an int from 0 to 2^64 - 1 (bytes)";

/// The error for field `field` of the segment or block at `at`: absent (`value` `None`) or
/// holding what cannot be read as `accepted` says; the value shown bounded.
fn unreadable(
    origin: &str,
    at: At,
    field: &str,
    value: Option<Val<'_>>,
    accepted: &str,
) -> TraceError {
    let what = at.form.what();
    let name = at.name();
    malformed_error(match value {
        Some(v) => format!(
            "{origin}: {what}, but {name} has {field} = {}, at {}; accepted: {accepted}",
            v.shown(),
            at.path(Some(field))
        ),
        None => format!(
            "{origin}: {what}, but {name} has no {field} ({}); accepted: {accepted}",
            at.path(None)
        ),
    })
}

/// The error for an item of the segments, or of a segment's blocks, that is not a dict.
fn not_a_dict(origin: &str, at: At, item: Val<'_>) -> TraceError {
    let (what, accepted) = match at.block {
        Some(_) => (
            "a block",
            "a dict with size and state, as each of a segment's blocks",
        ),
        None => (
            "a segment",
            "a dict with blocks and total_size, as each segment torch.cuda.memory_snapshot() \
             gives",
        ),
    };
    malformed_error(format!(
        "{origin}: {}, but {} is {}, not {what} ({}); accepted: {accepted}",
        at.form.what(),
        at.name(),
        item.shown(),
        at.path(None)
    ))
}

/// The value at `field` as bytes: an int from 0 to 2^64 - 1; `None` where absent and
/// `optional`.
///
/// # Errors
/// Absent where not optional; present and not such an int (negative, wider, a float, text).
fn size_of(
    origin: &str,
    at: At,
    field: &str,
    value: Option<Val<'_>>,
    optional: Option<&str>,
) -> Result<Option<u64>> {
    match value {
        None if optional.is_some() => Ok(None),
        Some(v) if v.as_u64().is_some() => Ok(v.as_u64()),
        _ => Err(unreadable(
            origin,
            at,
            field,
            value,
            &match optional {
                Some(absent) => format!("absent ({absent}), or {SIZE_ACCEPTED}"),
                None => SIZE_ACCEPTED.to_string(),
            },
        )),
    }
}

/// The error for a sum of sizes past 64 bits, at the value that took it there.
fn sum_too_large(origin: &str, at: At, field: &str, of: &str, value: u64) -> TraceError {
    malformed_error(format!(
        "{origin}: {}, but {of} sum to more than 2^64 - 1 bytes at {}, whose {field} is \
         {value} ({}); accepted: sizes whose sums fit in 64 bits",
        at.form.what(),
        at.name(),
        at.path(Some(field))
    ))
}

/// What the segments of one device hold at dump time.
#[derive(Debug, Default)]
struct DeviceState {
    /// Segments of the device.
    segments: u64,
    /// Their `total_size`, summed: what the caching allocator reserved.
    reserved: u128,
    /// The requested bytes of the blocks live at dump time (`active_allocated`,
    /// `active_pending_free`).
    live: u128,
    /// Each of those blocks, `(address, requested bytes)`, in the segments' order.
    live_blocks: Vec<(Option<u64>, u64)>,
}

/// The state of each device in `segments` (a snapshot's `segments`, or the list
/// `torch.cuda.memory_snapshot()` returns: `form`), by the segments' `device` (0 when
/// absent); only of device `only` when given, the other devices' segments read no further
/// than their `device`. As many blocks as the pickle's limits let the file hold.
///
/// Every value read must be what PyTorch writes, or the file is refused naming the segment,
/// the block, the field and what is accepted, in both forms: a value read as 0 B or as
/// device 0 in its place would change the numbers a replay plans with. A segment: a dict
/// with `total_size` (bytes), `blocks` (a list) and optionally `device` (an ordinal). A block:
/// a dict with `state` (text), `size` (bytes), and optionally `requested_size` (bytes; older
/// PyTorch has none, and the `size` is used) and `address`. The live bytes and the reserved
/// bytes of a device must each sum within 64 bits.
///
/// # Errors
/// [`TraceErrorKind::Malformed`](crate::trace::TraceErrorKind::Malformed) for a value that
/// cannot be read; a limit of the walk.
fn device_states(
    origin: &str,
    form: Form,
    segments: Seq<'_>,
    only: Option<u64>,
) -> Result<std::collections::BTreeMap<u64, DeviceState>> {
    let mut states = std::collections::BTreeMap::new();
    let mut segment_keys = KeyMemo::default();
    let mut block_keys = KeyMemo::default();
    for (i, seg) in items(origin, segments).enumerate() {
        let seg = seg?;
        let at = At {
            form,
            segment: i,
            block: None,
        };
        if !seg.is_dict() {
            return Err(not_a_dict(origin, at, seg));
        }
        let [device, total, blocks] = get_all(
            origin,
            seg,
            ["device", "total_size", "blocks"],
            &mut segment_keys,
        )?;
        let seg_device = match device {
            None => 0,
            Some(v) => match v.as_u64().filter(|d| *d <= u64::from(u32::MAX)) {
                Some(d) => d,
                None => {
                    return Err(unreadable(
                        origin,
                        at,
                        "device",
                        device,
                        "absent (device 0), or a device ordinal, an int from 0 to 4294967295",
                    ))
                }
            },
        };
        if only.is_some_and(|d| d != seg_device) {
            continue;
        }
        let total = size_of(origin, at, "total_size", total, None)?.unwrap_or(0);
        let Some(blocks) = blocks.filter(|b| b.is_list()).and_then(Val::as_list) else {
            return Err(unreadable(
                origin,
                at,
                "blocks",
                blocks,
                "a list of block dicts (empty for a segment with none)",
            ));
        };
        let state: &mut DeviceState = states.entry(seg_device).or_default();
        state.segments += 1;
        state.reserved += u128::from(total);
        if state.reserved > u128::from(u64::MAX) {
            let of = format!("the total_size of device {seg_device}'s segments");
            return Err(sum_too_large(origin, at, "total_size", &of, total));
        }
        for (j, b) in items(origin, blocks).enumerate() {
            let b = b?;
            let at = At {
                block: Some(j),
                ..at
            };
            if !b.is_dict() {
                return Err(not_a_dict(origin, at, b));
            }
            let [state_name, size, requested, address] = get_all(
                origin,
                b,
                ["state", "size", "requested_size", "address"],
                &mut block_keys,
            )?;
            let Some(state_name) = state_name.and_then(Val::as_str) else {
                return Err(unreadable(
                    origin,
                    at,
                    "state",
                    state_name,
                    "a str: active_allocated, active_pending_free, inactive, …",
                ));
            };
            let size = size_of(origin, at, "size", size, None)?.unwrap_or(0);
            let requested = size_of(
                origin,
                at,
                "requested_size",
                requested,
                Some("the block's size is used, as PyTorch before 2.0 writes none"),
            )?;
            let address = match address {
                None => None,
                Some(v) => match v.as_u64() {
                    Some(a) => Some(a),
                    None => {
                        return Err(unreadable(
                            origin,
                            at,
                            "address",
                            address,
                            "absent, or an int from 0 to 2^64 - 1",
                        ))
                    }
                },
            };
            // Both hold memory at dump time: a block pending free waits for its streams. In
            // the trace's units: the size the program requested (older snapshots without
            // `requested_size` give the rounded `size`).
            if matches!(state_name, "active_allocated" | "active_pending_free") {
                let (field, bytes) = match requested {
                    Some(r) => ("requested_size", r),
                    None => ("size", size),
                };
                state.live += u128::from(bytes);
                if state.live > u128::from(u64::MAX) {
                    let of = format!("the live blocks of device {seg_device}");
                    return Err(sum_too_large(origin, at, field, &of, bytes));
                }
                state.live_blocks.push((address, bytes));
            }
        }
    }
    Ok(states)
}

/// The devices of `devices` for a message, the first eight named: "device 0", "devices 0,
/// 1", "devices 0, 1, …, 7, … (12 devices)".
fn device_list(devices: impl ExactSizeIterator<Item = u64>) -> String {
    const SHOWN: usize = 8;
    let n = devices.len();
    let shown: Vec<String> = devices.take(SHOWN).map(|d| d.to_string()).collect();
    match n {
        1 => format!("device {}", shown.join("")),
        n if n <= SHOWN => format!("devices {}", shown.join(", ")),
        n => format!("devices {}, … ({n} devices)", shown.join(", ")),
    }
}

/// `c10::DeviceType` of CUDA and of HIP (PyTorch on ROCm, where `torch.cuda` is HIP).
const CUDA: i64 = 1;
const HIP: i64 = 6;

/// Refuses a device type (`--trace-device cpu`, `xpu`, `xpu:0`: [`Options::cpu`],
/// [`Options::device_type`]) other than the CUDA caching allocator's, which is all a snapshot
/// holds: CUDA's, or HIP's under ROCm (both accepted, and no type). `what` is the file
/// ([`Form::what`]), `devices` its devices ([`device_list`]).
///
/// # Errors
/// [`TraceErrorKind::Selection`](crate::trace::TraceErrorKind::Selection), naming what the
/// snapshot holds and what was asked for.
fn refuse_other_device_types(
    origin: &str,
    options: &Options,
    what: &str,
    devices: &str,
) -> Result<()> {
    let (asked, wants) = if options.cpu {
        (
            "cpu".to_string(),
            "the CPU's memory (trace::Options::cpu)".to_string(),
        )
    } else {
        match options.device_type {
            None | Some(CUDA | HIP) => return Ok(()),
            Some(t) => {
                // The Kineto reader's names of PyTorch's device types, by number.
                let name = crate::trace::import::kineto::type_name(t);
                let asked = match options.device {
                    Some(d) => format!("{name}:{d}"),
                    None => name.clone(),
                };
                let wants = format!(
                    "the memory of {name} devices (c10::DeviceType {t}, \
                     trace::Options::device_type)"
                );
                (asked, wants)
            }
        }
    };
    Err(selection_error(format!(
        "{origin}: {what} holds the GPU memory of {devices} (cuda, or hip under ROCm); \
         --trace-device {asked} asks for {wants}, which it does not hold: name one of its \
         devices (as 0, cuda:0 or hip:0), or give no --trace-device"
    )))
}

/// The keys of `dict`, the first [`KEYS_SHOWN`] each cut to an excerpt, and how many more,
/// for a message: `"a", "b", … (12 keys)`. Counts one walk step per key shown.
fn keys_shown(origin: &str, dict: Val<'_>) -> Result<String> {
    let mut shown = Vec::new();
    let mut total = 0;
    for key in dict.keys().map_err(|e| pickle_error(origin, e))? {
        total += 1;
        if shown.len() < KEYS_SHOWN {
            shown.push(match key.as_str() {
                Some(text) => crate::trace::excerpt(text),
                None => key.kind_name().to_string(),
            });
        }
    }
    Ok(match total {
        0 => "no keys (an empty dict)".to_string(),
        n if n <= KEYS_SHOWN => format!("the keys {}", shown.join(", ")),
        n => format!("{n} keys: {}, …", shown.join(", ")),
    })
}

/// Reads a dict's value at `key` (counting the walk's steps).
fn get<'p>(origin: &str, v: Val<'p>, key: &str) -> Result<Option<Val<'p>>> {
    v.get(key).map_err(|e| pickle_error(origin, e))
}

/// Reads several of a dict's values in one walk of it (counting its steps once), for one
/// of many dicts read with the same keys (`memo`).
fn get_all<'p, const N: usize>(
    origin: &str,
    v: Val<'p>,
    keys: [&str; N],
    memo: &mut KeyMemo,
) -> Result<[Option<Val<'p>>; N]> {
    v.get_all_with(keys, memo)
        .map_err(|e| pickle_error(origin, e))
}

fn get_str<'p>(origin: &str, v: Val<'p>, key: &str) -> Result<Option<&'p str>> {
    Ok(get(origin, v, key)?.and_then(Val::as_str))
}

/// The items of `list` (counting the walk's steps).
fn items<'p>(origin: &'p str, list: Seq<'p>) -> impl Iterator<Item = Result<Val<'p>>> + 'p {
    list.iter()
        .map(move |v| v.map_err(|e| pickle_error(origin, e)))
}

fn replayed(origin: &str, entry: Val<'_>) -> Result<bool> {
    Ok(matches!(
        get_str(origin, entry, "action")?,
        Some("alloc") | Some("free_completed")
    ))
}

/// What an entry of `device_traces[d]` that is not skipped does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Alloc,
    FreeCompleted,
    Oom,
}

/// The fields of an entry the importer reads, read in one walk of its dict.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Its position in `device_traces[d]`, from 0.
    position: u64,
    action: Action,
    addr: Option<u64>,
    size: Option<u64>,
    time_ns: u64,
    stream: u64,
}

/// Feeds entry `e`: an event, or an anomaly (an `oom`, an entry without a usable `addr` or
/// `size`); `false` (nothing changed) for a free that draws on the baseline while the
/// tracker defers it.
///
/// # Errors
/// An anomaly in strict mode.
fn feed(emitter: &mut Emitter, e: &Entry, events: &mut Vec<Event>) -> Result<bool> {
    let loc = Loc::Event(e.position + 1);
    let op = match e.action {
        Action::Alloc => Op::Alloc,
        Action::FreeCompleted => Op::Free,
        Action::Oom => {
            let size = e.size.unwrap_or(0);
            emitter.tracker.anomaly(
                AnomalyKind::AllocFailure,
                loc,
                format!("out of memory allocating {size} bytes"),
            )?;
            return Ok(true);
        }
    };
    let (Some(addr), Some(size)) = (e.addr, e.size) else {
        emitter.tracker.anomaly(
            AnomalyKind::InvalidRecord,
            loc,
            format!(
                "{} entry without a usable addr or size",
                match e.action {
                    Action::Alloc => "alloc",
                    _ => "free_completed",
                }
            ),
        )?;
        return Ok(true);
    };
    let attrs = Attrs {
        time_ns: e.time_ns,
        thread: 0,
        stream: e.stream,
    };
    emitter.feed(loc, op, addr, size, attrs, events)
}

/// The requested sizes of the blocks live at dump time (`live_blocks`: `(address, bytes)`)
/// that the window did not leave live (`window_live`): memory from before the window, known
/// one by one. Blocks of 0 bytes are dropped; a block without an address is left to the part
/// of unknown shape (nothing tells whether the window allocated it). At most `baseline` bytes in all, taken in order: more
/// would contradict the trace's net, and what they do not cover stays of unknown shape.
fn pre_window_blocks(
    live_blocks: &[(Option<u64>, u64)],
    window_live: &FxHashSet<u64>,
    baseline: u64,
) -> Vec<u64> {
    let mut left = baseline;
    let mut blocks = Vec::new();
    for &(address, bytes) in live_blocks {
        let Some(address) = address else { continue };
        if bytes == 0 || window_live.contains(&address) || bytes > left {
            continue;
        }
        left -= bytes;
        blocks.push(bytes);
    }
    blocks
}

/// Reads a snapshot pickle and returns the chosen device's events in replay order.
///
/// # Errors
/// Not a pickle, or one without `device_traces`; a limit on untrusted files exceeded; a
/// device asked for that is not there; an entry to replay without `addr` or `size`; an anomaly
/// in strict mode.
///
/// `size`: the input's length when known (a file not compressed), to make room up front.
pub(crate) fn read(
    mut input: Input,
    origin: &str,
    options: &Options,
    size: Option<u64>,
) -> Result<VecSource> {
    let limits = if options.trusted {
        Limits::TRUSTED
    } else {
        Limits::UNTRUSTED
    };
    let pickle = machine::read(&mut input, &limits, size).map_err(|e| pickle_error(origin, e))?;
    let whitespace = match pickle.after() {
        After::Nothing => 0,
        After::Whitespace { bytes } => bytes,
        After::Pickle { start } => return Err(another_pickle(origin, &pickle, start)),
        After::Bytes { start } => return Err(bytes_after(origin, &pickle, start)),
    };
    let mut source = import(&pickle, origin, options)?;
    if whitespace > 0 {
        source.header.notes.push(format!(
            "{whitespace} bytes of whitespace after the pickle's end (its STOP at byte {}) \
             ignored, as pickle.load ignores them",
            pickle.stop_end().saturating_sub(1)
        ));
    }
    Ok(source)
}

/// What the pickle before more bytes is: a snapshot's dict, a segment list, or something
/// else, named for a message.
enum First {
    Snapshot,
    SegmentList,
    Other(String),
}

/// What the pickle `pickle` is, for a message about what follows it.
fn first_pickle(origin: &str, pickle: &Pickle) -> Result<First> {
    let root = pickle.root();
    let [segments, device_traces] = root
        .get_all(["segments", "device_traces"])
        .map_err(|e| pickle_error(origin, e))?;
    if root.is_dict() && segments.is_some() && device_traces.is_some() {
        return Ok(First::Snapshot);
    }
    if segment_list(origin, root)?.is_some() {
        return Ok(First::SegmentList);
    }
    Ok(First::Other(match (pickle.root_global(), root.as_list()) {
        (Some(global), _) => format!("a pickle of {global}"),
        (None, Some(list)) if root.is_list() => list_kind(origin, list)?,
        (None, _) if root.is_dict() => format!("a dict with {}", keys_shown(origin, root)?),
        (None, _) => root.kind_name().to_string(),
    }))
}

/// The error for a pickle followed by another whole pickle, from byte `start`: `pickle.dump`
/// called twice on one file, or a file opened to append ('ab').
fn another_pickle(origin: &str, pickle: &Pickle, start: u64) -> TraceError {
    let stop = pickle.stop_end().saturating_sub(1);
    let first = match first_pickle(origin, pickle) {
        Ok(first) => first,
        Err(e) => return e,
    };
    let two = |named: &str| {
        format!(
            "{origin}: two or more pickles one after the other: the first{named} ends at byte \
             {stop} (its STOP) and another starts at byte {start}"
        )
    };
    not_a_trace_error(match first {
        First::Snapshot => format!(
            "{}; a snapshot file is one pickle: keep each snapshot in a file of its own \
             (torch.cuda.memory._dump_snapshot(path), or pickle.dump once to a file opened \
             with 'wb', not 'ab')",
            two(", a PyTorch memory snapshot,")
        ),
        First::SegmentList => format!(
            "{}; portalloc reads one segment list per file, the state of one moment: keep each \
             in a file of its own (pickle.dump(torch.cuda.memory_snapshot(), f) once to a file \
             opened with 'wb', not 'ab')",
            two(&format!(", {SEGMENT_LIST_NOTE},"))
        ),
        First::Other(kind) => format!(
            "{} (pickle.dump called more than once on one file?); the first is {kind}, \
             {NOT_A_SNAPSHOT}, and a snapshot file is one pickle",
            two("")
        ),
    })
}

/// The error for a pickle followed by bytes, from byte `start`, that read as no whole
/// pickle: a second pickle cut short, padding, other data.
fn bytes_after(origin: &str, pickle: &Pickle, start: u64) -> TraceError {
    let follow = format!(
        "bytes follow the end of the pickle (STOP) at byte {start} that read as no whole pickle"
    );
    let first = match first_pickle(origin, pickle) {
        Ok(first) => first,
        Err(e) => return e,
    };
    let stop = pickle.stop_end().saturating_sub(1);
    match first {
        First::Snapshot | First::SegmentList => malformed_error(format!(
            "{origin}: {follow} (a second pickle cut short, or bytes appended to the file?); \
             the pickle before them, to its STOP at byte {stop}, is {}: a file of it holds \
             that one pickle and nothing after it but whitespace",
            if matches!(first, First::Snapshot) {
                "a PyTorch memory snapshot"
            } else {
                SEGMENT_LIST_NOTE
            }
        )),
        First::Other(kind) => not_a_trace_error(format!(
            "{origin}: {follow}; the pickle before them is {kind}, {NOT_A_SNAPSHOT}"
        )),
    }
}

/// The events of a snapshot already read.
fn import(pickle: &Pickle, origin: &str, options: &Options) -> Result<VecSource> {
    let root = pickle.root();
    let [segments, device_traces] = root
        .get_all(["segments", "device_traces"])
        .map_err(|e| pickle_error(origin, e))?;
    // `_dump_snapshot` pickles a plain dict: an object built from a global (its state a
    // dict with a `segments` attribute, say) is something else unless it carries traces.
    if let (Some(global), None) = (pickle.root_global(), device_traces) {
        return Err(not_a_trace_error(format!(
            "{origin}: a pickle of {global}, {NOT_A_SNAPSHOT}"
        )));
    }
    // `_dump_snapshot` writes `segments` always: a dict without them is some other dict unless
    // it holds traces to replay (a snapshot stripped of its segments).
    let no_traces = device_traces
        .and_then(Val::as_list)
        .map_or(true, |t| t.len() == 0);
    if root.is_dict() && segments.is_none() && no_traces {
        return Err(not_a_trace_error(format!(
            "{origin}: a pickle of a dict with {}, {NOT_A_SNAPSHOT}: its keys are {SNAPSHOT_KEYS}",
            keys_shown(origin, root)?
        )));
    }
    if let Some(list) = segment_list(origin, root)? {
        return import_segment_list(origin, options, list);
    }
    if !root.is_dict() {
        let kind = match root.as_list().filter(|_| root.is_list()) {
            Some(list) => list_kind(origin, list)?,
            None => root.kind_name().to_string(),
        };
        return Err(not_a_trace_error(format!(
            "{origin}: a valid pickle, but of {kind}, not the dict \
             torch.cuda.memory._dump_snapshot writes (with segments and device_traces)"
        )));
    }
    let traces = device_traces.and_then(Val::as_list).ok_or_else(|| {
        not_a_trace_error(format!(
            "{origin}: the snapshot has no device_traces list (was torch.cuda.memory._record_memory_history enabled?)"
        ))
    })?;
    // No device to name or replay: refused rather than read as device 0 with no events.
    if traces.len() == 0 {
        return Err(not_a_trace_error(format!(
            "{origin}: the snapshot's device_traces is an empty list: it traced no device, \
             so there is nothing to replay"
        )));
    }
    let devices = device_list((0..traces.len()).map(|d| d as u64));
    refuse_other_device_types(origin, options, "a PyTorch memory snapshot", &devices)?;
    // The entries to replay per device, to choose the device with the most: only when there
    // is a choice (a walk of every entry).
    let counts = if options.device.is_none() && traces.len() > 1 {
        let mut counts: Vec<usize> = Vec::with_capacity(traces.len());
        for t in items(origin, traces) {
            let mut n = 0;
            if let Some(list) = t?.as_list() {
                for e in items(origin, list) {
                    if replayed(origin, e?)? {
                        n += 1;
                    }
                }
            }
            counts.push(n);
        }
        counts
    } else {
        Vec::new()
    };
    let device = match options.device {
        Some(d) => {
            let d = d as usize;
            if d >= traces.len() {
                return Err(selection_error(format!(
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
    let trace = match items(origin, traces).nth(device) {
        Some(t) => t?.as_list(),
        None => None,
    };

    // Live at dump time and reserved, from the segments of this device; and each block live
    // at dump time, `(address, requested bytes)`, in the segments' order: those the window
    // did not allocate are memory from before it, known one by one.
    let state = match segments {
        Some(v) => match v.as_list().filter(|_| v.is_list()) {
            Some(list) => device_states(origin, Form::Snapshot, list, Some(device as u64))?
                .remove(&(device as u64))
                .unwrap_or_default(),
            None => {
                return Err(malformed_error(format!(
                    "{origin}: a PyTorch memory snapshot, but its segments is {} (snapshot['segments']); accepted: a list of segment dicts",
                    v.shown()
                )))
            }
        },
        None => DeviceState::default(),
    };
    let DeviceState {
        segments,
        reserved,
        live: live_at_dump,
        live_blocks,
    } = state;

    // The entries, read in one walk (five keys each), and the net of the trace as recorded,
    // which the baseline needs: known only at the end of the walk. Entries are fed as they
    // are read while nothing depends on the baseline: up to the first free of an address not
    // allocated in the trace (one that draws on it; none in many traces). From there on they
    // are kept (about the size of the events they make) and fed once it is known. Same
    // events and anomalies, in the same order, as keeping them all and feeding them after
    // the walk; which is what strict mode does, where an anomaly is an error and an error of
    // the walk further down the list must be the one reported.
    let len = trace.map_or(0, Seq::len);
    let mut emitter = Emitter::new(Keying::Addresses, options.strict, origin, 0);
    emitter.tracker.defer_baseline();
    let mut feeding = !options.strict;
    // Made at the size of the list (most of its entries become events), not copied as they
    // grow; capped, for a list of references to one dict that the limit on walk steps stops.
    let room = len.min(1 << 20);
    let mut events = Vec::with_capacity(room);
    let mut entries: Vec<Entry> = if feeding {
        Vec::new()
    } else {
        Vec::with_capacity(room)
    };
    let mut net: i128 = 0;
    // The addresses the window allocated and left live at its end (an `alloc` not followed
    // by a `free_completed` of its address): the blocks live at dump time at the others are
    // from before the window.
    let mut window_live: FxHashSet<u64> = FxHashSet::default();
    let mut walked = 0u64;
    let mut kept = 0u64;
    let mut memo = KeyMemo::default();
    for (i, e) in trace
        .into_iter()
        .flat_map(|list| items(origin, list))
        .enumerate()
    {
        walked += 1;
        let [action, addr, size, time_us, stream] = get_all(
            origin,
            e?,
            ["action", "addr", "size", "time_us", "stream"],
            &mut memo,
        )?;
        let action = match action.and_then(Val::as_str) {
            Some("alloc") => Action::Alloc,
            Some("free_completed") => Action::FreeCompleted,
            Some("oom") => Action::Oom,
            _ => continue,
        };
        kept += 1;
        let size = size.and_then(Val::as_u64);
        let addr = addr.and_then(Val::as_u64);
        let bytes = i128::from(size.unwrap_or(0));
        match action {
            Action::Alloc => {
                net += bytes;
                window_live.extend(addr);
            }
            Action::FreeCompleted => {
                net -= bytes;
                if let Some(a) = addr {
                    window_live.remove(&a);
                }
            }
            Action::Oom => {}
        }
        let entry = Entry {
            position: i as u64,
            action,
            addr,
            size,
            time_ns: time_us.and_then(Val::as_f64).map(us_to_ns).unwrap_or(0),
            stream: stream.and_then(Val::as_u64).unwrap_or(0),
        };
        if feeding {
            if feed(&mut emitter, &entry, &mut events)? {
                continue;
            }
            feeding = false;
            entries.reserve(len.saturating_sub(i).min(1 << 20));
        }
        entries.push(entry);
    }
    let baseline = u64::try_from((live_at_dump as i128 - net).max(0)).unwrap_or(u64::MAX);
    let pre_window_blocks = pre_window_blocks(&live_blocks, &window_live, baseline);
    emitter.tracker.set_baseline(baseline);
    for e in &entries {
        // The baseline is set: every entry is fed.
        feed(&mut emitter, e, &mut events)?;
    }
    let skipped = walked - kept;

    let mut header = TraceHeader::new(format!("{}:{origin}", Format::PytorchSnapshot.name()));
    header.device = Some(format!("cuda:{device}"));
    header.baseline_bytes = baseline;
    header.reference = Some(Reference {
        reserved_bytes: (segments > 0).then(|| u64::try_from(reserved).unwrap_or(u64::MAX)),
        peak_live_bytes: None,
        allocator: Some("pytorch-caching".to_string()),
    });
    header.notes.push(format!(
        "alloc and free_completed of device_traces[{device}] ({} devices traced); {skipped} other entries skipped; baseline = requested bytes of the active_allocated and active_pending_free blocks at dump ({live_at_dump} bytes) - net of the trace ({net} bytes)",
        traces.len()
    ));
    let known: u64 = pre_window_blocks.iter().sum();
    header.notes.push(format!(
        "of that baseline, {} blocks live at dump time that the trace did not allocate ({known} bytes) are replayed at their own sizes; the rest ({} bytes) is freed in the trace or of unknown shape",
        pre_window_blocks.len(),
        baseline - known
    ));
    header.pre_window_blocks = pre_window_blocks;
    Ok(VecSource {
        header,
        anomalies: emitter.tracker.anomalies,
        events: events.into_iter(),
    })
}

/// The state of a device read from the list of segments `torch.cuda.memory_snapshot()`
/// returns (pickled as it is): no events, and every block live at that moment memory from
/// before the window, as a snapshot's blocks are when its `device_traces` hold nothing of
/// them. Replay then holds that state, which is what a strategy needs room for. Device: the
/// one asked for, else the one with the most live bytes (the lowest number on a tie): the
/// memory a plan must hold, where a snapshot's device is the one with the most entries to
/// replay.
///
/// # Errors
/// A value of the segments that cannot be read ([`device_states`]); a device type other
/// than cuda or hip asked for; a device asked for that has no segment in the list; a limit
/// of the walk.
fn import_segment_list(origin: &str, options: &Options, list: Seq<'_>) -> Result<VecSource> {
    let mut states = device_states(origin, Form::SegmentList, list, None)?;
    let devices = device_list(states.keys().copied());
    refuse_other_device_types(origin, options, SEGMENT_LIST_NOTE, &devices)?;
    let device = match options.device {
        Some(d) if states.contains_key(&u64::from(d)) => u64::from(d),
        Some(d) => {
            return Err(selection_error(format!(
                "{origin}: no device {d}: the segment list (torch.cuda.memory_snapshot()) has \
                 segments of {devices}"
            )))
        }
        None => states
            .iter()
            .max_by_key(|(d, s)| (s.live, std::cmp::Reverse(**d)))
            .map_or(0, |(d, _)| *d),
    };
    let chosen = if options.device.is_some() {
        "the device asked for"
    } else if states.len() == 1 {
        "its only device"
    } else {
        "the device with the most live bytes"
    };
    let state = states.remove(&device).unwrap_or_default();
    // Within 64 bits: device_states refuses a larger sum.
    let baseline = u64::try_from(state.live).unwrap_or(u64::MAX);
    // Nothing in a window: every live block with an address is known one by one.
    let pre_window_blocks = pre_window_blocks(&state.live_blocks, &FxHashSet::default(), baseline);
    let known: u64 = pre_window_blocks.iter().sum();

    let mut header = TraceHeader::new(format!("{}:{origin}", Format::PytorchSnapshot.name()));
    header.device = Some(format!("cuda:{device}"));
    header.baseline_bytes = baseline;
    header.reference = Some(Reference {
        reserved_bytes: Some(u64::try_from(state.reserved).unwrap_or(u64::MAX)),
        peak_live_bytes: None,
        allocator: Some("pytorch-caching".to_string()),
    });
    header.notes.push(format!(
        "{SEGMENT_LIST_NOTE}: the state of cuda:{device} at one moment, no events; {} \
         segment{} of device {device}, {chosen} (segments of {devices})",
        state.segments,
        if state.segments == 1 { "" } else { "s" },
    ));
    header.notes.push(format!(
        "baseline = requested bytes of the active_allocated and active_pending_free blocks \
         ({baseline} bytes): {} blocks replayed at their own sizes ({known} bytes), the rest \
         ({} bytes) of unknown shape",
        pre_window_blocks.len(),
        baseline - known
    ));
    header.pre_window_blocks = pre_window_blocks;
    Ok(VecSource {
        header,
        anomalies: crate::trace::Anomalies::new(),
        events: Vec::new().into_iter(),
    })
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;
    use std::path::Path;

    use super::*;

    /// CUDA's and HIP's numbers are PyTorch's, as the Kineto reader names them.
    #[test]
    fn cuda_and_hip_are_pytorchs_numbers() {
        assert_eq!(crate::trace::import::kineto::type_name(CUDA), "cuda");
        assert_eq!(crate::trace::import::kineto::type_name(HIP), "hip");
    }

    /// The real snapshots (`../shared/traces*/`, absent from a fresh clone), sorted; says
    /// which directory is missing.
    fn real_snapshots() -> Vec<std::path::PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("shared");
        let mut found = Vec::new();
        for dir in ["traces", "traces-edge"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                eprintln!("skipping: no {}", root.join(dir).display());
                continue;
            };
            let mut paths: Vec<_> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
                .collect();
            paths.sort();
            found.extend(paths);
        }
        found
    }

    /// The real snapshots (`../shared/traces*/`, absent from a fresh clone) read and imported
    /// with room to spare: each figure at most 1/8 of its limit, so a snapshot 8 times larger
    /// in every respect still imports. Run with `--nocapture` to see the figures.
    #[test]
    fn real_snapshots_stay_far_below_the_limits() {
        let mut seen = 0;
        for path in real_snapshots() {
            let file = std::fs::File::open(&path).unwrap();
            let size = file.metadata().unwrap().len();
            let mut input = BufReader::new(file);
            let limits = Limits::UNTRUSTED;
            let p = machine::read(&mut input, &limits, Some(size)).unwrap();
            import(&p, "real", &Options::default()).unwrap();
            let f = p.figures();
            eprintln!(
                "{}: {f:?}, walk steps {}",
                path.file_name().unwrap().to_string_lossy(),
                p.walk_steps()
            );
            let pairs = [
                ("input bytes", f.used.input_bytes, limits.input_bytes),
                ("values", f.used.values, limits.values),
                ("containers", f.used.containers, limits.containers),
                ("memo entries", f.used.memo_entries, limits.memo_entries),
                ("payload bytes", f.used.payload_bytes, limits.payload_bytes),
                ("open marks", f.used.open_marks, limits.open_marks),
                ("walk steps", p.walk_steps(), limits.walk_steps),
            ];
            for (what, used, limit) in pairs {
                assert!(
                    used.saturating_mul(8) <= limit,
                    "{}: {what} {used} is more than 1/8 of the limit {limit}",
                    path.display()
                );
            }
            seen += 1;
        }
        eprintln!("{seen} real snapshots checked");
    }
}
