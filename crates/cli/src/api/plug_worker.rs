//! The hotplug worker: a thread started before the API thread confines itself, on which
//! devices are plugged into and out of the running machine (api/devices/plug.rs): a
//! device opens files, registers KVM objects and starts a thread, which the API's
//! seccomp filter does not allow (the worker's kind, `Hotplug`, does).

use std::sync::mpsc::{channel, Sender};

type Job = Box<dyn FnOnce() + Send>;

/// Runs one job at a time, on a thread of its own.
pub struct Worker(Sender<Job>);

impl Worker {
    /// Starts the worker (before the calling thread confines itself).
    pub fn start() -> std::io::Result<Worker> {
        let (jobs, next) = channel::<Job>();
        std::thread::Builder::new().name("api-hotplug".into()).spawn(move || {
            if !exitless_vmm::seccomp::confine_or_log(exitless_vmm::seccomp::ThreadKind::Hotplug) {
                return;
            }
            while let Ok(job) = next.recv() {
                job();
            }
        })?;
        Ok(Worker(jobs))
    }

    /// Runs `job` on the worker and waits for its result.
    pub fn run<R: Send + 'static>(&self, job: impl FnOnce() -> R + Send + 'static) -> Result<R, String> {
        let (done, result) = channel();
        let job: Job = Box::new(move || {
            let _ = done.send(job());
        });
        self.0.send(job).map_err(|_| "The hotplug worker is not running.".to_string())?;
        result.recv().map_err(|_| "The hotplug worker stopped.".to_string())
    }
}
