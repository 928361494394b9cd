//! Typed bus addresses, so a port number can never be looked up on the MMIO bus.

use std::fmt::Debug;

/// An address in one of the two x86 address spaces.
pub trait BusAddress: Copy + Debug + Send + Sync + 'static {
    /// The highest address in the space.
    const MAX: u64;
    fn raw(self) -> u64;
}

/// A port number (16 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PioAddress(pub u16);

/// A guest-physical MMIO address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MmioAddress(pub u64);

impl BusAddress for PioAddress {
    const MAX: u64 = u16::MAX as u64;
    fn raw(self) -> u64 {
        u64::from(self.0)
    }
}

impl BusAddress for MmioAddress {
    const MAX: u64 = u64::MAX;
    fn raw(self) -> u64 {
        self.0
    }
}
