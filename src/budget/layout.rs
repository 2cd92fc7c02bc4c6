//! The shared budget's segment, word by word. Every field is a 64-bit word (an `AtomicU64` in
//! the mapping), so any value another process left is a value: what a word may mean is
//! checked where it is read ([`check_header`], [`read_slot`]), never assumed.
//!
//! ```text
//! header   32 words  magic, version, geometry, device total, doorbell, claim counter,
//!                    device key (64 bytes), hand-off log head
//! log      32 × 10   the last hand-offs: seq, time, donor pid, requester pid, bytes, kind, tag
//! slots    64 × 160  one per member process
//! ```
//!
//! A slot is written by its owner only. Its numbers (reserved, in use, cached, asleep) are
//! single words; its structured parts (identity, tags, asks) sit behind a sequence word that
//! is odd while the owner writes them (a seqlock): a reader retries a bounded number of
//! times, and a slot whose owner died mid-write stays odd until it is reaped.
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

/// `"PALBUDG\x01"`: what the first word of a ready segment holds.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PALBUDG\x01");
/// The layout this build reads and writes.
pub const VERSION: u64 = 1;

/// Words of the header.
pub const HEADER_WORDS: usize = 32;
/// Hand-offs kept in the log.
pub const LOG_ENTRIES: usize = 32;
/// Words per log entry.
pub const LOG_WORDS: usize = 10;
/// Member slots: processes that can join one device's budget at once.
pub const SLOTS: usize = 64;
/// Words per slot.
pub const SLOT_WORDS: usize = 160;
/// Where the log starts.
pub const LOG_START: usize = HEADER_WORDS;
/// Where the slots start.
pub const SLOTS_START: usize = LOG_START + LOG_ENTRIES * LOG_WORDS;
/// Words of the whole segment.
pub const TOTAL_WORDS: usize = SLOTS_START + SLOTS * SLOT_WORDS;

// ---- header words ----
/// Magic, written last by the creator (release): a reader that sees it sees the rest.
pub const H_MAGIC: usize = 0;
/// Layout version.
pub const H_VERSION: usize = 1;
/// `HEADER_WORDS`, `SLOTS`, `SLOT_WORDS`, `LOG_ENTRIES` packed 16 bits each.
pub const H_GEOMETRY: usize = 2;
/// The device's total bytes, as the creator saw them.
pub const H_DEVICE_TOTAL: usize = 3;
/// The doorbell: a futex word bumped and woken by every ask and every answer.
pub const H_DOORBELL: usize = 4;
/// Claim counter: makes every slot owner word unique (no ABA on a reused pid).
pub const H_CLAIMS: usize = 5;
/// Hand-off log head (entries written so far).
pub const H_LOG_HEAD: usize = 6;
/// Set in an owner word while its process claims the slot (its pid and start time not written
/// yet): the slot is nobody's member yet, and it is reaped only once that pid is gone.
pub const CLAIMING: u64 = 1 << 31;
/// The device key, 64 bytes.
pub const H_KEY: usize = 8;
/// Words of the device key.
pub const KEY_WORDS: usize = 8;

/// The geometry word of this layout.
pub const GEOMETRY: u64 = (HEADER_WORDS as u64)
    | (SLOTS as u64) << 16
    | (SLOT_WORDS as u64) << 32
    | (LOG_ENTRIES as u64) << 48;

// ---- slot words (offsets within a slot) ----
/// `pid << 32 | claim` (with [`CLAIMING`] while it is being claimed); 0 = free.
pub const S_OWNER: usize = 0;
/// Sequence word of the structured part: odd while its owner writes.
pub const S_SEQ: usize = 1;
/// The pid.
pub const S_PID: usize = 2;
/// The process's start time (clock ticks since boot, `/proc/<pid>/stat` field 22).
pub const S_START: usize = 3;
/// A label (32 bytes): the process's name or what it set.
pub const S_NAME: usize = 4;
/// Words of the label.
pub const NAME_WORDS: usize = 4;
/// Bytes held from the device.
pub const S_RESERVED: usize = 8;
/// Bytes in use.
pub const S_IN_USE: usize = 9;
/// Bytes cached: held, not in use, not asleep.
pub const S_CACHED: usize = 10;
/// Bytes asleep (handed back, addresses kept).
pub const S_ASLEEP: usize = 11;
/// Floor: the member is not asked below it.
pub const S_FLOOR: usize = 12;
/// Ceiling (`u64::MAX`: none).
pub const S_CEILING: usize = 13;
/// Bytes given to others so far.
pub const S_GIVEN: usize = 14;
/// Asks refused so far.
pub const S_REFUSED: usize = 15;
/// Request number of the asks below (0: none).
pub const S_REQUEST: usize = 16;
/// Bytes the request needs.
pub const S_REQUEST_BYTES: usize = 17;
/// Acks written so far (the ring's head).
pub const S_ACK_HEAD: usize = 18;
/// Tags the member declared reclaimable.
pub const S_TAGS: usize = 24;
/// Tags per slot.
pub const TAGS: usize = 8;
/// Words per tag: name (3 words, 24 bytes), bytes, flags, spare.
pub const TAG_WORDS: usize = 6;
/// Words of a tag's name.
pub const TAG_NAME_WORDS: usize = 3;
/// Asks of the member's current request.
pub const S_ASKS: usize = S_TAGS + TAGS * TAG_WORDS;
/// Asks per request.
pub const ASKS: usize = 8;
/// Words per ask: target owner word, what (kind | tag index << 8), bytes wanted, ask id.
pub const ASK_WORDS: usize = 4;
/// The member's answers to others' asks (a ring).
pub const S_ACKS: usize = S_ASKS + ASKS * ASK_WORDS;
/// Acks kept.
pub const ACKS: usize = 8;
/// Words per ack: requester owner word, ask id, bytes given, status.
pub const ACK_WORDS: usize = 4;

const _: () = assert!(S_ACKS + ACKS * ACK_WORDS <= SLOT_WORDS);
const _: () = assert!(L_TAG + TAG_NAME_WORDS <= LOG_WORDS);
const _: () = assert!(S_REQUEST_BYTES < S_ACK_HEAD && S_ACK_HEAD < S_TAGS);

// ---- tag flags ----
/// Declared reclaimable.
pub const TAG_RECLAIMABLE: u64 = 1;
/// A sleep keeps its contents.
pub const TAG_KEEP: u64 = 2;
/// Inside a `using` section: pinned, not to be slept.
pub const TAG_IN_USE: u64 = 4;
/// Asleep now.
pub const TAG_ASLEEP: u64 = 8;

// ---- ask kinds ----
/// Trim cached memory.
pub const ASK_TRIM: u64 = 1;
/// Sleep a tag.
pub const ASK_SLEEP: u64 = 2;

// ---- ack status ----
/// Done: the bytes word says what was given.
pub const ACK_DONE: u64 = 1;
/// Refused: the tag is in use.
pub const ACK_IN_USE: u64 = 2;
/// Refused: the member is at its floor.
pub const ACK_AT_FLOOR: u64 = 3;
/// Refused: the strategy cannot (no such tag, sleep unsupported, the call failed).
pub const ACK_CANNOT: u64 = 4;

// ---- hand-off log words ----
/// Sequence: 0 while written, else the entry's number + 1.
pub const L_SEQ: usize = 0;
/// Unix time, nanoseconds.
pub const L_TIME: usize = 1;
/// The donor's pid.
pub const L_DONOR: usize = 2;
/// The requester's pid.
pub const L_REQUESTER: usize = 3;
/// Bytes given.
pub const L_BYTES: usize = 4;
/// The ask kind.
pub const L_KIND: usize = 5;
/// The tag (24 bytes, a tag's whole name).
pub const L_TAG: usize = 6;

/// Index of slot `i`'s word `w`.
pub const fn slot_word(i: usize, w: usize) -> usize {
    SLOTS_START + i * SLOT_WORDS + w
}

/// Index of log entry `i`'s word `w`.
pub const fn log_word(i: usize, w: usize) -> usize {
    LOG_START + i * LOG_WORDS + w
}

/// What is wrong with a segment's header, or with what a slot says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutProblem {
    /// Not a budget segment, or one whose creator died before it was ready.
    Magic {
        /// The first word found.
        found: u64,
    },
    /// Another layout version.
    Version {
        /// The version found.
        found: u64,
    },
    /// The geometry word disagrees with this layout.
    Geometry {
        /// The word found.
        found: u64,
    },
    /// The segment is of another device.
    Key {
        /// The key found (cut, printable).
        found: String,
    },
}

impl std::fmt::Display for LayoutProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutProblem::Magic { found } => write!(
                f,
                "magic {found:#018x} is not a portalloc budget's {MAGIC:#018x} (another file, \
                 or its creator died before it was ready)"
            ),
            LayoutProblem::Version { found } => write!(
                f,
                "layout version {found}; this build reads version {VERSION} only"
            ),
            LayoutProblem::Geometry { found } => write!(
                f,
                "geometry {found:#x}; version {VERSION} has {GEOMETRY:#x}"
            ),
            LayoutProblem::Key { found } => {
                write!(f, "it belongs to device `{found}`, not this one")
            }
        }
    }
}

/// Checks a segment's header: magic, version, geometry and device key. Reads a bounded
/// number of words and allocates at most the key.
///
/// # Errors
/// The first [`LayoutProblem`] found.
///
/// # Panics
/// If `words` is shorter than the header (the caller maps [`TOTAL_WORDS`]).
pub fn check_header(words: &[AtomicU64], key: &str) -> Result<(), LayoutProblem> {
    let magic = words[H_MAGIC].load(Ordering::Acquire);
    if magic != MAGIC {
        return Err(LayoutProblem::Magic { found: magic });
    }
    let version = words[H_VERSION].load(Ordering::Relaxed);
    if version != VERSION {
        return Err(LayoutProblem::Version { found: version });
    }
    let geometry = words[H_GEOMETRY].load(Ordering::Relaxed);
    if geometry != GEOMETRY {
        return Err(LayoutProblem::Geometry { found: geometry });
    }
    let found = read_text(&words[H_KEY..H_KEY + KEY_WORDS]);
    if found != key_text(key) {
        return Err(LayoutProblem::Key { found });
    }
    Ok(())
}

/// Writes a fresh header (all other words zero): what the creator's `init` does. The magic
/// goes last, with release ordering.
pub fn init_header(words: &[AtomicU64], key: &str, device_total: u64) {
    words[H_VERSION].store(VERSION, Ordering::Relaxed);
    words[H_GEOMETRY].store(GEOMETRY, Ordering::Relaxed);
    words[H_DEVICE_TOTAL].store(device_total, Ordering::Relaxed);
    write_text(&words[H_KEY..H_KEY + KEY_WORDS], &key_text(key));
    words[H_MAGIC].store(MAGIC, Ordering::Release);
}

/// The key as stored: at most 64 bytes, cut on a character boundary.
pub fn key_text(key: &str) -> String {
    cut(key, KEY_WORDS * 8).to_string()
}

/// `s` cut to at most `bytes` bytes on a character boundary.
pub fn cut(s: &str, bytes: usize) -> &str {
    if s.len() <= bytes {
        return s;
    }
    let mut end = bytes;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Stores `text` (cut to the words' size) zero-padded into `words`.
pub fn write_text(words: &[AtomicU64], text: &str) {
    let text = cut(text, words.len() * 8).as_bytes();
    for (i, w) in words.iter().enumerate() {
        let mut b = [0u8; 8];
        for (j, byte) in b.iter_mut().enumerate() {
            if let Some(&c) = text.get(i * 8 + j) {
                *byte = c;
            }
        }
        w.store(u64::from_le_bytes(b), Ordering::Relaxed);
    }
}

/// Reads text written by [`write_text`] — or anything: bytes up to the first zero, invalid
/// UTF-8 and control characters replaced. Bounded by the words' size.
pub fn read_text(words: &[AtomicU64]) -> String {
    let mut bytes = Vec::with_capacity(words.len() * 8);
    for w in words {
        bytes.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end])
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

pub use crate::budget_report::TagEntry;

/// An ask as a slot says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AskEntry {
    /// The target's owner word.
    pub target: u64,
    /// [`ASK_TRIM`] or [`ASK_SLEEP`].
    pub kind: u64,
    /// For a sleep, the index of the tag in the target's slot.
    pub tag_index: usize,
    /// Bytes wanted.
    pub bytes: u64,
    /// The ask's id (unique per requester).
    pub id: u64,
}

/// An ack as a slot says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckEntry {
    /// The requester's owner word.
    pub requester: u64,
    /// The ask's id.
    pub id: u64,
    /// Bytes given.
    pub bytes: u64,
    /// One of the `ACK_*` statuses (anything else: unknown).
    pub status: u64,
}

/// One slot, read consistently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotView {
    /// Slot index.
    pub index: usize,
    /// Owner word.
    pub owner: u64,
    /// Pid.
    pub pid: u32,
    /// Start time (clock ticks since boot).
    pub start_time: u64,
    /// Label.
    pub name: String,
    /// Bytes held from the device.
    pub reserved: u64,
    /// Bytes in use.
    pub in_use: u64,
    /// Bytes cached.
    pub cached: u64,
    /// Bytes asleep.
    pub asleep: u64,
    /// Floor.
    pub floor: u64,
    /// Ceiling (`u64::MAX`: none).
    pub ceiling: u64,
    /// Bytes given to others.
    pub given: u64,
    /// Asks refused.
    pub refused: u64,
    /// Reclaimable tags.
    pub tags: Vec<TagEntry>,
    /// The current request's number (0: none) and bytes.
    pub request: (u64, u64),
    /// The current request's asks.
    pub asks: Vec<AskEntry>,
    /// The last answers to others.
    pub acks: Vec<AckEntry>,
}

impl SlotView {
    /// The member as a report shows it.
    pub fn report(&self) -> crate::budget_report::MemberReport {
        crate::budget_report::MemberReport {
            pid: self.pid,
            name: self.name.clone(),
            reserved: self.reserved,
            in_use: self.in_use,
            cached: self.cached,
            asleep: self.asleep,
            floor: self.floor,
            ceiling: (self.ceiling != u64::MAX).then_some(self.ceiling),
            given: self.given,
            refused: self.refused,
            tags: self.tags.clone(),
        }
    }
}

/// Why a slot could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRead {
    /// Free.
    Free,
    /// Its owner was writing every time we looked (alive and busy, or died mid-write).
    Torn,
    /// It holds values no writer of this layout writes (a pid of 0, a pid that disagrees
    /// with the owner word): corrupt.
    Corrupt,
}

/// Attempts at a consistent read before a slot counts as torn.
const READ_TRIES: usize = 64;

/// Reads slot `i` consistently (seqlock), bounded to 64 attempts.
///
/// # Errors
/// [`SlotRead`] says why there is nothing to read.
pub fn read_slot(words: &[AtomicU64], i: usize) -> Result<SlotView, SlotRead> {
    let w = |k: usize| &words[slot_word(i, k)];
    for _ in 0..READ_TRIES {
        let owner = w(S_OWNER).load(Ordering::Acquire);
        if owner == 0 || owner & CLAIMING != 0 {
            return Err(SlotRead::Free);
        }
        let seq = w(S_SEQ).load(Ordering::Acquire);
        if seq % 2 == 1 {
            std::hint::spin_loop();
            std::thread::yield_now();
            continue;
        }
        let pid = w(S_PID).load(Ordering::Relaxed);
        let start_time = w(S_START).load(Ordering::Relaxed);
        let name = read_text(&words[slot_word(i, S_NAME)..slot_word(i, S_NAME + NAME_WORDS)]);
        let mut tags = Vec::new();
        for t in 0..TAGS {
            let base = S_TAGS + t * TAG_WORDS;
            let flags = w(base + TAG_NAME_WORDS + 1).load(Ordering::Relaxed);
            if flags & TAG_RECLAIMABLE == 0 {
                continue;
            }
            tags.push(TagEntry {
                name: read_text(&words[slot_word(i, base)..slot_word(i, base + TAG_NAME_WORDS)]),
                bytes: w(base + TAG_NAME_WORDS).load(Ordering::Relaxed),
                reclaimable: true,
                keep: flags & TAG_KEEP != 0,
                in_use: flags & TAG_IN_USE != 0,
                asleep: flags & TAG_ASLEEP != 0,
            });
        }
        let request = (
            w(S_REQUEST).load(Ordering::Relaxed),
            w(S_REQUEST_BYTES).load(Ordering::Relaxed),
        );
        let mut asks = Vec::new();
        if request.0 != 0 {
            for a in 0..ASKS {
                let base = S_ASKS + a * ASK_WORDS;
                let target = w(base).load(Ordering::Relaxed);
                if target == 0 {
                    continue;
                }
                let what = w(base + 1).load(Ordering::Relaxed);
                asks.push(AskEntry {
                    target,
                    kind: what & 0xff,
                    tag_index: ((what >> 8) & 0xff) as usize,
                    bytes: w(base + 2).load(Ordering::Relaxed),
                    id: w(base + 3).load(Ordering::Relaxed),
                });
            }
        }
        // Acks are written outside the seqlock, each entry's id last: read each as it is.
        let mut acks = Vec::new();
        for a in 0..ACKS {
            let base = S_ACKS + a * ACK_WORDS;
            let id = w(base + 1).load(Ordering::Acquire);
            if id == 0 {
                continue;
            }
            acks.push(AckEntry {
                requester: w(base).load(Ordering::Relaxed),
                id,
                bytes: w(base + 2).load(Ordering::Relaxed),
                status: w(base + 3).load(Ordering::Relaxed),
            });
        }
        let view = SlotView {
            index: i,
            owner,
            pid: pid as u32,
            start_time,
            name,
            reserved: w(S_RESERVED).load(Ordering::Relaxed),
            in_use: w(S_IN_USE).load(Ordering::Relaxed),
            cached: w(S_CACHED).load(Ordering::Relaxed),
            asleep: w(S_ASLEEP).load(Ordering::Relaxed),
            floor: w(S_FLOOR).load(Ordering::Relaxed),
            ceiling: w(S_CEILING).load(Ordering::Relaxed),
            given: w(S_GIVEN).load(Ordering::Relaxed),
            refused: w(S_REFUSED).load(Ordering::Relaxed),
            tags,
            request,
            asks,
            acks,
        };
        if w(S_SEQ).load(Ordering::Acquire) != seq || w(S_OWNER).load(Ordering::Acquire) != owner {
            continue;
        }
        if pid == 0 || pid > u64::from(u32::MAX) || owner >> 32 != pid {
            return Err(SlotRead::Corrupt);
        }
        return Ok(view);
    }
    Err(SlotRead::Torn)
}

/// A hand-off as the log says it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandOff {
    /// Unix time, nanoseconds.
    pub time_ns: u64,
    /// Who gave.
    pub donor: u32,
    /// Who asked.
    pub requester: u32,
    /// Bytes given.
    pub bytes: u64,
    /// `trim` or `sleep`.
    pub kind: String,
    /// The tag slept (empty for a trim).
    pub tag: String,
}

/// The log's entries, oldest first; entries being written or corrupt are left out.
pub fn read_log(words: &[AtomicU64]) -> Vec<HandOff> {
    let head = words[H_LOG_HEAD].load(Ordering::Acquire);
    let first = head.saturating_sub(LOG_ENTRIES as u64);
    let mut out = Vec::new();
    for n in first..head {
        let i = (n % LOG_ENTRIES as u64) as usize;
        let seq = words[log_word(i, L_SEQ)].load(Ordering::Acquire);
        if seq != n + 1 {
            continue;
        }
        let kind = match words[log_word(i, L_KIND)].load(Ordering::Relaxed) {
            ASK_TRIM => "trim",
            ASK_SLEEP => "sleep",
            _ => continue,
        };
        let entry = HandOff {
            time_ns: words[log_word(i, L_TIME)].load(Ordering::Relaxed),
            donor: words[log_word(i, L_DONOR)].load(Ordering::Relaxed) as u32,
            requester: words[log_word(i, L_REQUESTER)].load(Ordering::Relaxed) as u32,
            bytes: words[log_word(i, L_BYTES)].load(Ordering::Relaxed),
            kind: kind.to_string(),
            tag: read_text(&words[log_word(i, L_TAG)..log_word(i, L_TAG + TAG_NAME_WORDS)]),
        };
        if words[log_word(i, L_SEQ)].load(Ordering::Acquire) == seq {
            out.push(entry);
        }
    }
    out
}

/// Appends a hand-off to the log (any member may: an entry is claimed by the head's
/// fetch-add, and its sequence word written last).
pub fn append_log(words: &[AtomicU64], entry: &HandOff) {
    let n = words[H_LOG_HEAD].fetch_add(1, Ordering::AcqRel);
    let i = (n % LOG_ENTRIES as u64) as usize;
    words[log_word(i, L_SEQ)].store(0, Ordering::Release);
    words[log_word(i, L_TIME)].store(entry.time_ns, Ordering::Relaxed);
    words[log_word(i, L_DONOR)].store(u64::from(entry.donor), Ordering::Relaxed);
    words[log_word(i, L_REQUESTER)].store(u64::from(entry.requester), Ordering::Relaxed);
    words[log_word(i, L_BYTES)].store(entry.bytes, Ordering::Relaxed);
    let kind = if entry.kind == "sleep" {
        ASK_SLEEP
    } else {
        ASK_TRIM
    };
    words[log_word(i, L_KIND)].store(kind, Ordering::Relaxed);
    write_text(
        &words[log_word(i, L_TAG)..log_word(i, L_TAG + TAG_NAME_WORDS)],
        &entry.tag,
    );
    words[log_word(i, L_SEQ)].store(n + 1, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zeroed() -> Vec<AtomicU64> {
        (0..TOTAL_WORDS).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn a_fresh_header_checks_and_another_key_does_not() {
        let w = zeroed();
        assert!(matches!(
            check_header(&w, "k"),
            Err(LayoutProblem::Magic { found: 0 })
        ));
        init_header(&w, "cuda:GPU-1234", 8 << 30);
        check_header(&w, "cuda:GPU-1234").unwrap();
        assert!(matches!(
            check_header(&w, "cuda:GPU-9"),
            Err(LayoutProblem::Key { .. })
        ));
        w[H_VERSION].store(2, Ordering::Relaxed);
        assert_eq!(
            check_header(&w, "cuda:GPU-1234"),
            Err(LayoutProblem::Version { found: 2 })
        );
    }

    #[test]
    fn text_round_trips_and_hostile_text_is_printable() {
        let w: Vec<AtomicU64> = (0..3).map(|_| AtomicU64::new(0)).collect();
        write_text(&w, "weights");
        assert_eq!(read_text(&w), "weights");
        write_text(&w, "é".repeat(20).as_str());
        assert_eq!(read_text(&w).chars().count(), 12); // 24 bytes, 2 per char
        w[0].store(
            u64::from_le_bytes([0x1b, b'[', b'2', b'J', 0xff, 0xfe, b'a', b'b']),
            Ordering::Relaxed,
        );
        let shown = read_text(&w);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
    }

    #[test]
    fn the_log_keeps_the_last_entries_in_order() {
        let w = zeroed();
        for n in 0..40u64 {
            append_log(
                &w,
                &HandOff {
                    time_ns: n,
                    donor: 1,
                    requester: 2,
                    bytes: n << 20,
                    kind: "trim".into(),
                    tag: String::new(),
                },
            );
        }
        let log = read_log(&w);
        assert_eq!(log.len(), LOG_ENTRIES);
        assert_eq!(log.first().unwrap().time_ns, 8);
        assert_eq!(log.last().unwrap().time_ns, 39);
    }
}
