//! The devices whose modules own their part of the API (the balloon, pmem, memory
//! hotplug, device hotplug, virtio-fs): each holds its endpoints, its configuration's
//! checks, its operations on the running device, what it attaches and the host files it
//! is given, and gives them here: one [`Device`] entry and its attach. This file holds the
//! lists a new device joins (with its types in parts.rs; a `DEVICE` or `attach` left out
//! is dead code, which the build refuses): routes.rs, the builder, a configuration file and
//! the Landlock policy ask it, and know no device here by name.

mod balloon;
mod fs;
mod hotplug;
pub mod parts;
pub mod plug;
mod pmem;
mod vublk;

use super::model::VmConfig;
use super::vm::{Fault, Vm};
use exitless_vmm::device_manager::Attach;
use exitless_vmm::landlock::Reach;
use serde_json::Value;
use std::path::PathBuf;

/// A device's answer to a request: None if it is not one of its endpoints; else 204 (no
/// body) or 200 with the body, or the fault.
pub type Answer = Option<Result<Option<Value>, Fault>>;

/// What a device module gives the API; what it does not do is left as [`Device::NONE`]'s.
pub struct Device {
    /// Its endpoints: the answer if `method` `parts` is one of them.
    pub route: fn(&mut Vm, &str, &[&str], &[u8]) -> Answer,
    /// A configuration file's settings of it, as its PUTs would make them, taken out of
    /// the file's configuration.
    pub configure: fn(&mut Vm, &mut VmConfig) -> Result<(), Fault>,
    /// The host files it was given, for the Landlock policy.
    pub files: fn(&Vm, &mut Vec<(PathBuf, Reach)>),
    /// Whether guest RAM must be shared with its backend process (vhost-user).
    pub shares_memory: fn(&Vm) -> bool,
}

impl Device {
    /// A device with none of these.
    pub const NONE: Device =
        Device { route: |_, _, _, _| None, configure: |_, _| Ok(()), files: |_, _| {}, shares_memory: |_| false };
}

/// Every device here, in the order a configuration file's settings are taken
/// (Firecracker's) and endpoints are asked.
const DEVICES: &[&Device] =
    &[&balloon::DEVICE, &pmem::DEVICE, &hotplug::DEVICE, &fs::DEVICE, &plug::DEVICE, &vublk::DEVICE];

/// What a device attaches as the machine is built, and words for a booted guest's command
/// line (a pmem root device's `root=`).
type Place = fn(&Vm, &mut Vec<Attach>, &mut Vec<String>);

/// Each device's attach, in the order they take their PCI slots (after the NICs, drives,
/// entropy and vsock devices), the order machines have always had; not in `Device`, so a
/// device's attach left out of this list is dead code, which the build refuses.
const PLACED: &[Place] = &[pmem::attach, balloon::attach, fs::attach];

/// The answer of the device whose endpoint `method` `parts` is, if any.
pub fn route(vm: &mut Vm, method: &str, parts: &[&str], body: &[u8]) -> Answer {
    DEVICES.iter().find_map(|d| (d.route)(vm, method, parts, body))
}

impl Vm {
    /// What these devices attach, in the order they are placed, and the words they add to
    /// a booted guest's command line.
    pub(super) fn device_attaches(&self) -> (Vec<Attach>, Vec<String>) {
        let (mut devices, mut words) = (Vec::new(), Vec::new());
        PLACED.iter().for_each(|place| place(self, &mut devices, &mut words));
        (devices, words)
    }

    /// A configuration file's settings of these devices (`--config-file`), as their PUTs
    /// would make them, in Firecracker's order; each taken out of `c`.
    pub(super) fn configure_devices(&mut self, c: &mut VmConfig) -> Result<(), Fault> {
        DEVICES.iter().try_for_each(|d| (d.configure)(self, c))
    }

    /// The hotplug worker, which plugging, unplugging and a vhost-user drive's PATCH run on.
    fn worker(&self) -> Result<&crate::api::plug_worker::Worker, Fault> {
        self.plug_worker.as_ref().ok_or_else(|| Fault("The hotplug worker is not running.".into()))
    }

    /// Whether the running machine may ever give the hotplug worker a job: on PCI it plugs
    /// and unplugs devices; a vhost-user drive's PATCH runs there on any transport.
    pub(super) fn needs_plug_worker(&self) -> bool {
        plug::on_pci(self) || vublk::configured(self)
    }

    /// Whether guest RAM must be shared with a device's backend process (vhost-user).
    pub(super) fn shared_memory(&self) -> bool {
        DEVICES.iter().any(|d| (d.shares_memory)(self))
    }

    /// The host files these devices were given, for the Landlock policy.
    pub(super) fn device_files(&self) -> Vec<(PathBuf, Reach)> {
        let mut rules = Vec::new();
        DEVICES.iter().for_each(|d| (d.files)(self, &mut rules));
        rules
    }
}
