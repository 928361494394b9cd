//! ACPI tables, built from the same [`layout`](crate::layout) the VMM places devices by:
//! RSDP -> XSDT -> FADT (-> FACS, DSDT), MADT, MCFG. Written with rust-vmm's `acpi_tables`.
//!
//! The platform is ACPI "fixed hardware" (not hardware-reduced), as on a PC: PM1a event and
//! control registers, a PM timer and a reset register, served by [`AcpiPm`](crate::devices::legacy::acpi_pm).
//! MCFG points at the ECAM window, so Linux reads config space through it.

use crate::guest_memory::GuestMemoryMmap;
use crate::layout::{self, MemoryMap};
use acpi_tables::aml::{self, AddressSpace, AddressSpaceCacheable, EISAName, Interrupt, Name, Package, Path, IO};
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::gas::{AccessSize, AddressSpace as GasSpace, GAS};
use acpi_tables::madt::{EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT};
use acpi_tables::mcfg::MCFG;
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::{facs::FACS, Aml, AmlSink};
use vm_memory::{Bytes, GuestAddress};
use zerocopy::byteorder::{LE, U16, U32};
use zerocopy::{Immutable, IntoBytes};

const OEM_ID: [u8; 6] = *b"EXITLS";
const OEM_TABLE_ID: [u8; 8] = *b"EXITLESS";
const OEM_REVISION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    #[error("the ACPI tables take {0} bytes, more than their {1}-byte area")]
    TooBig(usize, u64),
    #[error("cannot write the ACPI tables into guest memory")]
    Memory(#[from] vm_memory::GuestMemoryError),
}

/// MADT interrupt source override: ISA `source` arrives on `gsi` with `flags` (polarity, trigger).
#[repr(C, packed)]
#[derive(Clone, Copy, IntoBytes, Immutable)]
struct InterruptSourceOverride {
    kind: u8,
    length: u8,
    bus: u8,
    source: u8,
    gsi: U32<LE>,
    flags: U16<LE>,
}

/// MADT local APIC NMI: LINT `lint` of every processor (uid 0xff) is the NMI.
#[repr(C, packed)]
#[derive(Clone, Copy, IntoBytes, Immutable)]
struct LocalApicNmi {
    kind: u8,
    length: u8,
    processor_uid: u8,
    flags: U16<LE>,
    lint: u8,
}

macro_rules! aml_as_bytes {
    ($t:ty) => {
        impl Aml for $t {
            fn to_aml_bytes(&self, sink: &mut dyn AmlSink) {
                sink.vec(self.as_bytes());
            }
        }
    };
}
aml_as_bytes!(InterruptSourceOverride);
aml_as_bytes!(LocalApicNmi);

/// MPS INTI flags: active high, level triggered.
const ISO_LEVEL_HIGH: u16 = 0x000d;

fn bytes(table: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    table.to_aml_bytes(&mut v);
    v
}

/// The DSDT: the PCI host bridge with its windows, COM1, the PS/2 keyboard, what the ACPI
/// devices add (`devices`: VMGenID and the GED, devices/acpi), and the S5 (soft-off)
/// sleep type.
/// (Each object is built and serialized in one statement: AML objects borrow their parts.)
fn dsdt(map: &MemoryMap, mmio_windows: &[(u64, u64, u32)], devices: &[u8]) -> Vec<u8> {
    let (mmio64, mmio64_size) = map.pci_mmio64();
    let mut dsdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    aml::Device::new(
        "_SB_.PCI0".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0A08")),
            &Name::new("_CID".into(), &EISAName::new("PNP0A03")),
            &Name::new("_ADR".into(), &aml::ZERO),
            &Name::new("_SEG".into(), &aml::ZERO),
            &Name::new("_UID".into(), &aml::ZERO),
            &Name::new("_BBN".into(), &aml::ZERO),
            &Name::new(
                "_CRS".into(),
                &aml::ResourceTemplate::new(vec![
                    &AddressSpace::new_bus_number(0u16, 0u16),
                    &IO::new(0xcf8, 0xcf8, 1, 8),
                    &AddressSpace::new_io(0u16, 0xcf7u16, None),
                    &AddressSpace::new_io(0xd00u16, 0xffffu16, None),
                    &AddressSpace::new_memory(
                        AddressSpaceCacheable::NotCacheable,
                        true,
                        layout::PCI_MMIO32_START as u32,
                        (layout::PCI_MMIO32_END - 1) as u32,
                        None,
                    ),
                    &AddressSpace::new_memory(
                        AddressSpaceCacheable::NotCacheable,
                        true,
                        mmio64,
                        mmio64 + mmio64_size - 1,
                        None,
                    ),
                ]),
            ),
        ],
    )
    .to_aml_bytes(&mut dsdt);
    aml::Device::new(
        "_SB_.COM1".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0501")),
            &Name::new("_UID".into(), &aml::ZERO),
            &Name::new(
                "_CRS".into(),
                &aml::ResourceTemplate::new(vec![
                    &IO::new(layout::COM1_PORT, layout::COM1_PORT, 1, 8),
                    &Interrupt::new(true, true, false, false, layout::COM1_IRQ),
                ]),
            ),
        ],
    )
    .to_aml_bytes(&mut dsdt);
    // Each virtio-mmio device, as Linux's virtio_mmio driver matches it in ACPI (LNRO0005),
    // for kernels that take devices from the DSDT rather than the command line.
    for (i, &(base, len, irq)) in mmio_windows.iter().enumerate() {
        aml::Device::new(
            format!("_SB_.V{i:03X}").as_str().into(),
            vec![
                &Name::new("_HID".into(), &"LNRO0005"),
                &Name::new("_UID".into(), &(i as u32)),
                &Name::new(
                    "_CRS".into(),
                    &aml::ResourceTemplate::new(vec![
                        &aml::Memory32Fixed::new(true, base as u32, len as u32),
                        &Interrupt::new(true, true, false, false, irq),
                    ]),
                ),
            ],
        )
        .to_aml_bytes(&mut dsdt);
    }
    // The PS/2 keyboard, so Linux's i8042 driver finds it through PNP (SendCtrlAltDel).
    aml::Device::new(
        "_SB_.PS2K".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0303")),
            &Name::new("_UID".into(), &aml::ZERO),
            &Name::new(
                "_CRS".into(),
                &aml::ResourceTemplate::new(vec![
                    &IO::new(layout::I8042_DATA_PORT, layout::I8042_DATA_PORT, 1, 1),
                    &IO::new(layout::I8042_CMD_PORT, layout::I8042_CMD_PORT, 1, 1),
                    &Interrupt::new(true, true, false, false, layout::I8042_IRQ),
                ]),
            ),
        ],
    )
    .to_aml_bytes(&mut dsdt);
    // The ECAM window as a motherboard resource: Linux uses MCFG's window only if ACPI also
    // reserves it this way (without 0xCF8 it checks, and otherwise says "not using MMCONFIG").
    aml::Device::new(
        "_SB_.MRES".into(),
        vec![
            &Name::new("_HID".into(), &EISAName::new("PNP0C02")),
            &Name::new("_UID".into(), &aml::ONE),
            &Name::new(
                "_CRS".into(),
                &aml::ResourceTemplate::new(vec![&aml::Memory32Fixed::new(
                    false,
                    layout::ECAM_GPA as u32,
                    layout::ECAM_SIZE as u32,
                )]),
            ),
        ],
    )
    .to_aml_bytes(&mut dsdt);
    dsdt.append_slice(devices);
    Name::new(Path::new("_S5_"), &Package::new(vec![&5u8, &0u8, &0u8, &0u8])).to_aml_bytes(&mut dsdt);
    dsdt.as_slice().to_vec()
}

fn fadt(dsdt: u64, facs: u64) -> Vec<u8> {
    let mut f = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(dsdt)
        .firmware_ctrl_64(facs)
        .flag(Flags::Wbinvd)
        .flag(Flags::ProcC1)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton)
        .flag(Flags::TmrValExt)
        .flag(Flags::ResetRegSup);
    f.dsdt = (dsdt as u32).into();
    f.firmware_ctrl = (facs as u32).into();
    f.sci_int = u16::from(layout::SCI_IRQ).into();
    // No SMI command port: the platform is always in ACPI mode.
    f.pm1a_evt_blk = u32::from(layout::ACPI_PM1_EVT).into();
    f.pm1_evt_len = 4;
    f.pm1a_cnt_blk = u32::from(layout::ACPI_PM1_CNT).into();
    f.pm1_cnt_len = 2;
    f.pm_tmr_blk = u32::from(layout::ACPI_PM_TMR).into();
    f.pm_tmr_len = 4;
    // IA-PC boot architecture: no VGA (bit 2), no CMOS RTC (bit 5); no 8042 (bit 1 clear),
    // though its reset line at port 0x64 works for `reboot=k`.
    f.iapc_boot_arch = ((1u16 << 2) | (1 << 5)).into();
    f.reset_reg = GAS::new(GasSpace::SystemIo, 8, 0, AccessSize::ByteAccess, u64::from(layout::ACPI_RESET));
    f.reset_value = layout::ACPI_RESET_VALUE;
    bytes(&f.finalize())
}

fn madt(vcpus: u8) -> Vec<u8> {
    let mut madt =
        MADT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION, LocalInterruptController::Address(layout::LAPIC_GPA as u32));
    for id in 0..vcpus {
        madt.add_structure(ProcessorLocalApic::new(id, id, EnabledStatus::Enabled));
    }
    madt.add_structure(IoApic::new(vcpus, layout::IOAPIC_GPA as u32, 0));
    madt.add_structure(InterruptSourceOverride {
        kind: 2,
        length: 10,
        bus: 0,
        source: layout::SCI_IRQ,
        gsi: u32::from(layout::SCI_IRQ).into(),
        flags: ISO_LEVEL_HIGH.into(),
    });
    madt.add_structure(LocalApicNmi { kind: 4, length: 6, processor_uid: 0xff, flags: 0.into(), lint: 1 });
    bytes(&madt)
}

fn mcfg() -> Vec<u8> {
    let mut mcfg = MCFG::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    mcfg.add_ecam(layout::ECAM_GPA, 0, 0, 0);
    bytes(&mcfg)
}

/// Where the tables a guest or the VMM looks up went.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub rsdp: u64,
    /// The FACS, whose waking vector an S3 resume jumps to (crate::machine::sleep).
    pub facs: u64,
}

/// Writes every table into the ACPI area; `devices` is the AML the ACPI devices add to
/// the DSDT.
pub fn write_tables(
    mem: &GuestMemoryMmap,
    map: &MemoryMap,
    vcpus: u8,
    mmio_windows: &[(u64, u64, u32)],
    devices: &[u8],
) -> Result<Placed, AcpiError> {
    let mut area: Vec<u8> = Vec::new();
    let mut place = |table: &[u8], align: usize| -> u64 {
        area.resize(area.len().next_multiple_of(align), 0);
        let at = layout::ACPI_START + area.len() as u64;
        area.extend_from_slice(table);
        at
    };
    let rsdp_at = place(&[0; 36], 16);
    let facs = place(&bytes(&FACS::new()), 64);
    let dsdt = place(&dsdt(map, mmio_windows, devices), 16);
    let fadt = place(&fadt(dsdt, facs), 16);
    let madt = place(&madt(vcpus), 16);
    let mcfg = place(&mcfg(), 16);
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    for table in [fadt, madt, mcfg] {
        xsdt.add_entry(table);
    }
    let xsdt = place(&bytes(&xsdt), 16);
    let rsdp = bytes(&Rsdp::new(OEM_ID, xsdt));
    area[..rsdp.len()].copy_from_slice(&rsdp);
    let room = layout::ACPI_END - layout::ACPI_START;
    if area.len() as u64 > room {
        return Err(AcpiError::TooBig(area.len(), room));
    }
    mem.write_slice(&area, GuestAddress(layout::ACPI_START))?;
    Ok(Placed { rsdp: rsdp_at, facs })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checksum_ok(t: &[u8]) -> bool {
        t.iter().fold(0u8, |a, &b| a.wrapping_add(b)) == 0
    }

    #[test]
    fn tables_checksum_and_point_at_each_other() {
        let map = MemoryMap::new(256 << 20).unwrap();
        let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 256 << 20)]).unwrap();
        let rsdp = write_tables(&mem, &map, 3, &[(0xc000_1000, 0x1000, 5)], b"\x10\x05_SB_").unwrap().rsdp;
        let read = |at: u64, len: usize| {
            let mut v = vec![0u8; len];
            mem.read_slice(&mut v, GuestAddress(at)).unwrap();
            v
        };
        let r = read(rsdp, 36);
        assert_eq!(&r[..8], b"RSD PTR ");
        assert!(checksum_ok(&r[..20]) && checksum_ok(&r));
        let xsdt_at = u64::from_le_bytes(r[24..32].try_into().unwrap());
        let table = |at: u64| {
            let len = u32::from_le_bytes(read(at + 4, 4).try_into().unwrap()) as usize;
            let t = read(at, len);
            assert!(checksum_ok(&t), "{:?} checksum", String::from_utf8_lossy(&t[..4]));
            t
        };
        let xsdt = table(xsdt_at);
        let entries: Vec<u64> = xsdt[36..].chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        let sigs: Vec<_> = entries.iter().map(|&a| table(a)[..4].to_vec()).collect();
        assert_eq!(sigs, [b"FACP".to_vec(), b"APIC".to_vec(), b"MCFG".to_vec()]);
        let madt = table(entries[1]);
        let (mut at, mut cpus) = (44, 0);
        while at < madt.len() {
            cpus += usize::from(madt[at] == 0);
            at += usize::from(madt[at + 1]);
        }
        assert_eq!(cpus, 3);
        let mcfg = table(entries[2]);
        assert_eq!(u64::from_le_bytes(mcfg[44..52].try_into().unwrap()), layout::ECAM_GPA);
        let fadt = table(entries[0]);
        let dsdt_at = u64::from_le_bytes(fadt[140..148].try_into().unwrap());
        assert_eq!(&table(dsdt_at)[..4], b"DSDT");
    }

    #[test]
    fn the_ecam_window_is_a_motherboard_resource() {
        let dsdt = dsdt(&MemoryMap::new(256 << 20).unwrap(), &[], &[]);
        // PNP0C02 as an EISA ID, then a Memory32Fixed descriptor (0x86) for the window.
        assert!(dsdt.windows(4).any(|w| w == [0x41, 0xd0, 0x0c, 0x02]), "no PNP0C02 device");
        let mut fixed = vec![0x86, 9, 0, 0];
        fixed.extend_from_slice(&(layout::ECAM_GPA as u32).to_le_bytes());
        fixed.extend_from_slice(&(layout::ECAM_SIZE as u32).to_le_bytes());
        assert!(dsdt.windows(fixed.len()).any(|w| w == fixed), "ECAM not in a _CRS");
    }
}
