/*
 * A guest at work, for the snapshot tests: counts at CPL3 as counter.c does (a tick every
 * 2^20 iterations), writes sector N of its disk at tick N (the blkreq.h pattern, stamped
 * N) and waits for it before it says "snapwork: tick N", and echoes every lab frame its
 * NIC receives, all by polling the rings. A snapshot taken anywhere in this, restored in
 * another VMM, goes on: the next tick follows, every sector of a tick said is on the
 * disk, and frames sent after the restore come back.
 * Params: 0 = ticks (default 400).
 * Results: 0 = ticks, 1 = frames echoed, 2 = writes that failed.
 */
#include "runtime.h"
#include "blkreq.h"
#include "netbuf.h"

/* One request at a time, above the network buffers: header, status, then the sector. */
#define REQ_HDR 0x3000000ULL
#define REQ_STATUS (REQ_HDR + 0x800)
#define REQ_DATA (REQ_HDR + 0x1000)
#define RX_POSTED 16

static struct vdev blk, net;
static struct slots txs;
static u64 echoed;

static void post_rx(u16 slot) {
	net.rx.desc[slot] = (struct vring_desc){RX_SLOT(slot), RX_SLOT_SIZE, VRING_DESC_F_WRITE, 0};
	if (vq_push(&net.rx, slot)) vq_kick(&net.rx);
}

/* Sends back every lab frame received so far (others are dropped), as TX slots allow. */
static void echo(void) {
	int head;
	u32 len;
	while ((head = vq_pop_used(&net.tx, 0)) >= 0) txs.free[txs.n++] = (u16)head;
	while (txs.n && (head = vq_pop_used(&net.rx, &len)) >= 0) {
		const u8 *src = (const u8 *)RX_SLOT(head);
		u32 total = len < RX_SLOT_SIZE ? len : RX_SLOT_SIZE;
		const u8 *type = src + VNET_HDR_LEN + 12;
		if (total >= VNET_HDR_LEN + 14 && type[0] == (u8)(LAB_ETHERTYPE >> 8) && type[1] == (u8)LAB_ETHERTYPE) {
			u16 slot = txs.free[--txs.n];
			u8 *dst = (u8 *)TX_SLOT(slot);
			for (u32 i = 0; i < total; i++) dst[i] = src[i];
			tx_send(&net.tx, slot, total);
			echoed++;
		}
		post_rx((u16)head);
	}
}

/* Writes sector `lba` stamped `lba` and waits for it, echoing meanwhile; 1 if it succeeded. */
static int write_sector(u64 lba) {
	struct vq *q = &blk.q[0];
	blk_fill((u8 *)REQ_DATA, lba, 1, lba);
	*(volatile struct blk_hdr *)REQ_HDR = (struct blk_hdr){BLK_T_OUT, 0, lba};
	*(volatile u8 *)REQ_STATUS = 0xff;
	q->desc[0] = (struct vring_desc){REQ_HDR, sizeof(struct blk_hdr), VRING_DESC_F_NEXT, 1};
	q->desc[1] = (struct vring_desc){REQ_DATA, 512, VRING_DESC_F_NEXT, 2};
	q->desc[2] = (struct vring_desc){REQ_STATUS, 1, VRING_DESC_F_WRITE, 0};
	if (vq_push(q, 0)) vq_kick(q);
	while (vq_pop_used(q, 0) < 0) echo();
	return *(volatile u8 *)REQ_STATUS == BLK_S_OK;
}

int main(void) {
	u64 ticks = param(0, 400), failed = 0;
	enter_user();
	int err = vdev_init(&blk, VIRTIO_ID_BLOCK, VIRTIO_F_EVENT_IDX, 1, VQ_SIZE);
	if (!err) err = 10 * vdev_init(&net, VIRTIO_ID_NET, VIRTIO_F_EVENT_IDX | VIRTIO_NET_F_MAC, 2, VQ_SIZE);
	if (err) {
		print("snapwork: virtio init failed (%d)\n", err);
		return 3;
	}
	/* Polled throughout: no interrupts. */
	vq_interrupt_after(&blk.q[0], 0xffff);
	vq_interrupt_after(&net.rx, 0xffff);
	vq_interrupt_after(&net.tx, 0xffff);
	slots_init(&txs, RX_POSTED);
	for (u16 i = 0; i < RX_POSTED; i++) post_rx(i);
	print("snapwork: disk of %lu sectors, echoing on %02x:%02x:%02x:%02x:%02x:%02x\n", blk_capacity(&blk), net.mac[0],
	      net.mac[1], net.mac[2], net.mac[3], net.mac[4], net.mac[5]);
	volatile u64 n = 0;
	for (u64 tick = 1; tick <= ticks; tick++) {
		for (u64 i = 0; i < (1u << 20); i++) n++;
		echo();
		if (!write_sector(tick)) failed++;
		print("snapwork: tick %lu\n", tick);
		set_result(0, tick);
		set_result(1, echoed);
		set_result(2, failed);
	}
	print("snapwork: done at tick %lu (%lu iterations), %lu frames echoed, %lu writes failed\n", ticks, n, echoed, failed);
	return failed ? 1 : 0;
}
