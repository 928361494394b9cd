//! The VM's in-kernel devices: the two PICs and the IOAPIC, the PIT, and the kvmclock.

use kvm_bindings::{
    kvm_clock_data, kvm_irqchip, kvm_pit_state2, KVM_CLOCK_REALTIME, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct VmState {
    pub irqchips: Vec<kvm_irqchip>,
    pub pit: kvm_pit_state2,
    pub clock: kvm_clock_data,
}

type Fail = (&'static str, kvm_ioctls::Error);

const CHIPS: [u32; 3] = [KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQCHIP_IOAPIC];

impl VmState {
    pub fn capture(vm: &VmFd) -> Result<VmState, Fail> {
        let mut irqchips = Vec::new();
        for chip_id in CHIPS {
            let mut chip = kvm_irqchip { chip_id, ..Default::default() };
            vm.get_irqchip(&mut chip).map_err(|e| ("KVM_GET_IRQCHIP", e))?;
            irqchips.push(chip);
        }
        Ok(VmState {
            irqchips,
            pit: vm.get_pit2().map_err(|e| ("KVM_GET_PIT2", e))?,
            clock: vm.get_clock().map_err(|e| ("KVM_GET_CLOCK", e))?,
        })
    }

    pub fn restore(&self, vm: &VmFd, realtime: bool) -> Result<(), Fail> {
        for chip in &self.irqchips {
            vm.set_irqchip(chip).map_err(|e| ("KVM_SET_IRQCHIP", e))?;
        }
        vm.set_pit2(&self.pit).map_err(|e| ("KVM_SET_PIT2", e))?;
        // The clock goes on from the snapshot's reading; with `realtime` (checked by
        // [`VmState::has_realtime`]) KVM adds the wall time passed since it was read.
        let clock = match realtime {
            true => kvm_clock_data {
                clock: self.clock.clock,
                flags: KVM_CLOCK_REALTIME,
                realtime: self.clock.realtime,
                ..Default::default()
            },
            false => kvm_clock_data { clock: self.clock.clock, ..Default::default() },
        };
        vm.set_clock(&clock).map_err(|e| ("KVM_SET_CLOCK", e))?;
        Ok(())
    }

    /// Whether the saved clock carries the wall time it was read at (what a
    /// `clock_realtime` restore needs).
    pub fn has_realtime(&self) -> bool {
        self.clock.flags & KVM_CLOCK_REALTIME != 0
    }

    /// Whether the saved chips are the three this VMM creates.
    pub fn well_formed(&self) -> bool {
        self.irqchips.len() == CHIPS.len() && self.irqchips.iter().zip(CHIPS).all(|(c, id)| c.chip_id == id)
    }
}
