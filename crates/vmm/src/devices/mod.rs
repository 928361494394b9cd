//! Devices that sit on the buses: the PC platform a guest expects (`legacy`), and the
//! devices QEMU offers its test suites (`qemu_test`, attached by `--testdevs` only); and
//! those the guest finds in its ACPI tables alone (`acpi`: VMGenID).
//! The lab's own devices live in the lab crate; PCI and virtio devices under `pci` and
//! `virtio`; the device manager attaches them all.

pub mod acpi;
pub mod legacy;
pub mod qemu_test;
