//! Records the target triple and enabled backends so `portalloc info` can say what this
//! binary was built for. No native code is compiled or linked: vendor libraries are loaded
//! at run time.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=PORTALLOC_BUILD_TARGET={target}");
}
