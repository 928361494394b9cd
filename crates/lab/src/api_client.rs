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
/// not yet waited for), is killed when the time is up, which ends the read. A guest that
/// never prints (a peer's, stuck in its boot) makes the lab report it, not hang.
pub fn wait_for_line_within(
    console: &mut impl std::io::BufRead,
    needle: &str,
    pid: u32,
    within: std::time::Duration,
) -> Result<String, String> {
    use std::sync::mpsc::RecvTimeoutError;
    let (found, timer) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let watchdog = scope.spawn(move || {
            // Woken early when the read ends (the sender dropped).
            let expired = matches!(timer.recv_timeout(within), Err(RecvTimeoutError::Timeout));
            if expired {
                // SAFETY: the caller's child, not yet waited for: the pid is still its, at
                // worst a zombie's.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            expired
        });
        let line = wait_for_line(console, needle);
        drop(found);
        match watchdog.join() {
            Ok(false) => line,
            _ => Err(format!("no line with {needle:?} within {within:?} (killed)")),
        }
    })
}
