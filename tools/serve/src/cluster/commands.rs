//! The cluster commands, with the fields and shapes Redis 7 replies with, since clients index
//! into them: redis-py's `RedisCluster` builds its routing table from `CLUSTER SLOTS` (start,
//! end, then `[host, port, id, metadata]` per node) and finds a command's keys from `COMMAND`;
//! `redis-cli -c` follows `-MOVED SLOT HOST:PORT`. Also READONLY, READWRITE and ASKING
//! (accepted: there are no replicas and no migrations to distinguish), and the routing of keyed
//! commands: `-MOVED` for a slot another node owns, `-CROSSSLOT` for keys in several slots.

use super::{keyslot, ClusterConfig, Live, SLOTS};
use std::sync::atomic::Ordering;

/// What the cluster layer answered in place of the command.
pub(crate) struct Answer {
    /// The reply's bytes.
    pub bytes: Vec<u8>,
    /// False for an error reply (counted as a failed request).
    pub ok: bool,
}

/// A reply value; encoded for RESP2 (maps as flat arrays) or RESP3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `:N`.
    Int(i64),
    /// `$LEN` and the bytes.
    Bulk(Vec<u8>),
    /// `+TEXT`.
    Simple(&'static str),
    /// `*N` and the elements.
    Array(Vec<Value>),
    /// `%N` and the pairs in RESP3, `*2N` in RESP2.
    Map(Vec<(Value, Value)>),
}

impl Value {
    fn text(s: &str) -> Value {
        Value::Bulk(s.as_bytes().to_vec())
    }

    /// The value's bytes for protocol version `proto` (2 or 3).
    pub fn encode(&self, proto: u8) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(proto, &mut out);
        out
    }

    fn encode_into(&self, proto: u8, out: &mut Vec<u8>) {
        match self {
            Value::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
            Value::Bulk(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Value::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Value::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for item in items {
                    item.encode_into(proto, out);
                }
            }
            Value::Map(pairs) => {
                let head =
                    if proto == 3 { format!("%{}\r\n", pairs.len()) } else { format!("*{}\r\n", pairs.len() * 2) };
                out.extend_from_slice(head.as_bytes());
                for (k, v) in pairs {
                    k.encode_into(proto, out);
                    v.encode_into(proto, out);
                }
            }
        }
    }
}

fn error(s: &str) -> Answer {
    Answer { bytes: format!("-{s}\r\n").into_bytes(), ok: false }
}

fn reply(v: Value, proto: u8) -> Answer {
    Answer { bytes: v.encode(proto), ok: true }
}

const DISABLED: &str = "ERR This instance has cluster support disabled";

/// Answers `name` (upper case) if the cluster layer handles it: CLUSTER, READONLY, READWRITE,
/// ASKING, and any keyed command whose keys this node does not serve. `None`: serve it as usual.
pub(crate) fn answer(name: &str, args: &[&[u8]], proto: u8, live: &Live) -> Option<Answer> {
    let config = live.config();
    match (name, config) {
        ("CLUSTER", Some(c)) => Some(cluster(&c, args, proto)),
        ("READONLY" | "READWRITE" | "ASKING", Some(_)) => Some(Answer { bytes: b"+OK\r\n".to_vec(), ok: true }),
        ("CLUSTER" | "READONLY" | "READWRITE" | "ASKING", None) => Some(error(DISABLED)),
        (_, Some(c)) => {
            let answer = route(&c, keys(name, args)?)?;
            if answer.bytes.starts_with(b"-MOVED") {
                live.moved.fetch_add(1, Ordering::Relaxed);
            }
            Some(answer)
        }
        (_, None) => None,
    }
}

/// The keys of a keyed command, or `None` for one without keys (or too few arguments: the
/// command itself then says so).
fn keys<'a>(name: &str, args: &'a [&'a [u8]]) -> Option<&'a [&'a [u8]]> {
    let keys = match name {
        "GET" | "SET" => args.get(..1)?,
        "EXISTS" | "DEL" | "UNLINK" => args,
        _ => return None,
    };
    (!keys.is_empty()).then_some(keys)
}

/// `None` when every key is in one slot this node owns; otherwise the redirection or error
/// Redis gives.
fn route(config: &ClusterConfig, keys: &[&[u8]]) -> Option<Answer> {
    let mut slots = keys.iter().map(|k| keyslot(k));
    let slot = slots.next()?;
    if slots.any(|s| s != slot) {
        return Some(error("CROSSSLOT Keys in request don't hash to the same slot"));
    }
    if config.owns(slot) {
        return None;
    }
    let owner = config.map().owner_node(slot)?;
    Some(error(&format!("MOVED {slot} {}", owner.endpoint())))
}

/// `CLUSTER <subcommand>`.
fn cluster(config: &ClusterConfig, args: &[&[u8]], proto: u8) -> Answer {
    let Some((sub, rest)) = args.split_first() else {
        return error("ERR wrong number of arguments for 'cluster' command");
    };
    let sub = String::from_utf8_lossy(sub).to_ascii_uppercase();
    let wrong = || error(&format!("ERR wrong number of arguments for 'cluster|{}' command", sub.to_ascii_lowercase()));
    match (sub.as_str(), rest) {
        ("SLOTS", []) => reply(slots(config), proto),
        ("SHARDS", []) => reply(shards(config), proto),
        ("NODES", []) => reply(Value::Bulk(nodes(config).into_bytes()), proto),
        ("INFO", []) => reply(Value::Bulk(info(config).into_bytes()), proto),
        ("MYID" | "MYSHARDID", []) => reply(Value::text(config.myself().map_or("", |n| n.id.as_str())), proto),
        ("KEYSLOT", [key]) => reply(Value::Int(i64::from(keyslot(key))), proto),
        ("SLOTS" | "SHARDS" | "NODES" | "INFO" | "MYID" | "MYSHARDID" | "KEYSLOT", _) => wrong(),
        _ => error(&format!(
            "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
            sub.chars().take(64).collect::<String>().to_ascii_lowercase()
        )),
    }
}

/// `CLUSTER SLOTS`: `[first, last, [host, port, id, {}]]` per run of slots, in slot order.
pub fn slots(config: &ClusterConfig) -> Value {
    let map = config.map();
    let runs = map.runs().into_iter().filter_map(|(first, last, owner)| {
        let node = map.nodes().get(owner)?;
        let entry = Value::Array(vec![
            Value::text(&node.host),
            Value::Int(i64::from(node.port)),
            Value::text(&node.id),
            // Redis 7 adds the node's other endpoints (hostname or IP) here; the map knows one.
            Value::Map(Vec::new()),
        ]);
        Some(Value::Array(vec![Value::Int(i64::from(first)), Value::Int(i64::from(last)), entry]))
    });
    Value::Array(runs.collect())
}

/// `CLUSTER SHARDS`: one shard per node (a primary without replicas), nodes without slots too.
pub fn shards(config: &ClusterConfig) -> Value {
    let map = config.map();
    let shards = map.nodes().iter().enumerate().map(|(i, node)| {
        let ranges = map
            .ranges_of(i)
            .into_iter()
            .flat_map(|(a, b)| [Value::Int(i64::from(a)), Value::Int(i64::from(b))])
            .collect();
        let mut fields = vec![
            (Value::text("id"), Value::text(&node.id)),
            (Value::text("port"), Value::Int(i64::from(node.port))),
            (Value::text("ip"), Value::text(&node.host)),
            (Value::text("endpoint"), Value::text(&node.host)),
        ];
        if node.host.parse::<std::net::IpAddr>().is_err() {
            fields.push((Value::text("hostname"), Value::text(&node.host)));
        }
        fields.extend([
            (Value::text("role"), Value::text("master")),
            (Value::text("replication-offset"), Value::Int(0)),
            (Value::text("health"), Value::text("online")),
        ]);
        Value::Map(vec![
            (Value::text("slots"), Value::Array(ranges)),
            (Value::text("nodes"), Value::Array(vec![Value::Map(fields)])),
        ])
    });
    Value::Array(shards.collect())
}

/// `CLUSTER NODES`: one line per node, `id host:port@cport flags master ping pong epoch link
/// slots...`. There is no cluster bus (cport 0) and no gossip: every node is shown connected,
/// which is all a node can know of the others.
pub fn nodes(config: &ClusterConfig) -> String {
    let map = config.map();
    let mut out = String::new();
    for (i, node) in map.nodes().iter().enumerate() {
        let flags = if i == config.myself_index() { "myself,master" } else { "master" };
        out.push_str(&format!("{} {}@0 {flags} - 0 0 {} connected", node.id, node.endpoint(), map.epoch()));
        for (a, b) in map.ranges_of(i) {
            if a == b {
                out.push_str(&format!(" {a}"));
            } else {
                out.push_str(&format!(" {a}-{b}"));
            }
        }
        out.push('\n');
    }
    out
}

/// `CLUSTER INFO`: Redis's fields, `name:value` lines ending in CRLF.
pub fn info(config: &ClusterConfig) -> String {
    let map = config.map();
    let serving = (0..map.nodes().len()).filter(|&i| map.slot_count(i) > 0).count();
    let epoch = map.epoch();
    let fields: [(&str, String); 12] = [
        ("cluster_state", "ok".into()),
        ("cluster_slots_assigned", SLOTS.to_string()),
        ("cluster_slots_ok", SLOTS.to_string()),
        ("cluster_slots_pfail", "0".into()),
        ("cluster_slots_fail", "0".into()),
        ("cluster_known_nodes", map.nodes().len().to_string()),
        ("cluster_size", serving.to_string()),
        ("cluster_current_epoch", epoch.to_string()),
        ("cluster_my_epoch", epoch.to_string()),
        ("cluster_stats_messages_sent", "0".into()),
        ("cluster_stats_messages_received", "0".into()),
        ("total_cluster_links_buffer_limit_exceeded", "0".into()),
    ];
    fields.iter().map(|(k, v)| format!("{k}:{v}\r\n")).collect()
}

/// One `COMMAND` entry: name, arity, flags, first key, last key, step, ACL categories (the
/// seven fields redis-py reads for RESP2 and RESP3).
struct Spec(&'static str, i64, &'static [&'static str], i64, i64, i64, &'static [&'static str]);

/// The commands served, with Redis's key positions: redis-py's cluster client asks `COMMAND`
/// where each command's keys are before it can route anything.
const SPECS: &[Spec] = &[
    Spec("get", 2, &["readonly", "fast"], 1, 1, 1, &["@read", "@string", "@fast"]),
    Spec("set", -3, &["write", "denyoom"], 1, 1, 1, &["@write", "@string", "@slow"]),
    Spec("exists", -2, &["readonly", "fast"], 1, -1, 1, &["@keyspace", "@read", "@fast"]),
    Spec("del", -2, &["write"], 1, -1, 1, &["@keyspace", "@write", "@slow"]),
    Spec("unlink", -2, &["write", "fast"], 1, -1, 1, &["@keyspace", "@write", "@fast"]),
    Spec("dbsize", 1, &["readonly", "fast"], 0, 0, 0, &["@keyspace", "@read", "@fast"]),
    Spec("ping", -1, &["fast", "stale"], 0, 0, 0, &["@fast", "@connection"]),
    Spec("echo", 2, &["fast"], 0, 0, 0, &["@fast", "@connection"]),
    Spec("quit", -1, &["fast", "stale", "loading", "no_auth"], 0, 0, 0, &["@fast", "@connection"]),
    Spec("auth", -2, &["fast", "stale", "loading", "no_auth", "noscript"], 0, 0, 0, &["@fast", "@connection"]),
    Spec("hello", -1, &["fast", "stale", "loading", "no_auth", "noscript"], 0, 0, 0, &["@fast", "@connection"]),
    Spec("client", -2, &[], 0, 0, 0, &["@slow"]),
    Spec("select", 2, &["fast", "stale", "loading"], 0, 0, 0, &["@fast", "@connection"]),
    Spec("command", -1, &["stale", "loading"], 0, 0, 0, &["@slow", "@connection"]),
    Spec("info", -1, &["stale", "loading"], 0, 0, 0, &["@slow", "@dangerous"]),
    Spec("cluster", -2, &[], 0, 0, 0, &["@slow"]),
    Spec("readonly", 1, &["fast", "stale", "loading"], 0, 0, 0, &["@fast", "@connection"]),
    Spec("readwrite", 1, &["fast", "stale", "loading"], 0, 0, 0, &["@fast", "@connection"]),
    Spec("asking", 1, &["fast"], 0, 0, 0, &["@fast", "@connection"]),
];

fn spec_value(s: &Spec) -> Value {
    let words = |w: &[&'static str]| Value::Array(w.iter().map(|&f| Value::Simple(f)).collect());
    Value::Array(vec![
        Value::text(s.0),
        Value::Int(s.1),
        words(s.2),
        Value::Int(s.3),
        Value::Int(s.4),
        Value::Int(s.5),
        words(s.6),
    ])
}

/// `COMMAND` (every entry), `COMMAND COUNT`, `COMMAND INFO name...`; anything else (DOCS,
/// GETKEYS, LIST) an empty array, which clients take as "nothing to add".
pub(crate) fn command(args: &[&[u8]], proto: u8) -> Vec<u8> {
    let sub = args.first().map(|s| String::from_utf8_lossy(s).to_ascii_uppercase());
    let value = match sub.as_deref() {
        None => Value::Array(SPECS.iter().map(spec_value).collect()),
        Some("COUNT") => Value::Int(SPECS.len() as i64),
        Some("INFO") => {
            let found = |name: &&[u8]| SPECS.iter().find(|s| s.0.as_bytes().eq_ignore_ascii_case(name));
            let entries = args.iter().skip(1).map(|n| found(n).map_or(Value::Array(Vec::new()), spec_value));
            Value::Array(entries.collect())
        }
        Some(_) => Value::Array(Vec::new()),
    };
    value.encode(proto)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use crate::cluster::SlotMap;

    fn three(me: &str) -> ClusterConfig {
        let text =
            "epoch 4\nnode 127.0.0.1:7001 0-5460\nnode 127.0.0.1:7002 5461-10922\nnode 127.0.0.1:7003 10923-16383";
        ClusterConfig::for_address(SlotMap::parse(text).unwrap(), me).unwrap()
    }

    fn text(a: Option<Answer>) -> String {
        a.map(|a| String::from_utf8_lossy(&a.bytes).into_owned()).unwrap_or_default()
    }

    #[test]
    fn keys_elsewhere_are_moved_and_mixed_slots_refused() {
        let live = Live::new(Some(three("127.0.0.1:7001")));
        // "foo" is slot 12182 (node 3), "bar" 5061 (node 1, this one).
        assert_eq!(text(answer("GET", &[b"foo"], 2, &live)), "-MOVED 12182 127.0.0.1:7003\r\n");
        assert!(answer("GET", &[b"bar"], 2, &live).is_none());
        assert!(answer("SET", &[b"bar", b"value"], 2, &live).is_none());
        assert_eq!(text(answer("SET", &[b"foo", b"v"], 2, &live)), "-MOVED 12182 127.0.0.1:7003\r\n");
        assert_eq!(
            text(answer("EXISTS", &[b"foo", b"bar"], 2, &live)),
            "-CROSSSLOT Keys in request don't hash to the same slot\r\n"
        );
        assert!(answer("DEL", &[b"{bar}1", b"{bar}2"], 2, &live).is_none(), "one hash tag, one slot");
        assert!(answer("GET", &[], 2, &live).is_none(), "arity errors are the command's own");
        assert!(answer("PING", &[], 2, &live).is_none());
        assert_eq!(live.stats().moved, 2);
    }

    #[test]
    fn standalone_refuses_cluster_commands_as_redis_does() {
        let live = Live::new(None);
        assert_eq!(text(answer("CLUSTER", &[b"SLOTS"], 2, &live)), format!("-{DISABLED}\r\n"));
        assert_eq!(text(answer("READONLY", &[], 2, &live)), format!("-{DISABLED}\r\n"));
        assert!(answer("GET", &[b"foo"], 2, &live).is_none());
    }

    #[test]
    fn cluster_slots_bytes() {
        let c = three("127.0.0.1:7002");
        let id = |i: usize| c.map().nodes()[i].id.clone();
        let mut want = String::from("*3\r\n");
        for (i, (a, b, port)) in [(0, 5460, 7001), (5461, 10922, 7002), (10923, 16383, 7003)].iter().enumerate() {
            want.push_str(&format!(
                "*3\r\n:{a}\r\n:{b}\r\n*4\r\n$9\r\n127.0.0.1\r\n:{port}\r\n$40\r\n{}\r\n*0\r\n",
                id(i)
            ));
        }
        assert_eq!(String::from_utf8(slots(&c).encode(2)).unwrap(), want);
        assert_eq!(String::from_utf8(slots(&c).encode(3)).unwrap(), want.replace("*0\r\n", "%0\r\n"));
    }

    #[test]
    fn cluster_nodes_info_myid_keyslot() {
        let c = three("127.0.0.1:7002");
        let live = Live::new(Some(c.clone()));
        let nodes = nodes(&c);
        let lines: Vec<&str> = nodes.lines().collect();
        assert_eq!(lines.len(), 3);
        let id = &c.map().nodes()[1].id;
        assert_eq!(lines[1], format!("{id} 127.0.0.1:7002@0 myself,master - 0 0 4 connected 5461-10922"));
        assert!(lines[0].contains(" master - 0 0 4 connected 0-5460"));
        let info = info(&c);
        assert!(info.starts_with("cluster_state:ok\r\ncluster_slots_assigned:16384\r\n"));
        assert!(info.contains("cluster_known_nodes:3\r\ncluster_size:3\r\ncluster_current_epoch:4\r\n"));
        assert_eq!(text(answer("CLUSTER", &[b"myid"], 2, &live)), format!("$40\r\n{id}\r\n"));
        assert_eq!(text(answer("CLUSTER", &[b"KEYSLOT", b"{user1000}.following"], 2, &live)), ":3443\r\n");
        assert_eq!(
            text(answer("CLUSTER", &[b"KEYSLOT"], 2, &live)),
            "-ERR wrong number of arguments for 'cluster|keyslot' command\r\n"
        );
        assert_eq!(
            text(answer("CLUSTER", &[b"bogus"], 2, &live)),
            "-ERR unknown subcommand 'bogus'. Try CLUSTER HELP.\r\n"
        );
    }

    #[test]
    fn cluster_shards_is_a_map_in_resp3_and_pairs_in_resp2() {
        let c = three("127.0.0.1:7001");
        let resp3 = String::from_utf8(shards(&c).encode(3)).unwrap();
        assert!(resp3
            .starts_with("*3\r\n%2\r\n$5\r\nslots\r\n*2\r\n:0\r\n:5460\r\n$5\r\nnodes\r\n*1\r\n%7\r\n$2\r\nid\r\n"));
        assert!(resp3.contains(
            "$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nonline\r\n"
        ));
        let resp2 = String::from_utf8(shards(&c).encode(2)).unwrap();
        assert!(resp2.starts_with("*3\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:5460\r\n$5\r\nnodes\r\n*1\r\n*14\r\n"));
    }

    #[test]
    fn command_gives_key_positions() {
        let all = String::from_utf8(command(&[], 2)).unwrap();
        assert!(all.starts_with(&format!(
            "*{}\r\n*7\r\n$3\r\nget\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n:1\r\n",
            SPECS.len()
        )));
        assert_eq!(String::from_utf8(command(&[b"COUNT"], 2)).unwrap(), format!(":{}\r\n", SPECS.len()));
        let info = String::from_utf8(command(&[b"INFO", b"EXISTS", b"nope"], 2)).unwrap();
        assert!(info.starts_with("*2\r\n*7\r\n$6\r\nexists\r\n:-2\r\n"));
        assert!(info.ends_with("*0\r\n"));
    }
}
