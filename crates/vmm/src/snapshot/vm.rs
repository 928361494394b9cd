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
    /// CLOCK_REALTIME read by the VMM just after KVM_GET_CLOCK: KVM stamps the clock with
    /// the wall time only when the host's clocksource is the TSC (not on every nested
    /// host), and `clock_realtime` must work on any host.
    #[serde(default)]
    pub wall_ns: u64,
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
            wall_ns: wall_ns(),
        })
    }

    fn restore(&self, realtime: bool, state: &VmState) -> Result<(), PersistError> {
        let (vm, this) = (self, state);
        for chip in &this.irqchips {
            vm.set_irqchip(chip).map_err(|e| ("KVM_SET_IRQCHIP", e))?;
        }
        vm.set_pit2(&this.pit).map_err(|e| ("KVM_SET_PIT2", e))?;
        vm.set_clock(&this.clock_at_restore(realtime, wall_ns())).map_err(|e| ("KVM_SET_CLOCK", e))?;
        Ok(())
    }
}

impl VmState {
    /// Whether the saved clock carries the wall time it was read at (what a
    /// `clock_realtime` restore needs).
    pub fn has_realtime(&self) -> bool {
        self.clock.flags & KVM_CLOCK_REALTIME != 0 || self.wall_ns != 0
    }

    /// The clock to set at a restore. It goes on from the snapshot's reading; with
    /// `realtime` it takes in the wall time passed since: KVM adds it where it stamped the
    /// reading, otherwise the VMM adds it from its own stamp (a clock never goes back).
    fn clock_at_restore(&self, realtime: bool, now_ns: u64) -> kvm_clock_data {
        let clock = self.clock.clock;
        match realtime {
            true if self.clock.flags & KVM_CLOCK_REALTIME != 0 => {
                kvm_clock_data { clock, flags: KVM_CLOCK_REALTIME, realtime: self.clock.realtime, ..Default::default() }
            }
            true => kvm_clock_data {
                clock: clock.saturating_add(now_ns.saturating_sub(self.wall_ns)),
                ..Default::default()
            },
            false => kvm_clock_data { clock, ..Default::default() },
        }
    }

    /// Whether the saved chips are the three this VMM creates.
    pub fn well_formed(&self) -> bool {
        self.irqchips.len() == CHIPS.len() && self.irqchips.iter().zip(CHIPS).all(|(c, id)| c.chip_id == id)
    }
}

/// The host's wall clock in ns since the epoch.
fn wall_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(flags: u32, realtime: u64, wall_ns: u64) -> VmState {
        let clock = kvm_clock_data { clock: 1_000, flags, realtime, ..Default::default() };
        VmState { irqchips: Vec::new(), pit: Default::default(), clock, wall_ns }
    }

    #[test]
    fn a_clock_kvm_stamped_is_handed_back_for_kvm_to_advance() {
        let c = state(KVM_CLOCK_REALTIME, 50, 40).clock_at_restore(true, 90);
        assert_eq!((c.clock, c.flags, c.realtime), (1_000, KVM_CLOCK_REALTIME, 50));
    }

    #[test]
    fn an_unstamped_clock_is_advanced_by_the_vmms_own_stamp() {
        let s = state(0, 0, 40);
        assert!(s.has_realtime());
        let c = s.clock_at_restore(true, 90);
        assert_eq!((c.clock, c.flags), (1_050, 0));
        // A host clock set back never moves the guest's clock back.
        assert_eq!(s.clock_at_restore(true, 10).clock, 1_000);
    }

    #[test]
    fn without_realtime_the_clock_goes_on_from_its_reading() {
        let c = state(KVM_CLOCK_REALTIME, 50, 40).clock_at_restore(false, 90);
        assert_eq!((c.clock, c.flags), (1_000, 0));
        assert!(!state(0, 0, 0).has_realtime(), "a file from before the stamp cannot do clock_realtime");
    }
}
