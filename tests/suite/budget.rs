//! The shared budget between real processes: members publish, ask, give and die.
//!
//! Every member is a child process (this binary again, running `budget::child` with
//! `PORTALLOC_BUDGET_ROLE` set); each test gives its children a directory of their own for
//! the segment (`PORTALLOC_SHARED_BUDGET_DIR`), so tests running at once never meet. The
//! parent reads the segment as `portalloc top` does ([`portalloc::budget::Inspector`]) and
//! never joins. Every child is killed after a time limit, so a hang fails the test instead of
//! the run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use portalloc::budget::{self, layout, Inspector};
use portalloc::{Allocator, Keep, Portalloc};

#[allow(unused_imports)]
use Allocator as _;

const ROLE: &str = "PORTALLOC_BUDGET_ROLE";
const DIR: &str = "PORTALLOC_BUDGET_TEST_DIR";
const MIB: u64 = 1 << 20;
/// A child that runs longer is killed and the test fails.
const CHILD_LIMIT: Duration = Duration::from_secs(30);

fn temp_dir(name: &str) -> PathBuf {
    crate::support::processes::fresh_dir("portalloc-budget-test", name)
}

/// The environment of a member on the host backend: real memory, vmm, 1 GiB, this test's
/// directory.
fn host_env(dir: &Path, role: &str) -> Vec<(String, String)> {
    vec![
        (ROLE.into(), role.into()),
        (DIR.into(), dir.display().to_string()),
        ("PORTALLOC_BACKEND".into(), "host".into()),
        ("PORTALLOC_HOST_CAPACITY".into(), "1GiB".into()),
        ("PORTALLOC_HOST_SIMULATED".into(), "0".into()),
        ("PORTALLOC_ALLOCATOR".into(), "vmm".into()),
        ("PORTALLOC_MEM_FRACTION".into(), "1.0".into()),
        ("PORTALLOC_SHARED_BUDGET".into(), "1".into()),
        (
            "PORTALLOC_SHARED_BUDGET_DIR".into(),
            dir.display().to_string(),
        ),
        ("PORTALLOC_MEMBER_NAME".into(), role.into()),
        ("PORTALLOC_RECLAIM_DEADLINE_MS".into(), "2000".into()),
    ]
}

/// `bytes` at the scale the tests run (`PORTALLOC_BUDGET_SCALE`, default 1: a 1 GiB device;
/// 8 gives the 8 GiB device, for a run by hand).
fn scaled(bytes: u64) -> u64 {
    bytes
        * std::env::var("PORTALLOC_BUDGET_SCALE")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1)
}

/// The environment of a member over a fake driver sharing one device between processes.
fn fake_env(
    dir: &Path,
    role: &str,
    profile: &str,
    shared: &portalloc_fakes::SharedDevice,
    strategy: &str,
) -> Vec<(String, String)> {
    let mut env = crate::support::processes::shared_fake_env(profile, shared);
    let capacity = scaled(1 << 30).to_string();
    env.extend([
        (ROLE.into(), role.into()),
        (DIR.into(), dir.display().to_string()),
        ("FAKECUDA_CAPACITY".into(), capacity.clone()),
        ("FAKEHIP_CAPACITY".into(), capacity),
        ("PORTALLOC_ALLOCATOR".into(), strategy.into()),
        (
            "PORTALLOC_SHARED_BUDGET_DIR".into(),
            dir.display().to_string(),
        ),
        ("PORTALLOC_MEMBER_NAME".into(), role.into()),
        ("PORTALLOC_RECLAIM_DEADLINE_MS".into(), "5000".into()),
    ]);
    if strategy != "bfc" {
        env.push(("PORTALLOC_MEM_FRACTION".into(), "1.0".into()));
    }
    env
}

fn spawn(env: &[(String, String)]) -> Child {
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        &format!("{module}::child"),
        "--nocapture",
        "--test-threads=1",
    ]);
    for k in portalloc::config::VARIABLES.iter().chain(budget::VARIABLES) {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// Waits for `child` up to [`CHILD_LIMIT`] (killing it after): its exit status and output.
fn finish(mut child: Child) -> (Option<i32>, String) {
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > CHILD_LIMIT {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    let text = format!(
        "[status {:?}, signal {:?}]\n{}{}",
        out.status.code(),
        out.status.signal(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

fn wait_file(path: &Path, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

fn touch(path: &Path) {
    std::fs::write(path, b"").unwrap();
}

/// `key=value` lines a child printed, by key (the last wins).
fn value(out: &str, key: &str) -> Option<String> {
    out.lines()
        .rev()
        .filter_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
        .next()
}

fn segment_in(dir: &Path) -> Option<PathBuf> {
    Inspector::find(dir).into_iter().next()
}

/// Fills `len` bytes at `ptr` (host memory the host backend handed out) with a pattern of
/// `seed`, and checks it.
fn pattern(ptr: u64, len: u64, seed: u64, check: bool) -> bool {
    // SAFETY: `ptr..ptr+len` is a live allocation of the host backend (real memory, mapped
    // read-write), owned by the caller.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len as usize) };
    for (i, chunk) in bytes.chunks_mut(4096).enumerate() {
        let v = (seed.wrapping_mul(31).wrapping_add(i as u64) & 0xff) as u8;
        if check {
            if chunk[0] != v || chunk[chunk.len() - 1] != v {
                return false;
            }
        } else {
            chunk[0] = v;
            let last = chunk.len() - 1;
            chunk[last] = v;
        }
    }
    true
}

/// The child processes' body: one role per process.
#[test]
#[ignore = "a child process of the budget tests (they run it with --ignored --exact and PORTALLOC_BUDGET_ROLE set)"]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let p = Portalloc::from_env().unwrap();
    let a = p.allocator(0).unwrap();
    let joined = p.budget(0);
    println!("RESULT joined={}", joined.is_some());
    let member = || joined.clone().expect("joined the budget");
    let stream = portalloc::Stream::PER_THREAD;
    match role.as_str() {
        // Holds weights (reclaimable, kept) and a KV cache (reclaimable, discarded) outside any
        // `using` section, and some cache; when told, uses the weights again and checks them.
        "donor" => {
            let b = member();
            b.declare_reclaimable("weights", Keep::Contents).unwrap();
            b.declare_reclaimable("kv", Keep::Nothing).unwrap();
            let mut weights = Vec::new();
            for i in 0..8 {
                let w = a.allocate(16 * MIB, 256, stream, "weights").unwrap();
                pattern(w.ptr(), w.size(), i, false);
                weights.push(w);
            }
            let kv: Vec<_> = (0..4)
                .map(|_| a.allocate(32 * MIB, 256, stream, "kv").unwrap())
                .collect();
            let scratch = a.allocate(64 * MIB, 256, stream, "").unwrap();
            a.deallocate(scratch).unwrap();
            b.publish();
            touch(&dir.join("donor.ready"));
            assert!(
                wait_file(&dir.join("donor.use"), CHILD_LIMIT),
                "never told to use"
            );
            let before: Vec<u64> = weights.iter().map(|w| w.ptr()).collect();
            {
                let _using = b.using("weights").unwrap();
                let same = weights.iter().zip(&before).all(|(w, p)| w.ptr() == *p);
                let intact = weights
                    .iter()
                    .enumerate()
                    .all(|(i, w)| pattern(w.ptr(), w.size(), i as u64, true));
                println!("RESULT weights_same_addresses={same}");
                println!("RESULT weights_intact={intact}");
            }
            let _kv_use = b.using("kv").unwrap();
            println!("RESULT kv_awake={}", kv.iter().all(|k| !a.is_asleep(k)));
            for w in weights {
                a.deallocate(w).unwrap();
            }
            for k in kv {
                a.deallocate(k).unwrap();
            }
        }
        // Asks the others for PORTALLOC_BUDGET_WANT bytes and prints what it got.
        "requester" => {
            let b = member();
            let want: u64 = std::env::var("PORTALLOC_BUDGET_WANT")
                .unwrap()
                .parse()
                .unwrap();
            let started = Instant::now();
            let got = b.reclaim(want);
            let given: u64 = got.iter().map(|g| g.given).sum();
            println!("RESULT asks={}", got.len());
            println!("RESULT given={given}");
            println!("RESULT micros={}", started.elapsed().as_micros());
            for g in &got {
                println!(
                    "RESULT ask_{}_{}={}/{:?}",
                    g.kind, g.tag, g.given, g.refusal
                );
            }
        }
        // Allocates until refused; prints the error (with the budget's report).
        "greedy" => {
            let mut held = Vec::new();
            let err = loop {
                match a.allocate(64 * MIB, 256, stream, "") {
                    Ok(x) => held.push(x),
                    Err(e) => break e,
                }
                if held.len() > 64 {
                    panic!("never refused");
                }
            };
            println!("RESULT held={}", held.len() as u64 * 64 * MIB);
            println!("ERROR {err}");
        }
        // Joins, holds a little (8 MiB untagged, 8 MiB of a reclaimable `kv`; inside a
        // `using("kv")` section for the role `pinned`), signals, and waits to be killed.
        "idle" | "pinned" => {
            let b = member();
            let x = a.allocate(8 * MIB, 256, stream, "").unwrap();
            b.declare_reclaimable("kv", Keep::Nothing).unwrap();
            let kv = a.allocate(8 * MIB, 256, stream, "kv").unwrap();
            let _using = (role == "pinned").then(|| b.using("kv").unwrap());
            touch(&dir.join(format!("idle.{}.ready", std::process::id())));
            std::thread::sleep(CHILD_LIMIT);
            drop((x, kv));
        }
        // The rollout of RL colocation: weights (kept) and a KV cache (discarded), both
        // reclaimable, held outside any `using` section; when told, uses them again.
        "rollout" => {
            let b = member();
            b.declare_reclaimable("weights", Keep::Contents).unwrap();
            b.declare_reclaimable("kv", Keep::Nothing).unwrap();
            let unit = scaled(16 * MIB);
            let weights: Vec<_> = (0..32)
                .map(|i| {
                    let w = a.allocate(unit, 256, stream, "weights").unwrap();
                    pattern(w.ptr(), w.size(), i, false);
                    w
                })
                .collect();
            let kv: Vec<_> = (0..8)
                .map(|_| a.allocate(2 * unit, 256, stream, "kv").unwrap())
                .collect();
            b.publish();
            touch(&dir.join("rollout.ready"));
            assert!(
                wait_file(&dir.join("rollout.use"), CHILD_LIMIT),
                "never told to use"
            );
            let before: Vec<u64> = weights.iter().map(|w| w.ptr()).collect();
            let kv_before: Vec<u64> = kv.iter().map(|k| k.ptr()).collect();
            let asleep = weights.iter().filter(|w| a.is_asleep(w)).count();
            println!("RESULT weights_were_asleep={asleep}");
            {
                let _w = b.using("weights").unwrap();
                let _k = b.using("kv").unwrap();
                let same = weights.iter().zip(&before).all(|(w, p)| w.ptr() == *p)
                    && kv.iter().zip(&kv_before).all(|(k, p)| k.ptr() == *p);
                let intact = weights
                    .iter()
                    .enumerate()
                    .all(|(i, w)| !a.is_asleep(w) && pattern(w.ptr(), w.size(), i as u64, true));
                println!("RESULT same_addresses={same}");
                println!("RESULT weights_intact={intact}");
                println!("RESULT kv_awake={}", kv.iter().all(|k| !a.is_asleep(k)));
            }
            for w in weights.into_iter().chain(kv) {
                a.deallocate(w).unwrap();
            }
        }
        // The trainer: needs 5/8 of the device, in 64 MiB pieces (scaled), and says how long
        // the pieces that waited for the rollout took.
        "trainer" => {
            let piece = scaled(64 * MIB);
            let mut held = Vec::new();
            let mut slow = Duration::ZERO;
            for _ in 0..10 {
                let started = Instant::now();
                match a.allocate(piece, 256, stream, "") {
                    Ok(x) => held.push(x),
                    Err(e) => {
                        println!("ERROR {e}");
                        break;
                    }
                }
                slow = slow.max(started.elapsed());
            }
            let given: u64 = member().hand_offs().iter().map(|h| h.bytes).sum();
            println!("RESULT trainer_held={}", held.len() as u64 * piece);
            println!("RESULT handed_off={given}");
            println!("RESULT slowest_micros={}", slow.as_micros());
            touch(&dir.join("trainer.holds"));
            assert!(wait_file(&dir.join("trainer.free"), CHILD_LIMIT));
            for x in held {
                a.deallocate(x).unwrap();
            }
        }
        // JAX's defaults: bfc preallocating 75% at the first allocation; holds it until told.
        "jax" => match a.allocate(MIB, 256, stream, "") {
            Ok(x) => {
                println!("RESULT jax_ok=1");
                touch(&dir.join(format!("jax.{}.holds", std::process::id())));
                wait_file(&dir.join("jax.stop"), CHILD_LIMIT);
                a.deallocate(x).unwrap();
            }
            Err(e) => println!("ERROR {e}"),
        },
        // A member of the kill tests that gives: 64 MiB of a reclaimable, kept `kv` with a
        // pattern; at `stop`, uses it again and checks every byte it wrote.
        "k-donor" => {
            let b = member();
            b.declare_reclaimable("kv", Keep::Contents).unwrap();
            let kv: Vec<_> = (0..4)
                .map(|i| {
                    let k = a.allocate(16 * MIB, 256, stream, "kv").unwrap();
                    pattern(k.ptr(), k.size(), i, false);
                    k
                })
                .collect();
            touch(&dir.join(format!("k-donor.{}.ready", std::process::id())));
            assert!(wait_file(&dir.join("stop"), CHILD_LIMIT), "never stopped");
            let _using = b.using("kv").unwrap();
            let intact = kv
                .iter()
                .enumerate()
                .all(|(i, k)| pattern(k.ptr(), k.size(), i as u64, true));
            println!("RESULT intact={intact}");
            assert!(intact, "bytes lost");
        }
        // The member of the kill tests that asks: 192 MiB of a 256 MiB device.
        "k-requester" => {
            let mut held = Vec::new();
            for _ in 0..12 {
                held.push(a.allocate(16 * MIB, 256, stream, "").unwrap());
            }
            println!("RESULT held={}", held.len() as u64 * 16 * MIB);
        }
        // One of four processes of the churn test: 8 rounds; in round r, process r % 4 peaks
        // at half the device in random pieces, the others churn below an eighth. Counts the
        // requests refused.
        "churn" => {
            use rand::{Rng, SeedableRng};
            let me: usize = std::env::var("PORTALLOC_CHURN_INDEX")
                .unwrap()
                .parse()
                .unwrap();
            let seed: u64 = std::env::var("PORTALLOC_CHURN_SEED")
                .unwrap()
                .parse()
                .unwrap();
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed * 8 + me as u64);
            let mut refused = 0u64;
            let mut peak = 0u64;
            for round in 0..8usize {
                for other in 0..4 {
                    if round > 0 {
                        let f = dir.join(format!("round.{}.{other}", round - 1));
                        assert!(
                            wait_file(&f, CHILD_LIMIT),
                            "round {round}: {other} never came"
                        );
                    }
                }
                let target = if round % 4 == me {
                    512 * MIB
                } else {
                    128 * MIB
                };
                let mut held = Vec::new();
                let mut bytes = 0u64;
                while bytes < target {
                    let size = rng.gen_range(1..=32u64) * MIB;
                    match a.allocate(size.min(target - bytes).max(MIB), 256, stream, "") {
                        Ok(x) => {
                            bytes += x.size();
                            held.push(x);
                        }
                        Err(e) => {
                            println!("REFUSED round {round}: {e}");
                            refused += 1;
                            break;
                        }
                    }
                    peak = peak.max(bytes);
                    // Free some at random: churn, not a ramp.
                    if rng.gen_bool(0.2) && !held.is_empty() {
                        let x = held.swap_remove(rng.gen_range(0..held.len()));
                        bytes -= x.size();
                        a.deallocate(x).unwrap();
                    }
                }
                for x in held {
                    a.deallocate(x).unwrap();
                }
                touch(&dir.join(format!("round.{round}.{me}")));
            }
            // Everyone stays until the last round is over everywhere: the churn is measured,
            // not the exits (see the closing note of issue 47 on a member that leaves while
            // its memory is still held).
            for other in 0..4 {
                let f = dir.join(format!("round.7.{other}"));
                assert!(wait_file(&f, CHILD_LIMIT), "{other} never finished");
            }
            println!("RESULT refused={refused}");
            println!("RESULT peak={peak}");
            println!(
                "RESULT handoffs={}",
                joined.as_ref().map_or(0, |b| b.hand_offs().len())
            );
        }
        // Holds 256 MiB untagged and 256 MiB of a reclaimable `kv` (its floor comes from the
        // environment), signals, waits to be killed.
        "floor" => {
            let b = member();
            b.declare_reclaimable("kv", Keep::Nothing).unwrap();
            let x = a.allocate(256 * MIB, 256, stream, "").unwrap();
            let kv = a.allocate(256 * MIB, 256, stream, "kv").unwrap();
            touch(&dir.join(format!("idle.{}.ready", std::process::id())));
            std::thread::sleep(CHILD_LIMIT);
            drop((x, kv));
        }
        // Asks for more than the device has.
        "huge" => {
            let e = a.allocate(2 << 30, 256, stream, "").unwrap_err();
            println!(
                "RESULT asked_others={}",
                matches!(e, portalloc::Error::OutOfMemoryShared { .. })
            );
        }
        // Joins and leaves the budget 200 times as fast as it can; after each join, checks that
        // the file at its path lists it.
        "join-leave" => {
            drop(joined);
            drop(p);
            let options = budget::BudgetOptions::from_env(true).unwrap().unwrap();
            let mut missing = 0;
            for _ in 0..200 {
                let b = budget::SharedBudget::join(HOST_KEY, 1 << 30, &options).unwrap();
                let listed = Inspector::open(b.path()).is_ok_and(|i| {
                    i.snapshot()
                        .members
                        .iter()
                        .any(|m| m.pid == std::process::id())
                });
                if !listed {
                    missing += 1;
                }
                drop(b);
            }
            println!("RESULT missing={missing}");
            println!("RESULT done=1");
            return;
        }
        other => panic!("unknown role {other}"),
    }
    println!("RESULT done=1");
}

#[test]
fn a_member_gives_its_cache_and_idle_tags_and_gets_them_back_at_their_addresses() {
    let dir = temp_dir("give");
    let donor = spawn(&host_env(&dir, "donor"));
    assert!(
        wait_file(&dir.join("donor.ready"), CHILD_LIMIT),
        "donor never ready"
    );
    let seg = segment_in(&dir).expect("a segment");
    let view = Inspector::open(&seg).unwrap().snapshot();
    assert_eq!(view.members.len(), 1, "{view:?}");
    let m = &view.members[0];
    assert_eq!(m.name, "donor");
    assert_eq!(m.tags.len(), 2);
    assert_eq!(m.tags[0].bytes, 128 * MIB, "weights published: {m:?}");
    assert_eq!(m.tags[1].bytes, 128 * MIB, "kv published: {m:?}");
    assert!(m.cached >= 64 * MIB, "the freed scratch is cached: {m:?}");

    let mut env = host_env(&dir, "requester");
    env.push(("PORTALLOC_BUDGET_WANT".into(), (300 * MIB).to_string()));
    let (code, out) = finish(spawn(&env));
    assert_eq!(code, Some(0), "{out}");
    // Trim first (the 64 MiB cache), then the largest idle tags until 300 MiB.
    let given: u64 = value(&out, "given").unwrap().parse().unwrap();
    assert!(given >= 64 * MIB + 128 * MIB, "{out}");
    assert_eq!(
        value(&out, "ask_trim_")
            .as_deref()
            .map(|s| s.ends_with("/None")),
        Some(true),
        "{out}"
    );
    let after = Inspector::open(&seg).unwrap().snapshot();
    let d = after.members.iter().find(|m| m.name == "donor").unwrap();
    assert!(d.tags.iter().any(|t| t.asleep), "a tag slept: {d:?}");
    assert!(d.given >= given, "{d:?}");
    assert!(!after.hand_offs.is_empty(), "the log names the hand-offs");
    assert!(after.hand_offs.iter().all(|h| h.donor == d.pid));

    touch(&dir.join("donor.use"));
    let (code, out) = finish(donor);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        value(&out, "weights_same_addresses").as_deref(),
        Some("true"),
        "{out}"
    );
    assert_eq!(
        value(&out, "weights_intact").as_deref(),
        Some("true"),
        "{out}"
    );
    assert_eq!(value(&out, "kv_awake").as_deref(), Some("true"), "{out}");
    // The last member to leave removed the segment.
    assert!(Inspector::find(&dir).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

fn wait_idle(dir: &Path) {
    let ready = || {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("idle."))
    };
    let started = Instant::now();
    while !ready() && started.elapsed() < CHILD_LIMIT {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(ready(), "the member never got ready");
}

/// An idle tag is asked for and given; a tag inside `using` is not even asked for (the plan
/// leaves it out; a tag that enters `using` between the plan and the ask is refused, said in
/// the report as `InUse`).
#[test_case::test_case("idle", "ask_sleep_kv", &format!("{}/None", 8 * MIB) ; "an idle tag is slept for another process")]
#[test_case::test_case("pinned", "asks", "0" ; "a tag inside using is left alone")]
fn a_requester_gets_what_the_tags_state_allows(role: &str, key: &str, answer: &str) {
    let dir = temp_dir(role);
    let mut member = spawn(&host_env(&dir, role));
    wait_idle(&dir);
    let mut env = host_env(&dir, "requester");
    env.push(("PORTALLOC_BUDGET_WANT".into(), (8 * MIB).to_string()));
    let (code, out) = finish(spawn(&env));
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(value(&out, key).as_deref(), Some(answer), "{out}");
    let _ = member.kill();
    let _ = member.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_member_is_reaped_and_no_longer_counted() {
    let dir = temp_dir("reap");
    let mut idle = spawn(&host_env(&dir, "idle"));
    let started = Instant::now();
    while segment_in(&dir).is_none() && started.elapsed() < CHILD_LIMIT {
        std::thread::sleep(Duration::from_millis(2));
    }
    let seg = segment_in(&dir).unwrap();
    let started = Instant::now();
    while Inspector::open(&seg).map_or(true, |i| i.snapshot().members.is_empty())
        && started.elapsed() < CHILD_LIMIT
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(Inspector::open(&seg).unwrap().snapshot().members.len(), 1);
    idle.kill().unwrap();
    idle.wait().unwrap();
    // The dead member no longer counts, for a reader and for a joiner.
    assert!(Inspector::open(&seg).unwrap().snapshot().members.is_empty());
    let mut env = host_env(&dir, "requester");
    env.push(("PORTALLOC_BUDGET_WANT".into(), MIB.to_string()));
    let (code, out) = finish(spawn(&env));
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        value(&out, "asks").as_deref(),
        Some("0"),
        "nobody to ask: {out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A segment whose words are `words` (written as another process might have).
fn write_segment(path: &Path, words: &[u64]) {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn fresh_words(key: &str) -> Vec<u64> {
    let w: Vec<AtomicU64> = (0..layout::TOTAL_WORDS)
        .map(|_| AtomicU64::new(0))
        .collect();
    layout::init_header(&w, key, 1 << 30);
    w.iter().map(|a| a.load(Ordering::Relaxed)).collect()
}

const HOST_KEY: &str = "host-0-host-1073741824";

#[test_case::test_case("magic", &|w: &mut Vec<u64>| w[layout::H_MAGIC] = 0xdead_beef, "magic" ; "corrupt magic")]
#[test_case::test_case("version", &|w: &mut Vec<u64>| w[layout::H_VERSION] = 7, "layout version 7" ; "another layout version")]
#[test_case::test_case("geometry", &|w: &mut Vec<u64>| w[layout::H_GEOMETRY] = 1, "geometry" ; "another geometry")]
#[test_case::test_case("truncated", &|w: &mut Vec<u64>| w.truncate(100), "bytes, the layout has" ; "truncated")]
#[test_case::test_case("longer", &|w: &mut Vec<u64>| w.extend([0; 9]), "bytes, the layout has" ; "longer")]
fn a_hostile_segment_means_running_alone_with_one_warning(
    _name: &str,
    spoil: &dyn Fn(&mut Vec<u64>),
    says: &str,
) {
    let dir = temp_dir("hostile");
    let mut words = fresh_words(HOST_KEY);
    spoil(&mut words);
    let path = budget::segment_path(&dir, HOST_KEY, budget::current_uid());
    write_segment(&path, &words);
    let mut env = host_env(&dir, "greedy");
    env.push(("PORTALLOC_MEMBER_NAME".into(), "greedy".into()));
    let (code, out) = finish(spawn(&env));
    // It ran (alone: `budget(0)` is None, so the child's `expect` says so) — and said why once.
    assert!(
        out.matches("running alone, without the shared budget")
            .count()
            == 1,
        "{out}"
    );
    assert!(out.contains(says), "{out}");
    assert!(out.contains(&path.display().to_string()), "{out}");
    assert_ne!(code, None, "no hang: {out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn another_users_segment_is_refused() {
    let dir = temp_dir("owner");
    let path = budget::segment_path(&dir, HOST_KEY, budget::current_uid());
    write_segment(&path, &fresh_words(HOST_KEY));
    if budget::current_uid() == 0 {
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        let e = Inspector::open(&path).unwrap_err().to_string();
        assert!(e.contains("owned by user 65534"), "{e}");
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    if budget::current_uid() != 0 {
        let e = Inspector::open(&path).unwrap_err().to_string();
        assert!(e.contains("mode 666"), "{e}");
    }
    let link = dir.join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let e = Inspector::open(&link).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Any words at all: the readers return, bounded, and never panic; a slot they report has
    /// a pid matching its owner word.
    #[test]
    fn the_readers_take_any_words(
        seed in proptest::prelude::any::<u64>(),
        density in 0u8..4,
    ) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let base = fresh_words(HOST_KEY);
        let words: Vec<AtomicU64> = base
            .iter()
            .map(|&w| AtomicU64::new(if rng.gen_range(0..8) < density { rng.gen() } else { w }))
            .collect();
        let _ = layout::check_header(&words, HOST_KEY);
        for i in 0..layout::SLOTS {
            if let Ok(v) = layout::read_slot(&words, i) {
                proptest::prop_assert_eq!(u64::from(v.pid), v.owner >> 32);
                proptest::prop_assert!(v.tags.len() <= layout::TAGS);
                proptest::prop_assert!(v.asks.len() <= layout::ASKS);
            }
        }
        let log = layout::read_log(&words);
        proptest::prop_assert!(log.len() <= layout::LOG_ENTRIES);
    }
}

/// RL colocation, scaled to a 1 GiB device: the rollout holds 3/4 of it (weights kept, KV
/// discarded, both reclaimable, outside `using`); the trainer needs 5/8. The trainer's
/// requests succeed once the rollout gave memory back — measured by the driver's own count —
/// and the rollout's next `using` gets every allocation back at its address with its bytes.
#[test_case::test_case("cuda12" ; "fakecuda")]
#[test_case::test_case("rocm7" ; "fakehip")]
fn colocation_hands_memory_to_the_trainer_and_back(profile: &str) {
    let dir = temp_dir(profile);
    let shared = portalloc_fakes::SharedDevice::unique();
    let mut rollout = spawn(&fake_env(&dir, "rollout", profile, &shared, "vmm"));
    if !wait_file(&dir.join("rollout.ready"), CHILD_LIMIT) {
        let _ = rollout.kill();
        panic!("rollout never ready: {}", finish(rollout).1);
    }
    let gib = scaled(1 << 30);
    assert_eq!(
        shared.used(0),
        gib / 4 * 3,
        "the driver counts the rollout's 3/4"
    );
    let trainer = spawn(&fake_env(&dir, "trainer", profile, &shared, "vmm"));
    assert!(
        wait_file(&dir.join("trainer.holds"), CHILD_LIMIT),
        "trainer never held"
    );
    let holders = shared.holders(0);
    let trainer_bytes = holders
        .iter()
        .find(|h| h.pid == trainer.id())
        .map_or(0, |h| h.bytes);
    let rollout_bytes = holders
        .iter()
        .find(|h| h.pid == rollout.id())
        .map_or(0, |h| h.bytes);
    assert_eq!(
        trainer_bytes,
        gib / 8 * 5,
        "the driver counts the trainer's 5/8: {holders:?}"
    );
    assert!(rollout_bytes + trainer_bytes <= gib, "{holders:?}");
    touch(&dir.join("trainer.free"));
    let (code, out) = finish(trainer);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        value(&out, "trainer_held"),
        Some((gib / 8 * 5).to_string()),
        "{out}"
    );
    let handed: u64 = value(&out, "handed_off").unwrap().parse().unwrap();
    assert!(
        handed >= gib / 8 * 3,
        "the rollout gave what the trainer lacked: {out}"
    );
    let micros: u64 = value(&out, "slowest_micros").unwrap().parse().unwrap();
    println!(
        "{profile}: hand-off of {} MiB in {micros} µs ({:.0} ms per GiB)",
        handed >> 20,
        micros as f64 / 1000.0 / (handed as f64 / (1u64 << 30) as f64)
    );
    touch(&dir.join("rollout.use"));
    let (code, out) = finish(rollout);
    assert_eq!(code, Some(0), "{out}");
    assert_ne!(
        value(&out, "weights_were_asleep").as_deref(),
        Some("0"),
        "{out}"
    );
    assert_eq!(
        value(&out, "same_addresses").as_deref(),
        Some("true"),
        "{out}"
    );
    assert_eq!(
        value(&out, "weights_intact").as_deref(),
        Some("true"),
        "{out}"
    );
    assert_eq!(value(&out, "kv_awake").as_deref(), Some("true"), "{out}");
    assert_eq!(
        shared.used(0),
        0,
        "everything given back: {:?}",
        shared.holders(0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two processes with JAX's defaults (bfc preallocating 75%): the second cannot have its 75%,
/// and its error names the first, what it holds, and the settings that let both run — which
/// then do.
#[test]
fn two_processes_with_jax_defaults_are_told_what_would_let_both_run() {
    let dir = temp_dir("jax");
    let shared = portalloc_fakes::SharedDevice::unique();
    let env = fake_env(&dir, "jax", "cuda12", &shared, "bfc");
    let first = spawn(&env);
    let started = Instant::now();
    while !std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("jax."))
    {
        assert!(started.elapsed() < CHILD_LIMIT, "the first never held");
        std::thread::sleep(Duration::from_millis(2));
    }
    let (_, out) = finish(spawn(&env));
    let error = out
        .lines()
        .skip_while(|l| !l.starts_with("ERROR"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        error.contains(&format!("pid {} `jax`", first.id())),
        "{out}"
    );
    assert!(error.contains("reserved 768.00 MiB"), "{out}");
    assert!(error.contains("XLA_CLIENT_MEM_FRACTION=0.47"), "{out}");
    // The advice works: both run with it.
    touch(&dir.join("jax.stop"));
    assert_eq!(finish(first).0, Some(0));
    let mut advised = env.clone();
    advised.push(("XLA_CLIENT_MEM_FRACTION".into(), "0.47".into()));
    let _ = std::fs::remove_file(dir.join("jax.stop"));
    let a = spawn(&advised);
    let b = spawn(&advised);
    let started = Instant::now();
    while std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".holds"))
        .count()
        < 3
    {
        if started.elapsed() > CHILD_LIMIT {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    touch(&dir.join("jax.stop"));
    for c in [a, b] {
        let (code, out) = finish(c);
        assert_eq!(code, Some(0), "{out}");
        assert_eq!(value(&out, "jax_ok").as_deref(), Some("1"), "{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// 100 seeded runs (`PORTALLOC_BUDGET_KILL_RUNS` for more or fewer): two donors and a
/// requester on one fake device of 256 MiB; a random one of them is `SIGKILL`ed at a random
/// moment — before it joined, while it allocates, mid-ask, mid-sleep, mid-wait. The others
/// finish (the requester gets its 192 MiB, each surviving donor its bytes back), the dead is
/// counted by neither the driver nor the budget, and the segment stays readable.
#[test]
fn a_member_killed_at_a_random_point_costs_the_others_nothing() {
    use rand::{Rng, SeedableRng};
    let runs: u64 = std::env::var("PORTALLOC_BUDGET_KILL_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let first: u64 = std::env::var("PORTALLOC_BUDGET_KILL_FIRST")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    for seed in first..first + runs {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let dir = temp_dir("kill");
        let shared = portalloc_fakes::SharedDevice::unique();
        let env = |role: &str| {
            let mut e = fake_env(&dir, role, "cuda12", &shared, "vmm");
            e.retain(|(k, _)| k != "FAKECUDA_CAPACITY" && k != "PORTALLOC_RECLAIM_DEADLINE_MS");
            e.push(("FAKECUDA_CAPACITY".into(), (256 * MIB).to_string()));
            e.push(("PORTALLOC_RECLAIM_DEADLINE_MS".into(), "1000".into()));
            e
        };
        let mut donors = vec![spawn(&env("k-donor")), spawn(&env("k-donor"))];
        let victim = rng.gen_range(0..3usize);
        // The requester starts once the donors hold their memory, or (for a donor victim
        // killed early) at once.
        let early = rng.gen_bool(0.2);
        if !early {
            let started = Instant::now();
            while std::fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".ready"))
                .count()
                < 2
            {
                if started.elapsed() > CHILD_LIMIT {
                    let outs: Vec<String> = donors
                        .into_iter()
                        .map(|mut d| {
                            let _ = d.kill();
                            finish(d).1
                        })
                        .collect();
                    panic!("seed {seed}: donors never ready: {outs:?}");
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let mut requester = spawn(&env("k-requester"));
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..60_000)));
        let dead = match victim {
            2 => &mut requester,
            d => &mut donors[d],
        };
        let dead_pid = dead.id();
        let _ = dead.kill();
        let _ = dead.wait();
        if victim != 2 {
            let (code, out) = finish(requester);
            assert_eq!(code, Some(0), "seed {seed}: the requester failed: {out}");
            assert_eq!(
                value(&out, "held"),
                Some((192 * MIB).to_string()),
                "seed {seed}: {out}"
            );
        }
        touch(&dir.join("stop"));
        for (i, d) in donors.into_iter().enumerate() {
            if i == victim {
                continue;
            }
            let (code, out) = finish(d);
            // A donor killed before its `ready` never held anything; a survivor checks its bytes.
            assert_eq!(
                code,
                Some(0),
                "seed {seed}: a surviving donor failed: {out}"
            );
            assert_eq!(
                value(&out, "intact").as_deref(),
                Some("true"),
                "seed {seed}: {out}"
            );
        }
        assert!(
            shared.holders(0).iter().all(|h| h.pid != dead_pid),
            "seed {seed}: the driver still counts the dead"
        );
        assert_eq!(shared.used(0), 0, "seed {seed}: {:?}", shared.holders(0));
        if let Some(seg) = segment_in(&dir) {
            let view = Inspector::open(&seg).unwrap().snapshot();
            assert!(
                view.members.iter().all(|m| m.pid != dead_pid),
                "seed {seed}: {view:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `portalloc top` and `portalloc info` read a live budget without joining it: the member, its
/// tags, and the budget as a limiter of what this process may use.
#[cfg(feature = "cli")]
#[test]
fn top_and_info_show_a_live_budget() {
    let dir = temp_dir("top");
    let mut donor = spawn(&host_env(&dir, "donor"));
    assert!(
        wait_file(&dir.join("donor.ready"), CHILD_LIMIT),
        "donor never ready"
    );
    let cli = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_portalloc"));
        for k in portalloc::config::VARIABLES.iter().chain(budget::VARIABLES) {
            c.env_remove(k);
        }
        for (k, v) in host_env(&dir, "cli") {
            c.env(k, v);
        }
        let out = c.args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = cli(&["top", "--once"]);
    assert!(text.contains(&donor.id().to_string()), "{text}");
    assert!(text.contains("donor"), "{text}");
    assert!(text.contains("tag weights"), "{text}");
    assert!(
        text.contains("idle, reclaimable (keeps contents)"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&cli(&["top", "--json"])).unwrap();
    let member = &json["budgets"][0]["members"][0];
    assert_eq!(member["pid"], donor.id());
    assert_eq!(member["tags"][1]["name"], "kv");
    let reserved = member["reserved"].as_u64().unwrap();
    assert!(reserved >= 256 * MIB, "{member}");
    let info: serde_json::Value = serde_json::from_str(&cli(&["info", "--json"])).unwrap();
    let limits = &info["devices"][0]["limits"];
    let shared = limits["limiters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "shared budget")
        .unwrap_or_else(|| panic!("{limits}"));
    assert_eq!(
        shared["bytes"].as_u64(),
        Some((1 << 30) - reserved),
        "{limits}"
    );
    touch(&dir.join("donor.use"));
    let _ = donor.kill();
    let _ = donor.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Four processes with seeded random churn whose peaks fit the device together (one at a time
/// peaks at half of it) but not under a static quarter each: with the shared budget, no
/// request is refused; the static split (`XLA_CLIENT_MEM_FRACTION=0.25` each, no budget),
/// measured in the same run on the same workload, refuses some.
#[test]
fn four_churning_processes_fit_with_the_budget_and_not_under_a_static_split() {
    let run = |budget: bool| -> (u64, usize) {
        let dir = temp_dir(if budget {
            "churn-budget"
        } else {
            "churn-static"
        });
        let shared = portalloc_fakes::SharedDevice::unique();
        let children: Vec<Child> = (0..4)
            .map(|i| {
                let mut env = fake_env(&dir, "churn", "cuda12", &shared, "vmm");
                env.retain(|(k, _)| k != "PORTALLOC_MEM_FRACTION");
                env.push(("PORTALLOC_CHURN_INDEX".into(), i.to_string()));
                env.push(("PORTALLOC_CHURN_SEED".into(), "7".into()));
                if budget {
                    env.push(("PORTALLOC_MEM_FRACTION".into(), "1.0".into()));
                } else {
                    env.push(("PORTALLOC_MEM_FRACTION".into(), "0.25".into()));
                    env.push(("PORTALLOC_SHARED_BUDGET".into(), "0".into()));
                }
                spawn(&env)
            })
            .collect();
        let mut refused = 0;
        let mut handoffs = 0;
        for c in children {
            let (code, out) = finish(c);
            assert_eq!(code, Some(0), "{out}");
            refused += value(&out, "refused").unwrap().parse::<u64>().unwrap();
            if budget && out.contains("REFUSED") {
                println!("{out}");
            }
            handoffs = handoffs.max(value(&out, "handoffs").unwrap().parse::<usize>().unwrap());
        }
        assert_eq!(shared.used(0), 0, "{:?}", shared.holders(0));
        let _ = std::fs::remove_dir_all(&dir);
        (refused, handoffs)
    };
    let (with_budget, handoffs) = run(true);
    let (static_split, _) = run(false);
    println!(
        "churn: {with_budget} refused with the shared budget ({handoffs} hand-offs), \
         {static_split} under a static quarter each"
    );
    assert_eq!(with_budget, 0);
    assert!(handoffs > 0, "the members moved memory between them");
    assert!(static_split > 0, "the workload must not fit a static split");
}

/// A budget file nobody is a member of any more (its processes were killed, or exited without
/// leaving) is removed by the next joiner once it is old; a fresh one, and one with a live
/// member, are not.
#[test]
fn a_joiner_removes_abandoned_budget_files() {
    let dir = temp_dir("abandoned");
    let old = budget::segment_path(&dir, "cuda-GPU-gone", budget::current_uid());
    let fresh = budget::segment_path(&dir, "cuda-GPU-new", budget::current_uid());
    write_segment(&old, &fresh_words("cuda-GPU-gone"));
    write_segment(&fresh, &fresh_words("cuda-GPU-new"));
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(an_hour_ago)
        .unwrap();
    let mut env = host_env(&dir, "requester");
    env.push(("PORTALLOC_BUDGET_WANT".into(), MIB.to_string()));
    let (code, out) = finish(spawn(&env));
    assert_eq!(code, Some(0), "{out}");
    assert!(!old.exists(), "the abandoned file is removed");
    assert!(fresh.exists(), "a fresh file is left to its creator");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A member is asked only for what leaves it at or above its floor: with a floor of 384 MiB,
/// its 256 MiB tag (of 512 MiB held) is not asked for; with 256 MiB, it is.
#[test_case::test_case("384MiB", "0", "0" ; "a sleep that would cross the floor is not asked")]
#[test_case::test_case("256MiB", "1", &(256 * MIB).to_string() ; "a sleep down to the floor is")]
fn the_floor_is_kept(floor: &str, asks: &str, given: &str) {
    let dir = temp_dir("floor");
    let mut env = host_env(&dir, "floor");
    env.push(("PORTALLOC_FLOOR".into(), floor.into()));
    let mut member = spawn(&env);
    wait_idle(&dir);
    let mut env = host_env(&dir, "requester");
    env.push(("PORTALLOC_BUDGET_WANT".into(), u64::MAX.to_string()));
    let (code, out) = finish(spawn(&env));
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(value(&out, "asks").as_deref(), Some(asks), "{out}");
    assert_eq!(value(&out, "given").as_deref(), Some(given), "{out}");
    let view = Inspector::open(&segment_in(&dir).unwrap())
        .unwrap()
        .snapshot();
    let m = view.members.iter().find(|m| m.pid == member.id()).unwrap();
    assert!(m.reserved >= m.floor, "{m:?}");
    let _ = member.kill();
    let _ = member.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request larger than the device asks nobody: no member sleeps for it.
#[test]
fn an_impossible_request_costs_the_others_nothing() {
    let dir = temp_dir("huge");
    let mut member = spawn(&host_env(&dir, "idle"));
    wait_idle(&dir);
    let (code, out) = finish(spawn(&host_env(&dir, "huge")));
    assert_eq!(code, Some(0), "{out}");
    let view = Inspector::open(&segment_in(&dir).unwrap())
        .unwrap()
        .snapshot();
    let m = view.members.iter().find(|m| m.pid == member.id()).unwrap();
    assert!(m.tags.iter().all(|t| !t.asleep), "{m:?}");
    assert_eq!(m.given, 0, "{m:?}");
    let _ = member.kill();
    let _ = member.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file its creator left empty (killed between its create and its `ftruncate`) is replaced
/// by the next joiner, which then is a member.
#[test]
fn an_empty_file_left_by_a_dead_creator_is_replaced() {
    let dir = temp_dir("empty");
    let path = budget::segment_path(&dir, HOST_KEY, budget::current_uid());
    write_segment(&path, &[]);
    let mut env = host_env(&dir, "requester");
    env.push(("PORTALLOC_BUDGET_WANT".into(), MIB.to_string()));
    let (code, out) = finish(spawn(&env));
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(value(&out, "joined").as_deref(), Some("true"), "{out}");
    assert!(!out.contains("running alone"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three processes join and leave one budget 200 times each at once: every membership is in
/// the file at its path (a last member's removal never strands a joiner in a removed file),
/// and no file is left.
#[test]
fn joining_while_the_last_member_leaves_never_strands_a_member() {
    let dir = temp_dir("join-leave");
    let children: Vec<Child> = (0..3)
        .map(|_| spawn(&host_env(&dir, "join-leave")))
        .collect();
    for c in children {
        let (code, out) = finish(c);
        assert_eq!(code, Some(0), "{out}");
        assert_eq!(value(&out, "missing").as_deref(), Some("0"), "{out}");
    }
    assert!(Inspector::find(&dir).is_empty(), "no file left");
    let _ = std::fs::remove_dir_all(&dir);
}
