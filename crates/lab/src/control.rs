//! The lab control port: the guest announces the step it begins or ends, and the lab
//! loop, which owns the vCPU, acts on it between two `KVM_RUN`s.

use exitless_payloads::abi::LAB_CONTROL_PORT;
use exitless_vmm::bus::BusDevice;
use exitless_vmm::device_manager::DeviceHandle;
use exitless_vmm::seccomp::ThreadKind;
use exitless_vmm::vcpu::watchdog::Watchdog;
use exitless_vmm::vcpu::{Step, Vcpu, VcpuError};
use exitless_vmm::{Machine, MachineConfig, MachineError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the guest announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabEvent {
    Begin(usize),
    /// The measured part of the step starts here.
    Mark(usize),
    End(usize),
}

const NONE: u64 = u64::MAX;

/// Holds the last announcement until the lab loop takes it.
pub struct LabControl {
    pending: AtomicU64,
}

impl Default for LabControl {
    fn default() -> Self {
        LabControl { pending: AtomicU64::new(NONE) }
    }
}

impl LabControl {
    /// Called after every exit: a plain load, and a locked swap only when there is news.
    #[inline]
    pub fn take(&self) -> Option<LabEvent> {
        if self.pending.load(Ordering::Acquire) == NONE {
            return None;
        }
        let v = self.pending.swap(NONE, Ordering::AcqRel);
        let step = (v & 0xffff) as usize;
        match v >> 16 {
            op if op == exitless_payloads::abi::LAB_OP_BEGIN => Some(LabEvent::Begin(step)),
            op if op == exitless_payloads::abi::LAB_OP_END => Some(LabEvent::End(step)),
            op if op == exitless_payloads::abi::LAB_OP_MARK => Some(LabEvent::Mark(step)),
            _ => None,
        }
    }
}

impl BusDevice for LabControl {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if offset == 0 && data.len() == 4 {
            let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            self.pending.store(u64::from(v), Ordering::Release);
        }
    }
}

/// A lab's side of a guest run: how to step the vCPU, and what to do on each event.
pub trait LabSteps {
    type Error: From<MachineError>;

    /// One vCPU step (a lab may filter exits, see the doorbell's raw floor).
    fn step(&mut self, vcpu: &mut Vcpu) -> Result<Step, VcpuError> {
        vcpu.step()
    }

    /// Called between two `KVM_RUN`s, before the guest goes on past its announcement.
    fn on_event(&mut self, machine: &Machine, vcpu: &mut Vcpu, event: LabEvent) -> Result<(), Self::Error>;
}

/// The usual lab window: counters taken by `snapshot` when the guest announces Begin and
/// End, and the exits to userspace between the two (the announcing exit not counted).
pub struct Window<S, E> {
    snapshot: fn(&Machine) -> S,
    pub begin: Option<S>,
    /// The counters at End, and the port and MMIO exits since Begin.
    pub end: Option<(S, u64)>,
    /// Run once at Begin (the echo lab starts its sender there).
    pub on_begin: Option<Box<dyn FnOnce() + Send>>,
    error: std::marker::PhantomData<fn() -> E>,
}

impl<S, E> Window<S, E> {
    pub fn new(snapshot: fn(&Machine) -> S) -> Self {
        Window { snapshot, begin: None, end: None, on_begin: None, error: std::marker::PhantomData }
    }
}

impl<S, E: From<MachineError>> LabSteps for Window<S, E> {
    type Error = E;

    fn on_event(&mut self, machine: &Machine, vcpu: &mut Vcpu, event: LabEvent) -> Result<(), E> {
        match event {
            LabEvent::Begin(_) => {
                vcpu.exits.stats.reset();
                vcpu.discard_pending();
                self.begin = Some((self.snapshot)(machine));
                if let Some(f) = self.on_begin.take() {
                    f();
                }
            }
            LabEvent::End(_) => self.end = Some(((self.snapshot)(machine), vcpu.exits.stats.io_exits())),
            LabEvent::Mark(_) => {}
        }
        Ok(())
    }
}

/// How the payload ended, unless it exited with status 0 or the host stopped it: a reset (a
/// triple fault comes back as one) or a power-off is a failure the caller names, not a
/// quiet zero.
pub fn payload_failure(machine: &Machine) -> Option<String> {
    match machine.control().guest_stopped() {
        None | Some(exitless_vmm::run_control::GuestStop::Exit(0)) => None,
        Some(stop) => Some(stop.describe()),
    }
}

/// A guest console kept in memory (the labs read what a payload printed).
#[derive(Clone, Default)]
pub struct Console(Arc<std::sync::Mutex<Vec<u8>>>);

impl Console {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&exitless_vmm::sync::lock(&self.0)).into_owned()
    }
}

impl std::io::Write for Console {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        exitless_vmm::sync::lock(&self.0).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A lab's machine: the lab devices and the control port attached.
pub struct LabMachine {
    pub machine: Machine,
    pub control: Arc<LabControl>,
    pub doorbell: Arc<crate::devices::doorbell::Doorbell>,
}

/// Boots `payload` with `params`, the lab's devices and its control port, ready for [`drive`].
pub fn lab_machine(
    payload: &str,
    params: Vec<u64>,
    config: impl FnOnce(&mut MachineConfig),
) -> Result<LabMachine, MachineError> {
    let elf = exitless_payloads::find(payload).map(|p| p.elf).unwrap_or_default();
    let mut machine_config = MachineConfig { params, ..MachineConfig::new(elf) };
    let (plug, doorbell) = crate::devices::plug();
    machine_config.devices.fixed.push(plug);
    config(&mut machine_config);
    let mut machine = Machine::new(machine_config)?;
    let control = Arc::new(LabControl::default());
    let (port, handle) = (LAB_CONTROL_PORT as u16, DeviceHandle::bus());
    machine.devices_mut().attach_pio("lab-control", crate::devices::KIND, port, 4, control.clone(), handle)?;
    // Tells the guest a lab answers on the control port.
    let lab_slot = exitless_vmm::machine::shared_slot(exitless_payloads::abi::SHARED_LAB_SLOT);
    vm_memory::Bytes::write_obj(machine.memory(), 1u64, lab_slot).map_err(|e| MachineError::Memory(e.into()))?;
    Ok(LabMachine { machine, control, doorbell })
}

/// The guest's TSC rate (KVM_GET_TSC_KHZ on a throwaway VM), to turn guest cycle counts
/// into time; the host's TSC runs at the same rate here (KVM does not scale it).
pub fn guest_tsc_khz() -> Result<u32, MachineError> {
    let kvm = exitless_vmm::kvm::open()?;
    let fail = |what| move |source| MachineError::Ioctl { what, source };
    let vm = kvm.create_vm().map_err(fail("KVM_CREATE_VM"))?;
    let vcpu = vm.create_vcpu(0).map_err(fail("KVM_CREATE_VCPU"))?;
    vcpu.get_tsc_khz().map_err(fail("KVM_GET_TSC_KHZ"))
}

/// Runs vCPU 0 until the guest exits, handing each announcement to `lab`. The vCPU runs
/// on its own thread under the lab's vCPU seccomp filter (a vCPU's, plus what the lab's
/// `on_event` code needs), so a lab guest meets the confinement of `exitless run`.
/// A guest that overruns `timeout` is stopped and reported.
pub fn drive<L: LabSteps + Send>(
    machine: &Machine,
    control: &LabControl,
    timeout: Duration,
    lab: &mut L,
) -> Result<(), L::Error>
where
    L::Error: Send,
{
    let vcpu = machine.create_vcpu(0)?;
    std::thread::scope(|scope| {
        let run = move || {
            let mut vcpu = vcpu;
            vcpu.bind_kicks();
            let watchdog = Watchdog::arm_for_current_thread(machine.control().clone(), timeout);
            let result = exitless_vmm::seccomp::confine_vcpu(ThreadKind::LabVcpu, machine.host_profile())
                .map_err(MachineError::from)
                .map_err(Into::into);
            let result = result.and_then(|()| loop {
                if lab.step(&mut vcpu).map_err(MachineError::from)? == Step::Stopped {
                    return Ok(());
                }
                if let Some(event) = control.take() {
                    lab.on_event(machine, &mut vcpu, event)?;
                }
            });
            vcpu.unbind_kicks();
            // The vCPU goes back to be freed unconfined: glibc may read
            // /proc/sys/vm/overcommit_memory when a thread's heap shrinks.
            if watchdog.disarm() {
                return (vcpu, Err(MachineError::Timeout(timeout).into()));
            }
            (vcpu, result)
        };
        let thread = std::thread::Builder::new().name("vcpu0".into()).spawn_scoped(scope, run);
        let thread = thread.map_err(|e| L::Error::from(MachineError::VcpuThreads(e)))?;
        let (vcpu, result) = thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        drop(vcpu);
        // COM1 writes from a thread of its own: what the guest printed last is in the
        // console only once it drained (a lab reading it at once missed the last line).
        machine.drain_console();
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_decode_and_garbage_is_ignored() {
        let c = LabControl::default();
        assert_eq!(c.take(), None);
        c.write(0, &[3, 0, 1, 0]);
        assert_eq!(c.take(), Some(LabEvent::Begin(3)));
        assert_eq!(c.take(), None);
        c.write(0, &[0, 1, 2, 0]);
        assert_eq!(c.take(), Some(LabEvent::End(256)));
        c.write(0, &[2, 0, 3, 0]);
        assert_eq!(c.take(), Some(LabEvent::Mark(2)));
        c.write(0, &[1, 0, 9, 0]);
        assert_eq!(c.take(), None, "unknown op");
        c.write(0, &[1, 0]);
        c.write(2, &[1, 0, 1, 0]);
        assert_eq!(c.take(), None, "wrong size or offset");
    }
}
