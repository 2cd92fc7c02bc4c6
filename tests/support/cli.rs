//! Running the `portalloc` command line as a user's shell would: only the variables the test
//! sets (every one portalloc reads removed first), standard input given or empty, and a
//! deadline, so a command that blocks fails its test instead of hanging the suite.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long one run may take before it is killed and its test fails.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// Runs `portalloc` with `args`, every variable portalloc reads removed and then `env` set,
/// `stdin` written to its standard input (empty when `None`): `(success, stdout, stderr)`.
///
/// # Panics
/// When the command cannot be started, or runs past [`DEADLINE`] (it is killed first).
pub fn run(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_portalloc"));
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in portalloc::config::VARIABLES {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run portalloc");
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().expect("a piped stdin");
        let bytes = bytes.to_vec();
        // A thread of its own, so that a command which stops reading cannot block the test.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        });
    }
    let id = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(out) => {
            let out = out.expect("portalloc output");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(id.to_string()).status();
            panic!("portalloc {args:?} ran past {DEADLINE:?}");
        }
    }
}

/// [`run`] without standard input.
pub fn portalloc(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    run(args, env, None)
}
