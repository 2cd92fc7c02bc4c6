//! The `bfc` strategy: XLA's best-fit-with-coalescing allocator (`BFCAllocator`) over a
//! [`Device`], with XLA's rules — see [`arena`] for the chunk rules (256-byte rounding, 21
//! bins, best fit with lowest-address ties, the split rule, coalescing) and
//! [`BfcAllocator`] for how regions are taken from the device.
//!
//! # Where this differs from XLA, and why
//!
//! * **Alignment above 256 B** is supported (XLA's BFC only gives 256): the best-fit search
//!   takes the first candidate, in best-fit order, whose aligned start leaves room for the
//!   request, and splits the bytes in front of it off as a free chunk. Alignments up to
//!   [`MAX_ALIGNMENT`] (1 GiB) are accepted. When the pool must grow for such a request, the
//!   new region is asked for `alignment − 256` bytes more than the request, since a device
//!   only promises 256-byte-aligned bases.
//! * **Preallocation is exact**: the one region of `limit` (rounded up to 2 MiB) is asked for
//!   once, with no ×0.9 back-off; if the device refuses it the request fails with an
//!   [`Error::OutOfMemory`] whose cause names the refusal (XLA's `Extend` would back off
//!   silently and run with less than configured). The next allocation tries again.
//! * **No garbage collection on OOM**: XLA can free wholly free regions and retry when
//!   growth fails; here that is [`Allocator::trim`], called by the user.
//! * The back-off factor is computed in integers (`bytes × 9 / 10`, rounded up to 256 B)
//!   where XLA multiplies by the `float` 0.9f; and like XLA, it backs off during one growth
//!   attempt only, ever (XLA's `started_backpedal_`): later refusals fail at once.
//! * `bytes_reserved` is always 0: XLA uses it for memory reserved beyond the pool, and BFC
//!   reserves none.
#![deny(unsafe_code)]

pub mod arena;
pub mod free_index;

use std::sync::{Arc, Mutex, MutexGuard};

use crate::allocator::{
    effective_alignment, next_allocator_id, round_up, Allocation, Allocator, Stats,
};
use crate::device::{Device, Stream};
use crate::error::{Error, Result};
use crate::report::{BinSummary, OomReport};
use crate::units::Bytes;

use arena::{Arena, MIN_ALLOCATION};

/// The largest alignment accepted: 1 GiB. Larger ones would rarely fit any region.
pub const MAX_ALIGNMENT: u64 = 1 << 30;
/// A preallocated region is the limit rounded up to this (2 MiB).
pub const PREALLOCATION_GRANULE: u64 = 2 << 20;
/// Under growth, the first region is `min(limit, 2 MiB)`.
pub const INITIAL_REGION: u64 = 2 << 20;

/// Options of [`BfcAllocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BfcOptions {
    /// The most memory the allocator may take from the device (`fraction × total`).
    pub limit: u64,
    /// One region of `limit` at the first allocation (true) or growth by doubling (false).
    pub preallocate: bool,
}

/// Everything behind the lock.
#[derive(Debug)]
struct Inner {
    /// Regions and chunks.
    arena: Arena,
    /// XLA's `curr_region_allocation_bytes_`: the size of the next region under growth.
    next_region: u64,
    /// XLA's `started_backpedal_`: true once a growth attempt has backed off.
    backed_off: bool,
    /// Successful allocations, zero-byte ones included.
    num_allocs: u64,
    /// Invariant: `>= arena.bytes_in_use()`.
    peak_bytes_in_use: u64,
    /// Largest chunk handed out.
    largest_alloc_size: u64,
    /// Invariant: `>= arena.pool_bytes()`.
    peak_pool_bytes: u64,
}

/// XLA's BFC allocator over a device.
///
/// Takes memory from the device in regions, never more than [`BfcOptions::limit`] in all:
///
/// * **Preallocate** (`preallocate: true`, XLA's default): at the first allocation, one
///   region of `limit` rounded up to 2 MiB, and never another (until [`Allocator::trim`]
///   gives it back; the next allocation takes it again).
/// * **Growth** (`preallocate: false`, `XLA_PYTHON_CLIENT_PREALLOCATE=false`), as XLA's
///   `BFCAllocator::Extend`: the first region is `min(limit, 2 MiB)`; a request larger than
///   the next region size doubles it until it fits (and it then stays), otherwise each
///   region taken doubles the next one (2, 4, 8, 16 MiB…). A region never takes the pool
///   past the limit (it shrinks to what is left, rounded down to 256 B, if that still holds
///   the request). When the device refuses, the size backs off by ×0.9 until the device
///   accepts or the size falls below the request.
///
/// Whatever cannot be served is an [`Error::OutOfMemory`] with an [`OomReport`] whose
/// `cause` says why. Thread-safe: one mutex guards the books (device calls made while
/// growing hold it, as in XLA).
#[derive(Debug)]
pub struct BfcAllocator<D: Device + ?Sized> {
    device: Arc<D>,
    options: BfcOptions,
    id: u64,
    inner: Mutex<Inner>,
}

impl<D: Device + ?Sized> BfcAllocator<D> {
    /// Makes the allocator; takes no memory until the first allocation.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for option checks.
    pub fn new(device: Arc<D>, options: BfcOptions) -> Result<Self> {
        let first = options.limit.min(INITIAL_REGION);
        let inner = Inner {
            arena: Arena::new(),
            next_region: round_up(first, MIN_ALLOCATION)?.max(MIN_ALLOCATION),
            backed_off: false,
            num_allocs: 0,
            peak_bytes_in_use: 0,
            largest_alloc_size: 0,
            peak_pool_bytes: 0,
        };
        Ok(BfcAllocator {
            device,
            options,
            id: next_allocator_id(),
            inner: Mutex::new(inner),
        })
    }

    /// The device it allocates from.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// The options it was made with.
    pub fn options(&self) -> BfcOptions {
        self.options
    }

    /// The sizes of the regions held now, in the order they were taken.
    ///
    /// # Time complexity
    /// `O(regions)`.
    pub fn region_sizes(&self) -> Vec<u64> {
        self.inner().arena.regions().map(|(_, size)| size).collect()
    }

    /// The regions held now as `(base, size)`, in the order they were taken.
    ///
    /// # Time complexity
    /// `O(regions)`.
    pub fn regions(&self) -> Vec<(u64, u64)> {
        self.inner().arena.regions().collect()
    }

    /// The per-bin summary an OOM report would show now (every chunk, free and in use,
    /// classed by size; non-empty classes only).
    ///
    /// # Time complexity
    /// `O(chunks)`.
    pub fn bin_summaries(&self) -> Vec<BinSummary> {
        self.inner().arena.bin_summaries()
    }

    /// Number of allocations live now (zero-byte ones excluded: they own nothing).
    pub fn live_count(&self) -> usize {
        self.inner().arena.live_count()
    }

    /// The size of the one preallocated region: the limit rounded up to 2 MiB.
    pub fn preallocation_size(&self) -> u64 {
        round_up(self.options.limit, PREALLOCATION_GRANULE)
            .unwrap_or(self.options.limit & !(PREALLOCATION_GRANULE - 1))
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Every update under the lock leaves the arena consistent before any call that could
        // panic, so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a region able to hold `need` bytes, by the preallocation or growth rule.
    /// `Err` carries the cause for the OOM report.
    fn extend(&self, inner: &mut Inner, need: u64) -> std::result::Result<(), String> {
        let limit = self.options.limit;
        if self.options.preallocate {
            let size = self.preallocation_size();
            if need > size {
                return Err(self.exceeds(need, size));
            }
            if inner.arena.region_count() > 0 {
                return Err(format!(
                    "no free chunk fits in the preallocated region of {} (preallocation never grows)",
                    Bytes(inner.arena.pool_bytes())
                ));
            }
            let base = self.device.alloc(size).map_err(|e| {
                format!(
                    "the device refused the preallocation of {} ({size} B): {e}",
                    Bytes(size)
                )
            })?;
            return self.add_region(inner, base, size);
        }

        // Growth: XLA's BFCAllocator::Extend.
        let pool = inner.arena.pool_bytes();
        let available = limit.saturating_sub(pool) & !(MIN_ALLOCATION - 1);
        if need > available {
            return Err(if need > limit {
                self.exceeds(need, limit)
            } else {
                format!(
                    "the limit of {} is reached: the pool holds {} and {} is left, {} needed",
                    Bytes(limit),
                    Bytes(pool),
                    Bytes(available),
                    Bytes(need)
                )
            });
        }
        let mut increased = false;
        while need > inner.next_region {
            inner.next_region = inner.next_region.saturating_mul(2);
            increased = true;
        }
        let first_try = inner.next_region.min(available);
        let mut bytes = first_try;
        let mut result = self.device.alloc(bytes);
        if let Err(e) = &result {
            if e.is_out_of_memory() && !inner.backed_off {
                inner.backed_off = true;
                loop {
                    let smaller = (u128::from(bytes) * 9 / 10) as u64;
                    bytes = round_up(smaller, MIN_ALLOCATION).unwrap_or(smaller);
                    if bytes < need {
                        break;
                    }
                    result = self.device.alloc(bytes);
                    match &result {
                        Ok(_) => break,
                        Err(e) if e.is_out_of_memory() => {}
                        Err(_) => break,
                    }
                }
            }
        }
        let base = result.map_err(|e| {
            let backoff = if bytes == first_try {
                String::new()
            } else {
                format!(", backing off ×0.9 down to {}", Bytes(bytes.max(need)))
            };
            format!(
                "the device refused to grow the pool by {}{backoff}: {e}",
                Bytes(first_try)
            )
        })?;
        if !increased {
            inner.next_region = inner.next_region.saturating_mul(2);
        }
        self.add_region(inner, base, bytes)
    }

    fn exceeds(&self, need: u64, cap: u64) -> String {
        format!(
            "the request ({} with alignment slack) exceeds the limit of {} ({} B{})",
            Bytes(need),
            Bytes(self.options.limit),
            self.options.limit,
            if cap == self.options.limit {
                String::new()
            } else {
                format!("; preallocated region {} B", cap)
            }
        )
    }

    fn add_region(
        &self,
        inner: &mut Inner,
        base: u64,
        size: u64,
    ) -> std::result::Result<(), String> {
        if let Err(why) = inner.arena.add_region(base, size) {
            let _ = self.device.free(base, size);
            return Err(format!("the device gave an unusable region: {why}"));
        }
        inner.peak_pool_bytes = inner.peak_pool_bytes.max(inner.arena.pool_bytes());
        Ok(())
    }

    fn oom(
        &self,
        inner: &Inner,
        requested: u64,
        rounded: u64,
        alignment: u64,
        cause: String,
    ) -> Error {
        let a = &inner.arena;
        let largest = a.largest_free();
        Error::OutOfMemory(Box::new(OomReport {
            allocator: self.name().to_string(),
            requested,
            rounded,
            alignment,
            limit: Some(self.options.limit),
            bytes_in_use: a.bytes_in_use(),
            pool_bytes: a.pool_bytes(),
            largest_free_block: largest,
            fragmentation: Stats::compute_fragmentation(a.pool_bytes(), a.bytes_in_use(), largest),
            device_free: self.device.mem_info().ok().map(|m| m.free),
            cause,
            bins: a.bin_summaries(),
            regions: a.region_maps(),
        }))
    }
}

impl<D: Device + ?Sized> Allocator for BfcAllocator<D> {
    fn name(&self) -> &str {
        "bfc"
    }

    fn id(&self) -> u64 {
        self.id
    }

    /// Best fit from the pool, growing it (or taking the preallocation) when nothing fits.
    ///
    /// # Errors
    /// [`Error::InvalidAlignment`] for an alignment that is not a power of two or exceeds
    /// [`MAX_ALIGNMENT`]; [`Error::InvalidSize`] for a size that overflows once rounded up
    /// to 256; [`Error::OutOfMemory`] (with a report) when it cannot be served within the
    /// limit or the device refuses to grow the pool.
    ///
    /// # Time complexity
    /// `O(log n)` in the number of free chunks (256-byte alignment), plus a device call
    /// when the pool grows.
    fn allocate(
        &self,
        size: u64,
        alignment: u64,
        stream: Stream,
        _tag: &str,
    ) -> Result<Allocation> {
        let alignment = effective_alignment(alignment, MIN_ALLOCATION, MAX_ALIGNMENT)?;
        if size == 0 {
            self.inner().num_allocs += 1;
            return Ok(Allocation::new(0, 0, stream, self.id, 0));
        }
        let rounded = round_up(size, MIN_ALLOCATION)?;
        let mut guard = self.inner();
        let inner = &mut *guard;
        let grant = match inner.arena.allocate(rounded, alignment, size) {
            Some(g) => g,
            None => {
                // A device base is only 256-aligned: leave room to align within the region.
                let need = rounded.saturating_add(alignment - MIN_ALLOCATION);
                if let Err(cause) = self.extend(inner, need) {
                    return Err(self.oom(inner, size, rounded, alignment, cause));
                }
                match inner.arena.allocate(rounded, alignment, size) {
                    Some(g) => g,
                    None => {
                        let cause = "no chunk fits even after growing the pool".to_string();
                        return Err(self.oom(inner, size, rounded, alignment, cause));
                    }
                }
            }
        };
        inner.num_allocs += 1;
        inner.peak_bytes_in_use = inner.peak_bytes_in_use.max(inner.arena.bytes_in_use());
        inner.largest_alloc_size = inner.largest_alloc_size.max(grant.chunk_size);
        Ok(Allocation::new(
            grant.addr,
            size,
            stream,
            self.id,
            grant.token,
        ))
    }

    /// Frees the chunk and coalesces it with its free neighbours at once.
    ///
    /// # Errors
    /// [`Error::ForeignAllocation`] when another allocator made it;
    /// [`Error::UnknownPointer`] when it names no live chunk of this allocator.
    ///
    /// # Time complexity
    /// `O(log n)` in the number of free chunks.
    fn deallocate(&self, allocation: Allocation) -> Result<()> {
        if allocation.allocator_id() != self.id {
            return Err(Error::ForeignAllocation {
                ptr: allocation.ptr(),
                owner: allocation.allocator_id(),
                this: self.id,
            });
        }
        if allocation.is_empty() {
            return Ok(());
        }
        match self
            .inner()
            .arena
            .free(allocation.token(), allocation.ptr())
        {
            Some(_) => Ok(()),
            None => Err(Error::UnknownPointer {
                what: "allocation",
                ptr: allocation.ptr(),
                backend: self.device.info().vendor.name(),
            }),
        }
    }

    /// # Time complexity
    /// `O(log n)`.
    fn stats(&self) -> Stats {
        let inner = self.inner();
        let a = &inner.arena;
        let largest = a.largest_free();
        Stats {
            num_allocs: inner.num_allocs,
            bytes_in_use: a.bytes_in_use(),
            peak_bytes_in_use: inner.peak_bytes_in_use,
            largest_alloc_size: inner.largest_alloc_size,
            bytes_limit: Some(self.options.limit),
            bytes_reserved: 0,
            peak_bytes_reserved: 0,
            largest_free_block_bytes: largest,
            pool_bytes: a.pool_bytes(),
            peak_pool_bytes: inner.peak_pool_bytes,
            fragmentation: Stats::compute_fragmentation(a.pool_bytes(), a.bytes_in_use(), largest),
        }
    }

    /// Returns every region that is entirely free to the device. Under preallocation the
    /// region is taken again at the next allocation.
    ///
    /// # Errors
    /// The device's error if it refuses a free; regions freed before it stay freed.
    ///
    /// # Time complexity
    /// `O(regions²)` plus a device call per region released.
    fn trim(&self) -> Result<u64> {
        let mut inner = self.inner();
        let mut released = 0;
        for (base, size) in inner.arena.free_regions() {
            self.device.free(base, size)?;
            inner.arena.remove_free_region(base);
            released += size;
        }
        Ok(released)
    }

    /// Checks the arena's invariants (see [`Arena::check_invariants`]) and the peaks.
    fn check_invariants(&self) -> std::result::Result<(), String> {
        let inner = self.inner();
        inner.arena.check_invariants()?;
        let a = &inner.arena;
        if inner.peak_bytes_in_use < a.bytes_in_use() || inner.peak_pool_bytes < a.pool_bytes() {
            return Err("a peak is below its current value".into());
        }
        if !self.options.preallocate && a.pool_bytes() > self.options.limit {
            return Err(format!(
                "pool {} exceeds the limit {}",
                a.pool_bytes(),
                self.options.limit
            ));
        }
        if self.options.preallocate && a.region_count() > 1 {
            return Err("a preallocating allocator holds more than one region".into());
        }
        Ok(())
    }
}

impl<D: Device + ?Sized> Drop for BfcAllocator<D> {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        let live = inner.arena.live_count();
        if live > 0 {
            tracing::warn!(
                allocator = "bfc",
                live,
                bytes = inner.arena.bytes_in_use(),
                "allocator dropped with live allocations (leaked); returning its regions to the device"
            );
        }
        for (base, size) in inner.arena.regions() {
            if let Err(e) = self.device.free(base, size) {
                tracing::warn!(base, size, error = %e, "could not return a bfc region to the device");
            }
        }
    }
}
