//! The server's own counters and latency histograms, rendered for Prometheus together with the
//! store's statistics.

pub mod http;
mod ns;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvhoard_engine::tier::LatencyHistogram;

/// Which listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// `lm://`.
    Lm,
    /// RESP.
    Resp,
}

impl Proto {
    const ALL: [Proto; 2] = [Proto::Lm, Proto::Resp];
    fn name(self) -> &'static str {
        match self {
            Proto::Lm => "lm",
            Proto::Resp => "resp",
        }
    }
}

/// What a request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Store an object (lm PUT, RESP SET).
    Put,
    /// Load an object (GET).
    Get,
    /// Membership (lm EXIST, RESP EXISTS).
    Exists,
    /// RESP DEL.
    Delete,
    /// Everything else (HEALTH, PING, HELLO, AUTH, ...).
    Other,
}

impl Op {
    const ALL: [Op; 5] = [Op::Put, Op::Get, Op::Exists, Op::Delete, Op::Other];
    fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
            Op::Exists => "exists",
            Op::Delete => "delete",
            Op::Other => "other",
        }
    }
}

#[derive(Debug, Default)]
struct OpMetrics {
    requests: AtomicU64,
    errors: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    latency: LatencyHistogram,
}

#[derive(Debug, Default)]
struct ProtoMetrics {
    ops: [OpMetrics; 5],
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
    connections_total: AtomicU64,
    connections_open: AtomicU64,
    connections_refused: AtomicU64,
    protocol_errors: AtomicU64,
}

/// The server's metrics.
#[derive(Debug, Default)]
pub struct Metrics {
    protos: [ProtoMetrics; 2],
}

/// How a request ended, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done; for a lookup, found.
    Hit,
    /// A lookup that found nothing.
    Miss,
    /// Failed (bad request or engine error); the client was told where the protocol allows.
    Error,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Metrics {
    fn proto(&self, p: Proto) -> &ProtoMetrics {
        &self.protos[p as usize]
    }

    /// Records one request.
    pub fn request(&self, p: Proto, op: Op, outcome: Outcome, took: Duration) {
        let m = &self.proto(p).ops[op as usize];
        add(&m.requests, 1);
        match outcome {
            Outcome::Hit => add(&m.hits, 1),
            Outcome::Miss => add(&m.misses, 1),
            Outcome::Error => add(&m.errors, 1),
        }
        m.latency.record(took.subsec_nanos().into(), took);
    }

    /// Records payload bytes read from clients.
    pub fn received(&self, p: Proto, bytes: u64) {
        add(&self.proto(p).bytes_received, bytes);
    }

    /// Records payload bytes sent to clients.
    pub fn sent(&self, p: Proto, bytes: u64) {
        add(&self.proto(p).bytes_sent, bytes);
    }

    /// A connection was accepted.
    pub fn opened(&self, p: Proto) {
        add(&self.proto(p).connections_total, 1);
        add(&self.proto(p).connections_open, 1);
    }

    /// A connection ended.
    pub fn closed(&self, p: Proto) {
        self.proto(p).connections_open.fetch_sub(1, Ordering::Relaxed);
    }

    /// A connection was refused (too many).
    pub fn refused(&self, p: Proto) {
        add(&self.proto(p).connections_refused, 1);
    }

    /// A client broke the protocol and its connection was closed.
    pub fn protocol_error(&self, p: Proto) {
        add(&self.proto(p).protocol_errors, 1);
    }

    /// Requests of one kind so far: (requests, hits, misses, errors).
    pub fn counts(&self, p: Proto, op: Op) -> (u64, u64, u64, u64) {
        let m = &self.proto(p).ops[op as usize];
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        (get(&m.requests), get(&m.hits), get(&m.misses), get(&m.errors))
    }

    /// Connections open now.
    pub fn open_connections(&self, p: Proto) -> u64 {
        self.proto(p).connections_open.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections_total(&self, p: Proto) -> u64 {
        self.proto(p).connections_total.load(Ordering::Relaxed)
    }

    /// Protocol errors so far.
    pub fn protocol_errors(&self, p: Proto) -> u64 {
        self.proto(p).protocol_errors.load(Ordering::Relaxed)
    }

    /// The metrics in the Prometheus text format (0.0.4), names prefixed `kvhoard_serve_`.
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>| {
            let _ = writeln!(out, "# HELP kvhoard_serve_{name} {help}\n# TYPE kvhoard_serve_{name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "kvhoard_serve_{name}{{{labels}}} {v}");
            }
        };
        let per_op = |f: &dyn Fn(&OpMetrics) -> u64| {
            let mut v = Vec::new();
            for p in Proto::ALL {
                for op in Op::ALL {
                    let m = &self.proto(p).ops[op as usize];
                    v.push((format!("proto=\"{}\",op=\"{}\"", p.name(), op.name()), f(m) as f64));
                }
            }
            v
        };
        family("requests_total", "counter", "Requests handled.", per_op(&|m| get(&m.requests)));
        family("request_errors_total", "counter", "Requests that failed.", per_op(&|m| get(&m.errors)));
        family("hits_total", "counter", "Lookups (get, exists) that found the key.", per_op(&|m| get(&m.hits)));
        family("misses_total", "counter", "Lookups (get, exists) that did not.", per_op(&|m| get(&m.misses)));
        let per_proto = |f: &dyn Fn(&ProtoMetrics) -> u64| {
            Proto::ALL.iter().map(|&p| (format!("proto=\"{}\"", p.name()), f(self.proto(p)) as f64)).collect()
        };
        family("received_bytes_total", "counter", "Payload bytes received.", per_proto(&|m| get(&m.bytes_received)));
        family("sent_bytes_total", "counter", "Payload bytes sent.", per_proto(&|m| get(&m.bytes_sent)));
        family("connections_total", "counter", "Connections accepted.", per_proto(&|m| get(&m.connections_total)));
        family("connections_open", "gauge", "Connections open.", per_proto(&|m| get(&m.connections_open)));
        family(
            "connections_refused_total",
            "counter",
            "Connections closed at once because the connection limit was reached.",
            per_proto(&|m| get(&m.connections_refused)),
        );
        family(
            "protocol_errors_total",
            "counter",
            "Connections closed because the client broke the protocol.",
            per_proto(&|m| get(&m.protocol_errors)),
        );
        let mut quantiles = Vec::new();
        let mut sums = Vec::new();
        for p in Proto::ALL {
            for op in Op::ALL {
                let s = self.proto(p).ops[op as usize].latency.summary();
                let labels = format!("proto=\"{}\",op=\"{}\"", p.name(), op.name());
                for (q, v) in [("0.5", s.p50_ns), ("0.9", s.p90_ns), ("0.99", s.p99_ns), ("0.999", s.p999_ns)] {
                    quantiles.push((format!("{labels},quantile=\"{q}\""), v as f64 / 1e9));
                }
                sums.push((labels, s.mean_ns as f64 * s.count as f64 / 1e9, s.count));
            }
        }
        family("request_latency_seconds", "summary", "Time from a request's header to its reply.", quantiles);
        for (labels, sum, count) in sums {
            let _ = writeln!(out, "kvhoard_serve_request_latency_seconds_sum{{{labels}}} {sum}");
            let _ = writeln!(out, "kvhoard_serve_request_latency_seconds_count{{{labels}}} {count}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_show_in_the_exposition() {
        let m = Metrics::default();
        m.request(Proto::Lm, Op::Get, Outcome::Hit, Duration::from_micros(300));
        m.request(Proto::Lm, Op::Get, Outcome::Miss, Duration::from_micros(20));
        m.request(Proto::Resp, Op::Put, Outcome::Error, Duration::from_micros(20));
        m.opened(Proto::Resp);
        m.sent(Proto::Lm, 4096);
        let text = m.prometheus();
        for line in [
            "kvhoard_serve_requests_total{proto=\"lm\",op=\"get\"} 2",
            "kvhoard_serve_hits_total{proto=\"lm\",op=\"get\"} 1",
            "kvhoard_serve_misses_total{proto=\"lm\",op=\"get\"} 1",
            "kvhoard_serve_request_errors_total{proto=\"resp\",op=\"put\"} 1",
            "kvhoard_serve_connections_open{proto=\"resp\"} 1",
            "kvhoard_serve_sent_bytes_total{proto=\"lm\"} 4096",
            "kvhoard_serve_request_latency_seconds_count{proto=\"lm\",op=\"get\"} 2",
            "# TYPE kvhoard_serve_request_latency_seconds summary",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert_eq!(m.counts(Proto::Lm, Op::Get), (2, 1, 1, 0));
    }
}
