//! A template on this host: checked (its vendor, every feature it keeps, its leaves, MSRs
//! and KVM capabilities), then applied to KVM's CPUID once per machine, and its MSRs to
//! each vCPU. CPUID normalization (crate::boot::cpu) comes after, as in Firecracker, so a
//! template cannot move what every guest's topology and platform need.

use super::error::TemplateError;
use super::features;
use super::schema::{CustomTemplate, KvmCapability, MsrModifier, Register};
use super::statics::StaticTemplate;
use crate::host::cpuid::Masks;
use kvm_bindings::{kvm_cpuid_entry2, kvm_msr_entry, CpuId, Msrs};
use kvm_ioctls::{Kvm, VcpuFd};

/// What the vCPUs of a machine built with a template get.
#[derive(Clone, Debug)]
pub struct Applied {
    /// KVM's CPUID with the template's bitmaps applied (before normalization).
    pub cpuid: CpuId,
    /// The MSRs each vCPU's value goes through.
    pub msrs: Vec<MsrModifier>,
}

/// The host's vendor string (CPUID leaf 0).
pub fn host_vendor() -> String {
    let l0 = std::arch::x86_64::__cpuid(0);
    let bytes: Vec<u8> = [l0.ebx, l0.edx, l0.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Where the features a template keeps must come from.
pub struct Offer<'a> {
    /// KVM's CPUID (KVM_GET_SUPPORTED_CPUID).
    pub supported: &'a CpuId,
    /// The bits the host profile hides from every guest.
    pub masks: &'a Masks,
    /// On a nested (kvm_pvm) host the guest runs the host's instructions as they are, and
    /// its KVM leaves many features out of KVM_GET_SUPPORTED_CPUID that the guest sees
    /// anyway (leaf 7 comes from the hardware whatever KVM is told): there a feature is
    /// offered if the hardware has it too. None on a native host.
    pub hardware: Option<&'a dyn Fn(u32, u32) -> [u32; 4]>,
}

/// The host's own CPUID `leaf`.`subleaf`.
pub fn hardware_cpuid(leaf: u32, subleaf: u32) -> [u32; 4] {
    let r = std::arch::x86_64::__cpuid_count(leaf, subleaf);
    [r.eax, r.ebx, r.ecx, r.edx]
}

/// `template` (named `name`; `vendor` for a static one) checked against what `offer`
/// offers on a host of vendor `host_vendor`, and applied to its KVM CPUID.
pub fn apply_cpuid(
    name: &str,
    template: &CustomTemplate,
    vendor: Option<&'static str>,
    host_vendor: &str,
    offer: &Offer,
) -> Result<CpuId, TemplateError> {
    let masks = offer.masks;
    if let Some(want) = vendor.filter(|v| *v != host_vendor) {
        return Err(TemplateError::Vendor { template: name.into(), want, have: host_vendor.into() });
    }
    let mut cpuid = offer.supported.clone();
    for leaf in &template.cpuid_modifiers {
        let entry = cpuid
            .as_mut_slice()
            .iter_mut()
            .find(|e| e.function == leaf.leaf && e.index == leaf.subleaf)
            .ok_or(TemplateError::CpuidNotSupported(leaf.leaf, leaf.subleaf))?;
        let hardware = offer.hardware.map_or([0; 4], |h| h(leaf.leaf, leaf.subleaf));
        for m in &leaf.modifiers {
            let has = register(entry, m.register) | hardware[m.register as usize];
            let offered = has & !hidden(masks, leaf.leaf, leaf.subleaf, m.register);
            let claimed = m.bitmap.ones() as u32 & features::feature_bits(leaf.leaf, leaf.subleaf, m.register);
            let missing = claimed & !offered;
            if missing != 0 {
                let bit = missing.trailing_zeros();
                let why = match has & 1 << bit {
                    0 => String::new(),
                    _ => " (the host profile hides it: KVM cannot run it here)".into(),
                };
                return Err(TemplateError::Feature {
                    template: name.into(),
                    feature: features::name(leaf.leaf, leaf.subleaf, m.register, bit),
                    leaf: leaf.leaf,
                    subleaf: leaf.subleaf,
                    register: m.register.name(),
                    bit,
                    why,
                });
            }
            let value = register(entry, m.register);
            *register_mut(entry, m.register) = m.bitmap.apply(u64::from(value)) as u32;
        }
        entry.flags = leaf.flags;
    }
    Ok(cpuid)
}

fn register(e: &kvm_cpuid_entry2, r: Register) -> u32 {
    match r {
        Register::Eax => e.eax,
        Register::Ebx => e.ebx,
        Register::Ecx => e.ecx,
        Register::Edx => e.edx,
    }
}

fn register_mut(e: &mut kvm_cpuid_entry2, r: Register) -> &mut u32 {
    match r {
        Register::Eax => &mut e.eax,
        Register::Ebx => &mut e.ebx,
        Register::Ecx => &mut e.ecx,
        Register::Edx => &mut e.edx,
    }
}

/// The bits of a register the host profile hides (crate::boot::cpu::cpuid_for clears them).
fn hidden(masks: &Masks, leaf: u32, subleaf: u32, r: Register) -> u32 {
    match (leaf, subleaf, r) {
        (0x1, _, Register::Ecx) => masks.leaf1_ecx,
        (0x1, _, Register::Edx) => masks.leaf1_edx,
        (0x7, 0, Register::Ebx) => masks.leaf7_ebx,
        (0x4000_0001, _, Register::Eax) => masks.kvm_features,
        (0xd, _, _) if masks.no_xsave_state => u32::MAX,
        _ => 0,
    }
}

/// The template's KVM capabilities (those it adds must be there; exitless's own stay
/// required whatever it removes) and MSRs (each one KVM lists).
pub fn check_kvm(template: &CustomTemplate, kvm: &Kvm) -> Result<(), TemplateError> {
    for cap in &template.kvm_capabilities {
        match *cap {
            KvmCapability::Add(n) if kvm.check_extension_raw(u64::from(n)) == 0 => {
                return Err(TemplateError::KvmCapability(n))
            }
            KvmCapability::Remove(n) => tracing::debug!("cpu template: capability {n} removed from the checks"),
            KvmCapability::Add(_) => {}
        }
    }
    if template.msr_modifiers.is_empty() {
        return Ok(());
    }
    let ioctl = |what| move |source| TemplateError::Ioctl { what, source };
    let mut listed = kvm.get_msr_index_list().map_err(ioctl("KVM_GET_MSR_INDEX_LIST"))?.as_slice().to_vec();
    if let Ok(feature) = kvm.get_msr_feature_index_list() {
        listed.extend_from_slice(feature.as_slice());
    }
    match template.msr_modifiers.iter().find(|m| !listed.contains(&m.addr)) {
        Some(m) => Err(TemplateError::MsrNotSupported(m.addr)),
        None => Ok(()),
    }
}

/// Each MSR of `msrs` on `vcpu` read, put through its bitmap, and written back.
pub fn set_msrs(vcpu: &VcpuFd, msrs: &[MsrModifier]) -> Result<(), TemplateError> {
    if msrs.is_empty() {
        return Ok(());
    }
    let ioctl = |what| move |source| TemplateError::Ioctl { what, source };
    let entries: Vec<kvm_msr_entry> =
        msrs.iter().map(|m| kvm_msr_entry { index: m.addr, ..Default::default() }).collect();
    let too_many = || TemplateError::Ioctl { what: "KVM_GET_MSRS", source: kvm_ioctls::Error::new(libc::E2BIG) };
    let mut values = Msrs::from_entries(&entries).map_err(|_| too_many())?;
    let read = vcpu.get_msrs(&mut values).map_err(ioctl("KVM_GET_MSRS"))?;
    if let Some(m) = msrs.get(read) {
        return Err(TemplateError::MsrNotSupported(m.addr));
    }
    for (entry, m) in values.as_mut_slice().iter_mut().zip(msrs) {
        entry.data = m.bitmap.apply(entry.data);
    }
    let written = vcpu.set_msrs(&values).map_err(ioctl("KVM_SET_MSRS"))?;
    match msrs.get(written) {
        Some(m) => Err(TemplateError::MsrNotSupported(m.addr)),
        None => Ok(()),
    }
}

/// A static template's vendor string.
pub fn vendor_of(t: StaticTemplate) -> &'static str {
    t.vendor().id()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> CpuId {
        let e = |function, index, eax, ebx, ecx, edx| kvm_cpuid_entry2 {
            function,
            index,
            eax,
            ebx,
            ecx,
            edx,
            ..Default::default()
        };
        CpuId::from_entries(&[
            e(0x1, 0, 0x000a_06a1, 0, u32::MAX, u32::MAX),
            e(0x7, 0, 0, u32::MAX, u32::MAX, u32::MAX),
            e(0xd, 0, 0x2e7, 0, 0, 0),
            e(0xd, 1, 0xf, 0, 0, 0),
            e(0x8000_0001, 0, 0, 0, u32::MAX, u32::MAX),
            e(0x8000_0008, 0, 0x3030, u32::MAX, 0, 0),
        ])
        .unwrap()
    }

    fn offer<'a>(supported: &'a CpuId, masks: &'a Masks) -> Offer<'a> {
        Offer { supported, masks, hardware: None }
    }

    fn leaf(cpuid: &CpuId, function: u32, index: u32) -> kvm_cpuid_entry2 {
        *cpuid.as_slice().iter().find(|e| e.function == function && e.index == index).unwrap()
    }

    #[test]
    fn t2_hides_what_it_hides_and_claims_the_signature() {
        let t2 = StaticTemplate::T2;
        let cpuid =
            apply_cpuid("T2", &t2.template(), Some(vendor_of(t2)), "GenuineIntel", &offer(&host(), &Masks::PLATFORM))
                .unwrap();
        let l1 = leaf(&cpuid, 1, 0);
        assert_eq!(l1.eax, 0x0003_06f2, "Haswell's signature (the reserved bits the host's)");
        assert_eq!(l1.ecx & (1 << 5 | 1 << 3), 0, "no VMX, no MONITOR");
        let l7 = leaf(&cpuid, 7, 0);
        assert_eq!(l7.ebx & (1 << 29 | 1 << 16 | 1 << 19), 0, "no SHA, AVX512F, ADX");
        assert_ne!(l7.ebx & (1 << 5 | 1 << 9), 0, "AVX2 and ERMS kept");
        assert_eq!(l7.flags, 1);
        assert_eq!(leaf(&cpuid, 0xd, 0).eax, 0x7, "x87, SSE, AVX state only");
        assert_eq!(leaf(&cpuid, 0x8000_0001, 0).edx & 1 << 26, 0, "no 1-GiB pages");
    }

    #[test]
    fn a_template_refuses_a_host_without_a_feature_it_keeps_naming_it() {
        let t2 = StaticTemplate::T2;
        let mut cpuid = host();
        cpuid.as_mut_slice()[1].ebx &= !(1 << 9); // no ERMS
        let e =
            apply_cpuid("T2", &t2.template(), Some(vendor_of(t2)), "GenuineIntel", &offer(&cpuid, &Masks::PLATFORM))
                .unwrap_err()
                .to_string();
        assert!(e.contains("T2 keeps erms (CPUID leaf 0x7 subleaf 0x0 ebx bit 9)"), "{e}");
        // A nested host's KVM leaves ERMS out, but its guests see the hardware's: offered.
        let hardware = |leaf, _| if leaf == 7 { [0, 1 << 9, 0, 0] } else { [0; 4] };
        let nested = Offer { supported: &cpuid, masks: &Masks::NESTED, hardware: Some(&hardware) };
        assert!(apply_cpuid("T2", &t2.template(), Some(vendor_of(t2)), "GenuineIntel", &nested).is_ok());
        // One the host has but its profile hides is named as such.
        let mut custom = CustomTemplate::from_json(
            br#"{"cpuid_modifiers": [{"leaf": "0x1", "subleaf": "0x0", "flags": 0,
                  "modifiers": [{"register": "ecx", "bitmap": "0b1x_xxxx_xxxx_xxxx"}]}]}"#,
        )
        .unwrap();
        let e = apply_cpuid("custom", &custom, None, "GenuineIntel", &offer(&host(), &Masks::NESTED))
            .unwrap_err()
            .to_string();
        assert!(e.contains("keeps cx16") && e.contains("profile hides it"), "{e}");
        // Setting a non-feature (the signature) is a value, not a claim.
        custom.cpuid_modifiers[0].modifiers[0].register = Register::Eax;
        assert!(apply_cpuid("custom", &custom, None, "GenuineIntel", &offer(&host(), &Masks::NESTED)).is_ok());
    }

    #[test]
    fn the_wrong_vendor_and_a_leaf_kvm_lacks_are_refused() {
        let t2a = StaticTemplate::T2A;
        let e = apply_cpuid(
            "T2A",
            &t2a.template(),
            Some(vendor_of(t2a)),
            "GenuineIntel",
            &offer(&host(), &Masks::PLATFORM),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "the CPU template T2A is for AuthenticAMD CPUs; this host's is GenuineIntel");
        let custom = CustomTemplate::from_json(
            br#"{"cpuid_modifiers": [{"leaf": "0x14", "subleaf": "0x1", "flags": 1, "modifiers": []}]}"#,
        )
        .unwrap();
        let e = apply_cpuid("custom", &custom, None, "GenuineIntel", &offer(&host(), &Masks::PLATFORM)).unwrap_err();
        assert_eq!(e, TemplateError::CpuidNotSupported(0x14, 1));
        assert!(e.to_string().contains("Leaf: 0x14, Subleaf: 0x1"));
    }
}
