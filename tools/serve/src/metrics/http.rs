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

/// The head at the start of `bytes`, once it is complete (`None` before, or if it is not text).
/// A body's length is its `Content-Length` (0 without one).
fn request_head(bytes: &[u8]) -> Option<Head> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let text = std::str::from_utf8(bytes.get(..end)?).ok()?;
    let mut lines = text.lines();
    let mut parts = lines.next()?.split(' ');
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let body = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .map_or(Some(0), |(_, v)| v.trim().parse::<usize>().ok())?;
    Some(Head { method, path, len: end + 4, body })
}

async fn answer(mut stream: TcpStream, peer: IpAddr, shared: Arc<Shared>) {
    let mut bytes = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let (status, kind, body) = loop {
        match request_head(&bytes) {
            Some(head) if head.body > BODY_MAX => {
                break ("413 Content Too Large", TEXT, format!("a body is at most {BODY_MAX} bytes\n"));
            }
            // The whole body is here (a request without one has it at once).
            Some(head) if bytes.len() >= head.len + head.body => {
                let body = bytes.get(head.len..head.len + head.body).unwrap_or_default();
                break route(&shared, peer, &head, body).await;
            }
            Some(_) => {}
            None if bytes.len() >= HEAD_MAX => break ("431 Request Header Fields Too Large", TEXT, String::new()),
            None => {}
        }
        match tokio::time::timeout(READ_TIMEOUT, stream.read(&mut chunk)).await {
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

/// What `head` (with `body`) from `peer` is answered.
async fn route(shared: &Arc<Shared>, peer: IpAddr, head: &Head, body: &[u8]) -> ns::Answer {
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
        ("PUT", "/ns") => ns::set(shared, peer, body).await,
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
        let head = |method: &str, path: &str, len, body| Head { method: method.into(), path: path.into(), len, body };
        assert_eq!(request_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Some(head("GET", "/metrics", 34, 0)));
        assert_eq!(request_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), None);
        assert_eq!(request_head(b"\xff\xfe\r\n\r\n"), None);
        let put = b"PUT /ns/a HTTP/1.1\r\ncontent-length: 12\r\n\r\n{\"lossy\": 1}";
        assert_eq!(request_head(put), Some(head("PUT", "/ns/a", 42, 12)));
        assert_eq!(request_head(b"PUT /ns/a HTTP/1.1\r\nContent-Length: many\r\n\r\n"), None);
    }
}
