//! Stops a vCPU thread that overruns its time: raises the stop flag, then kicks the thread
//! with a signal until it is disarmed, since `KVM_RUN` only returns (EINTR) when signalled.

use crate::vcpu::control::RunControl;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

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
        // SAFETY: pthread_self has no preconditions.
        let target = unsafe { libc::pthread_self() };
        let disarmed = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = disarmed.clone();
        let thread = std::thread::spawn(move || {
            // Unconfined it would still stop the run: only a weaker guard is lost.
            crate::seccomp::confine_or_log(crate::seccomp::ThreadKind::Helper);
            let (lock, cvar) = &*flag;
            let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
            let (mut guard, result) =
                cvar.wait_timeout_while(guard, timeout, |d| !*d).unwrap_or_else(|e| e.into_inner());
            if !result.timed_out() {
                return false;
            }
            control.request_stop();
            while !*guard {
                // SAFETY: the target thread is alive until it disarms us (it joins this thread).
                unsafe { libc::pthread_kill(target, kick_signal()) };
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
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cvar.notify_all();
        self.thread.take().is_some_and(|t| t.join().unwrap_or(false))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}
