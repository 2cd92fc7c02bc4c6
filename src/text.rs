//! How a message shows text it does not control — a value, a path, a name a file gives:
//! bounded, and escaped so that it cannot drive the terminal it is printed on.
//!
//! Shared by [`crate::error`] and the trace readers, which speak their own error and do not
//! import `crate::error` (it holds theirs): so the imports run one way.
#![deny(unsafe_code)]

/// The most characters of a value, path or name an error message shows: a real path or
/// variable value fits (a long library path is about 100), and a value of any length (an
/// environment variable, a flag, a file name) keeps the message bounded.
pub const VALUE_CHARS: usize = 256;

/// `text` cut to at most `max` characters, quoted, with control characters escaped (the
/// quoting of `{:?}`), and `…` and the full length in bytes when cut: how a message shows
/// text it does not control, so that it is bounded and cannot drive a terminal.
pub fn quoted_excerpt(text: &str, max: usize) -> String {
    let mut out: String = text.chars().take(max).collect();
    if out.len() < text.len() {
        out.push('…');
        return format!("{out:?} ({} bytes)", text.len());
    }
    format!("{out:?}")
}

/// `text` as a table or header shows it, unquoted: at most `max_chars` characters, the last
/// of them `…` when cut, and control characters escaped as Rust escapes them (`\u{1b}`), so
/// that a name a file gives is bounded and cannot drive the terminal it is printed on.
///
/// # Time complexity
/// O(`max_chars`), whatever the length of `text`.
pub fn cut_escaped(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    for n in 0..max_chars {
        let Some(c) = chars.next() else { break };
        if n + 1 == max_chars && chars.clone().next().is_some() {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A value (or path) as a message shows it: [`quoted_excerpt`] to [`VALUE_CHARS`].
pub fn shown(text: &str) -> String {
    quoted_excerpt(text, VALUE_CHARS)
}

/// A path as a message shows it: lossy UTF-8, then [`shown`].
pub fn shown_path(path: &std::path::Path) -> String {
    shown(&path.to_string_lossy())
}

/// A name (a variable, a flag, a library path) as a message shows it: unquoted when it is
/// short and plain (`PORTALLOC_FRACTION`, `--capacity`, `/usr/lib/libcuda.so.1`), else as
/// [`shown`].
pub fn shown_name(name: &str) -> String {
    let plain = name.chars().count() <= VALUE_CHARS && !name.chars().any(char::is_control);
    if plain {
        name.to_string()
    } else {
        shown(name)
    }
}

#[cfg(test)]
mod tests {
    use super::cut_escaped;
    use test_case::test_case;

    #[test_case("gpu", 4, "gpu" ; "shorter than the limit is whole")]
    #[test_case("abcd", 4, "abcd" ; "exactly the limit is whole")]
    #[test_case("abcde", 4, "abc…" ; "longer is cut with the ellipsis as the last character")]
    #[test_case("a\u{1b}[31mb", 16, "a\\u{1b}[31mb" ; "an escape sequence is escaped")]
    #[test_case("", 4, "" ; "empty")]
    fn cut_escaped_bounds_and_escapes(text: &str, max: usize, want: &str) {
        assert_eq!(cut_escaped(text, max), want);
    }
}
