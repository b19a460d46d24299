//! Directory listings: the root (namespaces and the special entries) and a namespace (its keys,
//! streamed page by page from the log's summaries, so a directory with millions of keys is
//! never held in memory at once).

use fuser::{Errno, FileType, INodeNo, ReplyDirectory};
use kvhoard_engine::ListCursor;

use super::{store_errno, KvFs};
use crate::inodes::{BY_HASH, STATS};
use crate::names::{key_to_name, NAME_MAX};

/// Directory offsets: 1 and 2 follow `.` and `..`; listing cursors are shifted past them.
pub(super) const FIRST_ENTRY: u64 = 3;

impl KvFs {
    /// Lists the root from `offset`.
    pub(super) fn list_root(&self, offset: u64, reply: &mut ReplyDirectory) {
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
    }

    /// Lists the keys of namespace `ns` from `offset` (a listing cursor, shifted).
    pub(super) fn list_namespace(&self, ns: &str, offset: u64, reply: &mut ReplyDirectory) -> Result<(), Errno> {
        let mut cursor = (offset > 2).then(|| ListCursor::from_u64(offset - FIRST_ENTRY));
        loop {
            let page = self.store.list(ns, cursor, 512).map_err(|e| store_errno(&e))?;
            for e in &page.entries {
                let name = key_to_name(&e.key);
                if name.len() > NAME_MAX {
                    tracing::warn!(namespace = %ns, key = %e.key, "key too long to list as a file name");
                    continue;
                }
                let Some(pos) = e.cursor.to_u64() else { continue };
                let pseudo = INodeNo(u64::from_le_bytes(*e.content_hash.first_chunk().unwrap_or(&[0; 8])) | 1 << 63);
                if reply.add(pseudo, pos + FIRST_ENTRY, FileType::RegularFile, &name) {
                    return Ok(());
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => return Ok(()),
            }
        }
    }
}
