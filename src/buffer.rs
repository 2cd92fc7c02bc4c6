//! [`DeviceBuffer`]: device memory that frees itself, like RMM's `device_buffer` and cudarc's
//! `CudaSlice`.
//!
//! An [`Allocation`] is a move-only record that must be handed back with
//! [`Allocator::deallocate`]; dropping one leaks its memory until the allocator goes. A
//! `DeviceBuffer` owns its allocation *and* a shared handle ([`Arc`]) to the allocator that
//! made it, so it can be stored in a struct, sent to another thread, and it frees itself when
//! dropped — in stream order, on the stream it was made for. A free the allocator refuses
//! (it cannot be returned from `drop`) is logged; [`DeviceBuffer::free`] returns it instead.
//!
//! ```
//! use std::sync::Arc;
//!
//! use portalloc::backends::host::HostDevice;
//! use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
//! use portalloc::{Allocator, DeviceBuffer, Stream};
//!
//! // Any allocator, shared: here a growing BFC pool on a simulated device.
//! let device = Arc::new(HostDevice::builder().capacity(1 << 30).simulated(true).build()?);
//! let options = BfcOptions { limit: 512 << 20, preallocate: false };
//! let allocator: Arc<dyn Allocator> = Arc::new(BfcAllocator::new(device, options)?);
//!
//! let buffer = DeviceBuffer::new(&allocator, 1 << 20, Stream::DEFAULT)?;
//! assert_eq!(buffer.size(), 1 << 20);
//! assert_eq!(allocator.stats().bytes_in_use, 1 << 20);
//! drop(buffer); // freed on its stream
//! assert_eq!(allocator.stats().bytes_in_use, 0);
//!
//! // A tagged, aligned buffer, taken apart into plain data for C or Python and rebuilt;
//! // `free` returns the allocator's answer where a drop can only log it.
//! let stream = Stream::PER_THREAD;
//! let buffer = DeviceBuffer::with_options(&allocator, 4096, 1 << 16, stream, "kv-cache")?;
//! assert_eq!(buffer.ptr() % (1 << 16), 0);
//! let raw = buffer.into_raw();
//! assert_eq!((raw.size, raw.stream), (4096, Stream::PER_THREAD.as_raw()));
//! // SAFETY: `raw` is what into_raw gave, on a stream that is still live.
//! unsafe { DeviceBuffer::from_raw(Arc::clone(&allocator), raw) }?.free()?;
//! assert_eq!(allocator.stats().bytes_in_use, 0);
//! # Ok::<(), portalloc::Error>(())
//! ```
#![deny(unsafe_code)]

use std::fmt;
use std::sync::Arc;

use crate::allocator::{Allocation, Allocator};
use crate::device::Stream;
use crate::error::Result;

/// Device memory owned by the caller that frees itself on drop, on its stream. See the
/// [module docs](self).
pub struct DeviceBuffer {
    allocator: Arc<dyn Allocator>,
    /// `Some` until the buffer is freed or taken apart.
    allocation: Option<Allocation>,
}

/// A [`DeviceBuffer`] taken apart for a trip through foreign code ([`DeviceBuffer::into_raw`]):
/// plain data with a C layout. The allocator it came from must be kept alive separately, and
/// the buffer rebuilt with [`DeviceBuffer::from_raw`] (or the memory is leaked until the
/// allocator goes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawBuffer {
    /// The device address.
    pub ptr: u64,
    /// The size requested, in bytes.
    pub size: u64,
    /// The stream it was made for.
    pub stream: u64,
    /// The id of the allocator that made it.
    pub allocator_id: u64,
    /// The allocator's private token.
    pub token: u64,
    /// The thread that made it, for a buffer on [`Stream::PER_THREAD`]
    /// ([`Allocation::origin_thread`]; 0 for any other stream).
    pub origin_thread: u64,
}

impl DeviceBuffer {
    /// `size` bytes for use on `stream`, with the strategy's default alignment.
    ///
    /// # Errors
    /// As [`Allocator::allocate`].
    pub fn new(allocator: &Arc<dyn Allocator>, size: u64, stream: Stream) -> Result<Self> {
        DeviceBuffer::with_options(allocator, size, 0, stream, "buffer")
    }

    /// As [`DeviceBuffer::new`], with an alignment (a power of two; 0 = the strategy's
    /// default) and a tag for ledgers and reports.
    ///
    /// # Errors
    /// As [`Allocator::allocate`].
    pub fn with_options(
        allocator: &Arc<dyn Allocator>,
        size: u64,
        alignment: u64,
        stream: Stream,
        tag: &str,
    ) -> Result<Self> {
        let allocation = allocator.allocate(size, alignment, stream, tag)?;
        Ok(DeviceBuffer {
            allocator: Arc::clone(allocator),
            allocation: Some(allocation),
        })
    }

    /// Takes ownership of an allocation `allocator` made.
    ///
    /// # Errors
    /// [`crate::Error::ForeignAllocation`] when another allocator made it; the allocation is then
    /// dropped with the error (check [`Allocation::allocator_id`] first to hand it to its own
    /// allocator instead).
    pub fn from_allocation(allocator: Arc<dyn Allocator>, allocation: Allocation) -> Result<Self> {
        allocation.check_owner(allocator.id())?;
        Ok(DeviceBuffer {
            allocator,
            allocation: Some(allocation),
        })
    }

    fn allocation_ref(&self) -> &Allocation {
        // Only `free`, `into_*` and `drop` take it out, and they consume the buffer.
        self.allocation
            .as_ref()
            .expect("a live DeviceBuffer holds its allocation")
    }

    /// The device address (0 for an empty buffer).
    pub fn ptr(&self) -> u64 {
        self.allocation_ref().ptr()
    }

    /// The size requested, in bytes.
    pub fn size(&self) -> u64 {
        self.allocation_ref().size()
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.size() == 0
    }

    /// The stream it was made for, and is freed on.
    pub fn stream(&self) -> Stream {
        self.allocation_ref().stream()
    }

    /// The allocation record.
    pub fn allocation(&self) -> &Allocation {
        self.allocation_ref()
    }

    /// The allocator that made it.
    pub fn allocator(&self) -> &Arc<dyn Allocator> {
        &self.allocator
    }

    /// Frees the buffer now, in stream order on its stream, and returns the allocator's
    /// answer (drop logs it instead).
    ///
    /// # Errors
    /// As [`Allocator::deallocate`].
    pub fn free(mut self) -> Result<()> {
        let allocation = self.allocation.take().expect("a live buffer");
        self.allocator.deallocate(allocation)
    }

    /// Takes the buffer apart without freeing it: the allocator and the allocation, to be
    /// handed back with [`Allocator::deallocate`] or rebuilt with
    /// [`DeviceBuffer::from_allocation`].
    pub fn into_allocation(mut self) -> (Arc<dyn Allocator>, Allocation) {
        let allocation = self.allocation.take().expect("a live buffer");
        (Arc::clone(&self.allocator), allocation)
    }

    /// Takes the buffer apart into plain data for foreign code (a C struct, a Python
    /// capsule), without freeing it. Keep the allocator alive and rebuild the buffer with
    /// [`DeviceBuffer::from_raw`] to free it.
    pub fn into_raw(self) -> RawBuffer {
        let (_, a) = self.into_allocation();
        RawBuffer {
            ptr: a.ptr(),
            size: a.size(),
            stream: a.stream().as_raw(),
            allocator_id: a.allocator_id(),
            token: a.token(),
            origin_thread: a.origin_thread(),
        }
    }

    /// Rebuilds a buffer from [`DeviceBuffer::into_raw`]'s data. The allocator checks the
    /// token when the buffer is freed, so a forged or stale record is refused then (and
    /// logged by drop), never freed.
    ///
    /// # Errors
    /// [`crate::Error::ForeignAllocation`] when `raw` came from another allocator.
    ///
    /// # Safety
    /// `raw.stream` is a stream handle as [`Stream::from_raw`] requires (it is passed to the
    /// driver when the buffer is freed): in practice, `raw` is what `into_raw` gave, and the
    /// stream is still live.
    // The declaration states the contract; the body does nothing unsafe.
    #[allow(unsafe_code)]
    pub unsafe fn from_raw(allocator: Arc<dyn Allocator>, raw: RawBuffer) -> Result<Self> {
        let allocation = Allocation::new(
            raw.ptr,
            raw.size,
            Stream(raw.stream),
            raw.allocator_id,
            raw.token,
        )
        .with_origin(raw.origin_thread);
        DeviceBuffer::from_allocation(allocator, allocation)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(allocation) = self.allocation.take() {
            let (ptr, size, stream) = (allocation.ptr(), allocation.size(), allocation.stream());
            if let Err(e) = self.allocator.deallocate(allocation) {
                tracing::warn!(
                    allocator = self.allocator.name(),
                    ptr,
                    size,
                    stream = stream.0,
                    error = %e,
                    "a DeviceBuffer could not be freed on drop; its memory stays with the allocator"
                );
            }
        }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("DeviceBuffer");
        d.field("allocator", &self.allocator.name());
        match &self.allocation {
            Some(a) => d
                .field("ptr", &format_args!("{:#x}", a.ptr()))
                .field("size", &a.size())
                .field("stream", &a.stream()),
            None => d.field("allocation", &"freed"),
        };
        d.finish()
    }
}
