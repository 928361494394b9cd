/*
 * Block lab guest: one workload on virtio-blk at one queue depth, every block verified.
 * Writes fill each sector with its pattern (blkreq.h) under a stamp; reads check that
 * every sector carries its own pattern, whatever stamp wrote it (the lab fills the file
 * first). Keeps `qd` requests in flight, polling the used ring and sleeping (asking for an
 * interrupt after a quarter of what is in flight) only when nothing has completed for
 * the poll time (param 9).
 * Params: 0 = workload (0 randread, 1 randwrite, 2 seqread, 3 seqwrite), 1 = block bytes
 * (default 4096), 2 = queue depth (default 1), 3 = requests (default 1000; 0: no limit),
 * 4 = time limit in ms (0: none), 5 = TSC kHz, 6 = stamp for writes (default 1), 7 = seed,
 * 8 = FLUSH afterwards (1), or FLUSH and then wait forever for the VMM to be killed (2),
 * 9 = microseconds to poll the used ring before sleeping (default 0: sleep at once; the
 * FLUSH and the wait after it poll too where this is not 0).
 * Results: 0 = requests completed, 1 = cycles, 2 = sectors that failed verification,
 * 3 = kicks, 4 = idle waits, 5 = requests that failed, 6 = bytes moved, 7 = FLUSH status.
 */
#include "runtime.h"
#include "blkreq.h"

static struct vdev blk;
static const char *names[] = {"randread", "randwrite", "seqread", "seqwrite"};

int main(void) {
	u64 workload = param(0, 0), bs = param(1, 4096), qd = param(2, 1), limit = param(3, 1000);
	u64 limit_ms = param(4, 0), tsc_khz = param(5, 2000000), stamp = param(6, 1), seed = param(7, 42) | 1;
	u64 flush = param(8, 0), spin = param(9, 0) * tsc_khz / 1000;
	enter_user();
	if (workload > 3 || bs < 512 || bs > BLK_MAX_DATA || bs % 512 || qd < 1 || qd > BLK_MAX_SLOTS) {
		print("blkbench: bad parameters (workload %lu, block %lu, qd %lu)\n", workload, bs, qd);
		return 2;
	}
	int err = vdev_init(&blk, VIRTIO_ID_BLOCK, VIRTIO_F_EVENT_IDX | VIRTIO_BLK_F_RO | VIRTIO_BLK_F_FLUSH, 1, VQ_SIZE);
	if (err) {
		print("blkbench: virtio-blk init failed at step %d\n", -err);
		return 3;
	}
	struct vq *q = &blk.q[0];
	u64 sectors = blk_capacity(&blk), per = bs / 512, blocks = sectors / per;
	int write = workload == 1 || workload == 3, random = workload <= 1;
	if (!blocks) {
		print("blkbench: the disk (%lu sectors) is smaller than one block\n", sectors);
		return 2;
	}
	u64 lba[BLK_MAX_SLOTS], cursor = 0, issued = 0, done = 0, bad = 0, failed = 0, kicks = 0, idles = 0;
	u32 type = write ? BLK_T_OUT : BLK_T_IN;
	vq_interrupt_after(q, 0xffff); /* no interrupts until we wait */

	lab_op(LAB_OP_BEGIN, 0);
	u64 t0 = rdtsc(), deadline = limit_ms ? t0 + limit_ms * tsc_khz : ~0ULL;
	/* Starts request `i` on the next block; returns whether it kicked. */
#define ISSUE(i)                                                                     \
	do {                                                                         \
		u64 b = random ? rand64(&seed) % blocks : cursor++ % blocks;         \
		lba[i] = b * per;                                                    \
		if (write) blk_fill((u8 *)BLK_DATA(i), lba[i], (u32)per, stamp);     \
		if (blk_queue(q, (u16)(i), type, lba[i], (u32)bs)) vq_kick(q), kicks++; \
		issued++;                                                            \
	} while (0)
	for (u64 i = 0; i < qd && (!limit || issued < limit); i++) ISSUE(i);
	while (done < issued) {
		u64 inflight = issued - done;
		int i = blk_wait(q, (u16)(inflight / 4 + 1), spin, &idles);
		done++;
		if (blk_status((u16)i) != BLK_S_OK) failed++;
		else if (!write) bad += blk_verify((const u8 *)BLK_DATA(i), lba[i], (u32)per);
		if ((!limit || issued < limit) && rdtsc() < deadline) ISSUE(i);
	}
	u64 cycles = rdtsc() - t0;
	set_result(0, done);
	set_result(1, cycles);
	set_result(2, bad);
	set_result(3, kicks);
	set_result(4, idles);
	set_result(5, failed);
	set_result(6, done * bs);
	lab_op(LAB_OP_END, 0);
	print("blkbench: %s %lu bytes qd %lu: %lu requests in %lu cycles, %lu kicks, %lu idle waits, %lu failed, %lu bad sectors\n",
	      names[workload], bs, qd, done, cycles, kicks, idles, failed, bad);
	if (flush) {
		if (blk_queue(q, 0, BLK_T_FLUSH, 0, 0)) vq_kick(q);
		blk_wait(q, 1, spin, &idles);
		set_result(7, blk_status(0));
		print("blkbench: flushed, status %u\n", blk_status(0));
		if (blk_status(0) != BLK_S_OK) failed++;
		/* Polling, it stays up without exits (a VMM's count of them then stops with the
		 * run, however long the host takes to read it); sleeping, in the idle port. */
		while (flush == 2)
			if (spin) __asm__ volatile("pause");
			else idle_wait(10000);
	}
	return failed || bad ? 1 : 0;
}
