//! The slot map: which node owns each of the 16384 slots, read from a small text file that every
//! node and the operator share (docs/cluster.md):
//!
//! ```text
//! # comments and blank lines are ignored
//! epoch 2
//! node 10.0.0.1:6379 0-5460
//! node 10.0.0.2:6379 5461-10922
//! node kv3.example:6379 10923-16383 id=3f1c0e3a1f4b2a9c8d7e6f5a4b3c2d1e0f9a8b7c
//! ```
//!
//! `node HOST:PORT [RANGE...] [id=ID]`: ranges are `FIRST-LAST` or one slot, separated by
//! spaces or commas; a node without ranges owns nothing (every key sent to it is redirected). The
//! ID (40 hex digits, as Redis node IDs) defaults to one derived from the address. `epoch N`
//! (default 0) is the map's version: raise it with every change so that `kvhoard cluster status`
//! can tell which nodes run which map.
//!
//! A map is only accepted whole: every slot owned by exactly one node, no address or ID twice.
//! A partial map would make Redis Cluster clients (which check coverage by default) refuse the
//! whole cluster, so it is an error here rather than at the client.

use std::net::{IpAddr, SocketAddr};

use thiserror::Error;

use super::slots::SLOTS;

/// Why a slot map was refused.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum MapError {
    /// A line that does not parse.
    #[error("line {line}: {why}: {text:?}")]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// The offending text.
        text: String,
        /// What was expected.
        why: String,
    },
    /// A slot number of 16384 or more.
    #[error("line {line}: slot {slot} is out of range (slots are 0-16383)")]
    SlotOutOfRange {
        /// 1-based line number.
        line: usize,
        /// The slot.
        slot: u64,
    },
    /// Two nodes claim the same slot.
    #[error("slot {slot} is given to both {first} and {second}")]
    Overlap {
        /// The slot.
        slot: u16,
        /// The node that claimed it first.
        first: String,
        /// The node that claimed it again.
        second: String,
    },
    /// Slots no node owns.
    #[error("{count} slot(s) are assigned to no node ({ranges}); every slot 0-16383 needs an owner")]
    Uncovered {
        /// How many.
        count: usize,
        /// Which, as ranges (the first few).
        ranges: String,
    },
    /// The same address twice.
    #[error("line {line}: node {addr} appears twice")]
    DuplicateNode {
        /// 1-based line number of the second one.
        line: usize,
        /// The address.
        addr: String,
    },
    /// The same ID for two nodes.
    #[error("node ID {id} is used by two nodes")]
    DuplicateId {
        /// The ID.
        id: String,
    },
    /// A map without nodes.
    #[error("the map names no node")]
    NoNodes,
    /// More nodes than slots.
    #[error("{count} nodes are more than there are slots ({SLOTS})")]
    TooManyNodes {
        /// How many.
        count: usize,
    },
    /// This node's address is not in the map.
    #[error(
        "this node ({addr}) is not in the cluster map; name it there, or say which entry it is with --cluster-announce"
    )]
    NotInMap {
        /// The address looked for.
        addr: String,
    },
    /// Several entries could be this node.
    #[error("several nodes in the cluster map use port {port}; say which one this node is with --cluster-announce HOST:PORT")]
    Ambiguous {
        /// The port.
        port: u16,
    },
}

/// One node of the map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Host as clients reach it: an IP address (IPv6 without brackets) or a name.
    pub host: String,
    /// RESP port.
    pub port: u16,
    /// 40 lowercase hex digits.
    pub id: String,
}

impl Node {
    /// `HOST:PORT` as the map file writes it (`[V6]:PORT` for IPv6).
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `HOST:PORT` as Redis writes it in a MOVED error (no brackets, even for IPv6: clients
    /// split at the last colon).
    pub fn endpoint(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// The slot map. Every slot has an owner.
#[derive(Clone, PartialEq, Eq)]
pub struct SlotMap {
    epoch: u64,
    nodes: Vec<Node>,
    /// Index into `nodes` per slot; `SLOTS` entries.
    owner: Vec<u16>,
}

impl std::fmt::Debug for SlotMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // 16384 owners would drown any log line; the runs say the same.
        f.debug_struct("SlotMap")
            .field("epoch", &self.epoch)
            .field("nodes", &self.nodes)
            .field("runs", &self.runs())
            .finish()
    }
}

impl SlotMap {
    /// Parses and validates a map file's text.
    pub fn parse(text: &str) -> Result<SlotMap, MapError> {
        let mut epoch = 0;
        let mut nodes: Vec<Node> = Vec::new();
        let mut owner: Vec<Option<u16>> = vec![None; usize::from(SLOTS)];
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.split('#').next().unwrap_or_default().trim();
            let mut words = content.split_whitespace();
            match words.next() {
                None => {}
                Some("epoch") => epoch = parse_epoch(line, content, words.collect())?,
                Some("node") => {
                    let (node, ranges) = parse_node(line, content, words)?;
                    if nodes.iter().any(|n| same_addr(n, &node.host, node.port)) {
                        return Err(MapError::DuplicateNode { line, addr: node.addr() });
                    }
                    let index = u16::try_from(nodes.len())
                        .ok()
                        .filter(|&n| n < SLOTS)
                        .ok_or(MapError::TooManyNodes { count: nodes.len() + 1 })?;
                    claim(&mut owner, &nodes, &node, index, &ranges)?;
                    nodes.push(node);
                }
                Some(_) => return Err(syntax(line, content, "expected `epoch N` or `node HOST:PORT [RANGE...]`")),
            }
        }
        SlotMap::complete(epoch, nodes, owner)
    }

    /// A map giving `addrs` (each `HOST:PORT`) equal shares of the slots in order, as
    /// `redis-cli --cluster create` divides them (3 nodes: 0-5460, 5461-10922, 10923-16383).
    pub fn balanced(addrs: &[String], epoch: u64) -> Result<SlotMap, MapError> {
        let count = addrs.len();
        if count == 0 {
            return Err(MapError::NoNodes);
        }
        if count > usize::from(SLOTS) {
            return Err(MapError::TooManyNodes { count });
        }
        let mut nodes: Vec<Node> = Vec::with_capacity(count);
        for (i, addr) in addrs.iter().enumerate() {
            let (host, port) = parse_addr(addr.trim()).map_err(|why| syntax(i + 1, addr, &why))?;
            if nodes.iter().any(|n| same_addr(n, &host, port)) {
                return Err(MapError::DuplicateNode { line: i + 1, addr: addr.clone() });
            }
            let id = derived_id(&host, port);
            nodes.push(Node { host, port, id });
        }
        let mut owner = vec![0u16; usize::from(SLOTS)];
        let (n, total) = (count as u64, u64::from(SLOTS));
        let mut first = 0u64;
        for i in 0..n {
            // lround(i * total / n + total / n - 1), in integers: the last slot of node i.
            let last = if i + 1 == n { total - 1 } else { ((2 * ((i + 1) * total - n) + n) / (2 * n)).max(first) };
            for slot in owner.iter_mut().take(last as usize + 1).skip(first as usize) {
                *slot = i as u16;
            }
            first = last + 1;
        }
        Ok(SlotMap { epoch, nodes, owner })
    }

    /// A map for `addrs` that moves as few slots as possible from this one: nodes that stay keep
    /// their slots up to an equal share; the slots of nodes that leave, and those above a
    /// node's share, go to the nodes below theirs. Adding a fourth node to three moves a quarter
    /// of the slots, all to it; removing one moves only its own.
    pub fn rebalanced(&self, addrs: &[String], epoch: u64) -> Result<SlotMap, MapError> {
        let fresh = SlotMap::balanced(addrs, epoch)?;
        // Nodes keep the IDs this map gave them.
        let nodes: Vec<Node> = fresh
            .nodes
            .into_iter()
            .map(|n| self.nodes.iter().find(|o| same_addr(o, &n.host, n.port)).cloned().unwrap_or(n))
            .collect();
        let count = nodes.len();
        let new_index = |old: usize| {
            let o = self.nodes.get(old)?;
            nodes.iter().position(|n| same_addr(n, &o.host, o.port)).and_then(|i| u16::try_from(i).ok())
        };
        let mut owner: Vec<Option<u16>> = self.owner.iter().map(|&o| new_index(usize::from(o))).collect();
        let mut held = vec![0usize; count];
        for o in owner.iter().flatten() {
            if let Some(h) = held.get_mut(usize::from(*o)) {
                *h += 1;
            }
        }
        // Equal shares; the extra slots (16384 % count) go to the nodes holding most already.
        let mut order: Vec<usize> = (0..count).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(held.get(i).copied().unwrap_or(0)));
        let mut target = vec![usize::from(SLOTS) / count; count];
        for &i in order.iter().take(usize::from(SLOTS) % count) {
            if let Some(t) = target.get_mut(i) {
                *t += 1;
            }
        }
        // Release what is above a share, from the highest slots down.
        for entry in owner.iter_mut().rev() {
            let Some(o) = *entry else { continue };
            let i = usize::from(o);
            if held.get(i) > target.get(i) {
                if let Some(h) = held.get_mut(i) {
                    *h -= 1;
                }
                *entry = None;
            }
        }
        // Hand free slots, lowest first, to the nodes below their share, in the map's order.
        let below: Vec<usize> = (0..count).filter(|&i| held.get(i) < target.get(i)).collect();
        let mut takers = below.into_iter().peekable();
        for entry in owner.iter_mut().filter(|e| e.is_none()) {
            while takers.peek().is_some_and(|&i| held.get(i) >= target.get(i)) {
                takers.next();
            }
            let Some(&i) = takers.peek() else { break };
            *entry = u16::try_from(i).ok();
            if let Some(h) = held.get_mut(i) {
                *h += 1;
            }
        }
        SlotMap::complete(epoch, nodes, owner)
    }

    /// Slots whose owner differs between this map and `other` (compared by address).
    pub fn moved_slots(&self, other: &SlotMap) -> usize {
        (0..SLOTS)
            .filter(|&s| match (self.owner_node(s), other.owner_node(s)) {
                (Some(a), Some(b)) => !same_addr(a, &b.host, b.port),
                _ => true,
            })
            .count()
    }

    fn complete(epoch: u64, nodes: Vec<Node>, owner: Vec<Option<u16>>) -> Result<SlotMap, MapError> {
        if nodes.is_empty() {
            return Err(MapError::NoNodes);
        }
        for (i, a) in nodes.iter().enumerate() {
            if nodes.iter().skip(i + 1).any(|b| b.id == a.id) {
                return Err(MapError::DuplicateId { id: a.id.clone() });
            }
        }
        let missing: Vec<u16> = (0..SLOTS).filter(|&s| owner.get(usize::from(s)).is_none_or(Option::is_none)).collect();
        if !missing.is_empty() {
            let runs = runs_of(&missing);
            let shown: Vec<String> = runs.iter().take(8).map(|&(a, b)| range_text(a, b)).collect();
            let more = if runs.len() > 8 { ", ..." } else { "" };
            return Err(MapError::Uncovered { count: missing.len(), ranges: format!("{}{more}", shown.join(", ")) });
        }
        let owner = owner.into_iter().map(Option::unwrap_or_default).collect();
        Ok(SlotMap { epoch, nodes, owner })
    }

    /// The map's version.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The nodes, in the file's order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The index (into [`SlotMap::nodes`]) of the node owning `slot`.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        self.owner.get(usize::from(slot)).map(|&i| usize::from(i))
    }

    /// The node owning `slot`.
    pub fn owner_node(&self, slot: u16) -> Option<&Node> {
        self.owner(slot).and_then(|i| self.nodes.get(i))
    }

    /// Contiguous runs of slots with one owner, in slot order: `(first, last, node index)`.
    pub fn runs(&self) -> Vec<(u16, u16, usize)> {
        let mut runs: Vec<(u16, u16, usize)> = Vec::new();
        for (slot, &node) in (0..SLOTS).zip(&self.owner) {
            match runs.last_mut() {
                Some((_, last, n)) if *n == usize::from(node) && *last + 1 == slot => *last = slot,
                _ => runs.push((slot, slot, usize::from(node))),
            }
        }
        runs
    }

    /// The ranges node `index` owns, in slot order.
    pub fn ranges_of(&self, index: usize) -> Vec<(u16, u16)> {
        self.runs().into_iter().filter(|r| r.2 == index).map(|(a, b, _)| (a, b)).collect()
    }

    /// How many slots node `index` owns.
    pub fn slot_count(&self, index: usize) -> usize {
        self.owner.iter().filter(|&&o| usize::from(o) == index).count()
    }

    /// The node whose address is `addr` (`HOST:PORT` or `[V6]:PORT`; hosts compare without case).
    pub fn find(&self, addr: &str) -> Result<usize, MapError> {
        let not_in = || MapError::NotInMap { addr: addr.to_string() };
        let (host, port) = parse_addr(addr).map_err(|_| not_in())?;
        self.nodes.iter().position(|n| same_addr(n, &host, port)).ok_or_else(not_in)
    }

    /// The node a RESP listener bound to `listener` is: the entry with its IP and port, or else
    /// the only entry with its port (a listener on 0.0.0.0, or a map naming hosts by name).
    pub fn find_listener(&self, listener: SocketAddr) -> Result<usize, MapError> {
        let exact = self
            .nodes
            .iter()
            .position(|n| n.port == listener.port() && n.host.parse::<IpAddr>().is_ok_and(|ip| ip == listener.ip()));
        if let Some(i) = exact {
            return Ok(i);
        }
        let mut same_port = self.nodes.iter().enumerate().filter(|(_, n)| n.port == listener.port());
        match (same_port.next(), same_port.next()) {
            (Some((i, _)), None) => Ok(i),
            (None, _) => Err(MapError::NotInMap { addr: listener.to_string() }),
            (Some(_), Some(_)) => Err(MapError::Ambiguous { port: listener.port() }),
        }
    }

    /// The map as its file's text, in canonical form (parsing it gives this map back).
    pub fn render(&self) -> String {
        let mut out = format!(
            "# kvhoard cluster map: {} node(s), {SLOTS} slots (docs/cluster.md)\nepoch {}\n",
            self.nodes.len(),
            self.epoch
        );
        for (i, node) in self.nodes.iter().enumerate() {
            out.push_str("node ");
            out.push_str(&node.addr());
            for (a, b) in self.ranges_of(i) {
                out.push(' ');
                out.push_str(&range_text(a, b));
            }
            if node.id != derived_id(&node.host, node.port) {
                out.push_str(" id=");
                out.push_str(&node.id);
            }
            out.push('\n');
        }
        out
    }

    /// A short fingerprint of the map (16 hex digits): two nodes with the same digest route every
    /// key the same way.
    pub fn digest(&self) -> String {
        let text = self.render();
        let body = text.split_once('\n').map_or(text.as_str(), |(_, rest)| rest);
        format!("{:016x}", fnv1a(0, body.as_bytes()))
    }
}

fn syntax(line: usize, text: &str, why: &str) -> MapError {
    MapError::Syntax { line, text: text.to_string(), why: why.to_string() }
}

fn parse_epoch(line: usize, content: &str, words: Vec<&str>) -> Result<u64, MapError> {
    match words.as_slice() {
        [n] => n.parse().map_err(|_| syntax(line, content, "the epoch must be a whole number")),
        _ => Err(syntax(line, content, "expected `epoch N`")),
    }
}

fn parse_node<'a>(
    line: usize,
    content: &str,
    mut words: impl Iterator<Item = &'a str>,
) -> Result<(Node, Vec<(u16, u16)>), MapError> {
    let addr = words.next().ok_or_else(|| syntax(line, content, "expected `node HOST:PORT [RANGE...]`"))?;
    let (host, port) = parse_addr(addr).map_err(|why| syntax(line, content, &why))?;
    let mut id = None;
    let mut ranges = Vec::new();
    for word in words.flat_map(|w| w.split(',')).filter(|w| !w.is_empty()) {
        if let Some(given) = word.strip_prefix("id=") {
            if given.len() != 40 || !given.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(syntax(line, content, "a node ID is 40 hex digits"));
            }
            id = Some(given.to_ascii_lowercase());
            continue;
        }
        ranges.push(parse_range(line, content, word)?);
    }
    let id = id.unwrap_or_else(|| derived_id(&host, port));
    Ok((Node { host, port, id }, ranges))
}

fn parse_range(line: usize, content: &str, word: &str) -> Result<(u16, u16), MapError> {
    let (a, b) = word.split_once('-').unwrap_or((word, word));
    let number =
        |s: &str| s.parse::<u64>().map_err(|_| syntax(line, content, "a slot range is FIRST-LAST or one slot"));
    let (a, b) = (number(a)?, number(b)?);
    for slot in [a, b] {
        if slot >= u64::from(SLOTS) {
            return Err(MapError::SlotOutOfRange { line, slot });
        }
    }
    if a > b {
        return Err(syntax(line, content, "a range's first slot must not be after its last"));
    }
    // Both are below SLOTS, checked above.
    Ok((a as u16, b as u16))
}

/// Gives node `index` its ranges, refusing a slot another node already has.
fn claim(
    owner: &mut [Option<u16>],
    nodes: &[Node],
    node: &Node,
    index: u16,
    ranges: &[(u16, u16)],
) -> Result<(), MapError> {
    for &(a, b) in ranges {
        for slot in a..=b {
            let Some(entry) = owner.get_mut(usize::from(slot)) else { continue };
            match *entry {
                Some(prev) => {
                    let first = nodes.get(usize::from(prev)).map_or_else(|| node.addr(), Node::addr);
                    return Err(MapError::Overlap { slot, first, second: node.addr() });
                }
                None => *entry = Some(index),
            }
        }
    }
    Ok(())
}

/// `HOST:PORT` or `[V6]:PORT` into host (without brackets) and port.
pub(crate) fn parse_addr(addr: &str) -> Result<(String, u16), String> {
    let bad = || format!("{addr:?} is not HOST:PORT (or [IPv6]:PORT)");
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (host, port) = rest.split_once("]:").ok_or_else(bad)?;
        (host, port)
    } else {
        let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
        if host.contains(':') {
            return Err(format!("{addr:?}: write an IPv6 address in brackets, [ADDR]:PORT"));
        }
        (host, port)
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '#' || c == ',') {
        return Err(bad());
    }
    let port: u16 =
        port.parse().ok().filter(|&p| p > 0).ok_or_else(|| format!("{addr:?}: the port must be 1-65535"))?;
    Ok((host.to_string(), port))
}

fn same_addr(node: &Node, host: &str, port: u16) -> bool {
    node.port == port && node.host.eq_ignore_ascii_case(host)
}

/// Contiguous runs of sorted slots.
fn runs_of(slots: &[u16]) -> Vec<(u16, u16)> {
    let mut runs: Vec<(u16, u16)> = Vec::new();
    for &s in slots {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == s => *last = s,
            _ => runs.push((s, s)),
        }
    }
    runs
}

fn range_text(a: u16, b: u16) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}-{b}")
    }
}

/// FNV-1a, 64 bits, from the standard offset basis mixed with `seed`. Stable across platforms
/// and releases, unlike `std`'s hasher: node IDs and digests must not change under an upgrade.
fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325 ^ seed, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// splitmix64's finalizer: FNV words from nearby seeds differ in a few bits only, and IDs that
/// look alike are hard to tell apart in `CLUSTER NODES`.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A node ID (40 hex digits) derived from its address, so that every node and tool agrees on it
/// without it being written down.
pub(crate) fn derived_id(host: &str, port: u16) -> String {
    let name = format!("kvhoard-node {}:{port}", host.to_ascii_lowercase());
    let words = [1, 2, 3].map(|seed| mix(fnv1a(seed, name.as_bytes())));
    let hex = format!("{:016x}{:016x}{:016x}", words[0], words[1], words[2]);
    hex.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;

    const THREE: &str =
        "epoch 7\nnode 127.0.0.1:7001 0-5460\nnode 127.0.0.1:7002 5461-10922\nnode 127.0.0.1:7003 10923-16383\n";

    #[test]
    fn a_map_file_parses_and_routes_every_slot() {
        let map = SlotMap::parse(THREE).unwrap();
        assert_eq!(map.epoch(), 7);
        assert_eq!(map.nodes().len(), 3);
        assert_eq!(map.owner_node(0).unwrap().addr(), "127.0.0.1:7001");
        assert_eq!(map.owner_node(5461).unwrap().port, 7002);
        assert_eq!(map.owner_node(16383).unwrap().port, 7003);
        assert_eq!(map.runs(), vec![(0, 5460, 0), (5461, 10922, 1), (10923, 16383, 2)]);
        assert_eq!(map.slot_count(1), 5462);
        assert_eq!(SlotMap::parse(&map.render()).unwrap(), map, "render is parsed back to the same map");
    }

    #[test]
    fn balanced_maps_divide_slots_as_redis_cli_does() {
        let addrs: Vec<String> = (1..=3).map(|i| format!("127.0.0.1:700{i}")).collect();
        let map = SlotMap::balanced(&addrs, 1).unwrap();
        assert_eq!(map.runs(), vec![(0, 5460, 0), (5461, 10922, 1), (10923, 16383, 2)]);
        for n in [1usize, 2, 5, 7, 100, 1000, 16384] {
            let addrs: Vec<String> = (0..n).map(|i| format!("h{i}:6379")).collect();
            let map = SlotMap::balanced(&addrs, 0).unwrap();
            let counts: Vec<usize> = (0..n).map(|i| map.slot_count(i)).collect();
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(max - min <= 1, "{n} nodes: {min}..{max} slots each");
            assert_eq!(counts.iter().sum::<usize>(), 16384);
        }
        assert_eq!(SlotMap::balanced(&[], 0), Err(MapError::NoNodes));
    }

    #[test]
    fn rebalancing_moves_only_what_it_must() {
        let addrs = |n: usize| (1..=n).map(|i| format!("10.0.0.{i}:6379")).collect::<Vec<_>>();
        let three = SlotMap::balanced(&addrs(3), 1).unwrap();
        let four = three.rebalanced(&addrs(4), 2).unwrap();
        assert_eq!(four.epoch(), 2);
        assert_eq!((0..4).map(|i| four.slot_count(i)).collect::<Vec<_>>(), vec![4096; 4]);
        assert_eq!(three.moved_slots(&four), 4096, "only the new node's share moves");
        let back = four.rebalanced(&addrs(3), 3).unwrap();
        assert_eq!(four.moved_slots(&back), 4096, "only the removed node's slots move");
        let counts: Vec<usize> = (0..3).map(|i| back.slot_count(i)).collect();
        assert!(counts.iter().all(|&c| c == 5461 || c == 5462), "{counts:?}");
        // Keeping the same nodes moves nothing; a node leaving the middle keeps the others' slots.
        assert_eq!(three.moved_slots(&three.rebalanced(&addrs(3), 1).unwrap()), 0);
        let without_second: Vec<String> = vec![addrs(3)[0].clone(), addrs(3)[2].clone()];
        let two = three.rebalanced(&without_second, 2).unwrap();
        assert_eq!(three.moved_slots(&two), 5462);
        let hundred = SlotMap::balanced(&addrs(100), 1).unwrap();
        let more = hundred.rebalanced(&addrs(101), 2).unwrap();
        assert!(hundred.moved_slots(&more) <= 163, "{} slots moved", hundred.moved_slots(&more));
    }

    #[test]
    fn comments_ranges_lists_ids_and_ipv6() {
        let text = "# a map\n\nnode [::1]:7001 0-100,101 102-16383 # the rest\nnode h2:7002 id=00112233445566778899AABBCCDDEEFF00112233\n";
        let map = SlotMap::parse(text).unwrap();
        let first = &map.nodes()[0];
        assert_eq!((first.host.as_str(), first.port), ("::1", 7001));
        assert_eq!(first.addr(), "[::1]:7001");
        assert_eq!(first.endpoint(), "::1:7001");
        assert_eq!(map.nodes()[1].id, "00112233445566778899aabbccddeeff00112233");
        assert_eq!(map.slot_count(1), 0, "a node may own nothing");
        assert_eq!(SlotMap::parse(&map.render()).unwrap(), map);
    }

    #[test]
    fn bad_maps_are_refused_with_what_is_wrong() {
        let err = |t: &str| SlotMap::parse(t).unwrap_err().to_string();
        assert_eq!(err(""), "the map names no node");
        assert!(err("node a:1 0-100").starts_with("16283 slot(s) are assigned to no node (101-16383)"));
        assert!(err("node a:1 0-16383\nnode b:2 5").contains("slot 5 is given to both a:1 and b:2"));
        assert!(err("node a:1 0-16384").contains("line 1: slot 16384 is out of range"));
        assert!(err("node a:1 10-5").contains("first slot must not be after its last"));
        assert!(err("node a:1 0-16383\nnode A:1").contains("line 2: node A:1 appears twice"));
        assert!(err("node a 0-16383").contains("is not HOST:PORT"));
        assert!(err("node a:0 0-16383").contains("the port must be 1-65535"));
        assert!(err("node ::1:5 0-16383").contains("in brackets"));
        assert!(err("nodes a:1 0-16383").contains("line 1: expected `epoch N`"));
        assert!(err("epoch x\nnode a:1 0-16383").contains("whole number"));
        assert!(err("node a:1 0-16383 id=xyz").contains("40 hex digits"));
        let same = "node a:1 0-8000 id=0000000000000000000000000000000000000001\nnode b:1 8001-16383 id=0000000000000000000000000000000000000001";
        assert!(err(same).contains("used by two nodes"));
    }

    #[test]
    fn this_node_is_found_by_address_or_by_its_only_port() {
        let map = SlotMap::parse(THREE).unwrap();
        assert_eq!(map.find("127.0.0.1:7002"), Ok(1));
        assert!(map.find("127.0.0.1:9999").is_err());
        assert_eq!(map.find_listener("127.0.0.1:7003".parse().unwrap()), Ok(2));
        assert_eq!(map.find_listener("0.0.0.0:7001".parse().unwrap()), Ok(0));
        let named = SlotMap::parse("node a:6379 0-8000\nnode b:6379 8001-16383").unwrap();
        assert_eq!(named.find_listener("0.0.0.0:6379".parse().unwrap()), Err(MapError::Ambiguous { port: 6379 }));
        assert!(matches!(named.find_listener("0.0.0.0:1".parse().unwrap()), Err(MapError::NotInMap { .. })));
    }

    #[test]
    fn ids_and_digests_are_stable() {
        let id = derived_id("127.0.0.1", 7001);
        assert_eq!(id.len(), 40);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(id, derived_id("127.0.0.1", 7001));
        assert_ne!(id, derived_id("127.0.0.1", 7002));
        let a = SlotMap::parse(THREE).unwrap();
        let b = SlotMap::parse(&THREE.replace("5460", "5459").replace("5461", "5460")).unwrap();
        assert_ne!(a.digest(), b.digest());
        assert_eq!(a.digest(), SlotMap::parse(&a.render()).unwrap().digest());
    }
}
