//! Opening /dev/kvm and checking, up front, every capability the VMM relies on.

use kvm_ioctls::{Cap, Kvm};

#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    #[error("cannot open /dev/kvm: {0}")]
    Open(String),
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

/// What a failed open of /dev/kvm means, and what to do about it.
fn why_not(e: kvm_ioctls::Error) -> String {
    match e.errno() {
        libc::EACCES | libc::EPERM => {
            // SAFETY: getuid cannot fail.
            let uid = unsafe { libc::getuid() };
            format!(
                "permission denied: user {uid} needs read and write access to it (the group that owns it, \
                 or an ACL: setfacl -m u:{uid}:rw /dev/kvm); no other privilege is needed"
            )
        }
        libc::ENOENT => "no such device: load kvm_intel or kvm_amd (on a VM, enable nested virtualization)".into(),
        _ => format!("{e} (is KVM available?)"),
    }
}

/// Opens KVM and names every missing capability in one error.
pub fn open() -> Result<Kvm, KvmError> {
    let kvm = Kvm::new().map_err(|e| KvmError::Open(why_not(e)))?;
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
