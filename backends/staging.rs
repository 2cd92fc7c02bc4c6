//! Host memory that holds a copy of device memory: what `vmm`'s sleep keeps of an allocation
//! while its device memory is handed back. The one safe face of the device's unsafe copy and
//! pinned-memory calls ([`Device::copy_to_host`], [`Device::copy_from_host`],
//! [`Device::alloc_pinned_host`]), so that strategies (`#![deny(unsafe_code)]`) can use them.
//!
//! A [`HostCopy`] owns its bytes — page-locked where the device offers it (`cuMemHostAlloc`,
//! `hipHostMalloc`: copies reach them at full bandwidth), ordinary memory otherwise — and
//! remembers the stream its last copy was queued on. Nothing frees the bytes while a copy may
//! still be writing or reading them: [`HostCopy::free`] waits for that stream first, and a
//! `HostCopy` dropped without `free` (it cannot reach its device from `Drop`) leaks its bytes
//! rather than freeing memory a copy may still use.

use std::ptr::NonNull;

use crate::device::{Device, Stream};
use crate::error::{Error, Result};

/// Where a [`HostCopy`]'s bytes come from.
#[derive(Debug)]
enum Bytes {
    /// From [`Device::alloc_pinned_host`]; freed with [`Device::free_pinned_host`].
    Pinned(NonNull<u8>),
    /// Ordinary memory, where the device offers no pinned memory (or refused it).
    Plain(Box<[u8]>),
}

/// `len` bytes of host memory for copies to and from one device. See the module.
#[derive(Debug)]
pub struct HostCopy {
    bytes: Option<Bytes>,
    len: u64,
    /// The stream of the last copy queued to or from these bytes, until it is known
    /// complete. Invariant: `None` only when no copy of them can be in flight.
    in_flight: Option<Stream>,
}

// SAFETY: the bytes are owned by this value alone (pinned memory is plain host memory the
// driver page-locked); nothing else holds the pointer but copies this value queued, which it
// waits for before the bytes go.
unsafe impl Send for HostCopy {}
// SAFETY: `&HostCopy` reads nothing through the pointer; copies need `&mut` or the device.
unsafe impl Sync for HostCopy {}

impl HostCopy {
    /// `len` bytes (not zero-filled where pinned) of host memory for copies with `device`:
    /// pinned where it offers that, ordinary memory otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidSize`] for a size this process cannot address; the system's refusal
    /// of ordinary memory is an abort, as for any allocation.
    pub fn new<D: Device + ?Sized>(device: &D, len: u64) -> Result<HostCopy> {
        let size = usize::try_from(len).map_err(|_| Error::InvalidSize {
            size: len,
            reason: "more bytes than this process can address",
        })?;
        let bytes = match device.alloc_pinned_host(len) {
            Ok(Some(ptr)) => Bytes::Pinned(ptr),
            Ok(None) => Bytes::Plain(vec![0; size].into_boxed_slice()),
            Err(e) => {
                tracing::debug!(bytes = len, error = %e,
                    "no pinned host memory for a copy; ordinary memory instead");
                Bytes::Plain(vec![0; size].into_boxed_slice())
            }
        };
        Ok(HostCopy {
            bytes: Some(bytes),
            len,
            in_flight: None,
        })
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a copy of no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the bytes are page-locked (from the device's pinned memory).
    pub fn is_pinned(&self) -> bool {
        matches!(self.bytes, Some(Bytes::Pinned(_)))
    }

    fn ptr(&mut self) -> *mut u8 {
        match &mut self.bytes {
            Some(Bytes::Pinned(p)) => p.as_ptr(),
            Some(Bytes::Plain(b)) => b.as_mut_ptr(),
            None => NonNull::dangling().as_ptr(),
        }
    }

    /// Queues a copy of the device's `[src, src + len)` into these bytes on `stream`, after
    /// the work queued there. Any copy of them queued on another stream is waited for first
    /// (a CPU wait), so two copies never use them at once.
    ///
    /// # Errors
    /// The device's refusal (a range not mapped with access, say); the wait's failure.
    pub fn download<D: Device + ?Sized>(
        &mut self,
        device: &D,
        src: u64,
        stream: Stream,
    ) -> Result<()> {
        self.order_after(device, stream)?;
        let dst = self.ptr();
        // SAFETY: `dst` is valid for writes of `self.len` bytes, owned by `self`, and stays so
        // until the copy completes: `in_flight` is set below, and `free` (the only way the
        // bytes go) waits for that stream; no other copy of these bytes is in flight on
        // another stream (`order_after`). The device range is the device's to check: the
        // backends refuse one not mapped with access.
        unsafe { device.copy_to_host(dst, src, self.len, stream) }?;
        self.in_flight = Some(stream);
        Ok(())
    }

    /// Queues a copy of these bytes to the device's `[dst, dst + len)` on `stream`, after
    /// the work queued there (and after any copy of them on another stream, waited for).
    ///
    /// # Errors
    /// As [`HostCopy::download`].
    pub fn upload<D: Device + ?Sized>(
        &mut self,
        device: &D,
        dst: u64,
        stream: Stream,
    ) -> Result<()> {
        self.order_after(device, stream)?;
        let src = self.ptr();
        // SAFETY: as in `download`: `src` is valid for reads of `self.len` bytes until the
        // copy completes, which `free` waits for.
        unsafe { device.copy_from_host(dst, src, self.len, stream) }?;
        self.in_flight = Some(stream);
        Ok(())
    }

    /// Waits (on the CPU) for a copy in flight on a stream other than `stream`.
    fn order_after<D: Device + ?Sized>(&mut self, device: &D, stream: Stream) -> Result<()> {
        match self.in_flight {
            Some(s) if s != stream || s.is_per_thread() => self.settle(device),
            _ => Ok(()),
        }
    }

    /// Waits for the copy in flight, if any: the stream it was queued on is synchronised (the
    /// whole device when that fails).
    ///
    /// # Errors
    /// Neither could be waited for: the copy may still be in flight (and `in_flight` stays).
    pub fn settle<D: Device + ?Sized>(&mut self, device: &D) -> Result<()> {
        if let Some(stream) = self.in_flight {
            // The per-thread stream names another stream on each thread: the copy's may be
            // another thread's, which only the whole device covers.
            if stream.is_per_thread() {
                device.synchronize_device()?;
            } else if let Err(e) = device.synchronize_stream(stream) {
                device.synchronize_device().map_err(|_| e)?;
            }
            self.in_flight = None;
        }
        Ok(())
    }

    /// The bytes, once no copy is in flight; `None` while one may be.
    pub fn bytes(&self) -> Option<&[u8]> {
        if self.in_flight.is_some() {
            return None;
        }
        let len = self.len as usize;
        Some(match self.bytes.as_ref()? {
            // SAFETY: the pinned block holds `len` bytes, owned by `self`, which no copy is
            // writing (none in flight); they were written by a completed download or are the
            // driver's fresh memory (initialised by `new`'s caller's first download before it
            // reads them: a sleeping allocation's copy is read only after its download).
            Bytes::Pinned(p) => unsafe { std::slice::from_raw_parts(p.as_ptr(), len) },
            Bytes::Plain(b) => &b[..],
        })
    }

    /// Frees the bytes, after the copy in flight (if any) completes.
    ///
    /// # Errors
    /// The copy in flight could not be waited for (the bytes are then leaked, not freed);
    /// the device's refusal to free pinned memory.
    pub fn free<D: Device + ?Sized>(mut self, device: &D) -> Result<()> {
        self.settle(device)?;
        match self.bytes.take() {
            // SAFETY: from this device's `alloc_pinned_host` with `self.len` bytes, no copy
            // in flight (settled above), never used again (taken out of `self`).
            // Once more where the device refuses (a refused free frees nothing).
            Some(Bytes::Pinned(p)) => unsafe { device.free_pinned_host(p, self.len) }
                // SAFETY: the same promise, the first call having freed nothing.
                .or_else(|_| unsafe { device.free_pinned_host(p, self.len) }),
            Some(Bytes::Plain(_)) | None => Ok(()),
        }
    }
}

impl Drop for HostCopy {
    /// Leaks the bytes: they may be pinned memory only the device can free, or the target
    /// of a copy still in flight. [`HostCopy::free`] is the way to give them back.
    fn drop(&mut self) {
        if let Some(bytes) = self.bytes.take() {
            tracing::warn!(
                bytes = self.len,
                "a host copy dropped without free is leaked"
            );
            if let Bytes::Plain(b) = bytes {
                std::mem::forget(b);
            }
        }
    }
}
