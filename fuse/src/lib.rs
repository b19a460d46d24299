//! kvhoard as a FUSE file system: namespaces are directories, keys are files.
//!
//! ```text
//! /                      namespaces (`default` always exists; mkdir makes one, rmdir removes an empty one)
//! /<namespace>/<name>    one file per key: read returns the block; a file written and closed is stored
//! /.by-hash/<blake3>     every stored block by content hash, read-only
//! /.stats                the store's statistics as JSON, read-only
//! ```
//!
//! This crate only translates: every byte is stored and read through [`kvhoard_engine::Store`].
//! A file is stored when it is closed (its first flush), so a reader never sees half a block;
//! a rename publishes atomically, which is how LMCache's file connectors write. Key ↔ file name
//! escaping is in [`names`].

#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod fs;
pub mod inodes;
pub mod mount;
pub mod names;

pub use fs::{FsOptions, KvFs};
pub use mount::{check_mountpoint, mount, MountError, MountOptions, Mounted};
