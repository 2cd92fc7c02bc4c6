//! An outside review of vmm under another tenant, register_host, descriptors and `--repeat`,
//! from the caller's side (kept as tests; the findings it made are fixed):
//!
//! 1. streams made with the driver's own call (blocking and non-blocking), work held in flight,
//!    memory made / stitched / borrowed under another tenant's pressure: no hazard;
//! 2. a tenant taking memory at random points while vmm allocates / sleeps / wakes / trims:
//!    books consistent, the driver's free memory back after free + trim + drop;
//! 3. the growth slack: memory held against the peak live where the budget does not bind;
//! 4. `--repeat` with hostile inputs;
//! 5. register_host on fakecuda / fakecuda_nopinned / fakehip;
//! 6. the descriptor limit running out in the middle of a wake.
#![cfg(all(feature = "hip", feature = "cuda", feature = "c-api"))]

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use portalloc::backends::cuda::CudaDevice;
use portalloc::backends::hip::HipDevice;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::units::Bytes;
use portalloc::{Allocation, Allocator, Device, Error, Keep, Stream, Vendor};

use crate::support::common::Rng;
use crate::support::fakes::{stamp as write, stamped as holds, Fake, FakeDevice, MEMORY};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const HOLD: &str = "rocm7-reservation-hold";

/// The caller's own driver calls: a stream (flags), a raw allocation and its free.
struct Raw<'a> {
    fake: &'a Fake,
}

impl Raw<'_> {
    fn stream(&self, non_blocking: bool) -> Stream {
        let flags: c_uint = u32::from(non_blocking);
        let mut s: *mut c_void = std::ptr::null_mut();
        let rc = match self.fake.vendor() {
            Vendor::Hip => {
                let f: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int =
                    self.fake.sym("hipStreamCreateWithFlags");
                // SAFETY: one handle written.
                unsafe { f(&mut s, flags) }
            }
            _ => {
                let f: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int =
                    self.fake.sym("cuStreamCreate");
                // SAFETY: one handle written.
                unsafe { f(&mut s, flags) }
            }
        };
        assert_eq!(rc, 0, "the caller's stream");
        // SAFETY: a live stream of this fake, destroyed after every use.
        unsafe { Stream::from_raw(s as u64) }
    }

    fn destroy(&self, s: Stream) {
        let name = if self.fake.vendor() == Vendor::Hip {
            "hipStreamDestroy"
        } else {
            "cuStreamDestroy_v2"
        };
        let f: unsafe extern "C" fn(*mut c_void) -> c_int = self.fake.sym(name);
        // SAFETY: the caller's stream, nothing queued (synchronised before).
        unsafe { f(s.as_raw() as *mut c_void) };
    }

    fn malloc(&self, size: u64) -> Option<u64> {
        let mut p: u64 = 0;
        let rc = if self.fake.vendor() == Vendor::Hip {
            let f: unsafe extern "C" fn(*mut u64, usize) -> c_int = self.fake.sym("hipMalloc");
            // SAFETY: one pointer written.
            unsafe { f(&mut p, size as usize) }
        } else {
            let f: unsafe extern "C" fn(*mut u64, usize) -> c_int = self.fake.sym("cuMemAlloc_v2");
            // SAFETY: one pointer written.
            unsafe { f(&mut p, size as usize) }
        };
        (rc == 0 && p != 0).then_some(p)
    }

    fn free(&self, p: u64) {
        let rc = if self.fake.vendor() == Vendor::Hip {
            let f: unsafe extern "C" fn(u64) -> c_int = self.fake.sym("hipFree");
            // SAFETY: from malloc.
            unsafe { f(p) }
        } else {
            let f: unsafe extern "C" fn(u64) -> c_int = self.fake.sym("cuMemFree_v2");
            // SAFETY: from malloc.
            unsafe { f(p) }
        };
        assert_eq!(rc, 0, "the tenant's free");
    }
}

fn open<D: FakeDevice>(vendor: Vendor, profile: &str, capacity: u64) -> (Fake, Arc<D>) {
    let fake = Fake::with_devices(vendor, 1, capacity);
    if vendor == Vendor::Hip {
        fake.set_profile(profile).unwrap();
    }
    let device = Arc::new(D::open(&fake, 0));
    device.make_current_for_caller();
    (fake, device)
}

fn free_of(d: &dyn Device) -> u64 {
    d.mem_info().unwrap().free
}

fn inv<D: Device + ?Sized>(vmm: &VmmAllocator<D>, step: &str) {
    vmm.check_invariants()
        .unwrap_or_else(|e| panic!("invariants after {step}: {e}"));
}

// ---- 1. foreign streams, work in flight, tenant pressure ----------------------------------

fn streams_under_pressure<D: FakeDevice>(vendor: Vendor, profile: &str) {
    let (fake, device) = open::<D>(vendor, profile, 2 * GIB);
    let raw = Raw { fake: &fake };
    let start_free = free_of(device.as_ref());
    let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(2 * GIB)).unwrap();
    let tag = format!("r45-streams-{}-{profile}", vendor.name());
    portalloc::sleep_tags::declare_sleepable(&tag);
    let s1 = raw.stream(false);
    let s2 = raw.stream(true);
    let s3 = raw.stream(true);
    let mut keep = Vec::new();
    for s in [s1, s2, s3, Stream::DEFAULT] {
        keep.push(vmm.allocate(4 * MIB, 0, s, "").unwrap());
    }
    let sleeper = vmm.allocate(200 * MIB, 0, Stream::DEFAULT, &tag).unwrap();
    vmm.sleep(&tag, Keep::Contents).unwrap();
    fake.hold_events(true);
    let mut kernels = Vec::new();
    // Freed on its own stream under a kernel in flight, on each of the streams.
    for (s, size) in [(s1, 150 * MIB), (s2, 150 * MIB), (s3, 100 * MIB)] {
        let a = vmm.allocate(size, 0, s, "").unwrap();
        kernels.push(fake.launch(s, a.ptr(), a.size()));
        vmm.deallocate(a).unwrap();
    }
    // Memory freed on a non-blocking stream, then asked for on the legacy default stream.
    let x = vmm.allocate(64 * MIB, 0, s2, "").unwrap();
    kernels.push(fake.launch(s2, x.ptr(), x.size()));
    vmm.deallocate(x).unwrap();
    let show = |what: &str, kernels: &[u64]| {
        let st = vmm.stats();
        eprintln!(
            "{what}: pool {} in use {} pending {:?} device free {} kernels done {:?}",
            Bytes(st.pool_bytes),
            Bytes(st.bytes_in_use),
            vmm.pending_frees(),
            Bytes(free_of(device.as_ref())),
            kernels
                .iter()
                .map(|&k| fake.kernel_done(k))
                .collect::<Vec<_>>()
        );
    };
    show("before the tenant", &kernels);
    // The tenant leaves 60 MiB.
    let mut tenant = Vec::new();
    let take = free_of(device.as_ref()) - 60 * MIB;
    tenant.push(raw.malloc(take).expect("tenant"));
    let mut got = Vec::new();
    let mut log = Vec::new();
    for (s, size) in [
        (Stream::DEFAULT, 64 * MIB),
        (s3, 200 * MIB),
        (s1, 120 * MIB),
        (s2, 30 * MIB),
        (Stream::PER_THREAD, 40 * MIB),
    ] {
        let r = vmm.allocate(size, 0, s, "");
        log.push(format!(
            "{:?} {}: {}",
            s,
            Bytes(size),
            r.as_ref().map_or_else(|e| e.to_string(), |_| "ok".into())
        ));
        show(&format!("after {:?} {}", s, Bytes(size)), &kernels);
        inv(&vmm, "allocate under pressure");
        assert_eq!(fake.hazards().0, 0, "{:?} after {log:?}", fake.hazards());
        if let Ok(a) = r {
            kernels.push(fake.launch(s, a.ptr(), a.size()));
            got.push(a);
        }
    }
    let w = vmm.wake(&tag);
    log.push(format!("wake: {:?}", w.as_ref().map(|_| ())));
    inv(&vmm, "wake under pressure");
    assert_eq!(fake.hazards().0, 0, "{:?} after {log:?}", fake.hazards());
    eprintln!("{} {profile}: {log:#?}", vendor.name());
    let trimmed = vmm.trim();
    assert_eq!(fake.hazards().0, 0, "trim: {:?}", fake.hazards());
    inv(&vmm, "trim");
    let _ = trimmed;
    fake.hold_events(false);
    device.synchronize_device().unwrap();
    for a in got.into_iter().chain(keep) {
        vmm.deallocate(a).unwrap();
    }
    vmm.deallocate(sleeper).unwrap();
    vmm.trim().unwrap();
    inv(&vmm, "end");
    drop(vmm);
    for p in tenant {
        raw.free(p);
    }
    for s in [s1, s2, s3] {
        raw.destroy(s);
    }
    assert_eq!(fake.hazards().0, 0, "{:?}", fake.hazards());
    assert_eq!(
        free_of(device.as_ref()),
        start_free,
        "the driver's free memory back"
    );
    drop(device);
    assert!(
        fake.nonzero(MEMORY).is_empty(),
        "{:?}",
        fake.nonzero(MEMORY)
    );
}

#[test]
fn review45_streams_under_pressure_cuda() {
    streams_under_pressure::<CudaDevice>(Vendor::Cuda, "");
}

#[test]
fn review45_streams_under_pressure_hip_documented() {
    streams_under_pressure::<HipDevice>(Vendor::Hip, "documented");
}

#[test]
fn review45_streams_under_pressure_hip_hold() {
    streams_under_pressure::<HipDevice>(Vendor::Hip, HOLD);
}

// ---- 2. a tenant at random points ---------------------------------------------------------

fn random_tenant<D: FakeDevice>(vendor: Vendor, profile: &str, seed: u64) {
    let (fake, device) = open::<D>(vendor, profile, 2 * GIB);
    let raw = Raw { fake: &fake };
    let start_free = free_of(device.as_ref());
    let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(3 * GIB / 2)).unwrap();
    let tags: Vec<String> = (0..2)
        .map(|k| format!("r45-rand-{}-{profile}-{seed}-{k}", vendor.name()))
        .collect();
    for t in &tags {
        portalloc::sleep_tags::declare_sleepable(t);
    }
    let mut rng = Rng(seed);
    let mut live: Vec<(Allocation, u8, usize)> = Vec::new(); // (allocation, byte, tag index+1 or 0)
    let mut tenant: Vec<u64> = Vec::new();
    let mut asleep = [false; 2];
    let mut log: Vec<String> = Vec::new();
    for step in 0..400 {
        let op = rng.below(100);
        let what: String = if op < 10 {
            let free = free_of(device.as_ref());
            let take = rng.below(free / 2 + 1).max(MIB);
            match raw.malloc(take) {
                Some(p) => {
                    tenant.push(p);
                    format!("tenant takes {}", Bytes(take))
                }
                None => "tenant refused".into(),
            }
        } else if op < 18 && !tenant.is_empty() {
            let i = rng.below(tenant.len() as u64) as usize;
            raw.free(tenant.swap_remove(i));
            "tenant frees".into()
        } else if op < 55 {
            let size = rng.size(KIB, 300 * MIB);
            let t = rng.below(3) as usize;
            if t > 0 && asleep[t - 1] {
                "skip".into()
            } else {
                let tag = if t == 0 { "" } else { tags[t - 1].as_str() };
                match vmm.allocate(size, 0, Stream::DEFAULT, tag) {
                    Ok(a) => {
                        let b = (step % 250) as u8 + 1;
                        write(&a, b);
                        live.push((a, b, t));
                        format!("alloc {} tag {t}: ok", Bytes(size))
                    }
                    Err(e) => {
                        assert!(
                            e.is_out_of_memory() || matches!(e, Error::ExceedsLimit { .. }),
                            "{e:?}"
                        );
                        format!("alloc {} tag {t}: refused", Bytes(size))
                    }
                }
            }
        } else if op < 80 && !live.is_empty() {
            let i = rng.below(live.len() as u64) as usize;
            let (a, b, t) = live.swap_remove(i);
            if t == 0 || !asleep[t - 1] {
                assert!(holds(&a, b), "step {step}: contents lost; {log:?}");
            }
            vmm.deallocate(a).unwrap();
            "free".into()
        } else if op < 87 {
            let t = rng.below(2) as usize;
            if asleep[t] {
                match vmm.wake(&tags[t]) {
                    Ok(_) => {
                        asleep[t] = false;
                        for (a, b, _) in live.iter().filter(|x| x.2 == t + 1) {
                            assert!(holds(a, *b), "step {step}: woken contents lost");
                        }
                        format!("wake {t}: ok")
                    }
                    Err(e) => {
                        assert!(matches!(e, Error::CannotWake { .. }), "{e:?}");
                        for (a, _, _) in live.iter().filter(|x| x.2 == t + 1) {
                            assert!(vmm.is_asleep(a), "a refused wake woke part of the tag");
                        }
                        format!("wake {t}: refused ({e})")
                    }
                }
            } else {
                match vmm.sleep(&tags[t], Keep::Contents) {
                    Ok(_) => {
                        asleep[t] = true;
                        format!("sleep {t}: ok")
                    }
                    Err(e) => format!("sleep {t}: {e}"),
                }
            }
        } else if op < 92 {
            let r = vmm.trim().unwrap();
            format!("trim {}", Bytes(r))
        } else {
            "nothing".into()
        };
        log.push(what);
        if log.len() > 12 {
            log.remove(0);
        }
        vmm.check_invariants()
            .unwrap_or_else(|e| panic!("step {step}: {e}; last: {log:#?}"));
        assert_eq!(fake.hazards().0, 0, "step {step}: {:?}", fake.hazards());
        let st = vmm.stats();
        let info = device.mem_info().unwrap();
        assert!(
            info.total - info.free >= st.pool_bytes,
            "step {step}: vmm holds {} but the driver has only {} used",
            st.pool_bytes,
            info.total - info.free
        );
    }
    for p in tenant.drain(..) {
        raw.free(p);
    }
    for (t, a) in asleep.iter().enumerate() {
        if *a {
            vmm.wake(&tags[t]).unwrap();
        }
    }
    for (a, b, _) in live.drain(..) {
        assert!(holds(&a, b));
        vmm.deallocate(a).unwrap();
    }
    vmm.trim().unwrap();
    inv(&vmm, "end");
    let st = vmm.stats();
    assert_eq!(
        st.pool_bytes, 0,
        "trim with nothing live gives everything back"
    );
    drop(vmm);
    assert_eq!(
        free_of(device.as_ref()),
        start_free,
        "{} {profile} seed {seed}: the driver's free memory back after free + trim + drop",
        vendor.name()
    );
    drop(device);
    assert!(
        fake.nonzero(MEMORY).is_empty(),
        "{:?}",
        fake.nonzero(MEMORY)
    );
}

#[test]
fn review45_random_tenant() {
    for seed in [1u64, 7, 0xdead_beef, 42] {
        random_tenant::<HipDevice>(Vendor::Hip, "documented", seed);
        random_tenant::<HipDevice>(Vendor::Hip, HOLD, seed);
        random_tenant::<CudaDevice>(Vendor::Cuda, "", seed);
    }
}

// ---- 3. the growth slack ------------------------------------------------------------------

fn simulated_vmm(limit: u64) -> VmmAllocator<portalloc::backends::host::HostDevice> {
    let device = Arc::new(
        portalloc::backends::host::HostDevice::builder()
            .capacity(256 * GIB)
            .simulated(true)
            .build()
            .unwrap(),
    );
    VmmAllocator::new(device, VmmOptions::new(limit)).unwrap()
}

/// Blocks of 3 MiB packed end to end share granules; every other one freed leaves whole
/// granules free (stitchable) and shared ones (not); then 4 MiB blocks (which fit no 3 MiB
/// hole) until the live bytes are back at their peak. The budget (64 GiB) never binds.
#[test]
fn review45_growth_slack_granule_sharing() {
    let vmm = simulated_vmm(64 * GIB);
    let mut blocks: Vec<Allocation> = (0..256)
        .map(|_| vmm.allocate(3 * MIB, 0, Stream::DEFAULT, "").unwrap())
        .collect();
    let peak = vmm.stats().bytes_in_use;
    let mut kept = Vec::new();
    for (i, b) in blocks.drain(..).enumerate() {
        if i % 2 == 0 {
            vmm.deallocate(b).unwrap();
        } else {
            kept.push(b);
        }
    }
    while vmm.stats().bytes_in_use + 4 * MIB <= peak {
        kept.push(vmm.allocate(4 * MIB, 0, Stream::DEFAULT, "").unwrap());
    }
    inv(&vmm, "slack");
    let st = vmm.stats();
    let ratio = st.pool_bytes as f64 / st.peak_bytes_in_use as f64;
    eprintln!(
        "granule sharing: peak live {} pool {} ({ratio:.3} × peak live), counters {:?}",
        Bytes(st.peak_bytes_in_use),
        Bytes(st.pool_bytes),
        vmm.counters()
    );
    for b in kept {
        vmm.deallocate(b).unwrap();
    }
}

/// A seeded churn of granule-multiple sizes (no rounding), budget far away: the memory held
/// against the peak live at every step.
#[test]
fn review45_growth_slack_churn() {
    for seed in [3u64, 99, 12345] {
        let vmm = simulated_vmm(64 * GIB);
        let mut rng = Rng(seed);
        let mut live: Vec<Allocation> = Vec::new();
        let mut worst = 0f64;
        for _ in 0..4000 {
            if live.is_empty() || (live.len() < 48 && rng.below(100) < 52) {
                let size = (1 + rng.below(48)) * 2 * MIB;
                live.push(vmm.allocate(size, 0, Stream::DEFAULT, "").unwrap());
            } else {
                let i = rng.below(live.len() as u64) as usize;
                vmm.deallocate(live.swap_remove(i)).unwrap();
            }
            let st = vmm.stats();
            worst = worst.max(st.pool_bytes as f64 / st.peak_bytes_in_use as f64);
        }
        inv(&vmm, "churn");
        let st = vmm.stats();
        eprintln!(
            "seed {seed}: worst pool / peak live {worst:.3}; end: peak {} pool {}; {:?}",
            Bytes(st.peak_bytes_in_use),
            Bytes(st.pool_bytes),
            vmm.counters()
        );
        assert!(
            worst <= 1.0625 + 0.01,
            "seed {seed}: held {worst:.3} × the peak live"
        );
        for a in live {
            vmm.deallocate(a).unwrap();
        }
    }
}

/// Requests in both size classes (small: below 2 MiB, large), alternating phases: the small
/// class's freed granules and the large's.
#[test]
fn review45_growth_slack_phases() {
    let vmm = simulated_vmm(64 * GIB);
    let mut worst = 0f64;
    for phase in 0..6 {
        let small = phase % 2 == 0;
        let mut live = Vec::new();
        for _ in 0..200 {
            let size = if small { 1536 * KIB } else { 6 * MIB };
            live.push(vmm.allocate(size, 0, Stream::DEFAULT, "").unwrap());
        }
        let st = vmm.stats();
        worst = worst.max(st.pool_bytes as f64 / st.peak_bytes_in_use as f64);
        eprintln!(
            "phase {phase} ({}): live {} peak {} pool {}",
            if small { "small" } else { "large" },
            Bytes(st.bytes_in_use),
            Bytes(st.peak_bytes_in_use),
            Bytes(st.pool_bytes)
        );
        for a in live {
            vmm.deallocate(a).unwrap();
        }
    }
    inv(&vmm, "phases");
    eprintln!("phases: worst pool / peak live {worst:.3}");
}

// ---- 4. --repeat with hostile inputs -------------------------------------------------------

mod repeat_probes {
    use portalloc::replay::repeat::repeat;
    use portalloc::trace::{Event, Op, TraceHeader};

    fn ev(seq: u64, time_ns: u64, op: Op, id: u64) -> Event {
        Event {
            seq,
            time_ns,
            thread: 0,
            stream: 0,
            op,
            id,
            size: 4096,
            tag: 0,
        }
    }

    /// An empty trace repeated: the header's step starts must stay strictly ascending (the
    /// format's rule, which the reader enforces).
    #[test]
    fn review45_repeat_empty_trace_step_starts() {
        match repeat(&TraceHeader::new("t"), &[], 5) {
            // Refused, naming why: its passes would be empty steps.
            Err(e) => assert!(e.to_string().contains("allocates nothing"), "{e}"),
            Ok((h, events)) => {
                eprintln!(
                    "empty × 5: {} events, step_starts {:?}",
                    events.len(),
                    h.step_starts
                );
                assert!(
                    h.step_starts.windows(2).all(|w| w[0] < w[1]),
                    "repeat wrote step_starts the trace format refuses: {:?}",
                    h.step_starts
                );
            }
        }
    }

    /// A trace whose last event is at time u64::MAX (a hostile, but readable, time).
    #[test]
    fn review45_repeat_huge_times() {
        let step = [ev(0, 0, Op::Alloc, 1), ev(1, u64::MAX, Op::Free, 1)];
        let r = std::panic::catch_unwind(|| repeat(&TraceHeader::new("t"), &step, 3));
        match r {
            Err(p) => panic!(
                "repeat panicked on a time of u64::MAX: {:?}",
                p.downcast_ref::<String>()
                    .map(String::as_str)
                    .or(p.downcast_ref::<&str>().copied())
            ),
            Ok(Ok((_, events))) => {
                assert!(
                    events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns),
                    "times go backwards: {:?}",
                    events.iter().map(|e| e.time_ns).collect::<Vec<_>>()
                );
            }
            Ok(Err(e)) => eprintln!("refused: {e}"),
        }
    }

    /// Times near the top whose passes overflow `pass * span`.
    #[test]
    fn review45_repeat_times_overflow_between_passes() {
        let t = u64::MAX / 2;
        let step = [ev(0, 0, Op::Alloc, 1), ev(1, t, Op::Free, 1)];
        let r = std::panic::catch_unwind(|| repeat(&TraceHeader::new("t"), &step, 4));
        match r {
            Err(_) => panic!("repeat panicked on times near u64::MAX / 2 over 4 passes"),
            Ok(Ok((_, events))) => assert!(
                events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns),
                "times go backwards (wrapped): {:?}",
                events.iter().map(|e| e.time_ns).collect::<Vec<_>>()
            ),
            Ok(Err(e)) => eprintln!("refused: {e}"),
        }
    }
}

mod repeat_cli {
    use crate::support::cli::portalloc;

    const HEADER: &str = "{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n";

    fn trace(name: &str, body: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("r45-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    fn run(path: &std::path::Path, extra: &[&str]) -> (bool, String, String) {
        let mut args = vec!["replay", path.to_str().unwrap(), "--strategies", "vmm"];
        args.extend_from_slice(extra);
        let r = portalloc(&args, &[]);
        eprintln!(
            "{} {extra:?}: ok {}\n--- stdout\n{}\n--- stderr\n{}",
            path.display(),
            r.0,
            r.1.lines().take(30).collect::<Vec<_>>().join("\n"),
            r.2
        );
        r
    }

    /// A readable trace whose last event is at u64::MAX ns, repeated: a crash is a bug.
    #[test]
    fn review45_cli_repeat_time_at_u64_max() {
        let p = trace(
            "max.jsonl",
            &format!(
                "{HEADER}[0,0,0,0,\"a\",1,3145728]\n[1,18446744073709551615,0,0,\"f\",1,3145728]\n{{\"end\":{{\"events\":2}}}}\n"
            ),
        );
        let (_, _, plain_err) = run(&p, &[]);
        let (ok, _, err) = run(&p, &["--repeat", "3"]);
        assert!(
            !err.contains("panicked"),
            "portalloc replay --repeat 3 panicked: {err}"
        );
        let _ = (ok, plain_err);
    }

    /// Times near u64::MAX / 2 over 4 passes: `pass * span` overflows.
    #[test]
    fn review45_cli_repeat_time_overflow_between_passes() {
        let p = trace(
            "half.jsonl",
            &format!(
                "{HEADER}[0,0,0,0,\"a\",1,3145728]\n[1,9223372036854775807,0,0,\"f\",1,3145728]\n{{\"end\":{{\"events\":2}}}}\n"
            ),
        );
        let (_, _, err) = run(&p, &["--repeat", "4"]);
        assert!(
            !err.contains("panicked"),
            "portalloc replay --repeat 4 panicked: {err}"
        );
    }

    /// An empty trace (header, no events) repeated.
    #[test]
    fn review45_cli_repeat_empty_trace() {
        let p = trace(
            "empty.jsonl",
            &format!("{HEADER}{{\"end\":{{\"events\":0}}}}\n"),
        );
        let (_, _, err) = run(&p, &["--repeat", "3", "--json"]);
        assert!(!err.contains("panicked"), "{err}");
    }

    /// Frees of unknown ids (no baseline), hand-written step starts (descending; beyond the
    /// events), huge N.
    #[test]
    fn review45_cli_repeat_hostile_headers_and_counts() {
        let body = "[0,0,0,0,\"a\",1,3145728]\n[1,1,0,0,\"f\",77,4096]\n[2,2,0,0,\"f\",1,3145728]\n[3,3,0,0,\"f\",78,4096]\n{\"end\":{\"events\":4}}\n";
        let p = trace("unknown.jsonl", &format!("{HEADER}{body}"));
        let (ok, out, err) = run(&p, &["--repeat", "1000", "--json"]);
        assert!(ok && !err.contains("panicked"), "{err}");
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        let steps = json["traces"][0]["results"][0]["driver_calls_per_step"]
            .as_array()
            .map_or(0, Vec::len);
        eprintln!("unknown frees × 1000: {steps} steps reported");
        let (ok, _, err) = run(&p, &["--repeat", "4294967296"]);
        assert!(!ok && !err.contains("panicked"), "{err}");
        let (ok, _, err) = run(&p, &["--repeat", "-1"]);
        assert!(!ok && !err.contains("panicked"), "{err}");
        let desc = trace(
            "desc.jsonl",
            &format!(
                "{{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\",\"step_starts\":[2,1]}}\n{body}"
            ),
        );
        let (ok, _, err) = run(&desc, &[]);
        assert!(
            !ok && err.contains("step_starts"),
            "descending step starts accepted: {err}"
        );
        let beyond = trace(
            "beyond.jsonl",
            &format!(
                "{{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\",\"step_starts\":[0,2,100]}}\n{body}"
            ),
        );
        let (ok, out, err) = run(&beyond, &["--json"]);
        assert!(ok, "{err}");
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        let steps = json["traces"][0]["results"][0]["driver_calls_per_step"].clone();
        eprintln!("step_starts [0,2,100] over 4 events: {steps}");
        // With --repeat the header's own steps are replaced.
        let (ok, out, err) = run(&beyond, &["--json", "--repeat", "2"]);
        assert!(ok, "{err}");
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        eprintln!(
            "[0,2,100] --repeat 2: {}",
            json["traces"][0]["results"][0]["driver_calls_per_step"]
        );
    }
}

mod step_starts_and_anomalies {
    use crate::support::cli::portalloc;

    /// step_starts name file events; an anomaly dropped before a step's first event shifts
    /// the engine's index, and the step is lost (folded into the one before).
    #[test]
    fn review45_step_starts_after_a_dropped_free_are_lost() {
        let dir = std::env::temp_dir().join(format!("r45-steps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("steps.jsonl");
        // Step 1: events 0-1 (alloc 1, a free of unknown id 77); step 2: events 2-3 (free 1,
        // a free of unknown id 78). The engine drops both unknown frees.
        std::fs::write(
            &p,
            "{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\",\"step_starts\":[0,2]}\n\
             [0,0,0,0,\"a\",1,3145728]\n[1,1,0,0,\"f\",77,4096]\n[2,2,0,0,\"f\",1,3145728]\n\
             [3,3,0,0,\"f\",78,4096]\n{\"end\":{\"events\":4}}\n",
        )
        .unwrap();
        let (ok, out, err) = portalloc(
            &[
                "replay",
                p.to_str().unwrap(),
                "--strategies",
                "vmm",
                "--json",
            ],
            &[],
        );
        assert!(ok, "{err}");
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        let steps = &json["traces"][0]["results"][0]["driver_calls_per_step"];
        eprintln!("step_starts [0,2], unknown frees at 1 and 3: {steps}");
        let firsts: Vec<u64> = steps
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s["first_event"].as_u64().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            firsts.len(),
            2,
            "two steps in the header, {} reported: {steps}",
            firsts.len()
        );
    }
}

// ---- 5. register_host ----------------------------------------------------------------------

fn sleep_cycles<D: FakeDevice>(fake: &Fake, device: Arc<D>, label: &str) {
    let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(GIB)).unwrap();
    let tag = format!("r45-reg-{label}");
    portalloc::sleep_tags::declare_sleepable(&tag);
    let a = vmm.allocate(40 * MIB, 0, Stream::DEFAULT, &tag).unwrap();
    let b = vmm.allocate(3 * MIB + 5, 0, Stream::DEFAULT, &tag).unwrap();
    for cycle in 0..3u8 {
        write(&a, 10 + cycle);
        write(&b, 20 + cycle);
        vmm.sleep(&tag, Keep::Contents).unwrap();
        inv(&vmm, "sleep");
        vmm.wake(&tag).unwrap();
        inv(&vmm, "wake");
        assert!(
            holds(&a, 10 + cycle) && holds(&b, 20 + cycle),
            "{label} cycle {cycle}"
        );
        eprintln!(
            "{label} cycle {cycle}: spare host {} registered-calls {} host live {:?}",
            Bytes(vmm.spare_host_bytes()),
            fake.calls(if fake.vendor() == Vendor::Hip {
                "hipHostRegister"
            } else {
                "cuMemHostRegister_v2"
            }),
            fake.nonzero(&["host_allocations"])
        );
    }
    vmm.trim().unwrap();
    assert_eq!(
        vmm.spare_host_bytes(),
        0,
        "{label}: trim gives the kept copies back"
    );
    // A copy kept, then the allocator dropped without a trim.
    vmm.sleep(&tag, Keep::Contents).unwrap();
    vmm.wake(&tag).unwrap();
    vmm.deallocate(a).unwrap();
    vmm.deallocate(b).unwrap();
    drop(vmm);
    assert!(
        fake.nonzero(&["host_allocations"]).is_empty(),
        "{label}: {:?}",
        fake.nonzero(MEMORY)
    );
    drop(device);
    assert!(
        fake.nonzero(MEMORY).is_empty(),
        "{label}: {:?}",
        fake.nonzero(MEMORY)
    );
}

#[test]
fn review45_register_host_across_fakes() {
    for name in ["fakecuda", "fakecuda_nopinned"] {
        let fake = Fake::copy(name);
        fake.set_devices(1, 2 * GIB);
        let device = Arc::new(<CudaDevice as FakeDevice>::open(&fake, 0));
        sleep_cycles(&fake, device, name);
    }
    for profile in ["documented", HOLD] {
        let fake = Fake::with_devices(Vendor::Hip, 1, 2 * GIB);
        fake.set_profile(profile).unwrap();
        let device = Arc::new(<HipDevice as FakeDevice>::open(&fake, 0));
        sleep_cycles(&fake, device, &format!("fakehip-{profile}"));
    }
}

/// The Device calls directly: twice, overlapping, the wrong size, unknown; a device dropped
/// with memory still registered.
#[test]
fn review45_register_host_contract() {
    let fake = Fake::with_devices(Vendor::Hip, 1, GIB);
    let device = <HipDevice as FakeDevice>::open(&fake, 0);
    let mut buf = vec![0u8; 3 * 4096];
    let base = buf.as_mut_ptr();
    let at = base.wrapping_add(base.align_offset(4096));
    let p = std::ptr::NonNull::new(at).unwrap();
    // SAFETY: our buffer, live to the end of the test.
    unsafe {
        assert!(device.register_host(p, 4096).unwrap());
        let twice = device.register_host(p, 4096);
        eprintln!("twice: {twice:?}");
        assert!(
            matches!(twice, Err(Error::InvalidArgument { .. })),
            "{twice:?}"
        );
        let wrong = device.unregister_host(p, 8192);
        eprintln!("wrong size: {wrong:?}");
        assert!(
            matches!(wrong, Err(Error::InvalidArgument { .. })),
            "{wrong:?}"
        );
        let zero = device.register_host(std::ptr::NonNull::new(at.add(4096)).unwrap(), 0);
        eprintln!("zero: {zero:?}");
        assert!(zero.is_err());
        let unknown = device.unregister_host(std::ptr::NonNull::new(at.add(4096)).unwrap(), 4096);
        eprintln!("unknown: {unknown:?}");
        assert!(
            matches!(unknown, Err(Error::UnknownPointer { .. })),
            "{unknown:?}"
        );
    }
    drop(device);
    assert!(
        fake.nonzero(MEMORY).is_empty(),
        "dropped with a registration: {:?}",
        fake.nonzero(MEMORY)
    );
    drop(buf);
}

// ---- 6. the descriptor limit running out mid-wake ------------------------------------------

const CHILD: &str = "PORTALLOC_TEST_R45_DESCRIPTORS_CHILD";

/// A tag of 8 × 256 MiB asleep; every descriptor taken; the wake needs more handles
/// than that: refused naming the limit, the tag still asleep whole, the books consistent, no
/// handle or descriptor left over; once the descriptors are back the wake restores the bytes.
#[test]
fn review45_descriptor_limit_mid_wake() {
    let name = "review45_probes::review45_descriptor_limit_mid_wake";
    if std::env::var(CHILD).as_deref() != Ok("1") {
        let profile = portalloc_fakes::profile("rocm7-descriptor-per-handle").unwrap();
        let mut c = std::process::Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", name, "--nocapture", "--test-threads=1"]);
        profile.apply(&mut c);
        c.env(CHILD, "1")
            .env("FAKEHIP_CAPACITY", (8 * GIB).to_string());
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        eprintln!("{text}");
        assert!(
            out.status.success() && text.contains("running 1 test"),
            "child failed:\n{text}"
        );
        return;
    }
    let limit = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: one rlimit read.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    let profile = portalloc_fakes::profile("rocm7-descriptor-per-handle").unwrap();
    let fake = Fake::at(profile.library());
    let device = Arc::new(<HipDevice as FakeDevice>::open(&fake, 0));
    let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(8 * GIB)).unwrap();
    portalloc::sleep_tags::declare_sleepable("r45-w");
    let keep = vmm.allocate(64 * MIB, 0, Stream::DEFAULT, "").unwrap();
    let ws: Vec<Allocation> = (0..8u8)
        .map(|i| {
            let a = vmm
                .allocate(256 * MIB, 0, Stream::DEFAULT, "r45-w")
                .unwrap();
            write(&a, i + 1);
            a
        })
        .collect();
    vmm.sleep("r45-w", Keep::Contents).unwrap();
    let handles_asleep = fake.live("handles");
    let mut hog = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hog.push(f);
    }
    let e = vmm.wake("r45-w");
    eprintln!("wake with no descriptor left: {e:?}");
    vmm.check_invariants().unwrap();
    let e = e.expect_err("no handle can be made");
    assert!(
        e.to_string().contains("1024"),
        "the refusal names the limit: {e}"
    );
    for a in &ws {
        assert!(
            vmm.is_asleep(a),
            "a refused wake leaves the whole tag asleep"
        );
    }
    assert_eq!(
        fake.live("handles"),
        handles_asleep,
        "no handle left over by the refused wake"
    );
    drop(hog);
    vmm.wake("r45-w").unwrap();
    vmm.check_invariants().unwrap();
    for (i, a) in ws.iter().enumerate() {
        assert!(
            holds(a, i as u8 + 1),
            "allocation {i} came back with its bytes"
        );
    }
    for a in ws {
        vmm.deallocate(a).unwrap();
    }
    vmm.deallocate(keep).unwrap();
    drop(vmm);
    drop(device);
    assert_eq!(fake.live("handles"), 0);
}
