//! The snapshot tests' VMM: its guest's output read as it comes, snapshots taken and
//! loaded through its API, and a counting guest's tick checked against the snapshot's.
#![allow(dead_code)]

use crate::common::api_process_with;
use exitless_lab::api_client::expect_ok;
use serde_json::json;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A VMM whose stdout lines are collected as they come.
pub struct Vmm {
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Vmm {
    /// With `--enable-pci`: the payloads' virtio driver finds its devices on PCI.
    pub fn start(sock: &Path) -> Vmm {
        Vmm::start_with(sock, &["--enable-pci"])
    }

    pub fn start_with(sock: &Path, extra: &[&str]) -> Vmm {
        let mut child = api_process_with(sock, Stdio::piped(), extra);
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            let mut out = std::io::BufReader::new(out);
            let mut line = String::new();
            // Whole lines only: a guest stopped mid-line ("counter: tick 4" of 45) would
            // otherwise leave a tick it never printed.
            while matches!(out.read_line(&mut line), Ok(n) if n > 0) {
                if let Some(whole) = line.strip_suffix('\n') {
                    sink.lock().unwrap().push(whole.trim_end_matches('\r').to_string());
                }
                line.clear();
            }
        });
        Vmm { child, lines, reader: Some(reader) }
    }

    /// Ends the VMM and reads what it printed to the last line (on a loaded host the
    /// reader may be behind when the process ends).
    pub fn stop_and_drain(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }

    /// The ticks printed whole so far.
    pub fn ticks(&self) -> Vec<u64> {
        let lines = self.lines.lock().unwrap();
        let tick =
            |l: &str| l.strip_prefix("counter: tick ").or_else(|| l.strip_prefix("snapwork: tick "))?.parse().ok();
        lines.iter().filter_map(|l| tick(l)).collect()
    }

    pub fn wait_for_ticks(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.ticks().len() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(self.ticks().len() >= n, "{:?}", self.lines.lock().unwrap());
    }
}

/// A test that ends (or fails) with its VMM running must not leave the process behind.
impl Drop for Vmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn snapshot(sock: &Path, dir: &Path, n: u32) -> (String, String) {
    let (state, mem) = (dir.join(format!("s{n}.json")), dir.join(format!("m{n}.bin")));
    let body = json!({"snapshot_type": "Full", "snapshot_path": state, "mem_file_path": mem});
    expect_ok(sock, "PUT", "/snapshot/create", Some(&body)).unwrap();
    (state.display().to_string(), mem.display().to_string())
}

/// The tick a counting guest (counter, snapwork) had reached when its snapshot was taken:
/// its result slot 0, set after each tick's line, read from the memory file (RAM from
/// address 0, flat). The first whole line a restored guest prints is the next tick, or
/// the one after it where the snapshot caught that next tick's line already begun.
pub fn saved_tick(mem: &str) -> u64 {
    use exitless_payloads::abi::{SHARED_PAGE_GPA, SHARED_RESULT_SLOT};
    let mut slot = [0u8; 8];
    let file = std::fs::File::open(mem).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut slot, SHARED_PAGE_GPA + 8 * SHARED_RESULT_SLOT).unwrap();
    u64::from_le_bytes(slot)
}

/// `ticks` (a restored guest's) go on from the snapshot in `mem`, one by one: nothing
/// replayed, nothing skipped.
pub fn assert_goes_on(mem: &str, ticks: &[u64], what: &str) {
    let saved = saved_tick(mem);
    assert!(ticks.first().is_some_and(|&t| t == saved + 1 || t == saved + 2), "{what}: {saved} then {ticks:?}");
    assert!(ticks.windows(2).all(|w| w[1] == w[0] + 1), "{what}: {ticks:?}");
}

pub fn load(sock: &Path, state: &str, mem: &str) -> Duration {
    let body = json!({"snapshot_path": state, "mem_backend": {"backend_type": "File", "backend_path": mem}, "resume_vm": true});
    let started = Instant::now();
    expect_ok(sock, "PUT", "/snapshot/load", Some(&body)).unwrap();
    started.elapsed()
}
