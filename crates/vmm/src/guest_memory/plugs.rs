//! Which blocks of the hotpluggable region the guest has plugged, as translation reads
//! them (virtio-mem's `Blocks` is the driver's side of the same record), their host
//! protection (plugged: read and write; unplugged in a slot with a plugged block, which
//! the guest's vCPUs map: read-only zeros; in a slot without: PROT_NONE), and the pins
//! that let an unplug wait for the accesses already under way.
//!
//! Device threads copy to guest memory while virtio-mem's thread unplugs it, so a check
//! at translation alone would race: a device could pass the check, the block be
//! unplugged and protected, and the device's copy fault (SIGSEGV: the VMM gone). Hence a
//! slice of hotpluggable memory carries a pin (vm-memory's per-slice bitmap, which every
//! copy keeps alive until it is done) counting the accesses under way in each slot it
//! touches. A translation pins first and checks the blocks second; an unplug clears the
//! blocks first and waits for its slots' pins second; with sequentially consistent
//! orderings one of the two always sees the other. An access that does not end in time
//! (a thread descheduled for long) leaves its blocks readable and writable, refused by
//! translation, not protected: counted, never a fault.
//!
//! Where a vhost-user backend maps guest memory the region is a memfd mapped shared
//! (`over_file`): a plugged block maps the memfd's pages, which the backend sees; an
//! unplugged block is punched out of the memfd (FALLOC_FL_PUNCH_HOLE: its pages freed for
//! both mappings, where MADV_DONTNEED would leave them in the file) and, in the VMM's
//! mapping, a private mapping of zeros or PROT_NONE as without a backend.

use super::discard::{drop_pages, Fresh, Prot};
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vm_memory::bitmap::{Bitmap, BitmapSlice, WithBitmapSlice};

/// How long an unplug waits for accesses already under way before it gives up protecting.
const QUIET_WAIT: Duration = Duration::from_millis(200);
const PAGE: u64 = 4096;

/// Why the region's blocks could not be set up or changed.
#[derive(Debug, thiserror::Error)]
pub enum PlugError {
    #[error(
        "hotpluggable memory of {size:#x} bytes cannot be cut into blocks of {block_size:#x} and slots of {slot_size:#x}"
    )]
    Shape { size: u64, block_size: u64, slot_size: u64 },
    #[error("{0:#x?} is not whole blocks of the hotpluggable region")]
    Range(Range<u64>),
    #[error("cannot open blocks {range:#x?} to the guest: mprotect: {source}")]
    Protect {
        range: Range<u64>,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot discard blocks {range:#x?}: {source}")]
    Discard {
        range: Range<u64>,
        #[source]
        source: std::io::Error,
    },
}

/// A counter on its own cache line: device threads pin slots all the time.
#[derive(Debug, Default)]
#[repr(align(64))]
struct PinCount(AtomicUsize);

/// The hotpluggable region's blocks: plugged or not, and the accesses under way per slot.
#[derive(Debug)]
pub struct Plugs {
    /// Guest physical address of the region's first byte.
    start: u64,
    /// The region's host mapping (owned by its `GuestRegion`, which owns this record).
    host: usize,
    size: u64,
    block_size: u64,
    slot_size: u64,
    /// One bit per block, set while plugged.
    plugged: Vec<AtomicU64>,
    pins: Vec<PinCount>,
    /// Blocks unplugged but left accessible: an access under way did not end in time.
    pub unprotected: AtomicU64,
    /// The memfd the region maps shared (a vhost-user backend maps it too), and the
    /// region's offset in it.
    file: Option<(Arc<File>, u64)>,
}

impl Plugs {
    /// Nothing plugged. The mapping at `host` must be PROT_NONE already.
    pub(super) fn new(
        start: u64,
        host: *mut u8,
        size: u64,
        block_size: u64,
        slot_size: u64,
    ) -> Result<Plugs, PlugError> {
        let fits = block_size.is_power_of_two()
            && block_size.is_multiple_of(PAGE)
            && slot_size.checked_rem(block_size) == Some(0)
            && size.checked_rem(slot_size) == Some(0)
            && size > 0;
        if !fits {
            return Err(PlugError::Shape { size, block_size, slot_size });
        }
        let blocks = (size / block_size) as usize;
        Ok(Plugs {
            start,
            host: host as usize,
            size,
            block_size,
            slot_size,
            plugged: (0..blocks.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            pins: (0..size / slot_size).map(|_| PinCount::default()).collect(),
            unprotected: AtomicU64::new(0),
            file: None,
        })
    }

    /// The record of a region mapped shared from `file` (its memfd, at the offset given):
    /// plugging maps the file's pages, unplugging punches them out.
    pub(super) fn over_file(self, file: (Arc<File>, u64)) -> Plugs {
        Plugs { file: Some(file), ..self }
    }

    /// The region's guest addresses.
    pub fn range(&self) -> Range<u64> {
        self.start..self.start + self.size
    }

    /// The host address of guest address `gpa` in the region, plugged or not (for the
    /// memory slot virtio-mem maps).
    pub fn host_of(&self, gpa: u64) -> Option<u64> {
        self.range().contains(&gpa).then(|| self.host as u64 + (gpa - self.start))
    }

    /// Whether the block holding byte `offset` of the region is plugged.
    pub fn plugged_at(&self, offset: u64) -> bool {
        offset < self.size && self.is_plugged((offset / self.block_size) as usize)
    }

    /// The plugged blocks, as runs of byte offsets into the region.
    pub fn plugged_runs(&self) -> Vec<Range<u64>> {
        let mut runs: Vec<Range<u64>> = Vec::new();
        for block in (0..(self.size / self.block_size) as usize).filter(|&b| self.is_plugged(b)) {
            let at = block as u64 * self.block_size;
            match runs.last_mut() {
                Some(run) if run.end == at => run.end += self.block_size,
                _ => runs.push(at..at + self.block_size),
            }
        }
        runs
    }

    fn is_plugged(&self, block: usize) -> bool {
        self.plugged[block / 64].load(SeqCst) & (1 << (block % 64)) != 0
    }

    /// A pin on the slots under `offset..offset + count` (inside the region), if every
    /// block there is plugged. An empty access is checked at `offset`.
    pub(super) fn pin(&self, offset: u64, count: u64) -> Option<Pin<'_>> {
        let last = offset.checked_add(count.max(1) - 1).filter(|&l| l < self.size)?;
        let slots = (offset / self.slot_size) as usize..=(last / self.slot_size) as usize;
        let pin = Pin::new(self, *slots.start(), *slots.end());
        let blocks = (offset / self.block_size) as usize..=(last / self.block_size) as usize;
        // Pinned before the check: an unplug that cleared a block this passed waits for us.
        blocks.into_iter().all(|b| self.is_plugged(b)).then_some(pin)
    }

    /// The block indices of guest range `range`, if it is whole blocks of the region.
    fn blocks(&self, range: &Range<u64>) -> Result<Range<usize>, PlugError> {
        let refused = || PlugError::Range(range.clone());
        let from = range.start.checked_sub(self.start).ok_or_else(refused)?;
        let to = range.end.checked_sub(self.start).ok_or_else(refused)?;
        if from >= to || to > self.size || !from.is_multiple_of(self.block_size) || !to.is_multiple_of(self.block_size)
        {
            return Err(refused());
        }
        Ok((from / self.block_size) as usize..(to / self.block_size) as usize)
    }

    fn set(&self, blocks: Range<usize>, plugged: bool) {
        for b in blocks {
            let bit = 1u64 << (b % 64);
            match plugged {
                true => self.plugged[b / 64].fetch_or(bit, SeqCst),
                false => self.plugged[b / 64].fetch_and(!bit, SeqCst),
            };
        }
    }

    /// The host bytes of blocks `blocks`.
    fn host_range(&self, blocks: &Range<usize>) -> (*mut u8, usize) {
        let offset = blocks.start as u64 * self.block_size;
        ((self.host as u64 + offset) as *mut u8, (blocks.len() as u64 * self.block_size) as usize)
    }

    fn blocks_per_slot(&self) -> usize {
        (self.slot_size / self.block_size) as usize
    }

    /// The slots `blocks` lie in, each with its blocks.
    fn slots(&self, blocks: &Range<usize>) -> impl Iterator<Item = Range<usize>> {
        let per = self.blocks_per_slot();
        (blocks.start / per..=(blocks.end - 1) / per).map(move |slot| slot * per..(slot + 1) * per)
    }

    /// Whether any block of `slot` (its blocks) is plugged: the guest's vCPUs map it.
    fn any_plugged(&self, slot: &Range<usize>) -> bool {
        slot.clone().any(|b| self.is_plugged(b))
    }

    fn protect(&self, blocks: &Range<usize>, prot: Prot) -> Result<(), PlugError> {
        let (host, len) = self.host_range(blocks);
        // SAFETY: whole blocks of the region's own mapping (checked by `blocks`), which the
        // region keeps mapped; only its protection changes.
        match unsafe { libc::mprotect(host.cast(), len, prot as i32) } {
            0 => Ok(()),
            _ => Err(PlugError::Protect { range: self.guest_range(blocks), source: std::io::Error::last_os_error() }),
        }
    }

    fn guest_range(&self, blocks: &Range<usize>) -> Range<u64> {
        let at = |b: usize| self.start + b as u64 * self.block_size;
        at(blocks.start)..at(blocks.end)
    }

    /// Guest range `range` (whole blocks) plugged: readable and writable, then open to
    /// translation. A slot's first plugged block makes the rest of the slot readable
    /// zeros (the guest's vCPUs map the whole slot: a stray read there costs nothing, a
    /// write stops the guest, KVM finding no writable page).
    pub fn plug(&self, range: Range<u64>) -> Result<(), PlugError> {
        let blocks = self.blocks(&range)?;
        for slot in self.slots(&blocks) {
            if !self.any_plugged(&slot) {
                // Over a memfd, reading its holes would allocate pages: zeros of our own.
                match self.file {
                    Some(_) => self.fresh(&slot, Prot::Read)?,
                    None => self.protect(&slot, Prot::Read)?,
                }
            }
        }
        self.open(&blocks)?;
        self.set(blocks, true);
        Ok(())
    }

    /// Blocks made the guest's: readable and writable; over a memfd, its pages mapped
    /// shared, emptied first (a backend may have written there while they were unplugged:
    /// a plugged block starts as zeros).
    fn open(&self, blocks: &Range<usize>) -> Result<(), PlugError> {
        // Without a memfd: no punch, and the blocks made writable in place.
        self.punch(blocks)?;
        self.map_file(blocks)
    }

    /// Over a memfd: `blocks`' pages punched out of it (freed; zeros for every mapping).
    fn punch(&self, blocks: &Range<usize>) -> Result<(), PlugError> {
        let Some((file, base)) = &self.file else { return Ok(()) };
        let (_, len) = self.host_range(blocks);
        let offset = base + blocks.start as u64 * self.block_size;
        let failed = |source| PlugError::Discard { range: self.guest_range(blocks), source };
        let offset = libc::off_t::try_from(offset).map_err(|e| failed(std::io::Error::other(e)))?;
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        // SAFETY: fallocate on the region's own memfd, within its length; no memory of this
        // process is touched.
        match unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len as libc::off_t) } {
            0 => Ok(()),
            _ => Err(failed(std::io::Error::last_os_error())),
        }
    }

    /// Over a memfd: `blocks` mapped shared from it, readable and writable; without one,
    /// made so in place.
    fn map_file(&self, blocks: &Range<usize>) -> Result<(), PlugError> {
        let Some((file, base)) = &self.file else { return self.protect(blocks, Prot::ReadWrite) };
        let (host, len) = self.host_range(blocks);
        let offset = base + blocks.start as u64 * self.block_size;
        let failed = |source| PlugError::Protect { range: self.guest_range(blocks), source };
        let offset = libc::off_t::try_from(offset).map_err(|e| failed(std::io::Error::other(e)))?;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE;
        // SAFETY: MAP_FIXED over whole blocks of the region's own mapping (which the region
        // unmaps whole when dropped), the guest's from now on; nothing of the VMM's is there.
        let at = unsafe { libc::mmap(host.cast(), len, prot, flags, file.as_raw_fd(), offset) };
        match at == libc::MAP_FAILED {
            true => Err(failed(std::io::Error::last_os_error())),
            false => Ok(()),
        }
    }

    /// A snapshot's plug record put back on a restored region nothing has plugged yet
    /// (mapped from the memory file, or anonymous): `plugged(block)` for each block.
    /// Plugged blocks become readable and writable (the file's bytes: the guest's memory
    /// as saved); every other block gets a fresh mapping, readable zeros in a slot with a
    /// plugged block and PROT_NONE elsewhere, so nothing the file holds outside the
    /// plugged blocks (a rebased Diff's older bytes) is ever seen. Over a memfd (which
    /// holds the saved bytes) plugged blocks map its pages and the rest are punched out of
    /// it, so that the backend sees nothing older either.
    pub fn restore(&self, plugged: impl Fn(usize) -> bool) -> Result<(), PlugError> {
        let per = self.blocks_per_slot();
        for slot in 0..(self.size / self.slot_size) as usize {
            let blocks = slot * per..(slot + 1) * per;
            if !blocks.clone().any(&plugged) {
                self.punch(&blocks)?;
                self.fresh(&blocks, Prot::None)?;
                continue;
            }
            let mut at = blocks.start;
            while at < blocks.end {
                let on = plugged(at);
                let end = (at..blocks.end).find(|&b| plugged(b) != on).unwrap_or(blocks.end);
                match on {
                    true => self.map_file(&(at..end))?,
                    false => {
                        self.punch(&(at..end))?;
                        self.fresh(&(at..end), Prot::Read)?
                    }
                }
                at = end;
            }
        }
        for b in (0..(self.size / self.block_size) as usize).filter(|&b| plugged(b)) {
            self.set(b..b + 1, true);
        }
        Ok(())
    }

    /// Guest range `range` (whole blocks) unplugged: refused by translation at once, then,
    /// once no access begun before is under way in its slots, its memory dropped: fresh
    /// readable zeros where its slot still holds a plugged block, and where none is left,
    /// the whole slot PROT_NONE (a fresh mapping over it drops and protects at once). An
    /// access that outlasts the wait leaves the range dropped but readable and writable
    /// (counted in `unprotected`).
    pub fn unplug(&self, range: Range<u64>) -> Result<(), PlugError> {
        let blocks = self.blocks(&range)?;
        self.set(blocks.clone(), false);
        let per = self.blocks_per_slot();
        if !self.wait_quiet(blocks.start / per..=(blocks.end - 1) / per) {
            self.unprotected.fetch_add(blocks.len() as u64, SeqCst);
            tracing::warn!("virtio-mem: an access to {range:#x?} outlasted its unplug: left unprotected");
            self.fresh(&blocks, Prot::ReadWrite)?;
            return self.punch(&blocks);
        }
        for slot in self.slots(&blocks) {
            match self.any_plugged(&slot) {
                true => self.fresh(&(blocks.start.max(slot.start)..blocks.end.min(slot.end)), Prot::Read)?,
                false => self.fresh(&slot, Prot::None)?,
            }
        }
        // The memfd's pages freed, for the backend's mapping too (the VMM's no longer maps
        // them: a copy still under way cannot fill them again). A no-op without a memfd.
        self.punch(&blocks)
    }

    /// A fresh mapping of `prot` over `blocks`: their contents gone.
    fn fresh(&self, blocks: &Range<usize>, prot: Prot) -> Result<(), PlugError> {
        let (host, len) = self.host_range(blocks);
        // SAFETY: whole blocks of the region's own mapping that the guest has unplugged:
        // nothing of the VMM's lives there, and translation refuses them from now on.
        unsafe { drop_pages(host, len, Fresh::Replace(prot)) }
            .map_err(|source| PlugError::Discard { range: self.guest_range(blocks), source })
    }

    /// Waits until no access is under way in `slots`; false if one outlasts [`QUIET_WAIT`].
    fn wait_quiet(&self, slots: std::ops::RangeInclusive<usize>) -> bool {
        let deadline = Instant::now() + QUIET_WAIT;
        for round in 0u32.. {
            if slots.clone().all(|s| self.pins[s].0.load(SeqCst) == 0) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            match round {
                0..64 => std::hint::spin_loop(),
                _ => std::thread::sleep(Duration::from_micros(50)),
            }
        }
        false
    }
}

/// A slice's hold on the slots it lies in (vm-memory's per-slice bitmap type, which
/// follows the slice through every copy and sub-slice): counted while it lives. RAM's
/// slices hold none.
pub struct Pin<'a>(Option<(&'a Plugs, usize, usize)>);

impl<'a> Pin<'a> {
    /// A pin on no slot (RAM).
    pub fn none() -> Pin<'a> {
        Pin(None)
    }

    fn new(plugs: &'a Plugs, first: usize, last: usize) -> Pin<'a> {
        let pin = Pin(Some((plugs, first, last)));
        pin.count(true);
        pin
    }

    fn count(&self, up: bool) {
        if let Some((plugs, first, last)) = self.0 {
            for p in &plugs.pins[first..=last] {
                match up {
                    true => p.0.fetch_add(1, SeqCst),
                    false => p.0.fetch_sub(1, SeqCst),
                };
            }
        }
    }
}

impl Clone for Pin<'_> {
    fn clone(&self) -> Self {
        let pin = Pin(self.0);
        pin.count(true);
        pin
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        self.count(false);
    }
}

impl fmt::Debug for Pin<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some((_, first, last)) => write!(f, "Pin(slots {first}..={last})"),
            None => f.write_str("Pin(none)"),
        }
    }
}

impl<'b> WithBitmapSlice<'b> for Pin<'_> {
    type S = Self;
}

impl BitmapSlice for Pin<'_> {}

/// No dirty tracking here (KVM's dirty log serves snapshots): a pin only counts.
impl Bitmap for Pin<'_> {
    fn mark_dirty(&self, _offset: usize, _len: usize) {}

    fn dirty_at(&self, _offset: usize) -> bool {
        false
    }

    fn slice_at(&self, _offset: usize) -> Self {
        self.clone()
    }
}

/// A region's bitmap type: its slices are [`Pin`]s.
#[derive(Debug, Default)]
pub struct Pins;

impl<'a> WithBitmapSlice<'a> for Pins {
    type S = Pin<'a>;
}

impl Bitmap for Pins {
    fn mark_dirty(&self, _offset: usize, _len: usize) {}

    fn dirty_at(&self, _offset: usize) -> bool {
        false
    }

    fn slice_at(&self, _offset: usize) -> Pin<'_> {
        Pin::none()
    }
}
