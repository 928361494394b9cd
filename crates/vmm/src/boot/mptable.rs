//! The Intel MultiProcessor table (MP spec 1.4), how a guest that boots with `acpi=off`
//! (Kata passes it) finds its vCPUs and the IOAPIC: the floating pointer and the
//! configuration table at [`layout::MPTABLE_GPA`] (in the reserved BIOS area, where Linux
//! scans 0xF0000-0xFFFFF for `_MP_`), with one processor entry per vCPU, the ISA bus, the
//! IOAPIC, an interrupt entry for each of its 24 pins (ISA IRQ n on pin n, as the MADT and
//! KVM's routing have them; the ACPI SCI level-triggered) and the local interrupts.

use crate::guest_memory::GuestMemoryMmap;
use crate::layout;
use vm_memory::{Bytes, GuestAddress};

const LAPIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
const IOAPIC_PINS: u8 = 24;
const ISA_BUS: u8 = 0;
/// Interrupt entry flags: polarity active high (01), trigger level (11).
const LEVEL_HIGH: u16 = 0b1101;

/// Writes the MP table for `vcpus` vCPUs (vCPU 0 the bootstrap processor).
pub fn write(mem: &GuestMemoryMmap, vcpus: u8) -> Result<(), vm_memory::GuestMemoryError> {
    let ioapic_id = vcpus;
    let mut entries = Vec::new();
    for id in 0..vcpus {
        let flags = if id == 0 { 0b11 } else { 0b01 }; // enabled, bootstrap processor
        entries.extend_from_slice(&[0, id, LAPIC_VERSION, flags]);
        entries.extend_from_slice(&0x600u32.to_le_bytes()); // signature: family 6
        entries.extend_from_slice(&0x201u32.to_le_bytes()); // features: FPU, APIC
        entries.extend_from_slice(&[0; 8]);
    }
    entries.extend_from_slice(&[1, ISA_BUS]);
    entries.extend_from_slice(b"ISA   ");
    entries.extend_from_slice(&[2, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend_from_slice(&(layout::IOAPIC_GPA as u32).to_le_bytes());
    for pin in 0..IOAPIC_PINS {
        let flags: u16 = if pin == layout::SCI_IRQ { LEVEL_HIGH } else { 0 }; // 0: as the bus has it
        entries.extend_from_slice(&[3, 0]); // an I/O interrupt, vectored (INT)
        entries.extend_from_slice(&flags.to_le_bytes());
        entries.extend_from_slice(&[ISA_BUS, pin, ioapic_id, pin]);
    }
    // LINT0 takes the PIC's interrupts (ExtINT), LINT1 is NMI, on every local APIC.
    for (kind, lint) in [(3u8, 0u8), (1, 1)] {
        entries.extend_from_slice(&[4, kind, 0, 0, ISA_BUS, 0, 0xff, lint]);
    }
    let count = u16::from(vcpus) + 2 + u16::from(IOAPIC_PINS) + 2;
    let table_at = layout::MPTABLE_GPA + 16;
    let length = 44 + entries.len();
    let mut table = Vec::with_capacity(length);
    table.extend_from_slice(b"PCMP");
    table.extend_from_slice(&(length as u16).to_le_bytes());
    table.extend_from_slice(&[4, 0]); // spec revision 1.4, checksum below
    table.extend_from_slice(b"EXITLESS");
    table.extend_from_slice(b"MICROVM     ");
    table.extend_from_slice(&[0; 4]); // no OEM table
    table.extend_from_slice(&[0; 2]);
    table.extend_from_slice(&count.to_le_bytes());
    table.extend_from_slice(&(layout::LAPIC_GPA as u32).to_le_bytes());
    table.extend_from_slice(&[0; 4]); // no extended table
    table.extend_from_slice(&entries);
    table[7] = checksum(&table);
    let mut pointer = Vec::with_capacity(16);
    pointer.extend_from_slice(b"_MP_");
    pointer.extend_from_slice(&(table_at as u32).to_le_bytes());
    pointer.extend_from_slice(&[1, 4, 0, 0, 0, 0, 0, 0]); // 16 bytes long, revision 1.4
    pointer[10] = checksum(&pointer);
    mem.write_slice(&pointer, GuestAddress(layout::MPTABLE_GPA))?;
    mem.write_slice(&table, GuestAddress(table_at))
}

/// The byte that makes `bytes` sum to zero.
fn checksum(bytes: &[u8]) -> u8 {
    0u8.wrapping_sub(bytes.iter().fold(0u8, |a, &b| a.wrapping_add(b)))
}

/// The room the table may take: its largest (254 vCPUs) must fit.
const MAX_LEN: u64 = 16 + 44 + 20 * 254 + 8 + 8 + 8 * IOAPIC_PINS as u64 + 16;
const _: () = assert!(MAX_LEN <= layout::MPTABLE_END - layout::MPTABLE_GPA);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_found_and_sums_to_zero_with_every_vcpu() {
        let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write(&mem, 3).unwrap();
        let mut pointer = [0u8; 16];
        mem.read_slice(&mut pointer, GuestAddress(layout::MPTABLE_GPA)).unwrap();
        assert_eq!(&pointer[..4], b"_MP_");
        assert_eq!(checksum(&pointer), 0);
        let at = u64::from(u32::from_le_bytes(pointer[4..8].try_into().unwrap()));
        let mut head = [0u8; 44];
        mem.read_slice(&mut head, GuestAddress(at)).unwrap();
        assert_eq!(&head[..4], b"PCMP");
        let len = usize::from(u16::from_le_bytes([head[4], head[5]]));
        let mut table = vec![0u8; len];
        mem.read_slice(&mut table, GuestAddress(at)).unwrap();
        assert_eq!(checksum(&table), 0);
        assert_eq!(u16::from_le_bytes([table[34], table[35]]), 3 + 2 + 24 + 2);
        // The processors: enabled, vCPU 0 the bootstrap one.
        let cpu = |i: usize| &table[44 + 20 * i..44 + 20 * (i + 1)];
        assert_eq!((cpu(0)[1], cpu(0)[3]), (0, 3));
        assert_eq!((cpu(2)[1], cpu(2)[3]), (2, 1));
        // The IOAPIC after the bus, at its address, with the id the MADT gives it.
        let ioapic = &table[44 + 60 + 8..44 + 60 + 16];
        assert_eq!((ioapic[0], ioapic[1]), (2, 3));
        assert_eq!(u32::from_le_bytes(ioapic[4..8].try_into().unwrap()), layout::IOAPIC_GPA as u32);
    }
}
