/*
 * vsock guest: an echo server on a port, and optionally a client of the host.
 * Server: accepts every REQUEST to its port and echoes each stream's bytes back on it.
 * Each stream's bytes go into its own ring (what it advertises as buf_alloc) and every
 * receive buffer is handed back at once, so the host's data never holds the buffers its
 * credit updates need; the ring drains as the host's credit allows. A host that sends
 * beyond the ring (its credit) is an error. A SHUTDOWN is answered with RST. It ends once
 * `closes` streams have closed.
 * Client (param 2 = a host port): connects to the host (CID 2) on that port, sends
 * `bytes` bytes of a pattern, reads them back (the host side echoes), checks them, and
 * shuts the stream down; this counts as one of the closes.
 * Hostile first (param 4 = 1): before serving, it sends what a broken driver sends: an
 * unknown op, a length beyond its buffer, a foreign source CID, a non-stream type (each
 * must be met with silence), and data and credit for connections it never opened (each
 * must be met with RST); it prints how many RSTs came back, then serves as usual.
 * Event queue: a TRANSPORT_RESET (a restore from a snapshot) drops every stream (each
 * counts as a close) and the CID is read again; listening goes on.
 * Params: 0 = listening port (default 1234), 1 = closes to wait for (default 1),
 * 2 = host port to connect to (default none), 3 = client bytes (default 4096),
 * 4 = 1 for the hostile prelude, 5 = a port whose REQUESTs it ignores (default none).
 * Results: 0 = bytes echoed, 1 = streams accepted, 2 = client bytes checked, 3 = errors,
 * 4 = transport resets.
 */
#include "runtime.h"
#include "virtio.h"

#define HDR 44
#define SLOTS 64
#define SLOT_BYTES (HDR + 4096)
#define MAX_CONNS 64
#define RING (64u << 10) /* per stream: what the host may have in flight to us */
#define BUF_ALLOC RING
#define CLIENT_PORT 5555

enum { OP_REQUEST = 1, OP_RESPONSE, OP_RST, OP_SHUTDOWN, OP_RW, OP_CREDIT_UPDATE, OP_CREDIT_REQUEST };

struct hdr {
	u64 src_cid, dst_cid;
	u32 src_port, dst_port, len;
	u16 type, op;
	u32 flags, buf_alloc, fwd_cnt;
} __attribute__((packed));

struct conn {
	int used, client, asked;
	u32 host_port, guest_port;
	u32 peer_buf_alloc, peer_fwd_cnt, tx_cnt, fwd_cnt;
	u32 head, tail; /* ring bytes [head, tail), both counting from the stream's start */
};

static struct vdev vs;
static u8 rxbuf[SLOTS][SLOT_BYTES] __attribute__((aligned(4096)));
static u8 txbuf[SLOTS][SLOT_BYTES] __attribute__((aligned(4096)));
static u16 tx_free[SLOTS];
static u32 tx_nfree;
static struct conn conns[MAX_CONNS];
static u8 rings[MAX_CONNS][RING];
static u64 guest_cid;
static u64 echoed, accepted, checked, errors, closes, stray_resets, transport_resets;
#define EVENTS 4
static u32 events[EVENTS] __attribute__((aligned(64)));
static u32 ignored_port;
static u8 expect_byte(u64 i) { return (u8)(i * 7 + 3); }

/* Copies n bytes, 8 or 4 at a time where both sides allow (the throughput row measures the
 * device, not this loop). */
static void copy(u8 *to, const u8 *from, u32 n) {
	u32 i = 0;
	if ((((u64)to | (u64)from) & 7) == 0)
		for (; i + 8 <= n; i += 8) *(u64 *)(to + i) = *(const u64 *)(from + i);
	else if ((((u64)to | (u64)from) & 3) == 0)
		for (; i + 4 <= n; i += 4) *(u32 *)(to + i) = *(const u32 *)(from + i);
	for (; i < n; i++) to[i] = from[i];
}

static struct conn *find(u32 host_port, u32 guest_port) {
	for (int i = 0; i < MAX_CONNS; i++)
		if (conns[i].used && conns[i].host_port == host_port && conns[i].guest_port == guest_port) return &conns[i];
	return 0;
}

static struct conn *add(u32 host_port, u32 guest_port) {
	for (int i = 0; i < MAX_CONNS; i++)
		if (!conns[i].used) {
			conns[i] = (struct conn){1, 0, 0, host_port, guest_port, 0, 0, 0, 0, 0, 0};
			return &conns[i];
		}
	return 0;
}

static u32 credit(struct conn *c) { return c->peer_buf_alloc - (c->tx_cnt - c->peer_fwd_cnt); }

static void reclaim_tx(void) {
	int head;
	while ((head = vq_pop_used(&vs.tx, 0)) >= 0) tx_free[tx_nfree++] = (u16)head;
}

/* Sends a packet to the host on `c` (or to the given ports for a connection we do not
 * keep) with `len` payload bytes from `data`. */
static void send(u32 host_port, u32 guest_port, struct conn *c, u16 op, u32 flags, const u8 *data, u32 len) {
	while (!tx_nfree) reclaim_tx();
	u16 slot = tx_free[--tx_nfree];
	struct hdr *h = (struct hdr *)txbuf[slot];
	*h = (struct hdr){guest_cid, 2, guest_port, host_port, len, 1, op, flags, BUF_ALLOC, c ? c->fwd_cnt : 0};
	copy(txbuf[slot] + HDR, data, len);
	if (c) c->tx_cnt += len;
	vs.tx.desc[slot] = (struct vring_desc){(u64)txbuf[slot], HDR + len, 0, 0};
	if (vq_push(&vs.tx, slot)) vq_kick(&vs.tx);
}

static void repost(u16 head) {
	vs.rx.desc[head] = (struct vring_desc){(u64)rxbuf[head], SLOT_BYTES, VRING_DESC_F_WRITE, 0};
	if (vq_push(&vs.rx, head)) vq_kick(&vs.rx);
}

static void post_event(u16 i) {
	vs.event.desc[i] = (struct vring_desc){(u64)&events[i], sizeof events[i], VRING_DESC_F_WRITE, 0};
	if (vq_push(&vs.event, i)) vq_kick(&vs.event);
}

/* The device's events: TRANSPORT_RESET (id 0) ends every stream; the CID may have changed. */
static void take_events(void) {
	int head;
	while ((head = vq_pop_used(&vs.event, 0)) >= 0) {
		if (events[head] == 0) {
			u64 dropped = 0;
			for (int i = 0; i < MAX_CONNS; i++) dropped += conns[i].used, conns[i].used = 0;
			closes += dropped;
			transport_resets++;
			guest_cid = mmio_read(vs.device_cfg, 4) | (u64)mmio_read(vs.device_cfg + 4, 4) << 32;
			print("vsockecho: transport reset, %lu streams dropped, CID %lu\n", dropped, guest_cid);
		}
		post_event((u16)head);
	}
}

static void client_send(struct conn *c, u64 bytes) {
	static u8 chunk[4096];
	for (u64 at = 0; at < bytes;) {
		u32 n = bytes - at < sizeof chunk ? (u32)(bytes - at) : (u32)sizeof chunk;
		for (u32 i = 0; i < n; i++) chunk[i] = expect_byte(at + i);
		send(c->host_port, c->guest_port, c, OP_RW, 0, chunk, n);
		at += n;
	}
}

/* Acts on the packet in RX buffer `head`; returns 0 if it must wait for credit. */
static int handle(u16 head, u32 listen_port, u64 client_bytes) {
	struct hdr *h = (struct hdr *)rxbuf[head];
	struct conn *c = find(h->src_port, h->dst_port);
	if (c) c->peer_buf_alloc = h->buf_alloc, c->peer_fwd_cnt = h->fwd_cnt;
	switch (h->op) {
	case OP_REQUEST:
		if (ignored_port && h->dst_port == ignored_port) break; /* silence, for the host's timeout */
		if (c || h->dst_port != listen_port || !(c = add(h->src_port, h->dst_port))) {
			send(h->src_port, h->dst_port, 0, OP_RST, 0, 0, 0);
			break;
		}
		c->peer_buf_alloc = h->buf_alloc, c->peer_fwd_cnt = h->fwd_cnt;
		accepted++;
		send(c->host_port, c->guest_port, c, OP_RESPONSE, 0, 0, 0);
		break;
	case OP_RESPONSE:
		if (c && c->client) client_send(c, client_bytes);
		else send(h->src_port, h->dst_port, 0, OP_RST, 0, 0, 0), errors++;
		break;
	case OP_RW:
		if (!c) {
			send(h->src_port, h->dst_port, 0, OP_RST, 0, 0, 0);
			break;
		}
		if (c->client) {
			for (u32 i = 0; i < h->len; i++) errors += rxbuf[head][HDR + i] != expect_byte(checked + i);
			checked += h->len;
			c->fwd_cnt += h->len;
			if (checked >= client_bytes) send(c->host_port, c->guest_port, c, OP_SHUTDOWN, 3, 0, 0);
			break;
		}
		if (h->len > RING - (c->tail - c->head)) {
			print("vsockecho: port %u sent beyond its credit\n", c->host_port);
			errors++;
			break;
		}
		u8 *ring = rings[c - conns];
		u32 at = c->tail % RING, first = h->len < RING - at ? h->len : RING - at;
		copy(ring + at, rxbuf[head] + HDR, first);
		copy(ring, rxbuf[head] + HDR + first, h->len - first);
		c->tail += h->len;
		break;
	case OP_SHUTDOWN:
	case OP_RST:
		if (h->op == OP_SHUTDOWN) send(h->src_port, h->dst_port, c, OP_RST, 0, 0, 0);
		if (c) c->used = 0, closes++;
		else if (h->op == OP_RST) stray_resets++;
		break;
	case OP_CREDIT_REQUEST:
		if (c) send(c->host_port, c->guest_port, c, OP_CREDIT_UPDATE, 0, 0, 0);
		break;
	default: /* CREDIT_UPDATE: the credit is already recorded */
		break;
	}
	return 1;
}

/* One packet exactly as given: header fields and the chain's length (which may disagree
 * with the header's). */
static void raw_send(struct hdr h, u32 chain_len) {
	while (!tx_nfree) reclaim_tx();
	u16 slot = tx_free[--tx_nfree];
	*(struct hdr *)txbuf[slot] = h;
	vs.tx.desc[slot] = (struct vring_desc){(u64)txbuf[slot], chain_len, 0, 0};
	if (vq_push(&vs.tx, slot)) vq_kick(&vs.tx);
}

/* The hostile prelude: four packets the device must drop, two it must answer with RST. */
static void hostile(void) {
	struct hdr ok = {guest_cid, 2, 7777, 4444, 0, 1, OP_RW, 0, BUF_ALLOC, 0};
	struct hdr h = ok;
	h.op = 99, raw_send(h, HDR);
	h = ok, h.len = 1000, raw_send(h, HDR + 10);
	h = ok, h.src_cid = 99, raw_send(h, HDR);
	h = ok, h.type = 2, raw_send(h, HDR);
	h = ok, h.len = 4, raw_send(h, HDR + 4);       /* data for no connection: RST */
	h = ok, h.op = OP_CREDIT_UPDATE, h.src_port = 7778, raw_send(h, HDR); /* RST */
	/* Give the device time to answer; then only RSTs for the two may have come back. */
	for (u64 spin = 0; spin < 50000000ULL && stray_resets < 2; spin++) {
		u32 len;
		int head;
		reclaim_tx();
		while ((head = vq_pop_used(&vs.rx, &len)) >= 0) {
			handle((u16)head, 0, 0);
			repost((u16)head);
		}
		__asm__ volatile("pause");
	}
	print("vsockecho: hostile: %lu resets\n", stray_resets);
}

int main(void) {
	u64 listen_port = param(0, 1234), want_closes = param(1, 1), host_port = param(2, 0), client_bytes = param(3, 4096);
	enter_user();
	int err = vdev_init(&vs, VIRTIO_ID_VSOCK, VIRTIO_F_EVENT_IDX, 3, SLOTS);
	if (err) {
		print("vsockecho: virtio-vsock init failed at step %d\n", -err);
		return 3;
	}
	guest_cid = mmio_read(vs.device_cfg, 4) | (u64)mmio_read(vs.device_cfg + 4, 4) << 32;
	for (u16 i = 0; i < SLOTS && i < vs.rx.size; i++) repost(i);
	for (u16 i = 0; i < SLOTS && i < vs.tx.size; i++) tx_free[tx_nfree++] = i;
	for (u16 i = 0; i < EVENTS; i++) post_event(i);
	vq_interrupt_after(&vs.rx, 0xffff);
	vq_interrupt_after(&vs.tx, 0xffff);
	ignored_port = (u32)param(5, 0);
	if (param(4, 0) == 1) hostile();
	print("vsockecho: CID %lu listening on port %lu\n", guest_cid, listen_port);
	if (host_port) {
		struct conn *c = add((u32)host_port, CLIENT_PORT);
		c->client = 1;
		send(c->host_port, c->guest_port, c, OP_REQUEST, 0, 0, 0);
	}
	while (closes < want_closes) {
		reclaim_tx();
		take_events();
		u32 len;
		int head, progressed = 0;
		while ((head = vq_pop_used(&vs.rx, &len)) >= 0) {
			handle((u16)head, (u32)listen_port, client_bytes);
			repost((u16)head);
			progressed = 1;
		}
		/* Each stream's ring, as far as the host's credit goes. */
		for (int i = 0; i < MAX_CONNS; i++) {
			struct conn *c = &conns[i];
			if (!c->used || c->client || c->tail == c->head) continue;
			u32 n = c->tail - c->head, at = c->head % RING;
			if (n > 4096) n = 4096;
			if (n > RING - at) n = RING - at; /* up to the ring's end; the rest next turn */
			if (n > credit(c)) n = credit(c);
			if (!n) {
				if (!c->asked) send(c->host_port, c->guest_port, c, OP_CREDIT_REQUEST, 0, 0, 0);
				c->asked = 1;
				continue;
			}
			c->head += n, c->fwd_cnt += n, c->asked = 0;
			send(c->host_port, c->guest_port, c, OP_RW, 0, rings[i] + at, n);
			echoed += n;
			progressed = 1;
		}
		if (!progressed) __asm__ volatile("pause");
	}
	set_result(0, echoed);
	set_result(1, accepted);
	set_result(2, checked);
	set_result(3, errors);
	set_result(4, transport_resets);
	print("vsockecho: %lu bytes echoed on %lu streams, %lu client bytes checked, %lu errors\n", echoed, accepted, checked, errors);
	return errors ? 1 : 0;
}
