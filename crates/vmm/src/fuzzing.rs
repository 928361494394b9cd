//! Entry points for coverage-guided fuzzing (`fuzz/`, cargo-fuzz) and for the stable
//! test that replays the kept corpora (`tests/fuzz_corpus.rs`): each takes arbitrary
//! bytes, drives one parser or device model that guests or users feed, and must neither
//! panic nor loop.

use crate::boot::{self, BootSpec};
use crate::bus::{BusDevice, BusSet, DeviceId, SharedBuses};
use crate::guest_memory::GuestMemoryMmap;
use crate::ioeventfd::{IoeventfdLimits, IoeventfdRegistry};
use crate::irq::GsiRouter;
use crate::layout::MemoryMap;
use crate::pci::cf8::Cf8Device;
use crate::pci::ecam::EcamShadow;
use crate::pci::ecam_device::EcamDevice;
use crate::pci::msix::Msix;
use crate::pci::{host_bridge, EcamMode, PciRoot};
use crate::testing::FakeKvm;
use crate::virtio::blk::request::{self, Parser};
use crate::virtio::{Activation, ActiveQueue, Interrupt};
use std::sync::Arc;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

/// A fuzz target's entry point.
pub type Target = fn(&[u8]);

/// The targets, by name (the corpus directories are named after them).
pub const TARGETS: &[(&str, Target)] = &[
    ("loader", loader),
    ("blk_request", blk_request),
    ("pci_config", pci_config),
    ("virtio_net", virtio_net),
    ("virtio_pci", virtio_pci),
    ("virtio_mmio", virtio_mmio),
    ("bus_dispatch", bus_dispatch),
    ("vsock_packet", vsock_packet),
    ("virtio_balloon", virtio_balloon),
    ("virtio_pmem", virtio_pmem),
    ("virtio_mem", virtio_mem),
    ("mmds_frames", mmds_frames),
    ("snapshot_loader", snapshot_loader),
];

/// Fuzzed guest memory: 64 KiB at 0 holding the input (zeros past it).
fn guest_memory(data: &[u8]) -> Option<GuestMemoryMmap> {
    let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 0x10000)]).ok()?;
    mem.write_slice(&data[..data.len().min(0x10000)], GuestAddress(0)).ok()?;
    Some(mem)
}

/// A ready queue of 16 entries with EVENT_IDX, its rings at `base` (descriptors),
/// `base + 0x800` (avail) and `base + 0x1000` (used).
fn queue_at(base: u64) -> Option<Queue> {
    let mut queue = Queue::new(16).ok()?;
    queue.set_size(16);
    queue.set_desc_table_address(Some(base as u32), Some(0));
    queue.set_avail_ring_address(Some((base + 0x800) as u32), Some(0));
    queue.set_used_ring_address(Some((base + 0x1000) as u32), Some(0));
    queue.set_event_idx(true);
    queue.set_ready(true);
    Some(queue)
}

/// A file a user passes as `--kernel`: every image kind's loader, on 16 MiB of RAM.
pub fn loader(data: &[u8]) {
    let Ok(map) = MemoryMap::new(16 << 20) else { return };
    let regions: Vec<_> = map.ram_regions().iter().map(|&(s, n)| (GuestAddress(s), n as usize)).collect();
    let Ok(mem) = crate::guest_memory::anonymous(&regions) else { return };
    let spec = BootSpec { cmdline: "console=ttyS0", initrd: Some(b"initrd"), rsdp: 0xe0000 };
    let _ = boot::load(&mem, &map, data, &spec);
}

/// Guest memory holding a virtqueue of 16 entries (descriptors at 0, avail ring at
/// 0x800, used ring at 0x1000) and buffers, all from the input: every chain the device
/// would pop is parsed as a virtio-blk request, then returned.
pub fn blk_request(data: &[u8]) {
    let (Some(mem), Some(mut queue)) = (guest_memory(data), queue_at(0)) else { return };
    let mut parser = Parser::default();
    for _ in 0..64 {
        let Some(chain) = queue.pop_descriptor_chain(&mem) else { break };
        let head = chain.head_index();
        if let Ok(req) = parser.parse(chain, &mem) {
            let _ = request::byte_range(req.sector, req.data_len as u64, 1 << 30);
            let _ = request::Range::read(&mem, &parser.data);
        }
        let _ = queue.add_used(&mem, head, 1);
    }
    let _ = queue.needs_notification(&mem);
}

/// Config space through 0xCF8/0xCFC and ECAM: the input is a list of 8-byte operations
/// (kind, size, offset, value) against a host bridge and a function with memory and
/// I/O BARs, so BAR sizing, moves and decode toggles all happen.
pub fn pci_config(data: &[u8]) {
    let kvm = Arc::new(FakeKvm::default());
    let buses = Arc::new(SharedBuses::new(BusSet::default()));
    let ioeventfds = Arc::new(IoeventfdRegistry::new(kvm.clone(), IoeventfdLimits::default()));
    let Ok(shadow) = EcamShadow::new(kvm, crate::layout::ECAM_GPA, 1..129) else { return };
    let Ok(map) = MemoryMap::new(256 << 20) else { return };
    let Ok(root) = PciRoot::new(buses, ioeventfds, shadow, EcamMode::Mapped, map.pci_windows()) else { return };
    let root = Arc::new(root);
    let _ = root.add(0, 0, host_bridge());
    let _ = root.add(1, 0, crate::testing::two_bar_function(false, 0xd000_0000, 0x510));
    let (cf8, ecam) = (Cf8Device::new(&root), EcamDevice::new(&root));
    for op in data.chunks_exact(8) {
        let size = [1usize, 2, 4, 4][usize::from(op[1] & 3)];
        let offset = u64::from(u16::from_le_bytes([op[2], op[3]]));
        let device = u64::from(op[1] >> 2 & 3);
        let value = [op[4], op[5], op[6], op[7]];
        let mut buf = [0u8; 4];
        match op[0] & 3 {
            0 => cf8.write(offset & 7, &value[..size]),
            1 => cf8.read(offset & 7, &mut buf[..size]),
            // ECAM: bus 0, devices 0-3, any register of function 0.
            2 => ecam.write(device << 15 | (offset & 0xfff), &value[..size]),
            _ => ecam.read(device << 15 | (offset & 0xfff), &mut buf[..size]),
        }
    }
}

/// virtio-net's queue processing, as its device thread does it, over fuzzed guest memory:
/// the RX queue's rings at 0 and the TX queue's at 0x2000 (16 entries each, EVENT_IDX,
/// indirect tables allowed), and a stand-in tap (a datagram socket) holding up to three
/// frames cut from the input (count in byte 0, length in byte 1) for RX. TX frames, zero
/// copy or copied (byte 2), go out on the same socket.
pub fn virtio_net(data: &[u8]) {
    use crate::net::tap::{Tap, VNET_HDR_LEN};
    use crate::virtio::net::{process_once, TxMode};
    use std::os::fd::FromRawFd;
    let (Some(mem), Some(rx), Some(tx)) = (guest_memory(data), queue_at(0), queue_at(0x2000)) else { return };
    let mut fds = [0; 2];
    // SAFETY: socketpair writes two fds into the array it is given; both are owned below.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK, 0, fds.as_mut_ptr()) } < 0 {
        return;
    }
    // SAFETY: fresh fds from socketpair, owned by nothing else.
    let (ours, peer) = unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
    let (count, len) =
        (data.first().map_or(0, |b| b % 4), VNET_HDR_LEN + usize::from(data.get(1).copied().unwrap_or(0)));
    for _ in 0..count {
        let _ = std::io::Write::write(&mut &peer, &data[..len.min(data.len())]);
    }
    let tx_mode = if data.get(2).is_some_and(|b| b & 1 == 1) { TxMode::Copy } else { TxMode::Zerocopy };
    let Some((activation, kicks)) = activation(mem, 2) else { return };
    let queues = [rx, tx].into_iter().zip(kicks).map(|(queue, kick)| ActiveQueue { queue, kick }).collect();
    process_once(Tap::from_file(ours, "fuzz"), tx_mode, queues, activation);
}

/// virtio-vsock's packets from the guest: the input is guest memory holding the rx
/// (0x0), tx (0x2000) and event (0x4000) queues and whatever their descriptors point at;
/// every packet is checked and answered (REQUEST to a host port nobody serves, RW and
/// credit for connections that do not exist, bad headers, chains in any shape).
pub fn vsock_packet(data: &[u8]) {
    use crate::virtio::vsock::{process_once, VsockConfig};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let queues = (queue_at(0), queue_at(0x2000), queue_at(0x4000));
    let (Some(mem), (Some(rx), Some(tx), Some(evt))) = (guest_memory(data), queues) else { return };
    let dir = std::env::temp_dir();
    let uds_path =
        dir.join(format!("exitless-fuzz-vsock-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let Ok(listener) = std::os::unix::net::UnixListener::bind(&uds_path) else { return };
    let _ = std::fs::remove_file(&uds_path);
    let Some((activation, kicks)) = activation(mem, 3) else { return };
    let mut kicks = kicks.into_iter();
    let mut active = |queue| kicks.next().map(|kick| ActiveQueue { queue, kick });
    let (Some(rx), Some(tx), Some(evt)) = (active(rx), active(tx), active(evt)) else { return };
    process_once(&VsockConfig { guest_cid: 3, uds_path, id: None }, listener, [rx, tx, evt], activation);
}

/// virtio-balloon's queues: the input is guest memory holding the inflate (0x0), deflate
/// (0x2000), statistics (0x4000), hinting (0x6000) and reporting (0x8000) queues and
/// whatever their descriptors point at (page numbers, statistics, command ids, ranges);
/// its last four bytes are the hinting run the device asked for.
pub fn virtio_balloon(data: &[u8]) {
    use crate::virtio::balloon::{process_once, BalloonConfig};
    let Some(mem) = guest_memory(data) else { return };
    let queues: Option<Vec<Queue>> = (0..5).map(|i| queue_at(0x2000 * i)).collect();
    let (Some(queues), Some((activation, kicks))) = (queues, activation(mem, 5)) else { return };
    let queues = queues.into_iter().zip(kicks).map(|(queue, kick)| ActiveQueue { queue, kick }).collect();
    let hint = data.len().checked_sub(4).map_or(0, |at| u32::from_le_bytes(data[at..].try_into().unwrap_or([0; 4])));
    let config = BalloonConfig {
        amount_mib: 0,
        deflate_on_oom: true,
        stats_polling_interval_s: 1,
        free_page_hinting: true,
        free_page_reporting: true,
    };
    process_once(config, hint, queues, activation);
}

/// virtio-pmem's requests: the input is guest memory holding its queue (0x0) and whatever
/// the descriptors point at; every flush of a small file is answered, every other shape
/// refused.
pub fn virtio_pmem(data: &[u8]) {
    use crate::virtio::pmem::{process_once, PmemMapping};
    // One small file, mapped once and unlinked at once: nothing is left behind.
    static MAPPING: std::sync::OnceLock<Option<Arc<PmemMapping>>> = std::sync::OnceLock::new();
    let mapping = MAPPING.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("exitless-fuzz-pmem-{}", std::process::id()));
        std::fs::write(&path, [0u8; 4096]).ok()?;
        let mapping = PmemMapping::open(&path, false).ok();
        let _ = std::fs::remove_file(&path);
        mapping.map(Arc::new)
    });
    let (Some(mapping), Some(mem), Some(queue)) = (mapping, guest_memory(data), queue_at(0)) else { return };
    let Some((activation, kicks)) = activation(mem, 1) else { return };
    let Some(kick) = kicks.into_iter().next() else { return };
    process_once(mapping.clone(), ActiveQueue { queue, kick }, activation);
}

/// virtio-mem's requests: the input is guest memory holding its queue (0x0) and whatever
/// the descriptors point at, below the hotpluggable region (0x8000, 8 blocks of 4 KiB,
/// nothing plugged); its last eight bytes are the size the host asked for. Every request
/// is answered; nothing outside the region is plugged, unplugged or discarded, and no
/// descriptor reaches a block that is not plugged.
pub fn virtio_mem(data: &[u8]) {
    let ram = || {
        let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 0x8000)]).ok()?;
        mem.write_slice(&data[..data.len().min(0x8000)], GuestAddress(0)).ok()?;
        crate::guest_memory::with_hotplug(&mem, GuestAddress(0x8000), 0x8000, 0x1000, 0x4000).ok()
    };
    let (Some(mem), Some(queue)) = (ram(), queue_at(0)) else { return };
    let Some((activation, kicks)) = activation(mem, 1) else { return };
    let Some(kick) = kicks.into_iter().next() else { return };
    let requested =
        data.len().checked_sub(8).map_or(0, |at| u64::from_le_bytes(data[at..].try_into().unwrap_or([0; 8])));
    crate::virtio::mem::process_once(ActiveQueue { queue, kick }, activation, requested);
}

/// Frames a guest sends to MMDS: the input's first byte picks V1 or V2, then frames
/// follow as [length u16 LE][bytes]; each that `wants` takes goes through ARP, smoltcp's
/// IP and TCP and the HTTP answers, and every answer frame is drained.
pub fn mmds_frames(data: &[u8]) {
    mmds_replay(data);
}

/// [`mmds_frames`], returning what MMDS counted.
pub fn mmds_replay(data: &[u8]) -> crate::net::mmds::MmdsCounters {
    use crate::net::mmds::{wants, Mmds, MmdsStack, Version, DEFAULT_ADDRESS};
    let Some((&mode, mut rest)) = data.split_first() else { return Default::default() };
    let mut store = Mmds::new(4096);
    store.version = if mode & 1 == 1 { Version::V2 } else { Version::V1 };
    let _ = store.put(serde_json::json!({"latest": {"meta-data": {"k0": "v0", "k1": {"k2": "v2"}}}}));
    let mut stack = MmdsStack::with_seed(Arc::new(std::sync::Mutex::new(store)), DEFAULT_ADDRESS, 0);
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let frame = &rest[2..2 + len];
        if wants(DEFAULT_ADDRESS, frame) {
            stack.receive(frame);
        }
        while stack.pop_frame().is_some() {}
        rest = &rest[2 + len..];
    }
    stack.poll_timers();
    stack.counters
}

/// A snapshot's state file as `PUT /snapshot/load` reads it: every check before anything
/// is built (header, format, counts, sizes, the interrupt controllers).
pub fn snapshot_loader(data: &[u8]) {
    let _ = crate::snapshot::SnapshotFile::parse("fuzz", data);
}

/// What a device is activated with (no interrupt reaches anything), and `n` kick eventfds.
fn activation(mem: GuestMemoryMmap, n: usize) -> Option<(Activation, Vec<Arc<EventFd>>)> {
    let router = Arc::new(GsiRouter::new(Arc::new(FakeKvm::default())));
    let msix = Msix::new(router, n + 1).ok()?;
    let interrupt = Interrupt {
        isr: Default::default(),
        signalled: Default::default(),
        delivery: crate::virtio::Delivery::Msix {
            msix: Arc::new(std::sync::Mutex::new(msix)),
            queue_vectors: (0..n as u16).collect(),
            config_vector: n as u16,
        },
    };
    let kicks = (0..n).map(|_| EventFd::new(libc::EFD_NONBLOCK).map(Arc::new)).collect::<Result<_, _>>().ok()?;
    let activation = Activation {
        mem,
        features: crate::virtio::VIRTIO_F_EVENT_IDX,
        interrupt: Arc::new(interrupt),
        status: Arc::default(),
        restored: false,
    };
    Some((activation, kicks))
}

/// The virtio-pci transport: the input's first 4 KiB are guest memory (where the rings
/// the driver points at lie, so activation checks them), the rest a list of 12-byte BAR0
/// accesses (kind, size, offset, value): common config, ISR, device config, notify,
/// MSI-X table and PBA, so feature negotiation, queue setup, activation, resets and
/// vector changes all happen in any order.
pub fn virtio_pci(data: &[u8]) {
    use crate::virtio::pci::BAR_SIZE;
    let Some(mem) = guest_memory(&data[..data.len().min(0x1000)]) else { return };
    let (transport, _) = crate::testing::virtio_transport(mem);
    for op in data.get(0x1000..).unwrap_or_default().chunks_exact(12) {
        let size = [1usize, 2, 4, 8][usize::from(op[1] & 3)];
        let offset = u64::from(u16::from_le_bytes([op[2], op[3]])) % BAR_SIZE;
        let offset = offset.min(BAR_SIZE - size as u64);
        if op[0] & 1 == 0 {
            transport.write(offset, &op[4..4 + size]);
        } else {
            let mut buf = [0u8; 8];
            transport.read(offset, &mut buf[..size]);
        }
    }
}

/// The virtio-mmio transport: as [`virtio_pci`], the input's first 4 KiB are guest
/// memory, the rest 12-byte accesses (kind, size, offset, value) anywhere in the 4 KiB
/// window, of every width: registers, QueueNotify, InterruptACK, the configuration.
pub fn virtio_mmio(data: &[u8]) {
    use crate::virtio::mmio::WINDOW;
    let Some(mem) = guest_memory(&data[..data.len().min(0x1000)]) else { return };
    let mode = match data.first() {
        Some(b) if b & 1 == 1 => crate::virtio::mmio::RegisterMode::Mapped,
        _ => crate::virtio::mmio::RegisterMode::Trapped,
    };
    let (transport, _, _) = crate::testing::virtio_mmio_transport(mem, mode);
    for op in data.get(0x1000..).unwrap_or_default().chunks_exact(12) {
        let size = [1usize, 2, 4, 8][usize::from(op[1] & 3)];
        let offset = (u64::from(u16::from_le_bytes([op[2], op[3]])) % WINDOW).min(WINDOW - size as u64);
        if op[0] & 1 == 0 {
            transport.write(offset, &op[4..4 + size]);
        } else {
            let mut buf = [0u8; 8];
            transport.read(offset, &mut buf[..size]);
        }
    }
}

/// The buses' dispatch, checked against a plain list: the input is a list of 8-byte
/// operations (insert, remove, lookup-and-access) on a PIO and an MMIO bus published
/// through [`SharedBuses`]; every lookup must find exactly the range a linear scan finds
/// (the whole access inside it) and hand the device the right offset. Panics on a mismatch.
pub fn bus_dispatch(data: &[u8]) {
    use crate::bus::{BusAddress, MmioAddress, PioAddress};
    use std::sync::atomic::{AtomicU64, Ordering};
    /// Remembers the offset of the last access it saw.
    struct Probe(AtomicU64);
    impl BusDevice for Probe {
        fn read(&self, offset: u64, data: &mut [u8]) {
            self.0.store(offset, Ordering::Relaxed);
            data.fill(0);
        }
        fn write(&self, offset: u64, _: &[u8]) {
            self.0.store(offset, Ordering::Relaxed);
        }
    }
    let buses = SharedBuses::new(BusSet::default());
    // The model: (space, base, len, id) for every range the buses accepted.
    let mut model: Vec<(u8, u64, u64, usize)> = Vec::new();
    let probe = Arc::new(Probe(AtomicU64::new(u64::MAX)));
    let max = [PioAddress::MAX, MmioAddress::MAX];
    for (n, op) in data.chunks_exact(8).enumerate() {
        let space = op[0] >> 7;
        // Small addresses so ranges meet; the top ones so ends near the limit happen too.
        let raw = u64::from(u32::from_le_bytes([op[1], op[2], op[3], 0]));
        let addr = if op[0] & 0x40 != 0 { max[usize::from(space)] - raw % 64 } else { raw };
        let len = u64::from(op[4]) | u64::from(op[5]) << 8;
        let device: Arc<dyn BusDevice> = probe.clone();
        match op[0] & 3 {
            0 => {
                let fits = addr <= max[usize::from(space)];
                let inserted = fits
                    && buses
                        .update(|b| match space {
                            0 => b.pio.insert(PioAddress(addr as u16), len, DeviceId(n), device),
                            _ => b.mmio.insert(MmioAddress(addr), len, DeviceId(n), device),
                        })
                        .is_ok();
                // A range's end must be representable, so MMIO's very last byte is never mapped.
                let ok = fits
                    && len > 0
                    && addr.checked_add(len).is_some_and(|end| end - 1 <= max[usize::from(space)])
                    && !model.iter().any(|&(s, b, l, _)| s == space && addr < b + l && b < addr + len);
                assert_eq!(inserted, ok, "insert {space} {addr:#x}+{len:#x} against {model:x?}");
                if ok {
                    model.push((space, addr, len, n));
                }
            }
            1 => {
                let removed = buses
                    .update(|b| match space {
                        0 if addr <= PioAddress::MAX => b.pio.remove(PioAddress(addr as u16)).map(drop),
                        0 => Err(crate::bus::BusError::NotFound(addr)),
                        _ => b.mmio.remove(MmioAddress(addr)).map(drop),
                    })
                    .is_ok();
                let at = model.iter().position(|&(s, b, _, _)| s == space && b == addr);
                assert_eq!(removed, at.is_some(), "remove {space} {addr:#x}");
                if let Some(at) = at {
                    model.remove(at);
                }
            }
            _ => {
                let size = 1usize << (op[6] & 3);
                let (set, _) = buses.snapshot();
                let found = match space {
                    0 if addr <= PioAddress::MAX => set.pio.lookup(PioAddress(addr as u16), size),
                    0 => None,
                    _ => set.mmio.lookup(MmioAddress(addr), size),
                };
                let expected = model.iter().find(|&&(s, b, l, _)| {
                    s == space && addr >= b && (addr - b).checked_add(size as u64).is_some_and(|end| end <= l)
                });
                assert_eq!(
                    found.map(|(e, off)| (e.id.0, off)),
                    expected.map(|&(_, b, _, id)| (id, addr - b)),
                    "lookup {space} {addr:#x}/{size}"
                );
                if let Some((entry, offset)) = found {
                    let mut buf = [0u8; 8];
                    if op[0] & 2 == 0 {
                        entry.device.read(offset, &mut buf[..size]);
                    } else {
                        entry.device.write(offset, &buf[..size]);
                    }
                    assert_eq!(probe.0.load(Ordering::Relaxed), offset);
                }
            }
        }
    }
}
