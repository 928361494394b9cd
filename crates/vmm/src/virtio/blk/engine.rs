//! How block requests reach the file: io_uring where the kernel offers it, else a small
//! pool of threads making preadv/pwritev/fdatasync. Either way many requests are in flight
//! at once and completions are announced on an eventfd the device thread waits on. The
//! lab's host path uses the same engine, so guest and host are compared on equal terms.
//!
//! Data moves between the file and the iovecs the caller gives, which point into guest
//! memory: there is no bounce buffer.

use io_uring::{opcode, squeue, types, IoUring};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use vmm_sys_util::eventfd::EventFd;

/// Threads of the fallback pool: enough to keep a disk's queue busy, few enough to cost
/// nothing while idle.
pub const POOL_THREADS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read {
        offset: u64,
    },
    Write {
        offset: u64,
    },
    /// fdatasync, started only once every operation pushed before it has completed (and
    /// none pushed after it starts before it completes).
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
    Pool(Pool),
}

impl Engine {
    /// io_uring with room for `depth` operations, or the thread pool where the kernel has
    /// no io_uring (or forbids it).
    pub fn new(depth: u32) -> Engine {
        match Self::uring(depth) {
            Ok(engine) => engine,
            Err(e) => {
                tracing::warn!("io_uring unavailable ({e}): block I/O goes through {POOL_THREADS} threads");
                Self::pool(POOL_THREADS)
            }
        }
    }

    fn uring(depth: u32) -> std::io::Result<Engine> {
        let ring = IoUring::new(depth.next_power_of_two())?;
        let done = EventFd::new(libc::EFD_NONBLOCK)?;
        ring.submitter().register_eventfd(done.as_raw_fd())?;
        Ok(Engine::Uring { ring: Box::new(ring), done, inflight: 0 })
    }

    /// The thread pool, even where io_uring exists (tests of the fallback). Its threads
    /// start now, so a caller that is not confined yet makes them unconfined: each
    /// confines itself to the block thread's filter first.
    pub fn pool(threads: usize) -> Engine {
        Engine::Pool(Pool::new(threads))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Engine::Uring { .. } => "io_uring",
            Engine::Pool(_) => "thread pool",
        }
    }

    /// The eventfd that becomes readable when operations complete.
    pub fn eventfd(&self) -> &EventFd {
        match self {
            Engine::Uring { done, .. } => done,
            Engine::Pool(pool) => &pool.done_fd,
        }
    }

    /// Operations pushed and not yet reaped.
    pub fn inflight(&self) -> usize {
        match self {
            Engine::Uring { inflight, .. } => *inflight,
            Engine::Pool(pool) => pool.inflight,
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
            Engine::Pool(pool) => {
                pool.push(Job { tag, fd, op, iov, iovcnt });
                true
            }
        }
    }

    /// Hands what was pushed to the kernel (no system call when nothing was: the device
    /// thread calls this after every kick and completion batch). The pool's threads take
    /// work as it is pushed.
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
            Engine::Pool(pool) => pool.reap(out),
        }
    }

    /// Blocks until at least one pushed operation has completed (if any is in flight).
    pub fn wait(&mut self) {
        match self {
            Engine::Uring { ring, inflight, .. } => {
                if *inflight > 0 && ring.completion().is_empty() {
                    let _ = ring.submit_and_wait(1);
                }
            }
            Engine::Pool(pool) => pool.wait(),
        }
    }
}

/// One operation for the pool, with the caller's iovecs.
struct Job {
    tag: u64,
    fd: RawFd,
    op: Op,
    iov: *const libc::iovec,
    iovcnt: usize,
}

// SAFETY: the iovecs a job points to stay valid until its completion is reaped (the
// contract of `Engine::push`), so a pool thread may use them.
unsafe impl Send for Job {}

#[derive(Default)]
struct PoolState {
    queue: VecDeque<Job>,
    /// Jobs a thread is running.
    running: usize,
    /// A Flush is running: nothing else starts until it completes.
    draining: bool,
    done: Vec<Completion>,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<PoolState>,
    /// Work arrived, or a job finished (which may let a Flush or what follows it start).
    work: Condvar,
    /// A completion arrived (for `wait`).
    finished: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        crate::sync::lock(&self.state)
    }
}

/// io_uring's stand-in: threads taking operations in order, with IO_DRAIN's rule for a
/// Flush (it starts when all before it have completed; none after it starts before it
/// completes).
pub struct Pool {
    shared: Arc<Shared>,
    done_fd: EventFd,
    inflight: usize,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared::default());
        let done_fd = EventFd::new(libc::EFD_NONBLOCK).expect("an eventfd for block completions");
        let threads = (0..threads.max(1))
            .filter_map(|i| {
                let (shared, done_fd) = (shared.clone(), done_fd.try_clone().ok()?);
                let thread = std::thread::Builder::new().name(format!("blk-io{i}"));
                thread.spawn(move || Self::serve(&shared, &done_fd)).ok()
            })
            .collect();
        Pool { shared, done_fd, inflight: 0, threads }
    }

    fn serve(shared: &Shared, done_fd: &EventFd) {
        if !crate::seccomp::confine_or_log(crate::seccomp::ThreadKind::Block) {
            return;
        }
        let mut state = shared.lock();
        loop {
            let startable = match state.queue.front() {
                Some(job) => !state.draining && (job.op != Op::Flush || state.running == 0),
                None => false,
            };
            if !startable {
                if state.stop && state.queue.is_empty() {
                    return;
                }
                state = shared.work.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let Some(job) = state.queue.pop_front() else { continue };
            state.running += 1;
            state.draining = job.op == Op::Flush;
            drop(state);
            // SAFETY: `push`'s caller keeps the iovecs valid until the completion is reaped.
            let result = unsafe { run(&job) };
            state = shared.lock();
            state.running -= 1;
            state.draining = false;
            state.done.push(Completion { tag: job.tag, result });
            let _ = done_fd.write(1);
            shared.work.notify_all();
            shared.finished.notify_all();
        }
    }

    fn push(&mut self, job: Job) {
        if self.threads.is_empty() {
            // No thread could start: run it here rather than never.
            // SAFETY: `push`'s caller keeps the iovecs valid until the completion is reaped.
            let result = unsafe { run(&job) };
            self.shared.lock().done.push(Completion { tag: job.tag, result });
            self.inflight += 1;
            let _ = self.done_fd.write(1);
            return;
        }
        self.shared.lock().queue.push_back(job);
        self.inflight += 1;
        self.shared.work.notify_one();
    }

    fn reap(&mut self, out: &mut Vec<Completion>) {
        let _ = self.done_fd.read();
        let mut state = self.shared.lock();
        self.inflight -= state.done.len();
        out.append(&mut state.done);
    }

    fn wait(&mut self) {
        let mut state = self.shared.lock();
        while self.inflight > 0 && state.done.is_empty() && !self.threads.is_empty() {
            state = self.shared.finished.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// One operation, as a system call; the result as io_uring reports it.
///
/// # Safety
/// The job's iovecs must be valid.
unsafe fn run(job: &Job) -> i64 {
    // SAFETY: the caller guarantees the iovecs are valid for this call.
    let r = unsafe {
        match job.op {
            Op::Read { offset } => libc::preadv(job.fd, job.iov, job.iovcnt as i32, offset as i64) as i64,
            Op::Write { offset } => libc::pwritev(job.fd, job.iov, job.iovcnt as i32, offset as i64) as i64,
            Op::Flush => i64::from(libc::fdatasync(job.fd)),
        }
    };
    if r < 0 {
        -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn each_engine(check: impl Fn(Engine)) {
        check(Engine::new(8));
        check(Engine::pool(2));
    }

    #[test]
    fn a_flush_completes_after_everything_before_it_and_before_everything_after() {
        each_engine(|mut engine| {
            let file = vmm_sys_util::tempfile::TempFile::new().unwrap().into_file();
            let fd = file.as_raw_fd();
            let data = vec![0x5au8; 64 << 10];
            let iov = [libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: data.len() }];
            for round in 0..20u64 {
                // Tags 0-3 before the flush (tag 4), 5-8 after it.
                for tag in 0..9u64 {
                    let op = if tag == 4 { Op::Flush } else { Op::Write { offset: (round * 9 + tag) << 16 } };
                    // SAFETY: `data` outlives every operation: all are reaped below.
                    assert!(unsafe { engine.push(tag, fd, op, iov.as_ptr(), usize::from(tag != 4)) });
                }
                engine.submit();
                let mut done = Vec::new();
                while done.len() < 9 {
                    engine.wait();
                    engine.reap(&mut done);
                }
                let at = |tag| done.iter().position(|c| c.tag == tag).unwrap();
                assert!((0..4).all(|t| at(t) < at(4)) && (5..9).all(|t| at(t) > at(4)), "{}: {done:?}", engine.name());
                assert!(done.iter().all(|c| c.result == if c.tag == 4 { 0 } else { 64 << 10 }), "{done:?}");
            }
        });
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
