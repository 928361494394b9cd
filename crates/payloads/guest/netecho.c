/*
 * Echo guest: posts receive buffers, then sends every lab frame (the lab ethertype) it
 * receives back out, unchanged, until it has echoed N; anything else (the host's own
 * IPv6 chatter, say) is dropped. RX asks for an interrupt per frame; at the end
 * the LAPIC's IRR shows whether the RX MSI-X vector really arrived.
 * Params: 0 = frames to echo (default 16). Results: 0 = frames echoed.
 */
#include "runtime.h"
#include "netbuf.h"

static struct vdev net;
static struct slots txs;

static void post_rx(u16 slot) {
	net.rx.desc[slot].addr = RX_SLOT(slot);
	net.rx.desc[slot].len = RX_SLOT_SIZE;
	net.rx.desc[slot].flags = VRING_DESC_F_WRITE;
	if (vq_push(&net.rx, slot)) vq_kick(&net.rx);
}

int main(void) {
	u64 want = param(0, 16), echoed = 0;
	enter_user();
	int err = vnet_init(&net, VIRTIO_F_EVENT_IDX | VIRTIO_NET_F_MAC, VQ_SIZE);
	if (err) {
		print("netecho: virtio-net init failed at step %d\n", -err);
		return 3;
	}
	slots_init(&txs, VQ_SIZE);
	vq_interrupt_after(&net.tx, 0xffff);
	for (u16 i = 0; i < VQ_SIZE; i++) post_rx(i);
	vq_interrupt_after(&net.rx, 1);
	print("netecho: mac %02x:%02x:%02x:%02x:%02x:%02x, waiting for %lu frames of ethertype 0x88b5 to echo\n", net.mac[0], net.mac[1], net.mac[2],
	      net.mac[3], net.mac[4], net.mac[5], want);
	lab_op(LAB_OP_BEGIN, 0);
	while (echoed < want) {
		int head;
		while ((head = vq_pop_used(&net.tx, 0)) >= 0) txs.free[txs.n++] = (u16)head;
		u32 len;
		head = vq_pop_used(&net.rx, &len);
		if (head < 0 || !txs.n) {
			__asm__ volatile("pause");
			continue;
		}
		vq_interrupt_after(&net.rx, 1);
		u8 *src = (u8 *)RX_SLOT(head);
		int lab = len >= VNET_HDR_LEN + 14 && src[VNET_HDR_LEN + 12] == (u8)(LAB_ETHERTYPE >> 8) &&
			  src[VNET_HDR_LEN + 13] == (u8)LAB_ETHERTYPE;
		if (lab && len <= RX_SLOT_SIZE) {
			u16 slot = txs.free[--txs.n];
			u8 *dst = (u8 *)TX_SLOT(slot);
			for (u32 i = 0; i < VNET_HDR_LEN; i++) dst[i] = 0;
			for (u32 i = VNET_HDR_LEN; i < len; i++) dst[i] = src[i];
			tx_send(&net.tx, slot, len);
			echoed++;
		}
		post_rx((u16)head);
	}
	while (txs.n < VQ_SIZE) {
		int head = vq_pop_used(&net.tx, 0);
		if (head >= 0) txs.free[txs.n++] = (u16)head;
	}
	set_result(0, echoed);
	lab_op(LAB_OP_END, 0);
	print("netecho: echoed %lu frames; rx interrupt %s\n", echoed, lapic_irr(VIRTIO_IRQ_BASE + 1) ? "delivered" : "NOT delivered");
	return 0;
}
