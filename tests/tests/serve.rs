//! `kvhoard serve` over real sockets: LMCache's lm:// and RESP byte for byte (golden exchanges
//! from LMCache 0.5.6), bad input that must cost only the offending connection, metrics, and a
//! restart that keeps what was stored.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvhoard_engine::{CreateOptions, Store, StoreOptions};
use kvhoard_serve::lm::wire::{self, Command, WireMeta, NO_CHUNK, REPLY_BYTES};
use kvhoard_serve::metrics::{Op, Proto};
use kvhoard_serve::{Running, ServeOptions};

const KEY: &str = "org/test-model@1@0@1234abcd5678ef01@bfloat16";
const CHUNK: WireMeta = WireMeta { fmt: 1, dtype: 3, shape: [2, 4, 256, 512] };

struct Server {
    running: Option<Running>,
    store: Arc<Store>,
    dir: tempfile::TempDir,
}

fn local() -> Option<SocketAddr> {
    Some("127.0.0.1:0".parse().unwrap())
}

fn options() -> ServeOptions {
    ServeOptions { lm: local(), resp: local(), metrics: local(), ..Default::default() }
}

impl Server {
    fn start(opts: ServeOptions) -> Server {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let create = CreateOptions { capacity_bytes: Some(256 << 20), segment_size_bytes: 64 << 20 };
        let store = Arc::new(Store::create(&dir.path().join("vol"), &create, StoreOptions::default()).unwrap());
        let running = kvhoard_serve::start(Arc::clone(&store), opts).unwrap();
        Server { running: Some(running), store, dir }
    }

    fn running(&self) -> &Running {
        self.running.as_ref().unwrap()
    }

    fn lm(&self) -> TcpStream {
        connect(self.running().addrs().lm.unwrap())
    }

    fn resp(&self) -> TcpStream {
        connect(self.running().addrs().resp.unwrap())
    }

    /// Stops the server and closes the store, then opens the volume again and serves it.
    fn restart(mut self, opts: ServeOptions) -> Server {
        self.running.take().unwrap().shutdown(Duration::from_secs(5));
        let Server { store, dir, .. } = self;
        let Ok(store) = Arc::try_unwrap(store) else { panic!("the server kept a reference to the store") };
        store.close().unwrap();
        drop(store);
        let store = Arc::new(Store::open(&dir.path().join("vol"), StoreOptions::default()).unwrap());
        let running = kvhoard_serve::start(Arc::clone(&store), opts).unwrap();
        Server { running: Some(running), store, dir }
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn chunk_bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn lm_send(s: &mut TcpStream, cmd: Command, len: u32, meta: &WireMeta, key: &str) {
    s.write_all(&wire::encode_request(cmd, len, meta, key).unwrap()).unwrap();
}

fn lm_reply(s: &mut TcpStream) -> [u8; REPLY_BYTES] {
    let mut r = [0u8; REPLY_BYTES];
    s.read_exact(&mut r).unwrap();
    r
}

fn lm_put(s: &mut TcpStream, key: &str, meta: &WireMeta, payload: &[u8]) {
    lm_send(s, Command::Put, payload.len() as u32, meta, key);
    s.write_all(payload).unwrap();
}

fn lm_exists(s: &mut TcpStream, key: &str) -> bool {
    lm_send(s, Command::Exist, 0, &NO_CHUNK, key);
    let (code, ..) = wire::parse_reply(&lm_reply(s));
    code == 200
}

fn lm_get(s: &mut TcpStream, key: &str) -> Option<(WireMeta, Vec<u8>)> {
    lm_send(s, Command::Get, 0, &NO_CHUNK, key);
    let (code, len, meta) = wire::parse_reply(&lm_reply(s));
    if code != 200 {
        return None;
    }
    let mut payload = vec![0u8; len as usize];
    s.read_exact(&mut payload).unwrap();
    Some((meta, payload))
}

fn hex(words: &str) -> Vec<u8> {
    kvhoard_engine::format::hex::decode(words).unwrap()
}

/// True once the server has closed `s` (reads return EOF or reset).
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => return true,
            Ok(_) => continue,
        }
    }
}

#[test]
fn lm_session_matches_lmcache_byte_for_byte() {
    let server = Server::start(options());
    let mut c = server.lm();
    let payload = chunk_bytes(1, 2 << 20);
    // The session seen on the wire from LMCache: EXIST, PUT, EXIST, GET.
    lm_send(&mut c, Command::Exist, 0, &NO_CHUNK, KEY);
    let fail = hex("90010000 00000000 01000000 02000000 00000000 00000000 00000000 00000000 00000000");
    assert_eq!(lm_reply(&mut c).to_vec(), fail);
    lm_put(&mut c, KEY, &CHUNK, &payload);
    lm_send(&mut c, Command::Exist, 0, &NO_CHUNK, KEY);
    let exists = lm_reply(&mut c);
    assert_eq!(wire::parse_reply(&exists), (200, 0, NO_CHUNK));
    lm_send(&mut c, Command::Get, 0, &NO_CHUNK, KEY);
    let ok = hex("c8000000 00002000 01000000 03000000 02000000 04000000 00010000 00020000 00000000");
    assert_eq!(lm_reply(&mut c).to_vec(), ok);
    let mut back = vec![0u8; payload.len()];
    c.read_exact(&mut back).unwrap();
    assert!(back == payload, "payload differs");
    // HEALTH, and a GET of a missing key gets the failure reply and no payload.
    lm_send(&mut c, Command::Health, 0, &NO_CHUNK, "");
    assert_eq!(wire::parse_reply(&lm_reply(&mut c)).0, 200);
    lm_send(&mut c, Command::Get, 0, &NO_CHUNK, "org/test-model@1@0@-1234@half");
    assert_eq!(lm_reply(&mut c).to_vec(), fail);
    // The block is stored under the key, described as LMCache described it.
    let block = server.store.get("lmcache", KEY, Default::default()).unwrap().unwrap();
    assert_eq!(block.meta.desc.shape, vec![2, 4, 256, 512]);
    assert_eq!(server.running().metrics().counts(Proto::Lm, Op::Get), (2, 1, 1, 0));
}

#[test]
fn lm_keeps_every_description_and_key_lmcache_sends() {
    let server = Server::start(options());
    let mut c = server.lm();
    let cases = [
        ("m@2@1@-1234@half", WireMeta { fmt: 1, dtype: 2, shape: [2, 2, 16, 64] }, 8192),
        ("model/with/slashes@1@0@ff@bfloat16%tag", WireMeta { fmt: 3, dtype: 3, shape: [2, 16, 128, 0] }, 8192),
        ("bin@1@0@1@float8", WireMeta { fmt: 4, dtype: 6, shape: [1000, 0, 0, 0] }, 1000),
        ("mla@1@0@2@fp8", WireMeta { fmt: 6, dtype: 7, shape: [4, 16, 576, 0] }, 4 * 16 * 576),
    ];
    for (i, (key, meta, len)) in cases.iter().enumerate() {
        lm_put(&mut c, key, meta, &chunk_bytes(i as u8, *len));
    }
    // A key that fills the whole 150-byte field, with no padding left.
    let long = "k".repeat(wire::KEY_FIELD_BYTES);
    lm_put(&mut c, &long, &CHUNK, &chunk_bytes(9, 2 << 20));
    for (i, (key, meta, len)) in cases.iter().enumerate() {
        let (got_meta, got) = lm_get(&mut c, key).expect("stored");
        assert_eq!(&got_meta, meta, "{key}");
        assert!(got == chunk_bytes(i as u8, *len), "{key}: payload differs");
    }
    assert_eq!(lm_get(&mut c, &long).map(|(m, p)| (m, p.len())), Some((CHUNK, 2 << 20)));
}

#[test]
fn every_key_gets_back_its_own_shape_whoever_stored_the_same_bytes() {
    let server = Server::start(options());
    let mut c = server.lm();
    let bytes = chunk_bytes(42, 2 << 20);
    let other = WireMeta { fmt: 1, dtype: 3, shape: [2, 2, 512, 512] };
    lm_put(&mut c, "a", &CHUNK, &bytes);
    assert_eq!(lm_get(&mut c, "a").map(|(m, _)| m), Some(CHUNK));
    lm_put(&mut c, "b", &other, &bytes);
    let (meta, got) = lm_get(&mut c, "b").expect("b is stored");
    assert_eq!(meta, other, "b reads back the shape it was stored with, not a's");
    assert!(got == bytes);
    assert_eq!(lm_get(&mut c, "a").map(|(m, _)| m), Some(CHUNK), "a keeps its own shape");
    // Bytes stored first over RESP (with no description), then over lm:// with one.
    let mut r = server.resp();
    let shared = chunk_bytes(43, 1 << 20);
    resp_exchange(&mut r, &cmd(&[b"SET", b"r", &shared]), b"+OK\r\n");
    let small = WireMeta { fmt: 1, dtype: 3, shape: [2, 1, 512, 512] };
    lm_put(&mut c, "r", &small, &shared);
    assert!(lm_exists(&mut c, "r"));
    let (meta, got) = lm_get(&mut c, "r").expect("an lm:// PUT of bytes RESP stored reads back");
    assert_eq!(meta, small);
    assert!(got == shared);
}

#[test]
fn lm_bad_input_costs_only_that_request_or_connection() {
    let opts = ServeOptions { max_object_bytes: 4 << 20, request_timeout: Duration::from_millis(500), ..options() };
    let server = Server::start(opts);
    let mut good = server.lm();
    lm_put(&mut good, "survivor", &CHUNK, &chunk_bytes(3, 2 << 20));
    // An lm:// PUT has no reply: asking on the same connection waits until it is stored, so
    // the other connection's checks below cannot race it.
    assert!(lm_exists(&mut good, "survivor"));

    // Too large: the payload is read and dropped, the connection goes on, nothing is stored.
    let mut c = server.lm();
    let big = WireMeta { fmt: 1, dtype: 3, shape: [2, 4, 1024, 512] };
    lm_put(&mut c, "too-big", &big, &vec![0u8; 8 << 20]);
    assert!(!lm_exists(&mut c, "too-big"));
    // Shape and dtype that do not describe the payload: refused the same way.
    lm_put(&mut c, "mismatch", &CHUNK, &[1u8; 1000]);
    assert!(!lm_exists(&mut c, "mismatch"));
    // A key that is not UTF-8 fails; the connection goes on.
    let mut h = wire::encode_request(Command::Get, 0, &NO_CHUNK, "x").unwrap();
    h[36] = 0xff;
    c.write_all(&h).unwrap();
    assert_eq!(wire::parse_reply(&lm_reply(&mut c)).0, 400);
    assert!(lm_exists(&mut c, "survivor"));

    // An unknown command or a negative length: where the next request starts is unknown, so
    // that connection is closed.
    for (word, value) in [(0, 77i32), (1, -5)] {
        let mut c = server.lm();
        let mut h = wire::encode_request(Command::Put, 0, &NO_CHUNK, "x").unwrap();
        h[word * 4..word * 4 + 4].copy_from_slice(&value.to_le_bytes());
        c.write_all(&h).unwrap();
        assert!(closed(&mut c));
    }
    // Truncated header, then silence: closed after the request timeout.
    let mut c = server.lm();
    c.write_all(&wire::encode_request(Command::Get, 0, &NO_CHUNK, "x").unwrap()[..100]).unwrap();
    assert!(closed(&mut c));
    // A client that disconnects in the middle of a payload stores nothing.
    let mut c = server.lm();
    lm_send(&mut c, Command::Put, 2 << 20, &CHUNK, "half-sent");
    c.write_all(&[5u8; 1 << 20]).unwrap();
    drop(c);
    // Hundreds of idle connections do not stop anyone else.
    let idle: Vec<TcpStream> = (0..300).map(|_| server.lm()).collect();
    assert!(lm_exists(&mut good, "survivor"));
    assert!(!lm_exists(&mut good, "half-sent"));
    let (_, payload) = lm_get(&mut good, "survivor").unwrap();
    assert!(payload == chunk_bytes(3, 2 << 20));
    assert!(server.running().metrics().protocol_errors(Proto::Lm) >= 2);
    drop(idle);
}

/// Waits until `idle` connections wait for their next request: the server's tasks, on other
/// threads, have reached the state the client's last step put them in.
fn wait_idle(server: &Server, idle: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while server.running().idle_connections() != idle {
        assert!(
            std::time::Instant::now() < deadline,
            "{} idle connections, not {idle}",
            server.running().idle_connections()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_full_server_makes_room_by_closing_the_longest_idle_connection_and_refuses_when_all_are_busy() {
    let server = Server::start(ServeOptions { max_connections: 4, ..options() });
    // The four slots: a client that connected and never sent a byte, and three that were served
    // a request and wait for their next.
    let mut silent = server.resp();
    wait_idle(&server, 1);
    let mut used: Vec<TcpStream> = (0..3).map(|_| server.lm()).collect();
    for c in &mut used {
        assert!(!lm_exists(c, "k"));
    }
    wait_idle(&server, 4);
    // A newcomer is served: the connection that never sent anything made room.
    let mut newcomer = server.resp();
    resp_exchange(&mut newcomer, &cmd(&[b"PING"]), b"+PONG\r\n");
    assert!(closed(&mut silent));
    wait_idle(&server, 4);
    // The next one takes the slot of the connection idle the longest; the others go on.
    let mut second = server.lm();
    assert!(!lm_exists(&mut second, "k"));
    assert!(closed(&mut used[0]));
    assert!(!lm_exists(&mut used[1], "k"));
    wait_idle(&server, 4);
    // Every slot in the middle of a request: a newcomer is refused, and a RESP one told why.
    newcomer.write_all(b"*2\r\n").unwrap();
    second.write_all(&[0u8; 4]).unwrap();
    for c in used.iter_mut().skip(1) {
        c.write_all(&[0u8; 4]).unwrap();
    }
    wait_idle(&server, 0);
    let mut refused = server.resp();
    let mut told = Vec::new();
    let _ = refused.read_to_end(&mut told);
    assert_eq!(String::from_utf8_lossy(&told), "-ERR max number of clients reached\r\n");
}

#[test]
fn many_clients_at_once_get_their_own_bytes() {
    let server = Server::start(options());
    let addr = server.running().addrs().lm.unwrap();
    std::thread::scope(|s| {
        for t in 0..8u8 {
            s.spawn(move || {
                let mut c = connect(addr);
                for i in 0..10u8 {
                    let key = format!("m@1@{t}@{i:x}@bfloat16");
                    let meta = WireMeta { fmt: 1, dtype: 3, shape: [2, 2, 16 * (1 + i32::from(i)), 64] };
                    let len = 2 * 2 * 16 * (1 + usize::from(i)) * 64 * 2;
                    lm_put(&mut c, &key, &meta, &chunk_bytes(t * 16 + i, len));
                }
                for i in 0..10u8 {
                    let key = format!("m@1@{t}@{i:x}@bfloat16");
                    let (_, got) = lm_get(&mut c, &key).unwrap();
                    assert!(got == chunk_bytes(t * 16 + i, got.len()), "{key}");
                }
            });
        }
    });
}

#[test]
fn lm_puts_are_stored_in_the_order_sent_while_the_next_requests_are_read() {
    let server = Server::start(options());
    let mut c = server.lm();
    // LMCache sends PUT after PUT without waiting (PUT has no reply); the server reads on while
    // the store writes, but a request naming a key waits for that key's PUTs.
    let big = WireMeta { fmt: 1, dtype: 3, shape: [2, 8, 256, 1024] }; // 8 MiB
    let first = chunk_bytes(1, 8 << 20);
    let second = chunk_bytes(2, 8 << 20);
    lm_put(&mut c, KEY, &big, &first);
    lm_put(&mut c, KEY, &big, &second);
    for i in 0..20u8 {
        lm_put(&mut c, &format!("m@1@0@{i:x}@bfloat16"), &CHUNK, &chunk_bytes(i, 2 << 20));
    }
    assert!(lm_exists(&mut c, "m@1@0@13@bfloat16"), "EXIST right after the PUT sees it");
    let (_, got) = lm_get(&mut c, KEY).unwrap();
    assert!(got == second, "the later PUT of a key wins");
    for i in 0..20u8 {
        let (_, got) = lm_get(&mut c, &format!("m@1@0@{i:x}@bfloat16")).unwrap();
        assert!(got == chunk_bytes(i, 2 << 20));
    }
    // Every PUT is counted once it is stored (a GET of each key waited for it).
    let (requests, _, _, errors) = server.running().metrics().counts(Proto::Lm, Op::Put);
    assert_eq!((requests, errors), (22, 0));
}

#[test]
fn lm_large_replies_reach_a_slow_reader_whole_and_the_connection_goes_on() {
    let server = Server::start(options());
    let mut c = server.lm();
    let meta = WireMeta { fmt: 1, dtype: 3, shape: [2, 8, 768, 1024] }; // 24 MiB
    let payload = chunk_bytes(9, 24 << 20);
    lm_put(&mut c, KEY, &meta, &payload);
    assert!(lm_exists(&mut c, KEY));
    for pause in [Duration::from_millis(300), Duration::ZERO] {
        // A reader that starts late fills the server's socket buffer: the rest of the reply is
        // sent with blocking sends, after which the socket must serve the runtime again.
        lm_send(&mut c, Command::Get, 0, &NO_CHUNK, KEY);
        std::thread::sleep(pause);
        let (code, len, got_meta) = wire::parse_reply(&lm_reply(&mut c));
        assert_eq!((code, len as usize, got_meta), (200, payload.len(), meta));
        let mut got = vec![0u8; payload.len()];
        for piece in got.chunks_mut(1 << 20) {
            c.read_exact(piece).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(got == payload, "the reply arrived whole and unchanged");
    }
    lm_send(&mut c, Command::Health, 0, &NO_CHUNK, "");
    assert_eq!(wire::parse_reply(&lm_reply(&mut c)).0, 200);
}

#[test]
fn what_was_stored_survives_a_restart() {
    let server = Server::start(options());
    let mut c = server.lm();
    let payload = chunk_bytes(7, 2 << 20);
    lm_put(&mut c, KEY, &CHUNK, &payload);
    let mut r = server.resp();
    r.write_all(b"*3\r\n$3\r\nSET\r\n$6\r\nr/key1\r\n$5\r\nhello\r\n").unwrap();
    let mut ok = [0u8; 5];
    r.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"+OK\r\n");
    assert!(lm_exists(&mut c, KEY)); // the PUT was handled before this reply
    drop((c, r));
    let server = server.restart(options());
    let mut c = server.lm();
    let (meta, got) = lm_get(&mut c, KEY).expect("still there after a restart");
    assert_eq!(meta, CHUNK);
    assert!(got == payload);
    let mut r = server.resp();
    r.write_all(b"GET r/key1\r\n").unwrap();
    let mut back = [0u8; 11];
    r.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"$5\r\nhello\r\n");
}

fn resp_exchange(s: &mut TcpStream, request: &[u8], want: &[u8]) {
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
fn resp_replies_are_exactly_what_a_strict_client_expects() {
    let server = Server::start(options());
    let mut c = server.resp();
    let key = KEY.as_bytes();
    let value = chunk_bytes(2, 1 << 20);
    resp_exchange(&mut c, &cmd(&[b"EXISTS", key]), b":0\r\n");
    resp_exchange(&mut c, &cmd(&[b"GET", key]), b"$-1\r\n");
    resp_exchange(&mut c, &cmd(&[b"SET", key, &value]), b"+OK\r\n");
    resp_exchange(&mut c, &cmd(&[b"EXISTS", key]), b":1\r\n");
    let mut want = format!("${}\r\n", value.len()).into_bytes();
    want.extend_from_slice(&value);
    want.extend(b"\r\n");
    c.write_all(&cmd(&[b"GET", key])).unwrap();
    let mut got = vec![0u8; want.len()];
    c.read_exact(&mut got).unwrap();
    assert!(got == want, "GET reply differs");
    resp_exchange(&mut c, &cmd(&[b"exists", key, b"nope", key]), b":2\r\n");
    resp_exchange(&mut c, &cmd(&[b"DEL", key, b"nope"]), b":1\r\n");
    resp_exchange(&mut c, &cmd(&[b"GET", key]), b"$-1\r\n");
    resp_exchange(&mut c, &cmd(&[b"PING"]), b"+PONG\r\n");
    // Inline commands, as typed into telnet, SET included.
    resp_exchange(&mut c, b"SET inline 12345\r\n", b"+OK\r\n");
    resp_exchange(&mut c, b"GET inline\r\n", b"$5\r\n12345\r\n");
    resp_exchange(&mut c, &cmd(&[b"CLIENT", b"SETINFO", b"LIB-NAME", b"redis-py"]), b"+OK\r\n");
    resp_exchange(&mut c, &cmd(&[b"FLUSHALL"]), b"-ERR unknown command 'flushall'\r\n");
    resp_exchange(&mut c, &cmd(&[b"GET"]), b"-ERR wrong number of arguments for 'get' command\r\n");
    resp_exchange(
        &mut c,
        &cmd(&[b"SET", b"k", b"v", b"NX"]),
        b"-ERR syntax error (kvhoard's SET takes EX or PX only)\r\n",
    );
    resp_exchange(&mut c, &cmd(&[b"GET", b"\xff"]), b"-ERR the key is not UTF-8; kvhoard keys are text\r\n");
    // SET with EX keeps a TTL on the key.
    resp_exchange(&mut c, &cmd(&[b"SET", b"ttl", b"v", b"EX", b"3600"]), b"+OK\r\n");
    assert_eq!(server.store.meta("lmcache", "ttl").unwrap().unwrap().ttl_secs, 3600);
    // HELLO 3 switches to RESP3 (redis-py's default): a map, and null as `_`.
    c.write_all(&cmd(&[b"HELLO", b"3"])).unwrap();
    let mut head = [0u8; 4];
    c.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"%7\r\n");
    let mut rest = Vec::new();
    while !rest.ends_with(b"$7\r\nmodules\r\n*0\r\n") {
        let mut b = [0u8; 1];
        c.read_exact(&mut b).unwrap();
        rest.push(b[0]);
    }
    resp_exchange(&mut c, &cmd(&[b"GET", key]), b"_\r\n");
    resp_exchange(&mut c, &cmd(&[b"HELLO", b"4"]), b"-NOPROTO unsupported protocol version\r\n");
}

#[test]
fn resp_password_and_bad_input() {
    let opts = ServeOptions {
        resp_password: Some("s3cret".into()),
        max_object_bytes: 1 << 20,
        request_timeout: Duration::from_millis(500),
        ..options()
    };
    let server = Server::start(opts);
    let mut c = server.resp();
    resp_exchange(&mut c, &cmd(&[b"GET", b"k"]), b"-NOAUTH Authentication required.\r\n");
    resp_exchange(
        &mut c,
        &cmd(&[b"AUTH", b"wrong"]),
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    );
    resp_exchange(&mut c, &cmd(&[b"AUTH", b"default", b"s3cret"]), b"+OK\r\n");
    resp_exchange(&mut c, &cmd(&[b"SET", b"k", b"v"]), b"+OK\r\n");
    // Too large a value: read, refused with an error, the connection goes on.
    let big = vec![1u8; 2 << 20];
    resp_exchange(
        &mut c,
        &cmd(&[b"SET", b"big", &big]),
        b"-ERR object of 2097152 bytes is larger than the server's maximum (1048576 bytes)\r\n",
    );
    resp_exchange(&mut c, &cmd(&[b"EXISTS", b"big", b"k"]), b":1\r\n");
    // HELLO with AUTH authenticates in one step.
    let mut h = server.resp();
    h.write_all(&cmd(&[b"HELLO", b"2", b"AUTH", b"default", b"s3cret"])).unwrap();
    let mut star = [0u8; 5];
    h.read_exact(&mut star).unwrap();
    assert_eq!(&star, b"*14\r\n");
    // Protocol errors close that connection after an error reply.
    for bad in [&b"*1\r\n:1\r\n"[..], b"*99999\r\n", b"*2\r\n$3\r\nGET\r\n$999999\r\n"] {
        let mut p = server.resp();
        p.write_all(bad).unwrap();
        let mut reply = Vec::new();
        let _ = p.read_to_end(&mut reply);
        assert!(reply.starts_with(b"-ERR Protocol error"), "{:?}", String::from_utf8_lossy(&reply));
    }
    // A client stalling in the middle of a value is dropped after the request timeout.
    let mut slow = server.resp();
    slow.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$100\r\nabc").unwrap();
    assert!(closed(&mut slow));
    resp_exchange(&mut c, &cmd(&[b"EXISTS", b"x"]), b":0\r\n");
}

#[test]
fn metrics_over_http() {
    let server = Server::start(options());
    let mut c = server.lm();
    lm_put(&mut c, KEY, &CHUNK, &chunk_bytes(1, 2 << 20));
    assert!(lm_get(&mut c, KEY).is_some());
    let http = |path: &str| {
        let mut s = connect(server.running().addrs().metrics.unwrap());
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let needles = [
        "kvhoard_serve_requests_total{proto=\"lm\",op=\"put\"} 1",
        "kvhoard_serve_hits_total{proto=\"lm\",op=\"get\"} 1",
        "kvhoard_serve_sent_bytes_total{proto=\"lm\"} 2097152",
        "kvhoard_serve_connections_open{proto=\"lm\"} 1",
        "kvhoard_keys 1",
        "kvhoard_tier_hits_total{tier=\"ssd\"}",
    ];
    // A request is counted once its reply is sent, which may be just after the client has read
    // it: scrape until the counters show it, for a bounded time.
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let text = http("/metrics");
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        if needles.iter().all(|n| text.contains(n)) || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    for needle in needles {
        assert!(text.contains(needle), "missing {needle:?}");
    }
    assert!(http("/").starts_with("HTTP/1.1 404"));
    let plan = http("/plan");
    assert!(plan.starts_with("HTTP/1.1 404") && plan.contains("no planner"), "{plan}");
}

#[test]
fn a_planners_view_is_served_as_json() {
    use kvhoard_engine::placement::planner::{PlannerConfig, StoreOption};
    use kvhoard_engine::placement::{Planned, PlannedConfig};
    let option = |ratio, delay_s, lossy| StoreOption { ratio, delay_s, lossy };
    let planned = Arc::new(
        Planned::new(
            PlannedConfig {
                planner: PlannerConfig {
                    alpha: 0.05,
                    half_life_ms: 600_000,
                    budget_bytes: 128 << 20,
                    options: vec![option(1.0, 0.01, false), option(0.7, 0.009, false), option(0.0, 0.017, false)],
                    dram: kvhoard_engine::placement::planner::DramChoice::default(),
                },
                codecs: vec![None, Some(kvhoard_engine::CodecSpec::lossless(1))],
                quality: vec![1.0, 1.0, 1.0],
                loads: kvhoard_engine::placement::load_model::LoadModel::default(),
            },
            kvhoard_engine::Clock::default(),
        )
        .unwrap(),
    );
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let create = CreateOptions { capacity_bytes: Some(256 << 20), segment_size_bytes: 64 << 20 };
    let opts = StoreOptions { placement: planned, ..StoreOptions::default() };
    let store = Arc::new(Store::create(&dir.path().join("vol"), &create, opts).unwrap());
    let running = kvhoard_serve::start(Arc::clone(&store), options()).unwrap();
    let mut c = connect(running.addrs().lm.unwrap());
    for (i, key) in ["m@1@0@aa@bfloat16", "m@1@0@bb@bfloat16"].iter().enumerate() {
        lm_put(&mut c, key, &CHUNK, &chunk_bytes(i as u8, 2 << 20));
    }
    let http = |path: &str| {
        let mut s = connect(running.addrs().metrics.unwrap());
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    // An lm:// PUT has no reply: the blocks are stored just after; ask until both are, for a
    // bounded time.
    let deadline = Instant::now() + Duration::from_secs(10);
    let view = loop {
        let reply = http("/plan?limit=1");
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n") && reply.contains("application/json"), "{reply}");
        let view: serde_json::Value = serde_json::from_str(reply.split_once("\r\n\r\n").unwrap().1).unwrap();
        if view["report"]["contexts"] == 2 || Instant::now() > deadline {
            break view;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let names: Vec<&str> = view["options"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["as put", "lossless:level=1", "dropped"], "{view}");
    assert_eq!(view["report"]["policy"], "planner");
    assert_eq!(view["report"]["contexts"], 2, "a key without a group is a context of its own: {view}");
    assert_eq!(view["contexts"].as_array().unwrap().len(), 1, "limit=1: {view}");
    running.shutdown(Duration::from_secs(5));
}

#[test]
fn a_namespace_policy_changes_while_the_server_serves() {
    let send = |addr, method: &str, body: &str| {
        let mut s = connect(addr);
        let head = format!("{method} /ns HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len());
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let policy = r#"{"namespace": "my models?", "codec": "quant:bits=8", "lossy": true, "alpha": 0.02,
        "drift": 0.1, "ttl": {"budget_bytes": 1073741824}}"#;
    // A server not asked to take policy changes refuses them, saying how to ask; it still shows them.
    let closed = Server::start(options());
    let addr = closed.running().addrs().metrics.unwrap();
    let reply = send(addr, "PUT", policy);
    assert!(reply.starts_with("HTTP/1.1 403 Forbidden\r\n") && reply.contains("--allow-policy-changes"), "{reply}");
    assert_eq!(closed.store.policy("my models?"), kvhoard_engine::Policy::default());
    assert!(send(addr, "GET", "").starts_with("HTTP/1.1 200 OK\r\n"));
    drop(closed);

    let server = Server::start(ServeOptions { policy_changes: true, ..options() });
    let addr = server.running().addrs().metrics.unwrap();
    let http = |method: &str, body: &str| send(addr, method, body);
    let reply = http("GET", "");
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n") && reply.ends_with("[]"), "no policy yet: {reply}");
    // A namespace name a path would need escaped ("my models?"): it travels in the body.
    let reply = http("PUT", policy);
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    // Applied to the running store at once.
    let set = server.store.policy("my models?");
    assert!(set.lossy && set.codec.is_some_and(|c| c.is_lossy()), "{set:?}");
    assert_eq!((set.settings.alpha, set.settings.drift), (Some(0.02), Some(0.1)));
    assert_eq!(set.settings.ttl.map(|t| t.budget_bytes), Some(1 << 30));
    let reply = http("GET", "");
    assert!(reply.contains("\"namespace\":\"my models?\"") && reply.contains("quant"), "{reply}");
    // What the store refuses, or the endpoint cannot read, is a 400 that says why; nothing changes.
    for (body, why) in [
        (r#"{"namespace": "strict", "codec": "quant:bits=8"}"#, "lossy"),
        (r#"{"codec": "raw"}"#, "names no"),
        (r#"{"namespace": "x", "lossi": true}"#, "unknown field"),
        ("not json", "not JSON"),
    ] {
        let reply = http("PUT", body);
        assert!(reply.starts_with("HTTP/1.1 400 Bad Request\r\n") && reply.contains(why), "{body}: {reply}");
    }
    assert_eq!(server.store.policy("strict"), kvhoard_engine::Policy::default());
    // A body past the bound is refused before it is read.
    let mut s = connect(addr);
    s.write_all(b"PUT /ns HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    // A head that cannot be read is a 400, however its body would have been taken.
    for head in [
        "PUT /ns HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        "PUT /ns HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    ] {
        let mut s = connect(addr);
        s.write_all(head.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 400"), "{head:?}: {out}");
    }
}

#[test]
fn shutdown_lets_a_request_in_progress_finish() {
    let server = Server::start(options());
    let mut c = server.lm();
    let payload = chunk_bytes(4, 8 << 20);
    let meta = WireMeta { fmt: 1, dtype: 3, shape: [2, 16, 256, 512] };
    // Header and half the payload sent; shutdown starts; the rest follows; the PUT completes.
    lm_send(&mut c, Command::Put, payload.len() as u32, &meta, KEY);
    c.write_all(&payload[..4 << 20]).unwrap();
    let Server { running, store, dir } = server;
    let stopper = std::thread::spawn(move || running.unwrap().shutdown(Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(200));
    c.write_all(&payload[4 << 20..]).unwrap();
    let report = stopper.join().unwrap();
    assert_eq!(report.connections_cut, 0);
    assert!(closed(&mut c));
    let block = store.get("lmcache", KEY, Default::default()).unwrap().expect("the PUT in progress was stored");
    assert!(*block == payload[..]);
    drop(dir);
}

#[test]
fn nothing_to_serve_and_inconsistent_limits_are_errors() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let create = CreateOptions { capacity_bytes: Some(64 << 20), segment_size_bytes: 8 << 20 };
    let store = Arc::new(Store::create(&dir.path().join("vol"), &create, StoreOptions::default()).unwrap());
    let err = kvhoard_serve::start(Arc::clone(&store), ServeOptions::default()).err().unwrap();
    assert!(err.to_string().contains("nothing to serve"), "{err}");
    let err = kvhoard_serve::start(
        store,
        ServeOptions { lm: local(), max_object_bytes: 1 << 30, inflight_bytes: 1 << 20, ..Default::default() },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("in-flight budget"), "{err}");
}

#[test]
fn lm_chunks_are_stored_compressed_and_come_back_decoded_never_with_dropped_tokens() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let create = CreateOptions { capacity_bytes: Some(256 << 20), segment_size_bytes: 64 << 20 };
    let store = Arc::new(Store::create(&dir.path().join("vol"), &create, StoreOptions::default()).unwrap());
    // Token dropping: refused for a namespace lm:// serves, by --codec or by its policy.
    let drop = kvhoard_engine::CodecSpec::parse("drop-knorm:keep=0.5").unwrap();
    store.set_policy("lmcache", kvhoard_engine::Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    let err = kvhoard_serve::start(Arc::clone(&store), ServeOptions { codec: Some(drop), ..options() }).err().unwrap();
    assert!(err.to_string().contains("drops"), "{err}");
    // Quantization: stored compressed, read back decoded in the shape LMCache gave.
    let quant = kvhoard_engine::CodecSpec::quant(8, 32, 0);
    let running = kvhoard_serve::start(Arc::clone(&store), ServeOptions { codec: Some(quant), ..options() }).unwrap();
    let mut c = connect(running.addrs().lm.unwrap());
    let meta = WireMeta { fmt: 1, dtype: 3, shape: [2, 2, 256, 1024] };
    let synth = kvhoard_kernels::synth::Synth::new(2, 256, 8, 128, 3);
    let chunk = synth.generate();
    lm_put(&mut c, "q", &meta, &chunk);
    let (got_meta, got) = lm_get(&mut c, "q").expect("stored");
    assert_eq!(got_meta, meta);
    assert_eq!(got.len(), chunk.len());
    let stored = store.meta("lmcache", "q").unwrap().unwrap();
    assert!(stored.stored_len < chunk.len() as u64 * 6 / 10, "quant:bits=8 should store about half");
    // A block stored with dropped tokens (through the API) is a miss over lm://, not half a chunk.
    store
        .put(
            "lmcache",
            "dropped",
            &chunk,
            &kvhoard_engine::PutOptions { desc: Some(synth.desc.desc()), codec: Some(drop), ..Default::default() },
        )
        .unwrap();
    assert!(lm_get(&mut c, "dropped").is_none());
    running.shutdown(Duration::from_secs(5));
}
