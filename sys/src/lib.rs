//! Raw FFI for the vendor libraries portalloc loads at run time: types, constants and
//! function-pointer signatures, written from the vendor headers. No logic, no linking, no
//! panics: `portalloc`'s backends load the libraries with `libloading` and resolve these
//! signatures by name.
//!
//! | module | library | header |
//! |---|---|---|
//! | [`cuda`] (feature `cuda`) | `libcuda.so.1` / `nvcuda.dll` | `cuda.h` (driver API) |
//! | [`hip`] (feature `hip`) | `libamdhip64.so.{7,6,5}` | `hip/hip_runtime_api.h` |
#![no_std]
#![allow(non_camel_case_types, non_upper_case_globals)]

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;
