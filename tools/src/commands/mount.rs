//! `kvhoard mount`: serves a volume as a file system until SIGINT or SIGTERM (or `umount`).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kvhoard_engine::{Durability, StoreOptions};
use kvhoard_fuse::MountOptions;

use super::open;

pub fn run(
    volume: &Path,
    mountpoint: &Path,
    threads: usize,
    durability: Durability,
    allow_other: bool,
    opts: StoreOptions,
) -> anyhow::Result<ExitCode> {
    // Checked before the volume is opened, so a bad mount point costs no recovery.
    kvhoard_fuse::check_mountpoint(mountpoint)?;
    // Signals are taken synchronously below; block them before any thread starts so that none
    // of the serving threads is interrupted by them.
    let signals = block_signals();
    let store = Arc::new(open(volume, opts)?);
    let mount_opts = MountOptions { threads, durability, allow_other };
    let mounted = kvhoard_fuse::mount(Arc::clone(&store), mountpoint, &mount_opts)?;
    eprintln!(
        "kvhoard: {} mounted on {} ({threads} threads); Ctrl-C or `umount {}` to stop",
        volume.display(),
        mountpoint.display(),
        mountpoint.display()
    );
    let why = loop {
        if let Some(sig) = wait_signal(&signals, Duration::from_millis(200)) {
            break format!("signal {sig}");
        }
        if mounted.is_finished() {
            break "unmounted".to_string();
        }
    };
    tracing::info!(reason = %why, "stopping");
    mounted.unmount().context("unmounting")?;
    store.close().context("closing the volume")?;
    eprintln!("kvhoard: {} unmounted ({why}), volume closed", mountpoint.display());
    Ok(ExitCode::SUCCESS)
}

fn block_signals() -> libc::sigset_t {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: sigemptyset initialises the set it is given; sigaddset and pthread_sigmask read a
    // valid, initialised set; none of them keeps the pointer.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), libc::SIGINT);
        libc::sigaddset(set.as_mut_ptr(), libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut());
        set.assume_init()
    }
}

fn wait_signal(set: &libc::sigset_t, timeout: Duration) -> Option<i32> {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: set is an initialised signal set, ts a valid timespec; a null siginfo is allowed.
    let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (sig > 0).then_some(sig)
}
