//! The contract between the VMM and the built-in guest payloads.
//!
//! build.rs turns every `pub const` line below into a `#define` in `abi.h`, so the
//! guest C code and the VMM read the same numbers from this one file.

/// isa-debug-exit style port: a write ends the run with the written value as status.
pub const DEBUG_EXIT_PORT: u64 = 0xf4;
/// COM1, the 8250 UART the payloads print on.
pub const SERIAL_PORT: u64 = 0x3f8;

/// Guest-physical page where the VMM leaves parameters and the guest leaves results.
pub const SHARED_PAGE_GPA: u64 = 0x8000;
/// Written by the VMM into slot 0 of the shared page; a guest that does not find it
/// (for instance under QEMU) falls back to its defaults.
pub const SHARED_MAGIC: u64 = 0x7373_656c_7469_7865;
/// Slot (u64 index) of the first parameter the VMM passes.
pub const SHARED_PARAM_SLOT: u64 = 8;
/// Slot of the first result the guest reports.
pub const SHARED_RESULT_SLOT: u64 = 64;
/// Slot where the guest reports the guest-physical end of RAM it may touch (set by the VMM).
pub const SHARED_MEM_END_SLOT: u64 = 1;
/// Slot the lab sets (non-zero) when its control port answers: outside a lab the guest
/// leaves the port alone.
pub const SHARED_LAB_SLOT: u64 = 2;

/// Lab control port: the guest writes `(op << 16) | step` to say which step of a lab it
/// begins or ends; the VMM answers by rewiring devices and filling in the step's spec.
pub const LAB_CONTROL_PORT: u64 = 0x500;
pub const LAB_OP_BEGIN: u64 = 1;
pub const LAB_OP_END: u64 = 2;
/// Within a step: what follows is the part to measure (the VMM restarts its counters).
pub const LAB_OP_MARK: u64 = 3;
/// Shared-page slots of the current step's spec: kind, access size, address, value.
pub const LAB_SPEC_SLOT: u64 = 32;
/// Doorbell kinds of access.
pub const RING_PIO: u64 = 1;
pub const RING_MMIO: u64 = 2;
pub const RING_CPUID: u64 = 3;
pub const RING_POLL: u64 = 4;
/// Polled doorbell: the guest writes a sequence number here and waits for it to come
/// back in the ack slot (each in its own cache line).
pub const POLL_SEQ_SLOT: u64 = 128;
pub const POLL_ACK_SLOT: u64 = 136;
/// PCI: the bus-0 ECAM window, and where BARs may be placed.
pub const ECAM_GPA: u64 = 0xe000_0000;
pub const PCI_MMIO_WINDOW_START: u64 = 0xc000_0000;
pub const PCI_IO_WINDOW_START: u64 = 0x400;
/// The doorbell is PCI function 00:01.0; its BARs start where the VMM assigns them
/// (BAR0 memory at DOORBELL_MMIO_GPA, BAR1 I/O at DOORBELL_PIO_PORT).
pub const DOORBELL_PCI_DEVICE: u64 = 1;
/// Idle port: a write of N sleeps the vCPU in the VMM until a device interrupt is
/// delivered or N microseconds (at most 10,000) pass.
pub const IDLE_PORT: u64 = 0x504;
/// Doorbell device: the port-I/O ring register, and the count register beside it.
pub const DOORBELL_PIO_PORT: u64 = 0x510;
pub const DOORBELL_PIO_COUNT: u64 = 0x518;
/// Doorbell device: the MMIO ring register (count at +8).
pub const DOORBELL_MMIO_GPA: u64 = 0xd000_0000;

/// virtio-net payloads: where their frame buffers live (TX slots, then RX slots).
pub const NET_BUF_GPA: u64 = 0x0100_0000;
/// virtio-blk payloads: where their request slots live (header, status, data each).
/// No payload drives both a NIC and a disk, so this may share the net payloads' range.
pub const BLK_BUF_GPA: u64 = 0x0100_0000;
/// Ethertype of the labs' frames (IEEE local experimental).
pub const LAB_ETHERTYPE: u64 = 0x88b5;

/// Where application processors start: the runtime copies its real-mode trampoline here
/// and sends SIPI vector AP_TRAMPOLINE_GPA >> 12.
pub const AP_TRAMPOLINE_GPA: u64 = 0x4000;
/// The local APIC's MMIO page.
pub const LAPIC_GPA: u64 = 0xfee0_0000;

/// Start of the guest-physical range that is never RAM (MMIO only), up to 4 GiB.
pub const MMIO_HOLE_START: u64 = 0xc000_0000;
