//! `DeviceBuffer`, as a Rust user holds one: in a struct, across threads, past the value it
//! came from; dropped without a word, freed in stream order on its stream; taken apart for
//! FFI and rebuilt; refused when it belongs to another allocator.

use std::sync::Arc;

use crate::support::common::{simulated_host, Strategy};
use portalloc::backends::host::HostDevice;
use portalloc::{Allocator, Config, DeviceBuffer, Error, Portalloc, RawBuffer, Stream};
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

/// A buffer freed by drop on its stream, while the caller's kernel on that stream still
/// uses it, is reused by that stream at once, and goes to another stream only ordered after
/// the kernel (a GPU-side wait, or the kernel done) — the host device's timeline says which.
#[test_case(Strategy::Bfc ; "bfc")]
#[test_case(Strategy::Vmm ; "vmm")]
fn drop_frees_in_stream_order_on_its_stream(strategy: Strategy) {
    let device = simulated_host(64 * MIB);
    let allocator = shared(strategy, &device);
    let (s, t) = (
        crate::support::stream(0x7000),
        crate::support::stream(0x8000),
    );
    let keep = DeviceBuffer::new(&allocator, 4096, t).unwrap();
    let x = DeviceBuffer::new(&allocator, MIB, s).unwrap();
    let freed = x.ptr();
    let work = device.launch(s, x.ptr(), MIB);
    drop(x);
    // S reuses its own free at once...
    let z = DeviceBuffer::new(&allocator, MIB, s).unwrap();
    assert_eq!(
        z.ptr(),
        freed,
        "{strategy:?}: S reuses its own free at once"
    );
    assert_eq!(device.kernel_done(work), Some(false));
    drop(z);
    // ...T gets it only ordered after S's kernel.
    let y = DeviceBuffer::new(&allocator, MIB, t).unwrap();
    assert!(
        y.ptr() != freed || device.ordered(work, t) == Some(true),
        "{strategy:?}: handed to T with nothing ordering T after S's kernel"
    );
    let z = DeviceBuffer::new(&allocator, MIB, s).unwrap();
    device.finish(work);
    drop((keep, y, z));
    assert_eq!(allocator.stats().bytes_in_use, 0);
    assert_eq!(device.hazards().0, 0);
}

/// A stale record of a buffer (taken apart with `into_raw`, freed) is refused after its
/// memory was reused by its stream while several streams are in use — the pending chunk is
/// handed out again under a new generation — and the new owner's buffer is untouched.
#[test_case(Strategy::Bfc ; "bfc")]
#[test_case(Strategy::BfcGrow ; "bfc growing")]
#[test_case(Strategy::Vmm ; "vmm")]
#[test_case(Strategy::Platform ; "platform")]
#[test_case(Strategy::Async ; "async")]
fn a_stale_record_is_refused_after_same_stream_reuse(strategy: Strategy) {
    let device = simulated_host(64 * MIB);
    let allocator = shared(strategy, &device);
    let (s, t) = (
        crate::support::stream(0x7000),
        crate::support::stream(0x8000),
    );
    let keep = DeviceBuffer::new(&allocator, 4096, t).unwrap();
    let x = DeviceBuffer::new(&allocator, MIB, s).unwrap();
    let work = device.launch(s, x.ptr(), MIB);
    let raw = x.into_raw();
    // SAFETY: `raw` came from `into_raw`, on a host-device stream.
    unsafe { DeviceBuffer::from_raw(Arc::clone(&allocator), raw) }
        .unwrap()
        .free()
        .unwrap();
    // S's next request reuses the pending free at once (the pooling strategies).
    let owner = DeviceBuffer::new(&allocator, MIB, s).unwrap();
    // SAFETY: the same record again: from `into_raw`, on a host-device stream (stale now,
    // which is what this checks the allocator refuses).
    let stale = unsafe { DeviceBuffer::from_raw(Arc::clone(&allocator), raw) }.unwrap();
    assert!(
        matches!(stale.free(), Err(Error::UnknownPointer { .. })),
        "{strategy:?}: a stale record freed the buffer that reused its memory"
    );
    assert!(
        allocator.stats().bytes_in_use >= MIB + 4096,
        "{strategy:?}: the new owner's buffer is still live"
    );
    device.finish(work);
    drop((keep, owner));
    assert_eq!(allocator.stats().bytes_in_use, 0);
}

#[test]
fn free_returns_the_allocators_answer_and_raw_round_trips() {
    let device = simulated_host(64 * MIB);
    let a = shared(Strategy::Bfc, &device);
    let b = shared(Strategy::Bfc, &device);
    let x = DeviceBuffer::new(&a, MIB, crate::support::stream(0x1234)).unwrap();
    let (ptr, stream) = (x.ptr(), x.stream());
    let raw: RawBuffer = x.into_raw();
    assert_eq!((raw.ptr, raw.size, raw.stream), (ptr, MIB, 0x1234));
    assert_eq!(a.stats().bytes_in_use, MIB, "into_raw frees nothing");
    // Another allocator's record is refused, never freed.
    // SAFETY: `raw` came from `into_raw`, on a host-device stream (so for every `from_raw`
    // below).
    match unsafe { DeviceBuffer::from_raw(Arc::clone(&b), raw) } {
        Err(Error::ForeignAllocation { owner, this, .. }) => {
            assert_eq!((owner, this), (a.id(), b.id()))
        }
        other => panic!("{other:?}"),
    }
    // SAFETY: as above.
    let x = unsafe { DeviceBuffer::from_raw(Arc::clone(&a), raw) }.unwrap();
    assert_eq!((x.ptr(), x.stream()), (ptr, stream));
    x.free().unwrap();
    assert_eq!(a.stats().bytes_in_use, 0);
    // A stale record (freed already) is refused by the allocator when freed: an error from
    // `free`, a warning from drop, and no other buffer of the allocator is touched.
    let other = DeviceBuffer::new(&a, MIB, Stream::DEFAULT).unwrap();
    // SAFETY: as above (the record is stale: what the allocator must refuse).
    let stale = unsafe { DeviceBuffer::from_raw(Arc::clone(&a), raw) }.unwrap();
    assert!(matches!(stale.free(), Err(Error::UnknownPointer { .. })));
    // SAFETY: as above.
    let dropped = unsafe { DeviceBuffer::from_raw(Arc::clone(&a), raw) }.unwrap();
    drop(dropped);
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
