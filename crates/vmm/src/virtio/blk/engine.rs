//! How block requests reach the file: io_uring where the kernel offers it (every request
//! in flight at once, completions announced on an eventfd the device thread waits on),
//! else plain preadv/pwritev/fdatasync made one at a time by the device thread. The lab's
//! host path uses the same engine, so guest and host are compared on equal terms.
//!
//! Data moves between the file and the iovecs the caller gives, which point into guest
//! memory: there is no bounce buffer.

use io_uring::{opcode, squeue, types, IoUring};
use std::os::fd::{AsRawFd, RawFd};
use vmm_sys_util::eventfd::EventFd;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read {
        offset: u64,
    },
    Write {
        offset: u64,
    },
    /// fdatasync, started only once every operation pushed before it has completed.
    Flush,
}

/// A finished operation: the tag it was pushed with, and the syscall's result (bytes
/// moved, or a negative errno).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub tag: u64,
    pub result: i64,
}

pub enum Engine {
    Uring { ring: Box<IoUring>, done: EventFd, inflight: usize },
    Sync { done: Vec<Completion> },
}

impl Engine {
    /// io_uring with room for `depth` operations, or the synchronous engine where the
    /// kernel has no io_uring (or forbids it).
    pub fn new(depth: u32) -> Engine {
        match Self::uring(depth) {
            Ok(engine) => engine,
            Err(e) => {
                tracing::warn!("io_uring unavailable ({e}): block I/O runs one request at a time");
                Engine::Sync { done: Vec::new() }
            }
        }
    }

    fn uring(depth: u32) -> std::io::Result<Engine> {
        let ring = IoUring::new(depth.next_power_of_two())?;
        let done = EventFd::new(libc::EFD_NONBLOCK)?;
        ring.submitter().register_eventfd(done.as_raw_fd())?;
        Ok(Engine::Uring { ring: Box::new(ring), done, inflight: 0 })
    }

    /// The synchronous engine, even where io_uring exists (tests of the fallback).
    pub fn synchronous() -> Engine {
        Engine::Sync { done: Vec::new() }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Engine::Uring { .. } => "io_uring",
            Engine::Sync { .. } => "sync",
        }
    }

    /// The eventfd that becomes readable when operations complete (io_uring only: the
    /// synchronous engine's operations have completed when `push` returns).
    pub fn eventfd(&self) -> Option<&EventFd> {
        match self {
            Engine::Uring { done, .. } => Some(done),
            Engine::Sync { .. } => None,
        }
    }

    /// Operations pushed and not yet reaped.
    pub fn inflight(&self) -> usize {
        match self {
            Engine::Uring { inflight, .. } => *inflight,
            Engine::Sync { done } => done.len(),
        }
    }

    /// Queues `op` on `fd` over the `iovcnt` iovecs at `iov`; it completes with `tag`.
    /// Returns false when the submission queue is full even after submitting.
    ///
    /// # Safety
    /// The iovecs, and the memory they point to, must stay valid and untouched by anyone
    /// else until the operation's completion has been reaped.
    pub unsafe fn push(&mut self, tag: u64, fd: RawFd, op: Op, iov: *const libc::iovec, iovcnt: usize) -> bool {
        match self {
            Engine::Uring { ring, inflight, .. } => {
                let fd = types::Fd(fd);
                let entry = match op {
                    Op::Read { offset } => opcode::Readv::new(fd, iov, iovcnt as u32).offset(offset).build(),
                    Op::Write { offset } => opcode::Writev::new(fd, iov, iovcnt as u32).offset(offset).build(),
                    Op::Flush => {
                        opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build().flags(squeue::Flags::IO_DRAIN)
                    }
                };
                let entry = entry.user_data(tag);
                // SAFETY: the caller keeps the iovecs and their buffers valid until completion.
                if unsafe { ring.submission().push(&entry) }.is_err() {
                    let _ = ring.submit();
                    // SAFETY: as above.
                    if unsafe { ring.submission().push(&entry) }.is_err() {
                        return false;
                    }
                }
                *inflight += 1;
                true
            }
            Engine::Sync { done } => {
                // SAFETY: the caller guarantees the iovecs are valid for this call.
                let r = unsafe {
                    match op {
                        Op::Read { offset } => libc::preadv(fd, iov, iovcnt as i32, offset as i64) as i64,
                        Op::Write { offset } => libc::pwritev(fd, iov, iovcnt as i32, offset as i64) as i64,
                        Op::Flush => libc::fdatasync(fd) as i64,
                    }
                };
                let result =
                    if r < 0 { -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(5)) } else { r };
                done.push(Completion { tag, result });
                true
            }
        }
    }

    /// Hands what was pushed to the kernel (no system call when nothing was: the device
    /// thread calls this after every kick and completion batch).
    pub fn submit(&mut self) {
        if let Engine::Uring { ring, .. } = self {
            if ring.submission().is_empty() {
                return;
            }
            if let Err(e) = ring.submit() {
                tracing::warn!("io_uring submit failed: {e}");
            }
        }
    }

    /// Moves finished operations into `out`.
    pub fn reap(&mut self, out: &mut Vec<Completion>) {
        match self {
            Engine::Uring { ring, done, inflight } => {
                let _ = done.read();
                for cqe in ring.completion() {
                    *inflight -= 1;
                    out.push(Completion { tag: cqe.user_data(), result: i64::from(cqe.result()) });
                }
            }
            Engine::Sync { done } => out.append(done),
        }
    }

    /// Blocks until at least one pushed operation has completed (if any is in flight).
    pub fn wait(&mut self) {
        if let Engine::Uring { ring, inflight, .. } = self {
            if *inflight > 0 && ring.completion().is_empty() {
                let _ = ring.submit_and_wait(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn each_engine(check: impl Fn(Engine)) {
        check(Engine::new(8));
        check(Engine::synchronous());
    }

    #[test]
    fn reads_writes_and_flushes_reach_the_file() {
        each_engine(|mut engine| {
            let mut file = vmm_sys_util::tempfile::TempFile::new().unwrap().into_file();
            file.write_all(&[7u8; 8192]).unwrap();
            let fd = file.as_raw_fd();
            let data = [0xabu8; 512];
            let mut back = [0u8; 1024];
            let w = [libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: 512 }];
            let r = [libc::iovec { iov_base: back.as_mut_ptr().cast(), iov_len: 1024 }];
            // SAFETY: the buffers outlive every operation: all are reaped below.
            unsafe {
                assert!(engine.push(1, fd, Op::Write { offset: 4096 }, w.as_ptr(), 1));
                assert!(engine.push(2, fd, Op::Flush, std::ptr::null(), 0));
            }
            engine.submit();
            let mut done = Vec::new();
            while done.len() < 2 {
                engine.wait();
                engine.reap(&mut done);
            }
            // SAFETY: as above.
            unsafe { assert!(engine.push(3, fd, Op::Read { offset: 4096 - 512 }, r.as_ptr(), 1)) };
            engine.submit();
            while done.len() < 3 {
                engine.wait();
                engine.reap(&mut done);
            }
            done.sort_by_key(|c| c.tag);
            let results: Vec<_> = done.iter().map(|c| (c.tag, c.result)).collect();
            assert_eq!(results, [(1, 512), (2, 0), (3, 1024)], "{}", engine.name());
            assert_eq!(&back[..512], &[7u8; 512]);
            assert_eq!(&back[512..], &[0xabu8; 512]);
            assert_eq!(engine.inflight(), 0);
        });
    }
}
