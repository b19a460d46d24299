//! Reading RESP requests: arrays of bulk strings (what every client library sends) and inline
//! commands (what a person types into `nc`), each bounded before anything is allocated.

use kvhoard_engine::buffer::PooledBuf;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead};

use crate::budget::Room;
use crate::conn;
use crate::end::End;
use crate::pace::Pace;
use crate::payload::{self, Memory};

/// Most arguments in one command.
pub const MAX_ARGS: usize = 1024;
/// Longest line (array and bulk headers, inline commands) and longest argument other than a
/// SET value.
pub const MAX_LINE: usize = 64 << 10;
/// Most bytes of arguments other than a SET value in one request: without it, 1024 arguments of
/// 64 KiB would hold 64 MiB per connection outside the payload budget.
pub const MAX_SMALL_BYTES: u64 = 1 << 20;

/// One argument.
pub enum Arg {
    /// A short argument (command name, key, option).
    Small(Vec<u8>),
    /// A SET value, in a pooled buffer, holding its room in the budget.
    Payload(PooledBuf, Room),
}

impl Arg {
    /// The argument's bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Arg::Small(v) => v,
            Arg::Payload(b, _) => b,
        }
    }
}

/// A request that was read whole but cannot be served; the connection goes on.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// A SET value larger than the largest object allowed (its bytes were read and dropped).
    TooLarge {
        /// Its length.
        len: u64,
        /// The limit.
        max: u64,
    },
}

/// What reading a request gave.
pub enum Read {
    /// A command and its arguments.
    Command(Vec<Arg>),
    /// A well-formed request to refuse.
    Refused(Refused),
    /// Nothing to do (an empty inline line or an empty array).
    Nothing,
}

/// The largest SET value, and where payloads take their memory.
pub(crate) struct Limits<'a> {
    /// Largest SET value.
    pub max_object: u64,
    /// Budget and buffers for payloads.
    pub memory: Memory<'a>,
}

/// Reads one line (without its `\r\n`), at most [`MAX_LINE`] bytes.
async fn line<R: AsyncBufRead + Unpin>(r: &mut R, pace: &mut Pace) -> Result<Vec<u8>, End> {
    let mut out = Vec::new();
    loop {
        let wait = pace.next_wait()?;
        let avail = match tokio::time::timeout(wait, r.fill_buf()).await {
            Err(_) => return Err(pace.timed_out()),
            Ok(Err(e)) => return Err(End::Lost(e.to_string())),
            Ok(Ok([])) => return Err(End::Lost("disconnected in the middle of a request".into())),
            Ok(Ok(a)) => a,
        };
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        out.extend_from_slice(avail.get(..take).unwrap_or_default());
        r.consume(take);
        pace.arrived(take);
        if out.len() > MAX_LINE + 2 {
            return Err(End::Protocol(format!("a line longer than {MAX_LINE} bytes")));
        }
        if done {
            if out.ends_with(b"\r\n") {
                out.truncate(out.len() - 2);
            } else {
                // Inline commands may end with a bare \n, as in Redis.
                out.truncate(out.len() - 1);
            }
            return Ok(out);
        }
    }
}

fn number(line: &[u8], what: &str) -> Result<i64, End> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| End::Protocol(format!("invalid {what} {:?}", String::from_utf8_lossy(line))))
}

async fn crlf<R: AsyncRead + Unpin>(r: &mut R, pace: &mut Pace) -> Result<(), End> {
    let mut end = [0u8; 2];
    conn::read_full(r, &mut end, pace).await?;
    if &end != b"\r\n" {
        return Err(End::Protocol("a bulk string not followed by CRLF".into()));
    }
    Ok(())
}

/// Reads the next request.
pub(crate) async fn read<R: AsyncBufRead + Unpin>(
    r: &mut R,
    limits: &Limits<'_>,
    pace: &mut Pace,
) -> Result<Read, End> {
    let first = line(r, pace).await?;
    let Some((&b'*', count)) = first.split_first() else {
        let mut args: Vec<Arg> = first
            .split(|b| b.is_ascii_whitespace())
            .filter(|a| !a.is_empty())
            .map(|a| Arg::Small(a.to_vec()))
            .collect();
        if args.len() > MAX_ARGS {
            return Err(End::Protocol(format!("more than {MAX_ARGS} arguments")));
        }
        // An inline SET (`SET key value`, as typed into telnet) stores its value like any other:
        // in a payload buffer, from the memory budget.
        let is_set = args.first().is_some_and(|a| a.bytes().eq_ignore_ascii_case(b"SET"));
        if let (true, Some(Arg::Small(value))) = (is_set, args.get(2)) {
            let mut bytes: &[u8] = value;
            let (buf, room) = payload::read(&mut bytes, value.len(), pace, &limits.memory).await?;
            if let Some(arg) = args.get_mut(2) {
                *arg = Arg::Payload(buf, room);
            }
        }
        return Ok(if args.is_empty() { Read::Nothing } else { Read::Command(args) });
    };
    let count = number(count, "multibulk length")?;
    if count <= 0 {
        return Ok(Read::Nothing);
    }
    if count as u64 > MAX_ARGS as u64 {
        return Err(End::Protocol(format!("{count} arguments, at most {MAX_ARGS}")));
    }
    let mut args = Vec::with_capacity(count as usize);
    let mut refused = None;
    let mut small_bytes = 0u64;
    for i in 0..count as usize {
        let header = line(r, pace).await?;
        let Some((&b'$', len)) = header.split_first() else {
            return Err(End::Protocol(format!("expected '$', got {:?}", String::from_utf8_lossy(&header))));
        };
        let len = number(len, "bulk length")?;
        let len = u64::try_from(len).map_err(|_| End::Protocol(format!("invalid bulk length {len}")))?;
        // Only the third argument of SET carries an object; everything else is short.
        let is_value = i == 2 && args.first().is_some_and(|a: &Arg| a.bytes().eq_ignore_ascii_case(b"SET"));
        if !is_value && len > MAX_LINE as u64 {
            return Err(End::Protocol(format!("an argument of {len} bytes, at most {MAX_LINE}")));
        }
        if !is_value {
            small_bytes += len;
            if small_bytes > MAX_SMALL_BYTES {
                return Err(End::Protocol(format!("more than {MAX_SMALL_BYTES} bytes of arguments")));
            }
        }
        if is_value && len > limits.max_object {
            conn::discard(r, len + 2, pace).await?;
            refused = Some(Refused::TooLarge { len, max: limits.max_object });
            args.push(Arg::Small(Vec::new()));
            continue;
        }
        let arg = if is_value {
            let len = usize::try_from(len).map_err(|_| End::Protocol(format!("a value of {len} bytes")))?;
            let (buf, room) = payload::read(r, len, pace, &limits.memory).await?;
            Arg::Payload(buf, room)
        } else {
            let mut v = vec![0u8; len as usize];
            conn::read_full(r, &mut v, pace).await?;
            Arg::Small(v)
        };
        crlf(r, pace).await?;
        args.push(arg);
    }
    Ok(match refused {
        Some(why) => Read::Refused(why),
        None => Read::Command(args),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Budget;
    use crate::pace::PaceLimits;
    use kvhoard_engine::buffer::BufferPool;
    use std::time::Duration;

    fn parse(input: &[u8], max_object: u64) -> Result<Vec<Vec<u8>>, String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
        let budget = Budget::new(1 << 20);
        let pool = BufferPool::new(4, 1 << 20);
        let memory = Memory { budget: &budget, pool: &pool, patience: Duration::from_secs(1) };
        let limits = Limits { max_object, memory };
        let second = Duration::from_secs(1);
        let mut pace = Pace::start(PaceLimits { progress: second, grace: second, min_rate: 0 });
        let mut r = input;
        rt.block_on(async {
            match read(&mut r, &limits, &mut pace).await {
                Ok(Read::Command(args)) => Ok(args.iter().map(|a| a.bytes().to_vec()).collect()),
                Ok(Read::Refused(why)) => Err(format!("{why:?}")),
                Ok(Read::Nothing) => Ok(Vec::new()),
                Err(End::Protocol(why)) => Err(format!("protocol: {why}")),
                Err(End::Lost(why)) => Err(format!("lost: {why}")),
                Err(End::Done) => Err("done".into()),
            }
        })
    }

    #[test]
    fn arrays_and_inline_commands() {
        assert_eq!(
            parse(b"*3\r\n$3\r\nSET\r\n$3\r\nk/1\r\n$5\r\nab\r\nc\r\n", 100),
            Ok(vec![b"SET".to_vec(), b"k/1".to_vec(), b"ab\r\nc".to_vec()])
        );
        assert_eq!(parse(b"PING\r\n", 100), Ok(vec![b"PING".to_vec()]));
        assert_eq!(parse(b"  EXISTS  a b\n", 100), Ok(vec![b"EXISTS".to_vec(), b"a".to_vec(), b"b".to_vec()]));
        assert_eq!(parse(b"*0\r\n", 100), Ok(vec![]));
        assert_eq!(parse(b"*1\r\n$0\r\n\r\n", 100), Ok(vec![vec![]]));
    }

    #[test]
    fn malformed_requests() {
        for (input, want) in [
            (&b"*x\r\n"[..], "protocol: invalid multibulk length"),
            (b"*2000\r\n", "protocol: 2000 arguments"),
            (b"*1\r\n:3\r\n", "protocol: expected '$'"),
            (b"*1\r\n$-5\r\n", "protocol: invalid bulk length"),
            (b"*1\r\n$3\r\nGETxx", "protocol: a bulk string not followed by CRLF"),
            (b"*2\r\n$3\r\nGET\r\n$100000\r\n", "protocol: an argument of 100000 bytes"),
            (b"*2\r\n$3\r\nGET\r\n$10\r\nabc", "lost: disconnected in the middle of a request, after 21 bytes"),
            (b"*2\r\n$3\r\nGET\r\n", "lost: disconnected in the middle"),
        ] {
            let got = parse(input, 100);
            assert!(got.as_ref().is_err_and(|e| e.starts_with(want)), "{:?}: {got:?}", String::from_utf8_lossy(input));
        }
        let mut many = b"*40\r\n".to_vec();
        for _ in 0..40 {
            many.extend(format!("${}\r\n", 60 << 10).bytes());
            many.extend(vec![b'k'; 60 << 10]);
            many.extend(b"\r\n");
        }
        assert!(parse(&many, 100).is_err_and(|e| e.starts_with("protocol: more than 1048576 bytes of arguments")));
        let long = vec![b'a'; MAX_LINE + 10];
        assert!(parse(&long, 100).is_err_and(|e| e.starts_with("protocol: a line longer")));
    }

    #[test]
    fn an_oversized_value_is_read_and_refused() {
        let mut input = b"*3\r\n$3\r\nset\r\n$1\r\nk\r\n$200\r\n".to_vec();
        input.extend(vec![7u8; 200]);
        input.extend(b"\r\n");
        assert_eq!(parse(&input, 100), Err(format!("{:?}", Refused::TooLarge { len: 200, max: 100 })));
    }
}
