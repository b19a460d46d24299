//! Why a connection ends: what the readers, the pace keeper and the protocol loops return when
//! a connection cannot go on.

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
