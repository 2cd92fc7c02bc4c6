//! The `portalloc` command line, run as a user runs it.
#![cfg(feature = "cli")]

use crate::support::common::{assert_mentions_all, bfc, simulated_host};
use std::process::Command;

use crate::support::cli::portalloc;

/// Runs `portalloc` with `args` and `env`, which must fail: its standard error.
fn portalloc_fails(args: &[&str], env: &[(&str, &str)]) -> String {
    let (ok, out, err) = portalloc(args, env);
    assert!(!ok, "{args:?} succeeded: {out}");
    err
}

/// The error mentions `needle` and is short (under 1000 bytes), whatever the input's size.
fn assert_short_error(err: &str, needle: &str) {
    assert!(
        err.contains(needle) && err.len() < 1000,
        "{} bytes: {:.300}",
        err.len(),
        err
    );
}

/// Runs `portalloc` with `args` and `env`, which must succeed and print JSON: the JSON.
fn portalloc_json(args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let (ok, out, err) = portalloc(args, env);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

fn cuda_library() -> Option<String> {
    std::env::var("PORTALLOC_TEST_CUDA_LIBRARY")
        .ok()
        .filter(|p| !p.is_empty())
}

#[test]
fn info_prints_discovery_devices_and_configuration() {
    let (ok, out, err) = portalloc(
        &["info"],
        &[
            ("XLA_CLIENT_MEM_FRACTION", "0.5"),
            ("PORTALLOC_HOST_CAPACITY", "80GiB"),
        ],
    );
    assert!(ok, "{err}");
    assert_mentions_all(
        &out,
        &[
            "Discovery",
            "host ",
            "chosen",
            "Devices (host)",
            "80.00 GiB total",
            "Configuration",
            "mem_fraction",
            "XLA_CLIENT_MEM_FRACTION",
            "40.00 GiB",
        ],
    );
}

/// `portalloc info` with `env` succeeds and mentions every one of `needles`.
fn info_mentions(env: &[(&str, &str)], needles: &[&str]) {
    let (ok, out, err) = portalloc(&["info"], env);
    assert!(ok, "{err}");
    assert_mentions_all(&out, needles);
}

/// `info` shows peer access per device as the setting asks (off by default, naming the
/// switch), and the settings that come from the library and HIP variables with their sources.
#[test]
fn info_shows_peer_access_and_every_setting_with_its_source() {
    let two_hosts = [
        ("PORTALLOC_BACKEND", "host"),
        ("PORTALLOC_HOST_DEVICES", "2"),
        ("PORTALLOC_HOST_SIMULATED", "1"),
    ];
    info_mentions(
        &two_hosts,
        &[
            "peer access: none (peer access is off, the default; PORTALLOC_PEER_ACCESS=1",
            "peer_access      false              from default",
            "cuda_library     libcuda.so.1",
            "hsa_xnack        unset              from default",
        ],
    );
    let mut on = two_hosts.to_vec();
    on.extend([
        ("PORTALLOC_PEER_ACCESS", "1"),
        ("PORTALLOC_CUDA_LIBRARY", "/opt/nv/libcuda.so.1"),
        ("ROCM_PATH", "/opt/rocm-6.2"),
        ("PORTALLOC_HIP_MEMORY", "fine"),
        ("HSA_XNACK", "0"),
        ("PORTALLOC_BACKTRACE", "yes"),
    ]);
    info_mentions(
        &on,
        &[
            "peer access: device 1",
            "peer access: device 0",
            "peer_access      true               from PORTALLOC_PEER_ACCESS",
            "cuda_library     /opt/nv/libcuda.so.1 from PORTALLOC_CUDA_LIBRARY",
            "rocm_path        /opt/rocm-6.2      from ROCM_PATH",
            "hip_memory       fine               from PORTALLOC_HIP_MEMORY",
            "hsa_xnack        0                  from HSA_XNACK",
            "backtrace        true               from PORTALLOC_BACKTRACE",
        ],
    );
    let err = portalloc_fails(&["info"], &[("HSA_XNACK", "yes")]);
    assert_mentions_all(&err, &["HSA_XNACK", "yes", "0 or 1"]);
}

#[test]
fn info_json_reports_each_probe() {
    let mut env = vec![
        ("PORTALLOC_HOST_SIMULATED", "1"),
        ("PORTALLOC_HOST_CAPACITY", "141GiB"),
    ];
    let lib = cuda_library();
    if let Some(lib) = &lib {
        env.push(("PORTALLOC_CUDA_LIBRARY", lib.as_str()));
    }
    let v = portalloc_json(&["info", "--json"], &env);
    assert_eq!(v["discovery"]["chosen"], "host");
    assert_eq!(v["devices"][0]["info"]["total_bytes"], 141u64 << 30);
    let candidates = v["discovery"]["candidates"].as_array().unwrap();
    let host = candidates.iter().find(|c| c["backend"] == "host").unwrap();
    assert_eq!(host["decision"]["decision"], "chosen");
    if cfg!(feature = "cuda") {
        let cuda = candidates.iter().find(|c| c["backend"] == "cuda").unwrap();
        if let Some(lib) = &lib {
            assert_eq!(cuda["probe"]["library"], lib.as_str());
            let reason = cuda["decision"]["reason"].as_str().unwrap();
            assert!(
                reason.contains("CUDA_ERROR_NO_DEVICE") || reason.contains("found"),
                "{reason}"
            );
        }
    }
}

/// `portalloc info` on a HIP device says what releasing physical memory gives back, as the
/// probe at open found it: fakehip as ROCm 7 with the `rocm7-reservation-hold` profile holds
/// it until the reservation is freed, and the line says what vmm does about it; under the
/// documented profile it is returned at release. `--json` answers it per device.
#[cfg(feature = "hip")]
#[test]
fn info_says_what_a_release_gives_back_on_hip() {
    let fakehip = crate::support::driver("fakehip").to_string();
    let env = |profile| {
        [
            ("PORTALLOC_HIP_LIBRARY", fakehip.clone()),
            ("PORTALLOC_CUDA_LIBRARY", "/nonexistent/libcuda.so.1".into()),
            ("FAKEHIP_VERSION", "7.0".into()),
            ("FAKEHIP_PROFILE", String::from(profile)),
        ]
    };
    let held = env("rocm7-reservation-hold");
    let held: Vec<(&str, &str)> = held.iter().map(|(k, v)| (*k, v.as_str())).collect();
    info_mentions(
        &held,
        &[
            "Devices (hip)",
            "released memory: held until its reservation is freed (probed: releasing an \
             unmapped 2.00 MiB handle gave back 0 B, then 0 B; freeing the reservation, with \
             the 2 released handles it held, gave back 4.00 MiB) — the vmm strategy frees \
             whole segments of 256 MiB that nothing awake uses and reserves them again at the \
             same address, so its sleep and trim return memory",
        ],
    );
    let v = portalloc_json(&["info", "--json"], &held);
    assert_eq!(v["devices"][0]["holds_released_memory"], true);
    let documented = env("documented");
    let documented: Vec<(&str, &str)> = documented.iter().map(|(k, v)| (*k, v.as_str())).collect();
    info_mentions(
        &documented,
        &[
            "released memory: returned at release (probed: releasing an unmapped 2.00 MiB handle \
           gave back 2.00 MiB)",
        ],
    );
    let v = portalloc_json(&["info", "--json"], &documented);
    assert_eq!(v["devices"][0]["holds_released_memory"], false);
    // A host device has no probe: nothing to hold, the value is its default.
    let v = portalloc_json(&["info", "--json"], &[("PORTALLOC_BACKEND", "host")]);
    assert_eq!(v["devices"][0]["holds_released_memory"], false);
}

/// `portalloc info` says the process's descriptor limits on every backend, and on HIP under
/// ROCm 7.14's descriptor per handle (the fakes' `rocm7-descriptor-per-handle`) what the probe
/// at open found and how many more handles the process can hold; `--json` has both.
#[cfg(feature = "hip")]
#[test]
fn info_says_the_descriptor_limit_and_the_handle_budget() {
    let p = portalloc_fakes::profile("rocm7-descriptor-per-handle").unwrap();
    let mut env: Vec<(String, String)> = vec![
        (
            "PORTALLOC_HIP_LIBRARY".into(),
            crate::support::driver("fakehip").into(),
        ),
        (
            "PORTALLOC_CUDA_LIBRARY".into(),
            "/nonexistent/libcuda.so.1".into(),
        ),
    ];
    env.extend(p.vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    info_mentions(
        &env,
        &[
            "Devices (hip)",
            "descriptors per handle: one file descriptor per physical handle (probed",
            "handle budget: ",
            "more physical handles (one file descriptor each)",
            "Process",
            "file descriptors: ",
            "open of a soft limit of ",
        ],
    );
    let v = portalloc_json(&["info", "--json"], &env);
    let budget = v["devices"][0]["handle_budget"].as_u64().expect("a budget");
    let soft = v["descriptors"]["soft"]
        .as_u64()
        .expect("a soft limit here");
    assert!(budget > 0 && budget < soft, "{budget} of {soft}");
    // The documented profile spends no descriptor: no budget, and the note says so.
    let documented: Vec<(&str, &str)> = env
        .iter()
        .map(|&(k, v)| {
            if k == "FAKEHIP_PROFILE" {
                (k, "documented")
            } else {
                (k, v)
            }
        })
        .collect();
    info_mentions(&documented, &["descriptors per handle: none (probed"]);
    let v = portalloc_json(&["info", "--json"], &documented);
    assert!(
        v["devices"][0]["handle_budget"].is_null(),
        "{}",
        v["devices"][0]
    );
    let v = portalloc_json(&["info", "--json"], &[("PORTALLOC_BACKEND", "host")]);
    assert!(
        v["descriptors"]["open"].as_u64().is_some_and(|n| n >= 3),
        "{}",
        v["descriptors"]
    );
}

#[test]
fn forcing_an_unusable_backend_is_an_error_with_the_reason() {
    let Some(lib) = cuda_library() else {
        eprintln!("skipping: PORTALLOC_TEST_CUDA_LIBRARY is not set (run scripts/test)");
        return;
    };
    if !cfg!(feature = "cuda") {
        return;
    }
    let err = portalloc_fails(
        &["info"],
        &[
            ("PORTALLOC_BACKEND", "cuda"),
            ("PORTALLOC_CUDA_LIBRARY", &lib),
        ],
    );
    assert!(err.contains("PORTALLOC_BACKEND forces cuda"), "{err}");
    assert!(err.contains("CUDA_ERROR_NO_DEVICE"), "{err}");
}

#[test]
fn a_bad_variable_fails_naming_variable_value_and_accepted_values() {
    let err = portalloc_fails(&["info"], &[("XLA_PYTHON_CLIENT_ALLOCATOR", "bogus")]);
    assert_mentions_all(
        &err,
        &[
            "XLA_PYTHON_CLIENT_ALLOCATOR",
            "bogus",
            "platform",
            "cuda_async",
        ],
    );
}

#[test]
fn surprising_jax_values_warn() {
    let (ok, out, _) = portalloc(&["info"], &[("XLA_PYTHON_CLIENT_PREALLOCATE", "FALSE")]);
    assert!(ok);
    assert!(out.contains("warning:"), "{out}");
}

/// The header line of a trace in portalloc's own format.
const TRACE_HEADER: &str = "{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n";

/// Writes a trace in portalloc's own format: [`TRACE_HEADER`], then `body`.
fn write_trace(path: &std::path::Path, body: &str) {
    std::fs::write(path, format!("{TRACE_HEADER}{body}")).unwrap();
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("portalloc-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const SMALL_MODEL: &[&str] = &[
    "--workload",
    "transformer-train",
    "--layers",
    "2",
    "--hidden",
    "128",
    "--batch",
    "2",
    "--seq",
    "64",
    "--vocab",
    "1000",
];

#[test]
fn replay_of_a_workload_prints_a_table_per_strategy() {
    let mut args = vec!["replay"];
    args.extend_from_slice(SMALL_MODEL);
    args.extend_from_slice(&["--strategies", "bfc,bfc-grow,platform", "--min-capacity"]);
    let (ok, out, err) = portalloc(&args, &[]);
    assert!(ok, "{err}");
    assert_mentions_all(
        &out,
        &[
            "transformer-train (layers 2, hidden 128",
            "peak live",
            "peak reserved",
            "min capacity",
            "bfc-grow",
            "platform",
        ],
    );
}

#[test]
fn replay_json_and_plot() {
    let dir = temp_dir("plot");
    let svg = dir.join("timeline.svg");
    let mut args = vec!["replay"];
    args.extend_from_slice(SMALL_MODEL);
    let svg_arg = svg.to_string_lossy().into_owned();
    args.extend_from_slice(&[
        "--strategies",
        "bfc,platform",
        "--json",
        "--min-capacity",
        "--plot",
        &svg_arg,
        "--capacity",
        "4GiB",
    ]);
    let v = portalloc_json(&args, &[]);
    let results = v["traces"][0]["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["strategy"], "bfc");
    let live = results[0]["peak_live"].as_u64().unwrap();
    assert!(live > 0);
    assert_eq!(
        results[1]["peak_live"].as_u64().unwrap(),
        live,
        "the same trace, the same demand"
    );
    assert!(results[0]["min_capacity"]["bytes"].as_u64().unwrap() >= live);
    assert_eq!(v["traces"][0]["device"]["capacity"], 4u64 << 30);
    let drawn = std::fs::read_to_string(&svg).expect("plot written");
    assert!(
        drawn.contains("<svg") && drawn.contains("bfc reserved"),
        "plot lacks its series"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// The attribute `name` of the SVG tag `tag` (`<rect x="1" …/>`).
fn svg_attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    Some(&tag[start..start + tag[start..].find('"')?])
}

/// The opening tags of every `<element` in `svg`, and the text up to the next `<` after each
/// (trimmed: plotters puts a text's content on lines of its own).
fn svg_elements<'a>(svg: &'a str, element: &str) -> Vec<(&'a str, &'a str)> {
    svg.match_indices(&format!("<{element} "))
        .map(|(at, _)| {
            let tag = &svg[at..at + svg[at..].find('>').unwrap()];
            let body = &svg[at + tag.len() + 1..];
            (tag, body[..body.find('<').unwrap_or(body.len())].trim())
        })
        .collect()
}

/// A rectangle `(x0, y0, x1, y1)` in pixels from a `<rect>`.
fn svg_rect(tag: &str) -> (i64, i64, i64, i64) {
    let n = |a| svg_attr(tag, a).unwrap().parse::<i64>().unwrap();
    (n("x"), n("y"), n("x") + n("width"), n("y") + n("height"))
}

fn inside((x, y): (i64, i64), (x0, y0, x1, y1): (i64, i64, i64, i64)) -> bool {
    (x0..=x1).contains(&x) && (y0..=y1).contains(&y)
}

/// The plot of a trace with a long file name, replayed by bfc and platform: the legend has a
/// box of its own outside the chart's frame, with every line's sample and label in it and
/// every data line inside the frame; platform (which holds exactly what is live) is named as
/// lying under the live line; the title, too long for the panel, is wrapped into lines that
/// carry the whole name between them.
#[test]
fn plot_keeps_the_legend_off_the_data_and_wraps_a_long_title() {
    let dir = temp_dir("plot-layout");
    let name = "a-snapshot-of-the-caching-allocator-from-a-long-training-run-of-a-large-model-on-eight-gpus-rank-0";
    let path = dir.join(format!("{name}.jsonl"));
    let mut trace = String::from(
        r#"{"format":"portalloc-trace","version":1,"source":"test","baseline_bytes":0,"tags":[],"notes":[]}"#,
    );
    trace.push('\n');
    let mut seq = 0;
    let mut event = |kind: &str, id: u64, size: u64| {
        trace.push_str(&format!("[{seq},{seq},0,0,\"{kind}\",{id},{size}]\n"));
        seq += 1;
    };
    let size = |id: u64| (id % 7 + 1) << 20;
    for id in 1..=60u64 {
        event("a", id, size(id));
        if id % 3 == 0 {
            event("f", id - 1, size(id - 1));
        }
    }
    for id in (1..=60u64).filter(|id| id % 3 != 2) {
        event("f", id, size(id));
    }
    trace.push_str(&format!("{{\"end\":{{\"events\":{seq}}}}}\n"));
    std::fs::write(&path, trace).unwrap();
    let svg = dir.join("layout.svg");
    let (trace_arg, svg_arg) = (
        path.to_string_lossy().into_owned(),
        svg.to_string_lossy().into_owned(),
    );
    let (ok, _, err) = portalloc(
        &[
            "replay",
            &trace_arg,
            "--strategies",
            "bfc,platform",
            "--capacity",
            "4GiB",
            "--plot",
            &svg_arg,
        ],
        &[],
    );
    assert!(ok, "{err}");
    let drawn = std::fs::read_to_string(&svg).expect("plot written");

    let rects = svg_elements(&drawn, "rect");
    let with_stroke = |colour: &str| -> Vec<(i64, i64, i64, i64)> {
        rects
            .iter()
            .filter(|(t, _)| svg_attr(t, "stroke") == Some(colour))
            .map(|(t, _)| svg_rect(t))
            .collect()
    };
    let frames = with_stroke("#A0A0A0");
    let legends = with_stroke("#C8C8C8");
    assert_eq!(
        (frames.len(), legends.len()),
        (1, 1),
        "one panel: {rects:?}"
    );
    let (frame, legend) = (frames[0], legends[0]);
    assert!(
        legend.0 > frame.2 || legend.2 < frame.0 || legend.1 > frame.3 || legend.3 < frame.1,
        "the legend box {legend:?} overlaps the chart's frame {frame:?}"
    );

    // Every line with a point in the legend box lies wholly in it (the legend's samples);
    // every line with a point in the frame lies wholly in the frame (the data; the axes and
    // ticks lie outside both).
    let (mut in_legend, mut in_frame) = (0, 0);
    for (tag, _) in svg_elements(&drawn, "polyline") {
        let points: Vec<(i64, i64)> = svg_attr(tag, "points")
            .unwrap()
            .split_whitespace()
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        for (region, count, what) in [
            (legend, &mut in_legend, "legend box"),
            (frame, &mut in_frame, "frame"),
        ] {
            if points.iter().any(|&p| inside(p, region)) {
                assert!(
                    points.iter().all(|&p| inside(p, region)),
                    "a line crosses the edge of the {what} {region:?}: {points:?}"
                );
                *count += 1;
            }
        }
    }
    let texts = svg_elements(&drawn, "text");
    let labels: Vec<&(&str, &str)> = texts
        .iter()
        .filter(|(_, body)| body.contains("reserved (peak") || body.starts_with("live ("))
        .collect();
    assert_eq!(labels.len(), 3, "{texts:?}");
    for (tag, body) in &labels {
        let at = |a| svg_attr(tag, a).unwrap().parse::<i64>().unwrap();
        assert!(
            inside((at("x"), at("y")), legend),
            "label {body:?} outside the legend box {legend:?}"
        );
    }
    assert!(
        labels
            .iter()
            .any(|(_, body)| body.starts_with("platform reserved")
                && body.contains("under the live line")),
        "platform's line lies under the live line and the legend says so: {labels:?}"
    );

    // The title: the text above the chart's frame.
    let title: Vec<&str> = texts
        .iter()
        .filter(|(tag, _)| svg_attr(tag, "y").unwrap().parse::<i64>().unwrap() < frame.1)
        .map(|(_, body)| *body)
        .collect();
    assert!(title.len() >= 2, "the long title is one line: {title:?}");
    assert!(
        title.iter().all(|line| line.chars().count() <= 80),
        "a title line longer than 80 characters: {title:?}"
    );
    assert!(
        title.concat().contains(name) && !title.iter().any(|line| line.contains(name)),
        "the name is split across the title's lines: {title:?}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn replay_reads_the_own_format_and_strict_mode_names_the_line() {
    let dir = temp_dir("own");
    let path = dir.join("t.jsonl");
    std::fs::write(
        &path,
        concat!(
            r#"{"format":"portalloc-trace","version":1,"source":"test","baseline_bytes":0,"tags":[],"notes":[]}"#,
            "\n[0,0,0,0,\"a\",1,1048576]\n[1,1,0,0,\"f\",1,1048576]\n[2,2,0,0,\"f\",1,1048576]\n",
            r#"{"end":{"events":3}}"#,
            "\n"
        ),
    )
    .unwrap();
    let p = path.to_string_lossy().into_owned();
    let (ok, out, err) = portalloc(&["replay", &p, "--strategies", "bfc"], &[]);
    assert!(ok, "{err}");
    assert!(
        out.contains("anomalies"),
        "a double free is reported:\n{out}"
    );
    let err = portalloc_fails(&["replay", &p, "--strict"], &[]);
    assert!(err.contains("line 4"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn replay_refuses_bad_input_with_what_is_accepted() {
    let err = portalloc_fails(&["replay", "/nonexistent/trace.json"], &[]);
    assert!(err.contains("/nonexistent/trace.json"), "{err}");
    let mut args = vec!["replay"];
    args.extend_from_slice(SMALL_MODEL);
    args.extend_from_slice(&["--strategies", "best"]);
    let err = portalloc_fails(&args, &[]);
    assert!(err.contains("bfc-grow"), "{err}");
    let err = portalloc_fails(&["replay", "--workload", "resnet"], &[]);
    assert!(err.contains("transformer-train"), "{err}");
    let err = portalloc_fails(&["replay"], &[]);
    assert!(err.contains("--workload"), "{err}");
    let err = portalloc_fails(
        &["replay", "--workload", "transformer-train", "--layers", "0"],
        &[],
    );
    assert!(!err.is_empty());
}

/// A snapshot portalloc itself wrote, with a tag of 70,000 characters and one carrying a
/// terminal escape: `portalloc ledger` prints it (the tag cut to its column, the escape
/// escaped) rather than panicking ("Formatting argument out of range" at 65,536).
#[test]
fn ledger_prints_a_snapshot_with_a_huge_tag() {
    use portalloc::adaptor::LedgerAllocator;
    use portalloc::{Allocator, Stream};

    let ledger = LedgerAllocator::new(bfc(&simulated_host(64 << 20), 32 << 20, false));
    let huge = "x".repeat(70_000);
    let a = ledger.allocate(4096, 0, Stream::DEFAULT, &huge).unwrap();
    let b = ledger
        .allocate(4096, 0, Stream::DEFAULT, "red\u{1b}[31mtext")
        .unwrap();
    let path = std::env::temp_dir().join(format!("portalloc-huge-tag-{}.json", std::process::id()));
    ledger.write_json(&path).unwrap();
    let (ok, out, err) = portalloc(&["ledger", path.to_str().unwrap()], &[]);
    let _ = std::fs::remove_file(&path);
    assert!(ok, "{err}");
    assert!(out.contains("xxxxxxxx…"), "{out}");
    assert!(
        !out.contains('\u{1b}'),
        "the escape reached the terminal: {out}"
    );
    assert!(out.contains("red\\u{1b}[31mtext"), "{out}");
    let longest = out.lines().map(|l| l.chars().count()).max().unwrap();
    assert!(longest < 200, "a line of {longest} characters");
    for x in [a, b] {
        ledger.deallocate(x).unwrap();
    }
}

/// The issue's reproducers, as a user types them (#12 bug 5 and the smaller ones): a trace
/// that needs 100 GiB reports peak live 100 GiB on an 80 GB device that runs out, and its
/// min capacity; capacities of 0 and 1 byte are refused naming `--capacity`; a request
/// within 255 B of u64::MAX stops the replay naming the file and the event.
#[test]
fn replay_reports_the_demand_and_refuses_what_it_cannot_simulate() {
    let dir = temp_dir("demand");
    let big = dir.join("g.jsonl");
    write_trace(
        &big,
        "[0,0,0,0,\"a\",1,107374182400]\n[1,0,0,0,\"f\",1,107374182400]\n{\"end\":{\"events\":2}}\n",
    );
    let big = big.to_string_lossy().into_owned();
    let args = [
        "replay",
        &big,
        "--strategies",
        "bfc,platform",
        "--min-capacity",
        "--json",
    ];
    let v = portalloc_json(&args, &[]);
    for r in v["traces"][0]["results"].as_array().unwrap() {
        assert_eq!(r["peak_live"], 107_374_182_400_u64, "{r}");
        assert_eq!(r["oom_count"], 1, "{r}");
        let min = r["min_capacity"]["bytes"].as_u64().expect("a min capacity");
        assert!((100 << 30..=101 << 30).contains(&min), "{r}");
    }
    for capacity in ["0", "1", "2TiB"] {
        let err = portalloc_fails(&["replay", &big, "--capacity", capacity], &[]);
        assert!(err.contains("--capacity") && err.contains("1TiB"), "{err}");
    }
    let huge = dir.join("h.jsonl");
    write_trace(
        &huge,
        "[0,0,0,0,\"a\",1,18446744073709551515]\n{\"end\":{\"events\":1}}\n",
    );
    let err = portalloc_fails(&["replay", huge.to_str().unwrap()], &[]);
    assert!(err.contains("h.jsonl") && err.contains("event 0"), "{err}");
}

/// A trace from a pipe or a FIFO replays like a file (#12 bug 6): it was reopened for each
/// pass, so a pipe said "the input is empty" and a FIFO hung for ever.
#[test]
fn replay_reads_pipes_and_fifos() {
    let trace = format!(
        "{TRACE_HEADER}[0,0,0,0,\"a\",1,1048576]\n[1,0,0,0,\"f\",1,1048576]\n{{\"end\":{{\"events\":2}}}}\n"
    );
    let (ok, out, err) = crate::support::cli::run(
        &[
            "replay",
            "/dev/stdin",
            "--strategies",
            "bfc,platform",
            "--min-capacity",
        ],
        &[],
        Some(trace.as_bytes()),
    );
    let text = out + &err;
    assert!(ok, "{text}");
    assert!(
        text.contains("peak live") && text.contains("platform"),
        "{text}"
    );

    let dir = temp_dir("fifo");
    let fifo = dir.join("trace.fifo");
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipping the FIFO half: mkfifo is not available");
        return;
    }
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(fifo, trace).unwrap())
    };
    let (ok, out, err) = portalloc(
        &[
            "replay",
            fifo.to_str().unwrap(),
            "--strategies",
            "bfc,vmm",
            "--min-capacity",
        ],
        &[],
    );
    writer.join().unwrap();
    assert!(ok, "{err}");
    assert!(out.contains("vmm"), "{out}");
}

/// Lines and fields of any length are refused as they are read, and messages quote a
/// bounded excerpt (#12 bug 7): a 10 MB CSV field gave a 10 MB error, a 300 MB line took
/// 0.8 GB before any check.
#[test]
fn long_lines_and_fields_give_short_errors() {
    let dir = temp_dir("long");
    let field = dir.join("field.csv");
    let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n1,0.5,allocate,0x10,");
    text.push_str(&"9x".repeat(5_000_000));
    text.push_str(",0x0\n");
    std::fs::write(&field, &text).unwrap();
    let err = portalloc_fails(
        &["replay", field.to_str().unwrap(), "--format", "rmm-csv"],
        &[],
    );
    assert_short_error(&err, "Size");

    let line = dir.join("line.jsonl");
    let mut text = format!("{TRACE_HEADER}[0,0,0,0,\"a\",1,");
    text.push_str(&"1".repeat(20 << 20));
    text.push_str("]\n");
    std::fs::write(&line, &text).unwrap();
    let err = portalloc_fails(&["replay", line.to_str().unwrap()], &[]);
    assert_short_error(&err, "16 MiB");
}

/// A variable whose value is not UTF-8 is an error naming it, not ignored as if unset
/// (#12 bug 8: `XLA_CLIENT_MEM_FRACTION=$'\xff' portalloc info` showed 0.75 "from default").
#[test]
fn variables_that_are_not_utf8_are_errors_naming_them() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    let bad = OsStr::from_bytes(b"0.5\xff");
    for var in [
        "XLA_CLIENT_MEM_FRACTION",
        "PORTALLOC_BACKEND",
        "PORTALLOC_HOST_CAPACITY",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_portalloc"))
            .arg("info")
            .env(var, bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}: {err}");
        assert!(err.contains(var) && err.contains("UTF-8"), "{var}: {err}");
    }
    // A library path that is not UTF-8: the probe says so instead of looking elsewhere.
    let out = Command::new(env!("CARGO_BIN_EXE_portalloc"))
        .args(["info", "--json"])
        .env(
            "PORTALLOC_CUDA_LIBRARY",
            OsStr::from_bytes(b"/opt/\xfe/libcuda.so.1"),
        )
        .env_remove("PORTALLOC_BACKEND")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("PORTALLOC_CUDA_LIBRARY") && text.contains("UTF-8"),
        "{text}"
    );
}

/// A profiler trace's CPU events are picked with `--trace-device cpu`, and the memory live
/// before the window, which a CPU profile cannot know, is passed with `--baseline` (#13).
#[test]
fn replay_picks_the_cpu_and_takes_a_baseline() {
    let mem = |ts: u64, device_type: i64, addr: u64, bytes: i64| {
        format!(
            r#"{{"ph":"i","name":"[memory]","pid":1,"tid":1,"ts":{ts},"args":{{"Device Type":{device_type},"Device Id":0,"Addr":{addr},"Bytes":{bytes}}}}}"#
        )
    };
    let events = [
        mem(1, 1, 0x10, 1 << 20),
        mem(2, 0, 0x20, 3 << 20),
        mem(3, 0, 0x30, 5 << 20),
        mem(4, 0, 0x20, -(3 << 20)),
    ];
    let dir = temp_dir("cpu");
    let file = dir.join("profile.json");
    std::fs::write(&file, format!("{{\"traceEvents\":[{}]}}", events.join(","))).unwrap();
    let path = file.to_str().unwrap();
    let args = [
        "replay",
        path,
        "--trace-device",
        "cpu",
        "--baseline",
        "2MiB",
        "--strategies",
        "platform",
        "--json",
    ];
    let v = portalloc_json(&args, &[]);
    let t = &v["traces"][0];
    assert_eq!(t["header"]["device"], "cpu", "{t}");
    // 2 MiB before the window + 3 + 5 MiB at once.
    assert_eq!(t["results"][0]["peak_live"], 10u64 << 20, "{t}");
    let (ok, _, err) = portalloc(&["replay", path, "--trace-device", "gpu"], &[]);
    assert!(
        !ok && err.contains("--trace-device") && err.contains("cpu"),
        "{err}"
    );
}

/// A trace replayed as steps (`--repeat`): the JSON gives the driver calls of each step, the
/// table says them, and a step count out of range is refused naming what is accepted.
#[test]
fn replay_repeat_reports_the_driver_calls_per_step() {
    let dir = temp_dir("repeat");
    let path = dir.join("step.jsonl");
    // One step: 3 MiB and 64 KiB allocated, the 3 MiB freed; the 64 KiB stays live.
    write_trace(
        &path,
        "[0,0,0,0,\"a\",1,3145728]\n[1,1,0,0,\"a\",2,65536]\n[2,2,0,0,\"f\",1,3145728]\n{\"end\":{\"events\":3}}\n",
    );
    let p = path.to_str().unwrap();
    let json = portalloc_json(
        &[
            "replay",
            p,
            "--repeat",
            "4",
            "--strategies",
            "vmm,bfc-grow",
            "--json",
        ],
        &[],
    );
    for r in json["traces"][0]["results"].as_array().unwrap() {
        let steps = r["driver_calls_per_step"].as_array().unwrap();
        let calls: Vec<u64> = steps.iter().map(|s| s["calls"].as_u64().unwrap()).collect();
        assert_eq!(calls.len(), 4, "{r}");
        assert!(calls[0] > 0, "the first step makes the memory: {calls:?}");
        assert_eq!(&calls[2..], [0, 0], "{}: quiet once warm", r["strategy"]);
        assert!(r["driver_calls"].as_u64().unwrap() >= r["device_calls"].as_u64().unwrap());
        let before = r["driver_calls_before_steps"].as_u64().unwrap();
        assert_eq!(
            before + calls.iter().sum::<u64>(),
            r["driver_calls"].as_u64().unwrap()
        );
    }
    let (ok, out, err) = portalloc(&["replay", p, "--repeat", "3", "--strategies", "vmm"], &[]);
    assert!(ok, "{err}");
    assert_mentions_all(&out, &["driver calls per step", "step 1: ", "3: 0"]);
    let err = portalloc_fails(&["replay", p, "--repeat", "0"], &[]);
    assert_short_error(&err, "a number of passes from 1 to 1000");
    let mut workload_only = vec!["replay", "--repeat", "2"];
    workload_only.extend_from_slice(SMALL_MODEL);
    let err = portalloc_fails(&workload_only, &[]);
    assert_short_error(&err, "a built-in workload has steps of its own (--steps)");
    std::fs::remove_dir_all(&dir).ok();
}
