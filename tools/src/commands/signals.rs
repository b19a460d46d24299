//! SIGINT and SIGTERM (and, for a server with something to reload, SIGHUP) taken synchronously,
//! for the commands that serve until told to stop.
//!
//! The signals are blocked before any serving thread starts (so none of them is interrupted) and
//! then waited for with a timeout, which lets the caller also watch for other reasons to stop.
//! SIGHUP is only blocked by a command that reloads on it: elsewhere it keeps its default action.

use std::time::Duration;

/// The signal that asks a server to read its configuration again.
pub const RELOAD: i32 = libc::SIGHUP;

/// Blocks SIGINT and SIGTERM in this thread and in every thread it starts afterwards; returns
/// the set to wait on.
pub fn block_signals() -> libc::sigset_t {
    block(&[libc::SIGINT, libc::SIGTERM])
}

/// As [`block_signals`], and also [`RELOAD`] (SIGHUP), which [`wait_signal`] then returns
/// like the others: the caller reloads instead of stopping.
pub fn block_signals_and_reload() -> libc::sigset_t {
    block(&[libc::SIGINT, libc::SIGTERM, RELOAD])
}

fn block(signals: &[libc::c_int]) -> libc::sigset_t {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: sigemptyset initialises the set it is given; sigaddset and pthread_sigmask read a
    // valid, initialised set; none of them keeps the pointer.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for &sig in signals {
            libc::sigaddset(set.as_mut_ptr(), sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut());
        set.assume_init()
    }
}

/// Waits up to `timeout` for one of the signals in `set`; returns the signal if one came.
pub fn wait_signal(set: &libc::sigset_t, timeout: Duration) -> Option<i32> {
    let ts =
        libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: set is an initialised signal set, ts a valid timespec; a null siginfo is allowed.
    let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (sig > 0).then_some(sig)
}
