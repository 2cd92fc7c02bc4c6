//! Device memory exported by one real process and imported by another (`fake_ipc.h`), through
//! both vendors' calls: shareable handles of virtual memory (POSIX file descriptors), legacy
//! IPC handles of plain allocations, and the ROCm reports about imports (fakehip's
//! `rocm-systems-11185-import-host-access` and `rocm-systems-8440-import-needs-fd` profiles).
//!
//! As `shared_device.rs` does, this binary runs itself again as child processes (the test
//! `child`, with `IPC_ROLE` naming the vendor), each driving a private copy of a driver and
//! obeying one-line commands on its stdin. A descriptor goes from one child to another the way
//! a parent without a socket can pass it: the importer opens `/proc/<exporter>/fd/<n>`, a new
//! descriptor of the same memory file, and imports that (then closes it, unless told to keep
//! it).

use std::ffi::{c_int, c_uint, c_void};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::IntoRawFd;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portalloc_fakes::{Driver, SharedDevice, Vendor};
use test_case::test_case;

mod gpu;
use gpu::{Gpu, CUDA12, HIP, R};

const ROLE: &str = "IPC_ROLE";
const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 64 * MIB;
/// A handle's size: a multiple of both fakes' granularity (CUDA 2 MiB, HIP 4 KiB).
const SIZE: u64 = 2 * MIB;
const PATIENCE: Duration = Duration::from_secs(20);

const INVALID_VALUE: u64 = 1;
const INVALID_CONTEXT: u64 = 201;
const INVALID_HANDLE: u64 = 400;
const NOT_SUPPORTED: R = 801;

/// `CUmemAllocationProp` / ROCm 6's `hipMemAllocationProp`: one layout.
#[repr(C)]
struct Prop {
    kind: c_int,
    handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32: *mut c_void,
    flags: [u8; 8],
}

fn prop(handle_types: c_int) -> Prop {
    Prop {
        kind: 1,
        handle_types,
        location_type: 1,
        location_id: 0,
        win32: std::ptr::null_mut(),
        flags: [0; 8],
    }
}

/// `CUmemAccessDesc` / `hipMemAccessDesc`.
#[repr(C)]
struct Access {
    location_type: c_int,
    id: c_int,
    flags: c_uint,
}

/// `CUipcMemHandle` / `hipIpcMemHandle_t`: 64 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct IpcHandle([u8; 64]);

// ---- the calls, on either vendor -------------------------------------------------------------

fn create(gpu: &Gpu, size: u64, handle_types: c_int) -> (R, u64) {
    let f = call!(
        gpu,
        "cuMemCreate",
        "hipMemCreate",
        unsafe extern "C" fn(*mut u64, usize, *const Prop, u64) -> R
    );
    let mut h = 0;
    // SAFETY: one handle written; the prop is the vendors' layout.
    let rc = unsafe { f(&mut h, size as usize, &prop(handle_types), 0) };
    (rc, h)
}

fn release(gpu: &Gpu, h: u64) -> R {
    let f = call!(
        gpu,
        "cuMemRelease",
        "hipMemRelease",
        unsafe extern "C" fn(u64) -> R
    );
    // SAFETY: a handle by value.
    unsafe { f(h) }
}

fn export(gpu: &Gpu, h: u64, kind: c_int, flags: u64) -> (R, c_int) {
    let f = call!(
        gpu,
        "cuMemExportToShareableHandle",
        "hipMemExportToShareableHandle",
        unsafe extern "C" fn(*mut c_void, u64, c_int, u64) -> R
    );
    let mut fd: c_int = -1;
    // SAFETY: an int written for POSIX_FD.
    let rc = unsafe { f((&mut fd as *mut c_int).cast(), h, kind, flags) };
    (rc, fd)
}

fn import(gpu: &Gpu, fd: c_int) -> (R, u64) {
    let f = call!(
        gpu,
        "cuMemImportFromShareableHandle",
        "hipMemImportFromShareableHandle",
        unsafe extern "C" fn(*mut u64, *mut c_void, c_int) -> R
    );
    let mut h = 0;
    // SAFETY: the descriptor's value cast to a pointer, as both vendors take it.
    let rc = unsafe { f(&mut h, fd as isize as *mut c_void, 1) };
    (rc, h)
}

/// Reserves `size` bytes and maps `h` there; the address.
fn map(gpu: &Gpu, h: u64, size: u64) -> u64 {
    let reserve = call!(
        gpu,
        "cuMemAddressReserve",
        "hipMemAddressReserve",
        unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> R
    );
    let map = call!(
        gpu,
        "cuMemMap",
        "hipMemMap",
        unsafe extern "C" fn(u64, usize, usize, u64, u64) -> R
    );
    let mut va = 0;
    // SAFETY: the vendors' signatures; the fake checks the arguments.
    unsafe {
        assert_eq!(reserve(&mut va, size as usize, 0, 0, 0), 0);
        assert_eq!(map(va, size as usize, 0, h, 0), 0);
    }
    va
}

/// Grants read-write access over [va, va + size) to device 0 or to the host (location 2).
fn access(gpu: &Gpu, va: u64, size: u64, host: bool) -> R {
    let f = call!(
        gpu,
        "cuMemSetAccess",
        "hipMemSetAccess",
        unsafe extern "C" fn(u64, usize, *const Access, usize) -> R
    );
    let desc = Access {
        location_type: if host { 2 } else { 1 },
        id: 0,
        flags: 3,
    };
    // SAFETY: one descriptor.
    unsafe { f(va, size as usize, &desc, 1) }
}

fn unmap_and_free(gpu: &Gpu, va: u64, size: u64) {
    let unmap = call!(
        gpu,
        "cuMemUnmap",
        "hipMemUnmap",
        unsafe extern "C" fn(u64, usize) -> R
    );
    let free = call!(
        gpu,
        "cuMemAddressFree",
        "hipMemAddressFree",
        unsafe extern "C" fn(u64, usize) -> R
    );
    // SAFETY: a mapped range of a reservation.
    unsafe {
        assert_eq!(unmap(va, size as usize), 0);
        assert_eq!(free(va, size as usize), 0);
    }
}

fn fill(gpu: &Gpu, va: u64, size: u64, byte: u8) {
    let f = call!(
        gpu,
        "cuMemsetD8_v2",
        "hipMemsetD8",
        unsafe extern "C" fn(u64, u8, usize) -> R
    );
    // SAFETY: device memory of the fake's.
    assert_eq!(unsafe { f(va, byte, size as usize) }, 0);
}

/// The byte [va, va + size) holds throughout, or 256 when it holds several.
fn read(gpu: &Gpu, va: u64, size: u64) -> u64 {
    let mut bytes = vec![0u8; size as usize];
    assert_eq!(gpu.dtoh(bytes.as_mut_ptr(), va, bytes.len()), 0);
    if bytes.iter().all(|&b| b == bytes[0]) {
        u64::from(bytes[0])
    } else {
        256
    }
}

fn ipc_get(gpu: &Gpu, p: u64) -> (R, IpcHandle) {
    let f = call!(
        gpu,
        "cuIpcGetMemHandle",
        "hipIpcGetMemHandle",
        unsafe extern "C" fn(*mut IpcHandle, u64) -> R
    );
    let mut h = IpcHandle([0xee; 64]);
    // SAFETY: 64 bytes written.
    let rc = unsafe { f(&mut h, p) };
    (rc, h)
}

fn ipc_open(gpu: &Gpu, h: IpcHandle, flags: c_uint) -> (R, u64) {
    let f = call!(
        gpu,
        "cuIpcOpenMemHandle_v2",
        "hipIpcOpenMemHandle",
        unsafe extern "C" fn(*mut u64, IpcHandle, c_uint) -> R
    );
    let mut p = 0;
    // SAFETY: the handle by value, a pointer written.
    let rc = unsafe { f(&mut p, h, flags) };
    (rc, p)
}

fn ipc_close(gpu: &Gpu, p: u64) -> R {
    let f = call!(
        gpu,
        "cuIpcCloseMemHandle",
        "hipIpcCloseMemHandle",
        unsafe extern "C" fn(u64) -> R
    );
    // SAFETY: a pointer by value.
    unsafe { f(p) }
}

fn hex(h: &IpcHandle) -> String {
    h.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> IpcHandle {
    let mut h = IpcHandle([0; 64]);
    for (i, b) in h.0.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex");
    }
    h
}

/// A descriptor of another process's descriptor `fd` (what SCM_RIGHTS would carry).
fn open_theirs(pid: u64, fd: u64) -> c_int {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .expect("the exporter's descriptor")
        .into_raw_fd()
}

/// The descriptors this process has open (`/proc/self/fd`, less the one reading it).
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
        - 1
}

fn close(fd: c_int) {
    extern "C" {
        fn close(fd: c_int) -> c_int;
    }
    // SAFETY: a descriptor this process owns.
    assert_eq!(unsafe { close(fd) }, 0);
}

// ---- the child ---------------------------------------------------------------------------

/// A child process's part: nothing unless `IPC_ROLE` says which vendor it drives.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let gpu = Gpu::new(if role == "cuda" { CUDA12 } else { HIP });
    say(&format!("ready {}", std::process::id()));
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("a command");
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| words[i].parse::<u64>().expect("a number");
        let answer = match words[0] {
            // A handle requesting POSIX_FD, mapped with access: handle, address.
            "create" => {
                let (rc, h) = create(&gpu, SIZE, 1);
                assert_eq!(rc, 0);
                let va = map(&gpu, h, SIZE);
                assert_eq!(access(&gpu, va, SIZE, false), 0);
                format!("{h} {va}")
            }
            "export" => {
                let (rc, fd) = export(&gpu, num(1), 1, 0);
                format!("{rc} {fd}")
            }
            // import PID FD keep|close: code, handle, this process's descriptor.
            "import" => {
                let fd = open_theirs(num(1), num(2));
                let (rc, h) = import(&gpu, fd);
                if words[3] == "close" {
                    close(fd);
                }
                format!("{rc} {h} {fd}")
            }
            "closefd" => {
                close(num(1) as c_int);
                "0".to_owned()
            }
            // The process's open descriptors.
            "fds" => open_descriptors().to_string(),
            // many N: creates N exportable handles (unmapped, never exported) and releases
            // them: the descriptors open before, with them all, and after.
            "many" => {
                let before = open_descriptors();
                let handles: Vec<u64> = (0..num(1))
                    .map(|_| {
                        let (rc, h) = create(&gpu, SIZE, 1);
                        assert_eq!(rc, 0);
                        h
                    })
                    .collect();
                let with = open_descriptors();
                for h in handles {
                    assert_eq!(release(&gpu, h), 0);
                }
                format!("{before} {with} {}", open_descriptors())
            }
            "map" => map(&gpu, num(1), SIZE).to_string(),
            // access VA host|device: the code.
            "access" => access(&gpu, num(1), SIZE, words[2] == "host").to_string(),
            "unmap" => {
                unmap_and_free(&gpu, num(1), SIZE);
                "0".to_owned()
            }
            "release" => release(&gpu, num(1)).to_string(),
            "fill" => {
                fill(&gpu, num(1), num(2), num(3) as u8);
                "0".to_owned()
            }
            "read" => read(&gpu, num(1), num(2)).to_string(),
            "alloc" => gpu.malloc(num(1) as usize).to_string(),
            "free" => gpu.free(num(1)).to_string(),
            "ipcget" => {
                let (rc, h) = ipc_get(&gpu, num(1));
                format!("{rc} {}", hex(&h))
            }
            "ipcopen" => {
                let (rc, p) = ipc_open(&gpu, unhex(words[1]), num(2) as c_uint);
                format!("{rc} {p}")
            }
            "ipcclose" => ipc_close(&gpu, num(1)).to_string(),
            "info" => {
                let f = call!(
                    gpu,
                    "cuMemGetInfo_v2",
                    "hipMemGetInfo",
                    unsafe extern "C" fn(*mut usize, *mut usize) -> R
                );
                let (mut free, mut total) = (0usize, 0usize);
                // SAFETY: two sizes written.
                assert_eq!(unsafe { f(&mut free, &mut total) }, 0);
                format!("{free} {total}")
            }
            "quit" => break,
            other => panic!("no command {other}"),
        };
        say(&answer);
    }
}

fn say(line: &str) {
    println!("@@ {line}");
    std::io::stdout().flush().expect("stdout");
}

// ---- the parent's side -------------------------------------------------------------------

/// A child process, killed if still running when dropped.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    answers: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    pid: u64,
}

impl Proc {
    /// A child driving `driver`, on the shared device `shared` (None: a private device), with
    /// the environment `env` besides.
    fn start(driver: Driver, shared: Option<&SharedDevice>, env: &[(&str, &str)]) -> Proc {
        let mut command = Command::new(std::env::current_exe().expect("this test binary"));
        command
            .args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env(
                ROLE,
                match driver.vendor {
                    Vendor::Cuda => "cuda",
                    Vendor::Hip => "hip",
                },
            )
            .env_remove("FAKE_SHARED_DEVICE")
            .env_remove("FAKEHIP_PROFILE")
            .env("FAKECUDA_CAPACITY", CAPACITY.to_string())
            .env("FAKEHIP_CAPACITY", CAPACITY.to_string())
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(device) = shared {
            device.apply(&mut command);
        }
        let mut child = command.spawn().expect("a child process");
        let (tx, answers) = channel();
        let stdout = child.stdout.take().expect("its stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
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
        };
        let ready = p.answer();
        let words: Vec<&str> = ready.split_whitespace().collect();
        assert_eq!(words[0], "ready", "{ready}");
        p.pid = words[1].parse().expect("a pid");
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

    fn text(&mut self, command: &str) -> String {
        let stdin = self.stdin.as_mut().expect("running");
        writeln!(stdin, "{command}").expect("a command sent");
        stdin.flush().expect("sent");
        self.answer()
    }

    fn ask(&mut self, command: &str) -> Vec<u64> {
        let a = self.text(command);
        a.split_whitespace()
            .map(|w| w.parse().unwrap_or_else(|_| panic!("{command}: {a}")))
            .collect()
    }

    /// A mapped exportable handle: (handle, address).
    fn create(&mut self) -> (u64, u64) {
        let a = self.ask("create");
        (a[0], a[1])
    }

    /// The exported descriptor (in this child).
    fn export(&mut self, h: u64) -> u64 {
        let a = self.ask(&format!("export {h}"));
        assert_eq!(a[0], 0, "exported");
        a[1]
    }

    /// Imports `from`'s descriptor `fd`: (code, handle, this child's descriptor).
    fn import(&mut self, from: &Proc, fd: u64, keep: bool) -> (u64, u64, u64) {
        let a = self.ask(&format!(
            "import {} {fd} {}",
            from.pid,
            if keep { "keep" } else { "close" }
        ));
        (a[0], a[1], a[2])
    }

    fn read(&mut self, va: u64, n: u64) -> u64 {
        self.ask(&format!("read {va} {n}"))[0]
    }

    fn ok(&mut self, command: &str) {
        assert_eq!(self.ask(command), [0], "{command}");
    }

    fn used(&mut self) -> u64 {
        let a = self.ask("info");
        a[1] - a[0]
    }

    fn quit(mut self) {
        writeln!(self.stdin.as_mut().expect("running"), "quit").expect("sent");
        self.stdin = None;
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("its status") {
                assert!(status.success(), "child {}: {status}", self.pid);
                return;
            }
            assert!(Instant::now() < deadline, "child {} did not end", self.pid);
            std::thread::sleep(Duration::from_millis(10));
        }
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

// ---- shareable handles across processes -----------------------------------------------------

/// One process creates an exportable handle, writes it and exports a descriptor; another
/// imports it, maps it and reads the same bytes, and sees later writes. The exporter releases
/// and exits: the importer still reads. On a shared device the bytes count once throughout,
/// whoever holds them, and go back when the last holder releases.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn an_exported_handle_is_the_same_memory_in_the_importer(driver: Driver) {
    let device = SharedDevice::unique();
    let mut a = Proc::start(driver, Some(&device), &[]);
    let mut b = Proc::start(driver, Some(&device), &[]);
    let (h, va) = a.create();
    a.ok(&format!("fill {va} {SIZE} 165"));
    let fd = a.export(h);
    assert_eq!(device.used(0), SIZE);
    let objects = device.objects();
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(
        (objects[0].size, &objects[0].holders[..]),
        (SIZE, &[a.pid as u32][..])
    );
    assert_eq!(objects[0].key >> 32, a.pid, "the creator's pid in its key");

    let (rc, hb, _) = b.import(&a, fd, false);
    assert_eq!(rc, 0, "imported; its descriptor closed at once");
    let vb = b.ask(&format!("map {hb}"))[0];
    assert_eq!(b.ask(&format!("access {vb} device")), [0]);
    assert_eq!(b.read(vb, SIZE), 165, "the exporter's bytes");
    assert_eq!(device.used(0), SIZE, "counted once");
    assert_eq!(b.used(), SIZE, "what the importer's driver reports used");
    let mut holders: Vec<u32> = device.objects()[0].holders.clone();
    holders.sort_unstable();
    let mut both = vec![a.pid as u32, b.pid as u32];
    both.sort_unstable();
    assert_eq!(holders, both);
    for p in [a.pid, b.pid] {
        assert!(
            device
                .holders(0)
                .iter()
                .any(|h| h.pid == p as u32 && h.bytes == SIZE),
            "{p} holds it: {:?}",
            device.holders(0)
        );
    }

    a.ok(&format!("fill {va} {SIZE} 60"));
    assert_eq!(b.read(vb, SIZE), 60, "a later write, seen");
    a.ok(&format!("unmap {va}"));
    assert_eq!(a.ask(&format!("release {h}")), [0]);
    assert_eq!(device.used(0), SIZE, "the importer still holds it");
    a.quit();
    assert_eq!(
        b.read(vb, SIZE),
        60,
        "the exporter is gone, the bytes are not"
    );
    assert_eq!(device.used(0), SIZE);
    assert_eq!(device.objects()[0].holders, [b.pid as u32]);

    b.ok(&format!("unmap {vb}"));
    assert_eq!(b.ask(&format!("release {hb}")), [0]);
    assert_eq!(device.used(0), 0, "the last holder let go");
    assert_eq!(device.objects(), []);
    b.quit();
}

/// A handle created exportable holds no descriptor until it is exported, as with the vendors'
/// drivers (CUDA opens one at `cuMemExportToShareableHandle`): many of them open nothing. The
/// first export of a handle mapped and written moves it into a memory file of its own under
/// its mapping: the exporter's pointer reads what it wrote, the importer reads the same, and
/// each sees the other's later writes. The exporter's file is closed at its release.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn an_exportable_handle_holds_no_descriptor_until_exported(driver: Driver) {
    let capacity = (1024 * MIB).to_string();
    let env = [
        ("FAKECUDA_CAPACITY", &capacity[..]),
        ("FAKEHIP_CAPACITY", &capacity[..]),
    ];
    let mut a = Proc::start(driver, None, &env);
    let mut b = Proc::start(driver, None, &env);
    let (h, va) = a.create();
    let counts = a.ask("many 200");
    assert_eq!(
        (counts[1], counts[2]),
        (counts[0], counts[0]),
        "200 exportable handles: no descriptor opened"
    );
    // Written in two halves, one all zeros (a hole of the memory file).
    a.ok(&format!("fill {va} {} 77", SIZE / 2));
    let before = a.ask("fds")[0];
    let fd = a.export(h);
    assert_eq!(
        a.ask("fds")[0],
        before + 2,
        "exported: its memory file, and the descriptor given"
    );
    assert_eq!(a.read(va, SIZE / 2), 77, "the exporter's pointer, moved");
    assert_eq!(a.read(va + SIZE / 2, SIZE / 2), 0);
    let (rc, hb, _) = b.import(&a, fd, false);
    assert_eq!(rc, 0);
    a.ok(&format!("closefd {fd}"));
    let vb = b.ask(&format!("map {hb}"))[0];
    assert_eq!(b.ask(&format!("access {vb} device")), [0]);
    assert_eq!(
        b.read(vb, SIZE / 2),
        77,
        "the bytes written before the export"
    );
    assert_eq!(b.read(vb + SIZE / 2, SIZE / 2), 0);
    a.ok(&format!("fill {va} {SIZE} 12"));
    assert_eq!(
        b.read(vb, SIZE),
        12,
        "the exporter's writes after the export"
    );
    b.ok(&format!("fill {vb} {SIZE} 34"));
    assert_eq!(a.read(va, SIZE), 34, "and the importer's");
    // A second export gives another descriptor of the same file: nothing moves again.
    let again = a.export(h);
    assert_eq!(a.ask("fds")[0], before + 2);
    a.ok(&format!("closefd {again}"));
    assert_eq!(a.read(va, SIZE), 34);
    a.ok(&format!("unmap {va}"));
    assert_eq!(a.ask(&format!("release {h}")), [0]);
    assert_eq!(a.ask("fds")[0], before, "released: its file closed");
    assert_eq!(a.used(), 0);
    assert_eq!(b.read(vb, SIZE), 34, "the importer keeps the bytes");
    a.quit();
    b.quit();
}

/// On a shared device an exportable handle is its creator's until exported (charged to its
/// slot, no object); its first export moves the charge into an object of the device, and the
/// device counts its bytes once before, across and after the move. A handle never exported
/// gives its bytes back from the slot.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn the_first_export_moves_the_charge_into_an_object(driver: Driver) {
    use portalloc_fakes::Holder;
    let device = SharedDevice::unique();
    let mut a = Proc::start(driver, Some(&device), &[]);
    let mut b = Proc::start(driver, Some(&device), &[]);
    let (h, va) = a.create();
    let (never, vn) = a.create();
    a.ok(&format!("fill {va} {SIZE} 99"));
    let pid = a.pid as u32;
    let mine = |bytes| vec![Holder { pid, bytes }];
    assert_eq!(device.used(0), 2 * SIZE);
    assert_eq!(device.objects(), [], "no object before an export");
    assert_eq!(device.holders(0), mine(2 * SIZE));
    assert_eq!(
        b.ask("info")[0],
        CAPACITY - 2 * SIZE,
        "what another process sees free"
    );

    let fd = a.export(h);
    assert_eq!(device.used(0), 2 * SIZE, "counted once across the move");
    let objects = device.objects();
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!(
        (objects[0].size, &objects[0].holders[..]),
        (SIZE, &[a.pid as u32][..])
    );
    assert_eq!(objects[0].key >> 32, a.pid, "the creator's pid in its key");
    assert_eq!(
        device.holders(0),
        mine(2 * SIZE),
        "its slot less, the object more"
    );
    assert_eq!(a.used(), 2 * SIZE, "what the creator's driver reports used");
    assert_eq!(b.ask("info")[0], CAPACITY - 2 * SIZE);
    let again = a.export(h);
    assert_ne!(again, fd);
    a.ok(&format!("closefd {again}"));
    assert_eq!(device.used(0), 2 * SIZE, "a second export changes nothing");
    assert_eq!(device.objects().len(), 1);

    let (rc, hb, _) = b.import(&a, fd, false);
    assert_eq!(rc, 0);
    let vb = b.ask(&format!("map {hb}"))[0];
    assert_eq!(b.ask(&format!("access {vb} device")), [0]);
    assert_eq!(b.read(vb, SIZE), 99);
    assert_eq!(device.used(0), 2 * SIZE, "the import counts nothing more");

    // The handle never exported goes back from the creator's slot.
    a.ok(&format!("unmap {vn}"));
    assert_eq!(a.ask(&format!("release {never}")), [0]);
    assert_eq!(device.used(0), SIZE);
    assert_eq!(device.holders(0).len(), 2, "{:?}", device.holders(0));
    a.ok(&format!("unmap {va}"));
    assert_eq!(a.ask(&format!("release {h}")), [0]);
    assert_eq!(device.used(0), SIZE, "the importer holds the object");
    assert_eq!(
        device.holders(0),
        [Holder {
            pid: b.pid as u32,
            bytes: SIZE
        }]
    );
    b.ok(&format!("unmap {vb}"));
    assert_eq!(b.ask(&format!("release {hb}")), [0]);
    assert_eq!(device.used(0), 0);
    assert_eq!(device.objects(), []);
    a.quit();
    b.quit();
}

/// A killed importer's hold is ignored: the object goes once the creator lets go.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_killed_holder_holds_nothing(driver: Driver) {
    let device = SharedDevice::unique();
    let mut a = Proc::start(driver, Some(&device), &[]);
    let mut b = Proc::start(driver, Some(&device), &[]);
    let (h, va) = a.create();
    let fd = a.export(h);
    assert_eq!(b.import(&a, fd, false).0, 0);
    b.child.kill().expect("killed");
    b.child.wait().expect("reaped");
    assert_eq!(device.used(0), SIZE, "the creator holds it");
    a.ok(&format!("unmap {va}"));
    assert_eq!(a.ask(&format!("release {h}")), [0]);
    assert_eq!(device.used(0), 0, "a dead importer holds nothing");
    assert_eq!(a.used(), 0, "and the drivers say so");
    a.quit();
}

/// Without a shared device each process has its own: an import charges the importer's.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn an_import_charges_a_private_importer(driver: Driver) {
    let mut a = Proc::start(driver, None, &[]);
    let mut b = Proc::start(driver, None, &[]);
    let (h, va) = a.create();
    a.ok(&format!("fill {va} {SIZE} 7"));
    let fd = a.export(h);
    assert_eq!(b.used(), 0);
    let (rc, hb, _) = b.import(&a, fd, false);
    assert_eq!(rc, 0);
    assert_eq!((a.used(), b.used()), (SIZE, SIZE));
    let vb = b.ask(&format!("map {hb}"))[0];
    assert_eq!(b.ask(&format!("access {vb} device")), [0]);
    assert_eq!(b.read(vb, SIZE), 7);
    b.ok(&format!("unmap {vb}"));
    assert_eq!(b.ask(&format!("release {hb}")), [0]);
    assert_eq!(b.used(), 0);
    a.quit();
    b.quit();
}

/// What export and import refuse, and what the handles say of themselves, in one process.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn export_and_import_refuse_what_the_vendors_refuse(driver: Driver) {
    let gpu = Gpu::new(driver);
    let (rc, plain) = create(&gpu, SIZE, 0);
    assert_eq!(rc, 0);
    let (rc, shareable) = create(&gpu, SIZE, 1);
    assert_eq!(rc, 0, "POSIX_FD requested");
    assert_eq!(gpu.c().live("handles"), Some(2));
    assert_eq!(gpu.c().live("bytes"), Some(2 * SIZE as i64));
    assert_eq!(
        export(&gpu, plain, 1, 0).0,
        INVALID_VALUE as R,
        "not requested"
    );
    assert_eq!(
        export(&gpu, shareable, 8, 0).0,
        INVALID_VALUE as R,
        "another type"
    );
    assert_eq!(export(&gpu, shareable, 1, 1).0, INVALID_VALUE as R, "flags");
    assert_eq!(
        export(&gpu, 0x1234, 1, 0).0,
        INVALID_VALUE as R,
        "no such handle"
    );
    let f = call!(
        gpu,
        "cuMemExportToShareableHandle",
        "hipMemExportToShareableHandle",
        unsafe extern "C" fn(*mut c_void, u64, c_int, u64) -> R
    );
    // SAFETY: refused before anything is written.
    assert_eq!(
        unsafe { f(std::ptr::null_mut(), shareable, 1, 0) },
        INVALID_VALUE as R
    );
    let (rc, fd) = export(&gpu, shareable, 1, 0);
    assert_eq!(rc, 0);
    let (rc2, fd2) = export(&gpu, shareable, 1, 0);
    assert_eq!(rc2, 0);
    assert_ne!(fd, fd2, "a new descriptor each time");
    close(fd2);

    // Anything but the fake's exportable memory is refused.
    let null = std::fs::File::open("/dev/null")
        .expect("/dev/null")
        .into_raw_fd();
    assert_eq!(import(&gpu, null).0, INVALID_VALUE as R, "another file");
    close(null);
    assert_eq!(import(&gpu, 999_999).0, INVALID_VALUE as R, "no descriptor");
    assert_eq!(import(&gpu, -1).0, INVALID_VALUE as R);

    // Imported in the exporting process too: the same bytes through either handle.
    let (rc, imported) = import(&gpu, fd);
    assert_eq!(rc, 0);
    close(fd);
    let (va, vi) = (map(&gpu, shareable, SIZE), map(&gpu, imported, SIZE));
    assert_eq!(access(&gpu, va, SIZE, false), 0);
    assert_eq!(access(&gpu, vi, SIZE, false), 0);
    fill(&gpu, va, SIZE, 42);
    assert_eq!(read(&gpu, vi, SIZE), 42);

    // The properties each handle was made with.
    let props = call!(
        gpu,
        "cuMemGetAllocationPropertiesFromHandle",
        "hipMemGetAllocationPropertiesFromHandle",
        unsafe extern "C" fn(*mut Prop, u64) -> R
    );
    for (h, types) in [(plain, 0), (shareable, 1), (imported, 1)] {
        let mut p = prop(99);
        // SAFETY: one prop written.
        assert_eq!(unsafe { props(&mut p, h) }, 0);
        assert_eq!(
            (p.kind, p.handle_types, p.location_type, p.location_id),
            (1, types, 1, 0)
        );
    }
    let mut p = prop(0);
    // SAFETY: as above.
    assert_eq!(unsafe { props(&mut p, 0x1234) }, INVALID_VALUE as R);

    unmap_and_free(&gpu, va, SIZE);
    unmap_and_free(&gpu, vi, SIZE);
    for h in [plain, shareable, imported] {
        assert_eq!(release(&gpu, h), 0);
    }
    assert_eq!(
        export(&gpu, shareable, 1, 0).0,
        INVALID_VALUE as R,
        "released"
    );
    assert_eq!(gpu.c().live("handles"), Some(0));
    assert_eq!(gpu.c().live("bytes"), Some(0));
}

/// CUDA refuses a fabric handle as a driver without fabric (IMEX) support does, and unknown
/// handle types as invalid values.
#[test]
fn cuda_refuses_fabric_and_unknown_handle_types() {
    let gpu = Gpu::new(CUDA12);
    assert_eq!(create(&gpu, SIZE, 8).0, NOT_SUPPORTED);
    assert_eq!(create(&gpu, SIZE, 1 | 8).0, NOT_SUPPORTED);
    assert_eq!(
        create(&gpu, SIZE, 2).0,
        INVALID_VALUE as R,
        "a Windows handle"
    );
    assert_eq!(create(&gpu, SIZE, 16).0, INVALID_VALUE as R);
    assert_eq!(gpu.c().live("handles"), Some(0));
}

// ---- legacy IPC handles -----------------------------------------------------------------------

/// A plain allocation's handle opens in another process over the same bytes; its 64 bytes
/// are the same each time and laid out as fake_ipc.h says; what the vendors refuse is refused.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_legacy_handle_opens_the_same_bytes_in_another_process(driver: Driver) {
    let device = SharedDevice::unique();
    let mut a = Proc::start(driver, Some(&device), &[]);
    let mut b = Proc::start(driver, Some(&device), &[]);
    let p = a.ask(&format!("alloc {MIB}"))[0];
    a.ok(&format!("fill {p} {MIB} 17"));
    let first = a.text(&format!("ipcget {p}"));
    let second = a.text(&format!("ipcget {p}"));
    assert_eq!(first, second, "exported twice, the same bytes");
    let (rc, text) = first.split_once(' ').expect("code and handle");
    assert_eq!(rc, "0");
    let h = unhex(text);
    assert_eq!(&h.0[..8], b"PAFAKIPC");
    assert_eq!(
        u32::from_le_bytes(h.0[8..12].try_into().unwrap()),
        a.pid as u32
    );
    assert_eq!(u64::from_le_bytes(h.0[24..32].try_into().unwrap()), MIB);
    assert_eq!(
        u32::from_le_bytes(h.0[40..44].try_into().unwrap()),
        0,
        "device 0"
    );
    assert_eq!(&h.0[44..], &[0u8; 20][..], "no byte left unwritten");

    assert_eq!(
        a.read(p, MIB),
        17,
        "the pointer did not change, nor its bytes"
    );
    let opened = b.ask(&format!("ipcopen {text} 1"));
    assert_eq!(opened[0], 0);
    let q = opened[1];
    assert_eq!(b.read(q, MIB), 17);
    a.ok(&format!("fill {p} {MIB} 34"));
    assert_eq!(b.read(q, MIB), 34, "one memory");
    b.ok(&format!("fill {q} 4096 51"));
    assert_eq!(a.read(p, 4096), 51, "both ways");
    assert_eq!(
        b.ask(&format!("ipcopen {text} 1")),
        [0, q],
        "opened again: the same pointer"
    );
    assert_eq!(
        b.ask(&format!("ipcopen {text} 0")),
        [INVALID_VALUE, 0],
        "flags"
    );
    assert_eq!(
        device.holders(0),
        [portalloc_fakes::Holder {
            pid: a.pid as u32,
            bytes: MIB
        }],
        "charged to the exporter only"
    );
    assert_eq!(b.ask(&format!("ipcclose {q}")), [0]);
    assert_eq!(b.read(q, 4096), 51, "still open once");
    assert_eq!(b.ask(&format!("ipcclose {q}")), [0]);
    assert_eq!(b.ask(&format!("ipcclose {q}")), [INVALID_VALUE], "closed");

    // Refused: the exporting process itself; an interior pointer; VMM memory.
    assert_eq!(a.ask(&format!("ipcopen {text} 1")), [INVALID_CONTEXT, 0]);
    assert_eq!(
        a.text(&format!("ipcget {}", p + 256)).split(' ').next(),
        Some("1")
    );
    let (_, va) = a.create();
    assert_eq!(a.text(&format!("ipcget {va}")).split(' ').next(), Some("1"));
    // A freed allocation's handle.
    assert_eq!(a.ask(&format!("free {p}")), [0]);
    assert_eq!(b.ask(&format!("ipcopen {text} 1")), [INVALID_HANDLE, 0]);
    // A dead exporter's.
    let mut c = Proc::start(driver, Some(&device), &[]);
    let r = c.ask(&format!("alloc {MIB}"))[0];
    let theirs = c.text(&format!("ipcget {r}"));
    c.quit();
    let theirs = theirs.split_once(' ').expect("code and handle").1;
    assert_eq!(b.ask(&format!("ipcopen {theirs} 1")), [INVALID_HANDLE, 0]);
    a.quit();
    b.quit();
}

/// A handle of a freed allocation whose descriptor number the exporter reused is refused
/// (the memory file's name names the allocation), and the exporter's bytes stay in place
/// across its export.
#[test_case(CUDA12 ; "cuda")]
#[test_case(HIP ; "hip")]
fn a_reused_descriptor_is_not_the_freed_allocation(driver: Driver) {
    let mut a = Proc::start(driver, None, &[]);
    let mut b = Proc::start(driver, None, &[]);
    let p = a.ask(&format!("alloc {MIB}"))[0];
    let old = a.text(&format!("ipcget {p}"));
    a.ok(&format!("free {p}"));
    let p2 = a.ask(&format!("alloc {MIB}"))[0];
    let new = a.text(&format!("ipcget {p2}"));
    let (old, new) = (unhex(&old[2..]), unhex(&new[2..]));
    assert_eq!(
        old.0[12..16],
        new.0[12..16],
        "the same descriptor number, reused"
    );
    assert_ne!(old.0[32..40], new.0[32..40], "another allocation");
    assert_eq!(
        b.ask(&format!("ipcopen {} 1", hex(&old))),
        [INVALID_HANDLE, 0]
    );
    assert_eq!(b.ask(&format!("ipcopen {} 1", hex(&new)))[0], 0);
    a.quit();
    b.quit();
}

// ---- ROCm's reports on imports ----------------------------------------------------------------

/// rocm-systems-11185-import-host-access (and its alias rocm-7.15): a host location over an
/// imported handle is refused; device locations over it, and host locations over a handle of
/// the process's own, are not. As documented, all three work.
#[test_case("documented", 0 ; "documented")]
#[test_case("rocm-systems-11185-import-host-access", INVALID_VALUE ; "reported")]
#[test_case("rocm-7.15", INVALID_VALUE ; "alias")]
fn rocm_11185_host_access_to_an_imported_handle(profile: &str, refused: u64) {
    let mut a = Proc::start(HIP, None, &[]);
    let mut b = Proc::start(HIP, None, &[("FAKEHIP_PROFILE", profile)]);
    let (h, va) = a.create();
    a.ok(&format!("fill {va} {SIZE} 9"));
    let fd = a.export(h);
    let (rc, hb, _) = b.import(&a, fd, false);
    assert_eq!(rc, 0);
    let vb = b.ask(&format!("map {hb}"))[0];
    assert_eq!(b.ask(&format!("access {vb} host")), [refused]);
    assert_eq!(b.ask(&format!("access {vb} device")), [0]);
    assert_eq!(b.read(vb, SIZE), 9);
    let (_, own) = b.create();
    assert_eq!(b.ask(&format!("access {own} host")), [0], "its own handle");
    a.quit();
    b.quit();
}

/// rocm-systems-8440-import-needs-fd: the import holds no descriptor of its own, so closing
/// the caller's before set-access makes set-access fail; kept open, it works. As documented,
/// the caller may close it at once.
#[test_case("documented", true, 0 ; "documented closed")]
#[test_case("rocm-systems-8440-import-needs-fd", true, INVALID_VALUE ; "reported closed")]
#[test_case("rocm-systems-8440-import-needs-fd", false, 0 ; "reported kept")]
fn rocm_8440_an_import_needs_the_callers_descriptor(profile: &str, closed: bool, refused: u64) {
    let mut a = Proc::start(HIP, None, &[]);
    let mut b = Proc::start(HIP, None, &[("FAKEHIP_PROFILE", profile)]);
    let (h, va) = a.create();
    a.ok(&format!("fill {va} {SIZE} 5"));
    let fd = a.export(h);
    let (rc, hb, mine) = b.import(&a, fd, true);
    assert_eq!(rc, 0);
    if closed {
        b.ok(&format!("closefd {mine}"));
    }
    let vb = b.ask(&format!("map {hb}"))[0];
    assert_eq!(b.ask(&format!("access {vb} device")), [refused]);
    if refused == 0 {
        assert_eq!(b.read(vb, SIZE), 5);
    }
    a.quit();
    b.quit();
}

/// An exportable handle is a handle like any other: CUDA's pointer attribute names its handle
/// types, and under rocm-systems-10604-descriptor-per-handle (a descriptor held per handle)
/// it is created, exported and released as any handle.
#[test]
fn an_exportable_handle_keeps_the_other_rules() {
    let gpu = Gpu::new(CUDA12);
    let (rc, h) = create(&gpu, SIZE, 1);
    assert_eq!(rc, 0);
    let va = map(&gpu, h, SIZE);
    assert_eq!(access(&gpu, va, SIZE, false), 0);
    let attr: unsafe extern "C" fn(*mut c_void, c_int, u64) -> R =
        gpu.fake.sym("cuPointerGetAttribute");
    let mut types = 99u64;
    // SAFETY: CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES (14) writes a u64.
    assert_eq!(unsafe { attr((&mut types as *mut u64).cast(), 14, va) }, 0);
    assert_eq!(types, 1, "POSIX_FD");
    let p = gpu.malloc(4096);
    // SAFETY: as above.
    assert_eq!(unsafe { attr((&mut types as *mut u64).cast(), 14, p) }, 0);
    assert_eq!(types, 0);
    unmap_and_free(&gpu, va, SIZE);
    assert_eq!(release(&gpu, h), 0);

    let hip = Gpu::new(HIP);
    let set: unsafe extern "C" fn(*const std::ffi::c_char) -> c_int =
        hip.fake.sym("fakehip_set_profile");
    // SAFETY: a NUL-terminated name.
    assert_eq!(
        unsafe { set(c"rocm-systems-10604-descriptor-per-handle".as_ptr()) },
        0
    );
    let (rc, h) = create(&hip, SIZE, 1);
    assert_eq!(rc, 0);
    assert_eq!(hip.c().live("handles"), Some(1));
    let (rc, fd) = export(&hip, h, 1, 0);
    assert_eq!(rc, 0, "exportable under the profile too");
    close(fd);
    assert_eq!(release(&hip, h), 0);
    assert_eq!(hip.c().live("handles"), Some(0));
}
