//! The exits only a nested host produces, handled for the vCPU run loop: instructions KVM
//! could not emulate, and the two exits of the LSTAR watch (emulate::syscall). A vCPU on a
//! native host profile has no `NestedExits`, and these exits end its run as faults.

use super::emulate::{self, syscall};
use crate::guest_memory::GuestMemoryMmap;
use crate::stats::{Completed, ExitKind, ExitStats};
use kvm_ioctls::VcpuFd;

/// What KVM answers an unknown hypercall (include/uapi/linux/kvm_para.h).
const KVM_ENOSYS: i64 = 1000;

/// An exit the nested profile handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostExit {
    /// KVM_INTERNAL_ERROR_EMULATION: KVM could not emulate an instruction.
    EmulationFailed,
    /// A breakpoint the VMM set (the LSTAR watch).
    Debug,
    /// A guest write of an MSR the VMM traps.
    WriteMsr(u32, u64),
}

impl HostExit {
    pub fn kind(self) -> ExitKind {
        match self {
            HostExit::EmulationFailed => ExitKind::InternalError,
            HostExit::Debug => ExitKind::Debug,
            HostExit::WriteMsr(..) => ExitKind::WrMsr,
        }
    }
}

/// One vCPU's share of the nested profile.
pub struct NestedExits {
    /// Guest RAM, to decode and complete instructions.
    memory: GuestMemoryMmap,
    /// Finishes system calls the host left at CPL3.
    syscall: syscall::SyscallFixup,
}

impl NestedExits {
    pub fn new(memory: GuestMemoryMmap) -> Self {
        NestedExits { memory, syscall: Default::default() }
    }

    /// A vCPU restored from a snapshot with the guest's LSTAR already set: the system-call
    /// watch starts as it would have when the guest wrote it (the write happened in
    /// another VMM, which trapped it there).
    pub fn restored(&mut self, fd: &VcpuFd, lstar: u64) -> Result<(), String> {
        if lstar == 0 {
            return Ok(());
        }
        self.syscall.lstar_written(fd, &self.memory, lstar).map(drop)
    }

    /// Handles `exit`, counting what it completed; Err says why the run cannot go on.
    pub fn handle(&mut self, exit: HostExit, fd: &mut VcpuFd, stats: &mut ExitStats) -> Result<(), String> {
        match exit {
            HostExit::EmulationFailed => match emulate::complete(fd, &self.memory) {
                Ok(done) => {
                    stats.completed[done as usize] += 1;
                    Ok(())
                }
                Err(emulate::NotCompleted(why)) => {
                    Err(format!("KVM could not emulate an instruction and neither can exitless: {why}"))
                }
            },
            HostExit::WriteMsr(syscall::MSR_LSTAR, value) => {
                let accepted = self
                    .syscall
                    .lstar_written(fd, &self.memory, value)
                    .map_err(|why| format!("cannot watch the system-call entry: {why}"))?;
                if !accepted {
                    // The exit is KVM_EXIT_X86_WRMSR: `msr` is the live union member;
                    // error = 1 makes KVM inject #GP.
                    fd.get_kvm_run().__bindgen_anon_1.msr.error = 1;
                }
                Ok(())
            }
            HostExit::WriteMsr(index, _) => {
                Err(format!("a trapped write of MSR {index:#x} that exitless does not handle"))
            }
            HostExit::Debug => {
                if self.syscall.at_breakpoint(fd, &self.memory)? {
                    stats.completed[Completed::Syscall as usize] += 1;
                }
                Ok(())
            }
        }
    }

    /// A kicked vCPU found on a `vmcall` or `vmmcall` at CPL0, which this host's KVM
    /// re-enters forever, is answered as KVM answers a hypercall it does not know (RAX =
    /// -KVM_ENOSYS) and moved past it: the guest goes on (a Linux driver probing a PV
    /// feature, the KVM PTP clock, gives up instead of hanging its boot). True if it was.
    pub fn answer_hypercall(&self, fd: &VcpuFd, regs: &kvm_bindings::kvm_regs, stats: &mut ExitStats) -> bool {
        let Ok(sregs) = fd.get_sregs() else { return false };
        if sregs.cs.dpl != 0 {
            return false;
        }
        let mut bytes = [0u8; 3];
        if emulate::guest_access(fd, &self.memory, sregs.cs.base.wrapping_add(regs.rip), &mut bytes, false).is_err() {
            return false;
        }
        if !matches!(bytes, [0x0f, 0x01, 0xc1] | [0x0f, 0x01, 0xd9]) {
            return false;
        }
        let answered = kvm_bindings::kvm_regs { rax: (-KVM_ENOSYS) as u64, rip: regs.rip.wrapping_add(3), ..*regs };
        if fd.set_regs(&answered).is_err() {
            return false;
        }
        stats.completed[Completed::Hypercall as usize] += 1;
        true
    }
}
