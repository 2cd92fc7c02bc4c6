//! Finding and loading vendor libraries (libloading): every failure is a value, never a panic.

use libloading::Library;

use crate::error::Error;

/// Loads the first library in `candidates` that opens. Returns it with the candidate that
/// worked, or [`Error::LibraryLoad`] with every candidate and its loader message.
pub(crate) fn open_first(candidates: &[String]) -> Result<(Library, String), Error> {
    let mut failures = Vec::new();
    for candidate in candidates {
        if let Some(refusal) = not_a_library_file(candidate) {
            failures.push(format!(
                "{}: {refusal}",
                crate::error::shown_name(candidate)
            ));
            continue;
        }
        // SAFETY: loading a vendor driver library runs its initialisers; these are the
        // vendors' own libraries (or ones the user named), loaded the way every CUDA/HIP
        // program loads them.
        match unsafe { Library::new(candidate) } {
            Ok(library) => return Ok((library, candidate.clone())),
            Err(e) => failures.push(format!("{}: {e}", crate::error::shown_name(candidate))),
        }
    }
    Err(Error::LibraryLoad {
        library: candidates
            .iter()
            .map(|c| crate::error::shown_name(c))
            .collect::<Vec<_>>()
            .join(", "),
        reason: failures.join("; "),
    })
}

/// Why `candidate` is not even tried: a path (it names a directory) to something that exists
/// and is not a regular file (a FIFO, whose `open` inside `dlopen` would wait for a writer
/// for ever; a device; a directory). `None` for a regular file, a path that does not exist
/// (the loader says so) and a bare name the loader looks up in its own directories.
///
/// A bare name is looked up first in the directories of `LD_LIBRARY_PATH`, as the loader
/// would: the first one that holds something of that name decides, and a FIFO there (which
/// `dlopen` would open and wait on) refuses the name, shown with the path found.
fn not_a_library_file(candidate: &str) -> Option<String> {
    let path = std::path::Path::new(candidate);
    if path.components().count() < 2 {
        return on_library_path(candidate);
    }
    let meta = std::fs::metadata(path).ok()?;
    refusal(&meta).map(|what| format!("refused without loading: {what}{HINT}"))
}

/// The end of a refusal: one clause, no `;` (the failures are joined with `; `).
const HINT: &str = ", where a vendor library is a regular file (a shared object)";

/// What `meta` is when it is not a regular file.
fn refusal(meta: &std::fs::Metadata) -> Option<&'static str> {
    if meta.is_file() {
        None
    } else if meta.is_dir() {
        Some("a directory")
    } else {
        Some("not a regular file (a FIFO, socket or device)")
    }
}

/// [`not_a_library_file`] for a bare `name`: the first entry of `LD_LIBRARY_PATH` (split on
/// `:`, an empty entry the current directory, as `ld.so` reads it) that holds `name`.
#[cfg(all(unix, not(target_os = "macos")))]
fn on_library_path(name: &str) -> Option<String> {
    let dirs = std::env::var_os("LD_LIBRARY_PATH")?;
    let dirs = dirs.to_string_lossy().into_owned();
    for dir in dirs.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let found = std::path::Path::new(dir).join(name);
        // `metadata` follows links and never blocks on a FIFO.
        let Ok(meta) = std::fs::metadata(&found) else {
            continue;
        };
        return refusal(&meta).map(|what| {
            format!(
                "refused without loading: {} (found on LD_LIBRARY_PATH) is {what}{HINT}",
                crate::error::shown_name(&found.to_string_lossy())
            )
        });
    }
    None
}

#[cfg(not(all(unix, not(target_os = "macos"))))]
fn on_library_path(_name: &str) -> Option<String> {
    None
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

/// Declares groups of entry points bound by name *with* their type: each `field: symbol`
/// entry declares `field: sys::symbol` (the type `portalloc_sys` declares under the symbol's
/// own name, from the vendor header) and resolves `stringify!(symbol)`, so a name and its
/// signature come from one token and cannot drift apart. `field: symbol | fallback` also
/// accepts an older name with the same signature.
///
/// Each group `Table, NAMES { entries }` declares the struct, a public constant `NAMES` with
/// the symbol names in order, and `resolve` (every symbol, or the first one missing: a
/// required group maps that to [`Error::MissingSymbol`] with [`missing`], an optional one
/// to `None`) and `exported` (each name looked up in the library now). A group written
/// `Table, NAMES each { entries }` holds single optional symbols instead: each field an
/// `Option`, resolved on its own. `sys` must name the vendor's `portalloc_sys` module where
/// the macro is used.
macro_rules! symbol_table {
    ($($(#[$doc:meta])* $table:ident, $names:ident $($each:ident)? {
        $($field:ident: $symbol:ident $(| $fallback:ident)?),* $(,)?
    })*) => {$(
        $crate::backends::loader::symbol_table!(@group $(#[$doc])* [$($each)?] $table, $names {
            $($field: $symbol $(| $fallback)?),*
        });
    )*};
    (@group $(#[$doc:meta])* [] $table:ident, $names:ident {
        $($field:ident: $symbol:ident $(| $fallback:ident)?),*
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub(crate) struct $table {
            $(pub(crate) $field: sys::$symbol,)*
        }

        #[doc = concat!("The names of the symbols of the `", stringify!($table), "` group, in the order they are resolved and reported.")]
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
    (@group $(#[$doc:meta])* [each] $table:ident, $names:ident {
        $($field:ident: $symbol:ident),*
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub(crate) struct $table {
            $(pub(crate) $field: Option<sys::$symbol>,)*
        }

        #[doc = concat!("The names of the single optional symbols of `", stringify!($table), "`, in the order they are reported.")]
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
}
pub(crate) use symbol_table;

/// The result layer's checking, written once for `cuda::Driver` and `hip::Runtime`: a
/// status code becomes `Ok` or [`Error::Driver`] with the vendor's own name and text.
pub(crate) trait Checked {
    /// The vendor's status code (`CUresult`, `hipError_t`).
    type Code: Copy + PartialEq + Into<i64>;
    /// The code for success.
    const SUCCESS: Self::Code;
    /// The backend's name in errors.
    const BACKEND: &'static str;

    /// The vendor's name and text for `code`.
    fn names(&self, code: Self::Code) -> (String, String);

    /// `Ok` for success, else [`Error::Driver`] with the vendor's name and text.
    fn check(&self, call: &'static str, code: Self::Code) -> Result<(), Error> {
        if code == Self::SUCCESS {
            return Ok(());
        }
        let (name, message) = self.names(code);
        Err(Error::Driver {
            backend: Self::BACKEND,
            call,
            code: code.into(),
            name,
            message,
        })
    }

    /// Runs a call that writes its answer through its one out-pointer, checked.
    fn out<T: Default>(
        &self,
        call: &'static str,
        f: impl FnOnce(&mut T) -> Self::Code,
    ) -> Result<T, Error> {
        let mut value = T::default();
        self.check(call, f(&mut value))?;
        Ok(value)
    }
}

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
