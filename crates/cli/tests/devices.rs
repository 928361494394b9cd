//! The device manager in real KVM: devices from the allocators, lab devices only on request.

mod common;
use common::*;
use exitless_vmm::device_manager::DeviceKind;
use exitless_vmm::virtio::{
    self, ActivateError, Activation, ActiveQueue, QueuePosition, VirtioDevice, VIRTIO_F_VERSION_1,
};
use exitless_vmm::{DeviceConfig, Machine, MachineConfig};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A virtio device of any type that does nothing: enough for the guest to enumerate it.
struct Inert(u16);

impl VirtioDevice for Inert {
    fn device_type(&self) -> u16 {
        self.0
    }
    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }
    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![64, 64]
    }
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn activate(&mut self, _queues: Vec<ActiveQueue>, _activation: Activation) -> Result<(), ActivateError> {
        Ok(())
    }
    fn reset(&mut self) {}
    fn pause(&mut self) -> Option<Vec<QueuePosition>> {
        None
    }
    fn resume(&mut self) -> Result<(), ActivateError> {
        Ok(())
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn two_virtio_functions_get_their_own_slot_bar_and_vectors() {
    if !kvm_or_skip("two_virtio_functions_get_their_own_slot_bar_and_vectors") {
        return;
    }
    let out = Captured::default();
    let pciscan = exitless_payloads::find("pciscan").unwrap().elf;
    let devices = DeviceConfig { serial_out: Box::new(out.clone()), ..Default::default() };
    let config = MachineConfig { params: vec![10], devices, ..MachineConfig::new(pciscan) };
    let mut machine = Machine::new(config).unwrap();
    let dm = machine.devices_mut();
    let net = dm.attach_virtio("virtio-net", virtio::net::KIND, Box::new(Inert(1)), ()).unwrap();
    let blk = dm.attach_virtio("virtio-blk", virtio::blk::KIND, Box::new(Inert(2)), ()).unwrap();
    let names: Vec<_> = dm.devices().iter().map(|d| (d.name.as_str(), d.kind)).collect();
    assert!(names.contains(&("virtio-blk", virtio::blk::KIND)), "the device manager lists it: {names:?}");
    assert!(names.contains(&("serial", DeviceKind("serial"))), "{names:?}");
    let gsis = |t: &exitless_vmm::device_manager::VirtioTransport| match t {
        exitless_vmm::device_manager::VirtioTransport::Pci(p) => p.vector_gsis(),
        _ => panic!("the default transport is PCI"),
    };
    let (net_gsis, blk_gsis) = (gsis(&net), gsis(&blk));
    assert_eq!((net_gsis.len(), blk_gsis.len()), (3, 3), "a vector per queue plus config");
    assert!(net_gsis.iter().all(|g| !blk_gsis.contains(g)), "{net_gsis:?} {blk_gsis:?}");
    machine.run(Some(Duration::from_secs(60))).unwrap();

    let text = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
    let line = |id: &str| text.lines().find(|l| l.contains(id)).unwrap_or_else(|| panic!("{id} missing: {text}"));
    let (net_line, blk_line) = (line("1af4:1041 class 020000"), line("1af4:1042 class 018000"));
    let bar0 = |l: &str| l.rsplit(' ').next().unwrap().to_string();
    assert_ne!(bar0(net_line), bar0(blk_line), "distinct BARs: {text}");
    assert_ne!(&net_line[..16], &blk_line[..16], "distinct slots: {text}");
    assert!(!text.contains("e1e5:0d00"), "no lab doorbell unless asked: {text}");
}

#[test]
fn a_plain_run_has_no_lab_devices_and_lab_adds_them() {
    if !kvm_or_skip("a_plain_run_has_no_lab_devices_and_lab_adds_them") {
        return;
    }
    let (out, json) = run_json(&["--payload", "pciscan", "--params", "10"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for lab_only in ["doorbell-mmio", "doorbell-pio", "idle"] {
        assert!(json["devices"].get(lab_only).is_none(), "{lab_only}: {json}");
    }
    assert!(!stdout(&out).contains("e1e5:0d00"), "{}", stdout(&out));
    assert_eq!(json["devices"]["unclaimed-pio"]["writes"], 0, "the guest left the lab port alone: {json}");
    let (out, _) = run_json(&["--payload", "pciscan", "--params", "10", "--lab"]);
    assert!(stdout(&out).contains("00:01.0 e1e5:0d00"), "{}", stdout(&out));
}
