//! The file system: FUSE requests translated into store calls. No storage logic lives here.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use kvhoard_engine::{Block, BlockMeta, Durability, ListCursor, PutOptions, ReadOptions, Store, StoreError};

use crate::inodes::{Inodes, Node, BY_HASH, ROOT, STATS};
use crate::names::{key_of, key_to_name, NAME_MAX};

/// How long the kernel may cache attributes and names. Short: other writers (the native API,
/// a server on the same volume) change keys behind the mount's back.
const TTL: Duration = Duration::from_secs(1);
/// Directory offsets: 1 and 2 follow `.` and `..`; listing cursors are shifted past them.
const FIRST_ENTRY: u64 = 3;
const XATTR_PREFIX: &str = "user.kvhoard.";
const XATTRS: [&str; 6] = ["hash", "codec", "tier", "ttl", "group", "stored_size"];

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

/// An open file.
enum Handle {
    /// Reading a stored block: the bytes as they were at open, kept whatever happens to the key.
    Read(Block),
    /// Writing: the whole new content, stored at flush.
    Write(Mutex<WriteBuf>),
    /// `.stats`: a JSON snapshot taken at open.
    Stats(Vec<u8>),
}

struct WriteBuf {
    ino: u64,
    bytes: Vec<u8>,
    dirty: bool,
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
    /// A rename across namespaces: content is per namespace, so the bytes are stored again under
    /// the new name (the new name appears whole when the put returns), then the old name goes.
    fn copy_then_delete(&self, from: &(String, String), to: &(String, String)) -> Result<(), Errno> {
        let block = match self.store.get(&from.0, &from.1, ReadOptions::default()) {
            Ok(Some(b)) => b,
            Ok(None) => return Err(Errno::ENOENT),
            Err(e) => return Err(store_errno(&e)),
        };
        let meta = &block.meta;
        let compressed = meta.compression.codec_id != 0;
        let opts = PutOptions {
            durability: self.opts.durability,
            ttl_secs: (meta.ttl_secs > 0).then_some(meta.ttl_secs),
            group: meta.group_id,
            parent: meta.parent_hash,
            desc: Some(meta.desc.clone()),
            compression: compressed.then(|| meta.compression.clone()),
            raw: compressed.then_some((meta.raw_len, meta.content_hash)),
        };
        self.store.put(&to.0, &to.1, &block, &opts).map_err(|e| store_errno(&e))?;
        drop(block);
        self.store.delete(&from.0, &from.1, self.opts.durability).map_err(|e| store_errno(&e))?;
        Ok(())
    }

    /// A file system over `store`.
    pub fn new(store: Arc<Store>, opts: FsOptions) -> KvFs {
        let sb = store.superblock();
        let max_file_bytes = u64::from(sb.segment_units().saturating_sub(3)) * 4096 - 8192;
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

    fn handles(&self) -> MutexGuard<'_, HashMap<u64, Arc<Handle>>> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn handle(&self, fh: FileHandle) -> Option<Arc<Handle>> {
        self.handles().get(&fh.0).cloned()
    }

    fn add_handle(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles().insert(fh, Arc::new(h));
        FileHandle(fh)
    }

    fn namespaces(&self) -> Vec<String> {
        let mut names: Vec<String> = self.store.stats().namespaces.into_iter().map(|n| n.name).collect();
        names.extend(self.empty_namespaces.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned());
        names.push("default".into());
        names.sort();
        names.dedup();
        names
    }

    fn namespace_exists(&self, ns: &str) -> bool {
        self.namespaces().iter().any(|n| n == ns)
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

    /// Bytes of the open writer of `ino`, if one is writing it.
    fn writing(&self, ino: u64) -> Option<u64> {
        self.handles().values().find_map(|h| match &**h {
            Handle::Write(w) => {
                let w = w.lock().unwrap_or_else(|e| e.into_inner());
                (w.ino == ino).then_some(w.bytes.len() as u64)
            }
            _ => None,
        })
    }

    /// Attributes of a node; `Err(ENOENT)` if it names nothing.
    fn getattr_node(&self, ino: u64, node: &Node) -> Result<FileAttr, Errno> {
        match node {
            Node::Root => Ok(self.dir_attr(ino, 0o755)),
            Node::ByHash => Ok(self.dir_attr(ino, 0o555)),
            Node::Stats => {
                let len = self.stats_json().len() as u64;
                Ok(self.attr(ino, FileType::RegularFile, len, len, SystemTime::now(), 0o444))
            }
            Node::Namespace(ns) if self.namespace_exists(ns) => Ok(self.dir_attr(ino, 0o755)),
            Node::Namespace(_) => Err(Errno::ENOENT),
            Node::File { ns, key } => match self.store.meta(ns, key).map_err(|e| store_errno(&e))? {
                Some(meta) => Ok(self.block_attr(ino, &meta, true)),
                None => match self.writing(ino) {
                    Some(len) => Ok(self.attr(ino, FileType::RegularFile, len, len, SystemTime::now(), 0o644)),
                    None => Err(Errno::ENOENT),
                },
            },
            Node::Hash { ns, hash } => {
                let block = self.store.get_by_hash(ns, hash, ReadOptions::default()).map_err(|e| store_errno(&e))?;
                block.map(|b| self.block_attr(ino, &b.meta, false)).ok_or(Errno::ENOENT)
            }
        }
    }

    /// The namespace holding a block with this content hash, if any.
    fn find_hash(&self, hash: &[u8; 32]) -> Option<String> {
        self.namespaces()
            .into_iter()
            .find(|ns| self.store.get_by_hash(ns, hash, ReadOptions::default()).ok().flatten().is_some())
    }

    fn node(&self, ino: INodeNo) -> Option<Node> {
        self.inodes().get(ino.0).cloned()
    }

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
            Node::ByHash => {
                let hex = name.to_str().ok_or(Errno::ENOENT)?;
                let hash = parse_hash(hex).ok_or(Errno::ENOENT)?;
                let ns = self.find_hash(&hash).ok_or(Errno::ENOENT)?;
                Ok(Node::Hash { ns, hash })
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// Stores what a writer holds, if it changed.
    fn store_writer(&self, w: &mut WriteBuf) -> Result<(), Errno> {
        if !w.dirty {
            return Ok(());
        }
        let Some(Node::File { ns, key }) = self.inodes().get(w.ino).cloned() else { return Err(Errno::ENOENT) };
        let opts = PutOptions { durability: self.opts.durability, ..PutOptions::default() };
        self.store.put(&ns, &key, &w.bytes, &opts).map_err(|e| {
            tracing::warn!(namespace = %ns, key = %key, error = %e, "storing a file failed");
            store_errno(&e)
        })?;
        self.empty_namespaces.lock().unwrap_or_else(|e| e.into_inner()).retain(|n| *n != ns);
        w.dirty = false;
        Ok(())
    }

    /// Stores every dirty writer of `ino` (before a rename or a read of what it wrote).
    fn flush_writers(&self, ino: u64) -> Result<(), Errno> {
        let writers: Vec<Arc<Handle>> = self.handles().values().cloned().collect();
        for h in writers {
            if let Handle::Write(w) = &*h {
                let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
                if w.ino == ino {
                    self.store_writer(&mut w)?;
                }
            }
        }
        Ok(())
    }

    fn stats_json(&self) -> Vec<u8> {
        let s = self.store.stats();
        let tiers: Vec<serde_json::Value> = s
            .tiers
            .iter()
            .map(|t| {
                serde_json::json!({
                    "tier": t.tier, "capacity_bytes": t.capacity_bytes, "resident_bytes": t.resident_bytes,
                    "entries": t.entries, "hits": t.hits, "misses": t.misses, "hit_bytes": t.hit_bytes,
                    "load_latency_p50_ns": t.load_latency.p50_ns, "load_latency_p99_ns": t.load_latency.p99_ns,
                })
            })
            .collect();
        let namespaces: Vec<serde_json::Value> = s
            .namespaces
            .iter()
            .map(|n| serde_json::json!({"name": n.name, "keys": n.keys, "blocks": n.blocks, "logical_bytes": n.logical_bytes, "unique_bytes": n.unique_bytes}))
            .collect();
        let v = serde_json::json!({
            "capacity_bytes": s.capacity_bytes, "used_bytes": s.used_bytes, "live_bytes": s.live_bytes,
            "keys": s.keys, "blocks": s.blocks, "logical_bytes": s.logical_bytes, "unique_bytes": s.unique_bytes,
            "dedup_saved_bytes": s.dedup_saved_bytes, "puts": s.puts, "gets": s.gets, "hits": s.hits,
            "misses": s.misses, "deletes": s.deletes, "evicted_keys": s.evicted_keys, "read_errors": s.read_errors,
            "device": s.device_backend, "namespaces": namespaces, "tiers": tiers,
        });
        let mut out = serde_json::to_vec_pretty(&v).unwrap_or_default();
        out.push(b'\n');
        out
    }

    fn xattr(&self, node: &Node, attr: &str) -> Result<Option<String>, Errno> {
        let (ns, meta) = match node {
            Node::File { ns, key } => (ns, self.store.meta(ns, key).map_err(|e| store_errno(&e))?),
            Node::Hash { ns, hash } => (
                ns,
                self.store.get_by_hash(ns, hash, ReadOptions::default()).map_err(|e| store_errno(&e))?.map(|b| b.meta),
            ),
            _ => return Ok(None),
        };
        let Some(m) = meta else { return Err(Errno::ENOENT) };
        Ok(match attr {
            "hash" => Some(hex(&m.content_hash)),
            "codec" => Some(codec_name(m.compression.codec_id)),
            "tier" => Some(if self.store.in_dram(ns, &m.content_hash) { "dram" } else { "ssd" }.to_string()),
            "ttl" => Some(m.ttl_secs.to_string()),
            "group" => m.group_id.map(|g| g.to_string()),
            "stored_size" => Some(m.stored_len.to_string()),
            _ => None,
        })
    }
}

fn codec_name(id: u16) -> String {
    match id {
        0 => "none".into(),
        n => format!("codec-{n}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hash(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn reply_xattr(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

impl Filesystem for KvFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The largest requests the kernel allows: whole blocks move in few round trips.
        let _ = config
            .add_capabilities(InitFlags::FUSE_MAX_PAGES | InitFlags::FUSE_BIG_WRITES | InitFlags::FUSE_ATOMIC_O_TRUNC);
        let _ = config.set_max_write(16 << 20);
        let _ = config.set_max_readahead(16 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let node = match self.child(parent, name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        // A name that is not stored costs an index probe, no I/O, and no inode.
        let exists = match &node {
            Node::File { ns, key } => {
                self.store.contains(ns, key).unwrap_or(false)
                    || self.inodes().find(&node).is_some_and(|i| self.writing(i).is_some())
            }
            _ => true,
        };
        if !exists {
            return reply.error(Errno::ENOENT);
        }
        let ino = self.inodes().lookup(node.clone());
        match self.getattr_node(ino, &node) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => {
                self.inodes().forget(ino, 1);
                reply.error(e)
            }
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes().forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let Some(node) = self.node(ino) else { return reply.error(Errno::ENOENT) };
        match self.getattr_node(ino.0, &node) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(node) = self.node(ino) else { return reply.error(Errno::ENOENT) };
        if mode.is_some() || uid.is_some() || gid.is_some() {
            // Stored blocks have no owner or mode of their own.
            return reply.error(Errno::EPERM);
        }
        if let Some(size) = size {
            if !matches!(node, Node::File { .. }) {
                return reply.error(Errno::EACCES);
            }
            if size > self.max_file_bytes {
                return reply.error(Errno::EFBIG);
            }
            // Truncating a file that is open for writing changes what its writers will store.
            let writers: Vec<Arc<Handle>> = match fh.and_then(|fh| self.handle(fh)) {
                Some(h) if matches!(*h, Handle::Write(_)) => vec![h],
                _ => self.handles().values().filter(|h| matches!(&***h, Handle::Write(w) if w.lock().unwrap_or_else(|e| e.into_inner()).ino == ino.0)).cloned().collect(),
            };
            for h in &writers {
                if let Handle::Write(w) = &**h {
                    let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
                    w.bytes.resize(size as usize, 0);
                    w.dirty = true;
                }
            }
            match writers.is_empty() {
                false => {}
                true => {
                    // truncate(2) on a path: rewrite the stored block at the new size.
                    let Node::File { ns, key } = &node else { return reply.error(Errno::EACCES) };
                    let mut bytes = match self.store.get(ns, key, ReadOptions::default()) {
                        Ok(Some(b)) => b.to_vec(),
                        Ok(None) => Vec::new(),
                        Err(e) => return reply.error(store_errno(&e)),
                    };
                    bytes.resize(size as usize, 0);
                    let opts = PutOptions { durability: self.opts.durability, ..PutOptions::default() };
                    if let Err(e) = self.store.put(ns, key, &bytes, &opts) {
                        return reply.error(store_errno(&e));
                    }
                }
            }
        }
        match self.getattr_node(ino.0, &node) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Regular files are made by create; devices, fifos and sockets cannot be stored.
        reply.error(Errno::EPERM);
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        if parent != ROOT {
            // Keys are files in a namespace; namespaces do not nest.
            return reply.error(Errno::EPERM);
        }
        let node = match self.child(parent, name) {
            Ok(n @ Node::Namespace(_)) => n,
            Ok(_) => return reply.error(Errno::EEXIST),
            Err(e) => return reply.error(e),
        };
        let Node::Namespace(ns) = &node else { return reply.error(Errno::EINVAL) };
        if self.namespace_exists(ns) {
            return reply.error(Errno::EEXIST);
        }
        self.empty_namespaces.lock().unwrap_or_else(|e| e.into_inner()).push(ns.clone());
        let ino = self.inodes().lookup(node);
        reply.entry(&TTL, &self.dir_attr(ino, 0o755), Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.child(parent, name) {
            Ok(Node::File { ns, key }) => match self.store.delete(&ns, &key, self.opts.durability) {
                Ok(true) => reply.ok(),
                Ok(false) => reply.error(Errno::ENOENT),
                Err(e) => reply.error(store_errno(&e)),
            },
            Ok(Node::Hash { .. }) => reply.error(Errno::EROFS),
            Ok(Node::Stats) => reply.error(Errno::EPERM),
            Ok(_) => reply.error(Errno::EISDIR),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.child(parent, name) {
            Ok(Node::Namespace(ns)) => {
                if !self.namespace_exists(&ns) {
                    return reply.error(Errno::ENOENT);
                }
                match self.store.list(&ns, None, 1) {
                    Ok(page) if !page.entries.is_empty() => reply.error(Errno::ENOTEMPTY),
                    Ok(_) if ns == "default" => reply.error(Errno::EBUSY),
                    Ok(_) => {
                        self.empty_namespaces.lock().unwrap_or_else(|e| e.into_inner()).retain(|n| *n != ns);
                        reply.ok()
                    }
                    Err(e) => reply.error(store_errno(&e)),
                }
            }
            Ok(Node::ByHash) => reply.error(Errno::EBUSY),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, _req: &Request, _parent: INodeNo, _link: &OsStr, _target: &std::path::Path, reply: ReplyEntry) {
        reply.error(Errno::EPERM);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (from, to) = match (self.child(parent, name), self.child(newparent, newname)) {
            (Ok(Node::File { ns, key }), Ok(Node::File { ns: ns2, key: key2 })) => ((ns, key), (ns2, key2)),
            (Ok(Node::File { .. }), Ok(_)) => return reply.error(Errno::EISDIR),
            (Ok(Node::Namespace(_)), Ok(Node::Namespace(_))) => return reply.error(Errno::EPERM),
            (Ok(_), Ok(_)) => return reply.error(Errno::EPERM),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL);
        }
        let from_node = Node::File { ns: from.0.clone(), key: from.1.clone() };
        if let Some(ino) = self.inodes().find(&from_node) {
            if let Err(e) = self.flush_writers(ino) {
                return reply.error(e);
            }
        }
        if flags.contains(RenameFlags::RENAME_NOREPLACE) && self.store.contains(&to.0, &to.1).unwrap_or(false) {
            return reply.error(Errno::EEXIST);
        }
        if from == to {
            return reply.ok();
        }
        if from.0 == to.0 {
            // Publish within a namespace: a link record names the stored block (no byte is read
            // or rewritten), then the old name is removed.
            match self.store.rename(&from.0, &from.1, &to.1, self.opts.durability) {
                Ok(true) => {}
                Ok(false) => return reply.error(Errno::ENOENT),
                Err(e) => return reply.error(store_errno(&e)),
            }
        } else if let Err(e) = self.copy_then_delete(&from, &to) {
            return reply.error(e);
        }
        self.inodes().rename(&from_node, Node::File { ns: to.0, key: to.1 });
        reply.ok()
    }

    fn link(&self, _req: &Request, _ino: INodeNo, _newparent: INodeNo, _newname: &OsStr, reply: ReplyEntry) {
        // One name per key; identical bytes are shared by deduplication instead.
        reply.error(Errno::EPERM);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(node) = self.node(ino) else { return reply.error(Errno::ENOENT) };
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let handle = match (&node, write) {
            (Node::Stats, false) => Handle::Stats(self.stats_json()),
            (Node::Stats | Node::Hash { .. }, true) => return reply.error(Errno::EROFS),
            (Node::Hash { ns, hash }, false) => match self.store.get_by_hash(ns, hash, ReadOptions::default()) {
                Ok(Some(b)) => Handle::Read(b),
                Ok(None) => return reply.error(Errno::ENOENT),
                Err(e) => return reply.error(store_errno(&e)),
            },
            (Node::File { ns, key }, false) => {
                if let Err(e) = self.flush_writers(ino.0) {
                    return reply.error(e);
                }
                match self.store.get(ns, key, ReadOptions::default()) {
                    Ok(Some(b)) => Handle::Read(b),
                    Ok(None) => return reply.error(Errno::ENOENT),
                    Err(e) => return reply.error(store_errno(&e)),
                }
            }
            (Node::File { ns, key }, true) => {
                // Partial writes start from the stored bytes; O_TRUNC from nothing.
                let bytes = if flags.0 & libc::O_TRUNC != 0 {
                    Vec::new()
                } else {
                    match self.store.get(ns, key, ReadOptions::default()) {
                        Ok(b) => b.map(|b| b.to_vec()).unwrap_or_default(),
                        Err(e) => return reply.error(store_errno(&e)),
                    }
                };
                let dirty = flags.0 & libc::O_TRUNC != 0;
                Handle::Write(Mutex::new(WriteBuf { ino: ino.0, bytes, dirty }))
            }
            _ => return reply.error(Errno::EISDIR),
        };
        let fh = self.add_handle(handle);
        // Direct I/O: reads and writes come to us whole, and the page cache holds no second copy.
        reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(h) = self.handle(fh) else { return reply.error(Errno::EBADF) };
        let slice = |bytes: &[u8]| -> Vec<u8> {
            let start = (offset as usize).min(bytes.len());
            let end = start.saturating_add(size as usize).min(bytes.len());
            bytes.get(start..end).unwrap_or_default().to_vec()
        };
        match &*h {
            Handle::Read(block) => {
                let start = (offset as usize).min(block.len());
                let end = start.saturating_add(size as usize).min(block.len());
                reply.data(block.get(start..end).unwrap_or_default())
            }
            Handle::Stats(json) => reply.data(&slice(json)),
            Handle::Write(w) => reply.data(&slice(&w.lock().unwrap_or_else(|e| e.into_inner()).bytes)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(h) = self.handle(fh) else { return reply.error(Errno::EBADF) };
        let Handle::Write(w) = &*h else { return reply.error(Errno::EBADF) };
        let end = offset.saturating_add(data.len() as u64);
        if end > self.max_file_bytes {
            return reply.error(Errno::EFBIG);
        }
        let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
        if offset as usize == w.bytes.len() {
            // Appending, the common case (cp, dd, LMCache): one copy, no zero-fill first.
            w.bytes.extend_from_slice(data);
        } else {
            if w.bytes.len() < end as usize {
                w.bytes.resize(end as usize, 0);
            }
            if let Some(dst) = w.bytes.get_mut(offset as usize..end as usize) {
                dst.copy_from_slice(data);
            }
        }
        w.dirty = true;
        reply.written(data.len() as u32)
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // close(2): a written file is stored now, and close reports whether that worked.
        let Some(h) = self.handle(fh) else { return reply.error(Errno::EBADF) };
        if let Handle::Write(w) = &*h {
            if let Err(e) = self.store_writer(&mut w.lock().unwrap_or_else(|e| e.into_inner())) {
                return reply.error(e);
            }
        }
        reply.ok()
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let h = self.handles().remove(&fh.0);
        if let Some(Handle::Write(w)) = h.as_deref() {
            if let Err(e) = self.store_writer(&mut w.lock().unwrap_or_else(|e| e.into_inner())) {
                return reply.error(e);
            }
        }
        reply.ok()
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let Some(h) = self.handle(fh) else { return reply.error(Errno::EBADF) };
        if let Handle::Write(w) = &*h {
            let mut w = w.lock().unwrap_or_else(|e| e.into_inner());
            w.dirty = true;
            let Some(Node::File { ns, key }) = self.inodes().get(w.ino).cloned() else {
                return reply.error(Errno::ENOENT);
            };
            let opts = PutOptions { durability: Durability::Synced, ..PutOptions::default() };
            if let Err(e) = self.store.put(&ns, &key, &w.bytes, &opts) {
                return reply.error(store_errno(&e));
            }
            w.dirty = false;
        }
        reply.ok()
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.node(ino) {
            Some(Node::Root | Node::ByHash | Node::Namespace(_)) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(node) = self.node(ino) else { return reply.error(Errno::ENOENT) };
        if offset < 1 && reply.add(ino, 1, FileType::Directory, ".") {
            return reply.ok();
        }
        if offset < 2 && reply.add(ROOT, 2, FileType::Directory, "..") {
            return reply.ok();
        }
        match node {
            Node::Root => {
                let mut entries = vec![
                    (BY_HASH, FileType::Directory, ".by-hash".to_string()),
                    (STATS, FileType::RegularFile, ".stats".to_string()),
                ];
                entries.extend(self.namespaces().into_iter().map(|ns| (INodeNo(0), FileType::Directory, ns)));
                // Entry i has offset FIRST_ENTRY + i; the kernel asks again after the last it took.
                let skip = offset.saturating_sub(FIRST_ENTRY - 1) as usize;
                for (i, (e_ino, kind, name)) in entries.into_iter().enumerate().skip(skip) {
                    let e_ino = if e_ino.0 == 0 { INodeNo(u64::MAX - i as u64) } else { e_ino };
                    if reply.add(e_ino, FIRST_ENTRY + i as u64, kind, &name) {
                        break;
                    }
                }
                reply.ok()
            }
            Node::Namespace(ns) => {
                // Streams the listing page by page from the log's summaries: a directory with
                // millions of keys is never held in memory at once.
                let mut cursor = (offset > 2).then(|| ListCursor::from_u64(offset - FIRST_ENTRY));
                loop {
                    let page = match self.store.list(&ns, cursor, 512) {
                        Ok(p) => p,
                        Err(e) => return reply.error(store_errno(&e)),
                    };
                    for e in &page.entries {
                        let name = key_to_name(&e.key);
                        if name.len() > NAME_MAX {
                            tracing::warn!(namespace = %ns, key = %e.key, "key too long to list as a file name");
                            continue;
                        }
                        let Some(pos) = e.cursor.to_u64() else { continue };
                        let pseudo =
                            INodeNo(u64::from_le_bytes(*e.content_hash.first_chunk().unwrap_or(&[0; 8])) | 1 << 63);
                        if reply.add(pseudo, pos + FIRST_ENTRY, FileType::RegularFile, &name) {
                            return reply.ok();
                        }
                    }
                    match page.next {
                        Some(next) => cursor = Some(next),
                        None => return reply.ok(),
                    }
                }
            }
            Node::ByHash => {
                // Every distinct block once, namespace by namespace.
                let namespaces = self.namespaces();
                let mut seen = std::collections::HashSet::new();
                let mut n = FIRST_ENTRY;
                for ns in namespaces {
                    let mut cursor = None;
                    loop {
                        let page = match self.store.list(&ns, cursor, 512) {
                            Ok(p) => p,
                            Err(e) => return reply.error(store_errno(&e)),
                        };
                        for e in &page.entries {
                            if !seen.insert(e.content_hash) {
                                continue;
                            }
                            n += 1;
                            if n <= offset {
                                continue;
                            }
                            if reply.add(INodeNo(n | 1 << 62), n, FileType::RegularFile, hex(&e.content_hash)) {
                                return reply.ok();
                            }
                        }
                        match page.next {
                            Some(next) => cursor = Some(next),
                            None => break,
                        }
                    }
                }
                reply.ok()
            }
            _ => reply.error(Errno::ENOTDIR),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.store.stats();
        let bsize = 4096u64;
        let blocks = s.capacity_bytes / bsize;
        // Space held by records no key names any more is free too: reclaim makes it so.
        let free = s.capacity_bytes.saturating_sub(s.live_bytes) / bsize;
        reply.statfs(blocks, free, free, s.keys, u64::from(u32::MAX), bsize as u32, NAME_MAX as u32, bsize as u32);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // The attributes describe the stored block; they are not set through the mount.
        reply.error(Errno::EPERM);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let Some(node) = self.node(ino) else { return reply.error(Errno::ENOENT) };
        let attr = name.to_str().and_then(|n| n.strip_prefix(XATTR_PREFIX));
        let Some(attr) = attr.filter(|a| XATTRS.contains(a)) else { return reply.error(Errno::ENODATA) };
        match self.xattr(&node, attr) {
            Ok(Some(v)) => reply_xattr(reply, size, v.as_bytes()),
            Ok(None) => reply.error(Errno::ENODATA),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let Some(node) = self.node(ino) else { return reply.error(Errno::ENOENT) };
        let mut out = Vec::new();
        if matches!(node, Node::File { .. } | Node::Hash { .. }) {
            for a in XATTRS {
                if self.xattr(&node, a).ok().flatten().is_some() {
                    out.extend_from_slice(XATTR_PREFIX.as_bytes());
                    out.extend_from_slice(a.as_bytes());
                    out.push(0);
                }
            }
        }
        reply_xattr(reply, size, &out)
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EPERM);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let node = match self.child(parent, name) {
            Ok(n @ Node::File { .. }) => n,
            Ok(Node::Hash { .. }) => return reply.error(Errno::EROFS),
            Ok(_) => return reply.error(Errno::EEXIST),
            Err(e) if parent == BY_HASH => {
                let _ = e;
                return reply.error(Errno::EROFS);
            }
            Err(e) => return reply.error(e),
        };
        if let Node::File { ns, .. } = &node {
            if !self.namespace_exists(ns) {
                return reply.error(Errno::ENOENT);
            }
        }
        let ino = self.inodes().lookup(node);
        // A new file exists from now on (for this mount) and is stored at its first close,
        // even if nothing is written to it.
        let fh = self.add_handle(Handle::Write(Mutex::new(WriteBuf { ino, bytes: Vec::new(), dirty: true })));
        let _ = flags;
        let attr = self.attr(ino, FileType::RegularFile, 0, 0, SystemTime::now(), 0o644);
        reply.created(&TTL, &attr, Generation(0), fh, FopenFlags::FOPEN_DIRECT_IO);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }
}
