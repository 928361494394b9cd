//! Firecracker's endpoints: method and path to an action on the microVM, answered as
//! Firecracker answers (204 with no body for a change, 200 with JSON for a query, 400
//! with `{"fault_message": ...}` for anything refused). Pure: no socket, so every case is
//! tested directly.

use super::metrics::Metrics;
use super::model::{self, ActionType};
use super::request::{body_fault, check_id, parse};
use super::vm::{Fault, State, Vm};
use crate::args::FIRECRACKER_API;
use serde_json::{json, Value};

/// What goes back: a status and, unless 204, a JSON body.
#[derive(Debug, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: Option<Value>,
}

impl Reply {
    fn ok(body: Value) -> Reply {
        Reply { status: 200, body: Some(body) }
    }
    fn no_content() -> Reply {
        Reply { status: 204, body: None }
    }
    pub fn fault(message: impl Into<String>) -> Reply {
        Reply { status: 400, body: Some(json!({ "fault_message": message.into() })) }
    }
}

/// What the caller does after replying.
pub enum Then {
    Nothing,
    /// InstanceStart (or a snapshot load) was accepted: run this machine, paused if true.
    Start(Box<exitless_vmm::Machine>, bool),
    FlushMetrics,
}

/// Paths of Firecracker's API exitless refuses, by their first components.
const NOT_SUPPORTED: &[(&[&str], &str)] = &[
    // Memory hotplug is served; device hotplug (/hotplug/<device>) is not.
    (&["hotplug"], "device hotplug"),
];

/// MMDS's document: any JSON value, lists anywhere (SSH keys), as Firecracker takes it;
/// the shape check is for the API's own bodies.
fn parse_metadata(body: &[u8]) -> Result<Value, Fault> {
    serde_json::from_slice(body).map_err(body_fault)
}

pub fn handle(vm: &mut Vm, metrics: &Metrics, method: &str, path: &str, body: &[u8]) -> (Reply, Then) {
    match route(vm, metrics, method, path, body) {
        Ok(r) => r,
        Err(Fault(message)) => (Reply::fault(message), Then::Nothing),
    }
}

fn route(vm: &mut Vm, metrics: &Metrics, method: &str, path: &str, body: &[u8]) -> Result<(Reply, Then), Fault> {
    let path = path.split('?').next().unwrap_or_default();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let done = |r: Result<(), Fault>| r.map(|()| (Reply::no_content(), Then::Nothing));
    let refused = NOT_SUPPORTED.iter().find(|(prefix, _)| parts.starts_with(prefix) && parts != ["hotplug", "memory"]);
    if let Some((prefix, what)) = refused {
        return Err(Fault(format!("exitless does not support {what} (/{}).", prefix.join("/"))));
    }
    // The endpoints of the devices in files of their own (api/devices/).
    if let Some(answer) = super::devices::route(vm, method, &parts, body) {
        return answer.map(|body| (body.map_or_else(Reply::no_content, Reply::ok), Then::Nothing));
    }
    match (method, parts.as_slice()) {
        ("GET", [""]) => Ok((
            Reply::ok(json!({
                "app_name": "exitless",
                "id": vm.id,
                "state": vm.state_name(),
                "vmm_version": FIRECRACKER_API,
            })),
            Then::Nothing,
        )),
        ("GET", ["version"]) => Ok((Reply::ok(json!({ "firecracker_version": FIRECRACKER_API })), Then::Nothing)),
        ("GET", ["vm", "config"]) => Ok((Reply::ok(serde_json::to_value(&vm.config)?), Then::Nothing)),
        ("GET", ["machine-config"]) => Ok((Reply::ok(serde_json::to_value(&vm.config.machine_config)?), Then::Nothing)),
        ("GET", ["exits"]) => Ok((Reply::ok(vm.exits()), Then::Nothing)),
        ("PUT", ["machine-config"]) => done(vm.set_machine_config(parse(body)?)),
        ("PATCH", ["machine-config"]) => done(vm.update_machine_config(parse(body)?)),
        ("PUT", ["boot-source"]) => done(vm.set_boot_source(parse(body)?)),
        ("PUT", ["cpu-config"]) => {
            done(vm.set_cpu_config(exitless_vmm::cpu_template::CustomTemplate::from_json(body).map_err(body_fault)?))
        }
        ("PUT", ["drives", id]) => done(vm.set_drive(check_id(id)?, parse(body)?)),
        ("PUT", ["network-interfaces", id]) => done(vm.set_network_interface(check_id(id)?, parse(body)?)),
        ("PATCH", ["drives", id]) => done(vm.update_drive(check_id(id)?, parse(body)?)),
        ("PATCH", ["network-interfaces", id]) => done(vm.update_network_interface(check_id(id)?, parse(body)?)),
        ("PUT", ["logger"]) => done(vm.set_logger(parse(body)?)),
        ("PUT", ["metrics"]) => done(vm.set_metrics(parse(body)?, metrics)),
        ("PUT", ["entropy"]) => done(vm.set_entropy(parse(body)?)),
        ("PUT", ["serial"]) => done(vm.set_serial(parse(body)?)),
        ("PUT", ["vsock"]) => done(vm.set_vsock(parse(body)?)),
        ("PUT", ["snapshot", "create"]) => done(vm.create_snapshot(parse(body)?)),
        ("PUT", ["snapshot", "load"]) => {
            let (machine, paused) = vm.load_snapshot(parse(body)?)?;
            Ok((Reply::no_content(), Then::Start(Box::new(machine), paused)))
        }
        ("PUT", ["mmds", "config"]) => done(vm.set_mmds_config(parse(body)?)),
        ("PUT", ["mmds"]) => done(vm.put_mmds(parse_metadata(body)?)),
        ("PATCH", ["mmds"]) => done(vm.patch_mmds(parse_metadata(body)?)),
        ("GET", ["mmds"]) => Ok((Reply::ok(vm.mmds()?), Then::Nothing)),
        ("PUT", ["actions"]) => action(vm, metrics, parse(body)?),
        ("PATCH", ["vm"]) => done(vm.set_state(parse::<model::Vm>(body)?.state)),
        ("GET" | "PUT" | "PATCH", _) => Err(Fault(format!("Invalid request: {method} {path} is not an endpoint."))),
        _ => Err(Fault(format!("Invalid request method: {method}."))),
    }
}

fn action(vm: &mut Vm, metrics: &Metrics, a: model::Action) -> Result<(Reply, Then), Fault> {
    match a.action_type {
        ActionType::InstanceStart => match vm.state {
            State::NotStarted => Ok((Reply::no_content(), Then::Start(Box::new(vm.build(None)?), false))),
            _ => Err(Fault("The microVM is already running: InstanceStart is allowed once.".into())),
        },
        // As Firecracker (rpc_interface.rs): refused before the start; after it, with no
        // metrics file there is nothing to write, and the answer is the same 204.
        ActionType::FlushMetrics => {
            vm.running("metrics are flushed on a running one")?;
            match metrics.is_open() {
                true => Ok((Reply::no_content(), Then::FlushMetrics)),
                false => Ok((Reply::no_content(), Then::Nothing)),
            }
        }
        ActionType::SendCtrlAltDel => vm.send_ctrl_alt_del().map(|()| (Reply::no_content(), Then::Nothing)),
    }
}
