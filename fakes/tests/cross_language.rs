//! One copy of the drivers across languages: a Rust parent and a Python child (and the
//! reverse) watch the same driver. Each side's profile environment names its copy of the
//! drivers (`PORTALLOC_FAKES_DIR`), and the other side's controls open that very copy: a
//! census there sees the allocation the code under test made.
//!
//! Needs `python3` and the repository's `python/` (the `portalloc.testing` module, standard
//! library only); without them the tests skip with a message, and fail under `CI=true`.

use std::ffi::{c_int, c_uint, c_void};
use std::path::PathBuf;
use std::process::Command;

use portalloc_fakes::{profile, Controls, Profile, Vendor, DIR_VARIABLE};

/// The repository's Python package folder.
fn python_package() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../python")
}

/// `python3` when it can import `portalloc.testing` from the repository; else `None` after a
/// message (a failure under `CI=true`).
fn python() -> Option<Command> {
    let ok = Command::new("python3")
        .args(["-c", "import portalloc.testing"])
        .env("PYTHONPATH", python_package())
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        let mut command = Command::new("python3");
        command.env("PYTHONPATH", python_package());
        return Some(command);
    }
    let why = "python3 with the repository's portalloc.testing is not available";
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{why} — and CI=true requires it"
    );
    eprintln!("skipping: {why}");
    None
}

/// What the Python child does under the Rust parent's profile: allocates through the library
/// its environment names (as portalloc or any library would load it), then reads the census
/// through `portalloc.testing`'s controls of the current profile.
const PYTHON_CHILD: &str = r#"
import ctypes, json, os
from portalloc import testing

p = testing.current()
lib = ctypes.CDLL(os.environ[testing.LIBRARY_VARIABLE[p.vendor]])
ptr = ctypes.c_void_p()
if p.vendor == testing.CUDA:
    ctx = ctypes.c_void_p()
    assert lib.cuInit(0) == 0
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert lib.cuCtxSetCurrent(ctx) == 0
    assert lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(4096)) == 0
else:
    assert lib.hipMalloc(ctypes.byref(ptr), ctypes.c_size_t(4096)) == 0
controls = testing.Controls.current()
print(json.dumps({"path": controls.path, "allocations": controls.census()["allocations"]}))
"#;

/// A Python child under a profile of this (Rust) process sees, through its own controls, the
/// allocation made in it: both opened the drivers this crate built.
#[test]
fn a_python_child_watches_the_rust_parents_driver() {
    for name in ["cuda12", "rocm7"] {
        let Some(mut python) = python() else { return };
        let p = profile(name).unwrap();
        python.args(["-c", PYTHON_CHILD]);
        p.apply(&mut python);
        let out = python.output().expect("python3 runs");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_str(said.lines().last().unwrap_or_default()).expect("a report");
        assert_eq!(report["allocations"], 1, "{name}: {report}");
        let path = PathBuf::from(report["path"].as_str().unwrap());
        assert_eq!(
            std::fs::canonicalize(path).unwrap(),
            std::fs::canonicalize(p.library()).unwrap(),
            "{name}: the child's controls opened this crate's copy"
        );
    }
}

/// What the Python parent does: runs this test binary's fixture under a profile of its own,
/// with its own copy of the drivers (built into a cache of its own: `PORTALLOC_FAKES_DIR` is
/// not inherited).
const PYTHON_PARENT: &str = r#"
import os, subprocess, sys
from portalloc import testing

os.environ.pop("PORTALLOC_FAKES_DIR", None)
p = testing.profile(sys.argv[2])
done = p.run(
    [sys.argv[1], "--exact", "fixture_a_rust_child", "--ignored", "--nocapture"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120,
)
print(done.stdout)
print("python's drivers:", testing.driver_dir())
sys.exit(done.returncode)
"#;

/// A Rust child under a Python parent's profile: its controls open the Python side's copy of
/// the drivers (the one the profile's library variable names), and see what was allocated
/// through it.
#[test]
fn a_rust_child_watches_the_python_parents_driver() {
    let cache = std::env::temp_dir().join(format!("portalloc-fakes-cross-{}", std::process::id()));
    for name in ["cuda12", "rocm7"] {
        let Some(mut python) = python() else { return };
        let out = python
            .args(["-c", PYTHON_PARENT])
            .arg(std::env::current_exe().unwrap())
            .arg(name)
            .env("PORTALLOC_FAKES_CACHE", &cache)
            .env_remove(DIR_VARIABLE)
            .output()
            .expect("python3 runs");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("running 1 test"), "{name}: {said}");
        assert!(
            said.contains("the Rust child saw 1 allocation"),
            "{name}: {said}"
        );
    }
    let _ = std::fs::remove_dir_all(&cache);
}

/// The fixture: under a Python parent's profile, allocates through the library the profile
/// names and counts it through `Controls::current`, which must be that copy (not this crate's
/// own build).
#[test]
#[ignore = "a fixture, run in a child process by a_rust_child_watches_the_python_parents_driver: cargo test -p portalloc-fakes --test cross_language a_rust_child_watches_the_python_parents_driver"]
fn fixture_a_rust_child() {
    let p = Profile::current().expect("run by a Python parent under a profile");
    let library = std::env::var(p.driver.vendor.library_variable()).unwrap();
    assert!(
        library.starts_with(&std::env::var(DIR_VARIABLE).unwrap()),
        "the profile's library is in its drivers' folder"
    );
    assert!(
        !library.starts_with(env!("PORTALLOC_FAKES_DIR")),
        "the Python side's own copy, not this crate's build: {library}"
    );
    // SAFETY: the profile's driver, loaded for the rest of the test (as the code under test
    // keeps it).
    let lib = unsafe { libloading::Library::new(&library) }.unwrap();
    // SAFETY: the vendors' signatures.
    unsafe {
        let mut ptr = 0u64;
        match p.driver.vendor {
            Vendor::Cuda => {
                let init: libloading::Symbol<unsafe extern "C" fn(c_uint) -> c_int> =
                    lib.get(b"cuInit\0").unwrap();
                let retain: libloading::Symbol<
                    unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int,
                > = lib.get(b"cuDevicePrimaryCtxRetain\0").unwrap();
                let set: libloading::Symbol<unsafe extern "C" fn(*mut c_void) -> c_int> =
                    lib.get(b"cuCtxSetCurrent\0").unwrap();
                let alloc: libloading::Symbol<unsafe extern "C" fn(*mut u64, usize) -> c_int> =
                    lib.get(b"cuMemAlloc_v2\0").unwrap();
                let mut ctx = std::ptr::null_mut();
                assert_eq!(init(0), 0);
                assert_eq!(retain(&mut ctx, 0), 0);
                assert_eq!(set(ctx), 0);
                assert_eq!(alloc(&mut ptr, 4096), 0);
            }
            Vendor::Hip => {
                let alloc: libloading::Symbol<unsafe extern "C" fn(*mut u64, usize) -> c_int> =
                    lib.get(b"hipMalloc\0").unwrap();
                assert_eq!(alloc(&mut ptr, 4096), 0);
            }
        }
    }
    let controls = Controls::current().expect("the profile's driver");
    let n = controls.census().allocations;
    println!("the Rust child saw {n} allocation");
    assert_eq!(n, 1);
    drop(lib);
}
