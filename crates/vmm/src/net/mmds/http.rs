//! The guest's HTTP requests to MMDS and their answers, with Firecracker's status codes
//! and error texts. Requests are parsed with httparse; a connection's bytes may hold a
//! partial request, one, or several pipelined.

use super::store::{Format, Mmds, MmdsError, Version};
use std::time::Instant;

/// The most a request's head and body may take; beyond it the connection gets 400 and closes.
pub const MAX_REQUEST: usize = 4096;
const MAX_HEADERS: usize = 32;
const TOKEN_PATH: &str = "/latest/api/token";
const TOKEN_HEADERS: [&str; 2] = ["x-metadata-token", "x-aws-ec2-metadata-token"];
const TTL_HEADERS: [&str; 2] = ["x-metadata-token-ttl-seconds", "x-aws-ec2-metadata-token-ttl-seconds"];

/// What a connection's buffered bytes came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Not a whole request yet.
    Incomplete,
    /// One request answered: drop `consumed` bytes, send `reply`, then close if `close`.
    Answered { consumed: usize, reply: Vec<u8>, close: bool },
}

/// Answers the first request in `buf`, if it holds a whole one.
pub fn answer(mmds: &mut Mmds, buf: &[u8], now: Instant) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_REQUEST => return Parsed::Incomplete,
        Ok(httparse::Status::Partial) => return refuse(400, "Request too large."),
        Err(e) => return refuse(400, &format!("Invalid request: {e}.")),
    };
    let header = |names: &[&str]| {
        req.headers.iter().find(|h| names.iter().any(|n| h.name.eq_ignore_ascii_case(n))).map(|h| h.value)
    };
    if header(&["transfer-encoding"]).is_some() {
        return refuse(501, "Transfer encodings are not supported.");
    }
    let body =
        match header(&["content-length"]).map(|v| std::str::from_utf8(v).ok().and_then(|s| s.trim().parse().ok())) {
            None => 0usize,
            Some(Some(n)) if head + n <= MAX_REQUEST => n,
            Some(_) => return refuse(400, "Invalid or too large Content-Length."),
        };
    if buf.len() < head + body {
        return Parsed::Incomplete;
    }
    let text = |v: &[u8]| String::from_utf8_lossy(v).trim().to_string();
    let http10 = req.version == Some(0);
    let connection = header(&["connection"]).map(text).unwrap_or_default().to_ascii_lowercase();
    let close = if http10 { connection != "keep-alive" } else { connection == "close" };
    let path = req.path.unwrap_or_default().split(['?', '#']).next().unwrap_or_default();
    let json = header(&["accept"]).is_some_and(|v| text(v).starts_with("application/json"));
    let format = if json && !mmds.imds_compat { Format::Json } else { Format::Imds };
    let token = header(&TOKEN_HEADERS).map(text);
    let reply = if !path.starts_with('/') {
        Reply::text(400, "Invalid URI.")
    } else {
        match req.method.unwrap_or_default() {
            "GET" => get(mmds, path, format, token.as_deref(), now),
            "PUT" => put_token(mmds, path, header(&TTL_HEADERS).map(text), header(&["x-forwarded-for"]).is_some(), now),
            _ => Reply { allow: true, ..Reply::text(405, "Not allowed HTTP method.") },
        }
    };
    Parsed::Answered { consumed: head + body, reply: reply.encode(http10), close }
}

fn refuse(status: u16, message: &str) -> Parsed {
    Parsed::Answered { consumed: 0, reply: Reply::text(status, message).encode(false), close: true }
}

fn get(mmds: &Mmds, path: &str, format: Format, token: Option<&str>, now: Instant) -> Reply {
    if mmds.version == Version::V2 {
        match token {
            None => {
                return Reply::text(
                    401,
                    "No MMDS token provided. Use `X-metadata-token` or `X-aws-ec2-metadata-token` header to specify the session token.",
                )
            }
            Some(t) if !mmds.tokens.is_valid(t, now) => return Reply::text(401, "MMDS token not valid."),
            Some(_) => {}
        }
    }
    match mmds.get(path, format) {
        Ok(body) => Reply { json: format == Format::Json, ..Reply::text(200, &body) },
        Err(MmdsError::NotFound) => Reply::text(404, &format!("Resource not found: {path}.")),
        Err(e) => Reply::text(501, &e.to_string()),
    }
}

fn put_token(mmds: &mut Mmds, path: &str, ttl: Option<String>, forwarded: bool, now: Instant) -> Reply {
    if forwarded {
        return Reply::text(400, "Invalid header. Reason: Unsupported header name. Key: X-Forwarded-For");
    }
    if path.split('/').filter(|p| !p.is_empty()).ne(TOKEN_PATH.split('/').filter(|p| !p.is_empty())) {
        return Reply::text(404, &format!("Resource not found: {path}."));
    }
    let Some(ttl) = ttl else {
        return Reply::text(
            400,
            "Token time to live value not found. Use `X-metadata-token-ttl-seconds` or `X-aws-ec2-metadata-token-ttl-seconds` header to specify the token's lifetime.",
        );
    };
    let Ok(seconds) = ttl.parse::<u32>() else {
        return Reply::text(
            400,
            &format!("Invalid header. Reason: Invalid value. Key: X-metadata-token-ttl-seconds; Value: {ttl}"),
        );
    };
    match mmds.tokens.issue(seconds, now) {
        Ok(token) => Reply { ttl: Some(seconds), ..Reply::text(200, &token) },
        Err(e) => Reply::text(400, &e.to_string()),
    }
}

struct Reply {
    status: u16,
    body: String,
    json: bool,
    /// 405 says which methods are allowed.
    allow: bool,
    /// A token's lifetime, echoed back as EC2 does.
    ttl: Option<u32>,
}

impl Reply {
    fn text(status: u16, body: &str) -> Reply {
        Reply { status, body: body.to_string(), json: false, allow: false, ttl: None }
    }

    fn encode(&self, http10: bool) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            401 => "Unauthorized",
            404 => "Not Found",
            405 => "Method Not Allowed",
            _ => "Not Implemented",
        };
        let mut head = format!("HTTP/1.{} {} {reason}\r\n", if http10 { 0 } else { 1 }, self.status);
        let kind = if self.json { "application/json" } else { "text/plain" };
        head += &format!("Server: exitless MMDS\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n", self.body.len());
        if self.allow {
            head += "Allow: GET, PUT\r\n";
        }
        if let Some(ttl) = self.ttl {
            head += &format!("X-metadata-token-ttl-seconds: {ttl}\r\n");
        }
        head += "\r\n";
        let mut out = head.into_bytes();
        out.extend_from_slice(self.body.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ask(m: &mut Mmds, req: &str) -> (String, bool) {
        match answer(m, req.as_bytes(), Instant::now()) {
            Parsed::Answered { reply, close, .. } => (String::from_utf8(reply).unwrap(), close),
            Parsed::Incomplete => panic!("incomplete: {req}"),
        }
    }

    fn mmds(version: Version) -> Mmds {
        let mut m = Mmds::new(4096);
        m.put(json!({"latest": {"meta-data": {"ami-id": "ami-1"}}})).unwrap();
        m.version = version;
        m
    }

    #[test]
    fn v1_answers_gets_in_both_formats() {
        let mut m = mmds(Version::V1);
        let (r, close) = ask(&mut m, "GET /latest/meta-data/ami-id HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\nami-1"), "{r}");
        assert!(!close);
        let (r, _) = ask(&mut m, "GET /latest/meta-data HTTP/1.1\r\nAccept: application/json\r\n\r\n");
        assert!(r.contains("application/json") && r.ends_with("{\"ami-id\":\"ami-1\"}"), "{r}");
        m.imds_compat = true;
        let (r, _) = ask(&mut m, "GET /latest/meta-data HTTP/1.1\r\nAccept: application/json\r\n\r\n");
        assert!(r.ends_with("\r\n\r\nami-id"), "{r}");
        let (r, close) = ask(&mut m, "GET /nope HTTP/1.0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.0 404") && r.ends_with("Resource not found: /nope."), "{r}");
        assert!(close, "HTTP/1.0 closes");
        let (r, _) = ask(&mut m, "DELETE / HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 405") && r.contains("Allow: GET, PUT"), "{r}");
    }

    #[test]
    fn v2_wants_a_valid_token() {
        let mut m = mmds(Version::V2);
        let (r, _) = ask(&mut m, "GET /latest/meta-data/ami-id HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 401") && r.contains("No MMDS token provided"), "{r}");
        let (r, _) = ask(&mut m, "PUT /latest/api/token HTTP/1.1\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 400") && r.contains("time to live"), "{r}");
        let (r, _) = ask(&mut m, "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        let (r, _) = ask(&mut m, "PUT /other HTTP/1.1\r\nX-metadata-token-ttl-seconds: 60\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 404"), "{r}");
        let (r, _) = ask(&mut m, "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 60\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200") && r.contains("X-metadata-token-ttl-seconds: 60"), "{r}");
        let token = r.rsplit("\r\n").next().unwrap().to_string();
        let (r, _) =
            ask(&mut m, &format!("GET /latest/meta-data/ami-id HTTP/1.1\r\nX-metadata-token: {token}\r\n\r\n"));
        assert!(r.ends_with("ami-1"), "{r}");
        let bad =
            format!("GET /latest/meta-data/ami-id HTTP/1.1\r\nX-aws-ec2-metadata-token: {}\r\n\r\n", "a".repeat(64));
        assert!(ask(&mut m, &bad).0.contains("401 Unauthorized\r\n"));
    }

    #[test]
    fn partial_pipelined_and_garbage() {
        let mut m = mmds(Version::V1);
        assert_eq!(answer(&mut m, b"GET / HTTP/1.1\r\nHost:", Instant::now()), Parsed::Incomplete);
        let two = b"GET /latest HTTP/1.1\r\n\r\nGET /latest HTTP/1.1\r\n\r\n";
        let Parsed::Answered { consumed, .. } = answer(&mut m, two, Instant::now()) else { panic!() };
        assert_eq!(consumed, two.len() / 2);
        let with_body =
            b"PUT /latest/api/token HTTP/1.1\r\nContent-Length: 3\r\nX-metadata-token-ttl-seconds: 5\r\n\r\nab";
        assert_eq!(answer(&mut m, with_body, Instant::now()), Parsed::Incomplete);
        let (r, close) = ask(&mut m, "\x00\x01garbage\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 400") && close, "{r}");
        let (r, close) = ask(&mut m, &format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_REQUEST)));
        assert!(r.starts_with("HTTP/1.1 400") && close, "{r}");
        let (r, _) = ask(&mut m, "GET /latest HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    }
}
