//! The record of what the balloon holds, and its pages folded into runs. Giving the pages
//! back to the host is guest_memory's one discard routine (virtio-mem's too): a discarded
//! page leaves the VMM's resident memory at once and reads zeros on the guest's next
//! touch, whatever the memory is made of (a restored snapshot's file included).

use crate::guest_memory::GuestMemoryMmap;
use vm_memory::GuestMemoryBackend;

/// The pages the balloon holds, one bit per 4 KiB page of guest physical addresses up to
/// the end of RAM: a page given twice, or taken back though never given, is the
/// driver's error and is refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ballooned {
    bits: Vec<u64>,
    held: u64,
}

impl Ballooned {
    /// Room for every page below the end of `mem`.
    pub fn for_memory(mem: &GuestMemoryMmap) -> Ballooned {
        let pages = mem.last_addr().0.saturating_add(1) >> super::PAGE_SHIFT;
        Ballooned { bits: vec![0; pages.div_ceil(64) as usize], held: 0 }
    }

    /// Marks `pfn` held; false if it already was or is beyond the end of RAM.
    pub fn take(&mut self, pfn: u64) -> bool {
        self.flip(pfn, true)
    }

    /// Marks `pfn` given back; false if it was not held.
    pub fn give(&mut self, pfn: u64) -> bool {
        self.flip(pfn, false)
    }

    fn flip(&mut self, pfn: u64, hold: bool) -> bool {
        let Some(word) = self.bits.get_mut((pfn / 64) as usize) else { return false };
        let bit = 1u64 << (pfn % 64);
        if (*word & bit != 0) == hold {
            return false;
        }
        *word ^= bit;
        match hold {
            true => self.held += 1,
            false => self.held -= 1,
        }
        true
    }

    /// Holds nothing.
    pub fn clear(&mut self) {
        self.bits.fill(0);
        self.held = 0;
    }

    /// How many pages it holds.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// The held pages as runs `(first pfn, count)`, for a snapshot.
    pub fn runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (w, &word) in self.bits.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let pfn = w as u64 * 64 + u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                match runs.last_mut() {
                    Some((first, count)) if *first + *count == pfn => *count += 1,
                    _ => runs.push((pfn, 1)),
                }
            }
        }
        runs
    }

    /// Holds the pages of `runs` (a snapshot's, as [`Ballooned::runs`] writes them: in
    /// order, none empty, none overlapping the one before), a word of 64 pages at a time:
    /// a state file is checksummed but can be crafted, and page by page its runs would
    /// cost their total length (80,000 copies of the whole of RAM: hours). Checked whole
    /// first, so a refused list holds nothing; the work is then linear in the runs plus
    /// guest RAM. Returns the words written.
    pub fn hold_runs(&mut self, runs: &[(u64, u64)]) -> Result<u64, RunsError> {
        let limit = self.bits.len() as u64 * 64;
        let mut end_of_last = 0;
        for &(first, count) in runs {
            let end = first.checked_add(count).filter(|&end| end <= limit).ok_or(RunsError::BeyondRam)?;
            if count == 0 || first < end_of_last {
                return Err(RunsError::Disordered);
            }
            end_of_last = end;
        }
        let mut words = 0;
        for &(first, count) in runs {
            let (mut pfn, end) = (first, first + count);
            while pfn < end {
                let n = (64 - pfn % 64).min(end - pfn);
                let mask = if n == 64 { u64::MAX } else { ((1u64 << n) - 1) << (pfn % 64) };
                let word = &mut self.bits[(pfn / 64) as usize];
                self.held += u64::from((mask & !*word).count_ones());
                *word |= mask;
                (pfn, words) = (pfn + n, words + 1);
            }
        }
        Ok(words)
    }
}

/// Why a snapshot's runs of held pages were refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RunsError {
    #[error("it holds pages beyond the end of guest RAM")]
    BeyondRam,
    #[error("its runs of pages are empty, overlap or are out of order (the file was not written as saved)")]
    Disordered,
}

/// Consecutive page numbers folded into ranges, so one madvise covers each run.
pub fn page_runs(pfns: &mut [u64]) -> Vec<(u64, u64)> {
    pfns.sort_unstable();
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &pfn in pfns.iter() {
        match runs.last_mut() {
            Some((first, count)) if *first + *count == pfn => *count += 1,
            Some((first, count)) if *first + *count > pfn => {} // a duplicate
            _ => runs.push((pfn, 1)),
        }
    }
    runs
}
