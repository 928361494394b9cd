//! `exitless bench`: one subcommand per lab, with the lab's options.

use clap::{Args, Subcommand};
use exitless::args::*;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// `exitless run --lab ...`: a guest with the lab's devices (the doorbell, the idle
    /// port) plugged in, which only this binary carries.
    #[command(hide = true)]
    Run(Box<RunArgs>),
    /// Process start to the guest's first serial byte, and VMM memory beyond guest RAM.
    Boot(BootArgs),
    /// A doorbell rung through userspace exits, ioeventfds, KVM's coalesced ring, polling.
    Doorbell(DoorbellArgs),
    /// PCI config reads by 0xCF8/0xCFC, by trapped ECAM and by read-only-mapped ECAM.
    Pci(PciArgs),
    /// virtio-net TX through a tap, copy against zerocopy, per message size.
    Net(NetArgs),
    /// virtio-blk: random 4K and sequential 64K reads and writes at qd 1 and 32, through
    /// exitless and by the host itself on the same file (the floor).
    Blk(BlkArgs),
    /// Many microVMs at once, each an `exitless --api-sock` process booted through the API:
    /// time until all run, VMM memory per VM, and a clean stop for every one.
    Fleet(FleetArgs),
    /// exitless beside Firecracker and Cloud Hypervisor: the same guests under each, driven
    /// through each one's API, interleaved: start, memory beyond guest RAM (one VM and a
    /// fleet), blkbench and nettx on each one's virtio devices.
    Peers(PeersArgs),
    /// virtio-vsock through Firecracker's Unix-socket host side: 64-byte round trips and
    /// an echoed stream of 64 KiB writes, exits per message, beside net --rtt.
    Vsock(VsockArgs),
    /// MMDS on a NIC: a guest agent's ARP, TCP and HTTP (token, three keys, a 404), the
    /// answer time per request and exits per request, every byte checked.
    Mmds(MmdsArgs),
    /// Snapshots through the API: create, load and back to running, by guest memory size
    /// and the share of it the guest wrote.
    Snapshot(SnapshotArgs),
    /// Sandboxes by the hundred restored from one snapshot: time until all answered and
    /// resident and proportional memory per guest, beside Firecracker on the same guest.
    Density(DensityArgs),
    /// virtio-fs against the host's own filesystem on the same files (a Linux guest), and
    /// vhost-user-block against exitless's virtio-blk and beside Firecracker's.
    Fs(crate::fs_args::FsArgs),
    /// A running sandbox forked: its pause for a Full snapshot (Paused to Resumed) by
    /// guest size, the bytes written, then clones loaded and asked once: time until all
    /// answered, RSS/PSS and anonymous memory per clone, beside Firecracker.
    Fork(ForkArgs),
}

#[derive(Args)]
pub struct ForkArgs {
    /// A Firecracker binary measured beside exitless; by default
    /// ~/.cache/exitless/peers/firecracker where scripts/peers.sh built one.
    #[arg(long, value_name = "PATH")]
    pub firecracker: Option<PathBuf>,
    /// Guest memory sizes in MiB, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096", value_parser = clap::value_parser!(u64).range(64..=16384))]
    pub mem: Vec<u64>,
    /// Clones per size and VMM.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub clones: u32,
    /// Share of RAM the guest writes before the snapshot (0 to 1).
    #[arg(long, default_value = "0.75", value_parser = parse_share)]
    pub written: f64,
    /// Where snapshots and exitless's RAM files go (a tmpfs).
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub dir: PathBuf,
    #[command(flatten)]
    pub out: OutputArgs,
}

impl ForkArgs {
    pub fn to_options(&self) -> exitless_lab::fork::Options {
        let cached = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/exitless/peers/firecracker"));
        exitless_lab::fork::Options {
            firecracker: self.firecracker.clone().or(cached.filter(|p| p.is_file())),
            sizes_mib: self.mem.clone(),
            clones: self.clones,
            written: self.written,
            dir: self.dir.clone(),
            outputs: outputs(&self.out),
        }
    }
}

#[derive(Args)]
pub struct DensityArgs {
    /// A Firecracker binary, measured beside exitless on the same guest (scripts/peers.sh builds one).
    #[arg(long, value_name = "PATH")]
    pub firecracker: Option<PathBuf>,
    /// Sandboxes per VMM.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub vms: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(64..=4096))]
    pub mem: u64,
    /// Share of RAM the guest writes before the snapshot (0 to 1).
    #[arg(long, default_value = "0.75", value_parser = parse_share)]
    pub written: f64,
    #[command(flatten)]
    pub out: OutputArgs,
}

impl DensityArgs {
    pub fn to_options(&self) -> exitless_lab::density::Options {
        exitless_lab::density::Options {
            firecracker: self.firecracker.clone(),
            vms: self.vms,
            mem_mib: self.mem,
            written: self.written,
            outputs: outputs(&self.out),
        }
    }
}

#[derive(Args)]
pub struct SnapshotArgs {
    /// A Firecracker binary, measured beside exitless on the same guest (scripts/peers.sh builds one).
    #[arg(long, value_name = "PATH")]
    pub firecracker: Option<PathBuf>,
    /// Guest memory sizes in MiB, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "128,512,1024,2048", value_parser = clap::value_parser!(u64).range(64..=16384))]
    pub mem: Vec<u64>,
    /// Shares of RAM the guest writes before the snapshot, comma-separated (0 to 1).
    #[arg(long, value_delimiter = ',', default_value = "0,0.5", value_parser = parse_share)]
    pub written: Vec<f64>,
    /// Runs per VMM, size and share (interleaved); medians are reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
    /// Snapshot types, each measured: Full, Diff (three ticks after a Full base, loaded
    /// laid over it), and Uffd2M (Full, of a guest on 2 MiB huge pages, loaded through
    /// `exitless uffd-handler`; needs root to reserve the pages).
    #[arg(long, value_delimiter = ',', default_value = "Full,Diff,Uffd2M", value_parser = parse_kind)]
    pub types: Vec<exitless_lab::snapshot::Kind>,
    /// Guest memory sizes in MiB of the Uffd2M rows, comma-separated (whole 2 MiB pages).
    #[arg(long, value_delimiter = ',', default_value = "1024", value_parser = parse_huge_mib)]
    pub huge_mem: Vec<u64>,
    #[command(flatten)]
    pub out: OutputArgs,
}

fn parse_kind(s: &str) -> Result<exitless_lab::snapshot::Kind, String> {
    match s {
        "Full" | "full" => Ok(exitless_lab::snapshot::Kind::Full),
        "Diff" | "diff" => Ok(exitless_lab::snapshot::Kind::Diff),
        "Uffd2M" | "uffd2m" => Ok(exitless_lab::snapshot::Kind::Uffd2M),
        _ => Err(format!("{s:?} is not a snapshot type (Full, Diff or Uffd2M)")),
    }
}

fn parse_huge_mib(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(v) if (64..=16384).contains(&v) && v % 2 == 0 => Ok(v),
        _ => Err(format!("{s:?} is not a size in MiB from 64 to 16384 in whole 2 MiB pages")),
    }
}

fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}

impl SnapshotArgs {
    pub fn to_options(&self) -> exitless_lab::snapshot::Options {
        exitless_lab::snapshot::Options {
            firecracker: self.firecracker.clone(),
            sizes_mib: self.mem.clone(),
            huge_sizes_mib: self.huge_mem.clone(),
            dirty: self.written.clone(),
            kinds: self.types.clone(),
            runs: self.runs,
            outputs: outputs(&self.out),
        }
    }
}

#[derive(Args)]
pub struct MmdsArgs {
    /// MMDS versions, each measured.
    #[arg(long, value_delimiter = ',', default_value = "V1,V2", value_parser = parse_mmds_version)]
    pub versions: Vec<exitless_vmm::net::mmds::Version>,
    /// The device thread's polling modes, each measured (as --poll-us takes them).
    #[arg(long, value_delimiter = ',', default_value = "off,adaptive")]
    pub poll: Vec<exitless_vmm::poll::PollMode>,
    /// Sessions per row (each a connection, five or seven requests).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub sessions: u32,
    /// Bytes in each of the three values.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub value_len: u32,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a chart (SVG) to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Give up on a guest that has not finished within this many seconds.
    #[arg(long, default_value_t = 120.0, value_parser = parse_seconds)]
    pub timeout: f64,
}

impl MmdsArgs {
    pub fn to_options(&self) -> exitless_lab::mmds::Options {
        exitless_lab::mmds::Options {
            versions: self.versions.clone(),
            polls: self.poll.clone(),
            sessions: self.sessions,
            value_len: self.value_len as usize,
            outputs: exitless_lab::report::Outputs { json: self.json.clone(), svg: self.svg.clone() },
            timeout: std::time::Duration::from_secs_f64(self.timeout),
        }
    }
}

#[derive(Args)]
pub struct VsockArgs {
    /// The device thread's polling modes, each measured (as --poll-us takes them).
    #[arg(long, value_delimiter = ',', default_value = "off,adaptive")]
    pub poll: Vec<exitless_vmm::poll::PollMode>,
    /// Round trips of 64 bytes.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub rounds: u32,
    /// Bytes the stream sends (each echoed back).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub stream: u64,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Give up on a guest that has not finished within this many seconds.
    #[arg(long, default_value_t = 120.0, value_parser = parse_seconds)]
    pub timeout: f64,
}

impl VsockArgs {
    pub fn to_options(&self) -> exitless_lab::vsock::Options {
        exitless_lab::vsock::Options {
            modes: self.poll.clone(),
            rounds: self.rounds,
            stream_bytes: usize::try_from(self.stream).unwrap_or(usize::MAX),
            json: self.json.clone(),
            timeout: std::time::Duration::from_secs_f64(self.timeout),
        }
    }
}

#[derive(Args)]
pub struct PeersArgs {
    /// A Firecracker binary (scripts/peers.sh builds one); its column is skipped without.
    #[arg(long, value_name = "PATH")]
    pub firecracker: Option<PathBuf>,
    /// A Cloud Hypervisor binary; its column is skipped without.
    #[arg(long, value_name = "PATH")]
    pub cloud_hypervisor: Option<PathBuf>,
    /// Starts per VMM, interleaved; medians are reported.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// Guest RAM, in MiB.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub mem_mib: u32,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw the table as grouped bars, one colour per VMM, into FILE (SVG).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// How long one start may take.
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    pub timeout: f64,
    /// VMs per VMM in the fleet rows, started at once (0: no fleet rows).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=200))]
    pub fleet: u32,
    /// Seconds of each I/O run, blkbench and nettx (0: no I/O rows).
    #[arg(long, default_value_t = 2.0, value_parser = parse_seconds_or_zero)]
    pub io_seconds: f64,
    /// The virtio transport of the I/O rows: `mmio` (Firecracker's default), `pci`
    /// (Firecracker's `--enable-pci`, Cloud Hypervisor's only), or `both`.
    #[arg(long, default_value = "both", value_parser = parse_peer_transports)]
    pub transport: PeerTransports,
}

/// `bench peers --transport`: the transports of the I/O rows, in order.
#[derive(Clone, Debug)]
pub struct PeerTransports(pub Vec<exitless_lab::peers::Transport>);

fn parse_peer_transports(s: &str) -> Result<PeerTransports, String> {
    use exitless_lab::peers::Transport;
    match s {
        "mmio" => Ok(PeerTransports(vec![Transport::Mmio])),
        "pci" => Ok(PeerTransports(vec![Transport::Pci])),
        "both" => Ok(PeerTransports(vec![Transport::Mmio, Transport::Pci])),
        _ => Err(format!("'{s}' is not mmio, pci or both")),
    }
}

#[derive(Args)]
pub struct BlkArgs {
    /// The file to run on (created or extended to --size, and overwritten with the lab's
    /// pattern); a temporary file in /var/tmp when not given. Put it on a real filesystem.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// The file's size.
    #[arg(long, default_value = "1G", value_parser = parse_blk_size)]
    pub size: u64,
    /// Seconds of I/O per workload, queue depth, path and repeat.
    #[arg(long, default_value_t = 2.0, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Repeats; which path goes first alternates, and medians are reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,
    /// Microseconds the guest driver polls its used ring before it sleeps for an
    /// interrupt (0: sleep at once, one interrupt per wait).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub guest_poll_us: u64,
    /// The device thread's polling modes each guest row is measured with (as --poll-us
    /// takes them), comma-separated; rows of other modes are compared with `off`.
    #[arg(long, value_delimiter = ',', default_value = "off,adaptive")]
    pub poll: Vec<exitless_vmm::poll::PollMode>,
    /// The operations limit (requests per second) the rate-limit row holds the guest's
    /// random 4K reads to.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=10_000_000))]
    pub limit_iops: u64,
    /// The bandwidth limit the rate-limit row holds the guest's sequential 64K reads to.
    #[arg(long, default_value = "40M", value_parser = parse_limit_bytes)]
    pub limit_bandwidth: u64,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Give up on a guest that has not finished within this many seconds.
    #[arg(long, default_value_t = 120.0, value_parser = parse_seconds)]
    pub timeout: f64,
}

/// Bytes per second for a bandwidth limit: 1M to 100G.
fn parse_limit_bytes(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        n if (1 << 20..=100 << 30).contains(&n) => Ok(n),
        _ => Err(format!("'{s}' is not a bandwidth between 1M and 100G (bytes per second)")),
    }
}

impl BlkArgs {
    pub fn to_options(&self) -> exitless_lab::blk::Options {
        exitless_lab::blk::Options {
            file: self.file.clone(),
            size: self.size,
            seconds: self.seconds,
            repeat: self.repeat,
            guest_poll_us: self.guest_poll_us,
            polls: exitless_vmm::poll::distinct(self.poll.iter().copied()),
            limit_iops: self.limit_iops,
            limit_bytes: self.limit_bandwidth,
            outputs: outputs(&self.out),
            timeout: std::time::Duration::from_secs_f64(self.timeout + self.seconds),
        }
    }
}

/// A disk size for the block lab: at least 1 MiB (so 64K blocks have room), whole MiBs.
fn parse_blk_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => Ok(n),
        _ => Err(format!("'{s}' is not a whole number of MiB, at least 1M")),
    }
}

#[derive(Args)]
pub struct NetArgs {
    /// Frame sizes (bytes, or with K), comma-separated; up to 64K.
    #[arg(long, value_delimiter = ',', default_value = "256,1K,4K,8K,16K,64K", value_parser = parse_frame_size)]
    pub sizes: Vec<usize>,
    /// Seconds of sending per size, path and repeat.
    #[arg(long, default_value_t = 1.0, value_parser = parse_seconds)]
    pub seconds: f64,
    /// Repeats; which path goes first alternates, and medians are reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,
    /// What the guest sends, comma-separated: `lab` (frames of the lab's ethertype),
    /// `tso` (IPv4/TCP with checksum and segmentation offloads, at --sizes), `tcp` (IPv4/TCP
    /// without offloads, the guest's own checksums, 1514-byte frames only).
    #[arg(long, value_delimiter = ',', default_value = "lab", value_parser = parse_frame_kind, conflicts_with = "rtt")]
    pub frames: Vec<exitless_lab::sink::FrameKind>,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Give up on a guest that has not finished within this many seconds.
    #[arg(long, default_value_t = 120.0, value_parser = parse_seconds)]
    pub timeout: f64,
    /// The device thread's polling modes each TX row is measured with (as --poll-us takes
    /// them), comma-separated; rows of other modes are compared with `off`.
    #[arg(long, value_delimiter = ',', default_value = "off,adaptive", conflicts_with = "rtt")]
    pub poll: Vec<exitless_vmm::poll::PollMode>,
    /// Measure round trips instead (one frame in flight through a netecho guest), with the
    /// device thread's polling off and adaptive.
    #[arg(long)]
    pub rtt: bool,
    /// Round trips per run, with --rtt.
    #[arg(long, default_value_t = 2000, requires = "rtt", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub rounds: u64,
}

impl NetArgs {
    pub fn to_rtt_options(&self) -> exitless_lab::net_rtt::RttOptions {
        exitless_lab::net_rtt::RttOptions {
            rounds: self.rounds,
            // One size: the first given (256 bytes by default).
            size: self.sizes.first().copied().unwrap_or(256),
            repeat: self.repeat,
            outputs: outputs(&self.out),
            timeout: std::time::Duration::from_secs_f64(self.timeout),
        }
    }

    pub fn to_options(&self) -> exitless_lab::net::Options {
        exitless_lab::net::Options {
            sizes: self.sizes.clone(),
            kinds: self.frames.clone(),
            seconds: self.seconds,
            repeat: self.repeat,
            polls: exitless_vmm::poll::distinct(self.poll.iter().copied()),
            outputs: outputs(&self.out),
            timeout: std::time::Duration::from_secs_f64(self.timeout),
        }
    }
}

fn parse_frame_kind(s: &str) -> Result<exitless_lab::sink::FrameKind, String> {
    use exitless_lab::sink::FrameKind;
    match s {
        "lab" => Ok(FrameKind::Lab),
        "tso" => Ok(FrameKind::Tso),
        "tcp" => Ok(FrameKind::Plain),
        _ => Err(format!("{s:?} is not lab, tso or tcp")),
    }
}

/// A frame size: 64 bytes to 64K; 64K means the largest frame the tap takes (65535).
fn parse_frame_size(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    match n {
        65536 => Ok(65535),
        64..=65535 => Ok(n as usize),
        _ => Err(format!("frame size '{s}' is not between 64 and 64K")),
    }
}

#[derive(Args)]
pub struct PciArgs {
    /// Timed dword config reads per method.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub reads: u64,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Give up on a guest that has not finished within this many seconds.
    #[arg(long, default_value_t = 600.0, value_parser = parse_seconds)]
    pub timeout: f64,
}

impl PciArgs {
    pub fn to_options(&self) -> exitless_lab::pci::Options {
        exitless_lab::pci::Options {
            reads: self.reads,
            outputs: outputs(&self.out),
            timeout: std::time::Duration::from_secs_f64(self.timeout),
        }
    }
}

#[derive(Args)]
pub struct DoorbellArgs {
    /// Rings per path per repeat.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub iters: u64,
    /// Repeats; paths are interleaved across them and medians reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeat: u32,
    /// Privilege level of the guest's ring loop (on a nested host CPL0 code is emulated).
    #[arg(long, default_value_t = 3, value_parser = parse_cpl)]
    pub cpl: u8,
    /// Only these paths, comma-separated (default: the published table's; check-* paths
    /// test KVM's matching rules).
    #[arg(long, value_delimiter = ',')]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Give up on a guest that has not finished within this many seconds.
    #[arg(long, default_value_t = 300.0, value_parser = parse_seconds)]
    pub timeout: f64,
}

impl DoorbellArgs {
    pub fn to_options(&self) -> Result<exitless_lab::doorbell::Options, String> {
        use exitless_lab::doorbell::{find_path, PATHS};
        let paths = if self.paths.is_empty() {
            PATHS.iter().collect()
        } else {
            self.paths
                .iter()
                .map(|n| find_path(n).ok_or_else(|| format!("no doorbell path '{n}' (have: {})", path_names())))
                .collect::<Result<_, _>>()?
        };
        Ok(exitless_lab::doorbell::Options {
            iters: self.iters,
            repeat: self.repeat,
            cpl: self.cpl,
            paths,
            outputs: outputs(&self.out),
            timeout: std::time::Duration::from_secs_f64(self.timeout),
        })
    }
}

fn path_names() -> String {
    use exitless_lab::doorbell::{CHECK_PATHS, PATHS};
    PATHS.iter().chain(CHECK_PATHS).map(|p| p.name).collect::<Vec<_>>().join(", ")
}

fn parse_cpl(s: &str) -> Result<u8, String> {
    match s {
        "0" => Ok(0),
        "3" => Ok(3),
        _ => Err(format!("'{s}' is not 0 or 3")),
    }
}

#[derive(Args)]
pub struct BootArgs {
    /// How many runs (the median is reported).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// Guest memory size.
    #[arg(long, default_value = "128M", value_parser = parse_size)]
    pub mem: u64,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

impl BootArgs {
    pub fn to_options(&self) -> exitless_lab::boot::Options {
        exitless_lab::boot::Options { runs: self.runs, mem: self.mem, json: self.json.clone() }
    }
}

#[derive(Args)]
pub struct FleetArgs {
    /// How many microVMs.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub vms: u32,
    /// Guest RAM per microVM, in MiB (mapped, barely touched by the idle guest).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub mem_mib: u32,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// How long one microVM may take to come up, or to stop.
    #[arg(long, default_value_t = 60.0, value_parser = parse_seconds)]
    pub timeout: f64,
}

impl FleetArgs {
    pub fn to_options(&self) -> exitless_lab::fleet::Options {
        exitless_lab::fleet::Options {
            vms: self.vms,
            mem_mib: self.mem_mib,
            json: self.json.clone(),
            timeout: std::time::Duration::from_secs_f64(self.timeout),
        }
    }
}

fn outputs(out: &OutputArgs) -> exitless_lab::report::Outputs {
    exitless_lab::report::Outputs { json: out.json.clone(), svg: out.svg.clone() }
}
