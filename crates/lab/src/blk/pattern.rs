//! The pattern every sector of the lab's disk carries (the same as the guest's
//! `blkreq.h`): u64 word 0 is the sector's LBA, word 1 a stamp (which run wrote it, 0 for
//! the initial fill), word k >= 2 a mix of the two. A read can be checked without knowing
//! what wrote the sector last; a scan can count what one run wrote.

use std::io::Read;

pub const SECTOR: usize = 512;

pub fn word(lba: u64, stamp: u64, k: u64) -> u64 {
    let x = lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ stamp.wrapping_mul(0xff51_afd7_ed55_8ccd) ^ k;
    x ^ (x >> 29)
}

fn words(sector: &[u8]) -> impl Iterator<Item = u64> + '_ {
    sector.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
}

/// Fills `buf` (whole sectors) as sectors `lba`.. written under `stamp`.
pub fn fill(buf: &mut [u8], lba: u64, stamp: u64) {
    for (s, sector) in buf.chunks_exact_mut(SECTOR).enumerate() {
        let lba = lba + s as u64;
        for (k, w) in sector.chunks_exact_mut(8).enumerate() {
            let v = match k {
                0 => lba,
                1 => stamp,
                k => word(lba, stamp, k as u64),
            };
            w.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// The stamp sector `lba` carries, or None if it does not carry its pattern.
pub fn stamp_of(sector: &[u8], lba: u64) -> Option<u64> {
    let mut w = words(sector);
    let (first, stamp) = (w.next()?, w.next()?);
    (first == lba && w.enumerate().all(|(k, v)| v == word(lba, stamp, k as u64 + 2))).then_some(stamp)
}

/// How many of `buf`'s sectors (from `lba` on) do not carry their pattern.
pub fn bad_sectors(buf: &[u8], lba: u64) -> u64 {
    buf.chunks_exact(SECTOR).enumerate().filter(|(s, sector)| stamp_of(sector, lba + *s as u64).is_none()).count()
        as u64
}

/// A whole-disk scan: sectors without their pattern, and sectors carrying `stamp`.
pub fn scan(mut file: impl Read, stamp: u64) -> std::io::Result<(u64, u64)> {
    let mut buf = vec![0u8; 4 << 20];
    let (mut lba, mut bad, mut stamped) = (0u64, 0u64, 0u64);
    loop {
        let mut n = 0;
        while n < buf.len() {
            match file.read(&mut buf[n..])? {
                0 => break,
                r => n += r,
            }
        }
        for sector in buf[..n - n % SECTOR].chunks_exact(SECTOR) {
            match stamp_of(sector, lba) {
                None => bad += 1,
                Some(s) if s == stamp => stamped += 1,
                Some(_) => {}
            }
            lba += 1;
        }
        if n < buf.len() {
            return Ok((bad, stamped));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_sectors_verify_and_damage_is_found() {
        let mut buf = vec![0u8; 4 * SECTOR];
        fill(&mut buf, 100, 7);
        assert_eq!(bad_sectors(&buf, 100), 0);
        assert_eq!(stamp_of(&buf[SECTOR..2 * SECTOR], 101), Some(7));
        assert_eq!(bad_sectors(&buf, 101), 4, "every sector at the wrong LBA");
        buf[3 * SECTOR + 100] ^= 1;
        assert_eq!(bad_sectors(&buf, 100), 1);
        assert_eq!(scan(&buf[..], 7).unwrap(), (4, 0), "scanned as LBAs 0..4");
        let mut disk = vec![0u8; 8 * SECTOR];
        fill(&mut disk[..4 * SECTOR], 0, 0);
        fill(&mut disk[4 * SECTOR..], 4, 9);
        assert_eq!(scan(&disk[..], 9).unwrap(), (0, 4));
    }
}
