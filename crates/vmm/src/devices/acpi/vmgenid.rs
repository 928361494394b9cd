//! VMGenID (Microsoft's "Virtual Machine Generation ID", which Linux's `vmgenid` driver
//! binds to): 16 random bytes in guest memory the guest's tables mark reserved, named by
//! the DSDT's `\_SB_.VGEN` (`_HID` "VMGENCTR", `_CID` "VM_Gen_Counter", `ADDR` the
//! address as a package of two DWORDs), with Firecracker's ids. Every machine gets a new
//! id: a booted one at attach, a restored one too (attach runs on restore, over the
//! snapshot's memory), and once the restored vCPUs hold their interrupt state again the
//! guest is notified through the GED's line (devices/acpi), so its kernel reseeds its
//! RNG: two guests restored from one snapshot never share their random numbers.

use crate::guest_memory::GuestMemoryMmap;
use crate::persist::{DeviceState, Persist, PersistError, StateFault};
use crate::sync::lock;
use acpi_tables::aml::{self, Name, Package};
use acpi_tables::Aml;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

/// The generation id's size.
pub const VMGENID_LEN: u64 = 16;
/// The device's name in the DSDT, which the GED notifies.
pub const VMGENID_PATH: &str = "\\_SB_.VGEN";

#[derive(Debug, thiserror::Error)]
pub enum VmGenIdError {
    #[error("cannot read a new generation id from the host's getrandom")]
    Random(#[source] std::io::Error),
    #[error("cannot write the generation id into guest memory at {0:#x}")]
    Memory(u64, #[source] vm_memory::GuestMemoryError),
    #[error("cannot notify the guest of its new generation")]
    Notify(#[source] std::io::Error),
}

/// 16 bytes from the host's getrandom(2).
pub fn random_id() -> Result<[u8; 16], VmGenIdError> {
    let mut id = [0u8; 16];
    let mut got = 0;
    while got < id.len() {
        let rest = &mut id[got..];
        // SAFETY: the pointer and length are those of `rest`, a live, writable slice that
        // outlives the call; getrandom writes at most that many bytes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(n) {
            Ok(n) => got += n,
            Err(_) => match std::io::Error::last_os_error() {
                e if e.kind() == std::io::ErrorKind::Interrupted => {}
                e => return Err(VmGenIdError::Random(e)),
            },
        }
    }
    Ok(id)
}

/// The device: where its id is, its interrupt line (the GED's) and the irqfd on it.
pub struct VmGenId {
    memory: GuestMemoryMmap,
    addr: u64,
    line: u32,
    irq: EventFd,
    id: Mutex<[u8; 16]>,
}

impl VmGenId {
    /// A new generation at `addr`, written into `memory`; `irq` raises `line`.
    pub fn new(memory: GuestMemoryMmap, addr: u64, line: u32, irq: EventFd) -> Result<VmGenId, VmGenIdError> {
        let device = VmGenId { memory, addr, line, irq, id: Mutex::new([0; 16]) };
        device.renew()?;
        Ok(device)
    }

    /// Writes a new random generation id into guest memory, and returns it.
    pub fn renew(&self) -> Result<[u8; 16], VmGenIdError> {
        let id = random_id()?;
        self.memory.write_slice(&id, GuestAddress(self.addr)).map_err(|e| VmGenIdError::Memory(self.addr, e))?;
        *lock(&self.id) = id;
        tracing::debug!("vmgenid: generation {:032x} at {:#x}", u128::from_le_bytes(id), self.addr);
        Ok(id)
    }

    /// Tells the guest its generation changed (its GED's `_EVT` notifies `\_SB_.VGEN`).
    pub fn notify(&self) -> Result<(), VmGenIdError> {
        self.irq.write(1).map_err(VmGenIdError::Notify)
    }

    /// The generation id this VMM wrote.
    pub fn id(&self) -> [u8; 16] {
        *lock(&self.id)
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn line(&self) -> u32 {
        self.line
    }

    /// Its DSDT device, as Firecracker describes it.
    pub fn aml(&self) -> Vec<u8> {
        let mut v = Vec::new();
        let (low, high) = (self.addr as u32, (self.addr >> 32) as u32);
        aml::Device::new(
            "_SB_.VGEN".into(),
            vec![
                &Name::new("_HID".into(), &"VMGENCTR"),
                &Name::new("_CID".into(), &"VM_Gen_Counter"),
                &Name::new("_DDN".into(), &"VM_Gen_Counter"),
                &Name::new("ADDR".into(), &Package::new(vec![&low, &high])),
            ],
        )
        .to_aml_bytes(&mut v);
        v
    }
}

/// What a snapshot keeps of it: where its id is and its line (the id itself is not
/// state: every restored machine gets a new one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmGenIdState {
    pub addr: u64,
    pub line: u32,
}

impl DeviceState for VmGenIdState {
    const VERSION: u32 = 1;
}

impl Persist<'_> for VmGenId {
    type State = VmGenIdState;
    type SaveArgs = ();
    type RestoreArgs = ();

    fn save(&self, (): ()) -> Result<VmGenIdState, PersistError> {
        Ok(VmGenIdState { addr: self.addr, line: self.line })
    }

    /// The snapshot's device must be this one (the guest's DSDT names its address and
    /// line); its new generation was written at attach.
    fn restore(&self, (): (), state: &VmGenIdState) -> Result<(), PersistError> {
        if state.addr != self.addr {
            let why = format!("the snapshot's id is at {:#x}, this machine's at {:#x}", state.addr, self.addr);
            return Err(StateFault::invalid("addr", why).into());
        }
        if state.line != self.line {
            let why = format!("the snapshot's line is {}, this machine's {}", state.line, self.line);
            return Err(StateFault::invalid("line", why).into());
        }
        Ok(())
    }

    /// The vCPUs' interrupt state is back: tell the guest its generation changed.
    fn start_restored(&self) -> Result<(), PersistError> {
        self.notify().map_err(|e| {
            let cause = std::error::Error::source(&e).map_or_else(String::new, |c| format!(": {c}"));
            PersistError::Refused(format!("{e}{cause}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> VmGenId {
        let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 4 << 20)]).unwrap();
        VmGenId::new(mem, crate::layout::VMGENID_GPA, 5, EventFd::new(libc::EFD_NONBLOCK).unwrap()).unwrap()
    }

    #[test]
    fn each_generation_is_new_and_in_guest_memory() {
        let d = device();
        let read = || {
            let mut id = [0u8; 16];
            d.memory.read_slice(&mut id, GuestAddress(crate::layout::VMGENID_GPA)).unwrap();
            id
        };
        let first = read();
        assert_eq!(first, d.id());
        let second = d.renew().unwrap();
        assert_eq!(read(), second);
        assert_ne!(first, second);
        assert_ne!(device().id(), second);
    }

    #[test]
    fn the_aml_is_firecrackers_vgen_device() {
        let aml = device().aml();
        // Device (\_SB_.VGEN): ExtOpPrefix, DeviceOp, then the name path after the length.
        assert_eq!(&aml[..2], &[0x5b, 0x82]);
        let has = |b: &[u8]| aml.windows(b.len()).any(|w| w == b);
        assert!(has(b"_SB_VGEN"));
        // Name (_HID, "VMGENCTR"), Name (_CID, "VM_Gen_Counter"): strings, not EISA ids.
        assert!(has(b"\x08_HID\x0dVMGENCTR\0"));
        assert!(has(b"\x08_CID\x0dVM_Gen_Counter\0"));
        assert!(has(b"\x08_DDN\x0dVM_Gen_Counter\0"));
        // Name (ADDR, Package (2) { DWord 0xd1000, Zero }).
        let mut addr = b"\x08ADDR\x12\x08\x02\x0c".to_vec();
        addr.extend_from_slice(&(crate::layout::VMGENID_GPA as u32).to_le_bytes());
        addr.push(0x00);
        assert!(has(&addr), "{aml:x?}");
    }

    #[test]
    fn a_state_for_another_place_is_refused_by_field() {
        let d = device();
        let saved = d.save(()).unwrap();
        assert_eq!(saved, VmGenIdState { addr: crate::layout::VMGENID_GPA, line: 5 });
        d.restore((), &saved).unwrap();
        let e = d.restore((), &VmGenIdState { line: 6, ..saved.clone() }).unwrap_err();
        assert!(e.to_string().contains("`line`"), "{e}");
        let e = d.restore((), &VmGenIdState { addr: 0x1000, ..saved }).unwrap_err();
        assert!(e.to_string().contains("`addr`"), "{e}");
    }
}
