//! `exitless`: run a guest, list the built-in payloads, run the labs.

use exitless::{api, args, report, terminal, top, with_causes, LiveStdout};

use args::{BenchCommand, Cli, Command, PayloadsArgs, RunArgs};
use exitless_vmm::{DeviceConfig, Machine, MachineConfig, RunOptions};
use std::process::ExitCode;

fn main() -> ExitCode {
    exitless_vmm::seccomp::keep_thread_heaps();
    let cli = match Cli::try_parse_args() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        // `exitless` or `exitless bench` alone: the list of commands, not a one-liner.
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(2);
        }
        Err(e) => {
            // One line, not clap's usage block: what was wrong, up to the usage text.
            let msg = e.to_string();
            let what: Vec<&str> =
                msg.lines().map(str::trim).take_while(|l| !l.starts_with("Usage:")).filter(|l| !l.is_empty()).collect();
            eprintln!("exitless: {}", what.join(" ").trim_start_matches("error: "));
            return ExitCode::from(2);
        }
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
        return api::run(cli.api).unwrap_or_else(|e| {
            eprintln!("exitless: {}", with_causes(e.as_ref()));
            ExitCode::FAILURE
        });
    };
    {
        use tracing_subscriber::prelude::*;
        let filter = api::logging::filter_from_env()
            .unwrap_or_else(|| api::logging::parse_filter("warn,virtio_queue=off").unwrap_or_default());
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .without_time();
        tracing_subscriber::registry().with(filter).with(fmt).init();
    }
    let result = match command {
        Command::Run(args) => run(args),
        Command::Payloads(args) => payloads(args),
        Command::Bench(bench) => run_bench(bench),
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
    let machine = Machine::new(MachineConfig {
        mem_size: args.mem,
        vcpus: args.vcpus,
        cmdline: args.cmdline.clone(),
        initrd,
        params: args.params.clone(),
        devices: DeviceConfig {
            serial_in: terminal::console_input(),
            serial_out: Box::new(LiveStdout),
            pci_config_io: args.pci_config_io,
            ecam: args.ecam,
            test_devices: args.testdevs,
            test_iommu: args.testdev_iommu,
            nets: args.nets(),
            poll: args.poll_us,
            drives: args.drive.clone(),
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

fn peers(a: &args::PeersArgs) -> Result<(), Box<dyn std::error::Error>> {
    let exitless = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    for peer in [&a.firecracker, &a.cloud_hypervisor].into_iter().flatten() {
        if !peer.is_file() {
            return Err(format!("{}: no such file (scripts/peers.sh builds the peers)", peer.display()).into());
        }
    }
    let opts = exitless_lab::peers::Options {
        exitless,
        firecracker: a.firecracker.clone(),
        cloud_hypervisor: a.cloud_hypervisor.clone(),
        runs: a.runs,
        mem_mib: a.mem_mib,
        timeout: std::time::Duration::from_secs_f64(a.timeout + a.io_seconds),
        fleet: a.fleet,
        io_seconds: a.io_seconds,
    };
    let report = exitless_lab::peers::run(&opts, &mut |line| eprintln!("peers: {line}"))?;
    print!("{}", report.table(a.runs));
    if let Some(path) = &a.json {
        std::fs::write(path, report.json().to_string() + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
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

fn run_bench(bench: BenchCommand) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match bench {
        BenchCommand::Boot(a) => exitless_lab::boot::run(&a.to_options())?,
        BenchCommand::Net(a) if a.rtt => {
            exitless_lab::net_rtt::run(&a.to_rtt_options())?;
        }
        BenchCommand::Net(a) => {
            exitless_lab::net::run(&a.to_options())?;
        }
        BenchCommand::Blk(a) => {
            exitless_lab::blk::run(&a.to_options())?;
        }
        BenchCommand::Pci(a) => {
            exitless_lab::pci::run(&a.to_options())?;
        }
        BenchCommand::Fleet(a) => exitless_lab::fleet::run(&a.to_options())?,
        BenchCommand::Peers(a) => peers(&a)?,
        BenchCommand::Doorbell(a) => {
            exitless_lab::doorbell::run(&a.to_options()?)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
