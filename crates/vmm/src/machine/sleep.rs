//! ACPI S3, suspend to RAM: what happens between the guest setting SLP_EN and its waking
//! vector running, which on a PC is the firmware's part. The vCPUs park
//! ([`RunControl::suspend`]); vCPU 0 waits for the wake event this machine models (the
//! CMOS RTC's alarm, armed by the guest through RTC_EN and the alarm interrupt), raises
//! WAK_STS and RTC_STS, and every vCPU restarts as after a reset: vCPU 0 in real mode at
//! the FACS's waking vector (where a BIOS's resume path jumps), the others waiting for a
//! SIPI. RAM keeps its contents, and so do the devices (none of them loses power here).
//! Offered with `--testdevs` (kvm-unit-tests' `s3`); the DSDT offers no `_S3_` to Linux.

use crate::devices::legacy::acpi_pm::{RTC_EN, RTC_STS, WAK_STS};
use crate::devices::legacy::cmos_rtc::CmosRtc;
use crate::devices::legacy::AcpiPm;
use crate::guest_memory::GuestMemoryMmap;
use crate::run_control::{GuestStop, RunControl};
use kvm_bindings::{kvm_dtable, kvm_mp_state, kvm_regs, kvm_segment, KVM_MP_STATE_INIT_RECEIVED};
use kvm_ioctls::VcpuFd;
use std::sync::Arc;
use std::time::{Instant, SystemTime};
use vm_memory::{Bytes, GuestAddress};

/// The FACS's 32-bit waking vector, a real-mode address, is at this offset.
const FACS_WAKING_VECTOR: u64 = 12;
/// Where an application processor's reset leaves it: the reset vector, waiting for SIPI.
const RESET_CS: u16 = 0xf000;
const RESET_IP: u64 = 0xfff0;

pub struct Sleep {
    pm: Arc<AcpiPm>,
    rtc: Arc<CmosRtc>,
    facs: u64,
    memory: GuestMemoryMmap,
}

impl crate::vcpu::Suspend for Sleep {
    fn sleep(&self, id: u8, fd: &mut VcpuFd, control: &RunControl) -> Result<(), String> {
        self.sleep_vcpu(id, fd, control)
    }
}

impl Sleep {
    pub fn new(pm: Arc<AcpiPm>, rtc: Arc<CmosRtc>, facs: u64, memory: GuestMemoryMmap) -> Self {
        Sleep { pm, rtc, facs, memory }
    }

    /// When the armed wake event comes, if the guest armed one.
    fn next_wake(&self) -> Option<Instant> {
        if self.pm.enabled() & RTC_EN == 0 {
            return None;
        }
        let now = SystemTime::now();
        let at = self.rtc.next_wake(now)?;
        Some(Instant::now() + at.duration_since(now).unwrap_or_default())
    }

    /// vCPU `id` sleeps until the machine wakes (vCPU 0 waits for the wake event), then
    /// restarts as the firmware would have it. An error is for the guest's fault report.
    fn sleep_vcpu(&self, id: u8, fd: &mut VcpuFd, control: &RunControl) -> Result<(), String> {
        if id == 0 {
            if control.park_until(self.next_wake()) {
                tracing::info!("RTC alarm: the guest wakes from S3");
                self.pm.raise_status(WAK_STS | RTC_STS);
                control.wake();
            }
        } else {
            control.park();
        }
        if control.should_stop() || control.is_suspended() {
            return Ok(());
        }
        // Let KVM finish the exit that was under way (the write of SLP_EN) before the
        // registers change under it: one entry that leaves at once.
        fd.set_kvm_immediate_exit(1);
        let _ = fd.run();
        fd.set_kvm_immediate_exit(0);
        let failed = |what: &str, e: kvm_ioctls::Error| format!("resuming from S3: {what}: {e}");
        if id != 0 {
            let init = kvm_mp_state { mp_state: KVM_MP_STATE_INIT_RECEIVED };
            fd.set_mp_state(init).map_err(|e| failed("KVM_SET_MP_STATE", e))?;
            return real_mode(fd, RESET_CS, RESET_IP).map_err(|e| failed("entering real mode", e));
        }
        let vector: u32 = self.memory.read_obj(GuestAddress(self.facs + FACS_WAKING_VECTOR)).unwrap_or(0);
        if vector == 0 || vector > 0xf_ffff {
            // A BIOS finding no waking vector boots afresh; there is nothing here to boot.
            tracing::info!("S3 wake with no real-mode waking vector in the FACS ({vector:#x}): a reset");
            control.guest_stop(GuestStop::Reset);
            return Ok(());
        }
        real_mode(fd, (vector >> 4) as u16, u64::from(vector & 0xf)).map_err(|e| failed("entering real mode", e))
    }
}

/// Real mode at `cs`:`ip`, as after a reset: paging and protection off, flat 64 KiB data
/// segments at 0, the interrupt vector table at 0, general registers zero.
fn real_mode(fd: &VcpuFd, cs: u16, ip: u64) -> Result<(), kvm_ioctls::Error> {
    let segment = |selector: u16, type_: u8| kvm_segment {
        base: u64::from(selector) << 4,
        limit: 0xffff,
        selector,
        type_,
        present: 1,
        s: 1,
        ..Default::default()
    };
    let mut sregs = fd.get_sregs()?;
    sregs.cs = segment(cs, 0xb);
    for data in [&mut sregs.ds, &mut sregs.es, &mut sregs.fs, &mut sregs.gs, &mut sregs.ss] {
        *data = segment(0, 0x3);
    }
    sregs.tr = kvm_segment { type_: 0xb, present: 1, limit: 0xffff, ..Default::default() };
    sregs.ldt = kvm_segment { type_: 0x2, present: 1, limit: 0xffff, ..Default::default() };
    sregs.gdt = kvm_dtable { base: 0, limit: 0xffff, ..Default::default() };
    sregs.idt = kvm_dtable { base: 0, limit: 0x3ff, ..Default::default() };
    // ET only: caches on, unlike a cold reset's CD and NW, as a BIOS leaves them.
    sregs.cr0 = 0x10;
    sregs.cr2 = 0;
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
    fd.set_sregs(&sregs)?;
    fd.set_regs(&kvm_regs { rip: ip, rflags: 0x2, ..Default::default() })
}
