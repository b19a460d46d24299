//! Extended attributes `user.kvhoard.{hash,codec,tier,ttl,group,stored_size}`: what a file's
//! stored block is. Read-only.

use fuser::{Errno, ReplyXattr};
use kvhoard_engine::ReadOptions;

use super::{store_errno, KvFs};
use crate::inodes::Node;

const XATTR_PREFIX: &str = "user.kvhoard.";
const XATTRS: [&str; 6] = ["hash", "codec", "tier", "ttl", "group", "stored_size"];

impl KvFs {
    /// The value of attribute `name` (with its `user.kvhoard.` prefix) of `node`.
    pub(super) fn get_xattr(&self, node: &Node, name: &str) -> Result<String, Errno> {
        let attr = name.strip_prefix(XATTR_PREFIX);
        let Some(attr) = attr.filter(|a| XATTRS.contains(a)) else { return Err(Errno::ENODATA) };
        self.xattr(node, attr)?.ok_or(Errno::ENODATA)
    }

    /// The names of the attributes `node` has, each followed by a NUL.
    pub(super) fn list_xattrs(&self, node: &Node) -> Vec<u8> {
        let mut out = Vec::new();
        if matches!(node, Node::File { .. } | Node::Hash { .. }) {
            for a in XATTRS {
                if self.xattr(node, a).ok().flatten().is_some() {
                    out.extend_from_slice(XATTR_PREFIX.as_bytes());
                    out.extend_from_slice(a.as_bytes());
                    out.push(0);
                }
            }
        }
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
            "hash" => Some(kvhoard_engine::format::hex::encode(&m.content_hash)),
            "codec" => Some(m.codec()),
            "tier" => Some(if self.store.in_dram(ns, &m) { "dram" } else { "ssd" }.to_string()),
            "ttl" => Some(m.ttl_secs.to_string()),
            "group" => m.group_id.map(|g| g.to_string()),
            "stored_size" => Some(m.stored_len.to_string()),
            _ => None,
        })
    }
}

/// Replies with `data`, or its size when `size` is 0 (how callers ask how much room to make).
pub(super) fn reply_xattr(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}
