//! How long a request may take to arrive, so that a client trickling bytes costs only its own
//! connection.
//!
//! A progress timeout alone does not do it: one byte every few seconds is progress, and 25 such
//! clients held their connections (and, before payloads took memory as they arrived, 2.5 GB of
//! the budget) for as long as they liked. So every request is also held to a minimum data rate
//! measured from its first byte: by `grace + received / min_rate` after it started, everything
//! received so far must have arrived. A header (a few hundred bytes at most) is thereby due
//! within about `grace`; a 32 MiB payload at the default 1 MiB/s within `grace + 32 s`. Time the
//! server itself made the client wait (for memory) is not counted against it.

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::end::End;

/// The limits a request is held to.
#[derive(Debug, Clone, Copy)]
pub struct PaceLimits {
    /// Longest wait for any one read.
    pub progress: Duration,
    /// Time allowed on top of what the minimum rate allows; also how long a header may take.
    pub grace: Duration,
    /// Bytes per second a request must keep up on average; 0 disables the rate limit.
    pub min_rate: u64,
}

/// One request's clock.
#[derive(Debug, Clone)]
pub(crate) struct Pace {
    started: Instant,
    received: u64,
    excused: Duration,
    limits: PaceLimits,
}

impl Pace {
    /// Starts the clock at a request's first byte.
    pub(crate) fn start(limits: PaceLimits) -> Pace {
        Pace { started: Instant::now(), received: 0, excused: Duration::ZERO, limits }
    }

    /// When everything received so far should have arrived at the latest.
    fn deadline(&self) -> Option<Instant> {
        if self.limits.min_rate == 0 {
            return None;
        }
        let allowed = Duration::from_secs_f64(self.received as f64 / self.limits.min_rate as f64);
        Some(self.started + self.excused + self.limits.grace + allowed)
    }

    /// How long the next read may wait: the progress timeout, or less when the request is
    /// running out of time; an error when it has run out.
    pub(crate) fn next_wait(&self) -> Result<Duration, End> {
        let progress = self.limits.progress;
        match self.deadline() {
            None => Ok(progress),
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Ok(left.min(progress)),
                _ => Err(self.too_slow()),
            },
        }
    }

    /// Why a read that waited [`Pace::next_wait`] in vain ends the connection.
    pub(crate) fn timed_out(&self) -> End {
        if self.deadline().is_some_and(|d| Instant::now() >= d) {
            self.too_slow()
        } else {
            End::Lost(format!("no data for {:?} in the middle of a request", self.limits.progress))
        }
    }

    fn too_slow(&self) -> End {
        End::Lost(format!(
            "too slow: {} bytes in {:.1?}, under the minimum of {} bytes/s after {:?} (--min-rate, --header-timeout)",
            self.received,
            self.started.elapsed().saturating_sub(self.excused),
            self.limits.min_rate,
            self.limits.grace
        ))
    }

    /// Counts bytes that arrived.
    pub(crate) fn arrived(&mut self, n: usize) {
        self.received += n as u64;
    }

    /// Does not count `d` against the client: the server made it wait.
    pub(crate) fn excuse(&mut self, d: Duration) {
        self.excused += d;
    }
}

/// Reads what is there into `buf` (at least one byte), within the request's pace.
pub(crate) async fn read_some<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8], pace: &mut Pace) -> Result<usize, End> {
    let wait = pace.next_wait()?;
    match tokio::time::timeout(wait, r.read(buf)).await {
        Err(_) => Err(pace.timed_out()),
        Ok(Err(e)) => Err(End::Lost(e.to_string())),
        Ok(Ok(0)) => Err(End::Lost(format!("disconnected in the middle of a request, after {} bytes", pace.received))),
        Ok(Ok(n)) => {
            pace.arrived(n);
            Ok(n)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(min_rate: u64) -> PaceLimits {
        PaceLimits { progress: Duration::from_secs(30), grace: Duration::from_millis(200), min_rate }
    }

    #[test]
    fn the_allowance_grows_with_the_bytes_received() {
        let mut pace = Pace::start(limits(1000));
        assert!(pace.next_wait().expect("in time") <= Duration::from_millis(200));
        pace.arrived(1000);
        let wait = pace.next_wait().expect("in time");
        assert!(wait > Duration::from_millis(900), "a second more for a thousand bytes: {wait:?}");
        assert!(wait <= Duration::from_millis(1200), "{wait:?}");
    }

    #[test]
    fn a_request_that_falls_behind_is_too_slow_unless_excused() {
        let mut pace = Pace::start(limits(1_000_000));
        std::thread::sleep(Duration::from_millis(250));
        assert!(matches!(pace.next_wait(), Err(End::Lost(why)) if why.starts_with("too slow")));
        pace.excuse(Duration::from_secs(1));
        assert!(pace.next_wait().is_ok(), "time the server made it wait does not count");
    }

    #[test]
    fn without_a_rate_only_progress_counts() {
        let pace = Pace::start(limits(0));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(pace.next_wait().expect("no deadline"), Duration::from_secs(30));
    }

    #[tokio::test]
    async fn a_trickling_reader_is_cut_at_its_deadline() {
        let (mut client, mut server) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for _ in 0..100 {
                if client.write_all(b"x").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let mut pace = Pace::start(limits(1_000));
        let started = Instant::now();
        let mut buf = [0u8; 16];
        let end = loop {
            if let Err(end) = read_some(&mut server, &mut buf, &mut pace).await {
                break end;
            }
        };
        assert!(matches!(&end, End::Lost(why) if why.starts_with("too slow")), "{end:?}");
        assert!(started.elapsed() < Duration::from_secs(2), "cut after {:?}", started.elapsed());
        writer.abort();
    }
}
