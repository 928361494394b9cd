//! The i8042 keyboard controller, as far as a guest without a keyboard needs it: a status
//! register that says "nothing to read, ready for a command", and the CPU reset line
//! (command 0xfe on port 0x64), which Linux's `reboot=k` uses.

use crate::bus::BusDevice;
use crate::control::{GuestStop, RunControl};
use std::sync::Arc;

/// Covers ports 0x60 (data) to 0x64 (status/command).
pub const I8042_LEN: u64 = 5;
const CMD_OFFSET: u64 = 4;
const CMD_RESET_CPU: u8 = 0xfe;

pub struct I8042 {
    control: Arc<RunControl>,
}

impl I8042 {
    pub fn new(control: Arc<RunControl>) -> Self {
        I8042 { control }
    }
}

impl BusDevice for I8042 {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        // Status 0: output buffer empty, input buffer empty. Data reads see 0 too.
        data.fill(0);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if offset == CMD_OFFSET && data.first() == Some(&CMD_RESET_CPU) {
            tracing::info!("guest pulsed the i8042 reset line");
            self.control.guest_stop(GuestStop::Reset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_reset_command_resets() {
        let control = Arc::new(RunControl::default());
        let dev = I8042::new(control.clone());
        dev.write(0, &[0xfe]);
        dev.write(4, &[0xaa]);
        assert_eq!(control.guest_stopped(), None);
        let mut status = [0xffu8];
        dev.read(4, &mut status);
        assert_eq!(status[0] & 0x3, 0, "no data pending, ready for input");
        dev.write(4, &[0xfe]);
        assert_eq!(control.guest_stopped(), Some(GuestStop::Reset));
    }
}
