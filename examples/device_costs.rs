//! Measures what each device call costs on the device discovery picks, and writes the table
//! `portalloc replay --device-costs FILE` reads: what `scripts/gpu-check` runs on a machine
//! with a GPU, so that the cost model prices that GPU's calls with its own figures instead of
//! the built-in table's (an A100's VMM calls, the rest unknown).
//!
//! Each call is timed through portalloc's own device (the calls replay counts, by the names it
//! counts them), `ROUNDS` times at two sizes where its cost may grow with the size; the fixed
//! part and the part per MiB are the line through the two medians (a negative part is 0). The
//! copies are timed between device memory and pinned host memory, 256 MiB each way.
//!
//! `cargo run --release --example device_costs -- FILE.json` (`PORTALLOC_BACKEND=cuda` to insist
//! on a GPU). On the host backend it measures the host's calls: a table that prices a replay,
//! but of this machine, not of a GPU.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use portalloc::replay::costs::{CallCost, CopyBandwidth, DeviceCosts};
use portalloc::{discover, Config, Device, Stream};

/// Times each call is made per size; the median is kept.
const ROUNDS: usize = 64;
const MIB: u64 = 1 << 20;

/// The median of `samples`, microseconds.
fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// The cost line through `(small, t_small)` and `(large, t_large)`: µs per call and per MiB.
fn line(small: u64, t_small: f64, large: u64, t_large: f64) -> CallCost {
    let per_mib = ((t_large - t_small) / ((large - small) as f64 / MIB as f64)).max(0.0);
    CallCost::new(
        (t_small - per_mib * small as f64 / MIB as f64).max(0.0),
        per_mib,
    )
}

/// Microseconds `f` takes.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let started = Instant::now();
    let out = f();
    (out, started.elapsed().as_secs_f64() * 1e6)
}

/// `alloc` and `free` at `size`: the median time of each.
fn alloc_free(d: &dyn Device, size: u64) -> portalloc::Result<(f64, f64)> {
    let (mut a, mut f) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let (p, t) = timed(|| d.alloc(size));
        let p = p?;
        a.push(t);
        let (r, t) = timed(|| d.free(p, size));
        r?;
        f.push(t);
    }
    Ok((median(a), median(f)))
}

/// The VMM calls at `size` (a multiple of the granularity): the median time of each, by name.
fn vmm(d: &dyn Device, size: u64) -> portalloc::Result<BTreeMap<&'static str, f64>> {
    let vm = d
        .virtual_memory()
        .ok_or_else(|| portalloc::Error::NoDevice("no virtual memory".into()))?;
    let mut times: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for _ in 0..ROUNDS {
        let (va, t) = timed(|| vm.reserve(size, 0));
        let va = va?;
        times.entry("reserve").or_default().push(t);
        let (h, t) = timed(|| vm.create_physical(size));
        let h = h?;
        times.entry("create_physical").or_default().push(t);
        let (r, t) = timed(|| vm.map(va, size, h, 0));
        r?;
        times.entry("map").or_default().push(t);
        let (r, t) = timed(|| vm.set_access(va, size));
        r?;
        times.entry("set_access").or_default().push(t);
        let (r, t) = timed(|| vm.unmap(va, size));
        r?;
        times.entry("unmap").or_default().push(t);
        let (r, t) = timed(|| vm.release_physical(h));
        r?;
        times.entry("release_physical").or_default().push(t);
        let (r, t) = timed(|| vm.free_reservation(va, size));
        r?;
        times.entry("free_reservation").or_default().push(t);
    }
    Ok(times.into_iter().map(|(k, v)| (k, median(v))).collect())
}

/// The stream-ordered pool's calls at `size` on `stream`: the median time of each.
fn pool(d: &dyn Device, size: u64, stream: Stream) -> portalloc::Result<(f64, f64)> {
    let Some(pool) = d.stream_ordered_pool() else {
        return Err(portalloc::Error::NoDevice("no stream-ordered pool".into()));
    };
    let (mut a, mut f) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let (p, t) = timed(|| pool.alloc_async(size, stream));
        let p = p?;
        a.push(t);
        let (r, t) = timed(|| pool.free_async(p, stream));
        r?;
        f.push(t);
    }
    d.synchronize_stream(stream)?;
    Ok((median(a), median(f)))
}

/// Microseconds per call of `f`, over `ROUNDS` calls.
fn each(mut f: impl FnMut() -> portalloc::Result<()>) -> portalloc::Result<f64> {
    let mut t = Vec::new();
    for _ in 0..ROUNDS {
        let (r, us) = timed(&mut f);
        r?;
        t.push(us);
    }
    Ok(median(t))
}

/// The copy bandwidths between `size` bytes of device memory and pinned host memory, GiB/s;
/// `None` where the device has no pinned host memory.
fn copies(d: &dyn Device, size: u64, stream: Stream) -> portalloc::Result<Option<CopyBandwidth>> {
    let Some(host) = d.alloc_pinned_host(size)? else {
        return Ok(None);
    };
    let dev = d.alloc(size)?;
    let gib_s = |us: f64| size as f64 / (1u64 << 30) as f64 / (us / 1e6);
    let mut to_host = Vec::new();
    let mut to_device = Vec::new();
    for _ in 0..4 {
        // SAFETY: `host` is `size` bytes of pinned host memory and `dev` `size` bytes of device
        // memory, both live until freed below; the stream is synchronized before either is.
        let (r, t) = timed(|| unsafe {
            d.copy_to_host(host.as_ptr(), dev, size, stream)
                .and_then(|()| d.synchronize_stream(stream))
        });
        r?;
        to_host.push(t);
        // SAFETY: as above.
        let (r, t) = timed(|| unsafe {
            d.copy_from_host(dev, host.as_ptr(), size, stream)
                .and_then(|()| d.synchronize_stream(stream))
        });
        r?;
        to_device.push(t);
    }
    d.free(dev, size)?;
    // SAFETY: `host` came from `alloc_pinned_host(size)` and no copy uses it any more.
    unsafe { d.free_pinned_host(host, size) }?;
    Ok(Some(CopyBandwidth::new(
        gib_s(median(to_host)),
        gib_s(median(to_device)),
    )))
}

/// Pinning `size` bytes of host memory both ways a sleep's host copy can be pinned: made
/// pinned by the driver (`alloc_pinned_host`, cuMemHostAlloc) and ordinary memory touched then
/// registered (`register_host`, cuMemHostRegister): microseconds of each, `None` for a way
/// the device does not offer. What the published figures say (0.49 and 0.10 s/GiB, rapidsai/cudf
/// #23457) is checked on this machine.
fn pinning(d: &dyn Device, size: u64) -> portalloc::Result<(Option<f64>, Option<f64>)> {
    let made = match timed(|| d.alloc_pinned_host(size)) {
        (Ok(Some(host)), us) => {
            // SAFETY: `host` came from `alloc_pinned_host(size)` and nothing uses it.
            unsafe { d.free_pinned_host(host, size) }?;
            Some(us)
        }
        _ => None,
    };
    let layout = std::alloc::Layout::from_size_align(size as usize, 4096)
        .map_err(|e| portalloc::Error::config("size", size.to_string(), e.to_string()))?;
    // SAFETY: a non-zero layout; the memory is freed below, after it is unregistered.
    let raw = unsafe { std::alloc::alloc(layout) };
    let Some(ptr) = std::ptr::NonNull::new(raw) else {
        return Ok((made, None));
    };
    // SAFETY: `ptr` is `size` bytes this function owns and no device has registered; the
    // touch may overwrite them.
    let registered = match timed(|| unsafe { d.register_host(ptr, size) }) {
        (Ok(true), us) => {
            // SAFETY: registered just above with `size`; no copy uses it.
            unsafe { d.unregister_host(ptr, size) }?;
            Some(us)
        }
        _ => None,
    };
    // SAFETY: allocated above with `layout`, and unregistered.
    unsafe { std::alloc::dealloc(raw, layout) };
    Ok((made, registered))
}

fn measure(d: &Arc<dyn Device>) -> portalloc::Result<DeviceCosts> {
    let d = d.as_ref();
    let mut calls = BTreeMap::new();
    let (small, large) = (2 * MIB, 64 * MIB);
    let ((a2, f2), (a64, f64_)) = (alloc_free(d, small)?, alloc_free(d, large)?);
    calls.insert("alloc".to_string(), line(small, a2, large, a64));
    calls.insert("free".to_string(), line(small, f2, large, f64_));
    if let Some(vm) = d.virtual_memory() {
        let g = vm.granularity().max(2 * MIB);
        let (s, l) = (g, 16 * g);
        let (ts, tl) = (vmm(d, s)?, vmm(d, l)?);
        for (name, t_small) in &ts {
            calls.insert(name.to_string(), line(s, *t_small, l, tl[name]));
        }
    }
    let per_call = |us: f64| CallCost::new(us, 0.0);
    let stream = d.create_stream()?;
    if d.stream_ordered_pool().is_some() {
        let ((a2, f2), (a64, f64_)) = (pool(d, small, stream)?, pool(d, large, stream)?);
        calls.insert("alloc_async".to_string(), line(small, a2, large, a64));
        calls.insert("free_async".to_string(), line(small, f2, large, f64_));
        let pool = d.stream_ordered_pool().expect("checked above");
        let threshold = pool.release_threshold()?;
        let us = each(|| pool.set_release_threshold(threshold))?;
        calls.insert("set_release_threshold".to_string(), per_call(us));
        let us = each(|| pool.trim_to(u64::MAX))?;
        calls.insert("trim_to".to_string(), per_call(us));
    }
    calls.insert(
        "synchronize_stream".into(),
        per_call(each(|| d.synchronize_stream(stream))?),
    );
    calls.insert(
        "synchronize_device".into(),
        per_call(each(|| d.synchronize_device())?),
    );
    let event = d.create_event()?;
    calls.insert(
        "record_event".into(),
        per_call(each(|| d.record_event(event, stream))?),
    );
    calls.insert(
        "wait_event".into(),
        per_call(each(|| d.wait_event(stream, event))?),
    );
    calls.insert(
        "synchronize_event".into(),
        per_call(each(|| d.synchronize_event(event))?),
    );
    calls.insert(
        "event_complete".into(),
        per_call(each(|| d.event_complete(event).map(drop))?),
    );
    d.destroy_event(event)?;
    let mut events = Vec::new();
    calls.insert(
        "create_event".into(),
        per_call(each(|| d.create_event().map(|e| events.push(e)))?),
    );
    calls.insert(
        "destroy_event".into(),
        per_call(each(|| {
            d.destroy_event(events.pop().expect("one per create"))
        })?),
    );
    calls.insert(
        "mem_info".into(),
        per_call(each(|| d.mem_info().map(drop))?),
    );
    // Pinning grows with the size: the line through 64 MiB and 1 GiB (a page-touching thread
    // pool and the driver's page walk take a while to reach their rate).
    let (small_pin, large_pin) = (64 * MIB, 1024 * MIB);
    let (made_s, reg_s) = pinning(d, small_pin)?;
    let (made_l, reg_l) = pinning(d, large_pin)?;
    for (name, s, l) in [
        ("alloc_pinned_host", made_s, made_l),
        ("register_host", reg_s, reg_l),
    ] {
        if let (Some(s), Some(l)) = (s, l) {
            let cost = line(small_pin, s, large_pin, l);
            eprintln!(
                "{name}: {:.0} µs + {:.1} µs/MiB ({:.3} s/GiB)",
                cost.us,
                cost.us_per_mib,
                cost.us_per_mib * 1024.0 / 1e6
            );
            calls.insert(name.to_string(), cost);
        }
    }
    let copy_gib_s = copies(d, 256 * MIB, stream)?;
    // SAFETY: `stream` was made above and nothing runs on it any more.
    unsafe { d.destroy_stream(stream) }?;
    Ok(DeviceCosts {
        calls,
        copy_gib_s,
        // Measured here, an unmap's wait for the device is in its own time already; the
        // timeline must still hold it until the copies in flight are done, as HIP's does.
        unmap_waits_for_device: d.info().vendor == portalloc::Vendor::Hip,
    })
}

fn main() -> ExitCode {
    let Some(out) = std::env::args().nth(1) else {
        eprintln!(
            "usage: device_costs FILE.json (the table portalloc replay --device-costs reads)"
        );
        return ExitCode::from(2);
    };
    let result = Config::from_env()
        .and_then(|c| discover(&c))
        .and_then(|found| {
            let d = found
                .devices
                .first()
                .cloned()
                .ok_or_else(|| portalloc::Error::NoDevice("no device discovered".into()))?;
            eprintln!("measuring {} ({})", d.info().name, found.chosen.name());
            measure(&d)
        });
    match result {
        Ok(costs) => {
            let json = serde_json::to_string_pretty(&costs).expect("a table serializes");
            if let Err(e) = std::fs::write(&out, json + "\n") {
                eprintln!("device_costs: cannot write {out}: {e}");
                return ExitCode::FAILURE;
            }
            eprintln!("wrote {out}: {} calls priced", costs.calls.len());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("device_costs: {e}");
            ExitCode::FAILURE
        }
    }
}
