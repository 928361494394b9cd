//! PCI: bus 0 behind a host bridge, reached by configuration mechanism #1 (0xCF8/0xCFC)
//! and by ECAM, whose window can be backed by read-only memory so reads never exit.

pub mod cf8;
pub mod config;
pub mod ecam;
pub mod ecam_device;
pub mod edu;
pub mod iommu;
pub mod msix;
pub mod root;
pub mod testdev;

pub use config::{BarKind, BarSpec, ConfigSpace, PciIds};
pub use root::{ConfigHook, EcamMode, PciError, PciFunction, PciRoot};

/// Functions on bus 0: 32 devices of 8 functions.
pub const FUNCTIONS: usize = 256;

/// Our vendor ID for the VMM's own devices (not a PCI-SIG assignment: a private lab).
pub const VENDOR_EXITLESS: u16 = 0xe1e5;

/// The host bridge at 00:00.0.
pub fn host_bridge() -> PciFunction {
    let mut config = ConfigSpace::new(PciIds::exitless(0x0001, [0x06, 0x00, 0x00]));
    let _ = config.add_capability(0x09, &[4, 0x01]); // vendor-specific: length, version
    PciFunction::new("host-bridge", config)
}

#[cfg(test)]
mod tests;
