//! NVIDIA driver API (`cuda.h`): the calls portalloc's discovery makes.

use core::ffi::{c_char, c_int, c_uint};

/// `CUresult`: 0 is success.
pub type CUresult = c_int;
/// `CUdevice`: a device ordinal.
pub type CUdevice = c_int;
/// `CUdeviceptr` (`unsigned long long` since CUDA 3.2, the `_v2` API).
pub type CUdeviceptr = u64;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CUresult = 0;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`.
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
/// `CUDA_ERROR_NO_DEVICE`.
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` (CUDA 10.2).
pub const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
/// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED` (CUDA 11.2).
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: c_int = 115;

/// `CUresult cuInit(unsigned int Flags)`.
pub type cuInit = unsafe extern "C" fn(flags: c_uint) -> CUresult;
/// `CUresult cuDriverGetVersion(int *driverVersion)`.
pub type cuDriverGetVersion = unsafe extern "C" fn(version: *mut c_int) -> CUresult;
/// `CUresult cuDeviceGetCount(int *count)`.
pub type cuDeviceGetCount = unsafe extern "C" fn(count: *mut c_int) -> CUresult;
/// `CUresult cuDeviceGet(CUdevice *device, int ordinal)`.
pub type cuDeviceGet = unsafe extern "C" fn(device: *mut CUdevice, ordinal: c_int) -> CUresult;
/// `CUresult cuDeviceGetName(char *name, int len, CUdevice dev)`.
pub type cuDeviceGetName =
    unsafe extern "C" fn(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
/// `CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)`.
pub type cuDeviceGetAttribute =
    unsafe extern "C" fn(value: *mut c_int, attribute: c_int, dev: CUdevice) -> CUresult;
/// `CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)`.
pub type cuDeviceTotalMem_v2 = unsafe extern "C" fn(bytes: *mut usize, dev: CUdevice) -> CUresult;
/// `CUresult cuGetErrorName(CUresult error, const char **pStr)`.
pub type cuGetErrorName =
    unsafe extern "C" fn(error: CUresult, name: *mut *const c_char) -> CUresult;
/// `CUresult cuGetErrorString(CUresult error, const char **pStr)`.
pub type cuGetErrorString =
    unsafe extern "C" fn(error: CUresult, text: *mut *const c_char) -> CUresult;
