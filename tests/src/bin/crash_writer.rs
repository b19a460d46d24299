//! Child process of the crash test: writes blocks with `synced` durability and prints an
//! acknowledgement line after each one returns, until it is killed.
//!
//! Usage: crash-writer VOLUME FIRST_ID [hold|hot] [buffered]
//!   Prints `put ID` after block ID is durable, `del ID` after a deletion of block ID is durable.
//!   With `hot`, after every eighth block (ID % 8 == 5) it also writes one of four keys again,
//!   `hot{J}` with J = ID / 8 % 4, with a block larger than the log writer's joined writes and
//!   `written` durability (which a process crash must not lose), and prints `hot J ID` once
//!   written.
//!   With `hold`, opens the volume, prints `open`, and sleeps (to test the volume lock).
//!   With `buffered`, writes through the page cache instead of O_DIRECT.

use std::io::Write;
use std::path::PathBuf;

use kvhoard_engine::{Durability, PutOptions, Store, StoreOptions};
use kvhoard_tests::{block, crash_block_len, hot_block};

fn main() {
    if let Err(e) = run() {
        eprintln!("crash-writer: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let volume = PathBuf::from(args.get(1).ok_or("missing VOLUME")?);
    let first: u64 = args.get(2).ok_or("missing FIRST_ID")?.parse()?;
    let direct_io = args.get(4).map(String::as_str) != Some("buffered");
    let store = Store::open(&volume, StoreOptions { direct_io, ..StoreOptions::default() })?;
    let mut out = std::io::stdout().lock();
    if args.get(3).map(String::as_str) == Some("hold") {
        writeln!(out, "open")?;
        out.flush()?;
        std::thread::sleep(std::time::Duration::from_secs(600));
        return Ok(());
    }
    let hot = args.get(3).map(String::as_str) == Some("hot");
    let opts = PutOptions { durability: Durability::Synced, ..PutOptions::default() };
    for id in first.. {
        store.put("default", &format!("k{id}"), &block(id, crash_block_len(id)), &opts)?;
        writeln!(out, "put {id}")?;
        out.flush()?;
        if hot && id % 8 == 5 {
            let hot = id / 8 % 4;
            let written = PutOptions { durability: Durability::Written, ..PutOptions::default() };
            store.put("default", &format!("hot{hot}"), &hot_block(id), &written)?;
            writeln!(out, "hot {hot} {id}")?;
            out.flush()?;
        }
        if id % 7 == 3 && id > first {
            let victim = id - 1;
            store.delete("default", &format!("k{victim}"), Durability::Synced)?;
            writeln!(out, "del {victim}")?;
            out.flush()?;
        }
    }
    Ok(())
}
