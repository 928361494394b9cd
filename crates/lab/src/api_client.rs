//! The API client the labs drive exitless (and Firecracker) with, and a console reader.

pub use exitless_api_client::{expect_ok, expect_ok_within, listening, request, request_within, Reply};

/// Reads the guest's console until a line containing `needle`, and returns that line.
pub fn wait_for_line(console: &mut impl std::io::BufRead, needle: &str) -> Result<String, String> {
    let mut line = String::new();
    loop {
        line.clear();
        match console.read_line(&mut line) {
            Ok(0) | Err(_) => return Err("its console closed before the guest said it runs".into()),
            Ok(_) if line.contains(needle) => return Ok(line),
            Ok(_) => {}
        }
    }
}

/// [`wait_for_line`] for at most `within`: the console's writer, process `pid` (a child
/// not yet waited for), is killed when the time is up. A guest that never prints (a
/// peer's, stuck in its boot) makes the lab report it, not hang. The pipe is polled
/// before each read, so the wait adds nothing to the start it measures.
pub fn wait_for_line_within(
    console: &mut std::io::BufReader<std::process::ChildStdout>,
    needle: &str,
    pid: u32,
    within: std::time::Duration,
) -> Result<String, String> {
    use std::io::BufRead;
    let closed = || "its console closed before the guest said it runs".to_string();
    let deadline = std::time::Instant::now() + within;
    let mut line = Vec::new();
    loop {
        if console.buffer().is_empty() && !readable_by(console.get_ref(), deadline) {
            // SAFETY: the caller's child, not yet waited for: the pid is still its, at
            // worst a zombie's.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            return Err(format!("no line with {needle:?} within {within:?} (killed)"));
        }
        // A line may come in pieces: only a whole one is looked at.
        let buf = console.fill_buf().map_err(|_| closed())?;
        if buf.is_empty() {
            return Err(closed());
        }
        let (piece, whole) = match buf.iter().position(|&b| b == b'\n') {
            Some(end) => (end + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..piece]);
        console.consume(piece);
        if whole {
            let text = String::from_utf8(std::mem::take(&mut line)).map_err(|_| closed())?;
            if text.contains(needle) {
                return Ok(text);
            }
        }
    }
}

/// Whether `pipe` has something to read (or was closed) before `deadline`.
fn readable_by(pipe: &impl std::os::fd::AsRawFd, deadline: std::time::Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut fd = libc::pollfd { fd: pipe.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // Rounded up: a wait of less than a millisecond is not a wait of none.
        let ms = i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
        // SAFETY: one pollfd on this stack, for the duration of the call.
        match unsafe { libc::poll(&mut fd, 1, ms) } {
            n if n > 0 => return true,
            0 if left.is_zero() => return false,
            // A failure other than a signal's: the read says what it is.
            n if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted => return true,
            // Time left over (a rounding), or a signal: wait on.
            _ => {}
        }
    }
}
