//! The FUSE callbacks: each resolves its node, calls one method of the other modules, and
//! replies once. Store errors become errnos in one place (`store_errno`).

use std::ffi::OsStr;
use std::time::SystemTime;

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::handles::process_of;
use super::handles::Viewer;
use super::xattrs::reply_xattr;
use super::KvFs;
use crate::inodes::{Node, BY_HASH, ROOT};
use crate::names::NAME_MAX;

impl Filesystem for KvFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The largest requests the kernel allows: whole blocks move in few round trips.
        let _ = config
            .add_capabilities(InitFlags::FUSE_MAX_PAGES | InitFlags::FUSE_BIG_WRITES | InitFlags::FUSE_ATOMIC_O_TRUNC);
        let _ = config.set_max_write(16 << 20);
        let _ = config.set_max_readahead(16 << 20);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let node = match self.child(parent, name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        // A name that is not stored costs an index probe, no I/O, and no inode.
        let exists = match &node {
            Node::File { ns, key } => {
                self.store.contains(ns, key).unwrap_or(false)
                    || self.inodes().find(&node).is_some_and(|i| self.has_writer(i))
            }
            _ => true,
        };
        if !exists {
            return reply.error(Errno::ENOENT);
        }
        let ino = self.inodes().lookup(node.clone());
        match self.getattr_node(ino, &node, Viewer { fh: None, pid: process_of(req.pid()) }) {
            Ok(attr) => reply.entry(&self.ttl(ino), &attr, Generation(0)),
            Err(e) => {
                self.inodes().forget(ino, 1);
                reply.error(e)
            }
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.inodes().forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let Some(node) = self.node(ino) else { return reply.error(Errno::ENOENT) };
        match self.getattr_node(ino.0, &node, Viewer { fh, pid: process_of(req.pid()) }) {
            Ok(attr) => reply.attr(&self.ttl(ino.0), &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(node) = self.node(ino) else { return reply.error(Errno::ENOENT) };
        let viewer = Viewer { fh, pid: process_of(req.pid()) };
        if mode.is_some() || uid.is_some() || gid.is_some() {
            // Stored blocks have no owner or mode of their own.
            return reply.error(Errno::EPERM);
        }
        if atime.is_some() || mtime.is_some() {
            // A file's time is when its block was stored. Setting it to now is accepted from a
            // process writing the file (its close stores it now); anything else is refused.
            let now = |t: Option<TimeOrNow>| t.is_none_or(|t| matches!(t, TimeOrNow::Now));
            if !(now(atime) && now(mtime) && self.is_writing(ino.0, viewer)) {
                tracing::info!(?node, "refusing to set a file's times: they are when its block was stored");
                return reply.error(Errno::EPERM);
            }
        }
        if let Some(size) = size {
            if let Err(e) = self.truncate(ino.0, &node, viewer, size) {
                return reply.error(e);
            }
        }
        match self.getattr_node(ino.0, &node, viewer) {
            Ok(attr) => reply.attr(&self.ttl(ino.0), &attr),
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
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if let Err(e) = self.make_namespace(&node) {
            return reply.error(e);
        }
        let ino = self.inodes().lookup(node);
        reply.entry(&self.ttl(ino), &self.dir_attr(ino, 0o755), Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.child(parent, name).and_then(|node| self.unlink_node(&node)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.child(parent, name).and_then(|node| self.remove_namespace(&node)) {
            Ok(()) => reply.ok(),
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
        let renamed = self
            .child(parent, name)
            .and_then(|from| Ok((from, self.child(newparent, newname)?)))
            .and_then(|(from, to)| self.rename_node(&from, &to, flags));
        match renamed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, _ino: INodeNo, _newparent: INodeNo, _newname: &OsStr, reply: ReplyEntry) {
        // One name per key; identical bytes are shared by deduplication instead.
        reply.error(Errno::EPERM);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(node) = self.node(ino) else { return reply.error(Errno::ENOENT) };
        match self.open_node(ino.0, &node, flags, process_of(req.pid())) {
            // Direct I/O: reads and writes come to us whole, and the page cache holds no second copy.
            Ok(fh) => reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
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
        let mut reply = Some(reply);
        let result = self.read_handle(fh, offset, size, |bytes| {
            if let Some(r) = reply.take() {
                r.data(bytes);
            }
        });
        if let (Err(e), Some(r)) = (result, reply) {
            r.error(e);
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
        match self.write_handle(fh, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        match self.flush_handle(fh, process_of(req.pid())) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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
        match self.release_handle(fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.fsync_handle(fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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
        let listed = match node {
            Node::Root => {
                self.list_root(offset, &mut reply);
                Ok(())
            }
            Node::Namespace(ns) => self.list_namespace(&ns, offset, &mut reply),
            Node::ByHash => self.list_by_hash(offset, &mut reply),
            _ => Err(Errno::ENOTDIR),
        };
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
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
        let Some(name) = name.to_str() else { return reply.error(Errno::ENODATA) };
        match self.get_xattr(&node, name) {
            Ok(v) => reply_xattr(reply, size, v.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let Some(node) = self.node(ino) else { return reply.error(Errno::ENOENT) };
        reply_xattr(reply, size, &self.list_xattrs(&node))
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EPERM);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let node = match self.child(parent, name) {
            Ok(n @ Node::File { .. }) => n,
            Ok(Node::Hash { .. }) => return reply.error(Errno::EROFS),
            Ok(Node::Namespace(_)) => {
                tracing::warn!(
                    name = ?name,
                    "refusing to create a file at the mount's root: files are keys inside a namespace directory \
                     (`default/`, or one made with mkdir)"
                );
                return reply.error(Errno::EPERM);
            }
            Ok(_) => return reply.error(Errno::EEXIST),
            Err(_) if parent == BY_HASH => return reply.error(Errno::EROFS),
            Err(e) => return reply.error(e),
        };
        if let Node::File { ns, .. } = &node {
            if !self.namespace_exists(ns) {
                return reply.error(Errno::ENOENT);
            }
        }
        let ino = self.inodes().lookup(node);
        let fh = self.create_node(ino, process_of(req.pid()));
        let attr = self.attr(ino, FileType::RegularFile, 0, 0, SystemTime::now(), 0o644);
        reply.created(&self.ttl(ino), &attr, Generation(0), fh, FopenFlags::FOPEN_DIRECT_IO);
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
