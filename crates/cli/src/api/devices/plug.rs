//! Device hotplug on a running microVM (Firecracker v1.16.1's docs/device-hotplug.md):
//! `PUT /drives|/network-interfaces|/pmem/{id}` after the start plugs a PCI virtio
//! device; `DELETE` on the same path (Firecracker's `HotUnplugDevice`) takes it out.
//! Beyond Firecracker, the guest is told both ways through ACPI PCI hotplug
//! (exitless_vmm::devices::acpi::pci_hotplug): a plugged device appears without a rescan,
//! and an unplug asks the guest to eject the device and waits for it.
//!
//! A device is *in use* while the guest's virtio driver holds it (its status not reset
//! to 0). An unplug asks the guest to eject it (its driver unbinds, resetting the device,
//! and the slot's `_EJ0` runs); if the guest does not within [`EJECT_WAIT`], a device in
//! use stays, refused with a 400, while one no driver holds (the guest released it
//! itself, as Firecracker's docs have it, or never drove it) is taken out anyway.
//!
//! The work runs on the hotplug worker (api/plug_worker.rs).

use super::{Answer, Device};
use crate::api::model::{Drive, NetworkInterface};
use crate::api::request::check_id;
use crate::api::vm::{Fault, Vm};
use exitless_vmm::device_manager::{DeviceKind, HotplugError, TransportKind};
use exitless_vmm::Machine;
use std::sync::Arc;
use std::time::Duration;

/// How long an unplug waits for the guest to eject a device its driver holds, and one no
/// driver holds.
const EJECT_WAIT: Duration = Duration::from_secs(10);
const EJECT_WAIT_UNDRIVEN: Duration = Duration::from_secs(2);

/// The entry in the list of devices/mod.rs.
pub const DEVICE: Device = Device { route, ..Device::NONE };

/// The unplug endpoints: `DELETE /drives|/network-interfaces|/pmem/{id}`.
fn route(vm: &mut Vm, method: &str, parts: &[&str], _body: &[u8]) -> Answer {
    let (what, id) = match (method, parts) {
        ("DELETE", ["drives", id]) => (Plugged::Drive, *id),
        ("DELETE", ["network-interfaces", id]) => (Plugged::Net, *id),
        ("DELETE", ["pmem", id]) => (Plugged::Pmem, *id),
        _ => return None,
    };
    Some(check_id(id).and_then(|id| vm.unplug(what, id)).map(|()| None))
}

/// The kinds of device a guest can be given and have taken away.
#[derive(Clone, Copy)]
pub enum Plugged {
    Drive,
    Net,
    Pmem,
}

impl Plugged {
    fn kind(self) -> DeviceKind {
        match self {
            Plugged::Drive => exitless_vmm::virtio::blk::KIND,
            Plugged::Net => exitless_vmm::virtio::net::KIND,
            Plugged::Pmem => exitless_vmm::virtio::pmem::KIND,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Plugged::Drive => "drive",
            Plugged::Net => "network interface",
            Plugged::Pmem => "pmem device",
        }
    }
}

fn hotplug_fault(e: HotplugError) -> Fault {
    match e {
        // Firecracker's words first (VmmActionError::PciNotEnabled).
        HotplugError::NotPci => Fault(format!("PCI is not enabled: {e}.")),
        e => Fault(format!("Hotplug refused: {e}.")),
    }
}

/// Whether `vm` runs a machine on PCI, into which devices can be plugged.
pub(super) fn on_pci(vm: &Vm) -> bool {
    vm.running("").is_ok_and(|m| m.devices().transport() == TransportKind::Pci)
}

impl Vm {
    /// The running machine a device can be plugged into or out of now: not paused, PCI.
    fn machine_for_hotplug(&self) -> Result<Arc<Machine>, Fault> {
        let machine = self.running("devices are plugged into a running one")?.clone();
        if machine.control().is_paused() {
            return Err(Fault("The microVM is paused: resume it before plugging or unplugging a device.".into()));
        }
        // The machine's own transport: a restored one keeps its snapshot's.
        if machine.devices().transport() != TransportKind::Pci {
            return Err(hotplug_fault(HotplugError::NotPci));
        }
        Ok(machine)
    }

    /// Plugs a device `attach` makes into the running machine and tells the guest;
    /// `id` is its configuration's. Everything that can be refused is checked first.
    pub(in crate::api) fn plug(
        &mut self,
        what: Plugged,
        id: &str,
        attach: impl FnOnce(&mut exitless_vmm::device_manager::DeviceManager) -> Result<(), String> + Send + 'static,
    ) -> Result<(), Fault> {
        let machine = self.machine_for_hotplug()?;
        machine.devices().can_hotplug().map_err(hotplug_fault)?;
        let worker = self.worker()?;
        let key = format!("{}/{id}", what.kind());
        let slot = worker
            .run(move || {
                let mut devices = machine.devices_for_hotplug();
                attach(&mut devices)?;
                devices.announce(&key).map_err(|e| e.to_string())
            })
            .map_err(Fault)?;
        let slot = slot.map_err(|e| Fault(format!("Cannot plug {} {id}: {e}", what.what())))?;
        tracing::info!("{} {id}: hotplugged at 00:{slot:02x}.0", what.what());
        Ok(())
    }

    /// `PUT /drives/{id}` on a running microVM, checked as before the start: a hotplug (a
    /// new id, never the root device; Firecracker's `hotplug_device`).
    pub(in crate::api) fn plug_drive(&mut self, id: &str, d: Drive) -> Result<(), Fault> {
        if self.config.drives.iter().any(|o| o.drive_id == id) {
            return Err(Fault(format!("Device ID in use: the microVM has a drive {id} already.")));
        }
        if d.is_root_device {
            return Err(Fault("A root block device already exists!".into()));
        }
        let config = crate::api::vm::drive_config(&d);
        let poll = exitless_vmm::poll::PollMode::Adaptive;
        self.plug(Plugged::Drive, id, move |dm| dm.attach_blk(&config, poll).map_err(|e| crate::with_causes(&e)))?;
        self.config.drives.push(d);
        Ok(())
    }

    /// `PUT /network-interfaces/{id}` on a running microVM, checked as before the start.
    pub(in crate::api) fn plug_network_interface(&mut self, n: NetworkInterface) -> Result<(), Fault> {
        let config = self.net_config(self.config.network_interfaces.len(), &n)?;
        let poll = exitless_vmm::poll::PollMode::Adaptive;
        let id = n.iface_id.clone();
        self.plug(Plugged::Net, &id, move |dm| dm.attach_net(&config, poll).map_err(|e| crate::with_causes(&e)))?;
        self.config.network_interfaces.push(n);
        Ok(())
    }

    /// `DELETE /drives|/network-interfaces|/pmem/{id}`: asks the guest to eject the device,
    /// then takes it out (see the module's words for "in use").
    fn unplug(&mut self, what: Plugged, id: &str) -> Result<(), Fault> {
        let machine = self.machine_for_hotplug()?;
        let root = match what {
            Plugged::Drive => self.config.drives.iter().find(|d| d.drive_id == id).map(|d| d.is_root_device),
            Plugged::Net => self.config.network_interfaces.iter().find(|n| n.iface_id == id).map(|_| false),
            Plugged::Pmem => self.config.pmem.iter().find(|p| p.id == id).map(|p| p.root_device),
        };
        match root {
            None => return Err(Fault(format!("Device not found: the microVM has no {} {id}.", what.what()))),
            Some(true) => return Err(Fault(format!("Cannot unplug root device: {} {id} is the root.", what.what()))),
            Some(false) => {}
        }
        let key = format!("{}/{id}", what.kind());
        let unplug = machine.devices().unplug_of(&key).map_err(hotplug_fault)?;
        let wait = if unplug.driven { EJECT_WAIT } else { EJECT_WAIT_UNDRIVEN };
        let ejected = unplug.controller.eject(unplug.slot, wait);
        // Read again: the guest's driver may have let go of it meanwhile.
        let driven = machine.devices().unplug_of(&key).map_err(hotplug_fault)?.driven;
        if !ejected && driven {
            return Err(Fault(format!(
                "The {} {id} is in use: the guest's driver holds it and did not eject it within {} s of the \
                 request (ACPI eject); nothing was removed.",
                what.what(),
                wait.as_secs()
            )));
        }
        let worker = self.worker()?;
        let removed =
            worker.run(move || machine.devices_for_hotplug().remove_device(&key).map_err(|e| e.to_string()))?;
        removed.map_err(|e| Fault(format!("Cannot unplug {} {id}: {e}", what.what())))?;
        match what {
            Plugged::Drive => self.config.drives.retain(|d| d.drive_id != id),
            Plugged::Net => self.config.network_interfaces.retain(|n| n.iface_id != id),
            Plugged::Pmem => self.config.pmem.retain(|p| p.id != id),
        }
        tracing::info!("{} {id}: unplugged{}", what.what(), if ejected { " (ejected by the guest)" } else { "" });
        Ok(())
    }
}
