//! `kvhoard mount`: serves a volume as a file system until SIGINT or SIGTERM (or `umount`).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kvhoard_engine::{Durability, StoreOptions};
use kvhoard_fuse::MountOptions;

use super::open;
use super::signals::{block_signals, wait_signal};

pub fn run(
    volume: &Path,
    mountpoint: &Path,
    threads: usize,
    durability: Durability,
    allow_other: bool,
    placement: &crate::flags::PlacementArgs,
    opts: StoreOptions,
) -> anyhow::Result<ExitCode> {
    // Checked before the volume is opened, so a bad mount point costs no recovery.
    kvhoard_fuse::check_mountpoint(mountpoint)?;
    // Signals are taken synchronously below; block them before any thread starts so that none
    // of the serving threads is interrupted by them.
    let signals = block_signals();
    let (opts, placed) = placement.apply(opts)?;
    let store = Arc::new(open(volume, opts)?);
    placed.opened(&store);
    let mount_opts = MountOptions { threads, durability, allow_other };
    let mounted = kvhoard_fuse::mount(Arc::clone(&store), mountpoint, &mount_opts)?;
    eprintln!(
        "kvhoard: {} mounted on {} ({threads} threads); Ctrl-C or `umount {}` to stop",
        volume.display(),
        mountpoint.display(),
        mountpoint.display()
    );
    let why = loop {
        if let Some(sig) = wait_signal(&signals, Duration::from_millis(200)) {
            break format!("signal {sig}");
        }
        if mounted.is_finished() {
            break "unmounted".to_string();
        }
    };
    tracing::info!(reason = %why, "stopping");
    mounted.unmount().context("unmounting")?;
    store.close().context("closing the volume")?;
    eprintln!("kvhoard: {} unmounted ({why}), volume closed", mountpoint.display());
    Ok(ExitCode::SUCCESS)
}
