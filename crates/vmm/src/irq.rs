//! Interrupts into the guest: MSI routes in KVM's GSI routing table, each fed by an irqfd.

use kvm_bindings::{kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQ_ROUTING_MSI};
use kvm_ioctls::VmFd;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use vmm_sys_util::eventfd::EventFd;

/// GSIs below this belong to the in-kernel PIC and IOAPIC pins.
const FIRST_MSI_GSI: u32 = 24;

/// An MSI message: where the device writes and what.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    pub address: u64,
    pub data: u32,
}

/// What the router asks of KVM (the VM; a stand-in in unit tests).
pub trait IrqSink: Send + Sync {
    fn set_msi_routes(&self, routes: &[(u32, MsiMessage)]) -> Result<(), String>;
    fn register_irqfd(&self, fd: &EventFd, gsi: u32) -> Result<(), String>;
}

impl IrqSink for VmFd {
    fn set_msi_routes(&self, routes: &[(u32, MsiMessage)]) -> Result<(), String> {
        let mut table = KvmIrqRouting::new(0).map_err(|e| format!("routing table: {e:?}"))?;
        for &(gsi, msg) in routes {
            let mut entry = kvm_irq_routing_entry { gsi, type_: KVM_IRQ_ROUTING_MSI, ..Default::default() };
            entry.u.msi.address_lo = msg.address as u32;
            entry.u.msi.address_hi = (msg.address >> 32) as u32;
            entry.u.msi.data = msg.data;
            table.push(entry).map_err(|e| format!("routing table: {e:?}"))?;
        }
        self.set_gsi_routing(&table).map_err(|e| format!("KVM_SET_GSI_ROUTING: {e}"))
    }

    fn register_irqfd(&self, fd: &EventFd, gsi: u32) -> Result<(), String> {
        VmFd::register_irqfd(self, fd, gsi).map_err(|e| format!("KVM_IRQFD gsi {gsi}: {e}"))
    }
}

/// The VM's MSI routes: every device's vectors in one table, as KVM wants it whole; and a
/// count of interrupts delivered, which an idle vCPU can wait on.
pub struct GsiRouter {
    sink: Arc<dyn IrqSink>,
    routes: Mutex<BTreeMap<u32, MsiMessage>>,
    next_gsi: AtomicU32,
    delivered: Mutex<u64>,
    delivery: Condvar,
}

impl GsiRouter {
    pub fn new(sink: Arc<dyn IrqSink>) -> Self {
        GsiRouter {
            sink,
            routes: Mutex::new(BTreeMap::new()),
            next_gsi: AtomicU32::new(FIRST_MSI_GSI),
            delivered: Mutex::new(0),
            delivery: Condvar::new(),
        }
    }

    /// A device wrote an irqfd: wake idle vCPUs.
    pub fn delivered(&self) {
        *self.delivered.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.delivery.notify_all();
    }

    /// Waits until more than `seen` interrupts were delivered, or `timeout`; returns the count.
    pub fn wait_beyond(&self, seen: u64, timeout: Duration) -> u64 {
        let count = self.delivered.lock().unwrap_or_else(|e| e.into_inner());
        let (count, _) =
            self.delivery.wait_timeout_while(count, timeout, |c| *c <= seen).unwrap_or_else(|e| e.into_inner());
        *count
    }

    pub fn delivered_count(&self) -> u64 {
        *self.delivered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh GSI with `fd` as its irqfd: a write to `fd` injects the GSI's MSI.
    pub fn allocate(&self, fd: &EventFd) -> Result<u32, String> {
        let gsi = self.next_gsi.fetch_add(1, Ordering::Relaxed);
        self.set(gsi, MsiMessage::default())?;
        self.sink.register_irqfd(fd, gsi)?;
        Ok(gsi)
    }

    /// Points `gsi` at `msg`.
    pub fn set(&self, gsi: u32, msg: MsiMessage) -> Result<(), String> {
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        if routes.insert(gsi, msg) == Some(msg) {
            return Ok(());
        }
        let table: Vec<_> = routes.iter().map(|(&g, &m)| (g, m)).collect();
        self.sink.set_msi_routes(&table)
    }
}
