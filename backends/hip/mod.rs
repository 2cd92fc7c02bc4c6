//! The HIP backend: AMD's runtime (`libamdhip64.so.{7,6,5}`), loaded at run time.
//!
//! What is here now is the discovery layer: find and load the library, resolve the calls
//! discovery needs, and report the versions, the devices, or HIP's own error name. The
//! [`crate::Device`] implementation builds on [`Runtime`].

use std::ffi::{c_char, c_int, CStr};

use libloading::Library;
use portalloc_sys::hip as sys;

use super::loader;
use super::Probe;
use crate::device::Vendor;
use crate::error::{Error, Result};

/// The variable that names the HIP library to load instead of searching.
pub const LIBRARY_VARIABLE: &str = "PORTALLOC_HIP_LIBRARY";

/// Library file names, newest ROCm first.
const SONAMES: [&str; 3] = ["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"];

/// Where to look, in order: `PORTALLOC_HIP_LIBRARY` alone if set; else each of
/// `libamdhip64.so.7`, `.6`, `.5` under `$ROCM_PATH/lib`, `$HIP_PATH/lib`, `/opt/rocm/lib`;
/// then the same names through the loader's search path.
pub fn library_candidates() -> Vec<String> {
    if let Ok(path) = std::env::var(LIBRARY_VARIABLE) {
        if !path.is_empty() {
            return vec![path];
        }
    }
    let mut dirs: Vec<String> = Vec::new();
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Ok(root) = std::env::var(var) {
            if !root.is_empty() {
                dirs.push(format!("{}/lib", root.trim_end_matches('/')));
            }
        }
    }
    dirs.push("/opt/rocm/lib".into());
    let mut candidates = Vec::new();
    for soname in SONAMES {
        for dir in &dirs {
            let path = format!("{dir}/{soname}");
            if std::path::Path::new(&path).exists() {
                candidates.push(path);
            }
        }
    }
    candidates.extend(SONAMES.iter().map(|s| s.to_string()));
    candidates
}

/// The loaded HIP runtime with the entry points discovery uses (checked calls).
pub struct Runtime {
    path: String,
    init: sys::hipInit,
    driver_get_version: sys::hipDriverGetVersion,
    runtime_get_version: sys::hipRuntimeGetVersion,
    get_device_count: sys::hipGetDeviceCount,
    device_get_name: sys::hipDeviceGetName,
    device_total_mem: sys::hipDeviceTotalMem,
    get_error_name: sys::hipGetErrorName,
    get_error_string: sys::hipGetErrorString,
    // Keeps the code behind the function pointers above loaded.
    _library: Library,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("hip::Runtime")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// HIP encodes versions as `major * 10_000_000 + minor * 100_000 + patch`.
pub fn decode_version(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

impl Runtime {
    /// Loads the first library of `candidates` that opens and resolves the required symbols.
    ///
    /// # Errors
    /// [`Error::LibraryLoad`] when none opens; [`Error::MissingSymbol`] when a required call
    /// is missing.
    pub fn load(candidates: &[String]) -> Result<Runtime> {
        let (library, path) =
            loader::open_first(candidates).map_err(|failures| Error::LibraryLoad {
                library: candidates.join(", "),
                reason: failures.join("; "),
            })?;
        // SAFETY (all `required` calls): each type is the signature `hip_runtime_api.h`
        // declares for the symbol of that name, transcribed in `portalloc_sys::hip`.
        unsafe {
            Ok(Runtime {
                init: loader::required(&library, &path, "hipInit")?,
                driver_get_version: loader::required(&library, &path, "hipDriverGetVersion")?,
                runtime_get_version: loader::required(&library, &path, "hipRuntimeGetVersion")?,
                get_device_count: loader::required(&library, &path, "hipGetDeviceCount")?,
                device_get_name: loader::required(&library, &path, "hipDeviceGetName")?,
                device_total_mem: loader::required(&library, &path, "hipDeviceTotalMem")?,
                get_error_name: loader::required(&library, &path, "hipGetErrorName")?,
                get_error_string: loader::required(&library, &path, "hipGetErrorString")?,
                _library: library,
                path,
            })
        }
    }

    /// The path the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// HIP's name and text for an error code (`hipErrorNoDevice`).
    pub fn error_name(&self, code: sys::hipError_t) -> (String, String) {
        let read = |p: *const c_char| {
            // SAFETY: HIP returns pointers to static NUL-terminated strings (or null).
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        };
        // SAFETY: both calls take the code by value and return a static string.
        let (name, text) = unsafe { ((self.get_error_name)(code), (self.get_error_string)(code)) };
        (
            read(name).unwrap_or_else(|| format!("hipError{code}")),
            read(text).unwrap_or_else(|| "unknown error".into()),
        )
    }

    fn check(&self, call: &'static str, code: sys::hipError_t) -> Result<()> {
        if code == sys::hipSuccess {
            return Ok(());
        }
        let (name, message) = self.error_name(code);
        Err(Error::Driver {
            backend: "hip",
            call,
            code: code.into(),
            name,
            message,
        })
    }

    /// `hipInit(0)`.
    pub fn init(&self) -> Result<()> {
        // SAFETY: flags by value, must be 0.
        self.check("hipInit", unsafe { (self.init)(0) })
    }

    /// `hipDriverGetVersion`, decoded.
    pub fn driver_version(&self) -> Result<String> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("hipDriverGetVersion", unsafe {
            (self.driver_get_version)(&mut v)
        })?;
        Ok(decode_version(v))
    }

    /// `hipRuntimeGetVersion`, decoded.
    pub fn runtime_version(&self) -> Result<String> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("hipRuntimeGetVersion", unsafe {
            (self.runtime_get_version)(&mut v)
        })?;
        Ok(decode_version(v))
    }

    /// `hipGetDeviceCount`.
    pub fn device_count(&self) -> Result<u32> {
        let mut n: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("hipGetDeviceCount", unsafe {
            (self.get_device_count)(&mut n)
        })?;
        Ok(n.max(0) as u32)
    }

    /// `hipDeviceGetName`.
    pub fn device_name(&self, ordinal: u32) -> Result<String> {
        let mut buf = [0u8; 256];
        // SAFETY: HIP writes at most `len` bytes, NUL-terminated, into `buf`.
        self.check("hipDeviceGetName", unsafe {
            (self.device_get_name)(
                buf.as_mut_ptr().cast(),
                buf.len() as c_int,
                ordinal as c_int,
            )
        })?;
        Ok(loader::c_buf_to_string(&buf))
    }

    /// `hipDeviceTotalMem`.
    pub fn total_mem(&self, ordinal: u32) -> Result<u64> {
        let mut bytes: usize = 0;
        // SAFETY: writes one size_t through a valid pointer.
        self.check("hipDeviceTotalMem", unsafe {
            (self.device_total_mem)(&mut bytes, ordinal as c_int)
        })?;
        Ok(bytes as u64)
    }
}

/// Probes the HIP backend. Never fails: what went wrong is in the [`Probe`].
pub fn probe() -> Probe {
    probe_with(&library_candidates())
}

/// [`probe`] over explicit library candidates.
pub fn probe_with(candidates: &[String]) -> Probe {
    let mut probe = Probe {
        backend: Some(Vendor::Hip),
        ..Probe::default()
    };
    let runtime = match Runtime::load(candidates) {
        Ok(r) => r,
        Err(Error::LibraryLoad { reason, .. }) => {
            probe.load_failures = reason.split("; ").map(String::from).collect();
            probe.error = Some("runtime library libamdhip64 not found".into());
            return probe;
        }
        Err(e) => {
            probe.error = Some(e.to_string());
            return probe;
        }
    };
    probe.library = Some(runtime.path().to_string());
    probe.driver_version = runtime.driver_version().ok();
    probe.runtime_version = runtime.runtime_version().ok();
    // hipGetDeviceCount initialises the runtime itself and answers hipErrorNoDevice where
    // there is none; hipInit(0) on HIP 5.2 answers the less telling hipErrorInvalidDevice.
    match runtime.device_count() {
        Ok(count) => {
            probe.device_count = count;
            for ordinal in 0..count {
                let line = runtime.device_name(ordinal).and_then(|name| {
                    Ok(format!(
                        "{ordinal}: {name} ({})",
                        crate::units::Bytes(runtime.total_mem(ordinal)?)
                    ))
                });
                probe.devices.push(line.unwrap_or_else(|e| e.to_string()));
            }
        }
        Err(Error::Driver {
            code,
            name,
            message,
            ..
        }) => {
            probe.error = Some(format!("{name} ({code}): {message}"));
        }
        Err(e) => probe.error = Some(e.to_string()),
    }
    probe
}
