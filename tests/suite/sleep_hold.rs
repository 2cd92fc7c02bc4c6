//! Sleep, trim and pressure where the driver holds released memory until its reservation is
//! freed (fakehip's `rocm7-reservation-hold`, ROCm 7.x on Linux), beside the documented
//! behaviour, measured by the driver's own free memory (`hipMemGetInfo`): a freed range
//! another reservation took meanwhile, memory stranded in segments by small live allocations,
//! many tags near the budget, kernels in flight on three of the caller's streams with a
//! stream's handle reused, the caller's current device, a fault on every driver call of a
//! sleep and a wake, donation and deferred frees. Written first by an outside review as
//! probes of what broke; each prints what it saw.
#![cfg(all(feature = "hip", feature = "c-api"))]

use std::ffi::{c_int, c_void, CStr};
use std::sync::Arc;

use portalloc::adaptor::LedgerAllocator;
use portalloc::backends::hip::HipDevice;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator, Device, Error, Keep, Stream, Vendor};

use crate::support::fakes::{Fake, FakeDevice};
use crate::support::targets::{caller_stream, destroy_caller_streams};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const HOLD: &str = "rocm7-reservation-hold";

type Reserve = unsafe extern "C" fn(*mut *mut c_void, usize, usize, *mut c_void, u64) -> c_int;
type OnRange = unsafe extern "C" fn(*mut c_void, usize) -> c_int;

/// vmm over HipDevice over fakehip (ROCm 7) with `profile` set before the device opens.
/// Drops vmm, then the device, then the fake.
struct Subject {
    vmm: VmmAllocator<HipDevice>,
    device: Arc<HipDevice>,
    fake: Fake,
    granule: u64,
}

impl Subject {
    fn new(profile: &str, devices: i32, capacity: u64, limit: u64) -> Subject {
        let fake = Fake::with_devices(Vendor::Hip, devices, capacity);
        fake.set_profile(profile).unwrap();
        let device = Arc::new(<HipDevice as FakeDevice>::open(&fake, 0));
        let granule = device.virtual_memory().unwrap().granularity();
        let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(limit)).unwrap();
        Subject {
            vmm,
            device,
            fake,
            granule,
        }
    }

    fn free(&self) -> u64 {
        self.device.mem_info().unwrap().free
    }

    fn raw_reserve(&self, size: u64, hint: u64) -> u64 {
        let f: Reserve = self.fake.sym("hipMemAddressReserve");
        let mut va = std::ptr::null_mut();
        // SAFETY: one address written; the rest by value.
        let rc = unsafe { f(&mut va, size as usize, 0, hint as *mut c_void, 0) };
        assert_eq!(rc, 0, "raw hipMemAddressReserve");
        va as u64
    }

    fn raw_address_free(&self, va: u64, size: u64) {
        let f: OnRange = self.fake.sym("hipMemAddressFree");
        // SAFETY: by value.
        assert_eq!(unsafe { f(va as *mut c_void, size as usize) }, 0);
    }

    fn mapped(&self, a: &Allocation) -> bool {
        self.fake.access(a.ptr(), 0) == Some(true)
            && self.fake.access(a.ptr() + a.size() - 1, 0) == Some(true)
    }

    fn inv(&self, step: &str) {
        self.vmm
            .check_invariants()
            .unwrap_or_else(|e| panic!("invariants after {step}: {e}"));
    }
}

fn declare(tags: &[&str]) {
    for t in tags {
        portalloc::sleep_tags::declare_sleepable(t);
    }
}

/// A sleeping tag's freed range is taken by someone else (the caller's own raw reserve at the
/// sleeper's address): the wake must fail typed, naming the address, with nothing lost; an
/// allocation under the sleeping tag must still be served (elsewhere); once the range is
/// freed a wake must succeed.
#[test]
fn a_range_taken_meanwhile_fails_the_wake_and_not_the_allocations() {
    let s = Subject::new(HOLD, 1, 4 * GIB, 3 * GIB);
    declare(&["probe-a-w", "probe-a-kv"]);
    let start = s.free();
    let w: Vec<Allocation> = (0..8)
        .map(|_| {
            s.vmm
                .allocate(16 * MIB, 0, Stream::DEFAULT, "probe-a-w")
                .unwrap()
        })
        .collect();
    let kv: Vec<Allocation> = (0..4)
        .map(|_| {
            s.vmm
                .allocate(16 * MIB, 0, Stream::DEFAULT, "probe-a-kv")
                .unwrap()
        })
        .collect();
    let awake = s.free();
    s.vmm.sleep("probe-a-w", Keep::Contents).unwrap();
    s.inv("sleep");
    let asleep = s.free();
    eprintln!(
        "hold: free {} MiB awake, {} MiB asleep (rose {} MiB of 128)",
        awake / MIB,
        asleep / MIB,
        (asleep - awake) / MIB
    );
    let hint = w[0].ptr() / s.granule * s.granule;
    let got = s.raw_reserve(2 * MIB, hint);
    eprintln!("raw reserve at {hint:#x} got {got:#x}");
    assert_eq!(
        got, hint,
        "the sleeping region's range was freed, so the hint is honoured"
    );

    let woke = s.vmm.wake("probe-a-w");
    eprintln!("wake with the range taken: {woke:?}");
    s.inv("failed wake");
    assert!(woke.is_err(), "the wake cannot have its addresses");
    assert!(w.iter().all(|a| s.vmm.is_asleep(a)), "the tag stays asleep");
    let e = woke.unwrap_err();
    assert!(is_cannot_wake(&e) && e.is_out_of_memory(), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("could not be reserved again at the same address (the driver gave 0x")
            && text.contains("probe-a-w"),
        "names the address and the tag: {text}"
    );

    // Allocation under the sleeping tag while its region cannot be had again.
    let fresh = s.vmm.allocate(MIB, 0, Stream::DEFAULT, "probe-a-w");
    eprintln!("allocate 1 MiB under the sleeping tag, range taken: {fresh:?}");
    s.inv("allocate under sleeping tag");
    let fresh_ok = fresh.is_ok();
    let fresh = fresh.ok();

    s.raw_address_free(got, 2 * MIB);
    let woke = s.vmm.wake("probe-a-w");
    eprintln!("wake after the range was freed: {woke:?}");
    s.inv("wake");
    woke.unwrap();
    assert!(w.iter().all(|a| !s.vmm.is_asleep(a) && s.mapped(a)));
    assert_eq!(s.fake.hazards().0, 0, "{:?}", s.fake.hazards());
    for a in w.into_iter().chain(kv).chain(fresh) {
        s.vmm.deallocate(a).unwrap();
    }
    s.vmm.trim().unwrap();
    s.inv("trim");
    let end = s.free();
    eprintln!(
        "free at start {} MiB, at end {} MiB",
        start / MIB,
        end / MIB
    );
    assert_eq!(end, start, "free + trim gives everything back");
    assert!(
        fresh_ok,
        "an allocation under a sleeping tag failed while memory was plentiful"
    );
}

/// Memory the allocator holds free, in a segment a small live allocation keeps, under the hold
/// profile vs documented: does vmm run out where the documented profile would not?
#[test]
fn memory_stranded_in_a_live_segment_still_serves_requests() {
    let mut outcomes = Vec::new();
    for profile in ["documented", HOLD] {
        let s = Subject::new(profile, 1, 4 * GIB, GIB);
        let start = s.free();
        let big = s.vmm.allocate(200 * MIB, 0, Stream::DEFAULT, "").unwrap();
        let small = s.vmm.allocate(4 * MIB, 0, Stream::DEFAULT, "").unwrap();
        s.vmm.deallocate(big).unwrap();
        let r = s.vmm.allocate(900 * MIB, 0, Stream::DEFAULT, "");
        s.inv("pressure");
        let line = format!(
            "{profile}: 900 MiB after freeing 200 MiB next to a live 4 MiB (limit 1 GiB): {} \
             (driver free {} MiB of {} at start)",
            match &r {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("REFUSED: {e}"),
            },
            s.free() / MIB,
            start / MIB
        );
        eprintln!("{line}");
        outcomes.push((profile, r.is_ok(), line));
        if let Ok(a) = r {
            s.vmm.deallocate(a).unwrap();
        }
        s.vmm.deallocate(small).unwrap();
        s.vmm.trim().unwrap();
        assert_eq!(s.free(), start);
    }
    assert!(outcomes.iter().all(|(_, ok, _)| *ok), "{:#?}", outcomes);
}

/// Many declared tags, each keeping a small live allocation beside freed memory; budget near
/// full: the untagged request and trim, under both profiles.
#[test]
fn many_tags_near_the_budget_and_trim() {
    let tags: Vec<String> = (0..12).map(|i| format!("probe-many-{i}")).collect();
    for t in &tags {
        portalloc::sleep_tags::declare_sleepable(t);
    }
    let mut results = Vec::new();
    for profile in ["documented", HOLD] {
        let s = Subject::new(profile, 1, 4 * GIB, GIB);
        let start = s.free();
        let mut keep = Vec::new();
        for t in &tags {
            let big = s.vmm.allocate(60 * MIB, 0, Stream::DEFAULT, t).unwrap();
            keep.push(s.vmm.allocate(MIB, 0, Stream::DEFAULT, t).unwrap());
            s.vmm.deallocate(big).unwrap();
        }
        let held = start - s.free();
        let r = s.vmm.allocate(600 * MIB, 0, Stream::DEFAULT, "");
        let ok = r.is_ok();
        let msg = match &r {
            Ok(_) => "ok".into(),
            Err(e) => format!("REFUSED: {e}"),
        };
        if let Ok(a) = r {
            s.vmm.deallocate(a).unwrap();
        }
        s.inv("pressure");
        let before_trim = s.free();
        let trimmed = s.vmm.trim().unwrap();
        s.inv("trim");
        let after_trim = s.free();
        let line = format!(
            "{profile}: 12 tags x (60 MiB freed + 1 MiB live): driver holds {} MiB; 600 MiB untagged: {msg}; trim said {} MiB, driver free rose {} MiB (live is 12 MiB)",
            held / MIB,
            trimmed / MIB,
            (after_trim - before_trim) / MIB
        );
        eprintln!("{line}");
        results.push((ok, line));
        for a in keep {
            s.vmm.deallocate(a).unwrap();
        }
        s.vmm.trim().unwrap();
        assert_eq!(s.free(), start);
    }
    assert!(results.iter().all(|(ok, _)| *ok), "{results:#?}");
}

/// Kernels in flight on three caller streams through sleep and wake under the hold profile;
/// a stream destroyed while its allocation sleeps and its handle given to a new stream; a
/// second cycle; trim after sleep; a sleeper freed; a new allocation under the sleeping tag.
#[test]
fn kernels_on_three_streams_a_reused_handle_and_a_second_cycle() {
    let s = Subject::new(HOLD, 1, 4 * GIB, 3 * GIB);
    declare(&["probe-c-w", "probe-c-kv"]);
    let start = s.free();
    let streams: Vec<Stream> = (0..3).map(|_| caller_stream(&s.fake)).collect();
    let mut w = Vec::new();
    let mut kv = Vec::new();
    for i in 0..12 {
        let st = streams[i % 3];
        w.push(s.vmm.allocate(3 * MIB / 2, 0, st, "probe-c-w").unwrap());
        kv.push(s.vmm.allocate(3 * MIB / 2, 0, st, "probe-c-kv").unwrap());
    }
    let wbytes: u64 = w.iter().map(Allocation::size).sum();
    let mut kernels = Vec::new();
    for (i, a) in w.iter().enumerate() {
        kernels.push(s.fake.launch(streams[i % 3], a.ptr(), a.size()));
        kernels.push(s.fake.launch(streams[(i + 1) % 3], a.ptr(), a.size()));
    }
    for (i, a) in kv.iter().enumerate() {
        kernels.push(s.fake.launch(streams[(i + 2) % 3], a.ptr(), a.size()));
    }
    let awake = s.free();
    let r = s.vmm.sleep("probe-c-w", Keep::Contents).unwrap();
    s.inv("sleep");
    let asleep = s.free();
    eprintln!(
        "sleep 1: rose {} KiB of {} KiB (report device {} KiB); hazards {:?}",
        (asleep - awake) / KIB,
        wbytes / KIB,
        r.device_bytes / KIB,
        s.fake.hazards()
    );
    assert!((asleep - awake) as f64 >= 0.99 * wbytes as f64);
    // Trim after sleep changes nothing awake; the owner destroys stream 0 and makes another.
    let t = s.vmm.trim().unwrap();
    s.inv("trim after sleep");
    eprintln!("trim after sleep: {t} bytes; free {} MiB", s.free() / MIB);
    destroy_caller_streams(&s.fake, &streams[..1]);
    let reused = caller_stream(&s.fake);
    eprintln!("stream 0 {:?}, new {:?}", streams[0], reused);
    // A sleeper freed; a new allocation under the sleeping tag on the reused handle.
    let gone = w.remove(0);
    s.vmm.deallocate(gone).unwrap();
    s.inv("free a sleeper");
    let fresh = s.vmm.allocate(MIB, 0, reused, "probe-c-w").unwrap();
    s.inv("allocate under sleeping tag");
    assert!(!s.vmm.is_asleep(&fresh) && s.mapped(&fresh));
    let k2 = s.fake.launch(reused, fresh.ptr(), fresh.size());
    // kv still used on streams 1 and 2 while the wake runs.
    for (i, a) in kv.iter().enumerate() {
        s.fake.launch(streams[1 + i % 2], a.ptr(), a.size());
    }
    s.vmm.wake("probe-c-w").unwrap();
    s.inv("wake");
    assert!(w.iter().all(|a| !s.vmm.is_asleep(a) && s.mapped(a)));
    eprintln!("after wake 1: hazards {:?}", s.fake.hazards());
    // Second cycle, without contents, kernels still queued on the reused handle.
    s.fake.launch(reused, w[0].ptr(), w[0].size());
    let before2 = s.free();
    s.vmm.sleep("probe-c-w", Keep::Nothing).unwrap();
    s.inv("sleep 2");
    let wbytes2: u64 = w.iter().map(Allocation::size).sum::<u64>() + fresh.size();
    let rose2 = s.free() - before2;
    eprintln!("sleep 2: rose {} KiB of {} KiB", rose2 / KIB, wbytes2 / KIB);
    assert!(s.fake.kernel_done(k2));
    s.vmm.wake("probe-c-w").unwrap();
    s.inv("wake 2");
    assert!(w.iter().all(|a| s.mapped(a)) && s.mapped(&fresh));
    assert_eq!(s.fake.hazards(), (0, String::new()));
    assert!(
        rose2 as f64 >= 0.99 * wbytes2 as f64,
        "second sleep gave back too little"
    );
    for a in w.into_iter().chain(kv).chain([fresh]) {
        s.vmm.deallocate(a).unwrap();
    }
    s.vmm.trim().unwrap();
    assert_eq!(s.free(), start);
    destroy_caller_streams(&s.fake, &streams[1..]);
    destroy_caller_streams(&s.fake, &[reused]);
}

/// The caller's current device is unchanged by sleep, wake and trim under the hold profile
/// (two devices, the caller's on device 1).
#[test]
fn the_callers_device_is_kept() {
    let s = Subject::new(HOLD, 2, 2 * GIB, GIB);
    declare(&["probe-d"]);
    let a = s
        .vmm
        .allocate(5 * MIB, 0, Stream::DEFAULT, "probe-d")
        .unwrap();
    s.fake.set_current(1);
    s.vmm.sleep("probe-d", Keep::Contents).unwrap();
    assert_eq!(s.fake.current(), 1, "sleep");
    s.vmm.trim().unwrap();
    assert_eq!(s.fake.current(), 1, "trim");
    s.vmm.wake("probe-d").unwrap();
    assert_eq!(s.fake.current(), 1, "wake");
    s.vmm.deallocate(a).unwrap();
    s.vmm.trim().unwrap();
    assert_eq!(s.fake.current(), 1, "free + trim");
}

/// Donation under the hold profile: the donated buffer sleeps with the consumer's tag — does
/// the driver get its bytes back?
#[test]
fn a_donated_buffer_sleeps_with_its_new_tag() {
    for profile in ["documented", HOLD] {
        let s = Subject::new(profile, 1, 2 * GIB, GIB);
        declare(&["probe-e-giver", "probe-e-consumer"]);
        let Subject {
            vmm, device, fake, ..
        } = s;
        let ledger = LedgerAllocator::new(vmm);
        let given = ledger
            .allocate(8 * MIB, 0, Stream::DEFAULT, "probe-e-giver")
            .unwrap();
        let kept = ledger
            .allocate(8 * MIB, 0, Stream::DEFAULT, "probe-e-giver")
            .unwrap();
        let out = ledger.donate(given, "probe-e-consumer").unwrap();
        let before = device.mem_info().unwrap().free;
        let r = ledger.sleep("probe-e-consumer", Keep::Contents).unwrap();
        let after = device.mem_info().unwrap().free;
        eprintln!(
            "{profile}: donated 8 MiB slept under the consumer ({} allocations): driver free rose {} MiB",
            r.allocations,
            (after - before) / MIB
        );
        ledger.check_invariants().unwrap();
        assert_eq!(r.allocations, 1);
        if profile == "documented" {
            assert!(
                after - before >= 8 * MIB,
                "{profile}: the donated bytes went back"
            );
        }
        // (Under the hold, the buffer stays in the giver's segment, which the giver's awake
        // buffer keeps reserved: its memory goes back with that segment — see the docs.)
        ledger.wake("probe-e-consumer").unwrap();
        ledger.deallocate(out).unwrap();
        ledger.deallocate(kept).unwrap();
        drop(ledger);
        drop(device);
        drop(fake);
    }
}

/// fakehip's functions sleep and wake call.
const HIP_CALLS: &[&str] = &[
    "hipMemAddressReserve",
    "hipMemAddressFree",
    "hipMemCreate",
    "hipMemRelease",
    "hipMemMap",
    "hipMemUnmap",
    "hipMemSetAccess",
    "hipMemcpyDtoHAsync",
    "hipMemcpyHtoDAsync",
    "hipStreamSynchronize",
    "hipDeviceSynchronize",
    "hipStreamCreateWithFlags",
    "hipHostMalloc",
    "hipEventCreateWithFlags",
    "hipEventRecord",
    "hipEventSynchronize",
    "hipEventQuery",
];

/// One run: weights and kv over two segments; a fault on the `nth` call of `function` during
/// the sleep (phase 0) or the wake (phase 1). Returns the calls of each function the phase made.
fn fault_run(phase: u8, fault: Option<(&str, i64, i32)>) -> Vec<(&'static str, i64)> {
    let s = Subject::new(HOLD, 1, 4 * GIB, 3 * GIB);
    let what = format!("phase {phase} fault {fault:?}");
    let start = s.free();
    let mut w = Vec::new();
    let mut kv = Vec::new();
    for i in 0..6 {
        let size = if i % 2 == 0 { 200 * MIB } else { 3 * MIB / 2 };
        w.push(
            s.vmm
                .allocate(size, 0, Stream::DEFAULT, "probe-f-w")
                .unwrap(),
        );
        kv.push(
            s.vmm
                .allocate(size, 0, Stream::DEFAULT, "probe-f-kv")
                .unwrap(),
        );
    }
    let wbytes: u64 = w.iter().map(Allocation::size).sum();
    let counts = |f: &Fake| -> Vec<(&'static str, i64)> {
        HIP_CALLS.iter().map(|&n| (n, f.calls(n))).collect()
    };
    let arm = |on: u8| {
        if phase == on {
            if let Some((name, nth, code)) = fault {
                s.fake.fail(name, nth, 1, code);
            }
        }
    };
    let before = counts(&s.fake);
    arm(0);
    let awake_free = s.free();
    let slept = s.vmm.sleep("probe-f-w", Keep::Contents);
    s.fake.clear_faults();
    s.vmm
        .check_invariants()
        .unwrap_or_else(|e| panic!("{what}: invariants after sleep ({slept:?}): {e}"));
    let mut diff = counts(&s.fake);
    if slept.is_err() {
        let all_awake = w.iter().all(|a| !s.vmm.is_asleep(a) && s.mapped(a));
        let all_asleep = w.iter().all(|a| s.vmm.is_asleep(a));
        assert!(
            all_awake || all_asleep,
            "{what}: a failed sleep left some asleep, some awake: {slept:?}"
        );
        if !all_awake {
            eprintln!("{what}: failed sleep left the tag asleep: {slept:?}");
        }
    } else {
        let rose = s.free().saturating_sub(awake_free);
        assert!(
            rose as f64 >= 0.99 * wbytes as f64,
            "{what}: sleep ok but the driver got {rose} of {wbytes}"
        );
    }
    assert!(
        kv.iter().all(|a| !s.vmm.is_asleep(a) && s.mapped(a)),
        "{what}: kv"
    );
    let before_wake = counts(&s.fake);
    arm(1);
    let woke = s.vmm.wake("probe-f-w");
    s.fake.clear_faults();
    s.vmm
        .check_invariants()
        .unwrap_or_else(|e| panic!("{what}: invariants after wake ({woke:?}): {e}"));
    if phase == 1 {
        diff = counts(&s.fake);
        for (d, b) in diff.iter_mut().zip(&before_wake) {
            d.1 -= b.1;
        }
    } else {
        for (d, b) in diff.iter_mut().zip(&before) {
            d.1 -= b.1;
        }
    }
    if woke.is_err() {
        assert!(
            w.iter().all(|a| s.vmm.is_asleep(a)),
            "{what}: a failed wake left some awake: {woke:?}"
        );
        let again = s.vmm.wake("probe-f-w");
        s.vmm.check_invariants().unwrap();
        again.unwrap_or_else(|e| panic!("{what}: the wake after a failed one ({woke:?}): {e}"));
    }
    assert!(
        w.iter().all(|a| !s.vmm.is_asleep(a) && s.mapped(a)),
        "{what}: all awake and mapped at the end"
    );
    assert_eq!(s.fake.hazards().0, 0, "{what}: {:?}", s.fake.hazards());
    for a in w.into_iter().chain(kv) {
        s.vmm.deallocate(a).unwrap();
    }
    s.vmm.trim().unwrap();
    s.vmm.check_invariants().unwrap();
    let end = s.free();
    assert_eq!(
        end,
        start,
        "{what}: free + trim after ({slept:?} / {woke:?}) left {} KiB held",
        start.saturating_sub(end) / KIB
    );
    let Subject {
        vmm, device, fake, ..
    } = s;
    drop(vmm);
    drop(device);
    let held = fake.nonzero(crate::support::fakes::MEMORY);
    assert!(
        held.is_empty(),
        "{what}: after drop the driver holds {held:?}"
    );
    diff.into_iter().filter(|(_, n)| *n > 0).collect()
}

#[test]
fn a_fault_on_every_call_of_sleep_and_wake_loses_nothing() {
    declare(&["probe-f-w", "probe-f-kv"]);
    let mut runs = 0;
    let mut failures = Vec::new();
    for phase in [0u8, 1] {
        let calls = fault_run(phase, None);
        eprintln!("phase {phase}: calls {calls:?}");
        for (name, n) in calls {
            for nth in 1..=n.min(12) {
                let code = if name == "hipMemCreate" || name == "hipHostMalloc" {
                    2
                } else {
                    999
                };
                runs += 1;
                let r = std::panic::catch_unwind(|| {
                    fault_run(phase, Some((name, nth, code)));
                });
                if let Err(p) = r {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    failures.push(format!("phase {phase} {name} #{nth}: {msg}"));
                }
            }
        }
    }
    eprintln!("{runs} runs, {} failed", failures.len());
    for f in &failures {
        eprintln!("  {f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed",
        failures.len()
    );
}

// ---- the C ABI over the host backend -------------------------------------------------------

mod capi {
    use super::*;
    use crate::support::capi::{allocate, last_error, vmm_on_host};
    use portalloc::capi::*;
    use std::ptr;

    fn make() -> *mut PortallocAllocator {
        vmm_on_host(512 * MIB, 0.5)
    }

    fn alloc(a: *mut PortallocAllocator, size: u64, tag: &CStr) -> (u64, u64) {
        allocate(a, size, Some(tag)).unwrap()
    }

    fn pool(a: *mut PortallocAllocator) -> u64 {
        let mut s = PortallocStats::default();
        // SAFETY: valid output.
        assert_eq!(unsafe { portalloc_stats(a, &mut s) }, PortallocStatus::Ok);
        s.pool_bytes
    }

    /// A buffer used on a side stream (record_stream), freed: its free is deferred. The side
    /// stream's work is complete (the host device runs nothing asynchronously). Then trim:
    /// does the memory go back? And a sleep of a tag sharing its granule?
    #[test]
    fn a_deferred_free_goes_back_at_trim_and_sleep() {
        let a = make();
        // SAFETY: valid tag.
        unsafe { portalloc_declare_sleep_tag(c"probe-g".as_ptr()) };
        let (h, p) = alloc(a, 64 * MIB, c"probe-g");
        // SAFETY: a live buffer; stream 77 a caller's handle (the host accepts any).
        let st = unsafe { portalloc_record_stream(a, p as *mut c_void, 77) };
        assert_eq!(st, PortallocStatus::Ok);
        let held = pool(a);
        // SAFETY: a live handle.
        assert_eq!(unsafe { portalloc_free(a, h) }, PortallocStatus::Ok);
        let mut released = 0u64;
        // SAFETY: valid output.
        let st = unsafe { portalloc_trim(a, &mut released) };
        assert_eq!(st, PortallocStatus::Ok);
        let after_trim = pool(a);
        eprintln!(
            "deferred free of 64 MiB (side stream done), then trim: pool {} MiB -> {} MiB (trim said {} MiB)",
            held / MIB,
            after_trim / MIB,
            released / MIB
        );
        // SAFETY: ours.
        unsafe { portalloc_destroy(a) };
        // A sleep of the tag while a kept buffer shares granules with a deferred free (its
        // work complete), in a fresh allocator.
        let a = make();
        let (h1, _p1) = alloc(a, 3 * MIB, c"probe-g");
        let (h2, p2) = alloc(a, MIB, c"probe-g");
        // SAFETY: as above.
        unsafe { portalloc_record_stream(a, p2 as *mut c_void, 77) };
        // SAFETY: a live handle.
        unsafe { portalloc_free(a, h2) };
        let before_sleep = pool(a);
        // SAFETY: valid tag.
        let st = unsafe { portalloc_sleep(a, c"probe-g".as_ptr(), true) };
        assert_eq!(st, PortallocStatus::Ok, "{}", last_error());
        let after_sleep = pool(a);
        eprintln!(
            "sleep of 3 MiB beside a completed deferred free of 1 MiB: pool {} KiB -> {} KiB",
            before_sleep / KIB,
            after_sleep / KIB
        );
        // SAFETY: valid tag / handles.
        unsafe {
            assert_eq!(portalloc_wake(a, c"probe-g".as_ptr()), PortallocStatus::Ok);
            portalloc_free(a, h1);
            portalloc_trim(a, ptr::null_mut());
        }
        let end = pool(a);
        eprintln!("after freeing all and trim: pool {} KiB", end / KIB);
        // SAFETY: ours.
        unsafe { portalloc_destroy(a) };
        assert_eq!(
            after_trim,
            0,
            "trim after a deferred free whose work completed kept {} MiB",
            after_trim / MIB
        );
        assert!(
            before_sleep - after_sleep >= 4 * MIB,
            "the sleep gave back {} KiB; the tag's 3 MiB and the completed free's 1 MiB share 2 granules",
            (before_sleep - after_sleep) / KIB
        );
    }
}

/// A wake refused for want of memory or addresses, naming the tag.
fn is_cannot_wake(e: &Error) -> bool {
    matches!(e, Error::CannotWake { .. })
}

/// A free deferred by record_stream (the C ABI calls `freeing` and holds the buffer until the
/// next allocate or free settles it, even once its work completed) beside a sleeping tag's
/// buffer in the same segment, under the hold profile: does the sleep give the tag's bytes
/// back?
#[test]
fn a_sleep_beside_a_buffer_being_freed() {
    for profile in ["documented", HOLD] {
        let s = Subject::new(profile, 1, 2 * GIB, GIB);
        declare(&["probe-i"]);
        let kept = s
            .vmm
            .allocate(16 * MIB, 0, Stream::DEFAULT, "probe-i")
            .unwrap();
        let freeing = s
            .vmm
            .allocate(16 * MIB, 0, Stream::DEFAULT, "probe-i")
            .unwrap();
        s.vmm.freeing(&freeing);
        let before = s.free();
        s.vmm.sleep("probe-i", Keep::Contents).unwrap();
        let rose = s.free() - before;
        eprintln!(
            "{profile}: sleep of 16 MiB beside a 16 MiB buffer being freed (no work pending): driver free rose {} MiB",
            rose / MIB
        );
        assert!(
            profile != "documented" || rose >= 16 * MIB,
            "{profile}: the sleeping buffer's granules went back"
        );
        s.vmm.deallocate(freeing).unwrap();
        let t = s.vmm.trim().unwrap();
        assert!(
            s.free() - before >= 32 * MIB,
            "{profile}: once the free lands, trim gives its bytes back too"
        );
        eprintln!(
            "{profile}:   after the deferred free lands + trim ({} MiB): free rose {} MiB in all",
            t / MIB,
            (s.free() - before) / MIB
        );
        s.vmm.wake("probe-i").unwrap();
        s.inv("wake");
        s.vmm.deallocate(kept).unwrap();
    }
}

/// A wake under the hold profile while idle memory is stranded in a live segment: refused
/// where the documented profile wakes; and what does the failed wake leave mapped?
#[test]
fn a_wake_under_pressure() {
    declare(&["probe-h"]);
    let mut lines = Vec::new();
    for profile in ["documented", HOLD] {
        let s = Subject::new(profile, 1, 4 * GIB, GIB);
        let start = s.free();
        let h: Vec<Allocation> = (0..2)
            .map(|_| {
                s.vmm
                    .allocate(200 * MIB, 0, Stream::DEFAULT, "probe-h")
                    .unwrap()
            })
            .collect();
        s.vmm.sleep("probe-h", Keep::Contents).unwrap();
        let big = s.vmm.allocate(200 * MIB, 0, Stream::DEFAULT, "").unwrap();
        let small = s.vmm.allocate(4 * MIB, 0, Stream::DEFAULT, "").unwrap();
        s.vmm.deallocate(big).unwrap();
        let other = s.vmm.allocate(500 * MIB, 0, Stream::DEFAULT, "").unwrap();
        let before = s.free();
        let woke = s.vmm.wake("probe-h");
        s.inv("wake under pressure");
        let after = s.free();
        let line = format!(
            "{profile}: wake of 400 MiB with 204 MiB held (200 idle) + 500 MiB live, limit 1 GiB: {}; driver free {} MiB -> {} MiB",
            match &woke {
                Ok(_) => "ok".to_string(),
                Err(e) => format!("REFUSED {:.300}", format!("{e:?}")),
            },
            before / MIB,
            after / MIB
        );
        eprintln!("{line}");
        lines.push((woke.is_ok(), line));
        if woke.is_err() {
            assert!(h.iter().all(|a| s.vmm.is_asleep(a)));
        }
        s.vmm.deallocate(other).unwrap();
        s.vmm.deallocate(small).unwrap();
        s.vmm.wake("probe-h").unwrap();
        for a in h {
            s.vmm.deallocate(a).unwrap();
        }
        s.vmm.trim().unwrap();
        assert_eq!(s.free(), start);
    }
    assert!(lines.iter().all(|(ok, _)| *ok), "{lines:#?}");
}

/// gfx12 maps memory visible to GPU work only about 2 ms after the map returns
/// (ROCm/rocm-systems#11693): the HIP device says so for that architecture, and vmm waits once
/// per request that mapped granules — never for memory mapped already.
#[test]
fn new_mappings_wait_on_gfx12_only() {
    for (arch, waits) in [("gfx1201", true), ("gfx942:sramecc+:xnack-", false)] {
        let fake = Fake::with_devices(Vendor::Hip, 1, 2 * GIB);
        let set_arch: unsafe extern "C" fn(*const std::ffi::c_char) = fake.sym("fakehip_set_arch");
        let name = std::ffi::CString::new(arch).unwrap();
        // SAFETY: a control function of fakehip, a NUL-terminated name, before the device opens.
        unsafe { set_arch(name.as_ptr()) };
        let device = Arc::new(<HipDevice as FakeDevice>::open(&fake, 0));
        let vm = device.virtual_memory().unwrap();
        assert_eq!(!vm.map_visible_after().is_zero(), waits, "{arch}");
        assert!(
            device
                .info()
                .notes
                .iter()
                .any(|(k, v)| k == "new mappings" && v.contains("visible")),
            "{arch}: the note says it"
        );
        let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(GIB)).unwrap();
        let a = vmm.allocate(3 * MIB, 0, Stream::DEFAULT, "").unwrap();
        vmm.deallocate(a).unwrap();
        let b = vmm.allocate(3 * MIB, 0, Stream::DEFAULT, "").unwrap();
        assert_eq!(
            vmm.counters().map_waits,
            u64::from(waits),
            "{arch}: one wait, for the request that mapped"
        );
        vmm.deallocate(b).unwrap();
        drop(vmm);
        drop(device);
    }
}
