/*
 * Entropy guest: reads virtio-rng. Posts `rounds` 64-byte device-writable buffers one at a
 * time and checks each comes back full and unlike every other (64 random bytes never
 * repeat, nor are they all zero); then one 128 KiB buffer, which the device may fill only
 * in part (at most 64 KiB, as Firecracker does) but not beyond; then a buffer the device
 * may only read, which it must return untouched with length 0.
 * Params: 0 = rounds (default 16, at most 64).
 * Results: 0 = requests answered, 1 = bytes received, 2 = checks failed.
 */
#include "runtime.h"
#include "virtio.h"

#define SMALL 64
#define BIG (128u << 10)
#define MAX_ROUNDS 64

static struct vdev rng;
static u8 small[MAX_ROUNDS][SMALL] __attribute__((aligned(64)));
static u8 big[BIG] __attribute__((aligned(4096)));

/* Posts one buffer, kicks, and waits for it to be used; returns the used length, or -1
 * if the device never answers. */
static long request(struct vq *q, void *buf, u32 len, int writable) {
	q->desc[0] = (struct vring_desc){(u64)buf, len, (u16)(writable ? VRING_DESC_F_WRITE : 0), 0};
	if (vq_push(q, 0)) vq_kick(q);
	u32 used_len = 0;
	for (u64 spins = 0; spins < 400000000ULL; spins++) {
		if (vq_pop_used(q, &used_len) >= 0) return used_len;
		__asm__ volatile("pause");
	}
	return -1;
}

static int all_zero(const u8 *p, u32 n) {
	for (u32 i = 0; i < n; i++)
		if (p[i]) return 0;
	return 1;
}

static int same(const u8 *a, const u8 *b, u32 n) {
	for (u32 i = 0; i < n; i++)
		if (a[i] != b[i]) return 0;
	return 1;
}

int main(void) {
	u64 rounds = param(0, 16);
	if (rounds > MAX_ROUNDS) rounds = MAX_ROUNDS;
	enter_user();
	int err = vdev_init(&rng, VIRTIO_ID_RNG, VIRTIO_F_EVENT_IDX, 1, VQ_SIZE);
	if (err) {
		print("rngread: virtio-rng init failed at step %d\n", -err);
		return 3;
	}
	struct vq *q = &rng.q[0];
	u64 answered = 0, bytes = 0, failed = 0;
	for (u64 r = 0; r < rounds; r++) {
		long got = request(q, small[r], SMALL, 1);
		if (got < 0) {
			print("rngread: no answer to request %lu\n", r);
			return 1;
		}
		answered++, bytes += (u64)got;
		if (got != SMALL || all_zero(small[r], SMALL)) failed++, print("rngread: request %lu got %ld bytes\n", r, got);
		for (u64 o = 0; o < r; o++)
			if (same(small[r], small[o], SMALL)) failed++, print("rngread: requests %lu and %lu alike\n", o, r);
	}
	/* The big buffer: at least one byte, at most 64 KiB, and nothing past what it said. */
	for (u32 i = 0; i < BIG; i++) big[i] = 0;
	long got = request(q, big, BIG, 1);
	answered++, bytes += got > 0 ? (u64)got : 0;
	if (got <= 0 || got > (64 << 10) || !all_zero(big + got, BIG - (u32)got))
		failed++, print("rngread: the 128 KiB request got %ld bytes\n", got);
	/* A buffer the device may only read: returned with nothing written. */
	u8 *ro = small[0];
	for (u32 i = 0; i < SMALL; i++) ro[i] = 0x5a;
	long refused = request(q, ro, SMALL, 0);
	int untouched = 1;
	for (u32 i = 0; i < SMALL; i++) untouched &= ro[i] == 0x5a;
	if (refused != 0 || !untouched) failed++, print("rngread: the read-only buffer got %ld bytes\n", refused);
	else answered++;
	set_result(0, answered);
	set_result(1, bytes);
	set_result(2, failed);
	print("rngread: %lu requests, %lu bytes, %lu failed\n", answered, bytes, failed);
	return failed ? 1 : 0;
}
