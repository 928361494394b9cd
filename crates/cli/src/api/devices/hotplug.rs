//! Firecracker's memory hotplug endpoints (v1.16.1's `vmm_config/memory_hotplug.rs` and
//! `rpc_interface.rs`): `PUT /hotplug/memory` before the start, `PATCH` (the requested
//! size) and `GET` (the device's status) on a running microVM.

use super::{Answer, Device};
use crate::api::model::{MemoryHotplug, MemoryHotplugUpdate};
use crate::api::request::parse;
use crate::api::vm::{Fault, Vm};
use exitless_vmm::virtio::mem::MemError;
use serde_json::{json, Value};

/// The device's entry in the list of devices/mod.rs.
pub const DEVICE: Device = Device { route, configure, ..Device::NONE };

/// A configuration file's hotpluggable memory, as its PUT.
fn configure(vm: &mut Vm, c: &mut crate::api::model::VmConfig) -> Result<(), Fault> {
    c.memory_hotplug.take().map_or(Ok(()), |m| vm.set_memory_hotplug(m))
}

/// The memory hotplug endpoints.
fn route(vm: &mut Vm, method: &str, parts: &[&str], body: &[u8]) -> Answer {
    let done = |r: Result<(), Fault>| r.map(|()| None);
    Some(match (method, parts) {
        ("PUT", ["hotplug", "memory"]) => parse(body).and_then(|m| done(vm.set_memory_hotplug(m))),
        ("GET", ["hotplug", "memory"]) => vm.memory_hotplug_status().map(Some),
        ("PATCH", ["hotplug", "memory"]) => parse(body).and_then(|u| done(vm.update_memory_hotplug(u))),
        _ => return None,
    })
}

impl Vm {
    /// `PUT /hotplug/memory`: the region the guest may plug from, before boot.
    pub fn set_memory_hotplug(&mut self, m: MemoryHotplug) -> Result<(), Fault> {
        self.pre_boot()?;
        hotplug_device(m).validate().map_err(|e| Fault(format!("Memory hotplug config error: {e}")))?;
        self.config.memory_hotplug = Some(m);
        Ok(())
    }

    /// `GET /hotplug/memory`: sizes in MiB, what the driver plugged and what was asked.
    pub fn memory_hotplug_status(&self) -> Result<Value, Fault> {
        let machine = self.running("the memory hotplug status is read on a running one")?;
        let s = machine.devices().hotplug_memory().map_err(|e| Fault(format!("Internal VMM error: {e}")))?;
        Ok(json!({
            "block_size_mib": s.block_size_mib,
            "total_size_mib": s.total_size_mib,
            "slot_size_mib": s.slot_size_mib,
            "plugged_size_mib": s.plugged_size_mib,
            "requested_size_mib": s.requested_size_mib,
        }))
    }

    /// `PATCH /hotplug/memory`: a new requested size; the driver plugs or unplugs toward it.
    pub fn update_memory_hotplug(&mut self, u: MemoryHotplugUpdate) -> Result<(), Fault> {
        let machine = self.running("hotpluggable memory is resized on a running one")?;
        machine.devices().set_hotplug_memory(u.requested_size_mib).map_err(|e| {
            // Firecracker wraps the device's own errors once more (VmmError::VirtioMem).
            let e = match e {
                MemError::NoDevice => e.to_string(),
                _ => format!("Failed to create memory hotplug device: {e}"),
            };
            Fault(format!("Memory hotplug update error: {e}"))
        })
    }

    /// The hotpluggable memory the machine is built with.
    pub(in crate::api) fn memory_hotplug(&self) -> Option<exitless_vmm::MemoryHotplug> {
        self.config.memory_hotplug.map(hotplug_device)
    }
}

fn hotplug_device(m: MemoryHotplug) -> exitless_vmm::MemoryHotplug {
    exitless_vmm::MemoryHotplug {
        total_size_mib: m.total_size_mib,
        block_size_mib: m.block_size_mib,
        slot_size_mib: m.slot_size_mib,
    }
}
