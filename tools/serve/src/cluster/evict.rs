//! Deleting the keys of slots this node does not own, in the background.
//!
//! Why eagerly: such keys are unreachable (every request for them is redirected), and if their
//! slot came back later they would be served again although the other node may have replaced or
//! deleted them meanwhile. So after every map change (and at start, for a volume that served
//! another map before a restart) one task lists the RESP namespace page by page, from segment
//! summaries (no payload is read), and deletes each key whose slot another node owns, checking
//! the map current at that moment. A change while it runs restarts the scan; shutdown stops it
//! between pages. Deletions are tombstones acknowledged from memory: one lost in a crash leaves
//! a key the next start's scan deletes again. docs/cluster.md measures what this costs.
//!
//! The first deletion of each page is synced, and only it. The store writes the summaries of
//! segments sealed since its last sync only at a sync, and until then a listing rebuilds them by
//! reading every record's header: 20 s to list 33,000 keys of 4 KiB written with `written`
//! durability and never synced, 0.11 s once synced (docs/cluster.md). A node filled without a
//! sync thus pays that for the segments its pages cross until one of them deletes something (a
//! page with nothing to delete syncs nothing: the store has no sync of its own to call); the
//! tombstones of a scan fill new segments, which the next page's synced deletion summarizes
//! before the listing reaches them. One fdatasync per page of [`PAGE_KEYS`] keys is noise beside
//! that.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use kvhoard_engine::{Durability, ListCursor};

use super::keyslot;
use crate::Shared;

/// Keys listed per page: each page is one blocking call, so shutdown waits for at most one.
const PAGE_KEYS: usize = 2048;

/// Runs until shutdown: waits for a map change, then scans.
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut changes = shared.cluster.watch();
    let mut shutdown = shared.shutdown.clone();
    // A server started in cluster mode scans once at start.
    let mut pending = shared.cluster.config().is_some();
    loop {
        if !pending {
            tokio::select! {
                _ = shutdown.changed() => return,
                r = changes.changed() => if r.is_err() { return },
            }
        }
        changes.mark_unchanged();
        pending = false;
        if shared.cluster.config().is_none() {
            continue;
        }
        match scan(&shared, &mut changes).await {
            Scan::Done => {}
            Scan::Restart => pending = true,
            Scan::Stopped => return,
        }
    }
}

enum Scan {
    Done,
    /// The map changed meanwhile: scan again from the start with the new one.
    Restart,
    Stopped,
}

async fn scan(shared: &Arc<Shared>, changes: &mut tokio::sync::watch::Receiver<u64>) -> Scan {
    let live = &shared.cluster;
    live.evicting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let (mut cursor, mut scanned, mut deleted) = (None, 0u64, 0u64);
    let outcome = loop {
        if *shared.shutdown.borrow() {
            break Scan::Stopped;
        }
        if changes.has_changed().unwrap_or(false) {
            break Scan::Restart;
        }
        let task = Arc::clone(shared);
        let page = tokio::task::spawn_blocking(move || page(&task, cursor)).await;
        match page {
            Ok(Ok((seen, gone, next))) => {
                scanned += seen;
                deleted += gone;
                live.evicted_keys.fetch_add(gone, Ordering::Relaxed);
                match next {
                    Some(next) => cursor = Some(next),
                    None => break Scan::Done,
                }
            }
            Ok(Err(e)) => {
                tracing::warn!("cluster: deleting the keys of slots this node lost failed: {e}; retried at the next map change or restart");
                break Scan::Done;
            }
            Err(e) => {
                tracing::warn!("cluster: the scan for keys of lost slots stopped: {e}");
                break Scan::Done;
            }
        }
        tokio::task::yield_now().await;
    };
    live.evicting.store(false, Ordering::Relaxed);
    if matches!(outcome, Scan::Done) {
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        live.evictions_done.fetch_add(1, Ordering::Relaxed);
        live.last_eviction_ms.store(ms, Ordering::Relaxed);
        live.last_eviction_scanned.store(scanned, Ordering::Relaxed);
        live.last_eviction_keys.store(deleted, Ordering::Relaxed);
        if deleted > 0 {
            tracing::info!(scanned, deleted, ms, "cluster: deleted the keys of slots other nodes own");
        }
    }
    outcome
}

/// One page: lists up to [`PAGE_KEYS`] keys after `cursor` and deletes those this node does not
/// own now, syncing the first deletion (see the module's comment). Returns (keys
/// seen, keys deleted, where to continue).
fn page(shared: &Shared, cursor: Option<ListCursor>) -> kvhoard_engine::Result<(u64, u64, Option<ListCursor>)> {
    let namespace = &shared.opts.resp_namespace;
    let listed = shared.store.list(namespace, cursor, PAGE_KEYS)?;
    let mut deleted = 0;
    for entry in &listed.entries {
        if shared.cluster.owns(keyslot(entry.key.as_bytes())) {
            continue;
        }
        let durability = if deleted == 0 { Durability::Synced } else { Durability::Buffered };
        if shared.store.delete(namespace, &entry.key, durability)? {
            deleted += 1;
        }
    }
    Ok((listed.entries.len() as u64, deleted, listed.next))
}
