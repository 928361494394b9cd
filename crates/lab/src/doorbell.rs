//! Doorbell lab: the same guest write delivered eleven ways, measured side by side.
//!
//! One VM per repeat runs every path in turn (the order rotates between repeats); the
//! guest announces each step on the lab control port, and this loop, which owns the
//! vCPU, wires the doorbell for that path before the guest starts ringing. Medians over
//! the repeats are reported.

use crate::chart;
use crate::control::{drive, guest_tsc_khz, lab_machine, LabEvent, LabMachine, LabSteps};
use crate::devices::doorbell::{Doorbell, EventfdWorker};
use crate::report::{targets_json, targets_text, Outputs, Target, WriteError};
use crate::stats::median;
use exitless_payloads::abi::*;
use exitless_vmm::guest_memory::GuestMemoryMmap;
use exitless_vmm::ioeventfd::IoeventfdKey;
use exitless_vmm::machine::{read_result, shared_slot};
use exitless_vmm::poll::PollMode;
use exitless_vmm::stats::ExitKind;
use exitless_vmm::vcpu::{Step, Vcpu, VcpuError};
use exitless_vmm::{Machine, MachineError};
use kvm_ioctls::{Cap, IoEventAddress, VcpuExit};
use serde_json::json;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::Bytes;
use vmm_sys_util::eventfd::EventFd;

/// How a ring reaches the doorbell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wiring {
    /// A bare `KVM_RUN` loop that only compares the port: the floor for any userspace exit.
    RawFloor,
    /// An ioeventfd that no one reads (counted once at the end): the floor for any
    /// ioeventfd path, and what QEMU's pci-testdev costs.
    RawFloorIoeventfd,
    /// A heavyweight exit, handled by the VMM's bus.
    Userspace,
    /// KVM signals an eventfd; the doorbell's device thread reads it.
    Ioeventfd { len: u8, datamatch: Option<u64> },
    /// KVM appends the write to its coalesced ring; the VMM drains it on the next exit.
    Coalesced,
    /// An exit KVM handles itself (cpuid): the patch's hypercall row.
    InKernel,
    /// Shared memory and a host thread spinning on it: no exit at all.
    Polled,
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct DoorbellPath {
    pub name: &'static str,
    kind: u64,
    size: u8,
    value: u64,
    pub wiring: Wiring,
    /// Userspace exits per ring this path must cost (a KVM-rule check), if fixed.
    pub expect_exits_per_ring: Option<f64>,
    /// The device thread polls after work (adaptive window, crate::poll), instead of
    /// sleeping at once.
    pub poll: bool,
}

const DATAMATCH: u64 = 0x5eed_f00d;
const DATAMATCH64: u64 = 0xfeed_face_0000_0001;

const fn path(name: &'static str, kind: u64, size: u8, value: u64, wiring: Wiring) -> DoorbellPath {
    DoorbellPath { name, kind, size, value, wiring, expect_exits_per_ring: None, poll: false }
}

/// An ioeventfd path whose device thread polls with the adaptive window.
const fn polled_eventfd(name: &'static str, kind: u64) -> DoorbellPath {
    let wiring = Wiring::Ioeventfd { len: 4, datamatch: None };
    DoorbellPath { name, kind, size: 4, value: 1, wiring, expect_exits_per_ring: None, poll: true }
}

const fn check(name: &'static str, kind: u64, size: u8, value: u64, wiring: Wiring, exits: f64) -> DoorbellPath {
    DoorbellPath { name, kind, size, value, wiring, expect_exits_per_ring: Some(exits), poll: false }
}

/// The published table's paths, in its order.
pub const PATHS: &[DoorbellPath] = &[
    path("raw-floor-pio", RING_PIO, 4, 1, Wiring::RawFloor),
    path("raw-floor-ioeventfd", RING_PIO, 4, 1, Wiring::RawFloorIoeventfd),
    path("userspace-pio", RING_PIO, 4, 1, Wiring::Userspace),
    path("userspace-mmio", RING_MMIO, 4, 1, Wiring::Userspace),
    path("ioeventfd-pio", RING_PIO, 4, 1, Wiring::Ioeventfd { len: 4, datamatch: None }),
    polled_eventfd("ioeventfd-pio-poll", RING_PIO),
    path("ioeventfd-pio-datamatch", RING_PIO, 4, DATAMATCH, Wiring::Ioeventfd { len: 4, datamatch: Some(DATAMATCH) }),
    path("ioeventfd-mmio", RING_MMIO, 4, 1, Wiring::Ioeventfd { len: 4, datamatch: None }),
    polled_eventfd("ioeventfd-mmio-poll", RING_MMIO),
    path("ioeventfd-mmio-fast", RING_MMIO, 4, 1, Wiring::Ioeventfd { len: 0, datamatch: None }),
    path("coalesced-pio", RING_PIO, 4, 1, Wiring::Coalesced),
    path("coalesced-mmio", RING_MMIO, 4, 1, Wiring::Coalesced),
    path("inkernel-floor", RING_CPUID, 0, 0, Wiring::InKernel),
    path("polled", RING_POLL, 8, 0, Wiring::Polled),
];

/// KVM-rule checks, run on request (`--paths`) and by the tests: a write of the wrong size
/// or value must take the userspace exit; a 64-bit datamatch must not.
pub const CHECK_PATHS: &[DoorbellPath] = &[
    check("check-pio-wrong-size", RING_PIO, 1, 1, Wiring::Ioeventfd { len: 4, datamatch: None }, 1.0),
    check("check-mmio-wrong-size", RING_MMIO, 8, 1, Wiring::Ioeventfd { len: 4, datamatch: None }, 1.0),
    check(
        "check-pio-datamatch-miss",
        RING_PIO,
        4,
        DATAMATCH + 1,
        Wiring::Ioeventfd { len: 4, datamatch: Some(DATAMATCH) },
        1.0,
    ),
    check(
        "check-mmio-datamatch64",
        RING_MMIO,
        8,
        DATAMATCH64,
        Wiring::Ioeventfd { len: 8, datamatch: Some(DATAMATCH64) },
        0.0,
    ),
];

pub fn find_path(name: &str) -> Option<&'static DoorbellPath> {
    PATHS.iter().chain(CHECK_PATHS).find(|p| p.name == name)
}

pub struct Options {
    pub iters: u64,
    pub repeat: u32,
    pub cpl: u8,
    pub paths: Vec<&'static DoorbellPath>,
    pub outputs: Outputs,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum DoorbellError {
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Ioeventfd(#[from] exitless_vmm::ioeventfd::IoeventfdError),
    #[error("{what} failed")]
    Kvm { what: &'static str, source: kvm_ioctls::Error },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("the doorbell guest announced step {0}, which the lab did not list")]
    UnknownStep(usize),
    #[error("the doorbell guest finished without measuring {0}")]
    Missing(&'static str),
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// One path measured once.
#[derive(Clone, Copy, Debug)]
struct Sample {
    guest_cycles: u64,
    exits: u64,
    vmm_cycles_median: Option<f64>,
    count: u64,
    /// Share of a host core the poller used (polled path only).
    poller_cpu: Option<f64>,
}

/// A row of the result: medians over the repeats.
#[derive(Clone, Debug)]
pub struct Row {
    pub path: &'static DoorbellPath,
    pub iops: f64,
    /// Guest time per ring: a one-way write for every path but `polled`, which waits for
    /// the host's echo.
    pub us_per_ring: f64,
    pub exits_per_op: f64,
    pub vmm_ns_per_exit: Option<f64>,
    pub rings: u64,
    pub count_ok: bool,
    pub speedup: f64,
    /// Host CPU the path burns besides the vCPU, in percent of a core (the poller's).
    pub host_cpu_pct: Option<f64>,
}

/// What a path's wiring holds while it is live.
enum Live {
    Nothing,
    /// The eventfd, and the device thread's CPU time when the path began.
    Eventfd(IoeventfdKey, Arc<EventFd>, Option<Duration>),
    /// Registered with KVM, read by no one until the end.
    Unread(IoeventfdKey, EventFd),
    Coalesced(IoEventAddress, u32),
    /// The poller's stop flag and thread, which returns the share of a core it used.
    Poller(Arc<AtomicBool>, std::thread::JoinHandle<f64>),
}

fn ring_address(path: &DoorbellPath) -> u64 {
    if path.kind == RING_MMIO {
        DOORBELL_MMIO_GPA
    } else {
        DOORBELL_PIO_PORT
    }
}

/// The doorbell, its device thread and the live wiring.
struct Bench {
    bell: Arc<Doorbell>,
    worker: EventfdWorker,
    live: Live,
    /// When the live path was wired.
    began: Option<Instant>,
}

fn ioeventfd_key(path: &DoorbellPath, len: u8, datamatch: Option<u64>) -> IoeventfdKey {
    let addr = ring_address(path);
    if path.kind == RING_MMIO {
        IoeventfdKey::mmio(addr, len, datamatch)
    } else {
        IoeventfdKey::pio(addr as u16, len, datamatch)
    }
}

impl Bench {
    fn begin(&mut self, machine: &Machine, path: &DoorbellPath, vcpu: &mut Vcpu) -> Result<(), DoorbellError> {
        let mem = &machine.memory();
        for (i, v) in [path.kind, u64::from(path.size), ring_address(path), path.value].into_iter().enumerate() {
            mem.write_obj(v, shared_slot(LAB_SPEC_SLOT + i as u64)).map_err(std::io::Error::other)?;
        }
        for s in [POLL_SEQ_SLOT, POLL_ACK_SLOT] {
            mem.write_obj(0u64, shared_slot(s)).map_err(std::io::Error::other)?;
        }
        let addr = ring_address(path);
        self.live = match path.wiring {
            Wiring::Ioeventfd { len, datamatch } => {
                let key = ioeventfd_key(path, len, datamatch);
                let fd = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
                machine.devices().ioeventfds().register(key, &fd)?;
                self.worker.poll_mode.set(if path.poll { PollMode::Adaptive } else { PollMode::Off });
                self.worker.watch(&fd)?;
                self.bell.attach(fd.clone());
                Live::Eventfd(key, fd, self.worker.cpu_time())
            }
            Wiring::RawFloorIoeventfd => {
                let key = ioeventfd_key(path, 4, None);
                let fd = EventFd::new(libc::EFD_NONBLOCK)?;
                machine.devices().ioeventfds().register(key, &fd)?;
                Live::Unread(key, fd)
            }
            Wiring::Coalesced => {
                let zone = if path.kind == RING_MMIO { IoEventAddress::Mmio(addr) } else { IoEventAddress::Pio(addr) };
                let kvm_err = |source| DoorbellError::Kvm { what: "KVM_REGISTER_COALESCED_MMIO", source };
                machine.vm().register_coalesced_mmio(zone, u32::from(path.size)).map_err(kvm_err)?;
                vcpu.enable_coalesced_ring()
                    .map_err(|source| DoorbellError::Kvm { what: "mapping the coalesced ring", source })?;
                Live::Coalesced(zone, u32::from(path.size))
            }
            Wiring::Polled => {
                let stop = Arc::new(AtomicBool::new(false));
                let thread = spawn_poller(machine.memory().clone(), self.bell.clone(), stop.clone())?;
                Live::Poller(stop, thread)
            }
            Wiring::RawFloor | Wiring::Userspace | Wiring::InKernel => Live::Nothing,
        };
        self.began = Some(Instant::now());
        self.bell.reset();
        Ok(())
    }

    /// Unwires the path; returns the host CPU share its poller used, for the polled path.
    fn end(&mut self, machine: &Machine, vcpu: &mut Vcpu) -> Result<Option<f64>, DoorbellError> {
        match std::mem::replace(&mut self.live, Live::Nothing) {
            Live::Nothing => {}
            Live::Eventfd(key, fd, cpu_at_begin) => {
                machine.devices().ioeventfds().unregister(key)?;
                self.worker.unwatch(&fd)?;
                self.bell.detach(&fd);
                // The device thread's CPU over the path, for the polling rows.
                if let (Some(begin), Some(now), Some(wall)) = (cpu_at_begin, self.worker.cpu_time(), self.began) {
                    return Ok(Some((now - begin).as_secs_f64() / wall.elapsed().as_secs_f64().max(1e-9)));
                }
            }
            Live::Unread(key, fd) => {
                machine.devices().ioeventfds().unregister(key)?;
                self.bell.ring(fd.read().unwrap_or(0));
            }
            Live::Coalesced(zone, size) => {
                let kvm_err = |source| DoorbellError::Kvm { what: "KVM_UNREGISTER_COALESCED_MMIO", source };
                machine.vm().unregister_coalesced_mmio(zone, size).map_err(kvm_err)?;
                vcpu.disable_coalesced_ring();
            }
            Live::Poller(stop, thread) => {
                stop.store(true, Ordering::Release);
                return Ok(thread.join().ok());
            }
        }
        Ok(None)
    }
}

/// The calling thread's CPU time.
fn own_cpu_time() -> Duration {
    // SAFETY: a zeroed timespec is valid for clock_gettime to fill.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The polled wiring's host thread: spins on the guest's sequence number and echoes it;
/// returns the share of a host core it used while it ran (it spins: about 1.0).
fn spawn_poller(
    mem: GuestMemoryMmap,
    bell: Arc<Doorbell>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<f64>> {
    let (seq_at, ack_at) = (shared_slot(POLL_SEQ_SLOT), shared_slot(POLL_ACK_SLOT));
    std::thread::Builder::new().name("poller".into()).spawn(move || {
        exitless_vmm::seccomp::confine_or_log(exitless_vmm::seccomp::ThreadKind::Helper);
        let (wall, cpu) = (Instant::now(), own_cpu_time());
        let mut last = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let seq: u64 = mem.load(seq_at, Ordering::Acquire).unwrap_or(last);
            if seq != last {
                bell.ring(seq.wrapping_sub(last));
                last = seq;
                let _ = mem.store(seq, ack_at, Ordering::Release);
            } else {
                std::hint::spin_loop();
            }
        }
        (own_cpu_time() - cpu).as_secs_f64() / wall.elapsed().as_secs_f64().max(1e-9)
    })
}

/// The doorbell lab's side of one guest run.
struct DoorbellSteps<'a> {
    paths: &'a [&'static DoorbellPath],
    bench: Bench,
    samples: Vec<Option<Sample>>,
    raw: bool,
    raw_rings: u64,
}

impl LabSteps for DoorbellSteps<'_> {
    type Error = DoorbellError;

    fn step(&mut self, vcpu: &mut Vcpu) -> Result<Step, VcpuError> {
        if !self.raw {
            return vcpu.step();
        }
        // The floor: nothing between two KVM_RUNs but a port compare.
        let rings = &mut self.raw_rings;
        vcpu.step_filtered(|e| {
            let hit = matches!(e, VcpuExit::IoOut(p, _) if u64::from(*p) == DOORBELL_PIO_PORT);
            *rings += u64::from(hit);
            hit
        })
    }

    fn on_event(&mut self, machine: &Machine, vcpu: &mut Vcpu, event: LabEvent) -> Result<(), DoorbellError> {
        match event {
            LabEvent::Begin(i) => {
                let path = self.paths.get(i).ok_or(DoorbellError::UnknownStep(i))?;
                self.bench.begin(machine, path, vcpu)?;
                (self.raw, self.raw_rings) = (path.wiring == Wiring::RawFloor, 0);
                vcpu.exits.stats.reset();
                vcpu.discard_pending();
            }
            LabEvent::End(i) => {
                let stats = &vcpu.exits.stats;
                let ring_kinds = [ExitKind::IoOut, ExitKind::MmioWrite];
                let exits = ring_kinds.iter().map(|&k| stats.exits(k)).sum::<u64>() + self.raw_rings;
                let vmm_cycles_median = stats.median_cycles(&ring_kinds);
                let poller_cpu = self.bench.end(machine, vcpu)?;
                self.bench.bell.ring(self.raw_rings);
                self.raw = false;
                let guest_cycles = read_result(machine.memory(), 0);
                let count = self.bench.bell.count();
                let slot = self.samples.get_mut(i).ok_or(DoorbellError::UnknownStep(i))?;
                *slot = Some(Sample { guest_cycles, exits, vmm_cycles_median, count, poller_cpu });
            }
            LabEvent::Mark(_) => {}
        }
        Ok(())
    }
}

/// Boots the doorbell guest once and measures `paths` in that order.
fn run_vm(paths: &[&'static DoorbellPath], opts: &Options) -> Result<Vec<Sample>, DoorbellError> {
    let params = vec![opts.iters, u64::from(opts.cpl) + 1, paths.len() as u64];
    let LabMachine { machine, control, doorbell } = lab_machine("doorbell", params, |_| {})?;
    let bell = doorbell.clone();
    let worker = EventfdWorker::spawn(bell.clone(), PollMode::Off)?;
    let bench = Bench { worker, bell, live: Live::Nothing, began: None };
    let mut lab = DoorbellSteps { paths, bench, samples: vec![None; paths.len()], raw: false, raw_rings: 0 };
    drive(&machine, &control, opts.timeout, &mut lab)?;
    paths.iter().zip(lab.samples).map(|(p, s)| s.ok_or(DoorbellError::Missing(p.name))).collect()
}

/// Runs every path `repeat` times, interleaved, and returns the median rows.
pub fn measure(opts: &Options) -> Result<(Vec<Row>, f64), DoorbellError> {
    let kvm = exitless_vmm::kvm::open().map_err(MachineError::from)?;
    let coalesced = kvm.check_extension(Cap::CoalescedMmio);
    let coalesced_pio = kvm.check_extension(Cap::CoalescedPio);
    let paths: Vec<&'static DoorbellPath> = opts
        .paths
        .iter()
        .copied()
        .filter(|p| {
            let ok = p.wiring != Wiring::Coalesced || if p.kind == RING_PIO { coalesced_pio } else { coalesced };
            if !ok {
                eprintln!("doorbell: skipping {}: KVM lacks the coalesced capability", p.name);
            }
            ok
        })
        .collect();
    let tsc_khz = f64::from(guest_tsc_khz()?);
    let progress = std::io::stderr().is_terminal();
    let mut all: Vec<Vec<Sample>> = vec![Vec::new(); paths.len()];
    for r in 0..opts.repeat as usize {
        if progress {
            eprint!("\rdoorbell: repeat {}/{} ...", r + 1, opts.repeat);
        }
        let order: Vec<usize> = (0..paths.len()).map(|i| (i + r) % paths.len()).collect();
        let ordered: Vec<_> = order.iter().map(|&i| paths[i]).collect();
        for (sample, &i) in run_vm(&ordered, opts)?.into_iter().zip(&order) {
            all[i].push(sample);
        }
    }
    if progress {
        eprint!("\r\x1b[K");
    }
    let mut rows: Vec<Row> = paths
        .iter()
        .zip(&all)
        .map(|(path, samples)| {
            let secs: Vec<f64> = samples.iter().map(|s| s.guest_cycles as f64 / (tsc_khz * 1e3)).collect();
            let seconds = median(&secs);
            let iops = opts.iters as f64 / seconds;
            let exits: Vec<f64> = samples.iter().map(|s| s.exits as f64 / opts.iters as f64).collect();
            let vmm: Vec<f64> = samples.iter().filter_map(|s| s.vmm_cycles_median).map(|c| c * 1e6 / tsc_khz).collect();
            let cpu: Vec<f64> = samples.iter().filter_map(|s| s.poller_cpu).map(|c| c * 100.0).collect();
            Row {
                path,
                iops,
                us_per_ring: 1e6 / iops,
                exits_per_op: median(&exits),
                vmm_ns_per_exit: (!vmm.is_empty()).then(|| median(&vmm)),
                rings: opts.iters,
                count_ok: samples.iter().all(|s| path.kind == RING_CPUID || s.count == opts.iters),
                speedup: f64::NAN,
                host_cpu_pct: (!cpu.is_empty()).then(|| median(&cpu)),
            }
        })
        .collect();
    let base = rows.iter().find(|r| r.path.name == "userspace-mmio").map(|r| r.iops);
    for row in &mut rows {
        row.speedup = base.map_or(f64::NAN, |b| row.iops / b);
    }
    Ok((rows, tsc_khz))
}

fn row_named<'a>(rows: &'a [Row], name: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.path.name == name)
}

/// The targets.
pub fn targets(rows: &[Row]) -> Vec<Target> {
    let mut out = Vec::new();
    let (us, raw, ioe, polled) = (
        row_named(rows, "userspace-pio"),
        row_named(rows, "raw-floor-pio"),
        row_named(rows, "ioeventfd-pio"),
        row_named(rows, "polled"),
    );
    if let (Some(us), Some(ioe)) = (us, ioe) {
        let x = ioe.iops / us.iops;
        out.push(Target::new("ioeventfd-pio iops >= 3x userspace-pio", format!("{x:.2}x"), x >= 3.0));
    }
    if let (Some(us), Some(raw)) = (us, raw) {
        let x = us.us_per_ring / raw.us_per_ring;
        out.push(Target::new("userspace-pio us/ring <= 1.03x raw-floor-pio", format!("{x:.3}x"), x <= 1.03));
    }
    if let (Some(poll), Some(floor)) = (row_named(rows, "ioeventfd-pio-poll"), row_named(rows, "raw-floor-ioeventfd")) {
        let x = poll.us_per_ring / floor.us_per_ring;
        out.push(Target::new("ioeventfd-pio-poll us/ring <= 1.05x raw-floor-ioeventfd", format!("{x:.3}x"), x <= 1.05));
    }
    if let Some(ns) = us.and_then(|u| u.vmm_ns_per_exit) {
        out.push(Target::new("VMM time per userspace-pio exit < 150 ns", format!("{ns:.0} ns"), ns < 150.0));
    }
    if let (Some(us), Some(p)) = (us, polled) {
        let x = p.iops / us.iops;
        out.push(Target::new("polled iops >= 100x userspace-pio", format!("{x:.0}x"), x >= 100.0));
    }
    let bad: Vec<_> = rows.iter().filter(|r| !r.count_ok).map(|r| r.path.name).collect();
    out.push(Target::new(
        "every row count_ok",
        if bad.is_empty() { "all".into() } else { bad.join(",") },
        bad.is_empty(),
    ));
    for r in rows {
        if let Some(want) = r.path.expect_exits_per_ring {
            let ok = (r.exits_per_op - want).abs() < 0.01;
            out.push(Target::new(
                format!("{} exits per ring = {want}", r.path.name),
                format!("{:.3}", r.exits_per_op),
                ok,
            ));
        }
    }
    out
}

pub fn table(rows: &[Row], opts: &Options, tsc_khz: f64) -> String {
    let mut s = format!(
        "doorbell lab: {} rings per path, {} repeats interleaved (medians), guest loop at CPL{}, TSC {:.2} GHz\n",
        opts.iters,
        opts.repeat,
        opts.cpl,
        tsc_khz / 1e6
    );
    s += &format!(
        "{:<26} {:>12} {:>10} {:>12} {:>13} {:>16} {:>13} {:>6}\n",
        "path", "iops", "us/ring", "exits/ring", "vmm ns/exit", "vs userspace-mmio", "host cpu %", "count"
    );
    for r in rows {
        let vmm = r.vmm_ns_per_exit.map_or("-".to_string(), |v| format!("{v:.0}"));
        let speedup = if r.speedup.is_finite() { format!("{:.2}x", r.speedup) } else { "-".into() };
        let cpu = r.host_cpu_pct.map_or("-".to_string(), |c| format!("{c:.0}"));
        s += &format!(
            "{:<26} {:>12.0} {:>10.3} {:>12.3} {:>13} {:>16} {:>13} {:>6}\n",
            r.path.name,
            r.iops,
            r.us_per_ring,
            r.exits_per_op,
            vmm,
            speedup,
            cpu,
            if r.count_ok { "ok" } else { "LOST" }
        );
    }
    s += "us/ring: guest time per doorbell write (one-way; `polled` waits for the host's echo).\n";
    s += "host cpu %: a host core spent besides the vCPU (the polled path's spinning thread, the\n";
    s += "  device thread on the -poll rows). raw-floor-ioeventfd: the eventfd is signalled and never read.\n";
    s + &targets_text(&targets(rows))
}

pub fn json(rows_in: &[Row], opts: &Options, tsc_khz: f64) -> serde_json::Value {
    let rows: Vec<_> = rows_in
        .iter()
        .map(|r| {
            json!({"path": r.path.name, "iops": r.iops, "us_per_ring": r.us_per_ring, "rtt_us": r.us_per_ring,
                   "host_cpu_pct": r.host_cpu_pct, "exits_per_op": r.exits_per_op,
                   "vmm_ns_per_exit": r.vmm_ns_per_exit, "rings": r.rings, "count_ok": r.count_ok,
                   "speedup_vs_userspace_mmio": if r.speedup.is_finite() { json!(r.speedup) } else { json!(null) }})
        })
        .collect();
    let targets = targets_json(&targets(rows_in));
    json!({"bench": "doorbell", "iters": opts.iters, "repeat": opts.repeat, "cpl": opts.cpl,
           "tsc_khz": tsc_khz, "rows": rows, "targets": targets})
}

/// Measures, prints the table, and writes the JSON and SVG files asked for.
pub fn run(opts: &Options) -> Result<Vec<Row>, DoorbellError> {
    opts.outputs.check()?;
    let (rows, tsc_khz) = measure(opts)?;
    crate::report::print_table(&table(&rows, opts, tsc_khz))?;
    opts.outputs.write(
        || json(&rows, opts, tsc_khz),
        || {
            // Grouped by mechanism, a colour per access: port I/O, MMIO, or neither.
            let bars = rows.iter().map(|r| {
                let name = r.path.name;
                let access = ["pio", "mmio"].into_iter().find(|a| name.split('-').any(|w| w == *a));
                let mechanism = name.split('-').filter(|w| Some(*w) != access).collect::<Vec<_>>().join("-");
                (mechanism, access.unwrap_or("no guest access").to_string(), r.iops)
            });
            let title = format!("doorbell: rings per second, CPL{} guest loop", opts.cpl);
            chart::draw(&[chart::Panel::grouped(&title, "rings/s", true, bars)])
        },
    )?;
    Ok(rows)
}
