//! kvhoard nodes as one Redis Cluster, over real sockets: slots computed as Redis computes them,
//! `-MOVED` and `CLUSTER SLOTS` byte for byte, in-process nodes with a client that routes by slot
//! and follows MOVED, an even spread of keys over three and six nodes, a node down (its keys
//! fail, the others serve), the node back on its volume, and a reloaded map that moves slots (the
//! node that lost them drops their keys).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvhoard_engine::{CreateOptions, Store, StoreOptions};
use kvhoard_serve::cluster::client::{ClientError, ClientOptions, ClusterClient, Reply};
use kvhoard_serve::cluster::{keyslot, slots::crc16, ClusterConfig, SlotMap};
use kvhoard_serve::{Running, ServeOptions};

struct Node {
    running: Option<Running>,
    /// `None` while the node is down.
    volume: Option<Arc<Store>>,
    dir: tempfile::TempDir,
    addr: SocketAddr,
}

fn options(resp: SocketAddr, cluster: Option<ClusterConfig>) -> ServeOptions {
    ServeOptions { resp: Some(resp), cluster, ..Default::default() }
}

impl Node {
    fn start() -> Node {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let create = CreateOptions { capacity_bytes: Some(64 << 20), segment_size_bytes: 8 << 20 };
        let store = Arc::new(Store::create(&dir.path().join("vol"), &create, StoreOptions::default()).unwrap());
        let running = kvhoard_serve::start(Arc::clone(&store), options("127.0.0.1:0".parse().unwrap(), None)).unwrap();
        let addr = running.addrs().resp.unwrap();
        Node { running: Some(running), volume: Some(store), dir, addr }
    }

    fn running(&self) -> &Running {
        self.running.as_ref().unwrap()
    }

    fn store(&self) -> &Store {
        self.volume.as_ref().unwrap()
    }

    /// Stops serving and closes the volume (the node is down).
    fn stop(&mut self) {
        self.running.take().unwrap().shutdown(Duration::from_secs(5));
        let Ok(store) = Arc::try_unwrap(self.volume.take().unwrap()) else {
            panic!("the server kept a reference to the store")
        };
        store.close().unwrap();
    }

    /// Opens the volume again and serves it on the same port, in cluster mode from the start.
    fn restart(&mut self, config: ClusterConfig) {
        let store = Arc::new(Store::open(&self.dir.path().join("vol"), StoreOptions::default()).unwrap());
        let running = kvhoard_serve::start(Arc::clone(&store), options(self.addr, Some(config))).unwrap();
        assert_eq!(running.addrs().resp, Some(self.addr));
        self.running = Some(running);
        self.volume = Some(store);
    }
}

/// Three nodes serving one balanced map.
fn cluster() -> (Vec<Node>, SlotMap) {
    cluster_of(3)
}

/// `count` nodes serving one balanced map.
fn cluster_of(count: usize) -> (Vec<Node>, SlotMap) {
    let nodes: Vec<Node> = (0..count).map(|_| Node::start()).collect();
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr.to_string()).collect();
    let map = SlotMap::balanced(&addrs, 1).unwrap();
    load(&nodes, &map);
    (nodes, map)
}

/// Gives every running node `map`, as a SIGHUP does.
fn load(nodes: &[Node], map: &SlotMap) {
    for n in nodes.iter().filter(|n| n.running.is_some()) {
        n.running().set_cluster(Some(config(map, n)));
    }
}

fn config(map: &SlotMap, node: &Node) -> ClusterConfig {
    ClusterConfig::for_address(map.clone(), &node.addr.to_string()).unwrap()
}

fn client(nodes: &[Node]) -> ClusterClient {
    let seeds: Vec<String> = nodes.iter().map(|n| n.addr.to_string()).collect();
    ClusterClient::connect(&seeds, ClientOptions { timeout: Duration::from_secs(10), password: None }).unwrap()
}

/// Keys as LMCache's redis connectors name them (`model@world@worker@hash@dtype` + suffix).
fn lmcache_key(i: u64) -> String {
    let hash = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64;
    format!("org/model@1@0@{hash:x}@bfloat16kv_bytes")
}

fn value(i: u64) -> Vec<u8> {
    kvhoard_tests::block(i, 256 + (i % 7) as usize * 100)
}

fn set(c: &mut ClusterClient, key: &str, value: &[u8]) {
    let reply = c.request(key.as_bytes(), &[b"SET", key.as_bytes(), value]).unwrap();
    assert_eq!(reply, Reply::Simple("OK".into()), "SET {key}");
}

fn get(c: &mut ClusterClient, key: &str) -> Result<Option<Vec<u8>>, ClientError> {
    match c.request(key.as_bytes(), &[b"GET", key.as_bytes()])? {
        Reply::Bulk(b) => Ok(Some(b)),
        Reply::Nil => Ok(None),
        other => panic!("GET {key}: {other:?}"),
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn exchange(s: &mut TcpStream, request: &[u8], want: &[u8]) {
    s.write_all(request).unwrap();
    let mut got = vec![0u8; want.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(want),
        "reply to {:?}",
        String::from_utf8_lossy(request)
    );
}

fn cmd(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).bytes());
        out.extend_from_slice(a);
        out.extend(b"\r\n");
    }
    out
}

#[test]
fn keyslots_match_the_redis_specification() {
    assert_eq!(crc16(b"123456789"), 0x31C3, "the CRC16 check value the cluster specification gives");
    for (key, slot) in [("foo", 12182), ("bar", 5061), ("hello", 866), ("somekey", 11058), ("", 0)] {
        assert_eq!(keyslot(key.as_bytes()), slot, "{key}");
    }
    // Hash tags: the first {...} with something inside decides.
    assert_eq!(keyslot(b"{user1000}.following"), keyslot(b"{user1000}.followers"));
    assert_eq!(keyslot(b"{user1000}.following"), keyslot(b"user1000"));
    assert_eq!(keyslot(b"foo{}{bar}"), 8363, "an empty tag hashes the whole key");
    assert_eq!(keyslot(b"foo{{bar}}zap"), keyslot(b"{bar"));
    assert_eq!(keyslot(b"foo{bar}{zap}"), keyslot(b"bar"));
    // LMCache's two keys of one chunk land in different slots (it uses no hash tags).
    assert_ne!(keyslot(b"test@1@0@0@bfloat16kv_bytes"), keyslot(b"test@1@0@0@bfloat16metadata"));
}

#[test]
fn moved_and_cluster_replies_are_redis_bytes() {
    let (nodes, map) = cluster();
    // "foo" is slot 12182, the third node's; ask the first.
    let third = nodes[2].addr;
    let mut c = connect(nodes[0].addr);
    exchange(&mut c, &cmd(&[b"GET", b"foo"]), format!("-MOVED 12182 {third}\r\n").as_bytes());
    exchange(&mut c, &cmd(&[b"SET", b"foo", b"v"]), format!("-MOVED 12182 {third}\r\n").as_bytes());
    exchange(&mut c, b"GET foo\r\n", format!("-MOVED 12182 {third}\r\n").as_bytes());
    exchange(&mut c, &cmd(&[b"SET", b"bar", b"v"]), b"+OK\r\n");
    exchange(&mut c, &cmd(&[b"EXISTS", b"bar", b"foo"]), b"-CROSSSLOT Keys in request don't hash to the same slot\r\n");
    exchange(&mut c, &cmd(&[b"EXISTS", b"{bar}x", b"bar"]), b":1\r\n");
    exchange(&mut c, &cmd(&[b"CLUSTER", b"KEYSLOT", b"{user1000}.following"]), b":3443\r\n");
    exchange(&mut c, &cmd(&[b"READONLY"]), b"+OK\r\n");
    exchange(&mut c, &cmd(&[b"READWRITE"]), b"+OK\r\n");
    exchange(&mut c, &cmd(&[b"ASKING"]), b"+OK\r\n");
    // ASKING only matters for a slot being imported, and kvhoard imports none: still MOVED.
    exchange(&mut c, &cmd(&[b"GET", b"foo"]), format!("-MOVED 12182 {third}\r\n").as_bytes());
    let id = |i: usize| map.nodes()[i].id.clone();
    exchange(&mut c, &cmd(&[b"CLUSTER", b"MYID"]), format!("$40\r\n{}\r\n", id(0)).as_bytes());
    // CLUSTER SLOTS: [first, last, [ip, port, id, {}]] per range, as Redis 7 sends it.
    let mut slots = String::from("*3\r\n");
    for (i, (a, b)) in [(0, 5460), (5461, 10922), (10923, 16383)].into_iter().enumerate() {
        let port = nodes[i].addr.port();
        slots
            .push_str(&format!("*3\r\n:{a}\r\n:{b}\r\n*4\r\n$9\r\n127.0.0.1\r\n:{port}\r\n$40\r\n{}\r\n*0\r\n", id(i)));
    }
    exchange(&mut c, &cmd(&[b"CLUSTER", b"SLOTS"]), slots.as_bytes());
    // After HELLO 3 the metadata is an empty map, and HELLO says cluster.
    c.write_all(&cmd(&[b"HELLO", b"3"])).unwrap();
    let mut hello = vec![0u8; 4096];
    let n = c.read(&mut hello).unwrap();
    assert!(String::from_utf8_lossy(&hello[..n]).contains("$4\r\nmode\r\n$7\r\ncluster\r\n"));
    exchange(&mut c, &cmd(&[b"CLUSTER", b"SLOTS"]), slots.replace("*0\r\n", "%0\r\n").as_bytes());
    // redis-py finds keys from COMMAND.
    c.write_all(&cmd(&[b"COMMAND", b"INFO", b"get"])).unwrap();
    let mut info = [0u8; 64];
    let n = c.read(&mut info).unwrap();
    assert!(info[..n].starts_with(b"*1\r\n*7\r\n$3\r\nget\r\n:2\r\n"), "{:?}", String::from_utf8_lossy(&info[..n]));
    // A standalone server refuses CLUSTER as Redis does.
    let plain = Node::start();
    exchange(
        &mut connect(plain.addr),
        &cmd(&[b"CLUSTER", b"SLOTS"]),
        b"-ERR This instance has cluster support disabled\r\n",
    );
}

#[test]
fn a_client_following_the_map_spreads_keys_evenly_over_three_nodes() {
    spread_evenly(3);
}

#[test]
fn a_client_following_the_map_spreads_keys_evenly_over_six_nodes() {
    spread_evenly(6);
}

/// LMCache-named keys stored through one seed node land within 10 % of an even share on each
/// of `count` nodes.
fn spread_evenly(count: usize) {
    let (nodes, _) = cluster_of(count);
    let mut c = client(&nodes[..1]);
    let keys = 2000 * count as u64;
    for i in 0..keys {
        set(&mut c, &lmcache_key(i), &value(i));
    }
    for i in (0..keys).step_by(7) {
        assert_eq!(get(&mut c, &lmcache_key(i)).unwrap(), Some(value(i)), "{}", lmcache_key(i));
    }
    assert_eq!(c.redirects, 0, "a client with the map never needs a redirection");
    let share = keys as f64 / count as f64;
    for n in &nodes {
        let held = n.store().stats().keys as f64;
        assert!((held - share).abs() <= share * 0.10, "{}: {held} keys, expected {share:.0} ± 10%", n.addr);
        // DBSIZE tells the same.
        let mut s = connect(n.addr);
        s.write_all(&cmd(&[b"DBSIZE"])).unwrap();
        let mut reply = [0u8; 16];
        let got = s.read(&mut reply).unwrap();
        assert_eq!(String::from_utf8_lossy(&reply[..got]), format!(":{}\r\n", held as u64));
    }
}

#[test]
fn a_node_down_is_a_miss_for_its_keys_and_the_others_serve_then_it_comes_back() {
    let (mut nodes, map) = cluster();
    let mut c = client(&nodes);
    let keys: Vec<String> = (0..300).map(lmcache_key).collect();
    for (i, k) in keys.iter().enumerate() {
        set(&mut c, k, &value(i as u64));
    }
    let down = nodes[1].addr;
    nodes[1].stop();
    let on_down = |k: &String| map.owner_node(keyslot(k.as_bytes())).unwrap().port == down.port();
    let started = Instant::now();
    let (mut failed, mut served) = (0, 0);
    for (i, k) in keys.iter().enumerate() {
        match get(&mut c, k) {
            Err(ClientError::Io { addr, .. }) => {
                assert!(on_down(k), "{k} failed on {addr}, not on the node that is down");
                failed += 1;
            }
            Err(e) => panic!("{k}: {e}"),
            Ok(got) => {
                assert!(!on_down(k));
                assert_eq!(got, Some(value(i as u64)));
                served += 1;
            }
        }
    }
    assert!(failed > 50 && served > 150, "{failed} failed, {served} served");
    // Refused connections fail at once: a node down costs its keys, not everyone's time.
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    // Back on the same volume and port: its keys are served again, by the same client.
    let again = config(&map, &nodes[1]);
    nodes[1].restart(again);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(get(&mut c, k).unwrap(), Some(value(i as u64)), "{k}");
    }
}

#[test]
fn a_reloaded_map_moves_slots_and_the_node_that_lost_them_drops_their_keys() {
    let (nodes, map) = cluster();
    let mut c = client(&nodes);
    let keys: Vec<String> = (0..3000).map(lmcache_key).collect();
    for (i, k) in keys.iter().enumerate() {
        set(&mut c, k, &value(i as u64));
    }
    // Slots 0-2000 move from the first node to the second.
    let addr = |i: usize| nodes[i].addr.to_string();
    let text = format!(
        "epoch 2\nnode {} 2001-5460\nnode {} 0-2000 5461-10922\nnode {} 10923-16383\n",
        addr(0),
        addr(1),
        addr(2)
    );
    let moved_map = SlotMap::parse(&text).unwrap();
    let before = nodes[0].running().cluster_stats();
    load(&nodes, &moved_map);
    let moved: Vec<usize> = (0..keys.len()).filter(|&i| keyslot(keys[i].as_bytes()) <= 2000).collect();
    assert!(moved.len() > 250, "{} keys in the moved slots", moved.len());
    // The client's map is stale: the first node redirects it, the second has nothing (a miss).
    for &i in &moved {
        assert_eq!(get(&mut c, &keys[i]).unwrap(), None, "{} moved: a miss until written again", keys[i]);
    }
    assert!(c.redirects >= 1);
    // Keys in the slots that stayed are still served where they were.
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| !moved.contains(i)) {
        assert_eq!(get(&mut c, k).unwrap(), Some(value(i as u64)), "{k}");
    }
    // The first node deletes what it no longer owns, in the background.
    let deadline = Instant::now() + Duration::from_secs(20);
    let stats = loop {
        let s = nodes[0].running().cluster_stats();
        if s.evictions_done > before.evictions_done && !s.evicting {
            break s;
        }
        assert!(Instant::now() < deadline, "no eviction finished: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(stats.evicted_keys - before.evicted_keys, moved.len() as u64);
    for &i in &moved {
        assert!(
            !nodes[0].store().contains("lmcache", &keys[i]).unwrap(),
            "{} still on the node that lost its slot",
            keys[i]
        );
    }
    // Written again, a moved key lives on its new node.
    set(&mut c, &keys[moved[0]], b"again");
    assert!(nodes[1].store().contains("lmcache", &keys[moved[0]]).unwrap());
    // The slots go back: the first node does not serve the stale copies it had.
    load(&nodes, &map);
    assert_eq!(get(&mut c, &keys[moved[1]]).unwrap(), None);
    assert_eq!(nodes[0].running().cluster().unwrap().map().epoch(), 1);
}
