//! `--stuck-after SECS`: ends a run in which no vCPU has made progress for that long.
//! Built on the guest sampler (`--sample-guest`): a vCPU whose samples keep finding the
//! same few register files, none new for a while (a loop of a few instructions whose
//! registers never change, such as a spin on a lock nobody will release), spins in place; one found in HLT or
//! waiting for SIPI is idle. When every vCPU is one or the other and at least one spins,
//! and has for SECS, nothing in the guest can end it: a test suite's timeout would only
//! wait longer for the same verdict.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Distinct register files a loop may go through and still count as spinning in place
/// (a four-instruction loop whose one loaded register takes two values is eight).
const LOOP_STATES: usize = 16;

/// What a vCPU last reported in [`Shared::since`]: never sampled yet, idle, or the
/// nanoseconds after `start` (plus one) since when it spins.
const NOT_SAMPLED: u64 = 0;
const IDLE: u64 = u64::MAX;

struct Shared {
    after: Duration,
    start: Instant,
    since: Vec<AtomicU64>,
}

/// One vCPU's view: its own loop so far, and every vCPU's state.
pub struct StuckWatch {
    shared: Arc<Shared>,
    /// Register files (RIP then the 16 GPRs) met lately, each with when it last was.
    states: Vec<([u64; 17], Instant)>,
    /// When the last register file not met before was.
    spinning_since: Instant,
}

/// The watches for `vcpus` vCPUs, one each, sharing what each one last found.
pub fn watches(vcpus: usize, after: Duration) -> Vec<StuckWatch> {
    let start = Instant::now();
    let shared = Arc::new(Shared { after, start, since: (0..vcpus).map(|_| AtomicU64::new(NOT_SAMPLED)).collect() });
    (0..vcpus).map(|_| StuckWatch { shared: shared.clone(), states: Vec::new(), spinning_since: start }).collect()
}

/// A sample's register file: RIP and the general registers, in `kvm_regs` order.
pub fn register_file(r: &kvm_bindings::kvm_regs) -> [u64; 17] {
    [
        r.rip, r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rsp, r.rbp, r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14,
        r.r15,
    ]
}

impl StuckWatch {
    /// Books vCPU `id`'s sample taken `now` (`None`: it was idle); says why the guest is
    /// stuck if every vCPU now has been for the time allowed.
    pub fn sample(&mut self, id: usize, state: Option<[u64; 17]>, now: Instant) -> Option<String> {
        let shared = &self.shared;
        let mine = match state {
            None => {
                self.states.clear();
                IDLE
            }
            Some(state) => {
                match self.states.iter_mut().find(|(s, _)| *s == state) {
                    Some((_, seen)) => *seen = now,
                    None => {
                        // Something new: progress, or a new spin beginning.
                        if self.states.len() == LOOP_STATES {
                            self.states.retain(|(_, seen)| *seen == now);
                        }
                        self.states.push((state, now));
                        self.spinning_since = now;
                    }
                }
                let nanos = self.spinning_since.saturating_duration_since(shared.start).as_nanos();
                u64::try_from(nanos).unwrap_or(IDLE - 1).saturating_add(1).min(IDLE - 1)
            }
        };
        shared.since.get(id)?.store(mine, Ordering::Relaxed);
        if mine == IDLE {
            return None;
        }
        let stuck_for = |since: u64| now.saturating_duration_since(shared.start + Duration::from_nanos(since - 1));
        let all = shared.since.iter().map(|s| s.load(Ordering::Relaxed));
        let every_one_stuck = all.into_iter().all(|s| s == IDLE || (s != NOT_SAMPLED && stuck_for(s) >= shared.after));
        if !every_one_stuck {
            return None;
        }
        // The loop: the states met since it began (the one that began it included).
        let in_loop: Vec<u64> =
            self.states.iter().filter(|(_, seen)| *seen >= self.spinning_since).map(|(s, _)| s[0]).collect();
        let (low, high) = (*in_loop.iter().min()?, *in_loop.iter().max()?);
        Some(format!(
            "stuck: for {:.0} s this vCPU has looped over the same {} register states (RIP {low:#x}..={high:#x}), \
             and every other vCPU has too or is halted, so nothing can end it (a deadlock or a livelock; \
             --stuck-after)",
            stuck_for(mine).as_secs_f64(),
            in_loop.len(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(rip: u64, rax: u64) -> Option<[u64; 17]> {
        let mut s = [0; 17];
        s[0] = rip;
        s[1] = rax;
        Some(s)
    }

    /// Samples vCPU `id` at `at` seconds with `state`.
    fn at(watch: &mut StuckWatch, id: usize, secs: f64, s: Option<[u64; 17]>) -> Option<String> {
        let now = watch.shared.start + Duration::from_secs_f64(secs);
        watch.sample(id, s, now)
    }

    #[test]
    fn a_spin_is_stuck_once_every_other_vcpu_spins_or_idles_for_the_time_allowed() {
        let mut w = watches(2, Duration::from_secs(10));
        // Five seconds of progress (a new register file each sample), then a four-state spin.
        for i in 0..150u64 {
            let t = i as f64 * 0.1;
            let s = if i < 50 { state(0x200 + i, i) } else { state(0x400 + i % 4, 1) };
            assert_eq!(at(&mut w[0], 0, t, s), None, "sample {i}");
            assert_eq!(at(&mut w[1], 1, t, None), None, "an idle vCPU is never the stuck one");
        }
        let why = at(&mut w[0], 0, 15.5, state(0x401, 1)).expect("10 s spinning, the other halted");
        assert!(why.contains("same 4 register states (RIP 0x400..=0x403)"), "{why}");
        // The other vCPU wakes up and works: no longer stuck.
        for i in 0..=LOOP_STATES as u64 {
            at(&mut w[1], 1, 15.6, state(0x900, i));
        }
        assert_eq!(at(&mut w[0], 0, 15.7, state(0x402, 1)), None);
    }

    #[test]
    fn a_loop_whose_registers_change_is_progress() {
        let mut w = watches(1, Duration::from_secs(10));
        for i in 0..1000u64 {
            // sieve-like: the same few instructions, a counter going up.
            assert_eq!(at(&mut w[0], 0, i as f64 * 0.1, state(0x400 + i % 3, i)), None, "sample {i}");
        }
    }

    #[test]
    fn vcpus_never_sampled_or_all_idle_are_not_stuck() {
        let mut w = watches(2, Duration::from_secs(1));
        for i in 0..100 {
            assert_eq!(at(&mut w[0], 0, f64::from(i), state(0x400, 0)), None, "vCPU 1 never sampled");
        }
        let mut w = watches(1, Duration::from_secs(1));
        for i in 0..100 {
            assert_eq!(at(&mut w[0], 0, f64::from(i), None), None, "idle in HLT is waiting, not stuck");
        }
    }
}
