//! QEMU's educational PCI device (1234:11e8), which kvm-unit-tests' `intel_iommu` drives
//! behind the IOMMU (`pci/iommu.rs`): a liveness register, a factorial, an interrupt the
//! guest raises and acknowledges (INTx on an IOAPIC pin, or MSI, remapped by the IOMMU),
//! and a DMA engine between guest memory (through the IOMMU) and a 4 KiB buffer the device
//! sees at 0x40000. DMA runs to completion inside the guest's write of the command.

use super::config::{BarKind, BarSpec, ConfigSpace, PciIds, COMMAND, COMMAND_MEMORY, INTERRUPT_LINE};
use super::iommu::IntelIommu;
use super::root::ConfigHook;
use super::PciFunction;
use crate::bus::{BusDevice, DeviceId};
use crate::guest_memory::GuestMemoryMmap;
use crate::irq::{GsiRouter, IrqLevel, MsiMessage};
use std::sync::{Arc, Mutex};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

const VENDOR_QEMU: u16 = 0x1234;
const DEVICE_EDU: u16 = 0x11e8;
/// Version 1.0 and the magic 0xed.
const ID: u32 = 0x0100_00ed;

const REG_ID: u64 = 0x00;
const REG_ALIVE: u64 = 0x04;
const REG_FACTORIAL: u64 = 0x08;
const REG_STATUS: u64 = 0x20;
const REG_INTR_STATUS: u64 = 0x24;
const REG_INTR_RAISE: u64 = 0x60;
const REG_INTR_ACK: u64 = 0x64;
const REG_DMA_SRC: u64 = 0x80;
const REG_DMA_DST: u64 = 0x88;
const REG_DMA_COUNT: u64 = 0x90;
const REG_DMA_CMD: u64 = 0x98;

const STATUS_IRQ_AFTER_FACTORIAL: u32 = 0x80;
const IRQ_FACTORIAL: u32 = 0x1;
const IRQ_DMA: u32 = 0x100;
const DMA_START: u64 = 0x1;
const DMA_FROM_BUFFER: u64 = 0x2;
const DMA_IRQ: u64 = 0x4;
/// Where the device sees its buffer, and its size.
const BUFFER_AT: u64 = 0x40000;
const BUFFER_SIZE: usize = 4096;

/// The MSI capability: 64-bit addresses, one vector.
const PCI_CAP_MSI: u8 = 0x05;
const MSI_64BIT: u16 = 1 << 7;
const MSI_ENABLE: u16 = 1;

pub const BAR: BarSpec = BarSpec { kind: BarKind::Memory32, size: 1 << 20 };

#[derive(Default)]
struct State {
    alive: u32,
    factorial: u32,
    status: u32,
    irq_status: u32,
    dma: [u64; 4],
    buffer: Vec<u8>,
    /// The MSI capability as the guest last configured it: enabled, message.
    msi: Option<MsiMessage>,
    /// Whether the INTx line is raised.
    line_up: bool,
    warned: bool,
}

pub struct Edu {
    state: Mutex<State>,
    memory: GuestMemoryMmap,
    iommu: Arc<IntelIommu>,
    /// Where INTx goes (the VM's IOAPIC).
    line: Arc<dyn IrqLevel>,
    /// Requester ID: bus 0, the slot's devfn.
    sid: u16,
    /// The IOAPIC pin of INTx.
    pin: u32,
    /// MSI: a GSI routed to the (remapped) message, fired through its irqfd.
    msi: (Arc<GsiRouter>, u32, EventFd),
    /// Where the MSI capability sits in config space.
    msi_cap: std::sync::OnceLock<usize>,
}

impl Edu {
    pub fn new(
        memory: GuestMemoryMmap,
        iommu: Arc<IntelIommu>,
        line: Arc<dyn IrqLevel>,
        router: Arc<GsiRouter>,
        slot: u8,
        pin: u32,
    ) -> Result<Arc<Self>, crate::irq::IrqError> {
        let fd = EventFd::new(libc::EFD_NONBLOCK).map_err(crate::irq::IrqError::Eventfd)?;
        let gsi = router.allocate(&fd)?;
        let state = State { buffer: vec![0; BUFFER_SIZE], ..Default::default() };
        Ok(Arc::new(Edu {
            state: Mutex::new(state),
            memory,
            iommu,
            line,
            sid: u16::from(slot) << 3,
            pin,
            msi: (router, gsi, fd),
            msi_cap: std::sync::OnceLock::new(),
        }))
    }

    /// The function, its BAR at `bar`, INTx pin A on the IOAPIC pin given at creation.
    pub fn pci_function(self: &Arc<Self>, id: DeviceId, bar: u64) -> PciFunction {
        let mut config = ConfigSpace::new(PciIds {
            vendor: VENDOR_QEMU,
            device: DEVICE_EDU,
            class: [0x00, 0xff, 0x00],
            revision: 0x10,
            subsystem_vendor: 0x1af4,
            subsystem: 0x1100,
        });
        config.set_bar(0, BAR, bar);
        config.write(COMMAND, &COMMAND_MEMORY.to_le_bytes());
        config.write(INTERRUPT_LINE, &[self.pin as u8]);
        config.set_interrupt_pin(1);
        // Control (64-bit), address low and high, data, pad.
        let mut body = [0u8; 14];
        body[..2].copy_from_slice(&MSI_64BIT.to_le_bytes());
        let cap = config.add_capability(PCI_CAP_MSI, &body);
        config.set_write_mask(
            cap + 2,
            &[MSI_ENABLE as u8, 0, 0xfc, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        );
        let _ = self.msi_cap.set(cap);
        PciFunction::new("edu", config).with_bar(0, id, self.clone()).with_hook(self.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Raises `bits` of the interrupt status: an MSI, or the INTx line up.
    fn raise(&self, state: &mut State, bits: u32) {
        state.irq_status |= bits;
        if state.irq_status == 0 {
            return;
        }
        match state.msi {
            Some(msg) => match self.iommu.remap_msi(msg) {
                Some(msg) => {
                    let (router, gsi, fd) = &self.msi;
                    if router.set(*gsi, msg).is_ok() {
                        let _ = fd.write(1);
                    }
                }
                None => self.warn(state, "its MSI has no valid interrupt-remapping entry"),
            },
            None => self.set_line(state, true),
        }
    }

    fn lower(&self, state: &mut State, bits: u32) {
        state.irq_status &= !bits;
        if state.irq_status == 0 {
            self.set_line(state, false);
        }
    }

    /// Moves the INTx line to `up`, telling KVM only of a change.
    fn set_line(&self, state: &mut State, up: bool) {
        if state.line_up != up {
            state.line_up = up;
            self.line.set_level(self.pin, up);
        }
    }

    fn warn(&self, state: &mut State, what: &str) {
        if !std::mem::replace(&mut state.warned, true) {
            tracing::warn!("edu: {what} (further faults not logged)");
        }
    }

    /// Runs the DMA the registers describe: between the buffer and guest memory as the
    /// IOMMU maps it for this device.
    fn dma(&self, state: &mut State) {
        let [src, dst, count, cmd] = state.dma;
        let from_buffer = cmd & DMA_FROM_BUFFER != 0;
        let (device, iova) = if from_buffer { (src, dst) } else { (dst, src) };
        let offset = device.wrapping_sub(BUFFER_AT);
        let fits = count <= BUFFER_SIZE as u64 && offset <= (BUFFER_SIZE as u64 - count.min(BUFFER_SIZE as u64));
        if !fits {
            return self.warn(state, "DMA outside its 4 KiB buffer ignored");
        }
        let mut done = 0u64;
        while done < count {
            let at = iova.wrapping_add(done);
            let chunk = (count - done).min(0x1000 - (at & 0xfff));
            let Some(gpa) = self.iommu.translate(self.sid, at, from_buffer) else {
                return self.warn(state, "DMA to an address the IOMMU does not map for it");
            };
            let buf = &mut state.buffer[(offset + done) as usize..(offset + done + chunk) as usize];
            let ok = if from_buffer {
                self.memory.write_slice(buf, GuestAddress(gpa)).is_ok()
            } else {
                self.memory.read_slice(buf, GuestAddress(gpa)).is_ok()
            };
            if !ok {
                return self.warn(state, "DMA outside guest memory");
            }
            done += chunk;
        }
    }
}

impl BusDevice for Edu {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let state = self.lock();
        let value: u64 = match offset {
            REG_ID => u64::from(ID),
            REG_ALIVE => u64::from(!state.alive),
            REG_FACTORIAL => u64::from(state.factorial),
            REG_STATUS => u64::from(state.status),
            REG_INTR_STATUS => u64::from(state.irq_status),
            REG_DMA_SRC | REG_DMA_DST | REG_DMA_COUNT | REG_DMA_CMD => state.dma[((offset - REG_DMA_SRC) / 8) as usize],
            _ => 0,
        };
        crate::bus::read_register(data, value);
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let value = crate::bus::written_value(data);
        let mut state = self.lock();
        match offset {
            REG_ALIVE => state.alive = value as u32,
            REG_FACTORIAL => {
                state.factorial = (1..=value as u32).fold(1u32, |f, k| f.wrapping_mul(k));
                if state.status & STATUS_IRQ_AFTER_FACTORIAL != 0 {
                    self.raise(&mut state, IRQ_FACTORIAL);
                }
            }
            REG_STATUS => state.status = value as u32 & STATUS_IRQ_AFTER_FACTORIAL,
            REG_INTR_RAISE => self.raise(&mut state, value as u32),
            REG_INTR_ACK => self.lower(&mut state, value as u32),
            REG_DMA_SRC | REG_DMA_DST | REG_DMA_COUNT => state.dma[((offset - REG_DMA_SRC) / 8) as usize] = value,
            REG_DMA_CMD => {
                state.dma[3] = value;
                if value & DMA_START != 0 {
                    self.dma(&mut state);
                    state.dma[3] &= !DMA_START;
                    if value & DMA_IRQ != 0 {
                        self.raise(&mut state, IRQ_DMA);
                    }
                }
            }
            _ => {}
        }
    }
}

impl ConfigHook for Edu {
    fn config_written(&self, config: &ConfigSpace, offset: usize, len: usize) {
        let Some(&cap) = self.msi_cap.get() else { return };
        if offset + len <= cap || offset >= cap + 14 {
            return;
        }
        let control = config.read_u16(cap + 2);
        let word = |at: usize| u32::from(config.read_u16(at)) | u32::from(config.read_u16(at + 2)) << 16;
        let address = u64::from(word(cap + 4)) | u64::from(word(cap + 8)) << 32;
        let data = u32::from(config.read_u16(cap + 12));
        let mut state = self.lock();
        state.msi = (control & MSI_ENABLE != 0).then_some(MsiMessage { address, data });
        if state.msi.is_some() {
            // MSI on: INTx is no longer used.
            self.set_line(&mut state, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeKvm;

    fn edu() -> (Arc<Edu>, Arc<FakeKvm>, GuestMemoryMmap) {
        let memory = crate::guest_memory::anonymous(&[(GuestAddress(0), 16 << 20)]).unwrap();
        let kvm = Arc::new(FakeKvm::default());
        let iommu = Arc::new(IntelIommu::new(memory.clone()));
        let router = Arc::new(GsiRouter::new(kvm.clone()));
        (Edu::new(memory.clone(), iommu, kvm.clone(), router, 3, 16).unwrap(), kvm, memory)
    }

    fn reg(edu: &Edu, offset: u64) -> u64 {
        let mut b = [0u8; 8];
        edu.read(offset, &mut b);
        u64::from_le_bytes(b)
    }

    fn dma(edu: &Edu, src: u64, dst: u64, count: u64, cmd: u64) {
        edu.write(REG_DMA_SRC, &src.to_le_bytes());
        edu.write(REG_DMA_DST, &dst.to_le_bytes());
        edu.write(REG_DMA_COUNT, &count.to_le_bytes());
        edu.write(REG_DMA_CMD, &(cmd as u32).to_le_bytes());
    }

    #[test]
    fn registers_dma_and_the_intx_line() {
        let (edu, kvm, memory) = edu();
        assert_eq!(reg(&edu, REG_ID) as u32, ID);
        edu.write(REG_ALIVE, &7u32.to_le_bytes());
        assert_eq!(reg(&edu, REG_ALIVE) as u32, !7);
        edu.write(REG_FACTORIAL, &5u32.to_le_bytes());
        assert_eq!(reg(&edu, REG_FACTORIAL), 120);
        // Guest memory -> buffer -> guest memory 4 bytes on (translation off: identity).
        memory.write_obj(0x1234_5678u32, GuestAddress(0x10_0000)).unwrap();
        dma(&edu, 0x10_0000, BUFFER_AT + 8, 4, DMA_START);
        assert_eq!(reg(&edu, REG_DMA_CMD) & DMA_START, 0, "done when the write returns");
        dma(&edu, BUFFER_AT + 8, 0x10_0004, 4, DMA_START | DMA_FROM_BUFFER | DMA_IRQ);
        assert_eq!(memory.read_obj::<u32>(GuestAddress(0x10_0004)).unwrap(), 0x1234_5678);
        assert_eq!(reg(&edu, REG_INTR_STATUS) as u32, IRQ_DMA);
        assert_eq!(*kvm.lines.lock().unwrap(), vec![(16, true)], "INTx up");
        edu.write(REG_INTR_ACK, &IRQ_DMA.to_le_bytes());
        assert_eq!(kvm.lines.lock().unwrap().last(), Some(&(16, false)), "acknowledged: down");
        // A hostile DMA: beyond the buffer, or too long. Nothing moves, nothing breaks.
        memory.write_obj(0u32, GuestAddress(0x20_0000)).unwrap();
        dma(&edu, BUFFER_AT + 4095, 0x20_0000, 4, DMA_START | DMA_FROM_BUFFER);
        dma(&edu, BUFFER_AT, 0x20_0000, u64::MAX, DMA_START | DMA_FROM_BUFFER);
        dma(&edu, BUFFER_AT, u64::MAX - 1, 4, DMA_START | DMA_FROM_BUFFER);
        assert_eq!(memory.read_obj::<u32>(GuestAddress(0x20_0000)).unwrap(), 0);
    }

    #[test]
    fn msi_goes_out_as_the_iommu_remaps_it() {
        let (edu, kvm, memory) = edu();
        let function = edu.pci_function(DeviceId(0), 0xc000_0000);
        let mut config = function.config;
        let cap = *edu.msi_cap.get().unwrap();
        // IRTE 1 at 1 MiB: vector 0xee to APIC 0; remapping on; a remappable message for it.
        memory.write_obj(1u64 | (0xee << 16), GuestAddress(0x10_0000 + 16)).unwrap();
        edu.iommu.write(0xb8, &(0x10_0000u64 | 0xf).to_le_bytes());
        edu.iommu.write(0x18, &(1u32 << 24).to_le_bytes());
        edu.iommu.write(0x18, &((1u32 << 24) | (1 << 25)).to_le_bytes());
        config.write(cap + 4, &(0xfee0_0000u32 | (1 << 5) | (1 << 4)).to_le_bytes());
        config.write(cap + 2, &MSI_ENABLE.to_le_bytes());
        edu.config_written(&config, cap + 2, 2);
        edu.write(REG_INTR_RAISE, &1u32.to_le_bytes());
        let routes = kvm.msi_routes();
        assert!(routes.contains(&(edu.msi.1, MsiMessage { address: 0xfee0_0000, data: 0xee })), "{routes:?}");
        assert!(kvm.lines.lock().unwrap().is_empty(), "MSI, not INTx");
    }
}
