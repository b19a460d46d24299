//! `kvhoard bench`: measures the engine on a fresh volume.
//!
//! - `throughput`: puts `--total` bytes in blocks of `--block-size` from `--threads` threads,
//!   then gets them all back (sequentially or in random order), with O_DIRECT so the page cache
//!   does not flatter the reads. Reports MB/s (10^6 bytes), latency percentiles and CPU seconds
//!   per GB moved. `--tier dram` serves the gets from a DRAM tier holding every block, copying
//!   each into the caller's buffer (what a client loading into its own memory does).
//!   `--compare-files` runs the same workload on one file per block, the simplest alternative.
//!   `put_mbps` counts until everything is durable (one synced barrier put after `written`
//!   puts); `put_acked_mbps` until the last put was acknowledged at `--durability`, which is
//!   what fio's O_DIRECT writes without a final fsync compare with. `--batch N` puts N blocks
//!   per call.
//! - `restart`: stores `--blocks` small blocks, then times opening the volume from its
//!   checkpoint and from its log alone, and reports the index's memory per block.
//! - `cleaning`: get latency while the background cleaner works against the same workload
//!   without it, alternated (`bench_cleaning.rs`).

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use indicatif::{ProgressBar, ProgressDrawTarget};
use kvhoard_engine::{CreateOptions, Durability, PutOptions, ReadOptions, Store, StoreOptions, VolumeFiles};
use kvhoard_kernels::rng::Rng;
use kvhoard_kernels::synth::Synth;
use serde_json::json;

use super::bench_common::{noise, percentile, round3, stamp};
use crate::size::human;

/// The flags of `bench DIR`, as parsed; [`BenchArgs::new`] settles the defaults that depend on
/// others and adds the global flags.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchFlags {
    /// What to measure.
    #[arg(long, value_enum, default_value = "throughput")]
    pub workload: Workload,
    /// Size of each block [default: 2MiB for throughput, 8 bytes for restart].
    #[arg(long, value_parser = crate::size::parse_size, value_name = "SIZE")]
    pub block_size: Option<u64>,
    /// Bytes to put and get (throughput).
    #[arg(long, value_parser = crate::size::parse_size, default_value = "1GiB", value_name = "SIZE")]
    pub total: u64,
    /// Client threads.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub threads: usize,
    /// Blocks per put call (`put_batch`: one reservation, writes in flight together, one
    /// group commit), as LMCache's batched adapters store.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub batch: usize,
    /// Blocks per get call (throughput, ssd tier): above 1, `get_batch`, whose reads are all in
    /// flight at once, as the plugins' batched loads read.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub get_batch: usize,
    /// Durability of the puts (see put).
    #[arg(long, default_value = "written", value_parser = crate::flags::parse_durability, value_name = "LEVEL")]
    pub durability: Durability,
    /// Order of the gets.
    #[arg(long, default_value = "seq", value_parser = ["seq", "random"], value_name = "PATTERN")]
    pub read_pattern: String,
    /// Tier the gets are served from: ssd (the log, DRAM tier off, page cache bypassed) or
    /// dram (a DRAM tier holding every block; gets copy into the caller's buffer).
    #[arg(long, value_enum, default_value = "ssd")]
    pub tier: Tier,
    /// Also run the same puts and gets on one file per block in DIR (O_DIRECT, as the
    /// engine), the simplest alternative, and report the ratios.
    #[arg(long)]
    pub compare_files: bool,
    /// Also measure the disk itself with fio (throughput), just before and just after, on the
    /// same directory (one job, io_uring, queue depth 32, O_DIRECT, the same block size and
    /// bytes; random reads with `--read-pattern random`), and report the engine's ratios to it:
    /// acknowledged puts against fio's writes, puts with their final sync against fio's writes
    /// with a final fdatasync, gets against fio's reads. Needs fio, and room in DIR for --total
    /// bytes more.
    #[arg(long)]
    pub compare_disk: bool,
    /// Number of blocks (restart).
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pub blocks: u64,
    /// Phases per volume, alternated (cleaning).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub rounds: usize,
    /// MB/s the writer puts at while gets are timed (cleaning): the same for both volumes.
    #[arg(long, default_value_t = 100.0, value_name = "MBPS")]
    pub put_mbps: f64,
    /// Also store each hot block under N more keys (cleaning), as copies of one value are: the
    /// store links them to the same bytes, and a cleaner that relocates such a block writes
    /// the copies' links again after it (or, past 1,024 in one cleaning, a checkpoint) before it
    /// frees the segment: a crash must not leave the copies naming nothing. Measures what that
    /// costs the puts.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub copies: u32,
    /// Store the blocks with this codec (throughput): the blocks are then synthetic KV caches
    /// (bf16, 256 tokens of 8 heads × 128 channels per layer, one layer per MiB) that codecs can
    /// compress, instead of random bytes; MB/s count the original bytes, `stored_ratio` is
    /// stored ÷ original.
    #[arg(long, value_parser = crate::flags::parse_codec, value_name = "SPEC")]
    pub codec: Option<kvhoard_engine::CodecSpec>,
    /// Bytes of unused record buffers the engine keeps for reuse (0 disables the pool).
    #[arg(long, value_parser = crate::size::parse_size, default_value = "256MiB", value_name = "SIZE")]
    pub buffer_pool: u64,
    /// Keep the volume afterwards.
    #[arg(long)]
    pub keep: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The benchmark's settings, validated.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    pub workload: Workload,
    pub block_size: u64,
    pub total: u64,
    pub threads: usize,
    pub batch: usize,
    pub get_batch: usize,
    pub durability: Durability,
    pub random_reads: bool,
    pub tier: Tier,
    pub compare_files: bool,
    pub compare_disk: bool,
    pub blocks: u64,
    pub rounds: usize,
    pub put_mbps: f64,
    pub copies: u32,
    pub keep: bool,
    pub json: bool,
    pub direct_io: bool,
    pub io_backend: kvhoard_engine::IoBackend,
    pub writer: kvhoard_engine::WriterConfig,
    pub clean_bytes_per_sec: u64,
    pub buffer_pool_bytes: usize,
    pub codec: Option<kvhoard_engine::CodecSpec>,
}

impl BenchArgs {
    /// The settings `flags` and the global flags ask for.
    pub fn new(flags: &BenchFlags, base: &StoreOptions) -> BenchArgs {
        BenchArgs {
            workload: flags.workload,
            block_size: flags.block_size.unwrap_or(match flags.workload {
                Workload::Throughput => 2 << 20,
                Workload::Restart => 8,
                Workload::Cleaning => 1 << 20,
            }),
            total: flags.total,
            threads: flags.threads,
            batch: flags.batch,
            get_batch: flags.get_batch,
            durability: flags.durability,
            random_reads: flags.read_pattern == "random",
            tier: flags.tier,
            compare_files: flags.compare_files,
            compare_disk: flags.compare_disk,
            blocks: flags.blocks,
            rounds: flags.rounds,
            put_mbps: flags.put_mbps,
            copies: flags.copies,
            keep: flags.keep,
            json: flags.json,
            direct_io: base.direct_io,
            io_backend: base.io_backend,
            writer: base.writer,
            clean_bytes_per_sec: base.clean_bytes_per_sec,
            buffer_pool_bytes: flags.buffer_pool as usize,
            codec: flags.codec,
        }
    }
}

/// Which tier serves the gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Tier {
    /// The log on the device.
    Ssd,
    /// The DRAM tier.
    Dram,
}

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Put and get throughput and latency.
    Throughput,
    /// Open time and index memory with many blocks, and (from about 500,000 blocks) how long a
    /// checkpoint's snapshot of the index holds puts waiting once they write keys again.
    Restart,
    /// Get latency with the background cleaner at work and without it, alternated: a tight
    /// volume of --total bytes against a roomy one, each with a hot set read by --threads
    /// readers while new blocks are put.
    Cleaning,
}

/// Most client threads, blocks per batch, bytes per block and bytes in all a benchmark takes:
/// past them a slip of a flag would exhaust memory or run for days rather than measure.
const THREADS_MAX: usize = 1024;
const BATCH_MAX: usize = 65_536;
const BLOCK_MAX: u64 = 1 << 30;
const TOTAL_MAX: u64 = 1 << 50;
const BLOCKS_MAX: u64 = 100_000_000;
const ROUNDS_MAX: usize = 1000;
const COPIES_MAX: u32 = 10_000;

impl BenchArgs {
    /// Every count and size in range, naming the flag that is not.
    fn check(&self) -> anyhow::Result<()> {
        let counts = [
            ("--threads", self.threads as u64, THREADS_MAX as u64),
            ("--batch", self.batch as u64, BATCH_MAX as u64),
            ("--get-batch", self.get_batch as u64, BATCH_MAX as u64),
            ("--block-size", self.block_size, BLOCK_MAX),
            ("--blocks", self.blocks, BLOCKS_MAX),
            ("--rounds", self.rounds as u64, ROUNDS_MAX as u64),
        ];
        for (flag, value, max) in counts {
            ensure!((1..=max).contains(&value), "{flag} is {value}: give between 1 and {max}");
        }
        ensure!(self.total <= TOTAL_MAX, "--total is {} bytes: give at most {TOTAL_MAX} (1 PiB)", self.total);
        ensure!(self.copies <= COPIES_MAX, "--copies is {}: give at most {COPIES_MAX}", self.copies);
        ensure!(
            self.put_mbps.is_finite() && self.put_mbps > 0.0,
            "--put-mbps is {:?}: give a rate above 0 MB/s",
            self.put_mbps
        );
        Ok(())
    }
}

pub fn run(dir: &Path, args: &BenchArgs) -> anyhow::Result<ExitCode> {
    args.check()?;
    ensure!(
        !VolumeFiles::of(dir).data.exists(),
        "{} already holds a volume; bench needs a fresh directory",
        dir.display()
    );
    let result = match args.workload {
        Workload::Throughput => throughput(dir, args),
        Workload::Restart => restart(dir, args),
        Workload::Cleaning => super::bench_cleaning::run(
            dir,
            &super::bench_cleaning::CleaningArgs {
                total: args.total,
                block_size: args.block_size,
                threads: args.threads,
                rounds: args.rounds,
                put_mbps: args.put_mbps,
                copies: args.copies,
                opts: StoreOptions {
                    direct_io: args.direct_io,
                    io_backend: args.io_backend,
                    buffer_pool_bytes: args.buffer_pool_bytes,
                    writer: args.writer,
                    clean_bytes_per_sec: args.clean_bytes_per_sec,
                    ..StoreOptions::default()
                },
            },
        ),
    };
    if !args.keep {
        for dir in [dir.join("roomy"), dir.join("tight"), dir.to_path_buf()] {
            let files = VolumeFiles::of(&dir);
            let _ = std::fs::remove_file(&files.data);
            if let Some(checkpoint) = &files.checkpoint {
                let _ = std::fs::remove_file(checkpoint);
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
    let report = result?;
    if args.json {
        println!("{report}");
    } else {
        print_human(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_human(report: &serde_json::Value) {
    if let Some(obj) = report.as_object() {
        let width = obj.keys().map(String::len).max().unwrap_or(0);
        for (k, v) in obj {
            println!("{k:<width$}  {v}");
        }
    }
}

fn bar(len: u64, show: bool) -> ProgressBar {
    ProgressBar::with_draw_target(
        Some(len),
        if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() },
    )
}

fn throughput(dir: &Path, a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    ensure!(a.total >= a.block_size, "--total must hold at least one --block-size");
    let count = a.total / a.block_size;
    // The disk first, on the empty directory, then again after the engine.
    let disk_before = if a.compare_disk {
        super::bench_disk::check_fio()?;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Some(super::bench_disk::measure(dir, a.block_size, count * a.block_size, a.random_reads, a.direct_io)?)
    } else {
        None
    };
    let record = a.block_size.div_ceil(4096) * 4096 + 4096;
    let segment = (record * 4).max(64 << 20).div_ceil(1 << 20) << 20;
    let capacity = (count * record) * 11 / 10 + 4 * segment;
    let opts = StoreOptions {
        direct_io: a.direct_io,
        io_backend: a.io_backend,
        buffer_pool_bytes: a.buffer_pool_bytes,
        writer: a.writer,
        dram_tier_bytes: if a.tier == Tier::Dram { capacity } else { 0 },
        ..StoreOptions::default()
    };
    let store =
        Store::create(dir, &CreateOptions { capacity_bytes: Some(capacity), segment_size_bytes: segment }, opts)
            .with_context(|| format!("cannot create the benchmark volume in {}", dir.display()))?;
    let show = !a.json && std::io::stderr().is_terminal();
    // With a codec: KV blocks a codec can compress, a few generated before the clock starts.
    let (desc, base) = match a.codec {
        Some(spec) => {
            const LAYER: u64 = 2 * 256 * 1024 * 2;
            ensure!(
                a.block_size.is_multiple_of(LAYER),
                "--codec needs --block-size a multiple of 1 MiB (a layer of 256 tokens × 1024 bf16 channels, K and V)"
            );
            let layers = u32::try_from(a.block_size / LAYER).context("--block-size is too large")?;
            store
                .set_policy("bench", kvhoard_engine::Policy { codec: Some(spec), lossy: true, ..Default::default() })?;
            let blocks: Vec<Vec<u8>> = (0..8).map(|seed| Synth::new(layers, 256, 8, 128, seed).generate()).collect();
            (Some(Synth::new(layers, 256, 8, 128, 0).desc.desc()), blocks)
        }
        None => (None, Vec::new()),
    };
    let put_opts = PutOptions { durability: a.durability, desc, ..PutOptions::default() };

    let progress = bar(count * 2, show);
    let cpu0 = cpu_seconds();
    // Each call puts `batch` consecutive blocks; latencies are per call.
    let calls = count.div_ceil(a.batch as u64);
    let (acked_time, put_lat) = parallel(calls, a.threads, |c, bufs: &mut Vec<Vec<u8>>| {
        let first = c * a.batch as u64;
        let ids: Vec<u64> = (first..(first + a.batch as u64).min(count)).collect();
        bufs.resize_with(ids.len(), Vec::new);
        for (buf, &i) in bufs.iter_mut().zip(&ids) {
            if buf.is_empty() {
                *buf = match base.get(i as usize % base.len().max(1)) {
                    Some(kv) => kv.clone(),
                    None => noise(i, a.block_size as usize),
                };
            }
            // Distinct bytes per block, so deduplication does not skip any write.
            stamp(buf, i);
        }
        let keys: Vec<String> = ids.iter().map(|i| format!("block-{i}")).collect();
        let items: Vec<(&str, &[u8])> = keys.iter().map(String::as_str).zip(bufs.iter().map(Vec::as_slice)).collect();
        store.put_batch("bench", &items, &put_opts)?;
        progress.inc(ids.len() as u64);
        Ok(())
    })?;
    // Until everything is durable: one synced barrier put after `written` or `buffered` puts.
    let barrier = Instant::now();
    if a.durability != Durability::Synced {
        store.put("bench", "barrier", b"", &PutOptions { durability: Durability::Synced, ..PutOptions::default() })?;
    }
    let put_time = acked_time + barrier.elapsed();
    let cpu1 = cpu_seconds();
    let order = read_order(count, a.random_reads);
    let hits = AtomicU64::new(0);
    let key_of = |i: u64| format!("block-{}", order.get(i as usize).copied().unwrap_or(i));
    let batched = a.get_batch > 1 && a.tier == Tier::Ssd;
    let (get_time, get_lat) = if batched {
        // Each call gets `get_batch` keys of the order; latencies are per call.
        let calls = count.div_ceil(a.get_batch as u64);
        parallel(calls, a.threads, |c, _: &mut ()| {
            let first = c * a.get_batch as u64;
            let keys: Vec<String> = (first..(first + a.get_batch as u64).min(count)).map(key_of).collect();
            let names: Vec<&str> = keys.iter().map(String::as_str).collect();
            let got = store.get_batch("bench", &names, ReadOptions::default())?;
            let found = got.iter().flatten().filter(|b| b.len() as u64 == a.block_size).count();
            hits.fetch_add(found as u64, Ordering::Relaxed);
            progress.inc(names.len() as u64);
            Ok(())
        })?
    } else {
        parallel(count, a.threads, |i, buf: &mut Vec<u8>| {
            let key = key_of(i);
            let len = match a.tier {
                Tier::Ssd => store.get("bench", &key, ReadOptions::default())?.map(|b| b.len()),
                Tier::Dram => {
                    buf.resize(a.block_size as usize, 0);
                    store.get_into("bench", &key, buf, ReadOptions::default())?.map(|(_, n)| n)
                }
            };
            if len.is_some_and(|n| n as u64 == a.block_size) {
                hits.fetch_add(1, Ordering::Relaxed);
            }
            progress.inc(1);
            Ok(())
        })?
    };
    let cpu2 = cpu_seconds();
    progress.finish_and_clear();
    let stats = store.stats();
    ensure!(
        hits.load(Ordering::Relaxed) == count,
        "only {} of {count} blocks read back ({} keys evicted, {} damaged blocks found)",
        hits.load(Ordering::Relaxed),
        stats.evicted_keys,
        stats.read_errors
    );
    if a.tier == Tier::Dram {
        let dram = stats.tiers.iter().find(|t| t.tier == "dram");
        ensure!(
            dram.is_some_and(|t| t.hits == count),
            "the DRAM tier served {} of {count} gets",
            dram.map_or(0, |t| t.hits)
        );
    }
    drop(store);
    let bench_ns = stats.namespaces.iter().find(|n| n.name == "bench");
    let stored_ratio = bench_ns.map_or(1.0, |n| n.stored_bytes as f64 / n.unique_bytes.max(1) as f64);
    let bytes = (count * a.block_size) as f64;
    let mbps = |d: Duration| bytes / d.as_secs_f64().max(1e-9) / 1e6;
    let gb = bytes / 1e9;
    let mut report = json!({
        "workload": "throughput",
        "block_size": a.block_size,
        "blocks": count,
        "threads": a.threads,
        "durability": format!("{:?}", a.durability).to_lowercase(),
        "read_pattern": if a.random_reads { "random" } else { "seq" },
        "device": stats.device_backend,
        "direct_io": stats.direct_io,
        "put_mbps": round1(mbps(put_time)),
        "put_acked_mbps": round1(mbps(acked_time)),
        "batch": a.batch,
        "get_batch": if batched { a.get_batch } else { 1 },
        "get_mbps": round1(mbps(get_time)),
        "put_p50_us": percentile(&put_lat, 50.0),
        "put_p99_us": percentile(&put_lat, 99.0),
        "get_p50_us": percentile(&get_lat, 50.0),
        "get_p99_us": percentile(&get_lat, 99.0),
        "put_cpu_seconds_per_gb": round3((cpu1 - cpu0) / gb),
        "get_cpu_seconds_per_gb": round3((cpu2 - cpu1) / gb),
        "cpu_seconds_per_gb": round3((cpu2 - cpu0) / (2.0 * gb)),
        "syncs": stats.syncs,
        "tier": if a.tier == Tier::Dram { "dram" } else { "ssd" },
        "get_mbps_per_thread": round1(mbps(get_time) / a.threads as f64),
        "codec": a.codec.map_or_else(|| "none (random bytes)".to_string(), |c| c.to_string()),
        "stored_ratio": round3(stored_ratio),
    });
    if let Some(before) = disk_before {
        let after = super::bench_disk::measure(dir, a.block_size, count * a.block_size, a.random_reads, a.direct_io)?;
        let write = (before.write_mbps + after.write_mbps) / 2.0;
        let synced = (before.write_synced_mbps + after.write_synced_mbps) / 2.0;
        let read = (before.read_mbps + after.read_mbps) / 2.0;
        if let Some(obj) = report.as_object_mut() {
            obj.insert(
                "disk".into(),
                json!({
                    "tool": "fio",
                    "iodepth": super::bench_disk::IODEPTH,
                    "read_pattern": if a.random_reads { "random" } else { "seq" },
                    "write_mbps_before": round1(before.write_mbps),
                    "write_mbps_after": round1(after.write_mbps),
                    "write_synced_mbps_before": round1(before.write_synced_mbps),
                    "write_synced_mbps_after": round1(after.write_synced_mbps),
                    "read_mbps_before": round1(before.read_mbps),
                    "read_mbps_after": round1(after.read_mbps),
                }),
            );
            obj.insert("put_acked_vs_disk".into(), json!(round3(mbps(acked_time) / write.max(1e-9))));
            obj.insert("put_vs_disk_synced".into(), json!(round3(mbps(put_time) / synced.max(1e-9))));
            obj.insert("get_vs_disk".into(), json!(round3(mbps(get_time) / read.max(1e-9))));
        }
    }
    if a.compare_files {
        let files = dir.join("files");
        let result = files::throughput(&files, count, a, &order);
        let _ = std::fs::remove_dir_all(&files);
        let (put, get) = result?;
        if let Some(obj) = report.as_object_mut() {
            obj.insert("files_put_mbps".into(), json!(round1(mbps(put))));
            obj.insert("files_get_mbps".into(), json!(round1(mbps(get))));
            obj.insert("put_vs_files".into(), json!(round3(put.as_secs_f64() / put_time.as_secs_f64().max(1e-9))));
            obj.insert("get_vs_files".into(), json!(round3(get.as_secs_f64() / get_time.as_secs_f64().max(1e-9))));
        }
    }
    Ok(report)
}

/// The simplest alternative: one file per block, as LMCache's local disk backend keeps them.
mod files {
    use std::fs::{File, OpenOptions};
    use std::io::{Read as _, Write as _};
    use std::os::unix::fs::OpenOptionsExt as _;
    use std::path::Path;
    use std::time::Duration;

    use anyhow::Context as _;
    use kvhoard_engine::{AlignedBuf, Durability};

    use super::{noise, parallel, stamp, BenchArgs};

    fn open(path: &Path, write: bool, direct: bool) -> std::io::Result<File> {
        let mut o = OpenOptions::new();
        if write {
            o.write(true).create(true).truncate(true);
        } else {
            o.read(true);
        }
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    }

    /// Puts and gets `count` blocks as files; returns the put and get wall times.
    pub fn throughput(dir: &Path, count: u64, a: &BenchArgs, order: &[u64]) -> anyhow::Result<(Duration, Duration)> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        // O_DIRECT needs whole sectors; other sizes go through the page cache.
        let direct = a.direct_io && a.block_size.is_multiple_of(4096);
        let (put, _) = parallel(count, a.threads, |i, scratch: &mut Option<AlignedBuf>| {
            let buf = scratch.get_or_insert_with(|| {
                let mut buf = AlignedBuf::zeroed(a.block_size as usize);
                buf.copy_from_slice(&noise(i, a.block_size as usize));
                buf
            });
            stamp(buf, i);
            let path = dir.join(format!("block-{i}"));
            let mut f = open(&path, true, direct).or_else(|_| open(&path, true, false))?;
            f.write_all(buf)?;
            if a.durability == Durability::Synced {
                f.sync_data()?;
            }
            Ok(())
        })?;
        let (get, _) = parallel(count, a.threads, |i, scratch: &mut Option<AlignedBuf>| {
            let buf = scratch.get_or_insert_with(|| AlignedBuf::zeroed(a.block_size as usize));
            let path = dir.join(format!("block-{}", order.get(i as usize).copied().unwrap_or(i)));
            let mut f = open(&path, false, direct).or_else(|_| open(&path, false, false))?;
            f.read_exact(buf)?;
            Ok(())
        })?;
        Ok((put, get))
    }
}

fn restart(dir: &Path, a: &BenchArgs) -> anyhow::Result<serde_json::Value> {
    let block_size = a.block_size.clamp(8, 1 << 20) as usize;
    let record = (block_size as u64).div_ceil(4096) * 4096 + 4096;
    let segment = 256u64 << 20;
    // Checkpoints come every 8 sealed segments. Where the blocks fill two such intervals, the
    // keys are written again at the end until two more were taken (below): room for that too.
    let interval = u64::from(StoreOptions::default().checkpoint_every_segments) * segment;
    let steady = a.blocks * record >= 2 * interval;
    let capacity = a.blocks * record * 11 / 10 + 4 * segment + if steady { 3 * interval } else { 0 };
    let opts = StoreOptions {
        direct_io: a.direct_io,
        io_backend: a.io_backend,
        buffer_pool_bytes: a.buffer_pool_bytes,
        writer: a.writer,
        ..StoreOptions::default()
    };
    let store = Store::create(
        dir,
        &CreateOptions { capacity_bytes: Some(capacity), segment_size_bytes: segment },
        opts.clone(),
    )?;
    let show = !a.json && std::io::stderr().is_terminal();
    let progress = bar(a.blocks, show);
    let started = Instant::now();
    let mut buf = noise(7, block_size);
    put_keys(&store, a.blocks, 0, &mut buf, |n| progress.inc(n))?;
    let fill = started.elapsed();
    progress.finish_and_clear();
    let stats = store.stats();
    ensure!(stats.keys == a.blocks, "stored {} of {} blocks (the volume evicted some)", stats.keys, a.blocks);
    store.close()?;
    drop(store);

    let t = Instant::now();
    let store = Store::open(dir, opts.clone())?;
    let from_checkpoint = t.elapsed();
    ensure!(store.stats().keys == a.blocks, "reopen from the checkpoint found {} keys", store.stats().keys);
    // Nothing changed since the checkpoint was loaded (a `kvhoard stat`): closing writes nothing.
    let t = Instant::now();
    store.close()?;
    let close_unchanged = t.elapsed();
    drop(store);
    if let Some(checkpoint) = VolumeFiles::of(dir).checkpoint {
        std::fs::remove_file(checkpoint)?;
    }
    let t = Instant::now();
    let store = Store::open(dir, opts)?;
    let from_log = t.elapsed();
    let reopened = store.stats();
    ensure!(reopened.keys == a.blocks, "reopen from the log found {} keys", reopened.keys);
    // The keys written again (new blocks, a quarter interval's worth at a time, at most two and
    // a half intervals) until two periodic checkpoints were saved at this number of keys: what
    // a snapshot holds puts waiting once the index stopped growing. After each round, the
    // checkpoint being written is waited for (its vectors back for the next snapshot), as a
    // disk that writes checkpoints faster than 8 segments fill would have it. Not done on fewer
    // blocks.
    let mut steady_state = None;
    if steady {
        let (before, per_round) = (reopened.checkpoints, (interval / record / 4).clamp(1, a.blocks));
        let mut written = 0;
        while store.stats().checkpoints < before + 2 && written < 5 * interval / 2 {
            put_keys(&store, per_round, a.blocks + written / record, &mut buf, |_| ())?;
            written += per_round * record;
            let deadline = Instant::now() + Duration::from_secs(30);
            while store.stats().checkpoint_memory_bytes == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let stats = store.stats();
        steady_state = (stats.checkpoints >= before + 2)
            .then(|| (round1(stats.checkpoint_snapshot_us as f64 / 1000.0), stats.checkpoint_memory_bytes));
    }
    store.close()?;
    Ok(json!({
        "workload": "restart",
        "blocks": a.blocks,
        "block_size": block_size,
        "fill_seconds": round3(fill.as_secs_f64()),
        "open_from_checkpoint_ms": round1(from_checkpoint.as_secs_f64() * 1000.0),
        "close_unchanged_ms": round1(close_unchanged.as_secs_f64() * 1000.0),
        "open_from_log_ms": round1(from_log.as_secs_f64() * 1000.0),
        "records_replayed": reopened.recovery.records_replayed,
        "segments_replayed": reopened.recovery.segments_replayed,
        "index_memory_bytes": reopened.index_memory_bytes,
        "index_bytes_per_block": round1(reopened.index_memory_bytes as f64 / a.blocks as f64),
        "index_memory": human(reopened.index_memory_bytes),
        "checkpoint_snapshot_ms_while_filling": round1(stats.checkpoint_snapshot_us as f64 / 1000.0),
        "checkpoint_snapshot_ms": steady_state.map(|(ms, _)| ms),
        "checkpoint_memory_bytes": steady_state.map(|(_, bytes)| bytes),
    }))
}

/// Puts keys `0..count` (LMCache-style names) in batches of 256, buffered, each block `buf`
/// stamped with the key's number plus `salt` (a new salt: new blocks); `done(n)` after each
/// batch.
fn put_keys(store: &Store, count: u64, salt: u64, buf: &mut [u8], done: impl Fn(u64)) -> anyhow::Result<()> {
    let put_opts = PutOptions { durability: Durability::Buffered, ..PutOptions::default() };
    let batch = 256u64;
    for first in (0..count).step_by(batch as usize) {
        let ids: Vec<u64> = (first..(first + batch).min(count)).collect();
        let keys: Vec<String> = ids.iter().map(|i| format!("model@1@0@{i:016x}@bfloat16")).collect();
        let bodies: Vec<Vec<u8>> = ids
            .iter()
            .map(|i| {
                stamp(buf, *i + salt);
                buf.to_vec()
            })
            .collect();
        let items: Vec<(&str, &[u8])> = keys.iter().map(String::as_str).zip(bodies.iter().map(Vec::as_slice)).collect();
        store.put_batch("bench", &items, &put_opts)?;
        done(ids.len() as u64);
    }
    Ok(())
}

/// Runs `op(i, scratch)` for i in 0..count over `threads` threads (thread t takes i ≡ t mod
/// threads); returns the wall time and every operation's latency in microseconds.
fn parallel<S, F>(count: u64, threads: usize, op: F) -> anyhow::Result<(Duration, Vec<u32>)>
where
    S: Default,
    F: Fn(u64, &mut S) -> anyhow::Result<()> + Sync,
{
    let started = Instant::now();
    let results: Vec<anyhow::Result<Vec<u32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|t| {
                let op = &op;
                s.spawn(move || {
                    let mut scratch = S::default();
                    let mut lat = Vec::with_capacity((count / threads as u64 + 1) as usize);
                    for i in (t..count).step_by(threads) {
                        let t0 = Instant::now();
                        op(i, &mut scratch)?;
                        lat.push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    }
                    Ok(lat)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("benchmark thread panicked"))))
            .collect()
    });
    let elapsed = started.elapsed();
    let mut all = Vec::with_capacity(count as usize);
    for r in results {
        all.extend(r?);
    }
    all.sort_unstable();
    Ok((elapsed, all))
}

fn read_order(count: u64, random: bool) -> Vec<u64> {
    let mut order: Vec<u64> = (0..count).collect();
    if random {
        Rng::new(0x9E37_79B9_7F4A_7C15).shuffle(&mut order);
    }
    order
}

/// User plus system CPU time of this process.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a complete rusage into the pointer it is given, which points to
    // zeroed memory of the right size and alignment.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return 0.0;
    }
    // SAFETY: getrusage returned 0, so it initialised the struct (and it was zeroed before).
    let u = unsafe { usage.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}
