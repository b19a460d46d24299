//! put, get and rm of single keys.

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kvhoard_engine::{Durability, PutOptions, ReadOptions, StoreOptions};

use super::{hex, open};
use crate::EXIT_NOT_FOUND;

#[expect(clippy::too_many_arguments, reason = "one argument per command-line option of `put`, passed straight through")]
pub fn put(
    volume: &Path,
    namespace: &str,
    key: &str,
    file: Option<&Path>,
    ttl: Option<u32>,
    group: Option<u64>,
    durability: Durability,
    json: bool,
    opts: StoreOptions,
) -> anyhow::Result<ExitCode> {
    let bytes = match file {
        Some(p) if p != Path::new("-") => std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?,
        _ => {
            let mut buf = Vec::new();
            std::io::stdin().lock().read_to_end(&mut buf).context("cannot read the block from stdin")?;
            buf
        }
    };
    let store = open(volume, opts)?;
    let hash = store
        .put(namespace, key, &bytes, &PutOptions { ttl_secs: ttl, group, durability, ..PutOptions::default() })
        .with_context(|| format!("cannot store {key:?}"))?;
    store.close()?;
    if json {
        println!(
            "{}",
            serde_json::json!({ "namespace": namespace, "key": key, "bytes": bytes.len(), "content_hash": hex(&hash) })
        );
    } else {
        println!("{}", hex(&hash));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn get(
    volume: &Path,
    namespace: &str,
    key: &str,
    output: Option<&Path>,
    verify: bool,
    opts: StoreOptions,
) -> anyhow::Result<ExitCode> {
    let store = open(volume, opts)?;
    let Some(block) = store.get(namespace, key, ReadOptions { verify_hash: verify })? else {
        eprintln!("kvhoard: {key:?} not found in namespace {namespace:?}");
        return Ok(ExitCode::from(EXIT_NOT_FOUND));
    };
    match output {
        Some(p) if p != Path::new("-") => {
            std::fs::write(p, &*block).with_context(|| format!("cannot write {}", p.display()))?
        }
        _ => {
            let mut out = std::io::stdout().lock();
            out.write_all(&block).and_then(|()| out.flush()).context("cannot write to stdout")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn rm(
    volume: &Path,
    namespace: &str,
    key: &str,
    durability: Durability,
    opts: StoreOptions,
) -> anyhow::Result<ExitCode> {
    let store = open(volume, opts)?;
    let existed = store.delete(namespace, key, durability).with_context(|| format!("cannot delete {key:?}"))?;
    store.close()?;
    if existed {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("kvhoard: {key:?} not found in namespace {namespace:?}");
        Ok(ExitCode::from(EXIT_NOT_FOUND))
    }
}
