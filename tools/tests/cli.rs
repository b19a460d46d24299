//! The `kvhoard` binary as a person and a script use it.

use std::process::{Command, Stdio};

mod common;
use common::{kvhoard, ok, p};

#[test]
fn init_put_get_ls_stat_rm_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let vol = p(&vol);
    assert!(ok(&["init", vol, "--capacity", "64MiB", "--segment-size", "4MiB"]).contains("created"));
    let src = dir.path().join("block.bin");
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    let key = "org/test-model@1@0@-1234abcd@bfloat16";
    let hash = ok(&["put", vol, key, p(&src), "--ttl", "3600", "--group", "7"]);
    assert_eq!(hash.trim(), blake3::hash(&bytes).to_hex().as_str());
    let out = dir.path().join("out.bin");
    ok(&["get", vol, key, "-o", p(&out), "--verify"]);
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    let stdout = kvhoard(&["get", vol, key]).stdout;
    assert_eq!(stdout, bytes);
    assert_eq!(ok(&["ls", vol]).trim(), key);
    let stat: serde_json::Value = serde_json::from_str(&ok(&["stat", vol, "--json"])).unwrap();
    assert_eq!(stat["keys"], 1);
    assert_eq!(stat["logical_bytes"], 300_000);
    assert!(ok(&["stat", vol]).contains("keys       1"));
    assert_eq!(stat["tiers"][0]["tier"], "ssd");
    assert_eq!(stat["tiers"][0]["entries"], 1);
    let metrics = ok(&["stat", vol, "--prometheus"]);
    assert!(metrics.contains("# TYPE kvhoard_keys gauge\nkvhoard_keys 1\n"), "{metrics}");
    assert!(metrics.contains("kvhoard_tier_entries{tier=\"ssd\"} 1\n"), "{metrics}");
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = line.rsplit_once(' ').unwrap();
        assert!(name.starts_with("kvhoard_"), "not a kvhoard metric: {line}");
        assert!(value.parse::<f64>().is_ok(), "not a number: {line}");
    }
    ok(&["rm", vol, key]);
    let miss = kvhoard(&["get", vol, key]);
    assert_eq!(miss.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&miss.stderr).contains("not found"));
    assert_eq!(kvhoard(&["rm", vol, key]).status.code(), Some(3));
}

#[test]
fn put_reads_stdin_and_namespaces_are_separate() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let vol = p(&vol);
    ok(&["init", vol, "--capacity", "32MiB", "--segment-size", "2MiB"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvhoard"))
        .args(["put", vol, "k", "-", "--namespace", "tenant-a", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"hello").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["bytes"], 5);
    assert_eq!(kvhoard(&["get", vol, "k"]).status.code(), Some(3));
    assert_eq!(kvhoard(&["get", vol, "k", "-n", "tenant-a"]).stdout, b"hello");
    let lines = ok(&["ls", vol, "-n", "tenant-a", "--json"]);
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert_eq!(first["key"], "k");
}

#[test]
fn errors_are_plain_words_with_a_way_forward() {
    let dir = tempfile::tempdir().unwrap();
    let out = kvhoard(&["stat", p(dir.path())]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a kvhoard volume"), "{err}");
    assert!(err.contains("kvhoard init"), "{err}");
    let out = kvhoard(&["init", p(&dir.path().join("v"))]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--capacity"));
    let out = kvhoard(&["init", p(&dir.path().join("v")), "--capacity", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("64MiB"));
    let out = kvhoard(&["init", p(&dir.path().join("v")), "--capacity", "4MiB"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 2"), "{}", String::from_utf8_lossy(&out.stderr));
    // A file where the volume's directory should be is named as such, each cause said once.
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let out = kvhoard(&["init", p(&dir.path().join("file")), "--capacity", "16MiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is a file, not a directory"), "{err}");
    let out = kvhoard(&["init", p(&dir.path().join("file/v")), "--capacity", "16MiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("os error").count(), 1, "{err}");
    // Counts a benchmark would die of (allocating per thread, per batch) are refused by name.
    for (flag, value) in [("--threads", "4294967296"), ("--batch", "18446744073709551615"), ("--block-size", "0")] {
        let out = kvhoard(&["bench", p(&dir.path().join("b")), flag, value]);
        assert_eq!(out.status.code(), Some(1), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("{flag} is {value}: give between 1 and")), "{flag} {value}: {err}");
    }
    // The failed init left nothing behind: a corrected one succeeds.
    ok(&["init", p(&dir.path().join("v")), "--capacity", "16MiB", "--segment-size", "2MiB"]);
    // The writer's limits are refused when it could not work with them, not quietly raised.
    for (flag, value, says) in [
        ("--write-in-flight", "0", "at least 4096 bytes"),
        ("--write-size", "100", "between 4096"),
        ("--write-size", "2GiB", "1GiB"),
    ] {
        let out = kvhoard(&["stat", p(&dir.path().join("v")), flag, value]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
    assert!(
        ok(&["stat", p(&dir.path().join("v")), "--write-in-flight", "4KiB", "--write-size", "4KiB"]).contains("keys")
    );
}

#[test]
fn no_output_overwrites_a_volume_and_an_endless_input_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let vol = p(&vol);
    ok(&["init", vol, "--capacity", "16MiB", "--segment-size", "2MiB"]);
    let block = dir.path().join("block.bin");
    std::fs::write(&block, b"kept").unwrap();
    ok(&["put", vol, "k", p(&block)]);
    let data = dir.path().join("vol/volume.kvh");
    let before = std::fs::read(&data).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let targets = [data.clone(), dir.path().join("vol/checkpoint"), dir.path().join("vol/new"), link];
    for target in &targets {
        let cluster_map = vec!["cluster", "init", "--nodes", "127.0.0.1:7000", "--force", "--out", p(target)];
        for args in [
            vec!["get", vol, "k", "-o", p(target)],
            vec!["trace", "generate", "--requests", "2", "-o", p(target)],
            cluster_map,
        ] {
            let out = kvhoard(&args);
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("refusing to write") && err.contains("outside the volume"), "{args:?}: {err}");
        }
    }
    assert_eq!(std::fs::read(&data).unwrap(), before, "the volume file is untouched");
    assert!(!dir.path().join("vol/new").exists());
    assert_eq!(kvhoard(&["get", vol, "k"]).stdout, b"kept");
    // A block larger than a segment is refused after reading at most one byte past the limit.
    let out = kvhoard(&["put", vol, "z", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("larger than this volume's largest block"));
    assert_eq!(kvhoard(&["fsck", vol]).status.code(), Some(0));
}

#[test]
fn every_subcommand_has_complete_help() {
    let top = ok(&["--help"]);
    for sub in ["init", "put", "get", "stat", "ls", "rm", "demo", "bench", "fsck", "inspect", "mount", "serve"] {
        assert!(top.contains(sub), "--help does not mention {sub}");
        let help = ok(&[sub, "--help"]);
        assert!(help.contains("Usage: kvhoard"), "{sub} --help: {help}");
        assert!(help.len() > 200, "{sub} --help is too thin: {help}");
    }
    assert!(top.contains("Exit codes"));
    let codecs = ok(&["bench", "codecs", "--help"]);
    assert!(codecs.contains("Usage: kvhoard bench codecs"), "{codecs}");
    assert!(codecs.contains("--codec"), "{codecs}");
}

#[test]
fn bench_codecs_reports_the_fields_scripts_read() {
    let out = ok(&[
        "bench",
        "codecs",
        "--codec",
        "lossless",
        "--codec",
        "drop-knorm:keep=0.5+quant:bits=4",
        "--size",
        "1MiB",
        "--min-time",
        "0.001",
        "--json",
    ]);
    let all: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    // memcpy on the same buffers first: the physical limit every codec is a fraction of.
    assert_eq!(all[0]["codec"], "memcpy");
    assert_eq!(all[0]["decompress_of_memcpy"], 1.0);
    let rows = &all[1..];
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["codec"], "lossless");
    assert_eq!(rows[1]["codec"], "drop-knorm+quant");
    assert_eq!(rows[1]["params"], "keep=0.5,bits=4,group=32,residual=0");
    for row in rows {
        assert!(row["cpu_kernels"].is_string(), "the kernels measured, in {row}");
        for field in ["size_ratio", "compress_gbps", "decompress_gbps", "error", "decompress_of_memcpy"] {
            assert!(row[field].as_f64().is_some(), "{field} missing in {row}");
        }
    }
    assert_eq!(rows[0]["error"], 0.0);
    assert!(rows[1]["size_ratio"].as_f64().unwrap() < 0.2);

    let bad = kvhoard(&["bench", "codecs", "--codec", "quant:bits=3"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("2, 4 or 8"));
}

#[test]
fn demo_runs_and_reports_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(&["demo", p(&dir.path().join("demo")), "--blocks", "24", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["blocks"], 24);
    assert_eq!(j["keys_after_restart"], 24);
    assert!(j["dedup_saved_bytes"].as_u64().unwrap() > 0);
    assert!(j["put_mbps"].as_f64().unwrap() > 0.0);
}

/// With fio installed, `--compare-disk` measures the disk before and after and reports the
/// ratios; without it, it refuses with what to install.
#[test]
fn bench_compares_with_the_disk_through_fio() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("b");
    let args = ["bench", p(&vol), "--block-size", "64KiB", "--total", "4MiB", "--compare-disk", "--json"];
    let fio = std::process::Command::new("fio").arg("--version").output().is_ok_and(|o| o.status.success());
    if !fio {
        let out = kvhoard(&args);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("apt-get install fio"), "{out:?}");
        return;
    }
    let j: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
    for field in ["put_acked_vs_disk", "put_vs_disk_synced", "get_vs_disk"] {
        assert!(j[field].as_f64().is_some_and(|r| r > 0.0), "{field} missing in {j}");
    }
    assert_eq!(j["disk"]["tool"], "fio");
    assert!(j["disk"]["write_mbps_before"].as_f64().is_some_and(|m| m > 0.0), "{j}");
    assert!(!dir.path().join("b").exists(), "the benchmark volume and fio's file were not removed");
}

#[test]
fn bench_reports_the_fields_scripts_read() {
    let dir = tempfile::tempdir().unwrap();
    let out = ok(&[
        "bench",
        p(&dir.path().join("b")),
        "--block-size",
        "64KiB",
        "--total",
        "8MiB",
        "--threads",
        "2",
        "--read-pattern",
        "random",
        "--batch",
        "5",
        "--get-batch",
        "7",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    for field in ["put_mbps", "put_acked_mbps", "get_mbps", "get_p50_us", "get_p99_us", "cpu_seconds_per_gb"] {
        assert!(j[field].is_number(), "{field} missing in {j}");
    }
    // 128 blocks put in calls of 5 and got in calls of 7: every block stored and read back.
    assert_eq!((j["blocks"].as_u64(), j["batch"].as_u64()), (Some(128), Some(5)));
    assert_eq!(j["get_batch"].as_u64(), Some(7));
    assert!(!dir.path().join("b").exists(), "the benchmark volume was not removed");
    let out = ok(&[
        "bench",
        p(&dir.path().join("d")),
        "--block-size",
        "64KiB",
        "--total",
        "4MiB",
        "--tier",
        "dram",
        "--compare-files",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["tier"], "dram");
    for field in ["files_put_mbps", "files_get_mbps", "put_vs_files", "get_vs_files", "get_mbps_per_thread"] {
        assert!(j[field].is_number(), "{field} missing in {j}");
    }
    assert!(!dir.path().join("d").exists(), "the benchmark volume and files were not removed");
    let out = ok(&["bench", p(&dir.path().join("r")), "--workload", "restart", "--blocks", "3000", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["blocks"], 3000);
    assert_eq!(j["records_replayed"], 3000);
    // Cleaning: the tight volume is cleaned while the hot set is read, the roomy one is not.
    let out = ok(&[
        "bench",
        p(&dir.path().join("c")),
        "--workload",
        "cleaning",
        "--block-size",
        "256KiB",
        "--total",
        "256MiB",
        "--put-mbps",
        "10000",
        "--rounds",
        "1",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(j["with_cleaning"]["segments_cleaned"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(j["without_cleaning"]["segments_cleaned"], 0);
    assert_eq!(j["without_cleaning"]["hot_misses"], 0);
    for field in ["p50_ratio", "p99_ratio", "p999_ratio"] {
        assert!(j[field].is_number(), "{field} missing in {j}");
    }
    assert!(!dir.path().join("c").exists(), "the benchmark volumes were not removed");
}

fn code(args: &[&str]) -> i32 {
    kvhoard(args).status.code().unwrap()
}

#[test]
fn inspect_json_agrees_with_the_engine_and_fsck_exit_codes_follow_e2fsck() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let vol = p(&vol);
    ok(&["init", vol, "--capacity", "64MiB", "--segment-size", "4MiB"]);
    let mut sources = Vec::new();
    for i in 0..6u32 {
        let path = dir.path().join(format!("b{i}"));
        let bytes: Vec<u8> = (0..(30_000 + i * 5_000)).map(|j| (j * (i + 7) % 253) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        ok(&["put", vol, &format!("k{i}"), p(&path), "--ttl", "600"]);
        sources.push(bytes);
    }
    ok(&["put", vol, "same-as-k2", p(&dir.path().join("b2"))]);
    let stat: serde_json::Value = serde_json::from_str(&ok(&["stat", vol, "--json"])).unwrap();
    let inspect: serde_json::Value = serde_json::from_str(&ok(&["inspect", vol, "--json"])).unwrap();
    for field in ["keys", "blocks", "logical_bytes", "unique_bytes", "dedup_saved_bytes"] {
        assert_eq!(inspect[field], stat[field], "{field}: inspect {} vs stat {}", inspect[field], stat[field]);
    }
    assert_eq!(inspect["ttl"]["< 1 hour"], 6);
    let segments = ok(&["inspect", vol, "segments", "--json"]);
    assert_eq!(segments.lines().count() as u64, stat["segments"].as_u64().unwrap());
    let block: serde_json::Value = serde_json::from_str(&ok(&["inspect", vol, "block", "k2", "--json"])).unwrap();
    assert_eq!(block["keys_naming_it"], 2);
    assert_eq!(block["payload_intact"], true);
    assert_eq!(block["content_hash"], blake3::hash(&sources[2]).to_hex().as_str());
    let by_hash = kvhoard(&["inspect", vol, "dump", block["content_hash"].as_str().unwrap(), "--raw"]).stdout;
    assert_eq!(by_hash, sources[2]);
    assert_eq!(code(&["inspect", vol, "block", "nope"]), 3);
    let out = kvhoard(&["inspect", vol, "segment", "99999"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no segment 99999"));

    assert_eq!(code(&["fsck", vol]), 0);
    let offset = block["offset"].as_u64().unwrap() + 4096 + 10;
    let data = dir.path().join("vol/volume.kvh");
    let mut image = std::fs::read(&data).unwrap();
    image[offset as usize] ^= 0xff;
    std::fs::write(&data, image).unwrap();
    let found: serde_json::Value =
        serde_json::from_str(&String::from_utf8(kvhoard(&["fsck", vol, "--json"]).stdout).unwrap()).unwrap();
    assert_eq!(found["exit_code"], 4);
    assert_eq!(found["found"]["lost_keys"].as_array().unwrap().len(), 2);
    let damaged = kvhoard(&["get", vol, "k2"]);
    assert_eq!(damaged.status.code(), Some(3));
    let err = String::from_utf8_lossy(&damaged.stderr);
    assert!(err.contains("its block is damaged") && err.contains("fsck --repair"), "{err}");
    assert_eq!(code(&["fsck", vol, "--repair"]), 1);
    assert_eq!(code(&["fsck", vol]), 0);
    assert_eq!(kvhoard(&["get", vol, "k4"]).stdout, sources[4]);
    assert_eq!(code(&["get", vol, "k2"]), 3);
    assert_eq!(code(&["fsck", p(dir.path())]), 8);
}

/// Starts `kvhoard serve` and returns it with the addresses it printed.
/// `kvhoard serve VOL ARGS`: the server, its stderr after the "serving" line, and that line.
fn serve_with(
    vol: &str,
    args: &[&str],
) -> (std::process::Child, std::io::BufReader<std::process::ChildStderr>, String) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvhoard"))
        .args(["serve", vol, "--dram-tier", "0"])
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    (child, err, line)
}

/// The address after `scheme` in the server's "serving" line.
fn served_at(line: &str, scheme: &str) -> String {
    let start = line.find(scheme).unwrap_or_else(|| panic!("no {scheme} in {line:?}")) + scheme.len();
    line[start..].split([' ', '/']).next().unwrap().to_string()
}

fn serve(vol: &str) -> (std::process::Child, std::io::BufReader<std::process::ChildStderr>, String, String) {
    let (child, err, line) = serve_with(vol, &["--lm", "0", "--resp", "0"]);
    let (lm, resp) = (served_at(&line, "lm://"), served_at(&line, "resp://"));
    (child, err, lm, resp)
}

#[test]
fn serve_stops_cleanly_on_sigterm_and_keeps_what_it_stored() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let vol = p(&vol);
    ok(&["init", vol, "--capacity", "64MiB", "--segment-size", "4MiB"]);
    let (mut child, mut err, _lm, resp) = serve(vol);
    let mut c = std::net::TcpStream::connect(&resp).unwrap();
    c.write_all(b"*3\r\n$3\r\nSET\r\n$9\r\nm/x@1@0@1\r\n$5\r\nhello\r\n").unwrap();
    let mut reply = [0u8; 5];
    c.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");
    // SAFETY: kill sends a signal to the child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "{rest}");
    assert!(rest.contains("volume closed"), "{rest}");
    assert_eq!(ok(&["get", vol, "m/x@1@0@1", "-n", "lmcache"]), "hello");
    let (mut child, _err, _, resp) = serve(vol);
    let mut c = std::net::TcpStream::connect(&resp).unwrap();
    c.write_all(b"GET m/x@1@0@1\r\n").unwrap();
    let mut reply = [0u8; 11];
    c.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"$5\r\nhello\r\n");
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    assert!(child.wait().unwrap().success());
    let refused = kvhoard(&["serve", vol, "--lm", "0.0.0.0:0"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--allow-remote"));
}

#[test]
fn plan_live_reads_a_servers_planner_or_says_why_it_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let vol = p(&vol);
    ok(&["init", vol, "--capacity", "64MiB", "--segment-size", "4MiB"]);
    // A server without a planner: `plan live` says so.
    let (mut child, _err, line) = serve_with(vol, &["--resp", "0", "--metrics", "0"]);
    let metrics = served_at(&line, "http://");
    let out = kvhoard(&["plan", "live", &metrics]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("404") && stderr.contains("--placement planner"), "{stderr}");
    // SAFETY: kill sends a signal to the child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    // Nobody listening: it says where it tried and what to run.
    let out = kvhoard(&["plan", "live", &metrics]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot reach"), "{stderr}");
}

#[test]
fn ns_set_keeps_placement_settings_and_ttl_reads_a_servers_group_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let vol = p(&vol);
    ok(&["init", vol, "--capacity", "64MiB", "--segment-size", "4MiB"]);
    // A lossy codec among the planner's needs lossy codecs allowed, and the error says so.
    let out = kvhoard(&["ns", "set", vol, "kv", "--codecs", "lossless quant:bits=8"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lossy allow"));
    let out = kvhoard(&["ns", "set", vol, "kv", "--ttl-groups", "8"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ttl-budget"), "group TTL needs a budget");
    let out = kvhoard(&["ns", "set", vol, "kv", "--drift", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    let said = ok(&[
        "ns",
        "set",
        vol,
        "kv",
        "--lossy",
        "allow",
        "--codecs",
        "lossless quant:bits=8",
        "--alpha",
        "0.1",
        "--drift",
        "10%",
        "--ttl-budget",
        "1GiB",
        "--ttl-groups",
        "16",
        "--ttl-window",
        "30m",
    ]);
    assert!(said.contains("alpha 0.1 s") && said.contains("group TTL within 1.0 GiB"), "{said}");
    // What is not given keeps its value; `default` unsets one.
    ok(&["ns", "set", vol, "kv", "--alpha", "default"]);
    let shown: serde_json::Value = serde_json::from_str(&ok(&["ns", "show", vol, "--json"])).unwrap();
    let kv = &shown[0];
    assert_eq!(kv["namespace"], "kv");
    assert_eq!(kv["alpha"], serde_json::Value::Null);
    assert_eq!(kv["drift"], 0.1);
    assert_eq!(kv["codecs"], "lossless:level=1 quant:bits=8,group=32,residual=0");
    assert_eq!(kv["ttl"]["budget_bytes"], 1u64 << 30);
    assert_eq!(kv["ttl"]["groups"], 16);
    assert_eq!(kv["ttl"]["window_s"], 1800);

    // A server keeps group TTL for the namespace: `kvhoard ttl` shows it once blocks are used.
    use std::io::{Read, Write};
    let (mut child, _err, line) =
        serve_with(vol, &["--resp", "0", "--resp-namespace", "kv", "--metrics", "0", "--allow-policy-changes"]);
    let metrics = served_at(&line, "http://");
    let shown = ok(&["ttl", &metrics]);
    assert!(shown.contains("0 accesses in the window") && shown.contains("no plan yet"), "nothing used yet: {shown}");
    let mut c = std::net::TcpStream::connect(served_at(&line, "resp://")).unwrap();
    c.write_all(b"*3\r\n$3\r\nSET\r\n$9\r\nm/x@1@0@1\r\n$5\r\nhello\r\n").unwrap();
    let mut reply = [0u8; 5];
    c.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");
    let shown = ok(&["ttl", &metrics]);
    assert!(shown.contains("namespace kv: budget 1.0 GiB on average, 16 groups at most, window 1800 s"), "{shown}");
    assert!(shown.contains("1 accesses in the window"), "{shown}");
    let json: serde_json::Value = serde_json::from_str(&ok(&["ttl", &metrics, "--json"])).unwrap();
    assert_eq!(json[0]["namespace"], "kv");

    // While it serves, the volume's policies change through the server, at once; the volume
    // itself is held, and the error says where to go.
    let out = kvhoard(&["ns", "set", vol, "kv", "--alpha", "0.3"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("kvhoard ns set http://"), "{out:?}");
    let server = format!("http://{metrics}");
    let said = ok(&["ns", "set", &server, "kv", "--alpha", "0.3"]);
    assert!(said.contains("alpha 0.3 s") && said.contains("drift 10%"), "what is not given is kept: {said}");
    let shown: serde_json::Value = serde_json::from_str(&ok(&["ns", "show", &server, "--json"])).unwrap();
    assert_eq!((shown[0]["alpha"].as_f64(), shown[0]["drift"].as_f64()), (Some(0.3), Some(0.1)), "{shown}");
    let out = kvhoard(&["ns", "set", &server, "kv", "--codecs", "quant:bits=2", "--lossy", "deny"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("lossy"), "{out:?}");
    // SAFETY: kill sends a signal to the child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    // Kept in the volume.
    let shown: serde_json::Value = serde_json::from_str(&ok(&["ns", "show", vol, "--json"])).unwrap();
    assert_eq!(shown[0]["alpha"].as_f64(), Some(0.3), "{shown}");
}
