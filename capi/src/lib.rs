//! `libportalloc.so`: portalloc's C ABI (`include/portalloc.h`) and the PyTorch/CuPy hooks.
//!
//! The functions are portalloc's own (`portalloc::capi`, feature `c-api`); this crate only
//! makes the cdylib that exports them, so that the rlib every Rust user links is not also
//! built as a shared library. `tests/capi.rs` checks with `nm` that the library exports every
//! function of the header.

// Named, not merely a dependency: an edition-2018+ crate links only the crates it uses, and
// this one uses nothing of portalloc's but its `#[no_mangle]` functions, which a cdylib
// exports from the crates it links.
extern crate portalloc;
