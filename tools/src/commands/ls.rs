use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kvhoard_engine::{ListCursor, StoreOptions};

use super::{hex, open};
use crate::size::human;

const PAGE: usize = 1024;

pub fn run(
    volume: &Path,
    namespace: &str,
    limit: Option<usize>,
    after: Option<&str>,
    long: bool,
    json: bool,
    opts: StoreOptions,
) -> anyhow::Result<ExitCode> {
    let store = open(volume, opts)?;
    let mut cursor: Option<ListCursor> = after.map(str::parse).transpose()?;
    let mut left = limit.unwrap_or(usize::MAX);
    let mut out = std::io::stdout().lock();
    let mut last = None;
    while left > 0 {
        let page = store.list(namespace, cursor, left.min(PAGE))?;
        for e in &page.entries {
            if json {
                let line = serde_json::json!({
                    "key": e.key, "bytes": e.raw_len, "content_hash": hex(&e.content_hash),
                    "created_unix_ms": e.created_unix_ms, "ttl_secs": e.ttl_secs, "deduplicated": e.deduplicated,
                    "codec": e.codec,
                });
                writeln!(out, "{line}")
            } else if long {
                writeln!(
                    out,
                    "{:>10}  {:<13}  {}  {}  {}",
                    human(e.raw_len),
                    e.codec,
                    crate::time::utc(e.created_unix_ms),
                    &hex(&e.content_hash)[..16],
                    e.key
                )
            } else {
                writeln!(out, "{}", e.key)
            }
            .context("cannot write to stdout")?;
        }
        left = left.saturating_sub(page.entries.len());
        last = page.next;
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if json {
        writeln!(out, "{}", serde_json::json!({ "next": last.map(|c| c.to_string()) }))?;
    }
    Ok(ExitCode::SUCCESS)
}
