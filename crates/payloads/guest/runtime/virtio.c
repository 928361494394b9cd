#include "virtio.h"
#include "pci.h"

/* Queue memory: per queue one page of descriptors, one for avail, one for used. */
static u8 rings[VDEV_MAX_DEVICES][VDEV_MAX_QUEUES][3][4096] __attribute__((aligned(4096)));

static u32 cfg8(u32 fn, u32 reg) { return pci_read(PCI_ECAM, fn, reg, 1); }
static u32 cfg32(u32 fn, u32 reg) { return pci_read(PCI_ECAM, fn, reg, 4); }

int vdev_find(struct vdev *n, u32 id) { return vdev_find_nth(n, id, 0); }

/* virtio-mmio registers (virtio 1.2 4.2.2), all 32 bits wide. */
#define VM_MAGIC 0x000
#define VM_DEVICE_ID 0x008
#define VM_DF 0x010
#define VM_DFSELECT 0x014
#define VM_GF 0x020
#define VM_GFSELECT 0x024
#define VM_Q_SELECT 0x030
#define VM_Q_NUM_MAX 0x034
#define VM_Q_NUM 0x038
#define VM_Q_READY 0x044
#define VM_Q_NOTIFY 0x050
#define VM_STATUS 0x070
#define VM_Q_DESC 0x080
#define VM_Q_DRIVER 0x090
#define VM_Q_DEVICE 0x0a0
#define VM_CONFIG 0x100

/* The `nth` virtio-mmio device of type `id`, if any. */
static int vdev_find_mmio(struct vdev *n, u32 id, u32 nth) {
	u32 seen = 0;
	for (u64 at = VIRTIO_MMIO_FIRST; at < VIRTIO_MMIO_FIRST + VIRTIO_MMIO_WINDOWS * 4096; at += 4096) {
		if (mmio_read(at + VM_MAGIC, 4) != 0x74726976 || mmio_read(at + VM_DEVICE_ID, 4) != id) continue;
		if (seen++ != nth) continue;
		n->mmio = at;
		n->device_cfg = at + VM_CONFIG;
		return 0;
	}
	return -1;
}

int vdev_find_nth(struct vdev *n, u32 id, u32 nth) {
	u32 found[8], count = pci_scan(PCI_ECAM, found, 8), seen = 0;
	n->fn = 0xffffffff;
	n->nth = nth;
	n->mmio = 0;
	for (u32 i = 0; i < count && n->fn == 0xffffffff; i++)
		if (cfg32(found[i], 0) == ((0x1040 + id) << 16 | 0x1af4) && seen++ == nth) n->fn = found[i];
	if (n->fn == 0xffffffff) return seen == 0 ? vdev_find_mmio(n, id, nth) : -1;
	n->bar0 = cfg32(n->fn, 0x10) & ~0xfULL;
	if ((cfg32(n->fn, 0x10) & 6) == 4) n->bar0 |= (u64)cfg32(n->fn, 0x14) << 32; /* 64-bit BAR */
	if (map_high(n->bar0)) return -3;
	pci_write(PCI_ECAM, n->fn, 4, 2, pci_read(PCI_ECAM, n->fn, 4, 2) | 2);
	for (u32 cap = cfg8(n->fn, 0x34); cap; cap = cfg8(n->fn, cap + 1)) {
		u32 id = cfg8(n->fn, cap);
		if (id == 0x11) n->msix_cap = cap;
		if (id != 0x09) continue;
		u64 at = n->bar0 + cfg32(n->fn, cap + 8);
		switch (cfg8(n->fn, cap + 3)) {
		case 1: n->common = at; break;
		case 2: n->notify_base = at; n->notify_mult = cfg32(n->fn, cap + 16); break;
		case 3: n->isr = at; break;
		case 4: n->device_cfg = at; break;
		}
	}
	return n->common && n->notify_base && n->device_cfg && n->msix_cap ? 0 : -2;
}

void vdev_set_status(struct vdev *n, u8 status) {
	if (n->mmio) mmio_write(n->mmio + VM_STATUS, 4, status);
	else mmio_write(n->common + VC_STATUS, 1, status);
}
u8 vdev_status(struct vdev *n) { return (u8)(n->mmio ? mmio_read(n->mmio + VM_STATUS, 4) : mmio_read(n->common + VC_STATUS, 1)); }

/* The ring memory of queue `index` of `n`, zeroed, for `qsize` entries. */
static void vq_rings(struct vdev *n, struct vq *q, u16 index, u16 qsize) {
	q->index = index;
	q->size = qsize;
	q->avail_idx = q->last_used = 0;
	u8(*r)[4096] = rings[n->rings][index];
	q->desc = (struct vring_desc *)r[0];
	q->avail = (volatile struct vring_avail *)r[1];
	q->used = (volatile struct vring_used *)r[2];
	for (u32 i = 0; i < 3 * 4096 / 8; i++) ((volatile u64 *)r)[i] = 0;
}

static void vdev_setup_queue_mmio(struct vdev *n, struct vq *q, u16 index, u16 qsize) {
	u64 m = n->mmio;
	mmio_write(m + VM_Q_SELECT, 4, index);
	u16 max = (u16)mmio_read(m + VM_Q_NUM_MAX, 4);
	if (max && qsize > max) qsize = max;
	vq_rings(n, q, index, qsize);
	mmio_write(m + VM_Q_NUM, 4, qsize);
	u64 rings_at[3] = { (u64)q->desc, (u64)q->avail, (u64)q->used };
	for (u32 r = 0; r < 3; r++) {
		mmio_write(m + VM_Q_DESC + 0x10 * r, 4, (u32)rings_at[r]);
		mmio_write(m + VM_Q_DESC + 0x10 * r + 4, 4, (u32)(rings_at[r] >> 32));
	}
	q->notify = m + VM_Q_NOTIFY;
	q->notify_len = 4;
	mmio_write(m + VM_Q_READY, 4, 1);
}

/* Reset, ACKNOWLEDGE, DRIVER, the features both want (VERSION_1 always) through the
 * transport's four 32-bit feature registers, FEATURES_OK; virtio-net's MAC. Both
 * transports' first steps. */
static int vdev_negotiate(struct vdev *n, u32 id, u64 wanted, u64 dfselect, u64 df, u64 gfselect, u64 gf) {
	vdev_set_status(n, 0);
	vdev_set_status(n, VS_ACK);
	vdev_set_status(n, VS_ACK | VS_DRIVER);
	mmio_write(dfselect, 4, 0);
	u64 offered = mmio_read(df, 4);
	mmio_write(dfselect, 4, 1);
	offered |= mmio_read(df, 4) << 32;
	n->features = offered & (wanted | VIRTIO_F_VERSION_1);
	mmio_write(gfselect, 4, 0);
	mmio_write(gf, 4, (u32)n->features);
	mmio_write(gfselect, 4, 1);
	mmio_write(gf, 4, (u32)(n->features >> 32));
	vdev_set_status(n, VS_ACK | VS_DRIVER | VS_FEATURES_OK);
	if (!(vdev_status(n) & VS_FEATURES_OK)) return -2;
	if (id == VIRTIO_ID_NET)
		for (u32 i = 0; i < 6; i++) n->mac[i] = (u8)mmio_read(n->device_cfg + i, 1);
	return 0;
}

/* DRIVER_OK once the queues are set up; -3 if the device asks for a reset. */
static int vdev_driver_ok(struct vdev *n) {
	vdev_set_status(n, VS_ACK | VS_DRIVER | VS_FEATURES_OK | VS_DRIVER_OK);
	return vdev_status(n) & VS_NEEDS_RESET ? -3 : 0;
}

/* Negotiation and queues over virtio-mmio: the same steps as on PCI, through its
 * registers; no MSI-X (the payloads poll their rings). */
static int vdev_init_mmio(struct vdev *n, u32 id, u64 wanted, u16 nqueues, u16 qsize) {
	u64 m = n->mmio;
	int err = vdev_negotiate(n, id, wanted, m + VM_DFSELECT, m + VM_DF, m + VM_GFSELECT, m + VM_GF);
	if (err) return err;
	for (u16 i = 0; i < nqueues; i++) vdev_setup_queue_mmio(n, &n->q[i], i, qsize);
	return vdev_driver_ok(n);
}

void vdev_setup_queue(struct vdev *n, struct vq *q, u16 index, u16 qsize, u16 vector) {
	u64 c = n->common;
	q->index = index;
	mmio_write(c + VC_Q_SELECT, 2, index);
	u16 max = (u16)mmio_read(c + VC_Q_SIZE, 2); /* the device's largest (Cloud Hypervisor: 128) */
	if (max && qsize > max) qsize = max;
	vq_rings(n, q, index, qsize);
	mmio_write(c + VC_Q_SELECT, 2, index);
	mmio_write(c + VC_Q_SIZE, 2, qsize);
	mmio_write(c + VC_Q_VECTOR, 2, vector);
	/* 64-bit fields as two 32-bit writes: what every device must take (virtio 1.2, 4.1.3.1);
	 * Firecracker refuses 8-byte accesses. */
	u64 rings_at[3] = { (u64)q->desc, (u64)q->avail, (u64)q->used };
	for (u32 r = 0; r < 3; r++) {
		mmio_write(c + VC_Q_DESC + 8 * r, 4, (u32)rings_at[r]);
		mmio_write(c + VC_Q_DESC + 8 * r + 4, 4, (u32)(rings_at[r] >> 32));
	}
	q->notify = n->notify_base + mmio_read(c + VC_Q_NOTIFY_OFF, 2) * n->notify_mult;
	q->notify_len = 2;
	mmio_write(c + VC_Q_ENABLE, 2, 1);
}

void lapic_enable(void) { mmio_write(0xfee000f0, 4, 0x1ff); }

int lapic_irr(u32 vector) { return (mmio_read(0xfee00200 + (vector / 32) * 16, 4) >> (vector % 32)) & 1; }

int vdev_init(struct vdev *n, u32 id, u64 wanted, u16 nqueues, u16 qsize) {
	return vdev_init_nth(n, id, 0, wanted, nqueues, qsize);
}

int vdev_init_nth(struct vdev *n, u32 id, u32 nth, u64 wanted, u16 nqueues, u16 qsize) {
	/* Each device set up gets ring memory of its own, whatever its type. */
	static u32 ring_sets;
	if (nqueues > VDEV_MAX_QUEUES || vdev_find_nth(n, id, nth)) return -1;
	n->rings = ring_sets < VDEV_MAX_DEVICES ? ring_sets++ : VDEV_MAX_DEVICES - 1;
	if (n->mmio) return vdev_init_mmio(n, id, wanted, nqueues, qsize);
	u64 c = n->common;
	int err = vdev_negotiate(n, id, wanted, c + VC_DFSELECT, c + VC_DF, c + VC_GFSELECT, c + VC_GF);
	if (err) return err;
	/* MSI-X: vector i delivers IDT vector VIRTIO_IRQ_BASE + i to APIC 0. */
	lapic_enable();
	/* The table's place from the capability (BIR 0: BAR0), not from exitless's layout. */
	u32 table_at = cfg32(n->fn, n->msix_cap + 4);
	if (table_at & 7) return -4;
	u64 table = n->bar0 + (table_at & ~7u);
	for (u32 v = 0; v <= nqueues; v++) {
		mmio_write(table + 16 * v, 4, 0xfee00000);
		mmio_write(table + 16 * v + 4, 4, 0);
		mmio_write(table + 16 * v + 8, 4, VIRTIO_IRQ_BASE + v);
		mmio_write(table + 16 * v + 12, 4, 0);
	}
	pci_write(PCI_ECAM, n->fn, n->msix_cap + 2, 2, pci_read(PCI_ECAM, n->fn, n->msix_cap + 2, 2) | 0x8000);
	mmio_write(c + VC_MSIX_CONFIG, 2, 0);
	for (u16 i = 0; i < nqueues; i++) vdev_setup_queue(n, &n->q[i], i, qsize, (u16)(i + 1));
	return vdev_driver_ok(n);
}

int vq_push(struct vq *q, u16 head) {
	u16 old = q->avail_idx;
	q->avail->ring[old % q->size] = head;
	barrier();
	q->avail->idx = ++q->avail_idx;
	mb(); /* the index must be visible before we read the device's avail_event */
	u16 event = *vq_avail_event(q);
	return (u16)(q->avail_idx - event - 1) < (u16)(q->avail_idx - old);
}

void vq_kick(struct vq *q) { mmio_write(q->notify, q->notify_len, q->index); }

int vq_pop_used(struct vq *q, u32 *len) {
	if (q->used->idx == q->last_used) return -1;
	barrier();
	volatile struct vring_used_elem *e = &q->used->ring[q->last_used % q->size];
	int head = (int)e->id;
	if (len) *len = e->len;
	q->last_used++;
	return head;
}
