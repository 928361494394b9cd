//! The lab control port: the guest announces the step it begins or ends, and the lab
//! loop, which owns the vCPU, acts on it between two `KVM_RUN`s.

use exitless_vmm::bus::BusDevice;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the guest announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabEvent {
    Begin(usize),
    End(usize),
}

const NONE: u64 = u64::MAX;

/// Holds the last announcement until the lab loop takes it.
pub struct LabControl {
    pending: AtomicU64,
}

impl Default for LabControl {
    fn default() -> Self {
        LabControl { pending: AtomicU64::new(NONE) }
    }
}

impl LabControl {
    /// Called after every exit: a plain load, and a locked swap only when there is news.
    #[inline]
    pub fn take(&self) -> Option<LabEvent> {
        if self.pending.load(Ordering::Acquire) == NONE {
            return None;
        }
        let v = self.pending.swap(NONE, Ordering::AcqRel);
        let step = (v & 0xffff) as usize;
        match v >> 16 {
            op if op == exitless_payloads::abi::LAB_OP_BEGIN => Some(LabEvent::Begin(step)),
            op if op == exitless_payloads::abi::LAB_OP_END => Some(LabEvent::End(step)),
            _ => None,
        }
    }
}

impl BusDevice for LabControl {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if offset == 0 && data.len() == 4 {
            let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            self.pending.store(u64::from(v), Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_decode_and_garbage_is_ignored() {
        let c = LabControl::default();
        assert_eq!(c.take(), None);
        c.write(0, &[3, 0, 1, 0]);
        assert_eq!(c.take(), Some(LabEvent::Begin(3)));
        assert_eq!(c.take(), None);
        c.write(0, &[0, 1, 2, 0]);
        assert_eq!(c.take(), Some(LabEvent::End(256)));
        c.write(0, &[1, 0, 9, 0]);
        assert_eq!(c.take(), None, "unknown op");
        c.write(0, &[1, 0]);
        c.write(2, &[1, 0, 1, 0]);
        assert_eq!(c.take(), None, "wrong size or offset");
    }
}
