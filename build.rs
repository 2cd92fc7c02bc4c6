//! Build script.
//!
//! 1. Records the target triple, so `portalloc info` can say what this binary was built for.
//! 2. Compiles the **conformance drivers** — small C libraries in `tests/drivers/*.c` that
//!    export the CUDA driver or HIP runtime symbols over host memory, with fault injection —
//!    into shared objects under `OUT_DIR`, and tells the tests where they are through
//!    `PORTALLOC_TEST_DRIVER_<NAME>` (e.g. `PORTALLOC_TEST_DRIVER_FAKECUDA`). They test the
//!    real shims' loading, symbol resolution, error mapping and every strategy without a GPU.
//!    Where no C compiler is found the variable is left unset and those tests skip, saying so.
//!
//! Nothing here is linked into portalloc itself: vendor libraries are loaded at run time.
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=tests/drivers");
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=PORTALLOC_BUILD_TARGET={target}");
    build_conformance_drivers(&target);
}

fn build_conformance_drivers(target: &str) {
    let Ok(out_dir) = std::env::var("OUT_DIR") else {
        return;
    };
    if !target.contains("linux") {
        return;
    }
    let Ok(entries) = std::fs::read_dir("tests/drivers") else {
        return;
    };
    let compiler = match cc::Build::new().cargo_metadata(false).try_get_compiler() {
        Ok(c) => c,
        Err(e) => {
            println!("cargo:warning=no C compiler ({e}): conformance-driver tests will skip");
            return;
        }
    };
    let mut sources: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();
    for source in sources {
        println!("cargo:rerun-if-changed={}", source.display());
        let stem = source
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("driver")
            .to_string();
        let output = Path::new(&out_dir).join(format!("lib{stem}.so"));
        let status = compiler
            .to_command()
            .args([
                "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-std=c11", "-pthread", "-o",
            ])
            .arg(&output)
            .arg(&source)
            .status();
        let var = format!(
            "PORTALLOC_TEST_DRIVER_{}",
            stem.to_ascii_uppercase().replace('-', "_")
        );
        match status {
            Ok(s) if s.success() => println!("cargo:rustc-env={var}={}", output.display()),
            Ok(s) => panic!(
                "compiling conformance driver {} failed: {s}",
                source.display()
            ),
            Err(e) => println!(
                "cargo:warning=could not run the C compiler for {}: {e}",
                source.display()
            ),
        }
    }
}
