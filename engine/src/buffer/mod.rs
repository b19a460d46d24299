//! Memory for blocks: buffers aligned for O_DIRECT, and a bounded pool that reuses them.

mod aligned;
mod pool;

pub use aligned::AlignedBuf;
pub use pool::{BufferPool, PooledBuf};
