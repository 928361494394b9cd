//! One thread per vCPU, and stopping them all: when one vCPU ends (the guest stopped, or
//! it failed) or the time is up, the stop flag is raised and every thread still inside
//! `KVM_RUN` is kicked with a signal (once: the handler sets `immediate_exit`). With sampling on, the same kick,
//! sent at a steady rate without the stop flag, makes each vCPU note where the guest was.

use crate::host::HostProfile;
use crate::run_control::kick::{install_kick_handler, kick_signal};
use crate::run_control::RunControl;
use crate::seccomp::ThreadKind;
use crate::stats::ExitStats;
use crate::vcpu::samples::GuestSamples;
use crate::vcpu::{Vcpu, VcpuError};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One kick stops a vCPU (its handler sets `immediate_exit`); a thread still running this
/// long after it is kicked again, in case it was between binding and running.
const KICK_INTERVAL: Duration = Duration::from_millis(500);

type Finished = (u8, Result<(), VcpuError>, ExitStats, GuestSamples);

/// A vCPU thread known to the pause gate until it ends, even by a panic.
struct Registered<'a>(&'a RunControl, u8);

impl<'a> Registered<'a> {
    fn new(control: &'a RunControl, id: u8) -> Self {
        control.vcpu_started(id);
        Registered(control, id)
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.0.vcpu_ended(self.1);
    }
}

pub struct VcpuThreads {
    control: Arc<RunControl>,
    threads: Vec<Option<JoinHandle<()>>>,
    finished: Receiver<Finished>,
}

/// What the run came to.
pub struct Outcome {
    /// Each vCPU's counters, by id (empty counters for a thread that panicked).
    pub stats: Vec<ExitStats>,
    /// The first vCPU error.
    pub error: Option<VcpuError>,
    pub panicked: Option<u8>,
    pub timed_out: bool,
    /// Each vCPU's guest RIP samples, by id.
    pub samples: Vec<GuestSamples>,
}

impl VcpuThreads {
    /// One thread per vCPU, each confined to what a vCPU on `host` needs.
    pub fn spawn(vcpus: Vec<Vcpu>, control: Arc<RunControl>, host: HostProfile) -> std::io::Result<VcpuThreads> {
        install_kick_handler();
        let (tx, finished) = channel();
        let mut threads = Vec::new();
        for mut vcpu in vcpus {
            let (tx, stop, host) = (tx.clone(), control.clone(), host.clone());
            let id = vcpu.id();
            let thread = std::thread::Builder::new().name(format!("vcpu{id}")).spawn(move || {
                let registered = Registered::new(&stop, id);
                let result =
                    crate::seccomp::confine_vcpu(ThreadKind::Vcpu, &host).map_err(Into::into).and_then(|()| vcpu.run());
                drop(registered);
                // Whatever ended this vCPU ends the others too.
                stop.request_stop();
                let _ = tx.send((id, result, vcpu.exits.stats, std::mem::take(&mut vcpu.samples)));
            });
            match thread {
                Ok(t) => threads.push(Some(t)),
                Err(e) => {
                    control.request_stop();
                    let started = VcpuThreads { control, threads, finished };
                    drop(started.wait(Some(Duration::ZERO), None));
                    return Err(e);
                }
            }
        }
        Ok(VcpuThreads { control, threads, finished })
    }

    /// Waits for the first vCPU to end (or `timeout`), then stops and joins all of them;
    /// meanwhile kicks the running ones every `sample_every`, if given, to sample them.
    pub fn wait(mut self, timeout: Option<Duration>, sample_every: Option<Duration>) -> Outcome {
        let count = self.threads.len();
        let mut outcome =
            Outcome { stats: Vec::new(), error: None, panicked: None, timed_out: false, samples: Vec::new() };
        let mut stats: Vec<Option<ExitStats>> = (0..count).map(|_| None).collect();
        let mut samples: Vec<GuestSamples> = vec![GuestSamples::default(); count];
        let mut done = 0;
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut next_sample = sample_every.map(|p| Instant::now() + p);
        let mut kicked: Option<Instant> = None;
        while done < count {
            let wait = if self.control.should_stop() {
                if kicked.is_none_or(|at| at.elapsed() >= KICK_INTERVAL) {
                    self.control.kick_vcpus(kick_signal());
                    kicked = Some(Instant::now());
                }
                KICK_INTERVAL
            } else {
                [deadline, next_sample]
                    .into_iter()
                    .flatten()
                    .min()
                    .map_or(Duration::from_secs(3600), |d| d.saturating_duration_since(Instant::now()))
            };
            match self.finished.recv_timeout(wait) {
                Ok((id, result, s, rips)) => {
                    done += 1;
                    if let Err(e) = result {
                        outcome.error.get_or_insert(e);
                    }
                    if let Some(slot) = stats.get_mut(usize::from(id)) {
                        *slot = Some(s);
                        samples[usize::from(id)] = rips;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) && !self.control.should_stop() {
                        outcome.timed_out = true;
                        self.control.request_stop();
                    }
                    if let (Some(next), Some(period)) = (&mut next_sample, sample_every) {
                        if now >= *next && !self.control.should_stop() {
                            self.control.kick_vcpus(kick_signal());
                            *next = (*next + period).max(now);
                        }
                    }
                }
                // Every sender is gone: the remaining threads panicked.
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        for (id, thread) in self.threads.iter_mut().enumerate() {
            if let Some(t) = thread.take() {
                if t.join().is_err() {
                    outcome.panicked.get_or_insert(id as u8);
                }
            }
        }
        outcome.stats = stats.into_iter().map(|s| s.unwrap_or_else(|| ExitStats::new(0))).collect();
        outcome.samples = samples;
        outcome
    }
}
