//! Open files: a reader holds the block as it was at open; a writer holds the whole new content
//! and stores it when the file is closed (its first flush), so a file is published whole or not
//! at all.
//!
//! What is seen of a file while it is being written (docs/fuse.md, "Files being written"): the
//! writing process (the one that opened the writer; through that descriptor for any process) sees
//! its own content and size; every other process sees the last published version, or, for a new
//! file, an empty one. Nothing but the writer's own flush or close ever stores its content.

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
    /// Bytes taken at open: `.stats`, a writing process's view of its own file, or the empty
    /// content of a new file not yet published.
    Snapshot(Vec<u8>),
}

/// What a writer holds.
pub(super) struct WriteBuf {
    /// The file.
    pub(super) ino: u64,
    /// The process that opened it for writing: it sees this content when it reads or stats the
    /// file by name.
    pub(super) pid: u32,
    /// The whole new content.
    pub(super) bytes: Vec<u8>,
    /// Changed since it was last stored.
    pub(super) dirty: bool,
    /// The file was deleted or replaced by a rename while open: its content is never stored.
    pub(super) unlinked: bool,
}

/// Who asks about a file: through which open file, from which process.
#[derive(Debug, Clone, Copy)]
pub(super) struct Viewer {
    pub(super) fh: Option<FileHandle>,
    pub(super) pid: u32,
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

    /// The writers of `ino` whose file still exists (not deleted or replaced while open).
    fn writers(&self, ino: u64) -> Vec<Arc<Handle>> {
        let live = |h: &Handle| matches!(h, Handle::Write(w) if { let w = lock(w); w.ino == ino && !w.unlinked });
        self.handles().values().filter(|h| live(h)).cloned().collect()
    }

    /// Whether anyone has `ino` open for writing.
    pub(super) fn has_writer(&self, ino: u64) -> bool {
        !self.writers(ino).is_empty()
    }

    /// The writer whose view `viewer` has of `ino`: the writer it asks through, else one its
    /// process opened.
    fn writer_for(&self, ino: u64, viewer: Viewer) -> Option<Arc<Handle>> {
        if let Some(h) = viewer.fh.and_then(|fh| self.handle(fh)) {
            if matches!(&*h, Handle::Write(w) if lock(w).ino == ino) {
                return Some(h);
            }
        }
        self.writers(ino).into_iter().find(|h| matches!(&**h, Handle::Write(w) if lock(w).pid == viewer.pid))
    }

    /// The size of `ino` as `viewer` sees its own writes, if it is writing it.
    pub(super) fn writer_size(&self, ino: u64, viewer: Viewer) -> Option<u64> {
        match self.writer_for(ino, viewer).as_deref() {
            Some(Handle::Write(w)) => Some(lock(w).bytes.len() as u64),
            _ => None,
        }
    }

    /// The file `ino` was deleted or replaced: what its writers hold is never stored.
    pub(super) fn orphan_writers(&self, ino: u64) {
        for h in self.writers(ino) {
            if let Handle::Write(w) = &*h {
                lock(w).unlinked = true;
            }
        }
    }

    /// Stores what a writer holds, if it changed and its file still exists.
    fn store_writer(&self, w: &mut WriteBuf) -> Result<(), Errno> {
        if !w.dirty || w.unlinked {
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

    /// Opens `node` (inode `ino`) for reading or writing, for process `pid`.
    pub(super) fn open_node(&self, ino: u64, node: &Node, flags: OpenFlags, pid: u32) -> Result<FileHandle, Errno> {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY;
        let handle = match (node, write) {
            (Node::Stats, false) => Handle::Snapshot(self.stats_json()),
            (Node::Stats | Node::Hash { .. }, true) => return Err(Errno::EROFS),
            (Node::Hash { ns, hash }, false) => {
                match self.store.get_by_hash(ns, hash, ReadOptions::default()).map_err(|e| store_errno(&e))? {
                    Some(b) => Handle::Read(b),
                    None => return Err(Errno::ENOENT),
                }
            }
            (Node::File { ns, key }, false) => match self.writer_for(ino, Viewer { fh: None, pid }).as_deref() {
                // The writing process reads what it has written so far.
                Some(Handle::Write(w)) => Handle::Snapshot(lock(w).bytes.clone()),
                _ => match self.store.get(ns, key, ReadOptions::default()).map_err(|e| store_errno(&e))? {
                    Some(b) => Handle::Read(b),
                    // A new file another process is writing: empty until it is published.
                    None if self.has_writer(ino) => Handle::Snapshot(Vec::new()),
                    None => return Err(Errno::ENOENT),
                },
            },
            (Node::File { ns, key }, true) => {
                // Partial writes start from the stored bytes; O_TRUNC from nothing.
                let truncate = flags.0 & libc::O_TRUNC != 0;
                let bytes = if truncate {
                    Vec::new()
                } else {
                    let stored = self.store.get(ns, key, ReadOptions::default()).map_err(|e| store_errno(&e))?;
                    stored.map(|b| b.to_vec()).unwrap_or_default()
                };
                Handle::Write(Mutex::new(WriteBuf { ino, pid, bytes, dirty: truncate, unlinked: false }))
            }
            _ => return Err(Errno::EISDIR),
        };
        Ok(self.add_handle(handle))
    }

    /// A new, empty file `ino` made by process `pid`: it exists from now on (for this mount)
    /// and is stored at its first close, even if nothing is written to it.
    pub(super) fn create_node(&self, ino: u64, pid: u32) -> FileHandle {
        let w = WriteBuf { ino, pid, bytes: Vec::new(), dirty: true, unlinked: false };
        self.add_handle(Handle::Write(Mutex::new(w)))
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
            Handle::Snapshot(bytes) => out(&slice(bytes)),
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

    /// close(2) of a descriptor by process `pid`. When the process that opened the writer
    /// closes it, the file is stored now, and close reports whether that worked. The kernel also
    /// flushes when any other copy of the descriptor is closed (a forked child's, at its exit or
    /// exec): those store nothing, so a half-written file is never published by someone else's
    /// close; the last close of all (`release`) stores whatever is left.
    pub(super) fn flush_handle(&self, fh: FileHandle, pid: u32) -> Result<(), Errno> {
        let h = self.handle(fh).ok_or(Errno::EBADF)?;
        if let Handle::Write(w) = &*h {
            let mut w = lock(w);
            if w.pid == pid {
                self.store_writer(&mut w)?;
            }
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
            if w.unlinked {
                return Ok(());
            }
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

    /// Sets the size of file `node` (inode `ino`) as `viewer` sees it: the content of the writer
    /// it writes through (ftruncate, or truncate by name from the writing process), else the
    /// stored block itself (truncate by name from another process).
    pub(super) fn truncate(&self, ino: u64, node: &Node, viewer: Viewer, size: u64) -> Result<(), Errno> {
        let Node::File { ns, key } = node else { return Err(Errno::EACCES) };
        if size > self.max_file_bytes {
            return Err(Errno::EFBIG);
        }
        if let Some(h) = self.writer_for(ino, viewer) {
            if let Handle::Write(w) = &*h {
                let mut w = lock(w);
                w.bytes.resize(size as usize, 0);
                w.dirty = true;
            }
            return Ok(());
        }
        let stored = self.store.get(ns, key, ReadOptions::default()).map_err(|e| store_errno(&e))?;
        let Some(stored) = stored else { return Err(Errno::ENOENT) };
        let mut bytes = stored.to_vec();
        bytes.resize(size as usize, 0);
        let opts = PutOptions { durability: self.opts.durability, ..PutOptions::default() };
        self.store.put(ns, key, &bytes, &opts).map_err(|e| store_errno(&e))?;
        Ok(())
    }

    /// Whether `viewer` has `ino` open for writing (its times are then those of its close).
    pub(super) fn is_writing(&self, ino: u64, viewer: Viewer) -> bool {
        self.writer_for(ino, viewer).is_some()
    }
}

/// The process (thread group) a request came from. FUSE gives the id of the calling thread; a
/// process that opens a file on one thread and writes and closes it on others (a thread pool, as
/// Python's aiofiles does) is one writer, so writers are told apart by process. Falls back to the
/// thread id if the thread is gone.
pub(super) fn process_of(tid: u32) -> u32 {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else { return tid };
    status.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse().ok()).unwrap_or(tid)
}
