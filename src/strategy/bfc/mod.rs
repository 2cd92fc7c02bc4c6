//! XLA's BFC allocator (interface fixed here; being written).
#![deny(unsafe_code)]

use std::sync::Arc;

use crate::allocator::{Allocation, Allocator, Stats};
use crate::device::{Device, Stream};
use crate::error::Result;

/// Options of [`BfcAllocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfcOptions {
    /// The most memory the allocator may take from the device (`fraction × total`).
    pub limit: u64,
    /// One region of `limit` at the first allocation (true) or growth by doubling (false).
    pub preallocate: bool,
}

/// XLA's BFC allocator over a device.
#[derive(Debug)]
pub struct BfcAllocator<D: Device + ?Sized> {
    device: Arc<D>,
    options: BfcOptions,
}

impl<D: Device + ?Sized> BfcAllocator<D> {
    /// Makes the allocator; takes no memory until the first allocation.
    pub fn new(device: Arc<D>, options: BfcOptions) -> Result<Self> {
        Ok(BfcAllocator { device, options })
    }
}

impl<D: Device + ?Sized> Allocator for BfcAllocator<D> {
    fn name(&self) -> &str { "bfc" }
    fn id(&self) -> u64 { let _ = (&self.device, self.options); 0 }
    fn allocate(&self, _size: u64, _alignment: u64, _stream: Stream, _tag: &str) -> Result<Allocation> { todo!() }
    fn deallocate(&self, _allocation: Allocation) -> Result<()> { todo!() }
    fn stats(&self) -> Stats { todo!() }
    fn trim(&self) -> Result<u64> { todo!() }
}
