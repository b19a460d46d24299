//! `kvhoard serve`: serves a volume to LMCache over lm:// and RESP until SIGINT or SIGTERM; as
//! one node of a cluster (`--cluster-config`), reloads the slot map on SIGHUP.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use kvhoard_engine::{Durability, StoreOptions};
use kvhoard_serve::cluster::{ClusterConfig, SlotMap};
use kvhoard_serve::{Running, ServeOptions};

use super::open;
use super::signals::{block_signals, block_signals_and_reload, wait_signal, RELOAD};

/// The flags of `serve`: parsed here once, turned into the server's options by [`options`].
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address for LMCache's lm:// protocol.
    #[arg(long, value_name = "ADDR")]
    pub lm: Option<String>,
    /// Address for RESP (LMCache's resp:// and redis:// connectors).
    #[arg(long, value_name = "ADDR")]
    pub resp: Option<String>,
    /// Address for Prometheus metrics over HTTP (GET /metrics; also /plan, /ttl, /ns).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Let `kvhoard ns set http://METRICS_ADDR ...` change namespace policies while serving
    /// (`PUT /ns` on the metrics address, from this machine's loopback addresses only).
    #[arg(long, requires = "metrics")]
    pub allow_policy_changes: bool,
    /// Allow listening on addresses other than loopback.
    #[arg(long)]
    pub allow_remote: bool,
    /// Namespace for keys stored through lm://.
    #[arg(long, default_value = "lmcache", value_name = "NS")]
    pub lm_namespace: String,
    /// Namespace for keys stored through RESP.
    #[arg(long, default_value = "lmcache", value_name = "NS")]
    pub resp_namespace: String,
    /// File whose first line is the password RESP clients must AUTH with.
    #[arg(long, value_name = "FILE")]
    pub resp_password_file: Option<PathBuf>,
    /// Largest object accepted; larger ones are refused (read and dropped).
    #[arg(long, value_parser = crate::size::parse_size, default_value = "256MiB", value_name = "SIZE")]
    pub max_object_size: u64,
    /// Most connections at once; more are closed as they arrive.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_connections: usize,
    /// Payload bytes held in memory at once over all connections; requests wait for room.
    #[arg(long, value_parser = crate::size::parse_size, default_value = "2GiB", value_name = "SIZE")]
    pub max_inflight: u64,
    /// Seconds a client may stall in the middle of a request before it is disconnected (also
    /// how long shutdown waits for requests in progress).
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pub request_timeout: u64,
    /// Seconds a request's header may take to arrive from its first byte; its payload gets this
    /// long plus what --min-rate allows.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub header_timeout: u64,
    /// Bytes per second every request must keep up on average (0 = no limit); a client
    /// trickling slower is disconnected.
    #[arg(long, value_parser = crate::size::parse_size, default_value = "1MiB", value_name = "SIZE")]
    pub min_rate: u64,
    /// Seconds a connection may sit idle between requests (0 = forever; LMCache keeps its
    /// connections open).
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    pub idle_timeout: u64,
    /// Durability of stored objects (see put); a RESP SET is answered at this level.
    #[arg(long, default_value = "written", value_parser = crate::flags::parse_durability, value_name = "LEVEL")]
    pub durability: Durability,
    /// Seconds until every stored object expires (RESP SET EX/PX overrides).
    #[arg(long, value_name = "SECS")]
    pub ttl: Option<u32>,
    /// Codec for what arrives over lm:// and RESP (default: each namespace's policy). lm:// PUTs
    /// carry the tensor's description, so quant and lossless apply to them; RESP values are
    /// opaque bytes and are stored as they are. A codec that drops tokens is refused (those
    /// clients read whole blocks), as is a lossy one where the namespace denies lossy codecs.
    #[arg(long, value_parser = crate::flags::parse_codec, value_name = "SPEC")]
    pub codec: Option<kvhoard_engine::CodecSpec>,
    /// Bytes of objects to keep in a DRAM tier above the log (0 = none).
    #[arg(long, value_parser = crate::size::parse_size, default_value = "1GiB", value_name = "SIZE")]
    pub dram_tier: u64,
    /// Network threads (0: one per CPU, at most 64). Sending a payload copies it into the
    /// socket on the sending thread, so concurrent connections need several.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub threads: usize,
    /// Serve RESP as one node of a Redis Cluster whose slot map is FILE (written by `kvhoard
    /// cluster init`; docs/cluster.md). Keys of slots other nodes own get `-MOVED`. SIGHUP
    /// reads the file again; keys of slots this node loses are then deleted in the background.
    #[arg(long, value_name = "FILE", requires = "resp")]
    pub cluster_config: Option<PathBuf>,
    /// This node's address as the cluster map names it (default: the entry with --resp's
    /// address, or the only one with its port).
    #[arg(long, value_name = "HOST:PORT", requires = "cluster_config")]
    pub cluster_announce: Option<String>,
    #[command(flatten)]
    pub placement: crate::flags::PlacementArgs,
}

/// Environment variable holding the RESP password (instead of --resp-password-file).
const PASSWORD_ENV: &str = "KVHOARD_RESP_PASSWORD";

/// `PORT`, `HOST:PORT` or `[V6]:PORT`; a bare port listens on 127.0.0.1.
pub fn parse_addr(s: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.to_socket_addrs()
        .with_context(|| format!("{s:?} is not an address: use PORT, HOST:PORT or [IPv6]:PORT"))?
        .next()
        .with_context(|| format!("{s:?} resolves to no address"))
}

fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback()
}

fn password(args: &ServeArgs) -> anyhow::Result<Option<String>> {
    if let Some(path) = &args.resp_password_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the RESP password from {}", path.display()))?;
        let pass = text.trim_end_matches(['\r', '\n']).to_string();
        if pass.is_empty() {
            bail!("{} is empty: put the RESP password in it", path.display());
        }
        return Ok(Some(pass));
    }
    Ok(std::env::var(PASSWORD_ENV).ok().filter(|p| !p.is_empty()))
}

pub fn options(args: &ServeArgs) -> anyhow::Result<ServeOptions> {
    let addr = |s: &Option<String>| s.as_deref().map(parse_addr).transpose();
    let (lm, resp, metrics) = (addr(&args.lm)?, addr(&args.resp)?, addr(&args.metrics)?);
    if lm.is_none() && resp.is_none() {
        bail!("nothing to serve: give --lm ADDR (LMCache's lm://), --resp ADDR (resp:// and redis://), or both");
    }
    let resp_password = password(args)?;
    for (what, a) in [("--lm", lm), ("--resp", resp), ("--metrics", metrics)] {
        if let Some(a) = a.filter(|a| !is_local(a.ip())) {
            if !args.allow_remote {
                bail!(
                    "{what} {a} listens beyond this machine, where anyone who can reach it can read and overwrite \
                     every cached object; pass --allow-remote if that is what you want"
                );
            }
            if what == "--resp" && resp_password.is_none() {
                bail!(
                    "--resp {a} listens beyond this machine without a password; set one with --resp-password-file \
                     FILE or {PASSWORD_ENV}"
                );
            }
        }
    }
    Ok(ServeOptions {
        lm,
        resp,
        metrics,
        policy_changes: args.allow_policy_changes,
        lm_namespace: args.lm_namespace.clone(),
        resp_namespace: args.resp_namespace.clone(),
        resp_password,
        max_object_bytes: args.max_object_size,
        max_connections: args.max_connections,
        inflight_bytes: args.max_inflight,
        request_timeout: Duration::from_secs(args.request_timeout),
        header_timeout: Duration::from_secs(args.header_timeout),
        min_rate: args.min_rate,
        idle_timeout: (args.idle_timeout > 0).then(|| Duration::from_secs(args.idle_timeout)),
        durability: args.durability,
        ttl_secs: args.ttl,
        codec: args.codec,
        threads: args.threads,
        ..ServeOptions::default()
    })
}

/// Reads the cluster map and finds this node in it (`None` without --cluster-config).
pub fn cluster_config(args: &ServeArgs, resp: Option<SocketAddr>) -> anyhow::Result<Option<ClusterConfig>> {
    let Some(path) = &args.cluster_config else { return Ok(None) };
    let Some(resp) = resp.filter(|a| a.port() != 0) else {
        bail!("--cluster-config needs --resp with a fixed port: the map tells clients where each node listens");
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the cluster map {}", path.display()))?;
    let map = SlotMap::parse(&text).with_context(|| format!("cluster map {}", path.display()))?;
    let config = match &args.cluster_announce {
        Some(addr) => ClusterConfig::for_address(map, addr),
        None => ClusterConfig::for_listener(map, resp),
    };
    Ok(Some(config.with_context(|| format!("cluster map {}", path.display()))?))
}

fn describe(config: &ClusterConfig) -> String {
    let me = config.myself().map(|n| n.addr()).unwrap_or_default();
    format!(
        "cluster node {me}, {} of {} slots, map epoch {} of {} node(s)",
        config.owned_slots(),
        kvhoard_serve::cluster::SLOTS,
        config.map().epoch(),
        config.map().nodes().len()
    )
}

/// SIGHUP: reads the map again. A map that cannot be used is reported and the old one kept: a
/// typo must not take a node out of the cluster.
fn reload(running: &Running, args: &ServeArgs, resp: Option<SocketAddr>) {
    match cluster_config(args, resp) {
        Ok(Some(config)) => {
            let what = describe(&config);
            let change = running.set_cluster(Some(config));
            eprintln!(
                "kvhoard: cluster map reloaded: {what}; {} slot(s) gained, {} lost (their keys are deleted in the background)",
                change.gained, change.lost
            );
        }
        Ok(None) => {}
        Err(e) => {
            tracing::error!("cluster map not reloaded: {}", crate::plain_error(&e));
            let still = running
                .cluster()
                .map_or_else(String::new, |c| format!("; still serving map epoch {}", c.map().epoch()));
            eprintln!("kvhoard: cluster map NOT reloaded: {}{still}", crate::plain_error(&e));
        }
    }
}

pub fn run(volume: &Path, args: &ServeArgs, opts: StoreOptions) -> anyhow::Result<ExitCode> {
    let mut serve_opts = options(args)?;
    serve_opts.cluster = cluster_config(args, serve_opts.resp)?;
    let (opts, placed) = args.placement.apply(StoreOptions { dram_tier_bytes: args.dram_tier, ..opts })?;
    // SIGHUP is only taken over when there is a map to reload; otherwise it keeps its default.
    let signals = if serve_opts.cluster.is_some() { block_signals_and_reload() } else { block_signals() };
    let store = Arc::new(open(volume, opts)?);
    placed.opened(&store);
    let running = kvhoard_serve::start(Arc::clone(&store), serve_opts.clone()).context("cannot start serving")?;
    let addrs = running.addrs();
    let mut lines = Vec::new();
    if let Some(a) = addrs.lm {
        lines.push(format!("lm://{a} (namespace {})", serve_opts.lm_namespace));
    }
    if let Some(a) = addrs.resp {
        let auth = if serve_opts.resp_password.is_some() { ", password required" } else { "" };
        let cluster = serve_opts.cluster.as_ref().map_or_else(String::new, |c| format!(", {}", describe(c)));
        lines.push(format!("resp://{a} (namespace {}{auth}{cluster})", serve_opts.resp_namespace));
    }
    if let Some(a) = addrs.metrics {
        lines.push(format!("http://{a}/metrics"));
    }
    eprintln!("kvhoard: serving {} on {}; Ctrl-C to stop", volume.display(), lines.join(", "));
    let sig = loop {
        match wait_signal(&signals, Duration::from_secs(1)) {
            Some(RELOAD) => reload(&running, args, serve_opts.resp),
            Some(sig) => break sig,
            None => {}
        }
    };
    tracing::info!(signal = sig, "stopping");
    let report = running.shutdown(serve_opts.request_timeout);
    if report.connections_cut > 0 {
        eprintln!(
            "kvhoard: {} connection(s) still busy after {:?} were cut off",
            report.connections_cut, serve_opts.request_timeout
        );
    }
    let store = Arc::try_unwrap(store).ok().context("a request is still using the volume; it was not closed")?;
    store.close().context("closing the volume")?;
    eprintln!("kvhoard: stopped (signal {sig}), volume closed");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ServeArgs {
        ServeArgs {
            lm: Some("0".into()),
            resp: None,
            metrics: None,
            allow_policy_changes: false,
            allow_remote: false,
            lm_namespace: "lmcache".into(),
            resp_namespace: "lmcache".into(),
            resp_password_file: None,
            max_object_size: 1 << 20,
            max_connections: 8,
            max_inflight: 1 << 30,
            request_timeout: 30,
            header_timeout: 10,
            min_rate: 1 << 20,
            idle_timeout: 0,
            durability: Durability::Written,
            ttl: None,
            codec: None,
            dram_tier: 0,
            threads: 1,
            cluster_config: None,
            cluster_announce: None,
            placement: crate::flags::PlacementArgs {
                placement: crate::replay::planning::PlacementChoice::Fifo,
                planner_ssd_gbps: crate::replay::planning::DEFAULT_SSD_GBPS,
            },
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(parse_addr("65432").unwrap(), "127.0.0.1:65432".parse().unwrap());
        assert_eq!(parse_addr("0.0.0.0:1").unwrap(), "0.0.0.0:1".parse().unwrap());
        assert_eq!(parse_addr("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        assert!(parse_addr("nonsense").is_err());
    }

    #[test]
    fn remote_listeners_need_a_flag_and_resp_a_password() {
        let remote = ServeArgs { lm: Some("0.0.0.0:0".into()), ..args() };
        assert!(options(&remote).unwrap_err().to_string().contains("--allow-remote"));
        assert!(options(&ServeArgs { allow_remote: true, ..remote }).is_ok());
        let resp = ServeArgs { resp: Some("0.0.0.0:0".into()), allow_remote: true, ..args() };
        if std::env::var(PASSWORD_ENV).is_err() {
            assert!(options(&resp).unwrap_err().to_string().contains("without a password"));
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "hunter2\n").unwrap();
        let with = options(&ServeArgs { resp_password_file: Some(file), ..resp }).unwrap();
        assert_eq!(with.resp_password.as_deref(), Some("hunter2"));
        assert!(options(&ServeArgs { lm: None, ..args() }).unwrap_err().to_string().contains("nothing to serve"));
    }

    #[test]
    fn a_cluster_node_finds_itself_in_the_map_or_says_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cluster.map");
        std::fs::write(&file, "node 127.0.0.1:7001 0-8000\nnode 127.0.0.1:7002 8001-16383\n").unwrap();
        let resp = |a: &str| Some(parse_addr(a).unwrap());
        let with = ServeArgs { cluster_config: Some(file.clone()), ..args() };
        let config = cluster_config(&with, resp("7002")).unwrap().unwrap();
        assert_eq!((config.myself_index(), config.owned_slots()), (1, 8383));
        let err = cluster_config(&with, resp("7003")).unwrap_err();
        assert!(format!("{err:#}").contains("is not in the cluster map"), "{err:#}");
        assert!(cluster_config(&with, resp("0")).unwrap_err().to_string().contains("fixed port"));
        let announced = ServeArgs { cluster_announce: Some("127.0.0.1:7001".into()), ..with.clone() };
        assert_eq!(cluster_config(&announced, resp("0.0.0.0:7002")).unwrap().unwrap().myself_index(), 0);
        std::fs::write(&file, "node 127.0.0.1:7001 0-100\n").unwrap();
        let err = cluster_config(&with, resp("7001")).unwrap_err();
        assert!(format!("{err:#}").contains("assigned to no node"), "{err:#}");
        assert!(cluster_config(&args(), resp("7001")).unwrap().is_none());
    }
}
