//! The rules the shared GPU layer (`backends/gpu`) now writes once for CUDA and HIP, checked on
//! both conformance fakes with one test body each: a wrong size or a foreign pointer is refused
//! before the driver sees it, a foreign or destroyed stream or event is refused, a double free
//! is refused, a refused call leaves the books and the driver as they were, a driver call that
//! blocks holds none of the device's locks, and a dropped device gives everything back (the
//! fake's own live counts, not only portalloc's census).
//!
//! Each test loads a private copy of the fake (its state is per library), so the tests run in
//! parallel without sharing a driver.
#![cfg(all(feature = "cuda", feature = "hip"))]

use crate::support::fakes::FakeDevice;
use portalloc::backends::cuda::CudaDevice;
use portalloc::backends::hip::HipDevice;
use portalloc::backends::VendorCensus;
use portalloc::device::{Device, Event, PhysicalHandle, Stream};
use portalloc::{Error, Vendor};
use test_case::test_case;

const MIB: u64 = 1 << 20;

/// A private copy of one vendor's conformance fake (`crate::support::fakes`: its state is per
/// library), with one device of 64 MiB and every capability on (fakehip as ROCm 7).
struct Fake(crate::support::fakes::Fake);

impl std::ops::Deref for Fake {
    type Target = crate::support::fakes::Fake;

    fn deref(&self) -> &crate::support::fakes::Fake {
        &self.0
    }
}

/// An open device of either vendor, with its census.
enum Opened {
    Cuda(CudaDevice),
    Hip(HipDevice),
}

impl Opened {
    fn device(&self) -> &dyn Device {
        match self {
            Opened::Cuda(d) => d,
            Opened::Hip(d) => d,
        }
    }

    fn census(&self) -> VendorCensus {
        match self {
            Opened::Cuda(d) => d.census(),
            Opened::Hip(d) => d.census(),
        }
    }
}

impl Fake {
    /// A private copy of the vendor's fake with one 64 MiB device.
    fn new(vendor: Vendor) -> Fake {
        Fake(crate::support::fakes::Fake::with_devices(
            vendor,
            1,
            64 * MIB,
        ))
    }

    /// Device 0 of this fake, through portalloc's own loader.
    fn open(&self) -> Opened {
        match self.vendor() {
            Vendor::Cuda => Opened::Cuda(<CudaDevice as FakeDevice>::open(&self.0, 0)),
            _ => Opened::Hip(<HipDevice as FakeDevice>::open(&self.0, 0)),
        }
    }

    /// The next call of the vendor's `call` fails with the vendor's "not supported" code
    /// (801 in both: `CUDA_ERROR_NOT_SUPPORTED`, `hipErrorNotSupported`).
    fn fail_next(&self, call: &str) {
        self.fail(call, 1, 1, 801);
    }

    /// The vendor's name of a call.
    fn call(&self, cuda: &'static str, hip: &'static str) -> &'static str {
        match self.vendor() {
            Vendor::Cuda => cuda,
            _ => hip,
        }
    }

    /// Runs `test` on device 0 of a private copy of `vendor`'s fake, then drops the device and
    /// checks that the driver holds nothing any more.
    fn with_device(vendor: Vendor, test: impl FnOnce(&Fake, &Opened)) {
        let fake = Fake::new(vendor);
        let opened = fake.open();
        test(&fake, &opened);
        drop(opened);
        fake.assert_empty();
    }
}

/// Declares each test once and runs it on both fakes: `fn name(fake, opened, device) { … }`
/// becomes a `test-case` table over CUDA and HIP whose body runs on device 0 of a private copy
/// of the vendor's fake, which must hold nothing once the device is dropped.
macro_rules! on_both_vendors {
    ($($(#[$doc:meta])* fn $name:ident($fake:ident, $opened:ident, $device:ident) $body:block)*) => {$(
        $(#[$doc])*
        #[test_case(Vendor::Cuda ; "cuda")]
        #[test_case(Vendor::Hip ; "hip")]
        #[allow(unused_variables)]
        fn $name(vendor: Vendor) {
            Fake::with_device(vendor, |$fake, $opened| {
                let $device = $opened.device();
                $body
            });
        }
    )*};
}

on_both_vendors! {
    /// A size that is not the allocation's is refused before the driver frees anything.
    fn a_wrong_size_on_free_is_refused_and_the_allocation_kept(fake, opened, device) {
        let ptr = device.alloc(4096).unwrap();
        for wrong in [4095, 4097, 0] {
            assert!(
                matches!(
                    device.free(ptr, wrong),
                    Err(Error::InvalidArgument { call: "free", .. })
                ),
                "{:?}: free with {wrong} bytes",
                fake.vendor()
            );
        }
        assert_eq!(opened.census().allocations, 1);
        assert_eq!(
            fake.live("allocations"),
            1,
            "the driver never saw the refused frees"
        );
        device.free(ptr, 4096).unwrap();
        assert!(opened.census().is_empty());
    }

    /// Pointers and handles the device never handed out are refused before the driver sees them.
    fn pointers_and_handles_it_never_handed_out_are_refused(fake, opened, device) {
        let held = device.alloc(4096).unwrap();
        let foreign = held + (1 << 40);
        let unknown = |r: Result<(), Error>| match r {
            Err(Error::UnknownPointer { what, ptr, .. }) => Some((what, ptr)),
            _ => None,
        };
        assert_eq!(
            unknown(device.free(foreign, 4096)),
            Some(("allocation", foreign))
        );
        let pool = device.stream_ordered_pool().expect("the fake has pools");
        assert_eq!(
            unknown(pool.free_async(foreign, Stream::DEFAULT)),
            Some(("pool allocation", foreign))
        );
        let vm = device
            .virtual_memory()
            .expect("the fake has virtual memory");
        assert_eq!(
            unknown(vm.release_physical(PhysicalHandle(77))),
            Some(("physical handle", 77))
        );
        let g = vm.granularity();
        assert_eq!(
            unknown(vm.map(0x7000_0000_0000, g, PhysicalHandle(77), 0)),
            Some(("physical handle", 77))
        );
        assert_eq!(
            unknown(vm.free_reservation(1 << 44, g)),
            Some(("reservation", 1 << 44))
        );
        assert_eq!(fake.live("allocations"), 1);
        device.free(held, 4096).unwrap();
    }

    /// Streams and events the device did not make, or destroyed already, are refused.
    fn foreign_and_destroyed_streams_and_events_are_refused(fake, opened, device) {
        let stream = device.create_stream().unwrap();
        let event = device.create_event().unwrap();
        let foreign_stream = crate::support::stream(stream.as_raw() ^ 0x10);
        let foreign_event = Event(event.0 ^ 0x10);
        let is_unknown = |r: Result<(), Error>, expected: &str| matches!(r, Err(Error::UnknownPointer { what, .. }) if what == expected);
        // Foreign ones: never handed out by this device.
        // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
        assert!(is_unknown(unsafe { device.destroy_stream(foreign_stream) }, "stream"));
        assert!(is_unknown(
            device.record_event(foreign_event, stream),
            "event"
        ));
        assert!(is_unknown(device.destroy_event(foreign_event), "event"));
        assert!(matches!(
            // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
            unsafe { device.destroy_stream(Stream::DEFAULT) },
            Err(Error::InvalidArgument { .. })
        ));
        // Its own, in use and then destroyed.
        device.record_event(event, stream).unwrap();
        device.synchronize_event(event).unwrap();
        assert!(device.event_complete(event).unwrap());
        device.destroy_event(event).unwrap();
        // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
        unsafe { device.destroy_stream(stream) }.unwrap();
        assert!(is_unknown(
            device.record_event(event, Stream::DEFAULT),
            "event"
        ));
        assert!(matches!(
            device.event_complete(event),
            Err(Error::UnknownPointer { what: "event", .. })
        ));
        assert!(is_unknown(device.destroy_event(event), "event"));
        // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
        assert!(is_unknown(unsafe { device.destroy_stream(stream) }, "stream"));
        assert_eq!((fake.live("streams"), fake.live("events")), (0, 0));
        assert!(opened.census().is_empty());
    }

    /// What was given back once is unknown the second time.
    fn double_frees_are_refused(fake, opened, device) {
        let ptr = device.alloc(MIB).unwrap();
        device.free(ptr, MIB).unwrap();
        assert!(matches!(
            device.free(ptr, MIB),
            Err(Error::UnknownPointer {
                what: "allocation",
                ..
            })
        ));
        let pool = device.stream_ordered_pool().unwrap();
        let p = pool.alloc_async(MIB, Stream::DEFAULT).unwrap();
        pool.free_async(p, Stream::DEFAULT).unwrap();
        assert!(matches!(
            pool.free_async(p, Stream::DEFAULT),
            Err(Error::UnknownPointer {
                what: "pool allocation",
                ..
            })
        ));
        let vm = device.virtual_memory().unwrap();
        let g = vm.granularity();
        let va = vm.reserve(2 * g, 0).unwrap();
        let h = vm.create_physical(g).unwrap();
        vm.map(va, g, h, 0).unwrap();
        vm.unmap(va, g).unwrap();
        assert!(matches!(
            vm.unmap(va, g),
            Err(Error::InvalidArgument { call: "unmap", .. })
        ));
        vm.release_physical(h).unwrap();
        assert!(matches!(
            vm.release_physical(h),
            Err(Error::UnknownPointer {
                what: "physical handle",
                ..
            })
        ));
        vm.free_reservation(va, 2 * g).unwrap();
        assert!(matches!(
            vm.free_reservation(va, 2 * g),
            Err(Error::UnknownPointer {
                what: "reservation",
                ..
            })
        ));
        device.synchronize_device().unwrap();
        assert!(opened.census().is_empty());
    }

    /// Mappings lie inside one reservation and overlap none; access only where mapped; unmap
    /// only whole mappings; a reservation is freed whole with nothing mapped in it.
    fn virtual_memory_ranges_follow_the_host_rules(fake, opened, device) {
        let vm = device.virtual_memory().unwrap();
        let g = vm.granularity();
        let va = vm.reserve(4 * g, 0).unwrap();
        let h = vm.create_physical(2 * g).unwrap();
        let invalid = |r: Result<(), Error>| matches!(r, Err(Error::InvalidArgument { .. }));
        // Outside the reservation, or overlapping a mapping: refused before the driver.
        assert!(invalid(vm.map(va + 3 * g, 2 * g, h, 0)));
        vm.map(va, 2 * g, h, 0).unwrap();
        assert!(invalid(vm.map(va + g, g, h, 0)));
        // Access only where mapped; unmap only whole mappings; free only with nothing mapped.
        assert!(invalid(vm.set_access(va, 3 * g)));
        vm.set_access(va, 2 * g).unwrap();
        assert!(invalid(vm.unmap(va, g)));
        assert!(invalid(vm.free_reservation(va, 4 * g)));
        assert!(invalid(vm.free_reservation(va, 2 * g)));
        assert_eq!(fake.live("mappings"), 1);
        vm.unmap(va, 2 * g).unwrap();
        vm.release_physical(h).unwrap();
        vm.free_reservation(va, 4 * g).unwrap();
    }

    /// A dropped device gives back everything it made for itself, in an order the driver
    /// accepts. Streams are the caller's: one never destroyed outlives the device (tests/suite/cuda.rs
    /// and tests/suite/hip.rs check that), so this caller destroys its own before the drop.
    fn a_dropped_device_gives_everything_back(fake, opened, device) {
        let (stream, event) = (device.create_stream().unwrap(), device.create_event().unwrap());
        device.record_event(event, stream).unwrap();
        let _plain = device.alloc(1234).unwrap();
        let _pooled = device.stream_ordered_pool().unwrap().alloc_async(4096, stream).unwrap();
        let vm = device.virtual_memory().unwrap();
        let g = vm.granularity();
        let (va, h) = (vm.reserve(4 * g, 0).unwrap(), vm.create_physical(g).unwrap());
        vm.map(va, g, h, 0).unwrap();
        let census = opened.census();
        assert_eq!(
            census,
            VendorCensus {
                allocations: 1,
                pool_allocations: 1,
                physical_handles: 1,
                reservations: 1,
                mappings: 1,
                streams: 1,
                events: 1,
                pinned_host: 0,
            }
        );
        assert!(fake.live("bytes") > 0);
        device.synchronize_stream(stream).unwrap();
        // SAFETY: this test's stream, idle now and not used again.
        unsafe { device.destroy_stream(stream) }.unwrap();
        assert_eq!(opened.census().streams, 0);
    }

    /// A driver call that blocks — a free, an unmap, a synchronisation: each can wait for the
    /// whole device — holds none of the device's locks: allocations, streams, events and the
    /// census go on meanwhile from another thread (HIP held its books across `hipFree`).
    fn a_blocking_driver_call_holds_no_lock(fake, opened, device) {
        // What another thread does meanwhile takes the books' and the handles' locks.
        let meanwhile = || {
            let p = device.alloc(4096).unwrap();
            let (s, e) = (device.create_stream().unwrap(), device.create_event().unwrap());
            device.record_event(e, s).unwrap();
            device.event_complete(e).unwrap();
            device.destroy_event(e).unwrap();
            // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
            unsafe { device.destroy_stream(s) }.unwrap();
            (p, opened.census().allocations)
        };
        let plain = device.alloc(MIB).unwrap();
        let free = fake.call("cuMemFree_v2", "hipFree");
        let (freed, (p, live)) = fake.while_paused(free, || device.free(plain, MIB), meanwhile);
        assert_eq!(live, 1, "the allocation being freed left the books before the call");
        freed.unwrap();
        device.free(p, 4096).unwrap();

        let stream = device.create_stream().unwrap();
        let event = device.create_event().unwrap();
        let call = fake.call("cuStreamSynchronize", "hipStreamSynchronize");
        let keep = device.alloc(MIB).unwrap();
        let (synced, (p, live)) =
            fake.while_paused(call, || device.synchronize_stream(stream), meanwhile);
        assert_eq!(live, 2);
        synced.unwrap();
        device.free(p, 4096).unwrap();
        device.record_event(event, stream).unwrap();
        let call = fake.call("cuEventSynchronize", "hipEventSynchronize");
        let (synced, (p, live)) =
            fake.while_paused(call, || device.synchronize_event(event), meanwhile);
        assert_eq!(live, 2);
        synced.unwrap();
        device.free(p, 4096).unwrap();

        let vm = device.virtual_memory().unwrap();
        let g = vm.granularity();
        let (va, h) = (vm.reserve(g, 0).unwrap(), vm.create_physical(g).unwrap());
        vm.map(va, g, h, 0).unwrap();
        let call = fake.call("cuMemUnmap", "hipMemUnmap");
        let (unmapped, (p, live)) = fake.while_paused(call, || vm.unmap(va, g), meanwhile);
        assert_eq!(live, 2);
        unmapped.unwrap();
        device.free(p, 4096).unwrap();
        vm.release_physical(h).unwrap();
        vm.free_reservation(va, g).unwrap();
        device.free(keep, MIB).unwrap();
        device.destroy_event(event).unwrap();
        // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
        unsafe { device.destroy_stream(stream) }.unwrap();
    }

    /// What the driver refuses to give back stays in the books, so it can be given back later.
    fn what_the_driver_refuses_to_give_back_stays_in_the_books(fake, opened, device) {
        let is_driver = |r: Result<(), Error>, expected: &str| matches!(r, Err(Error::Driver { call, .. }) if call == expected);
        let ptr = device.alloc(4096).unwrap();
        let free = fake.call("cuMemFree_v2", "hipFree");
        fake.fail_next(free);
        assert!(is_driver(device.free(ptr, 4096), free));
        assert_eq!(
            opened.census().allocations,
            1,
            "still held, so it can be freed again"
        );
        device.free(ptr, 4096).unwrap();

        let vm = device.virtual_memory().unwrap();
        let g = vm.granularity();
        let va = vm.reserve(2 * g, 0).unwrap();
        let h = vm.create_physical(2 * g).unwrap();
        vm.map(va, 2 * g, h, 0).unwrap();
        let unmap = fake.call("cuMemUnmap", "hipMemUnmap");
        fake.fail_next(unmap);
        assert!(is_driver(vm.unmap(va, 2 * g), unmap));
        assert_eq!(opened.census().mappings, 1);
        vm.unmap(va, 2 * g).unwrap();
        let release = fake.call("cuMemRelease", "hipMemRelease");
        fake.fail_next(release);
        assert!(is_driver(vm.release_physical(h), release));
        vm.release_physical(h).unwrap();
        let address_free = fake.call("cuMemAddressFree", "hipMemAddressFree");
        fake.fail_next(address_free);
        assert!(is_driver(vm.free_reservation(va, 2 * g), address_free));
        vm.free_reservation(va, 2 * g).unwrap();
        assert!(opened.census().is_empty());
    }
}
