//! A virtio-blk request read out of a descriptor chain, distrusting all of it: a 16-byte
//! header the device may read, data buffers pointing the way the request type needs, and
//! a status byte the device may write, all inside guest memory. Nothing here does I/O;
//! the worker acts only on what `parse` accepted.

use crate::guest_memory::GuestMemoryMmap;
use crate::virtio::chain::{self, ChainError, Segment};
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress};

pub const SECTOR_SIZE: u64 = 512;
pub const HEADER_LEN: usize = 16;

pub const VIRTIO_BLK_T_IN: u32 = 0;
pub const VIRTIO_BLK_T_OUT: u32 = 1;
pub const VIRTIO_BLK_T_FLUSH: u32 = 4;
pub const VIRTIO_BLK_T_GET_ID: u32 = 8;
pub const VIRTIO_BLK_T_DISCARD: u32 = 11;
pub const VIRTIO_BLK_T_WRITE_ZEROES: u32 = 13;

pub const VIRTIO_BLK_S_OK: u8 = 0;
pub const VIRTIO_BLK_S_IOERR: u8 = 1;
pub const VIRTIO_BLK_S_UNSUPP: u8 = 2;

/// The length of the serial number GET_ID returns.
pub const ID_LEN: usize = 20;
/// One discard or write-zeroes range: sector, num_sectors, flags.
pub const RANGE_LEN: usize = 16;
pub const WRITE_ZEROES_FLAG_UNMAP: u32 = 1;

/// The most bytes one request may move: far above what drivers send (Linux caps a request
/// at a few MiB), low enough that offsets cannot overflow.
pub const MAX_DATA: usize = 1 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    In,
    Out,
    Flush,
    GetId,
    Discard,
    WriteZeroes,
    Unsupported(u32),
}

impl Kind {
    fn from_type(t: u32) -> Kind {
        match t {
            VIRTIO_BLK_T_IN => Kind::In,
            VIRTIO_BLK_T_OUT => Kind::Out,
            VIRTIO_BLK_T_FLUSH => Kind::Flush,
            VIRTIO_BLK_T_GET_ID => Kind::GetId,
            VIRTIO_BLK_T_DISCARD => Kind::Discard,
            VIRTIO_BLK_T_WRITE_ZEROES => Kind::WriteZeroes,
            other => Kind::Unsupported(other),
        }
    }

    /// Whether the device writes the data buffers (else it reads them).
    fn device_writes(self) -> bool {
        matches!(self, Kind::In | Kind::GetId)
    }
}

/// A request the device may act on. Its data segments are in `Parser::data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub kind: Kind,
    pub sector: u64,
    pub data_len: usize,
    /// The guest address of the status byte.
    pub status: u64,
}

/// Why a chain is not a request the device can serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{0}")]
    Chain(ChainError),
    #[error("the chain ends without a device-writable status byte")]
    NoStatus,
    #[error("the chain starts without a readable 16-byte header")]
    NoHeader,
    #[error("a data buffer points the wrong way for the request type")]
    WrongDirection,
}

impl RequestError {
    /// Where the request's status byte is, when the chain had one the device may write:
    /// then the request can fail with IOERR rather than just be returned.
    pub fn status(&self, segs: &[Segment]) -> Option<u64> {
        match self {
            RequestError::Chain(_) | RequestError::NoStatus => None,
            _ => segs.last().filter(|s| s.writable && s.len > 0).map(|s| s.addr + s.len as u64 - 1),
        }
    }
}

/// Scratch space for parsing, reused for every request of a queue.
#[derive(Default)]
pub struct Parser {
    /// The chain's buffers as the guest gave them.
    pub segs: Vec<Segment>,
    /// The data buffers of the last request parsed (header and status byte cut away).
    pub data: Vec<Segment>,
}

impl Parser {
    pub fn parse(
        &mut self,
        chain: DescriptorChain<&GuestMemoryMmap>,
        mem: &GuestMemoryMmap,
    ) -> Result<Request, RequestError> {
        chain::walk(chain, mem, MAX_DATA + HEADER_LEN + 1, &mut self.segs).map_err(RequestError::Chain)?;
        let last = *self.segs.last().ok_or(RequestError::NoStatus)?;
        if !last.writable || last.len == 0 {
            return Err(RequestError::NoStatus);
        }
        let status = last.addr + last.len as u64 - 1;
        let header = self.read_header(mem)?;
        let kind = Kind::from_type(u32::from_le_bytes(header[0..4].try_into().unwrap_or_default()));
        let sector = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());

        // Data: everything between the header's 16 bytes and the status byte.
        self.data.clear();
        let (mut skip, end) = (HEADER_LEN, self.segs.len() - 1);
        for (i, s) in self.segs.iter().enumerate() {
            let len = if i == end { s.len - 1 } else { s.len };
            let cut = skip.min(len);
            skip -= cut;
            if len > cut {
                self.data.push(Segment { addr: s.addr + cut as u64, len: len - cut, writable: s.writable });
            }
        }
        let data_len = self.data.iter().map(|s| s.len).sum();
        if self.data.iter().any(|s| s.writable != kind.device_writes()) && kind != Kind::Flush {
            return Err(RequestError::WrongDirection);
        }
        Ok(Request { kind, sector, data_len, status })
    }

    /// The header: the chain's first 16 bytes, which must all be readable.
    fn read_header(&self, mem: &GuestMemoryMmap) -> Result<[u8; HEADER_LEN], RequestError> {
        let mut header = [0u8; HEADER_LEN];
        let mut at = 0;
        for s in &self.segs {
            if at == HEADER_LEN {
                break;
            }
            if s.writable {
                return Err(RequestError::NoHeader);
            }
            let n = s.len.min(HEADER_LEN - at);
            mem.read_slice(&mut header[at..at + n], GuestAddress(s.addr)).map_err(|_| RequestError::NoHeader)?;
            at += n;
        }
        if at < HEADER_LEN {
            return Err(RequestError::NoHeader);
        }
        Ok(header)
    }
}

/// The byte range a request of `len` bytes at `sector` covers, if it lies inside a disk
/// of `capacity` bytes.
pub fn byte_range(sector: u64, len: u64, capacity: u64) -> Option<(u64, u64)> {
    let start = sector.checked_mul(SECTOR_SIZE)?;
    let end = start.checked_add(len)?;
    (end <= capacity).then_some((start, len))
}

/// One discard or write-zeroes range from the request's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub sector: u64,
    pub sectors: u32,
    pub flags: u32,
}

impl Range {
    pub fn read(mem: &GuestMemoryMmap, data: &[Segment]) -> Option<Range> {
        let mut raw = [0u8; RANGE_LEN];
        if chain::gather(mem, data, &mut raw) != RANGE_LEN {
            return None;
        }
        Some(Range {
            sector: u64::from_le_bytes(raw[0..8].try_into().ok()?),
            sectors: u32::from_le_bytes(raw[8..12].try_into().ok()?),
            flags: u32::from_le_bytes(raw[12..16].try_into().ok()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges_stay_inside_the_disk_and_never_overflow() {
        assert_eq!(byte_range(0, 512, 4096), Some((0, 512)));
        assert_eq!(byte_range(7, 512, 4096), Some((3584, 512)));
        assert_eq!(byte_range(8, 512, 4096), None);
        assert_eq!(byte_range(7, 1024, 4096), None);
        assert_eq!(byte_range(u64::MAX / 256, 512, u64::MAX), None);
        assert_eq!(byte_range(1, u64::MAX, u64::MAX), None);
    }
}
