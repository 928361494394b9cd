//! MMDS end to end without a VM: a smoltcp client stands in for the guest, its Ethernet
//! frames go through `wants`/`receive` and MMDS's frames come back from `pop_frame`.

use super::{wants, Mmds, MmdsStack, Version, DEFAULT_ADDRESS};
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::time::Instant as NetInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct Wire {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
}

struct Rx(Vec<u8>);
struct Tx<'a>(&'a mut VecDeque<Vec<u8>>);

impl phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut b = vec![0; len];
        let r = f(&mut b);
        self.0.push_back(b);
        r
    }
}

impl phy::Device for Wire {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;
    fn receive(&mut self, _: NetInstant) -> Option<(Rx, Tx<'_>)> {
        let f = self.rx.pop_front()?;
        Some((Rx(f), Tx(&mut self.tx)))
    }
    fn transmit(&mut self, _: NetInstant) -> Option<Tx<'_>> {
        Some(Tx(&mut self.tx))
    }
    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ethernet;
        c.max_transmission_unit = 1514;
        c
    }
}

/// Sends `requests` on one connection from a smoltcp "guest" and returns what came back.
fn fetch(stack: &mut MmdsStack, requests: &str) -> String {
    let mut wire = Wire::default();
    let config = Config::new(HardwareAddress::Ethernet(EthernetAddress([2, 0, 0, 0, 0, 9])));
    let mut guest = Interface::new(config, &mut wire, NetInstant::ZERO);
    guest.update_ip_addrs(|a| {
        let _ = a.push(IpCidr::new(IpAddress::v4(10, 0, 0, 2), 0));
    });
    let mut sockets = SocketSet::new(vec![]);
    let mut socket = tcp::Socket::new(tcp::SocketBuffer::new(vec![0; 65536]), tcp::SocketBuffer::new(vec![0; 4096]));
    socket.connect(guest.context(), (IpAddress::Ipv4(DEFAULT_ADDRESS), 80), 49152).unwrap();
    let handle = sockets.add(socket);
    let (mut sent, mut got, mut t) = (false, Vec::new(), 0i64);
    for _ in 0..200 {
        t += 1000;
        guest.poll(NetInstant::from_micros(t), &mut wire, &mut sockets);
        let s = sockets.get_mut::<tcp::Socket>(handle);
        if s.may_send() && !sent {
            s.send_slice(requests.as_bytes()).unwrap();
            sent = true;
        }
        while s.can_recv() {
            s.recv(|b| {
                got.extend_from_slice(b);
                (b.len(), ())
            })
            .unwrap();
        }
        guest.poll(NetInstant::from_micros(t), &mut wire, &mut sockets);
        for frame in wire.tx.drain(..) {
            assert!(wants(DEFAULT_ADDRESS, &frame), "every frame the guest sends here is for MMDS");
            stack.receive(&frame);
        }
        while let Some(f) = stack.pop_frame() {
            wire.rx.push_back(f);
        }
    }
    String::from_utf8(got).unwrap()
}

fn stack(version: Version) -> MmdsStack {
    let mut m = Mmds::new(65536);
    m.put(serde_json::json!({"latest": {"meta-data": {"ami-id": "ami-1", "big": "x".repeat(40000)}}})).unwrap();
    m.version = version;
    MmdsStack::with_seed(Arc::new(Mutex::new(m)), DEFAULT_ADDRESS, 0)
}

#[test]
fn a_guest_resolves_connects_and_reads() {
    let mut s = stack(Version::V1);
    let r = fetch(&mut s, "GET /latest/meta-data/ami-id HTTP/1.1\r\n\r\nGET /latest/meta-data/big HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r:.200}");
    assert!(r.contains("\r\n\r\nami-1HTTP/1.1 200 OK"), "two pipelined answers in order: {r:.300}");
    assert!(r.ends_with(&"x".repeat(40000)), "a 40 KB answer arrives whole across many segments");
    assert_eq!(s.counters.requests, 2);
}

#[test]
fn v2_refuses_without_a_token() {
    let mut s = stack(Version::V2);
    let r = fetch(&mut s, "GET /latest/meta-data/ami-id HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
}

#[test]
fn frames_for_others_are_not_wanted_and_garbage_is_harmless() {
    let mut arp_other = vec![0u8; 42];
    arp_other[12..14].copy_from_slice(&[0x08, 0x06]);
    arp_other[38..42].copy_from_slice(&[10, 0, 0, 1]);
    assert!(!wants(DEFAULT_ADDRESS, &arp_other));
    assert!(!wants(DEFAULT_ADDRESS, &[0x08, 0x00]));
    let mut s = stack(Version::V1);
    let mut junk = [0xffu8; 60];
    junk[12..14].copy_from_slice(&[0x08, 0x00]);
    junk[30..34].copy_from_slice(&DEFAULT_ADDRESS.octets());
    for n in [0, 13, 14, 34, 60] {
        s.receive(&junk[..n]);
    }
    assert!(s.pop_frame().is_none(), "nothing answers garbage");
}

#[test]
fn the_kept_fuzz_seeds_replay_whole_conversations() {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/mmds_frames");
    let replay = |name: &str| crate::fuzzing::mmds_replay(&std::fs::read(corpus.join(name)).unwrap());
    // Recorded from the tests above (a smoltcp guest against a stack seeded with 0).
    assert_eq!(replay("v1-pipelined-gets").requests, 2);
    assert_eq!(replay("v2-no-token").requests, 1);
}
