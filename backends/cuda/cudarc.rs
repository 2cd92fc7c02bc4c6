//! Interop with [cudarc](https://crates.io/crates/cudarc) (feature `cudarc`): a portalloc
//! allocation lent to cudarc as a [`CudaSlice`], so Rust GPU code built on cudarc (kernel
//! launches, copies, cuBLAS) runs on memory portalloc manages; and a portalloc
//! [`CudaDevice`] made from a cudarc context, used with cudarc's own streams.
//!
//! Ownership stays with portalloc: [`PortallocSlice`] owns a [`DeviceBuffer`] (the
//! allocation and a shared handle to its allocator, so the slice has no lifetime and can be
//! stored in a struct) and wraps its memory in a `CudaSlice` that is never dropped as such —
//! when the slice is handed back ([`PortallocSlice::into_buffer`]) or dropped, the
//! `CudaSlice` is taken apart with [`CudaSlice::leak`] (which makes the stream wait for the
//! work cudarc recorded on the memory, and frees nothing), and the buffer goes back to its
//! allocator once, in stream order. So neither side frees twice, and cudarc never calls
//! `cuMemFree` on portalloc's memory.
//!
//! Streams are cudarc's: [`stream_of`] is the same `CUstream` handle as a portalloc
//! [`Stream`], and every portalloc strategy accepts it as it is (see the stream-ordering
//! contract on [`crate::Device`]) — a stream from `ctx.new_stream()` needs no registering.
//!
//! Both sides use the device's *primary* context (portalloc's [`CudaDevice`] retains it, and
//! so does [`cudarc::driver::CudaContext::new`]), so pointers are valid on either side.
//! portalloc makes its own driver calls through its own loader ([`super::Driver`]); cudarc's
//! calls go through cudarc's loader, which is only reached once the caller uses cudarc —
//! check [`crate::Discovery::chosen`] first, since cudarc panics when no driver library is
//! there.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut};

use super::{CudaDevice, Driver};
use crate::allocator::Allocator;
use crate::buffer::DeviceBuffer;
use crate::device::Stream;
use crate::error::{Error, Result};

/// The portalloc [`Stream`] of a cudarc stream: the same `CUstream` handle.
pub fn stream_of(stream: &CudaStream) -> Stream {
    Stream::from_raw(stream.cu_stream() as usize as u64)
}

impl CudaDevice {
    /// The portalloc device of a cudarc context: the same device, on the same primary
    /// context, with the driver loaded through portalloc's loader (the library
    /// [`Driver::load_default`] names, reading `PORTALLOC_CUDA_LIBRARY` through
    /// [`crate::config::Config::from_env_vars`] — the one cudarc loaded, on an ordinary
    /// system).
    /// Streams made with `ctx.new_stream()` are then used with portalloc's strategies
    /// directly, through [`stream_of`].
    ///
    /// # Errors
    /// As [`CudaDevice::open`]; [`Error::InvalidArgument`] when `ctx` is not the device's
    /// primary context (made with `CudaContext::new_non_primary`, say): portalloc works on
    /// primary contexts only.
    pub fn from_cudarc(ctx: &Arc<CudaContext>) -> Result<CudaDevice> {
        let ordinal = u32::try_from(ctx.ordinal()).map_err(|_| Error::InvalidArgument {
            call: "CudaDevice::from_cudarc",
            reason: format!("device ordinal {} does not fit 32 bits", ctx.ordinal()),
        })?;
        let device = CudaDevice::open(Arc::new(Driver::load_default()?), ordinal)?;
        if !std::ptr::eq(device.context().cast::<()>(), ctx.cu_ctx().cast::<()>()) {
            return Err(Error::InvalidArgument {
                call: "CudaDevice::from_cudarc",
                reason: format!(
                    "the cudarc context of device {ordinal} is not its primary context; \
                     accepted are contexts from CudaContext::new"
                ),
            });
        }
        Ok(device)
    }
}

/// A portalloc [`DeviceBuffer`] usable as a cudarc [`CudaSlice<T>`] of `len` elements. Owns
/// its memory (no lifetime): store it in a struct, send it to another thread; dropping it
/// frees the memory in stream order.
///
/// Deref-free on purpose: borrow it with [`PortallocSlice::as_slice`] /
/// [`PortallocSlice::as_slice_mut`] (anything cudarc takes as [`cudarc::driver::DevicePtr`] /
/// [`cudarc::driver::DevicePtrMut`]) or [`PortallocSlice::view`] / [`PortallocSlice::view_mut`].
/// Never drop the `CudaSlice` yourself (you cannot: only references are handed out).
pub struct PortallocSlice<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    /// `Some` until the slice is taken apart or dropped.
    buffer: Option<DeviceBuffer>,
}

impl<T> std::fmt::Debug for PortallocSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortallocSlice")
            .field("buffer", &self.buffer)
            .field("len", &self.slice.len())
            .finish()
    }
}

impl<T> PortallocSlice<T> {
    /// Allocates `len` elements of `T` from `allocator` (a portalloc allocator on the CUDA
    /// device that `stream` belongs to), for use on `stream`.
    ///
    /// # Errors
    /// [`Error::InvalidSize`] when `len × size_of::<T>()` overflows or is zero; the
    /// allocator's errors (out of memory with its report).
    pub fn alloc(
        allocator: &Arc<dyn Allocator>,
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b > 0)
            .ok_or(Error::InvalidSize {
                size: len as u64,
                reason: "the element count times the element size must be non-zero and fit usize",
            })? as u64;
        let alignment = std::mem::align_of::<T>() as u64;
        let buffer =
            DeviceBuffer::with_options(allocator, bytes, alignment, stream_of(stream), "cudarc")?;
        // Cannot be refused (the buffer was made for this slice); if it were, dropping the
        // returned buffer frees it.
        Self::lend(buffer, len, stream).map_err(|refused| refused.0)
    }

    /// Lends a buffer to cudarc as `len` elements of `T`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the buffer is too small for `len` elements or not
    /// aligned for `T`, handing the buffer back with the error (boxed, as the pair is large).
    pub fn lend(
        buffer: DeviceBuffer,
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> std::result::Result<Self, Box<(Error, DeviceBuffer)>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>());
        let fits = bytes.is_some_and(|b| b as u64 <= buffer.size());
        let aligned = buffer.ptr() % std::mem::align_of::<T>() as u64 == 0;
        if !fits || !aligned || buffer.is_empty() {
            let reason = format!(
                "a buffer of {} bytes at {:#x} cannot hold {len} elements of {} ({} bytes, \
                 alignment {})",
                buffer.size(),
                buffer.ptr(),
                std::any::type_name::<T>(),
                std::mem::size_of::<T>(),
                std::mem::align_of::<T>()
            );
            return Err(Box::new((
                Error::InvalidArgument {
                    call: "PortallocSlice::lend",
                    reason,
                },
                buffer,
            )));
        }
        // SAFETY: the pointer is a live device allocation of at least `len × size_of::<T>()`
        // bytes, suitably aligned (checked above), in the primary context cudarc shares; it
        // stays allocated until this value gives the slice back with `leak` (never dropping
        // it), so cudarc never frees it.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(buffer.ptr(), len) };
        Ok(PortallocSlice {
            slice: ManuallyDrop::new(slice),
            buffer: Some(buffer),
        })
    }

    /// The cudarc slice, for reads (`DevicePtr`).
    pub fn as_slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// The cudarc slice, for writes (`DevicePtrMut`).
    pub fn as_slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }

    /// A cudarc view of the whole slice.
    pub fn view(&self) -> CudaView<'_, T> {
        self.slice.slice(..)
    }

    /// A mutable cudarc view of the whole slice.
    pub fn view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice.slice_mut(..)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// True for zero elements (never: [`PortallocSlice::alloc`] refuses them).
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// The portalloc buffer behind the slice.
    pub fn buffer(&self) -> &DeviceBuffer {
        self.buffer
            .as_ref()
            .expect("present until into_buffer or drop")
    }

    /// Takes the slice back from cudarc (its stream waits for the work cudarc recorded on
    /// it) and returns the buffer, to keep, free, or lend again.
    pub fn into_buffer(mut self) -> DeviceBuffer {
        let buffer = self.take_back();
        std::mem::forget(self);
        buffer
    }

    fn take_back(&mut self) -> DeviceBuffer {
        // SAFETY: `slice` is taken exactly once (here), and never used again: callers forget
        // or finish dropping `self` right after.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // Frees nothing: ends cudarc's ownership, after ordering the stream behind its events.
        let _ = slice.leak();
        self.buffer
            .take()
            .expect("present until into_buffer or drop")
    }
}

impl<T> Drop for PortallocSlice<T> {
    fn drop(&mut self) {
        // The buffer frees itself in stream order (logging a refusal).
        drop(self.take_back());
    }
}
