//! Kicks: a signal that makes a vCPU leave `KVM_RUN` (its handler sets `immediate_exit`,
//! see [`bind_kicks`]), sent to a thread named by its [`Pthread`].

use kvm_bindings::kvm_run;
use std::cell::Cell;

pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

/// A thread to signal. glibc's pthread_t is an integer, musl's a pointer; either is an
/// opaque identifier that may be used from any thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pthread(libc::pthread_t);

// SAFETY: a pthread_t only names a thread; the pointer (musl) is never dereferenced here,
// only passed to pthread_kill, which is valid from any thread while the target lives.
unsafe impl Send for Pthread {}

impl Pthread {
    /// The calling thread.
    pub fn current() -> Pthread {
        // SAFETY: pthread_self has no preconditions.
        Pthread(unsafe { libc::pthread_self() })
    }

    /// Sends `signal`.
    ///
    /// # Safety
    /// The thread must not have ended: a pthread_t of a joined or detached-and-exited
    /// thread may name freed memory (musl) or another thread.
    pub unsafe fn kill(self, signal: libc::c_int) {
        // SAFETY: the caller guarantees the thread is alive.
        unsafe { libc::pthread_kill(self.0, signal) };
    }
}

thread_local! {
    /// The `kvm_run` page of the vCPU this thread runs, if any: where a kick sets
    /// `immediate_exit`. Const-initialized, so the signal handler reads it without any
    /// lazy initialization.
    static KICK_TARGET: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

/// Makes kicks of the calling thread set `immediate_exit` in `run` (its vCPU's page), so
/// a kick that lands outside `KVM_RUN` still makes the next `KVM_RUN` return at once: one
/// signal is enough, as in Firecracker. Null unbinds.
pub fn bind_kicks(run: *mut kvm_run) {
    KICK_TARGET.with(|t| t.set(run));
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let run = KICK_TARGET.with(Cell::get);
    if !run.is_null() {
        // SAFETY: a bound page belongs to the vCPU this thread runs, which unbinds it
        // before the vCPU (and its mapping) goes away; a volatile byte store is
        // async-signal-safe.
        unsafe { std::ptr::addr_of_mut!((*run).immediate_exit).write_volatile(1) };
    }
}

/// Installs the no-op handler that lets the kick signal interrupt `KVM_RUN`.
pub fn install_kick_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Err(e) = vmm_sys_util::signal::register_signal_handler(kick_signal(), on_kick) {
            tracing::warn!("cannot install the vCPU kick handler: {e}");
        }
    });
}
