//! Namespaces as directories (`default` always exists; mkdir makes one that lives while mounted
//! until a key is stored in it), and the operations that change names: unlink and rename.

use fuser::{Errno, RenameFlags};
use kvhoard_engine::{PutOptions, ReadOptions};

use super::{store_errno, KvFs};
use crate::inodes::Node;

/// A namespace and a key.
type Name = (String, String);

impl KvFs {
    /// Every namespace: those holding keys, those made by mkdir, and `default`.
    pub(super) fn namespaces(&self) -> Vec<String> {
        let mut names: Vec<String> = self.store.stats().namespaces.into_iter().map(|n| n.name).collect();
        names.extend(self.empty_namespaces.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned());
        names.push("default".into());
        names.sort();
        names.dedup();
        names
    }

    pub(super) fn namespace_exists(&self, ns: &str) -> bool {
        self.namespaces().iter().any(|n| n == ns)
    }

    /// A key was stored in `ns`: it no longer needs remembering as an empty namespace.
    pub(super) fn namespace_in_use(&self, ns: &str) {
        self.empty_namespaces.lock().unwrap_or_else(|e| e.into_inner()).retain(|n| n != ns);
    }

    /// mkdir at the root: a new, empty namespace.
    pub(super) fn make_namespace(&self, node: &Node) -> Result<(), Errno> {
        let Node::Namespace(ns) = node else { return Err(Errno::EEXIST) };
        if self.namespace_exists(ns) {
            return Err(Errno::EEXIST);
        }
        self.empty_namespaces.lock().unwrap_or_else(|e| e.into_inner()).push(ns.clone());
        Ok(())
    }

    /// rmdir: only an empty namespace other than `default` goes.
    pub(super) fn remove_namespace(&self, node: &Node) -> Result<(), Errno> {
        match node {
            Node::Namespace(ns) => {
                if !self.namespace_exists(ns) {
                    return Err(Errno::ENOENT);
                }
                let page = self.store.list(ns, None, 1).map_err(|e| store_errno(&e))?;
                if !page.entries.is_empty() {
                    return Err(Errno::ENOTEMPTY);
                }
                if ns == "default" {
                    return Err(Errno::EBUSY);
                }
                self.namespace_in_use(ns);
                Ok(())
            }
            Node::ByHash => Err(Errno::EBUSY),
            _ => Err(Errno::ENOTDIR),
        }
    }

    /// unlink: deletes the key; a writer that has it open stores nothing when it closes.
    pub(super) fn unlink_node(&self, node: &Node) -> Result<(), Errno> {
        match node {
            Node::File { ns, key } => {
                let ino = self.inodes().find(node);
                let writing = ino.is_some_and(|i| self.has_writer(i));
                let deleted = self.store.delete(ns, key, self.opts.durability).map_err(|e| store_errno(&e))?;
                if let Some(ino) = ino {
                    self.orphan_writers(ino);
                }
                self.inodes().unlink(node);
                if deleted || writing {
                    Ok(())
                } else {
                    Err(Errno::ENOENT)
                }
            }
            Node::Hash { .. } => Err(Errno::EROFS),
            Node::Stats => Err(Errno::EPERM),
            _ => Err(Errno::EISDIR),
        }
    }

    /// rename: within a namespace a link record names the stored block under the new key (no
    /// byte is read or rewritten) and the old key goes; across namespaces the bytes are stored
    /// again (content is per namespace). A file being written moves with its writers: they store
    /// under the new name when they close, and nothing they hold is stored by the rename. Writers
    /// of a file the rename replaces store nothing.
    pub(super) fn rename_node(&self, from: &Node, to: &Node, flags: RenameFlags) -> Result<(), Errno> {
        let (from_name, to_name) = match (from, to) {
            (Node::File { ns, key }, Node::File { ns: ns2, key: key2 }) => {
                ((ns.clone(), key.clone()), (ns2.clone(), key2.clone()))
            }
            (Node::File { .. }, _) => return Err(Errno::EISDIR),
            _ => return Err(Errno::EPERM),
        };
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return Err(Errno::EINVAL);
        }
        let writing = |node: &Node| self.inodes().find(node).is_some_and(|i| self.has_writer(i));
        let target_exists = self.store.contains(&to_name.0, &to_name.1).map_err(|e| store_errno(&e))? || writing(to);
        if flags.contains(RenameFlags::RENAME_NOREPLACE) && target_exists {
            return Err(Errno::EEXIST);
        }
        if from_name == to_name {
            return Ok(());
        }
        let published = self.store.contains(&from_name.0, &from_name.1).map_err(|e| store_errno(&e))?;
        if !published && !writing(from) {
            return Err(Errno::ENOENT);
        }
        if published {
            if from_name.0 == to_name.0 {
                match self.store.rename(&from_name.0, &from_name.1, &to_name.1, self.opts.durability) {
                    Ok(true) => {}
                    Ok(false) => return Err(Errno::ENOENT),
                    Err(e) => return Err(store_errno(&e)),
                }
            } else {
                self.copy_then_delete(&from_name, &to_name)?;
            }
        } else {
            // Only a writer holds the file: the target name must not keep an older version.
            self.store.delete(&to_name.0, &to_name.1, self.opts.durability).map_err(|e| store_errno(&e))?;
        }
        if let Some(replaced) = self.inodes().find(to) {
            self.orphan_writers(replaced);
        }
        self.inodes().rename(from, to.clone());
        Ok(())
    }

    /// A rename across namespaces: the bytes are stored again under the new name (which appears
    /// whole when the put returns), then the old name goes.
    fn copy_then_delete(&self, from: &Name, to: &Name) -> Result<(), Errno> {
        // The stored form, moved as it is (a compressed block is not decoded and compressed again).
        let block = match self.store.get_frame(&from.0, &from.1, ReadOptions::default()) {
            Ok(Some(b)) => b,
            Ok(None) => return Err(Errno::ENOENT),
            Err(e) => return Err(store_errno(&e)),
        };
        let meta = &block.meta;
        let compressed = !meta.compression.is_none();
        let opts = PutOptions {
            durability: self.opts.durability,
            ttl_secs: (meta.ttl_secs > 0).then_some(meta.ttl_secs),
            group: meta.group_id,
            parent: meta.parent_hash,
            desc: Some(meta.desc.clone()),
            compression: compressed.then(|| meta.compression.clone()),
            raw: compressed.then_some((meta.raw_len, meta.content_hash)),
            codec: None,
        };
        self.store.put(&to.0, &to.1, &block, &opts).map_err(|e| store_errno(&e))?;
        drop(block);
        self.store.delete(&from.0, &from.1, self.opts.durability).map_err(|e| store_errno(&e))?;
        Ok(())
    }
}
