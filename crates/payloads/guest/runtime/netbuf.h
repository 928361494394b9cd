/* Frame buffers and the lab's frame format, shared by the network payloads:
 * [12-byte virtio-net header][dst ff..ff][src mac][ethertype LAB_ETHERTYPE][seq u64]
 * then byte j of the frame (counted from the Ethernet header) is (j * 7 + 3) & 0xff. */
#pragma once
#include "virtio.h"

#define SLOT_SIZE 0x11000ULL
#define TX_SLOT(i) (NET_BUF_GPA + (u64)(i) * SLOT_SIZE)
#define RX_SLOT(i) (NET_BUF_GPA + VQ_SIZE * SLOT_SIZE + (u64)(i) * 0x4000)
#define RX_SLOT_SIZE 0x4000
#define SEQ_OFFSET (VNET_HDR_LEN + 14)

static inline void frame_fill(u8 *slot, u32 size, const u8 mac[6]) {
	for (u32 i = 0; i < VNET_HDR_LEN; i++) slot[i] = 0;
	u8 *f = slot + VNET_HDR_LEN;
	for (u32 i = 0; i < 6; i++) f[i] = 0xff, f[6 + i] = mac[i];
	f[12] = (u8)(LAB_ETHERTYPE >> 8);
	f[13] = (u8)LAB_ETHERTYPE;
	for (u32 j = 22; j < size; j++) f[j] = (u8)(j * 7 + 3);
}

static inline void frame_seq(u8 *slot, u64 seq) { *(volatile u64 *)(slot + SEQ_OFFSET) = seq; }

/* A small stack of free TX slots. */
struct slots { u16 free[VQ_SIZE]; u32 n; };
static inline void slots_init(struct slots *s, u32 count) {
	s->n = 0;
	for (u32 i = count; i-- > 0;) s->free[s->n++] = (u16)i;
}

/* Queues TX slot `slot` holding `len` bytes (header included); kicks if the device asks. */
static inline int tx_send(struct vq *tx, u16 slot, u32 len) {
	tx->desc[slot].addr = TX_SLOT(slot);
	tx->desc[slot].len = len;
	tx->desc[slot].flags = 0;
	if (vq_push(tx, slot)) {
		vq_kick(tx);
		return 1;
	}
	return 0;
}
