//! Raw mode for a terminal on stdin, so the guest's console gets keys as they are typed.

/// Puts stdin in raw mode while it lives, if stdin is a terminal.
pub struct RawMode {
    saved: libc::termios,
}

impl RawMode {
    pub fn enable_if_terminal() -> Option<RawMode> {
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(libc::STDIN_FILENO) } != 1 {
            return None;
        }
        // SAFETY: termios is plain data; tcgetattr fills it in or fails.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: stdin is a terminal and `saved` is a valid termios to write into.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw only edits the struct it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        // Keep output processing, so the VMM's own messages still start at column 0.
        raw.c_oflag = saved.c_oflag;
        // SAFETY: `raw` is a valid termios derived from the terminal's own.
        (unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &raw) } == 0).then_some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the settings read from this same terminal.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &self.saved) };
    }
}

/// The guest console's input: stdin, unless it is /dev/null (what orchestrators and
/// scripts usually give), which never yields a byte and needs no reader thread.
pub fn console_input() -> Option<Box<dyn std::io::Read + Send>> {
    use std::os::unix::fs::MetadataExt;
    let null = std::fs::metadata("/dev/null").ok().map(|m| m.rdev());
    // SAFETY: fstat writes only into `st`, a plain-data struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: STDIN_FILENO is a descriptor number; fstat fails cleanly if it is closed.
    let is_null = unsafe { libc::fstat(libc::STDIN_FILENO, &mut st) } == 0
        && st.st_mode & libc::S_IFMT == libc::S_IFCHR
        && Some(st.st_rdev) == null;
    (!is_null).then(|| Box::new(std::io::stdin()) as Box<dyn std::io::Read + Send>)
}
