//! The shared budget: several processes on one device, each publishing what it holds and what
//! it can give back, and asking the others before it reports out of memory.
//!
//! There is no daemon. Each physical device has a small segment of shared memory
//! (`/dev/shm/portalloc-budget-<device key>.<uid>`, or `PORTALLOC_SHARED_BUDGET_DIR` for
//! containers that share a volume and not `/dev/shm`), keyed by the device's identity (its UUID
//! on CUDA and HIP, the simulated device's name and size on the host). Every portalloc process
//! that uses the device joins it ([`SharedBudget::join`]): it claims a slot, publishes its
//! numbers (reserved, in use, cached, asleep), its floor and ceiling, and the tags it declared
//! reclaimable ([`SharedBudget::declare_reclaimable`]).
//!
//! **Reclaim instead of out-of-memory.** When a request fails, [`BudgetAllocator`] first trims
//! its own cache, then asks the others ([`SharedBudget::reclaim`]): memory they cache and can
//! trim first, then tags they declared reclaimable and are not [using](SharedBudget::using),
//! members above their floor only, largest first. Each donor acts in its own process — a service
//! thread asleep on the segment's doorbell (a futex), woken by the ask — with its own
//! allocator's `trim` and `sleep`, so a sleep is ordered after all work on the memory as every
//! sleep is. The requester waits for the answers up to a deadline, retries, and otherwise fails
//! with an out-of-memory report that names every member, what it holds, what it gave and what
//! it refused ([`BudgetReport`]).
//!
//! **Nothing lost when a process dies.** The segment has no lock: each slot is written by its
//! owner only (its structured part behind a sequence word), so a member killed at any point
//! leaves at worst a slot whose sequence is odd. A slot whose process is gone — the pid does not
//! exist, or exists with another start time (a reused pid) — is reaped by whoever notices, and
//! its numbers stop counting: the driver gave its memory back when it died. A requester waiting
//! on a dead donor stops waiting for it.
//!
//! **Untrusted.** Every other process can write anything in the segment. Every read is bounded
//! and checked ([`layout`]); a file that cannot be used — another user's, another layout
//! version, corrupt, truncated — is an [`Error::SharedSegment`] naming the file and what was
//! wrong; [`crate::Portalloc`] then runs alone with one warning.
#![deny(unsafe_code)]

pub mod layout;
pub mod limits;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

pub use crate::budget_report::{AskOutcome, BudgetReport, MemberReport, Refusal};
pub use layout::{HandOff, LayoutProblem, SlotView, TagEntry};

use crate::allocator::{Allocation, Allocator, Keep, SleepReport, SleepingTag, Stats};
use crate::backends::shared_segment::{Access, MappedSegment, MembershipLock};
use crate::device::Stream;
use crate::error::{Error, Result};
use layout::*;

/// `PORTALLOC_SHARED_BUDGET`: join the device's shared budget (`1`, default when the
/// configuration is read from the environment) or not (`0`).
pub const PORTALLOC_SHARED_BUDGET: &str = "PORTALLOC_SHARED_BUDGET";
/// `PORTALLOC_SHARED_BUDGET_DIR`: where the segments live (default `/dev/shm`).
pub const PORTALLOC_SHARED_BUDGET_DIR: &str = "PORTALLOC_SHARED_BUDGET_DIR";
/// `PORTALLOC_SHARED_BUDGET_GROUP`: a numeric group id whose members share the segment
/// (mode 0660); unset: this user only (0600).
pub const PORTALLOC_SHARED_BUDGET_GROUP: &str = "PORTALLOC_SHARED_BUDGET_GROUP";
/// `PORTALLOC_FLOOR`: this process is not asked to give memory below it (bytes or a fraction
/// of the device).
pub const PORTALLOC_FLOOR: &str = "PORTALLOC_FLOOR";
/// `PORTALLOC_CEILING`: this process holds at most this much (bytes or a fraction of the
/// device): the strategy's limit becomes the smaller of it and the memory fraction.
pub const PORTALLOC_CEILING: &str = "PORTALLOC_CEILING";
/// `PORTALLOC_RECLAIM_DEADLINE_MS`: how long a request waits for the others' answers.
pub const PORTALLOC_RECLAIM_DEADLINE_MS: &str = "PORTALLOC_RECLAIM_DEADLINE_MS";
/// `PORTALLOC_MEMBER_NAME`: the label `portalloc top` shows (default: the program's name).
pub const PORTALLOC_MEMBER_NAME: &str = "PORTALLOC_MEMBER_NAME";

/// Every variable the budget reads.
pub const VARIABLES: &[&str] = &[
    PORTALLOC_SHARED_BUDGET,
    PORTALLOC_SHARED_BUDGET_DIR,
    PORTALLOC_SHARED_BUDGET_GROUP,
    PORTALLOC_FLOOR,
    PORTALLOC_CEILING,
    PORTALLOC_RECLAIM_DEADLINE_MS,
    PORTALLOC_MEMBER_NAME,
];

/// An amount of device memory: bytes, or a fraction of the device's total.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Amount {
    /// Bytes.
    Bytes(u64),
    /// A fraction of the total, in (0, 1].
    Fraction(f64),
}

impl Amount {
    /// The bytes this is of a device of `total` bytes.
    pub fn of(self, total: u64) -> u64 {
        match self {
            Amount::Bytes(b) => b,
            Amount::Fraction(f) => (f * total as f64) as u64,
        }
    }

    /// Parses `0.5` (a fraction) or `6GiB` / `1024` (bytes).
    ///
    /// # Errors
    /// [`Error::Config`] naming `variable` and the accepted forms.
    pub fn parse(variable: &str, text: &str) -> Result<Amount> {
        let t = text.trim();
        let accepted = "a fraction of the device in (0, 1] such as 0.4, or a size such as \
                        6GiB or 1073741824";
        if t.contains('.') && !t.chars().any(|c| c.is_ascii_alphabetic()) {
            return match t.parse::<f64>() {
                Ok(f) if f > 0.0 && f <= 1.0 => Ok(Amount::Fraction(f)),
                _ => Err(Error::config(variable, text, accepted)),
            };
        }
        crate::units::parse_bytes(t)
            .map(Amount::Bytes)
            .ok_or_else(|| Error::config(variable, text, accepted))
    }
}

/// How a process joins its devices' budgets.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BudgetOptions {
    /// Where the segments live.
    pub dir: PathBuf,
    /// The group that shares them (`None`: this user only).
    pub group: Option<u32>,
    /// Not asked below this.
    pub floor: Option<Amount>,
    /// Holds at most this.
    pub ceiling: Option<Amount>,
    /// How long a request waits for the others.
    pub deadline: Duration,
    /// The label others see.
    pub name: String,
    /// Whether the host backend's devices join too (only when asked: a host device is no
    /// physical device that other processes share unless their settings say it is the same).
    pub include_host: bool,
}

impl Default for BudgetOptions {
    fn default() -> Self {
        BudgetOptions {
            dir: PathBuf::from("/dev/shm"),
            group: None,
            floor: None,
            ceiling: None,
            deadline: Duration::from_secs(5),
            name: program_name(),
            include_host: true,
        }
    }
}

fn program_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|a| {
            Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "portalloc".into())
}

impl BudgetOptions {
    /// Whether to join, and how, from variables looked up with `get` (`None`: unset).
    /// `default_on`: whether unset `PORTALLOC_SHARED_BUDGET` means join.
    ///
    /// # Errors
    /// [`Error::Config`] for a value that cannot be used.
    pub fn from_vars(
        get: &dyn Fn(&str) -> Option<String>,
        default_on: bool,
    ) -> Result<Option<BudgetOptions>> {
        let explicit = get(PORTALLOC_SHARED_BUDGET);
        let on = match &explicit {
            None => default_on,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "on" | "yes" => true,
                "0" | "false" | "off" | "no" => false,
                _ => return Err(Error::config(
                    PORTALLOC_SHARED_BUDGET,
                    v.as_str(),
                    "1/true/on/yes to join the device's shared budget, 0/false/off/no to run alone",
                )),
            },
        };
        if !on {
            return Ok(None);
        }
        let mut o = BudgetOptions {
            include_host: explicit.is_some(),
            ..BudgetOptions::default()
        };
        if let Some(d) = get(PORTALLOC_SHARED_BUDGET_DIR) {
            if d.is_empty() || d.chars().any(char::is_control) {
                return Err(Error::config(
                    PORTALLOC_SHARED_BUDGET_DIR,
                    d,
                    "a directory path without control characters",
                ));
            }
            o.dir = PathBuf::from(d);
        }
        if let Some(g) = get(PORTALLOC_SHARED_BUDGET_GROUP) {
            o.group = Some(g.trim().parse().map_err(|_| {
                Error::config(PORTALLOC_SHARED_BUDGET_GROUP, &g, "a numeric group id")
            })?);
        }
        if let Some(f) = get(PORTALLOC_FLOOR) {
            o.floor = Some(Amount::parse(PORTALLOC_FLOOR, &f)?);
        }
        if let Some(c) = get(PORTALLOC_CEILING) {
            o.ceiling = Some(Amount::parse(PORTALLOC_CEILING, &c)?);
        }
        if let Some(d) = get(PORTALLOC_RECLAIM_DEADLINE_MS) {
            let ms: u64 = d
                .trim()
                .parse()
                .ok()
                .filter(|&ms| ms <= 3_600_000)
                .ok_or_else(|| {
                    Error::config(
                        PORTALLOC_RECLAIM_DEADLINE_MS,
                        &d,
                        "milliseconds from 0 to 3600000",
                    )
                })?;
            o.deadline = Duration::from_millis(ms);
        }
        if let Some(n) = get(PORTALLOC_MEMBER_NAME) {
            o.name = n;
        }
        Ok(Some(o))
    }

    /// [`BudgetOptions::from_vars`] over the process environment.
    ///
    /// # Errors
    /// As [`BudgetOptions::from_vars`].
    pub fn from_env(default_on: bool) -> Result<Option<BudgetOptions>> {
        BudgetOptions::from_vars(&|k| std::env::var(k).ok(), default_on)
    }
}

/// The segment file of device `key` in `dir`, for user `uid`: the key with every character
/// other than letters, digits, `-`, `_` and `.` replaced by `_`.
pub fn segment_path(dir: &Path, key: &str, uid: u32) -> PathBuf {
    let safe: String = layout::key_text(key)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("portalloc-budget-{safe}.{uid}"))
}

/// A 16-byte UUID as `nvidia-smi` and `rocm-smi` write it: `prefix` then
/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` in lower-case hex.
///
/// ```
/// let raw = [0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8];
/// assert_eq!(
///     portalloc::budget::uuid_text("GPU-", &raw),
///     "GPU-12345678-9abc-def0-0102-030405060708"
/// );
/// ```
pub fn uuid_text(prefix: &str, raw: &[u8; 16]) -> String {
    let hex: Vec<String> = raw.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// The key of the device `info` describes in the shared budget: its UUID where the backend
/// reports one (the same physical device under any `CUDA_VISIBLE_DEVICES`), else the vendor,
/// ordinal, name and size (the host backend's simulated device).
pub fn device_key(info: &crate::DeviceInfo) -> String {
    match info.notes.iter().find(|(k, _)| k == "uuid") {
        Some((_, uuid)) => format!("{}-{uuid}", info.vendor),
        None => format!(
            "{}-{}-{}-{}",
            info.vendor, info.ordinal, info.name, info.total_bytes
        ),
    }
}

/// Says once per process, on standard error and through `tracing`, that a budget could not be
/// joined and this process runs alone.
pub fn warn_once(error: &Error) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::AcqRel) {
        let message = format!("portalloc: running alone, without the shared budget: {error}");
        tracing::warn!("{message}");
        eprintln!("{message}");
    }
}

/// This process's effective user id.
pub fn current_uid() -> u32 {
    crate::backends::shared_segment::effective_uid()
}

/// The start time of process `pid` (clock ticks since boot, `/proc/<pid>/stat` field 22), or
/// `None` where it cannot be read (no such process, not Linux).
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) is in parentheses and may hold anything: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process a slot names is alive: its pid exists with the start time the slot
/// recorded (a slot still being written, whose recorded pid is not the owner's yet, counts as
/// alive).
fn alive(owner: u64, recorded_pid: u64, recorded_start: u64) -> bool {
    let pid = (owner >> 32) as u32;
    if pid == 0 {
        return false;
    }
    if owner & CLAIMING != 0 {
        // Being claimed: the slot's pid and start time are the previous owner's still.
        return crate::backends::shared_segment::pid_exists(pid);
    }
    let Some(start) = process_start_time(pid) else {
        return crate::backends::shared_segment::pid_exists(pid);
    };
    recorded_pid != u64::from(pid) || recorded_start == 0 || recorded_start == start
}

/// A tag this process declared reclaimable.
#[derive(Debug, Clone)]
struct LocalTag {
    name: String,
    keep: Keep,
    using: u32,
    bytes: u64,
    asleep: bool,
}

/// What the budget knows of this process, behind one lock.
#[derive(Default)]
struct Local {
    tags: Vec<LocalTag>,
    allocators: Vec<Weak<dyn Allocator>>,
    answered: VecDeque<(u64, u64)>,
    request: u64,
}

/// The state the service thread shares with the handle.
struct Core {
    key: String,
    total: u64,
    segment: MappedSegment,
    slot: usize,
    owner: u64,
    pid: u32,
    floor: u64,
    ceiling: u64,
    deadline: Duration,
    /// Who may open the segment besides its owner (the group, if one shares it).
    access: Access,
    local: Mutex<Local>,
    /// Serialises this process's writers of its slot's structured part (the seqlock's writer).
    writer: Mutex<()>,
    /// Held by a `using` entry while it pins and wakes, and by a sleep asked for while it
    /// checks the pin and sleeps: a tag is never slept under a section that just entered.
    gate: Mutex<()>,
    stop: AtomicBool,
    /// False once the slot was found taken by someone else (reaped while we were stopped, or
    /// a forked child): the process then runs alone.
    joined: AtomicBool,
}

/// One device's shared budget, as this process is a member of it. Dropping the last handle
/// leaves the budget (the slot is freed, the service thread stopped).
pub struct SharedBudget {
    core: Arc<Core>,
    service: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for SharedBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBudget")
            .field("key", &self.core.key)
            .field("path", &self.core.segment.path())
            .field("slot", &self.core.slot)
            .finish()
    }
}

/// The budgets this process joined, by device key: one membership per device per process,
/// whatever number of allocators it makes.
static JOINED: Mutex<Vec<(PathBuf, Weak<SharedBudget>)>> = Mutex::new(Vec::new());

/// How long joining or leaving waits for the membership lock.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// How long a joiner waits for a segment's creator to write its header.
const READY_WAIT: Duration = Duration::from_millis(500);
/// Ceiling on a single futex wait: how soon a waiter notices a dead peer or its own stop.
const WAIT_SLICE: Duration = Duration::from_millis(50);

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl SharedBudget {
    /// Joins the budget of the device `key` (of `total` bytes), or returns this process's
    /// membership if it joined already.
    ///
    /// # Errors
    /// [`Error::SharedSegment`] for a segment that cannot be used (naming the file and what was
    /// wrong), or when all [`layout::SLOTS`] slots are held by live processes.
    pub fn join(key: &str, total: u64, options: &BudgetOptions) -> Result<Arc<SharedBudget>> {
        let path = segment_path(&options.dir, key, current_uid());
        let mut joined = JOINED.lock().unwrap_or_else(PoisonError::into_inner);
        // A forked child's copies of its parent's memberships are not its own.
        let pid = crate::backends::shared_segment::current_pid();
        joined.retain(|(_, w)| w.upgrade().is_some_and(|b| b.core.pid == pid));
        if let Some(b) = joined
            .iter()
            .find(|(p, _)| *p == path)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(b);
        }
        remove_abandoned(&options.dir, &path);
        // Joining and leaving hold the segment's membership lock (a `flock` the kernel
        // releases when its holder dies): the last member to leave removes the files under
        // it, so no joiner is ever left in a removed file.
        let access = Access {
            group: options.group,
        };
        let lock = MembershipLock::acquire(&path, access, LOCK_WAIT)
            .map_err(|p| Error::SharedSegment {
                path: path.display().to_string(),
                reason: p.to_string(),
            })?
            .ok_or_else(|| Error::SharedSegment {
                path: path.display().to_string(),
                reason: format!(
                    "another process held its membership lock for more than {} ms (stopped or \
                     hung while joining or leaving)",
                    LOCK_WAIT.as_millis()
                ),
            })?;
        let budget = Arc::new(SharedBudget::open(key, total, options, true)?);
        drop(lock);
        joined.push((path, Arc::downgrade(&budget)));
        Ok(budget)
    }

    /// This process's membership of the budget whose segment is `path` ([`segment_path`]),
    /// if it joined it.
    pub fn joined(path: &Path) -> Option<Arc<SharedBudget>> {
        JOINED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(p, _)| p == path)
            .and_then(|(_, w)| w.upgrade())
    }

    /// Opens (or creates) the segment and claims a slot, under the membership lock.
    fn open(
        key: &str,
        total: u64,
        options: &BudgetOptions,
        fresh_try: bool,
    ) -> Result<SharedBudget> {
        let path = segment_path(&options.dir, key, current_uid());
        let problem = |reason: String| Error::SharedSegment {
            path: path.display().to_string(),
            reason,
        };
        let segment = match MappedSegment::open(
            &path,
            TOTAL_WORDS,
            Access {
                group: options.group,
            },
            &|w| init_header(w, key, total),
        ) {
            Ok(s) => s,
            // Still 0 bytes after the wait: its creator died between its create and its
            // `ftruncate`. Remove it (if it is still that empty file) and make a fresh one.
            // (Under the lock no live creator is between the two.)
            Err(crate::backends::shared_segment::MapProblem::Size { found: 0, .. })
                if fresh_try =>
            {
                let _ = std::fs::remove_file(&path);
                return SharedBudget::open(key, total, options, false);
            }
            Err(p) => return Err(problem(p.to_string())),
        };
        let words = segment.words();
        let started = Instant::now();
        loop {
            match check_header(words, key) {
                Ok(()) => break,
                // A creator between `ftruncate` and its magic: wait for it, briefly.
                Err(LayoutProblem::Magic { found: 0 }) if started.elapsed() < READY_WAIT => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                // Its creator died before writing the header, and nobody is in it: remove it
                // and make a fresh one (once).
                Err(LayoutProblem::Magic { found: 0 })
                    if fresh_try
                        && (0..SLOTS)
                            .all(|i| words[slot_word(i, S_OWNER)].load(Ordering::Acquire) == 0) =>
                {
                    segment.unlink();
                    drop(segment);
                    return SharedBudget::open(key, total, options, false);
                }
                Err(p) => return Err(problem(p.to_string())),
            }
        }
        reap(words);
        let pid = std::process::id();
        let start = process_start_time(pid).unwrap_or(0);
        let claim = words[H_CLAIMS]
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1)
            & 0xffff_ffff;
        let owner = u64::from(pid) << 32 | claim.max(1);
        let slot = (0..SLOTS)
            .find(|&i| {
                words[slot_word(i, S_OWNER)]
                    .compare_exchange(0, owner | CLAIMING, Ordering::SeqCst, Ordering::Acquire)
                    .is_ok()
            })
            .ok_or_else(|| {
                problem(format!(
                    "all {SLOTS} member slots are held by live processes; this process runs alone"
                ))
            })?;
        let floor = options.floor.map_or(0, |a| a.of(total));
        let ceiling = options.ceiling.map_or(u64::MAX, |a| a.of(total));
        let core = Arc::new(Core {
            key: key.to_string(),
            total,
            segment,
            slot,
            owner,
            pid,
            floor,
            ceiling,
            deadline: options.deadline,
            access: Access {
                group: options.group,
            },
            local: Mutex::new(Local::default()),
            writer: Mutex::new(()),
            gate: Mutex::new(()),
            stop: AtomicBool::new(false),
            joined: AtomicBool::new(true),
        });
        core.write_structured(|w| {
            w(S_PID).store(u64::from(pid), Ordering::Relaxed);
            w(S_START).store(start, Ordering::Relaxed);
            for k in [
                S_RESERVED,
                S_IN_USE,
                S_CACHED,
                S_ASLEEP,
                S_GIVEN,
                S_REFUSED,
                S_REQUEST,
                S_REQUEST_BYTES,
                S_ACK_HEAD,
            ] {
                w(k).store(0, Ordering::Relaxed);
            }
            w(S_FLOOR).store(floor, Ordering::Relaxed);
            w(S_CEILING).store(ceiling, Ordering::Relaxed);
            for k in S_TAGS..SLOT_WORDS {
                w(k).store(0, Ordering::Relaxed);
            }
        });
        write_text(
            &core.segment.words()[slot_word(slot, S_NAME)..slot_word(slot, S_NAME + NAME_WORDS)],
            &options.name,
        );
        // Identity written: the slot is a member's now.
        core.word(S_OWNER).store(owner, Ordering::Release);
        let thread_core = Arc::clone(&core);
        let service = std::thread::Builder::new()
            .name("portalloc-budget".into())
            .spawn(move || thread_core.serve_forever())
            .map_err(|e| problem(format!("cannot start the service thread: {e}")))?;
        core.ring();
        Ok(SharedBudget {
            core,
            service: Mutex::new(Some(service)),
        })
    }

    /// The device key.
    pub fn key(&self) -> &str {
        &self.core.key
    }

    /// The segment's file.
    pub fn path(&self) -> &Path {
        self.core.segment.path()
    }

    /// The device's total bytes.
    pub fn total(&self) -> u64 {
        self.core.total
    }

    /// This process's floor and ceiling in bytes (`u64::MAX`: no ceiling).
    pub fn limits(&self) -> (u64, u64) {
        (self.core.floor, self.core.ceiling)
    }

    /// Registers an allocator whose memory this membership publishes, trims and sleeps when
    /// asked. Held weakly: a dropped allocator drops out.
    pub fn register(&self, allocator: &Arc<dyn Allocator>) {
        self.core
            .locked()
            .allocators
            .push(Arc::downgrade(allocator));
        self.core.publish_numbers();
    }

    /// Declares `tag` reclaimable: while no [`SharedBudget::using`] section holds it, another
    /// member may ask this process to sleep it (`keep`: with its contents, woken at the same
    /// addresses with its bytes; or without). At most [`layout::TAGS`] tags.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty tag, one longer than 24 bytes, or a ninth tag.
    pub fn declare_reclaimable(&self, tag: &str, keep: Keep) -> Result<()> {
        if tag.is_empty() || tag.len() > TAG_NAME_WORDS * 8 || tag.chars().any(char::is_control) {
            return Err(Error::InvalidArgument {
                call: "declare_reclaimable",
                reason: format!(
                    "tag {tag:?}: accepted is a name of 1 to {} bytes without control characters",
                    TAG_NAME_WORDS * 8
                ),
            });
        }
        crate::sleep_tags::declare_sleepable(tag);
        {
            let mut local = self.core.locked();
            if let Some(t) = local.tags.iter_mut().find(|t| t.name == tag) {
                t.keep = keep;
            } else if local.tags.len() >= TAGS {
                return Err(Error::InvalidArgument {
                    call: "declare_reclaimable",
                    reason: format!("tag {tag:?}: a process declares at most {TAGS} tags"),
                });
            } else {
                local.tags.push(LocalTag {
                    name: tag.to_string(),
                    keep,
                    using: 0,
                    bytes: 0,
                    asleep: false,
                });
            }
        }
        self.core.publish_tags();
        Ok(())
    }

    /// Enters a section that uses `tag`: until the guard drops, the tag is awake and no other
    /// member can have it slept. A tag asleep (given to another process) is woken first, at
    /// its addresses, with its bytes if it was declared with them; a wake that finds no memory
    /// asks the others as a request does.
    ///
    /// # Errors
    /// The wake's error, after asking the others, with the tag still asleep (nothing lost).
    pub fn using(self: &Arc<Self>, tag: &str) -> Result<UsingGuard> {
        let _gate = self
            .core
            .gate
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        {
            let mut local = self.core.locked();
            if let Some(t) = local.tags.iter_mut().find(|t| t.name == tag) {
                t.using += 1;
            }
        }
        self.core.publish_tags();
        let guard = UsingGuard {
            budget: Arc::clone(self),
            tag: tag.to_string(),
        };
        self.core.wake_tag(tag)?;
        Ok(guard)
    }

    /// Asks the other members for `bytes` (see the module), waiting up to the deadline for
    /// their answers. Returns what each ask got.
    pub fn reclaim(&self, bytes: u64) -> Vec<AskOutcome> {
        self.core.reclaim(bytes)
    }

    /// Every live member, read from the segment (dead ones are reaped on the way).
    pub fn members(&self) -> Vec<SlotView> {
        members(self.core.segment.words())
    }

    /// The last hand-offs.
    pub fn hand_offs(&self) -> Vec<HandOff> {
        read_log(self.core.segment.words())
    }

    /// Publishes this process's numbers now (the allocators' stats).
    pub fn publish(&self) {
        self.core.publish_numbers();
    }

    /// The report of a request this process could not serve.
    pub fn report(&self, requested: u64, asked: Vec<AskOutcome>) -> BudgetReport {
        self.core.publish_numbers();
        BudgetReport::new(
            &self.core.key,
            self.core.total,
            self.core.pid,
            requested,
            members(self.core.segment.words())
                .iter()
                .map(SlotView::report)
                .collect(),
            asked,
        )
    }
}

impl Drop for SharedBudget {
    fn drop(&mut self) {
        // A forked child holds a copy of its parent's membership: no service thread, and a
        // slot that is the parent's. It leaves everything as it is.
        if crate::backends::shared_segment::current_pid() != self.core.pid {
            self.core.joined.store(false, Ordering::Release);
            return;
        }
        self.core.stop.store(true, Ordering::Release);
        self.core.ring();
        if let Some(h) = self
            .service
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = h.join();
        }
        // Leave under the membership lock: free the slot if it is still ours; the last member
        // removes the segment and the lock file. Without the lock (a holder that does not let
        // go), the slot is freed and the files are left for a later joiner to remove.
        let path = self.core.segment.path().to_path_buf();
        let lock = MembershipLock::acquire(&path, self.core.access, LOCK_WAIT)
            .ok()
            .flatten();
        let words = self.core.segment.words();
        let _ = words[slot_word(self.core.slot, S_OWNER)].compare_exchange(
            self.core.owner,
            0,
            Ordering::SeqCst,
            Ordering::Acquire,
        );
        if let Some(lock) = &lock {
            reap(words);
            if no_owner(words) {
                self.core.segment.unlink();
                lock.remove_file();
            }
        }
        drop(lock);
        self.core.ring();
    }
}

/// A section using a reclaimable tag ([`SharedBudget::using`]); the tag may be slept for
/// another process again once every guard of it dropped.
#[derive(Debug)]
pub struct UsingGuard {
    budget: Arc<SharedBudget>,
    tag: String,
}

impl Drop for UsingGuard {
    fn drop(&mut self) {
        {
            let mut local = self.budget.core.locked();
            if let Some(t) = local.tags.iter_mut().find(|t| t.name == self.tag) {
                t.using = t.using.saturating_sub(1);
            }
        }
        self.budget.core.publish_tags();
    }
}

/// A budget's segment opened to look at, not to join: what `portalloc top` shows.
#[derive(Debug)]
pub struct Inspector {
    segment: MappedSegment,
    key: String,
}

/// What an [`Inspector`] sees at one moment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Snapshot {
    /// The segment's file.
    pub path: String,
    /// The device key.
    pub device: String,
    /// The device's total bytes.
    pub total: u64,
    /// The live members (dead ones left out, not reaped).
    pub members: Vec<MemberReport>,
    /// The last hand-offs, oldest first.
    pub hand_offs: Vec<HandOff>,
}

impl Inspector {
    /// Opens the segment at `path` (the key is read from it, then checked as a joiner does).
    ///
    /// # Errors
    /// [`Error::SharedSegment`] naming the file and what was wrong.
    pub fn open(path: &Path) -> Result<Inspector> {
        let problem = |reason: String| Error::SharedSegment {
            path: path.display().to_string(),
            reason,
        };
        let segment = MappedSegment::open_existing(path, TOTAL_WORDS, Access::default())
            .map_err(|p| problem(p.to_string()))?;
        let words = segment.words();
        let key = read_text(&words[H_KEY..H_KEY + KEY_WORDS]);
        check_header(words, &key).map_err(|p| problem(p.to_string()))?;
        Ok(Inspector { segment, key })
    }

    /// Every segment file in `dir` for this user (`portalloc-budget-*.<uid>`).
    pub fn find(dir: &Path) -> Vec<PathBuf> {
        let suffix = format!(".{}", current_uid());
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("portalloc-budget-") && n.ends_with(&suffix))
            })
            .collect();
        found.sort();
        found
    }

    /// The segment now.
    pub fn snapshot(&self) -> Snapshot {
        let words = self.segment.words();
        Snapshot {
            path: self.segment.path().display().to_string(),
            device: self.key.clone(),
            total: words[H_DEVICE_TOTAL].load(Ordering::Relaxed),
            members: (0..SLOTS)
                .filter_map(|i| read_slot(words, i).ok())
                .filter(|v| alive(v.owner, u64::from(v.pid), v.start_time))
                .map(|v| v.report())
                .collect(),
            hand_offs: read_log(words),
        }
    }
}

/// Files older than this with no live member are left by processes that exited without
/// leaving (killed, or a process-global allocator never dropped): a joiner removes them.
const ABANDONED_AFTER: Duration = Duration::from_secs(30);
/// At most this many files looked at per join.
const ABANDONED_SCAN: usize = 64;

/// Removes this user's budget files in `dir` (other than `keep`) that no live process is a
/// member of and that are older than [`ABANDONED_AFTER`]: a device that no process uses any
/// more (a fake device of a test process that is gone, a GPU taken out) leaves no file behind
/// for long. Files that fail the checks are left for `portalloc top` to show.
fn remove_abandoned(dir: &Path, keep: &Path) {
    for path in Inspector::find(dir).into_iter().take(ABANDONED_SCAN) {
        if path == keep {
            continue;
        }
        let old = std::fs::symlink_metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= ABANDONED_AFTER);
        if !old {
            continue;
        }
        // Under its membership lock, not waited for: a file someone is joining or leaving is
        // not abandoned.
        let Ok(Some(lock)) = MembershipLock::acquire(&path, Access::default(), Duration::ZERO)
        else {
            continue;
        };
        let Ok(inspector) = Inspector::open(&path) else {
            continue;
        };
        let words = inspector.segment.words();
        reap(words);
        if no_owner(words) {
            inspector.segment.unlink();
            lock.remove_file();
        }
    }
}

/// Whether no slot has an owner (dead ones reaped before): the segment has no member, and
/// none is joining.
fn no_owner(words: &[AtomicU64]) -> bool {
    (0..SLOTS).all(|i| words[slot_word(i, S_OWNER)].load(Ordering::SeqCst) == 0)
}

/// Every live member of the segment `words`; slots of dead processes are reaped.
pub fn members(words: &[AtomicU64]) -> Vec<SlotView> {
    reap(words);
    (0..SLOTS)
        .filter_map(|i| read_slot(words, i).ok())
        .filter(|v| alive(v.owner, u64::from(v.pid), v.start_time))
        .collect()
}

/// Frees the slots whose process is gone (or which are corrupt and whose owner is gone).
/// Returns how many.
pub fn reap(words: &[AtomicU64]) -> usize {
    let mut reaped = 0;
    for i in 0..SLOTS {
        let owner = words[slot_word(i, S_OWNER)].load(Ordering::Acquire);
        if owner == 0 {
            continue;
        }
        let pid = words[slot_word(i, S_PID)].load(Ordering::Relaxed);
        let start = words[slot_word(i, S_START)].load(Ordering::Relaxed);
        if !alive(owner, pid, start)
            && words[slot_word(i, S_OWNER)]
                .compare_exchange(owner, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            reaped += 1;
        }
    }
    reaped
}

impl Core {
    fn locked(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn word(&self, k: usize) -> &AtomicU64 {
        &self.segment.words()[slot_word(self.slot, k)]
    }

    fn still_ours(&self) -> bool {
        if !self.joined.load(Ordering::Acquire) {
            return false;
        }
        if self.word(S_OWNER).load(Ordering::Acquire) != self.owner
            || crate::backends::shared_segment::current_pid() != self.pid
        {
            self.joined.store(false, Ordering::Release);
            return false;
        }
        true
    }

    /// Writes the slot's structured part under its sequence word.
    fn write_structured<'s>(&'s self, f: impl FnOnce(&dyn Fn(usize) -> &'s AtomicU64)) {
        let _w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = self.word(S_SEQ);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s | 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        f(&|k| self.word(k));
        seq.store((s | 1).wrapping_add(1), Ordering::Release);
    }

    fn ring(&self) {
        let bell = self.segment.futex_word(H_DOORBELL);
        bell.fetch_add(1, Ordering::AcqRel);
        self.segment.wake(bell);
    }

    fn live_allocators(&self) -> Vec<Arc<dyn Allocator>> {
        let mut local = self.locked();
        local.allocators.retain(|w| w.strong_count() > 0);
        local.allocators.iter().filter_map(Weak::upgrade).collect()
    }

    fn publish_numbers(&self) {
        if !self.still_ours() {
            return;
        }
        let (mut reserved, mut in_use, mut asleep) = (0u64, 0u64, 0u64);
        for a in self.live_allocators() {
            let s = a.stats();
            reserved += s.pool_bytes;
            in_use += s.bytes_in_use;
            asleep += s.bytes_asleep;
        }
        self.word(S_RESERVED).store(reserved, Ordering::Relaxed);
        self.word(S_IN_USE).store(in_use, Ordering::Relaxed);
        self.word(S_CACHED)
            .store(reserved.saturating_sub(in_use), Ordering::Relaxed);
        self.word(S_ASLEEP).store(asleep, Ordering::Relaxed);
    }

    /// The hot path's publish: `in_use` moved by `delta`, reserved read from the one
    /// allocator's `pool_bytes` (with several allocators registered, the full publish).
    fn publish_fast(&self, allocator: &dyn Allocator, delta: i64) {
        if self.locked().allocators.len() != 1 {
            self.publish_numbers();
            return;
        }
        if self.word(S_OWNER).load(Ordering::Relaxed) != self.owner
            || crate::backends::shared_segment::current_pid() != self.pid
        {
            return;
        }
        let in_use = if delta >= 0 {
            self.word(S_IN_USE)
                .fetch_add(delta as u64, Ordering::Relaxed)
                .saturating_add(delta as u64)
        } else {
            let d = delta.unsigned_abs();
            let before = self
                .word(S_IN_USE)
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(d))
                })
                .unwrap_or(0);
            before.saturating_sub(d)
        };
        let reserved = allocator.pool_bytes();
        self.word(S_RESERVED).store(reserved, Ordering::Relaxed);
        self.word(S_CACHED)
            .store(reserved.saturating_sub(in_use), Ordering::Relaxed);
    }

    fn publish_tags(&self) {
        if !self.still_ours() {
            return;
        }
        let tags = self.locked().tags.clone();
        self.write_structured(|w| {
            for t in 0..TAGS {
                let base = S_TAGS + t * TAG_WORDS;
                let Some(tag) = tags.get(t) else {
                    w(base + TAG_NAME_WORDS + 1).store(0, Ordering::Relaxed);
                    continue;
                };
                let name: Vec<&AtomicU64> = (0..TAG_NAME_WORDS).map(|k| w(base + k)).collect();
                let bytes = cut(&tag.name, TAG_NAME_WORDS * 8).as_bytes();
                for (i, word) in name.iter().enumerate() {
                    let mut b = [0u8; 8];
                    for (j, byte) in b.iter_mut().enumerate() {
                        *byte = bytes.get(i * 8 + j).copied().unwrap_or(0);
                    }
                    word.store(u64::from_le_bytes(b), Ordering::Relaxed);
                }
                w(base + TAG_NAME_WORDS).store(tag.bytes, Ordering::Relaxed);
                let mut flags = TAG_RECLAIMABLE;
                if tag.keep == Keep::Contents {
                    flags |= TAG_KEEP;
                }
                if tag.using > 0 {
                    flags |= TAG_IN_USE;
                }
                if tag.asleep {
                    flags |= TAG_ASLEEP;
                }
                w(base + TAG_NAME_WORDS + 1).store(flags, Ordering::Relaxed);
            }
        });
    }

    /// Adds `delta` (signed) to the bytes of a declared tag.
    fn tag_bytes(&self, tag: &str, delta: i64) {
        let changed = {
            let mut local = self.locked();
            match local.tags.iter_mut().find(|t| t.name == tag) {
                Some(t) => {
                    t.bytes = t.bytes.saturating_add_signed(delta);
                    true
                }
                None => false,
            }
        };
        if changed {
            self.publish_tags();
        }
    }

    fn is_reclaimable(&self, tag: &str) -> bool {
        !tag.is_empty() && self.locked().tags.iter().any(|t| t.name == tag)
    }

    fn wake_tag(&self, tag: &str) -> Result<()> {
        // The allocators say what sleeps, not the flag: a sleep that reported no bytes still
        // put the tag to sleep.
        for a in self.live_allocators() {
            if !a.sleeping().iter().any(|s: &SleepingTag| s.tag == tag) {
                continue;
            }
            let need = a
                .sleeping()
                .iter()
                .find(|s| s.tag == tag)
                .map_or(0, |s| s.bytes_asleep);
            let woke = match a.wake(tag) {
                Err(e) if e.is_out_of_memory() => {
                    let _ = a.trim();
                    self.reclaim(need);
                    a.wake(tag)
                }
                other => other,
            };
            woke?;
        }
        if let Some(t) = self.locked().tags.iter_mut().find(|t| t.name == tag) {
            t.asleep = false;
        }
        self.publish_tags();
        self.publish_numbers();
        Ok(())
    }

    fn serve_forever(&self) {
        let bell = self.segment.futex_word(H_DOORBELL);
        while !self.stop.load(Ordering::Acquire) {
            let seen = bell.load(Ordering::Acquire);
            if self.still_ours() {
                self.serve();
            }
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            // Woken by an ask, an answer, a join or a leave; the timeout is a safety net.
            self.segment.wait(bell, seen, Duration::from_secs(1));
        }
    }

    /// Answers every ask addressed to this process that it has not answered yet.
    fn serve(&self) {
        let words = self.segment.words();
        for i in 0..SLOTS {
            if i == self.slot {
                continue;
            }
            let Ok(view) = read_slot(words, i) else {
                continue;
            };
            for ask in view.asks.iter().filter(|a| a.target == self.owner) {
                let key = (view.owner, ask.id);
                {
                    let mut local = self.locked();
                    if local.answered.contains(&key) {
                        continue;
                    }
                    local.answered.push_back(key);
                    if local.answered.len() > 256 {
                        local.answered.pop_front();
                    }
                }
                let (bytes, status, tag) = self.act(ask);
                // The log first, then the answer: a requester that reads the log after its
                // answer finds the hand-off there.
                if status == ACK_DONE && bytes > 0 {
                    append_log(
                        words,
                        &HandOff {
                            time_ns: now_ns(),
                            donor: self.pid,
                            requester: view.pid,
                            bytes,
                            kind: if ask.kind == ASK_SLEEP {
                                "sleep".into()
                            } else {
                                "trim".into()
                            },
                            tag,
                        },
                    );
                }
                self.ack(view.owner, ask.id, bytes, status);
            }
        }
    }

    /// Does what `ask` asks, if this process may: `(bytes given, status, tag)`.
    fn act(&self, ask: &layout::AskEntry) -> (u64, u64, String) {
        self.publish_numbers();
        let reserved = self.word(S_RESERVED).load(Ordering::Relaxed);
        if reserved <= self.floor {
            return (0, ACK_AT_FLOOR, String::new());
        }
        match ask.kind {
            ASK_TRIM => {
                let cached = self.word(S_CACHED).load(Ordering::Relaxed);
                if reserved.saturating_sub(cached) < self.floor {
                    return (0, ACK_AT_FLOOR, String::new());
                }
                let given: u64 = self
                    .live_allocators()
                    .iter()
                    .filter_map(|a| a.trim().ok())
                    .sum();
                self.publish_numbers();
                (given, ACK_DONE, String::new())
            }
            ASK_SLEEP => {
                // A `using` entering now holds the gate: refuse rather than wait for it (its
                // wake may itself be asking the others, this thread among them).
                let Ok(_gate) = self.gate.try_lock() else {
                    return (0, ACK_IN_USE, String::new());
                };
                let tag = {
                    let local = self.locked();
                    local.tags.get(ask.tag_index).cloned()
                };
                let Some(tag) = tag else {
                    return (0, ACK_CANNOT, String::new());
                };
                if tag.using > 0 {
                    return (0, ACK_IN_USE, tag.name);
                }
                // The sleep is followed by a trim: what stays is the memory in use, less the tag.
                let in_use = self.word(S_IN_USE).load(Ordering::Relaxed);
                if in_use.saturating_sub(tag.bytes) < self.floor {
                    return (0, ACK_AT_FLOOR, tag.name);
                }
                let held_before: u64 = self.live_allocators().iter().map(|a| a.pool_bytes()).sum();
                let mut reported = 0;
                let mut failed = false;
                for a in self.live_allocators() {
                    match a.sleep(&tag.name, tag.keep) {
                        Ok(SleepReport { device_bytes, .. }) => reported += device_bytes,
                        Err(_) => failed = true,
                    }
                }
                // Trim what the sleep left cached (granules it handed back to the strategy).
                reported += self
                    .live_allocators()
                    .iter()
                    .filter_map(|a| a.trim().ok())
                    .sum::<u64>();
                let held_after: u64 = self.live_allocators().iter().map(|a| a.pool_bytes()).sum();
                // What the device got back: the strategies' own drop in what they hold, or what
                // the calls reported, whichever says more.
                let given = reported.max(held_before.saturating_sub(held_after));
                let asleep = self
                    .live_allocators()
                    .iter()
                    .any(|a| a.sleeping().iter().any(|s| s.tag == tag.name));
                if let Some(t) = self.locked().tags.iter_mut().find(|t| t.name == tag.name) {
                    t.asleep = asleep;
                }
                self.publish_tags();
                self.publish_numbers();
                let status = if given == 0 && failed {
                    ACK_CANNOT
                } else {
                    ACK_DONE
                };
                (given, status, tag.name)
            }
            _ => (0, ACK_CANNOT, String::new()),
        }
    }

    fn ack(&self, requester: u64, id: u64, bytes: u64, status: u64) {
        let head = self.word(S_ACK_HEAD).fetch_add(1, Ordering::AcqRel);
        let base = S_ACKS + (head as usize % ACKS) * ACK_WORDS;
        self.word(base + 1).store(0, Ordering::Release);
        self.word(base).store(requester, Ordering::Relaxed);
        self.word(base + 2).store(bytes, Ordering::Relaxed);
        self.word(base + 3).store(status, Ordering::Relaxed);
        self.word(base + 1).store(id, Ordering::Release);
        if status == ACK_DONE {
            self.word(S_GIVEN).fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.word(S_REFUSED).fetch_add(1, Ordering::Relaxed);
        }
        self.ring();
    }

    /// The asks for `bytes`, by the stated policy: trims of cached memory first (largest
    /// first), then reclaimable tags not in use and awake (largest first); members at or
    /// below their floor are not asked.
    fn plan(&self, members: &[SlotView], bytes: u64) -> Vec<(SlotView, u64, usize, u64)> {
        // A trim and a tag's sleep are whole: a member is asked only for one that leaves it at
        // or above its floor.
        // What a member keeps after giving: its memory in use (a trim gives the rest, and a
        // donor trims after a sleep), less a slept tag.
        let above_floor = |m: &SlotView, give: u64| m.in_use.saturating_sub(give) >= m.floor;
        let others: Vec<&SlotView> = members
            .iter()
            .filter(|m| m.owner != self.owner && m.reserved > m.floor)
            .collect();
        let mut trims: Vec<(SlotView, u64, usize, u64)> = others
            .iter()
            .filter(|m| m.cached > 0 && above_floor(m, 0))
            .map(|m| ((*m).clone(), ASK_TRIM, 0, m.cached))
            .collect();
        trims.sort_by_key(|c| std::cmp::Reverse(c.3));
        let mut sleeps: Vec<(SlotView, u64, usize, u64)> = Vec::new();
        for m in &others {
            for (i, t) in m.tags.iter().enumerate() {
                if !t.in_use && !t.asleep && t.bytes > 0 && above_floor(m, t.bytes) {
                    sleeps.push(((*m).clone(), ASK_SLEEP, i, t.bytes));
                }
            }
        }
        sleeps.sort_by_key(|c| std::cmp::Reverse(c.3));
        let mut plan = Vec::new();
        let mut sum = 0u64;
        for c in trims.into_iter().chain(sleeps) {
            if sum >= bytes || plan.len() == ASKS {
                break;
            }
            sum = sum.saturating_add(c.3);
            plan.push(c);
        }
        plan
    }

    fn reclaim(&self, bytes: u64) -> Vec<AskOutcome> {
        self.reclaim_until(bytes, Instant::now() + self.deadline)
    }

    /// [`Core::reclaim`], waiting for the answers until `deadline` at most.
    fn reclaim_until(&self, bytes: u64, deadline: Instant) -> Vec<AskOutcome> {
        if !self.still_ours() {
            return Vec::new();
        }
        let words = self.segment.words();
        let all = members(words);
        let plan = self.plan(&all, bytes);
        if plan.is_empty() {
            return Vec::new();
        }
        let request = {
            let mut local = self.locked();
            local.request += 1;
            local.request
        };
        let id_of = |i: usize| request << 8 | i as u64;
        self.write_structured(|w| {
            w(S_REQUEST).store(request, Ordering::Relaxed);
            w(S_REQUEST_BYTES).store(bytes, Ordering::Relaxed);
            for a in 0..ASKS {
                let base = S_ASKS + a * ASK_WORDS;
                match plan.get(a) {
                    Some((m, kind, tag, want)) => {
                        w(base).store(m.owner, Ordering::Relaxed);
                        w(base + 1).store(kind | (*tag as u64) << 8, Ordering::Relaxed);
                        w(base + 2).store(*want, Ordering::Relaxed);
                        w(base + 3).store(id_of(a), Ordering::Relaxed);
                    }
                    None => w(base).store(0, Ordering::Relaxed),
                }
            }
        });
        self.ring();
        let bell = self.segment.futex_word(H_DOORBELL);
        let mut outcomes: Vec<Option<AskOutcome>> = vec![None; plan.len()];
        // An ask's outcome before its answer: nothing given, no answer (yet).
        let unanswered = |(m, kind, tag, want): &(SlotView, u64, usize, u64)| AskOutcome {
            pid: m.pid,
            name: m.name.clone(),
            kind: if *kind == ASK_SLEEP { "sleep" } else { "trim" },
            tag: if *kind == ASK_SLEEP {
                m.tags.get(*tag).map(|t| t.name.clone()).unwrap_or_default()
            } else {
                String::new()
            },
            wanted: *want,
            given: 0,
            refusal: Some(Refusal::NoAnswer),
        };
        loop {
            let seen = bell.load(Ordering::Acquire);
            for (a, ask) in plan.iter().enumerate() {
                if outcomes[a].is_some() {
                    continue;
                }
                let m = &ask.0;
                let base = unanswered(ask);
                let slot_owner = words[slot_word(m.index, S_OWNER)].load(Ordering::Acquire);
                if slot_owner != m.owner || !alive(m.owner, u64::from(m.pid), m.start_time) {
                    outcomes[a] = Some(AskOutcome {
                        refusal: Some(Refusal::Gone),
                        ..base
                    });
                    continue;
                }
                if let Ok(view) = read_slot(words, m.index) {
                    if let Some(ack) = view
                        .acks
                        .iter()
                        .find(|k| k.requester == self.owner && k.id == id_of(a))
                    {
                        outcomes[a] = Some(AskOutcome {
                            given: ack.bytes,
                            refusal: match ack.status {
                                ACK_DONE => None,
                                ACK_IN_USE => Some(Refusal::InUse),
                                ACK_AT_FLOOR => Some(Refusal::AtFloor),
                                _ => Some(Refusal::Cannot),
                            },
                            ..base
                        });
                    }
                }
            }
            if outcomes.iter().all(Option::is_some) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            self.segment
                .wait(bell, seen, (deadline - now).min(WAIT_SLICE));
        }
        self.write_structured(|w| {
            w(S_REQUEST).store(0, Ordering::Relaxed);
        });
        plan.iter()
            .zip(outcomes)
            .map(|(ask, o)| o.unwrap_or_else(|| unanswered(ask)))
            .collect()
    }
}

/// An allocator that is a member of its device's shared budget: it publishes what its
/// upstream holds, counts the bytes of the reclaimable tags, and, when the upstream runs out,
/// trims the upstream, asks the other members ([`SharedBudget::reclaim`]) and tries again
/// before it reports — then with an [`Error::OutOfMemoryShared`] naming every member.
///
/// Everything else is the upstream's: name, id, stats, sleep, wake.
pub struct BudgetAllocator {
    inner: Arc<dyn Allocator>,
    budget: Arc<SharedBudget>,
    /// Allocations of reclaimable tags: token → (tag, bytes), for the tags' sizes.
    tagged: Mutex<rustc_hash::FxHashMap<u64, (String, u64)>>,
}

impl std::fmt::Debug for BudgetAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetAllocator")
            .field("inner", &self.inner.name())
            .field("budget", &self.budget)
            .finish()
    }
}

impl BudgetAllocator {
    /// Wraps `inner`, registering it with `budget`.
    pub fn new(inner: Arc<dyn Allocator>, budget: Arc<SharedBudget>) -> BudgetAllocator {
        budget.register(&inner);
        BudgetAllocator {
            inner,
            budget,
            tagged: Mutex::new(rustc_hash::FxHashMap::default()),
        }
    }

    /// The budget.
    pub fn budget(&self) -> &Arc<SharedBudget> {
        &self.budget
    }

    fn served(&self, allocation: &Allocation, tag: &str) {
        if self.budget.core.is_reclaimable(tag) {
            self.tagged
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(allocation.token(), (tag.to_string(), allocation.size()));
            self.budget.core.tag_bytes(tag, allocation.size() as i64);
        }
        let charged = self.inner.charged(allocation).unwrap_or(allocation.size());
        self.budget.core.publish_fast(&*self.inner, charged as i64);
    }
}

impl Allocator for BudgetAllocator {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn id(&self) -> u64 {
        self.inner.id()
    }

    fn allocate(&self, size: u64, alignment: u64, stream: Stream, tag: &str) -> Result<Allocation> {
        let first = match self.inner.allocate(size, alignment, stream, tag) {
            Ok(a) => {
                self.served(&a, tag);
                return Ok(a);
            }
            Err(e) if e.is_out_of_memory() => e,
            Err(e) => return Err(e),
        };
        // Our own cache first; then the others, up to three rounds within one deadline: the
        // request, then twice and four times it (capped at the device), for a strategy that
        // grows by more than it hands out (bfc's regions, vmm's granules) and for members
        // racing for what was given. A round nobody answered is the last; a request larger
        // than the device never asks.
        let _ = self.inner.trim();
        let mut asked = Vec::new();
        let mut last = first;
        let deadline = Instant::now() + self.budget.core.deadline;
        let possible = size <= self.budget.core.total;
        let rounds = [
            None,
            Some(size),
            Some(size.saturating_mul(2)),
            Some(size.saturating_mul(4)),
        ];
        for want in rounds {
            let mut got_nothing = false;
            if let Some(want) = want {
                if !possible {
                    break;
                }
                let got = self
                    .budget
                    .core
                    .reclaim_until(want.min(self.budget.core.total), deadline);
                if got.is_empty() {
                    break;
                }
                // Nobody answered (or all died): a second round would wait on them again.
                // Refusals (in use, at the floor) leave the second round to others.
                got_nothing = got
                    .iter()
                    .all(|g| matches!(g.refusal, Some(Refusal::NoAnswer | Refusal::Gone)));
                asked.extend(got);
            }
            match self.inner.allocate(size, alignment, stream, tag) {
                Ok(a) => {
                    self.served(&a, tag);
                    return Ok(a);
                }
                Err(e) if e.is_out_of_memory() => last = e,
                Err(e) => return Err(e),
            }
            if got_nothing {
                break;
            }
        }
        // Alone on the device, nobody was asked: the strategy's own report says it all.
        if asked.is_empty() && self.budget.members().len() <= 1 {
            return Err(last);
        }
        Err(Error::OutOfMemoryShared {
            error: Box::new(last),
            budget: Box::new(self.budget.report(size, asked)),
        })
    }

    fn deallocate(&self, allocation: Allocation) -> Result<()> {
        let entry = self
            .tagged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&allocation.token());
        let size = self.inner.charged(&allocation).unwrap_or(allocation.size());
        let r = self.inner.deallocate(allocation);
        if let Some((tag, bytes)) = entry {
            self.budget.core.tag_bytes(&tag, -(bytes as i64));
        }
        if r.is_ok() {
            self.budget.core.publish_fast(&*self.inner, -(size as i64));
        }
        r
    }

    fn stats(&self) -> Stats {
        self.inner.stats()
    }

    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        self.inner.charged(allocation)
    }

    fn pool_bytes(&self) -> u64 {
        self.inner.pool_bytes()
    }

    fn trim(&self) -> Result<u64> {
        let r = self.inner.trim();
        self.budget.core.publish_numbers();
        r
    }

    fn sleep(&self, tag: &str, keep: Keep) -> Result<SleepReport> {
        let r = self.inner.sleep(tag, keep);
        self.budget.core.publish_numbers();
        r
    }

    fn wake(&self, tag: &str) -> Result<SleepReport> {
        let r = match self.inner.wake(tag) {
            Err(e) if e.is_out_of_memory() => {
                let need = self
                    .inner
                    .sleeping()
                    .iter()
                    .find(|s| s.tag == tag)
                    .map_or(0, |s| s.bytes_asleep);
                self.budget.reclaim(need);
                self.inner.wake(tag)
            }
            other => other,
        };
        self.budget.core.publish_numbers();
        r
    }

    fn sleeping(&self) -> Vec<SleepingTag> {
        self.inner.sleeping()
    }

    fn is_asleep(&self, allocation: &Allocation) -> bool {
        self.inner.is_asleep(allocation)
    }

    fn backing(&self, allocation: &Allocation) -> Result<crate::allocator::Backing> {
        self.inner.backing(allocation)
    }

    fn tag_of(&self, allocation: &Allocation) -> Option<String> {
        self.inner.tag_of(allocation)
    }

    fn retag(&self, allocation: &Allocation, tag: &str) {
        self.inner.retag(allocation, tag);
    }

    fn freeing(&self, allocation: &Allocation) {
        self.inner.freeing(allocation);
    }

    fn queues_on_stream(&self) -> bool {
        self.inner.queues_on_stream()
    }

    fn graph_pools(&self) -> Vec<crate::adaptor::GraphPoolStats> {
        self.inner.graph_pools()
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.inner.check_invariants()
    }
}
