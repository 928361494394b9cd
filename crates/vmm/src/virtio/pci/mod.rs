//! The virtio-pci (modern) transport: common, notify, ISR and device configuration
//! structures plus the MSI-X table and PBA, all in BAR0.
//!
//! BAR0 layout: common config 0x0000, ISR 0x1000, device config 0x2000, notify 0x3000
//! (queue n at 0x3000 + 4n; the VMM registers each as a zero-length ioeventfd, so a kick
//! never exits to userspace), MSI-X table 0x4000, PBA 0x5000.

use super::transport::{Core, Lines, Transport};
pub use super::transport::{QueueState, TransportState};
use super::{VirtioDevice, NO_VECTOR};
use crate::bus::{BusDevice, DeviceId};
use crate::guest_memory::GuestMemoryMmap;
use crate::ioeventfd::IoeventfdKey;
use crate::pci::config::{COMMAND, COMMAND_MEMORY};
use crate::pci::msix::Msix;
use crate::pci::{BarKind, BarSpec, ConfigHook, ConfigSpace, PciFunction, PciIds};
use crate::persist::StateFault;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use vmm_sys_util::eventfd::EventFd;

pub const BAR_SIZE: u64 = 0x8000;
/// BAR0, which holds every structure.
pub const BAR0: BarSpec = BarSpec { kind: BarKind::Memory32, size: BAR_SIZE };
const COMMON: u64 = 0x0000;
const COMMON_LEN: u64 = 0x3c;
const ISR: u64 = 0x1000;
const DEVICE_CFG: u64 = 0x2000;
const DEVICE_CFG_LEN: u64 = 0x100;
pub const NOTIFY: u64 = 0x3000;
const NOTIFY_MULTIPLIER: u64 = 4;
const MSIX_TABLE: u64 = 0x4000;
const MSIX_PBA: u64 = 0x5000;

const VIRTIO_VENDOR: u16 = 0x1af4;
const CAP_VENDOR: u8 = 0x09;
const CAP_MSIX: u8 = 0x11;
const CFG_COMMON: u8 = 1;
const CFG_NOTIFY: u8 = 2;
const CFG_ISR: u8 = 3;
const CFG_DEVICE: u8 = 4;
const CFG_PCI: u8 = 5;
/// In the PCI_CFG capability: bar (1 byte) at +4, offset and length (le32) at +8 and
/// +12, and the data window (le32) at +16.
const PCI_CFG_BAR: usize = 4;
const PCI_CFG_OFFSET: usize = 8;
const PCI_CFG_LENGTH: usize = 12;
const PCI_CFG_DATA: usize = 16;

/// The PCI class for a virtio device type (virtio 1.2 leaves it to the device; these are
/// what Linux and QEMU use).
fn class_code(device_type: u16) -> [u8; 3] {
    match device_type {
        1 => [0x02, 0x00, 0x00], // network: Ethernet
        2 => [0x01, 0x80, 0x00], // mass storage: other
        _ => [0xff, 0x00, 0x00],
    }
}

/// Common configuration fields: offset, width.
const FIELDS: &[(u64, usize)] = &[
    (0x00, 4), // device_feature_select
    (0x04, 4), // device_feature
    (0x08, 4), // driver_feature_select
    (0x0c, 4), // driver_feature
    (0x10, 2), // msix_config
    (0x12, 2), // num_queues
    (0x14, 1), // device_status
    (0x15, 1), // config_generation
    (0x16, 2), // queue_select
    (0x18, 2), // queue_size
    (0x1a, 2), // queue_msix_vector
    (0x1c, 2), // queue_enable
    (0x1e, 2), // queue_notify_off
    (0x20, 8), // queue_desc
    (0x28, 8), // queue_driver
    (0x30, 8), // queue_device
    (0x38, 2), // queue_notify_data
    (0x3a, 2), // queue_reset
];

pub struct VirtioPci {
    core: Core,
    msix: Arc<Mutex<Msix>>,
    msix_cap: Mutex<usize>,
    pci_cfg_cap: Mutex<usize>,
}

impl VirtioPci {
    pub fn new(device: Box<dyn VirtioDevice>, mem: GuestMemoryMmap, msix: Msix) -> std::io::Result<Self> {
        let msix = Arc::new(Mutex::new(msix));
        let core = Core::new(device, mem, Lines::Msix(msix.clone()), None)?;
        Ok(VirtioPci { core, msix, msix_cap: Mutex::new(0), pci_cfg_cap: Mutex::new(0) })
    }

    /// What this transport shares with the MMIO one.
    pub fn core(&self) -> &Core {
        &self.core
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Transport> {
        self.core.lock()
    }

    /// The PCI function: virtio IDs, BAR0 at `bar0` (decode on), the virtio capabilities
    /// and MSI-X; `id` counts BAR0's exits.
    pub fn pci_function(self: &Arc<Self>, name: &str, id: DeviceId, bar0: u64) -> std::io::Result<PciFunction> {
        let device_type = self.lock().device.device_type();
        let ids = PciIds {
            vendor: VIRTIO_VENDOR,
            device: 0x1040 + device_type,
            class: class_code(device_type),
            revision: 1,
            subsystem_vendor: VIRTIO_VENDOR,
            subsystem: 0x40,
        };
        let mut config = ConfigSpace::new(ids);
        config.set_bar(0, BAR0, bar0);
        let cap = |cfg_type: u8, offset: u64, len: u64, extra: &[u8]| {
            let mut body = vec![16 + extra.len() as u8, cfg_type, 0, 0, 0, 0];
            body.extend_from_slice(&(offset as u32).to_le_bytes());
            body.extend_from_slice(&(len as u32).to_le_bytes());
            body.extend_from_slice(extra);
            body
        };
        let queues = self.core.link.kicks.len() as u64;
        let _ = config.add_capability(CAP_VENDOR, &cap(CFG_COMMON, COMMON, COMMON_LEN, &[]));
        let _ = config.add_capability(
            CAP_VENDOR,
            &cap(CFG_NOTIFY, NOTIFY, queues * NOTIFY_MULTIPLIER, &(NOTIFY_MULTIPLIER as u32).to_le_bytes()),
        );
        let _ = config.add_capability(CAP_VENDOR, &cap(CFG_ISR, ISR, 1, &[]));
        let _ = config.add_capability(CAP_VENDOR, &cap(CFG_DEVICE, DEVICE_CFG, DEVICE_CFG_LEN, &[]));
        // The PCI_CFG window (required by the spec): BAR access through config space.
        let pci_cfg = config.add_capability(CAP_VENDOR, &cap(CFG_PCI, 0, 0, &[0; 4]));
        config.set_writable(pci_cfg + PCI_CFG_BAR, 1);
        config.set_writable(pci_cfg + PCI_CFG_OFFSET, 12);
        *crate::sync::lock(&self.pci_cfg_cap) = pci_cfg;
        let vectors = crate::sync::lock(&self.msix).len() as u16;
        let mut body = (vectors - 1).to_le_bytes().to_vec();
        body.extend_from_slice(&(MSIX_TABLE as u32).to_le_bytes()); // BIR 0
        body.extend_from_slice(&(MSIX_PBA as u32).to_le_bytes());
        let msix_cap = config.add_capability(CAP_MSIX, &body);
        config.set_write_mask(msix_cap + 2, &[0x00, 0xc0]);
        *crate::sync::lock(&self.msix_cap) = msix_cap;
        config.write(COMMAND, &COMMAND_MEMORY.to_le_bytes());
        let mut function = PciFunction::new(name, config)
            .with_bar(0, id, self.clone())
            .with_ioeventfds(0, self.notify_ioeventfds()?)
            .with_hook(self.clone());
        // Reading the PCI_CFG window reads BAR0 (the ISR clears on read): never map this page.
        function.read_side_effects = true;
        Ok(function)
    }

    /// The BAR0 access the PCI_CFG window describes now: (offset, length), if valid.
    fn pci_cfg_target(&self, config: &ConfigSpace) -> Option<(u64, usize)> {
        let cap = *crate::sync::lock(&self.pci_cfg_cap);
        let le32 = |at: usize| {
            let mut b = [0u8; 4];
            config.read(cap + at, &mut b);
            u32::from_le_bytes(b)
        };
        let bar = le32(PCI_CFG_BAR) & 0xff;
        let (offset, length) = (u64::from(le32(PCI_CFG_OFFSET)), le32(PCI_CFG_LENGTH) as usize);
        let valid = cap != 0 && bar == 0 && matches!(length, 1 | 2 | 4) && offset + length as u64 <= BAR_SIZE;
        valid.then_some((offset, length))
    }

    /// Whether `[offset, offset + len)` touches the PCI_CFG data window.
    fn touches_pci_cfg_data(&self, offset: usize, len: usize) -> bool {
        let data = *crate::sync::lock(&self.pci_cfg_cap) + PCI_CFG_DATA;
        data > PCI_CFG_DATA && offset < data + 4 && data < offset + len
    }

    /// Zero-length MMIO ioeventfds for every queue's notify address, relative to BAR0.
    fn notify_ioeventfds(&self) -> std::io::Result<Vec<(IoeventfdKey, EventFd)>> {
        let key = |q: usize| IoeventfdKey::mmio(NOTIFY + q as u64 * NOTIFY_MULTIPLIER, 0, None);
        self.core.link.kicks.iter().enumerate().map(|(q, fd)| Ok((key(q), fd.try_clone()?))).collect()
    }

    /// The GSI behind each MSI-X vector.
    pub fn vector_gsis(&self) -> Vec<u32> {
        crate::sync::lock(&self.msix).gsis()
    }

    fn common_image(&self, t: &Transport) -> [u8; COMMON_LEN as usize] {
        let mut img = [0u8; COMMON_LEN as usize];
        let q = t.selected_queue();
        let mut put = |at: usize, bytes: &[u8]| img[at..at + bytes.len()].copy_from_slice(bytes);
        put(0x00, &t.device_feature_select.to_le_bytes());
        put(0x04, &t.device_features_word().to_le_bytes());
        put(0x08, &t.driver_feature_select.to_le_bytes());
        put(0x0c, &t.driver_features_word().to_le_bytes());
        put(0x10, &t.config_vector.to_le_bytes());
        put(0x12, &(t.queues.len() as u16).to_le_bytes());
        put(0x14, &[self.core.link.status.get()]);
        put(0x15, &[t.config_generation]);
        put(0x16, &t.queue_select.to_le_bytes());
        put(0x18, &q.size.to_le_bytes());
        put(0x1a, &q.vector.to_le_bytes());
        put(0x1c, &u16::from(q.enabled).to_le_bytes());
        put(0x1e, &t.queue_select.to_le_bytes());
        put(0x20, &q.desc.to_le_bytes());
        put(0x28, &q.driver.to_le_bytes());
        put(0x30, &q.device.to_le_bytes());
        img
    }

    fn common_write(&self, t: &mut Transport, offset: u64, data: &[u8]) {
        let mut img = self.common_image(t);
        let end = offset as usize + data.len();
        if end > img.len() {
            return;
        }
        img[offset as usize..end].copy_from_slice(data);
        for &(at, width) in FIELDS {
            if (at as usize) < end && offset < at + width as u64 {
                let mut v = [0u8; 8];
                v[..width].copy_from_slice(&img[at as usize..at as usize + width]);
                self.set_field(t, at, u64::from_le_bytes(v));
            }
        }
    }

    fn set_field(&self, t: &mut Transport, at: u64, v: u64) {
        let vectors = crate::sync::lock(&self.msix).len() as u64;
        let valid_vector = |v: u64| if v < vectors { v as u16 } else { NO_VECTOR };
        match at {
            0x00 => t.device_feature_select = v as u32,
            0x08 => t.driver_feature_select = v as u32,
            0x0c => t.set_driver_features_word(&self.core.link, v as u32),
            0x10 => t.config_vector = valid_vector(v),
            0x14 => t.set_status(&self.core.link, v as u8),
            0x16 => t.queue_select = v as u16,
            0x18 => t.set_queue_size(v),
            0x1a => {
                if let Some(q) = t.writable_queue("a queue register") {
                    q.vector = valid_vector(v);
                }
            }
            0x1c | 0x20 | 0x28 | 0x30 => {
                let Some(q) = t.writable_queue("a queue register") else { return };
                match at {
                    0x1c => q.enabled = v == 1,
                    0x20 => q.desc = v,
                    0x28 => q.driver = v,
                    _ => q.device = v,
                }
            }
            _ => {} // read-only fields
        }
    }
}

impl BusDevice for VirtioPci {
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let len = data.len() as u64;
        match offset {
            o if o + len <= COMMON + COMMON_LEN => {
                let t = self.lock();
                data.copy_from_slice(&self.common_image(&t)[o as usize..(o + len) as usize]);
            }
            ISR => {
                // Reading the ISR clears it (a side effect: this BAR is never mapped).
                let interrupt = crate::sync::lock(&self.core.link.interrupt);
                data[0] = interrupt.as_ref().map_or(0, |i| i.isr.swap(0, Ordering::AcqRel));
            }
            o if (DEVICE_CFG..DEVICE_CFG + DEVICE_CFG_LEN).contains(&o) => {
                self.lock().device.read_config(o - DEVICE_CFG, data)
            }
            o if (MSIX_TABLE..MSIX_PBA).contains(&o) => crate::sync::lock(&self.msix).table_read(o - MSIX_TABLE, data),
            o if o >= MSIX_PBA => crate::sync::lock(&self.msix).pba_read(o - MSIX_PBA, data),
            _ => {}
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        match offset {
            o if o < COMMON + COMMON_LEN => {
                let mut t = self.lock();
                self.common_write(&mut t, o, data);
            }
            o if (NOTIFY..NOTIFY + self.core.link.kicks.len() as u64 * NOTIFY_MULTIPLIER).contains(&o) => {
                // Only reached when no ioeventfd took the write (counted as a device write).
                let _ = self.core.link.kicks[((o - NOTIFY) / NOTIFY_MULTIPLIER) as usize].write(1);
            }
            o if (MSIX_TABLE..MSIX_TABLE + 0x1000).contains(&o) => {
                crate::sync::lock(&self.msix).table_write(o - MSIX_TABLE, data)
            }
            o if (DEVICE_CFG..DEVICE_CFG + DEVICE_CFG_LEN).contains(&o) => {
                let mut t = self.lock();
                if !t.device.write_config(o - DEVICE_CFG, data) {
                    t.warn_once(format_args!("write to the device configuration at {o:#x}"));
                }
            }
            _ => {}
        }
    }
}

impl ConfigHook for VirtioPci {
    fn config_written(&self, config: &ConfigSpace, offset: usize, len: usize) {
        let cap = *crate::sync::lock(&self.msix_cap);
        if cap != 0 {
            crate::sync::lock(&self.msix).set_control(config.read_u16(cap + 2));
        }
        if self.touches_pci_cfg_data(offset, len) {
            if let Some((bar_offset, length)) = self.pci_cfg_target(config) {
                let data = *crate::sync::lock(&self.pci_cfg_cap) + PCI_CFG_DATA;
                let mut bytes = [0u8; 4];
                config.read(data, &mut bytes);
                self.write(bar_offset, &bytes[..length]);
            }
        }
    }

    fn config_read(&self, config: &ConfigSpace, offset: usize, data: &mut [u8]) -> bool {
        if !self.touches_pci_cfg_data(offset, data.len()) {
            return false;
        }
        config.read(offset, data);
        let mut window = [0u8; 4];
        if let Some((bar_offset, length)) = self.pci_cfg_target(config) {
            self.read(bar_offset, &mut window[..length]);
        }
        let start = *crate::sync::lock(&self.pci_cfg_cap) + PCI_CFG_DATA;
        for (i, byte) in data.iter_mut().enumerate() {
            if let Some(w) = (offset + i).checked_sub(start).and_then(|k| window.get(k)) {
                *byte = *w;
            }
        }
        true
    }
}

impl VirtioPci {
    /// Reads the transport (of a paused device) with its MSI-X table.
    pub fn save(&self) -> Result<TransportState, crate::persist::PersistError> {
        let mut state = self.core.save()?;
        state.msix = Some(crate::sync::lock(&self.msix).save());
        Ok(state)
    }

    /// Puts a snapshot's state on this transport, built from the same configuration and
    /// never run; [`Core::start_restored`] starts the device.
    pub fn restore(&self, s: &TransportState) -> Result<(), StateFault> {
        let msix =
            s.msix.as_ref().ok_or_else(|| StateFault::invalid("msix", "a PCI device saved without its MSI-X table"))?;
        self.core.restore(s, crate::sync::lock(&self.msix).len())?;
        crate::sync::lock(&self.msix).restore(msix).map_err(|why| StateFault::invalid("msix", why))
    }
}

#[cfg(test)]
mod tests;
