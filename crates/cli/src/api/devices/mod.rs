//! The API's devices that live in files of their own (the balloon, pmem, memory hotplug,
//! virtio-fs):
//! each holds its endpoints, its configuration's checks, its operations on the running
//! device, what it attaches and the host files it is given. This file is the one list a
//! new device joins: routes.rs, the builder, a configuration file and the Landlock
//! policy ask it, and know no device here by name.

mod balloon;
mod fs;
mod hotplug;
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

type Route = fn(&mut Vm, &str, &[&str], &[u8]) -> Answer;

/// Each device's endpoints, asked in turn.
const ROUTES: &[Route] = &[balloon::route, pmem::route, hotplug::route, fs::route, plug::route, vublk::route];

/// The answer of the device whose endpoint `method` `parts` is, if any.
pub fn route(vm: &mut Vm, method: &str, parts: &[&str], body: &[u8]) -> Answer {
    ROUTES.iter().find_map(|r| r(vm, method, parts, body))
}

impl Vm {
    /// What these devices attach, in the order they are placed (after the NICs, drives,
    /// entropy and vsock devices), and the words they add to a booted guest's command
    /// line (a pmem root device's `root=`).
    pub(super) fn device_attaches(&self) -> (Vec<Attach>, Vec<String>) {
        let (mut devices, mut words) = (Vec::new(), Vec::new());
        pmem::attach(self, &mut devices, &mut words);
        balloon::attach(self, &mut devices);
        fs::attach(self, &mut devices);
        (devices, words)
    }

    /// A configuration file's settings of these devices (`--config-file`), as their PUTs
    /// would make them, in Firecracker's order; each taken out of `c`.
    pub(super) fn configure_devices(&mut self, c: &mut VmConfig) -> Result<(), Fault> {
        balloon::configure(self, c)?;
        pmem::configure(self, c)?;
        hotplug::configure(self, c)?;
        fs::configure(self, c)
    }

    /// Whether guest RAM must be shared with a device's backend process (vhost-user).
    pub(super) fn shared_memory(&self) -> bool {
        fs::shares_memory(self) || vublk::shares_memory(self)
    }

    /// The host files these devices were given, for the Landlock policy.
    pub(super) fn device_files(&self) -> Vec<(PathBuf, Reach)> {
        let mut rules = Vec::new();
        pmem::files(self, &mut rules);
        rules
    }
}
