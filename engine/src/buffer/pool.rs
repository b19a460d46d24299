//! A bounded pool of aligned buffers, reused without zeroing.
//!
//! Allocating a fresh aligned buffer for every record costs a memset of the whole buffer and a
//! page fault per 4 KiB; for 2 MiB blocks that was a third of the engine's CPU time. Buffers
//! return to the pool when their last user drops them and are handed out again as they are:
//! whoever takes one overwrites what it uses (a read fills it exactly, a record writer fills the
//! header, payload and padding explicitly), so stale bytes are never returned or written.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::AlignedBuf;

/// The pool. Holds at most `max_buffers` buffers and `max_bytes` bytes while they are unused.
#[derive(Debug)]
pub struct BufferPool {
    /// Unused buffers and when each was returned.
    free: Mutex<Vec<(AlignedBuf, Instant)>>,
    max_buffers: usize,
    max_bytes: usize,
}

impl BufferPool {
    /// A pool keeping at most `max_buffers` unused buffers of at most `max_bytes` in total.
    pub fn new(max_buffers: usize, max_bytes: usize) -> Arc<BufferPool> {
        Arc::new(BufferPool { free: Mutex::new(Vec::new()), max_buffers, max_bytes })
    }

    /// A buffer of at least `len` bytes (whole units), exposing exactly `len` bytes. Its contents
    /// are unspecified: the caller overwrites what it uses. A fresh one is advised to use huge
    /// pages ([`AlignedBuf::zeroed`]): for buffers written whole at once.
    pub fn get(self: &Arc<Self>, len: usize) -> PooledBuf {
        self.get_with(len, AlignedBuf::zeroed)
    }

    /// As [`BufferPool::get`], for a buffer filled over time as a client's bytes arrive: a fresh
    /// one takes memory only as it is written ([`AlignedBuf::zeroed_for_stream`]).
    pub fn get_for_stream(self: &Arc<Self>, len: usize) -> PooledBuf {
        self.get_with(len, AlignedBuf::zeroed_for_stream)
    }

    fn get_with(self: &Arc<Self>, len: usize, fresh: fn(usize) -> AlignedBuf) -> PooledBuf {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            // Best fit no more than twice the size, so large buffers are not wasted on small blocks.
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, (b, _))| b.len() >= len && b.len() <= len.saturating_mul(2).max(4096))
                .min_by_key(|(_, (b, _))| b.len())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i).0)
        };
        let buf = reused.unwrap_or_else(|| fresh(len));
        PooledBuf { buf: Some(buf), len, pool: Arc::clone(self) }
    }

    /// Keeps a returned buffer, making room by freeing those unused longest: the sizes in use
    /// now are those just returned. (Keeping the old ones instead, a pool filled by one phase's
    /// sizes, such as the put path's records, turned every buffer of another size away, and each
    /// of those was taken fresh from the system again, a page fault per 4 KiB.)
    fn put_back(&self, buf: AlignedBuf) {
        if self.max_buffers == 0 || buf.len() > self.max_bytes {
            return;
        }
        let mut evicted = Vec::new();
        {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let mut held: usize = free.iter().map(|(b, _)| b.len()).sum();
            while free.len() >= self.max_buffers || held + buf.len() > self.max_bytes {
                let Some(oldest) = free.iter().enumerate().min_by_key(|(_, (_, at))| *at).map(|(i, _)| i) else {
                    break;
                };
                let (old, _) = free.swap_remove(oldest);
                held -= old.len();
                evicted.push(old);
            }
            free.push((buf, Instant::now()));
        }
        // Dropped outside the lock: unmapping large buffers takes a while.
        drop(evicted);
    }

    /// Frees the buffers unused for `idle` or longer, so that memory taken by a burst returns to
    /// the system once the burst is over; returns the bytes freed.
    pub fn trim(&self, idle: Duration) -> usize {
        let stale: Vec<AlignedBuf> = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let (stale, keep) = std::mem::take(&mut *free).into_iter().partition(|(_, at)| at.elapsed() >= idle);
            *free = keep;
            stale.into_iter().map(|(b, _)| b).collect::<Vec<_>>()
        };
        // Dropped outside the lock: unmapping large buffers takes a while.
        stale.iter().map(|b| b.len()).sum()
    }

    /// Bytes held by unused buffers.
    pub fn held_bytes(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(b, _)| b.len()).sum()
    }
}

/// A buffer from a [`BufferPool`]; returns to it when dropped.
pub struct PooledBuf {
    buf: Option<AlignedBuf>,
    len: usize,
    pool: Arc<BufferPool>,
}

impl PooledBuf {
    /// Exposes only the first `len` bytes from now on (a codec's output, shorter than the
    /// buffer it was given). Never grows the buffer.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().and_then(|b| b.get(..self.len)).unwrap_or_default()
    }
}

impl DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        self.buf.as_deref_mut().and_then(|b| b.get_mut(..len)).unwrap_or_default()
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.put_back(buf);
        }
    }
}

impl std::fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PooledBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn buffers_are_reused_best_fit_and_bounded() {
        let pool = BufferPool::new(2, 16 << 20);
        let a = pool.get(2 << 20);
        let ptr = a.as_ptr();
        assert_eq!(a.len(), 2 << 20);
        assert_eq!(ptr as usize % 4096, 0);
        drop(a);
        let b = pool.get((2 << 20) - 100);
        assert_eq!(b.as_ptr(), ptr, "the freed buffer is reused");
        assert_eq!(b.len(), (2 << 20) - 100);
        let small = pool.get(4096);
        assert_ne!(small.as_ptr(), ptr);
        drop((b, small));
        // A 2 MiB buffer is not handed out for a 4 KiB request (more than twice the size).
        let tiny = pool.get(4096);
        assert_ne!(tiny.as_ptr(), ptr);
        drop(tiny);
        let c = pool.get(8 << 20);
        let d = pool.get(8 << 20);
        let e = pool.get(8 << 20);
        drop((c, d, e));
        assert!(pool.held_bytes() <= 16 << 20);
        // A buffer larger than the whole pool is never kept.
        drop(pool.get(32 << 20));
        assert!(pool.held_bytes() <= 16 << 20);
    }

    #[test]
    fn a_full_pool_keeps_the_buffers_returned_last() {
        let pool = BufferPool::new(4, 64 << 20);
        // One phase fills the pool with small buffers...
        drop((pool.get(64 << 10), pool.get(64 << 10), pool.get(64 << 10), pool.get(64 << 10)));
        assert_eq!(pool.held_bytes(), 4 * (64 << 10));
        // ...the next one's large buffers take their places and are reused, not taken afresh.
        let large = pool.get(2 << 20);
        let ptr = large.as_ptr();
        drop(large);
        assert_eq!(pool.get(2 << 20).as_ptr(), ptr, "the returned buffer was kept");
        let all: Vec<PooledBuf> = (0..4).map(|_| pool.get(2 << 20)).collect();
        drop(all);
        assert_eq!(pool.held_bytes(), 4 * (2 << 20), "the oldest small buffers made room");
        // The byte bound holds too: 64 MiB of 24 MiB buffers keeps two.
        drop((pool.get(24 << 20), pool.get(24 << 20), pool.get(24 << 20)));
        assert!(pool.held_bytes() <= 64 << 20);
    }

    #[test]
    fn trim_frees_only_buffers_idle_long_enough() {
        let pool = BufferPool::new(8, 64 << 20);
        drop((pool.get(2 << 20), pool.get(4 << 20)));
        assert_eq!(pool.trim(Duration::from_secs(3600)), 0, "nothing has been idle an hour");
        assert_eq!(pool.held_bytes(), 6 << 20);
        assert_eq!(pool.trim(Duration::ZERO), 6 << 20);
        assert_eq!(pool.held_bytes(), 0);
    }
}
