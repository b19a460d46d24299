//! INFO and DBSIZE: what a node holds and how it is doing, in Redis's `# Section` / `name:value`
//! text (redis-py's `info()` parses it into a dict), with kvhoard's own fields in a `Kvhoard`
//! section. `kvhoard cluster status` reads them from every node.

use std::sync::Arc;

use kvhoard_engine::Stats;

use crate::metrics::Proto;
use crate::Shared;

/// The store's statistics, taken on the blocking pool (they take the store's locks).
async fn stats(shared: &Arc<Shared>) -> Result<Stats, String> {
    let store = Arc::clone(&shared.store);
    tokio::task::spawn_blocking(move || store.stats()).await.map_err(|e| e.to_string())
}

/// `DBSIZE`: keys in the RESP namespace.
pub(super) async fn dbsize(shared: &Arc<Shared>) -> Result<u64, String> {
    let stats = stats(shared).await?;
    Ok(namespace_stats(&stats, &shared.opts.resp_namespace).0)
}

/// (keys, logical bytes, stored bytes) of one namespace.
fn namespace_stats(stats: &Stats, namespace: &str) -> (u64, u64, u64) {
    stats
        .namespaces
        .iter()
        .find(|n| n.name == namespace)
        .map_or((0, 0, 0), |n| (n.keys, n.logical_bytes, n.stored_bytes))
}

/// `INFO [section...]`: every section, or those named.
pub(super) async fn info(sections: &[&[u8]], shared: &Arc<Shared>) -> Result<String, String> {
    let stats = stats(shared).await?;
    let wanted: Vec<String> = sections.iter().map(|s| String::from_utf8_lossy(s).to_ascii_lowercase()).collect();
    let all = wanted.is_empty() || wanted.iter().any(|w| matches!(w.as_str(), "all" | "default" | "everything"));
    let mut out = String::new();
    for (name, fields) in info_sections(&stats, shared) {
        if !all && !wanted.iter().any(|w| w.eq_ignore_ascii_case(name)) {
            continue;
        }
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        out.push_str(&format!("# {name}\r\n"));
        for (k, v) in fields {
            out.push_str(&format!("{k}:{v}\r\n"));
        }
    }
    Ok(out)
}

type Section = (&'static str, Vec<(&'static str, String)>);

fn info_sections(stats: &Stats, shared: &Shared) -> Vec<Section> {
    let config = shared.cluster.config();
    let namespace = &shared.opts.resp_namespace;
    let (keys, logical, stored) = namespace_stats(stats, namespace);
    let uptime = shared.started.elapsed().as_secs();
    let server = vec![
        ("redis_version", "7.2.0".to_string()),
        ("redis_mode", if config.is_some() { "cluster" } else { "standalone" }.to_string()),
        ("kvhoard_version", env!("CARGO_PKG_VERSION").to_string()),
        ("process_id", std::process::id().to_string()),
        ("uptime_in_seconds", uptime.to_string()),
    ];
    let clients = vec![("connected_clients", shared.metrics.open_connections(Proto::Resp).to_string())];
    let keyspace = vec![("db0", format!("keys={keys},expires=0,avg_ttl=0"))];
    let mut cluster = vec![("cluster_enabled", u8::from(config.is_some()).to_string())];
    let c = shared.cluster.stats();
    if let Some(config) = &config {
        let me = config.myself().map(|n| n.addr()).unwrap_or_default();
        cluster.extend([
            ("kvhoard_cluster_epoch", config.map().epoch().to_string()),
            ("kvhoard_cluster_digest", config.map().digest()),
            ("kvhoard_cluster_myself", me),
            ("kvhoard_cluster_slots_owned", config.owned_slots().to_string()),
            ("kvhoard_cluster_moved", c.moved.to_string()),
            ("kvhoard_cluster_evicting", u8::from(c.evicting).to_string()),
            ("kvhoard_cluster_evicted_keys", c.evicted_keys.to_string()),
            ("kvhoard_cluster_evictions_done", c.evictions_done.to_string()),
            ("kvhoard_cluster_last_eviction_ms", c.last_eviction_ms.to_string()),
            ("kvhoard_cluster_last_eviction_scanned", c.last_eviction_scanned.to_string()),
            ("kvhoard_cluster_last_eviction_keys", c.last_eviction_keys.to_string()),
        ]);
    }
    let dram = stats.tiers.iter().find(|t| t.tier == "dram");
    let kvhoard = vec![
        ("kvhoard_namespace", namespace.clone()),
        ("kvhoard_keys", keys.to_string()),
        ("kvhoard_logical_bytes", logical.to_string()),
        ("kvhoard_stored_bytes", stored.to_string()),
        ("kvhoard_volume_keys", stats.keys.to_string()),
        ("kvhoard_volume_capacity_bytes", stats.capacity_bytes.to_string()),
        ("kvhoard_volume_used_bytes", stats.used_bytes.to_string()),
        ("kvhoard_dram_resident_bytes", dram.map_or(0, |t| t.resident_bytes).to_string()),
        ("kvhoard_hits", stats.hits.to_string()),
        ("kvhoard_misses", stats.misses.to_string()),
        ("kvhoard_poisoned", u8::from(stats.poisoned.is_some()).to_string()),
    ];
    vec![("Server", server), ("Clients", clients), ("Keyspace", keyspace), ("Cluster", cluster), ("Kvhoard", kvhoard)]
}
