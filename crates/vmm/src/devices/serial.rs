//! The 8250 UART on COM1 (vm-superio's model), its output sent to a writer.

use crate::bus::BusDevice;
use std::io::Write;
use std::sync::Mutex;
use vm_superio::serial::NoEvents;
use vm_superio::Trigger;

/// Ports the UART occupies.
pub const SERIAL_LEN: u64 = 8;

/// Interrupt line of the UART: not wired yet (the payloads poll), so a no-op.
pub struct NoInterrupt;

impl Trigger for NoInterrupt {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        Ok(())
    }
}

pub struct Serial {
    uart: Mutex<vm_superio::Serial<NoInterrupt, NoEvents, Box<dyn Write + Send>>>,
}

impl Serial {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Serial { uart: Mutex::new(vm_superio::Serial::new(NoInterrupt, out)) }
    }
}

impl BusDevice for Serial {
    // The UART's registers are bytes; a wider access touches consecutive registers.
    fn read(&self, offset: u64, data: &mut [u8]) {
        let mut uart = self.uart.lock().unwrap_or_else(|e| e.into_inner());
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = uart.read(offset as u8 + i as u8);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let mut uart = self.uart.lock().unwrap_or_else(|e| e.into_inner());
        for (i, &byte) in data.iter().enumerate() {
            // Output errors (a closed stdout) must not stop the guest.
            let _ = uart.write(offset as u8 + i as u8, byte);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn bytes_written_to_thr_reach_the_writer() {
        let sink = Sink::default();
        let serial = Serial::new(Box::new(sink.clone()));
        serial.write(0, b"h");
        serial.write(0, b"i");
        let mut lsr = [0u8];
        serial.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0, "transmitter empty");
        assert_eq!(&*sink.0.lock().unwrap(), b"hi");
        // A wide access past the last register stays in bounds.
        let mut wide = [0u8; 4];
        serial.read(7, &mut wide);
    }
}
