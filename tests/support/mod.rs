//! What every test file shares: the rule for skipping.
//!
//! A test that needs something the machine may lack — a C compiler for the conformance
//! drivers, the real traces in `../shared` — skips with a message on a user's machine. Where
//! skipping would hide a gap, it must not: under `CI=true`, or with
//! `PORTALLOC_TEST_REQUIRE_ALL=1` set by a user who wants the same, a missing prerequisite
//! fails the test with the same message instead of passing it silently.

#[cfg(feature = "c-api")]
pub mod capi;
#[cfg(feature = "cli")]
pub mod cli;
pub mod common;
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

/// The conformance driver `name` (`fakecuda`, `fakecuda_old`, `fakehip`: `fakes/drivers/`),
/// compiled for the tests on first use — never by a user's build, which compiles no test
/// fixture and needs no C compiler. The shared object is kept under the target directory (a
/// folder per source tree) and
/// rebuilt when a driver source is newer. `None` (after a message) when no C compiler works:
/// the caller then skips — or fails under `CI=true`, through [`skip`].
///
/// The compiler is `$CC` or `cc`, with `-Wall -Werror`: these are the project's own tests.
pub fn driver(name: &str) -> Option<&'static str> {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, OnceLock};

    static BUILT: OnceLock<Mutex<HashMap<String, Option<&'static str>>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(path) = built.get(name) {
        return *path;
    }
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("fakes/drivers");
    let source = sources.join(format!("{name}.c"));
    // One folder per source tree: checkouts (git worktrees) that share a target directory
    // may hold different driver sources.
    let tree = {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        env!("CARGO_MANIFEST_DIR").hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("conformance-drivers")
        .join(tree);
    let output = dir.join(format!("lib{name}.so"));
    let newest_source = std::fs::read_dir(&sources)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
        .max();
    let fresh = match (
        std::fs::metadata(&output).and_then(|m| m.modified()),
        newest_source,
    ) {
        (Ok(built_at), Some(source_at)) => built_at >= source_at,
        _ => false,
    };
    let result = if fresh {
        Some(output)
    } else {
        compile(&source, &dir, &output)
    };
    let leaked: Option<&'static str> =
        result.map(|p| &*Box::leak(p.to_string_lossy().into_owned().into_boxed_str()));
    built.insert(name.to_string(), leaked);
    leaked
}

fn compile(
    source: &std::path::Path,
    dir: &std::path::Path,
    output: &std::path::Path,
) -> Option<std::path::PathBuf> {
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("cannot make {}: {e}", dir.display());
        return None;
    }
    // Built under a name of this process, then renamed: tests in other processes may build
    // the same driver at the same time.
    let partial = dir.join(format!(
        "{}.{}.partial",
        output.file_name()?.to_string_lossy(),
        std::process::id()
    ));
    let status = std::process::Command::new(&compiler)
        .args([
            "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-std=c11", "-pthread", "-o",
        ])
        .arg(&partial)
        .arg(source)
        .status();
    match status {
        Ok(s) if s.success() => match std::fs::rename(&partial, output) {
            Ok(()) => Some(output.to_path_buf()),
            Err(e) => {
                eprintln!("cannot place {}: {e}", output.display());
                None
            }
        },
        Ok(s) => {
            eprintln!("{compiler} failed on {} ({s})", source.display());
            None
        }
        Err(e) => {
            eprintln!("no C compiler ({compiler}: {e}) for {}", source.display());
            None
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
