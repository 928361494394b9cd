//! QEMU's fw_cfg interface (the legacy port form), for guests written against QEMU's PC
//! machine such as kvm-unit-tests: a 16-bit selector written at port 0x510 picks an item,
//! then each byte read from 0x511 returns the item's next byte (zero past its end).
//! Only the items such guests read are offered: signature, interface ID, RAM size and CPU
//! counts.

use crate::bus::BusDevice;
use std::collections::BTreeMap;
use std::sync::Mutex;

pub const FW_CFG_PORT: u16 = 0x510;
pub const FW_CFG_LEN: u64 = 2;

const SIGNATURE: u16 = 0x00;
const ID: u16 = 0x01;
const RAM_SIZE: u16 = 0x03;
const NB_CPUS: u16 = 0x05;
const MAX_CPUS: u16 = 0x0f;
/// Interface ID bit 0: the traditional (port) interface, no DMA.
const ID_TRADITIONAL: u32 = 1;

pub struct FwCfg {
    items: BTreeMap<u16, Vec<u8>>,
    /// The selected item and the offset of the next byte.
    cursor: Mutex<(u16, usize)>,
}

impl FwCfg {
    pub fn new(ram_size: u64, vcpus: u8) -> Self {
        let items = BTreeMap::from([
            (SIGNATURE, b"QEMU".to_vec()),
            (ID, ID_TRADITIONAL.to_le_bytes().to_vec()),
            (RAM_SIZE, ram_size.to_le_bytes().to_vec()),
            (NB_CPUS, u16::from(vcpus).to_le_bytes().to_vec()),
            (MAX_CPUS, u16::from(vcpus).to_le_bytes().to_vec()),
        ]);
        FwCfg { items, cursor: Mutex::new((0, 0)) }
    }
}

impl BusDevice for FwCfg {
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset != 1 {
            return;
        }
        let mut cursor = crate::sync::lock(&self.cursor);
        let item = self.items.get(&cursor.0);
        for b in data.iter_mut() {
            *b = item.and_then(|v| v.get(cursor.1)).copied().unwrap_or(0);
            cursor.1 = cursor.1.saturating_add(1);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        // The selector is a 16-bit register at offset 0; data-port writes are not supported
        // (QEMU ignores them too, since 2.4).
        if offset == 0 && data.len() == 2 {
            *crate::sync::lock(&self.cursor) = (u16::from_le_bytes([data[0], data[1]]), 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(cfg: &FwCfg, key: u16, len: usize) -> Vec<u8> {
        cfg.write(0, &key.to_le_bytes());
        (0..len)
            .map(|_| {
                let mut b = [0u8];
                cfg.read(1, &mut b);
                b[0]
            })
            .collect()
    }

    #[test]
    fn items_read_byte_by_byte_and_restart_on_select() {
        let cfg = FwCfg::new(256 << 20, 3);
        assert_eq!(item(&cfg, SIGNATURE, 4), b"QEMU");
        assert_eq!(item(&cfg, NB_CPUS, 2), [3, 0]);
        assert_eq!(u64::from_le_bytes(item(&cfg, RAM_SIZE, 8).try_into().unwrap()), 256 << 20);
        assert_eq!(item(&cfg, SIGNATURE, 6), b"QEMU\0\0", "zero past the end");
        assert_eq!(item(&cfg, 0x11, 8), [0; 8], "an item we do not have reads zero");
        assert_eq!(item(&cfg, SIGNATURE, 1), b"Q");
        cfg.write(0, &[5]); // a byte write is not a selector write
        let mut b = [0u8];
        cfg.read(1, &mut b);
        assert_eq!(&b, b"E");
    }
}
