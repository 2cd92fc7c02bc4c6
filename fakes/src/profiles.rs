//! The drivers, and the profiles that select their personalities: [`Vendor`], [`Driver`],
//! [`Profile`], [`MATRIX`], [`EXTRA`].

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The vendor API a driver exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// The CUDA driver API (`libcuda.so.1`).
    Cuda,
    /// The HIP runtime API (`libamdhip64.so`).
    Hip,
}

impl Vendor {
    /// Its name as `PORTALLOC_BACKEND` takes it: `cuda`, `hip`.
    pub fn name(self) -> &'static str {
        match self {
            Vendor::Cuda => "cuda",
            Vendor::Hip => "hip",
        }
    }

    /// The variable portalloc reads for this vendor's library path
    /// (`PORTALLOC_CUDA_LIBRARY`, `PORTALLOC_HIP_LIBRARY`).
    ///
    /// ```
    /// use portalloc_fakes::{Driver, Vendor};
    ///
    /// assert_eq!(Driver::FAKEHIP.vendor, Vendor::Hip);
    /// assert_eq!(Vendor::Hip.library_variable(), "PORTALLOC_HIP_LIBRARY");
    /// assert_eq!(Vendor::Hip.name(), "hip");
    /// ```
    pub fn library_variable(self) -> &'static str {
        match self {
            Vendor::Cuda => "PORTALLOC_CUDA_LIBRARY",
            Vendor::Hip => "PORTALLOC_HIP_LIBRARY",
        }
    }

    /// The names a program loads the vendor's library by, first the one most code uses
    /// (`libcuda.so.1`; `libamdhip64.so`): each is in every driver's
    /// [`Driver::soname_dir`].
    ///
    /// ```
    /// use portalloc_fakes::Vendor;
    ///
    /// assert_eq!(Vendor::Cuda.sonames()[0], "libcuda.so.1");
    /// assert!(Vendor::Hip.sonames().contains(&"libamdhip64.so.6"));
    /// ```
    pub fn sonames(self) -> &'static [&'static str] {
        match self {
            Vendor::Cuda => &["libcuda.so.1", "libcuda.so"],
            Vendor::Hip => &[
                "libamdhip64.so",
                "libamdhip64.so.5",
                "libamdhip64.so.6",
                "libamdhip64.so.7",
            ],
        }
    }
}

/// The variable that names a folder of drivers built already (one copy shared by every
/// process and language: [`Profile::env`] sets it; the Python side reads it too). Unset,
/// this crate's own build is used.
pub const DIR_VARIABLE: &str = "PORTALLOC_FAKES_DIR";

/// One fake driver, built into a shared library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Driver {
    /// Its name: `drivers/<name>.c`, built as `lib<name>.so`.
    pub name: &'static str,
    /// The API it exports.
    pub vendor: Vendor,
}

impl Driver {
    /// CUDA 12.2 on an H100: virtual memory, stream-ordered pools, peer access, pinned host
    /// memory.
    pub const FAKECUDA: Driver = Driver {
        name: "fakecuda",
        vendor: Vendor::Cuda,
    };
    /// CUDA 10.1 on a V100: neither virtual memory nor pools.
    pub const FAKECUDA_OLD: Driver = Driver {
        name: "fakecuda_old",
        vendor: Vendor::Cuda,
    };
    /// fakecuda with two devices and no peer link between them (the peer calls say no).
    pub const FAKECUDA_NOPEER: Driver = Driver {
        name: "fakecuda_nopeer",
        vendor: Vendor::Cuda,
    };
    /// fakecuda where host memory cannot be page-locked (the pinned calls refuse).
    pub const FAKECUDA_NOPINNED: Driver = Driver {
        name: "fakecuda_nopinned",
        vendor: Vendor::Cuda,
    };
    /// The HIP runtime: ROCm 5, 6 or 7 by `FAKEHIP_VERSION`, ROCm's reported behaviours by
    /// `FAKEHIP_PROFILE`.
    pub const FAKEHIP: Driver = Driver {
        name: "fakehip",
        vendor: Vendor::Hip,
    };

    /// Every driver.
    pub const ALL: [Driver; 5] = [
        Driver::FAKECUDA,
        Driver::FAKECUDA_OLD,
        Driver::FAKECUDA_NOPEER,
        Driver::FAKECUDA_NOPINNED,
        Driver::FAKEHIP,
    ];

    /// The folder of drivers in use: [`DIR_VARIABLE`] when it is set (a copy another process
    /// built, the Python side's, say: then both watch one driver), else this crate's build.
    ///
    /// ```
    /// let dir = portalloc_fakes::Driver::dir();
    /// assert!(dir.join("libfakecuda.so").exists());
    /// ```
    pub fn dir() -> PathBuf {
        match std::env::var_os(DIR_VARIABLE) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => Path::new(env!("PORTALLOC_FAKES_DIR")).to_path_buf(),
        }
    }

    /// The built library in [`Driver::dir`]. Shared by every process that loads it; each
    /// process that loads it gets its own driver state.
    ///
    /// ```
    /// let path = portalloc_fakes::Driver::FAKECUDA.path();
    /// assert!(path.ends_with("libfakecuda.so"));
    /// ```
    pub fn path(&self) -> PathBuf {
        Driver::dir().join(format!("lib{}.so", self.name))
    }

    /// The folder in which this driver carries its vendor's library names
    /// ([`Vendor::sonames`]): put first on the loader's path (`LD_LIBRARY_PATH`, which
    /// [`Profile::env`] sets), code that loads `libcuda.so.1` or `libamdhip64.so` by name gets
    /// this driver — the same library as [`Driver::path`], so the same driver state.
    ///
    /// ```
    /// use portalloc_fakes::Driver;
    ///
    /// let dir = Driver::FAKECUDA.soname_dir();
    /// let linked = std::fs::canonicalize(dir.join("libcuda.so.1")).unwrap();
    /// assert_eq!(linked, std::fs::canonicalize(Driver::FAKECUDA.path()).unwrap());
    /// ```
    pub fn soname_dir(&self) -> PathBuf {
        Driver::dir().join("sonames").join(self.name)
    }
}

/// A driver and the environment that selects one of its personalities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// Its name, unique in [`MATRIX`] and [`EXTRA`].
    pub name: &'static str,
    /// The driver it loads.
    pub driver: Driver,
    /// Variables the driver reads when it starts (or at `fakehip_reset`).
    pub vars: &'static [(&'static str, &'static str)],
    /// What it models, and where that behaviour was reported.
    pub models: &'static str,
}

const ROCM7: (&str, &str) = ("FAKEHIP_VERSION", "70051831");

/// Every profile: CUDA's personalities, then ROCm's versions and its reported behaviours.
pub const MATRIX: &[Profile] = &[
    Profile {
        name: "cuda12",
        driver: Driver::FAKECUDA,
        vars: &[],
        models: "CUDA 12.2 on an H100 SXM5 80GB: virtual memory, stream-ordered pools, peer \
                 access, pinned memory",
    },
    Profile {
        name: "cuda10-no-vmm",
        driver: Driver::FAKECUDA_OLD,
        vars: &[],
        models: "CUDA 10.1 on a V100-SXM2-16GB: no virtual memory management, no \
                 stream-ordered pools",
    },
    Profile {
        name: "cuda12-no-peer",
        driver: Driver::FAKECUDA_NOPEER,
        vars: &[("FAKECUDA_DEVICES", "2")],
        models: "two devices without a peer link (cuDeviceCanAccessPeer says no)",
    },
    Profile {
        name: "cuda12-no-pinned",
        driver: Driver::FAKECUDA_NOPINNED,
        vars: &[],
        models: "host memory cannot be page-locked (cuMemHostAlloc refuses)",
    },
    Profile {
        name: "rocm5",
        driver: Driver::FAKEHIP,
        vars: &[("FAKEHIP_VERSION", "50221153")],
        models: "ROCm 5.2 on an MI250X GCD: no virtual-memory attribute, the 5.x \
                 device-properties layout and memory types",
    },
    Profile {
        name: "rocm6",
        driver: Driver::FAKEHIP,
        vars: &[("FAKEHIP_VERSION", "60241133")],
        models: "ROCm 6.2 on an MI300X as documented",
    },
    Profile {
        name: "rocm7",
        driver: Driver::FAKEHIP,
        vars: &[ROCM7],
        models: "ROCm 7.0 on an MI300X as documented",
    },
    Profile {
        name: "rocm7-two-devices",
        driver: Driver::FAKEHIP,
        vars: &[ROCM7, ("FAKEHIP_DEVICES", "2")],
        models: "ROCm 7.0 with two MI300X: a current device per thread, peer access",
    },
    Profile {
        name: "rocm7-reservation-hold",
        driver: Driver::FAKEHIP,
        vars: &[ROCM7, ("FAKEHIP_PROFILE", "rocm7-reservation-hold")],
        models: "hipMemRelease returns no memory while a reservation it was mapped into stays \
                 reserved (ROCm/legacy-rocm-build#6021, vllm-project/vllm#37533)",
    },
    Profile {
        name: "rocm7-setaccess-prefix",
        driver: Driver::FAKEHIP,
        vars: &[
            ROCM7,
            ("FAKEHIP_PROFILE", "rocm-systems-2516-setaccess-prefix"),
        ],
        models: "hipMemSetAccess sums mappings from the reservation's first one \
                 (ROCm/rocm-systems#2516)",
    },
    Profile {
        name: "rocm7-reserve-counted",
        driver: Driver::FAKEHIP,
        vars: &[
            ROCM7,
            ("FAKEHIP_PROFILE", "rocm-systems-7128-reserve-counted"),
        ],
        models: "address reservations counted against plain allocations' free memory \
                 (ROCm/rocm-systems#7128)",
    },
    Profile {
        name: "rocm7-unmap-many",
        driver: Driver::FAKEHIP,
        vars: &[ROCM7, ("FAKEHIP_PROFILE", "rocr-285-unmap-many")],
        models: "one hipMemUnmap over several mappings leaves the reservation in use for ever \
                 (ROCm/ROCR-Runtime#285, before ROCm 7.0)",
    },
];

/// Profiles kept out of [`MATRIX`]: each models a behaviour that only a test written for it
/// can see, so running every matrix test under it would cost a process per test and prove
/// nothing more. [`profile`] finds them by name, and [`each_profile`](crate::each_profile())
/// runs a test under one when it is named (`&[*profile("...").unwrap()]`).
///
/// ```
/// let p = portalloc_fakes::profile("rocm7-descriptor-per-handle").unwrap();
/// assert!(portalloc_fakes::EXTRA.contains(p));
/// assert!(!portalloc_fakes::MATRIX.contains(p));
/// ```
pub const EXTRA: &[Profile] = &[Profile {
    name: "rocm7-descriptor-per-handle",
    driver: Driver::FAKEHIP,
    vars: &[
        ("FAKEHIP_VERSION", "71460850"),
        (
            "FAKEHIP_PROFILE",
            "rocm-systems-10604-descriptor-per-handle",
        ),
    ],
    models: "ROCm 7.14: hipMemCreate opens a file descriptor per handle, so the process's \
             RLIMIT_NOFILE bounds its handles (~1015 at ulimit -n 1024) and hipMemCreate \
             answers out of memory past it (ROCm/rocm-systems#10604)",
}];

/// The profile named `name`, if [`MATRIX`] or [`EXTRA`] has one.
///
/// ```
/// let p = portalloc_fakes::profile("cuda10-no-vmm").unwrap();
/// assert_eq!(p.driver, portalloc_fakes::Driver::FAKECUDA_OLD);
/// ```
pub fn profile(name: &str) -> Option<&'static Profile> {
    MATRIX.iter().chain(EXTRA).find(|p| p.name == name)
}

/// The variable [`each_profile`](crate::each_profile()) sets in the processes it starts: the
/// profile's name.
pub const PROFILE_VARIABLE: &str = "PORTALLOC_FAKES_PROFILE";

/// The variables a profile's environment sets besides its own `vars`.
/// What every profile sets or clears: the variables it sets itself, and every variable the
/// drivers read to pick a personality (docs/fakes.md), so that one exported in a shell does
/// not change a profile it was not meant for.
const SET_BY_EVERY_PROFILE: [&str; 15] = [
    "PORTALLOC_CUDA_LIBRARY",
    "PORTALLOC_HIP_LIBRARY",
    "PORTALLOC_BACKEND",
    PROFILE_VARIABLE,
    DIR_VARIABLE,
    "FAKECUDA_DEVICES",
    "FAKECUDA_CAPACITY",
    "FAKECUDA_GRANULARITY",
    "FAKECUDA_VERSION",
    "FAKECUDA_DEVICE",
    "FAKEHIP_DEVICES",
    "FAKEHIP_CAPACITY",
    "FAKEHIP_VERSION",
    "FAKEHIP_PROFILE",
    "FAKEHIP_DEVICE",
];

impl Profile {
    /// The path the vendor's library variable is set to, and the library
    /// [`Controls`](crate::Controls) opens: [`Driver::path`].
    pub fn library(&self) -> PathBuf {
        self.driver.path()
    }

    /// The variables any profile of [`MATRIX`] or [`EXTRA`] sets, and every one the drivers read to pick a
    /// personality: [`Profile::apply`] removes them all before it sets its own, so that nothing
    /// another profile set (in an earlier process, or exported by a shell) leaks into this
    /// one. (`FAKE_GUARD_HOST` and `FAKE_SHARED_DEVICE`, switches of the kit rather than
    /// personalities, are kept: a profile applied to a child of a test on a
    /// [`SharedDevice`](crate::SharedDevice) leaves it on that device.)
    ///
    /// ```
    /// assert!(!portalloc_fakes::Profile::variables().contains(&"FAKE_SHARED_DEVICE"));
    /// ```
    ///
    /// ```
    /// let cleared = portalloc_fakes::Profile::variables();
    /// assert!(cleared.contains(&"FAKEHIP_PROFILE"));
    /// assert!(cleared.contains(&"PORTALLOC_HIP_LIBRARY"));
    /// ```
    pub fn variables() -> Vec<&'static str> {
        let mut names: Vec<&'static str> = SET_BY_EVERY_PROFILE.to_vec();
        for p in MATRIX.iter().chain(EXTRA) {
            for (k, _) in p.vars {
                if !names.contains(k) {
                    names.push(k);
                }
            }
        }
        names
    }

    /// The environment that runs code under this profile:
    ///
    /// * the vendor's library variable ([`Vendor::library_variable`]) set to
    ///   [`Profile::library`], and `PORTALLOC_BACKEND` to the vendor (so that discovery does
    ///   not pick a real driver the machine may also have);
    /// * `LD_LIBRARY_PATH` with the driver's [`Driver::soname_dir`] first (and no other
    ///   driver's), so code that loads `libcuda.so.1` / `libamdhip64.so` by name gets the
    ///   same library;
    /// * [`DIR_VARIABLE`] set to [`Driver::dir`], so a process of another language (the
    ///   Python side) uses this very copy of the drivers;
    /// * the profile's own variables, and its name in [`PROFILE_VARIABLE`].
    ///
    /// ```
    /// let p = portalloc_fakes::profile("rocm5").unwrap();
    /// let env = p.env();
    /// let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    /// assert!(get("PORTALLOC_HIP_LIBRARY").is_some());
    /// assert_eq!(get("PORTALLOC_BACKEND").unwrap(), "hip");
    /// assert_eq!(get("FAKEHIP_VERSION").unwrap(), "50221153");
    /// assert_eq!(get("PORTALLOC_FAKES_PROFILE").unwrap(), "rocm5");
    /// assert!(get("LD_LIBRARY_PATH").unwrap().to_string_lossy().contains("sonames/fakehip"));
    /// ```
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        let vendor = self.driver.vendor;
        let mut env = vec![
            (
                OsString::from(vendor.library_variable()),
                self.library().into_os_string(),
            ),
            (
                OsString::from("PORTALLOC_BACKEND"),
                OsString::from(vendor.name()),
            ),
            (
                OsString::from("LD_LIBRARY_PATH"),
                self.loader_path(std::env::var_os("LD_LIBRARY_PATH").as_deref()),
            ),
            (OsString::from(DIR_VARIABLE), Driver::dir().into_os_string()),
        ];
        env.extend(
            self.vars
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        env.push((OsString::from(PROFILE_VARIABLE), OsString::from(self.name)));
        env
    }

    /// `inherited` with this driver's soname folder first, and every driver's soname folder
    /// that was there taken out.
    fn loader_path(&self, inherited: Option<&OsStr>) -> OsString {
        let mut parts = vec![self.driver.soname_dir()];
        if let Some(inherited) = inherited {
            parts.extend(std::env::split_paths(inherited).filter(|p| {
                !p.as_os_str().is_empty()
                    && !Driver::ALL
                        .iter()
                        .any(|d| p.ends_with(Path::new("sonames").join(d.name)))
            }));
        }
        std::env::join_paths(parts).unwrap_or_else(|_| self.driver.soname_dir().into_os_string())
    }

    /// `command` with this profile's environment ([`Profile::env`]), after removing every
    /// variable another profile may have set ([`Profile::variables`]): for a process of
    /// one's own (a Python interpreter, a CLI).
    ///
    /// ```
    /// use std::process::Command;
    ///
    /// let p = portalloc_fakes::profile("rocm7-unmap-many").unwrap();
    /// let mut shell = Command::new("sh");
    /// shell.args(["-c", "echo $PORTALLOC_FAKES_PROFILE $FAKEHIP_PROFILE"]);
    /// let out = p.apply(&mut shell).output().unwrap();
    /// assert_eq!(String::from_utf8_lossy(&out.stdout), "rocm7-unmap-many rocr-285-unmap-many\n");
    ///
    /// // Another profile's variable does not leak into this one.
    /// let rocm7 = portalloc_fakes::profile("rocm7").unwrap();
    /// let mut shell = Command::new("sh");
    /// shell.args(["-c", "echo \"[$FAKEHIP_PROFILE]\""]).env("FAKEHIP_PROFILE", "rocr-285-unmap-many");
    /// let out = rocm7.apply(&mut shell).output().unwrap();
    /// assert_eq!(String::from_utf8_lossy(&out.stdout), "[]\n");
    /// ```
    pub fn apply<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        for name in Profile::variables() {
            command.env_remove(name);
        }
        command.envs(self.env())
    }

    /// The profile this process runs under ([`PROFILE_VARIABLE`]), if any.
    ///
    /// ```
    /// // A process that no profile started (this doctest) runs under none; in one that
    /// // `Profile::apply` or `each_profile` started, this is that profile.
    /// match portalloc_fakes::Profile::current() {
    ///     Some(p) => println!("under {}: {}", p.name, p.models),
    ///     None => println!("under no profile"),
    /// }
    /// ```
    ///
    /// # Panics
    /// When the variable names no profile of [`MATRIX`] or [`EXTRA`] (the names are in the
    /// message).
    #[track_caller]
    pub fn current() -> Option<&'static Profile> {
        let name = std::env::var(PROFILE_VARIABLE).ok()?;
        Some(profile(&name).unwrap_or_else(|| {
            panic!(
                "{PROFILE_VARIABLE}={:.64}: no such profile; there are {}",
                name,
                names()
            )
        }))
    }
}

/// The profiles' names, comma-separated, for messages: [`MATRIX`]'s, then [`EXTRA`]'s.
pub(crate) fn names() -> String {
    MATRIX
        .iter()
        .chain(EXTRA)
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}
