//! Executable specification of sleep and wake (`VmmAllocator::sleep` / `wake`): a tag's
//! device memory handed back and taken again at the same addresses, from the caller's side —
//! real host memory written and read back through the pointers the caller holds, the memory
//! really unmapped while it sleeps (a read faults, in a child process), kernels in flight
//! over it, the caller's current device checked around each call on the conformance
//! drivers, and a fault on every device call of a sleep and a wake with nothing lost.

use std::sync::{Arc, Mutex};

use portalloc::adaptor::{Call, DeviceWrapper, LedgerAllocator};
use portalloc::backends::host::HostDevice;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator, Device, Error, Keep, Stream};
use test_case::test_case;

use crate::support::common::host_device;
#[cfg(feature = "hip")]
use crate::support::targets::Rocm;
use crate::support::targets::Target;

const MIB: u64 = 1 << 20;

/// The byte at `i` of the pattern of allocation `seed`.
fn pattern(seed: u8, i: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8
}

/// Writes the pattern `seed` into `a` (real host memory of the host backend).
fn write(a: &Allocation, seed: u8) {
    // SAFETY: `a` is a live allocation of a host device with real memory, mapped with access,
    // `a.size()` bytes long, and no other thread uses it.
    let bytes = unsafe { std::slice::from_raw_parts_mut(a.ptr() as *mut u8, a.size() as usize) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = pattern(seed, i);
    }
}

/// The first byte of `a` that does not hold the pattern `seed`, if any.
fn first_wrong(a: &Allocation, seed: u8) -> Option<usize> {
    // SAFETY: as in `write`: live, mapped with access, `a.size()` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(a.ptr() as *const u8, a.size() as usize) };
    bytes
        .iter()
        .enumerate()
        .position(|(i, &b)| b != pattern(seed, i))
}

/// A vmm allocator with budget `limit` over a host device with real memory of `capacity`.
fn real_vmm(capacity: u64, limit: u64) -> (Arc<HostDevice>, VmmAllocator<HostDevice>) {
    let d = host_device(capacity, false);
    let a = VmmAllocator::new(Arc::clone(&d), VmmOptions::new(limit)).unwrap();
    (d, a)
}

/// The sequence of the feature's "done when", in Rust: two tags written, one put to sleep
/// with its contents, the device filled so that its wake fails and loses nothing, then the
/// wake at the same address with the same bytes, and a KV cache discarded and woken.
#[test]
fn weights_sleep_and_wake_at_the_same_address_with_the_same_bytes() {
    let (device, vmm) = real_vmm(256 * MIB, 192 * MIB);
    let weights = vmm
        .allocate(64 * MIB, 0, Stream::DEFAULT, "weights")
        .unwrap();
    let kv = vmm.allocate(32 * MIB, 0, Stream::DEFAULT, "kv").unwrap();
    write(&weights, 1);
    write(&kv, 2);
    let held = vmm.stats().pool_bytes;

    let report = vmm.sleep("weights", Keep::Contents).unwrap();
    assert_eq!(
        (report.allocations, report.bytes, report.copied_bytes),
        (1, 64 * MIB, 64 * MIB)
    );
    let s = vmm.stats();
    assert!(
        s.pool_bytes + 64 * MIB <= held,
        "pool {} after the sleep, {held} before",
        s.pool_bytes
    );
    assert_eq!(report.device_bytes, held - s.pool_bytes);
    assert_eq!(
        (s.bytes_in_use, s.bytes_asleep, s.host_bytes_asleep),
        (32 * MIB, 64 * MIB, 64 * MIB)
    );
    assert!(vmm.is_asleep(&weights) && !vmm.is_asleep(&kv));
    assert_eq!(first_wrong(&kv, 2), None, "kv changed while weights slept");
    vmm.check_invariants().unwrap();

    // The device filled: the wake cannot have its memory, and loses nothing.
    let mut filler = Vec::new();
    while let Ok(a) = vmm.allocate(8 * MIB, 0, Stream::DEFAULT, "filler") {
        filler.push(a);
    }
    assert!(!filler.is_empty());
    let e = vmm.wake("weights").unwrap_err();
    assert!(
        matches!(&e, Error::CannotWake { tag, needed, .. } if tag == "weights" && *needed == 64 * MIB),
        "{e:?}"
    );
    assert!(e.is_out_of_memory());
    let text = e.to_string();
    assert!(
        text.contains("\"weights\"") && text.contains("stays asleep"),
        "{text}"
    );
    assert!(vmm.is_asleep(&weights));
    assert_eq!(vmm.sleeping().len(), 1);
    assert_eq!(vmm.stats().bytes_asleep, 64 * MIB);
    vmm.check_invariants().unwrap();

    for a in filler {
        vmm.deallocate(a).unwrap();
    }
    let ptr = weights.ptr();
    let report = vmm.wake("weights").unwrap();
    assert_eq!((report.allocations, report.copied_bytes), (1, 64 * MIB));
    assert_eq!(weights.ptr(), ptr);
    assert!(!vmm.is_asleep(&weights));
    assert_eq!(
        first_wrong(&weights, 1),
        None,
        "weights lost bytes across sleep and wake"
    );
    assert_eq!(first_wrong(&kv, 2), None);
    let s = vmm.stats();
    assert_eq!(
        (s.bytes_in_use, s.bytes_asleep, s.host_bytes_asleep),
        (96 * MIB, 0, 0)
    );
    vmm.check_invariants().unwrap();

    // A KV cache: discarded, then woken (its bytes are whatever the new memory holds).
    let report = vmm.sleep("kv", Keep::Nothing).unwrap();
    assert_eq!((report.allocations, report.copied_bytes), (1, 0));
    assert_eq!(vmm.stats().host_bytes_asleep, 0);
    vmm.wake("kv").unwrap();
    write(&kv, 3);
    assert_eq!(first_wrong(&kv, 3), None);
    assert_eq!(first_wrong(&weights, 1), None);

    vmm.deallocate(weights).unwrap();
    vmm.deallocate(kv).unwrap();
    vmm.check_invariants().unwrap();
    drop(vmm);
    assert!(device.census().is_empty(), "{:?}", device.census());
}

/// What a sleep or wake does when there is nothing to do, a freed sleeper, a new allocation
/// under a sleeping tag, and the strategies without virtual memory.
#[test]
fn the_rules_of_sleep_and_wake() {
    let (device, vmm) = real_vmm(64 * MIB, 48 * MIB);
    // Nothing carries the tag: nothing to do, either way.
    assert_eq!(vmm.sleep("weights", Keep::Contents).unwrap().allocations, 0);
    assert_eq!(vmm.wake("weights").unwrap().allocations, 0);
    let a = vmm
        .allocate(4 * MIB, 0, Stream::DEFAULT, "weights")
        .unwrap();
    write(&a, 7);
    // Waking an awake tag, sleeping a sleeping one: nothing to do.
    assert_eq!(vmm.wake("weights").unwrap().allocations, 0);
    assert_eq!(vmm.sleep("weights", Keep::Contents).unwrap().allocations, 1);
    assert_eq!(vmm.sleep("weights", Keep::Contents).unwrap().allocations, 0);
    // A new allocation with a sleeping tag is awake; the next sleep takes it too.
    let b = vmm
        .allocate(4 * MIB, 0, Stream::DEFAULT, "weights")
        .unwrap();
    assert!(vmm.is_asleep(&a) && !vmm.is_asleep(&b));
    write(&b, 8);
    assert_eq!(vmm.sleep("weights", Keep::Contents).unwrap().allocations, 1);
    assert_eq!(vmm.sleeping()[0].allocations, 2);
    assert_eq!(vmm.wake("weights").unwrap().allocations, 2);
    assert_eq!((first_wrong(&a, 7), first_wrong(&b, 8)), (None, None));
    // Freeing a sleeping allocation releases its range and its host copy.
    vmm.sleep("weights", Keep::Contents).unwrap();
    assert_eq!(vmm.stats().host_bytes_asleep, 8 * MIB);
    vmm.deallocate(a).unwrap();
    assert_eq!(vmm.stats().host_bytes_asleep, 4 * MIB);
    vmm.check_invariants().unwrap();
    // Untagged allocations are never put to sleep by a tag.
    let c = vmm.allocate(MIB, 0, Stream::DEFAULT, "").unwrap();
    assert_eq!(vmm.sleep("", Keep::Contents).unwrap().allocations, 0);
    vmm.wake("weights").unwrap();
    assert_eq!(first_wrong(&b, 8), None);
    vmm.deallocate(b).unwrap();
    vmm.deallocate(c).unwrap();
    drop(vmm);
    assert!(device.census().is_empty(), "{:?}", device.census());
}

/// Strategies that do not map memory into reserved ranges refuse sleep and wake, naming
/// themselves (as vmm's refusals name "strategy `vmm`") — not the backend, which offers sleep
/// through vmm — and the strategy that offers it.
#[test_case("bfc" ; "bfc")]
#[test_case("platform" ; "platform")]
#[test_case("async" ; "async")]
fn strategies_without_virtual_memory_refuse_sleep(strategy: &str) {
    let device = host_device(64 * MIB, true);
    let a: Box<dyn Allocator> = match strategy {
        "bfc" => Box::new(crate::support::common::bfc(&device, 32 * MIB, false)),
        "platform" => Box::new(portalloc::strategy::platform::PlatformAllocator::new(
            Arc::clone(&device),
            None,
        )),
        _ => Box::new(
            portalloc::strategy::async_pool::AsyncPoolAllocator::new(
                Arc::clone(&device),
                portalloc::strategy::async_pool::AsyncOptions::new(32 * MIB),
            )
            .unwrap(),
        ),
    };
    for e in [
        a.sleep("weights", Keep::Contents).unwrap_err(),
        a.wake("weights").unwrap_err(),
    ] {
        let text = e.to_string();
        // The strategy refuses, not the backend: the host backend offers sleep through vmm.
        match &e {
            Error::StrategyUnsupported { strategy: s, .. } => assert_eq!(s, a.name()),
            other => panic!("expected StrategyUnsupported, got {other:?}"),
        }
        assert!(
            text.contains(&format!("strategy `{}`", a.name())) && text.contains("vmm strategy"),
            "{text}"
        );
        assert!(!text.contains("backend"), "{text}");
    }
}

/// While it sleeps, the memory is not mapped: a read through the pointer the caller still
/// holds faults. Checked in a child process (this test, run again alone), which must die of
/// the fault.
#[test]
fn sleeping_memory_is_unmapped_and_a_read_faults() {
    const CHILD: &str = "PORTALLOC_TEST_SLEEP_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let (_device, vmm) = real_vmm(64 * MIB, 32 * MIB);
        let a = vmm
            .allocate(4 * MIB, 0, Stream::DEFAULT, "weights")
            .unwrap();
        write(&a, 5);
        vmm.sleep("weights", Keep::Contents).unwrap();
        // SAFETY: none: this read is meant to fault (the child's whole purpose); the
        // address is the allocation's, reserved and unmapped.
        let byte = unsafe { std::ptr::read_volatile(a.ptr() as *const u8) };
        println!("the read of sleeping memory returned {byte}");
        std::process::exit(0);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sleep::sleeping_memory_is_unmapped_and_a_read_faults",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(
            out.status.signal(),
            Some(libc::SIGSEGV) | Some(libc::SIGBUS)
        ),
        "the child read sleeping memory without a fault ({:?}): {text}",
        out.status
    );
}

/// On every target with virtual memory: a kernel of the caller's in flight over the
/// allocation when sleep is called is waited for before anything is unmapped (no hazard),
/// the caller's current context or device is the same after each call, the ledger marks the
/// sleeper, and the wake gives the same pointer.
#[test_case(Target::HostReal ; "host real")]
#[test_case(Target::HostSimulated ; "host simulated")]
#[cfg_attr(feature = "cuda", test_case(Target::FakeCuda ; "fakecuda"))]
#[cfg_attr(feature = "hip", test_case(Target::FakeHip(Rocm::V7) ; "fakehip rocm7"))]
fn sleep_waits_for_kernels_in_flight_and_keeps_the_callers_device(target: Target) {
    let Some(rig) = target.open(1, 256 * MIB) else {
        return;
    };
    {
        let device = rig.device(0);
        let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(128 * MIB)).unwrap();
        let ledger = LedgerAllocator::new(vmm);
        let stream = rig.foreign_stream();
        let weights = ledger.allocate(16 * MIB, 0, stream, "weights").unwrap();
        let kv = ledger.allocate(8 * MIB, 0, stream, "kv").unwrap();
        let work = rig.launch(stream, weights.ptr(), weights.size());
        let probe = rig.caller_probe();
        let around = |call: &str, f: &mut dyn FnMut()| match &probe {
            Some(p) => p.around(call, f),
            None => f(),
        };
        around("sleep", &mut || {
            ledger.sleep("weights", Keep::Contents).unwrap();
        });
        assert!(
            rig.work_done(work),
            "{target:?}: sleep did not wait for the kernel"
        );
        let live = ledger.live();
        let asleep: Vec<_> = live.iter().map(|a| (a.tag.as_str(), a.asleep)).collect();
        assert_eq!(asleep, [("weights", true), ("kv", false)], "{target:?}");
        assert_eq!(ledger.snapshot().sleeping[0].tag, "weights");
        ledger.check_invariants().unwrap();
        let ptr = weights.ptr();
        around("wake", &mut || {
            ledger.wake("weights").unwrap();
        });
        assert_eq!(weights.ptr(), ptr);
        assert!(!ledger.is_asleep(&weights));
        ledger.check_invariants().unwrap();
        ledger.deallocate(weights).unwrap();
        ledger.deallocate(kv).unwrap();
        drop(ledger);
        rig.destroy_foreign(&[stream]);
    }
    rig.finish();
}

/// The driver error the fault-injecting wrappers return for `call`.
fn injected(call: &'static str) -> Error {
    Error::Driver {
        backend: "host",
        call,
        code: 999,
        name: "INJECTED_FAULT".into(),
        message: "injected by the test".into(),
    }
}

/// Fails the `fail_at`-th device call (counted while armed), once.
#[derive(Debug)]
struct FaultAt {
    inner: Arc<HostDevice>,
    state: Mutex<(bool, u64, u64)>,
}

impl FaultAt {
    fn arm(&self, fail_at: u64) {
        *self.state.lock().unwrap() = (true, 0, fail_at);
    }
    fn disarm(&self) -> u64 {
        let mut s = self.state.lock().unwrap();
        s.0 = false;
        s.1
    }
}

impl DeviceWrapper for FaultAt {
    type Inner = HostDevice;
    fn wrapped(&self) -> &HostDevice {
        &self.inner
    }
    fn before(&self, call: &Call<'_>) -> portalloc::Result<()> {
        let mut s = self.state.lock().unwrap();
        if !s.0 {
            return Ok(());
        }
        s.1 += 1;
        if s.1 == s.2 {
            return Err(injected(call.name()));
        }
        Ok(())
    }
}

/// A fault on every device call of a sleep, then of a wake: after each, the books hold, and
/// nothing is lost — a failed sleep leaves the allocations awake with their bytes, a failed
/// wake leaves them asleep, and the next wake (with no fault) restores every byte at the
/// same addresses. Once with whole allocations copied at once, once in pieces of a granule
/// (the 6 MiB one copied, unmapped, backed and filled in three turns, a fault between any
/// two).
#[test_case(portalloc::strategy::vmm::DEFAULT_COPY_PIECE ; "copied whole")]
#[test_case(2 * MIB ; "copied a granule at a time")]
fn a_fault_on_every_call_of_sleep_and_wake_loses_nothing(copy_piece: u64) {
    let run = |phase: u8, fail_at: u64| -> u64 {
        let host = host_device(128 * MIB, false);
        let device = Arc::new(FaultAt {
            inner: Arc::clone(&host),
            state: Mutex::new((false, 0, 0)),
        });
        let options = VmmOptions {
            copy_piece,
            ..VmmOptions::new(64 * MIB)
        };
        let vmm = VmmAllocator::new(Arc::clone(&device), options).unwrap();
        let a = vmm
            .allocate(6 * MIB, 0, Stream::DEFAULT, "weights")
            .unwrap();
        let b = vmm.allocate(MIB, 0, Stream::DEFAULT, "weights").unwrap();
        let c = vmm.allocate(3 * MIB, 0, Stream::DEFAULT, "kv").unwrap();
        for (x, seed) in [(&a, 1), (&b, 2), (&c, 3)] {
            write(x, seed);
        }
        let step = |what: &str| {
            if phase == 0 {
                device.arm(fail_at);
            }
            let r = vmm.sleep("weights", Keep::Contents);
            let calls = device.disarm();
            vmm.check_invariants()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            (r, calls)
        };
        let (slept, mut calls) = step("sleep");
        if slept.is_err() {
            // A failed sleep: awake, every byte where it was.
            assert!(
                !vmm.is_asleep(&a) && !vmm.is_asleep(&b),
                "call {fail_at}: {slept:?}"
            );
            for (x, seed) in [(&a, 1), (&b, 2), (&c, 3)] {
                assert_eq!(first_wrong(x, seed), None, "call {fail_at}: {slept:?}");
            }
        }
        if phase == 1 {
            device.arm(fail_at);
        }
        let woke = vmm.wake("weights");
        calls = if phase == 1 { device.disarm() } else { calls };
        vmm.check_invariants().unwrap();
        if woke.is_err() {
            assert!(
                vmm.is_asleep(&a) && vmm.is_asleep(&b),
                "call {fail_at}: {woke:?}"
            );
            vmm.wake("weights").unwrap();
        }
        assert!(!vmm.is_asleep(&a) && !vmm.is_asleep(&b));
        for (x, seed) in [(&a, 1), (&b, 2), (&c, 3)] {
            assert_eq!(
                first_wrong(x, seed),
                None,
                "phase {phase}, call {fail_at}: {slept:?} / {woke:?}"
            );
        }
        for x in [a, b, c] {
            vmm.deallocate(x).unwrap();
        }
        drop(vmm);
        assert!(
            host.census().is_empty(),
            "call {fail_at}: {:?}",
            host.census()
        );
        calls
    };
    for phase in [0u8, 1] {
        // The calls of the step without a fault, then a fault on each.
        let calls = run(phase, 0);
        assert!(calls > 3, "phase {phase}: only {calls} device calls");
        for k in 1..=calls {
            run(phase, k);
        }
    }
}

/// An allocation made on another thread's per-thread stream, with a kernel of that thread's
/// still in flight over it: a sleep from this thread waits for it (the device), so nothing
/// is unmapped under the kernel.
#[test]
fn a_sleep_waits_for_another_threads_per_thread_stream() {
    let device = host_device(64 * MIB, true);
    let vmm = Arc::new(VmmAllocator::new(Arc::clone(&device), VmmOptions::new(32 * MIB)).unwrap());
    let (a, work) = {
        let (vmm, device) = (Arc::clone(&vmm), Arc::clone(&device));
        std::thread::spawn(move || {
            let a = vmm
                .allocate(4 * MIB, 0, Stream::PER_THREAD, "weights")
                .unwrap();
            let work = device.launch(Stream::PER_THREAD, a.ptr(), a.size());
            (a, work)
        })
        .join()
        .unwrap()
    };
    assert_eq!(device.kernel_done(work), Some(false));
    vmm.sleep("weights", Keep::Contents).unwrap();
    assert_eq!(
        device.kernel_done(work),
        Some(true),
        "the sleep did not wait for the kernel"
    );
    assert_eq!(device.hazards().0, 0, "{:?}", device.hazards().1);
    vmm.wake("weights").unwrap();
    vmm.deallocate(a).unwrap();
}

/// Found by the outside review: on one stream, a tag placed over granules freed earlier
/// (freed at once, without an event) hands them back all the same — the sleep waited for
/// that stream; and kept host copies never outnumber the tagged allocations that could sleep
/// again.
#[test]
fn a_sleep_hands_back_granules_freed_before_and_keeps_no_orphan_host_copies() {
    let (device, vmm) = real_vmm(256 * MIB, 192 * MIB);
    let profile = vmm
        .allocate(64 * MIB, 0, Stream::DEFAULT, "profile")
        .unwrap();
    vmm.deallocate(profile).unwrap();
    let w = vmm
        .allocate(64 * MIB, 0, Stream::DEFAULT, "weights")
        .unwrap();
    write(&w, 4);
    let held = vmm.stats().pool_bytes;
    let report = vmm.sleep("weights", Keep::Contents).unwrap();
    assert!(
        report.device_bytes >= 64 * MIB && vmm.stats().pool_bytes + 64 * MIB <= held,
        "{report:?}, pool {} of {held}",
        vmm.stats().pool_bytes
    );
    vmm.wake("weights").unwrap();
    assert_eq!(first_wrong(&w, 4), None);
    vmm.deallocate(w).unwrap();
    // Varying sizes, each slept, woken and freed: no copy is kept for what is gone.
    for i in 0..6u64 {
        let a = vmm
            .allocate((4 + i) * MIB, 0, Stream::DEFAULT, "weights")
            .unwrap();
        vmm.sleep("weights", Keep::Contents).unwrap();
        vmm.wake("weights").unwrap();
        assert_eq!(vmm.spare_host_bytes(), (4 + i) * MIB, "cycle {i}");
        vmm.deallocate(a).unwrap();
        assert_eq!(vmm.spare_host_bytes(), 0, "cycle {i}");
    }
    assert_eq!(device.census().pinned_host, 0, "{:?}", device.census());
    drop(vmm);
    assert!(device.census().is_empty(), "{:?}", device.census());
}

/// Found by the outside review: with two streams, memory a wake needs that waits only in
/// stream-ordered frees is waited for, not refused; and a refusal's figures agree (what is
/// needed is what is missing under the sleepers, what can be had excludes granules in place
/// under them).
#[test]
fn a_wake_waits_for_pending_frees_and_its_refusal_adds_up() {
    let device = host_device(64 * MIB, true);
    let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(16 * MIB)).unwrap();
    let side = device.create_stream().unwrap();
    let w = vmm.allocate(8 * MIB, 0, Stream::DEFAULT, "w").unwrap();
    let other = vmm.allocate(MIB, 0, side, "").unwrap();
    vmm.sleep("w", Keep::Contents).unwrap();
    let f = vmm.allocate(12 * MIB, 0, Stream::DEFAULT, "").unwrap();
    vmm.deallocate(f).unwrap();
    vmm.wake("w").unwrap();
    vmm.check_invariants().unwrap();
    // Refused: a filler holds what the sleeper needs; the figures are the missing granules
    // and what else could be had.
    vmm.sleep("w", Keep::Contents).unwrap();
    let filler = vmm.allocate(12 * MIB, 0, Stream::DEFAULT, "").unwrap();
    match vmm.wake("w").unwrap_err() {
        Error::CannotWake {
            needed, available, ..
        } => assert!(
            needed > available && needed <= 8 * MIB,
            "needed {needed}, available {available}"
        ),
        e => panic!("{e:?}"),
    }
    vmm.deallocate(filler).unwrap();
    vmm.wake("w").unwrap();
    vmm.deallocate(w).unwrap();
    vmm.deallocate(other).unwrap();
    drop(vmm);
    // SAFETY: the stream of this test, idle, not used again.
    unsafe { device.destroy_stream(side) }.unwrap();
}

/// A sleep whose host copy the system cannot give — 1 TiB kept from a simulated device of
/// 2 TiB — is an out-of-memory error that names the bytes, not an abort of the process
/// (`vec![0; n]` aborted it); the allocation stays awake and the books are unchanged.
#[test]
fn a_sleep_without_host_memory_for_its_copy_is_an_error_not_an_abort() {
    const TIB: u64 = 1 << 40;
    let device = Arc::new(
        HostDevice::builder()
            .capacity(2 * TIB)
            .simulated(true)
            .build()
            .unwrap(),
    );
    let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(2 * TIB)).unwrap();
    let a = vmm.allocate(TIB, 0, Stream::DEFAULT, "weights").unwrap();
    let before = vmm.stats();
    let e = vmm.sleep("weights", Keep::Contents).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(e.to_string().contains(&TIB.to_string()), "{e}");
    assert!(!vmm.is_asleep(&a));
    assert_eq!(vmm.stats(), before);
    vmm.check_invariants().unwrap();
    vmm.deallocate(a).unwrap();
    drop(vmm);
    assert!(device.census().is_empty(), "{:?}", device.census());
}

/// Sleep and wake copy a large allocation piece by piece: a sleep unmaps what a piece copied
/// while the next piece's copy is in flight, a wake queues the copy of each piece as soon as
/// its memory is mapped, before the next piece's is made (on a GPU the copies then run while
/// the driver works), and the bytes come back whole.
#[test]
fn sleep_and_wake_copy_piece_by_piece() {
    use portalloc::adaptor::CallLog;
    let host = host_device(128 * MIB, false);
    let device = Arc::new(CallLog::new(Arc::clone(&host)));
    let options = VmmOptions {
        copy_piece: 4 * MIB,
        ..VmmOptions::new(64 * MIB)
    };
    let vmm = VmmAllocator::new(Arc::clone(&device), options).unwrap();
    let a = vmm
        .allocate(10 * MIB, 0, Stream::DEFAULT, "pieces")
        .unwrap();
    write(&a, 7);
    device.take();
    vmm.sleep("pieces", Keep::Contents).unwrap();
    let log = device.take();
    // The sleep copies the same pieces, and unmaps what one copied while the next is in
    // flight: the first unmap comes before the last piece's copy is queued.
    let downloads: Vec<usize> = (0..log.len())
        .filter(|&i| log[i].name == "copy_to_host")
        .collect();
    assert!(downloads.len() >= 3, "{log:?}");
    let first_unmap = log.iter().position(|c| c.name == "unmap").unwrap();
    assert!(
        first_unmap < *downloads.last().unwrap(),
        "the first piece's memory waits for no later copy: {log:?}"
    );
    vmm.check_invariants().unwrap();
    vmm.wake("pieces").unwrap();
    let log: Vec<_> = device.take();
    // The 10 MiB allocation's granules split at multiples of 4 MiB: 3 pieces (4 + 4 + 2 MiB
    // where the allocation starts on a boundary), each mapped, then its copy queued.
    let copies: Vec<usize> = (0..log.len())
        .filter(|&i| log[i].name == "copy_from_host")
        .collect();
    assert!(copies.len() >= 3, "{log:?}");
    let copied: u64 = copies.iter().map(|&i| log[i].bytes).sum();
    assert_eq!(copied, 10 * MIB, "{log:?}");
    let last_map = log.iter().rposition(|c| c.name == "map").unwrap();
    assert!(
        copies[0] < last_map,
        "the first piece's copy waits for no later piece's map: {log:?}"
    );
    assert_eq!(first_wrong(&a, 7), None);
    vmm.check_invariants().unwrap();
    vmm.deallocate(a).unwrap();
}

/// Fails the `nth` call named `once` (counted from 1) and every call named `always`, while
/// armed.
#[derive(Debug)]
struct FaultNamed {
    inner: Arc<HostDevice>,
    /// (armed, `once` and its `nth`, `always`, calls named `once` so far)
    state: Mutex<(bool, &'static str, u64, &'static str, u64)>,
}

impl DeviceWrapper for FaultNamed {
    type Inner = HostDevice;
    fn wrapped(&self) -> &HostDevice {
        &self.inner
    }
    fn before(&self, call: &Call<'_>) -> portalloc::Result<()> {
        let mut s = self.state.lock().unwrap();
        let name = call.name();
        let fail = s.0
            && ((name == s.1 && {
                s.4 += 1;
                s.4 == s.2
            }) || name == s.3);
        if fail {
            return Err(injected(name));
        }
        Ok(())
    }
}

/// A sleep whose copy fails part way (the 3rd piece's), and whose undo fails too (every map
/// or every upload refused): the tag stays asleep — with all its bytes, the copies not made
/// when the first failed being made before the undo, so that neither a trim nor other
/// allocations taking the memory (what the books left untouched) lose any: the next wake
/// brings every byte back.
#[test_case("map", "" ; "undo refused its maps")]
#[test_case("copy_from_host", "" ; "undo refused its uploads")]
#[test_case("map", "trim" ; "then a trim")]
#[test_case("map", "others allocate" ; "then others take the memory")]
fn a_sleep_that_fails_and_cannot_be_undone_keeps_every_byte(undo_fails: &'static str, then: &str) {
    let host = host_device(64 * MIB, false);
    let device = Arc::new(FaultNamed {
        inner: Arc::clone(&host),
        state: Mutex::new((false, "", 0, "", 0)),
    });
    let options = VmmOptions {
        copy_piece: 2 * MIB,
        ..VmmOptions::new(32 * MIB)
    };
    let vmm = VmmAllocator::new(Arc::clone(&device), options).unwrap();
    let w = vmm
        .allocate(8 * MIB, 0, Stream::DEFAULT, "undo-fails")
        .unwrap();
    let other = vmm.allocate(4 * MIB, 0, Stream::DEFAULT, "").unwrap();
    write(&w, 9);
    *device.state.lock().unwrap() = (true, "copy_to_host", 3, undo_fails, 0);
    let slept = vmm.sleep("undo-fails", Keep::Contents);
    device.state.lock().unwrap().0 = false;
    assert!(slept.is_err(), "{slept:?}");
    assert!(vmm.is_asleep(&w), "the undo failed: asleep");
    vmm.check_invariants().unwrap();
    match then {
        "trim" => {
            vmm.trim().unwrap();
        }
        "others allocate" => {
            let mut taken = Vec::new();
            while let Ok(a) = vmm.allocate(2 * MIB, 0, Stream::DEFAULT, "") {
                write(&a, 3);
                taken.push(a);
            }
            assert!(!taken.is_empty());
            for a in taken {
                vmm.deallocate(a).unwrap();
            }
        }
        _ => {}
    }
    vmm.wake("undo-fails").unwrap();
    assert_eq!(first_wrong(&w, 9), None);
    vmm.check_invariants().unwrap();
    vmm.deallocate(w).unwrap();
    vmm.deallocate(other).unwrap();
    drop(vmm);
    assert!(host.census().is_empty(), "{:?}", host.census());
}
