//! SYSCALL from CPL3 on a host that does not switch privilege. On this nested host the CPU
//! lands on MSR_LSTAR with RCX, R11 and the masked RFLAGS right but still in the user's
//! code segment at CPL3, so the kernel's entry code faults on its own (supervisor) page
//! and Linux kills /init on its first system call. Guest CPL3 code runs natively here, out
//! of reach of a breakpoint; the page fault's handler runs at CPL0, within reach.
//!
//! So the VMM traps the guest's writes of LSTAR (an MSR filter) and then watches two
//! addresses with hardware breakpoints (KVM_SET_GUEST_DEBUG): the page-fault handler named
//! by the guest's IDT, and LSTAR itself. A page fault whose frame says "fetching LSTAR at
//! CPL3" is that broken system call: the VMM drops the frame and finishes what SYSCALL
//! defines (CS and SS from MSR_STAR at privilege 0, the user's RSP kept), resuming at LSTAR.
//! Any other page fault goes on to its handler. A vCPU that reaches LSTAR itself (a host
//! that switches correctly) ends the watch for good.
//!
//! The cost: two exits per page fault while watched, and the guest's own hardware
//! breakpoints do not fire meanwhile (KVM runs the guest on the VMM's debug registers),
//! which only a debugger inside the guest would notice.

use super::guest_access;
use crate::guest_memory::GuestMemoryMmap;
use kvm_bindings::{
    kvm_enable_cap, kvm_guest_debug, kvm_msr_entry, kvm_regs, kvm_segment, kvm_sregs, Msrs, KVM_CAP_X86_USER_SPACE_MSR,
    KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP, KVM_GUESTDBG_USE_HW_BP, KVM_MSR_EXIT_REASON_FILTER,
};
use kvm_ioctls::{MsrFilterDefaultAction, MsrFilterRange, MsrFilterRangeFlags, VcpuFd, VmFd};

pub const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_STAR: u32 = 0xc000_0081;
/// DR7: breakpoint 0 or 1 enabled (L0, L1), on instruction execution (R/W and LEN 00).
const DR7_EXEC_BP0: u64 = 1;
const DR7_EXEC_BP1: u64 = 1 << 2;

/// Makes every guest write of MSR_LSTAR exit to the VMM (KVM_EXIT_X86_WRMSR).
pub fn trap_lstar_writes(vm: &VmFd) -> Result<(), kvm_ioctls::Error> {
    let cap = kvm_enable_cap {
        cap: KVM_CAP_X86_USER_SPACE_MSR,
        args: [u64::from(KVM_MSR_EXIT_REASON_FILTER), 0, 0, 0],
        ..Default::default()
    };
    vm.enable_cap(&cap)?;
    // A clear bit denies the access to KVM, which then hands it to userspace.
    let denied = [0u8; 1];
    let range = MsrFilterRange { flags: MsrFilterRangeFlags::WRITE, base: MSR_LSTAR, msr_count: 1, bitmap: &denied };
    vm.set_msr_filter(MsrFilterDefaultAction::ALLOW, &[range])
}

/// One vCPU's watch on its system-call entry.
#[derive(Default)]
pub struct SyscallFixup {
    /// LSTAR and the page-fault handler, while watched.
    watched: Option<(u64, u64)>,
    /// Whether LSTAR itself is still watched (until a fix proves the host needs them).
    entry_watched: bool,
    /// Stepping over the handler's first instruction (this host's emulator ignores
    /// RFLAGS.RF, so a breakpoint is stepped over by lifting it for one instruction).
    stepping: bool,
}

/// The frame a page fault from CPL3 pushes: error code, RIP, CS, RFLAGS, RSP, SS.
const PF_FRAME: usize = 6 * 8;
const PF_VECTOR: u64 = 14;

impl SyscallFixup {
    /// The guest wrote LSTAR (the write was trapped): make it, then watch the entry and
    /// the page-fault handler of the IDT loaded now (Linux loads its final IDT first).
    /// False when KVM refuses the value (a non-canonical address): the guest then gets the
    /// #GP its WRMSR would have raised.
    pub fn lstar_written(&mut self, vcpu: &VcpuFd, mem: &GuestMemoryMmap, value: u64) -> Result<bool, String> {
        let msrs = Msrs::from_entries(&[kvm_msr_entry { index: MSR_LSTAR, data: value, ..Default::default() }])
            .map_err(|e| format!("MSR list: {e:?}"))?;
        if vcpu.set_msrs(&msrs).map_err(|e| format!("KVM_SET_MSRS(LSTAR): {e}"))? != 1 {
            return Ok(false);
        }
        let sregs = vcpu.get_sregs().map_err(|e| format!("KVM_GET_SREGS: {e}"))?;
        if sregs.idt.limit < (PF_VECTOR * 16 + 15) as u16 {
            return Ok(true); // no page-fault gate yet: nothing a fault could reach
        }
        let mut gate = [0u8; 16];
        guest_access(vcpu, mem, sregs.idt.base + PF_VECTOR * 16, &mut gate, false).map_err(|e| e.0)?;
        let word = |i: usize| u64::from(u16::from_le_bytes([gate[i], gate[i + 1]]));
        let high = u64::from(u32::from_le_bytes([gate[8], gate[9], gate[10], gate[11]]));
        let handler = word(0) | (word(6) << 16) | (high << 32);
        self.watched = Some((value, handler));
        self.entry_watched = true;
        self.arm(vcpu).map(|()| true)
    }

    /// A debug exit: true when it was a system call left at CPL3 and it was finished here.
    pub fn at_breakpoint(&mut self, vcpu: &VcpuFd, mem: &GuestMemoryMmap) -> Result<bool, String> {
        let mut regs = vcpu.get_regs().map_err(|e| format!("KVM_GET_REGS: {e}"))?;
        let Some((lstar, handler)) = self.watched else {
            return Err(format!("a debug exit at {:#x}, where exitless set no breakpoint", regs.rip));
        };
        if std::mem::take(&mut self.stepping) {
            // One instruction past the handler's breakpoint: put it back.
            self.arm(vcpu)?;
            return Ok(false);
        }
        if regs.rip == lstar && self.entry_watched {
            // The host switched to CPL0 by itself: it needs no help.
            self.watched = None;
            self.arm(vcpu)?;
            return Ok(false);
        }
        if regs.rip != handler {
            return Err(format!("a debug exit at {:#x}, where exitless set no breakpoint", regs.rip));
        }
        let mut frame = [0u8; PF_FRAME];
        guest_access(vcpu, mem, regs.rsp, &mut frame, false).map_err(|e| e.0)?;
        let at = |i: usize| u64::from_le_bytes(frame[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        let (rip, cs, rflags, rsp) = (at(1), at(2), at(3), at(4));
        if rip != lstar || cs & 3 != 3 {
            // An ordinary page fault: let its handler run.
            self.stepping = true;
            return self.arm(vcpu).map(|()| false);
        }
        // The system call the host left at CPL3: drop the fault's frame and finish it.
        let mut sregs = vcpu.get_sregs().map_err(|e| format!("KVM_GET_SREGS: {e}"))?;
        let kernel_cs = ((read_msr(vcpu, MSR_STAR)? >> 32) & 0xfffc) as u16;
        sregs.cs = flat_segment(kernel_cs, 0, true);
        sregs.ss = flat_segment(kernel_cs + 8, 0, false);
        vcpu.set_sregs(&sregs).map_err(|e| format!("KVM_SET_SREGS: {e}"))?;
        (regs.rip, regs.rsp, regs.rflags) = (lstar, rsp, rflags);
        vcpu.set_regs(&regs).map_err(|e| format!("KVM_SET_REGS: {e}"))?;
        // This host needs the fix: LSTAR's own breakpoint (which would stop the entry we
        // resume at) has served its purpose.
        self.entry_watched = false;
        self.arm(vcpu)?;
        Ok(true)
    }

    /// The breakpoints as the state says: LSTAR (DR0) while it tells hosts apart, the
    /// handler (DR1) unless stepping over it (single-step instead), or none.
    fn arm(&self, vcpu: &VcpuFd) -> Result<(), String> {
        let mut debug = kvm_guest_debug::default();
        if let Some((lstar, handler)) = self.watched {
            debug.control = KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP;
            if self.entry_watched {
                debug.arch.debugreg[0] = lstar;
                debug.arch.debugreg[7] |= DR7_EXEC_BP0;
            }
            if self.stepping {
                debug.control |= KVM_GUESTDBG_SINGLESTEP;
            } else {
                debug.arch.debugreg[1] = handler;
                debug.arch.debugreg[7] |= DR7_EXEC_BP1;
            }
        }
        vcpu.set_guest_debug(&debug).map_err(|e| format!("KVM_SET_GUEST_DEBUG: {e}"))
    }
}

/// Completes a 64-bit SYSRET at CPL0 (KVM's emulator has none): RIP from RCX, RFLAGS from
/// R11, CS and SS from MSR_STAR's user half at privilege 3.
pub fn sysret(vcpu: &VcpuFd, mut regs: kvm_regs, mut sregs: kvm_sregs) -> Result<super::Completed, String> {
    // A non-canonical RCX faults in the CPU (at CPL0, where the kernel checks it first).
    if (regs.rcx as i64) << 16 >> 16 != regs.rcx as i64 {
        return Err(format!("sysretq to the non-canonical address {:#x}", regs.rcx));
    }
    let base = ((read_msr(vcpu, MSR_STAR)? >> 48) & 0xfffc) as u16;
    sregs.cs = flat_segment((base + 16) | 3, 3, true);
    sregs.ss = flat_segment((base + 8) | 3, 3, false);
    regs.rip = regs.rcx;
    regs.rflags = (regs.r11 & 0x3c_7fd7) | 2;
    vcpu.set_sregs(&sregs).map_err(|e| format!("KVM_SET_SREGS: {e}"))?;
    vcpu.set_regs(&regs).map_err(|e| format!("KVM_SET_REGS: {e}"))?;
    Ok(super::Completed::Sysret)
}

/// A flat segment as SYSCALL and SYSRET load them: 64-bit code or read/write data.
fn flat_segment(selector: u16, dpl: u8, code: bool) -> kvm_segment {
    kvm_segment {
        selector,
        limit: 0xffff_ffff,
        type_: if code { 11 } else { 3 },
        present: 1,
        dpl,
        s: 1,
        l: u8::from(code),
        db: u8::from(!code),
        g: 1,
        ..Default::default()
    }
}

fn read_msr(vcpu: &VcpuFd, index: u32) -> Result<u64, String> {
    let mut msrs =
        Msrs::from_entries(&[kvm_msr_entry { index, ..Default::default() }]).map_err(|e| format!("MSR list: {e:?}"))?;
    match vcpu.get_msrs(&mut msrs) {
        Ok(1) => Ok(msrs.as_slice()[0].data),
        other => Err(format!("KVM_GET_MSRS({index:#x}): {other:?}")),
    }
}
