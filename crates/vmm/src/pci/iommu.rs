//! A model of the Intel VT-d register set at QEMU's q35 address, for the devices behind
//! it (here only the edu test device, `pci/edu.rs`): DMA remapping through the root,
//! context and 3-level second-level page tables (39-bit addresses), and interrupt
//! remapping of remappable-format MSIs through the IRTE table. What kvm-unit-tests'
//! `intel_iommu` programs: global command/status, the root and IR table pointers, the
//! invalidation queue (descriptors are consumed; nothing is cached, so each is done at
//! once, and an invalidation-wait descriptor writes its status). No fault recording: a
//! translation that fails fails the DMA, and that is logged. No DMAR ACPI table: a
//! guest finds it where kvm-unit-tests looks, at the fixed address.

use crate::bus::BusDevice;
use crate::guest_memory::GuestMemoryMmap;
use crate::irq::MsiMessage;
use std::sync::Mutex;
use vm_memory::{Bytes, GuestAddress};

pub const IOMMU_LEN: u64 = 0x1000;

const VER: u64 = 0x00;
const CAP: u64 = 0x08;
const ECAP: u64 = 0x10;
const GCMD: u64 = 0x18;
const GSTS: u64 = 0x1c;
const RTADDR: u64 = 0x20;
const FSTS: u64 = 0x34;
const IQH: u64 = 0x80;
const IQT: u64 = 0x88;
const IQA: u64 = 0x90;
const ICS: u64 = 0x9c;
const IRTA: u64 = 0xb8;

/// Version 1.0.
const VERSION: u32 = 0x10;
/// 39-bit guest addresses (SAGAW bit 1), 2 MiB and 1 GiB pages (SLLPS), 8 fault
/// registers' worth of room, 16-bit domain IDs (ND = 6), MGAW 39 (38 in the field).
const CAPABILITIES: u64 = (0x2 << 8) | (0b11 << 34) | (38 << 16) | 6;
/// Queued invalidation (QI, bit 1), interrupt remapping (IR, bit 3).
const EXTENDED_CAPABILITIES: u64 = (1 << 1) | (1 << 3);

/// Global command/status bits. Enables stay as written; "set pointer" commands are
/// one-shot and leave their status bit set.
const TE: u32 = 1 << 31;
const SRTP: u32 = 1 << 30;
const QIE: u32 = 1 << 26;
const IRE: u32 = 1 << 25;
const SIRTP: u32 = 1 << 24;
const ENABLES: u32 = TE | QIE | IRE;

const PAGE: u64 = 0x1000;
/// Bits 12-51 of an entry: the next table or the page.
const ADDRESS: u64 = 0x000f_ffff_ffff_f000;
const PTE_READ: u64 = 1 << 0;
const PTE_WRITE: u64 = 1 << 1;
const PTE_SUPERPAGE: u64 = 1 << 7;
/// MSI address bit 4: the message is in remappable format.
const MSI_REMAPPABLE: u64 = 1 << 4;

#[derive(Default)]
struct Registers {
    gsts: u32,
    rtaddr: u64,
    irta: u64,
    iqa: u64,
    iqh: u64,
    iqt: u64,
    ics: u32,
}

pub struct IntelIommu {
    memory: GuestMemoryMmap,
    regs: Mutex<Registers>,
}

impl IntelIommu {
    pub fn new(memory: GuestMemoryMmap) -> Self {
        IntelIommu { memory, regs: Mutex::new(Registers::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registers> {
        crate::sync::lock(&self.regs)
    }

    fn read_u64(&self, at: u64) -> Option<u64> {
        self.memory.read_obj(GuestAddress(at)).ok()
    }

    /// Where device `sid` (bus << 8 | devfn) reaches with `iova`, if its tables map it for
    /// the access (`write`); with translation off, the address itself.
    pub fn translate(&self, sid: u16, iova: u64, write: bool) -> Option<u64> {
        let (gsts, rtaddr) = {
            let r = self.lock();
            (r.gsts, r.rtaddr)
        };
        if gsts & TE == 0 {
            return Some(iova);
        }
        let root = self.read_u64((rtaddr & ADDRESS) + u64::from(sid >> 8) * 16)?;
        if root & 1 == 0 {
            return None;
        }
        let context = (root & ADDRESS) + u64::from(sid & 0xff) * 16;
        let (low, high) = (self.read_u64(context)?, self.read_u64(context + 8)?);
        // Present, translation type 0 (multi-level), address width 1 (39 bits, 3 levels).
        if low & 1 == 0 || (low >> 2) & 3 != 0 || high & 7 != 1 || iova >> 39 != 0 {
            return None;
        }
        let mut table = low & ADDRESS;
        for level in (1..=3u32).rev() {
            let shift = 12 + 9 * (level - 1);
            let entry = self.read_u64(table + ((iova >> shift) & 0x1ff) * 8)?;
            let allowed = if write { PTE_WRITE } else { PTE_READ };
            if entry & allowed == 0 {
                return None;
            }
            if level == 1 || entry & PTE_SUPERPAGE != 0 {
                let size = 1u64 << shift;
                return Some((entry & ADDRESS & !(size - 1)) | (iova & (size - 1)));
            }
            table = entry & ADDRESS;
        }
        None
    }

    /// The message an MSI becomes: a remappable one (with remapping on) is what its
    /// interrupt-remapping table entry says; `None` if that entry is absent or bad.
    pub fn remap_msi(&self, msg: MsiMessage) -> Option<MsiMessage> {
        let (gsts, irta) = {
            let r = self.lock();
            (r.gsts, r.irta)
        };
        if gsts & IRE == 0 || msg.address & MSI_REMAPPABLE == 0 {
            return Some(msg);
        }
        // handle[14:0] in address bits 19:5, handle[15] in bit 2; SHV (bit 3) adds the data's subhandle.
        let mut index = ((msg.address >> 5) & 0x7fff) | ((msg.address >> 2) & 1) << 15;
        if msg.address & (1 << 3) != 0 {
            index += u64::from(msg.data & 0xffff);
        }
        let entries = 1u64 << ((irta & 0xf) + 1);
        if index >= entries {
            return None;
        }
        let irte = self.read_u64((irta & ADDRESS) + index * 16)?;
        if irte & 1 == 0 {
            return None;
        }
        let (dest_mode, trigger, delivery) = ((irte >> 2) & 1, (irte >> 4) & 1, (irte >> 5) & 7);
        let vector = (irte >> 16) & 0xff;
        // xAPIC mode: the destination is bits 47:40.
        let dest = (irte >> 40) & 0xff;
        Some(MsiMessage {
            address: 0xfee0_0000 | dest << 12 | dest_mode << 2,
            data: (vector | delivery << 8 | trigger << 15) as u32,
        })
    }

    /// Consumes the invalidation queue up to its tail. Nothing is cached, so every
    /// invalidation is complete at once; a wait descriptor with SW writes its status.
    fn drain_queue(&self, r: &mut Registers) {
        let base = r.iqa & ADDRESS;
        // Queue size: 2^(QS) pages of 256 descriptors of 16 bytes.
        let len = PAGE << (r.iqa & 7);
        let mut head = r.iqh & !0xf;
        let tail = r.iqt & !0xf;
        let mut budget = len / 16;
        while head != tail && head < len && budget > 0 {
            if let (Some(low), Some(high)) = (self.read_u64(base + head), self.read_u64(base + head + 8)) {
                const WAIT: u64 = 5;
                const STATUS_WRITE: u64 = 1 << 5;
                if low & 0xf == WAIT && low & STATUS_WRITE != 0 {
                    let _ = self.memory.write_obj((low >> 32) as u32, GuestAddress(high & !3));
                }
                if low & 0xf == WAIT && low & (1 << 4) != 0 {
                    r.ics |= 1; // IWC: no completion interrupt is modelled
                }
            }
            head = (head + 16) % len;
            budget -= 1;
        }
        r.iqh = head;
    }
}

impl BusDevice for IntelIommu {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let r = self.lock();
        let value: u64 = match offset & !3 {
            VER => u64::from(VERSION),
            CAP => CAPABILITIES,
            0x0c => CAPABILITIES >> 32,
            ECAP => EXTENDED_CAPABILITIES,
            0x14 => EXTENDED_CAPABILITIES >> 32,
            GSTS => u64::from(r.gsts),
            RTADDR => r.rtaddr,
            0x24 => r.rtaddr >> 32,
            FSTS => 0,
            IQH => r.iqh,
            0x84 => r.iqh >> 32,
            IQT => r.iqt,
            0x8c => r.iqt >> 32,
            IQA => r.iqa,
            0x94 => r.iqa >> 32,
            ICS => u64::from(r.ics),
            IRTA => r.irta,
            0xbc => r.irta >> 32,
            _ => 0,
        };
        crate::bus::read_register(data, value);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let (value, n) = (crate::bus::written_value(data), data.len());
        // A 64-bit register written as two halves, or whole.
        let set = |reg: &mut u64, at: u64| {
            if offset == at && n == 8 {
                *reg = value;
            } else if offset == at {
                *reg = (*reg & !0xffff_ffff) | (value & 0xffff_ffff);
            } else if offset == at + 4 {
                *reg = (*reg & 0xffff_ffff) | (value & 0xffff_ffff) << 32;
            }
        };
        let mut r = self.lock();
        match offset & !7 {
            GCMD if offset == GCMD => {
                let command = value as u32;
                let mut gsts = (r.gsts & !ENABLES) | (command & ENABLES);
                if command & SRTP != 0 {
                    gsts |= SRTP;
                }
                if command & SIRTP != 0 {
                    gsts |= SIRTP;
                }
                r.gsts = gsts;
            }
            RTADDR => set(&mut r.rtaddr, RTADDR),
            IQT => {
                set(&mut r.iqt, IQT);
                if r.gsts & QIE != 0 {
                    self.drain_queue(&mut r);
                }
            }
            IQA => {
                set(&mut r.iqa, IQA);
                r.iqh = 0;
            }
            IRTA => set(&mut r.irta, IRTA),
            _ if offset == ICS => r.ics &= !(value as u32),
            _ => tracing::debug!("intel-iommu: ignored {n}-byte write at {offset:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap {
        crate::guest_memory::anonymous(&[(GuestAddress(0), 16 << 20)]).unwrap()
    }

    fn write64(iommu: &IntelIommu, offset: u64, v: u64) {
        iommu.write(offset, &v.to_le_bytes());
    }

    fn read32(iommu: &IntelIommu, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        iommu.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn commands_show_in_status_and_dma_goes_through_the_tables() {
        let m = mem();
        let iommu = IntelIommu::new(m.clone());
        assert_eq!(iommu.translate(0x18, 0x1234, true), Some(0x1234), "translation off: identity");
        // Root table at 1 MiB; bus 0's context table at 1 MiB + 4K; 00:03.0's second-level
        // tables at +8K (level 3), +12K (2), +16K (1); IOVA 0x5000 -> 0x80_0000 (RW),
        // IOVA 0x4000_0000 (a 2 MiB page, read-only) -> 0x20_0000.
        let at = |k: u64| 0x10_0000 + k * 0x1000;
        m.write_obj(at(1) | 1, GuestAddress(at(0))).unwrap();
        m.write_obj(at(2) | 1, GuestAddress(at(1) + 0x18 * 16)).unwrap();
        m.write_obj(1u64 | (0x18 << 8), GuestAddress(at(1) + 0x18 * 16 + 8)).unwrap();
        m.write_obj(at(3) | 3, GuestAddress(at(2))).unwrap();
        m.write_obj(at(4) | 3, GuestAddress(at(3))).unwrap();
        m.write_obj(0x80_0000u64 | 3, GuestAddress(at(4) + 5 * 8)).unwrap();
        m.write_obj(at(5) | 3, GuestAddress(at(2) + 8)).unwrap();
        m.write_obj(0x20_0000u64 | PTE_READ | PTE_SUPERPAGE, GuestAddress(at(5))).unwrap();
        write64(&iommu, RTADDR, at(0));
        iommu.write(GCMD, &SRTP.to_le_bytes());
        iommu.write(GCMD, &(read32(&iommu, GSTS) | TE).to_le_bytes());
        assert_eq!(read32(&iommu, GSTS), TE | SRTP, "enable kept, the one-shot's status set");
        assert_eq!(iommu.translate(0x18, 0x5abc, true), Some(0x80_0abc));
        assert_eq!(iommu.translate(0x18, 0x4001_2345, false), Some(0x21_2345), "2 MiB page");
        assert_eq!(iommu.translate(0x18, 0x4001_2345, true), None, "read-only");
        assert_eq!(iommu.translate(0x18, 0x6000, false), None, "not mapped");
        assert_eq!(iommu.translate(0x20, 0x5000, false), None, "another device has no context");
        assert_eq!(iommu.translate(0x18, 1 << 40, false), None, "beyond 39 bits");
    }

    #[test]
    fn remappable_msis_become_what_their_irte_says() {
        let m = mem();
        let iommu = IntelIommu::new(m.clone());
        let msi = MsiMessage { address: 0xfee0_0000 | (2 << 5) | MSI_REMAPPABLE, data: 0 };
        assert_eq!(iommu.remap_msi(msi), Some(msi), "remapping off: as is");
        // IRTE 2: present, fixed, edge, physical, vector 0xee, destination APIC 1.
        m.write_obj(1u64 | (0xee << 16) | (1 << 40), GuestAddress(0x10_0000 + 2 * 16)).unwrap();
        write64(&iommu, IRTA, 0x10_0000 | 0xf);
        iommu.write(GCMD, &SIRTP.to_le_bytes());
        iommu.write(GCMD, &(read32(&iommu, GSTS) | IRE).to_le_bytes());
        assert_eq!(iommu.remap_msi(msi), Some(MsiMessage { address: 0xfee0_1000, data: 0xee }));
        let compatible = MsiMessage { address: 0xfee0_0000, data: 0x41 };
        assert_eq!(iommu.remap_msi(compatible), Some(compatible), "compatibility format passes");
        let absent = MsiMessage { address: 0xfee0_0000 | (3 << 5) | MSI_REMAPPABLE, data: 0 };
        assert_eq!(iommu.remap_msi(absent), None, "IRTE 3 is not present");
    }

    #[test]
    fn the_invalidation_queue_is_consumed_and_waits_write_their_status() {
        let m = mem();
        let iommu = IntelIommu::new(m.clone());
        write64(&iommu, IQA, 0x10_0000);
        iommu.write(GCMD, &QIE.to_le_bytes());
        // A context-cache invalidation, then a wait with status write of 0x77 to 0x20_0000.
        m.write_obj(1u64, GuestAddress(0x10_0000)).unwrap();
        m.write_obj(5u64 | (1 << 5) | (0x77 << 32), GuestAddress(0x10_0010)).unwrap();
        m.write_obj(0x20_0000u64, GuestAddress(0x10_0018)).unwrap();
        write64(&iommu, IQT, 0x20);
        assert_eq!(read32(&iommu, IQH), 0x20);
        assert_eq!(m.read_obj::<u32>(GuestAddress(0x20_0000)).unwrap(), 0x77);
        // A hostile tail beyond the queue stops at its end, never loops.
        write64(&iommu, IQT, 1 << 40);
        assert!(u64::from(read32(&iommu, IQH)) < PAGE);
    }
}
