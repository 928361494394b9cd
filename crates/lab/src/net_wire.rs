//! What a guest's offloaded frames become on the wire. The lab's namespace routes the
//! guest's TCP frames (to 10.9.0.2, through the tap's own MAC) out of a second tap opened
//! with no offloads, so the kernel must segment and checksum them in software as a NIC
//! would: a 64 KiB TSO4 frame comes out as ceil(payload / MSS) segments, each with a
//! correct IPv4 and TCP checksum and its bytes in place; a frame that only left its
//! checksum partial comes out with the checksum filled in.

use crate::control::{drive, lab_machine, payload_failure, LabMachine, Window};
use crate::net::{NetBenchError, HOST_MAC, LAB_MAC};
use crate::netns::{enter_current_thread, Netns, NetnsError};
use crate::sink::pattern;
use exitless_vmm::net::Tap;
use exitless_vmm::poll::PollMode;
use exitless_vmm::NetConfig;
use std::process::Command;
use std::time::{Duration, Instant};

const MSS: usize = 1448;
const VNET_HDR: usize = 12;
const PEER_MAC: &str = "02:00:00:00:00:09";

/// What came out of the egress tap.
#[derive(Clone, Debug, Default)]
pub struct WireReport {
    /// TCP segments of the guest's flow.
    pub segments: u64,
    /// Segments whose IPv4 and TCP checksums are right and whose bytes are in place.
    pub good: u64,
    pub bad_checksum: u64,
    pub bad_bytes: u64,
}

fn ns_cmd(netns: &Netns, args: &[&str]) -> Result<(), NetnsError> {
    let out = Command::new("ip").args(["netns", "exec", &netns.name]).args(args).output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(NetnsError::Ip { args: args.join(" "), detail: String::from_utf8_lossy(&o.stderr).into() }),
        Err(e) => Err(NetnsError::Ip { args: args.join(" "), detail: e.to_string() }),
    }
}

/// Sends `frames` frames of `size` bytes (TSO4 above one MSS, else a partial checksum
/// only) from an `nettx` guest and checks what the kernel made of them.
pub fn offloads_on_the_wire(size: usize, frames: u64, timeout: Duration) -> Result<WireReport, NetBenchError> {
    let netns = Netns::create("wire")?;
    let taps = crate::netns::unique_ifname("exw");
    let [guest_tap, egress] = ["g", "e"].map(|s| format!("{taps}{s}"));
    let net = NetConfig::on_tap(guest_tap.clone(), LAB_MAC);
    let host_mac = HOST_MAC.iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b));
    let params = vec![size as u64, frames, 0, 0, 0, 0, 1, host_mac, 0x0a09_0002];
    let LabMachine { machine, control, .. } = lab_machine("nettx", params, |c| {
        c.devices.allocated = vec![exitless_vmm::virtio::net::attach(net, PollMode::Off)];
    })?;
    netns.adopt(&guest_tap)?;
    let mac = HOST_MAC.map(|b| format!("{b:02x}")).join(":");
    // The egress tap: opened in the namespace with no offloads, so nothing leaves it unsegmented.
    let (name, ns) = (egress.clone(), netns.name.clone());
    let opened = std::thread::spawn(move || {
        enter_current_thread(&ns).map_err(|e| e.to_string())?;
        Tap::open(&name).map_err(|e| e.to_string())
    });
    let tap = opened.join().map_err(|_| NetBenchError::Missing("egress tap"))?.map_err(NetBenchError::Setup)?;
    for args in [
        &["ip", "link", "set", "dev", &guest_tap, "address", &mac][..],
        &["ip", "addr", "add", "10.0.0.1/24", "dev", &guest_tap],
        &["ip", "addr", "add", "10.9.0.1/24", "dev", &egress],
        &["ip", "neigh", "replace", "10.9.0.2", "lladdr", PEER_MAC, "dev", &egress, "nud", "permanent"],
        &["sysctl", "-qw", "net.ipv4.ip_forward=1"],
    ] {
        ns_cmd(&netns, args)?;
    }
    let mut lab = Window::<(), NetBenchError>::new(|_| ());
    drive(&machine, &control, timeout, &mut lab)?;
    if let Some(why) = payload_failure(&machine) {
        return Err(NetBenchError::Guest(why));
    }
    Ok(read_segments(&tap, size, frames))
}

/// Reads the egress tap until every segment expected came or it stays quiet for 30 s (the
/// guest sent them all before it ended; a loaded host may route the last ones late).
fn read_segments(tap: &Tap, size: usize, frames: u64) -> WireReport {
    let payload = size - 54;
    let expected = frames * payload.div_ceil(MSS) as u64;
    let mut report = WireReport::default();
    let mut buf = vec![0u8; 65536 + VNET_HDR];
    let mut quiet_since = Instant::now();
    while report.segments < expected && quiet_since.elapsed() < Duration::from_secs(30) {
        let Ok(n) = tap.read_frame(&mut buf) else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        quiet_since = Instant::now();
        let f = &buf[VNET_HDR.min(n)..n];
        if f.len() < 54 || f[12..14] != [0x08, 0x00] || f[23] != 6 || f[36..38] != 5001u16.to_be_bytes() {
            continue;
        }
        report.segments += 1;
        if !checksums_ok(f) {
            report.bad_checksum += 1;
        } else if !bytes_ok(f) {
            report.bad_bytes += 1;
        } else {
            report.good += 1;
        }
    }
    report
}

fn ones_sum(chunks: &[&[u8]], extra: u32) -> u16 {
    let mut sum = extra;
    for c in chunks {
        for w in c.chunks(2) {
            sum += u32::from(w[0]) << 8 | u32::from(*w.get(1).unwrap_or(&0));
        }
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The IPv4 header's and the TCP segment's checksums (pseudo-header included) hold.
fn checksums_ok(f: &[u8]) -> bool {
    let ip_len = usize::from(u16::from_be_bytes([f[16], f[17]]));
    if ip_len < 40 || 14 + ip_len > f.len() {
        return false;
    }
    let tcp = &f[34..14 + ip_len];
    ones_sum(&[&f[14..34]], 0) == 0xffff && ones_sum(&[&f[26..34], tcp], 6 + tcp.len() as u32) == 0xffff
}

/// The segment's payload is the guest frame's from its TCP sequence number on: past the
/// frame's own 8-byte sequence number, the lab pattern of the frame's byte 54 + offset.
fn bytes_ok(f: &[u8]) -> bool {
    let ip_len = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let start = u32::from_be_bytes([f[38], f[39], f[40], f[41]]) as usize;
    f[54..14 + ip_len].iter().enumerate().all(|(i, &b)| start + i < 8 || b == pattern(54 + start + i))
}
