//! What may this process use on a device? Every limiter portalloc can see, and which binds:
//! the driver's total and free memory, a cgroup v2 `dmem` limit (NVIDIA MPS v3 on Linux
//! ≥ 6.14 limits clients through it), `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, a MIG slice (the
//! driver's total is the slice's), the shared budget (what the other members hold), the
//! memory fraction and the ceiling. `portalloc info` prints them.
#![deny(unsafe_code)]

use crate::units::Bytes;

/// One limit on what the process may use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Limiter {
    /// What limits (`driver total`, `cgroup dmem.max`, …).
    pub name: String,
    /// The bytes it allows this process (`None`: seen, but no number, e.g. `max`).
    pub bytes: Option<u64>,
    /// Where the figure comes from.
    pub source: String,
}

/// Every limiter of one device, and which binds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// The limiters seen.
    pub limiters: Vec<Limiter>,
    /// The index of the one that binds (the fewest bytes).
    pub binding: Option<usize>,
}

impl Limits {
    /// The binding limiter.
    pub fn binding(&self) -> Option<&Limiter> {
        self.binding.and_then(|i| self.limiters.get(i))
    }
}

/// What the caller knows of the device and the process.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// The device's ordinal in its backend.
    pub ordinal: u32,
    /// The device's name (a MIG slice says so in it).
    pub name: String,
    /// The driver's total.
    pub total: u64,
    /// The driver's free memory now.
    pub free: u64,
    /// The memory fraction and where it came from.
    pub fraction: (f64, String),
    /// The shared budget's ceiling for this process, if any.
    pub ceiling: Option<u64>,
    /// Bytes the shared budget's other members hold, when this process is a member.
    pub others_hold: Option<u64>,
}

/// Every limiter, reading `getenv` for the MPS variable and `read` for files (the cgroup's),
/// so tests can give their own.
pub fn limits(
    seen: &Seen,
    getenv: &dyn Fn(&str) -> Option<String>,
    read: &dyn Fn(&str) -> Option<String>,
) -> Limits {
    let mut limiters = vec![
        Limiter {
            name: "driver total".into(),
            bytes: Some(seen.total),
            source: "the driver's total memory".into(),
        },
        Limiter {
            name: "driver free".into(),
            bytes: Some(seen.free),
            source: "the driver's free memory now (other processes' use included)".into(),
        },
    ];
    if seen.name.contains("MIG") {
        limiters.push(Limiter {
            name: "MIG slice".into(),
            bytes: Some(seen.total),
            source: format!("`{}`: the driver's total is the slice's", seen.name),
        });
    }
    if let Some(l) = mps_limit(seen.ordinal, getenv) {
        limiters.push(l);
    }
    if let Some(l) = dmem_limit(read) {
        limiters.push(l);
    }
    if let Some(others) = seen.others_hold {
        limiters.push(Limiter {
            name: "shared budget".into(),
            bytes: Some(seen.total.saturating_sub(others)),
            source: format!(
                "the total less what the other members hold ({})",
                Bytes(others)
            ),
        });
    }
    limiters.push(Limiter {
        name: "memory fraction".into(),
        bytes: Some((seen.fraction.0 * seen.total as f64) as u64),
        source: format!(
            "{} × the driver's total (from {})",
            seen.fraction.0, seen.fraction.1
        ),
    });
    if let Some(c) = seen.ceiling {
        limiters.push(Limiter {
            name: "ceiling".into(),
            bytes: Some(c),
            source: "PORTALLOC_CEILING".into(),
        });
    }
    let binding = limiters
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.bytes.map(|b| (b, i)))
        .min()
        .map(|(_, i)| i);
    Limits { limiters, binding }
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: `"0=1G,1=512MB"` (per device) or `"2G"` (every device),
/// as NVIDIA's MPS documentation writes it.
pub fn mps_limit(ordinal: u32, getenv: &dyn Fn(&str) -> Option<String>) -> Option<Limiter> {
    let value = getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")?;
    let mut every = None;
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some((dev, size)) if dev.trim().parse::<u32>() == Ok(ordinal) => {
                let bytes = mps_size(size.trim())?;
                return Some(mps(bytes, &value));
            }
            Some(_) => {}
            None => every = mps_size(part),
        }
    }
    every.map(|b| mps(b, &value))
}

fn mps(bytes: u64, value: &str) -> Limiter {
    Limiter {
        name: "MPS pinned limit".into(),
        bytes: Some(bytes),
        source: format!(
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={}",
            crate::budget::layout::cut(value, 80)
        ),
    }
}

/// MPS's sizes: a number with an optional `K`, `M`, `G` (binary) and optional `B`.
fn mps_size(text: &str) -> Option<u64> {
    let t = text.trim_end_matches(['B', 'b']);
    let (digits, unit) = match t.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&t[..i], c.to_ascii_uppercase()),
        _ => (t, ' '),
    };
    let n: u64 = digits.trim().parse().ok()?;
    let shift = match unit {
        ' ' => 0,
        'K' => 10,
        'M' => 20,
        'G' => 30,
        'T' => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// The smallest `dmem.max` on this process's cgroup v2 path and its parents (one line per
/// region, `<region> <bytes|max>`), from `/proc/self/cgroup`'s `0::<path>`.
pub fn dmem_limit(read: &dyn Fn(&str) -> Option<String>) -> Option<Limiter> {
    let cgroup = read("/proc/self/cgroup")?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?.trim();
    let mut dir = format!("/sys/fs/cgroup{}", path.trim_end_matches('/'));
    let mut best: Option<(u64, String)> = None;
    let mut seen_file = None;
    for _ in 0..64 {
        let file = format!("{dir}/dmem.max");
        if let Some(text) = read(&file) {
            seen_file.get_or_insert_with(|| file.clone());
            for line in text.lines().take(64) {
                let mut words = line.split_whitespace();
                let (Some(region), Some(v)) = (words.next(), words.next()) else {
                    continue;
                };
                if let Ok(b) = v.parse::<u64>() {
                    if best.as_ref().map_or(true, |(x, _)| b < *x) {
                        best = Some((b, format!("{file} ({region})")));
                    }
                }
            }
        }
        match dir.rfind('/') {
            Some(i) if dir.len() > "/sys/fs/cgroup".len() => dir.truncate(i),
            _ => break,
        }
    }
    match (best, seen_file) {
        (Some((b, source)), _) => Some(Limiter {
            name: "cgroup dmem.max".into(),
            bytes: Some(b),
            source,
        }),
        (None, Some(file)) => Some(Limiter {
            name: "cgroup dmem.max".into(),
            bytes: None,
            source: format!("{file}: max"),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_limiter_binds() {
        let seen = Seen {
            ordinal: 1,
            name: "NVIDIA H100 80GB HBM3".into(),
            total: 80 << 30,
            free: 70 << 30,
            fraction: (0.75, "default".into()),
            ceiling: None,
            others_hold: Some(20 << 30),
        };
        let env =
            |k: &str| (k == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT").then(|| "0=1G,1=40G".to_string());
        let files = |f: &str| match f {
            "/proc/self/cgroup" => Some("0::/jobs/a\n".to_string()),
            "/sys/fs/cgroup/jobs/dmem.max" => Some("drm/0000:01:00.0/vram0 53687091200\n".into()),
            "/sys/fs/cgroup/jobs/a/dmem.max" => Some("drm/0000:01:00.0/vram0 max\n".into()),
            _ => None,
        };
        let l = limits(&seen, &env, &files);
        let names: Vec<&str> = l.limiters.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "driver total",
                "driver free",
                "MPS pinned limit",
                "cgroup dmem.max",
                "shared budget",
                "memory fraction"
            ]
        );
        assert_eq!(l.binding().unwrap().name, "MPS pinned limit");
        assert_eq!(l.binding().unwrap().bytes, Some(40 << 30));
        let dmem = l
            .limiters
            .iter()
            .find(|x| x.name == "cgroup dmem.max")
            .unwrap();
        assert_eq!(dmem.bytes, Some(50 << 30));
    }

    #[test]
    fn mps_sizes_read_as_nvidia_writes_them() {
        let env = |v: &'static str| move |_: &str| Some(v.to_string());
        assert_eq!(mps_limit(0, &env("2G")).unwrap().bytes, Some(2 << 30));
        assert_eq!(
            mps_limit(3, &env("0=1G,512MB")).unwrap().bytes,
            Some(512 << 20)
        );
        assert_eq!(
            mps_limit(0, &env("0=1G,512MB")).unwrap().bytes,
            Some(1 << 30)
        );
        assert_eq!(mps_limit(0, &env("lots")), None);
        assert_eq!(mps_limit(0, &env("0=99999999999999999999G")), None);
    }
}
