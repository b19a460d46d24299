//! `kvhoard plan capacity`: which DRAM size, SSD size and TTL a trace needs, as a Pareto frontier
//! of cost against mean TTFT and throughput, found with the simulator.
//!
//! The space is a grid: DRAM and SSD sizes as fractions of the trace's distinct bytes (spaced
//! geometrically), and a list of TTLs. `--grid` evaluates every point. The adaptive search
//! (after Kareto's) evaluates a coarse sub-grid of sizes at every TTL, then repeatedly evaluates
//! the size neighbours (same TTL) of the points on the frontier at the current spacing, halving
//! it whenever the frontier stops growing, until the spacing is one grid step. It never expands
//! around a dominated point: a region of diminishing returns (and a TTL that put no point on the
//! coarse frontier) is pruned. Both report the hypervolume of their frontier against the same
//! reference point, so their quality can be compared.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// One evaluated configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Grid indexes (dram, ssd, ttl).
    pub at: (usize, usize, usize),
    /// DRAM bytes.
    pub dram: u64,
    /// SSD bytes.
    pub ssd: u64,
    /// TTL, seconds (0: none).
    pub ttl: u32,
    /// Dollars per hour of the memory and storage.
    pub cost: f64,
    /// Mean TTFT, ms.
    pub ttft_ms: f64,
    /// Requests per second the GPUs sustain (requests ÷ busy seconds).
    pub throughput: f64,
    /// Block hit rate.
    pub hit_rate: f64,
}

/// The search space.
#[derive(Debug, Clone)]
pub struct Space {
    /// DRAM sizes, bytes.
    pub dram: Vec<u64>,
    /// SSD sizes, bytes.
    pub ssd: Vec<u64>,
    /// TTLs, seconds (0: none).
    pub ttl: Vec<u32>,
}

impl Space {
    /// Points in the grid.
    pub fn len(&self) -> usize {
        self.dram.len() * self.ssd.len() * self.ttl.len()
    }

    fn contains(&self, (d, s, t): (usize, usize, usize)) -> bool {
        d < self.dram.len() && s < self.ssd.len() && t < self.ttl.len()
    }
}

/// Sizes from `lo` to `hi` bytes in `n` geometric steps (0 first when `lo` is 0).
pub fn geometric(lo: u64, hi: u64, n: usize) -> Vec<u64> {
    if n <= 1 {
        return vec![hi];
    }
    let (start, rest) = if lo == 0 { (vec![0], n - 1) } else { (Vec::new(), n) };
    let a = (if lo == 0 { hi as f64 / 64.0 } else { lo as f64 }).max(1.0);
    let ratio = (hi as f64 / a).powf(1.0 / (rest.max(2) - 1) as f64);
    start.into_iter().chain((0..rest).map(|i| (a * ratio.powi(i as i32)) as u64)).collect()
}

/// Whether `a` is at least as good as `b` in every objective and better in one.
fn dominates(a: &Point, b: &Point) -> bool {
    let no_worse = a.cost <= b.cost && a.ttft_ms <= b.ttft_ms && a.throughput >= b.throughput;
    let better = a.cost < b.cost || a.ttft_ms < b.ttft_ms || a.throughput > b.throughput;
    no_worse && better
}

/// The points no other point dominates.
pub fn frontier(points: &[Point]) -> Vec<Point> {
    points.iter().filter(|p| !points.iter().any(|q| dominates(q, p))).copied().collect()
}

/// The reference point of a hypervolume and the scales that map objectives to [0, 1]: fixed
/// before a search from the space and the trace alone (never from what a search evaluated), so
/// that a grid search and an adaptive one are measured against the same box.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reference {
    /// Cost at the reference (above the space's most expensive point).
    pub cost: f64,
    /// Mean TTFT at the reference (above the TTFT without a cache).
    pub ttft_ms: f64,
    /// Throughput that scales to 1 (what an unbounded cache with free loads sustains); the
    /// reference itself is throughput 0.
    pub throughput: f64,
}

/// Hypervolume of `points` (minimising cost and TTFT, maximising throughput) in the box from
/// the origin to `r`, objectives scaled to [0, 1]: the share of the box they dominate.
pub fn hypervolume(points: &[Point], r: &Reference) -> f64 {
    // Each point as (x, y, z) to minimise in [0, 1].
    let mut pts: Vec<(f64, f64, f64)> = frontier(points)
        .iter()
        .map(|p| {
            (
                (p.cost / r.cost.max(1e-12)).clamp(0.0, 1.0),
                (p.ttft_ms / r.ttft_ms.max(1e-12)).clamp(0.0, 1.0),
                (1.0 - p.throughput / r.throughput.max(1e-12)).clamp(0.0, 1.0),
            )
        })
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Slices along x: between consecutive x values, the 2D hypervolume of the points so far.
    let mut volume = 0.0;
    for i in 0..pts.len() {
        let x_next = pts.get(i + 1).map_or(1.0, |p| p.0);
        let width = x_next - pts[i].0;
        if width <= 0.0 {
            continue;
        }
        volume += width * area(&pts[..=i]);
    }
    volume
}

/// 2D hypervolume (minimising y and z) of points in the unit square.
fn area(pts: &[(f64, f64, f64)]) -> f64 {
    let mut yz: Vec<(f64, f64)> = pts.iter().map(|p| (p.1, p.2)).collect();
    yz.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut best_z = 1.0;
    let mut total = 0.0;
    for (i, &(y, z)) in yz.iter().enumerate() {
        best_z = f64::min(best_z, z);
        let y_next = yz.get(i + 1).map_or(1.0, |p| p.0);
        total += (y_next - y).max(0.0) * (1.0 - best_z);
    }
    total
}

/// Searches `space` with `evaluate`: every point (`grid`), or adaptively. Returns every point
/// evaluated.
pub fn search(
    space: &Space,
    grid: bool,
    evaluate: &mut dyn FnMut((usize, usize, usize)) -> anyhow::Result<Point>,
) -> anyhow::Result<Vec<Point>> {
    let mut done: BTreeMap<(usize, usize, usize), Point> = BTreeMap::new();
    let mut eval = |at, done: &mut BTreeMap<_, _>| -> anyhow::Result<()> {
        if space.contains(at) && !done.contains_key(&at) {
            done.insert(at, evaluate(at)?);
        }
        Ok(())
    };
    if grid {
        for d in 0..space.dram.len() {
            for s in 0..space.ssd.len() {
                for t in 0..space.ttl.len() {
                    eval((d, s, t), &mut done)?;
                }
            }
        }
        return Ok(done.into_values().collect());
    }
    // Coarse: every `step`-th size (and the last), every TTL.
    let longest = space.dram.len().max(space.ssd.len());
    let mut step = (longest / 3).max(1).next_power_of_two();
    let coarse = |n: usize| -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).step_by(step).collect();
        if v.last() != Some(&(n - 1)) {
            v.push(n - 1);
        }
        v
    };
    for d in coarse(space.dram.len()) {
        for s in coarse(space.ssd.len()) {
            for t in 0..space.ttl.len() {
                eval((d, s, t), &mut done)?;
            }
        }
    }
    loop {
        let points: Vec<Point> = done.values().copied().collect();
        let front = frontier(&points);
        let before = done.len();
        for p in &front {
            let (d, s, t) = p.at;
            for (dd, ds) in [(-1i64, 0i64), (1, 0), (0, -1), (0, 1)] {
                let nd = d as i64 + dd * step as i64;
                let ns = s as i64 + ds * step as i64;
                if nd >= 0 && ns >= 0 {
                    eval((nd as usize, ns as usize, t), &mut done)?;
                }
            }
        }
        if done.len() == before {
            if step == 1 {
                break;
            }
            step /= 2;
        }
    }
    Ok(done.into_values().collect())
}

/// A point as JSON.
pub fn point_json(p: &Point) -> Value {
    json!({
        "dram_bytes": p.dram,
        "ssd_bytes": p.ssd,
        "ttl_secs": p.ttl,
        "cost_per_hour": (p.cost * 1e4).round() / 1e4,
        "mean_ttft_ms": (p.ttft_ms * 100.0).round() / 100.0,
        "throughput_rps": (p.throughput * 1000.0).round() / 1000.0,
        "hit_rate": (p.hit_rate * 1e4).round() / 1e4,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(at: (usize, usize, usize), cost: f64, ttft_ms: f64, throughput: f64) -> Point {
        Point { at, dram: 0, ssd: 0, ttl: 0, cost, ttft_ms, throughput, hit_rate: 0.0 }
    }

    #[test]
    fn frontier_and_hypervolume_by_hand() {
        let pts = [p((0, 0, 0), 1.0, 10.0, 1.0), p((1, 0, 0), 2.0, 5.0, 1.0), p((2, 0, 0), 2.0, 6.0, 1.0)];
        let f = frontier(&pts);
        assert_eq!(f.len(), 2, "the third is dominated by the second");
        let r = Reference { cost: 4.0, ttft_ms: 20.0, throughput: 1.0 };
        // Throughput 1 of 1: z = 0 everywhere; area in (cost, ttft): x in [0.25,0.5): y >= 0.5,
        // x in [0.5,1]: y >= 0.25 → 0.25*0.5 + 0.5*0.75 = 0.5.
        assert!((hypervolume(&pts, &r) - 0.5).abs() < 1e-12, "{}", hypervolume(&pts, &r));
        assert_eq!(hypervolume(&[], &r), 0.0);
    }

    #[test]
    fn the_adaptive_search_finds_a_frontier_with_fewer_evaluations() {
        // A smooth trade-off: more memory costs more and cuts TTFT with diminishing returns.
        let space = Space { dram: geometric(0, 1 << 30, 9), ssd: geometric(1 << 30, 64 << 30, 9), ttl: vec![0, 600] };
        let calls = std::cell::Cell::new(0usize);
        let mut evaluate = |at: (usize, usize, usize)| {
            calls.set(calls.get() + 1);
            let (d, s, t) = at;
            let cost = space.dram[d] as f64 * 4e-9 + space.ssd[s] as f64 * 1e-10;
            // Hits grow with memory until the working set (16 GiB, DRAM counting four times)
            // fits, then nothing more is bought: the region the search should prune.
            let reach = (4 * space.dram[d] + space.ssd[s]) as f64 / (16u64 << 30) as f64;
            let ttft = 10.0 + 90.0 * (1.0 - reach.min(1.0)) + if t == 1 { 2.0 } else { 0.0 };
            Ok(Point {
                at,
                dram: space.dram[d],
                ssd: space.ssd[s],
                ttl: space.ttl[t],
                cost,
                ttft_ms: ttft,
                throughput: 1000.0 / ttft,
                hit_rate: 0.0,
            })
        };
        let all = search(&space, true, &mut evaluate).unwrap();
        let grid_calls = calls.replace(0);
        let some = search(&space, false, &mut evaluate).unwrap();
        let r = Reference {
            cost: all.iter().map(|p| p.cost).fold(0.0, f64::max),
            ttft_ms: all.iter().map(|p| p.ttft_ms).fold(0.0, f64::max),
            throughput: all.iter().map(|p| p.throughput).fold(0.0, f64::max),
        };
        let ratio = hypervolume(&some, &r) / hypervolume(&all, &r);
        assert!(ratio >= 0.95, "adaptive search reached {ratio} of the grid's hypervolume");
        let calls = calls.get();
        assert!(calls * 10 <= grid_calls * 4, "{calls} evaluations of {grid_calls}");
    }
}
