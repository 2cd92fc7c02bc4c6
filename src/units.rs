//! Byte sizes: parsing (`80GiB`, `141 GB`, `2MiB`, `1024`) and display.

use std::fmt;

use crate::error::{Error, Result};

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

/// Parses a size such as `80GiB`, `80 GiB`, `141GB`, `2MiB`, `512k` or `1024` (bytes).
///
/// Binary suffixes (`KiB`, `MiB`, `GiB`, `TiB`, and the short `K`, `M`, `G`, `T`) are powers
/// of 1024; decimal ones (`KB`, `MB`, `GB`, `TB`) powers of 1000. Case-insensitive.
///
/// `what` names the variable or option, for the error.
pub fn parse_size(what: &str, text: &str) -> Result<u64> {
    const ACCEPTED: &str =
        "a byte count with an optional unit: 1024, 512KiB, 2MiB, 80GiB, 141GB (K/M/G/T = KiB/MiB/GiB/TiB)";
    let err = || Error::config(what, text, ACCEPTED);
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
        _ => return Err(err()),
    };
    if number.is_empty() {
        return Err(err());
    }
    if let Ok(n) = number.parse::<u64>() {
        return n.checked_mul(multiplier).ok_or_else(err);
    }
    let value: f64 = number.parse().map_err(|_| err())?;
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_size("x", "1024").unwrap(), 1024);
        assert_eq!(parse_size("x", "80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_size("x", "80 gib").unwrap(), 80 << 30);
        assert_eq!(parse_size("x", "2M").unwrap(), 2 << 20);
        assert_eq!(parse_size("x", "141GB").unwrap(), 141_000_000_000);
        assert_eq!(parse_size("x", "1.5GiB").unwrap(), 3 << 29);
        assert!(parse_size("x", "lots").is_err());
        assert!(parse_size("x", "GiB").is_err());
        assert!(parse_size("x", "99999999999TiB").is_err());
    }

    #[test]
    fn displays_binary_units() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(3 << 29).to_string(), "1.50 GiB");
    }
}
