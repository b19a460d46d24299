//! The portable backend: positional reads and writes on a file or block device.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use kvhoard_format::UNIT_BYTES;

use super::{check_request, BlockDevice, Capabilities, DeviceError};

/// Threads `read_many` spreads its reads over at most.
const READ_THREADS: usize = 8;

/// Fewer reads than this are done one after another by the calling thread.
const SPREAD_MIN_READS: usize = 4;

/// A volume file or block device accessed with pread/pwrite, bypassing the page cache with
/// O_DIRECT where the file system supports it.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    capacity: u64,
    direct_io: bool,
    /// The machine's boot when the device was opened.
    boot: u64,
}

impl FileDevice {
    /// Opens `path` for reading and writing. With `direct_io`, O_DIRECT is tried first and the
    /// buffered mode is used where the file system refuses it (tmpfs, some overlay file systems).
    pub fn open(path: &Path, direct_io: bool) -> std::io::Result<FileDevice> {
        let open = |flags: i32| OpenOptions::new().read(true).write(true).custom_flags(flags).open(path);
        let (file, direct_io) = if direct_io {
            match open(libc::O_DIRECT) {
                Ok(f) => (f, true),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::warn!(path = %path.display(), "O_DIRECT refused by the file system; using the page cache");
                    (open(0)?, false)
                }
                Err(e) => return Err(e),
            }
        } else {
            (open(0)?, false)
        };
        let capacity = device_size(&file)?;
        Ok(FileDevice { file, capacity, direct_io, boot: super::host_boot() })
    }
}

/// The size of a regular file or of a block device (whose metadata length is 0).
pub fn device_size(file: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file.metadata()?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let mut f = file;
    let end = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(end)
}

impl BlockDevice for FileDevice {
    fn boot(&self) -> u64 {
        self.boot
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        check_request("read", offset, buf.len(), self.capacity, UNIT_BYTES)?;
        self.file.read_exact_at(buf, offset).map_err(|source| DeviceError::Io {
            op: "read",
            offset,
            len: buf.len() as u64,
            source,
        })
    }

    /// pread has one read in flight per thread: several reads are spread over up to
    /// `READ_THREADS` threads, so that a batch keeps the device about as busy as io_uring's
    /// queue does.
    fn read_many(&self, reads: &mut [(&mut [u8], u64)]) -> Result<(), DeviceError> {
        for (buf, offset) in reads.iter() {
            check_request("read", *offset, buf.len(), self.capacity, UNIT_BYTES)?;
        }
        // A few reads (a direct read's header and payload) are not worth starting threads for.
        let threads = reads.len().min(READ_THREADS);
        if reads.len() < SPREAD_MIN_READS {
            return reads.iter_mut().try_for_each(|(buf, offset)| self.read_at(buf, *offset));
        }
        let per = reads.len().div_ceil(threads);
        std::thread::scope(|s| {
            let handles: Vec<_> = reads
                .chunks_mut(per)
                .map(|chunk| s.spawn(move || chunk.iter_mut().try_for_each(|(buf, offset)| self.read_at(buf, *offset))))
                .collect();
            let mut result = Ok(());
            for handle in handles {
                let outcome = handle.join().unwrap_or_else(|_| {
                    Err(DeviceError::Io {
                        op: "read",
                        offset: 0,
                        len: 0,
                        source: std::io::Error::other("a reading thread panicked"),
                    })
                });
                if result.is_ok() {
                    result = outcome;
                }
            }
            result
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        check_request("write", offset, buf.len(), self.capacity, UNIT_BYTES)?;
        self.file.write_all_at(buf, offset).map_err(|source| DeviceError::Io {
            op: "write",
            offset,
            len: buf.len() as u64,
            source,
        })
    }

    fn sync(&self) -> Result<(), DeviceError> {
        self.file.sync_data().map_err(|source| DeviceError::Io { op: "sync", offset: 0, len: 0, source })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::of_file("pread", self.direct_io)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        File::create(&path).unwrap().set_len(1 << 20).unwrap();
        for direct in [false, true] {
            let dev = FileDevice::open(&path, direct).unwrap();
            assert_eq!(dev.capacity_bytes(), 1 << 20);
            crate::device::conformance::run(&dev);
        }
    }

    #[test]
    fn short_file_read_is_an_error_not_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        File::create(&path).unwrap().set_len(8192).unwrap();
        let dev = FileDevice::open(&path, false).unwrap();
        // Shrink the file behind the device's back: the read must fail, not return zeros.
        File::options().write(true).open(&path).unwrap().set_len(4096).unwrap();
        let mut buf = crate::buffer::AlignedBuf::zeroed(8192);
        assert!(matches!(dev.read_at(&mut buf, 0), Err(DeviceError::Io { .. })));
    }
}
