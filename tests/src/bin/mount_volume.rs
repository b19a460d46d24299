//! Child process of the mount model test: opens (creating if needed) a volume, mounts it, prints
//! `mounted`, and serves until its standard input closes (then it unmounts and closes the volume
//! cleanly) or it is killed.
//!
//! Usage: mount-volume VOLUME MOUNTPOINT

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use kvhoard_engine::{CreateOptions, Store, StoreOptions};
use kvhoard_fuse::{mount, MountOptions};

fn main() {
    if let Err(e) = run() {
        eprintln!("mount-volume: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let volume = PathBuf::from(args.get(1).ok_or("missing VOLUME")?);
    let mountpoint = PathBuf::from(args.get(2).ok_or("missing MOUNTPOINT")?);
    let store = if volume.join("volume.kvh").exists() {
        Store::open(&volume, StoreOptions::default())?
    } else {
        let create = CreateOptions { capacity_bytes: Some(256 << 20), segment_size_bytes: 16 << 20 };
        Store::create(&volume, &create, StoreOptions::default())?
    };
    let store = Arc::new(store);
    let mounted = mount(Arc::clone(&store), &mountpoint, &MountOptions::default())?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "mounted")?;
    out.flush()?;
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    mounted.unmount()?;
    Arc::try_unwrap(store).map_err(|_| "the volume is still in use")?.close()?;
    Ok(())
}
