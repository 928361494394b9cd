//! The guest's memory statistics (virtio 1.2 5.5.6.3): a buffer of packed
//! `{le16 tag, le64 value}` entries, named as Firecracker's `GET /balloon/statistics`
//! names them.

/// Each tag's name, by tag number (Linux's VIRTIO_BALLOON_S_*; 10 and on since 6.12).
pub const STAT_TAGS: [&str; 16] = [
    "swap_in",
    "swap_out",
    "major_faults",
    "minor_faults",
    "free_memory",
    "total_memory",
    "available_memory",
    "disk_caches",
    "hugetlb_allocations",
    "hugetlb_failures",
    "oom_kill",
    "alloc_stall",
    "async_scan",
    "direct_scan",
    "async_reclaim",
    "direct_reclaim",
];

/// One entry's size in the buffer.
pub const ENTRY: usize = 10;
/// The most a statistics buffer is read (far more entries than tags exist).
pub const MAX_BUFFER: usize = 64 * ENTRY;

/// The values the guest sent, by tag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BalloonStats {
    pub values: [Option<u64>; STAT_TAGS.len()],
}

impl BalloonStats {
    /// The statistics in `buf` (a trailing partial entry is ignored); and how many entries
    /// had a tag no one knows (skipped, as Firecracker counts them as failed updates).
    pub fn parse(buf: &[u8]) -> (BalloonStats, u64) {
        let mut stats = BalloonStats::default();
        let mut unknown = 0;
        for entry in buf.chunks_exact(ENTRY) {
            let tag = u16::from_le_bytes([entry[0], entry[1]]);
            let mut value = [0u8; 8];
            value.copy_from_slice(&entry[2..]);
            match stats.values.get_mut(usize::from(tag)) {
                Some(slot) => *slot = Some(u64::from_le_bytes(value)),
                None => unknown += 1,
            }
        }
        (stats, unknown)
    }

    /// The value named `name`, if the guest sent it.
    pub fn get(&self, name: &str) -> Option<u64> {
        STAT_TAGS.iter().position(|&t| t == name).and_then(|i| self.values[i])
    }

    /// (name, value) of every value the guest sent, in tag order.
    pub fn present(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        STAT_TAGS.iter().zip(&self.values).filter_map(|(&n, v)| v.map(|v| (n, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: u16, value: u64) -> Vec<u8> {
        [&tag.to_le_bytes()[..], &value.to_le_bytes()].concat()
    }

    #[test]
    fn entries_are_named_unknown_tags_counted_and_a_partial_entry_ignored() {
        let mut buf = [entry(4, 1 << 20), entry(5, 2 << 20), entry(99, 7), entry(15, 3)].concat();
        buf.extend_from_slice(&[1, 2, 3]);
        let (stats, unknown) = BalloonStats::parse(&buf);
        assert_eq!(unknown, 1);
        assert_eq!(stats.get("free_memory"), Some(1 << 20));
        assert_eq!(stats.get("total_memory"), Some(2 << 20));
        assert_eq!(stats.get("direct_reclaim"), Some(3));
        assert_eq!(stats.get("swap_in"), None);
        let names: Vec<_> = stats.present().map(|(n, _)| n).collect();
        assert_eq!(names, ["free_memory", "total_memory", "direct_reclaim"]);
    }
}
