//! Guest RAM and the shared page: one mapping per region, each a KVM memory slot of
//! guest memory's own numbering (which the device manager is then handed); the page where
//! the VMM leaves the payload's parameters and reads its results.

use super::HugePages;
use super::{ioctl, MachineError};
use crate::guest_memory::{self, GuestMemoryMmap, GuestRegion};
use crate::layout::MemoryMap;
use crate::memslots::Memslots;
use crate::snapshot::fork::RamFile;
use crate::snapshot::MemoryBackend;
use crate::virtio::mem::Geometry;
use exitless_payloads::abi;
use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

/// What guest RAM is made from: a snapshot's memory or nothing, in 4 KiB or 2 MiB pages;
/// a booted guest's in 4 KiB pages kept in a file in `ram_dir` if given.
pub(super) struct Backing<'a> {
    pub from: Option<&'a MemoryBackend>,
    pub huge_pages: HugePages,
    /// Shared with a vhost-user backend: a memfd mapped shared.
    pub shared: bool,
    pub ram_dir: Option<&'a std::path::Path>,
}

/// Guest RAM as mapped: the memory, each region's memslot, the userfaultfd to keep (the
/// Uffd backend), the file RAM is kept in (`ram_dir`).
pub(super) struct MappedRam {
    pub memory: GuestMemoryMmap,
    pub slots: Vec<u32>,
    pub uffd: Option<OwnedFd>,
    pub file: Option<RamFile>,
}

/// Guest RAM, anonymous (in hugetlbfs pages if asked), shared with a vhost-user backend (a
/// memfd), in a file of its own mapped shared (`ram_dir`, so that a snapshot can take the
/// file: snapshot/fork.rs), or from a snapshot's memory (its file mapped privately, or
/// copied into hugetlbfs pages; or a page-fault handler's, snapshot/uffd.rs, in the guest's
/// page size; the userfaultfd is returned to keep); and the memslot of each region (in
/// order, from `memslots`), whose writes KVM logs if `log_dirty`.
pub(super) fn map_guest_ram(
    vm: &Arc<VmFd>,
    map: &MemoryMap,
    memslots: &Memslots,
    backing: Backing,
    log_dirty: bool,
) -> Result<MappedRam, MachineError> {
    let regions: Vec<_> = map.ram_regions().iter().map(|&(start, size)| (GuestAddress(start), size as usize)).collect();
    let ram_dir = match (backing.ram_dir, backing.from, backing.huge_pages) {
        // A vhost-user backend maps RAM's memfd and writes into it: a snapshot must not
        // take that memory as its file.
        (Some(_), None, _) if backing.shared => {
            tracing::warn!("--ram-dir: a guest with a vhost-user device keeps RAM shared with its backend; its snapshots write their memory file");
            None
        }
        (Some(dir), None, HugePages::None) => Some(dir),
        // Copying the snapshot's memory into a file of its own would make the load as slow
        // as the create it spares, and end the sharing between clones.
        (Some(_), Some(_), _) => {
            tracing::warn!("--ram-dir: a restored guest's RAM is its snapshot's memory file, mapped privately; its snapshots write their memory file");
            None
        }
        (Some(_), None, HugePages::Hugetlbfs2M) => {
            tracing::warn!("--ram-dir: a guest on huge pages keeps them; its snapshots write their memory file");
            None
        }
        _ => None,
    };
    if let Some(dir) = ram_dir {
        let (memory, file) = guest_memory::in_file(&regions, dir).map_err(|e| MachineError::Memory(e.into()))?;
        let slots: Vec<u32> = memslots.take(memory.num_regions() as u32)?.collect();
        register(vm, &memory, &slots, log_dirty)?;
        return Ok(MappedRam { memory, slots, uffd: None, file: Some(RamFile::new(file)) });
    }
    let (memory, uffd) = match (backing.from, backing.huge_pages) {
        _ if backing.shared => (shared_ram(&backing, &regions)?, None),
        (Some(MemoryBackend::File(file)), HugePages::None) => {
            (crate::snapshot::memory::map_private(file, &regions)?, None)
        }
        // A private mapping of a regular file is in 4 KiB pages whatever is asked: the
        // file's bytes are copied into hugetlbfs memory instead (its holes left untouched).
        (Some(MemoryBackend::File(file)), HugePages::Hugetlbfs2M) => {
            let memory = map_hugetlbfs(&regions)?;
            crate::snapshot::memory::copy_into(file, &memory)?;
            (memory, None)
        }
        (Some(MemoryBackend::Uffd(socket)), huge) => {
            let (memory, page_size) = match huge {
                HugePages::None => (anonymous(&regions)?, 4096),
                HugePages::Hugetlbfs2M => (map_hugetlbfs(&regions)?, HUGE),
            };
            let uffd = crate::snapshot::uffd::hand_over(socket, &memory, page_size)?;
            (memory, Some(uffd))
        }
        (None, HugePages::Hugetlbfs2M) => (map_hugetlbfs(&regions)?, None),
        (None, HugePages::None) => (anonymous(&regions)?, None),
    };
    let slots: Vec<u32> = memslots.take(memory.num_regions() as u32)?.collect();
    register(vm, &memory, &slots, log_dirty)?;
    Ok(MappedRam { memory, slots, uffd, file: None })
}

fn anonymous(regions: &[(GuestAddress, usize)]) -> Result<GuestMemoryMmap, MachineError> {
    crate::guest_memory::anonymous(regions).map_err(|e| MachineError::Memory(e.into()))
}

const HUGE: usize = 2 << 20;

/// RAM a vhost-user backend maps too (a memfd mapped shared), as Firecracker backs a guest
/// with a vhost-user device, in 4 KiB pages; a snapshot's memory file copied into it.
fn shared_ram(backing: &Backing, regions: &[(GuestAddress, usize)]) -> Result<GuestMemoryMmap, MachineError> {
    if backing.huge_pages != HugePages::None {
        return Err(MachineError::HugePages("huge_pages 2M and a vhost-user device together are not supported".into()));
    }
    let memory = crate::guest_memory::shared(regions).map_err(|e| MachineError::Memory(e.into()))?;
    match backing.from {
        None => {}
        // The backend maps the memfd: a private mapping of the snapshot's file would show
        // it the file, not what the guest writes. Copied (holes left), as for huge pages.
        Some(MemoryBackend::File(file)) => crate::snapshot::memory::copy_into(file, &memory)?,
        Some(MemoryBackend::Uffd(_)) => {
            return Err(MachineError::Memory(
                "a snapshot with a vhost-user device is loaded from a memory file (File backend), not Uffd: \
                 the backend maps guest memory itself, where no page-fault handler serves it"
                    .into(),
            ))
        }
    }
    Ok(memory)
}

/// 2 MiB hugetlbfs pages, all reserved by the mapping (no MAP_NORESERVE: a pool too
/// small refuses the start instead of a SIGBUS in the guest's first touch beyond it).
fn map_hugetlbfs(regions: &[(GuestAddress, usize)]) -> Result<GuestMemoryMmap, MachineError> {
    let pages: usize = regions.iter().map(|&(_, size)| size.div_ceil(HUGE)).sum();
    // Free pages another mapping reserved are not this guest's to take.
    let pool = "/sys/kernel/mm/hugepages/hugepages-2048kB";
    let count = |name| {
        let text = std::fs::read_to_string(format!("{pool}/{name}")).unwrap_or_default();
        text.trim().parse::<usize>().unwrap_or(0)
    };
    let free = count("free_hugepages").saturating_sub(count("resv_hugepages"));
    if free < pages {
        return Err(MachineError::HugePages(format!(
            "huge_pages 2M: the guest needs {pages} free 2 MiB huge pages, the host has {free} \
             (reserve them with /proc/sys/vm/nr_hugepages)"
        )));
    }
    let mut mapped = Vec::with_capacity(regions.len());
    for &(start, size) in regions {
        if size % HUGE != 0 || start.0 % HUGE as u64 != 0 {
            return Err(MachineError::HugePages(format!(
                "huge_pages 2M: a RAM region at {:#x}+{size:#x} is not in whole 2 MiB pages",
                start.0
            )));
        }
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
        let region = guest_memory::map(start, size, libc::PROT_READ | libc::PROT_WRITE, flags, None)
            .map_err(|e| MachineError::HugePages(format!("huge_pages 2M: {e}")))?;
        mapped.push(GuestRegion::ram(region));
    }
    guest_memory::from_regions(mapped).map_err(|e| MachineError::Memory(e.into()))
}

/// Hotpluggable memory: the region `geometry` places, mapped anonymous, unreserved and
/// PROT_NONE (nothing is the guest's until it plugs a block), added to guest memory with
/// the record of its plugged blocks, which every device's translation reads; no memory
/// slot yet (virtio-mem adds one per slot holding a plugged block). Restored from a
/// memory file (`from`), the region is the file's after RAM, mapped privately: the
/// plugged blocks virtio-mem's restore opens again hold what the guest left there.
/// Shared with a vhost-user backend (`shared`), the region is a memfd of its own mapped
/// shared, into which a memory file's bytes for it are copied (guest_memory::with_shared_hotplug).
pub(super) fn add_hotplug_region(
    memory: GuestMemoryMmap,
    g: &Geometry,
    from: Option<&MemoryBackend>,
    shared: bool,
) -> Result<GuestMemoryMmap, MachineError> {
    let failed =
        |e: String| MachineError::MemoryHotplug(format!("cannot map {} MiB at {:#x}: {e}", g.size >> 20, g.start));
    if shared {
        let (start, size) = (GuestAddress(g.start), g.size as usize);
        let memory = guest_memory::with_shared_hotplug(&memory, start, size, g.block_size, g.slot_size)
            .map_err(|e| failed(e.to_string()))?;
        match from {
            None => {}
            Some(MemoryBackend::File(file)) => crate::snapshot::memory::copy_hotplug_into(file, &memory)?,
            // Refused before (snapshot::check_restore, and shared_ram for RAM).
            Some(MemoryBackend::Uffd(_)) => {
                return Err(failed("hotpluggable memory is not served by a page-fault handler".into()))
            }
        }
        return Ok(memory);
    }
    let file = match from {
        None => None,
        Some(MemoryBackend::File(file)) => {
            let ram = crate::snapshot::memory::file_len(&memory);
            Some(vm_memory::FileOffset::new(file.try_clone().map_err(|e| failed(e.to_string()))?, ram))
        }
        // Refused before (snapshot::check_restore).
        Some(MemoryBackend::Uffd(_)) => {
            return Err(failed("hotpluggable memory is not served by a page-fault handler".into()))
        }
    };
    let (start, size) = (GuestAddress(g.start), g.size as usize);
    guest_memory::with_hotplug_from(&memory, start, size, g.block_size, g.slot_size, file)
        .map_err(|e| failed(e.to_string()))
}

fn register(vm: &VmFd, memory: &GuestMemoryMmap, slots: &[u32], log_dirty: bool) -> Result<(), MachineError> {
    for (&slot, region) in slots.iter().zip(memory.iter()) {
        let host = memory.get_host_address(region.start_addr()).map_err(|e| MachineError::Memory(e.into()))?;
        // Transparent huge pages where the host offers them: fewer TLB misses for the
        // guest and for every copy to or from guest buffers. Only advice: ignore failure.
        // SAFETY: the range is exactly this region's mapping, owned by `memory`.
        unsafe { libc::madvise(host.cast(), region.len() as usize, libc::MADV_HUGEPAGE) };
        let mapping = kvm_userspace_memory_region {
            slot,
            flags: if log_dirty { kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the mapping belongs to `memory`, which the Machine keeps alive as long as
        // the VM (this thread's clone keeps it mapped while it registers).
        unsafe { vm.set_user_memory_region(mapping) }.map_err(ioctl("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

/// The shared page: magic, the end of RAM below 4 GiB, then the payload's parameters.
pub(super) fn write_shared_page(memory: &GuestMemoryMmap, mem_size: u64, params: &[u64]) -> Result<(), MachineError> {
    let max_params = (abi::SHARED_RESULT_SLOT - abi::SHARED_PARAM_SLOT) as usize;
    let write = |i, v: u64| memory.write_obj(v, shared_slot(i)).map_err(|e| MachineError::Memory(e.into()));
    write(0, abi::SHARED_MAGIC)?;
    write(abi::SHARED_MEM_END_SLOT, mem_size)?;
    for (i, &p) in params.iter().take(max_params).enumerate() {
        write(abi::SHARED_PARAM_SLOT + i as u64, p)?;
    }
    Ok(())
}

/// The guest address of u64 slot `i` of the shared page.
pub fn shared_slot(i: u64) -> GuestAddress {
    GuestAddress(abi::SHARED_PAGE_GPA + 8 * i)
}

/// Reads a result slot the guest wrote into the shared page.
pub fn read_result(memory: &GuestMemoryMmap, index: u64) -> u64 {
    memory.read_obj(shared_slot(abi::SHARED_RESULT_SLOT + index)).unwrap_or(0)
}
