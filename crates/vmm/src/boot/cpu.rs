//! Per-vCPU platform state a kernel expects from firmware: CPUID (APIC IDs, topology, a
//! hypervisor leaf, the host profile's masks, then Firecracker's normalization:
//! super::cpuid_normalize), MSRs, FPU and local APIC, after Firecracker's x86 setup.

use crate::host::cpuid::Masks;
use kvm_bindings::{kvm_fpu, kvm_msr_entry, CpuId, Msrs};
use kvm_ioctls::VcpuFd;

#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("{what} failed")]
    Ioctl {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("KVM set {set} of {want} boot MSRs")]
    Msrs { set: usize, want: usize },
}

fn ioctl(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> CpuError {
    move |source| CpuError::Ioctl { what, source }
}

const ECX_HYPERVISOR: u32 = 1 << 31;
/// KVM's feature leaf.
const KVM_LEAF_FEATURES: u32 = 0x4000_0001;

/// CPUID for vCPU `id` of `count`: `threads` (1, or 2 with SMT) vCPUs per core, one
/// package, with the features in `masks` hidden. APIC IDs are the vCPU ids, so with SMT
/// vCPUs 2n and 2n+1 are one core's threads.
pub fn cpuid_for(supported: &CpuId, id: u8, count: u8, threads: u8, masks: &Masks) -> CpuId {
    let threads = threads.clamp(1, count.max(1));
    let cores = count.max(1).div_ceil(threads);
    // Bits of APIC ID below each topology level.
    let bits = |n: u8| 32 - u32::from(n.max(1) - 1).leading_zeros();
    let mut cpuid = supported.clone();
    for e in cpuid.as_mut_slice() {
        match e.function {
            1 => {
                e.ecx = (e.ecx & !masks.leaf1_ecx) | ECX_HYPERVISOR;
                e.edx &= !masks.leaf1_edx;
                // Initial APIC ID and CLFLUSH size 64 (IDs per package and HTT: normalization).
                e.ebx = (u32::from(id) << 24) | (8 << 8) | (e.ebx & 0xff);
            }
            // Deterministic cache parameters: cores in the package, and threads sharing a
            // cache (a core's for L1 and L2, the package's for L3).
            4 => {
                let level = (e.eax >> 5) & 7;
                let sharing = if level >= 3 { count } else { threads };
                e.eax &= 0x3ff;
                e.eax |= u32::from(cores - 1) << 26 | u32::from(sharing.max(1) - 1) << 14;
            }
            7 if e.index == 0 => e.ebx &= !masks.leaf7_ebx,
            KVM_LEAF_FEATURES => e.eax &= !masks.kvm_features,
            // No XSAVE state components where XSAVE is hidden.
            0xd if masks.no_xsave_state => (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0),
            // Extended topology: level 0 SMT (`threads` per core), level 1 core (`count`
            // logical processors in the package).
            0xb | 0x1f => {
                let (shift, logical, kind) = match e.index {
                    0 => (bits(threads), u32::from(threads), 1),
                    1 => (bits(threads) + bits(cores), u32::from(count), 2),
                    _ => (0, 0, 0),
                };
                (e.eax, e.ebx, e.ecx, e.edx) = (shift, logical, (kind << 8) | e.index, u32::from(id));
            }
            _ => {}
        }
    }
    super::cpuid_normalize::normalize(&mut cpuid, count, &super::cpuid_normalize::HostLeaves::read());
    cpuid
}

// MSR numbers.
const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
/// MTRRs enabled, default type write-back.
const MTRR_ENABLE_WB: u64 = (1 << 11) | 6;

/// Boot MSRs as firmware leaves them.
fn boot_msrs() -> Vec<kvm_msr_entry> {
    let msr = |index, data| kvm_msr_entry { index, data, ..Default::default() };
    vec![
        msr(MSR_IA32_SYSENTER_CS, 0),
        msr(MSR_IA32_SYSENTER_ESP, 0),
        msr(MSR_IA32_SYSENTER_EIP, 0),
        msr(MSR_STAR, 0),
        msr(MSR_CSTAR, 0),
        msr(MSR_KERNEL_GS_BASE, 0),
        msr(MSR_SYSCALL_MASK, 0),
        msr(MSR_LSTAR, 0),
        msr(MSR_IA32_TSC, 0),
        msr(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        msr(MSR_MTRR_DEF_TYPE, MTRR_ENABLE_WB),
    ]
}

// Local APIC registers in the KVM_GET_LAPIC page, and delivery modes.
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

fn set_delivery_mode(regs: &mut [std::os::raw::c_char], reg: usize, mode: u32) {
    let mut bytes = [0u8; 4];
    for (b, r) in bytes.iter_mut().zip(&regs[reg..reg + 4]) {
        *b = *r as u8;
    }
    let value = (u32::from_le_bytes(bytes) & !0x700) | (mode << 8);
    for (r, b) in regs[reg..reg + 4].iter_mut().zip(value.to_le_bytes()) {
        *r = b as std::os::raw::c_char;
    }
}

/// Sets CPUID, MSRs, FPU and the local APIC's LINT0 (ExtINT, the PIC) and LINT1 (NMI).
pub fn setup(vcpu: &VcpuFd, cpuid: &CpuId) -> Result<(), CpuError> {
    vcpu.set_cpuid2(cpuid).map_err(ioctl("KVM_SET_CPUID2"))?;
    let entries = boot_msrs();
    let msrs = Msrs::from_entries(&entries).map_err(|_| CpuError::Msrs { set: 0, want: entries.len() })?;
    let set = vcpu.set_msrs(&msrs).map_err(ioctl("KVM_SET_MSRS"))?;
    if set != entries.len() {
        return Err(CpuError::Msrs { set, want: entries.len() });
    }
    let fpu = kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() };
    vcpu.set_fpu(&fpu).map_err(ioctl("KVM_SET_FPU"))?;
    let mut lapic = vcpu.get_lapic().map_err(ioctl("KVM_GET_LAPIC"))?;
    set_delivery_mode(&mut lapic.regs, APIC_LVT0, APIC_MODE_EXTINT);
    set_delivery_mode(&mut lapic.regs, APIC_LVT1, APIC_MODE_NMI);
    vcpu.set_lapic(&lapic).map_err(ioctl("KVM_SET_LAPIC"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::kvm_cpuid_entry2;

    #[test]
    fn each_vcpu_gets_its_apic_id_and_hidden_features_stay_hidden() {
        let entries = [
            kvm_cpuid_entry2 { function: 1, ecx: u32::MAX, edx: u32::MAX, ebx: 0xffff_ffff, ..Default::default() },
            kvm_cpuid_entry2 { function: 0xb, index: 0, ..Default::default() },
            kvm_cpuid_entry2 { function: 0xb, index: 1, ..Default::default() },
            kvm_cpuid_entry2 { function: 7, ebx: u32::MAX, ..Default::default() },
            kvm_cpuid_entry2 { function: KVM_LEAF_FEATURES, eax: u32::MAX, ..Default::default() },
        ];
        let supported = CpuId::from_entries(&entries).unwrap();
        let cpuid = cpuid_for(&supported, 3, 4, 1, &Masks::NESTED);
        let e = cpuid.as_slice();
        assert_eq!(e[0].ebx >> 24, 3, "initial APIC ID");
        assert_eq!((e[0].ebx >> 16) & 0xff, 4, "logical processors");
        assert_eq!(e[0].ecx & Masks::NESTED.leaf1_ecx, 0);
        assert_ne!(e[0].ecx & ECX_HYPERVISOR, 0);
        assert_eq!(e[1].edx, 3, "x2APIC ID");
        assert_eq!((e[2].ebx, e[2].eax), (4, 2), "4 cores need 2 bits of APIC ID");
        assert_eq!(e[3].ebx & Masks::NESTED.leaf7_ebx, 0);
        assert_eq!((e[1].ebx, e[1].eax), (1, 0), "one thread per core");
        assert_eq!(e[4].eax & 1 << 11, 0, "no PV IPIs: they are vmcalls");
        assert_ne!(e[4].eax & 1 << 3, 0, "kvmclock (an MSR) stays");
        // A native host's profile hides only what the platform lacks.
        let native = cpuid_for(&supported, 3, 4, 1, &Masks::PLATFORM);
        let n = native.as_slice();
        assert_ne!(n[0].ecx & 1 << 13, 0, "CX16 offered");
        assert_eq!(n[0].ecx & Masks::PLATFORM.leaf1_ecx, 0);
        assert_eq!((n[3].ebx, n[4].eax), (u32::MAX, u32::MAX), "AVX2 and PV features offered");
    }

    #[test]
    fn with_smt_each_core_has_two_threads() {
        let entries = [
            kvm_cpuid_entry2 { function: 0xb, index: 0, ..Default::default() },
            kvm_cpuid_entry2 { function: 0xb, index: 1, ..Default::default() },
            kvm_cpuid_entry2 { function: 4, eax: 1 << 5, ..Default::default() }, // L1
            kvm_cpuid_entry2 { function: 4, eax: 3 << 5, ..Default::default() }, // L3
        ];
        let supported = CpuId::from_entries(&entries).unwrap();
        let cpuid = cpuid_for(&supported, 5, 8, 2, &Masks::NESTED);
        let e = cpuid.as_slice();
        assert_eq!((e[0].eax, e[0].ebx, e[0].edx), (1, 2, 5), "SMT level: 1 bit, 2 threads");
        assert_eq!((e[1].eax, e[1].ebx), (3, 8), "core level: 4 cores, 8 threads");
        assert_eq!((e[2].eax >> 26, (e[2].eax >> 14) & 0xfff), (3, 1), "L1 shared by a core's 2 threads");
        assert_eq!((e[3].eax >> 14) & 0xfff, 7, "L3 shared by all 8");
        // One vCPU with SMT on is a lone thread.
        let one = cpuid_for(&supported, 0, 1, 2, &Masks::NESTED);
        assert_eq!((one.as_slice()[0].eax, one.as_slice()[0].ebx), (0, 1));
    }
}
