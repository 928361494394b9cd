//! Command-line arguments.

use clap::{Args, Parser, Subcommand};
use std::borrow::Cow;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "exitless",
    disable_version_flag = true,
    about = "A KVM VMM whose guest I/O avoids heavyweight exits",
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Firecracker's process interface alone, for the common start: an orchestrator spawning
/// the VMM with its flags. Parsing it does not build the commands' and labs' argument
/// trees, which were a tenth of the code a start touched (and kept resident).
#[derive(Parser)]
#[command(name = "exitless", disable_version_flag = true)]
struct FirecrackerCli {
    #[command(flatten)]
    api: ApiArgs,
}

/// What a parse gave: the arguments, or the exit code once help, the version or one line
/// saying what was wrong is printed (`who: ...`). A command alone (`exitless`, `exitless
/// bench`) prints its list of commands, not a one-liner.
pub fn parsed<T>(result: Result<T, clap::Error>, who: &str) -> Result<T, std::process::ExitCode> {
    use std::process::ExitCode;
    match result {
        Ok(args) => Ok(args),
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            Err(ExitCode::from(2))
        }
        Err(e) => {
            eprintln!("{who}: {}", one_line(&e));
            Err(ExitCode::from(2))
        }
    }
}

/// A clap error on one line, not clap's usage block: what was wrong, up to the usage text.
fn one_line(e: &clap::Error) -> String {
    let msg = e.to_string();
    let what: Vec<&str> =
        msg.lines().map(str::trim).take_while(|l| !l.starts_with("Usage:")).filter(|l| !l.is_empty()).collect();
    what.join(" ").trim_start_matches("error: ").to_string()
}

/// `--transport`: a transport, or `auto`.
#[derive(Clone, Copy, Debug)]
pub struct TransportChoice(Option<exitless_vmm::device_manager::TransportKind>);

pub fn parse_transport(s: &str) -> Result<TransportChoice, String> {
    use exitless_vmm::device_manager::TransportKind;
    match s {
        "auto" => Ok(TransportChoice(None)),
        "mmio" => Ok(TransportChoice(Some(TransportKind::Mmio))),
        "pci" => Ok(TransportChoice(Some(TransportKind::Pci))),
        _ => Err(format!("'{s}' is not auto, mmio or pci")),
    }
}

impl TransportChoice {
    /// The transport for a guest with `cmdline`: `auto` picks mmio when it turns PCI off.
    pub fn for_cmdline(self, cmdline: &str) -> exitless_vmm::device_manager::TransportKind {
        use exitless_vmm::device_manager::TransportKind;
        let pci_off = cmdline.split_whitespace().any(|w| w == "pci=off");
        self.0.unwrap_or(if pci_off { TransportKind::Mmio } else { TransportKind::Pci })
    }
}

impl Cli {
    /// The same result as `Cli::try_parse`, taking the short way when no argument names a
    /// command or asks for help or the version.
    pub fn try_parse_args() -> Result<Cli, clap::Error> {
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let long_way = ["run", "payloads", "bench", "top", "rebase-snap", "uffd-handler", "help", "-h", "--help"];
        if args.len() > 1 && !args[1..].iter().any(|a| long_way.iter().any(|w| a == w)) {
            return FirecrackerCli::try_parse_from(args).map(|f| Cli { command: None, api: f.api });
        }
        Cli::try_parse_from(args)
    }
}

/// The Firecracker release whose API and flags exitless serves.
pub const FIRECRACKER_API: &str = "1.16.1";

/// `--version`: Firecracker's own first line (`Firecracker v1.16.1` and a blank line, as
/// its main.rs prints it), then what this really is. Each client reads the first line
/// only: the Go SDK's pattern `Firecracker v(?P<version>[0-9]+\.[0-9]+\.[0-9]+-?.*)` takes
/// the rest of that line as the version and compares it with the API's
/// `firecracker_version`; Kata takes the line's second word less its `v` as a semantic
/// version of at least 0.21.1; firecracker-containerd checks none. Tested against each
/// parser in tests/gosdk (version_test.go).
pub const VERSION: &str = concat!(
    "Firecracker v1.16.1\n\nexitless v",
    env!("CARGO_PKG_VERSION"),
    ": a KVM VMM serving Firecracker v1.16.1's API and process interface"
);

/// With no command: Firecracker's process interface (its flags, its REST API). Every
/// flag of Firecracker v1.16 is here, with Firecracker's meaning or refused in one line
/// saying why (README: "Firecracker's flags").
#[derive(Args, Clone)]
pub struct ApiArgs {
    /// Prints the version (Firecracker's line, then exitless's) and exits.
    #[arg(short = 'V', long)]
    pub version: bool,
    /// Serve Firecracker's REST API on this Unix socket (with no command).
    #[arg(long, value_name = "PATH", default_value = "/run/firecracker.socket")]
    pub api_sock: PathBuf,
    /// The microVM's id (GET /, and every log line).
    #[arg(long, default_value = "anonymous-instance", value_parser = parse_instance_id)]
    pub id: String,
    /// Configure from this Firecracker JSON config file and boot at once.
    #[arg(long, value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Serve no API (needs --config-file).
    #[arg(long, requires = "config_file")]
    pub no_api: bool,
    /// Write the VMM's log to FILE (or FIFO).
    #[arg(long, value_name = "FILE")]
    pub log_path: Option<PathBuf>,
    /// Log level: Error, Warning, Info, Debug, Trace or Off.
    #[arg(long)]
    pub level: Option<String>,
    /// Log only events of modules whose path starts with this (e.g. exitless_vmm::virtio).
    #[arg(long, value_name = "MODULE")]
    pub module: Option<String>,
    /// Show each log line's level.
    #[arg(long)]
    pub show_level: bool,
    /// Show each log line's source file and line.
    #[arg(long)]
    pub show_log_origin: bool,
    /// Write metrics (Firecracker's JSON lines, with exitless's exit counts) to FILE (or FIFO).
    #[arg(long, value_name = "FILE")]
    pub metrics_path: Option<PathBuf>,
    /// Which host workarounds to install: `auto` (probe which KVM module serves /dev/kvm),
    /// `nested` (a KVM that emulates guest CPL0, such as kvm_pvm: CPUID masks, instruction
    /// completion, the LSTAR watch) or `native` (none). See docs/architecture.md.
    #[arg(long, value_name = "auto|nested|native", default_value = "auto")]
    pub host_profile: exitless_vmm::host::ProfileChoice,
    /// Run without seccomp filters (for debugging), as Firecracker's flag of that name.
    #[arg(long, conflicts_with = "seccomp_filter")]
    pub no_seccomp: bool,
    /// Run without Landlock (for debugging): by default, once a microVM is configured the
    /// threads a guest reaches (vCPUs, devices) reach only the files it was given (where the
    /// host kernel has Landlock); the API threads open what the client names.
    #[arg(long)]
    pub no_landlock: bool,
    /// One more path the VMM's vCPU and device threads may reach once started, read-write
    /// beneath it (`PATH:ro`: read only). Repeatable.
    #[arg(long, value_name = "PATH[:ro|:rw]", value_parser = parse_landlock_rule)]
    pub landlock_rule: Vec<(PathBuf, exitless_vmm::landlock::Reach)>,
    /// A Firecracker seccomp filter file: refused (exitless's threads make other calls than
    /// Firecracker's, so a filter written for them would stop exitless; its own per-thread
    /// filters are always on unless --no-seccomp).
    #[arg(long, value_name = "FILE")]
    pub seccomp_filter: Option<PathBuf>,
    /// Log the time from InstanceStart until the guest writes 123 to Firecracker's
    /// boot-timer address (0xc0000000), as Firecracker's boot-timer device does.
    #[arg(long)]
    pub boot_timer: bool,
    /// The largest API request body, in bytes (Firecracker's default).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_PAYLOAD, value_parser = parse_payload_size)]
    pub http_api_max_payload_size: usize,
    /// The MMDS data store's limit, in bytes (default: the API payload limit).
    #[arg(long, value_name = "BYTES", value_parser = parse_payload_size)]
    pub mmds_size_limit: Option<usize>,
    /// Initial MMDS contents: a JSON file.
    #[arg(long, value_name = "FILE")]
    pub metadata: Option<PathBuf>,
    /// virtio devices over PCI, as Firecracker's flag asks; without it they are virtio-mmio
    /// devices and `pci=off` is added to the guest's command line, as Firecracker does.
    #[arg(long)]
    pub enable_pci: bool,
    /// exitless: keep guest RAM in an unlinked file in DIR (a tmpfs, such as /dev/shm),
    /// mapped shared, so that a Full snapshot whose mem_file_path is on the same
    /// filesystem takes that file instead of writing guest memory (a pause that does not
    /// grow with it; the guest goes on copy-on-write over the file). See README.
    #[arg(long, value_name = "DIR", value_parser = parse_ram_dir)]
    pub ram_dir: Option<PathBuf>,
    /// Prints the snapshot format this exitless writes, as Firecracker does, and exits.
    #[arg(long)]
    pub snapshot_version: bool,
    /// Prints the format of the snapshot state FILE, and exits; a file that is not one is
    /// a one-line error.
    #[arg(long, value_name = "FILE")]
    pub describe_snapshot: Option<PathBuf>,
    /// Accepted for the jailer's sake: process start time (wall clock, microseconds).
    #[arg(long, hide = true)]
    pub start_time_us: Option<u64>,
    #[arg(long, hide = true)]
    pub start_time_cpu_us: Option<u64>,
    #[arg(long, hide = true)]
    pub parent_cpu_time_us: Option<u64>,
}

/// `--landlock-rule PATH[:ro|:rw]` (read-write when not said).
fn parse_landlock_rule(text: &str) -> Result<(PathBuf, exitless_vmm::landlock::Reach), String> {
    use exitless_vmm::landlock::Reach;
    let (path, reach) = match text.rsplit_once(':') {
        Some((path, "ro")) => (path, Reach::Read),
        Some((path, "rw")) => (path, Reach::Write),
        _ => (text, Reach::Write),
    };
    if path.is_empty() {
        return Err(format!("{text:?}: give a path, then :ro or :rw if not read-write"));
    }
    Ok((PathBuf::from(path), reach))
}

/// Firecracker's default bound on an API request body.
/// `--ram-dir`: a directory that exists.
fn parse_ram_dir(s: &str) -> Result<PathBuf, String> {
    match std::fs::metadata(s) {
        Ok(m) if m.is_dir() => Ok(PathBuf::from(s)),
        Ok(_) => Err(format!("{s} is not a directory")),
        Err(e) => Err(format!("{s}: {e}")),
    }
}

pub const DEFAULT_MAX_PAYLOAD: usize = 51_200;

/// A size in bytes for a body or data store: 1 byte to 1 GiB.
pub fn parse_payload_size(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=1 << 30).contains(&n) => Ok(n),
        _ => Err(format!("'{s}' is not a size in bytes between 1 and 1073741824")),
    }
}

/// Firecracker's rule for an instance id: 1 to 64 letters, digits and '-'.
fn parse_instance_id(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 64 || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(format!("'{s}' is not an instance id: 1 to 64 letters, digits or '-'"));
    }
    Ok(s.to_string())
}

#[derive(Subcommand)]
pub enum Command {
    /// Boot a guest (the built-in demo unless told otherwise) and print its serial output.
    Run(Box<RunArgs>),
    /// List the built-in guest payloads.
    Payloads(PayloadsArgs),
    /// Run a lab benchmark (`exitless bench --help` lists them; they live in
    /// exitless-bench, beside this binary).
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// A live view of a running microVM's exits per second, by reason and device (from
    /// its API socket's GET /exits), refreshed like kvm_stat.
    Top(TopArgs),
    /// Lay a Diff snapshot's memory file over its base, as Firecracker's rebase-snap does:
    /// the base then holds the memory of the Diff snapshot.
    RebaseSnap(RebaseArgs),
    /// Serve a restored guest's page faults from a snapshot's memory file: the page-fault
    /// handler of the Uffd memory backend (`"mem_backend": {"backend_type": "Uffd",
    /// "backend_path": SOCKET}`). Serves one VMM, until it is gone.
    UffdHandler(UffdHandlerArgs),
}

#[derive(Args)]
pub struct UffdHandlerArgs {
    /// The Unix socket to listen on (the load's backend_path).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// The snapshot's memory file.
    #[arg(long, value_name = "FILE")]
    pub mem_file: PathBuf,
}

#[derive(Args)]
pub struct RebaseArgs {
    /// The memory file of the snapshot the Diff was taken after (rewritten in place).
    #[arg(long, value_name = "FILE")]
    pub base_file: PathBuf,
    /// The Diff snapshot's memory file.
    #[arg(long, value_name = "FILE")]
    pub diff_file: PathBuf,
}

#[derive(Args, Clone)]
pub struct RunArgs {
    /// A built-in payload (see `exitless payloads`).
    #[arg(long, conflicts_with = "kernel")]
    pub payload: Option<String>,
    /// A kernel: a bzImage, or an ELF image (vmlinux) with a PVH note or a 64-bit entry point.
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// An initial ramdisk (a bzImage's initrd; a PVH guest's first module).
    #[arg(long, value_name = "FILE")]
    pub initrd: Option<PathBuf>,
    /// The kernel command line.
    #[arg(long, default_value = exitless_vmm::boot::DEFAULT_CMDLINE)]
    pub cmdline: String,
    /// Guest memory size, e.g. 128M or 8G (a multiple of 4K; RAM past 3G goes above 4G).
    #[arg(long, default_value = "128M", value_parser = parse_size)]
    pub mem: u64,
    /// Virtual CPUs (at most what KVM allows).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=254))]
    pub vcpus: u8,
    /// The transport of the virtio devices: `pci`, `mmio` (Firecracker's, found on the
    /// command line and in the DSDT), or `auto`: mmio when the command line says `pci=off`,
    /// else pci.
    #[arg(long, value_name = "auto|mmio|pci", default_value = "auto", value_parser = parse_transport)]
    pub transport: TransportChoice,
    /// PCI config access through ports 0xCF8/0xCFC: `off` makes Linux's type-1 probe fail,
    /// so it reads all of config space through ECAM (and the read-only mapped window).
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub pci_config_io: bool,
    /// Plug in the lab's devices (the doorbell at 00:01.0 and the idle port), which the
    /// doorbell, pciscan and net payloads use.
    #[arg(long)]
    pub lab: bool,
    /// Plug in QEMU's test devices as kvm-unit-tests expects them: fw_cfg (ports
    /// 0x510-0x511), pc-testdev and pci-testdev (1b36:0005); and a CMOS RTC (0x70) with
    /// ACPI S3, woken by its alarm.
    #[arg(long)]
    pub testdevs: bool,
    /// With --testdevs, also QEMU's edu device (1234:11e8) behind a model of an Intel VT-d
    /// IOMMU at 0xfed90000 that translates its DMA and remaps its interrupts (QEMU's
    /// `-device intel-iommu,intremap=on -device edu`, for kvm-unit-tests' intel_iommu).
    #[arg(long, requires = "testdevs")]
    pub testdev_iommu: bool,
    /// Which host workarounds to install: `auto` (probe which KVM module serves /dev/kvm),
    /// `nested` (a KVM that emulates guest CPL0, such as kvm_pvm: CPUID masks, instruction
    /// completion, the LSTAR watch) or `native` (none). See docs/architecture.md.
    #[arg(long, value_name = "auto|nested|native", default_value = "auto")]
    pub host_profile: exitless_vmm::host::ProfileChoice,
    /// A CPU template: Firecracker's C3, T2, T2S, T2CL (Intel) or T2A (AMD), or a custom
    /// template's JSON file (Firecracker's schema, as `PUT /cpu-config` takes it).
    #[arg(long, value_name = "NAME|FILE", value_parser = crate::cpu_template::parse_arg)]
    pub cpu_template: Option<exitless_vmm::cpu_template::CpuTemplate>,
    /// Run without seccomp filters (for debugging: every thread may then make any call).
    #[arg(long)]
    pub no_seccomp: bool,
    /// Write the exit profile as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Stop the guest after this many seconds (an error).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub timeout: Option<f64>,
    /// How the PCI ECAM window is served: `trap` (every access exits) or `mapped` (reads
    /// come from read-only memory, writes exit).
    #[arg(long, default_value = "mapped", value_parser = parse_ecam)]
    pub ecam: exitless_vmm::pci::EcamMode,
    /// How virtio-mmio register windows are served: `trap` (every access exits, as in
    /// Firecracker) or `mapped` (reads come from read-only memory, writes exit unless an
    /// ioeventfd takes them; where the host's KVM allows it, else trap).
    #[arg(long, default_value = "mapped", value_parser = parse_mmio_registers)]
    pub mmio_registers: exitless_vmm::virtio::mmio::RegisterMode,
    /// A virtio-net device on tap NAME (created if missing), e.g. `tap=tap0,mac=52:54:00:12:34:56`;
    /// repeatable, one device (and device thread) each. Without `mac`, the n-th NIC gets
    /// 52:54:00:e1:e5:0n.
    #[arg(long, value_name = "tap=NAME[,mac=MAC][,offloads=off]", value_parser = parse_net)]
    pub net: Vec<(String, Option<[u8; 6]>, bool)>,
    /// How virtio-net transmits: `copy` (through a VMM buffer) or `zerocopy` (iovecs into
    /// guest memory; chains under 2 KiB are copied either way).
    #[arg(long, default_value = "zerocopy", value_parser = parse_tx, requires = "net")]
    pub net_tx: exitless_vmm::virtio::net::TxMode,
    /// How long device threads poll for more work before they sleep: `off`, microseconds,
    /// or `adaptive` (a window that grows while polling finds work and shrinks to nothing
    /// when it does not; docs/polling.md).
    #[arg(long, value_name = "off|N|adaptive", default_value = "adaptive")]
    pub poll_us: exitless_vmm::poll::PollMode,
    /// A virtio-blk disk backed by FILE (repeatable): `readonly=on` refuses writes,
    /// `id=NAME` is its serial (GET_ID, up to 20 bytes), `direct=on` bypasses the host
    /// page cache (O_DIRECT) where the filesystem allows it; `iops=N` and `bw=SIZE` limit
    /// its requests and bytes per second (Firecracker's rate limiter).
    #[arg(long, value_name = "path=FILE[,readonly=on][,id=NAME][,direct=on][,engine=pool][,iops=N][,bw=SIZE]", value_parser = parse_drive)]
    pub drive: Vec<exitless_vmm::virtio::blk::DriveConfig>,
    /// A virtio-rng entropy device (bytes from the host's getrandom), as Firecracker's
    /// `PUT /entropy`.
    #[arg(long)]
    pub entropy: bool,
    /// A virtio-vsock device, as Firecracker's `PUT /vsock`: the guest's CID (any 32-bit
    /// number, as Firecracker takes it) and the Unix socket host processes connect to
    /// (`CONNECT <port>\n`); the guest's connections to port P reach `<uds>_P`.
    #[arg(long, value_name = "cid=N,uds=PATH", value_parser = parse_vsock)]
    pub vsock: Option<exitless_vmm::virtio::vsock::VsockConfig>,
    /// The flags of devices that own them (api/devices/parts.rs), in this place of --help.
    #[command(flatten)]
    pub devices: crate::api::devices::parts::RunFlags,
    /// MMDS on the first NIC at 169.254.169.254, serving FILE's JSON (as Firecracker's
    /// `PUT /mmds/config` and `--metadata`).
    #[arg(long, value_name = "FILE", requires = "net")]
    pub mmds: Option<PathBuf>,
    /// The MMDS version: V1 answers any GET, V2 wants a session token first.
    #[arg(long, value_name = "V1|V2", default_value = "V2", value_parser = parse_mmds_version, requires = "mmds")]
    pub mmds_version: exitless_vmm::net::mmds::Version,
    /// Parameters for the payload, comma-separated integers (payload-specific).
    #[arg(long, value_delimiter = ',', value_parser = parse_u64)]
    pub params: Vec<u64>,
    /// Sample where each vCPU is in the guest HZ times a second; the exit profile then
    /// lists where the guest spent its time (the busiest addresses, or functions with
    /// `--guest-symbols`).
    #[arg(long, value_name = "HZ", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub sample_guest: Option<u32>,
    /// End the run with an error once every vCPU has spun in place (the same few register
    /// states in every sample) or halted for SECS: a deadlock no timeout will end.
    #[arg(long, value_name = "SECS", requires = "sample_guest", value_parser = parse_seconds)]
    pub stuck_after: Option<f64>,
    /// A System.map (or `nm` output) naming the guest kernel's functions, for `--sample-guest`.
    #[arg(long, value_name = "FILE", requires = "sample_guest")]
    pub guest_symbols: Option<PathBuf>,
}

/// Reads a file the guest is given: a regular file (a FIFO would hang the reader, a file
/// like /dev/zero never ends), refused if larger than guest RAM before it is read all.
pub fn read_bounded(what: &str, path: &std::path::Path, limit: u64) -> Result<Vec<u8>, String> {
    use exitless_vmm::files::FileError;
    exitless_vmm::files::read_regular_bounded(path, limit).map_err(|e| match e {
        FileError::TooLarge { .. } => {
            format!("{what} {} is larger than the guest's {} MiB of RAM", path.display(), limit >> 20)
        }
        e => format!("{what}: {e}"),
    })
}

impl RunArgs {
    pub fn guest_symbols(&self) -> Result<exitless_vmm::vcpu::samples::Symbols, String> {
        let Some(path) = &self.guest_symbols else { return Ok(Default::default()) };
        // A regular file of at most 256 MiB: a System.map is a few.
        let bytes =
            exitless_vmm::files::read_regular_bounded(path, 256 << 20).map_err(|e| format!("--guest-symbols: {e}"))?;
        let text = String::from_utf8(bytes).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let symbols = exitless_vmm::vcpu::samples::Symbols::parse(&text);
        if symbols.is_empty() {
            return Err(format!("{} names no functions (expected System.map lines: ADDRESS T NAME)", path.display()));
        }
        Ok(symbols)
    }

    pub fn initrd(&self) -> Result<Option<Vec<u8>>, String> {
        self.initrd.as_ref().map(|p| read_bounded("initrd", p, self.mem)).transpose()
    }

    pub fn image(&self) -> Result<Cow<'static, [u8]>, String> {
        if let Some(path) = &self.kernel {
            return read_bounded("kernel", path, self.mem).map(Cow::Owned);
        }
        let name = self.payload.as_deref().unwrap_or(exitless_payloads::DEFAULT_PAYLOAD);
        exitless_payloads::find(name).map(|p| Cow::Borrowed(p.elf)).ok_or_else(|| {
            let known: Vec<_> = exitless_payloads::PAYLOADS.iter().map(|p| p.name).collect();
            format!("no built-in payload '{name}' (have: {})", known.join(", "))
        })
    }
}

#[derive(Args)]
pub struct TopArgs {
    /// The microVM's API socket (`exitless --api-sock PATH`).
    #[arg(long, value_name = "PATH")]
    pub api_sock: PathBuf,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0, value_parser = parse_seconds)]
    pub interval: f64,
    /// Stop after this many refreshes (default: until interrupted or the VM is gone).
    #[arg(long)]
    pub iterations: Option<u64>,
}

#[derive(Args)]
pub struct PayloadsArgs {
    /// Also write each payload's ELF image into DIR (to boot it under QEMU, say).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// `--json FILE` and `--svg FILE` of a lab.
#[derive(Args)]
pub struct OutputArgs {
    /// Write the table as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a bar chart of the table to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

mod devices;
pub use devices::*;

/// `128M`, `1G`, `4096K`, or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 10),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 20),
        t if t.ends_with('G') => (t[..t.len() - 1].to_string(), 30),
        t => (t, 0),
    };
    let n: u64 = digits.parse().map_err(|_| format!("'{s}' is not a size like 128M or 1G"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("size '{s}' is too large"))
}

pub(super) fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("'{s}' is not on or off")),
    }
}

fn parse_mmio_registers(s: &str) -> Result<exitless_vmm::virtio::mmio::RegisterMode, String> {
    match s {
        "trap" => Ok(exitless_vmm::virtio::mmio::RegisterMode::Trapped),
        "mapped" => Ok(exitless_vmm::virtio::mmio::RegisterMode::Mapped),
        _ => Err(format!("'{s}' is not trap or mapped")),
    }
}

fn parse_ecam(s: &str) -> Result<exitless_vmm::pci::EcamMode, String> {
    match s {
        "trap" => Ok(exitless_vmm::pci::EcamMode::Trapped),
        "mapped" => Ok(exitless_vmm::pci::EcamMode::Mapped),
        _ => Err(format!("'{s}' is not trap or mapped")),
    }
}

/// The MAC the first NIC gets when none is given (locally administered); the n-th gets
/// the same with n added to its last byte.
pub const DEFAULT_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xe1, 0xe5, 0x01];

impl RunArgs {
    /// One virtio-net device per `--net`, MACs given or derived from the position; the
    /// first answers MMDS with `--mmds`.
    pub fn nets(&self) -> Result<Vec<exitless_vmm::NetConfig>, String> {
        use exitless_vmm::net::mmds::{DEFAULT_ADDRESS, DEFAULT_SIZE_LIMIT};
        let mmds = match &self.mmds {
            Some(file) => {
                let mut store = exitless_vmm::net::mmds::Mmds::load(DEFAULT_SIZE_LIMIT, Some(file))?;
                store.version = self.mmds_version;
                Some((std::sync::Arc::new(std::sync::Mutex::new(store)), DEFAULT_ADDRESS))
            }
            None => None,
        };
        let derived = |i: usize| {
            let mut mac = DEFAULT_MAC;
            mac[5] = mac[5].wrapping_add(i as u8);
            mac
        };
        Ok(self
            .net
            .iter()
            .enumerate()
            .map(|(i, (tap, mac, offloads))| exitless_vmm::NetConfig {
                tx: self.net_tx,
                mmds: if i == 0 { mmds.clone() } else { None },
                offloads: *offloads,
                ..exitless_vmm::NetConfig::on_tap(tap.clone(), mac.unwrap_or_else(|| derived(i)))
            })
            .collect())
    }
}

pub fn parse_u64(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|_| format!("'{s}' is not a number"))
}

/// The longest time any option takes (a year): beyond it a Duration would overflow, and
/// no run needs it.
const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// Seconds, or 0 for "none of it".
pub fn parse_seconds_or_zero(s: &str) -> Result<f64, String> {
    if s.parse::<f64>() == Ok(0.0) {
        return Ok(0.0);
    }
    parse_seconds(s)
}

pub fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= MAX_SECONDS => Ok(v),
        Ok(v) if v > MAX_SECONDS => Err(format!("'{s}' seconds is more than a year (at most {MAX_SECONDS})")),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("128M"), Ok(128 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn net_options() {
        assert_eq!(parse_net("tap=t0").unwrap(), ("t0".into(), None, true));
        assert_eq!(parse_net("tap=t0,offloads=off").unwrap(), ("t0".into(), None, false));
        assert_eq!(parse_net("tap=t0,mac=02:00:00:00:00:0a").unwrap().1, Some([2, 0, 0, 0, 0, 10]));
        for bad in [
            "",
            "tap=",
            "mac=02:00:00:00:00:0a",
            "tap=t0,mac=zz",
            "tap=t0,mac=1:2:3",
            "tap=aaaaaaaaaaaaaaaa",
            "tap=t0,offloads=maybe",
            "tap=t0,x=1",
        ] {
            assert!(parse_net(bad).is_err(), "{bad}");
        }
    }
}
