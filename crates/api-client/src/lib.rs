//! A client for exitless's Firecracker API on its Unix socket, as small as an orchestrator's:
//! one HTTP/1.1 request per connection, `Connection: close`, the JSON body (if any) back.
//! Used by `exitless top` and the labs; its own crate (as Cloud Hypervisor's `api_client`)
//! so that the VMM binary carries none of the labs' code.

use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// A request's outcome: the status and the body, parsed when it is JSON.
pub struct Reply {
    pub status: u16,
    pub body: Option<Value>,
}

pub fn request(sock: &Path, method: &str, path: &str, body: Option<&Value>) -> Result<Reply, String> {
    request_within(sock, method, path, body, Duration::from_secs(10))
}

/// [`request`], waiting up to `wait` for each read of the reply (a snapshot of a large
/// guest on huge pages takes longer than most requests).
pub fn request_within(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
    wait: Duration,
) -> Result<Reply, String> {
    let gone = |e: std::io::Error| format!("cannot reach {}: {e} (is the microVM running?)", sock.display());
    let mut stream = UnixStream::connect(sock).map_err(gone)?;
    stream.set_read_timeout(Some(wait)).map_err(gone)?;
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).map_err(gone)?;
    // Read the head, then exactly Content-Length bytes: a server may keep the connection
    // open despite `Connection: close` (Firecracker's does).
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_len, body_len) = loop {
        if let Some(at) = reply.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&reply[..at]).to_ascii_lowercase();
            let len = head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok());
            break (at + 4, len.unwrap_or(0usize));
        }
        match stream.read(&mut chunk).map_err(gone)? {
            0 => return Err("the API closed the connection before its reply's headers".into()),
            n => reply.extend_from_slice(&chunk[..n]),
        }
    };
    while reply.len() < head_len + body_len {
        match stream.read(&mut chunk).map_err(gone)? {
            0 => break,
            n => reply.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("the API answered with no headers")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("the API answered {}", head.lines().next().unwrap_or("nothing")))?;
    Ok(Reply { status, body: serde_json::from_str(body).ok() })
}

/// A request that must succeed (2xx); a refusal becomes its fault_message.
pub fn expect_ok(sock: &Path, method: &str, path: &str, body: Option<&Value>) -> Result<Option<Value>, String> {
    expect_ok_within(sock, method, path, body, Duration::from_secs(10))
}

/// [`expect_ok`], waiting up to `wait` for each read of the reply.
pub fn expect_ok_within(
    sock: &Path,
    method: &str,
    path: &str,
    body: Option<&Value>,
    wait: Duration,
) -> Result<Option<Value>, String> {
    let reply = request_within(sock, method, path, body, wait)?;
    if !(200..300).contains(&reply.status) {
        let why = reply.body.as_ref().and_then(|b| b["fault_message"].as_str().map(str::to_string));
        return Err(format!("{method} {path}: {} {}", reply.status, why.unwrap_or_default()));
    }
    Ok(reply.body)
}

/// Whether the API answers connections yet: its socket file appears when bound, a moment
/// before it listens (a connection in between is refused).
pub fn listening(sock: &Path) -> bool {
    UnixStream::connect(sock).is_ok()
}
