//! One conformance suite, generic over the device: every strategy passes it on every target.
//!
//! * **targets** (`tests/support/targets.rs`): the host device with real and with simulated
//!   memory; the CUDA shim over the conformance driver `fakecuda` (CUDA 12.2) and over
//!   `fakecuda_old` (CUDA 10.1: no virtual memory, no pools); the HIP shim over `fakehip` as
//!   ROCm 5, 6 and 7 (virtual memory from ROCm 7);
//! * **strategies**: bfc preallocated and growing, platform, async (the device's
//!   stream-ordered pool) and vmm. Where a target lacks what a strategy needs, every case of
//!   that cell asserts that building the strategy fails with `Error::Unsupported` naming the
//!   backend — a cell never passes by skipping;
//! * **cases** (the module [`cases`], one body each): zero size, aligned / disjoint / usable
//!   allocations, alignment rules, impossible sizes, exhaustion and recovery, foreign
//!   allocations refused, the census after trim and drop, threads sharing an allocator,
//!   streams the caller made with the driver's own calls, and peer access between two
//!   devices.
//!
//! Each (target, strategy, case) is one named test, e.g.
//! `fakehip_rocm6::bfc_growing::trim_and_drop`, and ends with the census: the allocator
//! dropped, every device's books are empty and the conformance driver's own live counts are
//! all zero.

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;

use portalloc::{Allocation, Allocator, Error, Stream};
use support::targets::{Rig, Rocm, Strategy, SuiteStrategy, Target};

const MIB: u64 = 1 << 20;
/// Capacity of every device in the suite; the strategies get 3/4 of it.
const CAPACITY: u64 = 64 * MIB;
const LIMIT: u64 = 48 * MIB;

/// A strategy over device 0 of a rig.
struct Subject {
    allocator: Box<dyn Allocator>,
    rig: Rig,
    strategy: Strategy,
}

/// Builds `strategy` over device 0 of `rig`. Where the target cannot serve it, asserts the
/// typed refusal and the empty census instead, and returns `None`.
fn subject(rig: Rig, strategy: Strategy) -> Option<Subject> {
    let target = rig.target;
    let built = strategy.build_as_configured(rig.device(0));
    if strategy.served_by(target) {
        let allocator = built.unwrap_or_else(|e| panic!("{target:?} {strategy:?}: {e}"));
        return Some(Subject {
            allocator,
            rig,
            strategy,
        });
    }
    match built {
        Err(Error::Unsupported { backend, .. }) => assert_eq!(backend, target.backend()),
        Err(e) => panic!("{target:?} {strategy:?}: expected Unsupported, got {e}"),
        Ok(_) => panic!("{target:?} cannot serve {strategy:?}, yet it was built"),
    }
    rig.finish();
    None
}

/// Runs one cell: `case` on `devices` devices of `target`.
fn run(target: Target, strategy: Strategy, devices: u32, case: fn(Rig, Strategy)) {
    if let Some(rig) = target.open(devices, CAPACITY) {
        case(rig, strategy);
    }
}

impl Subject {
    fn invariants(&self) {
        self.allocator
            .check_invariants()
            .unwrap_or_else(|e| panic!("{}: invariant broken: {e}", self.allocator.name()));
    }

    fn free_all(&self, allocations: Vec<Allocation>) {
        for a in allocations {
            self.allocator.deallocate(a).expect("deallocate");
            self.invariants();
        }
    }

    fn allocate(&self, size: u64, stream: Stream) -> Allocation {
        self.allocator
            .allocate(size, 0, stream, "t")
            .unwrap_or_else(|e| panic!("{:?} {:?}: {size} B: {e}", self.rig.target, self.strategy))
    }

    /// Fills the allocation with `byte`, where device memory is host memory.
    fn fill(&self, a: &Allocation, byte: u8) {
        if self.rig.target.host_addressable() {
            // SAFETY: the allocation is `a.size()` bytes of host memory (the real host device,
            // or the conformance driver's mapped pages) owned by this test.
            unsafe { std::ptr::write_bytes(a.ptr() as *mut u8, byte, a.size() as usize) };
        }
    }

    /// Checks the allocation still holds `byte` everywhere, where device memory is host
    /// memory.
    fn holds(&self, a: &Allocation, byte: u8) -> bool {
        if !self.rig.target.host_addressable() {
            return true;
        }
        // SAFETY: as in `fill`; nothing else wrote to this allocation.
        let bytes = unsafe { std::slice::from_raw_parts(a.ptr() as *const u8, a.size() as usize) };
        bytes.iter().all(|&b| b == byte)
    }

    /// Drops the allocator; then the census must be empty everywhere.
    fn finish(self) {
        let Subject { allocator, rig, .. } = self;
        drop(allocator);
        rig.finish();
    }
}

/// The case bodies, one per behaviour; each takes a fresh rig and builds the strategy on it.
mod cases {
    use super::*;

    /// Zero bytes: an empty allocation, and no device call.
    pub fn zero_size(rig: Rig, strategy: Strategy) {
        let Some(s) = subject(rig, strategy) else {
            return;
        };
        let before = s.rig.snapshot();
        let a = s.allocate(0, Stream::DEFAULT);
        assert!(a.is_empty());
        assert_eq!(a.ptr(), 0);
        assert_eq!(
            s.rig.snapshot(),
            before,
            "a zero-byte allocation reached the device"
        );
        s.allocator.deallocate(a).unwrap();
        assert_eq!(s.allocator.stats().num_allocs, 1);
        s.finish();
    }

    /// Allocations are aligned, disjoint, usable (where memory is host memory), and counted.
    pub fn aligned_disjoint_usable(rig: Rig, strategy: Strategy) {
        let Some(s) = subject(rig, strategy) else {
            return;
        };
        let sizes = [1u64, 255, 256, 257, 4096, 100_000, MIB, 3 * MIB + 5];
        let mut live = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            let a = s.allocate(size, Stream::DEFAULT);
            assert_eq!(a.size(), size);
            assert_eq!(
                a.ptr() % 256,
                0,
                "{size} B allocation at {:#x} is not 256-aligned",
                a.ptr()
            );
            s.fill(&a, i as u8 + 1);
            s.invariants();
            live.push(a);
        }
        let mut ranges: Vec<_> = live.iter().map(|a| a.ptr()..a.ptr() + a.size()).collect();
        ranges.sort_by_key(|r| r.start);
        let disjoint = ranges.windows(2).all(|w| w[0].end <= w[1].start);
        assert!(disjoint, "allocations overlap: {ranges:x?}");
        for (i, a) in live.iter().enumerate() {
            assert!(s.holds(a, i as u8 + 1), "allocation {i} was overwritten");
        }
        let stats = s.allocator.stats();
        let requested: u64 = sizes.iter().sum();
        assert!(stats.bytes_in_use >= requested);
        assert!(stats.peak_bytes_in_use >= stats.bytes_in_use);
        assert!(stats.pool_bytes >= stats.bytes_in_use);
        assert_eq!(
            s.allocator.pool_bytes(),
            stats.pool_bytes,
            "pool_bytes() disagrees with stats()"
        );
        assert_eq!(stats.num_allocs, sizes.len() as u64);
        s.free_all(live);
        assert_eq!(s.allocator.stats().bytes_in_use, 0);
        s.finish();
    }

    /// Alignments: powers of two honoured, anything else refused with a typed error.
    pub fn alignment_rules(rig: Rig, strategy: Strategy) {
        let Some(s) = subject(rig, strategy) else {
            return;
        };
        for alignment in [1u64, 2, 256, 512, 4096, 65536] {
            match s.allocator.allocate(1000, alignment, Stream::DEFAULT, "t") {
                Ok(a) => {
                    assert_eq!(a.ptr() % alignment.max(256), 0);
                    s.allocator.deallocate(a).unwrap();
                }
                Err(Error::InvalidAlignment { max, .. }) => assert!(alignment > max),
                Err(e) => panic!("alignment {alignment}: unexpected error {e}"),
            }
        }
        for alignment in [3u64, 100, 257, u64::MAX] {
            match s.allocator.allocate(1000, alignment, Stream::DEFAULT, "t") {
                Err(Error::InvalidAlignment { alignment: a, .. }) => assert_eq!(a, alignment),
                other => panic!("alignment {alignment}: expected InvalidAlignment, got {other:?}"),
            }
        }
        s.invariants();
        s.finish();
    }

    /// Sizes beyond what can be served: a typed error, no panic, books intact.
    pub fn impossible_sizes(rig: Rig, strategy: Strategy) {
        let Some(s) = subject(rig, strategy) else {
            return;
        };
        for size in [u64::MAX, u64::MAX - 255, CAPACITY * 2, LIMIT + 1] {
            let e = s
                .allocator
                .allocate(size, 0, Stream::DEFAULT, "t")
                .expect_err("impossible size served");
            assert!(
                matches!(e, Error::InvalidSize { .. } | Error::ExceedsLimit { .. })
                    || e.is_out_of_memory(),
                "size {size}: unexpected error {e}"
            );
            assert!(!e.to_string().is_empty());
            s.invariants();
        }
        // Still works afterwards.
        let a = s.allocate(MIB, Stream::DEFAULT);
        s.allocator.deallocate(a).unwrap();
        s.finish();
    }

    /// Running out: allocate until refused, then free everything and allocate again.
    pub fn exhaustion_and_recovery(rig: Rig, strategy: Strategy) {
        let Some(s) = subject(rig, strategy) else {
            return;
        };
        let mut live = Vec::new();
        let e = loop {
            match s.allocator.allocate(4 * MIB, 0, Stream::DEFAULT, "t") {
                Ok(a) => live.push(a),
                Err(e) => break e,
            }
            assert!(live.len() < 1000, "never ran out");
        };
        assert!(e.is_out_of_memory(), "expected out of memory, got {e}");
        assert!(live.len() as u64 * 4 * MIB <= LIMIT);
        s.invariants();
        s.free_all(live);
        let a = s.allocate(4 * MIB, Stream::DEFAULT);
        s.allocator.deallocate(a).unwrap();
        s.finish();
    }

    /// An allocation handed to the wrong allocator is refused, not freed.
    pub fn foreign_allocations_refused(rig: Rig, strategy: Strategy) {
        let Some(s) = subject(rig, strategy) else {
            return;
        };
        let other = Target::HostSimulated
            .open(1, CAPACITY)
            .expect("the simulated host needs nothing");
        let theirs_allocator = Strategy::Platform
            .build_as_configured(other.device(0))
            .unwrap();
        let theirs = theirs_allocator
            .allocate(1024, 0, Stream::DEFAULT, "t")
            .unwrap();
        let ptr = theirs.ptr();
        match s.allocator.deallocate(theirs) {
            Err(Error::ForeignAllocation { ptr: p, .. }) => assert_eq!(p, ptr),
            other => panic!("expected ForeignAllocation, got {other:?}"),
        }
        s.invariants();
        s.finish();
        // The refused allocation was not freed: its owner still holds it (and gives it back
        // when dropped).
        assert_eq!(theirs_allocator.stats().bytes_in_use, 1024);
        drop(theirs_allocator);
        other.finish();
    }

    /// After everything is freed, trim() gives every device byte back; an allocation live at
    /// drop is returned too: the device's books and the driver's counts end empty.
    pub fn trim_and_drop(rig: Rig, strategy: Strategy) {
        let Some(s) = subject(rig, strategy) else {
            return;
        };
        let live: Vec<_> = (1..=5)
            .map(|i| s.allocate(i * MIB, Stream::DEFAULT))
            .collect();
        s.free_all(live);
        assert_eq!(s.allocator.pool_bytes(), s.allocator.stats().pool_bytes);
        s.allocator.trim().unwrap();
        assert_eq!(
            s.allocator.stats().pool_bytes,
            0,
            "trim() left pool memory with nothing live"
        );
        assert_eq!(
            s.allocator.pool_bytes(),
            0,
            "pool_bytes() disagrees with stats()"
        );
        assert_eq!(s.rig.device_bytes(), 0, "trim() left device memory");
        // Live allocations at drop are reported and returned to the device.
        let _leak = s.allocate(MIB, Stream::DEFAULT);
        s.finish();
    }

    /// Send + Sync: threads allocating and freeing on streams of their own, books intact at
    /// the end.
    pub fn threads_share_one_allocator(rig: Rig, strategy: Strategy) {
        let Some(s) = subject(rig, strategy) else {
            return;
        };
        let device = s.rig.device(0);
        let streams: Vec<Stream> = std::iter::once(Stream::DEFAULT)
            .chain((1..4).map(|_| device.create_stream().unwrap()))
            .collect();
        std::thread::scope(|scope| {
            for (t, &stream) in streams.iter().enumerate() {
                let s = &s;
                let t = t as u64;
                scope.spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..200u64 {
                        let size = 256 + ((i * 7919 + t * 104_729) % (256 * 1024));
                        if let Ok(a) = s.allocator.allocate(size, 0, stream, "t") {
                            live.push(a);
                        }
                        if i % 3 == 2 && !live.is_empty() {
                            let a = live.swap_remove((i as usize) % live.len());
                            s.allocator.deallocate(a).unwrap();
                        }
                    }
                    for a in live {
                        s.allocator.deallocate(a).unwrap();
                    }
                });
            }
        });
        s.invariants();
        assert_eq!(s.allocator.stats().bytes_in_use, 0);
        let Subject { allocator, rig, .. } = s;
        drop(allocator);
        for &stream in &streams[1..] {
            device.destroy_stream(stream).unwrap();
        }
        drop(device);
        rig.finish();
    }

    /// Streams the caller made with the driver's own call (issue #11): with the caller's
    /// work on `S` held in flight (an event of its own, recorded with the driver's calls), a
    /// buffer freed on `S` is not handed to `T`, `U` or the default stream before that work
    /// completes — the driver's own event query is the oracle. `S` reuses its own free at
    /// once (the pooling strategies), and everything is given back.
    pub fn foreign_streams(rig: Rig, strategy: Strategy) {
        let Some(s) = subject(rig, strategy) else {
            return;
        };
        const SIZE: u64 = MIB;
        let overlaps = |a: &Allocation, r: (u64, u64)| {
            a.size() > 0 && a.ptr() < r.1 && r.0 < a.ptr() + a.size()
        };
        let rig = &s.rig;
        let (st, tt, ut) = (
            rig.foreign_stream(),
            rig.foreign_stream(),
            rig.foreign_stream(),
        );
        let mut keep: Vec<Allocation> = Vec::new();
        rig.hold(true);
        // T is in use too (several streams: frees become stream-ordered), then the caller's
        // kernel uses a buffer on S and is still running when the buffer is freed on S.
        keep.push(s.allocate(4096, tt));
        let x = s.allocate(SIZE, st);
        let freed = (x.ptr(), x.ptr() + SIZE);
        let work = rig.record_work(st);
        s.allocator.deallocate(x).unwrap();
        let mut reused_elsewhere = 0;
        for other in [tt, ut, Stream::DEFAULT] {
            for size in [SIZE, SIZE / 2, 256] {
                let y = s.allocate(size, other);
                if overlaps(&y, freed) {
                    assert!(
                        rig.work_done(work),
                        "{strategy:?}: {:#x}+{size} handed to {other:?} while the caller's work \
                         on {st:?} before the free of {:#x}+{SIZE} is in flight",
                        y.ptr(),
                        freed.0
                    );
                    reused_elsewhere += 1;
                }
                keep.push(y);
            }
        }
        // S's own later work is ordered after the free: the pooling strategies reuse at once.
        let again = s.allocate(SIZE, st);
        if matches!(strategy, Strategy::Bfc | Strategy::BfcGrow | Strategy::Vmm)
            && reused_elsewhere == 0
        {
            assert!(
                overlaps(&again, freed),
                "{strategy:?}: S did not reuse its own pending free"
            );
            assert!(!rig.work_done(work), "S reused without waiting");
        }
        keep.push(again);
        rig.hold(false);
        s.free_all(keep);
        s.allocator.trim().unwrap();
        let Subject { allocator, rig, .. } = s;
        drop(allocator);
        rig.destroy_foreign(&[st, tt, ut], &[work]);
        rig.finish();
    }

    /// Two devices of the target: device 0 reaches device 1 where the target offers peer
    /// access ([`support::targets::PEER_TARGETS`]) — and says so with a typed error where it
    /// does not; the strategy on device 0 then serves memory as before, and vmm grants the
    /// enabled peer access to what it maps.
    pub fn peer_access(rig: Rig, strategy: Strategy) {
        let target = rig.target;
        let (d0, d1) = (rig.device(0), rig.device(1));
        assert!(
            !d0.can_access_peer(d0.as_ref()).unwrap(),
            "a device is never its own peer"
        );
        let expected_peers = if target.has_peers() {
            assert!(d0.can_access_peer(d1.as_ref()).unwrap());
            d0.enable_peer_access(d1.as_ref()).unwrap();
            d0.enable_peer_access(d1.as_ref()).unwrap(); // again: not an error
            vec![1]
        } else {
            assert!(
                !d0.can_access_peer(d1.as_ref()).unwrap(),
                "{target:?} offers peer access now: add it to PEER_TARGETS"
            );
            assert!(matches!(
                d0.enable_peer_access(d1.as_ref()),
                Err(Error::Unsupported { .. })
            ));
            vec![]
        };
        assert_eq!(d0.peer_access(), expected_peers);
        assert!(d1.peer_access().is_empty(), "one direction only");
        if strategy == Strategy::Vmm && strategy.served_by(target) {
            use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
            let vmm = VmmAllocator::new(Arc::clone(&d0), VmmOptions::new(LIMIT)).unwrap();
            assert_eq!(vmm.peers(), expected_peers, "vmm takes the device's peers");
        }
        drop((d0, d1));
        let Some(s) = subject(rig, strategy) else {
            return;
        };
        let live: Vec<_> = [1000u64, 3 * MIB]
            .into_iter()
            .map(|n| s.allocate(n, Stream::DEFAULT))
            .collect();
        for (i, a) in live.iter().enumerate() {
            s.fill(a, 0xa0 + i as u8);
            if strategy == Strategy::Vmm {
                for at in [a.ptr(), a.ptr() + a.size() - 1] {
                    if let Some(peers) = s.rig.peer_access_at(at) {
                        assert_eq!(peers, expected_peers, "{target:?}: peers at {at:#x}");
                    }
                }
            }
        }
        for (i, a) in live.iter().enumerate() {
            assert!(s.holds(a, 0xa0 + i as u8));
        }
        s.free_all(live);
        s.allocator.trim().unwrap();
        s.finish();
    }
}

/// One test per case, for the strategy `$strategy` on the module's `TARGET`.
macro_rules! cases {
    ($strategy:expr) => {
        cases!(@each $strategy;
            zero_size: 1,
            aligned_disjoint_usable: 1,
            alignment_rules: 1,
            impossible_sizes: 1,
            exhaustion_and_recovery: 1,
            foreign_allocations_refused: 1,
            trim_and_drop: 1,
            threads_share_one_allocator: 1,
            foreign_streams: 1,
            peer_access: 2,
        );
    };
    (@each $strategy:expr; $($case:ident: $devices:literal),* $(,)?) => {$(
        #[test]
        fn $case() {
            crate::run(TARGET, $strategy, $devices, crate::cases::$case)
        }
    )*};
}

/// One module per strategy, on the module's `TARGET`.
macro_rules! strategies {
    () => {
        mod bfc_preallocated {
            use super::TARGET;
            cases!(crate::Strategy::Bfc);
        }
        mod bfc_growing {
            use super::TARGET;
            cases!(crate::Strategy::BfcGrow);
        }
        mod platform {
            use super::TARGET;
            cases!(crate::Strategy::Platform);
        }
        mod async_pool {
            use super::TARGET;
            cases!(crate::Strategy::Async);
        }
        mod vmm {
            use super::TARGET;
            cases!(crate::Strategy::Vmm);
        }
    };
}

/// One module per target.
macro_rules! targets {
    ($($(#[$attribute:meta])* $name:ident => $target:expr),* $(,)?) => {$(
        $(#[$attribute])*
        mod $name {
            use crate::Target;
            #[allow(unused_imports)]
            use crate::Rocm;
            const TARGET: Target = $target;
            strategies!();
        }
    )*};
}

targets! {
    host_real => Target::HostReal,
    host_simulated => Target::HostSimulated,
    #[cfg(feature = "cuda")]
    fakecuda => Target::FakeCuda,
    #[cfg(feature = "cuda")]
    fakecuda_old => Target::FakeCudaOld,
    #[cfg(feature = "hip")]
    fakehip_rocm5 => Target::FakeHip(Rocm::V5),
    #[cfg(feature = "hip")]
    fakehip_rocm6 => Target::FakeHip(Rocm::V6),
    #[cfg(feature = "hip")]
    fakehip_rocm7 => Target::FakeHip(Rocm::V7),
}
