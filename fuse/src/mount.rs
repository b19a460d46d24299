//! Mounting and unmounting, with plain-words errors for what usually goes wrong.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use fuser::{Config, MountOption, SessionACL, SessionUnmounter};
use kvhoard_engine::{Durability, Store};
use thiserror::Error;

use crate::fs::{FsOptions, KvFs};

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Threads serving FUSE requests, each with its own cloned `/dev/fuse` descriptor.
    pub threads: usize,
    /// Durability of blocks stored when a file is closed.
    pub durability: Durability,
    /// Let every user, not only the mounting one, use the mount.
    pub allow_other: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions { threads: 4, durability: Durability::Written, allow_other: false }
    }
}

/// Why a volume cannot be mounted.
#[derive(Debug, Error)]
pub enum MountError {
    /// No FUSE support.
    #[error("FUSE is not available: {why}; load it with `modprobe fuse` (in a container, pass /dev/fuse in)")]
    NoFuse {
        /// What is missing.
        why: String,
    },
    /// The mount point does not exist.
    #[error("mount point {0} does not exist; create it with `mkdir -p {0}`")]
    Missing(PathBuf),
    /// The mount point is not a directory.
    #[error("mount point {0} is not a directory")]
    NotADirectory(PathBuf),
    /// A FUSE file system died there without being unmounted.
    #[error("{0} is a stale FUSE mount (its server is gone); run `umount -l {0}` first")]
    Stale(PathBuf),
    /// Something is mounted there already.
    #[error("{0} is already a mount point; unmount it first or choose another directory")]
    Busy(PathBuf),
    /// A serving thread count out of range.
    #[error("{0} serving threads (--threads): give between 1 and {MAX_THREADS}")]
    Threads(usize),
    /// The kernel refused the mount.
    #[error("mounting on {path} failed: {source}")]
    Io {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Checks that `mountpoint` can be mounted on, before anything is started.
pub fn check_mountpoint(mountpoint: &Path) -> Result<(), MountError> {
    if !Path::new("/dev/fuse").exists() {
        return Err(MountError::NoFuse { why: "/dev/fuse does not exist".into() });
    }
    match std::fs::metadata(mountpoint) {
        Ok(m) if !m.is_dir() => return Err(MountError::NotADirectory(mountpoint.to_path_buf())),
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return Err(MountError::Stale(mountpoint.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MountError::Missing(mountpoint.to_path_buf()))
        }
        Err(source) => return Err(MountError::Io { path: mountpoint.to_path_buf(), source }),
    }
    let canonical = std::fs::canonicalize(mountpoint)
        .map_err(|source| MountError::Io { path: mountpoint.to_path_buf(), source })?;
    if is_mount_point(&canonical) {
        return Err(MountError::Busy(mountpoint.to_path_buf()));
    }
    Ok(())
}

/// Whether `/proc/self/mountinfo` lists `path` as a mount point.
fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let want = path.to_string_lossy();
    info.lines().filter_map(|l| l.split(' ').nth(4)).any(|mp| unescape_mountinfo(mp) == want)
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(rest.get(..i).unwrap_or_default());
        let code = rest.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = rest.get(i + 4..).unwrap_or_default();
            }
            None => {
                out.push('\\');
                rest = rest.get(i + 1..).unwrap_or_default();
            }
        }
    }
    out.push_str(rest);
    out
}

/// A mounted volume. Dropping it unmounts.
#[derive(Debug)]
pub struct Mounted {
    unmounter: SessionUnmounter,
    session: Option<JoinHandle<std::io::Result<()>>>,
    mountpoint: PathBuf,
}

/// Most threads serving the mount (each reads and writes whole blocks; more than the cores
/// gain nothing).
pub const MAX_THREADS: usize = 1024;

/// Mounts `store` on `mountpoint` and serves it from background threads.
pub fn mount(store: Arc<Store>, mountpoint: &Path, opts: &MountOptions) -> Result<Mounted, MountError> {
    if !(1..=MAX_THREADS).contains(&opts.threads) {
        return Err(MountError::Threads(opts.threads));
    }
    check_mountpoint(mountpoint)?;
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let fs = KvFs::new(store, FsOptions { durability: opts.durability, uid, gid });
    let mut mount_options = vec![
        MountOption::FSName("kvhoard".into()),
        MountOption::Subtype("kvhoard".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
    ];
    mount_options.dedup();
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = if opts.allow_other { SessionACL::All } else { SessionACL::Owner };
    config.n_threads = Some(opts.threads);
    config.clone_fd = true;
    let mut session = fuser::Session::new(fs, mountpoint, &config)
        .map_err(|source| MountError::Io { path: mountpoint.to_path_buf(), source })?;
    let unmounter = session.unmount_callable();
    let thread = std::thread::Builder::new()
        .name("kvhoard-fuse".into())
        .spawn(move || session.run())
        .map_err(|source| MountError::Io { path: mountpoint.to_path_buf(), source })?;
    tracing::info!(mountpoint = %mountpoint.display(), threads = opts.threads, "mounted");
    Ok(Mounted { unmounter, session: Some(thread), mountpoint: mountpoint.to_path_buf() })
}

impl Mounted {
    /// Whether the session ended (someone ran `umount`).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Unmounts and waits for the serving threads to finish.
    pub fn unmount(mut self) -> std::io::Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> std::io::Result<()> {
        if let Err(e) = self.unmounter.unmount() {
            // Busy (a process has a file open): detach, so the mount point is free at once; the
            // session ends when the last user lets go, and its threads are not waited for.
            tracing::warn!(mountpoint = %self.mountpoint.display(), error = %e, "mount busy; detached it");
            lazy_unmount(&self.mountpoint);
            self.session = None;
            return Ok(());
        }
        if let Some(thread) = self.session.take() {
            match thread.join() {
                Ok(result) => result?,
                Err(_) => return Err(std::io::Error::other("a FUSE thread panicked")),
            }
        }
        tracing::info!(mountpoint = %self.mountpoint.display(), "unmounted");
        Ok(())
    }
}

fn lazy_unmount(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return };
    // SAFETY: c is a valid NUL-terminated path that outlives the call.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.session.is_some() {
            if let Err(e) = self.stop() {
                tracing::warn!(error = %e, "unmounting failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }

    #[test]
    fn a_missing_or_file_mount_point_is_named() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let missing = dir.path().join("nope");
        assert!(matches!(check_mountpoint(&missing), Err(MountError::Missing(_)) | Err(MountError::NoFuse { .. })));
        let file = dir.path().join("f");
        let _ = std::fs::write(&file, b"x");
        assert!(matches!(check_mountpoint(&file), Err(MountError::NotADirectory(_)) | Err(MountError::NoFuse { .. })));
        assert!(matches!(
            check_mountpoint(Path::new("/proc")),
            Err(MountError::Busy(_)) | Err(MountError::NoFuse { .. })
        ));
    }
}
