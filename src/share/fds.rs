//! Getting the exporter's descriptors into the importer, two ways.
//!
//! - **`pidfd_getfd` (the default).** A [`ShareHandle`] names the exporter's pid, start time
//!   and descriptor numbers, so its bytes are all an importer needs: they travel through any
//!   channel (a pipe, a pickle through `multiprocessing`, a file), and the importer copies
//!   each descriptor out of the exporter with `pidfd_open` + `pidfd_getfd` (Linux 5.6), as
//!   PyTorch's expandable segments (pytorch/pytorch#130890) and Open MPI's HIP VMM handles
//!   (open-mpi/ompi#13903) do. The kernel allows it to a process that may `ptrace` the
//!   exporter (same user; under Yama's `ptrace_scope` 1 only an ancestor), so the exporter
//!   declares any process of its user a permitted tracer (`PR_SET_PTRACER_ANY`) at its first
//!   export — what a same-user process may do without Yama anyway. Refused under Yama scope 2
//!   or 3, across user namespaces without the capability, or in a sandbox that filters
//!   `pidfd_getfd`.
//! - **A Unix socket (`SCM_RIGHTS`).** Where `pidfd_getfd` is refused, or the processes are in
//!   different pid namespaces, [`send`] writes the handle's bytes and its descriptors on a
//!   connected Unix stream socket and [`receive`] reads them: the importer then needs no
//!   permission over the exporter at all. It needs the socket, which the caller sets up.
//!
//! Both are plain system calls through `rustix`: no unsafe code here.
#![deny(unsafe_code)]

use std::collections::BTreeMap;
use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::handle::{ShareHandle, SharedMemory};
use crate::error::{Error, Result};

/// Descriptors received with a handle ([`receive`]): the exporter's number → the importer's
/// own descriptor of the same file.
#[derive(Debug, Default)]
pub struct ReceivedFds(pub(crate) BTreeMap<i32, OwnedFd>);

impl ReceivedFds {
    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when none came.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The exporter's descriptor numbers a handle names, each once, in order of first use.
pub(crate) fn descriptors_of(handle: &ShareHandle) -> Vec<i32> {
    let mut seen = Vec::new();
    if let SharedMemory::Mapped(pieces) = &handle.memory {
        for p in pieces {
            if !seen.contains(&p.fd) {
                seen.push(p.fd);
            }
        }
    }
    seen
}

fn share_error(what: &'static str, reason: String) -> Error {
    Error::Share { what, reason }
}

/// Lets processes of this user copy this process's descriptors (`PR_SET_PTRACER_ANY`), once.
/// Where Yama is not there (`EINVAL`) nothing needs allowing.
pub(crate) fn allow_fetching() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let _ = rustix::process::set_ptracer(rustix::process::PTracer::Any);
    });
}

/// Copies descriptor `fd` out of process `pid` (started at `start`) with `pidfd_getfd`.
///
/// # Errors
/// [`Error::Share`] naming the call and the system's reason, and what would work instead.
pub(crate) fn fetch(pid: u32, start: u64, fd: i32) -> Result<OwnedFd> {
    let what = "fetch the exporter's descriptors";
    let raw = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| share_error(what, format!("pid {pid} is not a process id")))?;
    let pidfd =
        rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()).map_err(|e| {
            share_error(
                what,
                format!("pidfd_open({pid}): {e} (the exporting process has exited)"),
            )
        })?;
    // The start time read after the pidfd pins the process: a pid reused since the export is
    // another process, whose descriptors are not the export's.
    if crate::budget::process_start_time(pid) != Some(start) {
        return Err(share_error(
            what,
            format!("process {pid} is not the exporter any more (it exited; the pid was reused)"),
        ));
    }
    rustix::process::pidfd_getfd(&pidfd, fd, rustix::process::PidfdGetfdFlags::empty()).map_err(
        |e| {
            share_error(
                what,
                format!(
                    "pidfd_getfd(pid {pid}, descriptor {fd}): {e}; where the kernel refuses it \
                     (Yama ptrace_scope 2 or 3, another user namespace, a seccomp filter), pass \
                     the handle over a Unix socket with portalloc::share::send and receive"
                ),
            )
        },
    )
}

/// Most descriptors in one message (the kernel's `SCM_MAX_FD` is 253).
const PER_MESSAGE: usize = 250;

/// Writes `handle` and the descriptors it names on `socket` (a connected Unix stream socket):
/// the bytes, then the descriptors in messages of at most 250. `fds` gives each descriptor
/// the handle names, by its number in this process (what [`crate::share::Sharing::export`]
/// keeps open).
///
/// # Errors
/// [`Error::Share`] when a descriptor the handle names is missing from `fds`, or the socket
/// refuses.
pub fn send(socket: &UnixStream, handle: &ShareHandle, fds: &[BorrowedFd<'_>]) -> Result<()> {
    let what = "send a share handle";
    let bytes = handle.to_bytes();
    let wanted = descriptors_of(handle);
    if wanted.len() != fds.len() {
        return Err(share_error(
            what,
            format!(
                "the handle names {} descriptors, {} were given",
                wanted.len(),
                fds.len()
            ),
        ));
    }
    let header = [
        (bytes.len() as u32).to_le_bytes(),
        (fds.len() as u32).to_le_bytes(),
    ]
    .concat();
    let io = |e: rustix::io::Errno| share_error(what, format!("sendmsg: {e}"));
    let mut chunks = fds.chunks(PER_MESSAGE);
    let first = chunks.next().unwrap_or(&[]);
    send_with(socket, &header, first).map_err(io)?;
    std::io::Write::write_all(&mut &*socket, &bytes)
        .map_err(|e| share_error(what, format!("write: {e}")))?;
    for chunk in chunks {
        send_with(socket, &[0], chunk).map_err(io)?;
    }
    Ok(())
}

fn send_with(socket: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> rustix::io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(PER_MESSAGE))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        control.push(SendAncillaryMessage::ScmRights(fds));
    }
    let mut sent = 0;
    while sent < data.len() {
        let n = rustix::net::sendmsg(
            socket.as_fd(),
            &[IoSlice::new(&data[sent..])],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        control.clear();
        sent += n;
    }
    Ok(())
}

/// Reads what [`send`] wrote: the handle and its descriptors, keyed by their numbers in the
/// exporter, for [`crate::share::import_with`].
///
/// # Errors
/// [`Error::Share`] when the socket closes or refuses, or fewer descriptors come than the
/// handle names; [`Error::ShareHandle`] for bytes that are not a handle. At most 1 MiB of
/// handle bytes are accepted.
pub fn receive(socket: &UnixStream) -> Result<(ShareHandle, ReceivedFds)> {
    let what = "receive a share handle";
    let mut header = [0u8; 8];
    let mut got = receive_with(socket, &mut header).map_err(|e| share_error(what, e))?;
    let len = u32::from_le_bytes(header[..4].try_into().expect("4")) as usize;
    let count = u32::from_le_bytes(header[4..].try_into().expect("4")) as usize;
    if len > 1 << 20 || count > super::handle::MAX_PIECES {
        return Err(share_error(
            what,
            format!("the sender announces {len} bytes and {count} descriptors; at most 1 MiB and {} accepted", super::handle::MAX_PIECES),
        ));
    }
    let mut bytes = vec![0u8; len];
    (&*socket)
        .read_exact(&mut bytes)
        .map_err(|e| share_error(what, format!("read: {e}")))?;
    while got.len() < count {
        let mut one = [0u8; 1];
        let more = receive_with(socket, &mut one).map_err(|e| share_error(what, e))?;
        if more.is_empty() {
            return Err(share_error(
                what,
                format!("{} of {count} descriptors came", got.len()),
            ));
        }
        got.extend(more);
    }
    let handle = ShareHandle::from_bytes(&bytes)?;
    let numbers = descriptors_of(&handle);
    if numbers.len() != got.len() {
        return Err(share_error(
            what,
            format!(
                "the handle names {} descriptors, {} came",
                numbers.len(),
                got.len()
            ),
        ));
    }
    Ok((handle, ReceivedFds(numbers.into_iter().zip(got).collect())))
}

/// Reads exactly `buf.len()` bytes, keeping the descriptors that came with the first read.
fn receive_with(socket: &UnixStream, buf: &mut [u8]) -> std::result::Result<Vec<OwnedFd>, String> {
    let mut fds = Vec::new();
    let mut filled = 0;
    while filled < buf.len() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(PER_MESSAGE))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            socket.as_fd(),
            &mut [IoSliceMut::new(&mut buf[filled..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )
        .map_err(|e| format!("recvmsg: {e}"))?;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if got.bytes == 0 {
            return Err("the socket closed".into());
        }
        filled += got.bytes;
    }
    Ok(fds)
}
