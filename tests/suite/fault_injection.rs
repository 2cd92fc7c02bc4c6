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
//! * **The CUDA and HIP conformance drivers** (`fakes/drivers/fakecuda.c`, `fakehip.c`,
//!   through the real shims; one sweep generic over the vendor, faults injected with
//!   `fake_fail`): for every memory, pool, stream and event call the allocator reaches, its
//!   n-th call fails, for every n a clean run makes (the driver's own call counts).
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
#![cfg(feature = "replay")]

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::support::common::{first_overlap, simulated_host, Rng, Strategy};
#[cfg(any(feature = "cuda", feature = "hip"))]
use crate::support::fakes::{Fake, FakeDevice};
use portalloc::adaptor::{Call, DeviceWrapper};
use portalloc::backends::host::{HostCensus, HostDevice};
use portalloc::device::{Device, Stream};
use portalloc::replay::workload::TransformerTrain;
use portalloc::trace::Op;
#[cfg(any(feature = "cuda", feature = "hip"))]
use portalloc::Vendor;
use portalloc::{Allocation, Allocator, Error, Result};
use test_case::test_case;

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

/// `n` steps: allocations of 1 B to 24 MiB (log-uniform) on three streams, frees of random
/// live ones, a trim now and then; everything freed at the end. Seeded, so every run makes
/// the same calls.
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
    if let Some((first, second)) = first_overlap(live.values().map(|(a, _)| a)) {
        broken.push(format!(
            "{at}: live ranges overlap: {first:x?} and {second:x?}"
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

/// Builds `strategy` over `device`; a refusal is recorded in `out` as a construction error.
fn construct(
    strategy: Strategy,
    device: Arc<dyn Device>,
    out: &mut Outcome,
) -> Option<Box<dyn Allocator>> {
    strategy
        .try_build(device, LIMIT)
        .map_err(|e| out.surfaced.push((Phase::Construct, e)))
        .ok()
}

/// Performs `step` on `allocator`, keeping `live` (id → allocation and the alignment asked
/// for) up to date; the error the allocator returned, if any.
fn apply(
    allocator: &dyn Allocator,
    step: Step,
    streams: &[Stream; STREAMS],
    live: &mut HashMap<u64, (Allocation, u64)>,
) -> Result<()> {
    match step {
        Step::Alloc {
            id,
            size,
            align,
            stream,
        } => {
            let a = allocator.allocate(size, align, streams[stream], "fault")?;
            live.insert(id, (a, align));
        }
        Step::Free { id } => {
            if let Some((a, _)) = live.remove(&id) {
                allocator.deallocate(a)?;
            }
        }
        Step::Trim => {
            allocator.trim()?;
        }
    }
    Ok(())
}

/// Frees everything in `live`; each refusal is recorded in `out` as a cleanup error.
fn free_all(
    allocator: &dyn Allocator,
    live: &mut HashMap<u64, (Allocation, u64)>,
    out: &mut Outcome,
) {
    for (_, (a, _)) in live.drain() {
        if let Err(e) = allocator.deallocate(a) {
            out.surfaced.push((Phase::Cleanup, e));
        }
    }
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
    let Some(allocator) = construct(strategy, Arc::clone(device) as Arc<dyn Device>, &mut out)
    else {
        return out;
    };
    device.set_phase(Phase::Workload);
    let mut live: HashMap<u64, (Allocation, u64)> = HashMap::new();
    let checked = |out: &mut Outcome, allocator: &dyn Allocator, live: &_, at: &str| {
        device.set_armed(false);
        out.broken.extend(check(allocator, live, at));
        device.set_armed(true);
    };
    let mut fault_step: Option<usize> = None;
    for (i, &step) in steps.iter().enumerate() {
        let failed = match apply(allocator.as_ref(), step, streams, &mut live) {
            Ok(()) => false,
            Err(e) => {
                out.surfaced.push((Phase::Workload, e));
                true
            }
        };
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
    free_all(allocator.as_ref(), &mut live, &mut out);
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
    /// Counts one injected fault that was survived: where it fired, whether it `surfaced`,
    /// and how many objects a fault in drop left behind (`drop_leaks`, 0 elsewhere).
    fn count(&mut self, phase: Phase, surfaced: bool, drop_leaks: u64) {
        self.injected += 1;
        *self.by_phase.entry(phase).or_insert(0) += 1;
        if phase == Phase::Drop {
            self.in_drop += 1;
            self.drop_leaks += drop_leaks;
        }
        self.survived += 1;
        if surfaced {
            self.surfaced += 1;
        } else {
            self.absorbed += 1;
        }
    }

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
        // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
        unsafe { host.destroy_stream(*s) }.unwrap();
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
    let host = simulated_host(CAPACITY);
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

/// One run of [`host_sweep`]: the `k`-th call fails with `kind`; checks what the sweep
/// requires of it, and returns where the fault fired, whether it surfaced, and how many
/// objects a fault in drop left behind.
fn host_fault_run(strategy: Strategy, steps: &[Step], k: u64, kind: Kind) -> (Phase, bool, u64) {
    let HostRun {
        out, fired, census, ..
    } = host_run(strategy, steps, k, kind);
    let what = format!("{} fault {kind:?} at call {k}", strategy.name());
    let (_, call, phase) = fired.unwrap_or_else(|| panic!("{what}: the fault was never injected"));
    let what = format!("{what} ({call}, {phase})");
    let marker = format!("injected fault at call {k}");
    let surfaced = judge(&out, kind, &marker, &what);
    let left = if phase == Phase::Drop {
        let left = census.allocations
            + census.physical_handles
            + census.mappings
            + census.reservations
            + census.events;
        assert!(
            left <= 1,
            "{what}: a refused release in drop left more than that one object: {census:?}"
        );
        left
    } else {
        assert!(
            census.is_empty(),
            "{what}: the device still holds {census:?}"
        );
        0
    };
    (phase, surfaced, left)
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
    // Every (call, kind) run is independent (a host of its own): they are shared out among
    // the machine's cores, as this sweep is the suite's longest test (vmm's, in a debug
    // build) and would otherwise run on one core while the others sit idle.
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4) as u64;
    let runs: Vec<(Phase, bool, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let steps = &steps;
                scope.spawn(move || {
                    let mut runs = Vec::new();
                    for k in (1..=calls).filter(|k| k % workers == worker) {
                        for kind in KINDS {
                            runs.push(host_fault_run(strategy, steps, k, kind));
                        }
                    }
                    runs
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for (phase, surfaced, left) in runs {
        tally.count(phase, surfaced, left);
    }
    assert_eq!(tally.injected, calls * KINDS.len() as u64);
    tally.print(&format!(
        "host, {}, {} steps, calls {per_call:?}",
        strategy.name(),
        steps.len()
    ));
}

/// Every strategy over the simulated host: `bfc`, …, `async`.
#[test_case(Strategy::Bfc ; "bfc")]
#[test_case(Strategy::BfcGrow ; "bfc_grow")]
#[test_case(Strategy::Platform ; "platform")]
#[test_case(Strategy::Vmm ; "vmm")]
#[test_case(Strategy::Async ; "async")]
fn host_survives_a_fault_on_every_call(strategy: Strategy) {
    host_sweep(strategy);
}

/// A fault that persists (the device refuses every call from the k-th on, as a driver that
/// has lost its device would) is also survived: every error is typed, nothing panics, the
/// books stay consistent.
#[test]
fn host_persistent_failure_is_survived_by_every_strategy() {
    let steps = workload();
    for strategy in Strategy::ALL {
        for k in [1u64, 2, 3, 5, 8, 13, 21] {
            let host = simulated_host(CAPACITY);
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
    let Some(allocator) = construct(strategy, Arc::clone(device) as Arc<dyn Device>, &mut out)
    else {
        return out;
    };
    let mut live: HashMap<u64, (Allocation, u64)> = HashMap::new();
    for &step in steps {
        if let Err(e) = apply(allocator.as_ref(), step, streams, &mut live) {
            out.surfaced.push((Phase::Workload, e));
        }
    }
    device.inner.set_armed(false);
    out.broken.extend(check(allocator.as_ref(), &live, "end"));
    free_all(allocator.as_ref(), &mut live, &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// The conformance drivers
// ---------------------------------------------------------------------------------------------

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

/// The vendor calls a strategy reaches through the shim, each with the `Device` call it serves:
/// the fault injected into the vendor call must come back as that call's error.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn vendor_calls(vendor: Vendor) -> &'static [(&'static str, &'static str)] {
    match vendor {
        Vendor::Cuda => &[
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
        ],
        _ => &[
            ("alloc", "hipMalloc"),
            ("alloc", "hipExtMallocWithFlags"),
            ("free", "hipFree"),
            ("mem_info", "hipMemGetInfo"),
            ("synchronize_stream", "hipStreamSynchronize"),
            ("create_event", "hipEventCreateWithFlags"),
            ("record_event", "hipEventRecord"),
            ("event_complete", "hipEventQuery"),
            ("synchronize_event", "hipEventSynchronize"),
            ("destroy_event", "hipEventDestroy"),
            ("reserve", "hipMemAddressReserve"),
            ("free_reservation", "hipMemAddressFree"),
            ("create_physical", "hipMemCreate"),
            ("release_physical", "hipMemRelease"),
            ("map", "hipMemMap"),
            ("set_access", "hipMemSetAccess"),
            ("unmap", "hipMemUnmap"),
            ("alloc_async", "hipMallocFromPoolAsync"),
            ("free_async", "hipFreeAsync"),
            ("set_release_threshold", "hipMemPoolSetAttribute"),
            ("trim_to", "hipMemPoolTrimTo"),
        ],
    }
}

/// What one run over a conformance driver left: the outcome, the vendor calls it made (per
/// entry of [`vendor_calls`]), the errors of the shim beneath the [`FaultDevice`], the shim's
/// census and what the driver still holds.
#[cfg(any(feature = "cuda", feature = "hip"))]
struct DriverRun {
    out: Outcome,
    made: Vec<i64>,
    errors: Vec<(&'static str, Phase, String)>,
    census: portalloc::backends::VendorCensus,
    held: Vec<(&'static str, i64)>,
}

/// One run of the workload over a fresh device of the fake, with `arm`
/// `(vendor call, nth, code)` injected for its duration.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn driver_run<D: FakeDevice>(
    fake: &Fake,
    strategy: Strategy,
    steps: &[Step],
    arm: Option<(&str, i64, i32)>,
) -> DriverRun {
    let calls = vendor_calls(D::VENDOR);
    let device = Arc::new(FaultDevice::new(Arc::new(D::open(fake, 0))));
    let streams = [
        Stream::DEFAULT,
        device.inner.create_stream().unwrap(),
        device.inner.create_stream().unwrap(),
    ];
    let before: Vec<i64> = calls.iter().map(|(_, s)| fake.calls(s)).collect();
    if let Some((symbol, nth, code)) = arm {
        fake.fail(symbol, nth, 1, code);
    }
    device.arm(0, Kind::Generic);
    let out = run(&device, &streams, strategy, steps, 16, arm.is_none());
    device.set_armed(false);
    fake.clear_faults();
    let made = calls
        .iter()
        .zip(&before)
        .map(|((_, s), b)| fake.calls(s) - b)
        .collect();
    for s in &streams[1..] {
        // SAFETY: a stream of this test, idle and not used again, or one the device refuses before any driver call.
        unsafe { device.inner.destroy_stream(*s) }.unwrap();
    }
    let census = device.inner.vendor_census();
    let mut counted = crate::support::fakes::MEMORY.to_vec();
    counted.push("streams");
    let held = fake.nonzero(&counted);
    let errors = device.plan().inner_errors.clone();
    drop(device);
    DriverRun {
        out,
        made,
        errors,
        census,
        held,
    }
}

/// For every vendor call the clean run made, its n-th call fails (for every n it made) with
/// each of [`KINDS`]: the error is typed and names the fault, nothing leaks (a fault in drop
/// may leave the one object whose release was refused), the books hold.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn driver_sweep<D: FakeDevice>(strategy: Strategy) {
    let fake = Fake::with_devices(D::VENDOR, 1, CAPACITY);
    let vendor = format!("{:?}", D::VENDOR).to_lowercase();
    let steps = driver_workload();
    let caps = D::open(&fake, 0).info().capabilities;
    assert!(
        caps.virtual_memory && caps.stream_ordered_pool,
        "the {vendor} fake serves every strategy: {caps:?}"
    );
    let clean = driver_run::<D>(&fake, strategy, &steps, None);
    assert!(clean.out.broken.is_empty(), "{:#?}", clean.out.broken);
    assert!(
        clean.out.surfaced.is_empty(),
        "clean run failed: {:?}",
        clean.out.surfaced
    );
    assert!(
        clean.errors.is_empty(),
        "clean run: driver errors {:?}",
        clean.errors
    );
    assert!(
        clean.census.is_empty() && clean.held.is_empty(),
        "{:?} {:?}",
        clean.census,
        clean.held
    );
    let mut tally = Tally {
        calls_in_clean_run: clean.made.iter().sum::<i64>() as u64,
        ..Tally::default()
    };
    let calls = vendor_calls(D::VENDOR);
    for (&(call, symbol), &n) in calls.iter().zip(&clean.made) {
        for nth in 1..=n {
            for kind in KINDS {
                let code = kind.driver_code();
                let name = D::error_name(code);
                let what = format!(
                    "{vendor} {}: {symbol} call {nth} fails {name}",
                    strategy.name()
                );
                let r = driver_run::<D>(&fake, strategy, &steps, Some((symbol, nth, code)));
                let i = calls.iter().position(|&(_, s)| s == symbol).unwrap_or(0);
                assert!(r.made[i] >= nth, "{what}: the call was not made again");
                let phase = r
                    .errors
                    .iter()
                    .find(|(c, _, m)| *c == call && (m.contains(name) || kind == Kind::OutOfMemory))
                    .unwrap_or_else(|| panic!("{what}: the fault never came back: {:?}", r.errors))
                    .1;
                let surfaced = judge(&r.out, kind, name, &format!("{what} ({phase})"));
                let left = if phase == Phase::Drop {
                    let left: i64 = r
                        .held
                        .iter()
                        .filter(|(w, _)| *w != "bytes" && *w != "pool_reserved")
                        .map(|(_, n)| n)
                        .sum();
                    assert!(left <= 1, "{what}: drop left {:?}", r.held);
                    left as u64
                } else {
                    assert!(
                        r.census.is_empty() && r.held.is_empty(),
                        "{what} ({phase}): still held: shim {:?}, driver {:?}",
                        r.census,
                        r.held
                    );
                    0
                };
                tally.count(phase, surfaced, left);
            }
        }
    }
    assert!(tally.injected > 0);
    let per_symbol: Vec<(&str, i64)> = calls
        .iter()
        .map(|&(_, s)| s)
        .zip(clean.made.iter().copied())
        .filter(|&(_, n)| n > 0)
        .collect();
    tally.print(&format!(
        "fake {vendor}, {}, {} steps, calls {per_symbol:?}",
        strategy.name(),
        steps.len()
    ));
    let mut end = vec!["pools", "events"];
    if D::VENDOR == Vendor::Cuda {
        end.push("contexts");
    }
    let left = fake.nonzero(&end);
    assert!(left.is_empty(), "the {vendor} fake still holds {left:?}");
}

/// Every strategy over each vendor's fake: `cuda_bfc`, …, `hip_async`.
#[cfg_attr(feature = "cuda", test_case(Vendor::Cuda, Strategy::Bfc ; "cuda_bfc"))]
#[cfg_attr(feature = "cuda", test_case(Vendor::Cuda, Strategy::BfcGrow ; "cuda_bfc_grow"))]
#[cfg_attr(feature = "cuda", test_case(Vendor::Cuda, Strategy::Platform ; "cuda_platform"))]
#[cfg_attr(feature = "cuda", test_case(Vendor::Cuda, Strategy::Vmm ; "cuda_vmm"))]
#[cfg_attr(feature = "cuda", test_case(Vendor::Cuda, Strategy::Async ; "cuda_async"))]
#[cfg_attr(feature = "hip", test_case(Vendor::Hip, Strategy::Bfc ; "hip_bfc"))]
#[cfg_attr(feature = "hip", test_case(Vendor::Hip, Strategy::BfcGrow ; "hip_bfc_grow"))]
#[cfg_attr(feature = "hip", test_case(Vendor::Hip, Strategy::Platform ; "hip_platform"))]
#[cfg_attr(feature = "hip", test_case(Vendor::Hip, Strategy::Vmm ; "hip_vmm"))]
#[cfg_attr(feature = "hip", test_case(Vendor::Hip, Strategy::Async ; "hip_async"))]
#[cfg(any(feature = "cuda", feature = "hip"))]
fn survives_every_driver_fault(vendor: Vendor, strategy: Strategy) {
    match vendor {
        #[cfg(feature = "cuda")]
        Vendor::Cuda => driver_sweep::<portalloc::backends::cuda::CudaDevice>(strategy),
        #[cfg(feature = "hip")]
        Vendor::Hip => driver_sweep::<portalloc::backends::hip::HipDevice>(strategy),
        other => unreachable!("{other:?} has no conformance fake"),
    }
}
