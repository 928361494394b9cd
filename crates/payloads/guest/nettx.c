/*
 * Net TX lab guest: sends frames of one size carrying sequence numbers through virtio-net
 * as fast as the device takes them, reclaiming used buffers by polling and kicking only
 * when EVENT_IDX says the device is waiting. When the ring is full it asks for an
 * interrupt after 3/4 of what is in flight (as Linux's TX path does) and sleeps until it
 * comes, leaving the CPU to the host.
 * Params: 0 = frame size (default 1514), 1 = frames (default 1000), 2 = time limit in
 * ms (0: none), 3 = TSC kHz (for the time limit), 4 = 1 to poll a full ring instead of
 * sleeping (under a VMM without exitless's idle port), 5 = 1 to stay up after the result
 * line until the VMM is stopped (so that its CPU time can be read).
 * 6 = what the frames are: 0 the lab's ethertype (default); 1 IPv4/TCP with offloads
 * (CSUM and HOST_TSO4 negotiated, the TCP checksum left partial, frames over 1514 bytes
 * segmentation-offloaded with an MSS of 1448); 2 IPv4/TCP without offloads (the guest
 * computes each frame's TCP checksum, as a guest without CSUM does).
 * TCP frames carry the sequence number at the start of their TCP payload (byte 54); they
 * go to 10.0.0.1 and broadcast, or with param 7 = a MAC (48 bits, first byte highest)
 * and param 8 = an IPv4 address (first byte highest) to those, so that a host may route
 * them.
 * Results: 0 = frames sent, 1 = cycles, 2 = kicks, 3 = idle waits.
 */
#include "runtime.h"
#include "netbuf.h"
#include "inet.h"

static struct vdev net;
static struct slots txs;

#define VIRTIO_NET_F_CSUM (1ULL << 0)
#define VIRTIO_NET_F_HOST_TSO4 (1ULL << 11)
#define TCP_SEQ_OFFSET (VNET_HDR_LEN + 54)
#define MSS 1448

/* The TCP checksum's pseudo-header part for a segment of `len` bytes. */
static u32 pseudo(const u8 *ip, u32 len) { return sum16(0, ip + 12, 8) + 6 + len; }

/* Rewrites a lab frame in `slot` as IPv4/TCP 10.0.0.2:5000 -> 10.0.0.1:5001. */
static u64 dst_mac, dst_ip;

static void tcp_frame(u8 *slot, u32 size, int offload) {
	u8 *f = slot + VNET_HDR_LEN, *ip = f + 14, *t = ip + 20;
	if (dst_mac)
		for (int i = 0; i < 6; i++) f[i] = (u8)(dst_mac >> (40 - 8 * i));
	f[12] = 0x08, f[13] = 0x00;
	ip[0] = 0x45, ip[1] = 0, put16(ip + 2, (u16)(size - 14)), put16(ip + 4, 0), put16(ip + 6, 0x4000);
	ip[8] = 64, ip[9] = 6, put16(ip + 10, 0);
	const u8 addrs[8] = {10, 0, 0, 2, (u8)(dst_ip >> 24), (u8)(dst_ip >> 16), (u8)(dst_ip >> 8), (u8)dst_ip};
	for (int i = 0; i < 8; i++) ip[12 + i] = addrs[i];
	put16(ip + 10, (u16)~csum_fold(sum16(0, ip, 20)));
	put16(t, 5000), put16(t + 2, 5001);
	for (int i = 4; i < 12; i++) t[i] = 0;
	t[12] = 0x50, t[13] = 0x18, put16(t + 14, 65535), put16(t + 16, 0), put16(t + 18, 0);
	if (offload) {
		/* virtio_net_hdr: NEEDS_CSUM from byte 34, field at +16; TSO4 above one MSS. */
		slot[0] = 1, slot[1] = size > 14 + 40 + MSS ? 1 : 0;
		slot[2] = 54, slot[3] = 0, slot[4] = (u8)MSS, slot[5] = (u8)(MSS >> 8);
		slot[6] = 34, slot[7] = 0, slot[8] = 16, slot[9] = 0;
		put16(t + 16, csum_fold(pseudo(ip, size - 34)));
	}
}

/* A full TCP checksum, as a guest without checksum offload computes it per frame. */
static void tcp_checksum(u8 *slot, u32 size) {
	u8 *ip = slot + VNET_HDR_LEN + 14, *t = ip + 20;
	put16(t + 16, 0);
	put16(t + 16, (u16)~csum_fold(sum16(pseudo(ip, size - 34), t, size - 34)));
}

int main(void) {
	u64 size = param(0, 1514), frames = param(1, 1000), limit_ms = param(2, 0), tsc_khz = param(3, 2000000);
	int poll = param(4, 0) == 1;
	u64 kind = param(6, 0);
	dst_mac = param(7, 0), dst_ip = param(8, 0x0a000001);
	enter_user();
	if (size < 64 || size + VNET_HDR_LEN > SLOT_SIZE || (kind && size > 65535 + 14) || kind > 2) {
		print("nettx: frame size %lu out of range\n", size);
		return 2;
	}
	u64 offloads = kind == 1 ? VIRTIO_NET_F_CSUM | VIRTIO_NET_F_HOST_TSO4 : 0;
	int err = vnet_init(&net, VIRTIO_F_EVENT_IDX | VIRTIO_NET_F_MAC | offloads, VQ_SIZE);
	if (err) {
		print("nettx: virtio-net init failed at step %d\n", -err);
		return 3;
	}
	u32 nslots = frames < VQ_SIZE ? (u32)frames : VQ_SIZE;
	if (kind == 1 && (net.features & offloads) != offloads) {
		print("nettx: the device does not offer CSUM and HOST_TSO4\n");
		return 4;
	}
	for (u32 i = 0; i < nslots; i++) {
		frame_fill((u8 *)TX_SLOT(i), (u32)size, net.mac);
		if (kind) tcp_frame((u8 *)TX_SLOT(i), (u32)size, kind == 1);
	}
	slots_init(&txs, nslots);
	vq_interrupt_after(&net.tx, 0xffff); /* no TX interrupts until we wait */

	lab_op(LAB_OP_BEGIN, 0);
	u64 t0 = rdtsc(), deadline = limit_ms ? t0 + limit_ms * tsc_khz : ~0ULL;
	u64 seq = 0, kicks = 0, inflight = 0, idles = 0;
	while (seq < frames && rdtsc() < deadline) {
		int head;
		while ((head = vq_pop_used(&net.tx, 0)) >= 0) txs.free[txs.n++] = (u16)head, inflight--;
		if (!txs.n && poll) {
			__asm__ volatile("pause");
			continue;
		}
		if (!txs.n) {
			u16 seen = net.tx.used->idx;
			vq_interrupt_after(&net.tx, (u16)(inflight * 3 / 4 + 1));
			mb();
			/* Sleep only if nothing was used meanwhile: otherwise the event may be past. */
			if (net.tx.used->idx == seen && seen == net.tx.last_used) idle_wait(2000), idles++;
			continue;
		}
		u16 slot = txs.free[--txs.n];
		u8 *b = (u8 *)TX_SLOT(slot);
		if (kind) {
			*(volatile u64 *)(b + TCP_SEQ_OFFSET) = seq++;
			if (kind == 2) tcp_checksum(b, (u32)size);
		} else {
			frame_seq(b, seq++);
		}
		kicks += (u64)tx_send(&net.tx, slot, (u32)(size + VNET_HDR_LEN));
		inflight++;
	}
	while (inflight) {
		if (vq_pop_used(&net.tx, 0) >= 0) inflight--;
		else __asm__ volatile("pause");
	}
	u64 cycles = rdtsc() - t0;
	set_result(0, seq);
	set_result(1, cycles);
	set_result(2, kicks);
	set_result(3, idles);
	lab_op(LAB_OP_END, 0);
	print("nettx: %lu frames of %lu bytes in %lu cycles, %lu kicks, %lu idle waits\n", seq, size, cycles, kicks, idles);
	if (param(5, 0) == 1)
		for (;;) __asm__ volatile("pause");
	return 0;
}
