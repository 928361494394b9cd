//! virtio-balloon (type 5) with Firecracker's semantics: the VMM sets a target in pages
//! (`num_pages`), the driver inflates toward it (each page it gives up is discarded from
//! the VMM's memory: resident memory falls) or deflates back (the page faults in again,
//! zeroed, when the guest touches it), and reports how far it got (`actual`). Optionally:
//! statistics at a polling interval, deflate on OOM, free page reporting (pages the guest
//! frees are discarded without any API call) and free page hinting runs.
//!
//! The queues the driver sets up are compacted: inflate, deflate, then only those whose
//! feature is offered (statistics, hinting, reporting), in that order.

mod attach;
mod discard;
mod stats;
mod worker;

pub use attach::{attach, BalloonError, BalloonHandle, KIND};
pub use discard::Ballooned;
pub use stats::{BalloonStats, STAT_TAGS};

use super::thread::{DeviceThread, QueuePosition};
use super::{ActivateError, Activation, ActiveQueue, VirtioDevice, VIRTIO_F_VERSION_1};
use crate::persist::{DeviceState, Saved, StateFault};
use crate::seccomp::ThreadKind;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use worker::Worker;

pub const VIRTIO_BALLOON_F_STATS_VQ: u64 = 1 << 1;
pub const VIRTIO_BALLOON_F_DEFLATE_ON_OOM: u64 = 1 << 2;
pub const VIRTIO_BALLOON_F_FREE_PAGE_HINT: u64 = 1 << 3;
pub const VIRTIO_BALLOON_F_PAGE_REPORTING: u64 = 1 << 5;

/// The balloon's unit: 4 KiB pages, whatever the guest's page size (virtio 1.2 5.5.6).
pub const PAGE_SHIFT: u32 = 12;
const QUEUE_SIZE: u16 = 256;
pub const CONFIG_LEN: usize = 16;

/// Free page hinting's command ids (virtio 1.2 5.5.6.1): STOP ends a run, DONE tells the
/// driver the device is finished with the hinted pages; a run's id is anything above.
pub const HINT_CMD_STOP: u32 = 0;
pub const HINT_CMD_DONE: u32 = 1;

/// What the balloon is given at the start (Firecracker's `PUT /balloon`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BalloonConfig {
    pub amount_mib: u32,
    pub deflate_on_oom: bool,
    /// 0: no statistics queue at all (and none can be turned on later).
    pub stats_polling_interval_s: u16,
    pub free_page_hinting: bool,
    pub free_page_reporting: bool,
}

impl BalloonConfig {
    fn features(&self) -> u64 {
        let mut f = VIRTIO_F_VERSION_1;
        for (on, bit) in [
            (self.deflate_on_oom, VIRTIO_BALLOON_F_DEFLATE_ON_OOM),
            (self.stats_polling_interval_s > 0, VIRTIO_BALLOON_F_STATS_VQ),
            (self.free_page_hinting, VIRTIO_BALLOON_F_FREE_PAGE_HINT),
            (self.free_page_reporting, VIRTIO_BALLOON_F_PAGE_REPORTING),
        ] {
            if on {
                f |= bit;
            }
        }
        f
    }
}

/// Each queue's job, in the driver's (compacted) order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Inflate,
    Deflate,
    Stats,
    Hint,
    Report,
}

/// What the API, the report and the device thread share.
#[derive(Default)]
pub struct BalloonShared {
    /// The target the VMM sets (config `num_pages`).
    pub target_pages: AtomicU32,
    /// What the driver says it holds (config `actual`, written by the driver).
    pub actual_pages: AtomicU32,
    /// Seconds between two statistics requests (0: none).
    pub stats_interval_s: AtomicU32,
    /// The guest's last statistics, when it sent any.
    pub stats: Mutex<Option<BalloonStats>>,
    /// The free page hinting run.
    pub hint: Mutex<HintState>,
    /// The statistics buffer the device holds until the next interval: its head index,
    /// `u32::MAX` if none (kept here so a snapshot carries it).
    pub stats_head: AtomicU32,
    /// The pages the balloon holds.
    pub ballooned: Mutex<Ballooned>,
    pub counters: BalloonCounters,
}

impl BalloonShared {
    /// The configuration space: num_pages, actual, free_page_hint_cmd_id, poison_val
    /// (virtio 1.2 5.5.4; no poisoning is offered, so 0).
    pub fn config_bytes(&self, config: &mut [u8; CONFIG_LEN]) {
        config[0..4].copy_from_slice(&self.target_pages.load(Ordering::Acquire).to_le_bytes());
        config[4..8].copy_from_slice(&self.actual_pages.load(Ordering::Acquire).to_le_bytes());
        config[8..12].copy_from_slice(&crate::sync::lock(&self.hint).host_cmd.to_le_bytes());
    }
}

/// Firecracker's `balloon` metrics group and what the driver did wrong.
#[derive(Default)]
pub struct BalloonCounters {
    pub inflates: AtomicU64,
    pub deflates: AtomicU64,
    pub stats_updates: AtomicU64,
    pub stats_update_fails: AtomicU64,
    pub inflated_pages: AtomicU64,
    pub deflated_pages: AtomicU64,
    /// Ranges the guest freed (reporting) or hinted, and their bytes discarded.
    pub reported_ranges: AtomicU64,
    pub reported_bytes: AtomicU64,
    pub hinted_ranges: AtomicU64,
    pub hinted_bytes: AtomicU64,
    /// Pages or ranges refused: outside guest RAM, inflated twice, deflated unheld.
    pub bad_pages: AtomicU64,
    pub bad_chains: AtomicU64,
    pub kicks: AtomicU64,
    pub irqs: AtomicU64,
}

/// Free page hinting: the command the device gave (config `free_page_hint_cmd_id`), the
/// driver's last, and whether the driver's STOP is answered with DONE at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HintState {
    pub host_cmd: u32,
    pub guest_cmd: Option<u32>,
    pub last_cmd: u32,
    pub acknowledge_on_stop: bool,
}

/// What a balloon keeps in a snapshot beyond its transport.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonState {
    pub target_pages: u32,
    pub actual_pages: u32,
    pub stats_interval_s: u32,
    pub stats_head: Option<u16>,
    pub hint: HintState,
    /// The pages the balloon holds, as runs (first page number, count).
    pub ballooned: Vec<(u64, u64)>,
}

impl DeviceState for BalloonState {
    const VERSION: u32 = 1;
}

pub struct VirtioBalloon {
    config: BalloonConfig,
    roles: Vec<Role>,
    pub shared: Arc<BalloonShared>,
    thread: DeviceThread<Worker>,
}

/// One pass over every queue the driver filled, with a fresh device of `config` on
/// `a.mem` running hinting run `hint_cmd` (the fuzz target); then the statistics
/// interval, as if it were over. Returns what the device recorded.
pub fn process_once(
    config: BalloonConfig,
    hint_cmd: u32,
    queues: Vec<ActiveQueue>,
    a: Activation,
) -> Arc<BalloonShared> {
    let shared = Arc::new(new_shared(config, &a.mem));
    crate::sync::lock(&shared.hint).host_cmd = hint_cmd;
    let roles = roles(config);
    let mut worker = Worker::new(roles.into_iter().zip(queues).collect(), a, shared.clone());
    worker.process_all();
    worker.request_statistics_now();
    shared
}

fn roles(config: BalloonConfig) -> Vec<Role> {
    let mut roles = vec![Role::Inflate, Role::Deflate];
    for (on, role) in [
        (config.stats_polling_interval_s > 0, Role::Stats),
        (config.free_page_hinting, Role::Hint),
        (config.free_page_reporting, Role::Report),
    ] {
        if on {
            roles.push(role);
        }
    }
    roles
}

fn new_shared(config: BalloonConfig, mem: &crate::guest_memory::GuestMemoryMmap) -> BalloonShared {
    BalloonShared {
        target_pages: AtomicU32::new(mib_to_pages(config.amount_mib)),
        stats_interval_s: AtomicU32::new(u32::from(config.stats_polling_interval_s)),
        stats_head: AtomicU32::new(u32::MAX),
        ballooned: Mutex::new(Ballooned::for_memory(mem)),
        ..Default::default()
    }
}

impl VirtioBalloon {
    /// A balloon aiming at `config.amount_mib` in guest memory `mem`; its thread starts
    /// now, idle until the driver activates it.
    pub fn new(config: BalloonConfig, mem: &crate::guest_memory::GuestMemoryMmap) -> std::io::Result<Self> {
        let (roles, shared) = (roles(config), Arc::new(new_shared(config, mem)));
        Ok(VirtioBalloon { config, roles, shared, thread: DeviceThread::spawn("virtio-balloon", ThreadKind::Balloon)? })
    }

    pub fn config(&self) -> BalloonConfig {
        self.config
    }
}

pub fn mib_to_pages(mib: u32) -> u32 {
    mib.saturating_mul(1 << (20 - PAGE_SHIFT))
}

pub fn pages_to_mib(pages: u32) -> u32 {
    pages >> (20 - PAGE_SHIFT)
}

impl VirtioDevice for VirtioBalloon {
    fn device_type(&self) -> u16 {
        5
    }

    fn features(&self) -> u64 {
        self.config.features()
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; self.roles.len()]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; CONFIG_LEN];
        self.shared.config_bytes(&mut config);
        super::copy_config(&config, offset, data);
    }

    /// Only `actual` is the driver's to write.
    fn write_config(&mut self, offset: u64, data: &[u8]) -> bool {
        match (offset, <[u8; 4]>::try_from(data)) {
            (4, Ok(bytes)) => {
                self.shared.actual_pages.store(u32::from_le_bytes(bytes), Ordering::Release);
                true
            }
            _ => false,
        }
    }

    fn activate(&mut self, queues: Vec<ActiveQueue>, a: Activation) -> Result<(), ActivateError> {
        self.thread.stop();
        if queues.len() != self.roles.len() {
            return Err(ActivateError::QueueCount { want: self.roles.len(), have: queues.len() });
        }
        if !a.restored {
            self.shared.stats_head.store(u32::MAX, Ordering::Release);
        }
        let worker = Worker::new(self.roles.iter().copied().zip(queues).collect(), a, self.shared.clone());
        self.thread.start(worker)
    }

    fn reset(&mut self) {
        self.thread.stop();
        self.shared.stats_head.store(u32::MAX, Ordering::Release);
        self.shared.actual_pages.store(0, Ordering::Release);
        // A driver that starts over owns all its memory again.
        crate::sync::lock(&self.shared.ballooned).clear();
    }

    fn pause(&mut self) -> Option<Vec<QueuePosition>> {
        // Every chain but the statistics buffer is used in the pass that took it; that one
        // is held on purpose, and the snapshot keeps its head (BalloonState).
        self.thread.pause()
    }

    fn resume(&mut self) -> Result<(), ActivateError> {
        self.thread.resume()
    }

    fn save_state(&self) -> Result<Option<Saved>, StateFault> {
        let s = &self.shared;
        let head = s.stats_head.load(Ordering::Acquire);
        let state = BalloonState {
            target_pages: s.target_pages.load(Ordering::Acquire),
            actual_pages: s.actual_pages.load(Ordering::Acquire),
            stats_interval_s: s.stats_interval_s.load(Ordering::Acquire),
            stats_head: u16::try_from(head).ok(),
            hint: *crate::sync::lock(&s.hint),
            ballooned: crate::sync::lock(&s.ballooned).runs(),
        };
        Saved::encode(&state).map(Some)
    }

    fn restore_state(&mut self, state: Option<&Saved>) -> Result<(), StateFault> {
        let state: BalloonState = state.ok_or(StateFault::Missing)?.decode()?;
        if state.stats_head.is_some_and(|h| h >= QUEUE_SIZE) {
            let why = format!("statistics buffer {:?} is not in a queue", state.stats_head);
            return Err(StateFault::invalid("stats_head", why));
        }
        if state.stats_interval_s > 0 && self.config.stats_polling_interval_s == 0 {
            let why = "statistics polled, but the device has no statistics queue";
            return Err(StateFault::invalid("stats_interval_s", why));
        }
        let s = &self.shared;
        let mut ballooned = crate::sync::lock(&s.ballooned);
        ballooned.clear();
        if let Err(e) = ballooned.hold_runs(&state.ballooned) {
            return Err(StateFault::invalid("ballooned", e.to_string()));
        }
        drop(ballooned);
        s.target_pages.store(state.target_pages, Ordering::Release);
        s.actual_pages.store(state.actual_pages, Ordering::Release);
        s.stats_interval_s.store(state.stats_interval_s, Ordering::Release);
        s.stats_head.store(state.stats_head.map_or(u32::MAX, u32::from), Ordering::Release);
        *crate::sync::lock(&s.hint) = state.hint;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
