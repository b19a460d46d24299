//! The `lm://` listener: LMCache's remote-server protocol over one store namespace.
//!
//! Requests are read one at a time per connection, as LMCache's client sends them. PUT has no
//! reply, so a refused PUT (too large, undescribable, engine error) is logged and counted and its
//! payload read and dropped: the connection stays usable and a later GET is a clean miss. A PUT
//! that is accepted is stored while the next requests are read ([`pending`]). A header that
//! cannot be parsed closes the connection, since where the next request starts is unknown.

mod pending;
pub mod wire;

use std::sync::Arc;
use std::time::Instant;

use kvhoard_engine::PutOptions;

use crate::conn::{self, Conn};
use crate::end::End;
use crate::metrics::{Op, Outcome, Proto};
use crate::pace::Pace;
use crate::payload;
use crate::Shared;
use pending::Pending;
use wire::{Code, Command, Request, WireMeta, NO_CHUNK, REQUEST_BYTES};

pub(crate) async fn serve(mut conn: Conn, shared: &Arc<Shared>) -> End {
    let mut pending = Pending::default();
    let end = serve_requests(&mut conn, shared, &mut pending).await;
    // PUTs already read are stored whatever ended the connection.
    pending.drain().await;
    end
}

async fn serve_requests(conn: &mut Conn, shared: &Arc<Shared>, pending: &mut Pending) -> End {
    // Whether the client sent a request before: one that never did is closed first for room.
    let mut served = false;
    loop {
        if let Err(end) = conn::next_request(conn, shared, served).await {
            return end;
        }
        served = true;
        let mut pace = shared.pace();
        let mut header = [0u8; REQUEST_BYTES];
        if let Err(end) = conn::read_full(conn, &mut header, &mut pace).await {
            return end;
        }
        let request = match wire::parse_request(&header) {
            Ok(r) => r,
            Err(e) => return End::Protocol(format!("bad lm:// header: {e}")),
        };
        let started = Instant::now();
        if let (Command::Get | Command::Exist, Ok(key)) = (request.command, &request.key) {
            pending.settle(key).await;
        }
        let (op, outcome) = match request.command {
            Command::Put => (Op::Put, put(conn, shared, request, (started, pace), pending).await),
            Command::Get => (Op::Get, get(conn, shared, request).await.map(Some)),
            Command::Exist => (Op::Exists, exist(conn, shared, request).await.map(Some)),
            Command::Health => (Op::Other, reply(conn, shared, Code::Success).await.map(|()| Some(Outcome::Hit))),
            // LMCache's client never sends LIST and its server does not implement it.
            Command::List => (Op::Other, reply(conn, shared, Code::Fail).await.map(|()| Some(Outcome::Error))),
        };
        match outcome {
            // A PUT being stored counts itself when it is done.
            Ok(None) => {}
            Ok(Some(outcome)) => shared.metrics.request(Proto::Lm, op, outcome, started.elapsed()),
            Err(end) => {
                shared.metrics.request(Proto::Lm, op, Outcome::Error, started.elapsed());
                return end;
            }
        }
    }
}

async fn reply(conn: &mut Conn, shared: &Shared, code: Code) -> Result<(), End> {
    let header = wire::encode_reply(code, 0, &NO_CHUNK);
    conn::write_all(conn, &[&header], shared.opts.request_timeout, &shared.blocking_sends).await
}

/// Reads a PUT's payload and starts storing it (`None`), or refuses it (`Some(Outcome::Error)`).
async fn put(
    conn: &mut Conn,
    shared: &Arc<Shared>,
    request: Request,
    (started, mut pace): (Instant, Pace),
    pending: &mut Pending,
) -> Result<Option<Outcome>, End> {
    let pace = &mut pace;
    let length = u64::from(request.length);
    if length > shared.opts.max_object_bytes {
        conn::discard(conn, length, pace).await?;
        return Ok(Some(refused(
            &request.key,
            format!(
                "{length} bytes is more than the largest object allowed ({} bytes, --max-object-size)",
                shared.opts.max_object_bytes
            ),
        )));
    }
    let key = match &request.key {
        Ok(k) => k.clone(),
        Err(e) => {
            conn::discard(conn, length, pace).await?;
            return Ok(Some(refused(&request.key, e.to_string())));
        }
    };
    let desc = match wire::desc_from_wire(&request.meta, length) {
        Ok(d) => d,
        Err(e) => {
            conn::discard(conn, length, pace).await?;
            return Ok(Some(refused(&request.key, e.to_string())));
        }
    };
    let (buf, room) = payload::read(conn, request.length as usize, pace, &shared.memory()).await?;
    shared.metrics.received(Proto::Lm, length);
    // Two PUTs of one key are stored in the order they came.
    pending.settle(&key).await;
    let task = {
        let shared = Arc::clone(shared);
        let key = key.clone();
        tokio::task::spawn_blocking(move || {
            let opts = PutOptions {
                desc: Some(desc),
                durability: shared.opts.durability,
                ttl_secs: shared.opts.ttl_secs,
                codec: shared.opts.codec,
                ..Default::default()
            };
            let stored = shared.store.put(&shared.opts.lm_namespace, &key, &buf, &opts);
            drop((buf, room));
            let outcome = match stored {
                Ok(_) => Outcome::Hit,
                Err(e) => refused(&Ok(key), format!("the store refused it: {e}")),
            };
            shared.metrics.request(Proto::Lm, Op::Put, outcome, started.elapsed());
        })
    };
    pending.push(key, task).await;
    Ok(None)
}

/// Logs a refused PUT; its payload was (or is being) dropped.
fn refused(key: &Result<String, wire::KeyError>, why: String) -> Outcome {
    // The key as text, cut short: a hostile one can be long or full of NULs.
    let shown = match key {
        Ok(k) => kvhoard_engine::format::quoted_short(k),
        Err(e) => format!("(not a key: {e})"),
    };
    tracing::warn!(key = %shown, "lm:// PUT refused, payload dropped: {why}");
    Outcome::Error
}

async fn get(conn: &mut Conn, shared: &Shared, request: Request) -> Result<Outcome, End> {
    let timeout = shared.opts.request_timeout;
    let key = match request.key {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!("lm:// GET failed: {e}");
            reply(conn, shared, Code::Fail).await?;
            return Ok(Outcome::Error);
        }
    };
    let block = match shared.get(&shared.opts.lm_namespace, key).await {
        Ok(Some(block)) => block,
        Ok(None) => {
            reply(conn, shared, Code::Fail).await?;
            return Ok(Outcome::Miss);
        }
        Err(e) => {
            tracing::warn!("lm:// GET failed in the store: {e}");
            reply(conn, shared, Code::Fail).await?;
            return Ok(Outcome::Error);
        }
    };
    // Compressed blocks come back decoded, in their original description.
    let meta = wire::wire_from_desc(&block.meta.desc);
    let Some(meta): Option<WireMeta> = meta.filter(|_| block.len() as u64 == block.meta.raw_len) else {
        // Stored through another interface, with no description LMCache could allocate from.
        tracing::debug!("lm:// GET of a block with no LMCache description: answered as a miss");
        reply(conn, shared, Code::Fail).await?;
        return Ok(Outcome::Miss);
    };
    let length = u32::try_from(block.len()).unwrap_or(u32::MAX);
    let header = wire::encode_reply(Code::Success, length, &meta);
    conn::write_all(conn, &[&header, &block], timeout, &shared.blocking_sends).await?;
    shared.metrics.sent(Proto::Lm, block.len() as u64);
    Ok(Outcome::Hit)
}

async fn exist(conn: &mut Conn, shared: &Shared, request: Request) -> Result<Outcome, End> {
    let found = match &request.key {
        // An index probe in memory: no disk I/O, so it runs right here.
        Ok(key) => shared.store.contains(&shared.opts.lm_namespace, key).unwrap_or(false),
        Err(_) => false,
    };
    reply(conn, shared, if found { Code::Success } else { Code::Fail }).await?;
    Ok(if found { Outcome::Hit } else { Outcome::Miss })
}
