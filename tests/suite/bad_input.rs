//! Bad input sweep: every public entry point with hostile values — zero, `u64::MAX`,
//! alignments that are not powers of two, pointers from another allocator, forged and freed
//! allocations, NaN and negative fractions, unknown environment values, corrupt traces,
//! hostile virtual-memory arguments — each refused with its typed error (the variant is
//! asserted, and where it names something, the name). Nothing panics.
//!
//! The C ABI's own table is in `tests/capi.rs`; the cases it lacks are at the end of this
//! file (feature `c-api`).

use std::sync::Arc;

use crate::support::common::{simulated_host, Strategy};
use portalloc::backends::host::HostDevice;
use portalloc::config::parse_size;
use portalloc::config::{Config, ConfigBuilder, Setting};
use portalloc::device::{Device, Event, PhysicalHandle, Stream, StreamOrderedPool, VirtualMemory};
use portalloc::strategy::async_pool::{AsyncOptions, AsyncPoolAllocator};
use portalloc::{Allocation, Error, StrategyKind};
use test_case::test_case;

const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 256 * MIB;
const LIMIT: u64 = CAPACITY / 2;

/// The variant's name, so each case asserts which typed error it got.
fn variant(e: &Error) -> &'static str {
    match e {
        Error::InvalidSize { .. } => "InvalidSize",
        Error::InvalidAlignment { .. } => "InvalidAlignment",
        Error::ExceedsLimit { .. } => "ExceedsLimit",
        Error::OutOfMemory(_) => "OutOfMemory",
        Error::OutOfMemoryDiagnosed { .. } => "OutOfMemoryDiagnosed",
        Error::DeviceOutOfMemory { .. } => "DeviceOutOfMemory",
        Error::Config { .. } => "Config",
        Error::ConfigConflict(_) => "ConfigConflict",
        Error::Unsupported { .. } => "Unsupported",
        Error::ForeignAllocation { .. } => "ForeignAllocation",
        Error::UnknownPointer { .. } => "UnknownPointer",
        Error::InvalidArgument { .. } => "InvalidArgument",
        Error::LibraryLoad { .. } => "LibraryLoad",
        Error::MissingSymbol { .. } => "MissingSymbol",
        Error::Driver { .. } => "Driver",
        Error::Os { .. } => "Os",
        #[cfg(feature = "trace")]
        Error::Trace(_) => "Trace",
        Error::NoDevice(_) => "NoDevice",
        _ => "other",
    }
}

fn host() -> Arc<HostDevice> {
    simulated_host(CAPACITY)
}

// ---------------------------------------------------------------------------------------------
// Allocator::allocate and deallocate, on every strategy
// ---------------------------------------------------------------------------------------------

/// `(size, alignment)` → the variant every strategy must answer with; `None`: it must
/// succeed.
#[test_case(0, 0, None ; "zero size is an empty allocation")]
#[test_case(0, 3, Some("InvalidAlignment") ; "zero size with a bad alignment is still refused")]
#[test_case(u64::MAX, 0, Some("InvalidSize") ; "size u64 max overflows once rounded")]
#[test_case(u64::MAX - 254, 256, Some("InvalidSize") ; "size just below u64 max overflows")]
#[test_case(1024, 3, Some("InvalidAlignment") ; "alignment 3 is not a power of two")]
#[test_case(1024, 768, Some("InvalidAlignment") ; "alignment 768 is not a power of two")]
#[test_case(1024, u64::MAX, Some("InvalidAlignment") ; "alignment u64 max")]
#[test_case(1024, 1 << 63, Some("InvalidAlignment") ; "alignment 2 pow 63 is too large")]
fn allocate_refuses_hostile_sizes_and_alignments(size: u64, align: u64, want: Option<&str>) {
    for s in Strategy::ALL {
        let host = host();
        let a = s.build(Arc::clone(&host), LIMIT);
        match (a.allocate(size, align, Stream::DEFAULT, "hostile"), want) {
            (Ok(x), None) => {
                assert!(x.is_empty() || x.ptr() % 256 == 0);
                a.deallocate(x).unwrap();
            }
            (Ok(x), Some(w)) => panic!(
                "{s:?}: ({size}, {align}) served at {:#x}, wanted {w}",
                x.ptr()
            ),
            (Err(e), None) => panic!("{s:?}: ({size}, {align}) refused: {e}"),
            (Err(e), Some(w)) => assert_eq!(variant(&e), w, "{s:?}: ({size}, {align}): {e}"),
        }
        a.check_invariants().unwrap();
        assert_eq!(a.stats().bytes_in_use, 0, "{s:?}");
        drop(a);
        assert!(host.census().is_empty(), "{s:?}: {:?}", host.census());
    }
}

/// A request over the limit: an out-of-memory error with a report (platform: `ExceedsLimit`,
/// as its documentation says), never a device call that takes the memory.
#[test_case(Strategy::Bfc, "OutOfMemory")]
#[test_case(Strategy::BfcGrow, "OutOfMemory")]
#[test_case(Strategy::Platform, "ExceedsLimit")]
#[test_case(Strategy::Vmm, "OutOfMemory")]
#[test_case(Strategy::Async, "OutOfMemory")]
fn allocate_beyond_the_limit_is_a_typed_out_of_memory(s: Strategy, want: &str) {
    let host = host();
    let a = s.build(Arc::clone(&host), LIMIT);
    for size in [LIMIT + 1, CAPACITY, CAPACITY * 1024, u64::MAX >> 1] {
        let e = a.allocate(size, 0, Stream::DEFAULT, "huge").unwrap_err();
        assert_eq!(variant(&e), want, "{s:?} {size}: {e}");
        assert!(e.is_out_of_memory() || matches!(e, Error::ExceedsLimit { .. }));
    }
    a.check_invariants().unwrap();
    drop(a);
    assert!(host.census().is_empty());
}

/// What is handed back to `deallocate`.
#[derive(Debug, Clone, Copy)]
enum Handed {
    /// An allocation of another allocator (same strategy, same device).
    FromAnotherAllocator,
    /// An allocation of another allocator on another device.
    FromAnotherDevice,
    /// This allocator's id, an address it never handed out.
    Forged,
    /// This allocator's id, the address and token of an allocation already freed.
    Resurrected,
    /// This allocator's id, a live allocation's address with another token.
    WrongToken,
    /// This allocator's id, one byte into a live allocation.
    Interior,
    /// A zero-byte allocation: always accepted.
    EmptyOfOwn,
}

#[test_case(Handed::FromAnotherAllocator, Some("ForeignAllocation") ; "from another allocator")]
#[test_case(Handed::FromAnotherDevice, Some("ForeignAllocation") ; "from another device")]
#[test_case(Handed::Forged, Some("UnknownPointer") ; "forged address")]
#[test_case(Handed::Resurrected, Some("UnknownPointer") ; "freed then forged again")]
#[test_case(Handed::WrongToken, Some("UnknownPointer") ; "live address wrong token")]
#[test_case(Handed::Interior, Some("UnknownPointer") ; "interior address")]
#[test_case(Handed::EmptyOfOwn, None ; "own empty allocation")]
fn deallocate_refuses_what_it_did_not_hand_out(case: Handed, want: Option<&str>) {
    for s in Strategy::ALL {
        let host = host();
        let a = s.build(Arc::clone(&host), LIMIT);
        let other = s.build(Arc::clone(&host), LIMIT);
        let host2 = self::host();
        let far = s.build(Arc::clone(&host2), LIMIT);
        let live = a.allocate(4096, 0, Stream::DEFAULT, "live").unwrap();
        let handed = match case {
            Handed::FromAnotherAllocator => other.allocate(4096, 0, Stream::DEFAULT, "x").unwrap(),
            Handed::FromAnotherDevice => far.allocate(4096, 0, Stream::DEFAULT, "x").unwrap(),
            Handed::Forged => Allocation::new(0xdead_0000, 4096, Stream::DEFAULT, a.id(), 7),
            Handed::Resurrected => {
                let gone = a.allocate(8192, 0, Stream::DEFAULT, "gone").unwrap();
                let (ptr, size, token) = (gone.ptr(), gone.size(), gone.token());
                a.deallocate(gone).unwrap();
                Allocation::new(ptr, size, Stream::DEFAULT, a.id(), token)
            }
            Handed::WrongToken => Allocation::new(
                live.ptr(),
                live.size(),
                Stream::DEFAULT,
                a.id(),
                live.token() ^ (1 << 40),
            ),
            Handed::Interior => Allocation::new(
                live.ptr() + 1,
                live.size() - 1,
                Stream::DEFAULT,
                a.id(),
                live.token(),
            ),
            Handed::EmptyOfOwn => a.allocate(0, 0, Stream::DEFAULT, "empty").unwrap(),
        };
        let before = a.stats();
        match (a.deallocate(handed), want) {
            (Ok(()), None) => {}
            (Ok(()), Some(w)) => panic!("{s:?} {case:?}: accepted, wanted {w}"),
            (Err(e), None) => panic!("{s:?} {case:?}: refused: {e}"),
            (Err(e), Some(w)) => assert_eq!(variant(&e), w, "{s:?} {case:?}: {e}"),
        }
        // Nothing was freed by the refusal: the live allocation is intact and frees once.
        assert_eq!(
            a.stats().bytes_in_use,
            before.bytes_in_use,
            "{s:?} {case:?}"
        );
        a.check_invariants().unwrap();
        a.deallocate(live).unwrap();
        assert_eq!(a.stats().bytes_in_use, 0, "{s:?} {case:?}");
        drop((a, other, far));
        assert!(
            host.census().is_empty(),
            "{s:?} {case:?}: {:?}",
            host.census()
        );
        assert!(
            host2.census().is_empty(),
            "{s:?} {case:?}: {:?}",
            host2.census()
        );
    }
}

/// A configuration whose fraction is NaN, negative or infinite, built by hand (the fields
/// are public): the strategies still refuse with typed errors and never panic.
#[test_case(f64::NAN ; "nan")]
#[test_case(-0.5 ; "negative")]
#[test_case(f64::INFINITY ; "infinite")]
#[test_case(f64::NEG_INFINITY ; "negative infinite")]
#[test_case(0.0 ; "zero")]
fn strategies_built_from_a_hostile_config_refuse_cleanly(fraction: f64) {
    for kind in [
        StrategyKind::Bfc,
        StrategyKind::Platform,
        StrategyKind::Vmm,
        StrategyKind::Async,
    ] {
        for preallocate in [true, false] {
            let config = Config {
                strategy: Setting::builder(kind),
                mem_fraction: Setting::builder(fraction),
                preallocate: Setting::builder(preallocate),
                ..Config::default()
            };
            let host = host();
            let a = match portalloc::strategy::build(&config, host.clone()) {
                Ok(a) => a,
                Err(e) => {
                    assert_eq!(variant(&e), "Config", "{kind:?} {fraction}: {e}");
                    continue;
                }
            };
            // fraction × total as an integer: NaN and negatives give 0, +∞ gives u64::MAX.
            let served = a.allocate(MIB, 0, Stream::DEFAULT, "x");
            match served {
                Ok(x) => {
                    assert!(
                        fraction.is_infinite() && fraction > 0.0,
                        "{kind:?} {fraction}"
                    );
                    a.deallocate(x).unwrap();
                }
                Err(e) => assert!(
                    e.is_out_of_memory() || matches!(e, Error::ExceedsLimit { .. }),
                    "{kind:?} {fraction}: {e}"
                ),
            }
            a.check_invariants().unwrap();
            drop(a);
            assert!(host.census().is_empty(), "{kind:?} {fraction}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Config::from_vars and the builder
// ---------------------------------------------------------------------------------------------

#[test_case("XLA_CLIENT_MEM_FRACTION", "NaN" ; "fraction nan")]
#[test_case("XLA_CLIENT_MEM_FRACTION", "-0.5" ; "fraction negative")]
#[test_case("XLA_CLIENT_MEM_FRACTION", "0" ; "fraction zero")]
#[test_case("XLA_CLIENT_MEM_FRACTION", "1.0001" ; "fraction above one")]
#[test_case("XLA_CLIENT_MEM_FRACTION", "inf" ; "fraction infinite")]
#[test_case("XLA_CLIENT_MEM_FRACTION", "75%" ; "fraction percent")]
#[test_case("XLA_PYTHON_CLIENT_MEM_FRACTION", "-inf" ; "deprecated fraction negative infinite")]
#[test_case("PORTALLOC_MEM_FRACTION", "0x1p-1" ; "portalloc fraction hex float")]
#[test_case("PORTALLOC_MEM_FRACTION", "1e400" ; "portalloc fraction overflowing")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "best-guess" ; "xla allocator unknown")]
#[test_case("XLA_PYTHON_CLIENT_ALLOCATOR", "async" ; "xla allocator portalloc only name")]
#[test_case("PORTALLOC_ALLOCATOR", "bfc\u{0}" ; "portalloc allocator with nul")]
#[test_case("TF_GPU_ALLOCATOR", "cuda_malloc" ; "tf allocator unknown")]
#[test_case("PORTALLOC_PREALLOCATE", "maybe" ; "preallocate unknown")]
#[test_case("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "-2" ; "async prealloc below minus one")]
#[test_case("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "1e9" ; "async prealloc float")]
#[test_case("TF_CUDA_MALLOC_ASYNC_SUPPORTED_PREALLOC", "99999999999999999999" ; "async prealloc overflow")]
#[test_case("PORTALLOC_BACKEND", "opencl" ; "backend unknown")]
#[test_case("PORTALLOC_HOST_CAPACITY", "0" ; "host capacity zero")]
#[test_case("PORTALLOC_HOST_CAPACITY", "-1" ; "host capacity negative")]
#[test_case("PORTALLOC_HOST_CAPACITY", "99999999999TiB" ; "host capacity overflow")]
#[test_case("PORTALLOC_HOST_CAPACITY", "18446744073709551616" ; "host capacity u64 max plus one")]
#[test_case("PORTALLOC_HOST_SIMULATED", "perhaps" ; "host simulated unknown")]
#[test_case("PORTALLOC_HOST_DEVICES", "0" ; "host devices zero")]
#[test_case("PORTALLOC_HOST_DEVICES", "65" ; "host devices too many")]
#[test_case("PORTALLOC_HOST_DEVICES", "-1" ; "host devices negative")]
fn unknown_environment_values_name_the_variable(variable: &str, value: &str) {
    let e = Config::from_vars(|name| (name == variable).then(|| value.to_string())).unwrap_err();
    match &e {
        Error::Config {
            variable: v,
            value: got,
            accepted,
        } => {
            assert_eq!(v, variable, "{e}");
            assert_eq!(got, value, "{e}");
            assert!(!accepted.is_empty(), "{e}");
        }
        other => panic!(
            "{variable}={value:?}: wanted Config, got {}: {other}",
            variant(other)
        ),
    }
    // The builder reading the same variables refuses the same way.
    let b = Config::builder()
        .vars(|name| (name == variable).then(|| value.to_string()))
        .build()
        .unwrap_err();
    assert_eq!(variant(&b), "Config", "{b}");
}

#[test]
fn both_xla_fraction_spellings_set_is_a_conflict() {
    let e = Config::from_vars(|name| match name {
        "XLA_CLIENT_MEM_FRACTION" => Some("0.5".into()),
        "XLA_PYTHON_CLIENT_MEM_FRACTION" => Some("0.5".into()),
        _ => None,
    })
    .unwrap_err();
    assert_eq!(variant(&e), "ConfigConflict", "{e}");
}

#[test_case(f64::NAN ; "nan")]
#[test_case(-0.5 ; "negative")]
#[test_case(0.0 ; "zero")]
#[test_case(-0.0 ; "negative zero")]
#[test_case(1.0 + f64::EPSILON ; "just above one")]
#[test_case(f64::INFINITY ; "infinite")]
#[test_case(f64::MIN_POSITIVE / 2.0 ; "subnormal is accepted")]
fn builder_fraction_out_of_range_is_refused(fraction: f64) {
    let r = Config::builder()
        .ignore_env()
        .mem_fraction(fraction)
        .build();
    if fraction > 0.0 && fraction <= 1.0 {
        assert_eq!(r.unwrap().mem_fraction.value, fraction);
        return;
    }
    match r.unwrap_err() {
        Error::Config { variable, .. } => assert_eq!(variable, "mem_fraction"),
        other => panic!("{fraction}: {other}"),
    }
}

/// A setting out of range is refused, the error naming the setting.
#[test_case(|b| b.async_prealloc(i64::MIN), "async_prealloc" ; "async prealloc i64 min")]
#[test_case(|b| b.async_prealloc(-2), "async_prealloc" ; "async prealloc minus two")]
#[test_case(|b| b.host_capacity(0), "host_capacity" ; "host capacity zero")]
fn builder_setting_out_of_range_is_refused(
    set: fn(ConfigBuilder<'static>) -> ConfigBuilder<'static>,
    setting: &str,
) {
    match set(Config::builder().ignore_env()).build().unwrap_err() {
        Error::Config { variable, .. } => assert_eq!(variable, setting),
        other => panic!("{setting}: {other}"),
    }
}

#[test]
fn async_options_below_minus_one_are_refused_by_the_strategy() {
    let options = AsyncOptions {
        prealloc_bytes: Some(-5),
        ..AsyncOptions::new(LIMIT)
    };
    let e = AsyncPoolAllocator::new(host(), options).err().unwrap();
    assert_eq!(variant(&e), "Config", "{e}");
}

// ---------------------------------------------------------------------------------------------
// units::parse_size
// ---------------------------------------------------------------------------------------------

#[test_case("" ; "empty")]
#[test_case("   " ; "blank")]
#[test_case("GiB" ; "unit only")]
#[test_case("-1" ; "negative")]
#[test_case("-1GiB" ; "negative with unit")]
#[test_case("1e3" ; "exponent")]
#[test_case("NaN" ; "nan")]
#[test_case("inf" ; "infinite")]
#[test_case("." ; "dot")]
#[test_case("1.5.5" ; "two dots")]
#[test_case("12 parsecs" ; "unknown unit")]
#[test_case("18446744073709551616" ; "u64 max plus one")]
#[test_case("99999999999TiB" ; "overflow with unit")]
#[test_case("16777216.0TiB" ; "float overflow with unit")]
#[test_case("1\u{0}" ; "nul")]
#[test_case("٣" ; "non ascii digit")]
fn parse_size_refuses_hostile_text(text: &str) {
    match parse_size("PORTALLOC_TEST_SIZE", text) {
        Err(Error::Config {
            variable, value, ..
        }) => {
            assert_eq!(variable, "PORTALLOC_TEST_SIZE");
            assert_eq!(value, text);
        }
        other => panic!("{text:?}: wanted Config, got {other:?}"),
    }
}

#[test_case("0", 0 ; "zero is a size")]
#[test_case("18446744073709551615", u64::MAX ; "u64 max")]
#[test_case(" 2 MiB ", 2 * MIB ; "blanks")]
fn parse_size_accepts_the_edges(text: &str, want: u64) {
    assert_eq!(parse_size("x", text).unwrap(), want);
}

// ---------------------------------------------------------------------------------------------
// trace::open and open_reader on hostile bytes
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "trace")]
mod traces {
    use super::*;
    use portalloc::trace::{self, Format, Options, TraceErrorKind};
    use std::io::Write;
    use test_case::test_case;

    /// Drains a trace; the first error, if any.
    fn drain(t: trace::Trace) -> Option<trace::TraceError> {
        for e in t {
            if let Err(e) = e {
                return Some(e);
            }
        }
        None
    }

    const HEADER: &str = r#"{"format":"portalloc-trace","version":1,"source":"test","device":null,"baseline_bytes":0,"reference":null,"tags":[],"notes":[]}"#;

    #[test_case(b"" as &[u8], None ; "empty")]
    #[test_case(b"\0\0\0\0\0\0\0\0", None ; "zeros")]
    #[test_case(b"\xff\xfe garbage \x80\x81", None ; "binary garbage")]
    #[test_case(b"\x1f\x8b", None ; "truncated gzip magic")]
    #[test_case(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage", None ; "corrupt gzip")]
    #[test_case(b"{\"format\":\"portalloc-trace\",\"version\":99}\n", Some(Format::Portalloc) ; "future version")]
    #[test_case(b"{\"format\":\"portalloc-trace\"", Some(Format::Portalloc) ; "truncated header")]
    #[test_case(b"{\"traceEvents\": [", Some(Format::Kineto) ; "truncated kineto")]
    #[test_case(b"{\"traceEvents\": 7}", Some(Format::Kineto) ; "kineto events not a list")]
    #[test_case(b"\x80\x04\x95", Some(Format::PytorchSnapshot) ; "truncated pickle")]
    #[test_case(b"Thread,Time,Action,Pointer,Size,Stream\n1,2,allocate,0xzz,-5,0\n", Some(Format::RmmCsv) ; "rmm bad row")]
    #[test_case(b"id,lower,upper,size\n1,5,2,18446744073709551616\n", Some(Format::LifetimesCsv) ; "lifetimes overflow")]
    #[test_case(b"not,a,known,header\n1,2,3,4\n", Some(Format::LifetimesCsv) ; "csv wrong header")]
    fn hostile_trace_bytes_are_a_trace_error(bytes: &[u8], format: Option<Format>) {
        for strict in [false, true] {
            let mut options = Options::new().with_strict(strict);
            options.format = format;
            let e =
                match trace::open_reader(std::io::Cursor::new(bytes.to_vec()), "hostile", &options)
                {
                    Err(e) => e,
                    Ok(t) => drain(t).unwrap_or_else(|| {
                        panic!("{bytes:?} (strict {strict}): read without an error")
                    }),
                };
            assert_ne!(
                e.kind(),
                TraceErrorKind::Io,
                "{bytes:?} (strict {strict}): {e}"
            );
        }
    }

    /// A Kineto trace whose one event is longer than the most one JSON value may have
    /// (16 MiB, docs/trace-format.md) is refused by name, in either mode.
    #[test]
    fn a_kineto_event_past_the_limit_is_refused() {
        let mut bytes = br#"{"traceEvents": [{"name": "[memory]", "cat": ""#.to_vec();
        bytes.resize(bytes.len() + (17 << 20), b'x');
        bytes.extend_from_slice(br#""}]}"#);
        for strict in [false, true] {
            let options = Options::new().with_strict(strict);
            let e = match trace::open_reader(std::io::Cursor::new(bytes.clone()), "big", &options) {
                Err(e) => e,
                Ok(t) => drain(t).expect("an event past the limit is read"),
            };
            assert_ne!(e.kind(), TraceErrorKind::Io, "{e}");
            assert!(e.to_string().contains("longer than 16 MiB"), "{e}");
        }
    }

    /// Kineto events that are not `[memory]` ones are validated as JSON and dropped, never
    /// parsed into fields: each of these, placed between two good events, is still refused as
    /// corrupt or truncated JSON, in either mode, gzip'd or not.
    #[test_case(r#"{"name": "aten::mm", "cat": "cpu_op}"# ; "truncated string")]
    #[test_case(r#"{"name": "aten::mm\q"}"# ; "bad escape")]
    #[test_case(r#"{"name": "\ud800x"}"# ; "lone surrogate")]
    #[test_case("{\"name\": \"a\u{1}b\"}" ; "control character in a string")]
    #[test_case(r#"{"name": "aten::mm", "args": {"a": [1, 2}}"# ; "unbalanced brackets")]
    #[test_case(r#"{"name": "aten::mm", "args": {"a": 1]]"# ; "crossed brackets")]
    #[test_case(r#"{"name": "aten::mm" "ts": 1}"# ; "missing comma")]
    #[test_case(r#"{"name": "aten::mm", "ts": 01}"# ; "leading zero")]
    #[test_case(r#"{"name": "aten::mm", "ts": tru}"# ; "bad literal")]
    #[test_case(r#"{"name": "aten::mm", "args": {"a": 1,}}"# ; "trailing comma")]
    #[test_case(&format!(r#"{{"name": "x", "args": {}1}}{}}}"#, "[".repeat(200), "]".repeat(199)) ; "over-deep nesting unbalanced")]
    #[test_case(&format!(r#"{{"name": "x", "args": {}"#, "[".repeat(100_000)) ; "deep and truncated")]
    fn hostile_kineto_events_that_would_be_skipped_are_refused(event: &str) {
        let good = r#"{"name": "aten::add", "ph": "X", "ts": 1, "tid": 1, "args": {}}"#;
        let text = format!(r#"{{"traceEvents": [{good}, {event}, {good}]}}"#);
        for (gzipped, bytes) in [
            (false, text.clone().into_bytes()),
            (true, gzip(text.as_bytes())),
        ] {
            for strict in [false, true] {
                let options = Options::new().with_strict(strict);
                let e = match trace::open_reader(
                    std::io::Cursor::new(bytes.clone()),
                    "hostile",
                    &options,
                ) {
                    Err(e) => e,
                    Ok(t) => drain(t).unwrap_or_else(|| {
                        panic!("{event} (gzip {gzipped}, strict {strict}): read without an error")
                    }),
                };
                assert_ne!(e.kind(), TraceErrorKind::Io, "{event}: {e}");
                let m = e.to_string();
                assert!(
                    m.contains("corrupt JSON") || m.contains("truncated JSON"),
                    "{event}: {m}"
                );
            }
        }
    }

    /// A key given twice counts with its last value, as in a JSON object (`json.loads`
    /// keeps the last): in an event, in its `args`, and `traceEvents` itself; an element of
    /// `traceEvents` that is not an object, `"[memory]"` included, is no memory event.
    #[test]
    fn a_key_twice_counts_with_its_last_value() {
        let memory = |bytes: &str| {
            format!(
                r#"{{"name": "x", "name": "[memory]", "ts": 5, "ts": 1, "args": {{"Addr": 1, "Bytes": 7, "Bytes": {bytes}, "Device Type": 1}}}}"#
            )
        };
        let text = format!(
            r#"{{"traceEvents": [{}], "traceEvents": ["[memory]", 5, {}]}}"#,
            memory("100"),
            memory("512")
        );
        let events = trace::open_reader(std::io::Cursor::new(text), "t", &Options::new())
            .and_then(|t| t.collect::<portalloc::trace::Result<Vec<_>>>())
            .unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!((events[0].size, events[0].time_ns), (512, 1000));
    }

    /// Every trace failure says what kind it is, so a caller can act on it (raise a limit,
    /// name another file, fix the options) without reading the message.
    #[test_case(b"hello, world\n".to_vec(), Options::new(), TraceErrorKind::NotATrace ; "not a trace")]
    #[test_case(br#"{"traceEvents": [{"name": "x","#.to_vec(), Options::new(), TraceErrorKind::Malformed ; "truncated json")]
    #[test_case(gzip(&[b' '; 4096]), Options::new().with_max_input_bytes(1024), TraceErrorKind::Limit ; "inflated past the cap")]
    #[test_case(b"Thread,Time,Action,Pointer,Size,Stream\n1,0,allocate,0x10,256,0\n1,1,free,0x10,256,0\n1,2,free,0x10,256,0\n".to_vec(), Options::new().with_strict(true), TraceErrorKind::Anomaly ; "double free in strict mode")]
    #[test_case(kineto_on_cuda0(), Options::new().with_device_spec("cuda:3").unwrap(), TraceErrorKind::Selection ; "a device the file has no events of")]
    fn a_trace_error_names_its_kind(bytes: Vec<u8>, options: Options, kind: TraceErrorKind) {
        let e = trace::open_reader(std::io::Cursor::new(bytes), "t", &options)
            .and_then(|t| t.collect::<portalloc::trace::Result<Vec<_>>>())
            .expect_err("refused");
        assert_eq!(e.kind(), kind, "{e}");
        // Through `?` into portalloc's own error it stays the same trace error.
        let whole = Error::from(e.clone());
        assert!(matches!(&whole, Error::Trace(t) if *t == e), "{whole:?}");
    }

    /// A file's name reaches messages with its control characters escaped: a name made to
    /// drive a terminal (an escape sequence, a newline) cannot.
    #[test]
    fn a_name_that_would_drive_a_terminal_is_escaped() {
        let name = "ev\x1b[31mil\nname.json";
        let bytes = br#"{"traceEvents": [{"name": "x""#.to_vec();
        let Err(e) = trace::open_reader(std::io::Cursor::new(bytes), name, &Options::new())
            .and_then(|t| t.collect::<portalloc::trace::Result<Vec<_>>>())
        else {
            panic!("read a cut trace");
        };
        let m = e.to_string();
        assert!(!m.chars().any(char::is_control), "{m:?}");
        assert!(m.contains(r"ev\u{1b}[31mil\nname.json"), "{m}");
    }

    /// A file that cannot be opened is the operating system's failure, not the file's, and
    /// keeps the operating system's kind of error.
    #[test]
    fn a_file_that_cannot_be_opened_is_an_io_error() {
        let path = std::path::Path::new("/nonexistent/trace.json");
        let Err(e) = trace::open(path, &Options::new()) else {
            panic!("opened a file that does not exist");
        };
        assert_eq!(e.kind(), TraceErrorKind::Io, "{e}");
        assert_eq!(e.io_error_kind(), Some(std::io::ErrorKind::NotFound), "{e}");
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap()
    }

    fn kineto_on_cuda0() -> Vec<u8> {
        br#"{"traceEvents": [{"name": "[memory]", "ts": 1, "args": {"Addr": 1, "Bytes": 512, "Device Type": 1, "Device Id": 0}}]}"#.to_vec()
    }

    /// What JSON's grammar allows but no field can hold — a number past f64 — is refused
    /// where it is read, in a `[memory]` event, naming what is wrong; in an event that is
    /// dropped (not a `[memory]` one) it is JSON like any other, and dropped.
    #[test_case(r#""ts": 1e999"#, "number out of range" ; "a number past f64")]
    fn numbers_and_keys_no_field_holds_are_refused_where_read(fields: &str, why: &str) {
        let memory = r#""args": {"Addr": 1, "Bytes": 512, "Device Type": 1}"#;
        let read = |name: &str| {
            let text = format!(
                r#"{{"traceEvents": [{{"name": "{name}", {memory}, {fields}}}, {{"name": "[memory]", "ts": 3, {memory}}}]}}"#
            );
            trace::open_reader(std::io::Cursor::new(text), "t", &Options::new())
                .and_then(|t| t.collect::<portalloc::trace::Result<Vec<_>>>())
        };
        let e = read("[memory]").expect_err("a [memory] event no field holds");
        assert!(e.to_string().contains(why), "{e}");
        assert_eq!(read("aten::mm").map(|events| events.len()).ok(), Some(1));
    }

    /// serde_json validates an event it does not build without recursion: a million levels
    /// of nesting in an event that is not a `[memory]` one cost no stack, and the `[memory]`
    /// event after it is read.
    #[test]
    fn deep_nesting_in_a_skipped_kineto_event_is_read() {
        let deep = 1_000_000;
        let memory = r#"{"name": "[memory]", "ph": "i", "ts": 1, "args": {"Addr": 4096, "Bytes": 512, "Total Allocated": 512, "Total Reserved": 2097152, "Device Type": 1, "Device Id": 0}}"#;
        let text = format!(
            r#"{{"traceEvents": [{{"name": "x", "args": {}{}}}, {memory}]}}"#,
            "[".repeat(deep),
            "]".repeat(deep)
        );
        let t = trace::open_reader(
            std::io::Cursor::new(text.into_bytes()),
            "deep",
            &Options::new(),
        )
        .unwrap();
        let events: Vec<_> = t.collect::<Result<_, _>>().unwrap();
        assert_eq!(events.len(), 1);
    }

    /// An event that is not a `[memory]` one, past the most one JSON value may have, is
    /// refused by name as a `[memory]` one is: the skipper hands it to the parser, which
    /// refuses it before holding it whole.
    #[test]
    fn a_skipped_kineto_event_past_the_limit_is_refused() {
        let mut bytes = br#"{"traceEvents": [{"name": "aten::mm", "cat": ""#.to_vec();
        bytes.resize(bytes.len() + (17 << 20), b'x');
        bytes.extend_from_slice(br#""}]}"#);
        let e = match trace::open_reader(std::io::Cursor::new(bytes), "big", &Options::new()) {
            Err(e) => e,
            Ok(t) => drain(t).expect("an event past the limit is read"),
        };
        assert_ne!(e.kind(), TraceErrorKind::Io, "{e}");
        assert!(e.to_string().contains("longer than 16 MiB"), "{e}");
    }

    /// A well-formed header followed by hostile event lines: each is a `Trace` error in strict
    /// mode and, where it cannot be skipped, also when tolerant.
    #[test_case(r#"{"seq":0,"t":0,"op":"x","id":1,"size":1}"# ; "unknown op")]
    #[test_case(r#"{"seq":0,"op":"a","id":1,"size":18446744073709551616}"# ; "size over u64")]
    #[test_case(r#"{"seq":0,"op":"a","id":1,"size":-1}"# ; "negative size")]
    #[test_case("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[" ; "deep nesting")]
    #[test_case("{" ; "truncated event")]
    fn hostile_portalloc_events_are_a_trace_error_in_strict_mode(line: &str) {
        let text = format!("{HEADER}\n{line}\n");
        let options = Options::new()
            .with_format(Format::Portalloc)
            .with_strict(true);
        let e = match trace::open_reader(
            std::io::Cursor::new(text.into_bytes()),
            "hostile",
            &options,
        ) {
            Err(e) => e,
            Ok(t) => drain(t).unwrap_or_else(|| panic!("{line}: read without an error")),
        };
        assert_ne!(e.kind(), TraceErrorKind::Io, "{line}: {e}");
    }

    #[test]
    fn opening_a_missing_or_unreadable_path_is_a_trace_error() {
        let dir = std::env::temp_dir().join(format!("portalloc-bad-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for path in [
            dir.join("does-not-exist.jsonl"),
            dir.clone(),
            std::path::PathBuf::from(""),
        ] {
            let e = trace::open(&path, &Options::new()).err().unwrap();
            assert!(e.io_error_kind().is_some(), "{}: {e}", path.display());
            assert!(e.message().contains("portalloc-bad-input") || path.as_os_str().is_empty());
        }
        let file = dir.join("garbage.bin");
        std::fs::File::create(&file)
            .unwrap()
            .write_all(&[0xde, 0xad, 0xbe, 0xef])
            .unwrap();
        let e = trace::open(&file, &Options::new()).err().unwrap();
        assert_eq!(e.kind(), TraceErrorKind::NotATrace, "{e}");
        assert_eq!(e.io_error_kind(), None, "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test_case("" ; "empty")]
    #[test_case("jsonl2" ; "unknown")]
    #[test_case("PORTALLOC\u{0}" ; "nul")]
    fn unknown_trace_format_names_are_invalid_options(name: &str) {
        let e = name.parse::<Format>().unwrap_err();
        assert_eq!(e.kind(), TraceErrorKind::InvalidOption, "{e}");
        assert!(
            e.message().starts_with("--format=") && e.message().contains("kineto"),
            "{e}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Replay options and workloads
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "replay")]
mod replay_inputs {
    use super::*;
    use portalloc::replay::workload::{TransformerTrain, Workload};
    use portalloc::replay::{self, Baseline, ReplayOptions, ReplayStrategy, TraceInput};
    use test_case::test_case;

    /// Every strategy `replay` knows (each of its names, parsed).
    fn every_replay_strategy() -> impl Iterator<Item = ReplayStrategy> {
        replay::STRATEGY_NAMES
            .iter()
            .map(|name| ReplayStrategy::parse(name).unwrap())
    }

    fn tiny_input() -> TraceInput {
        let w = TransformerTrain {
            layers: 1,
            hidden: 64,
            batch: 1,
            seq: 16,
            vocab: 128,
            heads: 1,
            steps: 1,
            ..TransformerTrain::default()
        };
        let (header, events) = w.events().unwrap();
        TraceInput::Events {
            header,
            events: Arc::new(events),
        }
    }

    #[test_case("" ; "empty")]
    #[test_case("bfc,vmm" ; "a list is not one name")]
    #[test_case("BFC-GROWING" ; "unknown")]
    fn replay_strategy_names_are_checked(name: &str) {
        let e = ReplayStrategy::parse(name).unwrap_err();
        assert_eq!(variant(&e), "Config", "{e}");
    }

    #[test_case("" ; "empty")]
    #[test_case("h100-80g-plus" ; "unknown preset")]
    fn replay_presets_are_checked(name: &str) {
        let e = replay::preset(name).unwrap_err();
        assert_eq!(variant(&e), "Config", "{e}");
    }

    #[test_case(0, 2 * MIB, "InvalidArgument" ; "capacity zero")]
    #[test_case(CAPACITY, 3, "InvalidArgument" ; "granularity not a power of two")]
    #[test_case(CAPACITY, 0, "InvalidArgument" ; "granularity zero")]
    #[test_case(CAPACITY, 1 << 63, "ok" ; "granularity huge")]
    fn replay_device_specs_are_checked(capacity: u64, granularity: u64, want: &str) {
        let spec = replay::DeviceSpec {
            name: "hostile",
            capacity,
            granularity,
        };
        let options = ReplayOptions {
            device: spec,
            fraction: 0.75,
            samples: 0,
            sleep_tags: 0,
        };
        let input = tiny_input();
        let baseline = Baseline::scan(&input).unwrap();
        for s in every_replay_strategy() {
            match replay::replay(&input, &baseline, s, &options, None) {
                // A device that cannot hold anything replays with every allocation out of
                // memory, counted, not an error.
                Ok(r) => assert!(
                    want == "ok" || capacity == 0 && r.oom_count > 0,
                    "{s:?} capacity {capacity} granularity {granularity}: {r:?}"
                ),
                Err(e) => {
                    assert!(want != "ok", "{s:?}: {e}");
                    assert_eq!(variant(&e), want, "{s:?}: {e}");
                }
            }
        }
    }

    /// A NaN, negative, zero or above-one fraction is a typed configuration error from the
    /// library's `replay`, as from the CLI's `--fraction`.
    #[test_case(f64::NAN ; "nan")]
    #[test_case(-1.0 ; "negative")]
    #[test_case(0.0 ; "zero")]
    #[test_case(1.5 ; "above one")]
    fn replay_with_a_hostile_fraction_is_a_config_error(fraction: f64) {
        let input = tiny_input();
        let baseline = Baseline::scan(&input).unwrap();
        let options = ReplayOptions {
            device: replay::preset("h100-80g").unwrap(),
            fraction,
            samples: 4,
            sleep_tags: 0,
        };
        for s in every_replay_strategy() {
            let e = replay::replay(&input, &baseline, s, &options, None).unwrap_err();
            assert_eq!(variant(&e), "Config", "{s:?}: {e}");
        }
    }

    #[test_case(TransformerTrain { layers: 0, ..TransformerTrain::default() } ; "zero layers")]
    #[test_case(TransformerTrain { hidden: 0, ..TransformerTrain::default() } ; "zero hidden")]
    #[test_case(TransformerTrain { hidden: 100, heads: 0, ..TransformerTrain::default() } ; "hidden not a multiple of 64")]
    #[test_case(TransformerTrain { hidden: 64, heads: 3, ..TransformerTrain::default() } ; "heads do not divide hidden")]
    #[test_case(TransformerTrain { batch: u64::MAX, ..TransformerTrain::default() } ; "batch overflows")]
    #[test_case(TransformerTrain { seq: u64::MAX, ..TransformerTrain::default() } ; "seq overflows")]
    #[test_case(TransformerTrain { vocab: u64::MAX, ..TransformerTrain::default() } ; "vocab overflows")]
    #[test_case(TransformerTrain { dtype_bytes: 3, ..TransformerTrain::default() } ; "dtype of three bytes")]
    #[test_case(TransformerTrain { steps: 0, ..TransformerTrain::default() } ; "zero steps")]
    #[test_case(TransformerTrain { ffn_mult: 0, ..TransformerTrain::default() } ; "zero ffn")]
    fn hostile_workload_parameters_are_invalid_arguments(w: TransformerTrain) {
        let e = w.validate().unwrap_err();
        assert_eq!(variant(&e), "InvalidArgument", "{w:?}: {e}");
        let e = Workload::TransformerTrain(w).events().unwrap_err();
        assert_eq!(variant(&e), "InvalidArgument", "{e}");
    }

    #[test]
    fn unknown_workload_names_are_config_errors() {
        for name in ["", "transformer", "transformer-train\u{0}"] {
            let e = Workload::from_name(name).unwrap_err();
            assert_eq!(variant(&e), "Config", "{name:?}: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// HostDevice: plain, virtual-memory, stream, event and pool calls
// ---------------------------------------------------------------------------------------------

const G: u64 = 2 * MIB;

/// One hostile call on a fresh device that holds a 4-granule reservation `va` with granule 0
/// mapped from a 2-granule handle `h`; returns the error.
#[derive(Debug, Clone, Copy)]
enum HostCall {
    AllocZero,
    AllocMax,
    AllocOverCapacity,
    FreeUnknown,
    FreeWrongSize,
    FreeTwice,
    ReserveZero,
    ReserveUnaligned,
    ReserveMax,
    ReserveAlignmentNotPowerOfTwo,
    FreeReservationUnknown,
    FreeReservationWrongSize,
    FreeReservationStillMapped,
    CreateZero,
    CreateUnaligned,
    CreateMax,
    CreateOverCapacity,
    ReleaseUnknown,
    ReleaseTwice,
    MapUnknownHandle,
    MapOutsideReservation,
    MapOverlapping,
    MapPastHandleEnd,
    MapUnalignedAddress,
    MapWrapsAround,
    SetAccessUnmapped,
    SetAccessZero,
    UnmapUnmapped,
    UnmapPartOfAMapping,
    DestroyDefaultStream,
    DestroyUnknownStream,
    RecordUnknownEvent,
    QueryUnknownEvent,
    PoolAllocZero,
    PoolAllocMax,
    PoolFreeUnknown,
    PoolFreeTwice,
}

#[test_case(HostCall::AllocZero, "InvalidSize")]
#[test_case(HostCall::AllocMax, "InvalidSize")]
#[test_case(HostCall::AllocOverCapacity, "DeviceOutOfMemory")]
#[test_case(HostCall::FreeUnknown, "UnknownPointer")]
#[test_case(HostCall::FreeWrongSize, "InvalidArgument")]
#[test_case(HostCall::FreeTwice, "UnknownPointer")]
#[test_case(HostCall::ReserveZero, "InvalidArgument")]
#[test_case(HostCall::ReserveUnaligned, "InvalidArgument")]
#[test_case(HostCall::ReserveMax, "InvalidArgument")]
#[test_case(HostCall::ReserveAlignmentNotPowerOfTwo, "InvalidArgument")]
#[test_case(HostCall::FreeReservationUnknown, "UnknownPointer")]
#[test_case(HostCall::FreeReservationWrongSize, "InvalidArgument")]
#[test_case(HostCall::FreeReservationStillMapped, "InvalidArgument")]
#[test_case(HostCall::CreateZero, "InvalidArgument")]
#[test_case(HostCall::CreateUnaligned, "InvalidArgument")]
#[test_case(HostCall::CreateMax, "InvalidArgument")]
#[test_case(HostCall::CreateOverCapacity, "DeviceOutOfMemory")]
#[test_case(HostCall::ReleaseUnknown, "UnknownPointer")]
#[test_case(HostCall::ReleaseTwice, "UnknownPointer")]
#[test_case(HostCall::MapUnknownHandle, "UnknownPointer")]
#[test_case(HostCall::MapOutsideReservation, "InvalidArgument")]
#[test_case(HostCall::MapOverlapping, "InvalidArgument")]
#[test_case(HostCall::MapPastHandleEnd, "InvalidArgument")]
#[test_case(HostCall::MapUnalignedAddress, "InvalidArgument")]
#[test_case(HostCall::MapWrapsAround, "InvalidArgument")]
#[test_case(HostCall::SetAccessUnmapped, "InvalidArgument")]
#[test_case(HostCall::SetAccessZero, "InvalidArgument")]
#[test_case(HostCall::UnmapUnmapped, "InvalidArgument")]
#[test_case(HostCall::UnmapPartOfAMapping, "InvalidArgument")]
#[test_case(HostCall::DestroyDefaultStream, "InvalidArgument")]
#[test_case(HostCall::DestroyUnknownStream, "UnknownPointer")]
#[test_case(HostCall::RecordUnknownEvent, "UnknownPointer")]
#[test_case(HostCall::QueryUnknownEvent, "UnknownPointer")]
#[test_case(HostCall::PoolAllocZero, "InvalidSize")]
#[test_case(HostCall::PoolAllocMax, "InvalidSize")]
#[test_case(HostCall::PoolFreeUnknown, "UnknownPointer")]
#[test_case(HostCall::PoolFreeTwice, "UnknownPointer")]
fn host_device_refuses_hostile_calls(call: HostCall, want: &str) {
    for simulated in [true, false] {
        let d = HostDevice::builder()
            .capacity(CAPACITY)
            .simulated(simulated)
            .build()
            .unwrap();
        let vm: &dyn VirtualMemory = &d;
        let pool: &dyn StreamOrderedPool = &d;
        let va = vm.reserve(4 * G, 0).unwrap();
        let h = vm.create_physical(2 * G).unwrap();
        vm.map(va, G, h, 0).unwrap();
        vm.set_access(va, G).unwrap();
        let p = d.alloc(4096).unwrap();
        let event = d.create_event().unwrap();
        let err = match call {
            HostCall::AllocZero => d.alloc(0).map(drop),
            HostCall::AllocMax => d.alloc(u64::MAX).map(drop),
            HostCall::AllocOverCapacity => d.alloc(CAPACITY).map(drop),
            HostCall::FreeUnknown => d.free(0xdead_0000, 4096),
            HostCall::FreeWrongSize => d.free(p, 8192),
            HostCall::FreeTwice => {
                let q = d.alloc(512).unwrap();
                d.free(q, 512).unwrap();
                d.free(q, 512)
            }
            HostCall::ReserveZero => vm.reserve(0, 0).map(drop),
            HostCall::ReserveUnaligned => vm.reserve(G + 1, 0).map(drop),
            HostCall::ReserveMax => vm.reserve(u64::MAX, 0).map(drop),
            HostCall::ReserveAlignmentNotPowerOfTwo => vm.reserve(G, 3 * G).map(drop),
            HostCall::FreeReservationUnknown => vm.free_reservation(va + G, G),
            HostCall::FreeReservationWrongSize => vm.free_reservation(va, 2 * G),
            HostCall::FreeReservationStillMapped => vm.free_reservation(va, 4 * G),
            HostCall::CreateZero => vm.create_physical(0).map(drop),
            HostCall::CreateUnaligned => vm.create_physical(G - 1).map(drop),
            HostCall::CreateMax => vm.create_physical(u64::MAX).map(drop),
            HostCall::CreateOverCapacity => vm.create_physical(CAPACITY).map(drop),
            HostCall::ReleaseUnknown => vm.release_physical(PhysicalHandle(u64::MAX)),
            HostCall::ReleaseTwice => {
                let h2 = vm.create_physical(G).unwrap();
                vm.release_physical(h2).unwrap();
                vm.release_physical(h2)
            }
            HostCall::MapUnknownHandle => vm.map(va + G, G, PhysicalHandle(12345), 0),
            HostCall::MapOutsideReservation => vm.map(va + 4 * G, G, h, G),
            HostCall::MapOverlapping => vm.map(va, G, h, G),
            HostCall::MapPastHandleEnd => vm.map(va + G, 2 * G, h, G),
            HostCall::MapUnalignedAddress => vm.map(va + G + 256, G, h, G),
            HostCall::MapWrapsAround => vm.map(u64::MAX - G + 1, 2 * G, h, 0),
            HostCall::SetAccessUnmapped => vm.set_access(va + G, G),
            HostCall::SetAccessZero => vm.set_access(va, 0),
            HostCall::UnmapUnmapped => vm.unmap(va + 2 * G, G),
            HostCall::UnmapPartOfAMapping => {
                vm.map(va + 2 * G, 2 * G, h, 0).unwrap();
                let r = vm.unmap(va + 2 * G, G);
                vm.unmap(va + 2 * G, 2 * G).unwrap();
                r
            }
            // SAFETY: the host device only compares stream handles; the test uses none after.
            HostCall::DestroyDefaultStream => unsafe { d.destroy_stream(Stream::DEFAULT) },
            // SAFETY: the host device only compares stream handles; the test uses none after.
            HostCall::DestroyUnknownStream => unsafe {
                d.destroy_stream(crate::support::stream(u64::MAX))
            },
            HostCall::RecordUnknownEvent => d.record_event(Event(u64::MAX), Stream::DEFAULT),
            HostCall::QueryUnknownEvent => d.event_complete(Event(0)).map(drop),
            HostCall::PoolAllocZero => pool.alloc_async(0, Stream::DEFAULT).map(drop),
            HostCall::PoolAllocMax => pool.alloc_async(u64::MAX, Stream::DEFAULT).map(drop),
            HostCall::PoolFreeUnknown => pool.free_async(p, Stream::DEFAULT),
            HostCall::PoolFreeTwice => {
                let q = pool.alloc_async(1000, Stream::DEFAULT).unwrap();
                pool.free_async(q, Stream::DEFAULT).unwrap();
                pool.free_async(q, Stream::DEFAULT)
            }
        }
        .expect_err("a hostile call must be refused");
        assert_eq!(
            variant(&err),
            want,
            "{call:?} (simulated {simulated}): {err}"
        );
        // The refusal changed nothing: everything held comes back cleanly.
        d.destroy_event(event).unwrap();
        d.free(p, 4096).unwrap();
        vm.unmap(va, G).unwrap();
        vm.release_physical(h).unwrap();
        vm.free_reservation(va, 4 * G).unwrap();
        pool.trim_to(0).unwrap();
        assert!(d.census().is_empty(), "{call:?}: {:?}", d.census());
    }
}

#[test_case(0 ; "zero")]
#[test_case(3 << 20 ; "not a power of two")]
#[test_case(1024 ; "below the page size")]
fn host_device_builder_refuses_bad_granularities(granularity: u64) {
    let e = HostDevice::builder()
        .capacity(CAPACITY)
        .granularity(granularity)
        .build()
        .unwrap_err();
    assert_eq!(variant(&e), "InvalidArgument", "{e}");
}

// ---------------------------------------------------------------------------------------------
// The C ABI: cases tests/capi.rs does not cover
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "c-api")]
mod c_abi {
    use std::ffi::{c_char, CStr};
    use std::ptr;

    use portalloc::capi::*;
    use test_case::test_case;

    use super::MIB;

    fn last_error() -> String {
        // SAFETY: portalloc_last_error returns a valid NUL-terminated string.
        unsafe { CStr::from_ptr(portalloc_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    fn options() -> PortallocOptions {
        let mut o = std::mem::MaybeUninit::<PortallocOptions>::uninit();
        // SAFETY: valid for one PortallocOptions, whose every field the sized call writes (the
        // 0.1.0 `portalloc_options_default` writes only that release's fields).
        let mut o = unsafe {
            assert_eq!(
                portalloc_options_init(o.as_mut_ptr(), std::mem::size_of::<PortallocOptions>()),
                PortallocStatus::Ok
            );
            o.assume_init()
        };
        o.ignore_env = 1;
        o.backend = c"host".as_ptr();
        o.host_simulated = 1;
        o.host_capacity = 64 * MIB;
        o
    }

    /// Creates with edited options; destroys what was created; returns the status.
    fn create(edit: impl FnOnce(&mut PortallocOptions)) -> PortallocStatus {
        let mut o = options();
        edit(&mut o);
        let mut out = ptr::null_mut();
        // SAFETY: valid options (strings static or null) and output.
        let s = unsafe { portalloc_create(&o, &mut out) };
        if s == PortallocStatus::Ok {
            // SAFETY: a live allocator.
            assert_eq!(unsafe { portalloc_destroy(out) }, PortallocStatus::Ok);
        }
        s
    }

    const BAD_UTF8: &[u8] = b"bf\xffc\0";

    #[test_case(|o: &mut PortallocOptions| o.mem_fraction = -0.5, PortallocStatus::Config, "mem_fraction" ; "negative fraction")]
    #[test_case(|o: &mut PortallocOptions| o.mem_fraction = f64::INFINITY, PortallocStatus::Config, "mem_fraction" ; "infinite fraction")]
    #[test_case(|o: &mut PortallocOptions| o.mem_fraction = 1.5, PortallocStatus::Config, "mem_fraction" ; "fraction above one")]
    #[test_case(|o: &mut PortallocOptions| o.backend = c"opencl".as_ptr(), PortallocStatus::Config, "opencl" ; "unknown backend")]
    #[test_case(|o: &mut PortallocOptions| o.strategy = BAD_UTF8.as_ptr() as *const c_char, PortallocStatus::InvalidArgument, "UTF-8" ; "strategy not utf8")]
    #[test_case(|o: &mut PortallocOptions| o.device = u32::MAX, PortallocStatus::InvalidArgument, "does not exist" ; "device ordinal u32 max")]
    #[test_case(|o: &mut PortallocOptions| o.host_simulated = i32::MIN, PortallocStatus::InvalidArgument, "host_simulated" ; "host simulated i32 min")]
    #[test_case(|o: &mut PortallocOptions| o.backtrace = 2, PortallocStatus::InvalidArgument, "backtrace" ; "backtrace two")]
    fn hostile_options_are_refused(
        edit: fn(&mut PortallocOptions),
        status: PortallocStatus,
        text: &str,
    ) {
        assert_eq!(create(edit), status, "{}", last_error());
        let m = last_error();
        assert!(m.contains(text), "{m:?} lacks {text:?}");
    }

    #[test]
    fn calls_on_a_destroyed_or_null_allocator_are_refused() {
        let o = options();
        let mut a = ptr::null_mut();
        // SAFETY: valid options and output.
        assert_eq!(unsafe { portalloc_create(&o, &mut a) }, PortallocStatus::Ok);
        // SAFETY: a live allocator, then a destroyed one: only looked up.
        unsafe {
            assert_eq!(portalloc_destroy(a), PortallocStatus::Ok);
            let mut released = 0;
            assert_eq!(
                portalloc_trim(a, &mut released),
                PortallocStatus::InvalidAllocator
            );
            assert_eq!(
                portalloc_trim(ptr::null_mut(), ptr::null_mut()),
                PortallocStatus::NullArgument
            );
            assert_eq!(
                portalloc_free_ptr(a, 0x1000 as *mut _),
                PortallocStatus::InvalidAllocator
            );
            assert_eq!(
                portalloc_handle_info(a, 1, ptr::null_mut(), ptr::null_mut()),
                PortallocStatus::InvalidAllocator
            );
            assert_eq!(
                portalloc_ledger_write(a, c"/dev/null".as_ptr()),
                PortallocStatus::InvalidAllocator
            );
            assert_eq!(portalloc_destroy(a), PortallocStatus::InvalidAllocator);
        }
    }

    #[test]
    fn null_outputs_and_paths_are_refused() {
        let o = options();
        let mut a = ptr::null_mut();
        // SAFETY: valid options and output; then plain values and null outputs.
        unsafe {
            assert_eq!(portalloc_create(&o, &mut a), PortallocStatus::Ok);
            assert_eq!(
                portalloc_create(&o, ptr::null_mut()),
                PortallocStatus::NullArgument
            );
            assert_eq!(
                portalloc_create_from_env(0, ptr::null_mut()),
                PortallocStatus::NullArgument
            );
            assert_eq!(
                portalloc_ledger_write(a, ptr::null()),
                PortallocStatus::NullArgument
            );
            assert!(last_error().contains("path"), "{}", last_error());
            let (mut h, mut p) = (0u64, ptr::null_mut());
            assert_eq!(
                portalloc_allocate(a, 4096, 0, 0, c"t".as_ptr(), &mut h, &mut p),
                PortallocStatus::Ok
            );
            assert_eq!(
                portalloc_donate(a, h, c"u".as_ptr(), ptr::null_mut()),
                PortallocStatus::NullArgument
            );
            // The refused donation left the buffer alive under its handle.
            assert_eq!(portalloc_free(a, h), PortallocStatus::Ok);
            assert_eq!(
                portalloc_options_default(ptr::null_mut()),
                PortallocStatus::NullArgument
            );
            assert_eq!(portalloc_destroy(a), PortallocStatus::Ok);
        }
    }

    #[test_case(-1 ; "minus one")]
    #[test_case(i32::MIN ; "i32 min")]
    #[test_case(i32::MAX ; "i32 max")]
    fn unknown_status_numbers_have_a_name(status: i32) {
        // SAFETY: portalloc_status_name returns a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(portalloc_status_name(status)) };
        assert_eq!(name.to_str().unwrap(), "unknown status");
    }
}
