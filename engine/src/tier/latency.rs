//! Load-latency histograms (HdrHistogram), sharded so that concurrent loads do not contend.

use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;

const SHARDS: usize = 8;
/// Highest latency tracked exactly; slower loads are recorded as this.
const MAX_NS: u64 = 60_000_000_000;

/// A latency histogram in nanoseconds, 2 significant digits, 1 ns to 60 s.
#[derive(Debug)]
pub struct LatencyHistogram {
    shards: Vec<Mutex<Histogram<u64>>>,
}

/// Percentiles of a [`LatencyHistogram`], in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[expect(missing_docs, reason = "named for what they are")]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        let shards =
            (0..SHARDS).filter_map(|_| Histogram::new_with_bounds(1, MAX_NS, 2).ok()).map(Mutex::new).collect();
        LatencyHistogram { shards }
    }
}

impl LatencyHistogram {
    /// Records one load; `hint` spreads recorders over the shards (any well-mixed number).
    pub fn record(&self, hint: u64, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(MAX_NS).clamp(1, MAX_NS);
        if let Some(shard) = self.shards.get(hint as usize % SHARDS.max(1)) {
            shard.lock().unwrap_or_else(|e| e.into_inner()).saturating_record(ns);
        }
    }

    /// Percentiles over everything recorded so far.
    pub fn summary(&self) -> LatencySummary {
        let Some(mut all) = Histogram::<u64>::new_with_bounds(1, MAX_NS, 2).ok() else {
            return LatencySummary::default();
        };
        for shard in &self.shards {
            let _ = all.add(&*shard.lock().unwrap_or_else(|e| e.into_inner()));
        }
        if all.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            count: all.len(),
            mean_ns: all.mean() as u64,
            p50_ns: all.value_at_quantile(0.5),
            p90_ns: all.value_at_quantile(0.9),
            p99_ns: all.value_at_quantile(0.99),
            p999_ns: all.value_at_quantile(0.999),
            max_ns: all.max(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_merge_all_shards() {
        let h = LatencyHistogram::default();
        for i in 1..=1000u64 {
            h.record(i, Duration::from_micros(i));
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        // Two significant digits: within 1%.
        assert!((495_000..=505_000).contains(&s.p50_ns), "{s:?}");
        assert!((985_000..=1_000_000).contains(&s.p99_ns), "{s:?}");
        assert!(s.max_ns >= 999_000, "{s:?}");
        h.record(0, Duration::from_secs(3600));
        assert_eq!(h.summary().count, 1001, "an out-of-range latency is clamped, not lost");
    }
}
