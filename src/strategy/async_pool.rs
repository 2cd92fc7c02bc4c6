//! The `async` strategy: the device's stream-ordered memory pool, as XLA's
//! `GpuCudaMallocAsyncAllocator` uses it (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on
//! CUDA, `hipMallocFromPoolAsync` / `hipFreeAsync` on HIP), through
//! [`StreamOrderedPool`].
//!
//! Selected by `XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async`, `TF_GPU_ALLOCATOR=cuda_malloc_async`
//! or `PORTALLOC_ALLOCATOR=async`.
//!
//! # XLA's semantics, kept
//!
//! * **Release threshold** = `fraction × total` when preallocating
//!   (`XLA_PYTHON_CLIENT_PREALLOCATE`, default true), else 0: the pool keeps up to that much
//!   memory across synchronisations, and returns the rest to the device at each one.
//! * **`TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC`** as XLA reads it
//!   ([`AsyncOptions::preallocation`]): `-1` preallocates up to the release threshold
//!   (nothing when preallocation is off, since the threshold is then 0); any other value is
//!   ignored when preallocating (the whole threshold is preallocated); with preallocation off,
//!   `N > 0` bytes are allocated and freed at once, which leaves them in the pool until the
//!   next synchronisation gives them back. The preallocation is made on the default stream
//!   when the allocator is built, and is not counted in the statistics (XLA clears them).
//! * **Out of memory**: the stream is synchronised (which lets the driver return and
//!   coalesce freed memory) and the request retried once — with the allocator's lock
//!   released: no lock is held across a pool call or a wait.
//! * **Statistics count requested bytes**, not the pool's rounding.
//!
//! # Where this differs from XLA, and why
//!
//! * **The limit is enforced**: XLA only reports `bytes_limit`; here a request that would
//!   take the bytes in use past `fraction × total` is an [`Error::OutOfMemory`] with a
//!   report, as for the other strategies, so that every strategy has the same budget.
//! * **Alignment**: pools return 256-byte-aligned memory (or better); alignments above 256
//!   are refused with [`Error::InvalidAlignment`] rather than padded.
//! * **Any stream**: XLA binds the allocator to one stream; here every request names its
//!   own, and the pool keeps the stream-ordering contract of [`Device`].
//! * A device without a pool is [`Error::Unsupported`] naming the backend, never a silent
//!   fallback (XLA aborts).
//!
//! # On AMD GPUs
//!
//! XLA has no ROCm equivalent of `cuda_async`: there `XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async`
//! fails. portalloc serves it with HIP's stream-ordered pools (`hipMallocFromPoolAsync`, the
//! `hipMallocAsync` family) where the device reports the pools attribute, with the release
//! threshold set explicitly (ROCm pools are known not to return memory otherwise).
#![deny(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::common::{admit, holds_memory, synchronized, Admitted, FailedRequest};
use crate::allocator::{next_allocator_id, Allocation, Allocator, Stats};
use crate::config::{Config, ASYNC_PREALLOC_ACCEPTED};
use crate::device::{Device, PoolUsage, Stream, StreamOrderedPool};
use crate::error::{Error, Result};
use crate::report::OomReport;
use crate::units::Bytes;

/// Pools hand out memory aligned to at least this (and no more is promised).
pub const POOL_ALIGNMENT: u64 = 256;

/// Options of [`AsyncPoolAllocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncOptions {
    /// The most bytes in use at once (`fraction × total`).
    pub limit: u64,
    /// XLA's preallocate switch: release threshold = `limit` (true) or 0 (false).
    pub preallocate: bool,
    /// `TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC`: `-1`, a byte count ≥ 0, or unset.
    pub prealloc_bytes: Option<i64>,
}

impl AsyncOptions {
    /// No preallocation, release threshold 0.
    pub fn new(limit: u64) -> Self {
        AsyncOptions {
            limit,
            preallocate: false,
            prealloc_bytes: None,
        }
    }

    /// The options `config` gives for a device of `total` bytes.
    pub fn from_config(config: &Config, total: u64) -> Self {
        AsyncOptions {
            limit: config.limit(total),
            preallocate: config.preallocate.value,
            prealloc_bytes: config.async_prealloc.value,
        }
    }

    /// The pool's release threshold: `limit` when preallocating, else 0.
    pub fn release_threshold(&self) -> u64 {
        if self.preallocate {
            self.limit
        } else {
            0
        }
    }

    /// Bytes allocated and freed at construction, as XLA reads
    /// `TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC`: `-1` → the release threshold; otherwise the
    /// threshold when preallocating (the value is ignored); otherwise the value (0 if unset).
    pub fn preallocation(&self) -> u64 {
        match self.prealloc_bytes {
            Some(-1) => self.release_threshold(),
            _ if self.preallocate => self.release_threshold(),
            Some(n) => u64::try_from(n).unwrap_or(0),
            None => 0,
        }
    }
}

/// A live allocation.
#[derive(Debug, Clone, Copy)]
struct Live {
    size: u64,
    stream: Stream,
    token: u64,
}

/// Everything behind the lock.
#[derive(Debug, Default)]
struct Books {
    /// Address → allocation. Invariant: the sizes sum to `stats.bytes_in_use`.
    live: HashMap<u64, Live>,
    next_token: u64,
    stats: Stats,
    /// Requests that failed for lack of memory and were retried after a synchronisation.
    retries: u64,
}

/// The device's stream-ordered pool as an [`Allocator`]. See the [module docs](self).
///
/// Thread-safe: one mutex guards the books, held across the pool call (as the pool itself
/// serialises).
#[derive(Debug)]
pub struct AsyncPoolAllocator<D: Device + ?Sized> {
    device: Arc<D>,
    options: AsyncOptions,
    id: u64,
    books: Mutex<Books>,
}

fn unsupported<D: Device + ?Sized>(device: &D) -> Error {
    let backend = device.info().vendor.name();
    Error::Unsupported {
        what: "strategy `async` (a stream-ordered memory pool)".into(),
        backend,
        reason: format!(
            "device {} ({}) offers no stream-ordered memory pool (on CUDA it needs a driver for \
             CUDA 11.2+ and CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED; on HIP the memory-pools \
             attribute); use bfc or vmm instead",
            device.info().ordinal,
            device.info().name
        ),
    }
}

impl<D: Device + ?Sized> AsyncPoolAllocator<D> {
    /// Sets the pool's release threshold and makes the preallocation
    /// ([`AsyncOptions::preallocation`]) on the default stream. A preallocation the device
    /// refuses is a warning, as in XLA: the pool then grows on demand.
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// use portalloc::backends::host::HostDevice;
    /// use portalloc::strategy::async_pool::{AsyncOptions, AsyncPoolAllocator};
    /// use portalloc::{Allocator, Stream};
    ///
    /// // The host device has a stream-ordered pool with CUDA's semantics.
    /// let device = Arc::new(HostDevice::builder().capacity(1 << 30).simulated(true).build()?);
    /// // XLA's preallocate switch: the pool keeps up to the limit when idle, and takes it
    /// // at once.
    /// let options = AsyncOptions { preallocate: true, ..AsyncOptions::new(64 << 20) };
    /// assert_eq!(options.release_threshold(), 64 << 20);
    /// let pool = AsyncPoolAllocator::new(device, options)?;
    /// assert_eq!(pool.pool_usage()?.reserved_current, 64 << 20);
    ///
    /// // Freed in stream order on the stream it was made for: reused on that stream at
    /// // once, on others once the work queued before the free is done.
    /// let stream = Stream::PER_THREAD;
    /// let scratch = pool.allocate(1 << 20, 0, stream, "scratch")?;
    /// assert_eq!(pool.pool_usage()?.used_current, 1 << 20);
    /// pool.deallocate(scratch)?;
    /// assert_eq!(pool.stats().bytes_in_use, 0);
    /// # Ok::<(), portalloc::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device has no stream-ordered pool;
    /// [`Error::Config`] for a `prealloc_bytes` below −1; the pool's error when it refuses
    /// the release threshold.
    pub fn new(device: Arc<D>, options: AsyncOptions) -> Result<Self> {
        if let Some(n) = options.prealloc_bytes.filter(|&n| n < -1) {
            return Err(Error::config(
                "async_prealloc",
                n.to_string(),
                ASYNC_PREALLOC_ACCEPTED,
            ));
        }
        let pool = device
            .stream_ordered_pool()
            .ok_or_else(|| unsupported(&*device))?;
        pool.set_release_threshold(options.release_threshold())?;
        let prealloc = options.preallocation();
        if prealloc > 0 {
            match pool.alloc_async(prealloc, Stream::DEFAULT) {
                Ok(ptr) => {
                    if let Err(e) = pool.free_async(ptr, Stream::DEFAULT) {
                        tracing::warn!(ptr, error = %e, "could not free the async preallocation");
                    }
                }
                Err(e) => tracing::warn!(
                    bytes = prealloc,
                    error = %e,
                    "the device refused the async pool's preallocation; the pool grows on demand"
                ),
            }
        }
        let books = Books {
            next_token: 1,
            stats: Stats {
                bytes_limit: Some(options.limit),
                ..Stats::default()
            },
            ..Books::default()
        };
        Ok(AsyncPoolAllocator {
            device,
            options,
            id: next_allocator_id(),
            books: Mutex::new(books),
        })
    }

    /// The device it allocates from.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// The options it was made with.
    pub fn options(&self) -> AsyncOptions {
        self.options
    }

    /// How many requests failed for lack of memory and were retried after synchronising the
    /// stream (successfully or not).
    pub fn retries(&self) -> u64 {
        self.books().retries
    }

    /// The pool's counters now.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device no longer offers its pool; the pool's error.
    pub fn pool_usage(&self) -> Result<PoolUsage> {
        self.pool()?.usage()
    }

    fn pool(&self) -> Result<&dyn StreamOrderedPool> {
        self.device
            .stream_ordered_pool()
            .ok_or_else(|| unsupported(&*self.device))
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // Every update is a few field writes after the pool call, so a poisoned lock is
        // still consistent.
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn oom(&self, books: &Books, requested: u64, rounded: u64, cause: String) -> Error {
        let pool_bytes = self
            .pool()
            .and_then(|p| p.usage())
            .map_or(0, |u| u.reserved_current);
        let request = FailedRequest {
            allocator: self.name(),
            requested,
            rounded,
            alignment: POOL_ALIGNMENT,
            limit: Some(self.options.limit),
        };
        Error::OutOfMemory(Box::new(OomReport {
            bytes_in_use: books.stats.bytes_in_use,
            pool_bytes,
            ..request.report(&*self.device, cause)
        }))
    }
}

impl<D: Device + ?Sized> Allocator for AsyncPoolAllocator<D> {
    crate::allocator::no_sleep!();

    fn name(&self) -> &str {
        "async"
    }

    fn id(&self) -> u64 {
        self.id
    }

    /// One `alloc_async` on `stream`; on out-of-memory, the stream is synchronised and the
    /// request retried once.
    ///
    /// # Errors
    /// [`Error::InvalidAlignment`] above 256; [`Error::InvalidSize`] for a size that
    /// overflows once rounded; [`Error::OutOfMemory`] (with a report) past the limit or when
    /// the pool cannot serve it even after the retry; the pool's other errors as they are.
    fn allocate(
        &self,
        size: u64,
        alignment: u64,
        stream: Stream,
        _tag: &str,
    ) -> Result<Allocation> {
        let Some(Admitted { rounded, .. }) =
            admit(size, alignment, POOL_ALIGNMENT, POOL_ALIGNMENT)?
        else {
            self.books().stats.num_allocs += 1;
            return Ok(Allocation::empty(stream, self.id));
        };
        // The bytes are taken from the limit under the lock; the pool is called without it, so
        // that a request waiting for the driver (or synchronising on its retry) blocks no one.
        {
            let mut books = self.books();
            let limit = self.options.limit;
            let in_use = books.stats.bytes_in_use;
            if size > limit.saturating_sub(in_use) {
                let cause = if size > limit {
                    format!(
                        "the request exceeds the limit of {} ({limit} B)",
                        Bytes(limit)
                    )
                } else {
                    format!(
                        "the limit of {} is reached: {} in use, {} left",
                        Bytes(limit),
                        Bytes(in_use),
                        Bytes(limit - in_use)
                    )
                };
                return Err(self.oom(&books, size, rounded, cause));
            }
            books.stats.bytes_in_use += size;
        }
        // Out of memory: synchronise the stream (the driver then returns and coalesces what
        // was freed on it) and retry once. `Err((e, None))` is any other failure.
        let served = self.pool().map_err(|e| (e, None)).and_then(|pool| {
            match pool.alloc_async(size, stream) {
                Err(first) if first.is_out_of_memory() => {
                    self.books().retries += 1;
                    self.device
                        .synchronize_stream(stream)
                        .and_then(|()| pool.alloc_async(size, stream))
                        .map_err(|second| (second, Some(Box::new(first))))
                }
                other => other.map_err(|e| (e, None)),
            }
        });
        let mut books = self.books();
        let ptr = match served {
            Ok(ptr) => ptr,
            Err((e, first)) => {
                books.stats.bytes_in_use -= size;
                let Some(first) = first else {
                    return Err(e);
                };
                let cause = format!(
                    "the pool could not serve it ({first}); after synchronizing stream {} and \
                     retrying once: {e}",
                    stream.0
                );
                return Err(self.oom(&books, size, rounded, cause));
            }
        };
        let token = books.next_token;
        books.next_token += 1;
        books.live.insert(
            ptr,
            Live {
                size,
                stream,
                token,
            },
        );
        let s = &mut books.stats;
        s.num_allocs += 1;
        s.peak_bytes_in_use = s.peak_bytes_in_use.max(s.bytes_in_use);
        s.largest_alloc_size = s.largest_alloc_size.max(size);
        Ok(Allocation::new(ptr, size, stream, self.id, token))
    }

    fn deallocate(&self, allocation: Allocation) -> Result<()> {
        if !holds_memory(&allocation, self.id)? {
            return Ok(());
        }
        let ptr = allocation.ptr();
        let live = {
            let mut books = self.books();
            let live = books
                .live
                .get(&ptr)
                .copied()
                .filter(|l| l.token == allocation.token())
                .ok_or(Error::UnknownPointer {
                    what: "allocation",
                    ptr,
                    backend: self.device.info().vendor.name(),
                })?;
            books.live.remove(&ptr);
            live
        };
        // Made on another thread's per-thread stream: a free on this thread's would not be
        // ordered after that work, so the device is synchronised first (without the lock).
        if allocation.freed_off_its_thread() {
            synchronized(&*self.device);
        }
        let freed = self
            .pool()
            .and_then(|pool| pool.free_async(ptr, live.stream));
        let mut books = self.books();
        match freed {
            Ok(()) => {
                books.stats.bytes_in_use -= live.size;
                Ok(())
            }
            Err(e) => {
                books.live.insert(ptr, live);
                Err(e)
            }
        }
    }

    /// Requested bytes in use; the pool's reserved bytes as `pool_bytes`. The pool does not
    /// say how its free memory is split, so `largest_free_block_bytes` and `fragmentation`
    /// are 0.
    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        self.books()
            .live
            .get(&allocation.ptr())
            .filter(|l| l.token == allocation.token())
            .map(|l| l.size)
    }

    fn stats(&self) -> Stats {
        let mut stats = self.books().stats;
        if let Ok(u) = self.pool_usage() {
            stats.pool_bytes = u.reserved_current;
            stats.peak_pool_bytes = u.reserved_high;
        }
        stats
    }

    /// True: `allocate` queues `cuMemAllocFromPoolAsync` / `hipMallocFromPoolAsync` on the
    /// request's stream.
    fn queues_on_stream(&self) -> bool {
        true
    }

    /// Returns every idle byte of the pool to the device (`trim_to(0)`); memory freed on a
    /// stream whose work is still pending stays.
    ///
    /// # Errors
    /// The pool's error.
    fn trim(&self) -> Result<u64> {
        let pool = self.pool()?;
        let before = pool.usage()?.reserved_current;
        pool.trim_to(0)?;
        let after = pool.usage()?.reserved_current;
        Ok(before.saturating_sub(after))
    }

    /// The live sizes sum to `bytes_in_use`, the peak is not below it, and the pool uses at
    /// least that much.
    fn check_invariants(&self) -> std::result::Result<(), String> {
        let books = self.books();
        let sum: u64 = books.live.values().map(|l| l.size).sum();
        let s = &books.stats;
        if sum != s.bytes_in_use {
            return Err(format!(
                "live allocations sum to {sum}, bytes_in_use = {}",
                s.bytes_in_use
            ));
        }
        if s.peak_bytes_in_use < s.bytes_in_use {
            return Err("peak_bytes_in_use is below bytes_in_use".into());
        }
        if s.bytes_in_use > self.options.limit {
            return Err(format!(
                "{} in use exceeds the limit {}",
                s.bytes_in_use, self.options.limit
            ));
        }
        let usage = self.pool_usage().map_err(|e| e.to_string())?;
        if usage.used_current < s.bytes_in_use {
            return Err(format!(
                "the pool has {} in use, less than the {} handed out",
                usage.used_current, s.bytes_in_use
            ));
        }
        Ok(())
    }
}

impl<D: Device + ?Sized> Drop for AsyncPoolAllocator<D> {
    fn drop(&mut self) {
        let books = self.books.get_mut().unwrap_or_else(|p| p.into_inner());
        let live = std::mem::take(&mut books.live);
        let Some(pool) = self.device.stream_ordered_pool() else {
            return;
        };
        if !live.is_empty() {
            tracing::warn!(
                allocator = "async",
                live = live.len(),
                bytes = books.stats.bytes_in_use,
                "allocator dropped with live allocations (leaked); freeing them to the pool"
            );
        }
        for (ptr, l) in live {
            if let Err(e) = pool.free_async(ptr, l.stream) {
                tracing::warn!(ptr, error = %e, "could not free an async allocation");
            }
        }
        if let Err(e) = pool.trim_to(0) {
            tracing::warn!(error = %e, "could not trim the async pool");
        }
    }
}
