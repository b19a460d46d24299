//! `cluster-bench`: one `kvhoard serve` node against three serving one slot map, alternated in
//! one run, on a workload the DRAM tier holds; how evenly keys spread over 3, 6 and 100 nodes;
//! then what moving slots costs the node that loses them.
//!
//! Each configuration runs in-process (`kvhoard_serve::start`, one runtime per node) on its own
//! volumes. The same keys are stored through a cluster client (routing by slot, following
//! MOVED), then `--clients` threads GET random keys for `--seconds`, each with its own client:
//! aggregate GB/s (10^9 bytes of values per second), requests/s, latency percentiles, and the
//! CPU the whole process used meanwhile (servers and clients share the machine's cores: on a
//! small machine that, not the cluster, is the limit, and the CPU seconds per GB show whether
//! the cluster layer costs anything). `--nodes 1,3,1,3` alternates the configurations so that a
//! drift of the machine shows as a difference between repeats.
//!
//! The spread: LMCache-named keys (two per chunk) routed by a balanced map, counted per node.
//!
//! The move: `--move-keys` small keys on three nodes, then a map giving half of the first node's
//! slots to the second; reported is how long the first node takes to delete the keys of the
//! slots it lost (listing its namespace, one tombstone per key), per key, and what one client
//! reading the keys the node kept sees meanwhile against just before.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kvhoard_engine::{CreateOptions, Store, StoreOptions};
use kvhoard_serve::cluster::client::{ClientOptions, ClusterClient, Reply};
use kvhoard_serve::cluster::{keyslot, ClusterConfig, SlotMap};
use kvhoard_serve::{Running, ServeOptions};
use kvhoard_tests::{block, Rng};

/// Aggregate throughput of 1 node against 3, the spread of keys, and the cost of a slot move.
#[derive(Debug, Parser)]
#[command(name = "cluster-bench")]
struct Args {
    /// Directory for the volumes (created; removed afterwards).
    #[arg(long)]
    dir: PathBuf,
    /// Node counts to measure, in order (repeat them to alternate).
    #[arg(long, value_delimiter = ',', default_value = "1,3,1,3")]
    nodes: Vec<usize>,
    /// Client threads issuing GETs.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 256)]
    keys: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 1 << 20)]
    value_bytes: usize,
    /// Seconds of GETs per configuration.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Network threads per node (0: one per CPU).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// LMCache chunks whose keys are counted per node for the spread (0: none).
    #[arg(long, default_value_t = 1_000_000)]
    spread_chunks: u64,
    /// Keys stored before the slot move (0: no move).
    #[arg(long, default_value_t = 100_000)]
    move_keys: u64,
    /// Bytes per value of the keys stored before the slot move (all different).
    #[arg(long, default_value_t = 4096)]
    move_value_bytes: usize,
}

struct Node {
    running: Running,
    store: Arc<Store>,
}

fn start_nodes(dir: &Path, count: usize, dram_bytes: u64, capacity: u64, threads: usize) -> (Vec<Node>, SlotMap) {
    let mut nodes = Vec::with_capacity(count);
    for i in 0..count {
        let path = dir.join(format!("vol{i}"));
        let create = CreateOptions { capacity_bytes: Some(capacity), segment_size_bytes: 64 << 20 };
        let store = Arc::new(
            Store::create(&path, &create, StoreOptions { dram_tier_bytes: dram_bytes, ..Default::default() })
                .expect("create a volume"),
        );
        let opts = ServeOptions {
            resp: Some("127.0.0.1:0".parse().expect("address")),
            threads,
            max_object_bytes: 64 << 20,
            ..Default::default()
        };
        let running = kvhoard_serve::start(Arc::clone(&store), opts).expect("start a node");
        nodes.push(Node { running, store });
    }
    let addrs: Vec<String> = nodes.iter().map(addr).collect();
    let map = SlotMap::balanced(&addrs, 1).expect("a map");
    load(&nodes, &map);
    (nodes, map)
}

/// Gives every node `map`, as SIGHUP does.
fn load(nodes: &[Node], map: &SlotMap) {
    for n in nodes {
        n.running.set_cluster(Some(ClusterConfig::for_address(map.clone(), &addr(n)).expect("in the map")));
    }
}

fn addr(n: &Node) -> String {
    n.running.addrs().resp.expect("a RESP listener").to_string()
}

fn client(nodes: &[Node]) -> ClusterClient {
    let seeds: Vec<String> = nodes.iter().map(addr).collect();
    ClusterClient::connect(&seeds, ClientOptions { timeout: Duration::from_secs(30), password: None }).expect("connect")
}

fn key(i: u64) -> String {
    format!("org/bench@1@0@{:x}@bfloat16kv_bytes", i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

fn stop(nodes: Vec<Node>) {
    for n in nodes {
        n.running.shutdown(Duration::from_secs(10));
        if let Ok(store) = Arc::try_unwrap(n.store) {
            let _ = store.close();
        }
    }
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0)
}

/// CPU seconds (user + system) this process has used so far, all threads.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given and keeps no pointer to it.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// What a load measured.
struct Load {
    gbps: f64,
    rps: f64,
    p50_us: u32,
    p99_us: u32,
    /// CPU cores the process kept busy on average.
    cores: f64,
}

/// GETs of `pick()`'s keys from `clients` threads until `until` says stop.
fn get_load(nodes: &[Node], clients: usize, pick: impl Fn(&mut Rng) -> u64 + Sync, until: impl Fn() -> bool) -> Load {
    let stop = AtomicBool::new(false);
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let results: Vec<(u64, Vec<u32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|t| {
                let (stop, pick) = (&stop, &pick);
                let mut c = client(nodes);
                s.spawn(move || {
                    let mut rng = Rng::new(t as u64 + 1);
                    let (mut bytes, mut lat) = (0u64, Vec::new());
                    while !stop.load(Ordering::Relaxed) {
                        let k = key(pick(&mut rng));
                        let t0 = Instant::now();
                        match c.request(k.as_bytes(), &[b"GET", k.as_bytes()]) {
                            Ok(Reply::Bulk(v)) => bytes += v.len() as u64,
                            other => panic!("GET {k}: {other:?}"),
                        }
                        lat.push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    }
                    (bytes, lat)
                })
            })
            .collect();
        while !until() {
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().expect("a client thread")).collect()
    });
    let secs = started.elapsed().as_secs_f64();
    let cores = (cpu_seconds() - cpu) / secs;
    let bytes: u64 = results.iter().map(|r| r.0).sum();
    let mut lat: Vec<u32> = results.into_iter().flat_map(|r| r.1).collect();
    lat.sort_unstable();
    Load {
        gbps: bytes as f64 / secs / 1e9,
        rps: lat.len() as f64 / secs,
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        cores,
    }
}

fn throughput(args: &Args, run: usize, count: usize) -> serde_json::Value {
    let dir = args.dir.join(format!("run{run}-nodes{count}"));
    let working_set = args.keys * args.value_bytes as u64;
    // Every node's DRAM tier holds the whole working set: every GET is a DRAM hit.
    let dram = working_set + (64 << 20);
    let capacity = (working_set * 2).max(1 << 30);
    let (nodes, _) = start_nodes(&dir, count, dram, capacity, args.threads);
    let mut c = client(&nodes);
    let filled = Instant::now();
    for i in 0..args.keys {
        let k = key(i);
        let v = block(i, args.value_bytes);
        assert_eq!(c.request(k.as_bytes(), &[b"SET", k.as_bytes(), &v]).expect("SET"), Reply::Simple("OK".into()));
    }
    let fill_gbps = working_set as f64 / filled.elapsed().as_secs_f64() / 1e9;
    let hits_before: u64 = nodes.iter().map(|n| n.store.stats().tiers.first().map_or(0, |t| t.hits)).sum();
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let load = get_load(&nodes, args.clients, |rng| rng.below(args.keys), || Instant::now() >= deadline);
    let dram_hits: u64 =
        nodes.iter().map(|n| n.store.stats().tiers.first().map_or(0, |t| t.hits)).sum::<u64>() - hits_before;
    let cpu_s_per_gb = load.cores / load.gbps.max(1e-9);
    println!(
        "run {run}: {count} node(s): GET {:.2} GB/s, {:.0} req/s, p50 {} us, p99 {} us, {:.2} cores busy \
         ({cpu_s_per_gb:.2} CPU-s/GB); {} DRAM hits; {} clients, {} x {} KiB; fill {fill_gbps:.2} GB/s",
        load.gbps,
        load.rps,
        load.p50_us,
        load.p99_us,
        load.cores,
        dram_hits,
        args.clients,
        args.keys,
        args.value_bytes >> 10,
    );
    stop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
    serde_json::json!({
        "run": run, "nodes": count, "clients": args.clients, "keys": args.keys, "value_bytes": args.value_bytes,
        "get_gbps": load.gbps, "get_rps": load.rps, "get_p50_us": load.p50_us, "get_p99_us": load.p99_us,
        "cores_busy": load.cores, "cpu_s_per_gb": cpu_s_per_gb, "dram_hits": dram_hits, "fill_gbps": fill_gbps,
    })
}

/// How far the most and least loaded node are from an even share of LMCache's keys (two per
/// chunk: `...kv_bytes` and `...metadata`) under a balanced map of `count` nodes.
fn spread(count: usize, chunks: u64) -> serde_json::Value {
    let addrs: Vec<String> = (0..count).map(|i| format!("10.0.{}.{}:6379", i / 250, i % 250 + 1)).collect();
    let map = SlotMap::balanced(&addrs, 1).expect("a map");
    let mut per_node = vec![0u64; count];
    for i in 0..chunks {
        let hash = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64;
        for suffix in ["kv_bytes", "metadata"] {
            let k = format!("org/model@1@0@{hash:x}@bfloat16{suffix}");
            if let Some(n) = map.owner(keyslot(k.as_bytes())).and_then(|o| per_node.get_mut(o)) {
                *n += 1;
            }
        }
    }
    let even = (2 * chunks) as f64 / count as f64;
    let max = *per_node.iter().max().unwrap_or(&0) as f64 / even - 1.0;
    let min = *per_node.iter().min().unwrap_or(&0) as f64 / even - 1.0;
    let slots: Vec<usize> = (0..count).map(|i| map.slot_count(i)).collect();
    println!(
        "spread over {count} nodes of {} keys ({chunks} LMCache chunks): most loaded {:+.2}%, least {:+.2}% \
         from even; slots per node {}..{}",
        2 * chunks,
        max * 100.0,
        min * 100.0,
        slots.iter().min().unwrap_or(&0),
        slots.iter().max().unwrap_or(&0)
    );
    serde_json::json!({ "nodes": count, "keys": 2 * chunks, "max_over_even": max, "min_over_even": min })
}

fn slot_move(args: &Args) -> serde_json::Value {
    let dir = args.dir.join("move");
    let (nodes, map) = start_nodes(&dir, 3, 256 << 20, 2 << 30, args.threads);
    let mut c = client(&nodes);
    for i in 0..args.move_keys {
        let (k, value) = (key(i), block(i, args.move_value_bytes));
        assert_eq!(c.request(k.as_bytes(), &[b"SET", k.as_bytes(), &value]).expect("SET"), Reply::Simple("OK".into()));
    }
    let first = &nodes[0];
    let keys_before = first.store.stats().keys;
    // Half of the first node's slots go to the second.
    let ranges = map.ranges_of(0);
    let (lo, hi) = ranges.first().copied().expect("the first node owns slots");
    let mid = lo + (hi - lo) / 2;
    let (a, b, c3) = (addr(&nodes[0]), addr(&nodes[1]), addr(&nodes[2]));
    let text = format!("epoch 2\nnode {a} {}-{hi}\nnode {b} {lo}-{} 5461-10922\nnode {c3} 10923-16383\n", mid + 1, mid);
    let moved = SlotMap::parse(&text).expect("the moved map");
    // One client reading keys the first node keeps, for a second before and during the scan.
    let kept: Vec<u64> = (0..args.move_keys).filter(|&i| moved.owner(keyslot(key(i).as_bytes())) == Some(0)).collect();
    let pick = |rng: &mut Rng| kept[rng.below(kept.len() as u64) as usize];
    let second = Instant::now() + Duration::from_secs(1);
    let before = get_load(&nodes[..1], 1, pick, || Instant::now() >= second);
    let stats_before = first.running.cluster_stats();
    let started = Instant::now();
    let scan_done = || {
        let s = first.running.cluster_stats();
        s.evictions_done > stats_before.evictions_done && !s.evicting
    };
    let during = std::thread::scope(|s| {
        let reader = s.spawn(|| get_load(&nodes[..1], 1, pick, scan_done));
        // The reader has connected before the map changes.
        std::thread::sleep(Duration::from_millis(20));
        load(&nodes, &moved);
        reader.join().expect("the reader")
    });
    let secs = started.elapsed().as_secs_f64();
    let stats = first.running.cluster_stats();
    let deleted = stats.evicted_keys - stats_before.evicted_keys;
    println!(
        "slot move: {deleted} of {keys_before} keys ({} KiB each) on the losing node were in the {} slots it lost; \
         deleted in {secs:.3} s ({:.1} us per key listed, {:.0} keys/s deleted); a reader of the kept keys: \
         {:.0} req/s p99 {} us before, {:.0} req/s p99 {} us during",
        args.move_value_bytes >> 10,
        map.moved_slots(&moved),
        secs * 1e6 / stats.last_eviction_scanned.max(1) as f64,
        deleted as f64 / secs,
        before.rps,
        before.p99_us,
        during.rps,
        during.p99_us,
    );
    stop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
    serde_json::json!({
        "keys_on_node": keys_before, "value_bytes": args.move_value_bytes,
        "slots_moved": map.moved_slots(&moved), "keys_deleted": deleted,
        "keys_listed": stats.last_eviction_scanned, "seconds": secs,
        "reader_before": { "rps": before.rps, "p50_us": before.p50_us, "p99_us": before.p99_us },
        "reader_during": { "rps": during.rps, "p50_us": during.p50_us, "p99_us": during.p99_us },
    })
}

fn main() {
    let args = Args::parse();
    std::fs::create_dir_all(&args.dir).expect("create --dir");
    let runs: Vec<serde_json::Value> =
        args.nodes.iter().enumerate().map(|(i, &n)| throughput(&args, i + 1, n)).collect();
    let mean = |count: usize| {
        let of: Vec<f64> = runs.iter().filter(|r| r["nodes"] == count).filter_map(|r| r["get_gbps"].as_f64()).collect();
        of.iter().sum::<f64>() / of.len().max(1) as f64
    };
    let (fewest, most) = (args.nodes.iter().min().copied(), args.nodes.iter().max().copied());
    if let (Some(fewest), Some(most)) = (fewest, most) {
        if most > fewest {
            println!(
                "{most} nodes / {fewest} node(s), mean GB/s over the runs: {:.2} / {:.2} = {:.2}x",
                mean(most),
                mean(fewest),
                mean(most) / mean(fewest).max(1e-9)
            );
        }
    }
    let spreads: Vec<serde_json::Value> =
        if args.spread_chunks > 0 { [3, 6, 100].map(|n| spread(n, args.spread_chunks)).to_vec() } else { Vec::new() };
    let moved = (args.move_keys > 0).then(|| slot_move(&args));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{}", serde_json::json!({ "cpus": cpus, "throughput": runs, "spread": spreads, "move": moved }));
}
