//! The virtio-mmio transport without KVM: a driver's setup as Linux's virtio_mmio makes it,
//! the interrupt path, and a hostile driver's every mistake refused or ignored.

use super::*;
use crate::virtio::{STATUS_DRIVER_OK, STATUS_FEATURES_OK, STATUS_NEEDS_RESET, VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};
use std::sync::atomic::AtomicU64;
use vm_memory::GuestAddress;

fn transport(mode: RegisterMode) -> (Arc<VirtioMmio>, Arc<AtomicU64>, Arc<EventFd>) {
    let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 1 << 20)]).unwrap();
    crate::testing::virtio_mmio_transport(mem, mode)
}

/// Runs a test on the trapped and on the mapped registers.
fn both(test: impl Fn(RegisterMode)) {
    for mode in [RegisterMode::Trapped, RegisterMode::Mapped] {
        test(mode);
    }
}

fn w(t: &VirtioMmio, at: u64, v: u32) {
    t.write(at, &v.to_le_bytes());
}

/// What the driver reads at `at`: from the page when mapped, which must show what a
/// trapped read returns.
fn r(t: &VirtioMmio, at: u64) -> u32 {
    let mut b = [0u8; 4];
    t.read(at, &mut b);
    let trapped = u32::from_le_bytes(b);
    match t.page() {
        Some(page) => {
            assert_eq!(page.read(at), trapped, "the page at {at:#x}");
            page.read(at)
        }
        None => trapped,
    }
}

/// ACKNOWLEDGE, DRIVER, `features`, FEATURES_OK; then each queue at 0x1000 * (q + 1) and
/// DRIVER_OK, as Linux's virtio_mmio does it.
fn bring_up(t: &VirtioMmio, features: u64) {
    w(t, STATUS, 0);
    w(t, STATUS, 3);
    for sel in 0..2 {
        w(t, DRIVER_FEATURES_SEL, sel);
        w(t, DRIVER_FEATURES, (features >> (32 * sel)) as u32);
    }
    w(t, STATUS, 0xb);
    for q in 0..2u32 {
        w(t, QUEUE_SEL, q);
        assert_eq!(r(t, QUEUE_NUM_MAX), 256);
        assert_eq!(r(t, QUEUE_READY), 0);
        w(t, QUEUE_NUM, 128);
        let base = 0x1_0000 * u64::from(q + 1);
        for (low, at) in [(QUEUE_DESC_LOW, base), (QUEUE_DRIVER_LOW, base + 0x800), (QUEUE_DEVICE_LOW, base + 0x1000)] {
            w(t, low, at as u32);
            w(t, low + 4, (at >> 32) as u32);
        }
        w(t, QUEUE_READY, 1);
    }
    w(t, STATUS, 0xf);
}

#[test]
fn the_registers_say_virtio_version_2_and_the_device() {
    both(|mode| {
        let (t, _, _) = transport(mode);
        assert_eq!(r(&t, MAGIC), 0x7472_6976);
        assert_eq!(r(&t, VERSION), 2);
        assert_eq!(r(&t, DEVICE_ID), 1);
        w(&t, DEVICE_FEATURES_SEL, 1);
        assert_eq!(u64::from(r(&t, DEVICE_FEATURES)) << 32, VIRTIO_F_VERSION_1);
        w(&t, DEVICE_FEATURES_SEL, 0);
        assert_eq!(u64::from(r(&t, DEVICE_FEATURES)), VIRTIO_F_EVENT_IDX);
        assert_eq!(r(&t, SHM_LEN_LOW), u32::MAX, "no shared memory region");
        // The device configuration, at any width.
        let mut b = [0u8; 2];
        t.read(CONFIG + 6, &mut b);
        assert_eq!(b, [0xab, 0xab]);
    })
}

#[test]
fn a_driver_brings_the_device_up_and_its_queues_are_frozen() {
    both(|mode| {
        let (t, activations, _) = transport(mode);
        bring_up(&t, VIRTIO_F_VERSION_1 | VIRTIO_F_EVENT_IDX | 1 << 40);
        assert_eq!(activations.load(Ordering::Relaxed), 1);
        assert_eq!(t.core().status() & (STATUS_FEATURES_OK | STATUS_DRIVER_OK), STATUS_FEATURES_OK | STATUS_DRIVER_OK);
        w(&t, DRIVER_FEATURES_SEL, 1);
        assert_eq!(r(&t, DRIVER_FEATURES), 0, "driver features are not readable here; only the device's");
        // Running: the queue registers stay as they were.
        w(&t, QUEUE_SEL, 1);
        w(&t, QUEUE_NUM, 64);
        w(&t, QUEUE_DESC_LOW, 0xdead_0000);
        w(&t, QUEUE_READY, 0);
        assert_eq!((r(&t, QUEUE_DESC_LOW), r(&t, QUEUE_READY)), (0x2_0000, 1));
        // A reset forgets everything; the driver can start over.
        w(&t, STATUS, 0);
        assert_eq!((t.core().status(), r(&t, QUEUE_READY), r(&t, QUEUE_DESC_LOW)), (0, 0, 0));
        bring_up(&t, VIRTIO_F_VERSION_1);
        assert_eq!(activations.load(Ordering::Relaxed), 2);
    })
}

#[test]
fn an_interrupt_sets_its_status_bit_before_the_line_and_the_ack_clears_it() {
    both(|mode| {
        let (t, _, irqfd) = transport(mode);
        bring_up(&t, VIRTIO_F_VERSION_1);
        let interrupt = crate::sync::lock(&t.core().link.interrupt).clone().unwrap();
        interrupt.signal_queue(1);
        assert_eq!(irqfd.read().unwrap(), 1, "one edge on the line");
        assert_eq!(r(&t, INTERRUPT_STATUS), 1);
        t.core().config_changed();
        assert_eq!(r(&t, INTERRUPT_STATUS), 3);
        assert_eq!(r(&t, CONFIG_GENERATION), 1);
        // The driver acknowledges what it read; a bit it did not acknowledge stays. Mapped,
        // the used-buffer bit stays until a reset (its acknowledgement never exits).
        let queue_bit = u32::from(mode == RegisterMode::Mapped);
        w(&t, INTERRUPT_ACK, 1);
        assert_eq!(r(&t, INTERRUPT_STATUS), 2 | queue_bit);
        w(&t, INTERRUPT_ACK, 2);
        assert_eq!(r(&t, INTERRUPT_STATUS), queue_bit);
        assert_eq!(t.core().interrupts_signalled(), 2);
        w(&t, STATUS, 0);
        assert_eq!(r(&t, INTERRUPT_STATUS), 0, "a reset clears it");
    })
}

#[test]
fn kicks_reach_their_queue_by_ioeventfd_or_by_the_exit() {
    both(|mode| {
        let (t, _, _) = transport(mode);
        let keys = t.notify_ioeventfds().unwrap();
        let mut want: Vec<_> = (0..2).map(|q| IoeventfdKey::mmio(QUEUE_NOTIFY, 4, Some(q))).collect();
        if mode == RegisterMode::Mapped {
            want.push(IoeventfdKey::mmio(INTERRUPT_ACK, 4, Some(1)));
        }
        assert_eq!(keys.iter().map(|(k, _)| *k).collect::<Vec<_>>(), want);
        // A kick no ioeventfd took (another width reaches the device only as a whole write).
        w(&t, QUEUE_NOTIFY, 1);
        assert_eq!(t.core().link.kicks[1].read().unwrap(), 1);
        w(&t, QUEUE_NOTIFY, 7); // no such queue: nothing
        assert!(t.core().link.kicks[0].read().is_err());
    })
}

#[test]
fn a_hostile_driver_is_ignored_and_the_device_keeps_its_state() {
    both(|mode| {
        let (t, activations, _) = transport(mode);
        // Accesses of 1, 2 and 8 bytes and unaligned ones to registers do nothing.
        for (at, len) in [(STATUS, 1), (STATUS, 2), (STATUS, 8), (STATUS + 1, 4), (QUEUE_SEL + 2, 4)] {
            t.write(at, &[0xff; 8][..len]);
            let mut b = [0u8; 8];
            t.read(at, &mut b[..len]);
            assert_eq!(b, [0; 8], "{len}-byte read at {at:#x}");
        }
        assert_eq!(t.core().status(), 0);
        // Writes to read-only registers and to the configuration.
        for at in [MAGIC, VERSION, DEVICE_ID, QUEUE_NUM_MAX, INTERRUPT_STATUS, CONFIG_GENERATION, CONFIG, 0xffc] {
            w(&t, at, 0x1234_5678);
        }
        assert_eq!((r(&t, MAGIC), r(&t, VERSION), r(&t, QUEUE_NUM_MAX)), (0x7472_6976, 2, 256));
        // Sizes above the maximum or not a power of two, a queue that does not exist.
        w(&t, QUEUE_NUM, 512);
        w(&t, QUEUE_NUM, 100);
        w(&t, QUEUE_SEL, 9);
        w(&t, QUEUE_READY, 1);
        assert_eq!(r(&t, QUEUE_NUM_MAX), 0, "queue 9 does not exist");
        w(&t, QUEUE_SEL, 0);
        assert_eq!(r(&t, QUEUE_READY), 0);
        // Features outside the offer are dropped (all ones asked, the offer taken).
        w(&t, STATUS, 3);
        w(&t, DRIVER_FEATURES_SEL, 1);
        w(&t, DRIVER_FEATURES, u32::MAX);
        w(&t, STATUS, 0xb);
        assert_ne!(t.core().status() & STATUS_FEATURES_OK, 0);
        // Rings outside guest memory: DRIVER_OK does not start the device, which asks for a reset.
        w(&t, QUEUE_SEL, 0);
        w(&t, QUEUE_DESC_HIGH, 0x10);
        w(&t, QUEUE_READY, 1);
        w(&t, STATUS, 0xf);
        assert_eq!(activations.load(Ordering::Relaxed), 0);
        assert_ne!(t.core().status() & STATUS_NEEDS_RESET, 0);
        // A driver that clears bits without a reset is ignored; a reset recovers.
        w(&t, STATUS, 1);
        assert_ne!(t.core().status() & STATUS_NEEDS_RESET, 0);
        w(&t, STATUS, 0);
        bring_up(&t, VIRTIO_F_VERSION_1);
        assert_eq!(activations.load(Ordering::Relaxed), 1);
    })
}

#[test]
fn a_saved_transport_restores_onto_a_new_one_and_refuses_a_pci_state() {
    both(|mode| {
        let (t, activations, _) = transport(mode);
        bring_up(&t, VIRTIO_F_VERSION_1 | VIRTIO_F_EVENT_IDX);
        assert!(t.core().save().is_err(), "a running device is paused before it is saved");
        t.core().pause();
        let saved = t.core().save().unwrap();
        assert!(saved.active && saved.msix.is_none());
        let (u, restored, _) = transport(mode);
        u.restore(&saved).unwrap();
        u.core().start_restored();
        assert_eq!((activations.load(Ordering::Relaxed), restored.load(Ordering::Relaxed)), (1, 1));
        assert_eq!(u.core().status(), t.core().status());
        w(&u, QUEUE_SEL, 1);
        assert_eq!(r(&u, QUEUE_DESC_LOW), 0x2_0000);
        let (v, _, _) = transport(mode);
        let pci = crate::virtio::transport::TransportState { msix: Some(Default::default()), ..saved };
        assert!(v.restore(&pci).is_err());
    })
}

#[test]
fn a_mapped_page_shows_a_change_before_the_interrupt_that_announces_it() {
    let (t, _, irqfd) = transport(RegisterMode::Mapped);
    let page = t.page().unwrap();
    bring_up(&t, VIRTIO_F_VERSION_1);
    let interrupt = crate::sync::lock(&t.core().link.interrupt).clone().unwrap();
    // A device thread gives up: NEEDS_RESET and the config bit are on the page, with no
    // exit in between, by the time the line is raised.
    t.core().link.status.needs_reset(&interrupt);
    assert_eq!(irqfd.read().unwrap(), 1);
    assert_eq!(page.read(INTERRUPT_STATUS), 2);
    assert_ne!(page.read(STATUS) & u32::from(STATUS_NEEDS_RESET), 0);
    // A configuration change: the new generation and configuration before the interrupt.
    w(&t, STATUS, 0);
    bring_up(&t, VIRTIO_F_VERSION_1);
    t.core().config_changed();
    assert_eq!((page.read(CONFIG_GENERATION), page.read(INTERRUPT_STATUS)), (1, 2));
    assert_eq!(page.read(CONFIG + 0x10), 0xabab_abab);
    // A queue's interrupt racing the driver's acknowledgement of the configuration bit.
    interrupt.signal_queue(0);
    w(&t, INTERRUPT_ACK, 2);
    assert_eq!(page.read(INTERRUPT_STATUS), 1);
}
