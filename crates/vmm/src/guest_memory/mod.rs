//! Guest memory as every part of the VMM reaches it: vm-memory's collection of regions,
//! each a host mapping, with one rule vm-memory lacks. Hotpluggable memory the guest has
//! not plugged is not the guest's: translation refuses it. Every access goes through a
//! region's `get_slice` (vm-memory's `Bytes`, a chain's iovecs, the queues' rings) or
//! `get_host_address`, both of which refuse an unplugged block, so a descriptor pointing
//! there is a bad descriptor like one pointing past RAM. The guest's vCPUs find no memory
//! slot there (virtio-mem maps a slot while any block of it is plugged; in such a slot an
//! unplugged block is read-only zeros, so that a vCPU's write stops the guest rather than
//! commit memory), and the host pages of a slot with no plugged block are PROT_NONE: the
//! last layer, should some path bypass translation. A slice of hotpluggable memory pins
//! its slots while it lives, so an unplug never protects memory a device is still copying
//! to (plugs.rs).
//!
//! The one way to give guest pages back to the host is here too ([`discard`]).

mod discard;
mod move_away;
mod plugs;
mod shared_file;

pub use discard::{discard, DiscardError};
pub use move_away::MovedAway;
pub use plugs::{Pin, Pins, PlugError, Plugs};
pub use shared_file::in_file;

use std::sync::Arc;
use vm_memory::bitmap::BS;
use vm_memory::guest_memory::Result as MemResult;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    AtomicAccess, Bytes, FileOffset, GuestAddress, GuestMemoryError, GuestMemoryRegion, GuestRegionCollection,
    GuestUsize, MemoryRegionAddress, ReadVolatile, VolatileSlice, WriteVolatile,
};

/// Guest memory: what devices, boot code and snapshots are handed.
pub type GuestMemoryMmap = GuestRegionCollection<GuestRegion>;

/// Why guest memory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("cannot map {size} bytes at guest address {start:#x}: {reason}")]
    Map { start: u64, size: usize, reason: String },
    #[error("guest memory regions overlap, are unsorted or absent: {0}")]
    Layout(#[from] vm_memory::GuestRegionCollectionError),
    #[error(transparent)]
    Plugs(#[from] PlugError),
}

/// One region of guest memory: RAM, or the hotpluggable region with the record of which
/// of its blocks the guest has plugged.
#[derive(Debug)]
pub struct GuestRegion {
    inner: vm_memory::GuestRegionMmap,
    /// Owned by the region (never shared beyond a borrow of it): what plugging and
    /// unplugging protect and replace is this region's mapping, alive while it is.
    plugs: Option<Plugs>,
    /// A shared file mapping remapped privately over the same file ([`GuestRegion::remap_private`]):
    /// vm-memory's record of the flags still says MAP_SHARED.
    remapped: std::sync::atomic::AtomicBool,
}

impl GuestRegion {
    /// RAM: every byte the guest's.
    pub fn ram(inner: vm_memory::GuestRegionMmap) -> GuestRegion {
        GuestRegion { inner, plugs: None, remapped: Default::default() }
    }

    /// The hotpluggable region over `inner` (mapped PROT_NONE: nothing is plugged yet), in
    /// blocks of `block_size` and memory slots of `slot_size`.
    pub fn hotplug(
        inner: vm_memory::GuestRegionMmap,
        block_size: u64,
        slot_size: u64,
    ) -> Result<GuestRegion, PlugError> {
        // A shared file mapping (a memfd a vhost-user backend maps): plugs map its pages.
        let shared = inner.flags() & libc::MAP_SHARED != 0;
        let file = inner.file_offset().filter(|_| shared).map(|f| (f.arc().clone(), f.start()));
        let plugs = Plugs::new(inner.start_addr().0, inner.as_ptr(), inner.len(), block_size, slot_size)?;
        let plugs = match file {
            Some(file) => plugs.over_file(file),
            None => plugs,
        };
        Ok(GuestRegion { inner, plugs: Some(plugs), remapped: Default::default() })
    }

    /// The hotpluggable region's plug state; None for RAM.
    pub fn plugs(&self) -> Option<&Plugs> {
        self.plugs.as_ref()
    }

    /// Where the region is mapped in this process (for accounting, not for access).
    pub fn host_range(&self) -> std::ops::Range<u64> {
        let start = self.inner.as_ptr() as u64;
        start..start + self.len()
    }

    /// Whether this is RAM (every byte always the guest's).
    pub fn is_ram(&self) -> bool {
        self.plugs.is_none()
    }

    /// A private mapping of a file (a snapshot's memory): MADV_DONTNEED there brings the
    /// file's page back rather than zeros.
    fn private_file(&self) -> bool {
        let private = self.inner.flags() & libc::MAP_PRIVATE != 0 || self.is_remapped();
        self.inner.file_offset().is_some() && private
    }

    /// A file mapped shared (guest RAM kept in a file, [`in_file`], or a memfd a vhost-user
    /// backend maps too): what the guest writes is the file's, until
    /// [`GuestRegion::remap_private`]; MADV_DONTNEED would leave the file's page in place.
    pub fn shared_file(&self) -> bool {
        self.inner.file_offset().is_some() && self.inner.flags() & libc::MAP_SHARED != 0 && !self.is_remapped()
    }

    fn is_remapped(&self) -> bool {
        self.remapped.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How many bytes from `addr` an access of `count` may reach within the region.
    fn room(&self, addr: MemoryRegionAddress, count: usize) -> MemResult<usize> {
        let left = self.len().checked_sub(addr.0).ok_or(GuestMemoryError::InvalidBackendAddress)?;
        Ok(count.min(usize::try_from(left).unwrap_or(usize::MAX)))
    }
}

impl GuestMemoryRegion for GuestRegion {
    type B = Pins;

    fn len(&self) -> GuestUsize {
        self.inner.len()
    }

    fn start_addr(&self) -> GuestAddress {
        self.inner.start_addr()
    }

    fn bitmap(&self) -> BS<'_, Pins> {
        Pin::none()
    }

    /// Refused inside an unplugged block. The pointer pins nothing: for RAM and for the
    /// host's own bookkeeping, never for a guest's buffers (take a slice).
    fn get_host_address(&self, addr: MemoryRegionAddress) -> MemResult<*mut u8> {
        if let Some(plugs) = &self.plugs {
            if !plugs.plugged_at(addr.0) {
                return Err(GuestMemoryError::InvalidGuestAddress(GuestAddress(self.start_addr().0 + addr.0)));
            }
        }
        self.inner.get_host_address(addr)
    }

    fn file_offset(&self) -> Option<&FileOffset> {
        self.inner.file_offset()
    }

    /// `count` bytes at `offset`; refused if any of them lies in an unplugged block. A
    /// slice of hotpluggable memory pins its slots until it is dropped.
    fn get_slice(&self, offset: MemoryRegionAddress, count: usize) -> MemResult<VolatileSlice<'_, BS<'_, Pins>>> {
        let slice = self.inner.get_slice(offset, count)?;
        let pin = match &self.plugs {
            None => Pin::none(),
            Some(plugs) => plugs
                .pin(offset.0, count as u64)
                .ok_or(GuestMemoryError::InvalidGuestAddress(GuestAddress(self.start_addr().0 + offset.0)))?,
        };
        // SAFETY: the pointer and length are those of `slice`, which vm-memory checked to lie
        // inside this region's mapping, alive as long as `self`; the pin keeps an unplug from
        // protecting the range while the new slice lives.
        Ok(unsafe { VolatileSlice::with_bitmap(slice.ptr_guard_mut().as_ptr(), count, pin, None) })
    }

    #[cfg(target_os = "linux")]
    fn is_hugetlbfs(&self) -> Option<bool> {
        self.inner.is_hugetlbfs()
    }
}

/// Every access through the region's own addresses goes through [`GuestRegion::get_slice`]
/// (vm-memory's default would take a slice of the whole region, which an unplugged block
/// refuses).
impl Bytes<MemoryRegionAddress> for GuestRegion {
    type E = GuestMemoryError;

    fn write(&self, buf: &[u8], addr: MemoryRegionAddress) -> MemResult<usize> {
        let n = self.room(addr, buf.len())?;
        if n == 0 {
            return Ok(0);
        }
        Ok(self.get_slice(addr, n)?.write(&buf[..n], 0)?)
    }

    fn read(&self, buf: &mut [u8], addr: MemoryRegionAddress) -> MemResult<usize> {
        let n = self.room(addr, buf.len())?;
        if n == 0 {
            return Ok(0);
        }
        Ok(self.get_slice(addr, n)?.read(&mut buf[..n], 0)?)
    }

    fn write_slice(&self, buf: &[u8], addr: MemoryRegionAddress) -> MemResult<()> {
        Ok(self.get_slice(addr, buf.len())?.write_slice(buf, 0)?)
    }

    fn read_slice(&self, buf: &mut [u8], addr: MemoryRegionAddress) -> MemResult<()> {
        Ok(self.get_slice(addr, buf.len())?.read_slice(buf, 0)?)
    }

    fn read_volatile_from<F: ReadVolatile>(
        &self,
        addr: MemoryRegionAddress,
        src: &mut F,
        count: usize,
    ) -> MemResult<usize> {
        let n = self.room(addr, count)?;
        Ok(self.get_slice(addr, n)?.read_volatile_from(0, src, n)?)
    }

    fn read_exact_volatile_from<F: ReadVolatile>(
        &self,
        addr: MemoryRegionAddress,
        src: &mut F,
        count: usize,
    ) -> MemResult<()> {
        Ok(self.get_slice(addr, count)?.read_exact_volatile_from(0, src, count)?)
    }

    fn write_volatile_to<F: WriteVolatile>(
        &self,
        addr: MemoryRegionAddress,
        dst: &mut F,
        count: usize,
    ) -> MemResult<usize> {
        let n = self.room(addr, count)?;
        Ok(self.get_slice(addr, n)?.write_volatile_to(0, dst, n)?)
    }

    fn write_all_volatile_to<F: WriteVolatile>(
        &self,
        addr: MemoryRegionAddress,
        dst: &mut F,
        count: usize,
    ) -> MemResult<()> {
        Ok(self.get_slice(addr, count)?.write_all_volatile_to(0, dst, count)?)
    }

    fn store<T: AtomicAccess>(
        &self,
        val: T,
        addr: MemoryRegionAddress,
        order: std::sync::atomic::Ordering,
    ) -> MemResult<()> {
        Ok(self.get_slice(addr, size_of::<T>())?.store(val, 0, order)?)
    }

    fn load<T: AtomicAccess>(&self, addr: MemoryRegionAddress, order: std::sync::atomic::Ordering) -> MemResult<T> {
        Ok(self.get_slice(addr, size_of::<T>())?.load(0, order)?)
    }
}

/// Anonymous guest RAM, one region per `(start, size)`, sorted and apart.
pub fn anonymous(ranges: &[(GuestAddress, usize)]) -> Result<GuestMemoryMmap, MemoryError> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    let regions = ranges
        .iter()
        .map(|&(start, size)| map(start, size, libc::PROT_READ | libc::PROT_WRITE, flags, None).map(GuestRegion::ram))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(GuestMemoryMmap::from_regions(regions)?)
}

/// Guest RAM a vhost-user backend can map too: one memfd, each `(start, size)` a shared
/// mapping of it at the sum of the sizes before (the offset the backend is told).
pub fn shared(ranges: &[(GuestAddress, usize)]) -> Result<GuestMemoryMmap, MemoryError> {
    let total: usize = ranges.iter().map(|&(_, size)| size).sum();
    let failed = |e: std::io::Error| MemoryError::Map { start: 0, size: total, reason: format!("memfd: {e}") };
    let file = Arc::new(memfd(c"exitless-guest-ram", total as u64).map_err(failed)?);
    let flags = libc::MAP_SHARED | libc::MAP_NORESERVE;
    let mut offset = 0u64;
    let mut regions = Vec::with_capacity(ranges.len());
    for &(start, size) in ranges {
        let at = FileOffset::from_arc(file.clone(), offset);
        regions.push(map(start, size, libc::PROT_READ | libc::PROT_WRITE, flags, Some(at)).map(GuestRegion::ram)?);
        offset += size as u64;
    }
    Ok(GuestMemoryMmap::from_regions(regions)?)
}

/// A new memfd of `size` bytes (all holes).
fn memfd(name: &std::ffi::CStr, size: u64) -> std::io::Result<std::fs::File> {
    // SAFETY: a NUL-terminated name and valid flags; the descriptor returned is owned below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.set_len(size)?;
    Ok(file)
}

/// Guest memory of the given regions.
pub fn from_regions(regions: Vec<GuestRegion>) -> Result<GuestMemoryMmap, MemoryError> {
    Ok(GuestMemoryMmap::from_regions(regions)?)
}

/// A mapping of `size` bytes for guest address `start`: anonymous, or of `file` at its
/// offset, with the given protection and mmap flags.
pub fn map(
    start: GuestAddress,
    size: usize,
    prot: i32,
    flags: i32,
    file: Option<FileOffset>,
) -> Result<vm_memory::GuestRegionMmap, MemoryError> {
    let failed = |reason: String| MemoryError::Map { start: start.0, size, reason };
    let mut builder = MmapRegionBuilder::new(size).with_mmap_prot(prot).with_mmap_flags(flags);
    if let Some(file) = file {
        builder = builder.with_file_offset(file);
    }
    let region = builder.build().map_err(|e| failed(e.to_string()))?;
    vm_memory::GuestRegionMmap::new(region, start)
        .ok_or_else(|| failed("it passes the end of the address space".into()))
}

/// `memory` with the hotpluggable region added: `size` bytes at `start`, anonymous and
/// unreserved, PROT_NONE until the guest plugs a block of it.
pub fn with_hotplug(
    memory: &GuestMemoryMmap,
    start: GuestAddress,
    size: usize,
    block_size: u64,
    slot_size: u64,
) -> Result<GuestMemoryMmap, MemoryError> {
    with_hotplug_from(memory, start, size, block_size, slot_size, None)
}

/// [`with_hotplug`], the region mapped privately from `file` (a snapshot's memory file,
/// at the offset that holds the region) when given: PROT_NONE all the same, until the
/// restored plug record opens its plugged blocks ([`Plugs::restore`]).
pub fn with_hotplug_from(
    memory: &GuestMemoryMmap,
    start: GuestAddress,
    size: usize,
    block_size: u64,
    slot_size: u64,
    file: Option<FileOffset>,
) -> Result<GuestMemoryMmap, MemoryError> {
    let anonymous = if file.is_some() { 0 } else { libc::MAP_ANONYMOUS };
    let flags = libc::MAP_PRIVATE | anonymous | libc::MAP_NORESERVE;
    let region = GuestRegion::hotplug(map(start, size, libc::PROT_NONE, flags, file)?, block_size, slot_size)?;
    Ok(memory.insert_region(Arc::new(region))?)
}

/// [`with_hotplug`] for a guest whose memory a vhost-user backend maps: the region is a
/// memfd of its own, mapped shared (PROT_NONE until plugged), which the backend's memory
/// table covers whole from the start, as Cloud Hypervisor's does. A plugged block is the
/// memfd's pages in the VMM's mapping too; an unplugged one is a hole in the memfd
/// (punched at unplug) under a private mapping of zeros or PROT_NONE (plugs.rs).
pub fn with_shared_hotplug(
    memory: &GuestMemoryMmap,
    start: GuestAddress,
    size: usize,
    block_size: u64,
    slot_size: u64,
) -> Result<GuestMemoryMmap, MemoryError> {
    let failed = |e: std::io::Error| MemoryError::Map { start: start.0, size, reason: format!("memfd: {e}") };
    let file = Arc::new(memfd(c"exitless-hotplug", size as u64).map_err(failed)?);
    let flags = libc::MAP_SHARED | libc::MAP_NORESERVE;
    let inner = map(start, size, libc::PROT_NONE, flags, Some(FileOffset::from_arc(file, 0)))?;
    let region = GuestRegion::hotplug(inner, block_size, slot_size)?;
    Ok(memory.insert_region(Arc::new(region))?)
}

#[cfg(test)]
mod tests;
