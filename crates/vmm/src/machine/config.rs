//! What a machine is built from: the image, RAM and vCPUs, its devices, how it runs.

use crate::boot;
use crate::device_manager::Attach;
use crate::host::ProfileChoice;
use crate::ioeventfd::IoeventfdLimits;
use crate::pci::EcamMode;
use std::io::{Read, Write};
use std::time::Duration;

/// What to boot and how.
pub struct MachineConfig {
    /// An ELF image (PVH note or 64-bit entry) or a bzImage.
    pub image: std::borrow::Cow<'static, [u8]>,
    pub mem_size: u64,
    pub vcpus: u8,
    /// Two vCPUs per core in the CPUID topology (Firecracker's `smt`).
    pub smt: bool,
    pub cmdline: String,
    pub initrd: Option<Vec<u8>>,
    /// Parameters for the payload, in the shared page's parameter slots.
    pub params: Vec<u64>,
    pub devices: DeviceConfig,
    pub run: RunOptions,
    /// Which host workarounds to install (`--host-profile`).
    pub host: ProfileChoice,
    /// Resume a snapshot instead of booting `image` (crate::snapshot).
    pub restore: Option<crate::snapshot::Restore>,
    /// KVM logs the pages the guest writes, for Diff snapshots.
    pub track_dirty_pages: bool,
    /// How guest RAM is backed (Firecracker's `machine-config.huge_pages`).
    pub huge_pages: HugePages,
    /// Guest RAM in a memfd mapped shared, which a vhost-user backend maps too (set when
    /// one is configured: virtio-fs).
    pub shared_memory: bool,
    /// Keep a booted guest's RAM in an unlinked file in this directory (a tmpfs, such as
    /// /dev/shm), mapped shared, so that a Full snapshot on the same filesystem takes the
    /// file instead of writing it (snapshot/fork.rs; exitless's `--ram-dir`).
    pub ram_dir: Option<std::path::PathBuf>,
    /// Hotpluggable memory, a virtio-mem device's (Firecracker's `/hotplug/memory`).
    pub memory_hotplug: Option<MemoryHotplug>,
    /// The CPU template the vCPUs' CPUID and MSRs go through (Firecracker's
    /// `cpu_template` and `/cpu-config`); a restore takes its snapshot's.
    pub cpu_template: Option<crate::cpu_template::CpuTemplate>,
}

/// Firecracker's `/hotplug/memory`, in MiB: the region's size, the driver's block and the
/// host's slot (one KVM memory slot each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryHotplug {
    pub total_size_mib: u64,
    pub block_size_mib: u64,
    pub slot_size_mib: u64,
}

impl MemoryHotplug {
    /// Firecracker v1.16.1's rules and words (`MemoryHotplugConfig::validate`).
    pub fn validate(&self) -> Result<(), String> {
        use crate::virtio::mem::{DEFAULT_BLOCK_SIZE_MIB, DEFAULT_SLOT_SIZE_MIB};
        let (total, block, slot) = (self.total_size_mib, self.block_size_mib, self.slot_size_mib);
        let refused = match () {
            _ if block < DEFAULT_BLOCK_SIZE_MIB => {
                format!("Block size must not be lower than {DEFAULT_BLOCK_SIZE_MIB} MiB")
            }
            _ if !block.is_power_of_two() => "Block size must be a power of 2".into(),
            _ if slot < DEFAULT_SLOT_SIZE_MIB => {
                format!("Slot size must not be lower than {DEFAULT_SLOT_SIZE_MIB} MiB")
            }
            _ if !slot.is_multiple_of(block) => format!("Slot size must be a multiple of block size ({block} MiB)"),
            _ if total < slot => format!("Total size must not be lower than slot size ({slot} MiB)"),
            _ if !total.is_multiple_of(slot) => format!("Total size must be a multiple of slot size ({slot} MiB)"),
            _ => return Ok(()),
        };
        Err(refused)
    }
}

/// Guest RAM's pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HugePages {
    /// Anonymous memory, transparent huge pages where the host gives them.
    #[default]
    None,
    /// 2 MiB hugetlbfs pages (Firecracker's "2M"), from the pool the host reserved
    /// (/proc/sys/vm/nr_hugepages), all of them taken at the start.
    Hugetlbfs2M,
}

/// The devices a machine starts with (the lab and tests attach more through
/// [`Machine::devices_mut`] before it runs).
pub struct DeviceConfig {
    /// Where the serial console's output goes.
    pub serial_out: Box<dyn Write + Send>,
    /// What the guest reads from the serial console, if anything.
    pub serial_in: Option<Box<dyn Read + Send>>,
    pub ioeventfd_limits: IoeventfdLimits,
    /// How the ECAM window is served.
    pub ecam: EcamMode,
    /// How virtio-mmio register windows are served.
    pub mmio_registers: crate::virtio::mmio::RegisterMode,
    /// Whether 0xCF8/0xCFC config access exists. Without it Linux's type-1 probe fails and
    /// it reads all of config space through ECAM (MCFG), as crosvm's
    /// `--break-linux-pci-config-io` arranges.
    pub pci_config_io: bool,
    /// The transport virtio devices are attached over (PCI unless asked).
    pub transport: crate::device_manager::TransportKind,
    /// Firecracker's boot-timer device (`--boot-timer`): logs the time until the guest
    /// writes 123 to it.
    pub boot_timer: bool,
    /// QEMU's test devices, for kvm-unit-tests: fw_cfg, pc-testdev and pci-testdev; a CMOS
    /// RTC and ACPI S3.
    pub test_devices: bool,
    /// With `test_devices`: QEMU's edu device behind a VT-d model (`--testdev-iommu`), for
    /// kvm-unit-tests' `intel_iommu`.
    pub test_iommu: bool,
    /// Devices at places their guest knows (the lab's doorbell at 00:01.0), attached
    /// before any device whose place is allocated so that nothing takes their place.
    pub fixed: Vec<AttachFixed>,
    /// The devices whose place the allocators choose, in order, each made by its own
    /// module from its configuration (`virtio::net::attach(config, poll)`,
    /// `virtio::blk::attach`, ...): the machine knows none of them by name.
    pub allocated: Vec<Attach>,
}

/// Attaches a device at a fixed place (see [`DeviceConfig::fixed`]).
pub type AttachFixed = Attach;

/// How a run is watched.
#[derive(Default)]
pub struct RunOptions {
    /// Whether [`Machine::run`] confines its calling thread too (seccomp, `ThreadKind::Main`)
    /// once the vCPUs run: the CLI's main thread, not a library caller's.
    pub confine_caller: bool,
    /// How often to sample where each vCPU is in the guest (`--sample-guest`), if at all.
    pub sample_every: Option<Duration>,
    /// End the run as stuck once no vCPU made progress for this long (`--stuck-after`,
    /// crate::vcpu::stuck); needs `sample_every`.
    pub stuck_after: Option<Duration>,
}

impl MachineConfig {
    /// `image` with 128 MiB, one vCPU, the default command line, no parameters, serial
    /// output dropped, default limits, the host profile probed.
    pub fn new(image: impl Into<std::borrow::Cow<'static, [u8]>>) -> Self {
        MachineConfig {
            image: image.into(),
            mem_size: 128 << 20,
            vcpus: 1,
            smt: false,
            cmdline: boot::DEFAULT_CMDLINE.into(),
            initrd: None,
            params: Vec::new(),
            devices: DeviceConfig::default(),
            run: RunOptions::default(),
            host: ProfileChoice::Auto,
            restore: None,
            track_dirty_pages: false,
            huge_pages: HugePages::None,
            shared_memory: false,
            ram_dir: None,
            memory_hotplug: None,
            cpu_template: None,
        }
    }
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            serial_out: Box::new(std::io::sink()),
            serial_in: None,
            ioeventfd_limits: IoeventfdLimits::default(),
            ecam: EcamMode::Mapped,
            mmio_registers: Default::default(),
            pci_config_io: true,
            transport: Default::default(),
            boot_timer: false,
            test_devices: false,
            test_iommu: false,
            fixed: Vec::new(),
            allocated: Vec::new(),
        }
    }
}
