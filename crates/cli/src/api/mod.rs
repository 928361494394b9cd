//! `exitless --api-sock PATH`: Firecracker's process interface and REST API on a Unix
//! socket, so tooling written for Firecracker drives exitless unchanged. The HTTP is
//! hyper's (`server`); the endpoints are in `routes`, the microVM they act on in `vm`.
//!
//! The main thread serves the socket; InstanceStart hands the built machine to a thread
//! that runs it; when the guest stops, that thread writes the last metrics, removes the
//! socket and ends the process with the guest's status, as Firecracker does. SIGINT,
//! SIGTERM and SIGHUP remove the socket too, then end the process as Firecracker's do.
//! Unlike Firecracker, exitless also ends when its socket is removed under it
//! (`socket_watch`): an orchestrator tearing a VM down whose VMM it lost track of.

mod cpu_config;
pub(crate) mod devices;
pub mod fuzzing;
mod landlock;
pub mod log_rate;
pub mod logging;
mod metrics;
mod mmds;
pub mod model;
mod null;
mod plug_worker;
mod request;
mod routes;
mod serial;
mod server;
mod sink;
mod snapshot;
mod socket_watch;
mod vm;

use crate::args::ApiArgs;
use metrics::Metrics;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use vm::{State, Vm};

pub use logging::{filter_for as level_filter, init as init_logging};

/// Shared by the API thread and the thread that runs the machine.
struct Shared {
    vm: Mutex<Vm>,
    metrics: Metrics,
    socket: Option<PathBuf>,
    /// What removes the socket when the guest stops (socket_watch::Ender).
    ender: Option<socket_watch::Ender>,
}

/// Firecracker's exit code after SIGHUP (`FcExitCode::SIGHUP`).
const SIGHUP_EXIT: i32 = 156;

/// The flags exitless cannot honour: each refused in one line saying why.
fn refuse_unsupported(args: &ApiArgs) -> Result<(), String> {
    if args.seccomp_filter.is_some() {
        return Err("--seccomp-filter: a Firecracker filter file cannot be applied: exitless's threads make \
                    other system calls than Firecracker's (its own per-thread filters are always on; \
                    --no-seccomp turns them off)"
            .into());
    }
    Ok(())
}

pub fn run(args: ApiArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if args.version {
        println!("{}", crate::args::VERSION);
        return Ok(ExitCode::SUCCESS);
    }
    refuse_unsupported(&args)?;
    // Firecracker's snapshot queries: a version line, then the process ends.
    if args.snapshot_version {
        println!("v{}.0.0", exitless_vmm::snapshot::FORMAT_VERSION);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(path) = &args.describe_snapshot {
        let file = exitless_vmm::snapshot::SnapshotFile::read(path).map_err(|e| format!("--describe-snapshot: {e}"))?;
        println!("v{}.0.0", file.format);
        return Ok(ExitCode::SUCCESS);
    }
    if args.no_seccomp {
        exitless_vmm::seccomp::disable();
    }
    // Before any thread starts, so that every thread leaves the termination signals to
    // the one that removes the socket.
    exitless_vmm::termination::watch();
    // As Firecracker: SIGHUP exits 156 (SIGINT and SIGTERM end the process by the signal),
    // from the start: a signal that comes before the API answers ends it the same way.
    exitless_vmm::termination::exit_with(libc::SIGHUP, SIGHUP_EXIT);
    logging::set_format(logging::Format {
        show_level: args.show_level,
        show_origin: args.show_log_origin,
        module: args.module.clone(),
    });
    if let Some(path) = &args.log_path {
        logging::to_file(&path.to_string_lossy(), args.level.as_deref())?;
    }
    let socket = if args.no_api { None } else { Some(args.api_sock.clone()) };
    let mut vm = Vm::new(args.id.clone());
    vm.boot_timer = args.boot_timer;
    vm.enable_pci = args.enable_pci;
    vm.host_profile = args.host_profile;
    vm.ram_dir.clone_from(&args.ram_dir);
    let mmds_limit = args.mmds_size_limit.unwrap_or(args.http_api_max_payload_size);
    vm.mmds = Arc::new(Mutex::new(exitless_vmm::net::mmds::Mmds::load(mmds_limit, args.metadata.as_deref())?));
    vm.landlock = !args.no_landlock;
    vm.landlock_rules = landlock::process_rules(&args);
    // Before any machine is built (and Landlock set): the API socket's removal at the
    // end is this thread's, so nothing Landlock holds needs a right in its directory.
    let ender = match &socket {
        Some(path) => Some(socket_watch::Ender::start(path)?),
        None => None,
    };
    let shared = Arc::new(Shared { vm: Mutex::new(vm), metrics: Metrics::default(), socket, ender });
    // SIGHUP writes the metrics once more (counting it); each signal removes the socket
    // first. Registered before the bind: a client that sees the socket may signal at once.
    let _on_signal = {
        let shared = shared.clone();
        exitless_vmm::termination::on_signal(move |sig| {
            if sig == libc::SIGHUP && shared.metrics.is_open() {
                let mut sample = exitless_vmm::sync::lock(&shared.vm).metrics_sample();
                sample.count("signals", "sighup", 1);
                let _ = shared.metrics.write(sample);
            }
            if let Some(path) = &shared.socket {
                socket_watch::remove_own(path);
            }
        })
    };
    if let Some(path) = &args.metrics_path {
        shared.metrics.open(&path.to_string_lossy())?;
    }
    let limits = server::Limits::new(args.http_api_max_payload_size);
    let server = match &shared.socket {
        Some(path) => Some(
            server::Server::new(socket_watch::bind_own(path)?, limits)
                .map_err(|e| format!("cannot serve the API: {e}"))?,
        ),
        None => None,
    };
    if let Some(path) = &shared.socket {
        if let Err(e) = socket_watch::start(path) {
            tracing::warn!("the API socket is not watched: {e}");
        }
    }
    if let Some(file) = &args.config_file {
        // A config file that cannot be run ends the process: with the socket it bound
        // removed, so that the caller can start another VMM on the same path.
        if let Err(e) = run_config_file(&shared, file) {
            if let Some(path) = &shared.socket {
                socket_watch::remove_own(path);
            }
            return Err(e.into());
        }
    }
    shared.metrics.api_ready();
    match server {
        Some(server) => {
            server.serve(handler(shared.clone()))?;
            Ok(ExitCode::SUCCESS)
        }
        // --no-api: the machine runs until the guest stops, which ends the process.
        None => loop {
            std::thread::park();
        },
    }
}

/// The most a `--config-file` may hold: it names a machine's resources in a few KiB.
const MAX_CONFIG_FILE: u64 = 4 << 20;

/// `--config-file`: its resources, then the machine started.
fn run_config_file(shared: &Arc<Shared>, file: &Path) -> Result<(), String> {
    // A regular file, read to a bound: a FIFO or /dev/zero would hold the VMM forever.
    let text = exitless_vmm::files::read_regular_bounded(file, MAX_CONFIG_FILE).map_err(|e| e.to_string())?;
    let config: model::VmConfig =
        model::from_json(&text).map_err(|e| format!("{} is not a Firecracker config file: {e}", file.display()))?;
    let machine = configure(shared, config).map_err(|vm::Fault(m)| format!("{}: {m}", file.display()))?;
    start(shared, machine)
}

/// Each request: routed under the microVM's lock, then what it asks done.
fn handler(shared: Arc<Shared>) -> server::Handler {
    std::rc::Rc::new(move |method: &str, path: &str, body: &[u8]| {
        let method = method.to_ascii_uppercase();
        let (reply, then) = {
            let mut vm = exitless_vmm::sync::lock(&shared.vm);
            routes::handle(&mut vm, &shared.metrics, &method, path, body)
        };
        shared.metrics.count_request(&method, path, reply.status);
        match then {
            routes::Then::Start(machine, paused) => {
                if paused {
                    machine.control().pause_before_start();
                }
                if let Err(e) = start(&shared, *machine) {
                    eprintln!("exitless: {e}");
                    if let Some(path) = &shared.socket {
                        socket_watch::remove_own(path);
                    }
                    std::process::exit(1);
                }
            }
            routes::Then::FlushMetrics => flush_metrics(&shared),
            routes::Then::Nothing => {}
        }
        reply
    })
}

/// A config file's resources, in Firecracker's order, then the machine built from them.
fn configure(shared: &Shared, mut c: model::VmConfig) -> Result<exitless_vmm::Machine, vm::Fault> {
    if let Some(e) = c.too_many() {
        return Err(vm::Fault(format!("it lists {e}.")));
    }
    let mut vm = exitless_vmm::sync::lock(&shared.vm);
    if let Some(l) = c.logger.take() {
        vm.set_logger(l)?;
    }
    if let Some(m) = c.metrics.take() {
        vm.set_metrics(m, &shared.metrics)?;
    }
    vm.set_machine_config(c.machine_config.clone())?;
    // After the machine-config, as Firecracker: a custom template replaces a static one.
    if let Some(section) = c.cpu_config.take() {
        vm.set_cpu_config_section(section)?;
    }
    vm.set_boot_source(c.boot_source.take().ok_or_else(|| vm::Fault("boot-source is missing".into()))?)?;
    if let Some(s) = c.serial.take() {
        vm.set_serial(s)?;
    }
    for d in std::mem::take(&mut c.drives) {
        let id = d.drive_id.clone();
        vm.set_drive(&id, d)?;
    }
    for n in std::mem::take(&mut c.network_interfaces) {
        let id = n.iface_id.clone();
        vm.set_network_interface(&id, n)?;
    }
    if let Some(e) = c.entropy.take() {
        vm.set_entropy(e)?;
    }
    if let Some(v) = c.vsock.take() {
        vm.set_vsock(v)?;
    }
    // The balloon, pmem and memory hotplug: api/devices/.
    vm.configure_devices(&mut c)?;
    if let Some(m) = c.mmds_config.take() {
        vm.set_mmds_config(m)?;
    }
    vm.build(None)
}

fn flush_metrics(shared: &Shared) {
    let sample = exitless_vmm::sync::lock(&shared.vm).metrics_sample();
    if let Err(e) = shared.metrics.write(sample) {
        tracing::warn!("metrics: {e}");
    }
}

/// Runs `machine` on a thread of its own; when the guest stops, the process ends. The
/// calling thread built the machine; from here it only answers requests, under the Api
/// filter (so does the metrics thread).
fn start(shared: &Arc<Shared>, machine: exitless_vmm::Machine) -> Result<(), String> {
    let machine = Arc::new(machine);
    exitless_vmm::sync::lock(&shared.vm).state =
        State::Running { machine: machine.clone(), since: std::time::Instant::now() };
    // Metrics are configured before boot or never: without a file there is nothing to
    // flush, and no thread to start before the guest runs.
    if shared.metrics.is_open() {
        let periodic = shared.clone();
        std::thread::Builder::new()
            .name("api-metrics".into())
            .spawn(move || {
                if !exitless_vmm::seccomp::confine_or_log(exitless_vmm::seccomp::ThreadKind::Api) {
                    return;
                }
                loop {
                    std::thread::sleep(metrics::PERIOD);
                    flush_metrics(&periodic);
                }
            })
            .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    }
    let vm_shared = shared.clone();
    let shared = shared.clone();
    let control = machine.control().clone();
    let spawned = std::thread::Builder::new().name("vmm".into()).spawn(move || {
        let outcome = machine.run_shared(None);
        let status = match &outcome {
            Ok((report, error)) => {
                eprint!("{}", crate::report::profile(report));
                if let Some(e) = error {
                    eprintln!("exitless: {}", crate::with_causes(e));
                }
                if error.is_some() {
                    1
                } else {
                    report.exit_status.min(255) as i32
                }
            }
            Err(e) => {
                eprintln!("exitless: {}", crate::with_causes(e));
                1
            }
        };
        if shared.metrics.is_open() {
            flush_metrics(&shared);
        }
        exitless_vmm::sync::lock(&shared.vm).state = State::Exited;
        // Landlock holds this thread: the socket goes by a thread it does not hold.
        socket_watch::Ender::end(shared.ender.as_ref(), shared.socket.as_deref(), status);
    });
    if let Err(e) = spawned {
        eprintln!("exitless: cannot start the vmm thread: {e}");
        std::process::exit(1);
    }
    // The reply waits for the vCPUs: a request right after it (Ctrl-Alt-Del after a
    // restore, say) raises interrupts only once no vCPU state will overwrite them.
    if !control.wait_vcpus_created(std::time::Duration::from_secs(10)) {
        tracing::warn!("the vCPUs were not created within 10 s of the start");
    }
    // Devices plugged into the running guest are made on a thread the API's filter does
    // not hold (api/devices/plug.rs); a machine that can plug nothing (most of a fleet's
    // clones) runs none and keeps that thread's stack.
    let needs_worker = exitless_vmm::sync::lock(&vm_shared.vm).needs_plug_worker();
    if needs_worker {
        let worker = plug_worker::Worker::start().map_err(|e| format!("cannot start the hotplug worker: {e}"))?;
        exitless_vmm::sync::lock(&vm_shared.vm).plug_worker = Some(worker);
    }
    // Building the machine went deeper than answering requests ever does.
    exitless_vmm::heap::give_back_main_stack();
    exitless_vmm::seccomp::confine(exitless_vmm::seccomp::ThreadKind::Api)
        .map_err(|e| format!("cannot confine the API thread: {e}"))
}
