//! A machine: KVM VM, guest memory, buses with their devices, and vCPUs.

use crate::allocators::{AllocError, Allocators};
use crate::boot::{self, cpu, regs, BootSpec, EntryPoint};
use crate::bus::{BusDevice, BusError, BusSet, DeviceId, MmioAddress, PioAddress, SharedBuses};
use crate::devices::legacy::{debug_exit, i8042, serial};
use crate::devices::{doorbell, AcpiPm, DebugExit, Doorbell, Serial, I8042};
use crate::ioeventfd::{IoeventfdLimits, IoeventfdRegistry};
use crate::irq::{GsiRouter, IrqError};
use crate::layout::{self, LayoutError, MemoryMap};
use crate::net::Tap;
use crate::pci::cf8::{Cf8Device, CF8_LEN, CF8_PORT};
use crate::pci::ecam::{EcamDevice, EcamShadow, ECAM_SIZE};
use crate::pci::msix::Msix;
use crate::pci::testdev::PciTestdev;
use crate::pci::{EcamMode, PciError, PciRoot};
use crate::stats::{ExitStats, LiveStats};
use crate::vcpu::control::{GuestStop, RunControl};
use crate::vcpu::samples::GuestSamples;
use crate::vcpu::{cycles, Vcpu, VcpuError};
use crate::virtio::blk::{BlkCounters, BlkStats, DriveConfig, VirtioBlk};
use crate::virtio::net::{NetCounters, NetStats, TxMode, VirtioNet};
use crate::virtio::pci::VirtioPci;
use crate::virtio::{self, VirtioDevice};
use crate::{acpi, kvm};
use exitless_payloads::abi;
use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VmFd};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

/// At most this many vCPUs (APIC IDs and MADT processor IDs are bytes; 0xff is broadcast).
pub const MAX_VCPUS: u8 = 254;

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error(transparent)]
    Kvm(#[from] kvm::KvmError),
    #[error("{what} failed: {source}")]
    Ioctl { what: &'static str, source: kvm_ioctls::Error },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("--vcpus {asked}: give between 1 and {max} (what KVM allows here)")]
    Vcpus { asked: u8, max: u8 },
    #[error("cannot set up guest memory")]
    Memory(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error(transparent)]
    Load(#[from] boot::LoadError),
    #[error(transparent)]
    Acpi(#[from] acpi::AcpiError),
    #[error(transparent)]
    Regs(#[from] regs::RegsError),
    #[error(transparent)]
    Cpu(#[from] cpu::CpuError),
    #[error("cannot place device {name}: {source}")]
    Bus { name: String, source: BusError },
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error(transparent)]
    Pci(#[from] PciError),
    #[error(transparent)]
    Tap(#[from] crate::net::tap::TapError),
    #[error(transparent)]
    Drive(#[from] crate::virtio::blk::DiskError),
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(transparent)]
    Irq(#[from] IrqError),
    #[error("cannot set up device {name}")]
    Device {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up the serial port")]
    Serial(#[source] std::io::Error),
    #[error("the guest did not finish within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
    #[error("a vCPU thread died: {0}")]
    VcpuThread(String),
    #[error("the machine has no drive {0}")]
    NoDrive(usize),
    #[error("the machine has no network interface {0}")]
    NoNic(usize),
}

fn ioctl(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> MachineError {
    move |source| MachineError::Ioctl { what, source }
}

/// What to boot and how.
pub struct MachineConfig {
    /// An ELF image (PVH note or 64-bit entry) or a bzImage.
    pub image: std::borrow::Cow<'static, [u8]>,
    pub mem_size: u64,
    pub vcpus: u8,
    pub cmdline: String,
    pub initrd: Option<Vec<u8>>,
    /// Parameters for the payload, in the shared page's parameter slots.
    pub params: Vec<u64>,
    /// Where the serial console's output goes.
    pub serial_out: Box<dyn Write + Send>,
    /// What the guest reads from the serial console, if anything.
    pub serial_in: Option<Box<dyn Read + Send>>,
    pub ioeventfd_limits: IoeventfdLimits,
    /// How the ECAM window is served.
    pub ecam: EcamMode,
    /// Whether 0xCF8/0xCFC config access exists. Without it Linux's type-1 probe fails and
    /// it reads all of config space through ECAM (MCFG), as crosvm's
    /// `--break-linux-pci-config-io` arranges.
    pub pci_config_io: bool,
    /// virtio-net devices, one per tap, in order.
    pub nets: Vec<NetConfig>,
    /// Two vCPUs per core in the CPUID topology (Firecracker's `smt`).
    pub smt: bool,
    /// Firecracker's boot-timer device (`--boot-timer`): logs the time until the guest
    /// writes 123 to it.
    pub boot_timer: bool,
    /// virtio-blk devices, one per drive, in order.
    pub drives: Vec<DriveConfig>,
    /// The lab's devices: the doorbell (00:01.0) and the idle port. Off unless a lab or
    /// `--lab` asks for them.
    pub lab_devices: bool,
    /// QEMU's test devices, for kvm-unit-tests: fw_cfg, pc-testdev and pci-testdev; a CMOS
    /// RTC and ACPI S3.
    pub test_devices: bool,
    /// With `test_devices`: QEMU's edu device behind a VT-d model (`--testdev-iommu`), for
    /// kvm-unit-tests' `intel_iommu`.
    pub test_iommu: bool,
    /// Whether [`Machine::run`] confines its calling thread too (seccomp, `ThreadKind::Main`)
    /// once the vCPUs run: the CLI's main thread, not a library caller's.
    pub confine_caller: bool,
    /// How often to sample where each vCPU is in the guest (`--sample-guest`), if at all.
    pub sample_every: Option<Duration>,
    /// End the run as stuck once no vCPU made progress for this long (`--stuck-after`,
    /// crate::vcpu::stuck); needs `sample_every`.
    pub stuck_after: Option<Duration>,
    /// How long device threads poll for work before they sleep (`--poll-us`, crate::poll).
    pub poll: crate::poll::PollMode,
}

/// `--net tap=NAME[,mac=..]` and `--net-tx`.
#[derive(Clone, Debug)]
pub struct NetConfig {
    pub tap: String,
    pub mac: [u8; 6],
    pub tx: TxMode,
    /// An MTU advised to the guest (VIRTIO_NET_F_MTU), if any.
    pub mtu: Option<u16>,
    /// Rate limits on received and sent frames.
    pub rx_limits: crate::rate_limiter::Limits,
    pub tx_limits: crate::rate_limiter::Limits,
}

/// A virtio-blk device of a machine, for the lab and the report.
pub struct DriveHandle {
    pub name: String,
    pub stats: Arc<BlkStats>,
    pub transport: Arc<VirtioPci>,
    /// The backing file, swapped by [`Machine::update_drive`].
    pub disk: Arc<crate::virtio::blk::DiskSlot>,
    /// The rate limits, changed by [`Machine::set_drive_limits`].
    pub limits: Arc<crate::rate_limiter::LimiterSlot>,
}

/// A virtio-net device of a machine, for the lab and the report.
pub struct NetHandle {
    pub stats: Arc<NetStats>,
    pub transport: Arc<VirtioPci>,
    pub tap_name: String,
    /// The RX and TX rate limits, changed by [`Machine::set_net_limits`].
    pub limits: [Arc<crate::rate_limiter::LimiterSlot>; 2],
}

impl MachineConfig {
    /// `image` with 128 MiB, one vCPU, the default command line, no parameters, serial
    /// output dropped, default limits.
    pub fn new(image: impl Into<std::borrow::Cow<'static, [u8]>>) -> Self {
        MachineConfig {
            image: image.into(),
            mem_size: 128 << 20,
            vcpus: 1,
            cmdline: boot::DEFAULT_CMDLINE.into(),
            initrd: None,
            params: Vec::new(),
            serial_out: Box::new(std::io::sink()),
            serial_in: None,
            ioeventfd_limits: IoeventfdLimits::default(),
            ecam: EcamMode::Mapped,
            pci_config_io: true,
            nets: Vec::new(),
            smt: false,
            boot_timer: false,
            drives: Vec::new(),
            lab_devices: false,
            test_devices: false,
            test_iommu: false,
            confine_caller: false,
            sample_every: None,
            stuck_after: None,
            poll: crate::poll::PollMode::Adaptive,
        }
    }
}

/// The VMM's own memory: the process's, less the guest RAM mapping's.
#[derive(Clone, Copy, Debug, Default)]
pub struct VmmMemory {
    /// Resident (Firecracker's measure): shared code and libraries counted whole.
    pub rss_kib: u64,
    /// Proportional: pages shared with other processes (the same binary in a fleet) divided
    /// among them, so what one more microVM costs.
    pub pss_kib: u64,
}

/// The result of a run.
pub struct RunReport {
    pub exit_status: u32,
    /// How the guest ended, if it did.
    pub stop: Option<GuestStop>,
    /// Every vCPU's counters added up.
    pub stats: ExitStats,
    /// Each vCPU's own counters, by vCPU id.
    pub vcpus: Vec<ExitStats>,
    /// Device names, indexed by [`DeviceId`].
    pub devices: Vec<String>,
    pub elapsed: Duration,
    /// Host TSC ticks per second, measured over the run (to turn cycles into time).
    pub tsc_hz: f64,
    /// Memory of the VMM process beyond guest RAM.
    pub vmm_memory: Option<VmmMemory>,
    /// Each virtio-net device's tap name and counters.
    pub nets: Vec<(String, NetCounters)>,
    /// Each drive's name and virtio-blk counters.
    pub drives: Vec<(String, BlkCounters)>,
    /// Each vCPU's guest RIP samples, by vCPU id (empty unless sampling was asked for).
    pub samples: Vec<GuestSamples>,
}

pub struct Machine {
    kvm: Kvm,
    pub map: MemoryMap,
    vcpu_count: u8,
    /// vCPUs per core in the CPUID topology: 1, or 2 with SMT.
    threads_per_core: u8,
    supported_cpuid: CpuId,
    pub vm: Arc<VmFd>,
    pub memory: GuestMemoryMmap,
    pub control: Arc<RunControl>,
    pub buses: Arc<SharedBuses>,
    pub ioeventfds: Arc<IoeventfdRegistry>,
    pub pci: Arc<PciRoot>,
    /// PCI slots and BAR space for the devices still to come.
    pub allocators: Allocators,
    /// The doorbell, PCI function 00:01.0 when the lab devices are plugged in.
    pub doorbell: Arc<Doorbell>,
    pub gsi_router: Arc<GsiRouter>,
    /// virtio-net devices, one per tap.
    pub nets: Vec<NetHandle>,
    /// virtio-blk devices, one per drive.
    pub drives: Vec<DriveHandle>,
    /// COM1, whose queued output is drained before a run returns.
    serial: Option<Arc<Serial>>,
    /// The PS/2 controller, through which the API sends Ctrl-Alt-Del.
    i8042: Option<Arc<I8042>>,
    devices: Vec<String>,
    confine_caller: bool,
    sample_every: Option<Duration>,
    stuck_after: Option<Duration>,
    /// ACPI S3 with its RTC wake, where offered (`--testdevs`).
    sleep: Option<Arc<crate::vcpu::sleep::Sleep>>,
    entry: EntryPoint,
    started: (Instant, u64),
    /// Each vCPU's counters while the VM runs (for the API's live exit profile).
    pub live: Arc<LiveStats>,
}

impl Machine {
    /// Creates the VM, loads the image and plugs in the serial port and debug-exit port.
    pub fn new(config: MachineConfig) -> Result<Machine, MachineError> {
        let started = (Instant::now(), cycles());
        let map = MemoryMap::new(config.mem_size)?;
        let kvm = kvm::open()?;
        let max_vcpus = kvm.get_max_vcpus().min(usize::from(MAX_VCPUS)) as u8;
        if !(1..=max_vcpus).contains(&config.vcpus) {
            return Err(MachineError::Vcpus { asked: config.vcpus, max: max_vcpus });
        }
        let supported_cpuid =
            kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(ioctl("KVM_GET_SUPPORTED_CPUID"))?;
        let vm = kvm.create_vm().map_err(ioctl("KVM_CREATE_VM"))?;
        vm.set_tss_address(layout::TSS_GPA as usize).map_err(ioctl("KVM_SET_TSS_ADDR"))?;
        vm.create_irq_chip().map_err(ioctl("KVM_CREATE_IRQCHIP"))?;
        if let Err(e) = crate::host::emulate::syscall::trap_lstar_writes(&vm) {
            tracing::debug!("no watch on the guest's system-call entry (MSR filter): {e}");
        }
        let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
        vm.create_pit2(pit).map_err(ioctl("KVM_CREATE_PIT2"))?;

        let regions: Vec<_> =
            map.ram_regions().iter().map(|&(start, size)| (GuestAddress(start), size as usize)).collect();
        let memory = GuestMemoryMmap::<()>::from_ranges(&regions).map_err(|e| MachineError::Memory(e.into()))?;
        for (slot, region) in memory.iter().enumerate() {
            let host = memory.get_host_address(region.start_addr()).map_err(|e| MachineError::Memory(e.into()))?;
            // Transparent huge pages where the host offers them: fewer TLB misses for the
            // guest and for every copy to or from guest buffers. Only advice: ignore failure.
            // SAFETY: the range is exactly this region's mapping, owned by `memory`.
            unsafe { libc::madvise(host.cast(), region.len() as usize, libc::MADV_HUGEPAGE) };
            let mapping = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: region.start_addr().0,
                memory_size: region.len(),
                userspace_addr: host as u64,
            };
            // SAFETY: the mapping belongs to `memory`, which the Machine keeps alive as long as the VM.
            unsafe { vm.set_user_memory_region(mapping) }.map_err(ioctl("KVM_SET_USER_MEMORY_REGION"))?;
        }

        let tables = acpi::write_tables(&memory, &map, config.vcpus)?;
        let spec = BootSpec { cmdline: &config.cmdline, initrd: config.initrd.as_deref(), rsdp: tables.rsdp };
        // Before the image: a multiboot image may be linked over it (and then owns the page).
        write_shared_page(&memory, map.low_ram_end(), &config.params)?;
        let entry = boot::load(&memory, &map, &config.image, &spec)?;
        if let EntryPoint::Multiboot(_) = entry {
            boot::bios_state::program_pic_and_pit(&vm).map_err(ioctl("KVM_SET_IRQCHIP/KVM_SET_PIT2"))?;
        }

        let control = Arc::new(RunControl::default());
        let vm = Arc::new(vm);
        let buses = Arc::new(SharedBuses::new(BusSet::default()));
        let ioeventfds = Arc::new(IoeventfdRegistry::new(vm.clone(), config.ioeventfd_limits));
        let gsi_router = Arc::new(GsiRouter::new(vm.clone()));
        let shadow =
            EcamShadow::new(vm.clone(), layout::ECAM_GPA, layout::ECAM_FIRST_SLOT).map_err(PciError::Shadow)?;
        let pci = Arc::new(PciRoot::new(buses.clone(), ioeventfds.clone(), shadow, config.ecam, map.pci_windows())?);
        let mut machine = Machine {
            kvm,
            map,
            vcpu_count: config.vcpus,
            threads_per_core: if config.smt { 2 } else { 1 },
            supported_cpuid,
            ioeventfds,
            vm,
            memory,
            control: control.clone(),
            buses,
            pci: pci.clone(),
            allocators: Allocators::new(&map.pci_windows())?,
            doorbell: Arc::new(Doorbell::default()),
            gsi_router,
            nets: Vec::new(),
            drives: Vec::new(),
            serial: None,
            i8042: None,
            devices: Vec::new(),
            confine_caller: config.confine_caller,
            sample_every: config.sample_every,
            stuck_after: config.stuck_after,
            sleep: None,
            entry,
            started,
            live: Arc::new(LiveStats::new(usize::from(config.vcpus), 0)),
        };
        let serial_irq = EventFd::new(libc::EFD_NONBLOCK).map_err(MachineError::Serial)?;
        machine.vm.register_irqfd(&serial_irq, layout::COM1_IRQ).map_err(ioctl("KVM_IRQFD (COM1)"))?;
        let irq = serial::IrqLine::new(Some(serial_irq), Some(machine.gsi_router.clone()));
        let serial = Arc::new(Serial::new(config.serial_out, irq).map_err(MachineError::Serial)?);
        machine.serial = Some(serial.clone());
        if let Some(input) = config.serial_in {
            serial.spawn_input(input).map_err(MachineError::Serial)?;
        }
        machine.add_pio_device("serial", layout::COM1_PORT, serial::SERIAL_LEN, serial)?;
        let debug_exit = Arc::new(DebugExit::new(control.clone()));
        machine.add_pio_device("debug-exit", abi::DEBUG_EXIT_PORT as u16, debug_exit::DEBUG_EXIT_LEN, debug_exit)?;
        let keyboard_irq =
            EventFd::new(libc::EFD_NONBLOCK).map_err(|source| MachineError::Device { name: "i8042".into(), source })?;
        machine.vm.register_irqfd(&keyboard_irq, layout::I8042_IRQ).map_err(ioctl("KVM_IRQFD (i8042)"))?;
        let i8042 = Arc::new(I8042::new(control.clone(), Some(keyboard_irq)));
        machine.i8042 = Some(i8042.clone());
        machine.add_pio_device("i8042", layout::I8042_DATA_PORT, i8042::I8042_LEN, i8042)?;
        let pm = Arc::new(AcpiPm::new(control, config.test_devices));
        machine.add_pio_device("acpi-pm", layout::ACPI_PM_PORT, layout::ACPI_PM_LEN, pm.clone())?;
        if config.test_devices {
            use crate::devices::legacy::cmos_rtc::{CmosRtc, RTC_LEN, RTC_PORT};
            let rtc = Arc::new(CmosRtc::default());
            machine.add_pio_device("cmos-rtc", RTC_PORT, RTC_LEN, rtc.clone())?;
            let memory = machine.memory.clone();
            machine.sleep = Some(Arc::new(crate::vcpu::sleep::Sleep::new(pm, rtc, tables.facs, memory)));
        }
        if config.pci_config_io {
            machine.add_pio_device("pci-cf8", CF8_PORT, CF8_LEN, Arc::new(Cf8Device::new(pci.clone())))?;
        }
        machine.add_mmio_device("pci-ecam", layout::ECAM_GPA, ECAM_SIZE, Arc::new(EcamDevice::new(pci.clone())))?;
        pci.add(0, 0, crate::pci::host_bridge())?;
        if config.lab_devices {
            machine.add_lab_devices()?;
        }
        if config.test_devices {
            machine.add_test_devices(config.mem_size, config.vcpus)?;
            if config.test_iommu {
                machine.add_edu_behind_iommu()?;
            }
        }
        if config.boot_timer {
            machine.add_boot_timer()?;
        }
        for net in &config.nets {
            machine.add_virtio_net(net, config.poll)?;
        }
        for drive in &config.drives {
            machine.add_virtio_blk(drive, config.poll)?;
        }
        Ok(machine)
    }

    /// The lab's own devices, where the lab payloads expect them: the idle port and the
    /// doorbell at 00:01.0 with its BARs at the ABI's addresses (taken from the allocators,
    /// so nothing else lands there).
    fn add_lab_devices(&mut self) -> Result<(), MachineError> {
        let idle = Arc::new(crate::devices::idle::Idle::new(self.gsi_router.clone()));
        self.add_pio_device("idle", abi::IDLE_PORT as u16, crate::devices::idle::IDLE_LEN, idle)?;
        let slot = abi::DOORBELL_PCI_DEVICE as u8;
        self.allocators.reserve_slot(slot)?;
        self.allocators.reserve_bar(doorbell::MMIO_BAR, abi::DOORBELL_MMIO_GPA)?;
        self.allocators.reserve_bar(doorbell::PIO_BAR, abi::DOORBELL_PIO_PORT)?;
        let mmio = (self.register_device("doorbell-mmio"), abi::DOORBELL_MMIO_GPA);
        let pio = (self.register_device("doorbell-pio"), abi::DOORBELL_PIO_PORT);
        self.pci.add(slot, 0, doorbell::pci_function(self.doorbell.clone(), mmio, pio))?;
        Ok(())
    }

    /// The devices kvm-unit-tests finds on QEMU's PC machine, where it looks for them.
    fn add_test_devices(&mut self, mem_size: u64, vcpus: u8) -> Result<(), MachineError> {
        use crate::devices::qemu_test::{fw_cfg, pc_testdev};
        let cfg = Arc::new(fw_cfg::FwCfg::new(mem_size, vcpus));
        self.add_pio_device("fw-cfg", fw_cfg::FW_CFG_PORT, fw_cfg::FW_CFG_LEN, cfg)?;
        let ports = Arc::new(pc_testdev::PcTestdevPorts::default());
        self.add_pio_device("pc-testdev", pc_testdev::SCRATCH_PORT, pc_testdev::PORTS_LEN, ports)?;
        let irq = Arc::new(pc_testdev::PcTestdevIrq(self.vm.clone()));
        self.add_pio_device("pc-testdev-irq", pc_testdev::IRQ_PORT, pc_testdev::IRQ_LINES, irq)?;
        let iomem = Arc::new(pc_testdev::PcTestdevIomem::default());
        self.add_mmio_device("pc-testdev-iomem", layout::PC_TESTDEV_IOMEM_GPA, pc_testdev::IOMEM_LEN, iomem)?;
        let testdev = PciTestdev::new();
        let slot = self.allocators.slot()?;
        let (mem, io) = (self.allocators.bar(PciTestdev::MEM_BAR)?, self.allocators.bar(PciTestdev::IO_BAR)?);
        let ids = (self.register_device("pci-testdev-mem"), self.register_device("pci-testdev-io"));
        self.pci.add(slot, 0, testdev.pci_function(ids, mem, io))?;
        testdev.attach(&self.pci, usize::from(slot) << 3);
        Ok(())
    }

    /// QEMU's edu device and the VT-d model that translates its DMA and remaps its
    /// interrupts, where kvm-unit-tests' `intel_iommu` looks for them.
    fn add_edu_behind_iommu(&mut self) -> Result<(), MachineError> {
        use crate::pci::{edu, iommu};
        let unit = Arc::new(iommu::IntelIommu::new(self.memory.clone()));
        self.add_mmio_device("intel-iommu", layout::IOMMU_GPA, iommu::IOMMU_LEN, unit.clone())?;
        let (slot, pin, bar) = (self.allocators.slot()?, self.allocators.intx_pin()?, self.allocators.bar(edu::BAR)?);
        let device = edu::Edu::new(self.memory.clone(), unit, self.vm.clone(), self.gsi_router.clone(), slot, pin)
            .map_err(|e| MachineError::Device { name: "edu".into(), source: std::io::Error::other(e) })?;
        let id = self.register_device("edu");
        self.pci.add(slot, 0, device.pci_function(id, bar))?;
        Ok(())
    }

    /// Plugs a virtio device in: a free PCI slot, BAR0 from the 32-bit window, one MSI-X
    /// vector per queue plus one for config changes, every queue's notify address an
    /// ioeventfd wherever the guest puts BAR0.
    pub fn add_virtio(&mut self, name: &str, device: Box<dyn VirtioDevice>) -> Result<Arc<VirtioPci>, MachineError> {
        let vectors = device.queue_max_sizes().len() + 1;
        let msix = Msix::new(self.gsi_router.clone(), vectors)?;
        let device_error = |source| MachineError::Device { name: name.into(), source };
        let transport = Arc::new(VirtioPci::new(device, self.memory.clone(), msix).map_err(device_error)?);
        let slot = self.allocators.slot()?;
        let bar0 = self.allocators.bar(virtio::pci::BAR0)?;
        let id = self.register_device(name);
        tracing::debug!("{name}: PCI 00:{slot:02x}.0, BAR0 at {bar0:#x}, {vectors} MSI-X vectors");
        self.pci.add(slot, 0, transport.pci_function(name, id, bar0).map_err(device_error)?)?;
        Ok(transport)
    }

    fn add_virtio_net(&mut self, net: &NetConfig, poll: crate::poll::PollMode) -> Result<(), MachineError> {
        let tap = Tap::open(&net.tap)?;
        let tap_name = tap.name().to_string();
        let device =
            VirtioNet::new(tap, net.mac, net.tx, poll).with_mtu(net.mtu).with_limits(net.rx_limits, net.tx_limits);
        let (stats, limits) = (device.stats.clone(), device.limiter_slots());
        let name = match self.nets.len() {
            0 => "virtio-net".to_string(),
            n => format!("virtio-net{n}"),
        };
        let transport = self.add_virtio(&name, Box::new(device))?;
        self.nets.push(NetHandle { stats, transport, tap_name, limits });
        Ok(())
    }

    /// The first virtio-net device, which the labs use.
    pub fn net(&self) -> Option<&NetHandle> {
        self.nets.first()
    }

    /// Firecracker's boot-timer device, at the address Firecracker gives it (the first
    /// page of the 32-bit PCI window, taken from the BAR allocator).
    fn add_boot_timer(&mut self) -> Result<(), MachineError> {
        use crate::devices::legacy::boot_timer::{BootTimer, BOOT_TIMER_GPA, BOOT_TIMER_LEN};
        let page = crate::pci::BarSpec { kind: crate::pci::BarKind::Memory32, size: BOOT_TIMER_LEN };
        self.allocators.reserve_bar(page, BOOT_TIMER_GPA)?;
        let timer = Arc::new(BootTimer::new(self.started.0));
        self.add_mmio_device("boot-timer", BOOT_TIMER_GPA, BOOT_TIMER_LEN, timer).map(|_| ())
    }

    fn add_virtio_blk(&mut self, drive: &DriveConfig, poll: crate::poll::PollMode) -> Result<(), MachineError> {
        let device = VirtioBlk::new(drive, poll)?;
        let disk = device.disk();
        let name = format!("virtio-blk{}", self.drives.len());
        tracing::info!(
            "{name}: {} ({} bytes{}{}, {} engine)",
            drive.path.display(),
            disk.capacity,
            if disk.readonly { ", read-only" } else { "" },
            if disk.is_direct() { ", O_DIRECT" } else { "" },
            device.engine_name()
        );
        let (stats, disk, limits) = (device.stats.clone(), device.disk_slot(), device.limiter_slot());
        let transport = self.add_virtio(&name, Box::new(device))?;
        self.drives.push(DriveHandle { name, stats, transport, disk, limits });
        Ok(())
    }

    /// Names a device for statistics and returns its id.
    pub fn register_device(&mut self, name: &str) -> DeviceId {
        self.devices.push(name.to_string());
        DeviceId(self.devices.len() - 1)
    }

    pub fn add_pio_device(
        &mut self,
        name: &str,
        port: u16,
        len: u64,
        device: Arc<dyn BusDevice>,
    ) -> Result<DeviceId, MachineError> {
        self.allocators.reserve_ports(port, len)?;
        tracing::debug!("{name}: ports {port:#x}..{:#x}", u64::from(port) + len);
        self.add_device(name, |b, id| b.pio.insert(PioAddress(port), len, id, device))
    }

    pub fn add_mmio_device(
        &mut self,
        name: &str,
        addr: u64,
        len: u64,
        device: Arc<dyn BusDevice>,
    ) -> Result<DeviceId, MachineError> {
        tracing::debug!("{name}: MMIO {addr:#x}..{:#x}", addr + len);
        self.add_device(name, |b, id| b.mmio.insert(MmioAddress(addr), len, id, device))
    }

    /// Names the device and places it with `insert` on the current bus layout.
    fn add_device(
        &mut self,
        name: &str,
        insert: impl FnOnce(&mut BusSet, DeviceId) -> Result<(), BusError>,
    ) -> Result<DeviceId, MachineError> {
        let id = self.register_device(name);
        self.buses.update(|b| insert(b, id)).map_err(|source| MachineError::Bus { name: name.into(), source })?;
        Ok(id)
    }

    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    /// How many vCPUs the machine has.
    pub fn vcpu_count(&self) -> u8 {
        self.vcpu_count
    }

    /// Creates vCPU `id` with its CPUID, MSRs, FPU and LAPIC; vCPU 0 is put at the entry
    /// point, the others wait for the guest to start them (INIT/SIPI, in-kernel LAPIC).
    pub fn create_vcpu(&self, id: u8) -> Result<Vcpu, MachineError> {
        let fd = self.vm.create_vcpu(u64::from(id)).map_err(ioctl("KVM_CREATE_VCPU"))?;
        cpu::setup(&fd, &cpu::cpuid_for(&self.supported_cpuid, id, self.vcpu_count, self.threads_per_core))?;
        if id == 0 {
            regs::setup(&fd, &self.memory, self.entry)?;
        }
        let run_size = self.kvm.get_vcpu_mmap_size().map_err(ioctl("KVM_GET_VCPU_MMAP_SIZE"))?;
        let mut vcpu = Vcpu::new(
            id,
            fd,
            run_size,
            self.buses.clone(),
            self.devices.len(),
            self.control.clone(),
            self.memory.clone(),
        );
        vcpu.publish_to(self.live.clone());
        if let Some(sleep) = &self.sleep {
            vcpu.sleep_with(sleep.clone());
        }
        Ok(vcpu)
    }

    /// The exit profile so far, while the VM runs (each vCPU's last publication).
    pub fn live_report(&self) -> RunReport {
        let vcpus = self.live.snapshot();
        let mut stats = ExitStats::new(self.devices.len());
        for v in &vcpus {
            stats.merge(v);
        }
        self.report(stats, vcpus)
    }

    /// Runs every vCPU on a thread of its own until the guest stops, a vCPU fails, or
    /// `timeout` passes; then stops the others.
    pub fn run(self, timeout: Option<Duration>) -> Result<RunReport, MachineError> {
        match self.run_to_end(timeout)? {
            (_, Some(e)) => Err(e),
            (report, None) => Ok(report),
        }
    }

    /// Like [`Machine::run`], but a guest that crashed or timed out still yields its
    /// report (the exit profile is most wanted then) beside the error.
    pub fn run_to_end(self, timeout: Option<Duration>) -> Result<(RunReport, Option<MachineError>), MachineError> {
        self.run_shared(timeout)
    }

    /// [`Machine::run_to_end`] on a machine others hold too (the API reads its live
    /// profile meanwhile).
    pub fn run_shared(&self, timeout: Option<Duration>) -> Result<(RunReport, Option<MachineError>), MachineError> {
        let mut vcpus = (0..self.vcpu_count).map(|id| self.create_vcpu(id)).collect::<Result<Vec<_>, _>>()?;
        if let Some(after) = self.stuck_after {
            for (vcpu, watch) in vcpus.iter_mut().zip(crate::vcpu::stuck::watches(usize::from(self.vcpu_count), after))
            {
                vcpu.watch_for_stuck(watch);
            }
        }
        let threads = crate::vcpu::threads::VcpuThreads::spawn(vcpus, self.control.clone())
            .map_err(|e| MachineError::VcpuThread(e.to_string()))?;
        // From here the main thread only waits, reports and tears down.
        let confined = match self.confine_caller {
            true => crate::seccomp::confine(crate::seccomp::ThreadKind::Main),
            false => Ok(()),
        };
        let outcome = threads.wait(timeout, self.sample_every);
        self.drain_console();
        let mut stats = ExitStats::new(self.devices.len());
        for s in &outcome.stats {
            stats.merge(s);
        }
        let error = if let Err(e) = confined {
            Some(e.into())
        } else if let Some(e) = outcome.error {
            Some(e.into())
        } else if let Some(panicked) = outcome.panicked {
            Some(MachineError::VcpuThread(format!("vCPU {panicked} panicked")))
        } else if outcome.timed_out {
            Some(MachineError::Timeout(timeout.unwrap_or_default()))
        } else {
            None
        };
        let mut report = self.report(stats, outcome.stats);
        report.samples = outcome.samples;
        Ok((report, error))
    }

    /// Presses Ctrl-Alt-Del on the guest's keyboard (the API's SendCtrlAltDel); false if
    /// the guest is not taking keys (keyboard disabled, or its buffer full).
    /// Gives drive `index` a new backing file on a running guest: its capacity re-read,
    /// the guest told by a configuration-change interrupt (Firecracker's PATCH /drives).
    pub fn update_drive(&self, index: usize, path: &std::path::Path) -> Result<(), MachineError> {
        let drive = self.drives.get(index).ok_or(MachineError::NoDrive(index))?;
        let disk = drive.disk.swap(path)?;
        tracing::info!("{}: swapped to {} ({} bytes)", drive.name, path.display(), disk.capacity);
        drive.transport.config_changed();
        Ok(())
    }

    /// New rate limits for drive `index` (Firecracker's PATCH /drives rate_limiter).
    pub fn set_drive_limits(&self, index: usize, limits: crate::rate_limiter::Limits) -> Result<(), MachineError> {
        self.drives.get(index).ok_or(MachineError::NoDrive(index))?.limits.set(limits);
        Ok(())
    }

    /// New rate limits for NIC `index`, each way that is given (PATCH /network-interfaces).
    pub fn set_net_limits(
        &self,
        index: usize,
        rx: Option<crate::rate_limiter::Limits>,
        tx: Option<crate::rate_limiter::Limits>,
    ) -> Result<(), MachineError> {
        let nic = self.nets.get(index).ok_or(MachineError::NoNic(index))?;
        for (slot, limits) in nic.limits.iter().zip([rx, tx]) {
            if let Some(limits) = limits {
                slot.set(limits);
            }
        }
        Ok(())
    }

    pub fn send_ctrl_alt_del(&self) -> bool {
        self.i8042.as_ref().is_some_and(|k| k.ctrl_alt_del())
    }

    /// Builds the report after the vCPUs stopped.
    pub fn report(&self, stats: ExitStats, vcpus: Vec<ExitStats>) -> RunReport {
        let elapsed = self.started.0.elapsed();
        let tsc_hz = (cycles() - self.started.1) as f64 / elapsed.as_secs_f64();
        let guest_start = self.memory.get_host_address(GuestAddress(0)).ok().map(|p| p as usize);
        RunReport {
            exit_status: self.control.exit_status().unwrap_or(0),
            stop: self.control.guest_stopped(),
            stats,
            vcpus,
            devices: self.devices.clone(),
            elapsed,
            tsc_hz,
            vmm_memory: guest_start.and_then(vmm_memory_kib),
            nets: self.nets.iter().map(|n| (n.tap_name.clone(), n.stats.snapshot())).collect(),
            drives: self.drives.iter().map(|d| (d.name.clone(), d.stats.snapshot())).collect(),
            samples: Vec::new(),
        }
    }
}

impl Machine {
    /// Lets the console writer catch up with what the guest printed (bounded: a consumer
    /// that stopped reading does not hold the VMM).
    pub fn drain_console(&self) {
        if let Some(serial) = &self.serial {
            if !serial.drain_output(Duration::from_secs(2)) {
                tracing::warn!("console output not fully written: its reader is not keeping up");
            }
        }
    }
}

impl Drop for Machine {
    /// The config-space devices on the buses point back at the PCI root, which points at
    /// the buses: emptying the buses breaks that cycle, so every device (and its threads,
    /// taps and eventfds) goes away with the machine.
    fn drop(&mut self) {
        self.drain_console();
        let _ = self.buses.update(|b| {
            *b = BusSet::default();
            Ok::<(), ()>(())
        });
    }
}

/// The shared page: magic, the end of RAM below 4 GiB, then the payload's parameters.
fn write_shared_page(memory: &GuestMemoryMmap, mem_size: u64, params: &[u64]) -> Result<(), MachineError> {
    let max_params = (abi::SHARED_RESULT_SLOT - abi::SHARED_PARAM_SLOT) as usize;
    let write = |i, v: u64| memory.write_obj(v, shared_slot(i)).map_err(|e| MachineError::Memory(e.into()));
    write(0, abi::SHARED_MAGIC)?;
    write(abi::SHARED_MEM_END_SLOT, mem_size)?;
    for (i, &p) in params.iter().take(max_params).enumerate() {
        write(abi::SHARED_PARAM_SLOT + i as u64, p)?;
    }
    Ok(())
}

/// The guest address of u64 slot `i` of the shared page.
pub fn shared_slot(i: u64) -> GuestAddress {
    GuestAddress(abi::SHARED_PAGE_GPA + 8 * i)
}

/// Reads a result slot the guest wrote into the shared page.
pub fn read_result(memory: &GuestMemoryMmap, index: u64) -> u64 {
    memory.read_obj(shared_slot(abi::SHARED_RESULT_SLOT + index)).unwrap_or(0)
}

/// Process RSS minus the resident part of the guest RAM mapping that starts at `guest_start`.
fn vmm_memory_kib(guest_start: usize) -> Option<VmmMemory> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let kib = |v: &str| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok();
    let (mut all, mut guest) = (VmmMemory::default(), VmmMemory::default());
    let mut in_guest = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ').filter(|(r, _)| r.contains('-') && !r.ends_with(':')) {
            in_guest = usize::from_str_radix(range.split('-').next()?, 16).ok() == Some(guest_start);
        } else if let Some(v) = line.strip_prefix("Rss:") {
            let n = kib(v)?;
            all.rss_kib += n;
            guest.rss_kib += if in_guest { n } else { 0 };
        } else if let Some(v) = line.strip_prefix("Pss:") {
            let n = kib(v)?;
            all.pss_kib += n;
            guest.pss_kib += if in_guest { n } else { 0 };
        }
    }
    Some(VmmMemory { rss_kib: all.rss_kib - guest.rss_kib, pss_kib: all.pss_kib - guest.pss_kib })
}
