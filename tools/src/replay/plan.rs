//! `kvhoard plan capacity`: how much DRAM and SSD a trace needs and what each choice buys, as the
//! Pareto frontier of cost, mean TTFT and throughput over DRAM size × SSD size × TTL, every point
//! a simulator replay of the whole trace.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kvhoard_engine::StoreOptions;
use serde_json::{json, Value};

use super::cache::bounds::{NoCache, Unbounded};
use super::capacity::{frontier, geometric, hypervolume, point_json, search, Point, Reference, Space};
use super::run::replay;
use super::setup::{ServingArgs, Setup};
use super::ttl::TtlSpec;
use super::{simulate, PolicySpec, Tiers};
use crate::plot::{Chart, Series, SeriesLabelPosition};

/// Dollars per GB-hour of server DRAM: what a cloud charges for memory beyond compute, e.g. AWS
/// us-east-1 on-demand, r7i.xlarge (32 GiB, $0.2646/h) against m7i.xlarge (16 GiB, $0.2016/h):
/// $0.063 for 16 GiB more, about $0.0037 per GB-hour.
pub const DRAM_DOLLARS_PER_GB_HOUR: f64 = 0.0037;
/// Dollars per GB-hour of local NVMe: AWS i4i.xlarge (937 GB NVMe, $0.343/h) against m6i.xlarge
/// ($0.192/h): $0.151 for 937 GB, about $0.00016 per GB-hour.
pub const SSD_DOLLARS_PER_GB_HOUR: f64 = 0.00016;

/// The flags of `plan capacity`.
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityArgs {
    /// The trace (Mooncake's JSON lines); `-`: standard input.
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// The placement policy every configuration runs (see `kvhoard replay --help`).
    #[arg(long, default_value = "lru", value_name = "POLICY")]
    pub policy: String,
    /// Evaluate every point of the grid instead of searching adaptively.
    #[arg(long, conflicts_with = "versus_grid")]
    pub grid: bool,
    /// Run both: the grid, and the adaptive search on the same evaluations; report each one's
    /// hypervolume and evaluations.
    #[arg(long)]
    pub versus_grid: bool,
    /// Largest DRAM tier, as a fraction of the trace's distinct bytes.
    #[arg(long, default_value_t = 0.05, value_name = "F")]
    pub dram_max_fraction: f64,
    /// DRAM sizes in the grid (0, then geometric up to the largest).
    #[arg(long, default_value_t = 6, value_name = "N")]
    pub dram_steps: usize,
    /// Smallest SSD, as a fraction of the trace's distinct bytes.
    #[arg(long, default_value_t = 0.01, value_name = "F")]
    pub ssd_min_fraction: f64,
    /// Largest SSD, as a fraction of the trace's distinct bytes.
    #[arg(long, default_value_t = 1.0, value_name = "F")]
    pub ssd_max_fraction: f64,
    /// SSD sizes in the grid (geometric).
    #[arg(long, default_value_t = 9, value_name = "N")]
    pub ssd_steps: usize,
    /// TTLs in the grid, seconds, comma separated; `none` for no TTL.
    #[arg(long, default_value = "none,120,600,1800", value_name = "LIST")]
    pub ttls: String,
    /// DRAM price, dollars per GB-hour.
    #[arg(long, default_value_t = DRAM_DOLLARS_PER_GB_HOUR, value_name = "USD")]
    pub dram_cost: f64,
    /// SSD price, dollars per GB-hour.
    #[arg(long, default_value_t = SSD_DOLLARS_PER_GB_HOUR, value_name = "USD")]
    pub ssd_cost: f64,
    #[command(flatten)]
    pub serving: ServingArgs,
    /// Write the frontier's charts (SVG) into DIR.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Print one JSON object: frontier, hypervolume, evaluations, reference, every point.
    #[arg(long)]
    pub json: bool,
}

fn parse_ttls(text: &str) -> anyhow::Result<Vec<u32>> {
    let ttls: Vec<u32> = text
        .split(',')
        .map(|t| match t.trim() {
            "none" | "0" => Ok(0),
            n => n.parse::<u32>().with_context(|| format!("--ttls: {n:?} is not a number of seconds or `none`")),
        })
        .collect::<anyhow::Result<_>>()?;
    if ttls.is_empty() || ttls.len() > STEPS_MAX {
        bail!("--ttls gives {} TTLs: give between 1 and {STEPS_MAX}", ttls.len());
    }
    Ok(ttls)
}

/// Most sizes of one tier in the grid: every configuration replays the whole trace.
const STEPS_MAX: usize = 64;
/// Largest tier the grid may reach, as a multiple of the trace's distinct bytes (past 1 the
/// tier holds everything already).
const FRACTION_MAX: f64 = 100.0;

/// Checks the flags that shape the grid and the costs, before the trace is read.
fn check_flags(args: &CapacityArgs) -> anyhow::Result<()> {
    let fractions = [
        ("--ssd-min-fraction", args.ssd_min_fraction),
        ("--ssd-max-fraction", args.ssd_max_fraction),
        ("--dram-max-fraction", args.dram_max_fraction),
    ];
    for (flag, value) in fractions {
        if !(0.0..=FRACTION_MAX).contains(&value) {
            bail!("{flag} is {value:?}: give a fraction of the trace's distinct bytes between 0 and {FRACTION_MAX}");
        }
    }
    if !(args.ssd_min_fraction > 0.0 && args.ssd_min_fraction <= args.ssd_max_fraction) {
        bail!(
            "--ssd-min-fraction ({}) must be above 0 and at most --ssd-max-fraction ({})",
            args.ssd_min_fraction,
            args.ssd_max_fraction
        );
    }
    for (flag, steps) in [("--dram-steps", args.dram_steps), ("--ssd-steps", args.ssd_steps)] {
        if !(1..=STEPS_MAX).contains(&steps) {
            bail!(
                "{flag} is {steps}: give between 1 and {STEPS_MAX} sizes (each configuration replays the whole trace)"
            );
        }
    }
    for (flag, value) in [("--dram-cost", args.dram_cost), ("--ssd-cost", args.ssd_cost)] {
        if !(value.is_finite() && value >= 0.0) {
            bail!("{flag} is {value:?}: give a price in dollars per GB-hour, 0 or more");
        }
    }
    Ok(())
}

/// The space the flags describe.
fn space(args: &CapacityArgs, distinct: u64) -> anyhow::Result<Space> {
    let f = |x: f64| (distinct as f64 * x) as u64;
    check_flags(args)?;
    let dram =
        if args.dram_max_fraction == 0.0 { vec![0] } else { geometric(0, f(args.dram_max_fraction), args.dram_steps) };
    Ok(Space {
        dram,
        ssd: geometric(f(args.ssd_min_fraction), f(args.ssd_max_fraction), args.ssd_steps),
        ttl: parse_ttls(&args.ttls)?,
    })
}

/// `kvhoard plan capacity`.
pub fn run(args: &CapacityArgs, store: StoreOptions) -> anyhow::Result<ExitCode> {
    check_flags(args)?;
    if let Some(dir) = &args.plot {
        crate::output::refuse_volume_dir(dir)?;
    }
    let s = Setup::new(&args.trace, &args.serving, store, None)?;
    let policy = PolicySpec::parse(&args.policy)?;
    let facts = s.codecs(&policy)?;
    let space = space(args, s.distinct_bytes())?;
    let cost = |dram: u64, ssd: u64| dram as f64 / 1e9 * args.dram_cost + ssd as f64 / 1e9 * args.ssd_cost;
    let hidden = ProgressBar::hidden();
    let none = replay(&s.trace, &mut NoCache, &s.settings(facts.clone(), super::ttl::TtlSpec::None), &hidden)?;
    let ideal =
        replay(&s.trace, &mut Unbounded::default(), &s.settings(facts.clone(), super::ttl::TtlSpec::None), &hidden)?;
    let reference = Reference {
        cost: 1.1 * cost(space.dram.iter().copied().max().unwrap_or(0), space.ssd.iter().copied().max().unwrap_or(0)),
        ttft_ms: 1.1 * none.mean_ttft_ms(),
        throughput: ideal.throughput(s.gpus),
    };
    let bar = if !args.json && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(space.len() as u64);
        if let Ok(style) = ProgressStyle::with_template("{msg} {bar:40} {pos} configurations, {elapsed}") {
            bar.set_style(style);
        }
        bar.set_message("simulating");
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut memo: HashMap<(usize, usize, usize), Point> = HashMap::new();
    let mut evaluate = |at: (usize, usize, usize)| -> anyhow::Result<Point> {
        if let Some(p) = memo.get(&at) {
            return Ok(*p);
        }
        let (d, sz, t) = at;
        let (dram, ssd, ttl) = (space.dram[d], space.ssd[sz], space.ttl[t]);
        let tiers = Tiers {
            dram,
            ssd,
            ttl: if ttl > 0 { TtlSpec::Single(ttl) } else { TtlSpec::None },
            scale: super::DEFAULT_SCALE,
        };
        let report = simulate(&s, &policy, &facts, tiers, &ProgressBar::hidden())?;
        bar.inc(1);
        let p = Point {
            at,
            dram,
            ssd,
            ttl,
            cost: cost(dram, ssd),
            ttft_ms: report.mean_ttft_ms(),
            throughput: report.throughput(s.gpus),
            hit_rate: report.hit_rate(),
        };
        memo.insert(at, p);
        Ok(p)
    };
    let grid_points = space.len();
    let mut runs: Vec<(&str, Vec<Point>)> = Vec::new();
    if args.grid || args.versus_grid {
        runs.push(("grid", search(&space, true, &mut evaluate)?));
    }
    if !args.grid {
        // With --versus-grid every point is already known: count what the search asks for.
        let mut asked = 0usize;
        let mut counting = |at| {
            asked += 1;
            evaluate(at)
        };
        let points = search(&space, false, &mut counting)?;
        debug_assert_eq!(asked, points.len());
        runs.push(("adaptive", points));
    }
    bar.finish_and_clear();
    let results: Vec<Value> = runs
        .iter()
        .map(|(name, points)| {
            let mut front = frontier(points);
            front.sort_by(|a, b| a.cost.total_cmp(&b.cost));
            json!({
                "search": name,
                "evaluations": points.len(),
                "grid_points": grid_points,
                "hypervolume": (hypervolume(points, &reference) * 1e6).round() / 1e6,
                "frontier": front.iter().map(point_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    let setup = json!({
        "trace_requests": s.trace.requests.len(),
        "distinct_bytes": s.distinct_bytes(),
        "model": s.model.name,
        "policy": policy.name,
        "gpus": s.gpus,
        "dram_dollars_per_gb_hour": args.dram_cost,
        "ssd_dollars_per_gb_hour": args.ssd_cost,
        "reference": {
            "cost_per_hour": reference.cost,
            "mean_ttft_ms": reference.ttft_ms,
            "throughput_rps": reference.throughput,
            "no_cache_mean_ttft_ms": none.mean_ttft_ms(),
        },
    });
    if let Some(dir) = &args.plot {
        if let Some((_, points)) = runs.last() {
            charts(dir, points)?;
        }
    }
    if args.json {
        let mut out = results.last().cloned().unwrap_or(Value::Null);
        if let (Some(o), Some(extra)) = (out.as_object_mut(), setup.as_object()) {
            o.extend(extra.clone());
            if results.len() > 1 {
                o.insert("searches".into(), Value::Array(results.clone()));
            }
        }
        println!("{out}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} requests, {:.1} TB of distinct blocks ({}), policy {}; without a cache mean TTFT {:.0} ms",
        s.trace.requests.len(),
        s.distinct_bytes() as f64 / 1e12,
        s.model.name,
        policy.name,
        none.mean_ttft_ms()
    );
    for (result, (name, _)) in results.iter().zip(&runs) {
        println!(
            "\n{name} search: {} of {grid_points} configurations evaluated, hypervolume {}",
            result["evaluations"], result["hypervolume"]
        );
        println!(
            "{:>10} {:>10} {:>6} {:>9} {:>10} {:>9} {:>8}",
            "DRAM", "SSD", "TTL", "$/hour", "mean TTFT", "req/s", "hit rate"
        );
        for p in result["frontier"].as_array().into_iter().flatten() {
            let ttl = p["ttl_secs"].as_u64().filter(|t| *t > 0).map_or("none".into(), |t| format!("{t}s"));
            println!(
                "{:>10} {:>10} {:>6} {:>9.4} {:>8.0}ms {:>9.3} {:>8.3}",
                gb(p["dram_bytes"].as_u64().unwrap_or(0)),
                gb(p["ssd_bytes"].as_u64().unwrap_or(0)),
                ttl,
                p["cost_per_hour"].as_f64().unwrap_or(0.0),
                p["mean_ttft_ms"].as_f64().unwrap_or(0.0),
                p["throughput_rps"].as_f64().unwrap_or(0.0),
                p["hit_rate"].as_f64().unwrap_or(0.0),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn gb(bytes: u64) -> String {
    if bytes >= 1_000_000_000_000 {
        format!("{:.2} TB", bytes as f64 / 1e12)
    } else {
        format!("{:.0} GB", bytes as f64 / 1e9)
    }
}

fn label(p: &Point) -> String {
    let ttl = if p.ttl == 0 { String::new() } else { format!(", TTL {}s", p.ttl) };
    format!("{} DRAM, {} SSD{ttl}", gb(p.dram), gb(p.ssd))
}

/// The frontier over every evaluated point: cost against mean TTFT, and against throughput.
fn charts(dir: &std::path::Path, points: &[Point]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut front = frontier(points);
    front.sort_by(|a, b| a.cost.total_cmp(&b.cost));
    // Label every frontier point when few, else about five spread along it.
    let every = front.len().div_ceil(5).max(1);
    let labels = |f: &[Point]| {
        f.iter().enumerate().map(|(i, p)| if i % every == 0 { label(p) } else { String::new() }).collect()
    };
    for (file, title, y_label, y) in [
        (
            "frontier_ttft.svg",
            "Capacity frontier: cost against mean TTFT",
            "mean TTFT (ms)",
            (|p: &Point| p.ttft_ms) as fn(&Point) -> f64,
        ),
        (
            "frontier_throughput.svg",
            "Capacity frontier: cost against throughput",
            "requests per second",
            |p: &Point| p.throughput,
        ),
    ] {
        Chart {
            title: title.into(),
            x_label: "memory and storage cost ($/hour)".into(),
            y_label: y_label.into(),
            series: vec![
                Series {
                    name: "evaluated".into(),
                    points: points.iter().map(|p| (p.cost, y(p))).collect(),
                    labels: Some(Vec::new()),
                },
                Series {
                    name: "frontier".into(),
                    points: front.iter().map(|p| (p.cost, y(p))).collect(),
                    labels: Some(labels(&front)),
                },
            ],
            // Costs span orders of magnitude; the frontier's TTFTs a narrow band.
            log_x: true,
            y_from_zero: false,
            legend: SeriesLabelPosition::UpperRight,
        }
        .write(&dir.join(file))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_lists_parse_and_bad_ones_say_why() {
        assert_eq!(parse_ttls("none, 60,600").expect("parses"), vec![0, 60, 600]);
        assert!(format!("{:#}", parse_ttls("60,soon").unwrap_err()).contains("\"soon\""));
    }
}
