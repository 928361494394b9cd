//! VMClock (the uapi-group's `vmclock_abi`, which Linux's `ptp_vmclock` driver binds to):
//! a page of guest memory the DSDT names as `\_SB_.VCLK` (`_HID` "AMZNC10C", `_CID`
//! "VMCLOCK", its page in `_CRS`), with Firecracker's ids and fields. exitless offers no
//! counter or time through it (`counter_id` invalid, status unknown), as Firecracker;
//! what it does carry is the disruption marker and the VM generation counter, both bumped
//! at every snapshot load (under the structure's seqcount), with a notification on its
//! GED line once the restored vCPUs hold their state: a guest's clients (chrony, an
//! application's TSC calibration) learn that the clock they calibrated was disrupted.

use crate::guest_memory::GuestMemoryMmap;
use crate::persist::{DeviceState, Persist, PersistError, StateFault};
use crate::sync::lock;
use acpi_tables::aml::{self, AddressSpace, AddressSpaceCacheable, Method, Name, ResourceTemplate, Return};
use acpi_tables::Aml;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;
use zerocopy::byteorder::{LE, U16, U32, U64};
use zerocopy::{Immutable, IntoBytes};

/// The region the guest maps: one page.
pub const VMCLOCK_LEN: u64 = 0x1000;
/// The device's name in the DSDT, which the GED notifies.
pub const VMCLOCK_PATH: &str = "\\_SB_.VCLK";
/// "VCLK".
pub const VMCLOCK_MAGIC: u32 = 0x4b4c_4356;
const COUNTER_INVALID: u8 = 0xff;
const FLAG_VM_GEN_COUNTER_PRESENT: u64 = 1 << 8;
const FLAG_NOTIFICATION_PRESENT: u64 = 1 << 9;

/// `struct vmclock_abi` (include/uapi/linux/vmclock-abi.h), little-endian, 112 bytes.
#[repr(C)]
#[derive(Clone, Copy, Default, IntoBytes, Immutable)]
pub struct VmclockAbi {
    pub magic: U32<LE>,
    pub size: U32<LE>,
    pub version: U16<LE>,
    pub counter_id: u8,
    pub time_type: u8,
    pub seq_count: U32<LE>,
    pub disruption_marker: U64<LE>,
    pub flags: U64<LE>,
    pub pad: [u8; 2],
    pub clock_status: u8,
    pub leap_second_smearing_hint: u8,
    pub tai_offset_sec: U16<LE>,
    pub leap_indicator: u8,
    pub counter_period_shift: u8,
    pub counter_value: U64<LE>,
    pub counter_period_frac_sec: U64<LE>,
    pub counter_period_esterror_rate_frac_sec: U64<LE>,
    pub counter_period_maxerror_rate_frac_sec: U64<LE>,
    pub time_sec: U64<LE>,
    pub time_frac_sec: U64<LE>,
    pub time_esterror_nanosec: U64<LE>,
    pub time_maxerror_nanosec: U64<LE>,
    pub vm_generation_counter: U64<LE>,
}

const _: () = assert!(std::mem::size_of::<VmclockAbi>() == 112);
const _: () = assert!(std::mem::offset_of!(VmclockAbi, disruption_marker) == 16);
const _: () = assert!(std::mem::offset_of!(VmclockAbi, clock_status) == 34);
const _: () = assert!(std::mem::offset_of!(VmclockAbi, vm_generation_counter) == 104);

#[derive(Debug, thiserror::Error)]
pub enum VmClockError {
    #[error("cannot write the VMClock structure into guest memory at {0:#x}")]
    Memory(u64, #[source] vm_memory::GuestMemoryError),
    #[error("cannot notify the guest of a clock disruption")]
    Notify(#[source] std::io::Error),
}

/// What changes of the structure (the rest is constant): a snapshot keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counters {
    pub seq_count: u32,
    pub disruption_marker: u64,
    pub vm_generation_counter: u64,
}

impl Counters {
    fn abi(&self) -> VmclockAbi {
        VmclockAbi {
            magic: VMCLOCK_MAGIC.into(),
            size: (VMCLOCK_LEN as u32).into(),
            version: 1.into(),
            counter_id: COUNTER_INVALID,
            flags: (FLAG_VM_GEN_COUNTER_PRESENT | FLAG_NOTIFICATION_PRESENT).into(),
            seq_count: self.seq_count.into(),
            disruption_marker: self.disruption_marker.into(),
            vm_generation_counter: self.vm_generation_counter.into(),
            ..Default::default()
        }
    }
}

/// The device: where its page is, its interrupt line (the GED's), the irqfd on it, and
/// the counters it last wrote.
pub struct VmClock {
    memory: GuestMemoryMmap,
    addr: u64,
    line: u32,
    irq: EventFd,
    counters: Mutex<Counters>,
}

impl VmClock {
    /// The device at `addr`; a booted machine's (`write`) has its structure written now, a
    /// restored one's when its state is put back.
    pub fn new(memory: GuestMemoryMmap, addr: u64, line: u32, irq: EventFd, write: bool) -> Result<Self, VmClockError> {
        let device = VmClock { memory, addr, line, irq, counters: Mutex::default() };
        if write {
            device.write(&Counters::default())?;
        }
        Ok(device)
    }

    fn write(&self, counters: &Counters) -> Result<(), VmClockError> {
        let abi = counters.abi();
        self.memory
            .write_slice(abi.as_bytes(), GuestAddress(self.addr))
            .map_err(|e| VmClockError::Memory(self.addr, e))?;
        *lock(&self.counters) = *counters;
        Ok(())
    }

    /// A load's disruption: the seqcount goes odd, the marker and the generation counter
    /// move on, the seqcount goes even again (each write its own, in that order, as a
    /// reader of the seqlock expects).
    fn disrupt(&self, from: Counters) -> Result<Counters, VmClockError> {
        let mut c = Counters { seq_count: from.seq_count | 1, ..from };
        self.write(&c)?;
        c.disruption_marker = c.disruption_marker.wrapping_add(1);
        c.vm_generation_counter = c.vm_generation_counter.wrapping_add(1);
        self.write(&c)?;
        c.seq_count = c.seq_count.wrapping_add(1);
        self.write(&c)?;
        Ok(c)
    }

    /// Tells the guest the clock was disrupted (its GED's `_EVT` notifies `\_SB_.VCLK`).
    pub fn notify(&self) -> Result<(), VmClockError> {
        self.irq.write(1).map_err(VmClockError::Notify)
    }

    pub fn counters(&self) -> Counters {
        *lock(&self.counters)
    }

    pub fn line(&self) -> u32 {
        self.line
    }

    /// Its DSDT device, as Firecracker describes it.
    pub fn aml(&self) -> Vec<u8> {
        let mut v = Vec::new();
        let crs = AddressSpace::new_memory(
            AddressSpaceCacheable::Cacheable,
            false,
            self.addr,
            self.addr + VMCLOCK_LEN - 1,
            None,
        );
        aml::Device::new(
            "_SB_.VCLK".into(),
            vec![
                &Name::new("_HID".into(), &"AMZNC10C"),
                &Name::new("_CID".into(), &"VMCLOCK"),
                &Name::new("_DDN".into(), &"VMCLOCK"),
                &Method::new("_STA".into(), 0, false, vec![&Return::new(&0x0fu8)]),
                &Name::new("_CRS".into(), &ResourceTemplate::new(vec![&crs])),
            ],
        )
        .to_aml_bytes(&mut v);
        v
    }
}

/// What a snapshot keeps of it: where its page is, its line, and its counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmClockState {
    pub addr: u64,
    pub line: u32,
    pub counters: Counters,
}

impl DeviceState for VmClockState {
    const VERSION: u32 = 1;
}

fn refused(e: impl std::error::Error) -> PersistError {
    let cause = e.source().map_or_else(String::new, |c| format!(": {c}"));
    PersistError::Refused(format!("{e}{cause}"))
}

impl Persist<'_> for VmClock {
    type State = VmClockState;
    type SaveArgs = ();
    type RestoreArgs = ();

    fn save(&self, (): ()) -> Result<VmClockState, PersistError> {
        Ok(VmClockState { addr: self.addr, line: self.line, counters: self.counters() })
    }

    /// The snapshot's device must be this one; its structure is written again from the
    /// saved counters (not from guest memory, which the guest may have written), with the
    /// load's disruption.
    fn restore(&self, (): (), state: &VmClockState) -> Result<(), PersistError> {
        if state.addr != self.addr {
            let why = format!("the snapshot's page is at {:#x}, this machine's at {:#x}", state.addr, self.addr);
            return Err(StateFault::invalid("addr", why).into());
        }
        if state.line != self.line {
            let why = format!("the snapshot's line is {}, this machine's {}", state.line, self.line);
            return Err(StateFault::invalid("line", why).into());
        }
        if state.counters.seq_count & 1 != 0 {
            let why = "odd: the snapshot caught an update half-written, which this VMM never leaves";
            return Err(StateFault::invalid("counters.seq_count", why).into());
        }
        self.disrupt(state.counters).map(drop).map_err(refused)
    }

    /// The vCPUs' interrupt state is back: tell the guest its clock was disrupted.
    fn start_restored(&self) -> Result<(), PersistError> {
        self.notify().map_err(refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::VMCLOCK_GPA;

    fn device(write: bool) -> VmClock {
        let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 4 << 20)]).unwrap();
        VmClock::new(mem, VMCLOCK_GPA, 6, EventFd::new(libc::EFD_NONBLOCK).unwrap(), write).unwrap()
    }

    fn read(d: &VmClock) -> Vec<u8> {
        let mut v = vec![0u8; 112];
        d.memory.read_slice(&mut v, GuestAddress(VMCLOCK_GPA)).unwrap();
        v
    }

    fn u64_at(v: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(v[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn a_booted_guest_finds_the_uapi_structure() {
        let v = read(&device(true));
        assert_eq!(&v[..4], b"VCLK");
        assert_eq!(u32::from_le_bytes(v[4..8].try_into().unwrap()), 0x1000);
        assert_eq!((v[8], v[9], v[10]), (1, 0, 0xff), "version 1, counter invalid");
        assert_eq!(u64_at(&v, 24), (1 << 8) | (1 << 9), "flags: generation counter, notification");
        assert_eq!((u64_at(&v, 16), u64_at(&v, 104)), (0, 0));
        assert!(read(&device(false)).iter().all(|&b| b == 0), "a restored one waits for its state");
    }

    #[test]
    fn every_load_bumps_the_marker_and_generation_under_an_even_seqcount() {
        let first = device(true);
        let saved = first.save(()).unwrap();
        for n in 1..=2 {
            let restored = device(false);
            restored.restore((), &saved).unwrap();
            let v = read(&restored);
            assert_eq!(u32::from_le_bytes(v[12..16].try_into().unwrap()), 2, "seqcount even, moved on");
            assert_eq!((u64_at(&v, 16), u64_at(&v, 104)), (1, 1), "restore {n}");
            let again = restored.save(()).unwrap();
            let third = device(false);
            third.restore((), &again).unwrap();
            assert_eq!(third.counters(), Counters { seq_count: 4, disruption_marker: 2, vm_generation_counter: 2 });
        }
        let odd = VmClockState { counters: Counters { seq_count: 3, ..saved.counters }, ..saved.clone() };
        assert!(device(false).restore((), &odd).unwrap_err().to_string().contains("seq_count"));
        let moved = VmClockState { line: 9, ..saved };
        assert!(device(false).restore((), &moved).unwrap_err().to_string().contains("`line`"));
    }

    #[test]
    fn the_aml_is_firecrackers_vclk_device() {
        let aml = device(true).aml();
        let has = |b: &[u8]| aml.windows(b.len()).any(|w| w == b);
        assert!(has(b"_SB_VCLK"));
        assert!(has(b"\x08_HID\x0dAMZNC10C\0"));
        assert!(has(b"\x08_CID\x0dVMCLOCK\0"));
        // _STA returns 0x0f.
        assert!(has(b"_STA\x00\xa4\x0a\x0f"), "{aml:x?}");
        // A QWord memory descriptor: cacheable, read-only, the page.
        let at = aml.iter().position(|&b| b == 0x8a).expect("no QWord descriptor");
        assert_eq!((aml[at + 3], aml[at + 5]), (0, 0b010));
        assert_eq!(u64_at(&aml, at + 14), VMCLOCK_GPA);
        assert_eq!(u64_at(&aml, at + 22), VMCLOCK_GPA + VMCLOCK_LEN - 1);
    }
}
