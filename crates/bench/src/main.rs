//! `exitless-bench`: the labs (`exitless bench ...` runs this). Each lab measures one of
//! exitless's paths against the slow one, or exitless beside its peers.

mod args;
mod fs_args;

use args::{BenchCommand, PeersArgs};
use exitless::with_causes;
use std::process::ExitCode;

/// The labs, as `exitless bench` takes them.
#[derive(clap::Parser)]
#[command(name = "exitless bench", bin_name = "exitless bench", version = env!("CARGO_PKG_VERSION"), arg_required_else_help = true)]
struct Bench {
    #[command(subcommand)]
    command: BenchCommand,
}

fn main() -> ExitCode {
    exitless_vmm::heap::keep_thread_heaps();
    let cli = match exitless::args::parsed(<Bench as clap::Parser>::try_parse(), "exitless") {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    exitless::init_stderr_logging();
    run_bench(cli.command).unwrap_or_else(|e| {
        eprintln!("exitless: {}", with_causes(e.as_ref()));
        ExitCode::FAILURE
    })
}

fn run_bench(bench: BenchCommand) -> Result<ExitCode, Box<dyn std::error::Error>> {
    match bench {
        BenchCommand::Run(args) => {
            let lab = if args.lab { vec![exitless_lab::devices::plug().0] } else { Vec::new() };
            return exitless::run::run(*args, lab);
        }
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
        BenchCommand::Snapshot(a) => {
            exitless_lab::snapshot::run(&a.to_options())?;
        }
        BenchCommand::Density(a) => {
            exitless_lab::density::run(&a.to_options())?;
        }
        BenchCommand::Fork(a) => {
            exitless_lab::fork::run(&a.to_options())?;
        }
        BenchCommand::Fs(a) => {
            exitless_lab::fs::run(&a.to_options()?, &mut |line| eprintln!("fs: {line}"))?;
        }
        BenchCommand::Mmds(a) => {
            exitless_lab::mmds::run(&a.to_options())?;
        }
        BenchCommand::Vsock(a) => {
            exitless_lab::vsock::run(&a.to_options())?;
        }
        BenchCommand::Doorbell(a) => {
            exitless_lab::doorbell::run(&a.to_options()?)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn peers(a: &PeersArgs) -> Result<(), Box<dyn std::error::Error>> {
    let exitless = exitless_lab::exitless_binary()?;
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
        transports: a.transport.0.clone(),
    };
    let outputs = exitless_lab::report::Outputs { json: a.json.clone(), svg: a.svg.clone() };
    outputs.check()?;
    let report = exitless_lab::peers::run(&opts, &mut |line| eprintln!("peers: {line}"))?;
    exitless_lab::report::print_table(&report.table(a.runs))?;
    outputs.write(|| report.json(), || report.svg())?;
    Ok(())
}
