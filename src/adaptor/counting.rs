//! [`CountingDevice`]: a [`Device`] that counts the calls made of the device beneath it.
#![deny(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use super::forward::{Call, DeviceWrapper};
use crate::device::Device;
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
    /// Copies between device and host memory: copy_to_host and copy_from_host.
    pub copies: u64,
    /// Pinned host memory calls: alloc_pinned_host, free_pinned_host, register_host and
    /// unregister_host.
    pub pinned_host: u64,
    /// Stream and event calls, and pool queries.
    pub other: u64,
}

impl CallCounts {
    /// Every call that takes or returns memory (`alloc`, `free`, the virtual-memory ones, the
    /// pool's and pinned host memory's): the calls that cost time on a real driver. Copies
    /// move bytes and take no memory: not counted here.
    pub fn memory_calls(&self) -> u64 {
        self.alloc
            + self.free
            + self.vm_reserve
            + self.vm_physical
            + self.vm_map
            + self.pool
            + self.pinned_host
    }
}

/// Calls made of a device by name ([`Call::NAMES`]), each with how many and the bytes they
/// acted on ([`Call::bytes`]): what a cost table prices (`replay::costs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CallTally {
    /// `(count, bytes)` by call name, for every name called at least once.
    pub by_name: std::collections::BTreeMap<&'static str, (u64, u64)>,
}

impl CallTally {
    /// The calls of `self` not in `before` (an earlier tally of the same device): what was
    /// called between the two.
    pub fn since(&self, before: &CallTally) -> CallTally {
        let by_name = self
            .by_name
            .iter()
            .filter_map(|(&name, &(count, bytes))| {
                let (c0, b0) = before.by_name.get(name).copied().unwrap_or((0, 0));
                let count = count.saturating_sub(c0);
                (count > 0).then_some((name, (count, bytes.saturating_sub(b0))))
            })
            .collect();
        CallTally { by_name }
    }
}

/// Delegates every call to `inner` and counts it (a [`DeviceWrapper`]).
#[derive(Debug)]
pub struct CountingDevice<D: Device + ?Sized> {
    inner: Arc<D>,
    /// Calls and bytes by [`Call::ordinal`]; the counts by kind ([`CallCounts`]) are read
    /// from them.
    by_name: [(AtomicU64, AtomicU64); Call::NAMES.len()],
}

impl<D: Device + ?Sized> CountingDevice<D> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<D>) -> Self {
        CountingDevice {
            inner,
            by_name: std::array::from_fn(|_| (AtomicU64::new(0), AtomicU64::new(0))),
        }
    }

    /// The device beneath.
    pub fn inner(&self) -> &Arc<D> {
        &self.inner
    }

    /// The calls so far by name, with the bytes they acted on.
    pub fn tally(&self) -> CallTally {
        let by_name = Call::NAMES
            .iter()
            .zip(&self.by_name)
            .filter_map(|(&name, (count, bytes))| {
                let count = count.load(Ordering::Relaxed);
                (count > 0).then(|| (name, (count, bytes.load(Ordering::Relaxed))))
            })
            .collect();
        CallTally { by_name }
    }

    /// The counts so far, by kind.
    pub fn counts(&self) -> CallCounts {
        let mut c = CallCounts::default();
        for (&name, (count, _)) in Call::NAMES.iter().zip(&self.by_name) {
            let n = count.load(Ordering::Relaxed);
            let kind = match name {
                "mem_info" => &mut c.mem_info,
                "alloc" => &mut c.alloc,
                "free" => &mut c.free,
                "reserve" | "free_reservation" => &mut c.vm_reserve,
                "create_physical" | "release_physical" => &mut c.vm_physical,
                "map" | "set_access" | "set_access_with_peers" | "unmap" => &mut c.vm_map,
                "alloc_async" | "free_async" | "set_release_threshold" | "trim_to" => &mut c.pool,
                "copy_to_host" | "copy_from_host" => &mut c.copies,
                "alloc_pinned_host" | "free_pinned_host" | "register_host" | "unregister_host" => {
                    &mut c.pinned_host
                }
                _ => &mut c.other,
            };
            *kind += n;
        }
        c
    }
}

impl<D: Device + ?Sized> DeviceWrapper for CountingDevice<D> {
    type Inner = D;

    fn wrapped(&self) -> &D {
        &self.inner
    }

    /// Counts the call, failed or not, by name, with the bytes it acts on.
    fn before(&self, call: &Call<'_>) -> Result<()> {
        let (count, bytes) = &self.by_name[call.ordinal()];
        count.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(call.bytes(), Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::host::HostDevice;

    #[test]
    #[allow(unsafe_code)]
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
        // By name, with the bytes each acted on: 1 MiB allocated twice (one refused 1 TiB
        // too), the 4 MiB reservation, one 2 MiB handle mapped, opened and unmapped.
        let t = dev.tally();
        let mib = 1u64 << 20;
        assert_eq!(t.by_name["alloc"], (2, mib + (1 << 40)));
        assert_eq!(t.by_name["free"], (1, mib));
        assert_eq!(t.by_name["reserve"], (1, 4 * mib));
        assert_eq!(t.by_name["free_reservation"], (1, 4 * mib));
        for name in ["create_physical", "map", "set_access", "unmap"] {
            assert_eq!(t.by_name[name], (1, 2 * mib), "{name}");
        }
        assert_eq!(t.by_name["release_physical"], (1, 0));
        assert_eq!(t.by_name.len(), 9, "{t:?}");
        assert_eq!(t.since(&t), CallTally::default());
        assert_eq!(dev.alloc_pinned_host(64).unwrap(), None, "simulated: none");
        let p = dev.alloc(256).unwrap();
        let mut buf = [0u8; 8];
        // SAFETY: `buf` outlives the copy; `p` is a live allocation of 256 bytes.
        unsafe { dev.copy_to_host(buf.as_mut_ptr(), p, 8, crate::Stream::DEFAULT) }.unwrap();
        let c = dev.counts();
        assert_eq!((c.copies, c.pinned_host, c.memory_calls()), (1, 1, 12));
    }
}
