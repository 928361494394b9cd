//! The vCPU run loop: the one place that matches on exit reasons.
//!
//! `KVM_RUN` returns -> [`Vcpu::step`] matches the exit -> [`ExitHandler`] looks the address
//! up on the bus -> `BusDevice::read`/`write`. No allocation and no lock on the way (a
//! device may lock itself). Each exit is counted and timed from `KVM_RUN` returning to
//! the next `KVM_RUN`.

pub mod samples;
pub mod stuck;
pub mod threads;
pub mod watchdog;

use crate::bus::{Bus, BusAddress, BusSet, MmioAddress, PioAddress, SharedBuses};
use crate::host::nested_exits::{HostExit, NestedExits};
use crate::persist::Persist;
use crate::run_control::kick;
use crate::run_control::{GuestStop, RunControl};
use crate::stats::{DeviceCounts, ExitKind, ExitStats, LiveStats};
use crate::vcpu::samples::GuestSamples;
use crate::vcpu::stuck::StuckWatch;
use kvm_bindings::{kvm_run, KVM_EXIT_IO_OUT, KVM_MP_STATE_RUNNABLE};
use kvm_ioctls::{VcpuExit, VcpuFd};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

/// KVM_INTERNAL_ERROR_EMULATION: KVM could not emulate an instruction.
const EMULATION_FAILED: u32 = 1;
/// KVM_SYSTEM_EVENT_SHUTDOWN and _RESET.
const SYSTEM_EVENT_SHUTDOWN: u32 = 1;
const SYSTEM_EVENT_RESET: u32 = 2;

/// How many distinct unclaimed addresses get their own warning before we go quiet.
const MAX_UNCLAIMED_WARNINGS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("KVM_RUN failed on vCPU {0}")]
    Run(u8, #[source] kvm_ioctls::Error),
    #[error("guest stopped on vCPU {vcpu}: {what}\n{regs}")]
    GuestFault { vcpu: u8, what: String, regs: String },
    #[error(transparent)]
    Seccomp(#[from] crate::seccomp::SeccompError),
}

/// What one [`Vcpu::step`] ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The exit was handled; call `step` again.
    Continue,
    /// The guest asked to exit, or the VMM asked the vCPU to stop.
    Stopped,
}

/// One guest access as it reaches a device.
pub enum Access<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

pub use crate::stats::cycles;

/// At most this many vCPUs (APIC IDs and MADT processor IDs are bytes; 0xff is broadcast).
pub const MAX_VCPUS: u8 = 254;

/// What a vCPU does while the guest sleeps in ACPI S3 (the machine's, machine::sleep):
/// parks until a wake event, then sets itself up where the guest resumes.
pub trait Suspend: Send + Sync {
    fn sleep(&self, id: u8, fd: &mut VcpuFd, control: &RunControl) -> Result<(), String>;
}

/// Everything an exit needs besides the vCPU fd, kept apart so that exit data (which
/// borrows the fd's `kvm_run` page) can be handed to it.
pub struct ExitHandler {
    shared: Arc<SharedBuses>,
    buses: Arc<BusSet>,
    generation: u64,
    pub stats: ExitStats,
    warned: HashSet<(bool, u64)>,
}

impl ExitHandler {
    fn new(shared: Arc<SharedBuses>, devices: usize) -> Self {
        let (buses, generation) = shared.snapshot();
        ExitHandler { shared, buses, generation, stats: ExitStats::new(devices), warned: HashSet::new() }
    }

    /// Picks up a new bus layout if one was published since the last exit.
    #[inline]
    fn refresh(&mut self) {
        if self.shared.generation() != self.generation {
            (self.buses, self.generation) = self.shared.snapshot();
        }
    }

    #[inline]
    pub fn pio(&mut self, port: u16, access: Access) {
        dispatch(&self.buses.pio, &mut self.stats, &mut self.warned, PioAddress(port), access)
    }

    #[inline]
    pub fn mmio(&mut self, addr: u64, access: Access) {
        dispatch(&self.buses.mmio, &mut self.stats, &mut self.warned, MmioAddress(addr), access)
    }
}

/// Bus lookup, then the device; an address no device claims goes to [`unclaimed`].
#[inline]
fn dispatch<A: BusAddress>(
    bus: &Bus<A>,
    stats: &mut ExitStats,
    warned: &mut HashSet<(bool, u64)>,
    addr: A,
    access: Access,
) {
    let size = match &access {
        Access::Read(data) => data.len(),
        Access::Write(data) => data.len(),
    };
    let Some((entry, offset)) = bus.lookup(addr, size) else {
        return unclaimed(stats, warned, addr, access);
    };
    match access {
        Access::Read(data) => {
            stats.device(entry.id, false);
            entry.device.read(offset, data)
        }
        Access::Write(data) => {
            stats.device(entry.id, true);
            entry.device.write(offset, data)
        }
    }
}

/// No device there: reads see all-ones, writes vanish, each is counted, and the first
/// accesses to an address get a warning.
#[cold]
fn unclaimed<A: BusAddress>(stats: &mut ExitStats, warned: &mut HashSet<(bool, u64)>, addr: A, access: Access) {
    let is_pio = A::MAX == PioAddress::MAX;
    let counts: &mut DeviceCounts = if is_pio { &mut stats.unclaimed_pio } else { &mut stats.unclaimed_mmio };
    let (size, dir) = match access {
        Access::Read(data) => {
            counts.reads += 1;
            data.fill(0xff);
            (data.len(), "read from")
        }
        Access::Write(data) => {
            counts.writes += 1;
            (data.len(), "write to")
        }
    };
    if warned.len() < MAX_UNCLAIMED_WARNINGS && warned.insert((is_pio, addr.raw())) {
        let space = if is_pio { "port" } else { "MMIO address" };
        tracing::warn!("unclaimed {size}-byte {dir} {space} {:#x}", addr.raw());
        if warned.len() == MAX_UNCLAIMED_WARNINGS {
            tracing::warn!("further unclaimed addresses are counted but not reported");
        }
    }
}

/// An exit other than port I/O or MMIO, detached from the `kvm_run` page it came from.
enum RareExit {
    /// A signal interrupted KVM_RUN (the VMM kicking the vCPU).
    Kicked,
    RunFailed(kvm_ioctls::Error),
    Hlt,
    Shutdown,
    FailEntry(u64, u32),
    InternalError,
    SystemEvent(u32),
    /// What only a nested host produces (crate::host::nested_exits).
    Host(HostExit),
    Unexpected(String),
}

impl From<Result<VcpuExit<'_>, kvm_ioctls::Error>> for RareExit {
    #[cold]
    fn from(exit: Result<VcpuExit<'_>, kvm_ioctls::Error>) -> Self {
        match exit {
            Ok(VcpuExit::Intr) => RareExit::Kicked,
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => RareExit::Kicked,
            Err(e) => RareExit::RunFailed(e),
            Ok(VcpuExit::Hlt) => RareExit::Hlt,
            Ok(VcpuExit::Shutdown) => RareExit::Shutdown,
            Ok(VcpuExit::FailEntry(reason, cpu)) => RareExit::FailEntry(reason, cpu),
            Ok(VcpuExit::InternalError) => RareExit::InternalError,
            Ok(VcpuExit::SystemEvent(event, _)) => RareExit::SystemEvent(event),
            Ok(VcpuExit::Debug(_)) => RareExit::Host(HostExit::Debug),
            Ok(VcpuExit::X86Wrmsr(exit)) => RareExit::Host(HostExit::WriteMsr(exit.index, exit.data)),
            Ok(other) => RareExit::Unexpected(format!("{other:?}")),
        }
    }
}

/// One virtual CPU and its exit handler.
pub struct Vcpu {
    id: u8,
    fd: VcpuFd,
    run_size: usize,
    control: Arc<RunControl>,
    /// The exit being handled and when `KVM_RUN` returned; booked at the next entry.
    pending: Option<(ExitKind, u64)>,
    coalesced_ring: bool,
    pub exits: ExitHandler,
    /// Where the counters are published while the VM runs, and when next.
    live: Option<(Arc<LiveStats>, u64)>,
    /// Guest RIPs found when the VMM kicked this vCPU to sample it (`--sample-guest`).
    pub samples: GuestSamples,
    /// Whether kicks are samples to record (else only the nested profile's hypercall watch).
    sampling: bool,
    /// The nested host profile's exits (instruction completion, the LSTAR watch); None
    /// on a native host, where those exits are faults.
    nested: Option<NestedExits>,
    /// Ends the run when no vCPU makes progress any more (`--stuck-after`), from the samples.
    stuck: Option<StuckWatch>,
    /// Where the vCPU goes while the guest is in ACPI S3, and how it comes back.
    sleep: Option<Arc<dyn Suspend>>,
    /// What mends guest memory when KVM_RUN fails with EFAULT.
    repairs: Option<Arc<crate::kvm::FaultRepairs>>,
}

impl Vcpu {
    pub fn new(
        id: u8,
        fd: VcpuFd,
        run_size: usize,
        buses: Arc<SharedBuses>,
        devices: usize,
        control: Arc<RunControl>,
        nested: Option<NestedExits>,
    ) -> Self {
        Vcpu {
            id,
            fd,
            run_size,
            control,
            nested,
            pending: None,
            coalesced_ring: false,
            exits: ExitHandler::new(buses, devices),
            live: None,
            samples: GuestSamples::default(),
            sampling: false,
            stuck: None,
            sleep: None,
            repairs: None,
        }
    }

    /// Has each sample also check whether the guest is stuck (see [`crate::vcpu::stuck`]).
    pub fn watch_for_stuck(&mut self, watch: StuckWatch) {
        self.stuck = Some(watch);
    }

    /// Records where each kick finds the guest (`--sample-guest`).
    pub fn sample_guest(&mut self) {
        self.sampling = true;
    }

    /// Lets the guest sleep in S3 (see [`crate::machine::sleep`]).
    pub fn sleep_with(&mut self, sleep: Arc<dyn Suspend>) {
        self.sleep = Some(sleep);
    }

    /// Consults `repairs` when KVM_RUN fails with EFAULT before giving up.
    pub fn repair_faults_with(&mut self, repairs: Arc<crate::kvm::FaultRepairs>) {
        self.repairs = Some(repairs);
    }

    /// Publishes this vCPU's counters to `live` as it runs (see [`LiveStats`]).
    pub fn publish_to(&mut self, live: Arc<LiveStats>) {
        self.live = Some((live, 0));
    }

    fn publish(&mut self, force: bool) {
        if let Some((live, next)) = &mut self.live {
            // The exit just handled already read the TSC: no second read on every exit.
            let now = self.pending.map_or_else(cycles, |(_, returned)| returned);
            if (force || now >= *next) && live.publish(usize::from(self.id), &self.exits.stats) {
                *next = now + LiveStats::PERIOD_CYCLES;
            }
        }
    }

    pub fn id(&self) -> u8 {
        self.id
    }

    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// Maps KVM's coalesced MMIO/PIO ring (once); from then on every exit drains it first.
    pub fn enable_coalesced_ring(&mut self) -> Result<(), kvm_ioctls::Error> {
        self.fd.map_coalesced_mmio_ring()?;
        self.coalesced_ring = true;
        Ok(())
    }

    /// Drains the ring one last time and stops looking at it on every exit (once no
    /// coalesced zone is registered, nothing new arrives there).
    pub fn disable_coalesced_ring(&mut self) {
        self.drain_coalesced();
        self.coalesced_ring = false;
    }

    /// Forgets the exit being handled, so it is not booked (the lab starts a clean window).
    pub fn discard_pending(&mut self) {
        self.pending = None;
    }

    /// Lets kicks of the calling thread reach this vCPU through `immediate_exit`
    /// ([`watchdog::bind_kicks`]); until [`Vcpu::unbind_kicks`] the vCPU must stay on it.
    pub fn bind_kicks(&mut self) {
        kick::bind_kicks(self.fd.get_kvm_run());
    }

    pub fn unbind_kicks(&mut self) {
        kick::bind_kicks(std::ptr::null_mut());
    }

    /// Runs until the guest exits or the VMM stops it.
    pub fn run(&mut self) -> Result<(), VcpuError> {
        self.bind_kicks();
        let result = loop {
            match self.step() {
                Ok(Step::Continue) => self.publish(false),
                Ok(Step::Stopped) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.unbind_kicks();
        self.publish(true);
        result
    }

    /// One `KVM_RUN` and the handling of the exit it returns.
    #[inline]
    pub fn step(&mut self) -> Result<Step, VcpuError> {
        self.step_filtered(|_| false)
    }

    /// Like [`Vcpu::step`], but exits for which `consume` returns true go straight back into
    /// the guest, with no accounting and no bus: the lab's floor for a userspace exit.
    #[inline]
    pub fn step_filtered(&mut self, mut consume: impl FnMut(&VcpuExit) -> bool) -> Result<Step, VcpuError> {
        if self.control.needs_attention() && self.stop_or_park()? {
            return Ok(Step::Stopped);
        }
        self.book_pending();
        let mut exit = self.fd.run();
        while matches!(&exit, Ok(e) if consume(e)) {
            exit = self.fd.run();
        }
        let returned = cycles();
        // After the exit, not before the entry: another vCPU may have moved a BAR while
        // this one was in the guest, and the access must meet the layout of its time.
        self.exits.refresh();
        // Writes KVM queued in the coalesced ring happened before this exit: hand them to
        // the devices first (an MMIO arm only binds the exit's data when there are none).
        let coalesced = self.coalesced_ring;
        let kind = match exit {
            Ok(VcpuExit::IoIn(..)) => {
                self.drain_coalesced();
                self.pio();
                ExitKind::IoIn
            }
            Ok(VcpuExit::IoOut(..)) => {
                self.drain_coalesced();
                self.pio();
                ExitKind::IoOut
            }
            Ok(VcpuExit::MmioRead(addr, data)) if !coalesced => {
                self.exits.mmio(addr, Access::Read(data));
                ExitKind::MmioRead
            }
            Ok(VcpuExit::MmioWrite(addr, data)) if !coalesced => {
                self.exits.mmio(addr, Access::Write(data));
                ExitKind::MmioWrite
            }
            Ok(VcpuExit::MmioRead(..) | VcpuExit::MmioWrite(..)) => {
                self.drain_coalesced();
                self.mmio_from_run()
            }
            // Everything else is rare: kept out of line so the hot arms above stay compact.
            other => {
                let rare = RareExit::from(other);
                self.rare_exit(rare)?
            }
        };
        self.pending = Some((kind, returned));
        if self.control.should_stop() {
            self.book_pending();
            return Ok(Step::Stopped);
        }
        Ok(Step::Continue)
    }

    /// Stops (true), or waits out a pause or an S3 sleep and goes on (false unless
    /// stopped meanwhile).
    #[cold]
    fn stop_or_park(&mut self) -> Result<bool, VcpuError> {
        self.book_pending();
        if !self.control.should_stop() {
            self.publish(true);
            match &self.sleep {
                Some(sleep) if self.control.is_suspended() => {
                    let sleep = sleep.clone();
                    sleep.sleep(self.id, &mut self.fd, &self.control).map_err(|why| self.fault(&why))?;
                }
                _ => {
                    let (id, fd) = (self.id, &self.fd);
                    let mut read = |msrs: &[u32]| fd.save((id, msrs)).map_err(|e| e.to_string());
                    self.control.park_serving(None, Some((id, &mut read)));
                }
            }
        }
        Ok(self.control.should_stop())
    }

    /// Books the previous exit: VMM time ends as we go back into the guest.
    #[inline]
    fn book_pending(&mut self) {
        if let Some((kind, since)) = self.pending.take() {
            self.exits.stats.record(kind, cycles().saturating_sub(since));
        }
    }

    /// Port I/O, read from `kvm_run` directly because kvm-ioctls folds `size * count` into one
    /// slice: a `rep outs`/`ins` is split here into one bus access per element.
    #[inline]
    fn pio(&mut self) {
        let run: *mut kvm_run = self.fd.get_kvm_run();
        // SAFETY: the exit reason is KVM_EXIT_IO, so `io` is the live union member.
        let io = unsafe { (*run).__bindgen_anon_1.io };
        let (size, count, offset) = (usize::from(io.size), io.count as usize, io.data_offset as usize);
        let len = size * count;
        if size == 0 || offset.checked_add(len).is_none_or(|end| end > self.run_size) {
            tracing::error!("KVM reported port I/O data outside the kvm_run page; ignored");
            return;
        }
        // SAFETY: KVM placed `len` bytes at `data_offset` inside the `run_size`-byte kvm_run
        // mapping (checked above), which lives as long as `self.fd`; nothing else aliases it now.
        let data = unsafe { std::slice::from_raw_parts_mut((run as *mut u8).add(offset), len) };
        let write = u32::from(io.direction) == KVM_EXIT_IO_OUT;
        if count == 1 {
            // The common case: one plain in/out, no loop.
            return self.exits.pio(io.port, if write { Access::Write(data) } else { Access::Read(data) });
        }
        for element in data.chunks_exact_mut(size) {
            let access = if write { Access::Write(&*element) } else { Access::Read(element) };
            self.exits.pio(io.port, access);
        }
    }

    /// An MMIO exit read back from `kvm_run` (after the coalesced ring was drained).
    fn mmio_from_run(&mut self) -> ExitKind {
        // SAFETY: the exit reason is KVM_EXIT_MMIO, so `mmio` is the live union member.
        let mmio = unsafe { &mut self.fd.get_kvm_run().__bindgen_anon_1.mmio };
        let len = (mmio.len as usize).min(mmio.data.len());
        if mmio.is_write != 0 {
            self.exits.mmio(mmio.phys_addr, Access::Write(&mmio.data[..len]));
            ExitKind::MmioWrite
        } else {
            self.exits.mmio(mmio.phys_addr, Access::Read(&mut mmio.data[..len]));
            ExitKind::MmioRead
        }
    }

    /// Hands the writes KVM queued in its coalesced ring to the buses, oldest first.
    #[inline]
    fn drain_coalesced(&mut self) {
        if !self.coalesced_ring {
            return;
        }
        while let Ok(Some(entry)) = self.fd.coalesced_mmio_read() {
            let data = &entry.data[..(entry.len as usize).min(entry.data.len())];
            // SAFETY: `pio` shares its union with padding only; every bit pattern is a valid u32.
            if unsafe { entry.__bindgen_anon_1.pio } != 0 {
                self.exits.pio(entry.phys_addr as u16, Access::Write(data));
            } else {
                self.exits.mmio(entry.phys_addr, Access::Write(data));
            }
        }
    }

    /// Interrupted runs continue; everything else ends the run with the registers.
    #[cold]
    #[inline(never)]
    fn rare_exit(&mut self, exit: RareExit) -> Result<ExitKind, VcpuError> {
        let what = match exit {
            RareExit::Kicked => {
                // The kick set immediate_exit (or found the vCPU in KVM_RUN): clear it, or
                // every KVM_RUN would return at once.
                self.fd.set_kvm_immediate_exit(0);
                // A kick with neither stop nor pause raised is the sampler's.
                if !self.control.needs_attention() {
                    if let Ok(regs) = self.fd.get_regs() {
                        let stats = &mut self.exits.stats;
                        if self.nested.as_ref().is_some_and(|n| n.answer_hypercall(&self.fd, &regs, stats)) {
                            return Ok(ExitKind::Intr);
                        }
                        if self.sampling {
                            self.samples.record(regs.rip);
                        }
                        if let Some(watch) = &mut self.stuck {
                            // Halted, or waiting for INIT/SIPI: idle, not spinning.
                            let running = self.fd.get_mp_state().map_or(true, |s| s.mp_state == KVM_MP_STATE_RUNNABLE);
                            let state = running.then(|| crate::vcpu::stuck::register_file(&regs));
                            if let Some(why) = watch.sample(usize::from(self.id), state, Instant::now()) {
                                return Err(self.fault(&why));
                            }
                        }
                    }
                }
                return Ok(ExitKind::Intr);
            }
            // A memory slot's host pages gone (a pmem file truncated): mended, the guest goes
            // on; otherwise the run ends.
            RareExit::RunFailed(e)
                if e.errno() == libc::EFAULT && self.repairs.as_ref().is_some_and(|r| r.repair_any()) =>
            {
                return Ok(ExitKind::Intr)
            }
            RareExit::RunFailed(e) => return Err(VcpuError::Run(self.id, e)),
            RareExit::Hlt => "halted with no way to wake up (HLT exit)".to_string(),
            RareExit::Shutdown => "shutdown: a triple fault, or an exception it could not deliver".to_string(),
            RareExit::FailEntry(reason, cpu) => {
                format!("KVM could not enter the guest (hardware reason {reason:#x}, cpu {cpu})")
            }
            RareExit::InternalError => {
                // SAFETY: the exit reason is KVM_EXIT_INTERNAL_ERROR, so `internal` is the live union member.
                let suberror = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal.suberror };
                if suberror != EMULATION_FAILED {
                    format!("KVM internal error, suberror {suberror} (2: simultaneous exceptions)")
                } else {
                    return self.host_exit(HostExit::EmulationFailed);
                }
            }
            RareExit::SystemEvent(SYSTEM_EVENT_SHUTDOWN) => {
                self.control.guest_stop(GuestStop::PowerOff);
                return Ok(ExitKind::SystemEvent);
            }
            RareExit::SystemEvent(SYSTEM_EVENT_RESET) => {
                self.control.guest_stop(GuestStop::Reset);
                return Ok(ExitKind::SystemEvent);
            }
            RareExit::SystemEvent(event) => format!("system event {event} (3: crash)"),
            RareExit::Host(exit) => return self.host_exit(exit),
            RareExit::Unexpected(what) => format!("unexpected exit {what}"),
        };
        Err(self.fault(&what))
    }

    /// An exit the nested host profile handles; on a native host, a fault.
    #[cold]
    fn host_exit(&mut self, exit: HostExit) -> Result<ExitKind, VcpuError> {
        let Some(nested) = self.nested.as_mut() else {
            let what = format!("{exit:?}, which only a nested host produces (--host-profile native handles none)");
            return Err(self.fault(&what));
        };
        match nested.handle(exit, &mut self.fd, &mut self.exits.stats) {
            Ok(()) => Ok(exit.kind()),
            Err(why) => Err(self.fault(&why)),
        }
    }

    fn fault(&self, what: &str) -> VcpuError {
        VcpuError::GuestFault { vcpu: self.id, what: what.to_string(), regs: self.dump_registers() }
    }

    /// The registers, for an error message.
    pub fn dump_registers(&self) -> String {
        let (Ok(r), Ok(s)) = (self.fd.get_regs(), self.fd.get_sregs()) else {
            return "  (registers unavailable)".into();
        };
        format!(
            "  rip={:#018x} rsp={:#018x} rflags={:#010x} cs={:#06x} (cpl {})\n  \
             rax={:#018x} rbx={:#018x} rcx={:#018x} rdx={:#018x}\n  \
             rsi={:#018x} rdi={:#018x} rbp={:#018x} r8={:#018x}\n  \
             cr0={:#010x} cr2={:#018x} cr3={:#010x} cr4={:#010x} efer={:#x}",
            r.rip,
            r.rsp,
            r.rflags,
            s.cs.selector,
            s.cs.selector & 3,
            r.rax,
            r.rbx,
            r.rcx,
            r.rdx,
            r.rsi,
            r.rdi,
            r.rbp,
            r.r8,
            s.cr0,
            s.cr2,
            s.cr3,
            s.cr4,
            s.efer
        )
    }
}
