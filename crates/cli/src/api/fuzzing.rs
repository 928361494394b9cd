//! The entry point of the `api_request` fuzz target (and of its corpus replay on the
//! stable toolchain): a sequence of API requests handled as the server handles them, on
//! one microVM that is never started.

use super::metrics::Metrics;
use super::model::{Action, ActionType};
use super::routes::{handle, Then};
use super::vm::Vm;

const METHODS: [&str; 6] = ["GET", "PUT", "PATCH", "DELETE", "POST", "get"];

/// `data`: requests separated by NUL bytes, each a method selector byte, then the path up
/// to the first newline, then the body. Requests with effects outside the process are
/// skipped: PUT /logger and PUT /metrics (they create files at the given path) and
/// InstanceStart (it builds a VM). Whatever else arrives must be answered 200 or 204, or
/// 400 with a `fault_message`, and the configuration must stay serializable.
pub fn requests(data: &[u8]) {
    let mut vm = Vm::new("fuzz".into());
    let metrics = Metrics::default();
    for request in data.split(|&b| b == 0).take(64) {
        let Some((&selector, rest)) = request.split_first() else { continue };
        let method = METHODS[usize::from(selector) % METHODS.len()];
        let (path, body) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        let path = String::from_utf8_lossy(path);
        if path.contains("logger") || path.contains("metrics") {
            continue;
        }
        if serde_json::from_slice::<Action>(body).is_ok_and(|a| a.action_type == ActionType::InstanceStart) {
            continue;
        }
        let (reply, then) = handle(&mut vm, &metrics, method, &path, body);
        assert!(!matches!(then, Then::Start(_)), "a machine was built");
        match reply.status {
            200 => assert!(reply.body.is_some(), "200 without a body"),
            204 => assert!(reply.body.is_none(), "204 with a body"),
            400 => assert!(reply.body.as_ref().is_some_and(|b| b["fault_message"].is_string()), "{reply:?}"),
            other => panic!("status {other}"),
        }
        serde_json::to_string(&vm.config).expect("the configuration serializes");
    }
}
