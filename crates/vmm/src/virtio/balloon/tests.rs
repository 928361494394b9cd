//! The balloon's queues driven as a driver would (and as a hostile one would) on a small
//! guest memory: pages discarded, refused, statistics held and given back, hinting runs.

use super::discard::{page_runs, Ballooned};
use super::worker::Worker;
use super::*;
use crate::guest_memory::GuestMemoryMmap;
use crate::testing::{activation, DriverQueue};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

const MEM: usize = 1 << 20;
const PAGE: u64 = 4096;
fn memory() -> GuestMemoryMmap {
    crate::guest_memory::anonymous(&[(GuestAddress(0), MEM)]).unwrap()
}

fn worker(config: BalloonConfig, mem: &GuestMemoryMmap, drivers: &[DriverQueue]) -> (Worker, Arc<BalloonShared>) {
    let shared = Arc::new(new_shared(config, mem));
    let queues = drivers
        .iter()
        .map(|d| ActiveQueue { queue: d.device_queue(), kick: Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap()) });
    let roles = roles(config);
    assert_eq!(roles.len(), drivers.len());
    (Worker::new(roles.into_iter().zip(queues).collect(), activation(mem), shared.clone()), shared)
}

fn pfns(list: &[u32]) -> Vec<u8> {
    list.iter().flat_map(|p| p.to_le_bytes()).collect()
}

fn page_byte(mem: &GuestMemoryMmap, pfn: u64) -> u8 {
    mem.read_obj(GuestAddress(pfn * PAGE + 100)).unwrap()
}

#[test]
fn inflate_discards_pages_and_refuses_outside_twice_and_unheld() {
    let mem = memory();
    for pfn in 64..68u64 {
        mem.write_slice(&[0xaa; 4096], GuestAddress(pfn * PAGE)).unwrap();
    }
    let mut q = [DriverQueue::new(0), DriverQueue::new(1)];
    // 64..66 given, 64 twice, one page beyond RAM.
    let inflate = pfns(&[64, 65, 66, 64, (MEM as u32 / 4096) + 5]);
    mem.write_slice(&inflate, GuestAddress(0x8000)).unwrap();
    q[0].post(&mem, &[(0x8000, inflate.len() as u32, false)]);
    // 64 taken back; 67 was never given.
    let deflate = pfns(&[64, 67]);
    mem.write_slice(&deflate, GuestAddress(0x9000)).unwrap();
    q[1].post(&mem, &[(0x9000, deflate.len() as u32, false)]);
    let (mut w, shared) = worker(BalloonConfig::default(), &mem, &q);
    w.process_all();
    assert_eq!([page_byte(&mem, 64), page_byte(&mem, 65), page_byte(&mem, 66)], [0; 3], "discarded: zero again");
    assert_eq!(page_byte(&mem, 67), 0xaa, "never given: untouched");
    let c = &shared.counters;
    assert_eq!(c.inflated_pages.load(Ordering::Relaxed), 3);
    assert_eq!(c.deflated_pages.load(Ordering::Relaxed), 1);
    assert_eq!(c.bad_pages.load(Ordering::Relaxed), 3, "twice, outside RAM, never given");
    assert_eq!(crate::sync::lock(&shared.ballooned).held(), 2);
    assert_eq!((q[0].used(&mem), q[1].used(&mem)), (1, 1), "both buffers used");
}

/// Issue 53, item 10: a restored guest's memory is the snapshot's file mapped privately.
/// A page it inflates must read zeros afterwards, not the snapshot's bytes again.
#[test]
fn inflate_on_a_guest_restored_from_a_file_gives_zeros_not_the_snapshot() {
    use std::os::unix::fs::FileExt;
    let path = std::env::temp_dir().join(format!("exitless-balloon-restored-{}", std::process::id()));
    let file = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    file.set_len(MEM as u64).unwrap();
    file.write_all_at(&[0xcc; 2 * 4096], 64 * PAGE).unwrap();
    let mem = crate::snapshot::memory::map_private(&file, &[(GuestAddress(0), MEM)]).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(page_byte(&mem, 64), 0xcc, "the snapshot's page");
    let mut q = [DriverQueue::new(0), DriverQueue::new(1)];
    mem.write_slice(&pfns(&[64]), GuestAddress(0x8000)).unwrap();
    q[0].post(&mem, &[(0x8000, 4, false)]);
    let (mut w, shared) = worker(BalloonConfig::default(), &mem, &q);
    w.process_all();
    assert_eq!(shared.counters.inflated_pages.load(Ordering::Relaxed), 1);
    assert_eq!(page_byte(&mem, 64), 0, "inflated: zeros, not the snapshot's bytes");
    assert_eq!(page_byte(&mem, 65), 0xcc, "not inflated: the snapshot's");
}

#[test]
fn a_device_writable_pfn_buffer_or_a_broken_chain_is_refused_and_used() {
    let mem = memory();
    mem.write_slice(&[0xaa; 4096], GuestAddress(64 * PAGE)).unwrap();
    mem.write_slice(&pfns(&[64]), GuestAddress(0x8000)).unwrap();
    let mut q = [DriverQueue::new(0), DriverQueue::new(1)];
    q[0].post(&mem, &[(0x8000, 4, true)]);
    q[0].post(&mem, &[(MEM as u64 - 2, 4, false)]);
    let (mut w, shared) = worker(BalloonConfig::default(), &mem, &q);
    w.process_all();
    assert_eq!(page_byte(&mem, 64), 0xaa);
    assert_eq!(shared.counters.bad_chains.load(Ordering::Relaxed), 2);
    assert_eq!(q[0].used(&mem), 2);
}

#[test]
fn statistics_are_read_and_their_buffer_held_until_the_interval() {
    let mem = memory();
    let config = BalloonConfig { stats_polling_interval_s: 60, ..Default::default() };
    let mut q = [DriverQueue::new(0), DriverQueue::new(1), DriverQueue::new(2)];
    let entry = |tag: u16, v: u64| [&tag.to_le_bytes()[..], &v.to_le_bytes()].concat();
    let stats = [entry(4, 111 << 20), entry(5, 500 << 20), entry(77, 1)].concat();
    mem.write_slice(&stats, GuestAddress(0xa000)).unwrap();
    let head = q[2].post(&mem, &[(0xa000, stats.len() as u32, false)]);
    let (mut w, shared) = worker(config, &mem, &q);
    w.process_all();
    let latest = crate::sync::lock(&shared.stats).clone().unwrap();
    assert_eq!((latest.get("free_memory"), latest.get("total_memory")), (Some(111 << 20), Some(500 << 20)));
    assert_eq!(shared.counters.stats_update_fails.load(Ordering::Relaxed), 1, "the unknown tag");
    assert_eq!(q[2].used(&mem), 0, "held: the interval is not over");
    assert_eq!(shared.stats_head.load(Ordering::Relaxed), u32::from(head));
    w.request_statistics(false);
    assert_eq!(q[2].used(&mem), 0, "60 s have not passed");
    w.request_statistics_now();
    assert_eq!(q[2].used(&mem), 1, "given back: the request for new statistics");
    assert_eq!(shared.stats_head.load(Ordering::Relaxed), u32::MAX);
}

#[test]
fn reported_ranges_are_discarded_whole_pages_only() {
    let mem = memory();
    for pfn in 80..84u64 {
        mem.write_slice(&[0xbb; 4096], GuestAddress(pfn * PAGE)).unwrap();
    }
    let config = BalloonConfig { free_page_reporting: true, ..Default::default() };
    let mut q = [DriverQueue::new(0), DriverQueue::new(1), DriverQueue::new(2)];
    q[2].post(&mem, &[(80 * PAGE, 2 * PAGE as u32, true), (83 * PAGE + 8, PAGE as u32, true)]);
    q[2].post(&mem, &[(MEM as u64 - PAGE, 2 * PAGE as u32, true)]);
    let (mut w, shared) = worker(config, &mem, &q);
    w.process_all();
    assert_eq!([page_byte(&mem, 80), page_byte(&mem, 81)], [0, 0]);
    assert_eq!([page_byte(&mem, 82), page_byte(&mem, 83)], [0xbb, 0xbb], "not reported, or not whole pages");
    assert_eq!(shared.counters.reported_bytes.load(Ordering::Relaxed), 2 * PAGE);
    assert_eq!(shared.counters.bad_pages.load(Ordering::Relaxed), 1);
    assert_eq!(shared.counters.bad_chains.load(Ordering::Relaxed), 1, "past the end of RAM");
    assert_eq!(q[2].used(&mem), 2);
}

#[test]
fn hints_count_only_in_the_run_the_device_asked_for_and_stop_is_acknowledged() {
    let mem = memory();
    for pfn in 90..94u64 {
        mem.write_slice(&[0xcc; 4096], GuestAddress(pfn * PAGE)).unwrap();
    }
    let config = BalloonConfig { free_page_hinting: true, ..Default::default() };
    let mut q = [DriverQueue::new(0), DriverQueue::new(1), DriverQueue::new(2)];
    mem.write_obj(7u32, GuestAddress(0xb000)).unwrap(); // an old run
    mem.write_obj(9u32, GuestAddress(0xb004)).unwrap(); // the device's run
    mem.write_obj(HINT_CMD_STOP, GuestAddress(0xb008)).unwrap();
    q[2].post(&mem, &[(0xb000, 4, false), (90 * PAGE, PAGE as u32, true)]);
    q[2].post(&mem, &[(0xb004, 4, false), (91 * PAGE, 2 * PAGE as u32, true)]);
    q[2].post(&mem, &[(0xb008, 4, false)]);
    let (mut w, shared) = worker(config, &mem, &q);
    *crate::sync::lock(&shared.hint) =
        HintState { host_cmd: 9, last_cmd: 9, acknowledge_on_stop: true, guest_cmd: None };
    w.process_all();
    assert_eq!(page_byte(&mem, 90), 0xcc, "a hint of an older run");
    assert_eq!([page_byte(&mem, 91), page_byte(&mem, 92)], [0, 0]);
    assert_eq!(page_byte(&mem, 93), 0xcc);
    let hint = *crate::sync::lock(&shared.hint);
    assert_eq!((hint.host_cmd, hint.guest_cmd), (HINT_CMD_DONE, Some(HINT_CMD_STOP)), "STOP answered with DONE");
    let mut config_space = [0u8; CONFIG_LEN];
    shared.config_bytes(&mut config_space);
    assert_eq!(config_space[8..12], HINT_CMD_DONE.to_le_bytes());
    assert_eq!(shared.counters.hinted_bytes.load(Ordering::Relaxed), 2 * PAGE);
}

#[test]
fn queues_and_features_follow_the_configuration_and_only_actual_is_writable() {
    let mem = memory();
    let config = BalloonConfig {
        amount_mib: 3,
        deflate_on_oom: true,
        stats_polling_interval_s: 0,
        free_page_hinting: false,
        free_page_reporting: true,
    };
    let mut b = VirtioBalloon::new(config, &mem).unwrap();
    assert_eq!(b.device_type(), 5);
    assert_eq!(b.queue_max_sizes().len(), 3, "inflate, deflate, reporting");
    let f = b.features();
    assert_ne!(f & VIRTIO_BALLOON_F_DEFLATE_ON_OOM, 0);
    assert_ne!(f & VIRTIO_BALLOON_F_PAGE_REPORTING, 0);
    assert_eq!(f & (VIRTIO_BALLOON_F_STATS_VQ | VIRTIO_BALLOON_F_FREE_PAGE_HINT), 0);
    let mut num_pages = [0u8; 4];
    b.read_config(0, &mut num_pages);
    assert_eq!(u32::from_le_bytes(num_pages), 3 * 256);
    assert!(b.write_config(4, &200u32.to_le_bytes()));
    assert!(!b.write_config(0, &1u32.to_le_bytes()), "num_pages is the device's");
    assert!(!b.write_config(4, &[1, 2]), "actual is written whole");
    let mut actual = [0u8; 4];
    b.read_config(4, &mut actual);
    assert_eq!(u32::from_le_bytes(actual), 200);
}

#[test]
fn a_snapshot_state_round_trips_and_a_hostile_one_is_refused() {
    let mem = memory();
    let config = BalloonConfig { stats_polling_interval_s: 5, ..Default::default() };
    let b = VirtioBalloon::new(config, &mem).unwrap();
    b.shared.actual_pages.store(42, Ordering::Relaxed);
    b.shared.stats_head.store(3, Ordering::Relaxed);
    crate::sync::lock(&b.shared.ballooned).take(70);
    let saved = b.save_state().unwrap().unwrap();
    let mut other = VirtioBalloon::new(config, &mem).unwrap();
    other.restore_state(Some(&saved)).unwrap();
    assert_eq!(other.save_state().unwrap().unwrap(), saved);
    let bad = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = saved.clone();
        f(&mut v.state);
        VirtioBalloon::new(config, &mem).unwrap().restore_state(Some(&v)).unwrap_err().to_string()
    };
    assert!(bad(&|v| v["stats_head"] = 999.into()).contains("`stats_head`"), "a head beyond the queue");
    let beyond = bad(&|v| v["ballooned"] = serde_json::json!([[1u64 << 40, 2]]));
    assert!(beyond.contains("`ballooned`"), "pages beyond RAM: {beyond}");
    assert!(bad(&|v| v["ballooned"] = serde_json::json!([[u64::MAX, 2]])).contains("`ballooned`"), "overflowing");
    assert!(bad(&|v| v["target_pages"] = "many".into()).contains("`target_pages` does not parse"));
    let no_stats = VirtioBalloon::new(BalloonConfig::default(), &mem).unwrap().save_state().unwrap().unwrap();
    let mut with_stats = no_stats.clone();
    with_stats.state["stats_interval_s"] = 5.into();
    assert!(VirtioBalloon::new(BalloonConfig::default(), &mem).unwrap().restore_state(Some(&with_stats)).is_err());
    // A balloon keeps state: a snapshot without it, or of another version, is refused.
    let mut balloon = VirtioBalloon::new(config, &mem).unwrap();
    assert!(matches!(balloon.restore_state(None), Err(crate::persist::StateFault::Missing)));
    let later = crate::persist::Saved { version: 2, ..saved.clone() };
    assert!(balloon.restore_state(Some(&later)).unwrap_err().to_string().contains("version 2"));
}

#[test]
fn held_pages_fold_into_runs_and_page_numbers_into_ranges() {
    let mem = memory();
    let mut held = Ballooned::for_memory(&mem);
    for pfn in [3, 4, 5, 9, 255] {
        assert!(held.take(pfn));
    }
    assert!(!held.take(4), "twice");
    assert!(!held.take(256), "beyond RAM");
    assert!(!held.give(6), "never given");
    assert_eq!(held.runs(), [(3, 3), (9, 1), (255, 1)]);
    assert_eq!(page_runs(&mut [7, 5, 6, 6, 20]), [(5, 3), (20, 1)]);
}

/// A state file is checksummed, but the checksum can be recomputed: 20,000 copies of the
/// whole of a 64 MiB guest's RAM were 327 million pages marked one by one. Refused as
/// soon as the second run overlaps the first, holding nothing.
#[test]
fn a_crafted_state_of_overlapping_runs_is_refused_at_once() {
    let mem = crate::guest_memory::anonymous(&[(GuestAddress(0), 64 << 20)]).unwrap();
    let pages = (64u64 << 20) / PAGE;
    let mut state = VirtioBalloon::new(BalloonConfig::default(), &mem).unwrap().save_state().unwrap().unwrap();
    state.state["ballooned"] = serde_json::json!(vec![[0, pages]; 20_000]);
    let mut b = VirtioBalloon::new(BalloonConfig::default(), &mem).unwrap();
    let started = std::time::Instant::now();
    let e = b.restore_state(Some(&state)).unwrap_err().to_string();
    // Generous: the refusal reads each run once; the old loop took seconds here.
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
    assert!(e.contains("overlap"), "{e}");
    assert_eq!(crate::sync::lock(&b.shared.ballooned).held(), 0);
}

/// Runs are laid a word of 64 pages at a time: whatever the file lists, the work is
/// bounded by the runs plus guest RAM's words, never by the runs' total length.
#[test]
fn runs_are_held_a_word_at_a_time_and_only_in_order() {
    let mem = memory();
    let pages = MEM as u64 / PAGE;
    let mut held = Ballooned::for_memory(&mem);
    assert_eq!(held.hold_runs(&[(0, pages)]), Ok(pages / 64), "one run of all RAM: a word per 64 pages");
    assert_eq!(held.held(), pages);
    // Every other page, a run each (the most runs RAM allows): a word per run at most.
    held.clear();
    let alternate: Vec<(u64, u64)> = (0..pages / 2).map(|i| (2 * i, 1)).collect();
    let words = held.hold_runs(&alternate).unwrap();
    assert!(words <= alternate.len() as u64 + pages / 64, "{words}");
    assert_eq!((held.held(), held.runs()), (pages / 2, alternate.clone()));
    // Runs straddling words, end to end: the same pages as one run.
    let mut straddling = Ballooned::for_memory(&mem);
    assert_eq!(straddling.hold_runs(&[(3, 70), (73, 100), (173, 83)]), Ok(2 + 2 + 2));
    assert_eq!((straddling.held(), straddling.runs()), (253, vec![(3, 253)]));
    // Overlapping, out of order, empty, beyond RAM: refused whole, nothing held.
    for bad in [&[(0, 10), (5, 10)][..], &[(20, 1), (10, 1)], &[(4, 0)], &[(pages - 1, 2)], &[(u64::MAX, 2)]] {
        let mut fresh = Ballooned::for_memory(&mem);
        assert!(fresh.hold_runs(bad).is_err(), "{bad:?}");
        assert_eq!(fresh.held(), 0, "{bad:?}");
    }
}
