//! The VMM's own devices in a snapshot: COM1, the i8042 and ACPI PM by their registers, and each
//! virtio device by its transport (virtio::transport::state) and where it is: a PCI
//! device by its slot and config space (BARs where the guest put them, MSI-X enable), an
//! MMIO device by its window; matched on restore by name and place.

use crate::device_manager::{DeviceManager, Resource};
use crate::virtio::pci::TransportState;
use serde::{Deserialize, Serialize};

/// What the guest left in the VMM's devices.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DeviceStates {
    pub serial: Option<crate::devices::legacy::serial::SerialRegs>,
    pub keyboard: Option<crate::devices::legacy::i8042::State>,
    /// The ACPI PM registers and timer (a restored guest's timer goes on, never back).
    #[serde(default)]
    pub power: Option<crate::devices::legacy::acpi_pm::PmState>,
    #[serde(default)]
    pub virtio: Vec<VirtioDeviceState>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct VirtioDeviceState {
    /// The device manager's name for it (`virtio-net1`, `virtio-blk0`).
    pub name: String,
    /// Its PCI slot (0 for an MMIO device).
    #[serde(default)]
    pub slot: u8,
    /// An MMIO device's window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmio: Option<u64>,
    /// Its 4 KiB of config space, in hex.
    #[serde(with = "hex_bytes")]
    pub config: Vec<u8>,
    pub transport: TransportState,
}

impl DeviceStates {
    /// Pauses every virtio device (nothing in flight after this) and reads every device.
    pub fn save(devices: &DeviceManager) -> Self {
        let virtio = devices
            .virtio_devices()
            .map(|(name, resources, transport)| {
                let (slot, mmio) = place(resources);
                let config = slot.and_then(|s| devices.pci().config_snapshot(usize::from(s) << 3));
                VirtioDeviceState {
                    name: name.to_string(),
                    slot: slot.unwrap_or(0),
                    mmio,
                    transport: transport.save(),
                    config: config.map_or_else(Vec::new, |c| c.to_vec()),
                }
            })
            .collect();
        DeviceStates {
            serial: devices.serial().map(|s| s.save()),
            keyboard: devices.keyboard().map(|k| k.save()),
            power: devices.power().map(|p| p.save()),
            virtio,
        }
    }

    /// The transport the snapshotted machine's virtio devices were on (None: it had none).
    pub fn transport(&self) -> Option<crate::device_manager::TransportKind> {
        use crate::device_manager::TransportKind;
        let first = self.virtio.first()?;
        Some(if first.mmio.is_some() { TransportKind::Mmio } else { TransportKind::Pci })
    }

    /// After [`DeviceStates::save`]: the virtio devices go on.
    pub fn resume(&self, devices: &DeviceManager) {
        for (name, _, transport) in devices.virtio_devices() {
            if let Err(e) = transport.core().resume() {
                tracing::error!("{name}: cannot go on after the snapshot: {e}");
            }
        }
    }

    /// Puts the saved state back on the devices this machine was built with, which must
    /// be the snapshot's: the same virtio devices in the same slots. The virtio devices
    /// start later, with [`DeviceManager::start_restored`], once the vCPUs exist.
    pub fn restore(&self, devices: &DeviceManager) -> Result<(), String> {
        if let (Some(regs), Some(serial)) = (&self.serial, devices.serial()) {
            serial.restore(regs);
        }
        if let (Some(state), Some(keyboard)) = (&self.keyboard, devices.keyboard()) {
            keyboard.restore(state.clone());
        }
        if let (Some(state), Some(power)) = (&self.power, devices.power()) {
            power.restore(state);
        }
        let here: Vec<_> = devices.virtio_devices().collect();
        let names = |n: &mut dyn Iterator<Item = &str>| n.collect::<Vec<_>>().join(", ");
        let listed = (names(&mut self.virtio.iter().map(|v| v.name.as_str())), names(&mut here.iter().map(|h| h.0)));
        if listed.0 != listed.1 {
            return Err(format!("the snapshot has virtio devices [{}], the configuration [{}]", listed.0, listed.1));
        }
        for (saved, (name, resources, _)) in self.virtio.iter().zip(&here) {
            match place(resources) {
                (Some(slot), _) if saved.mmio.is_some() || saved.slot != slot => {
                    return Err(format!("{name} is in PCI slot {} in the snapshot, {slot} here", saved.slot))
                }
                (None, Some(base)) if saved.mmio != Some(base) => {
                    let there = saved.mmio.map_or("on PCI".into(), |b| format!("at {b:#x}"));
                    return Err(format!("{name} is {there} in the snapshot, at {base:#x} here"));
                }
                _ => {}
            }
        }
        let functions: Vec<usize> =
            here.iter().filter_map(|(_, r, _)| place(r).0).map(|slot| usize::from(slot) << 3).collect();
        devices.pci().unplace_bars(&functions);
        for (saved, (name, resources, transport)) in self.virtio.iter().zip(here) {
            let refused = |e: String| format!("{name}: {e}");
            if let Some(slot) = place(resources).0 {
                devices.pci().restore_config(usize::from(slot) << 3, &saved.config).map_err(refused)?;
            }
            transport.restore(&saved.transport).map_err(refused)?;
        }
        Ok(())
    }
}

/// A device's PCI slot, or its MMIO window's base.
fn place(resources: &[Resource]) -> (Option<u8>, Option<u64>) {
    let slot = resources.iter().find_map(|r| match r {
        Resource::PciSlot(s) => Some(*s),
        _ => None,
    });
    let mmio = resources.iter().find_map(|r| match r {
        Resource::Mmio { base, .. } => Some(*base),
        _ => None,
    });
    (slot, mmio)
}

/// Bytes as one hex string: a config space is 8 KiB of text, not 16 of numbers.
mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        let digit = |c: u8| (c as char).to_digit(16).ok_or_else(|| serde::de::Error::custom("not hex"));
        if text.len() % 2 != 0 {
            return Err(serde::de::Error::custom("hex of odd length"));
        }
        text.as_bytes().chunks(2).map(|p| Ok((digit(p[0])? * 16 + digit(p[1])?) as u8)).collect()
    }
}
