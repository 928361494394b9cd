//! `exitless`: run a guest, list the built-in payloads, run the labs.

use exitless::{api, args, report, terminal, top, with_causes, LiveStdout};

use args::{Cli, Command, PayloadsArgs, RunArgs};
use exitless_vmm::{DeviceConfig, Machine, MachineConfig, RunOptions};
use std::process::ExitCode;

fn main() -> ExitCode {
    exitless_vmm::seccomp::keep_thread_heaps();
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
        Command::Run(args) => run(*args),
        Command::Payloads(args) => payloads(args),
        Command::Bench { args } => bench(&args),
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

fn run(args: RunArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if let Some(path) = &args.json {
        // A path that cannot be written is found now, not after the run.
        std::fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if args.no_seccomp {
        exitless_vmm::seccomp::disable();
    }
    let image = args.image()?;
    let initrd = args.initrd()?;
    let symbols = args.guest_symbols()?;
    // A terminal on stdin becomes the guest's console keyboard: raw, so keys reach the guest
    // as typed (Ctrl-C too); restored when this guard goes.
    let _raw = terminal::RawMode::enable_if_terminal();
    let fixed = match args.lab {
        true => vec![exitless_lab::devices::plug().0],
        false => Vec::new(),
    };
    // QEMU's `-kernel F -append A` hands a multiboot image `F A`: its argv[0] is its name.
    let cmdline = match &args.kernel {
        Some(path) if exitless_vmm::boot::image::is_multiboot(&image) => format!("{} {}", path.display(), args.cmdline),
        _ => args.cmdline.clone(),
    };
    let machine = Machine::new(MachineConfig {
        mem_size: args.mem,
        vcpus: args.vcpus,
        cmdline,
        initrd,
        params: args.params.clone(),
        devices: DeviceConfig {
            serial_in: terminal::console_input(),
            serial_out: Box::new(LiveStdout),
            pci_config_io: args.pci_config_io,
            transport: args.transport.for_cmdline(&args.cmdline),
            ecam: args.ecam,
            mmio_registers: args.mmio_registers,
            test_devices: args.testdevs,
            test_iommu: args.testdev_iommu,
            nets: args.nets()?,
            poll: args.poll_us,
            drives: args.drive.clone(),
            entropy: args.entropy.then(Default::default),
            vsock: args.vsock.clone(),
            fixed,
            ..Default::default()
        },
        run: RunOptions {
            confine_caller: true,
            sample_every: args.sample_guest.map(|hz| std::time::Duration::from_secs_f64(1.0 / f64::from(hz))),
            stuck_after: args.stuck_after.map(std::time::Duration::from_secs_f64),
        },
        host: args.host_profile,
        ..MachineConfig::new(image)
    })?;
    let (report, error) = machine.run_to_end(args.timeout.map(std::time::Duration::from_secs_f64))?;
    eprint!("{}", report::profile(&report));
    if args.sample_guest.is_some() {
        eprint!("{}", report::samples(&report, &symbols));
    }
    if let Some(path) = &args.json {
        // Written for crashed and timed-out guests too, with the error in it.
        let mut json = report::json(&report);
        if args.sample_guest.is_some() {
            json["guest_samples"] = report::samples_json(&report, &symbols);
        }
        json["error"] = error.as_ref().map(|e| with_causes(e)).into();
        std::fs::write(path, json.to_string() + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(e) = error {
        return Err(e.into());
    }
    Ok(ExitCode::from(u8::try_from(report.exit_status).unwrap_or(u8::MAX)))
}

fn rebase(args: &exitless::args::RebaseArgs) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let open = |path: &std::path::Path, write: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))
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
    println!("uffd-handler: {} faults, {} pages copied in", served.faults, served.pages);
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

/// `exitless bench ...`: the labs live in `exitless-bench`, beside this binary, so that
/// the VMM every orchestrator starts carries (and maps) none of their code.
fn bench(args: &[std::ffi::OsString]) -> Result<ExitCode, Box<dyn std::error::Error>> {
    use std::os::unix::process::CommandExt;
    let me = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let labs = me.with_file_name("exitless-bench");
    let e = std::process::Command::new(&labs).args(args).exec();
    Err(format!("cannot run {}: {e} (cargo build --release builds it beside exitless)", labs.display()).into())
}
