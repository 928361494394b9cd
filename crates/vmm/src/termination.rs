//! Cleaning up when the process is told to end: SIGINT, SIGTERM and SIGHUP are blocked in
//! every thread and taken by one thread of their own, which runs each registered cleanup
//! (remove an API socket, delete a network namespace, flush metrics) and then ends the
//! process as the signal would have: killed by it, as Firecracker is by SIGINT and SIGTERM
//! (it has no handler for them), or with the code [`exit_with`] set (Firecracker's SIGHUP
//! handler exits 156). SIGKILL cannot be caught: each user also removes what a killed run
//! left behind when it next starts.

use std::sync::{Mutex, Once};

/// A cleanup, told which signal ends the process.
type Cleanup = Box<dyn Fn(i32) + Send>;

static CLEANUPS: Mutex<Vec<(u64, Cleanup)>> = Mutex::new(Vec::new());
/// Signals after which the process exits with a code instead of dying by them.
static EXIT_CODES: Mutex<Vec<(i32, i32)>> = Mutex::new(Vec::new());
static WATCH: Once = Once::new();

/// A registered cleanup; dropping it unregisters it (the thing was cleaned up normally).
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        crate::sync::lock(&CLEANUPS).retain(|(id, _)| *id != self.0);
    }
}

/// Runs `cleanup` if a termination signal ends the process while the registration lives.
/// The first call blocks the signals in the calling thread (threads it starts later
/// inherit that): call it before starting threads.
pub fn on_signal(cleanup: impl Fn(i32) + Send + 'static) -> Registration {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    watch();
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    crate::sync::lock(&CLEANUPS).push((id, Box::new(cleanup)));
    Registration(id)
}

/// Blocks the termination signals in the calling thread (and so in every thread it starts
/// later) and starts the thread that takes them. [`on_signal`] does it too; call this first
/// where threads start before the first cleanup is known.
pub fn watch() {
    WATCH.call_once(|| {
        // SAFETY: a sigset on our stack, filled by sigemptyset/sigaddset, then applied to
        // this thread's mask only.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, sig);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            set
        };
        let _ = std::thread::Builder::new().name("signals".into()).spawn(move || {
            crate::seccomp::confine_or_log(crate::seccomp::ThreadKind::Signals);
            let mut sig = 0;
            // SAFETY: waits for one of the blocked signals in `set`.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                for (_, cleanup) in crate::sync::lock(&CLEANUPS).drain(..) {
                    cleanup(sig);
                }
                match crate::sync::lock(&EXIT_CODES).iter().find(|(s, _)| *s == sig) {
                    Some(&(_, code)) => std::process::exit(code),
                    None => die_by(sig),
                }
            }
        });
    });
}

/// After `sig`'s cleanups the process exits with `code` instead of dying by the signal.
pub fn exit_with(sig: i32, code: i32) {
    crate::sync::lock(&EXIT_CODES).push((sig, code));
}

/// Ends the process by `sig` with its default action, so a parent's wait sees it killed
/// by that signal.
fn die_by(sig: i32) -> ! {
    // SAFETY: the default action for `sig`, then `sig` unblocked in this thread (the only
    // one with it unblocked) and sent to it: the process ends by it.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
    // Not reached; had it been, a shell would report the same.
    std::process::exit(128 + sig)
}
