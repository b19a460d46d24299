//! `kvhoard cluster` and `kvhoard serve --cluster-config` as an operator uses them: a map written
//! by `cluster init`, nodes started on it, `cluster status`, a new map taken on SIGHUP, a broken
//! one refused while the old one keeps serving, a node down seen as down; and a node SIGKILLed
//! while clients read and write (only its keys fail, no wrong bytes, all served once it is back).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{kvhoard, ok, p};

/// A port free now (the kernel's choice, released at once).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn serve(vol: &str, port: u16, map: &str) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_kvhoard"))
        .args(["serve", vol, "--resp", &port.to_string(), "--cluster-config", map, "--dram-tier", "0"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Serving once the port answers.
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "kvhoard serve did not start on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill sends a signal to the child's pid; no memory is involved.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// CLUSTER INFO's `cluster_current_epoch`.
fn epoch(port: u16) -> u64 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"CLUSTER INFO\r\n").unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    let line = text.lines().find(|l| l.starts_with("cluster_current_epoch:")).unwrap_or_else(|| panic!("{text}"));
    line.split(':').nth(1).unwrap().trim().parse().unwrap()
}

fn wait_epoch(port: u16, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while epoch(port) != want {
        assert!(Instant::now() < deadline, "port {port} never reached epoch {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(mut child: Child) -> String {
    signal(&child, libc::SIGTERM);
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{err}");
    err
}

#[test]
fn nodes_serve_a_map_take_a_new_one_on_sighup_and_keep_theirs_when_it_is_broken() {
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("cluster.map");
    let (a, b) = (free_port(), free_port());
    let nodes = format!("127.0.0.1:{a},127.0.0.1:{b}");
    ok(&["cluster", "init", "--nodes", &nodes, "--out", p(&map)]);
    let text = std::fs::read_to_string(&map).unwrap();
    assert!(text.contains(&format!("node 127.0.0.1:{a} 0-8191\n")), "{text}");
    assert!(
        kvhoard(&["cluster", "init", "--nodes", &nodes, "--out", p(&map)]).status.code() == Some(1),
        "no overwrite"
    );
    let mut children = Vec::new();
    for (i, port) in [a, b].into_iter().enumerate() {
        let vol = dir.path().join(format!("v{i}"));
        ok(&["init", p(&vol), "--capacity", "32MiB", "--segment-size", "2MiB"]);
        children.push(serve(p(&vol), port, p(&map)));
    }
    let status: serde_json::Value =
        serde_json::from_str(&ok(&["cluster", "status", "--config", p(&map), "--json"])).unwrap();
    assert_eq!(status["healthy"], 2, "{status}");
    assert_eq!(status["nodes"][0]["slots_served"], 8192);

    // A new map (halves swapped, epoch 2), then SIGHUP: both nodes serve it.
    std::fs::write(&map, format!("epoch 2\nnode 127.0.0.1:{a} 8192-16383\nnode 127.0.0.1:{b} 0-8191\n")).unwrap();
    for c in &children {
        signal(c, libc::SIGHUP);
    }
    wait_epoch(a, 2);
    wait_epoch(b, 2);
    let status: serde_json::Value =
        serde_json::from_str(&ok(&["cluster", "status", "--config", p(&map), "--json"])).unwrap();
    assert_eq!(status["healthy"], 2, "{status}");

    // A broken map is refused; the node keeps serving epoch 2.
    std::fs::write(&map, "epoch 3\nnode 127.0.0.1:1 0-100\n").unwrap();
    signal(&children[0], libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(epoch(a), 2);

    // A node down is reported down, and status exits 1.
    std::fs::write(&map, format!("epoch 2\nnode 127.0.0.1:{a} 8192-16383\nnode 127.0.0.1:{b} 0-8191\n")).unwrap();
    let second = children.pop().unwrap();
    stop(second);
    let out = kvhoard(&["cluster", "status", "--config", p(&map)]);
    assert_eq!(out.status.code(), Some(1));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("down: "), "{table}");
    assert!(table.contains("1 of 2 node(s) ok"), "{table}");
    let log = stop(children.pop().unwrap());
    assert!(log.contains("cluster map reloaded"), "{log}");
    assert!(log.contains("cluster map NOT reloaded"), "{log}");
    assert!(log.contains("volume closed"), "{log}");
}

/// The value stored under key `i`: distinct per key, a few KiB.
fn value(i: u64) -> Vec<u8> {
    let len = 1024 + (i % 7) as usize * 512;
    (0..len).map(|j| (i.wrapping_mul(31).wrapping_add(j as u64 * 7) % 251) as u8).collect()
}

fn key(i: u64) -> String {
    format!("org/model@1@0@{:x}@bfloat16kv_bytes", i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// What the clients saw, per phase of the run.
#[derive(Debug, Default)]
struct Seen {
    served: u64,
    /// Requests that failed, all for keys of the node killed.
    failed_on_killed: u64,
    /// Keys of the node killed served after it came back.
    served_by_returned: u64,
    written_during_outage: u64,
}

#[test]
fn a_node_sigkilled_mid_run_costs_only_its_keys_and_serves_them_again_when_it_returns() {
    use kvhoard_serve::cluster::client::{ClientError, ClientOptions, ClusterClient, Reply};
    use kvhoard_serve::cluster::{keyslot, SlotMap};
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::sync::{Arc, Mutex};

    let dir = tempfile::tempdir().unwrap();
    let map_path = dir.path().join("cluster.map");
    let ports = [free_port(), free_port(), free_port()];
    let nodes = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    ok(&["cluster", "init", "--nodes", &nodes, "--out", p(&map_path)]);
    let map = SlotMap::parse(&std::fs::read_to_string(&map_path).unwrap()).unwrap();
    let vols: Vec<_> = (0..3).map(|i| dir.path().join(format!("v{i}"))).collect();
    let mut children: Vec<Child> = Vec::new();
    for (vol, port) in vols.iter().zip(ports) {
        ok(&["init", p(vol), "--capacity", "64MiB", "--segment-size", "4MiB"]);
        children.push(serve(p(vol), port, p(&map_path)));
    }
    let killed_port = ports[1];
    let on_killed = |k: &str| map.owner_node(keyslot(k.as_bytes())).unwrap().port == killed_port;
    let seeds: Vec<String> = nodes.split(',').map(String::from).collect();
    let opts = ClientOptions { timeout: Duration::from_secs(10), password: None };

    // Keys stored before anything happens, acknowledged with the server's default durability
    // (`written`: a SIGKILL loses none of them).
    let stored = 600u64;
    let mut c = ClusterClient::connect(&seeds, opts.clone()).unwrap();
    for i in 0..stored {
        let reply = c.request(key(i).as_bytes(), &[b"SET", key(i).as_bytes(), &value(i)]).unwrap();
        assert_eq!(reply, Reply::Simple("OK".into()));
    }

    // 0: all up; 1: the node is being killed or down; 2: it is back (its port answers).
    let phase = Arc::new(AtomicU8::new(0));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let done = Arc::new(AtomicU8::new(0));
    let written = Arc::new(Mutex::new(Vec::<u64>::new()));
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let (phase, seen, done, written) = (phase.clone(), seen.clone(), done.clone(), written.clone());
            let (seeds, opts, map) = (seeds.clone(), opts.clone(), map.clone());
            std::thread::spawn(move || {
                let on_killed = |k: &str| map.owner_node(keyslot(k.as_bytes())).unwrap().port == killed_port;
                let mut c = ClusterClient::connect(&seeds, opts).unwrap();
                let mut n = t;
                while done.load(Ordering::SeqCst) == 0 {
                    n += 3;
                    // Mostly reads of stored keys; every fourth request writes a new key.
                    let (i, write) = if n % 4 == 0 { (1_000_000 + n, true) } else { (n * 7919 % stored, false) };
                    let k = key(i);
                    let v = value(i);
                    let result = if write {
                        c.request(k.as_bytes(), &[b"SET", k.as_bytes(), &v])
                    } else {
                        c.request(k.as_bytes(), &[b"GET", k.as_bytes()])
                    };
                    let now = phase.load(Ordering::SeqCst);
                    let mut s = seen.lock().unwrap();
                    match result {
                        Ok(Reply::Simple(ok)) if write && ok == "OK" => {
                            if now == 1 {
                                s.written_during_outage += 1;
                            }
                            written.lock().unwrap().push(i);
                        }
                        Ok(Reply::Bulk(got)) if !write => {
                            assert!(got == v, "{k}: wrong bytes");
                            s.served += 1;
                            if now == 2 && on_killed(&k) {
                                s.served_by_returned += 1;
                            }
                        }
                        Err(ClientError::Io { .. }) if now >= 1 && on_killed(&k) => s.failed_on_killed += 1,
                        other => panic!("{k} ({}) in phase {now}: {other:?}", if write { "SET" } else { "GET" }),
                    }
                }
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(500));
    phase.store(1, Ordering::SeqCst);
    signal(&children[1], libc::SIGKILL);
    let status = children[1].wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    std::thread::sleep(Duration::from_millis(700));
    // Back on the same volume and port.
    children[1] = serve(p(&vols[1]), killed_port, p(&map_path));
    phase.store(2, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(700));
    done.store(1, Ordering::SeqCst);
    for w in workers {
        w.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert!(seen.failed_on_killed > 0, "no request hit the node while it was down: {seen:?}");
    assert!(seen.served_by_returned > 0, "the node's keys were not served after it returned: {seen:?}");
    assert!(seen.written_during_outage > 0, "the other nodes took no writes meanwhile: {seen:?}");

    // Every key acknowledged, before or during the run, on any node, is there with its bytes.
    let mut c = ClusterClient::connect(&seeds, opts).unwrap();
    let written = written.lock().unwrap();
    for &i in (0..stored).collect::<Vec<_>>().iter().chain(written.iter()) {
        let got = c.request(key(i).as_bytes(), &[b"GET", key(i).as_bytes()]).unwrap();
        assert_eq!(got, Reply::Bulk(value(i)), "{} (on the node killed: {})", key(i), on_killed(&key(i)));
    }
    for child in children {
        stop(child);
    }
}
