//! How a device or the VMM tells the vCPUs to stop, and why.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const NO_STATUS: u64 = u64::MAX;
const POWER_OFF: u64 = 1 << 32;
const RESET: u64 = 2 << 32;

/// How the guest ended its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestStop {
    /// It wrote a status to the debug-exit port.
    Exit(u32),
    /// ACPI soft-off (S5).
    PowerOff,
    /// A reset: the i8042 reset line or the ACPI reset register (`reboot`, or a panic with
    /// `panic=N`). There is no firmware to reboot into, so the run ends.
    Reset,
}

impl GuestStop {
    /// The process status `exitless run` exits with.
    pub fn status(self) -> u32 {
        match self {
            GuestStop::Exit(s) => s,
            GuestStop::PowerOff | GuestStop::Reset => 0,
        }
    }

    pub fn describe(self) -> String {
        match self {
            GuestStop::Exit(s) => format!("guest exited with status {s}"),
            GuestStop::PowerOff => "guest powered off".into(),
            GuestStop::Reset => "guest reset (a reboot, or a panic with panic=N)".into(),
        }
    }
}

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
    /// The guest asked to stop (the first request wins).
    pub fn guest_stop(&self, how: GuestStop) {
        let code = match how {
            GuestStop::Exit(s) => u64::from(s),
            GuestStop::PowerOff => POWER_OFF,
            GuestStop::Reset => RESET,
        };
        let _ = self.status.compare_exchange(NO_STATUS, code, Ordering::AcqRel, Ordering::Acquire);
        self.stop.store(true, Ordering::Release);
    }

    /// The guest asked to exit with `status`.
    pub fn guest_exit(&self, status: u32) {
        self.guest_stop(GuestStop::Exit(status));
    }

    /// The VMM wants the vCPUs out (timeout, error on another vCPU).
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    #[inline]
    pub fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    pub fn guest_stopped(&self) -> Option<GuestStop> {
        match self.status.load(Ordering::Acquire) {
            NO_STATUS => None,
            POWER_OFF => Some(GuestStop::PowerOff),
            RESET => Some(GuestStop::Reset),
            s => Some(GuestStop::Exit(s as u32)),
        }
    }

    pub fn exit_status(&self) -> Option<u32> {
        self.guest_stopped().map(GuestStop::status)
    }
}
