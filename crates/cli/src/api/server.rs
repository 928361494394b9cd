//! The API's HTTP side: hyper on the Unix socket, one task per connection on a
//! current-thread tokio runtime (the thread that called [`serve`]). Whatever a client
//! sends or fails to send costs only its own connection:
//! - a body is bounded before anything is allocated for it: a Content-Length over the
//!   limit is refused from the header alone, a chunked body is cut off at the limit;
//! - a head must arrive within [`Limits::header_timeout`], a body within
//!   [`Limits::body_timeout`]; a stalled or vanished client loses its connection, and the
//!   others are served meanwhile, since each connection waits in a task of its own;
//! - at most [`Limits::max_connections`] are open at once (more are closed on accept).
//!
//! Requests are answered one at a time by `handler`, which sees the method, the path and
//! the whole body and returns the [`Reply`].

use super::routes::Reply;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What one connection may cost.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The largest request body (`--http-api-max-payload-size`).
    pub max_body: usize,
    /// How long a request's head may take to arrive; also how long a kept-alive
    /// connection may sit idle.
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive once its head has.
    pub body_timeout: Duration,
    pub max_connections: usize,
}

impl Limits {
    pub fn new(max_body: usize) -> Self {
        Limits {
            max_body,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(10),
            max_connections: 256,
        }
    }
}

/// Answers requests: method, path (no query) and body in, a reply out.
pub type Handler = Rc<dyn Fn(&str, &str, &[u8]) -> Reply>;

/// The socket and the runtime that serves it, made before anything confines the thread:
/// a guest started from `--config-file` confines it before the first request is served,
/// and the API filter has no room for making a runtime (epoll_create1, eventfd2, FIONBIO).
pub struct Server {
    listener: std::os::unix::net::UnixListener,
    runtime: tokio::runtime::Runtime,
    limits: Limits,
}

impl Server {
    pub fn new(listener: std::os::unix::net::UnixListener, limits: Limits) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
        Ok(Server { listener, runtime, limits })
    }

    /// Serves the socket until the process ends (the thread that runs the machine ends it).
    pub fn serve(self, handler: Handler) -> io::Result<()> {
        let Server { listener, runtime, limits } = self;
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async move {
            let listener = tokio::net::UnixListener::from_std(listener)?;
            let open = Rc::new(Cell::new(0usize));
            let mut refused_logged = false;
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    // EMFILE and the like: the next accept may work once connections close.
                    Err(e) => {
                        tracing::warn!("api: cannot accept a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                if open.get() >= limits.max_connections {
                    if !refused_logged {
                        tracing::warn!("api: {} connections open; closing new ones", limits.max_connections);
                        refused_logged = true;
                    }
                    continue;
                }
                open.set(open.get() + 1);
                let (open, handler) = (open.clone(), handler.clone());
                tokio::task::spawn_local(async move {
                    connection(stream, limits, handler).await;
                    open.set(open.get() - 1);
                });
            }
        })
    }
}

/// Serves one connection until the client or hyper ends it.
pub(super) async fn connection<S>(stream: S, limits: Limits, handler: Handler)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        let handler = handler.clone();
        async move { Ok::<_, std::convert::Infallible>(answer(request, limits, &handler).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        // A client may half-close (socat, `nc -N`) once its request is sent: hyper would
        // otherwise close the connection on that EOF, mid-request.
        .half_close(true)
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD)
        .serve_connection(hyper_util::rt::TokioIo::new(FaultOnParseError::new(stream)), service)
        .await;
    if let Err(e) = served {
        tracing::debug!("api: connection ended: {e}");
    }
}

/// The most a request's head (request line and headers) may take.
const MAX_HEAD: usize = 16 * 1024;

async fn answer(request: Request<Incoming>, limits: Limits, handler: &Handler) -> Response<Full<Bytes>> {
    let method = request.method().as_str().to_string();
    let path = request.uri().path().to_string();
    let body = match read_body(request, limits).await {
        Ok(body) => body,
        Err(message) => {
            tracing::info!("api: {method} {path} -> 400 ({message})");
            // The rest of the body is not read: the connection cannot carry another request.
            let mut response = response(Reply::fault(message));
            response.headers_mut().insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
            return response;
        }
    };
    let reply = handler(&method, &path, &body);
    tracing::info!("api: {method} {path} -> {}", reply.status);
    response(reply)
}

/// The whole body, or why not (as Firecracker words the size fault).
async fn read_body(request: Request<Incoming>, limits: Limits) -> Result<Bytes, String> {
    let too_large = |size: &dyn std::fmt::Display| {
        format!("Request payload with size {size} is larger than the limit of {} allowed by server.", limits.max_body)
    };
    let announced = request.headers().get(hyper::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok());
    if let Some(length) = announced.and_then(|v| v.parse::<u64>().ok()) {
        if length > limits.max_body as u64 {
            return Err(too_large(&length));
        }
    }
    let body = Limited::new(request.into_body(), limits.max_body).collect();
    match tokio::time::timeout(limits.body_timeout, body).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(&"over the limit")),
        Ok(Err(e)) => Err(format!("The request body could not be read: {e}.")),
        Err(_) => Err(format!("The request body did not arrive within {} s.", limits.body_timeout.as_secs())),
    }
}

fn response(reply: Reply) -> Response<Full<Bytes>> {
    let body = reply.body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let has_body = !body.is_empty();
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if has_body {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    }
    response
}

/// hyper answers a request it cannot parse (a path with raw UTF-8, a broken header, a
/// head too large) by itself, with an empty 4xx, and closes the connection. Firecracker's
/// clients expect a `fault_message` in every error: this wraps the stream and gives such a
/// reply its body. Every reply the handler makes has a body or is a 2xx, so an empty
/// 4xx head can only be hyper's own.
struct FaultOnParseError<S> {
    inner: S,
    /// A rewritten reply still being written, and how much of it is out.
    pending: Option<(Vec<u8>, usize)>,
}

impl<S> FaultOnParseError<S> {
    fn new(inner: S) -> Self {
        FaultOnParseError { inner, pending: None }
    }
}

/// `buf` with hyper's own empty error reply at its end rewritten with a fault_message;
/// None if it ends with no such reply. hyper flattens what it writes, so the reply may
/// follow others answered before it on the same connection (pipelined requests); a body
/// never holds "HTTP/1.1 4" (paths, the only client text echoed, have no spaces).
fn with_fault_message(buf: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(buf).ok()?;
    let at = text.rfind("HTTP/1.1 4")?;
    let (before, head) = text.split_at(at);
    let whole_head = head.find("\r\n\r\n").is_some_and(|end| end + 4 == head.len());
    if !whole_head || !head.to_ascii_lowercase().contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let status = head.strip_prefix("HTTP/1.1 ")?.lines().next()?;
    let body = serde_json::json!({
        "fault_message": format!("The request could not be parsed as HTTP ({status}): check the request line and headers (ASCII only).")
    })
    .to_string();
    Some(
        format!(
            "{before}HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for FaultOnParseError<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FaultOnParseError<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.pending.is_none() {
            match with_fault_message(buf) {
                Some(rewritten) => self.pending = Some((rewritten, 0)),
                None => return Pin::new(&mut self.inner).poll_write(cx, buf),
            }
        }
        // Write the whole rewritten reply before telling hyper its bytes are out.
        let this = &mut *self;
        while let Some((bytes, done)) = this.pending.as_mut() {
            if *done == bytes.len() {
                this.pending = None;
                return Poll::Ready(Ok(buf.len()));
            }
            match Pin::new(&mut this.inner).poll_write(cx, &bytes[*done..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *done += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_empty_error_replies_get_a_fault_message() {
        let hyper_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: Tue, 24 Nov 2026 03:00:00 GMT\r\n\r\n";
        let rewritten = String::from_utf8(with_fault_message(hyper_400).unwrap()).unwrap();
        assert!(rewritten.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{rewritten}");
        let (head, body) = rewritten.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())), "{rewritten}");
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(json["fault_message"].as_str().unwrap().contains("400 Bad Request"));
        let hyper_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        assert!(with_fault_message(hyper_431).is_some());
        // After a pipelined answer in the same write: that one is kept as it was.
        let ours = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        let both = format!("{ours}{}", std::str::from_utf8(hyper_400).unwrap());
        let rewritten = String::from_utf8(with_fault_message(both.as_bytes()).unwrap()).unwrap();
        assert!(rewritten.starts_with(ours) && rewritten.ends_with("(ASCII only).\"}"), "{rewritten}");
        // The handler's own replies pass through untouched.
        for ours in [
            &b"HTTP/1.1 204 No Content\r\ndate: x\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 20\r\n\r\n",
            b"{\"fault_message\":\"x\"}",
        ] {
            assert!(with_fault_message(ours).is_none());
        }
    }
}
