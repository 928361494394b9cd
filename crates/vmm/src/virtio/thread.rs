//! A virtio device's thread, written once: made with the device (before any vCPU runs,
//! so a vCPU never creates a thread), confined to its seccomp filter once, and then
//! running one job per activation, each with a stop eventfd for its epoll set. Activation
//! on the vCPU that set DRIVER_OK only hands the job over (a channel send, no clone);
//! a reset stops the job and takes back what it returns.

use super::ActivateError;
use crate::seccomp::ThreadKind;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use vmm_sys_util::eventfd::EventFd;

/// What the thread runs per activation: until `stop` is readable, handing back `R`.
pub type Job<R> = Box<dyn FnOnce(&EventFd) -> R + Send>;

pub struct DeviceThread<R: Send + 'static> {
    name: &'static str,
    jobs: Option<Sender<Job<R>>>,
    results: Receiver<R>,
    stop: EventFd,
    running: bool,
    thread: Option<JoinHandle<()>>,
}

impl<R: Send + 'static> DeviceThread<R> {
    /// Starts the thread `name`, confined to `kind`, idle until [`DeviceThread::start`].
    pub fn spawn(name: &'static str, kind: ThreadKind) -> std::io::Result<Self> {
        let stop = EventFd::new(libc::EFD_NONBLOCK)?;
        let job_stop = stop.try_clone()?;
        let (jobs, next) = channel::<Job<R>>();
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
        Ok(DeviceThread { name, jobs: Some(jobs), results, stop, running: false, thread: Some(thread) })
    }

    /// Runs `job` on the thread (after stopping the one running, if any).
    pub fn start(&mut self, job: Job<R>) -> Result<(), ActivateError> {
        self.stop();
        let gone = || ActivateError::Thread(std::io::Error::other(format!("the {} thread has ended", self.name)));
        self.jobs.as_ref().ok_or_else(gone)?.send(job).map_err(|_| gone())?;
        self.running = true;
        Ok(())
    }

    /// Stops the running job and returns what it handed back (None if none ran, or the
    /// thread ended).
    pub fn stop(&mut self) -> Option<R> {
        if !std::mem::take(&mut self.running) {
            return None;
        }
        let _ = self.stop.write(1);
        let result = self.results.recv().ok();
        // A job may end without reading its stop: the next one must not see it.
        let _ = self.stop.read();
        result
    }
}

impl<R: Send + 'static> Drop for DeviceThread<R> {
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

    #[test]
    fn jobs_run_one_at_a_time_and_stop_on_request() {
        let mut thread = DeviceThread::<u32>::spawn("test-device", ThreadKind::Device).unwrap();
        assert_eq!(thread.stop(), None, "nothing ran");
        for round in 0..3 {
            thread
                .start(Box::new(move |stop| {
                    while stop.read().is_err() {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    round
                }))
                .unwrap();
            assert_eq!(thread.stop(), Some(round), "the job's own result, after its stop");
        }
        // A job started while another runs stops that one first.
        thread.start(Box::new(|_| 7)).unwrap();
        thread.start(Box::new(|_| 8)).unwrap();
        assert_eq!(thread.stop(), Some(8));
    }
}
