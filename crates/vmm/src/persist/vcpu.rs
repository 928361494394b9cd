//! One vCPU's state as KVM keeps it: registers, special registers, XSAVE (x87, SSE, AVX),
//! XCRs, debug registers, the LAPIC, pending events, MP state, the MSRs KVM lists, and the
//! TSC rate. Taken while the vCPU is out of `KVM_RUN` (paused) on its own thread.

use crate::persist::{Persist, PersistError};
use kvm_bindings::{
    kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs,
    kvm_xsave, Msrs,
};
use kvm_ioctls::{Kvm, VcpuFd};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct VcpuState {
    pub id: u8,
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub xsave: kvm_xsave,
    pub xcrs: kvm_xcrs,
    pub debugregs: kvm_debugregs,
    pub lapic: kvm_lapic_state,
    pub mp_state: kvm_mp_state,
    pub events: kvm_vcpu_events,
    pub msrs: Vec<kvm_msr_entry>,
    pub tsc_khz: u32,
}

impl std::fmt::Debug for VcpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VcpuState").field("id", &self.id).field("rip", &self.regs.rip).finish_non_exhaustive()
    }
}

type Fail = (&'static str, kvm_ioctls::Error);

/// The MSRs KVM lists (`Kvm::get_msr_index_list`).
pub fn msr_list(kvm: &Kvm) -> Result<Vec<u32>, Fail> {
    Ok(kvm.get_msr_index_list().map_err(|e| ("KVM_GET_MSR_INDEX_LIST", e))?.as_slice().to_vec())
}

/// The values of `indices` on `vcpu`: the ones it cannot read are left out.
fn read_msrs(vcpu: &VcpuFd, indices: &[u32]) -> Result<Vec<kvm_msr_entry>, Fail> {
    let mut wanted: Vec<u32> = indices.to_vec();
    let mut out = Vec::with_capacity(wanted.len());
    // KVM_GET_MSRS stops at the first MSR it cannot read: skip that one and go on.
    while !wanted.is_empty() {
        let entries: Vec<kvm_msr_entry> =
            wanted.iter().map(|&index| kvm_msr_entry { index, ..Default::default() }).collect();
        let mut msrs =
            Msrs::from_entries(&entries).map_err(|_| ("KVM_GET_MSRS", kvm_ioctls::Error::new(libc::E2BIG)))?;
        let read = vcpu.get_msrs(&mut msrs).map_err(|e| ("KVM_GET_MSRS", e))?;
        out.extend_from_slice(&msrs.as_slice()[..read]);
        wanted.drain(..(read + 1).min(wanted.len()));
    }
    Ok(out)
}

impl VcpuState {
    /// The saved value of MSR `index`, if it was saved.
    pub fn msr(&self, index: u32) -> Option<u64> {
        self.msrs.iter().find(|m| m.index == index).map(|m| m.data)
    }
}

/// A vCPU's state, read on its own thread while it is out of `KVM_RUN`: its id and the
/// MSRs to read ([`msr_list`]) are the arguments.
impl<'a> Persist<'a> for VcpuFd {
    type State = VcpuState;
    type SaveArgs = (u8, &'a [u32]);
    type RestoreArgs = ();

    fn save(&self, (id, msrs): (u8, &'a [u32])) -> Result<VcpuState, PersistError> {
        let vcpu = self;
        // MP state and events first: reading them settles what KVM still had in flight.
        let mp_state = vcpu.get_mp_state().map_err(|e| ("KVM_GET_MP_STATE", e))?;
        let events = vcpu.get_vcpu_events().map_err(|e| ("KVM_GET_VCPU_EVENTS", e))?;
        Ok(VcpuState {
            id,
            regs: vcpu.get_regs().map_err(|e| ("KVM_GET_REGS", e))?,
            sregs: vcpu.get_sregs().map_err(|e| ("KVM_GET_SREGS", e))?,
            xsave: vcpu.get_xsave().map_err(|e| ("KVM_GET_XSAVE", e))?,
            xcrs: vcpu.get_xcrs().map_err(|e| ("KVM_GET_XCRS", e))?,
            debugregs: vcpu.get_debug_regs().map_err(|e| ("KVM_GET_DEBUGREGS", e))?,
            lapic: vcpu.get_lapic().map_err(|e| ("KVM_GET_LAPIC", e))?,
            mp_state,
            events,
            msrs: read_msrs(vcpu, msrs)?,
            tsc_khz: vcpu.get_tsc_khz().map_err(|e| ("KVM_GET_TSC_KHZ", e))?,
        })
    }

    /// Puts the state on a freshly created vCPU (its CPUID already set).
    fn restore(&self, (): (), state: &VcpuState) -> Result<(), PersistError> {
        let (vcpu, this) = (self, state);
        this.restore_on(vcpu).map_err(PersistError::from)
    }
}

impl VcpuState {
    fn restore_on(&self, vcpu: &VcpuFd) -> Result<(), Fail> {
        if vcpu.get_tsc_khz().ok() != Some(self.tsc_khz) {
            vcpu.set_tsc_khz(self.tsc_khz).map_err(|e| ("KVM_SET_TSC_KHZ", e))?;
        }
        let msrs = Msrs::from_entries(&self.msrs).map_err(|_| ("KVM_SET_MSRS", kvm_ioctls::Error::new(libc::E2BIG)))?;
        let written = vcpu.set_msrs(&msrs).map_err(|e| ("KVM_SET_MSRS", e))?;
        if written != self.msrs.len() {
            tracing::warn!("snapshot: KVM took {written} of {} saved MSRs", self.msrs.len());
        }
        vcpu.set_sregs(&self.sregs).map_err(|e| ("KVM_SET_SREGS", e))?;
        vcpu.set_regs(&self.regs).map_err(|e| ("KVM_SET_REGS", e))?;
        // SAFETY: the XSAVE area was read from KVM on a host of the same CPU features (the
        // snapshot's CPUID is checked against this host's before any vCPU is restored).
        unsafe { vcpu.set_xsave(&self.xsave) }.map_err(|e| ("KVM_SET_XSAVE", e))?;
        vcpu.set_xcrs(&self.xcrs).map_err(|e| ("KVM_SET_XCRS", e))?;
        vcpu.set_debug_regs(&self.debugregs).map_err(|e| ("KVM_SET_DEBUGREGS", e))?;
        vcpu.set_lapic(&self.lapic).map_err(|e| ("KVM_SET_LAPIC", e))?;
        vcpu.set_mp_state(self.mp_state).map_err(|e| ("KVM_SET_MP_STATE", e))?;
        vcpu.set_vcpu_events(&self.events).map_err(|e| ("KVM_SET_VCPU_EVENTS", e))?;
        Ok(())
    }
}
