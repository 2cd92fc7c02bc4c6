//! The device cost model of `portalloc replay`: every call counted by name
//! (`device_calls_by_name`), and with `--device-costs FILE` the modelled time is the sum over
//! the calls of count × `us` + MiB × `us_per_mib`, checked against hand computations of
//! traces whose calls are known; a call the file does not price, or a file that is not a
//! table, is an error naming what is wrong.
#![cfg(all(feature = "cli", feature = "replay"))]

use portalloc::trace::{jsonl, Op, TraceHeader};
use test_case::test_case;

use crate::support::cli::portalloc;

/// A trace of three 1 MiB allocations, then their frees, written to a file of its own.
fn three_mib(dir: &std::path::Path) -> String {
    let mut w = jsonl::Writer::new(Vec::new(), &TraceHeader::new("test:costs")).unwrap();
    let ops = [
        (Op::Alloc, 1),
        (Op::Alloc, 2),
        (Op::Alloc, 3),
        (Op::Free, 1),
        (Op::Free, 2),
        (Op::Free, 3),
    ];
    for (seq, (op, id)) in ops.into_iter().enumerate() {
        w.write(&crate::support::event(seq as u64, op, id, 1 << 20))
            .unwrap();
    }
    let path = dir.join("three.jsonl");
    std::fs::write(&path, w.finish().unwrap()).unwrap();
    path.to_str().unwrap().to_string()
}

/// The calls a result's modelled time lacks a price for (`device_time_unpriced`).
fn unpriced(result: &serde_json::Value) -> Vec<&str> {
    result["device_time_unpriced"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect()
}

/// A fresh directory for one test.
fn dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("portalloc-costs-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `portalloc replay TRACE --capacity 64MiB --fraction 0.5 --json` with `extra`: the
/// results, by strategy.
fn replayed(trace: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "replay",
        trace,
        "--capacity",
        "64MiB",
        "--fraction",
        "0.5",
        "--json",
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = portalloc(&args, &[]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["traces"][0]["results"].clone()
}

/// Hand computations (the costs below, the calls each strategy makes as its documentation
/// says):
/// * bfc preallocates fraction × capacity = 0.5 × 64 MiB = 32 MiB in one `alloc`:
///   100 µs + 32 MiB × 2 µs = 164 µs; nothing else.
/// * platform makes one `alloc` per request (3 × (100 + 1 × 2) µs = 306 µs) and, per free,
///   waits for the request's stream (`synchronize_stream`, 7 µs) before `free` (5 µs):
///   3 × 12 = 36 µs; 342 µs in all.
#[test_case("bfc", 164e-6, &[("alloc", 1)] ; "bfc preallocates once")]
#[test_case("platform", 342e-6, &[("alloc", 3), ("free", 3), ("synchronize_stream", 3)] ; "platform calls the driver per request")]
fn the_modelled_time_is_the_sum_over_the_calls(
    strategy: &str,
    seconds: f64,
    calls: &[(&str, u64)],
) {
    let d = dir(strategy);
    let trace = three_mib(&d);
    let costs = d.join("costs.json");
    std::fs::write(
        &costs,
        r#"{"calls": {"alloc": {"us": 100, "us_per_mib": 2}, "free": {"us": 5},
                      "synchronize_stream": {"us": 7}}}"#,
    )
    .unwrap();
    let results = replayed(
        &trace,
        &[
            "--strategies",
            strategy,
            "--device-costs",
            costs.to_str().unwrap(),
        ],
    );
    let r = &results[0];
    let by_name: Vec<(String, u64)> = r["device_calls_by_name"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    let want: Vec<(String, u64)> = calls.iter().map(|&(n, c)| (n.to_string(), c)).collect();
    assert_eq!(by_name, want, "{r}");
    let got = r["device_time_model_s"].as_f64().unwrap();
    assert!((got - seconds).abs() < 1e-12, "{got} ≠ {seconds}: {r}");
    assert_eq!(r["device_time_priced_s"].as_f64().unwrap(), got, "{r}");
    let _ = std::fs::remove_dir_all(&d);
}

/// The steady figure is the calls of the second half of the events: platform's three frees
/// (3 × 12 µs), none of its allocations.
#[test]
fn the_steady_time_is_the_second_half() {
    let d = dir("steady");
    let trace = three_mib(&d);
    let costs = d.join("costs.json");
    std::fs::write(
        &costs,
        r#"{"calls": {"alloc": {"us": 100}, "free": {"us": 5}, "synchronize_stream": {"us": 7}}}"#,
    )
    .unwrap();
    let r = &replayed(
        &trace,
        &[
            "--strategies",
            "platform",
            "--device-costs",
            costs.to_str().unwrap(),
        ],
    )[0];
    let steady = r["device_time_model_steady_s"].as_f64().unwrap();
    assert!((steady - 36e-6).abs() < 1e-12, "{r}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A call the replay makes that the file does not price is an error naming it; a file that
/// is not a table, a name that is no call, a negative cost, are errors naming what is wrong.
#[test_case(r#"{"calls": {"alloc": {"us": 1}}}"#, "platform makes the call free, which the table does not price" ; "a call unpriced")]
#[test_case(r#"{"calls": {"cuMemAlloc": {"us": 1}}}"#, "no call is named \"cuMemAlloc\"; the calls are mem_info, alloc" ; "a name that is no call")]
#[test_case(r#"{"calls": {"alloc": {"us": -1}}}"#, "alloc.us is -1: a cost is a finite number" ; "a negative cost")]
#[test_case(r#"{"calls": {"alloc": {"ms": 1}}}"#, "not a cost table (unknown field `ms`" ; "a field of another name")]
#[test_case(r#"{"copy_gib_s": {"to_host": 0, "to_device": 1}}"#, "copy_gib_s.to_host is 0: a bandwidth" ; "a bandwidth of zero")]
fn a_table_that_cannot_price_the_replay_is_refused(table: &str, said: &str) {
    let d = dir(&format!("{:x}", table.len() * 31 + said.len()));
    let trace = three_mib(&d);
    let costs = d.join("costs.json");
    std::fs::write(&costs, table).unwrap();
    let (ok, _, err) = portalloc(
        &[
            "replay",
            &trace,
            "--strategies",
            "platform",
            "--device-costs",
            costs.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        !ok && err.contains("--device-costs") && err.contains(said),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Without a file, the built-in CUDA table prices vmm's VMM calls from the published A100
/// figures and names what it cannot price; every strategy's calls are counted by name, and
/// the total of the memory calls is still `device_calls`.
#[test]
fn the_built_in_table_names_what_it_cannot_price() {
    let d = dir("builtin");
    let trace = three_mib(&d);
    let results = replayed(&trace, &["--strategies", "vmm,platform"]);
    for r in results.as_array().unwrap() {
        let by_name = r["device_calls_by_name"].as_object().unwrap();
        assert!(!by_name.is_empty(), "{r}");
        let memory: u64 = by_name
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "create_event"
                        | "record_event"
                        | "event_complete"
                        | "synchronize_stream"
                        | "wait_event"
                        | "synchronize_event"
                        | "destroy_event"
                        | "mem_info"
                )
            })
            .map(|(_, v)| v.as_u64().unwrap())
            .sum();
        assert_eq!(memory, r["device_calls"].as_u64().unwrap(), "{r}");
    }
    let platform = &results[1];
    assert!(platform["device_time_model_s"].is_null(), "{platform}");
    let unpriced = unpriced(platform);
    assert_eq!(
        unpriced,
        ["alloc", "free", "synchronize_stream"],
        "{platform}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A preset's replay is priced by its own built-in table: h100-80g's prices the VMM calls
/// (A100, GB10 and H20 figures) and names its copies' source; mi300x's is HIP's, which prices
/// the same calls by the NVIDIA figures (no ROCm figure is published), so vmm's modelled time
/// there is known too, and both give a low and a high end (cuMemCreate's fit is a range).
#[test]
fn a_presets_replay_is_priced_by_its_own_table() {
    let d = dir("presets");
    let trace = three_mib(&d);
    let run = |device: &str| {
        let (ok, out, err) = portalloc(
            &[
                "replay",
                &trace,
                "--device",
                device,
                "--strategies",
                "vmm",
                "--json",
            ],
            &[],
        );
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["traces"][0].clone()
    };
    let h100 = run("h100-80g");
    let table = h100["device_costs"].as_str().unwrap();
    assert!(
        table.contains("CUDA table of h100-80g") && table.contains("copies on an H100"),
        "{h100}"
    );
    assert!(
        h100["results"][0]["device_time_model_s"].as_f64().unwrap() > 0.0,
        "{h100}"
    );
    let mi300x = run("mi300x");
    assert!(
        mi300x["device_costs"]
            .as_str()
            .unwrap()
            .contains("HIP table of mi300x"),
        "{mi300x}"
    );
    for r in [&h100["results"][0], &mi300x["results"][0]] {
        let low = r["device_time_model_s"].as_f64().unwrap();
        let high = r["device_time_model_high_s"].as_f64().unwrap();
        // Equal for 2 MiB handles (both ends pass through kvcached's 2 MiB point), dearer at
        // the high end for larger ones.
        assert!(low > 0.0 && high >= low, "{r}");
        assert!(
            r["device_calls_by_name"]["create_physical"]
                .as_u64()
                .unwrap()
                > 0,
            "{r}"
        );
    }
    assert!(
        mi300x["device_costs"]
            .as_str()
            .unwrap()
            .contains("measured on NVIDIA GPUs"),
        "{mi300x}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
