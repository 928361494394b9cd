//! Kicks: a signal that makes a vCPU leave `KVM_RUN` (its handler sets `immediate_exit`,
//! see [`bind_kicks`]); and the watchdog that stops a vCPU thread overrunning its time by
//! raising the stop flag and kicking it.

use crate::vcpu::control::RunControl;
use kvm_bindings::kvm_run;
use std::cell::Cell;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

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

pub struct Watchdog {
    disarmed: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<bool>>,
}

impl Watchdog {
    /// Arms a watchdog for the calling thread, which must call [`Watchdog::disarm`] when done.
    pub fn arm_for_current_thread(control: Arc<RunControl>, timeout: Duration) -> Watchdog {
        install_kick_handler();
        let target = Pthread::current();
        let disarmed = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = disarmed.clone();
        let thread = std::thread::spawn(move || {
            // Unconfined it would still stop the run: only a weaker guard is lost.
            crate::seccomp::confine_or_log(crate::seccomp::ThreadKind::Helper);
            let (lock, cvar) = &*flag;
            let guard = crate::sync::lock(lock);
            let (mut guard, result) =
                cvar.wait_timeout_while(guard, timeout, |d| !*d).unwrap_or_else(|e| e.into_inner());
            if !result.timed_out() {
                return false;
            }
            control.request_stop();
            while !*guard {
                // SAFETY: the target thread is alive until it disarms us (it joins this thread).
                unsafe { target.kill(kick_signal()) };
                guard = cvar.wait_timeout(guard, Duration::from_millis(10)).unwrap_or_else(|e| e.into_inner()).0;
            }
            true
        });
        Watchdog { disarmed, thread: Some(thread) }
    }

    /// Stops the watchdog; true if it had fired.
    pub fn disarm(mut self) -> bool {
        self.stop()
    }

    fn stop(&mut self) -> bool {
        let (lock, cvar) = &*self.disarmed;
        *crate::sync::lock(lock) = true;
        cvar.notify_all();
        self.thread.take().is_some_and(|t| t.join().unwrap_or(false))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}
