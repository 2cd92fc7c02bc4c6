//! [`CountingDevice`]: a [`Device`] that counts the calls made of the device beneath it.
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use crate::device::{
    Device, DeviceInfo, Event, MemInfo, PhysicalHandle, PoolUsage, Stream, StreamOrderedPool,
    VirtualMemory,
};
use crate::error::Result;

/// Calls made of a device, by kind. Failed calls count too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CallCounts {
    /// `alloc` calls.
    pub alloc: u64,
    /// `free` calls.
    pub free: u64,
    /// `mem_info` calls.
    pub mem_info: u64,
    /// Virtual-memory calls: reserve and free_reservation.
    pub vm_reserve: u64,
    /// Virtual-memory calls: create_physical and release_physical.
    pub vm_physical: u64,
    /// Virtual-memory calls: map, set_access and unmap.
    pub vm_map: u64,
    /// Stream-ordered pool calls: alloc_async, free_async, trim_to, threshold changes.
    pub pool: u64,
    /// Stream and event calls, and pool queries.
    pub other: u64,
}

impl CallCounts {
    /// Every call that takes or returns memory (`alloc`, `free`, the virtual-memory ones and
    /// the pool's): the calls that cost time on a real driver.
    pub fn memory_calls(&self) -> u64 {
        self.alloc + self.free + self.vm_reserve + self.vm_physical + self.vm_map + self.pool
    }
}

#[derive(Debug, Default)]
struct Counters {
    alloc: AtomicU64,
    free: AtomicU64,
    mem_info: AtomicU64,
    vm_reserve: AtomicU64,
    vm_physical: AtomicU64,
    vm_map: AtomicU64,
    pool: AtomicU64,
    other: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Delegates every call to `inner` and counts it.
#[derive(Debug)]
pub struct CountingDevice<D: Device + ?Sized> {
    inner: Arc<D>,
    counters: Counters,
}

impl<D: Device + ?Sized> CountingDevice<D> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<D>) -> Self {
        CountingDevice {
            inner,
            counters: Counters::default(),
        }
    }

    /// The device beneath.
    pub fn inner(&self) -> &Arc<D> {
        &self.inner
    }

    /// The counts so far.
    pub fn counts(&self) -> CallCounts {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CallCounts {
            alloc: get(&c.alloc),
            free: get(&c.free),
            mem_info: get(&c.mem_info),
            vm_reserve: get(&c.vm_reserve),
            vm_physical: get(&c.vm_physical),
            vm_map: get(&c.vm_map),
            pool: get(&c.pool),
            other: get(&c.other),
        }
    }
}

impl<D: Device + ?Sized> Device for CountingDevice<D> {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn mem_info(&self) -> Result<MemInfo> {
        bump(&self.counters.mem_info);
        self.inner.mem_info()
    }
    fn alloc(&self, size: u64) -> Result<u64> {
        bump(&self.counters.alloc);
        self.inner.alloc(size)
    }
    fn free(&self, ptr: u64, size: u64) -> Result<()> {
        bump(&self.counters.free);
        self.inner.free(ptr, size)
    }
    fn virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        // Counting needs the calls to come through here, so hand out `self`.
        self.inner
            .virtual_memory()
            .map(|_| self as &dyn VirtualMemory)
    }
    fn stream_ordered_pool(&self) -> Option<&dyn StreamOrderedPool> {
        // Counting needs the calls to come through here, so hand out `self`.
        self.inner
            .stream_ordered_pool()
            .map(|_| self as &dyn StreamOrderedPool)
    }
    fn create_stream(&self) -> Result<Stream> {
        bump(&self.counters.other);
        self.inner.create_stream()
    }
    fn destroy_stream(&self, stream: Stream) -> Result<()> {
        bump(&self.counters.other);
        self.inner.destroy_stream(stream)
    }
    fn synchronize_stream(&self, stream: Stream) -> Result<()> {
        bump(&self.counters.other);
        self.inner.synchronize_stream(stream)
    }
    fn synchronize_device(&self) -> Result<()> {
        bump(&self.counters.other);
        self.inner.synchronize_device()
    }
    fn create_event(&self) -> Result<Event> {
        bump(&self.counters.other);
        self.inner.create_event()
    }
    fn record_event(&self, event: Event, stream: Stream) -> Result<()> {
        bump(&self.counters.other);
        self.inner.record_event(event, stream)
    }
    fn event_complete(&self, event: Event) -> Result<bool> {
        bump(&self.counters.other);
        self.inner.event_complete(event)
    }
    fn synchronize_event(&self, event: Event) -> Result<()> {
        bump(&self.counters.other);
        self.inner.synchronize_event(event)
    }
    fn destroy_event(&self, event: Event) -> Result<()> {
        bump(&self.counters.other);
        self.inner.destroy_event(event)
    }
    fn can_access_peer(&self, peer: &dyn Device) -> Result<bool> {
        bump(&self.counters.other);
        self.inner.can_access_peer(peer)
    }
    fn enable_peer_access(&self, peer: &dyn Device) -> Result<()> {
        bump(&self.counters.other);
        self.inner.enable_peer_access(peer)
    }
    fn peer_access(&self) -> Vec<u32> {
        self.inner.peer_access()
    }
}

impl<D: Device + ?Sized> VirtualMemory for CountingDevice<D> {
    fn granularity(&self) -> u64 {
        self.inner
            .virtual_memory()
            .map_or(self.inner.info().min_granularity, |v| v.granularity())
    }
    fn reserve(&self, size: u64, alignment: u64) -> Result<u64> {
        bump(&self.counters.vm_reserve);
        self.vm()?.reserve(size, alignment)
    }
    fn free_reservation(&self, va: u64, size: u64) -> Result<()> {
        bump(&self.counters.vm_reserve);
        self.vm()?.free_reservation(va, size)
    }
    fn create_physical(&self, size: u64) -> Result<PhysicalHandle> {
        bump(&self.counters.vm_physical);
        self.vm()?.create_physical(size)
    }
    fn release_physical(&self, handle: PhysicalHandle) -> Result<()> {
        bump(&self.counters.vm_physical);
        self.vm()?.release_physical(handle)
    }
    fn map(&self, va: u64, size: u64, handle: PhysicalHandle, offset: u64) -> Result<()> {
        bump(&self.counters.vm_map);
        self.vm()?.map(va, size, handle, offset)
    }
    fn set_access(&self, va: u64, size: u64) -> Result<()> {
        bump(&self.counters.vm_map);
        self.vm()?.set_access(va, size)
    }
    fn unmap(&self, va: u64, size: u64) -> Result<()> {
        bump(&self.counters.vm_map);
        self.vm()?.unmap(va, size)
    }
    fn set_access_with_peers(&self, va: u64, size: u64, peers: &[u32]) -> Result<()> {
        bump(&self.counters.vm_map);
        self.vm()?.set_access_with_peers(va, size, peers)
    }
}

impl<D: Device + ?Sized> StreamOrderedPool for CountingDevice<D> {
    fn alloc_async(&self, size: u64, stream: Stream) -> Result<u64> {
        bump(&self.counters.pool);
        self.pool()?.alloc_async(size, stream)
    }
    fn free_async(&self, ptr: u64, stream: Stream) -> Result<()> {
        bump(&self.counters.pool);
        self.pool()?.free_async(ptr, stream)
    }
    fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        bump(&self.counters.pool);
        self.pool()?.set_release_threshold(bytes)
    }
    fn release_threshold(&self) -> Result<u64> {
        bump(&self.counters.other);
        self.pool()?.release_threshold()
    }
    fn trim_to(&self, keep: u64) -> Result<()> {
        bump(&self.counters.pool);
        self.pool()?.trim_to(keep)
    }
    fn usage(&self) -> Result<PoolUsage> {
        bump(&self.counters.other);
        self.pool()?.usage()
    }
}

impl<D: Device + ?Sized> CountingDevice<D> {
    fn pool(&self) -> Result<&dyn StreamOrderedPool> {
        self.inner
            .stream_ordered_pool()
            .ok_or_else(|| crate::Error::Unsupported {
                what: "stream-ordered pools".into(),
                backend: self.inner.info().vendor.name(),
                reason: "the device beneath has no stream-ordered pool".into(),
            })
    }

    fn vm(&self) -> Result<&dyn VirtualMemory> {
        self.inner
            .virtual_memory()
            .ok_or_else(|| crate::Error::Unsupported {
                what: "virtual memory".into(),
                backend: self.inner.info().vendor.name(),
                reason: "the device beneath has no virtual-memory capability".into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::host::HostDevice;

    #[test]
    fn counts_each_kind_of_call() {
        let host = Arc::new(
            HostDevice::builder()
                .capacity(64 << 20)
                .simulated(true)
                .build()
                .unwrap(),
        );
        let dev = CountingDevice::new(host);
        let p = dev.alloc(1 << 20).unwrap();
        dev.free(p, 1 << 20).unwrap();
        assert!(dev.alloc(1 << 40).is_err(), "failed calls count too");
        let vm = dev.virtual_memory().unwrap();
        let va = vm.reserve(4 << 20, 0).unwrap();
        let h = vm.create_physical(2 << 20).unwrap();
        vm.map(va, 2 << 20, h, 0).unwrap();
        vm.set_access(va, 2 << 20).unwrap();
        vm.unmap(va, 2 << 20).unwrap();
        vm.release_physical(h).unwrap();
        vm.free_reservation(va, 4 << 20).unwrap();
        let c = dev.counts();
        assert_eq!(
            (c.alloc, c.free, c.vm_reserve, c.vm_physical, c.vm_map),
            (2, 1, 2, 2, 3)
        );
        assert_eq!(c.memory_calls(), 10);
    }
}
