//! Snapshots, as Firecracker's users take them: a paused microVM's state (every vCPU,
//! the in-kernel interrupt controllers, PIT and clock) in a versioned JSON file, and its
//! RAM in a memory file, so that a new VMM process resumes it where it stopped.
//!
//! Nothing is saved by pointer: every piece is KVM's own structure, read through its
//! ioctls. A state file is checked whole before anything is built from it (format
//! version, counts, sizes, this host's CPU), so a bad one is refused with one line.
//! Virtio devices are paused first (nothing in flight, machine/snapshot.rs), so the rings in the
//! memory file agree with the queue positions saved, and go on once the file is written.

pub mod fork;
pub mod memory;
pub mod staged;
pub mod uffd;
pub mod uffd_handler;
mod vm;

pub use crate::device_manager::DeviceTree;
pub use crate::persist::vcpu::{msr_list, VcpuState};
pub use vm::VmState;

use serde::{Deserialize, Serialize};

const MAGIC: &str = "exitless-snapshot";
/// Bumped on every change of what a state file holds (a field added, removed or changing
/// meaning): a file of another version is refused by name, never half-read.
/// 2: devices as a tree keyed by name, with placements (crate::persist); a checksum.
/// 3: what the device allocators handed out, beside the devices.
/// 4: devices keyed by the API's ids (`virtio-net/eth0`), each device's state typed with a
///    version of its own (crate::persist::Saved), placements and kinds by name.
pub const FORMAT_VERSION: u32 = 4;
/// A state file is a few hundred KiB (the XSAVE areas are the largest part).
const MAX_STATE_FILE: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("cannot {what} {path}: {source}")]
    Io { what: &'static str, path: String, source: std::io::Error },
    #[error("{0} is not an exitless snapshot: {1}")]
    Format(String, String),
    #[error("{0} is format {1}; this exitless reads format {FORMAT_VERSION} (taken by exitless {2})")]
    Version(String, u32, String),
    #[error("the snapshot was taken on another CPU ({0}); restore it on a host like that one")]
    Cpu(String),
    #[error("{0} failed: {1}")]
    Kvm(&'static str, kvm_ioctls::Error),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Persist(#[from] crate::persist::PersistError),
    /// A state file that cannot be read or written, is not a regular file, or is too large.
    #[error(transparent)]
    File(#[from] crate::files::FileError),
}

impl From<(&'static str, kvm_ioctls::Error)> for SnapshotError {
    fn from((what, e): (&'static str, kvm_ioctls::Error)) -> Self {
        SnapshotError::Kvm(what, e)
    }
}

/// What a host's CPU must match for a snapshot's vCPU state to be valid on it: the
/// vendor, family, model and stepping, and the feature leaves KVM's state depends on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuIdentity {
    pub vendor: String,
    pub signature: u32,
    /// CPUID 7.0 EBX, ECX, EDX and 0xD.0 EBX (the XSAVE area's size).
    pub features: [u32; 4],
}

impl CpuIdentity {
    pub fn host() -> CpuIdentity {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        let (l0, l1, l7, ld) = (__cpuid(0), __cpuid(1), __cpuid_count(7, 0), __cpuid_count(0xd, 0));
        let vendor: Vec<u8> = [l0.ebx, l0.edx, l0.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
        CpuIdentity {
            vendor: String::from_utf8_lossy(&vendor).into_owned(),
            signature: l1.eax,
            features: [l7.ebx, l7.ecx, l7.edx, ld.ebx],
        }
    }
}

/// Everything but RAM and the VMM's own configuration.
#[derive(Debug, Serialize, Deserialize)]
pub struct MachineState {
    pub vcpu_count: u8,
    pub mem_size: u64,
    pub cpu: CpuIdentity,
    pub vm: VmState,
    pub vcpus: Vec<VcpuState>,
    /// The VMM's own devices (the in-kernel ones are in `vm`).
    #[serde(default)]
    pub devices: DeviceTree,
}

impl std::fmt::Debug for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmState").field("clock", &self.clock.clock).finish_non_exhaustive()
    }
}

/// The state file: the machine's state, and the VMM's configuration as the API layer
/// keeps it (opaque here), so the same devices can be built again.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotFile {
    pub magic: String,
    pub format: u32,
    pub exitless: String,
    pub machine: MachineState,
    pub config: serde_json::Value,
}

/// The file as written: the state and configuration as JSON values, and their checksum.
#[derive(Serialize, Deserialize)]
struct Written {
    magic: String,
    format: u32,
    exitless: String,
    machine: serde_json::Value,
    config: serde_json::Value,
    /// FNV-1a (64 bits) of the compact JSON of `[machine, config]`: a file damaged after
    /// it was written is refused instead of restored.
    checksum: String,
}

fn checksum(machine: &serde_json::Value, config: &serde_json::Value) -> Result<String, serde_json::Error> {
    let bytes = serde_json::to_vec(&(machine, config))?;
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    Ok(format!("fnv1a64:{hash:016x}"))
}

impl SnapshotFile {
    pub fn new(machine: MachineState, config: serde_json::Value) -> Self {
        SnapshotFile {
            magic: MAGIC.into(),
            format: FORMAT_VERSION,
            exitless: env!("CARGO_PKG_VERSION").into(),
            machine,
            config,
        }
    }

    pub fn write(&self, path: &std::path::Path) -> Result<(), SnapshotError> {
        let io = |what, source| SnapshotError::Io { what, path: path.display().to_string(), source };
        let json = |e: serde_json::Error| io("write", std::io::Error::other(e));
        let machine = serde_json::to_value(&self.machine).map_err(json)?;
        let checksum = checksum(&machine, &self.config).map_err(json)?;
        let written = Written {
            magic: self.magic.clone(),
            format: self.format,
            exitless: self.exitless.clone(),
            machine,
            config: self.config.clone(),
            checksum,
        };
        let bytes = serde_json::to_vec(&written).map_err(json)?;
        // A FIFO or device at the path is refused, not waited on.
        let mut file = crate::files::create_regular(path, false)?;
        std::io::Write::write_all(&mut file, &bytes).map_err(|e| io("write", e))
    }

    /// Reads and checks a state file: nothing is built from one that fails.
    pub fn read(path: &std::path::Path) -> Result<SnapshotFile, SnapshotError> {
        // A regular file, read from the descriptor checked and never past the cap: a
        // FIFO or /dev/zero (length 0 to stat) would hang or exhaust the API thread.
        let bytes = crate::files::read_regular_bounded(path, MAX_STATE_FILE)?;
        Self::parse(&path.display().to_string(), &bytes)
    }

    /// [`SnapshotFile::read`] on bytes already read (the fuzz target's entry).
    pub fn parse(name: &str, bytes: &[u8]) -> Result<SnapshotFile, SnapshotError> {
        let bad = |why: String| SnapshotError::Format(name.into(), why);
        // The header alone first: a file of another format is named as such, not as garbage.
        #[derive(Deserialize)]
        struct Header {
            magic: String,
            format: u32,
            exitless: String,
        }
        let header: Header = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        if header.magic != MAGIC {
            return Err(bad(format!("its magic is {:?}", header.magic)));
        }
        if header.format != FORMAT_VERSION {
            return Err(SnapshotError::Version(name.into(), header.format, header.exitless));
        }
        let written: Written = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        let sum = checksum(&written.machine, &written.config).map_err(|e| bad(e.to_string()))?;
        if sum != written.checksum {
            return Err(bad(format!("its checksum is {}, its contents' {sum}: it was damaged", written.checksum)));
        }
        // A field that does not parse is named by its path (`devices.devices.serial.kind`).
        let machine: MachineState = serde_path_to_error::deserialize(&written.machine)
            .map_err(|e| bad(format!("its field `{}` does not parse: {}", e.path(), e.inner())))?;
        machine.check().map_err(bad)?;
        let Written { magic, format, exitless, config, .. } = written;
        Ok(SnapshotFile { magic, format, exitless, machine, config })
    }
}

impl MachineState {
    /// The counts and sizes agree with each other and with what this VMM builds.
    pub fn check(&self) -> Result<(), String> {
        let n = usize::from(self.vcpu_count);
        if n == 0 || n > usize::from(crate::vcpu::MAX_VCPUS) || self.vcpus.len() != n {
            return Err(format!("{} vCPU states for {} vCPUs", self.vcpus.len(), self.vcpu_count));
        }
        if self.vcpus.iter().enumerate().any(|(i, v)| usize::from(v.id) != i) {
            return Err("the vCPU states are not in order".into());
        }
        if self.vcpus.iter().any(|v| v.msrs.len() > 4096) {
            return Err("a vCPU lists more MSRs than KVM has".into());
        }
        if crate::layout::MemoryMap::new(self.mem_size).is_err() {
            return Err(format!("{} bytes of RAM is not a size this VMM builds", self.mem_size));
        }
        if !self.vm.well_formed() {
            return Err("the interrupt controllers are not the three this VMM creates".into());
        }
        Ok(())
    }

    /// This host's CPU is the one the snapshot was taken on.
    pub fn check_host(&self) -> Result<(), SnapshotError> {
        let host = CpuIdentity::host();
        if host != self.cpu {
            return Err(SnapshotError::Cpu(format!(
                "{} {:#x} there, {} {:#x} here",
                self.cpu.vendor, self.cpu.signature, host.vendor, host.signature
            )));
        }
        Ok(())
    }
}

/// What a machine is restored from: its state and its memory.
pub struct Restore {
    pub state: MachineState,
    pub memory: MemoryBackend,
    /// Firecracker's `clock_realtime`: the guest's clock advances by the wall time that
    /// passed since the snapshot (KVM_CLOCK_REALTIME), instead of going on from its reading.
    pub clock_realtime: bool,
}

/// Where a restored guest's memory comes from (Firecracker's `mem_backend`).
pub enum MemoryBackend {
    /// The memory file, mapped privately: pages come in on first touch.
    File(std::fs::File),
    /// Anonymous memory whose page faults the handler listening on this socket serves
    /// (uffd.rs).
    Uffd(std::path::PathBuf),
}

/// A restore fits the machine being built: the same vCPU count and RAM, this host's CPU,
/// a memory file as large as the RAM and the `hotplug` bytes of hotpluggable memory after
/// it, which only a memory file holds.
pub fn check_restore(
    r: &Restore,
    vcpus: u8,
    (mem_size, hotplug): (u64, u64),
    test_devices: bool,
) -> Result<(), SnapshotError> {
    r.state.check().map_err(SnapshotError::Refused)?;
    if r.state.vcpu_count != vcpus || r.state.mem_size != mem_size {
        return Err(SnapshotError::Refused(format!(
            "the snapshot has {} vCPUs and {} MiB; the configuration {} vCPUs and {} MiB",
            r.state.vcpu_count,
            r.state.mem_size >> 20,
            vcpus,
            mem_size >> 20
        )));
    }
    if test_devices {
        return Err(SnapshotError::Refused("the test devices (--testdevs) are not saved in snapshots".into()));
    }
    r.state.check_host()?;
    match &r.memory {
        MemoryBackend::File(file) => memory::check_length(file, mem_size, hotplug).map_err(SnapshotError::Refused),
        MemoryBackend::Uffd(_) if hotplug > 0 => Err(SnapshotError::Refused(
            "a snapshot with hotpluggable memory loads from a memory file (File backend) only".into(),
        )),
        // The handler's memory is its own to check.
        MemoryBackend::Uffd(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus(name: &str) -> Vec<u8> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/snapshot_loader");
        std::fs::read(dir.join(name)).unwrap()
    }

    #[test]
    fn a_kept_state_file_parses_and_spoiled_ones_are_named() {
        let good = SnapshotFile::parse("s", &corpus("counter-1vcpu")).unwrap();
        assert_eq!((good.machine.vcpu_count, good.machine.mem_size), (1, 64 << 20));
        assert!(matches!(SnapshotFile::parse("s", &corpus("truncated")), Err(SnapshotError::Format(..))));
        // A file of the format before (devices by attach order, untyped device state).
        assert!(matches!(SnapshotFile::parse("s", &corpus("format-3")), Err(SnapshotError::Version(_, 3, _))));
        let mut wrong = good;
        wrong.machine.vcpu_count = 2;
        assert!(wrong.machine.check().unwrap_err().contains("1 vCPU states for 2 vCPUs"));
        wrong.machine.vcpu_count = 1;
        wrong.machine.mem_size = 3;
        assert!(wrong.machine.check().is_err());
        // Devices by id, each with its placement; virtio ones with config space and transport.
        let devices = SnapshotFile::parse("s", &corpus("vsock-rng-devices")).unwrap().machine.devices;
        let virtio: Vec<_> = devices
            .devices
            .iter()
            .filter(|(_, r)| !r.config.is_empty())
            .map(|(name, r)| (name.as_str(), r.config.len(), r.state.as_ref().unwrap().decode().unwrap()))
            .collect();
        let names: Vec<_> = virtio.iter().map(|v| (v.0, v.1)).collect();
        assert_eq!(names, [("virtio-rng", 4096), ("virtio-vsock/vsock0", 4096)]);
        let vsock: &crate::virtio::transport::TransportState = &virtio[1].2;
        assert!(vsock.active && vsock.queues.len() == 3);
        assert!(devices.devices.values().all(|r| !r.placement.is_empty()), "every device says where it is");
        let serial = devices.devices["serial"].state.as_ref().unwrap();
        assert_eq!(serial.decode::<crate::devices::legacy::serial::SerialRegs>().unwrap().lcr, 3);
        // A byte changed after writing: the checksum says so.
        let text = String::from_utf8(corpus("vsock-rng-devices")).unwrap();
        let damaged = text.replacen("\"mem_size\":67108864", "\"mem_size\":67108865", 1);
        assert_ne!(damaged, text);
        let e = SnapshotFile::parse("s", damaged.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("checksum"), "{e}");
    }
}
