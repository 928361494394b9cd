/*
 * Echo guest: posts receive buffers, then sends every lab frame (the lab ethertype) it
 * receives back out, unchanged, until it has echoed N; anything else (the host's own
 * IPv6 chatter, say) is dropped. RX asks for an interrupt per frame; at the end
 * the LAPIC's IRR shows whether the RX MSI-X vector really arrived.
 * With param 1 = 1 it negotiates MRG_RXBUF and posts 4 KiB receive buffers, so a large
 * frame arrives spread over several (num_buffers in its header says how many); they are
 * joined before the echo.
 * With param 1 = 2 it also negotiates GUEST_CSUM and GUEST_TSO4 and, instead of echoing,
 * checks segmentation-offloaded TCP frames to port 5001 as they arrive whole: the header
 * (NEEDS_CSUM, TCPV4, MSS 1448) and every payload byte (sequence number at 54, then the
 * lab pattern); frames counts those.
 * Params: 0 = frames to echo (default 16), 1 = 1 for mergeable receive buffers, 2 for
 * mergeable buffers and received GSO frames.
 * Results: 0 = frames echoed (or GSO frames checked), 1 = the most buffers one frame took.
 */
#include "runtime.h"
#include "netbuf.h"

#define VIRTIO_NET_F_MRG_RXBUF (1ULL << 15)
#define VIRTIO_NET_F_GUEST_CSUM (1ULL << 1)
#define VIRTIO_NET_F_GUEST_TSO4 (1ULL << 7)
#define MERGEABLE_BUFFER 4096

static struct vdev net;
static struct slots txs;
static u32 rx_len = RX_SLOT_SIZE;

static void post_rx(u16 slot) {
	net.rx.desc[slot].addr = RX_SLOT(slot);
	net.rx.desc[slot].len = rx_len;
	net.rx.desc[slot].flags = VRING_DESC_F_WRITE;
	if (vq_push(&net.rx, slot)) vq_kick(&net.rx);
}

int main(void) {
	u64 want = param(0, 16), echoed = 0, most = 0;
	int gso = param(1, 0) == 2, mergeable = param(1, 0) == 1 || gso;
	u64 extra = (mergeable ? VIRTIO_NET_F_MRG_RXBUF : 0) | (gso ? VIRTIO_NET_F_GUEST_CSUM | VIRTIO_NET_F_GUEST_TSO4 : 0);
	enter_user();
	int err = vnet_init(&net, VIRTIO_F_EVENT_IDX | VIRTIO_NET_F_MAC | extra, VQ_SIZE);
	if (!err && (net.features & extra) != extra) err = -99;
	if (mergeable) rx_len = MERGEABLE_BUFFER;
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
		u16 slot = txs.free[--txs.n];
		u8 *dst = (u8 *)TX_SLOT(slot);
		u32 total = len < rx_len ? len : rx_len;
		for (u32 i = 0; i < total; i++) dst[i] = src[i];
		post_rx((u16)head);
		/* num_buffers (header bytes 10-11): the buffers after the first are used next. */
		u32 buffers = mergeable ? (u32)(src[10] | src[11] << 8) : 1;
		if (buffers > most) most = buffers;
		for (u32 b = 1; b < buffers; b++) {
			while ((head = vq_pop_used(&net.rx, &len)) < 0) __asm__ volatile("pause");
			u8 *more = (u8 *)RX_SLOT(head);
			for (u32 i = 0; i < len && total + i < SLOT_SIZE; i++) dst[total + i] = more[i];
			total += len;
			post_rx((u16)head);
		}
		if (gso) {
			u8 *f = dst + VNET_HDR_LEN;
			int tcp = total >= VNET_HDR_LEN + 62 && f[12] == 0x08 && f[13] == 0 && f[23] == 6 && f[36] == 0x13 && f[37] == 0x89;
			if (!tcp) goto next;
			u32 bad = !(dst[0] & 1) || dst[1] != 1 || (dst[4] | dst[5] << 8) != 1448;
			for (u32 j = 62; j < total - VNET_HDR_LEN; j++) bad += f[j] != (u8)(j * 7 + 3);
			if (bad) print("netecho: a GSO frame of %u bytes differs in %u places\n", total - VNET_HDR_LEN, bad);
			else echoed++;
		next:
			txs.free[txs.n++] = slot;
			continue;
		}
		int lab = total >= VNET_HDR_LEN + 14 && total <= SLOT_SIZE && dst[VNET_HDR_LEN + 12] == (u8)(LAB_ETHERTYPE >> 8) &&
			  dst[VNET_HDR_LEN + 13] == (u8)LAB_ETHERTYPE;
		if (lab) {
			for (u32 i = 0; i < VNET_HDR_LEN; i++) dst[i] = 0;
			tx_send(&net.tx, slot, total);
			echoed++;
		} else {
			txs.free[txs.n++] = slot;
		}
	}
	while (txs.n < VQ_SIZE) {
		int head = vq_pop_used(&net.tx, 0);
		if (head >= 0) txs.free[txs.n++] = (u16)head;
	}
	set_result(0, echoed);
	set_result(1, most);
	lab_op(LAB_OP_END, 0);
	print("netecho: %s %lu frames (at most %lu buffers each); rx interrupt %s\n", gso ? "checked GSO" : "echoed", echoed, most,
	      lapic_irr(VIRTIO_IRQ_BASE + 1) ? "delivered" : "NOT delivered");
	return 0;
}
