//! Builds the fake drivers (`drivers/*.c`) into shared libraries in `OUT_DIR`, with the C
//! compiler the `cc` crate finds (`$CC`, else the platform's): one library per driver, which a
//! test loads by path (the crate's `Driver::path`). The path reaches the crate as
//! `PORTALLOC_FAKES_DIR`.
//!
//! With `-Wall`, and the compiler's warnings passed on as cargo's (`cargo:warning=`) rather
//! than made errors: a user's newer compiler may warn about what this one did not, and their
//! build should not break for it. portalloc's own CI refuses any warning (`scripts/test`).
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every driver: `drivers/<name>.c` becomes `lib<name>.so`.
const DRIVERS: [&str; 5] = [
    "fakecuda",
    "fakecuda_old",
    "fakecuda_nopeer",
    "fakecuda_nopinned",
    "fakehip",
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
    for name in DRIVERS {
        let source = sources.join(format!("{name}.c"));
        let library = out.join(format!("lib{name}.so"));
        let mut command: Command = compiler.to_command();
        command
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-std=c11", "-pthread"])
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
    }
    println!("cargo:rustc-env=PORTALLOC_FAKES_DIR={}", out.display());
}
