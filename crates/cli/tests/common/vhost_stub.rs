//! A vhost-user backend of the tests' own, speaking just enough of the protocol (the
//! handshake, vhost-user-blk's GET_CONFIG, a reply to whatever asks for one), and
//! misbehaving as told.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// How the stub backend behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stub {
    /// Answers the handshake as virtiofsd (or a block backend) does.
    Good,
    /// Closes its socket after the first message.
    Close,
    /// Offers no VIRTIO_F_VERSION_1.
    NoVersion1,
    /// Answers GET_FEATURES with the header of another request.
    Malformed,
    /// Reads everything, answers nothing.
    Silent,
    /// Shakes hands, then closes its socket when given the memory table (at activation).
    CloseAtMemTable,
    /// Answers GET_CONFIG with a configuration space of the wrong size.
    ShortConfig,
    /// Shakes hands and takes the vrings as Good does, then dies (closes its socket)
    /// once the last is enabled: a backend killed mid-run.
    Crash,
}

pub const GET_FEATURES: u32 = 1;
pub const SET_MEM_TABLE: u32 = 5;
pub const GET_VRING_BASE: u32 = 11;
pub const GET_PROTOCOL_FEATURES: u32 = 15;
pub const GET_QUEUE_NUM: u32 = 17;
pub const GET_CONFIG: u32 = 24;
pub const SET_VRING_ENABLE: u32 = 18;
pub const VERSION_1: u64 = 1 << 32;
pub const PROTOCOL_FEATURES: u64 = 1 << 30;
pub const EVENT_IDX: u64 = 1 << 29;
/// MQ, REPLY_ACK and CONFIG.
pub const PROTOCOL: u64 = 0x1 | 0x8 | 0x200;
/// A reply's flags: version 1, the reply bit.
const REPLY: u32 = 0x1 | 0x4;
const NEED_REPLY: u32 = 0x8;

/// The block device's capacity the stub reports (sectors).
pub const CAPACITY: u64 = 8192;

fn send(s: &mut UnixStream, request: u32, body: &[u8]) {
    let mut m = Vec::new();
    for w in [request, REPLY, body.len() as u32] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    m.extend_from_slice(body);
    let _ = s.write_all(&m);
}

/// A stub backend listening on `path`, serving one connection as `mode` says.
pub fn stub(path: &Path, mode: Stub) -> std::thread::JoinHandle<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        let reply = |s: &mut UnixStream, request: u32, value: u64| send(s, request, &value.to_le_bytes());
        loop {
            let mut header = [0u8; 12];
            if s.read_exact(&mut header).is_err() {
                return;
            }
            let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap());
            let (request, flags, size) = (word(0), word(4), word(8));
            let mut body = vec![0u8; size as usize];
            if s.read_exact(&mut body).is_err() {
                return;
            }
            match (mode, request) {
                (Stub::Close, _) => return,
                (Stub::Silent, _) => continue,
                (Stub::CloseAtMemTable, SET_MEM_TABLE) => return,
                (Stub::Malformed, GET_FEATURES) => reply(&mut s, GET_QUEUE_NUM, VERSION_1),
                (Stub::NoVersion1, GET_FEATURES) => reply(&mut s, request, PROTOCOL_FEATURES | EVENT_IDX),
                (_, GET_FEATURES) => reply(&mut s, request, VERSION_1 | PROTOCOL_FEATURES | EVENT_IDX),
                (_, GET_PROTOCOL_FEATURES) => reply(&mut s, request, PROTOCOL),
                (_, GET_QUEUE_NUM) => reply(&mut s, request, 2),
                (_, GET_CONFIG) => {
                    // offset, size, flags, then the space: virtio-blk's capacity first.
                    let want = u32::from_le_bytes(body[4..8].try_into().unwrap());
                    let want = if mode == Stub::ShortConfig { want - 4 } else { want };
                    let mut space = vec![0u8; want as usize];
                    space[..8].copy_from_slice(&CAPACITY.to_le_bytes());
                    let mut answer = body[..4].to_vec();
                    answer.extend_from_slice(&want.to_le_bytes());
                    answer.extend_from_slice(&body[8..12]);
                    answer.extend_from_slice(&space);
                    send(&mut s, request, &answer);
                }
                (_, GET_VRING_BASE) => {
                    let mut answer = body[..4].to_vec();
                    answer.extend_from_slice(&0u32.to_le_bytes());
                    send(&mut s, request, &answer);
                }
                (Stub::Crash, SET_VRING_ENABLE) => {
                    reply(&mut s, request, 0);
                    return;
                }
                _ if flags & NEED_REPLY != 0 => reply(&mut s, request, 0),
                _ => {}
            }
        }
    })
}
