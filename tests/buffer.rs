//! `DeviceBuffer`, as a Rust user holds one: in a struct, across threads, past the value it
//! came from; dropped without a word, freed in stream order on its stream; taken apart for
//! FFI and rebuilt; refused when it belongs to another allocator.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;

use portalloc::backends::host::HostDevice;
use portalloc::{Allocator, Config, DeviceBuffer, Error, Portalloc, RawBuffer, Stream};
use support::common::{simulated_host, Strategy};
use test_case::test_case;

const MIB: u64 = 1 << 20;

/// `strategy` over `device`, with a 32 MiB limit, shared as buffers hold it.
fn shared(strategy: Strategy, device: &Arc<HostDevice>) -> Arc<dyn Allocator> {
    Arc::from(strategy.build(Arc::clone(device), 32 * MIB))
}

/// A struct of the user's, holding buffers and no lifetime.
struct Model {
    weights: DeviceBuffer,
    bias: DeviceBuffer,
}

#[test_case(Strategy::Bfc ; "bfc")]
#[test_case(Strategy::Vmm ; "vmm")]
#[test_case(Strategy::Platform ; "platform")]
fn dropping_a_buffer_frees_it(strategy: Strategy) {
    let device = simulated_host(64 * MIB);
    let allocator = shared(strategy, &device);
    let model = Model {
        weights: DeviceBuffer::new(&allocator, 3 * MIB, Stream::DEFAULT).unwrap(),
        bias: DeviceBuffer::with_options(&allocator, 4096, 256, Stream::DEFAULT, "bias").unwrap(),
    };
    assert_eq!(model.bias.ptr() % 256, 0);
    assert_eq!(model.weights.size(), 3 * MIB);
    assert_eq!(allocator.stats().bytes_in_use, 3 * MIB + 4096);
    // Moved to another thread and dropped there.
    std::thread::spawn(move || drop(model)).join().unwrap();
    assert_eq!(
        allocator.stats().bytes_in_use,
        0,
        "{strategy:?}: dropped, freed"
    );
    allocator.check_invariants().unwrap();
}

/// A buffer freed by drop on its stream, while the caller's work on that stream is in
/// flight, goes to another stream only once that work is done.
#[test_case(Strategy::Bfc ; "bfc")]
#[test_case(Strategy::Vmm ; "vmm")]
fn drop_frees_in_stream_order_on_its_stream(strategy: Strategy) {
    let device = simulated_host(64 * MIB);
    let allocator = shared(strategy, &device);
    let (s, t) = (Stream::from_raw(0x7000), Stream::from_raw(0x8000));
    let keep = DeviceBuffer::new(&allocator, 4096, t).unwrap();
    let x = DeviceBuffer::new(&allocator, MIB, s).unwrap();
    let freed = x.ptr();
    device.set_events_held(true);
    let work = device.create_event().unwrap();
    use portalloc::Device;
    device.record_event(work, s).unwrap();
    drop(x);
    // S reuses its own free at once...
    let z = DeviceBuffer::new(&allocator, MIB, s).unwrap();
    assert_eq!(
        z.ptr(),
        freed,
        "{strategy:?}: S reuses its own free at once"
    );
    assert!(!device.event_complete(work).unwrap());
    drop(z);
    // ...T gets it only after S's work: elsewhere, or after waiting for S (vmm waits rather
    // than map more memory).
    let y = DeviceBuffer::new(&allocator, MIB, t).unwrap();
    assert!(
        y.ptr() != freed || device.event_complete(work).unwrap(),
        "{strategy:?}: handed to T while S's work is in flight"
    );
    let z = DeviceBuffer::new(&allocator, MIB, s).unwrap();
    device.set_events_held(false);
    drop((keep, y, z));
    device.destroy_event(work).unwrap();
    assert_eq!(allocator.stats().bytes_in_use, 0);
}

#[test]
fn free_returns_the_allocators_answer_and_raw_round_trips() {
    let device = simulated_host(64 * MIB);
    let a = shared(Strategy::Bfc, &device);
    let b = shared(Strategy::Bfc, &device);
    let x = DeviceBuffer::new(&a, MIB, Stream::from_raw(0x1234)).unwrap();
    let (ptr, stream) = (x.ptr(), x.stream());
    let raw: RawBuffer = x.into_raw();
    assert_eq!((raw.ptr, raw.size, raw.stream), (ptr, MIB, 0x1234));
    assert_eq!(a.stats().bytes_in_use, MIB, "into_raw frees nothing");
    // Another allocator's record is refused, never freed.
    match DeviceBuffer::from_raw(Arc::clone(&b), raw) {
        Err(Error::ForeignAllocation { owner, this, .. }) => {
            assert_eq!((owner, this), (a.id(), b.id()))
        }
        other => panic!("{other:?}"),
    }
    let x = DeviceBuffer::from_raw(Arc::clone(&a), raw).unwrap();
    assert_eq!((x.ptr(), x.stream()), (ptr, stream));
    x.free().unwrap();
    assert_eq!(a.stats().bytes_in_use, 0);
    // A stale record (freed already) is refused by the allocator when freed: an error from
    // `free`, a warning from drop, and no other buffer of the allocator is touched.
    let other = DeviceBuffer::new(&a, MIB, Stream::DEFAULT).unwrap();
    let stale = DeviceBuffer::from_raw(Arc::clone(&a), raw).unwrap();
    assert!(matches!(stale.free(), Err(Error::UnknownPointer { .. })));
    drop(DeviceBuffer::from_raw(Arc::clone(&a), raw).unwrap());
    assert_eq!(a.stats().bytes_in_use, MIB, "the live buffer is untouched");
    drop(other);
    assert_eq!(a.stats().bytes_in_use, 0);
}

#[test]
fn a_buffer_outlives_the_portalloc_value_it_came_from() {
    let config = Config::builder()
        .ignore_env()
        .backend(Some(portalloc::Vendor::Host))
        .host_capacity(64 * MIB)
        .host_simulated(true)
        .build()
        .unwrap();
    let portalloc = Portalloc::from_config(config).unwrap();
    let allocator = portalloc.allocator(0).unwrap();
    let x = DeviceBuffer::new(&allocator, MIB, Stream::DEFAULT).unwrap();
    drop(portalloc);
    drop(allocator);
    // The buffer's Arc keeps the allocator (and its device) alive until it is freed.
    assert_eq!(x.allocator().stats().bytes_in_use, MIB);
    let weak = Arc::downgrade(x.allocator());
    drop(x);
    assert!(
        weak.upgrade().is_none(),
        "the last owner freed it and let it go"
    );
}
