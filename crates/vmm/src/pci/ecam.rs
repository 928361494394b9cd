//! ECAM: config space as an MMIO window, one 4 KiB page per function.
//!
//! Trapped, every access exits and [`EcamDevice`](super::ecam_device::EcamDevice) serves it. Mapped, the window is also
//! backed by [`EcamShadow`]: read-only KVM memory slots over pages that hold each
//! function's current config space, so guest reads never exit; writes still fault into
//! the VMM (a read-only slot turns a write into an MMIO exit), reach the `EcamDevice`, and
//! the root rewrites the function's page before the vCPU resumes.

use super::config::CONFIG_SIZE;
use super::FUNCTIONS;
use crate::kvm::MemslotSink;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;
use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, VolatileMemory};

/// A 4 KiB memory file of all-ones bytes: what a read of an absent function returns.
fn all_ones_page() -> std::io::Result<std::fs::File> {
    // SAFETY: memfd_create with a NUL-terminated name; the fd is owned by the File below.
    let fd = unsafe { libc::memfd_create(c"exitless-ecam-ones".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd from memfd_create that nothing else owns.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    std::io::Write::write_all(&mut file, &[0xff; CONFIG_SIZE])?;
    Ok(file)
}

/// Bytes of the bus-0 ECAM window.
pub const ECAM_SIZE: u64 = (FUNCTIONS * CONFIG_SIZE) as u64;
const _: () = assert!(ECAM_SIZE == crate::layout::ECAM_SIZE);

/// The most memory slots the shadow can need: every other page mapped.
pub const SHADOW_MAX_SLOTS: u32 = (FUNCTIONS / 2) as u32;

#[derive(Debug, thiserror::Error)]
pub enum ShadowError {
    #[error("cannot map the ECAM shadow pages")]
    Map(#[source] std::io::Error),
    #[error("KVM_SET_USER_MEMORY_REGION for ECAM memory slot {slot} failed")]
    Slot {
        slot: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("the ECAM shadow needs more than its {0} memory slots")]
    OutOfSlots(usize),
}

/// The ECAM window's pages, all-ones (no function): each page a private mapping of one
/// shared all-ones page, so the 256 absent functions cost one page, not 1 MiB per VM; the
/// first store to a page copies it (copy-on-write) and the copy is that function's own.
/// Made before the VM exists when it can be: 256 mappings made while KVM watches the
/// process's memory (its MMU notifier) hold up the memslot changes made meanwhile.
pub struct EcamPages(MmapRegion<()>);

impl EcamPages {
    pub fn new() -> Result<Self, ShadowError> {
        let pages = MmapRegion::new(ECAM_SIZE as usize).map_err(|e| ShadowError::Map(std::io::Error::other(e)))?;
        let ones = all_ones_page().map_err(ShadowError::Map)?;
        for index in 0..FUNCTIONS {
            // SAFETY: index < FUNCTIONS, so the page lies inside `pages`.
            let at = unsafe { pages.as_ptr().add(index * CONFIG_SIZE) };
            // SAFETY: MAP_FIXED over one page inside `pages`' own mapping (which nothing
            // references yet), of a 4 KiB file we hold open; private, so stores copy.
            let mapped = unsafe {
                libc::mmap(
                    at.cast(),
                    CONFIG_SIZE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_FIXED,
                    ones.as_raw_fd(),
                    0,
                )
            };
            if mapped != at.cast() {
                return Err(ShadowError::Map(std::io::Error::last_os_error()));
            }
        }
        Ok(EcamPages(pages))
    }
}

/// The pages behind the mapped ECAM window.
pub struct EcamShadow {
    pages: MmapRegion<()>,
    sink: Arc<dyn MemslotSink>,
    gpa: u64,
    /// The KVM memory slots it may use.
    slot_range: std::ops::Range<u32>,
    /// Slots in use, with the first page and page count of each.
    slots: Vec<(u32, usize, usize)>,
}

impl EcamShadow {
    /// Pages for every function, all-ones (no function) until filled in ([`EcamPages`]).
    pub fn new(sink: Arc<dyn MemslotSink>, gpa: u64, slot_range: std::ops::Range<u32>) -> Result<Self, ShadowError> {
        Ok(Self::on(EcamPages::new()?, sink, gpa, slot_range))
    }

    /// The shadow on pages made earlier.
    pub fn on(pages: EcamPages, sink: Arc<dyn MemslotSink>, gpa: u64, slot_range: std::ops::Range<u32>) -> Self {
        EcamShadow { pages: pages.0, sink, gpa, slot_range, slots: Vec::new() }
    }

    /// Rewrites function `index`'s page from its config space (None: all-ones), one aligned
    /// dword store at a time: another vCPU reading the page meanwhile sees each dword either
    /// old or new, never torn, as with a config read racing a write on real hardware.
    pub fn refresh(&self, index: usize, config: Option<&[u8; CONFIG_SIZE]>) {
        let Ok(page) = self.pages.get_slice(index * CONFIG_SIZE, CONFIG_SIZE) else { return };
        for at in (0..CONFIG_SIZE).step_by(4) {
            let dword = config.map_or(u32::MAX, |c| u32::from_le_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]]));
            let _ = page.store(dword, at, std::sync::atomic::Ordering::Release);
        }
    }

    /// Backs every page for which `mapped(page)` holds with read-only memory, one slot per
    /// run of consecutive pages; the others keep exiting.
    pub fn map(&mut self, mapped: impl Fn(usize) -> bool) -> Result<(), ShadowError> {
        self.unmap()?;
        let mut page = 0;
        while page < FUNCTIONS {
            if !mapped(page) {
                page += 1;
                continue;
            }
            let start = page;
            while page < FUNCTIONS && mapped(page) {
                page += 1;
            }
            let slot = self.slot_range.start + self.slots.len() as u32;
            if !self.slot_range.contains(&slot) {
                return Err(ShadowError::OutOfSlots(self.slot_range.len()));
            }
            let offset = (start * CONFIG_SIZE) as u64;
            let size = ((page - start) * CONFIG_SIZE) as u64;
            self.sink
                .set_readonly_slot(slot, self.gpa + offset, size, self.pages.as_ptr() as u64 + offset)
                .map_err(|source| ShadowError::Slot { slot, source })?;
            self.slots.push((slot, start, page - start));
        }
        Ok(())
    }

    /// Deletes every slot: the whole window exits again.
    pub fn unmap(&mut self) -> Result<(), ShadowError> {
        while let Some((slot, start, _)) = self.slots.pop() {
            let offset = (start * CONFIG_SIZE) as u64;
            self.sink
                .set_readonly_slot(slot, self.gpa + offset, 0, self.pages.as_ptr() as u64 + offset)
                .map_err(|source| ShadowError::Slot { slot, source })?;
        }
        Ok(())
    }

    /// The slots in use: (slot, first page, pages).
    pub fn slots(&self) -> &[(u32, usize, usize)] {
        &self.slots
    }

    /// A copy of a page, as the guest would read it.
    pub fn page(&self, index: usize) -> Vec<u8> {
        let mut out = vec![0u8; CONFIG_SIZE];
        if let Ok(page) = self.pages.get_slice(index * CONFIG_SIZE, CONFIG_SIZE) {
            page.copy_to(out.as_mut_slice());
        }
        out
    }
}

impl Drop for EcamShadow {
    fn drop(&mut self) {
        // KVM must stop using the pages before they are unmapped.
        if let Err(e) = self.unmap() {
            tracing::error!("cannot delete the ECAM shadow slots: {e}");
        }
    }
}
