//! `exitless bench fs` (issue #56's "Measure and show"): virtio-fs against the host's own
//! filesystem on the same files in the same run, and vhost-user-block against exitless's
//! own virtio-blk and beside Firecracker's vhost-user-block on the same backend.
//!
//! virtio-fs: one program (fsbench.c) runs on the host on the share, then as a Linux
//! guest's /init on the same share through virtiofsd (`--cache=auto`, started here): a
//! large file read sequentially (once with the host's cache of it dropped, then with the
//! host's cache warm; the guest's own cache dropped before every pass, so every byte
//! crosses virtio-fs), then small files created, stat-ed (the guest's dentries and inodes
//! dropped first: every stat is a lookup by virtiofsd) and removed. Each guest rate is
//! given as a ratio to the host's (the floor). Both sides must read the same checksum.
//!
//! vhost-user-block: blk.rs.

mod blk;
pub use blk::{last_cpu, may_run_on};
mod guest;
mod initramfs;
mod report;
mod workload;

pub use blk::{Device, Sample};
pub use workload::{Params, Passes, Timing};

use crate::peers::{Transport, Vmm};
use crate::report::{LabError, Outputs};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct Options {
    pub exitless: PathBuf,
    /// A Linux vmlinux with virtio-fs (scripts/guest-kernel.sh builds one).
    pub kernel: PathBuf,
    pub virtiofsd: PathBuf,
    /// Firecracker's binary: its vhost-user-blk rows are skipped without.
    pub firecracker: Option<PathBuf>,
    pub qemu_storage_daemon: PathBuf,
    /// The CPU the backend is pinned to (None: the scheduler's choice).
    pub backend_cpu: Option<usize>,
    /// Where the share and the image go (a real filesystem: the host's floor is its).
    pub dir: PathBuf,
    pub params: Params,
    /// Why the sizes are not the (256 MiB, 10000 files), when they are not.
    pub sizes: Option<String>,
    /// The virtio-fs device's transport.
    pub fs_transport: Transport,
    /// The vhost-user-block rows' transports, in order.
    pub blk_transports: Vec<Transport>,
    /// blkbench runs per row, interleaved between the rows.
    pub blk_runs: u32,
    pub io_seconds: f64,
    pub mem_mib: u32,
    pub timeout: Duration,
    /// Which parts run.
    pub fs: bool,
    pub blk: bool,
    pub outputs: Outputs,
}

/// The virtio-fs part: both sides' passes.
pub struct FsPart {
    pub virtiofsd: String,
    pub sizes: Option<String>,
    pub transport: Transport,
    pub params: Params,
    pub host: Passes,
    pub guest: Passes,
}

/// One vhost-user-block row: its runs.
pub struct BlkRow {
    pub vmm: Vmm,
    pub device: Device,
    pub transport: Transport,
    pub samples: Vec<Sample>,
    /// Why it has no samples, when it has none.
    pub skipped: Option<String>,
}

pub struct Report {
    pub fs: Option<FsPart>,
    pub blk: Vec<BlkRow>,
    pub io_seconds: f64,
    pub image_mib: u64,
    pub backend_cpu: Option<usize>,
}

pub fn run(opts: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report, LabError> {
    opts.outputs.check()?;
    let dir = opts.dir.join(format!("exitless-bench-fs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| LabError::Setup(format!("{}: {e}", dir.display())))?;
    let result = run_in(opts, &dir, progress);
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    crate::report::print_table(&report.text())?;
    opts.outputs.write(|| report.json(), String::new)?;
    Ok(report)
}

fn run_in(opts: &Options, dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<Report, LabError> {
    let fs = if opts.fs { Some(fs_part(opts, dir, progress)?) } else { None };
    let blk = if opts.blk { blk_part(opts, dir, progress)? } else { Vec::new() };
    Ok(Report {
        fs,
        blk,
        io_seconds: opts.io_seconds,
        image_mib: crate::peers::io::BLK_BYTES >> 20,
        backend_cpu: opts.backend_cpu,
    })
}

fn fs_part(opts: &Options, dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<FsPart, LabError> {
    let setup = LabError::Setup;
    let share = dir.join("share");
    std::fs::create_dir_all(&share).map_err(|e| setup(format!("{}: {e}", share.display())))?;
    let p = &opts.params;
    progress(&format!("writing the {} MiB file in {}", p.file_mib, share.display()));
    workload::write_large(&share, p.file_mib).map_err(setup)?;
    let program = workload::write_program(dir).map_err(setup)?;
    progress("the host's passes");
    let host = workload::run_host(&program, &share, p).map_err(LabError::Run)?;
    progress(&format!("the guest's passes ({} over {})", opts.kernel.display(), opts.fs_transport.name()));
    let guest = guest::run(opts, dir, &share, p, progress).map_err(LabError::Run)?;
    if host.checksum != guest.checksum || host.bad + guest.bad > 0 {
        return Err(LabError::Run(format!(
            "the sides disagree: checksums {:?} (host) and {:?} (guest), {} and {} short reads or wrong sizes",
            host.checksum, guest.checksum, host.bad, guest.bad
        )));
    }
    Ok(FsPart {
        virtiofsd: guest::version(&opts.virtiofsd),
        sizes: opts.sizes.clone(),
        transport: opts.fs_transport,
        params: *p,
        host,
        guest,
    })
}

/// The rows a run has: exitless's virtio-blk and vhost-user-blk, Firecracker's
/// vhost-user-blk, on each transport.
fn blk_rows(opts: &Options) -> Vec<(Vmm, PathBuf, Device, Transport)> {
    let mut rows = Vec::new();
    for &t in &opts.blk_transports {
        rows.push((Vmm::Exitless, opts.exitless.clone(), Device::VirtioBlk, t));
        rows.push((Vmm::Exitless, opts.exitless.clone(), Device::VhostUser, t));
        if let Some(fc) = &opts.firecracker {
            rows.push((Vmm::Firecracker, fc.clone(), Device::VhostUser, t));
        }
    }
    rows
}

fn blk_part(opts: &Options, dir: &Path, progress: &mut dyn FnMut(&str)) -> Result<Vec<BlkRow>, LabError> {
    let image = crate::peers::io::blk_disk(dir).map_err(LabError::Setup)?;
    let tsc_khz = crate::control::guest_tsc_khz().map_err(|e| LabError::Setup(format!("TSC rate: {e}")))?;
    let setup = blk::Setup {
        dir,
        image: &image,
        qsd: &opts.qemu_storage_daemon,
        backend_cpu: opts.backend_cpu,
        io_seconds: opts.io_seconds,
        mem_mib: 128,
        tsc_khz: u64::from(tsc_khz),
        timeout: opts.timeout,
    };
    let plan = blk_rows(opts);
    let mut rows: Vec<BlkRow> = plan
        .iter()
        .map(|(vmm, _, device, transport)| BlkRow {
            vmm: *vmm,
            device: *device,
            transport: *transport,
            samples: Vec::new(),
            skipped: None,
        })
        .collect();
    for run in 0..opts.blk_runs {
        // Each run starts with the next row, so that none always follows another.
        for k in 0..plan.len() {
            let i = (k + run as usize) % plan.len();
            let (vmm, exe, device, transport) = &plan[i];
            let row = &mut rows[i];
            if row.skipped.is_some() {
                continue;
            }
            let what = format!("{} {} over {}", vmm.name(), device.name(), transport.name());
            match blk::run(*vmm, exe, *device, *transport, &setup) {
                Ok(s) => {
                    progress(&format!(
                        "run {}/{}: {what}: {:.0} IOPS, {} exits in the steady window of {:.0} requests",
                        run + 1,
                        opts.blk_runs,
                        s.iops,
                        s.window_exits,
                        s.window_requests
                    ));
                    row.samples.push(s);
                }
                Err(e) => {
                    progress(&format!("{what}: skipped: {e}"));
                    row.skipped = Some(e);
                }
            }
        }
    }
    Ok(rows)
}
