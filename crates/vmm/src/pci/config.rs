//! One function's configuration space: 4 KiB of registers, a write mask per bit, and the
//! BAR registers with their sizing behaviour.

/// Standard header offsets.
pub const VENDOR_ID: usize = 0x00;
pub const DEVICE_ID: usize = 0x02;
pub const COMMAND: usize = 0x04;
pub const STATUS: usize = 0x06;
pub const REVISION: usize = 0x08;
pub const CLASS_PROG: usize = 0x09;
pub const CACHE_LINE: usize = 0x0c;
pub const LATENCY: usize = 0x0d;
pub const HEADER_TYPE: usize = 0x0e;
pub const BAR0: usize = 0x10;
pub const SUBSYSTEM_VENDOR: usize = 0x2c;
pub const CAP_POINTER: usize = 0x34;
pub const INTERRUPT_LINE: usize = 0x3c;
pub const INTERRUPT_PIN: usize = 0x3d;

pub const COMMAND_IO: u16 = 1 << 0;
pub const COMMAND_MEMORY: u16 = 1 << 1;
const COMMAND_WRITABLE: u16 = COMMAND_IO | COMMAND_MEMORY | (1 << 2) | (1 << 6) | (1 << 8) | (1 << 10);
const STATUS_CAP_LIST: u16 = 1 << 4;

pub const CONFIG_SIZE: usize = 4096;
/// The part of config space configuration mechanism #1 reaches.
pub const LEGACY_CONFIG_SIZE: usize = 256;
pub const BAR_COUNT: usize = 6;

/// What a BAR decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    Io,
    Memory32,
    /// A 64-bit memory BAR: this register and the next one hold its address.
    Memory64,
}

/// A BAR as the VMM defines it: kind and size (a power of two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarSpec {
    pub kind: BarKind,
    pub size: u64,
}

impl BarSpec {
    /// Bits of the BAR register(s) that hold the address.
    fn address_mask(&self) -> u64 {
        let mask = !(self.size - 1);
        match self.kind {
            BarKind::Io => mask & 0xffff_fffc,
            BarKind::Memory32 => mask & 0xffff_fff0,
            BarKind::Memory64 => mask & !0xf,
        }
    }

    fn flag_bits(&self) -> u32 {
        match self.kind {
            BarKind::Io => 0x1,
            BarKind::Memory32 => 0x0,
            BarKind::Memory64 => 0x4,
        }
    }

    /// Whether the command register's memory (not I/O) decode bit governs it.
    pub fn is_memory(&self) -> bool {
        self.kind != BarKind::Io
    }
}

/// Identity of a function, written into its header.
#[derive(Clone, Copy, Debug)]
pub struct PciIds {
    pub vendor: u16,
    pub device: u16,
    /// Class, subclass, programming interface.
    pub class: [u8; 3],
    pub revision: u8,
    pub subsystem_vendor: u16,
    pub subsystem: u16,
}

impl PciIds {
    /// One of the VMM's own functions: our vendor ID, revision 1, subsystem = device.
    pub fn exitless(device: u16, class: [u8; 3]) -> Self {
        PciIds {
            vendor: super::VENDOR_EXITLESS,
            device,
            class,
            revision: 1,
            subsystem_vendor: super::VENDOR_EXITLESS,
            subsystem: device,
        }
    }
}

#[derive(Clone)]
pub struct ConfigSpace {
    bytes: Box<[u8; CONFIG_SIZE]>,
    writable: Box<[u8; CONFIG_SIZE]>,
    bars: [Option<BarSpec>; BAR_COUNT],
    next_cap: usize,
    last_cap: Option<usize>,
}

impl ConfigSpace {
    /// A type-0 header with the given identity, everything else zero and read-only but the
    /// command register, cache line size, latency timer and interrupt line.
    pub fn new(ids: PciIds) -> Self {
        let mut c = ConfigSpace {
            bytes: Box::new([0; CONFIG_SIZE]),
            writable: Box::new([0; CONFIG_SIZE]),
            bars: [None; BAR_COUNT],
            next_cap: 0x40,
            last_cap: None,
        };
        c.set16(VENDOR_ID, ids.vendor);
        c.set16(DEVICE_ID, ids.device);
        c.bytes[REVISION] = ids.revision;
        c.bytes[CLASS_PROG..CLASS_PROG + 3].copy_from_slice(&[ids.class[2], ids.class[1], ids.class[0]]);
        c.set16(SUBSYSTEM_VENDOR, ids.subsystem_vendor);
        c.set16(SUBSYSTEM_VENDOR + 2, ids.subsystem);
        c.writable[COMMAND..COMMAND + 2].copy_from_slice(&COMMAND_WRITABLE.to_le_bytes());
        for reg in [CACHE_LINE, LATENCY, INTERRUPT_LINE] {
            c.writable[reg] = 0xff;
        }
        c
    }

    /// Declares BAR `index` at `address`; the address bits become writable. A 64-bit BAR
    /// takes register `index + 1` as well.
    pub fn set_bar(&mut self, index: usize, spec: BarSpec, address: u64) {
        let regs = if spec.kind == BarKind::Memory64 { 2 } else { 1 };
        let fits = index + regs <= BAR_COUNT && spec.size.is_power_of_two() && spec.size >= 4;
        assert!(fits, "VMM bug: bad BAR {index} {spec:?}");
        self.bars[index] = Some(spec);
        let reg = BAR0 + 4 * index;
        let (value, mask) = (address & spec.address_mask(), spec.address_mask());
        self.set32(reg, value as u32 | spec.flag_bits());
        self.writable[reg..reg + 4].copy_from_slice(&(mask as u32).to_le_bytes());
        if regs == 2 {
            self.set32(reg + 4, (value >> 32) as u32);
            self.writable[reg + 4..reg + 8].copy_from_slice(&((mask >> 32) as u32).to_le_bytes());
        }
    }

    /// Appends a capability with `id` and `body` (after the id/next bytes) to the list;
    /// returns its offset.
    pub fn add_capability(&mut self, id: u8, body: &[u8]) -> usize {
        let at = self.next_cap;
        assert!(at + 2 + body.len() <= LEGACY_CONFIG_SIZE, "VMM bug: capabilities overflow");
        self.bytes[at] = id;
        self.bytes[at + 2..at + 2 + body.len()].copy_from_slice(body);
        match self.last_cap {
            None => self.bytes[CAP_POINTER] = at as u8,
            Some(prev) => self.bytes[prev + 1] = at as u8,
        }
        let status = self.get16(STATUS) | STATUS_CAP_LIST;
        self.set16(STATUS, status);
        self.last_cap = Some(at);
        self.next_cap = (at + 2 + body.len() + 3) & !3;
        at
    }

    /// The legacy interrupt pin (1 = INTA#) the function uses.
    pub fn set_interrupt_pin(&mut self, pin: u8) {
        self.bytes[INTERRUPT_PIN] = pin;
    }

    /// Makes the bits set in `mask` guest-writable, from `offset` on.
    pub fn set_write_mask(&mut self, offset: usize, mask: &[u8]) {
        self.writable[offset..offset + mask.len()].copy_from_slice(mask);
    }

    pub fn read_u16(&self, at: usize) -> u16 {
        self.get16(at)
    }

    /// Makes bytes `[offset, offset + len)` guest-writable (a device's own registers).
    pub fn set_writable(&mut self, offset: usize, len: usize) {
        self.writable[offset..offset + len].fill(0xff);
    }

    /// Reads any bytes inside the 4 KiB; bytes past the end read as all-ones.
    pub fn read(&self, offset: usize, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = offset.checked_add(i).and_then(|at| self.bytes.get(at)).copied().unwrap_or(0xff);
        }
    }

    /// Guest write: only writable bits change; bytes past the end are dropped.
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            let Some(at) = offset.checked_add(i).filter(|&at| at < CONFIG_SIZE) else { break };
            self.bytes[at] = (self.bytes[at] & !self.writable[at]) | (b & self.writable[at]);
        }
    }

    /// Puts back what a guest had written (a snapshot's copy of this function's config
    /// space): refused if a read-only bit differs, since then it was another function.
    pub fn restore(&mut self, saved: &[u8]) -> Result<(), String> {
        if saved.len() != CONFIG_SIZE {
            return Err(format!("{} bytes of config space, not {CONFIG_SIZE}", saved.len()));
        }
        let differs = (0..CONFIG_SIZE).find(|&i| (saved[i] ^ self.bytes[i]) & !self.writable[i] != 0);
        if let Some(at) = differs {
            return Err(format!("config byte {at:#x} is {:#04x} there, {:#04x} here", saved[at], self.bytes[at]));
        }
        self.write(0, saved);
        Ok(())
    }

    pub fn bytes(&self) -> &[u8; CONFIG_SIZE] {
        &self.bytes
    }

    pub fn command(&self) -> u16 {
        self.get16(COMMAND)
    }

    pub fn bar(&self, index: usize) -> Option<BarSpec> {
        self.bars.get(index).copied().flatten()
    }

    /// The address BAR `index` holds now (after sizing, that is the size mask).
    pub fn bar_address(&self, index: usize) -> Option<u64> {
        let spec = self.bar(index)?;
        let reg = BAR0 + 4 * index;
        let high = if spec.kind == BarKind::Memory64 { u64::from(self.get32(reg + 4)) << 32 } else { 0 };
        Some((high | u64::from(self.get32(reg))) & spec.address_mask())
    }

    /// Whether the function decodes accesses to this BAR (its command register bit is set).
    pub fn bar_enabled(&self, index: usize) -> bool {
        let bit = match self.bar(index) {
            Some(spec) if spec.is_memory() => COMMAND_MEMORY,
            Some(_) => COMMAND_IO,
            None => return false,
        };
        self.command() & bit != 0
    }

    fn get16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]])
    }

    fn get32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap_or([0xff; 4]))
    }

    fn set16(&mut self, at: usize, v: u16) {
        self.bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn set32(&mut self, at: usize, v: u32) {
        self.bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> PciIds {
        PciIds { vendor: 0x1234, device: 0x5678, class: [0xff, 0, 0], revision: 1, subsystem_vendor: 0, subsystem: 0 }
    }

    fn read32(c: &ConfigSpace, at: usize) -> u32 {
        let mut d = [0u8; 4];
        c.read(at, &mut d);
        u32::from_le_bytes(d)
    }

    #[test]
    fn a_64_bit_bar_spans_two_registers_and_sizes_both() {
        let mut c = ConfigSpace::new(ids());
        c.set_bar(2, BarSpec { kind: BarKind::Memory64, size: 1 << 32 }, 0x40_0000_0000);
        assert_eq!(read32(&c, BAR0 + 8), 0x4, "64-bit memory type, address bits clear");
        assert_eq!(read32(&c, BAR0 + 12), 0x40);
        assert_eq!(c.bar_address(2), Some(0x40_0000_0000));
        c.write(BAR0 + 8, &[0xff; 4]);
        c.write(BAR0 + 12, &[0xff; 4]);
        assert_eq!(read32(&c, BAR0 + 8), 0x4, "4 GiB: no low address bits");
        assert_eq!(read32(&c, BAR0 + 12), 0xffff_ffff);
        c.write(BAR0 + 12, &0x12u32.to_le_bytes());
        c.write(BAR0 + 8, &0u32.to_le_bytes());
        assert_eq!(c.bar_address(2), Some(0x12_0000_0000));
        c.write(COMMAND, &[0x2, 0]);
        assert!(c.bar_enabled(2));
    }

    #[test]
    fn bar_sizing_reads_back_the_size_mask_and_keeps_flag_bits() {
        let mut c = ConfigSpace::new(ids());
        c.set_bar(0, BarSpec { kind: BarKind::Memory32, size: 0x1000 }, 0xd000_0000);
        c.set_bar(1, BarSpec { kind: BarKind::Io, size: 16 }, 0x510);
        assert_eq!(read32(&c, BAR0), 0xd000_0000);
        assert_eq!(read32(&c, BAR0 + 4), 0x511);
        c.write(BAR0, &[0xff; 4]);
        c.write(BAR0 + 4, &[0xff; 4]);
        assert_eq!(read32(&c, BAR0), 0xffff_f000, "4 KiB memory BAR");
        assert_eq!(read32(&c, BAR0 + 4), 0xffff_fff1, "16-port I/O BAR, I/O flag kept");
        c.write(BAR0, &0xc000_1234u32.to_le_bytes());
        assert_eq!(c.bar_address(0), Some(0xc000_1000));
        // An unimplemented BAR is read-only zero.
        c.write(BAR0 + 8, &[0xff; 4]);
        assert_eq!(read32(&c, BAR0 + 8), 0);
    }

    #[test]
    fn read_only_fields_stay_read_only() {
        let mut c = ConfigSpace::new(ids());
        c.add_capability(0x09, &[4, 0xaa]);
        let before = *c.bytes();
        for offset in 0..CONFIG_SIZE {
            c.write(offset, &[0xff]);
            c.write(offset, &[0x00]);
        }
        let after = c.bytes();
        for (i, (a, b)) in before.iter().zip(after.iter()).enumerate() {
            let writable = matches!(i, 0x04 | 0x05 | 0x0c | 0x0d | 0x3c);
            assert!(writable || a == b, "byte {i:#x} changed {a:#x} -> {b:#x}");
        }
        assert_eq!(read32(&c, 0), 0x5678_1234);
        c.write(COMMAND, &[0xff, 0xff]);
        assert_eq!(c.command(), COMMAND_WRITABLE, "only the implemented command bits");
    }

    #[test]
    fn capabilities_are_chained() {
        let mut c = ConfigSpace::new(ids());
        c.add_capability(0x09, &[3]);
        c.add_capability(0x05, &[0; 10]);
        assert_ne!(c.bytes()[STATUS] & 0x10, 0);
        let first = c.bytes()[CAP_POINTER] as usize;
        assert_eq!(c.bytes()[first], 0x09);
        let second = c.bytes()[first + 1] as usize;
        assert_eq!((second, c.bytes()[second], c.bytes()[second + 1]), (0x44, 0x05, 0));
    }

    #[test]
    fn accesses_past_the_end_are_safe() {
        let mut c = ConfigSpace::new(ids());
        let mut d = [0u8; 4];
        c.read(CONFIG_SIZE - 2, &mut d);
        assert_eq!(d, [0, 0, 0xff, 0xff]);
        c.write(CONFIG_SIZE - 1, &[1, 2, 3, 4]);
        c.read(usize::MAX - 1, &mut d);
        c.write(usize::MAX - 1, &d);
        assert_eq!(d, [0xff; 4]);
    }
}
