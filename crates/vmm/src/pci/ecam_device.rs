//! The ECAM window's bus device: every access that exits (all writes, and reads while the
//! window is trapped) goes to the PCI root's config space.

use super::config::CONFIG_SIZE;
use super::root::PciRoot;
use crate::bus::BusDevice;
use std::sync::{Arc, Weak};

/// Serves ECAM accesses that exit: all writes, and reads when the window is trapped.
/// Holds the root weakly: the root owns the buses this device sits on.
pub struct EcamDevice {
    root: Weak<PciRoot>,
}

impl EcamDevice {
    pub fn new(root: &Arc<PciRoot>) -> Self {
        EcamDevice { root: Arc::downgrade(root) }
    }

    /// Function and register of an access, or None when it crosses a function's page.
    fn decode(offset: u64, len: usize) -> Option<(usize, usize)> {
        let (index, reg) = ((offset as usize) / CONFIG_SIZE, (offset as usize) % CONFIG_SIZE);
        (reg + len <= CONFIG_SIZE).then_some((index, reg))
    }
}

impl BusDevice for EcamDevice {
    fn read(&self, offset: u64, data: &mut [u8]) {
        match (Self::decode(offset, data.len()), self.root.upgrade()) {
            (Some((index, reg)), Some(root)) => root.config_read(index, reg, data),
            _ => data.fill(0xff),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if let (Some((index, reg)), Some(root)) = (Self::decode(offset, data.len()), self.root.upgrade()) {
            root.config_write(index, reg, data);
        }
    }
}
