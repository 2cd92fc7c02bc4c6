//! Finding and loading vendor libraries (libloading): every failure is a value, never a panic.

use libloading::Library;

use crate::error::{Error, Result};

/// Loads the first library in `candidates` that opens. Returns it with the candidate that
/// worked, or every candidate with its loader message.
pub(crate) fn open_first(
    candidates: &[String],
) -> std::result::Result<(Library, String), Vec<String>> {
    let mut failures = Vec::new();
    for candidate in candidates {
        // SAFETY: loading a vendor driver library runs its initialisers; these are the
        // vendors' own libraries (or ones the user named), loaded the way every CUDA/HIP
        // program loads them.
        match unsafe { Library::new(candidate) } {
            Ok(library) => return Ok((library, candidate.clone())),
            Err(e) => failures.push(format!("{candidate}: {e}")),
        }
    }
    Err(failures)
}

/// Resolves a required symbol: missing is [`Error::MissingSymbol`].
///
/// # Safety
/// `T` must be the function-pointer type the library's header declares for `name`.
pub(crate) unsafe fn required<T: Copy>(
    library: &Library,
    library_name: &str,
    name: &'static str,
) -> Result<T> {
    // SAFETY: the caller guarantees `T` matches the symbol's declared type.
    match unsafe { library.get::<T>(name.as_bytes()) } {
        Ok(symbol) => Ok(*symbol),
        Err(e) => Err(Error::MissingSymbol {
            library: library_name.to_string(),
            symbol: name,
            reason: e.to_string(),
        }),
    }
}

/// Resolves an optional (newer) symbol: missing is `None`.
///
/// # Safety
/// `T` must be the function-pointer type the library's header declares for `name`.
#[allow(dead_code)]
pub(crate) unsafe fn optional<T: Copy>(library: &Library, name: &str) -> Option<T> {
    // SAFETY: the caller guarantees `T` matches the symbol's declared type.
    unsafe { library.get::<T>(name.as_bytes()) }
        .ok()
        .map(|s| *s)
}

/// True when the library exports `name` (looked up now, not assumed).
#[allow(dead_code)]
pub(crate) fn exports(library: &Library, name: &str) -> bool {
    // SAFETY: the symbol is only looked up as an untyped address, never called or read.
    unsafe { library.get::<*const std::ffi::c_void>(name.as_bytes()) }.is_ok()
}

/// Reads a NUL-terminated name a vendor call wrote into `buf`.
pub(crate) fn c_buf_to_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
