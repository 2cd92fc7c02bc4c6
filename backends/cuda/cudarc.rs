//! Interop with [cudarc](https://crates.io/crates/cudarc) (feature `cudarc`): a portalloc
//! allocation lent to cudarc as a [`CudaSlice`], so Rust GPU code built on cudarc (kernel
//! launches, copies, cuBLAS) runs on memory portalloc manages; and a portalloc
//! [`CudaDevice`] made from a cudarc context, used with cudarc's own streams.
//!
//! Ownership stays with portalloc: [`PortallocSlice`] owns a [`DeviceBuffer`] (the
//! allocation and a shared handle to its allocator, so the slice has no lifetime and can be
//! stored in a struct) and wraps its memory in a `CudaSlice` that is never dropped as such —
//! when the slice is handed back ([`PortallocSlice::into_parts`], [`PortallocSlice::free`]) or dropped, the
//! `CudaSlice` is taken apart with [`CudaSlice::leak`] (which makes the stream wait for the
//! work cudarc recorded on the memory, and frees nothing), and the buffer goes back to its
//! allocator once, in stream order on the same stream — a buffer lent on another stream than
//! its own is refused, since its free would not be ordered after cudarc's work. So neither
//! side frees twice, and cudarc never calls `cuMemFree` on portalloc's memory. The slice
//! keeps its stream alive until the buffer is freed on it.
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
///
/// # Safety
/// As [`Stream::from_raw`]: the returned handle is used only while `stream` lives (cudarc
/// destroys the stream when its last `Arc` goes, and the handle would then dangle).
// The declaration states the contract; nothing unsafe is done here.
#[allow(unsafe_code)]
pub unsafe fn stream_of(stream: &CudaStream) -> Stream {
    handle_of(stream)
}

/// [`stream_of`] for the slices here, which keep the stream alive as long as they use it.
fn handle_of(stream: &CudaStream) -> Stream {
    Stream(stream.cu_stream() as usize as u64)
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
    /// The stream the buffer is freed on, kept alive until it is (the `CudaSlice` lets go of
    /// its own reference when it is taken apart, before the free).
    stream: Arc<CudaStream>,
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
        // The slice keeps `stream` alive for as long as the buffer uses it.
        let buffer =
            DeviceBuffer::with_options(allocator, bytes, alignment, handle_of(stream), "cudarc")?;
        // Cannot be refused (the buffer was made for this slice); if it were, dropping the
        // returned buffer frees it.
        Self::lend(buffer, len, stream).map_err(|refused| refused.0)
    }

    /// Lends a buffer to cudarc as `len` elements of `T`, on `stream`: the buffer's own
    /// stream, since cudarc orders the work it did on the memory before `stream` when the
    /// slice is taken back, and the buffer is freed on its own stream.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the buffer is too small for `len` elements, not
    /// aligned for `T`, or made for another stream than `stream`, handing the buffer back
    /// with the error (boxed, as the pair is large).
    pub fn lend(
        buffer: DeviceBuffer,
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> std::result::Result<Self, Box<(Error, DeviceBuffer)>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>());
        let fits = bytes.is_some_and(|b| b as u64 <= buffer.size());
        let aligned = buffer.ptr() % std::mem::align_of::<T>() as u64 == 0;
        if buffer.stream() != handle_of(stream) {
            let reason = format!(
                "the buffer was made for stream {:#x} and is freed there, but is lent on stream \
                 {:#x}: cudarc orders its work on the memory before the slice's stream only, so \
                 the free would not wait for it; lend it on its own stream (or synchronise \
                 and make a buffer for this one)",
                buffer.stream().as_raw(),
                handle_of(stream).as_raw()
            );
            return Err(Box::new((
                Error::InvalidArgument {
                    call: "PortallocSlice::lend",
                    reason,
                },
                buffer,
            )));
        }
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
            stream: Arc::clone(stream),
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
            .expect("present until into_parts or drop")
    }

    /// Takes the slice back from cudarc (its stream waits for the work cudarc recorded on
    /// it) and frees the buffer on that stream now, returning the allocator's answer (a drop
    /// logs it instead).
    ///
    /// # Errors
    /// As [`DeviceBuffer::free`].
    pub fn free(self) -> Result<()> {
        let (buffer, stream) = self.into_parts();
        let freed = buffer.free();
        drop(stream);
        freed
    }

    /// Takes the slice back from cudarc (its stream waits for the work cudarc recorded on
    /// it) and returns the buffer, to keep, free, or lend again, with the stream it is freed
    /// on — which must outlive it: keep the `Arc` until the buffer is freed.
    pub fn into_parts(mut self) -> (DeviceBuffer, Arc<CudaStream>) {
        let buffer = self.take_back();
        (buffer, Arc::clone(&self.stream))
    }

    /// Takes the slice back from cudarc. Called once: by `into_parts`, or by drop when
    /// `into_parts` was not (then `buffer` is still there).
    fn take_back(&mut self) -> DeviceBuffer {
        // SAFETY: `slice` is taken exactly once: here, while `buffer` is still `Some` (which
        // this ends), and never used again (drop takes it only while `buffer` is `Some`).
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // Frees nothing: ends cudarc's ownership, after ordering the stream behind its events.
        let _ = slice.leak();
        self.buffer
            .take()
            .expect("present until into_parts or drop")
    }
}

impl<T> Drop for PortallocSlice<T> {
    fn drop(&mut self) {
        // The buffer frees itself in stream order (logging a refusal), while `self.stream`
        // still keeps the stream alive; the stream's `Arc` goes after.
        if self.buffer.is_some() {
            drop(self.take_back());
        }
    }
}
