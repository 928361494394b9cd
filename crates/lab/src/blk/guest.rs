//! The guest path: `blkbench` in a VM with the file as its virtio-blk drive (O_DIRECT),
//! counting, over the guest's measured window, its userspace exits, kicks and interrupts,
//! and the VMM's CPU outside the vCPU (device thread and io_uring workers).

use super::{BlkBenchError, RunResult, Workload};
use crate::control::{drive, lab_machine, LabMachine, Window};
use crate::stats::cpu_time;
use exitless_vmm::machine::read_result;
use exitless_vmm::virtio::blk::DriveConfig;
use exitless_vmm::Machine;
use std::path::Path;
use std::time::Duration;

#[derive(Clone, Copy)]
struct Snapshot {
    process_cpu: Duration,
    vcpu_cpu: Duration,
    kicks: u64,
    irqs: u64,
}

fn snapshot(machine: &Machine) -> Snapshot {
    let d = machine.devices().drives().next().map(|d| d.stats.snapshot()).unwrap_or_default();
    // Taken on the vCPU's thread (the lab's events run there): its CPU is the vCPU's.
    Snapshot {
        process_cpu: cpu_time(libc::RUSAGE_SELF),
        vcpu_cpu: cpu_time(libc::RUSAGE_THREAD),
        kicks: d.kicks,
        irqs: d.irqs,
    }
}

pub struct GuestRun<'a> {
    pub file: &'a Path,
    pub workload: Workload,
    pub qd: usize,
    pub seconds: f64,
    pub stamp: u64,
    pub seed: u64,
    pub tsc_khz: u64,
    pub poll_us: u64,
    /// The device thread's polling (`--poll-us`).
    pub device_poll: exitless_vmm::poll::PollMode,
    /// The drive's rate limits (none in the main table's rows).
    pub limits: exitless_vmm::rate_limiter::Limits,
    pub timeout: Duration,
}

pub fn run(g: &GuestRun) -> Result<RunResult, BlkBenchError> {
    let params = vec![
        g.workload.index(),
        g.workload.block() as u64,
        g.qd as u64,
        0,
        (g.seconds * 1000.0) as u64,
        g.tsc_khz,
        g.stamp,
        g.seed,
        0,
        g.poll_us,
    ];
    let drive_config = DriveConfig { direct: true, limits: g.limits, ..DriveConfig::new(g.file) };
    let LabMachine { machine, control, .. } = lab_machine("blkbench", params, |c| {
        c.devices.allocated = vec![exitless_vmm::virtio::blk::attach(drive_config, g.device_poll)];
    })?;
    let mut steps = Window::<Snapshot, BlkBenchError>::new(snapshot);
    drive(&machine, &control, g.timeout, &mut steps)?;
    let status = machine.control().exit_status().unwrap_or(0);
    if status > 1 {
        return Err(BlkBenchError::Guest(status));
    }
    let (begin, (end, exits)) =
        (steps.begin.ok_or(BlkBenchError::Missing("start"))?, steps.end.ok_or(BlkBenchError::Missing("end"))?);
    let result = |i| read_result(machine.memory(), i);
    let vmm_cpu = (end.process_cpu - begin.process_cpu).saturating_sub(end.vcpu_cpu - begin.vcpu_cpu);
    let throttled = machine.devices().drives().next().map_or(0, |d| d.stats.snapshot().throttled);
    Ok(RunResult {
        requests: result(0),
        seconds: result(1) as f64 / (g.tsc_khz as f64 * 1e3),
        bad_sectors: result(2),
        failed: result(5),
        bytes: result(6),
        exits,
        kicks: end.kicks - begin.kicks,
        irqs: end.irqs - begin.irqs,
        vmm_cpu: vmm_cpu.as_secs_f64(),
        vcpu_cpu: Some((end.vcpu_cpu - begin.vcpu_cpu).as_secs_f64()),
        throttled,
    })
}
