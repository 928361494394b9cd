//! `exitless bench mmds`: the `mmdsget` guest reads its metadata the way an agent does
//! (ARP, a TCP connection per session, on V2 a token, then three keys, each byte checked
//! against what the lab PUT, a key that does not exist) from MMDS on a NIC whose tap sits
//! in a network namespace of the lab's own. Per version and polling mode: the time from
//! a GET's first byte sent to its answer's last byte received (guest TSC), a whole
//! session's time, and exits and VMM device-thread CPU per request.

use crate::chart;
use crate::control::{drive, guest_tsc_khz, lab_machine, payload_failure, LabMachine, Window};
use crate::net::LAB_MAC;
use crate::netns::{Netns, NetnsError};
use crate::report::{print_table, targets_json, targets_text, Outputs, Target, WriteError};
use exitless_vmm::machine::read_result;
use exitless_vmm::net::mmds::{Mmds, Version, DEFAULT_ADDRESS};
use exitless_vmm::poll::PollMode;
use exitless_vmm::{Machine, MachineError, NetConfig};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const ALPHA: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// The document `mmdsget` checks: `latest/meta-data/k0..k2`, each `len` characters of a
/// pattern of `seed` that the guest computes too.
pub fn metadata(seed: u64, len: usize) -> Value {
    let value = |key: u64| -> String {
        (0..len as u64).map(|j| ALPHA[((seed * 31 + key * 7 + j * 13) % 36) as usize] as char).collect()
    };
    json!({"latest": {"meta-data": {"k0": value(0), "k1": value(1), "k2": value(2)}}})
}

pub struct Options {
    pub versions: Vec<Version>,
    pub polls: Vec<PollMode>,
    pub sessions: u32,
    pub value_len: usize,
    pub outputs: Outputs,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum MmdsBenchError {
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("{0}: {1} answers were wrong")]
    Guest(String, u64),
    #[error("the guest never announced its {0}")]
    Missing(&'static str),
    #[error(transparent)]
    Write(#[from] WriteError),
}

#[derive(Clone, Debug)]
pub struct Row {
    pub version: Version,
    pub poll: PollMode,
    pub requests: u64,
    pub checked: u64,
    pub failed: u64,
    pub get_us: f64,
    pub session_us: f64,
    pub exits_per_request: f64,
    /// Queue notifications (ioeventfd: an exit KVM handles without the VMM).
    pub kicks_per_request: f64,
    pub vmm_cpu_us_per_request: f64,
}

#[derive(Clone, Copy)]
struct Snapshot {
    cpu: Duration,
    requests: u64,
    kicks: u64,
}

fn snapshot(machine: &Machine) -> Snapshot {
    let devices = machine.devices();
    let n = devices.nets().next();
    let counters = n.map(|n| n.stats.snapshot()).unwrap_or_default();
    Snapshot {
        cpu: n.and_then(|n| n.stats.thread_cpu()).unwrap_or_default(),
        requests: counters.mmds.requests,
        kicks: counters.kicks,
    }
}

fn run_one(
    netns: &Netns,
    version: Version,
    poll: PollMode,
    opts: &Options,
    tsc_khz: f64,
) -> Result<Row, MmdsBenchError> {
    const SEED: u64 = 11;
    let mut store = Mmds::new(1 << 20);
    store.version = version;
    // The document is the lab's own: it is well under the limit.
    let _ = store.put(metadata(SEED, opts.value_len));
    let tap = crate::netns::unique_ifname("exm");
    let net = NetConfig {
        mmds: Some((Arc::new(Mutex::new(store)), DEFAULT_ADDRESS)),
        ..NetConfig::on_tap(tap.clone(), LAB_MAC)
    };
    let v = if version == Version::V2 { 2 } else { 1 };
    let params = vec![v, SEED, opts.value_len as u64, u64::from(opts.sessions), 0];
    let LabMachine { machine, control, .. } = lab_machine("mmdsget", params, |c| {
        c.devices.allocated = vec![exitless_vmm::virtio::net::attach(net, poll)];
    })?;
    netns.adopt(&tap)?;
    let mut lab = Window::<Snapshot, MmdsBenchError>::new(snapshot);
    drive(&machine, &control, opts.timeout, &mut lab)?;
    let result = |i| read_result(machine.memory(), i);
    let (checked, failed) = (result(0), result(1));
    if let Some(why) = payload_failure(&machine) {
        return Err(MmdsBenchError::Guest(why, failed));
    }
    let (begin, (end, exits)) =
        (lab.begin.ok_or(MmdsBenchError::Missing("start"))?, lab.end.ok_or(MmdsBenchError::Missing("end"))?);
    let requests = (end.requests - begin.requests).max(1);
    let us = |cycles: u64| cycles as f64 / tsc_khz * 1e3;
    Ok(Row {
        version,
        poll,
        requests,
        checked,
        failed,
        get_us: us(result(2)) / result(3).max(1) as f64,
        session_us: us(result(4)) / f64::from(opts.sessions.max(1)),
        exits_per_request: exits as f64 / requests as f64,
        kicks_per_request: (end.kicks - begin.kicks) as f64 / requests as f64,
        vmm_cpu_us_per_request: (end.cpu - begin.cpu).as_secs_f64() * 1e6 / requests as f64,
    })
}

pub fn measure(opts: &Options) -> Result<Vec<Row>, MmdsBenchError> {
    let netns = Netns::create("mmds")?;
    let tsc_khz = f64::from(guest_tsc_khz()?);
    let mut rows = Vec::new();
    for &version in &opts.versions {
        for &poll in &opts.polls {
            eprintln!("mmds: V{} with polling {poll} ...", if version == Version::V2 { 2 } else { 1 });
            rows.push(run_one(&netns, version, poll, opts, tsc_khz)?);
        }
    }
    Ok(rows)
}

pub fn targets(rows: &[Row]) -> Vec<Target> {
    let failed: u64 = rows.iter().map(|r| r.failed).sum();
    let checked: u64 = rows.iter().map(|r| r.checked).sum();
    vec![Target {
        what: "every answer checked byte for byte".into(),
        measured: format!("{checked} ok, {failed} wrong"),
        met: failed == 0 && checked > 0,
    }]
}

pub fn text(rows: &[Row], opts: &Options) -> String {
    let mut s = format!(
        "mmds lab: mmdsget, {} sessions per row, each a connection: token (V2), 3 keys of {} bytes, a missing key\n",
        opts.sessions, opts.value_len
    );
    s += &format!(
        "  {:<8}{:<10}{:>10}{:>12}{:>14}{:>16}{:>15}{:>16}\n",
        "version", "polling", "requests", "GET (us)", "session (us)", "VMM exits/req", "kicks/req", "VMM CPU us/req"
    );
    for r in rows {
        let v = if r.version == Version::V2 { "V2" } else { "V1" };
        s += &format!(
            "  {:<8}{:<10}{:>10}{:>12.1}{:>14.1}{:>16.2}{:>15.2}{:>16.1}\n",
            v,
            r.poll.to_string(),
            r.requests,
            r.get_us,
            r.session_us,
            r.exits_per_request,
            r.kicks_per_request,
            r.vmm_cpu_us_per_request
        );
    }
    s + &targets_text(&targets(rows))
}

pub fn json(rows: &[Row]) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "version": if r.version == Version::V2 { "V2" } else { "V1" },
                "poll": r.poll.to_string(),
                "requests": r.requests,
                "answers_checked": r.checked,
                "answers_wrong": r.failed,
                "get_us": r.get_us,
                "session_us": r.session_us,
                "exits_per_request": r.exits_per_request,
                "kicks_per_request": r.kicks_per_request,
                "vmm_cpu_us_per_request": r.vmm_cpu_us_per_request,
            })
        })
        .collect();
    json!({"lab": "mmds", "rows": rows})
}

fn svg(rows: &[Row]) -> String {
    let name = |r: &Row| if r.version == Version::V2 { "V2" } else { "V1" }.to_string();
    let triples =
        |f: fn(&Row) -> f64| rows.iter().map(move |r| (name(r), r.poll.to_string(), f(r))).collect::<Vec<_>>();
    chart::draw(&[
        chart::Panel::grouped("MMDS GET, first byte out to last byte in", "us", false, triples(|r| r.get_us)),
        chart::Panel::grouped(
            "MMDS session (connect, token, 3 keys, 404, close)",
            "us",
            false,
            triples(|r| r.session_us),
        ),
    ])
}

pub fn run(opts: &Options) -> Result<Vec<Row>, MmdsBenchError> {
    opts.outputs.check()?;
    let rows = measure(opts)?;
    print_table(&text(&rows, opts))?;
    let doc = || {
        let mut doc = json(&rows);
        doc["targets"] = Value::Array(targets_json(&targets(&rows)));
        doc
    };
    opts.outputs.write(doc, || svg(&rows))?;
    Ok(rows)
}
