//! Wall-clock time, replaceable in tests so that TTLs can expire without waiting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The store's source of the current time.
#[derive(Clone, Default)]
pub struct Clock(Option<Arc<AtomicU64>>);

impl Clock {
    /// The system clock.
    pub fn system() -> Clock {
        Clock(None)
    }

    /// A clock that reads `ms` (milliseconds since the Unix epoch), which the caller advances.
    pub fn manual(ms: Arc<AtomicU64>) -> Clock {
        Clock(Some(ms))
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_unix_ms(&self) -> u64 {
        match &self.0 {
            Some(ms) => ms.load(Ordering::Relaxed),
            None => SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        }
    }

    /// Seconds since the Unix epoch, as stored in expiry times.
    pub fn now_unix_s(&self) -> u32 {
        u32::try_from(self.now_unix_ms() / 1000).unwrap_or(u32::MAX)
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Clock::manual" } else { "Clock::system" })
    }
}
