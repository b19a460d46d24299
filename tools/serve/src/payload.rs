//! Reading a request's payload into memory, taking room from the budget as its bytes arrive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvhoard_engine::buffer::{BufferPool, PooledBuf};
use tokio::io::AsyncRead;

use crate::budget::{Budget, Room};
use crate::end::End;
use crate::pace::{read_some, Pace};

/// Room is taken this far ahead of the bytes received: a client that stalls holds at most this
/// much more than it sent.
pub const AHEAD: u64 = 256 << 10;

/// Where a payload's memory comes from.
pub(crate) struct Memory<'a> {
    pub budget: &'a Budget,
    pub pool: &'a Arc<BufferPool>,
    /// Longest wait for room before the request is given up.
    pub patience: Duration,
}

/// Reads `len` bytes. The buffer is mapped lazily, in 4 KiB pages
/// ([`kvhoard_engine::buffer::AlignedBuf::zeroed_for_stream`]), so memory, like room, is taken
/// only as the bytes arrive.
pub(crate) async fn read<R: AsyncRead + Unpin>(
    r: &mut R,
    len: usize,
    pace: &mut Pace,
    memory: &Memory<'_>,
) -> Result<(PooledBuf, Room), End> {
    let mut claim = memory.budget.claim();
    let mut buf = memory.pool.get_for_stream(len);
    let mut done = 0usize;
    while done < len {
        if claim.held_bytes() <= done as u64 {
            let waited = Instant::now();
            let ahead = (done as u64 + AHEAD).min(len as u64);
            claim.hold(ahead, memory.patience).await.map_err(|e| End::Lost(e.to_string()))?;
            pace.excuse(waited.elapsed());
        }
        let end = usize::try_from(claim.held_bytes()).unwrap_or(len).min(len);
        let dst = buf.get_mut(done..end).unwrap_or_default();
        let n = tokio::select! {
            n = read_some(r, dst, pace) => n?,
            () = claim.cut() => return Err(End::Lost(crate::budget::ClaimError::Cut.to_string())),
        };
        done += n;
        claim.progressed();
    }
    Ok((buf, claim.into_room()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pace::PaceLimits;
    use tokio::io::AsyncWriteExt;

    fn limits() -> PaceLimits {
        PaceLimits { progress: Duration::from_secs(5), grace: Duration::from_secs(5), min_rate: 0 }
    }

    #[tokio::test]
    async fn a_payload_arrives_whole_holding_room_for_what_arrived() {
        let budget = Budget::new(64 << 20);
        let pool = BufferPool::new(4, 64 << 20);
        let memory = Memory { budget: &budget, pool: &pool, patience: Duration::from_secs(5) };
        let payload: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        let sent = payload.clone();
        let writer = tokio::spawn(async move { client.write_all(&sent).await });
        let mut pace = Pace::start(limits());
        let (buf, room) = read(&mut server, payload.len(), &mut pace, &memory).await.expect("whole");
        writer.await.expect("task").expect("sent");
        assert!(buf[..] == payload[..]);
        assert_eq!(budget.free_bytes(), budget.total_bytes() - (3_000_000u64.div_ceil(64 << 10) * (64 << 10)));
        drop((buf, room));
        assert_eq!(budget.free_bytes(), budget.total_bytes());
    }

    #[tokio::test]
    async fn a_client_that_announces_much_and_sends_little_holds_little() {
        let budget = Budget::new(64 << 20);
        let pool = BufferPool::new(4, 64 << 20);
        let memory = Memory { budget: &budget, pool: &pool, patience: Duration::from_secs(5) };
        let (mut client, mut server) = tokio::io::duplex(1 << 16);
        client.write_all(&[1u8; 150]).await.expect("sent");
        let (b, p) = (budget.clone(), Arc::clone(&pool));
        let reading = tokio::spawn(async move {
            let memory = Memory { budget: &b, pool: &p, patience: Duration::from_secs(5) };
            let mut pace = Pace::start(limits());
            read(&mut server, 100 << 20, &mut pace, &memory).await.map(|_| ())
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(memory.budget.total_bytes() - memory.budget.free_bytes(), AHEAD, "room for one chunk, not 100 MiB");
        drop(client);
        let got = reading.await.expect("task");
        assert!(matches!(got, Err(End::Lost(_))), "the client went away");
        assert_eq!(memory.budget.free_bytes(), memory.budget.total_bytes(), "its room came back");
    }
}
