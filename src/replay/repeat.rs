//! A trace replayed as the steps of a program that repeats it: `portalloc replay --repeat N`.
//! One recorded step (a training step, a decode loop's iteration) says what the driver is
//! asked the first time; a program runs it thousands of times, and what it costs once warm is
//! what the steps after the first cost. [`repeat`] makes the events of `N` passes, each a step
//! ([`TraceHeader::step_starts`]), so that replay reports the device calls of each.
//!
//! Each pass is the trace's events again, with the allocations made in the window given ids
//! of their own per pass. What a pass leaves live is freed at its end (but the last pass's,
//! as the trace left them): a step's allocations do not outlive the next step's. Frees of
//! memory from before the window come in the first pass only — that memory is freed once.
#![deny(unsafe_code)]

use std::collections::HashSet;

use crate::error::{Error, Result};
use crate::trace::{Event, Op, TraceHeader};

/// The most passes [`repeat`] makes.
pub const MAX_PASSES: u32 = 1000;
/// The most events [`repeat`] makes in all (as many as a replay holds in memory at once for
/// the largest real traces, 16 Mi events of 48 bytes: under a GiB).
pub const MAX_EVENTS: u64 = 1 << 24;

/// The events of `passes` passes of `events` (see the module docs), with `header`'s step
/// starts set to where each pass begins.
///
/// ```
/// use portalloc::replay::repeat::repeat;
/// use portalloc::trace::{Event, Op, TraceHeader};
///
/// let event = |seq, op, id| Event { seq, time_ns: seq, thread: 0, stream: 0, op, id, size: 64, tag: 0 };
/// // One step: allocate 1, allocate 2, free 1 (2 stays live at the end).
/// let step = [event(0, Op::Alloc, 1), event(1, Op::Alloc, 2), event(2, Op::Free, 1)];
/// let (header, events) = repeat(&TraceHeader::new("t"), &step, 3)?;
/// assert_eq!(header.step_starts, [0, 4, 8]);
/// // Each pass but the last frees what it left live at its end.
/// assert_eq!(events.len(), 3 + 1 + 3 + 1 + 3);
/// assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
/// # Ok::<(), portalloc::Error>(())
/// ```
///
/// # Errors
/// [`Error::Config`] for 0 passes, more than [`MAX_PASSES`], more than [`MAX_EVENTS`]
/// events in all, ids or times the passes would take past `u64::MAX`, or more than one pass
/// of a trace that allocates nothing in its window (its passes would be empty steps).
///
/// # Time complexity
/// `O(passes × events)`, the size of the result.
pub fn repeat(
    header: &TraceHeader,
    events: &[Event],
    passes: u32,
) -> Result<(TraceHeader, Vec<Event>)> {
    if passes == 0 || passes > MAX_PASSES {
        return Err(Error::config(
            "--repeat",
            passes.to_string(),
            format!("a number of passes from 1 to {MAX_PASSES}"),
        ));
    }
    // The ids allocated in the window, and those still live at its end (in allocation
    // order, for a deterministic end of pass).
    let mut allocated: HashSet<u64> = HashSet::new();
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut live_at: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for e in events {
        match e.op {
            Op::Alloc => {
                allocated.insert(e.id);
                live_at.insert(e.id, live.len());
                live.push((e.id, e.size));
            }
            Op::Free => {
                if let Some(i) = live_at.remove(&e.id) {
                    live[i].0 = u64::MAX;
                }
            }
        }
    }
    let left: Vec<(u64, u64)> = live.into_iter().filter(|&(id, _)| id != u64::MAX).collect();
    let per_pass = events.len() as u64 + left.len() as u64;
    let total = per_pass.saturating_mul(u64::from(passes));
    if total > MAX_EVENTS {
        return Err(Error::config(
            "--repeat",
            passes.to_string(),
            format!(
                "at most {MAX_EVENTS} events in all: this trace makes {per_pass} per pass, so at \
                 most {} passes",
                (MAX_EVENTS / per_pass.max(1)).max(1)
            ),
        ));
    }
    // Ids of a pass: the window's own, offset by a stride above every id of the trace (those
    // of memory from before the window included), pass by pass.
    let stride = events
        .iter()
        .map(|e| e.id)
        .max()
        .map_or(1, |m| m.saturating_add(1));
    let no_room = |what: &str| {
        Error::config(
            "--repeat",
            passes.to_string(),
            format!("fewer passes: the trace's {what} leave no room for more"),
        )
    };
    // A pass past the first replays the window's own events and frees what it left: a
    // trace with none of those has nothing to repeat (its passes would be empty steps).
    let own_events = events.iter().filter(|e| allocated.contains(&e.id)).count();
    if passes > 1 && own_events == 0 {
        return Err(Error::config(
            "--repeat",
            passes.to_string(),
            "1: the trace allocates nothing in its window, so a repeated pass would be empty",
        ));
    }
    let span = events
        .iter()
        .map(|e| e.time_ns)
        .max()
        .unwrap_or(0)
        .checked_add(1)
        .ok_or_else(|| no_room("times"))?;
    let mut out: Vec<Event> = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
    let mut out_header = header.clone();
    out_header.step_starts.clear();
    for pass in 0..u64::from(passes) {
        out_header.step_starts.push(out.len() as u64);
        let offset = pass.checked_mul(stride).ok_or_else(|| no_room("ids"))?;
        let start = pass.checked_mul(span).ok_or_else(|| no_room("times"))?;
        for e in events {
            let own = allocated.contains(&e.id);
            if pass > 0 && !own {
                // Memory from before the window is freed once.
                continue;
            }
            let id = if own {
                e.id.checked_add(offset).ok_or_else(|| no_room("ids"))?
            } else {
                e.id
            };
            out.push(Event {
                seq: out.len() as u64,
                time_ns: start
                    .checked_add(e.time_ns)
                    .ok_or_else(|| no_room("times"))?,
                id,
                ..*e
            });
        }
        if pass + 1 < u64::from(passes) {
            // The pass's last instant: below the next pass's start, which was checked.
            let time_ns = start + (span - 1);
            for &(id, size) in &left {
                out.push(Event {
                    seq: out.len() as u64,
                    time_ns,
                    thread: 0,
                    stream: 0,
                    op: Op::Free,
                    id: id + offset,
                    size,
                    tag: 0,
                });
            }
        }
    }
    Ok((out_header, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_case::test_case;

    fn ev(seq: u64, op: Op, id: u64) -> Event {
        Event {
            seq,
            time_ns: seq,
            thread: 0,
            stream: 0,
            op,
            id,
            size: 256,
            tag: 0,
        }
    }

    #[test_case(0 ; "no pass")]
    #[test_case(MAX_PASSES + 1 ; "too many passes")]
    fn refused(passes: u32) {
        let e = repeat(&TraceHeader::new("t"), &[ev(0, Op::Alloc, 1)], passes).unwrap_err();
        assert!(e.to_string().contains("--repeat"), "{e}");
    }

    /// Every free frees a live id, no id is allocated twice while live, and memory from
    /// before the window (id 9, freed but never allocated) is freed once.
    #[test]
    fn passes_are_well_formed() {
        let step = [
            ev(0, Op::Alloc, 1),
            ev(1, Op::Free, 9),
            ev(2, Op::Alloc, 2),
            ev(3, Op::Free, 1),
        ];
        let (h, out) = repeat(&TraceHeader::new("t"), &step, 4).unwrap();
        assert_eq!(h.step_starts, [0, 5, 9, 13]);
        let mut live = HashSet::new();
        let mut pre_window_frees = 0;
        for e in &out {
            match e.op {
                Op::Alloc => assert!(live.insert(e.id), "{e:?} allocated twice"),
                Op::Free if e.id == 9 => pre_window_frees += 1,
                Op::Free => assert!(live.remove(&e.id), "{e:?} frees nothing live"),
            }
        }
        assert_eq!(pre_window_frees, 1);
        // The last pass leaves what the trace left.
        assert_eq!(live.len(), 1);
    }

    /// An outside review's reproductions: times at the top of the range, and traces whose
    /// repeated passes would be empty.
    #[test_case(&[(0, Op::Alloc, 1, 0), (1, Op::Free, 1, u64::MAX)], 3, "times" ; "a time at u64::MAX")]
    #[test_case(&[(0, Op::Alloc, 1, 0), (1, Op::Free, 1, u64::MAX / 2)], 4, "times" ; "times overflowing between passes")]
    #[test_case(&[], 5, "allocates nothing" ; "an empty trace")]
    #[test_case(&[(0, Op::Free, 9, 0)], 2, "allocates nothing" ; "only frees of earlier memory")]
    fn hostile_traces_are_refused(events: &[(u64, Op, u64, u64)], passes: u32, needle: &str) {
        let events: Vec<Event> = events
            .iter()
            .map(|&(seq, op, id, t)| Event {
                time_ns: t,
                ..ev(seq, op, id)
            })
            .collect();
        let e = repeat(&TraceHeader::new("t"), &events, passes).unwrap_err();
        assert!(e.to_string().contains(needle), "{e}");
    }

    #[test]
    fn one_pass_of_anything_is_the_trace() {
        let (h, out) = repeat(&TraceHeader::new("t"), &[], 1).unwrap();
        assert_eq!((h.step_starts, out.len()), (vec![0], 0));
    }

    #[test]
    fn too_many_events_are_refused_naming_the_most_passes() {
        let step: Vec<Event> = (0..1 << 14).map(|i| ev(i, Op::Alloc, i)).collect();
        let e = repeat(&TraceHeader::new("t"), &step, 1000).unwrap_err();
        assert!(e.to_string().contains("at most 512 passes"), "{e}");
    }
}
