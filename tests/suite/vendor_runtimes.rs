//! Discovery against NVIDIA's and AMD's real runtimes on a machine with no GPU.
//!
//! `scripts/fetch-vendor-runtimes` unpacks Debian's `libcuda1` (driver 535) and
//! `libamdhip64-5` (HIP 5.2.3) into `.vendor/` and `scripts/test` exports their paths as
//! `PORTALLOC_TEST_CUDA_LIBRARY` / `PORTALLOC_TEST_HIP_LIBRARY`. Where they are absent these
//! tests say so and pass without checking the runtime (the loader tests below still run).
//! On a machine with a GPU the device count is non-zero and the no-device assertions are
//! replaced by device checks.

#[cfg(any(feature = "cuda", feature = "hip"))]
#[cfg(any(feature = "cuda", feature = "hip"))]
use test_case::test_case;

/// Probes the real runtime at the path in `var` (`None`, after a message, where it is not
/// set): the probe loads that library, and with no device it says so with the runtime's
/// own name for code 100, `no_device`.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn probe_real_runtime(
    var: &str,
    probe_with: fn(&[String]) -> portalloc::backends::Probe,
    no_device: &str,
) -> Option<portalloc::backends::Probe> {
    let path = crate::support::vendor_runtime(var)?;
    let probe = probe_with(std::slice::from_ref(&path));
    assert_eq!(
        probe.library.as_deref(),
        Some(path.as_str()),
        "{:?}",
        probe.load_failures
    );
    if probe.device_count == 0 {
        let error = probe.error.as_deref().expect("no device must be explained");
        assert!(
            error.starts_with(&format!("{no_device} (100)")),
            "got {error}"
        );
    }
    Some(probe)
}

/// The real runtime's own names for the codes CUDA and HIP share: out of memory (2), no
/// device (100), not supported (801). `error_names` loads the runtime at a path and names
/// codes with it.
#[cfg_attr(feature = "cuda", test_case(
    "PORTALLOC_TEST_CUDA_LIBRARY",
    cuda::error_names,
    ["CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_NOT_SUPPORTED"]
    ; "libcuda"
))]
#[cfg_attr(feature = "hip", test_case(
    "PORTALLOC_TEST_HIP_LIBRARY",
    hip::error_names,
    ["hipErrorOutOfMemory", "hipErrorNoDevice", "hipErrorNotSupported"]
    ; "libamdhip64"
))]
#[cfg(any(feature = "cuda", feature = "hip"))]
fn real_runtime_names_the_shared_codes(
    var: &str,
    error_names: fn(String, &[i32]) -> Vec<String>,
    names: [&str; 3],
) {
    let Some(path) = crate::support::vendor_runtime(var) else {
        return;
    };
    assert_eq!(error_names(path, &[2, 100, 801]), names);
}

#[cfg(feature = "cuda")]
mod cuda {
    use portalloc::backends::cuda::{probe_with, Driver};
    use portalloc::Error;

    #[test]
    fn real_libcuda_loads_and_reports_no_device() {
        let Some(probe) = super::probe_real_runtime(
            "PORTALLOC_TEST_CUDA_LIBRARY",
            probe_with,
            "CUDA_ERROR_NO_DEVICE",
        ) else {
            return;
        };
        let version = probe
            .driver_version
            .expect("cuDriverGetVersion answers without a device");
        let major: u32 = version.split('.').next().unwrap().parse().unwrap();
        assert!(major >= 11, "driver 535 reports CUDA 12.x, got {version}");
        if probe.device_count > 0 {
            assert_eq!(probe.devices.len() as u32, probe.device_count);
            assert!(probe.devices[0].contains("sm_"));
        }
    }

    /// The driver's names for `codes`.
    pub fn error_names(path: String, codes: &[i32]) -> Vec<String> {
        let driver = Driver::load(&[path]).unwrap();
        codes
            .iter()
            .map(|&code| driver.error_name(code).0)
            .collect()
    }

    /// Beyond the codes HIP shares (`real_runtime_names_the_shared_codes`).
    #[test]
    fn real_libcuda_names_its_errors() {
        let Some(path) = crate::support::vendor_runtime("PORTALLOC_TEST_CUDA_LIBRARY") else {
            return;
        };
        let driver = Driver::load(&[path]).unwrap();
        assert_eq!(
            driver.error_name(123_456).0,
            "CUDA_ERROR_123456",
            "unknown codes get a made-up name, no panic"
        );
        match driver.init() {
            Err(Error::Driver {
                name, code, call, ..
            }) => {
                assert_eq!(
                    (name.as_str(), code, call),
                    ("CUDA_ERROR_NO_DEVICE", 100, "cuInit")
                );
            }
            Ok(()) => eprintln!("a GPU is present: cuInit succeeded"),
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn missing_library_is_an_error_value() {
        let probe = probe_with(&["/nonexistent/libcuda.so.1".into()]);
        assert_eq!(probe.library, None);
        assert_eq!(probe.device_count, 0);
        assert!(probe.error.unwrap().contains("not found"));
        assert!(probe.load_failures[0].starts_with("/nonexistent/libcuda.so.1: "));
        assert!(matches!(
            Driver::load(&["/nonexistent/libcuda.so.1".into()]),
            Err(Error::LibraryLoad { .. })
        ));
    }

    #[test]
    fn library_without_the_driver_api_is_missing_a_symbol() {
        // libc loads everywhere and exports no cuInit: the shape of a too-old or wrong library.
        match Driver::load(&["libc.so.6".into()]) {
            Err(Error::MissingSymbol {
                symbol, library, ..
            }) => {
                assert_eq!(symbol, "cuInit");
                assert_eq!(library, "libc.so.6");
            }
            other => panic!("expected MissingSymbol, got {other:?}"),
        }
    }
}

#[cfg(feature = "hip")]
mod hip {
    use portalloc::backends::hip::{decode_version, probe_with, Runtime};
    use portalloc::Error;

    #[test]
    fn real_libamdhip64_loads_and_reports_no_device() {
        let Some(probe) =
            super::probe_real_runtime("PORTALLOC_TEST_HIP_LIBRARY", probe_with, "hipErrorNoDevice")
        else {
            return;
        };
        assert!(
            probe.runtime_version.unwrap().starts_with("5.2."),
            "Debian ships HIP 5.2.3"
        );
    }

    /// The runtime's names for `codes`.
    pub fn error_names(path: String, codes: &[i32]) -> Vec<String> {
        let runtime = Runtime::load(&[path]).unwrap();
        codes
            .iter()
            .map(|&code| {
                runtime
                    .error_name(u32::try_from(code).expect("a HIP code"))
                    .0
            })
            .collect()
    }

    #[test]
    fn versions_decode_as_hip_writes_them() {
        assert_eq!(decode_version(50_221_153), "5.2.21153");
        assert_eq!(decode_version(60_342_131), "6.3.42131");
    }

    #[test]
    fn missing_library_is_an_error_value() {
        let probe = probe_with(&["/nonexistent/libamdhip64.so.5".into()]);
        assert_eq!(probe.library, None);
        assert!(probe.error.unwrap().contains("not found"));
        match Runtime::load(&["libc.so.6".into()]) {
            Err(Error::MissingSymbol { symbol, .. }) => assert_eq!(symbol, "hipInit"),
            other => panic!("expected MissingSymbol, got {other:?}"),
        }
    }
}
