//! A virtio device's thread, written once: made with the device (before any vCPU runs,
//! so a vCPU never creates a thread), confined to its seccomp filter once, and then
//! running one job per activation, each with a stop eventfd for its epoll set. Activation
//! on the vCPU that set DRIVER_OK only hands the job over (a channel send, no clone);
//! a reset stops the job and takes it back. A snapshot pauses the job (it is handed back
//! and kept, its queues' positions read) and resumes the same job afterwards.

use super::ActivateError;
use crate::seccomp::ThreadKind;
use serde::{Deserialize, Serialize};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use vmm_sys_util::eventfd::EventFd;

/// Where a queue stands: the next avail entry the device will take, the next used entry
/// it will fill. With the driver's registers, all a queue is between two activations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuePosition {
    pub next_avail: u16,
    pub next_used: u16,
}

impl QueuePosition {
    pub fn of(queue: &virtio_queue::Queue) -> QueuePosition {
        use virtio_queue::QueueT;
        QueuePosition { next_avail: queue.next_avail(), next_used: queue.next_used() }
    }
}

/// What a device thread runs per activation.
pub trait DeviceJob: Send + 'static {
    /// Serves the device until `stop` is readable.
    fn run(&mut self, stop: &EventFd);
    /// Each queue's position (read while the job is paused, so they hold still).
    fn positions(&self) -> Vec<QueuePosition>;
}

type Job<W> = Box<dyn FnOnce(&EventFd) -> W + Send>;

pub struct DeviceThread<W: DeviceJob> {
    name: &'static str,
    jobs: Option<Sender<Job<W>>>,
    results: Receiver<W>,
    stop: EventFd,
    running: bool,
    /// The job a snapshot paused, until it resumes (or a reset drops it).
    paused: Option<W>,
    thread: Option<JoinHandle<()>>,
}

impl<W: DeviceJob> DeviceThread<W> {
    /// Starts the thread `name`, confined to `kind`, idle until [`DeviceThread::start`].
    pub fn spawn(name: &'static str, kind: ThreadKind) -> std::io::Result<Self> {
        let stop = EventFd::new(libc::EFD_NONBLOCK)?;
        let job_stop = stop.try_clone()?;
        let (jobs, next) = channel::<Job<W>>();
        let (done, results) = channel();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            if let Err(e) = crate::seccomp::confine(kind) {
                return tracing::error!("{name}: not running its thread unconfined: {e}");
            }
            while let Ok(job) = next.recv() {
                if done.send(job(&job_stop)).is_err() {
                    return;
                }
            }
        })?;
        Ok(DeviceThread { name, jobs: Some(jobs), results, stop, running: false, paused: None, thread: Some(thread) })
    }

    /// Runs `job` on the thread (after stopping the one running or paused, if any).
    pub fn start(&mut self, job: W) -> Result<(), ActivateError> {
        self.stop();
        self.run(job)
    }

    fn run(&mut self, mut job: W) -> Result<(), ActivateError> {
        let gone = || ActivateError::Thread(std::io::Error::other(format!("the {} thread has ended", self.name)));
        let job: Job<W> = Box::new(move |stop| {
            job.run(stop);
            job
        });
        self.jobs.as_ref().ok_or_else(gone)?.send(job).map_err(|_| gone())?;
        self.running = true;
        Ok(())
    }

    /// Stops the running job (or forgets the paused one) and returns it (None if none ran,
    /// or the thread ended).
    pub fn stop(&mut self) -> Option<W> {
        self.take_running().or_else(|| self.paused.take())
    }

    fn take_running(&mut self) -> Option<W> {
        if !std::mem::take(&mut self.running) {
            return None;
        }
        let _ = self.stop.write(1);
        let result = self.results.recv().ok();
        // A job may end without reading its stop: the next one must not see it.
        let _ = self.stop.read();
        result
    }

    /// Stops the running job and keeps it for [`DeviceThread::resume`]: its queues'
    /// positions, or None if no job runs.
    pub fn pause(&mut self) -> Option<Vec<QueuePosition>> {
        let job = self.take_running()?;
        let positions = job.positions();
        self.paused = Some(job);
        Some(positions)
    }

    /// Runs the paused job again, where it stopped (nothing if none is paused).
    pub fn resume(&mut self) -> Result<(), ActivateError> {
        match self.paused.take() {
            Some(job) => self.run(job),
            None => Ok(()),
        }
    }
}

impl<W: DeviceJob> Drop for DeviceThread<W> {
    fn drop(&mut self) {
        self.stop();
        // Closing the channel ends the thread's wait for the next job.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts its runs; its position says how many.
    struct Counting(u16);

    impl DeviceJob for Counting {
        fn run(&mut self, stop: &EventFd) {
            self.0 += 1;
            while stop.read().is_err() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }

        fn positions(&self) -> Vec<QueuePosition> {
            vec![QueuePosition { next_avail: self.0, next_used: 0 }]
        }
    }

    #[test]
    fn jobs_run_one_at_a_time_stop_on_request_and_resume_where_they_paused() {
        let mut thread = DeviceThread::<Counting>::spawn("test-device", ThreadKind::Device).unwrap();
        assert!(thread.stop().is_none(), "nothing ran");
        assert!(thread.pause().is_none(), "nothing to pause");
        for _ in 0..3 {
            thread.start(Counting(0)).unwrap();
            assert_eq!(thread.stop().map(|c| c.0), Some(1), "the job itself, after its stop");
        }
        // A job started while another runs stops that one first.
        thread.start(Counting(10)).unwrap();
        thread.start(Counting(20)).unwrap();
        assert_eq!(thread.pause().unwrap()[0].next_avail, 21, "paused after one run");
        thread.resume().unwrap();
        thread.resume().unwrap(); // running already: nothing to resume
        assert_eq!(thread.pause().unwrap()[0].next_avail, 22, "the same job ran again");
        assert_eq!(thread.stop().map(|c| c.0), Some(22), "a reset takes the paused job");
        assert!(thread.stop().is_none());
    }
}
