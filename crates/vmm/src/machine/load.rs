//! A booting guest's memory, written once its devices are placed, so that what names
//! them can: the ACPI tables with each virtio-mmio device and ACPI device, the MP table (for `acpi=off`),
//! the command line with each device as `virtio_mmio.device=`, the shared page, then the
//! image.

use super::ram::write_shared_page;
use super::{ioctl, MachineError};
use crate::acpi;
use crate::boot::{self, BootSpec, EntryPoint};
use crate::guest_memory::GuestMemoryMmap;
use crate::layout::MemoryMap;
use kvm_ioctls::VmFd;
use std::fmt::Write;

pub(super) struct GuestBoot<'a> {
    pub image: &'a [u8],
    pub cmdline: &'a str,
    pub initrd: Option<&'a [u8]>,
    pub params: &'a [u64],
    pub vcpus: u8,
    /// Each virtio-mmio device's window (base, length) and interrupt line.
    pub mmio_windows: &'a [(u64, u64, u32)],
    /// What the ACPI devices add to the DSDT, and their interrupt lines (devices/acpi).
    pub acpi_devices: (&'a [u8], &'a [u32]),
    /// What a Linux guest needs on this host (`HostProfile::linux_args`).
    pub host_linux_args: &'a [&'a str],
}

impl GuestBoot<'_> {
    /// Writes the guest's memory; its entry point and where the FACS is.
    pub fn load(
        &self,
        vm: &VmFd,
        memory: &GuestMemoryMmap,
        map: &MemoryMap,
    ) -> Result<(EntryPoint, u64), MachineError> {
        let (acpi_devices, acpi_lines) = self.acpi_devices;
        let tables = acpi::write_tables(memory, map, self.vcpus, self.mmio_windows, acpi_devices)?;
        boot::mptable::write(memory, self.vcpus).map_err(|e| MachineError::Memory(e.into()))?;
        let beyond_pic = lines_beyond_pic(self.cmdline, self.mmio_windows);
        if !beyond_pic.is_empty() {
            tracing::warn!(
                "the command line has noapic, so the guest has only its PIC's interrupt lines (up to 15): \
                 the virtio-mmio devices on lines {beyond_pic:?} will not probe (Linux: \"IRQ index 0 not found\"); \
                 attach fewer devices or drop noapic"
            );
        }
        let windows: Vec<_> = acpi_lines.iter().map(|&line| (0, 0, line)).collect();
        let beyond_pic = lines_beyond_pic(self.cmdline, &windows);
        if !beyond_pic.is_empty() {
            tracing::warn!(
                "the command line has noapic, so the guest has only its PIC's interrupt lines (up to 15): \
                 the ACPI devices' GED on lines {beyond_pic:?} will not be notified (VMGenID after a restore); \
                 attach fewer virtio-mmio devices or drop noapic"
            );
        }
        let cmdline = with_mmio_devices(self.cmdline, self.mmio_windows);
        let cmdline = match boot::image::is_linux(self.image) {
            true => with_host_args(&cmdline, self.host_linux_args),
            false => cmdline,
        };
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

/// The devices' interrupt lines a guest booted with `noapic` cannot use: without its
/// IOAPIC, Linux has the PIC's 16 lines only (Firecracker's orchestrators pass `noapic`,
/// and a VM given many drives reaches line 16).
fn lines_beyond_pic(cmdline: &str, windows: &[(u64, u64, u32)]) -> Vec<u32> {
    if !cmdline.split_whitespace().any(|w| w == "noapic") {
        return Vec::new();
    }
    windows.iter().map(|&(_, _, irq)| irq).filter(|&irq| irq > 15).collect()
}

/// `cmdline` with each of `args` it lacks (by its name: a user's own `clearcpuid=` stays),
/// logged once, so a user's boot_args work unchanged on a host that needs them.
fn with_host_args(cmdline: &str, args: &[&str]) -> String {
    let name = |w: &str| w.split('=').next().unwrap_or_default().to_string();
    let given: Vec<String> = cmdline.split_whitespace().map(name).collect();
    let missing: Vec<&str> = args.iter().copied().filter(|a| !given.contains(&name(a))).collect();
    if missing.is_empty() {
        return cmdline.to_string();
    }
    tracing::info!("host profile: added to the Linux command line what this host's KVM needs: {}", missing.join(" "));
    format!("{cmdline} {}", missing.join(" "))
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_args_are_added_when_missing_and_a_users_own_stay() {
        let args = ["noxsave", "clearcpuid=1,2", "rodata=off"];
        assert_eq!(super::with_host_args("console=ttyS0", &args), "console=ttyS0 noxsave clearcpuid=1,2 rodata=off");
        assert_eq!(super::with_host_args("clearcpuid=9 noxsave", &args), "clearcpuid=9 noxsave rodata=off");
        assert_eq!(super::with_host_args("a", &[]), "a");
    }

    #[test]
    fn noapic_leaves_the_lines_past_15_unreachable() {
        let windows = [(0xc000_1000, 0x1000, 15), (0xc000_2000, 0x1000, 16), (0xc000_3000, 0x1000, 17)];
        assert_eq!(super::lines_beyond_pic("console=ttyS0 noapic pci=off", &windows), vec![16, 17]);
        assert!(super::lines_beyond_pic("console=ttyS0 pci=off", &windows).is_empty());
        assert!(super::lines_beyond_pic("noapic", &windows[..1]).is_empty());
    }

    #[test]
    fn mmio_devices_are_added_as_firecracker_adds_them() {
        let line = super::with_mmio_devices("console=ttyS0", &[(0xc000_1000, 0x1000, 5), (0xc000_2000, 0x1000, 6)]);
        assert_eq!(line, "console=ttyS0 virtio_mmio.device=4K@0xc0001000:5 virtio_mmio.device=4K@0xc0002000:6");
    }
}
