//! The virtio-pci transport without KVM.

use super::*;
use crate::bus::DeviceId;
use crate::virtio::{QueuePosition, STATUS_FAILED, STATUS_FEATURES_OK, STATUS_NEEDS_RESET};
use crate::virtio::{VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};
use std::sync::atomic::AtomicU64;
use vm_memory::GuestAddress;

fn transport() -> (Arc<VirtioPci>, Arc<AtomicU64>) {
    let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 1 << 20)]).unwrap();
    crate::testing::virtio_transport(mem)
}

fn w(t: &VirtioPci, at: u64, v: u64, size: usize) {
    t.write(at, &v.to_le_bytes()[..size]);
}

fn r(t: &VirtioPci, at: u64, size: usize) -> u64 {
    let mut b = [0u8; 8];
    t.read(at, &mut b[..size]);
    u64::from_le_bytes(b)
}

fn negotiate(t: &VirtioPci, features: u64) {
    w(t, 0x14, 0, 1);
    w(t, 0x14, 3, 1);
    for sel in 0..2 {
        w(t, 0x08, sel, 4);
        w(t, 0x0c, features >> (32 * sel) & 0xffff_ffff, 4);
    }
    w(t, 0x14, 0xb, 1);
}

fn driver_features(t: &VirtioPci) -> u64 {
    (0..2).fold(0, |acc, sel| {
        w(t, 0x08, sel, 4);
        acc | r(t, 0x0c, 4) << (32 * sel)
    })
}

#[test]
fn features_are_masked_to_the_offer_and_frozen_at_features_ok() {
    let (t, _) = transport();
    negotiate(&t, VIRTIO_F_VERSION_1 | 1 << 40);
    assert_ne!(r(&t, 0x14, 1) as u8 & STATUS_FEATURES_OK, 0);
    assert_eq!(driver_features(&t), VIRTIO_F_VERSION_1, "bit 40 was never offered");
    // After FEATURES_OK a driver cannot add bits or drop VERSION_1.
    w(&t, 0x08, 1, 4);
    w(&t, 0x0c, 0, 4);
    w(&t, 0x08, 0, 4);
    w(&t, 0x0c, VIRTIO_F_EVENT_IDX, 4);
    assert_eq!(driver_features(&t), VIRTIO_F_VERSION_1);
    negotiate(&t, VIRTIO_F_EVENT_IDX); // no VERSION_1: a legacy driver
    assert_eq!(r(&t, 0x14, 1) as u8 & STATUS_FEATURES_OK, 0);
}

#[test]
fn status_only_grows_until_reset_and_keeps_needs_reset() {
    let (t, _) = transport();
    negotiate(&t, VIRTIO_F_VERSION_1);
    w(&t, 0x14, 0xf, 1);
    assert_eq!(t.core().status(), 0xf);
    w(&t, 0x14, 0x1, 1); // lowering is not a transition the spec has
    assert_eq!(t.core().status(), 0xf);
    t.core().link.status.raise(STATUS_NEEDS_RESET); // the device thread, meanwhile
    w(&t, 0x14, u64::from(0xf | STATUS_FAILED), 1);
    assert_eq!(t.core().status(), 0xf | STATUS_FAILED | STATUS_NEEDS_RESET);
    w(&t, 0x14, 0, 1);
    assert_eq!(t.core().status(), 0);
}

#[test]
fn queue_sizes_must_be_powers_of_two_up_to_the_maximum() {
    let (t, _) = transport();
    w(&t, 0x16, 1, 2);
    for bad in [0u64, 3, 257, 512, 0xffff] {
        w(&t, 0x18, bad, 2);
        assert_eq!(r(&t, 0x18, 2), 256, "size {bad}");
    }
    w(&t, 0x18, 64, 2);
    assert_eq!(r(&t, 0x18, 2), 64);
    w(&t, 0x16, 9, 2); // no such queue: reads zero, writes ignored
    w(&t, 0x18, 8, 2);
    assert_eq!(r(&t, 0x18, 2), 0);
}

#[test]
fn driver_ok_with_rings_outside_memory_needs_reset_and_reset_clears_it() {
    let (t, activations) = transport();
    negotiate(&t, VIRTIO_F_VERSION_1);
    w(&t, 0x16, 0, 2);
    w(&t, 0x20, 0xffff_0000_0000, 8);
    w(&t, 0x1c, 1, 2);
    w(&t, 0x14, 0xf, 1);
    assert_ne!(t.core().status() & STATUS_NEEDS_RESET, 0);
    assert_eq!(activations.load(Ordering::Relaxed), 0);
    w(&t, 0x14, 0, 1);
    assert_eq!(t.core().status(), 0);
    assert_eq!(r(&t, 0x20, 8), 0, "queue registers back to their reset values");
}

#[test]
fn a_configuration_change_moves_the_generation_and_raises_the_config_interrupt() {
    let (t, activations) = transport();
    assert_eq!(r(&t, 0x15, 1), 0);
    t.core().config_changed(); // before the driver runs the device: only the generation moves
    assert_eq!(r(&t, 0x15, 1), 1);
    negotiate(&t, VIRTIO_F_VERSION_1);
    w(&t, 0x16, 0, 2);
    for (reg, at) in [(0x20, 0x1000u64), (0x28, 0x2000), (0x30, 0x3000)] {
        w(&t, reg, at, 8);
    }
    w(&t, 0x1c, 1, 2);
    w(&t, 0x14, 0xf, 1);
    assert_eq!(activations.load(Ordering::Relaxed), 1);
    assert_eq!(r(&t, ISR, 1), 0);
    t.core().config_changed();
    assert_eq!(r(&t, 0x15, 1), 2);
    assert_eq!(r(&t, ISR, 1), 2, "ISR bit 1: a configuration change");
    assert_eq!(r(&t, ISR, 1), 0, "reading the ISR clears it");
}

#[test]
fn the_pci_cfg_window_reaches_bar0() {
    let (t, _) = transport();
    let mut f = t.pci_function("virtio", DeviceId(0), 0xc000_0000).unwrap();
    assert!(f.read_side_effects, "its page must stay trapped");
    let cap = (0x40..0x100)
        .step_by(4)
        .find(|&c| f.config.bytes()[c] == CAP_VENDOR && f.config.bytes()[c + 3] == CFG_PCI)
        .unwrap();
    let set = |reg: usize, v: u32, config: &mut ConfigSpace| {
        config.write(cap + reg, &v.to_le_bytes());
        t.config_written(config, cap + reg, 4);
    };
    // Write device_status = ACK through the window, read it back through it.
    set(PCI_CFG_OFFSET, 0x14, &mut f.config);
    set(PCI_CFG_LENGTH, 1, &mut f.config);
    set(PCI_CFG_DATA, 1, &mut f.config);
    assert_eq!(t.core().status(), 1);
    let mut data = [0u8; 4];
    assert!(t.config_read(&f.config, cap + PCI_CFG_DATA, &mut data));
    assert_eq!(data[0], 1);
    // A read outside the window is not the hook's; bad lengths and BARs read zero.
    assert!(!t.config_read(&f.config, 0, &mut data));
    set(PCI_CFG_LENGTH, 3, &mut f.config);
    assert!(t.config_read(&f.config, cap + PCI_CFG_DATA, &mut data));
    assert_eq!(data, [0; 4]);
    set(PCI_CFG_OFFSET, 0xffff_fff0, &mut f.config);
    set(PCI_CFG_LENGTH, 4, &mut f.config);
    set(PCI_CFG_DATA, 0xffff_ffff, &mut f.config); // out of the BAR: ignored
    assert_eq!(t.core().status(), 1);
}

#[test]
fn any_access_anywhere_in_bar0_is_safe() {
    let (t, _) = transport();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..200_000 {
        let size = [1usize, 2, 4, 8][(next() % 4) as usize];
        let at = next() % BAR_SIZE;
        let at = at.min(BAR_SIZE - size as u64);
        if next() % 2 == 0 {
            t.write(at, &next().to_le_bytes()[..size]);
        } else {
            let mut b = [0u8; 8];
            t.read(at, &mut b[..size]);
        }
    }
    // Still a working transport afterwards.
    negotiate(&t, VIRTIO_F_VERSION_1);
    assert_ne!(t.core().status() & STATUS_FEATURES_OK, 0);
}

#[test]
fn a_saved_transport_restores_onto_a_new_one_and_starts_where_its_queues_stood() {
    use crate::testing::RecordingDevice;
    let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let recording = || {
        let device = RecordingDevice::default();
        let (activations, started_at) = (device.activations.clone(), device.started_at.clone());
        let router = Arc::new(crate::irq::GsiRouter::new(Arc::new(crate::testing::FakeKvm::default())));
        let msix = Msix::new(router, 3).unwrap();
        (Arc::new(VirtioPci::new(Box::new(device), mem.clone(), msix).unwrap()), activations, started_at)
    };
    let (a, _, a_at) = recording();
    negotiate(&a, VIRTIO_F_VERSION_1 | VIRTIO_F_EVENT_IDX);
    w(&a, 0x16, 0, 2);
    w(&a, 0x18, 64, 2);
    for (reg, at) in [(0x20, 0x1000u64), (0x28, 0x2000), (0x30, 0x3000)] {
        w(&a, reg, at, 8);
    }
    w(&a, 0x1a, 1, 2);
    w(&a, 0x1c, 1, 2);
    w(&a, 0x14, 0xf, 1);
    // As if the device had taken 7 chains and used 5 of them.
    let worked = vec![QueuePosition { next_avail: 7, next_used: 5 }, QueuePosition::default()];
    *a_at.lock().unwrap() = worked.clone();
    a.core().pause();
    let saved = a.save().unwrap();
    assert!(saved.active && saved.status == 0xf, "{saved:?}");
    a.core().resume().unwrap();
    let text = serde_json::to_string(&saved).unwrap();
    assert_eq!(serde_json::from_str::<TransportState>(&text).unwrap(), saved);

    let (b, b_started, b_at) = recording();
    b.restore(&saved).unwrap();
    assert_eq!(b_started.load(Ordering::Relaxed), 0, "not started before the vCPUs exist");
    assert_eq!((b.core().status(), r(&b, 0x18, 2), r(&b, 0x20, 8), r(&b, 0x1a, 2)), (0xf, 64, 0x1000, 1));
    assert_eq!(driver_features(&b), VIRTIO_F_VERSION_1 | VIRTIO_F_EVENT_IDX);
    b.core().start_restored();
    assert_eq!(b_started.load(Ordering::Relaxed), 1);
    assert_eq!(*b_at.lock().unwrap(), worked, "the queues go on from the snapshot's positions");
    b.core().start_restored(); // once only
    assert_eq!(b_started.load(Ordering::Relaxed), 1);

    // State that contradicts the device is refused, naming what.
    let refused = |spoil: &dyn Fn(&mut TransportState)| {
        let mut s = saved.clone();
        spoil(&mut s);
        recording().0.restore(&s).unwrap_err().to_string()
    };
    assert!(refused(&|s| s.device_type = 2).contains("type 2 there, 1 here"));
    assert!(refused(&|s| s.queues.truncate(1)).contains("1 queues there, 2 here"));
    assert!(refused(&|s| s.driver_features |= 1 << 40).contains("does not offer"));
    assert!(refused(&|s| s.queues[0].size = 48).contains("size 48"));
    assert!(refused(&|s| s.queues[0].vector = 9).contains("vector 9"));
    assert!(refused(&|s| s.queues[0].position = None).contains("no position"));
    assert!(refused(&|s| s.msix.as_mut().unwrap().entries.truncate(2)).contains("MSI-X"));
}
