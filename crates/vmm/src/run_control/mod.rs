//! How a device or the VMM tells the vCPUs to stop, and why; and how the API pauses them.
//! A leaf: the vCPUs, the machine and the devices' power handle build on it.

pub mod kick;
mod power;

pub use power::PowerEvents;

use crate::persist::vcpu::VcpuState;
use kick::Pthread;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

const NO_STATUS: u64 = u64::MAX;
const POWER_OFF: u64 = 1 << 32;
const RESET: u64 = 2 << 32;

/// How the guest ended its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestStop {
    /// It wrote a status to the debug-exit port.
    Exit(u32),
    /// ACPI soft-off (S5).
    PowerOff,
    /// A reset: the i8042 reset line or the ACPI reset register (`reboot`, or a panic with
    /// `panic=N`). There is no firmware to reboot into, so the run ends.
    Reset,
}

impl GuestStop {
    /// The process status `exitless run` exits with.
    pub fn status(self) -> u32 {
        match self {
            GuestStop::Exit(s) => s,
            GuestStop::PowerOff | GuestStop::Reset => 0,
        }
    }

    pub fn describe(self) -> String {
        match self {
            GuestStop::Exit(s) => format!("guest exited with status {s}"),
            GuestStop::PowerOff => "guest powered off".into(),
            GuestStop::Reset => "guest reset (a reboot, or a panic with panic=N)".into(),
        }
    }
}

const STOP: u8 = 1;
const PAUSE: u8 = 2;
/// The guest sleeps in ACPI S3 (crate::machine::sleep): vCPUs park until it wakes.
const SUSPEND: u8 = 4;

/// The vCPU threads as the pause gate sees them.
#[derive(Default)]
struct Gate {
    /// Each running vCPU thread, by id, so a pause can kick it out of `KVM_RUN`.
    threads: Vec<Option<Pthread>>,
    parked: usize,
    /// A snapshot's request for every vCPU's state, which each parked vCPU fills in.
    saves: Option<SaveRequest>,
    /// The vCPUs exist (and a restored one has its state back): interrupts the devices
    /// raise from now on reach a LAPIC that will not be overwritten.
    created: bool,
}

/// How a parked vCPU reads its own state, given the MSRs to read.
pub type ReadState<'a> = dyn FnMut(&[u32]) -> Result<VcpuState, String> + 'a;

/// What a snapshot asks of the parked vCPUs: each reads its own state (only its thread
/// may use its fd) and leaves it here.
struct SaveRequest {
    msrs: Arc<Vec<u32>>,
    states: Vec<Option<Result<VcpuState, String>>>,
}

/// Shared by the vCPUs, the devices and the thread that waits for the machine.
pub struct RunControl {
    /// STOP and PAUSE bits: a vCPU reads them with one load after every exit.
    flags: AtomicU8,
    status: AtomicU64,
    gate: Mutex<Gate>,
    changed: Condvar,
}

impl Default for RunControl {
    fn default() -> Self {
        RunControl {
            flags: AtomicU8::new(0),
            status: AtomicU64::new(NO_STATUS),
            gate: Mutex::new(Gate::default()),
            changed: Condvar::new(),
        }
    }
}

/// The vCPUs did not all stop within the time a pause allows.
#[derive(Debug, thiserror::Error)]
#[error("{parked} of {running} vCPUs paused within {waited:?}")]
pub struct PauseTimeout {
    pub parked: usize,
    pub running: usize,
    pub waited: Duration,
}

impl RunControl {
    /// The guest asked to stop (the first request wins).
    pub fn guest_stop(&self, how: GuestStop) {
        let code = match how {
            GuestStop::Exit(s) => u64::from(s),
            GuestStop::PowerOff => POWER_OFF,
            GuestStop::Reset => RESET,
        };
        let _ = self.status.compare_exchange(NO_STATUS, code, Ordering::AcqRel, Ordering::Acquire);
        self.request_stop();
    }

    /// The guest asked to exit with `status`.
    pub fn guest_exit(&self, status: u32) {
        self.guest_stop(GuestStop::Exit(status));
    }

    /// The VMM wants the vCPUs out (timeout, error on another vCPU).
    pub fn request_stop(&self) {
        self.flags.fetch_or(STOP, Ordering::AcqRel);
        // A paused vCPU is parked, not in KVM_RUN: wake it to see the stop.
        let _gate = crate::sync::lock(&self.gate);
        self.changed.notify_all();
    }

    #[inline]
    pub fn should_stop(&self) -> bool {
        self.flags.load(Ordering::Acquire) & STOP != 0
    }

    /// Whether a vCPU must stop or pause before it enters the guest again.
    #[inline]
    pub fn needs_attention(&self) -> bool {
        self.flags.load(Ordering::Acquire) != 0
    }

    /// A vCPU thread starts: from now on a pause kicks it.
    pub fn vcpu_started(&self, id: u8) {
        let mut gate = crate::sync::lock(&self.gate);
        let slot = usize::from(id);
        if gate.threads.len() <= slot {
            gate.threads.resize(slot + 1, None);
        }
        gate.threads[slot] = Some(Pthread::current());
        self.changed.notify_all();
    }

    /// A vCPU thread is about to end: never kick it again (its pthread_t dies with it).
    pub fn vcpu_ended(&self, id: u8) {
        let mut gate = crate::sync::lock(&self.gate);
        if let Some(slot) = gate.threads.get_mut(usize::from(id)) {
            *slot = None;
        }
        self.changed.notify_all();
    }

    /// Sends `signal` (whose handler must be installed) to every running vCPU thread, so
    /// that one inside `KVM_RUN` returns from it.
    pub fn kick_vcpus(&self, signal: libc::c_int) {
        Self::kick(&crate::sync::lock(&self.gate), signal);
    }

    fn kick(gate: &Gate, signal: libc::c_int) {
        for &thread in gate.threads.iter().flatten() {
            // SAFETY: a registered thread has not passed vcpu_ended (which takes the gate's
            // lock, held by our caller), so it is still alive.
            unsafe { thread.kill(signal) };
        }
    }

    /// Called by a vCPU out of `KVM_RUN` that saw PAUSE or SUSPEND: waits until neither
    /// is raised or the machine stops.
    pub fn park(&self) {
        self.park_until(None);
    }

    /// [`RunControl::park`], or until `deadline` passes: true then.
    pub fn park_until(&self, deadline: Option<Instant>) -> bool {
        self.park_serving(deadline, None)
    }

    /// Parks vCPU `id` as [`RunControl::park_until`] does, reading its state with `save`
    /// whenever a snapshot asks for it meanwhile.
    pub fn park_serving(&self, deadline: Option<Instant>, mut save: Option<(u8, &mut ReadState<'_>)>) -> bool {
        let mut gate = crate::sync::lock(&self.gate);
        gate.parked += 1;
        self.changed.notify_all();
        let mut timed_out = false;
        loop {
            let flags = self.flags.load(Ordering::Acquire);
            if flags & STOP != 0 || flags & (PAUSE | SUSPEND) == 0 {
                break;
            }
            if let Some((id, read)) = save.as_mut() {
                let asked = gate.saves.as_ref().filter(|r| r.states.get(usize::from(*id)).is_some_and(Option::is_none));
                if let Some(msrs) = asked.map(|r| r.msrs.clone()) {
                    drop(gate);
                    let state = read(&msrs);
                    gate = crate::sync::lock(&self.gate);
                    if let Some(slot) = gate.saves.as_mut().and_then(|r| r.states.get_mut(usize::from(*id))) {
                        *slot = Some(state);
                    }
                    self.changed.notify_all();
                    continue;
                }
            }
            gate = match deadline {
                None => self.changed.wait(gate).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let Some(left) = d.checked_duration_since(Instant::now()).filter(|l| !l.is_zero()) else {
                        timed_out = true;
                        break;
                    };
                    self.changed.wait_timeout(gate, left).unwrap_or_else(|e| e.into_inner()).0
                }
            };
        }
        gate.parked -= 1;
        timed_out
    }

    /// Says the vCPUs were created (or failed to be): [`RunControl::wait_vcpus_created`] returns.
    pub fn vcpus_created(&self) {
        crate::sync::lock(&self.gate).created = true;
        self.changed.notify_all();
    }

    /// Waits up to `limit` for [`RunControl::vcpus_created`]; false if it did not come.
    pub fn wait_vcpus_created(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut gate = crate::sync::lock(&self.gate);
        while !gate.created {
            let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|l| !l.is_zero()) else {
                return false;
            };
            gate = self.changed.wait_timeout(gate, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        true
    }

    /// Raises the pause before any vCPU runs: each parks at its first step (a snapshot
    /// loaded without `resume_vm`).
    pub fn pause_before_start(&self) {
        self.flags.fetch_or(PAUSE, Ordering::AcqRel);
    }

    /// Every vCPU's state, read by each parked vCPU on its own thread; the machine must be
    /// paused. `msrs` are the MSRs to read (KVM's list).
    pub fn save_vcpus(&self, count: usize, msrs: Vec<u32>, limit: Duration) -> Result<Vec<VcpuState>, String> {
        if !self.is_paused() {
            return Err("the microVM is not paused".into());
        }
        let mut gate = crate::sync::lock(&self.gate);
        gate.saves = Some(SaveRequest { msrs: Arc::new(msrs), states: (0..count).map(|_| None).collect() });
        self.changed.notify_all();
        let deadline = Instant::now() + limit;
        loop {
            let done = gate.saves.as_ref().is_some_and(|r| r.states.iter().all(Option::is_some));
            if done {
                let states = gate.saves.take().map(|r| r.states).unwrap_or_default();
                return states.into_iter().flatten().collect();
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|l| !l.is_zero()) else {
                gate.saves = None;
                return Err(format!("the vCPUs did not give their state within {limit:?}"));
            };
            gate = self.changed.wait_timeout(gate, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// The guest entered S3: every vCPU leaves `KVM_RUN` (kicked with `signal`) and parks
    /// until [`RunControl::wake`].
    pub fn suspend(&self, signal: libc::c_int) {
        self.flags.fetch_or(SUSPEND, Ordering::AcqRel);
        Self::kick(&crate::sync::lock(&self.gate), signal);
    }

    /// A wake event ends S3: the parked vCPUs go on (to resume through the firmware's path).
    pub fn wake(&self) {
        self.release(SUSPEND);
    }

    pub fn is_suspended(&self) -> bool {
        self.flags.load(Ordering::Acquire) & SUSPEND != 0
    }

    /// Pauses every vCPU: raises PAUSE, kicks each running vCPU thread out of `KVM_RUN`
    /// (with `signal`, whose handler must be installed) until all are parked or `limit` passes.
    pub fn pause(&self, signal: libc::c_int, limit: Duration) -> Result<(), PauseTimeout> {
        self.flags.fetch_or(PAUSE, Ordering::AcqRel);
        let start = Instant::now();
        let mut gate = crate::sync::lock(&self.gate);
        loop {
            let running = gate.threads.iter().flatten().count();
            if gate.parked >= running || self.should_stop() {
                return Ok(());
            }
            if start.elapsed() >= limit {
                return Err(PauseTimeout { parked: gate.parked, running, waited: limit });
            }
            Self::kick(&gate, signal);
            gate = self.changed.wait_timeout(gate, Duration::from_millis(10)).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Lets paused vCPUs run again.
    pub fn resume(&self) {
        self.release(PAUSE);
    }

    /// Lowers `bit` (PAUSE or SUSPEND) and wakes the parked vCPUs to look again.
    fn release(&self, bit: u8) {
        self.flags.fetch_and(!bit, Ordering::AcqRel);
        let _gate = crate::sync::lock(&self.gate);
        self.changed.notify_all();
    }

    pub fn is_paused(&self) -> bool {
        self.flags.load(Ordering::Acquire) & PAUSE != 0
    }

    pub fn guest_stopped(&self) -> Option<GuestStop> {
        match self.status.load(Ordering::Acquire) {
            NO_STATUS => None,
            POWER_OFF => Some(GuestStop::PowerOff),
            RESET => Some(GuestStop::Reset),
            s => Some(GuestStop::Exit(s as u32)),
        }
    }

    pub fn exit_status(&self) -> Option<u32> {
        self.guest_stopped().map(GuestStop::status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    /// A stand-in vCPU loop: counts "guest work" until stopped, parking when paused.
    fn spin(control: Arc<RunControl>, id: u8, work: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            control.vcpu_started(id);
            while !control.should_stop() {
                if control.needs_attention() && !control.should_stop() {
                    control.park();
                }
                work.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
            control.vcpu_ended(id);
        })
    }

    #[test]
    fn a_pause_holds_every_vcpu_until_resumed_and_a_stop_ends_it() {
        kick::install_kick_handler();
        let control = Arc::new(RunControl::default());
        let work = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..3).map(|id| spin(control.clone(), id, work.clone())).collect();
        while control.gate.lock().unwrap().threads.iter().flatten().count() < 3 {
            std::thread::yield_now();
        }
        for _ in 0..20 {
            control.pause(kick::kick_signal(), Duration::from_secs(10)).unwrap();
            assert!(control.is_paused());
            let before = work.load(Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(5));
            assert_eq!(work.load(Ordering::Relaxed), before, "a parked vCPU did work");
            control.resume();
            let resumed = work.load(Ordering::Relaxed);
            while work.load(Ordering::Relaxed) < resumed + 10 {
                std::thread::yield_now();
            }
        }
        // Stopping a paused machine wakes and ends every vCPU.
        control.pause(kick::kick_signal(), Duration::from_secs(10)).unwrap();
        control.request_stop();
        for t in threads {
            t.join().unwrap();
        }
        // With no vCPU running, a pause has nothing to wait for.
        let idle = RunControl::default();
        assert!(idle.pause(kick::kick_signal(), Duration::ZERO).is_ok());
    }
}
