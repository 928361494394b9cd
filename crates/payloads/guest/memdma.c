/*
 * Hostile guest for virtio-mem: reads where the hotpluggable region lies from the
 * virtio-mem device's configuration (without driving the device: nothing is plugged),
 * then posts virtio-rng buffers across the whole region, 64 KiB each (what the device
 * fills at most), as DMA the host never gave it. Every one must come back used with
 * length 0 (the chain refused), and the host must not commit the region's memory. Then
 * a chain whose first buffer is in RAM and second in the region: refused whole, the RAM
 * buffer untouched; then one RAM buffer, which must be filled (the device goes on).
 * Last, its own CPU writes a word into every 2 MiB of the region and reads it back: with
 * nothing plugged there is no memory slot, so no write may stick.
 * With param 1, it then drives virtio-mem itself: once the host asks for a size, it plugs
 * the first block, where the device's DMA and its CPU's writes now land; the next block
 * (same slot, unplugged) reads zeros; it unplugs the block, refused to DMA again, and
 * plugs it back, empty. With param 2 as well, it then writes into that unplugged
 * neighbour: the host must stop it (KVM finds no writable page) rather than commit it.
 * With param 1 = 2 instead, the snapshot round: it plugs the first block, has the device
 * fill 64 bytes of it with entropy and writes a pattern into the rest of its first page,
 * says so, and waits for the requested size to change (the host snapshots it meanwhile,
 * and asks again from the VMM it was restored into); then the block must hold what it
 * wrote, plugged_size must still be one block, and a second block must plug.
 * With param 3, it first brings up a virtio-blk device (a vhost-user drive, driving no
 * request), so that its backend is handed guest memory's table and reads the plugged
 * block through its own mapping.
 * Params: 0 = MiB of the region to cover (default all of it), 1 = drive virtio-mem (2:
 *         the snapshot round), 2 = end with the forbidden write, 3 = bring up virtio-blk.
 * Results: 0 = buffers posted into the region, 1 = bytes the device wrote there,
 *          2 = checks failed, 3 = CPU writes that stuck.
 */
#include "runtime.h"
#include "virtio.h"

#define VIRTIO_ID_MEM 24
#define CHUNK (64u << 10)
#define BATCH 128

static struct vdev mem, rng, blk;
static u8 ram[2][64] __attribute__((aligned(64)));

#define MEM_PLUG 0
#define MEM_UNPLUG 1
#define MEM_F_UNPLUGGED_INACCESSIBLE (1ULL << 1)
#define MEM_QSIZE 128
static struct { u16 type, pad[3]; u64 addr; u16 blocks, pad2[3]; } mem_req;
static struct { u16 type, pad[3]; u16 state; } mem_resp;

/* A 64-bit field of the device's configuration, read as two 32-bit halves (what every
 * transport allows). */
static u64 config64(struct vdev *d, u32 at) {
	return mmio_read(d->device_cfg + at, 4) | (u64)mmio_read(d->device_cfg + at + 4, 4) << 32;
}

/* Waits for `n` used chains; adds their lengths to *bytes and counts those with any; -1
 * if the device stops answering. */
static long reap(struct vq *q, u32 n, u64 *bytes) {
	long written = 0;
	for (u32 got = 0; got < n;) {
		u32 len = 0;
		u64 spins = 0;
		while (vq_pop_used(q, &len) < 0) {
			if (++spins > 400000000ULL) return -1;
			__asm__ volatile("pause");
		}
		got++;
		*bytes += len;
		written += len != 0;
	}
	return written;
}

/* One virtio-mem request; the response's type (0: ACK), or -1 without an answer. */
static long mem_request(u16 type, u64 addr, u16 blocks) {
	struct vq *q = &mem.q[0];
	mem_req.type = type, mem_req.addr = addr, mem_req.blocks = blocks;
	mem_resp.type = 0xffff;
	q->desc[0] = (struct vring_desc){(u64)&mem_req, 24, VRING_DESC_F_NEXT, 1};
	q->desc[1] = (struct vring_desc){(u64)&mem_resp, 10, VRING_DESC_F_WRITE, 0};
	vq_push(q, 0);
	vq_kick(q);
	u64 ignored = 0;
	return reap(q, 1, &ignored) < 0 ? -1 : mem_resp.type;
}

/* `len` bytes of entropy at `at`; how many the device wrote. */
static u64 dma(u64 at, u32 len) {
	struct vq *q = &rng.q[0];
	q->desc[0] = (struct vring_desc){at, len, VRING_DESC_F_WRITE, 0};
	vq_push(q, 0);
	vq_kick(q);
	u64 got = 0;
	return reap(q, 1, &got) < 0 ? 0 : got;
}

static int sticks(u64 at) {
	volatile u64 *word = (volatile u64 *)at;
	*word = 0x5a5a5a5a5a5a5a5aULL;
	return *word == 0x5a5a5a5a5a5a5a5aULL;
}

/* The plug round (param 1); the checks that failed. */
static u64 plug_round(u64 start, int forbidden_write) {
	u64 failed = 0;
	if (vdev_init(&mem, VIRTIO_ID_MEM, MEM_F_UNPLUGGED_INACCESSIBLE, 1, MEM_QSIZE)) {
		print("memdma: virtio-mem init failed\n");
		return 1;
	}
	print("memdma: driver ready; waiting for a requested size\n");
	u64 block = config64(&mem, 0), spins = 0;
	while (config64(&mem, 48) < block && spins++ < 30000) idle_wait(1000);
	if (mem_request(MEM_PLUG, start, 1) != 0) return print("memdma: the plug was refused\n"), failed + 1;
	u8 *first = (u8 *)start;
	if (dma(start, 64) != 64) failed++, print("memdma: no DMA into the plugged block\n");
	if (!sticks(start + 4096)) failed++, print("memdma: the CPU cannot write the plugged block\n");
	if (*(volatile u64 *)(start + block) != 0) failed++, print("memdma: the unplugged neighbour is not zeros\n");
	if (mem_request(MEM_UNPLUG, start, 1) != 0) return print("memdma: the unplug was refused\n"), failed + 1;
	if (dma(start, 64)) failed++, print("memdma: DMA into the unplugged block\n");
	if (sticks(start + 4096)) failed++, print("memdma: a CPU write stuck in the unplugged block\n");
	if (mem_request(MEM_PLUG, start, 1) != 0) return print("memdma: the plug back was refused\n"), failed + 1;
	for (u32 i = 0; i < 64; i++)
		if (first[i] || first[4096 + i]) {
			failed++, print("memdma: plugged back, the block still holds its old bytes\n");
			break;
		}
	print("memdma: plugged, unplugged and plugged back, %lu failed\n", failed);
	if (forbidden_write && !failed) {
		print("memdma: writing into an unplugged block of a plugged slot\n");
		*(volatile u64 *)(start + block) = 1;
		print("memdma: the write went through\n");
		failed++;
	}
	return failed;
}

/* The snapshot round (param 1 = 2); the checks that failed. */
static u64 snapshot_round(u64 start) {
	static u8 entropy[64];
	u64 failed = 0, block = 0, spins = 0;
	if (vdev_init(&mem, VIRTIO_ID_MEM, MEM_F_UNPLUGGED_INACCESSIBLE, 1, MEM_QSIZE)) {
		print("memdma: virtio-mem init failed\n");
		return 1;
	}
	print("memdma: driver ready; waiting for a requested size\n");
	block = config64(&mem, 0);
	while (config64(&mem, 48) < block && spins++ < 30000) idle_wait(1000);
	u64 asked = config64(&mem, 48);
	if (mem_request(MEM_PLUG, start, 1) != 0) return print("memdma: the plug was refused\n"), 1;
	volatile u8 *first = (volatile u8 *)start;
	if (dma(start, 64) != 64) failed++, print("memdma: no DMA into the plugged block\n");
	for (u32 i = 0; i < 64; i++) entropy[i] = first[i];
	for (u32 i = 64; i < 4096; i++) first[i] = (u8)(i * 7 + 3);
	print("memdma: pattern written; waiting for a new requested size\n");
	for (spins = 0; config64(&mem, 48) == asked && spins < 120000; spins++) idle_wait(1000);
	u64 bad = 0;
	for (u32 i = 0; i < 4096; i++) bad += first[i] != (i < 64 ? entropy[i] : (u8)(i * 7 + 3));
	if (bad) failed++, print("memdma: %lu bytes of the plugged block changed\n", bad);
	u64 plugged = config64(&mem, 40);
	if (plugged != block) failed++, print("memdma: %lu bytes plugged, not one block\n", plugged);
	if (mem_request(MEM_PLUG, start + block, 1) != 0) failed++, print("memdma: the second plug was refused\n");
	else if (!sticks(start + block)) failed++, print("memdma: the CPU cannot write the second block\n");
	print("memdma: after the snapshot, %lu MiB plugged, the pattern read back, %lu failed\n", plugged >> 20,
	      failed);
	return failed;
}

int main(void) {
	u64 cover_mib = param(0, 0);
	enter_user();
	if (vdev_find(&mem, VIRTIO_ID_MEM)) {
		print("memdma: no virtio-mem device\n");
		return 3;
	}
	u64 start = config64(&mem, 16), size = config64(&mem, 24), plugged = config64(&mem, 40);
	if (cover_mib && (cover_mib << 20) < size) size = cover_mib << 20;
	print("memdma: hotpluggable region at %lx, %lu MiB, %lu MiB plugged\n", start, size >> 20, plugged >> 20);
	int err = vdev_init(&rng, VIRTIO_ID_RNG, VIRTIO_F_EVENT_IDX, 1, VQ_SIZE);
	if (err) {
		print("memdma: virtio-rng init failed at step %d\n", -err);
		return 3;
	}
	if (param(3, 0) && vdev_init(&blk, VIRTIO_ID_BLOCK, 0, 1, VQ_SIZE)) {
		print("memdma: virtio-blk init failed\n");
		return 3;
	}
	if (param(3, 0)) print("memdma: virtio-blk ready\n");
	struct vq *q = &rng.q[0];
	u64 posted = 0, bytes = 0, failed = 0, filled = 0;
	for (u64 at = 0; at < size;) {
		u32 n = 0;
		for (; n < BATCH && at < size; n++, at += CHUNK) {
			q->desc[n] = (struct vring_desc){start + at, CHUNK, VRING_DESC_F_WRITE, 0};
			vq_push(q, (u16)n);
		}
		vq_kick(q);
		long got = reap(q, n, &bytes);
		if (got < 0) {
			print("memdma: the device stopped answering at %lx\n", start + at);
			return 1;
		}
		posted += n, filled += (u64)got;
	}
	if (bytes) failed++, print("memdma: the device wrote %lu bytes into %lu unplugged buffers\n", bytes, filled);
	/* RAM then the region, in one chain: refused whole. */
	for (u32 i = 0; i < 64; i++) ram[0][i] = 0x5a;
	q->desc[0] = (struct vring_desc){(u64)ram[0], 64, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 1};
	q->desc[1] = (struct vring_desc){start, 4096, VRING_DESC_F_WRITE, 0};
	vq_push(q, 0);
	vq_kick(q);
	u64 mixed = 0;
	int untouched = 1;
	if (reap(q, 1, &mixed) < 0) return 1;
	for (u32 i = 0; i < 64; i++) untouched &= ram[0][i] == 0x5a;
	if (mixed || !untouched) failed++, print("memdma: a chain half in the region got %lu bytes\n", mixed);
	/* RAM alone: filled, the device still serving. */
	q->desc[0] = (struct vring_desc){(u64)ram[1], 64, VRING_DESC_F_WRITE, 0};
	vq_push(q, 0);
	vq_kick(q);
	u64 good = 0;
	if (reap(q, 1, &good) < 0) return 1;
	if (good != 64) failed++, print("memdma: a RAM buffer got %lu bytes\n", good);
	/* The CPU: one word per 2 MiB, in each GiB the page tables can map. */
	u64 probed = 0, stuck = 0;
	for (u64 at = 0; at < size && !map_high(start + at); at += 1ULL << 30)
		for (u64 off = at; off < at + (1ULL << 30) && off < size; off += 2ULL << 20, probed++) {
			volatile u64 *word = (volatile u64 *)(start + off);
			*word = 0x5a5a5a5a5a5a5a5aULL;
			if (*word == 0x5a5a5a5a5a5a5a5aULL) stuck++;
		}
	if (stuck) failed++, print("memdma: %lu of %lu CPU writes into the region stuck\n", stuck, probed);
	if (param(1, 0) == 2) failed += snapshot_round(start);
	else if (param(1, 0)) failed += plug_round(start, param(2, 0) != 0);
	set_result(3, stuck);
	set_result(0, posted);
	set_result(1, bytes);
	set_result(2, failed);
	print("memdma: %lu buffers posted into the region, %lu bytes written there, %lu CPU writes probed, %lu failed\n",
	      posted, bytes, probed, failed);
	return failed ? 1 : 0;
}
