//! Figures that mean what they say (#27): the replay table's "÷ live" and utilisation, the
//! fraction variables `replay` reads, a `--plot` failure after the table, and the computed
//! out-of-memory advice. Every expected figure is derived by hand in the comments, from the
//! trace written here and the simulated device's rules (a 2 MiB granule), not from what
//! portalloc printed.
#![cfg(feature = "cli")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::support::common::{bfc, simulated_host};
use portalloc::adaptor::{LedgerAllocator, LedgerOptions};
use portalloc::backends::host::HostDevice;
use portalloc::diagnose::{Diagnosis, Verdict};
use portalloc::{Allocation, Allocator, Config, Device, Stream};
use test_case::test_case;

const MIB: u64 = 1 << 20;

use crate::support::cli::portalloc;

/// As [`portalloc`], which must succeed and print JSON: the JSON.
fn portalloc_json(args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let (ok, out, err) = portalloc(args, env);
    assert!(ok, "{args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// A directory of this test's own (tests run on parallel threads of one process), made anew.
fn temp_dir(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "portalloc-figures-{name}-{}-{n}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a trace in portalloc's own format (header line, `[seq,time,thread,stream,op,id,size]`
/// event lines, end line) holding `rows` of `(op, id, size)`, and returns its path.
fn write_trace(dir: &Path, name: &str, rows: &[(&str, u64, u64)]) -> String {
    let mut text =
        String::from("{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n");
    for (i, (op, id, size)) in rows.iter().enumerate() {
        text.push_str(&format!("[{i},{i},0,0,\"{op}\",{id},{size}]\n"));
    }
    text.push_str(&format!("{{\"end\":{{\"events\":{}}}}}\n", rows.len()));
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// The table row of `strategy` in `portalloc replay`'s output.
fn row<'a>(out: &'a str, strategy: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(strategy))
        .unwrap_or_else(|| panic!("no row for {strategy}: {out}"))
}

/// The "refused" cell of a table row: the 8th and 9th words (strategy, peak live and peak
/// reserved as number and unit, util., OOMs, then refused as number and unit).
fn refused_cell(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    assert!(words.len() > 8, "{line}");
    format!("{} {}", words[7], words[8])
}

/// The results of the first trace of a `--json` replay, by strategy name.
fn results(v: &serde_json::Value) -> Vec<serde_json::Value> {
    v["traces"][0]["results"].as_array().unwrap().clone()
}

/// Two 4 MiB requests live together: a demand of 8 MiB.
const TWO_OF_FOUR: &[(&str, u64, u64)] = &[
    ("a", 1, 4 * MIB),
    ("a", 2, 4 * MIB),
    ("f", 1, 4 * MIB),
    ("f", 2, 4 * MIB),
];

// ------------------------------------------------------------------------- ÷ live

/// "÷ live" is "—" where peak live is under the 2 MiB step the capacity is searched in:
/// an empty trace (peak live 0, min capacity one step: 2 MiB ÷ 1 printed 2,097,152×) and an
/// 8 B trace (2 MiB ÷ 8 B printed 262,144×). The minimum capacity itself is still shown.
#[test_case(&[] ; "empty trace")]
#[test_case(&[("a", 1, 8), ("f", 1, 8)] ; "eight bytes")]
fn ratio_to_live_is_a_dash_where_live_is_under_one_step(rows: &[(&str, u64, u64)]) {
    let dir = temp_dir("ratio-small");
    let path = write_trace(&dir, "t.jsonl", rows);
    let (ok, out, err) = portalloc(
        &["replay", &path, "--min-capacity", "--capacity", "8MiB"],
        &[],
    );
    assert!(ok, "{err}");
    for strategy in ["bfc", "bfc-grow", "vmm", "async", "platform"] {
        let line = row(&out, strategy);
        assert!(line.trim_end().ends_with('—'), "{line}");
        assert!(
            line.contains("2.00 MiB"),
            "the minimum is still shown: {line}"
        );
    }
    assert!(!out.contains("262144") && !out.contains("2097152"), "{out}");
    assert!(
        out.contains("÷ live is — where peak live is under"),
        "{out}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Above one step the ratio is printed: one 4 MiB request through platform needs a 4 MiB
/// device (2 MiB, the bisection's floor, fails; 4 MiB, a granule multiple, serves it), so
/// 4 MiB ÷ 4 MiB = 1.000×.
#[test]
fn ratio_to_live_is_printed_above_one_step() {
    let dir = temp_dir("ratio-large");
    let path = write_trace(&dir, "t.jsonl", &[("a", 1, 4 * MIB), ("f", 1, 4 * MIB)]);
    let (ok, out, err) = portalloc(
        &[
            "replay",
            &path,
            "--min-capacity",
            "--capacity",
            "8MiB",
            "--strategies",
            "platform",
        ],
        &[],
    );
    assert!(ok, "{err}");
    let line = row(&out, "platform");
    assert!(line.trim_end().ends_with("1.000×"), "{line}");
    assert!(!out.contains("÷ live is —"), "{out}");
    std::fs::remove_dir_all(dir).ok();
}

// ------------------------------------------------------------------------- utilisation

/// A replay that runs out reports utilisation as what was served over what was reserved,
/// never over 100%, with the refused demand beside it. Two 4 MiB requests on an 8 MiB device:
///
/// - fraction 0.5 (limit 4 MiB): the first is served, the second refused. Every strategy
///   reserves 4 MiB (bfc preallocates the limit; the growing ones take one 4 MiB region) and
///   serves 4 MiB: 100%, where the demand (8 MiB ÷ 4 MiB) printed 200%.
/// - fraction 0.75 (limit 6 MiB): bfc preallocates 6 MiB and serves 4 MiB: 66.7% (it
///   printed 133.3%).
///
/// In both, peak live stays the demand (8 MiB), peak served is 4 MiB and 4 MiB was refused.
#[test_case("0.5", "bfc", 4 * MIB ; "half: bfc")]
#[test_case("0.5", "bfc-grow", 4 * MIB ; "half: bfc growing")]
#[test_case("0.5", "vmm", 4 * MIB ; "half: vmm")]
#[test_case("0.5", "async", 4 * MIB ; "half: async")]
#[test_case("0.5", "platform", 4 * MIB ; "half: platform")]
#[test_case("0.75", "bfc", 6 * MIB ; "three quarters: bfc")]
fn a_replay_that_ran_out_reports_served_over_reserved(
    fraction: &str,
    strategy: &str,
    reserved: u64,
) {
    let dir = temp_dir(&format!("util-{strategy}-{fraction}"));
    let path = write_trace(&dir, "t.jsonl", TWO_OF_FOUR);
    let args = [
        "replay",
        &path,
        "--capacity",
        "8MiB",
        "--fraction",
        fraction,
        "--strategies",
        strategy,
    ];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let v = portalloc_json(&json_args, &[]);
    let r = &results(&v)[0];
    assert_eq!(r["oom_count"], 1, "{r}");
    assert_eq!(
        r["peak_live"],
        8 * MIB,
        "the demand, refused request included"
    );
    assert_eq!(r["peak_served"], 4 * MIB, "{r}");
    assert_eq!(r["refused_bytes"], 4 * MIB, "{r}");
    assert_eq!(r["peak_refused"], 4 * MIB, "{r}");
    assert_eq!(r["peak_reserved"], reserved, "{r}");
    let utilisation = r["utilisation"].as_f64().unwrap();
    let expected = (4 * MIB) as f64 / reserved as f64;
    assert!((utilisation - expected).abs() < 1e-12, "{utilisation}");
    assert!(utilisation <= 1.0);

    let (ok, out, err) = portalloc(&args, &[]);
    assert!(ok, "{err}");
    let line = row(&out, strategy);
    let percent = format!("{:.1}%", expected * 100.0);
    assert!(line.contains(&percent), "{percent} in {line}");
    assert_eq!(refused_cell(line), "4.00 MiB", "{line}");
    assert!(
        out.contains("util. is peak served ÷ peak reserved"),
        "{out}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// The refused bytes beside utilisation are the most refused at once, not the sum over the
/// run: with 4 MiB served throughout (limit 4 MiB), a 4 MiB request refused and freed, then
/// another refused and freed, sums to 8 MiB refused but never more than 4 MiB at once; the
/// demand peaks at 4 + 4 = 8 MiB.
#[test]
fn the_refused_demand_is_its_peak_and_its_sum() {
    let dir = temp_dir("refused");
    let path = write_trace(
        &dir,
        "t.jsonl",
        &[
            ("a", 1, 4 * MIB),
            ("a", 2, 4 * MIB),
            ("f", 2, 4 * MIB),
            ("a", 3, 4 * MIB),
            ("f", 3, 4 * MIB),
            ("f", 1, 4 * MIB),
        ],
    );
    let args = [
        "replay",
        path.as_str(),
        "--capacity",
        "8MiB",
        "--fraction",
        "0.5",
        "--strategies",
        "platform",
    ];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let v = portalloc_json(&json_args, &[]);
    let r = &results(&v)[0];
    assert_eq!(r["oom_count"], 2, "{r}");
    assert_eq!(r["refused_bytes"], 8 * MIB, "{r}");
    assert_eq!(r["peak_refused"], 4 * MIB, "{r}");
    assert_eq!(r["peak_live"], 8 * MIB, "{r}");
    assert_eq!(r["peak_served"], 4 * MIB, "{r}");
    let (ok, out, err) = portalloc(&args, &[]);
    assert!(ok, "{err}");
    let line = row(&out, "platform");
    assert_eq!(refused_cell(line), "4.00 MiB", "{line}");
    std::fs::remove_dir_all(dir).ok();
}

/// Without a refusal, served is the demand and the table has no refused bytes: one 4 MiB
/// request on platform at fraction 1.0 reserves exactly 4 MiB, 100%.
#[test]
fn a_replay_that_served_everything_has_served_equal_to_live() {
    let dir = temp_dir("util-ok");
    let path = write_trace(&dir, "t.jsonl", &[("a", 1, 4 * MIB), ("f", 1, 4 * MIB)]);
    let v = portalloc_json(
        &[
            "replay",
            &path,
            "--capacity",
            "8MiB",
            "--fraction",
            "1",
            "--strategies",
            "platform",
            "--json",
        ],
        &[],
    );
    let r = &results(&v)[0];
    assert_eq!(r["oom_count"], 0);
    assert_eq!(r["peak_served"], r["peak_live"]);
    assert_eq!(r["refused_bytes"], 0);
    assert_eq!(r["utilisation"].as_f64(), Some(1.0));
    std::fs::remove_dir_all(dir).ok();
}

// ------------------------------------------------------------------------- fractions

/// `replay` takes the fraction as the allocator does: `PORTALLOC_MEM_FRACTION` over
/// `XLA_CLIENT_MEM_FRACTION` over the deprecated spelling, else 0.75; `--fraction` over all.
/// The header names what set it, and the limit follows (8 MiB × fraction).
#[test_case(&[], &[], 0.75, "the default" ; "nothing set")]
#[test_case(&[("XLA_CLIENT_MEM_FRACTION", "0.5")], &[], 0.5, "XLA_CLIENT_MEM_FRACTION" ; "jax variable")]
#[test_case(&[("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")], &[], 0.5, "XLA_PYTHON_CLIENT_MEM_FRACTION" ; "deprecated spelling")]
#[test_case(&[("XLA_CLIENT_MEM_FRACTION", "0.5"), ("PORTALLOC_MEM_FRACTION", "0.25")], &[], 0.25, "PORTALLOC_MEM_FRACTION" ; "portalloc variable wins")]
#[test_case(&[("XLA_CLIENT_MEM_FRACTION", "0.5")], &["--fraction", "1"], 1.0, "--fraction" ; "flag wins")]
fn replay_reads_the_fraction_variables(
    env: &[(&str, &str)],
    flags: &[&str],
    fraction: f64,
    source: &str,
) {
    let dir = temp_dir(&format!("fraction-{}", source.replace(' ', "-")));
    let path = write_trace(&dir, "t.jsonl", &[("a", 1, MIB), ("f", 1, MIB)]);
    let mut args = vec![
        "replay",
        path.as_str(),
        "--capacity",
        "8MiB",
        "--strategies",
        "bfc",
    ];
    args.extend_from_slice(flags);
    let mut json_args = args.clone();
    json_args.push("--json");
    let v = portalloc_json(&json_args, env);
    assert_eq!(v["traces"][0]["fraction"].as_f64(), Some(fraction));
    assert_eq!(v["traces"][0]["fraction_source"], source);
    // bfc preallocates its limit at the first request: fraction × 8 MiB.
    assert_eq!(
        results(&v)[0]["peak_reserved"].as_u64(),
        Some((fraction * (8 * MIB) as f64) as u64)
    );
    let (ok, out, err) = portalloc(&args, env);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("memory fraction {fraction} ({source})")),
        "{out}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// A fraction variable replay cannot use is an error naming the variable, the value and what
/// is accepted, as `portalloc info` gives, even beside `--fraction` (as the library's builder
/// checks the variables under a value given in code); both XLA spellings are a conflict.
#[test_case(&[("XLA_CLIENT_MEM_FRACTION", "abc")], &[], &["XLA_CLIENT_MEM_FRACTION", "\"abc\"", "(0, 1]"] ; "not a number")]
#[test_case(&[("PORTALLOC_MEM_FRACTION", "1.5")], &[], &["PORTALLOC_MEM_FRACTION", "1.5", "(0, 1]"] ; "above one")]
#[test_case(&[("XLA_CLIENT_MEM_FRACTION", "abc")], &["--fraction", "0.5"], &["XLA_CLIENT_MEM_FRACTION", "\"abc\""] ; "beside the flag")]
#[test_case(&[("XLA_CLIENT_MEM_FRACTION", "0.5"), ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")], &[], &["XLA_PYTHON_CLIENT_MEM_FRACTION", "deprecated"] ; "both spellings")]
#[test_case(&[], &["--fraction", "1.5"], &["--fraction", "1.5", "(0, 1]"] ; "flag above one")]
fn a_bad_fraction_is_refused_naming_it(env: &[(&str, &str)], flags: &[&str], needles: &[&str]) {
    let dir = temp_dir("bad-fraction");
    let path = write_trace(&dir, "t.jsonl", &[("a", 1, MIB), ("f", 1, MIB)]);
    let mut args = vec!["replay", path.as_str(), "--capacity", "8MiB"];
    args.extend_from_slice(flags);
    let (ok, out, err) = portalloc(&args, env);
    assert!(!ok, "accepted: {out}");
    assert!(
        out.is_empty(),
        "no table for a refused configuration: {out}"
    );
    for needle in needles {
        assert!(err.contains(needle), "{needle} in {err}");
    }
    std::fs::remove_dir_all(dir).ok();
}

/// The preallocation variables do not apply to replay (its strategies fix preallocation):
/// set, they are said to be ignored rather than silently, and a value the allocator would
/// refuse is no reason to refuse the replay. bfc still preallocates its 6 MiB limit.
#[test_case("XLA_PYTHON_CLIENT_PREALLOCATE", "false" ; "jax variable")]
#[test_case("PORTALLOC_PREALLOCATE", "maybe" ; "portalloc variable not a boolean")]
fn a_preallocation_variable_is_said_not_to_apply(variable: &str, value: &str) {
    let dir = temp_dir("prealloc");
    let path = write_trace(&dir, "t.jsonl", &[("a", 1, MIB), ("f", 1, MIB)]);
    let (ok, out, err) = portalloc(
        &["replay", &path, "--capacity", "8MiB", "--strategies", "bfc"],
        &[(variable, value)],
    );
    assert!(ok, "{err}");
    assert!(
        err.contains(&format!("{variable} does not apply to replay")),
        "{err}"
    );
    assert!(row(&out, "bfc").contains("6.00 MiB"), "{out}");
    std::fs::remove_dir_all(dir).ok();
}

// ------------------------------------------------------------------------- --plot

/// A plot that cannot be written fails the command after the figures are printed: the table
/// (or the JSON) is on standard output, the error on standard error.
#[test_case(false ; "table")]
#[test_case(true ; "json")]
fn a_plot_failure_comes_after_the_figures(json: bool) {
    let dir = temp_dir(&format!("plot-{json}"));
    let path = write_trace(&dir, "t.jsonl", TWO_OF_FOUR);
    let bad = dir.join("no-such-directory").join("plot.svg");
    let bad = bad.to_string_lossy().into_owned();
    let mut args = vec![
        "replay",
        path.as_str(),
        "--capacity",
        "8MiB",
        "--strategies",
        "platform",
        "--plot",
        bad.as_str(),
    ];
    if json {
        args.push("--json");
    }
    let (ok, out, err) = portalloc(&args, &[]);
    assert!(!ok, "a plot not written is a failure: {out}");
    if json {
        let v: serde_json::Value = serde_json::from_str(&out).expect("the JSON, whole");
        assert_eq!(results(&v)[0]["peak_live"], 8 * MIB);
    } else {
        assert!(row(&out, "platform").contains("8.00 MiB"), "{out}");
        assert!(!out.contains("plot written"), "{out}");
    }
    assert!(err.contains("--plot"), "{err}");
    assert!(err.contains("plot was not written"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

/// A plot path that cannot be written, holding an escape sequence and 5,000 more characters,
/// is shown in the error cut and escaped: a short message, no raw ESC reaching the terminal.
#[test]
fn a_hostile_plot_path_is_shown_cut_and_escaped() {
    let dir = temp_dir("plot-hostile");
    let path = write_trace(&dir, "t.jsonl", TWO_OF_FOUR);
    let name = format!("\x1b[31m{}", "x".repeat(5000));
    let bad = dir.join(name).join("plot.svg");
    let bad = bad.to_string_lossy().into_owned();
    let (ok, out, err) = portalloc(
        &[
            "replay",
            &path,
            "--capacity",
            "8MiB",
            "--strategies",
            "platform",
            "--plot",
            &bad,
        ],
        &[],
    );
    assert!(!ok, "{out}");
    assert!(row(&out, "platform").contains("8.00 MiB"), "{out}");
    assert!(err.contains("plot was not written"), "{err:.300}");
    assert!(!err.contains('\x1b'), "raw escape: {err:.300}");
    assert!(err.len() < 1000, "{} bytes: {err:.300}", err.len());
    std::fs::remove_dir_all(dir).ok();
}

// ------------------------------------------------------------------------- OOM advice

/// bfc at `fraction` of a simulated 64 MiB host, preallocating (as JAX's default), behind
/// the ledger with `config`'s limit hint.
fn preallocated_bfc(
    device: &Arc<HostDevice>,
    fraction: f64,
    config: &Config,
) -> LedgerAllocator<portalloc::strategy::bfc::BfcAllocator<HostDevice>> {
    let limit = (fraction * (64 * MIB) as f64) as u64;
    let dev: Arc<dyn Device> = Arc::clone(device) as Arc<dyn Device>;
    LedgerAllocator::with_options(
        bfc(device, limit, true),
        LedgerOptions::default().with_config(config),
    )
    .with_device(dev)
}

/// 32 MiB in use as four 8 MiB buffers, then a request of `request` bytes: its diagnosis,
/// or `None` if served. (Four buffers, not one of 32 MiB: bfc follows XLA in not splitting a
/// free chunk under twice the request, so a lone 32 MiB request would take the whole 48 MiB
/// preallocation. Each 8 MiB here is split off the free chunk at the pool's end, which is
/// at least 16 MiB each time, so the free bytes left all lie in that end chunk.)
fn after_32_mib(l: &impl Allocator, request: u64) -> Option<Diagnosis> {
    let held: Vec<Allocation> = (0..4)
        .map(|_| l.allocate(8 * MIB, 0, Stream::DEFAULT, "weights").unwrap())
        .collect();
    let outcome = match l.allocate(request, 0, Stream::DEFAULT, "activations") {
        Ok(a) => {
            l.deallocate(a).unwrap();
            None
        }
        Err(e) => Some(e.diagnosis().expect("a diagnosis").clone()),
    };
    for a in held {
        l.deallocate(a).unwrap();
    }
    outcome
}

/// The fraction the advice names serves the request. On a 64 MiB device, preallocated bfc at
/// 0.75 holds 48 MiB; with 32 MiB in use, a 20 MiB request fails (16 MiB free, at the end).
/// At a fraction f the end chunk is f × 64 MiB − 32 MiB, so it needs
/// 32 + 20 = 52 MiB = 0.8125 of the device, named rounded up as 0.813; the old advice added
/// the pool instead (48 + 20 = 68 MiB > 64 MiB) and said no fraction serves it. The oracle:
/// the same program at 0.813 and at the 0.9 is served.
#[test]
fn the_advice_names_a_fraction_that_serves_the_request() {
    let dev = simulated_host(64 * MIB);
    let config = Config::builder()
        .vars(|name| (name == "XLA_CLIENT_MEM_FRACTION").then(|| "0.75".to_string()))
        .build()
        .unwrap();
    let d = after_32_mib(&preallocated_bfc(&dev, 0.75, &config), 20 * MIB)
        .expect("20 MiB does not fit in the 16 MiB left of 48 MiB");
    let f = d
        .finding(Verdict::GrowthExhausted)
        .unwrap_or_else(|| panic!("{d}"));
    assert!(!f.remedy.contains("no fraction serves it"), "{}", f.remedy);
    assert!(f.remedy.contains("at least 0.813"), "{}", f.remedy);
    assert!(
        f.remedy.contains("raise XLA_CLIENT_MEM_FRACTION"),
        "{}",
        f.remedy
    );
    for served_at in [0.813, 0.9] {
        let l = preallocated_bfc(&dev, served_at, &config);
        assert!(
            after_32_mib(&l, 20 * MIB).is_none(),
            "refused at {served_at}"
        );
    }
}

/// No fraction serves what the device cannot hold: 32 MiB in use and 40 MiB asked for are
/// 72 MiB, more than the 64 MiB device; the advice says so with the sum.
#[test]
fn the_advice_says_when_no_fraction_serves_it() {
    let dev = simulated_host(64 * MIB);
    let config = Config::builder().ignore_env().build().unwrap();
    let d = after_32_mib(&preallocated_bfc(&dev, 0.75, &config), 40 * MIB).expect("refused");
    let f = d
        .finding(Verdict::GrowthExhausted)
        .unwrap_or_else(|| panic!("{d}"));
    assert!(f.remedy.contains("no fraction serves it"), "{}", f.remedy);
    assert!(f.remedy.contains("72.00 MiB"), "{}", f.remedy);
}

/// A remedy names an environment variable only where the allocator read them. The same
/// refusal (bfc at 0.75, 32 MiB in use, 20 MiB asked) diagnosed for an allocator whose
/// configuration came from the environment with nothing set names both fraction variables;
/// from `ignore_env` or from the builder's fraction (which the variables do not override), no
/// variable is named and the setting in code is.
#[test_case(Config::builder().vars(|_| None).build().unwrap(), true ; "environment read, nothing set")]
#[test_case(Config::builder().ignore_env().build().unwrap(), false ; "ignore_env")]
#[test_case(Config::builder().vars(|_| None).mem_fraction(0.75).build().unwrap(), false ; "builder fraction")]
fn variables_are_named_only_where_the_allocator_reads_them(config: Config, named: bool) {
    let dev = simulated_host(64 * MIB);
    let d = after_32_mib(&preallocated_bfc(&dev, 0.75, &config), 20 * MIB).expect("refused");
    let text = d.to_string();
    let f = d
        .finding(Verdict::GrowthExhausted)
        .unwrap_or_else(|| panic!("{d}"));
    if named {
        assert!(f.remedy.contains("XLA_CLIENT_MEM_FRACTION"), "{}", f.remedy);
        assert!(f.remedy.contains("PORTALLOC_MEM_FRACTION"), "{}", f.remedy);
    } else {
        assert!(!text.contains("MEM_FRACTION"), "{text}");
        assert!(
            f.remedy.contains("Config::builder().mem_fraction"),
            "{}",
            f.remedy
        );
    }
    if !config.env_read {
        for variable in portalloc::config::VARIABLES {
            assert!(!text.contains(variable), "{variable} in {text}");
        }
    }
}

/// Under `ignore_env`, the other remedies name no variable either: fragmentation's (vmm) and
/// the leak's (backtraces). Sixteen 1 MiB buffers, every other one freed, leave 8 MiB free
/// in 1 MiB holes of a 16 MiB pool: a 2 MiB request is fragmentation.
#[test]
fn ignore_env_remedies_name_no_variable() {
    let dev = simulated_host(64 * MIB);
    let config = Config::builder().ignore_env().build().unwrap();
    let dyn_dev: Arc<dyn Device> = Arc::clone(&dev) as Arc<dyn Device>;
    let l = LedgerAllocator::with_options(
        bfc(&dev, 16 * MIB, true),
        LedgerOptions::default().with_config(&config),
    )
    .with_device(dyn_dev);
    let all: Vec<Allocation> = (0..16)
        .map(|_| l.allocate(MIB, 0, Stream::DEFAULT, "buffer").unwrap())
        .collect();
    let mut kept = Vec::new();
    for (i, a) in all.into_iter().enumerate() {
        if i % 2 == 0 {
            l.deallocate(a).unwrap();
        } else {
            kept.push(a);
        }
    }
    let e = l
        .allocate(2 * MIB, 0, Stream::DEFAULT, "buffer")
        .unwrap_err();
    let d = e.diagnosis().expect("diagnosed");
    assert!(d.has(Verdict::Fragmentation), "{d}");
    let text = d.to_string();
    for variable in portalloc::config::VARIABLES {
        assert!(!text.contains(variable), "{variable} in {text}");
    }
    assert!(text.contains("the vmm strategy"), "{text}");
    for a in kept {
        l.deallocate(a).unwrap();
    }
}

/// Through the C ABI: an allocator made with `ignore_env = 1` and `mem_fraction = 0.5` (64 MiB
/// simulated host, bfc growing, limit 32 MiB) refuses 48 MiB, and `portalloc_last_error`
/// carries the diagnosis, which names no environment variable but the option that sets the
/// fraction.
#[cfg(feature = "c-api")]
#[test]
fn the_c_abi_under_ignore_env_names_no_variable() {
    use portalloc::capi::*;
    use std::ffi::CStr;
    let mut o = std::mem::MaybeUninit::<PortallocOptions>::uninit();
    let size = std::mem::size_of::<PortallocOptions>();
    // SAFETY: `o` is valid for writing `size` bytes.
    let status = unsafe { portalloc_options_init(o.as_mut_ptr(), size) };
    assert_eq!(status, PortallocStatus::Ok);
    // SAFETY: every byte written by portalloc_options_init.
    let mut o = unsafe { o.assume_init() };
    o.ignore_env = 1;
    o.strategy = c"bfc".as_ptr();
    o.backend = c"host".as_ptr();
    o.host_capacity = 64 * MIB;
    o.host_simulated = 1;
    o.mem_fraction = 0.5;
    o.preallocate = 0;
    let mut a = std::ptr::null_mut();
    // SAFETY: valid options with static strings; `a` is valid for one pointer.
    let status = unsafe { portalloc_create_sized(&o, size, &mut a) };
    assert_eq!(status, PortallocStatus::Ok);
    let (mut handle, mut ptr) = (0, std::ptr::null_mut());
    // SAFETY: a live allocator and valid outputs.
    let status =
        unsafe { portalloc_allocate(a, 48 * MIB, 0, 0, std::ptr::null(), &mut handle, &mut ptr) };
    assert_eq!(status, PortallocStatus::OutOfMemory);
    // SAFETY: portalloc_last_error returns a valid NUL-terminated string.
    let message = unsafe { CStr::from_ptr(portalloc_last_error()) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: the allocator made above, destroyed once.
    unsafe { portalloc_destroy(a) };
    assert!(message.contains("growth exhausted"), "{message}");
    assert!(message.contains("mem_fraction option"), "{message}");
    for variable in portalloc::config::VARIABLES {
        assert!(!message.contains(variable), "{variable} in {message}");
    }
}

// ------------------------------------------------------------------------- text output

/// The words of `strategy`'s table row, and its "util." cell: the 6th word (strategy, peak
/// live and peak reserved as number and unit, then util.).
fn util_cell(out: &str, strategy: &str) -> String {
    row(out, strategy)
        .split_whitespace()
        .nth(5)
        .unwrap()
        .to_string()
}

/// A first request larger than the limit (16 MiB; 6 MiB of an 8 MiB device at 0.75) is
/// refused before the pool holds a byte: served ÷ reserved is 0 ÷ 0, printed "—" with a
/// footnote (it printed 0.0%, as though the pool were wasted); the JSON keeps utilisation 0
/// beside peak_reserved 0, which tells the case.
#[test]
fn util_is_a_dash_where_nothing_was_reserved() {
    let dir = temp_dir("util-dash");
    let path = write_trace(&dir, "t.jsonl", &[("a", 1, 16 * MIB), ("f", 1, 16 * MIB)]);
    let args = [
        "replay",
        path.as_str(),
        "--capacity",
        "8MiB",
        "--strategies",
        "bfc-grow,platform",
    ];
    let (ok, out, err) = portalloc(&args, &[]);
    assert!(ok, "{err}");
    for strategy in ["bfc-grow", "platform"] {
        assert_eq!(util_cell(&out, strategy), "—", "{out}");
    }
    assert!(
        out.contains("util. is — where nothing was reserved"),
        "{out}"
    );
    assert!(!out.contains("0.0%"), "{out}");
    let mut json_args = args.to_vec();
    json_args.push("--json");
    for r in results(&portalloc_json(&json_args, &[])) {
        assert_eq!(r["peak_reserved"].as_u64(), Some(0), "{r}");
        assert_eq!(r["utilisation"].as_f64(), Some(0.0), "{r}");
    }
    // Where bytes were reserved, the percentage is printed as before: 1 MiB in a 2 MiB region.
    let path = write_trace(&dir, "small.jsonl", &[("a", 1, MIB), ("f", 1, MIB)]);
    let (ok, out, err) = portalloc(
        &[
            "replay",
            &path,
            "--capacity",
            "8MiB",
            "--strategies",
            "bfc-grow",
        ],
        &[],
    );
    assert!(ok, "{err}");
    assert_eq!(util_cell(&out, "bfc-grow"), "50.0%", "{out}");
    assert!(!out.contains("nothing was reserved"), "{out}");
    std::fs::remove_dir_all(dir).ok();
}

/// The importer's header notes are printed under the header, not only in `--json`: each cut
/// and escaped, the first 8, then how many more. Ten notes here: one with an escape code, one
/// of 5,000 characters.
#[test]
fn header_notes_are_printed_bounded_and_escaped() {
    let dir = temp_dir("notes");
    let mut notes: Vec<String> = (0..10).map(|i| format!("note number {i}")).collect();
    notes[0] = "skipped \u{1b}[31mcuda:1\u{1b}[0m".to_string();
    notes[1] = "x".repeat(5000);
    let header = serde_json::json!({
        "format": "portalloc-trace", "version": 1, "source": "x", "notes": notes,
    });
    let text = format!(
        "{header}\n[0,0,0,0,\"a\",1,1024]\n[1,1,0,0,\"f\",1,1024]\n{{\"end\":{{\"events\":2}}}}\n"
    );
    let path = dir.join("t.jsonl");
    std::fs::write(&path, text).unwrap();
    let path = path.to_string_lossy().into_owned();
    let (ok, out, err) = portalloc(
        &["replay", &path, "--capacity", "8MiB", "--strategies", "bfc"],
        &[],
    );
    assert!(ok, "{err}");
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert!(out.contains("   skipped \\u{1b}[31mcuda:1"), "{out}");
    let long = out
        .lines()
        .find(|l| l.contains("xxxx"))
        .expect("the long note");
    assert!(long.chars().count() < 1000 && long.ends_with('…'), "{long}");
    for i in 2..8 {
        assert!(out.contains(&format!("   note number {i}\n")), "{i}: {out}");
    }
    assert!(!out.contains("note number 8"), "{out}");
    assert!(
        out.contains("… 2 more notes (--json lists them all)"),
        "{out}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// A Kineto trace with only the CPU's `[memory]` events (Device Type 0): replayed with
/// `--trace-device cpu`, the text says the CPU caveat (it was only in `--json`); without the
/// flag, the refusal names the flag a user types, and the library's option only as such.
#[test]
fn a_cpu_profile_says_its_caveat_and_names_the_flag() {
    let dir = temp_dir("kineto-cpu");
    let event = |ts: u64, addr: u64, bytes: i64, total: i64| {
        serde_json::json!({
            "ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts,
            "args": {"Device Type": 0, "Device Id": -1, "Addr": addr, "Bytes": bytes,
                     "Total Allocated": total, "Total Reserved": 0}
        })
    };
    let trace = serde_json::json!({ "traceEvents": [
        event(1, 0x10, 4096, 4096), event(2, 0x20, 8192, 12288), event(3, 0x10, -4096, 8192),
    ]});
    let path = dir.join("cpu.json");
    std::fs::write(&path, trace.to_string()).unwrap();
    let path = path.to_string_lossy().into_owned();
    let (ok, out, err) = portalloc(
        &[
            "replay",
            &path,
            "--trace-device",
            "cpu",
            "--strategies",
            "bfc",
        ],
        &[],
    );
    assert!(ok, "{err}");
    assert!(out.contains("   the CPU's [memory] events"), "{out}");
    let (ok, out, err) = portalloc(&["replay", &path, "--strategies", "bfc"], &[]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("--trace-device cpu (trace::Options::cpu in the library)"),
        "{err}"
    );
    assert!(!err.contains("(Options::cpu)"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

/// The refusal of a gzip stream inflating past a limit on untrusted files (here 1 MiB) names the flag a user types, and
/// the library's option only as such (it said "--trusted-input (trace::Options::trusted)").
#[test]
fn the_input_limit_names_the_flag_then_the_library_option() {
    let mut text = b"{\"format\":\"portalloc-trace\",\"version\":1,\"source\":\"x\"}\n".to_vec();
    text.resize(text.len() + (2 << 20), b'\n');
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &text).unwrap();
    let text = gz.finish().unwrap();
    let options = portalloc::trace::Options::default().with_max_input_bytes(1 << 20);
    let message =
        match portalloc::trace::open_reader(std::io::Cursor::new(text), "t.jsonl.gz", &options)
            .and_then(|mut t| t.try_for_each(|e| e.map(|_| ())))
        {
            Ok(()) => panic!("read past the limit"),
            Err(e) => e.to_string(),
        };
    assert!(
        message.contains("--trusted-input (trace::Options::trusted in the library)"),
        "{message}"
    );
}

/// The deprecated fraction variable is warned of once, on standard error, without terminal
/// escape codes: it was said twice (a tracing WARN in colour codes, then `portalloc: warning:`).
#[test]
fn a_deprecated_variable_is_warned_of_once_without_colour() {
    let dir = temp_dir("deprecated");
    let path = write_trace(&dir, "t.jsonl", &[("a", 1, MIB), ("f", 1, MIB)]);
    let (ok, out, err) = portalloc(
        &["replay", &path, "--capacity", "8MiB", "--strategies", "bfc"],
        &[("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.3")],
    );
    assert!(ok, "{err}");
    assert_eq!(err.matches("is deprecated").count(), 1, "{err}");
    assert!(
        err.contains("portalloc: warning: XLA_PYTHON_CLIENT_MEM_FRACTION is deprecated"),
        "{err}"
    );
    assert!(!err.contains('\u{1b}'), "{err:?}");
    assert!(out.contains("memory fraction 0.3"), "{out}");
    std::fs::remove_dir_all(dir).ok();
}
