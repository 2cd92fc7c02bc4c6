//! AMD HIP runtime API (`hip/hip_runtime_api.h`, HIP 5.2.3): the calls portalloc's discovery
//! makes. Attribute numbers are HIP's own, not CUDA's.

use core::ffi::{c_char, c_int};

/// `hipError_t`: 0 is success.
pub type hipError_t = c_int;
/// `hipDevice_t`: a device ordinal.
pub type hipDevice_t = c_int;

/// `hipSuccess`.
pub const hipSuccess: hipError_t = 0;
/// `hipErrorOutOfMemory`.
pub const hipErrorOutOfMemory: hipError_t = 2;
/// `hipErrorNotInitialized`.
pub const hipErrorNotInitialized: hipError_t = 3;
/// `hipErrorNoDevice`.
pub const hipErrorNoDevice: hipError_t = 100;
/// `hipErrorNotSupported`.
pub const hipErrorNotSupported: hipError_t = 801;

/// `hipError_t hipInit(unsigned int flags)`.
pub type hipInit = unsafe extern "C" fn(flags: core::ffi::c_uint) -> hipError_t;
/// `hipError_t hipDriverGetVersion(int *driverVersion)`.
pub type hipDriverGetVersion = unsafe extern "C" fn(version: *mut c_int) -> hipError_t;
/// `hipError_t hipRuntimeGetVersion(int *runtimeVersion)`.
pub type hipRuntimeGetVersion = unsafe extern "C" fn(version: *mut c_int) -> hipError_t;
/// `hipError_t hipGetDeviceCount(int *count)`.
pub type hipGetDeviceCount = unsafe extern "C" fn(count: *mut c_int) -> hipError_t;
/// `hipError_t hipDeviceGetName(char *name, int len, hipDevice_t device)`.
pub type hipDeviceGetName =
    unsafe extern "C" fn(name: *mut c_char, len: c_int, device: hipDevice_t) -> hipError_t;
/// `hipError_t hipDeviceTotalMem(size_t *bytes, hipDevice_t device)`.
pub type hipDeviceTotalMem =
    unsafe extern "C" fn(bytes: *mut usize, device: hipDevice_t) -> hipError_t;
/// `const char *hipGetErrorName(hipError_t hip_error)`.
pub type hipGetErrorName = unsafe extern "C" fn(error: hipError_t) -> *const c_char;
/// `const char *hipGetErrorString(hipError_t hipError)`.
pub type hipGetErrorString = unsafe extern "C" fn(error: hipError_t) -> *const c_char;
