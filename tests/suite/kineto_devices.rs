//! Kineto traces of every device PyTorch's profiler records (issue #27): an accelerator of
//! any `c10::DeviceType` (CUDA 1, HIP 6, XPU 12, …) is a GPU, the CPU's events (type 0) are
//! replayed only when asked for, `--trace-device` chooses among the devices, the header
//! names what was replayed and what was skipped, and the numbers and names the file gives
//! are reported as what they are. Figures are checked against hand derivations and, for the
//! shared MI300X trace, against an independent reader (Python's `gzip` and `json`).
#![cfg(feature = "trace")]

use std::process::Command;

use portalloc::trace::{open, open_reader, summarize, AnomalyKind, Format, Options, Trace};
use serde_json::json;
use test_case::test_case;

/// A `[memory]` event of `Device Type` `device_type`, `Device Id` `id`: `bytes` at `addr`,
/// `total` allocated after it.
fn mem(ts: u64, device_type: i64, id: i64, addr: u64, bytes: i64, total: i64) -> serde_json::Value {
    json!({
        "ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
        "args": {
            "Device Type": device_type, "Device Id": id, "Addr": addr, "Bytes": bytes,
            "Total Allocated": total, "Total Reserved": 2 << 20
        }
    })
}

/// A Chrome trace of `events`, with `deviceProperties` naming device 0.
fn kineto(events: &[serde_json::Value]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "deviceProperties": [{"id": 0, "name": "AMD Instinct MI300X VF"}],
        "traceEvents": events,
    }))
    .unwrap()
}

/// `bytes` read as a Kineto trace (named `t.json`).
fn read(bytes: Vec<u8>, options: &Options) -> portalloc::trace::Result<Trace> {
    open_reader(std::io::Cursor::new(bytes), "t.json", options)
}

/// Two allocations and a free on each device named, in this order: 1 KiB and 2 KiB live at
/// once (peak 3 KiB), then the 1 KiB freed; 100 B were live before the window.
fn two_allocs(device_type: i64, id: i64, ts: u64) -> Vec<serde_json::Value> {
    let base = 0x10_0000 * (device_type as u64 + 1) + 0x1000 * (id + 1) as u64;
    vec![
        mem(ts, device_type, id, base, 1024, 100 + 1024),
        mem(ts + 1, device_type, id, base + 0x10, 2048, 100 + 3072),
        mem(ts + 2, device_type, id, base, -1024, 100 + 2048),
    ]
}

/// The events of `devices` (type, id), each device's [`two_allocs`], as one trace.
fn trace_of(devices: &[(i64, i64)]) -> Vec<u8> {
    let events: Vec<_> = devices
        .iter()
        .enumerate()
        .flat_map(|(i, &(t, id))| two_allocs(t, id, 10 * i as u64))
        .collect();
    kineto(&events)
}

/// The error `read` gives, as text (panics when it reads).
fn refusal(bytes: Vec<u8>, options: &Options) -> String {
    match read(bytes, options).and_then(summarize) {
        Ok(s) => panic!("read: {s:?}"),
        Err(e) => e.to_string(),
    }
}

/// A trace whose GPU events are all HIP's (`Device Type` 6, an MI300X under ROCm) is read as
/// a GPU's: before, it was refused ("only of device types [6]"). Hand derivation: 100 B
/// before the window, then +1024, +2048 → peak 3,172 B; the header names `hip:0` with the
/// device's name from `deviceProperties`.
#[test]
fn a_hip_only_trace_is_a_gpus() {
    let t = read(trace_of(&[(6, 0)]), &Options::default()).unwrap();
    let header = t.header().clone();
    let s = summarize(t).unwrap();
    assert_eq!(
        header.device.as_deref(),
        Some("hip:0 AMD Instinct MI300X VF")
    );
    assert_eq!(
        (s.events, s.baseline_bytes, s.peak_live_bytes),
        (3, 100, 3172)
    );
    assert!(
        !header.notes.iter().any(|n| n.starts_with("skipped")),
        "{:?}",
        header.notes
    );
}

/// Every accelerator type PyTorch defines is replayed as a GPU, and named as `torch.device`
/// names it.
#[test_case(1, "cuda:0" ; "cuda")]
#[test_case(6, "hip:0" ; "hip")]
#[test_case(8, "maia:0" ; "maia")]
#[test_case(9, "xla:0" ; "xla")]
#[test_case(12, "xpu:0" ; "xpu")]
#[test_case(13, "mps:0" ; "mps")]
#[test_case(15, "hpu:0" ; "hpu")]
#[test_case(19, "mtia:0" ; "mtia")]
#[test_case(20, "privateuseone:0" ; "privateuse1")]
#[test_case(31, "type31:0" ; "a type after PyTorch's")]
fn every_accelerator_type_is_a_gpu(device_type: i64, label: &str) {
    let t = read(trace_of(&[(0, -1), (device_type, 0)]), &Options::default()).unwrap();
    let device = t.header().device.clone().unwrap_or_default();
    assert!(device.starts_with(label), "{device}");
    assert_eq!(summarize(t).unwrap().peak_live_bytes, 3172);
}

/// A profile with CPU (type 0) and HIP (type 6) events replays HIP's, and its header lists
/// the CPU as skipped, by name — never the device replayed. Before, the CPU's events were
/// replayed (no type-1 events), and the header said "skipped: device type 0" for them.
#[test]
fn cpu_and_hip_replay_hip_and_skip_the_cpu() {
    // The CPU's events first, and more of them: neither order nor count picks the CPU.
    let mut events = Vec::new();
    for i in 0..4 {
        events.extend(two_allocs(0, -1, 100 * i));
    }
    events.extend(two_allocs(6, 0, 1000));
    let t = read(kineto(&events), &Options::default()).unwrap();
    let header = t.header().clone();
    assert_eq!(
        header.device.as_deref(),
        Some("hip:0 AMD Instinct MI300X VF")
    );
    let skipped: Vec<&String> = header
        .notes
        .iter()
        .filter(|n| n.starts_with("skipped"))
        .collect();
    assert_eq!(skipped, ["skipped: cpu (12 events)"], "{:?}", header.notes);
    assert!(
        header
            .notes
            .iter()
            .any(|n| n.contains("[memory] events of hip:0")),
        "{:?}",
        header.notes
    );
    assert_eq!(summarize(t).unwrap().events, 3);
}

/// A profile of the CPU alone is refused, saying that `--trace-device cpu` replays it (a
/// replay plans a GPU's memory; the CPU's is no stand-in unless asked for); asked for, it is
/// replayed, with the note that says what that assumes. Before, it was replayed unasked.
#[test]
fn a_cpu_only_profile_is_replayed_only_when_asked() {
    let bytes = trace_of(&[(0, -1)]);
    let why = refusal(bytes.clone(), &Options::default());
    assert!(
        why.contains("CPU only (3 events") && why.contains("--trace-device cpu"),
        "{why}"
    );
    for options in [
        Options::default().with_cpu(true),
        Options::default().with_device_spec("cpu").unwrap(),
    ] {
        let t = read(bytes.clone(), &options).unwrap();
        assert_eq!(t.header().device.as_deref(), Some("cpu"));
        assert!(t.header().notes.iter().any(|n| n.contains("as asked")));
        assert_eq!(summarize(t).unwrap().peak_live_bytes, 3172);
    }
}

/// `--trace-device` (`Options::with_device_spec`) chooses a device by type and ordinal, a
/// bare ordinal among the one GPU type present, a type alone (its busiest device); each
/// device of the trace below differs in its first address, so the events read tell which
/// was replayed. Before, only an ordinal or `cpu` was taken, of CUDA devices only.
#[test_case(&[(6, 0), (6, 1)], "hip:1", "hip:1" ; "hip by type and ordinal")]
#[test_case(&[(1, 0), (1, 1)], "cuda:1", "cuda:1" ; "cuda by type and ordinal")]
#[test_case(&[(1, 0), (1, 1)], "1", "cuda:1" ; "a bare ordinal of the one type")]
#[test_case(&[(6, 0), (6, 1)], "1", "hip:1" ; "a bare ordinal of hip")]
#[test_case(&[(1, 0), (12, 3)], "XPU", "xpu:3" ; "a type alone, any case")]
#[test_case(&[(0, -1), (6, 0)], "cpu", "cpu" ; "the cpu")]
fn trace_device_chooses(devices: &[(i64, i64)], spec: &str, chosen: &str) {
    let options = Options::default().with_device_spec(spec).unwrap();
    let t = read(trace_of(devices), &options).unwrap();
    let device = t.header().device.clone().unwrap_or_default();
    assert_eq!(device.split(' ').next(), Some(chosen), "{device}");
    let skipped = t.header().notes.iter().find(|n| n.starts_with("skipped"));
    assert!(
        skipped.is_some_and(|n| !n.contains(&format!("{chosen} "))),
        "{skipped:?}"
    );
    let s = summarize(t).unwrap();
    assert_eq!((s.events, s.peak_live_bytes), (3, 3172));
}

/// What `--trace-device` cannot choose, refused with what the trace holds: a bare ordinal
/// where two GPU types have events (ambiguous: both listed, and how to name one); a device
/// or type without events.
#[test_case(&[(1, 0), (6, 0)], "0", &["ambiguous", "cuda:0 (3 events)", "hip:0 (3 events)", "cuda:0"] ; "a bare ordinal of two types")]
#[test_case(&[(6, 0)], "cuda:0", &["no [memory] events on device 0 (cuda:0)", "hip:0 (3 events)"] ; "a type absent")]
#[test_case(&[(6, 0)], "hip:2", &["no [memory] events on device 2 (hip:2)", "hip:0 (3 events)"] ; "an ordinal absent")]
#[test_case(&[(6, 0)], "xpu", &["no [memory] events of xpu (Device Type 12)", "hip:0"] ; "a type alone absent")]
#[test_case(&[(6, 0)], "cpu", &["no CPU [memory] events", "hip:0"] ; "no cpu")]
fn trace_device_refuses(devices: &[(i64, i64)], spec: &str, said: &[&str]) {
    let options = Options::default().with_device_spec(spec).unwrap();
    let why = refusal(trace_of(devices), &options);
    for s in said {
        assert!(why.contains(s), "{s:?} not in {why}");
    }
}

/// Specs that name no device are refused as configuration, naming the flag and what it takes.
#[test_case("gpu" ; "not a device type")]
#[test_case("cuda:" ; "no ordinal after the colon")]
#[test_case("cuda:-1" ; "a negative ordinal")]
#[test_case("+1" ; "a sign")]
#[test_case("cpu:0" ; "an ordinal of the cpu")]
#[test_case("4294967296" ; "an ordinal beyond 32 bits")]
fn device_specs_refused(spec: &str) {
    let Err(e) = Options::default().with_device_spec(spec) else {
        panic!("{spec} accepted");
    };
    let e = e.to_string();
    assert!(e.contains("--trace-device") && e.contains("cuda:1"), "{e}");
}

/// A number where an integer is read that is a fraction, or beyond its range, is reported as
/// such, naming the field and the event — not as a missing field (before: "[memory] event
/// without Bytes"; a `Total Allocated` beyond i64 was silently dropped). serde_json reads an
/// integer beyond 64 bits as the nearest float: 2^64 is shown as `1.8446744073709552e19`.
#[test_case(r#""Bytes": 1.5"#, "event 1: Bytes 1.5 is not an integer" ; "a fractional bytes")]
#[test_case(r#""Bytes": 18446744073709551616"#, "event 1: Bytes 1.8446744073709552e19 is out of range" ; "bytes of 2^64")]
#[test_case(r#""Bytes": 9223372036854775808"#, "event 1: Bytes 9223372036854775808 is out of range" ; "bytes of 2^63")]
#[test_case(r#""Bytes": 100, "Total Allocated": 9223372036854775808"#, "event 1: Total Allocated 9223372036854775808 is out of range" ; "total allocated beyond i64")]
#[test_case(r#""Bytes": 100, "Total Reserved": -1"#, "event 1: Total Reserved -1 is out of range" ; "a negative total reserved")]
#[test_case(r#""Bytes": 100, "Addr": 1e30"#, "event 1: Addr 1e30 is out of range" ; "an address beyond 64 bits")]
fn out_of_range_numbers_are_named(args: &str, said: &str) {
    let text = format!(
        r#"{{"traceEvents": [{{"name": "[memory]", "ph": "i", "ts": 1, "args": {{"Device Type": 1, "Device Id": 0, {args}}}}}]}}"#
    );
    let t = read(text.clone().into_bytes(), &Options::default()).unwrap();
    let anomalies = t.anomalies().clone();
    let examples: Vec<String> = anomalies
        .examples(AnomalyKind::InvalidRecord)
        .map(|a| a.to_string())
        .collect();
    assert!(
        examples.iter().any(|e| e.starts_with(said)),
        "{said:?} not in {examples:?}"
    );
    // Strict, the same is an error naming the file, the event and the field.
    let why = refusal(text.into_bytes(), &Options::default().with_strict(true));
    assert!(why.contains("t.json") && why.contains(said), "{why}");
}

/// An address written as a negative integer (a pointer printed as `intptr_t`, its top bit
/// set) is the same 64 bits: its free matches its allocation. Before, it got a synthetic
/// address, with a note that the trace had no `Addr`.
#[test]
fn a_negative_address_is_its_64_bits() {
    let events = [
        json!({"name": "[memory]", "ph": "i", "ts": 1, "args": {"Device Type": 1, "Addr": -4096, "Bytes": 512}}),
        json!({"name": "[memory]", "ph": "i", "ts": 2, "args": {"Device Type": 1, "Addr": 18446744073709547520u64, "Bytes": -512}}),
    ];
    let t = read(kineto(&events), &Options::default().with_strict(true)).unwrap();
    assert!(
        !t.header().notes.iter().any(|n| n.contains("synthetic")),
        "{:?}",
        t.header().notes
    );
    let s = summarize(t).unwrap();
    assert_eq!((s.allocs, s.frees, s.final_live), (1, 1, 0));
}

/// A UTF-8 byte-order mark before the JSON is skipped (before: "corrupt JSON at line 1
/// column 1: expected value"); a lone 0xEF is refused as what it is.
#[test]
fn a_byte_order_mark_is_skipped() {
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    bytes.extend(trace_of(&[(1, 0)]));
    let options = Options::default().with_format(Format::Kineto);
    let s = summarize(read(bytes.clone(), &options).unwrap()).unwrap();
    assert_eq!((s.events, s.peak_live_bytes), (3, 3172));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &bytes).unwrap();
    let gzipped = gz.finish().unwrap();
    let s = summarize(read(gzipped, &options).unwrap()).unwrap();
    assert_eq!(s.events, 3, "gzip'd");

    let mut lone = b"\xEF".to_vec();
    lone.extend(trace_of(&[(1, 0)]));
    let why = refusal(lone, &options);
    assert!(why.contains("byte-order mark"), "{why}");
}

/// A device name holding control characters (ESC, which drives a terminal) is escaped in
/// the header, and a long one is cut. Before, it was printed raw, at any length.
#[test]
fn a_device_name_is_escaped_and_cut() {
    let name = format!("evil\u{1b}[31mred{}", "x".repeat(10_000));
    let bytes = serde_json::to_vec(&json!({
        "deviceProperties": [{"id": 0, "name": name}],
        "traceEvents": two_allocs(1, 0, 0),
    }))
    .unwrap();
    let t = read(bytes, &Options::default()).unwrap();
    let device = t.header().device.clone().unwrap_or_default();
    assert!(!device.chars().any(char::is_control), "{device:?}");
    assert!(
        device.starts_with(r"cuda:0 evil\u{1b}[31mred"),
        "{device:?}"
    );
    assert!(
        device.chars().count() < 100 && device.ends_with('…'),
        "{device:?}"
    );
}

/// `portalloc replay --trace-device hip:0` replays the HIP device of a CPU + HIP profile,
/// and an ambiguous bare ordinal fails with a message naming both devices.
#[test]
fn the_cli_takes_device_types() {
    let dir = std::env::temp_dir().join(format!("portalloc-kineto-devices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("profile.json");
    std::fs::write(&file, trace_of(&[(0, -1), (6, 0)])).unwrap();
    let replay = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_portalloc"))
            .args(["replay", "--strategies", "platform", "--json"])
            .arg(&file)
            .args(extra)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = replay(&["--trace-device", "hip:0"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = &v["traces"][0];
    assert_eq!(t["header"]["device"], "hip:0 AMD Instinct MI300X VF", "{t}");
    assert_eq!(t["results"][0]["peak_live"], 3172, "{t}");
    std::fs::write(&file, trace_of(&[(1, 0), (6, 0)])).unwrap();
    let (ok, _, err) = replay(&["--trace-device", "0"]);
    assert!(
        !ok && err.contains("ambiguous") && err.contains("cuda:0") && err.contains("hip:0"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------- shared traces

/// The MI300X trace (`../shared/traces-edge/pytorch-kineto-mi300x-qwen-hip.json.gz`, AMD's
/// TraceLens test data) replays its GPU: the figures of an independent reader (Python's
/// `gzip` and `json`: the `[memory]` events with `Device Type` 6, ordered by (`ts`, `Ev
/// Idx`), baseline = `Total Allocated` − `Bytes` of the first, running sum of `Bytes`):
/// 2,588 events (1,294 allocations, 1,294 frees), 1,085,405,696 B before the window, peak
/// 2,219,047,936 B — the most `Total Allocated`, as the traces' README says — and
/// 2,533,359,616 B reserved; the 104 CPU events skipped. Before, its 104 CPU events were
/// replayed: an 8 B peak.
#[test]
fn the_mi300x_trace_replays_its_gpu() {
    let Some(path) = crate::support::shared_trace(true, "pytorch-kineto-mi300x-qwen-hip.json.gz")
    else {
        return;
    };
    let t = open(&path, &Options::default()).unwrap();
    let header = t.header().clone();
    assert!(t.anomalies().is_empty(), "{}", t.anomalies());
    let s = summarize(t).unwrap();
    assert_eq!(
        header.device.as_deref(),
        Some("hip:0 AMD Instinct MI300X VF")
    );
    assert_eq!(
        (
            s.events,
            s.allocs,
            s.frees,
            s.baseline_bytes,
            s.peak_live_bytes
        ),
        (2588, 1294, 1294, 1_085_405_696, 2_219_047_936)
    );
    let reference = header.reference.clone().unwrap_or_default();
    assert_eq!(
        (reference.peak_live_bytes, reference.reserved_bytes),
        (Some(2_219_047_936), Some(2_533_359_616))
    );
    assert!(
        header
            .notes
            .iter()
            .any(|n| n == "skipped: cpu (104 events)"),
        "{:?}",
        header.notes
    );
}

/// The CUDA traces still read as CUDA (type 1), the CPU's events listed as skipped, by name
/// (the independent reader's counts: 1,240 and 4,618 CPU events).
#[test_case(false, "pytorch-kineto-ddp-v100.json.gz", "cuda:1 Tesla V100-SXM2-32GB", 26_770, "skipped: cpu (1240 events)" ; "ddp v100")]
#[test_case(true, "pytorch-kineto-resnet50-v100-noaddr.json.gz", "cuda:0 Tesla V100-DGXS-32GB", 8_220, "skipped: cpu (4618 events)" ; "resnet50 without addresses")]
fn the_cuda_traces_still_read_as_cuda(
    edge: bool,
    file: &str,
    device: &str,
    events: u64,
    skipped: &str,
) {
    let Some(path) = crate::support::shared_trace(edge, file) else {
        return;
    };
    let t = open(&path, &Options::default()).unwrap();
    let header = t.header().clone();
    assert_eq!(header.device.as_deref(), Some(device));
    assert!(
        header.notes.iter().any(|n| n == skipped),
        "{:?}",
        header.notes
    );
    assert_eq!(summarize(t).unwrap().events, events);
}

// ---------------------------------------------------------------- the planner's device

/// `portalloc replay` choosing its device from the trace: run as a user runs it (the `cli`
/// feature's binary).
#[cfg(feature = "cli")]
mod planner_device {
    use super::{json, two_allocs};
    use test_case::test_case;

    /// `portalloc replay` without `--device` replays on the preset of the GPU the trace names
    /// (`deviceProperties`' name, read into the header's device), and its header says where the
    /// device came from; `--device` and `--capacity` override; where the trace gives the GPU's
    /// memory (`totalGlobalMem`) and no preset is that GPU, or the preset's memory is not what
    /// the trace says (a MIG slice, a partitioned MI300X), a device of the recorded memory; a
    /// GPU no preset is, of unknown memory (an H100 NVL with 94 GB), or a trace naming none keeps
    /// the default h100-80g, saying why. Oracle: the presets' capacities as
    /// `nvidia-smi`/`rocm-smi` report them (81,559 MiB, 143,771 MiB, 206,141,652,992 B), and
    /// `totalGlobalMem` as real traces carry it (an MI300X VF: 205,571,227,648 B; a V100-SXM2:
    /// 34,089,730,048 B), written here, not read from portalloc.
    #[test_case(Some("AMD Instinct MI300X VF"), None, &[], "mi300x", 206_141_652_992, "the trace's device, hip:0 AMD Instinct MI300X VF" ; "an MI300X trace replays on mi300x")]
    #[test_case(Some("NVIDIA H200"), None, &[], "h200", 143_771 << 20, "the trace's device, hip:0 NVIDIA H200" ; "an H200 trace on h200")]
    #[test_case(Some("NVIDIA H100 80GB HBM3"), None, &[], "h100-80g", 81_559 << 20, "the trace's device, hip:0 NVIDIA H100 80GB HBM3" ; "an H100 80GB trace on h100-80g, from the trace")]
    #[test_case(Some("AMD Instinct MI300X VF"), None, &["--device", "h200"], "h200", 143_771 << 20, "--device" ; "the device option overrides")]
    #[test_case(Some("AMD Instinct MI300X VF"), None, &["--capacity", "64GiB"], "custom", 64 << 30, "--capacity" ; "the capacity option overrides")]
    #[test_case(Some("NVIDIA H100 NVL"), None, &[], "h100-80g", 81_559 << 20, "the default: the trace's device, hip:0 NVIDIA H100 NVL, names no preset's GPU" ; "an H100 NVL is no preset")]
    #[test_case(Some("AMD Instinct MI300A"), None, &[], "h100-80g", 81_559 << 20, "names no preset's GPU" ; "an MI300A is not an MI300X")]
    #[test_case(None, None, &[], "h100-80g", 81_559 << 20, "the default: the trace's device, hip:0, names no preset's GPU" ; "a trace naming no GPU")]
    #[test_case(Some("AMD Instinct MI300X VF"), Some(205_571_227_648), &[], "mi300x", 206_141_652_992, "the trace's device, hip:0 AMD Instinct MI300X VF" ; "an MI300X whose memory agrees is the preset")]
    #[test_case(Some("NVIDIA H100 80GB HBM3"), Some(85_029_158_912), &[], "h100-80g", 81_559 << 20, "the trace's device" ; "an H100 whose totalGlobalMem is 0.6 percent below nvidia-smi is the preset")]
    #[test_case(Some("NVIDIA H100 80GB HBM3 MIG 1g.10gb"), Some(10 << 30), &[], "custom", 10 << 30, "the memory the trace's device reports, 10.00 GiB (hip:0 NVIDIA H100 80GB HBM3 MIG 1g.10gb)" ; "a MIG slice replays on its memory")]
    #[test_case(Some("AMD Instinct MI300X"), Some(48 << 30), &[], "custom", 48 << 30, "not the mi300x's" ; "a partitioned MI300X replays on its memory")]
    #[test_case(Some("Tesla V100-SXM2-32GB"), Some(34_089_730_048), &[], "custom", 34_089_730_048, "the memory the trace's device reports" ; "a V100 replays on its memory")]
    #[test_case(Some("Tesla V100-SXM2-32GB"), Some(34_089_730_048), &["--device", "h200"], "h200", 143_771 << 20, "--device" ; "the device option overrides the recorded memory")]
    fn replay_runs_on_the_device_the_trace_names(
        name: Option<&str>,
        memory: Option<u64>,
        extra: &[&str],
        preset: &str,
        capacity: u64,
        source: &str,
    ) {
        // One directory per case (cases run in parallel): the device's name and the options.
        let case: String = format!("{}-{memory:?}-{}", name.unwrap_or("none"), extra.join("-"))
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let dir = std::env::temp_dir().join(format!(
            "portalloc-planner-device-{}-{case}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{}.json", name.unwrap_or("none").replace(' ', "_")));
        let mut trace = json!({ "traceEvents": two_allocs(6, 0, 0) });
        if let Some(name) = name {
            trace["deviceProperties"] = json!([{"id": 0, "name": name}]);
            if let Some(bytes) = memory {
                trace["deviceProperties"][0]["totalGlobalMem"] = json!(bytes);
            }
        }
        std::fs::write(&file, serde_json::to_vec(&trace).unwrap()).unwrap();
        let file = file.to_str().unwrap();
        let run = |json: bool| {
            let mut args = vec!["replay", "--strategies", "bfc", file];
            args.extend(json.then_some("--json"));
            args.extend_from_slice(extra);
            replayed(&args)
        };
        let v: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
        let t = &v["traces"][0];
        assert_eq!(t["device"]["name"], preset, "{t}");
        assert_eq!(t["device"]["capacity"], capacity, "{t}");
        let said = t["device_source"].as_str().unwrap_or_default();
        assert!(said.contains(source), "{said}");
        // The table's header says it too, on the line that names the device.
        let table = run(false);
        let line = table
            .lines()
            .find(|l| l.contains("replayed on"))
            .unwrap_or_default();
        assert!(
            line.contains(&format!("replayed on {preset} (")) && line.contains(source),
            "{table}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The shared MI300X trace replays on mi300x without `--device`.
    #[test]
    fn the_shared_mi300x_trace_replays_on_mi300x() {
        let Some(path) =
            crate::support::shared_trace(true, "pytorch-kineto-mi300x-qwen-hip.json.gz")
        else {
            return;
        };
        let out = replayed(&[
            "replay",
            "--strategies",
            "bfc",
            "--json",
            path.to_str().unwrap(),
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["traces"][0]["device"]["name"], "mi300x");
        assert_eq!(
            v["traces"][0]["device_source"],
            "the trace's device, hip:0 AMD Instinct MI300X VF"
        );
    }

    /// A built-in workload names no device: it replays on the default, and says so.
    #[test]
    fn a_workload_replays_on_the_default_device() {
        let out = replayed(&[
            "replay",
            "--workload",
            "transformer-train",
            "--layers",
            "1",
            "--strategies",
            "platform",
            "--json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["traces"][0]["device"]["name"], "h100-80g");
        assert_eq!(v["traces"][0]["device_source"], "the default");
    }

    /// `portalloc` run with `args` as a user's shell would (`support::cli`), which must succeed:
    /// its standard output.
    fn replayed(args: &[&str]) -> String {
        let (ok, out, err) = crate::support::cli::portalloc(args, &[]);
        assert!(ok, "{args:?}: {err}");
        out
    }
}
