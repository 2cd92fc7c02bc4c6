//! The host device's [`Interprocess`]: memory another process maps, by the drivers' rules.
//!
//! - **Shareable handles.** Physical memory is already a memory file (`memfd`), so its export
//!   is a new descriptor of that file, and an import maps it: the importer sees the exporter's
//!   bytes, and the file lives while any process holds a descriptor or a mapping, as a
//!   driver's shareable handle keeps its memory. The importer's device charges the imported
//!   bytes against its own capacity: each process's host device is a device of its own.
//! - **Legacy IPC handles.** A plain allocation is anonymous memory. Its first export moves
//!   its bytes into a memory file mapped over the same addresses (the pointer does not
//!   change) and keeps that file until the allocation is freed. The 64 handle bytes say where
//!   the file is — the exporter's pid, its start time, the descriptor's number — and an
//!   importer opens it through `/proc/<pid>/fd/<n>`, which the kernel allows a process of the
//!   same user (`PTRACE_MODE_READ`, which Yama's scope 1 does not restrict). A serial counts
//!   the process's exports, so a descriptor number reused for another allocation is never
//!   taken for an earlier one. Every byte is written: the same allocation's handle is the
//!   same 64 bytes each time.
//!
//! Simulated devices hold no real memory and offer neither.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::device::{Interprocess, IpcMemHandle, PhysicalHandle};
use crate::error::{Error, Result};

use super::books::BACKEND;
use super::{os, HostDevice};

/// "PAHOSTIP": the first 8 bytes of a host IPC handle.
const IPC_MAGIC: u64 = u64::from_le_bytes(*b"PAHOSTIP");

/// A plain allocation exported through a legacy IPC handle: the memory file now behind it.
#[derive(Debug)]
pub(super) struct ExportedPlain {
    // Never read: held so that the descriptor number in the handle names this file until the
    // allocation is freed.
    #[allow(dead_code)]
    file: OwnedFd,
    handle: IpcMemHandle,
}

/// An allocation of another process opened here: its mapping's length and how many opens
/// it has (the drivers map one handle once per process, and count).
#[derive(Debug, Clone, Copy)]
pub(super) struct OpenedIpc {
    len: u64,
    opens: u32,
    size: u64,
    key: (u32, i32, u64, u64),
}

/// The fields of a host IPC handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IpcFields {
    pid: u32,
    fd: i32,
    start: u64,
    size: u64,
    /// Which export of the exporter's (a process-wide count): a descriptor number the
    /// exporter reuses names another allocation.
    serial: u64,
}

/// The serial of the next plain allocation exported by this process.
static NEXT_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn encode(f: IpcFields) -> IpcMemHandle {
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(&IPC_MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&f.pid.to_le_bytes());
    b[12..16].copy_from_slice(&f.fd.to_le_bytes());
    b[16..24].copy_from_slice(&f.start.to_le_bytes());
    b[24..32].copy_from_slice(&f.size.to_le_bytes());
    b[32..40].copy_from_slice(&f.serial.to_le_bytes());
    IpcMemHandle(b)
}

fn decode(h: &IpcMemHandle) -> Result<IpcFields> {
    let b = &h.0;
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let half = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    let bad = |reason: String| Error::InvalidArgument {
        call: "open_ipc_handle",
        reason,
    };
    if word(0) != IPC_MAGIC {
        return Err(bad(format!(
            "not a host IPC handle (its first 8 bytes are {:02x?}; accepted: a handle \
             HostDevice::ipc_handle made)",
            &b[..8]
        )));
    }
    if b[40..].iter().any(|&x| x != 0) {
        return Err(bad(
            "bytes 40-63 of a host IPC handle are zero; these are not (damaged or forged)".into(),
        ));
    }
    let fields = IpcFields {
        pid: half(8),
        fd: half(12) as i32,
        start: word(16),
        size: word(24),
        serial: word(32),
    };
    if fields.pid == 0 || fields.fd < 0 || fields.size == 0 {
        return Err(bad(format!(
            "a host IPC handle names pid {}, descriptor {}, {} bytes; accepted: a live pid, \
             a descriptor ≥ 0, a non-zero size",
            fields.pid, fields.fd, fields.size
        )));
    }
    Ok(fields)
}

fn unknown(what: &'static str, ptr: u64) -> Error {
    Error::UnknownPointer {
        what,
        ptr,
        backend: BACKEND,
    }
}

fn simulated() -> Error {
    Error::Unsupported {
        what: "export and import of memory".into(),
        backend: BACKEND,
        reason: "a simulated host device holds no memory another process could map".into(),
    }
}

impl Interprocess for HostDevice {
    fn exportable_physical(&self) -> bool {
        !self.is_simulated()
    }

    /// A new descriptor of the handle's memory file.
    fn export_physical(&self, handle: PhysicalHandle) -> Result<OwnedFd> {
        let st = self.lock();
        let file = st.books.handle_file(handle)?.ok_or_else(simulated)?;
        file.try_clone().map_err(|source| Error::Os {
            call: "fcntl(F_DUPFD_CLOEXEC)",
            source,
        })
    }

    /// A handle of this device over the memory file behind `fd`, charged `size` bytes.
    fn import_physical(&self, fd: BorrowedFd<'_>, size: u64) -> Result<PhysicalHandle> {
        if self.is_simulated() {
            return Err(simulated());
        }
        let file = fd.try_clone_to_owned().map_err(|source| Error::Os {
            call: "fcntl(F_DUPFD_CLOEXEC)",
            source,
        })?;
        let found = os::file_size(&file)?;
        if found < size {
            return Err(Error::InvalidArgument {
                call: "import_physical",
                reason: format!(
                    "the descriptor's memory is {found} bytes, the exporter said {size}; \
                     accepted: a descriptor HostDevice::export_physical made, with its size"
                ),
            });
        }
        let mut st = self.lock();
        st.books.check_create(size)?;
        Ok(st.books.insert_handle(size, Some(file)))
    }

    fn ipc_handle(&self, base: u64) -> Result<IpcMemHandle> {
        if self.is_simulated() {
            return Err(simulated());
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(done) = st.exported_plain.get(&base) {
            return Ok(done.handle);
        }
        let size = st
            .books
            .allocation_size(base)
            .filter(|_| !st.opened_ipc.contains_key(&base))
            .ok_or_else(|| unknown("allocation", base))?;
        let len = self.mapped_len(size)?;
        let file = os::create_memory_file(len)?;
        // The bytes move into the file, which then replaces the anonymous pages at the same
        // addresses: the caller's pointer and contents do not change. The lock is held, so no
        // other call of this device touches the range meanwhile.
        os::copy_into_file(&file, base, len)?;
        os::map_file_fixed(base, len, &file, 0)?;
        os::protect_rw(base, len)?;
        let handle = encode(IpcFields {
            pid: crate::backends::shared_segment::current_pid(),
            fd: file.as_raw_fd(),
            start:
                crate::budget::process_start_time(crate::backends::shared_segment::current_pid())
                    .unwrap_or(0),
            size,
            serial: NEXT_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        });
        st.exported_plain
            .insert(base, ExportedPlain { file, handle });
        Ok(handle)
    }

    fn open_ipc_handle(&self, handle: &IpcMemHandle, size: u64) -> Result<u64> {
        if self.is_simulated() {
            return Err(simulated());
        }
        let f = decode(handle)?;
        if size > f.size {
            return Err(Error::InvalidArgument {
                call: "open_ipc_handle",
                reason: format!(
                    "the handle is of an allocation of {} bytes, not {size}; accepted: at most \
                     the allocation's size",
                    f.size
                ),
            });
        }
        let refuse = |reason: String| Error::InvalidArgument {
            call: "open_ipc_handle",
            reason,
        };
        let me = crate::backends::shared_segment::current_pid();
        if f.pid == me {
            // As the drivers: a process maps its own memory already.
            return Err(refuse(format!(
                "the handle is this process's own (pid {me}); open it in another process"
            )));
        }
        let key = (f.pid, f.fd, f.start, f.serial);
        {
            let mut st = self.lock();
            if let Some((&ptr, opened)) = st.opened_ipc.iter_mut().find(|(_, o)| o.key == key) {
                opened.opens += 1;
                return Ok(ptr);
            }
        }
        match crate::budget::process_start_time(f.pid) {
            Some(start) if start == f.start => {}
            _ => {
                return Err(refuse(format!(
                    "the exporting process (pid {}) has exited; a legacy IPC handle's memory \
                     dies with its exporter",
                    f.pid
                )))
            }
        }
        let path = CString::new(format!("/proc/{}/fd/{}", f.pid, f.fd)).expect("no NUL");
        let file = os::open_rw(&path)?;
        let len = self.mapped_len(f.size)?;
        if os::file_size(&file)? < len {
            return Err(refuse(format!(
                "descriptor {} of pid {} is not the allocation's memory file (smaller than its \
                 {} bytes): the allocation was freed",
                f.fd, f.pid, f.size
            )));
        }
        let ptr = os::map_file_shared(len, &file)?;
        let mut st = self.lock();
        st.books.insert_alloc(ptr, f.size, 0);
        st.opened_ipc.insert(
            ptr,
            OpenedIpc {
                len,
                opens: 1,
                size: f.size,
                key,
            },
        );
        Ok(ptr)
    }

    fn close_ipc_handle(&self, ptr: u64) -> Result<()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        let opened = st
            .opened_ipc
            .get_mut(&ptr)
            .ok_or_else(|| unknown("opened IPC memory", ptr))?;
        if opened.opens > 1 {
            opened.opens -= 1;
            return Ok(());
        }
        let OpenedIpc { len, size, .. } = *opened;
        st.timeline
            .check_unused(ptr, size, "a close of another process's memory");
        os::unmap(ptr, len)?;
        st.opened_ipc.remove(&ptr);
        st.books.remove_alloc(ptr);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_every_byte_is_written() {
        let f = IpcFields {
            pid: 4242,
            fd: 17,
            start: 99,
            size: 1 << 20,
            serial: 3,
        };
        let h = encode(f);
        assert_eq!(decode(&h).unwrap(), f);
        assert!(h.0[40..].iter().all(|&b| b == 0));
        assert_eq!(encode(f), h, "the same fields give the same 64 bytes");
    }

    #[test]
    fn forged_handles_are_refused_with_the_reason() {
        let mut h = encode(IpcFields {
            pid: 1,
            fd: 3,
            start: 1,
            size: 64,
            serial: 1,
        });
        h.0[40] = 1;
        let e = decode(&h).unwrap_err().to_string();
        assert!(e.contains("bytes 40-63"), "{e}");
        let e = decode(&IpcMemHandle([0xab; 64])).unwrap_err().to_string();
        assert!(e.contains("not a host IPC handle"), "{e}");
    }
}
