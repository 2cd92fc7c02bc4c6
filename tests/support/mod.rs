//! What every test file shares: the rule for skipping.
//!
//! A test that needs something the machine may lack — the real traces in `../shared`, a C
//! compiler or Python for the C ABI's programs — skips with a message on a user's machine.
//! Where skipping would hide a gap, it must not: under `CI=true`, or with
//! `PORTALLOC_TEST_REQUIRE_ALL=1` set by a user who wants the same, a missing prerequisite
//! fails the test with the same message instead of passing it silently.

#[cfg(feature = "c-api")]
pub mod capi;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod capture;
#[cfg(feature = "cli")]
pub mod cli;
pub mod common;
pub mod processes;
#[cfg(feature = "replay")]
pub mod replay;
pub mod sleep;
pub mod targets;

/// True when a missing prerequisite must fail the run (`CI=true` or
/// `PORTALLOC_TEST_REQUIRE_ALL=1`).
pub fn required() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
        || std::env::var("PORTALLOC_TEST_REQUIRE_ALL").as_deref() == Ok("1")
}

/// Skips (prints `skipping: {why}`) — or, where skips must not hide, fails with it.
///
/// # Panics
/// When [`required`] is true.
pub fn skip(why: &str) {
    if required() {
        panic!("{why} — and CI=true (or PORTALLOC_TEST_REQUIRE_ALL=1) requires it");
    }
    eprintln!("skipping: {why}");
}

/// The path of a real vendor runtime named by `var` (`PORTALLOC_TEST_CUDA_LIBRARY`,
/// `PORTALLOC_TEST_HIP_LIBRARY`: Debian's libraries, which `scripts/fetch-vendor-runtimes`
/// unpacks into `.vendor/` and `scripts/test` exports); `None`, after a message, where it is
/// not set: the test then passes without checking the runtime.
pub fn vendor_runtime(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            eprintln!(
                "skipping: {var} is not set (run scripts/test, which fetches the vendor runtimes \
                 into .vendor/; by hand: `. .vendor/env; export {var} \
                 LD_LIBRARY_PATH=$PORTALLOC_TEST_LIBRARY_PATH`)"
            );
            None
        }
    }
}

/// Asserts a `#[repr(C)]` type's size (and alignment, where given) and its fields' offsets,
/// as the C header gives them: `assert_layout!(sys::T, size 8, align 4; a @ 0, b @ 4)`.
#[macro_export]
macro_rules! assert_layout {
    ($ty:ty, size $size:expr $(, align $align:expr)? $(; $($field:ident @ $offset:expr),+ $(,)?)?) => {{
        assert_eq!(std::mem::size_of::<$ty>(), $size, "size of {}", stringify!($ty));
        $(assert_eq!(std::mem::align_of::<$ty>(), $align, "alignment of {}", stringify!($ty));)?
        $($(assert_eq!(
            std::mem::offset_of!($ty, $field),
            $offset,
            "offset of {}.{}",
            stringify!($ty),
            stringify!($field)
        );)+)?
    }};
}

/// Asserts that each constant has the value the C header gives it, naming the first that
/// does not: `assert_values!(sys::A = 2, sys::B = 100)`.
#[macro_export]
macro_rules! assert_values {
    ($($constant:path = $value:expr),+ $(,)?) => {{
        $(assert_eq!($constant, $value, "{}", stringify!($constant));)+
    }};
}

/// The conformance driver `name` (`fakecuda`, `fakecuda_old`, `fakecuda_nopeer`,
/// `fakecuda_nopinned`, `fakehip`: `fakes/drivers/`), as the test kit `portalloc-fakes`
/// built it (its build script, once per target directory; a user's build of portalloc
/// compiles no test fixture). Shared by the tests of a process: a test that needs its own
/// driver state loads a copy ([`fakes::Fake::copy`]).
///
/// # Panics
/// When `name` is not one of the kit's drivers.
pub fn driver(name: &str) -> &'static str {
    use std::sync::OnceLock;

    static BUILT: OnceLock<Vec<(&'static str, &'static str)>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        portalloc_fakes::Driver::ALL
            .iter()
            .map(|d| {
                let path = d.path().into_os_string().into_string();
                let path = path.expect("the fake drivers' directory is UTF-8");
                (d.name, &*Box::leak(path.into_boxed_str()))
            })
            .collect()
    });
    match built.iter().find(|(n, _)| *n == name) {
        Some(&(_, path)) => path,
        None => {
            let names: Vec<&str> = built.iter().map(|(n, _)| *n).collect();
            panic!("no conformance driver {name:?}: portalloc-fakes builds {names:?}")
        }
    }
}

#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod fakes;

/// A stream from a raw handle, for the tests: a value the host device only compares, or a
/// stream the test made with the conformance driver's own call and destroys only after its
/// last use — what [`portalloc::Stream::from_raw`] asks of its caller.
pub fn stream(raw: u64) -> portalloc::Stream {
    // SAFETY: see above: every caller in the tests passes such a handle.
    unsafe { portalloc::Stream::from_raw(raw) }
}

/// `../shared/<dir>` beside the repository (or the directory `variable` names), or `None`
/// after [`skip`] when it is absent.
pub fn shared_dir(variable: &str, dir: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os(variable)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../shared")
                .join(dir)
        });
    if path.is_dir() {
        Some(path)
    } else {
        skip(&format!(
            "no {dir} at {} (set {variable} to a copy of shared/{dir})",
            path.display()
        ));
        None
    }
}

/// `file` of the shared real traces: `../shared/traces-edge/` (`edge`, or
/// `PORTALLOC_TRACES_EDGE`) or `../shared/traces/` (`PORTALLOC_TRACES`); `None` after
/// [`skip`] when it is absent.
pub fn shared_trace(edge: bool, file: &str) -> Option<std::path::PathBuf> {
    let dir = if edge {
        shared_dir("PORTALLOC_TRACES_EDGE", "traces-edge")
    } else {
        shared_dir("PORTALLOC_TRACES", "traces")
    }?;
    let path = dir.join(file);
    if path.exists() {
        Some(path)
    } else {
        skip(&format!("{} is absent", path.display()));
        None
    }
}

/// An event of thread 0 on the default stream, untagged, at time `seq`.
#[cfg(feature = "trace")]
pub fn event(seq: u64, op: portalloc::trace::Op, id: u64, size: u64) -> portalloc::trace::Event {
    portalloc::trace::Event {
        seq,
        time_ns: seq,
        thread: 0,
        stream: 0,
        op,
        id,
        size,
        tag: 0,
    }
}
