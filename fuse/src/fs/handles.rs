//! Open files: a reader holds the block as it was at open; a writer holds the whole new content
//! and stores it when the file is closed (its first flush), so a reader never sees half a block.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use fuser::{Errno, FileHandle, OpenAccMode, OpenFlags};
use kvhoard_engine::{Block, Durability, PutOptions, ReadOptions};

use super::{store_errno, KvFs};
use crate::inodes::Node;

/// An open file.
pub(super) enum Handle {
    /// Reading a stored block: the bytes as they were at open, kept whatever happens to the key.
    Read(Block),
    /// Writing: the whole new content, stored at flush.
    Write(Mutex<WriteBuf>),
    /// `.stats`: a JSON snapshot taken at open.
    Stats(Vec<u8>),
}

/// What a writer holds.
pub(super) struct WriteBuf {
    pub(super) ino: u64,
    pub(super) bytes: Vec<u8>,
    pub(super) dirty: bool,
}

fn lock(w: &Mutex<WriteBuf>) -> MutexGuard<'_, WriteBuf> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

impl KvFs {
    fn handles(&self) -> MutexGuard<'_, std::collections::HashMap<u64, Arc<Handle>>> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn handle(&self, fh: FileHandle) -> Option<Arc<Handle>> {
        self.handles().get(&fh.0).cloned()
    }

    fn add_handle(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles().insert(fh, Arc::new(h));
        FileHandle(fh)
    }

    /// Bytes of the open writer of `ino`, if one is writing it.
    pub(super) fn writing(&self, ino: u64) -> Option<u64> {
        self.handles().values().find_map(|h| match &**h {
            Handle::Write(w) => {
                let w = lock(w);
                (w.ino == ino).then_some(w.bytes.len() as u64)
            }
            _ => None,
        })
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
        self.namespace_in_use(&ns);
        w.dirty = false;
        Ok(())
    }

    /// Stores every dirty writer of `ino` (before a rename or a read of what it wrote).
    pub(super) fn flush_writers(&self, ino: u64) -> Result<(), Errno> {
        let writers: Vec<Arc<Handle>> = self.handles().values().cloned().collect();
        for h in writers {
            if let Handle::Write(w) = &*h {
                let mut w = lock(w);
                if w.ino == ino {
                    self.store_writer(&mut w)?;
                }
            }
        }
        Ok(())
    }

    /// Opens `node` (inode `ino`) for reading or writing.
    pub(super) fn open_node(&self, ino: u64, node: &Node, flags: OpenFlags) -> Result<FileHandle, Errno> {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let handle = match (node, write) {
            (Node::Stats, false) => Handle::Stats(self.stats_json()),
            (Node::Stats | Node::Hash { .. }, true) => return Err(Errno::EROFS),
            (Node::Hash { ns, hash }, false) => {
                match self.store.get_by_hash(ns, hash, ReadOptions::default()).map_err(|e| store_errno(&e))? {
                    Some(b) => Handle::Read(b),
                    None => return Err(Errno::ENOENT),
                }
            }
            (Node::File { ns, key }, false) => {
                self.flush_writers(ino)?;
                match self.store.get(ns, key, ReadOptions::default()).map_err(|e| store_errno(&e))? {
                    Some(b) => Handle::Read(b),
                    None => return Err(Errno::ENOENT),
                }
            }
            (Node::File { ns, key }, true) => {
                // Partial writes start from the stored bytes; O_TRUNC from nothing.
                let truncate = flags.0 & libc::O_TRUNC != 0;
                let bytes = if truncate {
                    Vec::new()
                } else {
                    let stored = self.store.get(ns, key, ReadOptions::default()).map_err(|e| store_errno(&e))?;
                    stored.map(|b| b.to_vec()).unwrap_or_default()
                };
                Handle::Write(Mutex::new(WriteBuf { ino, bytes, dirty: truncate }))
            }
            _ => return Err(Errno::EISDIR),
        };
        Ok(self.add_handle(handle))
    }

    /// A new, empty file `ino`: it exists from now on (for this mount) and is stored at its
    /// first close, even if nothing is written to it.
    pub(super) fn create_node(&self, ino: u64) -> FileHandle {
        self.add_handle(Handle::Write(Mutex::new(WriteBuf { ino, bytes: Vec::new(), dirty: true })))
    }

    /// Up to `size` bytes at `offset` of an open file.
    pub(super) fn read_handle(
        &self,
        fh: FileHandle,
        offset: u64,
        size: u32,
        out: impl FnOnce(&[u8]),
    ) -> Result<(), Errno> {
        let h = self.handle(fh).ok_or(Errno::EBADF)?;
        let slice = |bytes: &[u8]| -> Vec<u8> {
            let start = (offset as usize).min(bytes.len());
            let end = start.saturating_add(size as usize).min(bytes.len());
            bytes.get(start..end).unwrap_or_default().to_vec()
        };
        match &*h {
            Handle::Read(block) => {
                let start = (offset as usize).min(block.len());
                let end = start.saturating_add(size as usize).min(block.len());
                out(block.get(start..end).unwrap_or_default());
            }
            Handle::Stats(json) => out(&slice(json)),
            Handle::Write(w) => out(&slice(&lock(w).bytes)),
        }
        Ok(())
    }

    /// Writes `data` at `offset` into an open writer's content.
    pub(super) fn write_handle(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let h = self.handle(fh).ok_or(Errno::EBADF)?;
        let Handle::Write(w) = &*h else { return Err(Errno::EBADF) };
        let end = offset.saturating_add(data.len() as u64);
        if end > self.max_file_bytes {
            return Err(Errno::EFBIG);
        }
        let mut w = lock(w);
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
        Ok(data.len() as u32)
    }

    /// close(2): a written file is stored now, and close reports whether that worked.
    pub(super) fn flush_handle(&self, fh: FileHandle) -> Result<(), Errno> {
        let h = self.handle(fh).ok_or(Errno::EBADF)?;
        if let Handle::Write(w) = &*h {
            self.store_writer(&mut lock(w))?;
        }
        Ok(())
    }

    /// The last close of an open file.
    pub(super) fn release_handle(&self, fh: FileHandle) -> Result<(), Errno> {
        let h = self.handles().remove(&fh.0);
        if let Some(Handle::Write(w)) = h.as_deref() {
            self.store_writer(&mut lock(w))?;
        }
        Ok(())
    }

    /// fsync(2): stores the writer's content durably.
    pub(super) fn fsync_handle(&self, fh: FileHandle) -> Result<(), Errno> {
        let h = self.handle(fh).ok_or(Errno::EBADF)?;
        if let Handle::Write(w) = &*h {
            let mut w = lock(w);
            w.dirty = true;
            let Some(Node::File { ns, key }) = self.inodes().get(w.ino).cloned() else {
                return Err(Errno::ENOENT);
            };
            let opts = PutOptions { durability: Durability::Synced, ..PutOptions::default() };
            self.store.put(&ns, &key, &w.bytes, &opts).map_err(|e| store_errno(&e))?;
            w.dirty = false;
        }
        Ok(())
    }

    /// Sets the size of file `node` (inode `ino`): the content of its open writers (the one of
    /// `fh`, when given), or the stored block itself when none is writing it.
    pub(super) fn truncate(&self, ino: u64, node: &Node, fh: Option<FileHandle>, size: u64) -> Result<(), Errno> {
        let Node::File { ns, key } = node else { return Err(Errno::EACCES) };
        if size > self.max_file_bytes {
            return Err(Errno::EFBIG);
        }
        // Truncating a file that is open for writing changes what its writers will store.
        let writers: Vec<Arc<Handle>> = match fh.and_then(|fh| self.handle(fh)) {
            Some(h) if matches!(*h, Handle::Write(_)) => vec![h],
            _ => self
                .handles()
                .values()
                .filter(|h| matches!(&***h, Handle::Write(w) if lock(w).ino == ino))
                .cloned()
                .collect(),
        };
        for h in &writers {
            if let Handle::Write(w) = &**h {
                let mut w = lock(w);
                w.bytes.resize(size as usize, 0);
                w.dirty = true;
            }
        }
        if !writers.is_empty() {
            return Ok(());
        }
        // truncate(2) on a path: rewrite the stored block at the new size.
        let stored = self.store.get(ns, key, ReadOptions::default()).map_err(|e| store_errno(&e))?;
        let mut bytes = stored.map(|b| b.to_vec()).unwrap_or_default();
        bytes.resize(size as usize, 0);
        let opts = PutOptions { durability: self.opts.durability, ..PutOptions::default() };
        self.store.put(ns, key, &bytes, &opts).map_err(|e| store_errno(&e))?;
        Ok(())
    }
}
