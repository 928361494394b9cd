//! Firecracker's MMDS endpoints: `PUT /mmds/config` (which NICs answer it, where, which
//! version) before boot, and `PUT`/`PATCH`/`GET /mmds` (the document) at any time; the
//! running NICs read the same store, so a change is seen by the guest's next request.

use super::model::{MmdsConfig, MmdsVersion};
use super::vm::{Fault, Vm};
use exitless_vmm::net::mmds::{Version, DEFAULT_ADDRESS};
use exitless_vmm::sync::lock;
use serde_json::Value;
use std::net::Ipv4Addr;

impl Vm {
    /// `PUT /mmds/config`.
    pub fn set_mmds_config(&mut self, c: MmdsConfig) -> Result<(), Fault> {
        self.pre_boot()?;
        if c.network_interfaces.is_empty() {
            return Err(Fault(
                "The list of network interface IDs that allow forwarding MMDS requests is empty.".into(),
            ));
        }
        if let Some(id) =
            c.network_interfaces.iter().find(|id| !self.config.network_interfaces.iter().any(|n| &&n.iface_id == id))
        {
            return Err(Fault(format!(
                "The list of network interface IDs provided contains at least one ID that does not correspond to any \
                 existing network interface: {id}."
            )));
        }
        if c.ipv4_address.is_some_and(|ip| !ip.is_link_local()) {
            return Err(Fault("The MMDS IPv4 address is not link local.".into()));
        }
        let mut store = lock(&self.mmds);
        store.version = match c.version {
            MmdsVersion::V1 => Version::V1,
            MmdsVersion::V2 => Version::V2,
        };
        store.imds_compat = c.imds_compat;
        drop(store);
        self.config.mmds_config = Some(c);
        Ok(())
    }

    /// `PUT /mmds`: the whole document.
    pub fn put_mmds(&self, value: Value) -> Result<(), Fault> {
        Ok(lock(&self.mmds).put(value)?)
    }

    /// `PATCH /mmds`: a JSON merge patch on the document.
    pub fn patch_mmds(&self, patch: Value) -> Result<(), Fault> {
        Ok(lock(&self.mmds).patch(&patch)?)
    }

    /// `GET /mmds`. Once started, a microVM with no NIC answering MMDS has no store, as in
    /// Firecracker (whatever was put before the start).
    pub fn mmds(&self) -> Result<Value, Fault> {
        if !matches!(self.state, super::vm::State::NotStarted) && self.config.mmds_config.is_none() {
            return Err(Fault("MMDS error: The MMDS data store is not initialized.".into()));
        }
        Ok(lock(&self.mmds).document())
    }

    /// The address MMDS answers at on `iface_id`, if that NIC answers it.
    pub fn mmds_on(&self, iface_id: &str) -> Option<Ipv4Addr> {
        let c = self.config.mmds_config.as_ref()?;
        c.network_interfaces.iter().any(|id| id == iface_id).then(|| c.ipv4_address.unwrap_or(DEFAULT_ADDRESS))
    }
}
