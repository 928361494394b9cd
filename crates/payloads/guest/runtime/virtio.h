/* A minimal modern virtio driver for payloads: finds a device through ECAM (virtio-pci)
 * or, where there is none on PCI, in the virtio-mmio windows Firecracker's layout puts
 * after the boot timer's page; negotiates, sets up one or two split queues with
 * EVENT_IDX (and on PCI MSI-X; an MMIO device's interrupt line is left masked, as these
 * payloads poll). virtio-net's queues are RX (0) and TX (1); virtio-blk's one request
 * queue is q[0]. */
#pragma once
#include "runtime.h"

#define VQ_SIZE 256
#define VIRTIO_F_VERSION_1 (1ULL << 32)
#define VIRTIO_F_EVENT_IDX (1ULL << 29)
#define VIRTIO_F_INDIRECT_DESC (1ULL << 28)
#define VIRTIO_NET_F_MAC (1ULL << 5)
#define VNET_HDR_LEN 12
#define VRING_DESC_F_NEXT 1
#define VRING_DESC_F_WRITE 2
#define VRING_DESC_F_INDIRECT 4

struct vring_desc { u64 addr; u32 len; u16 flags; u16 next; };
struct vring_avail { u16 flags, idx, ring[VQ_SIZE], used_event; };
struct vring_used_elem { u32 id, len; };
struct vring_used { u16 flags, idx; struct vring_used_elem ring[VQ_SIZE]; u16 avail_event; };

struct vq {
	u16 index, size, avail_idx, last_used;
	struct vring_desc *desc;
	volatile struct vring_avail *avail;
	volatile struct vring_used *used;
	u64 notify;
	u32 notify_len; /* PCI: the 2-byte queue index; MMIO: QueueNotify, 4 bytes */
};

#define VIRTIO_ID_NET 1
#define VIRTIO_ID_BLOCK 2
#define VIRTIO_ID_RNG 4
#define VIRTIO_ID_VSOCK 19
/* The most queues a payload drives (virtio-vsock's rx, tx and event). */
#define VDEV_MAX_QUEUES 3
/* The most devices a payload drives at once (each has its own rings). */
#define VDEV_MAX_DEVICES 3

/* Where virtio-mmio devices may be: 4 KiB windows from the second page of the 32-bit
 * window on (exitless's and Firecracker's layout). */
#define VIRTIO_MMIO_FIRST 0xc0001000ULL
#define VIRTIO_MMIO_WINDOWS 32

struct vdev {
	u64 mmio;             /* its virtio-mmio window; 0 for a virtio-pci device */
	u32 fn;               /* bus-0 function index */
	u32 nth;              /* which device of its type (0: the first) */
	u32 rings;            /* whose ring memory its queues use (one set per device set up) */
	u64 bar0;
	u64 common, isr, device_cfg, notify_base;
	u32 notify_mult, msix_cap;
	u64 features;
	u8 mac[6];            /* virtio-net only */
	union {
		struct vq q[VDEV_MAX_QUEUES];
		struct { struct vq rx, tx, event; }; /* virtio-net, virtio-vsock */
	};
};

/* Common configuration registers (offsets in the common structure). */
#define VC_DFSELECT 0x00
#define VC_DF 0x04
#define VC_GFSELECT 0x08
#define VC_GF 0x0c
#define VC_MSIX_CONFIG 0x10
#define VC_NUM_QUEUES 0x12
#define VC_STATUS 0x14
#define VC_Q_SELECT 0x16
#define VC_Q_SIZE 0x18
#define VC_Q_VECTOR 0x1a
#define VC_Q_ENABLE 0x1c
#define VC_Q_NOTIFY_OFF 0x1e
#define VC_Q_DESC 0x20
#define VC_Q_DRIVER 0x28
#define VC_Q_DEVICE 0x30

#define VS_ACK 1
#define VS_DRIVER 2
#define VS_DRIVER_OK 4
#define VS_FEATURES_OK 8
#define VS_NEEDS_RESET 0x40

/* MSI-X vectors the driver programs: config, rx, tx; delivered as these IDT vectors. */
#define VIRTIO_IRQ_BASE 0x40

static inline void mb(void) { __asm__ volatile("mfence" ::: "memory"); }
static inline void barrier(void) { __asm__ volatile("" ::: "memory"); }

/* Finds the first virtio device of type `id` and brings it to DRIVER_OK with `wanted`
 * features (VERSION_1 always) and `nqueues` queues (MSI-X vector 1 + queue index each);
 * returns 0, or a negative step number on failure. */
int vdev_init(struct vdev *d, u32 id, u64 wanted, u16 nqueues, u16 qsize);
/* The same for the `nth` device of type `id` (0: the first), below VDEV_MAX_DEVICES. */
int vdev_init_nth(struct vdev *d, u32 id, u32 nth, u64 wanted, u16 nqueues, u16 qsize);
static inline int vnet_init(struct vdev *n, u64 wanted, u16 qsize) { return vdev_init(n, VIRTIO_ID_NET, wanted, 2, qsize); }
/* Negotiation steps, usable on their own by a hostile driver. */
int vdev_find(struct vdev *d, u32 id);
int vdev_find_nth(struct vdev *d, u32 id, u32 nth);
void vdev_set_status(struct vdev *d, u8 status);
u8 vdev_status(struct vdev *d);
void vdev_setup_queue(struct vdev *d, struct vq *q, u16 index, u16 qsize, u16 vector);

/* Publishes descriptor chain `head`; returns 1 when the device asked for a kick. */
int vq_push(struct vq *q, u16 head);
void vq_kick(struct vq *q);
/* The next used chain's head (and length), or -1 when none is ready. */
int vq_pop_used(struct vq *q, u32 *len);
/* Ask for an interrupt once `n` more chains have been used (EVENT_IDX). */
/* used_event and avail_event follow the rings, whose length is the queue's size. */
static inline volatile u16 *vq_used_event(struct vq *q) { return &q->avail->ring[q->size]; }
static inline volatile u16 *vq_avail_event(struct vq *q) { return (volatile u16 *)&q->used->ring[q->size]; }
static inline void vq_interrupt_after(struct vq *q, u16 n) { *vq_used_event(q) = (u16)(q->last_used + n - 1); }

/* Whether the LAPIC has interrupt `vector` pending (IRR): proof an MSI arrived. */
int lapic_irr(u32 vector);
void lapic_enable(void);
