//! kvhoard as a network server for LMCache.
//!
//! Three listeners over one [`Store`], each optional:
//!
//! - `lm`: LMCache's own `lm://` protocol ([`lm::wire`]), byte for byte as lmcache 0.5.6 speaks
//!   it, with each chunk's format, dtype and shape kept in its block record;
//! - `resp`: the RESP subset LMCache's `resp://` (native C++ client) and `redis://` (redis-py)
//!   connectors use ([`resp`]);
//! - `metrics`: Prometheus metrics over HTTP ([`metrics`]).
//!
//! The RESP listener can also be one node of a Redis Cluster made of kvhoard nodes sharing a
//! slot map ([`cluster`]).
//!
//! The server runs on its own tokio runtime ([`start`] returns a [`Running`] handle), so callers
//! stay synchronous. Engine calls that may touch the disk run on the runtime's blocking pool;
//! payload memory is taken as bytes arrive from a byte budget shared by all connections
//! ([`budget`]), every request must arrive at a minimum rate ([`pace`]), buffers left idle are
//! given back to the system, and the number of connections is limited: one misbehaving client
//! costs only its own connection.

#![deny(missing_docs)]

pub mod budget;
pub mod cluster;
mod conn;
mod end;
mod idle;
mod listen;
pub mod lm;
pub mod metrics;
mod options;
pub mod pace;
mod payload;
pub mod policy_json;
pub mod resp;
mod shared;

pub use options::ServeOptions;
pub(crate) use shared::Shared;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kvhoard_engine::buffer::BufferPool;
use kvhoard_engine::Store;
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::budget::Budget;
use crate::cluster::{ClusterConfig, ClusterStats, Live, SlotChange};
use crate::metrics::{Metrics, Proto};

/// Why the server could not start.
#[derive(Debug, Error)]
pub enum ServeError {
    /// No listener was asked for.
    #[error("nothing to serve: give at least one of --lm, --resp")]
    NoListener,
    /// A listener could not bind.
    #[error("cannot listen on {addr} for {what}: {source}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The runtime could not start.
    #[error("cannot start the server's threads: {0}")]
    Runtime(std::io::Error),
    /// An option is out of range.
    #[error("invalid option: {0}")]
    Invalid(String),
}

/// The addresses actually bound (a port 0 becomes the port the kernel chose).
#[derive(Debug, Clone, Copy, Default)]
pub struct Addresses {
    /// `lm://` listener.
    pub lm: Option<SocketAddr>,
    /// RESP listener.
    pub resp: Option<SocketAddr>,
    /// Metrics listener.
    pub metrics: Option<SocketAddr>,
}

/// A running server.
pub struct Running {
    runtime: Option<tokio::runtime::Runtime>,
    stop: watch::Sender<bool>,
    accept: Vec<JoinHandle<()>>,
    connections: Arc<Semaphore>,
    max_connections: u32,
    addrs: Addresses,
    metrics: Arc<Metrics>,
    cluster: Arc<Live>,
    idle: Arc<idle::Idle>,
}

/// How a shutdown went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Connections still busy when the grace period ended (their requests were cut off).
    pub connections_cut: usize,
}

/// Binds the listeners and starts serving `store`.
pub fn start(store: Arc<Store>, opts: ServeOptions) -> Result<Running, ServeError> {
    if opts.lm.is_none() && opts.resp.is_none() {
        return Err(ServeError::NoListener);
    }
    opts.validate().map_err(ServeError::Invalid)?;
    check_codecs(&store, &opts)?;
    let max_connections = u32::try_from(opts.max_connections.min(Semaphore::MAX_PERMITS))
        .map_err(|_| ServeError::Invalid("max connections out of range".into()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(network_threads(opts.threads))
        .max_blocking_threads(opts.blocking_threads)
        .thread_name("kvhoard-serve")
        .enable_io()
        .enable_time()
        .build()
        .map_err(ServeError::Runtime)?;
    let bind = |what: &'static str, addr: Option<SocketAddr>| {
        addr.map(|addr| {
            runtime.block_on(TcpListener::bind(addr)).map_err(|source| ServeError::Bind { what, addr, source })
        })
        .transpose()
    };
    let lm = bind("lm://", opts.lm)?;
    let resp = bind("RESP", opts.resp)?;
    let http = bind("metrics", opts.metrics)?;
    let local = |l: &Option<TcpListener>| l.as_ref().and_then(|l| l.local_addr().ok());
    let addrs = Addresses { lm: local(&lm), resp: local(&resp), metrics: local(&http) };

    let (stop, shutdown) = watch::channel(false);
    let metrics = Arc::new(Metrics::default());
    let cluster = Arc::new(Live::new(opts.cluster.clone()));
    // Recycle up to a quarter of the budget in idle buffers; the rest is returned to the system.
    let pool_bytes = usize::try_from(opts.inflight_bytes / 4).unwrap_or(usize::MAX);
    let idle = Arc::new(idle::Idle::default());
    let shared = Arc::new(Shared {
        store,
        budget: Budget::new(opts.inflight_bytes),
        pool: BufferPool::new(64, pool_bytes),
        metrics: Arc::clone(&metrics),
        shutdown,
        blocking_sends: Semaphore::new((opts.blocking_threads / 2).max(1)),
        plan_views: Semaphore::new(1),
        idle: Arc::clone(&idle),
        cluster: Arc::clone(&cluster),
        started: std::time::Instant::now(),
        opts,
    });
    let connections = Arc::new(Semaphore::new(max_connections as usize));
    let mut accept = Vec::new();
    for (listener, proto) in [(lm, Proto::Lm), (resp, Proto::Resp)] {
        if let Some(listener) = listener {
            let task = listen::accept_loop(listener, proto, Arc::clone(&shared), Arc::clone(&connections));
            accept.push(runtime.spawn(task));
        }
    }
    if shared.opts.resp.is_some() {
        // Awaited at shutdown with the accept loops: it stops between two pages of its scan.
        accept.push(runtime.spawn(cluster::evict::run(Arc::clone(&shared))));
    }
    if let Some(listener) = http {
        accept.push(runtime.spawn(metrics::http::serve(listener, Arc::clone(&shared))));
    }
    runtime.spawn(trim_idle_buffers(Arc::clone(&shared)));
    Ok(Running { runtime: Some(runtime), stop, accept, connections, max_connections, addrs, metrics, cluster, idle })
}

/// Buffers unused this long are freed: the pools keep buffers to save page faults while traffic
/// lasts, not after it.
const BUFFER_IDLE: Duration = Duration::from_secs(5);

/// Frees idle buffers of the server and the store every second, until shutdown.
async fn trim_idle_buffers(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let freed = shared.pool.trim(BUFFER_IDLE) + shared.store.trim_buffers(BUFFER_IDLE);
        if freed > 0 {
            tracing::debug!(freed, "freed idle buffers");
        }
    }
}

/// Refuses to serve with a codec lm:// and RESP clients could not take back (one that drops
/// tokens: they read whole blocks), or one the namespace's policy denies.
fn check_codecs(store: &Store, opts: &ServeOptions) -> Result<(), ServeError> {
    let served =
        [(opts.lm.is_some(), &opts.lm_namespace, "lm://"), (opts.resp.is_some(), &opts.resp_namespace, "RESP")];
    for (_, namespace, what) in served.iter().filter(|(on, _, _)| *on) {
        let policy = store.policy(namespace);
        let codec = opts.codec.or(policy.codec);
        if let Some(spec) = codec.filter(|c| c.drops_tokens()) {
            return Err(ServeError::Invalid(format!(
                "namespace {namespace:?} is served over {what}, whose clients read whole blocks, but its codec {spec} drops \
                 tokens; choose a codec without a drop stage (kvhoard ns set / --codec)"
            )));
        }
        if let Err(e) = policy.codec_for(namespace, opts.codec) {
            return Err(ServeError::Invalid(format!("--codec for {what}: {e}")));
        }
    }
    Ok(())
}

fn network_threads(asked: usize) -> usize {
    match asked {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 64),
        n => n,
    }
}

impl Running {
    /// Where the listeners are.
    pub fn addrs(&self) -> Addresses {
        self.addrs
    }

    /// The server's own counters (the store has its own statistics).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Connections waiting for their next request (the ones a full server may close for room).
    pub fn idle_connections(&self) -> usize {
        self.idle.len()
    }

    /// Replaces the slot map the RESP listener serves (`None`: standalone). Requests already
    /// routed finish under the old map; keys of slots this node no longer owns are answered
    /// with `-MOVED` at once and deleted in the background.
    pub fn set_cluster(&self, config: Option<ClusterConfig>) -> SlotChange {
        let change = self.cluster.set(config);
        tracing::info!(gained = change.gained, lost = change.lost, owned = change.owned, "cluster: slot map loaded");
        change
    }

    /// The slot map served now.
    pub fn cluster(&self) -> Option<ClusterConfig> {
        self.cluster.config().map(|c| (*c).clone())
    }

    /// The cluster layer's counters.
    pub fn cluster_stats(&self) -> ClusterStats {
        self.cluster.stats()
    }

    /// Stops accepting, lets requests in progress finish for up to `grace`, then stops. Idle
    /// connections are closed at once. The store is left open: the caller closes it.
    pub fn shutdown(mut self, grace: Duration) -> ShutdownReport {
        let _ = self.stop.send(true);
        let Some(runtime) = self.runtime.take() else {
            return ShutdownReport { connections_cut: 0 };
        };
        let accept = std::mem::take(&mut self.accept);
        let connections = Arc::clone(&self.connections);
        let max = self.max_connections;
        let cut = runtime.block_on(async move {
            for task in accept {
                let _ = task.await;
            }
            // Every connection holds one permit until it ends; all permits back = all done.
            match tokio::time::timeout(grace, connections.acquire_many(max)).await {
                Ok(_) => 0,
                Err(_) => max as usize - connections.available_permits(),
            }
        });
        runtime.shutdown_timeout(Duration::from_secs(1));
        ShutdownReport { connections_cut: cut }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
