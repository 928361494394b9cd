//! Built-in guest payloads: freestanding C programs with a tiny runtime, compiled by
//! build.rs into PVH-bootable ELF images (and a few 32-bit multiboot ones) and embedded here.

pub mod abi;

/// One embedded guest image.
#[derive(Debug)]
pub struct Payload {
    pub name: &'static str,
    /// One line for `exitless payloads`.
    pub about: &'static str,
    /// The ELF image (PVH entry note included).
    pub elf: &'static [u8],
    /// The same payload as a bzImage, for those built that way too.
    pub bzimage: Option<&'static [u8]>,
    /// A 32-bit multiboot ELF rather than a 64-bit PVH one.
    pub multiboot: bool,
}

include!(concat!(env!("OUT_DIR"), "/payloads.rs"));

/// The payload `exitless run` boots when none is named.
pub const DEFAULT_PAYLOAD: &str = "demo";

/// Looks a payload up by name.
pub fn find(name: &str) -> Option<&'static Payload> {
    PAYLOADS.iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_payload_is_an_elf_with_a_pvh_note() {
        assert!(find(DEFAULT_PAYLOAD).is_some());
        for p in PAYLOADS.iter().filter(|p| !p.multiboot) {
            assert_eq!(&p.elf[..4], b"\x7fELF", "{}", p.name);
            // XEN_ELFNOTE_PHYS32_ENTRY = 18, name "Xen".
            let note = [4u8, 0, 0, 0, 8, 0, 0, 0, 18, 0, 0, 0, b'X', b'e', b'n', 0];
            assert!(p.elf.windows(note.len()).any(|w| w == note), "{} lacks a PVH note", p.name);
        }
    }
}
