//! The `lm://` listener: LMCache's remote-server protocol over one store namespace.
//!
//! One request at a time per connection, as LMCache's client sends them. PUT has no reply, so a
//! refused PUT (too large, undescribable, engine error) is logged and counted and its payload
//! read and dropped: the connection stays usable and a later GET is a clean miss. A header that
//! cannot be parsed closes the connection, since where the next request starts is unknown.

pub mod wire;

use std::sync::Arc;
use std::time::Instant;

use kvhoard_engine::format::record::CompressionMeta;
use kvhoard_engine::PutOptions;

use tokio::io::{AsyncRead, AsyncWrite, BufReader};

use crate::conn::{self, End};
use crate::metrics::{Op, Outcome, Proto};
use crate::Shared;
use wire::{Code, Command, Request, WireMeta, NO_CHUNK, REQUEST_BYTES};

pub(crate) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut conn: BufReader<S>, shared: &Arc<Shared>) -> End {
    loop {
        if let Err(end) = conn::next_request(&mut conn, shared).await {
            return end;
        }
        let mut header = [0u8; REQUEST_BYTES];
        if let Err(end) = conn::read_full(&mut conn, &mut header, shared.opts.request_timeout).await {
            return end;
        }
        let request = match wire::parse_request(&header) {
            Ok(r) => r,
            Err(e) => return End::Protocol(format!("bad lm:// header: {e}")),
        };
        let started = Instant::now();
        let (op, outcome) = match request.command {
            Command::Put => (Op::Put, put(&mut conn, shared, request).await),
            Command::Get => (Op::Get, get(&mut conn, shared, request).await),
            Command::Exist => (Op::Exists, exist(&mut conn, shared, request).await),
            Command::Health => (Op::Other, reply(&mut conn, shared, Code::Success).await.map(|()| Outcome::Hit)),
            // LMCache's client never sends LIST and its server does not implement it.
            Command::List => (Op::Other, reply(&mut conn, shared, Code::Fail).await.map(|()| Outcome::Error)),
        };
        match outcome {
            Ok(outcome) => shared.metrics.request(Proto::Lm, op, outcome, started.elapsed()),
            Err(end) => {
                shared.metrics.request(Proto::Lm, op, Outcome::Error, started.elapsed());
                return end;
            }
        }
    }
}

async fn reply<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufReader<S>,
    shared: &Shared,
    code: Code,
) -> Result<(), End> {
    let header = wire::encode_reply(code, 0, &NO_CHUNK);
    conn::write_all(conn, &[&header], shared.opts.request_timeout).await
}

async fn put<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufReader<S>,
    shared: &Arc<Shared>,
    request: Request,
) -> Result<Outcome, End> {
    let timeout = shared.opts.request_timeout;
    let length = u64::from(request.length);
    let refuse = |why: String| {
        tracing::warn!(key = ?request.key, "lm:// PUT refused, payload dropped: {why}");
        Outcome::Error
    };
    if length > shared.opts.max_object_bytes {
        conn::discard(conn, length, timeout).await?;
        return Ok(refuse(format!(
            "{length} bytes is more than the largest object allowed ({} bytes, --max-object-size)",
            shared.opts.max_object_bytes
        )));
    }
    let key = match &request.key {
        Ok(k) => k.clone(),
        Err(e) => {
            conn::discard(conn, length, timeout).await?;
            return Ok(refuse(e.to_string()));
        }
    };
    let desc = match wire::desc_from_wire(&request.meta, length) {
        Ok(d) => d,
        Err(e) => {
            conn::discard(conn, length, timeout).await?;
            return Ok(refuse(e.to_string()));
        }
    };
    let room = shared.budget.take(length).await;
    let mut buf = shared.pool.get(request.length as usize);
    conn::read_full(conn, &mut buf, timeout).await?;
    shared.metrics.received(Proto::Lm, length);
    let store = Arc::clone(&shared.store);
    let namespace = shared.opts.lm_namespace.clone();
    let opts = PutOptions {
        desc: Some(desc),
        durability: shared.opts.durability,
        ttl_secs: shared.opts.ttl_secs,
        ..Default::default()
    };
    let stored = tokio::task::spawn_blocking(move || {
        let r = store.put(&namespace, &key, &buf, &opts);
        drop((buf, room));
        r
    })
    .await;
    Ok(match stored {
        Ok(Ok(_)) => Outcome::Hit,
        Ok(Err(e)) => refuse(format!("the store refused it: {e}")),
        Err(e) => refuse(format!("the store call failed: {e}")),
    })
}

async fn get<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufReader<S>,
    shared: &Arc<Shared>,
    request: Request,
) -> Result<Outcome, End> {
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
    let meta =
        if block.meta.compression == CompressionMeta::none() { wire::wire_from_desc(&block.meta.desc) } else { None };
    let Some(meta): Option<WireMeta> = meta.filter(|_| block.len() as u64 == block.meta.raw_len) else {
        // Stored through another interface, with no description LMCache could allocate from.
        tracing::debug!("lm:// GET of a block with no LMCache description: answered as a miss");
        reply(conn, shared, Code::Fail).await?;
        return Ok(Outcome::Miss);
    };
    let length = u32::try_from(block.len()).unwrap_or(u32::MAX);
    let header = wire::encode_reply(Code::Success, length, &meta);
    conn::write_all(conn, &[&header, &block], timeout).await?;
    shared.metrics.sent(Proto::Lm, block.len() as u64);
    Ok(Outcome::Hit)
}

async fn exist<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufReader<S>,
    shared: &Shared,
    request: Request,
) -> Result<Outcome, End> {
    let found = match &request.key {
        // An index probe in memory: no disk I/O, so it runs right here.
        Ok(key) => shared.store.contains(&shared.opts.lm_namespace, key).unwrap_or(false),
        Err(_) => false,
    };
    reply(conn, shared, if found { Code::Success } else { Code::Fail }).await?;
    Ok(if found { Outcome::Hit } else { Outcome::Miss })
}
