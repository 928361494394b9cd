//! The PCI layer without KVM: config mechanisms, BAR moves, the ECAM shadow.

use super::cf8::Cf8Device;
use super::config::{BarKind, BarSpec, BAR0, COMMAND};
use super::ecam::EcamShadow;
use super::ecam_device::EcamDevice;
use super::{host_bridge, EcamMode, PciFunction, PciRoot};
use crate::bus::{BusDevice, BusSet, DeviceId, MmioAddress, PioAddress, SharedBuses};
use crate::ioeventfd::{IoeventfdKey, IoeventfdLimits, IoeventfdRegistry};
use crate::testing::{two_bar_function, FakeKvm, ScratchDevice};
use std::sync::Arc;
use vmm_sys_util::eventfd::EventFd;

const ECAM: u64 = 0xe000_0000;

struct Rig {
    kvm: Arc<FakeKvm>,
    buses: Arc<SharedBuses>,
    ioeventfds: Arc<IoeventfdRegistry>,
    root: Arc<PciRoot>,
}

fn scratch_function(side_effects: bool) -> PciFunction {
    two_bar_function(side_effects, 0xd000_0000, 0x510)
}

fn rig(mode: EcamMode) -> Rig {
    let kvm = Arc::new(FakeKvm::default());
    let buses = Arc::new(SharedBuses::new(BusSet::default()));
    let ioeventfds = Arc::new(IoeventfdRegistry::new(kvm.clone(), IoeventfdLimits::default()));
    let shadow = EcamShadow::new(kvm.clone(), ECAM, 1..129).unwrap();
    let root = Arc::new(
        PciRoot::new(
            buses.clone(),
            ioeventfds.clone(),
            shadow,
            mode,
            crate::layout::MemoryMap::new(256 << 20).unwrap().pci_windows(),
        )
        .unwrap(),
    );
    root.add(0, 0, host_bridge()).unwrap();
    root.add(1, 0, scratch_function(false)).unwrap();
    Rig { kvm, buses, ioeventfds, root }
}

fn cf8_read(cf8: &Cf8Device, address: u32, lane: u64, len: usize) -> u32 {
    cf8.write(0, &address.to_le_bytes());
    let mut data = [0u8; 4];
    cf8.read(4 + lane, &mut data[..len]);
    u32::from_le_bytes(data)
}

#[test]
fn mechanism_one_reads_every_size_and_lane() {
    let r = rig(EcamMode::Trapped);
    let cf8 = Cf8Device::new(&r.root);
    let dev1 = 0x8000_0000 | (1 << 11);
    assert_eq!(cf8_read(&cf8, dev1, 0, 4), 0x0d00_e1e5);
    assert_eq!(cf8_read(&cf8, dev1, 2, 2), 0x0d00);
    assert_eq!(cf8_read(&cf8, dev1, 1, 1), 0xe1);
    assert_eq!(cf8_read(&cf8, dev1 | 0x10, 0, 4), 0xd000_0000, "BAR0");
    // Enable bit clear, another bus, a missing function: all-ones.
    assert_eq!(cf8_read(&cf8, 1 << 11, 0, 4), 0xffff_ffff);
    assert_eq!(cf8_read(&cf8, 0x8001_0000, 0, 4), 0xffff_ffff);
    assert_eq!(cf8_read(&cf8, 0x8000_0000 | (7 << 11), 0, 4), 0xffff_ffff);
    // The latch reads back (low bits cleared); byte access to it is not the latch.
    cf8.write(0, &0x8000_0803u32.to_le_bytes());
    let mut latch = [0u8; 4];
    cf8.read(0, &mut latch);
    assert_eq!(u32::from_le_bytes(latch), 0x8000_0800);
    let mut byte = [0u8; 1];
    cf8.read(1, &mut byte);
    assert_eq!(byte, [0xff]);
    // The latch's low bits pick the register byte, as under QEMU.
    assert_eq!(cf8_read(&cf8, dev1 | 2, 0, 2), 0x0d00, "device ID through 0xCF8 = ...|2");
}

#[test]
fn ecam_and_cf8_see_the_same_bytes() {
    let r = rig(EcamMode::Trapped);
    let (cf8, ecam) = (Cf8Device::new(&r.root), EcamDevice::new(&r.root));
    for index in [0usize, 8, 16] {
        for reg in (0..256).step_by(4) {
            let mut by_ecam = [0u8; 4];
            ecam.read((index * 4096 + reg) as u64, &mut by_ecam);
            let by_cf8 = cf8_read(&cf8, 0x8000_0000 | (index as u32) << 8 | reg as u32, 0, 4);
            assert_eq!(u32::from_le_bytes(by_ecam), by_cf8, "function {index} reg {reg:#x}");
        }
    }
    // An 8-byte read, and one that crosses into the next function's page.
    let mut wide = [0u8; 8];
    ecam.read(8 * 4096, &mut wide);
    assert_eq!(&wide[..4], &0x0d00_e1e5u32.to_le_bytes());
    ecam.read(8 * 4096 + 4092, &mut wide);
    assert_eq!(wide, [0xff; 8]);
}

#[test]
fn moving_a_bar_moves_its_bus_range_and_ioeventfds() {
    let r = rig(EcamMode::Trapped);
    let ecam = EcamDevice::new(&r.root);
    let (buses, _) = r.buses.snapshot();
    assert!(buses.mmio.lookup(MmioAddress(0xd000_0000), 4).is_some());
    assert!(buses.pio.lookup(PioAddress(0x510), 4).is_some());
    let fd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    r.ioeventfds.register(IoeventfdKey::mmio(0xd000_0000, 4, None), &fd).unwrap();

    ecam.write(8 * 4096 + BAR0 as u64, &0xc100_0000u32.to_le_bytes());
    let (buses, _) = r.buses.snapshot();
    assert!(buses.mmio.lookup(MmioAddress(0xd000_0000), 4).is_none());
    assert_eq!(buses.mmio.lookup(MmioAddress(0xc100_0008), 8).unwrap().1, 8);
    assert!(r.ioeventfds.contains(&IoeventfdKey::mmio(0xc100_0000, 4, None)));
    assert!(!r.ioeventfds.contains(&IoeventfdKey::mmio(0xd000_0000, 4, None)));

    // Decode off takes both BARs off the bus; on puts them back where they are.
    ecam.write(8 * 4096 + COMMAND as u64, &[0, 0]);
    let (buses, _) = r.buses.snapshot();
    assert!(
        buses.mmio.lookup(MmioAddress(0xc100_0000), 4).is_none() && buses.pio.lookup(PioAddress(0x510), 1).is_none()
    );
    ecam.write(8 * 4096 + COMMAND as u64, &[3, 0]);
    assert_eq!(r.root.bar_mapping(8, 0), Some(0xc100_0000));
    assert_eq!(r.root.bar_mapping(8, 1), Some(0x510));
}

#[test]
fn a_bars_ioeventfds_follow_its_decode_and_placement() {
    let r = rig(EcamMode::Trapped);
    let ecam = EcamDevice::new(&r.root);
    let fd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let function =
        two_bar_function(false, 0xc000_0000, 0x520).with_ioeventfds(0, vec![(IoeventfdKey::mmio(0x10, 0, None), fd)]);
    r.root.add(2, 0, function).unwrap();
    let live = |addr| r.ioeventfds.contains(&IoeventfdKey::mmio(addr, 0, None));
    assert!(live(0xc000_0010), "registered where the BAR was placed");

    // Decode off: the kick address is gone from KVM, and comes back with decode.
    ecam.write(16 * 4096 + COMMAND as u64, &[0, 0]);
    assert!(!live(0xc000_0010));
    assert!(r.ioeventfds.is_empty());
    ecam.write(16 * 4096 + COMMAND as u64, &[3, 0]);
    assert!(live(0xc000_0010));

    // A BAR that cannot be placed (over 00:01.0's BAR0) registers nothing, and the old
    // address is free for another BAR's ioeventfd.
    ecam.write(16 * 4096 + BAR0 as u64, &0xd000_0000u32.to_le_bytes());
    assert_eq!(r.root.bar_mapping(16, 0), None);
    assert!(r.ioeventfds.is_empty());
    let other = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    r.ioeventfds.register(IoeventfdKey::mmio(0xc000_0010, 0, None), &other).unwrap();
    r.ioeventfds.unregister(IoeventfdKey::mmio(0xc000_0010, 0, None)).unwrap();
    ecam.write(16 * 4096 + BAR0 as u64, &0xc200_0000u32.to_le_bytes());
    assert!(live(0xc200_0010));
}

#[test]
fn bars_outside_their_window_or_overlapping_stay_off_the_bus() {
    let r = rig(EcamMode::Trapped);
    let ecam = EcamDevice::new(&r.root);
    r.buses.update(|b| b.pio.insert(PioAddress(0x600), 8, DeviceId(9), Arc::new(ScratchDevice::default()))).unwrap();
    for (bar, value, what) in [
        (1u64, 0x600u32, "overlaps another device"),
        (1, 0x100, "below the I/O window"),
        (0, 0x1000_0000, "in RAM"),
        (0, 0xe000_0000, "over the ECAM window"),
        (0, 0xffff_ffff, "the sizing pattern with decode on"),
    ] {
        ecam.write(8 * 4096 + BAR0 as u64 + 4 * bar, &value.to_le_bytes());
        assert_eq!(r.root.bar_mapping(8, bar as usize), None, "{what}");
    }
    // Sizing still reads back the mask.
    let mut data = [0u8; 4];
    ecam.read(8 * 4096 + BAR0 as u64, &mut data);
    assert_eq!(u32::from_le_bytes(data), 0xffff_f000);
}

#[test]
fn the_mapped_window_tracks_writes_before_the_next_read() {
    let r = rig(EcamMode::Mapped);
    let ecam = EcamDevice::new(&r.root);
    let shadow_page = |index: usize| {
        let mut page = [0u8; 4096];
        let snapshot = r.root.config_snapshot(index);
        page.copy_from_slice(&snapshot.map(|s| s.to_vec()).unwrap_or(vec![0xff; 4096]));
        page
    };
    // One slot covers the whole window (no function with read side effects).
    assert_eq!(*r.kvm.slots.lock().unwrap(), vec![(1, ECAM, 256 * 4096)]);
    ecam.write(8 * 4096 + BAR0 as u64, &[0xff; 4]);
    let page = r.root.with_shadow_page(8);
    assert_eq!(&page[BAR0..BAR0 + 4], &0xffff_f000u32.to_le_bytes(), "sizing visible in the shadow at once");
    assert_eq!(page, shadow_page(8).to_vec());
    assert_eq!(r.root.with_shadow_page(5), vec![0xff; 4096], "a missing function reads all-ones");
    r.root.set_ecam_mode(EcamMode::Trapped).unwrap();
    assert!(r.kvm.slots.lock().unwrap().is_empty());
}

#[test]
fn a_function_with_read_side_effects_keeps_its_page_trapped() {
    let r = rig(EcamMode::Mapped);
    r.root
        .add(2, 0, {
            let mut f = scratch_function(true);
            f.config.set_bar(0, BarSpec { kind: BarKind::Memory32, size: 0x1000 }, 0xd000_1000);
            f.config.set_bar(1, BarSpec { kind: BarKind::Io, size: 16 }, 0x520);
            f
        })
        .unwrap();
    let mut slots = r.kvm.slots.lock().unwrap().clone();
    slots.sort();
    assert_eq!(slots, vec![(1, ECAM, 16 * 4096), (2, ECAM + 17 * 4096, 239 * 4096)], "page 16 (00:02.0) left out");
}
