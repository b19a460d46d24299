//! Reading a running server's metrics endpoint (`kvhoard serve --metrics ADDR`): `kvhoard plan
//! live` and `kvhoard ttl` ask it over plain HTTP/1.1.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context};

/// Longest a server may take to answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The body of `GET path` from `addr`; an answer other than 200 is an error with its text.
pub fn get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)
        .with_context(|| format!("cannot reach {addr}: is `kvhoard serve --metrics {addr}` running?"))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).with_context(|| format!("{addr} did not answer in {TIMEOUT:?}"))?;
    let (head, body) = reply.split_once("\r\n\r\n").with_context(|| format!("{addr} sent no HTTP answer"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        bail!("{addr} answered {status}: {}", body.trim());
    }
    Ok(body.to_string())
}
