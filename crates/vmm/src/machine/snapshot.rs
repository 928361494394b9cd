//! Taking a snapshot of a running machine: the devices paused first (nothing in flight),
//! then every vCPU's state, the VM's, and RAM (then hotpluggable memory's plugged blocks)
//! into the memory file; the devices go on once it is written. The file format and its checks are crate::snapshot's.

use super::Machine;
use crate::device_manager::DeviceTree;
use crate::persist::{Pausable, Persist};
use crate::snapshot::fork::NotTaken;
use crate::snapshot::staged::Staged;
use crate::snapshot::{memory, msr_list, CpuIdentity, MachineState, SnapshotError, VcpuState, VmState};

impl Machine {
    /// This machine's state, its RAM at the staged name of the memory file `memory`
    /// (committed by the caller once the state file is written too): all of it, or with
    /// `diff` only the pages the guest wrote since the last snapshot (KVM's dirty log; the
    /// file has RAM's length and holes elsewhere, to be laid over the previous one's). A
    /// Full snapshot of RAM kept in a file (`--ram-dir`) takes that file as it is
    /// (snapshot/fork.rs) where it can, else writes it. Also returns the bytes of memory
    /// written. Refused with the test devices, whose state is not saved: better no
    /// snapshot than one that resumes a guest whose devices forgot what it told them.
    pub fn snapshot(&self, memory: &Staged, diff: bool) -> Result<(MachineState, u64), SnapshotError> {
        // A device says so itself (the test devices).
        if let Some((name, why)) = self.devices().unsaved() {
            return Err(SnapshotError::Refused(format!("exitless cannot snapshot a microVM with {name}: {why}")));
        }
        // A Diff writes the pages each RAM memslot logged as dirty, or without dirty
        // tracking every resident page (Firecracker's fallback).
        let diff_pages = match (diff, self.dirty_logged_slots()) {
            (true, Some(slots)) => Some(memory::DiffPages::Logged(slots)),
            (true, None) => Some(memory::DiffPages::Resident),
            (false, _) => None,
        };
        // Devices paused first: what they finish (and the interrupts they send) is in what
        // follows. They go on whatever the rest does (a failure to is logged by each).
        self.devices().pause()?;
        let taken = take_paused(self, memory, diff_pages);
        let _ = self.devices().resume();
        let (vm, vcpus, devices, mem_size, written) = taken?;
        let count = self.vcpu_count();
        Ok((MachineState { vcpu_count: count, mem_size, cpu: CpuIdentity::host(), vm, vcpus, devices }, written))
    }
}

/// The vCPUs, the VM, the devices and the memory file (a Diff of `diff_pages`, or all of
/// RAM), while the devices are paused.
fn take_paused(
    machine: &Machine,
    staged: &Staged,
    diff_pages: Option<memory::DiffPages>,
) -> Result<(VmState, Vec<VcpuState>, DeviceTree, u64, u64), SnapshotError> {
    let msrs = msr_list(machine.kvm())?;
    let count = machine.vcpu_count();
    let vcpus = machine
        .control()
        .save_vcpus(usize::from(count), msrs, std::time::Duration::from_secs(2))
        .map_err(SnapshotError::Refused)?;
    let vm = machine.vm().save(())?;
    let devices = machine.devices().save(())?;
    let mem_size = machine.map().ram_regions().iter().map(|&(_, size)| size).sum();
    let io = |source| SnapshotError::Io { what: "write", path: "the memory file".into(), source };
    let given = diff_pages.is_none() && give_ram_file(machine, staged);
    let written = match diff_pages {
        Some(pages) => memory::write_dirty(machine.vm(), machine.memory(), pages, &mut staged.create()?).map_err(io)?,
        None if given => 0,
        None => memory::write_full(machine.memory(), &mut staged.create()?).map_err(io)?,
    };
    // After a Full, what the next Diff holds starts here.
    if let (None, Some(slots)) = (diff_pages, machine.dirty_logged_slots()) {
        memory::clear_dirty_log(machine.vm(), machine.memory(), slots).map_err(io)?;
    }
    Ok((vm, vcpus, devices, mem_size, written))
}

/// Whether guest RAM's own file became the memory file at `staged`'s name (fork.rs); why
/// not is logged, and the file is written instead.
fn give_ram_file(machine: &Machine, staged: &Staged) -> bool {
    let Some(ram) = machine.ram_file() else { return false };
    match ram.give(machine.memory(), staged.temp()) {
        Ok(()) => true,
        Err(NotTaken::Given) => {
            tracing::info!("snapshot: guest RAM is private over an earlier snapshot's file: its memory is written");
            false
        }
        Err(e) => {
            tracing::warn!("snapshot: the memory file is written, not taken from --ram-dir: {e}");
            false
        }
    }
}
