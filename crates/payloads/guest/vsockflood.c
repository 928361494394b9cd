/*
 * vsock flood: a hostile driver that posts no receive buffers and keeps its transmit ring
 * full of one 44-byte packet for a connection that does not exist (a CREDIT_UPDATE, or a
 * REQUEST to a host port nobody serves). The device answers each with an RST that has
 * nowhere to go: a device that keeps every answer grows the VMM's heap for as long as the
 * guest sends (issue 53); a bounded one drops them, and the VMM's memory stays flat.
 * Params: 0 = packets to send (0: forever), 1 = the host port they go to (default 9999),
 * 2 = their op (default 6, CREDIT_UPDATE; 1 = REQUEST), 3 = a host port that listens
 * (default none).
 * With a count and a listening port it then posts receive buffers, connects to that port
 * and counts the RSTs the device kept for it until the RESPONSE comes: the device still
 * answers after the flood, and what it kept is what it had room for.
 * Results: 0 = packets sent, 1 = RSTs waiting after the flood, 2 = 1 once answered.
 */
#include "runtime.h"
#include "virtio.h"

#define HDR 44
#define SLOTS 64
#define GUEST_PORT 5000
#define CLIENT_PORT 5001
/* A progress line every this many packets: the test sees the flood go on. */
#define PROGRESS (1u << 16)

enum { OP_REQUEST = 1, OP_RESPONSE, OP_RST, OP_SHUTDOWN, OP_RW, OP_CREDIT_UPDATE };

struct hdr {
	u64 src_cid, dst_cid;
	u32 src_port, dst_port, len;
	u16 type, op;
	u32 flags, buf_alloc, fwd_cnt;
} __attribute__((packed));

static struct vdev vs;
static struct hdr tx[SLOTS] __attribute__((aligned(64)));
static u8 rx[SLOTS][64] __attribute__((aligned(64)));
static u64 guest_cid;

static void post_rx(u16 i) {
	vs.rx.desc[i] = (struct vring_desc){(u64)rx[i], sizeof rx[i], VRING_DESC_F_WRITE, 0};
	if (vq_push(&vs.rx, i)) vq_kick(&vs.rx);
}

/* After the flood: a REQUEST to `port`, and every packet until its RESPONSE (or RST). */
static int connect_after(u32 port, u64 *waiting) {
	for (u16 i = 0; i < SLOTS && i < vs.rx.size; i++) post_rx(i);
	tx[0] = (struct hdr){guest_cid, 2, CLIENT_PORT, port, 0, 1, OP_REQUEST, 0, 4096, 0};
	vs.tx.desc[0] = (struct vring_desc){(u64)&tx[0], HDR, 0, 0};
	if (vq_push(&vs.tx, 0)) vq_kick(&vs.tx);
	for (u64 spin = 0; spin < 200000000ULL; spin++) {
		int head = vq_pop_used(&vs.rx, 0);
		if (head < 0) {
			__asm__ volatile("pause");
			continue;
		}
		struct hdr *h = (struct hdr *)rx[head];
		if (h->dst_port == CLIENT_PORT && h->src_port == port) return h->op == OP_RESPONSE;
		if (h->op == OP_RST) (*waiting)++;
		post_rx((u16)head);
		spin = 0;
	}
	return 0;
}

int main(void) {
	u64 count = param(0, 0), port = param(1, 9999), op = param(2, OP_CREDIT_UPDATE), listening = param(3, 0);
	enter_user();
	int err = vdev_init(&vs, VIRTIO_ID_VSOCK, VIRTIO_F_EVENT_IDX, 3, SLOTS);
	if (err) {
		print("vsockflood: virtio-vsock init failed at step %d\n", -err);
		return 3;
	}
	guest_cid = mmio_read(vs.device_cfg, 4) | (u64)mmio_read(vs.device_cfg + 4, 4) << 32;
	vq_interrupt_after(&vs.tx, 0xffff); /* polled: no interrupts */
	vq_interrupt_after(&vs.rx, 0xffff);
	u16 slots = SLOTS < vs.tx.size ? SLOTS : vs.tx.size;
	for (u16 i = 0; i < slots; i++) {
		tx[i] = (struct hdr){guest_cid, 2, GUEST_PORT, (u32)port, 0, 1, (u16)op, 0, 4096, 0};
		vs.tx.desc[i] = (struct vring_desc){(u64)&tx[i], HDR, 0, 0};
	}
	print("vsockflood: flooding host port %lu with op %lu, no receive buffers\n", port, op);
	/* Every buffer back on the ring as soon as the device returns it; a kick only when
	 * the device asks for one (EVENT_IDX). */
	u64 sent = 0, queued = 0;
	int kick = 0;
	for (u16 i = 0; i < slots && (!count || queued < count); i++) kick |= vq_push(&vs.tx, i), queued++;
	if (kick) vq_kick(&vs.tx);
	while (!count || sent < count) {
		int head;
		kick = 0;
		while ((head = vq_pop_used(&vs.tx, 0)) >= 0) {
			if (++sent % PROGRESS == 0) print("vsockflood: %lu sent\n", sent);
			if (!count || queued < count) kick |= vq_push(&vs.tx, (u16)head), queued++;
		}
		if (kick) vq_kick(&vs.tx);
		else __asm__ volatile("pause");
	}
	set_result(0, sent);
	if (!listening) return 0;
	u64 waiting = 0;
	int answered = connect_after((u32)listening, &waiting);
	set_result(1, waiting);
	set_result(2, (u64)answered);
	print("vsockflood: %lu sent, %lu resets were waiting, %s\n", sent, waiting,
	      answered ? "then the device answered" : "NO ANSWER");
	return answered ? 0 : 1;
}
