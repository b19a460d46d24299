//! A small blocking RESP client: what `kvhoard cluster status`, the tests and the load generator
//! need to talk to kvhoard nodes (or Redis): commands as arrays of bulk strings, RESP2 and RESP3
//! replies, and a cluster client that routes each key by its slot and follows `-MOVED`, as
//! Redis Cluster clients do.
//!
//! Replies are read with bounds (bulk length, elements per aggregate, nesting depth) and without
//! recursion, so a wrong or hostile server costs an error, not the process.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use thiserror::Error;

use super::{keyslot, SLOTS};

/// Largest bulk string accepted.
pub const MAX_BULK_BYTES: u64 = 1 << 30;
/// Most elements in one array or map.
const MAX_ELEMENTS: u64 = 1 << 24;
/// Deepest nesting of arrays and maps.
const MAX_DEPTH: usize = 16;
/// Longest line (a reply header or a simple string).
const MAX_LINE: usize = 64 << 10;
/// Redirections followed for one request before giving up.
const MAX_REDIRECTS: usize = 5;

/// Why a request failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Connecting, sending or receiving failed (a node down is this).
    #[error("{addr}: {source}")]
    Io {
        /// The node.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The server sent something that is not RESP, or exceeds the client's bounds.
    #[error("{addr}: protocol error: {why}")]
    Protocol {
        /// The node.
        addr: String,
        /// What was wrong.
        why: String,
    },
    /// No node answered `CLUSTER SLOTS`.
    #[error("no node of the cluster answered CLUSTER SLOTS: {0}")]
    NoSlots(String),
    /// Redirected more than [`MAX_REDIRECTS`] times.
    #[error("key {key:?}: redirected more than {MAX_REDIRECTS} times, last by {last}")]
    Redirects {
        /// The key.
        key: String,
        /// The last redirection.
        last: String,
    },
}

/// A reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+TEXT`.
    Simple(String),
    /// `-TEXT` (also `!` in RESP3).
    Error(String),
    /// `:N`.
    Int(i64),
    /// `$LEN` (also `=` verbatim strings, without their format prefix).
    Bulk(Vec<u8>),
    /// `$-1`, `*-1`, `_`.
    Nil,
    /// `*N`, `~N` (sets), `>N` (pushes).
    Array(Vec<Reply>),
    /// `%N`.
    Map(Vec<(Reply, Reply)>),
    /// `#t`/`#f`, `,DOUBLE`, `(BIGNUM`: their text.
    Text(String),
}

impl Reply {
    /// The bytes of a bulk, simple or text reply.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(b) => Some(b),
            Reply::Simple(s) | Reply::Text(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// A bulk, simple or text reply as text.
    pub fn text(&self) -> Option<String> {
        self.bytes().map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// An integer reply.
    pub fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The elements of an array reply.
    pub fn items(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// How to connect.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Limit for connecting and for each read and write.
    pub timeout: Duration,
    /// Password sent with AUTH on every new connection.
    pub password: Option<String>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions { timeout: Duration::from_secs(10), password: None }
    }
}

/// One connection to one node.
#[derive(Debug)]
pub struct Connection {
    addr: String,
    stream: BufReader<TcpStream>,
}

impl Connection {
    /// Connects to `host:port` (a name, an IPv4 or an IPv6 address without brackets).
    pub fn connect(host: &str, port: u16, opts: &ClientOptions) -> Result<Connection, ClientError> {
        let addr = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        let io = |source| ClientError::Io { addr: addr.clone(), source };
        let target =
            (host, port).to_socket_addrs().map_err(io)?.next().ok_or_else(|| {
                io(std::io::Error::new(std::io::ErrorKind::NotFound, "the name resolves to no address"))
            })?;
        let stream = TcpStream::connect_timeout(&target, opts.timeout).map_err(io)?;
        stream.set_read_timeout(Some(opts.timeout)).map_err(io)?;
        stream.set_write_timeout(Some(opts.timeout)).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let mut conn = Connection { addr: addr.clone(), stream: BufReader::with_capacity(64 << 10, stream) };
        if let Some(password) = &opts.password {
            if let Reply::Error(e) = conn.request(&[b"AUTH", password.as_bytes()])? {
                return Err(ClientError::Protocol { addr, why: format!("AUTH refused: {e}") });
            }
        }
        Ok(conn)
    }

    /// The node's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends one command and reads its reply.
    pub fn request(&mut self, args: &[&[u8]]) -> Result<Reply, ClientError> {
        self.send(args)?;
        self.read_reply()
    }

    /// Sends one command without waiting (read its reply later with [`Connection::read_reply`]).
    pub fn send(&mut self, args: &[&[u8]]) -> Result<(), ClientError> {
        let mut head = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            head.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            if a.len() < 64 << 10 {
                head.extend_from_slice(a);
                head.extend_from_slice(b"\r\n");
            } else {
                // A large value goes out as it is, with no copy into the header.
                let stream = self.stream.get_mut();
                stream.write_all(&head).map_err(|e| io_err(&self.addr, e))?;
                stream.write_all(a).map_err(|e| io_err(&self.addr, e))?;
                head = b"\r\n".to_vec();
            }
        }
        self.stream.get_mut().write_all(&head).map_err(|e| io_err(&self.addr, e))
    }

    /// Reads one reply.
    pub fn read_reply(&mut self) -> Result<Reply, ClientError> {
        // Aggregates being filled: (map?, elements wanted, elements so far).
        let mut stack: Vec<(bool, u64, Vec<Reply>)> = Vec::new();
        loop {
            let mut value = match self.read_one()? {
                Item::Value(v) => v,
                Item::Aggregate { map, len: 0 } => finish(map, Vec::new()),
                Item::Aggregate { map, len } => {
                    if stack.len() >= MAX_DEPTH {
                        return Err(self.protocol(format!("replies nested deeper than {MAX_DEPTH}")));
                    }
                    let want = if map { len * 2 } else { len };
                    stack.push((map, want, Vec::with_capacity(want.min(1024) as usize)));
                    continue;
                }
            };
            // Hand the finished value to its parents, closing each that is now full.
            loop {
                let Some((map, want, mut items)) = stack.pop() else { return Ok(value) };
                items.push(value);
                if (items.len() as u64) < want {
                    stack.push((map, want, items));
                    break;
                }
                value = finish(map, items);
            }
        }
    }

    fn protocol(&self, why: String) -> ClientError {
        ClientError::Protocol { addr: self.addr.clone(), why }
    }

    fn line(&mut self) -> Result<Vec<u8>, ClientError> {
        let mut line = Vec::new();
        let read = (&mut self.stream).take(MAX_LINE as u64 + 2).read_until(b'\n', &mut line);
        match read {
            Err(e) => Err(io_err(&self.addr, e)),
            Ok(0) => Err(io_err(&self.addr, std::io::ErrorKind::UnexpectedEof.into())),
            Ok(_) if !line.ends_with(b"\r\n") => Err(self.protocol("a line not ending in CRLF, or too long".into())),
            Ok(_) => {
                line.truncate(line.len() - 2);
                Ok(line)
            }
        }
    }

    fn read_one(&mut self) -> Result<Item, ClientError> {
        let line = self.line()?;
        let Some((&kind, rest)) = line.split_first() else {
            return Err(self.protocol("an empty reply line".into()));
        };
        let text = String::from_utf8_lossy(rest).into_owned();
        let number = |this: &Self| text.parse::<i64>().map_err(|_| this.protocol(format!("{text:?} is not a number")));
        Ok(Item::Value(match kind {
            b'+' => Reply::Simple(text),
            b'-' => Reply::Error(text),
            b':' => Reply::Int(number(self)?),
            b'_' => Reply::Nil,
            b'#' | b',' | b'(' => Reply::Text(text),
            b'$' | b'=' | b'!' => match u64::try_from(number(self)?) {
                Err(_) => Reply::Nil,
                Ok(len) => {
                    let bytes = self.bulk(len)?;
                    match kind {
                        b'!' => Reply::Error(String::from_utf8_lossy(&bytes).into_owned()),
                        // A verbatim string starts with its format, `txt:`.
                        b'=' => Reply::Bulk(bytes.get(4..).unwrap_or_default().to_vec()),
                        _ => Reply::Bulk(bytes),
                    }
                }
            },
            b'*' | b'~' | b'>' | b'%' => match u64::try_from(number(self)?) {
                Err(_) => Reply::Nil,
                Ok(len) if len > MAX_ELEMENTS => return Err(self.protocol(format!("an aggregate of {len} elements"))),
                Ok(len) => return Ok(Item::Aggregate { map: kind == b'%', len }),
            },
            other => return Err(self.protocol(format!("unknown reply type {:?}", char::from(other)))),
        }))
    }

    fn bulk(&mut self, len: u64) -> Result<Vec<u8>, ClientError> {
        if len > MAX_BULK_BYTES {
            return Err(self.protocol(format!("a bulk string of {len} bytes")));
        }
        let mut bytes = vec![0u8; len as usize + 2];
        self.stream.read_exact(&mut bytes).map_err(|e| io_err(&self.addr, e))?;
        if !bytes.ends_with(b"\r\n") {
            return Err(self.protocol("a bulk string not followed by CRLF".into()));
        }
        bytes.truncate(len as usize);
        Ok(bytes)
    }
}

enum Item {
    Value(Reply),
    Aggregate { map: bool, len: u64 },
}

fn finish(map: bool, items: Vec<Reply>) -> Reply {
    if !map {
        return Reply::Array(items);
    }
    let mut pairs = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        pairs.push((k, v));
    }
    Reply::Map(pairs)
}

fn io_err(addr: &str, source: std::io::Error) -> ClientError {
    ClientError::Io { addr: addr.to_string(), source }
}

/// `(host, port)` of an endpoint written `HOST:PORT` (split at the last colon, as clients read
/// MOVED errors, so an IPv6 host needs no brackets).
pub fn split_endpoint(endpoint: &str) -> Option<(String, u16)> {
    let (host, port) = endpoint.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_string(), port.parse().ok()?))
}

/// A client of a whole cluster: learns the slot map with `CLUSTER SLOTS`, sends each key's
/// command to the node owning its slot, and follows `-MOVED` (updating its map) as Redis Cluster
/// clients do.
#[derive(Debug)]
pub struct ClusterClient {
    seeds: Vec<(String, u16)>,
    opts: ClientOptions,
    /// Endpoints, indexed by `owner`.
    endpoints: Vec<(String, u16)>,
    /// Per slot, an index into `endpoints`.
    owner: Vec<usize>,
    conns: HashMap<(String, u16), Connection>,
    /// Redirections followed so far.
    pub redirects: u64,
}

impl ClusterClient {
    /// Connects to the first of `seeds` (`HOST:PORT` each) that answers `CLUSTER SLOTS`.
    pub fn connect(seeds: &[String], opts: ClientOptions) -> Result<ClusterClient, ClientError> {
        let seeds: Vec<(String, u16)> = seeds.iter().filter_map(|s| split_endpoint(s)).collect();
        let mut client = ClusterClient {
            seeds,
            opts,
            endpoints: Vec::new(),
            owner: vec![0; usize::from(SLOTS)],
            conns: HashMap::new(),
            redirects: 0,
        };
        client.refresh()?;
        Ok(client)
    }

    /// Reads the slot map again from the first node that answers.
    pub fn refresh(&mut self) -> Result<(), ClientError> {
        let mut last = String::from("no seed nodes");
        let candidates: Vec<(String, u16)> = self.seeds.iter().chain(&self.endpoints).cloned().collect();
        for (host, port) in candidates {
            match self.conn(&host, port).and_then(|c| c.request(&[b"CLUSTER", b"SLOTS"])) {
                Ok(Reply::Array(runs)) => return self.learn(&runs),
                Ok(other) => last = format!("{host}:{port} answered {other:?}"),
                Err(e) => {
                    self.conns.remove(&(host, port));
                    last = e.to_string();
                }
            }
        }
        Err(ClientError::NoSlots(last))
    }

    fn learn(&mut self, runs: &[Reply]) -> Result<(), ClientError> {
        for run in runs {
            let parsed = (|| {
                let items = run.items()?;
                let (first, last) = (items.first()?.int()?, items.get(1)?.int()?);
                let node = items.get(2)?.items()?;
                let host = node.first()?.text()?;
                let port = u16::try_from(node.get(1)?.int()?).ok()?;
                Some((first, last, host, port))
            })();
            let Some((first, last, host, port)) = parsed else {
                return Err(ClientError::NoSlots(format!("a CLUSTER SLOTS entry that does not parse: {run:?}")));
            };
            let index = self.endpoint_index(host, port);
            for slot in first.max(0)..=last.min(i64::from(SLOTS) - 1) {
                if let Some(o) = self.owner.get_mut(slot as usize) {
                    *o = index;
                }
            }
        }
        Ok(())
    }

    fn endpoint_index(&mut self, host: String, port: u16) -> usize {
        match self.endpoints.iter().position(|e| e.0 == host && e.1 == port) {
            Some(i) => i,
            None => {
                self.endpoints.push((host, port));
                self.endpoints.len() - 1
            }
        }
    }

    fn conn(&mut self, host: &str, port: u16) -> Result<&mut Connection, ClientError> {
        let key = (host.to_string(), port);
        if !self.conns.contains_key(&key) {
            let conn = Connection::connect(host, port, &self.opts)?;
            self.conns.insert(key.clone(), conn);
        }
        self.conns.get_mut(&key).ok_or_else(|| ClientError::NoSlots("lost a connection just made".into()))
    }

    /// The node (`host`, `port`) this client sends `key` to.
    pub fn node_of(&self, key: &[u8]) -> Option<&(String, u16)> {
        self.owner.get(usize::from(keyslot(key))).and_then(|&i| self.endpoints.get(i))
    }

    /// Sends `args` (whose key is `key`) to the node owning the key's slot, following MOVED
    /// (the slot's owner is updated) and ASK (this request only goes to the other node, preceded
    /// by ASKING; kvhoard nodes never send ASK, Redis does while a slot migrates). A node that
    /// cannot be reached is an error for this request only; the next one reconnects.
    pub fn request(&mut self, key: &[u8], args: &[&[u8]]) -> Result<Reply, ClientError> {
        let (mut host, mut port) = self.node_of(key).cloned().unwrap_or_else(|| ("127.0.0.1".into(), 6379));
        let mut last = String::new();
        let mut asking = false;
        for _ in 0..=MAX_REDIRECTS {
            let sent = self.conn(&host, port).and_then(|c| {
                if asking {
                    if let Reply::Error(e) = c.request(&[b"ASKING"])? {
                        return Ok(Reply::Error(e));
                    }
                }
                c.request(args)
            });
            let reply = match sent {
                Ok(r) => r,
                Err(e) => {
                    // Reconnect next time: the node may be back.
                    self.conns.remove(&(host, port));
                    return Err(e);
                }
            };
            let Reply::Error(e) = &reply else { return Ok(reply) };
            let Some(redirect) = redirection(e) else { return Ok(reply) };
            self.redirects += 1;
            last = e.clone();
            asking = redirect.ask;
            if !redirect.ask {
                let index = self.endpoint_index(redirect.to.0.clone(), redirect.to.1);
                if let Some(o) = self.owner.get_mut(usize::from(redirect.slot)) {
                    *o = index;
                }
            }
            (host, port) = redirect.to;
        }
        Err(ClientError::Redirects { key: String::from_utf8_lossy(key).into_owned(), last })
    }
}

/// A `-MOVED` or `-ASK` error, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirection {
    /// `ASK` (this request only) rather than `MOVED` (the slot's new owner).
    pub ask: bool,
    /// The slot.
    pub slot: u16,
    /// Where to send the request: (host, port).
    pub to: (String, u16),
}

/// The redirection an error reply asks for: `MOVED SLOT HOST:PORT` or `ASK SLOT HOST:PORT`.
pub fn redirection(error: &str) -> Option<Redirection> {
    let (ask, rest) = match error.split_once(' ')? {
        ("MOVED", rest) => (false, rest),
        ("ASK", rest) => (true, rest),
        _ => return None,
    };
    let mut words = rest.split(' ');
    let slot = words.next()?.parse().ok().filter(|&s: &u16| s < SLOTS)?;
    let to = split_endpoint(words.next()?)?;
    words.next().is_none().then_some(Redirection { ask, slot, to })
}

/// The slot and endpoint of a `MOVED SLOT HOST:PORT` error.
pub fn moved(error: &str) -> Option<(u16, (String, u16))> {
    redirection(error).filter(|r| !r.ask).map(|r| (r.slot, r.to))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use super::*;
    use std::net::TcpListener;

    /// A server that answers every request with `reply`, once.
    fn serve_once(reply: &'static [u8]) -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(reply);
        });
        port
    }

    fn ask(reply: &'static [u8]) -> Result<Reply, ClientError> {
        let port = serve_once(reply);
        Connection::connect("127.0.0.1", port, &ClientOptions::default())?.request(&[b"X"])
    }

    #[test]
    fn replies_of_every_type_are_read() {
        assert_eq!(ask(b"+OK\r\n").unwrap(), Reply::Simple("OK".into()));
        assert_eq!(ask(b":-42\r\n").unwrap(), Reply::Int(-42));
        assert_eq!(ask(b"$3\r\na\r\n\r\n").unwrap(), Reply::Bulk(b"a\r\n".to_vec()));
        assert_eq!(ask(b"$-1\r\n").unwrap(), Reply::Nil);
        assert_eq!(ask(b"_\r\n").unwrap(), Reply::Nil);
        assert_eq!(ask(b"=8\r\ntxt:abcd\r\n").unwrap(), Reply::Bulk(b"abcd".to_vec()));
        assert_eq!(ask(b"*0\r\n").unwrap(), Reply::Array(vec![]));
        assert_eq!(
            ask(b"*3\r\n:1\r\n*2\r\n+a\r\n%1\r\n$1\r\nk\r\n:2\r\n-ERR x\r\n").unwrap(),
            Reply::Array(vec![
                Reply::Int(1),
                Reply::Array(vec![
                    Reply::Simple("a".into()),
                    Reply::Map(vec![(Reply::Bulk(b"k".to_vec()), Reply::Int(2))])
                ]),
                Reply::Error("ERR x".into()),
            ])
        );
    }

    #[test]
    fn hostile_replies_are_errors_not_crashes() {
        for bad in [&b"$99999999999\r\n"[..], b"*99999999999\r\n", b"?\r\n", b":x\r\n", b"$3\r\nabcde", b"+no end"] {
            let port = {
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                let port = listener.local_addr().unwrap().port();
                let bad = bad.to_vec();
                std::thread::spawn(move || {
                    let (mut s, _) = listener.accept().unwrap();
                    let mut buf = [0u8; 1024];
                    let _ = s.read(&mut buf);
                    let _ = s.write_all(&bad);
                });
                port
            };
            let got = Connection::connect("127.0.0.1", port, &ClientOptions::default()).unwrap().request(&[b"X"]);
            assert!(got.is_err(), "{:?}: {got:?}", String::from_utf8_lossy(bad));
        }
        let deep: &'static [u8] = Box::leak("*1\r\n".repeat(40).into_boxed_str()).as_bytes();
        assert!(ask(deep).is_err_and(|e| e.to_string().contains("nested")));
    }

    #[test]
    fn moved_and_ask_errors_parse() {
        assert_eq!(moved("MOVED 3999 127.0.0.1:6381"), Some((3999, ("127.0.0.1".into(), 6381))));
        assert_eq!(moved("MOVED 1 ::1:7000"), Some((1, ("::1".into(), 7000))));
        assert_eq!(moved("ERR x"), None);
        assert_eq!(moved("ASK 3999 127.0.0.1:6381"), None, "ASK does not move the slot");
        assert_eq!(
            redirection("ASK 3999 127.0.0.1:6381"),
            Some(Redirection { ask: true, slot: 3999, to: ("127.0.0.1".into(), 6381) })
        );
        for bad in ["MOVED 16384 a:1", "MOVED x a:1", "MOVED 1 a", "MOVED 1 a:1 extra", "MOVED", "ASKING 1 a:1"] {
            assert_eq!(redirection(bad), None, "{bad}");
        }
        assert_eq!(split_endpoint("[::1]:7"), Some(("::1".into(), 7)));
    }

    /// A server on `listener` that answers the requests of one connection with `replies`, one
    /// each, in order, and hands back what it was sent.
    fn scripted(listener: TcpListener, replies: Vec<Vec<u8>>) -> std::thread::JoinHandle<Vec<String>> {
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            for reply in replies {
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap();
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                s.write_all(&reply).unwrap();
            }
            seen
        })
    }

    #[test]
    fn a_cluster_client_follows_ask_for_one_request_with_asking_first() {
        let bind = || {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            (listener, port)
        };
        let ((first_listener, first), (second_listener, second)) = (bind(), bind());
        // The first node owns every slot by its map but says that "foo" (slot 12182) is being
        // imported by the second: ASK, not MOVED.
        let slots = format!("*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:{first}\r\n");
        let ask = format!("-ASK 12182 127.0.0.1:{second}\r\n");
        let first_seen = scripted(first_listener, vec![slots.into_bytes(), ask.into_bytes()]);
        let second_seen = scripted(second_listener, vec![b"+OK\r\n".to_vec(), b"$3\r\nbar\r\n".to_vec()]);
        let mut client = ClusterClient::connect(&[format!("127.0.0.1:{first}")], ClientOptions::default()).unwrap();
        assert_eq!(client.request(b"foo", &[b"GET", b"foo"]).unwrap(), Reply::Bulk(b"bar".to_vec()));
        assert_eq!(client.redirects, 1);
        assert_eq!(client.node_of(b"foo"), Some(&("127.0.0.1".to_string(), first)), "ASK leaves the map as it was");
        assert_eq!(
            first_seen.join().unwrap(),
            vec!["*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n", "*2\r\n$3\r\nGET\r\n$3\r\nfoo\r\n"]
        );
        assert_eq!(second_seen.join().unwrap(), vec!["*1\r\n$6\r\nASKING\r\n", "*2\r\n$3\r\nGET\r\n$3\r\nfoo\r\n"]);
    }
}
