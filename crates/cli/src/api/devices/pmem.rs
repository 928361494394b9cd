//! Firecracker's `/pmem/{id}` (v1.16.1's `vmm_config/pmem.rs` and its builder): virtio-pmem
//! devices before the start, their rate limiters after it; a root device puts
//! `root=/dev/pmemN ro|rw` on the command line as Firecracker's builder does.

use super::{Answer, Device};
use crate::api::model::{Pmem, PmemUpdate};
use crate::api::request::{check_id, parse};
use crate::api::vm::{Fault, Vm};
use exitless_vmm::device_manager::Attach;
use exitless_vmm::landlock::Reach;
use exitless_vmm::virtio::pmem::PmemConfig;
use std::path::PathBuf;

/// The device's entry in the list of devices/mod.rs.
pub const DEVICE: Device = Device { route, configure, files, ..Device::NONE };

/// The pmem devices' endpoints.
fn route(vm: &mut Vm, method: &str, parts: &[&str], body: &[u8]) -> Answer {
    let done = |r: Result<(), Fault>| r.map(|()| None);
    let id = match parts {
        ["pmem", id] => *id,
        _ => return None,
    };
    Some(match method {
        "PUT" => check_id(id).and_then(|id| done(vm.set_pmem(id, parse(body)?))),
        "PATCH" => check_id(id).and_then(|id| done(vm.update_pmem(id, parse(body)?))),
        _ => return None,
    })
}

/// The pmem devices the machine is built with, and the root device's command-line words.
pub(super) fn attach(vm: &Vm, devices: &mut Vec<Attach>, words: &mut Vec<String>) {
    let (pmems, root) = vm.pmem_devices();
    devices.extend(pmems.into_iter().map(exitless_vmm::virtio::pmem::attach));
    words.extend(root);
}

/// Their files, for the Landlock policy.
fn files(vm: &Vm, rules: &mut Vec<(PathBuf, Reach)>) {
    for p in &vm.config.pmem {
        rules.push((PathBuf::from(&p.path_on_host), if p.read_only { Reach::Read } else { Reach::Write }));
    }
}

/// A configuration file's pmem devices, as their PUTs.
fn configure(vm: &mut Vm, c: &mut crate::api::model::VmConfig) -> Result<(), Fault> {
    for p in std::mem::take(&mut c.pmem) {
        let id = p.id.clone();
        vm.set_pmem(&id, p)?;
    }
    Ok(())
}

impl Vm {
    /// `PUT /pmem/{id}`: a device (again: its new settings), before boot. As in
    /// Firecracker, the file is opened at the start (a missing or empty one fails it).
    pub fn set_pmem(&mut self, id: &str, p: Pmem) -> Result<(), Fault> {
        let running = matches!(self.state, crate::api::vm::State::Running { .. });
        if !running {
            self.pre_boot()?;
        }
        if p.id != id {
            return Err(Fault("The id from the path does not match the id from the body!".into()));
        }
        if running {
            return self.plug_pmem(id, p);
        }
        if p.root_device && self.config.drives.iter().any(|d| d.is_root_device) {
            return Err(Fault(
                "Pmem config error: Attempt to add pmem as a root device while the root device defined as a block device"
                    .into(),
            ));
        }
        let other_root = self.config.pmem.iter().any(|o| o.root_device && o.id != id);
        if p.root_device && other_root {
            return Err(Fault("Pmem config error: A root pmem device already exist".into()));
        }
        match self.config.pmem.iter_mut().find(|o| o.id == id) {
            Some(old) => *old = p,
            None => self.config.pmem.push(p),
        }
        Ok(())
    }

    /// `PUT /pmem/{id}` on a running microVM: a hotplug (never a root device).
    fn plug_pmem(&mut self, id: &str, p: Pmem) -> Result<(), Fault> {
        if self.config.pmem.iter().any(|o| o.id == id) {
            return Err(Fault(format!("Device ID in use: the microVM has a pmem device {id} already.")));
        }
        if p.root_device {
            return Err(Fault("Pmem config error: A root pmem device already exist".into()));
        }
        let config = PmemConfig {
            id: p.id.clone(),
            path: p.path_on_host.clone().into(),
            read_only: p.read_only,
            limits: crate::api::model::limits(p.rate_limiter.as_ref()),
        };
        let plugged = super::plug::Plugged::Pmem;
        self.plug(plugged, id, move |dm| dm.attach_pmem(&config).map_err(|e| crate::with_causes(&e)))?;
        self.config.pmem.push(p);
        Ok(())
    }

    /// `PATCH /pmem/{id}`: new rate limits for a running guest's flushes.
    pub fn update_pmem(&mut self, id: &str, u: PmemUpdate) -> Result<(), Fault> {
        if u.id != id {
            return Err(Fault("The id from the path does not match the id from the body!".into()));
        }
        let machine = self.running("pmem devices are updated on a running one")?.clone();
        let devices = machine.devices();
        let pmem = devices.pmem(id).map_err(|e| {
            Fault(format!(
                "Pmem config error: Unable to patch the pmem device: {e} Please verify the request arguments."
            ))
        })?;
        pmem.limits.set(crate::api::model::limits(u.rate_limiter.as_ref()));
        if let Some(p) = self.config.pmem.iter_mut().find(|p| p.id == id) {
            p.rate_limiter = u.rate_limiter;
        }
        Ok(())
    }

    /// The pmem devices the machine is built with, and the command line's root words.
    fn pmem_devices(&self) -> (Vec<PmemConfig>, Option<String>) {
        let root = self.config.pmem.iter().position(|p| p.root_device).map(|i| {
            let mode = if self.config.pmem[i].read_only { "ro" } else { "rw" };
            format!("root=/dev/pmem{i} {mode}")
        });
        let devices = self
            .config
            .pmem
            .iter()
            .map(|p| PmemConfig {
                id: p.id.clone(),
                path: p.path_on_host.clone().into(),
                read_only: p.read_only,
                limits: crate::api::model::limits(p.rate_limiter.as_ref()),
            })
            .collect();
        (devices, root)
    }
}
