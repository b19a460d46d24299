//! A minimal HTTP/1.1 endpoint for Prometheus: `GET /metrics` answers the metrics, `GET
//! /plan[?limit=N]` what the placement planner decides (JSON; `kvhoard plan live` reads it), `GET
//! /ttl` what group TTL decides in each namespace that keeps it (JSON; `kvhoard ttl` reads it),
//! `GET /ns` and `PUT /ns` the namespace policies (`ns.rs`; `kvhoard ns show|set
//! http://ADDR`), anything else 404 or 405, one request per connection (a body of at most 64 KiB,
//! by its `Content-Length`). Prometheus scrapes this; nothing else needs more.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::ns;
use crate::Shared;

const HEAD_MAX: usize = 8 << 10;
/// A request body's largest size (a namespace policy is a few hundred bytes).
const BODY_MAX: usize = 64 << 10;
const READ_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                tokio::spawn(answer(stream, peer.ip(), Arc::clone(&shared)));
            }
            Err(e) => {
                tracing::warn!("metrics listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A request's head, once complete: its method, path, length, and the body's length.
#[derive(Debug, PartialEq)]
struct Head {
    method: String,
    path: String,
    len: usize,
    body: usize,
}

/// The head at the start of `bytes`, once it is complete (`None` before); what is wrong with it
/// when it is not text, or its `Content-Length` is not one number. A body's length is its
/// `Content-Length` (0 without one).
fn request_head(bytes: &[u8]) -> Option<Result<Head, String>> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    Some(parse_head(bytes.get(..end).unwrap_or_default(), end + 4))
}

fn parse_head(head: &[u8], len: usize) -> Result<Head, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not text".to_string())?;
    let mut lines = text.lines();
    let mut parts = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
        return Err("the request line is not METHOD PATH VERSION".into());
    };
    let headers: Vec<(&str, &str)> = lines.filter_map(|l| l.split_once(':')).collect();
    // Bodies are sent whole with their length; a chunked one would be read as no body, or,
    // beside a Content-Length, as one of another length than the client meant.
    if headers.iter().any(|(name, _)| name.trim().eq_ignore_ascii_case("transfer-encoding")) {
        return Err("Transfer-Encoding is not supported: send the body with a Content-Length".into());
    }
    let lengths: Vec<&str> =
        headers.iter().filter(|(name, _)| name.eq_ignore_ascii_case("content-length")).map(|(_, v)| v.trim()).collect();
    let body = match lengths.as_slice() {
        [] => 0,
        [one] if !one.is_empty() && one.bytes().all(|b| b.is_ascii_digit()) => {
            one.parse::<usize>().map_err(|_| format!("Content-Length {one} is too large"))?
        }
        _ => return Err("Content-Length must be given once, as a number of bytes".into()),
    };
    Ok(Head { method: method.to_string(), path: path.to_string(), len, body })
}

/// An answer to `head` from `peer` given before its body is read: a body where none is taken,
/// one too large, or a policy change this server does not take (not asked to, or not from this
/// machine).
fn refused_early(shared: &Shared, peer: IpAddr, head: &Head) -> Option<ns::Answer> {
    let changes_policy = head.method == "PUT" && head.path == "/ns";
    if head.body > BODY_MAX {
        return Some(("413 Content Too Large", TEXT, format!("a body is at most {BODY_MAX} bytes\n")));
    }
    if head.body > 0 && !changes_policy {
        return Some(("400 Bad Request", TEXT, "only PUT /ns takes a body\n".into()));
    }
    if changes_policy && !shared.opts.policy_changes {
        let why = "this server does not take policy changes: start it with --allow-policy-changes\n";
        return Some(("403 Forbidden", TEXT, why.into()));
    }
    // An IPv4 peer of a dual-stack listener comes as ::ffff:a.b.c.d.
    if changes_policy && !peer.to_canonical().is_loopback() {
        let why = "namespace policies are changed only from the server's own machine (a loopback address)\n";
        return Some(("403 Forbidden", TEXT, why.into()));
    }
    None
}

async fn answer(mut stream: TcpStream, peer: IpAddr, shared: Arc<Shared>) {
    // One deadline for the whole request: a client sending a byte now and then gets no longer.
    let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let (status, kind, body) = loop {
        match request_head(&bytes) {
            Some(Err(why)) => break ("400 Bad Request", TEXT, format!("{why}\n")),
            Some(Ok(head)) => {
                if let Some(refused) = refused_early(&shared, peer, &head) {
                    break refused;
                }
                // The whole body is here (a request without one has it at once).
                if bytes.len() >= head.len + head.body {
                    let body = bytes.get(head.len..head.len + head.body).unwrap_or_default();
                    break route(&shared, &head, body).await;
                }
            }
            None if bytes.len() >= HEAD_MAX => break ("431 Request Header Fields Too Large", TEXT, String::new()),
            None => {}
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => bytes.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            _ => return,
        }
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(READ_TIMEOUT, stream.write_all(reply.as_bytes())).await;
    let _ = stream.shutdown().await;
}

/// What `head` (with `body`) is answered.
async fn route(shared: &Arc<Shared>, head: &Head, body: &[u8]) -> ns::Answer {
    let (route, query) = head.path.split_once('?').unwrap_or((&head.path, ""));
    match (head.method.as_str(), route) {
        ("GET", "/metrics") => ("200 OK", PROMETHEUS, render(shared).await),
        ("GET", "/plan") => match plan(shared, query).await {
            Plan::View(json) => ("200 OK", JSON, json),
            Plan::None => ("404 Not Found", TEXT, "no planner: this server runs without --placement planner\n".into()),
            Plan::Busy => ("503 Service Unavailable", TEXT, "the plan is being read by another request\n".into()),
            Plan::Failed(why) => ("500 Internal Server Error", TEXT, format!("the plan could not be read: {why}\n")),
        },
        ("GET", "/ttl") => match ttl(shared).await {
            Ok(json) => ("200 OK", JSON, json),
            Err(why) => ("500 Internal Server Error", TEXT, format!("group TTL could not be read: {why}\n")),
        },
        ("GET", "/ns") => ns::list(shared).await,
        ("PUT", "/ns") => ns::set(shared, body).await,
        ("GET", _) => (
            "404 Not Found",
            TEXT,
            "not found: metrics are at /metrics, the plan at /plan, group TTL at /ttl, namespace policies at /ns\n"
                .into(),
        ),
        _ => ("405 Method Not Allowed", TEXT, "only GET /metrics, /plan, /ttl, /ns and PUT /ns\n".to_string()),
    }
}

const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";
/// Contexts and steps `/plan` lists unless `limit=N` says.
const PLAN_LIMIT: usize = 20;
/// The most `limit=N` may ask for: the view sorts every context, and this bounds its reply.
const PLAN_LIMIT_MAX: usize = 10_000;

/// What `/plan` found.
enum Plan {
    View(String),
    /// The server runs without a planner.
    None,
    /// Another `/plan` is being answered.
    Busy,
    Failed(String),
}

/// The planner's view as JSON. `query` may hold `limit=N`. One at a time: the view walks every
/// context under the planner's lock.
async fn plan(shared: &Arc<Shared>, query: &str) -> Plan {
    let limit = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("limit="))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(PLAN_LIMIT)
        .min(PLAN_LIMIT_MAX);
    let Ok(_one) = shared.plan_views.try_acquire() else { return Plan::Busy };
    let store = Arc::clone(&shared.store);
    // Off the network threads.
    match tokio::task::spawn_blocking(move || store.plan_view(limit)).await {
        Ok(Some(view)) => match serde_json::to_string_pretty(&view) {
            Ok(json) => Plan::View(json),
            Err(e) => Plan::Failed(e.to_string()),
        },
        Ok(None) => Plan::None,
        Err(e) => Plan::Failed(e.to_string()),
    }
}

/// Group TTL's view as JSON (at most 4,096 groups per namespace), read off the network threads.
async fn ttl(shared: &Arc<Shared>) -> Result<String, String> {
    let store = Arc::clone(&shared.store);
    let view = tokio::task::spawn_blocking(move || store.ttl_view()).await.map_err(|e| e.to_string())?;
    serde_json::to_string_pretty(&view).map_err(|e| e.to_string())
}

async fn render(shared: &Arc<Shared>) -> String {
    let mut text = shared.metrics.prometheus();
    text.push_str(&shared.cluster.prometheus());
    let store = Arc::clone(&shared.store);
    // The store's statistics take its locks; keep that off the network threads.
    if let Ok(stats) = tokio::task::spawn_blocking(move || store.stats().prometheus()).await {
        text.push_str(&stats);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{request_head, Head};

    #[test]
    fn request_heads() {
        let head =
            |method: &str, path: &str, len, body| Ok(Head { method: method.into(), path: path.into(), len, body });
        assert_eq!(request_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Some(head("GET", "/metrics", 34, 0)));
        assert_eq!(request_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), None, "not complete yet");
        let put = b"PUT /ns HTTP/1.1\r\ncontent-length: 12\r\n\r\n{\"lossy\": 1}";
        assert_eq!(request_head(put), Some(head("PUT", "/ns", 40, 12)));
        let bad = |bytes: &[u8]| request_head(bytes).is_some_and(|h| h.is_err());
        assert!(bad(b"\xff\xfe\r\n\r\n"), "not text");
        assert!(bad(b"PUT /ns HTTP/1.1\r\nContent-Length: many\r\n\r\n"));
        assert!(bad(b"PUT /ns HTTP/1.1\r\nContent-Length: -1\r\n\r\n"));
        assert!(bad(b"PUT /ns HTTP/1.1\r\nContent-Length: \r\n\r\n"), "an empty length is not a number");
        assert!(bad(b"PUT /ns HTTP/1.1\r\nContent-Length: +5\r\n\r\n"));
        assert!(bad(b"PUT /ns HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"));
        assert!(bad(b"PUT /ns HTTP/1.1\r\nContent-Length: 3\r\ntransfer-encoding: chunked\r\n\r\n"));
        assert!(bad(b"PUT /ns HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"));
        assert!(bad(b"PUT /ns HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n"));
        assert!(bad(b"GARBAGE\r\n\r\n"));
    }
}
