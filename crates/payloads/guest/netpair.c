/*
 * Two NICs at once: lab frames alternate between the first and the second virtio-net
 * device, each from its own MAC and its own TX slots (the first NIC's in slots 0-127, the
 * second's in 128-255), each with its own sequence numbers, the NIC's number in their top
 * byte. The host's sink on each tap must see only its own NIC's frames, every one once.
 * Params: 0 = frames per NIC (default 1000), 1 = frame size (default 1514).
 * Results: 0 and 1 = frames sent on each NIC.
 */
#include "runtime.h"
#include "netbuf.h"

#define PER_NIC 128

static struct vdev nic[2];
static struct slots txs[2];

static void send(u32 k, u16 slot, u32 len) {
	struct vq *tx = &nic[k].tx;
	tx->desc[slot] = (struct vring_desc){TX_SLOT(k * PER_NIC + slot), len, 0, 0};
	if (vq_push(tx, slot)) vq_kick(tx);
}

int main(void) {
	u64 frames = param(0, 1000), size = param(1, 1514), sent[2] = {0, 0};
	enter_user();
	if (size < 64 || size + VNET_HDR_LEN > SLOT_SIZE) {
		print("netpair: frame size %lu out of range\n", size);
		return 2;
	}
	for (u32 k = 0; k < 2; k++) {
		int err = vdev_init_nth(&nic[k], VIRTIO_ID_NET, k, VIRTIO_F_EVENT_IDX | VIRTIO_NET_F_MAC, 2, VQ_SIZE);
		if (err) {
			print("netpair: virtio-net %u init failed at step %d\n", k, -err);
			return 3;
		}
		for (u32 i = 0; i < PER_NIC; i++) frame_fill((u8 *)TX_SLOT(k * PER_NIC + i), (u32)size, nic[k].mac);
		slots_init(&txs[k], PER_NIC);
		vq_interrupt_after(&nic[k].tx, 0xffff);
	}
	print("netpair: %lu frames of %lu bytes on each of two NICs\n", frames, size);
	lab_op(LAB_OP_BEGIN, 0);
	while (sent[0] < frames || sent[1] < frames) {
		for (u32 k = 0; k < 2; k++) {
			int head;
			while ((head = vq_pop_used(&nic[k].tx, 0)) >= 0) txs[k].free[txs[k].n++] = (u16)head;
			if (sent[k] == frames || !txs[k].n) continue;
			u16 slot = txs[k].free[--txs[k].n];
			frame_seq((u8 *)TX_SLOT(k * PER_NIC + slot), (u64)k << 56 | sent[k]++);
			send(k, slot, (u32)(size + VNET_HDR_LEN));
		}
	}
	for (u32 k = 0; k < 2; k++)
		while (txs[k].n < PER_NIC) {
			int head = vq_pop_used(&nic[k].tx, 0);
			if (head >= 0) txs[k].free[txs[k].n++] = (u16)head;
		}
	set_result(0, sent[0]);
	set_result(1, sent[1]);
	lab_op(LAB_OP_END, 0);
	print("netpair: sent %lu and %lu frames\n", sent[0], sent[1]);
	return 0;
}
