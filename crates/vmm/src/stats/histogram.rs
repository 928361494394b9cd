//! The exit-time histogram's counters, in an anonymous mapping of their own rather than
//! on the heap: a page of buckets nobody hit is never touched, so it costs no memory,
//! and reading it maps the kernel's shared zero page. The scale ([`bucket`]) is exact to
//! 8 cycles below 1,024 and then 32 buckets per doubling: a row is 2.4 KiB, and a kind
//! of exit whose times spread from 1,000 to 100,000 cycles takes some 800 bytes of it,
//! where linear buckets of 8 cycles took four pages (and lumped all beyond 32K cycles).
//! A vCPU holds a page or two per kind of exit it makes, twice (its own and the API's
//! published copy); zeroed on the heap the whole of it was resident from the start.

use vm_memory::mmap::MmapRegion;

/// Cycles per unit of the scale: the linear part's bucket width.
const UNIT: u64 = 8;
/// Buckets of one unit, below 128 units (1,024 cycles).
const LINEAR: usize = 128;
/// 2^5 = 32 buckets per doubling above: a bucket's midpoint is within 1.6% of its times.
const SUB_BITS: u32 = 5;
/// Doublings above the linear part, to 2^25 cycles (about 10 ms); beyond, the last bucket.
const DOUBLINGS: usize = 15;
/// Buckets in a row: the scale's and one for everything beyond it.
pub const BUCKETS: usize = LINEAR + (DOUBLINGS << SUB_BITS) + 1;

/// The bucket of an exit that took `cycles`.
#[inline]
pub fn bucket(cycles: u64) -> usize {
    let units = cycles / UNIT;
    if units < LINEAR as u64 {
        return units as usize;
    }
    // The doubling [2^top, 2^(top + 1)) units, top >= 7, cut in 2^SUB_BITS equal buckets.
    let top = 63 - units.leading_zeros();
    let doubling = (top - LINEAR.trailing_zeros()) as usize;
    if doubling >= DOUBLINGS {
        return BUCKETS - 1;
    }
    let sub = (units >> (top - SUB_BITS)) as usize & ((1 << SUB_BITS) - 1);
    LINEAR + (doubling << SUB_BITS) + sub
}

/// The cycles in the middle of bucket `b` (the last: where the scale ends).
pub fn midpoint(b: usize) -> f64 {
    if b < LINEAR {
        return (b as u64 * UNIT) as f64 + UNIT as f64 / 2.0;
    }
    let (doubling, sub) = ((b - LINEAR) >> SUB_BITS, (b - LINEAR) & ((1 << SUB_BITS) - 1));
    if doubling >= DOUBLINGS {
        return ((LINEAR as u64) << DOUBLINGS) as f64 * UNIT as f64;
    }
    let top = doubling as u32 + LINEAR.trailing_zeros();
    let width = 1u64 << (top - SUB_BITS);
    ((1u64 << top) + sub as u64 * width) as f64 * UNIT as f64 + (width * UNIT) as f64 / 2.0
}

/// `rows` rows of `cols` counters, all zero at first.
pub struct Histogram {
    pages: MmapRegion,
    rows: usize,
    cols: usize,
}

impl Histogram {
    pub fn new(rows: usize, cols: usize) -> Histogram {
        let bytes = (rows * cols * std::mem::size_of::<u32>()).max(1);
        match MmapRegion::new(bytes) {
            Ok(pages) => Histogram { pages, rows, cols },
            // What a Vec does when memory runs out.
            Err(_) => std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(bytes, 4096).unwrap_or(std::alloc::Layout::new::<u32>()),
            ),
        }
    }

    #[inline]
    fn all(&self) -> &[u32] {
        // SAFETY: the mapping is readable, page-aligned, at least rows * cols u32s long
        // and this histogram's own for as long as `self` lives; `&self` excludes writers.
        unsafe { std::slice::from_raw_parts(self.pages.as_ptr() as *const u32, self.rows * self.cols) }
    }

    #[inline]
    fn all_mut(&mut self) -> &mut [u32] {
        // SAFETY: as in `all`, and `&mut self` makes this the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.pages.as_ptr() as *mut u32, self.rows * self.cols) }
    }

    #[inline]
    pub fn row(&self, row: usize) -> &[u32] {
        &self.all()[row * self.cols..(row + 1) * self.cols]
    }

    #[inline]
    pub fn row_mut(&mut self, row: usize) -> &mut [u32] {
        let cols = self.cols;
        &mut self.all_mut()[row * cols..(row + 1) * cols]
    }

    /// Adds `other`'s counters, writing only where `other` has some (a bucket nobody hit
    /// stays untouched here too).
    pub fn add(&mut self, other: &Histogram) {
        for (mine, &theirs) in self.all_mut().iter_mut().zip(other.all()) {
            if theirs != 0 {
                *mine += theirs;
            }
        }
    }

    /// Makes these counters equal to `other`'s, writing only the ones that differ.
    pub fn copy_from(&mut self, other: &Histogram) {
        for (mine, &theirs) in self.all_mut().iter_mut().zip(other.all()) {
            if *mine != theirs {
                *mine = theirs;
            }
        }
    }
}

impl Clone for Histogram {
    fn clone(&self) -> Histogram {
        // Into zeros: only the counters that are not zero are written (`copy_from` would
        // read every one of the new mapping's, mapping the zero page under each).
        let mut copy = Histogram::new(self.rows, self.cols);
        copy.add(self);
        copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of the mapping that are mapped (mincore): what the histogram wrote, and where
    /// it only read, the shared zero page (which no process is charged for).
    fn resident(h: &Histogram) -> usize {
        let len = h.pages.size();
        let mut vec = vec![0u8; len.div_ceil(4096)];
        // SAFETY: the mapping's own range; mincore writes one byte per page into `vec`.
        let rc = unsafe { libc::mincore(h.pages.as_ptr().cast(), len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn the_scale_is_exact_below_1024_cycles_then_within_two_percent() {
        assert_eq!((bucket(0), bucket(7), bucket(8), bucket(1023)), (0, 0, 1, 127));
        assert_eq!(midpoint(bucket(204)), 204.0);
        let mut last = 0;
        for cycles in (1024..1u64 << 25).step_by(997) {
            let b = bucket(cycles);
            assert!(b >= last && b < BUCKETS - 1, "{cycles} cycles: bucket {b} after {last}");
            last = b;
            let m = midpoint(b);
            assert!((m - cycles as f64).abs() <= m * 0.016, "{cycles} cycles in bucket {b} (midpoint {m})");
        }
        assert_eq!(bucket(1 << 25), BUCKETS - 1);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(midpoint(BUCKETS - 1), (1u64 << 25) as f64);
    }

    #[test]
    fn only_the_pages_written_are_resident() {
        let mut h = Histogram::new(9, 4097);
        assert_eq!(resident(&h), 0, "a new histogram holds no page");
        h.row_mut(3)[100] += 1;
        h.row_mut(3)[101] += 2;
        assert_eq!(resident(&h), 1);
        let copy = h.clone();
        assert_eq!(resident(&copy), 1, "a copy writes only the counters that are not zero");
        assert_eq!(copy.row(3)[101], 2);
        let mut sum = Histogram::new(9, 4097);
        sum.add(&h);
        sum.add(&copy);
        assert_eq!(resident(&sum), 1, "a sum writes only where a part has counts");
        assert_eq!((sum.row(3)[100], sum.row(3)[101], sum.row(0)[0]), (2, 4, 0));
    }
}
