//! `bench peers`: exitless beside Firecracker and Cloud Hypervisor, the same guests under
//! each, each driven through its own API as its users drive it, interleaved run by run.
//! Start (spawn to API ready, to the `wait` payload's first line) and memory beyond guest
//! RAM for one VM; the same for a fleet of N started at once; and the I/O rows (blkbench
//! and nettx on each VMM's own virtio devices, over virtio-mmio, Firecracker's default, and
//! over PCI, with the userspace exits each request cost). A peer not given is skipped.

pub(crate) mod io;
pub(crate) mod launch;
mod report;

pub use io::IoSample;
pub use launch::memory_beyond_guest;

use launch::{launch, Guest, Running};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the `wait` guest prints once it runs.
const FIRST_LINE: &str = "wait: running";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vmm {
    Exitless,
    Firecracker,
    CloudHypervisor,
}

impl Vmm {
    pub fn name(self) -> &'static str {
        match self {
            Vmm::Exitless => "exitless",
            Vmm::Firecracker => "firecracker",
            Vmm::CloudHypervisor => "cloud-hypervisor",
        }
    }
}

/// The virtio transport of an I/O row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// Firecracker's default (and exitless's in Firecracker's mode).
    #[default]
    Mmio,
    /// Firecracker's and exitless's `--enable-pci`; Cloud Hypervisor's only transport.
    Pci,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Mmio => "mmio",
            Transport::Pci => "pci",
        }
    }
}

pub struct Options {
    pub exitless: PathBuf,
    pub firecracker: Option<PathBuf>,
    pub cloud_hypervisor: Option<PathBuf>,
    pub runs: u32,
    pub mem_mib: u32,
    pub timeout: Duration,
    /// VMs in the fleet rows (0: none).
    pub fleet: u32,
    /// Seconds per I/O run (0: no I/O rows).
    pub io_seconds: f64,
    /// The transports of the I/O rows, in order.
    pub transports: Vec<Transport>,
}

/// One start of one VMM.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub api_ready_ms: f64,
    pub first_line_ms: f64,
    pub rss_kib: u64,
    pub pss_kib: u64,
    pub anon_kib: u64,
}

/// N VMs of one VMM started at once: until the last guest's line, and memory per VM
/// while all run.
#[derive(Clone, Copy, Debug, Default)]
pub struct FleetSample {
    pub all_running_ms: f64,
    pub rss_kib: f64,
    pub pss_kib: f64,
    pub anon_kib: f64,
}

/// One VMM's column.
pub struct Column {
    pub vmm: Vmm,
    pub version: String,
    pub starts: Vec<Sample>,
    pub fleets: Vec<FleetSample>,
    /// Fleet rounds left out, and why (a peer's VM that did not start).
    pub fleet_failed: Vec<String>,
    /// Every I/O run, each with its transport.
    pub blk: Vec<IoSample>,
    pub net: Vec<IoSample>,
    /// Why I/O rows are empty, when they are (one line each).
    pub io_skipped: Vec<String>,
}

pub struct Report {
    pub mem_mib: u32,
    pub fleet: u32,
    pub io_seconds: f64,
    pub transports: Vec<Transport>,
    pub columns: Vec<Column>,
}

#[derive(Debug, thiserror::Error)]
pub enum PeersError {
    #[error("cannot prepare the lab: {0}")]
    Setup(String),
    #[error("{vmm}: {what}")]
    Start { vmm: &'static str, what: String },
}

pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report, PeersError> {
    let dir = std::env::temp_dir().join(format!("exitless-peers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| PeersError::Setup(format!("{}: {e}", dir.display())))?;
    let result = run_in(opts, &dir, progress);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_in(opts: &Options, dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<Report, PeersError> {
    let kernel = dir.join("wait.elf");
    let elf = exitless_payloads::find("wait").map(|p| p.elf).unwrap_or_default();
    std::fs::write(&kernel, elf).map_err(|e| PeersError::Setup(format!("{}: {e}", kernel.display())))?;
    let wait = Guest { kernel, mem_mib: opts.mem_mib, ..Guest::default() };
    let mut vmms = vec![(Vmm::Exitless, opts.exitless.clone())];
    vmms.extend(opts.firecracker.clone().map(|p| (Vmm::Firecracker, p)));
    vmms.extend(opts.cloud_hypervisor.clone().map(|p| (Vmm::CloudHypervisor, p)));
    let mut columns: Vec<Column> = vmms
        .iter()
        .map(|(vmm, exe)| Column {
            vmm: *vmm,
            version: version(*vmm, exe),
            starts: Vec::new(),
            fleets: Vec::new(),
            fleet_failed: Vec::new(),
            blk: Vec::new(),
            net: Vec::new(),
            io_skipped: Vec::new(),
        })
        .collect();
    let fail = |vmm: Vmm| move |what: String| PeersError::Start { vmm: vmm.name(), what };
    let io = if opts.io_seconds > 0.0 { Some(IoSetup::new(dir)?) } else { None };
    for run in 0..opts.runs {
        // Each run starts with the next VMM, so that none always follows another's teardown.
        let order: Vec<usize> = (0..vmms.len()).map(|k| (k + run as usize) % vmms.len()).collect();
        for &i in &order {
            let (column, (vmm, exe)) = (&mut columns[i], &vmms[i]);
            let sample = start_one(*vmm, exe, dir, &wait, opts).map_err(fail(*vmm))?;
            progress(&format!(
                "run {}/{} {}: first line {:.1} ms, {} KiB resident",
                run + 1,
                opts.runs,
                vmm.name(),
                sample.first_line_ms,
                sample.rss_kib
            ));
            column.starts.push(sample);
        }
        if opts.fleet > 0 {
            for &i in &order {
                let (column, (vmm, exe)) = (&mut columns[i], &vmms[i]);
                let sample = match fleet(*vmm, exe, dir, &wait, opts) {
                    Ok(sample) => sample,
                    // A peer's round where a VM did not start (Firecracker's guest, now
                    // and then, never prints on this nested host) is left out and said;
                    // exitless's is a failure of the lab.
                    Err(why) if *vmm != Vmm::Exitless => {
                        progress(&format!("run {}/{} {}: fleet round left out: {why}", run + 1, opts.runs, vmm.name()));
                        column.fleet_failed.push(format!("run {}: {why}", run + 1));
                        continue;
                    }
                    Err(why) => return Err(fail(*vmm)(why)),
                };
                progress(&format!(
                    "run {}/{} {}: {} at once, all running in {:.0} ms, {:.0} KiB proportional each",
                    run + 1,
                    opts.runs,
                    vmm.name(),
                    opts.fleet,
                    sample.all_running_ms,
                    sample.pss_kib
                ));
                column.fleets.push(sample);
            }
        }
        if let Some(io) = &io {
            for &i in &order {
                let (column, (vmm, exe)) = (&mut columns[i], &vmms[i]);
                io_rows(column, *vmm, exe, dir, io, opts, run, progress);
            }
        }
    }
    let transports = opts.transports.clone();
    Ok(Report { mem_mib: opts.mem_mib, fleet: opts.fleet, io_seconds: opts.io_seconds, transports, columns })
}

/// What the I/O rows share: the pattern-filled disk, a tap (when this process may make
/// one) and the TSC's rate (the guests count cycles).
struct IoSetup {
    disk: PathBuf,
    tap: Result<io::Tap, String>,
    tsc_khz: u64,
}

impl IoSetup {
    fn new(dir: &Path) -> Result<Self, PeersError> {
        let disk = io::blk_disk(dir).map_err(PeersError::Setup)?;
        let tsc_khz = crate::control::guest_tsc_khz().map_err(|e| PeersError::Setup(format!("TSC rate: {e}")))?;
        let tap = io::Tap::create(&format!("xlpeer{}", std::process::id() % 10_000));
        Ok(IoSetup { disk, tap, tsc_khz: u64::from(tsc_khz) })
    }
}

/// One blkbench and one nettx run of `vmm` on each transport. A VMM that cannot run one (a
/// peer without the device or the transport) leaves its row empty with the reason, rather
/// than ending the lab.
#[allow(clippy::too_many_arguments)]
fn io_rows(
    column: &mut Column,
    vmm: Vmm,
    exe: &Path,
    dir: &Path,
    io: &IoSetup,
    opts: &Options,
    run: u32,
    progress: &mut dyn FnMut(&str),
) {
    let mut skipped = |why: String| {
        if !column.io_skipped.contains(&why) {
            column.io_skipped.push(why);
        }
    };
    for &transport in &opts.transports {
        let (t, runs) = (transport.name(), opts.runs);
        let exits = |s: &IoSample| s.exits_per_request.map_or(String::new(), |e| format!(", {e:.5} exits per request"));
        match io::blk(vmm, exe, dir, &io.disk, opts, io.tsc_khz, transport) {
            Ok(s) => {
                progress(&format!(
                    "run {}/{runs} {} {t}: blkbench {:.0} IOPS{}",
                    run + 1,
                    vmm.name(),
                    s.per_second,
                    exits(&s)
                ));
                column.blk.push(s);
            }
            Err(e) => skipped(format!("blkbench over {t}: {e}")),
        }
        match &io.tap {
            Ok(tap) => match io::net(vmm, exe, dir, &tap.0, opts, io.tsc_khz, transport) {
                Ok(s) => {
                    let gbps = s.bytes_per_second * 8.0 / 1e9;
                    progress(&format!("run {}/{runs} {} {t}: nettx {gbps:.2} Gb/s{}", run + 1, vmm.name(), exits(&s)));
                    column.net.push(s);
                }
                Err(e) => skipped(format!("nettx over {t}: {e}")),
            },
            Err(e) => skipped(format!("nettx: no tap ({e})")),
        }
    }
}

/// The line of `PATH --version` that names the VMM itself: exitless's first line is the
/// Firecracker version it serves, Firecracker's last is now its exit log line, Cloud
/// Hypervisor's last its migration protocol.
fn version(vmm: Vmm, exe: &Path) -> String {
    let out = std::process::Command::new(exe).arg("--version").stderr(std::process::Stdio::null()).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let own = match vmm {
        Vmm::Exitless => "exitless v",
        Vmm::Firecracker => "firecracker v",
        Vmm::CloudHypervisor => "cloud-hypervisor v",
    };
    let line = text.lines().find(|l| l.to_ascii_lowercase().starts_with(own));
    line.or_else(|| text.lines().find(|l| !l.trim().is_empty())).unwrap_or_default().to_string()
}

/// One VM: spawned, booted, measured once its guest runs, then killed.
fn start_one(vmm: Vmm, exe: &Path, dir: &Path, guest: &Guest, opts: &Options) -> Result<Sample, String> {
    let mut vm = launch(vmm, exe, &dir.join(format!("{}.sock", vmm.name())), guest, opts.timeout)?;
    vm.wait_for(FIRST_LINE, opts.timeout)?;
    let first_line = vm.spawned.elapsed();
    measure(&vm, first_line, guest)
}

fn measure(vm: &Running, first_line: Duration, guest: &Guest) -> Result<Sample, String> {
    let guest_bytes = u64::from(guest.mem_mib) << 20;
    let (rss_kib, pss_kib, anon_kib) = memory_beyond_guest(vm.pid(), guest_bytes).ok_or("cannot read its smaps")?;
    Ok(Sample {
        api_ready_ms: vm.api_ready.as_secs_f64() * 1e3,
        first_line_ms: first_line.as_secs_f64() * 1e3,
        rss_kib,
        pss_kib,
        anon_kib,
    })
}

/// `opts.fleet` VMs of `vmm`, each launched and awaited on a thread of its own; measured
/// when all run, then all killed.
fn fleet(vmm: Vmm, exe: &Path, dir: &Path, guest: &Guest, opts: &Options) -> Result<FleetSample, String> {
    let began = Instant::now();
    let vms: Vec<Result<Running, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..opts.fleet)
            .map(|i| {
                let sock = dir.join(format!("{}-{i}.sock", vmm.name()));
                scope.spawn(move || {
                    let mut vm = launch(vmm, exe, &sock, guest, opts.timeout)?;
                    vm.wait_for(FIRST_LINE, opts.timeout)?;
                    Ok(vm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("its thread panicked".into()))).collect()
    });
    let all_running = began.elapsed();
    let failed: Vec<&String> = vms.iter().filter_map(|vm| vm.as_ref().err()).collect();
    if let Some(first) = failed.first() {
        return Err(format!("{} of {} did not run ({first})", failed.len(), opts.fleet));
    }
    let vms: Vec<Running> = vms.into_iter().collect::<Result<_, _>>()?;
    let samples: Vec<Sample> = vms.iter().map(|vm| measure(vm, all_running, guest)).collect::<Result<_, _>>()?;
    let mean = |f: fn(&Sample) -> u64| samples.iter().map(|s| f(s) as f64).sum::<f64>() / samples.len().max(1) as f64;
    Ok(FleetSample {
        all_running_ms: all_running.as_secs_f64() * 1e3,
        rss_kib: mean(|s| s.rss_kib),
        pss_kib: mean(|s| s.pss_kib),
        anon_kib: mean(|s| s.anon_kib),
    })
}
