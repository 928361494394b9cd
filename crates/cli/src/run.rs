//! `exitless run`: one guest from the command line, to its end, with its exit profile.
//! The labs' binary runs the same with its devices plugged in (`run --lab`).

use crate::args::RunArgs;
use crate::{report, terminal, with_causes, LiveStdout};
use exitless_vmm::machine::AttachFixed;
use exitless_vmm::{DeviceConfig, Machine, MachineConfig, RunOptions};
use std::process::ExitCode;

/// Boots `args`' guest with the `fixed` devices besides the configured ones and runs it to
/// its end; the process status is the guest's.
/// The devices `args` asks for, each made by its own module, in the order they are
/// placed: NICs, drives, the entropy device, vsock.
fn devices(args: &RunArgs) -> Result<Vec<exitless_vmm::device_manager::Attach>, String> {
    use exitless_vmm::virtio::{blk, net, rng, vsock};
    let poll = args.poll_us;
    let mut devices: Vec<_> = args.nets()?.into_iter().map(|n| net::attach(n, poll)).collect();
    devices.extend(args.drive.iter().map(|d| blk::attach(d.clone(), poll)));
    devices.extend(args.entropy.then(|| rng::attach(Default::default())));
    devices.extend(args.vsock.clone().map(|v| vsock::attach(v, poll)));
    Ok(devices)
}

pub fn run(args: RunArgs, fixed: Vec<AttachFixed>) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if let Some(path) = &args.json {
        // A path that cannot be written is found now, not after the run.
        std::fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if args.no_seccomp {
        exitless_vmm::seccomp::disable();
    }
    let mut allocated = devices(&args)?;
    // The devices whose modules own their flags, and their backend processes (virtiofsd),
    // ended with the run (when these are dropped).
    let mut backends = Vec::new();
    args.devices.launch(&mut allocated, &mut backends)?;
    let image = args.image()?;
    let initrd = args.initrd()?;
    let symbols = args.guest_symbols()?;
    // A terminal on stdin becomes the guest's console keyboard: raw, so keys reach the guest
    // as typed (Ctrl-C too); restored when this guard goes.
    let _raw = terminal::RawMode::enable_if_terminal();
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
            allocated,
            fixed,
            ..Default::default()
        },
        run: RunOptions {
            confine_caller: true,
            sample_every: args.sample_guest.map(|hz| std::time::Duration::from_secs_f64(1.0 / f64::from(hz))),
            stuck_after: args.stuck_after.map(std::time::Duration::from_secs_f64),
        },
        host: args.host_profile,
        cpu_template: args.cpu_template.clone(),
        shared_memory: !backends.is_empty(),
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
