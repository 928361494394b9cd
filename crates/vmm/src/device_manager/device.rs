//! One attached device as the device manager keeps it, whatever the device: what it is
//! (a kind its own module names), what it is called, where it is, and how the VMM reaches
//! it besides the buses. A new device type needs nothing new here: its module names its
//! kind, hands over what its users reach it by, and its part of a snapshot.

use super::VirtioTransport;
use crate::bus::DeviceId;
use crate::pci::BarSpec;
use crate::persist::DeviceSnapshot;
use std::any::Any;
use std::sync::Arc;

/// What a device is, as its module names it (`virtio-net`, `serial`); a state file
/// records it, and a restore finds the same kind under the same id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceKind(pub &'static str);

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Where a device answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Ports {
        base: u16,
        len: u64,
    },
    Mmio {
        base: u64,
        len: u64,
    },
    PciSlot(u8),
    /// A BAR's first placement (the guest may move it).
    Bar {
        index: u8,
        base: u64,
    },
    Irq(u32),
    /// Device memory past the 64-bit window (a virtio-pmem file's region).
    Memory {
        base: u64,
        len: u64,
    },
}

/// What a device is called: `id` in a snapshot (the API's id where it has one, as
/// `virtio-net/eth0`, so a restore finds it by the name its client knows; a fixed name
/// for the rest), `label` in the exit profile and the logs (`virtio-net1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceName {
    pub id: String,
    pub label: String,
}

impl DeviceName {
    /// `kind`'s device called `id` by its configuration (`kind/id`), else by `label`.
    pub fn keyed(kind: DeviceKind, id: Option<&str>, label: String) -> DeviceName {
        let id = id.map_or_else(|| label.clone(), |id| format!("{kind}/{id}"));
        DeviceName { id, label }
    }
}

impl From<&str> for DeviceName {
    fn from(name: &str) -> DeviceName {
        DeviceName { id: name.into(), label: name.into() }
    }
}

/// A device's part of a snapshot.
#[derive(Clone)]
pub enum Saves {
    /// Nothing of its own: only where it is.
    Nothing,
    /// Its state, typed and versioned by the device.
    State(Arc<dyn DeviceSnapshot>),
    /// Not part of the machine a snapshot saves: there or not in either process alike
    /// (Firecracker's boot timer, the VMM's own stopwatch).
    Excluded,
    /// A machine with it cannot be snapshotted, for this reason.
    Refused(&'static str),
}

/// How the VMM reaches a device besides the buses: what its users hold (an
/// `Arc<Serial>`, a virtio-net device's `NetHandle`), found by type with
/// [`super::DeviceManager::find`]; its part of a snapshot; a virtio device's transport.
pub struct DeviceHandle {
    users: Option<Box<dyn Any + Send + Sync>>,
    saves: Saves,
    transport: Option<VirtioTransport>,
    /// What its module undoes when it is unplugged from a running guest (a pmem
    /// device's memory slot).
    unplug: Option<Unplugged>,
}

/// What a device's module undoes at its unplug.
pub type Unplugged = Box<dyn FnOnce() + Send + Sync>;

impl DeviceHandle {
    /// Reached only through the buses, with nothing to save but where it is.
    pub fn bus() -> DeviceHandle {
        DeviceHandle { users: None, saves: Saves::Nothing, transport: None, unplug: None }
    }

    /// Reached by `users` too (found by its type).
    pub fn reached_by(users: impl Any + Send + Sync) -> DeviceHandle {
        DeviceHandle { users: Some(Box::new(users)), ..DeviceHandle::bus() }
    }

    /// A virtio device over `transport`, which its snapshot saves (with the device's own
    /// state), reached by `users`.
    pub fn virtio(transport: VirtioTransport, users: impl Any + Send + Sync) -> DeviceHandle {
        let saves = Saves::State(Arc::new(transport.clone()));
        DeviceHandle { users: Some(Box::new(users)), saves, transport: Some(transport), unplug: None }
    }

    /// With `saves` as its part of a snapshot.
    pub fn saving(self, saves: Saves) -> DeviceHandle {
        DeviceHandle { saves, ..self }
    }

    pub fn set_saves(&mut self, saves: Saves) {
        self.saves = saves;
    }

    /// Has `undo` run when the device is unplugged from a running guest.
    pub fn on_unplug(&mut self, undo: Unplugged) {
        self.unplug = Some(undo);
    }

    /// Runs what its module undoes at an unplug.
    pub(super) fn unplugged(&mut self) {
        if let Some(undo) = self.unplug.take() {
            undo();
        }
    }

    /// What its users reach it by, if that is a `T`.
    pub fn users<T: 'static>(&self) -> Option<&T> {
        self.users.as_ref().and_then(|u| u.downcast_ref())
    }

    pub fn saves(&self) -> &Saves {
        &self.saves
    }

    /// A virtio device's transport.
    pub fn transport(&self) -> Option<&VirtioTransport> {
        self.transport.as_ref()
    }
}

/// One attached device.
pub struct Device {
    /// What the exit profile and the logs call it.
    pub name: String,
    /// What a snapshot calls it ([`DeviceName::id`]).
    pub id: String,
    pub kind: DeviceKind,
    pub resources: Vec<Resource>,
    pub handle: DeviceHandle,
}

/// A PCI function's place: its slot and, per BAR asked for, the bus id and address.
pub struct PciPlacement {
    pub slot: u8,
    pub bars: Vec<(DeviceId, u64)>,
}

/// A BAR a PCI device asks for: anywhere in its window, or at an address its guest knows.
pub struct BarRequest {
    /// What the exit profile calls accesses to it (the device's name if empty).
    pub label: &'static str,
    pub spec: BarSpec,
    pub at: Option<u64>,
}
