//! What kind of image a user handed us, checked before anything is loaded: a file that is
//! not one the VMM can boot gets an error that says why, never a guest running garbage.

use crate::layout::MemoryMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A 64-bit x86 ELF executable (PVH note or 64-bit entry).
    Elf,
    /// A bzImage (Linux boot protocol 2.12+ with a 64-bit entry point).
    BzImage { cmdline_max: usize },
    /// A 32-bit ELF with a multiboot header (kvm-unit-tests' `.flat` files).
    Multiboot,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("the image is {0} bytes: too short to be a kernel")]
    Truncated(usize),
    #[error("the image is neither an ELF file nor a bzImage")]
    Unknown,
    #[error(transparent)]
    Multiboot(#[from] super::multiboot::MultibootError),
    #[error("the ELF image is {0}; exitless boots 64-bit x86 executables (ELFCLASS64, EM_X86_64, ET_EXEC) and 32-bit multiboot ones")]
    ElfKind(&'static str),
    #[error("the ELF image has no loadable segment")]
    NoSegments,
    #[error("ELF segment {index} ({addr:#x}+{size:#x}) is not inside guest RAM")]
    SegmentOutsideRam { index: usize, addr: u64, size: u64 },
    #[error("the ELF image's program headers lie outside the file")]
    BadProgramHeaders,
    #[error("the bzImage uses boot protocol {major}.{minor:02}; exitless needs 2.12 or later")]
    OldProtocol { major: u8, minor: u8 },
    #[error("the bzImage has no 64-bit entry point (XLF_KERNEL_64)")]
    No64BitEntry,
    #[error("the bzImage is {have} bytes but its header says its setup alone takes {need}")]
    BzTruncated { have: usize, need: usize },
}

const PT_LOAD: u32 = 1;
const XLF_KERNEL_64: u16 = 1;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

/// Recognises `image` and checks that it can run in `map`'s RAM.
pub fn identify(image: &[u8], map: &MemoryMap) -> Result<Kind, ImageError> {
    if image.len() < 0x270 {
        return Err(ImageError::Truncated(image.len()));
    }
    if is_multiboot(image) {
        super::multiboot::check(image, map)?;
        return Ok(Kind::Multiboot);
    }
    if image.starts_with(b"\x7fELF") {
        check_elf(image, map)?;
        return Ok(Kind::Elf);
    }
    if &image[0x202..0x206] == b"HdrS" {
        return check_bzimage(image);
    }
    Err(ImageError::Unknown)
}

/// Whether `image` is a Linux kernel: a bzImage whose header points at a kernel version
/// string (`kernel_version`, 0x20e), or an ELF vmlinux (which carries ELF notes owned by
/// "Linux"). exitless's payloads, ELF or bzImage, have neither.
pub fn is_linux(image: &[u8]) -> bool {
    if image.len() >= 0x270 && &image[0x202..0x206] == b"HdrS" {
        let at = usize::from(u16_at(image, 0x20e));
        return at != 0 && image.get(0x200 + at).is_some_and(u8::is_ascii_digit);
    }
    if image.len() < 64 || !image.starts_with(b"\x7fELF") || image[4] != 2 {
        return false;
    }
    const PT_NOTE: u32 = 4;
    let (phoff, phentsize, phnum) = (u64_at(image, 32), usize::from(u16_at(image, 54)), usize::from(u16_at(image, 56)));
    (0..phnum).any(|i| {
        let Some(ph) = usize::try_from(phoff).ok().and_then(|o| o.checked_add(i * phentsize)) else { return false };
        if phentsize < 56 || ph + 56 > image.len() || u32_at(image, ph) != PT_NOTE {
            return false;
        }
        let (offset, size) = (u64_at(image, ph + 8) as usize, u64_at(image, ph + 32) as usize);
        let notes = image.get(offset..offset.saturating_add(size)).unwrap_or_default();
        notes_owned_by(notes, b"Linux\0")
    })
}

/// Whether an ELF note in `notes` has owner `name` (with its NUL).
fn notes_owned_by(notes: &[u8], name: &[u8]) -> bool {
    let mut at = 0;
    while at + 12 <= notes.len() {
        let (namesz, descsz) = (u32_at(notes, at) as usize, u32_at(notes, at + 4) as usize);
        let owner = notes.get(at + 12..at + 12 + namesz).unwrap_or_default();
        if owner == name {
            return true;
        }
        at += 12 + namesz.next_multiple_of(4) + descsz.next_multiple_of(4);
    }
    false
}

/// A 32-bit ELF with a multiboot header: its command line starts with the image's own
/// name, as QEMU and GRUB hand it over (kvm-unit-tests reads its arguments from argv[1]).
pub fn is_multiboot(image: &[u8]) -> bool {
    image.len() >= 0x270 && image.starts_with(b"\x7fELF") && image[4] == 1 && super::multiboot::has_header(image)
}

fn check_elf(image: &[u8], map: &MemoryMap) -> Result<(), ImageError> {
    match (image[4], image[5], u16_at(image, 16), u16_at(image, 18)) {
        (2, 1, 2, 62) => {}
        (1, ..) => return Err(ImageError::ElfKind("32-bit (ELFCLASS32)")),
        (_, 2, ..) => return Err(ImageError::ElfKind("big-endian")),
        (_, _, 3, _) => return Err(ImageError::ElfKind("position-independent (ET_DYN)")),
        (_, _, t, 62) if t != 2 => return Err(ImageError::ElfKind("not an executable")),
        _ => return Err(ImageError::ElfKind("not for x86-64")),
    }
    let (phoff, phentsize, phnum) = (u64_at(image, 32), u64::from(u16_at(image, 54)), u64::from(u16_at(image, 56)));
    let table_end = phentsize.checked_mul(phnum).and_then(|len| len.checked_add(phoff));
    if phentsize < 56 || table_end.is_none_or(|end| end > image.len() as u64) {
        return Err(ImageError::BadProgramHeaders);
    }
    let mut loadable = 0;
    for index in 0..phnum {
        let ph = (phoff + index * phentsize) as usize;
        if u32_at(image, ph) != PT_LOAD {
            continue;
        }
        loadable += 1;
        let (addr, size) = (u64_at(image, ph + 24), u64_at(image, ph + 40));
        let inside = map
            .ram_regions()
            .iter()
            .any(|&(start, len)| addr >= start && addr.checked_add(size).is_some_and(|end| end <= start + len));
        if !inside {
            return Err(ImageError::SegmentOutsideRam { index: index as usize, addr, size });
        }
    }
    if loadable == 0 {
        return Err(ImageError::NoSegments);
    }
    Ok(())
}

fn check_bzimage(image: &[u8]) -> Result<Kind, ImageError> {
    let version = u16_at(image, 0x206);
    if version < 0x020c {
        return Err(ImageError::OldProtocol { major: (version >> 8) as u8, minor: version as u8 });
    }
    if u16_at(image, 0x236) & XLF_KERNEL_64 == 0 {
        return Err(ImageError::No64BitEntry);
    }
    let setup_sects = match image[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let need = (setup_sects + 1) * 512;
    if image.len() <= need {
        return Err(ImageError::BzTruncated { have: image.len(), need });
    }
    Ok(Kind::BzImage { cmdline_max: u32_at(image, 0x238) as usize })
}

#[cfg(test)]
mod tests {

    #[test]
    fn linux_is_told_from_payloads_by_its_version_string_or_notes() {
        let mut bz = vec![0u8; 0x400];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert!(!super::is_linux(&bz), "a bzImage without kernel_version is a payload");
        bz[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
        bz[0x300..0x307].copy_from_slice(b"6.1.192");
        assert!(super::is_linux(&bz));
        let payload = exitless_payloads::find("demo").unwrap().elf;
        assert!(!super::is_linux(payload));
    }

    use super::*;

    fn map() -> MemoryMap {
        MemoryMap::new(128 << 20).unwrap()
    }

    /// A minimal ELF64 header with one PT_LOAD program header.
    fn elf(class: u8, etype: u16, machine: u16, phnum: u16, paddr: u64, memsz: u64) -> Vec<u8> {
        let mut b = vec![0u8; 0x300];
        b[..4].copy_from_slice(b"\x7fELF");
        (b[4], b[5]) = (class, 1);
        b[16..18].copy_from_slice(&etype.to_le_bytes());
        b[18..20].copy_from_slice(&machine.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&phnum.to_le_bytes());
        b[64..68].copy_from_slice(&PT_LOAD.to_le_bytes());
        b[64 + 24..64 + 32].copy_from_slice(&paddr.to_le_bytes());
        b[64 + 40..64 + 48].copy_from_slice(&memsz.to_le_bytes());
        b
    }

    #[test]
    fn elf_images_are_checked_before_loading() {
        assert_eq!(identify(&elf(2, 2, 62, 1, 0x100000, 0x1000), &map()), Ok(Kind::Elf));
        assert!(matches!(identify(&elf(1, 2, 62, 1, 0x100000, 0x1000), &map()), Err(ImageError::ElfKind(_))));
        assert!(matches!(identify(&elf(2, 3, 62, 1, 0x100000, 0x1000), &map()), Err(ImageError::ElfKind(_))));
        assert!(matches!(identify(&elf(2, 2, 183, 1, 0x100000, 0x1000), &map()), Err(ImageError::ElfKind(_))));
        assert_eq!(identify(&elf(2, 2, 62, 0, 0x100000, 0x1000), &map()), Err(ImageError::NoSegments));
        assert!(matches!(
            identify(&elf(2, 2, 62, 1, 0x100000, 1 << 30), &map()),
            Err(ImageError::SegmentOutsideRam { .. })
        ));
        assert!(matches!(
            identify(&elf(2, 2, 62, 1, u64::MAX - 10, 100), &map()),
            Err(ImageError::SegmentOutsideRam { .. })
        ));
        assert_eq!(identify(&elf(2, 2, 62, 1000, 0x100000, 0x1000), &map()), Err(ImageError::BadProgramHeaders));
        assert_eq!(identify(b"\x7fELF", &map()), Err(ImageError::Truncated(4)));
        assert_eq!(identify(&[0u8; 4096], &map()), Err(ImageError::Unknown));
    }

    #[test]
    fn bzimages_need_a_recent_protocol_and_a_64_bit_entry() {
        let mut b = vec![0u8; 8192];
        b[0x1f1] = 4;
        b[0x202..0x206].copy_from_slice(b"HdrS");
        b[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        b[0x236] = 1;
        b[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes());
        assert_eq!(identify(&b, &map()), Ok(Kind::BzImage { cmdline_max: 2047 }));
        b[0x206] = 0x0a;
        assert_eq!(identify(&b, &map()), Err(ImageError::OldProtocol { major: 2, minor: 10 }));
        b[0x206] = 0x0f;
        b[0x236] = 0;
        assert_eq!(identify(&b, &map()), Err(ImageError::No64BitEntry));
        b[0x236] = 1;
        assert!(matches!(identify(&b[..0x900], &map()), Err(ImageError::BzTruncated { .. })));
    }
}
