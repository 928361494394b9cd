//! Console output off the vCPU thread: the UART appends to a bounded buffer (no syscall,
//! no flush under the UART lock) and a thread of its own writes it out. A consumer that
//! stops reading fills the buffer; after that bytes are dropped and counted, so the guest
//! never waits on the host's stdout. Output goes out a line at a time (one write(2) per
//! line, as Firecracker's): a partial line waits at most [`PARTIAL_LINE_WAIT`] (the
//! serial port's; [`ConsoleOut::spawn`] takes it), and a drain writes everything, so the
//! last bytes of a crashing guest are not lost.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bytes held for a slow consumer before output is dropped.
const CAPACITY: usize = 1 << 20;
/// How long a line without its newline waits for the rest before it is written anyway.
pub const PARTIAL_LINE_WAIT: Duration = Duration::from_millis(20);
/// Queued bytes written without waiting for a newline.
const BATCH: usize = 4096;

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    /// The writer thread holds a batch it took out of `bytes`.
    writing: bool,
    /// A line ended, a batch filled or a drain asked: write without waiting.
    urgent: bool,
    closed: bool,
    dropped: u64,
}

#[derive(Default)]
struct Queue {
    pending: Mutex<Pending>,
    /// Signalled when bytes arrive or the queue closes.
    ready: Condvar,
    /// Signalled when the writer finished a batch.
    written: Condvar,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        crate::sync::lock(&self.pending)
    }
}

/// The UART's end: a `Write` that only queues. Dropping it lets the writer thread finish
/// what is queued and exit.
pub struct ConsoleOut {
    queue: Arc<Queue>,
}

impl ConsoleOut {
    /// Starts the thread that writes to `out`, where a line without its newline waits
    /// `partial_line_wait` for the rest.
    pub fn spawn(mut out: Box<dyn Write + Send>, partial_line_wait: Duration) -> std::io::Result<ConsoleOut> {
        let queue = Arc::new(Queue::default());
        let q = queue.clone();
        std::thread::Builder::new().name("console-out".into()).spawn(move || {
            if let Err(e) = crate::seccomp::confine(crate::seccomp::ThreadKind::ConsoleOut) {
                // Output is lost rather than written by an unconfined thread.
                return tracing::error!("console output off: {e}");
            }
            loop {
                let batch = {
                    let mut p = q.lock();
                    while !p.urgent && !p.closed {
                        if p.bytes.is_empty() {
                            p = q.ready.wait(p).unwrap_or_else(|e| e.into_inner());
                            continue;
                        }
                        // A partial line: the rest, a newline or the timeout, whichever first.
                        let (guard, waited) =
                            q.ready.wait_timeout(p, partial_line_wait).unwrap_or_else(|e| e.into_inner());
                        p = guard;
                        if waited.timed_out() {
                            break;
                        }
                    }
                    p.urgent = false;
                    if p.bytes.is_empty() {
                        if p.closed {
                            return;
                        }
                        continue;
                    }
                    p.writing = true;
                    std::mem::take(&mut p.bytes)
                };
                // A consumer that went away (closed pipe) just loses the output.
                let _ = out.write_all(&batch).and_then(|()| out.flush());
                q.lock().writing = false;
                q.written.notify_all();
            }
        })?;
        Ok(ConsoleOut { queue })
    }

    /// Waits up to `timeout` for everything queued so far to be written; false if it was not.
    pub fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut p = self.queue.lock();
        p.urgent = true;
        self.queue.ready.notify_one();
        while !p.bytes.is_empty() || p.writing {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            p = self.queue.written.wait_timeout(p, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }

    /// Bytes dropped because the consumer did not keep up.
    pub fn dropped(&self) -> u64 {
        self.queue.lock().dropped
    }
}

impl Write for ConsoleOut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut p = self.queue.lock();
        let room = CAPACITY.saturating_sub(p.bytes.len()).min(buf.len());
        if room < buf.len() {
            if p.dropped == 0 {
                tracing::warn!("console output is not being read; dropping what does not fit in {CAPACITY} bytes");
            }
            p.dropped += (buf.len() - room) as u64;
        }
        let first = p.bytes.is_empty();
        p.bytes.extend_from_slice(&buf[..room]);
        if buf[..room].contains(&b'\n') || p.bytes.len() >= BATCH {
            p.urgent = true;
        } else if !first {
            // The writer already waits out this partial line.
            return Ok(buf.len());
        }
        drop(p);
        self.queue.ready.notify_one();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(()) // the writer thread flushes after each batch
    }
}

impl Drop for ConsoleOut {
    fn drop(&mut self) {
        self.queue.lock().closed = true;
        self.queue.ready.notify_all();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::mpsc;

    /// What was written, and in how many writes.
    #[derive(Clone, Default)]
    pub struct Sink(pub Arc<Mutex<Vec<u8>>>, pub Arc<Mutex<u32>>);
    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            *self.1.lock().unwrap() += 1;
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A consumer that never returns from its first write.
    struct Stuck(mpsc::Receiver<()>);
    impl Write for Stuck {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            let _ = self.0.recv();
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        /// Waits until the sink holds `want` (or 30 s pass); how many writes brought it.
        pub fn wait_for(&self, want: &[u8]) -> u32 {
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.0.lock().unwrap().as_slice() != want && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(self.0.lock().unwrap().as_slice(), want);
            *self.1.lock().unwrap()
        }
    }

    #[test]
    fn a_line_is_one_write_and_a_partial_line_still_arrives() {
        // A partial line waits far longer than any preemption: the line's bytes, written one
        // at a time, go out together whenever the writer thread runs.
        let sink = Sink::default();
        let mut out = ConsoleOut::spawn(Box::new(sink.clone()), Duration::from_secs(3600)).unwrap();
        for &b in b"booting...\n" {
            out.write_all(&[b]).unwrap();
        }
        assert_eq!(sink.wait_for(b"booting...\n"), 1, "eleven bytes, one write");
        // A drain does not wait for the newline.
        out.write_all(b"drained").unwrap();
        assert!(out.drain(Duration::from_secs(30)));
        assert_eq!(sink.wait_for(b"booting...\ndrained"), 2, "one write per line, one for the drain");
        // With the serial port's wait, a partial line arrives without a drain.
        let sink = Sink::default();
        let mut out = ConsoleOut::spawn(Box::new(sink.clone()), PARTIAL_LINE_WAIT).unwrap();
        out.write_all(b"no newline yet").unwrap();
        assert_eq!(sink.wait_for(b"no newline yet"), 1, "the partial line in one write");
    }

    #[test]
    fn everything_written_arrives_in_order_after_drain() {
        let sink = Sink::default();
        let mut out = ConsoleOut::spawn(Box::new(sink.clone()), PARTIAL_LINE_WAIT).unwrap();
        let text: Vec<u8> = (0..100_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        for chunk in text.chunks(7) {
            out.write_all(chunk).unwrap();
        }
        assert!(out.drain(Duration::from_secs(10)));
        assert_eq!(*sink.0.lock().unwrap(), text);
        assert_eq!(out.dropped(), 0);
    }

    #[test]
    fn a_consumer_that_stops_reading_does_not_stop_the_writer() {
        let (unblock, stuck) = mpsc::channel();
        let mut out = ConsoleOut::spawn(Box::new(Stuck(stuck)), PARTIAL_LINE_WAIT).unwrap();
        let (done, finished) = mpsc::channel();
        let guest = std::thread::spawn(move || {
            for _ in 0..3 * CAPACITY / 4096 {
                out.write_all(&[b'x'; 4096]).unwrap();
            }
            done.send(out.dropped()).unwrap();
            out
        });
        let dropped = finished.recv_timeout(Duration::from_secs(30)).expect("the guest's writes blocked");
        assert!(dropped >= CAPACITY as u64, "{dropped} bytes dropped");
        unblock.send(()).unwrap();
        drop(guest.join().unwrap());
    }
}
