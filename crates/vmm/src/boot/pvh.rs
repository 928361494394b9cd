//! The PVH start info (Xen's `hvm_start_info`), written through linux-loader's configurator:
//! command line, RSDP, memory map, and the initrd as the first module.

use super::zero_page::Boot;
use super::LoadError;
use crate::guest_memory::GuestMemoryMmap;
use crate::layout;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::elf::start_info::{hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info};
use vm_memory::GuestAddress;

/// XEN's PVH start info magic, "xEn3" with bit 31 flipped.
const HVM_START_MAGIC: u32 = 0x336e_c578;

pub fn write_start_info(mem: &GuestMemoryMmap, boot: &Boot) -> Result<(), LoadError> {
    let map: Vec<_> = boot
        .map
        .e820()
        .iter()
        .map(|e| hvm_memmap_table_entry { addr: e.addr, size: e.size, type_: e.kind as u32, reserved: 0 })
        .collect();
    let modules: Vec<_> =
        boot.initrd.iter().map(|i| hvm_modlist_entry { paddr: i.addr, size: i.size, ..Default::default() }).collect();
    let info = hvm_start_info {
        magic: HVM_START_MAGIC,
        version: 1,
        nr_modules: modules.len() as u32,
        modlist_paddr: if modules.is_empty() { 0 } else { layout::START_INFO_MODULES_GPA },
        cmdline_paddr: layout::CMDLINE_GPA,
        rsdp_paddr: boot.rsdp,
        memmap_paddr: layout::MEMMAP_GPA,
        memmap_entries: map.len() as u32,
        ..Default::default()
    };
    let mut params = BootParams::new(&info, GuestAddress(layout::START_INFO_GPA));
    params.set_sections(&map, GuestAddress(layout::MEMMAP_GPA));
    if !modules.is_empty() {
        params.set_modules(&modules, GuestAddress(layout::START_INFO_MODULES_GPA));
    }
    PvhBootConfigurator::write_bootparams::<GuestMemoryMmap>(&params, mem)?;
    Ok(())
}
