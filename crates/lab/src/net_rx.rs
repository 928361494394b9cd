//! Segmentation-offloaded frames into a guest: the host sends 64 KiB TCP frames with a
//! virtio-net header (a packet socket with PACKET_VNET_HDR on the tap); a guest that took
//! GUEST_TSO4 must get each whole, its header saying TCPV4 and the MSS, every byte intact.

use crate::control::{drive, payload_failure, Console, Window};
use crate::net::{boot_with, start_at_begin, NetBenchError, HOST_MAC, LAB_MAC};
use crate::netns::Netns;
use crate::sink::{pattern, FrameKind};
use exitless_vmm::machine::read_result;
use exitless_vmm::poll::PollMode;
use exitless_vmm::virtio::net::TxMode;
use std::time::Duration;

/// The frame's bytes, Ethernet header on: 65535 (the tap's MTU of 65521 plus the header).
const FRAME: usize = 65535;
const MSS: u16 = 1448;

/// [virtio_net_hdr][Ethernet][IPv4][TCP 5000 -> 5001][seq][lab pattern]: a TSO4 frame with
/// its TCP checksum left partial.
fn gso_frame(seq: u64) -> Vec<u8> {
    let mut f: Vec<u8> = (0..FRAME).map(pattern).collect();
    f[..6].copy_from_slice(&LAB_MAC);
    f[6..12].copy_from_slice(&HOST_MAC);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = [0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
    f[14..34].copy_from_slice(&ip);
    f[16..18].copy_from_slice(&((FRAME - 14) as u16).to_be_bytes());
    let sum = |b: &[u8]| b.chunks(2).map(|w| u32::from(w[0]) << 8 | u32::from(w[1])).sum::<u32>();
    let fold = |mut s: u32| {
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    };
    let ip_check = !fold(sum(&f[14..34]));
    f[24..26].copy_from_slice(&ip_check.to_be_bytes());
    let tcp = [0x13, 0x88, 0x13, 0x89, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0];
    f[34..54].copy_from_slice(&tcp);
    f[54..62].copy_from_slice(&seq.to_le_bytes());
    // The partial checksum: the pseudo-header's sum, as a stack leaves it for the device.
    let pseudo = fold(sum(&f[26..34]) + 6 + (FRAME - 34) as u32);
    f[50..52].copy_from_slice(&pseudo.to_be_bytes());
    let mut hdr = vec![1u8, 1, 54, 0];
    hdr.extend_from_slice(&MSS.to_le_bytes());
    hdr.extend_from_slice(&34u16.to_le_bytes());
    hdr.extend_from_slice(&16u16.to_le_bytes());
    hdr.extend_from_slice(&f);
    hdr
}

/// Sends `frames` GSO frames to a `netecho` guest in GSO mode; how many it checked
/// whole, and its console.
pub fn gso_into_guest(frames: u64, timeout: Duration) -> Result<(u64, String), NetBenchError> {
    let netns = Netns::create("gso")?;
    let console = Console::default();
    let params = vec![frames, 2];
    let booted = boot_with(
        &netns,
        "netecho",
        params,
        (TxMode::Zerocopy, PollMode::Off),
        (0, FrameKind::Tso),
        Some(console.clone()),
    )?;
    let (machine, control, sink) = booted;
    let sender = sink.sender();
    let mut lab = Window::<(), NetBenchError>::new(|_| ());
    start_at_begin(&mut lab, move || {
        for seq in 0..frames {
            let _ = sender.send(&gso_frame(seq));
        }
    });
    drive(&machine, &control, timeout, &mut lab)?;
    if let Some(why) = payload_failure(&machine) {
        return Err(NetBenchError::Guest(why));
    }
    Ok((read_result(machine.memory(), 0), console.text()))
}
