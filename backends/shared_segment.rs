//! A file of 64-bit words mapped shared between processes: the storage of the shared budget
//! ([`crate::budget`]). This is the only place it touches `mmap`; everything the budget
//! reads and writes goes through [`MappedSegment::words`], a slice of atomics, so any bytes
//! another process left there are values, never undefined behaviour.
//!
//! What is checked here, before a word is read: the file is a regular file (not a link,
//! `O_NOFOLLOW`), owned by this user, not writable by others (by the group only when the
//! caller asked for a group), and exactly the size the layout says. The layout's own checks
//! (magic, version, geometry) are the budget's ([`crate::budget::layout`]).
//!
//! Linux only (futexes on shared memory, `/dev/shm`); elsewhere [`MappedSegment::open`] says
//! it is not supported and the budget runs alone.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Why a segment file could not be mapped. The budget turns it into
/// [`crate::Error::SharedSegment`], or into its one warning.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MapProblem {
    /// An I/O call failed: which, and the system's words.
    Io(String),
    /// Not a regular file (a link, a directory, a device).
    NotRegularFile,
    /// Owned by another user.
    OtherOwner {
        /// The file's owner.
        uid: u32,
        /// This process's effective user.
        ours: u32,
    },
    /// Writable by users it is not meant for.
    Permissions {
        /// The file's mode bits.
        mode: u32,
    },
    /// Not the size the layout has (truncated, or another layout).
    Size {
        /// Bytes found.
        found: u64,
        /// Bytes the layout has.
        expected: u64,
    },
    /// Not available on this platform.
    Unsupported,
}

impl std::fmt::Display for MapProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MapProblem::Io(what) => write!(f, "{what}"),
            MapProblem::NotRegularFile => f.write_str("not a regular file"),
            MapProblem::OtherOwner { uid, ours } => write!(
                f,
                "owned by user {uid}, not by this user ({ours}); a budget is per user unless \
                 PORTALLOC_SHARED_BUDGET_GROUP names a group"
            ),
            MapProblem::Permissions { mode } => write!(
                f,
                "mode {mode:o} lets other users write it; accepted: 600, or 660 with a group"
            ),
            MapProblem::Size { found, expected } => write!(
                f,
                "{found} bytes, the layout has {expected} (truncated, or another layout)"
            ),
            MapProblem::Unsupported => f.write_str("shared segments need Linux"),
        }
    }
}

/// What a creator writes into a fresh segment before anyone reads it.
type Init<'a> = &'a dyn Fn(&[AtomicU64]);

/// Who may open a segment besides its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// A group whose members share it (mode 0660, group set on creation); `None`: this user
    /// only (mode 0600).
    pub group: Option<u32>,
}

/// A mapped segment: `words` 64-bit words shared with every process that maps the file.
pub struct MappedSegment {
    ptr: std::ptr::NonNull<AtomicU64>,
    words: usize,
    path: PathBuf,
    created: bool,
    /// The file's device and inode, to tell whether the path still names it.
    identity: (u64, u64),
}

// SAFETY: the mapping is memory every thread may access through atomics only; the pointer is
// not tied to a thread.
unsafe impl Send for MappedSegment {}
// SAFETY: as above: shared access is through `&[AtomicU64]`.
unsafe impl Sync for MappedSegment {}

impl std::fmt::Debug for MappedSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedSegment")
            .field("path", &self.path)
            .field("words", &self.words)
            .field("created", &self.created)
            .finish()
    }
}

impl MappedSegment {
    /// Opens the segment at `path`, creating it (`words` words of zeros, then `init`) when no
    /// file is there. `created()` says which. A file another process is still creating is
    /// opened as it is: the caller waits for its magic.
    ///
    /// # Errors
    /// A [`MapProblem`] for a file that is not this user's regular file of the right size, or
    /// an I/O failure.
    #[cfg(target_os = "linux")]
    pub fn open(
        path: &Path,
        words: usize,
        access: Access,
        init: &dyn Fn(&[AtomicU64]),
    ) -> Result<MappedSegment, MapProblem> {
        MappedSegment::open_with(path, words, access, Some(init))
    }

    /// Opens an existing segment (never creates one), with the same checks as
    /// [`MappedSegment::open`]: for readers such as `portalloc top`.
    ///
    /// # Errors
    /// As [`MappedSegment::open`]; `Io` naming `open` when there is no file.
    #[cfg(target_os = "linux")]
    pub fn open_existing(
        path: &Path,
        words: usize,
        access: Access,
    ) -> Result<MappedSegment, MapProblem> {
        MappedSegment::open_with(path, words, access, None)
    }

    /// Not Linux: always [`MapProblem::Unsupported`].
    ///
    /// # Errors
    /// Always.
    #[cfg(not(target_os = "linux"))]
    pub fn open_existing(
        _path: &Path,
        _words: usize,
        _access: Access,
    ) -> Result<MappedSegment, MapProblem> {
        Err(MapProblem::Unsupported)
    }

    #[cfg(target_os = "linux")]
    fn open_with(
        path: &Path,
        words: usize,
        access: Access,
        init: Option<Init<'_>>,
    ) -> Result<MappedSegment, MapProblem> {
        use rustix::fs::{self, Mode, OFlags};
        let io = |what: &str, e: rustix::io::Errno| MapProblem::Io(format!("{what}: {e}"));
        let bytes = (words * 8) as u64;
        let mode = if access.group.is_some() {
            Mode::from_raw_mode(0o660)
        } else {
            Mode::from_raw_mode(0o600)
        };
        let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let create = if init.is_some() {
            fs::open(path, flags | OFlags::CREATE | OFlags::EXCL, mode)
        } else {
            Err(rustix::io::Errno::EXIST)
        };
        // An existing file is opened without blocking (a FIFO someone left there must not
        // hang the open); one removed between our create and our open (its last member left)
        // is created again, a few times at most.
        let mut create = create;
        let mut tries = 0;
        let (fd, created) = loop {
            match create {
                Ok(fd) => break (fd, true),
                Err(rustix::io::Errno::EXIST) => {
                    match fs::open(path, flags | OFlags::NONBLOCK, Mode::empty()) {
                        Ok(fd) => break (fd, false),
                        Err(rustix::io::Errno::LOOP) => return Err(MapProblem::NotRegularFile),
                        Err(rustix::io::Errno::NOENT) if init.is_some() && tries < 3 => {
                            tries += 1;
                            create = fs::open(path, flags | OFlags::CREATE | OFlags::EXCL, mode);
                        }
                        Err(e) => return Err(io("open", e)),
                    }
                }
                Err(e) => return Err(io("create", e)),
            }
        };
        let ours = rustix::process::geteuid().as_raw();
        if created {
            // The umask may have taken bits the mode asked for; the group is set explicitly.
            fs::fchmod(&fd, mode).map_err(|e| io("fchmod", e))?;
            if let Some(gid) = access.group {
                fs::fchown(&fd, None, Some(rustix::fs::Gid::from_raw(gid)))
                    .map_err(|e| io("fchown", e))?;
            }
            fs::ftruncate(&fd, bytes).map_err(|e| io("ftruncate", e))?;
        }
        let mut stat = fs::fstat(&fd).map_err(|e| io("fstat", e))?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(MapProblem::NotRegularFile);
        }
        // A file of 0 bytes is one its creator has yet to size (between its create and its
        // `ftruncate`): wait for it, briefly, rather than take it for a truncated one.
        let started = std::time::Instant::now();
        while !created
            && stat.st_size == 0
            && started.elapsed() < std::time::Duration::from_millis(500)
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
            stat = fs::fstat(&fd).map_err(|e| io("fstat", e))?;
        }
        if stat.st_uid != ours {
            let shared_with_us = access.group.is_some_and(|g| g == stat.st_gid);
            if !shared_with_us {
                return Err(MapProblem::OtherOwner {
                    uid: stat.st_uid,
                    ours,
                });
            }
        }
        let perm = stat.st_mode & 0o777;
        let others_write = perm & 0o002 != 0;
        let group_write = perm & 0o020 != 0 && access.group.is_none();
        if others_write || group_write {
            return Err(MapProblem::Permissions { mode: perm });
        }
        if stat.st_size as u64 != bytes {
            return Err(MapProblem::Size {
                found: stat.st_size as u64,
                expected: bytes,
            });
        }
        // SAFETY: a fresh mapping (null hint) of `bytes` bytes of a file of exactly that
        // size, checked above; the kernel picks the address. Nothing else refers to it yet.
        let raw = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                bytes as usize,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| io("mmap", e))?;
        let ptr = std::ptr::NonNull::new(raw.cast::<AtomicU64>())
            .ok_or_else(|| MapProblem::Io("mmap returned null".into()))?;
        let segment = MappedSegment {
            ptr,
            words,
            path: path.to_path_buf(),
            created,
            identity: (stat.st_dev, stat.st_ino),
        };
        if let (true, Some(init)) = (created, init) {
            init(segment.words());
        }
        Ok(segment)
    }

    /// Not Linux: always [`MapProblem::Unsupported`].
    ///
    /// # Errors
    /// Always.
    #[cfg(not(target_os = "linux"))]
    pub fn open(
        _path: &Path,
        _words: usize,
        _access: Access,
        _init: &dyn Fn(&[AtomicU64]),
    ) -> Result<MappedSegment, MapProblem> {
        Err(MapProblem::Unsupported)
    }

    /// The segment's words. Any process may have written any value in any of them.
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` maps `words` 8-byte words, page-aligned, valid until `drop`
        // (`&self` keeps it); `AtomicU64` has the layout of `u64` and every bit pattern is a
        // value; all access, ours and other processes', is atomic.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.words) }
    }

    /// Word `index` seen as the 32-bit futex word it holds (its first four bytes), for
    /// [`wait`](MappedSegment::wait) and [`wake`](MappedSegment::wake). A word used so is
    /// never read through [`MappedSegment::words`].
    ///
    /// # Panics
    /// If `index` is out of the segment (a layout constant, not input).
    pub fn futex_word(&self, index: usize) -> &AtomicU32 {
        assert!(index < self.words, "futex word {index} outside the segment");
        // SAFETY: in bounds (checked above), 8-byte aligned hence 4-byte aligned, valid as
        // long as `&self`; `AtomicU32` accepts every bit pattern.
        unsafe { &*self.ptr.as_ptr().add(index).cast::<AtomicU32>() }
    }

    /// Sleeps until `word` no longer holds `expected`, a wake, or `timeout` (at most).
    pub fn wait(&self, word: &AtomicU32, expected: u32, timeout: std::time::Duration) {
        #[cfg(target_os = "linux")]
        {
            let t = rustix::thread::futex::Timespec {
                tv_sec: timeout.as_secs() as i64,
                tv_nsec: timeout.subsec_nanos() as i64,
            };
            // A shared (not private) futex: the other processes wake it. Its errors (EAGAIN:
            // changed already; ETIMEDOUT; EINTR) all mean "look again".
            let _ = rustix::thread::futex::wait(
                word,
                rustix::thread::futex::Flags::empty(),
                expected,
                Some(&t),
            );
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (word, expected);
            std::thread::sleep(timeout.min(std::time::Duration::from_millis(10)));
        }
    }

    /// Wakes every process sleeping on `word`.
    pub fn wake(&self, word: &AtomicU32) {
        #[cfg(target_os = "linux")]
        {
            let _ = rustix::thread::futex::wake(
                word,
                rustix::thread::futex::Flags::empty(),
                i32::MAX as u32,
            );
        }
        #[cfg(not(target_os = "linux"))]
        let _ = word;
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the path still names the file this maps (not removed by the last member to
    /// leave, nor replaced).
    pub fn still_linked(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            rustix::fs::lstat(&self.path).is_ok_and(|s| (s.st_dev, s.st_ino) == self.identity)
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    }

    /// Removes the file if the path still names it. Processes that mapped it keep their
    /// mapping; the next one to join makes a new file.
    pub fn unlink(&self) {
        if self.still_linked() {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// Whether this call made the file (and ran `init`).
    pub fn created(&self) -> bool {
        self.created
    }
}

impl Drop for MappedSegment {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, of this length; no reference into it outlives
        // `self` (every accessor borrows `self`).
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.words * 8);
        }
    }
}

/// This process's effective user id.
pub fn effective_uid() -> u32 {
    #[cfg(unix)]
    {
        rustix::process::geteuid().as_raw()
    }
    #[cfg(not(unix))]
    {
        0
    }
}

/// Whether a process `pid` exists (it may be another user's: `EPERM` says it exists).
pub fn pid_exists(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Some(p) = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        else {
            return false;
        };
        !matches!(
            rustix::process::test_kill_process(p),
            Err(rustix::io::Errno::SRCH)
        )
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// An exclusive lock on a segment's membership changes: `flock` on a sibling file
/// (`<segment>.lock`) that the kernel releases when its holder dies, so a member killed while
/// it joins or leaves costs the others nothing. Held only while a process joins (open,
/// create, claim a slot) or leaves (free its slot, remove the files when it was the last):
/// never on the allocation path.
#[derive(Debug)]
pub struct MembershipLock {
    /// Closing it releases the lock.
    #[cfg(target_os = "linux")]
    _fd: rustix::fd::OwnedFd,
    path: PathBuf,
}

impl MembershipLock {
    /// The lock file of the segment at `segment`.
    pub fn path_of(segment: &Path) -> PathBuf {
        let mut name = segment.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    }

    /// Takes the lock of the segment at `segment`, trying until `wait` has passed (`None`
    /// then: a holder that does not let go — stopped, or hung — is not waited for forever).
    /// A lock file removed (by the last member to leave) between our open and our lock is
    /// opened again, so the lock held is always the one the path names.
    ///
    /// # Errors
    /// A [`MapProblem`] for a lock file that cannot be opened (another user's, a link).
    #[cfg(target_os = "linux")]
    pub fn acquire(
        segment: &Path,
        access: Access,
        wait: std::time::Duration,
    ) -> Result<Option<MembershipLock>, MapProblem> {
        use rustix::fs::{self, FlockOperation, Mode, OFlags};
        let path = MembershipLock::path_of(segment);
        let mode = Mode::from_raw_mode(if access.group.is_some() { 0o660 } else { 0o600 });
        let started = std::time::Instant::now();
        loop {
            let fd = fs::open(
                &path,
                OFlags::RDWR
                    | OFlags::CREATE
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC
                    | OFlags::NONBLOCK,
                mode,
            )
            .map_err(|e| match e {
                rustix::io::Errno::LOOP => MapProblem::NotRegularFile,
                e => MapProblem::Io(format!("open {}: {e}", path.display())),
            })?;
            let stat = fs::fstat(&fd).map_err(|e| MapProblem::Io(format!("fstat: {e}")))?;
            if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(MapProblem::NotRegularFile);
            }
            let ours = rustix::process::geteuid().as_raw();
            if stat.st_uid != ours && !access.group.is_some_and(|g| g == stat.st_gid) {
                return Err(MapProblem::OtherOwner {
                    uid: stat.st_uid,
                    ours,
                });
            }
            loop {
                match fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => break,
                    Err(rustix::io::Errno::WOULDBLOCK) | Err(rustix::io::Errno::INTR) => {
                        if started.elapsed() >= wait {
                            return Ok(None);
                        }
                        std::thread::sleep(std::time::Duration::from_micros(200));
                    }
                    Err(e) => return Err(MapProblem::Io(format!("flock: {e}"))),
                }
            }
            // Still the file the path names? (Its last holder may have removed it.)
            let same =
                fs::lstat(&path).is_ok_and(|s| (s.st_dev, s.st_ino) == (stat.st_dev, stat.st_ino));
            if same {
                return Ok(Some(MembershipLock { _fd: fd, path }));
            }
            if started.elapsed() >= wait {
                return Ok(None);
            }
        }
    }

    /// Not Linux: no lock to take (shared segments are Linux only).
    ///
    /// # Errors
    /// Always [`MapProblem::Unsupported`].
    #[cfg(not(target_os = "linux"))]
    pub fn acquire(
        _segment: &Path,
        _access: Access,
        _wait: std::time::Duration,
    ) -> Result<Option<MembershipLock>, MapProblem> {
        Err(MapProblem::Unsupported)
    }

    /// Removes the lock file while holding it (the last member leaving): a process waiting on
    /// it finds, once it has it, that the path names another file or none, and opens again.
    pub fn remove_file(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// This process's id, read once per process and again after a `fork` (a `pthread_atfork`
/// child handler forgets it): `getpid` is a system call, and the budget's hot path asks.
pub fn current_pid() -> u32 {
    use std::sync::atomic::Ordering;
    static PID: AtomicU32 = AtomicU32::new(0);
    static HOOKED: std::sync::Once = std::sync::Once::new();
    extern "C" fn forget() {
        PID.store(0, Ordering::Relaxed);
    }
    HOOKED.call_once(|| {
        // SAFETY: registers a child handler that only stores to an atomic (async-signal-safe,
        // as a handler run in a forked child must be); no prepare or parent handler.
        unsafe {
            libc::pthread_atfork(None, None, Some(forget));
        }
    });
    match PID.load(Ordering::Relaxed) {
        0 => {
            let pid = std::process::id();
            PID.store(pid, Ordering::Relaxed);
            pid
        }
        pid => pid,
    }
}
