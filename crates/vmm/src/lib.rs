//! exitless: a KVM virtual machine monitor whose guest I/O avoids heavyweight exits.
//!
//! How an exit travels: [`vcpu::Vcpu::step`] (the only match on exit reasons) ->
//! [`bus::Bus::lookup`] -> [`bus::BusDevice`]. See docs/architecture.md.

pub mod acpi;
pub mod boot;
pub mod bus;
pub mod console;
pub mod cpu_template;
pub mod device_manager;
pub mod devices;
pub mod files;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod guest_memory;
pub mod heap;
pub mod host;
pub mod ioeventfd;
pub mod irq;
pub mod kvm;
pub mod landlock;
pub mod layout;
pub mod machine;
pub mod memslots;
pub mod net;
pub mod pci;
pub mod persist;
pub mod poll;
pub mod rate_limiter;
pub mod run_control;
pub mod seccomp;
pub mod snapshot;
pub mod stats;
pub mod sync;
pub mod termination;
/// Stand-ins for KVM: the unit tests' and the fuzz targets'.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
pub mod vcpu;
pub mod virtio;

pub use machine::{
    DeviceConfig, HugePages, Machine, MachineConfig, MachineError, MemoryHotplug, NetConfig, RunOptions, RunReport,
};
