//! Building a machine, two ways: a guest booted from its image, or a snapshot's state put
//! back. Both start from the same platform: the VM, RAM and its memslots, and the devices
//! the configuration names, in the order KVM makes cheapest (memslots before the irqchip).

use super::{ioctl, MachineConfig, MAX_VCPUS};
use super::{join_lstar_watch, load, map_guest_ram, sleep, LstarWatch, Machine, MachineError, VcpuPlan};
use crate::boot::EntryPoint;
use crate::device_manager::{Allocators, DeviceManager, DeviceManagerConfig, DeviceTree};
use crate::devices::legacy::{cmos_rtc::CmosRtc, AcpiPm};
use crate::guest_memory::GuestMemoryMmap;
use crate::host::HostProfile;
use crate::kvm;
use crate::layout::{self, MemoryMap};
use crate::memslots::Memslots;
use crate::persist::Persist;
use crate::run_control::{PowerEvents, RunControl};
use crate::snapshot::{MemoryBackend, Restore, SnapshotError};
use crate::stats::{cycles, LiveStats};
use crate::virtio::mem::Geometry;
use kvm_bindings::{kvm_pit_config, CpuId, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VmFd};
use std::sync::Arc;
use std::time::Instant;

/// What every machine has before a guest is booted into it or restored onto it.
struct Platform {
    kvm: Kvm,
    vm: Arc<VmFd>,
    map: MemoryMap,
    memory: GuestMemoryMmap,
    devices: DeviceManager,
    host: HostProfile,
    control: Arc<RunControl>,
    pm: Arc<AcpiPm>,
    rtc: Option<Arc<CmosRtc>>,
    supported_cpuid: CpuId,
    template_msrs: Vec<crate::cpu_template::schema::MsrModifier>,
    lstar_watch: Option<LstarWatch>,
    ram_slots: Vec<u32>,
    uffd: Option<std::os::fd::OwnedFd>,
    ram_file: Option<crate::snapshot::fork::RamFile>,
    started: (Instant, u64),
}

impl Machine {
    /// Creates the VM with its memory and the configured devices, then boots the image
    /// into it, or puts the configuration's snapshot back ([`MachineConfig::restore`]).
    pub fn new(mut config: MachineConfig) -> Result<Machine, MachineError> {
        match config.restore.take() {
            Some(restore) => Self::restored(config, restore),
            None => Self::booted(config),
        }
    }

    /// A guest booted from `config.image`: its tables, command line and image written
    /// once the devices are placed (the tables and command line name them).
    fn booted(mut config: MachineConfig) -> Result<Machine, MachineError> {
        let mut p = Platform::build(&mut config, None, None)?;
        let acpi_devices = crate::devices::acpi::dsdt(&p.devices);
        let acpi_lines = crate::devices::acpi::lines(&p.devices);
        let boot = load::GuestBoot {
            image: &config.image,
            cmdline: &config.cmdline,
            initrd: config.initrd.as_deref(),
            params: &config.params,
            vcpus: config.vcpus,
            mmio_windows: &p.devices.mmio_windows(),
            acpi_devices: (&acpi_devices, &acpi_lines),
            host_linux_args: p.host.linux_args(),
        };
        let (entry, facs) = boot.load(&p.vm, &p.memory, &p.map)?;
        // A booting guest may write LSTAR at once: the filter must be on before it runs.
        join_lstar_watch(p.lstar_watch.take());
        Ok(p.into_machine(&mut config, Some(entry), facs, None))
    }

    /// A snapshot's machine: checked against the configuration first, its memory mapped
    /// from the snapshot, then the VM's and every device's state put back. The vCPUs get
    /// theirs as they are created.
    fn restored(mut config: MachineConfig, r: Restore) -> Result<Machine, MachineError> {
        let hotplug = config.memory_hotplug.map_or(0, |h| h.total_size_mib.saturating_mul(1 << 20));
        let sizes = (config.mem_size, hotplug);
        crate::snapshot::check_restore(&r, config.vcpus, sizes, config.devices.test_devices)?;
        let p = Platform::build(&mut config, Some(&r.memory), Some(&r.state.devices))?;
        p.vm.restore(r.clock_realtime, &r.state.vm).map_err(SnapshotError::from)?;
        p.devices.restore((), &r.state.devices).map_err(SnapshotError::from)?;
        // The guest wrote LSTAR in another VMM (its watch starts from the saved value), so
        // the filter's grace period overlaps its first run.
        Ok(p.into_machine(&mut config, None, 0, Some(r.state.vcpus)))
    }
}

impl Platform {
    /// With `placed` (a snapshot's devices), each device where the snapshot had it.
    fn build(
        config: &mut MachineConfig,
        memory_from: Option<&MemoryBackend>,
        placed: Option<&DeviceTree>,
    ) -> Result<Platform, MachineError> {
        let started = (Instant::now(), cycles());
        let host = HostProfile::choose(config.host);
        tracing::info!("host profile: {}", host.describe());
        let map = MemoryMap::new(config.mem_size)?;
        let kvm = kvm::open()?;
        let max_vcpus = kvm.get_max_vcpus().min(usize::from(MAX_VCPUS)) as u8;
        if !(1..=max_vcpus).contains(&config.vcpus) {
            return Err(MachineError::Vcpus { asked: config.vcpus, max: max_vcpus });
        }
        let supported_cpuid =
            kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(ioctl("KVM_GET_SUPPORTED_CPUID"))?;
        // The template is checked against this host before anything else is built.
        let (supported_cpuid, template_msrs) = match &config.cpu_template {
            Some(t) => {
                let applied = t.resolve(&kvm, &supported_cpuid, &host)?;
                tracing::info!("CPU template {} applied", t.describe());
                (applied.cpuid, applied.msrs)
            }
            None => (supported_cpuid, Vec::new()),
        };
        // Before the VM: see EcamPages.
        let ecam_pages = crate::pci::ecam::EcamPages::new().map_err(|e| MachineError::Memory(e.into()))?;
        let vm = Arc::new(kvm.create_vm().map_err(ioctl("KVM_CREATE_VM"))?);
        // KVM_X86_SET_MSR_FILTER waits for an SRCU grace period: it runs beside the rest
        // of the setup and is joined before a booted guest's vCPUs exist.
        let lstar_watch = host.nested().then(|| {
            let vm = vm.clone();
            std::thread::spawn(move || crate::host::emulate::syscall::trap_lstar_writes(&vm))
        });
        let memslots = Arc::new(Memslots::new(u32::try_from(kvm.get_nr_memslots()).unwrap_or(u32::MAX)));
        let mut allocators = Allocators::new(&map.pci_windows())?;
        // Hotpluggable memory is guest memory before any device takes a copy of it.
        let hotplug = config.memory_hotplug.map(|h| hotplug_geometry(&mut allocators, h)).transpose()?;
        // The memslots of RAM and of the ECAM window before the in-kernel irqchip: the first
        // memslot change after KVM_CREATE_IRQCHIP waits for a grace period it started (7 ms
        // of a 10 ms InstanceStart on this host; 0.1 ms before it, docs/benchmarks.md).
        let ram_dir = config.ram_dir.as_deref();
        let backing = super::ram::Backing {
            from: memory_from,
            huge_pages: config.huge_pages,
            shared: config.shared_memory,
            ram_dir,
        };
        let ram = map_guest_ram(&vm, &map, &memslots, backing, config.track_dirty_pages)?;
        let (mut memory, ram_slots, uffd, ram_file) = (ram.memory, ram.slots, ram.uffd, ram.file);
        if let Some(g) = &hotplug {
            memory = super::ram::add_hotplug_region(memory, g, memory_from, config.shared_memory)?;
        }
        vm.set_tss_address(layout::TSS_GPA as usize).map_err(ioctl("KVM_SET_TSS_ADDR"))?;
        let control = Arc::new(RunControl::default());
        let d = std::mem::take(&mut config.devices);
        let dm_config = DeviceManagerConfig {
            ioeventfd_limits: d.ioeventfd_limits,
            ecam: d.ecam,
            mmio_registers: d.mmio_registers,
            pci_config_io: d.pci_config_io,
            transport: d.transport,
            ecam_pages,
            memslots,
        };
        let mut devices = DeviceManager::new(vm.clone(), memory.clone(), &map, allocators, dm_config)?;
        if let Some(tree) = placed {
            devices.plan_restore(tree);
        }
        // Every device from here on routes interrupts (irqfds, GSI routes): the irqchip first.
        vm.create_irq_chip().map_err(ioctl("KVM_CREATE_IRQCHIP"))?;
        let pit = kvm_pit_config { flags: KVM_PIT_SPEAKER_DUMMY, ..Default::default() };
        vm.create_pit2(pit).map_err(ioctl("KVM_CREATE_PIT2"))?;
        devices.attach_serial(d.serial_out, d.serial_in)?;
        let power = PowerEvents::new(control.clone());
        devices.attach_debug_exit(power.clone())?;
        devices.attach_keyboard(power.clone())?;
        let pm = devices.attach_power(power, d.test_devices)?;
        for attach in d.fixed {
            attach(&mut devices)?;
        }
        let mut rtc = None;
        if d.test_devices {
            rtc = Some(devices.attach_rtc()?);
            devices.attach_qemu_test_devices(config.mem_size, config.vcpus)?;
            if d.test_iommu {
                devices.attach_edu_behind_iommu()?;
            }
        }
        // A restored guest booted long ago, and its devices' places are the snapshot's,
        // one of which may be the timer's page: Firecracker attaches none on restore either.
        if d.boot_timer && memory_from.is_none() {
            devices.attach_boot_timer(started.0)?;
        }
        for attach in d.allocated {
            attach(&mut devices)?;
        }
        // Hotpluggable memory is the machine's own (its guest memory, placed above).
        if let Some(g) = hotplug {
            devices.attach_virtio_mem(g)?;
        }
        // Firecracker's ACPI devices, after every other (their lines are the next ones).
        devices.attach_acpi_devices(placed.is_some())?;
        Ok(Platform {
            kvm,
            vm,
            map,
            memory,
            devices,
            host,
            control,
            pm,
            rtc,
            supported_cpuid,
            template_msrs,
            lstar_watch,
            ram_slots,
            uffd,
            ram_file,
            started,
        })
    }

    fn into_machine(
        self,
        config: &mut MachineConfig,
        entry: Option<EntryPoint>,
        facs: u64,
        restored: Option<Vec<crate::persist::vcpu::VcpuState>>,
    ) -> Machine {
        let p = self;
        let sleep = p.rtc.map(|rtc| Arc::new(sleep::Sleep::new(p.pm, rtc, facs, p.memory.clone())));
        let threads_per_core = if config.smt { 2 } else { 1 };
        Machine {
            kvm: p.kvm,
            vm: p.vm,
            map: p.map,
            memory: p.memory,
            devices: std::sync::RwLock::new(p.devices),
            vcpus: VcpuPlan {
                count: config.vcpus,
                threads_per_core,
                supported_cpuid: p.supported_cpuid,
                template_msrs: p.template_msrs,
                entry,
            },
            host: p.host,
            control: p.control,
            run: std::mem::take(&mut config.run),
            sleep,
            started: p.started,
            live: Arc::new(LiveStats::new(usize::from(config.vcpus), 0)),
            restored,
            ram_slots: (p.ram_slots, config.track_dirty_pages),
            lstar_watch: std::sync::Mutex::new(p.lstar_watch),
            _uffd: p.uffd,
            ram_file: p.ram_file,
        }
    }
}

/// Where hotpluggable memory goes: device memory past the 64-bit PCI window (as
/// Firecracker's past-MMIO64 space), on a Linux memory block's boundary.
fn hotplug_geometry(allocators: &mut Allocators, h: super::MemoryHotplug) -> Result<Geometry, MachineError> {
    h.validate().map_err(MachineError::MemoryHotplug)?;
    let bytes = |mib: u64| {
        mib.checked_mul(1 << 20).ok_or_else(|| MachineError::MemoryHotplug(format!("{mib} MiB is too large")))
    };
    let (size, block_size, slot_size) = (bytes(h.total_size_mib)?, bytes(h.block_size_mib)?, bytes(h.slot_size_mib)?);
    let start = allocators.device_memory(size, crate::virtio::mem::ALIGNMENT, None).map_err(|e| {
        MachineError::MemoryHotplug(format!("no room for {} MiB of hotpluggable memory: {e}", h.total_size_mib))
    })?;
    Ok(Geometry { start, size, block_size, slot_size })
}
