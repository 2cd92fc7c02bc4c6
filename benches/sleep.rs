//! Sleep + wake of a large allocation with its contents (vmm on the host backend, real
//! memory) against a plain `memcpy` of the same bytes there and back, in the same run.
//!
//! `cargo bench --bench sleep` (8 GiB; `PORTALLOC_SLEEP_BENCH_GIB=2` for less: the run needs
//! about twice that much free memory). Rounds alternate the contenders, each timed by wall
//! clock (the copies are the work):
//!
//! * **sleep + wake**: `sleep(tag, Keep::Contents)` — the host copy (the one an earlier wake
//!   kept: the steady state; the first of each round makes a fresh one, timed apart), the
//!   copy from the device's memory, its unmapping and release — then `wake(tag)`: new memory
//!   mapped at the same address, the copy back;
//! * **by hand**: what a hand-written sleep does with the same bytes — a copy into a fresh
//!   host buffer, the allocation freed and trimmed (its memory handed back), allocated again,
//!   and the copy back: the same work, without keeping the address;
//! * **memcpy, warm**: the two copies alone, both buffers already faulted in (untimed): the
//!   machine's copy bandwidth, an upper bound.
//!
//! The run holds at most twice the size at once (the allocation and one host buffer).
//!
//! It prints each contender's median and the ratio of bandwidths (memcpy time ÷ sleep + wake
//! time: 1.0 is as fast as the copies alone).
//!
//! # The GPU's time, modelled
//!
//! This machine has no GPU, so what a sleep and a wake of 8 GiB would cost one is a **model**:
//! the same sleep and wake run on a simulated host device behind a [`CallLog`], which keeps
//! each call in order with its bytes and stream, and the built-in table of each preset
//! ([`DeviceCosts::for_preset`], every figure with its source and the GPU it was measured on)
//! prices them on a timeline ([`DeviceCosts::timeline_of`]): one thread makes the calls in
//! turn while each copy runs on its copy engine from when it is queued, so a driver call made
//! while a copy is in flight overlaps it (except an unmap on HIP, which waits for the device).
//! Printed per preset (h100-80g, h200, mi300x), for the **first** sleep and wake of an
//! allocation (the sleep makes its pinned host copy: host memory registered, its pages
//! touched from several threads first) and the **steady** ones (the second:
//! the copy the first wake kept): the calls, the modelled time low–high (the figures' low
//! and high ends), the copy's time alone at the preset's bandwidth, and the fraction of the
//! copy bandwidth the operation reaches (the copy's time ÷ the operation's: 1.0 is as fast as
//! the copy alone), low and high, against the target of 0.8 — and, where it is missed, which
//! figure makes it unreachable. The waits for the copies (`synchronize_stream`,
//! `synchronize_device`) count 0 of their own: their time is the copy's, which the timeline
//! has them wait for. `PORTALLOC_SLEEP_BENCH_ROUNDS=0` prints the model alone.

use std::sync::Arc;
use std::time::Instant;

use portalloc::adaptor::{CallLog, CallTally, LoggedCall};
use portalloc::backends::host::HostDevice;
use portalloc::replay::costs::{copy_for_preset, DeviceCosts, ModelledTime, PIN_BY_REGISTER};
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocator, Keep, Stream};

/// Bytes of the modelled sleep and wake: 8 GiB, whatever the host rounds use.
const MODEL_BYTES: u64 = 8 << 30;

/// The target: the fraction of the copy bandwidth a sleep and a wake reach.
const TARGET: f64 = 0.8;

/// The calls of the sleeps and wakes of [`MODEL_BYTES`] on a simulated device, in order:
/// the first sleep and wake of the allocation, then the second (steady) ones.
struct Modelled {
    first: (Vec<LoggedCall>, Vec<LoggedCall>),
    steady: (Vec<LoggedCall>, Vec<LoggedCall>),
}

fn modelled_calls() -> Modelled {
    let host = HostDevice::builder()
        .capacity(MODEL_BYTES + (1 << 30))
        .simulated(true)
        .build()
        .expect("a simulated host device");
    let device = Arc::new(CallLog::new(Arc::new(host)));
    let vmm = VmmAllocator::new(
        Arc::clone(&device),
        VmmOptions::new(MODEL_BYTES + (512 << 20)),
    )
    .expect("vmm over the simulated device");
    let weights = vmm
        .allocate(MODEL_BYTES, 0, Stream::DEFAULT, "weights")
        .expect("the allocation");
    device.take();
    let cycle = || {
        vmm.sleep("weights", Keep::Contents).expect("sleep");
        let slept = device.take();
        vmm.wake("weights").expect("wake");
        (slept, device.take())
    };
    let first = cycle();
    let steady = cycle();
    vmm.deallocate(weights).expect("free");
    Modelled { first, steady }
}

/// The calls by name, with their bytes.
fn tally(log: &[LoggedCall]) -> CallTally {
    let mut t = CallTally::default();
    for c in log {
        let e = t.by_name.entry(c.name).or_insert((0, 0));
        e.0 += 1;
        e.1 += c.bytes;
    }
    t
}

/// `12.3 ms` or `12.3–45.6 ms`; `≥` where calls are unpriced (naming them).
fn shown(t: &ModelledTime) -> String {
    let range = |low: f64, high: f64| {
        let (l, h) = (format!("{:.1}", low * 1e3), format!("{:.1}", high * 1e3));
        if l == h {
            format!("{l} ms")
        } else {
            format!("{l}–{h} ms")
        }
    };
    match (t.seconds, t.seconds_high) {
        (Some(l), Some(h)) => range(l, h),
        _ => format!(
            "≥{} (unpriced: {})",
            range(t.priced_seconds, t.priced_seconds_high),
            t.unpriced.join(", ")
        ),
    }
}

/// The copy's time ÷ the operation's, at the low ends and at the high ends; `None` where
/// either is unknown.
fn fractions(copy: &ModelledTime, whole: &ModelledTime) -> Option<(f64, f64)> {
    match (
        copy.seconds,
        copy.seconds_high,
        whole.seconds,
        whole.seconds_high,
    ) {
        (Some(cl), Some(ch), Some(wl), Some(wh)) if wl > 0.0 && wh > 0.0 => {
            Some((cl / wl, ch / wh))
        }
        _ => None,
    }
}

/// `0.97 / 0.55 (low / high) -> meets 0.8` or `… -> misses 0.8`.
fn verdict(f: Option<(f64, f64)>) -> String {
    match f {
        Some((l, h)) => format!(
            "{l:.2} / {h:.2} (low / high figures) -> {}",
            if l.min(h) >= TARGET {
                format!("meets {TARGET}")
            } else {
                format!("misses {TARGET}")
            }
        ),
        None => "unknown".to_string(),
    }
}

/// Why an operation of `log` cannot reach [`TARGET`] from the published figures: the calls
/// whose own time, summed per GiB, exceeds what the copy may take at the target, named.
fn why_not(costs: &DeviceCosts, log: &[LoggedCall], copy_s: f64) -> String {
    let room = copy_s / TARGET;
    let mut reasons = Vec::new();
    // The per-MiB parts at the high end: what no handle size and no overlap removes.
    let mut per_mib_high = 0.0;
    for (name, &(count, bytes)) in &tally(log).by_name {
        if let Some(c) = costs.calls.get(*name) {
            let high = c.us_of_high(count, bytes) / 1e6;
            let fixed = (c.us_of(count, 0) / 1e3, c.us_of_high(count, 0) / 1e3);
            let sized = (c.us_of(0, bytes) / 1e3, c.us_of_high(0, bytes) / 1e3);
            per_mib_high += sized.1 / 1e3;
            if high > room - copy_s {
                reasons.push(format!(
                    "{count} {name} take {:.1}–{:.1} ms of the CPU (per call {:.1}–{:.1} ms, \
                     per MiB {:.1}–{:.1} ms)",
                    c.us_of(count, bytes) / 1e3,
                    high * 1e3,
                    fixed.0,
                    fixed.1,
                    sized.0,
                    sized.1
                ));
            }
        }
    }
    if per_mib_high > room {
        reasons.push(format!(
            "at the high end the per-MiB costs alone take {:.1} ms, more than the {:.1} ms \
             allowed: no handle size and no overlap reaches {TARGET} from these figures (the \
             per-call part is small already: a wake makes one handle per 256 MiB piece)",
            per_mib_high * 1e3,
            room * 1e3
        ));
    }
    let serial = costs.unmap_waits_for_device && log.iter().any(|c| c.name == "unmap");
    let mut why = format!(
        "at {TARGET} the operation may take {:.1} ms for a {:.1} ms copy",
        room * 1e3,
        copy_s * 1e3
    );
    if !reasons.is_empty() {
        why += &format!("; {}", reasons.join(", "));
    }
    if serial {
        why += "; each unmap waits for the copy in flight (hipMemUnmap synchronises the device, \
                ROCm/rocm-systems#6982), so no unmap hides behind a copy, and vmm maps and \
                unmaps granule by granule (one hipMemUnmap over several mappings leaves the \
                reservation unfreeable before ROCm 7.0, ROCm/ROCR-Runtime#285)";
        if let Some(u) = costs.calls.get("unmap") {
            let bytes: u64 = log
                .iter()
                .filter(|c| c.name == "unmap")
                .map(|c| c.bytes)
                .sum();
            let (low, high) = (u.us_of(0, bytes) / 1e6, u.us_of_high(0, bytes) / 1e6);
            why += &format!(
                "; even one unmap per 256 MiB piece would leave their per-MiB part, {:.1}–{:.1} \
                 ms (vLLM's 3.73–6.54 ms per GiB of unmap + release, vllm-project/vllm#48337), \
                 after the copies: at most {:.2} / {:.2}",
                low * 1e3,
                high * 1e3,
                copy_s / (copy_s + low),
                copy_s / (copy_s + high)
            );
        }
    }
    why
}

/// Prints the modelled time of the sleeps and the wakes on each preset.
fn print_model() {
    let m = modelled_calls();
    let calls = |log: &[LoggedCall]| {
        tally(log)
            .by_name
            .iter()
            .map(|(name, (n, _))| format!("{n} {name}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "modelled GPU time of a sleep and a wake of {} GiB (vmm, one tagged allocation, contents kept):",
        MODEL_BYTES >> 30
    );
    println!("  first sleep calls:  {}", calls(&m.first.0));
    println!("  first wake calls:   {}", calls(&m.first.1));
    println!("  steady sleep calls: {}", calls(&m.steady.0));
    println!("  steady wake calls:  {}", calls(&m.steady.1));
    println!(
        "  (waits and the first sleep's one create_stream count 0 of their own: a wait's time \
         is the copy's it waits for; no figure of cuStreamCreate is published, and it is made \
         once per allocator)"
    );
    for preset in ["h100-80g", "h200", "mi300x"] {
        let mut costs = DeviceCosts::for_preset(preset);
        // The waits of a sleep and a wake wait for their copies, which the timeline has them
        // wait for: a wait's own overhead (microseconds) is not counted.
        for wait in ["synchronize_stream", "synchronize_device"] {
            costs.calls.entry(wait.to_string()).or_default();
        }
        // The copy stream is made once per allocator, at its first sleep: no published
        // figure prices `cuStreamCreate`, and counting it 0 is said below.
        costs.calls.entry("create_stream".to_string()).or_default();
        let copies_only = DeviceCosts {
            calls: Default::default(),
            copy_gib_s: costs.copy_gib_s,
            unmap_waits_for_device: false,
        };
        let source =
            copy_for_preset(preset).map_or("unknown: no published figure found", |(_, s)| s);
        println!("  {preset} (copies: {source}):");
        for (cycle, (sleep, wake)) in [("first", &m.first), ("steady", &m.steady)] {
            for (what, log, copy) in [
                ("sleep", sleep, "copy_to_host"),
                ("wake", wake, "copy_from_host"),
            ] {
                let whole = costs.timeline_of(log);
                let only: Vec<LoggedCall> =
                    log.iter().copied().filter(|c| c.name == copy).collect();
                let copy_time = copies_only.time_of(&tally(&only));
                let f = fractions(&copy_time, &whole);
                println!(
                    "    {cycle} {what}: modelled {}, the copy alone {} -> fraction of the copy bandwidth {}",
                    shown(&whole),
                    shown(&copy_time),
                    verdict(f)
                );
                if f.is_some_and(|(l, h)| l.min(h) < TARGET) {
                    println!(
                        "      why not: {}",
                        why_not(&costs, log, copy_time.seconds_high.unwrap_or(0.0))
                    );
                }
                // The first sleep pins its copy: registered (pages touched from several
                // threads, then cuMemHostRegister / hipHostRegister: 0.10 s per GiB, the
                // fastest published), or allocated pinned where a driver cannot register.
                // However that overlaps the copy, the pinning alone bounds the fraction.
                let pinned: u64 = log
                    .iter()
                    .filter(|c| matches!(c.name, "register_host" | "alloc_pinned_host"))
                    .map(|c| c.bytes)
                    .sum();
                if pinned > 0 {
                    let (pin, pin_source) = PIN_BY_REGISTER;
                    let copy_s = copy_time.seconds.unwrap_or(0.0);
                    let pin_s = pin.us_of(1, pinned) / 1e6;
                    println!(
                        "      bounded by the published pinning figure: {} GiB pinned at the fastest published rate ({pin_source}) take {:.0} ms, {:.1} × the {:.0} ms copy, so a first sleep reaches at most {:.2} of the copy bandwidth however it overlaps; only a host copy kept from before (the steady cycle) runs at the link's speed",
                        pinned >> 30,
                        pin_s * 1e3,
                        pin_s / copy_s,
                        copy_s * 1e3,
                        copy_s / pin_s
                    );
                }
            }
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
/// Fills `len` bytes at `ptr` (host memory of the host backend) with a pattern.
fn fill(ptr: u64, len: usize) {
    // SAFETY: `ptr` is a live allocation of a host device with real memory, `len` bytes,
    // mapped with access, used by no one else.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
    for (i, chunk) in bytes.chunks_mut(4096).enumerate() {
        chunk.fill(i as u8);
    }
}

fn main() {
    let gib: u64 = std::env::var("PORTALLOC_SLEEP_BENCH_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let bytes = gib << 30;
    let len = bytes as usize;
    let rounds: usize = std::env::var("PORTALLOC_SLEEP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    print_model();
    if rounds == 0 {
        return;
    }
    let device = Arc::new(
        HostDevice::builder()
            .capacity(bytes + (1 << 30))
            .simulated(false)
            .build()
            .expect("a host device with real memory"),
    );
    let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(bytes + (512 << 20)))
        .expect("vmm over the host device");
    let weights = vmm
        .allocate(bytes, 0, Stream::DEFAULT, "weights")
        .expect("the allocation");
    fill(weights.ptr(), len);

    let (mut first, mut slept, mut fresh, mut warm) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut weights = Some(weights);
    for round in 0..rounds {
        let w = weights.take().expect("the allocation");
        // sleep + wake, the first (a fresh host copy) and the next (the host copy the first
        // wake kept): the steady state of a loop that alternates.
        let t = Instant::now();
        vmm.sleep("weights", Keep::Contents).expect("sleep");
        vmm.wake("weights").expect("wake");
        first.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        vmm.sleep("weights", Keep::Contents).expect("sleep");
        vmm.wake("weights").expect("wake");
        slept.push(t.elapsed().as_secs_f64());
        // The kept host copy freed (untimed), so that the contenders below have the memory.
        vmm.trim().expect("trim");

        // The same by hand: a copy into a fresh host buffer, the device memory handed back
        // (freed, trimmed) and taken again, the copy back.
        let t = Instant::now();
        let mut host = vec![0u8; len];
        // SAFETY: the allocation is live, `len` bytes, mapped with access; no one else uses it.
        host.copy_from_slice(unsafe { std::slice::from_raw_parts(w.ptr() as *const u8, len) });
        vmm.deallocate(w).expect("free");
        vmm.trim().expect("trim");
        let w = vmm
            .allocate(bytes, 0, Stream::DEFAULT, "weights")
            .expect("the allocation again");
        // SAFETY: as above, for the new allocation.
        unsafe { std::slice::from_raw_parts_mut(w.ptr() as *mut u8, len) }.copy_from_slice(&host);
        drop(host);
        fresh.push(t.elapsed().as_secs_f64());

        // The two copies alone, both sides faulted in first (untimed): copy bandwidth.
        let mut host = vec![0u8; len];
        host.fill(1);
        // SAFETY: as above.
        let device_bytes = unsafe { std::slice::from_raw_parts_mut(w.ptr() as *mut u8, len) };
        let t = Instant::now();
        host.copy_from_slice(device_bytes);
        device_bytes.copy_from_slice(&host);
        warm.push(t.elapsed().as_secs_f64());
        drop(host);
        eprintln!(
            "round {round}: sleep+wake first {:.2} s, next {:.2} s; memcpy with memory handed back {:.2} s, memcpy warm {:.2} s",
            first[round], slept[round], fresh[round], warm[round]
        );
        weights = Some(w);
    }
    let (s0, s, f, w) = (median(first), median(slept), median(fresh), median(warm));
    let gbs = |secs: f64| 2.0 * bytes as f64 / secs / 1e9;
    println!(
        "sleep + wake of {gib} GiB with contents, {rounds} rounds (medians): {s:.2} s ({:.1} GB/s moved); the first of a round, with a fresh host copy: {s0:.2} s",
        gbs(s)
    );
    let met = |x: f64| if x >= TARGET { "meets" } else { "misses" };
    println!(
        "by hand (copy out, memory handed back and taken again, copy in): {f:.2} s ({:.1} GB/s) -> sleep + wake at {:.2} of its speed, {} {TARGET} (the first of a round: {:.2}, {} {TARGET})",
        gbs(f),
        f / s,
        met(f / s),
        f / s0,
        met(f / s0)
    );
    println!(
        "memcpy there and back, warm memory:  {w:.2} s ({:.1} GB/s) -> ratio {:.2}",
        gbs(w),
        w / s
    );
    vmm.deallocate(weights.expect("the allocation"))
        .expect("free");
}
