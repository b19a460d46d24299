//! The FUSE mount, mounted for real: cp/cat/diff, ls, rm, mv as an atomic publish, overwrite,
//! concurrent readers, LMCache's own file layouts (from Python), bad input, and persistence
//! across unmount and reopen. Skips (saying so) without /dev/fuse or root. Every mount is
//! unmounted when its guard drops, also when a test fails.

use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

use kvhoard_engine::ReadOptions;
use kvhoard_tests::block;
use kvhoard_tests::mount::Fixture;

fn sh(cmd: &str, args: &[&Path]) -> std::process::Output {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn errno_of(r: std::io::Result<impl Sized>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

#[test]
fn cp_cat_diff_ls_rm_mv_overwrite_and_persistence() {
    let Some(mut fx) = Fixture::new() else { return };
    let src = fx.dir.path().join("src.bin");
    let bytes = block(1, 3 << 20);
    std::fs::write(&src, &bytes).unwrap();
    sh("cp", &[&src, &fx.path("default/a.bin")]);
    sh("diff", &[&src, &fx.path("default/a.bin")]);
    assert_eq!(sh("cat", &[&fx.path("default/a.bin")]).stdout, bytes);
    // What the mount stored is what the native API reads.
    assert_eq!(&*fx.store().get("default", "a.bin", ReadOptions { verify_hash: true }).unwrap().unwrap(), &bytes[..]);
    let meta = std::fs::metadata(fx.path("default/a.bin")).unwrap();
    assert_eq!(meta.len(), bytes.len() as u64);
    assert!(std::os::unix::fs::MetadataExt::blocks(&meta) * 512 >= bytes.len() as u64);
    let ls = String::from_utf8(sh("ls", &[&fx.path("default")]).stdout).unwrap();
    assert_eq!(ls.trim(), "a.bin");

    // mv tmp → final publishes; the tmp name is gone.
    std::fs::write(fx.path("default/b.tmp"), block(2, 100_000)).unwrap();
    sh("mv", &[&fx.path("default/b.tmp"), &fx.path("default/b")]);
    assert_eq!(std::fs::read(fx.path("default/b")).unwrap(), block(2, 100_000));
    assert!(!fx.path("default/b.tmp").exists());

    // Overwrite (O_TRUNC), then a partial write in place.
    std::fs::write(fx.path("default/b"), b"short").unwrap();
    let b = std::fs::read(fx.path("default/b")).unwrap();
    assert!(b == b"short", "overwrite left {} bytes", b.len());
    let mut f = std::fs::OpenOptions::new().write(true).open(fx.path("default/b")).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(2)).unwrap();
    f.write_all(b"ORT!!").unwrap();
    drop(f);
    assert_eq!(std::fs::read(fx.path("default/b")).unwrap(), b"shORT!!");
    // A write past the end leaves zeros in the gap.
    let mut f = std::fs::OpenOptions::new().write(true).open(fx.path("default/b")).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(9)).unwrap();
    f.write_all(b"X").unwrap();
    drop(f);
    assert_eq!(std::fs::read(fx.path("default/b")).unwrap(), b"shORT!!\0\0X");

    // A reader of a file being replaced keeps the old bytes.
    let mut old = std::fs::File::open(fx.path("default/a.bin")).unwrap();
    std::fs::write(fx.path("default/a.bin"), b"new").unwrap();
    let mut got = Vec::new();
    old.read_to_end(&mut got).unwrap();
    drop(old);
    assert!(got == bytes, "the reader saw {} bytes, not the old block", got.len());
    assert_eq!(std::fs::read(fx.path("default/a.bin")).unwrap(), b"new");

    // Keys with '/' appear as %2F; namespaces are directories.
    fx.store().put("default", "model/x@1", b"slash", &Default::default()).unwrap();
    assert_eq!(std::fs::read(fx.path("default/model%2Fx@1")).unwrap(), b"slash");
    std::fs::create_dir(fx.path("ns2")).unwrap();
    std::fs::write(fx.path("ns2/k"), b"in ns2").unwrap();
    assert_eq!(fx.store().get("ns2", "k", ReadOptions::default()).unwrap().unwrap().to_vec(), b"in ns2");

    // by-hash, stats, xattrs, statfs.
    let hex = blake3::hash(b"in ns2").to_hex().to_string();
    assert_eq!(std::fs::read(fx.path(&format!(".by-hash/{hex}"))).unwrap(), b"in ns2");
    let stats: serde_json::Value = serde_json::from_slice(&std::fs::read(fx.path(".stats")).unwrap()).unwrap();
    assert!(stats["keys"].as_u64().unwrap() >= 3);
    let mut buf = [0u8; 128];
    let c = std::ffi::CString::new(fx.path("ns2/k").as_os_str().as_bytes()).unwrap();
    let name = c"user.kvhoard.hash";
    // SAFETY: valid C strings and a buffer of the length given.
    let n = unsafe { libc::getxattr(c.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(&buf[..n as usize], hex.as_bytes());
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: valid path and a statvfs to fill.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) }, 0);
    // SAFETY: statvfs returned 0 and filled it.
    let st = unsafe { st.assume_init() };
    assert!(st.f_blocks * st.f_frsize >= 400 << 20, "capacity {} blocks of {}", st.f_blocks, st.f_frsize);
    assert!(st.f_bavail > 0, "no block available");

    // rm.
    sh("rm", &[&fx.path("default/b")]);
    assert!(!fx.path("default/b").exists());
    assert!(!fx.store().contains("default", "b").unwrap());

    // Survives unmount, close, reopen and remount.
    fx.remount();
    assert_eq!(std::fs::read(fx.path("default/a.bin")).unwrap(), b"new");
    assert_eq!(std::fs::read(fx.path("ns2/k")).unwrap(), b"in ns2");
}

#[test]
fn concurrent_dd_readers_see_the_whole_block() {
    let Some(fx) = Fixture::new() else { return };
    let bytes = block(9, 32 << 20);
    std::fs::write(fx.path("default/big"), &bytes).unwrap();
    let want = blake3::hash(&bytes);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let out = Command::new("dd")
                    .arg(format!("if={}", fx.path("default/big").display()))
                    .args(["bs=4M", "status=none"])
                    .output()
                    .unwrap();
                assert!(out.status.success());
                assert_eq!(blake3::hash(&out.stdout), want);
            });
        }
    });
}

#[test]
fn bad_input_gets_the_right_errno_and_the_mount_stays_up() {
    let Some(fx) = Fixture::new() else { return };
    let long = "x".repeat(256);
    assert_eq!(errno_of(std::fs::write(fx.path(&format!("default/{long}")), b"x")), libc::ENAMETOOLONG);
    let bad = fx.mnt.join(std::ffi::OsStr::from_bytes(b"default/a\xffb"));
    assert_eq!(errno_of(std::fs::write(&bad, b"x")), libc::EILSEQ);
    assert_eq!(errno_of(std::fs::write(fx.path("default/a%25"), b"x")), libc::EINVAL);
    assert_eq!(errno_of(std::fs::write(fx.path(".by-hash/new"), b"x")), libc::EROFS);
    std::fs::write(fx.path("default/k"), b"x").unwrap();
    assert_eq!(errno_of(std::fs::remove_dir(fx.path("default"))), libc::ENOTEMPTY);
    assert_eq!(errno_of(std::fs::hard_link(fx.path("default/k"), fx.path("default/k2"))), libc::EPERM);
    // Larger than the largest block (a little under a 64 MiB segment).
    let mut f = std::fs::File::create(fx.path("default/huge")).unwrap();
    let chunk = vec![7u8; 8 << 20];
    let mut err = 0;
    for _ in 0..9 {
        if let Err(e) = f.write_all(&chunk) {
            err = e.raw_os_error().unwrap_or(0);
            break;
        }
    }
    assert_eq!(err, libc::EFBIG);
    drop(f);
    // Still serving.
    assert_eq!(std::fs::read(fx.path("default/k")).unwrap(), b"x");
    assert!(!fx.path("default/missing").exists());
}

#[test]
fn lmcache_file_layouts_round_trip_from_python() {
    let Some(fx) = Fixture::new() else { return };
    if Command::new("python3").arg("--version").output().is_err() {
        kvhoard_tests::skip("python", "python3 not found");
        return;
    }
    let script = r#"
import os, struct, sys
root = sys.argv[1]
d = os.path.join(root, "default")
# FSConnector: key with / as -SEP-, 28-byte metadata (int32 length, fmt, dtype, shape[4]) +
# payload, written to <name>.tmp then os.replace'd; lookups are exists checks.
key = "vllm@meta-llama/Llama-3.1-8B@1@0@-3f2a9c@bfloat16".replace("/", "-SEP-")
payload = bytes((i * 7) % 251 for i in range(2 * 1024 * 1024))
meta = struct.pack("<7i", len(payload), 1, 3, 2, 32, 256, 1024)
final = os.path.join(d, key + ".data")
assert not os.path.exists(final)
with open(final + ".tmp", "wb") as f:
    f.write(meta)
    f.write(payload)
os.replace(final + ".tmp", final)
assert os.path.exists(final) and not os.path.exists(final + ".tmp")
with open(final, "rb") as f:
    head = f.read(28)
    rest = f.read()
assert struct.unpack("<7i", head)[0] == len(payload) and rest == payload
# Multiprocess fs adapter: payload only, model(/->-SEP-)@0x<rank>@<group>@<hash>.data, tmp+rename.
name = "meta-llama-SEP-Llama@0x00000001@0@9f86d081884c7d65.data"
p = os.path.join(d, name)
with open(p + ".tmp", "wb") as f:
    f.write(payload[:65536])
os.rename(p + ".tmp", p)
with open(p, "rb") as f:
    assert f.read() == payload[:65536]
names = sorted(os.listdir(d))
assert names == sorted([key + ".data", name]), names
print("ok")
"#;
    let out = Command::new("python3").arg("-c").arg(script).arg(&fx.mnt).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let key = "vllm@meta-llama-SEP-Llama-3.1-8B@1@0@-3f2a9c@bfloat16.data";
    assert_eq!(fx.store().meta("default", key).unwrap().unwrap().raw_len, 28 + (2 << 20));
}
