//! One device shared by several processes, as a real driver's device is
//! (`drivers/fake_shared.h`).
//!
//! Without [`SHARED_VARIABLE`] each process that loads a fake driver has a device of its own.
//! With it, every process that names the same segment charges one device: what one process
//! allocates, the others' `cuMemGetInfo` / `hipMemGetInfo` no longer report free, and their
//! allocations past the capacity fail with the vendor's out-of-memory code. A process that is
//! killed gives its memory back by the liveness rule (its pid gone, or reused by a process
//! that started at another time), as a real driver frees a dead process's memory.
//!
//! Memory exported from one process and imported by others (a physical handle exported
//! once, `fake_ipc.h`; before its first export it is its creator's like any other) is the
//! device's, not one process's: it is counted once while any
//! live process holds a handle of it, as the real driver frees it only when the last holder
//! lets go ([`SharedObject`]).
//!
//! [`SharedDevice`] names a segment, gives the environment that puts child processes on it,
//! and reads the segment file itself: it is a test's oracle for the device's free memory and
//! for what each process holds, independent of the drivers.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// The variable the drivers read, once, when they first prepare themselves: a name (letters,
/// digits, `-`, `_`, `.`; at most 64), which is the file
/// `/dev/shm/portalloc-fake-<name>.<euid>`, or an absolute path (starting with `/`), which is
/// that file. Unset or empty: each process has a private device.
pub const SHARED_VARIABLE: &str = "FAKE_SHARED_DEVICE";

/// The segment's layout (`fake_shared.h`): a 96-byte header, then 64 slots of 80 bytes, then
/// 1024 exported objects of 32 bytes (u64 key, u64 size, u32 device, u32 pad, u64 holders).
const MAGIC: u64 = 0x5645_444b_4146_4150; // "PAFAKDEV" in little-endian bytes
/// The segment layout version this kit reads (`FK_SHARED_VERSION`).
pub const SHARED_LAYOUT_VERSION: u32 = 2;
const DEVICES: usize = 8;
const SLOTS: usize = 64;
const OBJECTS: usize = 1024;
const HEADER: usize = 96;
const SLOT: usize = 16 + 8 * DEVICES;
const OBJECT: usize = 32;
const SIZE: usize = HEADER + SLOT * SLOTS + OBJECT * OBJECTS;
/// In an owner word: a claim under way (the slot holds nothing yet).
const CLAIMING: u64 = 0x8000_0000;

static NAMES: AtomicU64 = AtomicU64::new(0);

/// A process holding memory on a shared device: its pid and the bytes it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The process id.
    pub pid: u32,
    /// The bytes its driver has charged to the device, and those of every exported object it
    /// holds a handle of (each also counted for its other holders: the device's
    /// [`Segment::used`] counts an object once).
    pub bytes: u64,
}

/// An exported physical allocation on a shared device, counted once while any live process
/// holds it (its creator's handle, an importer's, or a mapping).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedObject {
    /// Its key: the creator's pid << 32 | its export counter (also in the memory file's name,
    /// `fake-exportable-<key>-<device>`).
    pub key: u64,
    /// Its bytes.
    pub size: u64,
    /// Its device.
    pub device: usize,
    /// The live processes holding it, by slot.
    pub holders: Vec<u32>,
}

/// A device shared by the processes given its environment ([`SharedDevice::env`]).
///
/// The drivers create the segment file when the first of those processes prepares its
/// driver; dropping the `SharedDevice` removes the file if it was not there when the
/// `SharedDevice` was made (it named a fresh segment).
///
/// ```
/// use portalloc_fakes::{profile, SharedDevice};
/// use std::process::Command;
///
/// let device = SharedDevice::unique();
/// let mut child = Command::new("sh");
/// child.args(["-c", "echo $FAKE_SHARED_DEVICE"]);
/// profile("cuda12").unwrap().apply(&mut child);
/// let out = device.apply(&mut child).output().unwrap();
/// assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), device.value());
/// // No driver has run: no segment yet, and so nobody holds anything.
/// assert!(device.read().is_err());
/// ```
#[derive(Debug)]
pub struct SharedDevice {
    value: String,
    path: PathBuf,
    fresh: bool,
}

impl SharedDevice {
    /// The segment `name` names: a name (letters, digits, `-`, `_`, `.`; at most 64) or an
    /// absolute path, as [`SHARED_VARIABLE`] takes it.
    ///
    /// # Panics
    /// When `name` is neither.
    #[track_caller]
    pub fn new(name: &str) -> SharedDevice {
        let path = segment_path(name).unwrap_or_else(|| {
            panic!(
                "{SHARED_VARIABLE}={name:.80}: not a name (letters, digits, '-', '_', '.'; at \
                 most 64) nor an absolute path"
            )
        });
        let fresh = !path.exists();
        SharedDevice {
            value: name.to_owned(),
            path,
            fresh,
        }
    }

    /// A segment of a name no other `SharedDevice` of any process has used:
    /// `t<pid>-<counter>-<nanoseconds>`.
    pub fn unique() -> SharedDevice {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let n = NAMES.fetch_add(1, Ordering::Relaxed);
        SharedDevice::new(&format!("t{}-{n}-{nanos}", std::process::id()))
    }

    /// What [`SHARED_VARIABLE`] is set to: the name or path given.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The segment file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The variables to add to a child's environment: [`SHARED_VARIABLE`] set to
    /// [`SharedDevice::value`]. (A profile's [`Profile::apply`](crate::Profile::apply) keeps
    /// it: it is a switch of the kit, not a personality.)
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        vec![(OsString::from(SHARED_VARIABLE), OsString::from(&self.value))]
    }

    /// `command` with [`SharedDevice::env`].
    pub fn apply<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        command.envs(self.env())
    }

    /// The segment as it is now, read from its file.
    ///
    /// # Errors
    /// When the file cannot be read (no driver has created it yet) or is not a segment of
    /// this layout (size, magic, version).
    pub fn read(&self) -> std::io::Result<Segment> {
        let bytes = std::fs::read(&self.path)?;
        Segment::parse(&bytes).map_err(|why| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {why}", self.path.display()),
            )
        })
    }

    #[track_caller]
    fn segment(&self) -> Segment {
        self.read()
            .unwrap_or_else(|e| panic!("the shared device's segment: {e}"))
    }

    /// The live processes holding memory on `device`, by slot.
    ///
    /// # Panics
    /// When the segment cannot be read ([`SharedDevice::read`]).
    #[track_caller]
    pub fn holders(&self, device: usize) -> Vec<Holder> {
        self.segment().holders(device)
    }

    /// The bytes every live process holds on `device`, each exported object once.
    ///
    /// # Panics
    /// As [`SharedDevice::holders`].
    #[track_caller]
    pub fn used(&self, device: usize) -> u64 {
        self.segment().used(device)
    }

    /// The exported objects some live process holds, on every device.
    ///
    /// # Panics
    /// As [`SharedDevice::holders`].
    #[track_caller]
    pub fn objects(&self) -> Vec<SharedObject> {
        self.segment().objects()
    }

    /// The capacity of `device` less [`SharedDevice::used`]: what the drivers' memory
    /// information reports free.
    ///
    /// # Panics
    /// As [`SharedDevice::holders`].
    #[track_caller]
    pub fn free(&self, device: usize) -> u64 {
        self.segment().free(device)
    }

    /// The capacity of `device`, the segment creator's.
    ///
    /// # Panics
    /// As [`SharedDevice::holders`].
    #[track_caller]
    pub fn capacity(&self, device: usize) -> u64 {
        self.segment().capacity[device]
    }
}

impl Drop for SharedDevice {
    fn drop(&mut self) {
        if self.fresh {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The file a value of [`SHARED_VARIABLE`] names, or `None` for a value the drivers refuse.
fn segment_path(value: &str) -> Option<PathBuf> {
    if value.starts_with('/') {
        return Some(PathBuf::from(value));
    }
    let ok = !value.is_empty()
        && value.len() <= 64
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    ok.then(|| PathBuf::from(format!("/dev/shm/portalloc-fake-{value}.{}", euid())))
}

/// A snapshot of a segment: capacities, and each slot's owner and charges.
#[derive(Debug, Clone)]
pub struct Segment {
    /// Per device: the bytes it has.
    pub capacity: [u64; DEVICES],
    slots: Vec<Slot>,
    objects: Vec<Object>,
}

#[derive(Debug, Clone)]
struct Object {
    key: u64,
    size: u64,
    device: u32,
    holders: u64,
}

#[derive(Debug, Clone)]
struct Slot {
    owner: u64,
    start_time: u64,
    used: [u64; DEVICES],
}

impl Segment {
    fn parse(b: &[u8]) -> Result<Segment, String> {
        if b.len() != SIZE {
            return Err(format!("{} bytes, a segment is {SIZE}", b.len()));
        }
        let u64_at = |at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let u32_at = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        if u64_at(0) != MAGIC {
            return Err(format!("magic {:#x}: not a segment", u64_at(0)));
        }
        if u32_at(8) != SHARED_LAYOUT_VERSION {
            return Err(format!("layout version {}", u32_at(8)));
        }
        let capacity = std::array::from_fn(|d| u64_at(32 + 8 * d));
        let slots = (0..SLOTS)
            .map(|i| {
                let at = HEADER + SLOT * i;
                Slot {
                    owner: u64_at(at),
                    start_time: u64_at(at + 8),
                    used: std::array::from_fn(|d| u64_at(at + 16 + 8 * d)),
                }
            })
            .collect();
        let objects = (0..OBJECTS)
            .map(|i| {
                let at = HEADER + SLOT * SLOTS + OBJECT * i;
                Object {
                    key: u64_at(at),
                    size: u64_at(at + 8),
                    device: u32_at(at + 16),
                    holders: u64_at(at + 24),
                }
            })
            .collect();
        Ok(Segment {
            capacity,
            slots,
            objects,
        })
    }

    /// The slots whose process is live, as bits.
    fn live(&self) -> u64 {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live())
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }

    /// The objects of `device` (every device: `None`) some live slot holds.
    fn counted(&self, device: Option<usize>, live: u64) -> impl Iterator<Item = &Object> {
        self.objects.iter().filter(move |o| {
            o.key != 0
                && o.holders & live != 0
                && (device.is_none() || device == Some(o.device as usize))
        })
    }

    /// The live processes holding memory on `device`, by slot: what each charged, and the
    /// exported objects it holds.
    pub fn holders(&self, device: usize) -> Vec<Holder> {
        let live = self.live();
        self.slots
            .iter()
            .enumerate()
            .filter(|(i, _)| live >> i & 1 != 0)
            .map(|(i, s)| Holder {
                pid: (s.owner >> 32) as u32,
                bytes: self
                    .counted(Some(device), live)
                    .filter(|o| o.holders >> i & 1 != 0)
                    .fold(s.used[device], |sum, o| sum.saturating_add(o.size)),
            })
            .filter(|h| h.bytes > 0)
            .collect()
    }

    /// The bytes every live process holds on `device`: their charges, and each exported
    /// object some live process holds, once.
    pub fn used(&self, device: usize) -> u64 {
        let live = self.live();
        let charged = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, _)| live >> i & 1 != 0)
            .fold(0u64, |sum, (_, s)| sum.saturating_add(s.used[device]));
        self.counted(Some(device), live)
            .fold(charged, |sum, o| sum.saturating_add(o.size))
    }

    /// The exported objects some live process holds, with their live holders' pids.
    pub fn objects(&self) -> Vec<SharedObject> {
        let live = self.live();
        self.counted(None, live)
            .map(|o| SharedObject {
                key: o.key,
                size: o.size,
                device: o.device as usize,
                holders: (0..SLOTS)
                    .filter(|i| (o.holders & live) >> i & 1 != 0)
                    .map(|i| (self.slots[i].owner >> 32) as u32)
                    .collect(),
            })
            .collect()
    }

    /// The capacity of `device` less [`Segment::used`].
    pub fn free(&self, device: usize) -> u64 {
        self.capacity[device].saturating_sub(self.used(device))
    }
}

impl Slot {
    /// The drivers' rule: an owner, not mid-claim, whose process runs (no zombie) and
    /// started when the slot says.
    fn live(&self) -> bool {
        if self.owner == 0 || self.owner & CLAIMING != 0 {
            return false;
        }
        let pid = (self.owner >> 32) as u32;
        match proc_start(pid) {
            Some((start, zombie)) => !zombie && start == self.start_time,
            None => false,
        }
    }
}

/// Field 22 of `/proc/<pid>/stat` (the start time) and whether the process is a zombie;
/// `None` when there is no such process.
fn proc_start(pid: u32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold anything, but ends at the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let zombie = matches!(fields.first(), Some(&"Z") | Some(&"X"));
    Some((fields.get(19)?.parse().ok()?, zombie))
}

fn euid() -> u32 {
    extern "C" {
        fn geteuid() -> u32;
    }
    // SAFETY: geteuid takes nothing, cannot fail and touches no memory of ours.
    unsafe { geteuid() }
}
