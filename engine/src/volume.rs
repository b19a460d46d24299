//! Finding, creating and locking a volume: a directory holding `volume.kvh` and its checkpoint
//! files, or a raw block device whose checkpoints live in two reserved slots on the device.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use kvhoard_format::policy::{self, NsPolicy};
use kvhoard_format::superblock::{self, FreedAhead, Superblock};
use kvhoard_format::{align_up, FormatError, UNIT_BYTES};

use crate::buffer::AlignedBuf;
use crate::device::BlockDevice;
use crate::error::{Result, StoreError};
use crate::options::CreateOptions;

/// Name of the data file inside a directory volume.
pub(crate) const DATA_FILE: &str = "volume.kvh";

/// The files a volume at a path consists of, for tools that create, copy or remove volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFiles {
    /// The data file (`DIR/volume.kvh`), or the block device itself.
    pub data: PathBuf,
    /// The checkpoint file of a directory volume; `None` for a block device, whose checkpoints
    /// live on the device.
    pub checkpoint: Option<PathBuf>,
}

impl VolumeFiles {
    /// The files of the volume at `path` (a directory, or a block device).
    pub fn of(path: &Path) -> VolumeFiles {
        let paths = VolumePaths::resolve(path);
        let checkpoint = paths.meta_dir.map(|dir| dir.join(crate::checkpoint::CHECKPOINT_FILE));
        VolumeFiles { data: paths.data, checkpoint }
    }

    /// The volume that the file at `path` is part of, if any: the data file or block device of
    /// a volume (it starts with a superblock), or any file inside a volume's directory (its
    /// checkpoints, its lock). Tools that write a file a user names check this first, so that a
    /// slip such as `get VOL KEY -o VOL/volume.kvh` is refused instead of destroying the volume.
    pub fn volume_holding(path: &Path) -> Option<PathBuf> {
        let real = std::fs::canonicalize(path).ok();
        if let Some(real) = &real {
            let is_data = std::fs::metadata(real).is_ok_and(|m| m.is_file() || m.file_type().is_block_device());
            if is_data && starts_with_superblock(real) {
                // A directory volume is named by its directory, a device volume by the device.
                let dir = real.parent().filter(|_| real.file_name() == Some(DATA_FILE.as_ref()));
                return Some(dir.unwrap_or(real).to_path_buf());
            }
        }
        let dir = match &real {
            Some(real) => real.parent().map(Path::to_path_buf),
            None => {
                let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                std::fs::canonicalize(parent).ok()
            }
        }?;
        dir.join(DATA_FILE).is_file().then_some(dir)
    }
}

/// Whether the file or device at `path` begins with a volume's superblock magic.
fn starts_with_superblock(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; superblock::MAGIC.len()];
    File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == superblock::MAGIC
}

/// Where a volume's pieces are.
#[derive(Debug, Clone)]
pub(crate) struct VolumePaths {
    /// The data file or block device.
    pub data: PathBuf,
    /// Directory for checkpoint files, or `None` for a block device (checkpoints on the device).
    pub meta_dir: Option<PathBuf>,
}

impl VolumePaths {
    /// Resolves `path`: a block device is used directly; anything else is a directory.
    pub fn resolve(path: &Path) -> VolumePaths {
        let is_block = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
        if is_block {
            VolumePaths { data: path.to_path_buf(), meta_dir: None }
        } else {
            VolumePaths { data: path.join(DATA_FILE), meta_dir: Some(path.to_path_buf()) }
        }
    }
}

/// Creates the data file of a directory volume, reserving its space.
pub fn create_data_file(paths: &VolumePaths, capacity: u64) -> Result<()> {
    let dir = paths.meta_dir.as_deref().unwrap_or(Path::new("."));
    let file_err = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| StoreError::File { action, path, source }
    };
    if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
        return Err(StoreError::invalid(
            "volume path",
            format!(
                "{} is a file, not a directory: give a directory (created if missing) or a block device",
                dir.display()
            ),
        ));
    }
    std::fs::create_dir_all(dir).map_err(file_err("cannot create directory", dir))?;
    let file = match OpenOptions::new().read(true).write(true).create_new(true).open(&paths.data) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(StoreError::AlreadyExists { path: dir.to_path_buf() })
        }
        Err(e) => return Err(file_err("cannot create", &paths.data)(e)),
    };
    if let Err(e) = reserve_space(&file, capacity) {
        // A file left behind (up to the whole capacity, when the file system ran out part way)
        // would make the next `init` refuse and every other command call it no volume.
        drop(file);
        let _ = std::fs::remove_file(&paths.data);
        return Err(file_err("cannot reserve space for", &paths.data)(e));
    }
    Ok(())
}

/// Allocates the file's blocks now, so that a full file system fails `init`, not a later write.
fn reserve_space(file: &File, capacity: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(capacity).map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: the descriptor is owned by `file`, open for writing, and alive for the call.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    match rc {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(capacity),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// Takes the volume's exclusive lock (flock on the data file or device). The kernel releases it
/// when the process exits, so a crashed process never leaves it behind.
pub fn lock(paths: &VolumePaths) -> Result<File> {
    let file = File::open(&paths.data).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => StoreError::NotAVolume {
            path: paths.meta_dir.clone().unwrap_or_else(|| paths.data.clone()),
            reason: format!("{} does not exist", paths.data.display()),
        },
        _ => StoreError::File { action: "cannot open", path: paths.data.clone(), source: e },
    })?;
    // A process that forks (any multithreaded program spawning a child) shares the parent's
    // open files, and so its locks, until the child execs: a lock can look taken for a moment
    // after its owner released it. Retry briefly before calling it taken.
    for _ in 0..LOCK_ATTEMPTS {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => std::thread::sleep(LOCK_RETRY),
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(StoreError::File { action: "cannot lock", path: paths.data.clone(), source })
            }
        }
    }
    Err(StoreError::Locked { path: paths.data.clone() })
}

const LOCK_ATTEMPTS: u32 = 25;
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

/// The geometry of a new volume on a device of `device_bytes`.
pub fn plan(
    device_bytes: u64,
    opts: &CreateOptions,
    checkpoints_on_device: bool,
    volume_id: [u8; 16],
    now_ms: u64,
) -> Result<Superblock> {
    let capacity = opts.capacity_bytes.unwrap_or(device_bytes).min(device_bytes);
    let seg = opts.segment_size_bytes;
    if !seg.is_multiple_of(UNIT_BYTES)
        || !(superblock::SEGMENT_BYTES_MIN..=superblock::SEGMENT_BYTES_MAX).contains(&seg)
    {
        return Err(StoreError::invalid(
            "segment size",
            format!(
                "{seg} bytes: use a multiple of 4 KiB between 1 MiB and 4 GiB (the default is {}MiB, or {}MiB from {}GiB of capacity)",
                CreateOptions::SMALL_SEGMENT_BYTES >> 20,
                CreateOptions::LARGE_SEGMENT_BYTES >> 20,
                CreateOptions::LARGE_FROM_BYTES >> 30
            ),
        ));
    }
    let slot =
        if checkpoints_on_device { align_up((capacity / 512).clamp(1 << 20, 4 << 30)).unwrap_or(1 << 20) } else { 0 };
    let checkpoint_offset = if checkpoints_on_device { 2 * UNIT_BYTES } else { 0 };
    let data_offset = align_up(2 * UNIT_BYTES + 2 * slot).map(|v| v.div_ceil(1 << 20) * (1 << 20)).unwrap_or(u64::MAX);
    let segment_count = capacity.saturating_sub(data_offset) / seg;
    if segment_count < u64::from(superblock::SEGMENT_COUNT_MIN) {
        return Err(StoreError::invalid(
            "capacity",
            format!("{capacity} bytes hold {segment_count} segments of {seg} bytes; a volume needs at least 2: raise --capacity or lower --segment-size"),
        ));
    }
    let sb = Superblock {
        copy: 0,
        volume_id,
        created_unix_ms: now_ms,
        capacity_bytes: capacity,
        segment_size_bytes: seg,
        segment_count: u32::try_from(segment_count).unwrap_or(u32::MAX),
        data_offset,
        checkpoint_offset,
        checkpoint_slot_bytes: slot,
        freed_ahead: FreedAhead::default(),
    };
    sb.validate().map_err(StoreError::Superblock)?;
    Ok(sb)
}

/// Segments a volume created with `opts` in a directory will hold (its checkpoints kept in files
/// beside the data, as `Store::create` on a directory does): what tools that model a volume need
/// to lay theirs out the same way.
pub fn directory_segment_count(opts: &CreateOptions) -> Result<u32> {
    plan(u64::MAX, opts, false, [0; 16], 0).map(|sb| sb.segment_count)
}

/// Writes both superblock copies and clears every segment header, then syncs.
pub fn format(dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    let zero = AlignedBuf::zeroed(UNIT_BYTES as usize);
    for index in 0..sb.segment_count {
        dev.write_at(&zero, sb.segment_offset(index))?;
    }
    write_superblocks(dev, sb, &[])
}

/// Writes both superblock copies with `policies` in their policy area: copy A, sync, copy B,
/// sync, so that a crash leaves at least one copy whole (the one with the old policies, or the
/// one with the new).
pub fn write_superblocks(dev: &dyn BlockDevice, sb: &Superblock, policies: &[NsPolicy]) -> Result<()> {
    let area = policy::encode(policies).map_err(StoreError::Superblock)?;
    for (copy, offset) in (0u32..).zip(superblock::COPY_OFFSETS) {
        let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
        unit.copy_from_slice(&sb.encode(copy));
        if let Some(dst) = unit.get_mut(policy::OFFSET..policy::OFFSET + area.len()) {
            dst.copy_from_slice(&area);
        }
        dev.write_at(&unit, offset)?;
        dev.sync()?;
    }
    Ok(())
}

/// The namespace policies: from copy A's policy area, or copy B's when A's does not decode;
/// none when neither does (logged).
pub fn read_policies(dev: &dyn BlockDevice) -> Vec<NsPolicy> {
    let mut why = Vec::new();
    for (copy, offset) in superblock::COPY_OFFSETS.into_iter().enumerate() {
        let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
        if let Err(e) = dev.read_at(&mut unit, offset) {
            why.push(format!("copy {copy}: {e}"));
            continue;
        }
        if Superblock::decode(&unit).is_err() {
            why.push(format!("copy {copy}: superblock damaged"));
            continue;
        }
        match policy::decode(&unit) {
            Ok(p) => {
                if !why.is_empty() {
                    tracing::warn!(copy, "namespace policies of superblock copy A are damaged; used copy B's");
                }
                return p;
            }
            Err(e) => why.push(format!("copy {copy}: {e}")),
        }
    }
    tracing::error!(reasons = ?why, "no copy of the namespace policies decodes; every namespace has the default policy");
    Vec::new()
}

/// Whether the device already starts with a kvhoard superblock (either copy).
pub fn has_superblock(dev: &dyn BlockDevice) -> bool {
    read_superblock(dev).is_ok()
}

/// Reads the superblock: copy A, or copy B when A is damaged.
pub fn read_superblock(dev: &dyn BlockDevice) -> std::result::Result<Superblock, FormatError> {
    let mut first_error = None;
    for (copy, offset) in superblock::COPY_OFFSETS.into_iter().enumerate() {
        let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
        let decoded = match dev.read_at(&mut unit, offset) {
            Ok(()) => Superblock::decode(&unit),
            Err(e) => Err(FormatError::InvalidField { what: "superblock", field: "device", detail: e.to_string() }),
        };
        match decoded {
            Ok(sb) if sb.copy == copy as u32 => {
                if let Some(e) = &first_error {
                    tracing::warn!(error = %e, "superblock copy A is damaged; opened with copy B (run `kvhoard fsck --repair`)");
                }
                return Ok(sb);
            }
            Ok(sb) => {
                let e = FormatError::InvalidField {
                    what: "superblock",
                    field: "copy",
                    detail: format!("copy {} found at slot {copy}", sb.copy),
                };
                first_error.get_or_insert(e);
            }
            // An unsupported version is final: the other copy has the same version.
            Err(e @ FormatError::UnsupportedVersion { .. }) => return Err(e),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or(FormatError::InvalidField {
        what: "superblock",
        field: "copy",
        detail: "no copy found".into(),
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_volumes_own_files_are_recognised_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("vol");
        let create = CreateOptions { capacity_bytes: Some(8 << 20), segment_size_bytes: 1 << 20 };
        crate::Store::create(&vol, &create, crate::StoreOptions::default()).unwrap().close().unwrap();
        let real = std::fs::canonicalize(&vol).unwrap();
        // The data file, through a symbolic link from elsewhere too.
        let data = vol.join(DATA_FILE);
        assert_eq!(VolumeFiles::volume_holding(&data), Some(real.clone()));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&data, &link).unwrap();
        assert_eq!(VolumeFiles::volume_holding(&link), Some(real.clone()));
        // Its checkpoint, and a file not yet there but inside the volume's directory.
        assert_eq!(VolumeFiles::volume_holding(&vol.join(crate::CHECKPOINT_FILE)), Some(real.clone()));
        assert_eq!(VolumeFiles::volume_holding(&vol.join("new-file")), Some(real));
        // Files beside the volume, existing or not, are not its.
        let beside = dir.path().join("out.bin");
        assert_eq!(VolumeFiles::volume_holding(&beside), None);
        std::fs::write(&beside, b"KVHOARD").unwrap();
        assert_eq!(VolumeFiles::volume_holding(&beside), None);
        assert_eq!(VolumeFiles::volume_holding(Path::new("no-such-dir/out.bin")), None);
    }
}
