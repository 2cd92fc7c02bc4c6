//! AMD HIP runtime API (`hip/hip_runtime_api.h`): the types, constants and function-pointer
//! signatures portalloc's hip backend resolves from `libamdhip64.so.{7,6,5}` at run time.
//!
//! # Where each declaration comes from
//!
//! * [`bindings`] (re-exported here) is **generated** by `scripts/regenerate-hip-bindings`
//!   with bindgen from AMD's headers as Debian ships them (`libamdhip64-dev`, HIP 5.2.3): the
//!   error codes, device attributes, memory-pool and virtual-memory types, and one
//!   `pub type hipX = unsafe extern "C" fn(..)` per call, so the backend can resolve each
//!   symbol by name. bindgen's compile-time layout assertions come with the structs.
//! * The declarations below are **written by hand** because HIP 5.2.3 predates them or
//!   because their layout changed after 5.2.3. Each names the header it is transcribed from;
//!   `tests/hip.rs` checks every size and offset, and the regeneration script checks the
//!   5.2.3 values against the 5.2.3 headers with a C compiler.
//!
//! | declaration | why by hand | verified against |
//! |---|---|---|
//! | [`hipMemAllocationProp`] | ROCm 6 reordered it: `type`, a handle-type union, location, win32 metadata, a 4-byte `allocFlags` struct (5.2.3 had `compressionType` first and `usage` loose) | ROCm 6.x/7.x `hip_runtime_api.h` |
//! | [`hipDeviceProp_tR0600`] | added in ROCm 6.0 (1472 bytes) | ROCm 6.x `hip_runtime_api.h`: `gcnArchName` at 1160 |
//! | [`hipDeviceProp_tR0000`] | the 5.x `hipDeviceProp_t` (792 bytes): only `gcnArchName` is read | HIP 5.2.3 header: `gcnArchName` at 396 |
//! | [`hipDeviceAttributeVirtualMemoryManagementSupported`] | added after 5.2.3 | ROCm 6.x/7.x: 89, right after `hipDeviceAttributeMemoryPoolsSupported` (88) |
//! | [`hipDeviceMallocUncached`] | added after 5.2.3 | ROCm 6.x: `0x3` |
//!
//! Attribute numbers are HIP's own, not CUDA's: `hipDeviceAttributeIntegrated` is 16,
//! `hipDeviceAttributeMemoryPoolsSupported` 88, VMM 89 (CUDA's are 18, 115 and 102).

#![allow(non_snake_case)]

use core::ffi::{c_char, c_int, c_uchar, c_ushort, c_void};

#[allow(clippy::all)]
pub mod bindings;

pub use bindings::*;

/// `hipDeviceAttributeVirtualMemoryManagementSupported` (ROCm 6+; absent from HIP 5.2.3,
/// where 89 is past the end of the CUDA-compatible attributes and answers an error).
pub const hipDeviceAttributeVirtualMemoryManagementSupported: hipDeviceAttribute_t = 89;

signatures! {
    /// `hipError_t hipDeviceCanAccessPeer(int* canAccessPeer, int deviceId, int peerDeviceId)`
    /// (`hip_runtime_api.h`; by hand because the generated bindings cover the memory calls only).
    fn hipDeviceCanAccessPeer(canAccessPeer: *mut c_int, deviceId: c_int, peerDeviceId: c_int) -> hipError_t;
    /// `hipError_t hipDeviceEnablePeerAccess(int peerDeviceId, unsigned int flags)`
    /// (`hip_runtime_api.h`; from the current device, `flags` 0).
    fn hipDeviceEnablePeerAccess(peerDeviceId: c_int, flags: core::ffi::c_uint) -> hipError_t;
    /// `hipError_t hipHostRegister(void* hostPtr, size_t sizeBytes, unsigned int flags)`
    /// (`hip_runtime_api.h`; by hand, as above): page-locks memory the caller allocated.
    fn hipHostRegister(hostPtr: *mut c_void, sizeBytes: usize, flags: core::ffi::c_uint) -> hipError_t;
    /// `hipError_t hipHostUnregister(void* hostPtr)` (`hip_runtime_api.h`; by hand, as above).
    fn hipHostUnregister(hostPtr: *mut c_void) -> hipError_t;
    /// `hipError_t hipStreamGetCaptureInfo(hipStream_t stream, hipStreamCaptureStatus*
    /// pCaptureStatus, unsigned long long* pId)` (`hip_runtime_api.h`, HIP 4.5; by hand, as
    /// above): whether the stream is being captured, and the capture's id.
    fn hipStreamGetCaptureInfo(stream: *mut c_void, pCaptureStatus: *mut hipStreamCaptureStatus, pId: *mut core::ffi::c_ulonglong) -> hipError_t;
    /// `hipError_t hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode* mode)`
    /// (`hip_runtime_api.h`, HIP 5.0; by hand, as above): swaps the calling thread's capture
    /// interaction mode.
    fn hipThreadExchangeStreamCaptureMode(mode: *mut hipStreamCaptureMode) -> hipError_t;
    /// `hipError_t hipMemExportToShareableHandle(void* shareableHandle,
    /// hipMemGenericAllocationHandle_t handle, hipMemAllocationHandleType handleType, unsigned
    /// long long flags)` (`hip_runtime_api.h`, ROCm 6+; by hand, as above).
    fn hipMemExportToShareableHandle(shareableHandle: *mut c_void, handle: hipMemGenericAllocationHandle_t, handleType: hipMemAllocationHandleType, flags: core::ffi::c_ulonglong) -> hipError_t;
    /// `hipError_t hipMemImportFromShareableHandle(hipMemGenericAllocationHandle_t* handle,
    /// void* osHandle, hipMemAllocationHandleType shHandleType)` (`hip_runtime_api.h`, ROCm 6+;
    /// by hand, as above): `osHandle` is the descriptor's value cast to a pointer, not its
    /// address (ROCm/rocm-systems PR #1564).
    fn hipMemImportFromShareableHandle(handle: *mut hipMemGenericAllocationHandle_t, osHandle: *mut c_void, shHandleType: hipMemAllocationHandleType) -> hipError_t;
    /// `hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t* handle, void* devPtr)`
    /// (`hip_runtime_api.h`; by hand, as above).
    fn hipIpcGetMemHandle(handle: *mut hipIpcMemHandle_t, devPtr: *mut c_void) -> hipError_t;
    /// `hipError_t hipIpcOpenMemHandle(void** devPtr, hipIpcMemHandle_t handle, unsigned int
    /// flags)` (`hip_runtime_api.h`; by hand, as above).
    fn hipIpcOpenMemHandle(devPtr: *mut *mut c_void, handle: hipIpcMemHandle_t, flags: core::ffi::c_uint) -> hipError_t;
    /// `hipError_t hipIpcCloseMemHandle(void* devPtr)` (`hip_runtime_api.h`; by hand, as
    /// above).
    fn hipIpcCloseMemHandle(devPtr: *mut c_void) -> hipError_t;
    /// `hipError_t hipDeviceGetUuid(hipUUID* uuid, hipDevice_t device)` (`hip_runtime_api.h`,
    /// HIP 5.2; by hand, as above): the device's 16-byte UUID (`hipUUID` is `char bytes[16]`).
    fn hipDeviceGetUuid(uuid: *mut core::ffi::c_char, device: c_int) -> hipError_t;
}

/// `hipIpcMemHandle_t` (`struct hipIpcMemHandle_st { char reserved[64]; }`,
/// `HIP_IPC_HANDLE_SIZE` 64), passed by value to `hipIpcOpenMemHandle`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct hipIpcMemHandle_t {
    /// `char reserved[HIP_IPC_HANDLE_SIZE]`.
    pub reserved: [u8; 64],
}
const _: () = assert!(core::mem::size_of::<hipIpcMemHandle_t>() == 64);

/// `hipIpcMemLazyEnablePeerAccess`: the flag `hipIpcOpenMemHandle` takes.
pub const hipIpcMemLazyEnablePeerAccess: core::ffi::c_uint = 0x1;

/// `hipStreamCaptureStatus` (an `enum`, 4 bytes; `hip_runtime_api.h`, by hand as above).
pub type hipStreamCaptureStatus = core::ffi::c_uint;
/// `hipStreamCaptureStatusNone`: the stream is not capturing.
pub const hipStreamCaptureStatusNone: hipStreamCaptureStatus = 0;
/// `hipStreamCaptureStatusActive`: the stream is capturing.
pub const hipStreamCaptureStatusActive: hipStreamCaptureStatus = 1;
/// `hipStreamCaptureStatusInvalidated`: capturing, but invalidated by an error.
pub const hipStreamCaptureStatusInvalidated: hipStreamCaptureStatus = 2;
/// `hipStreamCaptureMode` (an `enum`, 4 bytes; `hip_runtime_api.h`, by hand as above).
pub type hipStreamCaptureMode = core::ffi::c_uint;
/// `hipStreamCaptureModeGlobal`: every thread's default.
pub const hipStreamCaptureModeGlobal: hipStreamCaptureMode = 0;
/// `hipStreamCaptureModeThreadLocal`.
pub const hipStreamCaptureModeThreadLocal: hipStreamCaptureMode = 1;
/// `hipStreamCaptureModeRelaxed`: the thread may make potentially unsafe calls.
pub const hipStreamCaptureModeRelaxed: hipStreamCaptureMode = 2;

/// `hipDeviceMallocUncached`: a `hipExtMallocWithFlags` flag (ROCm 6+; absent from 5.2.3).
pub const hipDeviceMallocUncached: u32 = 0x3;

/// The handle-type union of the ROCm 6+ [`hipMemAllocationProp`]: both members name the
/// same `hipMemAllocationHandleType` (CUDA spells it `requestedHandleTypes`).
#[repr(C)]
#[derive(Clone, Copy)]
pub union hipMemAllocationProp_handleType {
    /// `requestedHandleType`.
    pub requestedHandleType: hipMemAllocationHandleType,
    /// `requestedHandleTypes` (the same field under CUDA's name).
    pub requestedHandleTypes: hipMemAllocationHandleType,
}

impl core::fmt::Debug for hipMemAllocationProp_handleType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // SAFETY: both members are the same 4-byte integer type, so either reading is valid.
        let value = unsafe { self.requestedHandleType };
        f.debug_tuple("requestedHandleType").field(&value).finish()
    }
}

/// The 4-byte `allocFlags` struct of the ROCm 6+ [`hipMemAllocationProp`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct hipMemAllocationProp_allocFlags {
    /// `compressionType` (0: none).
    pub compressionType: c_uchar,
    /// `gpuDirectRDMACapable`.
    pub gpuDirectRDMACapable: c_uchar,
    /// `usage`.
    pub usage: c_ushort,
}

/// `hipMemAllocationProp` as ROCm 6 and 7 declare it (32 bytes): what `hipMemCreate` and
/// `hipMemGetAllocationGranularity` read on the runtimes where portalloc enables virtual
/// memory (ROCm ≥ 7).
///
/// ```c
/// typedef struct hipMemAllocationProp {
///     hipMemAllocationType type;
///     union { hipMemAllocationHandleType requestedHandleType;
///             hipMemAllocationHandleType requestedHandleTypes; };
///     hipMemLocation location;
///     void* win32HandleMetaData;
///     struct { unsigned char compressionType; unsigned char gpuDirectRDMACapable;
///              unsigned short usage; } allocFlags;
/// } hipMemAllocationProp;
/// ```
///
/// HIP 5.2.3 declared a different order (`compressionType` first, `usage` loose, same
/// 32 bytes); portalloc never calls the virtual-memory API on 5.x, so that layout is not bound.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct hipMemAllocationProp {
    /// `type` (`hipMemAllocationTypePinned` for device memory).
    pub type_: hipMemAllocationType,
    /// The requested handle type (`hipMemHandleTypeNone`: no export).
    pub handleType: hipMemAllocationProp_handleType,
    /// Where the memory lives.
    pub location: hipMemLocation,
    /// Windows only; null elsewhere.
    pub win32HandleMetaData: *mut c_void,
    /// Compression, RDMA and usage flags.
    pub allocFlags: hipMemAllocationProp_allocFlags,
}

/// A device-properties struct as an opaque view: `BEFORE` bytes portalloc does not read,
/// `char gcnArchName[256]` (the architecture with its target features, e.g.
/// `gfx942:sramecc+:xnack-`), `AFTER` bytes it does not read. portalloc reads only the name,
/// never capabilities, whose fields moved between releases.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct DeviceProperties<const BEFORE: usize, const AFTER: usize> {
    /// Fields portalloc does not read.
    pub _before: [u8; BEFORE],
    /// `char gcnArchName[256]`.
    pub gcnArchName: [c_char; 256],
    /// Fields portalloc does not read.
    pub _after: [u8; AFTER],
}

/// The properties struct of `hipGetDevicePropertiesR0600` (ROCm 6+, 1472 bytes, 8-aligned):
/// `name` … `hipReserved` before the name, `maxSharedMemoryPerMultiProcessor` …
/// `asicRevision` after it.
pub type hipDeviceProp_tR0600 = DeviceProperties<1160, 56>;

/// The HIP 5.x `hipDeviceProp_t` (792 bytes, 8-aligned; ROCm 6 renamed it `R0000`):
/// `name` … `canMapHostMemory`, `gcnArch` before the name.
pub type hipDeviceProp_tR0000 = DeviceProperties<396, 140>;

/// `hipDeviceProp_t` of the HIP 5.2.3 headers, which `hipGetDeviceProperties` fills on 5.x.
pub type hipDeviceProp_t = hipDeviceProp_tR0000;

signatures! {
    /// `hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600* prop, int deviceId)`
    /// (ROCm 6+).
    fn hipGetDevicePropertiesR0600(prop: *mut hipDeviceProp_tR0600, deviceId: c_int) -> hipError_t;
}

#[allow(clippy::identity_op)]
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<hipMemAllocationProp>() == 32);
    assert!(align_of::<hipMemAllocationProp>() == 8);
    assert!(offset_of!(hipMemAllocationProp, type_) == 0);
    assert!(offset_of!(hipMemAllocationProp, handleType) == 4);
    assert!(offset_of!(hipMemAllocationProp, location) == 8);
    assert!(offset_of!(hipMemAllocationProp, win32HandleMetaData) == 16);
    assert!(offset_of!(hipMemAllocationProp, allocFlags) == 24);
    assert!(size_of::<hipMemAllocationProp_allocFlags>() == 4);
    assert!(size_of::<hipDeviceProp_tR0600>() == 1472);
    assert!(offset_of!(hipDeviceProp_tR0600, gcnArchName) == 1160);
    assert!(size_of::<hipDeviceProp_tR0000>() == 792);
    assert!(offset_of!(hipDeviceProp_tR0000, gcnArchName) == 396);
};
