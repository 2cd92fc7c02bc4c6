//! [`CallLog`]: a [`Device`] that keeps the calls made of the device beneath it, in order —
//! what a timeline of the device's time is modelled from (`replay::costs`), where counts
//! alone cannot say what overlaps what: a copy queued on a stream runs while the CPU makes
//! the next calls.
#![deny(unsafe_code)]

use std::sync::{Arc, Mutex, PoisonError};

use super::forward::{Call, DeviceWrapper};
use crate::device::Device;
use crate::error::Result;

/// One call as the device beneath saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedCall {
    /// Its name ([`Call::NAMES`]).
    pub name: &'static str,
    /// The bytes it acted on ([`Call::bytes`]).
    pub bytes: u64,
    /// The stream it queued work on or waited for (copies, `synchronize_stream`,
    /// `record_event`, `wait_event`), as the stream's raw handle.
    pub stream: Option<u64>,
    /// The event it recorded, waited for or queried.
    pub event: Option<u64>,
}

impl LoggedCall {
    fn of(call: &Call<'_>) -> LoggedCall {
        let (stream, event) = match *call {
            Call::SynchronizeStream(s) => (Some(s.0), None),
            Call::CopyToHost { stream, .. }
            | Call::CopyFromHost { stream, .. }
            | Call::AllocAsync { stream, .. }
            | Call::FreeAsync { stream, .. } => (Some(stream.0), None),
            Call::RecordEvent { event, stream } | Call::WaitEvent { stream, event } => {
                (Some(stream.0), Some(event.0))
            }
            Call::EventComplete(e) | Call::SynchronizeEvent(e) | Call::DestroyEvent(e) => {
                (None, Some(e.0))
            }
            _ => (None, None),
        };
        LoggedCall {
            name: call.name(),
            bytes: call.bytes(),
            stream,
            event,
        }
    }
}

/// Keeps every call made of `inner`, failed or not, in order, while logging is on (from
/// [`CallLog::new`] until [`CallLog::take`] empties it, which logging goes on after).
#[derive(Debug)]
pub struct CallLog<D: Device + ?Sized> {
    inner: Arc<D>,
    calls: Mutex<Vec<LoggedCall>>,
}

impl<D: Device + ?Sized> CallLog<D> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<D>) -> Self {
        CallLog {
            inner,
            calls: Mutex::new(Vec::new()),
        }
    }

    /// The calls logged since the last `take`, in order; the log starts empty again.
    pub fn take(&self) -> Vec<LoggedCall> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl<D: Device + ?Sized> DeviceWrapper for CallLog<D> {
    type Inner = D;

    fn wrapped(&self) -> &D {
        &self.inner
    }

    fn before(&self, call: &Call<'_>) -> Result<()> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(LoggedCall::of(call));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::host::HostDevice;
    use crate::device::Stream;

    #[test]
    #[allow(unsafe_code)]
    fn keeps_the_calls_in_order_with_their_streams() {
        let host = HostDevice::builder()
            .capacity(64 << 20)
            .simulated(true)
            .build()
            .unwrap();
        let dev = CallLog::new(Arc::new(host));
        let p = dev.alloc(1 << 20).unwrap();
        let s = dev.create_stream().unwrap();
        let mut buf = [0u8; 8];
        // SAFETY: `buf` outlives the copy (synchronised below); `p` is live, 1 MiB.
        unsafe { dev.copy_to_host(buf.as_mut_ptr(), p, 8, s) }.unwrap();
        dev.synchronize_stream(s).unwrap();
        dev.free(p, 1 << 20).unwrap();
        let log = dev.take();
        let names: Vec<_> = log.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "alloc",
                "create_stream",
                "copy_to_host",
                "synchronize_stream",
                "free"
            ]
        );
        assert_eq!((log[2].bytes, log[2].stream), (8, Some(s.0)));
        assert_eq!(log[3].stream, Some(s.0));
        assert_ne!(s, Stream::DEFAULT);
        assert!(dev.take().is_empty(), "taken");
        // SAFETY: `s` was made by this device and nothing is queued on it any more.
        unsafe { dev.destroy_stream(s) }.unwrap();
        assert_eq!(dev.take().len(), 1, "logging goes on");
    }
}
