//! Builds the fake drivers (`drivers/*.c`) into shared libraries in `OUT_DIR`, with the C
//! compiler the `cc` crate finds (`$CC`, else the platform's): one library per driver, which a
//! test loads by path (the crate's `Driver::path`), each carrying its vendor's `DT_SONAME`
//! (`libcuda.so.1`, `libamdhip64.so.6`). Beside them, `sonames/<driver>/` holds links named
//! as the vendors name their libraries (`libcuda.so.1` and `libcuda.so`; `libamdhip64.so` and
//! `.so.5`, `.so.6`, `.so.7`), for code that loads the driver by name: a profile puts that
//! folder first on the loader's path. The folder reaches the crate as `PORTALLOC_FAKES_DIR`.
//!
//! With `-Wall`, and the compiler's warnings passed on as cargo's (`cargo:warning=`) rather
//! than made errors: a user's newer compiler may warn about what this one did not, and their
//! build should not break for it. portalloc's own CI refuses any warning (`scripts/test`).
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every driver: `drivers/<name>.c` becomes `lib<name>.so`, with the vendor's soname, and the
/// names it is linked under in `sonames/<name>/`.
const DRIVERS: [(&str, &str, &[&str]); 5] = [
    ("fakecuda", "libcuda.so.1", CUDA_NAMES),
    ("fakecuda_old", "libcuda.so.1", CUDA_NAMES),
    ("fakecuda_nopeer", "libcuda.so.1", CUDA_NAMES),
    ("fakecuda_nopinned", "libcuda.so.1", CUDA_NAMES),
    ("fakehip", "libamdhip64.so.6", HIP_NAMES),
];
const CUDA_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];
const HIP_NAMES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.5",
    "libamdhip64.so.6",
    "libamdhip64.so.7",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=drivers");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let sources = Path::new("drivers");
    for entry in std::fs::read_dir(sources).expect("the drivers' sources") {
        let path = entry.expect("a driver source").path();
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let compiler = cc::Build::new().get_compiler();
    for (name, soname, links) in DRIVERS {
        let source = sources.join(format!("{name}.c"));
        let library = out.join(format!("lib{name}.so"));
        let mut command: Command = compiler.to_command();
        command
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-std=c11", "-pthread"])
            .arg(format!("-Wl,-soname,{soname}"))
            .arg("-o")
            .arg(&library)
            .arg(&source);
        match command.output() {
            Ok(output) if output.status.success() => {
                for line in String::from_utf8_lossy(&output.stderr).lines() {
                    println!("cargo:warning={line}");
                }
            }
            Ok(output) => panic!(
                "portalloc-fakes: {} failed on {} ({}): the fake drivers need a working C \
                 compiler ($CC)\n{}",
                compiler.path().display(),
                source.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ),
            Err(e) => panic!(
                "portalloc-fakes: no C compiler ({}: {e}); the fake drivers need one ($CC)",
                compiler.path().display()
            ),
        }
        // Relative links, so the folder stays right wherever the whole build is copied.
        let folder = out.join("sonames").join(name);
        std::fs::create_dir_all(&folder).expect("the sonames folder");
        for link in links {
            let at = folder.join(link);
            let _ = std::fs::remove_file(&at);
            std::os::unix::fs::symlink(Path::new("../..").join(format!("lib{name}.so")), &at)
                .unwrap_or_else(|e| panic!("portalloc-fakes: cannot link {}: {e}", at.display()));
        }
    }
    println!("cargo:rustc-env=PORTALLOC_FAKES_DIR={}", out.display());
}
