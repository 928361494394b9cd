//! Getting a guest image into memory and the vCPUs into their entry state.
//!
//! [`load`] recognises the image ([`image::Kind`]), loads it with linux-loader, places the
//! command line and the initrd, and writes what the image's boot protocol hands over:
//! the Linux zero page ([`zero_page`]) or the PVH start info ([`pvh`]).

pub mod bios_state;
pub mod cpu;
pub mod cpuid_normalize;
pub mod image;
pub mod mptable;
pub mod multiboot;
pub mod pvh;
pub mod regs;
pub mod zero_page;

use crate::guest_memory::GuestMemoryMmap;
use crate::layout::{self, MemoryMap};
use image::Kind;
use linux_loader::loader::bzimage::BzImage;
use linux_loader::loader::elf::{Elf, PvhBootCapability};
use linux_loader::loader::KernelLoader;
use std::io::Cursor;
use vm_memory::{Bytes, GuestAddress};

/// The command line a guest gets when none is given.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=1";

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Image(#[from] image::ImageError),
    #[error("cannot load the kernel image")]
    Loader(#[source] linux_loader::loader::Error),
    #[error("cannot write boot data into guest memory")]
    Memory(#[from] vm_memory::GuestMemoryError),
    #[error("cannot write the boot parameters")]
    Configurator(#[from] linux_loader::configurator::Error),
    #[error("the command line is {len} bytes; this kernel takes at most {max}")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("the command line contains a NUL byte")]
    CmdlineNul,
    #[error("the initrd ({size} bytes) does not fit in guest RAM between the kernel (ends at {kernel_end:#x}) and {limit:#x}")]
    InitrdTooBig { size: u64, kernel_end: u64, limit: u64 },
}

/// How the vCPU enters the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryPoint {
    /// 32-bit protected mode, paging off, `%ebx` = start info (the PVH boot protocol).
    Pvh(u64),
    /// 64-bit long mode with identity-mapped low 4 GiB, `%rsi` = zero page (the 64-bit Linux
    /// boot protocol: a bzImage, or an ELF without a PVH note).
    Long64(u64),
    /// 32-bit protected mode, paging off, `%eax` = the multiboot magic, `%ebx` = its
    /// information structure.
    Multiboot(u64),
}

/// What the guest is handed besides its image.
pub struct BootSpec<'a> {
    pub cmdline: &'a str,
    pub initrd: Option<&'a [u8]>,
    /// Where the ACPI RSDP is (the tables are written before the image is loaded).
    pub rsdp: u64,
}

/// Where the initrd went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub addr: u64,
    pub size: u64,
}

/// Loads `image` and everything its boot protocol needs; returns where to start.
pub fn load(mem: &GuestMemoryMmap, map: &MemoryMap, image: &[u8], spec: &BootSpec) -> Result<EntryPoint, LoadError> {
    let kind = image::identify(image, map)?;
    let highmem = Some(GuestAddress(layout::HIGH_RAM_START));
    let (loaded, cmdline_max) = match kind {
        Kind::Multiboot => return load_multiboot(mem, map, image, spec),
        Kind::Elf => (Elf::load(mem, None, &mut Cursor::new(image), highmem), layout::CMDLINE_MAX),
        Kind::BzImage { cmdline_max } => {
            (BzImage::load(mem, None, &mut Cursor::new(image), highmem), cmdline_max.min(layout::CMDLINE_MAX))
        }
    };
    let loaded = loaded.map_err(LoadError::Loader)?;
    write_cmdline(mem, spec.cmdline, cmdline_max)?;
    let initrd = match spec.initrd {
        Some(bytes) => {
            let limit = loaded.setup_header.map_or(u64::MAX, |h| u64::from(h.initrd_addr_max) + 1);
            Some(place_initrd(mem, map, bytes, loaded.kernel_end, limit)?)
        }
        None => None,
    };
    let boot = zero_page::Boot { map, cmdline_len: spec.cmdline.len(), initrd, rsdp: spec.rsdp };
    match (kind, loaded.pvh_boot_cap) {
        (Kind::Elf, PvhBootCapability::PvhEntryPresent(entry)) => {
            pvh::write_start_info(mem, &boot)?;
            Ok(EntryPoint::Pvh(entry.0))
        }
        (Kind::Elf, _) => {
            zero_page::write(mem, None, &boot)?;
            Ok(EntryPoint::Long64(loaded.kernel_load.0))
        }
        (_, _) => {
            zero_page::write(mem, loaded.setup_header, &boot)?;
            // The 64-bit entry point is 0x200 past the start of the protected-mode kernel.
            Ok(EntryPoint::Long64(loaded.kernel_load.0 + 0x200))
        }
    }
}

/// A multiboot image: its segments, then the initrd as a module on the next page (from
/// 1 MiB up when the image lies in low RAM).
fn load_multiboot(
    mem: &GuestMemoryMmap,
    map: &MemoryMap,
    image: &[u8],
    spec: &BootSpec,
) -> Result<EntryPoint, LoadError> {
    let (entry, end) = multiboot::load(mem, map, image)?;
    let end = end.max(layout::HIGH_RAM_START);
    write_cmdline(mem, spec.cmdline, layout::CMDLINE_MAX)?;
    let initrd = match spec.initrd {
        Some(bytes) => {
            let size = bytes.len() as u64;
            let top = map.low_ram_end();
            if end.checked_add(size).is_none_or(|e| e > top) {
                return Err(LoadError::InitrdTooBig { size, kernel_end: end, limit: top });
            }
            mem.write_slice(bytes, GuestAddress(end))?;
            Some(Placed { addr: end, size })
        }
        None => None,
    };
    multiboot::write_info(mem, map, initrd)?;
    bios_state::write_ivt(mem)?;
    Ok(EntryPoint::Multiboot(entry))
}

fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &str, max: usize) -> Result<(), LoadError> {
    if cmdline.len() > max {
        return Err(LoadError::CmdlineTooLong { len: cmdline.len(), max });
    }
    if cmdline.contains('\0') {
        return Err(LoadError::CmdlineNul);
    }
    mem.write_slice(cmdline.as_bytes(), GuestAddress(layout::CMDLINE_GPA))?;
    mem.write_obj(0u8, GuestAddress(layout::CMDLINE_GPA + cmdline.len() as u64))?;
    Ok(())
}

/// The initrd goes as high as it can below the hole (and below what the kernel can reach),
/// page-aligned, above the kernel: where Linux's boot loaders put it.
fn place_initrd(
    mem: &GuestMemoryMmap,
    map: &MemoryMap,
    bytes: &[u8],
    kernel_end: u64,
    limit: u64,
) -> Result<Placed, LoadError> {
    let size = bytes.len() as u64;
    let top = map.low_ram_end().min(limit);
    let too_big = || LoadError::InitrdTooBig { size, kernel_end, limit: top };
    let addr = top.checked_sub(size).ok_or_else(too_big)? & !(layout::PAGE_SIZE - 1);
    if addr < kernel_end.next_multiple_of(layout::PAGE_SIZE) {
        return Err(too_big());
    }
    mem.write_slice(bytes, GuestAddress(addr))?;
    Ok(Placed { addr, size })
}
