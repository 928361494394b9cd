//! Plugging a PCI device into a running guest and taking it out again, whatever the
//! device: each device's module attaches it as at boot (`attach_blk`, `attach_net`,
//! `attach_pmem`); here is what comes before (can it be placed at all, so a refusal leaves
//! nothing behind) and after (the guest told through the ACPI hotplug controller), and
//! the removal once the guest ejected it: off PCI and the buses, its slot, BARs and
//! device memory given back, what its module undoes (`DeviceHandle::on_unplug`), and the
//! device dropped (its thread joined).

use super::{DeviceError, DeviceManager, Resource, TransportKind};
use crate::devices::acpi::pci_hotplug::PciHotplug;
use crate::pci::BarKind;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum HotplugError {
    #[error("devices are plugged into a running microVM over PCI only: start it with --enable-pci")]
    NotPci,
    #[error("this microVM has no PCI hotplug controller (it was restored from a snapshot taken without one)")]
    NoController,
    #[error("no free PCI slot on bus 0 for another device")]
    BusFull,
    #[error("the machine has no device {0}")]
    NoSuch(String),
    #[error("device {0} was not hotplugged over PCI")]
    NotPlugged(String),
}

/// A device to take out: its slot and the controller that asks the guest for it.
pub struct Unplug {
    pub slot: u8,
    pub controller: Arc<PciHotplug>,
    /// Whether the guest's driver holds it (its virtio status not reset to 0).
    pub driven: bool,
}

impl DeviceManager {
    /// Whether one more device can be plugged in now (PCI, a controller, a free slot),
    /// checked before anything is made for it.
    pub fn can_hotplug(&self) -> Result<(), HotplugError> {
        if self.transport != TransportKind::Pci {
            return Err(HotplugError::NotPci);
        }
        if self.pci_hotplug().is_none() {
            return Err(HotplugError::NoController);
        }
        match self.allocators.free_slot() {
            true => Ok(()),
            false => Err(HotplugError::BusFull),
        }
    }

    /// Tells the guest that device `id` (just attached) is in its slot.
    pub fn announce(&self, id: &str) -> Result<u8, HotplugError> {
        let slot = self.slot_of(id)?;
        self.pci_hotplug().ok_or(HotplugError::NoController)?.plugged(slot);
        tracing::info!("{id}: plugged into 00:{slot:02x}.0, the guest told");
        Ok(slot)
    }

    /// What taking device `id` out needs: its slot, the controller, whether it is driven.
    pub fn unplug_of(&self, id: &str) -> Result<Unplug, HotplugError> {
        if self.transport != TransportKind::Pci {
            return Err(HotplugError::NotPci);
        }
        let slot = self.slot_of(id)?;
        let controller = self.pci_hotplug().ok_or(HotplugError::NoController)?.clone();
        let device = self.devices.iter().find(|d| d.id == id).ok_or_else(|| HotplugError::NoSuch(id.into()))?;
        let driven = device.handle.transport().is_some_and(|t| t.core().status() != 0);
        Ok(Unplug { slot, controller, driven })
    }

    fn slot_of(&self, id: &str) -> Result<u8, HotplugError> {
        let device = self.devices.iter().find(|d| d.id == id).ok_or_else(|| HotplugError::NoSuch(id.into()))?;
        device
            .resources
            .iter()
            .find_map(|r| match r {
                Resource::PciSlot(s) => Some(*s),
                _ => None,
            })
            .ok_or_else(|| HotplugError::NotPlugged(id.into()))
    }

    /// Takes device `id` out of the machine (the guest ejected it, or never drove it).
    pub fn remove_device(&mut self, id: &str) -> Result<(), DeviceError> {
        let at = self.devices.iter().position(|d| d.id == id);
        let at = at.ok_or_else(|| DeviceError::NoSuch { what: "device", id: id.into() })?;
        let mut device = self.devices.remove(at);
        if let Some(transport) = device.handle.transport() {
            // Whatever the guest left running stops now (its thread's job handed back).
            transport.core().pause();
        }
        for resource in &device.resources {
            match *resource {
                Resource::PciSlot(slot) => {
                    if let Some(function) = self.pci.remove(slot, 0) {
                        for (index, bar) in device.resources.iter().filter_map(|r| match r {
                            Resource::Bar { index, base } => Some((usize::from(*index), *base)),
                            _ => None,
                        }) {
                            let kind = function.config.bar(index).map_or(BarKind::Memory32, |s| s.kind);
                            self.allocators.release_bar(kind, bar);
                        }
                    }
                    self.allocators.release_slot(slot);
                }
                Resource::Memory { base, .. } => self.allocators.release_device_memory(base),
                _ => {}
            }
        }
        device.handle.unplugged();
        tracing::info!("{}: unplugged", device.name);
        Ok(())
    }
}
