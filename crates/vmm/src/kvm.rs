//! Opening /dev/kvm and checking, up front, every capability the VMM relies on.

use kvm_ioctls::{Cap, Kvm};

#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    #[error("cannot open /dev/kvm: {0} (is KVM available and are you allowed to use it?)")]
    Open(#[source] kvm_ioctls::Error),
    #[error("KVM API version {0} is not the supported version 12")]
    ApiVersion(i32),
    #[error("KVM lacks capabilities exitless needs: {}", .0.join(", "))]
    MissingCaps(Vec<&'static str>),
}

/// Capabilities used by the VMM core and its fast paths, with the names the KVM API uses.
pub const REQUIRED_CAPS: &[(Cap, &str)] = &[
    (Cap::UserMemory, "KVM_CAP_USER_MEMORY"),
    (Cap::SetTssAddr, "KVM_CAP_SET_TSS_ADDR"),
    (Cap::ExtCpuid, "KVM_CAP_EXT_CPUID"),
    (Cap::Irqchip, "KVM_CAP_IRQCHIP"),
    (Cap::Irqfd, "KVM_CAP_IRQFD"),
    (Cap::Ioeventfd, "KVM_CAP_IOEVENTFD"),
    (Cap::ReadonlyMem, "KVM_CAP_READONLY_MEM"),
    (Cap::ImmediateExit, "KVM_CAP_IMMEDIATE_EXIT"),
    (Cap::GetTscKhz, "KVM_CAP_GET_TSC_KHZ"),
];

/// Opens KVM and names every missing capability in one error.
pub fn open() -> Result<Kvm, KvmError> {
    let kvm = Kvm::new().map_err(KvmError::Open)?;
    let version = kvm.get_api_version();
    if version != 12 {
        return Err(KvmError::ApiVersion(version));
    }
    let missing: Vec<_> =
        REQUIRED_CAPS.iter().filter(|(cap, _)| !kvm.check_extension(*cap)).map(|&(_, name)| name).collect();
    if !missing.is_empty() {
        return Err(KvmError::MissingCaps(missing));
    }
    Ok(kvm)
}

/// Whether this machine can run guests at all (tests skip loudly when not).
pub fn available() -> bool {
    std::path::Path::new("/dev/kvm").exists() && Kvm::new().is_ok()
}
