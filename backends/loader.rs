//! Finding and loading vendor libraries (libloading): every failure is a value, never a panic.

use libloading::Library;

use crate::error::Error;

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

/// Resolves one symbol as a `T`: missing is `Err` with the loader's message.
///
/// # Safety
/// `T` must be the function-pointer type the library's header declares for `name`.
pub(crate) unsafe fn resolve<T: Copy>(
    library: &Library,
    name: &'static str,
) -> std::result::Result<T, (&'static str, String)> {
    // SAFETY: the caller guarantees `T` matches the symbol's declared type.
    match unsafe { library.get::<T>(name.as_bytes()) } {
        Ok(symbol) => Ok(*symbol),
        Err(e) => Err((name, e.to_string())),
    }
}

/// A required group's first missing symbol as [`Error::MissingSymbol`].
pub(crate) fn missing(library: &str) -> impl FnOnce((&'static str, String)) -> Error + '_ {
    move |(symbol, reason)| Error::MissingSymbol {
        library: library.to_string(),
        symbol,
        reason,
    }
}

/// True when the library exports `name` (looked up now, not assumed).
pub(crate) fn exports(library: &Library, name: &str) -> bool {
    // SAFETY: the symbol is only looked up as an untyped address, never called or read.
    unsafe { library.get::<*const std::ffi::c_void>(name.as_bytes()) }.is_ok()
}

/// Declares a group of entry points bound by name *with* their type: each `field: symbol`
/// entry declares `field: sys::symbol` (the type `portalloc_sys` declares under the symbol's
/// own name, from the vendor header) and resolves `stringify!(symbol)`, so a name and its
/// signature come from one token and cannot drift apart. `field: symbol | fallback` also
/// accepts an older name with the same signature.
///
/// It declares the struct, a public constant `NAMES` with the symbol names in order, and
/// `resolve` (every symbol or the first one missing) and `exported` (each name looked up in
/// the library now). `sys` must name the vendor's `portalloc_sys` module where it is used.
///
/// `symbol_table!(each ...)` declares a table of single optional symbols instead: each field
/// an `Option`, resolved on its own.
macro_rules! symbol_table {
    (each $(#[$doc:meta])* $table:ident, $(#[$names_doc:meta])* $names:ident {
        $($field:ident: $symbol:ident),* $(,)?
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub(crate) struct $table {
            $(pub(crate) $field: Option<sys::$symbol>,)*
        }

        $(#[$names_doc])*
        pub const $names: [&str; [$(stringify!($symbol)),*].len()] = [$(stringify!($symbol)),*];

        impl $table {
            /// Each symbol the library exports.
            fn resolve(library: &libloading::Library) -> Self {
                $table {
                    // SAFETY: the type is `sys::<symbol>`, the signature the vendor header
                    // declares for the symbol of that very name.
                    $($field: unsafe { $crate::backends::loader::resolve(library, stringify!($symbol)) }.ok(),)*
                }
            }

            /// Each symbol with whether it was resolved.
            fn exported(&self) -> Vec<(&'static str, bool)> {
                vec![$((stringify!($symbol), self.$field.is_some())),*]
            }
        }
    };
    ($(#[$doc:meta])* $table:ident, $(#[$names_doc:meta])* $names:ident {
        $($field:ident: $symbol:ident $(| $fallback:ident)?),* $(,)?
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub(crate) struct $table {
            $(pub(crate) $field: sys::$symbol,)*
        }

        $(#[$names_doc])*
        pub const $names: [&str; [$(stringify!($symbol)),*].len()] = [$(stringify!($symbol)),*];

        impl $table {
            /// Every symbol of the group, or the first one missing with the loader's message.
            fn resolve(
                library: &libloading::Library,
            ) -> std::result::Result<Self, (&'static str, String)> {
                Ok($table {
                    $($field: {
                        // SAFETY: the type is `sys::<symbol>`, the signature the vendor header
                        // declares for the symbol of that very name (a fallback name has the
                        // same signature, see its entry).
                        let found = unsafe { $crate::backends::loader::resolve(library, stringify!($symbol)) };
                        $(let found = found.or_else(|e| {
                            // SAFETY: as above; the older name has the same signature.
                            unsafe { $crate::backends::loader::resolve(library, stringify!($fallback)) }
                                .map_err(|_| e)
                        });)?
                        found?
                    },)*
                })
            }

            /// Each symbol of the group with whether the library exports it (or its fallback).
            #[allow(dead_code)] // a group outside `symbols()` (peer access) is not reported
            fn exported(library: &libloading::Library) -> Vec<(&'static str, bool)> {
                vec![$((
                    stringify!($symbol),
                    $crate::backends::loader::exports(library, stringify!($symbol))
                        $(|| $crate::backends::loader::exports(library, stringify!($fallback)))?,
                )),*]
            }
        }
    };
}
pub(crate) use symbol_table;

/// Reads a static NUL-terminated string a vendor call pointed to; `None` for none (or null).
pub(crate) fn c_str(p: Option<*const std::ffi::c_char>) -> Option<String> {
    let p = p.filter(|p| !p.is_null())?;
    // SAFETY: the vendors' error-name calls point to static NUL-terminated strings.
    Some(
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Reads a NUL-terminated name a vendor call wrote into `buf`.
pub(crate) fn c_buf_to_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
