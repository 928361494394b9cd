//! The CPUID registers that enumerate features, and the features' names (as Linux's
//! /proc/cpuinfo spells them where it has them), for messages that name what is missing.

use super::schema::Register::{self, Eax, Ebx, Ecx, Edx};

/// Feature registers: a bit a template sets in one of them claims a feature for the guest,
/// and the host must offer it. Elsewhere (the signature, topology, sizes) a set bit is a
/// value, not a claim. The bits CPUID normalization sets on every guest are left out.
const FEATURES: &[(u32, u32, Register, u32)] = &[
    // Leaf 1 ECX less TSC-deadline (24) and hypervisor (31); EDX less HTT (28).
    (0x1, 0, Ecx, !(1 << 24 | 1 << 31)),
    (0x1, 0, Edx, !(1 << 28)),
    // Leaf 7 EBX less FDP_EXCPTN_ONLY (6) and the FPU CS/DS deprecation (13).
    (0x7, 0, Ebx, !(1 << 6 | 1 << 13)),
    (0x7, 0, Ecx, u32::MAX),
    (0x7, 0, Edx, u32::MAX),
    (0x7, 1, Eax, u32::MAX),
    (0x7, 1, Edx, u32::MAX),
    (0xd, 0, Eax, u32::MAX),
    (0xd, 1, Eax, u32::MAX),
    (0x4000_0001, 0, Eax, u32::MAX),
    (0x8000_0001, 0, Ecx, u32::MAX),
    (0x8000_0001, 0, Edx, u32::MAX),
    (0x8000_0007, 0, Edx, u32::MAX),
    (0x8000_0008, 0, Ebx, u32::MAX),
];

/// The bits of `leaf`.`subleaf` `register` that are features.
pub fn feature_bits(leaf: u32, subleaf: u32, register: Register) -> u32 {
    FEATURES.iter().find(|f| (f.0, f.1, f.2) == (leaf, subleaf, register)).map_or(0, |f| f.3)
}

const LEAF1_ECX: [&str; 32] = [
    "pni",
    "pclmulqdq",
    "dtes64",
    "monitor",
    "ds_cpl",
    "vmx",
    "smx",
    "est",
    "tm2",
    "ssse3",
    "cid",
    "sdbg",
    "fma",
    "cx16",
    "xtpr",
    "pdcm",
    "",
    "pcid",
    "dca",
    "sse4_1",
    "sse4_2",
    "x2apic",
    "movbe",
    "popcnt",
    "tsc_deadline_timer",
    "aes",
    "xsave",
    "osxsave",
    "avx",
    "f16c",
    "rdrand",
    "hypervisor",
];
const LEAF1_EDX: [&str; 32] = [
    "fpu", "vme", "de", "pse", "tsc", "msr", "pae", "mce", "cx8", "apic", "", "sep", "mtrr", "pge", "mca", "cmov",
    "pat", "pse36", "pn", "clflush", "", "dts", "acpi", "mmx", "fxsr", "sse", "sse2", "ss", "ht", "tm", "ia64", "pbe",
];
const LEAF7_EBX: [&str; 32] = [
    "fsgsbase",
    "tsc_adjust",
    "sgx",
    "bmi1",
    "hle",
    "avx2",
    "fdp_excptn_only",
    "smep",
    "bmi2",
    "erms",
    "invpcid",
    "rtm",
    "cqm",
    "zero_fcs_fds",
    "mpx",
    "rdt_a",
    "avx512f",
    "avx512dq",
    "rdseed",
    "adx",
    "smap",
    "avx512ifma",
    "pcommit",
    "clflushopt",
    "clwb",
    "intel_pt",
    "avx512pf",
    "avx512er",
    "avx512cd",
    "sha_ni",
    "avx512bw",
    "avx512vl",
];
const LEAF7_ECX: [&str; 32] = [
    "prefetchwt1",
    "avx512vbmi",
    "umip",
    "pku",
    "ospke",
    "waitpkg",
    "avx512_vbmi2",
    "cet_ss",
    "gfni",
    "vaes",
    "vpclmulqdq",
    "avx512_vnni",
    "avx512_bitalg",
    "tme",
    "avx512_vpopcntdq",
    "",
    "la57",
    "",
    "",
    "",
    "",
    "",
    "rdpid",
    "",
    "bus_lock_detect",
    "cldemote",
    "",
    "movdiri",
    "movdir64b",
    "enqcmd",
    "sgx_lc",
    "",
];
const EXT_ECX: [&str; 32] = [
    "lahf_lm",
    "cmp_legacy",
    "svm",
    "extapic",
    "cr8_legacy",
    "abm",
    "sse4a",
    "misalignsse",
    "3dnowprefetch",
    "osvw",
    "ibs",
    "xop",
    "skinit",
    "wdt",
    "",
    "lwp",
    "fma4",
    "tce",
    "",
    "nodeid_msr",
    "",
    "tbm",
    "topoext",
    "perfctr_core",
    "perfctr_nb",
    "",
    "bpext",
    "ptsc",
    "perfctr_llc",
    "mwaitx",
    "",
    "",
];
const EXT_EDX: [&str; 32] = [
    "fpu", "vme", "de", "pse", "tsc", "msr", "pae", "mce", "cx8", "apic", "", "syscall", "mtrr", "pge", "mca", "cmov",
    "pat", "pse36", "", "", "nx", "", "mmxext", "mmx", "fxsr", "fxsr_opt", "pdpe1gb", "rdtscp", "", "lm", "3dnowext",
    "3dnow",
];

/// The feature's name, or `bit N` where it has none here.
pub fn name(leaf: u32, subleaf: u32, register: Register, bit: u32) -> String {
    let table = match (leaf, subleaf, register) {
        (0x1, 0, Ecx) => Some(&LEAF1_ECX),
        (0x1, 0, Edx) => Some(&LEAF1_EDX),
        (0x7, 0, Ebx) => Some(&LEAF7_EBX),
        (0x7, 0, Ecx) => Some(&LEAF7_ECX),
        (0x8000_0001, 0, Ecx) => Some(&EXT_ECX),
        (0x8000_0001, 0, Edx) => Some(&EXT_EDX),
        _ => None,
    };
    match table.and_then(|t| t.get(bit as usize)).filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => format!("bit {bit}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_named_as_linux_names_them() {
        assert_eq!(name(7, 0, Ebx, 9), "erms");
        assert_eq!(name(1, 0, Edx, 12), "mtrr");
        assert_eq!(name(7, 0, Ebx, 29), "sha_ni");
        assert_eq!(name(0x8000_0008, 0, Ebx, 2), "bit 2");
        assert_eq!(feature_bits(1, 0, Ecx) & 1 << 31, 0, "the hypervisor bit is the VMM's");
        assert_eq!(feature_bits(1, 0, Eax), 0, "the signature is a value");
    }
}
