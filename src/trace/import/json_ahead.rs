//! Scanning a Kineto trace's events ahead, on the thread that inflates it.
//!
//! Reading a gzip'd Kineto trace takes two threads: one inflates (`trace::inflate`), the
//! other walks the events (`json_frames`, `json_skip`) — and the walk took about three times
//! as long as the inflating, so the inflating thread idled most of the time. Here it takes
//! a share of the walk: in each buffer it has inflated, before handing it over, it finds a
//! likely start of an event past [`AHEAD_FROM`] of the buffer (a `{` after `},`), and scans
//! the events from there to the buffer's end, as the walk would (`json_frames::element_step`
//! with `json_skip::scan_event`), into a [`Chain`] of decisions. The parsing thread walks the
//! buffer's first part itself; where its walk reaches the chain's start, it takes the
//! chain's decisions instead of scanning those events again (`Frames::scan_elements`).
//!
//! A guess that is not an event's start (a `},` inside a string) is never reached by the
//! walk, which then scans the rest itself: the guess costs time, never a different result.
//! A chain taken is one made from the same bytes by the same steps: the events read, and
//! the errors, are those of the walk alone.
#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::json_frames::element_step;
use super::json_skip::{scan_event, skip_ws, Memory, Scan};
use crate::trace::inflate::DEPTH;

/// Where in a buffer the scan ahead starts looking for an event, in 256ths of the buffer, at
/// first: the inflating thread spends about half the time the walk does on a buffer
/// (inflating, checking the CRC, handing over), so it scans about the last 30% and the walk
/// the first 70% (measured, load ~1: DDP's read took 47 ms without, 40–42 at 154, 37–39 at
/// 172, 36.5 at 190; resnet50's 21.8, 19.4, 17.8, 18.6). Then [`next_from`] moves it.
pub(crate) const AHEAD_FROM: usize = 180;

/// The least [`next_from`] goes to: the inflating thread scans at most the last 3/4.
const MIN_FROM: usize = 64;

/// What [`next_from`] moves the start by, per buffer.
const FROM_STEP: usize = 4;

/// Where the scan ahead starts in the next buffer (256ths), from where it started in the last
/// and the buffers waiting for the reader: none — the reader has caught up and waits, or
/// soon will — scan less (at 256, nothing); two or more — the reader is behind — scan more.
/// So the inflating thread takes as much of the scan as keeps the reader from waiting,
/// whatever the machine and its load.
///
/// # Time complexity
/// O(1).
pub(crate) fn next_from(from: usize, queued: usize) -> usize {
    match queued {
        0 => (from + FROM_STEP).min(256),
        1 => from,
        _ => from.saturating_sub(FROM_STEP).max(MIN_FROM),
    }
}

/// Candidate starts tried in a buffer before it is handed over without a chain.
const GUESSES: usize = 8;

/// Steps a chain holds at most, so that the chains in flight stay smaller than the buffers
/// whatever the events' size (a step is 24 bytes, with 144 more for a `[memory]` event's
/// numbers; a real event is hundreds of bytes: the last 30% of a buffer of DDP's is ~310
/// events): the walk scans the rest itself.
pub(crate) const MAX_STEPS: usize = 2048;

/// One element scanned ahead: its bytes (`used`, as the scan decided: [`Scan::Memory`] when
/// `memory`, with the chain's next [`Memory`], else [`Scan::Drop`]), where the walk goes on
/// (`to`, bytes from the chain's start), and whether another element follows (the walk goes
/// on at its start) or not (the walk stops after this one). The `[memory]` events' numbers
/// are kept apart: most steps are events dropped, and a step stays small to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) used: usize,
    pub(crate) to: usize,
    pub(crate) followed: bool,
    pub(crate) memory: bool,
}

/// Elements scanned ahead from `start`, one after another, in a buffer that ends at `end`.
/// Invariant: `steps` is not empty and holds at most [`MAX_STEPS`]; every step but the last
/// is followed; the last is not followed, or the element after it is not decided by the
/// scan, or the chain is full.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Chain {
    /// Bytes of the stream before the first element.
    pub(crate) start: u64,
    /// Bytes of the stream before the end of the buffer scanned.
    pub(crate) end: u64,
    pub(crate) steps: Vec<Step>,
    /// The numbers of the `[memory]` events among the steps, in order. Invariant: one per
    /// step with `memory`.
    pub(crate) memories: Vec<Memory>,
}

impl Chain {
    /// Each step with the decision the scan made on its element.
    pub(crate) fn decisions(&self) -> impl Iterator<Item = (Scan, &Step)> {
        let mut memories = self.memories.iter();
        self.steps.iter().map(move |step| {
            let decided = if step.memory {
                // One per memory step (the invariant): never the default.
                Scan::Memory(step.used, memories.next().copied().unwrap_or_default())
            } else {
                Scan::Drop(step.used)
            };
            (decided, step)
        })
    }
}

/// The chains scanned ahead and not yet taken, in stream order, and where in a buffer the
/// next scan ahead starts. Invariant: at most [`MAX_CHAINS`], starts increasing;
/// `MIN_FROM <= from <= 256`.
#[derive(Debug)]
pub(crate) struct Ahead {
    chains: Mutex<VecDeque<Chain>>,
    /// Only the inflating thread reads and writes it.
    from: AtomicUsize,
}

impl Default for Ahead {
    fn default() -> Ahead {
        Ahead {
            chains: Mutex::default(),
            from: AtomicUsize::new(AHEAD_FROM),
        }
    }
}

/// Chains held at most: one per buffer, and the inflating thread is at most `DEPTH` + 2
/// buffers ahead of the reader; an older chain is one the walk has passed.
const MAX_CHAINS: usize = DEPTH + 3;

impl Ahead {
    /// Scans ahead in `buf`, whose first byte is the stream's byte `offset`, with `queued`
    /// buffers waiting for the reader: from the first likely start of an event past where
    /// [`next_from`] says, if any.
    ///
    /// # Time complexity
    /// O(n) in the buffer's bytes.
    pub(crate) fn scan(&self, buf: &[u8], offset: u64, queued: usize) {
        let from = next_from(self.from.load(Ordering::Relaxed), queued);
        self.from.store(from, Ordering::Relaxed);
        if from >= 256 {
            return;
        }
        if let Some(at) = guess(buf, buf.len() * from / 256) {
            self.scan_from(buf, offset, at);
        }
    }

    /// Scans ahead in `buf` (whose first byte is the stream's byte `offset`) from `at`, as
    /// if an element started there; keeps the chain if an element was decided.
    ///
    /// # Time complexity
    /// O(n) in the bytes from `at`.
    pub(crate) fn scan_from(&self, buf: &[u8], offset: u64, at: usize) {
        let mut steps = Vec::new();
        let mut memories = Vec::new();
        let mut next = at;
        while let Some((decided, to, followed)) = element_step(buf, next, &scan_event) {
            let (used, memory) = match decided {
                Scan::Memory(used, m) => {
                    memories.push(m);
                    (used, true)
                }
                Scan::Drop(used) => (used, false),
                // `element_step` gives decided elements only.
                Scan::Parse | Scan::Incomplete => break,
            };
            steps.push(Step {
                used,
                to: to - at,
                followed,
                memory,
            });
            if !followed || steps.len() == MAX_STEPS {
                break;
            }
            next = to;
        }
        if steps.is_empty() {
            return;
        }
        let chain = Chain {
            start: offset + at as u64,
            end: offset + buf.len() as u64,
            steps,
            memories,
        };
        if let Ok(mut chains) = self.chains.lock() {
            if chains.len() == MAX_CHAINS {
                chains.pop_front();
            }
            chains.push_back(chain);
        }
    }

    /// The first chain that starts at or after the stream's byte `at`, taken out; the chains
    /// before it (which the walk has passed) dropped.
    ///
    /// # Time complexity
    /// O(chains dropped).
    pub(crate) fn take(&self, at: u64) -> Option<Chain> {
        let mut chains = self.chains.lock().ok()?;
        while chains.front().is_some_and(|c| c.start < at) {
            chains.pop_front();
        }
        chains.pop_front()
    }
}

/// A likely start of an array element at or after `from` in `buf`: a `{` after `}` and `,`
/// (whitespace between), as trace events follow one another; the first of [`GUESSES`].
fn guess(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    for _ in 0..GUESSES {
        let k = memchr::memmem::find(buf.get(at..)?, b"},")?;
        let next = skip_ws(buf, at + k + 2);
        if buf.get(next) == Some(&b'{') {
            return Some(next);
        }
        at = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: &str = r#"{"name": "a", "ts": 1}"#;

    #[test]
    fn a_guess_is_a_brace_after_a_closed_element() {
        let text = format!("[{E},\n  {E}, {E},{E}]");
        let starts: Vec<usize> = text.match_indices("{\"name").map(|(i, _)| i).collect();
        assert_eq!(guess(text.as_bytes(), 0), Some(starts[1]));
        assert_eq!(guess(text.as_bytes(), starts[1]), Some(starts[2]));
        assert_eq!(guess(text.as_bytes(), starts[3]), None);
        // `},` not followed by `{`, then one that is.
        let text = format!("[{{\"a\": {{}}, \"b\": 1}}, {E}]");
        assert_eq!(guess(text.as_bytes(), 0), text.find("{\"name"));
    }

    /// A chain is the walk's steps from its start: each element decided, where the walk goes
    /// on, and its last step not followed (or followed by an element the scan leaves).
    #[test]
    fn a_chain_holds_the_walks_steps() {
        let m = r#"{"name": "[memory]", "ts": 2}"#;
        let cases = [
            ("to the array's end", format!("[{E}, {E}]"), 1, 2, false),
            (
                "to an element left to serde_json",
                format!("[{E}, {E}, 7, {E}]"),
                1,
                2,
                true,
            ),
            (
                "to the buffer's end",
                format!("[{E}, {m}, {E}"),
                1,
                3,
                false,
            ),
            (
                "to an element cut",
                format!("[{E}, {m}, {{\"na"),
                1,
                2,
                true,
            ),
            (
                "nothing decided",
                format!("[{E}, 7]"),
                E.len() + 3,
                0,
                false,
            ),
        ];
        for (name, text, at, steps, last_followed) in cases {
            let ahead = Ahead::default();
            ahead.scan_from(text.as_bytes(), 100, at);
            let chain = ahead.take(0);
            if steps == 0 {
                assert_eq!(chain, None, "{name}");
                continue;
            }
            let chain = chain.unwrap_or_else(|| panic!("{name}: no chain"));
            assert_eq!(chain.start, 100 + at as u64, "{name}");
            assert_eq!(chain.end, 100 + text.len() as u64, "{name}");
            assert_eq!(chain.steps.len(), steps, "{name}");
            let mut next = at;
            for (i, (decided, step)) in chain.decisions().enumerate() {
                let want = element_step(text.as_bytes(), next, &scan_event);
                assert_eq!(
                    Some((decided, at + step.to, step.followed)),
                    want,
                    "{name}: step {i}"
                );
                next = at + step.to;
            }
            assert_eq!(
                chain.steps.last().map(|s| s.followed),
                Some(last_followed),
                "{name}"
            );
        }
    }

    /// The start moves later while the reader waits, earlier while it is behind, within its
    /// bounds.
    #[test_case::test_case(180, 0, 184 ; "the reader waits: scan less")]
    #[test_case::test_case(180, 1, 180 ; "one buffer ready: keep")]
    #[test_case::test_case(180, 2, 176 ; "the reader behind: scan more")]
    #[test_case::test_case(180, 6, 176 ; "far behind: one step")]
    #[test_case::test_case(254, 0, 256 ; "up to no scan at all")]
    #[test_case::test_case(256, 0, 256 ; "no scan stays")]
    #[test_case::test_case(256, 3, 252 ; "back from no scan")]
    #[test_case::test_case(66, 4, 64 ; "down to the least")]
    #[test_case::test_case(64, 4, 64 ; "the least stays")]
    fn the_start_follows_the_reader(from: usize, queued: usize, want: usize) {
        assert_eq!(next_from(from, queued), want);
    }

    /// At 256 nothing is scanned ahead; the start comes back once the reader falls behind.
    #[test]
    fn a_reader_that_waits_gets_buffers_unscanned() {
        // Events to the last 2% of the buffer.
        let text = format!("[{}]", vec![E; 200].join(", "));
        let ahead = Ahead::default();
        for _ in 1..(256 - AHEAD_FROM) / FROM_STEP {
            ahead.scan(text.as_bytes(), 0, 0);
            assert!(ahead.take(0).is_some());
        }
        ahead.scan(text.as_bytes(), 0, 0);
        assert_eq!(ahead.take(0), None);
        ahead.scan(text.as_bytes(), 0, 2);
        assert!(ahead.take(0).is_some());
    }

    /// A chain stops at `MAX_STEPS`, followed: the walk goes on from there itself.
    #[test]
    fn a_chain_is_full_at_max_steps() {
        let text = format!("[{}]", vec!["{}"; MAX_STEPS + 100].join(","));
        let ahead = Ahead::default();
        ahead.scan_from(text.as_bytes(), 0, 1);
        let chain = ahead.take(0).expect("a chain");
        assert_eq!(chain.steps.len(), MAX_STEPS);
        assert_eq!(
            chain.steps.last().map(|s| (s.to, s.followed)),
            Some((3 * MAX_STEPS, true))
        );
    }

    /// Chains the walk has passed are dropped when a later one is taken, and no more than
    /// `MAX_CHAINS` are held.
    #[test]
    fn chains_passed_are_dropped() {
        let text = format!("[{E}, {E}]");
        let ahead = Ahead::default();
        for k in 0..MAX_CHAINS as u64 + 3 {
            ahead.scan_from(text.as_bytes(), 1000 * k, 1);
        }
        assert_eq!(ahead.chains.lock().map(|c| c.len()).ok(), Some(MAX_CHAINS));
        let taken = ahead.take(5000).map(|c| c.start);
        assert_eq!(taken, Some(5001));
        assert_eq!(ahead.take(5001).map(|c| c.start), Some(6001));
    }
}
