//! Two NICs at once: the `netpair` guest sends lab frames on two virtio-net devices,
//! each on its own tap in the lab's namespace with a sink of its own; each sink must see
//! only its own NIC's frames (the NIC's number is in the sequence numbers' top byte),
//! every one once.

use crate::control::{drive, lab_machine, payload_failure, LabMachine, Window};
use crate::net::{NetBenchError, LAB_MAC};
use crate::netns::Netns;
use crate::sink::{FrameKind, Sink, SinkReport};
use exitless_vmm::poll::PollMode;
use exitless_vmm::NetConfig;
use std::time::Duration;

/// What each tap's sink saw, the first NIC's first.
pub fn two_nics(frames: u64, size: usize, timeout: Duration) -> Result<[SinkReport; 2], NetBenchError> {
    let netns = Netns::create("pair")?;
    let base = crate::netns::unique_ifname("exp");
    let taps = ["a", "b"].map(|s| format!("{base}{s}"));
    let mac = |i: usize| {
        let mut mac = LAB_MAC;
        mac[5] += i as u8;
        mac
    };
    let nic = |i: usize| NetConfig::on_tap(taps[i].clone(), mac(i));
    let LabMachine { machine, control, .. } = lab_machine("netpair", vec![frames, size as u64], |c| {
        let attach = |n| exitless_vmm::virtio::net::attach(n, PollMode::Off);
        c.devices.allocated = vec![attach(nic(0)), attach(nic(1))];
    })?;
    let mut sinks = Vec::new();
    for tap in &taps {
        netns.adopt(tap)?;
        sinks.push(Sink::spawn_for(&netns, tap, size, FrameKind::Lab)?);
    }
    let mut lab = Window::<(), NetBenchError>::new(|_| ());
    drive(&machine, &control, timeout, &mut lab)?;
    if let Some(why) = payload_failure(&machine) {
        return Err(NetBenchError::Guest(why));
    }
    // The guest sent every frame before it ended; a loaded host's sinks may read the last
    // ones well after that (they stop waiting once every frame came).
    let mut reports = sinks.into_iter().map(|s| s.finish(frames, Duration::from_secs(30)));
    match (reports.next(), reports.next()) {
        (Some(a), Some(b)) => Ok([a, b]),
        _ => Err(NetBenchError::Missing("sinks")),
    }
}
