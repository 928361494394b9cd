//! The exit-time histogram's counters, in an anonymous mapping of their own rather than
//! on the heap: a page of buckets nobody hit is never touched, so it costs no memory,
//! and reading it maps the kernel's shared zero page. A vCPU's exits of one kind take a
//! few neighbouring buckets, so a vCPU holds a few pages of its 147 KiB; zeroed on the
//! heap (calloc) the whole of it was resident from the start, twice per vCPU (its own and
//! the API's published copy): about 290 KiB in every restored sandbox of a fleet.

use vm_memory::mmap::MmapRegion;

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
