//! Each kind of device with state in a snapshot (COM1, the i8042, ACPI PM, a virtio
//! transport over PCI and over MMIO, the balloon inside its transport): its state comes
//! back, and one of another version or with a damaged field is refused with one line that
//! names the device and the field. Devices are found by the ids their clients gave, in
//! whatever order they are attached.

use super::tests::{manager, resources, Built};
use super::*;
use crate::persist::state::tests::line;
use crate::persist::{Persist, Saved};
use crate::run_control::{PowerEvents, RunControl};
use crate::testing::RecordingDevice;
use crate::virtio::balloon::{BalloonConfig, VirtioBalloon};

fn nic(dm: &mut DeviceManager, iface: &str) {
    let label = format!("virtio-net{}", dm.virtio_devices().count());
    let name = DeviceName::keyed(crate::virtio::net::KIND, Some(iface), label);
    dm.attach_virtio(name, crate::virtio::net::KIND, Box::<RecordingDevice>::default(), ()).unwrap();
}

/// Every kind of device with state: COM1, the i8042, ACPI PM, a NIC-like virtio device and
/// a balloon over `transport`; with `plan`, placed where that snapshot had them.
fn machine(transport: TransportKind, plan: Option<&DeviceTree>) -> DeviceManager {
    let Built { mut dm, .. } = manager(transport, RegisterMode::Trapped);
    if let Some(tree) = plan {
        dm.plan_restore(tree);
    }
    dm.attach_serial(Box::new(std::io::sink()), None).unwrap();
    let power = PowerEvents::new(Arc::new(RunControl::default()));
    dm.attach_keyboard(power.clone()).unwrap();
    dm.attach_power(power, false).unwrap();
    nic(&mut dm, "eth0");
    let balloon = VirtioBalloon::new(BalloonConfig::default(), &dm.memory).unwrap();
    dm.attach_virtio("virtio-balloon", crate::virtio::balloon::KIND, Box::new(balloon), ()).unwrap();
    dm
}

#[test]
fn each_device_state_comes_back_and_a_spoiled_one_is_refused_naming_device_and_field() {
    for transport in [TransportKind::Pci, TransportKind::Mmio] {
        let saved = machine(transport, None).save(()).unwrap();
        assert_eq!(saved.transport(), Some(transport));
        let text = serde_json::to_string(&saved).unwrap();
        let tree = || serde_json::from_str::<DeviceTree>(&text).unwrap();
        machine(transport, Some(&saved)).restore((), &tree()).unwrap();
        let refused = |id: &str, spoil: &dyn Fn(&mut Option<Saved>)| -> String {
            let mut spoilt = tree();
            spoil(&mut spoilt.devices.get_mut(id).unwrap().state);
            let said = line(&machine(transport, Some(&saved)).restore((), &spoilt).unwrap_err());
            assert!(!said.contains('\n') && said.starts_with(&format!("{id}: ")), "{said}");
            said
        };
        let fields = [
            ("serial", "lcr"),
            ("i8042", "command_byte"),
            ("acpi-pm", "timer"),
            ("virtio-net/eth0", "queue_select"),
            ("virtio-balloon", "driver_features"),
        ];
        for (id, field) in fields {
            let later = refused(id, &|s| s.as_mut().unwrap().version = 99);
            assert!(later.ends_with("its state is version 99; this exitless reads version 1"), "{later}");
            let damaged = refused(id, &|s| s.as_mut().unwrap().state[field] = "damaged".into());
            assert!(
                damaged.contains(&format!("its state's field `{field}` does not parse: invalid type")),
                "{damaged}"
            );
            let stray = refused(id, &|s| s.as_mut().unwrap().state["stray"] = 1.into());
            assert!(stray.contains("field `stray` does not parse: unknown field"), "{stray}");
            let missing = refused(id, &|s| *s = None);
            assert!(missing.ends_with("the snapshot saved no state for it, and it keeps some"), "{missing}");
        }
        // The balloon's own state, inside its transport's, has a version of its own.
        let inner = refused("virtio-balloon", &|s| s.as_mut().unwrap().state["device"]["version"] = 5.into());
        assert!(inner.ends_with("its state is version 5; this exitless reads version 1"), "{inner}");
        let inner = refused("virtio-balloon", &|s| s.as_mut().unwrap().state["device"]["state"]["hint"] = 1.into());
        assert!(inner.contains("field `hint` does not parse"), "{inner}");
        let inner = refused("virtio-balloon", &|s| s.as_mut().unwrap().state["device"] = serde_json::Value::Null);
        assert!(inner.ends_with("the snapshot saved no state for it, and it keeps some"), "{inner}");
        // A state that parses but contradicts the device names the field too.
        let other = refused("virtio-net/eth0", &|s| s.as_mut().unwrap().state["device_type"] = 4.into());
        assert!(other.contains("field `device_type` does not fit this device"), "{other}");
        // A device that keeps no state is given one.
        let mut stray = tree();
        stray.devices.get_mut("pci-ecam").unwrap().state = Some(Saved { version: 1, state: 0.into() });
        let said = line(&machine(transport, Some(&saved)).restore((), &stray).unwrap_err());
        assert_eq!(said, "pci-ecam: the snapshot saved a state for it, and it keeps none");
    }
}

#[test]
fn two_nics_come_back_by_their_ids_whatever_order_they_are_attached_in() {
    for transport in [TransportKind::Pci, TransportKind::Mmio] {
        let Built { mut dm, .. } = manager(transport, RegisterMode::Trapped);
        nic(&mut dm, "eth0");
        nic(&mut dm, "eth1");
        let saved = dm.save(()).unwrap();
        let ids: Vec<_> = saved.devices.keys().filter(|k| k.starts_with("virtio-net")).collect();
        assert_eq!(ids, ["virtio-net/eth0", "virtio-net/eth1"], "keyed by the ids their client gave");
        // The restoring machine attaches them the other way round: each is placed, and
        // restored, where the snapshot had the NIC of its id.
        let Built { dm: mut back, .. } = manager(transport, RegisterMode::Trapped);
        back.plan_restore(&saved);
        nic(&mut back, "eth1");
        nic(&mut back, "eth0");
        back.restore((), &saved).unwrap();
        let by_id = |dm: &DeviceManager, id: &str| {
            let d = dm.devices().iter().find(|d| d.id == id).unwrap();
            resources(dm, &d.name).to_vec()
        };
        for id in ["virtio-net/eth0", "virtio-net/eth1"] {
            assert_eq!(by_id(&back, id), by_id(&dm, id), "{transport:?} {id}");
        }
        // A machine with another NIC is refused, naming both lists.
        let Built { dm: mut other, .. } = manager(transport, RegisterMode::Trapped);
        other.plan_restore(&saved);
        nic(&mut other, "eth0");
        nic(&mut other, "eth2");
        let said = line(&other.restore((), &saved).unwrap_err());
        assert!(said.contains("virtio-net/eth1], this machine [") && said.ends_with("virtio-net/eth2]"), "{said}");
    }
}

#[test]
fn the_acpi_devices_come_back_on_their_lines_renewed_and_an_older_snapshot_gets_none() {
    let build = |plan: Option<&DeviceTree>| {
        let Built { mut dm, .. } = manager(TransportKind::Mmio, RegisterMode::Trapped);
        if let Some(tree) = plan {
            dm.plan_restore(tree);
        }
        nic(&mut dm, "eth0");
        dm.attach_acpi_devices(plan.is_some()).unwrap();
        dm
    };
    let first = build(None);
    let (gsi, id) = (first.vmgenid().unwrap().line(), first.vmgenid().unwrap().id());
    // Firecracker's order: the next ISA lines after the virtio-mmio devices' (eth0 took 5).
    assert_eq!((gsi, first.vmclock().unwrap().line()), (6, 7));
    let saved = first.save(()).unwrap();
    let text = serde_json::to_string(&saved).unwrap();
    let tree = || serde_json::from_str::<DeviceTree>(&text).unwrap();
    let second = build(Some(&tree()));
    second.restore((), &tree()).unwrap();
    assert_eq!(second.vmgenid().unwrap().line(), gsi);
    assert_ne!(second.vmgenid().unwrap().id(), id, "a restored machine kept the snapshot's generation");
    assert_eq!(second.vmclock().unwrap().counters().disruption_marker, 1);
    // A snapshot taken before exitless had them: its machine restores without them.
    let mut older = tree();
    older.devices.remove("vmgenid");
    older.devices.remove("vmclock");
    older.allocators.free_mmio_lines.splice(0..0, [6, 7]);
    let third = build(Some(&older));
    assert!(third.vmgenid().is_none() && third.vmclock().is_none());
    third.restore((), &older).unwrap();
    // A state whose line is not this machine's is refused naming the device and field.
    let mut moved = tree();
    moved.devices.get_mut("vmgenid").unwrap().state.as_mut().unwrap().state["line"] = 7.into();
    let said = line(&build(Some(&tree())).restore((), &moved).unwrap_err());
    assert!(said.starts_with("vmgenid: its state's field `line` does not fit this device"), "{said}");
}
