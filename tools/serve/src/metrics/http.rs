//! A minimal HTTP/1.1 endpoint for Prometheus: `GET /metrics` answers the metrics, anything else
//! 404 or 405, one request per connection. Prometheus scrapes this; nothing else needs more.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::Shared;

const HEAD_MAX: usize = 8 << 10;
const READ_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => {
                tokio::spawn(answer(stream, Arc::clone(&shared)));
            }
            Err(e) => {
                tracing::warn!("metrics listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The request line's method and path, once the head is complete.
fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(head.get(..end)?).ok()?;
    let mut parts = head.lines().next()?.split(' ');
    Some((parts.next()?, parts.next()?))
}

async fn answer(mut stream: TcpStream, shared: Arc<Shared>) {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let (status, body) = loop {
        if let Some((method, path)) = request_line(&head) {
            break match (method, path.split('?').next().unwrap_or(path)) {
                ("GET", "/metrics") => ("200 OK", render(&shared).await),
                ("GET", _) => ("404 Not Found", "not found: metrics are at /metrics\n".to_string()),
                _ => ("405 Method Not Allowed", "only GET /metrics\n".to_string()),
            };
        }
        if head.len() >= HEAD_MAX {
            break ("431 Request Header Fields Too Large", String::new());
        }
        match tokio::time::timeout(READ_TIMEOUT, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            _ => return,
        }
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(READ_TIMEOUT, stream.write_all(reply.as_bytes())).await;
    let _ = stream.shutdown().await;
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
    use super::request_line;

    #[test]
    fn request_lines() {
        assert_eq!(request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Some(("GET", "/metrics")));
        assert_eq!(request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), None);
        assert_eq!(request_line(b"\xff\xfe\r\n\r\n"), None);
    }
}
