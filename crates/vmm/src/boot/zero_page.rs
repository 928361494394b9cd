//! The Linux zero page (`boot_params`) for the 64-bit boot protocol, written through
//! linux-loader's configurator.

use super::{LoadError, Placed};
use crate::guest_memory::GuestMemoryMmap;
use crate::layout::{self, MemoryMap};
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use vm_memory::GuestAddress;

/// "Undefined" boot loader: no registered loader ID.
const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// loadflags: CAN_USE_HEAP.
const CAN_USE_HEAP: u8 = 0x80;
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
/// `heap_end_ptr`: the end of the setup heap, relative to the real-mode code (unused by
/// the 64-bit entry, but a loader sets it along with CAN_USE_HEAP).
const HEAP_END: u16 = 0xfe00;

/// What both boot protocols hand the guest.
pub struct Boot<'a> {
    pub map: &'a MemoryMap,
    pub cmdline_len: usize,
    pub initrd: Option<Placed>,
    pub rsdp: u64,
}

/// Writes the zero page: the image's own setup header (for a bzImage) or a plain one, with
/// the command line, initrd, RSDP and e820 map filled in.
pub fn write(mem: &GuestMemoryMmap, header: Option<setup_header>, boot: &Boot) -> Result<(), LoadError> {
    let hdr = header.unwrap_or(setup_header {
        boot_flag: KERNEL_BOOT_FLAG_MAGIC,
        header: KERNEL_HDR_MAGIC,
        kernel_alignment: 0x0100_0000,
        ..Default::default()
    });
    let mut params = boot_params { hdr, ..Default::default() };
    params.hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    params.hdr.loadflags |= CAN_USE_HEAP;
    params.hdr.heap_end_ptr = HEAP_END;
    params.hdr.cmd_line_ptr = layout::CMDLINE_GPA as u32;
    params.hdr.cmdline_size = boot.cmdline_len as u32 + 1;
    if let Some(initrd) = boot.initrd {
        params.hdr.ramdisk_image = initrd.addr as u32;
        params.hdr.ramdisk_size = initrd.size as u32;
        params.ext_ramdisk_size = (initrd.size >> 32) as u32;
    }
    params.acpi_rsdp_addr = boot.rsdp;
    let map = boot.map.e820();
    for (slot, entry) in params.e820_table.iter_mut().zip(&map) {
        *slot = boot_e820_entry { addr: entry.addr, size: entry.size, r#type: entry.kind as u32 };
    }
    params.e820_entries = map.len().min(params.e820_table.len()) as u8;
    LinuxBootConfigurator::write_bootparams::<GuestMemoryMmap>(
        &BootParams::new(&params, GuestAddress(layout::ZERO_PAGE_GPA)),
        mem,
    )?;
    Ok(())
}
