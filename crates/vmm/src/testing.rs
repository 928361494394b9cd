//! Stand-ins for KVM in unit tests: they record what would have been asked of it.

use crate::ioeventfd::{IoeventfdKey, IoeventfdSink};
use crate::irq::{IrqError, IrqSink, MsiMessage, Route};
use crate::pci::ecam::MemslotSink;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use vmm_sys_util::eventfd::EventFd;

impl FakeKvm {
    /// The MSI routes of the last routing table.
    pub fn msi_routes(&self) -> Vec<(u32, MsiMessage)> {
        let routes = self.routes.lock().unwrap();
        routes.iter().filter_map(|&(g, r)| if let Route::Msi(m) = r { Some((g, m)) } else { None }).collect()
    }
}

#[derive(Default)]
pub struct FakeKvm {
    /// Every KVM_IOEVENTFD call: key and whether it assigned.
    pub ioeventfds: Mutex<Vec<(IoeventfdKey, bool)>>,
    /// Live read-only slots: (slot, gpa, size).
    pub slots: Mutex<Vec<(u32, u64, u64)>>,
    /// The last GSI routing table set.
    pub routes: Mutex<Vec<(u32, Route)>>,
    /// How many routing tables were set.
    pub route_updates: AtomicU64,
    /// GSIs with an irqfd.
    pub irqfds: Mutex<Vec<u32>>,
}

impl IrqSink for FakeKvm {
    fn set_routes(&self, routes: &[(u32, Route)]) -> Result<(), IrqError> {
        *self.routes.lock().unwrap() = routes.to_vec();
        self.route_updates.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn register_irqfd(&self, _fd: &EventFd, gsi: u32) -> Result<(), IrqError> {
        self.irqfds.lock().unwrap().push(gsi);
        Ok(())
    }
}

impl IoeventfdSink for FakeKvm {
    fn ioeventfd(&self, key: &IoeventfdKey, _: &EventFd, assign: bool) -> Result<(), i32> {
        self.ioeventfds.lock().unwrap().push((*key, assign));
        Ok(())
    }
}

impl MemslotSink for FakeKvm {
    fn set_readonly_slot(&self, slot: u32, gpa: u64, size: u64, _host: u64) -> Result<(), String> {
        let mut slots = self.slots.lock().unwrap();
        slots.retain(|s| s.0 != slot);
        if size > 0 {
            slots.push((slot, gpa, size));
        }
        Ok(())
    }
}
