//! The replay loop, the same for the real engine and the simulator: each request looks up its
//! longest stored prefix, loads it, prefills the rest on a pool of serving GPUs (requests queue
//! in arrival order for the first one free) and stores what it computed. TTFT = time queued +
//! prefill of the tokens not loaded + loading the ones that were.

use indicatif::ProgressBar;

use super::cache::{Cache, CacheStats};
use super::model::{sensitivity, CodecFacts, Gpu, Profile};
use super::trace::{block_tokens, Trace};
use super::ttl::TtlSpec;
use kvhoard_engine::placement::group_ttl::TtlLearner;

/// What drives a replay besides the cache.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The served model.
    pub model: Profile,
    /// The serving GPU.
    pub gpu: Gpu,
    /// GPUs serving prefills (each takes the next queued request when free).
    pub gpus: usize,
    /// Arrivals sped up by this factor (2: twice as fast as the trace).
    pub time_scale: f64,
    /// Codecs the cache may store blocks with, as `Lookup::hit_codec` indexes them (0: raw).
    pub codecs: Vec<CodecFacts>,
    /// How long stored blocks are kept.
    pub ttl: TtlSpec,
    /// Bytes one block takes stored (what group TTL's budget counts).
    pub stored_block_bytes: u64,
}

/// One request's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Served {
    /// Arrival, seconds of trace time.
    pub arrival_s: f64,
    /// Time to first token, seconds.
    pub ttft_s: f64,
    /// Blocks in the prompt.
    pub blocks: usize,
    /// Of those, loaded from the cache.
    pub hits: usize,
    /// Quality in [0, 1] of what it was served (computed tokens count 1).
    pub quality: f64,
    /// Seconds loading (and decoding) its hits.
    pub load_s: f64,
}

/// A whole replay.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Per request, in order.
    pub served: Vec<Served>,
    /// What the cache wrote and dropped.
    pub cache: CacheStats,
    /// Stored bytes, sampled at about 100 points of the trace: (trace seconds, bytes).
    pub stored_over_time: Vec<(f64, u64)>,
    /// GPU seconds spent serving (prefills and loads), summed over the GPUs.
    pub busy_s: f64,
}

impl Report {
    /// Block hits ÷ block references.
    pub fn hit_rate(&self) -> f64 {
        let refs: usize = self.served.iter().map(|s| s.blocks).sum();
        self.served.iter().map(|s| s.hits).sum::<usize>() as f64 / refs.max(1) as f64
    }

    /// TTFTs in ms, sorted.
    pub fn ttfts_ms(&self) -> Vec<f64> {
        let mut t: Vec<f64> = self.served.iter().map(|s| s.ttft_s * 1e3).collect();
        t.sort_by(f64::total_cmp);
        t
    }

    /// Mean TTFT, ms.
    pub fn mean_ttft_ms(&self) -> f64 {
        self.served.iter().map(|s| s.ttft_s * 1e3).sum::<f64>() / self.served.len().max(1) as f64
    }

    /// Mean time loading a request's hits, ms (requests without hits count 0).
    pub fn mean_load_ms(&self) -> f64 {
        self.served.iter().map(|s| s.load_s * 1e3).sum::<f64>() / self.served.len().max(1) as f64
    }

    /// Load times in ms of the requests that hit, sorted.
    pub fn load_ms_of_hits(&self) -> Vec<f64> {
        let mut t: Vec<f64> = self.served.iter().filter(|s| s.hits > 0).map(|s| s.load_s * 1e3).collect();
        t.sort_by(f64::total_cmp);
        t
    }

    /// Requests per second the GPUs could serve if kept busy: requests ÷ GPU seconds, times the
    /// GPUs.
    pub fn throughput(&self, gpus: usize) -> f64 {
        self.served.len() as f64 / self.busy_s.max(1e-12) * gpus as f64
    }

    /// Mean quality.
    pub fn mean_quality(&self) -> f64 {
        self.served.iter().map(|s| s.quality).sum::<f64>() / self.served.len().max(1) as f64
    }

    /// Share of requests served below quality 0.9.
    pub fn below_09(&self) -> f64 {
        self.served.iter().filter(|s| s.quality < 0.9).count() as f64 / self.served.len().max(1) as f64
    }
}

/// The `p`-quantile of sorted values.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0.0)
}

/// Replays `trace` through `cache`.
pub fn replay(
    trace: &Trace,
    cache: &mut dyn Cache,
    settings: &Settings,
    progress: &ProgressBar,
) -> anyhow::Result<Report> {
    let mut report = Report::default();
    // When each GPU is next free; a request goes to the one free first.
    let mut gpu_free = vec![0.0f64; settings.gpus.max(1)];
    let duration = trace.duration_s().max(1e-9);
    let mut next_sample = 0usize;
    let mut group_ttl = match settings.ttl {
        TtlSpec::Group { budget_bytes, config, known: false } => Some(TtlLearner::new(budget_bytes, config)),
        TtlSpec::Group { budget_bytes, config, known: true } => {
            Some(super::ttl::known(trace, settings.time_scale, settings.stored_block_bytes, budget_bytes, config))
        }
        TtlSpec::None | TtlSpec::Single(_) => None,
    };
    for r in &trace.requests {
        let now_ms = (r.timestamp_ms as f64 / settings.time_scale) as u64;
        let arrival = now_ms as f64 / 1e3;
        let lookup = cache.lookup(now_ms, &r.blocks)?;
        let n = r.blocks.len();
        let hit_tokens: u64 = (0..lookup.hits).map(|i| block_tokens(i, n, r.input_tokens)).sum();
        let prefill = settings.gpu.prefill_s(&settings.model, r.input_tokens.saturating_sub(hit_tokens));
        let service = prefill + lookup.load_s;
        let (gpu, free) =
            gpu_free.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).map_or((0, 0.0), |(i, &f)| (i, f));
        let start = arrival.max(free);
        report.busy_s += service;
        if let Some(f) = gpu_free.get_mut(gpu) {
            *f = start + service;
        }
        let context = trace.context(r);
        let level = sensitivity(context);
        let mut weighted = 0.0;
        for i in 0..n {
            let tokens = block_tokens(i, n, r.input_tokens) as f64;
            let q = match lookup.hit_codec.get(i) {
                Some(&c) => settings.codecs.get(c).map_or(1.0, |f| f.quality[level]),
                None => 1.0,
            };
            weighted += q * tokens;
        }
        let quality = if r.input_tokens == 0 { 1.0 } else { weighted / r.input_tokens.max(1) as f64 };
        report.served.push(Served {
            arrival_s: arrival,
            ttft_s: start - arrival + service,
            blocks: n,
            hits: lookup.hits,
            quality: quality.min(1.0),
            load_s: lookup.load_s,
        });
        // Group TTL groups a request's blocks, its share of the system prompt included, under the
        // request's context: a TTL counts from the put, so the prompt's blocks live as long as the
        // TTL of whichever request stored them says, and group TTL learns that.
        let ttl_ms = match (settings.ttl, group_ttl.as_mut()) {
            (TtlSpec::Single(secs), _) => Some(u64::from(secs) * 1000),
            (TtlSpec::Group { .. }, Some(g)) => {
                for &block in &r.blocks {
                    g.record(now_ms, block, context, settings.stored_block_bytes);
                }
                g.ttl_ms(now_ms, context)
            }
            _ => None,
        };
        // Placement's contexts: the shared prefix's blocks are stored as one batch of its own
        // context, then the request's; a context with nothing to store still counts the request
        // as an access.
        for (group, run) in trace.contexts_of(r) {
            let computed = r.blocks.get(run.start.max(lookup.hits)..run.end).unwrap_or_default();
            cache.store(now_ms, computed, group, ttl_ms)?;
        }
        let at = (r.timestamp_ms as f64 / 1e3 / duration * 100.0) as usize;
        if at >= next_sample {
            report.stored_over_time.push((arrival, cache.stats().stored_bytes));
            next_sample = at + 1;
        }
        progress.inc(1);
    }
    report.cache = cache.stats();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::super::cache::bounds::Unbounded;
    use super::*;

    #[test]
    fn hits_queueing_and_prefill_are_as_computed_by_hand() {
        let trace = Trace::parse(
            "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 2]}\n\
             {\"timestamp\": 0, \"input_length\": 1536, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}\n\
             {\"timestamp\": 1000, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [9]}\n",
        )
        .expect("trace");
        let model = Profile::named("llama-3.1-8b").expect("model");
        let gpu = Gpu::default();
        let settings = Settings {
            model,
            gpu,
            gpus: 1,
            time_scale: 1.0,
            codecs: vec![CodecFacts::raw()],
            ttl: TtlSpec::None,
            stored_block_bytes: 1,
        };
        let report = replay(&trace, &mut Unbounded::default(), &settings, &ProgressBar::hidden()).expect("replays");
        let per_token = gpu.prefill_s(&model, 1);
        // Request 1 prefills 1024 tokens; request 2 waits for it, then prefills the 512 new ones.
        let ttft: Vec<f64> = report.served.iter().map(|s| s.ttft_s).collect();
        assert!((ttft[0] - 1024.0 * per_token).abs() < 1e-9);
        assert!((ttft[1] - (1024.0 + 512.0) * per_token).abs() < 1e-9);
        assert!((ttft[2] - 512.0 * per_token).abs() < 1e-9, "the GPU was free by then");
        assert_eq!(report.served.iter().map(|s| s.hits).collect::<Vec<_>>(), vec![0, 2, 0]);
        assert!((report.hit_rate() - 2.0 / 6.0).abs() < 1e-12);
        assert_eq!(report.mean_quality(), 1.0);

        // Two GPUs: request 2 starts at once on the second.
        let two = Settings { gpus: 2, ..settings };
        let report = replay(&trace, &mut Unbounded::default(), &two, &ProgressBar::hidden()).expect("replays");
        assert!((report.served[1].ttft_s - 512.0 * per_token).abs() < 1e-9);
    }
}
