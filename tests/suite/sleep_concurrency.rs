//! Sleep and wake while other threads use the allocator: vmm's sleep/wake cycles against
//! threads that allocate, free and trim (the host backend with real memory, every sleeper's
//! bytes checked; fakehip as documented and under the ROCm 7 reservation hold, the driver's
//! free memory back at the end), and the C ABI's tag calls — refusals, donation then sleep,
//! an untagged buffer donated to a tag, sleeps racing allocations under a thread tag. Written
//! first by an outside review as probes.
#![cfg(feature = "c-api")]

use std::ffi::CStr;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use portalloc::capi::*;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator, Keep, Stream};

use crate::support::capi::{allocate, last_error, vmm_on_host};
use crate::support::common::host_device;

/// Tells the churning threads to stop when dropped: at the end of the main thread's part of a
/// scope, and also when that part panics (a panic in sleep or wake would otherwise leave the
/// threads churning and the scope waiting for them for ever: a hang instead of a failure).
struct StopOnDrop<'a>(&'a AtomicBool);

/// Most operations a churning thread makes before it stops of its own accord: the test ends
/// in bounded time even where the main thread's sleeps and wakes are starved of the lock (an
/// unfair mutex, a loaded machine) and the churners would otherwise run until they finish.
const CHURN_CAP: u32 = 20_000;

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

const MIB: u64 = 1 << 20;

fn pattern(seed: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8
}
fn write(a: &Allocation, seed: u8) {
    // SAFETY: live, mapped, real host memory, owned by this thread.
    let b = unsafe { std::slice::from_raw_parts_mut(a.ptr() as *mut u8, a.size() as usize) };
    for (i, x) in b.iter_mut().enumerate() {
        *x = pattern(seed, i);
    }
}
fn wrong(a: &Allocation, seed: u8) -> Option<usize> {
    // SAFETY: as in write.
    let b = unsafe { std::slice::from_raw_parts(a.ptr() as *const u8, a.size() as usize) };
    b.iter()
        .enumerate()
        .position(|(i, &x)| x != pattern(seed, i))
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Sleep/wake of one declared tag while three threads allocate and free (the same tag without
/// touching it, another declared tag and untagged with bytes checked) and one trims.
#[test]
fn concurrent_sleep_wake_churn_trim_host_real() {
    portalloc::sleep_tags::declare_sleepable("r2-w");
    portalloc::sleep_tags::declare_sleepable("r2-other");
    let d = host_device(1 << 30, false);
    let vmm = VmmAllocator::new(Arc::clone(&d), VmmOptions::new(900 * MIB)).unwrap();
    let sleepers: Vec<(Allocation, u8)> = (0..24u8)
        .map(|i| {
            let a = vmm
                .allocate(
                    [3 * MIB / 2, 200 * 1024, 5 * MIB + 7][i as usize % 3],
                    0,
                    Stream::DEFAULT,
                    "r2-w",
                )
                .unwrap();
            write(&a, i);
            (a, i)
        })
        .collect();
    let stop = AtomicBool::new(false);
    let errors = std::sync::Mutex::new(Vec::<String>::new());
    let cycles = AtomicU64::new(0);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for (n, tag) in ["r2-w", "r2-other", "", "r2-plain"].into_iter().enumerate() {
            let (vmm, stop, errors) = (&vmm, &stop, &errors);
            s.spawn(move || {
                let mut rng = Rng(0x9e37_79b9 + n as u64);
                let mut live: Vec<(Allocation, u8)> = Vec::new();
                for _ in 0..CHURN_CAP {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let r = rng.next();
                    if !live.is_empty() && r % 2 == 0 {
                        let (a, seed) = live.swap_remove((r as usize / 2) % live.len());
                        if tag != "r2-w" {
                            if let Some(at) = wrong(&a, seed) {
                                errors
                                    .lock()
                                    .unwrap()
                                    .push(format!("{tag}: byte {at} wrong"));
                            }
                        }
                        if let Err(e) = vmm.deallocate(a) {
                            errors.lock().unwrap().push(format!("{tag}: free {e}"));
                        }
                    } else {
                        let size = [4096, 300_000, 2 * MIB + 5, 9 * MIB][(r >> 8) as usize % 4];
                        match vmm.allocate(size, 0, Stream::DEFAULT, tag) {
                            Ok(a) => {
                                let seed = (r >> 16) as u8;
                                if tag != "r2-w" {
                                    write(&a, seed);
                                }
                                live.push((a, seed));
                            }
                            Err(e) => errors.lock().unwrap().push(format!("{tag}: alloc {e}")),
                        }
                    }
                    if r % 23 == 0 {
                        if let Err(e) = vmm.trim() {
                            errors.lock().unwrap().push(format!("trim {e}"));
                        }
                    }
                    if live.len() > 40 {
                        for (a, _) in live.drain(..20) {
                            vmm.deallocate(a).unwrap();
                        }
                    }
                }
                for (a, _) in live {
                    vmm.deallocate(a).unwrap();
                }
            });
        }
        for i in 0..60 {
            // Every sleep keeps the contents: the sleepers' bytes are checked at the end.
            if let Err(e) = vmm.sleep("r2-w", Keep::Contents) {
                errors.lock().unwrap().push(format!("sleep {i}: {e}"));
            }
            if let Err(e) = vmm.check_invariants() {
                errors
                    .lock()
                    .unwrap()
                    .push(format!("invariants after sleep {i}: {e}"));
            }
            if let Err(e) = vmm.wake("r2-w") {
                errors.lock().unwrap().push(format!("wake {i}: {e}"));
            }
            cycles.fetch_add(1, Ordering::Relaxed);
        }
    });
    vmm.check_invariants().unwrap();
    let errors = errors.into_inner().unwrap();
    eprintln!(
        "host real: {} cycles, errors: {:?}",
        cycles.load(Ordering::Relaxed),
        &errors[..errors.len().min(8)]
    );
    for (a, seed) in &sleepers {
        assert_eq!(wrong(a, *seed), None, "a sleeper lost bytes");
    }
    assert!(errors.is_empty(), "{errors:?}");
    let st = vmm.stats();
    assert_eq!(st.bytes_asleep, 0);
    for (a, _) in sleepers {
        vmm.deallocate(a).unwrap();
    }
    vmm.trim().unwrap();
    vmm.check_invariants().unwrap();
    let st = vmm.stats();
    eprintln!(
        "after free+trim: pool {} in use {}",
        st.pool_bytes, st.bytes_in_use
    );
    assert_eq!(st.pool_bytes, 0, "free + trim gives everything back");
}

/// The same churn over fakehip with the reservation hold: the driver's free memory at the end.
#[cfg(feature = "hip")]
#[test]
fn concurrent_sleep_wake_churn_trim_hold() {
    use crate::support::fakes::{Fake, FakeDevice};
    use portalloc::backends::hip::HipDevice;
    use portalloc::{Device, Vendor};
    for profile in ["documented", "rocm7-reservation-hold"] {
        let fake = Fake::with_devices(Vendor::Hip, 1, 4 << 30);
        fake.set_profile(profile).unwrap();
        let device = Arc::new(<HipDevice as FakeDevice>::open(&fake, 0));
        let start = device.mem_info().unwrap().free;
        portalloc::sleep_tags::declare_sleepable("r2h-w");
        portalloc::sleep_tags::declare_sleepable("r2h-o");
        {
            let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(3 << 30)).unwrap();
            let sleepers: Vec<Allocation> = (0..24)
                .map(|i| {
                    vmm.allocate(
                        [3 * MIB / 2, 200 * 1024, 40 * MIB][i % 3],
                        0,
                        Stream::DEFAULT,
                        "r2h-w",
                    )
                    .unwrap()
                })
                .collect();
            let stop = AtomicBool::new(false);
            let errors = std::sync::Mutex::new(Vec::<String>::new());
            std::thread::scope(|s| {
                let _stop = StopOnDrop(&stop);
                for (n, tag) in ["r2h-w", "r2h-o", ""].into_iter().enumerate() {
                    let (vmm, stop, errors) = (&vmm, &stop, &errors);
                    s.spawn(move || {
                        let mut rng = Rng(0x1234_5678 + n as u64);
                        let mut live: Vec<Allocation> = Vec::new();
                        for _ in 0..CHURN_CAP {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            let r = rng.next();
                            if !live.is_empty() && r % 2 == 0 {
                                let a = live.swap_remove((r as usize / 2) % live.len());
                                if let Err(e) = vmm.deallocate(a) {
                                    errors.lock().unwrap().push(format!("{tag}: free {e}"));
                                }
                            } else {
                                let size =
                                    [4096, 300_000, 2 * MIB + 5, 70 * MIB][(r >> 8) as usize % 4];
                                match vmm.allocate(size, 0, Stream::DEFAULT, tag) {
                                    Ok(a) => live.push(a),
                                    Err(e) => {
                                        errors.lock().unwrap().push(format!("{tag}: alloc {e}"))
                                    }
                                }
                            }
                            if r % 17 == 0 {
                                if let Err(e) = vmm.trim() {
                                    errors.lock().unwrap().push(format!("trim {e}"));
                                }
                            }
                            if live.len() > 12 {
                                for a in live.drain(..6) {
                                    vmm.deallocate(a).unwrap();
                                }
                            }
                        }
                        for a in live {
                            vmm.deallocate(a).unwrap();
                        }
                    });
                }
                for i in 0..40 {
                    if let Err(e) = vmm.sleep("r2h-w", Keep::Contents) {
                        errors.lock().unwrap().push(format!("sleep {i}: {e}"));
                    }
                    if let Err(e) = vmm.check_invariants() {
                        errors
                            .lock()
                            .unwrap()
                            .push(format!("invariants after sleep {i}: {e}"));
                    }
                    if let Err(e) = vmm.wake("r2h-w") {
                        errors.lock().unwrap().push(format!("wake {i}: {e}"));
                    }
                }
            });
            vmm.check_invariants().unwrap();
            let errors = errors.into_inner().unwrap();
            eprintln!(
                "{profile}: errors {:?} hazards {:?}",
                &errors[..errors.len().min(8)],
                fake.hazards()
            );
            for a in sleepers {
                vmm.deallocate(a).unwrap();
            }
            let t = vmm.trim().unwrap();
            vmm.check_invariants().unwrap();
            let end = device.mem_info().unwrap().free;
            eprintln!(
                "{profile}: trim {} MiB; driver free start {} MiB, after free+trim {} MiB (stats pool {})",
                t / MIB,
                start / MIB,
                end / MIB,
                vmm.stats().pool_bytes
            );
            assert!(errors.is_empty(), "{profile}: {errors:?}");
            assert_eq!(
                end, start,
                "{profile}: free + trim gives back everything not in use"
            );
        }
    }
}

fn make(cap: u64) -> *mut PortallocAllocator {
    vmm_on_host(cap, 0.9)
}

fn alloc(a: *mut PortallocAllocator, size: u64, tag: Option<&CStr>) -> Result<(u64, u64), String> {
    allocate(a, size, tag)
}

fn sleep_stats(a: *mut PortallocAllocator) -> (u64, u64, u64) {
    let (mut x, mut y) = (0, 0);
    // SAFETY: valid.
    let st = unsafe { portalloc_sleep_stats(a, &mut x, &mut y) };
    assert_eq!(st, PortallocStatus::Ok);
    let mut s = PortallocStats::default();
    // SAFETY: valid.
    assert_eq!(unsafe { portalloc_stats(a, &mut s) }, PortallocStatus::Ok);
    (x, y, s.pool_bytes)
}

#[test]
fn capi_tag_refusals() {
    let long = std::ffi::CString::new("x".repeat(1025)).unwrap();
    let exact = std::ffi::CString::new("y".repeat(1024)).unwrap();
    let bad_utf8 = c"\xff\xfe";
    // SAFETY: NUL-terminated or null throughout.
    unsafe {
        for (name, f) in [
            (
                "declare",
                portalloc_declare_sleep_tag
                    as unsafe extern "C" fn(*const std::ffi::c_char) -> PortallocStatus,
            ),
            ("thread", portalloc_set_thread_tag),
            ("process", portalloc_set_process_tag),
        ] {
            for (what, t) in [
                ("null", ptr::null()),
                ("empty", c"".as_ptr()),
                ("1025", long.as_ptr()),
                ("1024", exact.as_ptr()),
                ("bad utf8", bad_utf8.as_ptr()),
            ] {
                let st = f(t);
                eprintln!(
                    "{name}({what}) -> {st:?}: {}",
                    if st == PortallocStatus::Ok {
                        String::new()
                    } else {
                        last_error()
                    }
                );
            }
        }
        portalloc_set_thread_tag(ptr::null());
        portalloc_set_process_tag(ptr::null());
        let a = make(256 * MIB);
        // sleep/wake with bad tags
        for (what, t) in [
            ("null", ptr::null()),
            ("empty", c"".as_ptr()),
            ("1025", long.as_ptr()),
        ] {
            let st = portalloc_sleep(a, t, true);
            eprintln!(
                "sleep({what}) -> {st:?}: {}",
                if st == PortallocStatus::Ok {
                    String::new()
                } else {
                    last_error()
                }
            );
        }
        // allocate with a 1025-byte tag: does allocate have the same bound?
        let r = alloc(a, MIB, Some(&long));
        eprintln!(
            "allocate with 1025-byte tag: {:?}",
            r.as_ref().map(|_| "ok").map_err(|e| &e[..e.len().min(150)])
        );
        portalloc_destroy(a);
    }
}

/// Donation, then sleep, then free of the donated and of the old handle; trim after sleep;
/// sleep_stats.
#[test]
fn capi_donation_sleep_free_and_trim() {
    let a = make(512 * MIB);
    // SAFETY: valid pointers throughout.
    unsafe {
        portalloc_declare_sleep_tag(c"r2c-w".as_ptr());
        portalloc_declare_sleep_tag(c"r2c-out".as_ptr());
        let (h, p) = alloc(a, 6 * MIB, Some(c"r2c-w")).unwrap();
        std::ptr::write_bytes(p as *mut u8, 0xab, (6 * MIB) as usize);
        let mut h2 = 0u64;
        assert_eq!(
            portalloc_donate(a, h, c"r2c-out".as_ptr(), &mut h2),
            PortallocStatus::Ok,
            "{}",
            last_error()
        );
        let before = sleep_stats(a);
        assert_eq!(
            portalloc_sleep(a, c"r2c-out".as_ptr(), true),
            PortallocStatus::Ok,
            "{}",
            last_error()
        );
        let after = sleep_stats(a);
        let mut rel = 0;
        assert_eq!(portalloc_trim(a, &mut rel), PortallocStatus::Ok);
        let trimmed = sleep_stats(a);
        eprintln!("donated: before {before:?} after sleep {after:?} after trim {trimmed:?} (trim released {rel})");
        assert_eq!(after.0, 6 * MIB);
        let st_old = portalloc_free(a, h);
        eprintln!(
            "free old handle while donated one sleeps: {st_old:?} {}",
            last_error()
        );
        assert_eq!(st_old, PortallocStatus::InvalidHandle);
        assert_eq!(
            sleep_stats(a).0,
            6 * MIB,
            "a refused free must leave the sleeper"
        );
        assert_eq!(
            portalloc_free(a, h2),
            PortallocStatus::Ok,
            "{}",
            last_error()
        );
        let end = sleep_stats(a);
        eprintln!("after free of the sleeping donated handle: {end:?}");
        assert_eq!((end.0, end.1), (0, 0));
        assert_eq!(portalloc_trim(a, &mut rel), PortallocStatus::Ok);
        assert_eq!(sleep_stats(a).2, 0);
        assert_eq!(
            portalloc_wake(a, c"r2c-out".as_ptr()),
            PortallocStatus::Ok,
            "{}",
            last_error()
        );
        portalloc_destroy(a);
    }
}

/// An untagged buffer donated to a declared tag: does it sleep with its new tag?
#[test]
fn capi_untagged_donated_sleeps_with_new_tag() {
    let a = make(512 * MIB);
    // SAFETY: valid pointers throughout.
    unsafe {
        portalloc_declare_sleep_tag(c"r2u-out".as_ptr());
        let (h, _) = alloc(a, 4 * MIB, Some(c"")).unwrap();
        let mut h2 = 0u64;
        assert_eq!(
            portalloc_donate(a, h, c"r2u-out".as_ptr(), &mut h2),
            PortallocStatus::Ok
        );
        assert_eq!(
            portalloc_sleep(a, c"r2u-out".as_ptr(), true),
            PortallocStatus::Ok
        );
        let s = sleep_stats(a);
        eprintln!("untagged donated to r2u-out, sleep(r2u-out): {s:?}");
        portalloc_destroy(a);
        assert_eq!(s.0, 4 * MIB, "the donated buffer sleeps with its new tag");
    }
}

/// Sleep of a tag while another thread allocates under it (thread tag) and frees, many times.
#[test]
fn capi_sleep_races_allocations_under_the_tag() {
    let a = make(1 << 30) as usize;
    let stop = AtomicBool::new(false);
    let errors = std::sync::Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for n in 0..2 {
            let (stop, errors) = (&stop, &errors);
            s.spawn(move || {
                let a = a as *mut PortallocAllocator;
                // SAFETY: valid tag.
                unsafe { portalloc_set_thread_tag(c"r2r-w".as_ptr()) };
                let mut live = Vec::new();
                let mut i = 0u64;
                for _ in 0..CHURN_CAP {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    i += 1;
                    match alloc(a, [4096, 3 * MIB / 2, 6 * MIB][(i + n) as usize % 3], None) {
                        Ok((h, _)) => live.push(h),
                        Err(e) => errors.lock().unwrap().push(format!("alloc {e}")),
                    }
                    if live.len() > 8 {
                        let h = live.remove(0);
                        // SAFETY: valid.
                        let st = unsafe { portalloc_free(a, h) };
                        if st != PortallocStatus::Ok {
                            errors
                                .lock()
                                .unwrap()
                                .push(format!("free {st:?} {}", last_error()));
                        }
                    }
                }
                for h in live {
                    // SAFETY: valid.
                    unsafe { portalloc_free(a, h) };
                }
                // SAFETY: null clears.
                unsafe { portalloc_set_thread_tag(ptr::null()) };
            });
        }
        let a = a as *mut PortallocAllocator;
        for i in 0..300 {
            // SAFETY: valid.
            unsafe {
                let st = portalloc_sleep(a, c"r2r-w".as_ptr(), i % 2 == 0);
                if st != PortallocStatus::Ok {
                    errors
                        .lock()
                        .unwrap()
                        .push(format!("sleep {st:?} {}", last_error()));
                }
                let mut rel = 0;
                portalloc_trim(a, &mut rel);
                let st = portalloc_wake(a, c"r2r-w".as_ptr());
                if st != PortallocStatus::Ok {
                    errors
                        .lock()
                        .unwrap()
                        .push(format!("wake {st:?} {}", last_error()));
                }
            }
        }
    });
    let a = a as *mut PortallocAllocator;
    let s = sleep_stats(a);
    let mut rel = 0;
    // SAFETY: valid.
    unsafe { portalloc_trim(a, &mut rel) };
    let t = sleep_stats(a);
    let errs = errors.into_inner().unwrap();
    eprintln!(
        "race: {} errors {:?}; stats {s:?}; after trim {t:?}",
        errs.len(),
        &errs[..errs.len().min(5)]
    );
    // SAFETY: valid.
    unsafe { portalloc_destroy(a) };
    assert!(errs.is_empty());
    assert_eq!(t, (0, 0, 0));
}
