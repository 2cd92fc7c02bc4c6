//! Export and import of allocations between processes: the cost per buffer.
//!
//! `cargo bench --bench share`.
//!
//! # Measured (host backend, real memory, two processes)
//!
//! The bench runs itself again as the exporter: a process on the host backend (real memory)
//! that allocates Qwen2.5-0.5B's 289 parameters without the embedding (716 MB in bf16, vmm
//! and bfc in turn) and exports each ([`Sharing::export`]: the strategy's backing, a
//! descriptor per new physical handle, a registry record). This process imports every
//! handle ([`share::import`]: the registry mark, `pidfd_getfd` per new handle, the import,
//! a reservation, the maps, the access) and drops them (unmap, release, free). Wall clock,
//! per buffer, median of 5 rounds.
//!
//! # Modelled (GPU presets)
//!
//! An import's driver calls on the host device are logged ([`CallLog`]) and priced by each
//! preset's table ([`DeviceCosts::for_preset`], every figure with its source). The export
//! and import calls themselves (`cuMemExportToShareableHandle`,
//! `cuMemImportFromShareableHandle`, `cuIpcOpenMemHandle`) have no published figure: they
//! are left unpriced and named, so the modelled figure is a lower bound.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use portalloc::adaptor::{CallLog, LoggedCall};
use portalloc::backends::host::HostDevice;
use portalloc::replay::costs::DeviceCosts;
use portalloc::share::{self, ShareHandle};
#[allow(unused_imports)]
use portalloc::Allocator as _;
use portalloc::{Config, Device, Portalloc, StrategyKind, Stream, Vendor};

const ROLE: &str = "PORTALLOC_SHARE_BENCH_ROLE";
const ROUNDS: usize = 5;

/// Qwen2.5-0.5B's per-layer parameters and final norm (bf16 bytes), 24 layers.
fn parameters() -> Vec<u64> {
    let (h, i, kv) = (896u64, 4864u64, 128u64);
    let mut p = Vec::new();
    for _ in 0..24 {
        for elems in [
            h * h,
            h,
            kv * h,
            kv,
            kv * h,
            kv,
            h * h,
            i * h,
            i * h,
            h * i,
            h,
            h,
        ] {
            p.push(elems * 2);
        }
    }
    p.push(h * 2);
    p
}

fn config(strategy: StrategyKind) -> Config {
    Config::builder()
        .ignore_env()
        .backend(Some(Vendor::Host))
        .host_capacity(2 << 30)
        .host_simulated(false)
        .strategy(strategy)
        .mem_fraction(1.0)
        .preallocate(false)
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

/// The exporter: allocates, exports, writes the handles and its export time, waits.
fn exporter(dir: &Path, strategy: StrategyKind) {
    let p = Portalloc::from_config(config(strategy)).expect("portalloc");
    let a = p.allocator(0).unwrap();
    let sharing = p.sharing(0).unwrap();
    let held: Vec<_> = parameters()
        .into_iter()
        .map(|size| a.allocate(size, 256, Stream::DEFAULT, "weights").unwrap())
        .collect();
    let started = Instant::now();
    let handles: Vec<String> = held
        .iter()
        .map(|h| {
            sharing
                .export(h)
                .unwrap()
                .to_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        })
        .collect();
    let seconds = started.elapsed().as_secs_f64();
    std::fs::write(dir.join("handles"), handles.join("\n")).unwrap();
    std::fs::write(dir.join("export-seconds"), seconds.to_string()).unwrap();
    std::fs::write(dir.join("ready"), b"").unwrap();
    wait_file(&dir.join("done"));
    for h in held {
        a.deallocate(h).unwrap();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One round: (export, import, drop) seconds per buffer, and the import's logged calls.
fn round(name: &str) -> ((f64, f64, f64), Vec<LoggedCall>) {
    let dir = std::env::temp_dir().join(format!(
        "portalloc-share-bench-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env(ROLE, format!("{name}:{}", dir.display()))
        .env("PORTALLOC_SHARE_DIR", &dir)
        .spawn()
        .expect("the exporter");
    std::env::set_var("PORTALLOC_SHARE_DIR", &dir);
    wait_file(&dir.join("ready"));
    let handles: Vec<ShareHandle> = std::fs::read_to_string(dir.join("handles"))
        .unwrap()
        .lines()
        .map(|l| {
            let bytes: Vec<u8> = (0..l.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&l[i..i + 2], 16).unwrap())
                .collect();
            ShareHandle::from_bytes(&bytes).unwrap()
        })
        .collect();
    let n = handles.len() as f64;
    let export: f64 = std::fs::read_to_string(dir.join("export-seconds"))
        .unwrap()
        .parse()
        .unwrap();
    let log = Arc::new(CallLog::new(Arc::new(
        HostDevice::builder()
            .capacity(2 << 30)
            .simulated(false)
            .build()
            .unwrap(),
    )));
    let device: Arc<dyn Device> = log.clone();
    log.take();
    let started = Instant::now();
    let imports: Vec<_> = handles
        .iter()
        .map(|h| share::import(&device, h).expect("import"))
        .collect();
    let import = started.elapsed().as_secs_f64();
    let calls = log.take();
    let started = Instant::now();
    drop(imports);
    let dropped = started.elapsed().as_secs_f64();
    std::fs::write(dir.join("done"), b"").unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    ((export / n, import / n, dropped / n), calls)
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        let (name, dir) = role.split_once(':').unwrap();
        let strategy = if name == "bfc" {
            StrategyKind::Bfc
        } else {
            StrategyKind::Vmm
        };
        exporter(&PathBuf::from(dir), strategy);
        return;
    }
    let n = parameters().len();
    println!(
        "export and import of {n} buffers (Qwen2.5-0.5B without the embedding, 716 MB) between \
         two processes (host backend, real memory), per buffer, median of {ROUNDS}:"
    );
    for name in ["vmm", "bfc"] {
        let mut rounds = Vec::new();
        let mut calls = Vec::new();
        for _ in 0..ROUNDS {
            let (t, c) = round(name);
            rounds.push(t);
            calls = c;
        }
        let us = |f: fn(&(f64, f64, f64)) -> f64| median(rounds.iter().map(f).collect()) * 1e6;
        println!(
            "  {name}: export {:.1} µs, import {:.1} µs, drop {:.1} µs",
            us(|t| t.0),
            us(|t| t.1),
            us(|t| t.2)
        );
        for preset in ["h100-80g", "h200", "mi300x"] {
            let costs = DeviceCosts::for_preset(preset);
            let m = costs.timeline_of(&calls);
            let per = |s: f64| s * 1e6 / n as f64;
            let text = match (m.seconds, m.seconds_high) {
                (Some(l), Some(h)) => format!("{:.1}–{:.1} µs", per(l), per(h)),
                _ => format!("≥{:.1} µs", per(m.priced_seconds)),
            };
            let own = if name == "vmm" {
                "cuMemImportFromShareableHandle per handle"
            } else {
                "cuIpcOpenMemHandle per region"
            };
            println!(
                "    modelled import on {preset:<9}: {text} per buffer ({} calls priced; unpriced: \
                 {}{own})",
                calls.len(),
                if m.unpriced.is_empty() {
                    String::new()
                } else {
                    format!("{}, ", m.unpriced.join(", "))
                }
            );
        }
    }
}
