//! How a device or the VMM tells the vCPUs to stop, and with what exit status.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const NO_STATUS: u64 = u64::MAX;

/// Shared by the vCPUs, the devices and the thread that waits for the machine.
pub struct RunControl {
    stop: AtomicBool,
    status: AtomicU64,
}

impl Default for RunControl {
    fn default() -> Self {
        RunControl { stop: AtomicBool::new(false), status: AtomicU64::new(NO_STATUS) }
    }
}

impl RunControl {
    /// The guest asked to exit with `status` (the first request wins).
    pub fn guest_exit(&self, status: u32) {
        let _ = self.status.compare_exchange(NO_STATUS, u64::from(status), Ordering::AcqRel, Ordering::Acquire);
        self.stop.store(true, Ordering::Release);
    }

    /// The VMM wants the vCPUs out (timeout, error on another vCPU).
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    #[inline]
    pub fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub fn exit_status(&self) -> Option<u32> {
        match self.status.load(Ordering::Acquire) {
            NO_STATUS => None,
            s => Some(s as u32),
        }
    }
}
