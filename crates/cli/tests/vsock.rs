//! virtio-vsock with Firecracker's host side, against the `vsockecho` guest: 16 host
//! connections at once through `CONNECT <port>`, each's bytes echoed and verified; a
//! guest connection to the host's `<uds>_<port>`; a port nobody listens on refused.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `exitless run --payload vsockecho` with a vsock at `uds`; returns once the guest listens.
fn echo_guest(uds: &std::path::Path, params: &str) -> (Child, BufReader<std::process::ChildStdout>) {
    let vsock = format!("cid=3,uds={}", uds.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["run", "--payload", "vsockecho", "--vsock", &vsock, "--params", params, "--timeout", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut before = String::new();
    while out.read_line(&mut line).unwrap() > 0 && !line.contains("listening") {
        before.push_str(&line);
        line.clear();
    }
    assert!(line.contains("CID 3 listening on port 1234"), "{before}{line}");
    // The hostile prelude (param 4): exactly the two packets for no connection were reset.
    if params.split(',').nth(4) == Some("1") {
        assert!(before.contains("vsockecho: hostile: 2 resets"), "{before}");
    }
    (child, out)
}

fn finish(child: &mut Child, mut out: BufReader<std::process::ChildStdout>) -> String {
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "{status}: {rest}\n{err}");
    rest
}

/// A host connection to the guest's `port` through `CONNECT`, answered `OK <port>`.
fn connect_port(uds: &std::path::Path, port: u32) -> (UnixStream, BufReader<UnixStream>) {
    let mut stream = UnixStream::connect(uds).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut ok = String::new();
    reader.read_line(&mut ok).unwrap();
    assert!(ok.starts_with("OK ") && ok.trim()[3..].parse::<u32>().is_ok(), "{ok:?}");
    (stream, reader)
}

fn pattern(stream: usize, i: usize) -> u8 {
    (i * 31 + stream * 7) as u8
}

#[test]
fn sixteen_host_connections_are_echoed_byte_for_byte() {
    if !kvm_or_skip("sixteen_host_connections_are_echoed_byte_for_byte") {
        return;
    }
    let dir = tempdir();
    let uds = dir.join("v.sock");
    let (mut child, out) = echo_guest(&uds, "1234,16");
    const BYTES: usize = 64 << 10;
    let clients: Vec<_> = (0..16)
        .map(|s| {
            let uds = uds.clone();
            std::thread::spawn(move || {
                let (mut stream, mut reader) = connect_port(&uds, 1234);
                let data: Vec<u8> = (0..BYTES).map(|i| pattern(s, i)).collect();
                let writer = std::thread::spawn(move || {
                    for chunk in data.chunks(4096) {
                        stream.write_all(chunk).unwrap();
                    }
                    stream
                });
                let mut echo = vec![0u8; BYTES];
                reader.read_exact(&mut echo).unwrap();
                let stream = writer.join().unwrap();
                assert!(echo.iter().enumerate().all(|(i, &b)| b == pattern(s, i)), "stream {s}: bytes differ");
                drop(stream);
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let rest = finish(&mut child, out);
    assert!(rest.contains(&format!("{} bytes echoed on 16 streams", 16 * BYTES)), "{rest}");
    assert!(rest.contains(", 0 errors"), "{rest}");
}

#[test]
fn the_guest_connects_to_the_hosts_port_and_unknown_ports_are_refused() {
    if !kvm_or_skip("the_guest_connects_to_the_hosts_port_and_unknown_ports_are_refused") {
        return;
    }
    let dir = tempdir();
    let uds = dir.join("v.sock");
    // The host's side of port 7000: echoes what the guest sends.
    let listener = UnixListener::bind(format!("{}_7000", uds.display())).unwrap();
    let host = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let mut total = 0;
        while let Ok(n @ 1..) = s.read(&mut buf) {
            s.write_all(&buf[..n]).unwrap();
            total += n;
        }
        total
    });
    let (mut child, out) = echo_guest(&uds, "1234,1,7000,10000");
    // Meanwhile: a host connection to a port the guest does not listen on is closed
    // without an OK.
    let mut stream = UnixStream::connect(&uds).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(b"CONNECT 4321\n").unwrap();
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    assert!(reply.is_empty(), "{reply:?}");
    let rest = finish(&mut child, out);
    assert!(rest.contains("10000 client bytes checked, 0 errors"), "{rest}");
    assert_eq!(host.join().unwrap(), 10000);
    assert!(!uds.exists(), "the VMM removes its socket");
}

#[test]
fn firecrackers_vsock_section_and_put_vsock() {
    use exitless_lab::api_client::{expect_ok, request};
    if !kvm_or_skip("firecrackers_vsock_section_and_put_vsock") {
        return;
    }
    let dir = tempdir();
    let payloads = payloads_in(&dir);
    let uds = dir.join("fc.vsock");
    // Through the API: a CID that does not fit 32 bits is refused (any other is taken, as
    // Firecracker takes it), a good one configures the device.
    let sock = dir.join("api.sock");
    let mut child = api_process(&sock, Stdio::piped());
    let bad = serde_json::json!({"guest_cid": 1u64 << 32, "uds_path": uds});
    let bad = request(&sock, "PUT", "/vsock", Some(&bad)).unwrap();
    assert_eq!(bad.status, 400, "{:?}", bad.body);
    let vsock = serde_json::json!({"vsock_id": "vsock0", "guest_cid": 3, "uds_path": uds});
    expect_ok(&sock, "PUT", "/vsock", Some(&vsock)).unwrap();
    let boot =
        serde_json::json!({"kernel_image_path": payloads.join("vsockecho.elf"), "boot_args": "exitless.params=1234,1"});
    expect_ok(&sock, "PUT", "/boot-source", Some(&boot)).unwrap();
    expect_ok(&sock, "PUT", "/actions", Some(&serde_json::json!({"action_type": "InstanceStart"}))).unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 && !line.contains("listening") {
        line.clear();
    }
    let mut stream = UnixStream::connect(&uds).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(b"CONNECT 1234\nhello").unwrap();
    let mut reply = [0u8; 64];
    let mut got = Vec::new();
    while !got.ends_with(b"hello") {
        let n = stream.read(&mut reply).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&reply[..n]);
    }
    assert!(got.starts_with(b"OK "), "{:?}", String::from_utf8_lossy(&got));
    drop(stream);
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("5 bytes echoed on 1 streams"), "{rest}");
    let _ = child.wait();
}

#[test]
fn bench_vsock_measures_round_trips_and_a_verified_stream() {
    if !kvm_or_skip("bench_vsock_measures_round_trips_and_a_verified_stream") {
        return;
    }
    let (out, json) = bench_json(&["vsock", "--rounds", "50", "--stream", "4M"]);
    assert!(stdout(&out).contains("rtt us"), "{}", stdout(&out));
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "off and adaptive: {json}");
    for row in rows {
        assert!(row["rtt_us"].as_f64().unwrap() > 0.0, "{json}");
        assert!(row["stream_gbytes_per_s"].as_f64().unwrap() > 0.0, "{json}");
        assert!(row["exits_per_rtt"].as_f64().unwrap() >= 0.0, "{json}");
    }
    assert_eq!(json["targets"].as_array().unwrap().len(), 3, "{json}");
}

#[test]
fn a_host_that_stops_reading_holds_the_stream_back_and_nothing_is_lost() {
    if !kvm_or_skip("a_host_that_stops_reading_holds_the_stream_back_and_nothing_is_lost") {
        return;
    }
    let dir = tempdir();
    let uds = dir.join("v.sock");
    let (mut child, out) = echo_guest(&uds, "1234,1");
    let (mut stream, mut reader) = connect_port(&uds, 1234);
    // 4 MiB, far more than the credit both ways and the sockets' buffers hold: while the
    // host reads nothing, the writer must stall, not the bytes go missing.
    const BYTES: usize = 4 << 20;
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let progress = written.clone();
    let writer = std::thread::spawn(move || {
        for at in (0..BYTES).step_by(4096) {
            let chunk: Vec<u8> = (at..at + 4096).map(|i| pattern(9, i)).collect();
            stream.write_all(&chunk).unwrap();
            progress.store(at + 4096, std::sync::atomic::Ordering::Relaxed);
        }
        stream
    });
    std::thread::sleep(Duration::from_millis(500));
    let stalled = written.load(std::sync::atomic::Ordering::Relaxed);
    assert!(stalled < BYTES, "the writer was never held back ({stalled} bytes written)");
    let mut echo = vec![0u8; BYTES];
    reader.read_exact(&mut echo).unwrap();
    assert!(echo.iter().enumerate().all(|(i, &b)| b == pattern(9, i)), "bytes lost, reordered or doubled");
    drop(writer.join().unwrap());
    drop(reader);
    let rest = finish(&mut child, out);
    assert!(rest.contains(&format!("{BYTES} bytes echoed on 1 streams")), "{rest}");
}

#[test]
fn malformed_packets_get_silence_or_rst_and_the_device_keeps_serving() {
    if !kvm_or_skip("malformed_packets_get_silence_or_rst_and_the_device_keeps_serving") {
        return;
    }
    let dir = tempdir();
    let uds = dir.join("v.sock");
    let (mut child, out) = echo_guest(&uds, "1234,1,0,0,1,4321");
    // A REQUEST the guest ignores: the host's connection is closed after Firecracker's
    // 2 s, not left hanging.
    let mut ignored = UnixStream::connect(&uds).unwrap();
    ignored.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    ignored.write_all(b"CONNECT 4321\n").unwrap();
    let asked = std::time::Instant::now();
    let mut reply = String::new();
    let _ = ignored.read_to_string(&mut reply);
    assert!(reply.is_empty(), "{reply:?}");
    let waited = asked.elapsed();
    // Closed by the VMM, not by this side's read timeout.
    assert!(waited >= Duration::from_millis(1500) && waited < Duration::from_secs(25), "closed after {waited:?}");
    let (mut stream, mut reader) = connect_port(&uds, 1234);
    stream.write_all(b"still here").unwrap();
    let mut echo = [0u8; 10];
    reader.read_exact(&mut echo).unwrap();
    assert_eq!(&echo, b"still here");
    drop((stream, reader));
    let rest = finish(&mut child, out);
    assert!(rest.contains("10 bytes echoed on 1 streams"), "{rest}");
}

/// The VMM of a test, killed when the test ends however it ends.
struct Vmm(Child);

impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `exitless run --payload vsockflood` with a vsock at `uds`; its stdout's lines come
/// through the channel (a thread reads them, so the guest's progress never fills the pipe).
fn flood_guest(uds: &std::path::Path, params: &str) -> (Vmm, std::sync::mpsc::Receiver<String>) {
    let vsock = format!("cid=3,uds={}", uds.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["run", "--payload", "vsockflood", "--vsock", &vsock, "--params", params, "--timeout", "120"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (Vmm(child), rx)
}

/// The next line that contains `what`, within `wait`; panics with the lines before it.
fn line_with(lines: &std::sync::mpsc::Receiver<String>, what: &str, wait: Duration) -> String {
    let deadline = std::time::Instant::now() + wait;
    let mut seen = String::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(what) => return line,
            Ok(line) => seen.push_str(&format!("{line}\n")),
            Err(_) => break,
        }
    }
    panic!("no line with {what:?} in {wait:?}; before it:\n{seen}");
}

/// VmRSS of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Issue 53: a guest that posts no receive buffers and sends packets each answered RST
/// grew the VMM's heap 3.2 MB/s, without end. The RSTs the device keeps are bounded now:
/// over 15 s of flood, the VMM's RSS after the first second stays within 1 MiB.
#[test]
fn a_flood_of_packets_answered_rst_leaves_the_vmms_memory_flat() {
    if !kvm_or_skip("a_flood_of_packets_answered_rst_leaves_the_vmms_memory_flat") {
        return;
    }
    let dir = tempdir();
    let (vmm, lines) = flood_guest(&dir.join("v.sock"), "0");
    line_with(&lines, "vsockflood: flooding", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    let first = rss_kib(vmm.0.id());
    let mut most = first;
    for _ in 0..14 {
        std::thread::sleep(Duration::from_secs(1));
        most = most.max(rss_kib(vmm.0.id()));
    }
    // The flood went on the whole time (a progress line every 65536 packets).
    let last = lines.try_iter().filter(|l| l.ends_with(" sent")).last();
    assert!(last.is_some(), "the guest sent fewer than 65536 packets in 15 s");
    eprintln!("VmRSS {first} KiB 1 s into the flood, at most {most} KiB over the next 14 s ({last:?})");
    assert!(most <= first + 1024, "RSS grew from {first} KiB to {most} KiB under the flood ({last:?})");
}

/// After a flood (of REQUESTs to a port nobody serves) the guest posts receive buffers
/// and connects to a port that listens: no more than the device's bound of RSTs were
/// waiting, then its RESPONSE came.
#[test]
fn after_a_flood_the_device_kept_at_most_256_resets_and_still_answers() {
    if !kvm_or_skip("after_a_flood_the_device_kept_at_most_256_resets_and_still_answers") {
        return;
    }
    let dir = tempdir();
    let uds = dir.join("v.sock");
    let _listener = UnixListener::bind(format!("{}_7000", uds.display())).unwrap();
    let (vmm, lines) = flood_guest(&uds, "20000,9999,1,7000");
    let line = line_with(&lines, "resets were waiting", Duration::from_secs(100));
    assert!(line.ends_with("then the device answered"), "{line}");
    let waiting: u64 = line.split(", ").nth(1).and_then(|w| w.split(' ').next()?.parse().ok()).unwrap();
    assert!((1..=256).contains(&waiting), "{waiting} resets waited: {line}");
    drop(vmm);
}

/// Fills the backlog of the listener at `path`: connects without blocking until the
/// kernel refuses (EAGAIN); the connections that got in are returned, to be held.
fn fill_backlog(path: &std::path::Path) -> Vec<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data, for which all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    assert!(bytes.len() < addr.sun_path.len(), "{path:?} is too long for a Unix socket");
    for (to, &from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = from as libc::c_char;
    }
    let mut held = Vec::new();
    loop {
        // SAFETY: makes a descriptor; no memory is passed.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0) };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just made and nothing else owns it.
        let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let len = (std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1) as libc::socklen_t;
        // SAFETY: `addr` lives through the call; `len` covers the path and its NUL.
        if unsafe { libc::connect(fd, (&raw const addr).cast(), len) } < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
            return held;
        }
        held.push(owned);
        assert!(held.len() < 1 << 16, "the backlog never filled");
    }
}

/// Issue 53, item 9: the guest connects to the host's port 7000, whose listener never
/// accepts and whose backlog is full. The device refuses it (RST) at once, where a
/// blocking connect held the device thread until the host accepted: a host connection
/// to the guest is echoed meanwhile, and the VMM stops when the guest is done.
#[test]
fn a_host_port_with_a_full_backlog_is_refused_and_the_device_goes_on() {
    use std::os::fd::AsRawFd;
    if !kvm_or_skip("a_host_port_with_a_full_backlog_is_refused_and_the_device_goes_on") {
        return;
    }
    let dir = tempdir();
    let uds = dir.join("v.sock");
    let port = std::path::PathBuf::from(format!("{}_7000", uds.display()));
    let listener = UnixListener::bind(&port).unwrap();
    // SAFETY: listen(2) on a descriptor the listener owns; backlog 0 (one waits at most).
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let _held = fill_backlog(&port);
    // Two closes: the refused client connection to 7000 and the host's echo below.
    let (child, out) = echo_guest(&uds, "1234,2,7000,16");
    let mut vmm = Vmm(child);
    // The guest's REQUEST to 7000 goes first.
    std::thread::sleep(Duration::from_millis(500));
    let started = std::time::Instant::now();
    let mut stream = UnixStream::connect(&uds).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(b"CONNECT 1234\nstill here").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    while !got.ends_with(b"still here") {
        match stream.read(&mut buf) {
            Ok(n @ 1..) => got.extend_from_slice(&buf[..n]),
            end => panic!("{end:?} after {:?}: the device thread is stuck", String::from_utf8_lossy(&got)),
        }
    }
    assert!(got.starts_with(b"OK "), "{:?}", String::from_utf8_lossy(&got));
    assert!(started.elapsed() < Duration::from_secs(5), "the echo took {:?}", started.elapsed());
    drop(stream);
    let rest = finish(&mut vmm.0, out);
    assert!(rest.contains("10 bytes echoed on 1 streams, 0 client bytes checked, 0 errors"), "{rest}");
    drop(listener);
}
