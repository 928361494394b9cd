//! The debug-exit port (like QEMU's isa-debug-exit): a write ends the run, the value
//! written becomes the exit status.

use crate::bus::BusDevice;
use crate::run_control::PowerEvents;

/// Ports the device occupies from its base.
pub const DEBUG_EXIT_LEN: u64 = 4;

pub struct DebugExit {
    power: PowerEvents,
}

impl DebugExit {
    pub fn new(power: PowerEvents) -> Self {
        DebugExit { power }
    }
}

impl BusDevice for DebugExit {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if offset != 0 {
            return;
        }
        // The low 4 bytes of what was written.
        self.power.exit(crate::bus::written_value(data) as u32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_control::RunControl;
    use std::sync::Arc;

    #[test]
    fn a_write_at_offset_zero_sets_the_status() {
        let control = Arc::new(RunControl::default());
        let dev = DebugExit::new(PowerEvents::new(control.clone()));
        dev.write(1, &[9]);
        assert!(!control.should_stop());
        dev.write(0, &[7, 1]);
        assert!(control.should_stop());
        assert_eq!(control.exit_status(), Some(0x107));
        dev.write(0, &[3]);
        assert_eq!(control.exit_status(), Some(0x107), "the first exit request wins");
    }
}
