//! Exit accounting: how many exits of each kind, how long the VMM spent on them, and
//! which device each one reached. One `ExitStats` per vCPU, filled with no allocation.

use crate::bus::DeviceId;
use histogram::{bucket, midpoint, Histogram, BUCKETS};

mod histogram;

/// The TSC: the cheapest clock there is, for timing the VMM's share of an exit.
#[inline]
pub fn cycles() -> u64 {
    // SAFETY: rdtsc only reads the time-stamp counter; it has no memory effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// What the VMM completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completed {
    /// `int3`: #BP injected after RIP was moved past it.
    Int3,
    /// `int n`: vector n injected after RIP was moved past it (kvm-unit-tests raise
    /// interrupts this way at CPL0).
    IntN,
    /// `clac`/`stac`: EFLAGS.AC.
    ClacStac,
    Popcnt,
    /// `fwait`, `lfence`, `sfence`, `mfence`: the exit itself serialized everything.
    Fence,
    /// `rdrand`/`rdseed`, from the host's random source.
    Rdrand,
    /// `ldmxcsr`/`stmxcsr`, through the vCPU's FPU state.
    Mxcsr,
    /// Moves between XMM registers and general registers or memory.
    SseMove,
    /// Other SSE instructions, run on the host CPU with the guest's XMM state (see sse.rs).
    SseOnHost,
    /// `syscall` from CPL3 that the host left at CPL3: the switch to CPL0 (see syscall.rs).
    Syscall,
    /// `sysretq`: back to CPL3 at RCX with R11's flags.
    Sysret,
    /// `vmcall`/`vmmcall` at CPL0, answered as an unknown hypercall (see nested_exits.rs).
    Hypercall,
}

impl Completed {
    pub const ALL: [Completed; 12] = [
        Completed::Int3,
        Completed::IntN,
        Completed::ClacStac,
        Completed::Popcnt,
        Completed::Fence,
        Completed::Rdrand,
        Completed::Mxcsr,
        Completed::SseMove,
        Completed::SseOnHost,
        Completed::Syscall,
        Completed::Sysret,
        Completed::Hypercall,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Completed::Int3 => "int3",
            Completed::IntN => "int n",
            Completed::ClacStac => "clac/stac",
            Completed::Popcnt => "popcnt",
            Completed::Fence => "fwait/fence/clwb",
            Completed::Rdrand => "rdrand/rdseed",
            Completed::Mxcsr => "ldmxcsr/stmxcsr",
            Completed::SseMove => "sse-move",
            Completed::SseOnHost => "sse-on-host",
            Completed::Syscall => "syscall-cpl-switch",
            Completed::Sysret => "sysret",
            Completed::Hypercall => "vmcall",
        }
    }
}

/// What made `KVM_RUN` return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    IoIn,
    IoOut,
    MmioRead,
    MmioWrite,
    Intr,
    SystemEvent,
    /// An emulation failure the VMM completed itself (the others end the run).
    InternalError,
    /// A trapped MSR write (the guest's system-call entry, LSTAR).
    WrMsr,
    /// A breakpoint the VMM set (on that entry).
    Debug,
}

impl ExitKind {
    pub const ALL: [ExitKind; 9] = [
        ExitKind::IoIn,
        ExitKind::IoOut,
        ExitKind::MmioRead,
        ExitKind::MmioWrite,
        ExitKind::Intr,
        ExitKind::SystemEvent,
        ExitKind::InternalError,
        ExitKind::WrMsr,
        ExitKind::Debug,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ExitKind::IoIn => "io_in",
            ExitKind::IoOut => "io_out",
            ExitKind::MmioRead => "mmio_read",
            ExitKind::MmioWrite => "mmio_write",
            ExitKind::Intr => "intr",
            ExitKind::SystemEvent => "system_event",
            ExitKind::InternalError => "internal_error",
            ExitKind::WrMsr => "wrmsr",
            ExitKind::Debug => "debug",
        }
    }
}

/// Reads and writes that reached one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounts {
    pub reads: u64,
    pub writes: u64,
}

/// Counters for one vCPU.
#[derive(Clone)]
pub struct ExitStats {
    pub count: [u64; ExitKind::ALL.len()],
    /// TSC cycles spent in the VMM, from `KVM_RUN` returning to the next `KVM_RUN`.
    pub vmm_cycles: [u64; ExitKind::ALL.len()],
    /// A row of `BUCKETS` counters per exit kind (VMM time per exit, histogram.rs's scale).
    histogram: Histogram,
    /// Indexed by [`DeviceId`]; sized when the vCPU is built.
    pub devices: Vec<DeviceCounts>,
    pub unclaimed_pio: DeviceCounts,
    pub unclaimed_mmio: DeviceCounts,
    /// Instructions KVM could not emulate that the VMM completed, by [`Completed`] kind.
    pub completed: [u64; Completed::ALL.len()],
}

impl ExitStats {
    pub fn new(devices: usize) -> Self {
        ExitStats {
            count: [0; ExitKind::ALL.len()],
            vmm_cycles: [0; ExitKind::ALL.len()],
            histogram: Histogram::new(ExitKind::ALL.len(), BUCKETS),
            devices: vec![DeviceCounts::default(); devices],
            unclaimed_pio: DeviceCounts::default(),
            unclaimed_mmio: DeviceCounts::default(),
            completed: [0; Completed::ALL.len()],
        }
    }

    /// Books one exit and the cycles the VMM spent on it.
    #[inline]
    pub fn record(&mut self, kind: ExitKind, cycles: u64) {
        let k = kind as usize;
        self.count[k] += 1;
        self.vmm_cycles[k] += cycles;
        self.histogram.row_mut(k)[bucket(cycles)] += 1;
    }

    #[inline]
    pub fn device(&mut self, id: DeviceId, write: bool) {
        if let Some(c) = self.devices.get_mut(id.0) {
            if write {
                c.writes += 1
            } else {
                c.reads += 1
            }
        }
    }

    pub fn total_exits(&self) -> u64 {
        self.count.iter().sum()
    }

    pub fn exits(&self, kind: ExitKind) -> u64 {
        self.count[kind as usize]
    }

    /// Port and MMIO exits: the device accesses that reached userspace.
    pub fn io_exits(&self) -> u64 {
        [ExitKind::IoIn, ExitKind::IoOut, ExitKind::MmioRead, ExitKind::MmioWrite].iter().map(|&k| self.exits(k)).sum()
    }

    /// Median VMM cycles per exit over `kinds` (bucket midpoint), `None` without exits.
    pub fn median_cycles(&self, kinds: &[ExitKind]) -> Option<f64> {
        let total: u64 = kinds.iter().map(|&k| self.count[k as usize]).sum();
        if total == 0 {
            return None;
        }
        let mut seen = 0u64;
        for b in 0..BUCKETS {
            seen += kinds.iter().map(|&k| u64::from(self.histogram.row(k as usize)[b])).sum::<u64>();
            if seen * 2 >= total {
                return Some(midpoint(b));
            }
        }
        None
    }

    /// Adds another vCPU's counters into these.
    pub fn merge(&mut self, other: &ExitStats) {
        for k in 0..self.count.len() {
            self.count[k] += other.count[k];
            self.vmm_cycles[k] += other.vmm_cycles[k];
        }
        self.histogram.add(&other.histogram);
        if self.devices.len() < other.devices.len() {
            self.devices.resize(other.devices.len(), DeviceCounts::default());
        }
        for (mine, theirs) in self.devices.iter_mut().zip(&other.devices) {
            mine.reads += theirs.reads;
            mine.writes += theirs.writes;
        }
        for (mine, theirs) in
            [(&mut self.unclaimed_pio, &other.unclaimed_pio), (&mut self.unclaimed_mmio, &other.unclaimed_mmio)]
        {
            mine.reads += theirs.reads;
            mine.writes += theirs.writes;
        }
        for (mine, theirs) in self.completed.iter_mut().zip(other.completed) {
            *mine += theirs;
        }
    }

    /// Makes `self` equal to `other`, writing only what differs: a histogram bucket never
    /// hit stays an untouched zero page in both, so a published copy costs no more memory
    /// than the buckets the vCPU used.
    pub fn copy_from(&mut self, other: &ExitStats) {
        self.count = other.count;
        self.vmm_cycles = other.vmm_cycles;
        self.devices.clone_from(&other.devices);
        self.unclaimed_pio = other.unclaimed_pio;
        self.unclaimed_mmio = other.unclaimed_mmio;
        self.completed = other.completed;
        self.histogram.copy_from(&other.histogram);
    }

    /// Clears everything (the lab measures one window at a time).
    pub fn reset(&mut self) {
        *self = ExitStats::new(self.devices.len());
    }
}

/// Each vCPU's counters as of its last publication, for readers while the VM runs (the
/// API's `GET /exits`). A vCPU publishes at most every [`LiveStats::PERIOD_CYCLES`] TSC
/// cycles, between two exits, copying into a buffer it already has (no allocation), and
/// skips a turn when a reader holds the lock rather than wait for it.
pub struct LiveStats {
    vcpus: Vec<std::sync::Mutex<ExitStats>>,
}

impl LiveStats {
    /// About 50 ms at 2 GHz.
    pub const PERIOD_CYCLES: u64 = 100_000_000;

    pub fn new(vcpus: usize, devices: usize) -> Self {
        LiveStats { vcpus: (0..vcpus).map(|_| std::sync::Mutex::new(ExitStats::new(devices))).collect() }
    }

    /// vCPU `id` publishes `stats`; false if a reader held the lock (try again later).
    pub fn publish(&self, id: usize, stats: &ExitStats) -> bool {
        let Some(slot) = self.vcpus.get(id) else { return true };
        match slot.try_lock() {
            Ok(mut mine) => {
                mine.copy_from(stats);
                true
            }
            Err(_) => false,
        }
    }

    /// Every vCPU's last published counters, by id.
    pub fn snapshot(&self) -> Vec<ExitStats> {
        self.vcpus.iter().map(|v| crate::sync::lock(v).clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_merge() {
        let mut a = ExitStats::new(2);
        for c in [100, 200, 300] {
            a.record(ExitKind::IoOut, c);
        }
        a.record(ExitKind::MmioWrite, 10_000_000);
        let m = a.median_cycles(&[ExitKind::IoOut]).unwrap();
        assert!((200.0..=208.0).contains(&m), "{m}");
        assert_eq!(a.median_cycles(&[ExitKind::Intr]), None);
        let mut b = ExitStats::new(1);
        b.device(DeviceId(0), true);
        b.device(DeviceId(7), true); // unknown ids are ignored, not a panic
        b.merge(&a);
        assert_eq!(b.exits(ExitKind::IoOut), 3);
        assert_eq!(b.devices.len(), 2);
        assert_eq!(b.devices[0].writes, 1);
        assert_eq!(b.total_exits(), 4);
    }

    #[test]
    fn a_published_copy_equals_its_source_after_a_reset_too() {
        let live = LiveStats::new(1, 2);
        let mut a = ExitStats::new(2);
        for c in [100, 200, 300, 5000] {
            a.record(ExitKind::IoIn, c);
        }
        a.device(DeviceId(1), false);
        assert!(live.publish(0, &a));
        let copy = &live.snapshot()[0];
        assert_eq!(copy.exits(ExitKind::IoIn), 4);
        assert_eq!(copy.median_cycles(&[ExitKind::IoIn]), a.median_cycles(&[ExitKind::IoIn]));
        assert_eq!(copy.devices[1].reads, 1);
        a.reset();
        a.record(ExitKind::IoIn, 40);
        assert!(live.publish(0, &a));
        let copy = &live.snapshot()[0];
        assert_eq!(copy.exits(ExitKind::IoIn), 1, "a reset is published too");
        assert_eq!(copy.median_cycles(&[ExitKind::IoIn]), a.median_cycles(&[ExitKind::IoIn]), "no stale bucket");
    }
}
