//! Reading a running server's metrics endpoint (`kvhoard serve --metrics ADDR`): `kvhoard plan
//! live` and `kvhoard ttl` ask it over plain HTTP/1.1, and `kvhoard ns show|set http://ADDR`
//! read and set namespace policies through it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

/// Longest a server may take to answer.
const TIMEOUT: Duration = Duration::from_secs(10);

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
    let mut reply = String::new();
    stream.read_to_string(&mut reply).with_context(|| format!("{addr} did not answer in {TIMEOUT:?}"))?;
    let (head, body) = reply.split_once("\r\n\r\n").with_context(|| format!("{addr} sent no HTTP answer"))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        bail!("{addr} answered {status}: {}", body.trim());
    }
    Ok(body.to_string())
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
