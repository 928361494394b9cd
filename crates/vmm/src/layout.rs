//! The guest physical memory map: the one place that says where everything is. RAM
//! regions, the e820/PVH map, the ACPI tables, the PCI windows and the KVM memory slots
//! all come from here, so they cannot disagree.
//!
//! ```text
//! 0x0000_0000  RAM (low memory: boot structures below 1 MiB, see the constants below)
//! 0x0009_fc00  reserved (EBDA, VGA hole, BIOS area: real-mode handlers at 0xd0000, the
//!              VMGenID id at 0xd1000, the VMClock page at 0xd2000, ACPI tables at
//!              0xe0000, the MP table at 0xf0000)
//! 0x0010_0000  RAM: kernel, then the rest up to min(RAM, 3 GiB)
//! 0xc000_0000  32-bit PCI MMIO window (BARs)
//! 0xe000_0000  ECAM, bus 0 (reserved)
//! 0xfec0_0000  IOAPIC   0xfed9_0000  VT-d (kvm-unit-tests only)   0xfee0_0000  local APICs
//! 0x1_0000_0000  RAM above 4 GiB (what does not fit below the hole), then the 64-bit PCI window
//! ```

use exitless_payloads::abi;

/// Granularity of `--mem`.
pub const PAGE_SIZE: u64 = 4096;
pub const MIN_MEM: u64 = 4 << 20;
/// An upper bound that keeps the map inside 40 physical address bits with room for the
/// 64-bit PCI window.
pub const MAX_MEM: u64 = 512 << 30;

// Low memory, as the boot code and the built-in payloads use it.
/// A GDT for the 64-bit entry: the payload runtime's selectors (0x08 code64, 0x10 data,
/// 0x23 user data, 0x2b user code64).
pub const GDT_GPA: u64 = 0x500;
/// Where application processors start (SIPI vector 4): the payload runtime's trampoline.
pub const AP_TRAMPOLINE_GPA: u64 = abi::AP_TRAMPOLINE_GPA;
/// hvm_start_info for the PVH entry, its memory map and its module list.
pub const START_INFO_GPA: u64 = 0x6000;
pub const START_INFO_MODULES_GPA: u64 = 0x6040;
pub const MEMMAP_GPA: u64 = 0x6080;
/// The Linux zero page (boot_params) for the 64-bit Linux boot protocol.
pub const ZERO_PAGE_GPA: u64 = 0x7000;
/// The payloads' shared page (parameters in, results out).
pub const SHARED_PAGE_GPA: u64 = abi::SHARED_PAGE_GPA;
/// Identity page tables for the 64-bit entry: PML4, PDPT, then four page directories.
pub const PML4_GPA: u64 = 0x9000;
pub const PDPT_GPA: u64 = 0xa000;
pub const PD_GPA: u64 = 0xb000;
/// The kernel command line (NUL-terminated).
pub const CMDLINE_GPA: u64 = 0x2_0000;
/// The longest command line this VMM passes (Linux's COMMAND_LINE_SIZE on x86, less the NUL);
/// a bzImage may ask for less in its header.
pub const CMDLINE_MAX: usize = 2047;
/// Initial stack pointer for the 64-bit entry.
pub const BOOT_STACK: u64 = 0x8_0000;
/// End of the conventional low memory the boot map reports as RAM.
pub const LOW_RAM_END: u64 = 0x9_fc00;
/// The real-mode interrupt handlers a multiboot image finds from its "BIOS"
/// (boot::bios_state), in the reserved area; the vector table itself is at 0.
pub const BIOS_STUBS_GPA: u64 = 0xd_0000;
/// The VMGenID device's 16-byte generation id (devices/acpi), in the reserved BIOS area,
/// which the DSDT names and no boot structure touches; a page of its own, 8-byte aligned
/// as the VMGenID spec asks.
pub const VMGENID_GPA: u64 = 0xd_1000;
/// The VMClock device's page (devices/acpi), likewise.
pub const VMCLOCK_GPA: u64 = 0xd_2000;
/// ACPI tables: the RSDP first (where a BIOS would put it), then the others.
pub const ACPI_START: u64 = 0xe_0000;
pub const ACPI_END: u64 = 0xf_0000;
/// The MP table (boot/mptable.rs), where Linux scans for it, reserved.
pub const MPTABLE_GPA: u64 = ACPI_END;
pub const MPTABLE_END: u64 = 0x10_0000;
/// Images are loaded at or above 1 MiB.
pub const HIGH_RAM_START: u64 = 0x10_0000;

// The hole below 4 GiB.
pub const MMIO_HOLE_START: u64 = abi::MMIO_HOLE_START;
pub const FOUR_GIB: u64 = 1 << 32;
pub const PCI_MMIO32_START: u64 = abi::PCI_MMIO_WINDOW_START;
pub const PCI_MMIO32_END: u64 = abi::ECAM_GPA;
pub const ECAM_GPA: u64 = abi::ECAM_GPA;
/// Bus 0's ECAM window: 256 functions of 4 KiB (pci::ecam checks the same).
pub const ECAM_SIZE: u64 = 1 << 20;
pub const IOAPIC_GPA: u64 = 0xfec0_0000;
/// The VT-d register block where QEMU's q35 puts it (`--testdev-iommu`, pci::iommu).
pub const IOMMU_GPA: u64 = 0xfed9_0000;
/// QEMU's pc-testdev scratch memory (with `--testdevs`), where kvm-unit-tests expects it.
pub const PC_TESTDEV_IOMEM_GPA: u64 = 0xff00_0000;
pub const LAPIC_GPA: u64 = abi::LAPIC_GPA;
/// KVM's real-mode TSS pages (Intel needs them before an irqchip), just below the BIOS area.
pub const TSS_GPA: u64 = 0xfffb_d000;
/// The 64-bit PCI window starts on this alignment after the last RAM.
const PCI_MMIO64_ALIGN: u64 = 1 << 30;
pub const PCI_MMIO64_SIZE: u64 = 64 << 30;
/// Room for virtio-pmem files, after the 64-bit PCI window.
pub const DEVICE_MEMORY_SIZE: u64 = 256 << 30;

// Port I/O.
/// The ACPI fixed-hardware block: PM1a event (4), PM1a control (2), PM timer (4), reset (1).
pub const ACPI_PM_PORT: u16 = 0x600;
pub const ACPI_PM1_EVT: u16 = ACPI_PM_PORT;
pub const ACPI_PM1_CNT: u16 = ACPI_PM_PORT + 4;
pub const ACPI_PM_TMR: u16 = ACPI_PM_PORT + 8;
pub const ACPI_RESET: u16 = ACPI_PM_PORT + 12;
pub const ACPI_PM_LEN: u64 = 13;
/// The ACPI PCI hotplug controller's registers (devices/acpi/pci_hotplug.rs), with PCI.
pub const PCI_HOTPLUG_PORT: u16 = 0x620;
/// What a guest writes to the reset register to reset (the FADT says so).
pub const ACPI_RESET_VALUE: u8 = 1;
/// IOAPIC pins for PCI INTx, past the ISA interrupts (handed out by the allocators).
pub const PCI_INTX_PINS: std::ops::RangeInclusive<u32> = 16..=23;
/// The ISA interrupt lines virtio-mmio devices take first: none of the PC's own (the PIT
/// 0, keyboard 1, cascade 2, COM1 4, RTC 8, the ACPI SCI 9).
pub const MMIO_IRQS: [u32; 9] = [5, 6, 7, 10, 11, 12, 13, 14, 15];
/// The ACPI SCI's ISA interrupt.
pub const SCI_IRQ: u8 = 9;
/// COM1 and its interrupt.
pub const COM1_PORT: u16 = abi::SERIAL_PORT as u16;
pub const COM1_IRQ: u32 = 4;
/// The i8042 keyboard controller's data and command ports (only its reset line is modelled).
pub const I8042_DATA_PORT: u16 = 0x60;
/// The PS/2 keyboard's ISA interrupt.
pub const I8042_IRQ: u32 = 1;
pub const I8042_CMD_PORT: u16 = 0x64;

// The fixed places stay where the map says, and apart.
const _: () = assert!(PCI_MMIO32_START >= MMIO_HOLE_START && PCI_MMIO32_END <= ECAM_GPA);
const _: () = assert!(ECAM_GPA + ECAM_SIZE <= IOAPIC_GPA && IOAPIC_GPA < LAPIC_GPA && LAPIC_GPA < TSS_GPA);
const _: () = assert!(IOAPIC_GPA + 0x1000 <= IOMMU_GPA && IOMMU_GPA + 0x1000 <= LAPIC_GPA);
const _: () = assert!(AP_TRAMPOLINE_GPA + 0x1000 <= START_INFO_GPA && MEMMAP_GPA + 0x200 <= ZERO_PAGE_GPA);
const _: () = assert!(BIOS_STUBS_GPA >= LOW_RAM_END && BIOS_STUBS_GPA + 0x1000 <= ACPI_START);
const _: () = assert!(VMGENID_GPA >= BIOS_STUBS_GPA + 0x1000 && VMGENID_GPA + 0x1000 <= VMCLOCK_GPA);
const _: () = assert!(VMCLOCK_GPA + 0x1000 <= ACPI_START);
const _: () = assert!(ZERO_PAGE_GPA + 0x1000 <= SHARED_PAGE_GPA && SHARED_PAGE_GPA + 0x1000 <= PML4_GPA);

/// What a range of the e820 (and PVH) memory map is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryType {
    Ram = 1,
    Reserved = 2,
    Acpi = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub addr: u64,
    pub size: u64,
    pub kind: MemoryType,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("guest memory size {0:#x} is not a multiple of 4 KiB")]
    Unaligned(u64),
    #[error("guest memory size {size} bytes is out of range: give between 4M and {}G", MAX_MEM >> 30)]
    Size { size: u64 },
}

/// The host bridge's windows for BARs (legacy devices in the I/O window take their
/// ports from the allocator first), and past them the device memory no BAR goes in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciWindows {
    pub io: std::ops::Range<u64>,
    pub mmio32: std::ops::Range<u64>,
    pub mmio64: std::ops::Range<u64>,
    pub device_memory: std::ops::Range<u64>,
}

/// The map for a guest with `ram` bytes of RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryMap {
    ram: u64,
}

impl MemoryMap {
    pub fn new(ram: u64) -> Result<Self, LayoutError> {
        if !(MIN_MEM..=MAX_MEM).contains(&ram) {
            return Err(LayoutError::Size { size: ram });
        }
        if !ram.is_multiple_of(PAGE_SIZE) {
            return Err(LayoutError::Unaligned(ram));
        }
        Ok(MemoryMap { ram })
    }

    pub fn ram_size(&self) -> u64 {
        self.ram
    }

    /// The end of RAM below the hole.
    pub fn low_ram_end(&self) -> u64 {
        self.ram.min(MMIO_HOLE_START)
    }

    /// RAM regions as (start, size): below the hole, then above 4 GiB if any is left.
    pub fn ram_regions(&self) -> Vec<(u64, u64)> {
        let mut regions = vec![(0, self.low_ram_end())];
        if self.ram > MMIO_HOLE_START {
            regions.push((FOUR_GIB, self.ram - MMIO_HOLE_START));
        }
        regions
    }

    /// The first guest address past all RAM.
    pub fn ram_end(&self) -> u64 {
        self.ram_regions().last().map_or(0, |&(start, size)| start + size)
    }

    /// The 64-bit PCI window: after the last RAM, aligned.
    pub fn pci_mmio64(&self) -> (u64, u64) {
        let start = self.ram_end().max(FOUR_GIB).next_multiple_of(PCI_MMIO64_ALIGN);
        (start, PCI_MMIO64_SIZE)
    }

    /// Device memory past the 64-bit PCI window, where no BAR goes (as Firecracker's
    /// "past MMIO64" space): virtio-pmem files, 2 MiB aligned.
    pub fn device_memory(&self) -> std::ops::Range<u64> {
        let (mmio64, size) = self.pci_mmio64();
        mmio64 + size..mmio64 + size + DEVICE_MEMORY_SIZE
    }

    /// Where the guest may place BARs, and the VMM allocates them.
    pub fn pci_windows(&self) -> PciWindows {
        let (mmio64, size) = self.pci_mmio64();
        PciWindows {
            io: abi::PCI_IO_WINDOW_START..0x1_0000,
            mmio32: PCI_MMIO32_START..PCI_MMIO32_END,
            mmio64: mmio64..mmio64 + size,
            device_memory: self.device_memory(),
        }
    }

    /// The memory map a guest is told (e820, PVH): RAM, the reserved BIOS area with the ACPI
    /// tables, and the ECAM window, which Linux wants reserved before it uses MCFG.
    pub fn e820(&self) -> Vec<MapEntry> {
        let entry = |addr, size, kind| MapEntry { addr, size, kind };
        let mut map = vec![
            entry(0, LOW_RAM_END, MemoryType::Ram),
            entry(LOW_RAM_END, ACPI_START - LOW_RAM_END, MemoryType::Reserved),
            entry(ACPI_START, ACPI_END - ACPI_START, MemoryType::Acpi),
            entry(MPTABLE_GPA, MPTABLE_END - MPTABLE_GPA, MemoryType::Reserved),
            entry(HIGH_RAM_START, self.low_ram_end() - HIGH_RAM_START, MemoryType::Ram),
            entry(ECAM_GPA, ECAM_SIZE, MemoryType::Reserved),
        ];
        if self.ram > MMIO_HOLE_START {
            map.push(entry(FOUR_GIB, self.ram - MMIO_HOLE_START, MemoryType::Ram));
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_splits_around_the_hole_and_nothing_overlaps() {
        let small = MemoryMap::new(128 << 20).unwrap();
        assert_eq!(small.ram_regions(), vec![(0, 128 << 20)]);
        let big = MemoryMap::new(8 << 30).unwrap();
        assert_eq!(big.ram_regions(), vec![(0, 3 << 30), (4 << 30, 5 << 30)]);
        assert_eq!(big.ram_end(), 9 << 30);
        assert!(big.pci_mmio64().0 >= big.ram_end());
        for map in [small, big] {
            let e820 = map.e820();
            let ram: u64 = e820.iter().filter(|e| e.kind == MemoryType::Ram).map(|e| e.size).sum();
            assert_eq!(ram, map.ram_size() - (HIGH_RAM_START - LOW_RAM_END));
            for (i, a) in e820.iter().enumerate() {
                for b in &e820[i + 1..] {
                    assert!(a.addr + a.size <= b.addr || b.addr + b.size <= a.addr, "{a:?} overlaps {b:?}");
                }
            }
        }
    }

    #[test]
    fn sizes_are_checked() {
        assert_eq!(MemoryMap::new((128 << 20) + 1), Err(LayoutError::Unaligned((128 << 20) + 1)));
        assert!(MemoryMap::new(1 << 20).is_err());
        assert!(MemoryMap::new(MAX_MEM + PAGE_SIZE).is_err());
    }
}
