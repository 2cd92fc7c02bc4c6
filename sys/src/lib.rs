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

/// Declares function-pointer types named after the symbols they type: `fn name(args) -> ret;`
/// becomes `pub type name = unsafe extern "C" fn(args) -> ret;`, so a backend that resolves
/// the symbol `name` binds it with the type of the same name. One line a signature.
#[allow(unused_macros)]
macro_rules! signatures {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $($(#[$doc])* pub type $name = unsafe extern "C" fn($($arg: $ty),*) -> $ret;)*
    };
}

/// Declares opaque C structs, only ever used behind a pointer: `Name;` becomes
/// `#[repr(C)] pub struct Name { _opaque: [u8; 0] }`.
#[allow(unused_macros)]
macro_rules! opaque {
    ($($(#[$doc:meta])* $name:ident;)*) => {
        $($(#[$doc])* #[repr(C)] pub struct $name { _opaque: [u8; 0] })*
    };
}

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;
