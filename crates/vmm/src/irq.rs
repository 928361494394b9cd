//! Interrupts into the guest: KVM's GSI routing table (the legacy IRQ-chip pins, then one
//! MSI route per device vector), each MSI fed by an irqfd.

use kvm_bindings::{
    kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
    KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::VmFd;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;
use vm_allocator::IdAllocator;
use vmm_sys_util::eventfd::EventFd;

/// GSIs below this belong to the in-kernel PIC and IOAPIC pins.
const FIRST_MSI_GSI: u32 = 24;
/// ISA interrupts, which reach both the PIC and the IOAPIC.
const ISA_IRQS: u32 = 16;

/// An MSI message: where the device writes and what.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    pub address: u64,
    pub data: u32,
}

/// Where a GSI goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// A pin of an in-kernel interrupt controller (KVM_IRQCHIP_*).
    Irqchip {
        chip: u32,
        pin: u32,
    },
    Msi(MsiMessage),
}

/// KVM's default routes for the legacy pins, which any KVM_SET_GSI_ROUTING replaces and so
/// must repeat: GSI n is IOAPIC pin n, and ISA IRQs 0-15 also reach the PIC pair.
pub fn irqchip_routes() -> Vec<(u32, Route)> {
    let mut routes = Vec::new();
    for gsi in 0..FIRST_MSI_GSI {
        if gsi < ISA_IRQS {
            let chip = if gsi < 8 { KVM_IRQCHIP_PIC_MASTER } else { KVM_IRQCHIP_PIC_SLAVE };
            routes.push((gsi, Route::Irqchip { chip, pin: gsi % 8 }));
        }
        routes.push((gsi, Route::Irqchip { chip: KVM_IRQCHIP_IOAPIC, pin: gsi }));
    }
    routes
}

/// The last GSI KVM routes (KVM_MAX_IRQ_ROUTES is 4096; this leaves room to spare).
const LAST_GSI: u32 = 1023;

#[derive(Debug, thiserror::Error)]
pub enum IrqError {
    #[error("KVM_SET_GSI_ROUTING failed")]
    Routing(#[source] kvm_ioctls::Error),
    #[error("the GSI routing table is full")]
    TableFull,
    #[error("KVM_IRQFD for GSI {gsi} failed")]
    Irqfd {
        gsi: u32,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("no GSI left for another interrupt (GSIs {FIRST_MSI_GSI}-{LAST_GSI})")]
    NoGsi(#[source] vm_allocator::Error),
    #[error("cannot create an irqfd")]
    Eventfd(#[source] std::io::Error),
}

/// What the router asks of KVM (the VM; a stand-in in unit tests).
pub trait IrqSink: Send + Sync {
    /// Replaces the whole GSI routing table.
    fn set_routes(&self, routes: &[(u32, Route)]) -> Result<(), IrqError>;
    fn register_irqfd(&self, fd: &EventFd, gsi: u32) -> Result<(), IrqError>;
}

/// Sets a legacy interrupt line's level (KVM_IRQ_LINE on the VM): an ISA line, an IOAPIC
/// pin, a PCI device's INTx.
pub trait IrqLevel: Send + Sync {
    fn set_level(&self, irq: u32, level: bool);
}

impl IrqLevel for VmFd {
    fn set_level(&self, irq: u32, level: bool) {
        if let Err(e) = self.set_irq_line(irq, level) {
            tracing::warn!("KVM_IRQ_LINE {irq}: {e}");
        }
    }
}

impl IrqSink for VmFd {
    fn set_routes(&self, routes: &[(u32, Route)]) -> Result<(), IrqError> {
        let mut table = KvmIrqRouting::new(0).map_err(|_| IrqError::TableFull)?;
        for &(gsi, route) in routes {
            let mut entry = kvm_irq_routing_entry { gsi, ..Default::default() };
            match route {
                Route::Irqchip { chip, pin } => {
                    entry.type_ = KVM_IRQ_ROUTING_IRQCHIP;
                    entry.u.irqchip.irqchip = chip;
                    entry.u.irqchip.pin = pin;
                }
                Route::Msi(msg) => {
                    entry.type_ = KVM_IRQ_ROUTING_MSI;
                    entry.u.msi.address_lo = msg.address as u32;
                    entry.u.msi.address_hi = (msg.address >> 32) as u32;
                    entry.u.msi.data = msg.data;
                }
            }
            table.push(entry).map_err(|_| IrqError::TableFull)?;
        }
        self.set_gsi_routing(&table).map_err(IrqError::Routing)
    }

    fn register_irqfd(&self, fd: &EventFd, gsi: u32) -> Result<(), IrqError> {
        VmFd::register_irqfd(self, fd, gsi).map_err(|source| IrqError::Irqfd { gsi, source })
    }
}

/// Interrupts delivered, for a vCPU that waits for the next one instead of halting (the
/// lab's idle port). Counted only once something asked to wait
/// ([`GsiRouter::count_deliveries`]): a VM without a waiter pays one atomic load per MSI.
#[derive(Default)]
pub struct Deliveries {
    count: AtomicU64,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    delivery: Condvar,
}

impl Deliveries {
    fn bump(&self) {
        self.count.fetch_add(1, Ordering::AcqRel);
        if self.waiters.load(Ordering::Acquire) > 0 {
            // Taking the lock orders this wake-up after a waiter's check of the count.
            drop(crate::sync::lock(&self.lock));
            self.delivery.notify_all();
        }
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Waits until more than `seen` interrupts were delivered, or `timeout`; returns the
    /// count, and whether the timeout (not an interrupt) ended the wait.
    pub fn wait_beyond(&self, seen: u64, timeout: Duration) -> (u64, bool) {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        let guard = crate::sync::lock(&self.lock);
        let waited = self.delivery.wait_timeout_while(guard, timeout, |_| self.count.load(Ordering::Acquire) <= seen);
        let timed_out = waited.map_or_else(|e| e.into_inner().1, |(_, r)| r).timed_out();
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        (self.count(), timed_out)
    }
}

/// The VM's MSI routes: every device's vectors in one table, as KVM wants it whole.
pub struct GsiRouter {
    sink: Arc<dyn IrqSink>,
    routes: Mutex<BTreeMap<u32, MsiMessage>>,
    gsis: Mutex<IdAllocator>,
    deliveries: OnceLock<Arc<Deliveries>>,
}

impl GsiRouter {
    pub fn new(sink: Arc<dyn IrqSink>) -> Self {
        GsiRouter {
            sink,
            routes: Mutex::new(BTreeMap::new()),
            gsis: Mutex::new(IdAllocator::new(FIRST_MSI_GSI, LAST_GSI).expect("a valid constant range")),
            deliveries: OnceLock::new(),
        }
    }

    /// A device signalled an interrupt: counted if anything waits for interrupts.
    #[inline]
    pub fn delivered(&self) {
        if let Some(d) = self.deliveries.get() {
            d.bump();
        }
    }

    /// Starts counting deliveries (once), for a device that lets a vCPU wait for them.
    pub fn count_deliveries(&self) -> Arc<Deliveries> {
        self.deliveries.get_or_init(Default::default).clone()
    }

    /// A fresh GSI with `fd` as its irqfd: a write to `fd` injects the GSI's MSI.
    pub fn allocate(&self, fd: &EventFd) -> Result<u32, IrqError> {
        let gsi = crate::sync::lock(&self.gsis).allocate_id().map_err(IrqError::NoGsi)?;
        self.set(gsi, MsiMessage::default())?;
        self.sink.register_irqfd(fd, gsi)?;
        Ok(gsi)
    }

    /// Points `gsi` at `msg`.
    pub fn set(&self, gsi: u32, msg: MsiMessage) -> Result<(), IrqError> {
        let mut routes = crate::sync::lock(&self.routes);
        if routes.insert(gsi, msg) == Some(msg) {
            return Ok(());
        }
        let mut table = irqchip_routes();
        table.extend(routes.iter().map(|(&g, &m)| (g, Route::Msi(m))));
        self.sink.set_routes(&table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeKvm;

    #[test]
    fn msi_updates_keep_the_legacy_pins_routed() {
        let kvm = Arc::new(FakeKvm::default());
        let router = GsiRouter::new(kvm.clone());
        let gsi = router.allocate(&EventFd::new(0).unwrap()).unwrap();
        router.set(gsi, MsiMessage { address: 0xfee0_0000, data: 0x41 }).unwrap();
        let routes = kvm.routes.lock().unwrap().clone();
        // COM1's IRQ 4 still reaches the IOAPIC and the PIC after MSI routes were set.
        assert!(routes.contains(&(4, Route::Irqchip { chip: KVM_IRQCHIP_IOAPIC, pin: 4 })), "{routes:?}");
        assert!(routes.contains(&(4, Route::Irqchip { chip: KVM_IRQCHIP_PIC_MASTER, pin: 4 })));
        assert!(routes.contains(&(12, Route::Irqchip { chip: KVM_IRQCHIP_PIC_SLAVE, pin: 4 })));
        assert!(routes.contains(&(23, Route::Irqchip { chip: KVM_IRQCHIP_IOAPIC, pin: 23 })));
        assert!(routes.contains(&(gsi, Route::Msi(MsiMessage { address: 0xfee0_0000, data: 0x41 }))));
        assert_eq!(routes.iter().filter(|r| matches!(r.1, Route::Msi(_))).count(), 1);
    }

    #[test]
    fn gsis_run_out_with_an_error() {
        let router = GsiRouter::new(Arc::new(FakeKvm::default()));
        let fd = EventFd::new(0).unwrap();
        let gsis: Vec<u32> = (FIRST_MSI_GSI..=LAST_GSI).map(|_| router.allocate(&fd).unwrap()).collect();
        assert_eq!(gsis.first(), Some(&FIRST_MSI_GSI));
        assert!(matches!(router.allocate(&fd), Err(IrqError::NoGsi(_))));
    }
}
