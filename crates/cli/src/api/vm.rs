//! The microVM behind the API: its pre-boot configuration, and once started the running
//! machine (shared with the thread that runs its vCPUs, so its exit profile can be read
//! live). Every change is checked here; the HTTP layer only maps errors to 400s.

use super::model::{
    BootSource, Drive, Logger, MachineConfig, MachineConfigUpdate, Metrics, NetworkInterface, PartialDrive,
    PartialNetworkInterface, VmConfig, VmState,
};
use crate::report;
use exitless_vmm::device_manager::TransportKind;
use exitless_vmm::virtio;
use exitless_vmm::virtio::blk::DriveConfig;
use exitless_vmm::{HugePages, Machine, NetConfig};
use std::sync::Arc;
use std::time::Instant;

/// Why a request was refused; the text goes back as Firecracker's `fault_message`.
#[derive(Debug, PartialEq, Eq)]
pub struct Fault(pub String);

impl<T: std::fmt::Display> From<T> for Fault {
    fn from(e: T) -> Self {
        Fault(e.to_string())
    }
}

const AFTER_START: &str = "The requested operation is not supported after starting the microVM.";
/// How long a pause may take: a vCPU leaves the guest within a kick or two.
const PAUSE_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Firecracker's bound on a microVM's vCPUs.
const MAX_VCPUS: u8 = 32;

pub enum State {
    NotStarted,
    Running {
        machine: Arc<Machine>,
        since: Instant,
    },
    /// The guest stopped; the process is on its way out.
    Exited,
}

pub struct Vm {
    pub id: String,
    pub config: VmConfig,
    pub state: State,
    /// `--boot-timer`: Firecracker's boot-timer device.
    pub boot_timer: bool,
    /// `--enable-pci`: virtio-pci devices; else virtio-mmio and `pci=off`, as Firecracker.
    pub enable_pci: bool,
    /// `--host-profile`.
    pub host_profile: exitless_vmm::host::ProfileChoice,
    /// MMDS's document and settings, shared with the NICs that answer it (api::mmds).
    pub mmds: exitless_vmm::net::mmds::SharedMmds,
    /// Landlock on (not `--no-landlock`), and the paths the process and `--landlock-rule`
    /// add to the microVM's own (api::landlock).
    pub landlock: bool,
    pub landlock_rules: Vec<(std::path::PathBuf, exitless_vmm::landlock::Reach)>,
    /// `--ram-dir`: where a booted guest's RAM is kept in a file (exitless_vmm::snapshot::fork).
    pub ram_dir: Option<std::path::PathBuf>,
    /// Plugs and unplugs devices once the machine runs (api/devices/plug.rs).
    pub plug_worker: Option<super::plug_worker::Worker>,
    /// vhost-user drives' backends, connected when configured (api/devices/vublk.rs).
    pub vublk: exitless_vmm::virtio::vublk::Connections,
}

impl Vm {
    pub fn new(id: String) -> Self {
        Vm {
            id,
            config: VmConfig::default(),
            state: State::NotStarted,
            boot_timer: false,
            enable_pci: false,
            host_profile: Default::default(),
            mmds: Arc::new(std::sync::Mutex::new(exitless_vmm::net::mmds::Mmds::new(
                exitless_vmm::net::mmds::DEFAULT_SIZE_LIMIT,
            ))),
            landlock: false,
            landlock_rules: Vec::new(),
            ram_dir: None,
            plug_worker: None,
            vublk: Default::default(),
        }
    }

    pub fn state_name(&self) -> &'static str {
        match self.state {
            State::NotStarted => "Not started",
            State::Running { ref machine, .. } if machine.control().is_paused() => "Paused",
            State::Running { .. } => "Running",
            State::Exited => "Exited",
        }
    }

    pub(super) fn pre_boot(&self) -> Result<(), Fault> {
        match self.state {
            State::NotStarted => Ok(()),
            _ => Err(Fault(AFTER_START.into())),
        }
    }

    pub fn set_machine_config(&mut self, mut c: MachineConfig) -> Result<(), Fault> {
        self.pre_boot()?;
        if c.vcpu_count == 0 || c.vcpu_count > MAX_VCPUS {
            return Err(Fault(format!("Invalid vCPU count: it must be between 1 and {MAX_VCPUS}.")));
        }
        // Firecracker's rule: with SMT, vCPUs come in pairs (one vCPU is a lone thread).
        if c.smt && c.vcpu_count > 1 && c.vcpu_count % 2 == 1 {
            return Err(Fault("The number of vCPUs must be 1 or an even number when SMT is enabled.".into()));
        }
        let huge = huge_pages(c.huge_pages.as_deref())?;
        if c.mem_size_mib == 0 || c.mem_size_mib > 1 << 20 {
            return Err(Fault("Invalid memory size: mem_size_mib must be between 1 and 1048576.".into()));
        }
        if huge == HugePages::Hugetlbfs2M && !c.mem_size_mib.is_multiple_of(2) {
            return Err(Fault(
                "The memory size (MiB) is either 0, or not a multiple of the configured page size.".into(),
            ));
        }
        if self.config.balloon.is_some_and(|b| u64::from(b.amount_mib) > c.mem_size_mib) {
            return Err(Fault(
                "Machine config error: The memory size (MiB) is smaller than the previously set balloon device target size."
                    .into(),
            ));
        }
        // Last: it may drop a custom template, which nothing above may then refuse to.
        self.take_cpu_template(&mut c)?;
        self.config.machine_config = c;
        Ok(())
    }

    pub fn update_machine_config(&mut self, u: MachineConfigUpdate) -> Result<(), Fault> {
        let c = self.config.machine_config.clone();
        self.set_machine_config(MachineConfig {
            vcpu_count: u.vcpu_count.unwrap_or(c.vcpu_count),
            mem_size_mib: u.mem_size_mib.unwrap_or(c.mem_size_mib),
            smt: u.smt.unwrap_or(c.smt),
            track_dirty_pages: u.track_dirty_pages.unwrap_or(c.track_dirty_pages),
            cpu_template: u.cpu_template,
            huge_pages: u.huge_pages.or(c.huge_pages),
        })
    }

    pub fn set_boot_source(&mut self, b: BootSource) -> Result<(), Fault> {
        self.pre_boot()?;
        if !std::path::Path::new(&b.kernel_image_path).is_file() {
            return Err(Fault(format!("The kernel file cannot be opened: {} is not a file.", b.kernel_image_path)));
        }
        if let Some(initrd) = b.initrd_path.as_deref().filter(|p| !std::path::Path::new(p).is_file()) {
            return Err(Fault(format!("The initrd file cannot be opened: {initrd} is not a file.")));
        }
        self.config.boot_source = Some(b);
        Ok(())
    }

    pub fn set_drive(&mut self, id: &str, d: Drive) -> Result<(), Fault> {
        let running = matches!(self.state, State::Running { .. });
        if !running {
            self.pre_boot()?;
        }
        same_id(id, &d.drive_id)?;
        if d.socket.is_some() || d.path_on_host.is_none() {
            return self.set_vhost_user_drive(id, d, running);
        }
        if !matches!(d.io_engine.as_deref(), None | Some("Sync") | Some("Async")) {
            return Err(Fault("io_engine must be Sync or Async.".into()));
        }
        if !matches!(d.cache_type.as_deref(), None | Some("Unsafe") | Some("Writeback")) {
            return Err(Fault("cache_type must be Unsafe or Writeback.".into()));
        }
        if d.is_root_device && self.config.drives.iter().any(|o| o.is_root_device && o.drive_id != id) {
            return Err(Fault("A root block device already exists!".into()));
        }
        let path = d.path_on_host.as_deref().unwrap_or_default();
        if !std::path::Path::new(path).exists() {
            return Err(Fault(format!("Unable to open the block device backing file {path}.")));
        }
        self.vublk.forget(id);
        if running {
            return self.plug_drive(id, d);
        }
        match self.config.drives.iter_mut().find(|o| o.drive_id == id) {
            Some(old) => *old = d,
            None => self.config.drives.push(d),
        }
        Ok(())
    }

    pub fn set_network_interface(&mut self, id: &str, n: NetworkInterface) -> Result<(), Fault> {
        let running = matches!(self.state, State::Running { .. });
        if !running {
            self.pre_boot()?;
        }
        same_id(id, &n.iface_id)?;
        if running && self.config.network_interfaces.iter().any(|o| o.iface_id == id) {
            return Err(Fault(format!("Device ID in use: the microVM has a network interface {id} already.")));
        }
        if n.mtu.is_some_and(|m| m < 68) {
            return Err(Fault("mtu must be between 68 and 65535.".into()));
        }
        if let Some(mac) = &n.guest_mac {
            crate::args::parse_mac(mac).map_err(|e| Fault(format!("guest_mac: {e}")))?;
        }
        exitless_vmm::net::tap::check_name(&n.host_dev_name)?;
        let others = self.config.network_interfaces.iter().filter(|o| o.iface_id != id);
        if others.clone().any(|o| o.host_dev_name == n.host_dev_name) {
            return Err(Fault(format!("The host device {} is already used by another interface.", n.host_dev_name)));
        }
        if n.guest_mac.is_some() && others.clone().any(|o| o.guest_mac == n.guest_mac) {
            return Err(Fault("The guest MAC address is already used by another interface.".into()));
        }
        if others.count() >= usize::from(super::model::MAX_NICS) {
            let most = super::model::MAX_NICS;
            return Err(Fault(format!("exitless offers at most {most} network interfaces per microVM.")));
        }
        if running {
            return self.plug_network_interface(n);
        }
        match self.config.network_interfaces.iter_mut().find(|o| o.iface_id == id) {
            Some(old) => *old = n,
            None => self.config.network_interfaces.push(n),
        }
        Ok(())
    }

    /// `PATCH /drives/{id}` on a running guest: a new backing file (capacity re-read, the
    /// guest told by a configuration-change interrupt) and/or new rate limits.
    pub fn update_drive(&mut self, id: &str, p: PartialDrive) -> Result<(), Fault> {
        same_id(id, &p.drive_id)?;
        let machine = self.running("drives are updated on a running one")?.clone();
        let drive = self.config.drives.iter_mut().find(|d| d.drive_id == id);
        let drive = drive.ok_or_else(|| Fault(format!("No drive with id {id}.")))?;
        if drive.socket.is_some() || (p.path_on_host.is_none() && p.rate_limiter.is_none()) {
            return self.update_vhost_user_drive(machine, id, p);
        }
        if let Some(path) = p.path_on_host {
            machine
                .devices()
                .update_drive(id, std::path::Path::new(&path))
                .map_err(|e| Fault(format!("Unable to patch the block device: {}", crate::with_causes(&e))))?;
            drive.path_on_host = Some(path);
        }
        if let Some(limiter) = p.rate_limiter {
            machine.devices().set_drive_limits(id, limiter.limits()).map_err(|e| Fault(e.to_string()))?;
            drive.rate_limiter = Some(limiter);
        }
        Ok(())
    }

    /// `PATCH /network-interfaces/{id}`: new rate limits.
    pub fn update_network_interface(&mut self, id: &str, p: PartialNetworkInterface) -> Result<(), Fault> {
        same_id(id, &p.iface_id)?;
        let machine = self.running("network interfaces are updated on a running one")?.clone();
        // The NICs were built in the configuration's order.
        let index = self.config.network_interfaces.iter().position(|n| n.iface_id == id);
        let index = index.ok_or_else(|| Fault(format!("No network interface with id {id}.")))?;
        let (rx, tx) = (p.rx_rate_limiter.map(|l| l.limits()), p.tx_rate_limiter.map(|l| l.limits()));
        machine.devices().set_net_limits(id, rx, tx).map_err(|e| Fault(e.to_string()))?;
        let nic = &mut self.config.network_interfaces[index];
        if p.rx_rate_limiter.is_some() {
            nic.rx_rate_limiter = p.rx_rate_limiter;
        }
        if p.tx_rate_limiter.is_some() {
            nic.tx_rate_limiter = p.tx_rate_limiter;
        }
        Ok(())
    }

    /// `PUT /vsock`: a virtio-vsock device (again: its new settings), before boot. The
    /// socket is bound at the start; a path that exists is refused then.
    pub fn set_vsock(&mut self, v: super::model::Vsock) -> Result<(), Fault> {
        self.pre_boot()?;
        if v.uds_path.is_empty() {
            return Err(Fault("The vsock's uds_path is empty.".into()));
        }
        self.config.vsock = Some(v);
        Ok(())
    }

    /// `PUT /serial`: the console's output path and byte rate limit, before boot (and before
    /// a snapshot load, whose console it also sets, as Firecracker's does).
    pub fn set_serial(&mut self, s: super::model::Serial) -> Result<(), Fault> {
        self.pre_boot()?;
        if s.serial_out_path.as_deref() == Some("") {
            return Err(Fault("The serial_out_path is empty.".into()));
        }
        self.config.serial = Some(s);
        Ok(())
    }

    /// `PUT /entropy`: a virtio-rng device (again: its new rate limits), before boot.
    pub fn set_entropy(&mut self, e: super::model::Entropy) -> Result<(), Fault> {
        self.pre_boot()?;
        self.config.entropy = Some(e);
        Ok(())
    }

    pub fn set_logger(&mut self, l: Logger) -> Result<(), Fault> {
        self.pre_boot()?;
        super::logging::set(&l)?;
        self.config.logger = Some(l);
        Ok(())
    }

    pub fn set_metrics(&mut self, m: Metrics, metrics: &super::metrics::Metrics) -> Result<(), Fault> {
        self.pre_boot()?;
        // `--metrics-path` opened one already, or an earlier PUT did: Firecracker's refusal.
        if self.config.metrics.is_some() || metrics.is_open() {
            return Err(Fault("Reinitialization of metrics not allowed.".into()));
        }
        metrics.open(&m.metrics_path)?;
        self.config.metrics = Some(m);
        Ok(())
    }

    /// The running machine, or a fault saying the microVM is not running and `why` it must be.
    pub(super) fn running(&self, why: &str) -> Result<&Arc<Machine>, Fault> {
        match &self.state {
            State::Running { machine, .. } => Ok(machine),
            _ => Err(Fault(format!("The microVM is {}: {why}.", self.state_name()))),
        }
    }

    /// `PATCH /vm`: pauses every vCPU (each out of the guest, parked) or lets them run.
    pub fn set_state(&mut self, state: VmState) -> Result<(), Fault> {
        let machine = self.running("only a running one can be paused or resumed")?;
        match state {
            VmState::Paused => machine
                .control()
                .pause(exitless_vmm::run_control::kick::kick_signal(), PAUSE_LIMIT)
                .map_err(|e| Fault(format!("Failed to pause the vCPUs: {e}."))),
            VmState::Resumed => {
                machine.resume();
                Ok(())
            }
        }
    }

    /// `SendCtrlAltDel`: the three keys on the guest's PS/2 keyboard, with IRQ 1.
    pub fn send_ctrl_alt_del(&self) -> Result<(), Fault> {
        match self.running("SendCtrlAltDel needs a running one")?.send_ctrl_alt_del() {
            true => Ok(()),
            false => Err(Fault("The guest is not taking keys: its keyboard is disabled or not read.".into())),
        }
    }

    /// Builds the machine from the configuration (or resumes a snapshot's); the caller runs it.
    pub fn build(&mut self, restore: Option<exitless_vmm::snapshot::Restore>) -> Result<Machine, Fault> {
        self.pre_boot()?;
        let mc = &self.config.machine_config;
        let mem = mc.mem_size_mib << 20;
        let (image, initrd, cmdline) = match (&restore, &self.config.boot_source) {
            // A restored guest's kernel is in its memory already.
            (Some(_), _) => (Vec::new(), None, String::new()),
            (None, None) => {
                return Err(Fault("Cannot start microvm that was not configured: the boot source is missing.".into()))
            }
            (None, Some(boot)) => (
                crate::args::read_bounded("kernel", boot.kernel_image_path.as_ref(), mem)?,
                boot.initrd_path.as_ref().map(|p| crate::args::read_bounded("initrd", p.as_ref(), mem)).transpose()?,
                boot.boot_args.clone().unwrap_or_else(|| exitless_vmm::boot::DEFAULT_CMDLINE.into()),
            ),
        };
        let nets = self
            .config
            .network_interfaces
            .iter()
            .enumerate()
            .map(|(i, n)| self.net_config(i, n))
            .collect::<Result<Vec<_>, Fault>>()?;
        // The root device first: it becomes /dev/vda.
        let mut drives: Vec<&Drive> = self.config.drives.iter().collect();
        drives.sort_by_key(|d| !d.is_root_device);
        // Firecracker's builder: without PCI, `pci=off`; then the root drive. A restored
        // guest keeps the transport its snapshot was taken on, whatever the flag says.
        let transport = match &restore {
            Some(r) => r.state.devices.transport().unwrap_or_default(),
            None if self.enable_pci => TransportKind::Pci,
            None => TransportKind::Mmio,
        };
        let cmdline = match transport {
            TransportKind::Mmio if restore.is_none() => format!("{cmdline} pci=off"),
            _ => cmdline,
        };
        let cmdline = match drives.first().filter(|d| d.is_root_device && restore.is_none()) {
            Some(root) => format!("{cmdline} {}", root_args(root, self.vublk.read_only(&root.drive_id))),
            None => cmdline,
        };
        // The devices in files of their own (api/devices/) and their command-line words.
        let (more_devices, words) = self.device_attaches();
        let cmdline = match restore {
            None => words.iter().fold(cmdline, |line, word| format!("{line} {word}")),
            Some(_) => cmdline,
        };
        // Each device made by its own module, in the order they are placed (a restore puts
        // each where its snapshot had it, whatever the order).
        let poll = exitless_vmm::poll::PollMode::Adaptive;
        let mut devices: Vec<_> = nets.into_iter().map(|n| virtio::net::attach(n, poll)).collect();
        devices.extend(drives.into_iter().map(|d| match d.socket.is_some() {
            true => self.attach_vublk(d),
            false => virtio::blk::attach(drive_config(d), poll),
        }));
        let entropy = self.config.entropy.map(|e| super::model::limits(e.rate_limiter.as_ref()));
        devices.extend(entropy.map(virtio::rng::attach));
        let vsock = self.config.vsock.as_ref().map(|v| virtio::vsock::VsockConfig {
            guest_cid: u64::from(v.guest_cid),
            uds_path: v.uds_path.clone().into(),
            id: v.vsock_id.clone(),
        });
        devices.extend(vsock.map(|v| virtio::vsock::attach(v, poll)));
        devices.extend(more_devices);
        let (serial_out, serial_in) = super::serial::console(self.config.serial.as_ref()).map_err(Fault)?;
        let config = exitless_vmm::MachineConfig {
            mem_size: mem,
            vcpus: mc.vcpu_count,
            smt: mc.smt,
            cmdline,
            initrd,
            devices: exitless_vmm::DeviceConfig {
                boot_timer: self.boot_timer,
                transport,
                serial_in,
                serial_out,
                allocated: devices,
                ..Default::default()
            },
            // The thread that runs the machine waits under the main thread's filter; when the
            // guest stops it writes metrics, and hands the socket's removal to a thread
            // Landlock does not hold (api::socket_watch::Ender).
            run: exitless_vmm::RunOptions { confine_caller: true, ..Default::default() },
            host: self.host_profile,
            track_dirty_pages: self.config.machine_config.track_dirty_pages,
            huge_pages: huge_pages(self.config.machine_config.huge_pages.as_deref())?,
            ram_dir: self.ram_dir.clone(),
            memory_hotplug: self.memory_hotplug(),
            shared_memory: self.shared_memory(),
            cpu_template: self.cpu_template()?,
            restore,
            ..exitless_vmm::MachineConfig::new(image)
        };
        // Before the machine's threads start: each is held to the microVM's files.
        self.install_landlock()?;
        Machine::new(config).map_err(|e| Fault(format!("Cannot start the microVM: {}", crate::with_causes(&e))))
    }

    /// The NIC the machine gets for the `index`th network interface `n`.
    pub(super) fn net_config(&self, index: usize, n: &NetworkInterface) -> Result<NetConfig, Fault> {
        Ok(NetConfig {
            tap: n.host_dev_name.clone(),
            mac: n.guest_mac.as_deref().map(crate::args::parse_mac).transpose()?.unwrap_or_else(|| default_mac(index)),
            tx: exitless_vmm::virtio::net::TxMode::Zerocopy,
            mtu: n.mtu,
            rx_limits: super::model::limits(n.rx_rate_limiter.as_ref()),
            tx_limits: super::model::limits(n.tx_rate_limiter.as_ref()),
            mmds: self.mmds_on(&n.iface_id).map(|ip| (self.mmds.clone(), ip)),
            offloads: n.offloads.unwrap_or(true),
            config_id: Some(n.iface_id.clone()),
        })
    }

    /// The live exit profile (`GET /exits`).
    pub fn exits(&self) -> serde_json::Value {
        match &self.state {
            State::Running { machine, since } => {
                let mut json = report::json(&machine.live_report());
                json["state"] = self.state_name().into();
                json["uptime_ms"] = (since.elapsed().as_secs_f64() * 1e3).into();
                json
            }
            _ => serde_json::json!({"state": self.state_name()}),
        }
    }

    /// What the machine counted, for a metrics line in Firecracker's groups.
    pub fn metrics_sample(&self) -> super::metrics::Sample {
        let mut sample = super::metrics::Sample { exits: self.exits(), ..Default::default() };
        let State::Running { machine, .. } = &self.state else { return sample };
        let report = machine.live_report();
        use exitless_vmm::stats::ExitKind;
        for (field, kind) in [
            ("exit_io_in", ExitKind::IoIn),
            ("exit_io_out", ExitKind::IoOut),
            ("exit_mmio_read", ExitKind::MmioRead),
            ("exit_mmio_write", ExitKind::MmioWrite),
        ] {
            sample.count("vcpu", field, report.stats.exits(kind));
        }
        for (name, counts) in report.devices.iter().zip(&report.stats.devices) {
            let group = match name.as_str() {
                "serial" => "uart",
                "i8042" => "i8042",
                _ => continue,
            };
            sample.count(group, "read_count", counts.reads);
            sample.count(group, "write_count", counts.writes);
        }
        for (_, id, d) in &report.drives {
            sample.block(
                id,
                &[
                    ("read_count", d.reads),
                    ("write_count", d.writes),
                    ("read_bytes", d.read_bytes),
                    ("write_bytes", d.write_bytes),
                    ("flush_count", d.flushes),
                    ("execute_fails", d.errors),
                    ("invalid_reqs_count", d.bad_requests),
                    ("queue_event_count", d.kicks),
                    ("rate_limiter_throttled_events", d.throttled),
                ],
            );
        }
        Self::sample_vublk(machine, &mut sample);
        if let Ok((balloon, _)) = machine.devices().balloon() {
            use std::sync::atomic::Ordering::Relaxed;
            let c = &balloon.shared.counters;
            for (field, n) in [
                ("inflate_count", &c.inflates),
                ("deflate_count", &c.deflates),
                ("stats_updates_count", &c.stats_updates),
                ("stats_update_fails", &c.stats_update_fails),
                ("free_page_report_count", &c.reported_ranges),
                ("free_page_report_freed", &c.reported_bytes),
                ("free_page_hint_count", &c.hinted_ranges),
                ("free_page_hint_freed", &c.hinted_bytes),
            ] {
                sample.count("balloon", field, n.load(Relaxed));
            }
        }
        if let Some((mem, _)) = machine.devices().virtio_of::<virtio::mem::MemHandle>().next() {
            use std::sync::atomic::Ordering::Relaxed;
            let c = &mem.shared.stats;
            for (field, n) in [
                ("queue_event_count", &c.kicks),
                ("plug_count", &c.plugs),
                ("unplug_count", &c.unplugs),
                ("unplug_all_count", &c.unplug_alls),
                ("state_count", &c.state_requests),
                ("invalid_reqs_count", &c.refused),
                ("queue_event_fails", &c.bad_chains),
                ("unplug_discard_fails", &c.discard_failures),
            ] {
                sample.count("memory_hotplug", field, n.load(Relaxed));
            }
        }
        for (nic, (_, n)) in self.config.network_interfaces.iter().zip(&report.nets) {
            sample.net(
                &nic.iface_id,
                &[
                    ("tx_packets_count", n.tx_frames),
                    ("tx_bytes_count", n.tx_bytes),
                    ("tx_count", n.tx_frames),
                    ("tx_fails", n.tx_dropped),
                    ("tx_malformed_frames", n.bad_chains),
                    ("tx_queue_event_count", n.kicks),
                    ("rx_packets_count", n.rx_frames),
                    ("rx_count", n.rx_frames),
                    ("rx_fails", n.rx_dropped),
                    ("rx_rate_limiter_throttled", n.rx_throttled),
                    ("tx_rate_limiter_throttled", n.tx_throttled),
                ],
            );
        }
        sample
    }
}

/// Firecracker's `huge_pages`: "None" (or absent) or "2M".
fn huge_pages(value: Option<&str>) -> Result<HugePages, Fault> {
    match value {
        None | Some("None") => Ok(HugePages::None),
        Some("2M") => Ok(HugePages::Hugetlbfs2M),
        Some(other) => Err(Fault(format!("huge_pages: unknown variant `{other}`, expected `None` or `2M`."))),
    }
}

/// What Firecracker adds to the command line for the root drive (builder.rs,
/// `attach_block_devices`): the device by name or by partition UUID, then ro or rw.
/// The virtio-blk device a drive becomes.
pub(super) fn drive_config(d: &Drive) -> DriveConfig {
    DriveConfig {
        readonly: d.is_read_only.unwrap_or(false),
        id: Some(d.drive_id.chars().take(exitless_vmm::virtio::blk::request::ID_LEN).collect()),
        config_id: Some(d.drive_id.clone()),
        thread_pool: d.io_engine.as_deref() == Some("Sync"),
        limits: super::model::limits(d.rate_limiter.as_ref()),
        ..DriveConfig::new(d.path_on_host.as_deref().unwrap_or_default())
    }
}

fn root_args(root: &Drive, vublk_read_only: bool) -> String {
    let device = match &root.partuuid {
        Some(uuid) => format!("root=PARTUUID={uuid}"),
        None => "root=/dev/vda".to_string(),
    };
    // A vhost-user drive is read-only where its backend offers VIRTIO_BLK_F_RO.
    let mode = if root.is_read_only.unwrap_or(false) || vublk_read_only { "ro" } else { "rw" };
    format!("{device} {mode}")
}

/// A resource's id in the path must be the one in its body.
fn same_id(path: &str, body: &str) -> Result<(), Fault> {
    match path == body {
        true => Ok(()),
        false => Err(Fault(format!("The id from the path ({path}) does not match the id from the body ({body})."))),
    }
}

/// Firecracker leaves the MAC to the guest when none is given; exitless needs one for
/// virtio-net's config space: a locally administered address, one per interface.
fn default_mac(index: usize) -> [u8; 6] {
    [0x06, 0x00, 0xac, 0x10, 0x00, 0x02 + (index as u8)]
}
