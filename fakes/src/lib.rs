//! Fake CUDA drivers and HIP runtimes, for testing the CUDA and ROCm paths of GPU code on a
//! machine without a GPU.
//!
//! Each driver ([`Driver`]) is a small C library built by this crate's build script: it
//! exports the CUDA driver API (`libcuda.so.1`'s symbols) or the HIP runtime API
//! (`libamdhip64.so`'s) with the vendors' signatures, error codes and rules — granularity,
//! virtual-memory mapping rules, streams whose work completes in order, events, pools — over
//! bookkeeping on the host. A **profile** ([`Profile`]) is a driver and the environment that
//! selects one of its personalities: a CUDA or ROCm version, a driver without virtual memory,
//! peer access or pinned memory, or a behaviour ROCm was reported to have (each named after
//! its public bug report). [`MATRIX`] is every profile, to iterate over.
//!
//! What they model and what they do not: no kernel runs (a test holds a [`Kernel`] "in flight"
//! over a range and finishes it, and the driver counts a free under it as a hazard); fakecuda's
//! device memory is host memory (its copies move bytes), fakehip's is none (its copies only
//! check and queue); no timing.
//!
//! The code under test is pointed at a driver through the environment its own loader reads
//! (portalloc's is `PORTALLOC_CUDA_LIBRARY` / `PORTALLOC_HIP_LIBRARY`, which
//! [`Profile::env`] sets); a driver keeps its state per loaded library, so a test that wants
//! a fresh driver runs in a fresh process ([`each_profile`]).
//!
//! ```
//! use portalloc_fakes::{Driver, MATRIX};
//!
//! // Every driver is built, and each profile names one.
//! assert!(Driver::FAKEHIP.path().exists());
//! assert!(MATRIX.iter().any(|p| p.name == "rocm5"));
//! ```

use std::ffi::{c_char, c_int, c_long, c_void, CStr, CString, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The vendor API a driver exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// The CUDA driver API (`libcuda.so.1`).
    Cuda,
    /// The HIP runtime API (`libamdhip64.so`).
    Hip,
}

impl Vendor {
    /// Its name as `PORTALLOC_BACKEND` takes it: `cuda`, `hip`.
    pub fn name(self) -> &'static str {
        match self {
            Vendor::Cuda => "cuda",
            Vendor::Hip => "hip",
        }
    }

    /// The variable portalloc reads for this vendor's library path
    /// (`PORTALLOC_CUDA_LIBRARY`, `PORTALLOC_HIP_LIBRARY`).
    ///
    /// ```
    /// use portalloc_fakes::{Driver, Vendor};
    ///
    /// assert_eq!(Driver::FAKEHIP.vendor, Vendor::Hip);
    /// assert_eq!(Vendor::Hip.library_variable(), "PORTALLOC_HIP_LIBRARY");
    /// assert_eq!(Vendor::Hip.name(), "hip");
    /// ```
    pub fn library_variable(self) -> &'static str {
        match self {
            Vendor::Cuda => "PORTALLOC_CUDA_LIBRARY",
            Vendor::Hip => "PORTALLOC_HIP_LIBRARY",
        }
    }
}

/// One fake driver, built into a shared library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Driver {
    /// Its name: `drivers/<name>.c`, built as `lib<name>.so`.
    pub name: &'static str,
    /// The API it exports.
    pub vendor: Vendor,
}

impl Driver {
    /// CUDA 12.2: virtual memory, stream-ordered pools, peer access, pinned host memory.
    pub const FAKECUDA: Driver = Driver {
        name: "fakecuda",
        vendor: Vendor::Cuda,
    };
    /// CUDA 10.1: neither virtual memory nor pools.
    pub const FAKECUDA_OLD: Driver = Driver {
        name: "fakecuda_old",
        vendor: Vendor::Cuda,
    };
    /// fakecuda without the peer-access calls.
    pub const FAKECUDA_NOPEER: Driver = Driver {
        name: "fakecuda_nopeer",
        vendor: Vendor::Cuda,
    };
    /// fakecuda without pinned host memory.
    pub const FAKECUDA_NOPINNED: Driver = Driver {
        name: "fakecuda_nopinned",
        vendor: Vendor::Cuda,
    };
    /// The HIP runtime: ROCm 5, 6 or 7 by `FAKEHIP_VERSION`, ROCm's reported behaviours by
    /// `FAKEHIP_PROFILE`.
    pub const FAKEHIP: Driver = Driver {
        name: "fakehip",
        vendor: Vendor::Hip,
    };

    /// Every driver.
    pub const ALL: [Driver; 5] = [
        Driver::FAKECUDA,
        Driver::FAKECUDA_OLD,
        Driver::FAKECUDA_NOPEER,
        Driver::FAKECUDA_NOPINNED,
        Driver::FAKEHIP,
    ];

    /// The built library. Shared by every process that loads it; each process that loads it
    /// gets its own driver state.
    ///
    /// ```
    /// let path = portalloc_fakes::Driver::FAKECUDA.path();
    /// assert!(path.ends_with("libfakecuda.so"));
    /// ```
    pub fn path(&self) -> PathBuf {
        // Built by build.rs into this directory: one `lib<name>.so` per driver of `ALL`.
        Path::new(env!("PORTALLOC_FAKES_DIR")).join(format!("lib{}.so", self.name))
    }
}

/// A driver and the environment that selects one of its personalities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// Its name, unique in [`MATRIX`].
    pub name: &'static str,
    /// The driver it loads.
    pub driver: Driver,
    /// Variables the driver reads when it starts (or at `fakehip_reset`).
    pub vars: &'static [(&'static str, &'static str)],
    /// What it models, and where that behaviour was reported.
    pub models: &'static str,
}

/// Every profile: CUDA's personalities, then ROCm's versions and its reported behaviours.
pub const MATRIX: &[Profile] = &[
    Profile {
        name: "cuda12",
        driver: Driver::FAKECUDA,
        vars: &[],
        models: "CUDA 12.2: virtual memory, stream-ordered pools, peer access, pinned memory",
    },
    Profile {
        name: "cuda10-no-vmm",
        driver: Driver::FAKECUDA_OLD,
        vars: &[],
        models: "CUDA 10.1: no virtual memory management, no stream-ordered pools",
    },
    Profile {
        name: "cuda12-no-peer",
        driver: Driver::FAKECUDA_NOPEER,
        vars: &[("FAKECUDA_DEVICES", "2")],
        models: "two devices and no peer-access calls",
    },
    Profile {
        name: "cuda12-no-pinned",
        driver: Driver::FAKECUDA_NOPINNED,
        vars: &[],
        models: "no pinned host memory (cuMemHostAlloc refuses)",
    },
    Profile {
        name: "rocm5",
        driver: Driver::FAKEHIP,
        vars: &[("FAKEHIP_VERSION", "50221153")],
        models: "ROCm 5.2: no virtual-memory attribute, the 5.x device-properties layout",
    },
    Profile {
        name: "rocm6",
        driver: Driver::FAKEHIP,
        vars: &[("FAKEHIP_VERSION", "60241133")],
        models: "ROCm 6.2 as documented",
    },
    Profile {
        name: "rocm7",
        driver: Driver::FAKEHIP,
        vars: &[("FAKEHIP_VERSION", "70051831")],
        models: "ROCm 7.0 as documented",
    },
    Profile {
        name: "rocm7-reservation-hold",
        driver: Driver::FAKEHIP,
        vars: &[
            ("FAKEHIP_VERSION", "70051831"),
            ("FAKEHIP_PROFILE", "rocm7-reservation-hold"),
        ],
        models: "hipMemRelease returns no memory while a reservation it was mapped into stays \
                 reserved (ROCm/legacy-rocm-build#6021, vllm-project/vllm#37533)",
    },
    Profile {
        name: "rocm7-setaccess-prefix",
        driver: Driver::FAKEHIP,
        vars: &[
            ("FAKEHIP_VERSION", "70051831"),
            ("FAKEHIP_PROFILE", "rocm-systems-2516-setaccess-prefix"),
        ],
        models: "hipMemSetAccess sums mappings from the reservation's first one \
                 (ROCm/rocm-systems#2516)",
    },
    Profile {
        name: "rocm7-reserve-counted",
        driver: Driver::FAKEHIP,
        vars: &[
            ("FAKEHIP_VERSION", "70051831"),
            ("FAKEHIP_PROFILE", "rocm-systems-7128-reserve-counted"),
        ],
        models: "address reservations counted against plain allocations' free memory \
                 (ROCm/rocm-systems#7128)",
    },
    Profile {
        name: "rocm7-unmap-many",
        driver: Driver::FAKEHIP,
        vars: &[
            ("FAKEHIP_VERSION", "70051831"),
            ("FAKEHIP_PROFILE", "rocr-285-unmap-many"),
        ],
        models: "one hipMemUnmap over several mappings leaves the reservation in use for ever \
                 (ROCm/ROCR-Runtime#285, before ROCm 7.0)",
    },
];

/// The profile named `name`, if [`MATRIX`] has one.
///
/// ```
/// let p = portalloc_fakes::profile("cuda10-no-vmm").unwrap();
/// assert_eq!(p.driver, portalloc_fakes::Driver::FAKECUDA_OLD);
/// ```
pub fn profile(name: &str) -> Option<&'static Profile> {
    MATRIX.iter().find(|p| p.name == name)
}

/// The variable [`each_profile`] sets in the processes it starts: the profile's name.
pub const PROFILE_VARIABLE: &str = "PORTALLOC_FAKES_PROFILE";

impl Profile {
    /// The environment that runs code under this profile: the vendor's library variable
    /// ([`Vendor::library_variable`]) set to the driver's path, `PORTALLOC_BACKEND` set to the
    /// vendor (so that discovery does not pick a real driver the machine may also have), the
    /// profile's own variables, and its name in [`PROFILE_VARIABLE`].
    ///
    /// ```
    /// let p = portalloc_fakes::profile("rocm5").unwrap();
    /// let env = p.env();
    /// assert!(env.iter().any(|(k, _)| k == "PORTALLOC_HIP_LIBRARY"));
    /// assert!(env.iter().any(|(k, v)| k == "PORTALLOC_BACKEND" && v == "hip"));
    /// assert!(env.iter().any(|(k, v)| k == "FAKEHIP_VERSION" && v == "50221153"));
    /// assert!(env.iter().any(|(k, v)| k == "PORTALLOC_FAKES_PROFILE" && v == "rocm5"));
    /// ```
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        let vendor = self.driver.vendor;
        let mut env = vec![
            (
                OsString::from(vendor.library_variable()),
                self.driver.path().into_os_string(),
            ),
            (
                OsString::from("PORTALLOC_BACKEND"),
                OsString::from(vendor.name()),
            ),
        ];
        env.extend(
            self.vars
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        env.push((OsString::from(PROFILE_VARIABLE), OsString::from(self.name)));
        env
    }

    /// `command` with this profile's environment ([`Profile::env`]): for a process of one's
    /// own (a Python interpreter, a CLI).
    ///
    /// ```
    /// use std::process::Command;
    ///
    /// let p = portalloc_fakes::profile("rocm7-unmap-many").unwrap();
    /// let mut shell = Command::new("sh");
    /// shell.args(["-c", "echo $PORTALLOC_FAKES_PROFILE $FAKEHIP_PROFILE"]);
    /// let out = p.apply(&mut shell).output().unwrap();
    /// assert_eq!(String::from_utf8_lossy(&out.stdout), "rocm7-unmap-many rocr-285-unmap-many\n");
    /// ```
    pub fn apply<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        command.envs(self.env())
    }

    /// The profile this process runs under ([`PROFILE_VARIABLE`]), if any.
    ///
    /// ```
    /// // A process that no profile started (this doctest) runs under none; in one that
    /// // `Profile::apply` or `each_profile` started, this is that profile.
    /// match portalloc_fakes::Profile::current() {
    ///     Some(p) => println!("under {}: {}", p.name, p.models),
    ///     None => println!("under no profile"),
    /// }
    /// ```
    ///
    /// # Panics
    /// When the variable names no profile of [`MATRIX`] (the names are in the message).
    pub fn current() -> Option<&'static Profile> {
        let name = std::env::var(PROFILE_VARIABLE).ok()?;
        Some(profile(&name).unwrap_or_else(|| {
            panic!(
                "{PROFILE_VARIABLE}={:.64}: no such profile; the matrix has {}",
                name,
                names()
            )
        }))
    }
}

/// The profiles' names, comma-separated, for messages.
fn names() -> String {
    MATRIX.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
}

/// Set only in the processes [`each_profile`] starts, to the profile's name: what tells such a
/// child from a parent that merely inherited [`PROFILE_VARIABLE`] (a shell that exported a
/// profile's variables, say).
const CHILD_VARIABLE: &str = "PORTALLOC_FAKES_EACH_PROFILE";

/// The variable that limits each child of [`each_profile`] to so many seconds: one that runs
/// longer is killed and reported under its profile. Unset: no limit.
pub const TIMEOUT_VARIABLE: &str = "PORTALLOC_FAKES_TIMEOUT";

/// Runs `command` to its end, or kills it once `limit` has passed: its output, and the limit
/// when it was killed for it.
fn run_child(
    command: &mut Command,
    limit: Option<std::time::Duration>,
) -> std::io::Result<(std::process::Output, Option<std::time::Duration>)> {
    let Some(limit) = limit else {
        return Ok((command.output()?, None));
    };
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Read on threads of their own: a child that fills a pipe would otherwise never end.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = std::time::Instant::now();
    let mut killed = None;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() >= limit {
            let _ = child.kill();
            killed = Some(limit);
            break child.wait()?;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let output = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    Ok((output, killed))
}

/// What a child of [`each_profile`] prints, with the profile's name, once the body returned.
const RETURNED: &str = "portalloc-fakes: the body returned under ";

/// Runs `body` under each profile of `profiles`, each in a fresh process in which the driver
/// is loaded anew, and panics naming every profile under which it failed.
///
/// How: called in a test's parent process, it runs the test binary again once per profile —
/// `<binary> --exact <test> --include-ignored --nocapture --test-threads=1`, with the
/// profile's environment ([`Profile::apply`]) and a variable of its own that marks the child
/// — and waits for each. In such a child process it runs `body` with the profile named there,
/// once. `test` is the test's full path as `cargo test` prints it (`module::name`, or `name`
/// at a test file's top).
///
/// ```no_run
/// use portalloc_fakes::{each_profile, Controls, MATRIX};
///
/// #[test]
/// fn allocates_under_every_driver() {
///     each_profile("allocates_under_every_driver", MATRIX, |profile| {
///         let driver = Controls::open(profile.driver.path()).unwrap();
///         // ... the code under test, which loads the driver from the profile's environment
///         assert!(driver.census().holds_no_memory(), "under {}", profile.name);
///     });
/// }
/// ```
///
/// (Not run here: a doctest is no test binary to run again. `tests/matrix.rs` of this crate
/// and `examples/downstream-ci` run it.)
///
/// # Panics
/// In the parent: when the test failed under some profile (each one's panic message or last
/// lines of output are in the message, with how the child ended: its exit status or the
/// signal that killed it); when the filter ran no test (a misspelt `test`); when `profiles`
/// is empty; when a child exited before its body returned; or when the test binary cannot be
/// run. In a child: whatever `body` panics with, or when the profile named is not in
/// `profiles`.
///
/// A `#[should_panic]` test cannot use it (each child would judge its own, and the parent's
/// panic about their verdicts would pass it): the parent then ends the process with status
/// 101, saying why. Assert an expected panic inside the body (`std::panic::catch_unwind`).
/// A body may itself call `each_profile` for another test.
///
/// Each child runs for as long as it takes, unless [`TIMEOUT_VARIABLE`]
/// (`PORTALLOC_FAKES_TIMEOUT`, seconds) is set: then a child that runs longer is killed and
/// reported as failing under its profile, with its last lines of output.
pub fn each_profile(test: &str, profiles: &[Profile], body: impl FnOnce(&Profile)) {
    // A child of this very call: the marker names this test (a nested each_profile for
    // another test, or a process the body starts, is a parent of its own).
    if let Some(mark) = std::env::var_os(CHILD_VARIABLE) {
        let mark = mark.to_string_lossy();
        if let Some((name, marked_test)) = mark.split_once('\t') {
            if marked_test == test {
                let p = profiles.iter().find(|p| p.name == name).unwrap_or_else(|| {
                    panic!("{CHILD_VARIABLE}: no profile {name:.64} among this test's")
                });
                body(p);
                // Seen by the parent: the body returned, rather than the process exiting
                // from inside it.
                println!("\n{RETURNED}{name}");
                return;
            }
        }
    }
    assert!(
        !profiles.is_empty(),
        "each_profile({test}): no profiles to run under"
    );
    let exe = std::env::current_exe().expect("the test binary's path");
    let limit = std::env::var(TIMEOUT_VARIABLE).ok().map(|text| {
        let seconds: u64 = text.trim().parse().unwrap_or_else(|_| {
            panic!("{TIMEOUT_VARIABLE}={text:.32}: a whole number of seconds, e.g. 300")
        });
        std::time::Duration::from_secs(seconds)
    });
    let mut failed = Vec::new();
    for p in profiles {
        let mut command = Command::new(&exe);
        command.args([
            "--exact",
            test,
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        p.apply(&mut command)
            .env(CHILD_VARIABLE, format!("{}\t{test}", p.name));
        let (out, timed_out) = run_child(&mut command, limit)
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
        if let Some(limit) = timed_out {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            failed.push(format!(
                "{}:\n    killed after {} s ({TIMEOUT_VARIABLE}): {}",
                p.name,
                limit.as_secs(),
                why_it_failed(&text)
            ));
            continue;
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        if stdout.contains(&format!("test {test} - should panic")) {
            // Each child would satisfy or fail its own #[should_panic], and any panic of the
            // parent then satisfies the parent's: the test's verdict would be inverted. A
            // panic here would pass such a test, so the process ends instead.
            eprintln!(
                "each_profile({test}): a #[should_panic] test cannot run under each_profile \
                 (each child's verdict would be inverted in the parent); assert the panic in \
                 the body instead (std::panic::catch_unwind)"
            );
            std::process::exit(101);
        }
        // libtest says how many tests it runs before it runs them: a filter that names no
        // test passes without running anything, which is a mistake, not a pass.
        let ran = stdout.contains("running 1 test");
        let returned = stdout
            .lines()
            .any(|l| l.strip_prefix(RETURNED) == Some(p.name));
        if !out.status.success() || !ran || !returned {
            let text = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
            let why = if !ran && stdout.contains("running 0 tests") {
                format!("the filter --exact {test} ran no test")
            } else if !ran {
                format!("{}: {}", out.status, why_it_failed(&text))
            } else if out.status.success() {
                format!(
                    "the process ended ({}) before the body returned: \
                     {}",
                    out.status,
                    why_it_failed(&text)
                )
            } else {
                format!("{} ({})", why_it_failed(&text), out.status)
            };
            failed.push(format!("{}:\n    {why}", p.name));
        }
    }
    assert!(
        failed.is_empty(),
        "{test} failed under {} of {} profiles:\n{}",
        failed.len(),
        profiles.len(),
        failed.join("\n")
    );
}

/// What a failed child's output says: its panic's message (the line after "panicked at" up
/// to a backtrace or a note), else its last lines; at most 12 lines.
fn why_it_failed(output: &str) -> String {
    let lines: Vec<&str> = output.lines().collect();
    let said: Vec<&str> = match lines.iter().position(|l| l.contains("panicked at")) {
        Some(i) => lines[i..]
            .iter()
            .take_while(|l| !l.starts_with("stack backtrace:") && !l.starts_with("note:"))
            .take(12)
            .copied()
            .collect(),
        None => lines[lines.len().saturating_sub(12)..].to_vec(),
    };
    said.join("\n    ")
}

/// A kernel held in flight by [`Controls::launch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kernel(u64);

/// The live objects a driver holds for its callers ([`Controls::census`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Plain device allocations.
    pub allocations: i64,
    /// Live allocations from stream-ordered pools.
    pub pool_allocations: i64,
    /// Bytes the pools hold.
    pub pool_reserved: i64,
    /// Physical memory handles.
    pub handles: i64,
    /// Mappings of handles into reserved ranges.
    pub mappings: i64,
    /// Reserved virtual address ranges.
    pub reservations: i64,
    /// Created streams.
    pub streams: i64,
    /// Created events.
    pub events: i64,
    /// Device memory charged, in bytes.
    pub bytes: i64,
    /// Pinned host memory not freed.
    pub host_allocations: i64,
}

impl Census {
    /// True when no memory, address space or pinned memory is held: everything was given
    /// back.
    pub fn holds_no_memory(&self) -> bool {
        [
            self.allocations,
            self.pool_allocations,
            self.pool_reserved,
            self.handles,
            self.mappings,
            self.reservations,
            self.bytes,
            self.host_allocations,
        ]
        .iter()
        .all(|&n| n == 0)
    }
}

/// The controls every driver exports beside the vendor's API (`drivers/fake_common.h`, whose
/// comment is their specification): faults, call counts, live objects, kernels in flight and
/// the hazards they catch.
///
/// Open them on the same path the code under test loaded: the same path in one process is
/// the same loaded library, hence the same driver state.
///
/// ```
/// use portalloc_fakes::{Controls, Driver};
///
/// let driver = Controls::open(Driver::FAKEHIP.path()).unwrap();
/// assert!(driver.census().holds_no_memory());
/// // The second and third hipMalloc calls from now on fail with hipErrorOutOfMemory (2).
/// driver.fail("hipMalloc", 2, 2, 2);
/// driver.clear_faults();
/// ```
pub struct Controls {
    /// The controls, resolved once at [`Controls::open`]; valid while `_library` is loaded.
    fns: Fns,
    _library: libloading::Library,
}

/// The control functions, with the C signatures `drivers/fake_common.h` gives them.
#[derive(Clone, Copy)]
struct Fns {
    fail: unsafe extern "C" fn(*const c_char, c_long, c_long, c_int),
    clear_faults: unsafe extern "C" fn(),
    calls: unsafe extern "C" fn(*const c_char) -> i64,
    live: unsafe extern "C" fn(*const c_char) -> i64,
    launch: unsafe extern "C" fn(*mut c_void, u64, u64) -> u64,
    finish: unsafe extern "C" fn(u64),
    kernel_done: unsafe extern "C" fn(u64) -> c_int,
    hazards: unsafe extern "C" fn() -> i64,
    first_hazard: unsafe extern "C" fn() -> *const c_char,
    cpu_waits: unsafe extern "C" fn() -> i64,
}

impl std::fmt::Debug for Controls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controls").finish_non_exhaustive()
    }
}

impl Controls {
    /// The controls of the driver at `path` (loaded, or already loaded in this process).
    ///
    /// # Errors
    /// When the library does not load, or lacks one of the controls (not one of these
    /// drivers): the error names the missing symbol.
    pub fn open(path: impl AsRef<Path>) -> Result<Controls, libloading::Error> {
        // SAFETY: loading one of this crate's drivers runs no initialiser of consequence
        // (their state starts zeroed and is set up on first call).
        let library = unsafe { libloading::Library::new(path.as_ref()) }?;
        // SAFETY: each symbol is given the signature fake_common.h declares for it; the
        // pointers are used only while `library` (kept in the Controls) stays loaded.
        let fns = unsafe {
            Fns {
                fail: *library.get(b"fake_fail\0")?,
                clear_faults: *library.get(b"fake_clear_faults\0")?,
                calls: *library.get(b"fake_calls\0")?,
                live: *library.get(b"fake_live\0")?,
                launch: *library.get(b"fake_launch\0")?,
                finish: *library.get(b"fake_finish\0")?,
                kernel_done: *library.get(b"fake_kernel_done\0")?,
                hazards: *library.get(b"fake_hazards\0")?,
                first_hazard: *library.get(b"fake_first_hazard\0")?,
                cpu_waits: *library.get(b"fake_cpu_waits\0")?,
            }
        };
        Ok(Controls {
            fns,
            _library: library,
        })
    }

    /// Calls `nth .. nth + count - 1` of the vendor function `function` (1-based, counted
    /// from now) fail with the vendor's error `code`, doing nothing; `count < 0`: every call
    /// from the nth on, until [`Controls::clear_faults`]. At most 32 faults are armed at once
    /// (a fault's slot is free again after its last failing call); the driver aborts the
    /// process, saying why, when one more is armed.
    ///
    /// # Panics
    /// When `function` is empty, 64 bytes or longer, or holds a NUL byte.
    pub fn fail(&self, function: &str, nth: i64, count: i64, code: i32) {
        assert!(
            (1..64).contains(&function.len()),
            "fail: a function name of 1 to 63 bytes, not {}",
            function.len()
        );
        let name = CString::new(function).expect("a function name without NUL");
        // SAFETY: the spec's signature; the name outlives the call (the driver copies it).
        unsafe { (self.fns.fail)(name.as_ptr(), nth as c_long, count as c_long, code) }
    }

    /// Disarms every fault.
    pub fn clear_faults(&self) {
        // SAFETY: the spec's signature.
        unsafe { (self.fns.clear_faults)() }
    }

    /// How many times the vendor function `function` was called (failed calls included).
    ///
    /// # Panics
    /// When `function` holds a NUL byte.
    pub fn calls(&self, function: &str) -> i64 {
        let name = CString::new(function).expect("a function name without NUL");
        // SAFETY: the spec's signature; the name outlives the call.
        unsafe { (self.fns.calls)(name.as_ptr()) }
    }

    /// The live count `what` of the driver's vocabulary (`allocations`, `handles`, …, see
    /// [`Census`]); `None` for a name it does not know.
    ///
    /// # Panics
    /// When `what` holds a NUL byte.
    pub fn live(&self, what: &str) -> Option<i64> {
        let name = CString::new(what).expect("a name without NUL");
        // SAFETY: the spec's signature; the name outlives the call.
        let n = unsafe { (self.fns.live)(name.as_ptr()) };
        (n >= 0).then_some(n)
    }

    /// Every live count that is memory or an object held for a caller.
    ///
    /// ```
    /// use portalloc_fakes::{Controls, Driver};
    ///
    /// let driver = Controls::open(Driver::FAKEHIP.path()).unwrap();
    /// let census = driver.census();
    /// assert_eq!(census.allocations, 0);
    /// assert!(census.holds_no_memory());
    /// ```
    pub fn census(&self) -> Census {
        let n = |what: &str| self.live(what).unwrap_or(0);
        Census {
            allocations: n("allocations"),
            pool_allocations: n("pool_allocations"),
            pool_reserved: n("pool_reserved"),
            handles: n("handles"),
            mappings: n("mappings"),
            reservations: n("reservations"),
            streams: n("streams"),
            events: n("events"),
            bytes: n("bytes"),
            host_allocations: n("host_allocations"),
        }
    }

    /// A kernel on `stream` (the vendor's stream handle as an integer; 0 is the null stream)
    /// that uses `[va, va + size)`: in flight, holding back the work queued after it on its
    /// stream, until [`Controls::finish`] or a CPU wait that covers it. `None` for an unknown
    /// stream.
    ///
    /// ```
    /// use portalloc_fakes::{Controls, Driver};
    ///
    /// let driver = Controls::open(Driver::FAKEHIP.path()).unwrap();
    /// // A kernel on the null stream over a range; nothing is freed under it here.
    /// let kernel = driver.launch(0, 0x7000_0000, 4096).unwrap();
    /// assert!(!driver.done(kernel));
    /// driver.finish(kernel);
    /// assert!(driver.done(kernel));
    /// assert_eq!(driver.hazards(), 0);
    /// assert_eq!(driver.first_hazard(), "");
    /// ```
    pub fn launch(&self, stream: u64, va: u64, size: u64) -> Option<Kernel> {
        // SAFETY: the spec's signature; the stream is passed as the handle value it is.
        let id = unsafe { (self.fns.launch)(stream as usize as *mut c_void, va, size) };
        (id != 0).then_some(Kernel(id))
    }

    /// The kernel completes.
    pub fn finish(&self, kernel: Kernel) {
        // SAFETY: the spec's signature.
        unsafe { (self.fns.finish)(kernel.0) }
    }

    /// Whether the kernel completed ([`Controls::finish`], or a CPU wait that covered it).
    ///
    /// # Panics
    /// When this driver knows no such kernel (one another driver launched).
    pub fn done(&self, kernel: Kernel) -> bool {
        // SAFETY: the spec's signature.
        let done = unsafe { (self.fns.kernel_done)(kernel.0) };
        assert!(
            done >= 0,
            "kernel {} is not one this driver launched",
            kernel.0
        );
        done == 1
    }

    /// How many times memory was freed, unmapped or given back while a kernel still used it:
    /// undefined behaviour on a GPU.
    pub fn hazards(&self) -> i64 {
        // SAFETY: the spec's signature.
        unsafe { (self.fns.hazards)() }
    }

    /// What the first hazard was (empty when there was none).
    pub fn first_hazard(&self) -> String {
        // SAFETY: the spec's signature; the driver returns a NUL-terminated static buffer.
        unsafe {
            let p = (self.fns.first_hazard)();
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    /// CPU waits so far (stream, event and device synchronisations).
    pub fn cpu_waits(&self) -> i64 {
        // SAFETY: the spec's signature.
        unsafe { (self.fns.cpu_waits)() }
    }
}
