//! Interop with [cudarc](https://crates.io/crates/cudarc) (feature `cudarc`): a portalloc
//! allocation lent to cudarc as a [`CudaSlice`], so Rust GPU code built on cudarc (kernel
//! launches, copies, cuBLAS) runs on memory portalloc manages.
//!
//! Ownership stays with portalloc: [`PortallocSlice`] wraps the allocation in a `CudaSlice`
//! that is never dropped as such — when the slice is handed back
//! ([`PortallocSlice::into_allocation`]) or dropped, the `CudaSlice` is taken apart with
//! [`CudaSlice::leak`] (which makes the stream wait for the work cudarc recorded on the
//! memory, and frees nothing), and the allocation goes back to its allocator once. So neither
//! side frees twice, and cudarc never calls `cuMemFree` on portalloc's memory.
//!
//! Both sides use the device's *primary* context (portalloc's [`super::CudaDevice`] retains
//! it, and so does [`cudarc::driver::CudaContext::new`]), so pointers are valid on either
//! side. portalloc makes its own driver calls through its own loader ([`super::Driver`]);
//! cudarc's calls go through cudarc's loader, which is only reached once the caller uses
//! cudarc — check [`crate::Discovery::chosen`] first, since cudarc panics when no driver
//! library is there.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};

use crate::allocator::{Allocation, Allocator};
use crate::device::Stream;
use crate::error::{Error, Result};

/// The portalloc [`Stream`] of a cudarc stream: the same `CUstream` handle.
pub fn stream_of(stream: &CudaStream) -> Stream {
    Stream(stream.cu_stream() as usize as u64)
}

/// A portalloc [`Allocation`] usable as a cudarc [`CudaSlice<T>`] of `len` elements.
///
/// Deref-free on purpose: borrow it with [`PortallocSlice::as_slice`] /
/// [`PortallocSlice::as_slice_mut`] (anything cudarc takes as [`cudarc::driver::DevicePtr`] /
/// [`cudarc::driver::DevicePtrMut`]) or [`PortallocSlice::view`] / [`PortallocSlice::view_mut`].
/// Never drop the `CudaSlice` yourself (you cannot: only references are handed out).
pub struct PortallocSlice<'a, T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    allocation: Option<Allocation>,
    allocator: &'a dyn Allocator,
}

impl<T> std::fmt::Debug for PortallocSlice<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortallocSlice")
            .field("allocation", &self.allocation)
            .field("len", &self.slice.len())
            .field("allocator", &self.allocator.name())
            .finish()
    }
}

impl<'a, T> PortallocSlice<'a, T> {
    /// Allocates `len` elements of `T` from `allocator` (a portalloc allocator on the CUDA
    /// device that `stream` belongs to), for use on `stream`.
    ///
    /// # Errors
    /// [`Error::InvalidSize`] when `len × size_of::<T>()` overflows or is zero; the
    /// allocator's errors (out of memory with its report).
    pub fn alloc(
        allocator: &'a dyn Allocator,
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
        let allocation = allocator.allocate(bytes, alignment, stream_of(stream), "cudarc")?;
        Self::lend(allocator, allocation, len, stream).map_err(|refused| {
            let (error, allocation) = *refused;
            // Cannot happen (the allocation was made for this slice); never leak it.
            let _ = allocator.deallocate(allocation);
            error
        })
    }

    /// Lends an existing allocation of `allocator` to cudarc as `len` elements of `T`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the allocation is too small for `len` elements or not
    /// aligned for `T`, handing the allocation back with the error (boxed, as the pair is
    /// large).
    pub fn lend(
        allocator: &'a dyn Allocator,
        allocation: Allocation,
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> std::result::Result<Self, Box<(Error, Allocation)>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>());
        let fits = bytes.is_some_and(|b| b as u64 <= allocation.size());
        let aligned = allocation.ptr() % std::mem::align_of::<T>() as u64 == 0;
        if !fits || !aligned || allocation.is_empty() {
            let reason = format!(
                "an allocation of {} bytes at {:#x} cannot hold {len} elements of {} ({} bytes, \
                 alignment {})",
                allocation.size(),
                allocation.ptr(),
                std::any::type_name::<T>(),
                std::mem::size_of::<T>(),
                std::mem::align_of::<T>()
            );
            return Err(Box::new((
                Error::InvalidArgument {
                    call: "PortallocSlice::lend",
                    reason,
                },
                allocation,
            )));
        }
        // SAFETY: the pointer is a live device allocation of at least `len × size_of::<T>()`
        // bytes, suitably aligned (checked above), in the primary context cudarc shares; it
        // stays allocated until this value gives the slice back with `leak` (never dropping
        // it), so cudarc never frees it.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(allocation.ptr(), len) };
        Ok(PortallocSlice {
            slice: ManuallyDrop::new(slice),
            allocation: Some(allocation),
            allocator,
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

    /// The portalloc allocation behind the slice.
    pub fn allocation(&self) -> &Allocation {
        self.allocation
            .as_ref()
            .expect("present until into_allocation or drop")
    }

    /// Takes the slice back from cudarc (its stream waits for the work cudarc recorded on
    /// it) and returns the allocation, for [`Allocator::deallocate`] or for lending again.
    pub fn into_allocation(mut self) -> Allocation {
        let allocation = self.take_back();
        std::mem::forget(self);
        allocation
    }

    fn take_back(&mut self) -> Allocation {
        // SAFETY: `slice` is taken exactly once (here), and never used again: callers forget
        // or finish dropping `self` right after.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // Frees nothing: ends cudarc's ownership, after ordering the stream behind its events.
        let _ = slice.leak();
        self.allocation
            .take()
            .expect("present until into_allocation or drop")
    }
}

impl<T> Drop for PortallocSlice<'_, T> {
    fn drop(&mut self) {
        let allocation = self.take_back();
        if let Err(e) = self.allocator.deallocate(allocation) {
            tracing::warn!(error = %e, "could not hand a cudarc slice back to portalloc");
        }
    }
}
