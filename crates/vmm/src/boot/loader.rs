//! Loads an ELF image (linux-loader) and writes the PVH start info.

use super::layout::*;
use linux_loader::loader::elf::start_info::{hvm_memmap_table_entry, hvm_start_info};
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::KernelLoader;
use std::io::Cursor;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load the ELF image: {0}")]
    Elf(#[from] linux_loader::loader::Error),
    #[error("cannot write boot data into guest memory: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
}

/// How the vCPU enters the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryPoint {
    /// 32-bit protected mode, paging off, `%ebx` = start info (the PVH boot protocol).
    Pvh(u64),
    /// 64-bit long mode with identity-mapped low 4 GiB (ELF `e_entry`).
    Long64(u64),
}

/// XEN's PVH start info magic, "xEn3" with bit 31 flipped.
const HVM_START_MAGIC: u32 = 0x336e_c578;
const E820_RAM: u32 = 1;

/// Loads `image` at its physical addresses; with a PVH note, writes the start info too.
pub fn load_image(mem: &GuestMemoryMmap, image: &[u8], mem_size: u64) -> Result<EntryPoint, LoadError> {
    let loaded = Elf::load(mem, None, &mut Cursor::new(image), Some(GuestAddress(HIGH_RAM_START)))?;
    match loaded.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(entry) => {
            write_start_info(mem, mem_size)?;
            Ok(EntryPoint::Pvh(entry.0))
        }
        _ => Ok(EntryPoint::Long64(loaded.kernel_load.0)),
    }
}

fn write_start_info(mem: &GuestMemoryMmap, mem_size: u64) -> Result<(), LoadError> {
    let map = [
        hvm_memmap_table_entry { addr: 0, size: LOW_RAM_END, type_: E820_RAM, reserved: 0 },
        hvm_memmap_table_entry { addr: HIGH_RAM_START, size: mem_size - HIGH_RAM_START, type_: E820_RAM, reserved: 0 },
    ];
    for (i, entry) in map.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(MEMMAP_GPA + (i * std::mem::size_of::<hvm_memmap_table_entry>()) as u64))?;
    }
    let info = hvm_start_info {
        magic: HVM_START_MAGIC,
        version: 1,
        memmap_paddr: MEMMAP_GPA,
        memmap_entries: map.len() as u32,
        ..Default::default()
    };
    mem.write_obj(info, GuestAddress(START_INFO_GPA))?;
    Ok(())
}
