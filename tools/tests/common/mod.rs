//! Running the `kvhoard` binary from the CLI tests.

#![allow(dead_code)] // each test file uses its own part of it

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs `kvhoard args`, stdin closed.
pub fn kvhoard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvhoard")).args(args).stdin(Stdio::null()).output().unwrap()
}

/// Runs `kvhoard args`, which must succeed; its standard output.
pub fn ok(args: &[&str]) -> String {
    let out = kvhoard(args);
    assert!(out.status.success(), "kvhoard {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A path as the command line takes it.
pub fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}
