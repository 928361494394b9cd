//! The virtio-mmio transport (virtio 1.2 4.2, version 2), Firecracker's: one 4 KiB page of
//! registers per device, found by the guest on its command line
//! (`virtio_mmio.device=4K@ADDR:IRQ`) or in the DSDT, and one interrupt line.
//!
//! The exitless path: QueueNotify (0x050) is an ioeventfd per queue, matched on the queue
//! index the driver writes, so a kick never leaves the kernel; the interrupt is an irqfd on
//! the device's GSI, raised after InterruptStatus has its bit, so the driver's read on the
//! interrupt sees why.
//!
//! Trapped ([`RegisterMode::Trapped`], Firecracker's way), every register read exits, and
//! InterruptACK is applied in the vCPU's exit, before the driver goes on to its queues: an
//! interrupt the device raises after the driver read the status and before it acknowledged
//! leaves a used buffer the driver's queue walk (which follows the acknowledgement) finds,
//! and a second interrupt that reads 0 is only spurious.
//!
//! Mapped ([`RegisterMode::Mapped`], the default where the host allows it:
//! crate::host::readonly_probe), the window is a read-only [`page::RegisterPage`], so
//! reads never exit, and the used-buffer bit of InterruptStatus, once set, stays set until
//! the device is reset: the driver's acknowledgement of it (a 4-byte write of 1) is taken by
//! an ioeventfd no one needs to read, and never exits. An acknowledgement that cleared the
//! bit could only be applied after the write, asynchronously, and could then clear a bit
//! set for a newer interrupt: the driver would read 0 and service no queue, a stalled
//! device. With the bit kept, every interrupt sends the driver to walk its queues, which
//! is what Linux's handler does on the bit, and an interrupt whose buffers an earlier walk
//! took is only spurious, as above. The configuration-change bit is acknowledged by a
//! trapped write, as before.

pub mod page;

pub use super::transport::TransportState;
use super::transport::{Core, Lines, Link, Mirror, Transport};
use super::{VirtioDevice, ISR_QUEUE};
use crate::bus::BusDevice;
use crate::guest_memory::GuestMemoryMmap;
use crate::ioeventfd::IoeventfdKey;
use page::RegisterPage;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vmm_sys_util::eventfd::EventFd;

/// One device's window.
pub const WINDOW: u64 = 0x1000;

/// How the register window is served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RegisterMode {
    /// Every access exits (Firecracker's way).
    Trapped,
    /// Reads come from a read-only page; writes exit unless an ioeventfd takes them.
    #[default]
    Mapped,
}

const MAGIC: u64 = 0x000;
const VERSION: u64 = 0x004;
const DEVICE_ID: u64 = 0x008;
const VENDOR_ID: u64 = 0x00c;
const DEVICE_FEATURES: u64 = 0x010;
const DEVICE_FEATURES_SEL: u64 = 0x014;
const DRIVER_FEATURES: u64 = 0x020;
const DRIVER_FEATURES_SEL: u64 = 0x024;
const QUEUE_SEL: u64 = 0x030;
const QUEUE_NUM_MAX: u64 = 0x034;
const QUEUE_NUM: u64 = 0x038;
const QUEUE_READY: u64 = 0x044;
pub const QUEUE_NOTIFY: u64 = 0x050;
const INTERRUPT_STATUS: u64 = 0x060;
pub const INTERRUPT_ACK: u64 = 0x064;
const STATUS: u64 = 0x070;
const QUEUE_DESC_LOW: u64 = 0x080;
const QUEUE_DESC_HIGH: u64 = 0x084;
const QUEUE_DRIVER_LOW: u64 = 0x090;
const QUEUE_DRIVER_HIGH: u64 = 0x094;
const QUEUE_DEVICE_LOW: u64 = 0x0a0;
const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
const SHM_LEN_LOW: u64 = 0x0b0;
const SHM_LEN_HIGH: u64 = 0x0b4;
const CONFIG_GENERATION: u64 = 0x0fc;
const CONFIG: u64 = 0x100;

/// "virt", little-endian.
const MAGIC_VALUE: u32 = 0x7472_6976;

/// The registers a mapped page shows from [`register`] on every refresh (InterruptStatus
/// and Status are kept by the page itself).
const READABLE: &[u64] = &[
    MAGIC,
    VERSION,
    DEVICE_ID,
    VENDOR_ID,
    DEVICE_FEATURES,
    QUEUE_NUM_MAX,
    QUEUE_READY,
    QUEUE_DESC_LOW,
    QUEUE_DESC_HIGH,
    QUEUE_DRIVER_LOW,
    QUEUE_DRIVER_HIGH,
    QUEUE_DEVICE_LOW,
    QUEUE_DEVICE_HIGH,
    SHM_LEN_LOW,
    SHM_LEN_HIGH,
    CONFIG_GENERATION,
];

/// What the driver reads at register `offset`.
fn register(t: &Transport, link: &Link, offset: u64) -> u32 {
    let q = t.selected_queue();
    match offset {
        MAGIC => MAGIC_VALUE,
        VERSION => 2,
        DEVICE_ID => u32::from(t.device.device_type()),
        VENDOR_ID => 0,
        DEVICE_FEATURES => t.device_features_word(),
        QUEUE_NUM_MAX => u32::from(q.max),
        QUEUE_READY => u32::from(q.enabled),
        INTERRUPT_STATUS => {
            crate::sync::lock(&link.interrupt).as_ref().map_or(0, |i| u32::from(i.isr.load(Ordering::Acquire)))
        }
        STATUS => u32::from(link.status.get()),
        QUEUE_DESC_LOW => q.desc as u32,
        QUEUE_DESC_HIGH => (q.desc >> 32) as u32,
        QUEUE_DRIVER_LOW => q.driver as u32,
        QUEUE_DRIVER_HIGH => (q.driver >> 32) as u32,
        QUEUE_DEVICE_LOW => q.device as u32,
        QUEUE_DEVICE_HIGH => (q.device >> 32) as u32,
        // No shared memory regions: a region's length reads as all ones.
        SHM_LEN_LOW | SHM_LEN_HIGH => u32::MAX,
        CONFIG_GENERATION => u32::from(t.config_generation),
        _ => 0,
    }
}

pub struct VirtioMmio {
    core: Core,
    /// The mapped register page, if mapped.
    page: Option<Arc<RegisterPage>>,
    /// Takes the driver's acknowledgements of the used-buffer bit (mapped only).
    acks: Option<EventFd>,
}

impl VirtioMmio {
    /// The transport for `device`, interrupting the guest through `irqfd` (an eventfd
    /// the caller registers on the device's GSI), its registers shown on `page` if mapped.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        irqfd: Arc<EventFd>,
        page: Option<RegisterPage>,
    ) -> std::io::Result<Self> {
        let page = page.map(Arc::new);
        let mirror = page.clone().map(|p| p as Arc<dyn Mirror>);
        let core = Core::new(device, mem, Lines::Line(irqfd), mirror)?;
        let acks = page.as_ref().map(|_| EventFd::new(libc::EFD_NONBLOCK)).transpose()?;
        Ok(VirtioMmio { core, page, acks })
    }

    /// The mapped register page, if mapped.
    pub fn page(&self) -> Option<&RegisterPage> {
        self.page.as_deref()
    }

    /// What this transport shares with the PCI one.
    pub fn core(&self) -> &Core {
        &self.core
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Transport> {
        self.core.lock()
    }

    /// One ioeventfd per queue on QueueNotify, relative to the window, matching a 4-byte
    /// write of that queue's index (a write of another size, or of another value, exits),
    /// and, when mapped, one on InterruptACK matching the used-buffer bit.
    pub fn notify_ioeventfds(&self) -> std::io::Result<Vec<(IoeventfdKey, EventFd)>> {
        let key = |q: usize| IoeventfdKey::mmio(QUEUE_NOTIFY, 4, Some(q as u64));
        let mut fds: Vec<_> = self
            .core
            .link
            .kicks
            .iter()
            .enumerate()
            .map(|(q, fd)| Ok((key(q), fd.try_clone()?)))
            .collect::<std::io::Result<_>>()?;
        if let Some(acks) = &self.acks {
            fds.push((IoeventfdKey::mmio(INTERRUPT_ACK, 4, Some(u64::from(ISR_QUEUE))), acks.try_clone()?));
        }
        Ok(fds)
    }

    /// Puts a snapshot's state on this transport, built from the same configuration and
    /// never run; [`Core::start_restored`] starts the device.
    pub fn restore(&self, s: &TransportState) -> Result<(), crate::persist::StateFault> {
        if s.msix.is_some() {
            return Err(crate::persist::StateFault::invalid("msix", "a PCI device's state for an MMIO device"));
        }
        self.core.restore(s, 0)
    }

    fn set_register(&self, offset: u64, v: u32) {
        let mut t = self.lock();
        let half = |old: u64, high: bool| match high {
            true => (old & 0xffff_ffff) | (u64::from(v) << 32),
            false => (old & !0xffff_ffff) | u64::from(v),
        };
        match offset {
            DEVICE_FEATURES_SEL => t.device_feature_select = v,
            DRIVER_FEATURES => t.set_driver_features_word(&self.core.link, v),
            DRIVER_FEATURES_SEL => t.driver_feature_select = v,
            QUEUE_SEL => t.queue_select = v.min(u32::from(u16::MAX)) as u16,
            QUEUE_NUM => t.set_queue_size(u64::from(v)),
            QUEUE_READY => {
                if let Some(q) = t.writable_queue("QueueReady") {
                    q.enabled = v == 1;
                }
            }
            QUEUE_NOTIFY => {
                // Only reached when no ioeventfd took the write: a kick of another size.
                if let Some(kick) = self.core.link.kicks.get(v as usize) {
                    let _ = kick.write(1);
                }
            }
            INTERRUPT_ACK => {
                // Mapped, the used-buffer bit stays set (see the module's comment).
                let bits = if self.page.is_some() { v as u8 & !ISR_QUEUE } else { v as u8 };
                if let Some(i) = crate::sync::lock(&self.core.link.interrupt).as_ref() {
                    i.isr.fetch_and(!bits, Ordering::AcqRel);
                }
                if let Some(page) = &self.page {
                    page.acknowledge(bits);
                }
            }
            STATUS => t.set_status(&self.core.link, v as u8),
            QUEUE_DESC_LOW | QUEUE_DESC_HIGH | QUEUE_DRIVER_LOW | QUEUE_DRIVER_HIGH | QUEUE_DEVICE_LOW
            | QUEUE_DEVICE_HIGH => {
                let Some(q) = t.writable_queue("a queue address") else { return };
                let high = offset & 4 != 0;
                match offset & !4 {
                    QUEUE_DESC_LOW => q.desc = half(q.desc, high),
                    QUEUE_DRIVER_LOW => q.driver = half(q.driver, high),
                    _ => q.device = half(q.device, high),
                }
            }
            _ => t.warn_once(format_args!("write to read-only or unknown register {offset:#x}")),
        }
        self.core.link.refresh(&t);
    }
}

impl BusDevice for VirtioMmio {
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= CONFIG {
            return self.lock().device.read_config(offset - CONFIG, data);
        }
        // The registers are 32 bits wide and read whole (virtio 1.2 4.2.2.2).
        if data.len() != 4 || !offset.is_multiple_of(4) {
            return self.lock().warn_once(format_args!("{}-byte read at register {offset:#x}", data.len()));
        }
        data.copy_from_slice(&register(&self.lock(), &self.core.link, offset).to_le_bytes());
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if offset >= CONFIG {
            let mut t = self.lock();
            if !t.device.write_config(offset - CONFIG, data) {
                return t.warn_once(format_args!("write to the device configuration at {offset:#x}"));
            }
            // The mapped page shows what the driver wrote (its write exited: the page is
            // read-only to it).
            return self.core.link.refresh(&t);
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            return self.lock().warn_once(format_args!("{}-byte write at register {offset:#x}", data.len()));
        };
        if !offset.is_multiple_of(4) {
            return self.lock().warn_once(format_args!("unaligned write at register {offset:#x}"));
        }
        self.set_register(offset, u32::from_le_bytes(bytes));
    }
}

#[cfg(test)]
mod tests;
