//! The shared budget's hand-off: how long one process takes to get memory another process
//! holds in a reclaimable tag, per GiB.
//!
//! `cargo bench --bench handoff` (1 GiB; `PORTALLOC_HANDOFF_BENCH_GIB=4` for more: the run
//! needs about twice that much free memory).
//!
//! # Measured (host backend, real memory, two processes)
//!
//! The bench runs itself again as the donor: a process on the host backend (vmm, real memory,
//! its pages written) that declares the tag reclaimable — with its contents (`weights`) or
//! without (`kv`) — and holds it outside any `using` section. This process joins the same
//! budget and calls `SharedBudget::reclaim` for the tag's size: the ask through the segment,
//! the donor's service thread woken on the futex, its sleep (the copy to host memory for
//! `weights`, the unmapping and release), its trim, its answer. Timed by wall clock around
//! `reclaim`, 5 rounds each (the donor's `using` wakes the tag between rounds, untimed); the
//! median per GiB is printed.
//!
//! # Modelled (GPU presets)
//!
//! On a GPU the hand-off is the donor's sleep plus the requester's growth into the memory it
//! gave. Both run on a simulated host device behind a [`CallLog`], and each preset's table
//! ([`DeviceCosts::for_preset`], every figure with its source) prices them on a timeline; the
//! protocol's own time (CPU only) is in the measured figure above.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use portalloc::adaptor::{CallLog, LoggedCall};
use portalloc::backends::host::HostDevice;
use portalloc::budget::BudgetOptions;
use portalloc::replay::costs::DeviceCosts;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocator, Config, Keep, Portalloc, StrategyKind, Stream, Vendor};

const ROLE: &str = "PORTALLOC_HANDOFF_ROLE";
const ROUNDS: usize = 5;

fn config(dir: &Path, capacity: u64, name: &str) -> Config {
    Config::builder()
        .ignore_env()
        .backend(Some(Vendor::Host))
        .host_capacity(capacity)
        .host_simulated(false)
        .strategy(StrategyKind::Vmm)
        .mem_fraction(1.0)
        .shared_budget(Some(BudgetOptions {
            dir: dir.to_path_buf(),
            name: name.into(),
            deadline: Duration::from_secs(60),
            ..BudgetOptions::default()
        }))
        .build()
        .expect("the bench's configuration")
}

fn wait_file(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} never came",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The donor: holds `bytes` of `tag` with its pages written; after each round's file, uses
/// the tag (waking it), then says so.
fn donor(dir: &Path, tag: &str, bytes: u64) {
    let p = Portalloc::from_config(config(dir, bytes + (1 << 30), "donor")).unwrap();
    let a = p.allocator(0).unwrap();
    let b = p.budget(0).expect("the donor joined");
    let keep = if tag == "weights" {
        Keep::Contents
    } else {
        Keep::Nothing
    };
    b.declare_reclaimable(tag, keep).unwrap();
    let x = a.allocate(bytes, 256, Stream::DEFAULT, tag).unwrap();
    // SAFETY: `x` is a live allocation of a host device with real memory, `bytes` long.
    let mem = unsafe { std::slice::from_raw_parts_mut(x.ptr() as *mut u8, bytes as usize) };
    for (i, page) in mem.chunks_mut(4096).enumerate() {
        page.fill(i as u8);
    }
    std::fs::write(dir.join("ready"), b"").unwrap();
    for round in 0..ROUNDS {
        wait_file(&dir.join(format!("wake.{round}")));
        drop(b.using(tag).unwrap());
        std::fs::write(dir.join(format!("woke.{round}")), b"").unwrap();
    }
    a.deallocate(x).unwrap();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs a donor of `tag` and takes its memory [`ROUNDS`] times: the median seconds.
fn measure(tag: &str, bytes: u64) -> f64 {
    let dir = std::env::temp_dir().join(format!("portalloc-handoff-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env(ROLE, format!("{tag}:{bytes}:{}", dir.display()))
        .spawn()
        .expect("the donor");
    wait_file(&dir.join("ready"));
    // The same simulated device as the donor's (its key is its name and size).
    let p = Portalloc::from_config(config(&dir, bytes + (1 << 30), "requester")).unwrap();
    let b = p.budget(0).expect("the requester joined");
    let mut times = Vec::new();
    for round in 0..ROUNDS {
        let started = Instant::now();
        let got = b.reclaim(bytes);
        times.push(started.elapsed().as_secs_f64());
        let given: u64 = got.iter().map(|g| g.given).sum();
        assert!(
            given >= bytes,
            "round {round}: the donor gave {given} of {bytes}: {got:?}"
        );
        std::fs::write(dir.join(format!("wake.{round}")), b"").unwrap();
        wait_file(&dir.join(format!("woke.{round}")));
    }
    assert!(
        child.wait().expect("the donor").success(),
        "the donor failed"
    );
    drop(p);
    let _ = std::fs::remove_dir_all(&dir);
    median(times)
}

/// The GPU calls of a hand-off of `bytes` kept or not: the donor's sleep, then the
/// requester's growth into what it gave, on simulated devices.
fn modelled_calls(bytes: u64, keep: Keep) -> (Vec<LoggedCall>, Vec<LoggedCall>) {
    let device = |cap| {
        Arc::new(CallLog::new(Arc::new(
            HostDevice::builder()
                .capacity(cap)
                .simulated(true)
                .build()
                .expect("a simulated host device"),
        )))
    };
    let donor_dev = device(bytes + (1 << 30));
    let donor = VmmAllocator::new(Arc::clone(&donor_dev), VmmOptions::new(bytes + (512 << 20)))
        .expect("vmm");
    let x = donor
        .allocate(bytes, 0, Stream::DEFAULT, "weights")
        .unwrap();
    donor_dev.take();
    donor.sleep("weights", keep).expect("sleep");
    donor.trim().expect("trim");
    let sleep = donor_dev.take();
    let req_dev = device(bytes + (1 << 30));
    let requester =
        VmmAllocator::new(Arc::clone(&req_dev), VmmOptions::new(bytes + (512 << 20))).expect("vmm");
    req_dev.take();
    let y = requester.allocate(bytes, 0, Stream::DEFAULT, "").unwrap();
    let grow = req_dev.take();
    requester.deallocate(y).unwrap();
    donor.wake("weights").unwrap();
    donor.deallocate(x).unwrap();
    (sleep, grow)
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let mut parts = role.splitn(3, ':');
        let tag = parts.next().unwrap().to_string();
        let bytes: u64 = parts.next().unwrap().parse().unwrap();
        let dir = PathBuf::from(parts.next().unwrap());
        donor(&dir, &tag, bytes);
        return;
    }
    // `cargo bench` passes `--bench`; nothing else is read from the arguments.
    let gib: u64 = std::env::var("PORTALLOC_HANDOFF_BENCH_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let bytes = gib << 30;
    println!("hand-off of {gib} GiB between two processes (host backend, real memory, vmm), median of {ROUNDS}:");
    for (tag, what) in [
        ("kv", "without contents"),
        ("weights", "with contents (a copy to host memory)"),
    ] {
        let s = measure(tag, bytes);
        println!(
            "  {tag:<8} {what}: {:.1} ms, {:.1} ms per GiB",
            s * 1e3,
            s * 1e3 / gib as f64
        );
    }
    let model_bytes: u64 = 8 << 30;
    println!("modelled GPU time of a hand-off of {} GiB (the donor's sleep and trim, then the requester's growth):", model_bytes >> 30);
    for (keep, what) in [
        (Keep::Nothing, "without contents"),
        (Keep::Contents, "with contents"),
    ] {
        let (sleep, grow) = modelled_calls(model_bytes, keep);
        for preset in ["h100-80g", "h200", "mi300x"] {
            let mut costs = DeviceCosts::for_preset(preset);
            for wait in ["synchronize_stream", "synchronize_device", "create_stream"] {
                costs.calls.entry(wait.to_string()).or_default();
            }
            let t = |log: &[LoggedCall]| {
                let m = costs.timeline_of(log);
                match (m.seconds, m.seconds_high) {
                    (Some(l), Some(h)) => format!("{:.0}–{:.0} ms", l * 1e3, h * 1e3),
                    _ => format!(
                        "≥{:.0} ms (unpriced: {})",
                        m.priced_seconds * 1e3,
                        m.unpriced.join(", ")
                    ),
                }
            };
            println!(
                "  {what:<17} {preset:<9} sleep + trim {}, growth {}",
                t(&sleep),
                t(&grow)
            );
        }
    }
}
