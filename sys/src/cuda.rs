//! NVIDIA driver API (`cuda.h`): the types, constants and function signatures portalloc uses.
//!
//! Written from `cuda.h` (CUDA 12.2, the API of driver 535) and checked against it: every
//! struct's size and field offsets are asserted at compile time below and again by
//! `tests/cuda.rs`; enum values are the header's. Where `cuda.h` `#define`s a name to a
//! versioned symbol (`cuMemAlloc` → `cuMemAlloc_v2`, `cuStreamDestroy` → `cuStreamDestroy_v2`,
//! `cuDevicePrimaryCtxRelease` → `cuDevicePrimaryCtxRelease_v2`, …) the signature type here is
//! named after the symbol the library exports, which is the one to resolve.
//!
//! | group | since | symbols |
//! |---|---|---|
//! | init, devices, errors | CUDA 3.2 – 6.0 | `cuInit`, `cuDriverGetVersion`, `cuDeviceGet*`, `cuDeviceTotalMem_v2`, `cuGetErrorName/String` |
//! | contexts | CUDA 7.0 (`_v2` release: 11.0) | `cuDevicePrimaryCtxRetain/Release_v2`, `cuCtxGet/SetCurrent` |
//! | memory, streams, events | CUDA 3.2 – 4.0 | `cuMemGetInfo_v2`, `cuMemAlloc_v2`, `cuMemFree_v2`, `cuStream*`, `cuEvent*` |
//! | copies, pinned host memory | CUDA 2.2 – 6.5 | `cuMemcpyDtoHAsync_v2`, `cuMemcpyHtoDAsync_v2`, `cuMemHostAlloc`, `cuMemFreeHost`, `cuMemHostRegister_v2`, `cuMemHostUnregister` |
//! | virtual memory | CUDA 10.2 | `cuMemGetAllocationGranularity`, `cuMemCreate`, `cuMemRelease`, `cuMemAddressReserve/Free`, `cuMemMap/Unmap`, `cuMemSetAccess` |
//! | memory pools | CUDA 11.2 | `cuDeviceGetDefaultMemPool`, `cuMemPool*`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync` |
//! | stream capture | CUDA 10.1 | `cuStreamGetCaptureInfo`, `cuThreadExchangeStreamCaptureMode` |

#![allow(non_snake_case)] // field names are the header's, so they can be checked against it

use core::ffi::{c_char, c_int, c_uchar, c_uint, c_ulonglong, c_ushort, c_void};

/// `CUresult` (`enum cudaError_enum`): 0 is success.
pub type CUresult = c_int;
/// `CUdevice`: a device ordinal.
pub type CUdevice = c_int;
/// `CUdeviceptr` (`unsigned long long` since CUDA 3.2, the `_v2` API).
pub type CUdeviceptr = u64;
/// `CUmemGenericAllocationHandle` (`unsigned long long`).
pub type CUmemGenericAllocationHandle = c_ulonglong;
/// `cuuint64_t`, as the pool attributes take it.
pub type cuuint64_t = u64;

opaque! {
    /// Opaque `struct CUctx_st`.
    CUctx_st;
    /// Opaque `struct CUstream_st`.
    CUstream_st;
    /// Opaque `struct CUevent_st`.
    CUevent_st;
    /// Opaque `struct CUmemPoolHandle_st`.
    CUmemPoolHandle_st;
}
/// `CUcontext`.
pub type CUcontext = *mut CUctx_st;
/// `CUstream`; null is the legacy default stream.
pub type CUstream = *mut CUstream_st;
/// `CUevent`.
pub type CUevent = *mut CUevent_st;
/// `CUmemoryPool`.
pub type CUmemoryPool = *mut CUmemPoolHandle_st;

// ---- CUresult values (enum cudaError_enum) ----

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CUresult = 0;
/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`: `cuCtxEnablePeerAccess` was called before.
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
/// `CUDA_ERROR_INVALID_VALUE`.
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`.
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
/// `CUDA_ERROR_DEINITIALIZED`.
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
/// `CUDA_ERROR_NO_DEVICE`.
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
/// `CUDA_ERROR_INVALID_DEVICE`.
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
/// `CUDA_ERROR_INVALID_HANDLE`.
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
/// `CUDA_ERROR_NOT_FOUND`.
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
/// `CUDA_ERROR_NOT_READY`: what `cuEventQuery` answers for an event still in flight.
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
/// `CUDA_ERROR_ILLEGAL_ADDRESS`.
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
/// `CUDA_ERROR_NOT_PERMITTED`.
pub const CUDA_ERROR_NOT_PERMITTED: CUresult = 800;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
/// `CUDA_ERROR_UNKNOWN`.
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: a call the stream capture under way forbids.
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: the capture was invalidated by an earlier error.
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: CUresult = 901;
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`: the call would make the legacy stream depend on a
/// capturing blocking stream.
pub const CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: CUresult = 906;
/// `CUDA_ERROR_CAPTURED_EVENT`: the event was last recorded in a capture under way.
pub const CUDA_ERROR_CAPTURED_EVENT: CUresult = 907;

// ---- Stream capture (CUDA 10.0 / 10.1) ----

/// `CUstreamCaptureStatus` (an `enum`, 4 bytes).
pub type CUstreamCaptureStatus = c_uint;
/// `CU_STREAM_CAPTURE_STATUS_NONE`: the stream is not capturing.
pub const CU_STREAM_CAPTURE_STATUS_NONE: CUstreamCaptureStatus = 0;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`: the stream is capturing.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: CUstreamCaptureStatus = 1;
/// `CU_STREAM_CAPTURE_STATUS_INVALIDATED`: capturing, but invalidated by an error.
pub const CU_STREAM_CAPTURE_STATUS_INVALIDATED: CUstreamCaptureStatus = 2;
/// `CUstreamCaptureMode` (an `enum`, 4 bytes).
pub type CUstreamCaptureMode = c_uint;
/// `CU_STREAM_CAPTURE_MODE_GLOBAL`: every thread's default.
pub const CU_STREAM_CAPTURE_MODE_GLOBAL: CUstreamCaptureMode = 0;
/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: CUstreamCaptureMode = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`: the thread may make potentially unsafe calls.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: CUstreamCaptureMode = 2;

// ---- CUdevice_attribute ----

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
/// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` (CUDA 10.2; the header's older
/// spelling is `CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED`, same value).
pub const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
/// `CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED` (CUDA 11.2).
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: c_int = 115;

// ---- Virtual memory enums ----

/// `CUmemAllocationType` (an `enum`, 4 bytes).
pub type CUmemAllocationType = c_uint;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: CUmemAllocationType = 1;
/// `CUmemAllocationHandleType` (an `enum`, 4 bytes).
pub type CUmemAllocationHandleType = c_uint;
/// `CU_MEM_HANDLE_TYPE_NONE`.
pub const CU_MEM_HANDLE_TYPE_NONE: CUmemAllocationHandleType = 0;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: the handle exports as an `int` descriptor.
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: CUmemAllocationHandleType = 0x1;

/// `CUipcMemHandle` (`struct CUipcMemHandle_st { char reserved[64]; }`), passed by value to
/// `cuIpcOpenMemHandle_v2`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUipcMemHandle {
    /// `char reserved[CU_IPC_HANDLE_SIZE]` (64).
    pub reserved: [u8; 64],
}
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: the flag `cuIpcOpenMemHandle_v2` takes.
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;
/// `CUmemLocationType` (an `enum`, 4 bytes).
pub type CUmemLocationType = c_uint;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: CUmemLocationType = 1;
/// `CUmemAccess_flags` (an `enum`, 4 bytes).
pub type CUmemAccess_flags = c_uint;
/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`.
pub const CU_MEM_ACCESS_FLAGS_PROT_NONE: CUmemAccess_flags = 0;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: CUmemAccess_flags = 3;
/// `CUmemAllocationGranularity_flags` (an `enum`, 4 bytes).
pub type CUmemAllocationGranularity_flags = c_uint;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: CUmemAllocationGranularity_flags = 0;
/// `CU_MEM_ALLOC_GRANULARITY_RECOMMENDED`.
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: CUmemAllocationGranularity_flags = 1;

// ---- Pool attributes (CUmemPool_attribute) ----

/// `CUmemPool_attribute` (an `enum`, 4 bytes).
pub type CUmemPool_attribute = c_uint;
/// `CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES` (value type `int`).
pub const CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: CUmemPool_attribute = 1;
/// `CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC` (value type `int`).
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: CUmemPool_attribute = 2;
/// `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES` (value type `int`).
pub const CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: CUmemPool_attribute = 3;
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (value type `cuuint64_t`).
pub const CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: CUmemPool_attribute = 4;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (value type `cuuint64_t`, read-only).
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: CUmemPool_attribute = 5;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` (value type `cuuint64_t`; only 0 may be set).
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: CUmemPool_attribute = 6;
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` (value type `cuuint64_t`, read-only).
pub const CU_MEMPOOL_ATTR_USED_MEM_CURRENT: CUmemPool_attribute = 7;
/// `CU_MEMPOOL_ATTR_USED_MEM_HIGH` (value type `cuuint64_t`; only 0 may be set).
pub const CU_MEMPOOL_ATTR_USED_MEM_HIGH: CUmemPool_attribute = 8;

// ---- Stream and event flags ----

/// `CU_STREAM_DEFAULT`.
pub const CU_STREAM_DEFAULT: c_uint = 0;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy default stream.
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DEFAULT`.
pub const CU_EVENT_DEFAULT: c_uint = 0;
/// `CU_EVENT_DISABLE_TIMING`: a cheaper event that records no timestamp.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;

// ---- Structs ----

/// `CUmemLocation` (`struct CUmemLocation_st`): 8 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemLocation {
    /// `CUmemLocationType type`.
    pub type_: CUmemLocationType,
    /// `int id`: the device ordinal for `CU_MEM_LOCATION_TYPE_DEVICE`.
    pub id: c_int,
}

/// The anonymous `allocFlags` struct of [`CUmemAllocationProp`]: 8 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemAllocationPropAllocFlags {
    /// `unsigned char compressionType`.
    pub compressionType: c_uchar,
    /// `unsigned char gpuDirectRDMACapable`.
    pub gpuDirectRDMACapable: c_uchar,
    /// `unsigned short usage`.
    pub usage: c_ushort,
    /// `unsigned char reserved[4]`.
    pub reserved: [c_uchar; 4],
}

/// `CUmemAllocationProp` (`struct CUmemAllocationProp_st`, `_v1`): 32 bytes on 64-bit.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUmemAllocationProp {
    /// `CUmemAllocationType type` (offset 0).
    pub type_: CUmemAllocationType,
    /// `CUmemAllocationHandleType requestedHandleTypes` (offset 4).
    pub requestedHandleTypes: CUmemAllocationHandleType,
    /// `CUmemLocation location` (offset 8).
    pub location: CUmemLocation,
    /// `void *win32HandleMetaData` (offset 16).
    pub win32HandleMetaData: *mut c_void,
    /// `allocFlags` (offset 24).
    pub allocFlags: CUmemAllocationPropAllocFlags,
}

/// `CUmemAccessDesc` (`struct CUmemAccessDesc_st`, `_v1`): 12 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CUmemAccessDesc {
    /// `CUmemLocation location` (offset 0).
    pub location: CUmemLocation,
    /// `CUmemAccess_flags flags` (offset 8).
    pub flags: CUmemAccess_flags,
}

/// `CUmemPoolProps` (`struct CUmemPoolProps_st`, `_v1`): 88 bytes on 64-bit.
///
/// CUDA 11.2 declared the tail as `unsigned char reserved[64]`; CUDA 12.2 (driver 535) carved
/// `size_t maxSize` out of it (0 = the system default), and 12.6 `unsigned short usage` out of
/// the rest. The size and every earlier offset never changed, and a zeroed tail means the same
/// to every driver, so this is the 12.2 layout.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CUmemPoolProps {
    /// `CUmemAllocationType allocType` (offset 0).
    pub allocType: CUmemAllocationType,
    /// `CUmemAllocationHandleType handleTypes` (offset 4).
    pub handleTypes: CUmemAllocationHandleType,
    /// `CUmemLocation location` (offset 8).
    pub location: CUmemLocation,
    /// `void *win32SecurityAttributes` (offset 16).
    pub win32SecurityAttributes: *mut c_void,
    /// `size_t maxSize` (offset 24; CUDA 12.2, reserved before).
    pub maxSize: usize,
    /// `unsigned char reserved[56]` (offset 32).
    pub reserved: [c_uchar; 56],
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<CUmemLocation>() == 8);
    assert!(size_of::<CUmemAllocationPropAllocFlags>() == 8);
    assert!(size_of::<CUmemAllocationProp>() == 32);
    assert!(offset_of!(CUmemAllocationProp, location) == 8);
    assert!(offset_of!(CUmemAllocationProp, win32HandleMetaData) == 16);
    assert!(offset_of!(CUmemAllocationProp, allocFlags) == 24);
    assert!(size_of::<CUmemAccessDesc>() == 12);
    assert!(size_of::<CUipcMemHandle>() == 64);
    assert!(offset_of!(CUmemAccessDesc, flags) == 8);
    assert!(size_of::<CUmemPoolProps>() == 88);
    assert!(offset_of!(CUmemPoolProps, location) == 8);
    assert!(offset_of!(CUmemPoolProps, win32SecurityAttributes) == 16);
    assert!(offset_of!(CUmemPoolProps, maxSize) == 24);
    assert!(offset_of!(CUmemPoolProps, reserved) == 32);
};

// ---- Function signatures, named after the exported symbols ----

signatures! {
    /// `CUresult cuInit(unsigned int Flags)`.
    fn cuInit(flags: c_uint) -> CUresult;
    /// `CUresult cuDriverGetVersion(int *driverVersion)`.
    fn cuDriverGetVersion(version: *mut c_int) -> CUresult;
    /// `CUresult cuDeviceGetCount(int *count)`.
    fn cuDeviceGetCount(count: *mut c_int) -> CUresult;
    /// `CUresult cuDeviceGet(CUdevice *device, int ordinal)`.
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult;
    /// `CUresult cuDeviceGetName(char *name, int len, CUdevice dev)`.
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult;
    /// `CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)`.
    fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, dev: CUdevice) -> CUresult;
    /// `CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)`.
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult;
    /// `CUresult cuGetErrorName(CUresult error, const char **pStr)`.
    fn cuGetErrorName(error: CUresult, name: *mut *const c_char) -> CUresult;
    /// `CUresult cuGetErrorString(CUresult error, const char **pStr)`.
    fn cuGetErrorString(error: CUresult, text: *mut *const c_char) -> CUresult;

    /// `CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)`.
    fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult;
    /// `CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)` (also the signature of the CUDA 7
    /// `cuDevicePrimaryCtxRelease`).
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult;
    /// `CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)`
    /// (CUDA 4.0; resolved as optional).
    fn cuDeviceCanAccessPeer(can_access_peer: *mut c_int, dev: CUdevice, peer_dev: CUdevice) -> CUresult;
    /// `CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)` (CUDA 4.0;
    /// resolved as optional). `Flags` must be 0.
    fn cuCtxEnablePeerAccess(peer_context: CUcontext, flags: c_uint) -> CUresult;
    /// `CUresult cuCtxGetCurrent(CUcontext *pctx)`.
    fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult;
    /// `CUresult cuCtxSetCurrent(CUcontext ctx)`.
    fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult;

    /// `CUresult cuMemGetInfo_v2(size_t *free, size_t *total)`.
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult;
    /// `CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)`.
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult;
    /// `CUresult cuMemFree_v2(CUdeviceptr dptr)`.
    fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult;
    /// `CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
    /// CUstream hStream)`.
    fn cuMemcpyDtoHAsync_v2(dst_host: *mut c_void, src_device: CUdeviceptr, byte_count: usize, stream: CUstream) -> CUresult;
    /// `CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t
    /// ByteCount, CUstream hStream)`.
    fn cuMemcpyHtoDAsync_v2(dst_device: CUdeviceptr, src_host: *const c_void, byte_count: usize, stream: CUstream) -> CUresult;
    /// `CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)` (CUDA 2.2;
    /// resolved as optional).
    fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> CUresult;
    /// `CUresult cuMemFreeHost(void *p)` (resolved as optional, with `cuMemHostAlloc`).
    fn cuMemFreeHost(p: *mut c_void) -> CUresult;
    /// `CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)` (CUDA 6.5
    /// as `_v2`; resolved as optional): page-locks memory the caller allocated.
    fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, flags: c_uint) -> CUresult;
    /// `CUresult cuMemHostUnregister(void *p)` (CUDA 4.0; resolved as optional, with
    /// `cuMemHostRegister_v2`).
    fn cuMemHostUnregister(p: *mut c_void) -> CUresult;

    /// `CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp
    /// *prop, CUmemAllocationGranularity_flags option)`.
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const CUmemAllocationProp, option: CUmemAllocationGranularity_flags) -> CUresult;
    /// `CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const
    /// CUmemAllocationProp *prop, unsigned long long flags)`.
    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong) -> CUresult;
    /// `CUresult cuMemRelease(CUmemGenericAllocationHandle handle)`.
    fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult;
    /// `CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr
    /// addr, unsigned long long flags)`.
    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: c_ulonglong) -> CUresult;
    /// `CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)`.
    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) -> CUresult;
    /// `CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
    /// CUmemGenericAllocationHandle handle, unsigned long long flags)`.
    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) -> CUresult;
    /// `CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)`.
    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult;
    /// `CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t
    /// count)`.
    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult;

    /// `CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)`.
    fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult;
    /// `CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)`.
    fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult;
    /// `CUresult cuMemPoolDestroy(CUmemoryPool pool)`.
    fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult;
    /// `CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)`.
    fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void) -> CUresult;
    /// `CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)`.
    fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void) -> CUresult;
    /// `CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)`.
    fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult;
    /// `CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
    /// CUstream hStream)`.
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult;
    /// `CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)`.
    fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult;

    /// `CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)`.
    fn cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> CUresult;
    /// `CUresult cuStreamDestroy_v2(CUstream hStream)`.
    fn cuStreamDestroy_v2(stream: CUstream) -> CUresult;
    /// `CUresult cuCtxSynchronize(void)`.
    fn cuCtxSynchronize() -> CUresult;
    /// `CUresult cuStreamSynchronize(CUstream hStream)`.
    fn cuStreamSynchronize(stream: CUstream) -> CUresult;
    /// `CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)`.
    fn cuEventCreate(event: *mut CUevent, flags: c_uint) -> CUresult;
    /// `CUresult cuEventRecord(CUevent hEvent, CUstream hStream)`.
    fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult;
    /// `CUresult cuEventQuery(CUevent hEvent)`: `CUDA_ERROR_NOT_READY` while in flight.
    fn cuEventQuery(event: CUevent) -> CUresult;
    /// `CUresult cuEventSynchronize(CUevent hEvent)`.
    fn cuEventSynchronize(event: CUevent) -> CUresult;
    /// `CUresult cuEventDestroy_v2(CUevent hEvent)`.
    fn cuEventDestroy_v2(event: CUevent) -> CUresult;
    /// `CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)`:
    /// work queued on the stream from now on waits for the event's last record (flags 0).
    fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) -> CUresult;

    /// `CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus
    /// *captureStatus_out, cuuint64_t *id_out)` (CUDA 10.1; the symbol CUDA 12's header maps
    /// to `_v2` is still exported with this signature; resolved as optional): whether the
    /// stream is being captured, and the capture's id.
    fn cuStreamGetCaptureInfo(stream: CUstream, status: *mut CUstreamCaptureStatus, id: *mut cuuint64_t) -> CUresult;
    /// `CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)` (CUDA 10.1;
    /// resolved as optional, with `cuStreamGetCaptureInfo`): swaps the calling thread's
    /// capture interaction mode.
    fn cuThreadExchangeStreamCaptureMode(mode: *mut CUstreamCaptureMode) -> CUresult;
    /// `CUresult cuMemExportToShareableHandle(void *shareableHandle,
    /// CUmemGenericAllocationHandle handle, CUmemAllocationHandleType handleType, unsigned long
    /// long flags)` (CUDA 10.2; resolved as optional): for a POSIX descriptor it writes an
    /// `int` the caller owns.
    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: CUmemAllocationHandleType, flags: c_ulonglong) -> CUresult;
    /// `CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void
    /// *osHandle, CUmemAllocationHandleType shHandleType)` (CUDA 10.2; resolved as optional):
    /// for a POSIX descriptor `osHandle` is the descriptor's value cast to a pointer.
    fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, handle_type: CUmemAllocationHandleType) -> CUresult;
    /// `CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)` (CUDA 4.1;
    /// resolved as optional).
    fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CUresult;
    /// `CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int
    /// Flags)` (CUDA 11.0 as `_v2`, the same signature as CUDA 4.1's `cuIpcOpenMemHandle`;
    /// resolved as optional).
    fn cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult;
    /// `CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)` (CUDA 4.1; resolved as optional).
    fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult;
    /// `CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)` (CUDA 9.2; resolved as
    /// optional): the device's 16-byte UUID, the identity `nvidia-smi` shows as `GPU-…`.
    fn cuDeviceGetUuid(uuid: *mut c_char, dev: CUdevice) -> CUresult;
}
