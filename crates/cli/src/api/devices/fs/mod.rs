//! `PUT /fs/{fs_id}` and `GET /fs/{fs_id}`: virtio-fs devices on a vhost-user backend's
//! socket (virtiofsd), an exitless extension beside Firecracker's API with Cloud
//! Hypervisor's `--fs` names; in the configuration file's `fs` list and `GET /vm/config`.
//! A GET on a running machine says whether the device's backend failed, and why.
//! Everything of the device is in this folder: its configuration (config.rs), its
//! `exitless run --fs` flag (run.rs) and the virtiofsd it starts (virtiofsd.rs); the
//! shared files know it only by the lines that list it (devices/mod.rs, devices/parts.rs).

pub mod config;
pub mod run;
pub mod virtiofsd;

use super::{Answer, Device};
use crate::api::request::{check_id, parse};
use crate::api::vm::{Fault, Vm};
use config::Fs;
use exitless_vmm::device_manager::Attach;
use exitless_vmm::virtio::fs::FsConfig;

/// The device's entry in the list of devices/mod.rs.
pub const DEVICE: Device = Device { route, configure, shares_memory, ..Device::NONE };

/// The fs devices' endpoints.
fn route(vm: &mut Vm, method: &str, parts: &[&str], body: &[u8]) -> Answer {
    let id = match parts {
        ["fs", id] => *id,
        _ => return None,
    };
    Some(match method {
        "PUT" => check_id(id).and_then(|id| vm.set_fs(id, parse(body)?).map(|()| None)),
        "GET" => check_id(id).and_then(|id| vm.fs_status(id).map(Some)),
        _ => return None,
    })
}

/// The fs devices the machine is built with.
pub(super) fn attach(vm: &Vm, devices: &mut Vec<Attach>, _words: &mut Vec<String>) {
    devices.extend(vm.config.devices.fs.iter().map(|f| exitless_vmm::virtio::fs::attach(vmm_config(f))));
}

/// Whether any is configured: its backend maps guest memory.
fn shares_memory(vm: &Vm) -> bool {
    !vm.config.devices.fs.is_empty()
}

/// A configuration file's fs devices, as their PUTs.
fn configure(vm: &mut Vm, c: &mut crate::api::model::VmConfig) -> Result<(), Fault> {
    for f in std::mem::take(&mut c.devices.fs) {
        let id = f.fs_id.clone();
        vm.set_fs(&id, f)?;
    }
    Ok(())
}

fn vmm_config(f: &Fs) -> FsConfig {
    FsConfig {
        id: f.fs_id.clone(),
        tag: f.tag.clone(),
        socket: f.socket.clone().into(),
        num_request_queues: f.num_request_queues,
        queue_size: f.queue_size,
    }
}

impl Vm {
    /// `PUT /fs/{fs_id}`: a device (again: its new settings), before boot; checked here
    /// (the tag, the queues), its socket connected at the start.
    pub fn set_fs(&mut self, id: &str, f: Fs) -> Result<(), Fault> {
        self.pre_boot()?;
        if f.fs_id != id {
            return Err(Fault("The id from the path does not match the id from the body!".into()));
        }
        vmm_config(&f).validate().map_err(Fault)?;
        if self.config.devices.fs.iter().any(|o| o.tag == f.tag && o.fs_id != id) {
            return Err(Fault(format!("virtio-fs: another device already has the tag {:?}", f.tag)));
        }
        if self.config.machine_config.huge_pages.as_deref().is_some_and(|h| h != "None") {
            return Err(Fault("virtio-fs: huge_pages and a vhost-user device together are not supported".into()));
        }
        match self.config.devices.fs.iter_mut().find(|o| o.fs_id == id) {
            Some(old) => *old = f,
            None => self.config.devices.fs.push(f),
        }
        Ok(())
    }

    /// `GET /fs/{fs_id}`: its configuration, and on a running machine its backend's state
    /// (`running`, or `failed` with the reason).
    pub fn fs_status(&self, id: &str) -> Result<serde_json::Value, Fault> {
        let Some(f) = self.config.devices.fs.iter().find(|f| f.fs_id == id) else {
            return Err(Fault(format!("virtio-fs: no device {id:?}")));
        };
        let mut json = serde_json::to_value(f).map_err(|e| Fault(e.to_string()))?;
        let Ok(machine) = self.running("") else {
            json["state"] = "not started".into();
            return Ok(json);
        };
        let devices = machine.devices();
        let handle = devices.fs(id).map_err(|e| Fault(e.to_string()))?;
        match handle.health.failure() {
            Some(why) => {
                json["state"] = "failed".into();
                json["error"] = why.into();
            }
            None => json["state"] = "running".into(),
        }
        Ok(json)
    }
}
