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

/// The ioctl numbers exitless issues itself or lets its seccomp filters through, defined
/// once (KVMIO is 0xAE).
pub mod ioctl_numbers {
    use kvm_bindings::*;
    use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iow_nr, ioctl_iowr_nr};

    ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
    ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
    ioctl_iow_nr!(KVM_SET_REGS, KVMIO, 0x82, kvm_regs);
    ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
    ioctl_iowr_nr!(KVM_TRANSLATE, KVMIO, 0x85, kvm_translation);
    ioctl_ior_nr!(KVM_GET_FPU, KVMIO, 0x8c, kvm_fpu);
    ioctl_iow_nr!(KVM_SET_FPU, KVMIO, 0x8d, kvm_fpu);
    ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_mp_state);
    ioctl_iow_nr!(KVM_SET_MP_STATE, KVMIO, 0x99, kvm_mp_state);
    ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, KVMIO, 0x9f, kvm_vcpu_events);
    ioctl_iow_nr!(KVM_SET_VCPU_EVENTS, KVMIO, 0xa0, kvm_vcpu_events);
    ioctl_iow_nr!(KVM_SET_SREGS, KVMIO, 0x84, kvm_sregs);
    ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);
    ioctl_iow_nr!(KVM_SET_MSRS, KVMIO, 0x89, kvm_msrs);
    ioctl_iow_nr!(KVM_SET_GUEST_DEBUG, KVMIO, 0x9b, kvm_guest_debug);
    ioctl_iow_nr!(KVM_SET_USER_MEMORY_REGION, KVMIO, 0x46, kvm_userspace_memory_region);
    ioctl_iow_nr!(KVM_IRQ_LINE, KVMIO, 0x61, kvm_irq_level);
    ioctl_iow_nr!(KVM_SET_GSI_ROUTING, KVMIO, 0x6a, kvm_irq_routing);
    ioctl_iow_nr!(KVM_IRQFD, KVMIO, 0x76, kvm_irqfd);
    ioctl_iow_nr!(KVM_IOEVENTFD, KVMIO, 0x79, kvm_ioeventfd);
    ioctl_iow_nr!(KVM_REGISTER_COALESCED_MMIO, KVMIO, 0x67, kvm_coalesced_mmio_zone);
    ioctl_iow_nr!(KVM_UNREGISTER_COALESCED_MMIO, KVMIO, 0x68, kvm_coalesced_mmio_zone);
    // What a snapshot reads (crate::snapshot): the VM's on the API thread, each vCPU's on its own.
    ioctl_iowr_nr!(KVM_GET_MSR_INDEX_LIST, KVMIO, 0x02, kvm_msr_list);
    ioctl_iowr_nr!(KVM_GET_IRQCHIP, KVMIO, 0x62, kvm_irqchip);
    ioctl_ior_nr!(KVM_GET_PIT2, KVMIO, 0x9f, kvm_pit_state2);
    ioctl_ior_nr!(KVM_GET_CLOCK, KVMIO, 0x7c, kvm_clock_data);
    ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_xsave);
    ioctl_ior_nr!(KVM_GET_XCRS, KVMIO, 0xa6, kvm_xcrs);
    ioctl_ior_nr!(KVM_GET_DEBUGREGS, KVMIO, 0xa1, kvm_debugregs);
    ioctl_ior_nr!(KVM_GET_LAPIC, KVMIO, 0x8e, kvm_lapic_state);
    ioctl_io_nr!(KVM_GET_TSC_KHZ, KVMIO, 0xa3);
    ioctl_iow_nr!(KVM_GET_DIRTY_LOG, KVMIO, 0x42, kvm_dirty_log);
}

/// Something that can add and delete KVM memory slots beside guest RAM (the VM; a
/// stand-in in unit tests): the pages the guest reads without an exit (ECAM, virtio-mmio
/// registers), read-only, and device memory (a virtio-pmem file).
pub trait MemslotSink: Send + Sync {
    /// Maps `size` bytes at host address `host` at `gpa`, read-only if asked; `size` 0
    /// deletes the slot.
    fn set_slot(&self, slot: u32, gpa: u64, size: u64, host: u64, read_only: bool) -> std::io::Result<()>;

    /// [`MemslotSink::set_slot`], read-only.
    fn set_readonly_slot(&self, slot: u32, gpa: u64, size: u64, host: u64) -> std::io::Result<()> {
        self.set_slot(slot, gpa, size, host, true)
    }
}

impl MemslotSink for kvm_ioctls::VmFd {
    fn set_slot(&self, slot: u32, gpa: u64, size: u64, host: u64, read_only: bool) -> std::io::Result<()> {
        let region = kvm_bindings::kvm_userspace_memory_region {
            slot,
            flags: if read_only { kvm_bindings::KVM_MEM_READONLY } else { 0 },
            guest_phys_addr: gpa,
            memory_size: size,
            userspace_addr: host,
        };
        // SAFETY: `host` points into a mapping its owner (EcamShadow, RegisterPage, a pmem
        // device) keeps until it has deleted the slot, or until the VM is gone.
        unsafe { self.set_user_memory_region(region) }.map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    }
}

/// What can mend guest memory after `KVM_RUN` failed with EFAULT: a host mapping behind a
/// memory slot that lost its pages (a virtio-pmem file truncated under the guest). Each
/// repair says whether it changed anything; the vCPU then enters the guest again.
pub trait FaultRepair: Send + Sync {
    fn repair(&self) -> bool;
}

/// The repairs the device manager registers and every vCPU consults.
#[derive(Default)]
pub struct FaultRepairs(std::sync::Mutex<Vec<std::sync::Arc<dyn FaultRepair>>>);

impl FaultRepairs {
    pub fn register(&self, repair: std::sync::Arc<dyn FaultRepair>) {
        crate::sync::lock(&self.0).push(repair);
    }

    /// Drops `repair` (its device unplugged).
    pub fn unregister(&self, repair: &std::sync::Arc<dyn FaultRepair>) {
        crate::sync::lock(&self.0).retain(|r| !std::sync::Arc::ptr_eq(r, repair));
    }

    /// Every repair tried (not only up to the first that mends); true if any changed
    /// something.
    pub fn repair_any(&self) -> bool {
        let mut mended = false;
        for repair in crate::sync::lock(&self.0).iter() {
            mended |= repair.repair();
        }
        mended
    }
}
