//! Devices that sit on the buses: the PC platform a guest expects (`legacy`), and the
//! devices QEMU offers its test suites (`qemu_test`, attached by `--testdevs` only).
//! The lab's own devices live in the lab crate; PCI and virtio devices under `pci` and
//! `virtio`; the device manager attaches them all.

pub mod legacy;
pub mod qemu_test;
