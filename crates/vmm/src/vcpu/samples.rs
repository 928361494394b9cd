//! Where a guest spends its time, by sampling: `--sample-guest HZ` kicks every vCPU out
//! of `KVM_RUN` that often and counts the guest RIP it was at. On a host where KVM emulates
//! every CPL0 instruction, a kernel that prints nothing for minutes is busy somewhere, and
//! this names where (with a System.map, which function).

use std::collections::HashMap;

/// Distinct addresses kept; later new ones are only counted as `dropped` (bounded memory).
const MAX_ADDRESSES: usize = 1 << 16;

/// One vCPU's samples: guest RIP -> how often the vCPU was found there.
#[derive(Clone, Debug, Default)]
pub struct GuestSamples {
    pub by_rip: HashMap<u64, u64>,
    pub total: u64,
    /// Samples at a new address after [`MAX_ADDRESSES`] were already kept.
    pub dropped: u64,
}

impl GuestSamples {
    /// Counts a sample.
    pub fn record(&mut self, rip: u64) {
        self.total += 1;
        if let Some(n) = self.by_rip.get_mut(&rip) {
            *n += 1;
        } else if self.by_rip.len() < MAX_ADDRESSES {
            self.by_rip.insert(rip, 1);
        } else {
            self.dropped += 1;
        }
    }

    pub fn merge(&mut self, other: &GuestSamples) {
        for (&rip, &n) in &other.by_rip {
            *self.by_rip.entry(rip).or_insert(0) += n;
        }
        self.total += other.total;
        self.dropped += other.dropped;
    }

    /// Counts grouped by `key` (an address, or the function it falls in), most first.
    pub fn top(&self, key: impl Fn(u64) -> String) -> Vec<(String, u64)> {
        let mut grouped: HashMap<String, u64> = HashMap::new();
        for (&rip, &n) in &self.by_rip {
            *grouped.entry(key(rip)).or_insert(0) += n;
        }
        let mut rows: Vec<_> = grouped.into_iter().collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        rows
    }
}

/// A kernel's symbol table in `nm`/System.map form ("ADDRESS TYPE NAME" per line), to name
/// the function a sampled address falls in.
#[derive(Debug, Default)]
pub struct Symbols {
    /// (address, name), sorted by address; text symbols only.
    sorted: Vec<(u64, String)>,
}

impl Symbols {
    pub fn parse(text: &str) -> Symbols {
        let mut sorted: Vec<(u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let addr = u64::from_str_radix(words.next()?, 16).ok()?;
                let kind = words.next()?;
                let name = words.next()?;
                matches!(kind, "t" | "T" | "w" | "W").then(|| (addr, name.to_string()))
            })
            .collect();
        sorted.sort();
        Symbols { sorted }
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The symbol at or below `addr`: "name", or the address itself if none is.
    pub fn name(&self, addr: u64) -> String {
        match self.sorted.partition_point(|(a, _)| *a <= addr) {
            0 => format!("{addr:#x}"),
            i => self.sorted[i - 1].1.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_group_by_the_function_they_fall_in() {
        let symbols = Symbols::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 t memcpy_orig\nffffffff81000200 D some_data\nnot a line\n",
        );
        let mut s = GuestSamples::default();
        for rip in [0xffff_ffff_8100_0104, 0xffff_ffff_8100_0180, 0xffff_ffff_8100_0010, 0x1000] {
            s.record(rip);
        }
        s.record(0xffff_ffff_8100_0104);
        let top = s.top(|rip| symbols.name(rip));
        assert_eq!(top[0], ("memcpy_orig".to_string(), 3));
        assert!(top.contains(&("_stext".to_string(), 1)));
        assert!(top.contains(&("0x1000".to_string(), 1)), "below every symbol: the address");
        // Data symbols are not functions: an address past one still names the text before it.
        assert_eq!(symbols.name(0xffff_ffff_8100_0300), "memcpy_orig");
        assert_eq!(s.total, 5);
    }

    #[test]
    fn addresses_beyond_the_bound_are_counted_not_kept() {
        let mut s = GuestSamples::default();
        for rip in 0..(MAX_ADDRESSES as u64 + 10) {
            s.record(rip);
        }
        assert_eq!(s.by_rip.len(), MAX_ADDRESSES);
        assert_eq!((s.total, s.dropped), (MAX_ADDRESSES as u64 + 10, 10));
        let mut merged = GuestSamples::default();
        merged.merge(&s);
        merged.merge(&s);
        assert_eq!(merged.total, 2 * s.total);
    }
}
