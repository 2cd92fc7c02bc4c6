//! The exporter's registry: a small shared file per exporting process where each importer
//! says "I hold this export", so that the exporter never hands memory an importer still maps
//! to a new allocation, and can say who keeps what it could not give back.
//!
//! `/dev/shm/portalloc-share-<pid>-<start time>.<uid>` (mode 0600), made at the first export
//! and removed when the exporter's [`crate::share::Sharing`] is dropped, or by an importer
//! that finds the exporter dead. Words, each an atomic `u64`:
//!
//! ```text
//! 0 magic   1 version   2 pid   3 start time   4 records   5-7 zero
//! 8 + 16 r: record r: key (0: free), the digest of the export's handle bytes, then 14
//!           importer marks (0: free)
//! ```
//!
//! One registry per exporting process, whatever number of allocators export (keys never
//! repeat in a process, so a handle of an export withdrawn is never taken for a later one).
//! Only the exporter writes keys and digests; an importer checks both (a handle whose size or
//! offset was altered does not match its digest), and claims a mark by a compare-and-swap from
//! 0 to
//! `pid << 32 | (start time & 0xffff_ffff)` and clears it when it drops the import. A mark
//! of a dead process (no such pid, or another start time) counts as nothing: a killed
//! importer costs the exporter nothing. Everything read is a value, never trusted for more
//! than that: a record whose key is not the export's is not the export's.
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backends::shared_segment::{Access, MappedSegment};
use crate::error::{Error, Result};

/// "PASHREG1".
const MAGIC: u64 = u64::from_le_bytes(*b"PASHREG1");
const VERSION: u64 = 1;
const HEADER: usize = 8;
/// Words per record: the key, the digest and [`MARKS`] importer marks.
const RECORD: usize = 16;
/// Importing processes of one export at a time.
pub const MARKS: usize = RECORD - 2;
/// Exports live at a time in one process.
pub const RECORDS: usize = 4096;
const WORDS: usize = HEADER + RECORD * RECORDS;

/// Where registries are: `PORTALLOC_SHARE_DIR`, else `/dev/shm`. Exporter and importers
/// must agree on it.
pub fn default_dir() -> PathBuf {
    std::env::var_os("PORTALLOC_SHARE_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/shm"))
}

/// The registry file of process `pid` started at `start`, in `dir`.
pub fn path_of(dir: &Path, pid: u32, start: u64) -> PathBuf {
    dir.join(format!(
        "portalloc-share-{pid}-{start}.{}",
        crate::backends::shared_segment::effective_uid()
    ))
}

/// Removes registries in `dir` of this user whose exporter is gone (killed before its
/// allocator could remove its own), looking at 64 files at most.
fn remove_abandoned(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let suffix = format!(".{}", crate::backends::shared_segment::effective_uid());
    for entry in entries.flatten().take(64) {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name
            .strip_prefix("portalloc-share-")
            .and_then(|r| r.strip_suffix(suffix.as_str()))
        else {
            continue;
        };
        let Some((pid, start)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
            continue;
        };
        if crate::budget::process_start_time(pid) != Some(start)
            && !crate::backends::shared_segment::pid_exists(pid)
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The mark a process writes: its pid and the low half of its start time.
pub fn mark_of(pid: u32, start: u64) -> u64 {
    (u64::from(pid) << 32) | (start & 0xffff_ffff)
}

/// Whether the process a mark names still runs.
fn mark_alive(mark: u64) -> bool {
    let pid = (mark >> 32) as u32;
    if pid == 0 {
        return false;
    }
    match crate::budget::process_start_time(pid) {
        Some(start) => start & 0xffff_ffff == mark & 0xffff_ffff,
        None => crate::backends::shared_segment::pid_exists(pid),
    }
}

fn problem(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Share {
        what: "use an export registry",
        reason: format!("{}: {reason}", path.display()),
    }
}

/// A registry mapped: the exporter's own, or another process's that an importer marks.
#[derive(Debug)]
pub struct Registry {
    segment: MappedSegment,
    owner: bool,
}

impl Registry {
    /// Creates (or opens, when this process made it already) the calling process's registry.
    ///
    /// # Errors
    /// [`Error::Share`] when the file cannot be made or is not right.
    pub fn create(dir: &Path, pid: u32, start: u64) -> Result<Registry> {
        remove_abandoned(dir);
        let path = path_of(dir, pid, start);
        let init = |w: &[AtomicU64]| {
            w[1].store(VERSION, Ordering::Relaxed);
            w[2].store(u64::from(pid), Ordering::Relaxed);
            w[3].store(start, Ordering::Relaxed);
            w[4].store(RECORDS as u64, Ordering::Relaxed);
            w[0].store(MAGIC, Ordering::Release);
        };
        let segment = MappedSegment::open(&path, WORDS, Access::default(), &init)
            .map_err(|e| problem(&path, e))?;
        let registry = Registry {
            segment,
            owner: true,
        };
        if !registry.segment.created() {
            // Left by an earlier process with this pid and start time: impossible unless the
            // clock of boots repeats; checked like any other file.
            registry.check(pid, start)?;
            for w in &registry.words()[HEADER..] {
                w.store(0, Ordering::Relaxed);
            }
        }
        Ok(registry)
    }

    /// Opens the registry of exporter `pid` (started at `start`), to mark imports in it.
    ///
    /// # Errors
    /// [`Error::Share`] when there is none (the exporter exited) or it is not right.
    pub fn open(dir: &Path, pid: u32, start: u64) -> Result<Registry> {
        let path = path_of(dir, pid, start);
        let segment = MappedSegment::open_existing(&path, WORDS, Access::default())
            .map_err(|e| problem(&path, e))?;
        let registry = Registry {
            segment,
            owner: false,
        };
        registry.check(pid, start)?;
        Ok(registry)
    }

    fn check(&self, pid: u32, start: u64) -> Result<()> {
        let w = self.words();
        let header = [
            w[0].load(Ordering::Acquire),
            w[1].load(Ordering::Relaxed),
            w[2].load(Ordering::Relaxed),
            w[3].load(Ordering::Relaxed),
            w[4].load(Ordering::Relaxed),
        ];
        let expected = [MAGIC, VERSION, u64::from(pid), start, RECORDS as u64];
        if header != expected {
            return Err(problem(
                self.segment.path(),
                format!(
                    "its header is {header:x?}, expected {expected:x?} (magic, version, pid, \
                     start time, records)"
                ),
            ));
        }
        Ok(())
    }

    fn words(&self) -> &[AtomicU64] {
        self.segment.words()
    }

    fn record(&self, r: u32) -> Option<&[AtomicU64]> {
        let r = r as usize;
        (r < RECORDS).then(|| &self.words()[HEADER + r * RECORD..HEADER + (r + 1) * RECORD])
    }

    /// The exporter: takes a free record for export `key` (non-zero); `None` when all
    /// [`RECORDS`] are taken.
    pub fn take(&self, key: u64) -> Option<u32> {
        debug_assert!(self.owner && key != 0);
        (0..RECORDS as u32).find(|&r| {
            let rec = self.record(r).expect("in range");
            if rec[0]
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return false;
            }
            for m in &rec[1..] {
                m.store(0, Ordering::Release);
            }
            true
        })
    }

    /// The exporter: records the digest of export `key`'s handle bytes in record `r`.
    pub fn seal(&self, r: u32, key: u64, digest: u64) {
        if let Some(rec) = self.record(r) {
            if rec[0].load(Ordering::Acquire) == key {
                rec[1].store(digest, Ordering::Release);
            }
        }
    }

    /// The exporter: frees record `r` (its export withdrawn); importers that come later are
    /// refused.
    pub fn give_back(&self, r: u32) {
        if let Some(rec) = self.record(r) {
            rec[0].store(0, Ordering::Release);
        }
    }

    /// The live importers of record `r` holding export `key`: their pids.
    pub fn importers(&self, r: u32, key: u64) -> Vec<u32> {
        let Some(rec) = self.record(r) else {
            return Vec::new();
        };
        if rec[0].load(Ordering::Acquire) != key {
            return Vec::new();
        }
        let mut pids: Vec<u32> = rec[2..]
            .iter()
            .map(|m| m.load(Ordering::Acquire))
            .filter(|&m| m != 0 && mark_alive(m))
            .map(|m| (m >> 32) as u32)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// An importer: marks record `r` of export `key` with `mark`; the mark's slot, to clear.
    ///
    /// # Errors
    /// [`Error::Share`] when the record is not that export's (withdrawn) or has no free mark.
    pub fn mark(&self, r: u32, key: u64, digest: u64, mark: u64) -> Result<usize> {
        let refuse = |reason: String| Error::Share {
            what: "import an allocation",
            reason,
        };
        let rec = self
            .record(r)
            .ok_or_else(|| refuse(format!("record {r} is past the registry's {RECORDS}")))?;
        if rec[0].load(Ordering::Acquire) != key {
            return Err(refuse(
                "the exporter withdrew this export (the allocation was freed with no importer \
                 holding it)"
                    .into(),
            ));
        }
        if rec[1].load(Ordering::Acquire) != digest {
            return Err(refuse(
                "the handle's bytes are not those the exporter wrote (altered in transit?)".into(),
            ));
        }
        for (i, m) in rec[2..].iter().enumerate() {
            let seen = m.load(Ordering::Acquire);
            // A dead importer's mark is free again.
            let free = seen == 0 || !mark_alive(seen);
            if free
                && m.compare_exchange(seen, mark, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                // The exporter may have withdrawn it between the two reads: then the mark is
                // taken back and the import refused.
                if rec[0].load(Ordering::Acquire) != key {
                    let _ = m.compare_exchange(mark, 0, Ordering::AcqRel, Ordering::Acquire);
                    return Err(refuse("the exporter withdrew this export meanwhile".into()));
                }
                return Ok(i + 2);
            }
        }
        Err(refuse(format!(
            "{MARKS} processes import this export already; at most {MARKS} at a time"
        )))
    }

    /// Whether record `r` still holds export `key` (not withdrawn).
    pub fn holds(&self, r: u32, key: u64) -> bool {
        self.record(r)
            .is_some_and(|rec| rec[0].load(Ordering::Acquire) == key)
    }

    /// An importer: clears its mark in slot `slot` of record `r`, if the record still holds
    /// export `key` (else the mark went with the export).
    pub fn unmark(&self, r: u32, key: u64, slot: usize, mark: u64) {
        let Some(rec) = self.record(r) else {
            return;
        };
        if rec[0].load(Ordering::Acquire) != key {
            return;
        }
        if let Some(m) = rec.get(slot) {
            let _ = m.compare_exchange(mark, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Removes the file (its mapping stays valid for whoever has it).
    pub fn unlink(&self) {
        self.segment.unlink();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if self.owner {
            self.segment.unlink();
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn marks_are_seen_by_the_exporter_and_a_withdrawn_export_refuses_importers() {
        let dir =
            std::env::temp_dir().join(format!("portalloc-registry-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dir = dir.as_path();
        // A made-up pid and start time: the registry is a file, whoever's name it has.
        let (pid, start) = (u32::MAX - 7, 42);
        let exporter = Registry::create(dir, pid, start).unwrap();
        let r = exporter.take(99).unwrap();
        exporter.seal(r, 99, 7);
        let importer = Registry::open(dir, pid, start).unwrap();
        let me = crate::backends::shared_segment::current_pid();
        let mark = mark_of(me, crate::budget::process_start_time(me).unwrap_or(0));
        assert!(
            importer.mark(r, 99, 8, mark).is_err(),
            "another handle's digest"
        );
        let slot = importer.mark(r, 99, 7, mark).unwrap();
        assert_eq!(exporter.importers(r, 99), vec![me]);
        assert!(
            importer.mark(r, 98, 7, mark).is_err(),
            "another export's key"
        );
        importer.unmark(r, 99, slot, mark);
        assert!(exporter.importers(r, 99).is_empty());
        // A dead process's mark counts as nothing.
        let dead = mark_of(u32::MAX - 1, 1);
        importer.mark(r, 99, 7, dead).unwrap();
        assert!(exporter.importers(r, 99).is_empty());
        exporter.give_back(r);
        let e = importer.mark(r, 99, 7, mark).unwrap_err().to_string();
        assert!(e.contains("withdrew"), "{e}");
        drop(exporter);
        assert!(
            Registry::open(dir, pid, start).is_err(),
            "the owner removes its file"
        );
        let _ = std::fs::remove_dir(dir);
    }
}
