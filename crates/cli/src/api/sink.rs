//! Log and metrics destinations, opened as Firecracker opens them: read-write and
//! non-blocking, so that a FIFO whose reader has not come yet (the Go SDK, firectl and
//! firecracker-containerd make such FIFOs and read them later) neither blocks `open()`
//! nor fails it, and a write to a full FIFO returns at once instead of stalling a vCPU or
//! the API. A line that does not fit is dropped whole; the caller counts it.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

/// Opens (creating a regular file if nothing is there) `path` for appending lines.
pub fn open(path: &str) -> std::io::Result<File> {
    std::fs::OpenOptions::new().read(true).append(true).create(true).custom_flags(libc::O_NONBLOCK).open(path)
}

/// Writes `line` whole; false if it was dropped (a full FIFO, a failing disk). A FIFO
/// takes writes of up to PIPE_BUF atomically, so a dropped line leaves no half behind; a
/// longer one may be cut if the reader is slow, and its remainder is dropped.
pub fn write_line(file: &mut File, line: &[u8]) -> bool {
    let mut rest = line;
    while !rest.is_empty() {
        match file.write(rest) {
            Ok(0) => return false,
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo(name: &str) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("exitless-sink-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        path
    }

    #[test]
    fn a_fifo_without_a_reader_neither_blocks_nor_stalls_and_drops_what_does_not_fit() {
        let path = fifo("full");
        // No reader: a plain write-only open would block here forever.
        let mut file = open(path.to_str().unwrap()).unwrap();
        let line = [b'x'; 1000];
        let (mut written, mut dropped) = (0, 0);
        let started = std::time::Instant::now();
        for _ in 0..200 {
            match write_line(&mut file, &line) {
                true => written += 1,
                false => dropped += 1,
            }
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // A pipe holds 64 KiB by default: some lines went in, the rest were dropped.
        assert!(written >= 16 && dropped > 0, "{written} written, {dropped} dropped");
        // A reader that comes later finds whole lines.
        let mut reader = std::fs::File::open(&path).unwrap();
        let mut first = [0u8; 1000];
        std::io::Read::read_exact(&mut reader, &mut first).unwrap();
        assert_eq!(first, line);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_regular_file_is_created_and_appended_to() {
        let path = std::env::temp_dir().join(format!("exitless-sink-{}-file", std::process::id()));
        std::fs::write(&path, "old\n").unwrap();
        assert!(write_line(&mut open(path.to_str().unwrap()).unwrap(), b"new\n"));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\nnew\n");
        std::fs::remove_file(&path).unwrap();
    }
}
