//! One device shared by several real processes (`FAKE_SHARED_DEVICE`, `fake_shared.h`), from
//! the caller's side: this binary runs itself again as child processes (the test `child`, with
//! `SHARED_ROLE` naming the vendor), each loading a driver as the other tests do and obeying
//! one-line commands on its stdin; the parent checks what each child's driver answers against
//! the segment file, read by `SharedDevice` independently of the drivers.
//!
//! Real memory is allocated (memory that is memory): a 64 MiB device, allocations of MiBs.

use std::ffi::c_int;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use portalloc_fakes::{Code, Driver, Holder, SharedDevice, Vendor, SHARED_LAYOUT_VERSION};
use test_case::test_case;

mod gpu;
use gpu::{Gpu, CUDA12, HIP, R};

const ROLE: &str = "SHARED_ROLE";
const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 64 * MIB;
/// How long a child may take to answer one command (or to run its races): past it, it is
/// killed and the test fails, rather than hang.
const PATIENCE: Duration = Duration::from_secs(20);

// ---- the child ---------------------------------------------------------------------------

/// A child process's part: nothing unless `SHARED_ROLE` says which vendor it drives.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let driver = if role == "cuda" { CUDA12 } else { HIP };
    let gpu = Gpu::new(driver);
    let oom = gpu.c().code(Code::OutOfMemory);
    say(&format!("ready {} {oom}", std::process::id()));
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("a command");
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| words[i].parse::<u64>().expect("a number");
        match words[0] {
            "alloc" => {
                let (rc, p) = try_malloc(&gpu, num(1));
                say(&format!("{rc} {p}"));
            }
            "free" => say(&gpu.free(num(1)).to_string()),
            "info" => {
                let (free, total) = mem_info(&gpu);
                say(&format!("{free} {total}"));
            }
            "race" => {
                race(&gpu, num(1), num(2), words[3], oom);
                say("done");
            }
            "quit" => break,
            other => panic!("no command {other}"),
        }
    }
}

/// An answer, told from libtest's own lines by its prefix.
fn say(line: &str) {
    println!("@@ {line}");
    std::io::stdout().flush().expect("stdout");
}

fn try_malloc(gpu: &Gpu, n: u64) -> (R, u64) {
    let f = call!(
        gpu,
        "cuMemAlloc_v2",
        "hipMalloc",
        unsafe extern "C" fn(*mut u64, usize) -> R
    );
    let mut p = 0;
    // SAFETY: one pointer written.
    let rc = unsafe { f(&mut p, n as usize) };
    (rc, p)
}

fn mem_info(gpu: &Gpu) -> (u64, u64) {
    let f = call!(
        gpu,
        "cuMemGetInfo_v2",
        "hipMemGetInfo",
        unsafe extern "C" fn(*mut usize, *mut usize) -> R
    );
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: two sizes written.
    assert_eq!(unsafe { f(&mut free, &mut total) }, 0);
    (free as u64, total as u64)
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

/// `n` random allocations (1 to 16 MiB) and frees, each logged to `log`: `+ bytes` when an
/// allocation has returned, `- bytes` before its free is called, with the time (the clock all
/// processes share), so the parent can tell what was surely held at once.
fn race(gpu: &Gpu, n: u64, seed: u64, log: &str, oom: c_int) {
    let mut x = seed | 1;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut held: Vec<(u64, u64)> = Vec::new();
    let mut out = String::new();
    let (mut failed, mut got) = (0, 0);
    for _ in 0..n {
        if !held.is_empty() && rand() % 3 == 0 {
            let (p, size) = held.swap_remove((rand() % held.len() as u64) as usize);
            out += &format!("{} - {size}\n", now_ns());
            assert_eq!(gpu.free(p), 0);
        } else {
            let size = (1 + rand() % 16) * MIB;
            let (rc, p) = try_malloc(gpu, size);
            if rc == 0 {
                out += &format!("{} + {size}\n", now_ns());
                held.push((p, size));
                got += 1;
            } else {
                assert_eq!(rc, oom, "an allocation fails for want of memory only");
                failed += 1;
            }
        }
    }
    for (p, size) in held {
        out += &format!("{} - {size}\n", now_ns());
        assert_eq!(gpu.free(p), 0);
    }
    out += &format!("# {got} {failed}\n");
    std::fs::write(log, out).expect("the log");
}

// ---- the parent's side ---------------------------------------------------------------------

/// A child process on a shared device (or on a segment given by value), killed if still
/// running when dropped.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    answers: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    pid: u32,
    oom: R,
}

fn vendor(driver: Driver) -> &'static str {
    match driver.vendor {
        Vendor::Cuda => "cuda",
        Vendor::Hip => "hip",
    }
}

impl Proc {
    fn start(driver: Driver, shared: &str) -> Proc {
        let mut command = Command::new(std::env::current_exe().expect("this test binary"));
        command
            .args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env(ROLE, vendor(driver))
            .env("FAKE_SHARED_DEVICE", shared)
            .env("FAKECUDA_CAPACITY", CAPACITY.to_string())
            .env("FAKEHIP_CAPACITY", CAPACITY.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("a child process");
        let (tx, answers) = channel();
        let stdout = child.stdout.take().expect("its stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // libtest's "test child ... " may begin the first answer's line.
                if let Some(at) = line.find("@@ ") {
                    if tx.send(line[at + 3..].to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let (mut pipe, text) = (child.stderr.take().expect("its stderr"), stderr.clone());
        std::thread::spawn(move || {
            let mut buf = String::new();
            let _ = std::io::Read::read_to_string(&mut pipe, &mut buf);
            *text.lock().expect("the text") = buf;
        });
        let stdin = child.stdin.take();
        let mut p = Proc {
            child,
            stdin,
            answers,
            stderr,
            pid: 0,
            oom: 0,
        };
        let ready = p.answer();
        let words: Vec<&str> = ready.split_whitespace().collect();
        assert_eq!(words[0], "ready", "{ready}");
        p.pid = words[1].parse().expect("a pid");
        p.oom = words[2].parse().expect("a code");
        p
    }

    fn answer(&mut self) -> String {
        match self.answers.recv_timeout(PATIENCE) {
            Ok(a) => a,
            Err(e) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "child {} gave no answer ({e}); its stderr: {}",
                    self.pid,
                    self.stderr.lock().expect("the text")
                )
            }
        }
    }

    fn ask(&mut self, command: &str) -> Vec<u64> {
        let stdin = self.stdin.as_mut().expect("running");
        writeln!(stdin, "{command}").expect("a command sent");
        stdin.flush().expect("sent");
        let a = self.answer();
        a.split_whitespace()
            .map(|w| w.parse().unwrap_or_else(|_| panic!("{command}: {a}")))
            .collect()
    }

    /// An allocation: its code and pointer.
    fn alloc(&mut self, n: u64) -> (R, u64) {
        let a = self.ask(&format!("alloc {n}"));
        (a[0] as R, a[1])
    }

    fn free(&mut self, p: u64) {
        assert_eq!(self.ask(&format!("free {p}")), [0]);
    }

    /// What the driver's memory information says: free and total.
    fn info(&mut self) -> (u64, u64) {
        let a = self.ask("info");
        (a[0], a[1])
    }

    /// Ends normally; its stderr.
    fn quit(mut self) -> String {
        writeln!(self.stdin.as_mut().expect("running"), "quit").expect("sent");
        self.stdin = None;
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("its status") {
                assert!(status.success(), "child {}: {status}", self.pid);
                break;
            }
            assert!(Instant::now() < deadline, "child {} did not end", self.pid);
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50)); // its stderr read to the end
        let text = self.stderr.lock().expect("the text").clone();
        text
    }

    /// SIGKILL, and reaped (a zombie is dead to the drivers too, but not to `kill(pid, 0)`).
    fn kill(mut self) {
        self.child.kill().expect("killed");
        self.child.wait().expect("reaped");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn holder(p: &Proc, bytes: u64) -> Holder {
    Holder { pid: p.pid, bytes }
}

// ---- the cases ---------------------------------------------------------------------------

/// Two processes see one device: what A holds, B's memory information no longer reports
/// free, and B's allocation past the rest fails with the vendor's out-of-memory code, until A
/// frees.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn two_processes_share_one_devices_memory(driver: Driver) {
    let device = SharedDevice::unique();
    let mut a = Proc::start(driver, device.value());
    let mut b = Proc::start(driver, device.value());
    assert_eq!(device.capacity(0), CAPACITY);
    assert_eq!(device.free(0), CAPACITY);
    let (rc, pa) = a.alloc(24 * MIB);
    assert_eq!(rc, 0);
    assert_eq!(device.holders(0), [holder(&a, 24 * MIB)]);
    assert_eq!(b.info(), (40 * MIB, CAPACITY), "B sees what A holds");
    assert_eq!(a.info(), (40 * MIB, CAPACITY));
    assert_eq!(device.free(0), 40 * MIB);
    let (rc, _) = b.alloc(48 * MIB);
    assert_eq!(rc, b.oom, "48 MiB of the 40 left");
    assert_eq!(
        device.holders(0),
        [holder(&a, 24 * MIB)],
        "a failed charge is taken back"
    );
    a.free(pa);
    assert_eq!(device.free(0), CAPACITY);
    let (rc, pb) = b.alloc(48 * MIB);
    assert_eq!(rc, 0, "after A freed");
    assert_eq!(device.holders(0), [holder(&b, 48 * MIB)]);
    assert_eq!(a.info(), (16 * MIB, CAPACITY));
    b.free(pb);
    assert_eq!(a.quit(), "", "nothing said");
    assert_eq!(b.quit(), "");
    assert_eq!(device.free(0), CAPACITY);
}

/// A process killed while holding memory gives it back: the next allocation of another
/// succeeds, and the segment no longer lists it.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_killed_process_gives_its_memory_back(driver: Driver) {
    let device = SharedDevice::unique();
    let mut a = Proc::start(driver, device.value());
    let mut b = Proc::start(driver, device.value());
    assert_eq!(a.alloc(48 * MIB).0, 0);
    assert_eq!(b.alloc(32 * MIB).0, b.oom);
    assert_eq!(device.holders(0), [holder(&a, 48 * MIB)]);
    a.kill();
    assert_eq!(device.holders(0), [], "a dead process holds nothing");
    assert_eq!(b.info(), (CAPACITY, CAPACITY));
    let (rc, p) = b.alloc(32 * MIB);
    assert_eq!(rc, 0, "the killed process's memory is back");
    assert_eq!(device.holders(0), [holder(&b, 32 * MIB)]);
    b.free(p);
    assert_eq!(b.quit(), "");
    assert_eq!(device.free(0), CAPACITY);
}

/// The segment's layout (`fake_shared.h`), for the cases that write one themselves.
fn segment_bytes(capacity: u64, version: u32, slots: &[(u64, u64, u64)]) -> Vec<u8> {
    let mut b = vec![0u8; 96 + 80 * 64 + 32 * 1024];
    b[0..8].copy_from_slice(&0x5645_444b_4146_4150u64.to_ne_bytes());
    b[8..12].copy_from_slice(&version.to_ne_bytes());
    b[12..16].copy_from_slice(&1u32.to_ne_bytes());
    b[16..20].copy_from_slice(&8u32.to_ne_bytes());
    b[20..24].copy_from_slice(&64u32.to_ne_bytes());
    for d in 0..8 {
        b[32 + 8 * d..40 + 8 * d].copy_from_slice(&capacity.to_ne_bytes());
    }
    for (i, &(owner, start, used)) in slots.iter().enumerate() {
        let at = 96 + 80 * i;
        b[at..at + 8].copy_from_slice(&owner.to_ne_bytes());
        b[at + 8..at + 16].copy_from_slice(&start.to_ne_bytes());
        b[at + 16..at + 24].copy_from_slice(&used.to_ne_bytes());
    }
    b
}

fn write_private(path: &std::path::Path, bytes: &[u8]) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .expect("a segment file");
    f.write_all(bytes).expect("written");
}

/// Every slot held by a dead process (a pid gone, or a live pid that started at another time:
/// a reused pid): they count nothing, and a new process reuses one.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_dead_slot_is_reused(driver: Driver) {
    let mut gone = Command::new("true").spawn().expect("a process");
    gone.wait().expect("ended");
    let gone = u64::from(gone.id());
    let me = u64::from(std::process::id());
    let slots: Vec<(u64, u64, u64)> = (0..64)
        .map(|i| match i % 2 {
            0 => (gone << 32 | (i + 1), 12345, 60 * MIB),
            _ => (me << 32 | (i + 1), 1, 60 * MIB), // this pid, another start time
        })
        .collect();
    let device = SharedDevice::unique();
    write_private(
        device.path(),
        &segment_bytes(CAPACITY, SHARED_LAYOUT_VERSION, &slots),
    );
    assert_eq!(device.holders(0), [], "dead slots hold nothing");
    let mut c = Proc::start(driver, device.value());
    assert_eq!(c.info(), (CAPACITY, CAPACITY));
    let (rc, p) = c.alloc(CAPACITY);
    assert_eq!(rc, 0, "all of it");
    assert_eq!(device.holders(0), [holder(&c, CAPACITY)]);
    let owners = std::fs::read(device.path()).expect("the segment");
    let claimed = (0..64)
        .filter(|i| {
            let at = 96 + 80 * i;
            u64::from_ne_bytes(owners[at..at + 8].try_into().unwrap()) >> 32 == u64::from(c.pid)
        })
        .count();
    assert_eq!(claimed, 1, "one dead slot taken over");
    c.free(p);
    assert_eq!(c.quit(), "");
}

/// A file its creator left empty (killed between its create and its sizing) is replaced by
/// the next process, which then shares the device: it does not run private for good.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn an_empty_file_left_by_a_dead_creator_is_replaced(driver: Driver) {
    let path = std::env::temp_dir().join(format!(
        "portalloc-fake-empty-{}-{}",
        std::process::id(),
        vendor(driver)
    ));
    let _ = std::fs::remove_file(&path);
    let device = SharedDevice::new(path.to_str().expect("a path"));
    write_private(&path, &[]);
    let mut a = Proc::start(driver, device.value());
    let (rc, p) = a.alloc(8 * MIB);
    assert_eq!(rc, 0);
    assert_eq!(
        device.holders(0),
        [holder(&a, 8 * MIB)],
        "shared, not private"
    );
    a.free(p);
    assert_eq!(a.quit(), "");
    let _ = std::fs::remove_file(&path);
}

/// A segment that is not right: the driver says so in one line naming the file, and runs
/// with a private device.
#[test_case(CUDA12, "garbage", "not a segment" ; "cuda garbage")]
#[test_case(HIP, "garbage", "not a segment" ; "hip garbage")]
#[test_case(CUDA12, "truncated", "100 bytes" ; "cuda truncated")]
#[test_case(HIP, "truncated", "100 bytes" ; "hip truncated")]
#[test_case(CUDA12, "version", "layout version is 99" ; "cuda version")]
#[test_case(HIP, "version", "layout version is 99" ; "hip version")]
#[test_case(CUDA12, "open", "open to other users" ; "cuda open to others")]
#[test_case(HIP, "open", "open to other users" ; "hip open to others")]
#[test_case(CUDA12, "user", "owned by another user" ; "cuda another users")]
#[test_case(HIP, "user", "owned by another user" ; "hip another users")]
#[test_case(CUDA12, "name", "not a name" ; "cuda bad name")]
#[test_case(HIP, "name", "not a name" ; "hip bad name")]
fn a_wrong_segment_is_said_and_the_device_is_private(driver: Driver, wrong: &str, said: &str) {
    let path = std::env::temp_dir().join(format!(
        "portalloc-fake-bad-{}-{}-{wrong}",
        std::process::id(),
        vendor(driver)
    ));
    let _ = std::fs::remove_file(&path);
    let device = SharedDevice::new(path.to_str().expect("a path"));
    let good = segment_bytes(CAPACITY, SHARED_LAYOUT_VERSION, &[]);
    let value = match wrong {
        "garbage" => {
            let mut b = good.clone();
            b[0..8].copy_from_slice(b"garbage!");
            write_private(&path, &b);
            device.value().to_owned()
        }
        "truncated" => {
            write_private(&path, &good[..100]);
            device.value().to_owned()
        }
        "version" => {
            write_private(&path, &segment_bytes(CAPACITY, 99, &[]));
            device.value().to_owned()
        }
        "open" => {
            write_private(&path, &good);
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            device.value().to_owned()
        }
        "user" => {
            write_private(&path, &good);
            if let Err(e) = std::os::unix::fs::chown(&path, Some(65534), Some(65534)) {
                println!(
                    "skipped: cannot give {} to another user ({e})",
                    path.display()
                );
                return;
            }
            device.value().to_owned()
        }
        _ => "no/such name".to_owned(),
    };
    let before = std::fs::read(&path).ok();
    let mut c = Proc::start(driver, &value);
    // Private: all of its own device, whatever the file says.
    assert_eq!(c.info(), (CAPACITY, CAPACITY));
    let (rc, p) = c.alloc(CAPACITY);
    assert_eq!(rc, 0);
    c.free(p);
    let said_lines = c.quit();
    let lines: Vec<&str> = said_lines.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {said_lines}");
    assert!(lines[0].contains(said), "{}", lines[0]);
    assert!(lines[0].contains("private device"), "{}", lines[0]);
    if wrong != "name" {
        assert!(lines[0].contains(&*path.to_string_lossy()), "{}", lines[0]);
    }
    assert_eq!(std::fs::read(&path).ok(), before, "the file untouched");
}

/// Four processes racing 200 random allocations and frees each never overcommit: at no time
/// do the allocations surely held at once (returned, and not yet being freed) pass the
/// capacity; the segment, sampled meanwhile, holds at most the capacity and the charges then
/// in flight; at the end all is free.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn racing_processes_never_overcommit(driver: Driver) {
    let device = SharedDevice::unique();
    let mut procs: Vec<Proc> = (0..4)
        .map(|_| Proc::start(driver, device.value()))
        .collect();
    let logs: Vec<std::path::PathBuf> = (0..4)
        .map(|i| {
            std::env::temp_dir().join(format!(
                "portalloc-fake-race-{}-{}-{i}",
                std::process::id(),
                vendor(driver)
            ))
        })
        .collect();
    // Samples while they race: one charge per process may be in flight (added, then taken
    // back when it does not fit).
    let (stop, samples) = (Arc::new(Mutex::new(false)), Arc::new(Mutex::new(0u64)));
    let sampler = {
        let (stop, samples) = (stop.clone(), samples.clone());
        let path = device.path().to_owned();
        std::thread::spawn(move || {
            let device = SharedDevice::new(path.to_str().unwrap());
            loop {
                let s = device.read().expect("the segment");
                let used = s.used(0);
                assert!(used <= CAPACITY + 4 * 16 * MIB, "{used} held at once");
                *samples.lock().unwrap() += 1;
                if *stop.lock().unwrap() {
                    break;
                }
            }
            std::mem::forget(device); // not this thread's to remove
        })
    };
    for (i, p) in procs.iter_mut().enumerate() {
        let stdin = p.stdin.as_mut().expect("running");
        writeln!(
            stdin,
            "race 200 {} {}",
            0x9e37_79b9 * (i + 1),
            logs[i].display()
        )
        .unwrap();
        stdin.flush().unwrap();
    }
    for p in &mut procs {
        assert_eq!(p.answer(), "done");
    }
    *stop.lock().unwrap() = true;
    sampler.join().expect("no sample over");
    assert!(*samples.lock().unwrap() > 0);
    let mut events: Vec<(u128, i64)> = Vec::new();
    let (mut got, mut failed) = (0, 0);
    for log in &logs {
        let text = std::fs::read_to_string(log).expect("a child's log");
        let _ = std::fs::remove_file(log);
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            if w[0] == "#" {
                got += w[1].parse::<u64>().unwrap();
                failed += w[2].parse::<u64>().unwrap();
                continue;
            }
            let bytes: i64 = w[2].parse().unwrap();
            events.push((
                w[0].parse().unwrap(),
                if w[1] == "+" { bytes } else { -bytes },
            ));
        }
    }
    assert!(
        got > 0 && failed > 0,
        "they raced for the memory: {got} got, {failed} refused"
    );
    events.sort(); // at one time, frees first
    let mut held = 0i64;
    for (t, delta) in &events {
        held += delta;
        assert!(
            held <= CAPACITY as i64,
            "{held} bytes surely held at once, at {t}"
        );
    }
    assert_eq!(held, 0);
    assert_eq!(device.free(0), CAPACITY);
    assert_eq!(procs[0].info(), (CAPACITY, CAPACITY));
    for p in procs {
        assert_eq!(p.quit(), "");
    }
    assert_eq!(device.holders(0), []);
}
