//! Byte sizes: parsing (`80GiB`, `141 GB`, `2MiB`, `1024`) and display.

use std::fmt;

/// A byte count that displays in binary units (`1.5 GiB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.2} {}", UNITS[unit])
        }
    }
}

/// What [`parse_bytes`] accepts, for error messages.
pub const SIZE_ACCEPTED: &str =
    "a byte count with an optional unit: 1024, 512KiB, 2MiB, 80GiB, 141GB (K/M/G/T = KiB/MiB/GiB/TiB)";

/// Parses a size such as `80GiB`, `80 GiB`, `141GB`, `2MiB`, `512k` or `1024` (bytes);
/// `None` for anything else ([`crate::config::parse_size`] turns that into an error naming
/// the variable).
///
/// Binary suffixes (`KiB`, `MiB`, `GiB`, `TiB`, and the short `K`, `M`, `G`, `T`) are powers
/// of 1024; decimal ones (`KB`, `MB`, `GB`, `TB`) powers of 1000. Case-insensitive.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let multiplier: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    if number.is_empty() {
        return None;
    }
    if let Ok(n) = number.parse::<u64>() {
        return n.checked_mul(multiplier);
    }
    let value: f64 = number.parse().ok()?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return None;
    }
    Some(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("80GiB"), Some(80 << 30));
        assert_eq!(parse_bytes("80 gib"), Some(80 << 30));
        assert_eq!(parse_bytes("2M"), Some(2 << 20));
        assert_eq!(parse_bytes("141GB"), Some(141_000_000_000));
        assert_eq!(parse_bytes("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("GiB"), None);
        assert_eq!(parse_bytes("99999999999TiB"), None);
    }

    #[test]
    fn displays_binary_units() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(3 << 29).to_string(), "1.50 GiB");
    }
}
