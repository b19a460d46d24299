//! `kvhoard replay --sim --ttl-curve`: block hits of the best single TTL and of group TTL at the
//! same byte-seconds budget, over a sweep of budgets.
//!
//! The single TTL for a budget is the one the model (`group_ttl::Curves` over the whole trace)
//! says gets the most hits within it; group TTL is planned from the same curves (`group_hits`),
//! and also learned online from the window of requests seen so far (`group_online_hits`). Each is
//! then replayed through the simulator with the replay's tiers, so capacity evictions count too.

use std::path::Path;
use std::process::ExitCode;

use indicatif::ProgressBar;
use kvhoard_engine::placement::group_ttl::{Curves, GroupTtlConfig, FOREVER};
use serde_json::json;

use super::run::Report;
use super::setup::Setup;
use super::ttl::{trace_accesses, TtlSpec};
use super::{round, simulate, PolicySpec, Tiers};
use crate::plot::{Chart, Series, SeriesLabelPosition};

/// Budgets swept: mean bytes stored, as fractions of the trace's distinct stored bytes.
const FRACTIONS: [f64; 9] = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0];

fn block_hits(r: &Report) -> u64 {
    r.served.iter().map(|s| s.hits as u64).sum()
}

/// Runs the sweep and prints it.
pub fn run(
    s: &Setup,
    policy: &PolicySpec,
    tiers: Tiers,
    config: GroupTtlConfig,
    plot: Option<&Path>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let facts = s.codecs(policy)?;
    let stored = s.settings(facts.clone(), TtlSpec::None).stored_block_bytes;
    let accesses = trace_accesses(&s.trace, s.time_scale, stored);
    let whole = GroupTtlConfig { window_ms: u64::MAX, max_accesses: usize::MAX, ..config };
    let curves = Curves::from_accesses(accesses, whole);
    let duration_s = s.trace.duration_s() / s.time_scale;
    let distinct = s.trace.distinct_blocks() * stored;
    let mut rows = Vec::new();
    let bar = ProgressBar::hidden();
    for f in FRACTIONS {
        let budget = (distinct as f64 * f) as u64;
        let (single_ms, model_single, _) = curves.best_single(budget as f64 * duration_s);
        let single_ttl = (single_ms != FOREVER).then(|| u32::try_from(single_ms.div_ceil(1000)).unwrap_or(u32::MAX));
        let spec = single_ttl.map_or(TtlSpec::None, TtlSpec::Single);
        let single = simulate(s, policy, &facts, Tiers { ttl: spec, ..tiers }, &bar)?;
        let group_spec = |known| TtlSpec::Group { budget_bytes: budget, config, known };
        let group = simulate(s, policy, &facts, Tiers { ttl: group_spec(true), ..tiers }, &bar)?;
        let online = simulate(s, policy, &facts, Tiers { ttl: group_spec(false), ..tiers }, &bar)?;
        rows.push(json!({
            "budget": budget,
            "budget_fraction": f,
            "budget_byte_seconds": budget as f64 * duration_s,
            "single_ttl": single_ttl,
            "single_hits": block_hits(&single),
            "group_hits": block_hits(&group),
            "group_online_hits": block_hits(&online),
            "group_online_byte_seconds": online.cache.byte_seconds,
            "model_single_hits": model_single,
            "single_mean_ttft_ms": round(single.mean_ttft_ms(), 2),
            "group_mean_ttft_ms": round(group.mean_ttft_ms(), 2),
            "single_byte_seconds": single.cache.byte_seconds,
            "group_byte_seconds": group.cache.byte_seconds,
        }));
    }
    if let Some(dir) = plot {
        std::fs::create_dir_all(dir)?;
        let line = |key: &str| {
            rows.iter().map(|r| (r["budget"].as_f64().unwrap_or(0.0) / 1e9, r[key].as_f64().unwrap_or(0.0))).collect()
        };
        Chart {
            title: "Hits against TTL budget".into(),
            x_label: "budget: mean bytes stored (GB)".into(),
            y_label: "block hits".into(),
            series: vec![
                Series::line("best single TTL", line("single_hits")),
                Series::line("group TTL", line("group_hits")),
                Series::line("group TTL, learned online", line("group_online_hits")),
            ],
            log_x: true,
            y_from_zero: true,
            legend: SeriesLabelPosition::LowerRight,
        }
        .write(&dir.join("ttl_curve.svg"))?;
    }
    if json {
        let groups = curves.groups.len();
        println!("{}", json!({ "policy": policy.name, "ssd_bytes": tiers.ssd, "groups": groups, "ttl_curve": rows }));
    } else {
        println!(
            "{:>10} {:>12} {:>12} {:>12} {:>10}",
            "budget GB", "single TTL", "single hits", "group hits", "group/one"
        );
        for r in &rows {
            let single = r["single_hits"].as_f64().unwrap_or(0.0);
            let group = r["group_hits"].as_f64().unwrap_or(0.0);
            let ttl = r["single_ttl"].as_u64().map_or("none".to_string(), |t| format!("{t}s"));
            println!(
                "{:>10.1} {:>12} {:>12} {:>12} {:>10.3}",
                r["budget"].as_f64().unwrap_or(0.0) / 1e9,
                ttl,
                single,
                group,
                group / single.max(1.0)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
