/*
 * Hostile virtio-net driver: features the device never offered, queue sizes out of range,
 * rings outside guest memory, and TX chains that point outside memory, loop, run too
 * long, point the wrong way, use broken indirect tables, or name a head that does not
 * exist. Each must be refused, dropped or answered with NEEDS_RESET; after a reset the
 * device must still send a good frame. Exits 0 when every check held.
 */
#include "runtime.h"
#include "netbuf.h"

static struct vdev net;
static int failures;

static void check(int ok, const char *what) {
	print("nethostile: %s: %s\n", what, ok ? "ok" : "FAILED");
	if (!ok) failures++;
}

/* Pushes chain `head` on TX, kicks, and waits for it to come back used (len 0). */
static int bounced(u16 head) {
	u16 before = net.tx.used->idx;
	vq_push(&net.tx, head);
	vq_kick(&net.tx);
	for (u64 spin = 0; spin < 200000000ULL; spin++) {
		if (net.tx.used->idx != before || (vdev_status(&net) & VS_NEEDS_RESET)) break;
		__asm__ volatile("pause");
	}
	u32 len = 1;
	int got = vq_pop_used(&net.tx, &len);
	return got == head && len == 0;
}

static void init_with(u64 extra) {
	int err = vnet_init(&net, VIRTIO_F_EVENT_IDX | VIRTIO_F_INDIRECT_DESC | VIRTIO_NET_F_MAC | extra, VQ_SIZE);
	if (err) print("nethostile: re-init failed at step %d\n", -err);
}

static void reset_and_init(void) { init_with(0); }

/* A 128-byte frame whose virtio-net header says what it must not; it must come back
 * used without reaching the tap (the device counts it). */
static int bad_header(u16 slot, u8 flags, u8 gso_type, u16 gso_size, u16 csum_start, u16 csum_offset) {
	u8 *b = (u8 *)TX_SLOT(slot);
	frame_fill(b, 128, net.mac);
	b[0] = flags, b[1] = gso_type, b[2] = 54, b[3] = 0;
	b[4] = (u8)gso_size, b[5] = (u8)(gso_size >> 8), b[6] = (u8)csum_start, b[7] = (u8)(csum_start >> 8);
	b[8] = (u8)csum_offset, b[9] = (u8)(csum_offset >> 8);
	net.tx.desc[slot] = (struct vring_desc){TX_SLOT(slot), 128 + VNET_HDR_LEN, 0, 0};
	return bounced(slot);
}

static int good_frame(u16 slot) {
	frame_fill((u8 *)TX_SLOT(slot), 64, net.mac);
	net.tx.desc[slot] = (struct vring_desc){TX_SLOT(slot), 64 + VNET_HDR_LEN, 0, 0};
	return bounced(slot);
}

int main(void) {
	u64 seed = param(0, 0x5eed) | 1;
	enter_user();
	if (vdev_find(&net, VIRTIO_ID_NET)) {
		print("nethostile: no virtio-net device\n");
		return 2;
	}
	u64 c = net.common;

	/* Features never offered are masked off; after FEATURES_OK nothing changes them; and
	 * a driver without VERSION_1 does not get FEATURES_OK. */
	vdev_set_status(&net, 0);
	vdev_set_status(&net, VS_ACK | VS_DRIVER);
	u32 offered[2], accepted[2];
	for (u32 sel = 0; sel < 2; sel++) {
		mmio_write(c + VC_DFSELECT, 4, sel);
		offered[sel] = (u32)mmio_read(c + VC_DF, 4);
		mmio_write(c + VC_GFSELECT, 4, sel);
		mmio_write(c + VC_GF, 4, 0xffffffff);
		accepted[sel] = (u32)mmio_read(c + VC_GF, 4);
	}
	check(accepted[0] == offered[0] && accepted[1] == offered[1], "features never offered are masked off");
	vdev_set_status(&net, VS_ACK | VS_DRIVER | VS_FEATURES_OK);
	mmio_write(c + VC_GFSELECT, 4, 1);
	mmio_write(c + VC_GF, 4, 0);
	check((vdev_status(&net) & VS_FEATURES_OK) && (mmio_read(c + VC_GF, 4) & 1),
	      "features are frozen at FEATURES_OK");
	vdev_set_status(&net, 0);
	vdev_set_status(&net, VS_ACK | VS_DRIVER);
	vdev_set_status(&net, VS_ACK | VS_DRIVER | VS_FEATURES_OK);
	check(!(vdev_status(&net) & VS_FEATURES_OK), "a driver without VERSION_1 gets no FEATURES_OK");

	/* Queue sizes out of range. */
	mmio_write(c + VC_Q_SELECT, 2, 1);
	u32 sizes[] = {1000, 3, 0, 512, 0xffff};
	for (u32 i = 0; i < 5; i++) mmio_write(c + VC_Q_SIZE, 2, sizes[i]);
	u32 size = (u32)mmio_read(c + VC_Q_SIZE, 2);
	check(size && size <= VQ_SIZE && !(size & (size - 1)), "queue sizes out of range are ignored");
	mmio_write(c + VC_Q_SELECT, 2, 77);
	mmio_write(c + VC_Q_SIZE, 2, 8); /* a queue that does not exist */

	/* Rings outside guest memory: the device must ask for a reset, not run. */
	vdev_set_status(&net, 0);
	vdev_set_status(&net, VS_ACK | VS_DRIVER);
	mmio_write(c + VC_GFSELECT, 4, 1);
	mmio_write(c + VC_GF, 4, 1); /* VERSION_1 */
	vdev_set_status(&net, VS_ACK | VS_DRIVER | VS_FEATURES_OK);
	mmio_write(c + VC_Q_SELECT, 2, 1);
	mmio_write(c + VC_Q_DESC, 8, 0xfff000000000ULL);
	mmio_write(c + VC_Q_DRIVER, 8, 0xfff000010000ULL);
	mmio_write(c + VC_Q_DEVICE, 8, 0xfff000020000ULL);
	mmio_write(c + VC_Q_ENABLE, 2, 1);
	vdev_set_status(&net, VS_ACK | VS_DRIVER | VS_FEATURES_OK | VS_DRIVER_OK);
	check(vdev_status(&net) & VS_NEEDS_RESET, "rings outside guest memory set NEEDS_RESET");

	/* Bad chains on a properly set up device: each comes back used, unsent. */
	reset_and_init();
	struct vring_desc *d = net.tx.desc;
	d[0] = (struct vring_desc){0xffff00000000ULL, 100, 0, 0};
	check(bounced(0), "a buffer outside guest memory is dropped");
	d[1] = (struct vring_desc){TX_SLOT(1), 100, VRING_DESC_F_NEXT, 2};
	d[2] = (struct vring_desc){TX_SLOT(2), 100, VRING_DESC_F_NEXT, 1};
	check(bounced(1), "a descriptor loop is dropped");
	d[3] = (struct vring_desc){TX_SLOT(3), 1 << 20, 0, 0};
	check(bounced(3), "an oversized chain is dropped");
	d[4] = (struct vring_desc){TX_SLOT(4), 100, VRING_DESC_F_WRITE, 0};
	check(bounced(4), "a device-writable buffer in a TX chain is dropped");
	u64 *table = (u64 *)TX_SLOT(10);
	for (u32 i = 0; i < 32; i++) table[i] = rand64(&seed);
	d[5] = (struct vring_desc){TX_SLOT(10), 16 * 16, VRING_DESC_F_INDIRECT, 0};
	check(bounced(5), "an indirect table of garbage is dropped");
	d[6] = (struct vring_desc){0xffffffff0000ULL, 64, VRING_DESC_F_INDIRECT, 0};
	check(bounced(6), "an indirect table outside memory is dropped");
	for (u16 i = 20; i < 276 - 1; i++) d[i % VQ_SIZE] = (struct vring_desc){TX_SLOT(7), 64, VRING_DESC_F_NEXT, (u16)((i + 1) % VQ_SIZE)};
	check(bounced(20), "a chain longer than the queue is dropped");
	check(good_frame(7), "a good frame still goes out");

	/* Headers the tap must never see (six, counted as bad headers): offloads that were not
	 * negotiated, then, with CSUM and HOST_TSO4, sizes and offsets that do not fit. */
	check(bad_header(8, 1, 0, 0, 34, 16), "a partial checksum without CSUM is dropped");
	check(bad_header(9, 1, 1, 1448, 34, 16), "TSO4 without HOST_TSO4 is dropped");
	init_with((1ULL << 0) | (1ULL << 11));
	check(bad_header(10, 1, 1, 0, 34, 16), "a gso_size of 0 is dropped");
	check(bad_header(11, 1, 1, 4000, 34, 16), "a gso_size over the frame is dropped");
	check(bad_header(12, 1, 0, 0, 120, 16), "a checksum field beyond the frame is dropped");
	check(bad_header(13, 1, 9, 64, 34, 16), "an unknown gso_type is dropped");
	net.tx.desc[14] = (struct vring_desc){TX_SLOT(14), 8, 0, 0};
	check(bounced(14), "a chain shorter than its header is dropped");
	check(good_frame(15), "a good frame still goes out after them");

	/* Garbage into MSI-X table, PBA, notify and device config; queue registers after DRIVER_OK. */
	for (u32 i = 0; i < 512; i++) {
		u64 off = 0x1000 + rand64(&seed) % 0x6000;
		mmio_write(net.bar0 + (off & ~3ULL), 4, (u32)rand64(&seed));
	}
	mmio_write(c + VC_Q_SELECT, 2, 1);
	mmio_write(c + VC_Q_DESC, 8, 0xdead0000ULL);
	mmio_write(c + VC_Q_SIZE, 2, 2);

	/* A head index past the queue: the device cannot return it and must ask for a reset. */
	vq_push(&net.tx, 999);
	vq_kick(&net.tx);
	u64 spin = 0;
	while (!(vdev_status(&net) & VS_NEEDS_RESET) && spin++ < 200000000ULL) __asm__ volatile("pause");
	check(vdev_status(&net) & VS_NEEDS_RESET, "a head index past the queue sets NEEDS_RESET");

	/* An avail index run far past the queue: NEEDS_RESET, not a device thread spinning. */
	reset_and_init();
	net.tx.avail->idx = (u16)(net.tx.avail_idx + 1000);
	vq_kick(&net.tx);
	spin = 0;
	while (!(vdev_status(&net) & VS_NEEDS_RESET) && spin++ < 200000000ULL) __asm__ volatile("pause");
	check(vdev_status(&net) & VS_NEEDS_RESET, "an avail index past the queue sets NEEDS_RESET");

	reset_and_init();
	check(good_frame(0), "after a reset the device sends again");
	print("nethostile: %s\n", failures ? "SOME CHECKS FAILED" : "all checks passed");
	return failures ? 1 : 0;
}
