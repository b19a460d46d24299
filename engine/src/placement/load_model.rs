//! What a planned volume's load delays are made of, and how they follow the speeds the store
//! measures as it serves ([`LoadSpeeds`]) instead of staying the constants they started as.
//!
//! A kept option's delay, per block of [`LoadModel::block_bytes`] raw bytes:
//!
//! `delay = ratio · block_bytes · (1 − dram_share) / log_bps + block_bytes / (decode_bps · cores)`
//!
//! - `ratio · block_bytes` is the record the log holds in that form (the option's ratio counts
//!   records, headers included, and itself follows what was stored);
//! - `log_bps` is the log's read speed as gets saw it in the window, per read call (a batch's
//!   reads count once, as the client waiting for it sees them);
//! - `dram_share` is the share of loads the DRAM tier served; a DRAM hit is counted as costing
//!   no read (a memory copy, a hundredth of the log's time) but is still decoded;
//! - `decode_bps` is the option's codec's decoding speed on one core, measured on the blocks the
//!   store decoded (until some were, the configured decoding time is kept), and `cores` the cores
//!   a batch decodes on: the planner weighs loading a context, whose blocks a client asks for
//!   together, as the LMCache plugins and the Python package do. (The read term takes a lone
//!   get's read at its whole latency and a batch's per byte: what the clients did. Both terms
//!   follow the formula the configured delays were made with.)
//!
//! "Dropped" (recomputing) is the serving engine's cost, which the store does not see: its delay
//! stays as configured.

use kvhoard_kernels::CodecSpec;

use super::planner::PlannerConfig;
use crate::tier::SpeedTotals;

/// Loads a window needs before the delays follow it.
pub const SPEED_MIN_LOADS: u64 = 32;
/// Blocks of one codec a window needs decoded before its decoding speed is taken.
pub const SPEED_MIN_DECODES: u64 = 8;
/// Relative difference from which an option's delay is replaced by the one measured.
pub const DELAY_TOLERANCE: f64 = 0.05;

/// What a planned volume's delays are made of (see the module documentation). The default
/// (`block_bytes` 0) keeps the configured delays whatever is measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LoadModel {
    /// Raw bytes of the block the options' delays are for.
    pub block_bytes: u64,
    /// Per kept option (every one but "dropped"): the seconds of its configured delay that
    /// decoding takes (on the log, and held in memory alike).
    pub decode_s: Vec<f64>,
}

impl LoadModel {
    /// Whether the model fits `kept` kept options: `None`, or what is wrong.
    pub fn misfit(&self, kept: usize) -> Option<String> {
        if self.block_bytes == 0 {
            return None;
        }
        if self.decode_s.len() != kept {
            return Some(format!("{kept} kept options need {kept} decoding times; got {}", self.decode_s.len()));
        }
        if !self.decode_s.iter().all(|d| d.is_finite() && *d >= 0.0) {
            return Some("decoding times must be seconds, 0 or more".into());
        }
        None
    }

    /// The delays that `window`'s speeds give the kept options of `config` whose `codecs` are
    /// listed (raw first): `(option, on the log, held in memory)` for each one off by more than
    /// [`DELAY_TOLERANCE`]. `decode_s` holds each kept option's decoding time as last known and
    /// takes the window's where it measured one. Nothing when the model is off or the window
    /// saw fewer than [`SPEED_MIN_LOADS`] loads from the log.
    ///
    /// Where the planner decides what the DRAM tier holds ([`PlannerConfig::dram_choice`]), a
    /// load from the log is weighed as one and a load from memory is its configured copy time,
    /// `copy_s` per kept option, plus the decoding; otherwise the DRAM tier's share of loads
    /// costs no read.
    pub fn follow(
        &self,
        window: &SpeedTotals,
        config: &PlannerConfig,
        codecs: &[Option<CodecSpec>],
        decode_s: &mut [f64],
        copy_s: &[f64],
    ) -> Vec<(usize, f64, f64)> {
        let block = self.block_bytes as f64;
        let log_bps = window.log.bytes_per_s().filter(|_| window.log.blocks >= SPEED_MIN_LOADS);
        let Some(log_bps) = log_bps.filter(|_| block > 0.0) else { return Vec::new() };
        let cores = window.cores.max(1) as f64;
        let misses = if config.dram_choice() { 1.0 } else { 1.0 - window.dram_share() };
        let off = |now: f64, was: f64| was <= 0.0 || (now / was - 1.0).abs() > DELAY_TOLERANCE;
        let mut changed = Vec::new();
        for (k, (codec, decode)) in codecs.iter().zip(decode_s.iter_mut()).enumerate() {
            if let Some(spec) = codec {
                let r = window.decoding(spec);
                if let Some(bps) = r.bytes_per_s().filter(|_| r.blocks >= SPEED_MIN_DECODES) {
                    *decode = block / (bps * cores);
                }
            }
            let Some(o) = config.options.get(k) else { continue };
            let delay = o.ratio * block * misses / log_bps + *decode;
            let held = config.dram.delay_s.get(k).copied().unwrap_or(0.0);
            let held_now = copy_s.get(k).copied().unwrap_or(0.0) + *decode;
            if off(delay, o.delay_s) || (config.dram_choice() && off(held_now, held)) {
                changed.push((k, delay, held_now));
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use crate::tier::Rate;

    use crate::placement::planner::{DramChoice, StoreOption};

    fn config(options: Vec<StoreOption>) -> PlannerConfig {
        PlannerConfig { alpha: 0.05, half_life_ms: 1, budget_bytes: 1, options, dram: DramChoice::default() }
    }

    fn options() -> Vec<StoreOption> {
        vec![
            StoreOption { ratio: 1.0, delay_s: 0.011, lossy: false },
            StoreOption { ratio: 0.5, delay_s: 0.008, lossy: true },
            StoreOption { ratio: 0.0, delay_s: 0.017, lossy: false },
        ]
    }

    fn window(loads: u64, log_bps: f64, dram_hits: u64, decodes: Vec<(CodecSpec, Rate)>) -> SpeedTotals {
        SpeedTotals {
            log: Rate { blocks: loads, bytes: 1_000_000_000, secs: 1e9 / log_bps },
            dram_hits,
            decode: decodes,
            cores: 2,
        }
    }

    #[test]
    fn delays_follow_the_log_the_dram_tier_and_each_codecs_decoding() {
        let quant = CodecSpec::parse("quant:bits=8").unwrap();
        let codecs = [None, Some(quant)];
        let model = LoadModel { block_bytes: 64_000_000, decode_s: vec![0.0, 0.002] };
        let mut decode = model.decode_s.clone();
        // A log at 1 GB/s, no DRAM hits, quant not decoded yet: its configured decoding is kept.
        let got = model.follow(&window(100, 1e9, 0, Vec::new()), &config(options()), &codecs, &mut decode, &[]);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!((got[0].1 - 0.064).abs() < 1e-9, "{got:?}");
        assert!((got[1].1 - (0.032 + 0.002)).abs() < 1e-9, "{got:?}");
        // Half the loads from DRAM, quant decoded at 4 GB/s on one core (two cores: 8 ms).
        let decoded = Rate { blocks: 10, bytes: 4_000_000_000, secs: 1.0 };
        let got =
            model.follow(&window(100, 1e9, 100, vec![(quant, decoded)]), &config(options()), &codecs, &mut decode, &[]);
        assert!((got[0].1 - 0.032).abs() < 1e-9, "{got:?}");
        assert!((got[1].1 - (0.016 + 0.008)).abs() < 1e-9, "{got:?}");
        assert!((decode[1] - 0.008).abs() < 1e-12);
    }

    #[test]
    fn where_the_planner_decides_memory_a_load_from_memory_is_a_copy_then_the_decoding() {
        let quant = CodecSpec::parse("quant:bits=8").unwrap();
        let codecs = [None, Some(quant)];
        let model = LoadModel { block_bytes: 64_000_000, decode_s: vec![0.0, 0.002] };
        let mut decode = model.decode_s.clone();
        let mut tiered = config(options());
        tiered.dram = DramChoice { budget_bytes: 1, delay_s: vec![0.0005, 0.0025] };
        let copy = [0.0005, 0.0005];
        // Half the loads from memory: a load from the log is still weighed whole.
        let decoded = Rate { blocks: 10, bytes: 4_000_000_000, secs: 1.0 };
        let window = window(100, 1e9, 100, vec![(quant, decoded)]);
        let got = model.follow(&window, &tiered, &codecs, &mut decode, &copy);
        assert!((got[0].1 - 0.064).abs() < 1e-9 && (got[0].2 - 0.0005).abs() < 1e-12, "{got:?}");
        assert!((got[1].1 - (0.032 + 0.008)).abs() < 1e-9 && (got[1].2 - 0.0085).abs() < 1e-12, "{got:?}");
        // Followed again with nothing new: the copy time does not drift.
        let mut tiered = tiered.clone();
        tiered.dram.delay_s = got.iter().map(|g| g.2).collect();
        tiered.options[0].delay_s = got[0].1;
        tiered.options[1].delay_s = got[1].1;
        assert!(model.follow(&window, &tiered, &codecs, &mut decode, &copy).is_empty());
    }

    #[test]
    fn a_thin_window_or_a_model_that_is_off_changes_nothing() {
        let codecs = [None, Some(CodecSpec::parse("quant:bits=8").unwrap())];
        let model = LoadModel { block_bytes: 64_000_000, decode_s: vec![0.0, 0.002] };
        let mut decode = model.decode_s.clone();
        assert!(model
            .follow(&window(SPEED_MIN_LOADS - 1, 1e9, 0, Vec::new()), &config(options()), &codecs, &mut decode, &[])
            .is_empty());
        let off = LoadModel::default();
        assert!(off.follow(&window(100, 1e9, 0, Vec::new()), &config(options()), &codecs, &mut decode, &[]).is_empty());
        // Within the tolerance: kept.
        let near = [StoreOption { delay_s: 0.0645, ..options()[0] }, StoreOption { delay_s: 0.0341, ..options()[1] }];
        assert!(model
            .follow(&window(100, 1e9, 0, Vec::new()), &config(near.to_vec()), &codecs, &mut decode, &[])
            .is_empty());
        assert_eq!(model.misfit(2), None);
        assert!(model.misfit(3).unwrap().contains("need 3 decoding times"));
        let bad = LoadModel { block_bytes: 1, decode_s: vec![f64::NAN, 0.0] };
        assert!(bad.misfit(2).is_some());
        assert_eq!(off.misfit(5), None);
    }
}
