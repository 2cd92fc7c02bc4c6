//! The tests' layout stays as `main.rs` describes it: a file in `tests/suite/` that is no
//! module of `main.rs` would never be compiled, and a new file in `tests/` would be a test
//! binary of its own (linked again, and in a process of its own only when it needs one).

use std::collections::BTreeSet;
use std::path::Path;

/// The `.rs` files in `dir`, without the extension.
fn sources(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".rs").map(str::to_string)
        })
        .collect()
}

#[test]
fn every_file_of_the_suite_is_one_of_its_modules() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite");
    let main = std::fs::read_to_string(dir.join("main.rs")).unwrap();
    let modules: BTreeSet<String> = main
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect();
    let mut files = sources(&dir);
    files.remove("main");
    assert_eq!(
        files.difference(&modules).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "files of tests/suite/ that are no `mod` of tests/suite/main.rs: never compiled"
    );
}

#[test]
fn only_the_tests_that_need_a_process_of_their_own_are_binaries_of_their_own() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let own: BTreeSet<String> = ["capi", "hermetic", "host_device"].map(String::from).into();
    assert_eq!(
        sources(&dir),
        own,
        "a test file in tests/ is a binary of its own: put it in tests/suite/ as a module of \
         main.rs, unless it needs a process of its own (then say why in tests/suite/main.rs \
         and here)"
    );
}
