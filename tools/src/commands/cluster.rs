//! `kvhoard cluster`: writes a slot map for a set of nodes (`init`), and asks every node of a
//! map what it serves and holds (`status`). The map format and the design are in
//! docs/cluster.md; the serving side is `kvhoard serve --resp ADDR --cluster-config FILE`.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kvhoard_serve::cluster::client::{ClientOptions, Connection, Reply};
use kvhoard_serve::cluster::{Node, SlotMap, SLOTS};
use serde::Serialize;

use crate::size::human;

/// What `kvhoard cluster` does.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterAction {
    /// Write a slot map giving each node an equal share of the 16384 slots.
    ///
    /// Without --from, slots are divided in order as `redis-cli --cluster create` does (3 nodes:
    /// 0-5460, 5461-10922, 10923-16383). With --from OLD, the new map moves as few slots as it
    /// can from OLD (adding a node moves only its share to it; removing one moves only its
    /// slots), and its epoch is OLD's plus one. Copy the file to every node and send them
    /// SIGHUP (or start them with --cluster-config FILE).
    Init {
        /// The nodes, `HOST:PORT` each (`[IPv6]:PORT`), comma-separated: the addresses clients
        /// will be redirected to.
        #[arg(long, value_delimiter = ',', required = true, value_name = "HOST:PORT,...")]
        nodes: Vec<String>,
        /// Where to write the map (`-`: stdout).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// A map to change as little as possible.
        #[arg(long, value_name = "OLD")]
        from: Option<PathBuf>,
        /// The map's epoch [default: 1, or OLD's plus one].
        #[arg(long, value_name = "N")]
        epoch: Option<u64>,
        /// Replace FILE if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Connect to every node of a map (RESP) and show its slots, keys, bytes and health.
    ///
    /// A node is `ok` when it answers, serves in cluster mode, and runs the same map (same
    /// digest) as FILE; otherwise `down` (with why), `stale map` (another epoch or digest: send
    /// it SIGHUP), `standalone` or `error`. Exits 0 when every node is ok, 1 otherwise.
    Status {
        /// The cluster map.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Seconds to wait for each node.
        #[arg(long, default_value_t = 2.0, value_name = "SECS")]
        timeout: f64,
        /// File whose first line is the nodes' RESP password (default: KVHOARD_RESP_PASSWORD).
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
    },
}

pub fn run(action: &ClusterAction) -> anyhow::Result<ExitCode> {
    match action {
        ClusterAction::Init { nodes, out, from, epoch, force } => init(nodes, out, from.as_deref(), *epoch, *force),
        ClusterAction::Status { config, json, timeout, password_file } => {
            let password = password(password_file.as_deref())?;
            let timeout = Duration::try_from_secs_f64(*timeout)
                .ok()
                .filter(|t| !t.is_zero())
                .context("--timeout must be a positive number of seconds")?;
            status(config, *json, ClientOptions { timeout, password })
        }
    }
}

fn read_map(path: &Path) -> anyhow::Result<SlotMap> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the cluster map {}", path.display()))?;
    SlotMap::parse(&text).with_context(|| format!("cluster map {}", path.display()))
}

fn init(
    nodes: &[String],
    out: &Path,
    from: Option<&Path>,
    epoch: Option<u64>,
    force: bool,
) -> anyhow::Result<ExitCode> {
    let map = match from {
        None => SlotMap::balanced(nodes, epoch.unwrap_or(1))?,
        Some(old) => {
            let old = read_map(old)?;
            let next = match epoch {
                Some(e) => e,
                None => {
                    old.epoch().checked_add(1).context("the old map's epoch is the largest there is; give --epoch")?
                }
            };
            let new = old.rebalanced(nodes, next)?;
            eprintln!(
                "kvhoard: {} of {SLOTS} slots change owner ({:.1}%); their keys become misses until written again",
                old.moved_slots(&new),
                100.0 * old.moved_slots(&new) as f64 / f64::from(SLOTS)
            );
            new
        }
    };
    let text = map.render();
    if out == Path::new("-") {
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    crate::output::refuse_volume_file(out)?;
    if out.exists() && !force {
        bail!("{} exists; pass --force to replace it", out.display());
    }
    // Written next to the target and renamed, so a node reloading meanwhile reads a whole map.
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(text.as_bytes())?;
    tmp.persist(out).with_context(|| format!("cannot write {}", out.display()))?;
    for (i, node) in map.nodes().iter().enumerate() {
        let ranges: Vec<String> =
            map.ranges_of(i).iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
        eprintln!("  {:<24} {:>5} slots  {}", node.addr(), map.slot_count(i), ranges.join(","));
    }
    eprintln!("kvhoard: wrote {} (epoch {}, {} nodes)", out.display(), map.epoch(), map.nodes().len());
    Ok(ExitCode::SUCCESS)
}

fn password(file: Option<&Path>) -> anyhow::Result<Option<String>> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the RESP password from {}", path.display()))?;
        return Ok(Some(text.trim_end_matches(['\r', '\n']).to_string()).filter(|p| !p.is_empty()));
    }
    Ok(std::env::var("KVHOARD_RESP_PASSWORD").ok().filter(|p| !p.is_empty()))
}

/// What one node says about itself.
#[derive(Debug, Serialize)]
struct NodeStatus {
    addr: String,
    id: String,
    /// Slots the file gives it.
    slots: usize,
    health: String,
    ok: bool,
    latency_ms: Option<f64>,
    /// Slots it serves by its own map.
    slots_served: Option<u64>,
    epoch: Option<u64>,
    digest: Option<String>,
    keys: Option<u64>,
    logical_bytes: Option<u64>,
    stored_bytes: Option<u64>,
    capacity_bytes: Option<u64>,
    used_bytes: Option<u64>,
    clients: Option<u64>,
    uptime_secs: Option<u64>,
    moved: Option<u64>,
    evicting: Option<bool>,
    evicted_keys: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Report {
    config: String,
    epoch: u64,
    digest: String,
    nodes: Vec<NodeStatus>,
    healthy: usize,
    keys: u64,
    logical_bytes: u64,
}

fn status(config: &Path, json: bool, opts: ClientOptions) -> anyhow::Result<ExitCode> {
    let map = read_map(config)?;
    let digest = map.digest();
    // One thread per node, a bounded number at a time: a map of 100 nodes with some down takes
    // a few timeouts, not a hundred.
    let mut nodes = Vec::with_capacity(map.nodes().len());
    let indexed: Vec<(usize, &Node)> = map.nodes().iter().enumerate().collect();
    for batch in indexed.chunks(32) {
        let found: Vec<NodeStatus> = std::thread::scope(|s| {
            let (map, digest, opts) = (&map, &digest, &opts);
            let handles: Vec<_> = batch
                .iter()
                .map(|&(i, node)| {
                    let slots = map.slot_count(i);
                    s.spawn(move || probe(node, slots, map, digest, opts))
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        nodes.extend(found);
    }
    let report = Report {
        config: config.display().to_string(),
        epoch: map.epoch(),
        healthy: nodes.iter().filter(|n| n.ok).count(),
        keys: nodes.iter().filter_map(|n| n.keys).sum(),
        logical_bytes: nodes.iter().filter_map(|n| n.logical_bytes).sum(),
        digest,
        nodes,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(if report.healthy == report.nodes.len() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn probe(node: &Node, slots: usize, map: &SlotMap, digest: &str, opts: &ClientOptions) -> NodeStatus {
    let mut st = NodeStatus {
        addr: node.addr(),
        id: node.id.clone(),
        slots,
        health: String::new(),
        ok: false,
        latency_ms: None,
        slots_served: None,
        epoch: None,
        digest: None,
        keys: None,
        logical_bytes: None,
        stored_bytes: None,
        capacity_bytes: None,
        used_bytes: None,
        clients: None,
        uptime_secs: None,
        moved: None,
        evicting: None,
        evicted_keys: None,
    };
    let info = match ask(node, opts) {
        Ok((latency, info)) => {
            st.latency_ms = Some(latency.as_secs_f64() * 1e3);
            info
        }
        Err(why) => {
            st.health = format!("down: {why}");
            return st;
        }
    };
    let num = |k: &str| info.get(k).and_then(|v| v.parse::<u64>().ok());
    st.slots_served = num("kvhoard_cluster_slots_owned");
    st.epoch = num("kvhoard_cluster_epoch");
    st.digest = info.get("kvhoard_cluster_digest").cloned();
    st.keys = num("kvhoard_keys");
    st.logical_bytes = num("kvhoard_logical_bytes");
    st.stored_bytes = num("kvhoard_stored_bytes");
    st.capacity_bytes = num("kvhoard_volume_capacity_bytes");
    st.used_bytes = num("kvhoard_volume_used_bytes");
    st.clients = num("connected_clients");
    st.uptime_secs = num("uptime_in_seconds");
    st.moved = num("kvhoard_cluster_moved");
    st.evicting = num("kvhoard_cluster_evicting").map(|v| v == 1);
    st.evicted_keys = num("kvhoard_cluster_evicted_keys");
    st.health = match (info.get("cluster_enabled").map(String::as_str), st.digest.as_deref()) {
        (Some("1"), Some(d)) if d == digest => {
            st.ok = true;
            if st.evicting == Some(true) {
                "ok (deleting keys of lost slots)".into()
            } else {
                "ok".into()
            }
        }
        (Some("1"), _) => format!(
            "stale map: epoch {} digest {} (this file: epoch {} digest {digest}); send it SIGHUP",
            st.epoch.map_or_else(|| "?".into(), |e| e.to_string()),
            st.digest.as_deref().unwrap_or("?"),
            map.epoch()
        ),
        (Some(_), _) => "standalone: not serving in cluster mode (no --cluster-config)".into(),
        (None, _) => "error: INFO has no Cluster section (not kvhoard?)".into(),
    };
    st
}

/// PING (timed) and INFO.
fn ask(node: &Node, opts: &ClientOptions) -> Result<(Duration, HashMap<String, String>), String> {
    let mut conn = Connection::connect(&node.host, node.port, opts).map_err(|e| e.to_string())?;
    let started = Instant::now();
    if let Reply::Error(e) = conn.request(&[b"PING"]).map_err(|e| e.to_string())? {
        return Err(e);
    }
    let latency = started.elapsed();
    let info = match conn.request(&[b"INFO"]).map_err(|e| e.to_string())? {
        Reply::Error(e) => return Err(e),
        reply => reply.text().unwrap_or_default(),
    };
    let fields = info
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect();
    Ok((latency, fields))
}

fn print_report(r: &Report) {
    println!("cluster map {}: epoch {}, {} node(s), digest {}", r.config, r.epoch, r.nodes.len(), r.digest);
    println!("{:<24} {:>6} {:>10} {:>10} {:>10} {:>8}  HEALTH", "NODE", "SLOTS", "KEYS", "BYTES", "STORED", "PING_MS");
    let dash = || "-".to_string();
    for n in &r.nodes {
        println!(
            "{:<24} {:>6} {:>10} {:>10} {:>10} {:>8}  {}",
            n.addr,
            n.slots,
            n.keys.map_or_else(dash, |k| k.to_string()),
            n.logical_bytes.map_or_else(dash, human),
            n.stored_bytes.map_or_else(dash, human),
            n.latency_ms.map_or_else(dash, |l| format!("{l:.2}")),
            n.health
        );
    }
    println!(
        "{} of {} node(s) ok; {} keys, {} over the nodes that answered",
        r.healthy,
        r.nodes.len(),
        r.keys,
        human(r.logical_bytes)
    );
}
