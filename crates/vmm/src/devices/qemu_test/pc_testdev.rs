//! QEMU's ISA test device (`-device pc-testdev`), as kvm-unit-tests uses it: a 32-bit
//! scratch register at ports 0xe0 (any width) and 0xe8 (byte lanes), a page-flush port at
//! 0xe4 (accepted and ignored: it only exists to make QEMU drop a mapping), one port per
//! ISA interrupt line at 0x2000 (a write sets the line's level), and 64 KiB of scratch
//! "I/O memory" at 0xff000000 that traps on every access.

use crate::bus::BusDevice;
use crate::irq::IrqLevel;
use std::sync::Mutex;

pub const SCRATCH_PORT: u16 = 0xe0;
/// 0xe0-0xe3 scratch, 0xe4-0xe7 flush, 0xe8-0xeb scratch by bytes.
pub const PORTS_LEN: u64 = 12;
pub const IRQ_PORT: u16 = 0x2000;
pub const IRQ_LINES: u64 = 24;
pub const IOMEM_LEN: u64 = 0x1_0000;

/// The scratch and flush ports.
#[derive(Default)]
pub struct PcTestdevPorts {
    scratch: Mutex<u32>,
}

impl BusDevice for PcTestdevPorts {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let value = crate::sync::lock(&self.scratch).to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            let at = offset as usize + i;
            *b = if (4..8).contains(&at) { 0 } else { value[at % 4] };
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let mut scratch = crate::sync::lock(&self.scratch);
        let mut value = scratch.to_le_bytes();
        for (i, &b) in data.iter().enumerate() {
            let at = offset as usize + i;
            if !(4..8).contains(&at) {
                value[at % 4] = b;
            }
        }
        *scratch = u32::from_le_bytes(value);
    }
}

/// The interrupt-line ports: a byte written at 0x2000 + n sets ISA line n high (non-zero)
/// or low.
pub struct PcTestdevIrq(pub std::sync::Arc<dyn IrqLevel>);

impl BusDevice for PcTestdevIrq {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if let (1, Some(&level)) = (data.len(), data.first()) {
            self.0.set_level(offset as u32, level != 0);
        }
    }
}

/// The 64 KiB of trapping scratch memory.
pub struct PcTestdevIomem(Mutex<Vec<u8>>);

impl Default for PcTestdevIomem {
    fn default() -> Self {
        PcTestdevIomem(Mutex::new(vec![0; IOMEM_LEN as usize]))
    }
}

impl BusDevice for PcTestdevIomem {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let mem = crate::sync::lock(&self.0);
        for (i, b) in data.iter_mut().enumerate() {
            *b = mem.get(offset as usize + i).copied().unwrap_or(0);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let mut mem = crate::sync::lock(&self.0);
        for (i, &b) in data.iter().enumerate() {
            if let Some(slot) = mem.get_mut(offset as usize + i) {
                *slot = b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_scratch_register_reads_back_through_both_windows() {
        let p = PcTestdevPorts::default();
        p.write(0, &0x1234_5678u32.to_le_bytes());
        let mut b = [0u8; 1];
        p.read(8 + 2, &mut b);
        assert_eq!(b, [0x34]);
        p.write(8 + 3, &[0xab]);
        let mut w = [0u8; 4];
        p.read(0, &mut w);
        assert_eq!(u32::from_le_bytes(w), 0xab34_5678);
        p.write(4, &[0xff; 4]); // the flush port changes nothing
        p.read(0, &mut w);
        assert_eq!(u32::from_le_bytes(w), 0xab34_5678);
    }

    #[test]
    fn irq_ports_set_levels_and_iomem_is_memory() {
        let lines = Arc::new(crate::testing::FakeKvm::default());
        let irq = PcTestdevIrq(lines.clone());
        irq.write(10, &[1]);
        irq.write(10, &[0]);
        irq.write(3, &[1, 1]); // not a byte write: ignored
        assert_eq!(*lines.lines.lock().unwrap(), [(10, true), (10, false)]);
        let io = PcTestdevIomem::default();
        io.write(IOMEM_LEN - 2, &[1, 2, 3, 4]); // the part past the end is dropped
        let mut b = [0u8; 4];
        io.read(IOMEM_LEN - 2, &mut b);
        assert_eq!(b, [1, 2, 0, 0]);
    }
}
