//! Multiboot (v1) images as kvm-unit-tests builds them: a 32-bit x86 ELF executable with a
//! multiboot header in its first 8 KiB. The ELF segments are loaded at their physical
//! addresses; the vCPU enters in 32-bit protected mode with paging off, `%eax` holding the
//! boot loader magic and `%ebx` the information structure: memory sizes, the memory map,
//! the command line, and the initrd as the one module (the suite passes its environment
//! that way).

use crate::guest_memory::GuestMemoryMmap;
use crate::layout::{self, MemoryMap};
use vm_memory::{Bytes, GuestAddress};

const HEADER_MAGIC: u32 = 0x1bad_b002;
/// What a multiboot loader leaves in `%eax`.
pub const BOOTLOADER_MAGIC: u32 = 0x2bad_b002;
/// The header must lie in the first 8 KiB, 4-byte aligned.
const HEADER_SEARCH: usize = 8192;
/// Header flag: the image gives load addresses itself (the a.out kludge), not as ELF.
const FLAG_ADDRESSES: u32 = 1 << 16;

const INFO_MEMORY: u32 = 1 << 0;
const INFO_CMDLINE: u32 = 1 << 2;
const INFO_MODULES: u32 = 1 << 3;
const INFO_MMAP: u32 = 1 << 6;

const PT_LOAD: u32 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MultibootError {
    #[error("the multiboot image is not a 32-bit x86 ELF executable (ELFCLASS32, EM_386, ET_EXEC)")]
    NotElf32,
    #[error("the multiboot image asks for the a.out address kludge (header flag 16); exitless loads ELF images only")]
    AoutKludge,
    #[error("the ELF image's program headers lie outside the file")]
    BadProgramHeaders,
    #[error("the ELF image has no loadable segment")]
    NoSegments,
    #[error("ELF segment {index} ({addr:#x}+{size:#x}) is not in guest RAM below {limit:#x}, or covers what exitless places below 1 MiB (multiboot info {info:#x}-{info_end:#x}, command line {cmdline:#x}, ACPI tables {acpi:#x})", info = layout::START_INFO_GPA, info_end = layout::ZERO_PAGE_GPA, cmdline = layout::CMDLINE_GPA, acpi = layout::ACPI_START)]
    SegmentOutsideRam { index: usize, addr: u64, size: u64, limit: u64 },
    #[error("ELF segment {0} holds more file bytes than the file has, or more than its memory size")]
    SegmentBytes(usize),
}

/// Whether `image` carries a valid multiboot header.
pub fn has_header(image: &[u8]) -> bool {
    header(image).is_some()
}

/// The header's flags, if there is a valid header.
fn header(image: &[u8]) -> Option<u32> {
    let window = &image[..image.len().min(HEADER_SEARCH)];
    window.chunks_exact(4).enumerate().find_map(|(i, w)| {
        let at = i * 4;
        let word = |k: usize| window.get(at + 4 * k..at + 4 * k + 4).map(le32);
        let (magic, flags, sum) = (le32(w), word(1)?, word(2)?);
        (magic == HEADER_MAGIC && magic.wrapping_add(flags).wrapping_add(sum) == 0).then_some(flags)
    })
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().unwrap_or_default())
}

/// One loadable segment: file range, where it goes, and its size in memory.
struct Segment {
    offset: usize,
    file_size: usize,
    addr: u64,
    mem_size: u64,
}

/// Checks the image and returns its entry point and segments.
fn parse(image: &[u8], map: &MemoryMap) -> Result<(u64, Vec<Segment>), MultibootError> {
    if header(image).is_some_and(|flags| flags & FLAG_ADDRESSES != 0) && !image.starts_with(b"\x7fELF") {
        return Err(MultibootError::AoutKludge);
    }
    let le16 = |at: usize| u16::from_le_bytes([image[at], image[at + 1]]);
    if image.len() < 52
        || !image.starts_with(b"\x7fELF")
        || image[4] != 1
        || image[5] != 1
        || le16(16) != 2
        || le16(18) != 3
    {
        return Err(MultibootError::NotElf32);
    }
    let (entry, phoff, phentsize, phnum) =
        (le32(&image[24..]), le32(&image[28..]) as usize, le16(42) as usize, le16(44) as usize);
    let table_end = phentsize.checked_mul(phnum).and_then(|len| len.checked_add(phoff));
    if phentsize < 32 || table_end.is_none_or(|end| end > image.len()) {
        return Err(MultibootError::BadProgramHeaders);
    }
    let limit = map.low_ram_end();
    let mut segments = Vec::new();
    for index in 0..phnum {
        let ph = &image[phoff + index * phentsize..];
        if le32(ph) != PT_LOAD {
            continue;
        }
        let (offset, addr) = (le32(&ph[4..]) as usize, u64::from(le32(&ph[12..])));
        let (file_size, mem_size) = (le32(&ph[16..]) as usize, u64::from(le32(&ph[20..])));
        if file_size as u64 > mem_size || offset.checked_add(file_size).is_none_or(|end| end > image.len()) {
            return Err(MultibootError::SegmentBytes(index));
        }
        if !fits(addr, mem_size, limit) {
            return Err(MultibootError::SegmentOutsideRam { index, addr, size: mem_size, limit });
        }
        segments.push(Segment { offset, file_size, addr, mem_size });
    }
    if segments.is_empty() {
        return Err(MultibootError::NoSegments);
    }
    Ok((u64::from(entry), segments))
}

/// Whether a segment lies in RAM and clear of what the VMM writes for a multiboot guest.
/// Below 1 MiB that is the first page (real-mode IVT), the info structure with its module
/// list and memory map, the command line, and the ACPI tables; the rest of low RAM is the
/// guest's (kvm-unit-tests' realmode test is linked at 0x8000).
fn fits(addr: u64, size: u64, limit: u64) -> bool {
    let Some(end) = addr.checked_add(size) else { return false };
    let in_ram =
        (addr >= layout::PAGE_SIZE && end <= layout::LOW_RAM_END) || (addr >= layout::HIGH_RAM_START && end <= limit);
    let reserved = [
        (layout::START_INFO_GPA, layout::ZERO_PAGE_GPA),
        (layout::CMDLINE_GPA, layout::CMDLINE_GPA + layout::CMDLINE_MAX as u64 + 1),
    ];
    in_ram && reserved.iter().all(|&(start, stop)| end <= start || addr >= stop)
}

/// Checks that `image` is a multiboot ELF that fits in `map`'s RAM.
pub fn check(image: &[u8], map: &MemoryMap) -> Result<(), MultibootError> {
    parse(image, map).map(drop)
}

/// Loads the segments; returns the entry point and the first page past them.
pub fn load(mem: &GuestMemoryMmap, map: &MemoryMap, image: &[u8]) -> Result<(u64, u64), super::LoadError> {
    let (entry, segments) = parse(image, map).map_err(|e| super::LoadError::Image(e.into()))?;
    let mut end = 0;
    for s in &segments {
        mem.write_slice(&image[s.offset..s.offset + s.file_size], GuestAddress(s.addr))?;
        let bss = vec![0u8; (s.mem_size - s.file_size as u64) as usize];
        mem.write_slice(&bss, GuestAddress(s.addr + s.file_size as u64))?;
        end = end.max(s.addr + s.mem_size);
    }
    Ok((entry, end.next_multiple_of(layout::PAGE_SIZE)))
}

/// Writes the information structure (at `START_INFO_GPA`, which PVH would use), the memory
/// map and the module list; the command line is already at `CMDLINE_GPA`.
pub fn write_info(
    mem: &GuestMemoryMmap,
    map: &MemoryMap,
    initrd: Option<super::Placed>,
) -> Result<(), vm_memory::GuestMemoryError> {
    let mut mmap = Vec::new();
    for e in map.e820() {
        let kind = e.kind as u32; // the e820 type numbers are multiboot's too
        mmap.extend_from_slice(&20u32.to_le_bytes()); // the entry's size, not counting this field
        mmap.extend_from_slice(&e.addr.to_le_bytes());
        mmap.extend_from_slice(&e.size.to_le_bytes());
        mmap.extend_from_slice(&kind.to_le_bytes());
    }
    mem.write_slice(&mmap, GuestAddress(layout::MEMMAP_GPA))?;
    let mut flags = INFO_MEMORY | INFO_CMDLINE | INFO_MMAP;
    let (mut mods_count, mods_addr) = (0u32, layout::START_INFO_MODULES_GPA as u32);
    if let Some(initrd) = initrd {
        flags |= INFO_MODULES;
        mods_count = 1;
        // start, end, string (an empty one: the NUL right after the command line is not
        // ours to promise, so point at the zero `reserved` word of this entry), reserved.
        let module = [initrd.addr as u32, (initrd.addr + initrd.size) as u32, mods_addr + 12, 0];
        for (i, v) in module.iter().enumerate() {
            mem.write_obj(*v, GuestAddress(u64::from(mods_addr) + 4 * i as u64))?;
        }
    }
    let mem_lower_kib = (layout::LOW_RAM_END / 1024) as u32;
    let mem_upper_kib = ((map.low_ram_end() - layout::HIGH_RAM_START) / 1024) as u32;
    let info: [u32; 13] = [
        flags,
        mem_lower_kib,
        mem_upper_kib,
        0, // boot_device
        layout::CMDLINE_GPA as u32,
        mods_count,
        mods_addr,
        0,
        0,
        0,
        0, // syms
        mmap.len() as u32,
        layout::MEMMAP_GPA as u32,
    ];
    for (i, v) in info.iter().enumerate() {
        mem.write_obj(*v, GuestAddress(layout::START_INFO_GPA + 4 * i as u64))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal multiboot ELF32: one segment of `code` at `addr`, entry at `addr`.
    pub fn image(addr: u32, code: &[u8], flags: u32) -> Vec<u8> {
        let mut img = vec![0u8; 0x100];
        img[..4].copy_from_slice(b"\x7fELF");
        (img[4], img[5], img[6]) = (1, 1, 1);
        img[16..18].copy_from_slice(&2u16.to_le_bytes());
        img[18..20].copy_from_slice(&3u16.to_le_bytes());
        img[24..28].copy_from_slice(&addr.to_le_bytes());
        img[28..32].copy_from_slice(&52u32.to_le_bytes());
        img[42..44].copy_from_slice(&32u16.to_le_bytes());
        img[44..46].copy_from_slice(&1u16.to_le_bytes());
        let ph = [PT_LOAD, 0x100, addr, addr, code.len() as u32, code.len() as u32 + 0x1000, 5, 0x1000];
        for (i, v) in ph.iter().enumerate() {
            img[52 + 4 * i..56 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        let hdr = [HEADER_MAGIC, flags, 0u32.wrapping_sub(HEADER_MAGIC.wrapping_add(flags))];
        for (i, v) in hdr.iter().enumerate() {
            img[0x80 + 4 * i..0x84 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        img.extend_from_slice(code);
        img
    }

    #[test]
    fn headers_are_found_only_with_a_good_checksum() {
        let good = image(0x40_0000, &[0xf4], 0);
        assert!(has_header(&good));
        let mut bad = good.clone();
        bad[0x88] ^= 1;
        assert!(!has_header(&bad));
        assert!(!has_header(&good[..0x84]), "a header cut short");
    }

    #[test]
    fn segments_must_be_in_ram_clear_of_the_boot_structures_and_whole() {
        let map = MemoryMap::new(64 << 20).unwrap();
        assert!(check(&image(0x40_0000, &[0xf4], 0), &map).is_ok());
        for refused in [0x0, 0x5800, 0x6000, 0x1_ff00, 0x9_f000, 0xe_0000] {
            let found = check(&image(refused, &[0xf4; 0x1000], 0), &map);
            assert!(matches!(found, Err(MultibootError::SegmentOutsideRam { .. })), "{refused:#x}: {found:?}");
        }
        // Low RAM clear of the VMM's structures is the guest's, as realmode.flat needs.
        assert_eq!(check(&image(0x8000, &[0xf4; 0x5000], 0), &map), Ok(()));
        assert!(matches!(check(&image(0x3ff_f000, &[0xf4], 0), &map), Err(MultibootError::SegmentOutsideRam { .. })));
        let mut truncated = image(0x40_0000, &[0xf4; 16], 0);
        truncated.truncate(0x108);
        assert_eq!(check(&truncated, &map), Err(MultibootError::SegmentBytes(0)));
        let mut elf64 = image(0x40_0000, &[0xf4], 0);
        elf64[4] = 2;
        assert_eq!(check(&elf64, &map), Err(MultibootError::NotElf32));
    }
}
