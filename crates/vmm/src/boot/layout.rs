//! Where the VMM puts things in low guest memory.

/// A GDT for the 64-bit entry: same selectors as the payload runtime's own
/// (0x08 code64, 0x10 data, 0x23 user data, 0x2b user code64).
pub const GDT_GPA: u64 = 0x500;
/// hvm_start_info for the PVH entry, followed by its memory map.
pub const START_INFO_GPA: u64 = 0x6000;
pub const MEMMAP_GPA: u64 = 0x6040;
/// Identity page tables for the 64-bit entry: PML4, PDPT, then four page directories.
pub const PML4_GPA: u64 = 0x9000;
pub const PDPT_GPA: u64 = 0xa000;
pub const PD_GPA: u64 = 0xb000;
/// End of the conventional low memory the boot map reports.
pub const LOW_RAM_END: u64 = 0x9fc00;
/// Images are loaded at or above 1 MiB.
pub const HIGH_RAM_START: u64 = 0x10_0000;
/// Initial stack pointer for the 64-bit entry.
pub const BOOT_STACK: u64 = 0x8_0000;
