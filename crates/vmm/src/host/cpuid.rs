//! CPUID features hidden from the guest: the platform's (what exitless offers no model of)
//! on every host, and on a nested host also what its KVM cannot run at CPL0.

// CPUID leaf 1 ECX.
const ECX_MONITOR: u32 = 1 << 3;
const ECX_VMX: u32 = 1 << 5;
const ECX_TM2: u32 = 1 << 8;
const ECX_CX16: u32 = 1 << 13;
const ECX_PDCM: u32 = 1 << 15;
const ECX_XSAVE: u32 = 1 << 26;
const ECX_OSXSAVE: u32 = 1 << 27;
const ECX_AVX: u32 = 1 << 28;
// CPUID leaf 1 EDX.
const EDX_ACPI: u32 = 1 << 22;
const EDX_TM: u32 = 1 << 29;
// CPUID leaf 7 EBX.
const EBX7_AVX2: u32 = 1 << 5;
const EBX7_AVX512F: u32 = 1 << 16;
/// KVM's paravirtual features whose use is a `vmcall` (leaf 0x4000_0001 EAX): PV unhalt
/// (KVM_HC_KICK_CPU), PV IPIs (KVM_HC_SEND_IPI), PV yield (KVM_HC_SCHED_YIELD) and GPA range
/// mapping. A nested host's KVM that never completes a vmcall at CPL0 leaves a Linux guest
/// offered PV IPIs hanging as it brings up its second CPU.
const KVM_PV_HYPERCALLS: u32 = 1 << 7 | 1 << 11 | 1 << 13 | 1 << 16;

/// Bits cleared in the CPUID the guest sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Masks {
    pub leaf1_ecx: u32,
    pub leaf1_edx: u32,
    pub leaf7_ebx: u32,
    /// Leaf 0x4000_0001 EAX (KVM's features).
    pub kvm_features: u32,
    /// Whether leaf 0xd (XSAVE state components) is emptied, XSAVE being hidden.
    pub no_xsave_state: bool,
}

impl Masks {
    /// MONITOR, VMX and the thermal/performance bits: exitless offers none of them.
    pub const PLATFORM: Masks = Masks {
        leaf1_ecx: ECX_MONITOR | ECX_VMX | ECX_TM2 | ECX_PDCM,
        leaf1_edx: EDX_ACPI | EDX_TM,
        leaf7_ebx: 0,
        kvm_features: 0,
        no_xsave_state: false,
    };

    /// The platform's, and what a nested host's KVM cannot run at CPL0: `cmpxchg16b`,
    /// XSAVE, AVX and its successors, and every PV feature used through `vmcall`.
    pub const NESTED: Masks = Masks {
        leaf1_ecx: Masks::PLATFORM.leaf1_ecx | ECX_CX16 | ECX_XSAVE | ECX_OSXSAVE | ECX_AVX,
        leaf1_edx: Masks::PLATFORM.leaf1_edx,
        leaf7_ebx: EBX7_AVX2 | EBX7_AVX512F,
        kvm_features: KVM_PV_HYPERCALLS,
        no_xsave_state: true,
    };
}
