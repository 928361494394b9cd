//! A machine: the KVM VM with its guest memory (the one owner of the memory map), its
//! vCPUs, and the device manager that owns every device. Built once from a
//! [`MachineConfig`]; [`Machine::run`] runs the vCPUs on threads of their own.

use crate::boot::{self, cpu, regs, EntryPoint};
use crate::device_manager::{AllocError, DeviceError, DeviceManager};
use crate::host::{HostProfile, NestedExits};
use crate::layout::{LayoutError, MemoryMap};
use crate::persist::Persist;
use crate::run_control::{GuestStop, RunControl};
use crate::stats::{cycles, ExitStats, LiveStats};
use crate::vcpu::samples::GuestSamples;
use crate::vcpu::{Vcpu, VcpuError};
use crate::virtio::blk::BlkCounters;
use crate::virtio::net::NetCounters;

/// How often a nested host's vCPUs are kicked to look for a vmcall KVM left undone: the
/// most a guest's hypercall waits for its answer.
const HYPERCALL_WATCH: std::time::Duration = std::time::Duration::from_millis(200);
use crate::{acpi, kvm};
use kvm_bindings::CpuId;
use kvm_ioctls::{Kvm, VmFd};

use crate::guest_memory::GuestMemoryMmap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::GuestMemoryBackend;

pub use crate::virtio::net::NetConfig;
pub use config::{AttachFixed, DeviceConfig, HugePages, MachineConfig, MemoryHotplug, RunOptions};
pub use ram::{read_result, shared_slot};

mod build;
mod config;
mod load;
mod ram;
pub mod sleep;
mod snapshot;
use ram::map_guest_ram;

pub use crate::vcpu::MAX_VCPUS;

#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error(transparent)]
    Kvm(#[from] kvm::KvmError),
    #[error("{what} failed")]
    Ioctl {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("--vcpus {asked}: give between 1 and {max} (what KVM allows here)")]
    Vcpus { asked: u8, max: u8 },
    #[error("cannot set up guest memory")]
    Memory(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("{0}")]
    HugePages(String),
    #[error("memory hotplug: {0}")]
    MemoryHotplug(String),
    #[error(transparent)]
    Load(#[from] boot::LoadError),
    #[error(transparent)]
    Acpi(#[from] acpi::AcpiError),
    #[error(transparent)]
    Regs(#[from] regs::RegsError),
    #[error(transparent)]
    Cpu(#[from] cpu::CpuError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error(transparent)]
    Memslots(#[from] crate::memslots::NoMemslots),
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    #[error("the guest did not finish within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
    #[error("cannot start the vCPU threads")]
    VcpuThreads(#[source] std::io::Error),
    #[error("vCPU {0} panicked")]
    VcpuPanicked(u8),
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    #[error(transparent)]
    CpuTemplate(#[from] crate::cpu_template::TemplateError),
}

fn ioctl(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> MachineError {
    move |source| MachineError::Ioctl { what, source }
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
    /// Bus entry names, indexed by [`crate::bus::DeviceId`].
    pub devices: Vec<String>,
    pub elapsed: Duration,
    /// Host TSC ticks per second, measured over the run (to turn cycles into time).
    pub tsc_hz: f64,
    /// Memory of the VMM process beyond guest RAM.
    pub vmm_memory: Option<VmmMemory>,
    /// Each virtio-net device's tap name and counters.
    pub nets: Vec<(String, NetCounters)>,
    /// Each drive's name, the id its configuration gave it, and its virtio-blk counters.
    pub drives: Vec<(String, String, BlkCounters)>,
    /// Each vCPU's guest RIP samples, by vCPU id (empty unless sampling was asked for).
    pub samples: Vec<GuestSamples>,
    /// The host profile in force, and why (`nested (KVM is kvm_pvm: ...)`).
    pub host_profile: String,
}

/// What vCPUs are made from.
struct VcpuPlan {
    count: u8,
    /// vCPUs per core in the CPUID topology: 1, or 2 with SMT.
    threads_per_core: u8,
    supported_cpuid: CpuId,
    /// The CPU template's MSRs, each vCPU's put through its bitmap.
    template_msrs: Vec<crate::cpu_template::schema::MsrModifier>,
    /// Where vCPU 0 starts; None when the vCPUs' states come from a snapshot.
    entry: Option<EntryPoint>,
}

pub struct Machine {
    kvm: Kvm,
    vm: Arc<VmFd>,
    map: MemoryMap,
    memory: GuestMemoryMmap,
    /// Written only to plug or unplug a device on a running guest (the API's hotplug).
    devices: std::sync::RwLock<DeviceManager>,
    vcpus: VcpuPlan,
    host: HostProfile,
    control: Arc<RunControl>,
    run: RunOptions,
    /// ACPI S3 with its RTC wake, where offered (`--testdevs`).
    sleep: Option<Arc<sleep::Sleep>>,
    started: (Instant, u64),
    /// Each vCPU's counters while the VM runs (for the API's live exit profile).
    live: Arc<LiveStats>,
    /// The vCPUs' states when restored from a snapshot, by id.
    restored: Option<Vec<crate::persist::vcpu::VcpuState>>,
    /// Each RAM region's memslot, and whether KVM logs its dirty pages.
    ram_slots: (Vec<u32>, bool),
    /// The MSR filter still being installed (a restore does not wait for it to start).
    lstar_watch: std::sync::Mutex<Option<LstarWatch>>,
    /// The userfaultfd guest RAM is registered with (the Uffd backend), kept as long as RAM.
    _uffd: Option<std::os::fd::OwnedFd>,
    /// The file guest RAM is kept in (`--ram-dir`), for a snapshot to take.
    ram_file: Option<crate::snapshot::fork::RamFile>,
}

type LstarWatch = std::thread::JoinHandle<Result<(), kvm_ioctls::Error>>;

fn join_lstar_watch(watch: Option<LstarWatch>) {
    match watch.map(std::thread::JoinHandle::join) {
        Some(Ok(Err(e))) => tracing::debug!("no watch on the guest's system-call entry (MSR filter): {e}"),
        Some(Err(_)) => tracing::warn!("the thread installing the MSR filter panicked"),
        _ => {}
    }
}

impl Machine {
    /// Each RAM region's memslot (in the memory's order), if KVM logs their dirty pages.
    pub fn dirty_logged_slots(&self) -> Option<&[u32]> {
        self.ram_slots.1.then_some(self.ram_slots.0.as_slice())
    }

    /// The file guest RAM is kept in (`--ram-dir`), if any.
    pub fn ram_file(&self) -> Option<&crate::snapshot::fork::RamFile> {
        self.ram_file.as_ref()
    }

    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    pub fn vm(&self) -> &Arc<VmFd> {
        &self.vm
    }

    /// Where RAM, holes, windows and fixed devices are in guest physical memory.
    pub fn map(&self) -> &MemoryMap {
        &self.map
    }

    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }

    pub fn devices(&self) -> std::sync::RwLockReadGuard<'_, DeviceManager> {
        crate::sync::read(&self.devices)
    }

    /// To attach more devices before the machine runs.
    pub fn devices_mut(&mut self) -> &mut DeviceManager {
        self.devices.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// To plug or unplug a device while the guest runs: no reader holds it meanwhile.
    pub fn devices_for_hotplug(&self) -> std::sync::RwLockWriteGuard<'_, DeviceManager> {
        crate::sync::write(&self.devices)
    }

    pub fn control(&self) -> &Arc<RunControl> {
        &self.control
    }

    /// Lets the paused vCPUs run again (`PATCH /vm Resumed`), then unmaps off the pause
    /// what a snapshot moved out of guest RAM (snapshot/fork.rs).
    pub fn resume(&self) {
        self.control.resume();
        if let Some(file) = &self.ram_file {
            file.release();
        }
    }

    pub fn host_profile(&self) -> &HostProfile {
        &self.host
    }

    /// How many vCPUs the machine has.
    pub fn vcpu_count(&self) -> u8 {
        self.vcpus.count
    }

    /// Creates vCPU `id` with its CPUID, MSRs, FPU and LAPIC; vCPU 0 is put at the entry
    /// point, the others wait for the guest to start them (INIT/SIPI, in-kernel LAPIC).
    pub fn create_vcpu(&self, id: u8) -> Result<Vcpu, MachineError> {
        let plan = &self.vcpus;
        let fd = self.vm.create_vcpu(u64::from(id)).map_err(ioctl("KVM_CREATE_VCPU"))?;
        let masks = self.host.cpuid_masks();
        cpu::setup(&fd, &cpu::cpuid_for(&plan.supported_cpuid, id, plan.count, plan.threads_per_core, &masks))?;
        match (&self.restored, plan.entry) {
            (Some(states), _) => {
                let state = states.get(usize::from(id)).ok_or(MachineError::Vcpus { asked: id, max: plan.count })?;
                fd.restore((), state).map_err(crate::snapshot::SnapshotError::from)?;
            }
            (None, Some(entry)) if id == 0 => regs::setup(&fd, &self.memory, entry)?,
            _ => {}
        }
        if self.restored.is_none() {
            crate::cpu_template::apply::set_msrs(&fd, &plan.template_msrs)?;
        }
        let run_size = self.kvm.get_vcpu_mmap_size().map_err(ioctl("KVM_GET_VCPU_MMAP_SIZE"))?;
        let mut nested = self.host.nested().then(|| NestedExits::new(self.memory.clone()));
        if let (Some(nested), Some(state)) = (&mut nested, self.restored.as_ref().and_then(|s| s.get(usize::from(id))))
        {
            nested.restored(&fd, state.msr(crate::host::emulate::syscall::MSR_LSTAR).unwrap_or(0)).map_err(|e| {
                crate::snapshot::SnapshotError::Refused(format!("vCPU {id}: the system-call watch: {e}"))
            })?;
        }
        let buses = self.devices().buses().clone();
        let entries = self.devices().bus_names().len();
        let mut vcpu = Vcpu::new(id, fd, run_size, buses, entries, self.control.clone(), nested);
        vcpu.publish_to(self.live.clone());
        vcpu.repair_faults_with(self.devices().fault_repairs().clone());
        if self.run.sample_every.is_some() {
            vcpu.sample_guest();
        }
        if let Some(sleep) = &self.sleep {
            vcpu.sleep_with(sleep.clone());
        }
        Ok(vcpu)
    }

    /// The exit profile so far, while the VM runs (each vCPU's last publication).
    pub fn live_report(&self) -> RunReport {
        let vcpus = self.live.snapshot();
        let mut stats = ExitStats::new(self.devices().bus_names().len());
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
        let vcpus = (0..self.vcpus.count).map(|id| self.create_vcpu(id)).collect::<Result<Vec<_>, _>>();
        self.control.vcpus_created();
        let mut vcpus = vcpus?;
        if self.restored.is_some() {
            self.devices().start_restored();
        }
        if let Some(after) = self.run.stuck_after {
            let watches = crate::vcpu::stuck::watches(usize::from(self.vcpus.count), after);
            for (vcpu, watch) in vcpus.iter_mut().zip(watches) {
                vcpu.watch_for_stuck(watch);
            }
        }
        crate::heap::give_back_start_garbage();
        let threads = crate::vcpu::threads::VcpuThreads::spawn(vcpus, self.control.clone(), self.host.clone())
            .map_err(MachineError::VcpuThreads)?;
        join_lstar_watch(crate::sync::lock(&self.lstar_watch).take());
        // From here the main thread only waits, reports and tears down.
        let confined = match self.run.confine_caller {
            true => crate::seccomp::confine(crate::seccomp::ThreadKind::Main),
            false => Ok(()),
        };
        // A nested host's KVM never completes a CPL0 vmcall: its vCPUs are kicked now and
        // then, so that one found on a vmcall is answered (NestedExits::answer_hypercall).
        let kick_every = match self.run.sample_every {
            None if self.host.nested() => Some(HYPERCALL_WATCH),
            asked => asked,
        };
        let outcome = threads.wait(timeout, kick_every);
        self.drain_console();
        let mut stats = ExitStats::new(self.devices().bus_names().len());
        for s in &outcome.stats {
            stats.merge(s);
        }
        let error = if let Err(e) = confined {
            Some(e.into())
        } else if let Some(e) = outcome.error {
            Some(e.into())
        } else if let Some(panicked) = outcome.panicked {
            Some(MachineError::VcpuPanicked(panicked))
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
    pub fn send_ctrl_alt_del(&self) -> bool {
        self.devices().keyboard().is_some_and(|k| k.ctrl_alt_del())
    }

    /// Builds the report after the vCPUs stopped.
    pub fn report(&self, stats: ExitStats, vcpus: Vec<ExitStats>) -> RunReport {
        let elapsed = self.started.0.elapsed();
        let tsc_hz = (cycles() - self.started.1) as f64 / elapsed.as_secs_f64();
        let guest: Vec<_> = self.memory.iter().map(|r| r.host_range()).collect();
        RunReport {
            exit_status: self.control.exit_status().unwrap_or(0),
            stop: self.control.guest_stopped(),
            stats,
            vcpus,
            devices: self.devices().bus_names().to_vec(),
            elapsed,
            tsc_hz,
            vmm_memory: vmm_memory_kib(&guest),
            nets: self.devices().nets().map(|n| (n.tap_name.clone(), n.stats.snapshot())).collect(),
            drives: self.devices().drives().map(|d| (d.name.clone(), d.id.clone(), d.stats.snapshot())).collect(),
            samples: Vec::new(),
            host_profile: self.host.describe(),
        }
    }

    /// Lets the console writer catch up with what the guest printed (bounded: a consumer
    /// that stopped reading does not hold the VMM).
    pub fn drain_console(&self) {
        if let Some(serial) = self.devices().serial() {
            if !serial.drain_output(Duration::from_secs(2)) {
                tracing::warn!("console output not fully written: its reader is not keeping up");
            }
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.drain_console();
    }
}

/// Process RSS minus the resident part of guest memory: every mapping inside one of
/// `guest`'s host ranges (a region is several once pages of it were discarded or
/// protected apart).
fn vmm_memory_kib(guest: &[std::ops::Range<u64>]) -> Option<VmmMemory> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let kib = |v: &str| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok();
    let (mut all, mut in_guest_memory) = (VmmMemory::default(), VmmMemory::default());
    let mut in_guest = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ').filter(|(r, _)| r.contains('-') && !r.ends_with(':')) {
            let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
            in_guest = guest.iter().any(|g| g.contains(&start));
        } else if let Some(v) = line.strip_prefix("Rss:") {
            let n = kib(v)?;
            all.rss_kib += n;
            in_guest_memory.rss_kib += if in_guest { n } else { 0 };
        } else if let Some(v) = line.strip_prefix("Pss:") {
            let n = kib(v)?;
            all.pss_kib += n;
            in_guest_memory.pss_kib += if in_guest { n } else { 0 };
        }
    }
    Some(VmmMemory { rss_kib: all.rss_kib - in_guest_memory.rss_kib, pss_kib: all.pss_kib - in_guest_memory.pss_kib })
}
