//! Inode numbers for what the kernel has looked up, and what each stands for.
//!
//! Fixed numbers for the root, `/.by-hash` and `/.stats`; every other node gets a number at
//! lookup and gives it back when the kernel forgets it, so the table holds only what the kernel
//! holds, however many keys the volume has.

use std::collections::HashMap;

use fuser::INodeNo;

/// The root directory.
pub const ROOT: INodeNo = INodeNo(1);
/// `/.by-hash`.
pub const BY_HASH: INodeNo = INodeNo(2);
/// `/.stats`.
pub const STATS: INodeNo = INodeNo(3);
const FIRST_DYNAMIC: u64 = 16;

/// What an inode stands for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Node {
    /// `/`.
    Root,
    /// `/.by-hash`.
    ByHash,
    /// `/.stats`.
    Stats,
    /// `/<namespace>`.
    Namespace(String),
    /// `/<namespace>/<name>`: a key.
    File {
        /// Namespace.
        ns: String,
        /// Key (unescaped).
        key: String,
    },
    /// `/.by-hash/<hex>`: a stored block, found in `ns`.
    Hash {
        /// A namespace holding it.
        ns: String,
        /// Its blake3 content hash.
        hash: [u8; 32],
    },
}

/// The table.
#[derive(Debug)]
pub struct Inodes {
    next: u64,
    nodes: HashMap<u64, (Node, u64)>,
    numbers: HashMap<Node, u64>,
}

impl Default for Inodes {
    fn default() -> Self {
        Inodes { next: FIRST_DYNAMIC, nodes: HashMap::new(), numbers: HashMap::new() }
    }
}

impl Inodes {
    /// What `ino` stands for.
    pub fn get(&self, ino: u64) -> Option<&Node> {
        match ino {
            1 => Some(&Node::Root),
            2 => Some(&Node::ByHash),
            3 => Some(&Node::Stats),
            _ => self.nodes.get(&ino).map(|(n, _)| n),
        }
    }

    /// The number of `node` if the kernel holds it.
    pub fn find(&self, node: &Node) -> Option<u64> {
        match node {
            Node::Root => Some(ROOT.0),
            Node::ByHash => Some(BY_HASH.0),
            Node::Stats => Some(STATS.0),
            _ => self.numbers.get(node).copied(),
        }
    }

    /// The number of `node`, counting one more lookup by the kernel.
    pub fn lookup(&mut self, node: Node) -> u64 {
        if let Some(ino) = self.find(&node) {
            if let Some((_, n)) = self.nodes.get_mut(&ino) {
                *n += 1;
            }
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.numbers.insert(node.clone(), ino);
        self.nodes.insert(ino, (node, 1));
        ino
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub fn forget(&mut self, ino: u64, n: u64) {
        let gone = match self.nodes.get_mut(&ino) {
            Some((_, count)) => {
                *count = count.saturating_sub(n);
                *count == 0
            }
            None => false,
        };
        if gone {
            if let Some((node, _)) = self.nodes.remove(&ino) {
                // The name may have moved on to another inode since (a rename replaced this
                // file): only this inode's own mapping goes.
                if self.numbers.get(&node) == Some(&ino) {
                    self.numbers.remove(&node);
                }
            }
        }
    }

    /// `node` was deleted: its name no longer leads to its inode (which answers for what it was
    /// until the kernel forgets it: open files of a deleted file), so a new file of that name
    /// gets a new inode.
    pub fn unlink(&mut self, node: &Node) {
        self.numbers.remove(node);
    }

    /// `from` is now called `to` (a rename): its inode follows it; an inode `to` had is dropped
    /// from the name map (it keeps answering for what it was until the kernel forgets it).
    pub fn rename(&mut self, from: &Node, to: Node) {
        self.numbers.remove(&to);
        if let Some(ino) = self.numbers.remove(from) {
            if let Some((node, _)) = self.nodes.get_mut(&ino) {
                *node = to.clone();
            }
            self.numbers.insert(to, ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_live_while_the_kernel_holds_them() {
        let mut t = Inodes::default();
        let f = Node::File { ns: "default".into(), key: "a".into() };
        let ino = t.lookup(f.clone());
        assert_eq!(t.lookup(f.clone()), ino);
        t.forget(ino, 1);
        assert_eq!(t.get(ino), Some(&f));
        t.forget(ino, 1);
        assert_eq!(t.get(ino), None);
        assert_eq!(t.find(&f), None);
        let ino = t.lookup(f.clone());
        let g = Node::File { ns: "default".into(), key: "b".into() };
        t.rename(&f, g.clone());
        assert_eq!(t.get(ino), Some(&g));
        assert_eq!(t.find(&g), Some(ino));
        assert_eq!(t.find(&f), None);
    }

    #[test]
    fn forgetting_a_replaced_inode_leaves_the_name_with_its_new_inode() {
        // `mv a.tmp a` over an existing `a`: the old `a` inode is forgotten after the rename, and
        // must not take the name `a` away from the inode that now holds it (found as writes
        // through a later `mv a b` landing on the key `a`).
        let mut t = Inodes::default();
        let a = Node::File { ns: "default".into(), key: "a".into() };
        let tmp = Node::File { ns: "default".into(), key: "a.tmp".into() };
        let old = t.lookup(a.clone());
        let new = t.lookup(tmp.clone());
        t.rename(&tmp, a.clone());
        t.forget(old, 1);
        assert_eq!(t.find(&a), Some(new));
        let b = Node::File { ns: "default".into(), key: "b".into() };
        t.rename(&a, b.clone());
        assert_eq!(t.get(new), Some(&b));
    }
}
