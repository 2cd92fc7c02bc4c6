//! The vendor's driver, loaded by name, and the calls this library makes: raw, with the C
//! signatures of `cuda.h` and `hip_runtime_api.h`. Nothing here checks anything; [`crate::Gpu`]
//! does.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// A status: `CUresult` / `hipError_t`.
pub type Status = c_int;

/// The CUDA driver calls this library makes.
#[allow(non_snake_case, missing_docs)]
pub struct Cuda {
    pub cuInit: unsafe extern "C" fn(c_uint) -> Status,
    pub cuDeviceGetCount: unsafe extern "C" fn(*mut c_int) -> Status,
    pub cuDevicePrimaryCtxRetain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> Status,
    /// The unsuffixed form, which every driver exports (`_v2` came with CUDA 11).
    pub cuDevicePrimaryCtxRelease: unsafe extern "C" fn(c_int) -> Status,
    pub cuCtxSetCurrent: unsafe extern "C" fn(*mut c_void) -> Status,
    pub cuStreamCreate: unsafe extern "C" fn(*mut u64, c_uint) -> Status,
    pub cuStreamDestroy_v2: unsafe extern "C" fn(u64) -> Status,
    pub cuStreamSynchronize: unsafe extern "C" fn(u64) -> Status,
    pub cuStreamWaitEvent: unsafe extern "C" fn(u64, u64, c_uint) -> Status,
    pub cuEventCreate: unsafe extern "C" fn(*mut u64, c_uint) -> Status,
    pub cuEventRecord: unsafe extern "C" fn(u64, u64) -> Status,
    pub cuEventSynchronize: unsafe extern "C" fn(u64) -> Status,
    pub cuEventDestroy_v2: unsafe extern "C" fn(u64) -> Status,
    pub cuMemAlloc_v2: unsafe extern "C" fn(*mut u64, usize) -> Status,
    pub cuMemFree_v2: unsafe extern "C" fn(u64) -> Status,
    pub cuMemHostAlloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> Status,
    pub cuMemFreeHost: unsafe extern "C" fn(*mut c_void) -> Status,
    pub cuMemcpyHtoDAsync_v2: unsafe extern "C" fn(u64, *const c_void, usize, u64) -> Status,
    pub cuMemcpyDtoHAsync_v2: unsafe extern "C" fn(*mut c_void, u64, usize, u64) -> Status,
    pub cuMemsetD32Async: unsafe extern "C" fn(u64, c_uint, usize, u64) -> Status,
    pub cuModuleLoadData: unsafe extern "C" fn(*mut u64, *const c_void) -> Status,
    pub cuModuleGetFunction: unsafe extern "C" fn(*mut u64, u64, *const c_char) -> Status,
    pub cuModuleUnload: unsafe extern "C" fn(u64) -> Status,
    #[allow(clippy::type_complexity)]
    pub cuLaunchKernel: unsafe extern "C" fn(
        u64,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        u64,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> Status,
}

/// The HIP runtime calls this library makes.
#[allow(non_snake_case, missing_docs)]
pub struct Hip {
    pub hipGetDeviceCount: unsafe extern "C" fn(*mut c_int) -> Status,
    pub hipSetDevice: unsafe extern "C" fn(c_int) -> Status,
    pub hipStreamCreateWithFlags: unsafe extern "C" fn(*mut u64, c_uint) -> Status,
    pub hipStreamDestroy: unsafe extern "C" fn(u64) -> Status,
    pub hipStreamSynchronize: unsafe extern "C" fn(u64) -> Status,
    pub hipStreamWaitEvent: unsafe extern "C" fn(u64, u64, c_uint) -> Status,
    pub hipEventCreateWithFlags: unsafe extern "C" fn(*mut u64, c_uint) -> Status,
    pub hipEventRecord: unsafe extern "C" fn(u64, u64) -> Status,
    pub hipEventSynchronize: unsafe extern "C" fn(u64) -> Status,
    pub hipEventDestroy: unsafe extern "C" fn(u64) -> Status,
    pub hipMalloc: unsafe extern "C" fn(*mut u64, usize) -> Status,
    pub hipFree: unsafe extern "C" fn(u64) -> Status,
    pub hipHostMalloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> Status,
    pub hipHostFree: unsafe extern "C" fn(*mut c_void) -> Status,
    pub hipMemcpyHtoDAsync: unsafe extern "C" fn(u64, *const c_void, usize, u64) -> Status,
    pub hipMemcpyDtoHAsync: unsafe extern "C" fn(*mut c_void, u64, usize, u64) -> Status,
    pub hipMemsetD32Async: unsafe extern "C" fn(u64, c_int, usize, u64) -> Status,
    pub hipModuleLoadData: unsafe extern "C" fn(*mut u64, *const c_void) -> Status,
    pub hipModuleGetFunction: unsafe extern "C" fn(*mut u64, u64, *const c_char) -> Status,
    pub hipModuleUnload: unsafe extern "C" fn(u64) -> Status,
    #[allow(clippy::type_complexity)]
    pub hipModuleLaunchKernel: unsafe extern "C" fn(
        u64,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        u64,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> Status,
}

/// Resolves each named field from `library`, or says which symbol is missing.
macro_rules! resolve {
    ($library:expr, $ty:ident { $($name:ident),* $(,)? }) => {{
        $ty {
            $(
                // SAFETY: each field has the vendor's signature for the symbol of its name;
                // the library stays loaded for as long as the table (both live in `Driver`).
                $name: *unsafe { $library.get(concat!(stringify!($name), "\0").as_bytes()) }
                    .map_err(|e| format!("{}: {e}", stringify!($name)))?,
            )*
        }
    }};
}

/// One vendor's calls.
pub enum Api {
    /// `libcuda.so.1`.
    Cuda(Cuda),
    /// `libamdhip64.so`.
    Hip(Hip),
}

/// The loaded library and its calls.
pub struct Driver {
    /// The calls, valid while `_library` is loaded.
    pub api: Api,
    _library: libloading::Library,
}

impl Driver {
    /// CUDA's driver loaded as `libcuda.so.1` (else `libcuda.so`), as cudarc loads it.
    ///
    /// # Errors
    /// What the loader says, or the first symbol missing.
    pub fn cuda() -> Result<Driver, String> {
        let library = load(&["libcuda.so.1", "libcuda.so"])?;
        let api = Api::Cuda(resolve!(
            library,
            Cuda {
                cuInit,
                cuDeviceGetCount,
                cuDevicePrimaryCtxRetain,
                cuDevicePrimaryCtxRelease,
                cuCtxSetCurrent,
                cuStreamCreate,
                cuStreamDestroy_v2,
                cuStreamSynchronize,
                cuStreamWaitEvent,
                cuEventCreate,
                cuEventRecord,
                cuEventSynchronize,
                cuEventDestroy_v2,
                cuMemAlloc_v2,
                cuMemFree_v2,
                cuMemHostAlloc,
                cuMemFreeHost,
                cuMemcpyHtoDAsync_v2,
                cuMemcpyDtoHAsync_v2,
                cuMemsetD32Async,
                cuModuleLoadData,
                cuModuleGetFunction,
                cuModuleUnload,
                cuLaunchKernel,
            }
        ));
        Ok(Driver {
            api,
            _library: library,
        })
    }

    /// HIP's runtime loaded as `libamdhip64.so`.
    ///
    /// # Errors
    /// What the loader says, or the first symbol missing.
    pub fn hip() -> Result<Driver, String> {
        let library = load(&["libamdhip64.so"])?;
        let api = Api::Hip(resolve!(
            library,
            Hip {
                hipGetDeviceCount,
                hipSetDevice,
                hipStreamCreateWithFlags,
                hipStreamDestroy,
                hipStreamSynchronize,
                hipStreamWaitEvent,
                hipEventCreateWithFlags,
                hipEventRecord,
                hipEventSynchronize,
                hipEventDestroy,
                hipMalloc,
                hipFree,
                hipHostMalloc,
                hipHostFree,
                hipMemcpyHtoDAsync,
                hipMemcpyDtoHAsync,
                hipMemsetD32Async,
                hipModuleLoadData,
                hipModuleGetFunction,
                hipModuleUnload,
                hipModuleLaunchKernel,
            }
        ));
        Ok(Driver {
            api,
            _library: library,
        })
    }
}

/// The first of `names` the loader finds (on its path: `LD_LIBRARY_PATH`, then the system's).
fn load(names: &[&str]) -> Result<libloading::Library, String> {
    let mut said = Vec::new();
    for name in names {
        // SAFETY: a vendor's driver; its initialisers are the vendor's.
        match unsafe { libloading::Library::new(name) } {
            Ok(library) => return Ok(library),
            Err(e) => said.push(format!("{name}: {e}")),
        }
    }
    Err(said.join("; "))
}
