//! PUTs of one `lm://` connection that the store is still writing.
//!
//! LMCache never waits for a PUT (it has no reply): it sends the next request at once. Reading
//! that request while the store writes keeps a GET from queueing behind disk writes it does
//! not depend on. A request naming a key waits for that key's PUTs first, so a connection still
//! sees its own writes in the order it sent them.

use std::collections::VecDeque;

use tokio::task::JoinHandle;

/// Most PUTs one connection has in the store at once; the next waits for the oldest. Their
/// payloads also count against the server's in-flight byte budget.
pub(crate) const MAX_PENDING_PUTS: usize = 16;

/// A connection's PUTs in progress, oldest first.
#[derive(Default)]
pub(crate) struct Pending {
    puts: VecDeque<(String, JoinHandle<()>)>,
}

impl Pending {
    /// Waits until no PUT of `key` is in progress.
    pub(crate) async fn settle(&mut self, key: &str) {
        self.reap();
        while let Some(i) = self.puts.iter().position(|(k, _)| k == key) {
            if let Some((key, put)) = self.puts.remove(i) {
                finish(&key, put).await;
            }
        }
    }

    /// Adds a PUT in progress, first waiting for the oldest if there are too many.
    pub(crate) async fn push(&mut self, key: String, put: JoinHandle<()>) {
        self.reap();
        while self.puts.len() >= MAX_PENDING_PUTS {
            if let Some((key, put)) = self.puts.pop_front() {
                finish(&key, put).await;
            }
        }
        self.puts.push_back((key, put));
    }

    /// Waits for every PUT in progress (the connection is ending).
    pub(crate) async fn drain(&mut self) {
        while let Some((key, put)) = self.puts.pop_front() {
            finish(&key, put).await;
        }
    }

    /// Forgets the PUTs that are done.
    fn reap(&mut self) {
        self.puts.retain(|(_, put)| !put.is_finished());
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.puts.len()
    }
}

/// Waits for one PUT. Its outcome was counted and logged by the PUT itself; only a PUT that
/// panicked is reported here.
async fn finish(key: &str, put: JoinHandle<()>) {
    if let Err(e) = put.await {
        tracing::error!(key, "lm:// PUT failed in the store: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn slow(done: &Arc<AtomicUsize>, ms: u64) -> JoinHandle<()> {
        let done = Arc::clone(done);
        tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(ms));
            done.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn settle_waits_only_for_the_key_named() {
        let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut pending = Pending::default();
        pending.push("a".into(), slow(&a, 50)).await;
        pending.push("b".into(), slow(&b, 2_000)).await;
        pending.push("a".into(), slow(&a, 50)).await;
        pending.settle("a").await;
        assert_eq!(a.load(Ordering::SeqCst), 2, "both PUTs of a are done");
        assert_eq!(b.load(Ordering::SeqCst), 0, "b's PUT was not waited for");
        assert_eq!(pending.len(), 1);
        pending.drain().await;
        assert_eq!(b.load(Ordering::SeqCst), 1);
        assert_eq!(pending.len(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_than_the_limit_are_in_progress() {
        let done = Arc::new(AtomicUsize::new(0));
        let mut pending = Pending::default();
        for i in 0..MAX_PENDING_PUTS + 3 {
            pending.push(format!("k{i}"), slow(&done, 20)).await;
            assert!(pending.len() <= MAX_PENDING_PUTS);
        }
        assert!(done.load(Ordering::SeqCst) >= 3, "the oldest were waited for");
        pending.drain().await;
        assert_eq!(done.load(Ordering::SeqCst), MAX_PENDING_PUTS + 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_put_is_reported_not_propagated() {
        let mut pending = Pending::default();
        pending.push("p".into(), tokio::task::spawn_blocking(|| panic!("injected"))).await;
        pending.settle("p").await;
        assert_eq!(pending.len(), 0);
    }
}
