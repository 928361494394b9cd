//! Register state for the two entry points.

use super::EntryPoint;
use crate::guest_memory::GuestMemoryMmap;
use crate::layout::*;
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress};

const CR0_PE: u64 = 1;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// Flat GDT entries, in the payload runtime's order.
const GDT: [u64; 6] = [
    0,
    0x00af_9a00_0000_ffff, // 0x08 code64 DPL0
    0x00cf_9200_0000_ffff, // 0x10 data DPL0
    0x00cf_fa00_0000_ffff, // 0x18 code32 DPL3
    0x00cf_f200_0000_ffff, // 0x20 data DPL3
    0x00af_fa00_0000_ffff, // 0x28 code64 DPL3
];

#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    #[error("vCPU register ioctl failed")]
    Kvm(#[from] kvm_ioctls::Error),
    #[error("cannot write boot tables into guest memory")]
    Memory(#[from] vm_memory::GuestMemoryError),
}

fn segment(selector: u16, code: bool, long: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 0xb } else { 0x3 },
        present: 1,
        dpl: 0,
        db: u8::from(!long),
        s: 1,
        l: u8::from(long),
        g: 1,
        ..Default::default()
    }
}

/// Puts the vCPU at `entry` in the state its boot protocol promises.
pub fn setup(vcpu: &VcpuFd, mem: &GuestMemoryMmap, entry: EntryPoint) -> Result<(), RegsError> {
    let mut sregs: kvm_sregs = vcpu.get_sregs()?;
    let mut regs = kvm_regs { rflags: 0x2, ..Default::default() };
    match entry {
        EntryPoint::Pvh(rip) | EntryPoint::Multiboot(rip) => {
            sregs.cs = segment(0x08, true, false);
            let data = segment(0x10, false, false);
            (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
            sregs.cr0 = CR0_PE | CR0_ET;
            sregs.cr4 = 0;
            sregs.efer = 0;
            regs.rip = rip;
            // Both hand over a structure in %ebx; multiboot also says so in %eax.
            regs.rbx = START_INFO_GPA;
            if matches!(entry, EntryPoint::Multiboot(_)) {
                regs.rax = u64::from(super::multiboot::BOOTLOADER_MAGIC);
            }
        }
        EntryPoint::Long64(rip) => {
            write_long_mode_tables(mem)?;
            sregs.gdt.base = GDT_GPA;
            sregs.gdt.limit = (GDT.len() * 8 - 1) as u16;
            sregs.cs = segment(0x08, true, true);
            let data = segment(0x10, false, false);
            (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
            sregs.cr3 = PML4_GPA;
            sregs.cr4 = CR4_PAE;
            sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
            sregs.efer = EFER_LME | EFER_LMA;
            regs.rip = rip;
            regs.rsp = BOOT_STACK;
            // The Linux boot protocol's zero page; the payload runtime looks at %rbx.
            regs.rsi = ZERO_PAGE_GPA;
            regs.rbx = START_INFO_GPA;
        }
    }
    vcpu.set_sregs(&sregs)?;
    vcpu.set_regs(&regs)?;
    Ok(())
}

/// GDT and identity page tables (2 MiB pages, low 4 GiB, user-accessible) for a 64-bit entry.
fn write_long_mode_tables(mem: &GuestMemoryMmap) -> Result<(), RegsError> {
    for (i, desc) in GDT.iter().enumerate() {
        mem.write_obj(*desc, GuestAddress(GDT_GPA + 8 * i as u64))?;
    }
    mem.write_obj(PDPT_GPA | 0x7, GuestAddress(PML4_GPA))?;
    for dir in 0..4u64 {
        mem.write_obj((PD_GPA + dir * 0x1000) | 0x7, GuestAddress(PDPT_GPA + dir * 8))?;
    }
    for page in 0..2048u64 {
        mem.write_obj((page << 21) | 0x87, GuestAddress(PD_GPA + page * 8))?;
    }
    Ok(())
}
