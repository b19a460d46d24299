//! Cluster mode for the RESP listener: several kvhoard nodes behave as one Redis Cluster, so that
//! Redis Cluster clients (redis-py's `RedisCluster`, LMCache's `redis-cluster://` connector,
//! `redis-cli -c`) spread keys over them with no change on their side.
//!
//! Every node reads the same slot map ([`map`]) from a file; there is no gossip, no replication
//! and no failover: a node answers `CLUSTER SLOTS` and friends from the map ([`commands`]),
//! serves keys whose slot ([`slots`]) it owns, and answers `-MOVED SLOT HOST:PORT` for the rest.
//! A new map can be loaded while serving ([`Live::set`]); the keys of slots a node no longer
//! owns are then deleted in the background ([`evict`]), since they are unreachable and would
//! otherwise come back stale if their slots returned. [`client`] is a small blocking RESP client
//! that follows MOVED, for the tools and tests. docs/cluster.md has the design.

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

pub mod client;
pub mod commands;
pub(crate) mod evict;
pub mod map;
pub mod slots;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::watch;

pub use map::{MapError, Node, SlotMap};
pub use slots::{keyslot, SLOTS};

/// A slot map and which of its nodes this server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    map: Arc<SlotMap>,
    myself: usize,
}

impl ClusterConfig {
    /// This server is the node at `addr` (`HOST:PORT` as the map writes it).
    pub fn for_address(map: SlotMap, addr: &str) -> Result<ClusterConfig, MapError> {
        let myself = map.find(addr)?;
        Ok(ClusterConfig { map: Arc::new(map), myself })
    }

    /// This server is the node a RESP listener bound to `listener` is
    /// ([`SlotMap::find_listener`]).
    pub fn for_listener(map: SlotMap, listener: SocketAddr) -> Result<ClusterConfig, MapError> {
        let myself = map.find_listener(listener)?;
        Ok(ClusterConfig { map: Arc::new(map), myself })
    }

    /// The map.
    pub fn map(&self) -> &SlotMap {
        &self.map
    }

    /// This node's index in the map.
    pub fn myself_index(&self) -> usize {
        self.myself
    }

    /// This node.
    pub fn myself(&self) -> Option<&Node> {
        self.map.nodes().get(self.myself)
    }

    /// Whether this node serves `slot`.
    pub fn owns(&self, slot: u16) -> bool {
        self.map.owner(slot) == Some(self.myself)
    }

    /// Slots this node owns.
    pub fn owned_slots(&self) -> usize {
        self.map.slot_count(self.myself)
    }
}

/// What changed for this node when a map was loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotChange {
    /// Slots it owns now and did not before.
    pub gained: usize,
    /// Slots it owned before and does not now (their keys are deleted in the background).
    pub lost: usize,
    /// Slots it owns now.
    pub owned: usize,
}

/// Counters of the cluster layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClusterStats {
    /// `-MOVED` replies sent.
    pub moved: u64,
    /// Keys deleted because their slot belongs to another node.
    pub evicted_keys: u64,
    /// Scans for such keys that ran to the end.
    pub evictions_done: u64,
    /// Whether a scan is running now.
    pub evicting: bool,
    /// How long the last complete scan took, in milliseconds.
    pub last_eviction_ms: u64,
    /// Keys the last complete scan looked at.
    pub last_eviction_scanned: u64,
    /// Keys the last complete scan deleted.
    pub last_eviction_keys: u64,
}

/// The cluster state every connection reads: the current map (if the server is in cluster mode)
/// and counters. Replaced whole on a reload, so a request sees one map from start to end.
#[derive(Debug)]
pub(crate) struct Live {
    config: RwLock<Option<Arc<ClusterConfig>>>,
    /// Bumped on every change; the evictor wakes on it.
    generation: watch::Sender<u64>,
    pub(crate) moved: AtomicU64,
    pub(crate) evicted_keys: AtomicU64,
    pub(crate) evictions_done: AtomicU64,
    pub(crate) evicting: AtomicBool,
    pub(crate) last_eviction_ms: AtomicU64,
    pub(crate) last_eviction_scanned: AtomicU64,
    pub(crate) last_eviction_keys: AtomicU64,
}

impl Live {
    pub(crate) fn new(config: Option<ClusterConfig>) -> Live {
        Live {
            config: RwLock::new(config.map(Arc::new)),
            generation: watch::Sender::new(0),
            moved: AtomicU64::new(0),
            evicted_keys: AtomicU64::new(0),
            evictions_done: AtomicU64::new(0),
            evicting: AtomicBool::new(false),
            last_eviction_ms: AtomicU64::new(0),
            last_eviction_scanned: AtomicU64::new(0),
            last_eviction_keys: AtomicU64::new(0),
        }
    }

    /// The map now, or `None` in standalone mode.
    pub(crate) fn config(&self) -> Option<Arc<ClusterConfig>> {
        // A poisoned lock only means a writer panicked between two plain assignments: the
        // value inside is whole either way.
        self.config.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the map (`None`: back to standalone) and wakes the evictor.
    pub(crate) fn set(&self, config: Option<ClusterConfig>) -> SlotChange {
        let new = config.map(Arc::new);
        let old = {
            let mut slot = self.config.write().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *slot, new.clone())
        };
        self.generation.send_modify(|g| *g += 1);
        let owns = |c: &Option<Arc<ClusterConfig>>, s: u16| c.as_ref().is_some_and(|c| c.owns(s));
        let mut change = SlotChange::default();
        for s in 0..SLOTS {
            match (owns(&old, s), owns(&new, s)) {
                (false, true) => change.gained += 1,
                (true, false) => change.lost += 1,
                _ => {}
            }
        }
        change.owned = new.as_ref().map_or(0, |c| c.owned_slots());
        change
    }

    /// Whether this node serves `slot` now (every slot in standalone mode).
    pub(crate) fn owns(&self, slot: u16) -> bool {
        self.config().is_none_or(|c| c.owns(slot))
    }

    pub(crate) fn watch(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    pub(crate) fn stats(&self) -> ClusterStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ClusterStats {
            moved: get(&self.moved),
            evicted_keys: get(&self.evicted_keys),
            evictions_done: get(&self.evictions_done),
            evicting: self.evicting.load(Ordering::Relaxed),
            last_eviction_ms: get(&self.last_eviction_ms),
            last_eviction_scanned: get(&self.last_eviction_scanned),
            last_eviction_keys: get(&self.last_eviction_keys),
        }
    }

    /// Prometheus lines for the cluster layer (nothing in standalone mode).
    pub(crate) fn prometheus(&self) -> String {
        let Some(config) = self.config() else { return String::new() };
        let s = self.stats();
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
            out.push_str(&format!("# HELP kvhoard_serve_cluster_{name} {help}\n# TYPE kvhoard_serve_cluster_{name} {kind}\nkvhoard_serve_cluster_{name} {value}\n"));
        };
        metric("epoch", "gauge", "Epoch of the slot map this node serves.", config.map().epoch());
        metric("slots_owned", "gauge", "Slots this node serves.", config.owned_slots() as u64);
        metric("moved_total", "counter", "MOVED redirections sent.", s.moved);
        metric(
            "evicted_keys_total",
            "counter",
            "Keys deleted because their slot moved to another node.",
            s.evicted_keys,
        );
        metric("evicting", "gauge", "1 while keys of lost slots are being deleted.", u64::from(s.evicting));
        out
    }
}
