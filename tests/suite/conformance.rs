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
//! * **adaptors** (`src/adaptor`): every cell runs on the strategy as built, and again with
//!   the strategy inside each adaptor — `LedgerAllocator`, `RecorderAllocator` (feature
//!   `trace`), and the strategy over a `CountingDevice` — which must pass every case as the
//!   bare strategy does; when the case drops the allocator, the adaptor's own books are
//!   checked against what it served (the ledger's live allocations and its snapshot's JSON,
//!   the recorder's trace, the counting device's calls);
//! * **cases** (the module [`cases`], one body each): zero size, aligned / disjoint / usable
//!   allocations, alignment rules, impossible sizes, exhaustion and recovery, foreign
//!   allocations refused, the census after trim and drop, threads sharing an allocator,
//!   streams the caller made with the driver's own calls, peer access between two devices —
//!   and the hazards of a GPU program: kernels still reading memory freed on their stream
//!   while another stream asks for memory (with the CPU waits counted), memory freed at once
//!   on one stream that stitching would unmap, an allocator dropped with work in flight, a
//!   per-thread-stream buffer dropped on another thread, a destroyed stream's handle reused.
//! * **the world** (`tests/support/targets.rs`): the caller keeps a current context (CUDA) or
//!   device (HIP) of its own, and every call of the allocator — drop included — is made with
//!   the caller's *other* device current and must leave it so; the caller's kernels stay in
//!   flight over the memory they use until the case finishes them, and any unmap, device free
//!   or pool trim of memory a kernel still uses is a hazard that fails the case; a hand-out to
//!   another stream of memory a kernel still uses must be ordered after it (a completed
//!   kernel, or a GPU-side wait), which the device's own timeline answers.
//!
//! Each (target, strategy, adaptor, case) is one named test, e.g.
//! `fakehip_rocm6::bfc_growing::trim_and_drop` (the bare strategy) and
//! `fakehip_rocm6::bfc_growing::ledger::trim_and_drop`, and ends with the census: the allocator
//! dropped, every device's books are empty and the conformance driver's own live counts are
//! all zero.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::support::targets::{CallerProbe, Rig, Rocm, Strategy, SuiteStrategy, Target};
#[cfg(feature = "trace")]
use portalloc::adaptor::RecorderAllocator;
use portalloc::adaptor::{
    CountingDevice, Detect, GraphPools, LedgerAllocator, LedgerOptions, LedgerSnapshot,
};
use portalloc::device::Device;
use portalloc::{Allocation, Allocator, DeviceBuffer, Error, Stats, Stream};

const MIB: u64 = 1 << 20;
/// Capacity of every device in the suite; the strategies get 3/4 of it.
const CAPACITY: u64 = 64 * MIB;
const LIMIT: u64 = 48 * MIB;

/// A strategy over device 0 of a rig.
struct Subject {
    allocator: Arc<dyn Allocator>,
    rig: Rig,
    strategy: Strategy,
}

/// What wraps a cell's strategy: nothing, or one of portalloc's adaptors (`src/adaptor`).
/// Every case passes through each adaptor as it passes on the bare strategy, and the
/// adaptor's own books are checked when the case drops the allocator ([`Adapted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Adaptor {
    /// The strategy as `strategy::build` made it.
    Bare,
    /// `LedgerAllocator` over the strategy (default options: rounding measured), with the
    /// device for its out-of-memory diagnoses.
    Ledger,
    /// `RecorderAllocator` over the strategy.
    #[cfg(feature = "trace")]
    Recorder,
    /// The strategy over a `CountingDevice` around the rig's device.
    CountingDevice,
    /// `GraphPools` over the strategy, asking the device about every request's stream
    /// (`Detect::EveryRequest`, the PyTorch hook's mode): outside a capture it must be the
    /// strategy itself.
    GraphPools,
}

/// A boxed or shared allocator as an `Allocator`, forwarding each call: `RecorderAllocator`
/// wraps a sized upstream only (and `strategy::build` returns a boxed one), and `GraphPools`
/// owns its upstream boxed while the case keeps the subject.
struct Forward<P>(P);

impl<P: std::ops::Deref<Target = dyn Allocator> + Send + Sync> Allocator for Forward<P> {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn id(&self) -> u64 {
        self.0.id()
    }
    fn allocate(
        &self,
        size: u64,
        alignment: u64,
        stream: Stream,
        tag: &str,
    ) -> portalloc::Result<Allocation> {
        self.0.allocate(size, alignment, stream, tag)
    }
    fn deallocate(&self, allocation: Allocation) -> portalloc::Result<()> {
        self.0.deallocate(allocation)
    }
    fn stats(&self) -> Stats {
        self.0.stats()
    }
    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        self.0.charged(allocation)
    }
    fn pool_bytes(&self) -> u64 {
        self.0.pool_bytes()
    }
    fn trim(&self) -> portalloc::Result<u64> {
        self.0.trim()
    }
    fn queues_on_stream(&self) -> bool {
        self.0.queues_on_stream()
    }
    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.0.check_invariants()
    }
}

/// The adaptor, typed, around the strategy.
enum Wrapped {
    Ledger(Box<LedgerAllocator<dyn Allocator>>),
    #[cfg(feature = "trace")]
    Recorder(Box<RecorderAllocator<Forward<Box<dyn Allocator>>>>),
    /// The strategy over the counting device, and the device, to read its counts.
    Counting(Box<dyn Allocator>, Arc<CountingDevice<dyn Device>>),
    GraphPools(GraphPools),
}

/// A strategy inside an adaptor, as the case uses it. It counts what it served, and when
/// dropped (the case's own drop of the allocator) checks the adaptor against that: the
/// ledger's live allocations and its snapshot's JSON round trip; the recorder's trace, one
/// event per non-empty allocation and free it served, each free of a live allocation of the
/// same size and stream; the counting device saw the strategy's device calls.
struct Adapted {
    wrapped: Option<Wrapped>,
    /// Successful allocations (and of them, non-empty ones), successful frees (non-empty).
    allocated: AtomicU64,
    allocated_non_empty: AtomicU64,
    freed: AtomicU64,
    freed_non_empty: AtomicU64,
}

impl Adapted {
    fn new(wrapped: Wrapped) -> Adapted {
        Adapted {
            wrapped: Some(wrapped),
            allocated: AtomicU64::new(0),
            allocated_non_empty: AtomicU64::new(0),
            freed: AtomicU64::new(0),
            freed_non_empty: AtomicU64::new(0),
        }
    }

    fn inner(&self) -> &dyn Allocator {
        match self.wrapped.as_ref().expect("live until dropped") {
            Wrapped::Ledger(l) => l.as_ref(),
            #[cfg(feature = "trace")]
            Wrapped::Recorder(r) => r.as_ref(),
            Wrapped::Counting(a, _) => a.as_ref(),
            Wrapped::GraphPools(g) => g,
        }
    }
}

impl Allocator for Adapted {
    fn name(&self) -> &str {
        self.inner().name()
    }
    fn id(&self) -> u64 {
        self.inner().id()
    }
    fn allocate(
        &self,
        size: u64,
        alignment: u64,
        stream: Stream,
        tag: &str,
    ) -> portalloc::Result<Allocation> {
        let a = self.inner().allocate(size, alignment, stream, tag)?;
        self.allocated.fetch_add(1, Ordering::Relaxed);
        if !a.is_empty() {
            self.allocated_non_empty.fetch_add(1, Ordering::Relaxed);
        }
        Ok(a)
    }
    fn deallocate(&self, allocation: Allocation) -> portalloc::Result<()> {
        let empty = allocation.is_empty();
        self.inner().deallocate(allocation)?;
        self.freed.fetch_add(1, Ordering::Relaxed);
        if !empty {
            self.freed_non_empty.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
    fn stats(&self) -> Stats {
        self.inner().stats()
    }
    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        self.inner().charged(allocation)
    }
    fn pool_bytes(&self) -> u64 {
        self.inner().pool_bytes()
    }
    fn trim(&self) -> portalloc::Result<u64> {
        self.inner().trim()
    }
    fn queues_on_stream(&self) -> bool {
        self.inner().queues_on_stream()
    }
    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.inner().check_invariants()
    }
}

impl Drop for Adapted {
    fn drop(&mut self) {
        let wrapped = self.wrapped.take().expect("dropped once");
        if std::thread::panicking() {
            // A case failed already: its message is the one to read.
            return;
        }
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let (allocated, freed) = (get(&self.allocated), get(&self.freed));
        let non_empty = get(&self.allocated_non_empty);
        match wrapped {
            Wrapped::Ledger(ledger) => {
                ledger
                    .check_invariants()
                    .unwrap_or_else(|e| panic!("ledger at drop: {e}"));
                assert_eq!(
                    ledger.live_count() as u64,
                    allocated - freed,
                    "the ledger's live allocations: {allocated} served, {freed} freed"
                );
                let snapshot = ledger.snapshot();
                assert_eq!(snapshot.allocations_made, allocated);
                let json = snapshot.to_json();
                let back = LedgerSnapshot::from_json(&json)
                    .unwrap_or_else(|e| panic!("the ledger's snapshot does not read back: {e}"));
                // Floats included (the fragmentation): serde_json's `float_roundtrip`.
                assert_eq!(back, snapshot, "the ledger's snapshot after JSON");
            }
            #[cfg(feature = "trace")]
            Wrapped::Recorder(recorder) => {
                use portalloc::trace::Op;
                let (_, events) = recorder.trace();
                let mut live = std::collections::HashMap::new();
                let (mut allocs, mut frees) = (0, 0);
                for (i, e) in events.iter().enumerate() {
                    assert_eq!(e.seq, i as u64, "the recorder's events are in order");
                    match e.op {
                        Op::Alloc => {
                            allocs += 1;
                            let before = live.insert(e.id, (e.size, e.stream));
                            assert!(before.is_none(), "id {} recorded twice: {e:?}", e.id);
                        }
                        Op::Free => {
                            frees += 1;
                            let made = live.remove(&e.id);
                            assert_eq!(
                                made,
                                Some((e.size, e.stream)),
                                "a free of no live allocation of its size and stream: {e:?}"
                            );
                        }
                        #[allow(unreachable_patterns)]
                        _ => panic!("the recorder records allocations and frees only: {e:?}"),
                    }
                }
                assert_eq!(
                    (allocs, frees),
                    (non_empty, get(&self.freed_non_empty)),
                    "recorded (allocations, frees) against those served (non-empty ones)"
                );
                let mut written = Vec::new();
                assert_eq!(
                    recorder.write_portalloc(&mut written).unwrap(),
                    events.len() as u64
                );
            }
            Wrapped::GraphPools(pools) => {
                pools
                    .check_invariants()
                    .unwrap_or_else(|e| panic!("graph pools at drop: {e}"));
                assert!(
                    pools.pools().iter().all(|p| p.blocks == 0),
                    "no capture ran, yet a graph pool holds memory: {:?}",
                    pools.pools()
                );
            }
            Wrapped::Counting(allocator, device) => {
                drop(allocator);
                let counts = device.counts();
                if non_empty > 0 {
                    assert!(
                        counts.memory_calls() > 0,
                        "memory was served, but no device call reached the counting device: \
                         {counts:?}"
                    );
                }
            }
        }
    }
}

impl Adaptor {
    /// `strategy` over `device` (as [`SuiteStrategy::build_as_configured`] builds it), in
    /// the adaptor.
    fn build(
        self,
        strategy: Strategy,
        device: Arc<dyn Device>,
    ) -> portalloc::Result<Box<dyn Allocator>> {
        let wrapped = match self {
            Adaptor::Bare => return strategy.build_as_configured(device),
            Adaptor::Ledger => {
                let upstream = strategy.build_as_configured(Arc::clone(&device))?;
                Wrapped::Ledger(Box::new(
                    LedgerAllocator::from_boxed(upstream, LedgerOptions::default())
                        .with_device(device),
                ))
            }
            #[cfg(feature = "trace")]
            Adaptor::Recorder => Wrapped::Recorder(Box::new(RecorderAllocator::new(
                Forward(strategy.build_as_configured(device)?),
                "conformance",
            ))),
            Adaptor::GraphPools => Wrapped::GraphPools(GraphPools::from_boxed(
                strategy.build_as_configured(Arc::clone(&device))?,
                device,
                Detect::EveryRequest,
            )),
            Adaptor::CountingDevice => {
                let counting = Arc::new(CountingDevice::new(device));
                let allocator =
                    strategy.build_as_configured(Arc::clone(&counting) as Arc<dyn Device>)?;
                Wrapped::Counting(allocator, counting)
            }
        };
        Ok(Box::new(Adapted::new(wrapped)))
    }
}

/// An allocator whose every call — drop included — is made with the caller's other device
/// current ([`CallerProbe::around`]), which it must leave so.
struct CallerChecked {
    inner: Option<Box<dyn Allocator>>,
    probe: CallerProbe,
}

impl CallerChecked {
    fn inner(&self) -> &dyn Allocator {
        self.inner.as_deref().expect("live until dropped")
    }
}

impl Allocator for CallerChecked {
    fn name(&self) -> &str {
        self.inner().name()
    }
    fn id(&self) -> u64 {
        self.inner().id()
    }
    fn allocate(
        &self,
        size: u64,
        alignment: u64,
        stream: Stream,
        tag: &str,
    ) -> portalloc::Result<Allocation> {
        self.probe.around("allocate", || {
            self.inner().allocate(size, alignment, stream, tag)
        })
    }
    fn deallocate(&self, allocation: Allocation) -> portalloc::Result<()> {
        self.probe
            .around("deallocate", || self.inner().deallocate(allocation))
    }
    fn stats(&self) -> Stats {
        self.probe.around("stats", || self.inner().stats())
    }
    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        self.probe
            .around("charged", || self.inner().charged(allocation))
    }
    fn pool_bytes(&self) -> u64 {
        self.probe
            .around("pool_bytes", || self.inner().pool_bytes())
    }
    fn trim(&self) -> portalloc::Result<u64> {
        self.probe.around("trim", || self.inner().trim())
    }
    fn queues_on_stream(&self) -> bool {
        self.inner().queues_on_stream()
    }
    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.inner().check_invariants()
    }
}

impl Drop for CallerChecked {
    fn drop(&mut self) {
        let inner = self.inner.take();
        if std::thread::panicking() {
            // A case failed already: a second panic here would abort the whole suite.
            return drop(inner);
        }
        self.probe.around("the allocator's drop", || drop(inner));
    }
}

/// Builds `strategy` over device 0 of `rig`, in `adaptor`. Where the target cannot serve it, asserts the
/// typed refusal and the empty census instead, and returns `None`.
fn subject(rig: Rig, strategy: Strategy, adaptor: Adaptor) -> Option<Subject> {
    let target = rig.target;
    let probe = rig.caller_probe();
    let built = match &probe {
        Some(p) => p.around("strategy::build", || adaptor.build(strategy, rig.device(0))),
        None => adaptor.build(strategy, rig.device(0)),
    };
    if strategy.served_by(target) {
        let allocator = built.unwrap_or_else(|e| panic!("{target:?} {strategy:?}: {e}"));
        let allocator: Arc<dyn Allocator> = match probe {
            Some(probe) => Arc::new(CallerChecked {
                inner: Some(allocator),
                probe,
            }),
            None => Arc::from(allocator),
        };
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

/// Runs one cell: `case` on `devices` devices of `target`, for `strategy` in `adaptor`.
fn run(
    target: Target,
    strategy: Strategy,
    adaptor: Adaptor,
    devices: u32,
    case: fn(Rig, Strategy, Adaptor),
) {
    if let Some(rig) = target.open(devices, CAPACITY) {
        case(rig, strategy, adaptor);
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

    /// True when the pooling strategies' rules apply: memory is reused, not freed.
    fn pools(&self) -> bool {
        matches!(
            self.strategy,
            Strategy::Bfc | Strategy::BfcGrow | Strategy::Vmm
        )
    }
}

/// True when the allocation overlaps `[range.0, range.1)`.
fn overlaps(a: &Allocation, range: (u64, u64)) -> bool {
    a.size() > 0 && a.ptr() < range.1 && range.0 < a.ptr() + a.size()
}

/// The case bodies, one per behaviour; each takes a fresh rig and builds the strategy on it.
mod cases {
    use super::*;

    /// Zero bytes: an empty allocation, and no device call.
    pub fn zero_size(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
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
    pub fn aligned_disjoint_usable(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
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
    pub fn alignment_rules(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
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
    pub fn impossible_sizes(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
            return;
        };
        for size in [u64::MAX, u64::MAX - 255, CAPACITY * 2, LIMIT + 1] {
            let e = s
                .allocator
                .allocate(size, 0, Stream::DEFAULT, "t")
                .expect_err("impossible size served");
            // The ledger hands out the upstream's error unchanged inside its diagnosis
            // (`Error::OutOfMemoryDiagnosed`), for out of memory and `ExceedsLimit` alike.
            let upstream = match &e {
                Error::OutOfMemoryDiagnosed { error, .. } => {
                    assert_eq!(adaptor, Adaptor::Ledger, "only the ledger diagnoses: {e}");
                    error.as_ref()
                }
                e => e,
            };
            let refused = matches!(upstream, Error::ExceedsLimit { .. }) || e.is_out_of_memory();
            assert!(
                refused || matches!(upstream, Error::InvalidSize { .. }),
                "size {size}: unexpected error {e}"
            );
            if adaptor == Adaptor::Ledger && refused {
                assert!(e.diagnosis().is_some(), "size {size}: undiagnosed {e}");
            }
            assert!(!e.to_string().is_empty());
            s.invariants();
        }
        // Still works afterwards.
        let a = s.allocate(MIB, Stream::DEFAULT);
        s.allocator.deallocate(a).unwrap();
        s.finish();
    }

    /// Running out: allocate until refused, then free everything and allocate again.
    pub fn exhaustion_and_recovery(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
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
    pub fn foreign_allocations_refused(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
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
    pub fn trim_and_drop(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
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
    pub fn threads_share_one_allocator(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
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
            // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
            unsafe { device.destroy_stream(stream) }.unwrap();
        }
        drop(device);
        rig.finish();
    }

    /// Streams the caller made with the driver's own call: with the caller's kernel on `S`
    /// still reading a buffer when it is freed on `S`, the buffer is not handed to `T`, `U` or
    /// the default stream unless work queued there is ordered after that kernel — the
    /// driver's own timeline is the oracle (a completed kernel, or a GPU-side wait). `S`
    /// reuses its own free at once (the pooling strategies), and everything is given back.
    pub fn foreign_streams(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
            return;
        };
        const SIZE: u64 = MIB;
        let rig = &s.rig;
        let (st, tt, ut) = (
            rig.foreign_stream(),
            rig.foreign_stream(),
            rig.foreign_stream(),
        );
        let mut keep: Vec<Allocation> = Vec::new();
        // T is in use too (several streams: frees become stream-ordered), then the caller's
        // kernel uses a buffer on S and is still running when the buffer is freed on S.
        keep.push(s.allocate(4096, tt));
        let x = s.allocate(SIZE, st);
        let freed = (x.ptr(), x.ptr() + SIZE);
        let work = rig.launch(st, x.ptr(), SIZE);
        s.allocator.deallocate(x).unwrap();
        let mut reused_elsewhere = 0;
        for other in [tt, ut, Stream::DEFAULT] {
            for size in [SIZE, SIZE / 2, 256] {
                let y = s.allocate(size, other);
                if overlaps(&y, freed) {
                    assert!(
                        rig.ordered(work, other),
                        "{strategy:?}: {:#x}+{size} handed to {other:?} while the caller's kernel \
                         on {st:?} still uses {:#x}+{SIZE}, and nothing orders {other:?} after it",
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
        if s.pools() && reused_elsewhere == 0 {
            assert!(
                overlaps(&again, freed),
                "{strategy:?}: S did not reuse its own pending free"
            );
            assert!(!rig.work_done(work), "S reused without waiting");
        }
        keep.push(again);
        rig.finish_work(work);
        s.free_all(keep);
        s.allocator.trim().unwrap();
        let Subject { allocator, rig, .. } = s;
        drop(allocator);
        rig.destroy_foreign(&[st, tt, ut]);
        rig.finish();
    }

    /// Two streams, as a PyTorch program has them: buffers freed on `S` while `S`'s kernels
    /// still read them, requests on `T`. Whatever `T` is handed that a kernel still uses
    /// must be ordered after it on the device; and until the limit is near, the caching
    /// strategies and the driver's pool make no CPU wait at all (RMM's order: `T`'s own free
    /// memory, another stream's behind a GPU-side wait, growth).
    pub fn kernels_in_flight_across_streams(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
            return;
        };
        let rig = &s.rig;
        let (st, tt) = (rig.foreign_stream(), rig.foreign_stream());
        let sizes = [16 << 10, 64 << 10, 256 << 10, 48 << 10];
        let (cpu_before, gpu_before) = rig.waits();
        let mut kernels: Vec<(u64, (u64, u64))> = Vec::new();
        let mut on_t: Vec<Allocation> = Vec::new();
        for i in 0..48usize {
            let x = s.allocate(sizes[i % 4], st);
            let range = (x.ptr(), x.ptr() + x.size());
            kernels.push((rig.launch(st, x.ptr(), x.size()), range));
            s.allocator.deallocate(x).unwrap();
            let y = s.allocate(sizes[(i + 1) % 4], tt);
            for &(k, range) in &kernels {
                if overlaps(&y, range) {
                    assert!(
                        rig.ordered(k, tt),
                        "{strategy:?}: {:#x}+{} handed to T while a kernel on S still uses \
                         [{:#x}, {:#x}), and nothing orders T after it",
                        y.ptr(),
                        y.size(),
                        range.0,
                        range.1
                    );
                }
            }
            on_t.push(y);
            if i % 3 == 2 {
                // T frees too, on T: its own memory, reused on T at once.
                let a = on_t.swap_remove(0);
                s.allocator.deallocate(a).unwrap();
            }
            s.invariants();
        }
        let (cpu, gpu) = rig.waits();
        if strategy != Strategy::Platform {
            assert_eq!(
                cpu - cpu_before,
                0,
                "{strategy:?}: {} CPU waits (and {} GPU-side waits) far below the limit",
                cpu - cpu_before,
                gpu - gpu_before
            );
        }
        for &(k, _) in &kernels {
            rig.finish_work(k);
        }
        s.free_all(on_t);
        s.allocator.trim().unwrap();
        let Subject { allocator, rig, .. } = s;
        drop(allocator);
        rig.destroy_foreign(&[st, tt]);
        rig.finish();
    }

    /// One stream, memory freed at once while kernels still read it (no event: the
    /// single-stream path), then a request that needs memory elsewhere: vmm stitches free
    /// granules only once the work on them is known complete, so nothing a kernel reads is
    /// unmapped (the rig fails on any such hazard); the request is still served.
    pub fn freed_at_once_is_not_unmapped_under_kernels(
        rig: Rig,
        strategy: Strategy,
        adaptor: Adaptor,
    ) {
        let Some(s) = subject(rig, strategy, adaptor) else {
            return;
        };
        let rig = &s.rig;
        let st = rig.foreign_stream();
        // The whole limit in 2 MiB buffers (a granule each under vmm).
        let mut live: Vec<Allocation> = Vec::new();
        while let Ok(a) = s.allocator.allocate(2 * MIB, 0, st, "t") {
            live.push(a);
            assert!(live.len() <= 64, "never ran out");
        }
        // Every other buffer freed while a kernel of S still reads it.
        let mut kernels = Vec::new();
        let mut keep = Vec::new();
        for (i, a) in live.into_iter().enumerate() {
            if i % 2 == 0 {
                kernels.push(rig.launch(st, a.ptr(), a.size()));
                s.allocator.deallocate(a).unwrap();
            } else {
                keep.push(a);
            }
        }
        // Two granules together: none free side by side, so vmm must stitch.
        let big = s.allocator.allocate(4 * MIB, 0, st, "t");
        match (&big, strategy) {
            (Ok(_), _) => {}
            (Err(e), Strategy::Vmm) => panic!("vmm: the request needs stitching: {e}"),
            (Err(e), _) => assert!(e.is_out_of_memory(), "{strategy:?}: {e}"),
        }
        let (hazards, first) = rig.hazards();
        assert_eq!(hazards, 0, "{strategy:?}: {first}");
        s.invariants();
        if let Ok(a) = big {
            keep.push(a);
        }
        for k in kernels {
            rig.finish_work(k);
        }
        s.free_all(keep);
        s.allocator.trim().unwrap();
        let Subject { allocator, rig, .. } = s;
        drop(allocator);
        rig.destroy_foreign(&[st]);
        rig.finish();
    }

    /// An allocator dropped while kernels still read memory it freed, and memory still live
    /// in it: it waits for that work before its memory goes back to the device.
    pub fn drop_waits_for_work_in_flight(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
            return;
        };
        let rig = &s.rig;
        let (st, tt) = (rig.foreign_stream(), rig.foreign_stream());
        let mut kernels = Vec::new();
        for (i, stream) in [st, st, tt, st].into_iter().enumerate() {
            let a = s.allocate((i as u64 + 1) * MIB, stream);
            kernels.push(rig.launch(stream, a.ptr(), a.size()));
            if i == 3 {
                drop(a); // live at drop (never freed): a leak the drop reports and returns
            } else {
                s.allocator.deallocate(a).unwrap();
            }
        }
        let Subject { allocator, rig, .. } = s;
        drop(allocator);
        let (hazards, first) = rig.hazards();
        assert_eq!(
            hazards, 0,
            "{strategy:?}: the drop returned memory in use: {first}"
        );
        for k in kernels {
            rig.finish_work(k);
        }
        if strategy == Strategy::Async {
            // The driver's pool gives back what was freed in it once those frees completed:
            // the device's owner trims it now that they have.
            let device = rig.device(0);
            let pool = device.stream_ordered_pool().expect("a pool");
            pool.trim_to(0).unwrap();
        }
        rig.destroy_foreign(&[st, tt]);
        rig.finish();
    }

    /// A buffer made on the per-thread default stream by one thread, whose kernel there
    /// still reads it, dropped on another thread: the free is ordered after the allocating
    /// thread's work (the dropping thread's per-thread stream is another stream), so
    /// another stream handed that memory runs after the kernel.
    pub fn per_thread_buffer_dropped_on_another_thread(
        rig: Rig,
        strategy: Strategy,
        adaptor: Adaptor,
    ) {
        let Some(s) = subject(rig, strategy, adaptor) else {
            return;
        };
        let rig = &s.rig;
        let tt = rig.foreign_stream();
        let keep = s.allocate(4096, tt);
        let (buffer, work) = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let b = DeviceBuffer::new(&s.allocator, MIB, Stream::PER_THREAD).unwrap();
                    let work = rig.launch(Stream::PER_THREAD, b.ptr(), b.size());
                    (b, work)
                })
                .join()
                .unwrap()
        });
        let freed = (buffer.ptr(), buffer.ptr() + MIB);
        // Dropped here, on another thread than the one that made it.
        drop(buffer);
        let y = s.allocate(MIB, tt);
        if overlaps(&y, freed) {
            assert!(
                rig.ordered(work, tt),
                "{strategy:?}: memory a kernel on another thread's per-thread stream still uses \
                 was handed to T with nothing ordering T after it"
            );
        }
        rig.finish_work(work);
        s.free_all(vec![keep, y]);
        s.allocator.trim().unwrap();
        let Subject { allocator, rig, .. } = s;
        drop(allocator);
        rig.destroy_foreign(&[tt]);
        rig.finish();
    }

    /// A stream destroyed once the work of its frees completed (the contract), and another
    /// made — which the conformance drivers give the destroyed one's handle value, as the
    /// drivers reuse handles: the books stay consistent, and memory goes to a third stream
    /// only in order.
    /// A graph captured on a stream the caller made, with the subject (in its adaptor) inside
    /// graph pools routed for the capture: two allocations and a free during the capture,
    /// eager allocations after it written by kernels held in flight on another stream, 20
    /// replays — no hazard, the capture never invalidated, the census empty at the end. On
    /// the host, which captures nothing, the device says no stream is captured and the pools
    /// pass every request through to the subject.
    pub fn captured_graph_replays(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
            return;
        };
        let device = s.rig.device(0);
        let pools = GraphPools::from_boxed(
            Box::new(Forward(Arc::clone(&s.allocator))),
            Arc::clone(&device),
            Detect::WhileRouted,
        );
        let (capture, eager) = (s.rig.foreign_stream(), s.rig.foreign_stream());
        let pool = pools.create_pool(None).unwrap();
        pools.begin_allocate_to_pool(pool, capture).unwrap();
        #[cfg(any(feature = "cuda", feature = "hip"))]
        let raw = s
            .rig
            .fake()
            .map(|fake| crate::support::capture::Raw { fake });
        #[cfg(not(any(feature = "cuda", feature = "hip")))]
        let raw: Option<()> = None;
        #[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(unused_variables))]
        let Some(raw) = raw
        else {
            assert_eq!(
                device.capture_status(capture).unwrap(),
                portalloc::CaptureStatus::None
            );
            let a = pools.allocate(MIB, 0, capture, "t").unwrap();
            assert_eq!(
                pools.pool_stats(pool).unwrap().blocks,
                0,
                "passed through to the subject, not into the pool"
            );
            pools.deallocate(a).unwrap();
            pools.end_allocate_to_pool(pool).unwrap();
            assert_eq!(pools.release_pool(pool).unwrap(), 0);
            drop((pools, device));
            s.allocator.trim().unwrap();
            s.rig.destroy_foreign(&[capture, eager]);
            return s.finish();
        };
        #[cfg(any(feature = "cuda", feature = "hip"))]
        {
            let rig = &s.rig;
            raw.begin(capture);
            let a = pools.allocate(2 * MIB, 0, capture, "graph").unwrap();
            rig.launch_writing(capture, a.ptr(), a.size());
            let b = pools.allocate(MIB, 0, capture, "graph").unwrap();
            rig.launch(capture, a.ptr(), a.size());
            rig.launch_writing(capture, b.ptr(), b.size());
            pools.deallocate(a).unwrap();
            let graph = raw
                .end(capture)
                .unwrap_or_else(|rc| panic!("{strategy:?}: capture invalidated ({rc})"));
            pools.end_allocate_to_pool(pool).unwrap();
            let graph_memory = (b.ptr(), b.ptr() + b.size());
            let mut eager_buffers = Vec::new();
            let mut work = Vec::new();
            for size in [2 * MIB, MIB, 512 * 1024] {
                let x = pools.allocate(size, 0, eager, "eager").unwrap();
                assert!(
                    !overlaps(&x, graph_memory),
                    "{strategy:?}: eager over the graph's"
                );
                work.push(rig.launch_writing(eager, x.ptr(), x.size()));
                eager_buffers.push(x);
            }
            let exec = raw.instantiate(graph);
            for _ in 0..20 {
                raw.launch(exec, capture);
            }
            raw.sync(capture);
            let (hazards, first) = rig.hazards();
            assert_eq!(hazards, 0, "{strategy:?}: {first}");
            for w in work {
                rig.finish_work(w);
            }
            raw.sync(eager);
            for x in eager_buffers {
                pools.deallocate(x).unwrap();
            }
            pools.deallocate(b).unwrap();
            raw.destroy(graph, exec);
            assert_eq!(pools.release_pool(pool).unwrap(), 3 * MIB);
            pools.check_invariants().unwrap();
            drop((pools, device));
            s.allocator.trim().unwrap();
            rig.destroy_foreign(&[capture, eager]);
            s.finish();
        }
    }

    pub fn destroyed_stream_handles_are_reused(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
        let Some(s) = subject(rig, strategy, adaptor) else {
            return;
        };
        let rig = &s.rig;
        let tt = rig.foreign_stream();
        let keep = s.allocate(4096, tt);
        let first = rig.foreign_stream();
        let x = s.allocate(MIB, first);
        let freed = (x.ptr(), x.ptr() + MIB);
        let work = rig.launch(first, x.ptr(), MIB);
        s.allocator.deallocate(x).unwrap();
        rig.finish_work(work);
        rig.destroy_foreign(&[first]);
        let second = rig.foreign_stream();
        if rig.target != Target::HostReal && rig.target != Target::HostSimulated {
            assert_eq!(
                second, first,
                "the driver reuses a destroyed stream's handle"
            );
        }
        // The new stream is a new stream: memory freed on the old one (its work complete)
        // may go to it, and what it frees while its kernel runs goes to T only in order.
        let y = s.allocate(MIB, second);
        let reused = overlaps(&y, freed);
        let used = (y.ptr(), y.ptr() + MIB);
        let later = rig.launch(second, y.ptr(), MIB);
        s.allocator.deallocate(y).unwrap();
        let z = s.allocate(MIB, tt);
        if overlaps(&z, used) {
            assert!(
                rig.ordered(later, tt),
                "{strategy:?}: memory the new stream's kernel still uses went to T unordered \
                 (reused the old stream's: {reused})"
            );
        }
        rig.finish_work(later);
        s.invariants();
        s.free_all(vec![keep, z]);
        s.allocator.trim().unwrap();
        let Subject { allocator, rig, .. } = s;
        drop(allocator);
        rig.destroy_foreign(&[second, tt]);
        rig.finish();
    }

    /// Two devices of the target: device 0 reaches device 1 where the target offers peer
    /// access ([`crate::support::targets::PEER_TARGETS`]) — and says so with a typed error where it
    /// does not; the strategy on device 0 then serves memory as before, and vmm grants the
    /// enabled peer access to what it maps.
    pub fn peer_access(rig: Rig, strategy: Strategy, adaptor: Adaptor) {
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
        let Some(s) = subject(rig, strategy, adaptor) else {
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

/// One test per case, for the strategy `$strategy` on the module's `TARGET`: bare, and in
/// each adaptor (a module each: `ledger`, `recorder`, `counting_device`).
macro_rules! cases {
    ($strategy:expr) => {
        cases!(@each $strategy, Adaptor::Bare);
        mod ledger {
            use super::{cases, run, Adaptor, Strategy, TARGET};
            cases!(@each $strategy, Adaptor::Ledger);
        }
        #[cfg(feature = "trace")]
        mod recorder {
            use super::{cases, run, Adaptor, Strategy, TARGET};
            cases!(@each $strategy, Adaptor::Recorder);
        }
        mod counting_device {
            use super::{cases, run, Adaptor, Strategy, TARGET};
            cases!(@each $strategy, Adaptor::CountingDevice);
        }
        mod graph_pools {
            use super::{cases, run, Adaptor, Strategy, TARGET};
            cases!(@each $strategy, Adaptor::GraphPools);
        }
    };
    (@each $strategy:expr, $adaptor:expr) => {
        cases!(@tests $strategy, $adaptor;
            zero_size: 1,
            aligned_disjoint_usable: 1,
            alignment_rules: 1,
            impossible_sizes: 1,
            exhaustion_and_recovery: 1,
            foreign_allocations_refused: 1,
            trim_and_drop: 1,
            threads_share_one_allocator: 1,
            foreign_streams: 1,
            kernels_in_flight_across_streams: 1,
            freed_at_once_is_not_unmapped_under_kernels: 1,
            drop_waits_for_work_in_flight: 1,
            per_thread_buffer_dropped_on_another_thread: 1,
            destroyed_stream_handles_are_reused: 1,
            captured_graph_replays: 1,
            peer_access: 2,
        );
    };
    (@tests $strategy:expr, $adaptor:expr; $($case:ident: $devices:literal),* $(,)?) => {$(
        #[test]
        fn $case() {
            run(TARGET, $strategy, $adaptor, $devices, cases::$case)
        }
    )*};
}

/// One module per strategy, on the module's `TARGET`.
macro_rules! strategies {
    ($($name:ident => $strategy:expr),* $(,)?) => {$(
        mod $name {
            use super::{cases, run, Adaptor, Strategy, TARGET};
            cases!($strategy);
        }
    )*};
}

/// One module per target.
macro_rules! targets {
    ($($(#[$attribute:meta])* $name:ident => $target:expr),* $(,)?) => {$(
        $(#[$attribute])*
        mod $name {
            #[allow(unused_imports)]
            use super::Rocm;
            use super::{cases, run, Adaptor, Strategy, Target};
            const TARGET: Target = $target;
            strategies! {
                bfc_preallocated => Strategy::Bfc,
                bfc_growing => Strategy::BfcGrow,
                platform => Strategy::Platform,
                async_pool => Strategy::Async,
                vmm => Strategy::Vmm,
            }
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
