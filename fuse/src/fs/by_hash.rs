//! `/.by-hash/<blake3 hex>`: every stored block by its content hash, read-only.

use std::ffi::OsStr;

use fuser::{Errno, FileType, INodeNo, ReplyDirectory};
use kvhoard_engine::ReadOptions;

use super::listing::FIRST_ENTRY;
use super::{store_errno, KvFs};
use crate::inodes::Node;

impl KvFs {
    /// The block a file name in `/.by-hash` names.
    pub(super) fn hash_node(&self, name: &OsStr) -> Result<Node, Errno> {
        let hex = name.to_str().ok_or(Errno::ENOENT)?;
        let hash = kvhoard_engine::format::hex::decode_hash(hex).ok_or(Errno::ENOENT)?;
        let ns = self.find_hash(&hash).ok_or(Errno::ENOENT)?;
        Ok(Node::Hash { ns, hash })
    }

    /// The namespace holding a block with this content hash, if any.
    fn find_hash(&self, hash: &[u8; 32]) -> Option<String> {
        self.namespaces()
            .into_iter()
            .find(|ns| self.store.get_by_hash(ns, hash, ReadOptions::default()).ok().flatten().is_some())
    }

    /// Lists `/.by-hash` from `offset`: every distinct block once, namespace by namespace.
    pub(super) fn list_by_hash(&self, offset: u64, reply: &mut ReplyDirectory) -> Result<(), Errno> {
        let mut seen = std::collections::HashSet::new();
        let mut n = FIRST_ENTRY;
        for ns in self.namespaces() {
            let mut cursor = None;
            loop {
                let page = self.store.list(&ns, cursor, 512).map_err(|e| store_errno(&e))?;
                for e in &page.entries {
                    if !seen.insert(e.content_hash) {
                        continue;
                    }
                    n += 1;
                    if n <= offset {
                        continue;
                    }
                    let name = kvhoard_engine::format::hex::encode(&e.content_hash);
                    if reply.add(INodeNo(n | 1 << 62), n, FileType::RegularFile, name) {
                        return Ok(());
                    }
                }
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
        Ok(())
    }
}
