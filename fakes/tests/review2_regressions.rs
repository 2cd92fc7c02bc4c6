//! Regressions found by a second outside review of the test kit: `each_profile` and
//! `#[should_panic]`, a child that exits before its body returns, a fault count near
//! `LONG_MAX`, and both drivers' pool destroy as the vendors document it. (The fixtures are
//! ignored: only their tests run them.)
use std::ffi::c_void;
use std::process::Command;

use portalloc_fakes::{each_profile, profile, Controls, Driver, Profile};

type H = *mut c_void;
const MIB: usize = 1 << 20;

/// Set in the processes the tests below start, so that the fixtures act only there.
const MARK: &str = "PORTALLOC_FAKES_REVIEW2_FIXTURE";

/// Runs the (ignored) fixture `name` of this binary as a parent; whether it passed.
fn fixture_passes(name: &str) -> bool {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--include-ignored", "--test-threads=1"])
        .env(MARK, "1")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("running 1 test"), "{said}");
    out.status.success()
}

fn marked() -> bool {
    std::env::var_os(MARK).is_some()
}

// ---- each_profile ----

#[test]
#[ignore = "a fixture, run in a child process by each_profile_with_should_panic_is_not_inverted: cargo test -p portalloc-fakes --test review2_regressions each_profile_with_should_panic_is_not_inverted"]
#[should_panic]
fn fixture_should_panic_body_never_panics() {
    assert!(marked(), "a fixture: run by its test only");
    let two = [*profile("rocm5").unwrap(), *profile("cuda12").unwrap()];
    each_profile("fixture_should_panic_body_never_panics", &two, |_| {});
}

/// A #[should_panic] test whose body never panics passes today: each child runs the test
/// with its own #[should_panic], fails ("did not panic as expected"), and the parent's panic
/// about that failure satisfies the parent's #[should_panic]. (The converse: a body that
/// panics with the expected text under every profile makes the test fail.)
#[test]
fn each_profile_with_should_panic_is_not_inverted() {
    assert!(
        !fixture_passes("fixture_should_panic_body_never_panics"),
        "a #[should_panic] test whose body never panics passed"
    );
}

#[test]
#[ignore = "a fixture, run in a child process by a_child_that_exits_early_is_not_a_pass: cargo test -p portalloc-fakes --test review2_regressions a_child_that_exits_early_is_not_a_pass"]
fn fixture_exits_before_its_check() {
    if !marked() {
        return; // a fixture: run by its test only
    }
    let two = [*profile("rocm5").unwrap(), *profile("cuda12").unwrap()];
    each_profile("fixture_exits_before_its_check", &two, |p| {
        if p.name == "rocm5" {
            // As code under test that calls exit(0) on some path would.
            std::process::exit(0);
        }
    });
}

/// A body cut short by exit(0) counts as a pass under that profile today: only the child's
/// exit status and libtest's "running 1 test" are checked, not that the body returned.
#[test]
fn a_child_that_exits_early_is_not_a_pass() {
    assert!(!fixture_passes("fixture_exits_before_its_check"));
}

// ---- faults ----

/// `count` near i64::MAX (a natural "for ever") overflows `nth + count` in fake_enter, so the
/// fault never fails a call: a fault silently not armed.
#[test]
fn a_fault_with_a_huge_count_fails_every_call() {
    each_profile(
        "a_fault_with_a_huge_count_fails_every_call",
        &[*profile("rocm7").unwrap()],
        |p| {
            let path = p.driver.path();
            let c = Controls::open(&path).unwrap();
            // SAFETY: HIP's signatures, as fakehip exports them.
            unsafe {
                let lib = libloading::Library::new(&path).unwrap();
                let malloc: libloading::Symbol<unsafe extern "C" fn(*mut u64, usize) -> i32> =
                    lib.get(b"hipMalloc\0").unwrap();
                c.fail("hipMalloc", 2, i64::MAX, 2);
                let mut ptr = 0u64;
                assert_eq!(malloc(&mut ptr, 4096), 0);
                assert_eq!(malloc(&mut ptr, 4096), 2, "the 2nd call fails");
                c.clear_faults();
            }
        },
    );
}

// ---- pools: destroy, as both vendors document it ----

/// Both vendors: "If any pointers obtained from this pool haven't been freed or the pool has
/// free operations that haven't completed when [cu|hip]MemPoolDestroy is invoked, the function
/// will return immediately and the resources associated with the pool will be released
/// automatically once there are no more outstanding allocations."
fn destroy_sequence(p: &Profile) {
    let hip = p.driver.vendor == portalloc_fakes::Vendor::Hip;
    let path = p.driver.path();
    let c = Controls::open(&path).unwrap();
    // SAFETY: the vendors' signatures, as the fakes export them.
    unsafe {
        let lib = libloading::Library::new(&path).unwrap();
        let sym = |n: &str| -> *const c_void {
            *lib.get::<*const c_void>(format!("{n}\0").as_bytes())
                .unwrap()
        };
        let call0 =
            |n: &str| std::mem::transmute::<*const c_void, unsafe extern "C" fn() -> i32>(sym(n))();
        let mut stream: H = std::ptr::null_mut();
        let mut pool: H = std::ptr::null_mut();
        let mut props = [0u8; 88];
        props[0] = 1; // allocation type: pinned
        props[8] = 1; // location type: device 0
        if hip {
            assert_eq!(
                std::mem::transmute::<*const c_void, unsafe extern "C" fn(u32) -> i32>(sym(
                    "hipInit"
                ))(0),
                0
            );
            assert_eq!(
                std::mem::transmute::<*const c_void, unsafe extern "C" fn(*mut H) -> i32>(sym(
                    "hipStreamCreate"
                ))(&mut stream),
                0
            );
        } else {
            assert_eq!(
                std::mem::transmute::<*const c_void, unsafe extern "C" fn(u32) -> i32>(sym(
                    "cuInit"
                ))(0),
                0
            );
            let mut ctx: H = std::ptr::null_mut();
            assert_eq!(
                std::mem::transmute::<*const c_void, unsafe extern "C" fn(*mut H, i32) -> i32>(
                    sym("cuDevicePrimaryCtxRetain")
                )(&mut ctx, 0),
                0
            );
            assert_eq!(
                std::mem::transmute::<*const c_void, unsafe extern "C" fn(H) -> i32>(sym(
                    "cuCtxSetCurrent"
                ))(ctx),
                0
            );
            assert_eq!(
                std::mem::transmute::<*const c_void, unsafe extern "C" fn(*mut H, u32) -> i32>(
                    sym("cuStreamCreate")
                )(&mut stream, 0),
                0
            );
        }
        let v = |n: &str, h: &str| if hip { h.to_string() } else { n.to_string() };
        let create: unsafe extern "C" fn(*mut H, *const u8) -> i32 =
            std::mem::transmute(sym(&v("cuMemPoolCreate", "hipMemPoolCreate")));
        let set: unsafe extern "C" fn(H, i32, *mut u64) -> i32 =
            std::mem::transmute(sym(&v("cuMemPoolSetAttribute", "hipMemPoolSetAttribute")));
        let alloc: unsafe extern "C" fn(*mut u64, usize, H, H) -> i32 =
            std::mem::transmute(sym(&v("cuMemAllocFromPoolAsync", "hipMallocFromPoolAsync")));
        let free: unsafe extern "C" fn(u64, H) -> i32 =
            std::mem::transmute(sym(&v("cuMemFreeAsync", "hipFreeAsync")));
        let destroy: unsafe extern "C" fn(H) -> i32 =
            std::mem::transmute(sym(&v("cuMemPoolDestroy", "hipMemPoolDestroy")));
        let sync = v("cuCtxSynchronize", "hipDeviceSynchronize");
        let mut threshold = u64::MAX; // the pool keeps what is freed (as portalloc's async does)

        // 1. Destroyed while a free is in flight behind a kernel that uses the block.
        assert_eq!(create(&mut pool, props.as_ptr()), 0);
        assert_eq!(set(pool, 4, &mut threshold), 0);
        let mut x = 0u64;
        assert_eq!(alloc(&mut x, MIB, pool, stream), 0);
        let k = c.launch(stream as u64, x, MIB as u64).unwrap();
        assert_eq!(free(x, stream), 0);
        assert_eq!(destroy(pool), 0);
        assert_eq!(c.hazards(), 0, "{}: {}", p.name, c.first_hazard());
        c.finish(k);
        assert_eq!(call0(&sync), 0);
        assert!(
            c.census().holds_no_memory(),
            "{}: after the free completed: {:?}",
            p.name,
            c.census()
        );

        // 2. Destroyed with an allocation outstanding, freed after.
        assert_eq!(create(&mut pool, props.as_ptr()), 0);
        assert_eq!(set(pool, 4, &mut threshold), 0);
        assert_eq!(alloc(&mut x, MIB, pool, stream), 0);
        assert_eq!(destroy(pool), 0, "{}: destroy returns at once", p.name);
        assert_eq!(free(x, stream), 0);
        assert_eq!(call0(&sync), 0);
        assert!(
            c.census().holds_no_memory(),
            "{}: after the last free: {:?}",
            p.name,
            c.census()
        );
    }
}

#[test]
fn fakehip_pool_destroy_defers_as_documented() {
    each_profile(
        "fakehip_pool_destroy_defers_as_documented",
        &[*profile("rocm7").unwrap()],
        destroy_sequence,
    );
}

#[test]
fn fakecuda_pool_destroy_releases_once_frees_complete() {
    each_profile(
        "fakecuda_pool_destroy_releases_once_frees_complete",
        &[*profile("cuda12").unwrap()],
        destroy_sequence,
    );
}

/// The driver the tests above use is built.
#[test]
fn drivers_are_built() {
    assert!(Driver::FAKEHIP.path().exists());
}
