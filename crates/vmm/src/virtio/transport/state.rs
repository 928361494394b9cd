//! A virtio transport in a snapshot: what the driver wrote (features, vectors, each
//! queue's registers), where each queue stands, the status and ISR bytes, and for PCI the
//! MSI-X table. Saving pauses the device first, so nothing is in flight and the rings in
//! guest memory agree with the positions saved. A restore puts it all back on a transport
//! built from the same configuration, and the device starts where it stood once the vCPUs
//! exist (an interrupt sent before their interrupt state is back would be lost).

use super::{Link, Transport};
use crate::pci::msix::MsixState;
use crate::persist::{DeviceState, PersistError, Saved, StateFault};
use crate::virtio::{QueuePosition, NO_VECTOR, STATUS_DRIVER_OK};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportState {
    pub device_type: u16,
    pub status: u8,
    pub isr: u8,
    pub device_feature_select: u32,
    pub driver_feature_select: u32,
    pub driver_features: u64,
    pub config_vector: u16,
    pub queue_select: u16,
    pub config_generation: u8,
    /// Whether the device ran (DRIVER_OK, and not broken since).
    pub active: bool,
    pub queues: Vec<QueueState>,
    /// PCI's MSI-X table and pending bits (none on MMIO).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub msix: Option<MsixState>,
    /// What the device holds beyond its queues (`VirtioDevice::save_state`), at its own
    /// version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<Saved>,
}

impl DeviceState for TransportState {
    const VERSION: u32 = 1;
}

/// One queue: the driver's registers and, if the device ran, where it stood.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueState {
    pub size: u16,
    pub enabled: bool,
    pub desc: u64,
    pub driver: u64,
    pub device: u64,
    pub vector: u16,
    pub position: Option<QueuePosition>,
}

impl Transport {
    /// Reads the transport of a paused device (or one that never ran). The machine is
    /// paused: no vCPU changes the transport meanwhile.
    pub fn save(&self, link: &Link) -> Result<TransportState, PersistError> {
        let positions = match &self.paused {
            Some(positions) => positions.clone(),
            None if self.active => {
                return Err(PersistError::Refused("the device runs: it must be paused first".into()))
            }
            None => None,
        };
        let isr = crate::sync::lock(&link.interrupt).as_ref().map_or(0, |i| i.isr.load(Ordering::Acquire));
        let queues = self
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| QueueState {
                size: q.size,
                enabled: q.enabled,
                desc: q.desc,
                driver: q.driver,
                device: q.device,
                vector: q.vector,
                position: positions.as_ref().and_then(|p| p.get(i).copied()),
            })
            .collect();
        Ok(TransportState {
            device_type: self.device.device_type(),
            status: link.status.get(),
            isr,
            device_feature_select: self.device_feature_select,
            driver_feature_select: self.driver_feature_select,
            driver_features: self.driver_features,
            config_vector: self.config_vector,
            queue_select: self.queue_select,
            config_generation: self.config_generation,
            active: positions.is_some(),
            queues,
            msix: None,
            device: self.device.save_state()?,
        })
    }

    /// Puts a snapshot's state on this transport (with `vectors` MSI-X vectors; 0 on
    /// MMIO), built from the same configuration and never run; [`Transport::start_restored`]
    /// starts the device. Refused, naming the field, where the state contradicts this device.
    pub fn restore(&mut self, link: &Link, s: &TransportState, vectors: usize) -> Result<(), StateFault> {
        check(self, s, vectors)?;
        self.device.restore_state(s.device.as_ref())?;
        self.device_feature_select = s.device_feature_select;
        self.driver_feature_select = s.driver_feature_select;
        self.driver_features = s.driver_features;
        self.config_vector = s.config_vector;
        self.queue_select = s.queue_select;
        self.config_generation = s.config_generation;
        for (regs, q) in self.queues.iter_mut().zip(&s.queues) {
            (regs.size, regs.enabled, regs.vector) = (q.size, q.enabled, q.vector);
            (regs.desc, regs.driver, regs.device) = (q.desc, q.driver, q.device);
        }
        link.status.set(s.status);
        if s.active {
            let positions = s.queues.iter().map(|q| q.position.unwrap_or_default()).collect();
            self.restored = Some((positions, s.isr));
        }
        Ok(())
    }
}

/// The saved transport fits this one: the same device type, queues and vectors, features
/// this device offers, registers the driver could have written.
fn check(t: &Transport, s: &TransportState, vectors: usize) -> Result<(), StateFault> {
    let kind = t.device.device_type();
    if s.device_type != kind {
        return Err(StateFault::invalid(
            "device_type",
            format!("virtio device type {} there, {kind} here", s.device_type),
        ));
    }
    if s.queues.len() != t.queues.len() {
        return Err(StateFault::invalid("queues", format!("{} queues there, {} here", s.queues.len(), t.queues.len())));
    }
    let extra = s.driver_features & !t.device.features();
    if extra != 0 {
        let why = format!("the guest took features {extra:#x} this device does not offer here");
        return Err(StateFault::invalid("driver_features", why));
    }
    let vector_ok = |v: u16| v == NO_VECTOR || usize::from(v) < vectors;
    if !vector_ok(s.config_vector) {
        return Err(StateFault::invalid("config_vector", format!("vector {} of {vectors}", s.config_vector)));
    }
    for (i, (q, regs)) in s.queues.iter().zip(&t.queues).enumerate() {
        if q.size == 0 || q.size > regs.max || !q.size.is_power_of_two() || !vector_ok(q.vector) {
            let why = format!("queue {i}: size {} (at most {}), vector {}", q.size, regs.max, q.vector);
            return Err(StateFault::invalid(format!("queues[{i}]"), why));
        }
        if s.active && q.enabled && q.position.is_none() {
            return Err(StateFault::invalid(
                format!("queues[{i}].position"),
                format!("queue {i} ran but has no position"),
            ));
        }
    }
    if s.active && s.status & STATUS_DRIVER_OK == 0 {
        return Err(StateFault::invalid("status", "the device ran without DRIVER_OK"));
    }
    Ok(())
}
