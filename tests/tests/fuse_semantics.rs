//! What a mounted volume promises about files being written, renamed and replaced, each found
//! broken once and kept here (docs/fuse.md, "Files being written"):
//!
//! - a file is published whole or not at all: no other process's open, read, or close (of a
//!   descriptor it inherited) stores a writer's unfinished content;
//! - writes through a renamed path land on its new name, whatever inodes the kernel forgot;
//! - a completed rename is visible at once under its new name;
//! - the writing process sees its own writes by name (stat after ftruncate), other processes the
//!   published version; times cannot be set; files cannot be made at the mount's root.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::process::Command;

use kvhoard_engine::ReadOptions;
use kvhoard_tests::mount::Fixture;

fn stored(fx: &Fixture, key: &str) -> Option<Vec<u8>> {
    fx.store().get("default", key, ReadOptions::default()).unwrap().map(|b| b.to_vec())
}

/// What another process sees of `path`: its size by stat and the bytes it reads.
fn seen_by_another_process(path: &std::path::Path) -> (u64, usize) {
    let out =
        Command::new("sh").arg("-c").arg("stat -c %s \"$1\"; wc -c < \"$1\"").arg("sh").arg(path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines().map(|l| l.trim().parse::<u64>().unwrap());
    (lines.next().unwrap(), lines.next().unwrap() as usize)
}

#[test]
fn no_other_process_publishes_a_half_written_file() {
    let Some(fx) = Fixture::new() else { return };
    std::fs::write(fx.path("default/part"), vec![b'p'; 3000]).unwrap();
    let puts = fx.store().stats().puts;
    let mut writer = std::fs::OpenOptions::new().write(true).truncate(true).open(fx.path("default/part")).unwrap();
    writer.write_all(&[b'w'; 7777]).unwrap();
    // Another process (spawned from here: it also closes, at exec, its copy of the writer's
    // descriptor) stats and reads the file: it sees the published version.
    assert_eq!(seen_by_another_process(&fx.path("default/part")), (3000, 3000));
    assert_eq!(stored(&fx, "part").unwrap(), vec![b'p'; 3000], "a half-written file was published");
    assert_eq!(fx.store().stats().puts, puts, "something stored the writer's content");
    // The writer sees its own content by name.
    assert_eq!(std::fs::metadata(fx.path("default/part")).unwrap().len(), 7777);
    drop(writer);
    assert_eq!(stored(&fx, "part").unwrap(), vec![b'w'; 7777]);
    assert_eq!(seen_by_another_process(&fx.path("default/part")), (7777, 7777));
}

/// A process that opens a file on one thread and writes and closes it on another (a thread pool,
/// as LMCache's fs:// connector does through aiofiles) publishes it at its close, so a rename
/// right after finds it.
#[test]
fn a_file_written_by_several_threads_of_one_process_is_published_at_its_close() {
    let Some(fx) = Fixture::new() else { return };
    let tmp = fx.path("default/chunk.tmp");
    for round in 0..20u8 {
        let f = std::fs::File::create(&tmp).unwrap();
        std::thread::spawn(move || {
            let mut f = f;
            f.write_all(&[round; 5000]).unwrap();
            drop(f);
        })
        .join()
        .unwrap();
        std::fs::rename(&tmp, fx.path("default/chunk.data")).unwrap();
        assert_eq!(std::fs::read(fx.path("default/chunk.data")).unwrap(), vec![round; 5000]);
    }
}

#[test]
fn writes_through_a_renamed_path_land_on_the_new_name() {
    let Some(fx) = Fixture::new() else { return };
    let p = |n: &str| fx.path(&format!("default/{n}"));
    std::fs::write(p("a.tmp"), b"first").unwrap();
    std::fs::rename(p("a.tmp"), p("a")).unwrap();
    std::fs::write(p("a.tmp"), b"0123456789").unwrap();
    std::fs::rename(p("a.tmp"), p("a")).unwrap();
    std::fs::rename(p("a"), p("b")).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(p("b")).unwrap();
    f.write_all_at(b"XX", 2).unwrap();
    drop(f);
    assert_eq!(std::fs::read(p("b")).unwrap(), b"01XX456789");
    assert_eq!(stored(&fx, "b").unwrap(), b"01XX456789");
    assert_eq!(stored(&fx, "a"), None, "the write landed on the old name");
    let listed = fx.store().list("default", None, 10).unwrap().entries.into_iter().map(|e| e.key).collect::<Vec<_>>();
    assert_eq!(listed, ["b"]);
}

#[test]
fn a_renamed_file_is_at_once_visible_under_its_new_name() {
    let Some(fx) = Fixture::new() else { return };
    let p = |n: &str| fx.path(&format!("default/{n}"));
    for round in 0..2u8 {
        std::fs::write(p("b.tmp"), [round; 10]).unwrap();
        std::fs::rename(p("b.tmp"), p("b")).unwrap();
    }
    std::fs::rename(p("b"), p("c")).unwrap();
    assert_eq!(std::fs::metadata(p("c")).unwrap().len(), 10, "the new name is missing");
    assert!(std::fs::metadata(p("b")).is_err());
    assert_eq!(std::fs::read(p("c")).unwrap(), [1u8; 10]);
}

#[test]
fn the_writing_process_sees_a_truncation_at_once() {
    let Some(fx) = Fixture::new() else { return };
    let path = fx.path("default/t");
    std::fs::write(&path, vec![1u8; 5000]).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(100).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 100, "fstat after ftruncate");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 100, "stat by name after ftruncate");
    assert_eq!(seen_by_another_process(&path), (5000, 5000), "another process saw an unpublished size");
    drop(f);
    assert_eq!(stored(&fx, "t").unwrap(), vec![1u8; 100]);
}

#[test]
fn a_file_deleted_while_written_stays_deleted() {
    let Some(fx) = Fixture::new() else { return };
    let path = fx.path("default/gone");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(b"half").unwrap();
    std::fs::remove_file(&path).unwrap();
    drop(f);
    assert_eq!(stored(&fx, "gone"), None, "closing a deleted file brought it back");
    assert!(std::fs::metadata(&path).is_err());
}

#[test]
fn times_cannot_be_set_and_files_cannot_be_made_at_the_root() {
    let Some(fx) = Fixture::new() else { return };
    let path = fx.path("default/k");
    std::fs::write(&path, b"x").unwrap();
    let err = std::fs::File::options().write(true).open(&path).unwrap();
    drop(err);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // The kernel sends a file's release after close returns: until the mount has it, this
    // process is still a writer of the file, whose "set the time to now" is accepted. So the
    // refusal is awaited, for at most two seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let (rc, errno) = loop {
        // SAFETY: a valid C string; NULL times mean "now".
        let rc = unsafe { libc::utimes(c.as_ptr(), std::ptr::null()) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        if rc == -1 || std::time::Instant::now() > deadline {
            break (rc, errno);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(rc, -1, "utime on a stored file pretended to work");
    assert_eq!(errno, Some(libc::EPERM));
    let made = std::fs::write(fx.path("at-root"), b"x");
    assert_eq!(made.err().and_then(|e| e.raw_os_error()), Some(libc::EPERM));
    // `touch` of a new file works: its time is when it is stored.
    let out = Command::new("touch").arg(fx.path("default/new")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stored(&fx, "new").unwrap(), b"");
}
