/* virtio-blk requests for payloads, and the pattern every sector carries.
 * Request slot i: header at BLK_HDR(i), status byte at BLK_STATUS(i), up to 64 KiB of
 * data at BLK_DATA(i); its chain is descriptors 3i, 3i+1, 3i+2.
 * Sector pattern (so any read can be checked without knowing what was written last):
 * u64 word 0 = the sector's LBA, word 1 = a stamp, word k >= 2 = blk_word(lba, stamp, k).
 * The lab's host path (crates/lab/src/blk.rs) computes the same words. */
#pragma once
#include "virtio.h"

#define BLK_T_IN 0
#define BLK_T_OUT 1
#define BLK_T_FLUSH 4
#define BLK_T_GET_ID 8
#define BLK_T_DISCARD 11
#define BLK_T_WRITE_ZEROES 13
#define BLK_S_OK 0
#define BLK_S_IOERR 1
#define BLK_S_UNSUPP 2
#define VIRTIO_BLK_F_RO (1ULL << 5)
#define VIRTIO_BLK_F_FLUSH (1ULL << 9)
#define VIRTIO_BLK_F_DISCARD (1ULL << 13)
#define VIRTIO_BLK_F_WRITE_ZEROES (1ULL << 14)

#define BLK_SLOT_SIZE 0x11000ULL
#define BLK_MAX_DATA 0x10000U
#define BLK_MAX_SLOTS (VQ_SIZE / 3)
#define BLK_HDR(i) (BLK_BUF_GPA + (u64)(i) * BLK_SLOT_SIZE)
#define BLK_STATUS(i) (BLK_HDR(i) + 0x800)
#define BLK_DATA(i) (BLK_HDR(i) + 0x1000)

struct blk_hdr { u32 type, reserved; u64 sector; };

/* The disk's capacity in 512-byte sectors (device config). */
static inline u64 blk_capacity(struct vdev *d) {
	return mmio_read(d->device_cfg, 4) | mmio_read(d->device_cfg + 4, 4) << 32;
}

/* Queues request slot `i`: `type` at `sector` over `len` bytes of its data buffer (no data
 * descriptor when len is 0); returns 1 when the device asked for a kick. */
static inline int blk_queue(struct vq *q, u16 i, u32 type, u64 sector, u32 len) {
	volatile struct blk_hdr *h = (volatile struct blk_hdr *)BLK_HDR(i);
	h->type = type;
	h->reserved = 0;
	h->sector = sector;
	*(volatile u8 *)BLK_STATUS(i) = 0xff;
	u16 d = (u16)(3 * i), s = (u16)(d + (len ? 2 : 1));
	int in = type == BLK_T_IN || type == BLK_T_GET_ID;
	q->desc[d] = (struct vring_desc){BLK_HDR(i), sizeof(struct blk_hdr), VRING_DESC_F_NEXT, (u16)(d + 1)};
	if (len)
		q->desc[d + 1] = (struct vring_desc){BLK_DATA(i), len, (u16)(VRING_DESC_F_NEXT | (in ? VRING_DESC_F_WRITE : 0)), s};
	q->desc[s] = (struct vring_desc){BLK_STATUS(i), 1, VRING_DESC_F_WRITE, 0};
	return vq_push(q, d);
}

static inline u8 blk_status(u16 i) { return *(volatile u8 *)BLK_STATUS(i); }

static inline u64 blk_word(u64 lba, u64 stamp, u32 k) {
	u64 x = lba * 0x9e3779b97f4a7c15ULL ^ stamp * 0xff51afd7ed558ccdULL ^ k;
	return x ^ (x >> 29);
}

static inline void blk_fill(u8 *buf, u64 lba, u32 sectors, u64 stamp) {
	for (u32 s = 0; s < sectors; s++) {
		u64 *w = (u64 *)(buf + 512 * s);
		w[0] = lba + s;
		w[1] = stamp;
		for (u32 k = 2; k < 64; k++) w[k] = blk_word(lba + s, stamp, k);
	}
}

/* How many of the sectors do not carry their own pattern. */
static inline u32 blk_verify(const u8 *buf, u64 lba, u32 sectors) {
	u32 bad = 0;
	for (u32 s = 0; s < sectors; s++) {
		const u64 *w = (const u64 *)(buf + 512 * s);
		int ok = w[0] == lba + s;
		for (u32 k = 2; ok && k < 64; k++) ok = w[k] == blk_word(lba + s, w[1], k);
		bad += !ok;
	}
	return bad;
}

/* Waits for a request completion: polls the used ring for up to `spin` TSC cycles (at
 * CPL3 that costs the host a busy vCPU, not exits), then asks for an interrupt after
 * `batch` more completions and sleeps until it comes. Returns the next used slot index
 * (head / 3), counting sleeps in *idles. */
static inline int blk_wait(struct vq *q, u16 batch, u64 spin, u64 *idles) {
	u64 until = rdtsc() + spin;
	for (;;) {
		int head = vq_pop_used(q, 0);
		if (head >= 0) return head / 3;
		if (rdtsc() < until) {
			__asm__ volatile("pause");
			continue;
		}
		u16 seen = q->used->idx;
		vq_interrupt_after(q, batch ? batch : 1);
		mb();
		/* Sleep only if nothing was used meanwhile: otherwise the event may be past. */
		if (q->used->idx == seen) idle_wait(2000), (*idles)++;
		vq_interrupt_after(q, 0xffff); /* polling again: no interrupts */
	}
}
