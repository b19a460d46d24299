//! The RESP listener: the commands LMCache's `resp://` (native C++) and `redis://` (redis-py)
//! connectors send, with the exact reply bytes a strict RESP2 client expects, and RESP3 after
//! `HELLO 3` (redis-py's default).
//!
//! Served: PING, ECHO, QUIT, AUTH, HELLO, CLIENT (SETINFO, SETNAME, GETNAME, ID), SELECT 0,
//! COMMAND (the served commands' key positions), INFO, DBSIZE, EXISTS, GET, SET (with EX/PX as a
//! TTL), DEL/UNLINK; in cluster mode also CLUSTER, READONLY, READWRITE, ASKING, and `-MOVED` for
//! keys of slots other nodes own ([`crate::cluster`]). Anything else gets `-ERR unknown
//! command`. A request that breaks the protocol gets `-ERR Protocol error` and the connection is
//! closed, as Redis does.

mod frame;
mod info;

use std::sync::Arc;
use std::time::Instant;

use kvhoard_engine::PutOptions;

use crate::cluster;
use crate::conn::{self, Conn};
use crate::end::End;
use crate::metrics::{Op, Outcome, Proto};
use crate::Shared;
use frame::{Arg, Limits, Read, Refused};

/// A reply: a header, and for a bulk string its payload (sent without a copy) and trailer.
enum Reply {
    Raw(Vec<u8>),
    Bulk(Box<kvhoard_engine::Block>),
}

fn simple(s: &str) -> Reply {
    Reply::Raw(format!("+{s}\r\n").into_bytes())
}

fn error(s: &str) -> Reply {
    // An error line must not contain a line break.
    let s: String = s.chars().map(|c| if c == '\r' || c == '\n' { ' ' } else { c }).collect();
    Reply::Raw(format!("-{s}\r\n").into_bytes())
}

fn int(n: u64) -> Reply {
    Reply::Raw(format!(":{n}\r\n").into_bytes())
}

fn bulk_bytes(b: &[u8]) -> Reply {
    let mut v = format!("${}\r\n", b.len()).into_bytes();
    v.extend_from_slice(b);
    v.extend_from_slice(b"\r\n");
    Reply::Raw(v)
}

fn wrong_args(cmd: &str) -> Reply {
    error(&format!("ERR wrong number of arguments for '{}' command", cmd.to_ascii_lowercase()))
}

/// Per-connection state.
struct Session {
    /// 2 or 3, as chosen by HELLO.
    proto: u8,
    authenticated: bool,
    id: u64,
}

impl Session {
    fn null(&self) -> Reply {
        Reply::Raw(if self.proto == 3 { b"_\r\n".to_vec() } else { b"$-1\r\n".to_vec() })
    }
}

pub(crate) async fn serve(mut conn: Conn, shared: &Arc<Shared>) -> End {
    let mut session = Session {
        proto: 2,
        authenticated: shared.opts.resp_password.is_none(),
        id: shared.metrics.connections_total(Proto::Resp),
    };
    // Whether the client sent a request before: one that never did is closed first for room.
    let mut served = false;
    loop {
        if let Err(end) = conn::next_request(&mut conn, shared, served).await {
            return end;
        }
        served = true;
        let limits = Limits { max_object: shared.opts.max_object_bytes, memory: shared.memory() };
        let started = Instant::now();
        let args = match frame::read(&mut conn, &limits, &mut shared.pace()).await {
            Ok(Read::Command(args)) => args,
            Ok(Read::Nothing) => continue,
            Ok(Read::Refused(Refused::TooLarge { len, max })) => {
                tracing::warn!("RESP SET of {len} bytes refused: more than --max-object-size ({max} bytes)");
                shared.metrics.request(Proto::Resp, Op::Put, Outcome::Error, started.elapsed());
                let reply =
                    error(&format!("ERR object of {len} bytes is larger than the server's maximum ({max} bytes)"));
                if let Err(end) = send(&mut conn, reply, shared).await {
                    return end;
                }
                continue;
            }
            Err(End::Protocol(why)) => {
                let _ = send(&mut conn, error(&format!("ERR Protocol error: {why}")), shared).await;
                return End::Protocol(why);
            }
            Err(end) => return end,
        };
        let name = String::from_utf8_lossy(args.first().map(Arg::bytes).unwrap_or_default()).to_ascii_uppercase();
        let (op, outcome, reply) = command(&name, args, &mut session, shared).await;
        shared.metrics.request(Proto::Resp, op, outcome, started.elapsed());
        if let Reply::Bulk(b) = &reply {
            shared.metrics.sent(Proto::Resp, b.len() as u64);
        }
        if let Err(end) = send(&mut conn, reply, shared).await {
            return end;
        }
        if name == "QUIT" {
            return End::Done;
        }
    }
}

async fn send(conn: &mut Conn, reply: Reply, shared: &Shared) -> Result<(), End> {
    let (timeout, blocking) = (shared.opts.request_timeout, &shared.blocking_sends);
    match reply {
        Reply::Raw(bytes) => conn::write_all(conn, &[&bytes], timeout, blocking).await,
        Reply::Bulk(block) => {
            let header = format!("${}\r\n", block.len());
            conn::write_all(conn, &[header.as_bytes(), &block, b"\r\n"], timeout, blocking).await
        }
    }
}

fn key_of(arg: &Arg) -> Result<String, Reply> {
    String::from_utf8(arg.bytes().to_vec()).map_err(|_| error("ERR the key is not UTF-8; kvhoard keys are text"))
}

async fn command(name: &str, args: Vec<Arg>, session: &mut Session, shared: &Arc<Shared>) -> (Op, Outcome, Reply) {
    let ok = |r: Reply| (Op::Other, Outcome::Hit, r);
    let bad = |op: Op, r: Reply| (op, Outcome::Error, r);
    if !session.authenticated && !matches!(name, "AUTH" | "HELLO" | "QUIT") {
        return bad(Op::Other, error("NOAUTH Authentication required."));
    }
    if let Some(answer) = cluster_answer(name, &args, session.proto, shared) {
        return answer;
    }
    if name == "SET" {
        return set(args, shared).await;
    }
    let rest = args.get(1..).unwrap_or_default();
    match name {
        "PING" => match rest {
            [] => ok(simple("PONG")),
            [msg] => ok(bulk_bytes(msg.bytes())),
            _ => bad(Op::Other, wrong_args(name)),
        },
        "ECHO" => match rest {
            [msg] => ok(bulk_bytes(msg.bytes())),
            _ => bad(Op::Other, wrong_args(name)),
        },
        "QUIT" => ok(simple("OK")),
        "AUTH" => match rest {
            [pass] | [_, pass] if rest.len() == 1 || rest.first().is_some_and(|u| u.bytes() == b"default") => {
                match auth(pass.bytes(), session, shared) {
                    Ok(()) => ok(simple("OK")),
                    Err(r) => bad(Op::Other, r),
                }
            }
            [_, _] => bad(Op::Other, error("WRONGPASS invalid username-password pair or user is disabled.")),
            _ => bad(Op::Other, wrong_args(name)),
        },
        "HELLO" => hello(rest, session, shared),
        "CLIENT" => {
            let sub = rest.first().map(|a| String::from_utf8_lossy(a.bytes()).to_ascii_uppercase());
            match sub.as_deref() {
                Some("SETINFO" | "SETNAME") => ok(simple("OK")),
                Some("GETNAME") => ok(session.null()),
                Some("ID") => ok(int(session.id)),
                _ => bad(
                    Op::Other,
                    error("ERR unknown CLIENT subcommand; kvhoard answers SETINFO, SETNAME, GETNAME, ID"),
                ),
            }
        }
        "SELECT" => match rest {
            [db] if db.bytes() == b"0" => ok(simple("OK")),
            [_] => bad(Op::Other, error("ERR DB index is out of range (kvhoard has database 0 only)")),
            _ => bad(Op::Other, wrong_args(name)),
        },
        "COMMAND" => ok(Reply::Raw(cluster::commands::command(&words(rest), session.proto))),
        "INFO" => match info::info(&words(rest), shared).await {
            Ok(text) => ok(bulk_bytes(text.as_bytes())),
            Err(e) => bad(Op::Other, error(&format!("ERR {e}"))),
        },
        "DBSIZE" => match info::dbsize(shared).await {
            Ok(n) => ok(int(n)),
            Err(e) => bad(Op::Other, error(&format!("ERR {e}"))),
        },
        "EXISTS" => exists(rest, shared),
        "GET" => match rest {
            [key] => get(key, session, shared).await,
            _ => bad(Op::Get, wrong_args(name)),
        },
        "DEL" | "UNLINK" => delete(rest, shared).await,
        _ => bad(
            Op::Other,
            error(&format!("ERR unknown command '{}'", name.chars().take(64).collect::<String>().to_ascii_lowercase())),
        ),
    }
}

fn words(args: &[Arg]) -> Vec<&[u8]> {
    args.iter().map(Arg::bytes).collect()
}

/// In cluster mode, the cluster commands and the redirection of keys other nodes serve; the
/// CLUSTER family's refusal in standalone mode. `None`: the command is served here as usual.
fn cluster_answer(name: &str, args: &[Arg], proto: u8, shared: &Shared) -> Option<(Op, Outcome, Reply)> {
    let answer = cluster::commands::answer(name, &words(args.get(1..).unwrap_or_default()), proto, &shared.cluster)?;
    Some((Op::Other, if answer.ok { Outcome::Hit } else { Outcome::Error }, Reply::Raw(answer.bytes)))
}

fn auth(pass: &[u8], session: &mut Session, shared: &Shared) -> Result<(), Reply> {
    match &shared.opts.resp_password {
        None => Err(error(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        )),
        Some(want) if constant_time_eq(want.as_bytes(), pass) => {
            session.authenticated = true;
            Ok(())
        }
        Some(_) => Err(error("WRONGPASS invalid username-password pair or user is disabled.")),
    }
}

/// Compares without returning early at the first differing byte, so that the time a wrong
/// password takes says nothing about how much of it was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hello(rest: &[Arg], session: &mut Session, shared: &Shared) -> (Op, Outcome, Reply) {
    let bad = |r: Reply| (Op::Other, Outcome::Error, r);
    let mut proto = session.proto;
    let mut opts = rest;
    if let Some((ver, tail)) = rest.split_first() {
        match ver.bytes() {
            b"2" => proto = 2,
            b"3" => proto = 3,
            _ => return bad(error("NOPROTO unsupported protocol version")),
        }
        opts = tail;
    }
    while let Some((opt, tail)) = opts.split_first() {
        let opt = String::from_utf8_lossy(opt.bytes()).to_ascii_uppercase();
        match (opt.as_str(), tail) {
            ("AUTH", [_user, pass, more @ ..]) => {
                if let Err(r) = auth(pass.bytes(), session, shared) {
                    return bad(r);
                }
                opts = more;
            }
            ("SETNAME", [_name, more @ ..]) => opts = more,
            _ => return bad(error(&format!("ERR syntax error in HELLO option '{opt}'"))),
        }
    }
    if !session.authenticated {
        return bad(error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"));
    }
    session.proto = proto;
    let bulk = |s: &str| format!("${}\r\n{s}\r\n", s.len());
    let fields = [
        (bulk("server"), bulk("redis")),
        (bulk("version"), bulk("7.2.0")),
        (bulk("proto"), format!(":{proto}\r\n")),
        (bulk("id"), format!(":{}\r\n", session.id)),
        (bulk("mode"), bulk(if shared.cluster.config().is_some() { "cluster" } else { "standalone" })),
        (bulk("role"), bulk("master")),
        (bulk("modules"), "*0\r\n".to_string()),
    ];
    let mut out = if proto == 3 { format!("%{}\r\n", fields.len()) } else { format!("*{}\r\n", fields.len() * 2) };
    for (k, v) in fields {
        out.push_str(&k);
        out.push_str(&v);
    }
    (Op::Other, Outcome::Hit, Reply::Raw(out.into_bytes()))
}

fn exists(keys: &[Arg], shared: &Shared) -> (Op, Outcome, Reply) {
    if keys.is_empty() {
        return (Op::Exists, Outcome::Error, wrong_args("EXISTS"));
    }
    let keys = match keys.iter().map(key_of).collect::<Result<Vec<_>, _>>() {
        Ok(k) => k,
        Err(r) => return (Op::Exists, Outcome::Error, r),
    };
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    // Index probes in memory, no disk I/O: answered right here.
    match shared.store.contains_batch(&shared.opts.resp_namespace, &refs) {
        Ok(found) => {
            let n = found.iter().filter(|&&f| f).count() as u64;
            (Op::Exists, if n > 0 { Outcome::Hit } else { Outcome::Miss }, int(n))
        }
        Err(e) => (Op::Exists, Outcome::Error, error(&format!("ERR {e}"))),
    }
}

async fn get(key: &Arg, session: &Session, shared: &Arc<Shared>) -> (Op, Outcome, Reply) {
    let key = match key_of(key) {
        Ok(k) => k,
        Err(r) => return (Op::Get, Outcome::Error, r),
    };
    match shared.get(&shared.opts.resp_namespace, key).await {
        Ok(Some(block)) => (Op::Get, Outcome::Hit, Reply::Bulk(Box::new(block))),
        Ok(None) => (Op::Get, Outcome::Miss, session.null()),
        Err(e) => {
            tracing::warn!("RESP GET failed in the store: {e}");
            (Op::Get, Outcome::Error, error(&format!("ERR {e}")))
        }
    }
}

async fn set(mut args: Vec<Arg>, shared: &Arc<Shared>) -> (Op, Outcome, Reply) {
    let bad = |r: Reply| (Op::Put, Outcome::Error, r);
    if args.len() < 3 {
        return bad(wrong_args("SET"));
    }
    let options = args.split_off(3);
    let (Some(value), Some(key)) = (args.pop(), args.pop()) else {
        return bad(wrong_args("SET"));
    };
    let key = match key_of(&key) {
        Ok(k) => k,
        Err(r) => return bad(r),
    };
    let mut ttl_secs = shared.opts.ttl_secs;
    match options.as_slice() {
        [] => {}
        [unit, n] => {
            let unit = String::from_utf8_lossy(unit.bytes()).to_ascii_uppercase();
            let n: Option<u64> = std::str::from_utf8(n.bytes()).ok().and_then(|s| s.parse().ok()).filter(|&n| n > 0);
            let secs = match (unit.as_str(), n) {
                ("EX", Some(n)) => n,
                // The engine keeps TTLs in whole seconds: round up so nothing expires early.
                ("PX", Some(n)) => n.div_ceil(1000),
                (_, None) if unit == "EX" || unit == "PX" => {
                    return bad(error("ERR invalid expire time in 'set' command"))
                }
                _ => return bad(error("ERR syntax error (kvhoard's SET takes EX or PX only)")),
            };
            ttl_secs = Some(u32::try_from(secs).unwrap_or(u32::MAX));
        }
        _ => return bad(error("ERR syntax error (kvhoard's SET takes EX or PX only)")),
    }
    let Arg::Payload(buf, room) = value else {
        // A SET value is always read into a payload buffer; a refused one never gets here.
        return bad(error("ERR no value"));
    };
    shared.metrics.received(Proto::Resp, buf.len() as u64);
    let store = Arc::clone(&shared.store);
    let namespace = shared.opts.resp_namespace.clone();
    let opts =
        PutOptions { durability: shared.opts.durability, ttl_secs, codec: shared.opts.codec, ..Default::default() };
    let stored = tokio::task::spawn_blocking(move || {
        let r = store.put(&namespace, &key, &buf, &opts);
        // The buffer and its room in the budget go back as soon as the engine has the bytes.
        drop((buf, room));
        r
    });
    match stored.await {
        Ok(Ok(_)) => (Op::Put, Outcome::Hit, simple("OK")),
        Ok(Err(e)) => {
            tracing::warn!("RESP SET refused by the store: {e}");
            bad(error(&format!("ERR {e}")))
        }
        Err(e) => bad(error(&format!("ERR {e}"))),
    }
}

async fn delete(keys: &[Arg], shared: &Arc<Shared>) -> (Op, Outcome, Reply) {
    if keys.is_empty() {
        return (Op::Delete, Outcome::Error, wrong_args("DEL"));
    }
    let keys = match keys.iter().map(key_of).collect::<Result<Vec<_>, _>>() {
        Ok(k) => k,
        Err(r) => return (Op::Delete, Outcome::Error, r),
    };
    let store = Arc::clone(&shared.store);
    let namespace = shared.opts.resp_namespace.clone();
    let durability = shared.opts.durability;
    let deleted = tokio::task::spawn_blocking(move || {
        keys.iter().try_fold(0u64, |n, k| store.delete(&namespace, k, durability).map(|d| n + u64::from(d)))
    })
    .await;
    match deleted {
        Ok(Ok(n)) => (Op::Delete, if n > 0 { Outcome::Hit } else { Outcome::Miss }, int(n)),
        Ok(Err(e)) => (Op::Delete, Outcome::Error, error(&format!("ERR {e}"))),
        Err(e) => (Op::Delete, Outcome::Error, error(&format!("ERR {e}"))),
    }
}
