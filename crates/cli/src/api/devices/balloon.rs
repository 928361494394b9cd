//! Firecracker's balloon endpoints (v1.16.1's `vmm_config/balloon.rs` and
//! `rpc_interface.rs`): `PUT /balloon` before the start; `GET /balloon` at any time;
//! the target, the statistics and their interval, and free page hinting runs on a
//! running microVM.

use super::{Answer, Device};
use crate::api::model::{Balloon, BalloonStatsUpdate, BalloonUpdate, StartHinting};
use crate::api::request::parse;
use crate::api::vm::{Fault, State, Vm};
use exitless_vmm::device_manager::Attach;
use exitless_vmm::virtio::balloon::{mib_to_pages, pages_to_mib, BalloonConfig};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

/// The device's entry in the list of devices/mod.rs.
pub const DEVICE: Device = Device { route, configure, ..Device::NONE };

/// The balloon's endpoints.
fn route(vm: &mut Vm, method: &str, parts: &[&str], body: &[u8]) -> Answer {
    let done = |r: Result<(), Fault>| r.map(|()| None);
    Some(match (method, parts) {
        ("PUT", ["balloon"]) => parse(body).and_then(|b| done(vm.set_balloon(b))),
        ("GET", ["balloon"]) => vm.balloon_config().and_then(|b| Ok(Some(serde_json::to_value(b)?))),
        ("PATCH", ["balloon"]) => parse(body).and_then(|u| done(vm.update_balloon(u))),
        ("GET", ["balloon", "statistics"]) => vm.balloon_statistics().map(Some),
        ("PATCH", ["balloon", "statistics"]) => parse(body).and_then(|u| done(vm.update_balloon_statistics(u))),
        ("PATCH", ["balloon", "hinting", "start"]) => {
            let start = match body.iter().all(u8::is_ascii_whitespace) {
                true => Ok(StartHinting { acknowledge_on_stop: true }),
                false => parse(body),
            };
            start.and_then(|s| done(vm.start_balloon_hinting(s)))
        }
        ("GET", ["balloon", "hinting", "status"]) => vm.balloon_hinting_status().map(Some),
        ("PATCH", ["balloon", "hinting", "stop"]) => done(vm.stop_balloon_hinting()),
        _ => return None,
    })
}

/// A configuration file's balloon, as its PUT.
fn configure(vm: &mut Vm, c: &mut crate::api::model::VmConfig) -> Result<(), Fault> {
    c.balloon.take().map_or(Ok(()), |b| vm.set_balloon(b))
}

/// The balloon the machine is built with.
pub(super) fn attach(vm: &Vm, devices: &mut Vec<Attach>, _words: &mut Vec<String>) {
    devices.extend(vm.balloon_device().map(exitless_vmm::virtio::balloon::attach));
}

impl Vm {
    /// `PUT /balloon`: the device (again: its new settings), before boot.
    pub fn set_balloon(&mut self, b: Balloon) -> Result<(), Fault> {
        self.pre_boot()?;
        if u64::from(b.amount_mib) > self.config.machine_config.mem_size_mib {
            return Err(Fault("Balloon config error: Amount of pages requested is too large.".into()));
        }
        self.config.balloon = Some(b);
        Ok(())
    }

    /// `GET /balloon`: the configuration, its target as the device now has it.
    pub fn balloon_config(&self) -> Result<Balloon, Fault> {
        let config = self.config.balloon.ok_or_else(not_found)?;
        let State::Running { machine, .. } = &self.state else { return Ok(config) };
        let devices = machine.devices();
        let (balloon, _) = devices.balloon().map_err(internal_fault)?;
        Ok(Balloon { amount_mib: pages_to_mib(balloon.shared.target_pages.load(Ordering::Acquire)), ..config })
    }

    /// `PATCH /balloon`: a new target; the driver is told by a configuration change.
    /// Unlike Firecracker, a target set before the driver starts is kept (Linux reads it
    /// when it probes the device) instead of refused.
    pub fn update_balloon(&mut self, u: BalloonUpdate) -> Result<(), Fault> {
        let machine = self.running("the balloon is updated on a running one")?.clone();
        if u64::from(u.amount_mib) > self.config.machine_config.mem_size_mib {
            // Firecracker's words, which name the amount asked for.
            return Err(update_fault(format!("Balloon: Requested memory should be less than {}MiB", u.amount_mib)));
        }
        machine.devices().set_balloon_target(mib_to_pages(u.amount_mib)).map_err(update_fault)?;
        if let Some(b) = self.config.balloon.as_mut() {
            b.amount_mib = u.amount_mib;
        }
        Ok(())
    }

    /// `GET /balloon/statistics`: the guest's last statistics with the target and what
    /// the driver holds, in Firecracker's field names.
    pub fn balloon_statistics(&self) -> Result<Value, Fault> {
        let machine = self.running("balloon statistics are read on a running one")?;
        let devices = machine.devices();
        let (balloon, _) = devices.balloon().map_err(internal_fault)?;
        let s = &balloon.shared;
        if s.stats_interval_s.load(Ordering::Acquire) == 0 {
            return Err(internal_fault("Balloon: Received stats query when stats are disabled."));
        }
        let (target, actual) = (s.target_pages.load(Ordering::Acquire), s.actual_pages.load(Ordering::Acquire));
        let mut body = json!({
            "target_pages": target,
            "actual_pages": actual,
            "target_mib": pages_to_mib(target),
            "actual_mib": pages_to_mib(actual),
        });
        if let Some(stats) = exitless_vmm::sync::lock(&s.stats).as_ref() {
            for (name, value) in stats.present() {
                body[name] = value.into();
            }
        }
        Ok(body)
    }

    /// `PATCH /balloon/statistics`: a new polling interval (statistics cannot be turned
    /// on or off after the start).
    pub fn update_balloon_statistics(&mut self, u: BalloonStatsUpdate) -> Result<(), Fault> {
        let machine = self.running("balloon statistics are updated on a running one")?.clone();
        machine.devices().set_balloon_stats_interval(u.stats_polling_interval_s).map_err(update_fault)?;
        if let Some(b) = self.config.balloon.as_mut() {
            b.stats_polling_interval_s = u.stats_polling_interval_s;
        }
        Ok(())
    }

    /// `PATCH /balloon/hinting/start`.
    pub fn start_balloon_hinting(&mut self, start: StartHinting) -> Result<(), Fault> {
        let machine = self.running("free page hinting runs on a running one")?;
        machine.devices().start_balloon_hinting(start.acknowledge_on_stop).map(drop).map_err(update_fault)
    }

    /// `GET /balloon/hinting/status`: the command the device gave, the driver's last.
    pub fn balloon_hinting_status(&self) -> Result<Value, Fault> {
        let machine = self.running("free page hinting runs on a running one")?;
        let devices = machine.devices();
        let (balloon, _) = devices.hinting_balloon().map_err(update_fault)?;
        let hint = *exitless_vmm::sync::lock(&balloon.shared.hint);
        Ok(json!({ "host_cmd": hint.host_cmd, "guest_cmd": hint.guest_cmd }))
    }

    /// `PATCH /balloon/hinting/stop`.
    pub fn stop_balloon_hinting(&mut self) -> Result<(), Fault> {
        let machine = self.running("free page hinting runs on a running one")?;
        machine.devices().stop_balloon_hinting().map_err(update_fault)
    }

    /// The balloon the machine is built with.
    fn balloon_device(&self) -> Option<BalloonConfig> {
        self.config.balloon.map(|b| BalloonConfig {
            amount_mib: b.amount_mib,
            deflate_on_oom: b.deflate_on_oom,
            stats_polling_interval_s: b.stats_polling_interval_s,
            free_page_hinting: b.free_page_hinting,
            free_page_reporting: b.free_page_reporting,
        })
    }
}

fn not_found() -> Fault {
    Fault("Balloon config error: No balloon device found.".into())
}

fn update_fault(e: impl std::fmt::Display) -> Fault {
    Fault(format!("Balloon update error: {e}"))
}

fn internal_fault(e: impl std::fmt::Display) -> Fault {
    Fault(format!("Internal VMM error: {e}"))
}
