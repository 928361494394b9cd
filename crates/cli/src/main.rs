//! `exitless`: run a guest, list the built-in payloads, run the labs.

use exitless::{api, args, top, with_causes};

use args::{Cli, Command, PayloadsArgs};
use std::process::ExitCode;

fn main() -> ExitCode {
    exitless_vmm::heap::keep_thread_heaps();
    let cli = match args::parsed(Cli::try_parse_args(), "exitless") {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let Some(command) = cli.command else {
        // Firecracker's process interface: its flags, its API.
        let level = cli.api.level.as_deref().map(api::level_filter).transpose();
        let level = match level {
            Ok(l) => l.unwrap_or("warn,virtio_queue=off"),
            Err(e) => {
                eprintln!("exitless: {e}");
                return ExitCode::from(2);
            }
        };
        api::init_logging(level, &cli.api.id);
        exitless::log_panics();
        return api::run(cli.api).unwrap_or_else(|e| {
            eprintln!("exitless: {}", with_causes(e.as_ref()));
            ExitCode::FAILURE
        });
    };
    exitless::init_stderr_logging();
    exitless::log_panics();
    let result = match command {
        // The lab's devices are the labs' binary's: the VMM carries none of their code.
        Command::Run(args) if args.lab => labs(&run_argv()),
        Command::Run(args) => exitless::run::run(*args, Vec::new()),
        Command::Payloads(args) => payloads(args),
        Command::Bench { args } => labs(&args),
        Command::RebaseSnap(args) => rebase(&args),
        Command::UffdHandler(args) => uffd_handler(&args),
        Command::Top(args) => {
            let interval = std::time::Duration::from_secs_f64(args.interval.max(0.05));
            top::run(&args.api_sock, interval, args.iterations).map(|()| ExitCode::SUCCESS).map_err(Into::into)
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("exitless: {}", with_causes(e.as_ref()));
        ExitCode::FAILURE
    })
}

fn rebase(args: &exitless::args::RebaseArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    // Regular files (their lengths and holes are what rebase reads; a FIFO would hang).
    let open = |path: &std::path::Path, write: bool| {
        exitless_vmm::files::open_regular(path, write).map(|(file, _)| file).map_err(|e| e.to_string())
    };
    let (base, diff) = (open(&args.base_file, true)?, open(&args.diff_file, false)?);
    let laid = exitless_vmm::snapshot::memory::rebase(&base, &diff).map_err(|e| format!("rebase-snap: {e}"))?;
    println!("rebase-snap: laid {} KiB of {} over {}", laid / 1024, args.diff_file.display(), args.base_file.display());
    Ok(ExitCode::SUCCESS)
}

fn uffd_handler(args: &exitless::args::UffdHandlerArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ready = || eprintln!("uffd-handler: listening on {}", args.socket.display());
    let served = exitless_vmm::snapshot::uffd_handler::serve(&args.socket, &args.mem_file, ready)
        .map_err(|e| format!("uffd-handler: {e}"))?;
    println!(
        "uffd-handler: {} faults, {} pages copied in, {} ranges removed, {} connections refused",
        served.faults, served.pages, served.removed, served.refused_peers
    );
    Ok(ExitCode::SUCCESS)
}

fn payloads(args: PayloadsArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    for p in exitless_payloads::PAYLOADS {
        let line = format!("{:<10} {}\n", p.name, p.about);
        std::io::Write::write_all(&mut std::io::stdout(), line.as_bytes())
            .map_err(|e| format!("cannot write to standard output: {e}"))?;
        if let Some(dir) = &args.out {
            let images = [Some(("elf", p.elf)), p.bzimage.map(|b| ("bzImage", b))];
            for (ext, bytes) in images.into_iter().flatten() {
                let path = dir.join(format!("{}.{ext}", p.name));
                std::fs::write(&path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `exitless run ...` as typed, from `run` on: `exitless-bench` takes it as its own `run`.
fn run_argv() -> Vec<std::ffi::OsString> {
    let argv: Vec<_> = std::env::args_os().skip(1).collect();
    let from = argv.iter().position(|a| a == "run").unwrap_or(0);
    argv[from..].to_vec()
}

/// `exitless bench ...` and `run --lab`: the labs live in `exitless-bench`, beside this
/// binary, so that the VMM every orchestrator starts carries (and maps) none of their code.
fn labs(args: &[std::ffi::OsString]) -> Result<ExitCode, Box<dyn std::error::Error>> {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let labs = me.with_file_name("exitless-bench");
    let e = std::process::Command::new(&labs).args(args).exec();
    Err(format!("cannot run {}: {e} (a build of the workspace, `cargo build --release` or `cargo test --workspace`, makes it beside exitless)", labs.display()).into())
}
