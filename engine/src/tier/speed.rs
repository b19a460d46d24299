//! Load speeds as the engine serves reads, so that placement weighs what loading a block costs on
//! this machine now rather than the constants it was configured with
//! ([`crate::placement::Planned`]):
//!
//! - **The log's reads**, per read call: bytes over the time from the call's start until its last
//!   read came back (before the checks done on it: those are CPU, not the device). A batch's
//!   reads are in flight together and count once, so a block's share of a batch costs what the
//!   batch took per byte, as a client waiting for the batch sees it; a lone get costs its own
//!   latency.
//! - **Loads the DRAM tier served**, counted, so that the share of loads that never reach the log
//!   is known.
//! - **Each codec's decoding**: raw bytes out over the time one core took to decode them (for a
//!   get, or for cleaning's recoding: the same codec on the same cores).
//!
//! Counters only grow; a reader takes [`SpeedTotals`] now and then and looks at the difference
//! ([`SpeedTotals::since`]), a window that follows the machine as it changes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use kvhoard_kernels::CodecSpec;

/// Work done and the time it took, summed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rate {
    /// Blocks (loads, or blocks decoded).
    pub blocks: u64,
    /// Bytes (read from the log, or decoded).
    pub bytes: u64,
    /// Seconds the work took.
    pub secs: f64,
}

impl Rate {
    /// Bytes per second, when any time was taken.
    pub fn bytes_per_s(&self) -> Option<f64> {
        (self.secs > 0.0 && self.bytes > 0).then(|| self.bytes as f64 / self.secs)
    }

    fn since(&self, earlier: &Rate) -> Rate {
        Rate {
            blocks: self.blocks.saturating_sub(earlier.blocks),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            secs: (self.secs - earlier.secs).max(0.0),
        }
    }
}

#[derive(Debug, Default)]
struct Meter {
    blocks: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
}

impl Meter {
    fn record(&self, blocks: u64, bytes: u64, took: Duration) {
        self.blocks.fetch_add(blocks, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.nanos.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn rate(&self) -> Rate {
        Rate {
            blocks: self.blocks.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            secs: self.nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// What [`LoadSpeeds`] counted up to a moment (or, from [`SpeedTotals::since`], in a window).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SpeedTotals {
    /// Reads from the log by gets: blocks, bytes of their records, seconds of the read calls.
    pub log: Rate,
    /// Loads the DRAM tier served.
    pub dram_hits: u64,
    /// Per codec: blocks the store decoded, raw bytes out, seconds of one core.
    pub decode: Vec<(CodecSpec, Rate)>,
    /// Cores a batch decodes on.
    pub cores: usize,
}

impl SpeedTotals {
    /// What was counted between `earlier` and these totals.
    pub fn since(&self, earlier: &SpeedTotals) -> SpeedTotals {
        let decode = self
            .decode
            .iter()
            .map(|(spec, now)| {
                let before = earlier.decode.iter().find(|(s, _)| s == spec).map_or(Rate::default(), |(_, r)| *r);
                (*spec, now.since(&before))
            })
            .collect();
        SpeedTotals {
            log: self.log.since(&earlier.log),
            dram_hits: self.dram_hits.saturating_sub(earlier.dram_hits),
            decode,
            cores: self.cores,
        }
    }

    /// What decoding with `spec` did.
    pub fn decoding(&self, spec: &CodecSpec) -> Rate {
        self.decode.iter().find(|(s, _)| s == spec).map_or(Rate::default(), |(_, r)| *r)
    }

    /// The share of loads the DRAM tier served (0 when none were counted).
    pub fn dram_share(&self) -> f64 {
        let loads = self.dram_hits + self.log.blocks;
        if loads == 0 {
            0.0
        } else {
            self.dram_hits as f64 / loads as f64
        }
    }
}

/// What [`crate::Stats`] says of the load speeds since the store opened.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct SpeedReport {
    /// Blocks gets read from the log.
    pub log_loads: u64,
    /// The log's reads as gets saw them, GB/s per read call (0 before any).
    pub log_read_gbps: f64,
    /// Share of loads the DRAM tier served.
    pub dram_share: f64,
    /// Per codec: blocks the store decoded and GB/s of raw bytes out on one core.
    pub decode: Vec<DecodeReport>,
}

/// One codec's decoding in a [`SpeedReport`].
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct DecodeReport {
    /// The codec.
    pub codec: String,
    /// Blocks decoded.
    pub blocks: u64,
    /// Raw GB/s out, one core.
    pub gbps: f64,
}

impl SpeedTotals {
    /// For people and scripts.
    pub fn report(&self) -> SpeedReport {
        let gbps = |r: &Rate| r.bytes_per_s().map_or(0.0, |b| b / 1e9);
        SpeedReport {
            log_loads: self.log.blocks,
            log_read_gbps: gbps(&self.log),
            dram_share: self.dram_share(),
            decode: self
                .decode
                .iter()
                .map(|(spec, r)| DecodeReport { codec: spec.to_string(), blocks: r.blocks, gbps: gbps(r) })
                .collect(),
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct LoadSpeeds {
    log: Meter,
    dram_hits: AtomicU64,
    /// Few codecs are in use at once: a short list, searched.
    decode: Mutex<Vec<(CodecSpec, Rate)>>,
    cores: usize,
}

impl LoadSpeeds {
    /// Counters of a store whose batches decode on `cores` cores.
    pub fn new(cores: usize) -> LoadSpeeds {
        LoadSpeeds {
            log: Meter::default(),
            dram_hits: AtomicU64::new(0),
            decode: Mutex::default(),
            cores: cores.max(1),
        }
    }

    /// A read call from the log for `blocks` blocks of `bytes` took `took`.
    pub fn log_read(&self, blocks: u64, bytes: u64, took: Duration) {
        if blocks > 0 {
            self.log.record(blocks, bytes, took);
        }
    }

    /// The DRAM tier served a load.
    pub fn dram_hit(&self) {
        self.dram_hits.fetch_add(1, Ordering::Relaxed);
    }

    /// Decoding a block with `spec` into `raw_bytes` took `took` on one core.
    pub fn decoded(&self, spec: CodecSpec, raw_bytes: u64, took: Duration) {
        let mut decode = self.decode.lock().unwrap_or_else(|e| e.into_inner());
        let secs = took.as_secs_f64();
        match decode.iter_mut().find(|(s, _)| *s == spec) {
            Some((_, r)) => {
                r.blocks += 1;
                r.bytes += raw_bytes;
                r.secs += secs;
            }
            None => decode.push((spec, Rate { blocks: 1, bytes: raw_bytes, secs })),
        }
    }

    /// Everything counted so far.
    pub fn totals(&self) -> SpeedTotals {
        SpeedTotals {
            log: self.log.rate(),
            dram_hits: self.dram_hits.load(Ordering::Relaxed),
            decode: self.decode.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            cores: self.cores,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;

    #[test]
    fn a_window_counts_what_happened_in_it() {
        let speeds = LoadSpeeds::new(4);
        let quant = CodecSpec::parse("quant:bits=8").unwrap();
        let lossless = CodecSpec::parse("lossless").unwrap();
        speeds.log_read(2, 4_000_000, Duration::from_millis(4));
        speeds.decoded(quant, 2_000_000, Duration::from_millis(1));
        let before = speeds.totals();
        speeds.log_read(4, 8_000_000, Duration::from_millis(4));
        speeds.log_read(0, 1, Duration::from_secs(1));
        speeds.dram_hit();
        speeds.dram_hit();
        speeds.decoded(quant, 2_000_000, Duration::from_millis(2));
        speeds.decoded(lossless, 2_000_000, Duration::from_millis(1));
        let window = speeds.totals().since(&before);
        let near = |got: Option<f64>, want: f64| got.is_some_and(|g| (g / want - 1.0).abs() < 1e-9);
        assert_eq!((window.log.blocks, window.log.bytes), (4, 8_000_000));
        assert!(near(window.log.bytes_per_s(), 2e9), "{window:?}");
        assert!((window.dram_share() - 2.0 / 6.0).abs() < 1e-12);
        assert!(near(window.decoding(&quant).bytes_per_s(), 1e9), "{window:?}");
        assert!(near(window.decoding(&lossless).bytes_per_s(), 2e9), "{window:?}");
        assert_eq!(window.cores, 4);
        assert_eq!(SpeedTotals::default().dram_share(), 0.0);
        let report = speeds.totals().report();
        assert_eq!((report.log_loads, report.decode.len()), (6, 2));
        assert!((report.log_read_gbps - 1.5).abs() < 1e-9, "{report:?}");
        assert_eq!(report.decode[0].codec, quant.to_string());
        assert_eq!(Rate::default().bytes_per_s(), None);
    }
}
