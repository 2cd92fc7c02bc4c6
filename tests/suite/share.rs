//! Export and import between real processes: a "trainer" exports a model's parameters, a
//! "rollout" imports them and reads the trainer's bytes, through frees, trims, sleeps and
//! `SIGKILL`s.
//!
//! Both are children (this binary again, running `share::child` with `PORTALLOC_SHARE_ROLE`
//! set), driven line by line on their standard input; each answers one `REPLY` line. The
//! oracle is the driver's own count of what each process holds — the fakes' shared device
//! (`portalloc_fakes::SharedDevice`), read by the parent, which loads no driver — and the
//! bytes themselves. Every child is killed after a time limit, so a hang fails the test.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use portalloc::share::{self, ShareHandle};
#[allow(unused_imports)]
use portalloc::Allocator as _;
use portalloc::{Allocation, Keep, Portalloc, Stream};

const ROLE: &str = "PORTALLOC_SHARE_ROLE";
const LIMIT: Duration = Duration::from_secs(60);

/// Qwen2.5-0.5B's parameters (hidden 896, intermediate 4864, 24 layers, 14 heads, 2 KV heads
/// of 64, vocabulary 151936, tied embeddings; its `config.json`), in bf16: 290 tensors, 988
/// MB. `layers` of them (24: the whole model), with the embedding (272 MB) when `embedding`.
fn qwen_parameters(layers: usize, embedding: bool) -> Vec<(String, u64)> {
    let (h, i, kv, vocab) = (896u64, 4864u64, 128u64, 151_936u64);
    let mut p = Vec::new();
    if embedding {
        p.push(("model.embed_tokens.weight".to_string(), vocab * h * 2));
    }
    for l in 0..layers {
        for (name, elems) in [
            ("self_attn.q_proj.weight", h * h),
            ("self_attn.q_proj.bias", h),
            ("self_attn.k_proj.weight", kv * h),
            ("self_attn.k_proj.bias", kv),
            ("self_attn.v_proj.weight", kv * h),
            ("self_attn.v_proj.bias", kv),
            ("self_attn.o_proj.weight", h * h),
            ("mlp.gate_proj.weight", i * h),
            ("mlp.up_proj.weight", i * h),
            ("mlp.down_proj.weight", h * i),
            ("input_layernorm.weight", h),
            ("post_attention_layernorm.weight", h),
        ] {
            p.push((format!("model.layers.{l}.{name}"), elems * 2));
        }
    }
    p.push(("model.norm.weight".to_string(), h * 2));
    p
}

/// The bytes of parameter `index` at `version`: 4 KiB pages of words that name both, each
/// page's first word its number too, so a byte of another buffer, version or page never
/// passes. Built and compared with whole-page copies (the test profile optimises little).
fn pattern(index: usize, version: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    fill(&mut v, index, version);
    v
}

const PAGE: usize = 4096;

fn template(index: usize, version: u64) -> Vec<u8> {
    let word = (version << 32) ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut t = vec![0u8; PAGE];
    for k in 0..PAGE / 8 {
        t[k * 8..k * 8 + 8].copy_from_slice(&word.wrapping_add(k as u64).to_le_bytes());
    }
    t
}

fn fill(v: &mut [u8], index: usize, version: u64) {
    let t = template(index, version);
    for (page, chunk) in v.chunks_mut(PAGE).enumerate() {
        let n = chunk.len();
        chunk.copy_from_slice(&t[..n]);
        let head = (page as u64).to_le_bytes();
        let m = n.min(8);
        chunk[..m].copy_from_slice(&head[..m]);
    }
}

/// Whether `v` is [`pattern`]`(index, version, v.len())`.
fn matches(v: &[u8], index: usize, version: u64) -> bool {
    let t = template(index, version);
    v.chunks(PAGE).enumerate().all(|(page, chunk)| {
        let n = chunk.len();
        let m = n.min(8);
        chunk[m..] == t[m..n] && chunk[..m] == (page as u64).to_le_bytes()[..m]
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

// ---- the children ----------------------------------------------------------------------

/// A trainer or rollout process: runs the commands its parent writes, one `REPLY` each.
#[test]
#[ignore = "a child process of the share tests (run with --ignored --exact share::child)"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    portalloc::sleep_tags::declare_sleepable("weights");
    let p = Portalloc::from_env().unwrap();
    let device = p.discovery.devices[0].clone();
    let a = p.allocator(0).unwrap();
    let sharing = p.sharing(0).unwrap().clone();
    let layers: usize = std::env::var("SHARE_LAYERS").unwrap().parse().unwrap();
    let params = qwen_parameters(layers, layers == 24);
    let mut held: Vec<Allocation> = Vec::new();
    let mut imports: Vec<share::ImportedBuffer> = Vec::new();
    let mut extra: Vec<(Portalloc, Allocation)> = Vec::new();
    let stdin = std::io::stdin();
    let reply = |s: String| {
        println!("REPLY {s}");
        std::io::stdout().flush().unwrap();
    };
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let (cmd, arg) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match (role.as_str(), cmd) {
            ("trainer", "alloc") => {
                for (_, size) in &params {
                    held.push(a.allocate(*size, 256, Stream::DEFAULT, "weights").unwrap());
                }
                reply(format!("allocated {}", held.len()));
            }
            ("trainer", "write") => {
                let version: u64 = arg.parse().unwrap();
                for (i, h) in held.iter().enumerate() {
                    let bytes = pattern(i, version, h.size());
                    portalloc::backends::staging::write_device(&*device, h.ptr(), &bytes).unwrap();
                }
                reply("written".into());
            }
            ("trainer", "export") => {
                let handles: Vec<String> = held
                    .iter()
                    .map(|h| hex(&sharing.export(h).unwrap().to_bytes()))
                    .collect();
                // Exporting again gives the same bytes.
                let again = hex(&sharing.export(&held[0]).unwrap().to_bytes());
                assert_eq!(again, handles[0]);
                reply(format!("handles {}", handles.join(",")));
            }
            ("trainer", "send") => {
                let socket = std::os::unix::net::UnixStream::connect(arg).unwrap();
                for h in &held {
                    let handle = sharing.export(h).unwrap();
                    let fds = sharing.descriptors(&handle).unwrap();
                    let borrowed: Vec<_> = fds.iter().map(std::os::fd::AsFd::as_fd).collect();
                    share::send(&socket, &handle, &borrowed).unwrap();
                }
                reply("sent".into());
            }
            ("trainer", "free") => {
                for h in held.drain(..) {
                    a.deallocate(h).unwrap();
                }
                reply(format!("parked {}", sharing.exports().1));
            }
            ("trainer", "trim") => {
                let trimmed = a.trim().unwrap();
                reply(format!(
                    "trimmed {trimmed} pool {} parked {}",
                    a.pool_bytes(),
                    sharing.exports().1
                ));
            }
            ("trainer", "sleep") => {
                let r = a.sleep("weights", Keep::Contents).unwrap();
                reply(format!(
                    "kept {} device {} pool {}",
                    r.kept_by_importers,
                    r.device_bytes,
                    a.pool_bytes()
                ));
            }
            ("trainer", "wake") => {
                a.wake("weights").unwrap();
                reply(format!("pool {}", a.pool_bytes()));
            }
            ("trainer", "check") => {
                let version: u64 = arg.parse().unwrap();
                for (i, h) in held.iter().enumerate() {
                    let mut got = vec![0u8; h.size() as usize];
                    portalloc::backends::staging::read_device(&*device, h.ptr(), &mut got).unwrap();
                    assert!(matches(&got, i, version), "trainer buffer {i}");
                }
                reply("checked".into());
            }
            ("trainer", "extra") => {
                // Another allocator of this process (another Portalloc): one buffer, written
                // and exported.
                let q = Portalloc::from_env().unwrap();
                let qa = q.allocator(0).unwrap();
                let b = qa
                    .allocate(2 << 20, 256, Stream::DEFAULT, "weights")
                    .unwrap();
                let index = 1000 + extra.len();
                portalloc::backends::staging::write_device(
                    &*q.discovery.devices[0],
                    b.ptr(),
                    &pattern(index, 7, b.size()),
                )
                .unwrap();
                let h = q.sharing(0).unwrap().export(&b).unwrap();
                extra.push((q, b));
                reply(format!("handle {} index {index}", hex(&h.to_bytes())));
            }
            ("trainer", "extra-drop") => {
                let (q, b) = extra.pop().unwrap();
                q.allocator(0).unwrap().deallocate(b).unwrap();
                drop(q);
                reply("dropped".into());
            }
            ("trainer", "importers") => {
                reply(format!("importers {}", sharing.importers(&held[0]).len()));
            }
            ("trainer", "free-one") => {
                let b = held.remove(0);
                a.deallocate(b).unwrap();
                reply(format!("parked {}", sharing.exports().1));
            }
            ("rollout", "try") => {
                // `try <times> <flip byte, or -> <hex>`: imports one handle `times` times,
                // with one byte flipped first if asked.
                let mut words = arg.splitn(3, ' ');
                let times: usize = words.next().unwrap().parse().unwrap();
                let flip = words.next().unwrap();
                let mut bytes = unhex(words.next().unwrap());
                if let Ok(at) = flip.parse::<usize>() {
                    bytes[at] ^= 1;
                }
                let outcome = ShareHandle::from_bytes(&bytes).and_then(|h| {
                    (0..times)
                        .map(|_| share::import(&device, &h))
                        .collect::<portalloc::Result<Vec<_>>>()
                });
                match outcome {
                    Ok(mut got) => {
                        let n = got.len();
                        imports.append(&mut got);
                        reply(format!("imported {n}"));
                    }
                    Err(e) => reply(format!("refused {e}")),
                }
            }
            ("rollout", "check-last") => {
                let (index, version) = arg.split_once(' ').unwrap();
                let b = imports.last().unwrap();
                let mut got = vec![0u8; b.size() as usize];
                b.read(0, &mut got).unwrap();
                let ok = matches(&got, index.parse().unwrap(), version.parse().unwrap());
                reply(format!("same {ok}"));
            }
            ("rollout", "import") => {
                for h in arg.split(',') {
                    let handle = ShareHandle::from_bytes(&unhex(h)).unwrap();
                    imports.push(share::import(&device, &handle).unwrap());
                }
                reply(format!(
                    "imported {} mapped {} pool {}",
                    imports.len(),
                    share::imported_bytes(),
                    a.pool_bytes()
                ));
            }
            ("rollout", "receive") => {
                let (path, count) = arg.split_once(' ').unwrap();
                let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
                reply("listening".into());
                let (socket, _) = listener.accept().unwrap();
                for _ in 0..count.parse::<usize>().unwrap() {
                    let (handle, fds) = share::receive(&socket).unwrap();
                    imports.push(share::import_with(&device, &handle, fds).unwrap());
                }
                reply(format!("imported {}", imports.len()));
            }
            ("rollout", "check") => {
                let version: u64 = arg.parse().unwrap();
                let bad: Vec<usize> = imports
                    .iter()
                    .enumerate()
                    .filter(|(i, b)| {
                        let mut got = vec![0u8; b.size() as usize];
                        b.read(0, &mut got).unwrap();
                        !matches(&got, *i, version)
                    })
                    .map(|(i, _)| i)
                    .collect();
                reply(format!("bad {bad:?}"));
            }
            ("rollout", "drop") => {
                imports.clear();
                reply(format!("dropped mapped {}", share::imported_bytes()));
            }
            (_, "exit") => {
                reply("bye".into());
                break;
            }
            other => panic!("unknown command {other:?}"),
        }
    }
    for h in held {
        a.deallocate(h).unwrap();
    }
}

// ---- the parent's side -----------------------------------------------------------------

/// A child process and its lines.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    log: String,
}

impl Peer {
    fn spawn(role: &str, env: &[(String, String)]) -> Peer {
        let module = module_path!().split_once("::").map_or("", |(_, m)| m);
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args([
            "--ignored",
            "--exact",
            &format!("{module}::child"),
            "--nocapture",
            "--test-threads=1",
        ]);
        for k in portalloc::config::VARIABLES
            .iter()
            .chain(portalloc::budget::VARIABLES)
        {
            c.env_remove(k);
        }
        c.env(ROLE, role).envs(env.iter().map(|(k, v)| (k, v)));
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = c.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Peer {
            child,
            stdin,
            lines,
            log: String::new(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next reply, or a panic with what the child printed.
    fn reply(&mut self) -> String {
        loop {
            match self.lines.recv_timeout(LIMIT) {
                // The harness prints `test share::child ... ` without a newline first.
                Ok(line) => match line.find("REPLY ") {
                    Some(at) => return line[at + 6..].to_string(),
                    None => {
                        self.log.push_str(&line);
                        self.log.push('\n');
                    }
                },
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "no reply from child {}; it printed:\n{}",
                        self.pid(),
                        self.log
                    );
                }
            }
        }
    }

    fn ask(&mut self, line: &str) -> String {
        let t = std::time::Instant::now();
        self.send(line);
        let r = self.reply();
        if std::env::var_os("SHARE_TIMES").is_some() {
            eprintln!(
                "{:>8.3}s {}",
                t.elapsed().as_secs_f64(),
                &line[..line.len().min(20)]
            );
        }
        r
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn exit(mut self) {
        assert_eq!(self.ask("exit"), "bye");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "child exited {status:?}:\n{}", self.log);
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The number after `key` in a reply.
fn field(reply: &str, key: &str) -> u64 {
    let mut words = reply.split_whitespace();
    while let Some(w) = words.next() {
        if w == key {
            return words.next().unwrap().parse().unwrap();
        }
    }
    panic!("no {key} in {reply:?}")
}

fn temp_dir(name: &str) -> PathBuf {
    crate::support::processes::fresh_dir("portalloc-share-test", name)
}

/// Where the children run: a backend with its environment, and the driver's count when it
/// has a device shared by processes.
struct World {
    env: Vec<(String, String)>,
    shared: Option<portalloc_fakes::SharedDevice>,
    dir: PathBuf,
    /// Whether every registry must be gone at the end (not where exporters are killed: the
    /// next exporter's first export removes a dead one's).
    clean: bool,
}

impl Drop for World {
    fn drop(&mut self) {
        // Every registry went with its exporter (or its last importer): the directory is
        // empty but for the socket a test made.
        let left: Vec<_> = std::fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("portalloc-share-"))
                    .collect()
            })
            .unwrap_or_default();
        let _ = std::fs::remove_dir_all(&self.dir);
        if self.clean && !std::thread::panicking() {
            assert!(left.is_empty(), "registries left behind: {left:?}");
        }
    }
}

impl World {
    fn host(strategy: &str, layers: usize) -> World {
        let dir = temp_dir("host");
        let env = vec![
            ("PORTALLOC_BACKEND".into(), "host".into()),
            ("PORTALLOC_HOST_CAPACITY".into(), "3GiB".into()),
            ("PORTALLOC_HOST_SIMULATED".into(), "0".into()),
            ("PORTALLOC_ALLOCATOR".into(), strategy.into()),
            ("XLA_PYTHON_CLIENT_PREALLOCATE".into(), "false".into()),
            ("PORTALLOC_SHARE_DIR".into(), dir.display().to_string()),
            ("SHARE_LAYERS".into(), layers.to_string()),
        ];
        World {
            env,
            shared: None,
            dir,
            clean: true,
        }
    }

    /// A fake driver (`profile`: cuda12, rocm7) sharing one 3 GiB device between the
    /// children; `fakehip_profile` sets ROCm's reported behaviours.
    fn fake(profile: &str, fakehip_profile: Option<&str>, strategy: &str, layers: usize) -> World {
        let dir = temp_dir(profile);
        let shared = portalloc_fakes::SharedDevice::unique();
        let mut env = crate::support::processes::shared_fake_env(profile, &shared);
        env.extend([
            ("FAKECUDA_CAPACITY".into(), (3u64 << 30).to_string()),
            ("FAKEHIP_CAPACITY".into(), (3u64 << 30).to_string()),
            ("PORTALLOC_ALLOCATOR".into(), strategy.into()),
            ("XLA_PYTHON_CLIENT_PREALLOCATE".into(), "false".into()),
            ("PORTALLOC_SHARED_BUDGET".into(), "0".into()),
            ("PORTALLOC_SHARE_DIR".into(), dir.display().to_string()),
            ("SHARE_LAYERS".into(), layers.to_string()),
        ]);
        if let Some(q) = fakehip_profile {
            env.retain(|(k, _)| k != "FAKEHIP_PROFILE");
            env.push(("FAKEHIP_PROFILE".into(), q.into()));
        }
        World {
            env,
            shared: Some(shared),
            dir,
            clean: true,
        }
    }

    fn spawn(&self, role: &str) -> Peer {
        Peer::spawn(role, &self.env)
    }

    /// Bytes the driver counts for `pid` (its own and the exported objects it holds), and
    /// for the whole device (each object once).
    fn driver(&self, pid: u32) -> Option<(u64, u64)> {
        let shared = self.shared.as_ref()?;
        let held = shared
            .holders(0)
            .iter()
            .filter(|h| h.pid == pid)
            .map(|h| h.bytes)
            .sum();
        Some((held, shared.used(0)))
    }
}

/// The done-when run: export, import, read, write again, free, trim (and sleep on vmm) while
/// imported; then everything back.
fn trainer_and_rollout(world: &World, strategy: &str) {
    let mut trainer = world.spawn("trainer");
    let mut rollout = world.spawn("rollout");
    let n = field(&trainer.ask("alloc"), "allocated");
    assert_eq!(trainer.ask("write 1"), "written");
    let handles = trainer.ask("export");
    let handles = handles.strip_prefix("handles ").unwrap();
    let imported = rollout.ask(&format!("import {handles}"));
    assert_eq!(field(&imported, "imported"), n);
    // The rollout's allocator holds nothing: the memory is the trainer's, counted once.
    assert_eq!(field(&imported, "pool"), 0, "{imported}");
    let mapped = field(&imported, "mapped");
    assert_eq!(rollout.ask("check 1"), "bad []");
    let pool = field(&trainer.ask("trim"), "pool");
    if let Some((trainer_held, used)) = world.driver(trainer.pid()) {
        assert_eq!(used, pool, "the device counts the trainer's memory once");
        assert_eq!(trainer_held, pool);
        let (rollout_held, _) = world.driver(rollout.pid()).unwrap();
        if strategy == "vmm" {
            // Shareable handles: each process holding one holds the memory (the device
            // counts it once).
            assert_eq!(rollout_held, mapped, "the rollout holds what it maps");
        } else {
            // Legacy IPC: the memory is the exporter's alone.
            assert_eq!(rollout_held, 0, "legacy IPC memory is the exporter's");
        }
    }
    // New values, seen through the imports.
    assert_eq!(trainer.ask("write 2"), "written");
    assert_eq!(rollout.ask("check 2"), "bad []");
    if strategy == "vmm" {
        // A sleep while imported: the device cannot take back what the rollout maps, and the
        // rollout's bytes stay the trainer's last ones.
        let slept = trainer.ask("sleep");
        assert_eq!(field(&slept, "kept"), mapped, "{slept}");
        assert_eq!(rollout.ask("check 2"), "bad []");
        if let Some((trainer_held, used)) = world.driver(trainer.pid()) {
            let (rollout_held, _) = world.driver(rollout.pid()).unwrap();
            assert_eq!(rollout_held, mapped);
            assert!(trainer_held <= mapped, "{trainer_held} > {mapped}");
            assert_eq!(used, mapped, "only the rollout's imports are left");
        }
        trainer.ask("wake");
        assert_eq!(trainer.ask("check 2"), "checked");
        // The trainer's memory after the wake is new: exported again, imported again.
        assert_eq!(rollout.ask("drop"), "dropped mapped 0");
        let handles = trainer.ask("export");
        let handles = handles.strip_prefix("handles ").unwrap();
        rollout.ask(&format!("import {handles}"));
        assert_eq!(rollout.ask("check 2"), "bad []");
    }
    // Free and trim while imported: parked, nothing given back, the rollout's bytes valid.
    assert_eq!(field(&trainer.ask("free"), "parked"), n);
    let trimmed = trainer.ask("trim");
    assert_eq!(field(&trimmed, "parked"), n, "{trimmed}");
    assert_eq!(rollout.ask("check 2"), "bad []");
    if let Some((_, used)) = world.driver(trainer.pid()) {
        assert!(used >= mapped.min(field(&trimmed, "pool")), "{used}");
    }
    // The rollout lets go: free + trim give everything back.
    assert_eq!(rollout.ask("drop"), "dropped mapped 0");
    let trimmed = trainer.ask("trim");
    assert_eq!(field(&trimmed, "parked"), 0, "{trimmed}");
    assert_eq!(field(&trimmed, "pool"), 0, "{trimmed}");
    if let Some((trainer_held, used)) = world.driver(trainer.pid()) {
        assert_eq!(
            (trainer_held, used),
            (0, 0),
            "the device has everything back"
        );
    }
    trainer.exit();
    rollout.exit();
}

/// The layers a test's trainer holds: `default`, or `PORTALLOC_SHARE_LAYERS` (24 runs every
/// world at the whole model's 988 MB; the suite runs three at it and the rest at a slice, to
/// stay within its time).
fn layers(default: usize) -> usize {
    std::env::var("PORTALLOC_SHARE_LAYERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn host_vmm_trainer_exports_a_model_and_the_rollout_reads_it() {
    trainer_and_rollout(&World::host("vmm", layers(24)), "vmm");
}

#[test]
fn host_bfc_trainer_exports_a_model_and_the_rollout_reads_it() {
    trainer_and_rollout(&World::host("bfc", layers(4)), "bfc");
}

#[test]
fn fakecuda_vmm_trainer_and_rollout_share_a_device() {
    trainer_and_rollout(&World::fake("cuda12", None, "vmm", layers(24)), "vmm");
}

#[test]
fn fakecuda_bfc_trainer_and_rollout_share_a_device() {
    trainer_and_rollout(&World::fake("cuda12", None, "bfc", layers(24)), "bfc");
}

#[test]
fn fakehip_vmm_trainer_and_rollout_share_a_device() {
    trainer_and_rollout(&World::fake("rocm7", None, "vmm", layers(4)), "vmm");
}

#[test]
fn fakehip_bfc_trainer_and_rollout_share_a_device() {
    trainer_and_rollout(&World::fake("rocm7", None, "bfc", layers(4)), "bfc");
}

/// ROCm 7.15 refuses host access on imported handles (ROCm/rocm-systems#11185) and 7.14 loses
/// an import whose descriptor was closed before its access was set (PR #8440): an import
/// asks for its device only, and keeps the descriptors until then.
#[test]
fn rocm_7_15_and_7_14_import_as_they_behave() {
    for profile in ["rocm-7.15", "rocm-systems-8440-import-needs-fd"] {
        trainer_and_rollout(
            &World::fake("rocm7", Some(profile), "vmm", layers(2)),
            "vmm",
        );
    }
}

/// Handles carried over a Unix socket with their descriptors (no `pidfd_getfd`).
#[test]
fn handles_travel_over_a_unix_socket() {
    let world = World::fake("cuda12", None, "vmm", 1);
    let mut trainer = world.spawn("trainer");
    let mut rollout = world.spawn("rollout");
    let n = field(&trainer.ask("alloc"), "allocated");
    trainer.ask("write 5");
    let path = world.dir.join("socket");
    rollout.send(&format!("receive {} {n}", path.display()));
    assert_eq!(rollout.reply(), "listening");
    assert_eq!(trainer.ask(&format!("send {}", path.display())), "sent");
    assert_eq!(field(&rollout.reply(), "imported"), n);
    assert_eq!(rollout.ask("check 5"), "bad []");
    trainer.exit();
    rollout.exit();
}

/// 50 seeded runs, each killing the trainer or the rollout (`SIGKILL`) at a random point:
/// the other goes on, and the driver counts nothing for the dead.
#[test]
fn a_killed_trainer_or_rollout_costs_the_other_nothing() {
    use rand::{Rng, SeedableRng};
    let runs: u64 = std::env::var("PORTALLOC_SHARE_KILL_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let mut world = World::fake("cuda12", None, "vmm", 1);
    world.clean = false;
    let steps = [
        "alloc", "write 1", "export", "import", "write 2", "free", "trim",
    ];
    for seed in 0..runs {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let kill_trainer = rng.gen_bool(0.5);
        let kill_at = rng.gen_range(0..steps.len());
        let mut trainer = world.spawn("trainer");
        let mut rollout = world.spawn("rollout");
        let mut handles = String::new();
        let mut imported = false;
        for (i, step) in steps.iter().enumerate() {
            if i == kill_at {
                if kill_trainer {
                    trainer.kill();
                } else {
                    rollout.kill();
                }
                break;
            }
            match *step {
                "export" => {
                    let r = trainer.ask("export");
                    handles = r.strip_prefix("handles ").unwrap().to_string();
                }
                "import" => {
                    rollout.ask(&format!("import {handles}"));
                    imported = true;
                }
                "write 2" => {
                    trainer.ask("write 2");
                    assert_eq!(rollout.ask("check 2"), "bad []", "seed {seed}");
                }
                other => {
                    trainer.ask(other);
                }
            }
        }
        if kill_trainer {
            // The rollout's imports stay valid (vmm: the driver keeps shared memory while a
            // process holds it) until it drops them; then nothing is held by anyone.
            if imported {
                let r = rollout.ask("check 2");
                let r1 = rollout.ask("check 1");
                assert!(r == "bad []" || r1 == "bad []", "seed {seed}: {r} / {r1}");
            }
            rollout.ask("drop");
            let (held, used) = world.driver(rollout.pid()).unwrap();
            assert_eq!(
                (held, used),
                (0, 0),
                "seed {seed}: the dead trainer holds nothing"
            );
            rollout.exit();
        } else {
            // The trainer frees and trims: a dead importer holds nothing back.
            trainer.ask("free");
            let r = trainer.ask("trim");
            assert_eq!(field(&r, "parked"), 0, "seed {seed}: {r}");
            assert_eq!(field(&r, "pool"), 0, "seed {seed}: {r}");
            let (held, used) = world.driver(trainer.pid()).unwrap();
            assert_eq!(
                (held, used),
                (0, 0),
                "seed {seed}: the dead rollout holds nothing"
            );
            trainer.exit();
        }
    }
}

/// What an outside review found: several allocators of one exporter share one registry (a
/// second one neither hides the first's importers nor takes its file away), a withdrawn
/// export's handle replayed against a later allocator maps nothing, a handle whose bytes were
/// altered is refused by its registry record, and one process may import an export any
/// number of times.
#[test]
fn several_allocators_stale_handles_and_altered_bytes() {
    for strategy in ["vmm", "bfc"] {
        let world = World::host(strategy, 1);
        let mut trainer = world.spawn("trainer");
        let mut rollout = world.spawn("rollout");
        trainer.ask("alloc");
        trainer.ask("write 1");
        let handles = trainer.ask("export");
        let first = handles
            .strip_prefix("handles ")
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .to_string();
        assert_eq!(
            rollout.ask(&format!("try 16 - {first}")),
            "imported 16",
            "{strategy}"
        );
        assert_eq!(field(&trainer.ask("importers"), "importers"), 1);
        // A second allocator exports: the first's importer is still seen.
        let extra = trainer.ask("extra");
        assert_eq!(
            field(&trainer.ask("importers"), "importers"),
            1,
            "{strategy}"
        );
        assert_eq!(
            field(&trainer.ask("free-one"), "parked"),
            1,
            "{strategy}: kept while imported"
        );
        // The second allocator goes: the first's exports still import.
        trainer.ask("extra-drop");
        let second = handles
            .strip_prefix("handles ")
            .unwrap()
            .split(',')
            .nth(1)
            .unwrap();
        assert_eq!(
            rollout.ask(&format!("try 1 - {second}")),
            "imported 1",
            "{strategy}"
        );
        // The extra buffer's handle, replayed after its allocator went and another came with
        // the same record, key and descriptor numbers free: refused.
        let stale = extra.split_whitespace().nth(1).unwrap().to_string();
        let fresh = trainer.ask("extra");
        let r = rollout.ask(&format!("try 1 - {stale}"));
        assert!(
            r.starts_with("refused"),
            "{strategy}: a stale handle imported: {r}"
        );
        let fresh_hex = fresh.split_whitespace().nth(1).unwrap();
        let index = field(&fresh, "index");
        assert_eq!(rollout.ask(&format!("try 1 - {fresh_hex}")), "imported 1");
        assert_eq!(
            rollout.ask(&format!("check-last {index} 7")),
            "same true",
            "{strategy}"
        );
        // The size (byte 40) or the offset (byte 48) altered: refused, whatever the span.
        for at in [40, 48] {
            let r = rollout.ask(&format!("try 1 {at} {fresh_hex}"));
            assert!(
                r.starts_with("refused"),
                "{strategy}: byte {at} altered: {r}"
            );
        }
        rollout.ask("drop");
        trainer.ask("extra-drop");
        trainer.exit();
        rollout.exit();
    }
}

/// Hostile bytes as a handle: a typed error, never a panic or a mapping.
#[test]
fn hostile_handles_are_refused_with_the_reason() {
    let cases: [(&str, Vec<u8>); 3] = [
        ("empty", vec![]),
        ("garbage", vec![0xff; 200]),
        ("truncated", {
            let mut v = b"PASHARE\x01".to_vec();
            v.extend_from_slice(&1u32.to_le_bytes());
            v
        }),
    ];
    for (name, bytes) in cases {
        let e = ShareHandle::from_bytes(&bytes).unwrap_err();
        assert!(
            matches!(e, portalloc::Error::ShareHandle { .. }),
            "{name}: {e}"
        );
    }
}
