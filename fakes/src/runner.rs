//! Running a test under each profile, each in a fresh process: [`each_profile`], the
//! [`each_profile!`](crate::each_profile!) macro that names the test itself, and [`Runner`]
//! for what a test adds (variables for every profile or one, a time limit, the children's
//! output).

use std::ffi::OsString;
use std::process::Command;
use std::time::Duration;

use crate::profiles::Profile;

/// Set only in the processes [`each_profile`] starts, to the profile's name: what tells such a
/// child from a parent that merely inherited the profile variable (a shell that exported a
/// profile's variables, say).
const CHILD_VARIABLE: &str = "PORTALLOC_FAKES_EACH_PROFILE";

/// The variable that limits each child of [`each_profile`] to so many seconds: one that runs
/// longer is killed and reported under its profile. Unset: no limit.
pub const TIMEOUT_VARIABLE: &str = "PORTALLOC_FAKES_TIMEOUT";

/// The variable that shows each child's output, passing ones included, when set to `1`
/// (as running the tests with `--nocapture` or `--show-output` does).
pub const SHOW_VARIABLE: &str = "PORTALLOC_FAKES_SHOW";

/// What a child of [`each_profile`] prints, with the profile's name, once the body returned.
const RETURNED: &str = "portalloc-fakes: the body returned under ";

/// Runs `command` to its end, or kills it once `limit` has passed: its output, and the limit
/// when it was killed for it.
fn run_child(
    command: &mut Command,
    limit: Option<Duration>,
) -> std::io::Result<(std::process::Output, Option<Duration>)> {
    let Some(limit) = limit else {
        return Ok((command.output()?, None));
    };
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Read on threads of their own: a child that fills a pipe would otherwise never end.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = std::time::Instant::now();
    let mut killed = None;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() >= limit {
            let _ = child.kill();
            killed = Some(limit);
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    Ok((output, killed))
}

/// What runs a test under profiles: [`each_profile`] with defaults, or this with what the test
/// adds.
///
/// ```no_run
/// use portalloc_fakes::{Runner, MATRIX};
///
/// #[test]
/// fn uploads_under_every_driver() {
///     Runner::new(MATRIX)
///         .env("MYLIB_LOG", "debug")                  // every profile
///         .env_for("rocm5", "MYLIB_NO_VMM", "1")        // one of them
///         .timeout(std::time::Duration::from_secs(120))
///         .run(portalloc_fakes::test_name!(), |profile| {
///             // ... the code under test
///         });
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Runner<'p> {
    profiles: &'p [Profile],
    env: Vec<(Option<String>, OsString, OsString)>,
    timeout: Option<Duration>,
    show: Option<bool>,
}

impl<'p> Runner<'p> {
    /// Runs under `profiles` ([`MATRIX`](crate::MATRIX), or some of it).
    pub fn new(profiles: &'p [Profile]) -> Runner<'p> {
        Runner {
            profiles,
            env: Vec::new(),
            timeout: None,
            show: None,
        }
    }

    /// A variable set in every child, after the profile's own.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Runner<'p> {
        self.env.push((None, key.into(), value.into()));
        self
    }

    /// A variable set in the child of the profile named `profile` only.
    ///
    /// # Panics
    /// In [`Runner::run`], when no profile of the runner has that name.
    pub fn env_for(
        mut self,
        profile: &str,
        key: impl Into<OsString>,
        value: impl Into<OsString>,
    ) -> Runner<'p> {
        self.env
            .push((Some(profile.to_string()), key.into(), value.into()));
        self
    }

    /// Kills a child that runs longer, and reports it under its profile (else
    /// [`TIMEOUT_VARIABLE`], else no limit).
    pub fn timeout(mut self, limit: Duration) -> Runner<'p> {
        self.timeout = Some(limit);
        self
    }

    /// Shows (or hides) every child's output, passing ones included. Unset: shown when the
    /// test binary runs with `--nocapture` or `--show-output`, or [`SHOW_VARIABLE`] is `1`.
    pub fn show_output(mut self, show: bool) -> Runner<'p> {
        self.show = Some(show);
        self
    }

    /// Runs `body` under each profile, each in a fresh process in which the driver is loaded
    /// anew, and panics naming every profile under which it failed (see [`each_profile`]).
    ///
    /// # Panics
    /// As [`each_profile`]; and when a variable was given for a profile the runner lacks.
    #[track_caller]
    pub fn run(self, test: impl AsRef<str>, body: impl FnOnce(&Profile)) {
        let test = test.as_ref();
        // A child of this very call: the marker names this test (a nested run for another
        // test, or a process the body starts, is a parent of its own).
        if let Some(mark) = std::env::var_os(CHILD_VARIABLE) {
            let mark = mark.to_string_lossy();
            if let Some((name, marked_test)) = mark.split_once('\t') {
                if marked_test == test {
                    let p = self
                        .profiles
                        .iter()
                        .find(|p| p.name == name)
                        .unwrap_or_else(|| {
                            panic!("{CHILD_VARIABLE}: no profile {name:.64} among this test's")
                        });
                    body(p);
                    // Seen by the parent: the body returned, rather than the process exiting
                    // from inside it.
                    println!("\n{RETURNED}{name}");
                    return;
                }
            }
        }
        assert!(
            !self.profiles.is_empty(),
            "each_profile({test}): no profiles to run under"
        );
        for (profile, key, _) in &self.env {
            if let Some(name) = profile {
                assert!(
                    self.profiles.iter().any(|p| p.name == name),
                    "each_profile({test}): a variable {} for profile {name:.64}, which is not \
                     among this test's ({})",
                    key.to_string_lossy(),
                    self.profiles
                        .iter()
                        .map(|p| p.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        let exe = std::env::current_exe().expect("the test binary's path");
        let limit = self.timeout.or_else(|| {
            std::env::var(TIMEOUT_VARIABLE).ok().map(|text| {
                let seconds: u64 = text.trim().parse().unwrap_or_else(|_| {
                    panic!("{TIMEOUT_VARIABLE}={text:.32}: a whole number of seconds, e.g. 300")
                });
                Duration::from_secs(seconds)
            })
        });
        let show = self.show.unwrap_or_else(|| {
            std::env::args().any(|a| a == "--nocapture" || a == "--show-output")
                || std::env::var_os("RUST_TEST_NOCAPTURE").is_some_and(|v| v != "0")
                || std::env::var(SHOW_VARIABLE).as_deref() == Ok("1")
        });
        let mut failed = Vec::new();
        for p in self.profiles {
            let mut command = Command::new(&exe);
            command.args([
                "--exact",
                test,
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ]);
            p.apply(&mut command)
                .env(CHILD_VARIABLE, format!("{}\t{test}", p.name));
            for (profile, key, value) in &self.env {
                if profile.as_deref().map_or(true, |name| name == p.name) {
                    command.env(key, value);
                }
            }
            let (out, timed_out) = run_child(&mut command, limit)
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            if show {
                println!("---- {test} under {} ----\n{stdout}{stderr}", p.name);
            }
            if let Some(limit) = timed_out {
                failed.push(format!(
                    "{}:\n    killed after {} s ({TIMEOUT_VARIABLE}): {}",
                    p.name,
                    limit.as_secs(),
                    why_it_failed(&format!("{stdout}{stderr}"))
                ));
                continue;
            }
            if stdout.contains(&format!("test {test} - should panic")) {
                // Each child would satisfy or fail its own #[should_panic], and any panic of
                // the parent then satisfies the parent's: the test's verdict would be
                // inverted. A panic here would pass such a test, so the process ends instead.
                eprintln!(
                    "each_profile({test}): a #[should_panic] test cannot run under \
                     each_profile (each child's verdict would be inverted in the parent); \
                     assert the panic in the body instead (std::panic::catch_unwind)"
                );
                std::process::exit(101);
            }
            // libtest says how many tests it runs before it runs them: a filter that names no
            // test passes without running anything, which is a mistake, not a pass.
            let ran = stdout.contains("running 1 test");
            let returned = stdout
                .lines()
                .any(|l| l.strip_prefix(RETURNED) == Some(p.name));
            if !out.status.success() || !ran || !returned {
                let text = format!("{stdout}{stderr}");
                let why = if !ran && stdout.contains("running 0 tests") {
                    format!(
                        "the filter --exact {test} ran no test (each_profile! names the test \
                         itself)"
                    )
                } else if !ran {
                    format!("{}: {}", out.status, why_it_failed(&text))
                } else if out.status.success() {
                    format!(
                        "the process ended ({}) before the body returned: {}",
                        out.status,
                        why_it_failed(&text)
                    )
                } else {
                    format!("{} ({})", why_it_failed(&text), out.status)
                };
                failed.push(format!("{}:\n    {why}", p.name));
            }
        }
        assert!(
            failed.is_empty(),
            "{test} failed under {} of {} profiles:\n{}",
            failed.len(),
            self.profiles.len(),
            failed.join("\n")
        );
    }
}

/// Runs `body` under each profile of `profiles`, each in a fresh process in which the driver
/// is loaded anew, and panics naming every profile under which it failed. The
/// [`each_profile!`](crate::each_profile!) macro does the same and names the test itself.
///
/// How: called in a test's parent process, it runs the test binary again once per profile —
/// `<binary> --exact <test> --include-ignored --nocapture --test-threads=1`, with the
/// profile's environment ([`Profile::apply`]: the driver by path and, for code that loads it
/// by name, on the loader's path) and a variable of its own that marks the child — and waits
/// for each. In such a child process it runs `body` with the profile named there, once.
/// `test` is the test's full path as `cargo test` prints it (`module::name`, or `name` at a
/// test file's top: what [`test_name!`](crate::test_name!) gives).
///
/// ```no_run
/// use portalloc_fakes::{each_profile, Controls, MATRIX};
///
/// #[test]
/// fn allocates_under_every_driver() {
///     each_profile("allocates_under_every_driver", MATRIX, |profile| {
///         // ... the code under test, which loads the driver from the profile's environment
///         let driver = Controls::open(profile.library()).unwrap();
///         assert!(driver.census().holds_no_memory(), "under {}", profile.name);
///     });
/// }
/// ```
///
/// (Not run here: a doctest is no test binary to run again. `tests/matrix.rs` of this crate
/// and `examples/downstream-ci` run it.)
///
/// Each child's output is shown when the test runs with `--nocapture` or `--show-output` (or
/// [`SHOW_VARIABLE`] is `1`), and a failing child's always, in the panic message.
///
/// # Panics
/// In the parent: when the test failed under some profile (each one's panic message or last
/// lines of output are in the message, with how the child ended: its exit status or the
/// signal that killed it); when the filter ran no test (a misspelt `test`); when `profiles`
/// is empty; when a child exited before its body returned; or when the test binary cannot be
/// run. In a child: whatever `body` panics with, or when the profile named is not in
/// `profiles`.
///
/// A `#[should_panic]` test cannot use it (each child would judge its own, and the parent's
/// panic about their verdicts would pass it): the parent then ends the process with status
/// 101, saying why. Assert an expected panic inside the body (`std::panic::catch_unwind`).
/// A body may itself call `each_profile` for another test.
///
/// Each child runs for as long as it takes, unless [`TIMEOUT_VARIABLE`]
/// (`PORTALLOC_FAKES_TIMEOUT`, seconds) is set or the [`Runner`] says: then a child that runs
/// longer is killed and reported as failing under its profile, with its last lines of output.
#[track_caller]
pub fn each_profile(test: &str, profiles: &[Profile], body: impl FnOnce(&Profile)) {
    Runner::new(profiles).run(test, body)
}

/// What a failed child's output says: its panic's message (the line after "panicked at" up
/// to a backtrace or a note), else its last lines; at most 12 lines.
fn why_it_failed(output: &str) -> String {
    let lines: Vec<&str> = output.lines().collect();
    let said: Vec<&str> = match lines.iter().position(|l| l.contains("panicked at")) {
        Some(i) => lines[i..]
            .iter()
            .take_while(|l| !l.starts_with("stack backtrace:") && !l.starts_with("note:"))
            .take(12)
            .copied()
            .collect(),
        None => lines[lines.len().saturating_sub(12)..].to_vec(),
    };
    said.join("\n    ")
}

/// The test's path as `cargo test` prints it, from the path of a function inside it (what
/// [`test_name!`](crate::test_name!) passes): the crate's name, the inner function and any
/// closure taken off.
#[doc(hidden)]
pub fn test_name_from(inner: &str) -> String {
    let parts: Vec<&str> = inner
        .split("::")
        .filter(|s| !s.starts_with("{{closure}}"))
        .collect();
    // [crate, module.., test, inner]
    let end = parts.len().saturating_sub(1);
    parts.get(1..end).map(|p| p.join("::")).unwrap_or_default()
}

/// The path of the test function this is written in, as `cargo test` prints it and
/// [`each_profile`] takes it (`module::name`; `name` at a test file's top): so a renamed or
/// moved test needs no string changed.
///
/// ```
/// fn my_test() -> String {
///     portalloc_fakes::test_name!()
/// }
/// // A doctest's own module is `main`, inside the doctest's crate.
/// assert!(my_test().ends_with("my_test"), "{}", my_test());
/// ```
#[macro_export]
macro_rules! test_name {
    () => {{
        fn __portalloc_fakes_here() {}
        fn __portalloc_fakes_path<T>(_: T) -> &'static str {
            ::core::any::type_name::<T>()
        }
        $crate::__test_name_from(__portalloc_fakes_path(__portalloc_fakes_here))
    }};
}

/// [`each_profile`] for the test function it is written in: `each_profile!(MATRIX, |p| ...)`.
///
/// ```no_run
/// use portalloc_fakes::{each_profile, Controls, MATRIX};
///
/// #[test]
/// fn allocates_under_every_driver() {
///     each_profile!(MATRIX, |profile| {
///         let driver = Controls::open(profile.library()).unwrap();
///         // ... the code under test
///     });
/// }
/// ```
#[macro_export]
macro_rules! each_profile {
    ($profiles:expr, $body:expr $(,)?) => {
        $crate::each_profile(&$crate::test_name!(), $profiles, $body)
    };
}

#[cfg(test)]
mod tests {
    use super::test_name_from;

    #[test]
    fn test_names_drop_the_crate_the_inner_function_and_closures() {
        assert_eq!(test_name_from("matrix::a_test::__here"), "a_test");
        assert_eq!(
            test_name_from("mylib::tests::a_test::__here"),
            "tests::a_test"
        );
        assert_eq!(
            test_name_from("mylib::tests::a_test::{{closure}}::__here"),
            "tests::a_test"
        );
        assert_eq!(test_name_from("x"), "");
        assert_eq!(
            crate::test_name!(),
            "runner::tests::test_names_drop_the_crate_the_inner_function_and_closures"
        );
    }
}
