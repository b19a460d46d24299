//! What every replay shares, whoever runs it (`kvhoard replay`, `kvhoard plan capacity`): the
//! trace, the served model and GPUs, and what the simulator charges for loads, from flags,
//! measurements, or defaults for a serving node.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use kvhoard_engine::StoreOptions;
use serde_json::Value;

use super::engine;
use super::model::{block_bytes, Gpu, Profile};
use super::run::Settings;
use super::sim::Bandwidths;
use super::trace::Trace;

/// The flags describing the serving side of a replay: model, GPUs, the speeds loads are
/// charged at, and which part of the trace to replay how fast.
#[derive(Debug, Clone, clap::Args)]
pub struct ServingArgs {
    /// The served model: llama-3.1-8b or llama-3.1-70b.
    #[arg(long, default_value = "llama-3.1-8b", value_name = "NAME")]
    pub model: String,
    /// KV bytes per token, for another KV geometry than the model's (an fp8 cache: half); a
    /// multiple of the bytes one KV head takes across the model's layers.
    #[arg(long, value_name = "BYTES")]
    pub bytes_per_token: Option<u64>,
    /// GPU dense bf16 peak in TFLOPS (H100 SXM: 989).
    #[arg(long, default_value_t = 989.0, value_name = "TFLOPS")]
    pub gpu_tflops: f64,
    /// Fraction of the GPU's peak a prefill sustains.
    #[arg(long, default_value_t = 0.5, value_name = "F")]
    pub mfu: f64,
    /// GPUs serving prefills; a request waits for the first one free. The shared trace needs
    /// about 1.3 GPUs of prefill without a cache (8B model at the default MFU).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub gpus: usize,
    /// DRAM tier bandwidth the simulator charges, GB/s [default: from --measured, else measured
    /// on DIR with --compare, else 20: host memory to GPU over PCIe 4 x16].
    #[arg(long, value_name = "GBPS")]
    pub dram_gbps: Option<f64>,
    /// Log read bandwidth the simulator charges, GB/s [default: from --measured, else measured on
    /// DIR with --compare, else 6: one PCIe 4 NVMe drive's sequential reads].
    #[arg(long, value_name = "GBPS")]
    pub ssd_gbps: Option<f64>,
    /// `kvhoard bench DIR --json` outputs (one object per line, or an array) to take the
    /// simulator's bandwidths from: get_mbps of a `"tier": "ssd"` run and of a `"tier": "dram"`
    /// run.
    #[arg(long, value_name = "FILE")]
    pub measured: Option<PathBuf>,
    /// Cores decoding compressed hits in parallel [default: this machine's].
    #[arg(long, value_name = "N")]
    pub decode_cores: Option<f64>,
    /// Replay only the first N requests.
    #[arg(long, value_name = "N")]
    pub requests: Option<usize>,
    /// Speed arrivals up by this factor.
    #[arg(long, default_value_t = 1.0, value_name = "F")]
    pub time_scale: f64,
    /// Charge every codec's decode at this many GB/s per core instead of measuring it when the
    /// replay starts: replays that decide by decode speed (planner) then repeat exactly.
    #[arg(long, value_name = "GBPS")]
    pub codec_gbps: Option<f64>,
}

/// Largest tier a replay models, as a multiple of the trace's distinct bytes.
pub const TIER_FRACTION_MAX: f64 = 1000.0;

/// Most serving GPUs a replay models (each is a queue the replay keeps).
const GPUS_MAX: usize = 4096;

impl ServingArgs {
    /// Checks every number the flags give, naming the flag that is out of range.
    fn check(&self) -> anyhow::Result<()> {
        let ranges = [
            ("--time-scale", Some(self.time_scale), 1e-6, 1e6, "a factor"),
            ("--mfu", Some(self.mfu), 1e-6, 1.0, "a fraction of the GPU's peak"),
            ("--gpu-tflops", Some(self.gpu_tflops), 1e-3, 1e6, "TFLOPS"),
            ("--dram-gbps", self.dram_gbps, 1e-6, 1e6, "GB/s"),
            ("--ssd-gbps", self.ssd_gbps, 1e-6, 1e6, "GB/s"),
            ("--codec-gbps", self.codec_gbps, 1e-6, 1e6, "GB/s"),
            ("--decode-cores", self.decode_cores, 1.0, 1e6, "cores"),
        ];
        for (flag, value, min, max, unit) in ranges {
            if let Some(v) = value.filter(|v| !(min..=max).contains(v)) {
                bail!("{flag} is {v:?}: give {unit} between {min:?} and {max:?}");
            }
        }
        if !(1..=GPUS_MAX).contains(&self.gpus) {
            bail!("--gpus is {}: give between 1 and {GPUS_MAX}", self.gpus);
        }
        if self.requests == Some(0) {
            bail!("--requests must be at least 1");
        }
        Ok(())
    }
}

/// Everything a replay needs besides a policy and tier sizes.
pub struct Setup {
    /// The (possibly sliced) trace.
    pub trace: Trace,
    /// The served model.
    pub model: Profile,
    /// One serving GPU.
    pub gpu: Gpu,
    /// Serving GPUs.
    pub gpus: usize,
    /// Arrivals sped up by this factor.
    pub time_scale: f64,
    /// Bytes of one trace block at the model's size.
    pub raw_block: u64,
    /// What the simulator charges loads.
    pub bandwidths: Bandwidths,
    /// I/O options for real-engine replays.
    pub store: StoreOptions,
    /// Decode speed every codec is charged at, bytes per second per core, when pinned.
    pub codec_bps: Option<f64>,
}

impl Setup {
    /// Reads the trace and resolves the flags; `calibrate_on` (a directory on the disk under
    /// test) measures the bandwidths there when no flag or file gives them.
    pub fn new(
        trace: &Path,
        args: &ServingArgs,
        store: StoreOptions,
        calibrate_on: Option<(&Path, u64)>,
    ) -> anyhow::Result<Setup> {
        args.check()?;
        let mut trace = Trace::read(trace)?;
        if let Some(n) = args.requests {
            trace = trace.slice(n);
        }
        let mut model = Profile::named(&args.model)?;
        if let Some(bytes) = args.bytes_per_token {
            model = model.with_bytes_per_token(bytes)?;
        }
        let bandwidths = bandwidths(args, model, &store, calibrate_on)?;
        Ok(Setup {
            trace,
            model,
            gpu: Gpu { peak_flops: args.gpu_tflops * 1e12, mfu: args.mfu },
            gpus: args.gpus,
            time_scale: args.time_scale,
            codec_bps: args.codec_gbps.map(|g| g * 1e9),
            raw_block: block_bytes(&model, 1),
            bandwidths,
            store,
        })
    }

    /// Bytes of every distinct block of the trace, at the model's size.
    pub fn distinct_bytes(&self) -> u64 {
        self.trace.distinct_blocks() * self.raw_block
    }

    /// A tier size: `bytes` if given (flag `--{tier}`), else `fraction` of the distinct bytes
    /// (flag `--{tier}-fraction`). At most [`TIER_FRACTION_MAX`] times the distinct bytes: a
    /// tier that holds everything already behaves the same larger, and a simulated volume of
    /// exabytes would be built segment by segment.
    pub fn size(
        &self,
        tier: &str,
        bytes: Option<u64>,
        fraction: Option<f64>,
        default_fraction: f64,
    ) -> anyhow::Result<u64> {
        let f = fraction.unwrap_or(default_fraction);
        if !(0.0..=TIER_FRACTION_MAX).contains(&f) {
            bail!(
                "--{tier}-fraction is {f:?}: give between 0 and {TIER_FRACTION_MAX} (times the trace's distinct bytes)"
            );
        }
        let most = (self.distinct_bytes() as f64 * TIER_FRACTION_MAX) as u64;
        match bytes {
            Some(b) if b > most => bail!(
                "--{tier} is {b} bytes, more than {TIER_FRACTION_MAX} times the {} distinct bytes of the trace: give at most {most}",
                self.distinct_bytes()
            ),
            Some(b) => Ok(b),
            None => Ok((self.distinct_bytes() as f64 * f) as u64),
        }
    }

    /// The facts of the codecs `policy` stores with: measured, and their decode speed pinned
    /// where `--codec-gbps` says.
    pub fn codecs(&self, policy: &super::PolicySpec) -> anyhow::Result<Vec<super::model::CodecFacts>> {
        let mut facts = policy.codecs()?;
        if let Some(bps) = self.codec_bps {
            for f in facts.iter_mut().filter(|f| f.spec.is_some()) {
                f.decode_bps = bps;
            }
        }
        Ok(facts)
    }

    /// The replay loop's settings for codecs `codecs`.
    pub fn settings(&self, codecs: Vec<super::model::CodecFacts>, ttl: super::ttl::TtlSpec) -> Settings {
        let ratio = codecs.last().map_or(1.0, |c| c.ratio);
        let stored_block_bytes = (self.raw_block as f64 * ratio).ceil() as u64;
        Settings {
            model: self.model,
            gpu: self.gpu,
            gpus: self.gpus,
            time_scale: self.time_scale,
            codecs,
            ttl,
            stored_block_bytes,
        }
    }
}

/// What the simulator charges loads: flags first, then `--measured`, then a measurement on the
/// calibration directory, then defaults for a serving node (one PCIe 4 NVMe drive, PCIe 4 x16
/// host-to-GPU copies).
fn bandwidths(
    args: &ServingArgs,
    model: Profile,
    store: &StoreOptions,
    calibrate_on: Option<(&Path, u64)>,
) -> anyhow::Result<Bandwidths> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
    let mut bw = Bandwidths {
        dram_bps: super::planning::DEFAULT_DRAM_GBPS * 1e9,
        ssd_bps: super::planning::DEFAULT_SSD_GBPS * 1e9,
        decode_cores: cores,
    };
    if let Some(path) = &args.measured {
        let (ssd, dram) = measured_bandwidths(path)?;
        bw.ssd_bps = ssd.unwrap_or(bw.ssd_bps);
        bw.dram_bps = dram.unwrap_or(bw.dram_bps);
    } else if let Some((dir, scale)) = calibrate_on {
        if args.ssd_gbps.is_none() || args.dram_gbps.is_none() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            bw = engine::calibrate(dir, model, scale, store)?;
        }
    }
    if let Some(gbps) = args.ssd_gbps {
        bw.ssd_bps = gbps * 1e9;
    }
    if let Some(gbps) = args.dram_gbps {
        bw.dram_bps = gbps * 1e9;
    }
    if let Some(cores) = args.decode_cores {
        bw.decode_cores = cores;
    }
    for (what, bps) in [("SSD", bw.ssd_bps), ("DRAM", bw.dram_bps)] {
        if !(bps.is_finite() && bps > 0.0) {
            bail!(
                "the {what} bandwidth is {bps} bytes a second; it must be positive (check --measured and --{}-gbps)",
                what.to_lowercase()
            );
        }
    }
    Ok(bw)
}

/// The log and DRAM-tier get bandwidths (bytes/s) in `kvhoard bench --json` output.
fn measured_bandwidths(path: &Path) -> anyhow::Result<(Option<f64>, Option<f64>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let values: Vec<Value> = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(items)) => items,
        Ok(one) => vec![one],
        Err(_) => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    let mut found = (None, None);
    for v in &values {
        let Some(mbps) = v.get("get_mbps").and_then(Value::as_f64) else { continue };
        match v.get("tier").and_then(Value::as_str) {
            Some("ssd") => found.0 = Some(mbps * 1e6),
            Some("dram") => found.1 = Some(mbps * 1e6),
            _ => {}
        }
    }
    if found == (None, None) {
        bail!("{}: no `kvhoard bench --json` result with get_mbps and tier \"ssd\" or \"dram\"", path.display());
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_output_gives_the_bandwidths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bench.json");
        std::fs::write(&path, "{\"tier\": \"ssd\", \"get_mbps\": 1500.0}\n{\"tier\": \"dram\", \"get_mbps\": 9000}\n")
            .expect("write");
        assert_eq!(measured_bandwidths(&path).expect("reads"), (Some(1.5e9), Some(9e9)));
        std::fs::write(&path, "[{\"tier\": \"ssd\", \"get_mbps\": 700}]").expect("write");
        assert_eq!(measured_bandwidths(&path).expect("reads"), (Some(7e8), None));
        std::fs::write(&path, "{\"put_mbps\": 1}").expect("write");
        assert!(format!("{:#}", measured_bandwidths(&path).unwrap_err()).contains("no `kvhoard bench --json` result"));
        std::fs::write(&path, "{\"tier\": \"ssd\", \"get_mbps\": 1}\nnot json\n").expect("write");
        assert!(format!("{:#}", measured_bandwidths(&path).unwrap_err()).contains("line 2"));
    }
}
