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
//! ([`DeviceCosts::for_preset`], every figure with its source, unknown where none was
//! published) prices them on a timeline ([`DeviceCosts::timeline_of`]): one thread makes the
//! calls in turn while each copy runs on its copy engine from when it is queued, so a driver
//! call made while a copy is in flight overlaps it. Printed per preset, for the sleep and for
//! the wake (the steady state: the second of each): the calls, the modelled time (`≥` where a
//! call is unpriced: the rest, a lower bound), the same calls summed with no overlap, the
//! copy's time alone at the preset's bandwidth, and the fraction of the copy bandwidth the
//! operation reaches (the copy's time ÷ the operation's: 1.0 is as fast as the copy alone).
//! The waits for the copies (`synchronize_stream`, `synchronize_device`) count 0 of their
//! own: their time is the copy's, which the timeline has them wait for.
//! `PORTALLOC_SLEEP_BENCH_ROUNDS=0` prints the model alone.

use std::sync::Arc;
use std::time::Instant;

use portalloc::adaptor::{CallLog, CallTally, LoggedCall};
use portalloc::backends::host::HostDevice;
use portalloc::replay::costs::{copy_for_preset, CallCost, DeviceCosts, ModelledTime};
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocator, Keep, Stream};

/// Bytes of the modelled sleep and wake: 8 GiB, whatever the host rounds use.
const MODEL_BYTES: u64 = 8 << 30;

/// The calls of the steady sleep and wake of [`MODEL_BYTES`] (the second of each) on a
/// simulated device, in order.
fn modelled_calls() -> (Vec<LoggedCall>, Vec<LoggedCall>) {
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
    vmm.sleep("weights", Keep::Contents).expect("sleep");
    vmm.wake("weights").expect("wake");
    device.take();
    vmm.sleep("weights", Keep::Contents).expect("sleep");
    let slept = device.take();
    vmm.wake("weights").expect("wake");
    let woken = device.take();
    vmm.deallocate(weights).expect("free");
    (slept, woken)
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

/// `12.3 ms`, or `≥12.3 ms (unpriced: …)` where calls are unpriced.
fn shown(t: &ModelledTime) -> String {
    match t.seconds {
        Some(s) => format!("{:.1} ms", s * 1e3),
        None => format!(
            "≥{:.1} ms (unpriced: {})",
            t.priced_seconds * 1e3,
            t.unpriced.join(", ")
        ),
    }
}

/// The copy's time ÷ the operation's, `≤` where the operation's is a lower bound.
fn fraction(copy: &ModelledTime, whole: &ModelledTime) -> String {
    match (copy.seconds, whole.seconds) {
        (Some(c), Some(w)) if w > 0.0 => format!("{:.2}", c / w),
        (Some(c), None) if whole.priced_seconds > 0.0 => {
            format!("≤{:.2}", c / whole.priced_seconds)
        }
        _ => "unknown".to_string(),
    }
}

/// Prints the modelled time of the sleep and the wake on each preset.
fn print_model() {
    let (sleep, wake) = modelled_calls();
    let calls = |log: &[LoggedCall]| {
        tally(log)
            .by_name
            .iter()
            .map(|(name, (n, _))| format!("{n} {name}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "modelled GPU time of a sleep and a wake of {} GiB (vmm, one tagged allocation, contents kept; steady state):",
        MODEL_BYTES >> 30
    );
    println!("  sleep calls: {}", calls(&sleep));
    println!("  wake calls:  {}", calls(&wake));
    for preset in ["h100-80g", "mi300x"] {
        let mut costs = DeviceCosts::for_preset(preset);
        // The waits of a sleep and a wake wait for their copies, which the timeline has them
        // wait for: a wait's own overhead (microseconds) is not counted.
        for wait in ["synchronize_stream", "synchronize_device"] {
            costs.calls.entry(wait.to_string()).or_default();
        }
        let copies_only = DeviceCosts {
            calls: Default::default(),
            copy_gib_s: costs.copy_gib_s,
            unmap_waits_for_device: false,
        };
        let source =
            copy_for_preset(preset).map_or("unknown: no published figure found", |(_, s)| s);
        println!("  {preset} (copies: {source}):");
        for (what, log, copy) in [
            ("sleep", &sleep, "copy_to_host"),
            ("wake", &wake, "copy_from_host"),
        ] {
            let whole = costs.timeline_of(log);
            let summed = costs.time_of(&tally(log));
            let only: Vec<LoggedCall> = log.iter().copied().filter(|c| c.name == copy).collect();
            let copy_time = copies_only.time_of(&tally(&only));
            println!(
                "    {what}: modelled {} (summed with no overlap {}), the copy alone {} -> fraction of the copy bandwidth {}",
                shown(&whole),
                shown(&summed),
                shown(&copy_time),
                fraction(&copy_time, &whole)
            );
            // The one published cuMemCreate figure is of 2 MiB handles only: the table reads
            // it per MiB. Were it all per call, fewer and larger handles would be cheaper:
            // the operation under that reading too.
            if let Some(create) = costs.calls.get("create_physical").copied() {
                if log.iter().any(|c| c.name == "create_physical") {
                    let per_call = create.us_per_mib * 2.0;
                    let mut other = costs.clone();
                    other
                        .calls
                        .insert("create_physical".into(), CallCost::new(per_call, 0.0));
                    let t = other.timeline_of(log);
                    println!(
                        "      were cuMemCreate {per_call:.2} µs per call whatever its size: {} -> {}",
                        shown(&t),
                        fraction(&copy_time, &t)
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
    println!(
        "by hand (copy out, memory handed back and taken again, copy in): {f:.2} s ({:.1} GB/s) -> sleep + wake at {:.2} of its speed (the first of a round: {:.2})",
        gbs(f),
        f / s,
        f / s0
    );
    println!(
        "memcpy there and back, warm memory:  {w:.2} s ({:.1} GB/s) -> ratio {:.2}",
        gbs(w),
        w / s
    );
    vmm.deallocate(weights.expect("the allocation"))
        .expect("free");
}
