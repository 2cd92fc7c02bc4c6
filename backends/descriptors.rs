//! The process's file descriptors: how many it may hold (`RLIMIT_NOFILE`), how many it holds,
//! and raising the soft limit to the hard one.
//!
//! A driver may spend a descriptor per physical handle: ROCm 7.14's `hipMemCreate` opens a
//! dmabuf descriptor for each (ROCm/rocm-systems#10604; it did not on 7.1.1,
//! ROCm/legacy-rocm-build#6661), so at the stock soft limit of 1024 a process stops at about
//! 1015 handles — 1.98 GiB of 2 MiB handles — with `hipErrorOutOfMemory` and the device
//! nearly empty. The GPU layer finds out whether its driver does (probed at open, never
//! inferred from a version), and then tells the allocator how many handles the process can
//! still hold ([`crate::device::VirtualMemory::handle_budget`]). The HIP backend raises the
//! soft limit to the hard one when it opens a device ([`raise_soft_limit`]); `portalloc info`
//! shows the limits ([`Descriptors::now`]).
//!
//! Linux counts the open descriptors in `/proc/self/fd`; elsewhere the count is unknown and
//! nothing here guesses it.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use serde::Serialize;

/// What [`raise_soft_limit`] did, once per process.
static RAISED: OnceLock<Raise> = OnceLock::new();

/// What raising the soft limit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Raise {
    /// The soft limit was already the hard one (or both unlimited).
    AlreadyAtHard,
    /// Raised from `from` to `to` (the hard limit, or the kernel's `nr_open` where the hard
    /// limit is unlimited).
    Raised {
        /// The soft limit before.
        from: u64,
        /// The soft limit after.
        to: u64,
    },
    /// The system refused (`errno`); the soft limit is as it was.
    Refused {
        /// The soft limit, unchanged.
        soft: u64,
        /// The limit asked for.
        wanted: u64,
        /// The system's error number.
        errno: i32,
    },
    /// The limits could not be read (`errno`).
    Unknown {
        /// The system's error number.
        errno: i32,
    },
}

/// The process's descriptors at one moment: the limits, how many are open, and what
/// [`raise_soft_limit`] did (if a GPU backend called it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Descriptors {
    /// The soft `RLIMIT_NOFILE` (`None`: unlimited, or not readable).
    pub soft: Option<u64>,
    /// The hard `RLIMIT_NOFILE` (`None`: unlimited, or not readable).
    pub hard: Option<u64>,
    /// Descriptors open now (`None` where `/proc/self/fd` cannot be read).
    pub open: Option<u64>,
    /// What raising the soft limit did, when a backend raised it in this process.
    pub raised: Option<Raise>,
}

impl Descriptors {
    /// The limits and the count now.
    ///
    /// ```
    /// let d = portalloc::backends::descriptors::Descriptors::now();
    /// if let (Some(open), Some(soft)) = (d.open, d.soft) {
    ///     assert!(open <= soft);
    /// }
    /// ```
    pub fn now() -> Descriptors {
        let (soft, hard) = match limits() {
            Ok((soft, hard)) => (soft, hard),
            Err(_) => (None, None),
        };
        Descriptors {
            soft,
            hard,
            open: open_count(),
            raised: RAISED.get().copied(),
        }
    }

    /// One line for reports: `412 open of a soft limit of 1024 (hard 524288)`, and what
    /// raising it did.
    pub fn summary(&self) -> String {
        let limit = |l: Option<u64>| l.map_or_else(|| "unlimited".to_string(), |n| n.to_string());
        let open = self
            .open
            .map_or_else(|| "an unknown number".to_string(), |n| n.to_string());
        let mut text = format!(
            "{open} open of a soft limit of {} (hard {})",
            limit(self.soft),
            limit(self.hard)
        );
        match self.raised {
            Some(Raise::Raised { from, to }) => {
                text += &format!("; raised from {from} to {to} when the HIP backend opened")
            }
            Some(Raise::Refused {
                soft,
                wanted,
                errno,
            }) => {
                text += &format!(
                    "; raising {soft} to {wanted} was refused ({})",
                    std::io::Error::from_raw_os_error(errno)
                )
            }
            Some(Raise::AlreadyAtHard) | Some(Raise::Unknown { .. }) | None => {}
        }
        text
    }
}

/// `RLIMIT_NOFILE` as `(soft, hard)`, `None` for unlimited.
fn limits() -> Result<(Option<u64>, Option<u64>), i32> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: writes one `rlimit` through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(errno());
    }
    let value = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(n(v));
    Ok((value(l.rlim_cur), value(l.rlim_max)))
}

/// A limit as a `u64` (`rlim_t` is narrower on some targets).
#[allow(clippy::unnecessary_cast)]
fn n(v: libc::rlim_t) -> u64 {
    v as u64
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The soft limit: what the process may hold (`None`: unlimited or not readable).
pub(crate) fn soft_limit() -> Option<u64> {
    limits().ok().and_then(|(soft, _)| soft)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (to the kernel's `nr_open` where the
/// hard limit is unlimited), once per process: what a program that needs many descriptors
/// does at start (Python's `resource`, systemd's advice for `LimitNOFILE`). Never lowers
/// anything. Returns what it did (the first call's answer, for every later call).
///
/// Raising the soft limit lets the process open descriptors numbered 1024 and above, which
/// `select(2)` cannot watch; code that still uses `select` and opens that many would have
/// failed at the old limit anyway.
pub fn raise_soft_limit() -> Raise {
    *RAISED.get_or_init(|| {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: writes one `rlimit` through a valid pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
            return Raise::Unknown { errno: errno() };
        }
        if l.rlim_cur == l.rlim_max {
            return Raise::AlreadyAtHard;
        }
        let wanted = if l.rlim_max == libc::RLIM_INFINITY {
            // Linux refuses a soft limit above fs.nr_open (EPERM), unlimited included.
            match std::fs::read_to_string("/proc/sys/fs/nr_open")
                .ok()
                .and_then(|t| t.trim().parse::<libc::rlim_t>().ok())
            {
                Some(n) => n,
                None => l.rlim_max,
            }
        } else {
            l.rlim_max
        };
        if wanted <= l.rlim_cur {
            return Raise::AlreadyAtHard;
        }
        let raised = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: l.rlim_max,
        };
        // SAFETY: reads one `rlimit` through a valid pointer; raises the soft limit only,
        // within the hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Raise::Refused {
                soft: n(l.rlim_cur),
                wanted: n(wanted),
                errno: errno(),
            };
        }
        tracing::debug!(
            from = n(l.rlim_cur),
            to = n(wanted),
            "raised the soft RLIMIT_NOFILE to the hard limit"
        );
        Raise::Raised {
            from: n(l.rlim_cur),
            to: n(wanted),
        }
    })
}

/// The descriptors open now, by number (`None` where `/proc/self/fd` cannot be read). The
/// one the listing itself holds open is left out.
pub(crate) fn open_set() -> Option<BTreeSet<u32>> {
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    let mut set: BTreeSet<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // The listing's own descriptor (closed by now) is listed too: the first listed that is
    // no longer open, usually the lowest number free before the listing.
    let listed: Vec<u32> = set.iter().copied().collect();
    for fd in listed {
        // SAFETY: F_GETFD only asks whether `fd` is open; it changes nothing.
        if unsafe { libc::fcntl(fd as libc::c_int, libc::F_GETFD) } == -1 {
            set.remove(&fd);
            break;
        }
    }
    Some(set)
}

/// How many descriptors are open now (`None` where it cannot be counted).
pub(crate) fn open_count() -> Option<u64> {
    open_set().map(|s| s.len() as u64)
}

/// How many more descriptors the process may open now: the soft limit less those open
/// (`None`: unlimited, or not countable).
// The GPU layer's: unused by a build with the host backend only.
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
pub(crate) fn headroom() -> Option<u64> {
    let soft = soft_limit()?;
    Some(soft.saturating_sub(open_count()?))
}

/// True when the process cannot open another descriptor now (`EMFILE`: its limit; `ENFILE`:
/// the system's): tried with `/dev/null`, closed again at once.
// The GPU layer's: unused by a build with the host backend only.
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
pub(crate) fn exhausted() -> bool {
    // SAFETY: a NUL-terminated path; the descriptor, if any, is closed just below.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: the descriptor just opened, closed once.
        unsafe { libc::close(fd) };
        return false;
    }
    matches!(errno(), libc::EMFILE | libc::ENFILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Other tests of this binary open files meanwhile: only this test's descriptor is
    // checked, by number.
    #[test]
    fn the_listing_sees_a_descriptor_opened() {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open("/dev/null").unwrap();
        let fd = file.as_raw_fd() as u32;
        let during = open_set().expect("/proc/self/fd on Linux");
        assert!(during.contains(&fd), "{fd} in {during:?}");
        assert!(
            open_count().unwrap() >= 4,
            "stdin, stdout, stderr and the file"
        );
        drop(file);
    }

    #[test]
    fn raising_never_lowers_and_answers_the_same_twice() {
        let soft = soft_limit();
        let first = raise_soft_limit();
        assert_eq!(raise_soft_limit(), first);
        match (soft, soft_limit()) {
            (Some(a), Some(b)) => assert!(b >= a, "{a} → {b}"),
            (None, after) => assert_eq!(after, None),
            (Some(_), None) => {}
        }
        assert!(!exhausted());
    }
}
