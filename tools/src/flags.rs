//! Parsers of flag values that several commands share (sizes are in `size.rs`).

use kvhoard_engine::{Durability, IoBackend};

/// `buffered`, `written` or `synced`.
pub fn parse_durability(s: &str) -> Result<Durability, String> {
    s.parse()
}

/// `auto`, `io_uring` or `pread`.
pub fn parse_backend(s: &str) -> Result<IoBackend, String> {
    s.parse()
}
