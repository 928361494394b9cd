//! The VM's in-kernel devices: the two PICs and the IOAPIC, the PIT, and the kvmclock.

use crate::persist::{Persist, PersistError};
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

const CHIPS: [u32; 3] = [KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQCHIP_IOAPIC];

/// The VM's in-kernel devices; restoring takes whether the clock goes on by the wall time
/// passed (Firecracker's `clock_realtime`).
impl Persist<'_> for VmFd {
    type State = VmState;
    type SaveArgs = ();
    type RestoreArgs = bool;

    fn save(&self, (): ()) -> Result<VmState, PersistError> {
        let vm = self;
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

    fn restore(&self, realtime: bool, state: &VmState) -> Result<(), PersistError> {
        let (vm, this) = (self, state);
        for chip in &this.irqchips {
            vm.set_irqchip(chip).map_err(|e| ("KVM_SET_IRQCHIP", e))?;
        }
        vm.set_pit2(&this.pit).map_err(|e| ("KVM_SET_PIT2", e))?;
        // The clock goes on from the snapshot's reading; with `realtime` (checked by
        // [`VmState::has_realtime`]) KVM adds the wall time passed since it was read.
        let clock = match realtime {
            true => kvm_clock_data {
                clock: this.clock.clock,
                flags: KVM_CLOCK_REALTIME,
                realtime: this.clock.realtime,
                ..Default::default()
            },
            false => kvm_clock_data { clock: this.clock.clock, ..Default::default() },
        };
        vm.set_clock(&clock).map_err(|e| ("KVM_SET_CLOCK", e))?;
        Ok(())
    }
}

impl VmState {
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
