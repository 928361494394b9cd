//! The lab's own devices: the doorbell (PCI 00:01.0, with its BARs where the lab payloads
//! expect them) and the idle port. Attached by the labs and by `exitless run --lab`,
//! through the device manager like any other device.

pub mod doorbell;
pub mod idle;

use doorbell::Doorbell;
use exitless_payloads::abi;
use exitless_vmm::device_manager::{BarRequest, DeviceError, DeviceHandle, DeviceKind, DeviceManager};
use exitless_vmm::machine::AttachFixed;
use std::sync::Arc;

/// The lab's devices (doorbell, idle port, lab control), a kind of the lab's own: the
/// VMM knows no such kind.
pub const KIND: DeviceKind = DeviceKind("lab");

/// What attaches the lab's devices as a machine is built (they sit at fixed places:
/// [`exitless_vmm::DeviceConfig::fixed`]), and the doorbell it will attach.
pub fn plug() -> (AttachFixed, Arc<Doorbell>) {
    let bell = Arc::new(Doorbell::default());
    let device = bell.clone();
    (Box::new(move |devices: &mut DeviceManager| attach(devices, device)), bell)
}

/// Attaches the idle port and `bell` at 00:01.0.
fn attach(devices: &mut DeviceManager, bell: Arc<Doorbell>) -> Result<(), DeviceError> {
    let idle = Arc::new(idle::Idle::new(devices.gsi_router()));
    devices.attach_pio("idle", KIND, abi::IDLE_PORT as u16, idle::IDLE_LEN, idle, DeviceHandle::bus())?;
    let bars = [
        BarRequest { label: "mmio", spec: doorbell::MMIO_BAR, at: Some(abi::DOORBELL_MMIO_GPA) },
        BarRequest { label: "pio", spec: doorbell::PIO_BAR, at: Some(abi::DOORBELL_PIO_PORT) },
    ];
    let slot = Some(abi::DOORBELL_PCI_DEVICE as u8);
    devices.attach_pci("doorbell", KIND, slot, &bars, |p| {
        Ok((doorbell::pci_function(bell, p.bars[0], p.bars[1]), DeviceHandle::bus()))
    })?;
    Ok(())
}
