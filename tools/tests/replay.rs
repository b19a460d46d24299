//! `kvhoard replay`, `kvhoard plan capacity` and `kvhoard trace` as a person and a script use
//! them: numbers checked against a hand computation, determinism, refused traces, the simulator
//! against the engine, charts.

use std::path::Path;

use serde_json::Value;

mod common;
use common::{kvhoard, ok, p};

/// A generated trace of `requests` at 2 per second in `dir`.
fn generate(dir: &Path, shape: &str, requests: u32, seed: u32) -> std::path::PathBuf {
    let trace = dir.join(format!("{shape}-{seed}.jsonl"));
    let (requests, seed) = (requests.to_string(), seed.to_string());
    ok(&[
        "trace",
        "generate",
        "--shape",
        shape,
        "--requests",
        &requests,
        "--rate",
        "2",
        "--seed",
        &seed,
        "-o",
        p(&trace),
    ]);
    trace
}

/// Six requests, one second apart, every prompt whole 512-token blocks.
const TINY: &str = "\
{\"timestamp\": 0, \"input_length\": 2048, \"output_length\": 10, \"hash_ids\": [1, 2, 3, 4]}
{\"timestamp\": 1000, \"input_length\": 3072, \"output_length\": 10, \"hash_ids\": [1, 2, 3, 4, 5, 6]}
{\"timestamp\": 2000, \"input_length\": 3072, \"output_length\": 10, \"hash_ids\": [7, 8, 9, 10, 11, 12]}
{\"timestamp\": 3000, \"input_length\": 1536, \"output_length\": 10, \"hash_ids\": [1, 2, 13]}
{\"timestamp\": 4000, \"input_length\": 1024, \"output_length\": 10, \"hash_ids\": [1, 2]}
{\"timestamp\": 5000, \"input_length\": 1536, \"output_length\": 10, \"hash_ids\": [5, 6, 7]}
";

/// The fixed flags of the tiny replays: an 8B model on the documented defaults, a volume of the
/// smallest size a replay makes (16 records: three segments of four 64 MiB blocks).
const FLAGS: [&str; 10] =
    ["--ssd", "1GiB", "--ssd-gbps", "6", "--dram-gbps", "20", "--decode-cores", "2", "--gpus", "2"];

fn sim(trace: &Path, policy: &str) -> Value {
    let mut args = vec!["replay", p(trace), "--sim", "--policy", policy, "--json"];
    args.extend(FLAGS);
    serde_json::from_str(&ok(&args)).unwrap()
}

#[test]
fn a_tiny_fifo_replay_matches_the_hand_computation() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("tiny.jsonl");
    std::fs::write(&trace, TINY).unwrap();
    let r = sim(&trace, "fifo");
    // Segments hold four blocks, three segments. Request 1 stores 1-4 (segment 0); 2 hits 1-4 and
    // stores 5, 6 (segment 1); 3 misses and stores 7, 8 (segment 1) and 9-12 (segment 2); 4 hits
    // 1, 2, and its 13 needs a segment: the oldest, 0, is reclaimed whole (1-4 evicted); 5 misses
    // 1 and stores 1, 2 again; 6 hits 5, 6, 7.
    let hits = [0u32, 4, 0, 2, 0, 3];
    let blocks = [4u32, 6, 6, 3, 2, 3];
    assert_eq!(r["requests"], 6);
    assert_eq!(r["hit_rate"].as_f64().unwrap(), f64::from(hits.iter().sum::<u32>()) / 24.0);
    assert_eq!(r["evictions"], 4);
    // 15 records of 64 MiB and one 4 KiB header unit each.
    assert_eq!(r["bytes_written"], 15 * ((64u64 << 20) + 4096));
    // TTFT: no queueing (each request is served within its second on two GPUs): the prefill of
    // the tokens not loaded, 2 FLOPs per parameter (8.03e9) per token at half of 989 TFLOPS,
    // plus 64 MiB per hit at 6 GB/s.
    let per_token = 2.0 * 8.03e9 / (989e12 * 0.5);
    let per_hit = (64u64 << 20) as f64 / 6e9;
    let ttfts: Vec<f64> = hits
        .iter()
        .zip(blocks)
        .map(|(&h, b)| (f64::from(b - h) * 512.0 * per_token + f64::from(h) * per_hit) * 1e3)
        .collect();
    let mean = ttfts.iter().sum::<f64>() / 6.0;
    let got = r["mean_ttft_ms"].as_f64().unwrap();
    assert!((got - mean).abs() < 0.01, "mean TTFT {got} ms, by hand {mean} ms");
    assert_eq!(r["mean_quality"], 1.0, "raw blocks serve full quality");
    // The same trace and flags give the same numbers, byte for byte.
    assert_eq!(sim(&trace, "fifo"), r);
}

#[test]
fn the_summary_json_keeps_its_shape() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("tiny.jsonl");
    std::fs::write(&trace, TINY).unwrap();
    let r = sim(&trace, "lru");
    let mut keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "below_0_9",
            "block_bytes",
            "byte_seconds",
            "bytes_written",
            "decode_cores",
            "distinct_blocks",
            "dram_bytes",
            "dram_gbps",
            "evictions",
            "gpus",
            "hit_rate",
            "mean_load_ms",
            "mean_quality",
            "mean_ttft_ms",
            "mode",
            "model",
            "p50_ttft_ms",
            "p99_load_ms",
            "p99_ttft_ms",
            "planner_cpu_s",
            "planner_drops",
            "policy",
            "recompressed",
            "requests",
            "scale",
            "segments_freed_ahead",
            "ssd_bytes",
            "ssd_gbps",
            "stored_bytes",
            "trace_requests",
            "write_amplification",
        ]
    );
    assert_eq!(r["mode"], "sim");
    assert_eq!(r["model"], "llama-3.1-8b");
    assert_eq!(r["block_bytes"], 64u64 << 20);
    assert_eq!(r["distinct_blocks"], 13);
    assert_eq!(r["policy"], "lru");
}

#[test]
fn malformed_traces_are_refused_with_their_line() {
    let dir = tempfile::tempdir().unwrap();
    for (text, want) in [
        ("{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 1}\n", "line 2 is not a request"),
        (
            "{\"timestamp\": 9, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1]}\n\n{\"timestamp\": 3, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1]}\n",
            "line 3: timestamp 3 is before",
        ),
        ("{\"timestamp\": 0, \"input_length\": 5000, \"output_length\": 1, \"hash_ids\": [1, 2]}\n", "line 1: 2 hash_ids for 5000"),
        ("[1, 2, 3]\n", "line 1 is not a request"),
    ] {
        let trace = dir.path().join("bad.jsonl");
        std::fs::write(&trace, text).unwrap();
        for args in [vec!["replay", p(&trace), "--sim"], vec!["trace", "stats", p(&trace)], vec!["plan", "capacity", "--trace", p(&trace)]] {
            let out = kvhoard(&args);
            assert_eq!(out.status.code(), Some(1), "{args:?} on {text:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(want), "{args:?} on {text:?}: {err}");
        }
    }
    let out = kvhoard(&["replay", "/nonexistent/trace.jsonl", "--sim"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the trace"));
    let out = kvhoard(&["replay", "/dev/null", "--sim", "--policy", "lru:quant:bits=3"]);
    assert_eq!(out.status.code(), Some(1));
    // Settings that describe no replay are refused, saying which.
    let trace = dir.path().join("tiny.jsonl");
    std::fs::write(&trace, TINY).unwrap();
    for (flags, want) in [
        (&["--scale", "0"][..], "--scale must be at least 1"),
        (&["--requests", "0"][..], "--requests must be at least 1"),
        (&["--ssd", "0"][..], "holds no"),
        (&["--group-ttl", "1GB", "--ttl-window", "0"][..], "--ttl-window is 0: give between 1"),
        (
            &["--ttl-groups", "18446744073709551615"][..],
            "--ttl-groups is 18446744073709551615: give between 1 and 4096",
        ),
        (&["--gpus", "4294967296"][..], "--gpus is 4294967296: give between 1 and 4096"),
        (&["--mfu", "2"][..], "--mfu is 2.0"),
        (&["--ssd", "9223372036854775807"][..], "more than 1000 times"),
    ] {
        let mut args = vec!["replay", p(&trace), "--sim"];
        args.extend(flags);
        let out = kvhoard(&args);
        assert_eq!(out.status.code(), Some(1), "{flags:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(want),
            "{flags:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // So are a capacity plan's: a grid that would run for days, prices that are not numbers.
    for (flags, want) in [
        (&["--dram-steps", "100000"][..], "--dram-steps is 100000: give between 1 and 64"),
        (&["--ssd-steps", "18446744073709551615"][..], "--ssd-steps is 18446744073709551615"),
        (&["--dram-cost", "NaN"][..], "--dram-cost is NaN"),
        (&["--ssd-cost", "inf"][..], "--ssd-cost is inf"),
        (&["--ssd-max-fraction", "1e300"][..], "--ssd-max-fraction is 1e300"),
    ] {
        let mut args = vec!["plan", "capacity", "--trace", p(&trace)];
        args.extend(flags);
        let out = kvhoard(&args);
        assert_eq!(out.status.code(), Some(1), "{flags:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{flags:?}: {err}");
    }
}

#[test]
fn the_simulator_and_the_engine_hit_the_same_requests() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("tiny.jsonl");
    std::fs::write(&trace, TINY).unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let mut args = vec!["replay", p(&trace), "--compare", p(&work), "--scale", "256", "--policy", "fifo,lru", "--json"];
    args.extend(FLAGS);
    let r: Value = serde_json::from_str(&ok(&args)).unwrap();
    for run in r["runs"].as_array().unwrap() {
        let policy = &run["engine"]["policy"];
        assert_eq!(run["agreement"]["requests_hitting_alike"], 1.0, "{policy}: {run}");
        assert_eq!(run["engine"]["hit_rate"], run["sim"]["hit_rate"], "{policy}");
    }
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0, "the replay volumes are removed");
}

#[test]
fn plots_are_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("tiny.jsonl");
    std::fs::write(&trace, TINY).unwrap();
    let plots = dir.path().join("plots");
    let mut args = vec!["replay", p(&trace), "--sim", "--policy", "lru,fifo,fixed:quant:bits=8", "--plot", p(&plots)];
    args.extend(FLAGS);
    let text = ok(&args);
    assert!(text.contains("fixed:quant:bits=8"), "{text}");
    for name in ["ttft_cdf.svg", "hit_rate.svg", "stored_bytes.svg", "quality_ttft.svg"] {
        let svg = std::fs::read_to_string(plots.join(name)).unwrap();
        assert!(svg.starts_with("<svg") && (svg.contains("polyline") || svg.contains("<circle")), "{name}");
        assert!(svg.contains("fifo"), "{name} has its legend");
    }
}

#[test]
fn plan_capacity_finds_a_frontier_on_a_generated_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = generate(dir.path(), "documents", 300, 3);
    let again = ok(&["trace", "generate", "--shape", "documents", "--requests", "300", "--rate", "2", "--seed", "3"]);
    assert_eq!(std::fs::read_to_string(&trace).unwrap(), again, "the same seed writes the same trace");
    let stats: Value = serde_json::from_str(&ok(&["trace", "stats", p(&trace), "--json"])).unwrap();
    assert_eq!(stats["requests"], 300);
    let plots = dir.path().join("plots");
    let out = ok(&[
        "plan",
        "capacity",
        "--trace",
        p(&trace),
        "--versus-grid",
        "--dram-steps",
        "3",
        "--ssd-steps",
        "5",
        "--ttls",
        "none,60",
        "--plot",
        p(&plots),
        "--json",
    ]);
    let r: Value = serde_json::from_str(&out).unwrap();
    let frontier = r["frontier"].as_array().unwrap();
    assert!(!frontier.is_empty());
    for point in frontier {
        for key in ["dram_bytes", "ssd_bytes", "ttl_secs", "cost_per_hour", "mean_ttft_ms", "throughput_rps"] {
            assert!(point.get(key).is_some(), "{key} in {point}");
        }
    }
    let searches = r["searches"].as_array().unwrap();
    assert_eq!(searches[0]["evaluations"], r["grid_points"], "the grid evaluates every point");
    let (grid, adaptive) = (searches[0]["hypervolume"].as_f64().unwrap(), searches[1]["hypervolume"].as_f64().unwrap());
    assert!(adaptive <= grid + 1e-9 && grid > 0.0, "{grid} {adaptive}");
    for name in ["frontier_ttft.svg", "frontier_throughput.svg"] {
        assert!(std::fs::metadata(plots.join(name)).unwrap().len() > 1000, "{name}");
    }
}

#[test]
fn the_ttl_curve_keeps_group_ttl_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let trace = generate(dir.path(), "sessions", 400, 9);
    let plots = dir.path().join("plots");
    let out = ok(&["replay", p(&trace), "--sim", "--ttl-curve", "--ttl-groups", "8", "--plot", p(&plots), "--json"]);
    let r: Value = serde_json::from_str(&out).unwrap();
    let rows = r["ttl_curve"].as_array().unwrap();
    assert!(rows.len() >= 5);
    for row in rows {
        let budget = row["budget_byte_seconds"].as_f64().unwrap();
        for key in ["single_byte_seconds", "group_byte_seconds"] {
            // A replay stores only what a request computed, so it keeps at most what the plan
            // charged, but for blocks capacity evicted before their TTL and a later miss stored
            // again (a few percent on the shared trace's smallest budget). (Learned online,
            // group TTL knows nothing in its first second and may overspend: not checked.)
            assert!(row[key].as_f64().unwrap() <= budget * 1.05, "{key} over budget in {row}");
        }
        for key in ["single_hits", "group_hits", "group_online_hits", "budget"] {
            assert!(row[key].as_u64().is_some(), "{key} in {row}");
        }
    }
    assert!(std::fs::metadata(plots.join("ttl_curve.svg")).unwrap().len() > 1000);
    // The same flags, the same curve.
    let again = ok(&["replay", p(&trace), "--sim", "--ttl-curve", "--ttl-groups", "8", "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&again).unwrap(), r);
}

#[test]
fn the_planner_replays_deterministically_and_the_engine_applies_it() {
    let dir = tempfile::tempdir().unwrap();
    let trace = generate(dir.path(), "documents", 300, 4);
    // The planner on a volume too small for the working set, decode speeds pinned.
    let replay = |mode: &[&str]| -> Value {
        let mut args = vec!["replay", p(&trace)];
        args.extend_from_slice(mode);
        args.extend_from_slice(&["--ssd-fraction", "0.05", "--policy", "planner", "--codec-gbps", "8", "--json"]);
        serde_json::from_str(&ok(&args)).unwrap()
    };
    let run = || replay(&["--sim"]);
    let r = run();
    assert_eq!(r["policy"], "planner");
    assert!(
        r["planner_drops"].as_u64().unwrap() + r["recompressed"].as_u64().unwrap() > 0,
        "a small volume makes it decide: {r}"
    );
    assert!(r["stored_bytes"].as_u64().unwrap() <= r["ssd_bytes"].as_u64().unwrap(), "{r}");
    // With decode speeds pinned, the same trace gives the same decisions, number for number
    // (but the time the planner took).
    let without_time = |mut v: Value| {
        v.as_object_mut().unwrap().remove("planner_cpu_s");
        v
    };
    assert_eq!(without_time(run()), without_time(r.clone()));
    // The engine replays under the planner on a volume too small for the working set. Which
    // forms it chooses follows the loads the store measures: where a load takes longer than the
    // prefill (a debug build's reads), every context is stored as put and goes first, and what
    // is served keeps its quality. (Lossy forms, recompression and drops carried out by the
    // engine: tests/tests/planned.rs.)
    let engine = replay(&["--volume", p(dir.path()), "--scale", "256"]);
    assert_eq!(engine["mode"], "engine", "{engine}");
    assert!(engine["hit_rate"].as_f64().unwrap() > 0.0, "{engine}");
    assert!((0.9..=1.0).contains(&engine["mean_quality"].as_f64().unwrap()), "{engine}");
    let bad = kvhoard(&["replay", p(&trace), "--sim", "--policy", "planner:alpha=much"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("alpha must be a number"));
}
