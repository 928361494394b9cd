//! The 8250 UART on COM1 (vm-superio's model): output queued for a writer thread (see
//! crate::console), input from a reader (a thread of its own feeds the receive FIFO),
//! interrupts on IRQ 4 through an irqfd.

use crate::bus::BusDevice;
use crate::console::ConsoleOut;
use crate::irq::GsiRouter;
use crate::persist::{Persist, PersistError};
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vm_superio::serial::NoEvents;
use vm_superio::Trigger;
use vmm_sys_util::eventfd::EventFd;

/// Ports the UART occupies.
pub const SERIAL_LEN: u64 = 8;

/// The UART's interrupt line: an irqfd on its GSI (none in unit tests), and the router
/// told of each delivery so an idle vCPU wakes for it as for an MSI.
pub struct IrqLine {
    fd: Option<EventFd>,
    router: Option<Arc<GsiRouter>>,
}

impl IrqLine {
    pub fn new(fd: Option<EventFd>, router: Option<Arc<GsiRouter>>) -> Self {
        IrqLine { fd, router }
    }
}

impl Trigger for IrqLine {
    type E = std::io::Error;
    fn trigger(&self) -> std::io::Result<()> {
        if let Some(fd) = &self.fd {
            fd.write(1)?;
        }
        if let Some(router) = &self.router {
            router.delivered();
        }
        Ok(())
    }
}

pub struct Serial {
    uart: Mutex<vm_superio::Serial<IrqLine, NoEvents, ConsoleOut>>,
}

/// The UART's guest-visible registers and unread input, for a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialRegs {
    pub divisor: [u8; 2],
    pub ier: u8,
    pub lcr: u8,
    pub mcr: u8,
    pub scratch: u8,
    pub input: Vec<u8>,
}

impl crate::persist::DeviceState for SerialRegs {
    const VERSION: u32 = 1;
}

impl Serial {
    /// A UART whose output goes to `out` from a thread of its own.
    pub fn new(out: Box<dyn Write + Send>, irq: IrqLine) -> std::io::Result<Self> {
        Ok(Serial {
            uart: Mutex::new(vm_superio::Serial::new(irq, ConsoleOut::spawn(out, crate::console::PARTIAL_LINE_WAIT)?)),
        })
    }

    pub fn drain_output(&self, timeout: Duration) -> bool {
        crate::sync::lock(&self.uart).writer().drain(timeout)
    }

    /// Feeds what `input` yields into the receive FIFO, on a thread of its own, until it
    /// ends. A full FIFO waits for the guest to read (bytes are never dropped).
    pub fn spawn_input(self: &Arc<Self>, mut input: Box<dyn Read + Send>) -> std::io::Result<()> {
        let serial = Arc::downgrade(self);
        std::thread::Builder::new().name("serial-in".into()).spawn(move || {
            if let Err(e) = crate::seccomp::confine(crate::seccomp::ThreadKind::SerialIn) {
                return tracing::error!("console input off: {e}");
            }
            let mut buf = [0u8; 64];
            while let Ok(n @ 1..) = input.read(&mut buf) {
                let mut pending = &buf[..n];
                while !pending.is_empty() {
                    let Some(serial) = serial.upgrade() else { return };
                    let taken = {
                        let mut uart = crate::sync::lock(&serial.uart);
                        let room = uart.fifo_capacity().min(pending.len());
                        uart.enqueue_raw_bytes(&pending[..room]).unwrap_or(0)
                    };
                    pending = &pending[taken..];
                    if taken == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
        })?;
        Ok(())
    }
}

/// COM1's registers and its unread input.
impl Persist<'_> for Serial {
    type State = SerialRegs;
    type SaveArgs = ();
    type RestoreArgs = ();

    fn save(&self, (): ()) -> Result<SerialRegs, PersistError> {
        let s = crate::sync::lock(&self.uart).state();
        Ok(SerialRegs {
            divisor: [s.baud_divisor_low, s.baud_divisor_high],
            ier: s.interrupt_enable,
            lcr: s.line_control,
            mcr: s.modem_control,
            scratch: s.scratch,
            input: s.in_buffer,
        })
    }

    /// Puts a snapshot's registers back the way a driver sets them (through the register
    /// interface, so every derived bit follows), then its unread input.
    fn restore(&self, (): (), r: &SerialRegs) -> Result<(), PersistError> {
        const DLAB: u8 = 0x80;
        let mut uart = crate::sync::lock(&self.uart);
        let writes = [
            (3, DLAB),
            (0, r.divisor[0]),
            (1, r.divisor[1]),
            (3, r.lcr & !DLAB),
            (1, r.ier),
            (4, r.mcr),
            (7, r.scratch),
            (3, r.lcr),
        ];
        for (offset, value) in writes {
            let _ = uart.write(offset, value);
        }
        let room = r.input.len().min(uart.fifo_capacity());
        let _ = uart.enqueue_raw_bytes(&r.input[..room]);
        Ok(())
    }
}

impl BusDevice for Serial {
    // The UART's registers are bytes; a wider access touches consecutive registers.
    fn read(&self, offset: u64, data: &mut [u8]) {
        let mut uart = crate::sync::lock(&self.uart);
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = uart.read(offset as u8 + i as u8);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let mut uart = crate::sync::lock(&self.uart);
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

    use crate::console::tests::Sink;

    #[test]
    fn bytes_written_to_thr_reach_the_writer() {
        let sink = Sink::default();
        let serial = Serial::new(Box::new(sink.clone()), IrqLine::new(None, None)).unwrap();
        serial.write(0, b"h");
        serial.write(0, b"i");
        let mut lsr = [0u8];
        serial.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0, "transmitter empty");
        assert!(serial.drain_output(Duration::from_secs(10)));
        assert_eq!(&*sink.0.lock().unwrap(), b"hi");
        // A wide access past the last register stays in bounds.
        let mut wide = [0u8; 4];
        serial.read(7, &mut wide);
    }

    #[test]
    fn input_reaches_the_receive_register_and_raises_the_interrupt() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let router = Arc::new(GsiRouter::new(Arc::new(crate::testing::FakeKvm::default())));
        let deliveries = router.count_deliveries();
        let serial = Arc::new(
            Serial::new(Box::new(Sink::default()), IrqLine::new(Some(irq.try_clone().unwrap()), Some(router.clone())))
                .unwrap(),
        );
        serial.write(1, &[1]); // IER: received data available
        serial.spawn_input(Box::new(std::io::Cursor::new(b"ok".to_vec()))).unwrap();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            let mut lsr = [0u8];
            serial.read(5, &mut lsr);
            if lsr[0] & 1 != 0 {
                let mut rbr = [0u8];
                serial.read(0, &mut rbr);
                got.push(rbr[0]);
            } else if got.len() == 2 {
                break;
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert_eq!(got, b"ok");
        assert!(irq.read().unwrap() >= 1, "the guest was interrupted");
        assert!(deliveries.count() >= 1, "an idle vCPU would have woken");
    }
}
