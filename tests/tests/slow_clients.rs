//! Slow and hostile clients against `kvhoard serve`: connections that announce 100 MiB and
//! trickle a byte at a time, and connections that send 8 MiB fast and then stall, together
//! holding more than the server's whole payload budget, while a normal client stores and reads
//! 2 MiB objects. The normal client must be served within a bound, the trickling connections
//! cut, the server's memory held to its budget meanwhile and returned after they close.
//!
//! One test in this binary, so the process's resident memory is the server's (plus the
//! clients' few buffers).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvhoard_engine::{CreateOptions, Store, StoreOptions};
use kvhoard_serve::lm::wire::{self, Command, WireMeta, REPLY_BYTES};
use kvhoard_serve::ServeOptions;

const MIB: u64 = 1 << 20;
const BUDGET: u64 = 256 * MIB;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Whether the server closed `s` (a read returns end of file or an error rather than waiting).
fn closed_by_server(mut s: &TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

fn resp_set(s: &mut TcpStream, key: &str, value: &[u8]) {
    let mut req = format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n", key.len(), value.len()).into_bytes();
    req.extend_from_slice(value);
    req.extend_from_slice(b"\r\n");
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 5];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+OK\r\n");
}

fn resp_get(s: &mut TcpStream, key: &str) -> Vec<u8> {
    s.write_all(format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes()).unwrap();
    let mut header = Vec::new();
    let mut b = [0u8; 1];
    while !header.ends_with(b"\r\n") {
        s.read_exact(&mut b).unwrap();
        header.push(b[0]);
    }
    let len: usize = std::str::from_utf8(&header[1..header.len() - 2]).unwrap().parse().unwrap();
    let mut value = vec![0u8; len + 2];
    s.read_exact(&mut value).unwrap();
    value.truncate(len);
    value
}

const META: WireMeta = WireMeta { fmt: 1, dtype: 3, shape: [2, 4, 256, 512] };

fn lm_put(s: &mut TcpStream, key: &str, value: &[u8]) {
    s.write_all(&wire::encode_request(Command::Put, value.len() as u32, &META, key).unwrap()).unwrap();
    s.write_all(value).unwrap();
}

fn lm_get(s: &mut TcpStream, key: &str) -> Vec<u8> {
    s.write_all(&wire::encode_request(Command::Get, 0, &META, key).unwrap()).unwrap();
    let mut reply = [0u8; REPLY_BYTES];
    s.read_exact(&mut reply).unwrap();
    let (code, len, _) = wire::parse_reply(&reply);
    assert_eq!(code, 200, "lm:// GET of {key}");
    let mut value = vec![0u8; len as usize];
    s.read_exact(&mut value).unwrap();
    value
}

#[test]
fn slow_clients_cost_only_their_own_connections_and_memory_comes_back() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let create = CreateOptions { capacity_bytes: Some(512 * MIB), segment_size_bytes: 64 * MIB };
    let store_opts = StoreOptions { dram_tier_bytes: 0, ..StoreOptions::default() };
    let store = Arc::new(Store::create(&dir.path().join("vol"), &create, store_opts).unwrap());
    let local = Some("127.0.0.1:0".parse().unwrap());
    let opts = ServeOptions {
        lm: local,
        resp: local,
        max_object_bytes: 128 * MIB,
        inflight_bytes: BUDGET,
        header_timeout: Duration::from_secs(2),
        min_rate: MIB,
        ..ServeOptions::default()
    };
    let running = kvhoard_serve::start(Arc::clone(&store), opts).unwrap();
    let (lm, resp) = (running.addrs().lm.unwrap(), running.addrs().resp.unwrap());
    let idle_rss = rss_bytes();

    // 25 lm:// and 25 RESP connections announce 100 MiB each, send 150 bytes, then trickle.
    let mut tricklers = Vec::new();
    for i in 0..25 {
        let mut s = connect(lm);
        s.write_all(&wire::encode_request(Command::Put, 100 << 20, &META, &format!("slow-lm-{i}")).unwrap()).unwrap();
        s.write_all(&[7u8; 150]).unwrap();
        tricklers.push(s);
        let mut s = connect(resp);
        s.write_all(format!("*3\r\n$3\r\nSET\r\n$8\r\nslow-{i:03}\r\n${}\r\n", 100 << 20).as_bytes()).unwrap();
        s.write_all(&[7u8; 150]).unwrap();
        tricklers.push(s);
    }
    // 40 RESP connections send 8 MiB of a 100 MiB value fast, then stall: 320 MiB, more than the
    // whole budget, until they are cut.
    let eight = Arc::new(vec![3u8; 8 << 20]);
    let stallers: Vec<TcpStream> = (0..40)
        .map(|i| {
            let mut s = connect(resp);
            s.write_all(format!("*3\r\n$3\r\nSET\r\n$9\r\nstall-{i:03}\r\n${}\r\n", 100 << 20).as_bytes()).unwrap();
            s
        })
        .collect();
    let senders: Vec<_> = stallers
        .into_iter()
        .map(|mut s| {
            let eight = Arc::clone(&eight);
            std::thread::spawn(move || {
                // The server may cut it before all 8 MiB are in: that is what it should do.
                let _ = s.write_all(&eight);
                s
            })
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let trickle = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for s in &mut tricklers {
                    let _ = s.write_all(b"x");
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            tricklers
        })
    };

    // Meanwhile a normal client stores and reads 2 MiB objects over both protocols.
    let mut rc = connect(resp);
    let mut lc = connect(lm);
    let mut worst = Duration::ZERO;
    let mut peak_rss = 0;
    let started = Instant::now();
    let mut round = 0u32;
    while started.elapsed() < Duration::from_secs(6) {
        let value: Vec<u8> = (0..2 << 20).map(|j: u32| (j.wrapping_mul(round + 7) >> 3) as u8).collect();
        let t = Instant::now();
        resp_set(&mut rc, &format!("normal-{round}"), &value);
        let got = resp_get(&mut rc, &format!("normal-{round}"));
        let value_lm: Vec<u8> = value.iter().map(|b| b ^ 0x5a).collect();
        lm_put(&mut lc, &format!("normal-lm-{round}"), &value_lm);
        let got_lm = lm_get(&mut lc, &format!("normal-lm-{round}"));
        worst = worst.max(t.elapsed());
        assert!(got == value, "RESP round {round} read back other bytes");
        assert!(got_lm == value_lm, "lm:// round {round} read back other bytes");
        peak_rss = peak_rss.max(rss_bytes());
        round += 1;
    }
    eprintln!("normal client: {round} rounds, worst {worst:?}; peak RSS {} MiB over idle", (peak_rss - idle_rss) >> 20);
    assert!(round >= 5, "only {round} rounds of SET+GET+PUT+GET in 6 s");
    assert!(worst < Duration::from_secs(3), "a normal round took {worst:?} while slow clients were connected");
    assert!(
        peak_rss < idle_rss + BUDGET + 64 * MIB,
        "resident memory rose {} MiB over idle, more than the {} MiB budget",
        (peak_rss - idle_rss) >> 20,
        BUDGET >> 20
    );

    // The trickling connections were cut at their deadline (2 s + 150 bytes at 1 MiB/s).
    stop.store(true, Ordering::Relaxed);
    let tricklers = trickle.join().unwrap();
    let still_open = tricklers.iter().filter(|s| !closed_by_server(s)).count();
    assert_eq!(still_open, 0, "trickling connections still open after 6 s");
    let stallers: Vec<TcpStream> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline && stallers.iter().any(|s| !closed_by_server(s)) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(stallers.iter().all(closed_by_server), "stalled connections still open (8 MiB at 1 MiB/s: 10 s)");
    drop((tricklers, stallers, rc, lc));

    // Memory goes back once the buffers have been idle for a while.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut rss = rss_bytes();
    while Instant::now() < deadline && rss > idle_rss + 64 * MIB {
        std::thread::sleep(Duration::from_millis(500));
        rss = rss_bytes();
    }
    assert!(
        rss <= idle_rss + 64 * MIB,
        "resident memory stayed {} MiB over idle after every client left",
        (rss - idle_rss) >> 20
    );
    running.shutdown(Duration::from_secs(5));
}
