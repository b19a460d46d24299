//! The file system: FUSE requests translated into store calls. No storage logic lives here.
//!
//! - `callbacks.rs`: the `fuser::Filesystem` implementation; each callback resolves its node,
//!   calls one method of the modules below, and replies once.
//! - `handles.rs`: open files (reading a block as it was at open, or writing a new content that
//!   is stored when the file is closed), truncation, fsync.
//! - `namespaces.rs`: namespaces as directories, unlink and rename.
//! - `listing.rs`: directory listings, streamed from the store page by page.
//! - `by_hash.rs`: `/.by-hash`, every block by its content hash.
//! - `xattrs.rs`: the `user.kvhoard.*` extended attributes.

mod by_hash;
mod callbacks;
mod handles;
mod listing;
mod namespaces;
mod xattrs;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo};
use kvhoard_engine::{BlockMeta, Durability, ReadOptions, Store, StoreError};

use crate::inodes::{Inodes, Node};
use crate::names::key_of;
use handles::{Handle, Viewer};

/// How long the kernel may cache attributes and names. Short: other writers (the native API,
/// a server on the same volume) change keys behind the mount's back. A file open for writing is
/// never cached ([`KvFs::ttl`]): the kernel caches attributes per inode, and the writing process
/// and the others see different sizes.
const TTL: Duration = Duration::from_secs(1);

/// How the mount behaves.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Durability of blocks stored when a file is closed.
    pub durability: Durability,
    /// Owner of every file and directory.
    pub uid: u32,
    /// Group of every file and directory.
    pub gid: u32,
}

/// kvhoard as a FUSE file system.
pub struct KvFs {
    store: Arc<Store>,
    opts: FsOptions,
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    /// Namespaces made by mkdir that hold no key yet (they exist only while mounted).
    empty_namespaces: Mutex<Vec<String>>,
    /// Largest file the volume can store (a little less than a segment).
    max_file_bytes: u64,
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

/// The errno that reports a store error to a file system caller.
fn store_errno(e: &StoreError) -> Errno {
    match e {
        StoreError::BlockTooLarge { .. } => Errno::EFBIG,
        StoreError::InvalidArgument { .. } => Errno::EINVAL,
        StoreError::Poisoned { .. } | StoreError::Closed => Errno::EROFS,
        _ => Errno::EIO,
    }
}

fn unix(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

impl KvFs {
    /// A file system over `store`.
    pub fn new(store: Arc<Store>, opts: FsOptions) -> KvFs {
        let max_file_bytes = store.max_block_bytes();
        KvFs {
            store,
            opts,
            inodes: Mutex::new(Inodes::default()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            empty_namespaces: Mutex::new(Vec::new()),
            max_file_bytes,
        }
    }

    fn inodes(&self) -> MutexGuard<'_, Inodes> {
        self.inodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn node(&self, ino: INodeNo) -> Option<Node> {
        self.inodes().get(ino.0).cloned()
    }

    fn attr(&self, ino: u64, kind: FileType, size: u64, stored: u64, mtime: SystemTime, perm: u16) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: stored.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.opts.uid,
            gid: self.opts.gid,
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        }
    }

    fn dir_attr(&self, ino: u64, perm: u16) -> FileAttr {
        self.attr(ino, FileType::Directory, 0, 0, UNIX_EPOCH, perm)
    }

    fn block_attr(&self, ino: u64, meta: &BlockMeta, writable: bool) -> FileAttr {
        let stored = meta.stored_len.div_ceil(4096) * 4096 + 4096;
        let perm = if writable { 0o644 } else { 0o444 };
        self.attr(ino, FileType::RegularFile, meta.stored_len, stored, unix(meta.created_unix_ms), perm)
    }

    /// How long the kernel may cache what it is told of `ino`.
    fn ttl(&self, ino: u64) -> Duration {
        if self.has_writer(ino) {
            Duration::ZERO
        } else {
            TTL
        }
    }

    /// Attributes of a node as `viewer` sees it; `Err(ENOENT)` if it names nothing.
    fn getattr_node(&self, ino: u64, node: &Node, viewer: Viewer) -> Result<FileAttr, Errno> {
        match node {
            Node::Root => Ok(self.dir_attr(ino, 0o755)),
            Node::ByHash => Ok(self.dir_attr(ino, 0o555)),
            Node::Stats => {
                let len = self.stats_json().len() as u64;
                Ok(self.attr(ino, FileType::RegularFile, len, len, SystemTime::now(), 0o444))
            }
            Node::Namespace(ns) if self.namespace_exists(ns) => Ok(self.dir_attr(ino, 0o755)),
            Node::Namespace(_) => Err(Errno::ENOENT),
            Node::File { ns, key } => {
                if let Some(len) = self.writer_size(ino, viewer) {
                    return Ok(self.attr(ino, FileType::RegularFile, len, len, SystemTime::now(), 0o644));
                }
                match self.store.meta(ns, key).map_err(|e| store_errno(&e))? {
                    Some(meta) => Ok(self.block_attr(ino, &meta, true)),
                    // A new file another process is writing: empty until it is published.
                    None if self.has_writer(ino) => {
                        Ok(self.attr(ino, FileType::RegularFile, 0, 0, SystemTime::now(), 0o644))
                    }
                    None => Err(Errno::ENOENT),
                }
            }
            Node::Hash { ns, hash } => {
                let block = self.store.get_by_hash(ns, hash, ReadOptions::default()).map_err(|e| store_errno(&e))?;
                block.map(|b| self.block_attr(ino, &b.meta, false)).ok_or(Errno::ENOENT)
            }
        }
    }

    /// What `name` in directory `parent` stands for (whether or not it exists).
    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<Node, Errno> {
        match self.node(parent).ok_or(Errno::ENOENT)? {
            Node::Root => {
                let name = name.to_str().ok_or(Errno::EILSEQ)?;
                match name {
                    ".by-hash" => Ok(Node::ByHash),
                    ".stats" => Ok(Node::Stats),
                    _ => {
                        kvhoard_engine::format::record::validate_namespace(name).map_err(|_| Errno::EINVAL)?;
                        Ok(Node::Namespace(name.to_string()))
                    }
                }
            }
            Node::Namespace(ns) => {
                let key = key_of(name).map_err(|b| errno(b.errno()))?;
                Ok(Node::File { ns, key })
            }
            Node::ByHash => self.hash_node(name),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// The statistics as `kvhoard stat --json` prints them.
    fn stats_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(&self.store.stats()).unwrap_or_default();
        out.push(b'\n');
        out
    }
}
