//! `exitless --api-sock PATH`: Firecracker's process interface and REST API on a Unix
//! socket, so tooling written for Firecracker drives exitless unchanged. The HTTP is
//! tiny_http's; the endpoints are in `routes`, the microVM they act on in `vm`.
//!
//! One thread serves the socket; InstanceStart hands the built machine to a thread that
//! runs it; when the guest stops, that thread writes the last metrics, removes the socket
//! and ends the process with the guest's status, as Firecracker does. SIGINT, SIGTERM and
//! SIGHUP remove the socket too (the process then exits 128 + the signal).

pub mod fuzzing;
mod logging;
mod metrics;
pub mod model;
mod routes;
mod vm;

use crate::args::ApiArgs;
use metrics::Metrics;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use vm::{State, Vm};

/// Firecracker's default bound on a request body (`--http-api-max-payload-size`).
const MAX_BODY: usize = 51_200;

pub use logging::{filter_for as level_filter, init as init_logging};

/// Shared by the API thread and the thread that runs the machine.
struct Shared {
    vm: Mutex<Vm>,
    metrics: Metrics,
    socket: Option<PathBuf>,
}

pub fn run(args: ApiArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if args.no_seccomp {
        exitless_vmm::seccomp::disable();
    }
    // Before any thread starts (tiny_http starts one when it binds), so that every thread
    // leaves the termination signals to the one that removes the socket.
    exitless_vmm::termination::watch();
    if let Some(path) = &args.log_path {
        logging::to_file(&path.to_string_lossy(), args.level.as_deref())?;
    }
    let socket = if args.no_api { None } else { Some(args.api_sock.clone()) };
    let shared = Arc::new(Shared { vm: Mutex::new(Vm::new(args.id.clone())), metrics: Metrics::default(), socket });
    if let Some(path) = &args.metrics_path {
        shared.metrics.open(&path.to_string_lossy())?;
    }
    let server = match &shared.socket {
        Some(path) => Some(bind(path)?),
        None => None,
    };
    let _remove_socket = shared.socket.clone().map(|path| {
        exitless_vmm::termination::on_signal(move || {
            let _ = std::fs::remove_file(&path);
        })
    });
    if let Some(file) = &args.config_file {
        let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let config: model::VmConfig = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a Firecracker config file: {e}", file.display()))?;
        let machine = configure(&shared, config).map_err(|vm::Fault(m)| format!("{}: {m}", file.display()))?;
        start(&shared, machine)?;
    }
    match server {
        Some(server) => serve(&shared, &server),
        // --no-api: the machine runs until the guest stops, which ends the process.
        None => loop {
            std::thread::park();
        },
    }
}

/// The socket, refusing to take over a path that exists (another VMM may be serving it).
/// tiny_http starts its accepting thread as it binds, and that thread one per connection:
/// binding from a thread that confined itself first puts them all under its filter.
fn bind(path: &Path) -> Result<tiny_http::Server, String> {
    if path.exists() {
        return Err(format!(
            "cannot serve the API on {}: the path exists (remove a stale socket first)",
            path.display()
        ));
    }
    let path = path.to_path_buf();
    let binder = std::thread::Builder::new().name("api-bind".into()).spawn(move || {
        exitless_vmm::seccomp::confine(exitless_vmm::seccomp::ThreadKind::ApiSocket)
            .map_err(|e| format!("cannot confine the API's threads: {e}"))?;
        tiny_http::Server::http_unix(&path).map_err(|e| format!("cannot serve the API on {}: {e}", path.display()))
    });
    binder
        .map_err(|e| format!("cannot start the API's thread: {e}"))?
        .join()
        .map_err(|_| "the API's thread failed while binding".to_string())?
}

/// A config file's resources, in Firecracker's order, then the machine built from them.
fn configure(shared: &Shared, c: model::VmConfig) -> Result<exitless_vmm::Machine, vm::Fault> {
    let mut vm = shared.vm.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = c.logger {
        vm.set_logger(l)?;
    }
    if let Some(m) = c.metrics {
        vm.set_metrics(m, &shared.metrics)?;
    }
    vm.set_machine_config(c.machine_config)?;
    vm.set_boot_source(c.boot_source.ok_or_else(|| vm::Fault("boot-source is missing".into()))?)?;
    for d in c.drives {
        let id = d.drive_id.clone();
        vm.set_drive(&id, d)?;
    }
    for n in c.network_interfaces {
        let id = n.iface_id.clone();
        vm.set_network_interface(&id, n)?;
    }
    vm.build()
}

fn serve(shared: &Arc<Shared>, server: &tiny_http::Server) -> Result<ExitCode, Box<dyn std::error::Error>> {
    for mut request in server.incoming_requests() {
        let method = request.method().as_str().to_ascii_uppercase();
        let url = request.url().to_string();
        let mut body = Vec::new();
        let read = request.as_reader().take(MAX_BODY as u64 + 1).read_to_end(&mut body);
        let (reply, then) = if read.is_err() {
            (routes::Reply::fault("The request body could not be read."), routes::Then::Nothing)
        } else if body.len() > MAX_BODY {
            (routes::Reply::fault(format!("The request body is larger than {MAX_BODY} bytes.")), routes::Then::Nothing)
        } else {
            let mut vm = shared.vm.lock().unwrap_or_else(|e| e.into_inner());
            routes::handle(&mut vm, &shared.metrics, &method, &url, &body)
        };
        tracing::info!("api: {method} {url} -> {}", reply.status);
        match then {
            routes::Then::Start(machine) => start(shared, *machine)?,
            routes::Then::FlushMetrics => flush_metrics(shared),
            routes::Then::Nothing => {}
        }
        let _ = request.respond(response(reply));
    }
    Ok(ExitCode::SUCCESS)
}

fn response(reply: routes::Reply) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let body = reply.body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let mut r = tiny_http::Response::from_data(body).with_status_code(reply.status);
    if reply.status != 204 {
        if let Ok(h) = tiny_http::Header::from_bytes("Content-Type", "application/json") {
            r.add_header(h);
        }
    }
    r
}

fn flush_metrics(shared: &Shared) {
    let exits = shared.vm.lock().unwrap_or_else(|e| e.into_inner()).exits();
    if let Err(e) = shared.metrics.write(serde_json::json!({ "exits": exits })) {
        tracing::warn!("metrics: {e}");
    }
}

/// Runs `machine` on a thread of its own; when the guest stops, the process ends. The
/// calling thread built the machine; from here it only answers requests, under the Api
/// filter (so does the metrics thread).
fn start(shared: &Arc<Shared>, machine: exitless_vmm::Machine) -> Result<(), String> {
    let machine = Arc::new(machine);
    shared.vm.lock().unwrap_or_else(|e| e.into_inner()).state =
        State::Running { machine: machine.clone(), since: std::time::Instant::now() };
    let periodic = shared.clone();
    std::thread::Builder::new()
        .name("api-metrics".into())
        .spawn(move || {
            if !exitless_vmm::seccomp::confine_or_log(exitless_vmm::seccomp::ThreadKind::Api) {
                return;
            }
            loop {
                std::thread::sleep(metrics::PERIOD);
                if periodic.metrics.is_open() {
                    flush_metrics(&periodic);
                }
            }
        })
        .map_err(|e| format!("cannot start the metrics thread: {e}"))?;
    let shared = shared.clone();
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
        shared.vm.lock().unwrap_or_else(|e| e.into_inner()).state = State::Exited;
        if let Some(path) = &shared.socket {
            let _ = std::fs::remove_file(path);
        }
        std::process::exit(status);
    });
    if let Err(e) = spawned {
        eprintln!("exitless: cannot start the vmm thread: {e}");
        std::process::exit(1);
    }
    exitless_vmm::seccomp::confine(exitless_vmm::seccomp::ThreadKind::Api)
        .map_err(|e| format!("cannot confine the API thread: {e}"))
}
