//! The entry points of the `api_request` and `api_http` fuzz targets (and of their
//! corpus replays on the stable toolchain): API requests handled as the server handles
//! them, on one microVM that is never started; `api_http` from raw bytes on the wire.

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
        assert!(!matches!(then, Then::Start(..)), "a machine was built");
        match reply.status {
            200 => assert!(reply.body.is_some(), "200 without a body"),
            204 => assert!(reply.body.is_none(), "204 with a body"),
            400 => assert!(reply.body.as_ref().is_some_and(|b| b["fault_message"].is_string()), "{reply:?}"),
            other => panic!("status {other}"),
        }
        serde_json::to_string(&vm.config).expect("the configuration serializes");
    }
}

/// `data`: the bytes a client sends on one connection (request lines, headers, bodies,
/// chunked or not, pipelined, cut short), then the client's end of the stream. The server
/// must answer with well-formed HTTP responses, every error one with a `fault_message`,
/// and close; nothing may panic or hang (a stalled body ends at the body timeout).
pub fn http(data: &[u8]) {
    let vm = std::rc::Rc::new(std::cell::RefCell::new(Vm::new("fuzz".into())));
    let metrics = std::rc::Rc::new(Metrics::default());
    let handler: super::server::Handler = std::rc::Rc::new(move |method: &str, path: &str, body: &[u8]| {
        let start = serde_json::from_slice::<Action>(body).is_ok_and(|a| a.action_type == ActionType::InstanceStart);
        if path.contains("logger") || path.contains("metrics") || start {
            return super::routes::Reply::fault("skipped by the fuzz target");
        }
        handle(&mut vm.borrow_mut(), &metrics, method, path, body).0
    });
    let mut limits = super::server::Limits::new(4096);
    limits.body_timeout = std::time::Duration::from_millis(50);
    limits.header_timeout = std::time::Duration::from_millis(50);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let data = data.to_vec();
    let answer = tokio::task::LocalSet::new().block_on(&runtime, async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, server) = tokio::io::duplex(1 << 16);
        let served = tokio::task::spawn_local(super::server::connection(server, limits, handler));
        let (mut rx, mut tx) = tokio::io::split(client);
        tokio::task::spawn_local(async move {
            let _ = tx.write_all(&data).await;
            let _ = tx.shutdown().await;
        });
        let mut answer = Vec::new();
        let limit = std::time::Duration::from_secs(5);
        let received = tokio::time::timeout(limit, rx.read_to_end(&mut answer)).await.expect("the server hung");
        received.expect("the answer is readable");
        let _ = served.await;
        answer
    });
    check_responses(&answer);
}

/// Every response in `bytes` parses, and every error response carries a fault_message.
fn check_responses(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        let head = match response.parse(bytes).expect("a well-formed response") {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => panic!("a response cut short: {:?}", String::from_utf8_lossy(bytes)),
        };
        let code = response.code.expect("a status code");
        let length = response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .map_or(0, |h| std::str::from_utf8(h.value).expect("ASCII").parse::<usize>().expect("a length"));
        let body = &bytes[head..head + length];
        if code >= 400 {
            let json: serde_json::Value = serde_json::from_slice(body).expect("an error body is JSON");
            assert!(json["fault_message"].is_string(), "{code} without a fault_message: {json}");
        }
        // 100: hyper's interim answer to `Expect: 100-continue`, before the real one.
        assert!(matches!(code, 100 | 200 | 204 | 400..=499), "status {code}");
        bytes = &bytes[head + length..];
    }
}
