//! A machine: KVM VM, guest memory, buses with their devices, and vCPUs.

use crate::boot::{self, regs, EntryPoint};
use crate::bus::{BusDevice, BusError, BusSet, DeviceId, MmioAddress, PioAddress, SharedBuses};
use crate::control::RunControl;
use crate::devices::{debug_exit, doorbell, serial, DebugExit, Doorbell, Serial};
use crate::ioeventfd::{IoeventfdLimits, IoeventfdRegistry};
use crate::irq::GsiRouter;
use crate::kvm;
use crate::net::Tap;
use crate::pci::cf8::{Cf8Device, CF8_LEN, CF8_PORT};
use crate::pci::ecam::{EcamDevice, EcamShadow, ECAM_SIZE};
use crate::pci::msix::Msix;
use crate::pci::{EcamMode, PciError, PciRoot};
use crate::stats::ExitStats;
use crate::vcpu::{cycles, Vcpu, VcpuError};
use crate::virtio::net::{NetCounters, NetStats, TxMode, VirtioNet};
use crate::virtio::pci::VirtioPci;
use crate::watchdog::Watchdog;
use exitless_payloads::abi;
use kvm_bindings::{kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VmFd};
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Guest RAM starts at 0 and must end below the MMIO hole.
pub const MIN_MEM: u64 = 4 << 20;
pub const MAX_MEM: u64 = abi::MMIO_HOLE_START;
/// virtio-net's PCI device number on bus 0.
const VIRTIO_NET_PCI_DEVICE: u8 = 2;
/// KVM memory slots: 0 is RAM, the ECAM shadow's start here.
const ECAM_FIRST_SLOT: u32 = 1;
/// Where KVM's real-mode TSS pages go (Intel needs them before an irqchip), just below the BIOS area.
const TSS_ADDRESS: usize = 0xfffb_d000;

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error(transparent)]
    Kvm(#[from] kvm::KvmError),
    #[error("{what} failed: {source}")]
    Ioctl { what: &'static str, source: kvm_ioctls::Error },
    #[error("guest memory size {0} bytes is out of range: give between 4M and 3G")]
    MemSize(u64),
    #[error("cannot allocate guest memory: {0}")]
    Memory(String),
    #[error(transparent)]
    Load(#[from] boot::LoadError),
    #[error(transparent)]
    Regs(#[from] regs::RegsError),
    #[error("cannot place device {name}: {source}")]
    Bus { name: String, source: BusError },
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error(transparent)]
    Pci(#[from] PciError),
    #[error(transparent)]
    Tap(#[from] crate::net::tap::TapError),
    #[error("cannot set up virtio-net: {0}")]
    Net(String),
    #[error("the guest did not finish within {0:?}")]
    Timeout(Duration),
    #[error("the vCPU thread died: {0}")]
    VcpuThread(String),
}

fn ioctl(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> MachineError {
    move |source| MachineError::Ioctl { what, source }
}

/// What to boot and how.
pub struct MachineConfig {
    /// An ELF image with a PVH note, or a 64-bit entry point.
    pub image: std::borrow::Cow<'static, [u8]>,
    pub mem_size: u64,
    /// Parameters for the payload, in the shared page's parameter slots.
    pub params: Vec<u64>,
    /// Where the serial console's output goes.
    pub serial_out: Box<dyn Write + Send>,
    pub ioeventfd_limits: IoeventfdLimits,
    /// How the ECAM window is served.
    pub ecam: EcamMode,
    /// A virtio-net device on a tap, if any.
    pub net: Option<NetConfig>,
}

/// `--net tap=NAME[,mac=..]` and `--net-tx`.
#[derive(Clone, Debug)]
pub struct NetConfig {
    pub tap: String,
    pub mac: [u8; 6],
    pub tx: TxMode,
}

/// The virtio-net device of a machine, for the lab to watch.
pub struct NetHandle {
    pub stats: Arc<NetStats>,
    pub transport: Arc<VirtioPci>,
    pub tap_name: String,
}

impl MachineConfig {
    /// `image` with 128 MiB, no parameters, serial output dropped, default limits.
    pub fn new(image: impl Into<std::borrow::Cow<'static, [u8]>>) -> Self {
        MachineConfig {
            image: image.into(),
            mem_size: 128 << 20,
            params: Vec::new(),
            serial_out: Box::new(std::io::sink()),
            ioeventfd_limits: IoeventfdLimits::default(),
            ecam: EcamMode::Mapped,
            net: None,
        }
    }
}

/// The result of a run.
pub struct RunReport {
    pub exit_status: u32,
    pub stats: ExitStats,
    /// Device names, indexed by [`DeviceId`].
    pub devices: Vec<String>,
    pub elapsed: Duration,
    /// Host TSC ticks per second, measured over the run (to turn cycles into time).
    pub tsc_hz: f64,
    /// Resident memory of the VMM process beyond guest RAM, in KiB.
    pub vmm_rss_kib: Option<u64>,
    /// virtio-net's counters, when the machine had one.
    pub net: Option<NetCounters>,
}

pub struct Machine {
    kvm: Kvm,
    pub vm: Arc<VmFd>,
    pub memory: GuestMemoryMmap,
    pub control: Arc<RunControl>,
    pub buses: Arc<SharedBuses>,
    pub ioeventfds: Arc<IoeventfdRegistry>,
    pub pci: Arc<PciRoot>,
    /// The doorbell, PCI function 00:01.0.
    pub doorbell: Arc<Doorbell>,
    pub gsi_router: Arc<GsiRouter>,
    /// virtio-net, PCI function 00:02.0, when configured.
    pub net: Option<NetHandle>,
    devices: Vec<String>,
    entry: EntryPoint,
    started: (Instant, u64),
}

impl Machine {
    /// Creates the VM, loads the image and plugs in the serial port and debug-exit port.
    pub fn new(config: MachineConfig) -> Result<Machine, MachineError> {
        let started = (Instant::now(), cycles());
        if !(MIN_MEM..=MAX_MEM).contains(&config.mem_size) {
            return Err(MachineError::MemSize(config.mem_size));
        }
        let kvm = kvm::open()?;
        let vm = kvm.create_vm().map_err(ioctl("KVM_CREATE_VM"))?;
        vm.set_tss_address(TSS_ADDRESS).map_err(ioctl("KVM_SET_TSS_ADDR"))?;
        vm.create_irq_chip().map_err(ioctl("KVM_CREATE_IRQCHIP"))?;

        let memory = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), config.mem_size as usize)])
            .map_err(|e| MachineError::Memory(e.to_string()))?;
        for (slot, region) in memory.iter().enumerate() {
            let host = memory.get_host_address(region.start_addr()).map_err(|e| MachineError::Memory(e.to_string()))?;
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

        let entry = boot::load_image(&memory, &config.image, config.mem_size)?;
        write_shared_page(&memory, config.mem_size, &config.params)?;

        let control = Arc::new(RunControl::default());
        let vm = Arc::new(vm);
        let buses = Arc::new(SharedBuses::new(BusSet::default()));
        let ioeventfds = Arc::new(IoeventfdRegistry::new(vm.clone(), config.ioeventfd_limits));
        let gsi_router = Arc::new(GsiRouter::new(vm.clone()));
        let shadow = EcamShadow::new(vm.clone(), abi::ECAM_GPA, ECAM_FIRST_SLOT).map_err(PciError::Shadow)?;
        let pci = Arc::new(PciRoot::new(buses.clone(), ioeventfds.clone(), shadow, config.ecam)?);
        let mut machine = Machine {
            kvm,
            ioeventfds,
            vm,
            memory,
            control: control.clone(),
            buses,
            pci: pci.clone(),
            doorbell: Arc::new(Doorbell::default()),
            gsi_router,
            net: None,
            devices: Vec::new(),
            entry,
            started,
        };
        let serial = Arc::new(Serial::new(config.serial_out));
        machine.add_pio_device("serial", abi::SERIAL_PORT as u16, serial::SERIAL_LEN, serial)?;
        let debug_exit = Arc::new(DebugExit::new(control));
        machine.add_pio_device("debug-exit", abi::DEBUG_EXIT_PORT as u16, debug_exit::DEBUG_EXIT_LEN, debug_exit)?;
        machine.add_pio_device("pci-cf8", CF8_PORT, CF8_LEN, Arc::new(Cf8Device::new(pci.clone())))?;
        machine.add_mmio_device("pci-ecam", abi::ECAM_GPA, ECAM_SIZE, Arc::new(EcamDevice::new(pci.clone())))?;
        let idle = Arc::new(crate::devices::idle::Idle::new(machine.gsi_router.clone()));
        machine.add_pio_device("idle", abi::IDLE_PORT as u16, crate::devices::idle::IDLE_LEN, idle)?;
        pci.add(0, 0, crate::pci::host_bridge())?;
        let mmio = (machine.register_device("doorbell-mmio"), abi::DOORBELL_MMIO_GPA);
        let pio = (machine.register_device("doorbell-pio"), abi::DOORBELL_PIO_PORT);
        pci.add(abi::DOORBELL_PCI_DEVICE as u8, 0, doorbell::pci_function(machine.doorbell.clone(), mmio, pio))?;
        if let Some(net) = &config.net {
            machine.add_virtio_net(net)?;
        }
        Ok(machine)
    }

    /// virtio-net at 00:02.0: BAR0 at the start of the PCI window, one MSI-X vector per
    /// queue plus one for config changes, every queue's notify address an ioeventfd.
    fn add_virtio_net(&mut self, net: &NetConfig) -> Result<(), MachineError> {
        let tap = Tap::open(&net.tap)?;
        let tap_name = tap.name().to_string();
        let device = VirtioNet::new(tap, net.mac, net.tx);
        let stats = device.stats.clone();
        let msix = Msix::new(self.gsi_router.clone(), 3).map_err(MachineError::Net)?;
        let transport = Arc::new(
            VirtioPci::new(Box::new(device), self.memory.clone(), msix)
                .map_err(|e| MachineError::Net(e.to_string()))?,
        );
        let bar0 = abi::PCI_MMIO_WINDOW_START;
        let id = self.register_device("virtio-net");
        self.pci.add(VIRTIO_NET_PCI_DEVICE, 0, transport.pci_function("virtio-net", id, bar0))?;
        for (key, fd) in transport.ioeventfds(bar0) {
            self.ioeventfds.register(key, fd).map_err(|e| MachineError::Net(e.to_string()))?;
        }
        self.net = Some(NetHandle { stats, transport, tap_name });
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
        self.add_device(name, |b, id| b.pio.insert(PioAddress(port), len, id, device))
    }

    pub fn add_mmio_device(
        &mut self,
        name: &str,
        addr: u64,
        len: u64,
        device: Arc<dyn BusDevice>,
    ) -> Result<DeviceId, MachineError> {
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

    /// Creates vCPU `id`, with the host's supported CPUID; vCPU 0 is put at the entry point.
    pub fn create_vcpu(&self, id: u8) -> Result<Vcpu, MachineError> {
        let fd = self.vm.create_vcpu(u64::from(id)).map_err(ioctl("KVM_CREATE_VCPU"))?;
        let cpuid = self.kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(ioctl("KVM_GET_SUPPORTED_CPUID"))?;
        fd.set_cpuid2(&cpuid).map_err(ioctl("KVM_SET_CPUID2"))?;
        if id == 0 {
            regs::setup(&fd, &self.memory, self.entry)?;
        }
        let run_size = self.kvm.get_vcpu_mmap_size().map_err(ioctl("KVM_GET_VCPU_MMAP_SIZE"))?;
        Ok(Vcpu::new(id, fd, run_size, self.buses.clone(), self.devices.len(), self.control.clone()))
    }

    /// Boots vCPU 0 on its own thread and waits for the guest to exit (or `timeout`).
    pub fn run(self, timeout: Option<Duration>) -> Result<RunReport, MachineError> {
        let mut vcpu = self.create_vcpu(0)?;
        let control = self.control.clone();
        let thread = std::thread::Builder::new()
            .name("vcpu0".into())
            .spawn(move || {
                let watchdog = timeout.map(|t| Watchdog::arm_for_current_thread(control, t));
                let result = vcpu.run();
                let fired = watchdog.is_some_and(Watchdog::disarm);
                (result, fired, vcpu.exits.stats)
            })
            .map_err(|e| MachineError::VcpuThread(e.to_string()))?;
        let (result, timed_out, stats) = thread.join().map_err(|_| MachineError::VcpuThread("panicked".into()))?;
        result?;
        if timed_out {
            return Err(MachineError::Timeout(timeout.unwrap_or_default()));
        }
        Ok(self.report(stats))
    }

    /// Builds the report after the vCPUs stopped.
    pub fn report(&self, stats: ExitStats) -> RunReport {
        let elapsed = self.started.0.elapsed();
        let tsc_hz = (cycles() - self.started.1) as f64 / elapsed.as_secs_f64();
        let guest_start = self.memory.get_host_address(GuestAddress(0)).ok().map(|p| p as usize);
        RunReport {
            exit_status: self.control.exit_status().unwrap_or(0),
            stats,
            devices: self.devices.clone(),
            elapsed,
            tsc_hz,
            vmm_rss_kib: guest_start.and_then(vmm_rss_kib),
            net: self.net.as_ref().map(|n| n.stats.snapshot()),
        }
    }
}

impl Drop for Machine {
    /// The config-space devices on the buses point back at the PCI root, which points at
    /// the buses: emptying the buses breaks that cycle, so every device (and its threads,
    /// taps and eventfds) goes away with the machine.
    fn drop(&mut self) {
        let _ = self.buses.update(|b| {
            *b = BusSet::default();
            Ok::<(), ()>(())
        });
    }
}

/// The shared page: magic, the end of RAM, then the payload's parameters.
fn write_shared_page(memory: &GuestMemoryMmap, mem_size: u64, params: &[u64]) -> Result<(), MachineError> {
    let max_params = (abi::SHARED_RESULT_SLOT - abi::SHARED_PARAM_SLOT) as usize;
    let write = |i, v: u64| memory.write_obj(v, shared_slot(i)).map_err(|e| MachineError::Memory(e.to_string()));
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
fn vmm_rss_kib(guest_start: usize) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let rss: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut in_guest = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ').filter(|(r, _)| r.contains('-') && !r.ends_with(':')) {
            in_guest = usize::from_str_radix(range.split('-').next()?, 16).ok() == Some(guest_start);
        } else if in_guest {
            if let Some(v) = line.strip_prefix("Rss:") {
                let guest: u64 = v.trim().trim_end_matches("kB").trim().parse().ok()?;
                return Some(rss.saturating_sub(guest));
            }
        }
    }
    Some(rss)
}
