//! The CUDA backend: NVIDIA's driver API (`libcuda.so.1`), loaded at run time.
//!
//! What is here now is the discovery layer: load the library, resolve the calls discovery
//! needs, and report the driver version, the devices, or the driver's own error name. The
//! [`crate::Device`] implementation over cuMemAlloc / VMM / pools builds on [`Driver`].

use std::ffi::c_int;

use libloading::Library;
use portalloc_sys::cuda as sys;

use super::loader;
use super::Probe;
use crate::device::Vendor;
use crate::error::{Error, Result};

/// The variable that names the CUDA driver library to load instead of the default.
pub const LIBRARY_VARIABLE: &str = "PORTALLOC_CUDA_LIBRARY";

/// Where to look for the driver library, in order: `PORTALLOC_CUDA_LIBRARY` alone if set,
/// else `libcuda.so.1` (never the bare `libcuda.so`, which can be the toolkit's link-time
/// stub that fails every call) or `nvcuda.dll`.
pub fn library_candidates() -> Vec<String> {
    match std::env::var(LIBRARY_VARIABLE) {
        Ok(path) if !path.is_empty() => vec![path],
        _ if cfg!(windows) => vec!["nvcuda.dll".into()],
        _ => vec!["libcuda.so.1".into()],
    }
}

/// The loaded driver library with the entry points discovery uses (checked calls: every
/// `CUresult` becomes a [`Result`]).
pub struct Driver {
    path: String,
    init: sys::cuInit,
    driver_get_version: sys::cuDriverGetVersion,
    device_get_count: sys::cuDeviceGetCount,
    device_get: sys::cuDeviceGet,
    device_get_name: sys::cuDeviceGetName,
    device_get_attribute: sys::cuDeviceGetAttribute,
    device_total_mem: sys::cuDeviceTotalMem_v2,
    get_error_name: sys::cuGetErrorName,
    get_error_string: sys::cuGetErrorString,
    // Keeps the code behind the function pointers above loaded; dropped last.
    _library: Library,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("cuda::Driver")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Loads the first library of `candidates` that opens and resolves the required symbols.
    ///
    /// # Errors
    /// [`Error::LibraryLoad`] when none opens (with each candidate's reason);
    /// [`Error::MissingSymbol`] when a required call is missing (too old a driver).
    pub fn load(candidates: &[String]) -> Result<Driver> {
        let (library, path) =
            loader::open_first(candidates).map_err(|failures| Error::LibraryLoad {
                library: candidates.join(", "),
                reason: failures.join("; "),
            })?;
        // SAFETY (all `required` calls): each type is the signature `cuda.h` declares for the
        // symbol of that name, transcribed in `portalloc_sys::cuda`.
        unsafe {
            Ok(Driver {
                init: loader::required(&library, &path, "cuInit")?,
                driver_get_version: loader::required(&library, &path, "cuDriverGetVersion")?,
                device_get_count: loader::required(&library, &path, "cuDeviceGetCount")?,
                device_get: loader::required(&library, &path, "cuDeviceGet")?,
                device_get_name: loader::required(&library, &path, "cuDeviceGetName")?,
                device_get_attribute: loader::required(&library, &path, "cuDeviceGetAttribute")?,
                device_total_mem: loader::required(&library, &path, "cuDeviceTotalMem_v2")?,
                get_error_name: loader::required(&library, &path, "cuGetErrorName")?,
                get_error_string: loader::required(&library, &path, "cuGetErrorString")?,
                _library: library,
                path,
            })
        }
    }

    /// The path the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The driver's name and text for a `CUresult` (`CUDA_ERROR_NO_DEVICE`, "no CUDA-capable
    /// device is detected"); `CUDA_ERROR_<code>` when the driver does not know it.
    pub fn error_name(&self, code: sys::CUresult) -> (String, String) {
        let mut name: *const std::ffi::c_char = std::ptr::null();
        let mut text: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: both calls write a pointer to a static NUL-terminated string owned by the
        // driver, or leave it null for an unknown code.
        let (rn, rt) = unsafe {
            (
                (self.get_error_name)(code, &mut name),
                (self.get_error_string)(code, &mut text),
            )
        };
        // SAFETY: non-null results point to static C strings (see above).
        let read = |ok: bool, p: *const std::ffi::c_char| {
            (ok && !p.is_null()).then(|| {
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            })
        };
        (
            read(rn == sys::CUDA_SUCCESS, name).unwrap_or_else(|| format!("CUDA_ERROR_{code}")),
            read(rt == sys::CUDA_SUCCESS, text).unwrap_or_else(|| "unknown error".into()),
        )
    }

    fn check(&self, call: &'static str, code: sys::CUresult) -> Result<()> {
        if code == sys::CUDA_SUCCESS {
            return Ok(());
        }
        let (name, message) = self.error_name(code);
        Err(Error::Driver {
            backend: "cuda",
            call,
            code: code.into(),
            name,
            message,
        })
    }

    /// `cuInit(0)`.
    pub fn init(&self) -> Result<()> {
        // SAFETY: cuInit takes flags by value and must be 0.
        self.check("cuInit", unsafe { (self.init)(0) })
    }

    /// `cuDriverGetVersion`, as (major, minor): 12020 → (12, 2).
    pub fn driver_version(&self) -> Result<(i32, i32)> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDriverGetVersion", unsafe {
            (self.driver_get_version)(&mut v)
        })?;
        Ok((v / 1000, (v % 1000) / 10))
    }

    /// `cuDeviceGetCount` (after [`Driver::init`]).
    pub fn device_count(&self) -> Result<u32> {
        let mut n: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDeviceGetCount", unsafe {
            (self.device_get_count)(&mut n)
        })?;
        Ok(n.max(0) as u32)
    }

    /// The device handle for an ordinal.
    pub fn device(&self, ordinal: u32) -> Result<sys::CUdevice> {
        let mut d: sys::CUdevice = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDeviceGet", unsafe {
            (self.device_get)(&mut d, ordinal as c_int)
        })?;
        Ok(d)
    }

    /// `cuDeviceGetName`.
    pub fn device_name(&self, device: sys::CUdevice) -> Result<String> {
        let mut buf = [0u8; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL-terminated, into `buf`.
        self.check("cuDeviceGetName", unsafe {
            (self.device_get_name)(buf.as_mut_ptr().cast(), buf.len() as c_int, device)
        })?;
        Ok(loader::c_buf_to_string(&buf))
    }

    /// `cuDeviceGetAttribute`.
    pub fn device_attribute(&self, device: sys::CUdevice, attribute: c_int) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.device_get_attribute)(&mut v, attribute, device)
        })?;
        Ok(v)
    }

    /// `cuDeviceTotalMem_v2`.
    pub fn total_mem(&self, device: sys::CUdevice) -> Result<u64> {
        let mut bytes: usize = 0;
        // SAFETY: writes one size_t through a valid pointer.
        self.check("cuDeviceTotalMem_v2", unsafe {
            (self.device_total_mem)(&mut bytes, device)
        })?;
        Ok(bytes as u64)
    }
}

/// Probes the CUDA backend: load, `cuInit`, versions, devices. Never fails: what went wrong
/// is in [`Probe::error`] / [`Probe::load_failures`].
pub fn probe() -> Probe {
    probe_with(&library_candidates())
}

/// [`probe`] over explicit library candidates.
pub fn probe_with(candidates: &[String]) -> Probe {
    let mut probe = Probe {
        backend: Some(Vendor::Cuda),
        ..Probe::default()
    };
    let driver = match Driver::load(candidates) {
        Ok(d) => d,
        Err(Error::LibraryLoad { reason, .. }) => {
            probe.load_failures = reason.split("; ").map(String::from).collect();
            probe.error = Some(format!(
                "driver library not found ({})",
                candidates.join(", ")
            ));
            return probe;
        }
        Err(e) => {
            probe.error = Some(e.to_string());
            return probe;
        }
    };
    probe.library = Some(driver.path().to_string());
    if let Ok((major, minor)) = driver.driver_version() {
        probe.driver_version = Some(format!("{major}.{minor}"));
    }
    let found = driver.init().and_then(|()| driver.device_count());
    match found {
        Ok(count) => {
            probe.device_count = count;
            for ordinal in 0..count {
                probe
                    .devices
                    .push(describe(&driver, ordinal).unwrap_or_else(|e| e.to_string()));
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

fn describe(driver: &Driver, ordinal: u32) -> Result<String> {
    let device = driver.device(ordinal)?;
    let name = driver.device_name(device)?;
    let major =
        driver.device_attribute(device, sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor =
        driver.device_attribute(device, sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let total = driver.total_mem(device)?;
    Ok(format!(
        "{ordinal}: {name} (sm_{major}{minor}, {})",
        crate::units::Bytes(total)
    ))
}
