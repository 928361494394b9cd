//! What Firecracker's CPUID normalization does beyond the topology and masks of
//! [`super::cpu::cpuid_for`] (its cpu_config/x86_64/cpuid/{normalize,intel/normalize,
//! amd/normalize}.rs, v1.16.1): run after any CPU template, so a template cannot change
//! what every guest needs.
//!
//! - leaf 0: the host's vendor (a template cannot claim another);
//! - leaf 1: EBX[23:16] the vCPU count rounded up to a power of two, TSC-deadline on, HTT
//!   only with more than one vCPU;
//! - leaf 6: no Turbo Boost (EAX[1]) and no energy-performance bias (ECX[3]);
//! - leaf 7.0: FDP_EXCPTN_ONLY and the FPU CS/DS deprecation (EBX[6], EBX[13]) set; on
//!   Intel no WAITPKG (ECX[5]: UMWAIT would idle the physical CPU), on AMD no
//!   ARCH_CAPABILITIES (EDX[29]);
//! - leaf 0xA (the PMU) empty on Intel;
//! - leaves 0x8000_0005 and 0x8000_0006 (caches and TLBs) the host's, 0x8000_0006 EDX[17:16]
//!   (reserved) clear;
//! - on AMD, 0x8000_0008 ECX: 7 bits of APIC ID for threads, the vCPU count less one;
//! - the brand string: `Intel(R) Xeon(R) Processor @ <host's frequency>` (or without the
//!   frequency where the host's string has none), or `AMD EPYC`.

use kvm_bindings::{kvm_cpuid_entry2, CpuId};
use std::arch::x86_64::__cpuid;

/// What normalization copies from the host.
pub struct HostLeaves {
    /// Leaf 0's EBX, ECX, EDX.
    pub vendor: [u32; 3],
    /// Leaves 0x8000_0005 and 0x8000_0006: EAX, EBX, ECX, EDX each.
    pub caches: [[u32; 4]; 2],
    /// The 48-byte brand string of leaves 0x8000_0002..=0x8000_0004.
    pub brand: [u8; 48],
}

impl HostLeaves {
    pub fn read() -> HostLeaves {
        let regs = |leaf| {
            let r = __cpuid(leaf);
            [r.eax, r.ebx, r.ecx, r.edx]
        };
        let l0 = __cpuid(0);
        let max_ext = __cpuid(0x8000_0000).eax;
        let ext = |leaf| if max_ext >= leaf { regs(leaf) } else { [0; 4] };
        let mut brand = [0u8; 48];
        for (i, leaf) in (0x8000_0002..=0x8000_0004).enumerate() {
            for (j, r) in ext(leaf).iter().enumerate() {
                brand[i * 16 + j * 4..][..4].copy_from_slice(&r.to_le_bytes());
            }
        }
        HostLeaves { vendor: [l0.ebx, l0.ecx, l0.edx], caches: [ext(0x8000_0005), ext(0x8000_0006)], brand }
    }

    fn is_amd(&self) -> bool {
        self.vendor == [u32::from_le_bytes(*b"Auth"), u32::from_le_bytes(*b"cAMD"), u32::from_le_bytes(*b"enti")]
    }

    /// The brand string the guest sees.
    pub fn guest_brand(&self) -> [u8; 48] {
        let text = match self.is_amd() {
            true => "AMD EPYC".to_string(),
            false => match host_frequency(&self.brand) {
                Some(f) => format!("Intel(R) Xeon(R) Processor @ {f}"),
                None => "Intel(R) Xeon(R) Processor".to_string(),
            },
        };
        let mut out = [0u8; 48];
        let n = text.len().min(47);
        out[..n].copy_from_slice(&text.as_bytes()[..n]);
        out
    }
}

/// The frequency ending a brand string (`3.00GHz` of `... CPU @ 3.00GHz`), if it has one.
fn host_frequency(brand: &[u8; 48]) -> Option<String> {
    let text = std::str::from_utf8(brand).ok()?.trim_end_matches('\0').trim_end();
    let last = text.rsplit(' ').next()?;
    let number = last.strip_suffix("GHz").or_else(|| last.strip_suffix("MHz")).or_else(|| last.strip_suffix("THz"))?;
    let numeric = !number.is_empty() && number.chars().all(|c| c.is_ascii_digit() || c == '.');
    numeric.then(|| last.to_string())
}

const TSC_DEADLINE: u32 = 1 << 24;
const HTT: u32 = 1 << 28;

/// Normalizes `cpuid` for one of `count` vCPUs (after the topology and masks).
pub fn normalize(cpuid: &mut CpuId, count: u8, host: &HostLeaves) {
    let amd = host.is_amd();
    let brand = host.guest_brand();
    for e in cpuid.as_mut_slice() {
        match (e.function, e.index) {
            (0, _) => [e.ebx, e.ecx, e.edx] = host.vendor,
            (1, _) => {
                let per_package = u32::from(count.max(1)).next_power_of_two().min(255);
                e.ebx = (e.ebx & !0x00ff_0000) | per_package << 16;
                e.ecx |= TSC_DEADLINE;
                e.edx = if count > 1 { e.edx | HTT } else { e.edx & !HTT };
            }
            (6, _) => {
                e.eax &= !(1 << 1);
                e.ecx &= !(1 << 3);
            }
            (7, 0) => {
                e.ebx |= 1 << 6 | 1 << 13;
                match amd {
                    true => e.edx &= !(1 << 29),
                    false => e.ecx &= !(1 << 5),
                }
            }
            (0xa, _) if !amd => (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0),
            (0x8000_0002..=0x8000_0004, _) => set_brand(e, &brand),
            (0x8000_0005, _) => [e.eax, e.ebx, e.ecx, e.edx] = host.caches[0],
            (0x8000_0006, _) => {
                [e.eax, e.ebx, e.ecx, e.edx] = host.caches[1];
                e.edx &= !0x0003_0000;
            }
            (0x8000_0008, _) if amd => {
                e.ecx = (e.ecx & !0xf0ff) | 7 << 12 | u32::from(count.max(1) - 1);
            }
            _ => {}
        }
    }
}

fn set_brand(e: &mut kvm_cpuid_entry2, brand: &[u8; 48]) {
    let part = (e.function - 0x8000_0002) as usize * 16;
    let word = |i: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&brand[part + i * 4..][..4]);
        u32::from_le_bytes(b)
    };
    (e.eax, e.ebx, e.ecx, e.edx) = (word(0), word(1), word(2), word(3));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intel() -> HostLeaves {
        let mut brand = [0u8; 48];
        brand[..46].copy_from_slice(b"Intel(R) Xeon(R) Platinum 8275CL CPU @ 3.00GHz");
        HostLeaves {
            vendor: [u32::from_le_bytes(*b"Genu"), u32::from_le_bytes(*b"ntel"), u32::from_le_bytes(*b"ineI")],
            caches: [[1, 2, 3, 4], [5, 6, 7, 0xffff_ffff]],
            brand,
        }
    }

    fn entry(function: u32, index: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 { function, index, eax: !0, ebx: !0, ecx: !0, edx: !0, ..Default::default() }
    }

    #[test]
    fn firecrackers_normalization_on_an_intel_host() {
        let host = intel();
        let leaves = [0, 1, 6, 7, 0xa, 0x8000_0002, 0x8000_0003, 0x8000_0004, 0x8000_0005, 0x8000_0006];
        let entries: Vec<_> = leaves.iter().map(|&l| entry(l, 0)).collect();
        let mut cpuid = CpuId::from_entries(&entries).unwrap();
        normalize(&mut cpuid, 3, &host);
        let e = cpuid.as_slice();
        assert_eq!([e[0].ebx, e[0].ecx, e[0].edx], host.vendor, "the host's vendor, whatever a template said");
        assert_eq!((e[1].ebx >> 16) & 0xff, 4, "3 vCPUs: 4 IDs per package");
        assert_ne!(e[1].edx & HTT, 0);
        assert_eq!((e[2].eax & 2, e[2].ecx & 8), (0, 0), "no turbo, no EPB");
        assert_eq!(e[3].ecx & 1 << 5, 0, "no WAITPKG");
        assert_eq!([e[4].eax, e[4].ebx, e[4].ecx, e[4].edx], [0; 4], "no PMU");
        let brand: Vec<u8> =
            e[5..8].iter().flat_map(|l| [l.eax, l.ebx, l.ecx, l.edx]).flat_map(u32::to_le_bytes).collect();
        assert!(brand.starts_with(b"Intel(R) Xeon(R) Processor @ 3.00GHz\0"), "{}", String::from_utf8_lossy(&brand));
        assert_eq!([e[8].eax, e[8].ebx, e[8].ecx, e[8].edx], [1, 2, 3, 4]);
        assert_eq!(e[9].edx, 0xfffc_ffff, "0x8000_0006 EDX[17:16] reserved");
        // One vCPU: no HTT.
        let mut one = CpuId::from_entries(&[entry(1, 0)]).unwrap();
        normalize(&mut one, 1, &host);
        assert_eq!((one.as_slice()[0].edx & HTT, (one.as_slice()[0].ebx >> 16) & 0xff), (0, 1));
    }

    #[test]
    fn a_brand_without_a_frequency_is_the_generic_one() {
        let mut host = intel();
        host.brand = [0; 48];
        host.brand[..26].copy_from_slice(b"Intel(R) Xeon(R) Processor");
        assert!(host.guest_brand().starts_with(b"Intel(R) Xeon(R) Processor\0"));
        host.vendor = [u32::from_le_bytes(*b"Auth"), u32::from_le_bytes(*b"cAMD"), u32::from_le_bytes(*b"enti")];
        assert!(host.guest_brand().starts_with(b"AMD EPYC\0"));
        let mut cpuid = CpuId::from_entries(&[entry(7, 0), entry(0x8000_0008, 0)]).unwrap();
        normalize(&mut cpuid, 4, &host);
        assert_eq!(cpuid.as_slice()[0].edx & 1 << 29, 0, "no ARCH_CAPABILITIES on AMD");
        assert_ne!(cpuid.as_slice()[0].ecx & 1 << 5, 0, "WAITPKG is Intel's to clear");
        assert_eq!(cpuid.as_slice()[1].ecx & 0xf0ff, 7 << 12 | 3);
    }
}
