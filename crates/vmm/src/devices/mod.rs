//! Devices that sit on the buses: the PC platform a guest expects (`legacy`), and the
//! devices QEMU offers its test suites (`qemu_test`, plugged in by `--testdevs` only).
//! The lab's own devices live in the lab crate; PCI and virtio devices under `pci` and
//! `virtio`.

pub mod doorbell;
pub mod idle;
pub mod legacy;
pub mod qemu_test;

pub use doorbell::Doorbell;
pub use legacy::{AcpiPm, DebugExit, Serial, I8042};
