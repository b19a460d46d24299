//! Writing a file the user named (`-o`, `--svg`): one place that refuses to overwrite a
//! volume's own files.

use std::path::Path;

use anyhow::{bail, Context as _};

/// Writes `bytes` to `path`, unless `path` is part of a volume (its data file, a checkpoint,
/// anything in its directory): a misdirected `-o` must not destroy what it reads from.
pub fn write_file(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    refuse_volume_file(path)?;
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// An error if `path` is part of a volume.
pub fn refuse_volume_file(path: &Path) -> anyhow::Result<()> {
    if let Some(volume) = kvhoard_engine::VolumeFiles::volume_holding(path) {
        bail!(
            "refusing to write {}: it lies in the volume at {}, which writing it could destroy; name a file outside the volume",
            path.display(),
            volume.display()
        );
    }
    Ok(())
}

/// An error if `dir`, where plots are to go, is a volume's directory.
pub fn refuse_volume_dir(dir: &Path) -> anyhow::Result<()> {
    if let Some(volume) = kvhoard_engine::VolumeFiles::volume_holding(&dir.join("plot.svg")) {
        bail!(
            "refusing to write plots into {}: it is the volume at {}; give --plot a directory outside the volume",
            dir.display(),
            volume.display()
        );
    }
    Ok(())
}
