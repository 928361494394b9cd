//! PCI lab: config reads by port I/O (two exits), by trapped ECAM (one exit), and by ECAM
//! backed with read-only memory (no exit), in one guest run, with a scan-and-size of bus
//! 0 per method and a check that all three saw identical bytes.

use crate::chart;
use crate::control::{drive, guest_tsc_khz, lab_machine, LabEvent, LabMachine, LabSteps};
use crate::report::{targets_json, targets_text, Outputs, Target, WriteError};
use exitless_payloads::abi::*;
use exitless_vmm::machine::{read_result, shared_slot};
use exitless_vmm::pci::EcamMode;
use exitless_vmm::vcpu::Vcpu;
use exitless_vmm::{Machine, MachineError};
use serde_json::json;
use std::time::Duration;
use vm_memory::Bytes;

/// How the guest reaches config space in one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Pio,
    Ecam,
    EcamMapped,
}

impl Method {
    pub const ALL: [Method; 3] = [Method::Pio, Method::Ecam, Method::EcamMapped];

    pub fn name(self) -> &'static str {
        match self {
            Method::Pio => "pio",
            Method::Ecam => "ecam",
            Method::EcamMapped => "ecam-mapped",
        }
    }

    /// The guest's access method (pci.h) and the ECAM window's mode for this step.
    fn setup(self) -> (u64, EcamMode) {
        match self {
            Method::Pio => (1, EcamMode::Trapped),
            Method::Ecam => (2, EcamMode::Trapped),
            Method::EcamMapped => (2, EcamMode::Mapped),
        }
    }
}

pub struct Options {
    pub reads: u64,
    pub outputs: Outputs,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum PciBenchError {
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Pci(#[from] exitless_vmm::pci::PciError),
    #[error("the pciscan guest announced step {0}, which the lab did not plan")]
    UnknownStep(usize),
    #[error("the pciscan guest finished without measuring {0}")]
    Missing(&'static str),
    #[error(transparent)]
    Write(#[from] WriteError),
}

#[derive(Clone, Debug)]
pub struct Row {
    pub method: Method,
    pub reads: u64,
    pub seconds: f64,
    pub us_per_read: f64,
    pub exits_per_read: f64,
    pub scan_us: f64,
    pub functions: u64,
    pub identical: bool,
}

struct PciSteps {
    tsc_khz: f64,
    rows: Vec<Option<Row>>,
}

impl LabSteps for PciSteps {
    type Error = PciBenchError;

    fn on_event(&mut self, machine: &Machine, vcpu: &mut Vcpu, event: LabEvent) -> Result<(), PciBenchError> {
        match event {
            LabEvent::Begin(i) => {
                let method = *Method::ALL.get(i).ok_or(PciBenchError::UnknownStep(i))?;
                let (access, mode) = method.setup();
                machine.devices().pci().set_ecam_mode(mode)?;
                machine
                    .memory()
                    .write_obj(access, shared_slot(LAB_SPEC_SLOT))
                    .map_err(|e| MachineError::Memory(e.into()))?;
            }
            // The timed reads start: count only their exits.
            LabEvent::Mark(_) => {
                vcpu.exits.stats.reset();
                vcpu.discard_pending();
            }
            LabEvent::End(i) => {
                let method = *Method::ALL.get(i).ok_or(PciBenchError::UnknownStep(i))?;
                let stats = &vcpu.exits.stats;
                let exits = stats.io_exits();
                let reads = read_result(machine.memory(), 2).max(1);
                let seconds = read_result(machine.memory(), 0) as f64 / (self.tsc_khz * 1e3);
                let row = self.rows.get_mut(i).ok_or(PciBenchError::UnknownStep(i))?;
                *row = Some(Row {
                    method,
                    reads,
                    seconds,
                    us_per_read: seconds * 1e6 / reads as f64,
                    exits_per_read: exits as f64 / reads as f64,
                    scan_us: read_result(machine.memory(), 1) as f64 / self.tsc_khz * 1e3,
                    functions: read_result(machine.memory(), 3),
                    identical: false,
                });
            }
        }
        Ok(())
    }
}

/// One guest run: every method in turn, then the guest's verdict on identical bytes.
pub fn measure(opts: &Options) -> Result<Vec<Row>, PciBenchError> {
    let LabMachine { machine, control, .. } =
        lab_machine("pciscan", vec![opts.reads, 0, Method::ALL.len() as u64], |_| {})?;
    let tsc_khz = f64::from(guest_tsc_khz()?);
    let mut lab = PciSteps { tsc_khz, rows: vec![None; Method::ALL.len()] };
    drive(&machine, &control, opts.timeout, &mut lab)?;
    let identical = read_result(machine.memory(), 8);
    Method::ALL
        .iter()
        .zip(lab.rows)
        .enumerate()
        .map(|(i, (m, row))| {
            let mut row = row.ok_or(PciBenchError::Missing(m.name()))?;
            row.identical = identical & (1 << i) != 0;
            Ok(row)
        })
        .collect()
}

/// The targets.
pub fn targets(rows: &[Row]) -> Vec<Target> {
    let per_read = |m: Method| rows.iter().find(|r| r.method == m).map(|r| r.us_per_read);
    let mut out = Vec::new();
    if let (Some(pio), Some(ecam), Some(mapped)) =
        (per_read(Method::Pio), per_read(Method::Ecam), per_read(Method::EcamMapped))
    {
        out.push(Target::new(
            "ecam >= 1.8x faster per read than pio",
            format!("{:.2}x", pio / ecam),
            pio / ecam >= 1.8,
        ));
        out.push(Target::new(
            "ecam-mapped >= 1000x faster than pio",
            format!("{:.0}x", pio / mapped),
            pio / mapped >= 1000.0,
        ));
    }
    let all = rows.iter().all(|r| r.identical);
    out.push(Target::new("identical bytes by every method", if all { "yes" } else { "NO" }, all));
    out
}

pub fn table(rows: &[Row]) -> String {
    let pio = rows.iter().find(|r| r.method == Method::Pio).map(|r| r.us_per_read);
    let mut s = format!(
        "pci lab: {} dword config reads per method, bus 0 with {} functions\n",
        rows.first().map_or(0, |r| r.reads),
        rows.first().map_or(0, |r| r.functions)
    );
    s += &format!(
        "{:<12} {:>9} {:>12} {:>12} {:>11} {:>9} {:>15} {:>10}\n",
        "method", "reads", "time (s)", "us/read", "exits/read", "vs pio", "scan+size (us)", "identical"
    );
    for r in rows {
        let speedup = pio.map_or("-".into(), |p| match p / r.us_per_read {
            x if x < 100.0 => format!("{x:.2}x"),
            x => format!("{x:.0}x"),
        });
        s += &format!(
            "{:<12} {:>9} {:>12.6} {:>12.4} {:>11.2} {:>9} {:>15.0} {:>10}\n",
            r.method.name(),
            r.reads,
            r.seconds,
            r.us_per_read,
            r.exits_per_read,
            speedup,
            r.scan_us,
            if r.identical { "yes" } else { "NO" }
        );
    }
    s + &targets_text(&targets(rows))
}

pub fn json(rows: &[Row]) -> serde_json::Value {
    let out: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({"method": r.method.name(), "reads": r.reads, "seconds": r.seconds, "us_per_read": r.us_per_read,
                   "exits_per_read": r.exits_per_read, "scan_us": r.scan_us, "identical": r.identical})
        })
        .collect();
    let targets = targets_json(&targets(rows));
    json!({"bench": "pci", "rows": out, "targets": targets})
}

pub fn run(opts: &Options) -> Result<Vec<Row>, PciBenchError> {
    opts.outputs.check()?;
    let rows = measure(opts)?;
    crate::report::print_table(&table(&rows))?;
    opts.outputs.write(
        || json(&rows),
        || {
            let bars =
                rows.iter().map(|r| ("config reads".to_string(), r.method.name().to_string(), 1e6 / r.us_per_read));
            chart::draw(&[chart::Panel::grouped("PCI config reads per second, by method", "reads/s", true, bars)])
        },
    )?;
    Ok(rows)
}
