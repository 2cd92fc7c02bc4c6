//! A stream portalloc makes and owns: the safe face of [`Device::create_stream`] and
//! [`Device::destroy_stream`] for strategies (`#![deny(unsafe_code)]`), as `vmm`'s sleep and
//! wake copy on a stream of their own — never on a caller's, which may be destroyed while the
//! copies' allocations sleep.
//!
//! The handle never leaves this value except as a [`Stream`] to queue work on, and
//! [`OwnedStream::destroy`] consumes it after waiting for that work: no copy of the handle is
//! used after its stream is gone. Dropped without `destroy` (it cannot reach its device from
//! `Drop`), the stream is left to the process, as [`Device::create_stream`] says of a stream
//! never destroyed.

use crate::device::{Device, Stream};
use crate::error::Result;

/// A stream made by portalloc for its own work. See the module.
#[derive(Debug)]
pub struct OwnedStream {
    stream: Stream,
}

impl OwnedStream {
    /// Makes a stream on `device`.
    ///
    /// # Errors
    /// The device's error from [`Device::create_stream`].
    pub fn new<D: Device + ?Sized>(device: &D) -> Result<OwnedStream> {
        Ok(OwnedStream {
            stream: device.create_stream()?,
        })
    }

    /// The stream, to queue work on while this value lives.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// Waits for the work queued on the stream, then destroys it.
    ///
    /// # Errors
    /// The device's error: when the wait fails, the stream is left to the process (work may
    /// still be queued on it).
    pub fn destroy<D: Device + ?Sized>(self, device: &D) -> Result<()> {
        device.synchronize_stream(self.stream)?;
        // SAFETY: the stream was made by `device` (`new`) and only its copy here remains:
        // `self` is consumed, and the work queued on it has completed (waited for above).
        unsafe { device.destroy_stream(self.stream) }
    }
}
