//! `exitless bench fs`'s options: where the kernel, the backends and the peer are, what
//! the passes do, and `--quick` for a CI-sized smoke run.

use clap::Args;
use exitless::args::{parse_seconds, parse_size};
use std::path::PathBuf;

#[derive(Args)]
pub struct FsArgs {
    /// A Linux vmlinux with virtio-fs (scripts/guest-kernel.sh prints its path); by
    /// default $EXITLESS_KERNEL, else the newest one in ~/.cache/exitless/guest-kernel.
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// virtiofsd (scripts/virtiofsd.sh installs it); by default $EXITLESS_VIRTIOFSD, else
    /// ~/.cache/exitless/virtiofsd/bin/virtiofsd, else `virtiofsd` on the PATH.
    #[arg(long, value_name = "PATH")]
    pub virtiofsd: Option<PathBuf>,
    /// Firecracker, whose vhost-user-blk rows run beside exitless's; by default
    /// ~/.cache/exitless/peers/firecracker where scripts/peers.sh built one.
    #[arg(long, value_name = "PATH")]
    pub firecracker: Option<PathBuf>,
    /// The vhost-user-blk backend both VMMs' rows run on.
    #[arg(long, value_name = "PATH", default_value = "qemu-storage-daemon")]
    pub qemu_storage_daemon: PathBuf,
    /// The CPU the backend is pinned to, for both VMMs' rows (`none`: not pinned). By
    /// default the last CPU this may run on, where it may run on two or more: left to the scheduler, on two
    /// CPUs the backend shares the vCPU's about half the runs, which halves their IOPS.
    #[arg(long, value_name = "CPU|none", value_parser = parse_cpu)]
    pub backend_cpu: Option<CpuChoice>,
    /// Where the share and the image go: a real filesystem (the host's floor is its).
    #[arg(long, value_name = "DIR", default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// The large file's size: 256M (the issue's) by default, 8M on a nested host, whose
    /// guest kernel is emulated (about 1 us an instruction: the sizes take half an hour a run).
    #[arg(long, value_parser = parse_mib)]
    pub file_size: Option<u64>,
    /// Small files created, stat-ed and removed per run: 10000 by default, 200 on a nested host.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub files: Option<u32>,
    /// Bytes written into each small file.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(0..=1 << 20))]
    pub file_bytes: u32,
    /// Runs of each pass on each side (default 3, 1 on a nested host), and of each block
    /// row (default 3), interleaved; medians are reported.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: Option<u32>,
    /// The virtio-fs device's transport: pci or mmio.
    #[arg(long, default_value = "pci", value_parser = parse_transport)]
    pub fs_transport: exitless_lab::peers::Transport,
    /// The block rows' transports: mmio (Firecracker's default), pci, or both.
    #[arg(long, default_value = "both", value_parser = parse_transports)]
    pub transport: Transports,
    /// Seconds of each blkbench run (at least 1: the steady window starts 0.5 s in).
    #[arg(long, default_value_t = 2.0, value_parser = parse_io_seconds)]
    pub io_seconds: f64,
    /// The virtio-fs guest's RAM, in MiB.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(128..=1 << 16))]
    pub mem_mib: u32,
    /// Only these parts, comma-separated: fs (virtio-fs against the host), blk (the block rows).
    #[arg(long, value_delimiter = ',', default_value = "fs,blk", value_parser = ["fs", "blk"])]
    pub parts: Vec<String>,
    /// A CI-sized smoke run: a 4 MiB file, 100 files, 1 run, 1 s block runs, mmio only.
    #[arg(long)]
    pub quick: bool,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Give up on a guest whose workload has not finished within this many seconds (its
    /// boot included: minutes on a nested host under load).
    #[arg(long, default_value_t = 1800.0, value_parser = parse_seconds)]
    pub timeout: f64,
}

#[derive(Clone, Debug)]
pub struct Transports(Vec<exitless_lab::peers::Transport>);

fn parse_transport(s: &str) -> Result<exitless_lab::peers::Transport, String> {
    match s {
        "mmio" => Ok(exitless_lab::peers::Transport::Mmio),
        "pci" => Ok(exitless_lab::peers::Transport::Pci),
        _ => Err(format!("'{s}' is not mmio or pci")),
    }
}

fn parse_transports(s: &str) -> Result<Transports, String> {
    match s {
        "both" => Ok(Transports(vec![exitless_lab::peers::Transport::Mmio, exitless_lab::peers::Transport::Pci])),
        _ => parse_transport(s).map(|t| Transports(vec![t])).map_err(|e| e.replace("mmio or pci", "mmio, pci or both")),
    }
}

fn parse_io_seconds(s: &str) -> Result<f64, String> {
    match parse_seconds(s)? {
        v if v >= 1.0 => Ok(v),
        _ => Err(format!("'{s}' is shorter than 1 s, which a steady window needs")),
    }
}

/// A size in whole MiB, at least 1 MiB.
fn parse_mib(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => Ok(n >> 20),
        _ => Err(format!("'{s}' is not a whole number of MiB, at least 1M")),
    }
}

fn home(rest: &str) -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(rest))
}

/// The newest microvm vmlinux scripts/guest-kernel.sh cached (its name holds its config's
/// key, so the newest is the one the current config built).
fn cached_kernel() -> Option<PathBuf> {
    let dir = home(".cache/exitless/guest-kernel")?;
    let newest = std::fs::read_dir(dir).ok()?.flatten().filter_map(|e| {
        let name = e.file_name().into_string().ok()?;
        let ours = name.starts_with("vmlinux-6.1-") && !name.contains("firecracker");
        ours.then(|| Some((e.metadata().ok()?.modified().ok()?, e.path())))?
    });
    newest.max_by_key(|(at, _)| *at).map(|(_, path)| path)
}

fn must_exist(what: &str, path: PathBuf, how: &str) -> Result<PathBuf, String> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{what} {}: no such file ({how})", path.display()))
    }
}

impl FsArgs {
    pub fn to_options(&self) -> Result<exitless_lab::fs::Options, Box<dyn std::error::Error>> {
        use exitless_lab::peers::Transport;
        let fs = self.parts.iter().any(|p| p == "fs");
        let blk = self.parts.iter().any(|p| p == "blk");
        let kernel = self
            .kernel
            .clone()
            .or_else(|| std::env::var_os("EXITLESS_KERNEL").map(PathBuf::from))
            .or_else(cached_kernel);
        let kernel = match kernel {
            Some(k) => must_exist("--kernel", k, "scripts/guest-kernel.sh builds one")?,
            None if fs => return Err("no guest kernel: give --kernel (scripts/guest-kernel.sh builds one)".into()),
            None => PathBuf::new(),
        };
        let virtiofsd = self
            .virtiofsd
            .clone()
            .or_else(|| std::env::var_os("EXITLESS_VIRTIOFSD").map(PathBuf::from))
            .or_else(|| home(".cache/exitless/virtiofsd/bin/virtiofsd").filter(|p| p.is_file()))
            .unwrap_or_else(|| "virtiofsd".into());
        let firecracker = match &self.firecracker {
            Some(fc) => Some(must_exist("--firecracker", fc.clone(), "scripts/peers.sh builds the peers")?),
            None => home(".cache/exitless/peers/firecracker").filter(|p| p.is_file()),
        };
        let nested = exitless_vmm::host::HostProfile::probe().nested();
        let (params, blk_runs, blk_transports, io_seconds) = if self.quick {
            let params = exitless_lab::fs::Params { file_mib: 4, runs: 1, files: 100, file_bytes: self.file_bytes };
            (params, 1, vec![Transport::Mmio], 1.0)
        } else {
            let (mib, files, runs) = if nested { (8, 200, 1) } else { (256, 10_000, 3) };
            let params = exitless_lab::fs::Params {
                file_mib: self.file_size.unwrap_or(mib),
                runs: self.runs.unwrap_or(runs),
                files: self.files.unwrap_or(files),
                file_bytes: self.file_bytes,
            };
            (params, self.runs.unwrap_or(3), self.transport.0.clone(), self.io_seconds)
        };
        let sizes = match () {
            _ if self.quick => Some("--quick: a smoke run's sizes".to_string()),
            _ if nested && (self.file_size.is_none() || self.files.is_none()) => Some(
                "a nested host (kvm_pvm emulates the guest's kernel): smaller than the issue's 256 MiB and 10000 files"
                    .to_string(),
            ),
            _ => None,
        };
        Ok(exitless_lab::fs::Options {
            exitless: exitless_lab::exitless_binary()?,
            kernel,
            virtiofsd,
            firecracker,
            qemu_storage_daemon: self.qemu_storage_daemon.clone(),
            backend_cpu: match self.backend_cpu {
                Some(CpuChoice::Cpu(cpu)) if !exitless_lab::fs::may_run_on(cpu) => {
                    return Err(format!("--backend-cpu {cpu}: not a CPU this process may run on").into())
                }
                Some(CpuChoice::Cpu(cpu)) => Some(cpu),
                Some(CpuChoice::None) => None,
                None => exitless_lab::fs::last_cpu(),
            },
            dir: self.dir.clone(),
            params,
            fs_transport: self.fs_transport,
            blk_transports,
            blk_runs,
            sizes,
            io_seconds,
            mem_mib: self.mem_mib,
            timeout: std::time::Duration::from_secs_f64(self.timeout),
            fs,
            blk,
            outputs: exitless_lab::report::Outputs { json: self.json.clone(), svg: None },
        })
    }
}

/// `--backend-cpu`: a CPU number, or `none`.
#[derive(Clone, Copy, Debug)]
pub enum CpuChoice {
    Cpu(usize),
    None,
}

fn parse_cpu(s: &str) -> Result<CpuChoice, String> {
    if s == "none" {
        return Ok(CpuChoice::None);
    }
    match s.parse::<usize>() {
        Ok(cpu) if cpu < MOST_CPUS => Ok(CpuChoice::Cpu(cpu)),
        _ => Err(format!("{s:?}: a CPU number below {MOST_CPUS} or `none`")),
    }
}

/// The CPUs an affinity mask (cpu_set_t) can name.
const MOST_CPUS: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_cpu_is_a_number_in_a_mask_or_none() {
        assert!(matches!(parse_cpu("1"), Ok(CpuChoice::Cpu(1))));
        assert!(matches!(parse_cpu("none"), Ok(CpuChoice::None)));
        for bad in ["-1", "1024", "one", ""] {
            assert!(parse_cpu(bad).is_err(), "{bad:?} taken");
        }
    }
}
