//! Block lab: random 4K and sequential 64K reads and writes at queue depth 1 and 32, each
//! through exitless (`blkbench` on virtio-blk) and by the lab process itself on the same
//! file with the same engine (the floor), interleaved, medians. Every block read is
//! checked against its pattern; after every write run a scan of the file checks that
//! what was written is there and nothing else changed.

pub mod guest;
pub mod host;
pub mod limits;
pub mod pattern;

use crate::chart;
use crate::report::{no_row_slower_than_off, targets_json, targets_text, Outputs, Target, WriteError};
use crate::stats::median;
use exitless_vmm::poll::PollMode;
use exitless_vmm::virtio::blk::{Disk, DiskError, DriveConfig};
use exitless_vmm::MachineError;
use serde_json::json;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

pub struct Options {
    /// The file to use; a temporary one in /var/tmp when not given.
    pub file: Option<PathBuf>,
    pub size: u64,
    pub seconds: f64,
    pub repeat: u32,
    /// How long the guest driver polls its used ring before it sleeps for an interrupt.
    pub guest_poll_us: u64,
    /// The device thread's polling modes each guest row is measured with.
    pub polls: Vec<PollMode>,
    /// The rate limits the limit rows hold the guest to: operations and bytes per second.
    pub limit_iops: u64,
    pub limit_bytes: u64,
    pub outputs: Outputs,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum BlkBenchError {
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("cannot prepare {0}")]
    File(PathBuf, #[source] std::io::Error),
    #[error("the guest never announced its {0}")]
    Missing(&'static str),
    #[error("the guest exited with status {0}")]
    Guest(u32),
    #[error(transparent)]
    Write(#[from] WriteError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    RandRead,
    RandWrite,
    SeqRead,
    SeqWrite,
}

impl Workload {
    pub const ALL: [Workload; 4] = [Workload::RandRead, Workload::RandWrite, Workload::SeqRead, Workload::SeqWrite];

    pub fn name(self) -> &'static str {
        match self {
            Workload::RandRead => "randread-4k",
            Workload::RandWrite => "randwrite-4k",
            Workload::SeqRead => "seqread-64k",
            Workload::SeqWrite => "seqwrite-64k",
        }
    }

    /// blkbench's workload parameter.
    pub fn index(self) -> u64 {
        self as u64
    }

    pub fn block(self) -> usize {
        if self.random() {
            4096
        } else {
            65536
        }
    }

    pub fn random(self) -> bool {
        matches!(self, Workload::RandRead | Workload::RandWrite)
    }

    pub fn write(self) -> bool {
        matches!(self, Workload::RandWrite | Workload::SeqWrite)
    }
}

pub const QUEUE_DEPTHS: [usize; 2] = [1, 32];

/// Through exitless, its device thread polling as given, or by the lab process itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Guest(PollMode),
    Host,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Guest(_) => "guest",
            Path::Host => "host",
        }
    }

    /// The device thread's polling, on the guest path.
    pub fn poll(self) -> Option<PollMode> {
        match self {
            Path::Guest(poll) => Some(poll),
            Path::Host => None,
        }
    }
}

/// What one run measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunResult {
    pub requests: u64,
    pub seconds: f64,
    pub bytes: u64,
    pub failed: u64,
    pub bad_sectors: u64,
    pub exits: u64,
    pub kicks: u64,
    pub irqs: u64,
    /// CPU seconds of the VMM outside the guest (guest path), or of the process (host).
    pub vmm_cpu: f64,
    /// CPU seconds of the vCPU thread (guest path only): the guest's own work and polling.
    pub vcpu_cpu: Option<f64>,
    /// Times a request waited for the drive's rate limiter (guest path only).
    pub throttled: u64,
}

#[derive(Clone, Debug)]
pub struct Row {
    pub workload: Workload,
    pub qd: usize,
    pub path: Path,
    pub iops: f64,
    pub mb_s: f64,
    pub exits_per_req: f64,
    pub kicks_per_req: f64,
    pub irqs_per_req: f64,
    pub vmm_cpu_pct: f64,
    pub vcpu_cpu_pct: Option<f64>,
    pub requests: u64,
    pub verified: bool,
}

impl Row {
    fn from_run(workload: Workload, qd: usize, path: Path, r: &RunResult, verified: bool) -> Row {
        let reqs = r.requests.max(1) as f64;
        Row {
            workload,
            qd,
            path,
            iops: r.requests as f64 / r.seconds,
            mb_s: r.bytes as f64 / r.seconds / 1e6,
            exits_per_req: r.exits as f64 / reqs,
            kicks_per_req: r.kicks as f64 / reqs,
            irqs_per_req: r.irqs as f64 / reqs,
            vmm_cpu_pct: r.vmm_cpu / r.seconds * 100.0,
            vcpu_cpu_pct: r.vcpu_cpu.map(|c| c / r.seconds * 100.0),
            requests: r.requests,
            verified: verified && r.requests > 0 && r.failed == 0 && r.bad_sectors == 0,
        }
    }
}

/// The lab's file: created (or taken) and filled with the pattern under stamp 0.
struct LabFile {
    path: PathBuf,
    temporary: bool,
}

impl Drop for LabFile {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn prepare(opts: &Options, progress: bool) -> Result<LabFile, BlkBenchError> {
    let (path, temporary) = match &opts.file {
        Some(p) => (p.clone(), false),
        None => (PathBuf::from(format!("/var/tmp/exitless-blk-{}.img", std::process::id())), true),
    };
    let lab_file = LabFile { path: path.clone(), temporary };
    let fail = |e| BlkBenchError::File(path.clone(), e);
    let mut file = std::fs::OpenOptions::new().create(true).write(true).truncate(false).open(&path).map_err(fail)?;
    file.set_len(opts.size).map_err(fail)?;
    let chunk = 1 << 20;
    let mut buf = vec![0u8; chunk];
    for (i, at) in (0..opts.size).step_by(chunk).enumerate() {
        if progress && i % 64 == 0 {
            eprint!(
                "\rblk: filling {} with its pattern: {} of {} MiB\x1b[K",
                path.display(),
                at >> 20,
                opts.size >> 20
            );
        }
        let n = chunk.min((opts.size - at) as usize);
        pattern::fill(&mut buf[..n], at / pattern::SECTOR as u64, 0);
        file.write_all(&buf[..n]).map_err(fail)?;
    }
    file.sync_data().map_err(fail)?;
    Ok(lab_file)
}

/// After a write run: no sector lost its pattern, and the run's stamp is where it should be.
fn writes_verified(path: &std::path::Path, w: Workload, r: &RunResult, stamp: u64, size: u64) -> bool {
    let Ok(file) = std::fs::File::open(path) else { return false };
    let Ok((bad, stamped)) = pattern::scan(std::io::BufReader::new(file), stamp) else { return false };
    let per = (w.block() / pattern::SECTOR) as u64;
    let blocks = size / w.block() as u64;
    let expected_ok =
        if w.random() { stamped > 0 && stamped <= r.requests * per } else { stamped == r.requests.min(blocks) * per };
    bad == 0 && expected_ok
}

/// The filesystem a path is on, by name where known.
fn filesystem(path: &std::path::Path) -> String {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return "?".into() };
    // SAFETY: statfs fills the zeroed struct from a NUL-terminated path.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return "?".into();
    }
    match s.f_type {
        0xef53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683e => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x794c_7630 => "overlayfs".into(),
        t => format!("fs type {t:#x}"),
    }
}

pub struct Measured {
    pub rows: Vec<Row>,
    /// The rate-limited rows (limits.rs).
    pub limited: Vec<limits::LimitRow>,
    /// What the file was: path, filesystem, whether O_DIRECT was used, the engine.
    pub setup: String,
    pub guest_poll_us: u64,
}

pub fn measure(opts: &Options) -> Result<Measured, BlkBenchError> {
    let progress = std::io::stderr().is_terminal();
    let file = prepare(opts, progress)?;
    let tsc_khz = u64::from(crate::control::guest_tsc_khz()?);
    let setup = {
        let disk = Disk::open(&DriveConfig { direct: true, ..DriveConfig::new(&file.path) })?;
        let engine = exitless_vmm::virtio::blk::engine::Engine::new(1);
        format!(
            "{} ({} MiB on {}, {}, {})",
            file.path.display(),
            opts.size >> 20,
            filesystem(&file.path),
            if disk.is_direct() { "O_DIRECT" } else { "page cache: no O_DIRECT here" },
            engine.name()
        )
    };
    let mut rows = Vec::new();
    let mut stamp = 0u64;
    for (i, w) in Workload::ALL.into_iter().enumerate() {
        for qd in QUEUE_DEPTHS {
            let paths: Vec<Path> = opts.polls.iter().map(|&p| Path::Guest(p)).chain([Path::Host]).collect();
            let mut runs: Vec<Vec<Row>> = vec![Vec::new(); paths.len()];
            for r in 0..opts.repeat as usize {
                for k in 0..paths.len() {
                    // Which path goes first rotates from one repeat to the next.
                    let c = (i + r + k) % paths.len();
                    let path = paths[c];
                    if progress {
                        let poll = path.poll().map_or(String::new(), |p| format!(" poll {p}"));
                        eprint!(
                            "\rblk: {} qd {qd} {}{poll} run {}/{} ...\x1b[K",
                            w.name(),
                            path.name(),
                            r + 1,
                            opts.repeat
                        );
                    }
                    stamp += 1;
                    let seed = stamp * 0x9e37_79b9;
                    let result = match path {
                        Path::Guest(device_poll) => guest::run(&guest::GuestRun {
                            file: &file.path,
                            workload: w,
                            qd,
                            seconds: opts.seconds,
                            stamp,
                            seed,
                            tsc_khz,
                            poll_us: opts.guest_poll_us,
                            device_poll,
                            limits: Default::default(),
                            timeout: opts.timeout,
                        })?,
                        Path::Host => {
                            let disk = Disk::open(&DriveConfig { direct: true, ..DriveConfig::new(&file.path) })?;
                            host::run(&disk, w, qd, opts.seconds, stamp, seed)
                        }
                    };
                    let verified = !w.write() || writes_verified(&file.path, w, &result, stamp, opts.size);
                    runs[c].push(Row::from_run(w, qd, path, &result, verified));
                }
            }
            rows.extend(runs.iter().map(|r| median_row(r)));
        }
    }
    let limited = limits::measure(opts, &file.path, tsc_khz, &mut stamp, progress)?;
    if progress {
        eprint!("\r\x1b[K");
    }
    Ok(Measured { rows, limited, setup, guest_poll_us: opts.guest_poll_us })
}

/// Medians of each figure over repeated runs; verified only if every run was.
fn median_row(runs: &[Row]) -> Row {
    let med = |f: fn(&Row) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    Row {
        iops: med(|r| r.iops),
        mb_s: med(|r| r.mb_s),
        exits_per_req: med(|r| r.exits_per_req),
        kicks_per_req: med(|r| r.kicks_per_req),
        irqs_per_req: med(|r| r.irqs_per_req),
        vmm_cpu_pct: med(|r| r.vmm_cpu_pct),
        vcpu_cpu_pct: runs[0].vcpu_cpu_pct.map(|_| med(|r| r.vcpu_cpu_pct.unwrap_or(0.0))),
        requests: runs.iter().map(|r| r.requests).sum(),
        verified: runs.iter().all(|r| r.verified),
        ..runs[0].clone()
    }
}

/// The issues' targets: the disk's on the default polling mode (adaptive) if measured,
/// else on the first; polling's against `off`.
pub fn targets(rows: &[Row]) -> Vec<Target> {
    let find = |w, qd, p| rows.iter().find(|r| r.workload == w && r.qd == qd && r.path == p);
    let mut out = Vec::new();
    let modes = exitless_vmm::poll::distinct(rows.iter().filter_map(|r| r.path.poll()));
    let Some(&mode) = modes.iter().find(|&&p| p == PollMode::default()).or(modes.first()) else { return out };
    let guest = Path::Guest(mode);
    if let (Some(g), Some(h)) = (find(Workload::RandRead, 32, guest), find(Workload::RandRead, 32, Path::Host)) {
        let x = g.iops / h.iops;
        out.push(Target::new("guest randread-4k qd32 IOPS >= 0.8x host", format!("{x:.2}x"), x >= 0.8));
    }
    let worst = rows.iter().filter(|r| r.qd == 32 && r.path == guest).map(|r| r.exits_per_req).fold(0.0, f64::max);
    out.push(Target::new("exits per request < 0.1 at qd32 (guest, worst row)", format!("{worst:.3}"), worst < 0.1));
    out.extend(no_row_slower_than_off(
        rows,
        "guest row",
        |r| r.path.poll(),
        |r| (r.workload, r.qd),
        |r| r.iops,
        |r| format!("{} qd{}", r.workload.name(), r.qd),
    ));
    let unverified = rows.iter().filter(|r| !r.verified).count();
    out.push(Target::new("every row verified", format!("{unverified} not"), unverified == 0));
    out
}

pub fn table(m: &Measured, opts: &Options) -> String {
    let mut s = format!(
        "blk lab: {} s per row, {} repeats interleaved (medians); file {}; guest polls {} us before sleeping\n",
        opts.seconds, opts.repeat, m.setup, opts.guest_poll_us
    );
    s += &format!(
        "{:<13} {:>3} {:<6} {:<9} {:>9} {:>8} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9}\n",
        "workload",
        "qd",
        "path",
        "poll",
        "IOPS",
        "MB/s",
        "exits/req",
        "kicks/req",
        "irqs/req",
        "VMM CPU %",
        "vCPU CPU %",
        "verified"
    );
    for r in &m.rows {
        let guest_only = |v: f64| if r.path != Path::Host { format!("{v:.3}") } else { "-".into() };
        s += &format!(
            "{:<13} {:>3} {:<6} {:<9} {:>9.0} {:>8.1} {:>10} {:>10} {:>9} {:>10.1} {:>10} {:>9}\n",
            r.workload.name(),
            r.qd,
            r.path.name(),
            r.path.poll().map_or("-".into(), |p| p.to_string()),
            r.iops,
            r.mb_s,
            guest_only(r.exits_per_req),
            guest_only(r.kicks_per_req),
            guest_only(r.irqs_per_req),
            r.vmm_cpu_pct,
            r.vcpu_cpu_pct.map_or("-".into(), |c| format!("{c:.1}")),
            if r.verified { "yes" } else { "NO" }
        );
    }
    s + &limits::table(&m.limited) + &targets_text(&all_targets(m))
}

/// The main table's targets and the rate limits'.
fn all_targets(m: &Measured) -> Vec<Target> {
    let mut all = targets(&m.rows);
    all.extend(limits::targets(&m.limited));
    all
}

pub fn json(m: &Measured) -> serde_json::Value {
    let rows: Vec<_> = m
        .rows
        .iter()
        .map(|r| {
            json!({"workload": r.workload.name(), "qd": r.qd, "path": r.path.name(),
                   "poll": r.path.poll().map(|p| p.to_string()), "iops": r.iops, "mb_s": r.mb_s,
                   "exits_per_req": r.exits_per_req, "irqs_per_req": r.irqs_per_req, "kicks_per_req": r.kicks_per_req,
                   "vmm_cpu_pct": r.vmm_cpu_pct, "vcpu_cpu_pct": r.vcpu_cpu_pct, "verified": r.verified,
                   "requests": r.requests})
        })
        .collect();
    json!({"bench": "blk", "file": m.setup, "guest_poll_us": m.guest_poll_us, "rows": rows,
           "limits": limits::json(&m.limited), "targets": targets_json(&all_targets(m))})
}

pub fn run(opts: &Options) -> Result<Measured, BlkBenchError> {
    opts.outputs.check()?;
    let m = measure(opts)?;
    crate::report::print_table(&table(&m, opts))?;
    opts.outputs.write(
        || json(&m),
        || {
            let bars = m.rows.iter().map(|r| {
                let poll = r.path.poll().map_or(String::new(), |p| format!(" poll {p}"));
                (format!("{} qd{}", r.workload.name(), r.qd), format!("{}{poll}", r.path.name()), r.iops)
            });
            let title = "virtio-blk: guest through exitless against the host's own";
            chart::draw(&[chart::Panel::grouped(title, "IOPS", false, bars)])
        },
    )?;
    Ok(m)
}
