//! The C ABI as a C caller uses it, for tests that drive vmm through it on the host backend.

use std::ffi::{c_void, CStr};
use std::ptr;

use portalloc::capi::*;

/// The calling thread's last error message.
pub fn last_error() -> String {
    // SAFETY: `portalloc_last_error` returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(portalloc_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A vmm allocator on a host device of `capacity` bytes of real memory, at memory fraction
/// `fraction`, not preallocated, the environment ignored.
///
/// # Panics
/// When it cannot be made (the message is the library's).
pub fn vmm_on_host(capacity: u64, fraction: f64) -> *mut PortallocAllocator {
    let mut o = std::mem::MaybeUninit::<PortallocOptions>::uninit();
    let size = std::mem::size_of::<PortallocOptions>();
    // SAFETY: valid for `size` bytes.
    let st = unsafe { portalloc_options_init(o.as_mut_ptr(), size) };
    assert_eq!(st, PortallocStatus::Ok);
    // SAFETY: initialised above.
    let mut o = unsafe { o.assume_init() };
    o.ignore_env = 1;
    o.strategy = c"vmm".as_ptr();
    o.backend = c"host".as_ptr();
    o.host_capacity = capacity;
    o.host_simulated = 0;
    o.mem_fraction = fraction;
    o.preallocate = 0;
    let mut a = ptr::null_mut();
    // SAFETY: valid options and output.
    let st = unsafe { portalloc_create_sized(&o, size, &mut a) };
    assert_eq!(st, PortallocStatus::Ok, "{}", last_error());
    a
}

/// `portalloc_allocate` of `size` bytes on the default stream, tagged `tag`: `(handle,
/// pointer)`, or the status and the last error.
pub fn allocate(
    a: *mut PortallocAllocator,
    size: u64,
    tag: Option<&CStr>,
) -> Result<(u64, u64), String> {
    let (mut h, mut p) = (0u64, ptr::null_mut::<c_void>());
    let t = tag.map_or(ptr::null(), CStr::as_ptr);
    // SAFETY: `a` is a live allocator, the tag NUL-terminated or null, the outputs valid.
    let st = unsafe { portalloc_allocate(a, size, 0, 0, t, &mut h, &mut p) };
    if st == PortallocStatus::Ok {
        Ok((h, p as u64))
    } else {
        Err(format!("{st:?}: {}", last_error()))
    }
}
