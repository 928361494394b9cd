/*
 * MMDS client: what a guest agent does to read its metadata, from ARP to HTTP, through
 * virtio-net with nothing but this file: resolve the MMDS address (ARP), open a TCP
 * connection per session, on V2 PUT /latest/api/token, GET /latest/meta-data/k0..k2 and
 * check every byte against what the host PUT (a pattern both sides compute), ask with a
 * wrong token (V2: 401) and for a key that does not exist (404), then close.
 * Hostile first (param 4 = 1): data for a connection it never opened, a SYN to a closed
 * port (each must get RST), a packet with a bad IP checksum and a truncated TCP header
 * (each must get silence); it prints the RSTs counted, then does its sessions.
 * Params: 0 = MMDS version (1 or 2), 1 = pattern seed, 2 = value length (default 64),
 * 3 = sessions (default 1), 4 = 1 for the hostile prelude.
 * Results: 0 = answers checked right, 1 = failures, 2 = TSC cycles of the timed GETs,
 * 3 = GETs timed, 4 = TSC cycles of whole sessions.
 */
#include "runtime.h"
#include "netbuf.h"
#include "inet.h"

#define MAX_VALUE 8192
#define TIMEOUT_CYCLES 20000000000ULL /* ~5-10 s: no frame is lost here, a late one is a failure */

static struct vdev net;
static struct slots txs;
static u8 mmds_mac[6];
static const u8 my_ip[4] = {10, 0, 0, 2};
static const u8 mmds_ip[4] = {169, 254, 169, 254};
static u16 next_port = 40000;
static u64 checked, failed;

struct conn { u16 lport; u32 snd_nxt, rcv_nxt; int fin; };

static void post_rx(u16 slot) {
	net.rx.desc[slot].addr = RX_SLOT(slot);
	net.rx.desc[slot].len = RX_SLOT_SIZE;
	net.rx.desc[slot].flags = VRING_DESC_F_WRITE;
	if (vq_push(&net.rx, slot)) vq_kick(&net.rx);
}

static void fail(const char *what, u64 detail) {
	failed++;
	print("mmdsget: FAIL %s (%lu)\n", what, detail);
}

/* A free TX slot's Ethernet frame (virtio header zeroed), addressed to MMDS. */
static u8 *tx_frame(u16 *slot, u16 ethertype) {
	int head;
	while ((head = vq_pop_used(&net.tx, 0)) >= 0) txs.free[txs.n++] = (u16)head;
	while (!txs.n) {
		if ((head = vq_pop_used(&net.tx, 0)) >= 0) txs.free[txs.n++] = (u16)head;
	}
	*slot = txs.free[--txs.n];
	u8 *b = (u8 *)TX_SLOT(*slot);
	for (u32 i = 0; i < VNET_HDR_LEN; i++) b[i] = 0;
	u8 *f = b + VNET_HDR_LEN;
	for (int i = 0; i < 6; i++) f[i] = mmds_mac[i], f[6 + i] = net.mac[i];
	put16(f + 12, ethertype);
	return f;
}

/* The next received frame (after the virtio header) and its RX slot, or 0 on timeout. */
static u8 *rx_frame(u32 *len, u16 *slot, u64 deadline) {
	int head;
	while ((head = vq_pop_used(&net.rx, len)) < 0) {
		if (rdtsc() > deadline) return 0;
		__asm__ volatile("pause");
	}
	*slot = (u16)head;
	*len = *len > VNET_HDR_LEN ? *len - VNET_HDR_LEN : 0;
	return (u8 *)RX_SLOT(head) + VNET_HDR_LEN;
}

static int resolve(void) {
	for (int i = 0; i < 6; i++) mmds_mac[i] = 0xff;
	u16 slot;
	u8 *f = tx_frame(&slot, 0x0806), *a = f + 14;
	put16(a, 1), put16(a + 2, 0x0800), a[4] = 6, a[5] = 4, put16(a + 6, 1);
	for (int i = 0; i < 6; i++) a[8 + i] = net.mac[i], a[18 + i] = 0;
	for (int i = 0; i < 4; i++) a[14 + i] = my_ip[i], a[24 + i] = mmds_ip[i];
	tx_send(&net.tx, slot, VNET_HDR_LEN + 42);
	u64 deadline = rdtsc() + TIMEOUT_CYCLES;
	u32 len;
	while ((f = rx_frame(&len, &slot, deadline))) {
		a = f + 14;
		int reply = len >= 42 && get16(f + 12) == 0x0806 && get16(a + 6) == 2 && a[14] == 169 && a[17] == 254;
		if (reply)
			for (int i = 0; i < 6; i++) mmds_mac[i] = a[8 + i];
		post_rx(slot);
		if (reply) return 0;
	}
	return -1;
}

/* Sends a TCP segment on `c` (`opts` 4 bytes of MSS on a SYN); `ip_ok` 0 spoils the IP checksum. */
static void tcp_send(struct conn *c, u8 flags, const char *data, u32 len, u16 dport, int ip_ok, u32 tcp_hdr) {
	u16 slot;
	u8 *f = tx_frame(&slot, 0x0800), *ip = f + 14, *t = ip + 20;
	u32 thl = (flags & 0x02) ? 24 : 20;
	if (tcp_hdr < thl) thl = tcp_hdr;
	u16 total = (u16)(20 + thl + len);
	ip[0] = 0x45, ip[1] = 0, put16(ip + 2, total), put16(ip + 4, 0), put16(ip + 6, 0x4000);
	ip[8] = 64, ip[9] = 6, put16(ip + 10, 0);
	for (int i = 0; i < 4; i++) ip[12 + i] = my_ip[i], ip[16 + i] = mmds_ip[i];
	put16(ip + 10, (u16)((u16)~csum_fold(sum16(0, ip, 20)) + (ip_ok ? 0 : 1)));
	put16(t, c->lport), put16(t + 2, dport), put32(t + 4, c->snd_nxt), put32(t + 8, c->rcv_nxt);
	t[12] = (u8)((thl / 4) << 4), t[13] = flags, put16(t + 14, 65535), put16(t + 16, 0), put16(t + 18, 0);
	if (thl == 24) t[20] = 2, t[21] = 4, put16(t + 22, 1460);
	for (u32 i = 0; i < len; i++) t[thl + i] = (u8)data[i];
	u8 pseudo[12];
	for (int i = 0; i < 8; i++) pseudo[i] = ip[12 + i];
	pseudo[8] = 0, pseudo[9] = 6, put16(pseudo + 10, (u16)(thl + len));
	if (thl >= 20) put16(t + 16, (u16)~csum_fold(sum16(sum16(0, pseudo, 12), t, thl + len)));
	tx_send(&net.tx, slot, VNET_HDR_LEN + 14 + total);
	c->snd_nxt += len + ((flags & 0x03) ? 1 : 0); /* SYN and FIN take a sequence number */
}

/* The next segment for `c`: its flags, and its payload copied to out (in order only). */
static int tcp_recv(struct conn *c, u8 *flags, u8 *out, u32 *out_len, u32 cap, u64 deadline) {
	u32 len;
	u16 slot;
	u8 *f;
	while ((f = rx_frame(&len, &slot, deadline))) {
		u8 *ip = f + 14, *t = ip + 20;
		int ours = len >= 54 && get16(f + 12) == 0x0800 && ip[9] == 6 && ip[12] == 169 && ip[15] == 254 &&
			   get16(t) == 80 && get16(t + 2) == c->lport;
		if (ours) {
			u32 thl = (u32)(t[12] >> 4) * 4, seg = get16(ip + 2) - 20 - thl, seq = get32(t + 4);
			*flags = t[13];
			if ((*flags & 0x02) && (*flags & 0x10)) c->rcv_nxt = seq + 1; /* SYN-ACK */
			else if (seq == c->rcv_nxt && seg && *out_len + seg <= cap) {
				for (u32 i = 0; i < seg; i++) out[*out_len + i] = t[thl + i];
				*out_len += seg;
				c->rcv_nxt += seg;
			}
			if ((*flags & 0x01) && seq + seg == c->rcv_nxt) c->rcv_nxt++, c->fin = 1;
		}
		post_rx(slot);
		if (ours) return 0;
	}
	return -1;
}

static int tcp_open(struct conn *c) {
	c->lport = next_port++, c->snd_nxt = (u32)rdtsc(), c->rcv_nxt = 0, c->fin = 0;
	tcp_send(c, 0x02, 0, 0, 80, 1, 24);
	u8 flags = 0;
	u32 n = 0;
	u64 deadline = rdtsc() + TIMEOUT_CYCLES;
	do {
		if (tcp_recv(c, &flags, 0, &n, 0, deadline) < 0) return -1;
		if (flags & 0x04) return -2;
	} while ((flags & 0x12) != 0x12);
	tcp_send(c, 0x10, 0, 0, 80, 1, 20);
	return 0;
}

static void tcp_close(struct conn *c) {
	tcp_send(c, 0x11, 0, 0, 80, 1, 20);
	u8 flags = 0;
	u32 n = 0;
	u64 deadline = rdtsc() + TIMEOUT_CYCLES;
	while (!c->fin && tcp_recv(c, &flags, 0, &n, 0, deadline) == 0 && !(flags & 0x04)) {}
	if (c->fin) tcp_send(c, 0x10, 0, 0, 80, 1, 20);
	else fail("close: no FIN from MMDS", 0);
}

static u32 slen(const char *s) { u32 n = 0; while (s[n]) n++; return n; }

static const u8 *find(const u8 *h, u32 hn, const char *needle) {
	u32 nn = slen(needle);
	for (u32 i = 0; i + nn <= hn; i++) {
		u32 j = 0;
		while (j < nn && (h[i + j] | 0x20) == (needle[j] | 0x20)) j++;
		if (j == nn) return h + i;
	}
	return 0;
}

static u64 number(const u8 *p) { u64 v = 0; while (*p >= '0' && *p <= '9') v = v * 10 + (u64)(*p++ - '0'); return v; }

static u8 resp[MAX_VALUE + 1024];

/* One request on `c`; the status, and the body in *body (length *body_len); -1 if none came. */
static int http(struct conn *c, const char *req, const u8 **body, u32 *body_len) {
	tcp_send(c, 0x18, req, slen(req), 80, 1, 20);
	u32 n = 0;
	u8 flags = 0;
	u64 deadline = rdtsc() + TIMEOUT_CYCLES;
	for (;;) {
		u32 before = n;
		if (tcp_recv(c, &flags, resp, &n, sizeof(resp), deadline) < 0 || (flags & 0x04)) return -1;
		if (n != before) tcp_send(c, 0x10, 0, 0, 80, 1, 20);
		const u8 *end = find(resp, n, "\r\n\r\n"), *cl = find(resp, n, "\r\nContent-Length: ");
		if (end && cl && (u32)(end + 4 - resp) + number(cl + 18) <= n) {
			*body = end + 4, *body_len = (u32)number(cl + 18);
			return (int)number(resp + 9);
		}
		if (c->fin) return -1;
	}
}

static char reqbuf[512];
static char *cat(char *d, const char *s) { while (*s) *d++ = *s++; *d = 0; return d; }

static const char ALPHA[] = "abcdefghijklmnopqrstuvwxyz0123456789";
static u8 expected(u64 seed, u32 key, u32 j) { return (u8)ALPHA[(seed * 31 + key * 7 + j * 13) % 36]; }

static void get_request(const char *path, const char *token) {
	char *d = cat(reqbuf, "GET ");
	d = cat(d, path);
	d = cat(d, " HTTP/1.1\r\nHost: 169.254.169.254\r\n");
	if (token) d = cat(cat(cat(d, "X-metadata-token: "), token), "\r\n");
	cat(d, "\r\n");
}

static void session(u64 version, u64 seed, u32 vlen, u64 *get_cycles, u64 *gets) {
	struct conn c;
	int r = tcp_open(&c);
	if (r) return fail("TCP handshake", (u64)-r);
	const u8 *body;
	u32 blen;
	char token[65] = {0};
	if (version == 2) {
		int status = http(&c, "PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 60\r\n\r\n", &body, &blen);
		if (status != 200 || blen != 64) return fail("token", (u64)status);
		for (int i = 0; i < 64; i++) token[i] = (char)body[i];
		checked++;
		get_request("/latest/meta-data/k0", 0);
		status = http(&c, reqbuf, &body, &blen);
		if (status == 401) checked++;
		else fail("V2 GET without a token must be 401", (u64)status);
		get_request("/latest/meta-data/k0", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
		status = http(&c, reqbuf, &body, &blen);
		if (status == 401) checked++;
		else fail("a wrong token must be 401", (u64)status);
	}
	const char *keys[3] = {"/latest/meta-data/k0", "/latest/meta-data/k1", "/latest/meta-data/k2"};
	for (u32 k = 0; k < 3; k++) {
		get_request(keys[k], version == 2 ? token : 0);
		u64 t0 = rdtsc();
		int status = http(&c, reqbuf, &body, &blen);
		*get_cycles += rdtsc() - t0, (*gets)++;
		if (status != 200 || blen != vlen) {
			fail("GET key: status, or length", (u64)status * 100000 + blen);
			continue;
		}
		u32 bad = 0;
		for (u32 j = 0; j < blen; j++) bad += body[j] != expected(seed, k, j);
		if (bad) fail("GET key: bytes differ", bad);
		else checked++;
	}
	get_request("/latest/meta-data/nope", version == 2 ? token : 0);
	int status = http(&c, reqbuf, &body, &blen);
	if (status == 404) checked++;
	else fail("a missing key must be 404", (u64)status);
	tcp_close(&c);
}

/* Broken TCP: two segments that must be reset, two that must be ignored. */
static void hostile(void) {
	struct conn c = {.lport = 39999, .snd_nxt = 12345, .rcv_nxt = 777};
	tcp_send(&c, 0x18, "junk", 4, 80, 1, 20); /* data on no connection */
	c.lport = 39998;
	tcp_send(&c, 0x02, 0, 0, 81, 1, 24);      /* SYN to a closed port */
	c.lport = 39997;
	tcp_send(&c, 0x02, 0, 0, 80, 0, 24);      /* bad IP checksum */
	c.lport = 39996;
	tcp_send(&c, 0x02, 0, 0, 80, 1, 8);       /* TCP header cut short */
	u32 resets = 0, len;
	u16 slot;
	u8 *f;
	u64 deadline = rdtsc() + TIMEOUT_CYCLES / 20;
	while ((f = rx_frame(&len, &slot, deadline))) {
		u8 *t = f + 14 + 20;
		if (len >= 54 && get16(f + 12) == 0x0800 && (t[13] & 0x04)) {
			u16 port = get16(t + 2);
			if (port == 39999 || port == 39998) resets++;
			else fail("hostile: a broken segment got an RST", port);
		}
		post_rx(slot);
	}
	print("mmdsget: hostile: %u resets\n", resets);
	if (resets == 2) checked++;
	else fail("hostile: resets", resets);
}

int main(void) {
	u64 version = param(0, 1), seed = param(1, 1), sessions = param(3, 1);
	u32 vlen = (u32)param(2, 64);
	if (vlen > MAX_VALUE) vlen = MAX_VALUE;
	enter_user();
	int err = vnet_init(&net, VIRTIO_F_EVENT_IDX | VIRTIO_NET_F_MAC, VQ_SIZE);
	if (err) {
		print("mmdsget: virtio-net init failed at step %d\n", -err);
		return 3;
	}
	slots_init(&txs, VQ_SIZE);
	vq_interrupt_after(&net.tx, 0xffff);
	for (u16 i = 0; i < VQ_SIZE; i++) post_rx(i);
	vq_interrupt_after(&net.rx, 0xffff);
	if (resolve()) {
		print("mmdsget: FAIL no ARP reply for 169.254.169.254\n");
		return 4;
	}
	print("mmdsget: MMDS at %02x:%02x:%02x:%02x:%02x:%02x, V%lu, %lu sessions\n", mmds_mac[0], mmds_mac[1], mmds_mac[2],
	      mmds_mac[3], mmds_mac[4], mmds_mac[5], version, sessions);
	if (param(4, 0) == 1) hostile();
	u64 get_cycles = 0, gets = 0, t0 = rdtsc();
	lab_op(LAB_OP_BEGIN, 0);
	for (u64 s = 0; s < sessions && !failed; s++) session(version, seed, vlen, &get_cycles, &gets);
	lab_op(LAB_OP_END, 0);
	u64 total = rdtsc() - t0;
	set_result(0, checked);
	set_result(1, failed);
	set_result(2, get_cycles);
	set_result(3, gets);
	set_result(4, total);
	print("mmdsget: %lu answers checked, %lu failed\n", checked, failed);
	return failed ? 1 : 0;
}
