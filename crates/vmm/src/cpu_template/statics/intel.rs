//! Firecracker's Intel templates, bit for bit (its static_cpu_templates/{c3,t2,t2s,t2cl}.rs,
//! v1.16.1), in the custom schema's bitmaps: `0` hides a feature, `1` sets a bit, `x`
//! leaves the host's. Each makes the guest see the EC2 instance family it is named after:
//! C3 and T2 its CPUID, T2S also the vulnerability bits of IA32_ARCH_CAPABILITIES (fixed,
//! so a guest moved between hosts sees the same), T2CL those KVM passes through.
//!
//! Leaf 1 EAX is the CPU signature each claims: family 6, model 0x3e stepping 4 (Ivy
//! Bridge-EP, C3) or model 0x3f stepping 2 (Haswell-EP, the T2 family).

use super::table::{CpuidRow, Table};
use crate::cpu_template::schema::Register::{Eax, Ebx, Ecx, Edx};

/// Leaf 1 ECX hidden by the T2 family: DTES64, MONITOR, DS-CPL, VMX, SMX, EIST, TM2,
/// CNXT-ID, SDBG, xTPR, PDCM, DCA.
const T2_LEAF1_ECX: CpuidRow = (0x1, 0x0, 0, Ecx, "0bxxxx_xxxx_xxxx_x0xx_00xx_00x0_0000_00xx");
/// Leaf 1 EDX: MCE and MTRR set; PSN, DS, ACPI, SS, TM, IA64, PBE hidden.
const T2_LEAF1_EDX: CpuidRow = (0x1, 0x0, 0, Edx, "0b000x_0xxx_x00x_x0xx_xxx1_xxxx_1xxx_xxxx");
/// Leaf 7 EBX: ERMS set; SGX, HLE, RTM, RDT-M, MPX, RDT-A, AVX512F/DQ, RDSEED, ADX,
/// AVX512_IFMA, PCOMMIT, CLFLUSHOPT, CLWB, PT, AVX512PF/ER/CD, SHA, AVX512BW/VL hidden.
const T2_LEAF7_EBX: CpuidRow = (0x7, 0x0, 1, Ebx, "0b0000_0000_000x_0000_00x0_0x1x_xxx0_x0xx");
/// Leaf 7 ECX: AVX512_VBMI, UMIP, PKU, OSPKE, AVX512_VBMI2, GFNI, VAES, VPCLMULQDQ,
/// AVX512_VNNI, AVX512_BITALG, AVX512_VPOPCNTDQ, LA57, RDPID, SGX_LC hidden.
const T2_LEAF7_ECX: CpuidRow = (0x7, 0x0, 1, Ecx, "0bx0xx_xxxx_x0xx_xxx0_x0x0_0000_x0x0_000x");
/// Leaf 7 EDX: AVX512_4VNNIW, AVX512_4FMAPS, FSRM, AVX512_VP2INTERSECT hidden.
const T2_LEAF7_EDX: CpuidRow = (0x7, 0x0, 1, Edx, "0bxxxx_xxxx_xxxx_xxxx_xxxx_xxx0_xxx0_00xx");
/// Leaf 0xd.0 EAX: the MPX, AVX-512 and PKRU state components hidden.
const XSAVE_COMPONENTS: CpuidRow = (0xd, 0x0, 1, Eax, "0bxxxx_xxxx_xxxx_xxxx_xxxx_xx0x_0000_0xxx");
/// Leaf 0xd.1 EAX: XSAVEC, XGETBV with ECX=1, XSAVES hidden.
const XSAVE_EXTENSIONS: CpuidRow = (0xd, 0x1, 1, Eax, "0bxxxx_xxxx_xxxx_xxxx_xxxx_xxxx_xxxx_000x");
/// Leaf 0x8000_0001 EDX: 1-GiB pages hidden.
const EXT_EDX_NO_1G: CpuidRow = (0x8000_0001, 0x0, 0, Edx, "0bxxxx_x0xx_xxxx_xxxx_xxxx_xxxx_xxxx_xxxx");
/// Leaf 0x8000_0008 EBX: WBNOINVD hidden.
const WBNOINVD: CpuidRow = (0x8000_0008, 0x0, 0, Ebx, "0bxxxx_xxxx_xxxx_xxxx_xxxx_xx0x_xxxx_xxxx");
/// Haswell-EP: family 6, model 0x3f, stepping 2.
const HASWELL: CpuidRow = (0x1, 0x0, 0, Eax, "0bxxxx_0000_0000_0011_xx00_0110_1111_0010");

const T2_CPUID: &[CpuidRow] = &[
    HASWELL,
    T2_LEAF1_ECX,
    T2_LEAF1_EDX,
    T2_LEAF7_EBX,
    T2_LEAF7_ECX,
    T2_LEAF7_EDX,
    XSAVE_COMPONENTS,
    XSAVE_EXTENSIONS,
    // PREFETCHW and MONITORX hidden.
    (0x8000_0001, 0x0, 0, Ecx, "0bxx0x_xxxx_xxxx_xxxx_xxxx_xxx0_xxxx_xxxx"),
    EXT_EDX_NO_1G,
    WBNOINVD,
];

pub const T2: Table = Table { cpuid: T2_CPUID, msrs: &[] };

/// T2 with IA32_ARCH_CAPABILITIES fixed: RSBA, SKIP_L1DFL_VMENTRY, IF_PSCHANGE_MC_NO,
/// MISC_PACKAGE_CTLS, ENERGY_FILTERING_CTL, RRSBA, GDS_NO, RFDS_NO set, every other bit 0.
pub const T2S: Table = Table {
    cpuid: T2_CPUID,
    msrs: &[(0x10a, "0b0000_0000_0000_0000_0000_0000_0000_0000_0000_1100_0000_1000_0000_1100_0100_1100")],
};

/// T2 with more of leaf 0x8000_0001 hidden, and IA32_ARCH_CAPABILITIES's bits KVM passes
/// through kept (RDCL_NO ... RFDS_CLEAR), the rest 0.
pub const T2CL: Table = Table {
    cpuid: &[
        HASWELL,
        T2_LEAF1_ECX,
        T2_LEAF1_EDX,
        T2_LEAF7_EBX,
        T2_LEAF7_ECX,
        T2_LEAF7_EDX,
        XSAVE_COMPONENTS,
        XSAVE_EXTENSIONS,
        // SSE4A, MisAlignSse, PREFETCHW, MONITORX hidden.
        (0x8000_0001, 0x0, 0, Ecx, "0bxx0x_xxxx_xxxx_xxxx_xxxx_xxx0_00xx_xxxx"),
        // The AMD-only MmxExt, MMX, FXSR, FFXSR (bits 22-25) and 1-GiB pages hidden.
        (0x8000_0001, 0x0, 0, Edx, "0bxxxx_x000_00xx_xxxx_xxxx_xxxx_xxxx_xxxx"),
        WBNOINVD,
    ],
    msrs: &[(0x10a, "0b0000_0000_0000_0000_0000_0000_0000_0000_000x_xx0x_0000_x0x0_xxx0_000x_xxxx_xxxx")],
};

/// C3: Ivy Bridge-EP; FMA, MOVBE, BMI1/2, AVX2, INVPCID and LZCNT hidden besides what
/// the T2 family hides.
pub const C3: Table = Table {
    cpuid: &[
        (0x1, 0x0, 0, Eax, "0bxxxx_0000_0000_0011_xx00_0110_1110_0100"),
        // DTES64, MONITOR, DS-CPL, VMX, TM2, CNXT-ID, SDBG, FMA, xTPR, PDCM, MOVBE hidden.
        (0x1, 0x0, 0, Ecx, "0bxxxx_xxxx_x0xx_xxxx_00x0_00x0_xx00_00xx"),
        // MCE and MTRR set; PSN, DS, ACPI, SS, TM, PBE hidden.
        (0x1, 0x0, 0, Edx, "0b0x0x_0xxx_x00x_x0xx_xxx1_xxxx_1xxx_xxxx"),
        // SGX, BMI1, HLE, AVX2, BMI2, INVPCID, RTM, RDT-M, MPX, RDT-A, the AVX-512 family,
        // RDSEED, ADX, CLFLUSHOPT, CLWB, PT, SHA hidden.
        (0x7, 0x0, 1, Ebx, "0b0000_0000_0x0x_0000_00x0_00x0_xx00_00xx"),
        // AVX512_VBMI, UMIP, PKU, OSPKE, AVX512_VNNI, AVX512_VPOPCNTDQ, LA57, RDPID,
        // SGX_LC hidden.
        (0x7, 0x0, 1, Ecx, "0bx0xx_xxxx_x0xx_xxx0_x0xx_0xxx_xxx0_000x"),
        // AVX512_4VNNIW, AVX512_4FMAPS hidden.
        (0x7, 0x0, 1, Edx, "0bxxxx_xxxx_xxxx_xxxx_xxxx_xxxx_xxxx_00xx"),
        XSAVE_COMPONENTS,
        XSAVE_EXTENSIONS,
        // LZCNT, PREFETCHW hidden.
        (0x8000_0001, 0x0, 0, Ecx, "0bxxxx_xxxx_xxxx_xxxx_xxxx_xxx0_xx0x_xxxx"),
        EXT_EDX_NO_1G,
    ],
    msrs: &[],
};
