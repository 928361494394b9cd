//! A booting guest's memory, written once its devices are placed, so that what names
//! them can: the ACPI tables with each virtio-mmio device, the MP table (for `acpi=off`),
//! the command line with each device as `virtio_mmio.device=`, the shared page, then the
//! image.

use super::ram::write_shared_page;
use super::{ioctl, MachineError};
use crate::acpi;
use crate::boot::{self, BootSpec, EntryPoint};
use crate::layout::MemoryMap;
use kvm_ioctls::VmFd;
use std::fmt::Write;
use vm_memory::GuestMemoryMmap;

pub(super) struct GuestBoot<'a> {
    pub image: &'a [u8],
    pub cmdline: &'a str,
    pub initrd: Option<&'a [u8]>,
    pub params: &'a [u64],
    pub vcpus: u8,
    /// Each virtio-mmio device's window (base, length) and interrupt line.
    pub mmio_windows: &'a [(u64, u64, u32)],
}

impl GuestBoot<'_> {
    /// Writes the guest's memory; its entry point and where the FACS is.
    pub fn load(
        &self,
        vm: &VmFd,
        memory: &GuestMemoryMmap,
        map: &MemoryMap,
    ) -> Result<(EntryPoint, u64), MachineError> {
        let tables = acpi::write_tables(memory, map, self.vcpus, self.mmio_windows)?;
        boot::mptable::write(memory, self.vcpus).map_err(|e| MachineError::Memory(e.into()))?;
        let cmdline = with_mmio_devices(self.cmdline, self.mmio_windows);
        let spec = BootSpec { cmdline: &cmdline, initrd: self.initrd, rsdp: tables.rsdp };
        // Before the image: a multiboot image may be linked over it (and then owns the page).
        write_shared_page(memory, map.low_ram_end(), self.params)?;
        let entry = boot::load(memory, map, self.image, &spec)?;
        if let EntryPoint::Multiboot(_) = entry {
            boot::bios_state::program_pic_and_pit(vm).map_err(ioctl("KVM_SET_IRQCHIP/KVM_SET_PIT2"))?;
        }
        Ok((entry, tables.facs))
    }
}

/// `cmdline` with each virtio-mmio device as Linux's `virtio_mmio.device=SIZE@BASE:IRQ`,
/// as Firecracker adds them (linux-loader's format: the size in K).
pub fn with_mmio_devices(cmdline: &str, windows: &[(u64, u64, u32)]) -> String {
    let mut line = cmdline.to_string();
    for (base, len, irq) in windows {
        let _ = write!(line, " virtio_mmio.device={}K@{base:#x}:{irq}", len / 1024);
    }
    line
}

#[cfg(test)]
mod tests {
    #[test]
    fn mmio_devices_are_added_as_firecracker_adds_them() {
        let line = super::with_mmio_devices("console=ttyS0", &[(0xc000_1000, 0x1000, 5), (0xc000_2000, 0x1000, 6)]);
        assert_eq!(line, "console=ttyS0 virtio_mmio.device=4K@0xc0001000:5 virtio_mmio.device=4K@0xc0002000:6");
    }
}
