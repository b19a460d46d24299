//! What a replay assumes about the model being served and the GPU serving it: KV bytes per token,
//! prefill speed, how long a request waits, and what quality a compressed hit delivers. Every
//! constant is stated here with where it comes from; docs/replay.md explains the model.

use std::time::Instant;

use anyhow::{bail, Context};
use kvhoard_kernels::synth::Synth;
use kvhoard_kernels::{quality, Block, Codec, CodecSpec, CpuCodec};

use super::trace::BLOCK_TOKENS;

/// A served model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    /// Name.
    pub name: &'static str,
    /// Transformer layers.
    pub layers: u64,
    /// KV heads per layer.
    pub kv_heads: u64,
    /// Dimension per head.
    pub head_dim: u64,
    /// Parameters (for the prefill FLOPs).
    pub params: f64,
}

/// Models whose KV geometry and size are public (their config.json).
pub const PROFILES: [Profile; 2] = [
    Profile { name: "llama-3.1-8b", layers: 32, kv_heads: 8, head_dim: 128, params: 8.03e9 },
    Profile { name: "llama-3.1-70b", layers: 80, kv_heads: 8, head_dim: 128, params: 70.6e9 },
];

impl Profile {
    /// The built-in profile named `name`.
    pub fn named(name: &str) -> anyhow::Result<Profile> {
        PROFILES.iter().find(|p| p.name == name).copied().with_context(|| {
            let names: Vec<&str> = PROFILES.iter().map(|p| p.name).collect();
            format!("unknown model {name:?}; built in: {}", names.join(", "))
        })
    }

    /// KV bytes per token in bf16: K and V, every layer, every KV head.
    pub fn bytes_per_token(&self) -> u64 {
        2 * self.layers * self.kv_heads * self.head_dim * 2
    }

    /// This model with `bytes` of KV per token (another KV geometry: a different head count, or
    /// an fp8 cache): the layers and head size stay, the KV heads follow; prefill cost unchanged.
    pub fn with_bytes_per_token(self, bytes: u64) -> anyhow::Result<Profile> {
        let per_head = 2 * self.layers * self.head_dim * 2;
        if bytes == 0 || !bytes.is_multiple_of(per_head) {
            bail!(
                "--bytes-per-token {bytes} must be a positive multiple of {per_head} ({}: K and V of {} layers × {} dims × 2 bytes per KV head)",
                self.name,
                self.layers,
                self.head_dim
            );
        }
        Ok(Profile { kv_heads: bytes / per_head, ..self })
    }
}

/// The serving GPU, for the time a prefill takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpu {
    /// Dense bf16 peak, FLOP/s (H100 SXM: 989 TFLOPS, NVIDIA's data sheet).
    pub peak_flops: f64,
    /// Fraction of the peak a prefill sustains (model FLOPs utilisation). 0.5 is a typical
    /// figure for long prefills in vLLM and SGLang; it is an assumption, settable.
    pub mfu: f64,
}

impl Default for Gpu {
    fn default() -> Self {
        Gpu { peak_flops: 989e12, mfu: 0.5 }
    }
}

impl Gpu {
    /// Seconds to prefill `tokens` tokens of `model`: 2 FLOPs per parameter per token (the
    /// forward pass's matrix products; attention's quadratic term is left out, which flatters
    /// long prompts the same for every policy).
    pub fn prefill_s(&self, model: &Profile, tokens: u64) -> f64 {
        2.0 * model.params * tokens as f64 / (self.peak_flops * self.mfu)
    }
}

/// How sensitive a context is to compression: 0 (tolerant) to 3 (sensitive), drawn from its
/// first block id. The synthetic generator expresses it as outlier key channels and attention
/// concentration (fewer heavy hitters: more attention on each), which raise a lossy codec's
/// attention error.
pub const SENSITIVITY_LEVELS: usize = 4;

/// The sensitivity of the context that starts with block `first`.
pub fn sensitivity(first: u64) -> usize {
    (kvhoard_kernels::rng::mix(first, 0x5e75, 0, 7) % SENSITIVITY_LEVELS as u64) as usize
}

/// Sets the generator's knobs for a sensitivity level: more outlier key channels and fewer heavy
/// hitters as the level rises.
fn tune(mut s: Synth, level: usize) -> Synth {
    let level = level.min(SENSITIVITY_LEVELS - 1);
    s.outlier_channels = [0, 4, 8, 16][level];
    s.heavy_hitters = [0.05, 0.02, 0.01, 0.005][level];
    s
}

/// The generator configured for a sensitivity level.
fn synth_at(level: usize, seed: u64) -> Synth {
    tune(Synth::new(2, 256, 8, 128, seed), level)
}

/// Quality in [0, 1] of a block served with attention-output error `e` (measured with the
/// generator's own queries): the kernels' one calibration.
pub use kvhoard_kernels::quality::quality_of_error;

/// What a codec does to blocks, measured on generated blocks when the replay starts.
#[derive(Debug, Clone, PartialEq)]
pub struct CodecFacts {
    /// The codec (`None`: stored raw).
    pub spec: Option<CodecSpec>,
    /// Stored bytes ÷ original bytes.
    pub ratio: f64,
    /// Decode speed on one core, bytes of original per second (infinite for raw).
    pub decode_bps: f64,
    /// Quality of a block served by this codec, per sensitivity level: what the replay scores
    /// (attention error on the generator's own queries).
    pub quality: [f64; SENSITIVITY_LEVELS],
    /// The same from probes derived from the block's own keys: what a planner may see.
    pub estimate: [f64; SENSITIVITY_LEVELS],
}

impl CodecFacts {
    /// Raw storage: nothing lost, nothing to decode.
    pub fn raw() -> CodecFacts {
        CodecFacts {
            spec: None,
            ratio: 1.0,
            decode_bps: f64::INFINITY,
            quality: [1.0; SENSITIVITY_LEVELS],
            estimate: [1.0; SENSITIVITY_LEVELS],
        }
    }

    /// Measures `spec` on one generated 2 MiB block per sensitivity level.
    ///
    /// The planner's estimate is the attention error on probes derived from the block's own keys
    /// (what a store can compute), calibrated: probes exaggerate the error the model's queries
    /// see, by a factor measured once per codec on other generated blocks (other seeds, every
    /// level), where both are known. Quality and estimate then share one scale.
    pub fn measure(spec: CodecSpec) -> anyhow::Result<CodecFacts> {
        if spec.drops_tokens() {
            bail!("{spec} drops tokens; a replay serves whole blocks (lm://, RESP, plugins)");
        }
        let mut quality = [1.0; SENSITIVITY_LEVELS];
        let mut estimate = [1.0; SENSITIVITY_LEVELS];
        let mut ratio = 0.0;
        let mut decode_bps = 0.0;
        let mut probe_errors = [0.0; SENSITIVITY_LEVELS];
        let (mut calibration_probes, mut calibration_queries) = (0.0, 0.0);
        for level in 0..SENSITIVITY_LEVELS {
            let t = Trial::run(spec, level, 11 + level as u64)?;
            let c = Trial::run(spec, level, 1011 + level as u64)?;
            calibration_probes += c.probe_error;
            calibration_queries += c.query_error;
            ratio += t.ratio;
            decode_bps += t.decode_bps;
            if spec.is_lossy() {
                quality[level] = quality_of_error(t.query_error);
                probe_errors[level] = t.probe_error;
            }
        }
        if spec.is_lossy() {
            let factor = if calibration_queries > 0.0 { calibration_probes / calibration_queries } else { 1.0 };
            for (e, p) in estimate.iter_mut().zip(probe_errors) {
                *e = quality_of_error(p / factor.max(1e-12));
            }
        }
        let n = SENSITIVITY_LEVELS as f64;
        Ok(CodecFacts { spec: Some(spec), ratio: ratio / n, decode_bps: decode_bps / n, quality, estimate })
    }
}

/// Decodes timed per trial; the fastest counts.
const DECODE_ROUNDS: u32 = 9;

/// One codec on one generated block.
struct Trial {
    ratio: f64,
    decode_bps: f64,
    /// Attention error on the generator's queries.
    query_error: f64,
    /// Attention error on probes derived from the keys.
    probe_error: f64,
}

impl Trial {
    fn run(spec: CodecSpec, level: usize, seed: u64) -> anyhow::Result<Trial> {
        let synth = synth_at(level, seed);
        let data = synth.generate();
        let queries = synth.queries(8, 4);
        let mut codec = CpuCodec::new(spec)?;
        let mut payload = vec![0u8; codec.max_payload_size(&synth.desc)];
        let c = codec.compress(&Block { shape: synth.desc, data: &data, queries: Some(&queries) }, &mut payload)?;
        let mut out = vec![0u8; kvhoard_kernels::decoded_size(&c.params, &c.shape)];
        // The fastest of several decodes: the one least disturbed by whatever else the machine
        // runs. A mean of three moved the planner's delays, and so its decisions, by several
        // percent from one replay to the next.
        let mut secs = f64::INFINITY;
        let mut decoded = None;
        for _ in 0..DECODE_ROUNDS {
            let started = Instant::now();
            decoded = Some(codec.decompress(&c.params, &c.shape, &payload[..c.len], &mut out)?);
            secs = secs.min(started.elapsed().as_secs_f64());
        }
        let decoded = decoded.context("no decode")?;
        let with_queries = quality::estimate(&synth.desc, &data, &decoded, &out, Some(&queries))?;
        let with_probes = quality::estimate(&synth.desc, &data, &decoded, &out, None)?;
        Ok(Trial {
            ratio: (c.len + c.meta().params.len()) as f64 / data.len() as f64,
            decode_bps: data.len() as f64 / secs.max(1e-9),
            query_error: f64::from(with_queries.mean_error()),
            probe_error: f64::from(with_probes.mean_error()),
        })
    }
}

/// Bytes of one trace block (512 tokens) of `model`, divided by `scale`.
pub fn block_bytes(model: &Profile, scale: u64) -> u64 {
    BLOCK_TOKENS * model.bytes_per_token() / scale.max(1)
}

/// The generated block a replay stores for trace block `id`: `model`'s KV for 512 tokens,
/// scaled down by `scale` (fewer layer-tokens of the same width), deterministic in `id`.
pub fn block_of(model: &Profile, scale: u64, id: u64) -> anyhow::Result<Synth> {
    let layer_tokens = model.layers * BLOCK_TOKENS;
    if scale == 0 || !layer_tokens.is_multiple_of(scale) {
        bail!("--scale {scale} must divide {} (layers × 512 tokens of {})", layer_tokens, model.name);
    }
    let tokens = u32::try_from(layer_tokens / scale).context("--scale too small")?;
    Ok(tune(Synth::new(1, tokens, model.kv_heads as u32, model.head_dim as u32, id), sensitivity(id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_and_costs_are_what_they_say() {
        let m = Profile::named("llama-3.1-8b").expect("built in");
        assert_eq!(m.bytes_per_token(), 128 << 10, "128 KiB per token, as the trace's README says");
        assert_eq!(block_bytes(&m, 32), 2 << 20);
        let gpu = Gpu::default();
        // 8B on an H100 at 50 %: about 30,800 tokens per second.
        let tps = 1.0 / gpu.prefill_s(&m, 1);
        assert!((30_000.0..32_000.0).contains(&tps), "{tps}");
        assert!(Profile::named("gpt-9").is_err());
        assert!(block_of(&m, 7, 1).is_err());
        let fp8 = m.with_bytes_per_token(64 << 10).expect("half the heads");
        assert_eq!((fp8.kv_heads, fp8.bytes_per_token()), (4, 64 << 10));
        assert!(m.with_bytes_per_token(1000).is_err());
        let synth = block_of(&m, 128, 5).expect("scale 128");
        assert_eq!(synth.desc.raw_size() as u64, block_bytes(&m, 128));
    }

    #[test]
    fn lossless_keeps_quality_and_quantization_costs_some() {
        let lossless = CodecFacts::measure(CodecSpec::lossless(1)).expect("measures");
        assert_eq!(lossless.quality, [1.0; SENSITIVITY_LEVELS]);
        assert!(lossless.ratio < 0.8);
        let q4 = CodecFacts::measure(CodecSpec::quant(4, 32, 0)).expect("measures");
        assert!(q4.quality.iter().all(|q| *q < 1.0 && *q > 0.0), "{:?}", q4.quality);
        assert!(q4.estimate.iter().all(|q| *q < 1.0 && *q > 0.0), "{:?}", q4.estimate);
        // Calibrated, the estimate from probes tracks the quality within the spread of levels.
        let mean = |x: &[f64; SENSITIVITY_LEVELS]| x.iter().sum::<f64>() / SENSITIVITY_LEVELS as f64;
        assert!((mean(&q4.estimate) - mean(&q4.quality)).abs() < 0.15, "{:?} {:?}", q4.estimate, q4.quality);
        assert!(q4.ratio < 0.4);
    }
}
