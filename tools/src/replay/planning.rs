//! The placement planner's options, from measured codec facts and what loads and recomputes
//! cost: one definition for the simulator, the engine under replay, and a served or mounted
//! volume (`--placement planner`).

use std::sync::Arc;

use anyhow::bail;
use kvhoard_engine::placement::load_model::LoadModel;
use kvhoard_engine::placement::planner::{DramChoice, PlannerConfig, StoreOption};
use kvhoard_engine::placement::{Placement, Planned, PlannedConfig};
use kvhoard_engine::{Clock, CodecSpec, Store};

use super::model::{CodecFacts, Gpu, Profile, PROFILES, SENSITIVITY_LEVELS};
use super::trace::BLOCK_TOKENS;

/// Codecs the planner chooses among (besides raw and dropping): every one a whole-block reader
/// can serve.
pub const PLANNER_CODECS: [&str; 4] = ["lossless", "quant:bits=8", "quant:bits=4", "quant:bits=2"];
/// The planner's α unless told: a block's whole quality is worth 50 ms of delay, three times
/// what recomputing it costs (an 8B model's 512 tokens on the default GPU: 17 ms).
pub const DEFAULT_ALPHA: f64 = 0.05;
/// Half-life of a context's chance of reuse under the planner until it has seen enough gaps
/// between uses to follow their median (`placement::reuse`).
pub const PLANNER_HALF_LIFE_MS: u64 = 600_000;
/// Share of the volume the planner fills; the rest is the cleaner's room. Cleaning copies what
/// the planner keeps but drops the contexts it would drop next (`CLEANING_DROP_MARGIN`): on the
/// shared trace at SSD 0.1 that wrote 0.4 bytes per byte put at 85 %, with a 1-2 % lower mean
/// TTFT than at 70 %; copying every kept block wrote 1.0 at 85 % (docs/benchmarks.md).
pub const PLANNER_FILL: f64 = 0.85;
/// Log read bandwidth assumed unless told (`--planner-ssd-gbps`, the replay's `--ssd-gbps`):
/// one PCIe 4 NVMe drive's large reads.
pub const DEFAULT_SSD_GBPS: f64 = 6.0;

/// DRAM tier loads assumed unless told (the replay's `--dram-gbps`): host memory to the GPU over
/// PCIe 4 x16.
pub const DEFAULT_DRAM_GBPS: f64 = 20.0;
/// Share of the DRAM tier the planner fills with the contexts it holds in memory: the tier evicts
/// by itself, least recently used first, and counts what it holds its own way (the engine's whole
/// record buffers, the simulator's payloads), while the planner counts records at its measured
/// ratios; the margin keeps the tier from evicting what the planner holds.
pub const PLANNER_DRAM_FILL: f64 = 0.95;

/// What loading and recomputing a block cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// Bytes of one block.
    pub raw_block: u64,
    /// Log reads, bytes per second.
    pub ssd_bps: f64,
    /// DRAM tier loads, bytes per second.
    pub dram_bps: f64,
    /// Cores decoding at once.
    pub decode_cores: f64,
    /// Seconds to recompute a block (the prefill of its tokens).
    pub recompute_s: f64,
}

impl Costs {
    /// Seconds to decode one block stored as `facts` says, on the cores a batch decodes on.
    pub fn decode_s(&self, facts: &CodecFacts) -> f64 {
        self.raw_block as f64 / (facts.decode_bps * self.decode_cores.max(1.0))
    }

    /// What the delays of [`planner_config`]'s options for `facts` are made of, so that a
    /// store's planner follows the speeds it measures from there.
    pub fn load_model(&self, facts: &[CodecFacts]) -> LoadModel {
        LoadModel { block_bytes: self.raw_block, decode_s: facts.iter().map(|f| self.decode_s(f)).collect() }
    }

    /// A served model's blocks ([`BLOCK_TOKENS`] tokens of `model`), recomputed on `gpu`.
    pub fn serving(model: &Profile, gpu: &Gpu, ssd_bps: f64) -> Costs {
        Costs {
            raw_block: model.bytes_per_token() * BLOCK_TOKENS,
            ssd_bps,
            dram_bps: DEFAULT_DRAM_GBPS * 1e9,
            decode_cores: std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64,
            recompute_s: gpu.prefill_s(model, BLOCK_TOKENS),
        }
    }
}

/// The planner's options for `facts` (raw first): each codec as a load from the log and a
/// decode, then dropped (recomputed); and the quality estimates it may see, per sensitivity
/// level, per option.
pub fn planner_config(
    alpha: f64,
    facts: &[CodecFacts],
    costs: &Costs,
    budget_bytes: u64,
) -> (PlannerConfig, Vec<Vec<f64>>) {
    let mut options: Vec<StoreOption> = facts
        .iter()
        .map(|f| {
            let stored = costs.raw_block as f64 * f.ratio;
            StoreOption {
                ratio: f.ratio,
                delay_s: stored / costs.ssd_bps + costs.decode_s(f),
                lossy: f.spec.is_some_and(|c| c.is_lossy()),
            }
        })
        .collect();
    options.push(StoreOption { ratio: 0.0, delay_s: costs.recompute_s, lossy: false });
    let estimates =
        (0..SENSITIVITY_LEVELS).map(|level| facts.iter().map(|f| f.estimate[level]).chain([1.0]).collect()).collect();
    // Held in memory, a block is copied from there instead of read from the log. Its budget is
    // the DRAM tier's, known once the volume is (0 until then: no choice).
    let held = facts.iter().map(|f| costs.raw_block as f64 * f.ratio / costs.dram_bps + costs.decode_s(f)).collect();
    let dram = DramChoice { budget_bytes: 0, delay_s: held };
    (PlannerConfig { alpha, half_life_ms: PLANNER_HALF_LIFE_MS, budget_bytes, options, dram }, estimates)
}

/// The engine's planned placement over `config`: each option's codec from `facts`, for
/// contexts without a profile the mean of the `estimates` over sensitivity levels, and delays
/// that follow the store's measured speeds from what `costs` made them.
pub fn planned(
    config: PlannerConfig,
    estimates: &[Vec<f64>],
    facts: &[CodecFacts],
    costs: &Costs,
    clock: Clock,
) -> anyhow::Result<Planned> {
    let levels = estimates.len().max(1) as f64;
    let quality = (0..config.options.len())
        .map(|o| estimates.iter().map(|e| e.get(o).copied().unwrap_or(1.0)).sum::<f64>() / levels)
        .collect();
    let codecs = facts.iter().map(|f| f.spec).collect();
    let loads = costs.load_model(facts);
    Ok(Planned::new(PlannedConfig { planner: config, codecs, quality, loads }, clock)?)
}

/// Raw, then the planner's codecs, measured on this machine.
pub fn planner_facts() -> anyhow::Result<Vec<CodecFacts>> {
    let mut facts = vec![CodecFacts::raw()];
    for spec in PLANNER_CODECS {
        facts.push(CodecFacts::measure(CodecSpec::parse(spec)?)?);
    }
    Ok(facts)
}

/// How a served or mounted volume decides where its blocks live (`--placement`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PlacementChoice {
    /// The oldest segment reclaimed whole when the volume is full.
    Fifo,
    /// A cleaner keeps the blocks read since their write, ahead of need.
    Lru,
    /// The planner decides per context: kept as put, recompressed, or dropped.
    Planner {
        /// Seconds of delay a unit of quality is worth, per block.
        alpha: f64,
    },
}

impl PlacementChoice {
    /// Parses `fifo`, `lru`, `planner` or `planner:alpha=SECS`.
    pub fn parse(text: &str) -> anyhow::Result<PlacementChoice> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("planner") {
            let alpha = match rest.strip_prefix(":alpha=") {
                Some(a) => match a.parse::<f64>() {
                    Ok(a) if a.is_finite() && a >= 0.0 => a,
                    _ => bail!("{text:?}: alpha must be a number of seconds, e.g. planner:alpha=0.5"),
                },
                None if rest.is_empty() => DEFAULT_ALPHA,
                None => bail!("unknown placement {text:?}; use fifo, lru, planner or planner:alpha=SECS"),
            };
            return Ok(PlacementChoice::Planner { alpha });
        }
        match text {
            "fifo" => Ok(PlacementChoice::Fifo),
            "lru" => Ok(PlacementChoice::Lru),
            _ => bail!("unknown placement {text:?}; use fifo, lru, planner or planner:alpha=SECS"),
        }
    }
}

/// A placement built for a volume, and its planner when it has one (told the volume's size once
/// it is open).
pub struct Placed {
    /// What the store consults.
    pub placement: Arc<dyn Placement>,
    planned: Option<Arc<Planned>>,
}

impl Placed {
    /// Builds `choice`; a planner's decode speeds are measured here (about a second), its
    /// recompute cost is that of [`PROFILES`]' first model on the default GPU.
    pub fn build(choice: PlacementChoice, ssd_gbps: f64, clock: Clock) -> anyhow::Result<Placed> {
        Ok(match choice {
            PlacementChoice::Fifo => Placed { placement: Arc::new(kvhoard_engine::placement::Fifo), planned: None },
            PlacementChoice::Lru => {
                Placed { placement: Arc::new(kvhoard_engine::placement::Lru::new(clock)), planned: None }
            }
            PlacementChoice::Planner { alpha } => {
                if !(ssd_gbps.is_finite() && ssd_gbps > 0.0) {
                    bail!("--planner-ssd-gbps {ssd_gbps}: give the log's read bandwidth in GB/s, e.g. 3");
                }
                let facts = planner_facts()?;
                let costs = Costs::serving(&PROFILES[0], &Gpu::default(), ssd_gbps * 1e9);
                // The budget is the volume's, known once it is open.
                let (config, estimates) = planner_config(alpha, &facts, &costs, u64::MAX);
                let planned = Arc::new(planned(config, &estimates, &facts, &costs, clock)?);
                Placed { placement: Arc::clone(&planned) as Arc<dyn Placement>, planned: Some(planned) }
            }
        })
    }

    /// `store` is open: the planner keeps its decisions within [`PLANNER_FILL`] of it, and what
    /// it holds in memory within [`PLANNER_DRAM_FILL`] of its DRAM tier.
    pub fn opened(&self, store: &Store) {
        if let Some(planned) = &self.planned {
            let stats = store.stats();
            planned.set_budget((stats.capacity_bytes as f64 * PLANNER_FILL) as u64);
            let dram = stats.tiers.iter().find(|t| t.tier == "dram").map_or(0, |t| t.capacity_bytes);
            planned.set_dram_budget((dram as f64 * PLANNER_DRAM_FILL) as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_parse_and_bad_ones_say_why() {
        assert_eq!(PlacementChoice::parse("lru").unwrap(), PlacementChoice::Lru);
        assert_eq!(PlacementChoice::parse("fifo").unwrap(), PlacementChoice::Fifo);
        assert_eq!(PlacementChoice::parse("planner").unwrap(), PlacementChoice::Planner { alpha: DEFAULT_ALPHA });
        assert_eq!(PlacementChoice::parse("planner:alpha=0.5").unwrap(), PlacementChoice::Planner { alpha: 0.5 });
        let err = PlacementChoice::parse("planner:alpha=-1").unwrap_err().to_string();
        assert!(err.contains("alpha must be a number"), "{err}");
        let err = PlacementChoice::parse("random").unwrap_err().to_string();
        assert!(err.contains("use fifo, lru, planner"), "{err}");
    }
}
