//! SSE instructions KVM's emulator does not know (Linux's SSSE3 BLAKE2s, for one), run on
//! the host CPU instead of reimplemented: the guest's XMM registers are loaded (FXRSTOR),
//! the instruction runs, re-encoded by iced-x86 with its memory operand (if any) pointed
//! at a host buffer, and the registers are saved back (FXSAVE); the host's own FPU state is
//! saved around it.
//!
//! Only instructions that cannot touch anything else qualify: legacy-encoded SSE to SSE4.1
//! (plus AES-NI and PCLMULQDQ) that the host CPU has, every register an XMM register, no
//! flags written, and no memory access but the one explicit operand of at most 16 bytes.
//! MXCSR exceptions are masked while it runs (a guest that unmasked one would have taken
//! #XM; no kernel does in such code), and its flags are handed back to the guest.

use iced_x86::{
    CpuidFeature, Encoder, EncodingKind, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
};
use kvm_bindings::kvm_fpu;

/// The one memory operand of an instruction that qualifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryUse {
    /// Which operand it is.
    pub operand: u32,
    pub size: usize,
    pub read: bool,
    pub write: bool,
    /// A 16-byte operand the guest CPU would fault on when misaligned.
    pub aligned: bool,
}

/// What running an instruction needs: its host encoding and its memory operand.
pub struct Plan {
    code: Vec<u8>,
    pub memory: Option<MemoryUse>,
}

fn host_has(feature: CpuidFeature) -> bool {
    match feature {
        CpuidFeature::SSE => std::arch::is_x86_feature_detected!("sse"),
        CpuidFeature::SSE2 => std::arch::is_x86_feature_detected!("sse2"),
        CpuidFeature::SSE3 => std::arch::is_x86_feature_detected!("sse3"),
        CpuidFeature::SSSE3 => std::arch::is_x86_feature_detected!("ssse3"),
        CpuidFeature::SSE4_1 => std::arch::is_x86_feature_detected!("sse4.1"),
        CpuidFeature::AES => std::arch::is_x86_feature_detected!("aes"),
        CpuidFeature::PCLMULQDQ => std::arch::is_x86_feature_detected!("pclmulqdq"),
        _ => false,
    }
}

/// Checks that `insn` qualifies and encodes it for the host.
pub fn plan(insn: &Instruction) -> Result<Plan, String> {
    if insn.encoding() != EncodingKind::Legacy {
        return Err("not a legacy SSE encoding".into());
    }
    let features = insn.cpuid_features();
    if features.is_empty() || !features.iter().all(|&f| host_has(f)) {
        return Err(format!("needs {features:?}, not an SSE feature this host runs for guests"));
    }
    let state = matches!(insn.mnemonic(), Mnemonic::Ldmxcsr | Mnemonic::Stmxcsr | Mnemonic::Fxsave | Mnemonic::Fxrstor);
    if state || insn.rflags_modified() != 0 {
        return Err("changes FPU state or flags".into());
    }
    let mut memory = None;
    for i in 0..insn.op_count() {
        match insn.op_kind(i) {
            OpKind::Register if insn.op_register(i).is_xmm() => {}
            OpKind::Immediate8 => {}
            OpKind::Memory if memory.is_none() => memory = Some(i),
            other => return Err(format!("operand {i} is {other:?}")),
        }
    }
    let mut factory = InstructionInfoFactory::new();
    let info = factory.info(insn);
    let address_reg = |r: Register| r != Register::None && (r == insn.memory_base() || r == insn.memory_index());
    if let Some(r) = info.used_registers().iter().find(|u| !u.register().is_xmm() && !address_reg(u.register())) {
        return Err(format!("uses {:?}", r.register()));
    }
    let memory = match (memory, info.used_memory()) {
        (None, []) => None,
        (Some(operand), [used]) => {
            let size = insn.memory_size().size();
            if size == 0 || size > 16 {
                return Err(format!("a {size}-byte memory operand"));
            }
            let access = used.access();
            let read =
                matches!(access, OpAccess::Read | OpAccess::ReadWrite | OpAccess::CondRead | OpAccess::ReadCondWrite);
            let write =
                matches!(access, OpAccess::Write | OpAccess::ReadWrite | OpAccess::CondWrite | OpAccess::ReadCondWrite);
            let unaligned_ok =
                matches!(insn.mnemonic(), Mnemonic::Movdqu | Mnemonic::Movups | Mnemonic::Movupd | Mnemonic::Lddqu);
            Some(MemoryUse { operand, size, read, write, aligned: size == 16 && !unaligned_ok })
        }
        _ => return Err("implicit memory accesses".into()),
    };
    let mut host = *insn;
    if memory.is_some() {
        host.set_memory_base(Register::RSI);
        host.set_memory_index(Register::None);
        host.set_memory_index_scale(1);
        host.set_memory_displacement64(0);
        host.set_memory_displ_size(0);
        host.set_segment_prefix(Register::None);
    }
    let mut encoder = Encoder::new(64);
    encoder.encode(&host, 0).map_err(|e| format!("cannot re-encode it: {e}"))?;
    Ok(Plan { code: encoder.take_buffer(), memory })
}

#[repr(C, align(16))]
struct FxArea([u8; 512]);

/// The memory operand's host copy: aligned, since a 16-byte SSE operand must be.
#[repr(C, align(16))]
struct Operand16([u8; 16]);

const FX_MXCSR: usize = 24;
const FX_MXCSR_MASK: usize = 28;
const FX_XMM: usize = 160;
const MXCSR_EXCEPTION_MASKS: u32 = 0x1f80;
const MXCSR_FLAGS: u32 = 0x3f;

/// Runs the planned instruction on `fpu`'s XMM registers and MXCSR, with `buf` as its
/// memory operand.
pub fn run(plan: &Plan, fpu: &mut kvm_fpu, buf: &mut [u8; 16]) -> Result<(), String> {
    let mut host = FxArea([0; 512]);
    // SAFETY: FXSAVE64 writes exactly 512 bytes to a 16-byte-aligned area, which `host` is.
    unsafe { core::arch::x86_64::_fxsave64(host.0.as_mut_ptr()) };
    let mask = match u32::from_le_bytes(host.0[FX_MXCSR_MASK..FX_MXCSR_MASK + 4].try_into().unwrap_or_default()) {
        0 => 0xffbf, // the architectural default when the CPU reports none
        m => m,
    };
    // The host's x87 state (valid by construction) with the guest's SSE state.
    let mut guest = FxArea(host.0);
    let mxcsr = (fpu.mxcsr & mask) | MXCSR_EXCEPTION_MASKS;
    guest.0[FX_MXCSR..FX_MXCSR + 4].copy_from_slice(&mxcsr.to_le_bytes());
    for (i, xmm) in fpu.xmm.iter().enumerate() {
        guest.0[FX_XMM + 16 * i..FX_XMM + 16 * (i + 1)].copy_from_slice(xmm);
    }
    let mut code = vec![0x48, 0x0f, 0xae, 0x02]; // fxsave64 [rdx]: the host's state
    code.extend_from_slice(&[0x48, 0x0f, 0xae, 0x0f]); // fxrstor64 [rdi]: the guest's
    code.extend_from_slice(&plan.code);
    code.extend_from_slice(&[0x48, 0x0f, 0xae, 0x07]); // fxsave64 [rdi]
    code.extend_from_slice(&[0x48, 0x0f, 0xae, 0x0a]); // fxrstor64 [rdx]
    code.push(0xc3); // ret
    let mut scratch = FxArea([0; 512]);
    let mut operand = Operand16(*buf);
    call(&code, guest.0.as_mut_ptr(), operand.0.as_mut_ptr(), scratch.0.as_mut_ptr())?;
    *buf = operand.0;
    for (i, xmm) in fpu.xmm.iter_mut().enumerate() {
        xmm.copy_from_slice(&guest.0[FX_XMM + 16 * i..FX_XMM + 16 * (i + 1)]);
    }
    let after = u32::from_le_bytes(guest.0[FX_MXCSR..FX_MXCSR + 4].try_into().unwrap_or_default());
    fpu.mxcsr |= after & MXCSR_FLAGS;
    Ok(())
}

/// Maps `code` executable and calls it with (rdi, rsi, rdx) = (`a`, `b`, `c`).
fn call(code: &[u8], a: *mut u8, b: *mut u8, c: *mut u8) -> Result<(), String> {
    const PAGE: usize = 4096;
    // SAFETY: a fresh private anonymous mapping; checked for failure below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    let result = (|| {
        if code.len() > PAGE {
            return Err("code too long".to_string());
        }
        // SAFETY: `page` is PAGE writable bytes of our own and `code` fits in it.
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), page.cast::<u8>(), code.len()) };
        // SAFETY: changes the protection of our own mapping only.
        if unsafe { libc::mprotect(page, PAGE, libc::PROT_READ | libc::PROT_EXEC) } != 0 {
            return Err(format!("mprotect: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: the page holds FXSAVE/FXRSTOR around one vetted SSE instruction (see
        // `plan`: XMM registers and [rsi] only, 16 bytes at most) and a `ret`; it follows
        // the C ABI, clobbers only XMM and MXCSR, which the host's own FXRSTOR restores, and
        // touches memory only at `a` and `c` (512-byte, 16-byte-aligned FXSAVE areas) and `b`
        // (16 bytes).
        unsafe {
            let f: extern "C" fn(*mut u8, *mut u8, *mut u8) = std::mem::transmute(page);
            f(a, b, c);
        }
        Ok(())
    })();
    // SAFETY: unmaps the page mapped above, which nothing refers to any more.
    unsafe { libc::munmap(page, PAGE) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn decode(bytes: &[u8]) -> Instruction {
        Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE).decode()
    }

    fn fpu_with(values: &[(usize, u128)]) -> kvm_fpu {
        let mut fpu = kvm_fpu { mxcsr: 0x1f80, ..Default::default() };
        for &(i, v) in values {
            fpu.xmm[i] = v.to_le_bytes();
        }
        fpu
    }

    #[test]
    fn arithmetic_runs_on_the_guests_registers() {
        // paddq xmm14, xmm15 (Linux's BLAKE2s counter increment).
        let plan = plan(&decode(&[0x66, 0x45, 0x0f, 0xd4, 0xf7])).unwrap();
        assert_eq!(plan.memory, None);
        let a = 0x0000_0001_0000_0002_ffff_ffff_ffff_ffffu128;
        let mut fpu = fpu_with(&[(14, a), (15, 0x0000_0000_0000_0005_0000_0000_0000_0001)]);
        run(&plan, &mut fpu, &mut [0; 16]).unwrap();
        assert_eq!(u128::from_le_bytes(fpu.xmm[14]), 0x0000_0001_0000_0007_0000_0000_0000_0000);
        assert_eq!(u128::from_le_bytes(fpu.xmm[15]), 5 << 64 | 1, "the source is untouched");
    }

    #[test]
    fn a_memory_operand_is_the_buffer() {
        // pxor xmm1, [rip + 0x1234]
        let plan = plan(&decode(&[0x66, 0x0f, 0xef, 0x0d, 0x34, 0x12, 0, 0])).unwrap();
        let m = plan.memory.unwrap();
        assert!(m.read && !m.write && m.size == 16 && m.aligned, "{m:?}");
        let mut fpu = fpu_with(&[(1, 0xff00)]);
        let mut buf = 0x0f0fu128.to_le_bytes();
        run(&plan, &mut fpu, &mut buf).unwrap();
        assert_eq!(u128::from_le_bytes(fpu.xmm[1]), 0xf00f);
        // movdqu [rax + rbx*8 + 8], xmm1: a store, unaligned allowed.
        let store = plan_of(&[0xf3, 0x0f, 0x7f, 0x4c, 0xd8, 0x08]);
        let m = store.memory.unwrap();
        assert!(!m.read && m.write && !m.aligned, "{m:?}");
        run(&store, &mut fpu, &mut buf).unwrap();
        assert_eq!(u128::from_le_bytes(buf), 0xf00f);
    }

    fn plan_of(bytes: &[u8]) -> Plan {
        plan(&decode(bytes)).unwrap()
    }

    #[test]
    fn instructions_that_reach_beyond_xmm_are_refused() {
        for (bytes, what) in [
            (&[0x66, 0x0f, 0x7e, 0xc0][..], "movd eax, xmm0: a general register"),
            (&[0x66, 0x0f, 0x3a, 0x63, 0xc1, 0x00], "pcmpistri: writes ECX and flags"),
            (&[0x66, 0x0f, 0x38, 0x17, 0xc1], "ptest: writes flags"),
            (&[0x0f, 0xae, 0x10], "ldmxcsr"),
            (&[0x66, 0x0f, 0xf7, 0xc1], "maskmovdqu: an implicit store to [rdi]"),
            (&[0xc5, 0xf1, 0xef, 0xc2], "vpxor: VEX"),
            (&[0x48, 0x01, 0xd8], "add: not SSE"),
        ] {
            assert!(plan(&decode(bytes)).is_err(), "{what}");
        }
    }

    #[test]
    fn unmasked_exceptions_cannot_fault_the_host() {
        // divps xmm0, xmm1 with 1/0 and every exception unmasked in the guest's MXCSR.
        let plan = plan_of(&[0x0f, 0x5e, 0xc1]);
        let mut fpu = fpu_with(&[(0, u128::from(1.0f32.to_bits())), (1, 0)]);
        fpu.mxcsr = 0;
        run(&plan, &mut fpu, &mut [0; 16]).unwrap();
        assert_ne!(fpu.mxcsr & 0x4, 0, "divide-by-zero flag handed back");
        assert_eq!(fpu.mxcsr & MXCSR_EXCEPTION_MASKS, 0, "the guest's masks are its own");
    }
}
