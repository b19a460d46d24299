//! A real FUSE mount for the cross-crate tests.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvhoard_engine::{CreateOptions, Store, StoreOptions};
use kvhoard_fuse::{mount, MountOptions, Mounted};

/// A volume in a temporary directory, mounted on `mnt`; unmounted when dropped, also when a test
/// fails.
pub struct Fixture {
    // Dropped in this order: unmount, then the store, then the directories.
    mounted: Option<Mounted>,
    store: Option<Arc<Store>>,
    /// The mount point.
    pub mnt: PathBuf,
    /// The temporary directory holding the volume (`vol`) and the mount point.
    pub dir: tempfile::TempDir,
}

/// Whether this machine can mount (root and /dev/fuse); reports a skip when it cannot.
pub fn fuse_usable() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !Path::new("/dev/fuse").exists() || !root {
        crate::skip("fuse", "the FUSE tests need /dev/fuse and root");
        return false;
    }
    true
}

impl Fixture {
    /// A fresh 512 MiB volume, mounted; `None` (a skip, reported) where mounting is impossible.
    pub fn new() -> Option<Fixture> {
        if !fuse_usable() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let create = CreateOptions { capacity_bytes: Some(512 << 20), segment_size_bytes: 64 << 20 };
        let store = Arc::new(Store::create(&dir.path().join("vol"), &create, StoreOptions::default()).unwrap());
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let mounted = mount(Arc::clone(&store), &mnt, &MountOptions::default()).unwrap();
        Some(Fixture { mounted: Some(mounted), store: Some(store), mnt, dir })
    }

    /// The store under the mount.
    pub fn store(&self) -> &Store {
        self.store.as_deref().unwrap()
    }

    /// A path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Unmounts, closes and reopens the volume, and mounts it again.
    pub fn remount(&mut self) {
        self.mounted.take().unwrap().unmount().unwrap();
        self.store.take().unwrap().close().unwrap();
        let vol = self.dir.path().join("vol");
        self.store = Some(Arc::new(Store::open(&vol, StoreOptions::default()).unwrap()));
        self.mounted =
            Some(mount(Arc::clone(self.store.as_ref().unwrap()), &self.mnt, &MountOptions::default()).unwrap());
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(m) = self.mounted.take() {
            let _ = m.unmount();
        }
    }
}
