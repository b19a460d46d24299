//! Accepting connections under the connection limit and handing each to its protocol.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::conn::READ_BUFFER;
use crate::end::End;
use crate::metrics::Proto;
use crate::{lm, resp, Shared};

/// Accepts connections on `listener` until shutdown, each served by `proto`.
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
        match Arc::clone(&connections).try_acquire_owned() {
            Ok(permit) => drop(tokio::spawn(run(stream, peer, proto, Arc::clone(&shared), permit))),
            // Full: the connection idle the longest makes room, off this loop (it may first
            // finish storing what it was sent).
            Err(_) if shared.idle.close_longest() => {
                drop(tokio::spawn(make_room(stream, peer, proto, Arc::clone(&shared), Arc::clone(&connections))))
            }
            Err(_) => refuse(&stream, peer, proto, &shared),
        }
    }
}

/// Serves a connection accepted while the server was full, once the idle connection told to
/// close has freed its slot; refuses it if that takes longer than [`ROOM_WAIT`].
async fn make_room(
    stream: TcpStream,
    peer: SocketAddr,
    proto: Proto,
    shared: Arc<Shared>,
    connections: Arc<Semaphore>,
) {
    match tokio::time::timeout(ROOM_WAIT, connections.acquire_owned()).await {
        Ok(Ok(permit)) => run(stream, peer, proto, shared, permit).await,
        _ => refuse(&stream, peer, proto, &shared),
    }
}

/// How long a connection accepted while the server is full waits for the slot of the idle one
/// closed for it.
const ROOM_WAIT: Duration = Duration::from_secs(2);

/// Closes a connection the server has no room for; a RESP client is told why, as Redis does.
fn refuse(stream: &TcpStream, peer: SocketAddr, proto: Proto, shared: &Shared) {
    shared.metrics.refused(proto);
    tracing::warn!(%peer, "refusing a {proto:?} connection: {} connections open, all busy (--max-connections)", shared.opts.max_connections);
    if proto == Proto::Resp {
        // Best effort, never waiting: the socket's buffer is empty, so it takes these bytes.
        let _ = stream.try_write(b"-ERR max number of clients reached\r\n");
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
