//! Build script: records the target triple, so `portalloc info` can say what this binary was
//! built for.
//!
//! Nothing else: a crate that depends on portalloc compiles no C and needs no C compiler.
//! The conformance drivers (`fakes/drivers/*.c`, small C libraries that export the CUDA
//! driver or HIP runtime symbols over host memory) are built by the test kit
//! `portalloc-fakes` (`fakes/`) for crates that depend on it, and by portalloc's own tests
//! when they first need them (`tests/support/mod.rs`).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=PORTALLOC_BUILD_TARGET={target}");
}
