//! The device manager on the fake KVM (crate::testing): what each attach asks of the VM,
//! where devices land, and a restore's checks, without /dev/kvm.

use super::*;
use crate::ioeventfd::IoeventfdKey;
use crate::memslots::Memslots;
use crate::pci::ecam::EcamPages;
use crate::persist::Persist;
use crate::testing::{FakeKvm, RecordingDevice};
use crate::virtio::mmio::{QUEUE_NOTIFY, WINDOW};
use vm_memory::GuestAddress;

/// Slots a machine's RAM would have taken first.
const RAM_SLOTS: u32 = 2;

pub(super) struct Built {
    pub dm: DeviceManager,
    pub kvm: Arc<FakeKvm>,
}

pub(super) fn manager(transport: TransportKind, mmio_registers: RegisterMode) -> Built {
    let kvm = Arc::new(FakeKvm::default());
    let map = MemoryMap::new(64 << 20).unwrap();
    let memory = crate::guest_memory::anonymous(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let memslots = Arc::new(Memslots::new(512));
    assert_eq!(memslots.take(RAM_SLOTS).unwrap(), 0..RAM_SLOTS);
    let config = DeviceManagerConfig {
        ioeventfd_limits: Default::default(),
        ecam: EcamMode::Mapped,
        mmio_registers,
        pci_config_io: true,
        transport,
        ecam_pages: EcamPages::new().unwrap(),
        memslots,
    };
    let allocators = Allocators::new(&map.pci_windows()).unwrap();
    let dm = DeviceManager::new(kvm.clone(), memory, &map, allocators, config).unwrap();
    Built { dm, kvm }
}

fn attach(dm: &mut DeviceManager, name: &str) -> Result<VirtioTransport, DeviceError> {
    dm.attach_virtio(name, DeviceKind("virtio-test"), Box::<RecordingDevice>::default(), ())
}

pub(super) fn resources<'a>(dm: &'a DeviceManager, name: &str) -> &'a [Resource] {
    &dm.devices().iter().find(|d| d.name == name).unwrap_or_else(|| panic!("no {name}")).resources
}

fn window(dm: &DeviceManager, name: &str) -> (u64, u64) {
    resources(dm, name)
        .iter()
        .find_map(|r| if let Resource::Mmio { base, len } = r { Some((*base, *len)) } else { None })
        .unwrap()
}

fn line(dm: &DeviceManager, name: &str) -> u32 {
    resources(dm, name).iter().find_map(|r| if let Resource::Irq(gsi) = r { Some(*gsi) } else { None }).unwrap()
}

#[test]
fn a_new_manager_has_config_access_and_its_ecam_pages_in_slots_after_ram() {
    let Built { dm, kvm } = manager(TransportKind::Pci, RegisterMode::Mapped);
    let names: Vec<_> = dm.devices().iter().map(|d| d.name.as_str()).collect();
    assert!(names.contains(&"pci-cf8") && names.contains(&"pci-ecam"), "{names:?}");
    // The host bridge's config space is mapped read-only, in slots RAM did not take.
    let slots = kvm.slots.lock().unwrap().clone();
    assert!(!slots.is_empty(), "the ECAM shadow maps the host bridge's page");
    for (slot, gpa, _) in &slots {
        assert!(*slot >= RAM_SLOTS && (layout::ECAM_GPA..layout::ECAM_GPA + ECAM_SIZE).contains(gpa), "{slots:?}");
    }
}

#[test]
fn mmio_devices_get_a_window_a_line_an_irqfd_and_a_notify_ioeventfd_per_queue() {
    let Built { mut dm, kvm } = manager(TransportKind::Mmio, RegisterMode::Mapped);
    for name in ["a", "b", "c"] {
        attach(&mut dm, name).unwrap();
    }
    let windows: Vec<_> = ["a", "b", "c"].iter().map(|n| window(&dm, n)).collect();
    assert!(windows.iter().all(|&(_, len)| len == WINDOW), "{windows:?}");
    assert!(windows.windows(2).all(|w| w[0].0 + WINDOW <= w[1].0), "disjoint, in order: {windows:?}");
    let lines: Vec<_> = ["a", "b", "c"].iter().map(|n| line(&dm, n)).collect();
    assert_eq!(lines, layout::MMIO_IRQS[..3], "the free ISA lines first");
    assert_eq!(*kvm.irqfds.lock().unwrap(), lines, "one irqfd per line");
    // QueueNotify with the queue's index as datamatch, for both of each device's queues.
    let ioeventfds = kvm.ioeventfds.lock().unwrap().clone();
    for &(base, _) in &windows {
        for q in 0..2u64 {
            let key = IoeventfdKey::mmio(base + QUEUE_NOTIFY, 4, Some(q));
            assert!(ioeventfds.contains(&(key, true)), "{key:?} not in {ioeventfds:?}");
        }
    }
    // Mapped registers: each window's page read-only in a slot of its own.
    let slots = kvm.slots.lock().unwrap().clone();
    for &(base, _) in &windows {
        let mapped: Vec<_> = slots.iter().filter(|s| s.1 == base).collect();
        assert_eq!(mapped.len(), 1, "{base:#x}: {slots:?}");
        assert!(mapped[0].0 >= RAM_SLOTS);
    }
    let mut numbers: Vec<u32> = slots.iter().map(|s| s.0).collect();
    numbers.sort_unstable();
    numbers.dedup();
    assert_eq!(numbers.len(), slots.len(), "no slot given twice: {slots:?}");
}

#[test]
fn trapped_registers_map_no_page() {
    let Built { mut dm, kvm } = manager(TransportKind::Mmio, RegisterMode::Trapped);
    let before = kvm.slots.lock().unwrap().len();
    attach(&mut dm, "a").unwrap();
    assert_eq!(kvm.slots.lock().unwrap().len(), before);
}

#[test]
fn running_out_of_lines_is_an_error_for_that_device_only() {
    let Built { mut dm, .. } = manager(TransportKind::Mmio, RegisterMode::Trapped);
    let mut attached = 0;
    let error = loop {
        match attach(&mut dm, &format!("d{attached}")) {
            Ok(_) => attached += 1,
            Err(e) => break e,
        }
        assert!(attached < 100, "lines never ran out");
    };
    // Nine ISA lines, then the IOAPIC's eight upper pins.
    assert_eq!(attached, 17, "{error}");
    assert!(matches!(error, DeviceError::Alloc(_)), "{error}");
    assert!(dm.devices().iter().all(|d| d.name != "d17"), "a refused device is not half-attached");
    let windows = dm.allocators().save(()).unwrap().mmio32.len();
    assert_eq!(windows, 1 + 17, "the boot timer's page and one window per device, none for the refused one");
}

#[test]
fn pci_devices_get_their_own_slot_and_bar() {
    let Built { mut dm, .. } = manager(TransportKind::Pci, RegisterMode::Mapped);
    attach(&mut dm, "a").unwrap();
    attach(&mut dm, "b").unwrap();
    let slot = |n| resources(&dm, n).iter().find_map(|r| if let Resource::PciSlot(s) = r { Some(*s) } else { None });
    let (a, b) = (slot("a").unwrap(), slot("b").unwrap());
    assert!(a != b && a != 0 && b != 0, "{a} {b}");
    let bar =
        |n| resources(&dm, n).iter().find_map(|r| if let Resource::Bar { base, .. } = r { Some(*base) } else { None });
    let windows = MemoryMap::new(64 << 20).unwrap().pci_windows();
    assert!(windows.mmio32.contains(&bar("a").unwrap()) && bar("a") != bar("b"));
}

#[test]
fn a_restore_takes_the_same_build_and_refuses_another_naming_the_device() {
    let build = |names: &[&str]| {
        let mut b = manager(TransportKind::Mmio, RegisterMode::Mapped);
        for n in names {
            attach(&mut b.dm, n).unwrap();
        }
        b
    };
    let saved = build(&["a", "b"]).dm.save(()).unwrap();
    assert_eq!(saved.devices.keys().filter(|k| ["a", "b"].contains(&k.as_str())).count(), 2);
    build(&["a", "b"]).dm.restore((), &saved).unwrap();
    let missing = build(&["a"]).dm.restore((), &saved).unwrap_err().to_string();
    assert!(missing.contains("[a, b") || missing.contains("a, b,"), "{missing}");
    // The same names attached the other way round, unplanned: each in the other's window.
    let swapped = build(&["b", "a"]).dm.restore((), &saved).unwrap_err().to_string();
    assert!(swapped.starts_with("a is a") || swapped.starts_with("b is a"), "{swapped}");
    // Planned from the snapshot (as a restored machine is): each where the snapshot had it.
    let mut planned = manager(TransportKind::Mmio, RegisterMode::Mapped);
    planned.dm.plan_restore(&saved);
    for n in ["b", "a"] {
        attach(&mut planned.dm, n).unwrap();
    }
    planned.dm.restore((), &saved).unwrap();
    let first = build(&["a", "b"]);
    for n in ["a", "b"] {
        assert_eq!(resources(&planned.dm, n), resources(&first.dm, n), "{n}");
    }
    // A snapshot's JSON survives the trip through the state file's format.
    let text = serde_json::to_string(&saved).unwrap();
    let back: persist::DeviceTree = serde_json::from_str(&text).unwrap();
    build(&["a", "b"]).dm.restore((), &back).unwrap();
}

#[test]
fn the_allocators_save_what_they_handed_out_and_refuse_a_machine_that_differs() {
    let Built { mut dm, .. } = manager(TransportKind::Mmio, RegisterMode::Trapped);
    attach(&mut dm, "a").unwrap();
    let saved = dm.allocators().save(()).unwrap();
    assert_eq!(saved.free_mmio_lines, layout::MMIO_IRQS[1..], "one line taken");
    assert_eq!(saved.mmio32.len(), 2, "the boot timer's page and a's window: {saved:?}");
    dm.allocators().restore((), &saved).unwrap();
    // One more BAR taken here than in the snapshot: refused, saying what differs.
    dm.allocators().bar(crate::pci::BarSpec { kind: crate::pci::BarKind::Memory64, size: 1 << 20 }).unwrap();
    let e = dm.allocators().restore((), &saved).unwrap_err().to_string();
    assert!(e.contains("64-bit MMIO ranges"), "{e}");
}
