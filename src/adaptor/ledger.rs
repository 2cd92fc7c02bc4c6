//! [`LedgerAllocator`]: an adaptor that keeps a book of every live allocation — like
//! `jax.live_arrays()` — with totals and peaks per tag, a JSON snapshot, donation, and an
//! out-of-memory diagnosis attached to every OOM its upstream reports.
//!
//! See [`LedgerAllocator`] for what it records, what it costs, the out-of-memory diagnosis
//! and donation.
#![deny(unsafe_code)]

use std::backtrace::Backtrace;
use std::sync::{Arc, Mutex, MutexGuard};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::allocator::{next_allocator_id, Allocation, Allocator, Stats};
use crate::config::{Config, Source};
use crate::device::{Device, Stream};
use crate::diagnose::{diagnose, DiagnoseOptions, Diagnosis, LimitHint, OomContext};
use crate::error::{Error, Result};

/// The variable that turns backtrace capture on (read by [`crate::config`]).
pub const BACKTRACE_VARIABLE: &str = crate::config::PORTALLOC_BACKTRACE;
/// The version of [`LedgerSnapshot`]'s JSON layout.
pub const SNAPSHOT_VERSION: u32 = 1;

/// How the ledger behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerOptions {
    /// Capture a backtrace at every allocation (`PORTALLOC_BACKTRACE=1`). Default off.
    pub backtrace: bool,
    /// Record the rounded size as the upstream charged it ([`Allocator::charged`]: bfc's
    /// chunk, vmm's chunk; the size asked for where the upstream cannot tell).
    /// When off, the rounded size is the size asked for. Default on.
    pub measure_rounding: bool,
    /// Thresholds of the out-of-memory diagnosis.
    pub diagnose: DiagnoseOptions,
    /// Where the memory limit came from, so a diagnosis can name the variable that raises it.
    pub limit_hint: LimitHint,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions {
            backtrace: false,
            measure_rounding: true,
            diagnose: DiagnoseOptions::default(),
            limit_hint: LimitHint::default(),
        }
    }
}

impl LedgerOptions {
    /// Defaults, with `backtrace` read from `PORTALLOC_BACKTRACE` alone, through
    /// [`Config::from_env_vars`] (the parsing of every configuration variable). With a
    /// [`Config`] at hand, use [`LedgerOptions::with_config`] instead, which reads nothing.
    ///
    /// # Errors
    /// [`Error::Config`] for a value that is not a boolean (or not UTF-8).
    pub fn from_env() -> Result<LedgerOptions> {
        let config = Config::from_env_vars(&[BACKTRACE_VARIABLE])?;
        Ok(LedgerOptions::default().with_backtrace_of(&config))
    }

    /// As [`LedgerOptions::from_env`], reading `PORTALLOC_BACKTRACE` through `lookup`.
    ///
    /// # Errors
    /// [`Error::Config`] for a `PORTALLOC_BACKTRACE` that is not a boolean.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<LedgerOptions> {
        let config = Config::from_vars_only(&[BACKTRACE_VARIABLE], lookup)?;
        Ok(LedgerOptions::default().with_backtrace_of(&config))
    }

    /// Takes from a configuration what the ledger uses: [`LedgerOptions::backtrace`]
    /// (`PORTALLOC_BACKTRACE`, [`crate::ConfigBuilder::backtrace`]) and
    /// [`LedgerOptions::limit_hint`] (the fraction and the variable, or builder, it came from).
    pub fn with_config(self, config: &Config) -> Self {
        let mut options = self.with_backtrace_of(config);
        options.limit_hint = LimitHint::from_config(config);
        options
    }

    fn with_backtrace_of(mut self, config: &Config) -> Self {
        self.backtrace = config.backtrace.value;
        self
    }
}

impl LimitHint {
    /// The fraction `config` uses and where it came from.
    pub fn from_config(config: &Config) -> LimitHint {
        LimitHint {
            fraction: Some(config.mem_fraction.value),
            source: Some(match &config.mem_fraction.source {
                Source::Env(name) => (*name).to_string(),
                Source::Builder => "the builder (Config::builder().mem_fraction)".to_string(),
                Source::Default => "the default".to_string(),
            }),
            env_read: Some(config.env_read),
        }
    }
}

pub use crate::diagnose::LiveAllocation;

/// Totals of one tag.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagTotals {
    /// The tag.
    pub tag: String,
    /// Live allocations now.
    pub live: u64,
    /// Bytes asked for, live now.
    pub bytes: u64,
    /// Bytes charged (rounded), live now.
    pub rounded_bytes: u64,
    /// High-water mark of `bytes`.
    pub peak_bytes: u64,
    /// High-water mark of `rounded_bytes`.
    pub peak_rounded_bytes: u64,
    /// Allocations ever made with this tag (donations received not included).
    pub allocations: u64,
    /// Allocations donated to this tag.
    pub donated_in: u64,
    /// Allocations of this tag donated away.
    pub donated_out: u64,
}

/// The upstream's counters, as a snapshot stores them (the fields of [`Stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolStats {
    /// See [`Stats::num_allocs`].
    pub num_allocs: u64,
    /// See [`Stats::bytes_in_use`].
    pub bytes_in_use: u64,
    /// See [`Stats::peak_bytes_in_use`].
    pub peak_bytes_in_use: u64,
    /// See [`Stats::largest_alloc_size`].
    pub largest_alloc_size: u64,
    /// See [`Stats::bytes_limit`].
    pub bytes_limit: Option<u64>,
    /// See [`Stats::largest_free_block_bytes`].
    pub largest_free_block_bytes: u64,
    /// See [`Stats::pool_bytes`].
    pub pool_bytes: u64,
    /// See [`Stats::peak_pool_bytes`].
    pub peak_pool_bytes: u64,
    /// See [`Stats::fragmentation`].
    pub fragmentation: f64,
    /// See [`Stats::bytes_asleep`].
    #[serde(default)]
    pub bytes_asleep: u64,
    /// See [`Stats::host_bytes_asleep`].
    #[serde(default)]
    pub host_bytes_asleep: u64,
}

impl From<Stats> for PoolStats {
    fn from(s: Stats) -> Self {
        PoolStats {
            num_allocs: s.num_allocs,
            bytes_in_use: s.bytes_in_use,
            peak_bytes_in_use: s.peak_bytes_in_use,
            largest_alloc_size: s.largest_alloc_size,
            bytes_limit: s.bytes_limit,
            largest_free_block_bytes: s.largest_free_block_bytes,
            pool_bytes: s.pool_bytes,
            peak_pool_bytes: s.peak_pool_bytes,
            fragmentation: s.fragmentation,
            bytes_asleep: s.bytes_asleep,
            host_bytes_asleep: s.host_bytes_asleep,
        }
    }
}

/// Everything the ledger knows at one moment, for JSON export (`portalloc ledger FILE`
/// prints one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerSnapshot {
    /// [`SNAPSHOT_VERSION`].
    pub version: u32,
    /// The upstream's name (`bfc`, `platform`, …).
    pub allocator: String,
    /// Allocations made through the ledger so far (the next sequence number).
    pub allocations_made: u64,
    /// Donations so far.
    pub donations: u64,
    /// The upstream's counters.
    pub upstream: PoolStats,
    /// Totals per tag, largest (rounded bytes live, then peak) first.
    pub tags: Vec<TagTotals>,
    /// Live allocations, oldest first.
    pub live: Vec<LiveAllocation>,
    /// The diagnosis of the last out-of-memory error, if there was one.
    pub last_oom: Option<Diagnosis>,
    /// The tags with allocations asleep ([`Allocator::sleep`]), by name.
    #[serde(default)]
    pub sleeping: Vec<crate::allocator::SleepingTag>,
    /// The graph pools in front of the strategy ([`crate::GraphPools`]): memory the strategy
    /// counts in use that only captured graphs get, with how much of it is free.
    #[serde(default)]
    pub graph_pools: Vec<crate::adaptor::GraphPoolStats>,
}

impl LedgerSnapshot {
    /// The snapshot as pretty JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Reads a snapshot written by [`LedgerSnapshot::to_json`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming what is wrong with the text.
    pub fn from_json(text: &str) -> Result<LedgerSnapshot> {
        serde_json::from_str(text).map_err(|e| Error::InvalidArgument {
            call: "LedgerSnapshot::from_json",
            reason: format!("not a portalloc ledger snapshot: {e}"),
        })
    }

    /// The totals of `tag`, if it was ever used.
    pub fn tag(&self, tag: &str) -> Option<&TagTotals> {
        self.tags.iter().find(|t| t.tag == tag)
    }
}

#[derive(Debug)]
struct Entry {
    upstream: Allocation,
    rounded: u64,
    seq: u64,
    tag: u32,
    donated_from: Option<u32>,
    backtrace: Option<Arc<Backtrace>>,
}

#[derive(Debug, Default)]
struct Books {
    /// Live allocations in slots (a slab: `O(1)` insert and remove, no hashing). The token
    /// of an allocation handed out is `(seq as u32) << 32 | slot`.
    slots: Vec<Option<Entry>>,
    /// Empty slots, reused last-in first-out.
    vacant: Vec<u32>,
    /// Occupied slots.
    live: usize,
    /// Totals per interned tag.
    tags: Vec<TagTotals>,
    tag_index: FxHashMap<Box<str>, u32>,
    /// The tag interned last.
    last_tag: u32,
    next_seq: u64,
    donations: u64,
    last_oom: Option<Diagnosis>,
}

fn token(slot: u32, seq: u64) -> u64 {
    (u64::from(seq as u32) << 32) | u64::from(slot)
}

impl Books {
    /// Stores an entry; returns its token.
    fn insert(&mut self, entry: Entry) -> u64 {
        let seq = entry.seq;
        self.live += 1;
        let slot = match self.vacant.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(entry);
                slot
            }
            None => {
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as u32
            }
        };
        token(slot, seq)
    }

    /// The entry a handed-out allocation stands for.
    fn get(&self, allocation: &Allocation) -> Option<&Entry> {
        let t = allocation.token();
        self.slots
            .get(t as u32 as usize)?
            .as_ref()
            .filter(|e| e.seq as u32 == (t >> 32) as u32 && e.upstream.ptr() == allocation.ptr())
    }

    fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().flatten()
    }

    fn entry_view(&self, e: &Entry, asleep: bool) -> LiveAllocation {
        LiveAllocation {
            asleep,
            seq: e.seq,
            ptr: e.upstream.ptr(),
            size: e.upstream.size(),
            rounded: e.rounded,
            stream: e.upstream.stream().0,
            tag: self.tags[e.tag as usize].tag.clone(),
            donated_from: e.donated_from.map(|t| self.tags[t as usize].tag.clone()),
            backtrace: e.backtrace.as_ref().map(|b| b.to_string()),
        }
    }

    fn intern(&mut self, tag: &str) -> u32 {
        // Fast path: the same tag as last time (a loop allocating one kind of buffer).
        if let Some(t) = self.tags.get(self.last_tag as usize) {
            if t.tag == tag {
                return self.last_tag;
            }
        }
        if let Some(&i) = self.tag_index.get(tag) {
            self.last_tag = i;
            return i;
        }
        let i = self.tags.len() as u32;
        self.tags.push(TagTotals {
            tag: tag.to_string(),
            ..TagTotals::default()
        });
        self.tag_index.insert(tag.into(), i);
        self.last_tag = i;
        i
    }

    fn add(&mut self, tag: u32, size: u64, rounded: u64) {
        let t = &mut self.tags[tag as usize];
        t.live += 1;
        t.bytes += size;
        t.rounded_bytes += rounded;
        t.peak_bytes = t.peak_bytes.max(t.bytes);
        t.peak_rounded_bytes = t.peak_rounded_bytes.max(t.rounded_bytes);
    }

    fn remove(&mut self, tag: u32, size: u64, rounded: u64) {
        let t = &mut self.tags[tag as usize];
        t.live -= 1;
        t.bytes -= size;
        t.rounded_bytes -= rounded;
    }

    /// The live allocations, oldest first; `asleep` tells which of their upstream
    /// allocations sleep.
    fn live(&self, asleep: impl Fn(&Allocation) -> bool) -> Vec<LiveAllocation> {
        let mut v: Vec<LiveAllocation> = self
            .entries()
            .map(|e| self.entry_view(e, asleep(&e.upstream)))
            .collect();
        v.sort_unstable_by_key(|a| a.seq);
        v
    }

    fn tag_totals(&self) -> Vec<TagTotals> {
        let mut v = self.tags.clone();
        v.sort_by(|a, b| {
            (b.rounded_bytes, b.peak_rounded_bytes)
                .cmp(&(a.rounded_bytes, a.peak_rounded_bytes))
                .then_with(|| a.tag.cmp(&b.tag))
        });
        v
    }
}

/// An adaptor that records every live allocation of its upstream, with totals and peaks
/// per tag, JSON snapshots, donation, and a diagnosis on every out-of-memory error.
///
/// # What it records
///
/// For each live allocation: the address, the size asked for, the *rounded* size (what the
/// upstream's `bytes_in_use` was charged for it — see [`LedgerOptions::measure_rounding`]),
/// the stream, the tag, its age (the allocation sequence number: 0 for the first allocation
/// made through the ledger) and, when asked (`PORTALLOC_BACKTRACE=1`), the backtrace of the
/// call that made it.
///
/// Per tag ([`TagTotals`]): live count, current and peak bytes (asked and rounded),
/// allocations ever made, donations in and out. Tags answer separate questions separately:
/// how much do my *buffers* take, and how much does the *workspace* take.
///
/// # Cost
///
/// One uncontended mutex, a slab insert and remove (no hashing of allocations; the tag is
/// interned with one small-string hash), and (with rounding measured, the default) one
/// upstream [`Allocator::stats`] call per allocation. Backtraces, which cost
/// tens of microseconds each, are off unless asked for.
///
/// # Out of memory
///
/// When the upstream runs out ([`Error::is_out_of_memory`], or [`Error::ExceedsLimit`]), the
/// ledger runs [`crate::diagnose::diagnose`] on what it knows (the upstream's report and
/// stats, the device's free memory when [`LedgerAllocator::with_device`] gave it one, its
/// live allocations by tag and age) and returns [`Error::OutOfMemoryDiagnosed`], which
/// wraps the upstream's error (its XLA-style report unchanged) and adds the verdict. The
/// last diagnosis is kept and written into [`LedgerSnapshot::last_oom`].
///
/// # Donation
///
/// [`LedgerAllocator::donate`] hands an allocation to a consumer that reuses its memory (an
/// output written over a donated input, as with `jax.jit(donate_argnums=…)`): the giver's
/// [`Allocation`] is consumed — the move says the giver no longer has it — and the consumer
/// gets a new one over the same memory, re-tagged and with a new age; the ledger counts the
/// donation on both tags.
///
/// Owns its upstream (every call to it should come through the ledger, or rounded sizes
/// may be misattributed). Allocations it hands out carry the ledger's id and a sequence
/// number as token; hand them back to the ledger, not to the upstream.
///
/// # Example
///
/// ```
/// use std::sync::Arc;
///
/// use portalloc::adaptor::{LedgerAllocator, LedgerSnapshot};
/// use portalloc::backends::host::HostDevice;
/// use portalloc::strategy::bfc::{BfcAllocator, BfcOptions};
/// use portalloc::{Allocator, Error, Stream};
///
/// let device = Arc::new(HostDevice::builder().capacity(1 << 30).simulated(true).build()?);
/// let bfc = BfcAllocator::new(device, BfcOptions { limit: 32 << 20, preallocate: true })?;
/// let ledger = LedgerAllocator::new(bfc);
///
/// let weights = ledger.allocate(10 << 20, 0, Stream::DEFAULT, "weights")?;
/// let input = ledger.allocate(1000, 0, Stream::DEFAULT, "input")?;
/// assert_eq!(ledger.live_count(), 2);
/// assert_eq!(ledger.tag("weights").bytes, 10 << 20);
/// // BFC rounds to 256 bytes: the ledger records what the upstream charged.
/// assert_eq!(ledger.tag("input").rounded_bytes, 1024);
///
/// // Donation: the output reuses the input's memory; the input's allocation is consumed.
/// let output = ledger.donate(input, "output")?;
/// assert_eq!((ledger.tag("input").bytes, ledger.tag("output").bytes), (0, 1000));
/// assert_eq!(ledger.tag("output").donated_in, 1);
///
/// // Out of memory: the upstream's report, with the ledger's diagnosis attached.
/// let too_much = ledger.allocate(24 << 20, 0, Stream::DEFAULT, "activations");
/// assert!(matches!(too_much, Err(Error::OutOfMemoryDiagnosed { .. })));
/// assert!(ledger.last_oom().is_some());
///
/// // A snapshot, as `portalloc ledger` prints it, survives JSON.
/// let snapshot = ledger.snapshot();
/// assert_eq!(LedgerSnapshot::from_json(&snapshot.to_json())?, snapshot);
/// assert_eq!(snapshot.live.len(), 2);
///
/// ledger.deallocate(weights)?;
/// ledger.deallocate(output)?;
/// assert_eq!(ledger.live_count(), 0);
/// # Ok::<(), portalloc::Error>(())
/// ```
pub struct LedgerAllocator<A: Allocator + ?Sized> {
    upstream: Box<A>,
    device: Option<Arc<dyn Device>>,
    options: LedgerOptions,
    id: u64,
    books: Mutex<Books>,
}

impl<A: Allocator + ?Sized> std::fmt::Debug for LedgerAllocator<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerAllocator")
            .field("upstream", &self.upstream.name())
            .field("id", &self.id)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<A: Allocator> LedgerAllocator<A> {
    /// Wraps `upstream` with default options (no backtraces).
    pub fn new(upstream: A) -> Self {
        LedgerAllocator::from_boxed(Box::new(upstream), LedgerOptions::default())
    }

    /// Wraps `upstream` with `options`.
    pub fn with_options(upstream: A, options: LedgerOptions) -> Self {
        LedgerAllocator::from_boxed(Box::new(upstream), options)
    }
}

impl<A: Allocator + ?Sized> LedgerAllocator<A> {
    /// Wraps a boxed upstream, such as the `Box<dyn Allocator>` that
    /// [`crate::strategy::build`] returns.
    pub fn from_boxed(upstream: Box<A>, options: LedgerOptions) -> Self {
        LedgerAllocator {
            upstream,
            device: None,
            options,
            id: next_allocator_id(),
            books: Mutex::new(Books { ..Books::default() }),
        }
    }

    /// Gives the ledger the device beneath its upstream, so that an out-of-memory diagnosis
    /// can compare the device's free memory with what this allocator holds.
    pub fn with_device(mut self, device: Arc<dyn Device>) -> Self {
        self.device = Some(device);
        self
    }

    /// The upstream, for reading (stats, strategy-specific accessors).
    pub fn upstream(&self) -> &A {
        &self.upstream
    }

    /// The options in use.
    pub fn options(&self) -> &LedgerOptions {
        &self.options
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        // Every update leaves the books consistent before anything that could panic, so a
        // poisoned lock is still usable.
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every live allocation, oldest first — like `jax.live_arrays()`.
    ///
    /// # Time complexity
    /// `O(n log n)` in the number of live allocations, plus resolving backtraces.
    pub fn live(&self) -> Vec<LiveAllocation> {
        self.books().live(|a| self.upstream.is_asleep(a))
    }

    /// Number of live allocations (zero-byte ones included).
    pub fn live_count(&self) -> usize {
        self.books().live
    }

    /// Totals of every tag ever used, largest live first.
    pub fn tags(&self) -> Vec<TagTotals> {
        self.books().tag_totals()
    }

    /// The totals of one tag (all zero for a tag never used).
    pub fn tag(&self, tag: &str) -> TagTotals {
        let books = self.books();
        match books.tag_index.get(tag) {
            Some(&i) => books.tags[i as usize].clone(),
            None => TagTotals {
                tag: tag.to_string(),
                ..TagTotals::default()
            },
        }
    }

    /// The live allocation a handed-out [`Allocation`] stands for, if it is live here.
    pub fn lookup(&self, allocation: &Allocation) -> Option<LiveAllocation> {
        if allocation.allocator_id() != self.id {
            return None;
        }
        let books = self.books();
        books
            .get(allocation)
            .map(|e| books.entry_view(e, self.upstream.is_asleep(&e.upstream)))
    }

    /// The diagnosis of the last out-of-memory error, if any.
    pub fn last_oom(&self) -> Option<Diagnosis> {
        self.books().last_oom.clone()
    }

    /// Everything the ledger knows now.
    pub fn snapshot(&self) -> LedgerSnapshot {
        let books = self.books();
        LedgerSnapshot {
            version: SNAPSHOT_VERSION,
            allocator: self.upstream.name().to_string(),
            allocations_made: books.next_seq,
            donations: books.donations,
            upstream: self.upstream.stats().into(),
            tags: books.tag_totals(),
            live: books.live(|a| self.upstream.is_asleep(a)),
            last_oom: books.last_oom.clone(),
            sleeping: self.upstream.sleeping(),
            graph_pools: self.upstream.graph_pools(),
        }
    }

    /// [`LedgerAllocator::snapshot`] as pretty JSON.
    pub fn to_json(&self) -> String {
        self.snapshot().to_json()
    }

    /// Writes [`LedgerAllocator::to_json`] to `path` (for `portalloc ledger FILE`).
    ///
    /// # Errors
    /// [`Error::Os`] when the file cannot be written.
    pub fn write_json(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        std::fs::write(path, self.to_json()).map_err(|source| Error::Os {
            call: "writing the ledger snapshot",
            source,
        })
    }

    /// Hands `allocation` to a consumer that reuses its memory, under `to_tag`.
    ///
    /// The giver's allocation is consumed: it no longer has the memory. The consumer gets
    /// a new [`Allocation`] over the same memory (same address, size and stream), with a
    /// new age; the ledger moves its bytes from the old tag to `to_tag` and counts the
    /// donation on both. No device or upstream call is made.
    ///
    /// # Errors
    /// [`Error::ForeignAllocation`] when another allocator made it; [`Error::UnknownPointer`]
    /// when it is not live in this ledger. Either way the allocation is consumed, as
    /// [`Allocator::deallocate`] consumes it.
    pub fn donate(&self, allocation: Allocation, to_tag: &str) -> Result<Allocation> {
        allocation.check_owner(self.id)?;
        let mut guard = self.books();
        let books = &mut *guard;
        let entry = self.take_entry(books, &allocation)?;
        let (size, rounded) = (entry.upstream.size(), entry.rounded);
        books.remove(entry.tag, size, rounded);
        books.tags[entry.tag as usize].donated_out += 1;
        let tag = books.intern(to_tag);
        books.add(tag, size, rounded);
        books.tags[tag as usize].donated_in += 1;
        books.donations += 1;
        let seq = books.next_seq;
        books.next_seq += 1;
        // The upstream's books that decide what sleeps move too: the consumer's tag sleeps
        // it from now on, the giver's no longer does.
        self.upstream.retag(&entry.upstream, to_tag);
        let ptr = entry.upstream.ptr();
        let stream = entry.upstream.stream();
        let token = books.insert(Entry {
            donated_from: Some(entry.tag),
            tag,
            seq,
            ..entry
        });
        Ok(Allocation::new(ptr, size, stream, self.id, token))
    }

    fn take_entry(&self, books: &mut Books, allocation: &Allocation) -> Result<Entry> {
        if books.get(allocation).is_none() {
            return Err(Error::UnknownPointer {
                what: "ledger allocation",
                ptr: allocation.ptr(),
                backend: "ledger",
            });
        }
        let slot = allocation.token() as u32;
        let entry = books.slots[slot as usize].take();
        books.vacant.push(slot);
        books.live -= 1;
        entry.ok_or_else(|| Error::UnknownPointer {
            what: "ledger allocation",
            ptr: allocation.ptr(),
            backend: "ledger",
        })
    }

    /// Builds the diagnosis of `error` (an out-of-memory error of the upstream) and wraps it.
    fn diagnosed(
        &self,
        books: &mut Books,
        error: Error,
        size: u64,
        alignment: u64,
        tag: &str,
    ) -> Error {
        let stats = self.upstream.stats();
        let device = self.device.as_ref().and_then(|d| d.mem_info().ok());
        // Sleeping allocations hold addresses, not memory: not evidence of what fills it.
        let mut live = books.live(|a| self.upstream.is_asleep(a));
        live.retain(|a| !a.asleep);
        let rounded = match &error {
            Error::OutOfMemory(r) => r.rounded,
            _ => size,
        };
        let diagnosis = diagnose(&OomContext {
            strategy: self.upstream.name(),
            requested: size,
            rounded,
            alignment,
            tag,
            stats,
            report: error.oom_report(),
            device_error: match &error {
                Error::DeviceOutOfMemory { free, .. } => Some(*free),
                _ => None,
            },
            device,
            live: &live,
            allocations_made: books.next_seq,
            limit_hint: &self.options.limit_hint,
            options: &self.options.diagnose,
        });
        books.last_oom = Some(diagnosis.clone());
        Error::OutOfMemoryDiagnosed {
            error: Box::new(error),
            diagnosis: Box::new(diagnosis),
        }
    }
}

impl<A: Allocator + ?Sized> Allocator for LedgerAllocator<A> {
    /// The upstream's name: the ledger is transparent in reports.
    fn name(&self) -> &str {
        self.upstream.name()
    }

    fn id(&self) -> u64 {
        self.id
    }

    /// Allocates from the upstream and records the allocation.
    ///
    /// # Errors
    /// The upstream's errors; out-of-memory ones (and [`Error::ExceedsLimit`]) come wrapped
    /// in [`Error::OutOfMemoryDiagnosed`] with the diagnosis.
    ///
    /// # Time complexity
    /// The upstream's, plus `O(1)` expected (`O(n)` in live allocations on out of memory).
    fn allocate(&self, size: u64, alignment: u64, stream: Stream, tag: &str) -> Result<Allocation> {
        let backtrace = self
            .options
            .backtrace
            .then(|| Arc::new(Backtrace::force_capture()));
        // The upstream is called without the ledger's lock: a request that waits (the
        // strategies' last resort before refusing) blocks no other caller's free.
        let upstream = match self.upstream.allocate(size, alignment, stream, tag) {
            Ok(a) => a,
            Err(e) if e.is_out_of_memory() || matches!(e, Error::ExceedsLimit { .. }) => {
                return Err(self.diagnosed(&mut self.books(), e, size, alignment, tag));
            }
            Err(e) => return Err(e),
        };
        let rounded = if self.options.measure_rounding {
            self.upstream
                .charged(&upstream)
                .filter(|&c| c >= size)
                .unwrap_or(size)
        } else {
            size
        };
        let mut guard = self.books();
        let books = &mut *guard;
        let tag = books.intern(tag);
        books.add(tag, size, rounded);
        books.tags[tag as usize].allocations += 1;
        let seq = books.next_seq;
        books.next_seq += 1;
        let ptr = upstream.ptr();
        let token = books.insert(Entry {
            upstream,
            rounded,
            seq,
            tag,
            donated_from: None,
            backtrace,
        });
        Ok(Allocation::new(ptr, size, stream, self.id, token))
    }

    /// Removes the allocation from the books and hands it back to the upstream.
    ///
    /// # Errors
    /// [`Error::ForeignAllocation`] when another allocator made it; [`Error::UnknownPointer`]
    /// when it is not live in this ledger; the upstream's error if it refuses (the
    /// allocation is then gone from the books, as the upstream consumed it).
    fn deallocate(&self, allocation: Allocation) -> Result<()> {
        allocation.check_owner(self.id)?;
        let entry = {
            let mut guard = self.books();
            let books = &mut *guard;
            let entry = self.take_entry(books, &allocation)?;
            books.remove(entry.tag, entry.upstream.size(), entry.rounded);
            entry
        };
        // Without the ledger's lock: a free that waits (another thread's per-thread-stream
        // buffer) blocks no other caller.
        self.upstream.deallocate(entry.upstream)
    }

    fn stats(&self) -> Stats {
        self.upstream.stats()
    }

    fn pool_bytes(&self) -> u64 {
        self.upstream.pool_bytes()
    }

    /// The upstream's sleep, without the ledger's lock (it waits for its copies).
    fn sleep(
        &self,
        tag: &str,
        keep: crate::allocator::Keep,
    ) -> Result<crate::allocator::SleepReport> {
        self.upstream.sleep(tag, keep)
    }

    /// The upstream's wake, without the ledger's lock.
    fn wake(&self, tag: &str) -> Result<crate::allocator::SleepReport> {
        self.upstream.wake(tag)
    }

    fn sleeping(&self) -> Vec<crate::allocator::SleepingTag> {
        self.upstream.sleeping()
    }

    fn is_asleep(&self, allocation: &Allocation) -> bool {
        let books = self.books();
        books
            .get(allocation)
            .is_some_and(|e| self.upstream.is_asleep(&e.upstream))
    }

    fn tag_of(&self, allocation: &Allocation) -> Option<String> {
        let books = self.books();
        books
            .get(allocation)
            .and_then(|e| self.upstream.tag_of(&e.upstream))
    }

    fn backing(&self, allocation: &Allocation) -> Result<crate::allocator::Backing> {
        let books = self.books();
        match books.get(allocation) {
            Some(e) => self.upstream.backing(&e.upstream),
            None => Err(crate::Error::InvalidArgument {
                call: "backing",
                reason: format!(
                    "{:#x} is not a live allocation of this ledger (freed, or another \
                     allocator's)",
                    allocation.ptr()
                ),
            }),
        }
    }

    /// Moves the upstream's books only: the ledger's own tag moves with
    /// [`LedgerAllocator::donate`].
    fn retag(&self, allocation: &Allocation, tag: &str) {
        let books = self.books();
        if let Some(e) = books.get(allocation) {
            self.upstream.retag(&e.upstream, tag);
        }
    }

    fn freeing(&self, allocation: &Allocation) {
        let books = self.books();
        if let Some(e) = books.get(allocation) {
            self.upstream.freeing(&e.upstream);
        }
    }

    /// The upstream's trim, without the ledger's lock (a trim waits for the work on freed
    /// memory).
    fn trim(&self) -> Result<u64> {
        self.upstream.trim()
    }

    /// The upstream's charge for it, as recorded.
    fn charged(&self, allocation: &Allocation) -> Option<u64> {
        self.books().get(allocation).map(|e| e.rounded)
    }

    fn queues_on_stream(&self) -> bool {
        self.upstream.queues_on_stream()
    }

    fn graph_pools(&self) -> Vec<crate::adaptor::GraphPoolStats> {
        self.upstream.graph_pools()
    }

    /// The upstream's invariants, and the ledger's: per-tag totals equal the sums over the
    /// live allocations, and (with rounding measured) the rounded bytes live equal the
    /// upstream's `bytes_in_use`.
    fn check_invariants(&self) -> std::result::Result<(), String> {
        self.upstream.check_invariants()?;
        let books = self.books();
        if books.entries().count() != books.live {
            return Err(format!(
                "ledger counts {} live allocations, its slots hold {}",
                books.live,
                books.entries().count()
            ));
        }
        let mut sums = vec![(0u64, 0u64, 0u64); books.tags.len()];
        for e in books.entries() {
            let s = &mut sums[e.tag as usize];
            s.0 += 1;
            s.1 += e.upstream.size();
            s.2 += e.rounded;
        }
        for (t, s) in books.tags.iter().zip(&sums) {
            if (t.live, t.bytes, t.rounded_bytes) != *s {
                return Err(format!(
                    "ledger tag `{}` says {} live / {} B / {} B rounded, its entries sum to {:?}",
                    t.tag, t.live, t.bytes, t.rounded_bytes, s
                ));
            }
            if t.peak_bytes < t.bytes || t.peak_rounded_bytes < t.rounded_bytes {
                return Err(format!(
                    "ledger tag `{}`: a peak is below its current value",
                    t.tag
                ));
            }
        }
        if self.options.measure_rounding {
            let rounded: u64 = sums.iter().map(|s| s.2).sum();
            // Sleeping allocations are live here and not in the upstream's bytes in use.
            let stats = self.upstream.stats();
            let upstream = stats.bytes_in_use + stats.bytes_asleep;
            if rounded != upstream {
                return Err(format!(
                    "ledger holds {rounded} B rounded live, the upstream {upstream} B in use"
                ));
            }
        }
        Ok(())
    }
}
