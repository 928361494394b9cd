//! `PUT /serial` (Firecracker v1.16): where the guest's console goes, and how fast. A path
//! takes the console's output (and then nothing is read from stdin, as in Firecracker); a
//! token bucket of bytes drops what writes beyond it, counted in
//! `uart.rate_limiter_dropped_bytes`.

use super::model::Serial;
use exitless_vmm::rate_limiter::{Limits, RateLimiter};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes the serial's rate limiter dropped, for the metrics.
pub static DROPPED_BYTES: AtomicU64 = AtomicU64::new(0);

/// Where the console writes, and what it reads (None: nothing).
pub type Console = (Box<dyn Write + Send>, Option<Box<dyn Read + Send>>);

/// The console's output and input for a microVM configured with `serial` (None: stdout and
/// the terminal, as before any `PUT /serial`).
pub fn console(serial: Option<&Serial>) -> Result<Console, String> {
    let limiter = serial
        .and_then(|s| s.rate_limiter.as_ref())
        .map(|b| RateLimiter::new(Limits { bandwidth: Some(b.bucket()), ops: None }));
    let limiter = limiter.filter(RateLimiter::limits);
    match serial.and_then(|s| s.serial_out_path.as_deref()) {
        Some(path) => {
            // As Firecracker opens it: a FIFO with no reader yet neither blocks nor fails
            // (read and write), and a full one drops rather than stops the console.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(path)
                .map_err(|e| format!("Cannot open the serial output {path}: {e}"))?;
            Ok((Box::new(Limited { out: file, limiter }), None))
        }
        None => Ok((Box::new(Limited { out: crate::LiveStdout, limiter }), crate::terminal::console_input())),
    }
}

/// A writer held to a bandwidth: a write the bucket cannot pay for is dropped whole.
struct Limited<W> {
    out: W,
    limiter: Option<RateLimiter>,
}

impl<W: Write> Write for Limited<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let len = buf.len() as u64;
        if let Some(limiter) = &mut self.limiter {
            if limiter.consume(0, len).is_err() {
                DROPPED_BYTES.fetch_add(len, Ordering::Relaxed);
                return Ok(buf.len());
            }
        }
        self.out.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::model::TokenBucket;

    #[test]
    fn a_file_takes_the_console_and_the_bucket_drops_what_is_beyond_it() {
        let dir = std::env::temp_dir().join(format!("exitless-serial-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out");
        let serial = Serial {
            serial_out_path: Some(path.to_string_lossy().into_owned()),
            rate_limiter: Some(TokenBucket { size: 100, one_time_burst: None, refill_time: 60_000 }),
        };
        let (mut out, input) = console(Some(&serial)).unwrap();
        assert!(input.is_none(), "with a path the console reads nothing");
        let before = DROPPED_BYTES.load(Ordering::Relaxed);
        out.write_all(&[b'a'; 60]).unwrap();
        out.write_all(&[b'b'; 60]).unwrap(); // 120 > 100: dropped whole
        out.write_all(&[b'c'; 40]).unwrap();
        out.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{}{}", "a".repeat(60), "c".repeat(40)));
        assert_eq!(DROPPED_BYTES.load(Ordering::Relaxed) - before, 60);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_path_that_cannot_be_opened_is_one_clear_fault() {
        let serial = Serial { serial_out_path: Some("/nonexistent/dir/out".into()), rate_limiter: None };
        let Err(why) = console(Some(&serial)) else { panic!("opened") };
        assert!(why.contains("/nonexistent/dir/out") && !why.contains('\n'), "{why}");
    }
}
