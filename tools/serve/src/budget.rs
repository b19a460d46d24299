//! The byte budget for payloads in memory, shared by every connection.
//!
//! A request takes room for its payload before reading it and gives it back when its buffer is
//! dropped; when the budget is spent the request waits (TCP flow control then slows its client)
//! instead of the server's memory growing with the number of clients.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Granularity of the budget: permits are counted in these.
const UNIT: u64 = 64 << 10;

/// A byte budget.
#[derive(Debug, Clone)]
pub struct Budget {
    sem: Arc<Semaphore>,
    units: u32,
}

/// Room taken from a [`Budget`]; returned when dropped.
#[derive(Debug)]
pub struct Room(#[expect(dead_code, reason = "held for its Drop")] Option<OwnedSemaphorePermit>);

impl Budget {
    /// A budget of `bytes` (rounded up to 64 KiB; at least one unit).
    pub fn new(bytes: u64) -> Budget {
        let units = u32::try_from(bytes.div_ceil(UNIT).max(1)).unwrap_or(u32::MAX).min(Semaphore::MAX_PERMITS as u32);
        Budget { sem: Arc::new(Semaphore::new(units as usize)), units }
    }

    /// Takes room for `bytes`, waiting until there is some. A request larger than the whole budget
    /// takes all of it (the server refuses such sizes before they get here).
    pub async fn take(&self, bytes: u64) -> Room {
        let want = u32::try_from(bytes.div_ceil(UNIT).max(1)).unwrap_or(u32::MAX).min(self.units);
        // Only a closed semaphore fails, and this one is never closed.
        Room(Arc::clone(&self.sem).acquire_many_owned(want).await.ok())
    }

    /// Bytes free now.
    pub fn free_bytes(&self) -> u64 {
        self.sem.available_permits() as u64 * UNIT
    }

    /// Bytes in all.
    pub fn total_bytes(&self) -> u64 {
        u64::from(self.units) * UNIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn room_is_returned_and_waiters_wait() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        rt.block_on(async {
            let b = Budget::new(1 << 20);
            assert_eq!(b.total_bytes(), 1 << 20);
            let a = b.take(600 << 10).await;
            assert_eq!(b.free_bytes(), (1 << 20) - (640 << 10));
            // Not enough left for another 600 KiB: it waits until `a` is dropped.
            let waiting = tokio::time::timeout(Duration::from_millis(50), b.take(600 << 10)).await;
            assert!(waiting.is_err());
            drop(a);
            let c = tokio::time::timeout(Duration::from_secs(5), b.take(600 << 10)).await.expect("room came back");
            drop(c);
            // Larger than the budget: takes all of it rather than waiting forever.
            let all = b.take(10 << 20).await;
            assert_eq!(b.free_bytes(), 0);
            drop(all);
            assert_eq!(b.free_bytes(), 1 << 20);
        });
    }
}
