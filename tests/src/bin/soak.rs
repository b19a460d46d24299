//! `soak`: many clients against `kvhoard serve` for a long time, over lm:// and RESP, with mixed
//! object sizes and restarts of the server (graceful and SIGKILL, alternately), checking every
//! byte read back. Reports errors, wrong bytes, latency percentiles and the server's resident
//! memory over time (JSON, and an SVG plot), and fails if any byte was wrong, any request failed
//! while the server was up, or the server's memory went past what its budgets allow.
//!
//! What counts as right: a RESP GET returns the bytes of the key's last acknowledged SET (or, for
//! a SET cut off by a restart, those of the SET before it), or a miss (the cache may evict);
//! never an older version or other bytes. lm:// keys are written once (as LMCache names chunks
//! by their content), so a GET returns exactly their bytes or a miss. Run by `scripts/soak.sh`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use kvhoard_serve::lm::wire::{self, Command as LmCommand, WireMeta, REPLY_BYTES};
use kvhoard_tests::{block, Rng};

/// Soak-test `kvhoard serve` with many clients, restarts and byte-exact checks.
#[derive(Debug, Parser)]
#[command(name = "soak")]
struct Args {
    /// The kvhoard binary to run as the server.
    #[arg(long)]
    kvhoard: PathBuf,
    /// Directory for the volume and the server's log (created; must not hold a volume).
    #[arg(long)]
    dir: PathBuf,
    /// Concurrent client connections (half lm://, half RESP).
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Restart the server every this many seconds (0: never); restarts alternate between a
    /// graceful stop (SIGTERM) and a SIGKILL.
    #[arg(long, default_value_t = 120)]
    restart_every: u64,
    /// The volume's capacity.
    #[arg(long, default_value = "8GiB")]
    capacity: String,
    /// The server's --max-inflight (payload bytes in memory at once).
    #[arg(long, default_value = "1GiB")]
    max_inflight: String,
    /// The server's --dram-tier.
    #[arg(long, default_value = "512MiB")]
    dram_tier: String,
    /// Largest object; a few objects are this large, most are 64 KiB to 4 MiB.
    #[arg(long, default_value_t = 32 << 20)]
    max_object: usize,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw resident memory and p99 latency over time as SVG here.
    #[arg(long)]
    svg: Option<PathBuf>,
}

/// Bytes a size flag names (`1GiB`, `512MiB`, `4096`).
fn bytes_of(s: &str) -> u64 {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().unwrap_or_else(|_| die(&format!("{s:?} is not a size (like 512MiB)")));
    n * match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => die(&format!("{s:?}: use B, KiB, MiB or GiB")),
    }
}

fn die(msg: &str) -> ! {
    eprintln!("soak: {msg}");
    std::process::exit(2)
}

/// What one second of the run saw.
#[derive(Debug, Default, Clone)]
struct Second {
    latencies_us: Vec<u32>,
    errors: u64,
    wrong: u64,
    disconnects: u64,
    bytes: u64,
    rss: u64,
}

struct Shared {
    started: Instant,
    seconds: Mutex<Vec<Second>>,
    /// Incremented before every restart; a request that fails while it changes was cut off by
    /// the restart, not by a fault.
    generation: AtomicU64,
    restarting: AtomicBool,
    stop: AtomicBool,
    /// Where the server listens now (lm://, RESP): it binds ports of its own choosing at every
    /// start, so no other socket on the machine can hold them between restarts.
    addrs: Mutex<(SocketAddr, SocketAddr)>,
    max_object: usize,
    problems: Mutex<Vec<String>>,
}

impl Shared {
    fn record(&self, f: impl FnOnce(&mut Second)) {
        let at = self.started.elapsed().as_secs() as usize;
        let mut seconds = self.seconds.lock().unwrap_or_else(|e| e.into_inner());
        if seconds.len() <= at {
            seconds.resize(at + 1, Second::default());
        }
        if let Some(s) = seconds.get_mut(at) {
            f(s);
        }
    }

    fn problem(&self, what: String) {
        let mut p = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() < 50 {
            p.push(what);
        }
    }
}

fn size(rng: &mut Rng, max: usize) -> usize {
    match rng.below(100) {
        0 => max,
        1..=30 => 64 << 10,
        31..=55 => 256 << 10,
        56..=75 => 1 << 20,
        76..=92 => 2 << 20,
        _ => 4 << 20,
    }
    .min(max)
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    s.set_write_timeout(Some(Duration::from_secs(60)))?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// One request's outcome.
enum Outcome {
    Ok,
    /// Bytes other than allowed came back.
    Wrong(String),
}

/// A RESP client's keys: the last acknowledged value, and one a cut-off SET may have stored.
struct RespKey {
    acked: Option<(u64, usize)>,
    maybe: Option<(u64, usize)>,
}

fn resp_line(r: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
    }
    Ok(line.trim_end().to_string())
}

fn resp_op(
    conn: &mut BufReader<TcpStream>,
    rng: &mut Rng,
    keys: &mut [RespKey],
    id: usize,
    seq: &mut u64,
    max: usize,
) -> std::io::Result<(Outcome, u64)> {
    let k = rng.below(keys.len() as u64) as usize;
    let key = format!("c{id}-k{k}");
    let entry = keys.get_mut(k).ok_or_else(|| std::io::Error::other("no key"))?;
    if rng.below(2) == 0 {
        let len = size(rng, max);
        *seq += 1;
        let seed = (id as u64) << 40 | *seq;
        let value = block(seed, len);
        entry.maybe = Some((seed, len));
        let mut req = format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${len}\r\n", key.len()).into_bytes();
        req.extend_from_slice(&value);
        req.extend_from_slice(b"\r\n");
        conn.get_mut().write_all(&req)?;
        let reply = resp_line(conn)?;
        if reply != "+OK" {
            return Ok((Outcome::Wrong(format!("SET {key}: {reply}")), len as u64));
        }
        entry.acked = Some((seed, len));
        entry.maybe = None;
        return Ok((Outcome::Ok, len as u64));
    }
    conn.get_mut().write_all(format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes())?;
    let header = resp_line(conn)?;
    if header == "$-1" {
        return Ok((Outcome::Ok, 0));
    }
    let len: usize = header
        .strip_prefix('$')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("GET {key}: reply {header:?}")))?;
    let mut got = vec![0u8; len + 2];
    conn.read_exact(&mut got)?;
    got.truncate(len);
    let allowed = [entry.acked, entry.maybe];
    let ok = allowed.iter().flatten().any(|&(seed, l)| l == len && got == block(seed, l));
    if let (true, Some(m)) = (ok, entry.maybe) {
        if m.1 == len && got == block(m.0, m.1) {
            entry.acked = Some(m);
            entry.maybe = None;
        }
    }
    Ok((
        if ok {
            Outcome::Ok
        } else {
            Outcome::Wrong(format!("GET {key}: {len} bytes that no acknowledged SET stored"))
        },
        len as u64,
    ))
}

fn lm_meta(len: usize) -> WireMeta {
    // LMCache's BINARY format: a flat array of bytes.
    WireMeta { fmt: 4, dtype: 6, shape: [len as i32, 0, 0, 0] }
}

fn lm_op(
    conn: &mut TcpStream,
    rng: &mut Rng,
    written: &mut Vec<(u64, usize)>,
    id: usize,
    seq: &mut u64,
    max: usize,
) -> std::io::Result<(Outcome, u64)> {
    if written.is_empty() || rng.below(2) == 0 {
        let len = size(rng, max);
        *seq += 1;
        let seed = (id as u64) << 40 | *seq;
        let key = format!("c{id}-n{seed}");
        let header = wire::encode_request(LmCommand::Put, len as u32, &lm_meta(len), &key)
            .ok_or_else(|| std::io::Error::other("key too long"))?;
        conn.write_all(&header)?;
        conn.write_all(&block(seed, len))?;
        written.push((seed, len));
        if written.len() > 256 {
            written.remove(0);
        }
        return Ok((Outcome::Ok, len as u64));
    }
    let &(seed, len) =
        written.get(rng.below(written.len() as u64) as usize).ok_or_else(|| std::io::Error::other("none"))?;
    let key = format!("c{id}-n{seed}");
    let header = wire::encode_request(LmCommand::Get, 0, &lm_meta(0), &key)
        .ok_or_else(|| std::io::Error::other("key too long"))?;
    conn.write_all(&header)?;
    let mut reply = [0u8; REPLY_BYTES];
    conn.read_exact(&mut reply)?;
    let (code, got_len, meta) = wire::parse_reply(&reply);
    if code != 200 {
        return Ok((Outcome::Ok, 0));
    }
    let mut got = vec![0u8; got_len.max(0) as usize];
    conn.read_exact(&mut got)?;
    let ok = got.len() == len && meta == lm_meta(len) && got == block(seed, len);
    Ok((
        if ok {
            Outcome::Ok
        } else {
            Outcome::Wrong(format!("GET {key}: {} bytes, {meta:?}, not what was PUT", got.len()))
        },
        got.len() as u64,
    ))
}

fn client(shared: Arc<Shared>, id: usize) {
    let mut rng = Rng::new(id as u64 + 1);
    let resp = id % 2 == 1;
    let mut keys: Vec<RespKey> = (0..64).map(|_| RespKey { acked: None, maybe: None }).collect();
    let mut written = Vec::new();
    let mut seq = 0u64;
    let mut conn: Option<(TcpStream, BufReader<TcpStream>)> = None;
    // The generation the connection was made in: a server started after it has cut it.
    let mut connected_in = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        let generation = shared.generation.load(Ordering::SeqCst);
        if conn.is_none() {
            if shared.restarting.load(Ordering::SeqCst) {
                // Connect to the server that is starting, not the one going away.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            let (lm, resp_addr) = *shared.addrs.lock().unwrap_or_else(|e| e.into_inner());
            let addr = if resp { resp_addr } else { lm };
            match connect(addr).and_then(|s| Ok((s.try_clone()?, BufReader::new(s)))) {
                Ok(c) => {
                    conn = Some(c);
                    connected_in = generation;
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
        }
        let Some((raw, reader)) = conn.as_mut() else { continue };
        let t = Instant::now();
        let result = if resp {
            resp_op(reader, &mut rng, &mut keys, id, &mut seq, shared.max_object)
        } else {
            lm_op(raw, &mut rng, &mut written, id, &mut seq, shared.max_object)
        };
        let us = u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX);
        match result {
            Ok((Outcome::Ok, bytes)) => shared.record(|s| {
                s.latencies_us.push(us);
                s.bytes += bytes;
            }),
            Ok((Outcome::Wrong(what), _)) => {
                shared.record(|s| s.wrong += 1);
                shared.problem(format!("client {id}: {what}"));
            }
            Err(e) => {
                conn = None;
                let now = shared.generation.load(Ordering::SeqCst);
                let restarted = shared.restarting.load(Ordering::SeqCst) || now != generation || now != connected_in;
                if restarted || shared.stop.load(Ordering::Relaxed) {
                    shared.record(|s| s.disconnects += 1);
                } else {
                    shared.record(|s| s.errors += 1);
                    shared.problem(format!("client {id}: {e} with the server up"));
                }
            }
        }
    }
}

fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The last lines of the server's log, for a failure message (the soak's directory is removed
/// when it ends).
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(40);
    lines.get(from..).unwrap_or_default().join("\n")
}

/// The addresses in the server's "serving ... on lm://A (...), resp://B (...)" line.
fn served_addresses(log: &str) -> Option<(SocketAddr, SocketAddr)> {
    let line = log.lines().rev().find(|l| l.starts_with("kvhoard: serving "))?;
    let after = |scheme: &str| -> Option<SocketAddr> {
        let rest = &line[line.find(scheme)? + scheme.len()..];
        rest.split([' ', ',']).next()?.parse().ok()
    };
    Some((after("lm://")?, after("resp://")?))
}

struct Server {
    kvhoard: PathBuf,
    volume: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Server {
    /// Starts the server on ports it chooses and returns where it listens (lm://, RESP), or
    /// ends the soak with the server's own words when it exits or does not come up.
    fn start(&mut self) -> (SocketAddr, SocketAddr) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| die(&format!("cannot write {}: {e}", self.log.display())));
        let written_before = log.metadata().map_or(0, |m| m.len()) as usize;
        let mut child = Command::new(&self.kvhoard)
            .arg("serve")
            .arg(&self.volume)
            .args(["--lm", "127.0.0.1:0", "--resp", "127.0.0.1:0"])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| die(&format!("cannot run {}: {e}", self.kvhoard.display())));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read(&self.log).unwrap_or_default();
            let new = String::from_utf8_lossy(text.get(written_before..).unwrap_or_default()).into_owned();
            if let Some(addrs) = served_addresses(&new) {
                self.child = Some(child);
                return addrs;
            }
            if let Ok(Some(status)) = child.try_wait() {
                die(&format!("the server exited ({status}) before serving; its log ends:\n{}", log_tail(&self.log)));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                die(&format!("the server did not serve within 60 s; its log ends:\n{}", log_tail(&self.log)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    fn stop(&mut self, kill: bool) {
        let Some(mut child) = self.child.take() else { return };
        let signal = if kill { libc::SIGKILL } else { libc::SIGTERM };
        // SAFETY: kill(2) with the pid of a child this process spawned and has not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let _ = child.wait();
    }
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted.get(i).copied().unwrap_or(0)) / 1000.0
}

/// Latency and memory over one stretch of the run.
struct Window {
    /// Seconds from the start.
    t: u64,
    p50_ms: f64,
    p99_ms: f64,
    rss: u64,
}

/// One plot: its title, the value it draws, and its top.
type Panel = (&'static str, fn(&Window) -> f64, f64);

fn rss_mib(w: &Window) -> f64 {
    w.rss as f64 / f64::from(1 << 20)
}

fn p99(w: &Window) -> f64 {
    w.p99_ms
}

fn svg(windows: &[Window], restarts: &[u64], bound: u64, seconds: u64) -> String {
    let (w, h, pad) = (900.0, 220.0, 50.0);
    let x = |t: f64| pad + t / seconds.max(1) as f64 * (w - 2.0 * pad);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{}" font-family="sans-serif" font-size="12">"#,
        2.0 * h + 20.0
    );
    let panels: [Panel; 2] = [
        ("server resident memory (MiB)", rss_mib, (bound as f64 / f64::from(1 << 20)).max(1.0)),
        ("p99 latency (ms)", p99, windows.iter().map(p99).fold(1.0, f64::max)),
    ];
    for (i, (title, value, top)) in panels.iter().enumerate() {
        let y0 = i as f64 * (h + 10.0);
        let y = |v: f64| y0 + h - pad / 2.0 - v / (top * 1.1) * (h - pad);
        out += &format!(r#"<text x="{pad}" y="{}">{title}</text>"#, y0 + 15.0);
        out += &format!(r#"<line x1="{pad}" y1="{0}" x2="{1}" y2="{0}" stroke="black"/>"#, y(0.0), w - pad);
        out +=
            &format!(r#"<text x="5" y="{}">{:.0}</text><text x="5" y="{}">0</text>"#, y(*top) + 4.0, top, y(0.0) + 4.0);
        if i == 0 {
            out += &format!(
                r#"<line x1="{pad}" y1="{0}" x2="{1}" y2="{0}" stroke="red" stroke-dasharray="4"/><text x="{1}" y="{0}" fill="red" text-anchor="end">budgets</text>"#,
                y(*top),
                w - pad
            );
        }
        for r in restarts {
            out += &format!(
                r#"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="gray" stroke-dasharray="2"/>"#,
                x(*r as f64),
                y0 + 20.0,
                y(0.0)
            );
        }
        let points: Vec<String> = windows.iter().map(|r| format!("{:.1},{:.1}", x(r.t as f64), y(value(r)))).collect();
        out += &format!(r#"<polyline fill="none" stroke="steelblue" stroke-width="2" points="{}"/>"#, points.join(" "));
    }
    out += &format!(
        r#"<text x="{pad}" y="{0}">0</text><text x="{1}" y="{0}" text-anchor="middle">{2} s</text>"#,
        2.0 * h + 15.0,
        w - pad,
        seconds
    );
    out += &format!(
        r#"<text x="{}" y="{}" text-anchor="middle">time; dashed gray lines: restarts</text></svg>"#,
        w / 2.0,
        2.0 * h + 15.0
    );
    out
}

fn main() {
    let args = Args::parse();
    std::fs::create_dir_all(&args.dir).unwrap_or_else(|e| die(&format!("cannot create {}: {e}", args.dir.display())));
    let volume = args.dir.join("vol");
    let status = Command::new(&args.kvhoard)
        .arg("init")
        .arg(&volume)
        .args(["--capacity", &args.capacity])
        .stdout(Stdio::null())
        .status()
        .unwrap_or_else(|e| die(&format!("cannot run {}: {e}", args.kvhoard.display())));
    if !status.success() {
        die(&format!("kvhoard init {} failed", volume.display()));
    }
    let (inflight, dram) = (bytes_of(&args.max_inflight), bytes_of(&args.dram_tier));
    // What the server may hold: payloads in flight, the DRAM tier, the idle buffers the server
    // and the engine keep (a quarter of the budget; 256 MiB), and the process itself.
    let bound = inflight + dram + inflight / 4 + (256 << 20) + (128 << 20);
    let mut server = Server {
        kvhoard: args.kvhoard.clone(),
        volume,
        log: args.dir.join("serve.log"),
        args: vec![
            "--max-inflight".into(),
            args.max_inflight.clone(),
            "--dram-tier".into(),
            args.dram_tier.clone(),
            "--max-object-size".into(),
            format!("{}", args.max_object.max(1 << 20)),
        ],
        child: None,
    };
    let addrs = server.start();
    let shared = Arc::new(Shared {
        started: Instant::now(),
        seconds: Mutex::new(Vec::new()),
        generation: AtomicU64::new(0),
        restarting: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        addrs: Mutex::new(addrs),
        max_object: args.max_object,
        problems: Mutex::new(Vec::new()),
    });
    let clients: Vec<_> = (0..args.clients)
        .map(|id| {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || client(shared, id))
        })
        .collect();
    let mut restarts = Vec::new();
    let mut last_restart = Instant::now();
    let mut kill_next = false;
    let end = Instant::now() + Duration::from_secs(args.seconds);
    let mut printed = 0;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(250));
        let rss = rss_of(server.pid());
        shared.record(|s| s.rss = s.rss.max(rss));
        if args.restart_every > 0 && last_restart.elapsed() >= Duration::from_secs(args.restart_every) {
            shared.restarting.store(true, Ordering::SeqCst);
            shared.generation.fetch_add(1, Ordering::SeqCst);
            server.stop(kill_next);
            restarts.push(shared.started.elapsed().as_secs());
            eprintln!(
                "soak: {} s: restarted the server ({})",
                shared.started.elapsed().as_secs(),
                if kill_next { "SIGKILL" } else { "SIGTERM" }
            );
            kill_next = !kill_next;
            let addrs = server.start();
            *shared.addrs.lock().unwrap_or_else(|e| e.into_inner()) = addrs;
            shared.generation.fetch_add(1, Ordering::SeqCst);
            shared.restarting.store(false, Ordering::SeqCst);
            last_restart = Instant::now();
        }
        let now = shared.started.elapsed().as_secs();
        if now >= printed + 30 {
            printed = now;
            let seconds = shared.seconds.lock().unwrap_or_else(|e| e.into_inner());
            let ops: usize = seconds.iter().map(|s| s.latencies_us.len()).sum();
            let errors: u64 = seconds.iter().map(|s| s.errors + s.wrong).sum();
            eprintln!("soak: {now} s: {ops} requests, {errors} errors, server RSS {} MiB", rss >> 20);
        }
    }
    shared.stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.join();
    }
    server.stop(false);

    let seconds = shared.seconds.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut all: Vec<u32> = seconds.iter().flat_map(|s| s.latencies_us.iter().copied()).collect();
    all.sort_unstable();
    let window = (args.seconds / 60).max(5);
    let windows: Vec<Window> = seconds
        .chunks(window as usize)
        .enumerate()
        .map(|(i, chunk)| {
            let mut l: Vec<u32> = chunk.iter().flat_map(|s| s.latencies_us.iter().copied()).collect();
            l.sort_unstable();
            Window {
                t: i as u64 * window,
                p50_ms: percentile(&l, 0.5),
                p99_ms: percentile(&l, 0.99),
                rss: chunk.iter().map(|s| s.rss).max().unwrap_or(0),
            }
        })
        .collect();
    let sum = |f: fn(&Second) -> u64| seconds.iter().map(f).sum::<u64>();
    let (errors, wrong, disconnects, bytes) =
        (sum(|s| s.errors), sum(|s| s.wrong), sum(|s| s.disconnects), sum(|s| s.bytes));
    let max_rss = seconds.iter().map(|s| s.rss).max().unwrap_or(0);
    let problems = shared.problems.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let report = serde_json::json!({
        "clients": args.clients,
        "seconds": args.seconds,
        "restarts": restarts.len(),
        "requests": all.len(),
        "bytes": bytes,
        "errors": errors,
        "wrong": wrong,
        "disconnects_at_restarts": disconnects,
        "p50_ms": percentile(&all, 0.5),
        "p99_ms": percentile(&all, 0.99),
        "p999_ms": percentile(&all, 0.999),
        "max_rss_bytes": max_rss,
        "rss_bound_bytes": bound,
        "windows": windows.iter().map(|w| serde_json::json!({"t": w.t, "p50_ms": w.p50_ms, "p99_ms": w.p99_ms, "rss_bytes": w.rss})).collect::<Vec<_>>(),
        "problems": problems,
    })
    .to_string();
    if let Some(path) = &args.json {
        write_or_die(path, &report);
    }
    if let Some(path) = &args.svg {
        write_or_die(path, &svg(&windows, &restarts, bound, args.seconds));
    }
    println!(
        "soak: {} clients, {} s, {} restarts: {} requests ({:.1} GB), {errors} errors, {wrong} wrong, {disconnects} cut by restarts; latency p50 {:.1} ms, p99 {:.1} ms; server RSS max {} MiB (bound {} MiB)",
        args.clients,
        args.seconds,
        restarts.len(),
        all.len(),
        bytes as f64 / 1e9,
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        max_rss >> 20,
        bound >> 20
    );
    for p in &problems {
        println!("  {p}");
    }
    if errors > 0 || wrong > 0 || max_rss > bound {
        std::process::exit(1);
    }
}

fn write_or_die(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| die(&format!("cannot write {}: {e}", path.display())));
}

#[cfg(test)]
mod tests {
    use super::served_addresses;

    #[test]
    fn the_served_addresses_are_read_from_the_servers_line() {
        let log = "starting\nkvhoard: serving vol on lm://127.0.0.1:41000 (namespace lm), resp://127.0.0.1:41001 \
                   (namespace resp); Ctrl-C to stop\n";
        let (lm, resp) = served_addresses(log).expect("both addresses");
        assert_eq!((lm.port(), resp.port()), (41000, 41001));
        assert!(served_addresses("kvhoard: serving vol on lm://127.0.0.1:1 (namespace lm)").is_none());
    }
}
