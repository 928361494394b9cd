//! The watchdog that stops a vCPU thread overrunning its time by raising the stop flag
//! and kicking it.

use crate::run_control::kick::{install_kick_handler, kick_signal, Pthread};
use crate::run_control::RunControl;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

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
