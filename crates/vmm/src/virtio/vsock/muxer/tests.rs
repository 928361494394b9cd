use super::*;
use crate::testing::{activation, DriverQueue};
use crate::virtio::chain;
use crate::virtio::vsock::packet::{self, Header};
use std::io::Write;
use vm_memory::{Bytes, GuestAddress};

#[test]
fn skips_the_header_across_segments() {
    let s = |addr, len| Segment { addr, len, writable: true };
    let out = chain::skip(&[s(0x1000, 16), s(0x2000, 100)], HEADER_LEN);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].addr, out[0].len), (0x2000 + 28, 72));
    assert!(chain::skip(&[s(0x1000, 44)], HEADER_LEN).is_empty());
}

/// A muxer on 256 KiB of guest memory with its three queues (rx, tx, event: none of
/// them with buffers yet), its `uds_path` in `dir`.
fn muxer(dir: &std::path::Path) -> (Muxer, GuestMemoryMmap, DriverQueue) {
    let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 0x40000)]).unwrap();
    let config = VsockConfig { guest_cid: 3, uds_path: dir.join("v.sock"), id: None };
    let listener = Arc::new(UnixListener::bind(&config.uds_path).unwrap());
    let queues = [0, 1, 2].map(|i| crate::virtio::ActiveQueue {
        queue: DriverQueue::new(i).device_queue(),
        kick: Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()),
    });
    let muxer = Muxer::new(&config, listener, Arc::default(), queues, activation(&mem));
    (muxer, mem, DriverQueue::new(TX))
}

/// The guest sends `op` to `ports` (the host's port, the guest's).
fn send(m: &mut Muxer, mem: &GuestMemoryMmap, tx: &mut DriverQueue, epoll: &Epoll, ports: (u32, u32), op: u16) {
    let (dst_port, src_port) = ports;
    let h = Header {
        src_cid: 3,
        dst_cid: packet::HOST_CID,
        src_port,
        dst_port,
        kind: 1,
        op,
        buf_alloc: 4096,
        ..Default::default()
    };
    let at = 0x30000 + 0x100 * u64::from(tx.used(mem));
    mem.write_slice(&h.bytes(), GuestAddress(at)).unwrap();
    tx.post(mem, &[(at, HEADER_LEN as u32, false)]);
    m.process_tx(epoll);
}

/// A guest that opens connections to a host service that speaks first, and resets
/// each, while it takes no packets: the stream's place in `ready` (and the RESPONSE it
/// was owed) goes with its connection, rather than piling up until a receive buffer
/// comes.
#[test]
fn a_reset_stream_leaves_the_ready_list() {
    let dir = std::env::temp_dir().join(format!("exitless-vsock-ready-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let host = UnixListener::bind(dir.join("v.sock_7000")).unwrap();
    let (mut m, mem, mut tx) = muxer(&dir);
    let epoll = Epoll::new().unwrap();
    let mut events = [EpollEvent::default(); 8];
    for port in 100..106 {
        send(&mut m, &mem, &mut tx, &epoll, (7000, port), packet::OP_REQUEST);
        assert!(m.conns.contains_key(&(7000, port)), "port {port}: not connected");
        let (mut s, _) = host.accept().unwrap();
        s.write_all(b"hello").unwrap();
        let n = epoll.wait(1000, &mut events).unwrap();
        for e in &events[..n] {
            m.event(&epoll, e);
        }
        assert_eq!(m.ready.len(), 1, "port {port}: the stream is ready");
        send(&mut m, &mem, &mut tx, &epoll, (7000, port), packet::OP_RST);
        assert!(m.conns.is_empty() && m.ready.is_empty(), "port {port}: {:?}", m.ready);
        assert!(m.control.is_empty(), "port {port}: its RESPONSE went with it");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
