//! ioeventfd registry: a guest write to a registered port or MMIO address signals an
//! eventfd inside KVM, and the vCPU never comes back to userspace for it.
//!
//! kvm-ioctls ties the access length to the datamatch type (a wildcard is always length
//! 0), so registrations go through `KVM_IOEVENTFD` here, with KVM's rules checked first
//! so a mistake is a clear error rather than an errno:
//! - length 0 (MMIO only: KVM's fast MMIO path) matches a write of any size, otherwise
//!   the write's size must equal the length or it takes the normal userspace exit;
//! - a registration collides with another at the same address when either has length 0,
//!   or both have the same length and either is a wildcard or both match the same value;
//! - at most `per_address` registrations per address and `per_vm` in all.

use kvm_bindings::kvm_ioeventfd;
use kvm_ioctls::VmFd;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::ioctl::ioctl_with_ref;

use crate::kvm::ioctl_numbers::KVM_IOEVENTFD;

const FLAG_DATAMATCH: u32 = 1 << kvm_bindings::kvm_ioeventfd_flag_nr_datamatch;
const FLAG_PIO: u32 = 1 << kvm_bindings::kvm_ioeventfd_flag_nr_pio;
const FLAG_DEASSIGN: u32 = 1 << kvm_bindings::kvm_ioeventfd_flag_nr_deassign;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoSpace {
    Pio,
    Mmio,
}

/// What a registration listens for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IoeventfdKey {
    pub space: IoSpace,
    pub addr: u64,
    /// 0 (MMIO only, any size), 1, 2, 4 or 8 (MMIO only) bytes.
    pub len: u8,
    /// `None` matches any value (a wildcard).
    pub datamatch: Option<u64>,
}

impl IoeventfdKey {
    pub fn pio(port: u16, len: u8, datamatch: Option<u64>) -> Self {
        IoeventfdKey { space: IoSpace::Pio, addr: u64::from(port), len, datamatch }
    }

    pub fn mmio(addr: u64, len: u8, datamatch: Option<u64>) -> Self {
        IoeventfdKey { space: IoSpace::Mmio, addr, len, datamatch }
    }

    /// Whether KVM would signal this registration for a guest write of `size` bytes of `value` at `addr`.
    pub fn matches(&self, space: IoSpace, addr: u64, size: u8, value: u64) -> bool {
        if space != self.space || addr != self.addr {
            return false;
        }
        if self.len == 0 {
            return true;
        }
        let mask = if self.len >= 8 { u64::MAX } else { (1u64 << (8 * self.len)) - 1 };
        size == self.len && self.datamatch.is_none_or(|want| want & mask == value & mask)
    }

    /// KVM's collision rule (see the module comment).
    fn collides(&self, other: &IoeventfdKey) -> bool {
        self.space == other.space
            && self.addr == other.addr
            && (self.len == 0
                || other.len == 0
                || (self.len == other.len
                    && (self.datamatch.is_none() || other.datamatch.is_none() || self.datamatch == other.datamatch)))
    }
}

/// Bounds on registrations, so a guest-driven device cannot make the VMM register without end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoeventfdLimits {
    pub per_address: usize,
    pub per_vm: usize,
}

impl Default for IoeventfdLimits {
    fn default() -> Self {
        IoeventfdLimits { per_address: 32, per_vm: 1000 }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IoeventfdError {
    #[error("ioeventfd length {len} is not valid for {space:?} (0 and 8 are MMIO only; else 1, 2 or 4)")]
    BadLength { space: IoSpace, len: u8 },
    #[error("ioeventfd {new:?} collides with registered {existing:?}")]
    Collision { new: IoeventfdKey, existing: IoeventfdKey },
    #[error("ioeventfd {0:?}: a zero-length registration cannot match data")]
    ZeroLengthDatamatch(IoeventfdKey),
    #[error("ioeventfd {key:?}: already {limit} registrations at {:#x} (the per-address limit)", key.addr)]
    AddressFull { key: IoeventfdKey, limit: usize },
    #[error("ioeventfd {key:?}: already {limit} registrations in this VM (the per-VM limit)")]
    VmFull { key: IoeventfdKey, limit: usize },
    #[error("ioeventfd {0:?} is not registered")]
    NotRegistered(IoeventfdKey),
    #[error("KVM_IOEVENTFD for {key:?} failed: {errno}")]
    Kvm { key: IoeventfdKey, errno: i32 },
}

/// Something that can carry out `KVM_IOEVENTFD` (the VM; a stand-in in unit tests).
pub trait IoeventfdSink: Send + Sync {
    fn ioeventfd(&self, key: &IoeventfdKey, fd: &EventFd, assign: bool) -> Result<(), i32>;
}

impl IoeventfdSink for VmFd {
    fn ioeventfd(&self, key: &IoeventfdKey, fd: &EventFd, assign: bool) -> Result<(), i32> {
        let mut flags = if assign { 0 } else { FLAG_DEASSIGN };
        if key.space == IoSpace::Pio {
            flags |= FLAG_PIO;
        }
        if key.datamatch.is_some() {
            flags |= FLAG_DATAMATCH;
        }
        let request = kvm_ioeventfd {
            datamatch: key.datamatch.unwrap_or(0),
            addr: key.addr,
            len: u32::from(key.len),
            fd: fd.as_raw_fd(),
            flags,
            ..Default::default()
        };
        // SAFETY: `self` is a VM fd, `request` is a valid kvm_ioeventfd that KVM only reads,
        // and the return value is checked.
        let ret = unsafe { ioctl_with_ref(self, KVM_IOEVENTFD(), &request) };
        if ret == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
        }
    }
}

/// The VM's ioeventfds, checked against KVM's rules and the limits.
pub struct IoeventfdRegistry {
    sink: Arc<dyn IoeventfdSink>,
    limits: IoeventfdLimits,
    entries: Mutex<Vec<(IoeventfdKey, EventFd)>>,
}

impl IoeventfdRegistry {
    pub fn new(sink: Arc<dyn IoeventfdSink>, limits: IoeventfdLimits) -> Self {
        IoeventfdRegistry { sink, limits, entries: Mutex::new(Vec::new()) }
    }

    /// Registers `fd` for `key`; KVM signals it on every matching guest write.
    pub fn register(&self, key: IoeventfdKey, fd: &EventFd) -> Result<(), IoeventfdError> {
        let valid_len = match key.space {
            IoSpace::Pio => matches!(key.len, 1 | 2 | 4),
            IoSpace::Mmio => matches!(key.len, 0 | 1 | 2 | 4 | 8),
        };
        if !valid_len {
            return Err(IoeventfdError::BadLength { space: key.space, len: key.len });
        }
        if key.len == 0 && key.datamatch.is_some() {
            return Err(IoeventfdError::ZeroLengthDatamatch(key));
        }
        let mut entries = crate::sync::lock(&self.entries);
        if let Some((existing, _)) = entries.iter().find(|(k, _)| k.collides(&key)) {
            return Err(IoeventfdError::Collision { new: key, existing: *existing });
        }
        let at_address = entries.iter().filter(|(k, _)| k.space == key.space && k.addr == key.addr).count();
        if at_address >= self.limits.per_address {
            return Err(IoeventfdError::AddressFull { key, limit: self.limits.per_address });
        }
        if entries.len() >= self.limits.per_vm {
            return Err(IoeventfdError::VmFull { key, limit: self.limits.per_vm });
        }
        let fd = fd.try_clone().map_err(|e| IoeventfdError::Kvm { key, errno: e.raw_os_error().unwrap_or(0) })?;
        self.sink.ioeventfd(&key, &fd, true).map_err(|errno| IoeventfdError::Kvm { key, errno })?;
        entries.push((key, fd));
        Ok(())
    }

    pub fn unregister(&self, key: IoeventfdKey) -> Result<(), IoeventfdError> {
        let mut entries = crate::sync::lock(&self.entries);
        let at = entries.iter().position(|(k, _)| *k == key).ok_or(IoeventfdError::NotRegistered(key))?;
        self.sink.ioeventfd(&key, &entries[at].1, false).map_err(|errno| IoeventfdError::Kvm { key, errno })?;
        entries.remove(at);
        Ok(())
    }

    /// Unregisters every registration in `[from, from + len)` and hands them back with
    /// addresses relative to `from` (a BAR leaving the bus takes its ioeventfds along).
    pub fn take_range(
        &self,
        space: IoSpace,
        from: u64,
        len: u64,
    ) -> Result<Vec<(IoeventfdKey, EventFd)>, IoeventfdError> {
        let mut entries = crate::sync::lock(&self.entries);
        let mut taken = Vec::new();
        let mut i = 0;
        while i < entries.len() {
            let key = entries[i].0;
            if key.space == space && key.addr >= from && key.addr - from < len {
                self.sink.ioeventfd(&key, &entries[i].1, false).map_err(|errno| IoeventfdError::Kvm { key, errno })?;
                let (key, fd) = entries.remove(i);
                taken.push((IoeventfdKey { addr: key.addr - from, ..key }, fd));
            } else {
                i += 1;
            }
        }
        Ok(taken)
    }

    /// Whether `key` is registered.
    pub fn contains(&self, key: &IoeventfdKey) -> bool {
        crate::sync::lock(&self.entries).iter().any(|(k, _)| k == key)
    }

    pub fn len(&self) -> usize {
        crate::sync::lock(&self.entries).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::FakeKvm;

    fn registry(limits: IoeventfdLimits) -> (Arc<FakeKvm>, IoeventfdRegistry) {
        let kvm = Arc::new(FakeKvm::default());
        (kvm.clone(), IoeventfdRegistry::new(kvm, limits))
    }

    fn efd() -> EventFd {
        EventFd::new(libc::EFD_NONBLOCK).unwrap()
    }

    #[test]
    fn a_write_of_another_size_never_matches() {
        let key = IoeventfdKey::pio(0x510, 4, None);
        assert!(key.matches(IoSpace::Pio, 0x510, 4, 7));
        for size in [1, 2, 8] {
            assert!(!key.matches(IoSpace::Pio, 0x510, size, 7), "size {size}");
        }
        let dm = IoeventfdKey::mmio(0xd000_0000, 2, Some(0xabcd));
        assert!(dm.matches(IoSpace::Mmio, 0xd000_0000, 2, 0xabcd));
        assert!(!dm.matches(IoSpace::Mmio, 0xd000_0000, 4, 0xabcd));
        assert!(!dm.matches(IoSpace::Mmio, 0xd000_0000, 2, 0xabce));
        assert!(!dm.matches(IoSpace::Pio, 0xd000_0000, 2, 0xabcd), "other address space");
        // Zero length: KVM's fast MMIO path takes every size.
        let fast = IoeventfdKey::mmio(0xd000_0000, 0, None);
        assert!([1, 2, 4, 8].iter().all(|&s| fast.matches(IoSpace::Mmio, 0xd000_0000, s, 0)));
        // A 64-bit datamatch compares all 64 bits.
        let wide = IoeventfdKey::mmio(0x1000, 8, Some(u64::MAX - 1));
        assert!(wide.matches(IoSpace::Mmio, 0x1000, 8, u64::MAX - 1));
        assert!(!wide.matches(IoSpace::Mmio, 0x1000, 8, u64::MAX));
    }

    #[test]
    fn the_same_registration_twice_is_an_error() {
        let (kvm, reg) = registry(IoeventfdLimits::default());
        let key = IoeventfdKey::pio(0x510, 4, Some(1));
        reg.register(key, &efd()).unwrap();
        assert!(matches!(reg.register(key, &efd()), Err(IoeventfdError::Collision { .. })));
        // KVM would also refuse a wildcard beside a datamatch of the same length...
        assert!(matches!(
            reg.register(IoeventfdKey::pio(0x510, 4, None), &efd()),
            Err(IoeventfdError::Collision { .. })
        ));
        // ...but takes other values and other lengths.
        reg.register(IoeventfdKey::pio(0x510, 4, Some(2)), &efd()).unwrap();
        reg.register(IoeventfdKey::pio(0x510, 2, None), &efd()).unwrap();
        // A zero-length MMIO registration owns its address.
        reg.register(IoeventfdKey::mmio(0x2000, 0, None), &efd()).unwrap();
        assert!(matches!(
            reg.register(IoeventfdKey::mmio(0x2000, 4, Some(9)), &efd()),
            Err(IoeventfdError::Collision { .. })
        ));
        assert_eq!(kvm.ioeventfds.lock().unwrap().len(), 4, "refused registrations never reach KVM");
    }

    #[test]
    fn limits_per_address_and_per_vm_are_errors_not_crashes() {
        let (_, reg) = registry(IoeventfdLimits::default());
        for v in 0..32 {
            reg.register(IoeventfdKey::pio(0x600, 4, Some(v)), &efd()).unwrap();
        }
        let err = reg.register(IoeventfdKey::pio(0x600, 4, Some(99)), &efd()).unwrap_err();
        assert!(matches!(err, IoeventfdError::AddressFull { limit: 32, .. }), "{err}");
        assert!(err.to_string().contains("per-address limit"));

        let (_, small) = registry(IoeventfdLimits { per_address: 2, per_vm: 3 });
        small.register(IoeventfdKey::mmio(0x1000, 4, Some(1)), &efd()).unwrap();
        small.register(IoeventfdKey::mmio(0x1000, 4, Some(2)), &efd()).unwrap();
        assert!(matches!(
            small.register(IoeventfdKey::mmio(0x1000, 4, Some(3)), &efd()),
            Err(IoeventfdError::AddressFull { limit: 2, .. })
        ));
        small.register(IoeventfdKey::mmio(0x2000, 4, None), &efd()).unwrap();
        let err = small.register(IoeventfdKey::mmio(0x3000, 4, None), &efd()).unwrap_err();
        assert!(matches!(err, IoeventfdError::VmFull { limit: 3, .. }), "{err}");
        // Unregistering makes room again.
        small.unregister(IoeventfdKey::mmio(0x2000, 4, None)).unwrap();
        small.register(IoeventfdKey::mmio(0x3000, 4, None), &efd()).unwrap();
        assert_eq!(small.len(), 3);
    }

    #[test]
    fn bad_lengths_and_unknown_keys_are_refused() {
        let (_, reg) = registry(IoeventfdLimits::default());
        for (key, ok) in [
            (IoeventfdKey::pio(0x10, 0, None), false),
            (IoeventfdKey::pio(0x10, 8, None), false),
            (IoeventfdKey::pio(0x10, 3, None), false),
            (IoeventfdKey::mmio(0x10, 16, None), false),
            (IoeventfdKey::mmio(0x10, 8, Some(u64::MAX)), true),
        ] {
            assert_eq!(reg.register(key, &efd()).is_ok(), ok, "{key:?}");
        }
        assert!(matches!(
            reg.register(IoeventfdKey::mmio(0x20, 0, Some(1)), &efd()),
            Err(IoeventfdError::ZeroLengthDatamatch(_))
        ));
        assert!(matches!(reg.unregister(IoeventfdKey::pio(0x99, 1, None)), Err(IoeventfdError::NotRegistered(_))));
    }

    #[test]
    fn take_range_unregisters_a_range_and_returns_it_relative() {
        let (kvm, reg) = registry(IoeventfdLimits::default());
        reg.register(IoeventfdKey::mmio(0x1000, 4, Some(1)), &efd()).unwrap();
        reg.register(IoeventfdKey::mmio(0x1004, 4, Some(2)), &efd()).unwrap();
        reg.register(IoeventfdKey::mmio(0x5000, 4, None), &efd()).unwrap();
        let taken = reg.take_range(IoSpace::Mmio, 0x1000, 0x1000).unwrap();
        let keys: Vec<_> = taken.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, [IoeventfdKey::mmio(0, 4, Some(1)), IoeventfdKey::mmio(4, 4, Some(2))]);
        assert!(reg.contains(&IoeventfdKey::mmio(0x5000, 4, None)));
        assert_eq!(reg.len(), 1);
        let log = kvm.ioeventfds.lock().unwrap();
        assert_eq!(log.iter().filter(|(k, assign)| !assign && k.addr & !0xfff == 0x1000).count(), 2);
    }
}
