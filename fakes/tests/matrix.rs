//! The kit as a library's tests use it: every driver loads holding nothing, every profile of
//! the matrix runs in a fresh process with its personality (the version its driver reports,
//! its call counts starting from nothing), the controls catch a write under a held kernel and
//! inject faults, and a failure under one profile is reported by that profile's name.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use portalloc_fakes::{
    each_profile, profile, Controls, Driver, Profile, Vendor, EXTRA, MATRIX, PROFILE_VARIABLE,
    TIMEOUT_VARIABLE,
};

/// The version the profile's driver reports, read through the vendor's own call.
fn reported_version(p: &Profile) -> c_int {
    let path = p.driver.path();
    // SAFETY: one of the kit's drivers; the functions have the vendors' signatures.
    unsafe {
        let library = libloading::Library::new(&path).expect("the driver loads");
        let call: libloading::Symbol<unsafe extern "C" fn(*mut c_int) -> c_int> =
            match p.driver.vendor {
                Vendor::Cuda => library.get(b"cuDriverGetVersion\0"),
                Vendor::Hip => library.get(b"hipRuntimeGetVersion\0"),
            }
            .expect("the vendor's version call");
        let mut version = 0;
        assert_eq!(call(&mut version), 0, "{}: the version call fails", p.name);
        version
    }
}

/// Initialises the driver at `path` as the code under test would first (`cuInit`, HIP's first
/// call).
fn initialise(driver: Driver) {
    // SAFETY: the vendors' signatures.
    unsafe {
        let library = libloading::Library::new(driver.path()).expect("the driver loads");
        let rc = match driver.vendor {
            Vendor::Cuda => library
                .get::<unsafe extern "C" fn(u32) -> c_int>(b"cuInit\0")
                .unwrap()(0),
            Vendor::Hip => {
                let mut n = 0;
                library
                    .get::<unsafe extern "C" fn(*mut c_int) -> c_int>(b"hipGetDeviceCount\0")
                    .unwrap()(&mut n)
            }
        };
        assert_eq!(rc, 0, "{}", driver.name);
    }
}

#[test]
fn every_driver_loads_holding_nothing() {
    for driver in Driver::ALL {
        let c = Controls::open(driver.path()).expect("the driver and its controls load");
        initialise(driver);
        assert!(c.census().holds_no_memory(), "{}", driver.name);
        assert_eq!(c.live("allocations"), Some(0), "{}", driver.name);
        assert_eq!(c.live("no such count"), None, "{}", driver.name);
        assert_eq!(c.hazards(), 0, "{}", driver.name);
    }
}

#[test]
fn profile_names_are_unique_and_each_environment_names_its_driver() {
    let all: Vec<&Profile> = MATRIX.iter().chain(EXTRA).collect();
    for (i, p) in all.iter().copied().enumerate() {
        assert!(
            all[..i].iter().all(|q| q.name != p.name),
            "{} twice",
            p.name
        );
        assert_eq!(profile(p.name), Some(p));
        let env = p.env();
        let library = env
            .iter()
            .find(|(k, _)| k == p.driver.vendor.library_variable())
            .map(|(_, v)| v.clone());
        assert_eq!(
            library,
            Some(p.driver.path().into_os_string()),
            "{}",
            p.name
        );
    }
}

/// The version each profile's driver must report: 12.2 and 10.1 for CUDA, the ROCm version
/// `FAKEHIP_VERSION` names for HIP.
fn expected_version(p: &Profile) -> c_int {
    match p.name {
        "cuda10-no-vmm" => 10010,
        n if n.starts_with("cuda12") => 12020,
        "rocm5" => 50_221_153,
        "rocm6" => 60_241_133,
        n if n.starts_with("rocm7") => 70_051_831,
        other => panic!("no expected version for {other}"),
    }
}

#[test]
fn each_profile_runs_in_a_fresh_process_with_its_personality() {
    each_profile(
        "each_profile_runs_in_a_fresh_process_with_its_personality",
        MATRIX,
        |p| {
            assert_eq!(Profile::current(), Some(p));
            assert_eq!(
                std::env::var_os(p.driver.vendor.library_variable()),
                Some(p.driver.path().into_os_string())
            );
            let c = Controls::open(p.driver.path()).unwrap();
            let call = match p.driver.vendor {
                Vendor::Cuda => "cuDriverGetVersion",
                Vendor::Hip => "hipRuntimeGetVersion",
            };
            // A fresh process: the driver has counted nothing before this test's call.
            assert_eq!(c.calls(call), 0);
            assert_eq!(reported_version(p), expected_version(p), "{}", p.name);
            assert_eq!(c.calls(call), 1);
        },
    );
}

#[test]
fn a_write_under_a_held_kernel_is_a_race_hip_free_waits_and_faults_are_injected() {
    let path = Driver::FAKEHIP.path();
    let c = Controls::open(&path).unwrap();
    // SAFETY: fakehip's calls, with HIP's signatures.
    unsafe {
        let library = libloading::Library::new(&path).unwrap();
        let malloc: libloading::Symbol<unsafe extern "C" fn(*mut u64, usize) -> c_int> =
            library.get(b"hipMalloc\0").unwrap();
        let free: libloading::Symbol<unsafe extern "C" fn(u64) -> c_int> =
            library.get(b"hipFree\0").unwrap();
        let stream_create: libloading::Symbol<unsafe extern "C" fn(*mut u64, u32) -> c_int> =
            library.get(b"hipStreamCreateWithFlags\0").unwrap();
        let stream_destroy: libloading::Symbol<unsafe extern "C" fn(u64) -> c_int> =
            library.get(b"hipStreamDestroy\0").unwrap();
        let memset_async: libloading::Symbol<
            unsafe extern "C" fn(u64, c_int, usize, u64) -> c_int,
        > = library.get(b"hipMemsetAsync\0").unwrap();
        let mut ptr = 0u64;
        assert_eq!(malloc(&mut ptr, 1 << 20), 0);
        assert_eq!(c.live("allocations"), Some(1));
        let kernel = c.launch(0, ptr, 1 << 20).expect("the null stream is known");
        assert!(!c.done(kernel));
        // A memset on a non-blocking stream (hipStreamNonBlocking: no implicit order with the
        // null stream's kernel) writes what the kernel reads: a race, naming both.
        let mut s = 0u64;
        assert_eq!(stream_create(&mut s, 1), 0);
        assert_eq!(memset_async(ptr, 0, 4096, s), 0);
        assert_eq!(c.hazards(), 1, "a write under a kernel in flight");
        let race = c.first_hazard();
        assert!(
            race.starts_with("race: hipMemsetAsync") && race.contains("kernel"),
            "{race}"
        );
        // hipFree synchronises the device first ("an implicit hipDeviceSynchronize()"): the
        // kernel completes, nothing is freed under it, and the CPU waited once.
        let waits = c.cpu_waits();
        assert_eq!(free(ptr), 0);
        assert!(c.done(kernel));
        assert_eq!(c.hazards(), 1);
        assert_eq!(c.cpu_waits(), waits + 1);
        assert_eq!(stream_destroy(s), 0);
        // The next hipMalloc fails with hipErrorOutOfMemory (2), the one after succeeds.
        c.fail("hipMalloc", 1, 1, 2);
        assert_eq!(malloc(&mut ptr, 4096), 2);
        assert_eq!(malloc(&mut ptr, 4096), 0);
        assert_eq!(free(ptr), 0);
        // A spent fault frees its slot: more faults than there are slots, one after another,
        // each still fails its call.
        for round in 0..40 {
            c.fail("hipMalloc", 1, 1, 2);
            assert_eq!(malloc(&mut ptr, 4096), 2, "round {round}");
        }
        c.clear_faults();
    }
    assert_eq!(c.live("allocations"), Some(0));
}

/// The panic message of `each_profile(fixture)` under rocm5 and rocm6, which must fail
/// (`expected` says why).
fn failure_under_rocm5_and_6(fixture: &str, expected: &str) -> String {
    let two = [*profile("rocm5").unwrap(), *profile("rocm6").unwrap()];
    let failed =
        catch_unwind(AssertUnwindSafe(|| each_profile(fixture, &two, |_| {}))).expect_err(expected);
    failed.downcast_ref::<String>().cloned().unwrap_or_default()
}

/// A fixture for the test below: under the kit's runner it fails under `rocm5` only; run
/// directly, it does nothing.
#[test]
fn fixture_fails_under_rocm5() {
    if Profile::current().is_some() {
        each_profile("fixture_fails_under_rocm5", MATRIX, |p| {
            assert_ne!(p.name, "rocm5", "planted failure");
        });
    }
}

#[test]
fn a_failure_is_reported_by_its_profiles_name() {
    let message =
        failure_under_rocm5_and_6("fixture_fails_under_rocm5", "the fixture fails under rocm5");
    assert!(
        message.contains("failed under 1 of 2 profiles"),
        "{message}"
    );
    assert!(message.contains("rocm5:"), "{message}");
    assert!(message.contains("planted failure"), "{message}");
    assert!(!message.contains("rocm6:"), "{message}");
    // A name that matches no test is a mistake, not a pass.
    let message = failure_under_rocm5_and_6("no_such_test", "a filter that runs nothing fails");
    assert!(message.contains("ran no test"), "{message}");
}

/// A fixture: ignored, as a slow test a user runs on request would be; under the kit's
/// runner it passes (the children run ignored tests too).
#[test]
#[ignore = "a fixture, run in a child process by each_profile_runs_ignored_tests: cargo test -p portalloc-fakes --test matrix each_profile_runs_ignored_tests"]
fn fixture_ignored() {
    each_profile("fixture_ignored", MATRIX, |p| assert!(!p.name.is_empty()));
}

#[test]
fn each_profile_runs_ignored_tests() {
    let two = [*profile("cuda12").unwrap(), *profile("rocm7").unwrap()];
    each_profile("fixture_ignored", &two, |_| {});
}

/// A fixture: under the kit's runner, the process dies by a signal under `rocm5`, as it would
/// by a crash in a driver or in the code under test.
#[test]
fn fixture_aborts_under_rocm5() {
    if Profile::current().is_some() {
        each_profile("fixture_aborts_under_rocm5", MATRIX, |p| {
            if p.name == "rocm5" {
                std::process::abort();
            }
        });
    }
}

#[test]
fn a_crashed_child_is_reported_as_a_crash_under_its_profile() {
    let message =
        failure_under_rocm5_and_6("fixture_aborts_under_rocm5", "the fixture dies under rocm5");
    assert!(
        message.contains("failed under 1 of 2 profiles"),
        "{message}"
    );
    assert!(message.contains("rocm5:"), "{message}");
    assert!(message.contains("SIGABRT"), "{message}");
    assert!(!message.contains("ran no test"), "{message}");
}

/// For a test whose body must run with `var` set in its whole process: in the test's own
/// process, runs the test again with `var` and a mark set, asserts it passed there, and is
/// false; in that second process, true (run the body).
fn in_a_process_of_its_own(test: &str, var: (&str, &str)) -> bool {
    const MARK: &str = "PORTALLOC_FAKES_TEST_OWN_PROCESS";
    if std::env::var_os(MARK).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(var.0, var.1)
        .env(MARK, "1")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("running 1 test"), "{said}");
    false
}

/// A parent that inherited `PORTALLOC_FAKES_PROFILE` (from a shell that exported a profile's
/// variables, say) still runs every profile: only the runner's own children run the body.
#[test]
fn an_inherited_profile_variable_does_not_make_a_child() {
    if !in_a_process_of_its_own(
        "an_inherited_profile_variable_does_not_make_a_child",
        (PROFILE_VARIABLE, "rocm6"),
    ) {
        return;
    }
    let message = failure_under_rocm5_and_6(
        "fixture_fails_under_rocm5",
        "run as a parent: rocm5's child fails",
    );
    assert!(
        message.contains("failed under 1 of 2 profiles"),
        "{message}"
    );
}

/// A fixture of the test below: under rocm7, in a process its own each_profile started.
#[test]
#[ignore = "a fixture, run in a child process by a_nested_each_profile_runs_its_own_profiles: cargo test -p portalloc-fakes --test matrix a_nested_each_profile_runs_its_own_profiles"]
fn fixture_inner() {
    each_profile("fixture_inner", &[*profile("rocm7").unwrap()], |p| {
        assert_eq!(Profile::current(), Some(p));
    });
}

/// A body may run another test under profiles of its own: the runner's mark names the test it
/// was made for, so the inner call is a parent, not a child of the outer one.
#[test]
fn a_nested_each_profile_runs_its_own_profiles() {
    each_profile(
        "a_nested_each_profile_runs_its_own_profiles",
        &[*profile("rocm5").unwrap()],
        |_| each_profile("fixture_inner", &[*profile("rocm7").unwrap()], |_| {}),
    );
}

/// A fixture: under the kit's runner, the body hangs under `rocm5`.
#[test]
#[ignore = "a fixture, run in a child process by a_hung_child_is_killed_after_the_limit: cargo test -p portalloc-fakes --test matrix a_hung_child_is_killed_after_the_limit"]
fn fixture_hangs_under_rocm5() {
    each_profile("fixture_hangs_under_rocm5", MATRIX, |p| {
        if p.name == "rocm5" {
            std::thread::sleep(std::time::Duration::from_secs(600));
        }
    });
}

/// With `PORTALLOC_FAKES_TIMEOUT` set, a child that runs longer is killed and reported under
/// its profile; the others are judged as usual.
#[test]
fn a_hung_child_is_killed_after_the_limit() {
    if !in_a_process_of_its_own(
        "a_hung_child_is_killed_after_the_limit",
        (TIMEOUT_VARIABLE, "3"),
    ) {
        return;
    }
    let message = failure_under_rocm5_and_6("fixture_hangs_under_rocm5", "rocm5's child hangs");
    assert!(
        message.contains("failed under 1 of 2 profiles"),
        "{message}"
    );
    assert!(message.contains("rocm5:"), "{message}");
    assert!(message.contains("killed after 3 s"), "{message}");
}

#[test]
#[should_panic(expected = "no profiles to run under")]
fn each_profile_over_no_profiles_is_a_mistake() {
    each_profile("each_profile_over_no_profiles_is_a_mistake", &[], |_| {});
}

/// A profile as both sides list it: name, driver, variables, what it models.
type Row = (String, String, Vec<(String, String)>, String);

/// The Python side (`portalloc.testing`, for pytest suites) lists the same profiles, with the
/// same drivers, variables and descriptions: read from its own command line, run from the
/// source tree. Without a `python3` this says so and passes, except under `CI=true`.
#[test]
fn the_python_matrix_is_this_matrix() {
    python_list_is(&["list", "--json"], MATRIX);
}

/// The profiles kept out of the matrix too (`list --extra`).
#[test]
fn the_python_extra_profiles_are_these() {
    python_list_is(&["list", "--extra", "--json"], EXTRA);
}

/// `testing.py` run with `args` lists `profiles`, field by field.
fn python_list_is(args: &[&str], profiles: &[Profile]) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/portalloc/testing.py");
    let out = match std::process::Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
    {
        Ok(out) => out,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("skipping: no python3 to run {} ({e})", script.display());
            return;
        }
        Err(e) => panic!(
            "python3 {}: {e} — and CI=true requires it",
            script.display()
        ),
    };
    assert!(
        out.status.success(),
        "{}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("its JSON");
    let python: Vec<Row> = rows
        .iter()
        .map(|r| {
            let vars = r["vars"].as_array().expect("vars");
            let vars = vars
                .iter()
                .map(|kv| {
                    (
                        kv[0].as_str().unwrap().into(),
                        kv[1].as_str().unwrap().into(),
                    )
                })
                .collect();
            let text = |k: &str| r[k].as_str().expect(k).to_string();
            (text("name"), text("driver"), vars, text("models"))
        })
        .collect();
    let rust: Vec<Row> = profiles
        .iter()
        .map(|p| {
            let vars = p.vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
            let models = p.models.split_whitespace().collect::<Vec<_>>().join(" ");
            (p.name.into(), p.driver.name.into(), vars.collect(), models)
        })
        .collect();
    assert_eq!(python, rust);
}

/// Both languages clear the same variables before a profile sets its own.
#[test]
fn the_python_side_clears_the_same_variables() {
    let package = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../python");
    let out = match std::process::Command::new("python3")
        .args([
            "-c",
            "from portalloc import testing; print(chr(10).join(testing.variables()))",
        ])
        .env("PYTHONPATH", &package)
        .output()
    {
        Ok(out) => out,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("skipping: no python3 ({e})");
            return;
        }
        Err(e) => panic!("python3: {e} — and CI=true requires it"),
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let python: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(python, Profile::variables());
}

/// Code that loads the vendor's library by its usual name (`libcuda.so.1`, `libamdhip64.so`:
/// found through the loader's path the profile sets) gets the very driver the profile's
/// library variable names: one driver state, as one libcuda in a process is.
#[test]
fn a_driver_loaded_by_the_vendors_name_is_the_profiles_driver() {
    portalloc_fakes::each_profile!(MATRIX, |p| {
        let controls = Controls::open(p.library()).expect("the profile's driver");
        for name in p.driver.vendor.sonames() {
            // SAFETY: by name, through the loader's path: the profile's driver.
            let by_name = unsafe { libloading::Library::new(name) }
                .unwrap_or_else(|e| panic!("{}: {name} does not load by name: {e}", p.name));
            let call: &[u8] = match p.driver.vendor {
                Vendor::Cuda => b"cuDriverGetVersion\0",
                Vendor::Hip => b"hipRuntimeGetVersion\0",
            };
            let before = controls.calls(std::str::from_utf8(&call[..call.len() - 1]).unwrap());
            // SAFETY: the vendor's signature.
            unsafe {
                let f = by_name
                    .get::<unsafe extern "C" fn(*mut c_int) -> c_int>(call)
                    .unwrap();
                let mut v = 0;
                assert_eq!(f(&mut v), 0);
            }
            assert_eq!(
                controls.calls(std::str::from_utf8(&call[..call.len() - 1]).unwrap()),
                before + 1,
                "{}: {name} is another copy of the driver",
                p.name
            );
        }
    });
}

/// A fixture: prints from its body under cuda12 (and checks a per-profile variable).
#[test]
#[ignore = "a fixture, run in a child process by a_runner_shows_its_childrens_output_and_sets_their_variables: cargo test -p portalloc-fakes --test matrix a_runner_shows_its_childrens_output_and_sets_their_variables"]
fn fixture_prints() {
    portalloc_fakes::Runner::new(&[*profile("cuda12").unwrap(), *profile("rocm6").unwrap()])
        .env("FIXTURE_ALL", "all")
        .env_for("rocm6", "FIXTURE_ONE", "rocm6 only")
        .run(portalloc_fakes::test_name!(), |p| {
            assert_eq!(std::env::var("FIXTURE_ALL").unwrap(), "all");
            assert_eq!(
                std::env::var("FIXTURE_ONE").ok(),
                (p.name == "rocm6").then(|| "rocm6 only".to_string())
            );
            println!("hello from the child under {}", p.name);
        });
}

/// A passing child's output is shown under `--nocapture`; variables go to every child or to
/// one profile's.
#[test]
fn a_runner_shows_its_childrens_output_and_sets_their_variables() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fixture_prints",
            "--include-ignored",
            "--nocapture",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["cuda12", "rocm6"] {
        assert!(
            said.contains(&format!("---- fixture_prints under {name} ----")),
            "{said}"
        );
        assert!(
            said.contains(&format!("hello from the child under {name}")),
            "{said}"
        );
    }
}

/// Another profile's variables, exported by a shell that ran the README's recipe, do not
/// leak into a profile that sets none of them.
#[test]
fn a_profile_clears_what_other_profiles_set() {
    if !in_a_process_of_its_own(
        "a_profile_clears_what_other_profiles_set",
        ("FAKEHIP_PROFILE", "rocr-285-unmap-many"),
    ) {
        return;
    }
    portalloc_fakes::each_profile!(&[*profile("rocm7").unwrap()], |_| {
        assert_eq!(std::env::var_os("FAKEHIP_PROFILE"), None);
    });
}

/// Stream capture under every profile of the matrix, each in its own process with its
/// personality: a memset and a kernel captured on a non-blocking stream run nothing until the
/// graph is launched, each launch writes the bytes again, a plain allocation during a global
/// capture is refused and invalidates it, and nothing is left in flight or in the log.
#[test]
fn capture_and_replay_under_every_profile() {
    each_profile("capture_and_replay_under_every_profile", MATRIX, |p| {
        let cuda = p.driver.vendor == Vendor::Cuda;
        let pick = |c: &'static [u8], h: &'static [u8]| if cuda { c } else { h };
        // SAFETY: the profile's driver, with the vendors' signatures; one handle kept open for
        // the whole body (the controls' is another), so the driver's state stays loaded.
        unsafe {
            let library = libloading::Library::new(p.driver.path()).unwrap();
            let c = Controls::open(p.driver.path()).unwrap();
            if cuda {
                let init: libloading::Symbol<unsafe extern "C" fn(u32) -> c_int> =
                    library.get(b"cuInit\0").unwrap();
                assert_eq!(init(0), 0);
                let retain: libloading::Symbol<
                    unsafe extern "C" fn(*mut *mut std::ffi::c_void, c_int) -> c_int,
                > = library.get(b"cuDevicePrimaryCtxRetain\0").unwrap();
                let set: libloading::Symbol<unsafe extern "C" fn(*mut std::ffi::c_void) -> c_int> =
                    library.get(b"cuCtxSetCurrent\0").unwrap();
                let mut ctx = std::ptr::null_mut();
                assert_eq!(retain(&mut ctx, 0), 0);
                assert_eq!(set(ctx), 0);
            }
            let malloc: libloading::Symbol<unsafe extern "C" fn(*mut u64, usize) -> c_int> =
                library
                    .get(pick(b"cuMemAlloc_v2\0", b"hipMalloc\0"))
                    .unwrap();
            let free: libloading::Symbol<unsafe extern "C" fn(u64) -> c_int> =
                library.get(pick(b"cuMemFree_v2\0", b"hipFree\0")).unwrap();
            let stream_create: libloading::Symbol<unsafe extern "C" fn(*mut u64, u32) -> c_int> =
                library
                    .get(pick(b"cuStreamCreate\0", b"hipStreamCreateWithFlags\0"))
                    .unwrap();
            let sync: libloading::Symbol<unsafe extern "C" fn(u64) -> c_int> = library
                .get(pick(b"cuStreamSynchronize\0", b"hipStreamSynchronize\0"))
                .unwrap();
            let memset_async: libloading::Symbol<
                unsafe extern "C" fn(u64, u32, usize, u64) -> c_int,
            > = library
                .get(pick(b"cuMemsetD8Async\0", b"hipMemsetAsync\0"))
                .unwrap();
            let begin: libloading::Symbol<unsafe extern "C" fn(u64, c_int) -> c_int> = library
                .get(pick(
                    b"cuStreamBeginCapture_v2\0",
                    b"hipStreamBeginCapture\0",
                ))
                .unwrap();
            let end: libloading::Symbol<unsafe extern "C" fn(u64, *mut u64) -> c_int> = library
                .get(pick(b"cuStreamEndCapture\0", b"hipStreamEndCapture\0"))
                .unwrap();
            let instantiate: libloading::Symbol<
                unsafe extern "C" fn(*mut u64, u64, *mut u8, *mut u8, usize) -> c_int,
            > = library
                .get(pick(b"cuGraphInstantiate\0", b"hipGraphInstantiate\0"))
                .unwrap();
            let launch: libloading::Symbol<unsafe extern "C" fn(u64, u64) -> c_int> = library
                .get(pick(b"cuGraphLaunch\0", b"hipGraphLaunch\0"))
                .unwrap();

            let (mut ptr, mut s) = (0u64, 0u64);
            assert_eq!(malloc(&mut ptr, 1 << 20), 0);
            assert_eq!(stream_create(&mut s, 1), 0);
            assert_eq!(memset_async(ptr, 0, 4096, s), 0);
            assert_eq!(sync(s), 0);
            assert_eq!(begin(s, 0), 0, "{}", p.name);
            assert_eq!(memset_async(ptr, 9, 4096, s), 0);
            c.launch_writing(s, ptr, 4096).expect("a captured kernel");
            let mut graph = 0;
            assert_eq!(end(s, &mut graph), 0, "{}", p.name);
            assert_eq!(
                *(ptr as *const u8),
                0,
                "{}: nothing ran in the capture",
                p.name
            );
            let mut exec = 0;
            let none = std::ptr::null_mut();
            assert_eq!(instantiate(&mut exec, graph, none, none, 0), 0);
            for _ in 0..5 {
                assert_eq!(launch(exec, s), 0);
                assert_eq!(sync(s), 0);
                assert_eq!(
                    *(ptr as *const u8),
                    9,
                    "{}: the launch set the bytes",
                    p.name
                );
                assert_eq!(memset_async(ptr, 0, 4096, s), 0);
                assert_eq!(sync(s), 0);
            }
            assert_eq!(c.graph_launches(exec), Some(5));
            // A plain allocation during a global capture: refused, the capture invalidated.
            assert_eq!(begin(s, 0), 0);
            let mut more = 0u64;
            assert_eq!(malloc(&mut more, 4096), 900, "{}", p.name);
            assert_eq!(end(s, &mut graph), 901, "{}", p.name);
            assert_eq!(c.capture_invalidations().0, 1);
            assert_eq!(free(ptr), 0);
            assert_eq!(c.hazards(), 0, "{}: {:?}", p.name, c.hazard_log());
            assert_eq!(c.in_flight(), 0);
        }
    });
}
