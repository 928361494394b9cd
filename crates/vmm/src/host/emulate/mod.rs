//! Completing instructions KVM gave up on.
//!
//! On a nested host like this one, KVM emulates every guest instruction at CPL0 and fails
//! on some it does not know (`KVM_EXIT_INTERNAL_ERROR`, emulation failure). Where the VMM
//! can finish such an instruction itself, safely and exactly, it does: it decodes the bytes
//! at RIP (iced-x86), applies the instruction to the vCPU's registers or to guest memory,
//! moves RIP past it, and lets the guest go on. Anything else still ends the run, with the
//! instruction named. Each kind completed is counted in the exit profile.

#[cfg(feature = "nested-host")]
mod decode;
#[cfg(feature = "nested-host")]
mod sse;
pub mod syscall;

use crate::guest_memory::GuestMemoryMmap;
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress};

pub use crate::stats::Completed;

/// Why an instruction could not be completed.
#[derive(Debug)]
pub struct NotCompleted(pub String);

type Result<T> = std::result::Result<T, NotCompleted>;

fn fail<T>(what: impl Into<String>) -> Result<T> {
    Err(NotCompleted(what.into()))
}

/// Guest-virtual memory access through the vCPU's page tables (KVM_TRANSLATE), page by page.
pub(crate) fn guest_access(vcpu: &VcpuFd, mem: &GuestMemoryMmap, gva: u64, buf: &mut [u8], write: bool) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let va = gva.wrapping_add(done as u64);
        let chunk = ((0x1000 - (va & 0xfff)) as usize).min(buf.len() - done);
        let t = vcpu.translate_gva(va).map_err(|e| NotCompleted(format!("KVM_TRANSLATE {va:#x}: {e}")))?;
        if t.valid == 0 || (write && t.writeable == 0) {
            return fail(format!("guest address {va:#x} is not mapped{}", if write { " writable" } else { "" }));
        }
        let gpa = GuestAddress(t.physical_address);
        let part = &mut buf[done..done + chunk];
        let ok = if write { mem.write_slice(part, gpa).is_ok() } else { mem.read_slice(part, gpa).is_ok() };
        if !ok {
            return fail(format!("guest address {va:#x} is not RAM"));
        }
        done += chunk;
    }
    Ok(())
}

/// Completes the instruction at RIP that KVM gave up on, or says why not.
pub fn complete(vcpu: &VcpuFd, mem: &GuestMemoryMmap) -> Result<Completed> {
    #[cfg(feature = "nested-host")]
    return decode::complete(vcpu, mem);
    #[cfg(not(feature = "nested-host"))]
    {
        let _ = (vcpu, mem);
        fail("this exitless was built without the nested-host feature, which completes it")
    }
}
