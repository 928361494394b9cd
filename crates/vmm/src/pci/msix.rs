//! MSI-X: the vector table and pending-bit array a function exposes in a BAR, and the
//! delivery of each vector through its own irqfd.
//!
//! Masking is done here, as the PCI spec asks of the device: a masked vector (its own
//! mask bit, the function mask, or MSI-X disabled) is not written to its irqfd but marked
//! pending in the PBA, and delivered as soon as it is unmasked.

use crate::irq::{GsiRouter, IrqError, MsiMessage};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use vmm_sys_util::eventfd::EventFd;

pub const MSIX_ENTRY_SIZE: usize = 16;
/// Message Control bits the guest may change.
pub const CONTROL_ENABLE: u16 = 1 << 15;
pub const CONTROL_FUNCTION_MASK: u16 = 1 << 14;

struct Vector {
    /// The table entry as the guest wrote it: address (8), data (4), vector control (4).
    raw: [u8; MSIX_ENTRY_SIZE],
    pending: bool,
    irqfd: EventFd,
    gsi: u32,
}

impl Vector {
    fn message(&self) -> MsiMessage {
        let address = u64::from_le_bytes(self.raw[0..8].try_into().unwrap_or_default());
        MsiMessage { address, data: u32::from_le_bytes(self.raw[8..12].try_into().unwrap_or_default()) }
    }

    fn masked(&self) -> bool {
        self.raw[12] & 1 != 0
    }
}

/// A function's MSI-X table as a snapshot keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MsixState {
    pub entries: Vec<[u8; MSIX_ENTRY_SIZE]>,
    pub pending: Vec<bool>,
}

pub struct Msix {
    vectors: Vec<Vector>,
    enabled: bool,
    function_masked: bool,
    router: Arc<GsiRouter>,
    /// Interrupts written to an irqfd (not those left pending).
    pub delivered: AtomicU64,
}

impl Msix {
    /// `count` vectors, each with an irqfd on a GSI of its own; all masked, as at reset.
    pub fn new(router: Arc<GsiRouter>, count: usize) -> Result<Msix, IrqError> {
        let mut vectors = Vec::with_capacity(count);
        for _ in 0..count {
            let irqfd = EventFd::new(libc::EFD_NONBLOCK).map_err(IrqError::Eventfd)?;
            let gsi = router.allocate(&irqfd)?;
            let mut raw = [0u8; MSIX_ENTRY_SIZE];
            raw[12] = 1;
            vectors.push(Vector { raw, pending: false, irqfd, gsi });
        }
        Ok(Msix { vectors, enabled: false, function_masked: false, router, delivered: AtomicU64::new(0) })
    }

    pub fn len(&self) -> usize {
        self.vectors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.vectors.is_empty()
    }

    /// `vector`'s irqfd, for a vhost-user backend to signal it directly (None for a
    /// vector the table does not have).
    pub fn vector_irqfd(&self, vector: u16) -> Option<&EventFd> {
        self.vectors.get(usize::from(vector)).map(|v| &v.irqfd)
    }

    /// Each vector's GSI, in vector order.
    pub fn gsis(&self) -> Vec<u32> {
        self.vectors.iter().map(|v| v.gsi).collect()
    }

    fn blocked(&self, v: &Vector) -> bool {
        !self.enabled || self.function_masked || v.masked()
    }

    /// Signals `vector`, or marks it pending while it is masked. Out-of-range vectors
    /// (a guest's choice) are dropped.
    pub fn trigger(&mut self, vector: u16) {
        let blocked = match self.vectors.get(usize::from(vector)) {
            Some(v) => self.blocked(v),
            None => return,
        };
        let v = &mut self.vectors[usize::from(vector)];
        if blocked {
            v.pending = true;
        } else if v.irqfd.write(1).is_ok() {
            self.delivered.fetch_add(1, Ordering::Relaxed);
            self.router.delivered();
        }
    }

    /// Delivers what became unmasked.
    fn deliver_pending(&mut self) {
        for i in 0..self.vectors.len() {
            if self.vectors[i].pending && !self.blocked(&self.vectors[i]) {
                self.vectors[i].pending = false;
                self.trigger(i as u16);
            }
        }
    }

    /// Message Control from config space (enable, function mask).
    pub fn set_control(&mut self, control: u16) {
        self.enabled = control & CONTROL_ENABLE != 0;
        self.function_masked = control & CONTROL_FUNCTION_MASK != 0;
        self.deliver_pending();
    }

    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            let at = offset as usize + i;
            *b = self.vectors.get(at / MSIX_ENTRY_SIZE).map_or(0, |v| v.raw[at % MSIX_ENTRY_SIZE]);
        }
    }

    pub fn table_write(&mut self, offset: u64, data: &[u8]) {
        let index = offset as usize / MSIX_ENTRY_SIZE;
        let Some(v) = self.vectors.get_mut(index) else { return };
        let start = offset as usize % MSIX_ENTRY_SIZE;
        if start + data.len() > MSIX_ENTRY_SIZE {
            return;
        }
        v.raw[start..start + data.len()].copy_from_slice(data);
        // Only the mask bit of vector control is implemented.
        v.raw[12] &= 1;
        v.raw[13..16].fill(0);
        // A driver masks a vector while it writes the message, one dword at a time:
        // routing it once on unmask, not on each partial write, spares KVM rebuilding
        // its whole routing table three or four times per vector.
        if !v.masked() {
            let (gsi, msg) = (v.gsi, v.message());
            if let Err(e) = self.router.set(gsi, msg) {
                tracing::warn!("MSI-X vector {index}: cannot route it: {e}");
            }
        }
        self.deliver_pending();
    }

    /// The table and pending bits, for a snapshot (enable and mask live in config space).
    pub fn save(&self) -> MsixState {
        MsixState {
            entries: self.vectors.iter().map(|v| v.raw).collect(),
            pending: self.vectors.iter().map(|v| v.pending).collect(),
        }
    }

    /// Puts a snapshot's table back: each unmasked vector routed to its message. Nothing is
    /// delivered here (the vCPUs' interrupt state is not restored yet): pending bits stay
    /// until the guest unmasks.
    pub fn restore(&mut self, saved: &MsixState) -> Result<(), String> {
        if saved.entries.len() != self.vectors.len() || saved.pending.len() != self.vectors.len() {
            return Err(format!("{} MSI-X vectors there, {} here", saved.entries.len(), self.vectors.len()));
        }
        for (v, (raw, &pending)) in self.vectors.iter_mut().zip(saved.entries.iter().zip(&saved.pending)) {
            v.raw = *raw;
            v.raw[12] &= 1;
            v.raw[13..16].fill(0);
            v.pending = pending;
            if !v.masked() {
                self.router.set(v.gsi, v.message()).map_err(|e| format!("cannot route an MSI-X vector: {e}"))?;
            }
        }
        Ok(())
    }

    pub fn pba_read(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            let first = (offset as usize + i) * 8;
            *b = (0..8)
                .filter(|bit| self.vectors.get(first + bit).is_some_and(|v| v.pending))
                .fold(0, |acc, bit| acc | 1 << bit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeKvm;

    fn msix(n: usize) -> (Arc<FakeKvm>, Msix) {
        let kvm = Arc::new(FakeKvm::default());
        let router = Arc::new(GsiRouter::new(kvm.clone()));
        (kvm, Msix::new(router, n).unwrap())
    }

    fn program(m: &mut Msix, v: usize, data: u32, masked: bool) {
        let base = (v * MSIX_ENTRY_SIZE) as u64;
        m.table_write(base, &0xfee0_0000u32.to_le_bytes());
        m.table_write(base + 4, &0u32.to_le_bytes());
        m.table_write(base + 8, &data.to_le_bytes());
        m.table_write(base + 12, &u32::from(masked).to_le_bytes());
    }

    fn fired(m: &Msix, v: usize) -> u64 {
        m.vectors[v].irqfd.read().unwrap_or(0)
    }

    #[test]
    fn vectors_fire_only_when_enabled_and_unmasked_and_pending_ones_follow() {
        let (kvm, mut m) = msix(3);
        assert_eq!(kvm.irqfds.lock().unwrap().len(), 3, "one irqfd per vector");
        program(&mut m, 1, 0x41, false);
        m.trigger(1);
        assert_eq!(fired(&m, 1), 0, "MSI-X not enabled yet");
        let mut pba = [0u8; 1];
        m.pba_read(0, &mut pba);
        assert_eq!(pba[0], 0b10);
        m.set_control(CONTROL_ENABLE);
        assert_eq!(fired(&m, 1), 1, "the pending interrupt is delivered on enable");
        m.pba_read(0, &mut pba);
        assert_eq!(pba[0], 0);
        m.set_control(CONTROL_ENABLE | CONTROL_FUNCTION_MASK);
        m.trigger(1);
        m.trigger(1);
        assert_eq!(fired(&m, 1), 0);
        m.set_control(CONTROL_ENABLE);
        assert_eq!(fired(&m, 1), 1, "two while masked make one pending bit");
        program(&mut m, 2, 0x42, true);
        m.trigger(2);
        assert_eq!(fired(&m, 2), 0);
        m.table_write(2 * 16 + 12, &[0, 0, 0, 0]);
        assert_eq!(fired(&m, 2), 1, "unmasking the entry delivers");
        m.trigger(9); // no such vector: ignored
        assert_eq!(m.delivered.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_vector_is_routed_once_when_unmasked_not_on_each_dword() {
        let (kvm, mut m) = msix(2);
        let before = kvm.route_updates.load(Ordering::Relaxed);
        program(&mut m, 0, 0x4021, true);
        program(&mut m, 1, 0x4022, true);
        assert_eq!(kvm.route_updates.load(Ordering::Relaxed), before, "masked writes do not route");
        m.table_write(12, &0u32.to_le_bytes());
        m.table_write(16 + 12, &0u32.to_le_bytes());
        assert_eq!(kvm.route_updates.load(Ordering::Relaxed), before + 2);
        assert!(kvm.msi_routes().contains(&(25, MsiMessage { address: 0xfee0_0000, data: 0x4022 })));
        m.table_write(12, &0u32.to_le_bytes()); // the same message again: nothing to do
        assert_eq!(kvm.route_updates.load(Ordering::Relaxed), before + 2);
    }

    #[test]
    fn table_writes_route_the_message_and_keep_reserved_bits_zero() {
        let (kvm, mut m) = msix(2);
        program(&mut m, 0, 0x4021, false);
        let routes = kvm.msi_routes();
        assert!(routes.contains(&(24, MsiMessage { address: 0xfee0_0000, data: 0x4021 })), "{routes:?}");
        m.table_write(12, &0xffff_ffffu32.to_le_bytes());
        let mut ctrl = [0u8; 4];
        m.table_read(12, &mut ctrl);
        assert_eq!(u32::from_le_bytes(ctrl), 1);
        // Out of range and straddling writes are ignored, reads of them are zero.
        m.table_write(2 * 16, &[1; 4]);
        m.table_write(14, &[1; 4]);
        let mut far = [0xffu8; 4];
        m.table_read(64, &mut far);
        assert_eq!(far, [0; 4]);
    }
}
