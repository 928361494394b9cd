//! virtio-net's feature bits, and which of them a tap can carry: what the device offers
//! follows from what the tap accepted (TUNSETOFFLOAD), and what the guest negotiated
//! decides the tap's receive offloads.

use crate::net::tap::{TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN, TUN_F_UFO};

/// The device finishes partial checksums of sent frames.
pub const VIRTIO_NET_F_CSUM: u64 = 1 << 0;
/// The guest takes received frames with partial checksums.
pub const VIRTIO_NET_F_GUEST_CSUM: u64 = 1 << 1;
/// The device advises the guest of an MTU (config field `mtu`).
pub const VIRTIO_NET_F_MTU: u64 = 1 << 3;
pub const VIRTIO_NET_F_MAC: u64 = 1 << 5;
pub const VIRTIO_NET_F_GUEST_TSO4: u64 = 1 << 7;
pub const VIRTIO_NET_F_GUEST_TSO6: u64 = 1 << 8;
pub const VIRTIO_NET_F_GUEST_ECN: u64 = 1 << 9;
pub const VIRTIO_NET_F_GUEST_UFO: u64 = 1 << 10;
pub const VIRTIO_NET_F_HOST_TSO4: u64 = 1 << 11;
pub const VIRTIO_NET_F_HOST_TSO6: u64 = 1 << 12;
pub const VIRTIO_NET_F_HOST_ECN: u64 = 1 << 13;
pub const VIRTIO_NET_F_HOST_UFO: u64 = 1 << 14;
/// A received frame may span several receive buffers (num_buffers in its header).
pub const VIRTIO_NET_F_MRG_RXBUF: u64 = 1 << 15;
pub const VIRTIO_NET_F_STATUS: u64 = 1 << 16;

/// The offloads offered on a tap that accepted the receive offloads `tun` (TUN_F_*).
/// Sent offloads need nothing of the tap (it segments and checksums what it is given);
/// received ones are offered only as far as the tap may hand them to us.
pub fn offered(tun: u32) -> u64 {
    let mut f = VIRTIO_NET_F_CSUM | VIRTIO_NET_F_HOST_TSO4 | VIRTIO_NET_F_HOST_TSO6 | VIRTIO_NET_F_HOST_ECN;
    if tun & TUN_F_CSUM != 0 {
        f |= VIRTIO_NET_F_GUEST_CSUM;
        if tun & (TUN_F_TSO4 | TUN_F_TSO6) == TUN_F_TSO4 | TUN_F_TSO6 {
            f |= VIRTIO_NET_F_GUEST_TSO4 | VIRTIO_NET_F_GUEST_TSO6;
        }
        if tun & TUN_F_TSO_ECN != 0 {
            f |= VIRTIO_NET_F_GUEST_ECN;
        }
        if tun & TUN_F_UFO != 0 {
            f |= VIRTIO_NET_F_GUEST_UFO | VIRTIO_NET_F_HOST_UFO;
        }
    }
    f
}

/// The receive offloads to ask of the tap for what the guest negotiated.
pub fn tun_offloads(negotiated: u64) -> u32 {
    if negotiated & VIRTIO_NET_F_GUEST_CSUM == 0 {
        return 0;
    }
    [
        (VIRTIO_NET_F_GUEST_TSO4, TUN_F_TSO4),
        (VIRTIO_NET_F_GUEST_TSO6, TUN_F_TSO6),
        (VIRTIO_NET_F_GUEST_ECN, TUN_F_TSO_ECN),
        (VIRTIO_NET_F_GUEST_UFO, TUN_F_UFO),
    ]
    .iter()
    .filter(|(f, _)| negotiated & f != 0)
    .fold(TUN_F_CSUM, |acc, (_, t)| acc | t)
}

/// Whether the guest may be handed segmentation-offloaded frames (up to 64 KiB).
pub fn receives_gso(negotiated: u64) -> bool {
    negotiated & (VIRTIO_NET_F_GUEST_TSO4 | VIRTIO_NET_F_GUEST_TSO6 | VIRTIO_NET_F_GUEST_UFO) != 0
}
