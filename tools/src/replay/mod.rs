//! `kvhoard replay`: a request trace through the real engine (`--volume DIR`) or through the
//! simulator (`--sim`), under one or more policies, with TTFT, hit rate, quality, write
//! amplification, and charts. docs/replay.md describes the model and its assumptions.

pub mod cache;
pub mod capacity;
pub mod engine;
pub mod generate;
pub mod model;
pub mod plan;
pub mod planning;
pub mod run;
pub mod setup;
pub mod sim;
pub mod trace;
pub mod ttl;
pub mod ttl_curve;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kvhoard_engine::placement::planner::{PlannedCleaning, PlannerConfig};
use kvhoard_engine::placement::{Fifo, Lru, Placement};
use kvhoard_engine::{Clock, CodecSpec, StoreOptions};
use serde_json::{json, Value};

use crate::plot::{Chart, Series, SeriesLabelPosition};
use cache::Cache;
use kvhoard_engine::placement::group_ttl::GroupTtlConfig;
use model::CodecFacts;
use planning::{Costs, PlacementChoice, PLANNER_DRAM_FILL, PLANNER_FILL};
use run::{quantile, replay, Report};
use setup::{ServingArgs, Setup};
use sim::SimCache;
use ttl::TtlSpec;

/// The real engine's block divisor unless `--scale` says otherwise: an 8B model's 64 MiB trace
/// block becomes 2 MiB.
pub const DEFAULT_SCALE: u64 = 32;

/// Longest window group TTL learns from, seconds (30 days).
const TTL_WINDOW_MAX_SECS: u64 = 30 * 24 * 3600;

/// The flags of `replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// The trace (Mooncake's JSON lines: timestamp, input_length, output_length, hash_ids); `-`:
    /// standard input.
    pub trace: PathBuf,
    /// Replay through the real engine, on a fresh volume created in DIR (removed afterwards).
    #[arg(long, value_name = "DIR", conflicts_with = "sim")]
    pub volume: Option<PathBuf>,
    /// Replay through the simulator (metadata only, the engine's placement code).
    #[arg(long)]
    pub sim: bool,
    /// Run the real engine and the simulator on the same slice and report how far they agree
    /// (the simulator charges loads at bandwidths measured on DIR first).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["volume", "sim"])]
    pub compare: Option<PathBuf>,
    /// Policies, comma separated: lru (cleaning keeps what was read), fifo (the oldest segment
    /// reclaimed whole), either with a codec for every block (lru:SPEC, fifo:SPEC, e.g.
    /// lru:quant:bits=8); fixed:SPEC is lru:SPEC; planner or planner:alpha=SECS (the placement
    /// planner chooses each context's codec or drops it, in the simulator and in the engine).
    #[arg(long, default_value = "lru", value_name = "LIST")]
    pub policy: String,
    /// Divide every block's size by this on the real engine (layers × 512 must be a multiple);
    /// reported times and sizes are scaled back.
    #[arg(long, default_value_t = DEFAULT_SCALE, value_name = "N")]
    pub scale: u64,
    /// DRAM tier size (at the model's real sizes).
    #[arg(long, value_parser = crate::size::parse_size, value_name = "SIZE", conflicts_with = "dram_fraction")]
    pub dram: Option<u64>,
    /// DRAM tier as a fraction of the trace's distinct bytes [default: 0].
    #[arg(long, value_name = "F")]
    pub dram_fraction: Option<f64>,
    /// SSD (volume) size at the model's real sizes.
    #[arg(long, value_parser = crate::size::parse_size, value_name = "SIZE", conflicts_with = "ssd_fraction")]
    pub ssd: Option<u64>,
    /// SSD size as a fraction of the trace's distinct bytes [default: 0.3].
    #[arg(long, value_name = "F")]
    pub ssd_fraction: Option<f64>,
    /// Seconds until a stored block expires (none by default).
    #[arg(long, value_name = "SECS", conflicts_with = "group_ttl")]
    pub ttl: Option<u32>,
    /// Group TTL: a TTL per group of contexts (the most accessed --ttl-groups, and the rest),
    /// learned from the requests seen so far, that together keep SIZE stored on average
    /// (a budget of SIZE × the window's seconds in byte-seconds, at the model's sizes).
    #[arg(long, value_parser = crate::size::parse_size, value_name = "SIZE")]
    pub group_ttl: Option<u64>,
    /// Groups with a TTL of their own under --group-ttl.
    #[arg(long, default_value_t = 64, value_name = "K")]
    pub ttl_groups: usize,
    /// Plan group TTL once from the whole trace (as an operator would from yesterday's traffic)
    /// instead of learning it as the trace goes.
    #[arg(long, requires = "group_ttl")]
    pub ttl_known: bool,
    /// Seconds of requests group TTL learns from (recomputed every quarter of it).
    #[arg(long, default_value_t = 3600, value_name = "SECS")]
    pub ttl_window: u64,
    /// Sweep budgets: per budget, the block hits of the best single TTL (chosen knowing the
    /// whole trace) and of group TTL (learned as the trace goes), on the first policy.
    #[arg(long, conflicts_with_all = ["volume", "compare", "ttl", "group_ttl"])]
    pub ttl_curve: bool,
    #[command(flatten)]
    pub serving: ServingArgs,
    /// Write charts (SVG) into DIR.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The tiers a replay runs with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tiers {
    /// DRAM tier bytes, at the model's sizes.
    pub dram: u64,
    /// SSD (volume) bytes, at the model's sizes.
    pub ssd: u64,
    /// How long a stored block lives.
    pub ttl: TtlSpec,
    /// The real engine's block divisor (`--scale`): the simulator copies the geometry of the
    /// volume the engine would use.
    pub scale: u64,
}

/// A policy as the replay builds it.
#[derive(Debug, Clone)]
pub struct PolicySpec {
    /// As given.
    pub name: String,
    /// The codec every block is stored with, if any.
    pub codec: Option<CodecSpec>,
    lru: bool,
    /// The placement planner's α (seconds of delay a unit of quality is worth), for `planner`.
    pub planner: Option<f64>,
}

impl PolicySpec {
    /// Parses `lru`, `fifo`, `lru:SPEC`, `fifo:SPEC`, `fixed:SPEC` (= `lru:SPEC`) or
    /// `planner[:alpha=SECS]`.
    pub fn parse(text: &str) -> anyhow::Result<PolicySpec> {
        let text = text.trim();
        if text.starts_with("planner") {
            let PlacementChoice::Planner { alpha } =
                PlacementChoice::parse(text).with_context(|| format!("policy {text:?}"))?
            else {
                bail!("unknown policy {text:?}; use planner or planner:alpha=SECS");
            };
            return Ok(PolicySpec { name: text.into(), codec: None, lru: true, planner: Some(alpha) });
        }
        let (eviction, codec) = text.split_once(':').map_or((text, None), |(e, c)| (e, Some(c)));
        let lru = match eviction {
            "lru" | "fixed" => true,
            "fifo" => false,
            _ => bail!(
                "unknown policy {text:?}; use lru, fifo, lru:SPEC, fifo:SPEC or fixed:SPEC (e.g. fixed:quant:bits=8)"
            ),
        };
        let codec = match codec {
            Some(spec) => Some(CodecSpec::parse(spec).map_err(|e| anyhow::anyhow!("policy {text:?}: {e}"))?),
            None if eviction == "fixed" => {
                bail!("policy {text:?} names no codec; use fixed:SPEC, e.g. fixed:quant:bits=8")
            }
            None => None,
        };
        Ok(PolicySpec { name: text.into(), codec, lru, planner: None })
    }

    /// The engine placement this policy is, reading time (segment ages) from `clock`: the
    /// replay's, which follows trace time.
    pub fn placement(&self, clock: Clock) -> Arc<dyn Placement> {
        if self.planner.is_some() {
            Arc::new(PlannedCleaning::new(clock))
        } else if self.lru {
            Arc::new(Lru::new(clock))
        } else {
            Arc::new(Fifo)
        }
    }

    /// Codecs its blocks may be stored with: raw, and its codec's (or the planner's) measured
    /// facts.
    pub fn codecs(&self) -> anyhow::Result<Vec<CodecFacts>> {
        let mut facts = if self.planner.is_some() { planning::planner_facts()? } else { vec![CodecFacts::raw()] };
        if let Some(spec) = self.codec {
            facts.push(CodecFacts::measure(spec)?);
        }
        Ok(facts)
    }
}

fn progress(len: u64, show: bool, what: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} requests, {eta} left") {
        bar.set_style(style);
    }
    bar.set_message(what.to_string());
    bar
}

/// What loading and recomputing a block cost under this setup.
pub fn costs_of(s: &Setup) -> Costs {
    Costs {
        raw_block: s.raw_block,
        ssd_bps: s.bandwidths.ssd_bps,
        dram_bps: s.bandwidths.dram_bps,
        decode_cores: s.bandwidths.decode_cores,
        recompute_s: s.gpu.prefill_s(&s.model, trace::BLOCK_TOKENS),
    }
}

/// The planner's options for `facts` under this setup's costs (see `planning`).
pub fn planner_for(s: &Setup, alpha: f64, facts: &[CodecFacts], budget_bytes: u64) -> (PlannerConfig, Vec<Vec<f64>>) {
    planning::planner_config(alpha, facts, &costs_of(s), budget_bytes)
}

/// The simulator for `policy` with `tiers`.
fn sim_cache(s: &Setup, policy: &PolicySpec, facts: &[CodecFacts], tiers: Tiers) -> SimCache {
    // Segments as the engine's replay volume has them (sized at the scaled block, scaled back).
    let (create, segments) = engine::geometry(&s.model, tiers.scale, tiers.ssd);
    let segment = create.segment_size_bytes * tiers.scale;
    let capacity = u64::from(segments) * segment;
    let clock = Arc::new(AtomicU64::new(0));
    let placement = policy.placement(Clock::manual(Arc::clone(&clock)));
    let cache = SimCache::new(
        placement,
        clock,
        facts.to_vec(),
        s.bandwidths,
        s.raw_block,
        sim::Layout { ssd_bytes: capacity, segment_bytes: segment, dram_bytes: tiers.dram },
    );
    match policy.planner {
        // The planner keeps what it decides within most of the volume, leaving the cleaner room.
        Some(alpha) => {
            let (mut config, estimates) = planner_for(s, alpha, facts, (capacity as f64 * PLANNER_FILL) as u64);
            config.dram.budget_bytes = (tiers.dram as f64 * PLANNER_DRAM_FILL) as u64;
            cache.with_planner(sim::Planned::new(config, estimates))
        }
        None => cache,
    }
}

/// One policy's replay through the simulator.
pub fn simulate(
    s: &Setup,
    policy: &PolicySpec,
    facts: &[CodecFacts],
    tiers: Tiers,
    bar: &ProgressBar,
) -> anyhow::Result<Report> {
    let mut cache = sim_cache(s, policy, facts, tiers);
    replay(&s.trace, &mut cache, &s.settings(facts.to_vec(), tiers.ttl), bar)
}

/// One policy's replay, through the simulator or the engine (in `volume`).
fn run_one(
    s: &Setup,
    args: &ReplayArgs,
    policy: &PolicySpec,
    tiers: Tiers,
    volume: Option<&Path>,
) -> anyhow::Result<Report> {
    let facts = s.codecs(policy)?;
    let show = !args.json && std::io::stderr().is_terminal();
    let bar = progress(s.trace.requests.len() as u64, show, &policy.name);
    let report = match volume {
        None => simulate(s, policy, &facts, tiers, &bar)?,
        Some(dir) => {
            let dir = dir.join(format!("replay-{}", policy.name.replace([':', ',', '=', '+'], "_")));
            if dir.exists() {
                bail!("{} exists; replay needs a fresh directory", dir.display());
            }
            let mut cache = engine::EngineCache::create(&dir, s, args.scale, tiers, policy, &facts)?;
            let result = replay(&s.trace, &mut cache as &mut dyn Cache, &s.settings(facts, tiers.ttl), &bar);
            cache.close()?;
            let _ = std::fs::remove_dir_all(&dir);
            result?
        }
    };
    bar.finish_and_clear();
    Ok(report)
}

/// Share of requests with the same number of hits in both reports.
fn alike(a: &Report, b: &Report) -> f64 {
    let same = a.served.iter().zip(&b.served).filter(|(x, y)| x.hits == y.hits).count();
    same as f64 / a.served.len().max(1) as f64
}

/// A report as JSON.
pub fn summary(name: &str, mode: &str, report: &Report) -> Value {
    let t = report.ttfts_ms();
    json!({
        "policy": name,
        "mode": mode,
        "requests": report.served.len(),
        "hit_rate": round(report.hit_rate(), 4),
        "mean_ttft_ms": round(report.mean_ttft_ms(), 2),
        "p50_ttft_ms": round(quantile(&t, 0.5), 2),
        "p99_ttft_ms": round(quantile(&t, 0.99), 2),
        "mean_load_ms": round(report.mean_load_ms(), 3),
        "p99_load_ms": round(quantile(&report.load_ms_of_hits(), 0.99), 3),
        "mean_quality": round(report.mean_quality(), 4),
        "below_0_9": round(report.below_09(), 4),
        "bytes_written": report.cache.bytes_written,
        "write_amplification": round(report.cache.write_amplification(), 4),
        "evictions": report.cache.evictions,
        "stored_bytes": report.cache.stored_bytes,
        "byte_seconds": report.cache.byte_seconds,
        "planner_cpu_s": round(report.cache.planner_cpu_s, 4),
        "recompressed": report.cache.recompressed,
        "planner_drops": report.cache.planner_drops,
        "segments_freed_ahead": report.cache.segments_freed_ahead,
    })
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

fn charts(dir: &Path, runs: &[(String, Report)]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let cdf = |r: &Report| {
        let t = r.ttfts_ms();
        let n = t.len().max(1) as f64;
        // At most about 400 points: a CDF needs no more to look smooth.
        let step = (t.len() / 400).max(1);
        t.iter()
            .enumerate()
            .filter(|(i, _)| i % step == 0 || i + 1 == t.len())
            .map(|(i, &v)| (v, (i + 1) as f64 / n))
            .collect::<Vec<_>>()
    };
    Chart {
        log_x: true,
        y_from_zero: true,
        legend: SeriesLabelPosition::UpperLeft,
        title: "TTFT distribution".into(),
        x_label: "TTFT (ms)".into(),
        y_label: "share of requests".into(),
        series: runs.iter().map(|(n, r)| Series::line(n, cdf(r))).collect(),
    }
    .write(&dir.join("ttft_cdf.svg"))?;
    let hit_rate_over_time = |r: &Report| {
        let chunk = (r.served.len() / 50).max(1);
        r.served
            .chunks(chunk)
            .map(|c| {
                let refs: usize = c.iter().map(|s| s.blocks).sum();
                (
                    c.first().map_or(0.0, |s| s.arrival_s),
                    c.iter().map(|s| s.hits).sum::<usize>() as f64 / refs.max(1) as f64,
                )
            })
            .collect::<Vec<_>>()
    };
    Chart {
        log_x: false,
        y_from_zero: true,
        legend: SeriesLabelPosition::LowerRight,
        title: "Hit rate over the trace".into(),
        x_label: "trace time (s)".into(),
        y_label: "block hit rate".into(),
        series: runs.iter().map(|(n, r)| Series::line(n, hit_rate_over_time(r))).collect(),
    }
    .write(&dir.join("hit_rate.svg"))?;
    Chart {
        log_x: false,
        y_from_zero: true,
        legend: SeriesLabelPosition::LowerRight,
        title: "Stored bytes over the trace".into(),
        x_label: "trace time (s)".into(),
        y_label: "stored (GB)".into(),
        series: runs
            .iter()
            .map(|(n, r)| Series::line(n, r.stored_over_time.iter().map(|&(t, b)| (t, b as f64 / 1e9)).collect()))
            .collect(),
    }
    .write(&dir.join("stored_bytes.svg"))?;
    Chart {
        log_x: false,
        y_from_zero: true,
        legend: SeriesLabelPosition::LowerRight,
        title: "Quality against TTFT".into(),
        x_label: "mean TTFT (ms)".into(),
        y_label: "mean quality".into(),
        series: runs
            .iter()
            .map(|(n, r)| Series {
                name: n.clone(),
                points: vec![(r.mean_ttft_ms(), r.mean_quality())],
                labels: Some(vec![n.clone()]),
            })
            .collect(),
    }
    .write(&dir.join("quality_ttft.svg"))?;
    Ok(())
}

/// The TTL rule the flags ask for.
fn ttl_spec(args: &ReplayArgs) -> TtlSpec {
    match (args.ttl, args.group_ttl) {
        (Some(secs), _) => TtlSpec::Single(secs),
        (None, Some(budget_bytes)) => {
            TtlSpec::Group { budget_bytes, config: group_config(args), known: args.ttl_known }
        }
        (None, None) => TtlSpec::None,
    }
}

/// Group TTL's settings from the flags.
fn group_config(args: &ReplayArgs) -> GroupTtlConfig {
    GroupTtlConfig {
        top_k: args.ttl_groups,
        window_ms: args.ttl_window.saturating_mul(1000),
        ..GroupTtlConfig::default()
    }
}

/// `kvhoard replay`.
pub fn run(args: &ReplayArgs, store: StoreOptions) -> anyhow::Result<ExitCode> {
    if args.volume.is_none() && args.compare.is_none() && !args.sim {
        bail!("say where to replay: --sim, --volume DIR (the real engine) or --compare DIR (both)");
    }
    if args.scale == 0 {
        bail!("--scale must be at least 1 (1: blocks at the model's real size)");
    }
    if !(1..=TTL_WINDOW_MAX_SECS).contains(&args.ttl_window) {
        bail!("--ttl-window is {}: give between 1 and {TTL_WINDOW_MAX_SECS} seconds (30 days)", args.ttl_window);
    }
    let groups_max = kvhoard_engine::MAX_TTL_GROUPS as usize;
    if !(1..=groups_max).contains(&args.ttl_groups) {
        bail!("--ttl-groups is {}: give between 1 and {groups_max}", args.ttl_groups);
    }
    if let Some(dir) = &args.plot {
        crate::output::refuse_volume_dir(dir)?;
    }
    let calibrate = args.compare.as_deref().map(|dir| (dir, args.scale));
    let s = Setup::new(&args.trace, &args.serving, store, calibrate)?;
    let tiers = Tiers {
        dram: s.size("dram", args.dram, args.dram_fraction, 0.0)?,
        ssd: s.size("ssd", args.ssd, args.ssd_fraction, 0.3)?,
        ttl: ttl_spec(args),
        scale: args.scale,
    };
    if tiers.ssd < s.raw_block {
        bail!(
            "an SSD tier of {} bytes holds no {}-byte block of {}; give --ssd or --ssd-fraction room for one",
            tiers.ssd,
            s.raw_block,
            s.model.name
        );
    }
    let policies = args.policy.split(',').map(PolicySpec::parse).collect::<anyhow::Result<Vec<_>>>()?;
    if args.ttl_curve {
        let policy = policies.first().context("--policy names no policy")?;
        return ttl_curve::run(&s, policy, tiers, group_config(args), args.plot.as_deref(), args.json);
    }
    let mut runs: Vec<(String, Report)> = Vec::new();
    let mut out = Vec::new();
    let header = json!({
        "trace_requests": s.trace.requests.len(),
        "distinct_blocks": s.trace.distinct_blocks(),
        "model": s.model.name,
        "block_bytes": s.raw_block,
        "dram_bytes": tiers.dram,
        "ssd_bytes": tiers.ssd,
        "scale": args.scale,
        "gpus": s.gpus,
        "ssd_gbps": round(s.bandwidths.ssd_bps / 1e9, 3),
        "dram_gbps": round(s.bandwidths.dram_bps / 1e9, 3),
        "decode_cores": s.bandwidths.decode_cores,
    });
    for policy in &policies {
        if let Some(dir) = &args.compare {
            let engine = run_one(&s, args, policy, tiers, Some(dir))?;
            let sim = run_one(&s, args, policy, tiers, None)?;
            let agree = json!({
                "hit_rate_ratio": round(sim.hit_rate() / engine.hit_rate().max(1e-12), 4),
                "mean_ttft_ratio": round(sim.mean_ttft_ms() / engine.mean_ttft_ms().max(1e-12), 4),
                "mean_load_ratio": round(sim.mean_load_ms() / engine.mean_load_ms().max(1e-12), 4),
                "requests_hitting_alike": round(alike(&engine, &sim), 4),
            });
            out.push(json!({ "engine": summary(&policy.name, "engine", &engine), "sim": summary(&policy.name, "sim", &sim), "agreement": agree }));
            runs.push((format!("{} (engine)", policy.name), engine));
            runs.push((format!("{} (sim)", policy.name), sim));
        } else {
            let report = run_one(&s, args, policy, tiers, args.volume.as_deref())?;
            let mode = if args.volume.is_some() { "engine" } else { "sim" };
            out.push(summary(&policy.name, mode, &report));
            runs.push((policy.name.clone(), report));
        }
    }
    if let Some(dir) = &args.plot {
        charts(dir, &runs)?;
    }
    if args.json {
        let value = match out.as_slice() {
            [one] if args.compare.is_none() => {
                let mut v = one.clone();
                if let (Some(o), Some(h)) = (v.as_object_mut(), header.as_object()) {
                    o.extend(h.clone());
                }
                v
            }
            _ => json!({ "setup": header, "runs": out }),
        };
        println!("{value}");
    } else {
        println!(
            "{} requests, {} distinct blocks of {} MiB ({}), DRAM {:.1} GB, SSD {:.1} GB",
            s.trace.requests.len(),
            s.trace.distinct_blocks(),
            s.raw_block >> 20,
            s.model.name,
            tiers.dram as f64 / 1e9,
            tiers.ssd as f64 / 1e9
        );
        println!(
            "{:<36} {:>8} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9}",
            "policy", "hit rate", "mean TTFT", "p50", "p99", "quality", "<0.9", "write amp"
        );
        for (name, r) in &runs {
            let t = r.ttfts_ms();
            println!(
                "{name:<36} {:>8.3} {:>8.0}ms {:>8.0}ms {:>8.0}ms {:>8.3} {:>8.3} {:>9.3}",
                r.hit_rate(),
                r.mean_ttft_ms(),
                quantile(&t, 0.5),
                quantile(&t, 0.99),
                r.mean_quality(),
                r.below_09(),
                r.cache.write_amplification()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
