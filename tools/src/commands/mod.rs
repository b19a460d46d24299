//! One module per subcommand.

pub mod bench;
pub mod bench_cleaning;
pub mod bench_codecs;
pub mod bench_common;
pub mod bench_disk;
pub mod cluster;
pub mod demo;
pub mod fsck;
pub mod init;
pub mod inspect;
pub mod keys;
pub mod ls;
pub mod metrics_client;
pub mod mount;
pub mod ns;
pub mod plan_live;
pub mod serve;
pub mod signals;
pub mod stat;
pub mod ttl;

use std::path::Path;

use anyhow::Context;
use kvhoard_engine::{Store, StoreOptions};

/// Opens a volume, saying which one failed to open.
pub fn open(volume: &Path, opts: StoreOptions) -> anyhow::Result<Store> {
    Store::open(volume, opts).with_context(|| format!("cannot open volume {}", volume.display()))
}

pub use kvhoard_engine::format::hex::encode as hex;
