//! vhost-user-blk drives: `PUT /drives/{id}` with `socket`, as Firecracker v1.16.1 takes
//! it (src/vmm/src/devices/virtio/block/vhost_user/device.rs): path_on_host, is_read_only,
//! rate_limiter and io_engine must be absent; the backend is connected and its handshake
//! done when the drive is configured (a refusal is the PUT's 400, in Firecracker's words),
//! the connection kept for the start. `PATCH /drives/{id}` with only the id reads its
//! configuration space again (the capacity changed); `GET /drives/{id}` (an exitless
//! extension) says whether its backend failed, and why; the metrics are Firecracker's
//! `vhost_user_block_<id>`. A PUT on a running microVM plugs one (PCI, as other drives).

use super::Answer;
use crate::api::metrics::Sample;
use crate::api::model::{Drive, PartialDrive};
use crate::api::request::check_id;
use crate::api::vm::{Fault, Vm};
use exitless_vmm::device_manager::Attach;
use exitless_vmm::virtio::vhost_user::BackendError;
use exitless_vmm::virtio::vublk::{self, VublkConfig};
use exitless_vmm::Machine;
use std::sync::Arc;

/// Firecracker's chain of errors for a drive it cannot make (VmmActionError::DriveConfig,
/// DriveError::CreateBlockDevice).
const CANNOT_CREATE: &str = "Drive config error: Unable to create the virtio block device:";

fn config(d: &Drive) -> VublkConfig {
    VublkConfig {
        id: d.drive_id.clone(),
        socket: d.socket.clone().unwrap_or_default().into(),
        writeback: d.cache_type.as_deref() == Some("Writeback"),
    }
}

/// Firecracker's words for a backend it could not connect to or shake hands with.
fn backend_fault(e: &BackendError) -> Fault {
    let why = match e {
        BackendError::Connect { source, .. } => format!("Failed to connect to UDS Unix stream: {source}"),
        other => other.to_string(),
    };
    Fault(format!("{CANNOT_CREATE} Vhost user backend error: Vhost-user error: {why}"))
}

/// What vhost-user drives add to the API: their state, and RAM shared with their backends.
pub const DEVICE: super::Device = super::Device { route, shares_memory: configured, ..super::Device::NONE };

/// `GET /drives/{id}`: a drive's configuration, and on a running machine whether a
/// vhost-user drive's backend failed, and why.
fn route(vm: &mut Vm, method: &str, parts: &[&str], _body: &[u8]) -> Answer {
    match (method, parts) {
        ("GET", ["drives", id]) => Some(check_id(id).and_then(|id| vm.drive_status(id)).map(Some)),
        _ => None,
    }
}

/// Whether any drive is a vhost-user one (its backend maps guest memory).
pub(super) fn configured(vm: &Vm) -> bool {
    vm.config.drives.iter().any(|d| d.socket.is_some())
}

impl Vm {
    /// The vhost-user drives' counters, under Firecracker's `vhost_user_block_<id>`.
    pub(in crate::api) fn sample_vublk(machine: &Machine, sample: &mut Sample) {
        for d in machine.devices().vublks() {
            sample.vhost_user(&format!("block_{}", d.id), &d.metrics.fields());
        }
    }

    /// What vhost-user drive `d` attaches: its backend's connection if it has one (a
    /// snapshot's load connects again).
    pub(in crate::api) fn attach_vublk(&self, d: &Drive) -> Attach {
        vublk::attach(config(d), self.vublk.pending(&d.drive_id))
    }

    /// `PATCH /drives/{id}` of a vhost-user drive, or with neither a file nor limits
    /// (Firecracker's `update_vhost_user_block_config`, refused for a file drive). The
    /// backend is asked on the hotplug worker: the API thread's filter has no sendmsg.
    pub(in crate::api) fn update_vhost_user_drive(
        &self,
        machine: Arc<Machine>,
        id: &str,
        p: PartialDrive,
    ) -> Result<(), Fault> {
        let patch = |why: String| {
            Fault(format!(
                "Drive config error: Unable to patch the block device: {why} Please verify the request arguments."
            ))
        };
        let vhost_user = self.config.drives.iter().any(|d| d.drive_id == id && d.socket.is_some());
        if !vhost_user || p.path_on_host.is_some() || p.rate_limiter.is_some() {
            return Err(patch("Block: Running method expected different backend.".into()));
        }
        let worker = self.worker()?;
        let drive = id.to_string();
        let updated = worker.run(move || machine.devices().update_vublk_config(&drive))?;
        updated.map_err(|e| patch(format!("{id}: {e}.")))
    }

    /// `PUT /drives/{id}` with a `socket` (or with neither it nor path_on_host): checked
    /// as Firecracker checks it, then the backend connected and its handshake done.
    pub(in crate::api) fn set_vhost_user_drive(&mut self, id: &str, d: Drive, running: bool) -> Result<(), Fault> {
        let others_root = self.config.drives.iter().any(|o| o.is_root_device && o.drive_id != id);
        if d.is_root_device && (others_root || running) {
            return Err(Fault("Drive config error: A root block device already exists!".into()));
        }
        let Some(socket) = d.socket.as_deref() else {
            return Err(Fault(format!("{CANNOT_CREATE} Invalid block config.")));
        };
        let extra = d.path_on_host.is_some() || d.is_read_only.is_some() || d.rate_limiter.is_some();
        if extra || d.io_engine.is_some() || socket.is_empty() {
            return Err(Fault(format!("{CANNOT_CREATE} Invalid block config.")));
        }
        if running && self.config.drives.iter().any(|o| o.drive_id == id) {
            return Err(Fault(format!("Device ID in use: the microVM has a drive {id} already.")));
        }
        if self.config.machine_config.huge_pages.as_deref().is_some_and(|h| h != "None") {
            return Err(Fault("vhost-user-blk: huge_pages and a vhost-user device together are not supported".into()));
        }
        // A drive configured again lets its old backend go before the new one connects.
        self.vublk.forget(id);
        let config = config(&d);
        if running {
            return self.plug_vhost_user_drive(d, config);
        }
        let connection = vublk::connect(&config).map_err(|e| backend_fault(&e))?;
        self.vublk.keep(id, connection);
        match self.config.drives.iter_mut().find(|o| o.drive_id == id) {
            Some(old) => *old = d,
            None => self.config.drives.push(d),
        }
        Ok(())
    }

    /// A vhost-user drive plugged into the running microVM (its memory must be shared:
    /// booted with a vhost-user device), its backend connected on the hotplug worker (the
    /// API thread's filter has no socket(2)).
    fn plug_vhost_user_drive(&mut self, d: Drive, config: VublkConfig) -> Result<(), Fault> {
        let id = d.drive_id.clone();
        self.plug(super::plug::Plugged::Drive, &id, move |dm| {
            dm.attach_vublk(&config, None).map_err(|e| crate::with_causes(&e))
        })?;
        self.config.drives.push(d);
        Ok(())
    }

    /// `GET /drives/{id}`: the drive's configuration, and on a running machine its state
    /// (`running`, or `failed` with the reason, for a vhost-user drive).
    fn drive_status(&self, id: &str) -> Result<serde_json::Value, Fault> {
        let Some(d) = self.config.drives.iter().find(|d| d.drive_id == id) else {
            return Err(Fault(format!("No drive with id {id}.")));
        };
        let mut json = serde_json::to_value(d).map_err(|e| Fault(e.to_string()))?;
        let Ok(machine) = self.running("") else {
            json["state"] = "not started".into();
            return Ok(json);
        };
        json["state"] = "running".into();
        if d.socket.is_some() {
            let devices = machine.devices();
            let handle = devices.vublk(id).map_err(|e| Fault(e.to_string()))?;
            if let Some(why) = handle.health.failure() {
                json["state"] = "failed".into();
                json["error"] = why.into();
            }
        }
        Ok(json)
    }
}
