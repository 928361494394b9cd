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
 * Results: 0 = frames sent, 1 = cycles, 2 = kicks, 3 = idle waits.
 */
#include "runtime.h"
#include "netbuf.h"

static struct vdev net;
static struct slots txs;

int main(void) {
	u64 size = param(0, 1514), frames = param(1, 1000), limit_ms = param(2, 0), tsc_khz = param(3, 2000000);
	int poll = param(4, 0) == 1;
	enter_user();
	if (size < 64 || size + VNET_HDR_LEN > SLOT_SIZE) {
		print("nettx: frame size %lu out of range\n", size);
		return 2;
	}
	int err = vnet_init(&net, VIRTIO_F_EVENT_IDX | VIRTIO_NET_F_MAC, VQ_SIZE);
	if (err) {
		print("nettx: virtio-net init failed at step %d\n", -err);
		return 3;
	}
	u32 nslots = frames < VQ_SIZE ? (u32)frames : VQ_SIZE;
	for (u32 i = 0; i < nslots; i++) frame_fill((u8 *)TX_SLOT(i), (u32)size, net.mac);
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
		frame_seq((u8 *)TX_SLOT(slot), seq++);
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
