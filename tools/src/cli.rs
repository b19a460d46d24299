//! The command line, parsed and validated with no I/O; `main` then builds what the command needs.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use kvhoard_engine::Durability;

use crate::size::parse_size;

/// kvhoard: a storage engine for LLM KV caches.
///
/// kvhoard keeps KV-cache blocks (the key/value tensors of processed prompts) in a
/// log-structured, content-addressed volume on NVMe, so that serving engines can reload them
/// instead of recomputing them. A VOLUME is a directory (holding volume.kvh and its checkpoint)
/// or a raw block device.
///
/// Exit codes: 0 success; 1 error; 2 bad command line; 3 key not found (get, rm, inspect block
/// and dump). fsck uses e2fsck's: see `kvhoard fsck --help`.
#[derive(Debug, Parser)]
#[command(name = "kvhoard", version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    /// Log level for messages on stderr: error, warn, info, debug, trace (RUST_LOG overrides).
    #[arg(long, global = true, default_value = "warn", value_name = "LEVEL")]
    pub log_level: String,

    /// Use the page cache instead of O_DIRECT for the volume.
    #[arg(long, global = true, help_heading = "Volume I/O (commands that open a volume)")]
    pub no_direct_io: bool,

    /// I/O backend: auto (io_uring when the kernel offers it, else pread), io_uring, pread.
    #[arg(long, global = true, help_heading = "Volume I/O (commands that open a volume)", default_value = "auto", value_parser = crate::flags::parse_backend, value_name = "BACKEND")]
    pub io_backend: kvhoard_engine::IoBackend,

    /// Bytes of records the log writer keeps in flight to the device, and lets wait for it,
    /// before a put waits [default: 64MiB, sized for NVMe]. Lower it to bound memory; a disk
    /// that needs a deeper queue to reach its speed needs more.
    #[arg(long, global = true, help_heading = "Volume I/O (commands that open a volume)", value_parser = crate::flags::parse_write_in_flight, value_name = "SIZE")]
    pub write_in_flight: Option<u64>,

    /// The largest write of joined records the log writer makes: records that follow one
    /// another are joined up to this size; a larger record is a write of its own [default:
    /// 2MiB].
    #[arg(long, global = true, help_heading = "Volume I/O (commands that open a volume)", value_parser = crate::flags::parse_write_size, value_name = "SIZE")]
    pub write_size: Option<u64>,

    /// Bytes per second the background cleaner writes relocating the blocks placement keeps,
    /// while no put is short of room (it goes at the device's speed once one is) [default:
    /// 256MiB]. Lower, its I/O disturbs gets less; it must stay above the rate of puts times
    /// the bytes cleaning relocates per byte put, or puts wait for it.
    #[arg(long, global = true, help_heading = "Volume I/O (commands that open a volume)", value_parser = crate::flags::parse_clean_rate, value_name = "SIZE")]
    pub clean_rate: Option<u64>,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a volume.
    ///
    /// For a directory, creates it if needed and reserves --capacity bytes in DIR/volume.kvh.
    /// For a block device, uses the whole device (or --capacity of it) and keeps checkpoints in
    /// two reserved slots at its start. Refuses to overwrite an existing volume.
    Init {
        /// Directory or block device.
        volume: PathBuf,
        /// Size of the volume (directories only; devices default to their size). Units: B, KiB,
        /// MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000).
        #[arg(long, value_parser = parse_size, value_name = "SIZE")]
        capacity: Option<u64>,
        /// Size of each segment, the unit of space reclaim; the largest block is a little smaller.
        /// A block never spans segments: keep a segment several times the usual block (32 MiB
        /// blocks fill 64 MiB segments only half). [default: 64MiB, or 256MiB for volumes of
        /// 32GiB or more]
        #[arg(long, value_parser = parse_size, value_name = "SIZE")]
        segment_size: Option<u64>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Store a block under KEY and print its blake3 content hash.
    Put {
        /// Directory or block device.
        volume: PathBuf,
        /// The key (any UTF-8 up to 4096 bytes; `/`, `@`, `%` are fine).
        key: String,
        /// File to read the block from; `-` or nothing reads stdin.
        file: Option<PathBuf>,
        #[command(flatten)]
        ns: NamespaceArg,
        #[command(flatten)]
        flags: crate::commands::keys::PutFlags,
    },
    /// Replay a request trace (Mooncake's format) through the engine or its simulator.
    ///
    /// Each request looks up its longest stored prefix, loads it, prefills the rest on a
    /// modelled GPU and stores what it computed. Reports hit rate, TTFT (queueing + prefill +
    /// measured loads), quality of what compressed hits served, write amplification; `--plot
    /// DIR` draws TTFT distributions, hit rate and stored bytes over time, quality against TTFT.
    /// `--sim` runs the engine's placement code on metadata (a whole trace in seconds), `--volume
    /// DIR` the real engine on generated blocks (`--scale` shrinks them), `--compare DIR` both.
    /// docs/replay.md describes the model and its assumptions.
    Replay(crate::replay::ReplayArgs),
    /// Make request traces with a chosen reuse structure, or measure a trace's reuse.
    ///
    /// `kvhoard trace generate --shape documents|sessions` writes Mooncake-format JSON lines
    /// (deterministic in `--seed`); `kvhoard trace stats TRACE` prints requests, distinct
    /// blocks, the hit rate of an unbounded cache and how many blocks are read again.
    Trace {
        #[command(subcommand)]
        what: TraceCommand,
    },
    /// Plan capacity for a trace, or see what a server's placement planner decides.
    ///
    /// `kvhoard plan capacity --trace T`: the Pareto frontier of memory and storage cost, mean
    /// TTFT and throughput over DRAM size × SSD size × TTL, each point a simulator replay of the
    /// whole trace, found by an adaptive search (or `--grid`, every point). docs/replay.md.
    /// `kvhoard plan live ADDR`: the contexts, options and next steps of a server run with
    /// `--placement planner --metrics ADDR`. docs/placement.md.
    Plan {
        #[command(subcommand)]
        what: PlanCommand,
    },
    /// Show or set a namespace's policy: its default codec, whether lossy codecs may be
    /// applied in it, and how placement treats it.
    ///
    /// `kvhoard ns show VOLUME` lists every namespace policy; `kvhoard ns set VOLUME NS --codec
    /// SPEC --lossy allow|deny` sets one (kept with the volume; blocks already stored keep their
    /// codec). Lossy codecs (quant, drop-*) are denied unless allowed. A namespace served over
    /// lm:// or RESP cannot have a token-dropping codec (those clients cannot take the result).
    /// The planner's settings (`--alpha`, `--codecs`, `--drift`) and group TTL's (`--ttl-budget`,
    /// `--ttl-groups`, `--ttl-window`) take effect when the volume is next opened.
    /// docs/placement.md.
    Ns {
        #[command(subcommand)]
        action: crate::commands::ns::NsAction,
    },
    /// What group TTL decides in a running server: per namespace that keeps it (`kvhoard ns set
    /// VOLUME NS --ttl-budget BYTES`), its groups (prefix subtrees by accesses), their TTLs,
    /// accesses and hits, and the best single TTL for the same budget. Read from the server's
    /// metrics endpoint (`kvhoard serve --metrics ADDR`, `GET /ttl`). docs/placement.md.
    Ttl(crate::commands::ttl::TtlArgs),
    /// Write the block stored under KEY to stdout or a file. Exits 3 if there is none.
    Get {
        /// Directory or block device.
        volume: PathBuf,
        /// The key.
        key: String,
        /// Write to FILE instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        #[command(flatten)]
        ns: NamespaceArg,
        /// Also check the bytes' blake3 hash (crc32c is always checked).
        #[arg(long)]
        verify: bool,
    },
    /// Show the volume's capacity, usage, contents per namespace and counters.
    Stat {
        /// Directory or block device.
        volume: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// Print Prometheus metrics (text exposition format) instead.
        #[arg(long, conflicts_with = "json")]
        prometheus: bool,
    },
    /// List the keys of a namespace, oldest first.
    Ls {
        /// Directory or block device.
        volume: PathBuf,
        #[command(flatten)]
        ns: NamespaceArg,
        /// Print at most N keys.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Continue a listing after this cursor (printed by --json listings).
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        /// Also print size, codec, creation time (UTC) and the start of the content hash.
        #[arg(short, long)]
        long: bool,
        /// Print JSON lines, one per key, then one with the cursor to continue from.
        #[arg(long)]
        json: bool,
    },
    /// Delete KEY. Exits 3 if there was none.
    Rm {
        /// Directory or block device.
        volume: PathBuf,
        /// The key.
        key: String,
        #[command(flatten)]
        ns: NamespaceArg,
        /// When to acknowledge the deletion (see put).
        #[arg(long, default_value = "synced", value_parser = crate::flags::parse_durability, value_name = "LEVEL")]
        durability: Durability,
    },
    /// Measure the engine on a fresh volume created in DIR (removed afterwards), or the codecs.
    ///
    /// throughput: puts --total bytes in --block-size blocks from --threads threads, then gets
    /// them back with O_DIRECT (no page cache); reports MB/s (10^6 bytes per second), latency
    /// percentiles in microseconds and CPU seconds per GB; put_mbps includes a final sync making
    /// every block durable, put_acked_mbps does not (fio's O_DIRECT writes, without fsync, are
    /// what it compares with). restart: stores --blocks small blocks
    /// and times opening the volume from its checkpoint and from its log alone, and reports the
    /// index's memory per block. Compare with the disk's own limit measured by fio on the same
    /// file system (see docs/benchmarks.md). `kvhoard bench codecs` measures the compression
    /// codecs instead (see `kvhoard bench codecs --help`).
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Bench {
        /// Directory to create the benchmark volume in (must not hold a volume).
        #[arg(required = true)]
        dir: Option<PathBuf>,
        #[command(subcommand)]
        suite: Option<BenchSuite>,
        #[command(flatten)]
        flags: crate::commands::bench::BenchFlags,
    },
    /// Mount a volume as a file system (FUSE), in the foreground.
    ///
    /// Top-level directories are namespaces (`default` always exists; mkdir makes one, rmdir
    /// removes an empty one); each file in one is a key, and reading it returns the block. A
    /// file is stored when it is closed; writing `NAME.tmp` and renaming it publishes atomically.
    /// `/.by-hash/<blake3 hex>` shows every block by content hash, `/.stats` the statistics as
    /// JSON; extended attributes `user.kvhoard.{hash,codec,tier,ttl,group,stored_size}` describe
    /// each file. A `/` in a key is `%2F` in its file name (docs/fuse.md). Stops, unmounting
    /// cleanly and closing the volume, on Ctrl-C, SIGTERM or `umount MOUNTPOINT`.
    Mount {
        /// Directory or block device.
        volume: PathBuf,
        /// Empty directory to mount on.
        mountpoint: PathBuf,
        /// Threads serving requests (each with its own /dev/fuse descriptor).
        #[arg(long, default_value_t = 4, value_name = "N")]
        threads: usize,
        /// Durability of files stored at close (see put).
        #[arg(long, default_value = "written", value_parser = crate::flags::parse_durability, value_name = "LEVEL")]
        durability: Durability,
        /// Bytes of blocks to keep in a DRAM tier above the log (0 = none).
        #[arg(long, value_parser = parse_size, default_value = "1GiB", value_name = "SIZE")]
        dram_tier: u64,
        /// Let other users use the mount too (needs user_allow_other for non-root).
        #[arg(long)]
        allow_other: bool,
        #[command(flatten)]
        placement: crate::flags::PlacementArgs,
    },
    /// Serve a volume to LMCache over the network, in the foreground.
    ///
    /// --lm speaks LMCache's own `lm://` protocol (point `remote_url: "lm://HOST:PORT"` at it);
    /// --resp speaks the Redis protocol subset of LMCache's `resp://` and `redis://` connectors;
    /// --metrics serves Prometheus metrics at http://ADDR/metrics. ADDR is PORT (on 127.0.0.1),
    /// HOST:PORT or [IPv6]:PORT. Only loopback addresses are allowed unless --allow-remote is
    /// given, and a non-loopback RESP listener needs a password (--resp-password-file or the
    /// KVHOARD_RESP_PASSWORD environment variable). Keys are stored as LMCache sends them, with
    /// each chunk's format, dtype and shape, and stay across restarts. Stops on Ctrl-C or
    /// SIGTERM: requests in progress finish, then the volume is closed. See docs/lmcache.md.
    Serve {
        /// Directory or block device.
        volume: PathBuf,
        #[command(flatten)]
        args: crate::commands::serve::ServeArgs,
    },
    /// Run `kvhoard serve` nodes as one Redis Cluster: write a slot map, check every node.
    ///
    /// `kvhoard cluster init --nodes H1:P1,H2:P2,H3:P3 --out FILE` writes a map dividing the
    /// 16384 slots; each node serves with `kvhoard serve VOLUME --resp PORT --cluster-config FILE`
    /// and reloads FILE on SIGHUP. `kvhoard cluster status --config FILE` shows each node's slots,
    /// keys, bytes and health. Redis Cluster clients (redis-py's RedisCluster, LMCache's
    /// `redis-cluster://`, `redis-cli -c`) then spread keys over the nodes. See docs/cluster.md.
    Cluster {
        #[command(subcommand)]
        action: crate::commands::cluster::ClusterAction,
    },
    /// Check a volume and, with --repair, repair it.
    ///
    /// Reads the volume through its on-disk format (so it works on a volume the engine refuses to
    /// open): both superblock copies, every segment header and summary, every record header and
    /// payload checksum, the checkpoint against the log, and which keys name damaged blocks.
    /// --repair rewrites a damaged superblock copy, seals unsealed segments and rewrites damaged
    /// summaries as opening the volume would, rebuilds damaged segment headers, extends a
    /// truncated volume file (its keys then become misses: what the cut-off part held is
    /// unknown), replaces an unusable checkpoint, deletes (durably, and says which) keys whose
    /// blocks are damaged, and checks again. Damage never brings back an older version or a
    /// deleted key; it turns keys into misses.
    ///
    /// Exit codes (as e2fsck): 0 clean; 1 problems found and all corrected; 4 problems left
    /// uncorrected (run with --repair); 8 operational error (not a volume, in use, I/O error).
    Fsck {
        /// Directory or block device.
        volume: PathBuf,
        /// Repair what is found.
        #[arg(long)]
        repair: bool,
        /// Also check the blake3 hash of every uncompressed block (reads and hashes everything).
        #[arg(long)]
        deep: bool,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Show what a volume holds: usage, namespaces, codecs, segments, records, blocks.
    ///
    /// Reads the on-disk format directly (segment summaries and the checkpoint), so it works on a
    /// volume the engine refuses to open. Takes no lock: on a volume in use, what it shows may
    /// already have changed.
    Inspect {
        /// Directory or block device.
        volume: PathBuf,
        #[command(subcommand)]
        what: Option<InspectWhat>,
        /// Namespace for `block` and `dump`.
        #[arg(short = 'n', long = "namespace", default_value = "default", value_name = "NS", global = true)]
        namespace: String,
        /// Print JSON (one object, or one line per segment or record).
        #[arg(long, global = true)]
        json: bool,
    },
    /// Show kvhoard at work: create a volume, store and reload realistic KV blocks, restart.
    ///
    /// Generates bf16 KV-cache chunks in LMCache's KV_2LTD layout from a seed (some chunks are
    /// shared prefixes, so deduplication shows), stores them, reads them back and checks every
    /// byte, restarts the store from its checkpoint and from its log alone, and reads them again.
    Demo {
        /// Directory for the volume; a temporary one (removed afterwards) by default.
        dir: Option<PathBuf>,
        /// Number of blocks to store.
        #[arg(long, default_value_t = 300)]
        blocks: u32,
        /// Seed of the generated data.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Print one JSON object instead of sentences.
        #[arg(long)]
        json: bool,
    },
}

/// What `inspect` shows.
#[derive(Debug, Subcommand, Clone)]
pub enum InspectWhat {
    /// Capacity, usage, keys, dedup savings, per namespace, codec and tier; segment live ratios;
    /// TTL and age distributions (the default).
    Summary,
    /// One line per segment: state, seq, records, live ratio, age.
    Segments,
    /// The records of segment INDEX.
    Segment {
        /// Segment index.
        index: u32,
    },
    /// Every header field of a block, its compression metadata, where it lives, its checksums.
    Block {
        /// A key, or a content hash as 64 hex digits.
        key: String,
    },
    /// The stored bytes of a block, as a hex dump (or raw with --raw).
    Dump {
        /// A key, or a content hash as 64 hex digits.
        key: String,
        /// Write the bytes themselves instead of a hex dump.
        #[arg(long)]
        raw: bool,
    },
}

/// The namespace option shared by key commands.
#[derive(Debug, Args)]
pub struct NamespaceArg {
    /// Namespace (tenant or model) of the key.
    #[arg(short = 'n', long = "namespace", default_value = "default", value_name = "NS")]
    pub namespace: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}

/// Benchmarks other than the engine's own.
#[derive(Debug, Subcommand)]
pub enum BenchSuite {
    /// Measure every codec on generated KV blocks: size ratio, compress and decompress GB/s on
    /// one core, and the attention-output error E.
    ///
    /// Blocks come from the synthetic generator (bf16 KV_2LTD, 8 KV heads of 128 channels, 256
    /// tokens; 2 MiB is 2 layers, 32 MiB is 32 layers, an 8B model's LMCache chunk). GB/s are
    /// 10^9 bytes of the uncompressed block per second, on one thread. E is the mean over layers
    /// and heads of the attention-output error on probes derived from the block's keys;
    /// error_with_queries uses the generator's own queries, lost_mass the attention mass those
    /// queries put on dropped tokens. quality_ms is the time to compute E for one block. A
    /// memcpy row gives the physical limit of one core on the same buffers; the kernels are the
    /// widest this CPU runs (AVX2 where present), `KVHOARD_SIMD=scalar` measures the portable
    /// ones (decision 0006).
    Codecs(CodecsArgs),
}

#[derive(Debug, Args)]
pub struct CodecsArgs {
    /// Codec to measure (repeatable), e.g. `quant:bits=4` or `drop-knorm:keep=0.5+quant`
    /// [default: a representative set of every codec].
    #[arg(long = "codec", value_name = "SPEC")]
    pub codecs: Vec<String>,
    /// Block sizes to measure (repeatable): 2MiB or 32MiB, or any multiple of 1 MiB (one layer
    /// of 256 tokens is 1 MiB).
    #[arg(long = "size", value_parser = parse_size, value_name = "SIZE", default_values = ["2MiB", "32MiB"])]
    pub sizes: Vec<u64>,
    /// Least time spent measuring each direction of each codec, in seconds.
    #[arg(long, default_value_t = 0.3, value_name = "SECONDS")]
    pub min_time: f64,
    /// Seed of the generated blocks.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub seed: u64,
    /// Print one JSON array, one object per codec and size.
    #[arg(long)]
    pub json: bool,
}

/// What `trace` does.
#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Write a generated trace: `sessions` (multi-turn conversations, like Mooncake's) or
    /// `documents` (whole documents by a Zipf law, each with a question of its own).
    Generate(crate::replay::generate::GenerateArgs),
    /// Measure a trace's reuse.
    Stats {
        /// The trace (Mooncake's JSON lines); `-`: standard input.
        trace: std::path::PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// What `plan` plans.
#[derive(Debug, Subcommand)]
pub enum PlanCommand {
    /// The DRAM, SSD and TTL a trace needs: the frontier of cost against mean TTFT and
    /// throughput, its hypervolume, and how many configurations the search evaluated.
    Capacity(Box<crate::replay::plan::CapacityArgs>),
    /// What a running server's placement planner decides: its options, the contexts used most
    /// with each option's utility (the next cleaning keeps each context's blocks as its option
    /// says: as put, recompressed, or dropped), and the steps it takes next if over budget. Read
    /// from the server's metrics endpoint (`GET /plan`).
    Live(crate::commands::plan_live::LiveArgs),
}
