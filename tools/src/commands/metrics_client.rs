//! Reading a running server's metrics endpoint (`kvhoard serve --metrics ADDR`): `kvhoard plan
//! live` and `kvhoard ttl` ask it over plain HTTP/1.1, and `kvhoard ns show|set http://ADDR`
//! read and set namespace policies through it.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

/// Longest a server may take to answer, in all.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer taken (the views are a few KB; the group TTL view at most a few MB).
const REPLY_MAX: usize = 64 << 20;

/// The body of `GET path` from `addr`; an answer other than 200 is an error with its text.
fn get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    request(addr, "GET", path, "")
}

/// The body of `method path` with `body` from `addr`; an answer other than 200 is an error with
/// its text.
fn request(addr: std::net::SocketAddr, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)
        .with_context(|| format!("cannot reach {addr}: is `kvhoard serve --metrics {addr}` running?"))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    let reply = read_reply(&mut stream, addr)?;
    let (head, body) = reply.split_once("\r\n\r\n").with_context(|| format!("{addr} sent no HTTP answer"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        bail!("{addr} answered {status}: {}", body.trim());
    }
    Ok(body.to_string())
}

/// Reads the whole answer (the server closes the connection after it), within [`TIMEOUT`] in
/// all and [`REPLY_MAX`] bytes: a server that drips its answer or sends without end costs this
/// command ten seconds, not forever.
fn read_reply(stream: &mut TcpStream, addr: std::net::SocketAddr) -> anyhow::Result<String> {
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let not_http = reply.len() >= 5 && !reply.starts_with(b"HTTP/");
        if left.is_zero() || not_http {
            return Err(unfinished(addr, &reply));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(chunk.get(..n).unwrap_or_default()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(unfinished(addr, &reply))
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read {addr}'s answer")),
        }
        if reply.len() > REPLY_MAX {
            bail!("{addr} sent more than {} MiB: not the answer of `kvhoard serve --metrics`", REPLY_MAX >> 20);
        }
    }
    String::from_utf8(reply).map_err(|_| anyhow::anyhow!("{addr} answered with bytes that are not text"))
}

/// Why an answer that did not end in time (or is not HTTP) cannot be used.
fn unfinished(addr: std::net::SocketAddr, reply: &[u8]) -> anyhow::Error {
    if reply.is_empty() {
        anyhow::anyhow!("{addr} did not answer in {TIMEOUT:?}: is it `kvhoard serve --metrics`, and not overloaded?")
    } else if !reply.starts_with(b"HTTP/") {
        let start = String::from_utf8_lossy(reply.get(..reply.len().min(40)).unwrap_or_default()).into_owned();
        anyhow::anyhow!(
            "{addr} is not an HTTP server (it answered {start:?}): give the address of `kvhoard serve --metrics`"
        )
    } else {
        anyhow::anyhow!("{addr} did not finish its answer in {TIMEOUT:?}")
    }
}

/// Reads the JSON view at `path` from the metrics endpoint at `addr` (as `--metrics` takes it)
/// and prints it: as JSON with `json`, else as `render` puts it for people.
pub fn show(addr: &str, path: &str, json: bool, render: fn(&Value) -> String) -> anyhow::Result<()> {
    let addr = super::serve::parse_addr(addr)?;
    let body = get(addr, path)?;
    let view: Value = serde_json::from_str(&body).with_context(|| format!("the server's {path} is not JSON"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", render(&view));
    }
    Ok(())
}

/// The JSON at `path` of the metrics endpoint at `addr` (as `--metrics` takes it).
pub fn get_json(addr: &str, path: &str) -> anyhow::Result<Value> {
    let addr = super::serve::parse_addr(addr)?;
    let body = get(addr, path)?;
    serde_json::from_str(&body).with_context(|| format!("the server's {path} is not JSON"))
}

/// `value` put at `path` of the metrics endpoint at `addr`; the JSON it answers.
pub fn put_json(addr: &str, path: &str, value: &Value) -> anyhow::Result<Value> {
    let addr = super::serve::parse_addr(addr)?;
    let body = request(addr, "PUT", path, &value.to_string())?;
    serde_json::from_str(&body).with_context(|| format!("the server's answer to PUT {path} is not JSON"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Write as _;
    use std::net::TcpListener;

    use super::*;

    /// A server that answers one connection with `send` (repeated `times`) and then holds it open.
    fn server(send: &'static [u8], times: usize) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            for _ in 0..times {
                if conn.write_all(send).is_err() {
                    return;
                }
            }
            // Held open until the client gives up.
            let _ = conn.read(&mut [0u8; 1 << 16]);
            let _ = conn.read(&mut [0u8; 1]);
        });
        (addr, thread)
    }

    #[test]
    fn a_server_that_is_not_http_or_never_stops_sending_is_refused() {
        let (addr, thread) = server(b"+PONG\r\n", 1);
        let err = format!("{:#}", get(addr, "/ttl").unwrap_err());
        assert!(err.contains("is not an HTTP server") && err.contains("+PONG"), "{err}");
        thread.join().unwrap();
        let (addr, thread) = server(&[b'x'; 1 << 20], 100);
        let err = format!("{:#}", get(addr, "/ttl").unwrap_err());
        assert!(err.contains("is not an HTTP server"), "{err}");
        thread.join().unwrap();
        let (addr, thread) = server(b"HTTP/1.1 200 OK\r\n\r\n{\"endless\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]}\n", 5 << 20);
        let err = format!("{:#}", get(addr, "/ttl").unwrap_err());
        assert!(err.contains("more than 64 MiB"), "{err}");
        thread.join().unwrap();
    }
}
