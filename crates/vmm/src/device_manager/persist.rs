//! The device manager's part of a snapshot: every device by its name, with where it is
//! (its placements: ports, windows, slot, BARs, lines) and what it holds. A restore is
//! checked whole before anything is put back: the same devices by name, each where the
//! snapshot had it; then PCI config spaces (BARs where the guest moved them) and each
//! device's state, through its own [`Persist`].

use super::allocators::AllocatorState;
use super::{Device, DeviceHandle, DeviceKind, DeviceManager, Resource, TransportKind};
use crate::devices::legacy::{acpi_pm::PmState, i8042, serial::SerialRegs};
use crate::persist::{Pausable, Persist, PersistError};
use crate::virtio::transport::TransportState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The devices by name, and what the allocators had handed out for them.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct DeviceTree {
    pub devices: BTreeMap<String, DeviceRecord>,
    pub allocators: AllocatorState,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct DeviceRecord {
    pub kind: DeviceKind,
    pub placement: Vec<Resource>,
    /// What the device holds (none for a device with no state of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<DeviceState>,
    /// A PCI function's 4 KiB of config space, in hex (BARs where the guest put them).
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "hex_bytes")]
    pub config: Vec<u8>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceState {
    Serial(SerialRegs),
    Keyboard(i8042::State),
    Power(PmState),
    Virtio(TransportState),
}

impl DeviceTree {
    /// The transport the snapshotted machine's virtio devices were on (None: it had none).
    pub fn transport(&self) -> Option<TransportKind> {
        let virtio = self.devices.values().filter(|r| matches!(r.state, Some(DeviceState::Virtio(_))));
        let mut kinds = virtio.map(|r| match pci_slot(&r.placement) {
            Some(_) => TransportKind::Pci,
            None => TransportKind::Mmio,
        });
        kinds.next()
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
                first = first.and(Err(PersistError(format!("{name}: {e}"))));
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
            let named = |e: PersistError| PersistError(format!("{}: {e}", device.name));
            let state = state_of(device).map_err(named)?;
            let config = match (&device.handle, pci_slot(&device.resources)) {
                (DeviceHandle::Virtio(_), Some(slot)) => {
                    self.pci().config_snapshot(usize::from(slot) << 3).map_or_else(Vec::new, |c| c.to_vec())
                }
                _ => Vec::new(),
            };
            let record = DeviceRecord { kind: device.kind, placement: device.resources.clone(), state, config };
            if tree.insert(device.name.clone(), record).is_some() {
                return Err(PersistError(format!("two devices are called {}", device.name)));
            }
        }
        Ok(DeviceTree { devices: tree, allocators: self.allocators.save(())? })
    }

    /// Onto the devices this machine was built with, which must be the snapshot's, each
    /// where the snapshot had it. The virtio devices start later, with
    /// [`DeviceManager::start_restored`], once the vCPUs exist.
    fn restore(&self, (): (), tree: &DeviceTree) -> Result<(), PersistError> {
        let names = |n: &mut dyn Iterator<Item = &String>| n.map(String::as_str).collect::<Vec<_>>().join(", ");
        let mut here: Vec<&Device> = self.devices().iter().filter(|d| in_snapshot(d)).collect();
        here.sort_by(|a, b| a.name.cmp(&b.name));
        let (there_names, here_names) = (names(&mut tree.devices.keys()), names(&mut here.iter().map(|d| &d.name)));
        if there_names != here_names {
            return Err(PersistError(format!("the snapshot has devices [{there_names}], this machine [{here_names}]")));
        }
        for device in &here {
            let saved = &tree.devices[&device.name];
            if saved.kind != device.kind || placed(&saved.placement) != placed(&device.resources) {
                return Err(PersistError(format!(
                    "{} is a {:?} at {:?} in the snapshot, a {:?} at {:?} here",
                    device.name, saved.kind, saved.placement, device.kind, device.resources
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
            .filter(|d| !tree.devices[&d.name].config.is_empty())
            .filter_map(|d| pci_slot(&d.resources))
            .map(|slot| usize::from(slot) << 3)
            .collect();
        self.pci().unplace_bars(&functions);
        for device in here {
            let saved = &tree.devices[&device.name];
            let named = |e: PersistError| PersistError(format!("{}: {e}", device.name));
            if let (false, Some(slot)) = (saved.config.is_empty(), pci_slot(&device.resources)) {
                self.pci().restore_config(usize::from(slot) << 3, &saved.config).map_err(|e| named(e.into()))?;
            }
            restore_state(device, saved.state.as_ref()).map_err(named)?;
        }
        Ok(())
    }
}

/// Whether a device is part of the machine a snapshot saves: Firecracker's boot timer is
/// the VMM's own stopwatch (`--boot-timer`), there or not in either process alike.
fn in_snapshot(device: &Device) -> bool {
    device.kind != DeviceKind::BootTimer
}

fn state_of(device: &Device) -> Result<Option<DeviceState>, PersistError> {
    Ok(Some(match &device.handle {
        DeviceHandle::Bus => return Ok(None),
        DeviceHandle::Serial(s) => DeviceState::Serial(s.save(())?),
        DeviceHandle::Keyboard(k) => DeviceState::Keyboard(k.save(())?),
        DeviceHandle::Power(p) => DeviceState::Power(p.save(())?),
        DeviceHandle::Virtio(v) => DeviceState::Virtio(v.transport.save(())?),
    }))
}

fn restore_state(device: &Device, state: Option<&DeviceState>) -> Result<(), PersistError> {
    match (&device.handle, state) {
        (DeviceHandle::Bus, None) => Ok(()),
        (DeviceHandle::Serial(s), Some(DeviceState::Serial(r))) => s.restore((), r),
        (DeviceHandle::Keyboard(k), Some(DeviceState::Keyboard(r))) => k.restore((), r),
        (DeviceHandle::Power(p), Some(DeviceState::Power(r))) => p.restore((), r),
        (DeviceHandle::Virtio(v), Some(DeviceState::Virtio(t))) => v.transport.restore((), t),
        (_, state) => Err(PersistError(format!("its saved state ({state:?}) is not this device's"))),
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
