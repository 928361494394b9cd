//! A deadline on a backend's replies. The `vhost` crate retries a receive that times out
//! (SO_RCVTIMEO's EAGAIN is its "retry"), so a backend that never answers would hold the
//! caller for good: instead a watchdog thread shuts the socket down once a request has
//! waited [`super::REPLY_TIMEOUT`], and the receive ends as a disconnection. A backend
//! reconnected is watched by the same thread (the device's thread may not make threads).

use crate::sync::lock;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

struct Armed {
    until: Option<Instant>,
    quit: bool,
    socket: OwnedFd,
}

struct Shared {
    armed: Mutex<Armed>,
    wake: Condvar,
    fired: AtomicBool,
}

/// The watchdog of one socket; ended when dropped.
pub struct Deadline {
    shared: Arc<Shared>,
    limit: Duration,
}

impl Deadline {
    /// Watches `socket` (a duplicate of the backend's), each request given `limit`.
    pub fn new(socket: OwnedFd, limit: Duration) -> std::io::Result<Deadline> {
        let armed = Mutex::new(Armed { until: None, quit: false, socket });
        let shared = Arc::new(Shared { armed, wake: Condvar::new(), fired: AtomicBool::new(false) });
        let watched = shared.clone();
        std::thread::Builder::new().name("vhost-user-deadline".into()).spawn(move || {
            crate::seccomp::confine_or_log(crate::seccomp::ThreadKind::VhostUser);
            watch(&watched)
        })?;
        Ok(Deadline { shared, limit })
    }

    /// Watches `socket` (a reconnected backend's) from now on, the old one let go.
    pub fn rewatch(&self, socket: OwnedFd) {
        let mut armed = lock(&self.shared.armed);
        armed.socket = socket;
        armed.until = None;
        self.shared.fired.store(false, Ordering::Release);
    }

    /// Runs `request` with the deadline armed; Err(()) if the deadline shut the socket.
    pub fn run<T>(&self, request: impl FnOnce() -> T) -> Result<T, ()> {
        if self.shared.fired.load(Ordering::Acquire) {
            return Err(());
        }
        lock(&self.shared.armed).until = Some(Instant::now() + self.limit);
        self.shared.wake.notify_one();
        let done = request();
        lock(&self.shared.armed).until = None;
        match self.shared.fired.load(Ordering::Acquire) {
            true => Err(()),
            false => Ok(done),
        }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        lock(&self.shared.armed).quit = true;
        self.shared.wake.notify_one();
    }
}

fn watch(shared: &Shared) {
    let mut armed = lock(&shared.armed);
    while !armed.quit {
        armed = match armed.until {
            None => shared.wake.wait(armed).unwrap_or_else(|e| e.into_inner()),
            Some(until) if Instant::now() >= until => {
                shared.fired.store(true, Ordering::Release);
                // SAFETY: shutting down a socket this thread owns a duplicate of; the
                // request waiting on it returns.
                unsafe { libc::shutdown(armed.socket.as_raw_fd(), libc::SHUT_RDWR) };
                armed.until = None;
                armed
            }
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                shared.wake.wait_timeout(armed, left).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0)
            }
        };
    }
}
