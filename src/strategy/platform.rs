//! The `platform` strategy: every allocation is a device allocation, every free returns it
//! (XLA's `platform` / `address` allocator). No caching, so no fragmentation of its own, and a
//! device call per request. A free waits for the freeing stream's work (then returns the
//! memory with the device's synchronous free), since the device may hand it to any stream
//! next.
#![deny(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::common::{admit, holds_memory, Admitted};
use crate::allocator::{next_allocator_id, Allocation, Allocator, Stats};
use crate::device::{Device, Stream};
use crate::error::{Error, Result};

use super::stream_order::wait_for;

/// Device allocations are at least this aligned (cuMemAlloc gives 256 B or more).
const DEVICE_ALIGNMENT: u64 = 256;

#[derive(Debug, Default)]
struct Books {
    /// Live allocations: address → bytes taken from the device.
    /// Address → (rounded bytes, the token it was handed out with). Invariant: the sum of
    /// the bytes `== stats.bytes_in_use == stats.pool_bytes`.
    live: HashMap<u64, (u64, u64)>,
    /// The next token: never repeats, so a stale record of an address the device handed
    /// out again is refused.
    next_token: u64,
    stats: Stats,
}

/// Allocates and frees on demand through [`Device::alloc`] / [`Device::free`].
#[derive(Debug)]
pub struct PlatformAllocator<D: Device + ?Sized> {
    device: Arc<D>,
    id: u64,
    limit: Option<u64>,
    books: Mutex<Books>,
}

impl<D: Device + ?Sized> PlatformAllocator<D> {
    /// Makes the allocator over `device`; `limit` caps the bytes it holds at once (`None`:
    /// whatever the device gives).
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use portalloc::backends::host::HostDevice;
    /// use portalloc::strategy::platform::PlatformAllocator;
    /// use portalloc::{Allocator, Device, Error, Stream};
    ///
    /// let device = Arc::new(HostDevice::builder().capacity(64 << 20).simulated(true).build()?);
    /// let platform = PlatformAllocator::new(Arc::clone(&device), Some(8 << 20));
    ///
    /// // Every allocation is a device allocation, and every free gives it back at once.
    /// let buffer = platform.allocate(6 << 20, 0, Stream::DEFAULT, "buffer")?;
    /// assert_eq!(device.mem_info()?.free, 58 << 20);
    ///
    /// // Past what the limit leaves: out of memory, and nothing asked of the device.
    /// match platform.allocate(4 << 20, 0, Stream::DEFAULT, "buffer") {
    ///     Err(Error::DeviceOutOfMemory { free, .. }) => assert_eq!(free, 2 << 20),
    ///     other => panic!("expected DeviceOutOfMemory, got {other:?}"),
    /// }
    /// // Larger than the limit itself: no free could ever make room.
    /// match platform.allocate(16 << 20, 0, Stream::DEFAULT, "buffer") {
    ///     Err(Error::ExceedsLimit { requested, limit }) => {
    ///         assert_eq!((requested, limit), (16 << 20, 8 << 20));
    ///     }
    ///     other => panic!("expected ExceedsLimit, got {other:?}"),
    /// }
    /// platform.deallocate(buffer)?;
    /// assert_eq!(device.mem_info()?.free, 64 << 20);
    /// # Ok::<(), portalloc::Error>(())
    /// ```
    pub fn new(device: Arc<D>, limit: Option<u64>) -> Self {
        let books = Books {
            stats: Stats {
                bytes_limit: limit,
                ..Stats::default()
            },
            ..Books::default()
        };
        PlatformAllocator {
            device,
            id: next_allocator_id(),
            limit,
            books: Mutex::new(books),
        }
    }

    /// The device it allocates from.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // A panic while holding the lock cannot leave the books half-updated (every update
        // is a few field writes after the device call), so a poisoned lock is still usable.
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<D: Device + ?Sized> Allocator for PlatformAllocator<D> {
    crate::allocator::no_sleep!();

    fn name(&self) -> &str {
        "platform"
    }

    fn id(&self) -> u64 {
        self.id
    }

    fn allocate(
        &self,
        size: u64,
        alignment: u64,
        stream: Stream,
        _tag: &str,
    ) -> Result<Allocation> {
        let mut books = self.books();
        let Some(Admitted { rounded, .. }) =
            admit(size, alignment, DEVICE_ALIGNMENT, DEVICE_ALIGNMENT)?
        else {
            books.stats.num_allocs += 1;
            return Ok(Allocation::empty(stream, self.id));
        };
        if let Some(limit) = self.limit {
            if rounded > limit {
                return Err(Error::ExceedsLimit {
                    requested: size,
                    limit,
                });
            }
            if books.stats.bytes_in_use + rounded > limit {
                return Err(Error::DeviceOutOfMemory {
                    backend: self.device.info().vendor.name(),
                    requested: rounded,
                    free: limit - books.stats.bytes_in_use,
                });
            }
        }
        let ptr = self.device.alloc(rounded)?;
        books.next_token += 1;
        let token = books.next_token;
        books.live.insert(ptr, (rounded, token));
        let s = &mut books.stats;
        s.num_allocs += 1;
        s.bytes_in_use += rounded;
        s.pool_bytes = s.bytes_in_use;
        s.peak_bytes_in_use = s.peak_bytes_in_use.max(s.bytes_in_use);
        s.peak_pool_bytes = s.peak_pool_bytes.max(s.pool_bytes);
        s.largest_alloc_size = s.largest_alloc_size.max(rounded);
        Ok(Allocation::new(ptr, size, stream, self.id, token))
    }

    fn deallocate(&self, allocation: Allocation) -> Result<()> {
        if !holds_memory(&allocation, self.id)? {
            return Ok(());
        }
        let mut books = self.books();
        // An allocation whose address is live but whose token differs was not made by this
        // allocation (forged, or stale: the device handed the address out again).
        let Some(bytes) = books
            .live
            .get(&allocation.ptr())
            .copied()
            .filter(|&(_, token)| token == allocation.token())
            .map(|(bytes, _)| bytes)
        else {
            return Err(Error::UnknownPointer {
                what: "allocation",
                ptr: allocation.ptr(),
                backend: self.device.info().vendor.name(),
            });
        };
        books.live.remove(&allocation.ptr());
        drop(books);
        // The device's free requires the work using the memory to be complete, and the
        // memory may go to any stream (or process) next: wait for the freeing stream first,
        // without holding the lock across the wait.
        let freed = wait_for(&*self.device, allocation.stream())
            .and_then(|()| self.device.free(allocation.ptr(), bytes));
        let mut books = self.books();
        if let Err(e) = freed {
            books
                .live
                .insert(allocation.ptr(), (bytes, allocation.token()));
            return Err(e);
        }
        books.stats.bytes_in_use -= bytes;
        books.stats.pool_bytes = books.stats.bytes_in_use;
        Ok(())
    }

    fn stats(&self) -> Stats {
        self.books().stats
    }

    /// Its own device allocation.
    fn backing(&self, allocation: &Allocation) -> Result<crate::allocator::Backing> {
        let bytes = self
            .charged(allocation)
            .filter(|_| allocation.allocator_id() == self.id);
        match bytes {
            Some(size) if size > 0 => Ok(crate::allocator::Backing::Plain {
                base: allocation.ptr(),
                size,
            }),
            _ => Err(crate::Error::InvalidArgument {
                call: "backing",
                reason: format!(
                    "{:#x} is not a live, non-empty allocation of this platform allocator",
                    allocation.ptr()
                ),
            }),
        }
    }

    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        self.books()
            .live
            .get(&allocation.ptr())
            .filter(|&&(_, token)| token == allocation.token())
            .map(|&(bytes, _)| bytes)
    }

    fn trim(&self) -> Result<u64> {
        Ok(0)
    }

    fn check_invariants(&self) -> std::result::Result<(), String> {
        let books = self.books();
        let sum: u64 = books.live.values().map(|&(bytes, _)| bytes).sum();
        if sum != books.stats.bytes_in_use || sum != books.stats.pool_bytes {
            return Err(format!(
                "live allocations sum to {sum} B but bytes_in_use = {} and pool_bytes = {}",
                books.stats.bytes_in_use, books.stats.pool_bytes
            ));
        }
        Ok(())
    }
}

impl<D: Device + ?Sized> Drop for PlatformAllocator<D> {
    fn drop(&mut self) {
        let books = self.books.get_mut().unwrap_or_else(|p| p.into_inner());
        if !books.live.is_empty() {
            tracing::warn!(
                allocator = "platform",
                live = books.live.len(),
                bytes = books.stats.bytes_in_use,
                "allocator dropped with live allocations; returning them to the device"
            );
            // Their streams are not in the books: wait for the whole device before the
            // memory goes back, since work may still use it.
            if let Err(e) = self.device.synchronize_device() {
                tracing::warn!(allocator = "platform", error = %e,
                    "could not wait for the work on its memory; returning it anyway");
            }
        }
        for (ptr, (bytes, _)) in books.live.drain() {
            if let Err(e) = super::release_with_retry(|| self.device.free(ptr, bytes)) {
                tracing::warn!(ptr, bytes, error = %e, "could not free a leaked allocation");
            }
        }
    }
}
