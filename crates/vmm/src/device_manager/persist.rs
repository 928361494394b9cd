//! The device manager's part of a snapshot: every device by its id (the API's ids:
//! `virtio-net/eth0`, `virtio-blk/rootfs`; fixed names for the rest), with where it is (its
//! placements: ports, windows, slot, BARs, lines, device memory) and its state, typed and
//! versioned by the device ([`crate::persist::DeviceSnapshot`]). A restore places each
//! device where the snapshot had it ([`DeviceManager::plan_restore`]), whatever order it
//! is attached in, and is checked whole before anything is put back: the same devices by
//! id, each where the snapshot had it; then PCI config spaces (BARs where the guest moved
//! them) and each device's state, read back through [`crate::persist::Saved::decode`].

use super::allocators::AllocatorState;
use super::{Device, DeviceManager, Resource, Saves, TransportKind};
use crate::persist::{DeviceSnapshot, Pausable, Persist, PersistError, Saved, StateFault};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The devices by id, and what the allocators had handed out for them.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceTree {
    pub devices: BTreeMap<String, DeviceRecord>,
    pub allocators: AllocatorState,
    /// The machine's transport, with or without virtio devices on it (none: a file from
    /// before it was saved whatever the devices, which is read as PCI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<TransportKind>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRecord {
    /// Its kind, as its module names it (`virtio-net`).
    pub kind: String,
    pub placement: Vec<Resource>,
    /// What the device holds, at its version (none for a device with no state of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<Saved>,
    /// A PCI function's 4 KiB of config space, in hex (BARs where the guest put them).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "hex_bytes")]
    pub config: Vec<u8>,
}

impl DeviceTree {
    /// The snapshotted machine's transport (None: a file from before it was always saved).
    pub fn transport(&self) -> Option<TransportKind> {
        self.transport
    }
}

/// Stops every virtio device's work (nothing in flight after this), and lets it go on.
impl Pausable for DeviceManager {
    fn pause(&self) -> Result<(), PersistError> {
        self.virtio_devices().try_for_each(|(_, _, t)| t.pause())
    }

    fn resume(&self) -> Result<(), PersistError> {
        let mut first = Ok(());
        for (name, _, transport) in self.virtio_devices() {
            if let Err(e) = transport.resume() {
                tracing::error!("{name}: cannot go on after the snapshot: {e}");
                first = first.and(Err(e.named(name)));
            }
        }
        first
    }
}

impl Persist<'_> for DeviceManager {
    type State = DeviceTree;
    type SaveArgs = ();
    type RestoreArgs = ();

    /// Every device (virtio ones paused first, see [`Pausable`]).
    fn save(&self, (): ()) -> Result<DeviceTree, PersistError> {
        let mut tree = BTreeMap::new();
        for device in self.devices().iter().filter(|d| in_snapshot(d)) {
            let state = snapshot_part(device).map(|p| p.save_state(&device.id)).transpose()?;
            let config = match (device.handle.transport(), pci_slot(&device.resources)) {
                (Some(_), Some(slot)) => {
                    self.pci().config_snapshot(usize::from(slot) << 3).map_or_else(Vec::new, |c| c.to_vec())
                }
                _ => Vec::new(),
            };
            let kind = device.kind.0.to_string();
            let record = DeviceRecord { kind, placement: device.resources.clone(), state, config };
            if tree.insert(device.id.clone(), record).is_some() {
                return Err(PersistError::Refused(format!("two devices are called {}", device.id)));
            }
        }
        // Saved with no virtio device too: a clone of a virtio-mmio machine is one, and
        // runs no hotplug worker (api/devices/plug.rs).
        let transport = Some(self.transport);
        Ok(DeviceTree { devices: tree, allocators: self.allocators.save(())?, transport })
    }

    /// Onto the devices this machine was built with, which must be the snapshot's, each
    /// where the snapshot had it. The virtio devices start later, with
    /// [`DeviceManager::start_restored`], once the vCPUs exist.
    fn restore(&self, (): (), tree: &DeviceTree) -> Result<(), PersistError> {
        let names = |n: &mut dyn Iterator<Item = &String>| n.map(String::as_str).collect::<Vec<_>>().join(", ");
        let mut here: Vec<&Device> = self.devices().iter().filter(|d| in_snapshot(d)).collect();
        here.sort_by(|a, b| a.id.cmp(&b.id));
        let (there_names, here_names) = (names(&mut tree.devices.keys()), names(&mut here.iter().map(|d| &d.id)));
        if there_names != here_names {
            let why = format!("the snapshot has devices [{there_names}], this machine [{here_names}]");
            return Err(PersistError::Refused(why));
        }
        for device in &here {
            let saved = &tree.devices[&device.id];
            if saved.kind != device.kind.0 || placed(&saved.placement) != placed(&device.resources) {
                return Err(PersistError::Refused(format!(
                    "{} is a {} at {:?} in the snapshot, a {} at {:?} here",
                    device.id, saved.kind, saved.placement, device.kind, device.resources
                )));
            }
        }
        // Whatever else the allocators handed out must match too (a device's placement
        // above names it; this catches what no device of the tree holds).
        self.allocators.restore((), &tree.allocators)?;
        // PCI functions: their BARs leave the bus, then their config spaces (with BARs
        // where the guest moved them) go back and place them again.
        let functions: Vec<usize> = here
            .iter()
            .filter(|d| !tree.devices[&d.id].config.is_empty())
            .filter_map(|d| pci_slot(&d.resources))
            .map(|slot| usize::from(slot) << 3)
            .collect();
        self.pci().unplace_bars(&functions);
        for device in here {
            let saved = &tree.devices[&device.id];
            if let (false, Some(slot)) = (saved.config.is_empty(), pci_slot(&device.resources)) {
                let config = self.pci().restore_config(usize::from(slot) << 3, &saved.config);
                config.map_err(|e| PersistError::from(e).named(&device.id))?;
            }
            match (snapshot_part(device), &saved.state) {
                (None, None) => {}
                (Some(part), Some(state)) => part.restore_state(&device.id, state)?,
                (Some(_), None) => return Err(StateFault::Missing.of(&device.id).into()),
                (None, Some(_)) => return Err(StateFault::Unexpected.of(&device.id).into()),
            }
        }
        Ok(())
    }
}

/// Whether a device is part of the machine a snapshot saves (not, for one that is there
/// or not in either process alike: Firecracker's boot timer, the VMM's own stopwatch).
fn in_snapshot(device: &Device) -> bool {
    !matches!(device.handle.saves(), Saves::Excluded)
}

/// A device's part of a snapshot (None: it keeps no state of its own).
fn snapshot_part(device: &Device) -> Option<&dyn DeviceSnapshot> {
    match device.handle.saves() {
        Saves::State(part) => Some(&**part),
        Saves::Nothing | Saves::Excluded | Saves::Refused(_) => None,
    }
}

/// What a restore must reproduce of a placement: all of it but BARs' first addresses,
/// which the guest may have moved and the saved config space puts where it left them.
fn placed(resources: &[Resource]) -> Vec<&Resource> {
    resources.iter().filter(|r| !matches!(r, Resource::Bar { .. })).collect()
}

fn pci_slot(resources: &[Resource]) -> Option<u8> {
    resources.iter().find_map(|r| match r {
        Resource::PciSlot(s) => Some(*s),
        _ => None,
    })
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
