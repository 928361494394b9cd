//! Attaching the devices kvm-unit-tests finds on QEMU's PC machine, where it looks for
//! them. Their state is not saved: a machine with them refuses a snapshot.

use super::{fw_cfg, pc_testdev};
use crate::device_manager::{BarRequest, DeviceError, DeviceHandle, DeviceKind, DeviceManager, Saves};
use crate::layout;
use crate::pci::testdev::PciTestdev;
use crate::pci::{edu, iommu};
use std::sync::Arc;

pub const KIND: DeviceKind = DeviceKind("qemu-test");

/// How each is reached: through the buses only, and never in a snapshot.
fn handle() -> DeviceHandle {
    DeviceHandle::bus().saving(Saves::Refused("its state is not saved"))
}

impl DeviceManager {
    /// fw_cfg, pc-testdev's ports, IRQ lines and MMIO page, and pci-testdev.
    pub fn attach_qemu_test_devices(&mut self, mem_size: u64, vcpus: u8) -> Result<(), DeviceError> {
        let kind = KIND;
        let cfg = Arc::new(fw_cfg::FwCfg::new(mem_size, vcpus));
        self.attach_pio("fw-cfg", kind, fw_cfg::FW_CFG_PORT, fw_cfg::FW_CFG_LEN, cfg, handle())?;
        let ports = Arc::new(pc_testdev::PcTestdevPorts::default());
        let (port, len) = (pc_testdev::SCRATCH_PORT, pc_testdev::PORTS_LEN);
        self.attach_pio("pc-testdev", kind, port, len, ports, handle())?;
        let irq = Arc::new(pc_testdev::PcTestdevIrq(self.vm().clone()));
        let (port, len) = (pc_testdev::IRQ_PORT, pc_testdev::IRQ_LINES);
        self.attach_pio("pc-testdev-irq", kind, port, len, irq, handle())?;
        let iomem = Arc::new(pc_testdev::PcTestdevIomem::default());
        let (addr, len) = (layout::PC_TESTDEV_IOMEM_GPA, pc_testdev::IOMEM_LEN);
        self.attach_mmio("pc-testdev-iomem", kind, addr, len, iomem, handle())?;
        let testdev = PciTestdev::new();
        let bars = [
            BarRequest { label: "mem", spec: PciTestdev::MEM_BAR, at: None },
            BarRequest { label: "io", spec: PciTestdev::IO_BAR, at: None },
        ];
        let device = testdev.clone();
        let placed = self.attach_pci("pci-testdev", kind, None, &bars, |p| {
            let function = device.pci_function((p.bars[0].0, p.bars[1].0), p.bars[0].1, p.bars[1].1);
            Ok((function, handle()))
        })?;
        testdev.attach(self.pci(), usize::from(placed.slot) << 3);
        Ok(())
    }

    /// QEMU's edu device and the VT-d model that translates its DMA and remaps its
    /// interrupts (`--testdev-iommu`), where kvm-unit-tests' `intel_iommu` looks for them.
    pub fn attach_edu_behind_iommu(&mut self) -> Result<(), DeviceError> {
        let kind = KIND;
        let unit = Arc::new(iommu::IntelIommu::new(self.memory().clone()));
        self.attach_mmio("intel-iommu", kind, layout::IOMMU_GPA, iommu::IOMMU_LEN, unit.clone(), handle())?;
        let pin = self.allocators().intx_pin()?;
        let (memory, vm, router) = (self.memory().clone(), self.vm().clone(), self.gsi_router().clone());
        let bars = [BarRequest { label: "", spec: edu::BAR, at: None }];
        self.attach_pci("edu", kind, None, &bars, |p| {
            let device = edu::Edu::new(memory, unit, vm, router, p.slot, pin)?;
            Ok((device.pci_function(p.bars[0].0, p.bars[0].1), handle()))
        })?;
        Ok(())
    }
}
