//! Fault injection on every driver call.
//!
//! A workload — a small `TransformerTrain` (GPT-2 shape, 1 layer) followed by a synthetic
//! trace of mixed sizes on three streams with trims — is replayed against every strategy
//! (`bfc` preallocating and growing, `platform`, `vmm`, `async`) while the device fails the
//! k-th call, for every k in turn, with each of three errors: out of memory, not supported,
//! and a generic driver error.
//!
//! * **Rust** ([`FaultDevice`] over the simulated [`HostDevice`]): every `Device`,
//!   `VirtualMemory` and `StreamOrderedPool` call the allocator makes is counted, and the
//!   k-th fails. k runs over every call of a clean run, construction and drop included.
//! * **CUDA conformance driver** (`tests/drivers/fakecuda.c` through the real shim,
//!   `fakecuda_fail_call`): for every memory, pool, stream and event symbol the allocator
//!   reaches, its n-th call fails, for every n a clean run makes.
//! * **HIP conformance driver** (`tests/drivers/fakehip.c`, `fakehip_fail`): the same, with
//!   the driver's own call counters.
//!
//! After each run: the error surfaced as a typed error that names the fault (or as an
//! out-of-memory error for an injected out-of-memory), or was absorbed by a retry or a
//! fallback; a one-shot fault surfaced at most once; the allocator's invariants held after
//! every step; and once everything was freed and the allocator dropped, the device holds no
//! allocation, physical handle, mapping or reservation (the host census, the shim's census
//! and the driver's own counts). A fault injected while the allocator is being dropped
//! cannot be reported to anyone: such runs are counted apart, and must leave behind at most
//! the one object whose release was refused.
//!
//! Each sweep prints a summary line: run with `--nocapture` to see the figures.

#[path = "support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use portalloc::adaptor::{Call, DeviceWrapper};
use portalloc::backends::host::{HostCensus, HostDevice};
use portalloc::device::{Device, Stream};
use portalloc::replay::workload::TransformerTrain;
use portalloc::strategy::async_pool::{AsyncOptions, AsyncPoolAllocator};
use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
use portalloc::strategy::platform::PlatformAllocator;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::trace::Op;
use portalloc::{Allocation, Allocator, Error, Result};

const MIB: u64 = 1 << 20;
/// Capacity of every device: room for the workload with no real out-of-memory.
const CAPACITY: u64 = 256 * MIB;
/// The allocator's limit: 0.75 × capacity, XLA's default fraction.
const LIMIT: u64 = CAPACITY / 4 * 3;

// ---------------------------------------------------------------------------------------------
// The workload
// ---------------------------------------------------------------------------------------------

/// One step of a replay.
#[derive(Debug, Clone, Copy)]
enum Step {
    Alloc {
        id: u64,
        size: u64,
        align: u64,
        stream: usize,
    },
    Free {
        id: u64,
    },
    Trim,
}

/// Streams a workload uses: index 0 is the default stream, 1 and 2 are created.
const STREAMS: usize = 3;

/// A small GPT-2-shaped training step (1 layer), as the replay engine's built-in workload
/// makes it.
fn transformer_steps() -> Vec<Step> {
    let w = TransformerTrain {
        layers: 1,
        hidden: 64,
        batch: 1,
        seq: 32,
        vocab: 512,
        heads: 1,
        steps: 1,
        ..TransformerTrain::default()
    };
    let (_, events) = w.events().expect("a valid workload");
    events
        .iter()
        .map(|e| match e.op {
            Op::Alloc => Step::Alloc {
                id: e.id,
                size: e.size,
                align: 0,
                stream: 0,
            },
            Op::Free => Step::Free { id: e.id },
        })
        .collect()
}

/// A deterministic pseudo-random generator (xorshift64*), so every run makes the same calls.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `n` steps: allocations of 1 B to 24 MiB (log-uniform) on three streams, frees of random
/// live ones, a trim now and then; everything freed at the end.
fn synthetic_steps(n: usize, seed: u64) -> Vec<Step> {
    let mut rng = Rng(seed | 1);
    let mut live: Vec<u64> = Vec::new();
    let mut steps = Vec::with_capacity(n + 64);
    let mut next_id = 1u64 << 40;
    for _ in 0..n {
        match rng.below(16) {
            0 => steps.push(Step::Trim),
            1..=6 if !live.is_empty() => {
                let i = rng.below(live.len() as u64) as usize;
                steps.push(Step::Free {
                    id: live.swap_remove(i),
                });
            }
            _ => {
                let bits = rng.below(25);
                let size = (1u64 << bits) + rng.below(1u64 << bits);
                let size = size.min(24 * MIB);
                next_id += 1;
                live.push(next_id);
                steps.push(Step::Alloc {
                    id: next_id,
                    size,
                    align: if rng.below(4) == 0 { 256 } else { 0 },
                    stream: rng.below(STREAMS as u64) as usize,
                });
            }
        }
    }
    for id in live {
        steps.push(Step::Free { id });
    }
    steps.push(Step::Trim);
    steps
}

// ---------------------------------------------------------------------------------------------
// The fault-injecting device
// ---------------------------------------------------------------------------------------------

/// The error an injected fault returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    OutOfMemory,
    NotSupported,
    Generic,
}

const KINDS: [Kind; 3] = [Kind::OutOfMemory, Kind::NotSupported, Kind::Generic];

impl Kind {
    fn error(self, call: &'static str, k: u64) -> Error {
        match self {
            Kind::OutOfMemory => Error::DeviceOutOfMemory {
                backend: "host",
                requested: 0,
                free: 0,
            },
            Kind::NotSupported => Error::Unsupported {
                what: format!("{call} (injected fault at call {k})"),
                backend: "host",
                reason: "injected fault".into(),
            },
            Kind::Generic => Error::Driver {
                backend: "host",
                call,
                code: 999,
                name: "INJECTED_FAULT".into(),
                message: format!("injected fault at call {k}"),
            },
        }
    }

    /// The driver code for it (CUDA and HIP use the same numbers for these three).
    #[cfg(any(feature = "cuda", feature = "hip"))]
    fn driver_code(self) -> i32 {
        match self {
            Kind::OutOfMemory => 2,
            Kind::NotSupported => 801,
            Kind::Generic => 999,
        }
    }
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Phase {
    Construct,
    Workload,
    Cleanup,
    Drop,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Construct => "construct",
            Phase::Workload => "workload",
            Phase::Cleanup => "cleanup",
            Phase::Drop => "drop",
        })
    }
}

#[derive(Debug)]
struct Plan {
    /// Calls are counted (and may fail) only while armed.
    armed: bool,
    phase: Phase,
    /// Calls counted so far.
    calls: u64,
    /// The call to fail (1-based); 0: none.
    fail_at: u64,
    kind: Kind,
    /// `(k, call, phase)` of the fault, once injected.
    fired: Option<(u64, &'static str, Phase)>,
    /// Calls counted, by method.
    per_call: BTreeMap<&'static str, u64>,
    /// Errors the device beneath returned while armed: `(call, phase, message)`.
    inner_errors: Vec<(&'static str, Phase, String)>,
}

/// A [`Device`] that counts every call made of it and fails the k-th one, once; it also
/// records the errors of the device beneath (for the conformance drivers, whose faults are
/// injected below it).
#[derive(Debug)]
struct FaultDevice<D: Device + ?Sized> {
    inner: Arc<D>,
    plan: Mutex<Plan>,
}

impl<D: Device + ?Sized> FaultDevice<D> {
    fn new(inner: Arc<D>) -> Self {
        FaultDevice {
            inner,
            plan: Mutex::new(Plan {
                armed: false,
                phase: Phase::Construct,
                calls: 0,
                fail_at: 0,
                kind: Kind::Generic,
                fired: None,
                per_call: BTreeMap::new(),
                inner_errors: Vec::new(),
            }),
        }
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn arm(&self, fail_at: u64, kind: Kind) {
        let mut p = self.plan();
        p.armed = true;
        p.fail_at = fail_at;
        p.kind = kind;
    }

    fn set_armed(&self, armed: bool) {
        self.plan().armed = armed;
    }

    fn set_phase(&self, phase: Phase) {
        self.plan().phase = phase;
    }

    /// Counts a call; fails it when it is the chosen one.
    fn gate(&self, call: &'static str) -> Result<()> {
        let mut p = self.plan();
        if !p.armed {
            return Ok(());
        }
        p.calls += 1;
        *p.per_call.entry(call).or_insert(0) += 1;
        if p.calls == p.fail_at {
            let (k, phase) = (p.calls, p.phase);
            p.fired = Some((k, call, phase));
            return Err(p.kind.error(call, k));
        }
        Ok(())
    }

    /// Records an error of the device beneath.
    fn seen(&self, call: &'static str, error: Option<&Error>) {
        if let Some(e) = error {
            let mut p = self.plan();
            if p.armed {
                let phase = p.phase;
                p.inner_errors.push((call, phase, e.to_string()));
            }
        }
    }
}

impl<D: Device + ?Sized> DeviceWrapper for FaultDevice<D> {
    type Inner = D;
    fn wrapped(&self) -> &D {
        &self.inner
    }
    fn before(&self, call: &Call<'_>) -> Result<()> {
        self.gate(call.name())
    }
    fn after(&self, call: &Call<'_>, error: Option<&Error>) {
        self.seen(call.name(), error);
    }
}

// ---------------------------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    Bfc,
    BfcGrow,
    Platform,
    Vmm,
    Async,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::Bfc => "bfc",
            Strategy::BfcGrow => "bfc-grow",
            Strategy::Platform => "platform",
            Strategy::Vmm => "vmm",
            Strategy::Async => "async",
        }
    }

    fn build(self, device: Arc<dyn Device>) -> Result<Box<dyn Allocator>> {
        Ok(match self {
            Strategy::Bfc | Strategy::BfcGrow => Box::new(BfcAllocator::new(
                device,
                BfcOptions {
                    limit: LIMIT,
                    preallocate: self == Strategy::Bfc,
                },
            )?),
            Strategy::Platform => Box::new(PlatformAllocator::new(device, Some(LIMIT))),
            Strategy::Vmm => Box::new(VmmAllocator::new(device, VmmOptions::new(LIMIT))?),
            Strategy::Async => Box::new(AsyncPoolAllocator::new(device, AsyncOptions::new(LIMIT))?),
        })
    }
}

/// What happened in one run.
#[derive(Debug, Default)]
struct Outcome {
    /// Errors the allocator returned: `(phase, error)`.
    surfaced: Vec<(Phase, Error)>,
    /// Broken invariants or model checks, described.
    broken: Vec<String>,
}

/// Checks the allocator's own invariants and a simple model of what it handed out: live
/// ranges are disjoint and aligned, and `bytes_in_use` covers their sizes.
fn check(
    allocator: &dyn Allocator,
    live: &HashMap<u64, (Allocation, u64)>,
    at: &str,
) -> Vec<String> {
    let mut broken = Vec::new();
    if let Err(e) = allocator.check_invariants() {
        broken.push(format!("{at}: invariant broken: {e}"));
    }
    let mut spans: Vec<(u64, u64)> = live
        .values()
        .filter(|(a, _)| !a.is_empty())
        .map(|(a, _)| (a.ptr(), a.ptr() + a.size()))
        .collect();
    spans.sort_unstable();
    if let Some(w) = spans.windows(2).find(|w| w[0].1 > w[1].0) {
        broken.push(format!(
            "{at}: live ranges overlap: {:x?} and {:x?}",
            w[0], w[1]
        ));
    }
    if let Some((a, align)) = live
        .values()
        .find(|(a, align)| !a.is_empty() && a.ptr() % (*align).max(256) != 0)
    {
        broken.push(format!("{at}: {:#x} is not {align}-aligned", a.ptr()));
    }
    let sum: u64 = live.values().map(|(a, _)| a.size()).sum();
    let stats = allocator.stats();
    if stats.bytes_in_use < sum {
        broken.push(format!(
            "{at}: bytes_in_use {} is below the live sizes' sum {sum}",
            stats.bytes_in_use
        ));
    }
    broken
}

/// Replays `steps` against `strategy` on `device` (armed by the caller), frees what is left,
/// trims and drops the allocator. Checks the invariants after every step of a `clean` run and
/// after every step from a fault this wrapper injected on (before it, a faulted run repeats
/// the clean run exactly); for a fault the conformance driver injects, after every failed
/// step and every `check_every` steps; and at the end.
fn run<D: Device + ?Sized + 'static>(
    device: &Arc<FaultDevice<D>>,
    streams: &[Stream; STREAMS],
    strategy: Strategy,
    steps: &[Step],
    check_every: usize,
    clean: bool,
) -> Outcome {
    let mut out = Outcome::default();
    device.set_phase(Phase::Construct);
    let allocator = match strategy.build(Arc::clone(device) as Arc<dyn Device>) {
        Ok(a) => a,
        Err(e) => {
            out.surfaced.push((Phase::Construct, e));
            return out;
        }
    };
    device.set_phase(Phase::Workload);
    let mut live: HashMap<u64, (Allocation, u64)> = HashMap::new();
    let checked = |out: &mut Outcome, allocator: &dyn Allocator, live: &_, at: &str| {
        device.set_armed(false);
        out.broken.extend(check(allocator, live, at));
        device.set_armed(true);
    };
    let mut fault_step: Option<usize> = None;
    for (i, step) in steps.iter().enumerate() {
        let mut failed = false;
        match *step {
            Step::Alloc {
                id,
                size,
                align,
                stream,
            } => match allocator.allocate(size, align, streams[stream], "fault") {
                Ok(a) => {
                    live.insert(id, (a, align));
                }
                Err(e) => {
                    out.surfaced.push((Phase::Workload, e));
                    failed = true;
                }
            },
            Step::Free { id } => {
                if let Some((a, _)) = live.remove(&id) {
                    if let Err(e) = allocator.deallocate(a) {
                        out.surfaced.push((Phase::Workload, e));
                        failed = true;
                    }
                }
            }
            Step::Trim => {
                if let Err(e) = allocator.trim() {
                    out.surfaced.push((Phase::Workload, e));
                    failed = true;
                }
            }
        }
        // After every step of the clean run, and after every step from the one an injected
        // fault hits (a faulted run is the clean run, call for call, until its fault fires,
        // so nothing before it needs checking again): every step of every run. A fault the
        // conformance driver injects is not seen here: those runs are checked after every
        // failed step and every `check_every` steps.
        let fired_at = device.plan().fired.is_some();
        if fired_at && fault_step.is_none() {
            fault_step = Some(i);
        }
        if clean || fault_step.is_some() || failed || i % check_every == 0 {
            checked(&mut out, allocator.as_ref(), &live, &format!("step {i}"));
        }
    }
    device.set_phase(Phase::Cleanup);
    for (_, (a, _)) in live.drain() {
        if let Err(e) = allocator.deallocate(a) {
            out.surfaced.push((Phase::Cleanup, e));
        }
    }
    if let Err(e) = allocator.trim() {
        out.surfaced.push((Phase::Cleanup, e));
    }
    checked(&mut out, allocator.as_ref(), &live, "after cleanup");
    device.set_phase(Phase::Drop);
    drop(allocator);
    out
}

/// True when `e` is what a fault of `kind` may surface as: an out-of-memory error for an
/// injected out-of-memory, otherwise an error whose text carries the fault's (`marker`).
fn names_the_fault(e: &Error, kind: Kind, marker: &str) -> bool {
    match kind {
        Kind::OutOfMemory => e.is_out_of_memory() || e.to_string().contains(marker),
        _ => e.to_string().contains(marker),
    }
}

/// The figures of one sweep.
#[derive(Debug, Default)]
struct Tally {
    calls_in_clean_run: u64,
    injected: u64,
    survived: u64,
    surfaced: u64,
    absorbed: u64,
    in_drop: u64,
    drop_leaks: u64,
    by_phase: BTreeMap<Phase, u64>,
}

impl Tally {
    fn print(&self, what: &str) {
        println!(
            "fault injection [{what}]: {} calls in a clean run; {} faults injected \
             (× out-of-memory, not-supported, generic), {} survived: {} surfaced as typed \
             errors, {} absorbed (retry/fallback); by phase {:?}; {} injected during drop, {} \
             of them left one object behind",
            self.calls_in_clean_run,
            self.injected,
            self.survived,
            self.surfaced,
            self.absorbed,
            self.by_phase,
            self.in_drop,
            self.drop_leaks,
        );
    }
}

/// Asserts what every faulted run must satisfy; returns whether the fault surfaced.
fn judge(out: &Outcome, kind: Kind, marker: &str, what: &str) -> bool {
    assert!(out.broken.is_empty(), "{what}: {:#?}", out.broken);
    assert!(
        out.surfaced.len() <= 1,
        "{what}: a one-shot fault surfaced {} times: {:#?}",
        out.surfaced.len(),
        out.surfaced
    );
    if let Some((phase, e)) = out.surfaced.first() {
        assert!(
            names_the_fault(e, kind, marker),
            "{what}: the {phase} error does not name the fault ({marker}): {e}"
        );
        true
    } else {
        false
    }
}

// ---------------------------------------------------------------------------------------------
// Rust: every call of the allocator to the simulated host device
// ---------------------------------------------------------------------------------------------

fn host() -> Arc<HostDevice> {
    Arc::new(
        HostDevice::builder()
            .capacity(CAPACITY)
            .simulated(true)
            .build()
            .expect("a simulated host device"),
    )
}

fn workload() -> Vec<Step> {
    let mut steps = transformer_steps();
    steps.extend(synthetic_steps(120, 0x5eed));
    steps
}

fn host_streams(host: &HostDevice) -> [Stream; STREAMS] {
    [
        Stream::DEFAULT,
        host.create_stream().unwrap(),
        host.create_stream().unwrap(),
    ]
}

fn destroy_host_streams(host: &HostDevice, streams: &[Stream; STREAMS]) {
    for s in &streams[1..] {
        host.destroy_stream(*s).unwrap();
    }
}

/// What one host run left: the outcome, the fault (if injected), the calls counted by
/// method and in all, and the census once the allocator was dropped.
struct HostRun {
    out: Outcome,
    fired: Option<(u64, &'static str, Phase)>,
    per_call: BTreeMap<&'static str, u64>,
    calls: u64,
    census: HostCensus,
}

/// One host run with the fault at call `k` (0: none).
fn host_run(strategy: Strategy, steps: &[Step], k: u64, kind: Kind) -> HostRun {
    let host = host();
    let streams = host_streams(&host);
    let device = Arc::new(FaultDevice::new(Arc::clone(&host)));
    device.arm(k, kind);
    let out = run(&device, &streams, strategy, steps, 8, k == 0);
    device.set_armed(false);
    destroy_host_streams(&host, &streams);
    let plan = device.plan();
    HostRun {
        out,
        fired: plan.fired,
        per_call: plan.per_call.clone(),
        calls: plan.calls,
        census: host.census(),
    }
}

fn host_sweep(strategy: Strategy) {
    let steps = workload();
    let HostRun {
        out: clean,
        fired,
        per_call,
        calls,
        census,
    } = host_run(strategy, &steps, 0, Kind::Generic);
    assert!(fired.is_none());
    assert!(clean.broken.is_empty(), "{:#?}", clean.broken);
    assert!(
        clean.surfaced.is_empty(),
        "{}: the clean run failed: {:?}",
        strategy.name(),
        clean.surfaced
    );
    assert!(
        census.is_empty(),
        "{}: clean run leaked {census:?}",
        strategy.name()
    );
    assert!(calls > 0);
    let mut tally = Tally {
        calls_in_clean_run: calls,
        ..Tally::default()
    };
    for k in 1..=calls {
        for kind in KINDS {
            let HostRun {
                out, fired, census, ..
            } = host_run(strategy, &steps, k, kind);
            let what = format!("{} fault {kind:?} at call {k}", strategy.name());
            let (_, call, phase) =
                fired.unwrap_or_else(|| panic!("{what}: the fault was never injected"));
            tally.injected += 1;
            *tally.by_phase.entry(phase).or_insert(0) += 1;
            let what = format!("{what} ({call}, {phase})");
            let marker = format!("injected fault at call {k}");
            let surfaced = judge(&out, kind, &marker, &what);
            if phase == Phase::Drop {
                tally.in_drop += 1;
                let left = census.allocations
                    + census.physical_handles
                    + census.mappings
                    + census.reservations
                    + census.events;
                assert!(
                    left <= 1,
                    "{what}: a refused release in drop left more than that one object: {census:?}"
                );
                tally.drop_leaks += left;
            } else {
                assert!(
                    census.is_empty(),
                    "{what}: the device still holds {census:?}"
                );
            }
            tally.survived += 1;
            if surfaced {
                tally.surfaced += 1;
            } else {
                tally.absorbed += 1;
            }
        }
    }
    assert_eq!(tally.injected, calls * KINDS.len() as u64);
    tally.print(&format!(
        "host, {}, {} steps, calls {per_call:?}",
        strategy.name(),
        steps.len()
    ));
}

#[test]
fn host_bfc_survives_a_fault_on_every_call() {
    host_sweep(Strategy::Bfc);
}

#[test]
fn host_bfc_grow_survives_a_fault_on_every_call() {
    host_sweep(Strategy::BfcGrow);
}

#[test]
fn host_platform_survives_a_fault_on_every_call() {
    host_sweep(Strategy::Platform);
}

#[test]
fn host_vmm_survives_a_fault_on_every_call() {
    host_sweep(Strategy::Vmm);
}

#[test]
fn host_async_survives_a_fault_on_every_call() {
    host_sweep(Strategy::Async);
}

/// A fault that persists (the device refuses every call from the k-th on, as a driver that
/// has lost its device would) is also survived: every error is typed, nothing panics, the
/// books stay consistent.
#[test]
fn host_persistent_failure_is_survived_by_every_strategy() {
    let steps = workload();
    for strategy in [
        Strategy::Bfc,
        Strategy::BfcGrow,
        Strategy::Platform,
        Strategy::Vmm,
        Strategy::Async,
    ] {
        for k in [1u64, 2, 3, 5, 8, 13, 21] {
            let host = host();
            let streams = host_streams(&host);
            let inner = Arc::new(FaultDevice::new(Arc::clone(&host)));
            let device = Arc::new(Persistent { inner, from: k });
            let out = run_persistent(&device, &streams, strategy, &steps);
            assert!(
                out.broken.is_empty(),
                "{}: {:#?}",
                strategy.name(),
                out.broken
            );
            drop(device);
            destroy_host_streams(&host, &streams);
            assert!(
                host.census().is_empty(),
                "{} failing from call {k}: the device still holds {:?}",
                strategy.name(),
                host.census()
            );
            for (phase, e) in &out.surfaced {
                assert!(
                    e.to_string().contains("persistent fault") || e.is_out_of_memory(),
                    "{} from call {k}: {phase} error does not name the fault: {e}",
                    strategy.name()
                );
            }
        }
    }
}

/// Fails every call from the `from`-th on (counted by the inner [`FaultDevice`]).
#[derive(Debug)]
struct Persistent {
    inner: Arc<FaultDevice<HostDevice>>,
    from: u64,
}

impl Persistent {
    fn gate(&self, call: &'static str) -> Result<()> {
        let mut p = self.inner.plan();
        if !p.armed {
            return Ok(());
        }
        p.calls += 1;
        if p.calls >= self.from {
            return Err(Error::Driver {
                backend: "host",
                call,
                code: 999,
                name: "INJECTED_FAULT".into(),
                message: "persistent fault".into(),
            });
        }
        Ok(())
    }
}

impl DeviceWrapper for Persistent {
    type Inner = HostDevice;
    /// The host beneath the [`FaultDevice`]: its plan counts here, its gate is not passed.
    fn wrapped(&self) -> &HostDevice {
        &self.inner.inner
    }
    fn before(&self, call: &Call<'_>) -> Result<()> {
        self.gate(call.name())
    }
}

/// [`run`] over a [`Persistent`] device: every error must be typed, the books consistent.
fn run_persistent(
    device: &Arc<Persistent>,
    streams: &[Stream; STREAMS],
    strategy: Strategy,
    steps: &[Step],
) -> Outcome {
    let mut out = Outcome::default();
    device.inner.set_armed(true);
    let allocator = match strategy.build(Arc::clone(device) as Arc<dyn Device>) {
        Ok(a) => a,
        Err(e) => {
            out.surfaced.push((Phase::Construct, e));
            return out;
        }
    };
    let mut live: HashMap<u64, (Allocation, u64)> = HashMap::new();
    for step in steps {
        match *step {
            Step::Alloc {
                id,
                size,
                align,
                stream,
            } => match allocator.allocate(size, align, streams[stream], "fault") {
                Ok(a) => {
                    live.insert(id, (a, align));
                }
                Err(e) => out.surfaced.push((Phase::Workload, e)),
            },
            Step::Free { id } => {
                if let Some((a, _)) = live.remove(&id) {
                    if let Err(e) = allocator.deallocate(a) {
                        out.surfaced.push((Phase::Workload, e));
                    }
                }
            }
            Step::Trim => {
                if let Err(e) = allocator.trim() {
                    out.surfaced.push((Phase::Workload, e));
                }
            }
        }
    }
    device.inner.set_armed(false);
    out.broken.extend(check(allocator.as_ref(), &live, "end"));
    for (_, (a, _)) in live.drain() {
        if let Err(e) = allocator.deallocate(a) {
            out.surfaced.push((Phase::Cleanup, e));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The conformance drivers
// ---------------------------------------------------------------------------------------------

/// A private copy of a conformance driver (its own library instance) and a symbol lookup.
#[cfg(any(feature = "cuda", feature = "hip"))]
struct Driver {
    library: libloading::Library,
    path: std::path::PathBuf,
}

#[cfg(any(feature = "cuda", feature = "hip"))]
impl Driver {
    fn copy(built: Option<&str>, what: &str) -> Option<Driver> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COPIES: AtomicU64 = AtomicU64::new(0);
        let Some(built) = built else {
            support::skip(&format!(
                "the {what} conformance driver was not built (no C compiler)"
            ));
            return None;
        };
        let n = COPIES.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "portalloc-fault-{}-{n}-lib{what}.so",
            std::process::id()
        ));
        std::fs::copy(built, &path).expect("copy the conformance driver");
        // SAFETY: our own test library; its initialisers do nothing.
        let library = unsafe { libloading::Library::new(&path) }.expect("load the driver");
        Some(Driver { library, path })
    }

    fn path(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: each caller names a control function with the signature it asks for.
        *unsafe { self.library.get::<T>(name.as_bytes()) }.expect(name)
    }

    fn with_name<R>(&self, name: &str, f: impl FnOnce(*const std::ffi::c_char) -> R) -> R {
        let name = std::ffi::CString::new(name).expect("no NUL in a symbol name");
        f(name.as_ptr())
    }
}

#[cfg(any(feature = "cuda", feature = "hip"))]
impl Drop for Driver {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The driver sweeps use a shorter workload: each run opens a device through the shim.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn driver_workload() -> Vec<Step> {
    let mut steps = transformer_steps();
    steps.truncate(120);
    // Free whatever the truncated prefix left live.
    let mut live: Vec<u64> = Vec::new();
    for s in &steps {
        match *s {
            Step::Alloc { id, .. } => live.push(id),
            Step::Free { id } => live.retain(|&l| l != id),
            Step::Trim => {}
        }
    }
    steps.extend(live.into_iter().map(|id| Step::Free { id }));
    steps.extend(synthetic_steps(48, 0xfa17));
    steps
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::ffi::{c_char, c_int};

    use portalloc::backends::cuda::{CudaDevice, Driver as CudaDriver};

    use super::*;

    /// The driver symbol behind each `Device` call the CUDA shim makes (one each).
    const SYMBOLS: &[(&str, &str)] = &[
        ("alloc", "cuMemAlloc_v2"),
        ("free", "cuMemFree_v2"),
        ("mem_info", "cuMemGetInfo_v2"),
        ("synchronize_stream", "cuStreamSynchronize"),
        ("create_event", "cuEventCreate"),
        ("record_event", "cuEventRecord"),
        ("event_complete", "cuEventQuery"),
        ("synchronize_event", "cuEventSynchronize"),
        ("destroy_event", "cuEventDestroy_v2"),
        ("reserve", "cuMemAddressReserve"),
        ("free_reservation", "cuMemAddressFree"),
        ("create_physical", "cuMemCreate"),
        ("release_physical", "cuMemRelease"),
        ("map", "cuMemMap"),
        ("set_access", "cuMemSetAccess"),
        ("unmap", "cuMemUnmap"),
        ("alloc_async", "cuMemAllocFromPoolAsync"),
        ("free_async", "cuMemFreeAsync"),
        ("set_release_threshold", "cuMemPoolSetAttribute"),
        ("trim_to", "cuMemPoolTrimTo"),
    ];

    const ERROR_NAMES: [&str; 3] = [
        "CUDA_ERROR_OUT_OF_MEMORY",
        "CUDA_ERROR_NOT_SUPPORTED",
        "CUDA_ERROR_UNKNOWN",
    ];

    struct Fake(super::Driver);

    impl Fake {
        fn new() -> Option<Fake> {
            let d = super::Driver::copy(support::driver("fakecuda"), "fakecuda")?;
            let configure: unsafe extern "C" fn(c_int, u64, u64, c_int) -> c_int =
                d.sym("fakecuda_configure");
            // SAFETY: plain values; before cuInit.
            assert_eq!(unsafe { configure(1, CAPACITY, 0, 0) }, 0);
            Some(Fake(d))
        }

        fn device(&self) -> CudaDevice {
            let driver = Arc::new(CudaDriver::load(&[self.0.path()]).expect("fakecuda loads"));
            CudaDevice::open(driver, 0).expect("open the fake device")
        }

        fn fail(&self, symbol: &str, nth: i32, code: i32) {
            let f: unsafe extern "C" fn(*const c_char, c_int, c_int) =
                self.0.sym("fakecuda_fail_call");
            // SAFETY: a NUL-terminated name the driver copies.
            self.0.with_name(symbol, |n| unsafe { f(n, nth, code) });
        }

        fn clear(&self) {
            let f: unsafe extern "C" fn() = self.0.sym("fakecuda_clear_failures");
            // SAFETY: no arguments.
            unsafe { f() }
        }

        fn live(&self, what: &str) -> i64 {
            let f: unsafe extern "C" fn(*const c_char) -> i64 = self.0.sym("fakecuda_live");
            // SAFETY: a NUL-terminated name, read only.
            let n = self.0.with_name(what, |p| unsafe { f(p) });
            assert!(n >= 0, "fakecuda_live does not know {what}");
            n
        }

        /// Memory the driver holds for portalloc: `(what, count)` of the non-zero ones.
        fn held(&self) -> Vec<(&'static str, i64)> {
            [
                "allocations",
                "handles",
                "mappings",
                "reservations",
                "pool_blocks",
                "pool_reserved",
                "streams",
                "bytes",
            ]
            .into_iter()
            .map(|w| (w, self.live(w)))
            .filter(|&(_, n)| n != 0)
            .collect()
        }
    }

    fn sweep(strategy: Strategy) {
        let Some(fake) = Fake::new() else { return };
        let steps = driver_workload();
        let run_once = |arm: Option<(&str, i32, i32)>| {
            let device = Arc::new(FaultDevice::new(Arc::new(fake.device())));
            let streams = [
                Stream::DEFAULT,
                device.inner.create_stream().unwrap(),
                device.inner.create_stream().unwrap(),
            ];
            if let Some((symbol, nth, code)) = arm {
                fake.fail(symbol, nth, code);
            }
            device.arm(0, Kind::Generic);
            let out = run(&device, &streams, strategy, &steps, 16, arm.is_none());
            device.set_armed(false);
            fake.clear();
            for s in &streams[1..] {
                device.inner.destroy_stream(*s).unwrap();
            }
            let census = device.inner.census();
            let held = fake.held();
            let plan = device.plan();
            let result = (
                out,
                plan.per_call.clone(),
                plan.inner_errors.clone(),
                census,
                held,
            );
            drop(plan);
            drop(device);
            result
        };
        let (clean, per_call, errors, census, held) = run_once(None);
        assert!(clean.broken.is_empty(), "{:#?}", clean.broken);
        assert!(
            clean.surfaced.is_empty(),
            "clean run failed: {:?}",
            clean.surfaced
        );
        assert!(errors.is_empty(), "clean run: driver errors {errors:?}");
        assert!(census.is_empty() && held.is_empty(), "{census:?} {held:?}");
        let mut tally = Tally {
            calls_in_clean_run: per_call.values().sum(),
            ..Tally::default()
        };
        for &(call, symbol) in SYMBOLS {
            let n = per_call.get(call).copied().unwrap_or(0);
            for nth in 1..=n {
                for (kind, name) in KINDS.into_iter().zip(ERROR_NAMES) {
                    let code = kind.driver_code();
                    let what =
                        format!("cuda {}: {symbol} call {nth} fails {name}", strategy.name());
                    let (out, _, errors, census, held) = run_once(Some((symbol, nth as i32, code)));
                    let hit = errors
                        .iter()
                        .find(|(c, _, m)| *c == call && (m.contains(name) || code == 2))
                        .unwrap_or_else(|| {
                            panic!("{what}: the fault was never injected: {errors:?}")
                        });
                    let phase = hit.1;
                    tally.injected += 1;
                    *tally.by_phase.entry(phase).or_insert(0) += 1;
                    let surfaced = judge(&out, kind, name, &format!("{what} ({phase})"));
                    if phase == Phase::Drop {
                        tally.in_drop += 1;
                        let left: i64 = held
                            .iter()
                            .filter(|(w, _)| *w != "bytes" && *w != "pool_reserved")
                            .map(|(_, n)| n)
                            .sum();
                        assert!(left <= 1, "{what}: drop left {held:?}");
                        tally.drop_leaks += left as u64;
                    } else {
                        assert!(
                            census.is_empty() && held.is_empty(),
                            "{what} ({phase}): still held: shim {census:?}, driver {held:?}"
                        );
                    }
                    tally.survived += 1;
                    if surfaced {
                        tally.surfaced += 1;
                    } else {
                        tally.absorbed += 1;
                    }
                }
            }
        }
        assert!(tally.injected > 0);
        tally.print(&format!(
            "fakecuda, {}, {} steps, calls {per_call:?}",
            strategy.name(),
            steps.len()
        ));
        for what in ["contexts", "pools", "events"] {
            assert_eq!(fake.live(what), 0, "the driver still holds {what}");
        }
    }

    #[test]
    fn cuda_bfc_survives_every_driver_fault() {
        sweep(Strategy::Bfc);
    }

    #[test]
    fn cuda_bfc_grow_survives_every_driver_fault() {
        sweep(Strategy::BfcGrow);
    }

    #[test]
    fn cuda_platform_survives_every_driver_fault() {
        sweep(Strategy::Platform);
    }

    #[test]
    fn cuda_vmm_survives_every_driver_fault() {
        sweep(Strategy::Vmm);
    }

    #[test]
    fn cuda_async_survives_every_driver_fault() {
        sweep(Strategy::Async);
    }
}

#[cfg(feature = "hip")]
mod hip {
    use std::ffi::{c_char, c_int, c_long};

    use portalloc::backends::hip::{HipDevice, Runtime};

    use super::*;

    /// HIP 7.0 (ROCm 7): VMM and pools on.
    const ROCM7: c_int = 70_051_831;

    /// The runtime calls a strategy reaches.
    const SYMBOLS: &[&str] = &[
        "hipMalloc",
        "hipExtMallocWithFlags",
        "hipFree",
        "hipMemGetInfo",
        "hipStreamSynchronize",
        "hipEventCreateWithFlags",
        "hipEventRecord",
        "hipEventQuery",
        "hipEventSynchronize",
        "hipEventDestroy",
        "hipMemAddressReserve",
        "hipMemAddressFree",
        "hipMemCreate",
        "hipMemRelease",
        "hipMemMap",
        "hipMemSetAccess",
        "hipMemUnmap",
        "hipMallocFromPoolAsync",
        "hipFreeAsync",
        "hipMemPoolSetAttribute",
        "hipMemPoolTrimTo",
    ];

    struct Fake(super::Driver);

    impl Fake {
        fn new() -> Option<Fake> {
            let d = super::Driver::copy(support::driver("fakehip"), "fakehip")?;
            let reset: unsafe extern "C" fn() = d.sym("fakehip_reset");
            let version: unsafe extern "C" fn(c_int) = d.sym("fakehip_set_version");
            let devices: unsafe extern "C" fn(c_int, u64) = d.sym("fakehip_set_devices");
            // SAFETY: control functions with plain arguments.
            unsafe {
                reset();
                version(ROCM7);
                devices(1, CAPACITY);
            }
            Some(Fake(d))
        }

        fn device(&self) -> HipDevice {
            let runtime = Arc::new(Runtime::load(&[self.0.path()]).expect("fakehip loads"));
            HipDevice::open(runtime, 0).expect("open the fake device")
        }

        fn fail(&self, symbol: &str, nth: i64, code: i32) {
            let f: unsafe extern "C" fn(*const c_char, c_long, c_long, c_int) =
                self.0.sym("fakehip_fail");
            // SAFETY: a NUL-terminated name the runtime copies.
            self.0
                .with_name(symbol, |n| unsafe { f(n, nth as c_long, 1, code) });
        }

        fn clear(&self) {
            let f: unsafe extern "C" fn() = self.0.sym("fakehip_clear_faults");
            // SAFETY: no arguments.
            unsafe { f() }
        }

        fn calls(&self, symbol: &str) -> i64 {
            let f: unsafe extern "C" fn(*const c_char) -> i64 = self.0.sym("fakehip_calls");
            // SAFETY: a NUL-terminated name, read only.
            self.0.with_name(symbol, |n| unsafe { f(n) })
        }

        fn count(&self, what: &str) -> i64 {
            let f: unsafe extern "C" fn(*const c_char) -> i64 = self.0.sym("fakehip_count");
            // SAFETY: a NUL-terminated name, read only.
            let n = self.0.with_name(what, |p| unsafe { f(p) });
            assert!(n >= 0, "fakehip_count does not know {what}");
            n
        }

        fn held(&self) -> Vec<(&'static str, i64)> {
            [
                "allocations",
                "pool_allocations",
                "reservations",
                "handles",
                "mappings",
                "streams",
                "pool_reserved",
                "bytes",
            ]
            .into_iter()
            .map(|w| (w, self.count(w)))
            .filter(|&(_, n)| n != 0)
            .collect()
        }

        fn all_calls(&self) -> Vec<i64> {
            SYMBOLS.iter().map(|s| self.calls(s)).collect()
        }
    }

    fn sweep(strategy: Strategy) {
        let Some(fake) = Fake::new() else { return };
        let steps = driver_workload();
        let probe = fake.device();
        let caps = probe.info().capabilities;
        drop(probe);
        if (strategy == Strategy::Vmm && !caps.virtual_memory)
            || (strategy == Strategy::Async && !caps.stream_ordered_pool)
        {
            eprintln!(
                "skipping {}: the fake HIP 7 device lacks it ({caps:?})",
                strategy.name()
            );
            return;
        }
        // `(calls per symbol made by the run, outcome, phase of the first driver error, held)`
        let run_once = |arm: Option<(&str, i64, i32)>| {
            let device = Arc::new(FaultDevice::new(Arc::new(fake.device())));
            let streams = [
                Stream::DEFAULT,
                device.inner.create_stream().unwrap(),
                device.inner.create_stream().unwrap(),
            ];
            let before = fake.all_calls();
            if let Some((symbol, nth, code)) = arm {
                fake.fail(symbol, nth, code);
            }
            device.arm(0, Kind::Generic);
            let out = run(&device, &streams, strategy, &steps, 16, arm.is_none());
            device.set_armed(false);
            fake.clear();
            let made: Vec<i64> = fake
                .all_calls()
                .iter()
                .zip(&before)
                .map(|(a, b)| a - b)
                .collect();
            for s in &streams[1..] {
                device.inner.destroy_stream(*s).unwrap();
            }
            let census = device.inner.census();
            let held = fake.held();
            let phase = device.plan().inner_errors.first().map(|e| e.1);
            drop(device);
            (made, out, phase, census, held)
        };
        let (made, clean, phase, census, held) = run_once(None);
        assert!(clean.broken.is_empty(), "{:#?}", clean.broken);
        assert!(
            clean.surfaced.is_empty(),
            "clean run failed: {:?}",
            clean.surfaced
        );
        assert!(phase.is_none(), "clean run: a runtime error");
        assert!(census.is_empty() && held.is_empty(), "{census:?} {held:?}");
        let mut tally = Tally {
            calls_in_clean_run: made.iter().sum::<i64>() as u64,
            ..Tally::default()
        };
        let names = [
            "hipErrorOutOfMemory",
            "hipErrorNotSupported",
            "hipErrorUnknown",
        ];
        for (symbol, &n) in SYMBOLS.iter().zip(&made) {
            for nth in 1..=n {
                for (kind, name) in KINDS.into_iter().zip(names) {
                    let what = format!("hip {}: {symbol} call {nth} fails {name}", strategy.name());
                    let (again, out, phase, census, held) =
                        run_once(Some((symbol, nth, kind.driver_code())));
                    let i = SYMBOLS.iter().position(|s| s == symbol).unwrap_or(0);
                    assert!(again[i] >= nth, "{what}: the fault was never injected");
                    // A fault the shim swallows (none today) would have no phase: count it as
                    // absorbed during the workload.
                    let phase = phase.unwrap_or(Phase::Workload);
                    tally.injected += 1;
                    *tally.by_phase.entry(phase).or_insert(0) += 1;
                    let surfaced = judge(&out, kind, name, &format!("{what} ({phase})"));
                    if phase == Phase::Drop {
                        tally.in_drop += 1;
                        let left: i64 = held
                            .iter()
                            .filter(|(w, _)| *w != "bytes" && *w != "pool_reserved")
                            .map(|(_, n)| n)
                            .sum();
                        assert!(left <= 1, "{what}: drop left {held:?}");
                        tally.drop_leaks += left as u64;
                    } else {
                        assert!(
                            census.is_empty() && held.is_empty(),
                            "{what} ({phase}): still held: shim {census:?}, runtime {held:?}"
                        );
                    }
                    tally.survived += 1;
                    if surfaced {
                        tally.surfaced += 1;
                    } else {
                        tally.absorbed += 1;
                    }
                }
            }
        }
        assert!(tally.injected > 0);
        let per_symbol: Vec<(&str, i64)> = SYMBOLS
            .iter()
            .copied()
            .zip(made.iter().copied())
            .filter(|&(_, n)| n > 0)
            .collect();
        tally.print(&format!(
            "fakehip, {}, {} steps, calls {per_symbol:?}",
            strategy.name(),
            steps.len()
        ));
        for what in ["events", "pools"] {
            assert_eq!(fake.count(what), 0, "the runtime still holds {what}");
        }
    }

    #[test]
    fn hip_bfc_survives_every_runtime_fault() {
        sweep(Strategy::Bfc);
    }

    #[test]
    fn hip_bfc_grow_survives_every_runtime_fault() {
        sweep(Strategy::BfcGrow);
    }

    #[test]
    fn hip_platform_survives_every_runtime_fault() {
        sweep(Strategy::Platform);
    }

    #[test]
    fn hip_vmm_survives_every_runtime_fault() {
        sweep(Strategy::Vmm);
    }

    #[test]
    fn hip_async_survives_every_runtime_fault() {
        sweep(Strategy::Async);
    }
}
