//! What every connection does, whatever its protocol: waiting for the next request (or
//! shutdown), reading at the request's pace ([`crate::pace`]) and writing with a progress timeout.
//!
//! A reply larger than the socket's send buffer is finished with blocking sends ([`write_all`]):
//! a thread waiting inside the kernel is handed the freed room as soon as the peer reads, where
//! an event loop learns of it only once a third of the buffer is free, and the peer runs dry in
//! between (11 % slower for 32 MiB replies over loopback; docs/benchmarks.md).

use std::io::IoSlice;
use std::time::Duration;

use socket2::SockRef;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::end::End;
use crate::pace::{read_some, Pace};
use crate::Shared;

/// Bytes of each connection's read buffer; payloads larger than this are read straight into
/// their own buffers.
pub(crate) const READ_BUFFER: usize = 16 << 10;

/// A client connection, buffered for reading.
pub(crate) type Conn = BufReader<TcpStream>;

/// Unsent bytes, once the socket's buffer is full, from which a reply is finished with blocking
/// sends. Smaller rests go through the event loop: handing a thread over costs more than they do.
const BLOCKING_SEND_MIN: usize = 1 << 20;

/// Waits until the client has sent the first byte of its next request (`served`: it sent one
/// before). `Err(End::Done)` when it closed the connection, went idle too long, or the
/// server is shutting down; `Err(End::Lost)` when the server needed its slot for a new client
/// ([`crate::idle`]).
pub(crate) async fn next_request<S: AsyncRead + Unpin>(
    conn: &mut BufReader<S>,
    shared: &Shared,
    served: bool,
) -> Result<(), End> {
    let mut shutdown = shared.shutdown.clone();
    if *shutdown.borrow() {
        return Err(End::Done);
    }
    // A pipelined request already read needs no wait (nor a place among the idle).
    if !conn.buffer().is_empty() {
        return Ok(());
    }
    let idle = shared.opts.idle_timeout.unwrap_or(Duration::MAX);
    let waiting = shared.idle.wait(served);
    tokio::select! {
        _ = shutdown.changed() => Err(End::Done),
        () = waiting.close.notified() => Err(End::Lost(
            "closed while idle to make room for a new connection (--max-connections)".into(),
        )),
        r = tokio::time::timeout(idle, conn.fill_buf()) => match r {
            Err(_) => Err(End::Lost(format!("idle for more than {idle:?} (--idle-timeout)"))),
            Ok(Err(e)) => Err(End::Lost(e.to_string())),
            Ok(Ok([])) => Err(End::Done),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

/// Reads exactly `buf.len()` bytes within the request's pace.
pub(crate) async fn read_full<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8], pace: &mut Pace) -> Result<(), End> {
    let mut done = 0;
    while done < buf.len() {
        done += read_some(r, buf.get_mut(done..).unwrap_or_default(), pace).await?;
    }
    Ok(())
}

/// Reads and drops `len` bytes (the payload of a request that is refused).
pub(crate) async fn discard<R: AsyncRead + Unpin>(r: &mut R, mut len: u64, pace: &mut Pace) -> Result<(), End> {
    let mut scratch = [0u8; 8192];
    while len > 0 {
        let n = len.min(scratch.len() as u64) as usize;
        len -= read_some(r, scratch.get_mut(..n).unwrap_or_default(), pace).await? as u64;
    }
    Ok(())
}

/// Writes all of `parts` with vectored writes (header and payload in one call when the socket
/// takes them); every write must make progress within `timeout`. When the socket's buffer fills
/// with at least [`BLOCKING_SEND_MIN`] bytes still to send, the rest is sent by [`send_blocking`]
/// if `blocking` has a permit left: it bounds the threads that clients which stop reading can
/// hold for up to `timeout` each; without a permit the event loop sends the rest.
pub(crate) async fn write_all(
    conn: &mut Conn,
    parts: &[&[u8]],
    timeout: Duration,
    blocking: &Semaphore,
) -> Result<(), End> {
    let mut slices: Vec<IoSlice<'_>> = parts.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)).collect();
    let mut rest = slices.as_mut_slice();
    while !rest.is_empty() {
        match tokio::time::timeout(timeout, conn.write_vectored(rest)).await {
            Err(_) => return Err(End::Lost(format!("the client read nothing for {timeout:?}"))),
            Ok(Err(e)) => return Err(End::Lost(e.to_string())),
            Ok(Ok(0)) => return Err(End::Lost("the connection closed while writing".into())),
            Ok(Ok(n)) => IoSlice::advance_slices(&mut rest, n),
        }
        let left: usize = rest.iter().map(|s| s.len()).sum();
        if left >= BLOCKING_SEND_MIN && can_block() {
            if let Ok(_thread) = blocking.try_acquire() {
                let stream = conn.get_ref();
                return tokio::task::block_in_place(|| send_blocking(stream, rest, timeout));
            }
        }
    }
    Ok(())
}

/// Whether this thread may block: only a multi-thread runtime can hand its other tasks on.
fn can_block() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Sends `rest` with the socket in blocking mode, each send waiting at most `timeout` for the
/// peer to make room, then puts the socket back in non-blocking mode for the runtime. If that
/// fails the connection is given up, since a blocking socket would stall the runtime's threads.
fn send_blocking(stream: &TcpStream, mut rest: &mut [IoSlice<'_>], timeout: Duration) -> Result<(), End> {
    let sock = SockRef::from(stream);
    let lost = |what: &str, e: std::io::Error| End::Lost(format!("{what}: {e}"));
    sock.set_write_timeout(Some(timeout)).map_err(|e| lost("cannot set the send timeout", e))?;
    sock.set_nonblocking(false).map_err(|e| lost("cannot switch to blocking sends", e))?;
    let sent = (|| {
        while !rest.is_empty() {
            match sock.send_vectored(rest) {
                Ok(0) => return Err(End::Lost("the connection closed while writing".into())),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Err(End::Lost(format!("the client read nothing for {timeout:?}")));
                }
                Err(e) => return Err(End::Lost(e.to_string())),
            }
        }
        Ok(())
    })();
    sock.set_nonblocking(true).map_err(|e| lost("cannot switch back to non-blocking sends", e))?;
    sent
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server-side connection and the client's end of it.
    async fn pair() -> (Conn, std::net::TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        (BufReader::new(stream), client)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_stops_reading_times_out_and_the_socket_stays_non_blocking() {
        let (mut conn, _client) = pair().await;
        // More than loopback's socket buffers can hold, so the blocking sends must wait.
        let reply = vec![7u8; 128 << 20];
        let started = std::time::Instant::now();
        let sent = write_all(&mut conn, &[b"header", &reply], Duration::from_millis(200), &Semaphore::new(1)).await;
        assert!(matches!(&sent, Err(End::Lost(why)) if why.contains("read nothing")), "{sent:?}");
        assert!(started.elapsed() < Duration::from_secs(20), "the send timeout applied");
        assert!(SockRef::from(conn.get_ref()).nonblocking().unwrap(), "the runtime's socket is non-blocking again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_reply_arrives_whole_and_in_order() {
        let (mut conn, mut client) = pair().await;
        let payload: Vec<u8> = (0..48u32 << 20).map(|i| (i % 251) as u8).collect();
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            // Start late, so that the server's socket buffer fills first.
            std::thread::sleep(Duration::from_millis(200));
            let mut got = Vec::new();
            client.read_to_end(&mut got).unwrap();
            got
        });
        write_all(&mut conn, &[b"head", &payload, b"tail"], Duration::from_secs(10), &Semaphore::new(1)).await.unwrap();
        assert!(SockRef::from(conn.get_ref()).nonblocking().unwrap());
        drop(conn);
        let got = reader.join().unwrap();
        assert_eq!(got.len(), payload.len() + 8);
        assert!(got.starts_with(b"head"), "the reply lost its head");
        assert!(got.ends_with(b"tail"), "the reply lost its tail");
        assert!(got.get(4..4 + payload.len()) == Some(&payload[..]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_a_blocking_permit_the_event_loop_sends_the_reply() {
        let (mut conn, mut client) = pair().await;
        let payload = vec![5u8; 32 << 20];
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            std::thread::sleep(Duration::from_millis(200));
            let mut got = Vec::new();
            client.read_to_end(&mut got).unwrap();
            got
        });
        let none = Semaphore::new(0);
        write_all(&mut conn, &[&payload], Duration::from_secs(10), &none).await.unwrap();
        drop(conn);
        assert!(reader.join().unwrap() == payload);
    }
}
