//! Hostile environment values: the bytes are split on NUL into the values of every variable
//! portalloc reads (an empty piece is unset) and given to `Config::from_vars`, the builder,
//! and `config::parse_size`. Nothing may panic; errors must be `Config` or `ConfigConflict`
//! naming a variable that was set; an accepted configuration has a fraction in (0, 1].
#![no_main]

use libfuzzer_sys::fuzz_target;
use portalloc::config::{Config, VARIABLES};
use portalloc::config::parse_size;
use portalloc::Error;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let values: Vec<&str> = text.split('\0').collect();
    let lookup = |name: &str| {
        let i = VARIABLES.iter().position(|v| *v == name)?;
        values
            .get(i)
            .filter(|v| !v.is_empty())
            .map(|v| (*v).to_string())
    };
    match Config::from_vars(lookup) {
        Ok(c) => {
            let f = c.mem_fraction.value;
            assert!(f > 0.0 && f <= 1.0, "accepted fraction {f}");
            assert!((1..=64).contains(&c.host_devices.value));
            assert!(c.host_capacity.value != Some(0));
            assert!(c.async_prealloc.value.is_none_or(|v| v >= -1));
        }
        Err(Error::Config { variable, .. }) => {
            assert!(
                VARIABLES.contains(&variable.as_str()) && lookup(&variable).is_some(),
                "the error names {variable:?}, which was not set"
            );
        }
        Err(Error::ConfigConflict(_)) => {}
        Err(e) => panic!("from_vars: {e:?}"),
    }
    if let Some(first) = values.first() {
        match parse_size("FUZZ", first) {
            Ok(_) | Err(Error::Config { .. }) => {}
            Err(e) => panic!("parse_size: {e:?}"),
        }
        let fraction = first.trim().parse::<f64>().unwrap_or(f64::NAN);
        match Config::builder()
            .ignore_env()
            .mem_fraction(fraction)
            .build()
        {
            Ok(c) => assert!(c.mem_fraction.value > 0.0 && c.mem_fraction.value <= 1.0),
            Err(Error::Config { variable, .. }) => assert_eq!(variable, "mem_fraction"),
            Err(e) => panic!("builder: {e:?}"),
        }
    }
});
