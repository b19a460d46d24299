//! The mount against an in-memory model, under random operations: publishing through a temporary
//! name and a rename, overwriting in place and by rename, partial writes, truncation, unlink,
//! renames of files being written, writers kept open across other operations, reads and stats
//! from this process and from others (which must see only published versions), readers in other
//! processes racing overwrites, and the mount killed with SIGKILL mid-write, then mounted again.
//!
//! The model holds, per name, the published content: what every other process sees, what the
//! native API reads, and what survives a kill. A writer's content is published when it closes,
//! unless its file was deleted or replaced meanwhile (docs/fuse.md, "Files being written").
//!
//! `KVHOARD_FUSE_MODEL_OPS` sets the operations per seed (default 2000). Each run replays seed 1
//! and one random seed, printed: `KVHOARD_FUSE_MODEL_SEED=N` replays N alone.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kvhoard_engine::{ReadOptions, Store, StoreOptions};
use kvhoard_tests::mount::fuse_usable;
use kvhoard_tests::Rng;

const NAMES: [&str; 6] = ["k0", "k1", "k2", "k3", "k4", "k5"];

/// A mount served by a child process, so that it can be killed.
struct Mount {
    child: Option<Child>,
    volume: PathBuf,
    mnt: PathBuf,
}

impl Mount {
    fn start(volume: &Path, mnt: &Path) -> Mount {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mount-volume"))
            .arg(volume)
            .arg(mnt)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "mounted", "the mount did not start");
        Mount { child: Some(child), volume: volume.to_path_buf(), mnt: mnt.to_path_buf() }
    }

    /// SIGKILL: whatever was not stored is lost; the kernel's mount is detached.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }

    /// Unmounts and closes the volume cleanly (the child does, when its input closes).
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take());
            let status = child.wait().unwrap();
            assert!(status.success(), "the mount did not stop cleanly: {status}");
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A file open for writing, kept open across other operations.
struct Writer {
    file: File,
    /// The name its file has now (renames move it).
    name: String,
    content: Vec<u8>,
    /// Its file was deleted or replaced: closing it publishes nothing.
    orphaned: bool,
}

struct Run {
    rng: Rng,
    mount: Mount,
    published: BTreeMap<String, Vec<u8>>,
    writers: Vec<Writer>,
    next_content: u64,
}

impl Run {
    fn path(&self, name: &str) -> PathBuf {
        self.mount.mnt.join("default").join(name)
    }

    fn content(&mut self) -> Vec<u8> {
        self.next_content += 1;
        let len = match self.rng.below(4) {
            0 => self.rng.below(16) as usize,
            1 => self.rng.below(8192) as usize,
            _ => self.rng.below(200_000) as usize,
        };
        kvhoard_tests::block(self.next_content, len)
    }

    fn name(&mut self) -> String {
        NAMES[self.rng.below(NAMES.len() as u64) as usize].to_string()
    }

    fn writer_on(&self, name: &str) -> Option<usize> {
        self.writers.iter().position(|w| w.name == name && !w.orphaned)
    }

    /// Writers whose file the name held are now writing a deleted file.
    fn orphan(&mut self, name: &str) {
        self.writers.iter_mut().filter(|w| w.name == name).for_each(|w| w.orphaned = true);
    }

    /// What another process sees: the published content, or an empty file while only a writer
    /// holds it.
    fn seen_by_others(&self, name: &str) -> Option<Vec<u8>> {
        match self.published.get(name) {
            Some(c) => Some(c.clone()),
            None => self.writer_on(name).map(|_| Vec::new()),
        }
    }

    fn step(&mut self, op: u64) -> String {
        let name = self.name();
        let path = self.path(&name);
        match op {
            0..15 => {
                let content = self.content();
                let tmp = self.path(&format!("{name}.tmp"));
                std::fs::write(&tmp, &content).unwrap();
                std::fs::rename(&tmp, &path).unwrap();
                self.orphan(&name);
                self.published.insert(name.clone(), content);
                format!("publish {name} by rename")
            }
            15..25 if self.writer_on(&name).is_none() => {
                let content = self.content();
                std::fs::write(&path, &content).unwrap();
                self.published.insert(name.clone(), content);
                format!("overwrite {name}")
            }
            25..33 if self.writer_on(&name).is_none() && self.published.contains_key(&name) => {
                let offset = self.rng.below(self.published[&name].len() as u64 + 100);
                let data = self.content();
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                f.write_all_at(&data, offset).unwrap();
                drop(f);
                let c = self.published.get_mut(&name).unwrap();
                let end = offset as usize + data.len();
                // A write of nothing changes nothing, not even the size.
                if !data.is_empty() {
                    if c.len() < end {
                        c.resize(end, 0);
                    }
                    c[offset as usize..end].copy_from_slice(&data);
                }
                format!("write {} bytes into {name} at {offset}", data.len())
            }
            33..47 if self.writer_on(&name).is_none() => {
                let got = std::fs::read(&path).ok();
                let want = self.published.get(&name);
                assert!(got.as_ref() == want, "read {name}: {}", differs(got.as_deref(), want.map(|w| &w[..])));
                format!("read {name}")
            }
            47..52 => {
                let out = Command::new("cat").arg(&path).stderr(Stdio::null()).output().unwrap();
                let got = out.status.success().then_some(out.stdout);
                let want = self.seen_by_others(&name);
                assert!(
                    got == want,
                    "another process read {name}: {:?} bytes, want {:?}",
                    got.map(|g| g.len()),
                    want.map(|w| w.len())
                );
                format!("read {name} from another process")
            }
            52..58 if self.writer_on(&name).is_none() => {
                let got = std::fs::metadata(&path).ok().map(|m| m.len());
                assert_eq!(got, self.published.get(&name).map(|c| c.len() as u64), "stat {name}");
                format!("stat {name}")
            }
            58..63 => {
                let removed = std::fs::remove_file(&path).is_ok();
                let existed = self.published.remove(&name).is_some() | self.writer_on(&name).is_some();
                assert_eq!(removed, existed, "unlink {name}");
                self.orphan(&name);
                format!("unlink {name}")
            }
            63..68 if self.writer_on(&name).is_none() && self.published.contains_key(&name) => {
                let len = self.rng.below(self.published[&name].len() as u64 * 2 + 10);
                File::options().write(true).open(&path).unwrap().set_len(len).unwrap();
                self.published.get_mut(&name).unwrap().resize(len as usize, 0);
                format!("truncate {name} to {len}")
            }
            68..76 => {
                let to = self.name();
                let exists = self.published.contains_key(&name) || self.writer_on(&name).is_some();
                let renamed = std::fs::rename(&path, self.path(&to)).is_ok();
                assert_eq!(renamed, exists, "rename {name} to {to}");
                if renamed && name != to {
                    self.orphan(&to);
                    match self.published.remove(&name) {
                        Some(c) => self.published.insert(to.clone(), c),
                        None => self.published.remove(&to),
                    };
                    self.writers.iter_mut().filter(|w| w.name == name).for_each(|w| w.name = to.clone());
                }
                format!("rename {name} to {to}")
            }
            76..84 if self.writer_on(&name).is_none() && self.writers.len() < 3 => {
                let content = self.content();
                let mut file = File::create(&path).unwrap();
                file.write_all(&content).unwrap();
                self.writers.push(Writer { file, name: name.clone(), content, orphaned: false });
                format!("open {name} for writing, keep it open")
            }
            84..90 if !self.writers.is_empty() => {
                let i = self.rng.below(self.writers.len() as u64) as usize;
                let more = self.content();
                let w = &mut self.writers[i];
                w.file.write_all(&more).unwrap();
                w.content.extend_from_slice(&more);
                format!("write {} more bytes to the writer of {}", more.len(), w.name)
            }
            90..97 if !self.writers.is_empty() => {
                let i = self.rng.below(self.writers.len() as u64) as usize;
                let w = self.writers.swap_remove(i);
                drop(w.file);
                if !w.orphaned {
                    self.published.insert(w.name.clone(), w.content);
                }
                format!("close the writer of {}", w.name)
            }
            97 => {
                self.racing_readers(&name);
                format!("overwrite {name} while other processes read it")
            }
            98 => {
                self.remount(true);
                "kill the mount and mount again".into()
            }
            99 => {
                self.remount(false);
                "unmount and mount again".into()
            }
            _ => "nothing".into(),
        }
    }

    /// Overwrites `name` several times while another thread reads it from other processes: each
    /// read is one whole version.
    fn racing_readers(&mut self, name: &str) {
        if self.writer_on(name).is_some() {
            return;
        }
        let path = self.path(name);
        let versions: Arc<Mutex<Vec<Option<Vec<u8>>>>> = Arc::new(Mutex::new(vec![self.seen_by_others(name)]));
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (path, versions, stop) = (path.clone(), Arc::clone(&versions), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) || reads == 0 {
                    let out = Command::new("cat").arg(&path).stderr(Stdio::null()).output().unwrap();
                    let got = out.status.success().then_some(out.stdout);
                    let known = versions.lock().unwrap();
                    assert!(
                        known.contains(&got),
                        "a racing reader saw {:?} bytes, not a whole version",
                        got.map(|g| g.len())
                    );
                    reads += 1;
                }
            })
        };
        for round in 0..8 {
            let content = self.content();
            versions.lock().unwrap().push(Some(content.clone()));
            if round % 2 == 0 {
                let tmp = self.path(&format!("{name}.tmp"));
                std::fs::write(&tmp, &content).unwrap();
                std::fs::rename(&tmp, &path).unwrap();
            } else {
                std::fs::write(&path, &content).unwrap();
            }
            self.orphan(name);
            self.published.insert(name.to_string(), content);
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
    }

    /// Kills (or stops) the mount and mounts it again; then everything published is there, and
    /// nothing a writer still held.
    fn remount(&mut self, kill: bool) {
        if kill {
            self.mount.kill();
            // Their mount is gone: closing them stores nothing.
            self.writers.clear();
        } else {
            for w in self.writers.drain(..) {
                drop(w.file);
                if !w.orphaned {
                    self.published.insert(w.name, w.content);
                }
            }
            self.mount.stop();
        }
        self.mount = Mount::start(&self.mount.volume.clone(), &self.mount.mnt.clone());
        self.check_all("after mounting again");
    }

    fn check_all(&self, when: &str) {
        let mut listed: Vec<String> = std::fs::read_dir(self.mount.mnt.join("default"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.ends_with(".tmp"))
            .collect();
        listed.sort();
        let mut want: Vec<String> = self.published.keys().cloned().collect();
        for w in self.writers.iter().filter(|w| !w.orphaned) {
            if !want.contains(&w.name) {
                want.push(w.name.clone());
            }
        }
        want.sort();
        let published: Vec<&String> = self.published.keys().collect();
        // Files only a writer holds are not listed until published.
        assert!(listed.iter().all(|n| want.contains(n)), "{when}: listed {listed:?}, want {want:?}");
        assert!(published.iter().all(|n| listed.contains(n)), "{when}: listed {listed:?}, published {published:?}");
        for name in NAMES {
            if self.writer_on(name).is_some() {
                continue;
            }
            let got = std::fs::read(self.path(name)).ok();
            assert!(got == self.published.get(name).cloned(), "{when}: {name} holds {:?} bytes", got.map(|g| g.len()));
        }
    }
}

/// Where `got` and `want` part.
fn differs(got: Option<&[u8]>, want: Option<&[u8]>) -> String {
    match (got, want) {
        (Some(g), Some(w)) => {
            let at = g.iter().zip(w).position(|(a, b)| a != b).unwrap_or(g.len().min(w.len()));
            format!("{} bytes, want {}, first difference at {at}", g.len(), w.len())
        }
        (g, w) => format!("{:?} bytes, want {:?}", g.map(<[u8]>::len), w.map(<[u8]>::len)),
    }
}

fn run_seed(seed: u64, ops: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (volume, mnt) = (dir.path().join("vol"), dir.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    let mount = Mount::start(&volume, &mnt);
    let mut run = Run { rng: Rng::new(seed), mount, published: BTreeMap::new(), writers: Vec::new(), next_content: 0 };
    let mut history: Vec<String> = Vec::new();
    for i in 0..ops {
        let op = run.rng.below(100);
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.step(op)));
        match step {
            Ok(what) => history.push(what),
            Err(panic) => {
                let recent = history.iter().rev().take(40).rev().cloned().collect::<Vec<_>>().join("\n  ");
                eprintln!("mount model: seed {seed} failed at operation {i}; the last ones:\n  {recent}");
                let sizes: Vec<(String, usize)> = run.published.iter().map(|(k, v)| (k.clone(), v.len())).collect();
                eprintln!("model: {sizes:?}");
                for name in NAMES {
                    eprintln!("  {name}: {:?}", std::fs::metadata(run.path(name)).map(|m| m.len()).ok());
                }
                std::panic::resume_unwind(panic);
            }
        }
    }
    for w in run.writers.drain(..) {
        drop(w.file);
        if !w.orphaned {
            run.published.insert(w.name, w.content);
        }
    }
    run.check_all("at the end");
    run.mount.stop();
    // What the mount published is what the native API reads.
    let store = Store::open(&volume, StoreOptions::default()).unwrap();
    for (name, content) in &run.published {
        let got = store.get("default", name, ReadOptions { verify_hash: true }).unwrap().map(|b| b.to_vec());
        assert!(got.as_ref() == Some(content), "the store holds {:?} bytes for {name}", got.map(|g| g.len()));
    }
}

#[test]
fn the_mount_matches_the_model_under_random_operations_and_kills() {
    if !fuse_usable() {
        return;
    }
    let ops = std::env::var("KVHOARD_FUSE_MODEL_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    if let Some(seed) = std::env::var("KVHOARD_FUSE_MODEL_SEED").ok().and_then(|v| v.parse().ok()) {
        run_seed(seed, ops);
        return;
    }
    let random = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("mount model: seeds 1 and {random} (KVHOARD_FUSE_MODEL_SEED={random} replays the second)");
    run_seed(1, ops);
    run_seed(random, ops);
}
