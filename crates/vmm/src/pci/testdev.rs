//! QEMU's PCI test device (1b36:0005), which kvm-unit-tests' `x86/vmexit` uses to time
//! guest writes that exit to userspace against writes KVM turns into an eventfd signal.
//!
//! BAR0 (4 KiB memory) and BAR1 (256 ports) each offer three tests: no eventfd, a wildcard
//! eventfd, and an eventfd that matches one value. The guest selects test n of a BAR by
//! writing n to the BAR's byte 0; the BAR then reads back a header (the test's number,
//! access width, the offset to write to, the value, how many writes reached the VMM, and
//! the test's name), and the VMM registers that test's ioeventfd at the offset. A write
//! that reaches the VMM at the offset counts (for the matching test, only the value).
//! As in QEMU, nothing reads the eventfds: the guest's write is all that is measured.

use super::config::{BarKind, BarSpec, ConfigSpace, PciIds, COMMAND, COMMAND_IO, COMMAND_MEMORY};
use super::{PciFunction, PciRoot};
use crate::bus::{BusDevice, DeviceId};
use crate::ioeventfd::IoeventfdKey;
use std::sync::{Arc, Mutex, Weak};
use vmm_sys_util::eventfd::EventFd;

const VENDOR_REDHAT: u16 = 0x1b36;
const DEVICE_TEST: u16 = 0x0005;
/// Each BAR is twice its test area: headers below `AREA`, test offsets from `AREA` on.
const MEM_AREA: u64 = 2048;
const IO_AREA: u64 = 128;
const TESTS_PER_BAR: usize = 3;
const DATAMATCH: u8 = 0xfa;
const NOMATCH: u8 = 0xce;
// Header layout: test (1), width (1), pad (2), offset (4), data (1), pad (3), count (4), name.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Eventfd {
    None,
    Wildcard,
    Datamatch,
}

const KINDS: [(Eventfd, &str); TESTS_PER_BAR] =
    [(Eventfd::None, "no-eventfd"), (Eventfd::Wildcard, "wildcard-eventfd"), (Eventfd::Datamatch, "datamatch-eventfd")];

/// One test: which BAR (0 memory, 1 I/O) and which kind.
#[derive(Clone, Copy)]
struct Test {
    bar: usize,
    kind: Eventfd,
    /// Global number: memory tests 0-2, I/O tests 3-5.
    number: usize,
}

impl Test {
    fn offset(&self) -> u64 {
        (if self.bar == 0 { MEM_AREA } else { IO_AREA }) + self.number as u64
    }

    fn data(&self) -> u8 {
        if self.kind == Eventfd::Wildcard {
            NOMATCH
        } else {
            DATAMATCH
        }
    }

    fn header(&self, count: u32) -> Vec<u8> {
        let mut h = vec![self.number as u8, 1, 0, 0];
        h.extend_from_slice(&(self.offset() as u32).to_le_bytes());
        h.extend_from_slice(&[self.data(), 0, 0, 0]);
        h.extend_from_slice(&count.to_le_bytes());
        let space = if self.bar == 0 { "mmio" } else { "portio" };
        h.extend_from_slice(format!("{space}-{}", KINDS[self.number % TESTS_PER_BAR].1).as_bytes());
        h.push(0);
        h
    }

    fn ioeventfd(&self) -> Option<IoeventfdKey> {
        let datamatch = (self.kind == Eventfd::Datamatch).then_some(u64::from(DATAMATCH));
        match (self.kind, self.bar) {
            (Eventfd::None, _) => None,
            (_, 0) => Some(IoeventfdKey::mmio(self.offset(), 1, datamatch)),
            _ => Some(IoeventfdKey::pio(self.offset() as u16, 1, datamatch)),
        }
    }
}

struct State {
    /// The running test of each BAR and how many writes reached the VMM.
    current: [Option<(Test, u32)>; 2],
    /// Where the function sits, once plugged in.
    root: Option<(Weak<PciRoot>, usize)>,
}

/// The device; [`PciTestdev::pci_function`] makes its PCI function.
pub struct PciTestdev {
    state: Mutex<State>,
}

/// One BAR of the device on the bus.
struct TestdevBar {
    dev: Arc<PciTestdev>,
    bar: usize,
}

impl PciTestdev {
    pub fn new() -> Arc<Self> {
        Arc::new(PciTestdev { state: Mutex::new(State { current: [None, None], root: None }) })
    }

    /// The function with BAR0 (memory) at `mem` and BAR1 (I/O) at `io`; `ids` count their exits.
    pub fn pci_function(self: &Arc<Self>, ids: (DeviceId, DeviceId), mem: u64, io: u64) -> PciFunction {
        let mut config = ConfigSpace::new(PciIds {
            vendor: VENDOR_REDHAT,
            device: DEVICE_TEST,
            class: [0xff, 0x00, 0x00],
            revision: 0,
            subsystem_vendor: 0,
            subsystem: 0,
        });
        config.set_bar(0, Self::MEM_BAR, mem);
        config.set_bar(1, Self::IO_BAR, io);
        config.write(COMMAND, &(COMMAND_IO | COMMAND_MEMORY).to_le_bytes());
        let bar = |bar| Arc::new(TestdevBar { dev: self.clone(), bar }) as Arc<dyn BusDevice>;
        PciFunction::new("pci-testdev", config).with_bar(0, ids.0, bar(0)).with_bar(1, ids.1, bar(1))
    }

    pub const MEM_BAR: BarSpec = BarSpec { kind: BarKind::Memory32, size: 2 * MEM_AREA };
    pub const IO_BAR: BarSpec = BarSpec { kind: BarKind::Io, size: 2 * IO_AREA };

    /// Tells the device where it was plugged in, so it can place its tests' ioeventfds.
    pub fn attach(&self, root: &Arc<PciRoot>, index: usize) {
        self.lock().root = Some((Arc::downgrade(root), index));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Stops BAR `bar`'s test and starts test `n` of it (none if `n` is out of range).
    fn select(&self, bar: usize, n: u8) {
        let test = (usize::from(n) < TESTS_PER_BAR).then(|| {
            let number = bar * TESTS_PER_BAR + usize::from(n);
            Test { bar, kind: KINDS[usize::from(n)].0, number }
        });
        let root = {
            let mut state = self.lock();
            state.current[bar] = test.map(|t| (t, 0));
            state.root.clone()
        };
        let Some((root, index)) = root else { return };
        let Some(root) = root.upgrade() else { return };
        let ioeventfds = match test.and_then(|t| t.ioeventfd()).map(|k| (k, EventFd::new(libc::EFD_NONBLOCK))) {
            Some((key, Ok(fd))) => vec![(key, fd)],
            Some((_, Err(e))) => {
                tracing::warn!("pci-testdev: no eventfd for the test: {e}");
                Vec::new()
            }
            None => Vec::new(),
        };
        root.set_bar_ioeventfds(index, bar, ioeventfds);
    }
}

impl BusDevice for TestdevBar {
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let state = self.dev.lock();
        let Some((test, count)) = state.current[self.bar] else { return };
        let header = test.header(count);
        for (i, b) in data.iter_mut().enumerate() {
            *b = header.get(offset as usize + i).copied().unwrap_or(0);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        // Byte by byte, as QEMU's device takes accesses.
        for (i, &byte) in data.iter().enumerate() {
            let at = offset + i as u64;
            if at == 0 {
                self.dev.select(self.bar, byte);
                continue;
            }
            let mut state = self.dev.lock();
            if let Some((test, count)) = state.current[self.bar].as_mut() {
                let counts = test.kind == Eventfd::Wildcard || byte == test.data();
                if at == test.offset() && counts {
                    *count = count.wrapping_add(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COUNT_AT: usize = 12;
    const NAME_AT: usize = 16;

    fn read_header(bar: &TestdevBar) -> (u8, u8, u32, u8, u32, String) {
        let mut h = [0u8; 48];
        bar.read(0, &mut h);
        let name: Vec<u8> = h[NAME_AT..].iter().copied().take_while(|&b| b != 0).collect();
        let u32_at = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().unwrap());
        (h[0], h[1], u32_at(4), h[8], u32_at(COUNT_AT), String::from_utf8(name).unwrap())
    }

    #[test]
    fn tests_are_selected_by_writing_their_number_and_count_what_reaches_the_vmm() {
        let dev = PciTestdev::new();
        let (mem, io) = (TestdevBar { dev: dev.clone(), bar: 0 }, TestdevBar { dev: dev.clone(), bar: 1 });
        assert_eq!(read_header(&mem).0, 0, "no test: reads zero");
        io.write(0, &[2]);
        assert_eq!(read_header(&io), (5, 1, 128 + 5, DATAMATCH, 0, "portio-datamatch-eventfd".into()));
        io.write(128 + 5, &[DATAMATCH]);
        io.write(128 + 5, &[0x11]); // another value: not this test's
        io.write(128 + 4, &[DATAMATCH]); // another offset
        assert_eq!(read_header(&io).4, 1);
        mem.write(0, &[1]);
        assert_eq!(read_header(&mem).5, "mmio-wildcard-eventfd");
        mem.write(2048 + 1, &[0x77]);
        assert_eq!(read_header(&mem).4, 1, "a wildcard counts any value");
        mem.write(0, &[3]); // no such test: the BAR has none running
        assert_eq!(read_header(&mem).0, 0);
        assert_eq!(read_header(&io).4, 1, "the other BAR's test runs on");
    }
}
