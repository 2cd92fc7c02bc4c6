//! Every strategy on the device discovery picks, checked and timed: what `scripts/gpu-check`
//! runs on a machine with a GPU (and what runs on the host backend anywhere else).
//!
//! For each strategy (bfc preallocated, bfc growing, platform, vmm, async): RMM's
//! random-allocations churn (allocate with probability 0.73, sizes uniform up to 1 MiB,
//! else free a random live one; 20,000 steps), every allocation written to where the device
//! is host memory, then everything freed and the allocator dropped — and the device's free
//! memory must come back. Prints ns per allocate+free pair, the ratio to `platform` (every
//! request a raw cuMemAlloc / hipMalloc on a GPU), peak pool, and the free-memory check.
//!
//! `cargo run --release --example device_check` (`PORTALLOC_BACKEND=cuda` to insist on a GPU;
//! `XLA_CLIENT_MEM_FRACTION` sets the budget, 0.5 by default here).

use std::process::ExitCode;
use std::time::Instant;

use portalloc::units::Bytes;
use portalloc::{Allocation, Config, Portalloc, StrategyKind, Stream, Vendor};

const STEPS: usize = 20_000;
const MAX_SIZE: u64 = 1 << 20;

struct Row {
    name: &'static str,
    outcome: Result<(f64, u64, u64), String>,
}

fn churn(p: &Portalloc, write: bool) -> portalloc::Result<(f64, u64)> {
    let a = p
        .allocator(0)
        .ok_or_else(|| portalloc::Error::NoDevice("no device".into()))?;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut live: Vec<Allocation> = Vec::new();
    let mut pairs = 0u64;
    let started = Instant::now();
    for _ in 0..STEPS {
        if live.is_empty() || next() % 100 < 73 {
            let size = 1 + next() % MAX_SIZE;
            let x = a.allocate(size, 0, Stream::DEFAULT, "check")?;
            if write {
                // Host memory only (the host backend's real mode): touch every page.
                write_pages(x.ptr(), x.size());
            }
            live.push(x);
        } else {
            let i = (next() % live.len() as u64) as usize;
            a.deallocate(live.swap_remove(i))?;
            pairs += 1;
        }
    }
    pairs += live.len() as u64;
    for x in live {
        a.deallocate(x)?;
    }
    let ns = started.elapsed().as_nanos() as f64 / pairs.max(1) as f64;
    a.check_invariants()
        .map_err(|e| portalloc::Error::InvalidArgument {
            call: "check_invariants",
            reason: e,
        })?;
    Ok((ns, a.stats().peak_pool_bytes))
}

#[allow(unsafe_code)]
fn write_pages(ptr: u64, size: u64) {
    let mut offset = 0;
    while offset < size {
        // SAFETY: `ptr..ptr+size` is a live allocation of host memory owned by this program
        // (only called on the host backend's real mode).
        unsafe { std::ptr::write_volatile((ptr + offset) as *mut u8, 1) };
        offset += 4096;
    }
}

fn main() -> ExitCode {
    let mut rows = Vec::new();
    let mut chosen = None;
    for (name, kind, preallocate) in [
        ("bfc", StrategyKind::Bfc, true),
        ("bfc-grow", StrategyKind::Bfc, false),
        ("platform", StrategyKind::Platform, false),
        ("vmm", StrategyKind::Vmm, false),
        ("async", StrategyKind::Async, false),
    ] {
        let outcome = (|| -> portalloc::Result<(f64, u64, u64)> {
            let base = Config::from_env()?;
            let fraction = if base.mem_fraction.source == portalloc::Source::Default {
                0.5
            } else {
                base.mem_fraction.value
            };
            let config = Config::builder()
                .strategy(kind)
                .preallocate(preallocate)
                .mem_fraction(fraction)
                .build()?;
            let p = Portalloc::from_config(config)?;
            chosen = Some(p.discovery.chosen);
            let device = std::sync::Arc::clone(&p.discovery.devices[0]);
            let before = device.mem_info()?.free;
            let write = p.discovery.chosen == Vendor::Host && !p.config.host_simulated.value;
            let (ns, peak_pool) = churn(&p, write)?;
            drop(p);
            let after = device.mem_info()?.free;
            Ok((ns, peak_pool, before.saturating_sub(after)))
        })();
        rows.push(Row {
            name,
            outcome: outcome.map_err(|e| e.to_string()),
        });
    }
    println!(
        "device check on {:?}: {STEPS} churn steps, sizes up to {}",
        chosen,
        Bytes(MAX_SIZE)
    );
    let platform_ns = rows
        .iter()
        .find(|r| r.name == "platform")
        .and_then(|r| r.outcome.as_ref().ok().map(|o| o.0));
    let mut failed = false;
    for r in &rows {
        match &r.outcome {
            Ok((ns, peak, not_returned)) => {
                let ratio = platform_ns.map_or(String::from("-"), |p| format!("{:.3}", ns / p));
                let returned = *not_returned < (64 << 20);
                failed |= !returned;
                println!(
                    "  {:<9} {:>9.0} ns/pair  ÷ platform {:>7}  peak pool {:>12}  memory returned: {}",
                    r.name,
                    ns,
                    ratio,
                    Bytes(*peak).to_string(),
                    if returned { "yes".to_string() } else { format!("NO ({} short)", Bytes(*not_returned)) }
                );
            }
            Err(e) => {
                println!("  {:<9} error: {e}", r.name);
                failed |= !e.contains("not supported");
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
