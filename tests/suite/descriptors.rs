//! ROCm 7.14's descriptor per VMM handle (ROCm/rocm-systems#10604): `hipMemCreate` opens a
//! file descriptor of the process for each handle, so at the stock `ulimit -n 1024` a process
//! stops at ~1015 handles (1.98 GiB of 2 MiB handles) with `hipErrorOutOfMemory`. Under the
//! fakes' `rocm7-descriptor-per-handle` profile (kept out of the matrix: `EXTRA`), each live
//! handle holds a real descriptor of the process.
//!
//! Each test runs its body in a child process (this binary again, the test alone) whose
//! `RLIMIT_NOFILE` it lowers: never the limit of the process that runs the other tests, and
//! the child counts the process's descriptors without other tests opening files meanwhile.
#![cfg(feature = "hip")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use portalloc::backends::descriptors::Descriptors;
use portalloc::backends::hip::HipDevice;
use portalloc::strategy::vmm::{VmmAllocator, VmmOptions};
use portalloc::{Allocation, Allocator, Device, Error, Keep, Stream};

use crate::support::fakes::{stamp as write, stamped as holds, Fake, FakeDevice};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The variable that makes this binary, run again, the child of the test it names.
const CHILD: &str = "PORTALLOC_TEST_DESCRIPTORS_CHILD";

/// The profile, from the fakes' own list.
fn profile() -> &'static portalloc_fakes::Profile {
    portalloc_fakes::profile("rocm7-descriptor-per-handle").expect("the fakes' extra profile")
}

/// Runs `test` (this module's test of that name) again in a child process under the profile,
/// with a device of `capacity` bytes, and fails with the child's output if the child fails or
/// runs longer than `limit`. Returns the child's output. In the child (`CHILD` set), returns
/// `None`: the caller runs the body.
fn in_child(test: &str, capacity: u64, limit: Duration) -> Option<String> {
    if std::env::var(CHILD).as_deref() == Ok(test) {
        return None;
    }
    let name = format!(
        "{}::{test}",
        module_path!().split_once("::").map_or("", |(_, m)| m)
    );
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command.args(["--exact", &name, "--nocapture", "--test-threads=1"]);
    profile().apply(&mut command);
    command
        .env(CHILD, test)
        .env("FAKEHIP_CAPACITY", capacity.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let started = Instant::now();
    let mut child = command.spawn().unwrap();
    // The pipes are read on threads, so a talkative child never blocks on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let read_out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let read_err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > limit {
            child.kill().ok();
            child.wait().ok();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = read_out.join().unwrap() + &read_err.join().unwrap();
    match status {
        None => panic!("{test}: the child ran past {limit:?}:\n{text}"),
        Some(s) => assert!(
            s.success() && text.contains("running 1 test"),
            "{test}: the child failed ({s}):\n{text}"
        ),
    }
    eprintln!("{text}");
    Some(text)
}

/// Sets this process's `RLIMIT_NOFILE` (the child's own: `ulimit -n` in its shell).
fn set_nofile(soft: u64, hard: u64) {
    let limit = libc::rlimit {
        rlim_cur: soft as libc::rlim_t,
        rlim_max: hard as libc::rlim_t,
    };
    // SAFETY: reads one `rlimit` through a valid pointer.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

/// The fake under the profile's environment (set by [`in_child`]), and its device 0.
fn open() -> (Fake, Arc<HipDevice>) {
    let fake = Fake::at(profile().library());
    let device = Arc::new(<HipDevice as FakeDevice>::open(&fake, 0));
    (fake, device)
}

fn open_descriptors() -> u64 {
    Descriptors::now().open.expect("/proc/self/fd")
}

/// Descriptors open on `/dev/null`: the fake's handles' (and the [`Hog`]'s).
fn dev_null_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target == std::path::Path::new("/dev/null"))
        .count()
}

/// Descriptors opened (on /dev/null) until the process has none left; closed when dropped.
struct Hog(Vec<std::fs::File>);

impl Hog {
    fn all() -> Hog {
        let mut files = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            files.push(f);
        }
        Hog(files)
    }
}

/// Under the profile each live handle holds one descriptor, closed at its release; past the
/// process's limit `hipMemCreate` answers `hipErrorOutOfMemory` with the device empty, as
/// the report says. Opening the device raises the soft limit to the hard one, the device
/// notes say what the probe found and the limits, and the handle budget is the room left.
#[test]
fn each_handle_holds_a_descriptor_and_opening_raises_the_soft_limit() {
    if in_child(
        "each_handle_holds_a_descriptor_and_opening_raises_the_soft_limit",
        4 * GIB,
        Duration::from_secs(60),
    )
    .is_some()
    {
        return;
    }
    set_nofile(256, 512);
    let (fake, device) = open();
    let now = Descriptors::now();
    assert_eq!((now.soft, now.hard), (Some(512), Some(512)), "{now:?}");
    let note = |key: &str| {
        device
            .info()
            .notes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no note {key}: {:?}", device.info().notes))
    };
    let text = note("descriptors per handle");
    for words in [
        "one file descriptor per physical handle",
        "raised from 256 to 512",
    ] {
        assert!(text.contains(words), "{text}");
    }
    let vm = device.virtual_memory().unwrap();
    let budget = vm
        .handle_budget()
        .expect("a budget where handles cost descriptors");
    assert_eq!(
        budget,
        512 - open_descriptors(),
        "the room left under the limit"
    );

    // The raw driver: one descriptor a handle, closed at the release.
    let before = open_descriptors();
    let g = vm.granularity();
    let handles: Vec<_> = (0..16).map(|_| vm.create_physical(g).unwrap()).collect();
    assert_eq!(open_descriptors(), before + 16);
    assert_eq!(vm.handle_budget(), Some(budget - 16));
    for h in handles {
        vm.release_physical(h).unwrap();
    }
    assert_eq!(open_descriptors(), before);

    // At the limit: the driver's out of memory, with the device nearly empty, is the typed
    // refusal naming the limit; one descriptor closed lets the next handle through.
    let mut hog = Hog::all();
    let free = device.mem_info().unwrap().free;
    let e = vm.create_physical(g).unwrap_err();
    match &e {
        Error::DescriptorLimit {
            backend,
            limit,
            open,
            requested,
            ..
        } => {
            assert_eq!((*backend, *limit, *open, *requested), ("hip", 512, 512, g));
        }
        other => panic!("expected DescriptorLimit, got {other:?}"),
    }
    let text = e.to_string();
    for words in [
        "no file descriptor left",
        "limit of 512",
        "RLIMIT_NOFILE",
        "ulimit -n",
    ] {
        assert!(text.contains(words), "{text}");
    }
    assert!(!e.is_out_of_memory(), "the device has memory: {text}");
    assert!(free > 3 * GIB, "the device is nearly empty: {free}");
    assert_eq!(
        fake.calls("hipMemCreate"),
        1 + 16 + 1,
        "the probe's, ours, the refused"
    );
    hog.0.pop();
    let h = vm.create_physical(g).unwrap();
    vm.release_physical(h).unwrap();
    drop(hog);
    drop(device);
    assert_eq!(fake.live("handles"), 0);
}

/// The check: with `ulimit -n 1024`, vmm fills a 64 GiB fakehip device under the
/// descriptor-per-handle profile, sleeps it and wakes it — with handles large enough that
/// their count stays well under the limit (a quarter of it), the weights' bytes back after
/// the wake. Then, with every descriptor taken, a request that needs a new handle is the
/// typed refusal naming the limit, nothing lost: the books are consistent and the next
/// request, once descriptors are free, succeeds. Bounded: the child gets 240 s.
#[test]
fn vmm_fills_sleeps_and_wakes_64_gib_at_ulimit_1024() {
    if in_child(
        "vmm_fills_sleeps_and_wakes_64_gib_at_ulimit_1024",
        64 * GIB,
        Duration::from_secs(240),
    )
    .is_some()
    {
        return;
    }
    let started = Instant::now();
    set_nofile(1024, 1024);
    let (fake, device) = open();
    let vmm = VmmAllocator::new(Arc::clone(&device), VmmOptions::new(64 * GIB)).unwrap();
    portalloc::sleep_tags::declare_sleepable("weights");
    portalloc::sleep_tags::declare_sleepable("kv");
    let baseline = open_descriptors();
    let null_baseline = dev_null_descriptors();
    let most_handles = (1024 - baseline) / 4 + 8;

    // Fill: weights (kept over the sleep), then a mix of sizes, then 64 MiB pieces until the
    // budget refuses.
    let mut weights = Vec::new();
    for i in 0..2u8 {
        let a = vmm
            .allocate(256 * MIB, 0, Stream::DEFAULT, "weights")
            .unwrap();
        write(&a, i + 1);
        weights.push(a);
    }
    let mut kv: Vec<Allocation> = Vec::new();
    for size in [GIB; 60].into_iter().chain([MIB; 64]).chain([20 * MIB; 40]) {
        kv.push(vmm.allocate(size, 0, Stream::DEFAULT, "kv").unwrap());
    }
    let refusal = loop {
        match vmm.allocate(64 * MIB, 0, Stream::DEFAULT, "kv") {
            Ok(a) => kv.push(a),
            Err(e) => break e,
        }
    };
    assert!(
        refusal.is_out_of_memory() || matches!(refusal, Error::ExceedsLimit { .. }),
        "the budget refuses, not the descriptors: {refusal}"
    );
    let filled = vmm.stats().bytes_in_use;
    let handles = fake.live("handles") as u64;
    let fds = open_descriptors();
    let handle_size = fake_mean_handle(&vmm, handles);
    println!(
        "filled: {:.2} GiB in use, {handles} handles (mean {} MiB), {fds} descriptors open \
         (baseline {baseline}), {} hipMemCreate, {:.1} s",
        filled as f64 / GIB as f64,
        handle_size / MIB,
        fake.calls("hipMemCreate"),
        started.elapsed().as_secs_f64()
    );
    assert!(filled >= 63 * GIB, "the device is full: {filled}");
    assert!(
        handles <= most_handles,
        "{handles} handles: well under the limit (at most {most_handles})"
    );
    assert_eq!(fds, baseline + handles);
    vmm.check_invariants().unwrap();

    // Sleep: every handle goes back, and its descriptor with it.
    vmm.sleep("weights", Keep::Contents).unwrap();
    vmm.sleep("kv", Keep::Nothing).unwrap();
    let asleep_handles = fake.live("handles");
    println!(
        "asleep: {} held, {asleep_handles} handles, {} descriptors open, {:.1} s",
        vmm.stats().pool_bytes,
        open_descriptors(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(vmm.stats().pool_bytes, 0);
    assert_eq!(asleep_handles, 0);
    assert_eq!(open_descriptors(), baseline);

    // Wake: the same addresses, the weights' bytes, handles within the bound again.
    let creates = fake.calls("hipMemCreate");
    vmm.wake("weights").unwrap();
    vmm.wake("kv").unwrap();
    let woken_handles = fake.live("handles") as u64;
    println!(
        "awake: {:.2} GiB in use, {woken_handles} handles ({} made by the wake), {} \
         descriptors open, {:.1} s",
        vmm.stats().bytes_in_use as f64 / GIB as f64,
        fake.calls("hipMemCreate") - creates,
        open_descriptors(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(vmm.stats().bytes_in_use, filled);
    assert!(
        woken_handles <= most_handles,
        "{woken_handles} handles after the wake"
    );
    for (i, a) in weights.iter().enumerate() {
        assert!(
            holds(a, i as u8 + 1),
            "weights {i} came back with their bytes"
        );
    }
    vmm.check_invariants().unwrap();

    // Running out anyway: 4 GiB freed and trimmed, then every descriptor taken — a request
    // that needs a new handle is refused naming the limit, and nothing is lost.
    for a in kv.drain(..4) {
        vmm.deallocate(a).unwrap();
    }
    vmm.trim().unwrap();
    let live = vmm.stats().bytes_in_use;
    let hog = Hog::all();
    let e = loop {
        match vmm.allocate(256 * MIB, 0, Stream::DEFAULT, "kv") {
            Ok(a) => kv.push(a),
            Err(e) => break e,
        }
    };
    match &e {
        Error::DescriptorLimit { limit, .. } => assert_eq!(*limit, 1024, "{e}"),
        other => panic!("expected DescriptorLimit, got {other}"),
    }
    assert!(e.to_string().contains("limit of 1024"), "{e}");
    vmm.check_invariants().unwrap();
    let after_refusal = vmm.stats().bytes_in_use;
    assert!(after_refusal >= live, "nothing freed by the refusal");
    drop(hog);
    let a = vmm.allocate(256 * MIB, 0, Stream::DEFAULT, "kv").unwrap();
    kv.push(a);
    vmm.check_invariants().unwrap();
    for (i, a) in weights.iter().enumerate() {
        assert!(
            holds(a, i as u8 + 1),
            "weights {i} untouched by the refusal"
        );
    }

    for a in weights.into_iter().chain(kv) {
        vmm.deallocate(a).unwrap();
    }
    drop(vmm);
    drop(device);
    assert_eq!(fake.live("handles"), 0);
    assert_eq!(
        dev_null_descriptors(),
        null_baseline,
        "every handle's descriptor closed"
    );
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
}

/// The mean handle size: what the allocator holds over the handles the driver has.
fn fake_mean_handle(vmm: &VmmAllocator<HipDevice>, handles: u64) -> u64 {
    vmm.stats().pool_bytes / handles.max(1)
}
