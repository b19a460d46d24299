//! kvhoard's storage engine: a log-structured, content-hashed block store for LLM KV caches.
//!
//! A volume is a fixed set of segments on one file or block device (`kvhoard-format` defines
//! every byte). Blocks are appended to the open segment as 4 KiB-aligned records; a record names
//! its block by the blake3 hash of the raw bytes, so identical bytes in one namespace are stored
//! once and named by several keys. The log is the source of truth: the in-memory index is
//! rebuilt at open from the newest checkpoint plus the segments written after it.
//!
//! The layers, each a folder or a file, with dependencies pointing down:
//!
//! ```text
//! store/      the public face: Store's API, wiring the layers into `parts.rs`
//! reclaim/    emptying a segment when the volume is full: victim, pins, drops, checkpoint rule
//! placement/  deciding where a block lives (DRAM admission, the victim segment): one trait
//! checkpoint/ the index written out: snapshot, save, the background writer
//! recovery    rebuilding the log state and the index at open
//! tier/       the DRAM tier (LRU) and per-tier counters
//! writer/     the log writer thread: records handed over by puts, joined, kept in flight
//! log/        the log's state machine (segments, reservations, watermark), group commit
//! index/      key → block → location, by fingerprint
//! device/     where bytes go: io_uring, pread/pwrite, memory (crash simulation), faults
//! buffer/     aligned buffers and their pool
//! check/      reading a volume without opening it: checks, inspect, repair of structures
//! fsck        check, repair (structures, then damaged keys through the store), check again
//! ```
//!
//! Entry point: [`Store`]. A put reads top to bottom through `store/put.rs`, `store/append.rs`,
//! `store/submit.rs`, `writer/` and `log/`; a get through `store/get.rs`, `tier/` and `log/scan.rs`.

#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod block;
pub mod buffer;
pub mod check;
mod checkpoint;
mod clock;
mod codec;
pub mod device;
mod error;
pub mod fsck;
mod index;
mod log;
mod metrics;
mod options;
mod parts;
pub mod placement;
mod policy;
mod reclaim;
mod recovery;
mod store;
mod thread;
pub mod tier;
mod volume;
mod writer;

pub use block::{codec_name, Block, BlockMeta};
pub use buffer::AlignedBuf;
pub use checkpoint::CHECKPOINT_FILE;
pub use clock::Clock;
pub use device::IoBackend;
pub use error::{Result, StoreError};
pub use index::KeyId;
pub use kvhoard_kernels::{CodecSpec, Positions};
pub use log::Loc;
pub use options::{CreateOptions, Durability, PutOptions, ReadOptions, StoreOptions};
pub use policy::{NsSettings, Policy, TtlSettings, DEFAULT_DRIFT, MAX_TTL_GROUPS};
pub use reclaim::cleaner::free_target as cleaner_free_target;
pub use recovery::RecoveryReport;
pub use store::{
    CodecStats, ListCursor, ListEntry, ListPage, NamespaceStats, PolicyStats, Resident, Stats, Store,
    DIRECT_READ_MIN_BYTES,
};
pub use volume::{directory_segment_count, VolumeFiles};
pub use writer::WriterConfig;

pub use kvhoard_format as format;
