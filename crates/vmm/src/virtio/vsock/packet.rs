//! The virtio-vsock packet header (virtio 1.2, 5.10.6), little-endian, 44 bytes, and the
//! checks a packet from the guest must pass before the device acts on it.

pub const HEADER_LEN: usize = 44;
/// The host's context id, the one a guest connects to.
pub const HOST_CID: u64 = 2;
pub const TYPE_STREAM: u16 = 1;

pub const OP_REQUEST: u16 = 1;
pub const OP_RESPONSE: u16 = 2;
pub const OP_RST: u16 = 3;
pub const OP_SHUTDOWN: u16 = 4;
pub const OP_RW: u16 = 5;
pub const OP_CREDIT_UPDATE: u16 = 6;
pub const OP_CREDIT_REQUEST: u16 = 7;

/// SHUTDOWN flags: the sender will receive no more, send no more.
pub const SHUTDOWN_RCV: u32 = 1;
pub const SHUTDOWN_SEND: u32 = 2;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub src_cid: u64,
    pub dst_cid: u64,
    pub src_port: u32,
    pub dst_port: u32,
    pub len: u32,
    pub kind: u16,
    pub op: u16,
    pub flags: u32,
    pub buf_alloc: u32,
    pub fwd_cnt: u32,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| u64::from(u32_at(o)) | (u64::from(u32_at(o + 4)) << 32);
        Header {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            kind: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }

    pub fn bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.kind.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }

    /// A packet from the host (`local_port`) to the guest's `peer_port`.
    pub fn to_guest(guest_cid: u64, local_port: u32, peer_port: u32, op: u16) -> Header {
        Header {
            src_cid: HOST_CID,
            dst_cid: guest_cid,
            src_port: local_port,
            dst_port: peer_port,
            kind: TYPE_STREAM,
            op,
            ..Header::default()
        }
    }
}

/// Why a packet from the guest is not acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadPacket {
    #[error("shorter than its header")]
    Short,
    #[error("its source is CID {0}, not the guest's")]
    Source(u64),
    #[error("it is for CID {0}, not the host")]
    Destination(u64),
    #[error("type {0} is not a stream")]
    Type(u16),
    #[error("op {0} is not an operation")]
    Op(u16),
    #[error("it says {said} payload bytes and carries {carried}")]
    Length { said: u32, carried: usize },
}

/// Checks a packet from the guest whose chain carries `carried` bytes after the header.
pub fn check(h: &Header, guest_cid: u64, carried: usize) -> Result<(), BadPacket> {
    if h.src_cid != guest_cid {
        return Err(BadPacket::Source(h.src_cid));
    }
    if h.dst_cid != HOST_CID {
        return Err(BadPacket::Destination(h.dst_cid));
    }
    if h.kind != TYPE_STREAM {
        return Err(BadPacket::Type(h.kind));
    }
    if !(OP_REQUEST..=OP_CREDIT_REQUEST).contains(&h.op) {
        return Err(BadPacket::Op(h.op));
    }
    // Only RW carries a payload, and never more than the chain holds.
    let said = if h.op == OP_RW { h.len } else { 0 };
    if said as usize > carried || (h.op != OP_RW && h.len != 0) {
        return Err(BadPacket::Length { said: h.len, carried });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_checks() {
        let h = Header {
            src_cid: 3,
            dst_cid: 2,
            src_port: 1,
            dst_port: 2,
            len: 5,
            kind: 1,
            op: OP_RW,
            flags: 0,
            buf_alloc: 9,
            fwd_cnt: 7,
        };
        assert_eq!(Header::parse(&h.bytes()), h);
        assert_eq!(check(&h, 3, 5), Ok(()));
        assert_eq!(check(&h, 3, 4), Err(BadPacket::Length { said: 5, carried: 4 }));
        assert_eq!(check(&h, 4, 5), Err(BadPacket::Source(3)));
        assert_eq!(check(&Header { dst_cid: 7, ..h }, 3, 5), Err(BadPacket::Destination(7)));
        assert_eq!(check(&Header { op: 9, ..h }, 3, 5), Err(BadPacket::Op(9)));
        assert_eq!(check(&Header { kind: 2, ..h }, 3, 5), Err(BadPacket::Type(2)));
        assert!(check(&Header { op: OP_REQUEST, ..h }, 3, 5).is_err(), "a REQUEST carries nothing");
    }
}
