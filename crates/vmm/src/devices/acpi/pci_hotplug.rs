//! ACPI PCI hotplug, as QEMU's and Cloud Hypervisor's guests know it: a controller of
//! three registers at a fixed port range, which the DSDT's methods read and write, and one
//! slot object per device number under `\_SB_.PCI0` with `_SUN` and `_EJ0`. The VMM sets
//! a slot's bit in PCIU (plugged) or PCID (please eject) and raises the controller's GED
//! line; the GED's `_EVT` runs PSCN, which reads both registers (a read clears them) and
//! notifies each slot named: Device Check (1) for a new device, Eject Request (3) for one
//! to go. The guest's hotplug driver (Linux's acpiphp) scans the slot, or unbinds the
//! driver and calls the slot's `_EJ0`, which writes the slot's bit to B0EJ: only then
//! does the VMM remove the device. An eject the VMM did not ask for is ignored (a guest
//! does not unplug devices by itself).

use crate::bus::{read_register, BusDevice};
use acpi_tables::aml::{
    self, Acquire, And, Arg, EISAName, FieldAccessType, FieldEntry, FieldLockRule, FieldUpdateRule, If, Method,
    MethodCall, Name, Notify, OpRegion, OpRegionSpace, Path, Release, ResourceTemplate, Return, Scope, ShiftLeft,
};
use acpi_tables::Aml;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};
use vmm_sys_util::eventfd::EventFd;

/// The controller's registers: PCIU (read: slots plugged since the last read), PCID
/// (read: slots asked to eject since the last read), B0EJ (write: the slots the guest
/// ejects), each 32 bits, one bit per device number.
pub const REGISTERS_LEN: u64 = 16;
const PCIU: u64 = 0;
const PCID: u64 = 4;
const B0EJ: u64 = 8;
/// Where the controller is in the DSDT, and the method the GED calls on its line.
pub const PATH: &str = "\\_SB_.PHPR";
pub const SCAN: &str = "\\_SB_.PHPR.PSCN";
/// Device numbers the guest gets slot objects for (0 is the host bridge).
const SLOTS: std::ops::Range<u8> = 1..32;

#[derive(Default)]
struct Bits {
    up: u32,
    down: u32,
    /// Ejects the VMM asked for and waits on.
    asked: u32,
    /// Of those, the ones the guest carried out.
    ejected: u32,
    /// Whether an eject nobody asked for was logged already.
    warned: bool,
}

pub struct PciHotplug {
    port: u16,
    line: u32,
    irq: EventFd,
    bits: Mutex<Bits>,
    ejected: Condvar,
}

impl PciHotplug {
    pub fn new(port: u16, line: u32, irq: EventFd) -> Self {
        PciHotplug { port, line, irq, bits: Mutex::default(), ejected: Condvar::new() }
    }

    pub fn line(&self) -> u32 {
        self.line
    }

    fn raise(&self) {
        if let Err(e) = self.irq.write(1) {
            tracing::warn!("PCI hotplug: the GED's line not raised: {e}");
        }
    }

    /// Tells the guest a device is in slot `slot`.
    pub fn plugged(&self, slot: u8) {
        crate::sync::lock(&self.bits).up |= 1 << (slot & 31);
        self.raise();
    }

    /// Asks the guest to eject slot `slot` and waits up to `timeout` for its `_EJ0`.
    /// True if the guest ejected it; false (the request withdrawn) if not.
    pub fn eject(&self, slot: u8, timeout: Duration) -> bool {
        let bit = 1u32 << (slot & 31);
        {
            let mut bits = crate::sync::lock(&self.bits);
            bits.down |= bit;
            bits.asked |= bit;
            bits.ejected &= !bit;
        }
        self.raise();
        let end = Instant::now() + timeout;
        let mut bits = crate::sync::lock(&self.bits);
        while bits.ejected & bit == 0 {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            bits = self.ejected.wait_timeout(bits, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        let done = bits.ejected & bit != 0;
        bits.asked &= !bit;
        bits.ejected &= !bit;
        bits.down &= !bit;
        done
    }

    /// The controller's part of the DSDT: itself, its slot objects under PCI0 and the
    /// methods that notify them.
    pub fn aml(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.controller_aml(&mut v);
        slots_aml(&mut v);
        v
    }

    fn controller_aml(&self, sink: &mut Vec<u8>) {
        let (port, len) = (u32::from(self.port), REGISTERS_LEN as u32);
        let region = OpRegion::new("PCST".into(), OpRegionSpace::SystemIO, &port, &len);
        let field = aml::Field::new(
            "PCST".into(),
            FieldAccessType::DWord,
            FieldLockRule::NoLock,
            FieldUpdateRule::WriteAsZeroes,
            vec![FieldEntry::Named(*b"PCIU", 32), FieldEntry::Named(*b"PCID", 32), FieldEntry::Named(*b"B0EJ", 32)],
        );
        let io = aml::IO::new(self.port, self.port, 1, REGISTERS_LEN as u8);
        let crs = ResourceTemplate::new(vec![&io]);
        // PCEJ (slot): the guest's eject of that slot.
        let (acquire, release) = (Acquire::new("BLCK".into(), 0xffff), Release::new("BLCK".into()));
        let b0ej = Path::new("B0EJ");
        let eject_bit = ShiftLeft::new(&b0ej, &aml::ONE, &Arg(0));
        let ret = Return::new(&aml::ZERO);
        let pcej = Method::new("PCEJ".into(), 1, true, vec![&acquire, &eject_bit, &release, &ret]);
        // PSCN: what the GED runs on the controller's line.
        let pcnt = MethodCall::new("\\_SB_.PCI0.PCNT".into(), vec![]);
        let pscn = Method::new("PSCN".into(), 0, true, vec![&acquire, &pcnt, &release]);
        aml::Device::new(
            PATH.into(),
            vec![
                &Name::new("_HID".into(), &EISAName::new("PNP0A06")),
                &Name::new("_UID".into(), &"PCI Hotplug Controller"),
                &aml::Mutex::new("BLCK".into(), 0),
                &Name::new("_CRS".into(), &crs),
                &region,
                &field,
                &pcej,
                &pscn,
            ],
        )
        .to_aml_bytes(sink);
    }
}

/// Under PCI0: a slot object per device number (`_ADR`, `_SUN`, `_EJ0` calling PCEJ),
/// DVNT (bitmap, event) notifying each slot whose bit is set, and PCNT notifying the
/// plugged slots with Device Check and those to eject with Eject Request.
fn slots_aml(sink: &mut Vec<u8>) {
    let names: Vec<String> = SLOTS.map(|n| format!("S{n:02X}_")).collect();
    let sun: Vec<u32> = SLOTS.map(u32::from).collect();
    let adr: Vec<u32> = SLOTS.map(|n| u32::from(n) << 16).collect();
    let sun_path = Path::new("_SUN");
    let ej0_call = MethodCall::new("\\_SB_.PHPR.PCEJ".into(), vec![&sun_path]);
    let ej0 = Method::new("_EJ0".into(), 1, false, vec![&ej0_call]);
    let adr_names: Vec<Name> = adr.iter().map(|a| Name::new("_ADR".into(), a)).collect();
    let sun_names: Vec<Name> = sun.iter().map(|s| Name::new("_SUN".into(), s)).collect();
    let devices: Vec<aml::Device> = names
        .iter()
        .zip(adr_names.iter().zip(&sun_names))
        .map(|(name, (adr, sun))| aml::Device::new(name[..4].into(), vec![adr, sun, &ej0]))
        .collect();
    let masks: Vec<u32> = SLOTS.map(|n| 1u32 << n).collect();
    let tests: Vec<And> = masks.iter().map(|m| And::new(&aml::ZERO, &Arg(0), m)).collect();
    let paths: Vec<Path> = names.iter().map(|n| Path::new(&n[..4])).collect();
    let notifies: Vec<Notify> = paths.iter().map(|p| Notify::new(p, &Arg(1))).collect();
    let ifs: Vec<If> = tests.iter().zip(&notifies).map(|(t, n)| If::new(t, vec![n])).collect();
    let dvnt = Method::new("DVNT".into(), 2, false, ifs.iter().map(|i| i as &dyn Aml).collect());
    let (pciu, pcid) = (Path::new("\\_SB_.PHPR.PCIU"), Path::new("\\_SB_.PHPR.PCID"));
    let (up, down) =
        (MethodCall::new("DVNT".into(), vec![&pciu, &1u8]), MethodCall::new("DVNT".into(), vec![&pcid, &3u8]));
    let pcnt = Method::new("PCNT".into(), 0, false, vec![&up, &down]);
    let mut children: Vec<&dyn Aml> = devices.iter().map(|d| d as &dyn Aml).collect();
    children.push(&dvnt);
    children.push(&pcnt);
    Scope::new("\\_SB_.PCI0".into(), children).to_aml_bytes(sink);
}

impl BusDevice for PciHotplug {
    /// PCIU and PCID read and clear (a whole 32-bit read); anything else reads zero.
    fn read(&self, offset: u64, data: &mut [u8]) {
        let mut bits = crate::sync::lock(&self.bits);
        let value = match (offset, data.len()) {
            (PCIU, 4) => std::mem::take(&mut bits.up),
            (PCID, 4) => std::mem::take(&mut bits.down),
            _ => 0,
        };
        read_register(data, u64::from(value));
    }

    /// B0EJ: the slots the guest ejected; only those the VMM asked for count.
    fn write(&self, offset: u64, data: &[u8]) {
        if offset != B0EJ || data.len() != 4 {
            return;
        }
        let value = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let mut bits = crate::sync::lock(&self.bits);
        let unasked = value & !bits.asked;
        if unasked != 0 && !bits.warned {
            bits.warned = true;
            tracing::warn!("PCI hotplug: the guest ejected slots {unasked:#x} the VMM did not ask for: ignored");
        }
        bits.ejected |= value & bits.asked;
        self.ejected.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller() -> PciHotplug {
        PciHotplug::new(0x620, 9, EventFd::new(libc::EFD_NONBLOCK).unwrap())
    }

    fn read(c: &PciHotplug, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        c.read(offset, &mut data);
        u32::from_le_bytes(data)
    }

    #[test]
    fn a_plug_raises_the_line_and_reads_once() {
        let c = controller();
        c.plugged(3);
        assert_eq!(c.irq.read().unwrap(), 1, "the GED's line raised");
        assert_eq!(read(&c, PCIU), 1 << 3);
        assert_eq!(read(&c, PCIU), 0, "a read clears it");
        assert_eq!(read(&c, PCID), 0);
    }

    #[test]
    fn only_an_asked_eject_counts_and_an_unanswered_one_is_withdrawn() {
        let c = std::sync::Arc::new(controller());
        // Nobody asked: ignored.
        c.write(B0EJ, &(1u32 << 4).to_le_bytes());
        assert!(!c.eject(4, Duration::from_millis(50)), "the earlier write does not count");
        assert_eq!(read(&c, PCID), 0, "the request withdrawn");
        let guest = {
            let c = c.clone();
            std::thread::spawn(move || {
                // The guest's _EJ0 once it saw the request (PCID read).
                while read(&c, PCID) & 1 << 4 == 0 {
                    std::thread::yield_now();
                }
                c.write(B0EJ, &(1u32 << 4).to_le_bytes());
            })
        };
        assert!(c.eject(4, Duration::from_secs(10)));
        guest.join().unwrap();
    }

    #[test]
    fn the_dsdt_part_has_the_controller_and_a_slot_per_device_number() {
        let aml = controller().aml();
        let has = |b: &[u8]| aml.windows(b.len()).any(|w| w == b);
        assert!(has(b"PHPR") && has(b"PCEJ") && has(b"PSCN") && has(b"PCNT") && has(b"DVNT"));
        assert!(has(b"S01_") && has(b"S1F_") && !has(b"S00_") && !has(b"S20_"));
        assert!(has(b"_EJ0") && has(b"_SUN"));
        // OperationRegion (PCST, SystemIO, 0x620, 16).
        assert!(has(&[0x5b, 0x80, b'P', b'C', b'S', b'T', 1, 0x0b, 0x20, 0x06, 0x0a, 0x10]), "{aml:x?}");
    }
}
