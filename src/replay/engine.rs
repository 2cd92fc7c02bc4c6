//! The replay engine: one trace, one strategy, one simulated device → figures.
#![deny(unsafe_code)]

use std::sync::Arc;
use std::time::Instant;

use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

use crate::adaptor::{CallTally, CountingDevice};
use crate::allocator::{Allocation, Allocator};
use crate::backends::host::HostDevice;
use crate::config::{Config, Setting, StrategyKind};
use crate::device::Stream;
use crate::error::{Error, Result};
use crate::trace::{Event, Op, Trace, TraceError, TraceErrorKind, TraceHeader};

use super::preset::DeviceSpec;

/// A strategy as replay names it: `bfc` preallocates, `bfc-grow` grows, as
/// `XLA_PYTHON_CLIENT_PREALLOCATE=false` would make it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplayStrategy {
    /// BFC, preallocating `fraction × capacity` at the first allocation.
    Bfc,
    /// BFC, growing by doubling regions.
    BfcGrow,
    /// Virtual-memory strategy.
    Vmm,
    /// Stream-ordered pool.
    Async,
    /// Allocate and free on demand.
    Platform,
}

/// Every strategy name replay accepts, in its default order.
pub const STRATEGY_NAMES: &[&str] = &["bfc", "bfc-grow", "vmm", "async", "platform"];

impl ReplayStrategy {
    /// Parses `bfc`, `bfc-grow`, `vmm`, `async`, `platform`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the accepted list.
    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name.trim() {
            "bfc" => ReplayStrategy::Bfc,
            "bfc-grow" => ReplayStrategy::BfcGrow,
            "vmm" => ReplayStrategy::Vmm,
            "async" => ReplayStrategy::Async,
            "platform" => ReplayStrategy::Platform,
            other => {
                return Err(Error::config(
                    "--strategies",
                    other,
                    format!("a comma-separated list of {}", STRATEGY_NAMES.join(", ")),
                ))
            }
        })
    }

    /// The name replay prints.
    pub fn name(self) -> &'static str {
        match self {
            ReplayStrategy::Bfc => "bfc",
            ReplayStrategy::BfcGrow => "bfc-grow",
            ReplayStrategy::Vmm => "vmm",
            ReplayStrategy::Async => "async",
            ReplayStrategy::Platform => "platform",
        }
    }

    /// The configuration that builds this strategy with `fraction`.
    pub fn config(self, fraction: f64) -> Config {
        let (kind, preallocate) = match self {
            ReplayStrategy::Bfc => (StrategyKind::Bfc, true),
            ReplayStrategy::BfcGrow => (StrategyKind::Bfc, false),
            ReplayStrategy::Vmm => (StrategyKind::Vmm, false),
            ReplayStrategy::Async => (StrategyKind::Async, false),
            ReplayStrategy::Platform => (StrategyKind::Platform, false),
        };
        Config {
            strategy: Setting::builder(kind),
            mem_fraction: Setting::builder(fraction),
            preallocate: Setting::builder(preallocate),
            host_simulated: Setting::builder(true),
            ..Config::default()
        }
    }
}

/// Where the events come from: in memory (read once, replayed many times) or a file that
/// is streamed anew for each pass (for traces too large to hold).
pub enum TraceInput {
    /// Events in memory.
    Events {
        /// The header.
        header: TraceHeader,
        /// The events, shared between passes.
        events: Arc<Vec<Event>>,
    },
    /// A file, opened again for each pass.
    File {
        /// The header (read at the first opening).
        header: TraceHeader,
        /// Opens the file afresh.
        open: Box<dyn Fn() -> Result<Trace> + Send + Sync>,
    },
}

impl std::fmt::Debug for TraceInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceInput")
            .field("source", &self.header().source)
            .finish_non_exhaustive()
    }
}

impl TraceInput {
    /// The header.
    pub fn header(&self) -> &TraceHeader {
        match self {
            TraceInput::Events { header, .. } | TraceInput::File { header, .. } => header,
        }
    }

    /// Replaces the bytes live before the trace's window ([`TraceHeader::baseline_bytes`]),
    /// for a trace that cannot know them (a CPU profile).
    pub fn set_baseline(&mut self, bytes: u64) {
        match self {
            TraceInput::Events { header, .. } | TraceInput::File { header, .. } => {
                header.baseline_bytes = bytes;
            }
        }
    }

    /// One pass over the events.
    pub fn events(&self) -> Result<Box<dyn Iterator<Item = Result<Event>> + '_>> {
        match self {
            TraceInput::Events { events, .. } => Ok(Box::new(events.iter().copied().map(Ok))),
            TraceInput::File { open, .. } => Ok(Box::new(open()?.map(|e| e.map_err(Error::from)))),
        }
    }
}

/// Memory live before the trace's window, as replay models it before the first event.
///
/// What the trace tells one by one becomes allocations through the strategy at their own
/// sizes: one per free of an id the window never allocated (so that free releases exactly
/// it), and one per block the header knows ([`TraceHeader::pre_window_blocks`], a snapshot's
/// blocks live at dump time). The rest of [`TraceHeader::baseline_bytes`] is of unknown shape:
/// it is not put in the pool, where one block of its size is a pathology the program could not
/// have had (BFC's no-split rule hands a pool under twice its size whole to it), but held
/// outside it and counted against the device's capacity — the allocator is built on the
/// capacity less those bytes, rounded up to the granularity, and its memory fraction applies
/// to what is left, as for a process that finds that much of the device already taken when
/// its allocator starts. Peak live and peak reserved include it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Baseline {
    /// `(id, bytes)` of each allocation freed in the window but made before it.
    pub freed_in_window: Vec<(u64, u64)>,
    /// Bytes live before the window and never freed in it: `held_blocks` and
    /// `unknown_shape` together.
    pub held: u64,
    /// Of `held`, the sizes known one by one (from [`TraceHeader::pre_window_blocks`], in
    /// order, while they fit in `held`): each replayed as its own allocation, held to the end.
    pub held_blocks: Vec<u64>,
    /// Of `held`, the bytes of unknown shape: held outside the pool, counted against the
    /// device's capacity.
    pub unknown_shape: u64,
    /// Events in the trace (counted by the same pass).
    pub events: u64,
    /// The most ids of the window live at once (counted by the same pass): with
    /// `freed_in_window` and `held_blocks`, what replay's table of live allocations is
    /// sized for before its clock starts, so that it never grows while timed.
    pub peak_live_ids: u64,
}

impl Baseline {
    /// Scans the trace once (O(live) memory). A free of an id that is not live counts as
    /// memory from before the window while [`TraceHeader::baseline_bytes`] covers it.
    ///
    /// # Errors
    /// The trace's own errors (corrupt input, with the line or event number).
    pub fn scan(input: &TraceInput) -> Result<Baseline> {
        let mut live: FxHashSet<u64> = FxHashSet::default();
        let mut baseline = Baseline::default();
        let budget = input.header().baseline_bytes;
        let mut freed = 0u64;
        for event in input.events()? {
            let event = event?;
            baseline.events += 1;
            match event.op {
                Op::Alloc => {
                    live.insert(event.id);
                    baseline.peak_live_ids = baseline.peak_live_ids.max(live.len() as u64);
                }
                // A free of an id not live is memory from before the window while the
                // header's baseline still covers it; past that it is an anomaly (a double
                // free, or a free of something never allocated), which replay counts.
                Op::Free => {
                    if !live.remove(&event.id) && freed + event.size <= budget {
                        freed += event.size;
                        baseline.freed_in_window.push((event.id, event.size));
                    }
                }
            }
        }
        baseline.held = budget - freed;
        // The blocks the header knows, while they fit in what no free in the window took: a
        // header whose blocks sum to more than that (a file that contradicts itself) keeps
        // the rest of unknown shape rather than invent memory.
        let mut left = baseline.held;
        for &size in &input.header().pre_window_blocks {
            if size > 0 && size <= left {
                left -= size;
                baseline.held_blocks.push(size);
            }
        }
        baseline.unknown_shape = left;
        Ok(baseline)
    }

    /// The bytes of unknown shape as the device counts them: rounded up to `granularity`.
    pub fn outside_pool(&self, granularity: u64) -> u64 {
        if self.unknown_shape == 0 {
            0
        } else {
            self.unknown_shape
                .div_ceil(granularity.max(1))
                .saturating_mul(granularity.max(1))
        }
    }

    /// The assumption replay makes about the memory of unknown shape, for the output;
    /// `None` when there is none.
    pub fn assumption(&self) -> Option<String> {
        (self.unknown_shape > 0).then(|| {
            format!(
                "{} bytes live before the window of unknown shape: held outside the pool, \
                 counted against the device's capacity (the allocator is built on the capacity \
                 less them, rounded up to the granularity; its fraction applies to what is left)",
                self.unknown_shape
            )
        })
    }
}

/// The first allocation a strategy could not serve.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    /// The event's sequence number (`None`: a baseline allocation made before the window).
    pub seq: Option<u64>,
    /// Bytes requested.
    pub size: u64,
    /// Bytes live (requested) at the time.
    pub live: u64,
    /// Bytes the allocator held from the device at the time.
    pub reserved: u64,
    /// The error, first line.
    pub message: String,
}

/// One point of the live/reserved timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sample {
    /// Event index (0-based, baseline allocations excluded).
    pub index: u64,
    /// Highest live bytes (requested) since the previous sample.
    pub live: u64,
    /// Bytes held from the device at the sample.
    pub reserved: u64,
}

/// What one replay measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayResult {
    /// The strategy's replay name.
    pub strategy: &'static str,
    /// Device capacity replayed on.
    pub capacity: u64,
    /// Memory fraction (the allocator's limit is `fraction × capacity`).
    pub fraction: f64,
    /// Events replayed.
    pub events: u64,
    /// Highest sum of requested live bytes, baseline included — the trace's demand, counting
    /// requests the allocator could not serve until their free: a floor for any allocator,
    /// the same for every strategy.
    pub peak_live: u64,
    /// Highest sum of live bytes the allocator actually served, baseline included: equal to
    /// [`ReplayResult::peak_live`] when nothing was refused, less when the replay ran out.
    pub peak_served: u64,
    /// Highest bytes the allocator held from the device (`peak_pool_bytes`), plus
    /// `outside_pool`.
    pub peak_reserved: u64,
    /// Bytes held from the device outside the pool: the memory from before the window of
    /// unknown shape ([`Baseline::unknown_shape`]), rounded up to the granularity; 0 when
    /// there is none.
    pub outside_pool: u64,
    /// `peak_served / peak_reserved`: how much of what the allocator held served requests
    /// (1.0 is perfect; 0 when nothing was reserved). Served bytes lie in the pool, so it
    /// never exceeds 1 — the demand ([`ReplayResult::peak_live`]) would, when the replay ran
    /// out, because the pool is capped at the limit while the refused requests still count.
    pub utilisation: f64,
    /// Allocations refused for lack of memory.
    pub oom_count: u64,
    /// Bytes of those refused allocations, summed: the demand the allocator did not serve.
    pub refused_bytes: u64,
    /// The most bytes refused and still wanted at once (a refused request counts until its
    /// free): what the demand exceeded what was served by, at worst; 0 without a refusal.
    pub peak_refused: u64,
    /// The first of them.
    pub first_failure: Option<Failure>,
    /// Device calls that take or return memory (allocations, frees, the virtual-memory and
    /// pool calls, pinned host memory): not the copies, streams, events and queries —
    /// [`ReplayResult::driver_calls`] counts every call.
    pub device_calls: u64,
    /// Every call made of the device, whatever it does (the sum of `device_calls_by_name`).
    pub driver_calls: u64,
    /// The calls of each step, where the trace says where its steps begin
    /// ([`crate::trace::TraceHeader::step_starts`]: the built-in workloads, a repeated
    /// trace): what a program that repeats its steps pays the driver per step once warm.
    #[serde(
        rename = "driver_calls_per_step",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub steps: Vec<StepCalls>,
    /// Where steps are known: the calls made before the first step began (the parameters, a
    /// preallocation), so that they and the steps' add up to `driver_calls`.
    #[serde(rename = "driver_calls_before_steps")]
    pub calls_before_steps: u64,
    /// Every device call by name ([`crate::adaptor::Call::NAMES`]) with the bytes each acted
    /// on, over the whole replay: what a cost table prices ([`crate::replay::costs`]).
    /// Serialized as `device_calls_by_name`, name → count.
    #[serde(rename = "device_calls_by_name", serialize_with = "counts_by_name")]
    pub tally: CallTally,
    /// The same over the second half of the events: the steady state, after the first pass
    /// of a program that repeats its steps (or warms its pools).
    #[serde(skip)]
    pub steady_tally: CallTally,
    /// Wall time of the replay loop, nanoseconds per event.
    pub ns_per_event: f64,
    /// Frees skipped because their allocation had failed.
    pub skipped_frees: u64,
    /// Frees of ids neither live nor from before the window (trace anomalies).
    pub unknown_frees: u64,
    /// Timeline, when asked for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub samples: Vec<Sample>,
}

/// The device calls of one step of a replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepCalls {
    /// Where the step begins: the `seq` of its first event, as the header's `step_starts`
    /// gives it.
    pub first_event: u64,
    /// Every call made during the step.
    pub calls: u64,
    /// The same by call name (names called at least once).
    #[serde(serialize_with = "counts_by_name")]
    pub by_name: CallTally,
}

impl StepCalls {
    /// The steps of a replay from the tallies taken where each began and the tally at its
    /// end.
    fn from_marks(marks: &[(u64, CallTally)], end: &CallTally) -> Vec<StepCalls> {
        marks
            .iter()
            .enumerate()
            .map(|(k, (first_event, at))| {
                let until = marks.get(k + 1).map_or(end, |(_, t)| t);
                let by_name = until.since(at);
                StepCalls {
                    first_event: *first_event,
                    calls: by_name.by_name.values().map(|&(c, _)| c).sum(),
                    by_name,
                }
            })
            .collect()
    }
}

/// A tally as `--json` gives it: call name → count.
fn counts_by_name<S: serde::Serializer>(
    tally: &CallTally,
    out: S,
) -> std::result::Result<S::Ok, S::Error> {
    out.collect_map(
        tally
            .by_name
            .iter()
            .map(|(&name, &(count, _))| (name, count)),
    )
}

/// Settings of one replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayOptions {
    /// The simulated device.
    pub device: DeviceSpec,
    /// Memory fraction.
    pub fraction: f64,
    /// Timeline points wanted (0: none).
    pub samples: usize,
    /// 0: the trace's own tags. Otherwise the allocations are spread over this many tags
    /// that can sleep ([`crate::sleep_tags`]), one after another in turn — every neighbour
    /// another tag's, the worst case for vmm's tag-affine placement — to measure what that
    /// placement costs.
    pub sleep_tags: u32,
}

/// Called every so many events with the number done (for progress bars).
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Replays `input` through `strategy` on a fresh simulated device.
///
/// # Errors
/// [`Error::Config`] for a fraction outside (0, 1]; [`Error::Unsupported`] for a strategy
/// this build cannot serve; the trace's own errors;
/// errors other than out-of-memory from the allocator (e.g. an invalid size), which mean
/// the trace asks for something no strategy can serve.
pub fn replay(
    input: &TraceInput,
    baseline: &Baseline,
    strategy: ReplayStrategy,
    options: &ReplayOptions,
    progress: Option<Progress<'_>>,
) -> Result<ReplayResult> {
    replay_until(input, baseline, strategy, options, progress, false)
}

/// [`replay`], stopping at the first refusal when `stop_at_oom` (a capacity search asks only
/// whether the replay runs out; the figures of a replay stopped so are of the events up to
/// the refusal).
fn replay_until(
    input: &TraceInput,
    baseline: &Baseline,
    strategy: ReplayStrategy,
    options: &ReplayOptions,
    progress: Option<Progress<'_>>,
    stop_at_oom: bool,
) -> Result<ReplayResult> {
    if !(options.fraction > 0.0 && options.fraction <= 1.0) {
        return Err(Error::config(
            "fraction",
            options.fraction.to_string(),
            "a number in (0, 1], e.g. 0.75",
        ));
    }
    // The memory of unknown shape from before the window takes its granules of the device
    // before the allocator is built: the allocator sees the rest as the device's capacity.
    let outside = baseline.outside_pool(options.device.granularity);
    let pool_device = DeviceSpec {
        capacity: options.device.capacity.saturating_sub(outside),
        ..options.device
    };
    let host = Arc::new(pool_device.host_device()?);
    let device = Arc::new(CountingDevice::new(Arc::clone(&host)));
    let allocator = crate::strategy::build(&strategy.config(options.fraction), device.clone())?;
    let live_ids = baseline.peak_live_ids
        + baseline.freed_in_window.len() as u64
        + baseline.held_blocks.len() as u64;
    let mut run = Run::new(
        allocator.as_ref(),
        baseline.events,
        options.samples,
        live_ids,
    );
    run.hold_outside(
        baseline.unknown_shape,
        outside,
        outside <= options.device.capacity,
    );
    // The blocks held to the end first, at the bottom of the pool, as a program allocates
    // its weights before the step that frees the rest; their ids count down from the top of
    // the id space, which importers (numbering 1, 2, …) never reach.
    for (k, &size) in baseline.held_blocks.iter().enumerate() {
        let id = u64::MAX - k as u64;
        run.allocate(None, id, size, Stream::DEFAULT, "baseline")?;
    }
    for &(id, size) in &baseline.freed_in_window {
        run.allocate(None, id, size, Stream::DEFAULT, "baseline")?;
    }
    let header = input.header();
    let sleep_tags: Vec<String> = (0..options.sleep_tags)
        .map(|k| {
            let tag = format!("replay-sleep-{k}");
            crate::sleep_tags::declare_sleepable(&tag);
            tag
        })
        .collect();
    let started = Instant::now();
    let mut index = 0u64;
    let mut allocations = 0usize;
    // The calls up to the middle of the events; what follows is the steady state.
    let half = baseline.events / 2;
    let mut first_half = (half == 0).then(|| device.tally());
    // The tally where each step begins (the header's step starts, ascending; a step no event
    // reaches is not reported).
    let step_starts = &header.step_starts;
    let mut step_marks: Vec<(u64, CallTally)> = Vec::with_capacity(step_starts.len());
    // Whether to go on: false once a refusal ends a replay that stops at one.
    let mut step = |event: Event| -> Result<bool> {
        // Steps begin at an event's `seq`, not its position: events a reader dropped (frees
        // of unknown ids) shift no step.
        while step_marks.len() < step_starts.len() && step_starts[step_marks.len()] <= event.seq {
            step_marks.push((step_starts[step_marks.len()], device.tally()));
        }
        match event.op {
            Op::Alloc => {
                let tag = if sleep_tags.is_empty() {
                    header.tag_name(event.tag).unwrap_or("")
                } else {
                    allocations += 1;
                    sleep_tags[allocations % sleep_tags.len()].as_str()
                };
                run.allocate(
                    Some(event.seq),
                    event.id,
                    event.size,
                    Stream(event.stream),
                    tag,
                )?;
            }
            Op::Free => run.free(event.id)?,
        }
        index += 1;
        if index == half {
            first_half = Some(device.tally());
        }
        run.sample(index);
        if index % (1 << 16) == 0 {
            if let Some(p) = progress {
                p(index);
            }
        }
        Ok(!(stop_at_oom && run.oom_count > 0))
    };
    match input {
        // Events in memory are read straight from the slice: no boxed iterator to call and
        // no `Result` to unwrap per event.
        TraceInput::Events { events, .. } => {
            for &event in events.iter() {
                if !step(event)? {
                    break;
                }
            }
        }
        TraceInput::File { .. } => {
            for event in input.events()? {
                if !step(event?)? {
                    break;
                }
            }
        }
    }
    let elapsed = started.elapsed();
    let tally = device.tally();
    let stats = allocator.stats();
    // What the process held from the device: the pool and the memory outside it.
    let peak_reserved = stats.peak_pool_bytes + run.outside;
    let result = ReplayResult {
        strategy: strategy.name(),
        capacity: options.device.capacity,
        fraction: options.fraction,
        events: index,
        peak_live: run.peak_live,
        peak_served: run.peak_served,
        peak_reserved,
        outside_pool: run.outside,
        utilisation: if peak_reserved == 0 {
            0.0
        } else {
            run.peak_served as f64 / peak_reserved as f64
        },
        oom_count: run.oom_count,
        refused_bytes: run.refused_bytes,
        peak_refused: run.peak_refused,
        first_failure: run.first_failure.take(),
        device_calls: device.counts().memory_calls(),
        driver_calls: tally.by_name.values().map(|&(c, _)| c).sum(),
        calls_before_steps: step_marks
            .first()
            .map_or(0, |(_, t)| t.by_name.values().map(|&(c, _)| c).sum()),
        steps: StepCalls::from_marks(&step_marks, &tally),
        steady_tally: tally.since(&first_half.unwrap_or_default()),
        tally,
        ns_per_event: if index == 0 {
            0.0
        } else {
            elapsed.as_nanos() as f64 / index as f64
        },
        skipped_frees: run.skipped_frees,
        unknown_frees: run.unknown_frees,
        samples: std::mem::take(&mut run.samples),
    };
    run.release_all()?;
    Ok(result)
}

/// The bookkeeping of one replay.
struct Run<'a> {
    allocator: &'a dyn Allocator,
    /// Trace id → the allocation serving it.
    live: FxHashMap<u64, Allocation>,
    /// Ids whose allocation failed, with their sizes: their free is skipped, but the trace's
    /// demand still counts them until it comes.
    failed: FxHashMap<u64, u64>,
    /// Bytes served and live now.
    live_bytes: u64,
    /// Bytes of `failed`.
    failed_bytes: u64,
    /// Bytes held from the device outside the pool (the memory of unknown shape from before
    /// the window, in granules): counted in every figure of what is reserved.
    outside: u64,
    /// The most the trace asked to have live at once (`live_bytes + failed_bytes`): the
    /// workload's demand, whatever the allocator managed to serve.
    peak_live: u64,
    /// The most bytes served and live at once (`live_bytes`'s peak).
    peak_served: u64,
    oom_count: u64,
    /// Bytes of the refused requests, summed.
    refused_bytes: u64,
    /// The most of `failed_bytes` at once.
    peak_refused: u64,
    first_failure: Option<Failure>,
    skipped_frees: u64,
    unknown_frees: u64,
    samples: Vec<Sample>,
    sample_every: u64,
    /// The event index of the next sample: a multiple of `sample_every` (`u64::MAX` when no
    /// timeline is wanted), compared with each index instead of dividing it.
    next_sample: u64,
    bucket_peak: u64,
}

impl<'a> Run<'a> {
    /// `live_ids`: the most trace ids live at once (the table is made that large).
    fn new(allocator: &'a dyn Allocator, events: u64, samples: usize, live_ids: u64) -> Self {
        let sample_every = if samples == 0 {
            u64::MAX
        } else {
            (events / samples as u64).max(1)
        };
        Run {
            allocator,
            live: FxHashMap::with_capacity_and_hasher(
                usize::try_from(live_ids).unwrap_or(0),
                Default::default(),
            ),
            failed: FxHashMap::default(),
            live_bytes: 0,
            failed_bytes: 0,
            outside: 0,
            peak_live: 0,
            peak_served: 0,
            oom_count: 0,
            refused_bytes: 0,
            peak_refused: 0,
            first_failure: None,
            skipped_frees: 0,
            unknown_frees: 0,
            samples: Vec::new(),
            sample_every,
            next_sample: sample_every,
            bucket_peak: 0,
        }
    }

    fn allocate(
        &mut self,
        seq: Option<u64>,
        id: u64,
        size: u64,
        stream: Stream,
        tag: &str,
    ) -> Result<()> {
        // The trace reused the id of a failed request (an importer anomaly): that demand ends.
        // (Most replays fail nothing: no hashing then.)
        if !self.failed.is_empty() {
            if let Some(old) = self.failed.remove(&id) {
                self.failed_bytes -= old;
            }
        }
        let result = self.allocator.allocate(size, 0, stream, tag);
        let outcome = match result {
            Ok(a) => {
                self.live_bytes += size;
                if let Some(old) = self.live.insert(id, a) {
                    // The trace reused a live id (an importer anomaly): keep books exact by
                    // releasing the allocation it replaced.
                    self.live_bytes -= old.size();
                    self.allocator.deallocate(old)?;
                }
                Ok(())
            }
            Err(e) if e.is_out_of_memory() || matches!(e, Error::ExceedsLimit { .. }) => {
                self.oom_count += 1;
                self.refused_bytes = self.refused_bytes.saturating_add(size);
                self.failed.insert(id, size);
                self.failed_bytes += size;
                if self.first_failure.is_none() {
                    let message = e.to_string().lines().next().unwrap_or_default().to_string();
                    self.first_failure = Some(Failure {
                        seq,
                        size,
                        live: self.live_bytes,
                        reserved: self.allocator.pool_bytes() + self.outside,
                        message,
                    });
                }
                Ok(())
            }
            Err(e) => Err(Error::Trace(TraceError::new(
                TraceErrorKind::Malformed,
                format!(
                    "{}: a request of {size} B cannot be replayed: {e}",
                    match seq {
                        Some(n) => format!("event {n}"),
                        None => "memory live before the window".to_string(),
                    }
                ),
            ))),
        };
        let demand = self.live_bytes + self.failed_bytes;
        self.peak_live = self.peak_live.max(demand);
        self.peak_served = self.peak_served.max(self.live_bytes);
        self.peak_refused = self.peak_refused.max(self.failed_bytes);
        self.bucket_peak = self.bucket_peak.max(demand);
        outcome
    }

    /// Holds `bytes` of memory from before the window outside the pool, `reserved` bytes of
    /// the device (`bytes` rounded up to its granularity), or — when they do not `fit` on the
    /// device — counts them as the first refused request, made before the window.
    fn hold_outside(&mut self, bytes: u64, reserved: u64, fit: bool) {
        if bytes == 0 {
            return;
        }
        if fit {
            self.live_bytes += bytes;
            self.outside = reserved;
        } else {
            self.oom_count += 1;
            self.refused_bytes = self.refused_bytes.saturating_add(bytes);
            self.failed_bytes += bytes;
            self.first_failure.get_or_insert(Failure {
                seq: None,
                size: bytes,
                live: self.live_bytes,
                reserved: 0,
                message: format!(
                    "{bytes} bytes live before the window ({reserved} bytes of the device) \
                     exceed the device's capacity"
                ),
            });
        }
        let demand = self.live_bytes + self.failed_bytes;
        self.peak_live = self.peak_live.max(demand);
        self.peak_served = self.peak_served.max(self.live_bytes);
        self.peak_refused = self.peak_refused.max(self.failed_bytes);
        self.bucket_peak = self.bucket_peak.max(demand);
    }

    fn free(&mut self, id: u64) -> Result<()> {
        if let Some(a) = self.live.remove(&id) {
            self.live_bytes -= a.size();
            self.allocator.deallocate(a)
        } else if let Some(size) = self.failed.remove(&id) {
            self.failed_bytes -= size;
            self.skipped_frees += 1;
            Ok(())
        } else {
            self.unknown_frees += 1;
            Ok(())
        }
    }

    /// Takes a sample at every `sample_every`-th index (called with each index in turn).
    #[inline]
    fn sample(&mut self, index: u64) {
        if index == self.next_sample {
            self.next_sample = self.next_sample.saturating_add(self.sample_every);
            self.samples.push(Sample {
                index,
                live: self.bucket_peak,
                // Not `stats()`: vmm's walks its free chunks, and samples come every few
                // events (a plotted replay of the built-in workload ran 7x slower for it).
                reserved: self.allocator.pool_bytes() + self.outside,
            });
            self.bucket_peak = self.live_bytes + self.failed_bytes;
        }
    }

    fn release_all(mut self) -> Result<()> {
        for (_, a) in self.live.drain() {
            self.allocator.deallocate(a)?;
        }
        Ok(())
    }
}

/// The smallest capacity found, and how it was found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MinCapacity {
    /// The smallest device capacity (multiple of the step) at memory fraction 1.0 with which
    /// the strategy ran the whole trace without running out; `None` if even the upper
    /// search bound failed.
    pub bytes: Option<u64>,
    /// The largest capacity searched: 64 × peak live, at most
    /// [`super::preset::MAX_CAPACITY`].
    pub searched_up_to: u64,
    /// Replays it took.
    pub replays: u32,
}

/// Bisects, to `step` bytes (2 MiB), for the smallest capacity at memory fraction 1.0 that
/// runs the trace without out-of-memory — the budget, comparable with peak live.
///
/// Starts from `[peak_live rounded down, 2 × peak_live]` and doubles the upper bound while it
/// fails (up to 64 × peak live, and never past [`super::preset::MAX_CAPACITY`]). Assumes success is monotone in capacity, which holds for
/// every strategy here up to region-size effects in growing BFC (where the figure is the
/// smallest passing capacity the bisection met).
///
/// The capacities searched are the whole device's: memory from before the window of unknown
/// shape ([`Baseline::unknown_shape`]) takes its granules of each before the allocator is
/// built on the rest, so the figure covers it as it covers the blocks in the pool.
///
/// # Errors
/// As [`replay`].
pub fn min_capacity(
    input: &TraceInput,
    baseline: &Baseline,
    strategy: ReplayStrategy,
    device: DeviceSpec,
    peak_live: u64,
    step: u64,
) -> Result<MinCapacity> {
    min_capacity_with(input, baseline, strategy, device, peak_live, None, step, 0)
}

/// [`min_capacity`] with the allocations spread over `sleep_tags` tags that can sleep (see
/// [`ReplayOptions::sleep_tags`]), and a capacity `likely_fit` thought to run the trace (the
/// peak reserved of a replay on a larger device, for a strategy that reserves as it needs:
/// vmm, async, platform) probed first, so that the bisection starts from the few granules
/// between peak live and it instead of from `[peak live, 2 × peak live]` (from some 12
/// replays to some 5 on the shared traces); a hint that fails is a lower bound like any
/// other probe. Each probe stops at its first refusal.
///
/// # Errors
/// As [`replay`].
#[allow(clippy::too_many_arguments)]
pub fn min_capacity_with(
    input: &TraceInput,
    baseline: &Baseline,
    strategy: ReplayStrategy,
    device: DeviceSpec,
    peak_live: u64,
    likely_fit: Option<u64>,
    step: u64,
    sleep_tags: u32,
) -> Result<MinCapacity> {
    let round_down = |x: u64| x / step * step;
    let round_up = |x: u64| x.div_ceil(step).saturating_mul(step);
    let mut replays = 0u32;
    let mut passes = |capacity: u64| -> Result<bool> {
        replays += 1;
        let options = ReplayOptions {
            device: DeviceSpec { capacity, ..device },
            fraction: 1.0,
            samples: 0,
            sleep_tags,
        };
        Ok(replay_until(input, baseline, strategy, &options, None, true)?.oom_count == 0)
    };
    // Below peak live nothing can pass.
    let ceiling = round_up(peak_live.max(step).saturating_mul(64))
        .min(super::preset::MAX_CAPACITY)
        .max(step);
    let mut lo = round_down(peak_live.saturating_sub(1));
    let mut hi = round_up(peak_live.max(step).saturating_mul(2)).min(ceiling);
    if lo >= ceiling {
        // The demand alone is past the largest device searched.
        return Ok(MinCapacity {
            bytes: None,
            searched_up_to: ceiling,
            replays,
        });
    }
    if let Some(fit) = likely_fit.map(round_up).filter(|&f| f > lo && f < hi) {
        if passes(fit)? {
            hi = fit;
        } else {
            lo = fit;
        }
    }
    while !passes(hi)? {
        lo = hi;
        if hi >= ceiling {
            return Ok(MinCapacity {
                bytes: None,
                searched_up_to: ceiling,
                replays,
            });
        }
        hi = (hi * 2).min(ceiling);
    }
    while hi - lo > step {
        let mid = round_down(lo + (hi - lo) / 2).max(lo + step);
        if passes(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(MinCapacity {
        bytes: Some(hi),
        searched_up_to: ceiling,
        replays,
    })
}

/// The host device a [`DeviceSpec`] describes, simulated.
impl DeviceSpec {
    /// A simulated host device with this capacity and granularity.
    pub fn host_device(&self) -> Result<HostDevice> {
        HostDevice::builder()
            .capacity(self.capacity)
            .granularity(self.granularity)
            .simulated(true)
            .name(self.name.to_string())
            .build()
    }
}
