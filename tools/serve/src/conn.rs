//! What every connection does, whatever its protocol: accepting under the connection limit,
//! waiting for the next request (or shutdown), and reading and writing with a progress timeout.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Proto;
use crate::{lm, resp, Shared};

/// Bytes of each connection's read buffer; payloads larger than this are read straight into
/// their own buffers.
pub(crate) const READ_BUFFER: usize = 16 << 10;

/// Why a connection ends.
#[derive(Debug)]
pub(crate) enum End {
    /// The client closed it between requests, or the server is shutting down.
    Done,
    /// The client went away or stalled in the middle of a request.
    Lost(String),
    /// The client broke the protocol; the connection cannot go on.
    Protocol(String),
}

pub(crate) async fn accept_loop(listener: TcpListener, proto: Proto, shared: Arc<Shared>, connections: Arc<Semaphore>) {
    let mut shutdown = shared.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning, keep serving the others.
                tracing::warn!("{proto:?} listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            shared.metrics.refused(proto);
            tracing::warn!(%peer, "refusing a {proto:?} connection: {} connections open (--max-connections)", shared.opts.max_connections);
            continue;
        };
        tokio::spawn(run(stream, peer, proto, Arc::clone(&shared), permit));
    }
}

async fn run(stream: TcpStream, peer: SocketAddr, proto: Proto, shared: Arc<Shared>, _permit: OwnedSemaphorePermit) {
    // Replies are written whole with one call; Nagle would only delay the last segment.
    let _ = stream.set_nodelay(true);
    shared.metrics.opened(proto);
    tracing::debug!(%peer, "{proto:?} connection opened");
    let conn = BufReader::with_capacity(READ_BUFFER, stream);
    let end = match proto {
        Proto::Lm => lm::serve(conn, &shared).await,
        Proto::Resp => resp::serve(conn, &shared).await,
    };
    match end {
        End::Done => tracing::debug!(%peer, "{proto:?} connection closed"),
        End::Lost(why) => tracing::info!(%peer, "{proto:?} connection lost: {why}"),
        End::Protocol(why) => {
            shared.metrics.protocol_error(proto);
            tracing::warn!(%peer, "closing a {proto:?} connection: {why}");
        }
    }
    shared.metrics.closed(proto);
}

/// Waits until the client has sent the first byte of its next request. `Err(End::Done)` when
/// it closed the connection, went idle too long, or the server is shutting down.
pub(crate) async fn next_request<S: AsyncRead + Unpin>(conn: &mut BufReader<S>, shared: &Shared) -> Result<(), End> {
    let mut shutdown = shared.shutdown.clone();
    if *shutdown.borrow() {
        return Err(End::Done);
    }
    let idle = shared.opts.idle_timeout.unwrap_or(Duration::MAX);
    tokio::select! {
        _ = shutdown.changed() => Err(End::Done),
        r = tokio::time::timeout(idle, conn.fill_buf()) => match r {
            Err(_) => Err(End::Lost(format!("idle for more than {idle:?} (--idle-timeout)"))),
            Ok(Err(e)) => Err(End::Lost(e.to_string())),
            Ok(Ok([])) => Err(End::Done),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

/// Reads exactly `buf.len()` bytes; every read must make progress within `timeout`.
pub(crate) async fn read_full<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8], timeout: Duration) -> Result<(), End> {
    let mut done = 0;
    while done < buf.len() {
        let rest = buf.get_mut(done..).unwrap_or_default();
        match tokio::time::timeout(timeout, r.read(rest)).await {
            Err(_) => return Err(End::Lost(format!("no data for {timeout:?} in the middle of a request"))),
            Ok(Err(e)) => return Err(End::Lost(e.to_string())),
            Ok(Ok(0)) => {
                return Err(End::Lost(format!("disconnected after {done} of {} bytes", buf.len())));
            }
            Ok(Ok(n)) => done += n,
        }
    }
    Ok(())
}

/// Reads and drops `len` bytes (the payload of a request that is refused).
pub(crate) async fn discard<R: AsyncRead + Unpin>(r: &mut R, mut len: u64, timeout: Duration) -> Result<(), End> {
    let mut scratch = [0u8; 8192];
    while len > 0 {
        let n = len.min(scratch.len() as u64) as usize;
        read_full(r, scratch.get_mut(..n).unwrap_or_default(), timeout).await?;
        len -= n as u64;
    }
    Ok(())
}

/// Writes all of `parts` with vectored writes (header and payload in one call when the socket
/// takes them); every write must make progress within `timeout`.
pub(crate) async fn write_all<W: AsyncWrite + Unpin>(w: &mut W, parts: &[&[u8]], timeout: Duration) -> Result<(), End> {
    let mut slices: Vec<IoSlice<'_>> = parts.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)).collect();
    let mut rest = slices.as_mut_slice();
    while !rest.is_empty() {
        match tokio::time::timeout(timeout, w.write_vectored(rest)).await {
            Err(_) => return Err(End::Lost(format!("the client read nothing for {timeout:?}"))),
            Ok(Err(e)) => return Err(End::Lost(e.to_string())),
            Ok(Ok(0)) => return Err(End::Lost("the connection closed while writing".into())),
            Ok(Ok(n)) => IoSlice::advance_slices(&mut rest, n),
        }
    }
    Ok(())
}
