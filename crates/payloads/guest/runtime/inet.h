/* Network byte order and the Internet checksum, for the payloads that build IPv4/TCP
 * frames themselves (nettx, mmdsget). */
#pragma once
#include "runtime.h"

static inline void put16(u8 *p, u16 v) { p[0] = (u8)(v >> 8), p[1] = (u8)v; }
static inline void put32(u8 *p, u32 v) { put16(p, (u16)(v >> 16)), put16(p + 2, (u16)v); }
static inline u16 get16(const u8 *p) { return (u16)(p[0] << 8 | p[1]); }
static inline u32 get32(const u8 *p) { return (u32)get16(p) << 16 | get16(p + 2); }

/* Adds `len` bytes to a ones' complement sum, as big-endian 16-bit words. */
static inline u32 sum16(u32 sum, const u8 *p, u32 len) {
	for (u32 i = 0; i + 1 < len; i += 2) sum += (u32)p[i] << 8 | p[i + 1];
	if (len & 1) sum += (u32)p[len - 1] << 8;
	return sum;
}

/* The sum folded to 16 bits (not inverted: a partial checksum; invert for a full one). */
static inline u16 csum_fold(u32 sum) {
	while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
	return (u16)sum;
}
