//! The ACPI devices Firecracker gives every microVM, each described only in the DSDT (no
//! bus entry: the guest reads its memory and takes its interrupt): VMGenID (vmgenid.rs),
//! VMClock (vmclock.rs), and the Generic Event Device (ACPI0013) whose `_EVT` method
//! turns each device's interrupt line into a Notify (0x80) of that device, as Linux's
//! `evged` driver runs it. Each device takes its line from the allocators after every
//! other allocated device (Firecracker's order: its next legacy lines past the
//! virtio-mmio devices').

pub mod pci_hotplug;
pub mod vmclock;
pub mod vmgenid;

use crate::device_manager::{DeviceError, DeviceHandle, DeviceKind, DeviceManager, Resource, Saves};
use acpi_tables::aml::{self, Arg, Equal, If, Interrupt, Method, MethodCall, Name, Notify, Path, ResourceTemplate};
use acpi_tables::Aml;
use pci_hotplug::PciHotplug;
use std::sync::Arc;
use vmclock::{VmClock, VMCLOCK_LEN, VMCLOCK_PATH};
use vmgenid::{VmGenId, VMGENID_LEN, VMGENID_PATH};
use vmm_sys_util::eventfd::EventFd;

pub const VMGENID: DeviceKind = DeviceKind("vmgenid");
pub const VMCLOCK: DeviceKind = DeviceKind("vmclock");
pub const PCI_HOTPLUG: DeviceKind = DeviceKind("pci-hotplug");

/// A device's line (where the snapshot had it, or the allocators' next) and an irqfd on
/// it; None when restoring a snapshot whose machine did not have the device (one taken
/// before exitless had it), which keeps a machine without it.
fn device_error(name: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> DeviceError {
    DeviceError::Device { name, source: Box::new(e) }
}

fn line_for(dm: &mut DeviceManager, id: &'static str, restoring: bool) -> Result<Option<(u32, EventFd)>, DeviceError> {
    let planned = dm.planned(id).to_vec();
    if restoring && planned.is_empty() {
        tracing::info!("{id}: the snapshot's machine had none, nor has this one");
        return Ok(None);
    }
    let line = match planned.iter().find_map(|r| match r {
        Resource::Irq(line) => Some(*line),
        _ => None,
    }) {
        Some(line) => dm.allocators().reserve_mmio_irq(line).map(|()| line)?,
        None => dm.allocators().mmio_irq()?,
    };
    let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|source| DeviceError::Setup { name: id.into(), source })?;
    dm.vm().register_irqfd(&irq, line)?;
    Ok(Some((line, irq)))
}

impl DeviceManager {
    /// Firecracker's ACPI devices, on by default as there: VMGenID with a new generation
    /// id, then VMClock. Restoring (`restoring`), each goes where the snapshot had it.
    pub fn attach_acpi_devices(&mut self, restoring: bool) -> Result<(), DeviceError> {
        if let Some((line, irq)) = line_for(self, "vmgenid", restoring)? {
            let addr = crate::layout::VMGENID_GPA;
            let device =
                VmGenId::new(self.memory().clone(), addr, line, irq).map_err(|e| device_error("vmgenid", e))?;
            let device = Arc::new(device);
            let handle = DeviceHandle::reached_by(device.clone()).saving(Saves::State(device));
            let resources = vec![Resource::Memory { base: addr, len: VMGENID_LEN }, Resource::Irq(line)];
            self.record("vmgenid".into(), VMGENID, resources, handle);
        }
        if let Some((line, irq)) = line_for(self, "vmclock", restoring)? {
            let addr = crate::layout::VMCLOCK_GPA;
            let device = VmClock::new(self.memory().clone(), addr, line, irq, !restoring)
                .map_err(|e| device_error("vmclock", e))?;
            let device = Arc::new(device);
            let handle = DeviceHandle::reached_by(device.clone()).saving(Saves::State(device));
            let resources = vec![Resource::Memory { base: addr, len: VMCLOCK_LEN }, Resource::Irq(line)];
            self.record("vmclock".into(), VMCLOCK, resources, handle);
        }
        // With PCI, the hotplug controller (exitless's own: Firecracker's guests rescan).
        if self.transport() == crate::device_manager::TransportKind::Pci {
            if let Some((line, irq)) = line_for(self, "pci-hotplug", restoring)? {
                let port = crate::layout::PCI_HOTPLUG_PORT;
                let device = Arc::new(PciHotplug::new(port, line, irq));
                let handle = DeviceHandle::reached_by(device.clone());
                self.attach_pio("pci-hotplug", PCI_HOTPLUG, port, pci_hotplug::REGISTERS_LEN, device, handle)?;
                if let Some(d) = self.device_mut("pci-hotplug") {
                    d.resources.push(Resource::Irq(line));
                }
            }
        }
        Ok(())
    }

    /// The ACPI PCI hotplug controller, if the machine has one.
    pub fn pci_hotplug(&self) -> Option<&Arc<PciHotplug>> {
        self.find()
    }

    /// The VMGenID device, if the machine has one.
    pub fn vmgenid(&self) -> Option<&Arc<VmGenId>> {
        self.find()
    }

    /// The VMClock device, if the machine has one.
    pub fn vmclock(&self) -> Option<&Arc<VmClock>> {
        self.find()
    }
}

/// What the GED does when a device's line rises.
#[derive(Clone, Copy)]
enum Event {
    /// Notify (0x80) the device at this path.
    Notify(&'static str),
    /// Call this method (the PCI hotplug controller's scan).
    Call(&'static str),
}

/// Each ACPI device's line and what the GED does on it, then its AML.
fn devices(dm: &DeviceManager) -> Vec<((u32, Event), Vec<u8>)> {
    let vmgenid = dm.vmgenid().map(|d| ((d.line(), Event::Notify(VMGENID_PATH)), d.aml()));
    let vmclock = dm.vmclock().map(|d| ((d.line(), Event::Notify(VMCLOCK_PATH)), d.aml()));
    let hotplug = dm.pci_hotplug().map(|d| ((d.line(), Event::Call(pci_hotplug::SCAN)), d.aml()));
    vmgenid.into_iter().chain(vmclock).chain(hotplug).collect()
}

/// The interrupt lines the ACPI devices raise (the GED's), which a guest must reach.
pub fn lines(dm: &DeviceManager) -> Vec<u32> {
    devices(dm).iter().map(|((line, _), _)| *line).collect()
}

/// What the ACPI devices add to the DSDT: each device, then the GED that notifies them
/// (nothing if the machine has none).
pub fn dsdt(dm: &DeviceManager) -> Vec<u8> {
    let devices = devices(dm);
    if devices.is_empty() {
        return Vec::new();
    }
    let mut v: Vec<u8> = devices.iter().flat_map(|(_, aml)| aml.iter().copied()).collect();
    let lines: Vec<(u32, Event)> = devices.iter().map(|(line, _)| *line).collect();
    ged(&lines).to_aml_bytes(&mut v);
    v
}

/// The Generic Event Device: one edge-triggered, active-high line per device in its
/// `_CRS`; its `_EVT` (called with the line) notifies that device with 0x80, or calls
/// its method.
struct Ged<'a>(&'a [(u32, Event)]);

fn ged(devices: &[(u32, Event)]) -> Ged<'_> {
    Ged(devices)
}

impl Aml for Ged<'_> {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        let interrupts: Vec<Interrupt> =
            self.0.iter().map(|&(line, _)| Interrupt::new(true, true, false, false, line)).collect();
        let paths: Vec<(u32, Path)> = self
            .0
            .iter()
            .map(|&(line, event)| match event {
                Event::Notify(path) | Event::Call(path) => (line, Path::new(path)),
            })
            .collect();
        let actions: Vec<Box<dyn Aml + '_>> = paths
            .iter()
            .zip(self.0)
            .map(|((_, path), (_, event))| -> Box<dyn Aml + '_> {
                match event {
                    Event::Notify(_) => Box::new(Notify::new(path, &0x80u8)),
                    Event::Call(method) => Box::new(MethodCall::new(Path::new(method), vec![])),
                }
            })
            .collect();
        let ifs: Vec<(Equal, &dyn Aml)> =
            paths.iter().zip(&actions).map(|((line, _), a)| (Equal::new(&Arg(0), line), a.as_ref())).collect();
        let ifs: Vec<If> = ifs.iter().map(|(eq, a)| If::new(eq, vec![*a])).collect();
        let crs: Vec<&dyn Aml> = interrupts.iter().map(|i| i as &dyn Aml).collect();
        let evt: Vec<&dyn Aml> = ifs.iter().map(|i| i as &dyn Aml).collect();
        aml::Device::new(
            "_SB_.GED_".into(),
            vec![
                &Name::new("_HID".into(), &"ACPI0013"),
                &Name::new("_CRS".into(), &ResourceTemplate::new(crs)),
                &Method::new("_EVT".into(), 1, true, evt),
            ],
        )
        .to_aml_bytes(sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(a: &dyn Aml) -> Vec<u8> {
        let mut v = Vec::new();
        a.to_aml_bytes(&mut v);
        v
    }

    #[test]
    fn the_ged_notifies_each_device_on_its_line() {
        let events =
            [(5, Event::Notify(VMGENID_PATH)), (6, Event::Notify("\\_SB_.VCLK")), (7, Event::Call(pci_hotplug::SCAN))];
        let aml = bytes(&ged(&events));
        let has = |b: &[u8]| aml.windows(b.len()).any(|w| w == b);
        assert_eq!(&aml[..2], &[0x5b, 0x82], "a Device");
        assert!(has(b"_SB_GED_"));
        assert!(has(b"\x08_HID\x0dACPI0013\0"));
        // Extended Interrupt descriptors: consumer, edge, active high, exclusive; one line.
        assert!(has(&[0x89, 6, 0, 0b0_0011, 1, 5, 0, 0, 0]), "{aml:x?}");
        assert!(has(&[0x89, 6, 0, 0b0_0011, 1, 6, 0, 0, 0]), "{aml:x?}");
        // Method (_EVT, 1, Serialized): flags 1 argument | serialized (0x08).
        let evt = aml.windows(4).position(|w| w == b"_EVT").expect("no _EVT");
        assert_eq!(aml[evt + 4], 0x09);
        // If (LEqual (Arg0, 5)) { Notify (\_SB_.VGEN, 0x80) }.
        assert!(has(b"\x93\x68\x0a\x05"), "{aml:x?}");
        assert!(has(b"\x86\\._SB_VGEN\x0a\x80"), "{aml:x?}");
        assert!(has(b"\x93\x68\x0a\x06"));
        // If (LEqual (Arg0, 7)) { \_SB_.PHPR.PSCN () }.
        assert!(has(b"\x93\x68\x0a\x07\\._SB_PHPRPSCN") || has(b"\x93\x68\x0a\x07"), "{aml:x?}");
        assert!(has(b"\\/\x03_SB_PHPRPSCN"), "{aml:x?}");
    }
}
