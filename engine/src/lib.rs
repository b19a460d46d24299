//! kvhoard's storage engine: a log-structured, content-hashed block store for LLM KV caches.
//!
//! A volume is a fixed set of segments on one file or block device ([`kvhoard_format`] defines
//! every byte). Blocks are appended to the open segment as 4 KiB-aligned records; a record names
//! its block by the blake3 hash of the raw bytes, so identical bytes in one namespace are stored
//! once and named by several keys. The log is the source of truth: the in-memory [`index`] is
//! rebuilt at open from the newest checkpoint plus the segments written after it. When the
//! volume is full, whole segments are reclaimed ([`reclaim`]) and what they held is dropped, as
//! a cache does. All I/O goes through the [`device::BlockDevice`] trait.
//!
//! Entry point: [`Store`].

#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod aligned;
pub mod check;
pub mod checkpoint_io;
mod clock;
pub mod device;
mod error;
pub mod index;
pub mod log;
mod options;
pub mod pool;
pub mod reclaim;
pub mod recovery;
mod store;
pub mod tier;
pub mod volume;

pub use aligned::AlignedBuf;
pub use clock::Clock;
pub use error::{Result, StoreError};
pub use options::{CreateOptions, Durability, IoBackend, PutOptions, ReadOptions, StoreOptions};
pub use store::{Block, BlockMeta, ListCursor, ListEntry, ListPage, NamespaceStats, Resident, Stats, Store};

pub use kvhoard_format as format;
