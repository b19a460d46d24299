use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kvhoard_engine::{CreateOptions, Store, StoreOptions};

use crate::size::human;

pub fn run(
    volume: &Path,
    capacity: Option<u64>,
    segment_size: Option<u64>,
    json: bool,
    opts: StoreOptions,
) -> anyhow::Result<ExitCode> {
    let is_dir = kvhoard_engine::VolumeFiles::of(volume).checkpoint.is_some();
    let capacity = match (capacity, is_dir) {
        (Some(c), _) => Some(c),
        (None, true) => anyhow::bail!("a directory volume needs --capacity (for example --capacity 10GiB)"),
        (None, false) => None,
    };
    // The default follows the capacity the volume will have: a device's --capacity is capped
    // at its size.
    let segment_size = match (segment_size, capacity) {
        (Some(s), _) => s,
        (None, Some(c)) if is_dir => CreateOptions::default_segment_bytes(c),
        (None, Some(c)) => CreateOptions::default_segment_bytes(c.min(device_bytes(volume)?)),
        (None, None) => CreateOptions::default_segment_bytes(device_bytes(volume)?),
    };
    let store =
        Store::create(volume, &CreateOptions { capacity_bytes: capacity, segment_size_bytes: segment_size }, opts)
            .with_context(|| format!("cannot create a volume at {}", volume.display()))?;
    let sb = store.superblock().clone();
    store.close()?;
    if json {
        let out = serde_json::json!({
            "volume": volume.display().to_string(),
            "capacity_bytes": u64::from(sb.segment_count) * sb.segment_size_bytes,
            "segment_size_bytes": sb.segment_size_bytes,
            "segments": sb.segment_count,
        });
        println!("{out}");
    } else {
        println!(
            "created {}: {} in {} segments of {}",
            volume.display(),
            human(u64::from(sb.segment_count) * sb.segment_size_bytes),
            sb.segment_count,
            human(sb.segment_size_bytes)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The size of the block device (or file) at `path`.
fn device_bytes(path: &Path) -> anyhow::Result<u64> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    kvhoard_engine::device::device_size(&file).with_context(|| format!("cannot tell the size of {}", path.display()))
}
