//! What a PC's BIOS leaves behind when a boot loader hands a multiboot image the machine:
//! the 8259 PICs at vectors 0x08/0x70 with the timer unmasked, the PIT ticking at
//! 18.2 Hz, and a real-mode interrupt vector table whose handlers acknowledge the PIC.
//! QEMU's SeaBIOS leaves exactly this, and guests that drop to real mode rely on it:
//! kvm-unit-tests' `realmode` halts with interrupts on and waits for the timer to wake it.
//! Other boot protocols (Linux, PVH) program the PICs and the PIT themselves.

use crate::guest_memory::GuestMemoryMmap;
use crate::layout;
use kvm_bindings::{kvm_irqchip, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE};
use kvm_ioctls::VmFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryError};

/// Where the BIOS vectors the master's and the slave's lines (IRQ 0-7, 8-15).
pub const MASTER_VECTORS: u8 = 0x08;
pub const SLAVE_VECTORS: u8 = 0x70;
/// SeaBIOS's masks as a multiboot image finds them, less the lines whose BIOS handlers
/// (keyboard, mouse, disk) exitless does not have: the timer and the cascade only.
const MASTER_MASK: u8 = !0b101;
const SLAVE_MASK: u8 = 0xff;
/// Interrupt lines the BIOS set level-triggered (PCI's 10 and 11), as QEMU's ELCR says.
const SLAVE_ELCR: u8 = 0x0c;

/// The handlers, in 16-bit code at `layout::BIOS_STUBS_GPA` (segment `STUB_SEGMENT`).
const IRET: u8 = 0xcf;
/// push ax; mov al, 0x20 (EOI); out 0x20, al; pop ax; iret
const MASTER_EOI: [u8; 7] = [0x50, 0xb0, 0x20, 0xe6, 0x20, 0x58, IRET];
/// push ax; mov al, 0x20; out 0xa0, al; out 0x20, al; pop ax; iret
const SLAVE_EOI: [u8; 9] = [0x50, 0xb0, 0x20, 0xe6, 0xa0, 0xe6, 0x20, 0x58, IRET];
const STUB_SEGMENT: u16 = (layout::BIOS_STUBS_GPA >> 4) as u16;
const DEFAULT_AT: u16 = 0;
const MASTER_AT: u16 = 0x10;
const SLAVE_AT: u16 = 0x20;

/// Writes the handlers and the interrupt vector table (256 segment:offset pairs at 0).
pub fn write_ivt(mem: &GuestMemoryMmap) -> Result<(), GuestMemoryError> {
    let stubs = GuestAddress(layout::BIOS_STUBS_GPA);
    mem.write_obj(IRET, stubs)?;
    mem.write_slice(&MASTER_EOI, GuestAddress(layout::BIOS_STUBS_GPA + u64::from(MASTER_AT)))?;
    mem.write_slice(&SLAVE_EOI, GuestAddress(layout::BIOS_STUBS_GPA + u64::from(SLAVE_AT)))?;
    let mut ivt = [0u8; 256 * 4];
    for (vector, entry) in ivt.chunks_exact_mut(4).enumerate() {
        let offset = match vector as u8 {
            v if (MASTER_VECTORS..MASTER_VECTORS + 8).contains(&v) => MASTER_AT,
            v if (SLAVE_VECTORS..SLAVE_VECTORS + 8).contains(&v) => SLAVE_AT,
            _ => DEFAULT_AT,
        };
        entry[..2].copy_from_slice(&offset.to_le_bytes());
        entry[2..].copy_from_slice(&STUB_SEGMENT.to_le_bytes());
    }
    mem.write_slice(&ivt, GuestAddress(0))
}

/// Programs KVM's PICs and PIT as the BIOS would have.
pub fn program_pic_and_pit(vm: &VmFd) -> Result<(), kvm_ioctls::Error> {
    for (chip, base, mask, elcr) in [
        (KVM_IRQCHIP_PIC_MASTER, MASTER_VECTORS, MASTER_MASK, 0),
        (KVM_IRQCHIP_PIC_SLAVE, SLAVE_VECTORS, SLAVE_MASK, SLAVE_ELCR),
    ] {
        let mut state = kvm_irqchip { chip_id: chip, ..Default::default() };
        vm.get_irqchip(&mut state)?;
        // SAFETY: chip_id names a PIC, so `pic` is the union member KVM filled in.
        let pic = unsafe { &mut state.chip.pic };
        // After ICW1-ICW4 (edge-triggered, cascaded, 8086 mode, ICW4 given) and an OCW1.
        pic.irq_base = base;
        pic.imr = mask;
        pic.init_state = 0;
        pic.init4 = 1;
        pic.elcr = elcr & pic.elcr_mask;
        vm.set_irqchip(&state)?;
    }
    let mut pit = vm.get_pit2()?;
    // Channel 0, lobyte/hibyte, mode 2 (rate generator), count 0 = 65536: 18.2 Hz. KVM
    // starts the timer when the state is set.
    let timer = &mut pit.channels[0];
    timer.count = 0;
    timer.rw_mode = 3;
    timer.read_state = 3;
    timer.write_state = 3;
    timer.mode = 2;
    timer.bcd = 0;
    timer.gate = 1;
    vm.set_pit2(&pit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_vector_points_at_a_handler_and_irqs_acknowledge_their_pics() {
        let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 1 << 20)]).unwrap();
        write_ivt(&mem).unwrap();
        let handler = |vector: u64| {
            let (offset, segment): (u16, u16) =
                (mem.read_obj(GuestAddress(vector * 4)).unwrap(), mem.read_obj(GuestAddress(vector * 4 + 2)).unwrap());
            let at = (u64::from(segment) << 4) + u64::from(offset);
            let mut code = [0u8; 9];
            mem.read_slice(&mut code, GuestAddress(at)).unwrap();
            code
        };
        assert_eq!(handler(0x08), [0x50, 0xb0, 0x20, 0xe6, 0x20, 0x58, IRET, 0, 0], "timer: EOI to the master");
        assert_eq!(handler(0x73), SLAVE_EOI, "IRQ 11: EOI to both");
        for vector in [0x00, 0x10, 0x21, 0x6f, 0x78, 0xff] {
            assert_eq!(handler(vector)[0], IRET, "vector {vector:#x}");
        }
    }
}
