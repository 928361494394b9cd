//! Decoding the instruction at RIP (iced-x86) and applying it to the vCPU's registers or
//! to guest memory. Built with the `nested-host` feature only: a native host never needs it.

use super::{fail, guest_access, sse, syscall, Completed, NotCompleted, Result};
use crate::guest_memory::GuestMemoryMmap;
use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;

const RFLAGS_CF: u64 = 1;
const RFLAGS_ZF: u64 = 1 << 6;
const RFLAGS_ARITH: u64 = 0x8d5; // CF PF AF ZF SF OF
const RFLAGS_AC: u64 = 1 << 18;
const BP_VECTOR: u8 = 3;

fn gpr(regs: &mut kvm_regs, reg: Register) -> Option<&mut u64> {
    Some(match reg.full_register() {
        Register::RAX => &mut regs.rax,
        Register::RCX => &mut regs.rcx,
        Register::RDX => &mut regs.rdx,
        Register::RBX => &mut regs.rbx,
        Register::RSP => &mut regs.rsp,
        Register::RBP => &mut regs.rbp,
        Register::RSI => &mut regs.rsi,
        Register::RDI => &mut regs.rdi,
        Register::R8 => &mut regs.r8,
        Register::R9 => &mut regs.r9,
        Register::R10 => &mut regs.r10,
        Register::R11 => &mut regs.r11,
        Register::R12 => &mut regs.r12,
        Register::R13 => &mut regs.r13,
        Register::R14 => &mut regs.r14,
        Register::R15 => &mut regs.r15,
        Register::RIP => &mut regs.rip,
        _ => return None,
    })
}

/// Reads a general register as the instruction names it (8-bit high registers excluded).
fn read_gpr(regs: &mut kvm_regs, reg: Register) -> Option<u64> {
    if matches!(reg, Register::AH | Register::CH | Register::DH | Register::BH) {
        return None;
    }
    let size = reg.size();
    let value = *gpr(regs, reg)?;
    Some(if size >= 8 { value } else { value & ((1u64 << (size * 8)) - 1) })
}

/// Writes a general register with x86's rules: 32-bit writes clear the upper half,
/// 8- and 16-bit writes keep the rest.
fn write_gpr(regs: &mut kvm_regs, reg: Register, value: u64) -> Option<()> {
    let size = reg.size();
    if matches!(reg, Register::AH | Register::CH | Register::DH | Register::BH) {
        return None;
    }
    let slot = gpr(regs, reg)?;
    *slot = match size {
        8 => value,
        4 => value & 0xffff_ffff,
        n => (*slot & !((1u64 << (n * 8)) - 1)) | (value & ((1u64 << (n * 8)) - 1)),
    };
    Some(())
}

/// One operand: a general register, an XMM register or memory.
enum Operand {
    Gpr(Register),
    Xmm(usize),
    Mem { gva: u64, size: usize },
}

struct Cpu<'a> {
    vcpu: &'a VcpuFd,
    mem: &'a GuestMemoryMmap,
    regs: kvm_regs,
    sregs: &'a kvm_sregs,
}

impl Cpu<'_> {
    fn operand(&mut self, insn: &Instruction, i: u32) -> Result<Operand> {
        match insn.op_kind(i) {
            OpKind::Register => {
                let reg = insn.op_register(i);
                if reg.is_xmm() {
                    Ok(Operand::Xmm(reg.number()))
                } else if reg.is_gpr() {
                    Ok(Operand::Gpr(reg))
                } else {
                    fail(format!("operand register {reg:?}"))
                }
            }
            OpKind::Memory => {
                let regs = self.regs;
                let gva = insn
                    .virtual_address(i, 0, |reg, _, _| {
                        let mut r = regs;
                        match reg {
                            Register::FS => Some(self.sregs.fs.base),
                            Register::GS => Some(self.sregs.gs.base),
                            Register::ES | Register::CS | Register::SS | Register::DS => Some(0),
                            _ => read_gpr(&mut r, reg),
                        }
                    })
                    .ok_or_else(|| NotCompleted("memory operand address".into()))?;
                Ok(Operand::Mem { gva, size: insn.memory_size().size() })
            }
            other => fail(format!("operand kind {other:?}")),
        }
    }

    fn read(&mut self, op: &Operand, xmm: &[[u8; 16]; 16]) -> Result<[u8; 16]> {
        let mut v = [0u8; 16];
        match *op {
            Operand::Gpr(reg) => {
                let value = read_gpr(&mut self.regs, reg).ok_or_else(|| NotCompleted(format!("{reg:?}")))?;
                v[..8].copy_from_slice(&value.to_le_bytes());
            }
            Operand::Xmm(n) => v = xmm[n],
            Operand::Mem { gva, size } => guest_access(self.vcpu, self.mem, gva, &mut v[..size.min(16)], false)?,
        }
        Ok(v)
    }

    /// Writes `width` bytes of `v` (zero-extended into an XMM register or a 32-bit register).
    fn write(&mut self, op: &Operand, v: [u8; 16], width: usize, xmm: &mut [[u8; 16]; 16]) -> Result<()> {
        match *op {
            Operand::Gpr(reg) => {
                let value = u64::from_le_bytes(v[..8].try_into().unwrap_or_default());
                write_gpr(&mut self.regs, reg, value).ok_or_else(|| NotCompleted(format!("{reg:?}")))?;
            }
            Operand::Xmm(n) => {
                xmm[n] = [0; 16];
                xmm[n][..width].copy_from_slice(&v[..width]);
            }
            Operand::Mem { gva, size } => {
                let mut bytes = v;
                guest_access(self.vcpu, self.mem, gva, &mut bytes[..size.min(width)], true)?;
            }
        }
        Ok(())
    }
}

/// Completes the instruction at RIP if it can; the vCPU's state is untouched when it cannot.
pub fn complete(vcpu: &VcpuFd, mem: &GuestMemoryMmap) -> Result<Completed> {
    let regs = vcpu.get_regs().map_err(|e| NotCompleted(format!("KVM_GET_REGS: {e}")))?;
    let sregs = vcpu.get_sregs().map_err(|e| NotCompleted(format!("KVM_GET_SREGS: {e}")))?;
    let bitness = if sregs.cs.l != 0 {
        64
    } else if sregs.cs.db != 0 {
        32
    } else {
        16
    };
    let rip = sregs.cs.base.wrapping_add(regs.rip);
    let mut bytes = [0u8; 15];
    // The instruction may end before a page that is not mapped: read what can be read.
    let mut len = bytes.len();
    while guest_access(vcpu, mem, rip, &mut bytes[..len], false).is_err() {
        len = len.checked_sub(1).filter(|&l| l > 0).ok_or_else(|| NotCompleted(format!("RIP {rip:#x} unreadable")))?;
    }
    let insn = Decoder::with_ip(bitness, &bytes[..len], regs.rip, DecoderOptions::NONE).decode();
    if insn.is_invalid() {
        return fail(format!("undecodable bytes {:02x?} at {rip:#x}", &bytes[..len]));
    }
    if insn.mnemonic() == Mnemonic::Sysretq && sregs.cs.dpl == 0 {
        return syscall::sysret(vcpu, regs, sregs).map_err(NotCompleted);
    }
    let mut cpu = Cpu { vcpu, mem, regs, sregs: &sregs };
    let describe = || format!("{:?} ({:02x?}) at {rip:#x}", insn.mnemonic(), &bytes[..insn.len()]);
    let completed =
        execute(&mut cpu, &insn).map_err(|NotCompleted(why)| NotCompleted(format!("{}: {why}", describe())))?;
    cpu.regs.rip = cpu.regs.rip.wrapping_add(insn.len() as u64);
    vcpu.set_regs(&cpu.regs).map_err(|e| NotCompleted(format!("KVM_SET_REGS: {e}")))?;
    if matches!(completed, Completed::Int3 | Completed::IntN) {
        let mut events = vcpu.get_vcpu_events().map_err(|e| NotCompleted(format!("KVM_GET_VCPU_EVENTS: {e}")))?;
        if completed == Completed::Int3 {
            events.exception.injected = 1;
            events.exception.nr = BP_VECTOR;
            events.exception.has_error_code = 0;
            events.exception.pending = 0;
        } else {
            // Delivered like an external interrupt on the vector: RIP is already past the
            // instruction (a "soft" injection would add the length again), and at CPL0 the
            // gate's DPL check a software interrupt makes always passes.
            events.interrupt.injected = 1;
            events.interrupt.nr = insn.immediate8();
            events.interrupt.soft = 0;
        }
        vcpu.set_vcpu_events(&events).map_err(|e| NotCompleted(format!("KVM_SET_VCPU_EVENTS: {e}")))?;
    }
    Ok(completed)
}

fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into `v`, which is 8 bytes long.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
    if n != 8 {
        // The host's random source failed: fall back on the TSC, still a value, not a fault.
        v = crate::stats::cycles().wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    v
}

fn execute(cpu: &mut Cpu, insn: &Instruction) -> Result<Completed> {
    let regs = &mut cpu.regs;
    match insn.mnemonic() {
        Mnemonic::Int3 => Ok(Completed::Int3),
        Mnemonic::Int if insn.immediate8() == BP_VECTOR => Ok(Completed::Int3),
        // At CPL3 the gate's DPL would have to be checked: KVM only gives up on CPL0 code here.
        Mnemonic::Int if cpu.sregs.cs.dpl == 0 => Ok(Completed::IntN),
        Mnemonic::Clac => {
            regs.rflags &= !RFLAGS_AC;
            Ok(Completed::ClacStac)
        }
        Mnemonic::Stac => {
            regs.rflags |= RFLAGS_AC;
            Ok(Completed::ClacStac)
        }
        Mnemonic::Wait | Mnemonic::Lfence | Mnemonic::Sfence | Mnemonic::Mfence => Ok(Completed::Fence),
        // A cache line written back (Linux's pmem and DAX paths): guest memory is the
        // VMM's own, coherent already, and a pmem file reaches its disk by the device's
        // flush (msync), so nothing is left to do but go on.
        Mnemonic::Clwb | Mnemonic::Clflush | Mnemonic::Clflushopt => Ok(Completed::Fence),
        Mnemonic::Rdrand | Mnemonic::Rdseed => {
            let reg = insn.op0_register();
            write_gpr(regs, reg, random_u64()).ok_or_else(|| NotCompleted(format!("{reg:?}")))?;
            regs.rflags = (regs.rflags & !RFLAGS_ARITH) | RFLAGS_CF;
            Ok(Completed::Rdrand)
        }
        Mnemonic::Popcnt => {
            let src = cpu.operand(insn, 1)?;
            let value = u64::from_le_bytes(cpu.read(&src, &[[0; 16]; 16])?[..8].try_into().unwrap_or_default());
            let width = insn.op0_register().size();
            let value = if width == 8 { value } else { value & ((1u64 << (width * 8)) - 1) };
            let regs = &mut cpu.regs;
            write_gpr(regs, insn.op0_register(), u64::from(value.count_ones()))
                .ok_or_else(|| NotCompleted("destination".into()))?;
            regs.rflags = (regs.rflags & !RFLAGS_ARITH) | if value == 0 { RFLAGS_ZF } else { 0 };
            Ok(Completed::Popcnt)
        }
        Mnemonic::Ldmxcsr | Mnemonic::Stmxcsr => {
            let op = cpu.operand(insn, 0)?;
            let mut fpu = cpu.vcpu.get_fpu().map_err(|e| NotCompleted(format!("KVM_GET_FPU: {e}")))?;
            if insn.mnemonic() == Mnemonic::Ldmxcsr {
                let v = cpu.read(&op, &fpu.xmm)?;
                fpu.mxcsr = u32::from_le_bytes(v[..4].try_into().unwrap_or_default());
                cpu.vcpu.set_fpu(&fpu).map_err(|e| NotCompleted(format!("KVM_SET_FPU: {e}")))?;
            } else {
                let mut v = [0u8; 16];
                v[..4].copy_from_slice(&fpu.mxcsr.to_le_bytes());
                cpu.write(&op, v, 4, &mut fpu.xmm)?;
            }
            Ok(Completed::Mxcsr)
        }
        m @ (Mnemonic::Movd
        | Mnemonic::Movq
        | Mnemonic::Movdqa
        | Mnemonic::Movdqu
        | Mnemonic::Movaps
        | Mnemonic::Movups
        | Mnemonic::Movapd
        | Mnemonic::Movupd) => {
            let (dst, src) = (cpu.operand(insn, 0)?, cpu.operand(insn, 1)?);
            let mut fpu = cpu.vcpu.get_fpu().map_err(|e| NotCompleted(format!("KVM_GET_FPU: {e}")))?;
            let width = match m {
                Mnemonic::Movd => 4,
                Mnemonic::Movq => 8,
                _ => 16,
            };
            let value = cpu.read(&src, &fpu.xmm)?;
            // A GPR destination of movd/movq takes the low bytes; 32-bit ones zero-extend.
            let mut v = [0u8; 16];
            v[..width].copy_from_slice(&value[..width]);
            cpu.write(&dst, v, width, &mut fpu.xmm)?;
            if matches!(dst, Operand::Xmm(_)) {
                cpu.vcpu.set_fpu(&fpu).map_err(|e| NotCompleted(format!("KVM_SET_FPU: {e}")))?;
            }
            Ok(Completed::SseMove)
        }
        _ => sse_on_host(cpu, insn),
    }
}

/// An SSE instruction that only touches XMM registers and one memory operand, run on the
/// host with the guest's registers and memory bytes.
fn sse_on_host(cpu: &mut Cpu, insn: &Instruction) -> Result<Completed> {
    let plan = sse::plan(insn).map_err(|why| NotCompleted(format!("not an instruction the VMM completes ({why})")))?;
    let mut fpu = cpu.vcpu.get_fpu().map_err(|e| NotCompleted(format!("KVM_GET_FPU: {e}")))?;
    let mut buf = [0u8; 16];
    let memory = match plan.memory {
        Some(m) => match cpu.operand(insn, m.operand)? {
            Operand::Mem { gva, .. } if m.aligned && gva % 16 != 0 => {
                return fail(format!("misaligned {gva:#x} (#GP)"))
            }
            Operand::Mem { gva, .. } => Some((gva, m)),
            _ => return fail("memory operand"),
        },
        None => None,
    };
    if let Some((gva, m)) = memory.filter(|(_, m)| m.read) {
        guest_access(cpu.vcpu, cpu.mem, gva, &mut buf[..m.size], false)?;
    }
    sse::run(&plan, &mut fpu, &mut buf).map_err(NotCompleted)?;
    if let Some((gva, m)) = memory.filter(|(_, m)| m.write) {
        guest_access(cpu.vcpu, cpu.mem, gva, &mut buf[..m.size], true)?;
    }
    cpu.vcpu.set_fpu(&fpu).map_err(|e| NotCompleted(format!("KVM_SET_FPU: {e}")))?;
    Ok(Completed::SseOnHost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_writes_follow_x86_rules() {
        let mut regs = kvm_regs { rax: u64::MAX, rbx: u64::MAX, ..Default::default() };
        write_gpr(&mut regs, Register::EAX, 5).unwrap();
        assert_eq!(regs.rax, 5, "32-bit writes zero-extend");
        write_gpr(&mut regs, Register::BX, 0x1234).unwrap();
        assert_eq!(regs.rbx, 0xffff_ffff_ffff_1234, "16-bit writes keep the rest");
        assert_eq!(read_gpr(&mut regs, Register::BL), Some(0x34));
        assert_eq!(write_gpr(&mut regs, Register::AH, 1), None, "high-byte registers are refused");
    }
}
