//! What every connection shares: the store, the options, the byte budget, the buffer pool, the
//! metrics and the shutdown signal.

use std::sync::Arc;
use std::time::Instant;

use kvhoard_engine::buffer::BufferPool;
use kvhoard_engine::{Block, ReadOptions, Resident, Store};
use tokio::sync::{watch, Semaphore};

use crate::budget::Budget;
use crate::cluster::Live;
use crate::metrics::Metrics;
use crate::pace::{Pace, PaceLimits};
use crate::payload::Memory;
use crate::ServeOptions;

/// What every connection shares.
pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub opts: ServeOptions,
    pub metrics: Arc<Metrics>,
    pub budget: Budget,
    /// Payload buffers, recycled.
    pub pool: Arc<BufferPool>,
    pub shutdown: watch::Receiver<bool>,
    /// Connections that may finish a large reply with blocking sends at once (each holds a
    /// blocking-pool thread meanwhile): half the pool, so engine calls always find threads.
    pub blocking_sends: Semaphore,
    /// `GET /plan` answers one at a time (it walks the planner's contexts).
    pub plan_views: Semaphore,
    /// Connections waiting for their next request: a full server closes the one idle longest.
    pub idle: std::sync::Arc<crate::idle::Idle>,
    /// The slot map in cluster mode, and the cluster layer's counters.
    pub cluster: Arc<Live>,
    /// When the server started (INFO's uptime).
    pub started: Instant,
}

impl Shared {
    /// The limits every request is held to while it arrives.
    pub(crate) fn pace(&self) -> Pace {
        Pace::start(PaceLimits {
            progress: self.opts.request_timeout,
            grace: self.opts.header_timeout,
            min_rate: self.opts.min_rate,
        })
    }

    /// Where payloads take their memory.
    pub(crate) fn memory(&self) -> Memory<'_> {
        Memory { budget: &self.budget, pool: &self.pool, patience: self.opts.request_timeout }
    }

    /// Gets a block: from memory right here when it is resident (no thread hand-off on a DRAM-tier
    /// hit), otherwise on the blocking pool, where a device read may wait.
    pub(crate) async fn get(&self, namespace: &str, key: String) -> Result<Option<Block>, String> {
        match self.store.get_resident(namespace, &key, ReadOptions::default()) {
            Ok(Resident::Block(block)) => return Ok(Some(block)),
            Ok(Resident::Absent) => return Ok(None),
            Ok(Resident::OnDevice) => {}
            Err(e) => return Err(e.to_string()),
        }
        let store = Arc::clone(&self.store);
        let namespace = namespace.to_string();
        match tokio::task::spawn_blocking(move || store.get(&namespace, &key, ReadOptions::default())).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}
