//! How to serve: listeners, namespaces, limits, timeouts.

use std::net::SocketAddr;
use std::time::Duration;

use kvhoard_engine::Durability;

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address for `lm://`, if any.
    pub lm: Option<SocketAddr>,
    /// Address for RESP, if any.
    pub resp: Option<SocketAddr>,
    /// Address for Prometheus metrics over HTTP, if any.
    pub metrics: Option<SocketAddr>,
    /// Whether `PUT /ns` on the metrics address may change namespace policies (from this
    /// machine's loopback peers only). Off unless asked: a policy decides what may be lost.
    pub policy_changes: bool,
    /// Namespace the `lm://` listener stores keys in.
    pub lm_namespace: String,
    /// Namespace the RESP listener stores keys in.
    pub resp_namespace: String,
    /// Password RESP clients must give with AUTH (or HELLO ... AUTH) before anything else.
    pub resp_password: Option<String>,
    /// Largest payload accepted (bytes).
    pub max_object_bytes: u64,
    /// Most connections at once over all listeners; more are closed when accepted.
    pub max_connections: usize,
    /// Bytes of payload held in memory at once over all connections; a request waits for room.
    pub inflight_bytes: u64,
    /// A client that starts a request and then makes no progress for this long is disconnected.
    pub request_timeout: Duration,
    /// A request's header must arrive within this long of its first byte, and its payload
    /// within this long plus what [`ServeOptions::min_rate`] allows ([`crate::pace`]).
    pub header_timeout: Duration,
    /// Bytes per second every request must keep up on average; 0 disables the limit.
    pub min_rate: u64,
    /// A client idle between requests for this long is disconnected (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// When a stored object is acknowledged (RESP SET) or counted as stored (lm:// PUT).
    pub durability: Durability,
    /// TTL given to every stored object, unless the client sets one (RESP `SET ... EX`).
    pub ttl_secs: Option<u32>,
    /// Codec for what arrives (`None`: each namespace's default). Never one that drops tokens:
    /// lm:// and RESP clients read back whole blocks.
    pub codec: Option<kvhoard_engine::CodecSpec>,
    /// Runtime threads for the network; 0 picks one per CPU (at most 64). The kernel copies a
    /// payload into the socket in the context of the thread that sends it, so one thread would
    /// serve every connection's sends from one core.
    pub threads: usize,
    /// Most threads running engine calls at once.
    pub blocking_threads: usize,
    /// Serve RESP as this node of a cluster (`None`: standalone); replaced while serving by
    /// [`crate::Running::set_cluster`].
    pub cluster: Option<crate::cluster::ClusterConfig>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            lm: None,
            resp: None,
            metrics: None,
            policy_changes: false,
            lm_namespace: "lmcache".into(),
            resp_namespace: "lmcache".into(),
            resp_password: None,
            max_object_bytes: 256 << 20,
            max_connections: 1024,
            inflight_bytes: 2 << 30,
            request_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(10),
            min_rate: 1 << 20,
            idle_timeout: None,
            durability: Durability::Written,
            ttl_secs: None,
            codec: None,
            threads: 0,
            blocking_threads: 64,
            cluster: None,
        }
    }
}

/// Most connections at once (each holds a task and buffers).
pub const MAX_CONNECTIONS: usize = 1 << 20;
/// Most network threads.
pub const MAX_THREADS: usize = 1024;
/// Longest request and header timeout: a day (a client stalled longer is gone).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);
/// Longest idle timeout: 30 days.
pub const MAX_IDLE: Duration = Duration::from_secs(30 * 86_400);

impl ServeOptions {
    /// Every limit in range, naming the one that is not (as its `kvhoard serve` flag).
    pub fn validate(&self) -> Result<(), String> {
        let lm_max = i32::MAX as u64;
        if !(1..=lm_max).contains(&self.max_object_bytes) {
            return Err(format!(
                "max object size (--max-object-size) is {} bytes: give between 1 and {lm_max} bytes (what lm:// can carry)",
                self.max_object_bytes
            ));
        }
        if self.inflight_bytes < self.max_object_bytes {
            return Err(format!(
                "in-flight budget (--max-inflight) {} bytes is smaller than the largest object ({} bytes); raise it or lower the max object size",
                self.inflight_bytes, self.max_object_bytes
            ));
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return Err(format!(
                "max connections (--max-connections) is {}: give between 1 and {MAX_CONNECTIONS}",
                self.max_connections
            ));
        }
        if self.threads > MAX_THREADS {
            return Err(format!(
                "network threads (--threads) is {}: give at most {MAX_THREADS}, or 0 for one per CPU",
                self.threads
            ));
        }
        if self.blocking_threads == 0 {
            return Err("blocking threads must be at least 1".into());
        }
        for (what, t) in [
            ("request timeout (--request-timeout)", self.request_timeout),
            ("header timeout (--header-timeout)", self.header_timeout),
        ] {
            if t.is_zero() || t > MAX_TIMEOUT {
                return Err(format!("{what} is {t:?}: give more than 0 and at most {MAX_TIMEOUT:?}"));
            }
        }
        if let Some(t) = self.idle_timeout.filter(|t| t.is_zero() || *t > MAX_IDLE) {
            return Err(format!(
                "idle timeout (--idle-timeout) is {t:?}: give between 1 second and {MAX_IDLE:?}, or none"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_each_limit_out_of_range_is_named() {
        assert_eq!(ServeOptions::default().validate(), Ok(()));
        type Spoil = fn(&mut ServeOptions);
        let cases: [(Spoil, &str); 6] = [
            (|o| o.max_connections = 0, "--max-connections"),
            (|o| o.threads = 1 << 32, "--threads"),
            (|o| o.max_object_bytes = 0, "--max-object-size"),
            (|o| o.request_timeout = Duration::from_secs(u64::MAX), "--request-timeout"),
            (|o| o.header_timeout = Duration::ZERO, "--header-timeout"),
            (|o| o.idle_timeout = Some(Duration::from_secs(u64::MAX)), "--idle-timeout"),
        ];
        for (spoil, flag) in cases {
            let mut o = ServeOptions::default();
            spoil(&mut o);
            let err = o.validate().unwrap_err();
            assert!(err.contains(flag), "{flag}: {err}");
        }
    }
}
