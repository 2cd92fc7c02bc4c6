//! The operating-system layer of the host backend: every raw `libc` call lives here.
//!
//! The functions take addresses and lengths that the books (`books.rs`) have already
//! validated; they only translate one operation into the system calls that perform it and
//! turn a failure into [`Error::Os`] with the OS error. Nothing here keeps state.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::error::{Error, Result};

/// The last OS error as an [`Error::Os`] for `call`.
fn last_error(call: &'static str) -> Error {
    Error::Os {
        call,
        source: io::Error::last_os_error(),
    }
}

/// Converts an address or length to the pointer-sized type the kernel takes.
fn usize_of(call: &'static str, value: u64) -> Result<usize> {
    usize::try_from(value).map_err(|_| Error::InvalidArgument {
        call,
        reason: format!("{value:#x} does not fit this machine's address width"),
    })
}

/// The size of a memory page, in bytes.
pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant; it has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// The machine's physical memory in bytes, when the system says.
pub(crate) fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf only reads a system constant; it has no memory-safety preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    let pages = u64::try_from(pages).ok().filter(|&p| p > 0)?;
    pages.checked_mul(page_size())
}

/// Asks glibc's `malloc` to keep the memory the process frees for its later allocations
/// instead of handing it back to the kernel at once: blocks up to 32 MiB come from the heap
/// (not a mapping of their own, unmapped when freed) and up to 64 MiB free at the heap's top
/// stay there. Returns whether `malloc` took both settings; `false` elsewhere than glibc.
///
/// Each page the kernel hands out again is faulted in on first touch: a replay that follows
/// the reading of its trace otherwise pays to fault back in what the reader had just freed.
#[cfg(all(feature = "replay", target_os = "linux", target_env = "gnu"))]
pub(crate) fn keep_freed_heap() -> bool {
    // SAFETY: mallopt only changes malloc's tuning parameters (it takes the arena locks
    // itself); it touches no memory of the caller and may be called at any time.
    let heap = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) };
    // SAFETY: as above.
    let top = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20) };
    heap == 1 && top == 1
}

/// See the glibc version: other C libraries are left as they are.
#[cfg(all(feature = "replay", not(all(target_os = "linux", target_env = "gnu"))))]
pub(crate) fn keep_freed_heap() -> bool {
    false
}

/// Maps `len` bytes (a multiple of the page size) of fresh, readable and writable private
/// memory anywhere, and returns its page-aligned address.
pub(crate) fn map_anonymous(len: u64) -> Result<u64> {
    map_anonymous_with(len, 0)
}

/// As [`map_anonymous`], with every page made present at once (`MAP_POPULATE`): what a
/// driver's page-locked host memory is, and what copies into it then need not fault in page
/// by page.
pub(crate) fn map_anonymous_populated(len: u64) -> Result<u64> {
    map_anonymous_with(len, libc::MAP_POPULATE)
}

fn map_anonymous_with(len: u64, flags: libc::c_int) -> Result<u64> {
    let len = usize_of("mmap", len)?;
    // SAFETY: a NULL hint without MAP_FIXED lets the kernel pick an unused range, so no
    // existing mapping (and hence no Rust object) is affected; the result is checked.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(last_error("mmap"));
    }
    Ok(ptr as u64)
}

/// Unmaps `[addr, addr + len)`, which this backend mapped itself (an allocation or a whole
/// reservation, with whatever is mapped inside it).
pub(crate) fn unmap(addr: u64, len: u64) -> Result<()> {
    let len = usize_of("munmap", len)?;
    // SAFETY: the books guarantee that the range is one this backend mapped and still owns;
    // no Rust reference points into device memory, so removing the pages invalidates nothing
    // the compiler relies on (callers holding raw device addresses own that contract).
    let rc = unsafe { libc::munmap(addr as *mut libc::c_void, len) };
    if rc != 0 {
        return Err(last_error("munmap"));
    }
    Ok(())
}

/// Reserves `len` bytes of inaccessible address space aligned to `align` (a power of two,
/// both multiples of `page`), committing no memory. Over-reserves by `align - page` and trims.
pub(crate) fn reserve(len: u64, align: u64, page: u64) -> Result<u64> {
    let slack = align.saturating_sub(page);
    let total = len
        .checked_add(slack)
        .ok_or_else(|| Error::InvalidArgument {
            call: "reserve",
            reason: format!("{len} bytes aligned to {align} overflows the address space"),
        })?;
    let total_usize = usize_of("mmap", total)?;
    // SAFETY: a NULL hint without MAP_FIXED lets the kernel pick an unused range, so no
    // existing mapping is affected; PROT_NONE + MAP_NORESERVE commits no memory; the result
    // is checked.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total_usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(last_error("mmap"));
    }
    let base = ptr as u64;
    let aligned = base.next_multiple_of(align);
    let head = aligned - base;
    let tail = total - head - len;
    let trimmed = (if head > 0 { unmap(base, head) } else { Ok(()) }).and_then(|()| {
        if tail > 0 {
            unmap(aligned + len, tail)
        } else {
            Ok(())
        }
    });
    if let Err(e) = trimmed {
        // Give the whole range back rather than leak it; the first error is the one to
        // report.
        let _ = unmap(base, total);
        return Err(e);
    }
    Ok(aligned)
}

/// `MAP_FIXED_NOREPLACE` (Linux 4.17): place a mapping at the hint exactly or fail with
/// `EEXIST`, never replacing what is mapped there. Elsewhere none: a plain hint.
#[cfg(target_os = "linux")]
const FIXED_NOREPLACE: libc::c_int = libc::MAP_FIXED_NOREPLACE;
#[cfg(not(target_os = "linux"))]
const FIXED_NOREPLACE: libc::c_int = 0;

/// As [`reserve`], at `addr` (a multiple of `align`) when the kernel gives that range:
/// `MAP_FIXED_NOREPLACE`, which fails rather than replace a mapping (a kernel before 4.17
/// ignores the flag and takes `addr` as a plain hint, which never replaces one either). When
/// the range is taken, or the kernel placed it elsewhere, the reservation is made anywhere,
/// as [`reserve`] makes it.
pub(crate) fn reserve_at(len: u64, align: u64, page: u64, addr: u64) -> Result<u64> {
    let len_usize = usize_of("mmap", len)?;
    // SAFETY: no MAP_FIXED: with MAP_FIXED_NOREPLACE the kernel fails (EEXIST) rather than
    // replace an existing mapping, and without it `addr` is only a hint; either way no
    // mapping (and hence no Rust object) is affected. PROT_NONE + MAP_NORESERVE commits no
    // memory; the result is checked.
    let ptr = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len_usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if ptr != libc::MAP_FAILED {
        let got = ptr as u64;
        if got == addr {
            return Ok(addr);
        }
        // A plain hint the kernel placed elsewhere, maybe misaligned: given back, and made
        // anywhere aligned below.
        unmap(got, len)?;
    }
    reserve(len, align, page)
}

/// Puts inaccessible, uncommitted address space back over `[addr, addr + len)` (inside a
/// reservation of this backend), replacing whatever was mapped there.
pub(crate) fn rereserve(addr: u64, len: u64) -> Result<()> {
    let len = usize_of("mmap", len)?;
    // SAFETY: MAP_FIXED replaces only [addr, addr + len), which the books guarantee lies
    // inside a reservation this backend owns (no Rust object lives there); the result is
    // checked.
    let ptr = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(last_error("mmap"));
    }
    Ok(())
}

/// Creates `len` bytes of physical memory as an anonymous memory file, its pages allocated
/// at once where the kernel can.
pub(crate) fn create_memory_file(len: u64) -> Result<OwnedFd> {
    const NAME: &CStr = c"portalloc-host-physical";
    let flen = libc::off_t::try_from(len).map_err(|_| Error::InvalidArgument {
        call: "create_physical",
        reason: format!("{len} bytes does not fit a file size on this machine"),
    })?;
    // SAFETY: NAME is a valid NUL-terminated string that outlives the call; the returned
    // descriptor is checked before use.
    let fd = unsafe { libc::memfd_create(NAME.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(last_error("memfd_create"));
    }
    // SAFETY: `fd` was just returned by memfd_create, is open, and is owned by nothing else,
    // so OwnedFd becomes its only owner and closes it exactly once.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `fd` is an open descriptor owned by this function; ftruncate only sets the
    // file's size.
    let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), flen) };
    if rc != 0 {
        return Err(last_error("ftruncate"));
    }
    // The pages allocated now, as a driver's physical memory is at creation: the memory is
    // there or the call fails (no SIGBUS at a first touch later), and copies into it need
    // not allocate page by page. Where the file system cannot (an old kernel), first touch.
    // SAFETY: `fd` is an open descriptor owned by this function; fallocate only allocates
    // the file's blocks within its size.
    if unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, flen) } != 0 {
        let e = std::io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::ENOMEM)) {
            return Err(Error::Os {
                call: "fallocate",
                source: e,
            });
        }
    }
    Ok(fd)
}

/// Maps `len` bytes of the memory file `fd`, from `offset`, at exactly `addr` (inside a
/// reservation of this backend), still inaccessible (`PROT_NONE`) until [`protect_rw`].
pub(crate) fn map_file_fixed(addr: u64, len: u64, fd: &OwnedFd, offset: u64) -> Result<()> {
    let len = usize_of("mmap", len)?;
    let offset = libc::off_t::try_from(offset).map_err(|_| Error::InvalidArgument {
        call: "map",
        reason: format!("offset {offset} does not fit a file offset on this machine"),
    })?;
    // SAFETY: MAP_FIXED replaces only [addr, addr + len), which the books guarantee lies
    // inside a reservation this backend owns and is not mapped (no Rust object lives there);
    // `fd` is open for the duration of the call and offset + len is within its size.
    let ptr = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            offset,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(last_error("mmap"));
    }
    Ok(())
}

/// Makes `[addr, addr + len)` (mapped memory of this backend) readable and writable.
pub(crate) fn protect_rw(addr: u64, len: u64) -> Result<()> {
    let (len, read_write) = (
        usize_of("mprotect", len)?,
        libc::PROT_READ | libc::PROT_WRITE,
    );
    // SAFETY: the books guarantee the range is entirely mapped by this backend; changing its
    // protection to allow more access cannot invalidate any Rust object.
    if unsafe { libc::mprotect(addr as *mut libc::c_void, len, read_write) } != 0 {
        return Err(last_error("mprotect"));
    }
    // Page tables made at once, as a GPU's mapping is complete once set_access returns: the
    // first writes (a wake's copy, a kernel of the test) then take no fault per page. A
    // kernel before 5.14 lacks MADV_POPULATE_WRITE: first touch, as before.
    // SAFETY: the range is mapped by this backend, readable and writable (just set); the
    // advice only makes its pages present.
    let _ = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
    Ok(())
}

/// The size of the file behind `fd`.
pub(crate) fn file_size(fd: &OwnedFd) -> Result<u64> {
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct, overwritten below.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open; fstat writes one `stat` through a valid pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(last_error("fstat"));
    }
    Ok(u64::try_from(st.st_size).unwrap_or(0))
}

/// Writes the `len` bytes at `addr` (readable memory of this backend) into the file `fd`
/// from its start.
pub(crate) fn copy_into_file(fd: &OwnedFd, addr: u64, len: u64) -> Result<()> {
    let mut done = 0u64;
    while done < len {
        let n = usize_of("pwrite", len - done)?;
        let at = libc::off_t::try_from(done).map_err(|_| Error::InvalidArgument {
            call: "pwrite",
            reason: format!("offset {done} does not fit a file offset on this machine"),
        })?;
        // SAFETY: `[addr + done, addr + len)` is readable memory of this backend (a live
        // allocation, the caller holds the device's lock); `fd` is open.
        let wrote =
            unsafe { libc::pwrite(fd.as_raw_fd(), (addr + done) as *const libc::c_void, n, at) };
        if wrote <= 0 {
            return Err(last_error("pwrite"));
        }
        done += wrote as u64;
    }
    Ok(())
}

/// Opens `path` read and write, close-on-exec.
pub(crate) fn open_rw(path: &CStr) -> Result<OwnedFd> {
    // SAFETY: `path` is a valid NUL-terminated string for the call; the result is checked.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(last_error("open"));
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Maps `len` bytes of the file `fd` from its start, shared, readable and writable,
/// wherever the system puts them.
pub(crate) fn map_file_shared(len: u64, fd: &OwnedFd) -> Result<u64> {
    let n = usize_of("mmap", len)?;
    // SAFETY: a new mapping at an address the kernel picks replaces nothing; `fd` is open.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            n,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(last_error("mmap"));
    }
    Ok(ptr as u64)
}
