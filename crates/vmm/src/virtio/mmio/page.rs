//! The register page, mapped: a device's 4 KiB window backed by a read-only KVM memory
//! slot over a page that holds every register as the driver would read it, so register
//! and configuration reads never exit (the way the mapped ECAM window serves config
//! reads). Writes still fault into the VMM (a read-only slot turns them into MMIO exits)
//! except those an ioeventfd takes inside the slot (QueueNotify, the queue bit's
//! InterruptACK); the transport rewrites the page, with its lock held, before the vCPU
//! that wrote resumes. A device thread sets InterruptStatus (and shows the device status)
//! here before it raises the irqfd, so the driver's read on the interrupt sees why.
//!
//! Bits only ever get added to InterruptStatus and the device status between a reset and
//! the next (the driver's acknowledgement of a configuration change is a trapped write that
//! clears its bit), so the page takes them with atomic ORs: a refresh racing a device
//! thread never loses the bit the thread just set.

use super::{register, CONFIG, INTERRUPT_STATUS, READABLE, STATUS, WINDOW};
use crate::kvm::MemslotSink;
use crate::virtio::transport::{Link, Mirror, Transport};
use crate::virtio::InterruptMirror;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use vm_memory::mmap::MmapRegion;
use vm_memory::VolatileMemory;

pub struct RegisterPage {
    page: MmapRegion<()>,
    sink: Arc<dyn MemslotSink>,
    slot: u32,
    gpa: u64,
}

impl RegisterPage {
    /// A zeroed page, mapped read-only at `gpa` in KVM memory slot `slot`.
    pub fn map(sink: Arc<dyn MemslotSink>, slot: u32, gpa: u64) -> std::io::Result<Self> {
        let page = MmapRegion::new(WINDOW as usize).map_err(std::io::Error::other)?;
        sink.set_readonly_slot(slot, gpa, WINDOW, page.as_ptr() as u64)?;
        Ok(RegisterPage { page, sink, slot, gpa })
    }

    fn word(&self, offset: u64) -> Option<&AtomicU32> {
        self.page.get_atomic_ref::<AtomicU32>(offset as usize).ok()
    }

    /// What the driver reads at `offset` (a 4-byte-aligned offset in the window).
    pub fn read(&self, offset: u64) -> u32 {
        self.word(offset).map_or(0, |w| w.load(Ordering::Acquire))
    }

    fn store(&self, offset: u64, v: u32) {
        if let Some(w) = self.word(offset) {
            w.store(v, Ordering::Release);
        }
    }

    fn or(&self, offset: u64, bits: u32) {
        if let Some(w) = self.word(offset) {
            w.fetch_or(bits, Ordering::AcqRel);
        }
    }

    /// The device's configuration from offset 0, one aligned store per dword (so a
    /// reader never sees one torn).
    fn store_config(&self, config: &[u8]) {
        for (at, dword) in config.chunks_exact(4).enumerate().take(((WINDOW - CONFIG) / 4) as usize) {
            let v = u32::from_le_bytes([dword[0], dword[1], dword[2], dword[3]]);
            self.store(CONFIG + 4 * at as u64, v);
        }
    }

    /// The driver acknowledged `bits` of InterruptStatus (a trapped write).
    pub fn acknowledge(&self, bits: u8) {
        if let Some(w) = self.word(INTERRUPT_STATUS) {
            w.fetch_and(!u32::from(bits), Ordering::AcqRel);
        }
    }
}

impl InterruptMirror for RegisterPage {
    fn raise(&self, bits: u8, status: u8) {
        self.or(STATUS, u32::from(status));
        self.or(INTERRUPT_STATUS, u32::from(bits));
    }

    fn show_config(&self, config: &[u8]) {
        self.store_config(config);
    }
}

impl Mirror for RegisterPage {
    fn refresh(&self, t: &Transport, link: &Link) {
        // The device's configuration first, to the end of the window, as a trapped read
        // would return it; then the registers, its generation among them, so a driver that reads the new
        // generation reads the new configuration (virtio 1.2 2.5.1).
        let mut config = [0u8; (WINDOW - CONFIG) as usize];
        t.device.read_config(0, &mut config);
        self.store_config(&config);
        for &offset in READABLE {
            self.store(offset, register(t, link, offset));
        }
        // Only a reset clears them (and stops the device threads that set them first).
        match link.status.get() {
            0 => self.store(STATUS, 0),
            status => self.or(STATUS, u32::from(status)),
        }
        if crate::sync::lock(&link.interrupt).is_none() {
            self.store(INTERRUPT_STATUS, 0);
        }
    }
}

impl Drop for RegisterPage {
    fn drop(&mut self) {
        // KVM must stop reading the page before it is unmapped.
        if let Err(e) = self.sink.set_readonly_slot(self.slot, self.gpa, 0, self.page.as_ptr() as u64) {
            tracing::error!("virtio-mmio: cannot delete memory slot {} of the register page: {e}", self.slot);
        }
    }
}
