//! Devices of QEMU's PC machine that kvm-unit-tests looks for (`--testdevs`): fw_cfg for
//! the CPU count and RAM size, pc-testdev's ports and its IRQ lines.

pub mod attach;
pub mod fw_cfg;
pub mod pc_testdev;
