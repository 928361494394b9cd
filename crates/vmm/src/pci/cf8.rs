//! PCI configuration mechanism #1: an address latch at 0xCF8 and a data window at
//! 0xCFC-0xCFF. Two exits per config read (the address write, then the data read).

use super::root::PciRoot;
use crate::bus::BusDevice;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

pub const CF8_PORT: u16 = 0xcf8;
/// 0xCF8-0xCFF.
pub const CF8_LEN: u64 = 8;
const ENABLE: u32 = 1 << 31;

/// Holds the root weakly: the root owns the buses this device sits on.
pub struct Cf8Device {
    root: Weak<PciRoot>,
    address: AtomicU32,
}

impl Cf8Device {
    pub fn new(root: &Arc<PciRoot>) -> Self {
        Cf8Device { root: Arc::downgrade(root), address: AtomicU32::new(0) }
    }

    /// Function index and register for a data access at byte `lane` of 0xCFC, or None when
    /// the enable bit is clear or the bus is not bus 0.
    fn target(&self, lane: usize) -> Option<(usize, usize)> {
        let a = self.address.load(Ordering::Acquire);
        if a & ENABLE == 0 || (a >> 16) & 0xff != 0 {
            return None;
        }
        // The latch's low two bits select the byte too, OR'd with the data port's lane, as
        // QEMU does (kvm-unit-tests reads the device ID with 0xCF8 = ...|2, then inw 0xCFC).
        Some((((a >> 8) & 0xff) as usize, (a & 0xff) as usize | lane))
    }
}

impl BusDevice for Cf8Device {
    fn read(&self, offset: u64, data: &mut [u8]) {
        match offset {
            // The latch answers dword accesses only.
            0 if data.len() == 4 => data.copy_from_slice(&(self.address.load(Ordering::Acquire) & !0x3).to_le_bytes()),
            4..=7 => match (self.target(offset as usize - 4), self.root.upgrade()) {
                (Some((index, reg)), Some(root)) => root.config_read(index, reg, data),
                _ => data.fill(0xff),
            },
            _ => data.fill(0xff),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        match offset {
            0 if data.len() == 4 => {
                let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
                self.address.store(v, Ordering::Release);
            }
            4..=7 => {
                if let (Some((index, reg)), Some(root)) = (self.target(offset as usize - 4), self.root.upgrade()) {
                    root.config_write(index, reg, data);
                }
            }
            _ => {}
        }
    }
}
