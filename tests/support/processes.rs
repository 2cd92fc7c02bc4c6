//! What the multi-process tests share: a fresh directory for each world, and the environment
//! that puts child processes on a fake driver's device shared between them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory of its own under the system's temporary one, made anew: `<prefix>-<pid>-<n>-
/// <name>` (tests run on parallel threads of one process, so `n` counts).
pub fn fresh_dir(prefix: &str, name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The variables that load the fake driver of `profile` (`cuda12`, `rocm7`, …) and put the
/// process on `shared`'s device, as strings.
pub fn shared_fake_env(
    profile: &str,
    shared: &portalloc_fakes::SharedDevice,
) -> Vec<(String, String)> {
    portalloc_fakes::profile(profile)
        .unwrap_or_else(|| panic!("no fakes profile {profile}"))
        .env()
        .into_iter()
        .chain(shared.env())
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect()
}
