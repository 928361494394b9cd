/*
 * Hostile virtio-blk driver: requests whose buffers lie outside guest memory, point the
 * wrong way, loop, run past the disk or past 2^64 bytes, carry a status byte the device
 * may not write, a header it may not read, an unknown type, a broken indirect table, and
 * an avail index far ahead. Each must come back failed (IOERR/UNSUPP, or used with
 * length 0 where there is no status byte to write) or raise NEEDS_RESET, and a good read
 * must work after each (after a reset for the last). Exits 0 when every check held;
 * result 0 = bad requests sent.
 */
#include "runtime.h"
#include "blkreq.h"

static struct vdev blk;
static struct vq *q;
static int failures;
static u64 bad_sent;

static void check(int ok, const char *what) {
	print("blkhostile: %s: %s\n", what, ok ? "ok" : "FAILED");
	if (!ok) failures++;
}

static int init(void) {
	u64 wanted = VIRTIO_F_EVENT_IDX | VIRTIO_F_INDIRECT_DESC | VIRTIO_BLK_F_RO | VIRTIO_BLK_F_FLUSH | VIRTIO_BLK_F_DISCARD |
	             VIRTIO_BLK_F_WRITE_ZEROES;
	int err = vdev_init(&blk, VIRTIO_ID_BLOCK, wanted, 1, VQ_SIZE);
	if (err) print("blkhostile: init failed at step %d\n", -err);
	q = &blk.q[0];
	return err;
}

/* Pushes chain `head`, kicks, waits for it to come back; returns its used length, or -1
 * when it did not come back (or the device asked for a reset). */
static i64 submit(u16 head) {
	u16 before = q->used->idx;
	vq_push(q, head);
	vq_kick(q);
	for (u64 spin = 0; spin < 200000000ULL; spin++) {
		if (q->used->idx != before || (vdev_status(&blk) & VS_NEEDS_RESET)) break;
		__asm__ volatile("pause");
	}
	u32 len = 0;
	int got = vq_pop_used(q, &len);
	return got == head ? (i64)len : -1;
}

/* A well-formed read of sector 0 still works. */
static int good_read(void) {
	blk_queue(q, 0, BLK_T_IN, 0, 512);
	vq_kick(q);
	for (u64 spin = 0; spin < 200000000ULL && q->used->idx == q->last_used; spin++) __asm__ volatile("pause");
	u32 len = 0;
	return vq_pop_used(q, &len) == 0 && len == 513 && blk_status(0) == BLK_S_OK;
}

/* Sends request slot 0 as the descriptors now stand, and checks how it came back. */
static void expect(const char *what, u8 status) {
	bad_sent++;
	i64 len = submit(0);
	int ok = status == 0xff ? len == 0 && blk_status(0) == 0xff : len >= 1 && blk_status(0) == status;
	check(ok, what);
	check(good_read(), "a good read after it");
}

/* Slot 0's three descriptors as blk_queue lays them out, without publishing them. */
static void lay(u32 type, u64 sector, u32 len) {
	volatile struct blk_hdr *h = (volatile struct blk_hdr *)BLK_HDR(0);
	h->type = type, h->reserved = 0, h->sector = sector;
	*(volatile u8 *)BLK_STATUS(0) = 0xff;
	u16 in = type == BLK_T_IN ? VRING_DESC_F_WRITE : 0;
	q->desc[0] = (struct vring_desc){BLK_HDR(0), 16, VRING_DESC_F_NEXT, 1};
	q->desc[1] = (struct vring_desc){BLK_DATA(0), len, (u16)(VRING_DESC_F_NEXT | in), 2};
	q->desc[2] = (struct vring_desc){BLK_STATUS(0), 1, VRING_DESC_F_WRITE, 0};
}

/* Sends slot 0 as blk_queue laid it out and waits for it; returns its status. */
static u8 roundtrip(void) {
	vq_kick(q);
	for (u64 spin = 0; spin < 200000000ULL && q->used->idx == q->last_used; spin++) __asm__ volatile("pause");
	vq_pop_used(q, 0);
	return blk_status(0);
}

static int good_id(void) {
	volatile char *id = (volatile char *)BLK_DATA(0);
	for (u32 i = 0; i < 21; i++) id[i] = 0;
	blk_queue(q, 0, BLK_T_GET_ID, 0, 20);
	if (roundtrip() != BLK_S_OK) return 0;
	print("blkhostile: id [%s]\n", (const char *)BLK_DATA(0));
	return id[0] != 0;
}

/* Writes sector `lba`, sends `type` (WRITE_ZEROES or DISCARD) over it, and reads it back:
 * it must read as zeroes. */
static int zeroes(u32 type, u64 lba) {
	blk_fill((u8 *)BLK_DATA(0), lba, 1, 77);
	blk_queue(q, 0, BLK_T_OUT, lba, 512);
	if (roundtrip() != BLK_S_OK) return 0;
	volatile u64 *range = (volatile u64 *)BLK_DATA(0);
	range[0] = lba;
	range[1] = 1; /* one sector, flags 0 */
	blk_queue(q, 0, type, 0, 16);
	if (roundtrip() != BLK_S_OK) return 0;
	blk_queue(q, 0, BLK_T_IN, lba, 512);
	if (roundtrip() != BLK_S_OK) return 0;
	for (u32 i = 0; i < 64; i++)
		if (((volatile u64 *)BLK_DATA(0))[i]) return 0;
	return 1;
}

static struct vring_desc indirect[4] __attribute__((aligned(16)));

int main(void) {
	enter_user();
	if (init()) return 3;
	u64 cap = blk_capacity(&blk), end = guest_mem_end();
	check(good_read(), "a good read first");

	lay(BLK_T_IN, 0, 512);
	q->desc[1].addr = end + 0x100000;
	expect("data outside guest memory: used, length 0", 0xff);

	lay(BLK_T_IN, 0, 512);
	q->desc[1].len = 0xfffff000;
	expect("a 4 GiB data buffer: used, length 0", 0xff);

	lay(BLK_T_IN, 0, 512);
	q->desc[1].flags = VRING_DESC_F_NEXT; /* a read whose buffer the device may not write */
	expect("a read into a read-only buffer: IOERR", BLK_S_IOERR);

	lay(BLK_T_OUT, 0, 512);
	q->desc[1].flags |= VRING_DESC_F_WRITE; /* a write from a device-writable buffer */
	expect("a write from a writable buffer: IOERR", BLK_S_IOERR);

	lay(BLK_T_IN, 0, 512);
	q->desc[2].flags = 0; /* the status byte is read-only */
	expect("a read-only status byte: used, length 0, untouched", 0xff);

	lay(BLK_T_IN, 0, 512);
	q->desc[0].flags |= VRING_DESC_F_WRITE; /* a header the device may not read */
	expect("a write-only header: IOERR", BLK_S_IOERR);

	lay(BLK_T_IN, cap, 512);
	expect("a read at the end of the disk: IOERR", BLK_S_IOERR);

	lay(BLK_T_IN, cap - 1, 1024);
	expect("a read running past the end: IOERR", BLK_S_IOERR);

	lay(BLK_T_IN, 1ULL << 63, 512);
	expect("a sector past 2^64 bytes: IOERR", BLK_S_IOERR);

	lay(BLK_T_IN, 0, 100);
	expect("a read of 100 bytes (not whole sectors): IOERR", BLK_S_IOERR);

	lay(99, 0, 512);
	expect("an unknown request type: UNSUPP", BLK_S_UNSUPP);

	lay(BLK_T_IN, 0, 512);
	q->desc[1].next = 0; /* 0 -> 1 -> 0 -> ... */
	expect("a looping chain: used, length 0", 0xff);

	lay(BLK_T_IN, 0, 512);
	indirect[0] = (struct vring_desc){BLK_HDR(0), 16, VRING_DESC_F_NEXT, 1};
	indirect[1] = (struct vring_desc){BLK_DATA(0), 512, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 0};
	q->desc[0] = (struct vring_desc){(u64)indirect, sizeof indirect, VRING_DESC_F_INDIRECT, 0};
	expect("a looping indirect table: used, length 0", 0xff);

	lay(BLK_T_IN, 0, 512);
	q->desc[0] = (struct vring_desc){end + 0x1000, 64, VRING_DESC_F_INDIRECT, 0};
	expect("an indirect table outside memory: used, length 0", 0xff);

	if (blk.features & VIRTIO_BLK_F_RO) {
		lay(BLK_T_OUT, 0, 512);
		expect("a write to a read-only drive: IOERR", BLK_S_IOERR);
	}

	/* The well-behaved requests beside the reads: GET_ID, and where offered WRITE_ZEROES
	 * and DISCARD (a sector written, zeroed, and read back as zeroes). */
	check(good_id(), "GET_ID answers the drive's id");
	if (blk.features & VIRTIO_BLK_F_WRITE_ZEROES) check(zeroes(BLK_T_WRITE_ZEROES, 8), "WRITE_ZEROES zeroes a sector");
	if (blk.features & VIRTIO_BLK_F_DISCARD) check(zeroes(BLK_T_DISCARD, 16), "DISCARD of a sector");

	/* An avail index a whole ring ahead: the device must give up on the queue. */
	bad_sent++;
	q->avail->idx = (u16)(q->avail_idx + 1000);
	vq_kick(q);
	for (u64 spin = 0; spin < 200000000ULL && !(vdev_status(&blk) & VS_NEEDS_RESET); spin++) __asm__ volatile("pause");
	check(vdev_status(&blk) & VS_NEEDS_RESET, "an avail index 1000 ahead: NEEDS_RESET");
	check(init() == 0 && good_read(), "after a reset, a good read works");

	set_result(0, bad_sent);
	print("blkhostile: %lu bad requests sent, %d checks failed\n", bad_sent, failures);
	return failures ? 1 : 0;
}
