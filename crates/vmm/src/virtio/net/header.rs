//! The 12-byte virtio_net_hdr in front of every frame. A guest's TX header is checked
//! against the offloads it negotiated before the tap sees it, so the kernel is never
//! handed a header it would refuse (with a warning in its log); a frame the VMM consumes
//! itself (MMDS) has its partial checksum finished here.

use super::features::*;

pub const NEEDS_CSUM: u8 = 1;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_UDP: u8 = 3;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_ECN: u8 = 0x80;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("flags {0:#x}: only NEEDS_CSUM may be set on a sent frame")]
    Flags(u8),
    #[error("a partial checksum without VIRTIO_NET_F_CSUM")]
    CsumNotNegotiated,
    #[error("checksum at {start}+{offset} beyond the {len}-byte frame")]
    CsumBeyond { start: u16, offset: u16, len: usize },
    #[error("gso_type {0:#x} is unknown or was not negotiated")]
    GsoType(u8),
    #[error("gso_size {size} for a {len}-byte frame")]
    GsoSize { size: u16, len: usize },
}

impl VnetHdr {
    pub fn parse(b: &[u8; 10]) -> VnetHdr {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        }
    }

    /// Whether the tap may be handed this header with a frame of `len` bytes (after the
    /// header), given the `features` the guest negotiated.
    pub fn check_tx(&self, len: usize, features: u64) -> Result<(), HeaderError> {
        if self.flags & !NEEDS_CSUM != 0 {
            return Err(HeaderError::Flags(self.flags));
        }
        if self.flags & NEEDS_CSUM != 0 {
            if features & VIRTIO_NET_F_CSUM == 0 {
                return Err(HeaderError::CsumNotNegotiated);
            }
            let end = usize::from(self.csum_start) + usize::from(self.csum_offset) + 2;
            if end > len {
                return Err(HeaderError::CsumBeyond { start: self.csum_start, offset: self.csum_offset, len });
            }
        }
        let needed = match self.gso_type & !GSO_ECN {
            GSO_NONE if self.gso_type == GSO_NONE => return Ok(()),
            GSO_TCPV4 => VIRTIO_NET_F_HOST_TSO4,
            GSO_TCPV6 => VIRTIO_NET_F_HOST_TSO6,
            GSO_UDP if self.gso_type & GSO_ECN == 0 => VIRTIO_NET_F_HOST_UFO,
            _ => return Err(HeaderError::GsoType(self.gso_type)),
        };
        let ecn_ok = self.gso_type & GSO_ECN == 0 || features & VIRTIO_NET_F_HOST_ECN != 0;
        if features & needed == 0 || !ecn_ok {
            return Err(HeaderError::GsoType(self.gso_type));
        }
        if self.gso_size == 0 || usize::from(self.gso_size) >= len {
            return Err(HeaderError::GsoSize { size: self.gso_size, len });
        }
        Ok(())
    }
}

/// Finishes a partial checksum (NEEDS_CSUM): the ones' complement sum from `start` to
/// the end, the pseudo-header sum the guest left at `start + offset` included, stored
/// there. False if the field lies outside the frame.
pub fn complete_checksum(frame: &mut [u8], start: usize, offset: usize) -> bool {
    let at = start + offset;
    if at + 2 > frame.len() {
        return false;
    }
    let mut sum: u32 = 0;
    let mut words = frame[start..].chunks_exact(2);
    for w in &mut words {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    frame[at..at + 2].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u64 = VIRTIO_NET_F_CSUM | VIRTIO_NET_F_HOST_TSO4 | VIRTIO_NET_F_HOST_TSO6;

    fn hdr(flags: u8, gso_type: u8, gso_size: u16, csum_start: u16, csum_offset: u16) -> VnetHdr {
        VnetHdr { flags, gso_type, hdr_len: 54, gso_size, csum_start, csum_offset }
    }

    #[test]
    fn headers_are_checked_against_what_was_negotiated() {
        assert_eq!(VnetHdr::default().check_tx(60, 0), Ok(()));
        assert_eq!(hdr(1, 1, 1448, 34, 16).check_tx(65000, ALL), Ok(()));
        assert_eq!(hdr(1, 0, 0, 34, 16).check_tx(60, 0), Err(HeaderError::CsumNotNegotiated));
        assert!(matches!(hdr(1, 0, 0, 50, 16).check_tx(60, ALL), Err(HeaderError::CsumBeyond { .. })));
        assert_eq!(hdr(1, 1, 0, 34, 16).check_tx(65000, ALL), Err(HeaderError::GsoSize { size: 0, len: 65000 }));
        assert!(matches!(hdr(1, 1, 2000, 34, 16).check_tx(1500, ALL), Err(HeaderError::GsoSize { .. })));
        assert_eq!(hdr(1, 3, 1448, 34, 6).check_tx(65000, ALL), Err(HeaderError::GsoType(3)), "UFO not offered");
        assert_eq!(hdr(1, 9, 1448, 34, 6).check_tx(65000, ALL), Err(HeaderError::GsoType(9)));
        assert_eq!(hdr(1, 0x81, 1448, 34, 16).check_tx(65000, ALL), Err(HeaderError::GsoType(0x81)));
        assert_eq!(hdr(1, 1, 1448, 34, 16).check_tx(65000, VIRTIO_NET_F_CSUM), Err(HeaderError::GsoType(1)));
        assert_eq!(hdr(4, 0, 0, 0, 0).check_tx(60, ALL), Err(HeaderError::Flags(4)));
    }

    #[test]
    fn a_partial_checksum_is_finished() {
        // An IPv4 UDP datagram's checksum over "abc" plus a pseudo-header sum of 0x1234.
        let mut frame = [0u8; 11];
        frame[8..11].copy_from_slice(b"abc");
        frame[6..8].copy_from_slice(&0x1234u16.to_be_bytes());
        assert!(complete_checksum(&mut frame, 0, 6));
        // The receiver's check: pseudo-header plus the region, checksum included, is all ones.
        let mut sum: u32 =
            0x1234 + frame.chunks(2).map(|w| u32::from(w[0]) << 8 | u32::from(*w.get(1).unwrap_or(&0))).sum::<u32>();
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        assert!(!complete_checksum(&mut frame, 8, 4));
    }
}
