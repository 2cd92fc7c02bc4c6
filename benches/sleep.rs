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

use std::sync::Arc;
use std::time::Instant;

use portalloc::backends::host::HostDevice;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocator, Keep, Stream};

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
    let rounds = 5;
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
        "memcpy there and back, device memory handed back and taken again: {f:.2} s ({:.1} GB/s) -> ratio {:.2}",
        gbs(f),
        f / s
    );
    println!(
        "memcpy there and back, warm memory:  {w:.2} s ({:.1} GB/s) -> ratio {:.2}",
        gbs(w),
        w / s
    );
    vmm.deallocate(weights.expect("the allocation"))
        .expect("free");
}
