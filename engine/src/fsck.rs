//! `fsck`: check a volume, optionally repair it, and check it again.
//!
//! The one place that uses both the checker and the engine, by design: [`crate::check`] finds
//! problems and repairs on-disk structures reading the format directly (so it works on a volume
//! the engine refuses to open); deleting the keys whose blocks are damaged is a write like any
//! other, so it goes through [`Store`], which also replays the log and writes a fresh
//! checkpoint. Exit codes are e2fsck's ([`exit`]).

use std::path::Path;

use kvhoard_format::UNIT_BYTES;

use crate::check::repair::{acknowledge_recovered, repair_structures};
use crate::check::{check, problem, scan_volume, Report, ScanError, ScanOptions, Severity};
use crate::checkpoint::CheckpointStore;
use crate::device::{BlockDevice, FileDevice};
use crate::error::{Result, StoreError};
use crate::options::{Durability, ReadOptions, StoreOptions};
use crate::store::Store;
use crate::volume::{self, VolumePaths};

/// Exit codes as e2fsck defines them.
pub mod exit {
    /// No problems.
    pub const CLEAN: u8 = 0;
    /// Problems were found and all corrected.
    pub const CORRECTED: u8 = 1;
    /// Problems were left uncorrected.
    pub const UNCORRECTED: u8 = 4;
    /// The check could not run.
    pub const OPERATIONAL: u8 = 8;
}

/// What fsck does.
#[derive(Debug, Clone, Default)]
pub struct FsckOptions {
    /// Repair what is found.
    pub repair: bool,
    /// Also check blake3 of every uncompressed block.
    pub deep: bool,
    /// Options for opening the store during repair.
    pub store: StoreOptions,
}

/// What fsck found and did.
#[derive(Debug, Clone)]
pub struct FsckOutcome {
    /// What the first check found.
    pub found: Report,
    /// What repair did, in order.
    pub repairs: Vec<String>,
    /// What a second check found after repair.
    pub after: Option<Report>,
    /// 0 clean, 1 corrected, 4 left uncorrected (8, operational error, is the caller's).
    pub exit_code: u8,
}

/// Checks (and with `repair`, repairs) the volume at `path`. Holds the volume's lock while it
/// reads, so no store writes underneath it.
pub fn fsck(path: &Path, opts: &FsckOptions, progress: &dyn Fn(u64, u64)) -> Result<FsckOutcome> {
    let paths = VolumePaths::resolve(path);
    let found = check_once(&paths, opts, progress)?;
    if found.is_clean() || !opts.repair {
        let exit_code = if found.is_clean() { exit::CLEAN } else { exit::UNCORRECTED };
        return Ok(FsckOutcome { found, repairs: Vec::new(), after: None, exit_code });
    }
    let mut repairs = Vec::new();
    {
        let _lock = volume::lock(&paths)?;
        let extended = extend_truncated(&paths)?;
        let dev = open_device(&paths, opts)?;
        if let Some(done) = extended {
            repairs.push(done);
            // What the cut-off segments held cannot be known: any key may have had a newer
            // version or a deletion there, so every key becomes a miss rather than risk one
            // coming back older (docs/format.md, "Damage").
            let (sb, _) = crate::check::scan::read_superblocks(dev.as_ref()).map_err(scan_error(path))?;
            let checkpoints = CheckpointStore::for_volume(&sb, paths.meta_dir.clone());
            if let Some(segment) = crate::recovery::void_all(dev.as_ref(), &sb, &checkpoints)? {
                repairs.push(format!(
                    "segment {segment}: marked every key written before it lost (what the cut-off segments held is unknown)"
                ));
            }
        }
        let scan = scan_volume(dev.as_ref(), ScanOptions { deep: opts.deep, summaries_only: false }, &|_, _| {})
            .map_err(scan_error(path))?;
        let checkpoints = CheckpointStore::for_volume(&scan.sb, paths.meta_dir.clone());
        let report = check(dev.as_ref(), &scan, &checkpoints);
        repairs.extend(repair_structures(dev.as_ref(), &scan, &report, &checkpoints)?);
    }
    repairs.extend(repair_keys(path, &found, opts.deep, opts.store.clone())?);
    {
        let _lock = volume::lock(&paths)?;
        let dev = open_device(&paths, opts)?;
        let scan = scan_volume(dev.as_ref(), ScanOptions { deep: false, summaries_only: true }, &|_, _| {})
            .map_err(scan_error(path))?;
        repairs.extend(acknowledge_recovered(dev.as_ref(), &scan)?);
    }
    let after = check_once(&paths, opts, &|_, _| {})?;
    let exit_code = if after.is_clean() { exit::CORRECTED } else { exit::UNCORRECTED };
    Ok(FsckOutcome { found, repairs, after: Some(after), exit_code })
}

fn check_once(paths: &VolumePaths, opts: &FsckOptions, progress: &dyn Fn(u64, u64)) -> Result<Report> {
    let _lock = volume::lock(paths)?;
    let dev = open_device(paths, opts)?;
    let scan = scan_volume(dev.as_ref(), ScanOptions { deep: opts.deep, summaries_only: false }, progress)
        .map_err(scan_error(&paths.data))?;
    let checkpoints = CheckpointStore::for_volume(&scan.sb, paths.meta_dir.clone());
    let mut report = check(dev.as_ref(), &scan, &checkpoints);
    if scan.sb.capacity_bytes > dev.capacity_bytes() {
        report.problems.insert(
            0,
            problem(
                Severity::Error,
                "truncated",
                None,
                Some(dev.capacity_bytes()),
                format!("the volume is {} bytes but the file holds {}", scan.sb.capacity_bytes, dev.capacity_bytes()),
                "segments past the end are lost and the engine refuses to open the volume; repair extends the file",
            ),
        );
    }
    Ok(report)
}

fn open_device(paths: &VolumePaths, opts: &FsckOptions) -> Result<std::sync::Arc<dyn BlockDevice>> {
    let s = &opts.store;
    crate::device::open_volume(&paths.data, s.io_backend, s.direct_io, s.uring).map_err(|source| StoreError::File {
        action: "cannot open",
        path: paths.data.clone(),
        source,
    })
}

fn scan_error(path: &Path) -> impl Fn(ScanError) -> StoreError + '_ {
    move |e| match e {
        ScanError::Device(d) => StoreError::Device(d),
        e => StoreError::NotAVolume { path: path.to_path_buf(), reason: e.to_string() },
    }
}

/// Grows a volume file that was cut short back to the size its superblock records.
fn extend_truncated(paths: &VolumePaths) -> Result<Option<String>> {
    if paths.meta_dir.is_none() {
        return Ok(None);
    }
    let dev = FileDevice::open(&paths.data, false).map_err(|source| StoreError::File {
        action: "cannot open",
        path: paths.data.clone(),
        source,
    })?;
    let Ok((sb, _)) = crate::check::scan::read_superblocks(&dev) else { return Ok(None) };
    let len = dev.capacity_bytes();
    if sb.capacity_bytes <= len {
        return Ok(None);
    }
    let file = std::fs::OpenOptions::new().write(true).open(&paths.data).map_err(|source| StoreError::File {
        action: "cannot open",
        path: paths.data.clone(),
        source,
    })?;
    file.set_len(sb.capacity_bytes).and_then(|()| file.sync_all()).map_err(|source| StoreError::File {
        action: "cannot extend",
        path: paths.data.clone(),
        source,
    })?;
    Ok(Some(format!(
        "extended the volume file from {len} to {} bytes; what was cut off ({} units) reads as empty",
        sb.capacity_bytes,
        (sb.capacity_bytes - len) / UNIT_BYTES
    )))
}

/// Opens the volume with the engine (which replays what the checkpoint lacks and writes a fresh
/// one if anything changed) and deletes, durably, every key whose block is damaged and has no
/// intact copy.
fn repair_keys(path: &Path, report: &Report, deep: bool, opts: StoreOptions) -> Result<Vec<String>> {
    let store = Store::open(path, opts)?;
    let mut done = Vec::new();
    for (ns, key) in &report.lost_keys {
        if store.get(ns, key, ReadOptions { verify_hash: deep })?.is_some() {
            continue;
        }
        if store.delete(ns, key, Durability::Synced)? {
            done.push(format!("deleted key {key:?} in namespace {ns:?}: its block is damaged"));
        }
    }
    let before = store.stats().checkpoints;
    store.close()?;
    // A close writes one only when the volume changed since the checkpoint it opened from.
    done.push(match store.stats().checkpoints > before {
        true => "wrote a fresh checkpoint".into(),
        false => "the checkpoint on disk is current; none written".into(),
    });
    Ok(done)
}
