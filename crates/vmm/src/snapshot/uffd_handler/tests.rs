//! The handler's checks (regions that wrap or pass the file, peers of another user) and a
//! whole round in one process: a peer of another uid refused, the VMM's memory served
//! from the file, and a page the VMM discards reading zeros afterwards, not the file's.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress};

fn mapping(base: u64, size: usize, offset: u64) -> UffdMapping {
    UffdMapping { base_host_virt_addr: base, size, offset, page_size: 4096, page_size_kib: 4096 }
}

#[test]
fn regions_that_wrap_pass_the_file_or_are_not_whole_pages_are_refused() {
    let len = 1 << 20;
    assert_eq!(check_mappings(&[mapping(0x10000, 1 << 20, 0)], len), Ok(()));
    for (m, why) in [
        // offset + size wraps to a small number: once accepted, then copied from far past
        // the handler's mapping of the file.
        (mapping(0x10000, 8192, u64::MAX - 4095), "wraps"),
        (mapping(0x10000, 8192, len - 4096), "passes the file"),
        (mapping(0x10000, 4096 + 1, 0), "not whole pages"),
        (mapping(0x10001, 4096, 0), "base unaligned"),
        (mapping(0x10000, 4096, 1), "offset unaligned"),
        (mapping(0x10000, 0, 0), "empty"),
        (mapping(!4095, 8192, 0), "base + size wraps"),
        (huge(0, 4096, 0), "part of a huge page"),
        (huge(0x1000, 2 << 20, 0), "base not on a huge page"),
        (huge(0, 2 << 20, 4096), "offset not on a huge page"),
        (UffdMapping { page_size: 8192, ..mapping(0, 8192, 0) }, "a page size no host has"),
    ] {
        assert!(check_mappings(&[mapping(0, 4096, 0), m], len).is_err(), "{why}");
    }
    // Firecracker's 2 MiB pages: whole huge pages of the file.
    assert_eq!(check_mappings(&[huge(0x4000_0000, 4 << 20, 2 << 20)], 8 << 20), Ok(()));
}

fn huge(base: u64, size: usize, offset: u64) -> UffdMapping {
    UffdMapping { page_size: 2 << 20, page_size_kib: 2 << 20, ..mapping(base, size, offset) }
}

/// A handler that takes the userfaultfd and never fills a page (dead, or copying pages of
/// the wrong size): the hand-over is refused in bounded time instead of hanging the load,
/// and the memory it leaves is plain memory again (the waiting read was woken).
#[test]
fn a_handler_that_never_fills_a_page_is_refused_in_bounded_time() {
    let dir = std::env::temp_dir().join(format!("exitless-uffd-mute-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("uffd.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let mute = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let (uffd, mappings) = handshake(&stream).unwrap();
        // Holds the fd and reads nothing until the VMM side gives up and hangs up.
        let mut byte = [0u8; 1];
        let _ = std::io::Read::read(&mut &stream, &mut byte);
        (uffd, mappings)
    });
    let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let started = std::time::Instant::now();
    let why = crate::snapshot::uffd::hand_over_within(&socket, &mem, 4096, std::time::Duration::from_millis(300))
        .unwrap_err()
        .to_string();
    assert!(
        why.contains("did not fill the first page") && why.contains("within 0.3 s") && why.contains("4 KiB"),
        "{why}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "bounded");
    assert_eq!(mem.read_obj::<u8>(GuestAddress(0)).unwrap(), 0);
    let (_uffd, mappings) = mute.join().unwrap();
    assert_eq!(mappings.len(), 1);
    assert_eq!((mappings[0].page_size, mappings[0].size), (4096, 1 << 20));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn only_the_handlers_own_user_or_root_may_hand_it_memory() {
    assert!(allowed(1000, 1000));
    assert!(allowed(0, 1000), "root");
    assert!(allowed(0, 0));
    assert!(!allowed(1001, 1000));
    assert!(!allowed(1000, 0), "a user's VMM is not served by root's handler");
}

/// Connects to `socket` from a child process of uid and gid 12345 and waits for it to end;
/// whether the connection was made.
fn connect_as_another_user(socket: &Path) -> bool {
    let mut addr = libc::sockaddr_un { sun_family: libc::AF_UNIX as libc::sa_family_t, sun_path: [0; 108] };
    let path = socket.as_os_str().as_encoded_bytes();
    for (to, &from) in addr.sun_path.iter_mut().zip(path) {
        *to = from as libc::c_char;
    }
    // SAFETY: the child makes only system calls (async-signal-safe) and ends with _exit;
    // the parent waits for it.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let ok = libc::setgid(12345) == 0
                && libc::setuid(12345) == 0
                && libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), size_of::<libc::sockaddr_un>() as u32)
                    == 0;
            // Held until the handler has refused it: a read that ends when it closes.
            let mut byte = 0u8;
            libc::read(fd, (&mut byte as *mut u8).cast(), 1);
            libc::_exit(if ok { 0 } else { 1 });
        }
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}

#[test]
fn a_peer_of_another_user_is_refused_and_a_discarded_page_reads_zeros() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("skipped: needs root to connect as another user");
    }
    let dir = std::env::temp_dir().join(format!("exitless-uffd-handler-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (socket, file) = (dir.join("uffd.sock"), dir.join("mem"));
    // The snapshot's memory: every page holds its number plus one (none is zero).
    let pages = 16u64;
    let bytes: Vec<u8> = (0..pages * 4096).map(|i| (i / 4096 + 1) as u8).collect();
    std::fs::write(&file, &bytes).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let handler = {
        let (socket, file, stop) = (socket.clone(), file.clone(), stop.clone());
        std::thread::spawn(move || {
            serve_until(&socket, &file, || ready_tx.send(()).unwrap(), |_| stop.load(Ordering::SeqCst)).unwrap()
        })
    };
    ready_rx.recv().unwrap();
    // The socket open to anyone: only the credentials check stands in the way.
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    assert!(connect_as_another_user(&socket), "the child could not connect at all");

    let regions = [(GuestAddress(0), (pages * 4096) as usize)];
    let mem = crate::guest_memory::anonymous(&regions).unwrap();
    let _uffd = crate::snapshot::uffd::hand_over(&socket, &mem, 4096).unwrap();
    let byte = |page: u64| mem.read_obj::<u8>(GuestAddress(page * 4096 + 100)).unwrap();
    assert_eq!([byte(3), byte(4)], [4, 5], "served from the file");
    crate::guest_memory::discard(&mem, 3 * 4096, 4096).unwrap();
    assert_eq!(byte(3), 0, "a discarded page reads zeros, not the snapshot's bytes");
    assert_eq!(byte(4), 5, "its neighbour is untouched");
    mem.write_obj(7u8, GuestAddress(3 * 4096)).unwrap();
    assert_eq!(mem.read_obj::<u8>(GuestAddress(3 * 4096)).unwrap(), 7, "and holds what the guest writes");
    stop.store(true, Ordering::SeqCst);
    let served = handler.join().unwrap();
    assert_eq!(served.refused_peers, 1);
    assert!(served.removed >= 1 && served.pages >= 2, "{served:?}");
    drop(mem);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A handler that fills other pages first (one every 100 ms, for three times as long as
/// the wait allows without progress) and the first page last is slow, not stuck: the
/// hand-over waits for it.
#[test]
fn a_handler_making_progress_is_waited_for() {
    let dir = std::env::temp_dir().join(format!("exitless-uffd-slow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("uffd.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let source = vec![9u8; 4096];
    let slow = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let (uffd, mappings) = handshake(&stream).unwrap();
        let base = mappings[0].base_host_virt_addr;
        for page in (1..30u64).chain([0]) {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let mut copy =
                UffdioCopy { dst: base + page * 4096, src: source.as_ptr() as u64, len: 4096, mode: 0, copy: 0 };
            // SAFETY: UFFDIO_COPY of one page from `source` into the registered range.
            assert_eq!(unsafe { libc::ioctl(uffd.as_raw_fd(), UFFDIO_COPY as _, &mut copy) }, 0);
        }
        (uffd, stream)
    });
    let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let within = std::time::Duration::from_secs(1);
    let served = crate::snapshot::uffd::hand_over_within(&socket, &mem, 4096, within);
    assert!(served.is_ok(), "{:?}", served.err());
    assert_eq!(mem.read_obj::<u8>(GuestAddress(0)).unwrap(), 9, "the handler's page");
    let (_uffd, mut stream) = slow.join().unwrap();
    // Firecracker's example handlers poll the connection for more userfaultfds: closed,
    // it reads nothing and they stop serving. It stays open, as Firecracker keeps it.
    stream.set_nonblocking(true).unwrap();
    let read = std::io::Read::read(&mut stream, &mut [0u8; 1]);
    assert!(
        matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the VMM's end of the handshake: {read:?} (Ok(0): closed)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
