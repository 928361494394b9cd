//! The one thing a device may tell the vCPUs: the guest powered off, reset, or went to
//! sleep. Devices hold this handle, not the run control behind it (as Firecracker's and
//! Cloud Hypervisor's hold an event fd), so none can pause, stop or kick vCPUs otherwise.

use super::kick::kick_signal;
use super::{GuestStop, RunControl};
use std::sync::Arc;

#[derive(Clone)]
pub struct PowerEvents(Arc<RunControl>);

impl PowerEvents {
    pub fn new(control: Arc<RunControl>) -> Self {
        PowerEvents(control)
    }

    /// ACPI soft-off (S5): the run ends.
    pub fn power_off(&self) {
        self.0.guest_stop(GuestStop::PowerOff);
    }

    /// The reset line (i8042 or the ACPI reset register): the run ends.
    pub fn reset(&self) {
        self.0.guest_stop(GuestStop::Reset);
    }

    /// The guest wrote its exit status (the debug-exit port): the run ends with it.
    pub fn exit(&self, status: u32) {
        self.0.guest_exit(status);
    }

    /// ACPI S3: every vCPU leaves the guest and parks until a wake event.
    pub fn sleep(&self) {
        self.0.suspend(kick_signal());
    }
}
