//! Does a guest write to a read-only memory slot reach the MMIO bus's ioeventfds?
//!
//! virtio-mmio's register page is served from read-only memory (virtio::mmio::page), so
//! register reads never exit; its QueueNotify register must still be an ioeventfd inside
//! that page. KVM turns a write to a read-only slot into an emulated MMIO write, which on
//! x86 is offered to the kernel's MMIO bus (ioeventfds) before it becomes a userspace exit
//! (vcpu_mmio_write); this probe checks that a host's KVM does so, at the guest's CPL0
//! (where drivers run) and CPL3, on a throwaway VM with one vCPU in long mode. It runs as a
//! test, not at every start (a VM costs milliseconds): on a host whose KVM did not, a
//! notify or acknowledgement would come back as an MMIO exit, which the transport serves
//! exactly as the ioeventfd would have (virtio::mmio), so mapped registers stay correct
//! and only cost those exits.

use kvm_bindings::{kvm_segment, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES, KVM_MEM_READONLY};
use kvm_ioctls::{IoEventAddress, Kvm, VcpuExit};
use vmm_sys_util::eventfd::EventFd;

/// Where the probe's read-only page sits, and what its register at +0x60 holds.
const PAGE_GPA: u64 = 0xe000_0000;
const PAGE_VALUE: u32 = 0xfeed_beef;
const CODE_GPA: u64 = 0x10000;
const RAM_SIZE: usize = 0x40_0000;

/// What the guest did, as KVM delivered it.
#[derive(Debug, PartialEq, Eq)]
pub struct ProbeOutcome {
    /// The ioeventfd on the page's +0x50 (datamatch 1) counted the guest's write there.
    pub ioeventfd_signalled: bool,
    /// The userspace MMIO exits seen, by page offset: +0x50 if the ioeventfd missed, and
    /// +0x70 (no ioeventfd) always.
    pub mmio_write_exits: Vec<u64>,
    /// What the guest read at +0x60 (PAGE_VALUE when the read came from the page).
    pub read_value: u32,
}

impl ProbeOutcome {
    /// Reads from the page, and a notify through the ioeventfd without an exit.
    pub fn page_can_be_mapped(&self) -> bool {
        self.ioeventfd_signalled && self.mmio_write_exits == [0x70] && self.read_value == PAGE_VALUE
    }
}

/// Runs the probe at guest privilege level `cpl` (0 or 3).
pub fn probe(cpl: u8) -> Result<ProbeOutcome, String> {
    let e = |what: &'static str| move |err: kvm_ioctls::Error| format!("{what}: {err}");
    let kvm = Kvm::new().map_err(e("open /dev/kvm"))?;
    let vm = kvm.create_vm().map_err(e("KVM_CREATE_VM"))?;
    let ram = Mapping::new(RAM_SIZE)?;
    let page = Mapping::new(0x1000)?;
    page.write(0x60, &PAGE_VALUE.to_le_bytes());
    build_guest(&ram, cpl);
    for (slot, gpa, m, flags) in [(0, 0, &ram, 0), (1, PAGE_GPA, &page, KVM_MEM_READONLY)] {
        let region = kvm_userspace_memory_region {
            slot,
            flags,
            guest_phys_addr: gpa,
            memory_size: m.len as u64,
            userspace_addr: m.ptr as u64,
        };
        // SAFETY: both mappings outlive the VM (they are dropped after `vm` below).
        unsafe { vm.set_user_memory_region(region) }.map_err(e("KVM_SET_USER_MEMORY_REGION"))?;
    }
    let notify = EventFd::new(libc::EFD_NONBLOCK).map_err(|err| format!("eventfd: {err}"))?;
    vm.register_ioevent(&notify, &IoEventAddress::Mmio(PAGE_GPA + 0x50), 1u32).map_err(e("KVM_IOEVENTFD"))?;
    let mut vcpu = vm.create_vcpu(0).map_err(e("KVM_CREATE_VCPU"))?;
    let cpuid = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(e("KVM_GET_SUPPORTED_CPUID"))?;
    vcpu.set_cpuid2(&cpuid).map_err(e("KVM_SET_CPUID2"))?;
    let mut sregs = vcpu.get_sregs().map_err(e("KVM_GET_SREGS"))?;
    let user = cpl == 3;
    let code = kvm_segment {
        limit: 0xffff_ffff,
        selector: if user { 0x1b } else { 8 },
        present: 1,
        type_: 11,
        dpl: cpl,
        s: 1,
        l: 1,
        g: 1,
        ..Default::default()
    };
    let data = kvm_segment { selector: if user { 0x23 } else { 16 }, type_: 3, l: 0, db: 1, ..code };
    (sregs.cs, sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (code, data, data, data, data, data);
    (sregs.cr3, sregs.cr4, sregs.cr0, sregs.efer) = (0x1000, 0x20 | 0x200 | 0x400, 0x8000_0013, 0x500);
    vcpu.set_sregs(&sregs).map_err(e("KVM_SET_SREGS"))?;
    let regs = kvm_bindings::kvm_regs { rip: CODE_GPA, rflags: 0x3002, rsp: 0x20_0000, ..Default::default() };
    vcpu.set_regs(&regs).map_err(e("KVM_SET_REGS"))?;
    let mut mmio_write_exits = Vec::new();
    for _ in 0..16 {
        match vcpu.run().map_err(e("KVM_RUN"))? {
            VcpuExit::MmioWrite(addr, _) => mmio_write_exits.push(addr.wrapping_sub(PAGE_GPA)),
            VcpuExit::IoOut(0x11, _) => {
                let read_value = vcpu.get_regs().map_err(e("KVM_GET_REGS"))?.rbx as u32;
                return Ok(ProbeOutcome { ioeventfd_signalled: notify.read().is_ok(), mmio_write_exits, read_value });
            }
            other => return Err(format!("unexpected exit {other:?}")),
        }
    }
    Err("the probe guest never finished".into())
}

/// Identity-mapped page tables (2 MiB pages: RAM's first 4 MiB and the probe page's) and
/// the guest: `mov rsi, PAGE; mov eax, 1; mov [rsi+0x50], eax; mov ebx, [rsi+0x60];
/// mov [rsi+0x70], eax; out 0x11, al; jmp $`.
fn build_guest(ram: &Mapping, cpl: u8) {
    let u = if cpl == 3 { 4u64 } else { 0 };
    let entries: [(usize, u64); 6] = [
        (0x1000, 0x2000 | 3 | u),                  // PML4[0] -> PDPT
        (0x2000, 0x3000 | 3 | u),                  // PDPT[0] -> PD for 0..1 GiB
        (0x3000, 0x83 | u),                        // 0..2 MiB
        (0x3008, 0x20_0000 | 0x83 | u),            // 2..4 MiB
        (0x2000 + 3 * 8, 0x4000 | 3 | u),          // PDPT[3] -> PD for 3..4 GiB
        (0x4000 + 0x100 * 8, PAGE_GPA | 0x83 | u), // the probe page's 2 MiB
    ];
    for (at, entry) in entries {
        ram.write(at, &entry.to_le_bytes());
    }
    let mut code = vec![0x48, 0xbe];
    code.extend_from_slice(&PAGE_GPA.to_le_bytes());
    code.extend_from_slice(&[0xb8, 1, 0, 0, 0, 0x89, 0x46, 0x50, 0x8b, 0x5e, 0x60, 0x89, 0x46, 0x70]);
    code.extend_from_slice(&[0xe6, 0x11, 0xeb, 0xfe]);
    ram.write(CODE_GPA as usize, &code);
}

/// An anonymous shared mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Result<Self, String> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh anonymous mapping; checked below.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        Ok(Mapping { ptr: ptr.cast(), len })
    }

    fn write(&self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= self.len);
        // SAFETY: inside the mapping (asserted); no guest runs while the probe writes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at), bytes.len()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used by any VM (dropped first).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_write_to_a_read_only_slot_reaches_its_ioeventfd() {
        if !crate::testing::kvm_or_skip("a_write_to_a_read_only_slot_reaches_its_ioeventfd") {
            return;
        }
        for cpl in [0, 3] {
            let outcome = super::probe(cpl).unwrap();
            assert!(outcome.page_can_be_mapped(), "CPL{cpl}: {outcome:?}");
        }
    }
}
